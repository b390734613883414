/* The Q4 decode product on AVX-512 VNNI with 16-bit activations (see gemv_i16.h). */
#include "backend/cpu/gemv_i16.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"

#define GV_ISA        "avx512f,avx512bw,avx512vl,avx512vnni"
#define GV_CODE_MAX   32639 /* as matmul_i16.c: c + 128 < 2^15, so c = 256 h + l in signed bytes */
#define GV_MAX_GROUPS (LILY_GEMV_I16_MAX_COLS / 64)

/* xq, per token (tok_stride bytes): per block of 128 columns 256 bytes of digits, [h of the even
 * columns | h of the odd | l of the even | l of the odd], 64 each, column 2 m (or 2 m + 1) at
 * byte m; then per group (2 nb of them; 0 for a missing last group) fp32: the scale sx, the
 * exact sum of x, and sum x - sx sum c (minus the group's rounding error).
 *
 * The weights are centred as in matmul_i16.c, sum s q x = s sx sum (q - 8) c + 8 s sum x +
 * (the error term s sum (q - 8)(x - sx c)), so the rounding of x meets s (q - 8), not s q (1.9x
 * smaller on average). Here the products take q as stored and the centring is applied per
 * group as 8 s (sum x - sx sum c), an fp32 term beside the bias. */
static size_t n_blocks(int cols) {
    return ((size_t)cols + 127) / 128;
}
static size_t tok_stride(int cols) {
    size_t nb = n_blocks(cols);
    return nb * 256 + ((nb * 24 + 63) & ~(size_t)63);
}

size_t lily_cpu_gemv_i16_x_bytes(int n, int cols) {
    return (size_t)n * tok_stride(cols);
}

/* 16 int32 digits (each in [-128, 127]) as bytes into quarter i of a 64-byte vector. */
__attribute__((target(GV_ISA), always_inline)) static inline __m512i put16(__m512i acc, __m512i d,
                                                                           int i) {
    return _mm512_mask_blend_epi32((__mmask16)(0xf << (4 * i)), acc,
                                   _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(d)));
}

__attribute__((target(GV_ISA))) void lily_cpu_gemv_i16_quant(const float *X, int n, int ldx,
                                                             int cols, void *xq) {
    const int ng = cols / 64;
    const size_t nb = n_blocks(cols), ts = tok_stride(cols);
    /* per 128-bit lane (16 columns): the 8 even columns' bytes, then the 8 odd ones' */
    const __m512i split =
        _mm512_set_epi8(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0, 15, 13, 11, 9, 7, 5,
                        3, 1, 14, 12, 10, 8, 6, 4, 2, 0, 15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8,
                        6, 4, 2, 0, 15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    /* even halves of the four lanes into the low 256 bits, odd halves into the high */
    const __m512i gather = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    const __m512i lim = _mm512_set1_epi32(GV_CODE_MAX), nlim = _mm512_set1_epi32(-GV_CODE_MAX);
    const __m512i k128 = _mm512_set1_epi32(128);
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
            __m512 v[4], m = _mm512_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm512_loadu_ps(x + (size_t)g * 64 + 16 * i);
                m = _mm512_max_ps(m, _mm512_abs_ps(v[i]));
            }
            const float mx = _mm512_reduce_max_ps(m);
            xsum[g] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])));
            sx[g] = mx / (float)GV_CODE_MAX;
            const __m512 inv = _mm512_set1_ps(mx > 0.0f ? (float)GV_CODE_MAX / mx : 0.0f);
            __m512i hb = _mm512_setzero_si512(), lb = hb, cs = hb;
            for (int i = 0; i < 4; i++) {
                /* round to nearest (MXCSR), clamp, split c = 256 h + l (as matmul_i16.c) */
                __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));
                c = _mm512_max_epi32(_mm512_min_epi32(c, lim), nlim);
                cs = _mm512_add_epi32(cs, c);
                const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(c, k128), 8);
                hb = put16(hb, h, i);
                lb = put16(lb, _mm512_sub_epi32(c, _mm512_slli_epi32(h, 8)), i);
            }
            dq[g] = xsum[g] - sx[g] * (float)_mm512_reduce_add_epi32(cs); /* |sum c| < 2^21 */
            hb = _mm512_permutexvar_epi64(gather, _mm512_shuffle_epi8(hb, split));
            lb = _mm512_permutexvar_epi64(gather, _mm512_shuffle_epi8(lb, split));
            uint8_t *blk = d + (size_t)(g / 2) * 256 + 32 * (g & 1);
            _mm256_storeu_si256((__m256i *)blk, _mm512_castsi512_si256(hb));
            _mm256_storeu_si256((__m256i *)(blk + 64), _mm512_extracti64x4_epi64(hb, 1));
            _mm256_storeu_si256((__m256i *)(blk + 128), _mm512_castsi512_si256(lb));
            _mm256_storeu_si256((__m256i *)(blk + 192), _mm512_extracti64x4_epi64(lb, 1));
        }
    }
}

__attribute__((target(GV_ISA), always_inline)) static inline __m512 bf16x16(__mmask16 m,
                                                                            const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* Row r's group scales (weight scale x x scale; 0 past the last group) into sc, and its bias and
 * centring terms as a vector to start the accumulator with (the lanes are summed at the end, so
 * which lane holds what does not matter). xt: one token's quantised x. */
__attribute__((target(GV_ISA), always_inline)) static inline __m512
row_terms(const lily_mat *W, int r, const uint8_t *xt, int nb, float *sc) {
    const int ng = W->cols / 64, ngp = 2 * nb;
    const uint16_t *s = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
    const float *sx = (const float *)(xt + (size_t)nb * 256);
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

/* Per lane sum q c of one 64-byte block (nibbles split into lo / hi) against the digits x. */
__attribute__((target(GV_ISA), always_inline)) static inline __m512i
block_dot(__m512i lo, __m512i hi, const uint8_t *x) {
    __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x));
    a = _mm512_dpbusd_epi32(a, hi, _mm512_loadu_si512(x + 64));
    a = _mm512_slli_epi32(a, 8);
    a = _mm512_dpbusd_epi32(a, lo, _mm512_loadu_si512(x + 128));
    return _mm512_dpbusd_epi32(a, hi, _mm512_loadu_si512(x + 192));
}

/* Block b's scales by lane: lanes 0-7 the first group's, 8-15 the second's. */
__attribute__((target(GV_ISA), always_inline)) static inline __m512 lane_scales(const float *sc,
                                                                                int b) {
    const __m512i sidx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(
        sidx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(sc + 2 * b)))));
}

/* How far ahead of the rows being read their successors are prefetched: the stream prefetcher
 * stops at each 4 KiB page, and one row pair of a 512-column matrix is only 512 bytes. */
#define GV_PREFETCH_BYTES 4096

/* One token, two rows at a time (sharing each digit load). */
__attribute__((target(GV_ISA))) static void rows_1(const lily_mat *W, int r0, int r1,
                                                   const uint8_t *xq, float *Y) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2;
    const size_t ahead = 2 * rb > GV_PREFETCH_BYTES ? 2 * rb : GV_PREFETCH_BYTES;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc0[GV_MAX_GROUPS], sc1[GV_MAX_GROUPS];
    for (int r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const uint8_t *q0 = (const uint8_t *)W->w + (size_t)r * rb, *q1 = two ? q0 + rb : q0;
        __m512 acc0 = row_terms(W, r, xq, nb, sc0);
        __m512 acc1 = row_terms(W, two ? r + 1 : r, xq, nb, sc1);
        const char *pf = (const char *)q0 + ahead;
        const int ra = r + 2 + (int)((ahead - 2 * rb) / rb); /* the rows pf reaches */
        if (ra + 1 < W->rows) {
            _mm_prefetch((const char *)(W->scales + (size_t)ra * ng), _MM_HINT_T0);
            _mm_prefetch((const char *)(W->biases + (size_t)ra * ng), _MM_HINT_T0);
        }
        for (int b = 0; b < nb; b++) {
            const char *p = pf + (size_t)b * 128;
            if (p < end) _mm_prefetch(p, _MM_HINT_T0);
            if (p + 64 < end) _mm_prefetch(p + 64, _MM_HINT_T0);
            const __mmask16 wm = 2 * b + 1 < ng ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
            const __m512i v0 = _mm512_maskz_loadu_epi32(wm, q0 + (size_t)b * 64);
            const __m512i v1 = _mm512_maskz_loadu_epi32(wm, q1 + (size_t)b * 64);
            const uint8_t *x = xq + (size_t)b * 256;
            const __m512i d0 = block_dot(_mm512_and_si512(v0, m4),
                                         _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4), x);
            const __m512i d1 = block_dot(_mm512_and_si512(v1, m4),
                                         _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4), x);
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), lane_scales(sc0, b), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), lane_scales(sc1, b), acc1);
        }
        Y[r] = _mm512_reduce_add_ps(acc0);
        if (two) Y[r + 1] = _mm512_reduce_add_ps(acc1);
    }
}

/* NT = 2..8 tokens, one row at a time (each nibble split serves every token). */
__attribute__((target(GV_ISA), always_inline)) static inline void
rows_n(const lily_mat *W, int r0, int r1, const uint8_t *xq, float *Y, int ldy, const int NT) {
    const int cols = W->cols, ng = cols / 64, nb = (int)n_blocks(cols);
    const size_t rb = (size_t)cols / 2, ts = tok_stride(cols);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const char *end = (const char *)W->w + (size_t)W->rows * rb;
    float sc[LILY_GEMV_I16_MAX_N][GV_MAX_GROUPS];
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * rb;
        __m512 acc[LILY_GEMV_I16_MAX_N];
        for (int t = 0; t < NT; t++)
            acc[t] = row_terms(W, r, xq + (size_t)t * ts, nb, sc[t]);
        const char *pf = (const char *)q + (rb > GV_PREFETCH_BYTES ? rb : GV_PREFETCH_BYTES);
        for (int b = 0; b < nb; b++) {
            if (pf + (size_t)b * 64 < end) _mm_prefetch(pf + (size_t)b * 64, _MM_HINT_T0);
            const __mmask16 wm = 2 * b + 1 < ng ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
            const __m512i v = _mm512_maskz_loadu_epi32(wm, q + (size_t)b * 64);
            const __m512i lo = _mm512_and_si512(v, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            for (int t = 0; t < NT; t++) {
                const __m512i d = block_dot(lo, hi, xq + (size_t)t * ts + (size_t)b * 256);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), lane_scales(sc[t], b), acc[t]);
            }
        }
        for (int t = 0; t < NT; t++)
            Y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

__attribute__((target(GV_ISA))) void lily_cpu_gemv_i16_rows(const lily_mat *W, int r0, int r1,
                                                            const void *xq, int n, float *Y,
                                                            int ldy) {
    LILY_ASSERT(W->dt == LILY_DT_Q4 && W->group == 64 && W->cols % 64 == 0 &&
                W->cols <= LILY_GEMV_I16_MAX_COLS && n >= 1 && n <= LILY_GEMV_I16_MAX_N);
    const uint8_t *x = xq;
    switch (n) {
    case 1: rows_1(W, r0, r1, x, Y); break;
    case 2: rows_n(W, r0, r1, x, Y, ldy, 2); break;
    case 3: rows_n(W, r0, r1, x, Y, ldy, 3); break;
    case 4: rows_n(W, r0, r1, x, Y, ldy, 4); break;
    case 5: rows_n(W, r0, r1, x, Y, ldy, 5); break;
    case 6: rows_n(W, r0, r1, x, Y, ldy, 6); break;
    case 7: rows_n(W, r0, r1, x, Y, ldy, 7); break;
    default: rows_n(W, r0, r1, x, Y, ldy, 8); break;
    }
}
