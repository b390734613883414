/* Y = X W^T with W in its stored format (F32, BF16, F16, MLX Q4/Q8), dequantized on the fly.
 *
 * Two strategies, chosen by the number of token rows n:
 *  - decode (n <= 4), Q4 weights on AVX-512 VNNI or AVX2: gemv_i16.h (X quantised to 16-bit
 *    codes; the AVX2 body gives the same results).
 *  - decode (n <= 4), Q4 weights otherwise (EXACT, or plain C): a fused kernel reads each 4-bit
 *    group once, turns the nibbles into floats in registers and applies them to every token. X is
 *    first reordered per group of 64 into [even elements | odd elements], so the low and high
 *    nibbles of a byte line up with two contiguous halves of x and no shuffles are needed; the
 *    group's affine bias is applied as bias * sum(x over the group), computed once per call.
 *    FAST: the int8 decode product of gemv_i8.h instead of the int16 one.
 *  - prefill, Q4 with AVX-512 VNNI: matmul_i16.h (X quantised to 16-bit codes per group of 64
 *    once per call, int16 products; one task per 16-row tile of W, all tokens); with AVX2 only:
 *    matmul_i16_avx2.h (vpmaddwd, the same results).
 *  - prefill (and the other types): work is split into (token block, row tile) tasks. A task
 *    dequantizes a 16-row tile of W into per-thread fp32 scratch, then a 4x4 register-blocked
 *    micro-kernel multiplies it with a 32-token block of X that stays in L2.
 * AVX-512 and AVX2 bodies are compiled with target attributes and picked at run time
 * (lily_cpu_kern_for); plain C otherwise. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemv_i16.h"
#include "backend/cpu/gemv_i8.h"
#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_i16.h"
#include "backend/cpu/matmul_i16_avx2.h"
#include "backend/cpu/ops.h"
#include "base/err.h"

#define MM_TILE_ROWS   16
#define MM_TILE_TOKENS 32

/* Instruction set of the matmul kernels: 2 = AVX-512, 1 = AVX2+FMA, 0 = plain C; what the CPU
 * has is detected once, and each backend caps it (lily_cpu_kern). The Q4 prefill GEMM takes int16
 * activations on AVX-512 VNNI (matmul_i16.h): VNNI products run at twice the rate of fp32 FMAs on
 * Zen 5; a CPU whose 512-bit FMAs issue as fast as its VNNI may gain less. The Q4 decode product
 * (1-4 tokens) takes them too (gemv_i16.h): with the digits laid out to match the weights as
 * stored it needs under half the instructions per weight byte of the fp32 kernel. Timings and the
 * rejected int16 forms: BENCHMARKS.md and bench/NOTES-cuda.md ("Moved from src comments"). */
static int cpu_isa_level(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        int lvl = 0;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) lvl = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            lvl = 2;
        cached = lvl;
    }
    return cached;
}

lily_cpu_kern lily_cpu_kern_for(lily_cpu_isa isa, lily_precision precision) {
    int lvl = cpu_isa_level();
    if (isa == LILY_CPU_ISA_SCALAR)
        lvl = 0;
    else if (isa == LILY_CPU_ISA_AVX2 && lvl > 1)
        lvl = 1;
    lily_cpu_kern k = {lvl, 0, 0, 0};
    /* the one place that maps a precision to the CPU kernels: EXACT keeps every product in fp32,
     * DEFAULT and FAST take the int16 products (AVX-512 VNNI bodies where the CPU has them and
     * the cap allows, else the AVX2 bodies: the same results) */
    k.vnni = lvl == 2 && lily_cpu_i16_available();
    k.i16 = lvl >= 1 && precision != LILY_PRECISION_EXACT;
    k.i8 = lvl >= 1 && precision == LILY_PRECISION_FAST;
    return k;
}

const char *lily_cpu_kern_name(const lily_cpu_kern *k) {
    return k->isa >= 2 ? (k->vnni ? "avx512-vnni" : "avx512") : k->isa == 1 ? "avx2" : "scalar";
}

static int have_avx512(const lily_cpu_kern *k) {
    return k->isa >= 2;
}
static int have_avx2(const lily_cpu_kern *k) {
    return k->isa >= 1;
}
static int have_i16(const lily_cpu_kern *k) {
    return k->isa >= 1 && k->i16;
}

/* The int16 products' bodies: AVX-512 VNNI (matmul_i16.h, gemv_i16.h) or AVX2
 * (matmul_i16_avx2.h, gemv_i16_avx2.c); the decode product's two share one layout of x. */
static size_t i16_x_bytes(const lily_cpu_kern *k, int n, int cols) {
    return k->vnni ? lily_cpu_i16_x_bytes(n, cols) : lily_cpu_i16_avx2_x_bytes(n, cols);
}
static void i16_quant(const lily_cpu_kern *k, const float *X, int n, int ldx, int cols, void *xq) {
    if (k->vnni)
        lily_cpu_i16_quant(X, n, ldx, cols, xq);
    else
        lily_cpu_i16_avx2_quant(X, n, ldx, cols, xq);
}
static size_t i16_tile_bytes(const lily_cpu_kern *k, int cols) {
    return k->vnni ? lily_cpu_i16_tile_bytes(cols) : lily_cpu_i16_avx2_tile_bytes(cols);
}
static void i16_rows(const lily_cpu_kern *k, const lily_mat *W, int r0, int R, const void *xq,
                     int n, float *Y, int ldy, void *tile, int ahead) {
    if (k->vnni)
        lily_cpu_i16_rows(W, r0, R, xq, n, Y, ldy, tile, ahead);
    else
        lily_cpu_i16_avx2_rows(W, r0, R, xq, n, Y, ldy, tile, ahead);
}
static void gemv_quant(const lily_cpu_kern *k, const float *X, int n, int ldx, int cols, void *xq) {
    if (k->vnni)
        lily_cpu_gemv_i16_quant(X, n, ldx, cols, xq);
    else
        lily_cpu_gemv_i16_quant_avx2(X, n, ldx, cols, xq);
}
static void gemv_rows(const lily_cpu_kern *k, const lily_mat *W, int r0, int r1, const void *xq,
                      int n, float *Y, int ldy) {
    if (k->vnni)
        lily_cpu_gemv_i16_rows(W, r0, r1, xq, n, Y, ldy);
    else
        lily_cpu_gemv_i16_rows_avx2(W, r0, r1, xq, n, Y, ldy);
}

/* ---- per-thread scratch owned by the pool ---------------------------------------------------- */

typedef struct {
    const lily_cpu_kern *k;
    const lily_mat *W;
    const float *X;
    int n, ldx;
    float *Y;
    int ldy;
    int n_tiles;       /* row tiles of MM_TILE_ROWS */
    int n_tblocks;     /* token blocks of MM_TILE_TOKENS */
    const void *xq;    /* int16 path: X quantised (matmul_i16.h) */
    const lily_mat *U; /* lily_cpu_matmul_glu: the up matrix (W is the gate) */
    int rows_per_task; /* decode: rows of W per task */
    const float *Xr;   /* decode: X reordered per group (even | odd), [n][cols] */
    const float *xs;   /* decode: per-group sums of X, [n][cols/group] */
    lily_pool *pool;
    void *tile_buf; /* serial path only */
} mm_job;

/* ---- scalar reference kernels ---------------------------------------------------------------- */

static void tile_mul_scalar(const float *Wt, int R, int cols, const float *X, int ldx, int T,
                            float *Y, int ldy) {
    for (int t = 0; t < T; t++) {
        const float *x = X + (size_t)t * ldx;
        for (int r = 0; r < R; r++) {
            const float *w = Wt + (size_t)r * cols;
            float acc = 0;
            for (int c = 0; c < cols; c++)
                acc += w[c] * x[c];
            Y[(size_t)t * ldy + r] = acc;
        }
    }
}

/* ---- AVX-512 kernels -------------------------------------------------------------------------- */

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
tile_mul_avx512(const float *Wt, int R, int cols, const float *X, int ldx, int T, float *Y,
                int ldy) {
    int full = cols & ~15;
    __mmask16 tail = (__mmask16)((1u << (cols - full)) - 1u);
    for (int r0 = 0; r0 < R; r0 += 4) {
        const float *w[4];
        for (int i = 0; i < 4; i++)
            w[i] = Wt + (size_t)(r0 + i < R ? r0 + i : r0) * cols;
        for (int t0 = 0; t0 < T; t0 += 4) {
            const float *x[4];
            for (int j = 0; j < 4; j++)
                x[j] = X + (size_t)(t0 + j < T ? t0 + j : t0) * ldx;
            __m512 acc[4][4];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] = _mm512_setzero_ps();
            int c = 0;
            for (; c < full; c += 16) {
                __m512 wv[4], xv[4];
                for (int i = 0; i < 4; i++)
                    wv[i] = _mm512_loadu_ps(w[i] + c);
                for (int j = 0; j < 4; j++)
                    xv[j] = _mm512_loadu_ps(x[j] + c);
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = _mm512_fmadd_ps(wv[i], xv[j], acc[i][j]);
            }
            if (c < cols) {
                __m512 wv[4], xv[4];
                for (int i = 0; i < 4; i++)
                    wv[i] = _mm512_maskz_loadu_ps(tail, w[i] + c);
                for (int j = 0; j < 4; j++)
                    xv[j] = _mm512_maskz_loadu_ps(tail, x[j] + c);
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = _mm512_fmadd_ps(wv[i], xv[j], acc[i][j]);
            }
            for (int j = 0; j < 4 && t0 + j < T; j++)
                for (int i = 0; i < 4 && r0 + i < R; i++)
                    Y[(size_t)(t0 + j) * ldy + r0 + i] = _mm512_reduce_add_ps(acc[i][j]);
        }
    }
}

/* Dequantizes rows [r0, r0+R) of a Q4 matrix into Wt [R][cols]. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dequant_q4_avx512(const lily_mat *W, int r0, int R, float *Wt) {
    int cols = W->cols, ng = cols / 64;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int r = 0; r < R; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)(r0 + r) * cols / 2;
        const uint16_t *sc = W->scales + (size_t)(r0 + r) * ng;
        const uint16_t *bi = W->biases + (size_t)(r0 + r) * ng;
        float *o = Wt + (size_t)r * cols;
        for (int g = 0; g < ng; g++) {
            __m512 s = _mm512_set1_ps(lily_bf16_to_f32(sc[g]));
            __m512 b = _mm512_set1_ps(lily_bf16_to_f32(bi[g]));
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + (size_t)g * 32));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            /* interleave back to element order: e0 = lo0, e1 = hi0, ... */
            __m256i a = _mm256_unpacklo_epi8(lo, hi); /* elements 0..15 | 32..47 (lanes) */
            __m256i c = _mm256_unpackhi_epi8(lo, hi); /* elements 16..31 | 48..63 */
            __m128i e0 = _mm256_castsi256_si128(a), e2 = _mm256_extracti128_si256(a, 1);
            __m128i e1 = _mm256_castsi256_si128(c), e3 = _mm256_extracti128_si256(c, 1);
            float *og = o + (size_t)g * 64;
            _mm512_storeu_ps(og,
                             _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e0)), s, b));
            _mm512_storeu_ps(og + 16,
                             _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e1)), s, b));
            _mm512_storeu_ps(og + 32,
                             _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e2)), s, b));
            _mm512_storeu_ps(og + 48,
                             _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e3)), s, b));
        }
    }
}

/* Decode kernel for one token. MLX packs 8 nibbles per little-endian uint32, element 8i+k in bits
 * 4k..4k+3 of word i, so a 64-byte load holds 16 words = 128 elements = two groups. Shifting the
 * whole vector and masking (one ternary-logic op) drops nibble k of every word into mantissa bits
 * 19..22 of the float 1.0, giving f = 1 + q/16 exactly: no byte-to-dword shuffles and no int to
 * float conversions, one FMA per 16 weights. x comes reordered to match (x_prep_dw: for each
 * 128-column block, 8 vectors of 16, x[8i+k] at [k][i]). Per group, s*q + b = 16s*f + (b - 16s),
 * so the scale is 16s and the affine bias is (b - 16s) times the group sum of x, one vector dot
 * per row. Two rows at a time share every load of x. A trailing 64-column group is a half-width
 * block: its upper 8 words are masked off and the matching x lanes and scale are zero. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
q4_rows1_avx512(const lily_mat *W, int r0, int r1, const float *Xd, const float *xs, float *Y) {
    int cols = W->cols, ng = cols / 64, nb = (cols + 127) / 128;
    const __m512i mant = _mm512_set1_epi32(0x00780000), one = _mm512_set1_epi32(0x3F800000);
    const __m512i sidx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 s16 = _mm512_set1_ps(16.0f);
    const __mmask16 half = (__mmask16)0x00FF;
    float sc[2][258]; /* callers send at most 256 groups (16384 columns) here; +pad */
    for (int r = r0; r < r1; r += 2) {
        int nr = r + 1 < r1 ? 2 : 1;
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        float bsum[2] = {0, 0};
        const uint8_t *q[2];
        for (int k = 0; k < nr; k++) {
            q[k] = (const uint8_t *)W->w + (size_t)(r + k) * cols / 2;
            const uint16_t *s = W->scales + (size_t)(r + k) * ng,
                           *b = W->biases + (size_t)(r + k) * ng;
            __m512 bacc = _mm512_setzero_ps();
            int g = 0;
            for (; g + 16 <= ng; g += 16) {
                __m512 sv = _mm512_mul_ps(
                    s16,
                    _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + g))), 16)));
                __m512 bv = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + g))), 16));
                _mm512_storeu_ps(sc[k] + g, sv);
                bacc = _mm512_fmadd_ps(_mm512_sub_ps(bv, sv), _mm512_loadu_ps(xs + g), bacc);
            }
            bsum[k] = _mm512_reduce_add_ps(bacc);
            for (; g < ng; g++) {
                sc[k][g] = 16.0f * lily_bf16_to_f32(s[g]);
                bsum[k] += (lily_bf16_to_f32(b[g]) - sc[k][g]) * xs[g];
            }
            sc[k][ng] = 0.0f; /* the missing upper group of a half-width last block */
        }
        if (nr == 1) {
            q[1] = q[0];
            memcpy(sc[1], sc[0], sizeof sc[0]);
        }
        /* the next row pair is 2 rows on: prefetch it while this pair is computed, since the
         * hardware stream prefetcher stops at every 4 KiB page of the mapping */
        const char *pf = (const char *)q[0] + (size_t)cols;
        const char *pf_end = (const char *)W->w + (size_t)W->rows * cols / 2;
        if (r + 2 < r1) {
            _mm_prefetch((const char *)(W->scales + (size_t)(r + 2) * ng), _MM_HINT_T0);
            _mm_prefetch((const char *)(W->biases + (size_t)(r + 2) * ng), _MM_HINT_T0);
        }
        for (int blk = 0; blk < nb; blk++) {
            const float *x = Xd + (size_t)blk * 128;
            const char *pb = pf + (size_t)blk * 128;
            if (pb < pf_end) _mm_prefetch(pb, _MM_HINT_T0);
            if (pb + 64 < pf_end) _mm_prefetch(pb + 64, _MM_HINT_T0);
            __mmask16 m = 2 * blk + 1 < ng ? (__mmask16)0xFFFF : half;
            for (int k = 0; k < 2; k++) {
                __m512i v = _mm512_maskz_loadu_epi32(m, q[k] + (size_t)blk * 64);
#define LILY_NIB(sh) _mm512_castsi512_ps(_mm512_ternarylogic_epi32(sh, mant, one, 0xEA))
                __m512 p0 = _mm512_mul_ps(LILY_NIB(_mm512_slli_epi32(v, 19)), _mm512_loadu_ps(x));
                __m512 p1 =
                    _mm512_mul_ps(LILY_NIB(_mm512_slli_epi32(v, 15)), _mm512_loadu_ps(x + 16));
                p0 = _mm512_fmadd_ps(LILY_NIB(_mm512_slli_epi32(v, 11)), _mm512_loadu_ps(x + 32),
                                     p0);
                p1 =
                    _mm512_fmadd_ps(LILY_NIB(_mm512_slli_epi32(v, 7)), _mm512_loadu_ps(x + 48), p1);
                p0 =
                    _mm512_fmadd_ps(LILY_NIB(_mm512_slli_epi32(v, 3)), _mm512_loadu_ps(x + 64), p0);
                p1 =
                    _mm512_fmadd_ps(LILY_NIB(_mm512_srli_epi32(v, 1)), _mm512_loadu_ps(x + 80), p1);
                p0 =
                    _mm512_fmadd_ps(LILY_NIB(_mm512_srli_epi32(v, 5)), _mm512_loadu_ps(x + 96), p0);
                p1 = _mm512_fmadd_ps(LILY_NIB(_mm512_srli_epi32(v, 9)), _mm512_loadu_ps(x + 112),
                                     p1);
#undef LILY_NIB
                /* lanes 0-7 take group 2*blk's scale, lanes 8-15 group 2*blk+1's */
                __m512 sv =
                    _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(
                                                    (const double *)(sc[k] + 2 * (size_t)blk)))));
                acc[k] = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), sv, acc[k]);
            }
        }
        for (int k = 0; k < nr; k++)
            Y[r + k] = _mm512_reduce_add_ps(acc[k]) + bsum[k];
    }
}

/* One token times an 8-bit affine matrix (the MLX router and shared-expert gate): codes in
 * natural order, so x is read as is; the bias term uses the group sums of x. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
q8_rows1_avx512(const lily_mat *W, int r0, int r1, const float *x, const float *xs, float *Y) {
    int cols = W->cols, ng = cols / 64;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        __m512 acc = _mm512_setzero_ps();
        float bsum = 0;
        for (int g = 0; g < ng; g++) {
            const uint8_t *qg = q + (size_t)g * 64;
            const float *xg = x + (size_t)g * 64;
            __m512 p = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qg))),
                _mm512_loadu_ps(xg));
            for (int k = 1; k < 4; k++)
                p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                        _mm_loadu_si128((const __m128i *)(qg + 16 * k)))),
                                    _mm512_loadu_ps(xg + 16 * k), p);
            acc = _mm512_fmadd_ps(p, _mm512_set1_ps(lily_bf16_to_f32(sc[g])), acc);
            bsum += lily_bf16_to_f32(bi[g]) * xs[g];
        }
        Y[r] = _mm512_reduce_add_ps(acc) + bsum;
    }
}

/* Decode kernel: rows [r0, r1) of a Q4 matrix times n <= 4 reordered token vectors. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
q4_rows_avx512(const lily_mat *W, int r0, int r1, const float *Xr, const float *xs, int n, float *Y,
               int ldy) {
    int cols = W->cols, ng = cols / 64;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols / 2;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        float bsum[4] = {0, 0, 0, 0};
        for (int g = 0; g < ng; g++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + (size_t)g * 32));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            __m512 l0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(lo)));
            __m512 l1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(lo, 1)));
            __m512 h0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(hi)));
            __m512 h1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(hi, 1)));
            __m512 s = _mm512_set1_ps(lily_bf16_to_f32(sc[g]));
            float b = lily_bf16_to_f32(bi[g]);
            for (int t = 0; t < n; t++) {
                const float *x = Xr + (size_t)t * cols + (size_t)g * 64;
                __m512 p = _mm512_mul_ps(l0, _mm512_loadu_ps(x));
                p = _mm512_fmadd_ps(l1, _mm512_loadu_ps(x + 16), p);
                p = _mm512_fmadd_ps(h0, _mm512_loadu_ps(x + 32), p);
                p = _mm512_fmadd_ps(h1, _mm512_loadu_ps(x + 48), p);
                acc[t] = _mm512_fmadd_ps(p, s, acc[t]);
                bsum[t] += b * xs[(size_t)t * ng + g];
            }
        }
        for (int t = 0; t < n; t++)
            Y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(acc[t]) + bsum[t];
    }
}

static void q4_rows_scalar(const lily_mat *W, int r0, int r1, const float *Xr, const float *xs,
                           int n, float *Y, int ldy) {
    int cols = W->cols, ng = cols / 64;
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols / 2;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        for (int t = 0; t < n; t++) {
            float acc = 0;
            for (int g = 0; g < ng; g++) {
                const uint8_t *qg = q + (size_t)g * 32;
                const float *x = Xr + (size_t)t * cols + (size_t)g * 64;
                float p = 0;
                for (int i = 0; i < 32; i++)
                    p += (float)(qg[i] & 15) * x[i] + (float)(qg[i] >> 4) * x[32 + i];
                acc +=
                    p * lily_bf16_to_f32(sc[g]) + lily_bf16_to_f32(bi[g]) * xs[(size_t)t * ng + g];
            }
            Y[(size_t)t * ldy + r] = acc;
        }
    }
}

/* ---- AVX2 kernels ----------------------------------------------------------------------------- */

__attribute__((target("avx2,fma"))) static float hsum256(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

__attribute__((target("avx2,fma"))) static void
tile_mul_avx2(const float *Wt, int R, int cols, const float *X, int ldx, int T, float *Y, int ldy) {
    int full = cols & ~7;
    for (int r0 = 0; r0 < R; r0 += 4) {
        const float *w[4];
        for (int i = 0; i < 4; i++)
            w[i] = Wt + (size_t)(r0 + i < R ? r0 + i : r0) * cols;
        for (int t0 = 0; t0 < T; t0 += 2) {
            const float *x[2];
            for (int j = 0; j < 2; j++)
                x[j] = X + (size_t)(t0 + j < T ? t0 + j : t0) * ldx;
            __m256 acc[4][2];
            for (int i = 0; i < 4; i++)
                acc[i][0] = acc[i][1] = _mm256_setzero_ps();
            for (int c = 0; c < full; c += 8) {
                __m256 x0 = _mm256_loadu_ps(x[0] + c), x1 = _mm256_loadu_ps(x[1] + c);
                for (int i = 0; i < 4; i++) {
                    __m256 wv = _mm256_loadu_ps(w[i] + c);
                    acc[i][0] = _mm256_fmadd_ps(wv, x0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(wv, x1, acc[i][1]);
                }
            }
            for (int j = 0; j < 2 && t0 + j < T; j++)
                for (int i = 0; i < 4 && r0 + i < R; i++) {
                    float v = hsum256(acc[i][j]);
                    for (int c = full; c < cols; c++)
                        v += w[i][c] * x[j][c];
                    Y[(size_t)(t0 + j) * ldy + r0 + i] = v;
                }
        }
    }
}

__attribute__((target("avx2,fma"))) static void q4_rows_avx2(const lily_mat *W, int r0, int r1,
                                                             const float *Xr, const float *xs,
                                                             int n, float *Y, int ldy) {
    int cols = W->cols, ng = cols / 64;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int r = r0; r < r1; r++) {
        const uint8_t *q = (const uint8_t *)W->w + (size_t)r * cols / 2;
        const uint16_t *sc = W->scales + (size_t)r * ng, *bi = W->biases + (size_t)r * ng;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        float bsum[4] = {0, 0, 0, 0};
        for (int g = 0; g < ng; g++) {
            __m256 s = _mm256_set1_ps(lily_bf16_to_f32(sc[g]));
            float b = lily_bf16_to_f32(bi[g]);
            __m256 lo[4], hi[4];
            for (int h = 0; h < 2; h++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(q + (size_t)g * 32 + 16 * h));
                __m128i l = _mm_and_si128(v, m4), u = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                lo[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l));
                lo[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l, 8)));
                hi[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(u));
                hi[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(u, 8)));
            }
            for (int t = 0; t < n; t++) {
                const float *x = Xr + (size_t)t * cols + (size_t)g * 64;
                __m256 p = _mm256_mul_ps(lo[0], _mm256_loadu_ps(x));
                for (int k = 1; k < 4; k++)
                    p = _mm256_fmadd_ps(lo[k], _mm256_loadu_ps(x + 8 * k), p);
                for (int k = 0; k < 4; k++)
                    p = _mm256_fmadd_ps(hi[k], _mm256_loadu_ps(x + 32 + 8 * k), p);
                acc[t] = _mm256_fmadd_ps(p, s, acc[t]);
                bsum[t] += b * xs[(size_t)t * ng + g];
            }
        }
        for (int t = 0; t < n; t++)
            Y[(size_t)t * ldy + r] = hsum256(acc[t]) + bsum[t];
    }
}

/* ---- task bodies ------------------------------------------------------------------------------ */

static void dequant_tile(const lily_cpu_kern *k, const lily_mat *W, int r0, int R, float *Wt) {
    if (W->dt == LILY_DT_Q4 && W->group == 64 && have_avx512(k)) {
        dequant_q4_avx512(W, r0, R, Wt);
        return;
    }
    if (W->dt == LILY_DT_Q4 && W->group == 64 && have_avx2(k)) {
        lily_cpu_dequant_q4_avx2(W, r0, R, Wt);
        return;
    }
    for (int r = 0; r < R; r++)
        lily_mat_row_f32(W, r0 + r, Wt + (size_t)r * W->cols);
}

static void mm_tile_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    const lily_mat *W = j->W;
    int tb = task / j->n_tiles, tile = task % j->n_tiles;
    int r0 = tile * MM_TILE_ROWS, R = W->rows - r0 < MM_TILE_ROWS ? W->rows - r0 : MM_TILE_ROWS;
    int t0 = tb * MM_TILE_TOKENS, T = j->n - t0 < MM_TILE_TOKENS ? j->n - t0 : MM_TILE_TOKENS;
    size_t need = (size_t)MM_TILE_ROWS * W->cols * sizeof(float);
    float *Wt = j->pool ? lily_pool_scratch(j->pool, thread, need) : j->tile_buf;
    dequant_tile(j->k, W, r0, R, Wt);
    const float *X = j->X + (size_t)t0 * j->ldx;
    float *Y = j->Y + (size_t)t0 * j->ldy + r0;
    if (have_avx512(j->k))
        tile_mul_avx512(Wt, R, W->cols, X, j->ldx, T, Y, j->ldy);
    else if (have_avx2(j->k))
        tile_mul_avx2(Wt, R, W->cols, X, j->ldx, T, Y, j->ldy);
    else
        tile_mul_scalar(Wt, R, W->cols, X, j->ldx, T, Y, j->ldy);
}

/* int16 path: one 16-row tile of W times every token. */
static void mm_i16_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    const lily_mat *W = j->W;
    int r0 = task * LILY_I16_ROWS;
    int R = W->rows - r0 < LILY_I16_ROWS ? W->rows - r0 : LILY_I16_ROWS;
    size_t need = i16_tile_bytes(j->k, W->cols);
    void *tile = j->pool ? lily_pool_scratch(j->pool, thread, need) : j->tile_buf;
    i16_rows(j->k, W, r0, R, j->xq, j->n, j->Y + r0, j->ldy, tile,
             j->pool ? lily_pool_threads(j->pool) : 1);
}

/* lily_cpu_matmul_glu: one 16-row tile of the gate and of the up matrix times every token, then
 * Y = silu(gate) * up on the tile. */
static void mm_glu_task(void *ctx, int task, int thread) {
    mm_job *j = ctx;
    const lily_mat *G = j->W;
    int r0 = task * LILY_I16_ROWS, n = j->n;
    int R = G->rows - r0 < LILY_I16_ROWS ? G->rows - r0 : LILY_I16_ROWS;
    size_t tb = (i16_tile_bytes(j->k, G->cols) + 63) & ~(size_t)63;
    int ahead = j->pool ? lily_pool_threads(j->pool) : 1;
    uint8_t *buf = j->pool ? lily_pool_scratch(j->pool, thread, tb + (size_t)n * 64) : j->tile_buf;
    float *up = (float *)(buf + tb); /* [n][16]: the up tile */
    i16_rows(j->k, G, r0, R, j->xq, n, j->Y + r0, j->ldy, buf, ahead);
    i16_rows(j->k, j->U, r0, R, j->xq, n, up, LILY_I16_ROWS, buf, ahead);
    for (int t = 0; t < n; t++) {
        float *y = j->Y + (size_t)t * j->ldy + r0;
        const float *u = up + (size_t)t * LILY_I16_ROWS;
        for (int r = 0; r < R; r++)
            y[r] = lily_silu(y[r]) * u[r];
    }
}

#define MM_Q4_ROWS 8

/* Whether n tokens times this matrix run the int8-activation decode product (gemv_i8.h): where
 * the int16 one would (the decode product's token cap) at FAST. */
static int use_gemv_i8(const lily_cpu_kern *k, const lily_mat *W, int n) {
    return W->dt == LILY_DT_Q4 && W->group == 64 && n >= 1 && n <= 4 && /* the decode branch */
           n <= LILY_GEMV_I8_MAX_N && W->cols % 64 == 0 && W->cols <= LILY_GEMV_I8_MAX_COLS &&
           k->isa >= 1 && k->i8;
}

/* Whether n <= 4 tokens times this matrix run the VNNI decode kernel (gemv_i16.h). */
static int use_gemv_i16(const lily_cpu_kern *k, const lily_mat *W, int n) {
    return !use_gemv_i8(k, W, n) && W->dt == LILY_DT_Q4 && W->group == 64 && n >= 1 &&
           n <= LILY_GEMV_I16_MAX_N && W->cols % 64 == 0 && W->cols <= LILY_GEMV_I16_MAX_COLS &&
           have_i16(k);
}

/* Whether one token times this matrix runs q4_rows1_avx512 (and so wants x_prep_dw's layout). */
static int use_rows1(const lily_cpu_kern *k, const lily_mat *W, int n) {
    return W->dt == LILY_DT_Q4 && n == 1 && have_avx512(k) && W->cols <= 64 * 256;
}

/* Floats of reordered x one token needs: q4_rows1_avx512 reads whole 128-column blocks. */
static size_t xr_len(const lily_cpu_kern *k, const lily_mat *W, int n) {
    return use_rows1(k, W, n) ? (size_t)(W->cols + 127) / 128 * 128 : (size_t)W->cols;
}

/* Reorders one token's x for the Q4 decode kernels and sums it per group of 64 (xs). For
 * q4_rows1_avx512 (dw): per 128-column block, x[8i+k] goes to [k][i] (zero-padded to a whole
 * block); otherwise per group of 64, [even elements | odd elements]. */
static void x_prep(const float *x, int cols, int dw, float *Xr, float *xs) {
    int ng = cols / 64;
    for (int g = 0; g < ng; g++) {
        const float *xg = x + (size_t)g * 64;
        float s = 0;
        for (int i = 0; i < 64; i++)
            s += xg[i];
        xs[g] = s;
    }
    if (!dw) {
        for (int g = 0; g < ng; g++)
            for (int i = 0; i < 32; i++) {
                Xr[(size_t)g * 64 + i] = x[(size_t)g * 64 + 2 * i];
                Xr[(size_t)g * 64 + 32 + i] = x[(size_t)g * 64 + 2 * i + 1];
            }
        return;
    }
    for (int blk = 0; blk < (cols + 127) / 128; blk++) {
        float *o = Xr + (size_t)blk * 128;
        for (int k = 0; k < 8; k++)
            for (int i = 0; i < 16; i++) {
                int c = blk * 128 + 8 * i + k;
                o[k * 16 + i] = c < cols ? x[c] : 0.0f;
            }
    }
}

static void mm_q4_task(void *ctx, int task, int thread) {
    (void)thread;
    mm_job *j = ctx;
    int r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->W->rows) r1 = j->W->rows;
    if (j->W->dt == LILY_DT_Q8 && have_avx512(j->k))
        q8_rows1_avx512(j->W, r0, r1, j->X, j->xs, j->Y);
    else if (j->W->dt == LILY_DT_Q8)
        lily_cpu_q8_rows1_avx2(j->W, r0, r1, j->X, j->xs, j->Y);
    else if (use_gemv_i8(j->k, j->W, j->n))
        lily_cpu_gemv_i8_rows(j->k->vnni, j->W, r0, r1, j->xq, j->n, j->Y, j->ldy);
    else if (use_gemv_i16(j->k, j->W, j->n))
        gemv_rows(j->k, j->W, r0, r1, j->xq, j->n, j->Y, j->ldy);
    else if (use_rows1(j->k, j->W, j->n))
        q4_rows1_avx512(j->W, r0, r1, j->Xr, j->xs, j->Y);
    else if (have_avx512(j->k))
        q4_rows_avx512(j->W, r0, r1, j->Xr, j->xs, j->n, j->Y, j->ldy);
    else if (have_avx2(j->k))
        q4_rows_avx2(j->W, r0, r1, j->Xr, j->xs, j->n, j->Y, j->ldy);
    else
        q4_rows_scalar(j->W, r0, r1, j->Xr, j->xs, j->n, j->Y, j->ldy);
}

/* The int16 path's driver: X quantised once (the caller's scratch slot), then one task per
 * 16-row tile of j->W; a task's scratch holds the repacked tile and extra bytes. */
static void run_i16(mm_job *j, const float *X, int ldx, lily_task_fn fn, size_t extra) {
    const lily_mat *W = j->W;
    lily_pool *pool = j->pool;
    size_t xb = i16_x_bytes(j->k, j->n, W->cols);
    void *xq = pool ? lily_pool_scratch(pool, lily_pool_threads(pool), xb) : lily_xaligned(xb);
    i16_quant(j->k, X, j->n, ldx, W->cols, xq);
    j->xq = xq;
    int tasks = (W->rows + LILY_I16_ROWS - 1) / LILY_I16_ROWS;
    if (pool) {
        lily_pool_run(pool, fn, j, tasks);
        return;
    }
    size_t tb = ((i16_tile_bytes(j->k, W->cols) + 63) & ~(size_t)63) + ((extra + 63) & ~(size_t)63);
    j->tile_buf = aligned_alloc(64, tb); /* the tile's vector loads are aligned */
    if (!j->tile_buf) lily_abort(__FILE__, __LINE__, "out of memory allocating %zu bytes", tb);
    for (int t = 0; t < tasks; t++)
        fn(j, t, 0);
    free(j->tile_buf);
    free(xq);
}

/* The prefill GEMM with int16 activations (matmul_i16.h). */
static int use_gemm_i16(const lily_cpu_kern *k, const lily_mat *W, int n) {
    return n > 4 && W->dt == LILY_DT_Q4 && W->group == 64 && W->cols % 64 == 0 && have_i16(k);
}

int lily_cpu_matmul_quantizes_x(const lily_cpu_kern *k, const lily_mat *W, int n) {
    if (use_gemv_i8(k, W, n)) return LILY_GEMV_I8_CODE_MAX;
    return use_gemm_i16(k, W, n) || use_gemv_i16(k, W, n) ? 32639 : 0;
}

int lily_cpu_matmul_glu(const lily_cpu_kern *k, const lily_mat *G, const lily_mat *U,
                        const float *X, int n, int ldx, float *Y, int ldy, lily_pool *pool) {
    if (!use_gemm_i16(k, G, n) || !use_gemm_i16(k, U, n) || G->rows != U->rows ||
        G->cols != U->cols)
        return 0;
    mm_job j = {0};
    j.k = k;
    j.W = G;
    j.U = U;
    j.n = n;
    j.Y = Y;
    j.ldy = ldy;
    j.pool = pool;
    run_i16(&j, X, ldx, mm_glu_task, (size_t)n * 64);
    return 1;
}

void lily_cpu_matmul(const lily_cpu_kern *k, const lily_mat *W, const float *X, int n, int ldx,
                     float *Y, int ldy, lily_pool *pool) {
    if (n <= 0) return;
    mm_job j = {0};
    j.k = k;
    j.W = W;
    j.X = X;
    j.n = n;
    j.ldx = ldx;
    j.Y = Y;
    j.ldy = ldy;
    j.pool = pool;
    int threads = pool ? lily_pool_threads(pool) : 1;
    /* fused decode kernels: Q4 for up to 4 tokens; Q8 for one token with AVX-512 or AVX2 */
    if (W->group == 64 &&
        ((W->dt == LILY_DT_Q4 && n <= 4) || (W->dt == LILY_DT_Q8 && n == 1 && have_avx2(k)))) {
        int cols = W->cols, ng = cols / 64;
        void *buf;
        if (use_gemv_i8(k, W, n)) {
            size_t need = lily_cpu_gemv_i8_x_bytes(n, cols);
            buf = pool ? lily_pool_scratch(pool, threads, need) : lily_xaligned(need);
            lily_cpu_gemv_i8_quant(k->vnni, X, n, ldx, cols, buf);
            j.xq = buf;
        } else if (use_gemv_i16(k, W, n)) {
            size_t need = lily_cpu_gemv_i16_x_bytes(n, cols);
            buf = pool ? lily_pool_scratch(pool, threads, need) : lily_xaligned(need);
            gemv_quant(k, X, n, ldx, cols, buf);
            j.xq = buf;
        } else {
            size_t xl = xr_len(k, W, n);
            size_t need = (size_t)n * (xl + ng) * sizeof(float);
            buf = pool ? lily_pool_scratch(pool, threads, need) : lily_xmalloc(need);
            float *Xr = buf, *xs = (float *)buf + (size_t)n * xl;
            for (int t = 0; t < n; t++)
                x_prep(X + (size_t)t * ldx, cols, use_rows1(k, W, n), Xr + (size_t)t * xl,
                       xs + (size_t)t * ng);
            j.Xr = Xr;
            j.xs = xs;
        }
        /* at most 4 tasks per thread and at least ~128 KiB of weights per task: enough to
         * balance, few enough that claiming them (contended atomics) costs nothing */
        long row_bytes = (long)cols * (W->dt == LILY_DT_Q8 ? 1 : 2) / 2 + (long)ng * 4;
        long by_size = ((long)W->rows * row_bytes + (128 << 10) - 1) / (128 << 10);
        long want = by_size < threads * 4L ? by_size : threads * 4L;
        want = (want + threads - 1) / threads * threads; /* equal shares for every thread */
        int per = (int)((W->rows + want - 1) / want);
        per = (per + MM_Q4_ROWS - 1) / MM_Q4_ROWS * MM_Q4_ROWS;
        j.rows_per_task = per;
        int tasks = (W->rows + per - 1) / per;
        if (pool)
            lily_pool_run(pool, mm_q4_task, &j, tasks);
        else
            for (int t = 0; t < tasks; t++)
                mm_q4_task(&j, t, 0);
        if (!pool) free(buf);
        return;
    }
    if (use_gemm_i16(k, W, n)) {
        run_i16(&j, X, ldx, mm_i16_task, 0);
        return;
    }
    j.n_tiles = (W->rows + MM_TILE_ROWS - 1) / MM_TILE_ROWS;
    j.n_tblocks = (n + MM_TILE_TOKENS - 1) / MM_TILE_TOKENS;
    int tasks = j.n_tiles * j.n_tblocks;
    if (pool) {
        lily_pool_run(pool, mm_tile_task, &j, tasks);
    } else {
        j.tile_buf = lily_xmalloc((size_t)MM_TILE_ROWS * W->cols * sizeof(float));
        for (int t = 0; t < tasks; t++)
            mm_tile_task(&j, t, 0);
        free(j.tile_buf);
    }
}

/* ---- the one-token decode product by row range (gemv_rows.c runs it over 1..8 rows) ---------- */

/* Which prepared form of x an op reads: 3 = gemv_i8's, 2 = gemv_i16's, 1 = q4_rows1's, 0 = even
 * | odd. */
static int x_form(const lily_cpu_kern *k, const lily_mat *W) {
    return use_gemv_i8(k, W, 1) ? 3 : use_gemv_i16(k, W, 1) ? 2 : use_rows1(k, W, 1);
}

/* Bytes of an op's prepared x (64-byte multiples, so every region stays aligned). */
static size_t x_form_bytes(const lily_cpu_kern *k, const lily_mat *W) {
    const int form = x_form(k, W);
    size_t b = form == 3   ? lily_cpu_gemv_i8_x_bytes(1, W->cols)
               : form == 2 ? lily_cpu_gemv_i16_x_bytes(1, W->cols)
                           : (xr_len(k, W, 1) + (size_t)W->cols / 64) * sizeof(float);
    return (b + 63) & ~(size_t)63;
}

int lily_cpu_gemv1_form(const lily_cpu_kern *k, const lily_mat *W) {
    if (W->group != 64 || !(W->dt == LILY_DT_Q4 || (W->dt == LILY_DT_Q8 && have_avx2(k))))
        return -1;
    return W->dt == LILY_DT_Q8 ? 0 : x_form(k, W);
}

size_t lily_cpu_gemv1_x_bytes(const lily_cpu_kern *k, const lily_mat *W) {
    return x_form_bytes(k, W);
}

void lily_cpu_gemv1_prep(const lily_cpu_kern *k, const lily_mat *W, const float *x, void *xp) {
    int form = x_form(k, W), cols = W->cols;
    if (form == 3) {
        lily_cpu_gemv_i8_quant(k->vnni, x, 1, cols, cols, xp);
        return;
    }
    if (form == 2) {
        gemv_quant(k, x, 1, cols, cols, xp);
        return;
    }
    float *Xr = xp, *xs = Xr + xr_len(k, W, 1);
    x_prep(x, cols, form, Xr, xs);
    if (W->dt == LILY_DT_Q8) memcpy(Xr, x, (size_t)cols * sizeof(float)); /* it reads x as is */
}

void lily_cpu_gemv1_rows(const lily_cpu_kern *k, const lily_mat *W, int r0, int r1, const void *xp,
                         float *y) {
    const float *Xr = xp, *xs = Xr + xr_len(k, W, 1);
    if (W->dt == LILY_DT_Q8 && have_avx512(k))
        q8_rows1_avx512(W, r0, r1, Xr, xs, y);
    else if (W->dt == LILY_DT_Q8)
        lily_cpu_q8_rows1_avx2(W, r0, r1, Xr, xs, y);
    else if (use_gemv_i8(k, W, 1))
        lily_cpu_gemv_i8_rows(k->vnni, W, r0, r1, xp, 1, y, W->rows);
    else if (use_gemv_i16(k, W, 1))
        gemv_rows(k, W, r0, r1, xp, 1, y, W->rows);
    else if (use_rows1(k, W, 1))
        q4_rows1_avx512(W, r0, r1, Xr, xs, y);
    else if (have_avx512(k))
        q4_rows_avx512(W, r0, r1, Xr, xs, 1, y, W->rows);
    else if (have_avx2(k))
        q4_rows_avx2(W, r0, r1, Xr, xs, 1, y, W->rows);
    else
        q4_rows_scalar(W, r0, r1, Xr, xs, 1, y, W->rows);
}

void lily_cpu_gemv1_rows_n(const lily_cpu_kern *k, const lily_mat *W, int r0, int r1,
                           const void *xp, int n, float *Y, int ldy) {
    if (x_form(k, W) == 3)
        lily_cpu_gemv_i8_rows(k->vnni, W, r0, r1, xp, n, Y, ldy);
    else
        gemv_rows(k, W, r0, r1, xp, n, Y, ldy);
}
