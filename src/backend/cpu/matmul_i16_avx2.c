/* The Q4 prefill GEMM on AVX2 + FMA with int16 activations (see matmul_i16_avx2.h). */
#include "backend/cpu/matmul_i16_avx2.h"

#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/ops.h"

#define IA_ISA      "avx2,fma"
#define IA_CODE_MAX 32639 /* as matmul_i16.c */
#define IA_ROWS     16

/* xq: per token int16 codes [cols] (column order), then per token and group fp32 the x scale,
 * then the exact sum of x. */
size_t lily_cpu_i16_avx2_x_bytes(int n, int cols) {
    return (size_t)n * cols * 2 + (size_t)n * (cols / 64) * 8;
}

/* The sum of 16 lanes (lo: 0-7, hi: 8-15) in _mm512_reduce_add_ps's order (matmul_i16.c sums
 * with it). */
__attribute__((target(IA_ISA), always_inline)) static inline float hsum16(__m256 lo, __m256 hi) {
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

__attribute__((target(IA_ISA))) void lily_cpu_i16_avx2_quant(const float *X, int n, int ldx,
                                                             int cols, void *xq) {
    const int ng = cols / 64;
    int16_t *xc = (int16_t *)xq;
    float *xs = (float *)(xc + (size_t)n * cols), *xsum = xs + (size_t)n * ng;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lim = _mm256_set1_epi32(IA_CODE_MAX), nlim = _mm256_set1_epi32(-IA_CODE_MAX);
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * ldx;
        for (int g = 0; g < ng; g++) {
            __m256 v[8], m = _mm256_setzero_ps();
            for (int i = 0; i < 8; i++) {
                v[i] = _mm256_loadu_ps(x + (size_t)g * 64 + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
            const size_t tg = (size_t)t * ng + g;
            /* matmul_i16.c sums 16-lane vectors (v0 + v1) + (v2 + v3) */
            xsum[tg] = hsum16(_mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[4], v[6])),
                              _mm256_add_ps(_mm256_add_ps(v[1], v[3]), _mm256_add_ps(v[5], v[7])));
            xs[tg] = mx / (float)IA_CODE_MAX;
            const __m256 inv = _mm256_set1_ps(mx > 0.0f ? (float)IA_CODE_MAX / mx : 0.0f);
            int16_t *dst = xc + (size_t)t * cols + (size_t)g * 64;
            for (int i = 0; i < 8; i += 2) {
                __m256i c0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
                __m256i c1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], inv));
                c0 = _mm256_max_epi32(_mm256_min_epi32(c0, lim), nlim);
                c1 = _mm256_max_epi32(_mm256_min_epi32(c1, lim), nlim);
                /* packs works per 128-bit lane: [c0 0-3, c1 0-3 | c0 4-7, c1 4-7] */
                const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xD8);
                _mm256_storeu_si256((__m256i *)(dst + 8 * i), p);
            }
        }
    }
}

/* tile: per pair of columns j, 16 dwords (row r: int16 q - 8 of columns 2 j and 2 j + 1); then
 * fp32 scales [cols / 64][16] and bias + 8 scale [cols / 64][16] (0 for rows >= R). */
size_t lily_cpu_i16_avx2_tile_bytes(int cols) {
    return (size_t)cols / 2 * 64 + (size_t)(cols / 64) * 128;
}

/* 8 x 8 dword transpose: r[i] = row i, out: r[j] = column j. */
__attribute__((target(IA_ISA), always_inline)) static inline void transpose8(__m256i *r) {
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
        t[i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
    }
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_castps_si256(_mm256_permute2f128_ps(s[i], s[i + 4], 0x20));
        r[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(s[i], s[i + 4], 0x31));
    }
}

__attribute__((target(IA_ISA))) static void repack(const lily_mat *W, int r0, int R, int32_t *Wt,
                                                   float *s, float *b) {
    const int cols = W->cols, ng = cols / 64, rb = cols / 2; /* bytes (column pairs) per row */
    const uint8_t *p[IA_ROWS];
    for (int r = 0; r < IA_ROWS; r++) /* rows past R repeat row 0 (their outputs are not stored) */
        p[r] = (const uint8_t *)W->w + (size_t)(r0 + (r < R ? r : 0)) * rb;
    const __m256i m4 = _mm256_set1_epi32(0x0f), k8 = _mm256_set1_epi32(8);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    for (int j = 0; j < rb; j += 8) { /* 8 column pairs */
        for (int h = 0; h < 2; h++) {
            __m256i v[8];
            for (int i = 0; i < 8; i++) {
                const __m256i q =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[8 * h + i] + j)));
                const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, m4), k8);
                const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), k8);
                v[i] = _mm256_or_si256(_mm256_and_si256(lo, lo16), _mm256_slli_epi32(hi, 16));
            }
            transpose8(v);
            for (int i = 0; i < 8; i++)
                _mm256_store_si256((__m256i *)(Wt + (size_t)(j + i) * IA_ROWS + 8 * h), v[i]);
        }
    }
    const uint16_t *sc = W->scales + (size_t)r0 * ng, *bi = W->biases + (size_t)r0 * ng;
    for (int g = 0; g < ng; g++)
        for (int r = 0; r < IA_ROWS; r++) {
            const float sv = r < R ? lily_bf16_to_f32(sc[(size_t)r * ng + g]) : 0.0f;
            s[g * IA_ROWS + r] = sv;
            /* 8 sv is exact: the same value as matmul_i16.c's fma */
            b[g * IA_ROWS + r] =
                r < R ? lily_bf16_to_f32(bi[(size_t)r * ng + g]) + 8.0f * sv : 0.0f;
        }
}

/* NT tokens (codes xc, scales xs, sums xsum at the first) times the tile: Y[t][0..R). Per group
 * the int32 sums of vpmaddwd, then f = (sum) x (scale x x scale) + (bias + 8 scale) x sum x, in
 * matmul_i16.c's order. The fp32 accumulators live in f (L1): the integer ones take the
 * registers. */
__attribute__((target(IA_ISA), always_inline)) static inline void
tile_tokens(const int32_t *Wt, const float *s, const float *b, int ng, const int16_t *xc, int cols,
            const float *xs, const float *xsum, float *Y, int ldy, int R, const int NT) {
    __m256 f[4][2];
    for (int t = 0; t < NT; t++)
        f[t][0] = f[t][1] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256i a[4][2];
        for (int t = 0; t < NT; t++)
            a[t][0] = a[t][1] = _mm256_setzero_si256();
        const int32_t *wg = Wt + (size_t)g * 32 * IA_ROWS;
        const int16_t *xg = xc + (size_t)g * 64;
        for (int j = 0; j < 32; j++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(wg + j * IA_ROWS));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(wg + j * IA_ROWS + 8));
            for (int t = 0; t < NT; t++) {
                int32_t pair;
                __builtin_memcpy(&pair, xg + (size_t)t * cols + 2 * j, 4);
                const __m256i xb = _mm256_set1_epi32(pair);
                a[t][0] = _mm256_add_epi32(a[t][0], _mm256_madd_epi16(w0, xb));
                a[t][1] = _mm256_add_epi32(a[t][1], _mm256_madd_epi16(w1, xb));
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 sg = _mm256_load_ps(s + g * IA_ROWS + 8 * h);
            const __m256 bg = _mm256_load_ps(b + g * IA_ROWS + 8 * h);
            for (int t = 0; t < NT; t++) {
                const size_t tg = (size_t)t * ng + g;
                f[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t][h]),
                                          _mm256_mul_ps(sg, _mm256_set1_ps(xs[tg])), f[t][h]);
                f[t][h] = _mm256_fmadd_ps(bg, _mm256_set1_ps(xsum[tg]), f[t][h]);
            }
        }
    }
    for (int t = 0; t < NT; t++) {
        float o[IA_ROWS];
        _mm256_storeu_ps(o, f[t][0]);
        _mm256_storeu_ps(o + 8, f[t][1]);
        for (int r = 0; r < R; r++)
            Y[(size_t)t * ldy + r] = o[r];
    }
}

#define IA_NT(NT)                                                                               \
    __attribute__((target(IA_ISA))) static void tile_nt##NT(                                    \
        const int32_t *Wt, const float *s, const float *b, int ng, const int16_t *xc, int cols, \
        const float *xs, const float *xsum, float *Y, int ldy, int R) {                         \
        tile_tokens(Wt, s, b, ng, xc, cols, xs, xsum, Y, ldy, R, NT);                           \
    }
IA_NT(4)
IA_NT(2)
IA_NT(1)

void lily_cpu_i16_avx2_rows(const lily_mat *W, int r0, int R, const void *xq, int n, float *Y,
                            int ldy, void *tile, int ahead) {
    const int cols = W->cols, ng = cols / 64;
    int32_t *Wt = (int32_t *)tile;
    float *s = (float *)(Wt + (size_t)cols / 2 * IA_ROWS), *b = s + (size_t)ng * IA_ROWS;
    repack(W, r0, R, Wt, s, b);
    const int rn = r0 + ahead * IA_ROWS; /* this thread's likely next tile, into L2 */
    if (ahead > 0 && rn < W->rows) {
        const int nr = W->rows - rn < IA_ROWS ? W->rows - rn : IA_ROWS;
        const char *nx = (const char *)W->w + (size_t)rn * (cols / 2);
        for (size_t off = 0; off < (size_t)nr * (cols / 2); off += 64)
            _mm_prefetch(nx + off, _MM_HINT_T1);
    }
    const int16_t *xc = (const int16_t *)xq;
    const float *xs = (const float *)(xc + (size_t)n * cols), *xsum = xs + (size_t)n * ng;
    int t = 0;
#define IA_CALL(NT)                                                             \
    tile_nt##NT(Wt, s, b, ng, xc + (size_t)t * cols, cols, xs + (size_t)t * ng, \
                xsum + (size_t)t * ng, Y + (size_t)t * ldy, ldy, R)
    for (; n - t >= 4; t += 4)
        IA_CALL(4);
    if (n - t >= 2) IA_CALL(2), t += 2;
    if (n - t >= 1) IA_CALL(1), t += 1;
#undef IA_CALL
}
