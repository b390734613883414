/* The Q4 decode product with 8-bit activations (see gemv_i8.h): AVX-512 VNNI and AVX2 bodies. */
#include "backend/cpu/gemv_i8.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"

#define G8_VNNI       "avx512f,avx512bw,avx512vl,avx512vnni"
#define G8_AVX2       "avx2,fma"
#define G8_MAX_GROUPS (LILY_GEMV_I8_MAX_COLS / 64)
#define G8_PREFETCH   4096 /* bytes ahead of the row being read (gemv_i16.c says why) */

int lily_cpu_gemv_i8_vnni_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* xq, per token (tok_stride bytes): per block of 128 columns 128 bytes of codes [even | odd];
 * then per group (2 nb of them; 0 for a missing last group) fp32: the scale sx, the exact sum of
 * x, and sum x - sx sum c. */
static size_t n_blocks(int cols) {
    return ((size_t)cols + 127) / 128;
}
static size_t tok_stride(int cols) {
    size_t nb = n_blocks(cols);
    return nb * 128 + ((nb * 24 + 63) & ~(size_t)63);
}

size_t lily_cpu_gemv_i8_x_bytes(int n, int cols) {
    return (size_t)n * tok_stride(cols);
}

/* The missing half of an odd last group's block: zero codes, scale and sums. */
static void zero_tail(uint8_t *d, int ng, size_t nb, float *sx, float *xsum, float *dq) {
    if (!(ng & 1)) return;
    uint8_t *last = d + (nb - 1) * 128;
    memset(last + 32, 0, 32);
    memset(last + 96, 0, 32);
    sx[ng] = xsum[ng] = dq[ng] = 0.0f;
}

/* ---- AVX-512 VNNI ----------------------------------------------------------------------------- */

__attribute__((target(G8_VNNI))) static void quant_vnni(const float *X, int n, int ldx, int cols,
                                                        void *xq) {
    const int ng = cols / 64;
    const size_t nb = n_blocks(cols), ts = tok_stride(cols);
    /* per 128-bit lane (16 columns): the 8 even columns' bytes, then the 8 odd ones' */
    const __m512i split =
        _mm512_set_epi8(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0, 15, 13, 11, 9, 7, 5,
                        3, 1, 14, 12, 10, 8, 6, 4, 2, 0, 15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8,
                        6, 4, 2, 0, 15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    /* even halves of the four lanes into the low 256 bits, odd halves into the high */
    const __m512i gather = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    const __m512i lim = _mm512_set1_epi32(LILY_GEMV_I8_CODE_MAX);
    const __m512i nlim = _mm512_set1_epi32(-LILY_GEMV_I8_CODE_MAX);
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * ldx;
        uint8_t *d = (uint8_t *)xq + (size_t)t * ts;
        float *sx = (float *)(d + nb * 128), *xsum = sx + 2 * nb, *dq = xsum + 2 * nb;
        zero_tail(d, ng, nb, sx, xsum, dq);
        for (int g = 0; g < ng; g++) {
            __m512 v[4], m = _mm512_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm512_loadu_ps(x + (size_t)g * 64 + 16 * i);
                m = _mm512_max_ps(m, _mm512_abs_ps(v[i]));
            }
            const float mx = _mm512_reduce_max_ps(m);
            xsum[g] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])));
            sx[g] = mx / (float)LILY_GEMV_I8_CODE_MAX;
            const __m512 inv = _mm512_set1_ps(mx > 0.0f ? (float)LILY_GEMV_I8_CODE_MAX / mx : 0.0f);
            __m512i cb = _mm512_setzero_si512(), cs = cb;
            for (int i = 0; i < 4; i++) {
                __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv)); /* to nearest */
                c = _mm512_max_epi32(_mm512_min_epi32(c, lim), nlim);
                cs = _mm512_add_epi32(cs, c);
                cb = _mm512_mask_blend_epi32((__mmask16)(0xf << (4 * i)), cb,
                                             _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(c)));
            }
            dq[g] = xsum[g] - sx[g] * (float)_mm512_reduce_add_epi32(cs); /* |sum c| < 2^13 */
            cb = _mm512_permutexvar_epi64(gather, _mm512_shuffle_epi8(cb, split));
            uint8_t *blk = d + (size_t)(g / 2) * 128 + 32 * (g & 1);
            _mm256_storeu_si256((__m256i *)blk, _mm512_castsi512_si256(cb));
            _mm256_storeu_si256((__m256i *)(blk + 64), _mm512_extracti64x4_epi64(cb, 1));
        }
    }
}

__attribute__((target(G8_VNNI), always_inline)) static inline __m512 bf16x16(__mmask16 m,
                                                                             const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Row r's group scales (weight scale x x scale; 0 past the last group) into sc, and its bias and
 * centring terms as the accumulator's start (gemv_i16.c's row_terms). */
__attribute__((target(G8_VNNI), always_inline)) static inline __m512
row_terms_vnni(const lily_mat *W, int r, const uint8_t *xt, int nb, float *sc) {
    const int ng = W->cols / 64, ngp = 2 * nb;
    const uint16_t *s = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
    const float *sx = (const float *)(xt + (size_t)nb * 128);
    __m512 acc = _mm512_setzero_ps();
    for (int g0 = 0; g0 < ngp; g0 += 16) {
        const int wl = ng - g0, xl = ngp - g0; /* xl >= wl >= 1 (ngp <= ng + 1) */
        const __mmask16 wm = wl >= 16 ? 0xFFFF : (__mmask16)((1u << wl) - 1);
        const __mmask16 xm = xl >= 16 ? 0xFFFF : (__mmask16)((1u << xl) - 1);
        const __m512 sv = bf16x16(wm, s + g0), bv = bf16x16(wm, bi + g0);
        _mm512_mask_storeu_ps(sc + g0, xm, _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(xm, sx + g0)));
        acc = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(xm, sx + ngp + g0), acc);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(sv, _mm512_set1_ps(8.0f)),
                              _mm512_maskz_loadu_ps(xm, sx + 2 * ngp + g0), acc);
    }
    return acc;
}

/* NT = 2..4 tokens, one row at a time (each nibble split serves every token). */
__attribute__((target(G8_VNNI), always_inline)) static inline void
rows_vnni(const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy, const int NT) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2, ts = tok_stride(cols);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i sidx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc[4][G8_MAX_GROUPS];
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * rb;
        __m512 acc[4];
        for (int t = 0; t < NT; t++)
            acc[t] = row_terms_vnni(W, r, xq + (size_t)t * ts, nb, sc[t]);
        const char *pf = (const char *)q + (rb > G8_PREFETCH ? rb : G8_PREFETCH);
        for (int b = 0; b < nb; b++) {
            if (pf + (size_t)b * 64 < end) _mm_prefetch(pf + (size_t)b * 64, _MM_HINT_T0);
            const __mmask16 wm = 2 * b + 1 < ng ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
            const __m512i v = _mm512_maskz_loadu_epi32(wm, q + (size_t)b * 64);
            const __m512i lo = _mm512_and_si512(v, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int t = 0; t < NT; t++) {
                const uint8_t *x = xq + (size_t)t * ts + (size_t)b * 128;
                __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x));
                d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(x + 64));
                /* lanes 0-7 take group 2 b's scale, lanes 8-15 group 2 b + 1's */
                const __m512 sv =
                    _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_castpd_ps(
                                                    _mm_load_sd((const double *)(sc[t] + 2 * b)))));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sv, acc[t]);
            }
        }
        for (int t = 0; t < NT; t++)
            Y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

/* One token, two rows at a time (sharing each code load). */
__attribute__((target(G8_VNNI))) static void rows_v2r(const lily_mat *W, int r0, int r1,
                                                      const uint8_t *xq, float *Y, int ldy) {
    (void)ldy;
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2;
    const size_t ahead = 2 * rb > G8_PREFETCH ? 2 * rb : G8_PREFETCH;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i sidx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc0[G8_MAX_GROUPS], sc1[G8_MAX_GROUPS];
    for (int r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const uint8_t *q0 = (const uint8_t *)W->w + (size_t)r * rb, *q1 = two ? q0 + rb : q0;
        __m512 acc0 = row_terms_vnni(W, r, xq, nb, sc0);
        __m512 acc1 = row_terms_vnni(W, two ? r + 1 : r, xq, nb, sc1);
        const char *pf = (const char *)q0 + ahead;
        for (int b = 0; b < nb; b++) {
            const char *p = pf + (size_t)b * 128;
            if (p < end) _mm_prefetch(p, _MM_HINT_T0);
            if (p + 64 < end) _mm_prefetch(p + 64, _MM_HINT_T0);
            const __mmask16 wm = 2 * b + 1 < ng ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
            const __m512i v0 = _mm512_maskz_loadu_epi32(wm, q0 + (size_t)b * 64);
            const __m512i v1 = _mm512_maskz_loadu_epi32(wm, q1 + (size_t)b * 64);
            const __m512i xe = _mm512_loadu_si512(xq + (size_t)b * 128);
            const __m512i xo = _mm512_loadu_si512(xq + (size_t)b * 128 + 64);
            __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v0, m4), xe);
            d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4), xo);
            __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v1, m4), xe);
            d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4), xo);
            const __m512 s0 = _mm512_permutexvar_ps(
                sidx,
                _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(sc0 + 2 * b)))));
            const __m512 s1 = _mm512_permutexvar_ps(
                sidx,
                _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(sc1 + 2 * b)))));
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), s0, acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), s1, acc1);
        }
        Y[r] = _mm512_reduce_add_ps(acc0);
        if (two) Y[r + 1] = _mm512_reduce_add_ps(acc1);
    }
}

#define G8_VNNI_NT(NT)                                                             \
    __attribute__((target(G8_VNNI))) static void rows_v##NT(                       \
        const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy) { \
        rows_vnni(W, r0, r1, xq, Y, ldy, NT);                                      \
    }
G8_VNNI_NT(2)
G8_VNNI_NT(3)
G8_VNNI_NT(4)

/* ---- AVX2 + FMA: the same bytes and sums (the 16 lanes as two 8-lane halves, gemv_i16_avx2.c) */

/* The sum of 16 lanes (lo: 0-7, hi: 8-15) in _mm512_reduce_add_ps's order. */
__attribute__((target(G8_AVX2), always_inline)) static inline float hsum16(__m256 lo, __m256 hi) {
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

__attribute__((target(G8_AVX2))) static void quant_avx2(const float *X, int n, int ldx, int cols,
                                                        void *xq) {
    const int ng = cols / 64;
    const size_t nb = n_blocks(cols), ts = tok_stride(cols);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lim = _mm256_set1_epi32(LILY_GEMV_I8_CODE_MAX);
    const __m256i nlim = _mm256_set1_epi32(-LILY_GEMV_I8_CODE_MAX);
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * ldx;
        uint8_t *d = (uint8_t *)xq + (size_t)t * ts;
        float *sx = (float *)(d + nb * 128), *xsum = sx + 2 * nb, *dq = xsum + 2 * nb;
        zero_tail(d, ng, nb, sx, xsum, dq);
        for (int g = 0; g < ng; g++) {
            __m256 v[8], m = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) {
                v[i] = _mm256_loadu_ps(x + (size_t)g * 64 + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
            /* the VNNI body sums 16-lane vectors (v0 + v1) + (v2 + v3) */
            xsum[g] = hsum16(_mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[4], v[6])),
                             _mm256_add_ps(_mm256_add_ps(v[1], v[3]), _mm256_add_ps(v[5], v[7])));
            sx[g] = mx / (float)LILY_GEMV_I8_CODE_MAX;
            const __m256 inv = _mm256_set1_ps(mx > 0.0f ? (float)LILY_GEMV_I8_CODE_MAX / mx : 0.0f);
            int32_t c[64];
            __m256i cs = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) {
                __m256i ci = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
                ci = _mm256_max_epi32(_mm256_min_epi32(ci, lim), nlim);
                cs = _mm256_add_epi32(cs, ci);
                _mm256_storeu_si256((__m256i *)(c + 8 * i), ci);
            }
            __m128i c4 = _mm_add_epi32(_mm256_extracti128_si256(cs, 1), _mm256_castsi256_si128(cs));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, _MM_SHUFFLE(1, 0, 3, 2)));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, _MM_SHUFFLE(2, 3, 0, 1)));
            dq[g] = xsum[g] - sx[g] * (float)_mm_cvtsi128_si32(c4);
            uint8_t *blk = d + (size_t)(g / 2) * 128 + 32 * (g & 1);
            for (int j = 0; j < 32; j++) {
                blk[j] = (uint8_t)c[2 * j];
                blk[64 + j] = (uint8_t)c[2 * j + 1];
            }
        }
    }
}

__attribute__((target(G8_AVX2), always_inline)) static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* Eight groups g0 .. g0 + 7 of row_terms (wl of them with weights, xl with x; the rest 0). */
__attribute__((target(G8_AVX2), always_inline)) static inline void
terms8(const uint16_t *s, const uint16_t *bi, const float *sx, int ngp, int g0, int wl, int xl,
       float *sc, __m256 *a) {
    const __m256i xm =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(xl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 sv, bv;
    if (wl >= 8) {
        sv = bf16x8(s + g0), bv = bf16x8(bi + g0);
    } else { /* the last groups: zero past the weights' end */
        uint16_t st[8] = {0}, bt[8] = {0};
        for (int j = 0; j < wl; j++)
            st[j] = s[g0 + j], bt[j] = bi[g0 + j];
        sv = bf16x8(st), bv = bf16x8(bt);
    }
    const __m256 scv = _mm256_mul_ps(sv, _mm256_maskload_ps(sx + g0, xm));
    if (xl >= 8)
        _mm256_storeu_ps(sc + g0, scv);
    else
        _mm256_maskstore_ps(sc + g0, xm, scv);
    *a = _mm256_fmadd_ps(bv, _mm256_maskload_ps(sx + ngp + g0, xm), *a);
    *a = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(8.0f)),
                         _mm256_maskload_ps(sx + 2 * ngp + g0, xm), *a);
}

/* row_terms_vnni's sums as two 8-lane halves (groups g0 .. g0 + 7 of each 16 in acc[0]). */
__attribute__((target(G8_AVX2), always_inline)) static inline void
row_terms_avx2(const lily_mat *W, int r, const uint8_t *xt, int nb, float *sc, __m256 *acc) {
    const int ng = W->cols / 64, ngp = 2 * nb; /* ngp <= ng + 1 */
    const uint16_t *s = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
    const float *sx = (const float *)(xt + (size_t)nb * 128);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int g0 = 0; g0 < ngp; g0 += 16) {
        terms8(s, bi, sx, ngp, g0, ng - g0, ngp - g0, sc, &a0);
        if (g0 + 8 < ngp) terms8(s, bi, sx, ngp, g0 + 8, ng - g0 - 8, ngp - g0 - 8, sc, &a1);
    }
    acc[0] = a0;
    acc[1] = a1;
}

/* Group g0 + h (h = 0 or 1: which accumulator half) of row q against NT tokens. */
__attribute__((target(G8_AVX2), always_inline)) static inline void
group_avx2(const uint8_t *q, int g0, const int h, const uint8_t *xq, size_t ts,
           float (*sc)[G8_MAX_GROUPS + 8], __m256 (*acc)[2], const int NT) {
    const int g = g0 + h;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + (size_t)g * 32));
    const __m256i lo = _mm256_and_si256(v, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    for (int t = 0; t < NT; t++) {
        const uint8_t *x = xq + (size_t)t * ts + (size_t)g0 * 64 + 32 * h;
        /* |q c + q' c'| <= 2 x 15 x 127 per int16, even + odd <= 7620: no saturation */
        const __m256i p = _mm256_add_epi16(
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64))));
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, one)),
                                    _mm256_broadcast_ss(sc[t] + g), acc[t][h]);
    }
}

/* One token, two rows at a time (sharing each code load). */
__attribute__((target(G8_AVX2), always_inline)) static inline void
pair_avx2(const uint8_t *q0, const uint8_t *q1, const uint8_t *xq, int g0, const int h,
          const float *sc0, const float *sc1, __m256 *a0, __m256 *a1) {
    const int g = g0 + h;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
    const uint8_t *x = xq + (size_t)g0 * 64 + 32 * h;
    const __m256i xe = _mm256_loadu_si256((const __m256i *)x);
    const __m256i xo = _mm256_loadu_si256((const __m256i *)(x + 64));
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + (size_t)g * 32));
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + (size_t)g * 32));
    const __m256i p0 =
        _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v0, m4), xe),
                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), xo));
    const __m256i p1 =
        _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v1, m4), xe),
                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), xo));
    *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p0, one)),
                          _mm256_broadcast_ss(sc0 + g), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p1, one)),
                          _mm256_broadcast_ss(sc1 + g), *a1);
}

__attribute__((target(G8_AVX2))) static void rows_a2r(const lily_mat *W, int r0, int r1,
                                                      const uint8_t *xq, float *Y, int ldy) {
    (void)ldy;
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2;
    const size_t ahead = 2 * rb > G8_PREFETCH ? 2 * rb : G8_PREFETCH;
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc0[G8_MAX_GROUPS + 8], sc1[G8_MAX_GROUPS + 8];
    for (int r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const uint8_t *q0 = (const uint8_t *)W->w + (size_t)r * rb, *q1 = two ? q0 + rb : q0;
        __m256 a0[2], a1[2];
        row_terms_avx2(W, r, xq, nb, sc0, a0);
        row_terms_avx2(W, two ? r + 1 : r, xq, nb, sc1, a1);
        const char *pf = (const char *)q0 + ahead;
        for (int g0 = 0; g0 < ng; g0 += 2) {
            const char *p = pf + (size_t)g0 * 64; /* a row pair's block */
            if (p < end) _mm_prefetch(p, _MM_HINT_T0);
            if (p + 64 < end) _mm_prefetch(p + 64, _MM_HINT_T0);
            pair_avx2(q0, q1, xq, g0, 0, sc0, sc1, &a0[0], &a1[0]);
            if (g0 + 1 < ng) pair_avx2(q0, q1, xq, g0, 1, sc0, sc1, &a0[1], &a1[1]);
        }
        Y[r] = hsum16(a0[0], a0[1]);
        if (two) Y[r + 1] = hsum16(a1[0], a1[1]);
    }
}

__attribute__((target(G8_AVX2), always_inline)) static inline void
rows_avx2(const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy, const int NT) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2, ts = tok_stride(cols);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc[4][G8_MAX_GROUPS + 8];
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * rb;
        __m256 acc[4][2];
        for (int t = 0; t < NT; t++)
            row_terms_avx2(W, r, xq + (size_t)t * ts, nb, sc[t], acc[t]);
        const char *pf = (const char *)q + (rb > G8_PREFETCH ? rb : G8_PREFETCH);
        /* groups in pairs, so each accumulator half is a fixed register */
        for (int g0 = 0; g0 < ng; g0 += 2) {
            if (pf + (size_t)g0 * 32 < end) _mm_prefetch(pf + (size_t)g0 * 32, _MM_HINT_T0);
            group_avx2(q, g0, 0, xq, ts, sc, acc, NT);
            if (g0 + 1 < ng) group_avx2(q, g0, 1, xq, ts, sc, acc, NT);
        }
        for (int t = 0; t < NT; t++)
            Y[(size_t)t * ldy + r] = hsum16(acc[t][0], acc[t][1]);
    }
}

#define G8_AVX2_NT(NT)                                                             \
    __attribute__((target(G8_AVX2))) static void rows_a##NT(                       \
        const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy) { \
        rows_avx2(W, r0, r1, xq, Y, ldy, NT);                                      \
    }
G8_AVX2_NT(2)
G8_AVX2_NT(3)
G8_AVX2_NT(4)

/* ---- entry points ----------------------------------------------------------------------------- */

void lily_cpu_gemv_i8_quant(int vnni, const float *X, int n, int ldx, int cols, void *xq) {
    if (vnni)
        quant_vnni(X, n, ldx, cols, xq);
    else
        quant_avx2(X, n, ldx, cols, xq);
}

void lily_cpu_gemv_i8_rows(int vnni, const lily_mat *W, int r0, int r1, const void *xq, int n,
                           float *Y, int ldy) {
    LILY_ASSERT(W->dt == LILY_DT_Q4 && W->group == 64 && W->cols % 64 == 0 &&
                W->cols <= LILY_GEMV_I8_MAX_COLS && n >= 1 && n <= LILY_GEMV_I8_MAX_N);
    /* a token's result does not depend on the others: more than 4 go 4 at a time */
    const size_t ts = tok_stride(W->cols);
    for (int t0 = 0; t0 < n; t0 += 4) {
        const int nt = n - t0 < 4 ? n - t0 : 4;
        const uint8_t *x = (const uint8_t *)xq + (size_t)t0 * ts;
        float *y = Y + (size_t)t0 * ldy;
        switch (nt) {
        case 1: (vnni ? rows_v2r : rows_a2r)(W, r0, r1, x, y, ldy); break;
        case 2: (vnni ? rows_v2 : rows_a2)(W, r0, r1, x, y, ldy); break;
        case 3: (vnni ? rows_v3 : rows_a3)(W, r0, r1, x, y, ldy); break;
        default: (vnni ? rows_v4 : rows_a4)(W, r0, r1, x, y, ldy); break;
        }
    }
}
