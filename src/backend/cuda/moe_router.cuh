/* The MoE decode router fused into the gate/up launch (moe.cu, where the shapes allow it): the
 * Q8 router rows computed by the warps of the whole gate/up grid, and the grid barrier that
 * hands the logits to the top-k. Internal to the CUDA backend.
 *
 * Why: the router GEMV (0.5 MB) kept 17 SMs busy for ~8 us of each MoE layer; spread over the
 * gate/up grid's ~1150 warps it is one row per warp, one HBM latency, and a launch less.
 *
 * Barrier word pair (8 bytes at offset 0 of the decode scratch, the same offset for every MoE
 * shape so layers that share one scratch agree on it):
 *   [0] count: the cooperative-groups "flip" counter. Each block adds 1, one master block adds
 *       2^31 - (N - 1); the top bit flips exactly when the N-th block arrives, and the low 31
 *       bits return to 0, so the word resets itself (graph replays, any grid size) provided the
 *       low bits are 0 before the first use.
 *   [1] tag: kBarTag once the pair is known to be initialised.
 * The scratch comes from cudaMalloc, whose contents are undefined: a recycled allocation can
 * hold a valid tag over a count that is not zero (seen on the H200: a stale pair released the
 * first step's barrier early, a wrong routing that the transformers fixtures caught), so its
 * owner zeroes the pair once (lily_cuda_moe_decode_scratch_init). Every MoE down kernel (the
 * launch after gate/up, in stream order) writes count = 0 and the tag. A gate/up launch that
 * finds no tag (the very first step on a new scratch) cannot trust the counter: every routed
 * block then computes all router rows itself into shared memory (correct, ~30 us, once). Nothing writes the tag during the gate/up launch, so all blocks of a launch take the same branch. */
#ifndef LILY_BACKEND_CUDA_MOE_ROUTER_CUH
#define LILY_BACKEND_CUDA_MOE_ROUTER_CUH

#include <stdio.h>

#include "backend/cuda/common.cuh"

namespace {

/* A signalling-NaN pattern: arithmetic never produces it, so stale floats do not look like it. */
constexpr uint32_t kBarTag = 0x7fa11e5du;
/* Polls of the barrier word before giving up: each is an L2 round trip (~0.3-0.5 us), so ~1-2 s,
 * against a legitimate wait of a few us. A grid that is not fully resident (MPS, a debugger)
 * would otherwise hang the stream; the trap makes it a launch failure instead. */
constexpr uint32_t kBarSpinLimit = 1u << 22;

/* Arrival of this block (call from thread 0 after a __syncthreads that follows the block's
 * logits stores). The fence makes those stores, ordered before it by the CTA barrier, visible at
 * GPU scope before the count moves (release). Returns the count before the add. */
__device__ __forceinline__ uint32_t bar_arrive(uint32_t *count, bool master, uint32_t nblocks) {
    __threadfence();
    return atomicAdd(count, master ? 0x80000000u - (nblocks - 1) : 1u);
}

/* Waits (thread 0) until the top bit of count differs from that of old, the value bar_arrive
 * returned: every block has arrived. The acquire loads plus the trailing fence order the other
 * blocks' logits stores before this block's later loads (the caller follows with a
 * __syncthreads and reads the logits with __ldcg, past L1). */
__device__ __forceinline__ void bar_wait(const uint32_t *count, uint32_t old) {
    for (uint32_t i = 0;; i++) {
        uint32_t v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        if ((v ^ old) & 0x80000000u) break;
        if (i == kBarSpinLimit) {
            printf(
                "lily: MoE fused-router grid barrier timed out (block %d,%d): the grid is not"
                " co-resident (the host checks the occupancy before it launches the fused form)\n",
                (int)blockIdx.x, (int)blockIdx.y);
            __trap();
        }
    }
    __threadfence();
}

/* Router rows of one block: the E rows of the Q8 router and, when sgw is set, the shared-expert
 * gate row as row E; rows b, b + nb, b + 2 nb, ... belong to this block (nb = 1, b = 0: all of
 * them). x' = x * norm_w is in shared memory in the transposed Q8 layout (xs4) with its chunk
 * sums (xsum), rs = 1/rms. Row r goes to glog[r] when glog is set, else to slog[r] (r < E) or
 * *ssg (r == E).
 *
 * Same arithmetic as the Q8 GEMV of the unfused path (gemv.cu, LPR lanes per row for
 * lpr = the largest power of two <= 32 dividing the chunk count, lane sl taking chunks sl,
 * sl + lpr, ... in that order, scale and bias applied per chunk, a butterfly over the lpr lanes,
 * then * rs), so the logits, and with them the routing, are bit-identical to it. */
__device__ __forceinline__ void router_rows(const uint8_t *rw, const uint32_t *rsb,
                                            const uint8_t *sgw, const uint32_t *sgsb, int E, int H,
                                            int lpr, const float4 *xs4, const float *xsum, float rs,
                                            int b, int nb, float *glog, float *slog, float *ssg) {
    constexpr int CB = 4; /* chunks per lane in flight */
    const int nchunk = H / 16, ng = H / 64;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int rpg = 32 / lpr, sub = lane / lpr, sl = lane % lpr;
    const int rows = E + (sgw ? 1 : 0);
    /* block-local row q is global row b + nb q; warp w takes q = w + nw (sub + rpg j). The
     * loop bound tests the warp's smallest q (sub 0): warp-uniform, as the shuffles need. */
    for (int q0 = warp; b + nb * q0 < rows; q0 += nw * rpg) {
        const int r = b + nb * (q0 + nw * sub);
        const bool ok = r < rows;
        const uint8_t *w = nullptr;
        const uint32_t *sb = nullptr;
        if (ok) {
            w = r < E ? rw + (size_t)r * H : sgw;
            sb = r < E ? rsb + (size_t)r * ng : sgsb;
        }
        float acc = 0.f;
        for (int c0 = sl; c0 < nchunk; c0 += CB * lpr) {
            uint4 wv[CB];
            uint32_t sv[CB];
#pragma unroll
            for (int j = 0; j < CB; j++) {
                const int c = c0 + j * lpr;
                const bool in = ok && c < nchunk;
                wv[j] = in ? ldg_stream(w + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
                sv[j] = in ? __ldg(sb + c / 4) : 0u;
            }
#pragma unroll
            for (int j = 0; j < CB; j++) {
                const int c = c0 + j * lpr;
                if (c >= nchunk) break;
                acc = fmaf(lo_bf16(sv[j]), chunk_dot<LILY_CW_Q8>(wv[j], xs4, c, nchunk),
                           fmaf(hi_bf16(sv[j]), xsum[c], acc));
            }
        }
        for (int o = lpr / 2; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (ok && sl == 0) {
            const float v = acc * rs;
            if (glog)
                glog[r] = v;
            else if (r < E)
                slog[r] = v;
            else
                *ssg = v;
        }
    }
}

} // namespace

#endif
