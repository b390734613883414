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
    fprintf(f,
            "usage: lily serve --model DIR [options]\n"
            "  --host ADDR           bind address (default 127.0.0.1)\n"
            "  --port N              port (default 8080; 0 = any free port)\n"
            "  --api-key KEY         require this key (repeatable); --api-key-file FILE\n"
            "  --model-id ID         served model id (default: the directory name)\n"
            "  --strict-model        404 for requests naming another model\n"
            "  --ctx N               context per request (default min(model, 32768))\n"
            "  --parallel-queue N    waiting requests before 503 (default 64)\n"
            "  --max-body BYTES      request body limit, K/M suffix (default 32M)\n"
            "  --snapshot-mem MB     prefix-cache memory (default 2048)\n"
            "  --backend cpu|cuda    (default cpu)   --threads N\n"
            "  --cors-origins LIST   allowed browser origins, comma list or * (default localhost)\n"
            "  --reasoning on|off    default thinking switch (default: the template's)\n"
            "  --port-file FILE      write the bound port to FILE\n"
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

int lily_cmd_serve(int argc, char **argv) {
    lily_server_opts o = {.port = 8080, .reasoning = -1};
    char **keys = NULL;
    int nkeys = 0, rc = 2;
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
    rc = lily_server_main(&o);
out:
    for (int i = 0; i < nkeys; i++)
        free(keys[i]);
    free(keys);
    return rc;
}

#else
int lily_cmd_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "lily serve: this build has no server (-DLILY_SERVER=OFF)\n");
    return 2;
}
#endif
