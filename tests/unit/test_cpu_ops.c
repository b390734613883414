/* CPU operators against independent plain references on random inputs (odd sizes, several
 * token counts, every weight dtype, with and without the thread pool). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemv_i16.h"
#include "backend/cpu/gemv_i8.h"
#include "backend/cpu/ops.h"
#include "base/err.h"
#include "base/pool.h"

static int n_pass, n_fail;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

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
    if (ok)
        n_pass++;
    else
        n_fail++;
    printf("%s %-48s err=%.3g\n", ok ? "ok  " : "FAIL", what, err);
}

static uint16_t f32_to_f16(float f) {
    /* simple round-to-nearest for normal-range values used in the test */
    union {
        float f;
        uint32_t u;
    } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u;
    int exp = (int)((v.u >> 23) & 0xff) - 127 + 15;
    uint32_t man = v.u & 0x7fffffu;
    if (exp <= 0) return (uint16_t)sign;
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    if (man & 0x1000u) h++;
    return (uint16_t)h;
}

/* The bf16 scale and bias of the group of element (r, c) of a quantised W. */
static void group_scale_bias(const lily_mat *W, int r, int c, float *s, float *b) {
    int g = c / W->group, ng = W->cols / W->group;
    uint32_t su = (uint32_t)W->scales[(size_t)r * ng + g] << 16;
    uint32_t bu = (uint32_t)W->biases[(size_t)r * ng + g] << 16;
    memcpy(s, &su, 4);
    memcpy(b, &bu, 4);
}

/* Element (r, c) of W by the format's definition, independent of the library's dequant. */
static double ref_elem(const lily_mat *W, int r, int c) {
    switch (W->dt) {
    case LILY_DT_F32: return ((const float *)W->w)[(size_t)r * W->cols + c];
    case LILY_DT_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)W->w)[(size_t)r * W->cols + c] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case LILY_DT_F16: {
        uint16_t h = ((const uint16_t *)W->w)[(size_t)r * W->cols + c];
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
        return (h & 0x8000) ? -v : v;
    }
    case LILY_DT_Q4:
    case LILY_DT_Q8: {
        int bits = W->dt == LILY_DT_Q4 ? 4 : 8, per = 32 / bits;
        const uint32_t *words = (const uint32_t *)W->w + (size_t)r * W->cols / per;
        uint32_t q = (words[c / per] >> ((c % per) * bits)) & ((1u << bits) - 1);
        float s, b;
        group_scale_bias(W, r, c, &s, &b);
        return (double)s * q + b;
    }
    }
    return NAN;
}

/* The middle of a Q4 element's group (q = 8): s 8 + b, what the int16 GEMM centres on. */
static double ref_elem_mid(const lily_mat *W, int r, int c) {
    float s, b;
    group_scale_bias(W, r, c, &s, &b);
    return 8.0 * s + b;
}

static void make_mat(lily_mat *W, lily_dtype dt, int rows, int cols, void **mem) {
    memset(W, 0, sizeof *W);
    W->dt = dt;
    W->rows = rows;
    W->cols = cols;
    size_t n = (size_t)rows * cols;
    float amp = 1.0f / sqrtf((float)cols);
    if (dt == LILY_DT_F32) {
        float *p = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            p[i] = frand() * amp;
        W->w = p;
        mem[0] = p;
    } else if (dt == LILY_DT_BF16 || dt == LILY_DT_F16) {
        uint16_t *p = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            p[i] = dt == LILY_DT_BF16 ? lily_f32_to_bf16(frand() * amp) : f32_to_f16(frand() * amp);
        W->w = p;
        mem[0] = p;
    } else {
        int bits = dt == LILY_DT_Q4 ? 4 : 8;
        W->group = 64;
        int ng = cols / 64;
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
        W->w = q;
        W->scales = s;
        W->biases = b;
        mem[0] = q;
        mem[1] = s;
        mem[2] = b;
    }
}

/* The kernels under test (lily_cpu_kern_for: an instruction set cap and a precision). */
static lily_cpu_kern K;

static void test_matmul(lily_pool *pool) {
    const lily_dtype dts[] = {LILY_DT_F32, LILY_DT_BF16, LILY_DT_F16, LILY_DT_Q4, LILY_DT_Q8};
    const char *names[] = {"f32", "bf16", "f16", "q4", "q8"};
    const int ns[] = {1, 2, 3, 4, 5, 17, 33, 70};
    for (int d = 0; d < 5; d++) {
        int quant = dts[d] == LILY_DT_Q4 || dts[d] == LILY_DT_Q8;
        int shapes[][2] = {{37, quant ? 192 : 71},
                           {129, quant ? 64 : 200},
                           {16, quant ? 320 : 5},
                           {5, quant ? 17408 : 33}};
        for (int si = 0; si < 4; si++)
            for (int ni = 0; ni < 8; ni++) {
                int rows = shapes[si][0], cols = shapes[si][1], n = ns[ni];
                void *mem[3] = {0};
                lily_mat W;
                make_mat(&W, dts[d], rows, cols, mem);
                int ldx = cols + 3, ldy = rows + 5;
                float *X = malloc((size_t)n * ldx * 4), *Y = malloc((size_t)n * ldy * 4);
                for (int i = 0; i < n * ldx; i++)
                    X[i] = frand();
                for (int i = 0; i < n * ldy; i++)
                    Y[i] = NAN; /* poison */
                lily_cpu_matmul(&K, &W, X, n, ldx, Y, ldy, (ni & 1) ? pool : NULL);
                const int qx = lily_cpu_matmul_quantizes_x(&K, &W, n);
                double worst = 0;
                int bad = 0;
                for (int t = 0; t < n; t++)
                    for (int r = 0; r < rows; r++) {
                        const float *x = X + (size_t)t * ldx;
                        double ref = 0, mag = 0, qb = 0;
                        for (int c = 0; c < cols; c++) {
                            double w = ref_elem(&W, r, c);
                            ref += w * x[c];
                            mag += fabs(w * x[c]);
                        }
                        /* x codes per group of 64 (16-bit: matmul_i16.h, 8-bit: gemv_i8.h): each
                         * element off by at most half a step (max|x of its group| / qx / 2),
                         * against the centred weight s (q - 8): that bound on top of the fp32
                         * one */
                        for (int g = 0; qx && g < cols / 64; g++) {
                            double mx = 0, sw = 0;
                            for (int c = 64 * g; c < 64 * g + 64; c++) {
                                mx = fmax(mx, fabs(x[c]));
                                sw += fabs(ref_elem(&W, r, c) - ref_elem_mid(&W, r, c));
                            }
                            qb += sw * mx / qx / 2.0;
                        }
                        double err = fabs(Y[(size_t)t * ldy + r] - ref) / (mag + 1e-12);
                        double lim = 1e-5 + qb / (mag + 1e-12);
                        if (!(err <= lim)) bad = 1;
                        if (err > worst || err != err) worst = err;
                    }
                char what[96];
                snprintf(what, sizeof what, "matmul %s %dx%d n=%d%s", names[d], rows, cols, n,
                         (ni & 1) ? " pool" : "");
                check(!bad, what, worst);
                free(X), free(Y), free(mem[0]), free(mem[1]), free(mem[2]);
            }
    }
}

/* lily_cpu_matmul_glu must give exactly silu(G x) * (U x) from two lily_cpu_matmul calls when it
 * takes the product (the int16 path), and decline otherwise. */
static void test_matmul_glu(lily_pool *pool) {
    const int shapes[][3] = {{48, 128, 5}, {37, 192, 17}, {512, 2048, 21}, {16, 64, 70}};
    for (int si = 0; si < 4; si++) {
        int rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        void *mg[3] = {0}, *mu[3] = {0};
        lily_mat G, U;
        make_mat(&G, LILY_DT_Q4, rows, cols, mg);
        make_mat(&U, LILY_DT_Q4, rows, cols, mu);
        int ldx = cols + 1, ldy = rows + 3;
        float *X = malloc((size_t)n * ldx * 4), *Y = malloc((size_t)n * ldy * 4);
        float *g = malloc((size_t)n * rows * 4), *u = malloc((size_t)n * rows * 4);
        for (int i = 0; i < n * ldx; i++)
            X[i] = frand();
        for (int i = 0; i < n * ldy; i++)
            Y[i] = NAN;
        int took = lily_cpu_matmul_glu(&K, &G, &U, X, n, ldx, Y, ldy, (si & 1) ? pool : NULL);
        char what[96];
        snprintf(what, sizeof what, "matmul_glu %dx%d n=%d%s", rows, cols, n,
                 (si & 1) ? " pool" : "");
        if (!took) {
            check(!lily_cpu_matmul_quantizes_x(&K, &G, n), what, 0); /* declined: no int16 path */
        } else {
            lily_cpu_matmul(&K, &G, X, n, ldx, g, rows, pool);
            lily_cpu_matmul(&K, &U, X, n, ldx, u, rows, pool);
            int same = 1;
            for (int t = 0; t < n; t++)
                for (int r = 0; r < rows; r++) {
                    float e = g[(size_t)t * rows + r];
                    e = lily_silu(e) * u[(size_t)t * rows + r];
                    same &= memcmp(&e, &Y[(size_t)t * ldy + r], 4) == 0;
                }
            check(same, what, 0);
        }
        free(X), free(Y), free(g), free(u);
        for (int i = 0; i < 3; i++)
            free(mg[i]), free(mu[i]);
    }
    lily_mat F;
    void *mf[3] = {0};
    make_mat(&F, LILY_DT_F32, 8, 64, mf);
    float x[64 * 5] = {0}, y[8 * 5];
    check(!lily_cpu_matmul_glu(&K, &F, &F, x, 5, 64, y, 8, pool), "matmul_glu declines f32", 0);
    free(mf[0]);
}

/* The conv and GDN bodies under test (lily_cpu_kern.isa of each kernel set). */
static int KI;

static void test_conv(void) {
    int C = 13, K = 4, n = 11;
    float *in = malloc((size_t)n * C * 4), *w = malloc((size_t)C * K * 4);
    float *st = calloc((size_t)(K - 1) * C, 4), *st2 = calloc((size_t)(K - 1) * C, 4);
    float *o1 = malloc((size_t)n * C * 4), *o2 = malloc((size_t)n * C * 4);
    for (int i = 0; i < n * C; i++)
        in[i] = frand();
    for (int i = 0; i < C * K; i++)
        w[i] = frand();
    lily_cpu_conv_silu_isa(KI, in, n, C, K, st, w, o1);
    /* the same sequence fed in pieces of 1, 2 and 5 tokens must give the same outputs */
    int pieces[] = {1, 2, 1, 5, 2}, at = 0;
    for (int p = 0; p < 5; p++) {
        lily_cpu_conv_silu_isa(KI, in + (size_t)at * C, pieces[p], C, K, st2, w,
                               o2 + (size_t)at * C);
        at += pieces[p];
    }
    double worst = 0, worst2 = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int tau = 0; tau < K; tau++) {
                int s = t - (K - 1) + tau;
                if (s >= 0) acc += (double)w[c * K + tau] * in[s * C + c];
            }
            double ref = acc / (1 + exp(-acc));
            worst = fmax(worst, fabs(o1[t * C + c] - ref));
            worst2 = fmax(worst2, fabs(o2[t * C + c] - o1[t * C + c]));
        }
    check(worst < 1e-5, "conv+silu vs reference", worst);
    check(worst2 < 1e-6 && !memcmp(st, st2, (size_t)(K - 1) * C * 4), "conv in pieces == whole",
          worst2);
    free(in), free(w), free(st), free(st2), free(o1), free(o2);
}

static void test_gdn(void) {
    int Dk = 7, Dv = 9, n = 23;
    float *S = malloc((size_t)Dk * Dv * 4);
    double *R = malloc((size_t)Dk * Dv * 8);
    for (int i = 0; i < Dk * Dv; i++)
        R[i] = S[i] = frand();
    float *q = malloc((size_t)n * Dk * 4), *k = malloc((size_t)n * Dk * 4);
    float *v = malloc((size_t)n * Dv * 4), *o = malloc((size_t)n * Dv * 4);
    float beta[64], lam[64];
    for (int i = 0; i < n * Dk; i++)
        q[i] = frand(), k[i] = frand() * 0.4f;
    for (int i = 0; i < n * Dv; i++)
        v[i] = frand();
    for (int t = 0; t < n; t++)
        beta[t] = 0.5f + 0.5f * fabsf(frand()), lam[t] = 0.7f + 0.3f * fabsf(frand());
    lily_cpu_gdn_scan_isa(KI, S, Dk, Dv, n, q, Dk, k, Dk, v, Dv, beta, lam, 1, o, Dv);
    /* closed form: S_t = lam (I - beta k k^T) S_{t-1} + beta k v^T; o_t = S_t^T q */
    double worst = 0;
    double *T = malloc((size_t)Dk * Dv * 8);
    for (int t = 0; t < n; t++) {
        const float *kt = k + t * Dk, *vt = v + t * Dv, *qt = q + t * Dk;
        for (int i = 0; i < Dk; i++)
            for (int j = 0; j < Dv; j++) {
                double kS = 0;
                for (int a = 0; a < Dk; a++)
                    kS += (double)kt[a] * R[a * Dv + j];
                T[i * Dv + j] = lam[t] * (R[i * Dv + j] - beta[t] * kt[i] * kS) +
                                (double)beta[t] * kt[i] * vt[j];
            }
        memcpy(R, T, (size_t)Dk * Dv * 8);
        for (int j = 0; j < Dv; j++) {
            double acc = 0;
            for (int i = 0; i < Dk; i++)
                acc += R[i * Dv + j] * qt[i];
            worst = fmax(worst, fabs(acc - o[t * Dv + j]));
        }
    }
    double sw = 0;
    for (int i = 0; i < Dk * Dv; i++)
        sw = fmax(sw, fabs(R[i] - S[i]));
    check(worst < 1e-4, "gdn scan outputs vs closed form", worst);
    check(sw < 1e-4, "gdn scan final state vs closed form", sw);
    free(S), free(R), free(T), free(q), free(k), free(v), free(o);
}

/* The conv and GDN bodies (AVX-512, AVX2, plain; those the CPU runs) give the same bits: at the
 * model's head shape (Dk 128, Dv 128) and an odd one, a prefill chunk and single steps. */
static void test_scan_bodies_agree(void) {
    const int best = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT).isa;
    const int shapes[][3] = {{128, 128, 9}, {13, 37, 1}, {128, 64, 1}};
    for (int si = 0; si < 3; si++) {
        const int Dk = shapes[si][0], Dv = shapes[si][1], n = shapes[si][2];
        float *S0 = malloc((size_t)Dk * Dv * 4), *q = malloc((size_t)n * Dk * 4);
        float *k = malloc((size_t)n * Dk * 4), *v = malloc((size_t)n * Dv * 4);
        float *o[3], *S[3], beta[16], lam[16];
        for (int i = 0; i < Dk * Dv; i++)
            S0[i] = frand();
        for (int i = 0; i < n * Dk; i++)
            q[i] = frand(), k[i] = frand() * 0.1f;
        for (int i = 0; i < n * Dv; i++)
            v[i] = frand();
        for (int t = 0; t < n; t++)
            beta[t] = 0.5f + 0.5f * fabsf(frand()), lam[t] = 0.7f + 0.3f * fabsf(frand());
        int same = 1;
        for (int isa = best; isa >= 0; isa--) {
            o[isa] = malloc((size_t)n * Dv * 4), S[isa] = malloc((size_t)Dk * Dv * 4);
            memcpy(S[isa], S0, (size_t)Dk * Dv * 4);
            lily_cpu_gdn_scan_isa(isa, S[isa], Dk, Dv, n, q, Dk, k, Dk, v, Dv, beta, lam, 1, o[isa],
                                  Dv);
            if (isa < best)
                same &= !memcmp(o[isa], o[best], (size_t)n * Dv * 4) &&
                        !memcmp(S[isa], S[best], (size_t)Dk * Dv * 4);
        }
        char what[96];
        snprintf(what, sizeof what, "gdn scan %dx%d n=%d: every body the same bits", Dk, Dv, n);
        check(same, what, 0);
        /* the conv over C = Dv channels, K = 4, the n tokens of v */
        float *st[3], *co[3], w[4 * 64];
        for (int i = 0; i < 4 * Dv && i < 4 * 64; i++)
            w[i] = frand();
        same = 1;
        const int C = Dv < 64 ? Dv : 64;
        for (int isa = best; isa >= 0; isa--) {
            st[isa] = calloc((size_t)3 * C, 4), co[isa] = malloc((size_t)n * C * 4);
            lily_cpu_conv_silu_isa(isa, v, n, C, 4, st[isa], w, co[isa]);
            if (isa < best)
                same &= !memcmp(co[isa], co[best], (size_t)n * C * 4) &&
                        !memcmp(st[isa], st[best], (size_t)3 * C * 4);
        }
        snprintf(what, sizeof what, "conv C=%d n=%d: every body the same bits", C, n);
        check(same, what, 0);
        for (int isa = best; isa >= 0; isa--)
            free(o[isa]), free(S[isa]), free(st[isa]), free(co[isa]);
        free(S0), free(q), free(k), free(v);
    }
}

/* One attention call against a double-precision reference: every (token, head) row. */
static void attention_case(lily_pool *pool, int Nq, int Nkv, int Dh, int pos, int n) {
    int ctx = pos + n, qd = Nq * Dh, kd = Nkv * Dh, threads = lily_pool_threads(pool);
    float *q = malloc((size_t)n * qd * 4), *kc = malloc((size_t)ctx * kd * 4);
    float *vc = malloc((size_t)ctx * kd * 4), *o = malloc((size_t)n * qd * 4);
    size_t per = lily_cpu_attention_scratch(Nq, Nkv, Dh, ctx);
    float *scr = lily_xaligned((size_t)threads * per * 4);
    double *sc = malloc((size_t)ctx * sizeof(double));
    for (int i = 0; i < n * qd; i++)
        q[i] = frand() * 2;
    for (int i = 0; i < ctx * kd; i++)
        kc[i] = frand() * 2, vc[i] = frand();
    for (int i = 0; i < n * qd; i++)
        o[i] = NAN; /* poison */
    lily_cpu_attention(&K, q, n, pos, kc, vc, Nq, Nkv, Dh, 0.3f, o, scr, (n & 1) ? pool : NULL);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Nq; h++) {
            int g = h / (Nq / Nkv), len = pos + t + 1;
            double mx = -1e30, sum = 0;
            for (int p = 0; p < len; p++) {
                double d = 0;
                for (int i = 0; i < Dh; i++)
                    d += (double)q[(size_t)t * qd + h * Dh + i] * kc[(size_t)p * kd + g * Dh + i];
                sc[p] = d * 0.3;
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p < len; p++)
                sum += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < Dh; i++) {
                double acc = 0;
                for (int p = 0; p < len; p++)
                    acc += sc[p] / sum * vc[(size_t)p * kd + g * Dh + i];
                double e = fabs(acc - o[(size_t)t * qd + h * Dh + i]);
                if (!(e <= worst)) worst = e != e ? INFINITY : e;
            }
        }
    char what[96];
    snprintf(what, sizeof what, "attention Nq=%d Nkv=%d Dh=%d pos=%d n=%d%s", Nq, Nkv, Dh, pos, n,
             (n & 1) ? " pool" : "");
    check(worst < 1e-5, what, worst);
    free(q), free(kc), free(vc), free(o), free(scr), free(sc);
}

/* Causal GQA attention on random inputs: odd head sizes, group sizes 1 to 16 (task chunks of
 * several tokens, of part of a token's heads), one token (decode), contexts across several
 * 64-position blocks; on every kernel set the CPU runs (AVX-512, AVX2, plain C). */
static void test_attention(lily_pool *pool) {
    const int cases[][5] = {{6, 2, 37, 37, 9},    {16, 2, 256, 0, 5},    {16, 2, 256, 300, 1},
                            {16, 2, 64, 131, 18}, {8, 8, 40, 70, 3},     {32, 1, 48, 5, 2},
                            {4, 1, 16, 200, 7},   {16, 2, 256, 1000, 2}, {16, 2, 256, 4000, 1},
                            {16, 2, 256, 4000, 3}};
    const lily_cpu_isa isas[] = {LILY_CPU_ISA_AVX512, LILY_CPU_ISA_AVX2, LILY_CPU_ISA_SCALAR};
    for (int k = 0; k < 3; k++) {
        K = lily_cpu_kern_for(isas[k], LILY_PRECISION_DEFAULT);
        printf("-- attention: %s\n", lily_cpu_kern_name(&K));
        for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++)
            attention_case(pool, cases[c][0], cases[c][1], cases[c][2], cases[c][3], cases[c][4]);
    }
    K = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT);
}

static void test_misc(void) {
    /* RoPE: rotation of the first rot dims, half-split pairs, rest untouched */
    float x[24], y[24];
    for (int i = 0; i < 24; i++)
        x[i] = y[i] = frand();
    lily_cpu_rope(y, 16, 123, 10000.0);
    double worst = 0;
    for (int i = 0; i < 8; i++) {
        double f = pow(10000.0, -(2.0 * i) / 16), a = 123 * f;
        worst = fmax(worst, fabs(y[i] - (x[i] * cos(a) - x[i + 8] * sin(a))));
        worst = fmax(worst, fabs(y[i + 8] - (x[i + 8] * cos(a) + x[i] * sin(a))));
    }
    for (int i = 16; i < 24; i++)
        worst = fmax(worst, fabs(y[i] - x[i]));
    check(worst < 1e-4, "rope half-split, partial", worst);
    /* RMSNorm */
    float w[37], z[37], r[37];
    double ss = 0;
    for (int i = 0; i < 37; i++)
        z[i] = frand() * 3, w[i] = frand(), ss += (double)z[i] * z[i];
    lily_cpu_rmsnorm(z, w, 37, 1e-6f, r);
    worst = 0;
    for (int i = 0; i < 37; i++)
        worst = fmax(worst, fabs(r[i] - z[i] / sqrt(ss / 37 + 1e-6) * w[i]));
    check(worst < 1e-5, "rmsnorm", worst);
    /* top-k softmax: the k largest, weights renormalised, descending */
    float lg[19];
    for (int i = 0; i < 19; i++)
        lg[i] = frand() * 4;
    int idx[5];
    float wt[5];
    lily_cpu_topk_softmax(lg, 19, 5, 1, idx, wt);
    int ok = 1;
    double wsum = 0;
    for (int j = 0; j < 5; j++) {
        int above = 0;
        for (int e = 0; e < 19; e++)
            above += lg[e] > lg[idx[j]];
        ok &= above == j;
        wsum += wt[j];
        if (j) ok &= wt[j] <= wt[j - 1];
    }
    double ew = exp(lg[idx[1]] - lg[idx[0]]);
    check(ok && fabs(wsum - 1) < 1e-6 && fabs(wt[1] / wt[0] - ew) < 1e-5, "router top-k softmax",
          fabs(wsum - 1));
    /* dequantized rows equal the format definition */
    void *mem[3] = {0};
    lily_mat W;
    make_mat(&W, LILY_DT_Q4, 5, 128, mem);
    float row[128];
    lily_mat_row_f32(&W, 3, row);
    worst = 0;
    for (int c = 0; c < 128; c++)
        worst = fmax(worst, fabs(row[c] - ref_elem(&W, 3, c)));
    check(worst < 1e-6, "q4 row dequant", worst);
    free(mem[0]), free(mem[1]), free(mem[2]);
}

/* The int16 products' AVX2 bodies against the AVX-512 VNNI ones, where the CPU runs both: the
 * decode product's quantised x byte for byte, and every product (decode: 1-4 tokens; prefill:
 * the GEMM, 5+ tokens) bit for bit, on odd shapes. */
static void test_i16_avx2_vs_vnni(lily_pool *pool) {
    const lily_cpu_kern kv = lily_cpu_kern_for(LILY_CPU_ISA_AVX512, LILY_PRECISION_DEFAULT);
    const lily_cpu_kern ka = lily_cpu_kern_for(LILY_CPU_ISA_AVX2, LILY_PRECISION_DEFAULT);
    const lily_cpu_kern k8v = lily_cpu_kern_for(LILY_CPU_ISA_AVX512, LILY_PRECISION_FAST);
    const lily_cpu_kern k8a = lily_cpu_kern_for(LILY_CPU_ISA_AVX2, LILY_PRECISION_FAST);
    if (!kv.vnni || !ka.i16) {
        printf("-- int16 AVX2 vs VNNI: skipped (the CPU lacks one of them)\n");
        return;
    }
    const int shapes[][2] = {{37, 192}, {129, 64}, {16, 320}, {5, 17408}, {70, 2048}};
    const int ns[] = {1, 2, 3, 4, 5, 9, 33};
    for (int si = 0; si < 5; si++) {
        const int rows = shapes[si][0], cols = shapes[si][1], ldx = cols + 7;
        void *mem[3] = {0};
        lily_mat W;
        make_mat(&W, LILY_DT_Q4, rows, cols, mem);
        float *X = malloc((size_t)33 * ldx * 4), *Y0 = malloc((size_t)33 * rows * 4);
        float *Y1 = malloc((size_t)33 * rows * 4);
        for (int i = 0; i < 33 * ldx; i++)
            X[i] = frand() * (1 + (i % 5)); /* groups of different scales */
        /* the decode product's x: one layout, two quantisers */
        size_t xb = lily_cpu_gemv_i16_x_bytes(4, cols);
        void *q0 = lily_xaligned(xb), *q1 = lily_xaligned(xb);
        memset(q0, 0xa5, xb), memset(q1, 0x5a, xb);
        lily_cpu_gemv_i16_quant(X, 4, ldx, cols, q0);
        lily_cpu_gemv_i16_quant_avx2(X, 4, ldx, cols, q1);
        /* the bytes after each token's used part are padding: compare what the kernels read */
        size_t nb = ((size_t)cols + 127) / 128, used = nb * 256 + nb * 24, ts = xb / 4;
        int same = 1;
        for (int t = 0; t < 4; t++)
            same &= !memcmp((char *)q0 + t * ts, (char *)q1 + t * ts, used);
        char what[96];
        snprintf(what, sizeof what, "gemv_i16 x: avx2 == vnni bytes, %d cols", cols);
        check(same, what, 0);
        for (int ni = 0; ni < 7; ni++) {
            const int n = ns[ni];
            if (!lily_cpu_matmul_quantizes_x(&ka, &W, n)) continue; /* over the decode cap */
            for (int i = 0; i < n * rows; i++)
                Y0[i] = NAN, Y1[i] = 1.0f;
            lily_cpu_matmul(&kv, &W, X, n, ldx, Y0, rows, (ni & 1) ? pool : NULL);
            lily_cpu_matmul(&ka, &W, X, n, ldx, Y1, rows, (ni & 1) ? NULL : pool);
            snprintf(what, sizeof what, "int16 q4 %dx%d n=%d: avx2 == vnni bit for bit", rows, cols,
                     n);
            check(!memcmp(Y0, Y1, (size_t)n * rows * 4), what, 0);
            if (n > 4) continue;
            /* the int8 decode product (FAST) likewise */
            lily_cpu_matmul(&k8v, &W, X, n, ldx, Y0, rows, (ni & 1) ? pool : NULL);
            lily_cpu_matmul(&k8a, &W, X, n, ldx, Y1, rows, (ni & 1) ? NULL : pool);
            snprintf(what, sizeof what, "int8 q4 %dx%d n=%d: avx2 == vnni bit for bit", rows, cols,
                     n);
            check(lily_cpu_matmul_quantizes_x(&k8a, &W, n) == 127 &&
                      !memcmp(Y0, Y1, (size_t)n * rows * 4),
                  what, 0);
        }
        free(q0), free(q1), free(X), free(Y0), free(Y1);
        free(mem[0]), free(mem[1]), free(mem[2]);
    }
}

/* A decode product's token t gives the same bits whatever the other tokens (the multi-row decode
 * relies on it): n tokens at once against each alone, for the int16 and int8 products on every
 * body the CPU runs, odd rows, a missing last half block. */
static void test_gemv_token_independence(void) {
    const lily_cpu_kern best = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT);
    if (best.isa < 1) return;
    const int rows = 37, cols = 320, ldx = cols + 3, nmax = 8;
    void *mem[3] = {0};
    lily_mat W;
    make_mat(&W, LILY_DT_Q4, rows, cols, mem);
    float *X = malloc((size_t)nmax * ldx * 4), *Ya = malloc((size_t)nmax * rows * 4);
    float *Y1 = malloc((size_t)rows * 4);
    for (int i = 0; i < nmax * ldx; i++)
        X[i] = frand() * (1 + i % 3);
    void *xa =
        lily_xaligned(lily_cpu_gemv_i8_x_bytes(nmax, cols) + lily_cpu_gemv_i16_x_bytes(nmax, cols));
    void *x1 =
        lily_xaligned(lily_cpu_gemv_i8_x_bytes(1, cols) + lily_cpu_gemv_i16_x_bytes(1, cols));
    for (int vnni = best.vnni; vnni >= 0; vnni--)
        for (int i8 = 0; i8 < 2; i8++) {
            const int n = i8 ? LILY_GEMV_I8_MAX_N : LILY_GEMV_I16_MAX_N;
            if (i8) {
                lily_cpu_gemv_i8_quant(vnni, X, n, ldx, cols, xa);
                lily_cpu_gemv_i8_rows(vnni, &W, 0, rows, xa, n, Ya, rows);
            } else if (vnni) {
                lily_cpu_gemv_i16_quant(X, n, ldx, cols, xa);
                lily_cpu_gemv_i16_rows(&W, 0, rows, xa, n, Ya, rows);
            } else {
                lily_cpu_gemv_i16_quant_avx2(X, n, ldx, cols, xa);
                lily_cpu_gemv_i16_rows_avx2(&W, 0, rows, xa, n, Ya, rows);
            }
            int same = 1;
            for (int t = 0; t < n; t++) {
                const float *xt = X + (size_t)t * ldx;
                if (i8) {
                    lily_cpu_gemv_i8_quant(vnni, xt, 1, ldx, cols, x1);
                    lily_cpu_gemv_i8_rows(vnni, &W, 0, rows, x1, 1, Y1, rows);
                } else if (vnni) {
                    lily_cpu_gemv_i16_quant(xt, 1, ldx, cols, x1);
                    lily_cpu_gemv_i16_rows(&W, 0, rows, x1, 1, Y1, rows);
                } else {
                    lily_cpu_gemv_i16_quant_avx2(xt, 1, ldx, cols, x1);
                    lily_cpu_gemv_i16_rows_avx2(&W, 0, rows, x1, 1, Y1, rows);
                }
                same &= !memcmp(Y1, Ya + (size_t)t * rows, (size_t)rows * 4);
            }
            char what[96];
            snprintf(what, sizeof what, "%s %s decode, %d tokens: each as alone",
                     i8 ? "int8" : "int16", vnni ? "vnni" : "avx2", n);
            check(same, what, 0);
        }
    free(xa), free(x1), free(X), free(Ya), free(Y1);
    free(mem[0]), free(mem[1]), free(mem[2]);
}

int main(void) {
    lily_pool *pool = lily_pool_create(3);
    /* every kernel set this CPU runs (a cap above the CPU gives the best it has); avx512 and
     * avx2 twice: with the int16 Q4 products (DEFAULT) and with fp32 only (EXACT) */
    const lily_cpu_isa isas[] = {LILY_CPU_ISA_AVX512, LILY_CPU_ISA_AVX512, LILY_CPU_ISA_AVX512,
                                 LILY_CPU_ISA_AVX2,   LILY_CPU_ISA_AVX2,   LILY_CPU_ISA_AVX2,
                                 LILY_CPU_ISA_SCALAR};
    const lily_precision precs[] = {
        LILY_PRECISION_DEFAULT, LILY_PRECISION_EXACT, LILY_PRECISION_FAST,   LILY_PRECISION_DEFAULT,
        LILY_PRECISION_EXACT,   LILY_PRECISION_FAST,  LILY_PRECISION_DEFAULT};
    const char *pname[] = {"", " (exact: fp32)", " (fast: int8 decode)"};
    for (int i = 0; i < 7; i++) {
        const lily_precision p = precs[i];
        K = lily_cpu_kern_for(isas[i], p);
        printf("-- matmul kernels: %s%s\n", lily_cpu_kern_name(&K), pname[p]);
        check(K.i16 == (K.isa >= 1 && p != LILY_PRECISION_EXACT) && (!K.vnni || K.isa == 2) &&
                  K.i8 == (K.isa >= 1 && p == LILY_PRECISION_FAST),
              "int16 products on AVX2 and AVX-512 at DEFAULT, int8 decode at FAST", 0);
        test_matmul(pool);
        test_matmul_glu(pool);
    }
    test_i16_avx2_vs_vnni(pool);
    test_gemv_token_independence();
    K = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT);
    /* the conv and GDN bodies of every kernel set, then bit for bit against each other */
    const lily_cpu_isa caps[] = {LILY_CPU_ISA_AVX512, LILY_CPU_ISA_AVX2, LILY_CPU_ISA_SCALAR};
    for (int i = 0; i < 3; i++) {
        const lily_cpu_kern kc = lily_cpu_kern_for(caps[i], LILY_PRECISION_DEFAULT);
        KI = kc.isa;
        printf("-- conv and gdn scan: %s\n", lily_cpu_kern_name(&kc));
        test_conv();
        test_gdn();
    }
    test_scan_bodies_agree();
    test_attention(pool);
    test_misc();
    lily_pool_free(pool);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
