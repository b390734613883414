/* GPU decode GEMV (backend/cuda/gemv.h) against lily_cpu_matmul with n = 1, on random Q4, Q8, BF16
 * and F32 (rounded to BF16 on upload) matrices of odd row counts and several widths (64 .. 4096
 * columns, which exercise every lanes-per-row variant), through every prologue (copy, RMSNorm,
 * per-head gated RMSNorm) and epilogue (store, add, causal conv + SiLU with state update); and
 * the rows form (lily_cuda_gemv_rows, 1..8 input vectors) against each vector alone, bit for bit. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "backend/cuda/gemv.h"
#include "parity_util.h"

static float silu_h(float x) {
    return x / (1.0f + expf(-x));
}

/* Segments with the given row counts, one dtype, cols wide; prologue kind pk. */
static void run_case(lily_dtype dt, int cols, const int *rows, int nseg, int pk, int epi) {
    char name[160];
    lily_err e;
    lily_mat m[LILY_GEMV_SEGS];
    lily_dmat dm[LILY_GEMV_SEGS];
    lily_gemv_seg seg[LILY_GEMV_SEGS];
    float *x = malloc(cols * 4), *xp = malloc(cols * 4), *w = malloc(cols * 4);
    float *z = malloc(cols * 4);
    pt_fill(x, cols, 2.0f);
    for (int i = 0; i < cols; i++)
        w[i] = 0.5f + pt_frand() * 0.5f;
    pt_fill(z, cols, 3.0f);
    int head = 128 <= cols && cols % 128 == 0 ? 128 : 64;
    /* the CPU form of the prologue */
    if (pk == LILY_GP_RMSNORM) {
        lily_cpu_rmsnorm(x, w, cols, 1e-6f, xp);
    } else if (pk == LILY_GP_GATED) {
        for (int h = 0; h < cols / head; h++) {
            lily_cpu_rmsnorm(x + h * head, w, head, 1e-6f, xp + h * head);
            for (int i = 0; i < head; i++)
                xp[h * head + i] *= silu_h(z[h * head + i]);
        }
    } else {
        memcpy(xp, x, cols * 4);
    }
    float *dx = pt_dup(x, cols), *dw = pt_dup(w, cols), *dz = pt_dup(z, cols);
    float *ref[LILY_GEMV_SEGS], *dy[LILY_GEMV_SEGS], *dcs[LILY_GEMV_SEGS], *dcw[LILY_GEMV_SEGS];
    float *cs[LILY_GEMV_SEGS], *cw[LILY_GEMV_SEGS];
    const int K = 4;
    for (int s = 0; s < nseg; s++) {
        m[s] = pt_mat(dt, rows[s], cols);
        if (!pt_ok(lily_cuda_dmat_upload(&m[s], 1, &dm[s], &e), "upload", &e)) return;
        ref[s] = malloc(rows[s] * 4);
        lily_cpu_matmul(pt_cpu(), &m[s], xp, 1, cols, ref[s], rows[s], NULL);
        float *y0 = malloc(rows[s] * 4);
        pt_fill(y0, rows[s], 1.0f);
        cs[s] = malloc((size_t)(K - 1) * rows[s] * 4);
        cw[s] = malloc((size_t)K * rows[s] * 4);
        pt_fill(cs[s], (size_t)(K - 1) * rows[s], 1.0f);
        pt_fill(cw[s], (size_t)K * rows[s], 0.7f);
        dcs[s] = pt_dup(cs[s], (size_t)(K - 1) * rows[s]);
        dcw[s] = pt_dup(cw[s], (size_t)K * rows[s]);
        if (epi == LILY_GV_ADD) {
            dy[s] = pt_dup(y0, rows[s]);
            for (int r = 0; r < rows[s]; r++)
                ref[s][r] += y0[r];
        } else {
            dy[s] = pt_dalloc(rows[s] * 4);
        }
        if (epi == LILY_GV_CONV) {
            float *o = malloc(rows[s] * 4);
            lily_cpu_conv_silu(ref[s], 1, rows[s], K, cs[s], cw[s], o);
            memcpy(ref[s], o, rows[s] * 4); /* cs[s] now holds the expected new state */
            free(o);
        }
        free(y0);
        seg[s] = (lily_gemv_seg){&dm[s], dy[s], epi, dcs[s], dcw[s], K};
    }
    lily_gemv_pro pro = {pk, dw, dz, head, 1e-6f};
    int rc = lily_cuda_gemv(seg, nseg, dx, &pro, NULL, &e);
    if (!pt_ok(rc, "gemv launch", &e)) return;
    static const char *dts[] = {"f32", "bf16", "f16", "q4", "q8"};
    static const char *pks[] = {"copy", "rmsnorm", "gated"};
    static const char *eps[] = {"store", "add", "conv"};
    for (int s = 0; s < nseg; s++) {
        float *got = malloc(rows[s] * 4);
        pt_get(got, dy[s], rows[s]);
        snprintf(name, sizeof name, "gemv %s [%d x %d] seg %d/%d %s %s", dts[dt], rows[s], cols, s,
                 nseg, pks[pk], eps[epi]);
        /* bf16 rounding of F32 weights on upload: ~2^-9 relative per weight */
        pt_check(name, got, ref[s], rows[s], dt == LILY_DT_F32 ? 1e-2 : 1e-4);
        if (epi == LILY_GV_CONV) {
            float *st = malloc((size_t)(K - 1) * rows[s] * 4);
            pt_get(st, dcs[s], (size_t)(K - 1) * rows[s]);
            snprintf(name, sizeof name, "gemv conv state [%d x %d] seg %d", K - 1, rows[s], s);
            pt_check(name, st, cs[s], (size_t)(K - 1) * rows[s], dt == LILY_DT_F32 ? 1e-2 : 1e-4);
            free(st);
        }
        free(got);
        free(ref[s]), free(cs[s]), free(cw[s]);
        lily_cuda_free(dy[s]), lily_cuda_free(dcs[s]), lily_cuda_free(dcw[s]);
        lily_cuda_dmat_free(&dm[s]);
        pt_mat_free(&m[s]);
    }
    lily_cuda_free(dx), lily_cuda_free(dw), lily_cuda_free(dz);
    free(x), free(xp), free(w), free(z);
}

/* lily_cuda_gemv_rows with nx input vectors (their own x, gate z, outputs and conv states)
 * against lily_cuda_gemv of each vector alone: bit for bit (memcmp), outputs and conv states. */
static void run_rows(lily_dtype dt, int cols, const int *rows, int nseg, int pk, int epi, int nx) {
    enum { K = 4, NX = LILY_GEMV_ROWS };
    lily_err e;
    lily_mat m[LILY_GEMV_SEGS];
    lily_dmat dm[LILY_GEMV_SEGS];
    lily_gemv_seg seg[NX * LILY_GEMV_SEGS], one[LILY_GEMV_SEGS];
    lily_gemv_pro pro[NX];
    const float *xr[NX];
    float *dx[NX], *dz[NX], *y[2][NX][LILY_GEMV_SEGS], *cs[2][NX][LILY_GEMV_SEGS];
    float *cw[LILY_GEMV_SEGS];
    const int head = 128 <= cols && cols % 128 == 0 ? 128 : 64;
    float *h = malloc((size_t)(cols > 8192 ? cols : 8192) * K * 4);
    pt_fill(h, cols, 1.0f);
    for (int i = 0; i < cols; i++)
        h[i] = 0.5f + 0.5f * h[i];
    float *dw = pt_dup(h, cols);
    for (int s = 0; s < nseg; s++) {
        m[s] = pt_mat(dt, rows[s], cols);
        if (!pt_ok(lily_cuda_dmat_upload(&m[s], 1, &dm[s], &e), "upload", &e)) return;
        pt_fill(h, (size_t)K * rows[s], 0.7f);
        cw[s] = pt_dup(h, (size_t)K * rows[s]);
    }
    for (int r = 0; r < nx; r++) {
        pt_fill(h, cols, 2.0f);
        xr[r] = dx[r] = pt_dup(h, cols);
        pt_fill(h, cols, 3.0f);
        dz[r] = pt_dup(h, cols);
        pro[r] = (lily_gemv_pro){pk, dw, dz[r], head, 1e-6f};
        for (int s = 0; s < nseg; s++) {
            pt_fill(h, rows[s], 1.0f); /* both runs start from the same y (ADD) and state */
            y[0][r][s] = pt_dup(h, rows[s]);
            y[1][r][s] = pt_dup(h, rows[s]);
            pt_fill(h, (size_t)(K - 1) * rows[s], 1.0f);
            cs[0][r][s] = pt_dup(h, (size_t)(K - 1) * rows[s]);
            cs[1][r][s] = pt_dup(h, (size_t)(K - 1) * rows[s]);
            seg[r * nseg + s] = (lily_gemv_seg){&dm[s], y[0][r][s], epi, cs[0][r][s], cw[s], K};
        }
    }
    int ok = pt_ok(lily_cuda_gemv_rows(seg, nseg, nx, xr, pk ? pro : NULL, NULL, &e), "rows", &e);
    for (int r = 0; r < nx && ok; r++) {
        for (int s = 0; s < nseg; s++)
            one[s] = (lily_gemv_seg){&dm[s], y[1][r][s], epi, cs[1][r][s], cw[s], K};
        ok = pt_ok(lily_cuda_gemv(one, nseg, dx[r], pk ? &pro[r] : NULL, NULL, &e), "alone", &e);
    }
    static const char *dts[] = {"f32", "bf16", "f16", "q4", "q8"};
    static const char *pks[] = {"copy", "rmsnorm", "gated"};
    static const char *eps[] = {"store", "add", "conv"};
    int same = ok;
    float *a = malloc((size_t)8192 * K * 4), *b = malloc((size_t)8192 * K * 4);
    for (int r = 0; r < nx && same; r++)
        for (int s = 0; s < nseg && same; s++) {
            pt_get(a, y[0][r][s], rows[s]);
            pt_get(b, y[1][r][s], rows[s]);
            same = !memcmp(a, b, (size_t)rows[s] * 4);
            pt_get(a, cs[0][r][s], (size_t)(K - 1) * rows[s]);
            pt_get(b, cs[1][r][s], (size_t)(K - 1) * rows[s]);
            same = same && !memcmp(a, b, (size_t)(K - 1) * rows[s] * 4);
            if (!same) printf("  vector %d segment %d differs\n", r, s);
        }
    char name[160];
    snprintf(name, sizeof name, "gemv rows %s x%d [.. x %d] %d segs %s %s = each vector alone",
             dts[dt], nx, cols, nseg, pks[pk], eps[epi]);
    pt_check_true(name, same);
    for (int r = 0; r < nx; r++) {
        lily_cuda_free(dx[r]), lily_cuda_free(dz[r]);
        for (int s = 0; s < nseg; s++)
            for (int k = 0; k < 2; k++)
                lily_cuda_free(y[k][r][s]), lily_cuda_free(cs[k][r][s]);
    }
    for (int s = 0; s < nseg; s++) {
        lily_cuda_free(cw[s]);
        lily_cuda_dmat_free(&dm[s]);
        pt_mat_free(&m[s]);
    }
    lily_cuda_free(dw);
    free(h), free(a), free(b);
}

int main(void) {
    pt_need_gpu();
    int r3[] = {1000, 37, 513}, r1[] = {8192}, r4[] = {256, 1, 7, 300}, rs[] = {5};
    run_case(LILY_DT_Q4, 2048, r3, 3, LILY_GP_RMSNORM, LILY_GV_STORE);
    run_case(LILY_DT_Q4, 2048, r1, 1, LILY_GP_NONE, LILY_GV_STORE);
    run_case(LILY_DT_Q4, 4096, r3, 2, LILY_GP_GATED, LILY_GV_ADD);
    run_case(LILY_DT_Q4, 512, r3, 3, LILY_GP_NONE, LILY_GV_ADD);
    run_case(LILY_DT_Q4, 64, r4, 4, LILY_GP_RMSNORM, LILY_GV_STORE);
    run_case(LILY_DT_Q4, 192, rs, 1, LILY_GP_NONE, LILY_GV_STORE);
    run_case(LILY_DT_Q4, 1024, r3, 3, LILY_GP_RMSNORM, LILY_GV_CONV);
    run_case(LILY_DT_Q8, 2048, r4, 2, LILY_GP_RMSNORM, LILY_GV_STORE);
    run_case(LILY_DT_Q8, 320, r3, 3, LILY_GP_NONE, LILY_GV_STORE);
    run_case(LILY_DT_BF16, 2048, r3, 3, LILY_GP_RMSNORM, LILY_GV_STORE);
    run_case(LILY_DT_BF16, 576, r4, 4, LILY_GP_GATED, LILY_GV_ADD);
    run_case(LILY_DT_BF16, 64, rs, 1, LILY_GP_NONE, LILY_GV_CONV);
    run_case(LILY_DT_F32, 768, r3, 2, LILY_GP_NONE, LILY_GV_STORE);
    /* a wide input (dynamic shared memory above 48 KiB; 16384 columns is the widest the CPU
     * reference's matmul takes, 256 groups) */
    int rw[] = {33};
    run_case(LILY_DT_Q4, 16384, rw, 1, LILY_GP_RMSNORM, LILY_GV_STORE);
    /* several input vectors at once (a decode step of rows): tensor-core Q4 (every count 1..8),
     * the fp32 kernels (counts split into launches of 8, 4, 2, 1), every prologue and epilogue,
     * and a width whose vectors do not all fit one launch's shared memory */
    int rq[] = {300, 37, 5, 1000};
    for (int nx = 1; nx <= LILY_GEMV_ROWS; nx++)
        run_rows(LILY_DT_Q4, 2048, rq, 4, LILY_GP_RMSNORM, nx == 3 ? LILY_GV_CONV : LILY_GV_STORE,
                 nx);
    run_rows(LILY_DT_Q4, 4096, r3, 2, LILY_GP_GATED, LILY_GV_ADD, 8);
    run_rows(LILY_DT_Q4, 512, r3, 3, LILY_GP_NONE, LILY_GV_ADD, 5);
    run_rows(LILY_DT_Q4, 320, r3, 3, LILY_GP_RMSNORM, LILY_GV_CONV, 7);
    run_rows(LILY_DT_Q4, 64, r4, 4, LILY_GP_RMSNORM, LILY_GV_STORE, 8);
    run_rows(LILY_DT_Q8, 2048, r4, 2, LILY_GP_RMSNORM, LILY_GV_STORE, 6);
    run_rows(LILY_DT_BF16, 576, r4, 4, LILY_GP_GATED, LILY_GV_ADD, 3);
    run_rows(LILY_DT_BF16, 4096, rs, 1, LILY_GP_RMSNORM, LILY_GV_STORE, 8);
    run_rows(LILY_DT_F32, 768, r3, 2, LILY_GP_NONE, LILY_GV_CONV, 8);
    run_rows(LILY_DT_Q4, 16384, rw, 1, LILY_GP_RMSNORM, LILY_GV_STORE, 3);
    /* bad input is an error, not a crash */
    lily_err e;
    pt_check_true("gemv rejects 0 segments", lily_cuda_gemv(NULL, 0, NULL, NULL, NULL, &e) == -1);
    pt_check_true("gemv rows rejects 9 vectors",
                  lily_cuda_gemv_rows(NULL, 1, LILY_GEMV_ROWS + 1, NULL, NULL, NULL, &e) == -1);
    return pt_finish();
}
#endif
