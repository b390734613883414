/* Q4 prefill GEMM kernels behind lily_cuda_gemm and lily_cuda_gemm_grouped (gemm.h) for MLX
 * 4-bit weights (group 64): block tiles of 128 weight rows x 128/64/32 tokens (dense, warps laid
 * out 2 x 4 or 4 x 2 over rows x tokens) or 256 rows x 32 tokens (grouped), one cp.async ring
 * holding the raw codes, scale words and fp32 activations of each 64-column k-step, B fragments
 * converted to bf16 straight from the staged fp32 rows (no separate conversion pass, one barrier
 * per k-step), and a split-K form (partial sums per k range, added in k order by a second kernel: the same
 * result on every run) when a shape gives too few blocks. Same
 * contracts as the gemm.h entry points, for W->dt == LILY_CW_Q4. Exact mode (gemm_split.h): the
 * staged words are the split fp16 (hi, lo) activations, each B fragment pair comes from two byte
 * permutes, the weights are dequantized to fp16, and every product is two fp16 mma. */
#ifndef LILY_BACKEND_CUDA_GEMM_Q4_H
#define LILY_BACKEND_CUDA_GEMM_Q4_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As lily_cuda_gemm, W a single Q4 matrix. */
int lily_cuda_gemm_q4(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                      int accumulate, lily_cuda_stream st, lily_err *e);

/* As lily_cuda_gemm_grouped, W a Q4 expert stack. */
int lily_cuda_gemm_q4_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                              const int32_t *gather, const int32_t *tiles, const int32_t *d_ntiles,
                              int max_tiles, float *Y, int ldy, lily_cuda_stream st, lily_err *e);

/* Tile shapes (for tests and measurements): dense rows x tokens, and the grouped 128-row form. */
enum {
    LILY_Q4T_AUTO = -1,
    LILY_Q4T_128x128 = 0,
    LILY_Q4T_128x64 = 1,
    LILY_Q4T_128x32 = 2,
    LILY_Q4T_GROUPED128 = 3 /* grouped: 128 rows x 32 tokens instead of 256 x 32 */
};

/* Forces the tile shape and split-K factor of later lily_cuda_gemm_q4 calls (tile
 * LILY_Q4T_AUTO: chosen from the shape, the default; split 0: chosen), or with
 * LILY_Q4T_GROUPED128 the grouped tile. Lets the parity test run every shape and split on small
 * problems, and the timing mode compare them. Not thread-safe; tests only. */
void lily_cuda_gemm_q4_force(int tile, int split);

#ifdef __cplusplus
}
#endif

#endif
