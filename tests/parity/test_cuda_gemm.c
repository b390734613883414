/* GPU tensor-core prefill GEMM (backend/cuda/gemm.h) against lily_cpu_matmul on random Q4, Q8,
 * BF16 and F32 (rounded to BF16) weights: odd row counts (partial row tiles), token counts around
 * the token tiles (1, 3, 63, 64, 65, 200), widths from one group (64) to 4096, strided X and Y,
 * the accumulate epilogue; the grouped (expert) form with row gather and experts of 0 rows, one
 * row, several token tiles and all rows; and the gated (silu(gate) * up) forms. The Q4 kernel
 * (gemm_q4.h) runs with every tile shape and split-K factor forced. Everything runs twice: exact
 * (lily_cuda_prec.gemm_exact, the default: fp16 weights, activations as fp16 hi + lo with a row scale;
 * the tolerance is that of weights rounded to fp16, relative L2 error <= 5e-4) and fast (one bf16
 * pass: tolerance 1e-2). F32 weights are stored as bf16 on the device, so they keep 1e-2. The
 * exact pass also checks rows of very different magnitudes (1e-6 .. 1e6: the row scale keeps
 * fp16 in range).
 *
 * LILY_CUDA_TIME=1 also times the automatic choice and the gemm_q4.h kernel at the 35B-A3B prefill
 * shapes (cudaEvent, median of 20) for chunks of n = 512, 2048 and 4096 tokens: every dense
 * projection, and the grouped expert GEMMs with n x 8 rows spread unevenly over 256 experts. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_q4.h"
#include "backend/cuda/gemm_wg.h"
#include "parity_util.h"

static char g_tag[48]; /* appended to the case names: forced tile and split of the Q4 kernel */
/* LILY_CUDA_SAN=1: the cases small enough for compute-sanitizer's racecheck (10-100x slower);
 * every kernel, tile and split still runs, only the 35B-sized shapes are left out */
static int g_san;

static const char *dts[] = {"f32", "bf16", "f16", "q4", "q8"};
static double g_tol = 1e-2;   /* relative L2 error allowed (weights other than F32) */
static float g_xscale_spread; /* > 0: row t of X scaled by 10^(spread * (t % 13 - 6) / 6) */

static double tol(lily_dtype dt) {
    return dt == LILY_DT_F32 ? 1e-2 : g_tol;
}

/* Random X with (optionally) rows of very different magnitudes. */
static void fill_x(float *X, int rows, int ld) {
    pt_fill(X, (size_t)rows * ld, 2.0f);
    if (g_xscale_spread <= 0) return;
    for (int t = 0; t < rows; t++) {
        float f = powf(10.f, g_xscale_spread * (float)(t % 13 - 6) / 6.f);
        for (int c = 0; c < ld; c++)
            X[(size_t)t * ld + c] *= f;
    }
}

static float silu(float x) {
    return x / (1.0f + expf(-x));
}

typedef int (*gemm_fn)(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                       int accumulate, lily_cuda_stream st, lily_err *e);

/* Y's row stride is M + g_ldy_pad: 3 leaves Y's rows unaligned (the kernels' scalar stores), a
 * pad that makes it a multiple of 4 lets gemm_wg's 16-byte stores run. */
static int g_ldy_pad = 3;

/* One dense GEMM through fn (lily_cuda_gemm, or a kernel's own entry point) against the CPU
 * matmul; Y's columns past M must come back untouched. */
static void gemm_case_fn(gemm_fn fn, const char *label, lily_dtype dt, int M, int K, int n,
                         int accumulate) {
    lily_err e;
    char name[160];
    int ldx = K + 4, ldy = M + g_ldy_pad;
    lily_mat W = pt_mat(dt, M, K);
    lily_dmat dW;
    if (!pt_ok(lily_cuda_dmat_upload(&W, 1, &dW, &e), "upload", &e)) return;
    float *X = malloc((size_t)n * ldx * 4), *Y0 = malloc((size_t)n * ldy * 4);
    float *ref = malloc((size_t)n * ldy * 4);
    fill_x(X, n, ldx);
    pt_fill(Y0, (size_t)n * ldy, 1.0f);
    memcpy(ref, Y0, (size_t)n * ldy * 4);
    float *tmp = malloc((size_t)n * M * 4);
    lily_cpu_matmul(pt_cpu(), &W, X, n, ldx, tmp, M, NULL);
    for (int t = 0; t < n; t++)
        for (int o = 0; o < M; o++)
            ref[(size_t)t * ldy + o] =
                (accumulate ? ref[(size_t)t * ldy + o] : 0) + tmp[(size_t)t * M + o];
    float *dX = pt_dup(X, (size_t)n * ldx), *dY = pt_dup(Y0, (size_t)n * ldy);
    int rc = fn(&dW, dX, ldx, n, dY, ldy, accumulate, NULL, &e);
    if (!pt_ok(rc, "gemm launch", &e)) return;
    float *got = malloc((size_t)n * ldy * 4);
    pt_get(got, dY, (size_t)n * ldy);
    snprintf(name, sizeof name, "%s %s W[%d x %d] n=%d%s%s", label, dts[dt], M, K, n,
             accumulate ? " accumulate" : "", g_tag);
    pt_check(name, got, ref, (size_t)n * ldy, tol(dt));
    if (!accumulate && strstr(g_tag, "split") && !strstr(g_tag, "split 1]")) {
        /* split-K: the partial sums are added in k order, so a second run gives the same bits */
        float *again = malloc((size_t)n * ldy * 4);
        rc = fn(&dW, dX, ldx, n, dY, ldy, 0, NULL, &e);
        if (pt_ok(rc, "gemm launch", &e)) {
            pt_get(again, dY, (size_t)n * ldy);
            char nm[200];
            snprintf(nm, sizeof nm, "%s: same bits on a second run", name);
            pt_check_true(nm, memcmp(again, got, (size_t)n * ldy * 4) == 0);
        }
        free(again);
    }
    lily_cuda_free(dX), lily_cuda_free(dY);
    lily_cuda_dmat_free(&dW);
    pt_mat_free(&W);
    free(X), free(Y0), free(ref), free(tmp), free(got);
}

/* lily_cuda_dmat_upload_cat: matrices of the given row counts stacked by rows; one GEMM over the
 * stack and one per view against the CPU matmul of each matrix. */
static void stack_case(lily_dtype dt, const int *rows, int nm, int K, int n) {
    lily_err e;
    char name[160];
    lily_mat ms[4];
    lily_dmat cat, v[4];
    int R = 0;
    for (int i = 0; i < nm; i++)
        ms[i] = pt_mat(dt, rows[i], K), R += rows[i];
    if (pt_ok(lily_cuda_dmat_upload_cat(ms, nm, &cat, v, &e), "upload_cat", &e)) {
        const int ldx = K + 4;
        float *X = malloc((size_t)n * ldx * 4), *ref = malloc((size_t)n * R * 4);
        float *got = malloc((size_t)n * R * 4), *tmp = malloc((size_t)n * R * 4);
        fill_x(X, n, ldx);
        for (int i = 0, r0 = 0; i < nm; r0 += rows[i], i++) {
            lily_cpu_matmul(pt_cpu(), &ms[i], X, n, ldx, tmp, rows[i], NULL);
            for (int t = 0; t < n; t++)
                memcpy(ref + (size_t)t * R + r0, tmp + (size_t)t * rows[i], rows[i] * 4);
        }
        float *dX = pt_dup(X, (size_t)n * ldx), *dY = pt_dalloc((size_t)n * R * 4);
        snprintf(name, sizeof name, "stack of %d %s [%d..] x %d, n=%d: one GEMM", nm, dts[dt],
                 rows[0], K, n);
        if (pt_ok(lily_cuda_gemm(&cat, dX, ldx, n, dY, R, 0, NULL, &e), name, &e)) {
            pt_get(got, dY, (size_t)n * R);
            pt_check(name, got, ref, (size_t)n * R, tol(dt));
        }
        for (int i = 0, r0 = 0; i < nm; r0 += rows[i], i++) { /* each view into its columns */
            snprintf(name, sizeof name, "stack of %d %s, view %d (%d rows)", nm, dts[dt], i,
                     rows[i]);
            pt_ok(lily_cuda_gemm(&v[i], dX, ldx, n, dY + r0, R, 0, NULL, &e), name, &e);
        }
        pt_get(got, dY, (size_t)n * R);
        snprintf(name, sizeof name, "stack of %d %s, the views one GEMM each", nm, dts[dt]);
        pt_check(name, got, ref, (size_t)n * R, tol(dt));
        lily_cuda_free(dX), lily_cuda_free(dY);
        free(X), free(ref), free(got), free(tmp);
        lily_cuda_dmat_free(&cat);
    }
    pt_mat_free(&ms[nm - 1]);
    lily_mat odd = pt_mat(dt, 3, K + 64); /* other columns: refused */
    ms[nm - 1] = odd;
    snprintf(name, sizeof name, "upload_cat refuses %s matrices of different widths", dts[dt]);
    pt_check_true(name, lily_cuda_dmat_upload_cat(ms, nm, &cat, v, &e) == -1);
    pt_mat_free(&odd);
    for (int i = 0; i < nm - 1; i++)
        pt_mat_free(&ms[i]);
}

static void gemm_case(lily_dtype dt, int M, int K, int n, int accumulate) {
    gemm_case_fn(lily_cuda_gemm, "gemm", dt, M, K, n, accumulate);
}

#ifdef LILY_GEMM_HAS_GLU
/* Gated dense pair: silu(G x) * (U x), against two CPU matmuls. */
static void glu_case(lily_dtype dt, int M, int K, int n) {
    lily_err e;
    char name[160];
    int ldx = K + 8, ldy = M + 1;
    lily_mat G = pt_mat(dt, M, K), U = pt_mat(dt, M, K);
    lily_dmat dG, dU;
    if (!pt_ok(lily_cuda_dmat_upload(&G, 1, &dG, &e), "upload", &e) ||
        !pt_ok(lily_cuda_dmat_upload(&U, 1, &dU, &e), "upload", &e))
        return;
    float *X = malloc((size_t)n * ldx * 4), *ref = malloc((size_t)n * ldy * 4);
    float *tg = malloc((size_t)n * M * 4), *tu = malloc((size_t)n * M * 4);
    fill_x(X, n, ldx);
    lily_cpu_matmul(pt_cpu(), &G, X, n, ldx, tg, M, NULL);
    lily_cpu_matmul(pt_cpu(), &U, X, n, ldx, tu, M, NULL);
    for (size_t i = 0; i < (size_t)n * ldy; i++)
        ref[i] = 0;
    for (int t = 0; t < n; t++)
        for (int o = 0; o < M; o++)
            ref[(size_t)t * ldy + o] = silu(tg[(size_t)t * M + o]) * tu[(size_t)t * M + o];
    float *dX = pt_dup(X, (size_t)n * ldx), *dY = pt_dup(ref, (size_t)n * ldy);
    lily_cuda_memset(dY, 0, (size_t)n * ldy * 4, NULL, &e); /* padding columns stay 0 */
    int rc = lily_cuda_gemm_glu(&dG, &dU, dX, ldx, n, dY, ldy, NULL, &e);
    if (!pt_ok(rc, "gemm_glu launch", &e)) return;
    float *got = malloc((size_t)n * ldy * 4);
    pt_get(got, dY, (size_t)n * ldy);
    snprintf(name, sizeof name, "gemm_glu %s G,U[%d x %d] n=%d", dts[dt], M, K, n);
    pt_check(name, got, ref, (size_t)n * ldy, tol(dt));
    lily_cuda_free(dX), lily_cuda_free(dY);
    lily_cuda_dmat_free(&dG), lily_cuda_dmat_free(&dU);
    pt_mat_free(&G), pt_mat_free(&U);
    free(X), free(ref), free(tg), free(tu), free(got);
}
#endif

static int g_gbn = LILY_GEMM_GROUP_BN; /* rows per tile of the grouped cases */
static int make_tiles(const int *counts, int E, int32_t *tiles) {
    return pt_make_tiles(counts, E, g_gbn, tiles);
}

/* Grouped over E experts with the given row counts; grouped row r reads X row gather[r] (random
 * tokens of n) or row r (no gather). glu: gate and up stacks, silu(gate) * up. */
static void grouped_case(lily_dtype dt, int M, int K, int E, const int *counts, int n,
                         int use_gather, int glu) {
#ifndef LILY_GEMM_HAS_GLU /* an older gemm.h (timing baseline): no gated entry points */
    if (glu) return;
#endif
    lily_err e;
    char name[200];
    int R = 0, ntmax = 0;
    for (int x = 0; x < E; x++) {
        R += counts[x];
        ntmax += (counts[x] + LILY_GEMM_GROUP_BN - 1) / LILY_GEMM_GROUP_BN;
    }
    int xrows = use_gather ? n : R, ldx = K + 4, ldy = M + 5;
    lily_mat *G = malloc(sizeof(lily_mat) * E), *U = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++) {
        G[x] = pt_mat(dt, M, K);
        if (glu) U[x] = pt_mat(dt, M, K);
    }
    lily_dmat dG, dU;
    if (!pt_ok(lily_cuda_dmat_upload(G, E, &dG, &e), "upload", &e)) return;
    if (glu && !pt_ok(lily_cuda_dmat_upload(U, E, &dU, &e), "upload", &e)) return;
    float *X = malloc((size_t)xrows * ldx * 4);
    fill_x(X, xrows, ldx);
    int32_t *gather = malloc((size_t)(R + 1) * 4);
    for (int r = 0; r < R; r++)
        gather[r] = use_gather ? (int32_t)(pt_rnd() % n) : r;
    int32_t *tiles = malloc((size_t)(ntmax + 3) * 12);
    int nt = make_tiles(counts, E, tiles);
    size_t ny = (size_t)(R > 0 ? R : 1) * ldy;
    float *ref = calloc(ny, 4), *got = malloc(ny * 4);
    float *xg = malloc((size_t)(R + 1) * K * 4), *tg = malloc((size_t)(R + 1) * M * 4);
    float *tu = malloc((size_t)(R + 1) * M * 4);
    for (int x = 0, r0 = 0; x < E; r0 += counts[x], x++) {
        if (!counts[x]) continue;
        for (int i = 0; i < counts[x]; i++)
            memcpy(xg + (size_t)i * K, X + (size_t)gather[r0 + i] * ldx, (size_t)K * 4);
        lily_cpu_matmul(pt_cpu(), &G[x], xg, counts[x], K, tg, M, NULL);
        if (glu) lily_cpu_matmul(pt_cpu(), &U[x], xg, counts[x], K, tu, M, NULL);
        for (int i = 0; i < counts[x]; i++)
            for (int o = 0; o < M; o++) {
                float g = tg[(size_t)i * M + o];
                ref[(size_t)(r0 + i) * ldy + o] = glu ? silu(g) * tu[(size_t)i * M + o] : g;
            }
    }
    /* max_tiles above the valid count: the extra tiles must exit on *d_ntiles */
    int max_tiles = ntmax + 3;
    int32_t *dgather = pt_idup(gather, (size_t)R + 1), *dtiles = pt_idup(tiles, (size_t)3 * nt + 1);
    int32_t *dnt = pt_idup(&nt, 1);
    float *dX = pt_dup(X, (size_t)xrows * ldx), *dY = pt_dup(ref, ny);
    lily_cuda_memset(dY, 0, ny * 4, NULL, &e);
    const int32_t *gp = use_gather ? dgather : NULL;
#ifdef LILY_GEMM_HAS_GLU
    int rc = glu ? lily_cuda_gemm_grouped_glu(&dG, &dU, dX, ldx, xrows, gp, dtiles, dnt, max_tiles,
                                              dY, ldy, NULL, &e)
                 : lily_cuda_gemm_grouped(&dG, dX, ldx, xrows, gp, dtiles, dnt, max_tiles, g_gbn,
                                          dY, ldy, NULL, &e);
#else
    int rc = lily_cuda_gemm_grouped(&dG, dX, ldx, xrows, gp, dtiles, dnt, max_tiles, g_gbn, dY, ldy,
                                    NULL, &e);
#endif
    if (pt_ok(rc, "grouped launch", &e)) {
        pt_get(got, dY, ny);
        int k = snprintf(name, sizeof name, "grouped%s %s W[%d x %d] x %d rows {",
                         glu ? "_glu" : "", dts[dt], M, K, E);
        for (int x = 0; x < E && k < 150; x++)
            k += snprintf(name + k, sizeof name - k, "%s%d", x ? "," : "", counts[x]);
        snprintf(name + k, sizeof name - k, "}%s%s", use_gather ? " gather" : "", g_tag);
        pt_check(name, got, ref, ny, tol(dt));
    }
    lily_cuda_free(dX), lily_cuda_free(dY), lily_cuda_free(dgather), lily_cuda_free(dtiles);
    lily_cuda_free(dnt);
    lily_cuda_dmat_free(&dG);
    if (glu) lily_cuda_dmat_free(&dU);
    for (int x = 0; x < E; x++) {
        pt_mat_free(&G[x]);
        if (glu) pt_mat_free(&U[x]);
    }
    free(G), free(U), free(X), free(gather), free(tiles), free(ref), free(got), free(xg);
    free(tg), free(tu);
}

/* ---- timing mode (LILY_CUDA_TIME=1) ---- */

typedef pt_time_fn time_fn;

static float time_median(time_fn f, void *ctx) {
    return pt_time_median(f, ctx, 0);
}

typedef struct {
    lily_dmat *W, *U;
    float *X, *Y;
    int ldx, n, ldy, acc, nx;
    int32_t *gather, *tiles, *nt;
    int max_tiles;
} tctx;

static int t_dense(void *p) {
    tctx *c = p;
    lily_err e;
    return lily_cuda_gemm(c->W, c->X, c->ldx, c->n, c->Y, c->ldy, c->acc, NULL, &e);
}
static int t_grouped(void *p) {
    tctx *c = p;
    lily_err e;
    return lily_cuda_gemm_grouped(c->W, c->X, c->ldx, c->nx, c->gather, c->tiles, c->nt,
                                  c->max_tiles, LILY_GEMM_GROUP_BN, c->Y, c->ldy, NULL, &e);
}

static lily_dmat up_q4(int M, int K, int E) {
    lily_err e;
    lily_mat *m = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        m[x] = pt_mat(LILY_DT_Q4, M, K);
    lily_dmat d;
    if (lily_cuda_dmat_upload(m, E, &d, &e)) {
        printf("FAIL upload: %s\n", e.msg);
        exit(1);
    }
    for (int x = 0; x < E; x++)
        pt_mat_free(&m[x]);
    free(m);
    return d;
}

static void report(const char *what, float us, double flop) {
    printf("time %-52s %9.1f us  %6.1f TFLOP/s\n", what, us, flop / us * 1e-6);
}

/* Expert routing of n tokens x top-8 over 256 experts, skewed towards low ids (uneven counts):
 * fills counts, gather (grouped row -> token) and tiles; returns the tile count. */
static int route(int n, int *counts, int32_t *gather, int32_t *tiles) {
    const int E = 256, k = 8;
    int *sel = malloc(sizeof(int) * n * k);
    memset(counts, 0, sizeof(int) * E);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int x, dup;
            do {
                double u = (pt_rnd() & 0xffffff) / 16777216.0;
                x = (int)(E * u * u * u);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= sel[t * k + i] == x;
            } while (dup);
            sel[t * k + j] = x;
            counts[x]++;
        }
    for (int x = 0, p = 0; x < E; x++)
        for (int f = 0; f < n * k; f++)
            if (sel[f] == x) gather[p++] = f / k;
    free(sel);
    int nt = make_tiles(counts, E, tiles), zero = 0, mx = 0;
    for (int x = 0; x < E; x++)
        zero += counts[x] == 0, mx = counts[x] > mx ? counts[x] : mx;
    printf("routing n=%d: %d rows over %d experts, %d empty, max %d rows, %d tiles\n", n, n * k, E,
           zero, mx, nt);
    return nt;
}

/* The gemm_q4.h kernel and the automatic choice on one call. */
static void time_both(const char *what, time_fn f, tctx *c, double flop) {
    static const char *kn[2] = {"auto", "q4"};
    static const int sel[2] = {LILY_GEMM_AUTO, LILY_GEMM_Q4};
    for (int k = 1; k >= 0; k--) {
        char name[200];
        snprintf(name, sizeof name, "%s %s", what, kn[k]);
        lily_cuda_gemm_select(sel[k]);
        report(name, time_median(f, c), flop);
    }
    lily_cuda_gemm_select(LILY_GEMM_AUTO);
}

static void timing(void) {
    const int H = 2048, E = 256, k = 8, I = 512, nmax = 4096;
    const int ns[3] = {512, 2048, 4096};
    float *X = malloc((size_t)nmax * 4096 * 4);
    pt_fill(X, (size_t)nmax * 4096, 1.0f);
    float *dX = pt_dup(X, (size_t)nmax * 4096);
    float *dY = pt_dalloc((size_t)nmax * k * H * 4), *dY2 = pt_dalloc((size_t)nmax * k * H * 4);
    lily_err e;
    if (lily_cuda_d2d(dY2, dX, (size_t)nmax * 4096 * 4, NULL, &e)) { /* X of the down GEMMs */
        printf("FAIL copy: %s\n", e.msg);
        exit(1);
    }
    tctx c = {0};
    c.Y = dY;
    /* the 35B-A3B prefill GEMMs (backend.cu, moe.cu) */
    const struct {
        int M, K, acc;
        const char *what;
    } dense[] = {{8192, H, 0, "GDN qkv, attn q+gate"},
                 {4096, H, 0, "GDN z"},
                 {32, H, 0, "GDN b, a"},
                 {2048, 4096, 1, "GDN out, attn o (accum)"},
                 {512, H, 0, "attn k, v; shared gate, up"},
                 {256, H, 0, "router"},
                 {2048, I, 0, "shared expert down"}};
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
        lily_dmat W = up_q4(dense[i].M, dense[i].K, 1);
        c.W = &W, c.X = dX, c.ldx = dense[i].K, c.ldy = dense[i].M, c.acc = dense[i].acc;
        lily_cuda_gemm_select(LILY_GEMM_Q4);
        for (int j = 0; j < 2; j++) { /* every tile and split of the gemm_q4.h kernel */
            static const char *tn[3] = {"128x128", "128x64", "128x32"};
            c.n = ns[j];
            for (int tile = 0; tile < 3; tile++)
                for (int split = 1; split <= 4; split *= 2) {
                    char name[160];
                    lily_cuda_gemm_q4_force(tile, split);
                    snprintf(name, sizeof name, "sweep q4 %d x %d n=%d tile %s split %d",
                             dense[i].M, dense[i].K, ns[j], tn[tile], split);
                    report(name, time_median(t_dense, &c), 2.0 * dense[i].M * dense[i].K * ns[j]);
                }
            lily_cuda_gemm_q4_force(LILY_Q4T_AUTO, 0);
        }
        lily_cuda_gemm_select(LILY_GEMM_AUTO);
        for (int j = 0; j < 3; j++) {
            char name[120];
            c.n = ns[j];
            snprintf(name, sizeof name, "dense q4 %d x %d n=%d (%s)", dense[i].M, dense[i].K, ns[j],
                     dense[i].what);
            time_both(name, t_dense, &c, 2.0 * dense[i].M * dense[i].K * ns[j]);
        }
        lily_cuda_dmat_free(&W);
    }
    lily_dmat Gs = up_q4(I, H, E), Ds = up_q4(H, I, E);
    int counts[256];
    int32_t *gather = malloc(sizeof(int32_t) * nmax * k), *tiles = malloc(12 * (nmax * k / 32 + E));
    for (int j = 0; j < 3; j++) {
        const int n = ns[j];
        int nt = route(n, counts, gather, tiles);
        int32_t *dgather = pt_idup(gather, (size_t)n * k);
        c.gather = dgather, c.tiles = pt_idup(tiles, (size_t)3 * nt);
        c.nt = pt_idup(&nt, 1);
        c.max_tiles = n * k / LILY_GEMM_GROUP_BN + E;
        const double f = 2.0 * n * k * I * H;
        char name[120];
        c.W = &Gs, c.X = dX, c.ldx = H, c.Y = dY, c.ldy = I, c.nx = n;
        snprintf(name, sizeof name, "grouped q4 gate/up 512 x 2048 x 256 n=%d", n);
        time_both(name, t_grouped, &c, f);
        lily_cuda_gemm_select(LILY_GEMM_Q4);
        lily_cuda_gemm_q4_force(LILY_Q4T_GROUPED128, 0);
        snprintf(name, sizeof name, "grouped q4 gate/up 512 x 2048 x 256 n=%d q4 128-row tile", n);
        report(name, time_median(t_grouped, &c), f);
        lily_cuda_gemm_q4_force(LILY_Q4T_AUTO, 0);
        lily_cuda_gemm_select(LILY_GEMM_AUTO);
        c.W = &Ds, c.X = dY2, c.ldx = I, c.Y = dY, c.ldy = H, c.gather = NULL, c.nx = n * k;
        snprintf(name, sizeof name, "grouped q4 down 2048 x 512 x 256 n=%d", n);
        time_both(name, t_grouped, &c, f);
        lily_cuda_gemm_select(LILY_GEMM_Q4);
        lily_cuda_gemm_q4_force(LILY_Q4T_GROUPED128, 0);
        snprintf(name, sizeof name, "grouped q4 down 2048 x 512 x 256 n=%d q4 128-row tile", n);
        report(name, time_median(t_grouped, &c), f);
        lily_cuda_gemm_q4_force(LILY_Q4T_AUTO, 0);
        lily_cuda_gemm_select(LILY_GEMM_AUTO);
        lily_cuda_free(c.tiles), lily_cuda_free(c.nt), lily_cuda_free(dgather);
    }
    lily_cuda_dmat_free(&Gs), lily_cuda_dmat_free(&Ds);
    lily_cuda_free(dX), lily_cuda_free(dY), lily_cuda_free(dY2);
    free(X), free(gather), free(tiles);
}

/* Every dense Q4 tile shape and split-K factor on shapes with partial row and token tiles, then
 * back to the automatic choice. */
static void q4_shapes(void) {
    static const char *tn[3] = {"128x128", "128x64", "128x32"};
    lily_cuda_gemm_select(LILY_GEMM_Q4);
    for (int tile = 0; tile < 3; tile++)
        for (int split = 1; split <= 8; split *= 2) {
            snprintf(g_tag, sizeof g_tag, " [tile %s split %d]", tn[tile], split);
            lily_cuda_gemm_q4_force(tile, split);
            gemm_case(LILY_DT_Q4, 300, 1024, 133, split == 2);
            gemm_case(LILY_DT_Q4, 129, 576, 7, split != 2);
            if (split == 4) gemm_case(LILY_DT_Q4, 64, 192, 40, 0); /* 3 k-steps over 4 splits */
        }
    lily_cuda_gemm_q4_force(LILY_Q4T_AUTO, 0);
    g_tag[0] = 0;
    if (g_san) return;
    /* the automatic choice at prefill-like shapes (split-K where the grid is small) */
    gemm_case(LILY_DT_Q4, 512, 2048, 512, 0);
    gemm_case(LILY_DT_Q4, 2048, 4096, 300, 1);
    gemm_case(LILY_DT_Q4, 64, 2048, 257, 0);
    gemm_case(LILY_DT_Q4, 4096, 2048, 1030, 0);
    /* the same with the automatic kernel choice (gemm.cu's kernel for the big grids) */
    lily_cuda_gemm_select(LILY_GEMM_AUTO);
    snprintf(g_tag, sizeof g_tag, " [auto]");
    gemm_case(LILY_DT_Q4, 2048, 4096, 300, 1);
    gemm_case(LILY_DT_Q4, 4096, 2048, 1030, 0);
    g_tag[0] = 0;
}

/* The wgmma kernel (gemm_wg.h), in the mode set (exact, one pass): directly on shapes with partial
 * row and token blocks and one k-step, then through lily_cuda_gemm with LILY_GEMM_WG at prefill
 * shapes. */
static void wg_case(int M, int K, int n, int accumulate) {
    gemm_case_fn(lily_cuda_gemm_wg, "gemm_wg", LILY_DT_Q4, M, K, n, accumulate);
}

static void wg_shapes(void) {
    wg_case(64, 64, 8, 0);     /* one k-step, partial blocks both ways */
    wg_case(130, 192, 129, 1); /* 2 row blocks, 2 token blocks, 3 k-steps, accumulate */
    wg_case(300, 1024, 133, 0);
    wg_case(1, 320, 300, 0);
    /* 16-byte aligned rows of Y (ldy 304): the vector stores, and the last row block's edge
     * (rows 300, 301) in scalar stores */
    g_ldy_pad = 2;
    wg_case(302, 192, 129, 1);
    wg_case(302, 1024, 133, 0);
    g_ldy_pad = 3;
    /* split-K forced (the automatic choice splits the small grids above already): 3 splits of
     * one k-step each, uneven ranges, 8 splits with accumulate */
    static const int fs[3] = {3, 5, 8};
    for (int i = 0; i < 3; i++) {
        lily_cuda_gemm_wg_force_split(fs[i]);
        snprintf(g_tag, sizeof g_tag, " [split %d]", fs[i]);
        wg_case(130, 192, 129, 1);
        wg_case(300, 1024, 133, 0);
        if (!g_san) wg_case(2048, 4096, 513, 1);
    }
    lily_cuda_gemm_wg_force_split(0);
    g_tag[0] = 0;
    if (!g_san) {
        wg_case(2048, 4096, 513, 1);
        lily_cuda_gemm_select(LILY_GEMM_WG);
        snprintf(g_tag, sizeof g_tag, " [wg]");
        gemm_case(LILY_DT_Q4, 8192, 2048, 1030, 0);
        gemm_case(LILY_DT_Q4, 2048, 4096, 700, 1);
        gemm_case(LILY_DT_Q8, 256, 2048, 300, 0); /* not Q4: the other kernels */
        lily_cuda_gemm_select(LILY_GEMM_AUTO);
        g_tag[0] = 0;
    }
    /* grouped, 64-row tiles: experts of 0 rows, of 1, of more than one tile; with and without
     * a gather; the gated form is not the wgmma kernel's (gemm.cu runs it) */
    lily_cuda_gemm_select(LILY_GEMM_WG);
    g_gbn = 64;
    snprintf(g_tag, sizeof g_tag, " [wg]");
    const int c1[5] = {0, 37, 1, 130, 0}, c2[3] = {0, 77, 0}, c3[4] = {65, 0, 5, 64};
    grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 60, 1, 0);
    grouped_case(LILY_DT_Q4, 300, 576, 5, c1, 0, 0, 0);
    grouped_case(LILY_DT_Q4, 130, 128, 4, c3, 50, 1, 0);
    if (!g_san) grouped_case(LILY_DT_Q4, 2048, 512, 3, c2, 77, 0, 0);
    g_gbn = LILY_GEMM_GROUP_BN;
    lily_cuda_gemm_select(LILY_GEMM_AUTO);
    g_tag[0] = 0;
}

static void all_cases(void) {
    q4_shapes();
    gemm_case(LILY_DT_Q4, 1000, 2048, 65, 0);
    if (!g_san) gemm_case(LILY_DT_Q4, 8192, 2048, 200, 0);
    gemm_case(LILY_DT_Q4, 37, 4096, 64, 1);
    gemm_case(LILY_DT_Q4, 2048, 512, 1, 1);
    gemm_case(LILY_DT_Q4, 129, 64, 63, 0);
    if (!g_san) gemm_case(LILY_DT_Q4, 4100, 1024, 130, 1);
    gemm_case(LILY_DT_Q8, 256, 2048, 77, 0); /* split-K (small grids) */
    gemm_case(LILY_DT_Q8, 1, 2048, 130, 0);
    gemm_case(LILY_DT_Q8, 256, 2048, 256, 1); /* the router at a 256-token chunk */
    if (!g_san) gemm_case(LILY_DT_Q8, 5000, 256, 70, 1);
    gemm_case(LILY_DT_BF16, 300, 1024, 64, 0);
    gemm_case(LILY_DT_BF16, 127, 192, 3, 1);
    if (!g_san) gemm_case(LILY_DT_BF16, 4097, 320, 66, 0);
    gemm_case(LILY_DT_F32, 200, 320, 100, 0);
#ifdef LILY_GEMM_HAS_GLU
    glu_case(LILY_DT_Q4, 512, 2048, 77);
    glu_case(LILY_DT_Q4, 100, 192, 3);
    glu_case(LILY_DT_BF16, 300, 256, 40);
    glu_case(LILY_DT_Q8, 130, 512, 17);
#endif
    {
        const int c1[5] = {0, 37, 1, 100, 0};
        grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 60, 1, 0);
        grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 0, 0, 0);
        grouped_case(LILY_DT_Q4, 300, 256, 5, c1, 60, 1, 1);
        const int c2[3] = {0, 77, 0}; /* one expert gets all rows */
        grouped_case(LILY_DT_Q4, 2048, 128, 3, c2, 77, 1, 0);
        grouped_case(LILY_DT_Q4, 130, 576, 3, c2, 77, 1, 1);
        const int c3[4] = {33, 0, 5, 64};
        grouped_case(LILY_DT_Q8, 96, 320, 4, c3, 50, 1, 0);
        grouped_case(LILY_DT_BF16, 257, 192, 4, c3, 50, 1, 0);
        grouped_case(LILY_DT_BF16, 70, 128, 4, c3, 50, 1, 1);
        grouped_case(LILY_DT_Q8, 64, 256, 4, c3, 50, 0, 1);
    }
    /* the grouped gemm_q4.h kernel, 256- and 128-row tiles (measured alternatives) */
    lily_cuda_gemm_select(LILY_GEMM_Q4);
    for (int v = 0; v < 2; v++) {
        lily_cuda_gemm_q4_force(v ? LILY_Q4T_GROUPED128 : LILY_Q4T_AUTO, 0);
        snprintf(g_tag, sizeof g_tag, " [q4 kernel, %d rows]", v ? 128 : 256);
        const int c1[5] = {0, 37, 1, 100, 0}, c2[3] = {0, 77, 0};
        grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 60, 1, 0);
        grouped_case(LILY_DT_Q4, 2048, 128, 3, c2, 77, 1, 0);
        grouped_case(LILY_DT_Q4, 300, 576, 5, c1, 0, 0, 0);
    }
    lily_cuda_gemm_q4_force(LILY_Q4T_AUTO, 0);
    lily_cuda_gemm_select(LILY_GEMM_AUTO);
    /* gemm.cu's split-K, forced (whole chunks of 8 k-steps: 17 k-steps make 3 ranges) */
    for (int split = 2; split <= 4; split++) {
        lily_cuda_gemm_force_split(split);
        snprintf(g_tag, sizeof g_tag, " [gemm.cu kernel where it runs, split %d]", split);
        gemm_case(LILY_DT_Q4, 1000, 2048, 65, 0);
        gemm_case(LILY_DT_Q8, 130, 1088, 40, split == 3);
        gemm_case(LILY_DT_BF16, 127, 1024, 20, split != 3);
        gemm_case(LILY_DT_Q8, 1, 2048, 257, 0);
    }
    lily_cuda_gemm_force_split(0);
    lily_cuda_gemm_select(LILY_GEMM_AUTO);
    g_tag[0] = 0;
}

/* Structured inputs that show where each output of the wgmma kernel takes its operands from.
 * W[o][k] = 1 where k = k0 + o % K (codes 0/1, scale 1, bias 0), X[t][k] = 256 t
 * + k + 1, so Y[t][o] = 256 t + k0 + (o % K) + 1 names the token and the column it multiplied;
 * the mismatches print decoded. */
static void wg_probe(int M, int K, int n, int k0) {
    lily_err e;
    lily_mat W = pt_mat(LILY_DT_Q4, M, K);
    memset((void *)W.w, 0, (size_t)M * K / 2);
    for (int o = 0; o < M; o++) {
        const int k = (k0 + o) % K;
        ((uint8_t *)W.w)[(size_t)o * K / 2 + k / 2] |= (uint8_t)(1u << (4 * (k & 1)));
    }
    for (size_t gi = 0; gi < (size_t)M * K / 64; gi++) {
        ((uint16_t *)W.scales)[gi] = lily_f32_to_bf16(1.f);
        ((uint16_t *)W.biases)[gi] = 0;
    }
    lily_dmat dW;
    if (!pt_ok(lily_cuda_dmat_upload(&W, 1, &dW, &e), "upload", &e)) return;
    float *X = malloc((size_t)n * K * 4), *Y = malloc((size_t)n * M * 4);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++)
            X[(size_t)t * K + k] = (float)(256 * t + k + 1);
    float *dX = pt_dup(X, (size_t)n * K), *dY = pt_dup(Y, (size_t)n * M);
    if (pt_ok(lily_cuda_gemm_wg(&dW, dX, K, n, dY, M, 0, NULL, &e), "probe", &e)) {
        pt_get(Y, dY, (size_t)n * M);
        int bad = 0;
        for (int t = 0; t < n; t++)
            for (int o = 0; o < M; o++) {
                const float want = (float)(256 * t + (k0 + o) % K + 1), got = Y[(size_t)t * M + o];
                if (got == want) continue;
                if (bad++ < 40) {
                    const long v = lroundf(got) - 1;
                    printf("probe M=%d K=%d n=%d: t=%d o=%d want k=%d got %.3f (t'=%ld k'=%ld)\n",
                           M, K, n, t, o, (k0 + o) % K, got, v / 256, v % 256);
                }
            }
        char name[96];
        snprintf(name, sizeof name, "gemm_wg operand map W[%d x %d] n=%d (k0 %d): %d wrong", M, K,
                 n, k0, bad);
        pt_check_true(name, bad == 0);
    }
    lily_cuda_free(dX), lily_cuda_free(dY);
    lily_cuda_dmat_free(&dW);
    pt_mat_free(&W);
    free(X), free(Y);
}

/* The operand-map probes at the current loop form and layout; K 256 and 512 reach form 4's
 * TMA copies. */
static void wg_probes(void) {
    wg_probe(64, 64, 8, 0);
    wg_probe(64, 64, 16, 0);
    wg_probe(64, 128, 8, 64);
    wg_probe(256, 64, 8, 0);
    wg_probe(256, 256, 8, 0);
    wg_probe(64, 512, 16, 100);
}

/* gemm_exact of the GEMMs that follow (lily_cuda_prec; attention stays exact) */
static void set_gemm_exact(int on) {
    lily_cuda_prec p = {on, 1};
    lily_cuda_prec_set(p);
}

int main(void) {
    pt_need_gpu();
    g_san = getenv("LILY_CUDA_SAN") && getenv("LILY_CUDA_SAN")[0] == '1';
    for (int exact = 1; exact >= 0; exact--) {
        set_gemm_exact(exact);
        g_tol = exact ? 5e-4 : 1e-2;
        printf("== %s GEMMs\n", exact ? "exact" : "fast (bf16)");
        all_cases();
    }
    /* exact: rows from 1e-6 to 1e6 in one X (the per-row power-of-two scale keeps fp16 finite) */
    set_gemm_exact(1);
    g_tol = 5e-4;
    g_xscale_spread = 6.f;
    snprintf(g_tag, sizeof g_tag, " [rows 1e-6..1e6]");
    gemm_case(LILY_DT_Q4, 300, 1024, 133, 0);
    gemm_case(LILY_DT_Q8, 256, 2048, 77, 0);
    glu_case(LILY_DT_Q4, 100, 192, 26);
    {
        const int c1[5] = {0, 37, 1, 100, 0};
        grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 60, 1, 0);
    }
    g_xscale_spread = 0;
    /* 64-row tiles of the grouped GEMM, exact and fast */
    for (int exact = 1; exact >= 0; exact--) {
        set_gemm_exact(exact);
        g_gbn = 64;
        g_tol = exact ? 5e-4 : 1e-2;
        snprintf(g_tag, sizeof g_tag, " [64-row tiles%s]", exact ? "" : ", fast");
        const int c1[5] = {0, 37, 1, 130, 0}, c2[3] = {0, 77, 0}, c3[4] = {65, 0, 5, 64};
        grouped_case(LILY_DT_Q4, 200, 512, 5, c1, 60, 1, 0);
        grouped_case(LILY_DT_Q4, 2048, 128, 3, c2, 77, 1, 0);
        grouped_case(LILY_DT_Q4, 300, 576, 5, c1, 0, 0, 0);
        grouped_case(LILY_DT_Q8, 96, 320, 4, c3, 50, 1, 0);
        grouped_case(LILY_DT_BF16, 257, 192, 4, c3, 50, 1, 0);
    }
    lily_err eg;
    _Alignas(16) float dg[8];
    lily_dmat gg = {0};
    gg.n_mats = 1, gg.rows = 64, gg.cols = 64;
    pt_check_true(
        "gemm_grouped refuses tiles of 48 rows",
        lily_cuda_gemm_grouped(&gg, dg, 8, 1, NULL, NULL, NULL, 1, 48, dg, 8, NULL, &eg) == -1);
    g_gbn = LILY_GEMM_GROUP_BN;
    g_tag[0] = 0;
    set_gemm_exact(1);
    lily_err e;
    float dummy[8];
    lily_dmat bad = {0};
    bad.n_mats = 2;
    pt_check_true("gemm rejects a stack of matrices",
                  lily_cuda_gemm(&bad, dummy, 8, 1, dummy, 8, 0, NULL, &e) == -1);
#ifdef LILY_GEMM_HAS_GLU
    lily_dmat g1 = {0}, u1 = {0};
    g1.n_mats = u1.n_mats = 1, g1.rows = 64, u1.rows = 32, g1.cols = u1.cols = 64;
    pt_check_true("gemm_glu rejects gate and up of different shapes",
                  lily_cuda_gemm_glu(&g1, &u1, dummy, 8, 1, dummy, 8, NULL, &e) == -1);
#endif
    const int sr[4] = {37, 256, 5, 64}, sr2[2] = {256, 1};
    set_gemm_exact(1);
    g_tol = 5e-4;
    stack_case(LILY_DT_Q4, sr, 4, 576, 70);
    stack_case(LILY_DT_Q8, sr2, 2, 2048, 33);
    stack_case(LILY_DT_BF16, sr, 3, 128, 9);
    stack_case(LILY_DT_F32, sr2, 2, 64, 5);
    /* the wgmma kernel (TMA copies where they apply: K a multiple of 256, dense; cp.async
     * otherwise) last: a copy that never lands traps and leaves the context unusable, which must
     * not take the other cases' verdicts with it */
    wg_probes();
    for (int exact = 1; exact >= 0; exact--) {
        set_gemm_exact(exact);
        g_tol = exact ? 5e-4 : 1e-2;
        printf("== wgmma GEMM (%s)\n", exact ? "exact" : "one pass");
        wg_shapes();
    }
    set_gemm_exact(1);
    const char *tm = getenv("LILY_CUDA_TIME");
    if (tm && tm[0] == '1') timing();
    return pt_finish();
}
#endif
