/* lily generate: token ids in, generated token ids out (no tokenizer needed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli.h"
#include "cli_chat.h"
#include "sampler/sampler.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lily generate --model DIR --tokens \"ID ID ...\" [-n N] [--temp T]\n"
               "                     [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
               "                     [--backend cpu|cuda] [--threads N] [--ctx N]\n"
               "                     [--sample-on auto|device|host] [--precision P] [--cpu-isa I]\n"
               "Prints the generated ids on one line; stops at an end-of-sequence id or after N\n"
               "tokens (default 32). Speed goes to stderr. Tokens are drawn on the backend when\n"
               "it draws (auto: CUDA, with the logits on the GPU; device: the CPU backend too),\n"
               "on the host otherwise or with --sample-on host (the same chain and random\n"
               "numbers: the same tokens).\n");
}

int lily_cmd_generate(int argc, char **argv) {
    const char *tokstr = NULL;
    /* the options `lily run` and `chat` share, checked by the same code (cli_chat.c) */
    lily_clichat_opts co = {0};
    lily_chat_args ga = {
        .n_new = 32, .think = -1, .temp = -1, .top_p = -1, .min_p = -1, .top_k = -1};
    lily_arg engt[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ga.eng, engt);
    const lily_arg own[] = {
        {.name = "--tokens", .kind = LILY_ARG_STR, .dst = &tokstr, .help = "prompt token ids"},
        {0}};
    const lily_arg *tabs[] = {own, lily_chat_table(&co, &ga, 1), engt};
    const int pr = lily_args_parse("generate", tabs, 3, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    lily_chat_apply(&ga, &co);
    const char *model = co.model_dir;
    const int n_gen = ga.n_new, ctx = co.ctx;
    lily_engine_opts opts = {.backend = co.backend,
                             .n_threads = co.threads,
                             .precision = co.precision,
                             .cpu_isa = co.cpu_isa,
                             .sample_on = co.sample_on};
    lily_sampler_params sp = {0}; /* greedy unless --temp is given */
    sp.temperature = ga.temp >= 0 ? (float)ga.temp : 0.0f;
    sp.top_k = ga.top_k >= 0 ? (int)ga.top_k : 0;
    sp.top_p = ga.top_p >= 0 ? (float)ga.top_p : 1.0f;
    sp.min_p = ga.min_p >= 0 ? (float)ga.min_p : 0.0f;
    sp.seed = ga.seed_set ? (uint64_t)ga.seed : 0;
    char mbuf[4096];
    if (model && !(model = lily_cli_model(model, mbuf, sizeof mbuf))) return 1;
    if (!model || !tokstr) {
        usage(stderr);
        return 2;
    }
    int cap = 16, n = 0;
    int32_t *tok = malloc((size_t)cap * sizeof(int32_t));
    for (const char *p = tokstr; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            if (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') {
                p++;
                continue;
            }
            fprintf(stderr, "lily generate: bad token list near '%s'\n", p);
            free(tok);
            return 2;
        }
        if (n == cap) tok = realloc(tok, (size_t)(cap *= 2) * sizeof(int32_t));
        tok[n++] = (int32_t)v;
        p = end;
    }
    if (!n) {
        fprintf(stderr, "lily generate: no prompt tokens\n");
        free(tok);
        return 2;
    }
    lily_err e;
    lily_engine *eng = NULL;
    lily_session *s = NULL;
    lily_sampler *smp = NULL;
    int rc = 1;
    lily_cli_load_bar(&opts);
    if (lily_engine_open(model, &opts, &eng, &e) != 0) goto fail;
    const lily_model_info *in = lily_engine_info(eng);
    if (lily_session_create(eng, ctx > 0 ? ctx : n + n_gen, &s, &e) != 0) goto fail;
    if (lily_sampler_create(&sp, in->vocab_size, &smp, &e) != 0) goto fail;
    tok = realloc(tok, (size_t)(n + n_gen + 1) * sizeof(int32_t));
    double t0 = lily_now();
    if (lily_session_prefill(s, tok, n, NULL, NULL, NULL, &e) != 0) goto fail;
    double t1 = lily_now();
    /* the first token from the prompt's logits on the host; then, unless asked otherwise, the
     * rest drawn on the backend, pipelined: the step that consumes the coming draw is enqueued
     * before the draw is read (lily_session_draw_enqueue), so printing overlaps the next step */
    lily_draw dr = {0};
    const int dev = lily_session_can_decode_sample(s) && lily_sampler_as_draw(smp, &dr) == 0;
    dr.step = 1; /* the index of the token a draw makes: the first token is step 0 */
    int made = 0;
    for (; made < n_gen; made++) {
        int32_t next;
        if (made == 0 || !dev) {
            next =
                lily_sampler_sample(smp, lily_session_logits(s), tok, n + made, (uint64_t)made, &e);
            if (next < 0) goto fail;
            lily_sampler_accept(smp, next);
        } else {
            if (made + 1 < n_gen && lily_session_draw_enqueue(s, -1, &dr, &e) != 0) goto fail;
            dr.step += made + 1 < n_gen;
            if (lily_session_draw_next(s, &next, &e) != 0) goto fail;
        }
        tok[n + made] = next;
        printf("%s%d", made ? " " : "", next);
        fflush(stdout);
        int eos = 0;
        for (int k = 0; k < 4; k++)
            eos |= in->eos_ids[k] >= 0 && next == in->eos_ids[k];
        if (eos) {
            made++;
            break;
        }
        if (made + 1 >= n_gen) continue;
        if (dev && made == 0) {
            if (lily_session_draw_enqueue(s, next, &dr, &e) != 0) goto fail;
            dr.step++;
        } else if (!dev && lily_session_decode(s, next, &e) != 0) {
            goto fail;
        }
    }
    double t2 = lily_now();
    printf("\n");
    fprintf(stderr,
            "prefill %d tokens: %.1f tok/s; generated %d tokens: %.2f tok/s (drawn on the %s)\n", n,
            n / (t1 - t0), made, made > 1 ? (made - 1) / (t2 - t1) : 0.0, dev ? "backend" : "host");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lily generate: %s\n", e.msg);
done:
    free(tok);
    lily_sampler_free(smp);
    lily_session_free(s);
    lily_engine_close(eng);
    return rc;
}
