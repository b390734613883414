/* Device helpers of the two prefill GEMM kernels (gemm.cu, gemm_q4.cu): cp.async copies into
 * shared memory (16 bytes through L2 only, 4 bytes through L1; a false `valid` fills zeros), their
 * commit/wait, packing two floats into a bf16 pair, and a tile row's X offset. */
#ifndef LILY_BACKEND_CUDA_GEMM_COMMON_CUH
#define LILY_BACKEND_CUDA_GEMM_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ uint32_t bf2(float a, float b) { /* RNE, a in the low half */
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* Element offset in X of the token that tile row t (of rows) reads: row row0 + t, or gather[it]
 * for the grouped GEMM; -1 past the tile's rows. */
__device__ __forceinline__ long long x_row_offset(int t, int rows, int row0, const int32_t *gather,
                                                  int ldx) {
    if (t >= rows) return -1;
    int r = row0 + t;
    if (gather) r = gather[r];
    return (long long)r * ldx;
}

} // namespace

#endif
