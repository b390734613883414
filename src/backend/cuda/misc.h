/* Small CUDA kernels of the forward pass: embedding lookup (dequantizing one row per token),
 * row-wise RMSNorm, and argmax over the logits (greedy decoding without a host round trip). */
#ifndef LILY_BACKEND_CUDA_MISC_H
#define LILY_BACKEND_CUDA_MISC_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[t][0..cols) = row d_tok[t] of E (fp32), t < n; x row stride ldx. */
int lily_cuda_embed(const lily_dmat *E, const int32_t *d_tok, int n, float *x, int ldx,
                    lily_cuda_stream st, lily_err *e);

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w for n rows of dim values (in place allowed). */
int lily_cuda_rmsnorm(const float *x, int ldx, const float *w, int n, int dim, float eps, float *y,
                      int ldy, lily_cuda_stream st, lily_err *e);

/* *out = the index of the largest of x[0..n) (the lowest such index on ties). key: 8 bytes of
 * device scratch (a packed value/index maximum that the blocks combine with atomicMax). */
int lily_cuda_argmax(const float *x, int n, uint64_t *key, int32_t *out, lily_cuda_stream st,
                     lily_err *e);

/* Feeds a greedy decode step's result into the next one, on the device: d_tok[0] = *d_argmax,
 * *d_pos += 1, ring[(unsigned)*d_step % ring_cap] = the token, *d_step += 1. Captured at the end of the
 * decode graph, so graph replays chain without the host. */
int lily_cuda_advance(const int32_t *d_argmax, int32_t *d_tok, int32_t *d_pos, int32_t *ring,
                      int ring_cap, int32_t *d_step, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
