/* Full (gated GQA) attention on the GPU: the prep kernel (per-head q/k RMSNorm, partial NeoX RoPE,
 * K/V appended to the bf16 cache), split-K decode attention on tensor cores (one block per KV
 * head and split, the query heads of a group packed so each K/V row is read once; splits sized
 * from the context to fill the SMs; a second kernel merges the splits and applies the sigmoid
 * output gate), and flash-attention prefill on tensor cores (mma.sync m16n8k16 bf16, fp32
 * accumulate; rows of a query tile are (position, head-in-group) pairs, so K/V tiles are shared
 * by the whole group).
 *
 * KV cache layout: per layer, K and V each [max_ctx][Nkv*Dh] bf16. Positions come from device
 * memory (*d_pos is the position of the first token of the call), so a captured decode graph can
 * be replayed at every position. Supported: Dh in {64, 128, 256}, G = Nq/Nkv in {1, 2, 4, 8,
 * 16}. */
#ifndef LILY_BACKEND_CUDA_ATTN_H
#define LILY_BACKEND_CUDA_ATTN_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For n tokens at positions p0+t (p0 = *d_pos): q head h is read from qg + t*ldqg + h*Dh*(1+gated)
 * (its gate follows it when gated), normalised with qn [Dh], rotated on its first R dims, and
 * written to q_out [n][Nq*Dh] (fp32); the gate goes to gate_out [n][Nq*Dh] (unless !gated).
 * k [n][ldkv] is normalised with kn and rotated, v copied: both to row p0+t of kc/vc.
 * inv_freq: [R/2] device, 1/theta^(2i/R) as the CPU reference computes it (fp32). */
int lily_cuda_attn_prep(const float *qg, int ldqg, const float *k, const float *v, int ldkv,
                        int n, const int32_t *d_pos, int Nq, int Nkv, int Dh, int R,
                        const float *inv_freq, const float *qn, const float *kn, float eps,
                        int gated, float *q_out, float *gate_out, uint16_t *kc, uint16_t *vc,
                        lily_cuda_stream st, lily_err *e);

/* Floats of split scratch lily_cuda_attn_decode needs. */
size_t lily_cuda_attn_decode_scratch(int Nq, int Dh, int max_splits);

/* One query per head (q [Nq*Dh]) at position p = *d_pos over cache rows 0..p; scale multiplies
 * q.k. out [Nq*Dh] = softmax(q k^T) V, times sigmoid(gate) when gate != NULL. */
int lily_cuda_attn_decode(const float *q, const uint16_t *kc, const uint16_t *vc,
                          const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                          const float *gate, float *scratch, int max_splits, float *out,
                          lily_cuda_stream st, lily_err *e);

/* n queries q [n][Nq*Dh] at positions p0..p0+n-1 (p0 = *d_pos), causal over cache rows
 * 0..p0+t. out [n][Nq*Dh], times sigmoid(gate [n][Nq*Dh]) when gate != NULL. */
int lily_cuda_attn_prefill(const float *q, int n, const uint16_t *kc, const uint16_t *vc,
                           const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                           const float *gate, float *out, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
