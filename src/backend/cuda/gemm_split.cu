/* fp32 activations -> fp16 hi/lo words with a power-of-two row scale (see gemm_split.h). */
#include "backend/cuda/gemm_split.h"

#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"

namespace {

constexpr int kThreads = 256;

/* x, or silu(x) * u for the SwiGLU down projections (GLU). */
template <bool GLU> __device__ __forceinline__ float xval(const float *x, const float *u, int c) {
    if (!GLU) return x[c];
    const float g = x[c];
    return g / (1.0f + expf(-g)) * u[c];
}

/* The block's largest m (a maximum: the same bits in any order). red: kThreads / 32 floats of
 * shared scratch, which may still be being read by an earlier reduction (hence the barrier). */
__device__ __forceinline__ float block_max_row(float m, float *red) {
    m = warp_max(m);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int i = 1; i < kThreads / 32; i++)
        m = fmaxf(m, red[i]);
    return m;
}

/* The power of two that puts the row's max m in [2^14, 2^15) (m = f 2^b, f in [1, 2): scale by
 * 2^(14 - b); 1 for a zero or subnormal max); thread 0 writes its inverse to *mul. */
__device__ __forceinline__ float row_scale(float m, float *mul) {
    int sh = 0;
    if (m > 0.f) sh = 14 - (int)((__float_as_uint(m) >> 23) & 255u) + 127;
    if (m > 0.f && m < 1.17549435e-38f) sh = 0;
    sh = max(-126, min(sh, 126));
    if (threadIdx.x == 0) *mul = __uint_as_float((uint32_t)(127 - sh) << 23);
    return __uint_as_float((uint32_t)(127 + sh) << 23);
}

/* One split word of a scaled value: (hi, lo) fp16, hi in the low half. */
__device__ __forceinline__ uint32_t split_word(float v) {
    const __half h = __float2half_rn(v);
    const __half l = __float2half_rn(v - __half2float(h));
    return (uint32_t)__half_as_ushort(h) | ((uint32_t)__half_as_ushort(l) << 16);
}

/* One block per row: the row's max |x| (non-finite values ignored, so they stay inf/nan in hi),
 * then every column split in a second pass (the row is re-read from L2). GLU: the row is
 * silu(X) * U (same layout), computed in both passes, as silu_mul computes it. */
template <bool GLU>
__global__ void __launch_bounds__(kThreads)
    xsplit_kernel(const float *__restrict__ X, const float *__restrict__ U, int ldx, int K,
                  uint32_t *__restrict__ out, float *__restrict__ mul) {
    const int t = blockIdx.x;
    const float *x = X + (size_t)t * ldx;
    const float *u = GLU ? U + (size_t)t * ldx : nullptr;
    float m = 0.f;
    for (int c = threadIdx.x; c < K; c += kThreads) {
        const float a = fabsf(xval<GLU>(x, u, c));
        if (a <= 3.0e38f) m = fmaxf(m, a);
    }
    __shared__ float red[kThreads / 32];
    const float s = row_scale(block_max_row(m, red), mul + t);
    uint32_t *o = out + (size_t)t * K;
    for (int c = threadIdx.x; c < K; c += kThreads)
        o[c] = split_word(xval<GLU>(x, u, c) * s);
}

/* RMSNorm (as misc.cu's rmsnorm_kernel: y = x / sqrt(mean(x^2) + eps) * w, the same sums with
 * the same block size) that also splits y as xsplit_kernel would (y read back by the thread
 * that wrote it, so x == y is allowed). */
__global__ void __launch_bounds__(kThreads)
    rmsnorm_split_kernel(const float *x, int ldx, const float *__restrict__ w, int dim, float eps,
                         float *y, int ldy, uint32_t *__restrict__ out, float *__restrict__ mul) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float *xr = x + (size_t)t * ldx;
    float *yr = y + (size_t)t * ldy;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / dim + eps);
    float m = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * r * w[i];
        yr[i] = v;
        const float a = fabsf(v);
        if (a <= 3.0e38f) m = fmaxf(m, a);
    }
    const float s = row_scale(block_max_row(m, red), mul + t); /* red: block_sum's too */
    uint32_t *o = out + (size_t)t * dim;
    for (int c = threadIdx.x; c < dim; c += kThreads)
        o[c] = split_word(yr[c] * s);
}

uint32_t *g_words = nullptr;
float *g_mul = nullptr;
size_t g_cap_words = 0, g_cap_rows = 0;
/* the last split's input, and the input declared unchanged */
const float *g_last = nullptr, *g_held = nullptr;
/* the rows whose words lily_cuda_rmsnorm_split just wrote: a hold of them keeps the words */
const float *g_fresh = nullptr;
int g_last_ldx = 0, g_last_n = 0, g_last_k = 0;

} // namespace

/* Words split before the hold may be of older contents of X: the hold starts afresh. */
extern "C" void lily_cuda_xsplit_hold(const float *X) {
    g_held = X;
    if (!X || X != g_fresh) g_last = nullptr; /* else: the words of the norm that wrote X */
    g_fresh = nullptr;
}

extern "C" int lily_cuda_gemm_exact(void) {
    return lily_cuda_prec_get().gemm_exact;
}

namespace {

/* Room for n rows of K words (the old buffers freed after the stream's work). */
int reserve(int n, int K, lily_cuda_stream st, lily_err *e) {
    const size_t need = (size_t)n * K, rows = (size_t)n;
    if (need > g_cap_words || rows > g_cap_rows) {
        /* grow geometrically; the old buffers may still be read by queued kernels */
        LILY_CU_TRY(cudaStreamSynchronize((cudaStream_t)st), e);
        cudaFree(g_words);
        cudaFree(g_mul);
        g_words = nullptr, g_mul = nullptr, g_cap_words = g_cap_rows = 0;
        size_t cw = need + need / 4, cr = rows + rows / 4 + 64;
        LILY_CU_TRY(cudaMalloc(&g_words, cw * 4), e);
        LILY_CU_TRY(cudaMalloc(&g_mul, cr * 4), e);
        g_cap_words = cw, g_cap_rows = cr;
    }
    return 0;
}

int split(const float *X, const float *U, int ldx, int n, int K, lily_cuda_stream st, lily_err *e) {
    if (n < 1 || K < 1 || ldx < K)
        return lily_fail(e, "gemm: activations of %d rows x %d (ld %d)", n, K, ldx);
    g_last = nullptr, g_fresh = nullptr;
    if (reserve(n, K, st, e)) return -1;
    if (U)
        xsplit_kernel<true><<<n, kThreads, 0, (cudaStream_t)st>>>(X, U, ldx, K, g_words, g_mul);
    else
        xsplit_kernel<false><<<n, kThreads, 0, (cudaStream_t)st>>>(X, U, ldx, K, g_words, g_mul);
    LILY_CU_LAUNCHED(e);
    g_last = X, g_last_ldx = ldx, g_last_n = n, g_last_k = K;
    return 0;
}

} // namespace

extern "C" int lily_cuda_xsplit(const float *X, int ldx, int n, int K, const uint32_t **words,
                                const float **mul, lily_cuda_stream st, lily_err *e) {
    if (!(X == g_held && X == g_last && ldx == g_last_ldx && n == g_last_n && K == g_last_k) &&
        split(X, nullptr, ldx, n, K, st, e))
        return -1;
    *words = g_words;
    *mul = g_mul;
    return 0;
}

extern "C" int lily_cuda_xsplit_silu_mul(float *G, const float *U, int ld, int n, int K,
                                         lily_cuda_stream st, lily_err *e) {
    g_held = G;
    return split(G, U, ld, n, K, st, e);
}

extern "C" int lily_cuda_rmsnorm_split(const float *x, int ldx, const float *w, int n, int dim,
                                       float eps, float *y, int ldy, lily_cuda_stream st,
                                       lily_err *e) {
    if (n < 1) return 0;
    if (dim < 1 || ldy < dim)
        return lily_fail(e, "rmsnorm_split: rows of %d values (ld %d)", dim, ldy);
    g_last = nullptr, g_fresh = nullptr;
    if (reserve(n, dim, st, e)) return -1;
    rmsnorm_split_kernel<<<n, kThreads, 0, (cudaStream_t)st>>>(x, ldx, w, dim, eps, y, ldy, g_words,
                                                               g_mul);
    LILY_CU_LAUNCHED(e);
    g_last = y, g_last_ldx = ldy, g_last_n = n, g_last_k = dim, g_fresh = y;
    return 0;
}
