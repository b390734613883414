/* lily score: teacher-forced logits for a token file, in prefill, decode or chunked mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lily score --model DIR --tokens FILE --logits-out FILE\n"
               "                  [--mode prefill|decode|chunked:N] [--backend cpu|cuda]\n"
               "                  [--threads N] [--precision P] [--cpu-isa I]\n"
               "Tokens are little-endian int32; the output is little-endian float32 [n][vocab],\n"
               "row i = logits after tokens 0..i.\n");
}

int lily_cmd_score(int argc, char **argv) {
    const char *model = NULL, *tokens_path = NULL, *out_path = NULL, *mode = "prefill";
    lily_engine_opts opts = {0};
    lily_cli_engine ce = {0};
    lily_arg engt[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ce, engt);
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"},
        {.name = "--tokens", .kind = LILY_ARG_STR, .dst = &tokens_path, .help = "token file"},
        {.name = "--logits-out", .kind = LILY_ARG_STR, .dst = &out_path, .help = "output"},
        {.name = "--mode", .kind = LILY_ARG_STR, .dst = &mode, .help = "prefill|decode|chunked:N"},
        {0}};
    const lily_arg *tabs[] = {own, engt};
    const int pr = lily_args_parse("score", tabs, 2, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    lily_cli_engine_apply(&ce, &opts);
    char mbuf[4096];
    if (model && !(model = lily_cli_model(model, mbuf, sizeof mbuf))) return 1;
    if (!model || !tokens_path || !out_path) {
        usage(stderr);
        return 2;
    }
    int chunk = 0, decode = 0;
    if (!strcmp(mode, "decode"))
        decode = 1;
    else if (!strncmp(mode, "chunked:", 8)) {
        chunk = atoi(mode + 8);
        if (chunk < 1) {
            fprintf(stderr, "lily score: bad mode '%s'\n", mode);
            return 2;
        }
    } else if (strcmp(mode, "prefill") != 0) {
        fprintf(stderr, "lily score: bad mode '%s' (prefill, decode or chunked:N)\n", mode);
        return 2;
    }
    int32_t *tok = NULL;
    int n = 0;
    if (lily_cli_read_tokens(tokens_path, &tok, &n)) return 1;
    /* prefill = one pass over the whole sequence; chunked:N = prefill calls of N tokens */
    opts.prefill_chunk = chunk ? chunk : n;
    lily_err e;
    lily_engine *eng = NULL;
    lily_session *s = NULL;
    int rc = 1;
    float *logits = NULL;
    lily_cli_load_bar(&opts);
    if (lily_engine_open(model, &opts, &eng, &e) != 0) goto fail;
    int V = lily_engine_info(eng)->vocab_size;
    if (lily_session_create(eng, n, &s, &e) != 0) goto fail;
    logits = malloc((size_t)n * V * sizeof(float));
    if (!logits) {
        snprintf(e.msg, sizeof e.msg, "out of memory for %d x %d logits", n, V);
        goto fail;
    }
    if (decode) {
        for (int i = 0; i < n; i++) {
            if (lily_session_decode(s, tok[i], &e) != 0) goto fail;
            memcpy(logits + (size_t)i * V, lily_session_logits(s), (size_t)V * sizeof(float));
        }
    } else {
        int step = chunk ? chunk : n;
        for (int i = 0; i < n; i += step) {
            int m = n - i < step ? n - i : step;
            if (lily_session_prefill(s, tok + i, m, logits + (size_t)i * V, NULL, NULL, &e) != 0)
                goto fail;
        }
    }
    FILE *f = fopen(out_path, "wb");
    if (!f) {
        snprintf(e.msg, sizeof e.msg, "%s: cannot open for writing", out_path);
        goto fail;
    }
    size_t wrote = fwrite(logits, sizeof(float), (size_t)n * V, f);
    if (fclose(f) != 0 || wrote != (size_t)n * V) {
        snprintf(e.msg, sizeof e.msg, "%s: write failed", out_path);
        goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lily score: %s\n", e.msg);
done:
    free(logits);
    free(tok);
    lily_session_free(s);
    lily_engine_close(eng);
    return rc;
}
