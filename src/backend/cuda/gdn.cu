/* Gated DeltaNet kernels (see gdn.h). */
#include "backend/cuda/gdn.h"

#include <cooperative_groups.h>

#include "backend/cuda/common.cuh"

namespace {

constexpr int kDk = 128; /* key dim: 4 rows per lane */

/* Reduce-scatter of 8 values over the 32 lanes: afterwards lane l holds the full sum of value
 * c = (l >> 2) & 7 (9 shuffles instead of 8 x 5). */
__device__ __forceinline__ float reduce8(const float (&v)[8], int lane) {
    float a4[4], a2[2];
    bool hi = lane & 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float send = hi ? v[i] : v[i + 4], keep = hi ? v[i + 4] : v[i];
        a4[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    hi = lane & 8;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float send = hi ? a4[i] : a4[i + 2], keep = hi ? a4[i + 2] : a4[i];
        a2[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    hi = lane & 4;
    float send = hi ? a2[0] : a2[1], keep = hi ? a2[1] : a2[0];
    float r = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    r += __shfl_xor_sync(0xffffffffu, r, 2);
    r += __shfl_xor_sync(0xffffffffu, r, 1);
    return r;
}

/* The lane's 4 key rows x 8 value columns of a warp's state block (layout: gdn.h). */
__device__ __forceinline__ void state_load(const float *Sw, float (&s)[4][8]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        float4 x = *(const float4 *)(Sw + r * 8), y = *(const float4 *)(Sw + r * 8 + 4);
        s[r][0] = x.x, s[r][1] = x.y, s[r][2] = x.z, s[r][3] = x.w;
        s[r][4] = y.x, s[r][5] = y.y, s[r][6] = y.z, s[r][7] = y.w;
    }
}
__device__ __forceinline__ void state_store(float *Sw, const float (&s)[4][8]) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        *(float4 *)(Sw + r * 8) = make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
        *(float4 *)(Sw + r * 8 + 4) = make_float4(s[r][4], s[r][5], s[r][6], s[r][7]);
    }
}

/* One token of the warp's (head, 8 value columns) recurrence on its state s (lane: key rows
 * 4 lane .. 4 lane + 3 of the 8 columns): q, k raw (L2-normalised here, q also by 1/sqrt(Dk)),
 * v the 8 columns' values, a and b the raw decay and beta logits. Returns column
 * (lane >> 2) & 7's output S^T q, in every lane of that column. */
__device__ __forceinline__ float gdn_token(float (&s)[4][8], float (&q)[4], float (&k)[4],
                                           const float (&v)[8], float a, float b, float negA,
                                           float dtb, int lane) {
    const int my_c = (lane >> 2) & 7;
    float qs = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
    float ks = k[0] * k[0] + k[1] * k[1] + k[2] * k[2] + k[3] * k[3];
    qs = warp_sum(qs);
    ks = warp_sum(ks);
    const float qr = (1.0f / sqrtf((float)kDk)) / sqrtf(qs + 1e-6f), kr = 1.0f / sqrtf(ks + 1e-6f);
#pragma unroll
    for (int r = 0; r < 4; r++)
        q[r] *= qr, k[r] *= kr;
    const float x = a + dtb;
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    const float lam = expf(negA * sp), beta = sigmoid_f(b);
    /* decay and retrieve: m = (lam S)^T k */
    float m[8];
#pragma unroll
    for (int c = 0; c < 8; c++)
        m[c] = 0.f;
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 8; c++) {
            s[r][c] *= lam;
            m[c] = fmaf(s[r][c], k[r], m[c]);
        }
    const float mc = reduce8(m, lane);
    float vc = v[0];
#pragma unroll
    for (int c = 1; c < 8; c++)
        if (c == my_c) vc = v[c];
    const float dc = beta * (vc - mc);
    /* rank-1 write and read-out: S += k d^T; o = S^T q */
    float d[8], oc[8];
#pragma unroll
    for (int c = 0; c < 8; c++) {
        d[c] = __shfl_sync(0xffffffffu, dc, 4 * c);
        oc[c] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 8; c++) {
            s[r][c] = fmaf(k[r], d[c], s[r][c]);
            oc[c] = fmaf(s[r][c], q[r], oc[c]);
        }
    return reduce8(oc, lane);
}

/* The decode step of R rows (blockIdx.y = row) with the output's gated RMSNorm: per value head
 * j, o_j = rmsnorm(S_j^T q) * w * silu(z_j). One warp per head and 8 value columns (gdn_token);
 * a head's Dv / 8 warps are the blocks of one cluster, which read
 * each other's per-warp sums of squares from shared memory in one fixed order, so the head's
 * norm needs no second launch and no GEMV prologue. */
struct step_rows {
    float *S[LILY_GDN_ROWS];
    size_t dqkv, dba, dz, dout; /* floats from one row's qkv, b / a, z, o to the next */
};

constexpr int kStepWarps = 4; /* warps per block at most; a head is 1..8 blocks */

__global__ void __launch_bounds__(kStepWarps * 32)
    gdn_step_kernel(const __grid_constant__ step_rows rows, int Nk, int Nv, int Dv,
                    const float *__restrict__ qkv, const float *__restrict__ bp,
                    const float *__restrict__ ap, const float *__restrict__ A_log,
                    const float *__restrict__ dt_bias, const float *__restrict__ z,
                    const float *__restrict__ nw, float eps, float *__restrict__ o) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float red[kStepWarps];
    const int lane = threadIdx.x & 31, nwb = blockDim.x >> 5;
    const int nb = (int)cl.num_blocks(), part = (int)cl.block_rank();
    const int j = blockIdx.x / nb, g = part * nwb + (threadIdx.x >> 5), i = j / (Nv / Nk);
    const int row = blockIdx.y;
    const int groups = Dv / 8;
    float *__restrict__ S = rows.S[row];
    qkv += row * rows.dqkv;
    bp += row * rows.dba;
    ap += row * rows.dba;
    z += row * rows.dz;
    o += row * rows.dout;
    float *Sw = S + (((size_t)j * groups + g) * kDk + 4 * lane) * 8;
    float s[4][8];
    state_load(Sw, s);
    const int my_c = (lane >> 2) & 7, col = j * Dv + 8 * g + my_c;
    const float4 q4 = *(const float4 *)(qkv + i * kDk + 4 * lane);
    const float4 k4 = *(const float4 *)(qkv + Nk * kDk + i * kDk + 4 * lane);
    const int vo = 2 * Nk * kDk + j * Dv + 8 * g;
    const float4 v0 = *(const float4 *)(qkv + vo), v1 = *(const float4 *)(qkv + vo + 4);
    const float zc = z[col], wc = nw[8 * g + my_c];
    float q[4] = {q4.x, q4.y, q4.z, q4.w}, k[4] = {k4.x, k4.y, k4.z, k4.w};
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const float out = gdn_token(s, q, k, v, ap[j], bp[j], -expf(A_log[j]), dt_bias[j], lane);
    state_store(Sw, s);
    const float sq = warp_sum((lane & 3) == 0 ? out * out : 0.f);
    if (lane == 0) red[threadIdx.x >> 5] = sq;
    cl.sync(); /* every block's red is written */
    float t = 0.f;
    for (int b = 0; b < nb; b++) {
        const float *rb = cl.map_shared_rank(red, b);
        for (int w = 0; w < nwb; w++)
            t += rb[w]; /* the head's warps in order, the same in every thread */
    }
    const float rn = 1.0f / sqrtf(t / Dv + eps);
    if ((lane & 3) == 0) o[col] = out * rn * wc * silu_f(zc);
    cl.sync(); /* no block leaves while another reads its red */
}

/* Prefill scan, tiled (every chunk, one token included). A warp per (head, 8 columns) stepping
 * token by token, as the decode step above does, is latency-bound over a chunk (~36 shuffles per
 * token on the dependency chain). Here P lanes share one value column (each holds 128/P of its
 * key rows), so the per-token reductions of S^T k and S^T q are log2(P) shuffles; a block owns kTileCols columns of one head and stages
 * kTileTok tokens of raw q, k, v, b, a in shared memory with cp.async, one tile ahead. The
 * per-token scalars (L2 norms, k.q, gates) are computed once per tile by the whole block, so the
 * token loop reads them as two broadcast float4s. As in lily_cpu_gdn_scan, o = lam S^T q + (k.q) d
 * lets one pass over the old state give both dot products. With C > 1 each thread would keep C
 * adjacent columns; the one launch (lily_cuda_gdn_scan) runs P = 4, C = 1 with the lazy
 * decay (the other forms measured slower: bench/NOTES-cuda.md). */
constexpr int kTileCols = 32; /* value columns per block */
constexpr int kTileTok = 16;  /* tokens per shared-memory stage */

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

struct tile_smem {
    float qk[2][kTileTok][2 * kDk]; /* raw q | raw k per token */
    float v[2][kTileTok][kTileCols];
    float ba[2][kTileTok][2]; /* raw b, a */
    /* per token: lam*rk, beta, lam*rq, (q^.k^), rk, lam, -, - (q^ = rq q, k^ = rk k) */
    float sc[kTileTok][8];
};

template <bool B> struct btag { static constexpr bool v = B; };

template <int P, int C, bool LAZY>
__global__ void __launch_bounds__(kTileCols / C * P)
    gdn_tiled_kernel(float *__restrict__ S, int Nk, int Nv, int Dv, int n,
                     const float *__restrict__ qkv, int ld, const float *__restrict__ bp,
                     const float *__restrict__ ap, int ldba, const float *__restrict__ A_log,
                     const float *__restrict__ dt_bias, float *__restrict__ o, int ldo) {
    constexpr int NT = kTileCols / C * P; /* threads */
    constexpr int R4 = 32 / P;            /* float4s of each 128-vector per lane (key rows / 4) */
    constexpr int TPT = NT / kTileTok;    /* threads per token in the scalar pass */
    constexpr int F4 = 32 / TPT;          /* float4s of q (and of k) per thread in that pass */
    static_assert(TPT <= 32 && F4 >= 1, "tile shape");
    __shared__ __align__(16) tile_smem sm;
    const int tid = threadIdx.x, lane = tid & 31;
    const int bph = (Dv + kTileCols - 1) / kTileCols; /* blocks per head */
    const int j = blockIdx.x / bph, cb = (blockIdx.x % bph) * kTileCols, i = j / (Nv / Nk);
    /* the thread's C adjacent columns cl.. (C divides 8: they share one 8-column state block) */
    const int p = lane % P, cl = ((tid >> 5) * (32 / P) + lane / P) * C, col = cb + cl;
    const bool active = col < Dv; /* Dv % 8 == 0: all C columns or none */
    /* lane p holds key rows 4 (p + P f) + u: for each f the P lanes of a column read P
     * consecutive float4s of q and k (conflict-free, broadcast across columns) */
    float s[C][R4][4];
    float *Sj = S + (size_t)j * kDk * Dv + (size_t)(col >> 3) * kDk * 8 + (col & 7);
#pragma unroll
    for (int f = 0; f < R4; f++)
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int c = 0; c < C; c++)
                s[c][f][u] = active ? Sj[(4 * (p + P * f) + u) * 8 + c] : 0.f;
    const float negA = -expf(A_log[j]), dtb = dt_bias[j];
    const float qscale = 1.0f / sqrtf((float)kDk);
    const float *qsrc = qkv + (size_t)i * kDk, *ksrc = qkv + (size_t)(Nk + i) * kDk;
    const float *vsrc = qkv + (size_t)2 * Nk * kDk + (size_t)j * Dv + cb;
    const int vcols = min(kTileCols, Dv - cb);

    auto issue = [&](int tile, int buf) {
        const int t0 = tile * kTileTok, nt = min(kTileTok, n - t0);
        for (int x = tid; x < nt * 64; x += NT) {
            int tt = x >> 6, c = x & 63;
            const float *src =
                (c < 32 ? qsrc + 4 * c : ksrc + 4 * (c - 32)) + (size_t)(t0 + tt) * ld;
            cp_async16(&sm.qk[buf][tt][4 * c], src);
        }
        for (int x = tid; x < nt * (kTileCols / 4); x += NT) {
            int tt = x / (kTileCols / 4), c = x % (kTileCols / 4);
            if (4 * c < vcols)
                cp_async16(&sm.v[buf][tt][4 * c], vsrc + (size_t)(t0 + tt) * ld + 4 * c);
        }
        for (int x = tid; x < 2 * nt; x += NT) {
            int tt = x >> 1;
            const float *src = (x & 1 ? ap : bp) + (size_t)(t0 + tt) * ldba + j;
            cp_async4(&sm.ba[buf][tt][x & 1], src);
        }
        cp_async_commit();
    };

    const int ntiles = (n + kTileTok - 1) / kTileTok;
    float gam = 1.f; /* LAZY: the true state is gam * s */
    issue(0, 0);
    for (int tile = 0; tile < ntiles; tile++) {
        const int buf = tile & 1, t0 = tile * kTileTok, nt = min(kTileTok, n - t0);
        if (tile + 1 < ntiles) {
            issue(tile + 1, buf ^ 1); /* its buffer was last read before the previous barrier */
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        { /* per-token scalars: TPT lanes per token */
            const int tt = tid / TPT, x = tid % TPT;
            float qq = 0.f, kk = 0.f, qk = 0.f;
            if (tt < nt) {
                const float4 *q4 = (const float4 *)sm.qk[buf][tt], *k4 = q4 + 32;
#pragma unroll
                for (int f = 0; f < F4; f++) {
                    float4 a = q4[x + TPT * f], b = k4[x + TPT * f];
                    qq += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                    kk += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
                    qk += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                }
            }
            qq = group_sum<TPT>(qq);
            kk = group_sum<TPT>(kk);
            qk = group_sum<TPT>(qk);
            if (tt < nt && x == 0) {
                float rq = qscale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
                float xa = sm.ba[buf][tt][1] + dtb;
                float sp = xa > 20.0f ? xa : log1pf(expf(xa));
                float lam = expf(negA * sp), beta = sigmoid_f(sm.ba[buf][tt][0]);
                *(float4 *)sm.sc[tt] = make_float4(lam * rk, beta, lam * rq, rq * rk * qk);
                *(float4 *)(sm.sc[tt] + 4) = make_float4(rk, lam, 0.f, 0.f);
            }
        }
        __syncthreads();
        float *orow = o + (size_t)t0 * ldo + (size_t)j * Dv + col;
        auto token = [&](int tt, auto tag) {
            constexpr bool LZ = decltype(tag)::v;
            const float4 *q4 = (const float4 *)sm.qk[buf][tt], *k4 = q4 + 32;
            float4 kf[R4];
            float m[C][R4], d[C][R4];
#pragma unroll
            for (int f = 0; f < R4; f++) {
                float4 qf = q4[p + P * f];
                kf[f] = k4[p + P * f];
#pragma unroll
                for (int c = 0; c < C; c++) {
                    m[c][f] = s[c][f][0] * kf[f].x + s[c][f][1] * kf[f].y + s[c][f][2] * kf[f].z +
                              s[c][f][3] * kf[f].w;
                    d[c][f] = s[c][f][0] * qf.x + s[c][f][1] * qf.y + s[c][f][2] * qf.z +
                              s[c][f][3] * qf.w;
                }
            }
#pragma unroll
            for (int c = 0; c < C; c++)
#pragma unroll
                for (int w = 1; w < R4; w *= 2)
#pragma unroll
                    for (int f = 0; f + w < R4; f += 2 * w)
                        m[c][f] += m[c][f + w], d[c][f] += d[c][f + w];
            const float4 c0 = *(const float4 *)sm.sc[tt], c1 = *(const float4 *)(sm.sc[tt] + 4);
            const float dkr = c1.x, lam = c1.y;
            const float g0 = LZ ? gam : 1.f, ng = g0 * lam;
            const float rng = LZ ? __fdividef(1.0f, ng) : 1.f;
#pragma unroll
            for (int c = 0; c < C; c++) {
                const float ms = group_sum<P>(m[c][0]) * g0, ps = group_sum<P>(d[c][0]) * g0;
                const float v = active ? sm.v[buf][tt][cl + c] : 0.f;
                const float dd = c0.y * (v - c0.x * ms);
                if (active && p == c) orow[(size_t)tt * ldo + c] = c0.z * ps + c0.w * dd;
                const float dk = dkr * dd;
                if (!LZ) {
#pragma unroll
                    for (int f = 0; f < R4; f++) {
                        s[c][f][0] = fmaf(kf[f].x, dk, lam * s[c][f][0]);
                        s[c][f][1] = fmaf(kf[f].y, dk, lam * s[c][f][1]);
                        s[c][f][2] = fmaf(kf[f].z, dk, lam * s[c][f][2]);
                        s[c][f][3] = fmaf(kf[f].w, dk, lam * s[c][f][3]);
                    }
                } else {
                    const float dks = dk * rng;
#pragma unroll
                    for (int f = 0; f < R4; f++) {
                        s[c][f][0] = fmaf(kf[f].x, dks, s[c][f][0]);
                        s[c][f][1] = fmaf(kf[f].y, dks, s[c][f][1]);
                        s[c][f][2] = fmaf(kf[f].z, dks, s[c][f][2]);
                        s[c][f][3] = fmaf(kf[f].w, dks, s[c][f][3]);
                    }
                }
            }
            if (LZ) gam = ng;
        };
        /* LAZY: the state is kept as s / gam (gam: the decay since it was last folded in), so
         * a token adds k dk / gam' and does not scale the state. Per tile: if gam times the
         * tile's decays stays >= 1e-30 the tile runs that way; else the decay is folded in
         * first (one pass over s, gam = 1) and, if the tile's own decays fall below 1e-30 (lam
         * may be 0), the tile takes the plain update. Uniform: lam is per head. */
        bool lazy = false;
        if constexpr (LAZY) {
            float pt = gam;
            for (int tt = 0; tt < nt; tt++)
                pt *= sm.sc[tt][5];
            if (!(pt >= 1e-30f)) {
#pragma unroll
                for (int c = 0; c < C; c++)
#pragma unroll
                    for (int f = 0; f < R4; f++)
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            s[c][f][u] *= gam;
                gam = 1.f, pt = 1.f;
                for (int tt = 0; tt < nt; tt++)
                    pt *= sm.sc[tt][5];
            }
            lazy = pt >= 1e-30f;
        }
        if (lazy) {
#pragma unroll 2
            for (int tt = 0; tt < nt; tt++)
                token(tt, btag<LAZY>{});
        } else {
#pragma unroll 2
            for (int tt = 0; tt < nt; tt++)
                token(tt, btag<false>{});
        }
        __syncthreads(); /* the next issue overwrites this buffer; sc is rewritten */
    }
    if (active) {
#pragma unroll
        for (int f = 0; f < R4; f++)
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int c = 0; c < C; c++)
                    Sj[(4 * (p + P * f) + u) * 8 + c] = LAZY ? s[c][f][u] * gam : s[c][f][u];
    }
}

/* One thread per (token, channel): the window reads earlier inputs or the old state only, so
 * tokens are independent (out must not alias in). The state is updated by conv_state_kernel. */
template <int K>
__global__ void conv_silu_kernel(const float *__restrict__ in, int ldin, int n, int C,
                                 const float *__restrict__ state, const float *__restrict__ w,
                                 float *__restrict__ out, int ldout) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (ch >= C) return;
    const float *wc = w + (size_t)ch * K;
    float acc = wc[K - 1] * in[(size_t)t * ldin + ch];
#pragma unroll
    for (int u = 0; u < K - 1; u++) {
        int src = t - (K - 1) + u;
        float v = src >= 0 ? in[(size_t)src * ldin + ch] : state[(size_t)(K - 1 + src) * C + ch];
        acc += wc[u] * v;
    }
    out[(size_t)t * ldout + ch] = silu_f(acc);
}

/* New state: the last K-1 inputs of (old state ++ in), per channel. */
template <int K>
__global__ void conv_state_kernel(const float *__restrict__ in, int ldin, int n, int C,
                                  float *state) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    float h[K - 1];
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        int src = n - (K - 1) + j;
        h[j] = src >= 0 ? in[(size_t)src * ldin + ch] : state[(size_t)(src + K - 1) * C + ch];
    }
#pragma unroll
    for (int j = 0; j < K - 1; j++)
        state[(size_t)j * C + ch] = h[j];
}

template <int K>
void conv_launch(const float *in, int ldin, int n, int C, float *state, const float *w, float *out,
                 int ldout, lily_cuda_stream st) {
    dim3 grid((C + 127) / 128, n);
    conv_silu_kernel<K><<<grid, 128, 0, st>>>(in, ldin, n, C, state, w, out, ldout);
    conv_state_kernel<K><<<(C + 127) / 128, 128, 0, st>>>(in, ldin, n, C, state);
}

__global__ void gated_rmsnorm_kernel(float *o, int ldo, const float *__restrict__ z, int ldz, int n,
                                     int nh, int hd, const float *__restrict__ w, float eps) {
    int lane = threadIdx.x & 31;
    int wid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wid >= n * nh) return;
    int t = wid / nh, h = wid % nh;
    float *oh = o + (size_t)t * ldo + (size_t)h * hd;
    const float *zh = z + (size_t)t * ldz + (size_t)h * hd;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32)
        ss += oh[i] * oh[i];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / hd + eps);
    for (int i = lane; i < hd; i += 32)
        oh[i] = oh[i] * r * w[i] * silu_f(zh[i]);
}

} // namespace

extern "C" int lily_cuda_gdn_step_rows(float *const *S, int R, int Nk, int Nv, int Dk, int Dv,
                                       const float *qkv, size_t dqkv, const float *b,
                                       const float *a, size_t dba, const float *A_log,
                                       const float *dt_bias, const float *z, size_t dz,
                                       const float *norm_w, float eps, float *o, size_t dout,
                                       lily_cuda_stream st, lily_err *e) {
    /* a head's warps in nb blocks of at most kStepWarps, nb dividing them (a cluster: <= 8) */
    const int W = Dv / 8;
    int nb = (W + kStepWarps - 1) / kStepWarps;
    while (nb <= 8 && W % nb)
        nb++;
    if (Dk != kDk || Dv % 8 || nb > 8 || Nk < 1 || Nv % Nk || dqkv % 4)
        return lily_fail(e,
                         "gdn step rows: unsupported shape Nk=%d Nv=%d Dk=%d Dv=%d (needs Dk=128,"
                         " Dv%%8==0, Dv<=256, Nv%%Nk==0, a row stride of whole float4s)",
                         Nk, Nv, Dk, Dv);
    if (R < 1 || R > LILY_GDN_ROWS)
        return lily_fail(e, "gdn step rows: %d rows (1..%d)", R, LILY_GDN_ROWS);
    if (!z || !norm_w) return lily_fail(e, "gdn step rows: no gate or norm weight");
    step_rows rows = {};
    for (int r = 0; r < R; r++) {
        if (!S[r]) return lily_fail(e, "gdn step rows: row %d has no state", r);
        rows.S[r] = S[r];
    }
    rows.dqkv = dqkv, rows.dba = dba, rows.dz = dz, rows.dout = dout;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(Nv * nb, R);
    cfg.blockDim = dim3(W / nb * 32);
    cfg.stream = (cudaStream_t)st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = nb;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    LILY_CU_TRY(cudaLaunchKernelEx(&cfg, gdn_step_kernel, rows, Nk, Nv, Dv, qkv, b, a, A_log,
                                   dt_bias, z, norm_w, eps, o),
                e);
    return 0;
}

extern "C" int lily_cuda_gdn_scan(float *S, int Nk, int Nv, int Dk, int Dv, int n, const float *qkv,
                                  int ldqkv, const float *b, const float *a, int ldba,
                                  const float *A_log, const float *dt_bias, float *o, int ldo,
                                  lily_cuda_stream st, lily_err *e) {
    if (Dk != kDk || Dv % 8 || Nk < 1 || Nv % Nk || ldqkv % 4)
        return lily_fail(e,
                         "gdn scan: unsupported shape Nk=%d Nv=%d Dk=%d Dv=%d (needs Dk=128,"
                         " Dv%%8==0, Nv%%Nk==0)",
                         Nk, Nv, Dk, Dv);
    if (n < 1) return 0;
    /* 4 lanes per value column, the state kept divided by its decay since the last fold */
    auto k = gdn_tiled_kernel<4, 1, true>;
    const int threads = kTileCols * 4;
    int blocks = Nv * ((Dv + kTileCols - 1) / kTileCols);
    k<<<blocks, threads, 0, st>>>(S, Nk, Nv, Dv, n, qkv, ldqkv, b, a, ldba, A_log, dt_bias, o, ldo);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_conv_silu(const float *in, int ldin, int n, int C, int K, float *state,
                                   const float *w, float *out, int ldout, lily_cuda_stream st,
                                   lily_err *e) {
    if (n < 1) return 0;
    if (n > 65535) return lily_fail(e, "conv: %d tokens in one call (at most 65535)", n);
    if (out == in) return lily_fail(e, "conv: the output must not alias the input");
    switch (K) {
    case 2: conv_launch<2>(in, ldin, n, C, state, w, out, ldout, st); break;
    case 3: conv_launch<3>(in, ldin, n, C, state, w, out, ldout, st); break;
    case 4: conv_launch<4>(in, ldin, n, C, state, w, out, ldout, st); break;
    case 5: conv_launch<5>(in, ldin, n, C, state, w, out, ldout, st); break;
    case 6: conv_launch<6>(in, ldin, n, C, state, w, out, ldout, st); break;
    default: return lily_fail(e, "conv: kernel width %d is not supported (2..6)", K);
    }
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_gated_rmsnorm(float *o, int ldo, const float *z, int ldz, int n, int nh,
                                       int hd, const float *w, float eps, lily_cuda_stream st,
                                       lily_err *e) {
    if (n < 1) return 0;
    int warps = n * nh, blocks = (warps + 7) / 8;
    gated_rmsnorm_kernel<<<blocks, 256, 0, st>>>(o, ldo, z, ldz, n, nh, hd, w, eps);
    LILY_CU_LAUNCHED(e);
    return 0;
}
