/* Gated DeltaNet prefill in the chunked form (gdn.h, LILY_GDN_CHUNKED; the CPU reference of the
 * same algorithm is lily_cpu_gdn_chunked, backend/cpu/gdn_chunk.c, which has the formulas).
 *
 * Why: the tiled scan (gdn.cu) is a chain of dependent per-token steps (~660 cycles a token at
 * the 35B shape on the H200, 18 % of a 4096-token prefill chunk). Here a block owns 32 value
 * columns of one head and walks the tokens 64 at a time: the state slice is read by two matrix
 * products (S^T k and S^T q of the 64 tokens), the chunk's 64 x 64 decayed k.k and q.k products
 * are formed, one warp solves the triangular system for the state updates d_t (the only
 * sequential part: 64 steps over vectors of 32), and the outputs and the new state come from
 * matrix products again. Everything is fp32 on the CUDA cores, exact like the scan; the log-decay
 * prefix sums are kept in double so nearby tokens' decay ratios stay exact under strong decay.
 *
 * Shared memory (floats): S slice [128][32], q and k rows [64][129], v then d [64][32], S^T k
 * and S^T q [64][32], decayed k.k and q.k [64][65], per-token gates: ~142 KB, one block per SM.
 *
 * Status (H200, 2026-12-04): correct (test_cuda_gdn: equal to the CPU scan to 2.4e-7 at every
 * test shape, 2048 tokens at the 35B head count included) but 3.3x slower than the tiled scan
 * (`LILY_CUDA_TIME=1 test_cuda_gdn`, us per layer at 16 key / 32 value heads: n = 512 614.5 vs
 * 191.4, n = 2048 2513.9 vs 751.4), so the automatic choice does not use it. Counting per
 * 64-token chunk and block: the k.k / q.k products (phase 4, ~8K instructions a warp, half of
 * them shared loads), S^T k / S^T q (4K) and the state update (4K) on CUDA cores, and the
 * triangular solve on one warp while seven wait (~6K dependent instructions). What it needs to
 * win: those products on tensor cores (exact hi/lo fp16 splits) and a blocked solve (16-token
 * blocks: sequential inside a block, matrix products across blocks on all warps). */
#include "backend/cuda/gdn.h"

#include "backend/cuda/common.cuh"

namespace {

constexpr int kDk = 128;   /* key dim (the scan's requirement) */
constexpr int kCh = 64;    /* tokens per chunk */
constexpr int kCB = 32;    /* value columns per block */
constexpr int kLQ = kDk + 1; /* q/k row stride: column reads across rows are conflict-free */
constexpr int kLP = kCh + 1; /* k.k / q.k row stride */
constexpr int kThreads = 256;

struct ch_smem {
    float S[kDk][kCB];
    float Q[kCh][kLQ], K[kCh][kLQ];
    float D[kCh][kCB];         /* v, then d */
    float KS[kCh][kCB], QS[kCh][kCB];
    float KK[kCh][kLP], QK[kCh][kLP];
    double g[kCh];             /* log-decay prefix sums within the chunk */
    float beta[kCh], lg[kCh], gam[kCh], wdec[kCh];
};

__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunk_kernel(float *__restrict__ S, int Nk, int Nv, int Dv, int n,
                     const float *__restrict__ qkv, int ld, const float *__restrict__ bp,
                     const float *__restrict__ ap, int ldba, const float *__restrict__ A_log,
                     const float *__restrict__ dt_bias, float *__restrict__ o, int ldo) {
    extern __shared__ __align__(16) unsigned char ch_raw[];
    ch_smem &sm = *reinterpret_cast<ch_smem *>(ch_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int bph = (Dv + kCB - 1) / kCB; /* blocks per head */
    const int j = blockIdx.x / bph, cb = (blockIdx.x % bph) * kCB, i = j / (Nv / Nk);
    const float negA = -expf(A_log[j]), dtb = dt_bias[j], qscale = 1.0f / sqrtf((float)kDk);
    const float *qsrc = qkv + (size_t)i * kDk, *ksrc = qkv + (size_t)(Nk + i) * kDk;
    const float *vsrc = qkv + (size_t)2 * Nk * kDk + (size_t)j * Dv + cb;
    auto sidx = [&](int k, int v) { /* lily_cuda_gdn_sidx */
        return (((size_t)j * (Dv / 8) + v / 8) * kDk + k) * 8 + v % 8;
    };
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        int k = x / kCB, c = x % kCB;
        sm.S[k][c] = cb + c < Dv ? S[sidx(k, cb + c)] : 0.f;
    }
    for (int t0 = 0; t0 < n; t0 += kCh) {
        const int c = min(kCh, n - t0);
        /* 1. raw q, k rows, v columns and the gates of the chunk (rows past c: zero) */
        for (int x = tid; x < kCh * kDk; x += kThreads) {
            int tt = x / kDk, d = x % kDk;
            bool ok = tt < c;
            sm.Q[tt][d] = ok ? qsrc[(size_t)(t0 + tt) * ld + d] : 0.f;
            sm.K[tt][d] = ok ? ksrc[(size_t)(t0 + tt) * ld + d] : 0.f;
        }
        for (int x = tid; x < kCh * kCB; x += kThreads) {
            int tt = x / kCB, cc = x % kCB;
            sm.D[tt][cc] = tt < c && cb + cc < Dv ? vsrc[(size_t)(t0 + tt) * ld + cc] : 0.f;
        }
        if (tid < kCh) {
            float be = 0.f, lg = 0.f;
            if (tid < c) {
                const size_t r = (size_t)(t0 + tid) * ldba + j;
                float bb = bp[r], xa = ap[r] + dtb;
                be = sigmoid_f(bb);
                lg = negA * (xa > 20.0f ? xa : log1pf(expf(xa))); /* log lambda */
            }
            sm.beta[tid] = be, sm.lg[tid] = lg;
        }
        __syncthreads();
        /* 2. L2 norms (q also scaled by 1/sqrt(Dk)), as the scan; the decay prefix sums */
        for (int tt = warp; tt < c; tt += kThreads / 32) {
            float qq = 0.f, kk = 0.f;
            for (int d = lane; d < kDk; d += 32)
                qq += sm.Q[tt][d] * sm.Q[tt][d], kk += sm.K[tt][d] * sm.K[tt][d];
            qq = warp_sum(qq), kk = warp_sum(kk);
            const float rq = qscale / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
            for (int d = lane; d < kDk; d += 32) sm.Q[tt][d] *= rq, sm.K[tt][d] *= rk;
        }
        if (tid == 0) {
            double acc = 0;
            for (int tt = 0; tt < kCh; tt++) {
                acc += tt < c ? (double)sm.lg[tt] : 0.0;
                sm.g[tt] = acc;
                sm.gam[tt] = (float)exp(acc);
            }
        }
        __syncthreads();
        /* 3. S^T k_t and S^T q_t: lane = column, warp = tokens warp + 8u */
        {
            float ak[8], aq[8];
#pragma unroll
            for (int u = 0; u < 8; u++) ak[u] = aq[u] = 0.f;
            for (int d = 0; d < kDk; d++) {
                const float s = sm.S[d][lane];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    ak[u] = fmaf(sm.K[warp + 8 * u][d], s, ak[u]);
                    aq[u] = fmaf(sm.Q[warp + 8 * u][d], s, aq[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                sm.KS[warp + 8 * u][lane] = ak[u], sm.QS[warp + 8 * u][lane] = aq[u];
        }
        if (tid < kCh) sm.wdec[tid] = tid < c ? (float)exp(sm.g[c - 1] - sm.g[tid]) : 0.f;
        /* 4. decayed k_t.k_s (s < t) and q_t.k_s (s <= t): s = lane + 32 (warp & 1),
         * t = (warp >> 1) + 4u */
        {
            const int s = lane + 32 * (warp & 1), tb = warp >> 1;
            float kk[16], qk[16];
#pragma unroll
            for (int u = 0; u < 16; u++) kk[u] = qk[u] = 0.f;
            for (int d = 0; d < kDk; d++) {
                const float ks = sm.K[s][d];
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    kk[u] = fmaf(sm.K[tb + 4 * u][d], ks, kk[u]);
                    qk[u] = fmaf(sm.Q[tb + 4 * u][d], ks, qk[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < 16; u++) {
                const int t = tb + 4 * u;
                const bool in = t < c && s <= t;
                const float dec = in ? expf((float)(sm.g[t] - sm.g[s])) : 0.f;
                sm.KK[t][s] = s < t ? kk[u] * dec : 0.f;
                sm.QK[t][s] = qk[u] * dec;
            }
        }
        __syncthreads();
        /* 5. d_t = beta_t (v_t - gam_t S^T k_t - sum_{s<t} KK[t][s] d_s): one warp, lane =
         * column */
        if (warp == 0) {
            for (int t = 0; t < c; t++) {
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
                int s = 0;
                for (; s + 4 <= t; s += 4) {
                    a0 = fmaf(sm.KK[t][s], sm.D[s][lane], a0);
                    a1 = fmaf(sm.KK[t][s + 1], sm.D[s + 1][lane], a1);
                    a2 = fmaf(sm.KK[t][s + 2], sm.D[s + 2][lane], a2);
                    a3 = fmaf(sm.KK[t][s + 3], sm.D[s + 3][lane], a3);
                }
                for (; s < t; s++) a0 = fmaf(sm.KK[t][s], sm.D[s][lane], a0);
                const float r =
                    sm.D[t][lane] - sm.gam[t] * sm.KS[t][lane] - ((a0 + a1) + (a2 + a3));
                sm.D[t][lane] = sm.beta[t] * r;
                __syncwarp();
            }
        }
        __syncthreads();
        /* 6. outputs o_t = gam_t S^T q_t + sum_{s<=t} QK[t][s] d_s (lane = column) */
        for (int u = 0; u < 8; u++) {
            const int t = warp + 8 * u;
            if (t >= c) break;
            float a0 = sm.gam[t] * sm.QS[t][lane], a1 = 0.f;
            int s = 0;
            for (; s + 2 <= t + 1; s += 2) {
                a0 = fmaf(sm.QK[t][s], sm.D[s][lane], a0);
                a1 = fmaf(sm.QK[t][s + 1], sm.D[s + 1][lane], a1);
            }
            if (s <= t) a0 = fmaf(sm.QK[t][s], sm.D[s][lane], a0);
            if (cb + lane < Dv) o[(size_t)(t0 + t) * ldo + (size_t)j * Dv + cb + lane] = a0 + a1;
        }
        /* 7. the state: S = gam_c S + sum_s wdec_s k_s d_s^T (rows warp + 8u) */
        {
            const float gl = sm.gam[c - 1];
            for (int u = 0; u < kDk / 8; u++) {
                const int k = warp + 8 * u;
                float a0 = gl * sm.S[k][lane], a1 = 0.f;
                int s = 0;
                for (; s + 2 <= c; s += 2) {
                    a0 = fmaf(sm.K[s][k] * sm.wdec[s], sm.D[s][lane], a0);
                    a1 = fmaf(sm.K[s + 1][k] * sm.wdec[s + 1], sm.D[s + 1][lane], a1);
                }
                if (s < c) a0 = fmaf(sm.K[s][k] * sm.wdec[s], sm.D[s][lane], a0);
                sm.S[k][lane] = a0 + a1;
            }
        }
        __syncthreads(); /* the next chunk overwrites q, k, d and reads S */
    }
    for (int x = tid; x < kDk * kCB; x += kThreads) {
        int k = x / kCB, c = x % kCB;
        if (cb + c < Dv) S[sidx(k, cb + c)] = sm.S[k][c];
    }
}

} // namespace

extern "C" int lily_cuda_gdn_scan_chunked(float *S, int Nk, int Nv, int Dv, int n,
                                          const float *qkv, int ldqkv, const float *b,
                                          const float *a, int ldba, const float *A_log,
                                          const float *dt_bias, float *o, int ldo,
                                          lily_cuda_stream st, lily_err *e) {
    static bool attr = false; /* benign race: the call is idempotent */
    if (!attr) {
        LILY_CU_TRY(cudaFuncSetAttribute(gdn_chunk_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(ch_smem)),
                    e);
        attr = true;
    }
    const int blocks = Nv * ((Dv + kCB - 1) / kCB);
    gdn_chunk_kernel<<<blocks, kThreads, sizeof(ch_smem), st>>>(S, Nk, Nv, Dv, n, qkv, ldqkv, b,
                                                                a, ldba, A_log, dt_bias, o, ldo);
    LILY_CU_LAUNCHED(e);
    return 0;
}
