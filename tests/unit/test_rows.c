/* lily_session_decode_rows: each row's logits equal, bit for bit, what lily_session_decode gives
 * that session alone, for 1..LILY_MAX_ROWS sessions at different positions; bad calls fail
 * before any session moves. Runs on a random MLX 4-bit model and on the random HF bf16 one, with
 * the CPU backend's default and exact precisions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "lily.h"
#include "model/mkmodel.h"

static char root[64];

static void make(const char *dir, lily_mk_layout layout) {
    lily_err e = {0};
    lily_mk_opts o;
    if (lily_mk_preset("tiny", &o, &e) != 0) {
        printf("FAIL preset: %s\n", e.msg);
        exit(1);
    }
    o.layout = layout;
    o.bits = 4;
    o.seed = 77;
    o.n_threads = 1;
    lily_mk_result r;
    if (lily_mk_write(dir, &o, &r, &e) != 0) {
        printf("FAIL mkmodel: %s\n", e.msg);
        exit(1);
    }
}

/* n sessions, session i prefilled with 3 + 5 i tokens, then steps of rows. */
static void run(const char *dir, lily_precision prec, const char *what) {
    lily_err e = {0};
    lily_engine_opts opts = {0};
    opts.n_threads = 2;
    opts.precision = prec;
    lily_engine *eng;
    if (lily_engine_open(dir, &opts, &eng, &e) != 0) {
        check(0, what, "open: %s", e.msg);
        return;
    }
    int V = lily_engine_info(eng)->vocab_size;
    enum { N = LILY_MAX_ROWS };
    lily_session *a[N], *b[N];
    int32_t prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = (i * 37 + 11) % V;
    for (int i = 0; i < N; i++) {
        if (lily_session_create(eng, 128, &a[i], &e) || lily_session_create(eng, 128, &b[i], &e)) {
            check(0, what, "session: %s", e.msg);
            return;
        }
        int np = 3 + 5 * i;
        if (lily_session_prefill(a[i], prompt + i, np, NULL, NULL, NULL, &e) ||
            lily_session_prefill(b[i], prompt + i, np, NULL, NULL, NULL, &e)) {
            check(0, what, "prefill: %s", e.msg);
            return;
        }
    }
    /* steps with n = 1, 3, 8 rows over the first n sessions */
    int ns[] = {1, 3, N, 2};
    int mism = 0, fails = 0;
    for (int k = 0; k < 4; k++) {
        int n = ns[k];
        int32_t tok[N];
        for (int i = 0; i < n; i++)
            tok[i] = (int32_t)((k * 131 + i * 17 + 5) % V);
        if (lily_session_decode_rows(a, tok, n, &e) != 0) {
            fails++;
            printf("rows: %s\n", e.msg);
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (lily_session_decode(b[i], tok[i], &e) != 0) fails++;
            const float *la = lily_session_logits(a[i]), *lb = lily_session_logits(b[i]);
            if (!la || !lb || memcmp(la, lb, (size_t)V * sizeof(float)) != 0) mism++;
            if (lily_session_pos(a[i]) != lily_session_pos(b[i])) mism++;
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

int main(void) {
    snprintf(root, sizeof root, "/tmp/lily_test_rows_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char mlx[128], hf[128];
    snprintf(mlx, sizeof mlx, "%s/mlx", root);
    snprintf(hf, sizeof hf, "%s/hf", root);
    make(mlx, LILY_MK_MLX);
    make(hf, LILY_MK_HF);
    run(mlx, LILY_PRECISION_DEFAULT, "rows mlx4 default");
    run(mlx, LILY_PRECISION_EXACT, "rows mlx4 exact");
    run(hf, LILY_PRECISION_DEFAULT, "rows hf bf16 default");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("note: cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
