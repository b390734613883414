/* Activations of the exact prefill GEMMs (gemm.h, lily_cuda_prec.gemm_exact): each fp32 row x_t of X
 * becomes K words, word c = (hi, lo) as two fp16 (hi in the low half) with
 *     x_t[c] * 2^-e_t = hi + lo  (to about 2^-22 relative; hi = fp16(x), lo = fp16(x - hi)),
 * and mul[t] = 2^e_t. The exponent e_t puts the row's largest magnitude in [2^14, 2^15), so no
 * fp16 overflows whatever the activations' range, and the row keeps ~21 significant bits where the
 * plain bf16 operand kept 8. The GEMM kernels multiply fp16 weights (4-bit codes x scale + bias
 * rounded once to fp16: 11 significant bits) by hi and by lo on the tensor cores and scale each
 * finished output by mul[t].
 *
 * Why: with bf16 activations and bf16-rounded weights, a near-tie in a MoE router's top-k flips at
 * a few positions of the transformers fixtures (bench/NOTES-cuda.md); CPU emulation showed the
 * fixtures pass with >= 14-bit activations and >= 10-bit weights, and fail with bf16 either side.
 *
 * The words live in one buffer owned by this module, grown (outside any graph capture: prefill
 * only) to the largest n * K seen; the backend runs one stream, so one buffer serves every call. */
#ifndef LILY_BACKEND_CUDA_GEMM_SPLIT_H
#define LILY_BACKEND_CUDA_GEMM_SPLIT_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Split rows X [n][ldx] (first K columns) into *words [n][K] and *mul [n] (device pointers into
 * the module's buffer, valid until the next call). */
int lily_cuda_xsplit(const float *X, int ldx, int n, int K, const uint32_t **words,
                     const float **mul, lily_cuda_stream st, lily_err *e);

/* Declares that the rows at X do not change from now until the next call (X = NULL: nothing is
 * held): while held, a split of the same (X, ldx, n, K) as the last split made during the hold
 * returns the last words instead of splitting again, so the GEMMs that share one input (q, k, v;
 * a MoE layer's router, experts and shared expert) split it once. Any other split replaces it. */
void lily_cuda_xsplit_hold(const float *X);

/* SwiGLU down projections: splits the rows silu(G) * U (G, U [n][ld], first K columns) and holds
 * G as if G held them, so the next GEMM with X = G (ldx ld, n rows, K columns) reads the split
 * words without splitting again and without silu_mul having written G: G keeps the gate values.
 * Release with lily_cuda_xsplit_hold(NULL) after that GEMM. */
int lily_cuda_xsplit_silu_mul(float *G, const float *U, int ld, int n, int K, lily_cuda_stream st,
                              lily_err *e);

/* lily_cuda_rmsnorm (misc.h) of n rows that also splits y's rows into the words a later
 * lily_cuda_xsplit(y, ldy, n, dim) returns, provided lily_cuda_xsplit_hold(y) comes before any
 * other split or hold (the hold then keeps these words instead of starting afresh). */
int lily_cuda_rmsnorm_split(const float *x, int ldx, const float *w, int n, int dim, float eps,
                            float *y, int ldy, lily_cuda_stream st, lily_err *e);

/* Whether the GEMMs run exact (lily_cuda_prec_get().gemm_exact). */
int lily_cuda_gemm_exact(void);

#ifdef __cplusplus
}
#endif

#endif
