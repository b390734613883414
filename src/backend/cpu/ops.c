/* CPU reference operators (see ops.h): norms, RoPE, causal conv, the GDN recurrence, attention
 * and routing. The matmul lives in matmul.c. Everything here is fp32 and plain C; the costly
 * loops are simple enough for the compiler to vectorise. */
#include "backend/cpu/ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/err.h"

/* Hot loops are compiled for AVX-512, AVX2 and the baseline; the loader picks one at run time. */

float lily_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0) {
        if (man == 0) {
            v.u = sign;
            return v.f;
        }
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (man << 13);
    else
        v.u = sign | ((exp + 112u) << 23) | (man << 13);
    return v.f;
}

void lily_mat_row_f32(const lily_mat *W, int r, float *out) {
    int cols = W->cols;
    switch (W->dt) {
    case LILY_DT_F32:
        memcpy(out, (const float *)W->w + (size_t)r * cols, (size_t)cols * sizeof(float));
        return;
    case LILY_DT_BF16: {
        const uint16_t *p = (const uint16_t *)W->w + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            out[c] = lily_bf16_to_f32(p[c]);
        return;
    }
    case LILY_DT_F16: {
        const uint16_t *p = (const uint16_t *)W->w + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            out[c] = lily_f16_to_f32(p[c]);
        return;
    }
    case LILY_DT_Q4:
    case LILY_DT_Q8: {
        int bits = W->dt == LILY_DT_Q4 ? 4 : 8;
        int ng = cols / W->group;
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols * bits / 8;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        for (int g = 0; g < ng; g++) {
            float s = lily_bf16_to_f32(sc[g]), b = lily_bf16_to_f32(bi[g]);
            float *o = out + (size_t)g * W->group;
            if (bits == 4) {
                const uint8_t *qg = q + (size_t)g * W->group / 2;
                for (int i = 0; i < W->group / 2; i++) {
                    o[2 * i] = s * (float)(qg[i] & 15) + b;
                    o[2 * i + 1] = s * (float)(qg[i] >> 4) + b;
                }
            } else {
                const uint8_t *qg = q + (size_t)g * W->group;
                for (int i = 0; i < W->group; i++)
                    o[i] = s * (float)qg[i] + b;
            }
        }
        return;
    }
    }
    LILY_ASSERT(!"unknown dtype");
}

void lily_cpu_rmsnorm(const float *x, const float *w, int n, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * r * w[i];
}

void lily_cpu_rope(float *x, int rot, int pos, double theta) {
    /* Same arithmetic as the reference: inv_freq = 1 / theta^(2i/rot) in fp32, angle = pos *
     * inv_freq in fp32, cos/sin in fp32. */
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot);
        float ang = (float)pos * inv;
        float c = cosf(ang), s = sinf(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

LILY_SIMD_CLONES void lily_cpu_conv_silu(const float *in, int n, int C, int K, float *state,
                                         const float *w, float *out) {
    for (int t = 0; t < n; t++) {
        const float *cur = in + (size_t)t * C;
        float *o = out + (size_t)t * C;
        for (int ch = 0; ch < C; ch++) {
            const float *wc = w + (size_t)ch * K;
            float acc = wc[K - 1] * cur[ch];
            /* tap tau (0..K-2) multiplies input t-(K-1)+tau: from the state or earlier rows */
            for (int tau = 0; tau < K - 1; tau++) {
                int src = t - (K - 1) + tau;
                float v =
                    src >= 0 ? in[(size_t)src * C + ch] : state[(size_t)(K - 1 + src) * C + ch];
                acc += wc[tau] * v;
            }
            o[ch] = lily_silu(acc);
        }
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

LILY_SIMD_CLONES void lily_cpu_gdn_scan(float *S, int Dk, int Dv, int n, const float *q, int ldq,
                                        const float *k, int ldk, const float *v, int ldv,
                                        const float *beta, const float *lambda, int ldg, float *o,
                                        int ldo) {
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

void lily_cpu_topk_softmax(const float *logits, int E, int k, int norm, int *idx, float *wt) {
    float mx = -FLT_MAX;
    for (int e = 0; e < E; e++)
        if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int e = 0; e < E; e++)
        sum += exp((double)logits[e] - mx);
    /* top-k by logit (same order as by probability); ties go to the lower id */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (taken) continue;
            if (best < 0 || logits[e] > logits[best]) best = e;
        }
        idx[j] = best;
        wt[j] = (float)(exp((double)logits[best] - mx) / sum);
    }
    if (norm) {
        float s = 0;
        for (int j = 0; j < k; j++)
            s += wt[j];
        for (int j = 0; j < k; j++)
            wt[j] /= s;
    }
}
