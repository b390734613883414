/* lily serve: the OpenAI-compatible HTTP server (src/server). */
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
        "  --parallel-queue N    waiting requests before 503 (default 64)\n"
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
        "  --header-timeout S    request head deadline from accept (10)\n"
        "  --body-timeout S      whole-request deadline from accept (60)\n"
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

/* A positive number of seconds (fractions allowed). */
static int seconds(const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0) || x > 1e6) return 0;
    *out = x;
    return 1;
}

int lily_cmd_serve(int argc, char **argv) {
    lily_server_opts o = {.port = 8080, .reasoning = -1};
    char **keys = NULL;
    const char **hosts = NULL;
    int nkeys = 0, nhosts = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto out;
        }
        if (!strcmp(a, "--strict-model")) {
            o.strict_model = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            continue;
        }
        if (!(v = lily_cli_value(argc, argv, &i))) goto out;
        if (!strcmp(a, "--model")) {
            o.model_dir = v;
        } else if (!strcmp(a, "--host")) {
            o.host = v;
        } else if (!strcmp(a, "--port") && !lily_cli_size(v, &x) && x < 65536) {
            o.port = (int)x;
        } else if (!strcmp(a, "--api-key")) {
            keys = lily_xrealloc(keys, (size_t)(nkeys + 1) * sizeof *keys);
            keys[nkeys++] = lily_xstrdup(v);
        } else if (!strcmp(a, "--api-key-file")) {
            if (read_keys(v, &keys, &nkeys)) goto out;
        } else if (!strcmp(a, "--model-id")) {
            o.model_id = v;
        } else if (!strcmp(a, "--ctx") && !lily_cli_size(v, &x) && x > 1) {
            o.ctx = (int)x;
        } else if (!strcmp(a, "--parallel-queue") && !lily_cli_size(v, &x) && x > 0) {
            o.queue = (int)x;
        } else if (!strcmp(a, "--max-body") && !lily_cli_size(v, &x) && x > 0) {
            o.max_body = (size_t)x;
        } else if (!strcmp(a, "--snapshot-mem") && !lily_cli_size(v, &x)) {
            o.snapshot_mem = (size_t)x << 20;
            if (!x) o.snapshot_mem = 1; /* effectively no cache */
        } else if (!strcmp(a, "--backend")) {
            if (lily_cli_backend(v, &o.backend)) goto out;
        } else if (!strcmp(a, "--threads") && !lily_cli_size(v, &x)) {
            o.threads = (int)x;
        } else if (!strcmp(a, "--precision") || !strcmp(a, "--cpu-isa") ||
                   !strcmp(a, "--sample-on")) {
            lily_engine_opts eo = {
                .precision = o.precision, .cpu_isa = o.cpu_isa, .sample_on = o.sample_on};
            if (lily_cli_engine_arg(a, v, &eo) < 0) goto out;
            o.precision = eo.precision, o.cpu_isa = eo.cpu_isa, o.sample_on = eo.sample_on;
        } else if (!strcmp(a, "--cors-origins")) {
            o.cors_origins = v;
        } else if (!strcmp(a, "--reasoning") && (!strcmp(v, "on") || !strcmp(v, "off"))) {
            o.reasoning = !strcmp(v, "on");
        } else if (!strcmp(a, "--log-format")) {
            lily_log_format f;
            if (lily_reqlog_parse_format(v, &f)) {
                fprintf(stderr, "lily serve: --log-format must be text, json or none\n");
                goto out;
            }
            o.log_format = (int)f;
        } else if (!strcmp(a, "--port-file")) {
            o.port_file = v;
        } else if (!strcmp(a, "--allow-host")) {
            hosts = lily_xrealloc(hosts, (size_t)(nhosts + 1) * sizeof *hosts);
            hosts[nhosts++] = v;
        } else if (!strcmp(a, "--tls-cert")) {
            o.tls_cert = v;
        } else if (!strcmp(a, "--tls-key")) {
            o.tls_key = v;
        } else if (!strcmp(a, "--max-tokens-cap") && !lily_cli_size(v, &x) && x > 0 &&
                   x < 1000000000) {
            o.max_tokens_cap = (int)x;
        } else if (!strcmp(a, "--request-timeout") && seconds(v, &o.request_timeout)) {
        } else if (!strcmp(a, "--header-timeout") && seconds(v, &o.header_timeout)) {
        } else if (!strcmp(a, "--body-timeout") && seconds(v, &o.body_timeout)) {
        } else if (!strcmp(a, "--send-timeout") && seconds(v, &o.send_timeout)) {
        } else if (!strcmp(a, "--send-buffer") && !lily_cli_size(v, &x) && x > 0) {
            o.send_buffer = (size_t)x;
        } else if (!strcmp(a, "--max-conns") && !lily_cli_size(v, &x) && x > 0 && x < 1000000) {
            o.max_conns = (int)x;
        } else if (!strcmp(a, "--conns-per-ip") && !lily_cli_size(v, &x) && x > 0 && x < 1000000) {
            o.conns_per_ip = (int)x;
        } else {
            fprintf(stderr, "lily serve: bad option %s %s\n", a, v);
            usage(stderr);
            goto out;
        }
    }
    if (!o.model_dir) {
        usage(stderr);
        goto out;
    }
    o.api_keys = (const char *const *)keys;
    o.n_api_keys = nkeys;
    o.allow_hosts = hosts;
    o.n_allow_hosts = nhosts;
    rc = lily_server_main(&o);
out:
    for (int i = 0; i < nkeys; i++)
        free(keys[i]);
    free(keys);
    free(hosts);
    return rc;
}

#else
int lily_cmd_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "lily serve: this build has no server (-DLILY_SERVER=OFF)\n");
    return 2;
}
#endif
