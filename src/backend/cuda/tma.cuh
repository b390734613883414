/* Hopper's tensor memory accelerator (TMA) and shared-memory mbarriers, the few forms the
 * kernels use: a tiled tensor map encoded on the host (through the driver's entry point, so
 * nothing links libcuda), a 2D / 3D tile copied into shared memory by one thread, and the
 * mbarrier that counts its bytes. CUDA C++ only. */
#ifndef LILY_BACKEND_CUDA_TMA_CUH
#define LILY_BACKEND_CUDA_TMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "base/err.h"

/* A driver API function (name, ABI version) through the runtime's entry point, so nothing links
 * libcuda; NULL (with the error) when the driver has none. */
static inline void *lily_driver_fn(const char *name, unsigned version, lily_err *e) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        lily_fail(e, "tma: the driver has no %s", name);
        return nullptr;
    }
    return fn;
}

/* A tiled map of a rank-dimensional tensor at base (dims[0] the contiguous one, strides[i] the
 * bytes between steps of dimension i + 1), copied in boxes of box[] elements; out-of-range
 * elements of a box arrive as zeros. 0 = success. */
static inline int lily_tma_map(CUtensorMap *map, CUtensorMapDataType type, int rank,
                               const void *base, const uint64_t *dims, const uint64_t *strides,
                               const uint32_t *box, CUtensorMapSwizzle swizzle, lily_err *e) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (!encode && !(encode = (PFN_cuTensorMapEncodeTiled_v12000)lily_driver_fn(
                         "cuTensorMapEncodeTiled", 12000, e)))
        return -1;
    cuuint64_t d[5], s[4];
    cuuint32_t b[5], one[5];
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i], b[i] = box[i], one[i] = 1;
        if (i + 1 < rank) s[i] = strides[i];
    }
    const CUresult r = encode(
        map, type, (cuuint32_t)rank, (void *)base, d, s, b, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : lily_fail(e, "tma: cuTensorMapEncodeTiled failed (%d)", (int)r);
}

/* The end (one past the last byte) of the device allocation that holds p: what a tensor map
 * over p may read without faulting. 0 = success. */
static inline int lily_alloc_end(const void *p, uintptr_t *end, lily_err *e) {
    static PFN_cuMemGetAddressRange_v3020 range = nullptr;
    if (!range &&
        !(range = (PFN_cuMemGetAddressRange_v3020)lily_driver_fn("cuMemGetAddressRange", 3020, e)))
        return -1;
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult r = range(&base, &size, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS)
        return lily_fail(e, "tma: cuMemGetAddressRange failed (%d): not a device allocation",
                         (int)r);
    *end = (uintptr_t)base + size;
    return 0;
}

__device__ __forceinline__ uint32_t lily_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* An mbarrier expecting count arrivals a phase; visible to the async proxy after the fence and
 * a block barrier. */
__device__ __forceinline__ void lily_mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lily_smem_u32(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void lily_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* This thread's arrival, announcing bytes that copies will complete on the barrier. */
__device__ __forceinline__ void lily_mbar_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lily_smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

/* Waits for the barrier's phase of the given parity to complete. A phase that never completes
 * (a copy that never lands) traps after 2^22 polls (each try_wait may suspend for a while: some
 * milliseconds to seconds in all, where a real stage takes microseconds) instead of hanging the
 * device. */
__device__ __forceinline__ void lily_mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t a = lily_smem_u32(bar);
    for (uint32_t i = 0;; i++) {
        uint32_t done;
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
        if (done) return;
        if (i == (1u << 22)) __trap();
    }
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src into shared memory
 * at dst, completing on bar (no tensor map). */
__device__ __forceinline__ void lily_bulk_copy(uint32_t dst, const void *src, uint32_t bytes,
                                               uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(lily_smem_u32(bar))
                 : "memory");
}

/* The box of map at (x, y[, z]) into shared memory at dst, completing on bar. */
__device__ __forceinline__ void lily_tma_2d(void *dst, const CUtensorMap *map, int x, int y,
                                            uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(lily_smem_u32(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(lily_smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void lily_tma_3d(void *dst, const CUtensorMap *map, int x, int y, int z,
                                            uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(lily_smem_u32(dst)),
                 "l"((uint64_t)map), "r"(x), "r"(y), "r"(z), "r"(lily_smem_u32(bar))
                 : "memory");
}

#endif
