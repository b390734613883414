/* The causal conv and the Gated DeltaNet recurrence (see ops.h): plain C loops the compiler
 * vectorises (elementwise over channels and value columns: no reassociation, so every body gives
 * the same results), compiled for AVX-512, AVX2 + FMA and the baseline and picked by the kernel
 * set (the _isa entry points) or by the CPU. */
#include <string.h>

#include "backend/cpu/ops.h"
#include "base/err.h"

#define SC_AVX512 "avx512f,avx512bw,avx512vl"
#define SC_AVX2   "avx2,fma"

static inline __attribute__((always_inline)) void
conv_body(const float *in, int n, int C, int K, float *state, const float *w, float *out) {
    /* taps outermost, so the loops over channels vectorise (each channel's sum keeps its order:
     * the current input's tap, then taps 0 .. K-2) */
    for (int t = 0; t < n; t++) {
        const float *cur = in + (size_t)t * C;
        float *o = out + (size_t)t * C;
        for (int ch = 0; ch < C; ch++)
            o[ch] = w[(size_t)ch * K + K - 1] * cur[ch];
        /* tap tau (0..K-2) multiplies input t-(K-1)+tau: from the state or earlier rows */
        for (int tau = 0; tau < K - 1; tau++) {
            const int src = t - (K - 1) + tau;
            const float *row = src >= 0 ? in + (size_t)src * C : state + (size_t)(K - 1 + src) * C;
            for (int ch = 0; ch < C; ch++)
                o[ch] += w[(size_t)ch * K + tau] * row[ch];
        }
        for (int ch = 0; ch < C; ch++)
            o[ch] = lily_silu(o[ch]);
    }
    /* new state: the last K-1 inputs of (old state ++ in) */
    for (int j = 0; j < K - 1; j++) {
        int src = n - (K - 1) + j; /* index into in; negative = old state */
        if (src < 0) {
            if (src + (K - 1) != j) /* shift older state entries down */
                memmove(state + (size_t)j * C, state + (size_t)(src + K - 1) * C,
                        (size_t)C * sizeof(float));
        } else {
            memcpy(state + (size_t)j * C, in + (size_t)src * C, (size_t)C * sizeof(float));
        }
    }
}

static inline __attribute__((always_inline)) void gdn_body(float *S, int Dk, int Dv, int n,
                                                           const float *q, int ldq, const float *k,
                                                           int ldk, const float *v, int ldv,
                                                           const float *beta, const float *lambda,
                                                           int ldg, float *o, int ldo) {
    float m[512], buf[2][512];
    LILY_ASSERT(Dv <= 512);
    if (n <= 0) return;
    /* With S' = lam S + k d^T and d = beta (v - lam S^T k), the read-out is
     * o = S'^T q = lam S^T q + (k.q) d, so S^T k and S^T q of a token come from one read of the
     * state; and the pass that writes S' also reads S'^T k and S'^T q of the next token while
     * the rows are in registers: one read + one write of the state per token (the state is 64 KB
     * per head at the model's 128 x 128, in L2). Same sums in the same order as two passes. */
    float *d = buf[0], *dn = buf[1]; /* S^T q of the token; then its d */
    for (int j = 0; j < Dv; j++)
        m[j] = 0, d[j] = 0; /* m = S^T k */
    for (int i = 0; i < Dk; i++) {
        const float *Si = S + (size_t)i * Dv;
        float ki = k[i], qi = q[i];
        for (int j = 0; j < Dv; j++) {
            m[j] += Si[j] * ki;
            d[j] += Si[j] * qi;
        }
    }
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * ldq, *kt = k + (size_t)t * ldk;
        const float *vt = v + (size_t)t * ldv;
        float *ot = o + (size_t)t * ldo;
        float lam = lambda[(size_t)t * ldg], bt = beta[(size_t)t * ldg];
        float kq = 0;
        for (int i = 0; i < Dk; i++)
            kq += kt[i] * qt[i];
        for (int j = 0; j < Dv; j++) {
            float dj = bt * (vt[j] - lam * m[j]);
            ot[j] = lam * d[j] + kq * dj;
            d[j] = dj;
        }
        if (t + 1 == n) {
            for (int i = 0; i < Dk; i++) {
                float *Si = S + (size_t)i * Dv;
                float ki = kt[i];
                for (int j = 0; j < Dv; j++)
                    Si[j] = lam * Si[j] + ki * d[j];
            }
            break;
        }
        const float *qn = qt + ldq, *kn = kt + ldk;
        for (int j = 0; j < Dv; j++)
            m[j] = 0, dn[j] = 0;
        for (int i = 0; i < Dk; i++) {
            float *Si = S + (size_t)i * Dv;
            float ki = kt[i], kni = kn[i], qni = qn[i];
            for (int j = 0; j < Dv; j++) {
                float sij = lam * Si[j] + ki * d[j];
                Si[j] = sij;
                m[j] += sij * kni;
                dn[j] += sij * qni;
            }
        }
        float *sw = d;
        d = dn, dn = sw;
    }
}

__attribute__((target(SC_AVX512))) static void
conv_avx512(const float *in, int n, int C, int K, float *state, const float *w, float *out) {
    conv_body(in, n, C, K, state, w, out);
}
__attribute__((target(SC_AVX2))) static void conv_avx2(const float *in, int n, int C, int K,
                                                       float *state, const float *w, float *out) {
    conv_body(in, n, C, K, state, w, out);
}
static void conv_plain(const float *in, int n, int C, int K, float *state, const float *w,
                       float *out) {
    conv_body(in, n, C, K, state, w, out);
}

void lily_cpu_conv_silu_isa(int isa, const float *in, int n, int C, int K, float *state,
                            const float *w, float *out) {
    (isa >= 2 ? conv_avx512 : isa == 1 ? conv_avx2 : conv_plain)(in, n, C, K, state, w, out);
}

void lily_cpu_conv_silu(const float *in, int n, int C, int K, float *state, const float *w,
                        float *out) {
    const lily_cpu_kern k = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT);
    lily_cpu_conv_silu_isa(k.isa, in, n, C, K, state, w, out);
}

#define SC_GDN_ARGS                                                                         \
    float *S, int Dk, int Dv, int n, const float *q, int ldq, const float *k, int ldk,      \
        const float *v, int ldv, const float *beta, const float *lambda, int ldg, float *o, \
        int ldo
#define SC_GDN_PASS S, Dk, Dv, n, q, ldq, k, ldk, v, ldv, beta, lambda, ldg, o, ldo

__attribute__((target(SC_AVX512))) static void gdn_avx512(SC_GDN_ARGS) {
    gdn_body(SC_GDN_PASS);
}
__attribute__((target(SC_AVX2))) static void gdn_avx2(SC_GDN_ARGS) {
    gdn_body(SC_GDN_PASS);
}
static void gdn_plain(SC_GDN_ARGS) {
    gdn_body(SC_GDN_PASS);
}

void lily_cpu_gdn_scan_isa(int isa, SC_GDN_ARGS) {
    (isa >= 2 ? gdn_avx512 : isa == 1 ? gdn_avx2 : gdn_plain)(SC_GDN_PASS);
}

void lily_cpu_gdn_scan(SC_GDN_ARGS) {
    const lily_cpu_kern kk = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_DEFAULT);
    lily_cpu_gdn_scan_isa(kk.isa, SC_GDN_PASS);
}
