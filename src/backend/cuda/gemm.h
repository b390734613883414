/* Prefill matrix products on tensor cores: Y = X W^T for a chunk of tokens, with the weight
 * dequantization (Q4/Q8 affine, or plain bf16) fused into the tile load.
 *
 * Blocks compute 128 weight rows x BN tokens; each 64-column k-step is one quantization group:
 * threads dequantize their slice of the W tile to bf16 in shared memory, convert the fp32
 * activations to bf16 beside it, and 8 warps run mma.sync m16n8k16 (bf16 in, fp32 accumulate)
 * from ldmatrix fragments; the global loads of the next 2-3 k-steps are in flight in registers
 * during the current step's math. The grouped form runs a list of (expert, row range) tiles
 * built on the device (see moe.h), with optional row gather of X, so a MoE layer needs no host
 * sync. */
#ifndef LILY_BACKEND_CUDA_GEMM_H
#define LILY_BACKEND_CUDA_GEMM_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token tiles of the grouped GEMM, in rows (see lily_cuda_gemm_grouped). */
#define LILY_GEMM_GROUP_BN 32

/* Y[t][o] = sum_c W[o][c] X[t][c] for t < n, o < W->rows (accumulate: Y += instead).
 * X: [n][ldx] fp32 (ldx % 4 == 0), Y: [n][ldy]. W must be a single matrix. */
int lily_cuda_gemm(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                   int accumulate, lily_cuda_stream st, lily_err *e);

/* Grouped over a stack of experts W (n_mats = E). tiles: [max_tiles][3] int32 (expert, first
 * grouped row, rows <= LILY_GEMM_GROUP_BN), of which *d_ntiles are valid. Grouped row r reads X
 * row gather[r] (or r when gather is NULL) and writes Y row r. */
int lily_cuda_gemm_grouped(const lily_dmat *W, const float *X, int ldx, const int32_t *gather,
                           const int32_t *tiles, const int32_t *d_ntiles, int max_tiles, float *Y,
                           int ldy, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
