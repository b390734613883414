/* Embedding, RMSNorm and argmax kernels (see misc.h). */
#include "backend/cuda/misc.h"

#include "backend/cuda/common.cuh"

namespace {

__global__ void embed_kernel(const uint8_t *__restrict__ w, const uint32_t *__restrict__ sb, int dt,
                             int cols, const int32_t *__restrict__ tok, float *x, int ldx) {
    int t = blockIdx.x;
    size_t r = (size_t)tok[t];
    float *o = x + (size_t)t * ldx;
    const uint8_t *row = w + r * dmat_row_bytes(dt, cols);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v;
        if (dt == LILY_CW_BF16) {
            v = bf16f(((const uint16_t *)row)[c]);
        } else {
            uint32_t s = sb[r * (cols / 64) + c / 64];
            uint32_t q = dt == LILY_CW_Q4 ? (row[c >> 1] >> ((c & 1) * 4)) & 15u : row[c];
            v = fmaf(lo_bf16(s), (float)q, hi_bf16(s));
        }
        o[c] = v;
    }
}

__global__ void rmsnorm_kernel(const float *x, int ldx, const float *__restrict__ w, int dim,
                               float eps, float *y, int ldy) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float *yr = y + (size_t)blockIdx.x * ldy;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * r * w[i];
}

/* Orderable 64-bit key: larger value first, then lower index. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ((unsigned long long)u << 32) | (0xffffffffu - (uint32_t)i);
}

__global__ void __launch_bounds__(256)
    argmax_kernel(const float *__restrict__ x, int n, unsigned long long *key) {
    __shared__ unsigned long long red[8];
    unsigned long long best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned long long k = argmax_key(x[i], i);
        best = k > best ? k : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
        best = k > best ? k : best;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            best = red[w] > best ? red[w] : best;
        atomicMax(key, best);
    }
}

__global__ void argmax_final_kernel(const unsigned long long *key, int32_t *out) {
    *out = (int32_t)(0xffffffffu - (uint32_t)(*key & 0xffffffffu));
}

} // namespace

extern "C" int lily_cuda_embed(const lily_dmat *E, const int32_t *d_tok, int n, float *x, int ldx,
                               lily_cuda_stream st, lily_err *e) {
    if (n < 1) return 0;
    embed_kernel<<<n, 256, 0, st>>>(E->w, E->sb, E->dt, E->cols, d_tok, x, ldx);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_rmsnorm(const float *x, int ldx, const float *w, int n, int dim, float eps,
                                 float *y, int ldy, lily_cuda_stream st, lily_err *e) {
    if (n < 1) return 0;
    rmsnorm_kernel<<<n, 256, 0, st>>>(x, ldx, w, dim, eps, y, ldy);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_argmax(const float *x, int n, uint64_t *key, int32_t *out,
                                lily_cuda_stream st, lily_err *e) {
    if (n < 1) return lily_fail(e, "argmax of %d values", n);
    LILY_CU_TRY(cudaMemsetAsync(key, 0, 8, st), e);
    int blocks = (n + 255) / 256;
    if (blocks > 264) blocks = 264;
    argmax_kernel<<<blocks, 256, 0, st>>>(x, n, (unsigned long long *)key);
    LILY_CU_LAUNCHED(e);
    argmax_final_kernel<<<1, 1, 0, st>>>((const unsigned long long *)key, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

namespace {
__global__ void advance_kernel(const int32_t *am, int32_t *tok, int32_t *pos, int32_t *ring,
                               int cap, int32_t *step) {
    /* the step as unsigned: any counter value (a wrapped one, or an uninitialised one, which
     * once wrote before the ring on the H200) indexes inside the ring */
    const int32_t t = *am;
    const uint32_t i = (uint32_t)*step;
    tok[0] = t;
    *pos += 1;
    ring[i % (uint32_t)cap] = t;
    *step = (int32_t)(i + 1u);
}
} // namespace

extern "C" int lily_cuda_advance(const int32_t *d_argmax, int32_t *d_tok, int32_t *d_pos,
                                 int32_t *ring, int ring_cap, int32_t *d_step, lily_cuda_stream st,
                                 lily_err *e) {
    advance_kernel<<<1, 1, 0, st>>>(d_argmax, d_tok, d_pos, ring, ring_cap, d_step);
    LILY_CU_LAUNCHED(e);
    return 0;
}
