/* Grouped Q4 GEMM for expert tiles of at most 16 token rows (short prompts: 256 tokens x top-8
 * over 256 experts give ~8 rows per expert). Same contract as lily_cuda_gemm_grouped (gemm.h),
 * which routes tile_rows == LILY_GEMM_SKINNY_BN here; Q4 weights only.
 *
 * Why: the 256 x 32 tiles of gemm.cu dequantize each weight to fp16 (scale * q + bias) for the few
 * tokens an expert gets, so at ~8 rows per expert they are bound by dequantization instructions
 * (~0.6 TB/s of the H200's ~4.3). Here the weights never get dequantized: each warp owns 16-row
 * slabs of the expert and streams their raw codes from global memory (8-byte loads, a ring of
 * D quantization groups in flight per lane, no shared memory); a nibble pair becomes an mma A
 * register with one shift and one mask, as the fp16 subnormal pair (q * 2^-24, q' * 2^-24),
 * exact (or, variant SUB, with one more or and one subtraction, the normal fp16 pair (q, q')).
 * The tile's tokens are the B operand (8 per n-tile, 1 or 2 n-tiles) as fp16 hi and lo planes of
 * the split activations (gemm_split.h: x 2^-e = hi + lo, ~22 significant bits), so one group's
 * 4 k-slices x {hi, lo} mma give acc_g = sum q x per (row, token) in fp32, and
 *     y += scale_g * 2^24 * acc_g + bias_g * xsum_g,     y *= 2^e (the row multiplier)
 * with xsum_g the token's sum of (hi + lo) over the group. No per-weight FMA, no weight rounding:
 * only the activation split (~2^-22) and the fp32 accumulations separate the result from the
 * exact product (~1e-6 relative, the skinny rows of tests/parity/test_cuda_ops.c). With
 * one-pass GEMMs (lily_cuda_prec.gemm_exact 0) the hi plane alone goes in (8-byte B words, one
 * mma per slice, group sums of hi): one product per weight, the activations at fp16 precision
 * (~2^-11).
 *
 * The B planes are laid out once per call by a small prep kernel ([nx][K] words in mma fragment
 * order, plus the group sums; without gather only the rows of the valid tiles), then every warp
 * reads its fragments straight from L1/L2 with 16-byte loads (prefetched into L1 a group ahead);
 * the codes stream through per-warp shared-memory stages (cp.async); grid (row blocks of 128
 * rows, tiles), blocks past *d_ntiles exit at once. */
#ifndef LILY_BACKEND_CUDA_GEMM_SKINNY_H
#define LILY_BACKEND_CUDA_GEMM_SKINNY_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token rows per tile of the skinny grouped GEMM. */
#define LILY_GEMM_SKINNY_BN 16

/* As lily_cuda_gemm_grouped with tile_rows = LILY_GEMM_SKINNY_BN (tiles of <= 16 rows; a longer
 * tile's rows past 16 are not computed). W: a Q4 expert stack. X: fp32 [nx][ldx], split here
 * (lily_cuda_xsplit: a held X is not split again) whatever lily_cuda_prec says; the lo plane
 * is used in exact mode only. */
int lily_cuda_gemm_skinny_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                                  const int32_t *gather, const int32_t *tiles,
                                  const int32_t *d_ntiles, int max_tiles, float *Y, int ldy,
                                  lily_cuda_stream st, lily_err *e);

/* The same for two expert stacks of one shape (a MoE layer's gate and up) over the same tiles:
 * W into Y and W2 into Y2 (both [.][ldy]), in one launch. */
int lily_cuda_gemm_skinny_grouped_pair(const lily_dmat *W, const lily_dmat *W2, const float *X,
                                       int ldx, int nx, const int32_t *gather, const int32_t *tiles,
                                       const int32_t *d_ntiles, int max_tiles, float *Y, float *Y2,
                                       int ldy, lily_cuda_stream st, lily_err *e);

/* A operand form: LILY_SKINNY_DENORM (the default) = codes as fp16 subnormals q * 2^-24 (one
 * mask per pair); LILY_SKINNY_SUB = normal fp16 q = (1024 + q) - 1024 (one subtraction more per
 * pair; should a GPU flush fp16 subnormal mma inputs). This call forces one (tests). */
enum { LILY_SKINNY_DENORM = 0, LILY_SKINNY_SUB = 1 };
void lily_cuda_skinny_variant(int v);

/* Codes through per-warp shared-memory stages filled by cp.async (1, the default) or through a
 * register ring (0, measured slower); this call forces one (tests). */
void lily_cuda_skinny_cp(int on);

/* Prefetch of the B (token) lines into L1 this many quantization groups ahead (0: none; 1, the
 * default); this call forces another (tests). */
void lily_cuda_skinny_pf(int groups);

#ifdef __cplusplus
}
#endif

#endif
