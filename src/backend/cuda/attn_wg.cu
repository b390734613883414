/* The split form shared by the wgmma attention prefill (attn_ws.cu; see attn_wg.h). */
#include "backend/cuda/attn_wg.h"

#include "backend/cuda/attn_wg.cuh"

namespace {

using namespace attn_wg;

/* The splits' partials of each query (t, h) (one warp per query, 8 per block) merged: sum_s
 * 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s, times sigmoid(gate) when gate != NULL. */
__global__ void __launch_bounds__(256)
    attn_wg_merge_kernel(const float *__restrict__ part, int S, int n, int Nq,
                         const float *__restrict__ gate, float *__restrict__ out) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n * Nq) return;
    const int t = row / Nq, h = row % Nq;
    float M = -INFINITY;
    for (int sp = 0; sp < S; sp++) {
        const float2 ml = *(const float2 *)(part + split_ml(sp, n, Nq, t, h));
        if (ml.y > 0.f) M = fmaxf(M, ml.x);
    }
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, L = 0.f;
    for (int sp = 0; sp < S; sp++) {
        const float2 ml = *(const float2 *)(part + split_ml(sp, n, Nq, t, h));
        if (!(ml.y > 0.f)) continue;
        const float w = exp2f(ml.x - M);
        L += w * ml.y;
        const float4 *src = (const float4 *)(part + split_row(sp, n, Nq, t, h) * DH) + lane * 2;
        const float4 a = src[0], b = src[1];
        acc[0] += w * a.x, acc[1] += w * a.y, acc[2] += w * a.z, acc[3] += w * a.w;
        acc[4] += w * b.x, acc[5] += w * b.y, acc[6] += w * b.z, acc[7] += w * b.w;
    }
    const float il = L > 0.f ? 1.f / L : 0.f;
    const size_t off = (size_t)row * DH + lane * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float x = acc[i] * il;
        if (gate) x *= sigmoid_f(gate[off + i]);
        acc[i] = x;
    }
    float4 *dst = (float4 *)(out + off);
    dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

/* lily_cuda_attn_prefill_force_splits: 0 = automatic */
int g_force_splits = 0;

} // namespace

/* Splits of the causal spans for a chunk of n tokens (1 = none): enough for one wave of blocks
 * when the grid alone leaves SMs idle (a short chunk: an agent's turn deep in the cache), or the
 * forced count; never more than the scratch holds. */
int attn_wg::choose_splits(int n, int Nkv, int G, const float *part, int *S, lily_err *e) {
    *S = 1;
    if (!part || g_force_splits == 1) return 0;
    const int blocks = (n + kRows / G - 1) / (kRows / G) * Nkv;
    int want = g_force_splits;
    if (!want) {
        static int nsm[64];
        int dev = 0;
        LILY_CU_TRY(cudaGetDevice(&dev), e);
        if (dev < 0 || dev >= 64) return lily_fail(e, "attention: device %d out of range", dev);
        if (!nsm[dev])
            LILY_CU_TRY(cudaDeviceGetAttribute(&nsm[dev], cudaDevAttrMultiProcessorCount, dev), e);
        want = nsm[dev] / blocks;
    }
    want = want < kMaxSplits ? want : kMaxSplits;
    want = want < kMaxPartBlocks / blocks ? want : kMaxPartBlocks / blocks;
    *S = want > 1 ? want : 1;
    return 0;
}

extern "C" void lily_cuda_attn_prefill_force_splits(int S) {
    g_force_splits = S < 0 ? 0 : S > 16 ? 16 : S;
}

int attn_wg::merge_splits(const float *part, int S, int n, int Nq, const float *gate, float *out,
                          lily_cuda_stream st, lily_err *e) {
    attn_wg_merge_kernel<<<(n * Nq + 7) / 8, 256, 0, st>>>(part, S, n, Nq, gate, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_attn_wg_ok(int Nq, int Nkv, int Dh) {
    if (Nkv < 1 || Nq % Nkv || Dh != DH) return 0;
    const int G = Nq / Nkv;
    return G == 1 || G == 2 || G == 4 || G == 8 || G == 16;
}

extern "C" size_t lily_cuda_attn_prefill_scratch(int Nq, int Nkv, int Dh) {
    return lily_cuda_attn_wg_ok(Nq, Nkv, Dh) ? (size_t)kMaxPartBlocks * kRows * (DH + 2) : 0;
}
