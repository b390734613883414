/* `lily serve`: an OpenAI-compatible HTTP server over one model (api.md). */
#ifndef LILY_SERVER_SERVER_H
#define LILY_SERVER_SERVER_H

#include <stddef.h>

#include "lily.h"

typedef struct lily_server_opts {
    const char *model_dir;
    const char *host;            /* default 127.0.0.1 */
    int port;                    /* default 8080; 0 = any free port (printed) */
    const char *const *api_keys; /* n_api_keys keys; none = no authentication */
    int n_api_keys;
    const char *model_id; /* served model id; default: the model directory's name */
    int strict_model;     /* 404 for a request naming another model */
    int ctx;              /* per-request context; 0 = min(model max, 32768) */
    int queue;            /* waiting requests before 503; 0 = 64 */
    size_t max_body;      /* bytes; 0 = 32 MiB */
    size_t snapshot_mem;  /* prefix-cache bytes; 0 = 2 GiB */
    lily_backend_kind backend;
    int threads;
    const char *cors_origins; /* NULL: localhost origins only; "*": any; else comma list */
    int reasoning;            /* server default for thinking: -1 template default, 0 off, 1 on */
    int quiet;
    int log_format;        /* lily_log_format (reqlog.h); 0: text, none under quiet */
    const char *port_file; /* write the bound port here once listening (for scripts) */
} lily_server_opts;

/* Loads the model and serves until SIGINT/SIGTERM. Returns the process exit code. */
int lily_server_main(const lily_server_opts *o);

#endif
