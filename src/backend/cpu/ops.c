/* CPU reference operators (see ops.h): norms, RoPE and routing. The matmul lives in matmul.c,
 * attention in attn.c, the causal conv and the GDN recurrence in scan.c. Everything here is fp32
 * and plain C. */
#include "backend/cpu/ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/err.h"

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
