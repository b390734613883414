/* MoE prefill (see moe.h): routing and top-k for a chunk of tokens, the per-expert histogram, scan
 * and scatter into expert groups, the grouped GEMMs (gemm.h) and the gather-back with the routing
 * weights and the gated shared expert. */
#include "backend/cuda/moe.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/moe_route.cuh"

/* ---- prefill ------------------------------------------------------------------------------- */

namespace {

constexpr int GBN = LILY_GEMM_GROUP_BN;     /* the expert tile of chunks that are not Q4 */
constexpr int kMinBN = LILY_GEMM_SKINNY_BN; /* the smallest tile: the tile list is sized for it */

struct pre_layout {
    size_t logits, idx, wt, counts, off, tiles, ntiles, gather, slot, hg, hu, yg, sgu, ys, total;
    size_t ccount; /* [chunks][E]: assignments per expert in each scatter chunk, then their bases */
    int max_tiles, I, Is, H, chunks; /* max_tiles: the entries of the tile list */
};

/* Assignments per scatter chunk: one warp places a chunk's rows (scatter_kernel). kScatMax,
 * halved down to kScatMin while that gives fewer than 64 chunks (a short chunk's few warps would
 * each place many rows); the scan walks the chunks per expert, so large chunks keep kScatMax. */
constexpr int kScatMax = 512, kScatMin = 64;
__host__ __device__ __forceinline__ int scat_chunk(size_t nk) {
    int cs = kScatMax;
    while (cs > kScatMin && nk / (size_t)cs < 64)
        cs >>= 1;
    return cs;
}

pre_layout pre_plan(const lily_cuda_moe *m, int n) {
    pre_layout d;
    d.I = m->k ? m->gate->rows : 0;
    d.Is = m->sh_gate ? m->sh_gate->rows : 0;
    d.H = m->k ? m->down->rows : m->sh_down->rows;
    size_t nk = (size_t)n * m->k;
    d.max_tiles = m->k ? (int)((nk + kMinBN - 1) / kMinBN) + m->E : 0;
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
    const int cs = scat_chunk(nk);
    d.chunks = (int)((nk + cs - 1) / cs);
    /* sized for the most chunks of any nk' <= nk, so the scratch of a chunk of n tokens holds the
     * layout of every shorter chunk: the chunk count is not monotone (it drops from 128 to 64
     * where cs doubles); below kScatMax, nk' < 128 cs, so at most 128 chunks */
    const size_t cmax = (nk + kScatMax - 1) / kScatMax, cbound = cmax > 128 ? cmax : 128;
    d.ccount = take(cbound * m->E * 4);
    d.off = take(((size_t)m->E + 1) * 4);
    d.tiles = take((size_t)d.max_tiles * 12);
    d.ntiles = take(4);
    d.gather = take(nk * 4);
    d.slot = take(nk * 4);
    d.hg = take(nk * d.I * 4);
    d.hu = take(nk * d.I * 4);
    d.yg = take(nk * d.H * 4);
    d.sgu = take((size_t)n * 2 * d.Is * 4); /* [n][2 Is]: the shared gate, then up, of a row */
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

/* Per scatter chunk of scat_chunk(nk) assignments: how many go to each expert (invalid ids
 * skipped). */
__global__ void chunk_count_kernel(const int32_t *__restrict__ idx, int nk, int E,
                                   int32_t *ccount) {
    extern __shared__ int hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        hist[e] = 0;
    __syncthreads();
    const int cs = scat_chunk(nk), f0 = blockIdx.x * cs, f1 = min(nk, f0 + cs);
    for (int f = f0 + threadIdx.x; f < f1; f += blockDim.x) {
        const int ex = idx[f];
        if (ex >= 0 && ex < E) atomicAdd(&hist[ex], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        ccount[(size_t)blockIdx.x * E + e] = hist[e];
}

/* One block of 1024 threads: expert offsets and the grouped GEMM's tile list; then each chunk's
 * per-expert counts become its first grouped row per expert (ccount in place). The scans are
 * warp shuffles plus one pass over the 32 warp totals; each thread reads its expert's chunk
 * counts 16 at a time before writing them back (one read after each write, the compiler cannot
 * reorder them: one L2 round trip per chunk). */
__global__ void __launch_bounds__(1024)
    scan_kernel(const int32_t *__restrict__ counts, int E, int gbn, int32_t *off, int32_t *tiles,
                int32_t *ntiles, int32_t *ccount, int chunks) {
    __shared__ int s_wc[32], s_wt[32];
    const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const int c = e < E ? counts[e] : 0, nt = (c + gbn - 1) / gbn;
    int ic = c, it = nt; /* inclusive scans within the warp */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) ic += a, it += b;
    }
    if (lane == 31) s_wc[warp] = ic, s_wt[warp] = it;
    __syncthreads();
    if (warp == 0) { /* exclusive scan of the warp totals */
        const int wc = s_wc[lane], wt = s_wt[lane];
        int xc = wc, xt = wt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, xc, o),
                      b = __shfl_up_sync(0xffffffffu, xt, o);
            if (lane >= o) xc += a, xt += b;
        }
        s_wc[lane] = xc - wc, s_wt[lane] = xt - wt;
        if (lane == 31) {
            off[E] = xc;
            *ntiles = xt;
        }
    }
    __syncthreads();
    if (e >= E) return;
    const int r0 = s_wc[warp] + ic - c, t0 = s_wt[warp] + it - nt;
    off[e] = r0;
    for (int i = 0; i < nt; i++) {
        tiles[3 * (t0 + i)] = e;
        tiles[3 * (t0 + i) + 1] = r0 + i * gbn;
        tiles[3 * (t0 + i) + 2] = min(gbn, c - i * gbn);
    }
    int run = r0;
    for (int ch0 = 0; ch0 < chunks; ch0 += 16) {
        int v[16];
#pragma unroll
        for (int i = 0; i < 16; i++)
            v[i] = ch0 + i < chunks ? ccount[(size_t)(ch0 + i) * E + e] : 0;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (ch0 + i < chunks) {
                ccount[(size_t)(ch0 + i) * E + e] = run;
                run += v[i];
            }
    }
}

/* One warp per scatter chunk: each assignment's grouped row is its chunk's base for the expert
 * plus the assignments of that expert before it in the chunk (__match_any_sync per 32), so the
 * rows of an expert stay in (token, slot) order and the result is deterministic. */
__global__ void __launch_bounds__(32)
    scatter_kernel(const int32_t *__restrict__ idx, int nk, int k, int E,
                   const int32_t *__restrict__ base, int32_t *gather, int32_t *slot) {
    extern __shared__ int run[];
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32)
        run[e] = base[(size_t)blockIdx.x * E + e];
    __syncwarp();
    const int cs = scat_chunk(nk), f0 = blockIdx.x * cs, f1 = min(nk, f0 + cs);
    for (int fb = f0; fb < f1; fb += 32) {
        const int f = fb + lane;
        int ex = f < f1 ? idx[f] : -1;
        const bool ok = ex >= 0 && ex < E;
        if (!ok) ex = -1 - lane; /* a key no other lane has */
        const unsigned same = __match_any_sync(0xffffffffu, ex);
        int p = 0;
        if (ok) {
            p = run[ex] + __popc(same & ((1u << lane) - 1));
            gather[p] = f / k;
            slot[f] = p;
        }
        __syncwarp();
        if (ok && lane == 31 - __clz(same)) run[ex] += __popc(same);
        __syncwarp();
    }
}

/* g = silu(g) * u over rows x K elements (row stride ld). */
__global__ void silu_mul_kernel(float *g, const float *__restrict__ u, int ld, int K, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t o = (i / K) * ld + i % K;
    g[o] = silu_f(g[o]) * u[o];
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

/* g = silu(g) * u over [rows][K] (row stride ld); with the exact GEMMs (gemm_split.h), instead
 * the split words of silu(g) * u for the down projection that reads g next, held under g's
 * address. */
int silu_mul(float *g, const float *u, int ld, int rows, int K, lily_cuda_stream st, lily_err *e) {
    if (lily_cuda_gemm_exact())
        return rows > 0 ? lily_cuda_xsplit_silu_mul(g, u, ld, rows, K, st, e) : 0;
    const size_t n = (size_t)rows * K;
    if (!n) return 0;
    silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(g, u, ld, K, n);
    LILY_CU_LAUNCHED(e);
    return 0;
}

int prefill_body(const lily_cuda_moe *m, const float *u, int n, const int32_t *given_idx,
                 const float *given_wt, float *x, void *scratch, lily_cuda_stream st, lily_err *e) {
    if (check_moe(m, e)) return -1;
    if (n < 1) return 0;
    pre_layout d = pre_plan(m, n);
    char *s = (char *)scratch;
    float *logits = (float *)(s + d.logits);
    int ldl = m->E + 1, H = d.H, k = m->k, E = m->E;
    int nk = n * k;
    /* rows per expert tile, one height per chunk: 64 when the experts average >= 64 rows (half
     * the dequantization per token); 16 (the skinny kernel, gemm_skinny.h: no dequantization)
     * when they average fewer and the experts are Q4; else 32 (bench/NOTES-cuda.md, "Moved from
     * src comments"; per-expert heights lost to it, "Prefill winners" there) */
    const bool q4 =
        k > 0 && m->gate->dt == LILY_CW_Q4 && m->up->dt == LILY_CW_Q4 && m->down->dt == LILY_CW_Q4;
    bool gw_done = false; /* the shared expert's gate logit is in logits column E */
    const int gbn = E > 0 && nk >= 64 * E ? 64 : q4 ? kMinBN : GBN;
    /* the grid's tile rows: the most tiles gbn-row tiles can make (<= d.max_tiles) */
    const int max_tiles = k > 0 ? (nk + gbn - 1) / gbn + E : 0;
    const int32_t *idx = (const int32_t *)(s + d.idx);
    const float *wt = (const float *)(s + d.wt);
    int32_t *slot = (int32_t *)(s + d.slot);
    int32_t *tiles = (int32_t *)(s + d.tiles), *ntiles = (int32_t *)(s + d.ntiles);
    if (k > 0) {
        int32_t *counts = (int32_t *)(s + d.counts);
        LILY_CU_TRY(cudaMemsetAsync(counts, 0, (size_t)E * 4, st), e);
        if (given_idx) {
            idx = given_idx;
            wt = given_wt;
            count_kernel<<<(nk + 255) / 256, 256, 0, st>>>(idx, nk, E, counts);
            LILY_CU_LAUNCHED(e);
        } else {
            /* with router_gw the shared expert's gate logit comes with the router's (column E) */
            if (lily_cuda_gemm(m->router_gw ? m->router_gw : m->router, u, H, n, logits, ldl, 0, st,
                               e))
                return -1;
            gw_done = m->router_gw != nullptr;
            route_kernel<<<(n + 7) / 8, 256, 8 * E * sizeof(float), st>>>(
                logits, ldl, n, E, k, m->norm, (int32_t *)(s + d.idx), (float *)(s + d.wt), counts);
            LILY_CU_LAUNCHED(e);
        }
        int32_t *off = (int32_t *)(s + d.off), *gather = (int32_t *)(s + d.gather);
        int32_t *ccount = (int32_t *)(s + d.ccount);
        chunk_count_kernel<<<d.chunks, 256, (size_t)E * 4, st>>>(idx, nk, E, ccount);
        LILY_CU_LAUNCHED(e);
        scan_kernel<<<1, 1024, 0, st>>>(counts, E, gbn, off, tiles, ntiles, ccount, d.chunks);
        LILY_CU_LAUNCHED(e);
        scatter_kernel<<<d.chunks, 32, (size_t)E * 4, st>>>(idx, nk, k, E, ccount, gather, slot);
        LILY_CU_LAUNCHED(e);
        float *hg = (float *)(s + d.hg), *hu = (float *)(s + d.hu);
        if (gbn == kMinBN) { /* gate and up in one launch */
            if (lily_cuda_gemm_skinny_grouped_pair(m->gate, m->up, u, H, n, gather, tiles, ntiles,
                                                   max_tiles, hg, hu, d.I, st, e))
                return -1;
        } else if (lily_cuda_gemm_grouped(m->gate, u, H, n, gather, tiles, ntiles, max_tiles, gbn,
                                          hg, d.I, st, e) ||
                   lily_cuda_gemm_grouped(m->up, u, H, n, gather, tiles, ntiles, max_tiles, gbn, hu,
                                          d.I, st, e)) {
            return -1;
        }
    }
    /* the shared expert's gate/up and gate logit before the routed down projection: they read u,
     * which the exact GEMMs then split once (gemm_split.h) */
    float *ys = nullptr;
    if (m->sh_gate) {
        const int Is = d.Is, ld = 2 * Is;
        float *sg = (float *)(s + d.sgu), *su = sg + Is;
        ys = (float *)(s + d.ys);
        if (m->sh_gu) {
            if (lily_cuda_gemm(m->sh_gu, u, H, n, sg, ld, 0, st, e)) return -1;
        } else if (lily_cuda_gemm(m->sh_gate, u, H, n, sg, ld, 0, st, e) ||
                   lily_cuda_gemm(m->sh_up, u, H, n, su, ld, 0, st, e)) {
            return -1;
        }
        if (m->sh_gate_w && !gw_done &&
            lily_cuda_gemm(m->sh_gate_w, u, H, n, logits + E, ldl, 0, st, e))
            return -1;
        lily_cuda_xsplit_hold(nullptr);
        int rc = silu_mul(sg, su, ld, n, Is, st, e) ||
                 lily_cuda_gemm(m->sh_down, sg, ld, n, ys, H, 0, st, e);
        lily_cuda_xsplit_hold(nullptr);
        if (rc) return -1;
    }
    lily_cuda_xsplit_hold(nullptr);
    if (k > 0) {
        float *hg = (float *)(s + d.hg), *hu = (float *)(s + d.hu), *yg = (float *)(s + d.yg);
        int rc = silu_mul(hg, hu, d.I, nk, d.I, st, e) ||
                 lily_cuda_gemm_grouped(m->down, hg, d.I, nk, nullptr, tiles, ntiles, max_tiles,
                                        gbn, yg, H, st, e);
        lily_cuda_xsplit_hold(nullptr);
        if (rc) return -1;
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
