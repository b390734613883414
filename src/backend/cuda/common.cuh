/* Device-side helpers shared by the CUDA kernels (C++ only; never included from C): error
 * checking of runtime calls, bf16 unpacking, warp reductions, the 16-byte-chunk dot products of
 * the three weight formats, and the transposed shared-memory layout the GEMV kernels read x from.
 *
 * Weight formats on the device (see cuda_mem.h): Q4 and Q8 keep the MLX code words as stored;
 * each 64-column group's bf16 scale and bias are interleaved into one 32-bit word (scale in the
 * low half), so one load fetches both. BF16 rows are stored as is. A "chunk" is 16 bytes of codes:
 * 32 weights (Q4), 16 (Q8) or 8 (BF16). */
#ifndef LILY_BACKEND_CUDA_COMMON_CUH
#define LILY_BACKEND_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_mem.h"

/* The base headers are C11: give them C linkage and a C++ spelling of _Noreturn. */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#include "base/err.h"
}

/* Checks a runtime call; on failure fills e and returns -1 from the enclosing function. */
#define LILY_CU_TRY(call, e)                                                                   \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess)                                                               \
            return lily_fail((e), "%s: %s (%s:%d)", #call, cudaGetErrorString(err_), __FILE__, \
                             __LINE__);                                                        \
    } while (0)

/* After a launch: reports a launch-configuration error (not an asynchronous fault). */
#define LILY_CU_LAUNCHED(e) LILY_CU_TRY(cudaGetLastError(), e)

static __device__ __forceinline__ float lo_bf16(uint32_t v) {
    return __uint_as_float(v << 16);
}
static __device__ __forceinline__ float hi_bf16(uint32_t v) {
    return __uint_as_float(v & 0xffff0000u);
}
static __device__ __forceinline__ float bf16f(uint16_t v) {
    return __uint_as_float((uint32_t)v << 16);
}
/* Round-to-nearest-even fp32 -> bf16 bits (inputs are finite in practice; NaN stays NaN). */
static __device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static __device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
    return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16);
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over aligned groups of W lanes (W a power of two <= 32). */
template <int W> static __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static __device__ __forceinline__ float silu_f(float x) {
    return x / (1.0f + expf(-x));
}

/* Weights per 16-byte chunk for each device weight type. */
template <int DT> struct wtype;
template <> struct wtype<LILY_CW_Q4> {
    static constexpr int epc = 32; /* elements per chunk */
    static constexpr int cpg = 2;  /* chunks per 64-column group */
};
template <> struct wtype<LILY_CW_Q8> {
    static constexpr int epc = 16;
    static constexpr int cpg = 4;
};
template <> struct wtype<LILY_CW_BF16> {
    static constexpr int epc = 8;
    static constexpr int cpg = 8;
};

/* The transposed x layout: float4 number i of chunk c sits at xs4[i * nchunk + c], so the lanes
 * of a warp, which read consecutive chunks, hit consecutive 16-byte words (no bank conflicts). */
static __device__ __forceinline__ int xs_index(int col, int epc, int nchunk) {
    int c = col / epc, r = col % epc;
    return ((r >> 2) * nchunk + c) * 4 + (r & 3);
}

/* Dot product of one 16-byte chunk of codes with its x values (fp32), before scale and bias for
 * the Q types: returns sum_i q_i * x_i (Q) or sum_i w_i * x_i (BF16). */
template <int DT>
static __device__ __forceinline__ float chunk_dot(uint4 w, const float4 *xs4, int c, int nchunk);

template <>
__device__ __forceinline__ float chunk_dot<LILY_CW_Q4>(uint4 w, const float4 *xs4, int c,
                                                       int nchunk) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    /* two accumulators: dependent fma chains of 16, not 32 (more instruction-level parallelism) */
    float acc = 0.f, acc2 = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 a = xs4[(2 * i) * nchunk + c], b = xs4[(2 * i + 1) * nchunk + c];
        uint32_t v = ws[i];
        /* 0x4B000000 | q is the float 2^23 + q: exact, no int->float conversion needed */
        acc = fmaf(__uint_as_float(0x4B000000u | (v & 15u)) - 8388608.f, a.x, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | ((v >> 4) & 15u)) - 8388608.f, a.y, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | ((v >> 8) & 15u)) - 8388608.f, a.z, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | ((v >> 12) & 15u)) - 8388608.f, a.w, acc);
        acc2 = fmaf(__uint_as_float(0x4B000000u | ((v >> 16) & 15u)) - 8388608.f, b.x, acc2);
        acc2 = fmaf(__uint_as_float(0x4B000000u | ((v >> 20) & 15u)) - 8388608.f, b.y, acc2);
        acc2 = fmaf(__uint_as_float(0x4B000000u | ((v >> 24) & 15u)) - 8388608.f, b.z, acc2);
        acc2 = fmaf(__uint_as_float(0x4B000000u | (v >> 28)) - 8388608.f, b.w, acc2);
    }
    return acc + acc2;
}

template <>
__device__ __forceinline__ float chunk_dot<LILY_CW_Q8>(uint4 w, const float4 *xs4, int c,
                                                       int nchunk) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 a = xs4[i * nchunk + c];
        uint32_t v = ws[i];
        acc = fmaf(__uint_as_float(0x4B000000u | (v & 255u)) - 8388608.f, a.x, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | ((v >> 8) & 255u)) - 8388608.f, a.y, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | ((v >> 16) & 255u)) - 8388608.f, a.z, acc);
        acc = fmaf(__uint_as_float(0x4B000000u | (v >> 24)) - 8388608.f, a.w, acc);
    }
    return acc;
}

template <>
__device__ __forceinline__ float chunk_dot<LILY_CW_BF16>(uint4 w, const float4 *xs4, int c,
                                                         int nchunk) {
    float4 a = xs4[c], b = xs4[nchunk + c];
    float acc = lo_bf16(w.x) * a.x;
    acc = fmaf(hi_bf16(w.x), a.y, acc);
    acc = fmaf(lo_bf16(w.y), a.z, acc);
    acc = fmaf(hi_bf16(w.y), a.w, acc);
    acc = fmaf(lo_bf16(w.z), b.x, acc);
    acc = fmaf(hi_bf16(w.z), b.y, acc);
    acc = fmaf(lo_bf16(w.w), b.z, acc);
    acc = fmaf(hi_bf16(w.w), b.w, acc);
    return acc;
}

/* Streaming 16-byte load of read-only weights that skips L1 allocation (weights are read once
 * per step). Not volatile, so the compiler may hoist it to keep several loads in flight. */
static __device__ __forceinline__ uint4 ldg_stream(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* An ordinary launch of kernel k through cudaLaunchKernelEx (no launch attributes): the
 * arguments are converted to the kernel's parameter types, errors come back as the result. */
template <typename... P, typename... A>
static cudaError_t launch_kernel(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                 lily_cuda_stream st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)st;
    cfg.attrs = nullptr;
    cfg.numAttrs = 0;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

/* Raises kernel k's dynamic shared-memory limit on the current device to at least smem, never
 * lowering it: a graph captured with a larger launch of k stays valid when a later launch of k
 * (another row count, another matrix) needs less. */
template <typename... P> static cudaError_t smem_at_least(void (*k)(P...), size_t smem) {
    cudaFuncAttributes a;
    cudaError_t r = cudaFuncGetAttributes(&a, k);
    if (r != cudaSuccess || (size_t)a.maxDynamicSharedSizeBytes >= smem) return r;
    return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

/* Bytes of one row of codes for a device weight type. */
static __host__ __device__ __forceinline__ size_t dmat_row_bytes(int dt, int cols) {
    return dt == LILY_CW_Q4 ? (size_t)cols / 2 : dt == LILY_CW_Q8 ? (size_t)cols : (size_t)cols * 2;
}

/* NR independent row dot products against x in the transposed shared layout, LPR lanes per row
 * (lane sl = lane % LPR takes chunks sl, sl+LPR, ...). wr[i]: row i's codes, sbr[i]: its
 * scale/bias words (Q only), xsum[c]: the sum of x over chunk c (Q only: the bias term is
 * bias * xsum). Rows with wr[i] == NULL are skipped (acc stays 0). first, when given, holds the
 * rows' chunk sl, loaded before x was ready (hides one HBM latency). Returns lane partials in acc;
 * the caller reduces over the LPR lanes. All NR rows' loads of one step are issued before any
 * use, so each lane has NR (x unroll) 16-byte loads in flight. */
template <int DT, int LPR, int NR>
static __device__ __forceinline__ void
rows_dot(const uint8_t *const *wr, const uint32_t *const *sbr, const float4 *xs4, const float *xsum,
         int nchunk, int sl, float *acc, const uint4 *first = nullptr) {
    constexpr int cpg = wtype<DT>::cpg;
#pragma unroll
    for (int i = 0; i < NR; i++)
        acc[i] = 0.f;
#pragma unroll 2
    for (int c = sl; c < nchunk; c += LPR) {
        uint4 w[NR];
        if (first && c == sl) { /* chunk sl was loaded ahead by the caller */
#pragma unroll
            for (int i = 0; i < NR; i++)
                w[i] = first[i];
        } else {
#pragma unroll
            for (int i = 0; i < NR; i++)
                w[i] = wr[i] ? ldg_stream(wr[i] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
        }
        if (DT == LILY_CW_BF16) {
#pragma unroll
            for (int i = 0; i < NR; i++)
                acc[i] += chunk_dot<DT>(w[i], xs4, c, nchunk);
        } else {
            uint32_t sb[NR];
#pragma unroll
            for (int i = 0; i < NR; i++)
                sb[i] = wr[i] ? __ldg(sbr[i] + c / cpg) : 0u;
            float xsm = xsum[c];
#pragma unroll
            for (int i = 0; i < NR; i++)
                acc[i] = fmaf(lo_bf16(sb[i]), chunk_dot<DT>(w[i], xs4, c, nchunk),
                              fmaf(hi_bf16(sb[i]), xsm, acc[i]));
        }
    }
}

/* Writes x[0..n) into the transposed layout xs (see xs_index), scaled per element by f(i). Then
 * (after a barrier the caller places) chunk sums are computed by store_xsum. */
template <int DT>
static __device__ __forceinline__ void store_xsum(const float *xs, float *xsum, int nchunk) {
    constexpr int epc = wtype<DT>::epc;
    if (DT == LILY_CW_BF16) return;
    const float4 *xs4 = (const float4 *)xs;
    for (int c = threadIdx.x; c < nchunk; c += blockDim.x) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < epc / 4; i++) {
            float4 a = xs4[i * nchunk + c];
            s += (a.x + a.y) + (a.z + a.w);
        }
        xsum[c] = s;
    }
}

/* Block-wide sum (all threads get the result). red: 32 floats of shared scratch. */
static __device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.f;
    return warp_sum(t);
}

/* Tensor-core helpers shared by the GEMM and the flash-attention kernels (sm_80+). */
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif
