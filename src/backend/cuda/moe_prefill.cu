/* MoE prefill (see moe.h): routing and top-k for a chunk of tokens, the per-expert histogram, scan
 * and scatter into expert groups, the grouped GEMMs (gemm.h) and the gather-back with the routing
 * weights and the gated shared expert. */
#include "backend/cuda/moe.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/moe_route.cuh"

/* ---- prefill ------------------------------------------------------------------------------- */

namespace {

constexpr int GBN = LILY_GEMM_GROUP_BN;

struct pre_layout {
    size_t logits, idx, wt, counts, off, tiles, ntiles, gather, slot, hg, hu, yg, sg, su, ys, total;
    int max_tiles, I, Is, H;
};

pre_layout pre_plan(const lily_cuda_moe *m, int n) {
    pre_layout d;
    d.I = m->k ? m->gate->rows : 0;
    d.Is = m->sh_gate ? m->sh_gate->rows : 0;
    d.H = m->k ? m->down->rows : m->sh_down->rows;
    size_t nk = (size_t)n * m->k;
    d.max_tiles = m->k ? (int)((nk + GBN - 1) / GBN) + m->E : 0;
    size_t o = 0;
    auto take = [&](size_t bytes) {
        size_t r = o;
        o += (bytes + 255) & ~(size_t)255;
        return r;
    };
    d.logits = take((size_t)n * (m->E + 1) * 4);
    d.idx = take(nk * 4);
    d.wt = take(nk * 4);
    d.counts = take((size_t)m->E * 4);
    d.off = take(((size_t)m->E + 1) * 4);
    d.tiles = take((size_t)d.max_tiles * 12);
    d.ntiles = take(4);
    d.gather = take(nk * 4);
    d.slot = take(nk * 4);
    d.hg = take(nk * d.I * 4);
    d.hu = take(nk * d.I * 4);
    d.yg = take(nk * d.H * 4);
    d.sg = take((size_t)n * d.Is * 4);
    d.su = take((size_t)n * d.Is * 4);
    d.ys = take(d.Is ? (size_t)n * d.H * 4 : 0);
    d.total = o;
    return d;
}

/* One warp per token: top-k of its logits row, plus the per-expert histogram. */
__global__ void route_kernel(const float *__restrict__ logits, int ldl, int n, int E, int k,
                             int norm, int32_t *idx, float *wt, int32_t *counts) {
    extern __shared__ float rsl[];
    __shared__ int s_idx[8][kMaxK];
    __shared__ float s_wt[8][kMaxK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * 8 + warp;
    if (t >= n) return;
    topk_warp(logits + (size_t)t * ldl, E, k, norm, rsl + warp * E, s_idx[warp], s_wt[warp]);
    if (lane < k) {
        idx[(size_t)t * k + lane] = s_idx[warp][lane];
        wt[(size_t)t * k + lane] = s_wt[warp][lane];
        atomicAdd(&counts[s_idx[warp][lane]], 1);
    }
}

__global__ void count_kernel(const int32_t *__restrict__ idx, int nk, int E, int32_t *counts) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nk) {
        int ex = idx[i];
        if (ex >= 0 && ex < E) atomicAdd(&counts[ex], 1);
    }
}

/* One block of 1024 threads: expert offsets and the grouped GEMM's tile list. */
__global__ void __launch_bounds__(1024)
    scan_kernel(const int32_t *__restrict__ counts, int E, int32_t *off, int32_t *tiles,
                int32_t *ntiles) {
    __shared__ int s_c[1024], s_t[1024];
    int e = threadIdx.x;
    int c = e < E ? counts[e] : 0, nt = (c + GBN - 1) / GBN;
    s_c[e] = c;
    s_t[e] = nt;
    __syncthreads();
    /* inclusive Hillis-Steele scans of counts and tile counts */
    for (int o = 1; o < 1024; o <<= 1) {
        int a = e >= o ? s_c[e - o] : 0, b = e >= o ? s_t[e - o] : 0;
        __syncthreads();
        s_c[e] += a;
        s_t[e] += b;
        __syncthreads();
    }
    if (e < E) {
        int r0 = s_c[e] - c, t0 = s_t[e] - nt;
        off[e] = r0;
        for (int i = 0; i < nt; i++) {
            tiles[3 * (t0 + i)] = e;
            tiles[3 * (t0 + i) + 1] = r0 + i * GBN;
            tiles[3 * (t0 + i) + 2] = min(GBN, c - i * GBN);
        }
    }
    if (e == 0) {
        off[E] = s_c[1023];
        *ntiles = s_t[1023];
    }
}

/* One warp per expert: grouped rows in (token, slot) order, so the result is deterministic. */
__global__ void scatter_kernel(const int32_t *__restrict__ idx, int nk, int k, int E,
                               const int32_t *__restrict__ off, int32_t *gather, int32_t *slot) {
    const int lane = threadIdx.x & 31;
    const int ex = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (ex >= E) return;
    int pos = off[ex];
    for (int f0 = 0; f0 < nk; f0 += 32) {
        int f = f0 + lane;
        bool mine = f < nk && idx[f] == ex;
        unsigned b = __ballot_sync(0xffffffffu, mine);
        if (mine) {
            int p = pos + __popc(b & ((1u << lane) - 1));
            gather[p] = f / k;
            slot[f] = p;
        }
        pos += __popc(b);
    }
}

__global__ void silu_mul_kernel(float *g, const float *__restrict__ u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_f(g[i]) * u[i];
}

/* x[t][d] += sigmoid(sgl[t]) * ys[t][d] + sum_j wt[t][j] * yg[slot[t][j]][d]. */
__global__ void combine_kernel(float *x, int n, int H, int k, const float *__restrict__ wt,
                               const int32_t *__restrict__ slot, const float *__restrict__ yg,
                               const float *__restrict__ ys, const float *__restrict__ sgl,
                               int ldl) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H) return;
    int t = (int)(i / H), d = (int)(i % H);
    float acc = 0.f;
    if (ys) acc = (sgl ? sigmoid_f(sgl[(size_t)t * ldl]) : 1.0f) * ys[i];
    for (int j = 0; j < k; j++)
        acc = fmaf(wt[(size_t)t * k + j], yg[(size_t)slot[(size_t)t * k + j] * H + d], acc);
    x[i] += acc;
}

int silu_mul(float *g, const float *u, size_t n, lily_cuda_stream st, lily_err *e) {
    if (!n) return 0;
    silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(g, u, n);
    LILY_CU_LAUNCHED(e);
    return 0;
}

int prefill_body(const lily_cuda_moe *m, const float *u, int n, const int32_t *given_idx,
                 const float *given_wt, float *x, void *scratch, lily_cuda_stream st,
                 lily_err *e) {
    if (check_moe(m, e)) return -1;
    if (n < 1) return 0;
    pre_layout d = pre_plan(m, n);
    char *s = (char *)scratch;
    float *logits = (float *)(s + d.logits);
    int ldl = m->E + 1, H = d.H, k = m->k, E = m->E;
    int nk = n * k;
    const int32_t *idx = (const int32_t *)(s + d.idx);
    const float *wt = (const float *)(s + d.wt);
    int32_t *slot = (int32_t *)(s + d.slot);
    if (k > 0) {
        int32_t *counts = (int32_t *)(s + d.counts);
        LILY_CU_TRY(cudaMemsetAsync(counts, 0, (size_t)E * 4, st), e);
        if (given_idx) {
            idx = given_idx;
            wt = given_wt;
            count_kernel<<<(nk + 255) / 256, 256, 0, st>>>(idx, nk, E, counts);
            LILY_CU_LAUNCHED(e);
        } else {
            if (lily_cuda_gemm(m->router, u, H, n, logits, ldl, 0, st, e)) return -1;
            route_kernel<<<(n + 7) / 8, 256, 8 * E * sizeof(float), st>>>(
                logits, ldl, n, E, k, m->norm, (int32_t *)(s + d.idx), (float *)(s + d.wt),
                counts);
            LILY_CU_LAUNCHED(e);
        }
        int32_t *off = (int32_t *)(s + d.off), *tiles = (int32_t *)(s + d.tiles);
        int32_t *ntiles = (int32_t *)(s + d.ntiles), *gather = (int32_t *)(s + d.gather);
        scan_kernel<<<1, 1024, 0, st>>>(counts, E, off, tiles, ntiles);
        LILY_CU_LAUNCHED(e);
        scatter_kernel<<<(E + 7) / 8, 256, 0, st>>>(idx, nk, k, E, off, gather, slot);
        LILY_CU_LAUNCHED(e);
        float *hg = (float *)(s + d.hg), *hu = (float *)(s + d.hu);
        if (lily_cuda_gemm_grouped(m->gate, u, H, n, gather, tiles, ntiles, d.max_tiles, hg, d.I,
                                   st, e) ||
            lily_cuda_gemm_grouped(m->up, u, H, n, gather, tiles, ntiles, d.max_tiles, hu, d.I,
                                   st, e))
            return -1;
    }
    /* the shared expert's gate/up and gate logit before the routed down projection: they read u,
     * which the exact GEMMs then split once (gemm_split.h) */
    float *ys = nullptr;
    if (m->sh_gate) {
        float *sg = (float *)(s + d.sg), *su = (float *)(s + d.su);
        ys = (float *)(s + d.ys);
        if (lily_cuda_gemm(m->sh_gate, u, H, n, sg, d.Is, 0, st, e) ||
            lily_cuda_gemm(m->sh_up, u, H, n, su, d.Is, 0, st, e))
            return -1;
        if (m->sh_gate_w && lily_cuda_gemm(m->sh_gate_w, u, H, n, logits + E, ldl, 0, st, e))
            return -1;
        lily_cuda_xsplit_hold(nullptr);
        if (silu_mul(sg, su, (size_t)n * d.Is, st, e) ||
            lily_cuda_gemm(m->sh_down, sg, d.Is, n, ys, H, 0, st, e))
            return -1;
    }
    lily_cuda_xsplit_hold(nullptr);
    if (k > 0) {
        float *hg = (float *)(s + d.hg), *hu = (float *)(s + d.hu), *yg = (float *)(s + d.yg);
        int32_t *tiles = (int32_t *)(s + d.tiles), *ntiles = (int32_t *)(s + d.ntiles);
        if (silu_mul(hg, hu, (size_t)nk * d.I, st, e) ||
            lily_cuda_gemm_grouped(m->down, hg, d.I, nk, nullptr, tiles, ntiles, d.max_tiles, yg,
                                   H, st, e))
            return -1;
    }
    size_t total = (size_t)n * H;
    combine_kernel<<<(unsigned)((total + 255) / 256), 256, 0, st>>>(
        x, n, H, k, wt, slot, (const float *)(s + d.yg), ys, m->sh_gate_w ? logits + E : nullptr,
        ldl);
    LILY_CU_LAUNCHED(e);
    return 0;
}

int prefill_common(const lily_cuda_moe *m, const float *u, int n, const int32_t *given_idx,
                   const float *given_wt, float *x, void *scratch, lily_cuda_stream st,
                   lily_err *e) {
    lily_cuda_xsplit_hold(u); /* u is read by every GEMM up to the down projections */
    int rc = prefill_body(m, u, n, given_idx, given_wt, x, scratch, st, e);
    lily_cuda_xsplit_hold(nullptr);
    return rc;
}

} // namespace

extern "C" size_t lily_cuda_moe_prefill_scratch(const lily_cuda_moe *m, int n) {
    return pre_plan(m, n).total;
}

extern "C" int lily_cuda_moe_prefill(const lily_cuda_moe *m, const float *u, int n, float *x,
                                     void *scratch, lily_cuda_stream st, lily_err *e) {
    return prefill_common(m, u, n, nullptr, nullptr, x, scratch, st, e);
}

extern "C" int lily_cuda_moe_prefill_routed(const lily_cuda_moe *m, const float *u, int n,
                                            const int32_t *idx, const float *wt, float *x,
                                            void *scratch, lily_cuda_stream st, lily_err *e) {
    if (m->k == 0) return lily_fail(e, "moe: routed prefill without experts");
    return prefill_common(m, u, n, idx, wt, x, scratch, st, e);
}

extern "C" const int32_t *lily_cuda_moe_prefill_idx(const lily_cuda_moe *m, int n,
                                                    const void *scratch) {
    return (const int32_t *)((const char *)scratch + pre_plan(m, n).idx);
}

extern "C" const float *lily_cuda_moe_prefill_wt(const lily_cuda_moe *m, int n,
                                                 const void *scratch) {
    return (const float *)((const char *)scratch + pre_plan(m, n).wt);
}
