/* Split-K partial sums (see gemm_partial.h). */
#include "backend/cuda/gemm_partial.h"

#include "backend/cuda/common.cuh"

namespace {

/* Split-K: Y (+)= P[0] + P[1] + ... in that order, so the result does not depend on which
 * block finished first (fp32 atomics would make the last bits, and a router's near-ties, vary
 * from run to run). One thread per 4 outputs of a row (M % 4 == 0) or per output. */
__global__ void reduce_kernel(const float *__restrict__ P, int split, int n, int M,
                              float *__restrict__ Y, int ldy, int accumulate) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t plane = (size_t)n * M;
    if ((M & 3) == 0) {
        if (i * 4 >= plane) return;
        const size_t t = i * 4 / M, o = i * 4 % M;
        float4 s = ((const float4 *)P)[i];
        for (int z = 1; z < split; z++) {
            const float4 v = ((const float4 *)(P + z * plane))[i];
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        float *y = Y + t * ldy + o;
        if (accumulate) s.x += y[0], s.y += y[1], s.z += y[2], s.w += y[3];
        y[0] = s.x, y[1] = s.y, y[2] = s.z, y[3] = s.w;
    } else {
        if (i >= plane) return;
        const size_t t = i / M, o = i % M;
        float s = P[i];
        for (int z = 1; z < split; z++)
            s += P[z * plane + i];
        float *y = Y + t * ldy + o;
        *y = accumulate ? *y + s : s;
    }
}

float *g_part = nullptr;
size_t g_cap = 0; /* floats */

} // namespace

extern "C" float *lily_cuda_partials(size_t floats, lily_cuda_stream st, lily_err *e) {
    if (floats <= g_cap) return g_part;
    cudaError_t r = cudaStreamSynchronize((cudaStream_t)st);
    if (r != cudaSuccess) {
        lily_fail(e, "gemm partials: %s", cudaGetErrorString(r));
        return nullptr;
    }
    cudaFree(g_part);
    g_part = nullptr, g_cap = 0;
    const size_t c = floats + floats / 4 + 1024;
    r = cudaMalloc(&g_part, c * 4);
    if (r != cudaSuccess) {
        lily_fail(e, "gemm partials: %zu bytes: %s", c * 4, cudaGetErrorString(r));
        return nullptr;
    }
    g_cap = c;
    return g_part;
}

extern "C" int lily_cuda_partials_reduce(const float *P, int split, int n, int M, float *Y, int ldy,
                                         int accumulate, lily_cuda_stream st, lily_err *e) {
    if (split < 1 || n < 1 || M < 1) return 0;
    const size_t work = M % 4 == 0 ? (size_t)n * M / 4 : (size_t)n * M;
    reduce_kernel<<<(unsigned)((work + 255) / 256), 256, 0, (cudaStream_t)st>>>(P, split, n, M, Y,
                                                                                ldy, accumulate);
    LILY_CU_LAUNCHED(e);
    return 0;
}
