/* The skinny grouped Q4 GEMM (backend/cuda/gemm_skinny.h: expert tiles of <= 16 rows, reached
 * through lily_cuda_gemm_grouped with tile_rows = 16) against lily_cpu_matmul on the same random
 * Q4 matrices: uneven expert loads (experts of 0 rows, 1, odd counts, exactly 16, 17, and one of
 * several 16-row tiles), with and without the row gather, K = 2048, 512, an odd number of groups
 * (576, 192) and a single group (64), M = 512, 2048 and row counts that are not a multiple of the
 * 128-row blocks or of the 16-row slabs (200, 130, 72); X rows of very different magnitudes
 * (1e-6 .. 1e6: the split's row scale); more tile rows in the grid than valid tiles (the extra
 * blocks must leave). Every case runs for both A operand forms (fp16 subnormal codes, and the
 * subtraction form) and with lily_cuda_prec.gemm_exact 1 and 0 (the kernel splits X itself when the
 * GEMMs are not exact). Y is filled with a sentinel first: every valid element must be written,
 * and the padding columns of Y (ldy > M) must keep it.
 *
 * Bound: per grouped row (token), max_o |y_gpu - y_cpu| <= 1e-5 * max_o |y_cpu|. The device result
 * carries the activation split (x = (hi + lo) 2^e, two fp16: ~2^-22 relative per element), the
 * fp32 accumulations of the tensor cores (each mma rounds or truncates once at ~2^-23 of the
 * largest partial sum of its group) and the fp32 FMAs of the group sums; the CPU reference rounds
 * its own fp32 sums. With random weights |y| ~ sqrt(K) |w| |x|, these give ~1e-7 .. 1e-6 of the
 * row's largest output; 1e-5 leaves a 10x margin while any slip of the fragment order, a missing
 * lo plane (~2^-12 per element) or a wrong group scale (~1 / sqrt(K / 64)) is far above it. With
 * gemm_exact 0 the kernel multiplies the hi plane alone (one product per weight, the activations
 * as fp16: ~2^-11 relative per element, ~3e-4 of the row's largest output): bound 3e-3.
 *
 * LILY_CUDA_SAN=1: a smaller case list for compute-sanitizer. LILY_CUDA_TIME=1 also times the
 * 35B-A3B expert GEMMs (256 experts, top-8; gate/up 512 x 2048 and down 2048 x 512) for chunks of
 * 64 .. 512 tokens: the skinny kernel (both A forms) against the 32-row tiles of gemm.cu, and
 * the default form with one-pass GEMMs (variant 8: the hi plane alone).
 * LILY_CUDA_TIME=only: the timing without the parity cases; LILY_SKINNY_TIME_N (64, 128, 256,
 * 512) and LILY_SKINNY_TIME_V (0 = 32-row tiles .. 8) pick one chunk size and one variant. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/gemm_split.h"
#include "parity_util.h"

static int g_san;
static float g_spread; /* > 0: X row t scaled by 10^(spread * (t % 13 - 6) / 6) */
static char g_tag[80];
static const float kSentinel = -777.0f;

static void fill_x(float *X, int rows, int ld) {
    pt_fill(X, (size_t)rows * ld, 2.0f);
    for (size_t i = 0; i < (size_t)rows * ld; i++)
        if (X[i] == 0.f) X[i] = 0.5f; /* never zeros */
    if (g_spread <= 0) return;
    for (int t = 0; t < rows; t++) {
        float f = powf(10.f, g_spread * (float)(t % 13 - 6) / 6.f);
        for (int c = 0; c < ld; c++)
            X[(size_t)t * ld + c] *= f;
    }
}

/* Experts of the given row counts, M x K Q4 each; grouped row r reads X row gather[r] (random
 * tokens of n) or row r. */
static void grouped_case(int M, int K, int E, const int *counts, int n, int use_gather) {
    lily_err e;
    char name[240];
    int R = 0, ntmax = 0;
    for (int x = 0; x < E; x++)
        R += counts[x], ntmax += (counts[x] + 15) / 16;
    const int xrows = use_gather ? n : R, ldx = K + 4, ldy = M + 3;
    lily_mat *G = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        G[x] = pt_mat(LILY_DT_Q4, M, K);
    lily_dmat dG;
    if (!pt_ok(lily_cuda_dmat_upload(G, E, &dG, &e), "upload", &e)) return;
    float *X = malloc((size_t)xrows * ldx * 4);
    fill_x(X, xrows, ldx);
    int32_t *gather = malloc((size_t)(R + 1) * 4), *tiles = malloc((size_t)(ntmax + 1) * 12);
    for (int r = 0; r < R; r++)
        gather[r] = use_gather ? (int32_t)(pt_rnd() % n) : r;
    const int nt = pt_make_tiles(counts, E, LILY_GEMM_SKINNY_BN, tiles);
    const size_t ny = (size_t)(R > 0 ? R : 1) * ldy;
    float *ref = malloc(ny * 4), *got = malloc(ny * 4);
    float *xg = malloc((size_t)(R + 1) * K * 4), *tg = malloc((size_t)(R + 1) * M * 4);
    for (size_t i = 0; i < ny; i++)
        ref[i] = kSentinel;
    for (int x = 0, r0 = 0; x < E; r0 += counts[x], x++) {
        if (!counts[x]) continue;
        for (int i = 0; i < counts[x]; i++)
            memcpy(xg + (size_t)i * K, X + (size_t)gather[r0 + i] * ldx, (size_t)K * 4);
        lily_cpu_matmul(pt_cpu(), &G[x], xg, counts[x], K, tg, M, NULL);
        for (int i = 0; i < counts[x]; i++)
            memcpy(ref + (size_t)(r0 + i) * ldy, tg + (size_t)i * M, (size_t)M * 4);
    }
    int32_t *dgather = pt_idup(gather, (size_t)R + 1), *dtiles = pt_idup(tiles, (size_t)3 * nt + 1);
    int32_t *dnt = pt_idup(&nt, 1);
    float *dX = pt_dup(X, (size_t)xrows * ldx);
    for (size_t i = 0; i < ny; i++)
        got[i] = kSentinel;
    float *dY = pt_dup(got, ny);
    /* max_tiles above the valid count: the extra tiles must exit on *d_ntiles */
    int rc = lily_cuda_gemm_grouped(&dG, dX, ldx, xrows, use_gather ? dgather : NULL, dtiles, dnt,
                                    nt + 5, LILY_GEMM_SKINNY_BN, dY, ldy, NULL, &e);
    if (pt_ok(rc, "skinny grouped launch", &e)) {
        pt_get(got, dY, ny);
        double worst = 0;
        int bad = 0, pad = 0;
        for (int r = 0; r < R; r++) {
            double mx = 0, d = 0;
            for (int o = 0; o < M; o++) {
                const float g = got[(size_t)r * ldy + o], f = ref[(size_t)r * ldy + o];
                if (!isfinite(g) || g == kSentinel) bad++;
                mx = fmax(mx, fabs(f));
                d = fmax(d, fabs((double)g - f));
            }
            for (int o = M; o < ldy; o++)
                pad += got[(size_t)r * ldy + o] != kSentinel;
            const double rel = mx > 0 ? d / mx : d;
            if (rel > worst) worst = rel;
        }
        const double tol = lily_cuda_gemm_exact() ? 1e-5 : 3e-3;
        const int ok = !bad && !pad && worst <= tol;
        if (ok)
            pt_pass++;
        else
            pt_fail++;
        int k = snprintf(name, sizeof name, "skinny W[%d x %d] x %d rows {", M, K, E);
        for (int x = 0; x < E && k < 150; x++)
            k += snprintf(name + k, sizeof name - k, "%s%d", x ? "," : "", counts[x]);
        snprintf(name + k, sizeof name - k, "}%s%s", use_gather ? " gather" : "", g_tag);
        printf("%s %s: worst row rel %.3g (tol %.0e), %d unwritten/non-finite, %d padding "
               "written\n",
               ok ? "ok  " : "FAIL", name, worst, tol, bad, pad);
    }
    lily_cuda_free(dX), lily_cuda_free(dY), lily_cuda_free(dgather), lily_cuda_free(dtiles);
    lily_cuda_free(dnt);
    lily_cuda_dmat_free(&dG);
    for (int x = 0; x < E; x++)
        pt_mat_free(&G[x]);
    free(G), free(X), free(gather), free(tiles), free(ref), free(got), free(xg), free(tg);
}

/* The pair launch (gate and up in one grid) against the two single launches, which the cases
 * above check against the CPU: the same bits, every row of both outputs. */
static void pair_case(int M, int K, int E, const int *counts, int n) {
    lily_err e;
    int R = 0, ntmax = 0;
    for (int x = 0; x < E; x++)
        R += counts[x], ntmax += (counts[x] + 15) / 16;
    const int ldx = K + 4, ldy = M + 3;
    lily_mat *G = malloc(sizeof(lily_mat) * E), *U = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        G[x] = pt_mat(LILY_DT_Q4, M, K), U[x] = pt_mat(LILY_DT_Q4, M, K);
    lily_dmat dG, dU;
    if (!pt_ok(lily_cuda_dmat_upload(G, E, &dG, &e), "upload", &e) ||
        !pt_ok(lily_cuda_dmat_upload(U, E, &dU, &e), "upload", &e))
        return;
    float *X = malloc((size_t)n * ldx * 4);
    fill_x(X, n, ldx);
    int32_t *gather = malloc((size_t)(R + 1) * 4), *tiles = malloc((size_t)(ntmax + 1) * 12);
    for (int r = 0; r < R; r++)
        gather[r] = (int32_t)(pt_rnd() % n);
    const int nt = pt_make_tiles(counts, E, LILY_GEMM_SKINNY_BN, tiles);
    int32_t *dgather = pt_idup(gather, (size_t)R + 1), *dtiles = pt_idup(tiles, (size_t)3 * nt + 1);
    int32_t *dnt = pt_idup(&nt, 1);
    float *dX = pt_dup(X, (size_t)n * ldx);
    const size_t ny = (size_t)(R > 0 ? R : 1) * ldy;
    float *h[4], *d[4];
    for (int i = 0; i < 4; i++) {
        h[i] = malloc(ny * 4);
        for (size_t j = 0; j < ny; j++)
            h[i][j] = kSentinel;
        d[i] = pt_dup(h[i], ny);
    }
    int rc = lily_cuda_gemm_skinny_grouped(&dG, dX, ldx, n, dgather, dtiles, dnt, nt + 3, d[0], ldy,
                                           NULL, &e) ||
             lily_cuda_gemm_skinny_grouped(&dU, dX, ldx, n, dgather, dtiles, dnt, nt + 3, d[1], ldy,
                                           NULL, &e) ||
             lily_cuda_gemm_skinny_grouped_pair(&dG, &dU, dX, ldx, n, dgather, dtiles, dnt, nt + 3,
                                                d[2], d[3], ldy, NULL, &e);
    if (pt_ok(rc, "skinny pair launch", &e)) {
        for (int i = 0; i < 4; i++)
            pt_get(h[i], d[i], ny);
        char name[240];
        snprintf(name, sizeof name,
                 "skinny pair W[%d x %d] x %d experts, %d rows: same bits as "
                 "two launches%s",
                 M, K, E, R, g_tag);
        pt_check_true(name, !memcmp(h[0], h[2], ny * 4) && !memcmp(h[1], h[3], ny * 4));
    }
    for (int i = 0; i < 4; i++)
        lily_cuda_free(d[i]), free(h[i]);
    lily_cuda_free(dX), lily_cuda_free(dgather), lily_cuda_free(dtiles), lily_cuda_free(dnt);
    lily_cuda_dmat_free(&dG), lily_cuda_dmat_free(&dU);
    for (int x = 0; x < E; x++)
        pt_mat_free(&G[x]), pt_mat_free(&U[x]);
    free(G), free(U), free(X), free(gather), free(tiles);
}

/* n tokens x top-k over E experts, uniformly random distinct picks: the row counts. */
static void route_counts(int n, int E, int k, int *counts) {
    memset(counts, 0, sizeof(int) * E);
    int *sel = malloc(sizeof(int) * k);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int x, dup;
            do {
                x = (int)(pt_rnd() % E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= sel[i] == x;
            } while (dup);
            sel[j] = x;
            counts[x]++;
        }
    free(sel);
}

static void all_cases(void) {
    /* 0 rows, 1, odd, 8, 9, 16, 17, 53 (4 tiles), 15 */
    const int c1[12] = {0, 1, 7, 8, 9, 0, 16, 17, 53, 3, 15, 0};
    const int c2[5] = {0, 37, 1, 0, 5};
    const int c3[3] = {0, 11, 0};
    grouped_case(200, 576, 12, c1, 40, 1);
    grouped_case(200, 576, 12, c1, 0, 0);
    grouped_case(130, 192, 5, c2, 30, 1);
    grouped_case(72, 64, 5, c2, 0, 0);
    grouped_case(48, 128, 3, c3, 9, 1);
    pair_case(200, 576, 12, c1, 40);
    if (g_san) return;
    pair_case(512, 2048, 5, c2, 60);
    grouped_case(512, 2048, 12, c1, 40, 1); /* gate / up shape */
    grouped_case(2048, 512, 12, c1, 0, 0);  /* down shape */
    grouped_case(2048, 512, 5, c2, 60, 1);
    grouped_case(512, 2048, 5, c2, 0, 0);
    {
        /* 64 tokens x top-8 over 64 experts: ~8 rows each, as a short prompt gives */
        int counts[64];
        route_counts(64, 64, 8, counts);
        grouped_case(512, 2048, 64, counts, 64, 1);
        grouped_case(2048, 512, 64, counts, 0, 0);
    }
}

/* ---- timing (LILY_CUDA_TIME=1) ---- */

typedef struct {
    lily_dmat *W;
    float *X, *Y;
    int ldx, nx, ldy, max_tiles, bn;
    int32_t *gather, *tiles, *nt;
} tctx;

static int t_grouped(tctx *c) {
    lily_err e;
    return lily_cuda_gemm_grouped(c->W, c->X, c->ldx, c->nx, c->gather, c->tiles, c->nt,
                                  c->max_tiles, c->bn, c->Y, c->ldy, NULL, &e);
}

static int t_grouped_v(void *c) {
    return t_grouped(c);
}
static float time_median(tctx *c) {
    return pt_time_median(t_grouped_v, c, 0);
}

static lily_dmat up_q4(int M, int K, int E) {
    lily_err e;
    lily_mat m = pt_mat(LILY_DT_Q4, M, K); /* one random expert, uploaded E times */
    lily_mat *ms = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        ms[x] = m;
    lily_dmat d;
    if (lily_cuda_dmat_upload(ms, E, &d, &e)) {
        printf("FAIL upload: %s\n", e.msg);
        exit(1);
    }
    pt_mat_free(&m);
    free(ms);
    return d;
}

static void timing(void) {
    const int H = 2048, I = 512, E = 256, k = 8, nmax = 512;
    lily_dmat Gs = up_q4(I, H, E), Ds = up_q4(H, I, E);
    const size_t wbytes = lily_cuda_dmat_bytes(&Gs);
    float *X = malloc((size_t)nmax * k * H * 4);
    pt_fill(X, (size_t)nmax * k * H, 1.0f);
    float *dX = pt_dup(X, (size_t)nmax * k * H);
    float *dY = pt_dalloc((size_t)nmax * k * H * 4);
    int counts[256];
    int32_t *gather = malloc(sizeof(int32_t) * nmax * k), *tiles = malloc(12 * (nmax * k + E));
    const int ns[4] = {64, 128, 256, 512};
    const char *only_n = getenv("LILY_SKINNY_TIME_N"), *only_v = getenv("LILY_SKINNY_TIME_V");
    for (int j = 0; j < 4; j++) {
        const int n = ns[j];
        if (only_n && atoi(only_n) != n) continue;
        route_counts(n, E, k, counts);
        for (int r = 0; r < n * k; r++)
            gather[r] = (int32_t)(pt_rnd() % n);
        int32_t *dgather = pt_idup(gather, (size_t)n * k);
        /* 32-row tiles, then the skinny variants; 8: the default (cp pf1) with one-pass GEMMs */
        for (int v = 0; v < 9; v++) {
            if (only_v && atoi(only_v) != v) continue;
            static const char *vn[9] = {"32-row tiles",  "skinny denorm", "skinny sub",
                                        "skinny cp",     "skinny pf1",    "skinny pf2",
                                        "skinny cp pf1", "skinny cp pf2", "cp pf1 1-pass"};
            const int bn = v == 0 ? LILY_GEMM_GROUP_BN : LILY_GEMM_SKINNY_BN;
            if (v) lily_cuda_skinny_variant(v == 2 ? LILY_SKINNY_SUB : LILY_SKINNY_DENORM);
            lily_cuda_skinny_cp(v == 3 || v >= 6);
            lily_cuda_skinny_pf(v == 4 || v == 6 || v == 8 ? 1 : v == 5 || v == 7 ? 2 : 0);
            const lily_cuda_prec prec = {v != 8, 1};
            lily_cuda_prec_set(prec);
            int nt = pt_make_tiles(counts, E, bn, tiles);
            tctx c;
            c.tiles = pt_idup(tiles, (size_t)3 * nt), c.nt = pt_idup(&nt, 1);
            c.max_tiles = n * k / bn + E, c.bn = bn, c.Y = dY;
            c.W = &Gs, c.X = dX, c.ldx = H, c.ldy = I, c.nx = n, c.gather = dgather;
            float us = time_median(&c);
            printf("time gate/up 512 x 2048 x 256 n=%-4d %-14s %8.1f us  %6.2f TB/s of weights "
                   "(%d tiles)\n",
                   n, vn[v], us, wbytes / us * 1e-6, nt);
            c.W = &Ds, c.ldx = I, c.ldy = H, c.nx = n * k, c.gather = NULL;
            us = time_median(&c);
            printf("time down    2048 x 512 x 256 n=%-4d %-14s %8.1f us  %6.2f TB/s of weights\n",
                   n, vn[v], us, wbytes / us * 1e-6);
            lily_cuda_free(c.tiles), lily_cuda_free(c.nt);
        }
        const lily_cuda_prec exact = {1, 1};
        lily_cuda_prec_set(exact);
        lily_cuda_free(dgather);
    }
    lily_cuda_skinny_variant(LILY_SKINNY_DENORM);
    lily_cuda_skinny_cp(0);
    lily_cuda_skinny_pf(0);
    lily_cuda_dmat_free(&Gs), lily_cuda_dmat_free(&Ds);
    lily_cuda_free(dX), lily_cuda_free(dY);
    free(X), free(gather), free(tiles);
}

/* gemm_exact of the GEMMs that follow (lily_cuda_prec; attention stays exact) */
static void set_gemm_exact(int on) {
    lily_cuda_prec p = {on, 1};
    lily_cuda_prec_set(p);
}

int main(void) {
    pt_need_gpu();
    const char *tm = getenv("LILY_CUDA_TIME");
    if (tm && !strcmp(tm, "only")) { /* the timing alone (for a profiler) */
        timing();
        return 0;
    }
    g_san = getenv("LILY_CUDA_SAN") && getenv("LILY_CUDA_SAN")[0] == '1';
    static const char *vname[2] = {"denorm", "sub"};
    for (int cp = 0; cp < 2; cp++)
        for (int v = 0; v < 2; v++)
            for (int exact = 1; exact >= 0; exact--) {
                lily_cuda_skinny_cp(cp);
                lily_cuda_skinny_pf(cp); /* prefetch with the cp cases (it changes no value) */
                lily_cuda_skinny_variant(v ? LILY_SKINNY_SUB : LILY_SKINNY_DENORM);
                set_gemm_exact(exact);
                snprintf(g_tag, sizeof g_tag, " [%s%s%s]", vname[v], cp ? ", cp" : "",
                         exact ? "" : ", fast");
                all_cases();
            }
    lily_cuda_skinny_cp(0);
    lily_cuda_skinny_pf(0);
    /* rows from 1e-6 to 1e6 in one X (the split's row scale keeps fp16 in range) */
    set_gemm_exact(1);
    g_spread = 6.f;
    for (int v = 0; v < 4; v++) {
        lily_cuda_skinny_variant(v & 1 ? LILY_SKINNY_SUB : LILY_SKINNY_DENORM);
        lily_cuda_skinny_cp(v >> 1);
        snprintf(g_tag, sizeof g_tag, " [%s%s, rows 1e-6..1e6]", vname[v & 1],
                 v >> 1 ? ", cp" : "");
        const int c1[6] = {13, 0, 16, 1, 29, 2};
        grouped_case(200, 576, 6, c1, 26, 1);
        if (!g_san) grouped_case(512, 2048, 6, c1, 26, 1);
    }
    lily_cuda_skinny_cp(0);
    g_spread = 0;
    g_tag[0] = 0;
    lily_cuda_skinny_variant(LILY_SKINNY_DENORM);
    set_gemm_exact(1);
    {
        /* 16-row tiles are Q4 only */
        lily_err e;
        lily_mat b = pt_mat(LILY_DT_BF16, 64, 64);
        lily_dmat db;
        if (pt_ok(lily_cuda_dmat_upload(&b, 1, &db, &e), "upload", &e)) {
            float *d = pt_dalloc(64 * 64 * 4);
            int32_t one = 1, *dn = pt_idup(&one, 1);
            pt_check_true("gemm_grouped refuses 16-row tiles of bf16 weights",
                          lily_cuda_gemm_grouped(&db, d, 64, 1, NULL, dn, dn, 1,
                                                 LILY_GEMM_SKINNY_BN, d, 64, NULL, &e) == -1);
            lily_cuda_free(d), lily_cuda_free(dn);
            lily_cuda_dmat_free(&db);
        }
        pt_mat_free(&b);
    }
    if (tm && tm[0] == '1') timing();
    return pt_finish();
}
#endif
