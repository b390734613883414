/* The Q4 prefill GEMM on AVX-512 VNNI with 16-bit activations (see matmul_i16.h). */
#include "backend/cpu/matmul_i16.h"

#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/ops.h"

#define I16_ISA      "avx512f,avx512bw,avx512vl,avx512vnni"
#define I16_CODE_MAX 32639 /* c + 128 < 2^15: c = 256 h + l with h, l signed bytes */

int lily_cpu_i16_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* xq, per token: digits int32 [cols / 8][4] (for columns 8 d .. 8 d + 7: the h digits of the even
 * columns 8 d, 8 d + 2, 8 d + 4, 8 d + 6 as 4 bytes, of the odd ones, then the l digits of the
 * even and of the odd ones), then per token and group: 8 x the sum of the codes (int32), the
 * scale and the exact sum of x (fp32). */
size_t lily_cpu_i16_x_bytes(int n, int cols) {
    return (size_t)n * cols * 2 + (size_t)n * (cols / 64) * 12;
}

__attribute__((target(I16_ISA))) void lily_cpu_i16_quant(const float *X, int n, int ldx, int cols,
                                                         void *xq) {
    const int ng = cols / 64, nw = cols / 2; /* int32 words of digits per token */
    int32_t *xd = (int32_t *)xq, *cs8 = xd + (size_t)n * nw;
    float *xs = (float *)(cs8 + (size_t)n * ng), *xsum = xs + (size_t)n * ng;
    /* bytes of a group's h (or l) digits in column order -> [block][even 4 | odd 4] */
    const __m512i order = _mm512_set_epi8(
        63, 61, 59, 57, 62, 60, 58, 56, 55, 53, 51, 49, 54, 52, 50, 48, 47, 45, 43, 41, 46, 44, 42,
        40, 39, 37, 35, 33, 38, 36, 34, 32, 31, 29, 27, 25, 30, 28, 26, 24, 23, 21, 19, 17, 22, 20,
        18, 16, 15, 13, 11, 9, 14, 12, 10, 8, 7, 5, 3, 1, 6, 4, 2, 0);
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * ldx;
        for (int g = 0; g < ng; g++) {
            __m512 v[4], m = _mm512_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm512_loadu_ps(x + g * 64 + 16 * i);
                m = _mm512_max_ps(m, _mm512_abs_ps(v[i]));
            }
            const float mx = _mm512_reduce_max_ps(m);
            const size_t tg = (size_t)t * ng + g;
            xsum[tg] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])));
            xs[tg] = mx / (float)I16_CODE_MAX;
            const __m512 inv = _mm512_set1_ps(mx > 0.0f ? (float)I16_CODE_MAX / mx : 0.0f);
            const __m512i lim = _mm512_set1_epi32(I16_CODE_MAX), k128 = _mm512_set1_epi32(128);
            __m512i hb = _mm512_setzero_si512(), lb = _mm512_setzero_si512(), cs = hb;
            for (int i = 0; i < 4; i++) {
                /* round to nearest (MXCSR), clamp, split c = 256 h + l */
                __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));
                c = _mm512_max_epi32(_mm512_min_epi32(c, lim),
                                     _mm512_sub_epi32(_mm512_setzero_si512(), lim));
                cs = _mm512_add_epi32(cs, c);
                const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(c, k128), 8);
                const __m512i l = _mm512_sub_epi32(c, _mm512_slli_epi32(h, 8));
                /* 16 digits as bytes into quarter i of the group's 64 */
                hb = _mm512_mask_blend_epi32((__mmask16)(0xf << (4 * i)), hb,
                                             _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(h)));
                lb = _mm512_mask_blend_epi32((__mmask16)(0xf << (4 * i)), lb,
                                             _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(l)));
            }
            cs8[tg] = 8 * _mm512_reduce_add_epi32(cs);
            /* per block of 8 columns: [h even, h odd] then [l even, l odd] */
            hb = _mm512_shuffle_epi8(hb, order);
            lb = _mm512_shuffle_epi8(lb, order);
            const __m512i lo = _mm512_unpacklo_epi64(hb, lb), hi = _mm512_unpackhi_epi64(hb, lb);
            int32_t *dst = xd + (size_t)t * nw + g * 32; /* 8 blocks x 4 words */
            /* unpack works per 128-bit lane: lane j of lo = blocks 2 j, of hi = blocks 2 j + 1 */
            const __m512i b0 =
                _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi);
            const __m512i a0 =
                _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
            _mm512_storeu_si512((__m512i *)dst, a0);
            _mm512_storeu_si512((__m512i *)(dst + 16), b0);
        }
    }
}

/* tile, per block of 8 columns: the nibbles of the even columns as bytes (row r in dword lane r),
 * of the odd columns; then fp32 scales [cols / 64][16] and affine terms bias + 8 scale
 * [cols / 64][16] (0 for rows >= R). */
size_t lily_cpu_i16_tile_bytes(int cols) {
    return (size_t)cols / 8 * 128 + (size_t)(cols / 64) * 128;
}

/* Rows of 16 bytes (4 words) of 4 rows each in a, b, c, d (a: rows 0-3, ...) -> out[w] = word w
 * of rows 0..15. */
__attribute__((target(I16_ISA), always_inline)) static inline void
transpose16x4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i *out) {
    const __m512i s01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i s23 =
        _mm512_set_epi32(31, 27, 23, 19, 15, 11, 7, 3, 30, 26, 22, 18, 14, 10, 6, 2);
    const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8);
    const __m512i ab01 = _mm512_permutex2var_epi32(a, s01, b); /* w0 rows 0-7 | w1 rows 0-7 */
    const __m512i ab23 = _mm512_permutex2var_epi32(a, s23, b);
    const __m512i cd01 = _mm512_permutex2var_epi32(c, s01, d);
    const __m512i cd23 = _mm512_permutex2var_epi32(c, s23, d);
    out[0] = _mm512_permutex2var_epi32(ab01, lo, cd01);
    out[1] = _mm512_permutex2var_epi32(ab01, hi, cd01);
    out[2] = _mm512_permutex2var_epi32(ab23, lo, cd23);
    out[3] = _mm512_permutex2var_epi32(ab23, hi, cd23);
}

/* 16 bytes of 4 rows (row pointers p[0..3]) in one vector. */
__attribute__((target(I16_ISA), always_inline)) static inline __m512i rows4(const uint8_t *const *p,
                                                                            size_t off) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[0] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[1] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[2] + off)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[3] + off)), 3);
}

__attribute__((target(I16_ISA))) static void repack(const lily_mat *W, int r0, int R, int32_t *Wt,
                                                    float *s, float *b) {
    const int cols = W->cols, ng = cols / 64, rb = cols / 2; /* bytes per row */
    const uint8_t *p[16];
    for (int r = 0; r < 16; r++) /* rows past R repeat row 0 (their outputs are not stored) */
        p[r] = (const uint8_t *)W->w + (size_t)(r0 + (r < R ? r : 0)) * rb;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < rb / 16; j++) { /* 16 bytes = 4 blocks of 8 columns */
        __m512i w[4];
        transpose16x4(rows4(p, (size_t)j * 16), rows4(p + 4, (size_t)j * 16),
                      rows4(p + 8, (size_t)j * 16), rows4(p + 12, (size_t)j * 16), w);
        for (int k = 0; k < 4; k++) {
            int32_t *o = Wt + (size_t)(4 * j + k) * 32;
            _mm512_store_si512((__m512i *)o, _mm512_and_si512(w[k], m4));
            _mm512_store_si512((__m512i *)(o + 16),
                               _mm512_and_si512(_mm512_srli_epi16(w[k], 4), m4));
        }
    }
    /* scales and biases of two groups per gather (rows past R: 0) */
    const __m512i sidx =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(ng));
    const __mmask16 m = R >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << R) - 1u);
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);
    const __m512 eight = _mm512_set1_ps(8.0f);
    const uint16_t *sc = W->scales + (size_t)r0 * ng, *bi = W->biases + (size_t)r0 * ng;
    int g = 0;
    for (; g + 1 < ng; g += 2) {
        const __m512i sv = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, sidx, sc + g, 2);
        const __m512i bv = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, sidx, bi + g, 2);
        /* bf16 -> fp32: group g in the low half of each word, g + 1 in the high half */
        const __m512 s0 = _mm512_castsi512_ps(_mm512_slli_epi32(sv, 16));
        const __m512 s1 = _mm512_castsi512_ps(_mm512_and_si512(sv, hi16));
        const __m512 b0 = _mm512_castsi512_ps(_mm512_slli_epi32(bv, 16));
        const __m512 b1 = _mm512_castsi512_ps(_mm512_and_si512(bv, hi16));
        _mm512_store_ps(s + g * 16, s0);
        _mm512_store_ps(s + g * 16 + 16, s1);
        _mm512_store_ps(b + g * 16, _mm512_fmadd_ps(eight, s0, b0));
        _mm512_store_ps(b + g * 16 + 16, _mm512_fmadd_ps(eight, s1, b1));
    }
    for (int r = 0; g < ng && r < 16; r++) { /* an odd last group */
        const float sv = r < R ? lily_bf16_to_f32(sc[(size_t)r * ng + g]) : 0.0f;
        s[g * 16 + r] = sv;
        b[g * 16 + r] = r < R ? lily_bf16_to_f32(bi[(size_t)r * ng + g]) + 8.0f * sv : 0.0f;
    }
}

/* acc += products of the unsigned bytes of w and the signed bytes of the broadcast word *x
 * (vpdpbusd with an embedded broadcast; through asm because gcc 12 copies the accumulators
 * around the intrinsic's every use in a loop, two register moves per product). */
__attribute__((target(I16_ISA), always_inline)) static inline void
dpbusd_bcast(__m512i *acc, __m512i w, const int32_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(*acc) : "v"(w), "m"(*x));
}

/* NT tokens (xd, cs8, xs, xsum at the first) times the tile: Y[t][0..15] (rows masked by rm).
 * Per group of 64 columns: the h and l digit products in int32 (each at most 64 x 15 x 128),
 * then sum q c = 256 h-sum + l-sum, sum (q - 8) c = that - 8 sum c (exact), times scale and x
 * scale, plus (bias + 8 scale) x sum of x. The accumulators are named variables (an array made
 * gcc copy registers); I16_T repeats a statement per token. */
#define I16_T(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
__attribute__((target(I16_ISA), always_inline)) static inline void
tile_tokens(const int32_t *Wt, const float *s, const float *b, int ng, const int32_t *xd, int nw,
            const int32_t *cs8, const float *xs, const float *xsum, float *Y, int ldy, __mmask16 rm,
            const int NT) {
#define I16_DECL(t)                    \
    __m512 f##t = _mm512_setzero_ps(); \
    __m512i h##t, l##t;
    I16_T(I16_DECL)
    for (int g = 0; g < ng; g++) {
#define I16_ZERO(t) h##t = _mm512_setzero_si512(), l##t = _mm512_setzero_si512();
        I16_T(I16_ZERO)
        const int32_t *wg = Wt + (size_t)g * 8 * 32, *xg = xd + g * 32;
        for (int d = 0; d < 8; d++) {
            const __m512i we = _mm512_load_si512((const __m512i *)(wg + d * 32));
            const __m512i wo = _mm512_load_si512((const __m512i *)(wg + d * 32 + 16));
#define I16_DOT(t)                                       \
    if (t < NT) {                                        \
        const int32_t *xt = xg + (size_t)t * nw + d * 4; \
        dpbusd_bcast(&h##t, we, xt);                     \
        dpbusd_bcast(&h##t, wo, xt + 1);                 \
        dpbusd_bcast(&l##t, we, xt + 2);                 \
        dpbusd_bcast(&l##t, wo, xt + 3);                 \
    }
            I16_T(I16_DOT)
        }
        const __m512 sg = _mm512_load_ps(s + g * 16), bg = _mm512_load_ps(b + g * 16);
#define I16_GROUP(t)                                                                             \
    if (t < NT) {                                                                                \
        const size_t tg = (size_t)t * ng + g;                                                    \
        const __m512i a = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(h##t, 8), l##t),   \
                                           _mm512_set1_epi32(cs8[tg]));                          \
        f##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(sg, _mm512_set1_ps(xs[tg])), \
                               f##t);                                                            \
        f##t = _mm512_fmadd_ps(bg, _mm512_set1_ps(xsum[tg]), f##t);                              \
    }
        I16_T(I16_GROUP)
    }
#define I16_STORE(t) \
    if (t < NT) _mm512_mask_storeu_ps(Y + (size_t)t * ldy, rm, f##t);
    I16_T(I16_STORE)
#undef I16_DECL
#undef I16_ZERO
#undef I16_DOT
#undef I16_GROUP
#undef I16_STORE
}

#define I16_NT(NT)                                                                                 \
    __attribute__((target(I16_ISA))) static void tile_nt##NT(                                      \
        const int32_t *Wt, const float *s, const float *b, int ng, const int32_t *xd, int nw,      \
        const int32_t *cs8, const float *xs, const float *xsum, float *Y, int ldy, __mmask16 rm) { \
        tile_tokens(Wt, s, b, ng, xd, nw, cs8, xs, xsum, Y, ldy, rm, NT);                          \
    }
I16_NT(8)
I16_NT(4)
I16_NT(2)
I16_NT(1)

void lily_cpu_i16_rows(const lily_mat *W, int r0, int R, const void *xq, int n, float *Y, int ldy,
                       void *tile, int ahead) {
    const int cols = W->cols, ng = cols / 64, nw = cols / 2;
    int32_t *Wt = (int32_t *)tile;
    float *s = (float *)(Wt + (size_t)cols / 8 * 32), *b = s + (size_t)ng * 16;
    repack(W, r0, R, Wt, s, b);
    const int rn = r0 + ahead * LILY_I16_ROWS; /* this thread's likely next tile, into L2 */
    if (ahead > 0 && rn < W->rows) {
        const int nr = W->rows - rn < LILY_I16_ROWS ? W->rows - rn : LILY_I16_ROWS;
        const char *nx = (const char *)W->w + (size_t)rn * (cols / 2);
        for (size_t off = 0; off < (size_t)nr * (cols / 2); off += 64)
            _mm_prefetch(nx + off, _MM_HINT_T1);
    }
    const int32_t *xd = (const int32_t *)xq, *cs8 = xd + (size_t)n * nw;
    const float *xs = (const float *)(cs8 + (size_t)n * ng), *xsum = xs + (size_t)n * ng;
    const __mmask16 rm = R >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << R) - 1u);
    int t = 0;
#define I16_CALL(NT)                                                                              \
    tile_nt##NT(Wt, s, b, ng, xd + (size_t)t * nw, nw, cs8 + (size_t)t * ng, xs + (size_t)t * ng, \
                xsum + (size_t)t * ng, Y + (size_t)t * ldy, ldy, rm)
    for (; n - t >= 8; t += 8)
        I16_CALL(8);
    if (n - t >= 4) I16_CALL(4), t += 4;
    if (n - t >= 2) I16_CALL(2), t += 2;
    if (n - t >= 1) I16_CALL(1), t += 1;
#undef I16_CALL
}
