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
    int parallel;         /* requests generating at once (slots), 1..8; 0 = 4 on CUDA, 2 on CPU */
    int prefill_chunk;    /* prompt tokens prefilled between two decode steps; 0 = 512 */
    int queue;            /* requests waiting for a slot before 503; 0 = 64 */
    size_t max_body;      /* bytes; 0 = 32 MiB */
    size_t snapshot_mem;  /* prefix-cache bytes; 0 = 2 GiB */
    lily_backend_kind backend;
    int threads;
    lily_precision precision; /* lily_engine_opts' fields of the same names */
    lily_cpu_isa cpu_isa;
    lily_sample_on sample_on;
    const char *cors_origins; /* NULL: localhost origins only; "*": any; else comma list */
    int reasoning;            /* server default for thinking: -1 template default, 0 off, 1 on */
    int quiet;
    int log_format;        /* lily_log_format (reqlog.h); 0: text, none under quiet */
    const char *port_file; /* write the bound port here once listening (for scripts) */
    /* hardening (README "Limits"); 0 takes the default shown */
    const char *const *allow_hosts; /* extra Host header names ("*": any); localhost names and
                                       the bound address are always allowed */
    int n_allow_hosts;
    int max_tokens_cap;     /* generated tokens per request; 0 = the rest of the context */
    double request_timeout; /* s of generation per request, then finish "length"; 0 = 600 */
    int max_conns;          /* open connections; 0 = 2048 */
    int conns_per_ip;       /* open connections from one client address; 0 = 256 */
    double header_timeout;  /* s from accept (or the previous answer's end, on a kept-alive
                               connection) to the end of the request head; 0 = 10 */
    double body_timeout;    /* s from the same start to the end of the body; 0 = 60 */
    int conn_requests;      /* requests per kept-alive connection (1: no keep-alive); 0 = 100 */
    double send_timeout;    /* s a stream may hold unsent bytes before it is cancelled; 0 = 30 */
    size_t send_buffer;     /* bytes a stream may hold unsent; 0 = 4 MiB */
    const char *tls_cert;   /* PEM files: serve HTTPS (both or neither) */
    const char *tls_key;
} lily_server_opts;

/* Loads the model and serves until SIGINT/SIGTERM. Returns the process exit code. */
int lily_server_main(const lily_server_opts *o);

#endif
