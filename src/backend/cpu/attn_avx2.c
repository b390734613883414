/* Causal GQA attention on AVX2 + FMA: attn.c's AVX-512 kernel with 8 query rows across the lanes
 * instead of 16 (see attn.c for the scheme: Q transposed per task, scores of 4 positions at a
 * time from broadcast K, online softmax over blocks of 64 positions, O += P V per 4 rows x 16
 * columns). The scores are those of the AVX-512 kernel bit for bit (the same sums per lane, even
 * and odd d apart); the exponential differs only below e^-87 (below). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/attn.h"

#define AV_ISA   "avx2,fma"
#define AV_LANES LILY_ATTN_AVX2_LANES

/* e^x as attn.c's exp16 (x = n ln2 + r, e^r by its Taylor series to r^7), with 2^n made in the
 * exponent field, so x is clamped to -87 (e^-87 ~ 1.6e-38, still a normal float) where exp16
 * reaches 0 at -104: a softmax weight that small is far below the fp32 resolution of the sum. */
__attribute__((target(AV_ISA), always_inline)) static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lanes below w (w <= 0: none, w >= 8: all) as a load / store mask. */
__attribute__((target(AV_ISA), always_inline)) static inline __m256i lanes_below(int w) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* O = O corr + P V for rows r0 .. r0 + 3 and the columns d0 .. d0 + 15 (w of them). */
__attribute__((target(AV_ISA), always_inline)) static inline void
pv_update(float *o, int Dh, int r0, int d0, int w, const float *cf, const float *vg, size_t kd,
          int s0, int nb, const float *pb) {
    const int full = w >= 16;
    const __m256i m0 = lanes_below(w), m1 = lanes_below(w - 8);
    __m256 acc[4][2];
    for (int r = 0; r < 4; r++) {
        float *orow = o + (size_t)(r0 + r) * Dh + d0;
        const __m256 c = _mm256_set1_ps(cf[r0 + r]);
        acc[r][0] = _mm256_mul_ps(full ? _mm256_loadu_ps(orow) : _mm256_maskload_ps(orow, m0), c);
        acc[r][1] =
            _mm256_mul_ps(full ? _mm256_loadu_ps(orow + 8) : _mm256_maskload_ps(orow + 8, m1), c);
    }
    for (int j = 0; j < nb; j++) {
        const float *vr = vg + (size_t)(s0 + j) * kd + d0;
        const float *pj = pb + (size_t)j * AV_LANES + r0;
        const __m256 v0 = full ? _mm256_loadu_ps(vr) : _mm256_maskload_ps(vr, m0);
        const __m256 v1 = full ? _mm256_loadu_ps(vr + 8) : _mm256_maskload_ps(vr + 8, m1);
        for (int r = 0; r < 4; r++) {
            const __m256 pv = _mm256_broadcast_ss(pj + r);
            acc[r][0] = _mm256_fmadd_ps(pv, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(pv, v1, acc[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) {
        float *orow = o + (size_t)(r0 + r) * Dh + d0;
        if (full) {
            _mm256_storeu_ps(orow, acc[r][0]);
            _mm256_storeu_ps(orow + 8, acc[r][1]);
        } else {
            _mm256_maskstore_ps(orow, m0, acc[r][0]);
            _mm256_maskstore_ps(orow + 8, m1, acc[r][1]);
        }
    }
}

__attribute__((target(AV_ISA))) void lily_cpu_attn_task_avx2(void *ctx, int task, int thread) {
    attn_job *a = ctx;
    const int rep = a->Nq / a->Nkv, Dh = a->Dh, qd = a->Nq * Dh;
    const size_t kd = (size_t)a->Nkv * Dh;
    const int g = task / a->chunks, c = task % a->chunks;
    const int total = a->n * rep, i0 = c * AV_LANES;
    const int nr = total - i0 < AV_LANES ? total - i0 : AV_LANES;
    float *base = a->scratch + (size_t)thread * a->stride;
    float *qt = (float *)(((uintptr_t)base + 63) & ~(uintptr_t)63); /* [Dh][8] */
    float *o = qt + (size_t)Dh * AV_LANES;                          /* [8][Dh] */
    float *pb = o + (size_t)AV_LANES * Dh;                          /* [AT_BLOCK][8] */
    /* row i: token t = (i0 + i) / rep, query head g rep + (i0 + i) % rep */
    int len[AV_LANES];
    const float *qrow[AV_LANES];
    for (int i = 0; i < AV_LANES; i++) { /* padding lanes: row 0's length, zero q */
        const int k = i < nr ? i0 + i : i0, t = k / rep;
        len[i] = a->pos + t + 1;
        qrow[i] = a->q + (size_t)t * qd + (size_t)(g * rep + k % rep) * Dh;
    }
    const int maxlen = len[nr - 1], minlen = len[0];
    const __m256i lenv = _mm256_loadu_si256((const __m256i *)len);
    for (int d = 0; d < Dh; d++) {
        float col[AV_LANES];
        for (int i = 0; i < AV_LANES; i++)
            col[i] = i < nr ? qrow[i][d] : 0.0f;
        _mm256_store_ps(qt + (size_t)d * AV_LANES, _mm256_loadu_ps(col));
    }
    memset(o, 0, (size_t)AV_LANES * Dh * sizeof(float));
    const __m256 ninf = _mm256_set1_ps(-INFINITY), scv = _mm256_set1_ps(a->scale);
    __m256 m = ninf, l = _mm256_setzero_ps();
    const float *kg = a->kc + (size_t)g * Dh, *vg = a->vc + (size_t)g * Dh;
    for (int s0 = 0; s0 < maxlen; s0 += AT_BLOCK) {
        const int nb = maxlen - s0 < AT_BLOCK ? maxlen - s0 : AT_BLOCK;
        /* scores of 4 positions at a time (rows past maxlen repeat the last: masked below) */
        for (int j0 = 0; j0 < nb; j0 += 4) {
            const float *kr[4];
            for (int j = 0; j < 4; j++) {
                const int s = s0 + j0 + j < maxlen ? s0 + j0 + j : maxlen - 1;
                kr[j] = kg + (size_t)s * kd;
            }
            /* two sums per score (even and odd d), as attn.c */
            __m256 acc[2][4];
            for (int j = 0; j < 4; j++)
                acc[0][j] = acc[1][j] = _mm256_setzero_ps();
            int d = 0;
            for (; d + 2 <= Dh; d += 2)
                for (int h = 0; h < 2; h++) {
                    const __m256 qv = _mm256_load_ps(qt + (size_t)(d + h) * AV_LANES);
                    for (int j = 0; j < 4; j++)
                        acc[h][j] =
                            _mm256_fmadd_ps(qv, _mm256_broadcast_ss(kr[j] + d + h), acc[h][j]);
                }
            if (d < Dh) {
                const __m256 qv = _mm256_load_ps(qt + (size_t)d * AV_LANES);
                for (int j = 0; j < 4; j++)
                    acc[0][j] = _mm256_fmadd_ps(qv, _mm256_broadcast_ss(kr[j] + d), acc[0][j]);
            }
            for (int j = 0; j < 4; j++) {
                const int s = s0 + j0 + j;
                __m256 v = _mm256_mul_ps(_mm256_add_ps(acc[0][j], acc[1][j]), scv);
                if (s >= minlen) /* causal: lane i sees positions < len[i] */
                    v = _mm256_blendv_ps(
                        ninf, v,
                        _mm256_castsi256_ps(_mm256_cmpgt_epi32(lenv, _mm256_set1_epi32(s))));
                _mm256_store_ps(pb + (size_t)(j0 + j) * AV_LANES, v); /* j0 + j < AT_BLOCK */
            }
        }
        __m256 mb = m;
        for (int j = 0; j < nb; j++)
            mb = _mm256_max_ps(mb, _mm256_load_ps(pb + (size_t)j * AV_LANES));
        /* every lane sees position 0 in the first block, so mb is finite from there on */
        const __m256 corr = exp8(_mm256_sub_ps(m, mb));
        l = _mm256_mul_ps(l, corr);
        for (int j = 0; j < nb; j++) {
            float *pj = pb + (size_t)j * AV_LANES;
            const __m256 sv = _mm256_load_ps(pj);
            const __m256 ok = _mm256_cmp_ps(sv, ninf, _CMP_NEQ_OQ);
            const __m256 p = _mm256_and_ps(ok, exp8(_mm256_sub_ps(sv, mb)));
            l = _mm256_add_ps(l, p);
            _mm256_store_ps(pj, p);
        }
        m = mb;
        float cf[AV_LANES];
        _mm256_storeu_ps(cf, corr);
        for (int r0 = 0; r0 < nr; r0 += 4)
            for (int d0 = 0; d0 < Dh; d0 += 16)
                pv_update(o, Dh, r0, d0, Dh - d0, cf, vg, kd, s0, nb, pb);
    }
    float li[AV_LANES];
    _mm256_storeu_ps(li, l);
    for (int i = 0; i < nr; i++) {
        const int k = i0 + i, t = k / rep;
        float *dst = a->out + (size_t)t * qd + (size_t)(g * rep + k % rep) * Dh;
        const float inv = 1.0f / li[i];
        const float *src = o + (size_t)i * Dh;
        for (int d = 0; d < Dh; d++)
            dst[d] = src[d] * inv;
    }
}
