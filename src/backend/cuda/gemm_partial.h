/* Split-K partial sums of the prefill GEMMs (gemm.cu, gemm_q4.cu). A GEMM whose grid is too small
 * for the GPU splits its k range over blockIdx.z; block z writes its sums to plane z of a buffer
 * P [split][n][M] (plain stores), and one reduction kernel then adds the planes in k order into Y.
 * Unlike fp32 atomics into Y, the sums are the same on every run, so a router's near-ties always
 * resolve the same way. */
#ifndef LILY_BACKEND_CUDA_GEMM_PARTIAL_H
#define LILY_BACKEND_CUDA_GEMM_PARTIAL_H

#include <stddef.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The module's partial-sum buffer with room for `floats` floats (grown, the stream synchronized
 * first, to the largest request; prefill only, never inside a graph capture; the backend runs
 * one stream, so one buffer serves every call). NULL with e set on failure. */
float *lily_cuda_partials(size_t floats, lily_cuda_stream st, lily_err *e);

/* Y[t][o] = (accumulate ? Y[t][o] : 0) + P[0][t][o] + ... + P[split - 1][t][o], t < n, o < M,
 * planes of n x M floats, Y with row stride ldy. */
int lily_cuda_partials_reduce(const float *P, int split, int n, int M, float *Y, int ldy,
                              int accumulate, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
