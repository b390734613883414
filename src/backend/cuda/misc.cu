/* Embedding, RMSNorm and argmax kernels (see misc.h). */
#include "backend/cuda/misc.h"

#include "backend/cuda/common.cuh"

namespace {

__global__ void embed_kernel(const uint8_t *__restrict__ w, const uint32_t *__restrict__ sb,
                             int dt, int cols, const int32_t *__restrict__ tok, float *x,
                             int ldx) {
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
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float *__restrict__ x, int n,
                                                      int32_t *out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > bv) bv = v, bi = i;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) *out = bi == 0x7fffffff ? 0 : bi;
    }
}

} // namespace

extern "C" int lily_cuda_embed(const lily_dmat *E, const int32_t *d_tok, int n, float *x,
                               int ldx, lily_cuda_stream st, lily_err *e) {
    if (n < 1) return 0;
    embed_kernel<<<n, 256, 0, st>>>(E->w, E->sb, E->dt, E->cols, d_tok, x, ldx);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_rmsnorm(const float *x, int ldx, const float *w, int n, int dim,
                                 float eps, float *y, int ldy, lily_cuda_stream st, lily_err *e) {
    if (n < 1) return 0;
    rmsnorm_kernel<<<n, 256, 0, st>>>(x, ldx, w, dim, eps, y, ldy);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_argmax(const float *x, int n, int32_t *out, lily_cuda_stream st,
                                lily_err *e) {
    argmax_kernel<<<1, 1024, 0, st>>>(x, n, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}
