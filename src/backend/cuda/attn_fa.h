/* One-pass attention prefill on wgmma (sm_90a) for head dim 256: the form attn.cu's prefill takes
 * when lily_cuda_prec_get().attn_exact is 0 (the engine's FAST precision) and the shape fits
 * (lily_cuda_attn_wg_ok, attn_wg.h).
 *
 * The structure of attn_ws.cu (warp-specialised: a producer warpgroup lands each 64-position
 * tile of the cache with one tensor-map copy per K and V and converts it once into operand
 * planes; two consumer warpgroups of 64 query rows each run S, the online softmax and P V,
 * taking the tensor cores in turn), with one fp16 product per term instead of the exact digit
 * products:
 *   - Q: each query row scaled by a power of two that puts its max |q| in [2^12, 2^13) and
 *     rounded to fp16 (11 significant bits), in shared memory for the whole span;
 *   - K and V: the codes rounded to fp16 (11 significant bits of their 15), K as [position][dim]
 *     and V transposed to [dim][position] (both K-major for wgmma);
 *   - S = Q K^T on f16 wgmma (fp32 accumulate), the K scales and the row factors on the scores;
 *   - P (times the columns' V scales and a power-of-two tile factor, attn_softmax.cuh) rounded
 *     to fp16 in registers, O += P V on f16 wgmma.
 * About 2^-12 relative rounding per operand: finer than the bf16 pass of attn.cu's one-pass
 * kernel (2^-9). Long spans: with part, a chunk whose grid leaves SMs idle splits its causal
 * spans (attn_wg.cu's split form and merge). */
#ifndef LILY_BACKEND_CUDA_ATTN_FA_H
#define LILY_BACKEND_CUDA_ATTN_FA_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As lily_cuda_attn_prefill (attn.h, part included), one-pass products; the shapes of
 * lily_cuda_attn_wg_ok. Splits as lily_cuda_attn_prefill_force_splits sets them. */
int lily_cuda_attn_prefill_fa(const float *q, int n, const void *kc, const void *vc,
                              const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                              const float *gate, float *out, float *part, lily_cuda_stream st,
                              lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
