/* MoE routing shared by the decode (moe.cu) and prefill (moe_prefill.cu) kernels: the warp top-k
 * over router logits and the shape checks of the fused kernels. Internal to the CUDA backend. */
#ifndef LILY_BACKEND_CUDA_MOE_ROUTE_CUH
#define LILY_BACKEND_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/common.cuh"
#include "backend/cuda/moe.h"

namespace {

constexpr int kMaxK = 16; /* experts per token supported by the fused decode kernels */

/* ---- routing --------------------------------------------------------------------------------- */

/* Softmax over E logits, top k (ties to the lower id), renormalised when norm. One warp; sl is
 * E floats of this warp's shared scratch. Lane 0 ends with idx/wt valid in the caller's arrays. */
__device__ void topk_warp(const float *logits, int E, int k, int norm, float *sl, int *idx,
                          float *wt) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        float v = logits[e];
        sl[e] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32)
        sum += expf(sl[e] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    float wsum = 0.f;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32)
            if (sl[e] > bv) bv = sl[e], bi = e; /* strided ascending: keeps the lowest id */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        float w = expf(bv - mx) / sum;
        if (lane == 0) {
            idx[j] = bi;
            wt[j] = w;
            sl[bi] = -INFINITY;
        }
        wsum += w;
        __syncwarp();
    }
    if (norm && lane == 0)
        for (int j = 0; j < k; j++)
            wt[j] /= wsum;
    __syncwarp();
}

/* Checks the shapes the fused kernels rely on. */
int check_moe(const lily_cuda_moe *m, lily_err *e) {
    if (m->k < 0 || m->k > kMaxK || (m->k > 0 && (!m->router || !m->gate || !m->up || !m->down)))
        return lily_fail(e, "moe: %d experts per token (0..%d, with router and experts)", m->k,
                         kMaxK);
    if (m->E > 1024) return lily_fail(e, "moe: %d experts (at most 1024)", m->E);
    if (m->k == 0 && !m->sh_gate) return lily_fail(e, "moe: neither experts nor a shared expert");
    const lily_dmat *g = m->k ? m->gate : m->sh_gate, *d = m->k ? m->down : m->sh_down;
    if (m->sh_gate && m->k &&
        (m->sh_gate->dt != g->dt || m->sh_down->dt != d->dt || m->sh_up->dt != g->dt))
        return lily_fail(e, "moe: the fused CUDA kernels need the shared expert in the experts'"
                            " weight format");
    if (m->up && (m->up->dt != g->dt)) return lily_fail(e, "moe: gate and up differ in format");
    return 0;
}

} // namespace

#endif
