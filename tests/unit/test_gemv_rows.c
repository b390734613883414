/* lily_cpu_matmul_rows (gemv_rows.h) on random inputs: every token's result equals, bit for bit,
 * lily_cpu_matmul of that token alone (the decode product), for 1..8 tokens, several products
 * in one call (sharing x, rows picked through xrow), odd sizes, Q4 / Q8 / bf16 / f32 weights,
 * each kernel set (AVX-512 with int16 or fp32 products, AVX2, plain C), with and without the
 * pool; and it stays close to a plain fp64 reference of the format's definition. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemv_rows.h"
#include "base/pool.h"

static int n_pass, n_fail;
static uint64_t rng = 0x51afd7ed558ccd1bull;

static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) {
    return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}

static void check(int ok, const char *what, double err) {
    ok ? n_pass++ : n_fail++;
    printf("%s %-56s err=%.3g\n", ok ? "ok  " : "FAIL", what, err);
}

static float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element (r, c) by the format's definition. */
static double elem(const lily_mat *W, int r, int c) {
    if (W->dt == LILY_DT_F32) return ((const float *)W->w)[(size_t)r * W->cols + c];
    if (W->dt == LILY_DT_BF16) return bf(((const uint16_t *)W->w)[(size_t)r * W->cols + c]);
    int bits = W->dt == LILY_DT_Q4 ? 4 : 8, per = 32 / bits, ng = W->cols / 64;
    const uint32_t *words = (const uint32_t *)W->w + (size_t)r * W->cols / per;
    uint32_t q = (words[c / per] >> ((c % per) * bits)) & ((1u << bits) - 1);
    size_t g = (size_t)r * ng + c / 64;
    return (double)bf(W->scales[g]) * q + bf(W->biases[g]);
}

static void make(lily_mat *W, lily_dtype dt, int rows, int cols, void **mem) {
    memset(W, 0, sizeof *W);
    W->dt = dt, W->rows = rows, W->cols = cols;
    size_t n = (size_t)rows * cols;
    float amp = 1.0f / sqrtf((float)cols);
    if (dt == LILY_DT_F32) {
        float *p = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            p[i] = frand() * amp;
        W->w = mem[0] = p;
    } else if (dt == LILY_DT_BF16) {
        uint16_t *p = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            p[i] = lily_f32_to_bf16(frand() * amp);
        W->w = mem[0] = p;
    } else {
        int bits = dt == LILY_DT_Q4 ? 4 : 8, ng = cols / 64;
        W->group = 64;
        uint32_t *q = malloc(n * bits / 8);
        for (size_t i = 0; i < n * bits / 32; i++)
            q[i] = rnd() ^ (rnd() << 16);
        uint16_t *s = malloc((size_t)rows * ng * 2), *b = malloc((size_t)rows * ng * 2);
        float qmax = (float)((1 << bits) - 1);
        for (size_t i = 0; i < (size_t)rows * ng; i++) {
            float sc = amp * (0.5f + 0.5f * fabsf(frand())) * 2.0f / qmax;
            s[i] = lily_f32_to_bf16(sc);
            b[i] = lily_f32_to_bf16(-sc * qmax / 2 + frand() * amp * 0.1f);
        }
        W->w = mem[0] = q;
        W->scales = mem[1] = s;
        W->biases = mem[2] = b;
    }
}

/* Three products in one call over n tokens of a pool of 8 x rows: W0 and W1 read the same x
 * rows (picked by xrow, in a scrambled order), W2 reads the first n rows of another x. */
static void one(const lily_cpu_kern *k, const char *kname, lily_dtype dt, int rows, int cols, int n,
                lily_pool *pool) {
    void *mem[3][3] = {{0}};
    lily_mat W[3];
    make(&W[0], dt, rows, cols, mem[0]);
    make(&W[1], dt, rows + 3, cols, mem[1]);
    make(&W[2], dt, rows / 2 + 1, cols, mem[2]);
    const int ldx = cols + 5, ldy = rows + 7;
    float *X = malloc((size_t)8 * ldx * 4), *X2 = malloc((size_t)8 * ldx * 4);
    for (int i = 0; i < 8 * ldx; i++)
        X[i] = frand(), X2[i] = frand() * 3;
    int xrow[8];
    for (int t = 0; t < 8; t++)
        xrow[t] = (t * 5 + 3) % 8;
    float *Y[3], *Z = malloc((size_t)(rows + 3) * 4);
    for (int i = 0; i < 3; i++) {
        Y[i] = malloc((size_t)n * ldy * 4);
        for (int j = 0; j < n * ldy; j++)
            Y[i][j] = NAN;
    }
    lily_rows_op ops[3] = {{&W[0], X, ldx, xrow, n, Y[0], ldy},
                           {&W[1], X, ldx, xrow, n, Y[1], ldy},
                           {&W[2], X2, ldx, NULL, n, Y[2], ldy}};
    lily_cpu_matmul_rows(k, ops, 3, pool);
    int differ = 0, far = 0;
    double worst = 0;
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < n; t++) {
            const float *x = i < 2 ? X + (size_t)xrow[t] * ldx : X2 + (size_t)t * ldx;
            lily_cpu_matmul(k, &W[i], x, 1, cols, Z, W[i].rows, pool);
            differ += memcmp(Z, Y[i] + (size_t)t * ldy, (size_t)W[i].rows * 4) != 0;
            for (int r = 0; r < W[i].rows; r++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < cols; c++) {
                    double w = elem(&W[i], r, c);
                    ref += w * x[c], mag += fabs(w * x[c]);
                }
                double err = fabs(Y[i][(size_t)t * ldy + r] - ref) / (mag + 1e-12);
                /* 8-bit x codes (FAST, gemv_i8.h): each element within max|x of its group| /
                 * 254, a few 1e-3 of the products' magnitude here */
                const double lim = lily_cpu_matmul_quantizes_x(k, &W[i], 1) == 127 ? 1e-2 : 1e-4;
                if (!(err <= lim)) far++;
                if (err > worst || err != err) worst = err;
            }
        }
    static const char *dn[] = {"f32", "bf16", "f16", "q4", "q8"};
    char what[128];
    snprintf(what, sizeof what, "rows %s %s %dx%d n=%d%s", kname, dn[dt], rows, cols, n,
             pool ? " pool" : "");
    check(!differ && !far, what, worst);
    if (differ) printf("     %d token results differ from the 1-token product\n", differ);
    for (int i = 0; i < 3; i++) {
        free(Y[i]);
        for (int j = 0; j < 3; j++)
            free(mem[i][j]);
    }
    free(X), free(X2), free(Z);
}

int main(void) {
    lily_pool *pool = lily_pool_create(3);
    struct {
        lily_cpu_isa isa;
        lily_precision prec;
        const char *name;
    } ks[] = {{LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT, "auto"},
              {LILY_CPU_ISA_AUTO, LILY_PRECISION_EXACT, "auto-exact"},
              {LILY_CPU_ISA_AVX2, LILY_PRECISION_DEFAULT, "avx2"},
              {LILY_CPU_ISA_AUTO, LILY_PRECISION_FAST, "auto-fast"},
              {LILY_CPU_ISA_AVX2, LILY_PRECISION_FAST, "avx2-fast"},
              {LILY_CPU_ISA_SCALAR, LILY_PRECISION_DEFAULT, "scalar"}};
    const int ns[] = {1, 2, 3, 5, 8};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        lily_cpu_kern k = lily_cpu_kern_for(ks[ki].isa, ks[ki].prec);
        for (int q = 0; q < 4; q++) {
            lily_dtype dt = q == 0   ? LILY_DT_Q4
                            : q == 1 ? LILY_DT_Q8
                            : q == 2 ? LILY_DT_BF16
                                     : LILY_DT_F32;
            int quant = q < 2;
            int shapes[][2] = {
                {37, quant ? 192 : 71}, {130, quant ? 64 : 200}, {5, quant ? 17408 : 33}};
            for (int si = 0; si < 3; si++)
                for (int ni = 0; ni < 5; ni++)
                    one(&k, ks[ki].name, dt, shapes[si][0], shapes[si][1], ns[ni],
                        (ni & 1) ? pool : NULL);
        }
    }
    lily_pool_free(pool);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
