/* Gated DeltaNet prefill in the chunked (WY) form (gdn.h, lily_cuda_gdn_chunk). The formulas and
 * their plain-C reference are in tests/unit/gdn_chunk_ref.h; this file runs the same two phases:
 *
 * Phase 1, one block per (64-token chunk, value head), all chunks at once (it does not read the
 * state): the chunk's q and k rows are L2-normalised as the scan does, the log-decay prefix sums
 * G are formed (double), the 64 x 64 products A = beta_t exp(G_t - G_s) k_t.k_s (s < t) and
 * P = exp(G_t - G_s) q_t.k_s (s <= t), and the forward substitution (I + A) [W | U] =
 * [beta exp(G) K | beta V] in 128-column panels. W, U, P and per-token scales go to the workspace.
 *
 * Phase 2, one block per (value head, 32 value columns), the chain over chunks with the state
 * slice in shared memory: d = U - W S, o = (q exp(G)) S + P d, S = exp(G_c) S + (k exp(G_c -
 * G))^T d. Everything is fp32 on the CUDA cores (the products are register-tiled, four values
 * per shared-memory load); the state never leaves fp32. */
#include "backend/cuda/gdn.h"

#include "backend/cuda/common.cuh"

namespace {

constexpr int kDk = 128;     /* key dim */
constexpr int kCh = 64;      /* tokens per chunk */
constexpr int kLd = kDk + 4; /* row stride of 128-wide tiles (float4-aligned) */
constexpr int kLa = kCh + 4; /* row stride of 64-wide tiles */
constexpr int kThreads = 256;
constexpr int kCB = 32; /* value columns per phase-2 block */

/* The workspace (floats): W [Nv][np][Dk], U [Nv][np][Dv], P [Nv][np][64], qsc and ksc [Nv][np]
 * (per token: 1/|q| / sqrt(Dk) exp(G_t) and 1/|k| exp(G_c - G_t)), gc [Nv][nc] (exp(G_c)), with
 * nc chunks and np = 64 nc padded tokens. */
struct ws_view {
    float *W, *U, *P, *qsc, *ksc, *gc;
};
__host__ __device__ inline size_t ws_floats(int Nv, int Dv, int n) {
    const size_t nc = (size_t)(n + kCh - 1) / kCh, np = nc * kCh;
    return (size_t)Nv * np * (kDk + Dv + kCh + 2) + (size_t)Nv * nc;
}
__host__ __device__ inline ws_view ws_split(float *ws, int Nv, int Dv, int n) {
    const size_t nc = (size_t)(n + kCh - 1) / kCh, np = nc * kCh;
    ws_view w;
    w.W = ws;
    w.U = w.W + (size_t)Nv * np * kDk;
    w.P = w.U + (size_t)Nv * np * Dv;
    w.qsc = w.P + (size_t)Nv * np * kCh;
    w.ksc = w.qsc + (size_t)Nv * np;
    w.gc = w.ksc + (size_t)Nv * np;
    return w;
}

struct p1_smem {
    float K[kCh][kLd];  /* normalised k rows */
    float QX[kCh][kLd]; /* normalised q rows, then the substitution panel */
    float A[kCh][kLa];
    double G[kCh];
    float beta[kCh], lg[kCh], rq[kCh], rk[kCh];
};

__global__ void __launch_bounds__(kThreads, 2)
    gdn_chunk_prep_kernel(int Nk, int Nv, int Dv, int n, const float *__restrict__ qkv, int ld,
                          const float *__restrict__ bp, const float *__restrict__ ap, int ldba,
                          const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                          float *__restrict__ ws) {
    extern __shared__ __align__(16) unsigned char p1_raw[];
    p1_smem &sm = *reinterpret_cast<p1_smem *>(p1_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ch = blockIdx.x, j = blockIdx.y, i = j / (Nv / Nk);
    const int t0 = ch * kCh, c = min(kCh, n - t0);
    const size_t np = (size_t)gridDim.x * kCh;
    const ws_view w = ws_split(ws, Nv, Dv, n);
    const float negA = -expf(A_log[j]), dtb = dt_bias[j], qscale = 1.0f / sqrtf((float)kDk);
    const float *qsrc = qkv + (size_t)t0 * ld + (size_t)i * kDk;
    const float *ksrc = qkv + (size_t)t0 * ld + (size_t)(Nk + i) * kDk;
    const float *vsrc = qkv + (size_t)t0 * ld + (size_t)2 * Nk * kDk + (size_t)j * Dv;
    /* 1. raw q, k rows (rows past c: zero) and the gates */
    for (int x = tid; x < kCh * (kDk / 4); x += kThreads) {
        const int tt = x / (kDk / 4), f = x % (kDk / 4);
        float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
        if (tt < c) {
            qv = *(const float4 *)(qsrc + (size_t)tt * ld + 4 * f);
            kv = *(const float4 *)(ksrc + (size_t)tt * ld + 4 * f);
        }
        *(float4 *)&sm.QX[tt][4 * f] = qv;
        *(float4 *)&sm.K[tt][4 * f] = kv;
    }
    if (tid < kCh) {
        float be = 0.f, lg = 0.f;
        if (tid < c) {
            const size_t r = (size_t)(t0 + tid) * ldba + j;
            const float xa = ap[r] + dtb;
            be = sigmoid_f(bp[r]);
            lg = negA * (xa > 20.0f ? xa : log1pf(expf(xa))); /* log lambda, as the scan */
        }
        sm.beta[tid] = be, sm.lg[tid] = lg;
    }
    __syncthreads();
    /* 2. L2 norms (q also scaled by 1/sqrt(Dk)), one warp per token; the decay prefix sums */
    for (int tt = warp; tt < kCh; tt += kThreads / 32) {
        float4 qv = *(const float4 *)&sm.QX[tt][4 * lane],
               kv = *(const float4 *)&sm.K[tt][4 * lane];
        float qq = qv.x * qv.x + qv.y * qv.y + qv.z * qv.z + qv.w * qv.w;
        float kk = kv.x * kv.x + kv.y * kv.y + kv.z * kv.z + kv.w * kv.w;
        qq = warp_sum(qq), kk = warp_sum(kk);
        const float rq = qscale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
        qv.x *= rq, qv.y *= rq, qv.z *= rq, qv.w *= rq;
        kv.x *= rk, kv.y *= rk, kv.z *= rk, kv.w *= rk;
        *(float4 *)&sm.QX[tt][4 * lane] = qv;
        *(float4 *)&sm.K[tt][4 * lane] = kv;
        if (lane == 0) sm.rq[tt] = rq, sm.rk[tt] = rk;
    }
    if (tid == 0) {
        double acc = 0;
        for (int tt = 0; tt < kCh; tt++)
            acc += (double)sm.lg[tt], sm.G[tt] = acc; /* lg = 0 past c */
    }
    __syncthreads();
    /* 3. k_t.k_s and q_t.k_s: t = ty + 16u, s = tx + 16v (4 x 4 per thread) */
    {
        const int ty = tid >> 4, tx = tid & 15;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int v = 0; v < 4; v++)
                kk[u][v] = 0.f, qk[u][v] = 0.f;
        for (int d = 0; d < kDk; d += 4) {
            float4 kt[4], qt[4], ks[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                kt[u] = *(const float4 *)&sm.K[ty + 16 * u][d];
                qt[u] = *(const float4 *)&sm.QX[ty + 16 * u][d];
                ks[u] = *(const float4 *)&sm.K[tx + 16 * u][d];
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    kk[u][v] = fmaf(kt[u].x, ks[v].x, kk[u][v]);
                    kk[u][v] = fmaf(kt[u].y, ks[v].y, kk[u][v]);
                    kk[u][v] = fmaf(kt[u].z, ks[v].z, kk[u][v]);
                    kk[u][v] = fmaf(kt[u].w, ks[v].w, kk[u][v]);
                    qk[u][v] = fmaf(qt[u].x, ks[v].x, qk[u][v]);
                    qk[u][v] = fmaf(qt[u].y, ks[v].y, qk[u][v]);
                    qk[u][v] = fmaf(qt[u].z, ks[v].z, qk[u][v]);
                    qk[u][v] = fmaf(qt[u].w, ks[v].w, qk[u][v]);
                }
        }
        float *Pj = w.P + ((size_t)j * np + t0) * kCh;
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int t = ty + 16 * u, s = tx + 16 * v;
                const float dec = s <= t && t < c ? expf((float)(sm.G[t] - sm.G[s])) : 0.f;
                sm.A[t][s] = s < t ? sm.beta[t] * dec * kk[u][v] : 0.f;
                Pj[(size_t)t * kCh + s] = qk[u][v] * dec;
            }
    }
    if (tid < kCh) {
        const int t = tid;
        const double gl = sm.G[c - 1];
        const size_t r = (size_t)j * np + t0 + t;
        w.qsc[r] = t < c ? sm.rq[t] * (float)exp(sm.G[t]) : 0.f;
        w.ksc[r] = t < c ? sm.rk[t] * (float)exp(gl - sm.G[t]) : 0.f;
        if (t == 0) w.gc[(size_t)j * gridDim.x + ch] = (float)exp(gl);
    }
    __syncthreads(); /* A complete; q no longer needed */
    /* 4. forward substitution in 128-column panels: panel 0 is W (rhs beta exp(G) k), the rest
     * U (rhs beta v). Rows past c stay zero (their rhs and A rows are zero). Two threads per
     * column split the sum over s by parity. */
    const int npan = 1 + (Dv + kDk - 1) / kDk;
    for (int pan = 0; pan < npan; pan++) {
        const int c0 = pan == 0 ? 0 : (pan - 1) * kDk;
        const int wp = pan == 0 ? kDk : min(kDk, Dv - c0);
        for (int x = tid; x < kCh * kDk; x += kThreads) {
            const int tt = x / kDk, col = x % kDk;
            float r = 0.f;
            if (tt < c && col < wp)
                r = pan == 0 ? sm.beta[tt] * (float)exp(sm.G[tt]) * sm.K[tt][col]
                             : sm.beta[tt] * vsrc[(size_t)tt * ld + c0 + col];
            sm.QX[tt][col] = r;
        }
        __syncthreads();
        const int col = tid >> 1, h = tid & 1;
        for (int t = 1; t < c; t++) {
            float a0 = 0.f, a1 = 0.f;
            int s = h;
            for (; s + 2 < t; s += 4) {
                a0 = fmaf(sm.A[t][s], sm.QX[s][col], a0);
                a1 = fmaf(sm.A[t][s + 2], sm.QX[s + 2][col], a1);
            }
            if (s < t) a0 = fmaf(sm.A[t][s], sm.QX[s][col], a0);
            float sum = a0 + a1;
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            if (h == 0) sm.QX[t][col] -= sum;
            __syncthreads();
        }
        float *dst =
            pan == 0 ? w.W + ((size_t)j * np + t0) * kDk : w.U + ((size_t)j * np + t0) * Dv + c0;
        const int ldd = pan == 0 ? kDk : Dv;
        for (int x = tid; x < c * kDk; x += kThreads) {
            const int tt = x / kDk, cc = x % kDk;
            if (cc < wp) dst[(size_t)tt * ldd + cc] = sm.QX[tt][cc];
        }
        __syncthreads(); /* the next panel overwrites QX */
    }
}

struct p2_smem {
    float S[kDk][kCB]; /* the state slice */
    float Q[kCh][kLd]; /* q exp(G), normalised */
    float W[kCh][kLd];
    float KT[kDk][kLa]; /* (k exp(G_c - G))^T, normalised */
    float P[kCh][kLa];
    float V[kCh][kCB]; /* U, then d */
};

__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunk_state_kernel(float *__restrict__ S, int Nk, int Nv, int Dv, int n,
                           const float *__restrict__ qkv, int ld, const float *__restrict__ ws,
                           float *__restrict__ o, int ldo) {
    extern __shared__ __align__(16) unsigned char p2_raw[];
    p2_smem &sm = *reinterpret_cast<p2_smem *>(p2_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int bph = (Dv + kCB - 1) / kCB; /* blocks per head */
    const int j = blockIdx.x / bph, cb = (blockIdx.x % bph) * kCB, i = j / (Nv / Nk);
    const int nc = (n + kCh - 1) / kCh;
    const size_t np = (size_t)nc * kCh;
    const ws_view w = ws_split(const_cast<float *>(ws), Nv, Dv, n);
    const bool active = cb + lane < Dv;
    auto sidx = [&](int k, int v) { /* lily_cuda_gdn_sidx */
                                    return (((size_t)j * (Dv / 8) + v / 8) * kDk + k) * 8 + v % 8;
    };
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        const int k = x / kCB, cc = x % kCB;
        sm.S[k][cc] = cb + cc < Dv ? S[sidx(k, cb + cc)] : 0.f;
    }
    for (int ch = 0; ch < nc; ch++) {
        const int t0 = ch * kCh, c = min(kCh, n - t0);
        const size_t r0 = (size_t)j * np + t0;
        const float *qsrc = qkv + (size_t)t0 * ld + (size_t)i * kDk;
        const float *ksrc = qkv + (size_t)t0 * ld + (size_t)(Nk + i) * kDk;
        /* 1. the chunk's operands (rows past c: zero) */
        for (int x = tid; x < kCh * (kDk / 4); x += kThreads) {
            const int tt = x / (kDk / 4), f = x % (kDk / 4);
            float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), wv = qv;
            if (tt < c) {
                const float s = w.qsc[r0 + tt];
                qv = *(const float4 *)(qsrc + (size_t)tt * ld + 4 * f);
                qv.x *= s, qv.y *= s, qv.z *= s, qv.w *= s;
                wv = *(const float4 *)(w.W + (r0 + tt) * kDk + 4 * f);
            }
            *(float4 *)&sm.Q[tt][4 * f] = qv;
            *(float4 *)&sm.W[tt][4 * f] = wv;
        }
        for (int x = tid; x < kCh * kDk; x += kThreads) {
            const int tt = x / kDk, d = x % kDk;
            sm.KT[d][tt] = tt < c ? ksrc[(size_t)tt * ld + d] * w.ksc[r0 + tt] : 0.f;
        }
        for (int x = tid; x < kCh * (kCh / 4); x += kThreads) {
            const int tt = x / (kCh / 4), f = x % (kCh / 4);
            *(float4 *)&sm.P[tt][4 * f] = *(const float4 *)(w.P + (r0 + tt) * kCh + 4 * f);
        }
        for (int x = tid; x < kCh * kCB; x += kThreads) {
            const int tt = x / kCB, cc = x % kCB;
            sm.V[tt][cc] = tt < c && cb + cc < Dv ? w.U[(r0 + tt) * Dv + cb + cc] : 0.f;
        }
        const float gc = w.gc[(size_t)j * nc + ch];
        __syncthreads();
        /* 2. W S and (q exp(G)) S for rows t = warp + 8u, column lane; d = U - W S */
        float ao[8];
        {
            float av[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                av[u] = 0.f, ao[u] = 0.f;
            for (int d = 0; d < kDk; d += 4) {
                const float s0 = sm.S[d][lane], s1 = sm.S[d + 1][lane];
                const float s2 = sm.S[d + 2][lane], s3 = sm.S[d + 3][lane];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const float4 wv = *(const float4 *)&sm.W[warp + 8 * u][d];
                    const float4 qv = *(const float4 *)&sm.Q[warp + 8 * u][d];
                    av[u] = fmaf(wv.x, s0, fmaf(wv.y, s1, fmaf(wv.z, s2, fmaf(wv.w, s3, av[u]))));
                    ao[u] = fmaf(qv.x, s0, fmaf(qv.y, s1, fmaf(qv.z, s2, fmaf(qv.w, s3, ao[u]))));
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                sm.V[warp + 8 * u][lane] -= av[u];
        }
        __syncthreads(); /* d complete; S no longer read by others */
        /* 3. o = ao + P d (P is zero above the diagonal); S = gc S + KT d for rows
         * warp + 8u */
        {
            float as[16];
#pragma unroll
            for (int u = 0; u < 16; u++)
                as[u] = gc * sm.S[warp + 8 * u][lane];
            for (int s = 0; s < kCh; s += 4) {
                const float d0 = sm.V[s][lane], d1 = sm.V[s + 1][lane];
                const float d2 = sm.V[s + 2][lane], d3 = sm.V[s + 3][lane];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const float4 pv = *(const float4 *)&sm.P[warp + 8 * u][s];
                    ao[u] = fmaf(pv.x, d0, fmaf(pv.y, d1, fmaf(pv.z, d2, fmaf(pv.w, d3, ao[u]))));
                }
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const float4 kv = *(const float4 *)&sm.KT[warp + 8 * u][s];
                    as[u] = fmaf(kv.x, d0, fmaf(kv.y, d1, fmaf(kv.z, d2, fmaf(kv.w, d3, as[u]))));
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int t = warp + 8 * u;
                if (t < c && active) o[(size_t)(t0 + t) * ldo + (size_t)j * Dv + cb + lane] = ao[u];
            }
#pragma unroll
            for (int u = 0; u < 16; u++)
                sm.S[warp + 8 * u][lane] = as[u];
        }
        __syncthreads(); /* the next chunk overwrites the operands */
    }
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        const int k = x / kCB, cc = x % kCB;
        if (cb + cc < Dv) S[sidx(k, cb + cc)] = sm.S[k][cc];
    }
}

/* Tensor-core helpers (mma.sync m16n8k8, tf32 in, fp32 accumulate). */
__device__ __forceinline__ uint32_t f2tf32(float x) { /* round to nearest, ties away */
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
/* c += a b on a 16 x 8 x 8 tile. Lane (g = lane / 4, t = lane % 4) holds a: A[g][t], A[g+8][t],
 * A[g][t+4], A[g+8][t+4]; b: B[t][g], B[t+4][g]; c: C[g][2t], C[g][2t+1], C[g+8][2t],
 * C[g+8][2t+1]. */
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* end of the tensor-core helpers */

/* x = hi + lo up to 2^-22 |x|, both tf32: the 3xTF32 product lo hi + hi lo + hi hi keeps about
 * fp32's precision (the lo lo term and the tf32 rounding of lo are below 2^-21 relative). */
__device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = f2tf32(x);
    lo = f2tf32(x - __uint_as_float(hi));
}
/* The A fragment of rows r0.., columns k0.. of a row-major tile (stride lda), split. */
__device__ __forceinline__ void frag_a(const float *A, int lda, int r0, int k0, int lane,
                                       uint32_t (&hi)[4], uint32_t (&lo)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const float *p = A + (size_t)(r0 + g) * lda + k0 + t;
    tf32_split(p[0], hi[0], lo[0]);
    tf32_split(p[8 * lda], hi[1], lo[1]);
    tf32_split(p[4], hi[2], lo[2]);
    tf32_split(p[8 * lda + 4], hi[3], lo[3]);
}
/* The B fragment of rows k0.., columns n0.. of a row-major B[k][n] (stride ldb), split. */
__device__ __forceinline__ void frag_b(const float *B, int ldb, int k0, int n0, int lane,
                                       uint32_t (&hi)[2], uint32_t (&lo)[2]) {
    const int g = lane >> 2, t = lane & 3;
    const float *p = B + (size_t)(k0 + t) * ldb + n0 + g;
    tf32_split(p[0], hi[0], lo[0]);
    tf32_split(p[4 * ldb], hi[1], lo[1]);
}
__device__ __forceinline__ void mma3(float (&c)[4], const uint32_t (&ahi)[4],
                                     const uint32_t (&alo)[4], const uint32_t (&bhi)[2],
                                     const uint32_t (&blo)[2]) {
    mma_tf32(c, alo, bhi);
    mma_tf32(c, ahi, blo);
    mma_tf32(c, ahi, bhi);
}

constexpr int kLs = kCB + 8; /* row stride of 32-wide tiles read as B fragments: conflict-free */

constexpr int kLk = kDk + 8; /* row stride of k rows read as the transposed A fragment */

struct p2tc_smem {
    float S[kDk][kLs];
    float Q[kCh][kLd]; /* raw q rows (scaled by qs when read) */
    float W[kCh][kLd];
    float K[kCh][kLk]; /* raw k rows (scaled by ks when read) */
    float P[kCh][kLa];
    float V[kCh][kLs]; /* U, then d */
    float O[kCh][kLs]; /* (q exp(G)) S */
    float qs[kCh], ks[kCh];
};

/* The A fragment of rows r0.. of A[r][k] = X[r][k] rs[r] (X row-major at ldx), split. */
__device__ __forceinline__ void frag_a_rows(const float *X, int ldx, const float *rs, int r0,
                                            int k0, int lane, uint32_t (&hi)[4],
                                            uint32_t (&lo)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const float *p = X + (size_t)(r0 + g) * ldx + k0 + t;
    const float s0 = rs[r0 + g], s1 = rs[r0 + g + 8];
    tf32_split(p[0] * s0, hi[0], lo[0]);
    tf32_split(p[8 * ldx] * s1, hi[1], lo[1]);
    tf32_split(p[4] * s0, hi[2], lo[2]);
    tf32_split(p[8 * ldx + 4] * s1, hi[3], lo[3]);
}
/* The A fragment of rows r0.. of A[r][k] = X[k][r] cs[k] (the transpose of X, row-major at ldx),
 * split. */
__device__ __forceinline__ void frag_a_trans(const float *X, int ldx, const float *cs, int r0,
                                             int k0, int lane, uint32_t (&hi)[4],
                                             uint32_t (&lo)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const float *p = X + (size_t)(k0 + t) * ldx + r0 + g;
    const float s0 = cs[k0 + t], s1 = cs[k0 + t + 4];
    tf32_split(p[0] * s0, hi[0], lo[0]);
    tf32_split(p[8] * s0, hi[1], lo[1]);
    tf32_split(p[4 * ldx] * s1, hi[2], lo[2]);
    tf32_split(p[4 * ldx + 8] * s1, hi[3], lo[3]);
}

/* One thread's share of a chunk's operands, fetched from global memory a chunk ahead (the loads
 * are in flight while the previous chunk computes). Rows t = (tid / 32) + 8 m of q, W, k (float4
 * column tid % 32) and of U (column tid % 32); P rows (tid / 16) + 16 m (float4 column tid % 16);
 * thread tid < 64 the q scale of row tid, 64 <= tid < 128 the k scale of row tid - 64. */
struct p2_fetch {
    float4 q[8], w[8], k[8], p[4];
    float u[8];
    float sc, gc;
};

/* Phase 2 with the products on tensor cores (3xTF32, fp32 accumulate); the same work and
 * operands as gdn_chunk_state_kernel, read a chunk ahead into registers. Warps: W S and
 * (q exp(G)) S as 16 x 32 row blocks (warp w: rows 16 (w % 4), product w / 4); P d as 16 x 16
 * blocks; the state as 16 x 32 row blocks. */
__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunk_state_tc_kernel(float *__restrict__ S, int Nk, int Nv, int Dv, int n,
                              const float *__restrict__ qkv, int ld, const float *__restrict__ ws,
                              float *__restrict__ o, int ldo) {
    extern __shared__ __align__(16) unsigned char p2tc_raw[];
    p2tc_smem &sm = *reinterpret_cast<p2tc_smem *>(p2tc_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int bph = (Dv + kCB - 1) / kCB; /* blocks per head */
    const int j = blockIdx.x / bph, cb = (blockIdx.x % bph) * kCB, i = j / (Nv / Nk);
    const int nc = (n + kCh - 1) / kCh;
    const size_t np = (size_t)nc * kCh;
    const ws_view w = ws_split(const_cast<float *>(ws), Nv, Dv, n);
    auto sidx = [&](int k, int v) { /* lily_cuda_gdn_sidx */
                                    return (((size_t)j * (Dv / 8) + v / 8) * kDk + k) * 8 + v % 8;
    };
    auto fetch = [&](int ch, p2_fetch &f) {
        const int t0 = ch * kCh, c = min(kCh, n - t0);
        const size_t r0 = (size_t)j * np + t0;
        const float *qsrc = qkv + (size_t)t0 * ld + (size_t)i * kDk;
        const float *ksrc = qkv + (size_t)t0 * ld + (size_t)(Nk + i) * kDk;
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        const int fc = lane; /* float4 column of the 128-wide rows */
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const int tt = warp + 8 * m;
            const bool in = tt < c;
            f.q[m] = in ? *(const float4 *)(qsrc + (size_t)tt * ld + 4 * fc) : z;
            f.k[m] = in ? *(const float4 *)(ksrc + (size_t)tt * ld + 4 * fc) : z;
            f.w[m] = in ? *(const float4 *)(w.W + (r0 + tt) * kDk + 4 * fc) : z;
            f.u[m] = in && cb + lane < Dv ? w.U[(r0 + tt) * Dv + cb + lane] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int tt = (tid >> 4) + 16 * m;
            f.p[m] = *(const float4 *)(w.P + (r0 + tt) * kCh + 4 * (tid & 15));
        }
        f.sc = 0.f;
        if (tid < kCh && tid < c) f.sc = w.qsc[r0 + tid];
        if (tid >= kCh && tid < 2 * kCh && tid - kCh < c) f.sc = w.ksc[r0 + tid - kCh];
        f.gc = w.gc[(size_t)j * nc + ch];
    };
    auto stage = [&](const p2_fetch &f) {
#pragma unroll
        for (int m = 0; m < 8; m++) {
            const int tt = warp + 8 * m;
            *(float4 *)&sm.Q[tt][4 * lane] = f.q[m];
            *(float4 *)&sm.K[tt][4 * lane] = f.k[m];
            *(float4 *)&sm.W[tt][4 * lane] = f.w[m];
            sm.V[tt][lane] = f.u[m];
        }
#pragma unroll
        for (int m = 0; m < 4; m++)
            *(float4 *)&sm.P[(tid >> 4) + 16 * m][4 * (tid & 15)] = f.p[m];
        if (tid < kCh)
            sm.qs[tid] = f.sc;
        else if (tid < 2 * kCh)
            sm.ks[tid - kCh] = f.sc;
    };
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        const int k = x / kCB, cc = x % kCB;
        sm.S[k][cc] = cb + cc < Dv ? S[sidx(k, cb + cc)] : 0.f;
    }
    p2_fetch f;
    fetch(0, f);
    for (int ch = 0; ch < nc; ch++) {
        const int t0 = ch * kCh, c = min(kCh, n - t0);
        /* 1. this chunk's operands into shared memory (rows past c: zero); the next chunk's
         * loads issued */
        stage(f);
        const float gc = f.gc;
        if (ch + 1 < nc) fetch(ch + 1, f);
        __syncthreads();
        /* 2. W S (warps 0-3) and (q exp(G)) S (warps 4-7), rows 16 (warp % 4) .. + 15 */
        {
            const int m0 = 16 * (warp & 3);
            float acc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    acc[nt][r] = 0.f;
            for (int k0 = 0; k0 < kDk; k0 += 8) {
                uint32_t ahi[4], alo[4];
                if (warp < 4)
                    frag_a(&sm.W[0][0], kLd, m0, k0, lane, ahi, alo);
                else
                    frag_a_rows(&sm.Q[0][0], kLd, sm.qs, m0, k0, lane, ahi, alo);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    uint32_t bhi[2], blo[2];
                    frag_b(&sm.S[0][0], kLs, k0, 8 * nt, lane, bhi, blo);
                    mma3(acc[nt], ahi, alo, bhi, blo);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int row = m0 + g + 8 * (r >> 1), col = 8 * nt + 2 * tq + (r & 1);
                    if (warp < 4)
                        sm.V[row][col] -= acc[nt][r];
                    else
                        sm.O[row][col] = acc[nt][r];
                }
        }
        __syncthreads(); /* d and (q exp(G)) S complete; S no longer read by others */
        /* 3. o = O + P d: rows 16 (warp % 4), columns 16 (warp / 4) .. + 15 */
        {
            const int m0 = 16 * (warp & 3), n0 = 16 * (warp >> 2);
            float acc[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    acc[nt][r] = sm.O[m0 + g + 8 * (r >> 1)][n0 + 8 * nt + 2 * tq + (r & 1)];
            for (int k0 = 0; k0 < kCh; k0 += 8) {
                uint32_t ahi[4], alo[4];
                frag_a(&sm.P[0][0], kLa, m0, k0, lane, ahi, alo);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    uint32_t bhi[2], blo[2];
                    frag_b(&sm.V[0][0], kLs, k0, n0 + 8 * nt, lane, bhi, blo);
                    mma3(acc[nt], ahi, alo, bhi, blo);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int t = m0 + g + 8 * (r >> 1), col = cb + n0 + 8 * nt + 2 * tq + (r & 1);
                    if (t < c && col < Dv)
                        o[(size_t)(t0 + t) * ldo + (size_t)j * Dv + col] = acc[nt][r];
                }
        }
        /* 4. S = gc S + (k ks)^T d: rows 16 warp .. + 15 */
        {
            const int m0 = 16 * warp;
            float acc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    acc[nt][r] = gc * sm.S[m0 + g + 8 * (r >> 1)][8 * nt + 2 * tq + (r & 1)];
            for (int k0 = 0; k0 < kCh; k0 += 8) {
                uint32_t ahi[4], alo[4];
                frag_a_trans(&sm.K[0][0], kLk, sm.ks, m0, k0, lane, ahi, alo);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    uint32_t bhi[2], blo[2];
                    frag_b(&sm.V[0][0], kLs, k0, 8 * nt, lane, bhi, blo);
                    mma3(acc[nt], ahi, alo, bhi, blo);
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    sm.S[m0 + g + 8 * (r >> 1)][8 * nt + 2 * tq + (r & 1)] = acc[nt][r];
        }
        __syncthreads(); /* the next chunk overwrites the operands and reads S */
    }
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        const int k = x / kCB, cc = x % kCB;
        if (cb + cc < Dv) S[sidx(k, cb + cc)] = sm.S[k][cc];
    }
}

} // namespace

extern "C" size_t lily_cuda_gdn_chunk_ws(int Nv, int Dv, int n) {
    return n < 1 ? 0 : ws_floats(Nv, Dv, n) * sizeof(float);
}

extern "C" int lily_cuda_gdn_chunk_with(int form, float *S, int Nk, int Nv, int Dk, int Dv, int n,
                                        const float *qkv, int ldqkv, const float *b, const float *a,
                                        int ldba, const float *A_log, const float *dt_bias,
                                        float *o, int ldo, float *ws, size_t ws_bytes,
                                        lily_cuda_stream st, lily_err *e) {
    if (form < LILY_GDN_CHUNK_AUTO || form > LILY_GDN_CHUNK_TC)
        return lily_fail(e, "gdn chunk: unknown form %d", form);
    if (form == LILY_GDN_CHUNK_AUTO) form = LILY_GDN_CHUNK_TC;
    if (Dk != kDk || Dv % 8 || Nk < 1 || Nv < 1 || Nv > 65535 || Nv % Nk || ldqkv % 4)
        return lily_fail(e,
                         "gdn chunk: unsupported shape Nk=%d Nv=%d Dk=%d Dv=%d ld=%d (needs"
                         " Dk=128, Dv%%8==0, Nv%%Nk==0, ld%%4==0)",
                         Nk, Nv, Dk, Dv, ldqkv);
    if (n < 1) return 0;
    if (ws_bytes < lily_cuda_gdn_chunk_ws(Nv, Dv, n))
        return lily_fail(e, "gdn chunk: workspace of %zu bytes, %zu needed for %d tokens", ws_bytes,
                         lily_cuda_gdn_chunk_ws(Nv, Dv, n), n);
    const int nc = (n + kCh - 1) / kCh;
    if (nc > 2147483647 / kCh) return lily_fail(e, "gdn chunk: %d tokens", n);
    static_assert(sizeof(p1_smem) <= 227 * 1024 && sizeof(p2_smem) <= 227 * 1024 &&
                      sizeof(p2tc_smem) <= 227 * 1024,
                  "gdn chunk tiles exceed the shared memory of an SM");
    /* set on every call (as attn.cu's prefill): per device, and cheap */
    LILY_CU_TRY(cudaFuncSetAttribute(gdn_chunk_prep_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)sizeof(p1_smem)),
                e);
    if (form == LILY_GDN_CHUNK_TC)
        LILY_CU_TRY(cudaFuncSetAttribute(gdn_chunk_state_tc_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(p2tc_smem)),
                    e);
    else
        LILY_CU_TRY(cudaFuncSetAttribute(gdn_chunk_state_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(p2_smem)),
                    e);
    gdn_chunk_prep_kernel<<<dim3(nc, Nv), kThreads, sizeof(p1_smem), st>>>(
        Nk, Nv, Dv, n, qkv, ldqkv, b, a, ldba, A_log, dt_bias, ws);
    LILY_CU_LAUNCHED(e);
    const int blocks = Nv * ((Dv + kCB - 1) / kCB);
    if (form == LILY_GDN_CHUNK_TC)
        gdn_chunk_state_tc_kernel<<<blocks, kThreads, sizeof(p2tc_smem), st>>>(
            S, Nk, Nv, Dv, n, qkv, ldqkv, ws, o, ldo);
    else
        gdn_chunk_state_kernel<<<blocks, kThreads, sizeof(p2_smem), st>>>(S, Nk, Nv, Dv, n, qkv,
                                                                          ldqkv, ws, o, ldo);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_gdn_chunk(float *S, int Nk, int Nv, int Dk, int Dv, int n,
                                   const float *qkv, int ldqkv, const float *b, const float *a,
                                   int ldba, const float *A_log, const float *dt_bias, float *o,
                                   int ldo, float *ws, size_t ws_bytes, lily_cuda_stream st,
                                   lily_err *e) {
    return lily_cuda_gdn_chunk_with(LILY_GDN_CHUNK_AUTO, S, Nk, Nv, Dk, Dv, n, qkv, ldqkv, b, a,
                                    ldba, A_log, dt_bias, o, ldo, ws, ws_bytes, st, e);
}
