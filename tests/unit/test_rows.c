/* lily_session_decode_rows: each row's logits equal, bit for bit, what lily_session_decode gives
 * that session alone, for 1..LILY_MAX_ROWS sessions at different positions; bad calls fail
 * before any session moves (and likewise for the rows draws, run_draws). Runs on random MLX 4-bit and 8-bit models, a dense MLX 4-bit one and
 * the HF bf16 one, with the CPU backend's default and exact precisions and its AVX2 and plain C
 * kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "lily.h"
#include "model/mkmodel.h"

static char root[64];

/* A tiny model: 4 layers (3 GDN, 1 attention), 8 experts, top 2; dense: an MLP instead. */
static void make(const char *dir, lily_mk_layout layout, int bits, int dense) {
    lily_err e = {0};
    lily_mk_opts o;
    if (lily_mk_preset("tiny", &o, &e) != 0) {
        printf("FAIL preset: %s\n", e.msg);
        exit(1);
    }
    o.layout = layout;
    o.bits = bits;
    o.seed = 77;
    o.n_threads = 1;
    if (dense) {
        o.cfg.intermediate = 192;
        snprintf(o.cfg.model_type, sizeof o.cfg.model_type, "qwen3_5");
    }
    lily_mk_result r;
    if (lily_mk_write(dir, &o, &r, &e) != 0) {
        printf("FAIL mkmodel: %s\n", e.msg);
        exit(1);
    }
}

enum { N = LILY_MAX_ROWS, CTX = 640, LONG = 300 };

/* N sessions, session i prefilled with 3 + 5 i tokens (the last with LONG, past the attention
 * kernel's blocks of 64 positions), then steps of 1..N rows over rotating subsets of them (odd
 * counts, rows in any order, at different positions). With 8 experts and top 2, any 5 or more
 * rows share an expert (the union has repeats). */
static void run(const char *dir, lily_precision prec, lily_cpu_isa isa, const char *what) {
    lily_err e = {0};
    lily_engine_opts opts = {0};
    opts.n_threads = 2;
    opts.precision = prec;
    opts.cpu_isa = isa;
    lily_engine *eng;
    if (lily_engine_open(dir, &opts, &eng, &e) != 0) {
        check(0, what, "open: %s", e.msg);
        return;
    }
    int V = lily_engine_info(eng)->vocab_size;
    lily_session *a[N], *b[N];
    int32_t prompt[LONG + N];
    for (int i = 0; i < LONG + N; i++)
        prompt[i] = (i * 37 + 11) % V;
    for (int i = 0; i < N; i++) {
        if (lily_session_create(eng, CTX, &a[i], &e) || lily_session_create(eng, CTX, &b[i], &e)) {
            check(0, what, "session: %s", e.msg);
            return;
        }
        int np = i == N - 1 ? LONG : 3 + 5 * i;
        if (lily_session_prefill(a[i], prompt + i, np, NULL, NULL, NULL, &e) ||
            lily_session_prefill(b[i], prompt + i, np, NULL, NULL, NULL, &e)) {
            check(0, what, "prefill: %s", e.msg);
            return;
        }
    }
    int ns[] = {1, 3, N, 2, 5, 7, N, 6, 4, 1, N};
    int mism = 0, fails = 0, steps = (int)(sizeof ns / sizeof ns[0]);
    for (int k = 0; k < steps; k++) {
        int n = ns[k];
        int32_t tok[N];
        lily_session *ra[N], *rb[N];
        for (int i = 0; i < n; i++) {
            int sidx = (k * 3 + i * 5) % N; /* 5 is prime to N: n distinct sessions */
            ra[i] = a[sidx], rb[i] = b[sidx];
            /* two rows with the same token now and then */
            tok[i] = (int32_t)(((k * 131 + (i / 2) * 17 + 5)) % V);
        }
        if (lily_session_decode_rows(ra, tok, n, &e) != 0) {
            fails++;
            printf("rows: %s\n", e.msg);
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (lily_session_decode(rb[i], tok[i], &e) != 0) fails++;
            const float *la = lily_session_logits(ra[i]), *lb = lily_session_logits(rb[i]);
            if (!la || !lb || memcmp(la, lb, (size_t)V * sizeof(float)) != 0) mism++;
            if (lily_session_pos(ra[i]) != lily_session_pos(rb[i])) mism++;
        }
    }
    check(!fails && !mism, what, "%d failed calls, %d rows differ from lily_session_decode", fails,
          mism);
    /* bad calls: nothing moves */
    int p0 = lily_session_pos(a[0]), p1 = lily_session_pos(a[1]);
    int32_t tok2[2] = {1, 2};
    lily_session *dup[2] = {a[0], a[0]};
    int bad = lily_session_decode_rows(dup, tok2, 2, &e) == 0;
    int32_t badtok[2] = {1, V};
    bad += lily_session_decode_rows(a, badtok, 2, &e) == 0;
    bad += lily_session_decode_rows(a, tok2, 0, &e) == 0;
    bad += lily_session_decode_rows(a, tok2, LILY_MAX_ROWS + 1, &e) == 0;
    check(!bad && lily_session_pos(a[0]) == p0 && lily_session_pos(a[1]) == p1, what,
          "bad calls rejected without moving a session (%d accepted)", bad);
    for (int i = 0; i < N; i++) {
        lily_session_free(a[i]);
        lily_session_free(b[i]);
    }
    lily_engine_close(eng);
}

/* lily_session_draw_enqueue_rows (the CPU backend's draw ops, LILY_SAMPLE_ON_BACKEND): rows
 * draws pipelined one step ahead over 1..N sessions give the tokens lily_session_draw_enqueue
 * gives each session alone with the same seeds and steps; masks, a chained token without a
 * previous draw and a shared session are refused before anything moves. */
static void run_draws(const char *dir, const char *what) {
    lily_err e = {0};
    lily_engine_opts opts = {0};
    opts.n_threads = 2;
    opts.sample_on = LILY_SAMPLE_ON_BACKEND;
    lily_engine *eng;
    if (lily_engine_open(dir, &opts, &eng, &e) != 0) {
        check(0, what, "open: %s", e.msg);
        return;
    }
    const int V = lily_engine_info(eng)->vocab_size;
    lily_session *a[N], *b[N];
    int32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = (i * 41 + 3) % V;
    for (int i = 0; i < N; i++) {
        if (lily_session_create(eng, CTX, &a[i], &e) || lily_session_create(eng, CTX, &b[i], &e) ||
            lily_session_prefill(a[i], prompt + i, 2 + 4 * i, NULL, NULL, NULL, &e) ||
            lily_session_prefill(b[i], prompt + i, 2 + 4 * i, NULL, NULL, NULL, &e)) {
            check(0, what, "session: %s", e.msg);
            return;
        }
    }
    /* bad calls: nothing moves */
    int p0 = lily_session_pos(a[0]), p1 = lily_session_pos(a[1]);
    lily_draw d2[2] = {{.temperature = 0.5f, .ban_id = -1}, {.temperature = 0.5f, .ban_id = -1}};
    int32_t tok2[2] = {1, 2}, neg2[2] = {-1, -1};
    lily_session *dup[2] = {a[0], a[0]};
    int bad = lily_session_draw_enqueue_rows(dup, tok2, d2, 2, &e) == 0;
    bad += lily_session_draw_enqueue_rows(a, neg2, d2, 2, &e) == 0; /* nothing enqueued before */
    uint32_t mask[64] = {0xffffffffu};
    d2[1].allow = mask;
    d2[1].n_allow = 32;
    bad += lily_session_draw_enqueue_rows(a, tok2, d2, 2, &e) == 0;
    d2[1].allow = NULL;
    bad += lily_session_draw_enqueue_rows(a, tok2, d2, 0, &e) == 0;
    bad += lily_session_draw_enqueue_rows(a, tok2, d2, LILY_MAX_ROWS + 1, &e) == 0;
    check(!bad && lily_session_pos(a[0]) == p0 && lily_session_pos(a[1]) == p1, what,
          "bad rows draws rejected without moving a session (%d accepted)", bad);
    enum { STEPS = 5 };
    int ns[] = {N, 3, 1, 6};
    int mism = 0, fails = 0;
    for (int k = 0; k < (int)(sizeof ns / sizeof ns[0]); k++) {
        const int n = ns[k];
        lily_draw d[N];
        int32_t t0[N], neg[N], ra[STEPS][N], rb[STEPS][N];
        for (int i = 0; i < n; i++) {
            d[i] = (lily_draw){.temperature = k == 2 ? 0.0f : 0.9f,
                               .top_k = 20,
                               .top_p = 0.9f,
                               .ban_id = -1,
                               .seed = 500 + (uint64_t)(k * N + i)};
            t0[i] = (int32_t)((k * 7 + i * 13 + 1) % V);
            neg[i] = -1;
        }
        for (int st = 0; st < STEPS && !fails; st++) {
            for (int i = 0; i < n; i++)
                d[i].step = (uint64_t)st;
            fails += lily_session_draw_enqueue_rows(a, st ? neg : t0, d, n, &e) != 0;
            for (int i = 0; i < n && st && !fails; i++)
                fails += lily_session_draw_next(a[i], &ra[st - 1][i], &e) != 0;
        }
        for (int i = 0; i < n && !fails; i++)
            fails += lily_session_draw_next(a[i], &ra[STEPS - 1][i], &e) != 0;
        for (int i = 0; i < n && !fails; i++)
            for (int st = 0; st < STEPS && !fails; st++) {
                d[i].step = (uint64_t)st;
                fails += lily_session_draw_enqueue(b[i], st ? -1 : t0[i], &d[i], &e) != 0 ||
                         lily_session_draw_next(b[i], &rb[st][i], &e) != 0;
            }
        for (int i = 0; i < n && !fails; i++) {
            mism += lily_session_pos(a[i]) != lily_session_pos(b[i]);
            for (int st = 0; st < STEPS; st++)
                mism += ra[st][i] != rb[st][i];
        }
        if (fails) printf("draw rows: %s\n", e.msg);
    }
    check(!fails && !mism, what, "%d failed calls, %d rows draws differ from single draws", fails,
          mism);
    for (int i = 0; i < N; i++) {
        lily_session_free(a[i]);
        lily_session_free(b[i]);
    }
    lily_engine_close(eng);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/lily_test_rows_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char mlx[128], mlx8[128], hf[128], dense[128];
    snprintf(mlx, sizeof mlx, "%s/mlx", root);
    snprintf(mlx8, sizeof mlx8, "%s/mlx8", root);
    snprintf(hf, sizeof hf, "%s/hf", root);
    snprintf(dense, sizeof dense, "%s/dense", root);
    make(mlx, LILY_MK_MLX, 4, 0);
    make(mlx8, LILY_MK_MLX, 8, 0);
    make(hf, LILY_MK_HF, 4, 0);
    make(dense, LILY_MK_MLX, 4, 1);
    run(mlx, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_AUTO, "rows mlx4 default");
    run(mlx, LILY_PRECISION_EXACT, LILY_CPU_ISA_AUTO, "rows mlx4 exact");
    run(mlx, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_AVX2, "rows mlx4 avx2");
    run(mlx, LILY_PRECISION_FAST, LILY_CPU_ISA_AUTO, "rows mlx4 fast");
    run(mlx, LILY_PRECISION_FAST, LILY_CPU_ISA_AVX2, "rows mlx4 avx2 fast");
    run(mlx, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_SCALAR, "rows mlx4 scalar");
    run(mlx8, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_AUTO, "rows mlx8 default");
    run(hf, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_AUTO, "rows hf bf16 default");
    run(dense, LILY_PRECISION_DEFAULT, LILY_CPU_ISA_AUTO, "rows dense mlx4 default");
    run(dense, LILY_PRECISION_EXACT, LILY_CPU_ISA_AUTO, "rows dense mlx4 exact");
    run_draws(mlx, "rows draws mlx4");
    run_draws(hf, "rows draws hf bf16");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("note: cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
