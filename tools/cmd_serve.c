/* lily serve: the OpenAI-compatible HTTP server (src/server). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "cli.h"

#ifdef LILY_HAVE_SERVER
#include "server/reqlog.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: lily serve --model DIR [options]\n"
        "  --host ADDR           bind address (default 127.0.0.1)\n"
        "  --port N              port (default 8080; 0 = any free port)\n"
        "  --api-key-file FILE   require the keys in FILE (one a line; # comments)\n"
        "  --api-key KEY         the same on the command line, where other local users can read\n"
        "                        it (/proc/PID/cmdline): prefer --api-key-file\n"
        "  --model-id ID         served model id (default: the directory name)\n"
        "  --strict-model        404 for requests naming another model\n"
        "  --ctx N               context per request (default min(model, 32768))\n"
        "  --parallel N          requests generating at once, 1..8 (default 4 on CUDA, 2 on\n"
        "                        CPU); each slot holds a session of --ctx tokens\n"
        "  --parallel-queue N    requests waiting for a slot before 503 (default 64)\n"
        "  --prefill-chunk N     prompt tokens prefilled between two decode steps (512)\n"
        "  --max-body BYTES      request body limit, K/M suffix (default 32M)\n"
        "  --snapshot-mem MB     prefix-cache memory (default 2048)\n"
        "  --backend cpu|cuda    (default cpu)   --threads N\n" LILY_CLI_ENGINE_USAGE
        "  --cors-origins LIST   allowed browser origins, comma list or * (default localhost)\n"
        "  --reasoning on|off    default thinking switch (default: the template's)\n"
        "  --port-file FILE      write the bound port to FILE\n"
        "  --allow-host NAME     also accept this Host header (repeatable; * = any); default:\n"
        "                        localhost names and the bound address\n"
        "  --tls-cert FILE --tls-key FILE   serve HTTPS with this PEM certificate and key\n"
        "  --max-tokens-cap N    generated tokens per request at most (default: the context)\n"
        "  --request-timeout S   generation time per request, then finish \"length\" (600)\n"
        "  --max-conns N         open connections (2048)  --conns-per-ip N (256)\n"
        "  --header-timeout S    request head deadline from accept, or on a kept-alive\n"
        "                        connection from the previous answer: its idle limit (10)\n"
        "  --body-timeout S      whole-request deadline from the same start (60)\n"
        "  --conn-requests N     requests per kept-alive connection (100; 1 = close each)\n"
        "  --send-timeout S      a stream whose reader holds unsent bytes this long is\n"
        "                        cancelled (30)   --send-buffer BYTES: at most (4M)\n"
        "  --log-format F        request log on stderr: text (default), json or none\n"
        "                        (--quiet: none unless given)\n"
        "  --quiet\n");
}

static int read_keys(const char *path, char ***keys, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "lily serve: cannot open %s\n", path);
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        *keys = lily_xrealloc(*keys, (size_t)(*n + 1) * sizeof **keys);
        (*keys)[(*n)++] = lily_xstrdup(line);
    }
    fclose(f);
    return 0;
}

typedef struct serve_lists {
    char **keys;
    const char **hosts;
    int nkeys, nhosts;
} serve_lists;

static int add_key(void *ud, const char *v) {
    serve_lists *l = ud;
    l->keys = lily_xrealloc(l->keys, (size_t)(l->nkeys + 1) * sizeof *l->keys);
    l->keys[l->nkeys++] = lily_xstrdup(v);
    return 0;
}

static int add_key_file(void *ud, const char *v) {
    serve_lists *l = ud;
    return read_keys(v, &l->keys, &l->nkeys);
}

static int add_host(void *ud, const char *v) {
    serve_lists *l = ud;
    l->hosts = lily_xrealloc(l->hosts, (size_t)(l->nhosts + 1) * sizeof *l->hosts);
    l->hosts[l->nhosts++] = v;
    return 0;
}

static int log_format(void *ud, const char *v) {
    lily_log_format f;
    if (lily_reqlog_parse_format(v, &f)) {
        fprintf(stderr, "lily serve: --log-format takes text|json|none, not '%s'\n", v);
        return -1;
    }
    *(int *)ud = (int)f;
    return 0;
}

int lily_cmd_serve(int argc, char **argv) {
    lily_server_opts o = {.port = 8080, .reasoning = -1};
    serve_lists l = {0};
    long max_body = -1, snapshot_mb = -1, send_buffer = -1;
    static const char *const on_off[] = {"off", "on", NULL};
    lily_cli_engine eng = {0};
    lily_arg engt[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&eng, engt);
#define SECS(n, f, h) \
    { .name = n, .kind = LILY_ARG_FLOAT, .dst = &o.f, .lo = 0.001, .hi = 1e6, .help = h }
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &o.model_dir, .help = "model directory"},
        {.name = "--host", .kind = LILY_ARG_STR, .dst = &o.host, .help = "bind address"},
        {.name = "--port",
         .kind = LILY_ARG_INT,
         .dst = &o.port,
         .lo = 0,
         .hi = 65535,
         .help = "port"},
        {.name = "--api-key", .kind = LILY_ARG_FN, .fn = add_key, .ud = &l, .help = "API key"},
        {.name = "--api-key-file",
         .kind = LILY_ARG_FN,
         .fn = add_key_file,
         .ud = &l,
         .help = "file of API keys"},
        {.name = "--model-id", .kind = LILY_ARG_STR, .dst = &o.model_id, .help = "model id"},
        {.name = "--strict-model",
         .kind = LILY_ARG_FLAG,
         .dst = &o.strict_model,
         .help = "404 for another model"},
        {.name = "--quiet", .kind = LILY_ARG_FLAG, .dst = &o.quiet, .help = "no request log"},
        {.name = "--ctx",
         .kind = LILY_ARG_INT,
         .dst = &o.ctx,
         .lo = 2,
         .hi = INT_MAX,
         .help = "context per request"},
        {.name = "--parallel",
         .kind = LILY_ARG_INT,
         .dst = &o.parallel,
         .lo = 1,
         .hi = 8,
         .help = "requests generating at once"},
        {.name = "--prefill-chunk",
         .kind = LILY_ARG_INT,
         .dst = &o.prefill_chunk,
         .lo = 1,
         .hi = INT_MAX,
         .help = "prompt tokens between decode steps"},
        {.name = "--parallel-queue",
         .kind = LILY_ARG_INT,
         .dst = &o.queue,
         .lo = 1,
         .hi = INT_MAX,
         .help = "waiting requests before 503"},
        {.name = "--max-body",
         .kind = LILY_ARG_SIZE,
         .dst = &max_body,
         .lo = 1,
         .hi = (double)LONG_MAX,
         .help = "request body limit"},
        {.name = "--snapshot-mem",
         .kind = LILY_ARG_SIZE,
         .dst = &snapshot_mb,
         .lo = 0,
         .hi = 1 << 30,
         .help = "prefix-cache MB"},
        {.name = "--cors-origins",
         .kind = LILY_ARG_STR,
         .dst = &o.cors_origins,
         .help = "allowed browser origins"},
        {.name = "--reasoning",
         .kind = LILY_ARG_ENUM,
         .dst = &o.reasoning,
         .values = on_off,
         .help = "default thinking switch"},
        {.name = "--log-format",
         .kind = LILY_ARG_FN,
         .fn = log_format,
         .ud = &o.log_format,
         .help = "text|json|none"},
        {.name = "--port-file",
         .kind = LILY_ARG_STR,
         .dst = &o.port_file,
         .help = "write the port here"},
        {.name = "--allow-host",
         .kind = LILY_ARG_FN,
         .fn = add_host,
         .ud = &l,
         .help = "extra Host header"},
        {.name = "--tls-cert", .kind = LILY_ARG_STR, .dst = &o.tls_cert, .help = "PEM cert"},
        {.name = "--tls-key", .kind = LILY_ARG_STR, .dst = &o.tls_key, .help = "PEM key"},
        {.name = "--max-tokens-cap",
         .kind = LILY_ARG_INT,
         .dst = &o.max_tokens_cap,
         .lo = 1,
         .hi = 999999999,
         .help = "generated tokens per request"},
        SECS("--request-timeout", request_timeout, "generation seconds per request"),
        SECS("--header-timeout", header_timeout, "request head deadline"),
        SECS("--body-timeout", body_timeout, "whole-request deadline"),
        SECS("--send-timeout", send_timeout, "unsent stream deadline"),
        {.name = "--send-buffer",
         .kind = LILY_ARG_SIZE,
         .dst = &send_buffer,
         .lo = 1,
         .hi = (double)LONG_MAX,
         .help = "unsent bytes per stream"},
        {.name = "--max-conns",
         .kind = LILY_ARG_INT,
         .dst = &o.max_conns,
         .lo = 1,
         .hi = 999999,
         .help = "open connections"},
        {.name = "--conn-requests",
         .kind = LILY_ARG_INT,
         .dst = &o.conn_requests,
         .lo = 1,
         .hi = 999999999,
         .help = "requests per connection"},
        {.name = "--conns-per-ip",
         .kind = LILY_ARG_INT,
         .dst = &o.conns_per_ip,
         .lo = 1,
         .hi = 999999,
         .help = "connections per client"},
        {0}};
#undef SECS
    const lily_arg *tabs[] = {own, engt};
    const int pr = lily_args_parse("serve", tabs, 2, argc, argv, NULL, 0, NULL, usage);
    int rc = 2;
    if (pr) {
        rc = lily_args_exit(pr);
        goto out;
    }
    o.backend = (lily_backend_kind)eng.backend;
    o.threads = eng.threads;
    o.precision = (lily_precision)eng.precision;
    o.cpu_isa = (lily_cpu_isa)eng.cpu_isa;
    o.sample_on = (lily_sample_on)eng.sample_on;
    if (max_body >= 0) o.max_body = (size_t)max_body;
    if (snapshot_mb >= 0) /* 0: effectively no cache */
        o.snapshot_mem = snapshot_mb ? (size_t)snapshot_mb << 20 : 1;
    if (send_buffer >= 0) o.send_buffer = (size_t)send_buffer;
    if (!o.model_dir) {
        usage(stderr);
        goto out;
    }
    char mbuf[4096]; /* --model OWNER/NAME: the hub cache's snapshot (lily pull) */
    if (!(o.model_dir = lily_cli_model(o.model_dir, mbuf, sizeof mbuf))) {
        rc = 1;
        goto out;
    }
    o.api_keys = (const char *const *)l.keys;
    o.n_api_keys = l.nkeys;
    o.allow_hosts = l.hosts;
    o.n_allow_hosts = l.nhosts;
    rc = lily_server_main(&o);
out:
    for (int i = 0; i < l.nkeys; i++)
        free(l.keys[i]);
    free(l.keys);
    free(l.hosts);
    return rc;
}

#else
int lily_cmd_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "lily serve: this build has no server (-DLILY_SERVER=OFF)\n");
    return 2;
}
#endif
