/* CPU reference operators of the forward pass, in fp32.
 *
 * These are the reference for every other implementation (the CUDA kernels are checked against
 * them on random inputs). Activations are fp32 row-major; weights are lily_mat in their stored
 * format and are dequantized on the fly, a row or a tile at a time, never as a whole matrix.
 * Functions taking a pool split their work across its threads; pool may be NULL (serial). */
#ifndef LILY_BACKEND_CPU_OPS_H
#define LILY_BACKEND_CPU_OPS_H

#include <math.h>
#include <stdint.h>

#include "base/pool.h"
#include "lily.h"
#include "model/model.h"

/* bf16 <-> f32 (round to nearest even). */
static inline float lily_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}
static inline uint16_t lily_f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
float lily_f16_to_f32(uint16_t h);

/* SiLU, x sigmoid(x): the one form every CPU path uses (the SwiGLU products, the gated norm,
 * the causal conv), so they agree bit for bit. */
static inline float lily_silu(float x) {
    return x / (1.0f + expf(-x));
}

/* Dequantizes row r of W (cols values) into out. */
void lily_mat_row_f32(const lily_mat *W, int r, float *out);

/* What the CPU kernels may use, fixed per backend (the engine's cpu_isa and precision). */
typedef struct lily_cpu_kern {
    int isa;  /* 2 = AVX-512 (F, BW, VL), 1 = AVX2 + FMA, 0 = plain C (at most the CPU's) */
    int vnni; /* AVX-512 VNNI (isa 2 only): the int16 products take their AVX-512 bodies */
    int i16;  /* Q4 products with int16 activations (matmul_i16.h, gemv_i16.h); isa >= 1 */
    int i8;   /* Q4 decode products (1-4 tokens) with int8 activations instead (gemv_i8.h) */
} lily_cpu_kern;
/* The kernels for an engine's options, chosen here and nowhere else: isa capped by what the CPU
 * has (cpuid), and the precision's CPU mapping (EXACT: fp32 products only; DEFAULT: int16
 * products, on AVX-512 VNNI or AVX2; FAST: as DEFAULT, but int8 activations in the decode
 * products). */
lily_cpu_kern lily_cpu_kern_for(lily_cpu_isa isa, lily_precision precision);
/* The kernel set's name: "avx512-vnni", "avx512", "avx2" or "scalar". */
const char *lily_cpu_kern_name(const lily_cpu_kern *k);

/* Y[t][o] = sum_c W[o][c] * X[t][c] for t < n, o < W->rows.
 * X is [n][ldx] (ldx >= W->cols), Y is [n][ldy] (ldy >= W->rows). Work is split over rows of W;
 * each worker dequantizes a small tile of W and applies it to all n rows of X (weight reuse). */
void lily_cpu_matmul(const lily_cpu_kern *k, const lily_mat *W, const float *X, int n, int ldx,
                     float *Y, int ldy, lily_pool *pool);

/* The largest code when lily_cpu_matmul(k, W, .., n, ..) quantises X per group of 64 columns
 * (each element then within half a step, max|x of its group| / code / 2): 32639 for 16-bit codes
 * (k->i16 and Q4: the prefill GEMM, matmul_i16.h, and the decode product, gemv_i16.h), 127 for
 * 8-bit ones (k->i8: the decode product, gemv_i8.h); 0 when it multiplies in fp32. */
int lily_cpu_matmul_quantizes_x(const lily_cpu_kern *k, const lily_mat *W, int n);

/* A CPU kernel written in plain C, compiled for AVX-512, AVX2 and baseline x86-64 and picked at
 * load time. */
#define LILY_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* Y = silu(G X) * (U X) elementwise (the SwiGLU input), in one pool job with X quantised once,
 * when both take the prefill GEMM with int16 X (n > 4): returns 1; otherwise returns 0 and does
 * nothing. */
int lily_cpu_matmul_glu(const lily_cpu_kern *k, const lily_mat *G, const lily_mat *U,
                        const float *X, int n, int ldx, float *Y, int ldy, lily_pool *pool);

/* The one-token decode product lily_cpu_matmul applies to W (n = 1), by row range, for
 * gemv_rows.h. Form: -1 when W takes the tiled path instead (its rows then do not depend on n),
 * 3 for gemv_i8.h, 2 for gemv_i16.h, 1 or 0 for the fp32 kernels' layouts of x. prep writes one token's x in the
 * form (lily_cpu_gemv1_x_bytes, a multiple of 64; 64-byte aligned), rows computes y[r] for
 * r0 <= r < r1, each row exactly as lily_cpu_matmul computes it. */
int lily_cpu_gemv1_form(const lily_cpu_kern *k, const lily_mat *W);
size_t lily_cpu_gemv1_x_bytes(const lily_cpu_kern *k, const lily_mat *W);
void lily_cpu_gemv1_prep(const lily_cpu_kern *k, const lily_mat *W, const float *x, void *xp);
void lily_cpu_gemv1_rows(const lily_cpu_kern *k, const lily_mat *W, int r0, int r1, const void *xp,
                         float *y);
/* Forms 2 and 3 (the int16 and int8 products): n <= 8 tokens' x (each
 * lily_cpu_gemv1_x_bytes apart) at once, each token's rows exactly as alone: Y[t * ldy + r]. */
void lily_cpu_gemv1_rows_n(const lily_cpu_kern *k, const lily_mat *W, int r0, int r1,
                           const void *xp, int n, float *Y, int ldy);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], over n values (in place allowed). */
void lily_cpu_rmsnorm(const float *x, const float *w, int n, float eps, float *y);

/* Half-split (NeoX) RoPE on the first rot dims of a head vector x at position pos. */
void lily_cpu_rope(float *x, int rot, int pos, double theta);

/* Depthwise causal conv over channels for n tokens, then SiLU.
 * in: [n][C] pre-conv inputs; state: [(K-1)][C], the K-1 previous inputs (oldest first), updated
 * to the last K-1 inputs; w: [C][K] taps, tap K-1 multiplies the current input; out: [n][C]. */
void lily_cpu_conv_silu(const float *in, int n, int C, int K, float *state, const float *w,
                        float *out);
/* The same with the body of a kernel set's isa (lily_cpu_kern.isa: 2, 1 or 0; never above what
 * the CPU has); the form above takes the best the CPU has. Every body gives the same results. */
void lily_cpu_conv_silu_isa(int isa, const float *in, int n, int C, int K, float *state,
                            const float *w, float *out);

/* Gated DeltaNet recurrence for one value head over n tokens, in place on the fp32 state
 * S [Dk][Dv]: for each t, S = lambda_t*S; m = S^T k_t; d = beta_t*(v_t - m); S += k_t d^T;
 * o_t = S^T q_t. q, k: rows of Dk at stride ldq/ldk (already L2-normed, q scaled); v, o: rows of
 * Dv at stride ldv/ldo; beta, lambda: [n] at stride ldg. */
void lily_cpu_gdn_scan(float *S, int Dk, int Dv, int n, const float *q, int ldq, const float *k,
                       int ldk, const float *v, int ldv, const float *beta, const float *lambda,
                       int ldg, float *o, int ldo);
/* The same with the body of a kernel set's isa (as lily_cpu_conv_silu_isa). */
void lily_cpu_gdn_scan_isa(int isa, float *S, int Dk, int Dv, int n, const float *q, int ldq,
                           const float *k, int ldk, const float *v, int ldv, const float *beta,
                           const float *lambda, int ldg, float *o, int ldo);

/* Causal GQA attention for n new queries at positions pos..pos+n-1 over a cache holding
 * positions 0..pos+n-1 (attn.c). q: [n][Nq*Dh]; kc, vc: [ctx][Nkv*Dh] caches; out: [n][Nq*Dh].
 * scale multiplies q.k; softmax in fp32 with max subtraction. scratch: threads x
 * lily_cpu_attention_scratch(Nq, Nkv, Dh, pos + n) floats (threads = the pool's thread count, 1
 * without a pool; 64-byte aligned), so nothing is allocated per call. */
size_t lily_cpu_attention_scratch(int Nq, int Nkv, int Dh, int ctx);
void lily_cpu_attention(const lily_cpu_kern *k, const float *q, int n, int pos, const float *kc,
                        const float *vc, int Nq, int Nkv, int Dh, float scale, float *out,
                        float *scratch, lily_pool *pool);

/* Router: softmax over E logits, top k, renormalised (if norm) weights. Ties go to the lower
 * expert id. idx/wt: [k]. */
void lily_cpu_topk_softmax(const float *logits, int E, int k, int norm, int *idx, float *wt);

#endif
