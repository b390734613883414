/* fp32 kernels on AVX2 + FMA (see matmul_avx2.h). */
#include "backend/cpu/matmul_avx2.h"

#include <immintrin.h>
#include <stdint.h>

#include "backend/cpu/ops.h"

#define MA_ISA "avx2,fma"

__attribute__((target(MA_ISA), always_inline)) static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

__attribute__((target(MA_ISA))) void lily_cpu_q8_rows1_avx2(const lily_mat *W, int r0, int r1,
                                                            const float *x, const float *xs,
                                                            float *Y) {
    const int cols = W->cols, ng = cols / 64;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        __m256 acc = _mm256_setzero_ps();
        float bsum = 0;
        for (int g = 0; g < ng; g++) {
            const uint8_t *qg = q + (size_t)g * 64;
            const float *xg = x + (size_t)g * 64;
            __m256 p0 = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qg))),
                _mm256_loadu_ps(xg));
            __m256 p1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                          _mm_loadl_epi64((const __m128i *)(qg + 8)))),
                                      _mm256_loadu_ps(xg + 8));
            for (int k = 2; k < 8; k += 2) {
                p0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                         _mm_loadl_epi64((const __m128i *)(qg + 8 * k)))),
                                     _mm256_loadu_ps(xg + 8 * k), p0);
                p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                         _mm_loadl_epi64((const __m128i *)(qg + 8 * k + 8)))),
                                     _mm256_loadu_ps(xg + 8 * k + 8), p1);
            }
            acc = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), _mm256_set1_ps(lily_bf16_to_f32(sc[g])),
                                  acc);
            bsum += lily_bf16_to_f32(bi[g]) * xs[g];
        }
        Y[r] = hsum8(acc) + bsum;
    }
}

__attribute__((target(MA_ISA))) void lily_cpu_dequant_q4_avx2(const lily_mat *W, int r0, int R,
                                                              float *Wt) {
    const int cols = W->cols, ng = cols / 64;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int r = 0; r < R; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)(r0 + r) * cols / 2;
        const uint16_t *sc = W->scales + (size_t)(r0 + r) * ng;
        const uint16_t *bi = W->biases + (size_t)(r0 + r) * ng;
        float *o = Wt + (size_t)r * cols;
        for (int g = 0; g < ng; g++) {
            const __m256 s = _mm256_set1_ps(lily_bf16_to_f32(sc[g]));
            const __m256 b = _mm256_set1_ps(lily_bf16_to_f32(bi[g]));
            for (int h = 0; h < 2; h++) { /* 16 bytes = 32 elements */
                const __m128i v = _mm_loadu_si128((const __m128i *)(q + (size_t)g * 32 + 16 * h));
                const __m128i lo = _mm_and_si128(v, m4);
                const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                /* element order: e0 = lo0, e1 = hi0, ... */
                const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
                float *og = o + (size_t)g * 64 + 32 * h;
                _mm256_storeu_ps(
                    og, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0)), s, b));
                _mm256_storeu_ps(
                    og + 8,
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8))),
                                    s, b));
                _mm256_storeu_ps(
                    og + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1)), s, b));
                _mm256_storeu_ps(
                    og + 24,
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8))),
                                    s, b));
            }
        }
    }
}
