/* The KV cache row format of attn.h, for the attention kernels' files (C++ only). */
#ifndef LILY_BACKEND_CUDA_ATTN_KV_CUH
#define LILY_BACKEND_CUDA_ATTN_KV_CUH

#include "backend/cuda/attn.h"
#include "backend/cuda/common.cuh"

/* Largest |code| (attn.h): c + 128 stays below 2^15, so a code splits into balanced bytes
 * c = 256 h + l with h, l in [-128, 127] (attn_wg.cu's s8 operands). */
constexpr int kKvCodeMax = LILY_CUDA_KV_CODE_MAX;

/* Bytes of one cache row (one position, all KV heads): codes, scales, padding to 16. */
static __host__ __device__ __forceinline__ size_t kv_row_bytes(int Nkv, int Dh) {
    return (size_t)Nkv * Dh * 2 + (((size_t)Nkv * 4 + 15) & ~(size_t)15);
}

#endif
