/* The persistent decode kernel (mega.h): the device side (tile bodies, dependency waits) and the
 * host side (the instruction list built from the step program, the tiles dealt to the blocks). */
#include "backend/cuda/mega.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attn_dec.cuh"
#include "backend/cuda/attn_kv.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/moe_route.cuh"

extern "C" {
#include "backend/program.h"
}

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
/* context splits of the decode attention at most (the split tiles per KV head group are
 * min(this, grid / groups), fixed at build) */
constexpr int kMaxSplits = 128;
constexpr int kMaxSeg = kMaxK + 1;
constexpr int kMaxDeps = 3;
constexpr long long kDefaultTimeoutNs = 10000000000ll;

enum mg_kind {
    MG_EMBED,      /* x = embed[token]; 1 tile */
    MG_GEMV,       /* output rows of up to kMaxSeg matrices over one prologue */
    MG_GDN_REC,    /* a value head: delta-rule step + gated RMSNorm; Nv tiles */
    MG_ATTN_PREP,  /* a KV head: q/k norm + RoPE, the gate, K/V into the cache; Nkv tiles */
    MG_ATTN_SPLIT, /* (context split, KV head x group of 8 query heads): partials; ms * Nkv * MT */
    MG_ATTN_MERGE, /* (query head, 32 columns): merges the splits, sigmoid(gate); Nq * Dh / 32 */
    MG_TOPK,       /* softmax top-k of the router logits; 1 tile */
    MG_DOWN,       /* x rows += routed experts' and shared (or dense) down projections */
    MG_ARGMAX      /* the argmax of the lm_head tiles' keys; 1 tile */
};
enum { EPI_STORE, EPI_ADD, EPI_CONV, EPI_SWIGLU };
enum { PRO_COPY, PRO_RMSNORM };

struct mg_mat {
    const uint8_t *w;
    const uint32_t *sb;
    int dt, rows, cols;
    size_t w_stride, sb_stride;
};

struct mg_seg {
    mg_mat m, m2; /* m2: SWIGLU's up matrix (m its gate) */
    float *y;
    int epi;
    int slot;                /* >= 0: m, m2 are expert stacks, the expert is route slot `slot`'s */
    const float *conv_w;     /* CONV: [rows][K] */
    int rpt, tile0;          /* rows per tile, the op's first tile of this segment */
    unsigned long long *key; /* per-tile argmax keys (lm_head) or NULL */
};

struct mg_op {
    int kind, layer, ntiles, ndeps;
    int deps[kMaxDeps];
    /* MG_GEMV: prologue over xin [cols] (RMSNORM with norm_w) and the segments */
    int pro, cols, nseg;
    const float *xin, *norm_w;
    mg_seg seg[kMaxSeg];
    /* per kind: GDN_REC f = {A_log, dt_bias, gdn_norm}; ATTN_PREP f = {q_norm, k_norm};
     * DOWN dm = {routed down stack, shared/dense down}, iv = {routed slots, shared gated},
     * rpt = rows per tile */
    const float *f[3];
    mg_mat dm[2];
    int iv[2], rpt;
};

/* Shapes and scratch, the same for every layer. */
struct mg_cfg {
    int H, Nk, Nv, Dk, Dv, C, Zw, K, Nq, Nkv, Dh, R, gated, E, topk, normk, I, Is, nkeys;
    float eps;
    const int32_t *d_tok, *d_pos;
    int32_t *d_argmax;
    float *x;
    const float *inv_freq;
    mg_mat embed;
    float *cv, *z, *ba, *og, *qg, *kvn, *q, *gate, *ao, *part, *rl, *rwt, *act, *sg;
    /* decode attention: split tiles per KV head group (the max_splits and want of
     * attn_dec.cuh's bodies), q's scale times log2(e), exact products (the step's precision) */
    int ms, exact;
    float qscale;
    int *ridx;
    unsigned long long *keys;
};

/* ---- device helpers ------------------------------------------------------------------------ */

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ long long gtimer() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* L2 prefetch of [p, p + bytes) (16-byte aligned, bytes % 16 == 0), spread over the block; at
 * most kPrefetchMax bytes, so that the grid's prefetches stay well inside the L2 (a larger tile
 * streams the rest). */
constexpr size_t kPrefetchMax = 131072;
__device__ void prefetch_l2(const void *p, size_t bytes) {
    constexpr size_t piece = 16384;
    const char *c = (const char *)p;
    bytes = bytes < kPrefetchMax ? bytes : kPrefetchMax;
    for (size_t o = (size_t)threadIdx.x * piece; o < bytes; o += (size_t)blockDim.x * piece) {
        size_t n = bytes - o < piece ? bytes - o : piece;
#if __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c + o), "r"((unsigned)n)
                     : "memory");
#else
        for (size_t i = 0; i < n; i += 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o + i));
#endif
    }
}

__device__ float block_max_abs(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.f;
    return warp_max(t);
}

__device__ __forceinline__ uint16_t mg_kv_code(float x, float s) {
    if (!(s > 0.f)) return 32768u;
    const float cm = (float)kKvCodeMax;
    return (uint16_t)(32768 + (int)fminf(fmaxf(rintf(x / s), -cm), cm));
}

__device__ __forceinline__ unsigned long long mg_argmax_key(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ((unsigned long long)u << 32) | (0xffffffffu - (uint32_t)i);
}

/* Block-wide maximum of u64 keys (all threads get it). red8: kWarps words. */
__device__ unsigned long long block_max_key(unsigned long long k, unsigned long long *red8) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long t = __shfl_xor_sync(0xffffffffu, k, o);
        k = t > k ? t : k;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red8[threadIdx.x >> 5] = k;
    __syncthreads();
    k = 0;
    for (int w = 0; w < kWarps; w++)
        k = red8[w] > k ? red8[w] : k;
    return k;
}

/* x' = prologue(src) into the transposed layout of weight type DT (common.cuh), with the chunk
 * sums. All threads call it. */
template <int DT>
__device__ void build_x(const float *src, int cols, int pro, const float *nw, float eps, float *xs,
                        float *xsum, float *red) {
    constexpr int epc = wtype<DT>::epc;
    const int nchunk = cols / epc;
    float r = 1.f;
    if (pro == PRO_RMSNORM) {
        float ss = 0.f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = __ldcg(src + c);
            ss += v * v;
        }
        ss = block_sum(ss, red);
        r = 1.0f / sqrtf(ss / (float)cols + eps);
    }
    __syncthreads(); /* xs may still be read by the previous tile's warps */
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = __ldcg(src + c);
        if (pro == PRO_RMSNORM) v = v * r * __ldg(nw + c);
        xs[xs_index(c, epc, nchunk)] = v;
    }
    __syncthreads();
    store_xsum<DT>(xs, xsum, nchunk);
    __syncthreads();
}

__device__ __forceinline__ size_t gpr_words(int cols) {
    return (size_t)(cols / 64);
}

/* ---- tile bodies --------------------------------------------------------------------------- */

template <int DT>
__device__ void gemv_tile(const mg_op &op, const mg_seg &sg, int t, const mg_cfg &cf,
                          const lily_mega_state &st, float *smem, float *red,
                          unsigned long long *red8) {
    const int cols = sg.m.cols;
    constexpr int epc = wtype<DT>::epc;
    const int nchunk = cols / epc;
    float *xs = smem, *xsum = smem + cols;
    const int r0 = t * sg.rpt, r1 = min(sg.m.rows, r0 + sg.rpt);
    const size_t rb = dmat_row_bytes(DT, cols), gw = gpr_words(cols);
    const uint8_t *w1 = sg.m.w, *w2 = sg.m2.w;
    const uint32_t *s1 = sg.m.sb, *s2 = sg.m2.sb;
    if (sg.slot >= 0) { /* an expert, known now: its rows stream into L2 while x' is built */
        const size_t ex = (size_t)__ldcg(cf.ridx + sg.slot);
        w1 += ex * sg.m.w_stride, w2 += ex * sg.m2.w_stride;
        if (s1) s1 += ex * sg.m.sb_stride;
        if (s2) s2 += ex * sg.m2.sb_stride;
        prefetch_l2(w1 + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
        if (sg.epi == EPI_SWIGLU) prefetch_l2(w2 + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    }
    build_x<DT>(op.xin, cols, op.pro, op.norm_w, cf.eps, xs, xsum, red);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool swiglu = sg.epi == EPI_SWIGLU;
    unsigned long long best = 0;
    /* a warp takes two rows at a time: rows r, r + 1, or (SWIGLU) gate and up of row r */
    const int step = swiglu ? 1 : 2;
    for (int r = r0 + warp * step; r < r1; r += kWarps * step) {
        const uint8_t *wr[2];
        const uint32_t *sbr[2];
        wr[0] = w1 + (size_t)r * rb;
        sbr[0] = s1 ? s1 + (size_t)r * gw : nullptr;
        if (swiglu) {
            wr[1] = w2 + (size_t)r * rb;
            sbr[1] = s2 ? s2 + (size_t)r * gw : nullptr;
        } else {
            wr[1] = r + 1 < r1 ? w1 + (size_t)(r + 1) * rb : nullptr;
            sbr[1] = s1 && r + 1 < r1 ? s1 + (size_t)(r + 1) * gw : nullptr;
        }
        float acc[2];
        rows_dot<DT, 32, 2>(wr, sbr, (const float4 *)xs, xsum, nchunk, lane, acc);
        const float v0 = warp_sum(acc[0]), v1 = warp_sum(acc[1]);
        const int nr = lane != 0 ? 0 : swiglu || r + 1 >= r1 ? 1 : 2;
        for (int i = 0; i < nr; i++) {
            const int row = r + i;
            const float v = i ? v1 : v0;
            switch (sg.epi) {
            case EPI_STORE: sg.y[row] = v; break;
            case EPI_ADD: sg.y[row] = __ldcg(sg.y + row) + v; break;
            case EPI_SWIGLU: sg.y[row] = silu_f(v0) * v1; break;
            default: { /* EPI_CONV: causal conv over the state's K-1 inputs and v, then SiLU */
                float *cs = st.conv[op.layer];
                const int K = cf.K, C = sg.m.rows;
                const float *w = sg.conv_w + (size_t)row * K;
                float s = __ldg(w + K - 1) * v;
                for (int k = 0; k < K - 1; k++)
                    s = fmaf(__ldcg(cs + (size_t)k * C + row), __ldg(w + k), s);
                for (int k = 0; k + 1 < K - 1; k++)
                    cs[(size_t)k * C + row] = __ldcg(cs + (size_t)(k + 1) * C + row);
                cs[(size_t)(K - 2) * C + row] = v;
                sg.y[row] = silu_f(s);
            }
            }
            if (sg.key) {
                unsigned long long k = mg_argmax_key(v, row);
                best = k > best ? k : best;
            }
        }
    }
    if (sg.key) {
        best = block_max_key(best, red8);
        if (threadIdx.x == 0) sg.key[t] = best;
    }
}

__device__ void run_gemv(const mg_op &op, int tile, const mg_cfg &cf, const lily_mega_state &st,
                         float *smem, float *red, unsigned long long *red8) {
    int s = op.nseg - 1;
    while (s > 0 && tile < op.seg[s].tile0)
        s--;
    const mg_seg &sg = op.seg[s];
    const int t = tile - sg.tile0;
    switch (sg.m.dt) {
    case LILY_CW_Q4: gemv_tile<LILY_CW_Q4>(op, sg, t, cf, st, smem, red, red8); break;
    case LILY_CW_Q8: gemv_tile<LILY_CW_Q8>(op, sg, t, cf, st, smem, red, red8); break;
    default: gemv_tile<LILY_CW_BF16>(op, sg, t, cf, st, smem, red, red8);
    }
}

/* One row's dot product with a slot's input (built by build_x) for weight type DT; lane partial. */
template <int DT>
__device__ float slot_dot(const uint8_t *w, const uint32_t *sb, const float *xs, const float *xsum,
                          int cols) {
    const uint8_t *wr[1] = {w};
    const uint32_t *sbr[1] = {sb};
    float acc[1];
    rows_dot<DT, 32, 1>(wr, sbr, (const float4 *)xs, xsum, cols / wtype<DT>::epc, threadIdx.x & 31,
                        acc);
    return acc[0];
}

__device__ void build_any(int dt, const float *src, int cols, float *xs, float *xsum, float *red) {
    switch (dt) {
    case LILY_CW_Q4: build_x<LILY_CW_Q4>(src, cols, PRO_COPY, nullptr, 0.f, xs, xsum, red); break;
    case LILY_CW_Q8: build_x<LILY_CW_Q8>(src, cols, PRO_COPY, nullptr, 0.f, xs, xsum, red); break;
    default: build_x<LILY_CW_BF16>(src, cols, PRO_COPY, nullptr, 0.f, xs, xsum, red);
    }
}

/* x[r] += sum over routed slots wt * down_e[r] . act_s + coef * shared_down[r] . act_sh */
__device__ void run_down(const mg_op &op, int tile, const mg_cfg &cf, float *smem, float *red) {
    __shared__ const uint8_t *s_w[kMaxSeg];
    __shared__ const uint32_t *s_sb[kMaxSeg];
    __shared__ float s_coef[kMaxSeg];
    __shared__ int s_off[kMaxSeg], s_cols[kMaxSeg], s_dt[kMaxSeg];
    const int nrt = op.iv[0], nsl = nrt + (op.dm[1].w ? 1 : 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0;
        for (int s = 0; s < nsl; s++) {
            const mg_mat &m = s < nrt ? op.dm[0] : op.dm[1];
            size_t ex = s < nrt ? (size_t)__ldcg(cf.ridx + s) : 0;
            s_w[s] = m.w + ex * m.w_stride;
            s_sb[s] = m.sb ? m.sb + ex * m.sb_stride : nullptr;
            s_coef[s] = s < nrt ? __ldcg(cf.rwt + s) : op.iv[1] ? sigmoid_f(__ldcg(cf.sg)) : 1.f;
            s_off[s] = off;
            s_cols[s] = m.cols;
            s_dt[s] = m.dt;
            off += m.cols + m.cols / 8 + 4;
        }
    }
    __syncthreads();
    const int r0 = tile * op.rpt, r1 = min(cf.H, r0 + op.rpt);
    for (int s = 0; s < nrt; s++) { /* the routed experts' rows (the shared one's: earlier) */
        const size_t rb = dmat_row_bytes(s_dt[s], s_cols[s]);
        prefetch_l2(s_w[s] + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    }
    for (int s = 0; s < nsl; s++) {
        const float *src = s < nrt ? cf.act + (size_t)s * cf.I : cf.act + (size_t)nrt * cf.I;
        build_any(s_dt[s], src, s_cols[s], smem + s_off[s], smem + s_off[s] + s_cols[s], red);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = r0 + warp; r < r1; r += kWarps) {
        float total = 0.f;
        for (int s = 0; s < nsl; s++) {
            const int cols = s_cols[s], dt = s_dt[s];
            const size_t rb = dmat_row_bytes(dt, cols);
            const uint8_t *w = s_w[s] + (size_t)r * rb;
            const uint32_t *sb = s_sb[s] ? s_sb[s] + (size_t)r * gpr_words(cols) : nullptr;
            const float *xs = smem + s_off[s], *xsum = xs + cols;
            float d = dt == LILY_CW_Q4   ? slot_dot<LILY_CW_Q4>(w, sb, xs, xsum, cols)
                      : dt == LILY_CW_Q8 ? slot_dot<LILY_CW_Q8>(w, sb, xs, xsum, cols)
                                         : slot_dot<LILY_CW_BF16>(w, sb, xs, xsum, cols);
            total = fmaf(s_coef[s], warp_sum(d), total);
        }
        if (lane == 0) cf.x[r] = __ldcg(cf.x + r) + total;
    }
}

__device__ void run_embed(const mg_cfg &cf) {
    const mg_mat &E = cf.embed;
    const size_t r = (size_t) * (volatile const int32_t *)cf.d_tok;
    const uint8_t *row = E.w + r * dmat_row_bytes(E.dt, E.cols);
    for (int c = threadIdx.x; c < E.cols; c += blockDim.x) {
        float v;
        if (E.dt == LILY_CW_BF16) {
            v = bf16f(((const uint16_t *)row)[c]);
        } else {
            uint32_t s = E.sb[r * (E.cols / 64) + c / 64];
            uint32_t q = E.dt == LILY_CW_Q4 ? (row[c >> 1] >> ((c & 1) * 4)) & 15u : row[c];
            v = fmaf(lo_bf16(s), (float)q, hi_bf16(s));
        }
        cf.x[c] = v;
    }
}

/* Value head j of layer op.layer: the delta rule over S_j, then o_j = rmsnorm(o_j) w silu(z_j). */
__device__ void run_gdn(const mg_op &op, int j, const mg_cfg &cf, const lily_mega_state &st,
                        float *smem, float *red) {
    const int Dk = cf.Dk, Dv = cf.Dv, Nk = cf.Nk, Nv = cf.Nv, t = threadIdx.x;
    const int i = j / (Nv / Nk);
    float *sq = smem, *sk = sq + Dk, *sv = sk + Dk, *so = sv + Dv;
    float qv = t < Dk ? __ldcg(cf.cv + (size_t)i * Dk + t) : 0.f;
    float kv = t < Dk ? __ldcg(cf.cv + (size_t)Nk * Dk + (size_t)i * Dk + t) : 0.f;
    const float qs = block_sum(qv * qv, red);
    const float ks = block_sum(kv * kv, red);
    const float qr = (1.0f / sqrtf((float)Dk)) / sqrtf(qs + 1e-6f), kr = 1.0f / sqrtf(ks + 1e-6f);
    if (t < Dk) sq[t] = qv * qr, sk[t] = kv * kr;
    if (t < Dv) sv[t] = __ldcg(cf.cv + 2 * (size_t)Nk * Dk + (size_t)j * Dv + t);
    const float bb = __ldcg(cf.ba + j), aa = __ldcg(cf.ba + Nv + j);
    const float negA = -expf(__ldg(op.f[0] + j)), xa = aa + __ldg(op.f[1] + j);
    const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
    const float lam = expf(negA * sp), beta = sigmoid_f(bb);
    __syncthreads();
    const int tpc = blockDim.x / Dv; /* threads per value column: a power of two, adjacent lanes */
    const int v = t / tpc, part = t % tpc, kper = Dk / tpc;
    float *Sj = st.S[op.layer] + (size_t)j * (Dv / 8) * Dk * 8;
    float *col = Sj + (size_t)(v / 8) * Dk * 8 + v % 8;
    float m = 0.f;
    for (int k = part * kper; k < (part + 1) * kper; k++)
        m = fmaf(col[(size_t)k * 8], sk[k], m);
    for (int o = tpc / 2; o > 0; o >>= 1)
        m += __shfl_xor_sync(0xffffffffu, m, o);
    m *= lam;
    const float d = beta * (sv[v] - m);
    float acc = 0.f;
    for (int k = part * kper; k < (part + 1) * kper; k++) {
        float s = fmaf(sk[k], d, lam * col[(size_t)k * 8]);
        col[(size_t)k * 8] = s;
        acc = fmaf(s, sq[k], acc);
    }
    for (int o = tpc / 2; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (part == 0) so[v] = acc;
    __syncthreads();
    const float ov = t < Dv ? so[t] : 0.f;
    const float ss = block_sum(ov * ov, red);
    const float r = 1.0f / sqrtf(ss / (float)Dv + cf.eps);
    if (t < Dv) {
        const size_t o = (size_t)j * Dv + t;
        cf.og[o] = ov * r * __ldg(op.f[2] + t) * silu_f(__ldcg(cf.z + o));
    }
}

/* Normalises x (thread t < Dh holds element t) with w and rotates its first R dims. */
__device__ float norm_rope(float x, const float *w, int pos, const mg_cfg &cf, float *xs,
                           float *red) {
    const int t = threadIdx.x, Dh = cf.Dh, R = cf.R, half = R / 2;
    const float ss = block_sum(x * x, red);
    x = t < Dh ? x * (1.0f / sqrtf(ss / (float)Dh + cf.eps)) * __ldg(w + t) : 0.f;
    __syncthreads();
    if (t < Dh) xs[t] = x;
    __syncthreads();
    if (t < R) {
        const int i = t < half ? t : t - half;
        const float ang = (float)pos * __ldg(cf.inv_freq + i);
        const float c = cosf(ang), s = sinf(ang);
        x = t < half ? xs[t] * c - xs[t + half] * s : xs[t] * c + xs[t - half] * s;
    }
    return x;
}

__device__ void run_prep(const mg_op &op, int j, const mg_cfg &cf, const lily_mega_state &st,
                         float *smem, float *red) {
    const int t = threadIdx.x, Dh = cf.Dh, G = cf.Nq / cf.Nkv;
    const int pos = *(volatile const int32_t *)cf.d_pos;
    for (int g = 0; g < G; g++) {
        const int h = j * G + g;
        const float *src = cf.qg + (size_t)h * Dh * (cf.gated ? 2 : 1);
        float x = t < Dh ? __ldcg(src + t) : 0.f;
        x = norm_rope(x, op.f[0], pos, cf, smem, red);
        if (t < Dh) {
            cf.q[(size_t)h * Dh + t] = x;
            if (cf.gated) cf.gate[(size_t)h * Dh + t] = __ldcg(src + Dh + t);
        }
    }
    const int kvw = cf.Nkv * Dh;
    float x = t < Dh ? __ldcg(cf.kvn + (size_t)j * Dh + t) : 0.f;
    x = norm_rope(x, op.f[1], pos, cf, smem, red);
    const float vx = t < Dh ? __ldcg(cf.kvn + kvw + (size_t)j * Dh + t) : 0.f;
    const float cm = (float)kKvCodeMax;
    const float ks = block_max_abs(t < Dh ? fabsf(x) : 0.f, red) / cm;
    const float vs = block_max_abs(t < Dh ? fabsf(vx) : 0.f, red) / cm;
    uint8_t *kc = (uint8_t *)st.k[op.layer], *vc = (uint8_t *)st.v[op.layer];
    const size_t rb = kv_row_bytes(cf.Nkv, Dh) * (size_t)pos;
    const size_t so = (size_t)cf.Nkv * Dh * 2 + (size_t)j * 4;
    if (t < Dh) {
        ((uint16_t *)(kc + rb))[(size_t)j * Dh + t] = mg_kv_code(x, ks);
        ((uint16_t *)(vc + rb))[(size_t)j * Dh + t] = mg_kv_code(vx, vs);
    }
    if (t == 0) *(float *)(kc + rb + so) = ks, *(float *)(vc + rb + so) = vs;
}

/* Tile (split s, KV head group y) of the decode attention: the per-op kernel's body
 * (attn_dec.cuh) on warps 0..kDw-1, reading what this launch wrote coherently. */
template <int DH>
__device__ void attn_split_tile(const mg_op &op, int tile, const mg_cfg &cf,
                                const lily_mega_state &st, float *smem) {
    const uint8_t *kc = (const uint8_t *)st.k[op.layer], *vc = (const uint8_t *)st.v[op.layer];
    const int G = cf.Nq / cf.Nkv, s = tile % cf.ms, y = tile / cf.ms;
    if (cf.exact)
        attn_decode_body<DH, true, true>(cf.q, kc, vc, cf.d_pos, cf.Nkv, G, cf.qscale, cf.ms, cf.ms,
                                         cf.part, s, y, (uint16_t *)smem);
    else
        attn_decode_body<DH, false, true>(cf.q, kc, vc, cf.d_pos, cf.Nkv, G, cf.qscale, cf.ms,
                                          cf.ms, cf.part, s, y, (uint16_t *)smem);
}

/* The other warps skip the body (its barriers are over warps 0..kDw-1) and wait at the tile's end
 * barrier. */
__device__ void run_split(const mg_op &op, int tile, const mg_cfg &cf, const lily_mega_state &st,
                          float *smem) {
    if (threadIdx.x >= kDw * 32) return;
    switch (cf.Dh) {
    case 64: attn_split_tile<64>(op, tile, cf, st, smem); break;
    case 128: attn_split_tile<128>(op, tile, cf, st, smem); break;
    default: attn_split_tile<256>(op, tile, cf, st, smem);
    }
}

/* Tile (query head, 32 columns) of the merge: the per-op combine's body (all 256 threads), its
 * output times sigmoid(gate) when the model gates, into ao. */
static_assert(kThreads == 256, "attn_combine_body takes a block of 256 threads");
__device__ void run_merge(int tile, const mg_cfg &cf, float *smem) {
    const int nb = cf.Dh / 32;
    attn_combine_body<true>(cf.part, cf.d_pos, cf.Nq, cf.Dh, cf.ms, cf.ms,
                            cf.gated ? cf.gate : nullptr, cf.ao, tile / nb, tile % nb, smem);
}

__device__ void run_topk(const mg_cfg &cf, float *smem) {
    __shared__ int s_idx[kMaxK];
    __shared__ float s_wt[kMaxK];
    float *lg = smem, *sl = smem + cf.E;
    for (int e = threadIdx.x; e < cf.E; e += blockDim.x)
        lg[e] = __ldcg(cf.rl + e);
    __syncthreads();
    if (threadIdx.x < 32) {
        topk_warp(lg, cf.E, cf.topk, cf.normk, sl, s_idx, s_wt);
        if (threadIdx.x == 0)
            for (int s = 0; s < cf.topk; s++)
                cf.ridx[s] = s_idx[s], cf.rwt[s] = s_wt[s];
    }
}

__device__ void run_argmax(const mg_cfg &cf, unsigned long long *red8) {
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < cf.nkeys; i += blockDim.x) {
        unsigned long long k = __ldcg(cf.keys + i);
        best = k > best ? k : best;
    }
    best = block_max_key(best, red8);
    if (threadIdx.x == 0) {
        cf.d_argmax[0] = (int32_t)(0xffffffffu - (uint32_t)(best & 0xffffffffu));
        *(unsigned long long *)(cf.d_argmax + 2) = best;
    }
}

/* Prefetches the fixed weights of tile `tile` of op into L2. */
__device__ void prefetch_tile(const mg_op &op, int tile) {
    if (op.kind == MG_GEMV) {
        int s = op.nseg - 1;
        while (s > 0 && tile < op.seg[s].tile0)
            s--;
        const mg_seg &sg = op.seg[s];
        if (sg.slot >= 0) return; /* an expert: known after top-k */
        const int t = tile - sg.tile0, r0 = t * sg.rpt, r1 = min(sg.m.rows, r0 + sg.rpt);
        const size_t rb = dmat_row_bytes(sg.m.dt, sg.m.cols);
        prefetch_l2(sg.m.w + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
        if (sg.epi == EPI_SWIGLU) prefetch_l2(sg.m2.w + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    } else if (op.kind == MG_DOWN && op.dm[1].w) {
        const mg_mat &m = op.dm[1];
        const int r0 = tile * op.rpt, r1 = min(m.rows, r0 + op.rpt);
        const size_t rb = dmat_row_bytes(m.dt, m.cols);
        prefetch_l2(m.w + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    }
}

/* Thread 0 waits until every dependency of op has finished this epoch's tiles; false when the
 * step is abandoned (timeout here or elsewhere). */
__device__ bool wait_deps(const mg_op &op, const mg_op *ops, const unsigned *cnt, unsigned ep,
                          int *err, int *err_host, long long tmo, int *s_abort) {
    if (threadIdx.x == 0) {
        for (int d = 0; d < op.ndeps && !*s_abort; d++) {
            const int o = op.deps[d];
            const unsigned target = ep * (unsigned)ops[o].ntiles;
            long long t0 = -1;
            unsigned ns = 32;
            while ((int)(ld_acquire(cnt + o) - target) < 0) {
                if (*(volatile int *)err) {
                    *s_abort = 1;
                    break;
                }
                const long long now = gtimer();
                if (t0 < 0) {
                    t0 = now;
                } else if (now - t0 > tmo) {
                    atomicCAS(err, 0, 1 + o);
                    *(volatile int *)err_host = 1 + o; /* host-mapped: a plain store */
                    *s_abort = 1;
                    break;
                }
                __nanosleep(ns);
                ns = ns < 256 ? 2 * ns : ns;
            }
        }
        __threadfence();
    }
    __syncthreads();
    return !*s_abort;
}

__global__ void __launch_bounds__(kThreads, 1)
    mega_kernel(const mg_op *ops, const int2 *items, const int *offs, unsigned *cnt, unsigned *sync,
                int *err, int *err_host, long long tmo, const mg_cfg cf, const lily_mega_state st) {
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    __shared__ float red[32];
    __shared__ unsigned long long red8[kWarps];
    __shared__ int s_abort;
    __shared__ unsigned s_epoch;
    if (threadIdx.x == 0) {
        s_abort = *(volatile int *)err != 0;
        s_epoch = ld_acquire(sync);
    }
    __syncthreads();
    if (s_abort) return;
    const unsigned ep = s_epoch + 1u;
    const int i0 = offs[blockIdx.x], i1 = offs[blockIdx.x + 1];
    if (i0 < i1) prefetch_tile(ops[items[i0].x], items[i0].y);
    for (int i = i0; i < i1; i++) {
        const int2 it = items[i];
        const mg_op &op = ops[it.x];
        if (i + 1 < i1) prefetch_tile(ops[items[i + 1].x], items[i + 1].y);
        if (!wait_deps(op, ops, cnt, ep, err, err_host, tmo, &s_abort)) return;
        switch (op.kind) {
        case MG_EMBED: run_embed(cf); break;
        case MG_GEMV: run_gemv(op, it.y, cf, st, smem, red, red8); break;
        case MG_GDN_REC: run_gdn(op, it.y, cf, st, smem, red); break;
        case MG_ATTN_PREP: run_prep(op, it.y, cf, st, smem, red); break;
        case MG_ATTN_SPLIT: run_split(op, it.y, cf, st, smem); break;
        case MG_ATTN_MERGE: run_merge(it.y, cf, smem); break;
        case MG_TOPK: run_topk(cf, smem); break;
        case MG_DOWN: run_down(op, it.y, cf, smem, red); break;
        default: run_argmax(cf, red8);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(cnt + it.x, 1u); /* release: the tile's writes are visible first */
        }
    }
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(sync + 1, 1u) == ep * gridDim.x - 1u) atomicExch(sync, ep);
    }
}

} // namespace

/* ---- host ---------------------------------------------------------------------------------- */

struct lily_mega {
    mg_cfg cf;
    mg_op *ops_h;
    int n_ops, n_tiles, grid;
    size_t smem;
    long long timeout_ns;
    void *dev; /* ops, items, offsets, counters, sync words */
    mg_op *ops;
    int2 *items;
    int *offs;
    unsigned *cnt, *sync;
    int *err; /* device: the kernel's error flag (the op that timed out, plus 1) */
    float *scratch;
    int *err_h, *err_d; /* its host-mapped copy (host and device addresses) */
};

namespace {

mg_mat dmat(const lily_dmat *d) {
    mg_mat m = {};
    if (!d || !d->w) return m;
    m.w = d->w, m.sb = d->sb, m.dt = d->dt, m.rows = d->rows, m.cols = d->cols;
    m.w_stride = d->w_stride, m.sb_stride = d->sb_stride;
    return m;
}

struct builder {
    mg_op *ops;
    int n, cap, grid;
    size_t smem; /* floats */
};

mg_op *add_op(builder *b, int kind, int layer, int ntiles, int d0, int d1, int d2) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 128;
        b->ops = (mg_op *)realloc(b->ops, (size_t)b->cap * sizeof(mg_op));
        if (!b->ops) abort();
    }
    mg_op *op = &b->ops[b->n++];
    memset(op, 0, sizeof *op);
    op->kind = kind, op->layer = layer, op->ntiles = ntiles;
    const int d[3] = {d0, d1, d2};
    for (int i = 0; i < 3; i++)
        if (d[i] >= 0) op->deps[op->ndeps++] = d[i];
    return op;
}

int roundup(int v, int m) {
    return (v + m - 1) / m * m;
}

/* A GEMV op over xin [cols]; segments follow with add_seg. */
mg_op *gemv_op(builder *b, int layer, int pro, const float *xin, const float *nw, int cols,
               int dep0, int dep1) {
    mg_op *op = add_op(b, MG_GEMV, layer, 0, dep0, dep1, -1);
    op->pro = pro, op->xin = xin, op->norm_w = nw, op->cols = cols;
    size_t need = (size_t)cols + cols / 8 + 4;
    b->smem = need > b->smem ? need : b->smem;
    return op;
}

/* rows per tile: about one tile per block for the op's total rows */
void add_seg(mg_op *op, mg_mat m, mg_mat m2, float *y, int epi, int slot, const float *conv_w,
             int rpt, unsigned long long *key) {
    LILY_ASSERT(op->nseg < kMaxSeg);
    mg_seg *s = &op->seg[op->nseg++];
    s->m = m, s->m2 = m2, s->y = y, s->epi = epi, s->slot = slot, s->conv_w = conv_w;
    s->rpt = rpt, s->key = key, s->tile0 = op->ntiles;
    op->ntiles += (m.rows + rpt - 1) / rpt;
}

int rows_per_tile(int total_rows, int grid, int seg_rows) {
    int r = roundup((total_rows + grid - 1) / grid, 16);
    int cap = roundup(seg_rows, 16);
    return r < cap ? r : cap;
}

/* Shared memory of the decode attention's body at head dim Dh (one of check_shapes'). */
size_t dec_smem_bytes(int Dh) {
    return Dh == 64 ? dec2_cfg<64>::smem : Dh == 128 ? dec2_cfg<128>::smem : dec2_cfg<256>::smem;
}

/* Split tiles per KV head group of the decode attention: as many as fill the grid (one block
 * per SM is resident), as the per-op launch picks them (attn.cu), at most kMaxSplits. */
int attn_splits(const lily_config *c, int grid) {
    if (c->n_kv_heads < 1) return 1;
    const int groups = c->n_kv_heads * ((c->n_q_heads / c->n_kv_heads + 7) / 8);
    const int ms = grid / groups;
    return ms < 1 ? 1 : ms > kMaxSplits ? kMaxSplits : ms;
}

int check_shapes(const lily_mega_model *mm, lily_err *e) {
    const lily_config *c = &mm->m->cfg;
    if (c->n_layers > LILY_MEGA_MAX_LAYERS)
        return lily_fail(e, "mega: %d layers (at most %d)", c->n_layers, LILY_MEGA_MAX_LAYERS);
    int has_gdn = 0, has_attn = 0;
    for (int l = 0; l < c->n_layers; l++)
        (c->layer_is_attn[l] ? has_attn : has_gdn) = 1;
    if (has_gdn) {
        const int Dv = c->lin_dv;
        if (c->lin_dk > kThreads || c->lin_dk % 8 || Dv < 8 || Dv > kThreads || (Dv & (Dv - 1)) ||
            c->lin_dk % (kThreads / Dv))
            return lily_fail(e, "mega: GDN head dims Dk=%d Dv=%d unsupported", c->lin_dk, Dv);
    }
    /* the head dims the decode body is instantiated for (attn.cu's) */
    if (has_attn && ((c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256) ||
                     c->n_kv_heads < 1 || c->n_q_heads % c->n_kv_heads))
        return lily_fail(e, "mega: attention shape Nq=%d Nkv=%d Dh=%d unsupported", c->n_q_heads,
                         c->n_kv_heads, c->head_dim);
    if (c->is_moe && (c->top_k < 1 || c->top_k > kMaxK || c->n_experts > 1024))
        return lily_fail(e, "mega: top-%d of %d experts unsupported", c->top_k, c->n_experts);
    for (int l = 0; l < c->n_layers && c->is_moe; l++) { /* the shapes the MoE kernels take */
        const lily_mega_layer *L = &mm->L[l];
        lily_cuda_moe mo = {};
        mo.E = c->n_experts, mo.k = c->top_k, mo.norm = c->norm_topk_prob;
        mo.router = L->router, mo.gate = L->gate, mo.up = L->up, mo.down = L->down;
        mo.sh_gate = L->sh_gate, mo.sh_up = L->sh_up, mo.sh_down = L->sh_down;
        mo.sh_gate_w = L->sh_gw;
        if (check_moe(&mo, e)) return lily_fail_prefix(e, "mega: layer %d", l);
    }
    return 0;
}

/* Scratch floats (the buffers of mg_cfg, each rounded to 4 floats) and the lm_head's rows per
 * tile. */
struct layout {
    size_t cv, z, ba, og, qg, kvn, q, gate, ao, part, rl, rwt, act, sg, ridx, keys, total;
};

size_t take(size_t *at, size_t n) {
    size_t o = *at;
    *at += (n + 3) & ~(size_t)3;
    return o;
}

layout plan(const lily_config *c, int nkeys, int ms) {
    layout L = {};
    size_t at = 0;
    const size_t C = 2 * (size_t)c->lin_nk * c->lin_dk + (size_t)c->lin_nv * c->lin_dv;
    const size_t Zw = (size_t)c->lin_nv * c->lin_dv, qd = (size_t)c->n_q_heads * c->head_dim;
    const size_t qw = qd * (c->attn_output_gate ? 2 : 1), kvw = (size_t)c->n_kv_heads * c->head_dim;
    const int k = c->is_moe ? c->top_k : 0;
    const int sh = c->is_moe ? c->shared_inter : c->intermediate;
    L.cv = take(&at, C + 1);
    L.z = take(&at, Zw + 1);
    L.ba = take(&at, 2 * (size_t)c->lin_nv + 1);
    L.og = take(&at, Zw + 1);
    L.qg = take(&at, qw + 1);
    L.kvn = take(&at, 2 * kvw + 1);
    L.q = take(&at, qd + 1);
    L.gate = take(&at, qd + 1);
    L.ao = take(&at, qd + 1);
    L.part = take(&at, (size_t)ms * c->n_q_heads * (c->head_dim + 2) + 1);
    L.rl = take(&at, (size_t)c->n_experts + 1);
    L.rwt = take(&at, (size_t)k + 1);
    L.act = take(&at, (size_t)k * c->moe_inter + (size_t)(sh > 0 ? sh : 0) + 1);
    L.sg = take(&at, 1);
    L.ridx = take(&at, (size_t)k + 1);
    L.keys = take(&at, 2 * (size_t)nkeys + 2); /* u64 words, 8-byte aligned (4-float steps) */
    L.total = at;
    return L;
}

/* The instruction list from the step program (program.h), its ops fused as mega.h says. */
int build_ops(const lily_mega_model *mm, builder *b, const mg_cfg *cf, int lm_rpt, lily_err *e) {
    const lily_model *m = mm->m;
    const lily_config *c = &m->cfg;
    const int H = c->hidden, G = b->grid, k = c->is_moe ? c->top_k : 0;
    const mg_mat none = {};
    lily_program prog;
    lily_program_build(m, &prog);
    int x_w = -1, prev = -1, rt = -1, tk = -1, ex = -1, sh = -1;
    int rc = 0;
    for (int i = 0; i < prog.n_ops && !rc; i++) {
        const lily_op *po = &prog.ops[i];
        const int l = po->layer;
        const lily_mega_layer *L = l >= 0 ? &mm->L[l] : nullptr;
        mg_op *op;
        switch (po->kind) {
        case LILY_OP_EMBED:
            add_op(b, MG_EMBED, -1, 1, -1, -1, -1);
            prev = x_w = b->n - 1;
            break;
        case LILY_OP_ATTN_PROJ: {
            const int kvw = c->n_kv_heads * c->head_dim;
            const int tot = L->q->rows + 2 * kvw;
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->in_norm, H, x_w, -1);
            add_seg(op, dmat(L->q), none, cf->qg, EPI_STORE, -1, nullptr,
                    rows_per_tile(tot, G, L->q->rows), nullptr);
            add_seg(op, dmat(L->k), none, cf->kvn, EPI_STORE, -1, nullptr,
                    rows_per_tile(tot, G, kvw), nullptr);
            add_seg(op, dmat(L->v), none, cf->kvn + kvw, EPI_STORE, -1, nullptr,
                    rows_per_tile(tot, G, kvw), nullptr);
            prev = b->n - 1;
            break;
        }
        case LILY_OP_ATTN_QK:
            op = add_op(b, MG_ATTN_PREP, l, c->n_kv_heads, prev, -1, -1);
            op->f[0] = L->q_norm, op->f[1] = L->k_norm;
            b->smem = b->smem > (size_t)c->head_dim ? b->smem : (size_t)c->head_dim;
            prev = b->n - 1;
            break;
        case LILY_OP_ATTN_CORE: {
            const int MT = (c->n_q_heads / c->n_kv_heads + 7) / 8;
            add_op(b, MG_ATTN_SPLIT, l, cf->ms * c->n_kv_heads * MT, prev, -1, -1);
            /* the body's Q tile and stages; the merge's split factors (fewer) */
            const size_t need = dec_smem_bytes(c->head_dim) / 4;
            b->smem = b->smem > need ? b->smem : need;
            add_op(b, MG_ATTN_MERGE, l, c->n_q_heads * (c->head_dim / 32), b->n - 1, -1, -1);
            prev = b->n - 1;
            break;
        }
        case LILY_OP_ATTN_OUT:
            op = gemv_op(b, l, PRO_COPY, cf->ao, nullptr, L->o->cols, prev, -1);
            add_seg(op, dmat(L->o), none, cf->x, EPI_ADD, -1, nullptr, rows_per_tile(H, G, H),
                    nullptr);
            prev = x_w = b->n - 1;
            break;
        case LILY_OP_GDN_PROJ: {
            const int Nv = c->lin_nv;
            const int tot = L->qkv->rows + L->z->rows + 2 * Nv;
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->in_norm, H, x_w, -1);
            add_seg(op, dmat(L->qkv), none, cf->cv, EPI_CONV, -1, L->conv_w,
                    rows_per_tile(tot, G, L->qkv->rows), nullptr);
            add_seg(op, dmat(L->z), none, cf->z, EPI_STORE, -1, nullptr,
                    rows_per_tile(tot, G, L->z->rows), nullptr);
            add_seg(op, dmat(L->b), none, cf->ba, EPI_STORE, -1, nullptr, roundup(Nv, 16), nullptr);
            add_seg(op, dmat(L->a), none, cf->ba + Nv, EPI_STORE, -1, nullptr, roundup(Nv, 16),
                    nullptr);
            prev = b->n - 1;
            break;
        }
        case LILY_OP_GDN_RECUR: {
            op = add_op(b, MG_GDN_REC, l, c->lin_nv, prev, -1, -1);
            op->f[0] = L->A_log, op->f[1] = L->dt_bias, op->f[2] = L->gdn_norm;
            const size_t need = 2 * (size_t)c->lin_dk + 2 * (size_t)c->lin_dv;
            b->smem = b->smem > need ? b->smem : need;
            prev = b->n - 1;
            break;
        }
        case LILY_OP_GDN_OUT:
            op = gemv_op(b, l, PRO_COPY, cf->og, nullptr, L->out->cols, prev, -1);
            add_seg(op, dmat(L->out), none, cf->x, EPI_ADD, -1, nullptr, rows_per_tile(H, G, H),
                    nullptr);
            prev = x_w = b->n - 1;
            break;
        case LILY_OP_ROUTER:
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->post_norm, H, x_w, -1);
            add_seg(op, dmat(L->router), none, cf->rl, EPI_STORE, -1, nullptr,
                    rows_per_tile(L->router->rows, G, L->router->rows), nullptr);
            prev = rt = b->n - 1;
            break;
        case LILY_OP_TOPK: {
            add_op(b, MG_TOPK, l, 1, rt, -1, -1);
            const size_t need = 2 * (size_t)c->n_experts;
            b->smem = b->smem > need ? b->smem : need;
            prev = tk = b->n - 1;
            break;
        }
        case LILY_OP_EXPERTS: {
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->post_norm, H, tk, -1);
            const int I = L->gate->rows;
            for (int s = 0; s < k; s++)
                add_seg(op, dmat(L->gate), dmat(L->up), cf->act + (size_t)s * I, EPI_SWIGLU, s,
                        nullptr, rows_per_tile(k * I, G, I), nullptr);
            prev = ex = b->n - 1;
            break;
        }
        case LILY_OP_SHARED:
            sh = -1;
            if (!L->sh_gate || !L->sh_gate->w) break;
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->post_norm, H, x_w, -1);
            add_seg(op, dmat(L->sh_gate), dmat(L->sh_up), cf->act + (size_t)k * c->moe_inter,
                    EPI_SWIGLU, -1, nullptr, rows_per_tile(L->sh_gate->rows, G, L->sh_gate->rows),
                    nullptr);
            if (L->sh_gw && L->sh_gw->w)
                add_seg(op, dmat(L->sh_gw), none, cf->sg, EPI_STORE, -1, nullptr, 16, nullptr);
            sh = b->n - 1;
            break;
        case LILY_OP_MLP:
            ex = tk = -1;
            op = gemv_op(b, l, PRO_RMSNORM, cf->x, L->post_norm, H, x_w, -1);
            add_seg(op, dmat(L->sh_gate), dmat(L->sh_up), cf->act, EPI_SWIGLU, -1, nullptr,
                    rows_per_tile(L->sh_gate->rows, G, L->sh_gate->rows), nullptr);
            sh = b->n - 1;
            /* the dense MLP's down projection is the combine of no experts */
            [[fallthrough]];
        case LILY_OP_COMBINE: {
            const int rpt = rows_per_tile(H, G, H);
            op = add_op(b, MG_DOWN, l, (H + rpt - 1) / rpt, ex, sh, tk);
            const int dense = po->kind == LILY_OP_MLP;
            op->rpt = rpt;
            op->iv[0] = dense ? 0 : k;
            op->iv[1] = !dense && L->sh_gw && L->sh_gw->w;
            if (!dense) op->dm[0] = dmat(L->down);
            op->dm[1] = dmat(L->sh_down);
            size_t need = 0;
            for (int s = 0; s < op->iv[0] + (op->dm[1].w ? 1 : 0); s++) {
                const int cols = s < op->iv[0] ? op->dm[0].cols : op->dm[1].cols;
                need += (size_t)cols + cols / 8 + 4;
            }
            b->smem = b->smem > need ? b->smem : need;
            prev = x_w = b->n - 1;
            ex = sh = tk = rt = -1;
            break;
        }
        case LILY_OP_LM_HEAD:
            op = gemv_op(b, -1, PRO_RMSNORM, cf->x, mm->final_norm, H, x_w, -1);
            add_seg(op, dmat(mm->lm_head), none, mm->logits, EPI_STORE, -1, nullptr, lm_rpt,
                    cf->keys);
            add_op(b, MG_ARGMAX, -1, 1, b->n - 1, -1, -1);
            prev = b->n - 1;
            break;
        default: /* fused into a neighbour: norms, residual adds, conv, output gates */ break;
        }
    }
    (void)prev;
    lily_program_free(&prog);
    if (b->n == 0 || b->ops[b->n - 1].kind != MG_ARGMAX)
        rc = lily_fail(e, "mega: the step program does not end in lm_head");
    for (int i = 0; i < b->n && !rc; i++)
        for (int s = 0; s < b->ops[i].nseg; s++) {
            const mg_seg &sg = b->ops[i].seg[s];
            if (!sg.m.w || (sg.epi == EPI_SWIGLU && (!sg.m2.w || sg.m2.dt != sg.m.dt)) ||
                sg.m.cols != (b->ops[i].kind == MG_GEMV ? b->ops[i].cols : sg.m.cols))
                rc =
                    lily_fail(e, "mega: op %d segment %d has no matrix or mismatched shapes", i, s);
        }
    return rc;
}

} // namespace

extern "C" void lily_cuda_mega_free(lily_mega *g) {
    if (!g) return;
    lily_cuda_free(g->dev);
    lily_cuda_free(g->scratch);
    if (g->err_h) cudaFreeHost(g->err_h);
    free(g->ops_h);
    free(g);
}

extern "C" int lily_cuda_mega_create(const lily_mega_model *mm, lily_mega **out, lily_err *e) {
    *out = nullptr;
    const lily_config *c = &mm->m->cfg;
    if (check_shapes(mm, e)) return -1;
    int dev = 0, nsm = 0, per_sm = 0;
    LILY_CU_TRY(cudaGetDevice(&dev), e);
    LILY_CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev), e);
    lily_mega *g = (lily_mega *)calloc(1, sizeof *g);
    if (!g) return lily_fail(e, "out of memory");
    g->timeout_ns = kDefaultTimeoutNs;
    g->grid = nsm;
    builder b = {nullptr, 0, 0, g->grid, 64};
    const int lm_rpt = rows_per_tile(mm->lm_head->rows, g->grid, mm->lm_head->rows);
    const int nkeys = (mm->lm_head->rows + lm_rpt - 1) / lm_rpt;
    const int ms = attn_splits(c, g->grid);
    const layout L = plan(c, nkeys, ms);
    int rc = -1;
    do {
        if (!(g->scratch = (float *)lily_cuda_alloc(L.total * 4, e))) break;
        if (lily_cuda_memset(g->scratch, 0, L.total * 4, nullptr, e)) break;
        mg_cfg &cf = g->cf;
        float *S = g->scratch;
        cf.H = c->hidden, cf.Nk = c->lin_nk, cf.Nv = c->lin_nv, cf.Dk = c->lin_dk;
        cf.Dv = c->lin_dv, cf.C = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
        cf.Zw = c->lin_nv * c->lin_dv, cf.K = c->conv_k, cf.Nq = c->n_q_heads;
        cf.Nkv = c->n_kv_heads, cf.Dh = c->head_dim, cf.R = c->rope_dim;
        cf.gated = c->attn_output_gate, cf.E = c->n_experts, cf.topk = c->is_moe ? c->top_k : 0;
        cf.normk = c->norm_topk_prob, cf.I = c->moe_inter, cf.Is = c->shared_inter;
        cf.nkeys = nkeys, cf.eps = c->rms_eps;
        cf.ms = ms, cf.exact = 1;
        cf.qscale = 1.0f / sqrtf((float)c->head_dim) * kLog2e; /* as the per-op decode's */
        cf.d_tok = mm->d_tok, cf.d_pos = mm->d_pos, cf.d_argmax = mm->d_argmax, cf.x = mm->x;
        cf.inv_freq = mm->inv_freq, cf.embed = dmat(mm->embed);
        cf.cv = S + L.cv, cf.z = S + L.z, cf.ba = S + L.ba, cf.og = S + L.og, cf.qg = S + L.qg;
        cf.kvn = S + L.kvn, cf.q = S + L.q, cf.gate = S + L.gate, cf.ao = S + L.ao;
        cf.part = S + L.part, cf.rl = S + L.rl, cf.rwt = S + L.rwt, cf.act = S + L.act;
        cf.sg = S + L.sg, cf.ridx = (int *)(S + L.ridx);
        cf.keys = (unsigned long long *)(S + L.keys);
        if (build_ops(mm, &b, &cf, lm_rpt, e)) break;
        g->ops_h = b.ops, b.ops = nullptr;
        g->n_ops = b.n;
        g->smem = b.smem * 4;
        /* deal the tiles to the blocks in program order */
        int n = 0;
        for (int i = 0; i < g->n_ops; i++)
            n += g->ops_h[i].ntiles;
        g->n_tiles = n;
        int2 *items = (int2 *)malloc((size_t)n * sizeof(int2));
        int *offs = (int *)calloc((size_t)g->grid + 1, sizeof(int));
        int *fill = (int *)calloc((size_t)g->grid, sizeof(int));
        if (!items || !offs || !fill) {
            free(items), free(offs), free(fill);
            lily_fail(e, "out of memory");
            break;
        }
        for (int i = 0, t = 0; i < g->n_ops; i++)
            for (int j = 0; j < g->ops_h[i].ntiles; j++, t++)
                offs[t % g->grid + 1]++;
        for (int k = 0; k < g->grid; k++)
            offs[k + 1] += offs[k];
        for (int i = 0, t = 0; i < g->n_ops; i++)
            for (int j = 0; j < g->ops_h[i].ntiles; j++, t++) {
                const int blk = t % g->grid;
                items[offs[blk] + fill[blk]++] = make_int2(i, j);
            }
        const size_t ob = (size_t)g->n_ops * sizeof(mg_op), ib = (size_t)n * sizeof(int2);
        const size_t fb = ((size_t)g->grid + 1) * sizeof(int), cb = (size_t)g->n_ops * 4 + 12;
        const size_t o_items = (ob + 15) & ~(size_t)15, o_offs = (o_items + ib + 15) & ~(size_t)15;
        const size_t o_cnt = (o_offs + fb + 15) & ~(size_t)15;
        int bad = !(g->dev = lily_cuda_alloc(o_cnt + cb, e));
        if (!bad) {
            char *d = (char *)g->dev;
            g->ops = (mg_op *)d, g->items = (int2 *)(d + o_items), g->offs = (int *)(d + o_offs);
            g->cnt = (unsigned *)(d + o_cnt), g->sync = g->cnt + g->n_ops;
            g->err = (int *)(g->sync + 2);
            bad = lily_cuda_h2d(g->ops, g->ops_h, ob, e) || lily_cuda_h2d(g->items, items, ib, e) ||
                  lily_cuda_h2d(g->offs, offs, fb, e) ||
                  lily_cuda_memset(g->cnt, 0, cb, nullptr, e);
        }
        free(items), free(offs), free(fill);
        if (bad) break;
        if (cudaHostAlloc((void **)&g->err_h, 4, cudaHostAllocMapped) != cudaSuccess ||
            cudaHostGetDevicePointer((void **)&g->err_d, g->err_h, 0) != cudaSuccess) {
            lily_fail(e, "mega: mapped error flag: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        *g->err_h = 0;
        /* only ever raised: another instance's captured step may need more */
        if (g->smem > 48 * 1024 && smem_at_least(mega_kernel, g->smem) != cudaSuccess) {
            lily_fail(e, "mega: %zu bytes of shared memory", g->smem);
            break;
        }
        /* every block must be resident at once (the waits assume it) */
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mega_kernel, kThreads,
                                                          g->smem) != cudaSuccess ||
            per_sm < 1) {
            lily_fail(e, "mega: the kernel does not fit an SM (%zu bytes of shared memory)",
                      g->smem);
            break;
        }
        if (lily_cuda_sync(e)) break;
        rc = 0;
    } while (0);
    free(b.ops);
    if (rc) {
        lily_cuda_mega_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

extern "C" int lily_cuda_mega_step(lily_mega *g, const lily_mega_state *s, lily_cuda_stream st,
                                   lily_err *e) {
    if (*(volatile int *)g->err_h) return lily_cuda_mega_failed(g, e);
    g->cf.exact = lily_cuda_prec_get().attn_exact; /* the attention products of the per-op path */
    LILY_CU_TRY(launch_kernel(mega_kernel, dim3(g->grid), dim3(kThreads), g->smem, st,
                              (const mg_op *)g->ops, (const int2 *)g->items, (const int *)g->offs,
                              g->cnt, g->sync, g->err, g->err_d, g->timeout_ns, g->cf, *s),
                e);
    return 0;
}

extern "C" int lily_cuda_mega_failed(const lily_mega *g, lily_err *e) {
    const int v = *(volatile int *)g->err_h;
    if (!v) return 0;
    return lily_fail(e, "mega: a tile of op %d waited past the timeout (the step is abandoned)",
                     v - 1);
}
