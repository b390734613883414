/* Dense Q4 prefill GEMM on Hopper's warpgroup MMA (wgmma), for the large grids where the
 * mma.sync kernels (gemm.cu, gemm_q4.cu) run latency-bound: ncu had the exact 256 x 64 tiles at
 * 46 % tensor pipe and 43 % issue slots, two fp16 mma.sync per product plus the weight
 * dequantization on every warp.
 *
 * Block: two warpgroups, 256 weight rows (two m64 tiles each) x 128 tokens, one 64-column group
 * per k-step. Each warpgroup dequantizes its 128 rows' codes (staged by cp.async) into wgmma
 * A registers (the fp16 weights scale * q + bias, rounded once, as gemm_q4.cu's exact path), and
 * issues m64n128k16 wgmma against the activations' fp16 hi and lo planes (gemm_split.h: x 2^-e =
 * hi + lo), which sit in shared memory in the 128-byte swizzled K-major layout (token t's 64
 * k values one 128-byte row, 16-byte chunk c at c ^ t % 8 (what runs); or, forced by a test, the
 * no-swizzle layout: 8 x 16-byte core matrices, token groups 128 bytes apart, k chunks 2 KB
 * apart). The k order inside each
 * 16-wide slice is the register permutation of gemm_q4.cu (a Q4 word gives the pair of columns
 * 8w + j, 8w + j + 4 with one shift and one mask); the planes are written in that order by a
 * small kernel from the split words, so A and B agree. fp32 accumulation, each output times the
 * token's row multiplier. Q4 weights, K a multiple of 64. With lily_cuda_prec.gemm_exact 0 (the
 * engine's default precision) one product per weight: the hi plane alone (activations as fp16
 * with the row's power-of-two scale, 11 significant bits), the lo plane neither written nor
 * copied. */
#ifndef LILY_BACKEND_CUDA_GEMM_WG_H
#define LILY_BACKEND_CUDA_GEMM_WG_H

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As lily_cuda_gemm (gemm.h) for a single Q4 matrix: exact (hi and lo planes) or one pass (hi),
 * as lily_cuda_gemm_exact() says.
 * A grid of at most 66 blocks (half the SMs) splits its k range (up to 8 ways, >= 4 k-steps each) into
 * partial sums that gemm_partial.h adds in k order. */
int lily_cuda_gemm_wg(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                      int accumulate, lily_cuda_stream st, lily_err *e);

/* As lily_cuda_gemm_grouped (gemm.h) with tiles of at most 64 rows, W a Q4 expert stack: blocks
 * of 256 weight rows x one tile (m64n64k16). */
int lily_cuda_gemm_wg_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                              const int32_t *gather, const int32_t *tiles, const int32_t *d_ntiles,
                              int max_tiles, float *Y, int ldy, lily_cuda_stream st, lily_err *e);

/* Token tile of a dense M-row, n-token product (128). */
int lily_cuda_gemm_wg_dense_nt(int M, int n);

/* Forces the dense kernel's split-K factor (> 0, at most one per k-step) or restores the
 * automatic choice (0). Tests; not thread-safe. */
void lily_cuda_gemm_wg_force_split(int split);

#ifdef __cplusplus
}
#endif

#endif
