/* MoE decode kernels: the fused gate/up and down launches for one token (see moe.h; the
 * prefill path is in moe_prefill.cu, the routing shared by both in moe_route.cuh, the router
 * fused into the gate/up launch in moe_router.cuh). */
#include "backend/cuda/moe.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/moe_router.cuh"
#include "backend/cuda/q4mma.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kRows = LILY_MOE_ROWS; /* rows the decode scratch holds */

/* ---- decode -------------------------------------------------------------------------------- */

struct dec_layout {
    size_t bar, logits, idx, wt, sg, h, total; /* byte offsets */
    int imax;
};

/* Every per-row array holds kRows rows: row r's logits at r (E + 1), its idx and wt at r k, its
 * shared gate at r, its h slots at r (k + 1) imax (slot k the shared expert's). */
dec_layout dec_plan(const lily_cuda_moe *m) {
    dec_layout d;
    int I = m->k ? m->gate->rows : 0, Is = m->sh_gate ? m->sh_gate->rows : 0;
    d.imax = I > Is ? I : Is;
    size_t o = 0;
    auto take = [&](size_t bytes) {
        size_t r = o;
        o += (bytes + 255) & ~(size_t)255;
        return r;
    };
    d.bar = take(8); /* first, at the same offset for every shape (moe_router.cuh) */
    d.logits = take(kRows * ((size_t)m->E + 1) * 4);
    d.idx = take(kRows * (size_t)(m->k + 1) * 4);
    d.wt = take(kRows * (size_t)(m->k + 1) * 4);
    d.sg = take(kRows * 4);
    d.h = take(kRows * (size_t)(m->k + 1) * d.imax * 4);
    d.total = o;
    return d;
}

struct mat_ref {
    const uint8_t *w;
    const uint32_t *sb;
    size_t ws, sbs; /* expert strides */
};

mat_ref ref_of(const lily_dmat *d) {
    mat_ref r = {nullptr, nullptr, 0, 0};
    if (d) r = {d->w, d->sb, d->w_stride, d->sb_stride};
    return r;
}

/* A decode of R rows (1..kRows): row r's input at x + r ldx, its logits, idx, wt, sg and h at the
 * row strides of dec_plan. */
struct gu_params {
    const float *x, *norm_w;
    float eps;
    int R, ldx;
    int H, E, k, norm, I, Is, has_sgate;
    const float *logits;
    mat_ref gate, up, sgate, sup;
    int32_t *idx;
    float *wt, *sg, *h;
    int imax;
    /* the fused-router kernel only (moe_router.cuh): Q8 router and shared-gate row, lanes per
     * router row, where the logits go, the barrier word pair */
    mat_ref router, sgw;
    int rlpr;
    float *rlog;
    uint32_t *bar;
};

/* The row of a decode block and its index among that row's blocks: blockIdx.x = bx R + row, so
 * the rows' blocks over the same weight rows are adjacent in launch order and run together
 * (blocks that read the same matrix, the shared expert's or an expert several rows chose, find
 * it in L2). R = 1: row 0, bx = blockIdx.x. */
struct blk_pos {
    int row, bx;
};
__device__ __forceinline__ blk_pos blk_of(int R) {
    return {(int)blockIdx.x % R, (int)blockIdx.x / R};
}

/* Writes x * w (or x when w is NULL) in the transposed GEMV layout with its chunk sums, from
 * loads that are all independent, behind one barrier; returns the RMSNorm factor 1/rms (1 when
 * w is NULL), which the caller applies to its dot products (it is a scalar). red: 32 floats. */
template <int DT>
__device__ float xs_build(const float *x, const float *w, float eps, int cols, float *xs,
                          float *xsum, float *red) {
    constexpr int qpc = wtype<DT>::epc / 4; /* float4s per chunk */
    const int nchunk = cols / wtype<DT>::epc, nq = cols / 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float4 *x4 = (const float4 *)x, *w4 = (const float4 *)w;
    float4 *xs4 = (float4 *)xs;
    float ss = 0.f;
#pragma unroll 4
    for (int q0 = warp * 32; q0 < nq; q0 += blockDim.x) { /* warp-uniform: shuffles below */
        const int q = q0 + lane, c = q / qpc, i = q % qpc;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (q < nq) {
            a = x4[q];
            if (w) {
                float4 g = w4[q];
                ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                a = make_float4(a.x * g.x, a.y * g.y, a.z * g.z, a.w * g.w);
            }
            xs4[i * nchunk + c] = a;
        }
        if (DT != LILY_CW_BF16) { /* a chunk's float4s are lanes of one warp */
            float t = group_sum<qpc>((a.x + a.y) + (a.z + a.w));
            if (i == 0 && q < nq) xsum[c] = t;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (!w) return 1.0f;
    float t = 0.f;
    for (int i = 0; i < nw; i++)
        t += red[i]; /* one fixed order everywhere */
    return 1.0f / sqrtf(t / cols + eps);
}

/* grid (ceil(imax / rows per block) R, k + shared). */
template <int DT, int LPR>
__global__ void __launch_bounds__(kThreads)
    moe_gate_up_kernel(const __grid_constant__ gu_params p) {
    extern __shared__ float4 smem4[];
    __shared__ int s_idx[kMaxK];
    __shared__ float s_wt[kMaxK];
    __shared__ float s_sl[1024];
    float *xs = (float *)smem4, *xsum = xs + p.H;
    const int nchunk = p.H / wtype<DT>::epc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const blk_pos bp = blk_of(p.R);
    const float *logits = p.logits + (size_t)bp.row * (p.E + 1);
    /* the shared expert's blocks need no routing */
    if (p.k > 0 && warp == 0 && (int)blockIdx.y < p.k)
        topk_warp(logits, p.E, p.k, p.norm, s_sl, s_idx, s_wt);
    __shared__ float red[32];
    const float rs = xs_build<DT>(p.x + (size_t)bp.row * p.ldx, p.norm_w, p.eps, p.H, xs, xsum,
                                  red); /* its barrier publishes s_idx/s_wt */
    const int slot = blockIdx.y;
    if (bp.bx == 0 && slot == 0 && threadIdx.x == 0) {
        for (int j = 0; j < p.k; j++)
            p.idx[bp.row * p.k + j] = s_idx[j], p.wt[bp.row * p.k + j] = s_wt[j];
        p.sg[bp.row] = p.has_sgate ? sigmoid_f(logits[p.E]) : 1.0f;
    }
    const bool shared = slot >= p.k;
    const int rows = shared ? p.Is : p.I;
    const uint8_t *gw, *uw;
    const uint32_t *gsb, *usb;
    if (shared) {
        gw = p.sgate.w, uw = p.sup.w, gsb = p.sgate.sb, usb = p.sup.sb;
    } else {
        int ex = s_idx[slot];
        gw = p.gate.w + (size_t)ex * p.gate.ws, uw = p.up.w + (size_t)ex * p.up.ws;
        gsb = p.gate.sb ? p.gate.sb + (size_t)ex * p.gate.sbs : nullptr;
        usb = p.up.sb ? p.up.sb + (size_t)ex * p.up.sbs : nullptr;
    }
    constexpr int rpg = 32 / LPR;
    const int sub = lane / LPR, sl = lane % LPR;
    const size_t rb = dmat_row_bytes(DT, p.H);
    const int ng = p.H / 64;
    const int base = (bp.bx * (kThreads / 32) + warp) * 2 * rpg;
    const uint8_t *wr[4];
    const uint32_t *sbr[4];
    int r[2] = {base + sub, base + rpg + sub};
#pragma unroll
    for (int u = 0; u < 2; u++) {
        bool ok = r[u] < rows;
        wr[2 * u] = ok ? gw + (size_t)r[u] * rb : nullptr;
        wr[2 * u + 1] = ok ? uw + (size_t)r[u] * rb : nullptr;
        sbr[2 * u] = ok && gsb ? gsb + (size_t)r[u] * ng : nullptr;
        sbr[2 * u + 1] = ok && usb ? usb + (size_t)r[u] * ng : nullptr;
    }
    float acc[4];
    rows_dot<DT, LPR, 4>(wr, sbr, (const float4 *)xs, xsum, nchunk, sl, acc);
#pragma unroll
    for (int u = 0; u < 2; u++) {
        float g = group_sum<LPR>(acc[2 * u]), v = group_sum<LPR>(acc[2 * u + 1]);
        if (sl == 0 && r[u] < rows)
            p.h[((size_t)bp.row * (p.k + 1) + slot) * p.imax + r[u]] = silu_f(g * rs) * (v * rs);
    }
}

struct dn_params {
    const float *h;
    const int32_t *idx;
    const float *wt, *sg;
    int k, has_shared, I, Is, H, imax;
    mat_ref down, sdown;
    float *x;
    int R, ldx;    /* rows, as in gu_params */
    uint32_t *bar; /* the fused router's barrier pair: (re)initialised here (moe_router.cuh) */
};

/* Called by every down kernel: the gate/up launch before it has completed (stream order), so no
 * block is at the barrier. Leaves the pair ready for the next fused gate/up launch. */
__device__ __forceinline__ void bar_reset(uint32_t *bar) {
    if (bar && blockIdx.x == 0 && threadIdx.x == 0) {
        bar[0] = 0;
        bar[1] = kBarTag;
    }
}

/* grid: blocks over the H output rows. Slot s < k is routed expert idx[s] (I columns); slot k is
 * the shared expert (Is columns). Slot s's x sits at s * stride floats in the transposed layout,
 * its chunk sums right after it. Slots go in batches of kDnBatch, each lane loading one chunk of
 * every slot of a batch before any use; the first batch's loads are issued before h is staged
 * (the slot addresses come straight from idx), so they overlap the staging and its barriers. */
constexpr int kDnBatch = 9;

template <int DT, int LPR>
__device__ __forceinline__ void dn_slot(const dn_params &p, const int32_t *idx, int s, int ns,
                                        int o, const uint8_t *&w, const uint32_t *&sb, int &nc) {
    constexpr int epc = wtype<DT>::epc;
    bool ok = s < ns && o < p.H;
    int cols = s < p.k ? p.I : p.Is;
    nc = ok ? cols / epc : 0;
    w = nullptr;
    sb = nullptr;
    if (!ok) return;
    const uint8_t *base;
    const uint32_t *sbase;
    if (s < p.k) {
        int ex = idx[s];
        base = p.down.w + (size_t)ex * p.down.ws;
        sbase = p.down.sb ? p.down.sb + (size_t)ex * p.down.sbs : nullptr;
    } else {
        base = p.sdown.w;
        sbase = p.sdown.sb;
    }
    w = base + (size_t)o * dmat_row_bytes(DT, cols);
    if (sbase) sb = sbase + (size_t)o * (cols / 64);
}

template <int DT, int LPR>
__global__ void __launch_bounds__(kThreads) moe_down_kernel(const __grid_constant__ dn_params p) {
    extern __shared__ float4 smem4[];
    __shared__ float s_f[kMaxK + 1];
    constexpr int epc = wtype<DT>::epc;
    constexpr int B = kDnBatch;
    const int ns = p.k + p.has_shared;
    const int stride = (p.imax + p.imax / epc + 3) & ~3; /* keeps each slot 16-byte aligned */
    float *sm = (float *)smem4;
    constexpr int rpg = 32 / LPR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / LPR, sl = lane % LPR;
    const blk_pos bp = blk_of(p.R);
    const int base0 = (bp.bx * (kThreads / 32) + warp) * rpg;
    const int bstride = (gridDim.x / p.R) * (kThreads / 32) * rpg;
    const int32_t *idx = p.idx + bp.row * p.k;
    const float *h = p.h + (size_t)bp.row * (p.k + 1) * p.imax;
    float *x = p.x + (size_t)bp.row * p.ldx;
    /* prefetch: chunk sl of every slot of the first batch of this lane's first row */
    bar_reset(p.bar);
    uint4 w[B];
    uint32_t sbv[B];
    const uint8_t *wr[B];
    const uint32_t *sbr[B];
    int nc[B];
#pragma unroll
    for (int i = 0; i < B; i++) {
        dn_slot<DT, LPR>(p, idx, i, ns, base0 + sub, wr[i], sbr[i], nc[i]);
        bool ok = sl < nc[i];
        w[i] = ok ? ldg_stream(wr[i] + (size_t)sl * 16) : make_uint4(0, 0, 0, 0);
        sbv[i] = ok && DT != LILY_CW_BF16 ? __ldg(sbr[i] + sl / wtype<DT>::cpg) : 0u;
    }
    for (int s = 0; s < ns; s++) {
        int cols = s < p.k ? p.I : p.Is;
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            sm[s * stride + xs_index(c, epc, cols / epc)] = h[(size_t)s * p.imax + c];
    }
    if (threadIdx.x < ns) {
        int s = threadIdx.x;
        s_f[s] = s < p.k ? p.wt[bp.row * p.k + s] : p.sg[bp.row];
    }
    __syncthreads();
    for (int s = 0; s < ns; s++) {
        int cols = s < p.k ? p.I : p.Is;
        store_xsum<DT>(sm + s * stride, sm + s * stride + cols, cols / epc);
    }
    __syncthreads();
    for (int base = base0; base < p.H; base += bstride) {
        const int o = base + sub;
        float total = 0.f;
        for (int s0 = 0; s0 < ns; s0 += B) {
            const bool pre = base == base0 && s0 == 0; /* chunk sl already in w / sbv */
            if (!pre) {
#pragma unroll
                for (int i = 0; i < B; i++)
                    dn_slot<DT, LPR>(p, idx, s0 + i, ns, o, wr[i], sbr[i], nc[i]);
            }
            int ncmax = 0;
#pragma unroll
            for (int i = 0; i < B; i++)
                ncmax = nc[i] > ncmax ? nc[i] : ncmax;
            float acc[B];
#pragma unroll
            for (int i = 0; i < B; i++)
                acc[i] = 0.f;
            for (int c = sl; c < ncmax; c += LPR) {
                if (!(pre && c == sl)) {
#pragma unroll
                    for (int i = 0; i < B; i++) {
                        bool ok = c < nc[i];
                        w[i] = ok ? ldg_stream(wr[i] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
                        sbv[i] = ok && DT != LILY_CW_BF16 ? __ldg(sbr[i] + c / wtype<DT>::cpg) : 0u;
                    }
                }
#pragma unroll
                for (int i = 0; i < B; i++) {
                    if (c >= nc[i]) continue;
                    const float *xs = sm + (s0 + i) * stride;
                    float d = chunk_dot<DT>(w[i], (const float4 *)xs, c, nc[i]);
                    if (DT != LILY_CW_BF16)
                        d = fmaf(lo_bf16(sbv[i]), d, hi_bf16(sbv[i]) * xs[nc[i] * epc + c]);
                    acc[i] += d;
                }
            }
#pragma unroll
            for (int i = 0; i < B; i++)
                if (s0 + i < ns) total = fmaf(s_f[s0 + i], acc[i], total);
        }
        total = group_sum<LPR>(total);
        if (sl == 0 && o < p.H) x[o] += total;
    }
}

/* ---- Q4 decode on tensor cores (q4mma.cuh): H % 256 == 0 for gate/up, I % 256 == 0 for down -- */

/* grid (ceil(imax / 32), slots): 144 blocks for the 35B shape, one wave at 2 blocks per SM (16
 * rows per block made 288, two waves). A block owns 32 rows of one slot's gate and the same 32
 * rows of its up (four 16-row tiles); warp w takes tile w & 3 and the 256-column steps w / 4,
 * w / 4 + 2, ... (two per load batch); x * norm_w goes to shared memory as hi/lo bf16 planes,
 * 1/rms is applied to the sums. The row setup and the main loop are shared by the two kernels
 * below (unfused, and with the router fused in). */
struct gu_rows {
    const uint8_t *r0, *r1;
    const uint32_t *s0, *s1;
    int rows, tile, sg;
};

/* This lane's two rows (g, g + 8 of its tile) of slot's gate or up; ex: the slot's expert, bx the
 * block's index among its row's blocks. */
__device__ __forceinline__ gu_rows gu_q4mma_rows(const gu_params &p, bool shared, int ex, int bx,
                                                 int warp, int lane) {
    gu_rows g;
    g.rows = shared ? p.Is : p.I;
    g.tile = warp & 3;
    const mat_ref &mr = (g.tile >> 1) ? (shared ? p.sup : p.up) : (shared ? p.sgate : p.gate);
    const uint8_t *wb = mr.w;
    const uint32_t *sbb = mr.sb;
    if (!shared) {
        wb += (size_t)ex * mr.ws;
        sbb += (size_t)ex * mr.sbs;
    }
    const int ng = p.H / 64;
    g.sg = warp >> 2;
    const int r = bx * 32 + (g.tile & 1) * 16 + (lane >> 2);
    const size_t rb = (size_t)p.H / 2;
    g.r0 = r < g.rows ? wb + (size_t)r * rb : nullptr;
    g.r1 = r + 8 < g.rows ? wb + (size_t)(r + 8) * rb : nullptr;
    g.s0 = sbb + (size_t)r * ng;
    g.s1 = sbb + (size_t)(r + 8) * ng;
    return g;
}

/* The first load batch (steps sg and sg + 2). */
__device__ __forceinline__ void gu_q4mma_first(const gu_params &p, const gu_rows &g, int lane,
                                               q4_step_regs (&R)[2]) {
    const int nsteps = p.H / 256;
    if (g.sg < nsteps) q4_step_load(g.r0, g.s0, g.r1, g.s1, g.sg, lane, R[0]);
    if (g.sg + 2 < nsteps) q4_step_load(g.r0, g.s0, g.r1, g.s1, g.sg + 2, lane, R[1]);
}

/* The main loop (first batch already in R), the cross-warp sums and SiLU(gate) * up into h's
 * slot hs (row r's slot s: r (k + 1) + s). The planes must be published (a barrier) before the
 * call. */
__device__ __forceinline__ void gu_q4mma_main(const gu_params &p, const gu_rows &g, int hs, int bx,
                                              int lane, q4_step_regs (&R)[2], const uint32_t *xh,
                                              const uint32_t *xl, const float *xs2, float rs,
                                              float (*part)[64]) {
    const int nsteps = p.H / 256;
    float acc0 = 0.f, acc1 = 0.f;
    for (int st = g.sg; st < nsteps; st += 4) {
        if (st != g.sg) {
            q4_step_load(g.r0, g.s0, g.r1, g.s1, st, lane, R[0]);
            if (st + 2 < nsteps) q4_step_load(g.r0, g.s0, g.r1, g.s1, st + 2, lane, R[1]);
        }
        q4_step_math(R[0], xh, xl, xs2, st, lane, acc0, acc1);
        if (st + 2 < nsteps) q4_step_math(R[1], xh, xl, xs2, st + 2, lane, acc0, acc1);
    }
    acc0 = quad_sum(acc0);
    acc1 = quad_sum(acc1);
    if ((lane & 3) == 0) {
        part[g.sg][g.tile * 16 + (lane >> 2)] = acc0;
        part[g.sg][g.tile * 16 + (lane >> 2) + 8] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* tiles 0, 1: gate rows 0..31; tiles 2, 3: up */
        const int i = threadIdx.x, row = bx * 32 + i;
        float gt = part[0][i] + part[1][i];
        float u = part[0][32 + i] + part[1][32 + i];
        if (row < g.rows) p.h[(size_t)hs * p.imax + row] = silu_f(gt * rs) * (u * rs);
    }
}

__global__ void __launch_bounds__(kThreads)
    moe_gate_up_q4mma_kernel(const __grid_constant__ gu_params p) {
    extern __shared__ float4 smem4[];
    __shared__ int s_idx[kMaxK];
    __shared__ float s_wt[kMaxK];
    __shared__ float s_sl[1024];
    __shared__ float red[32];
    __shared__ float part[2][64];
    uint32_t *xh = (uint32_t *)smem4, *xl = xh + p.H / 2;
    float *xs2 = (float *)(xl + p.H / 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = blockIdx.y;
    const bool shared = slot >= p.k;
    const blk_pos bp = blk_of(p.R);
    const float *logits = p.logits + (size_t)bp.row * (p.E + 1);
    if (!shared && warp == 0) topk_warp(logits, p.E, p.k, p.norm, s_sl, s_idx, s_wt);
    __syncthreads();
    if (bp.bx == 0 && slot == 0 && threadIdx.x == 0) {
        for (int j = 0; j < p.k; j++)
            p.idx[bp.row * p.k + j] = s_idx[j], p.wt[bp.row * p.k + j] = s_wt[j];
        p.sg[bp.row] = p.has_sgate ? sigmoid_f(logits[p.E]) : 1.0f;
    }
    const gu_rows g = gu_q4mma_rows(p, shared, shared ? 0 : s_idx[slot], bp.bx, warp, lane);
    q4_step_regs R[2];
    gu_q4mma_first(p, g, lane, R);
    const float *xv = p.x + (size_t)bp.row * p.ldx, *nw = p.norm_w;
    float ss = 0.f;
    for (int i = threadIdx.x; i < p.H / 4; i += blockDim.x) {
        float4 a = ((const float4 *)xv)[i];
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    if (nw)
        q4x_convert(
            p.H, [&](int col) { return xv[col] * nw[col]; }, xh, xl, xs2);
    else
        q4x_convert(
            p.H, [&](int col) { return xv[col]; }, xh, xl, xs2);
    ss = block_sum(ss, red); /* its barriers also publish the planes */
    const float rs = p.norm_w ? 1.0f / sqrtf(ss / p.H + p.eps) : 1.0f;
    gu_q4mma_main(p, g, bp.row * (p.k + 1) + slot, bp.bx, lane, R, xh, xl, xs2, rs, part);
}

/* The same launch with the router fused in (see moe_router.cuh), for one row (R = 1): x'
 * goes to shared memory once, in fp32 for the router (transposed Q8 layout) and as the hi/lo
 * planes; the blocks' warps compute the router rows, the routed blocks wait at the grid barrier
 * (the shared expert's blocks only arrive: they need no routing) and run the top-k from the
 * logits in scratch. Every launch must be fully resident (the host checks the occupancy).
 * Results are bit-identical to the unfused pair: same x', same 1/rms for the router (sequential
 * sum over the warps, as the GEMV) and for gate/up (the butterfly of block_sum), same row
 * arithmetic as the Q8 GEMV. The planes are built between arrival and wait, where the block
 * would otherwise idle. */
__global__ void __launch_bounds__(kThreads)
    moe_gate_up_q4mma_fused_kernel(const __grid_constant__ gu_params p) {
    extern __shared__ float4 smem4[];
    __shared__ int s_idx[kMaxK];
    __shared__ float s_wt[kMaxK];
    __shared__ float s_sl[1024];
    __shared__ float s_sgl; /* the shared gate's logit (no-tag fallback) */
    __shared__ float red[32];
    __shared__ float part[2][64];
    uint32_t *xh = (uint32_t *)smem4, *xl = xh + p.H / 2;
    float *xs2 = (float *)(xl + p.H / 2);
    float *xr = xs2 + p.H / 32, *xrsum = xr + p.H; /* x' for the router, its chunk sums */
    const int nc16 = p.H / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = blockIdx.y;
    const bool shared = slot >= p.k;
    const int nb = gridDim.x * gridDim.y, b = blockIdx.y * gridDim.x + blockIdx.x;
    const bool ready = __ldcg(p.bar + 1) == kBarTag; /* the same in every block (see .cuh) */
    /* its barrier publishes xr; red keeps the 8 warps' sums of x^2 */
    const float rs_router = xs_build<LILY_CW_Q8>(p.x, p.norm_w, p.eps, p.H, xr, xrsum, red);
    const float ss = warp_sum(lane < (int)(blockDim.x >> 5) ? red[lane] : 0.f); /* block_sum's */
    const float rs = p.norm_w ? 1.0f / sqrtf(ss / p.H + p.eps) : 1.0f;
    const uint8_t *sgw = p.has_sgate ? p.sgw.w : nullptr;
    auto convert = [&]() {
        q4x_convert(
            p.H, [&](int col) { return xr[xs_index(col, 16, nc16)]; }, xh, xl, xs2);
    };
    if (ready) {
        router_rows(p.router.w, p.router.sb, sgw, p.sgw.sb, p.E, p.H, p.rlpr, (const float4 *)xr,
                    xrsum, rs_router, b, nb, p.rlog, nullptr, nullptr);
        __syncthreads(); /* every warp's logits stores before the arrival */
        uint32_t old = 0;
        if (threadIdx.x == 0) old = bar_arrive(p.bar, b == 0, (uint32_t)nb);
        convert();
        if (!shared && threadIdx.x == 0) bar_wait(p.bar, old);
        __syncthreads(); /* the barrier for the whole block; publishes the planes */
        if (!shared && warp == 0) {
            for (int e = lane; e < p.E; e += 32)
                s_sl[e] = __ldcg(p.rlog + e); /* past L1 */
            __syncwarp();
            topk_warp(s_sl, p.E, p.k, p.norm, s_sl, s_idx, s_wt);
        }
    } else { /* no initialised barrier yet: each routed block computes every row itself */
        if (!shared)
            router_rows(p.router.w, p.router.sb, sgw, p.sgw.sb, p.E, p.H, p.rlpr,
                        (const float4 *)xr, xrsum, rs_router, 0, 1, nullptr, s_sl, &s_sgl);
        convert();
        __syncthreads(); /* s_sl, s_sgl, the planes */
        if (!shared && warp == 0) topk_warp(s_sl, p.E, p.k, p.norm, s_sl, s_idx, s_wt);
    }
    __syncthreads(); /* s_idx, s_wt */
    if (blockIdx.x == 0 && slot == 0 && threadIdx.x == 0) {
        for (int j = 0; j < p.k; j++)
            p.idx[j] = s_idx[j], p.wt[j] = s_wt[j];
        *p.sg = p.has_sgate ? sigmoid_f(ready ? __ldcg(p.rlog + p.E) : s_sgl) : 1.0f;
    }
    const gu_rows g = gu_q4mma_rows(p, shared, shared ? 0 : s_idx[slot], blockIdx.x, warp, lane);
    q4_step_regs R[2];
    gu_q4mma_first(p, g, lane, R);
    gu_q4mma_main(p, g, slot, blockIdx.x, lane, R, xh, xl, xs2, rs, part);
}

/* grid ceil(H / 16) R. A block owns 16 output rows of one row of the step; its warps take the
 * (slot, 256-column step) units w, w + 8, ... (8 routed experts x 2 steps + the shared expert's 2
 * for the 35B shape); each slot's h goes to shared memory as hi/lo planes at imax-column
 * strides. */
__global__ void __launch_bounds__(kThreads)
    moe_down_q4mma_kernel(const __grid_constant__ dn_params p) {
    extern __shared__ float4 smem4[];
    __shared__ float s_f[kMaxK + 1];
    __shared__ float part[8][16];
    const int ns = p.k + p.has_shared;
    const int pw = p.imax / 2; /* words per slot per plane */
    uint32_t *xh = (uint32_t *)smem4, *xl = xh + (size_t)ns * pw;
    float *xs2 = (float *)(xl + (size_t)ns * pw);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int stepsI = p.I / 256, stepsS = p.Is / 256;
    const int units = p.k * stepsI + (p.has_shared ? stepsS : 0);
    const blk_pos bp = blk_of(p.R);
    const int32_t *idx = p.idx + bp.row * p.k;
    const int r = bp.bx * 16 + (lane >> 2);
    bar_reset(p.bar);
    auto unit = [&](int u, int &slot, int &step, const uint8_t *&r0, const uint32_t *&s0,
                    const uint8_t *&r1, const uint32_t *&s1) {
        int cols;
        const uint8_t *wb;
        const uint32_t *sbb;
        if (u < p.k * stepsI) {
            slot = u / stepsI, step = u % stepsI, cols = p.I;
            int ex = idx[slot];
            wb = p.down.w + (size_t)ex * p.down.ws;
            sbb = p.down.sb + (size_t)ex * p.down.sbs;
        } else {
            slot = p.k, step = u - p.k * stepsI, cols = p.Is;
            wb = p.sdown.w;
            sbb = p.sdown.sb;
        }
        const size_t rb = (size_t)cols / 2;
        const int ng = cols / 64;
        r0 = r < p.H ? wb + (size_t)r * rb : nullptr;
        r1 = r + 8 < p.H ? wb + (size_t)(r + 8) * rb : nullptr;
        s0 = sbb + (size_t)r * ng;
        s1 = sbb + (size_t)(r + 8) * ng;
    };
    constexpr int UB = 3; /* units per warp per batch: 18 units (35B) = one batch of 8 warps */
    q4_step_regs R[UB];
    int sl[UB], sp[UB];
    const uint8_t *r0, *r1;
    const uint32_t *s0, *s1;
    /* issues the loads of units u0, u0 + 8, ... (one batch of this warp) */
    auto load_batch = [&](int u0) {
#pragma unroll
        for (int j = 0; j < UB; j++) {
            int u = u0 + 8 * j;
            if (u < units) {
                unit(u, sl[j], sp[j], r0, s0, r1, s1);
                q4_step_load(r0, s0, r1, s1, sp[j], lane, R[j]);
            }
        }
    };
    load_batch(warp); /* the first batch, before h is staged */
    /* all slots' h as one vector of ns * imax columns (slot s at s * imax; columns of a shorter
     * slot past its width are never read) */
    {
        const float *hv = p.h + (size_t)bp.row * (p.k + 1) * p.imax;
        q4x_convert(
            ns * p.imax, [&](int col) { return hv[col]; }, xh, xl, xs2);
    }
    if (threadIdx.x < ns)
        s_f[threadIdx.x] = (int)threadIdx.x < p.k ? p.wt[bp.row * p.k + threadIdx.x] : p.sg[bp.row];
    __syncthreads();
    float acc0 = 0.f, acc1 = 0.f;
    for (int u0 = warp; u0 < units; u0 += 8 * UB) {
        if (u0 != warp) load_batch(u0);
#pragma unroll
        for (int j = 0; j < UB; j++) {
            if (u0 + 8 * j >= units) break;
            float a0 = 0.f, a1 = 0.f;
            const int s = sl[j];
            q4_step_math(R[j], xh + (size_t)s * pw, xl + (size_t)s * pw, xs2 + s * (p.imax / 32),
                         sp[j], lane, a0, a1);
            acc0 = fmaf(s_f[s], a0, acc0);
            acc1 = fmaf(s_f[s], a1, acc1);
        }
    }
    acc0 = quad_sum(acc0);
    acc1 = quad_sum(acc1);
    if ((lane & 3) == 0) {
        part[warp][lane >> 2] = acc0;
        part[warp][(lane >> 2) + 8] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int i = threadIdx.x, row = bp.bx * 16 + i;
        float t = 0.f;
        for (int w = 0; w < 8; w++)
            t += part[w][i];
        if (row < p.H) p.x[(size_t)bp.row * p.ldx + row] += t;
    }
}

int launch_gu_q4mma(const gu_params &p, int slots, lily_cuda_stream st, lily_err *e) {
    size_t smem = (size_t)p.H * 4 /* 2 bf16 planes */ + (size_t)(p.H / 32) * 4;
    if (smem > 40 * 1024) LILY_CU_TRY(smem_at_least(moe_gate_up_q4mma_kernel, smem), e);
    dim3 grid((p.imax + 31) / 32 * p.R, slots);
    LILY_CU_TRY(launch_kernel(moe_gate_up_q4mma_kernel, grid, dim3(kThreads), smem, st, p), e);
    return 0;
}

int lpr_for(int nchunk) {
    return nchunk % 32 == 0   ? 32
           : nchunk % 16 == 0 ? 16
           : nchunk % 8 == 0  ? 8
           : nchunk % 4 == 0  ? 4
                              : 2;
}

/* Dynamic shared memory of the fused kernel: the planes and their chunk sums as above, then x'
 * in fp32 and its 16-column chunk sums for the router. */
size_t gu_fused_smem(int H) {
    return (size_t)H * 4 + (size_t)(H / 32) * 4 + (size_t)H * 4 + (size_t)(H / 16) * 4;
}

/* Whether a grid of `blocks` fused gate/up blocks is resident all at once (the barrier needs
 * it). The answer depends only on the shared memory size; cached for the last one asked. Sets
 * the kernel's shared memory limit as a side effect (needed before the occupancy query). */
int gu_fused_resident(size_t smem, int blocks, bool *ok, lily_err *e) {
    static int sms = 0, per_sm = 0;
    static size_t cached = 0;
    if (!sms) {
        int dev = 0;
        LILY_CU_TRY(cudaGetDevice(&dev), e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), e);
    }
    if (smem != cached) {
        if (smem > 40 * 1024) LILY_CU_TRY(smem_at_least(moe_gate_up_q4mma_fused_kernel, smem), e);
        LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &per_sm, moe_gate_up_q4mma_fused_kernel, kThreads, smem),
                    e);
        cached = smem;
    }
    *ok = (long)per_sm * sms >= blocks;
    return 0;
}

/* Whether this MoE can take the fused-router path at all (shapes and formats): a Q8 router (and
 * Q8 shared gate row) over the same H as Q4 experts that run on the q4mma kernels. Anything else
 * (Q4 or bf16 router, no router) keeps the GEMV launch. */
bool fused_shape(const lily_cuda_moe *m) {
    if (m->k <= 0 || !m->router || m->gate->dt != LILY_CW_Q4) return false;
    const int H = m->gate->cols;
    if (H % 256) return false;
    const lily_dmat *r = m->router, *s = m->sh_gate_w;
    if (r->dt != LILY_CW_Q8 || r->cols != H || r->rows != m->E || r->n_mats != 1) return false;
    if (s && (s->dt != LILY_CW_Q8 || s->cols != H || s->rows != 1 || s->n_mats != 1)) return false;
    return true;
}

/* lily_cuda_moe_force_unfused: the router GEMV even where the fused form would run */
bool g_unfused = false;

/* Decides the decode path of R rows: *fused when there is one row, the shapes fit and the grid is
 * resident (several rows read the router once in the rows GEMV instead). */
int use_fused(const lily_cuda_moe *m, int R, bool *fused, lily_err *e) {
    *fused = false;
    if (R != 1 || g_unfused || !fused_shape(m)) return 0;
    dec_layout d = dec_plan(m);
    int slots = m->k + (m->sh_gate ? 1 : 0);
    return gu_fused_resident(gu_fused_smem(m->gate->cols), (d.imax + 31) / 32 * slots, fused, e);
}

int launch_gu_q4mma_fused(const gu_params &p, int slots, lily_cuda_stream st, lily_err *e) {
    if (p.R != 1) return lily_fail(e, "moe: the fused router runs one row (%d)", p.R);
    dim3 grid((p.imax + 31) / 32, slots);
    /* the shared memory attribute was set by gu_fused_resident */
    LILY_CU_TRY(launch_kernel(moe_gate_up_q4mma_fused_kernel, grid, dim3(kThreads),
                              gu_fused_smem(p.H), st, p),
                e);
    return 0;
}

int launch_dn_q4mma(const dn_params &p, lily_cuda_stream st, lily_err *e) {
    int ns = p.k + p.has_shared;
    size_t smem = (size_t)ns * ((size_t)p.imax * 4 /* 2 bf16 planes */ + (size_t)(p.imax / 32) * 4);
    if (smem > 40 * 1024) LILY_CU_TRY(smem_at_least(moe_down_q4mma_kernel, smem), e);
    LILY_CU_TRY(launch_kernel(moe_down_q4mma_kernel, dim3((p.H + 15) / 16 * p.R), dim3(kThreads),
                              smem, st, p),
                e);
    return 0;
}

template <int DT, int LPR>
int launch_gu(const gu_params &p, int slots, lily_cuda_stream st, lily_err *e) {
    size_t smem = ((size_t)p.H + p.H / wtype<DT>::epc) * 4;
    if (smem > 40 * 1024) LILY_CU_TRY(smem_at_least(moe_gate_up_kernel<DT, LPR>, smem), e);
    int rpb = (kThreads / 32) * 2 * (32 / LPR);
    dim3 grid((p.imax + rpb - 1) / rpb * p.R, slots);
    LILY_CU_TRY(launch_kernel(moe_gate_up_kernel<DT, LPR>, grid, dim3(kThreads), smem, st, p), e);
    return 0;
}

template <int DT, int LPR> int launch_dn(const dn_params &p, lily_cuda_stream st, lily_err *e) {
    int ns = p.k + p.has_shared;
    size_t smem = (size_t)ns * ((p.imax + p.imax / wtype<DT>::epc + 3) & ~3) * 4;
    if (smem > 40 * 1024) LILY_CU_TRY(smem_at_least(moe_down_kernel<DT, LPR>, smem), e);
    int rpb = (kThreads / 32) * (32 / LPR);
    int blocks = (p.H + rpb - 1) / rpb;
    if (blocks > 264) blocks = 264;
    LILY_CU_TRY(
        launch_kernel(moe_down_kernel<DT, LPR>, dim3(blocks * p.R), dim3(kThreads), smem, st, p),
        e);
    return 0;
}

template <int DT>
int launch_gu_dt(const gu_params &p, int slots, lily_cuda_stream st, lily_err *e) {
    switch (lpr_for(p.H / wtype<DT>::epc)) {
    case 32: return launch_gu<DT, 32>(p, slots, st, e);
    case 16: return launch_gu<DT, 16>(p, slots, st, e);
    case 8: return launch_gu<DT, 8>(p, slots, st, e);
    case 4: return launch_gu<DT, 4>(p, slots, st, e);
    default: return launch_gu<DT, 2>(p, slots, st, e);
    }
}
template <int DT> int launch_dn_dt(const dn_params &p, lily_cuda_stream st, lily_err *e) {
    switch (lpr_for((p.k ? p.I : p.Is) / wtype<DT>::epc)) {
    case 32: return launch_dn<DT, 32>(p, st, e);
    case 16: return launch_dn<DT, 16>(p, st, e);
    case 8: return launch_dn<DT, 8>(p, st, e);
    case 4: return launch_dn<DT, 4>(p, st, e);
    default: return launch_dn<DT, 2>(p, st, e);
    }
}

} // namespace

extern "C" void lily_cuda_moe_force_unfused(int on) {
    g_unfused = on != 0;
}

extern "C" int lily_cuda_moe_decode_scratch_init(void *scratch, lily_cuda_stream st, lily_err *e) {
    LILY_CU_TRY(cudaMemsetAsync(scratch, 0, 2 * sizeof(uint32_t), (cudaStream_t)st), e);
    return 0;
}

extern "C" size_t lily_cuda_moe_decode_scratch(const lily_cuda_moe *m) {
    return dec_plan(m).total;
}

extern "C" int lily_cuda_moe_decode_fuses(const lily_cuda_moe *m) {
    lily_err e;
    bool fused = false;
    if (check_moe(m, &e) || use_fused(m, 1, &fused, &e)) return 0;
    return fused;
}

extern "C" const int32_t *lily_cuda_moe_decode_idx(const lily_cuda_moe *m, const void *scratch) {
    return (const int32_t *)((const char *)scratch + dec_plan(m).idx);
}
extern "C" const float *lily_cuda_moe_decode_wt(const lily_cuda_moe *m, const void *scratch) {
    return (const float *)((const char *)scratch + dec_plan(m).wt);
}

extern "C" int lily_cuda_moe_decode(const lily_cuda_moe *m, float *x, const float *norm_w,
                                    float eps, void *scratch, lily_cuda_stream st, lily_err *e) {
    return lily_cuda_moe_decode_rows(m, 1, x, 0, norm_w, eps, scratch, st, e);
}

extern "C" int lily_cuda_moe_decode_rows(const lily_cuda_moe *m, int R, float *x, int ldx,
                                         const float *norm_w, float eps, void *scratch,
                                         lily_cuda_stream st, lily_err *e) {
    if (check_moe(m, e)) return -1;
    if (R < 1 || R > kRows) return lily_fail(e, "moe decode: %d rows (1..%d)", R, kRows);
    const lily_dmat *g = m->k ? m->gate : m->sh_gate, *dn = m->k ? m->down : m->sh_down;
    if (R > 1 && ldx < g->cols)
        return lily_fail(e, "moe decode: row stride %d under %d columns", ldx, g->cols);
    if (((uintptr_t)x | (uintptr_t)((size_t)ldx * 4)) & 15)
        return lily_fail(e, "moe decode: rows not 16-byte aligned");
    dec_layout d = dec_plan(m);
    char *s = (char *)scratch;
    float *logits = (float *)(s + d.logits);
    uint32_t *bar = (uint32_t *)(s + d.bar);
    bool fused;
    if (use_fused(m, R, &fused, e)) return -1;
    /* router and shared-gate logits of every row: one rows GEMV launch when they share a format
     * (unless the gate/up launch computes them), each matrix read once for all rows */
    const size_t lp = (size_t)m->E + 1; /* logits per row */
    const lily_gemv_pro pro = {LILY_GP_RMSNORM, norm_w, eps};
    const float *xr[kRows];
    /* the shared gate in a launch of its own (another format) */
    const bool apart = m->k > 0 && m->sh_gate_w && m->sh_gate_w->dt != m->router->dt;
    /* seg holds row r's ns segments at r ns (the [nx][nseg] layout lily_cuda_gemv_rows reads) */
    const int ns = (m->k > 0) + (m->sh_gate_w && !apart);
    lily_gemv_seg seg[kRows * 2], sgs[kRows];
    for (int r = 0; r < R; r++) {
        xr[r] = x + (size_t)r * ldx;
        lily_gemv_seg *sr = seg + r * ns;
        int j = 0;
        if (m->k > 0) sr[j++] = {m->router, logits + r * lp, LILY_GV_STORE, nullptr, nullptr, 0};
        if (m->sh_gate_w) {
            lily_gemv_seg sg = {
                m->sh_gate_w, logits + r * lp + m->E, LILY_GV_STORE, nullptr, nullptr, 0};
            if (apart)
                sgs[r] = sg;
            else
                sr[j++] = sg;
        }
    }
    if (!fused && apart && lily_cuda_gemv_rows(sgs, 1, R, xr, &pro, st, e)) return -1;
    if (!fused && ns && lily_cuda_gemv_rows(seg, ns, R, xr, &pro, st, e)) return -1;
    gu_params p = {};
    p.x = x;
    p.norm_w = norm_w;
    p.eps = eps;
    p.R = R;
    p.ldx = ldx;
    p.H = g->cols;
    p.E = m->E;
    p.k = m->k;
    p.norm = m->norm;
    p.I = m->k ? m->gate->rows : 0;
    p.Is = m->sh_gate ? m->sh_gate->rows : 0;
    p.has_sgate = m->sh_gate_w != nullptr;
    p.logits = logits;
    p.gate = ref_of(m->gate);
    p.up = ref_of(m->up);
    p.sgate = ref_of(m->sh_gate);
    p.sup = ref_of(m->sh_up);
    p.idx = (int32_t *)(s + d.idx);
    p.wt = (float *)(s + d.wt);
    p.sg = (float *)(s + d.sg);
    p.h = (float *)(s + d.h);
    p.imax = d.imax;
    p.router = ref_of(m->router);
    p.sgw = ref_of(m->sh_gate_w);
    p.rlpr = lpr_for(p.H / 16);
    p.rlog = logits;
    p.bar = bar;
    int slots = m->k + (m->sh_gate ? 1 : 0);
    int rc;
    switch (g->dt) {
    case LILY_CW_Q4:
        rc = fused            ? launch_gu_q4mma_fused(p, slots, st, e)
             : p.H % 256 == 0 ? launch_gu_q4mma(p, slots, st, e)
                              : launch_gu_dt<LILY_CW_Q4>(p, slots, st, e);
        break;
    case LILY_CW_Q8: rc = launch_gu_dt<LILY_CW_Q8>(p, slots, st, e); break;
    default: rc = launch_gu_dt<LILY_CW_BF16>(p, slots, st, e); break;
    }
    if (rc) return -1;
    dn_params q = {};
    q.h = p.h;
    q.idx = p.idx;
    q.wt = p.wt;
    q.sg = p.sg;
    q.k = m->k;
    q.has_shared = m->sh_gate != nullptr;
    q.I = m->k ? m->down->cols : 0;
    q.Is = m->sh_down ? m->sh_down->cols : 0;
    q.H = dn->rows;
    q.imax = d.imax;
    q.down = ref_of(m->down);
    q.sdown = ref_of(m->sh_down);
    q.x = x;
    q.R = R;
    q.ldx = ldx;
    q.bar = bar;
    switch (dn->dt) {
    case LILY_CW_Q4:
        if (q.I % 256 == 0 && q.Is % 256 == 0 && q.imax % 256 == 0)
            return launch_dn_q4mma(q, st, e);
        return launch_dn_dt<LILY_CW_Q4>(q, st, e);
    case LILY_CW_Q8: return launch_dn_dt<LILY_CW_Q8>(q, st, e);
    default: return launch_dn_dt<LILY_CW_BF16>(q, st, e);
    }
}
