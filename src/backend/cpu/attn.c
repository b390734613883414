/* Causal GQA attention over the fp32 KV cache (see ops.h).
 *
 * AVX-512 (the default where the CPU has it): a task takes up to 16 query rows of one KV head
 * (token-major: rows (t, r) of the group's rep heads, so a prefill task holds 16 / rep tokens
 * and every K and V row it loads serves all of them) and keeps them across the vector lanes:
 *  - Q transposed once per task into Qt [Dh][16];
 *  - S for 8 positions at a time: per d one load of Qt[d] and 8 FMAs with K[s][d] broadcast
 *    (no horizontal sums, no K transpose);
 *  - softmax per lane, online over blocks of 64 positions (flash style: running max and sum,
 *    O rescaled as it is loaded), the exponential by a polynomial (error < 2 ulp, below);
 *  - O += P V per 4 rows x 64 columns (16 accumulators), V rows of the block read from L1/L2.
 * One pass over K and V, scratch independent of the context. AVX2 (attn_avx2.c): the same with 8
 * query rows across the lanes. The plain kernel (one token and KV head per task, a 256-long dot
 * product per row and position, each ending in a horizontal sum) is the reference. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/attn.h"
#include "backend/cpu/ops.h"
#include "base/err.h"

#define AT_ISA   "avx512f,avx512bw,avx512vl,avx512dq"
#define AT_LANES 16 /* query rows per task (vector lanes) */

size_t lily_cpu_attention_scratch(int Nq, int Nkv, int Dh, int ctx) {
    size_t rep = (size_t)(Nkv > 0 ? Nq / Nkv : 1);
    size_t generic = rep * (size_t)ctx;
    size_t lanes = (size_t)2 * AT_LANES * (size_t)Dh + (size_t)AT_BLOCK * AT_LANES;
    return (generic > lanes ? generic : lanes) + 16; /* + 16: per-thread 64-byte alignment */
}

/* ---- plain kernel: one query token and one KV head -------------------------------------------- */

/* All rep = Nq/Nkv query heads of the group are done together, so each K and V row is loaded once
 * per group instead of once per head (GQA packing). */
LILY_SIMD_CLONES static void attn_task(void *ctx, int task, int thread) {
    attn_job *a = ctx;
    int rep = a->Nq / a->Nkv, clen = a->pos + a->n;
    int t = task / a->Nkv, g = task % a->Nkv;
    int len = a->pos + t + 1; /* causal: positions 0..pos+t */
    int qd = a->Nq * a->Dh, kd = a->Nkv * a->Dh, Dh = a->Dh;
    float *p = a->scratch + (size_t)thread * a->stride; /* [rep][clen] */
    float mx[64], inv[64];
    for (int r = 0; r < rep; r++)
        mx[r] = -FLT_MAX;
    for (int s = 0; s < len; s++) {
        const float *kv = a->kc + (size_t)s * kd + (size_t)g * Dh;
        for (int r = 0; r < rep; r++) {
            const float *qv = a->q + (size_t)t * qd + (size_t)(g * rep + r) * Dh;
            /* 16 independent partial sums: the compiler vectorises this without reassociating */
            float part[16] = {0};
            int i = 0;
            for (; i + 16 <= Dh; i += 16)
                for (int l = 0; l < 16; l++)
                    part[l] += qv[i + l] * kv[i + l];
            float dot = 0;
            for (; i < Dh; i++)
                dot += qv[i] * kv[i];
            for (int l = 0; l < 16; l++)
                dot += part[l];
            float sc = dot * a->scale;
            p[(size_t)r * clen + s] = sc;
            if (sc > mx[r]) mx[r] = sc;
        }
    }
    for (int r = 0; r < rep; r++) {
        float *pr = p + (size_t)r * clen, sum = 0;
        for (int s = 0; s < len; s++) {
            pr[s] = expf(pr[s] - mx[r]);
            sum += pr[s];
        }
        inv[r] = 1.0f / sum;
        float *o = a->out + (size_t)t * qd + (size_t)(g * rep + r) * Dh;
        for (int i = 0; i < Dh; i++)
            o[i] = 0;
    }
    for (int s = 0; s < len; s++) {
        const float *vv = a->vc + (size_t)s * kd + (size_t)g * Dh;
        for (int r = 0; r < rep; r++) {
            float w = p[(size_t)r * clen + s] * inv[r];
            float *o = a->out + (size_t)t * qd + (size_t)(g * rep + r) * Dh;
            for (int i = 0; i < Dh; i++)
                o[i] += w * vv[i];
        }
    }
}

/* ---- AVX-512 kernel: 16 query rows of one KV head across the lanes ---------------------------- */

/* e^x for x <= ~88: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its Taylor series to
 * r^7 (truncation < 3e-9 relative), times 2^n by vscalefps (0 below ~-104). */
__attribute__((target(AT_ISA), always_inline)) static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

__attribute__((target(AT_ISA))) static void attn_task16(void *ctx, int task, int thread) {
    attn_job *a = ctx;
    const int rep = a->Nq / a->Nkv, Dh = a->Dh, qd = a->Nq * Dh, kd = a->Nkv * Dh;
    const int g = task / a->chunks, c = task % a->chunks;
    const int total = a->n * rep, i0 = c * AT_LANES;
    const int nr = total - i0 < AT_LANES ? total - i0 : AT_LANES;
    float *base = a->scratch + (size_t)thread * a->stride;
    float *qt = (float *)(((uintptr_t)base + 63) & ~(uintptr_t)63); /* [Dh][16] */
    float *o = qt + (size_t)Dh * AT_LANES;                          /* [16][Dh] */
    float *pb = o + (size_t)AT_LANES * Dh;                          /* [AT_BLOCK][16] */
    /* row i: token t = (i0 + i) / rep, query head g rep + (i0 + i) % rep */
    int len[AT_LANES];
    const float *qrow[AT_LANES];
    for (int i = 0; i < AT_LANES; i++) { /* padding lanes: row 0's length, zero q */
        const int k = i < nr ? i0 + i : i0, t = k / rep;
        len[i] = a->pos + t + 1;
        qrow[i] = a->q + (size_t)t * qd + (size_t)(g * rep + k % rep) * Dh;
    }
    const int maxlen = len[nr - 1], minlen = len[0];
    const __m512i lenv = _mm512_loadu_si512(len);
    for (int d = 0; d < Dh; d++) {
        float col[AT_LANES];
        for (int i = 0; i < AT_LANES; i++)
            col[i] = i < nr ? qrow[i][d] : 0.0f;
        _mm512_store_ps(qt + (size_t)d * AT_LANES, _mm512_loadu_ps(col));
    }
    memset(o, 0, (size_t)AT_LANES * Dh * sizeof(float));
    __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
    const float *kg = a->kc + (size_t)g * Dh, *vg = a->vc + (size_t)g * Dh;
    for (int s0 = 0; s0 < maxlen; s0 += AT_BLOCK) {
        const int nb = maxlen - s0 < AT_BLOCK ? maxlen - s0 : AT_BLOCK;
        /* scores of 8 positions at a time (rows past maxlen repeat the last: masked below) */
        for (int j0 = 0; j0 < nb; j0 += 8) {
            const float *kr[8];
            for (int j = 0; j < 8; j++) {
                const int s = s0 + j0 + j < maxlen ? s0 + j0 + j : maxlen - 1;
                kr[j] = kg + (size_t)s * kd;
            }
            /* two sums per score (even and odd d): shorter chains, half the rounding growth */
            __m512 acc[2][8];
            for (int j = 0; j < 8; j++)
                acc[0][j] = acc[1][j] = _mm512_setzero_ps();
            int d = 0;
            for (; d + 2 <= Dh; d += 2)
                for (int h = 0; h < 2; h++) {
                    const __m512 qv = _mm512_load_ps(qt + (size_t)(d + h) * AT_LANES);
                    for (int j = 0; j < 8; j++)
                        acc[h][j] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[j][d + h]), acc[h][j]);
                }
            if (d < Dh) {
                const __m512 qv = _mm512_load_ps(qt + (size_t)d * AT_LANES);
                for (int j = 0; j < 8; j++)
                    acc[0][j] = _mm512_fmadd_ps(qv, _mm512_set1_ps(kr[j][d]), acc[0][j]);
            }
            const __m512 scv = _mm512_set1_ps(a->scale);
            for (int j = 0; j < 8; j++) {
                const int s = s0 + j0 + j;
                __m512 v = _mm512_mul_ps(_mm512_add_ps(acc[0][j], acc[1][j]), scv);
                if (s >= minlen) /* causal: lane i sees positions < len[i] */
                    v = _mm512_mask_blend_ps(_mm512_cmpgt_epi32_mask(lenv, _mm512_set1_epi32(s)),
                                             _mm512_set1_ps(-INFINITY), v);
                _mm512_store_ps(pb + (size_t)(j0 + j) * AT_LANES, v); /* j0 + j < AT_BLOCK */
            }
        }
        __m512 mb = m;
        for (int j = 0; j < nb; j++)
            mb = _mm512_max_ps(mb, _mm512_load_ps(pb + (size_t)j * AT_LANES));
        /* every lane sees position 0 in the first block, so mb is finite from there on (and
         * the first corr, e^-inf, is 0) */
        const __m512 corr = exp16(_mm512_sub_ps(m, mb));
        l = _mm512_mul_ps(l, corr);
        for (int j = 0; j < nb; j++) {
            float *pj = pb + (size_t)j * AT_LANES;
            const __m512 sv = _mm512_load_ps(pj);
            const __mmask16 ok = _mm512_cmp_ps_mask(sv, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
            const __m512 p = _mm512_maskz_mov_ps(ok, exp16(_mm512_sub_ps(sv, mb)));
            l = _mm512_add_ps(l, p);
            _mm512_store_ps(pj, p);
        }
        m = mb;
        float cf[AT_LANES];
        _mm512_storeu_ps(cf, corr);
        /* O = O corr + P V: 4 rows x 64 columns per pass over the block's V rows */
        for (int r0 = 0; r0 < nr; r0 += 4)
            for (int d0 = 0; d0 < Dh; d0 += 64) {
                const int w = Dh - d0 < 64 ? Dh - d0 : 64, nv = (w + 15) / 16;
                __mmask16 tail = (__mmask16)(w % 16 ? (1u << (w % 16)) - 1 : 0xFFFF);
                __m512 acc[4][4];
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < 4; v++) {
                        const __mmask16 mk = v < nv ? (v == nv - 1 ? tail : 0xFFFF) : 0;
                        acc[r][v] = _mm512_mul_ps(
                            _mm512_maskz_loadu_ps(mk, o + (size_t)(r0 + r) * Dh + d0 + 16 * v),
                            _mm512_set1_ps(cf[r0 + r]));
                    }
                for (int j = 0; j < nb; j++) {
                    const float *vr = vg + (size_t)(s0 + j) * kd + d0;
                    const float *pj = pb + (size_t)j * AT_LANES + r0;
                    __m512 vv[4];
                    for (int v = 0; v < 4; v++) {
                        const __mmask16 mk = v < nv ? (v == nv - 1 ? tail : 0xFFFF) : 0;
                        vv[v] = _mm512_maskz_loadu_ps(mk, vr + 16 * v);
                    }
                    for (int r = 0; r < 4; r++) {
                        const __m512 pv = _mm512_set1_ps(pj[r]);
                        for (int v = 0; v < 4; v++)
                            acc[r][v] = _mm512_fmadd_ps(pv, vv[v], acc[r][v]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int v = 0; v < 4; v++) {
                        const __mmask16 mk = v < nv ? (v == nv - 1 ? tail : 0xFFFF) : 0;
                        _mm512_mask_storeu_ps(o + (size_t)(r0 + r) * Dh + d0 + 16 * v, mk,
                                              acc[r][v]);
                    }
            }
    }
    float li[AT_LANES];
    _mm512_storeu_ps(li, l);
    for (int i = 0; i < nr; i++) {
        const int k = i0 + i, t = k / rep;
        float *dst = a->out + (size_t)t * qd + (size_t)(g * rep + k % rep) * Dh;
        const float inv = 1.0f / li[i];
        const float *src = o + (size_t)i * Dh;
        for (int d = 0; d < Dh; d++)
            dst[d] = src[d] * inv;
    }
}

void lily_cpu_attention(const lily_cpu_kern *k, const float *q, int n, int pos, const float *kc,
                        const float *vc, int Nq, int Nkv, int Dh, float scale, float *out,
                        float *scratch, lily_pool *pool) {
    LILY_ASSERT(Nq % Nkv == 0 && Nq / Nkv <= 64);
    attn_job a = {q,  kc,  vc, out,   n,       pos,
                  Nq, Nkv, Dh, scale, scratch, lily_cpu_attention_scratch(Nq, Nkv, Dh, pos + n),
                  0};
    lily_task_fn fn = attn_task;
    int tasks = n * Nkv;
    if (k->isa >= 2) {
        a.chunks = (n * (Nq / Nkv) + AT_LANES - 1) / AT_LANES;
        fn = attn_task16;
        tasks = a.chunks * Nkv;
    } else if (k->isa == 1) {
        a.chunks = (n * (Nq / Nkv) + LILY_ATTN_AVX2_LANES - 1) / LILY_ATTN_AVX2_LANES;
        fn = lily_cpu_attn_task_avx2;
        tasks = a.chunks * Nkv;
    }
    if (pool)
        lily_pool_run(pool, fn, &a, tasks);
    else
        for (int i = 0; i < tasks; i++)
            fn(&a, i, 0);
}
