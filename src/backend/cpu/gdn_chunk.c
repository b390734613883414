/* Gated DeltaNet recurrence in the chunked form (see ops.h, lily_cpu_gdn_chunked).
 *
 * Within a chunk of c tokens starting from state S0, with g_t = sum of log(lambda) over the
 * chunk's tokens up to t (so exp(g_t - g_s) is the decay from s to t, <= 1 for s <= t):
 *     d_t = beta_t (v_t - exp(g_t) S0^T k_t - sum_{s<t} exp(g_t - g_s) (k_t.k_s) d_s)
 *     o_t = exp(g_t) S0^T q_t + sum_{s<=t} exp(g_t - g_s) (q_t.k_s) d_s
 *     S   = exp(g_c) S0 + sum_s exp(g_c - g_s) k_s d_s^T
 * which unrolls the per-token update S_t = lambda_t S_{t-1} + k_t d_t^T with
 * d_t = beta_t (v_t - lambda_t S_{t-1}^T k_t). The state is read twice (S0^T k, S0^T q for all
 * the chunk's tokens: matrix products) and written once per chunk instead of per token; what is
 * left sequential is the c x c forward substitution for d, over vectors of Dv.
 *
 * This is the reference of the chunked GDN prefill the CUDA backend is to get (issue 5: the
 * sequential scan is latency-bound there, 18 % of a 4096-token chunk on the H200); the CPU
 * backend keeps lily_cpu_gdn_scan, which this form does not beat on the CPU (128 x 128 head,
 * 512 tokens, one core: chunk 16 about equal, 64 and 128 slower). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "base/err.h"

/* One chunk of c tokens (rows of q, k, v, o at their strides), S updated in place. w: scratch of
 * c doubles, then 2 c Dv + 2 c c floats. The log-decay sums stay in double: with strong decay
 * they reach hundreds, and a float difference g_t - g_s of nearby tokens would lose ~1e-5. */
static void gdn_chunk(float *S, int Dk, int Dv, int c, const float *q, int ldq, const float *k,
                      int ldk, const float *v, int ldv, const float *beta, const float *lambda,
                      int ldg, float *o, int ldo, void *w) {
    double *g = w;
    float *D = (float *)(g + c), *QS = D + (size_t)c * Dv, *KK = QS + (size_t)c * Dv;
    float *QK = KK + (size_t)c * c;
    double acc = 0;
    for (int t = 0; t < c; t++) { /* log-decay prefix sums; lambda = 0 acts as a full reset */
        float lam = lambda[(size_t)t * ldg];
        acc += lam > 1e-30f ? log((double)lam) : -69.0;
        g[t] = acc;
    }
    /* D <- S0^T k_t (temporarily), QS <- S0^T q_t */
    for (int t = 0; t < c; t++) {
        float *dt = D + (size_t)t * Dv, *qs = QS + (size_t)t * Dv;
        const float *kt = k + (size_t)t * ldk, *qt = q + (size_t)t * ldq;
        for (int j = 0; j < Dv; j++) dt[j] = 0, qs[j] = 0;
        for (int i = 0; i < Dk; i++) {
            const float *Si = S + (size_t)i * Dv;
            float ki = kt[i], qi = qt[i];
            for (int j = 0; j < Dv; j++) dt[j] += Si[j] * ki, qs[j] += Si[j] * qi;
        }
    }
    /* KK[t][s] = exp(g_t - g_s) k_t.k_s (s < t), QK[t][s] = exp(g_t - g_s) q_t.k_s (s <= t) */
    for (int t = 0; t < c; t++) {
        const float *kt = k + (size_t)t * ldk, *qt = q + (size_t)t * ldq;
        for (int s = 0; s <= t; s++) {
            const float *ks = k + (size_t)s * ldk;
            float kk = 0, qk = 0;
            for (int i = 0; i < Dk; i++) kk += kt[i] * ks[i], qk += qt[i] * ks[i];
            float dec = (float)exp(g[t] - g[s]);
            KK[(size_t)t * c + s] = s < t ? kk * dec : 0.f;
            QK[(size_t)t * c + s] = qk * dec;
        }
    }
    /* forward substitution: d_t from the earlier d_s */
    for (int t = 0; t < c; t++) {
        float *dt = D + (size_t)t * Dv;
        const float *vt = v + (size_t)t * ldv;
        float bt = beta[(size_t)t * ldg], gt = (float)exp(g[t]);
        for (int j = 0; j < Dv; j++) dt[j] = vt[j] - gt * dt[j];
        for (int s = 0; s < t; s++) {
            const float *ds = D + (size_t)s * Dv;
            float a = KK[(size_t)t * c + s];
            for (int j = 0; j < Dv; j++) dt[j] -= a * ds[j];
        }
        for (int j = 0; j < Dv; j++) dt[j] *= bt;
    }
    /* outputs */
    for (int t = 0; t < c; t++) {
        float *ot = o + (size_t)t * ldo;
        const float *qs = QS + (size_t)t * Dv;
        float gt = (float)exp(g[t]);
        for (int j = 0; j < Dv; j++) ot[j] = gt * qs[j];
        for (int s = 0; s <= t; s++) {
            const float *ds = D + (size_t)s * Dv;
            float a = QK[(size_t)t * c + s];
            for (int j = 0; j < Dv; j++) ot[j] += a * ds[j];
        }
    }
    /* state: S = exp(g_c) S0 + sum_s exp(g_c - g_s) k_s d_s^T */
    double glast = g[c - 1];
    float gl = (float)exp(glast);
    for (int i = 0; i < Dk; i++) {
        float *Si = S + (size_t)i * Dv;
        for (int j = 0; j < Dv; j++) Si[j] *= gl;
    }
    for (int s = 0; s < c; s++) {
        const float *ks = k + (size_t)s * ldk, *ds = D + (size_t)s * Dv;
        float dec = (float)exp(glast - g[s]);
        for (int i = 0; i < Dk; i++) {
            float *Si = S + (size_t)i * Dv;
            float f = ks[i] * dec;
            for (int j = 0; j < Dv; j++) Si[j] += f * ds[j];
        }
    }
}

size_t lily_cpu_gdn_chunked_scratch(int Dv, int chunk) {
    return (size_t)chunk * sizeof(double) +
           ((size_t)2 * chunk * Dv + (size_t)2 * chunk * chunk) * sizeof(float);
}

void lily_cpu_gdn_chunked(float *S, int Dk, int Dv, int n, const float *q, int ldq,
                          const float *k, int ldk, const float *v, int ldv, const float *beta,
                          const float *lambda, int ldg, float *o, int ldo, int chunk,
                          void *scratch) {
    LILY_ASSERT(chunk >= 1);
    for (int t0 = 0; t0 < n; t0 += chunk) {
        int c = n - t0 < chunk ? n - t0 : chunk;
        gdn_chunk(S, Dk, Dv, c, q + (size_t)t0 * ldq, ldq, k + (size_t)t0 * ldk, ldk,
                  v + (size_t)t0 * ldv, ldv, beta + (size_t)t0 * ldg, lambda + (size_t)t0 * ldg,
                  ldg, o + (size_t)t0 * ldo, ldo, scratch);
    }
}
