/* Prefill matrix products on tensor cores: Y = X W^T for a chunk of tokens, with the weight
 * dequantization (Q4/Q8 affine, or plain bf16) fused into the fragment build.
 *
 * Each block of 8 warps computes BM weight rows (8 warps stacked along the rows) x BN tokens; a
 * k-step is one 64-column quantization group. The raw weight codes, their scale/bias words and
 * the fp32 activations of the next k-steps stream into a 3-4 stage shared-memory ring with
 * cp.async; the activations are converted once per block to bf16 in a permuted column order, and
 * each warp dequantizes its own rows straight into mma.sync m16n8k16 A fragments (bf16 in, fp32
 * accumulate), so every dequantized weight feeds all BN tokens of the block and no weight tile
 * goes through shared memory as bf16. Tile shapes are picked from the shape (rows, tokens). The
 * grouped form runs a list of (expert, row range) tiles built on the device (see moe.h), with
 * optional row gather of X, so a MoE layer needs no host sync. The GLU forms compute two
 * matrices (gate, up) over the same pass of X and write silu(gate) * up.
 *
 * Precision (lily_cuda_prec.gemm_exact: the engine's DEFAULT and EXACT; gemm_split.h): the activations enter as fp16 hi +
 * lo words with a power-of-two row scale and the weights are dequantized to fp16, two fp16 mma
 * per product: ~1e-6 relative to the fp32 CPU reference instead of ~4e-3 with one bf16 pass. */
#ifndef LILY_BACKEND_CUDA_GEMM_H
#define LILY_BACKEND_CUDA_GEMM_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token tiles of the grouped GEMM, in rows (see lily_cuda_gemm_grouped: tile_rows 16 (Q4 only),
 * 32 or 64; the gated grouped form takes 32). */
#define LILY_GEMM_GROUP_BN 32
/* The gated (GLU) entry points below exist. */
#define LILY_GEMM_HAS_GLU 1

/* Y[t][o] = sum_c W[o][c] X[t][c] for t < n, o < W->rows (accumulate: Y += instead).
 * X: [n][ldx] fp32 (ldx % 4 == 0), Y: [n][ldy]. W must be a single matrix. */
int lily_cuda_gemm(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                   int accumulate, lily_cuda_stream st, lily_err *e);

/* Grouped over a stack of experts W (n_mats = E). tiles: [max_tiles][3] int32 (expert, first
 * grouped row, rows <= tile_rows), of which *d_ntiles are valid; tile_rows is 32
 * (LILY_GEMM_GROUP_BN) or 64 (256 x 64 blocks: fewer dequantizations per token when experts get
 * many rows), or 16 for Q4 weights (LILY_GEMM_SKINNY_BN: the skinny kernel of gemm_skinny.h,
 * no dequantization, for experts of few rows). Grouped row r reads X
 * row gather[r] (or r when gather is NULL) and writes Y row r. X has nx rows (every gather[r] and
 * grouped row read is < nx). */
int lily_cuda_gemm_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                           const int32_t *gather, const int32_t *tiles, const int32_t *d_ntiles,
                           int max_tiles, int tile_rows, float *Y, int ldy, lily_cuda_stream st,
                           lily_err *e);

/* Which kernel runs Q4 weights. AUTO (the default): the wgmma kernel (gemm_wg.h; exact or one
 * pass) for dense GEMMs of at least 16 of its 256 x 128 blocks and for grouped ones with 64-row tiles;
 * else the gemm_q4.h kernel (128-row tiles, split-K) when K >= 1024 and this file's 256 x 64
 * tiles would give fewer than 120 blocks (at a 512-token chunk: GDN out / attn o, router, GDN
 * b/a, shared gate/up), where it was measured faster (NOTES-cuda-gemm.md); this file's 256-row
 * kernel otherwise (its split-K writes partial sums that a second kernel adds in k order: the same
 * sums on every run). Q4: every Q4 GEMM on gemm_q4.h (its grouped form with 32-row tiles); WG:
 * every Q4 GEMM that gemm_wg.h can run (small dense grids split-K). Tests force Q4 or WG
 * to cover those kernels on every shape; not thread-safe. */
enum { LILY_GEMM_AUTO = 0, LILY_GEMM_Q4 = 2, LILY_GEMM_WG = 3 };
void lily_cuda_gemm_select(int which);

/* Forces the split-K factor of this file's dense one-matrix kernel (split > 0; rounded to whole
 * scale chunks of 8 k-steps, no range left empty) or restores the automatic choice (0: split
 * only grids of < 120 small tiles, gemm_partial.h). Tests and measurements; not thread-safe. */
void lily_cuda_gemm_force_split(int split);

/* Gated pair in one pass over X: Y[t][o] = silu(G X_t)[o] * (U X_t)[o] for t < n, o < G->rows.
 * G and U: single matrices of the same type and shape. Same X/Y rules as lily_cuda_gemm (no
 * accumulate). Replaces gemm(G) + gemm(U) + silu_mul. */
int lily_cuda_gemm_glu(const lily_dmat *G, const lily_dmat *U, const float *X, int ldx, int n,
                       float *Y, int ldy, lily_cuda_stream st, lily_err *e);

/* Grouped gated pair: as lily_cuda_gemm_grouped over two expert stacks of the same type, shape
 * and count, writing silu(gate) * up (replaces two grouped GEMMs and silu_mul). */
int lily_cuda_gemm_grouped_glu(const lily_dmat *G, const lily_dmat *U, const float *X, int ldx,
                               int nx, const int32_t *gather, const int32_t *tiles,
                               const int32_t *d_ntiles, int max_tiles, float *Y, int ldy,
                               lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
