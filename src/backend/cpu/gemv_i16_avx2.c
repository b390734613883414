/* The Q4 decode product of gemv_i16.h on AVX2 + FMA (gcc's x86-64-v3 without F16C, BMI or
 * MOVBE): the same quantised x, byte for byte, and the same results, bit for bit.
 *
 * AVX2 has no vpdpbusd. vpmaddubsw multiplies the nibbles (unsigned) by the digits (signed) and
 * adds adjacent pairs into int16 (at most 2 x 15 x 128 each; the even and the odd columns' sums
 * add to at most 7680: no saturation), and vpmaddwd by 256 (h digits) or 1 (l digits) adds the
 * int16 pairs into int32. A lane of 4 bytes of a row holds columns 8 i .. 8 i + 7 as in the
 * AVX-512 kernel, so each int32 lane is the same exact sum q c over the same 8 columns. A 32-byte
 * load is one group of 64 columns: the AVX-512 kernel's 16 lanes of a 128-column block are two
 * 8-lane accumulators here (the block's first and second group), and the final sum of the lanes
 * follows _mm512_reduce_add_ps's order, so every fp32 rounding happens as there. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/gemv_i16.h"
#include "base/err.h"

#define GA_ISA        "avx2,fma"
#define GA_CODE_MAX   32639 /* as gemv_i16.c */
#define GA_MAX_GROUPS (LILY_GEMV_I16_MAX_COLS / 64)
#define GA_PREFETCH   4096 /* bytes ahead of the rows being read (gemv_i16.c says why) */

static size_t n_blocks(int cols) {
    return ((size_t)cols + 127) / 128;
}
static size_t tok_stride(int cols) {
    size_t nb = n_blocks(cols);
    return nb * 256 + ((nb * 24 + 63) & ~(size_t)63);
}

/* The sum of 16 lanes (lo: 0-7, hi: 8-15) in _mm512_reduce_add_ps's order. */
__attribute__((target(GA_ISA), always_inline)) static inline float hsum16(__m256 lo, __m256 hi) {
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

__attribute__((target(GA_ISA), always_inline)) static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

__attribute__((target(GA_ISA))) void lily_cpu_gemv_i16_quant_avx2(const float *X, int n, int ldx,
                                                                  int cols, void *xq) {
    const int ng = cols / 64;
    const size_t nb = n_blocks(cols), ts = tok_stride(cols);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lim = _mm256_set1_epi32(GA_CODE_MAX), nlim = _mm256_set1_epi32(-GA_CODE_MAX);
    const __m256i k128 = _mm256_set1_epi32(128);
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * ldx;
        uint8_t *d = (uint8_t *)xq + (size_t)t * ts;
        float *sx = (float *)(d + nb * 256), *xsum = sx + 2 * nb, *dq = xsum + 2 * nb;
        if (ng & 1) { /* the missing half of the last block: zero digits, scale and sums */
            uint8_t *last = d + (nb - 1) * 256;
            for (int p = 0; p < 4; p++)
                memset(last + 64 * p + 32, 0, 32);
            sx[ng] = xsum[ng] = dq[ng] = 0.0f;
        }
        for (int g = 0; g < ng; g++) {
            __m256 v[8], m = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) {
                v[i] = _mm256_loadu_ps(x + (size_t)g * 64 + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            const float mx = hmax8(m);
            /* gemv_i16.c sums 16-lane vectors (v0 + v1) + (v2 + v3): lanes 0-7 of each are the
             * even eighths here, lanes 8-15 the odd ones */
            xsum[g] = hsum16(_mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[4], v[6])),
                             _mm256_add_ps(_mm256_add_ps(v[1], v[3]), _mm256_add_ps(v[5], v[7])));
            sx[g] = mx / (float)GA_CODE_MAX;
            const __m256 inv = _mm256_set1_ps(mx > 0.0f ? (float)GA_CODE_MAX / mx : 0.0f);
            __m256i cs = _mm256_setzero_si256();
            int32_t h[64], l[64];
            for (int i = 0; i < 8; i++) {
                /* round to nearest (MXCSR), clamp, split c = 256 h + l (as gemv_i16.c) */
                __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
                c = _mm256_max_epi32(_mm256_min_epi32(c, lim), nlim);
                cs = _mm256_add_epi32(cs, c);
                const __m256i hv = _mm256_srai_epi32(_mm256_add_epi32(c, k128), 8);
                _mm256_storeu_si256((__m256i *)(h + 8 * i), hv);
                _mm256_storeu_si256((__m256i *)(l + 8 * i),
                                    _mm256_sub_epi32(c, _mm256_slli_epi32(hv, 8)));
            }
            __m128i c4 = _mm_add_epi32(_mm256_extracti128_si256(cs, 1), _mm256_castsi256_si128(cs));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, _MM_SHUFFLE(1, 0, 3, 2)));
            c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, _MM_SHUFFLE(2, 3, 0, 1)));
            dq[g] = xsum[g] - sx[g] * (float)_mm_cvtsi128_si32(c4); /* |sum c| < 2^21 */
            /* [h even | h odd | l even | l odd], 64 bytes each per block, column 2 m at byte m */
            uint8_t *blk = d + (size_t)(g / 2) * 256 + 32 * (g & 1);
            for (int j = 0; j < 32; j++) {
                blk[j] = (uint8_t)h[2 * j];
                blk[64 + j] = (uint8_t)h[2 * j + 1];
                blk[128 + j] = (uint8_t)l[2 * j];
                blk[192 + j] = (uint8_t)l[2 * j + 1];
            }
        }
    }
}

/* 8 bf16 values as fp32. */
__attribute__((target(GA_ISA), always_inline)) static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* Eight groups g0 .. g0 + 7 of row_terms (wl of them with weights, xl with x; the rest 0). */
__attribute__((target(GA_ISA), always_inline)) static inline void
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

/* Row r's group scales (weight scale x x scale; 0 past the last group) into sc, and its bias
 * and centring terms as the two halves of the AVX-512 kernel's starting accumulator (lanes 0-7:
 * groups g0 .. g0 + 7 of each 16, lanes 8-15 the rest), summed in its order. */
__attribute__((target(GA_ISA), always_inline)) static inline void
row_terms(const lily_mat *W, int r, const uint8_t *xt, int nb, float *sc, __m256 *lo, __m256 *hi) {
    const int ng = W->cols / 64, ngp = 2 * nb; /* ngp <= ng + 1 */
    const uint16_t *s = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
    const float *sx = (const float *)(xt + (size_t)nb * 256);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int g0 = 0; g0 < ngp; g0 += 16) {
        terms8(s, bi, sx, ngp, g0, ng - g0, ngp - g0, sc, &a0);
        if (g0 + 8 < ngp) terms8(s, bi, sx, ngp, g0 + 8, ng - g0 - 8, ngp - g0 - 8, sc, &a1);
    }
    *lo = a0;
    *hi = a1;
}

/* Per lane sum q c of one group (32 bytes of a row: nibbles split into lo / hi) against its
 * digits x (the group's 32 bytes of each of the block's four parts, 64 bytes apart). */
__attribute__((target(GA_ISA), always_inline)) static inline __m256i
group_dot(__m256i lo, __m256i hi, const uint8_t *x) {
    const __m256i ph =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64))));
    const __m256i pl =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 128))),
                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 192))));
    return _mm256_add_epi32(_mm256_madd_epi16(ph, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(pl, _mm256_set1_epi16(1)));
}

/* The digits of group g of a token's x: block g / 2, half g % 2. */
static inline const uint8_t *group_x(const uint8_t *xt, int g) {
    return xt + (size_t)(g / 2) * 256 + 32 * (g & 1);
}

/* Group g of two rows (q0, q1) against one token's digits: a0, a1 += their lanes x scales. */
__attribute__((target(GA_ISA), always_inline)) static inline void
pair_step(const uint8_t *q0, const uint8_t *q1, const uint8_t *xq, int g, const float *sc0,
          const float *sc1, __m256 *a0, __m256 *a1) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + (size_t)g * 32));
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + (size_t)g * 32));
    const uint8_t *x = group_x(xq, g);
    const __m256i d0 =
        group_dot(_mm256_and_si256(v0, m4), _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), x);
    const __m256i d1 =
        group_dot(_mm256_and_si256(v1, m4), _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), x);
    *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_broadcast_ss(sc0 + g), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_broadcast_ss(sc1 + g), *a1);
}

/* One token, two rows at a time (sharing each digit load). */
__attribute__((target(GA_ISA))) static void rows_1(const lily_mat *W, int r0, int r1,
                                                   const uint8_t *xq, float *Y) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2;
    const size_t ahead = 2 * rb > GA_PREFETCH ? 2 * rb : GA_PREFETCH;
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc0[GA_MAX_GROUPS + 8], sc1[GA_MAX_GROUPS + 8];
    for (int r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const uint8_t *q0 = (const uint8_t *)W->w + (size_t)r * rb, *q1 = two ? q0 + rb : q0;
        __m256 a0[2], a1[2];
        row_terms(W, r, xq, nb, sc0, &a0[0], &a0[1]);
        row_terms(W, two ? r + 1 : r, xq, nb, sc1, &a1[0], &a1[1]);
        const char *pf = (const char *)q0 + ahead;
        const int ra = r + 2 + (int)((ahead - 2 * rb) / rb); /* the rows pf reaches */
        if (ra + 1 < W->rows) {
            _mm_prefetch((const char *)(W->scales + (size_t)ra * ng), _MM_HINT_T0);
            _mm_prefetch((const char *)(W->biases + (size_t)ra * ng), _MM_HINT_T0);
        }
        /* groups in pairs, so each accumulator half is a fixed register */
        for (int g = 0; g < ng; g += 2) {
            const char *p = pf + (size_t)(g / 2) * 128; /* a row pair's block */
            if (p < end) _mm_prefetch(p, _MM_HINT_T0);
            if (p + 64 < end) _mm_prefetch(p + 64, _MM_HINT_T0);
            pair_step(q0, q1, xq, g, sc0, sc1, &a0[0], &a1[0]);
            if (g + 1 < ng) pair_step(q0, q1, xq, g + 1, sc0, sc1, &a0[1], &a1[1]);
        }
        Y[r] = hsum16(a0[0], a0[1]);
        if (two) Y[r + 1] = hsum16(a1[0], a1[1]);
    }
}

/* Group g0 + h (h = 0 or 1: which accumulator half) of row q against NT tokens. */
__attribute__((target(GA_ISA), always_inline)) static inline void
group_n(const uint8_t *q, int g0, const int h, const uint8_t *xq, size_t ts,
        float (*sc)[GA_MAX_GROUPS + 8], __m256 (*acc)[2], const int NT) {
    const int g = g0 + h;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + (size_t)g * 32));
    const __m256i lo = _mm256_and_si256(v, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    for (int t = 0; t < NT; t++) {
        const __m256i d = group_dot(lo, hi, group_x(xq + (size_t)t * ts, g));
        acc[t][h] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_broadcast_ss(sc[t] + g), acc[t][h]);
    }
}

/* NT = 2..4 tokens, one row at a time (each nibble split serves every token). */
__attribute__((target(GA_ISA), always_inline)) static inline void
rows_n(const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy, const int NT) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2, ts = tok_stride(cols);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc[4][GA_MAX_GROUPS + 8];
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * rb;
        __m256 acc[4][2];
        for (int t = 0; t < NT; t++)
            row_terms(W, r, xq + (size_t)t * ts, nb, sc[t], &acc[t][0], &acc[t][1]);
        const char *pf = (const char *)q + (rb > GA_PREFETCH ? rb : GA_PREFETCH);
        /* groups in pairs, so each accumulator half is a fixed register */
        for (int g0 = 0; g0 < ng; g0 += 2) {
            if (pf + (size_t)g0 * 32 < end) _mm_prefetch(pf + (size_t)g0 * 32, _MM_HINT_T0);
            group_n(q, g0, 0, xq, ts, sc, acc, NT);
            if (g0 + 1 < ng) group_n(q, g0, 1, xq, ts, sc, acc, NT);
        }
        for (int t = 0; t < NT; t++)
            Y[(size_t)t * ldy + r] = hsum16(acc[t][0], acc[t][1]);
    }
}

__attribute__((target(GA_ISA))) void lily_cpu_gemv_i16_rows_avx2(const lily_mat *W, int r0, int r1,
                                                                 const void *xq, int n, float *Y,
                                                                 int ldy) {
    LILY_ASSERT(W->dt == LILY_DT_Q4 && W->group == 64 && W->cols % 64 == 0 &&
                W->cols <= LILY_GEMV_I16_MAX_COLS && n >= 1 && n <= LILY_GEMV_I16_MAX_N);
    /* a token's result does not depend on the others: more than 4 go 4 at a time (16 vector
     * registers) */
    const size_t ts = tok_stride(W->cols);
    for (int t0 = 0; t0 < n; t0 += 4) {
        const uint8_t *x = (const uint8_t *)xq + (size_t)t0 * ts;
        float *y = Y + (size_t)t0 * ldy;
        switch (n - t0) {
        case 1: rows_1(W, r0, r1, x, y); break;
        case 2: rows_n(W, r0, r1, x, y, ldy, 2); break;
        case 3: rows_n(W, r0, r1, x, y, ldy, 3); break;
        default: rows_n(W, r0, r1, x, y, ldy, 4); break;
        }
    }
}
