/* Exact attention prefill on wgmma (see attn_wg.h). */
#include "backend/cuda/attn_wg.h"

#include "backend/cuda/attn_wg.cuh"

namespace {

using namespace attn_wg;

constexpr int kThreads = 256; /* two warpgroups, no producer warps */

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

/* grid (ceil(n / P), Nkv) with P = 128 / G positions per block; two warpgroups. Row r (0..127) of
 * a block is (position qt P + r / G, head j G + r % G); warpgroup w owns rows 64 w .. 64 w + 63,
 * its warp i rows 16 i .. 16 i + 15 of those, and a thread rows r0 = 64 w + 16 i + g and r0 + 8
 * (wgmma's accumulator layout). Per 64-position tile: the block's threads convert the K and V
 * rows cp.async landed into the operand planes (K: balanced s8 digits; V: exact fp16 digits,
 * transposed), then each warpgroup runs S = Q K^T on s8 wgmma (hh, hl + lh and with LL ll
 * products, s32 accumulators), the online softmax, and O += P V on f16 wgmma from registers
 * (P hi and lo against the V digit planes: three products). */
template <int G, bool LL, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    attn_wg_kernel(const float *__restrict__ q, int n, const uint8_t *__restrict__ kc,
                   const uint8_t *__restrict__ vc, const int32_t *d_pos, int Nkv, float scale,
                   const float *__restrict__ gate, float *__restrict__ out,
                   float *__restrict__ part) {
    constexpr int P = kRows / G;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float s_qs[kRows], s_ks[kKt], s_vs[kKt];
    const uint32_t sb = (uint32_t)__cvta_generic_to_shared(smem);
    const BlockSpan bs = block_span<G, SPLIT>(n, Nkv, d_pos);
    const int Nq = bs.Nq, j = bs.j, qt = bs.qt, p0 = bs.p0, kv_end = bs.kv_end, qmin = bs.qmin;
    const int it_beg = bs.it_beg, it_end = bs.it_end;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, tq = lane & 3;
    if (SPLIT && it_beg == it_end) { /* nothing of the span: an empty partial */
        empty_partial<G>(part, bs, n, tid);
        return;
    }
    const size_t row = kv_row_bytes(Nkv, DH);
    const uint8_t *kr = kc + (size_t)j * DH * 2, *vr = vc + (size_t)j * DH * 2;
    const uint8_t *ksc = kc + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    const uint8_t *vsc = vc + (size_t)Nkv * DH * 2 + (size_t)j * 4;

    auto load = [&](int i) { /* tile i's K and V rows and scales into the landing area */
        const int kv0 = i * kKt;
#pragma unroll
        for (int x = 0; x < 8; x++) {
            const int c = tid + kThreads * x, r = c >> 5, c16 = c & 31; /* 32 chunks per row */
            const int p = kv0 + r;
            const bool ok = p < kv_end;
            const size_t go = (size_t)(ok ? p : 0) * row + c16 * 16;
            cp_async16(sb + OFF_RAW + r * 512 + c16 * 16, kr + go, ok);
            cp_async16(sb + OFF_RAW + 32768 + r * 512 + c16 * 16, vr + go, ok);
        }
        if (tid < 2 * kKt) {
            const int p = kv0 + (tid & (kKt - 1));
            const bool ok = p < kv_end;
            cp_async4(sb + OFF_SC + tid * 4,
                      (tid < kKt ? ksc : vsc) + (size_t)(ok ? p : 0) * row, ok);
        }
        cp_async_commit();
    };
    load(it_beg);

    /* Q rows as 16-bit codes split into balanced s8 digits, in the warpgroup's planes */
    q_planes<G>(smem, s_qs, q, n, Nq, qt, j, wg, wi, lane);
    proxy_fence();
    __syncthreads();

    const int r0 = wg * 64 + wi * 16 + g, r1 = r0 + 8;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions (rows past n: beyond) */
    /* S in the log2 domain: the codes' product times the q row scale, the K scale, scale log2 e */
    const float f0 = s_qs[r0] * scale * kLog2e, f1 = s_qs[r1] * scale * kLog2e;
    const uint32_t qa = sb + OFF_Q + wg * 32768;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float of_vf = 1.f; /* the V-scale factor O is kept in (attn.cu's exact prefill) */
    for (int it = it_beg; it < it_end; it++) {
        const int kv0 = it * kKt;
        cp_async_wait0();
        __syncthreads(); /* tile it landed; every wgmma of tile it - 1 has completed */
        /* K rows -> kh, kl planes, V rows -> vh, vl planes (transposed) */
#pragma unroll
        for (int x = 0; x < 4; x++) k_unit(smem, tid + kThreads * x);
#pragma unroll
        for (int x = 0; x < 4; x++) v_unit(smem, tid + kThreads * x);
        if (tid < kKt) s_ks[tid] = *(const float *)(smem + OFF_SC + tid * 4);
        else if (tid < 2 * kKt) s_vs[tid - kKt] = *(const float *)(smem + OFF_SC + tid * 4);
        proxy_fence();
        __syncthreads(); /* planes written; the landing area is free */
        if (it + 1 < it_end) load(it + 1);

        /* S = Q K^T over the digits: code products 65536 hh + 256 (hl + lh) (+ ll) */
        int hh[32], md[32], ll[LL ? 32 : 1];
        /* the descriptors are loop invariants: an opaque zero keeps the compiler from holding
         * all of them in registers across the loop (255 are in use) */
        const uint32_t z = opaque_zero(), qz = qa + z, kz = sb + OFF_K + z;
        wg_fence();
        issue_s<LL>(qz, kz, hh, md, ll);
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 32; i++) {
            reg_fence(hh[i]);
            reg_fence(md[i]);
            if constexpr (LL) reg_fence(ll[i]);
        }
        /* scale, causal mask (only where the tile reaches a query position), online softmax */
        const bool full = kv0 + kKt - 1 <= qmin;
        float s[32];
        s_scores<LL>(hh, md, ll, s_ks, f0, f1, full, kv0, qp0, qp1, tq, s);
        /* P's fp16 parts: the V scales enter relative to a power of two vf of the tile, O kept
         * times the last tile's vf (attn_softmax.cuh) */
        const float vf = vscale_factor(warp_max(fmaxf(s_vs[lane], s_vs[lane + 32])));
        const float of = vf / of_vf;
        of_vf = vf;
        float d0, d1;
        softmax_tile<8>(s, s_vs, vf, of, tq, m0, m1, l0, l1, d0, d1);
        if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) {
#pragma unroll
            for (int nb = 0; nb < 32; nb++) {
                o[4 * nb + 0] *= d0, o[4 * nb + 1] *= d0;
                o[4 * nb + 2] *= d1, o[4 * nb + 3] *= d1;
            }
        }
        /* O += P V: P's hi and lo A fragments from the S accumulator layout */
        uint32_t ph[4][4], pl[4][4];
        p_split(s, ph, pl);
#pragma unroll
        for (int i = 0; i < 128; i++) reg_fence(o[i]);
        wg_fence();
        const uint32_t vz = sb + OFF_V + opaque_zero();
        issue_pv(vz, o, ph, pl);
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 128; i++) reg_fence(o[i]);
    }
    finish_rows<SPLIT>(part, o, m0, m1, l0, l1, of_vf, t0, t1, j * G + r0 % G, j * G + r1 % G,
                       n, Nq, tq, gate, out);
}

template <int G, bool LL, bool SPLIT>
int launch(const float *q, int n, const uint8_t *kc, const uint8_t *vc, const int32_t *d_pos,
           int Nkv, float scale, const float *gate, float *out, float *part, int S,
           lily_cuda_stream st, lily_err *e) {
    constexpr int P = kRows / G;
    LILY_CU_TRY(cudaFuncSetAttribute(attn_wg_kernel<G, LL, SPLIT>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                e);
    dim3 grid((n + P - 1) / P, Nkv, SPLIT ? S : 1);
    attn_wg_kernel<G, LL, SPLIT><<<grid, kThreads, kSmem, st>>>(q, n, kc, vc, d_pos, Nkv, scale,
                                                                 gate, out, part);
    LILY_CU_LAUNCHED(e);
    return SPLIT ? merge_splits(part, S, n, Nkv * G, gate, out, st, e) : 0;
}

template <int G>
int launch_g(bool ll, int S, const float *q, int n, const uint8_t *kc, const uint8_t *vc,
             const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
             float *part, lily_cuda_stream st, lily_err *e) {
    if (ll) return launch<G, true, false>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, 1, st, e);
    if (S > 1) return launch<G, false, true>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, S, st, e);
    return launch<G, false, false>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, 1, st, e);
}

} // namespace

/* Splits of the causal spans for a chunk of n tokens (1 = none): with the tune's attn_split 1,
 * enough for one wave of blocks when the grid alone leaves SMs idle (a short chunk: an agent's
 * turn deep in the cache); N >= 2 forces N; never more than the scratch holds. */
int attn_wg::choose_splits(int n, int Nkv, int G, const float *part, int *S, lily_err *e) {
    *S = 1;
    const int mode = lily_cuda_tune_get()->attn_split;
    if (!part || mode == 0) return 0;
    const int blocks = (n + kRows / G - 1) / (kRows / G) * Nkv;
    int want = mode;
    if (mode == 1) {
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

extern "C" int lily_cuda_attn_prefill_wg(const float *q, int n, const void *kc, const void *vc,
                                         const int32_t *d_pos, int Nq, int Nkv, int Dh,
                                         float scale, const float *gate, float *out, float *part,
                                         int ll, lily_cuda_stream st, lily_err *e) {
    if (!lily_cuda_attn_wg_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention (wgmma): unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv,
                         Dh);
    if (n < 1) return 0;
    const uint8_t *k = (const uint8_t *)kc, *v = (const uint8_t *)vc;
    const int G = Nq / Nkv;
    int S = 1;
    if (!ll && choose_splits(n, Nkv, G, part, &S, e)) return -1;
    switch (G) {
    case 1: return launch_g<1>(ll, S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 2: return launch_g<2>(ll, S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 4: return launch_g<4>(ll, S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 8: return launch_g<8>(ll, S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 16: return launch_g<16>(ll, S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    default: return lily_fail(e, "attention (wgmma): no kernel for G=%d", G);
    }
}
