/* Exact attention prefill on wgmma (sm_90a) for head dim 256: the form attn.cu's prefill takes
 * in exact mode (lily_cuda_prec_get().attn_exact) when the shape fits (attn_ws.cu).
 *
 * A block takes 128 query rows ((position, head-in-group) pairs of one KV head: two consumer
 * warpgroups of 64) and walks the causal span in 64-position tiles. A producer warpgroup
 * converts each tile's cache rows once into operand planes in shared memory: K as the codes'
 * balanced s8 digits (c = 256 h + l), V transposed as exact fp16 digits (h, l / 256). S = Q K^T
 * runs on s8 wgmma with q rows as 16-bit codes (per-row scale max|q| / LILY_CUDA_KV_CODE_MAX)
 * split the same way: hh, hl + lh in s32, exact; O += P V on f16 wgmma with P split into fp16
 * hi + lo against the two V planes (three products, as attn.cu's exact prefill). */
#ifndef LILY_BACKEND_CUDA_ATTN_WG_H
#define LILY_BACKEND_CUDA_ATTN_WG_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when lily_cuda_attn_prefill_ws has a kernel for the shape (Dh 256, G in 1, 2, 4, 8, 16). */
int lily_cuda_attn_wg_ok(int Nq, int Nkv, int Dh);

/* As lily_cuda_attn_prefill (attn.h, part included). With part, the causal spans may be split
 * over blocks (a grid below the SM count: a short chunk deep in the cache) and the partials
 * merged in a second kernel. */
int lily_cuda_attn_prefill_ws(const float *q, int n, const void *kc, const void *vc,
                              const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                              const float *gate, float *out, float *part, lily_cuda_stream st,
                              lily_err *e);

/* Forces the splits of the prefill calls that follow (S = 1: never split; 2..16: S splits, as
 * many as the scratch holds) or restores the automatic choice (0: when the grid leaves SMs idle,
 * as many as fill them). Tests and measurements; not thread-safe. */
void lily_cuda_attn_prefill_force_splits(int S);

#ifdef __cplusplus
}
#endif

#endif
