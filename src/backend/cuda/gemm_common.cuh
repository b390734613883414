/* Device helpers of the two prefill GEMM kernels (gemm.cu, gemm_q4.cu): cp.async copies into
 * shared memory (16 bytes through L2 only, 4 bytes through L1; a false `valid` fills zeros), their
 * commit/wait, packing two floats into a bf16 pair, and a tile row's X offset; the fp16 pieces of
 * the exact GEMMs (gemm_split.h): the fp16 mma, fp16 dequantization and the hi/lo pairs. */
#ifndef LILY_BACKEND_CUDA_GEMM_COMMON_CUH
#define LILY_BACKEND_CUDA_GEMM_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ uint32_t bf2(float a, float b) { /* RNE, a in the low half */
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* fp16 tensor-core product, fp32 accumulate (the exact GEMMs: fp16 weights x fp16 hi/lo X). */
__device__ __forceinline__ void mma_f16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Two fp32 as an fp16 pair (RNE, a in the low half). */
__device__ __forceinline__ uint32_t h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* A scale/bias word (bf16 scale low, bf16 bias high) as the fp16 pairs (s, s) and (b, b): exact
 * for |values| in fp16's normal range [2^-14, 65504] (bf16 has 8 significant bits, fp16 11). */
__device__ __forceinline__ void sb_f16(uint32_t sb, uint32_t *sc2, uint32_t *bi2) {
    const float s = __uint_as_float(sb << 16), b = __uint_as_float(sb & 0xffff0000u);
    *sc2 = h2(s, s);
    *bi2 = h2(b, b);
}

/* Nibbles j and j + 4 of code word v as the fp16 pair (1024 + q) (exact), minus 1024 (exact),
 * times the group scale plus the bias: the weights rounded once to fp16. */
__device__ __forceinline__ uint32_t dq4h(uint32_t v, int j, uint32_t sc2, uint32_t bi2) {
    const uint32_t k1024 = 0x64006400u;
    uint32_t u = ((v >> (4 * j)) & 0x000F000Fu) | k1024;
    __half2 q = __hsub2(*(const __half2 *)&u, *(const __half2 *)&k1024);
    __half2 w = __hfma2(q, *(const __half2 *)&sc2, *(const __half2 *)&bi2);
    return *(uint32_t *)&w;
}

/* From the split words (hi, lo) of columns c and c' (gemm_split.h): the fp16 pairs (hi_c, hi_c')
 * and (lo_c, lo_c'). */
__device__ __forceinline__ uint32_t hi_pair(uint32_t wc, uint32_t wc2) {
    return __byte_perm(wc, wc2, 0x5410);
}
__device__ __forceinline__ uint32_t lo_pair(uint32_t wc, uint32_t wc2) {
    return __byte_perm(wc, wc2, 0x7632);
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
