/* Exact attention prefill on wgmma, warp-specialised (what attn.cu runs at head dim 256;
 * attn_wg.h). The products (attn_wg.cuh): S on s8 wgmma over the codes' balanced digits, hh and
 * hl + lh; P V on f16 wgmma with P hi + lo against the exact V digit planes. The work is split:
 * a producer warpgroup loads each tile's cache rows (cp.async) and converts them
 * into the K and V planes; two consumer warpgroups (64 query rows each) only run S, the softmax
 * and P V. Named barriers let the conversion run
 * under the consumers' products and the consumers take the tensor cores in turn (one's softmax
 * under the other's products):
 *   KFULL[c], VFULL[c]: the producer arrives when the K (V) planes of a tile are written,
 *     consumer c waits (128 + 128 threads);
 *   KEMPTY, VEMPTY: both consumers arrive when their products of a tile have read the planes,
 *     the producer waits before it overwrites them (128 + 256);
 *   TURN[c]: consumer c may issue its next products (S or P V) once the other has issued its
 *     own (128 + 128; consumer 0 starts);
 *   PROD: the producer's own (the landing area's copies and reads).
 * Planes are single-buffered (shared memory: Q 64 KB, K 32, V 64, landing 64), the scales the
 * consumers read after the products double-buffered by tile parity. setmaxnreg gives the
 * consumers (O 128 registers, S's digit accumulators 64) the producer's registers. The producer
 * lands a tile's rows with one tensor-map copy (TMA) on an mbarrier per landing. (The forms
 * measured against this one, P V on 8-bit wgmma, swizzled planes, cp.async or per-row bulk
 * landings, no turns: bench/NOTES-cuda.md and git history.) */
#include "backend/cuda/attn_wg.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attn_wg.cuh"
#include "backend/cuda/tma.cuh"

namespace {

using namespace attn_wg;

constexpr int kThreads = 384; /* producer warpgroup + two consumer warpgroups */
constexpr int kProdRegs = 40; /* setmaxnreg: 128 x 40 + 256 x 232 = 64 K registers */
constexpr int kConsRegs = 232;

/* KFULL: [consumer][K buffer], KEMPTY: [K buffer] */
enum { BAR_KFULL = 1, BAR_VFULL = 5, BAR_KEMPTY = 7, BAR_VEMPTY = 9, BAR_TURN = 10, BAR_PROD = 12 };

__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

/* Tensor maps of the K and V caches as [rows][row bytes / 2] u16, box 256 x 64 (a tile's
 * rows of one head); rows past the allocation arrive as zeros */
struct kv_maps {
    CUtensorMap k, v;
};

/* grid (ceil(n / P), Nkv) with P = 128 / G positions per block, 384 threads: warpgroup 0 the
 * producer, warpgroup 1 + c consumer c (block rows 64 c .. 64 c + 63, attn_wg.cu's layout). */
template <int G, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    attn_ws_kernel(const float *__restrict__ q, int n, const uint8_t *__restrict__ kc,
                   const uint8_t *__restrict__ vc, const int32_t *d_pos, int Nkv, float scale,
                   const float *__restrict__ gate, float *__restrict__ out,
                   float *__restrict__ part, const __grid_constant__ kv_maps mp) {
    constexpr int P = kRows / G;
    constexpr bool SWZ = false; /* attn_wg.cuh's planes in the no-swizzle core-matrix layout */
    extern __shared__ __align__(128) uint8_t smem_raw[];
    __shared__ float s_qs[kRows], s_ks[2][kKt], s_vs[2][kKt];
    uint8_t *smem = smem_raw;
    const uint32_t sb = (uint32_t)__cvta_generic_to_shared(smem);
    /* the K and V landings' mbarriers (in the scales' region of attn_wg.cuh's layout) */
    uint64_t *const s_land = (uint64_t *)(smem + OFF_SC);
    const BlockSpan bs = block_span<G, SPLIT>(n, Nkv, d_pos);
    const int Nq = bs.Nq, j = bs.j, qt = bs.qt, p0 = bs.p0, kv_end = bs.kv_end, qmin = bs.qmin;
    const int it_beg = bs.it_beg, it_end = bs.it_end;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wgi = warp >> 2, wi = warp & 3;
    if (SPLIT && it_beg == it_end) { /* nothing of the span: an empty partial */
        empty_partial<G>(part, bs, n, tid);
        return;
    }
    const size_t row = kv_row_bytes(Nkv, DH);
    const uint8_t *ksc = kc + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    const uint8_t *vsc = vc + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    /* tile i's K and V scales of position kv0 + tid % 64 (0 past kv_end), loaded with its K rows
     * and written to s_ks / s_vs with its K planes */
    float sc_next = 0.f;
    /* (producer) tile i's K (with it both scales) or V rows into the landing area: one tensor
     * copy of the tile's rows by thread 0 on the landing's mbarrier (rows past kv_end are
     * whatever the cache holds there, finite codes: masked) */
    auto load = [&](int i, int which) {
        const int kv0 = i * kKt;
        if (tid == 0) {
            lily_mbar_expect(&s_land[which], kKt * 512);
            lily_tma_2d(smem + OFF_RAW + which * 32768, which ? &mp.v : &mp.k, j * DH, kv0,
                        &s_land[which]);
        }
        if (!which) {
            const int p = kv0 + (tid & (kKt - 1));
            sc_next = p < kv_end ? __ldg((const float *)((tid < kKt ? ksc : vsc) + (size_t)p * row))
                                 : 0.f;
        }
    };
    const int cw = wgi - 1, g = lane >> 2, tq = lane & 3;
    if (wgi == 0) { /* the first tile's copies */
        if (tid == 0) {
            lily_mbar_init(&s_land[0], 1);
            lily_mbar_init(&s_land[1], 1);
            lily_mbar_init_fence();
        }
        bar_sync(BAR_PROD, 128);
        load(it_beg, 0);
        load(it_beg, 1);
    } else { /* each consumer's Q planes */
        q_planes<G, SWZ>(smem, s_qs, q, n, Nq, qt, j, cw, wi, lane);
        proxy_fence();
    }
    __syncthreads();

    if (wgi == 0) { /* the producer: the tiles' conversions */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProdRegs));
        for (int it = it_beg; it < it_end; it++) {
            const int b = it & 1;
            const uint32_t ph = (it - it_beg) & 1; /* the landings' phase */
            lily_mbar_wait(&s_land[0], ph);        /* K of tile it */
            /* both consumers done with the K planes' last tile (S, scales) */
            if (it > it_beg) bar_sync(BAR_KEMPTY, 384);
#pragma unroll 2
            for (int x = 0; x < 8; x++)
                k_unit<SWZ>(smem, tid + 128 * x, OFF_K);
            const float sc = sc_next;
            if (tid < kKt)
                s_ks[b][tid] = sc;
            else
                s_vs[b][tid - kKt] = sc;
            proxy_fence();
            bar_arrive(BAR_KFULL, 256);
            bar_arrive(BAR_KFULL + 2, 256);
            bar_sync(BAR_PROD, 128); /* the K landing area has been read */
            if (it + 1 < it_end) {
                proxy_fence(); /* the generic reads before the async proxy's writes */
                load(it + 1, 0);
            }
            lily_mbar_wait(&s_land[1], ph); /* V of tile it */
            if (it > it_beg)
                bar_sync(BAR_VEMPTY, 384); /* both consumers' P V of tile it - 1 done */
#pragma unroll 2
            for (int x = 0; x < 8; x++)
                v_unit<SWZ>(smem, tid + 128 * x);
            proxy_fence();
            bar_arrive(BAR_VFULL, 256);
            bar_arrive(BAR_VFULL + 1, 256);
            bar_sync(BAR_PROD, 128); /* the V landing area has been read */
            if (it + 1 < it_end) {
                proxy_fence();
                load(it + 1, 1);
            }
        }
        return;
    }

    /* the consumers */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsRegs));

    const int r0 = cw * 64 + wi * 16 + g, r1 = r0 + 8;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions (rows past n: beyond) */
    const float f0 = s_qs[r0] * scale * kLog2e, f1 = s_qs[r1] * scale * kLog2e;
    const uint32_t qa = sb + OFF_Q + cw * 32768;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float of_vf = 1.f; /* the V-scale factor O is kept in (attn.cu's exact prefill) */
    if (cw == 1) bar_arrive(BAR_TURN, 256); /* consumer 0 takes the first turn */
    for (int it = it_beg; it < it_end; it++) {
        const int b = it & 1, kv0 = it * kKt;
        bar_sync(BAR_KFULL + 2 * cw, 256);
        int hh[32], md[32];
        const uint32_t z = opaque_zero(), qz = qa + z, kz = sb + OFF_K + z;
        bar_sync(BAR_TURN + cw, 256);
        wg_fence();
        issue_s<false, SWZ>(qz, kz, hh, md, nullptr);
        wg_commit();
        bar_arrive(BAR_TURN + (cw ^ 1), 256);
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 32; i++) {
            reg_fence(hh[i]);
            reg_fence(md[i]);
        }
        if (it + 1 < it_end) bar_arrive(BAR_KEMPTY, 384);
        const bool full = kv0 + kKt - 1 <= qmin;
        float s[32];
        s_scores<false>(hh, md, nullptr, s_ks[b], f0, f1, full, kv0, qp0, qp1, tq, s);
        const float vf = vscale_factor(warp_max(fmaxf(s_vs[b][lane], s_vs[b][lane + 32])));
        const float of = vf / of_vf;
        of_vf = vf;
        float d0, d1;
        softmax_tile<8>(s, s_vs[b], vf, of, tq, m0, m1, l0, l1, d0, d1);
        if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) {
#pragma unroll
            for (int nb = 0; nb < 32; nb++) {
                o[4 * nb + 0] *= d0, o[4 * nb + 1] *= d0;
                o[4 * nb + 2] *= d1, o[4 * nb + 3] *= d1;
            }
        }
        /* consumer 1's last turn is the block's last: nobody waits for it */
        auto pass_turn = [&] {
            if (cw == 0 || it + 1 < it_end) bar_arrive(BAR_TURN + (cw ^ 1), 256);
        };
        {
            uint32_t ph[4][4], pl[4][4];
            p_split(s, ph, pl);
            bar_sync(BAR_VFULL + cw, 256);
            bar_sync(BAR_TURN + cw, 256);
#pragma unroll
            for (int i = 0; i < 128; i++)
                reg_fence(o[i]);
            wg_fence();
            issue_pv<SWZ>(sb + OFF_V + opaque_zero(), o, ph, pl);
            wg_commit();
            pass_turn();
            wg_wait0();
#pragma unroll
            for (int i = 0; i < 128; i++)
                reg_fence(o[i]);
        }
        if (it + 1 < it_end) bar_arrive(BAR_VEMPTY, 384);
    }
    finish_rows<SPLIT>(part, o, m0, m1, l0, l1, of_vf, t0, t1, j * G + r0 % G, j * G + r1 % G, n,
                       Nq, tq, gate, out);
}

/* The tensor map of a K or V cache at c: every row its allocation holds. */
int kv_map(CUtensorMap *m, const uint8_t *c, int Nkv, lily_err *e) {
    uintptr_t end = 0;
    if (lily_alloc_end(c, &end, e)) return -1;
    const size_t row = kv_row_bytes(Nkv, DH);
    const uint64_t rows = (uint64_t)(end - (uintptr_t)c) / row;
    if (rows < 1 || row % 16 || (uintptr_t)c % 16)
        return lily_fail(e, "attention (tensor map): a cache of %llu rows of %zu bytes at %p",
                         (unsigned long long)rows, row, (const void *)c);
    const uint64_t dims[2] = {row / 2, rows}, strides[1] = {row};
    const uint32_t box[2] = {DH, kKt};
    return lily_tma_map(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, c, dims, strides, box,
                        CU_TENSOR_MAP_SWIZZLE_NONE, e);
}

template <int G, bool SPLIT>
int launch(const float *q, int n, const uint8_t *kc, const uint8_t *vc, const int32_t *d_pos,
           int Nkv, float scale, const float *gate, float *out, float *part, int S,
           lily_cuda_stream st, lily_err *e) {
    constexpr int P = kRows / G;
    kv_maps mp;
    memset(&mp, 0, sizeof mp);
    if (kv_map(&mp.k, kc, Nkv, e) || kv_map(&mp.v, vc, Nkv, e)) return -1;
    /* the consumers take turns, unswizzled planes, P V on f16, one tensor-map copy a tile */
    auto kern = attn_ws_kernel<G, SPLIT>;
    const int smem = kSmem;
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), e);
    dim3 grid((n + P - 1) / P, Nkv, SPLIT ? S : 1);
    kern<<<grid, kThreads, smem, st>>>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, mp);
    LILY_CU_LAUNCHED(e);
    return SPLIT ? merge_splits(part, S, n, Nkv * G, gate, out, st, e) : 0;
}

template <int G>
int launch_s(int S, const float *q, int n, const uint8_t *kc, const uint8_t *vc,
             const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out, float *part,
             lily_cuda_stream st, lily_err *e) {
    if (S > 1) return launch<G, true>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, S, st, e);
    return launch<G, false>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, 1, st, e);
}

} // namespace

extern "C" int lily_cuda_attn_prefill_ws(const float *q, int n, const void *kc, const void *vc,
                                         const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                         const float *gate, float *out, float *part,
                                         lily_cuda_stream st, lily_err *e) {
    if (!lily_cuda_attn_wg_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention (wgmma, specialised): unsupported shape Nq=%d Nkv=%d Dh=%d",
                         Nq, Nkv, Dh);
    if (n < 1) return 0;
    const uint8_t *k = (const uint8_t *)kc, *v = (const uint8_t *)vc;
    const int G = Nq / Nkv;
    int S = 1;
    if (choose_splits(n, Nkv, G, part, &S, e)) return -1;
    switch (G) {
    case 1: return launch_s<1>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 2: return launch_s<2>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 4: return launch_s<4>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 8: return launch_s<8>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 16: return launch_s<16>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    default: return lily_fail(e, "attention (wgmma, specialised): no kernel for G=%d", Nq / Nkv);
    }
}
