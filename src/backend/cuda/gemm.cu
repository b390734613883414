/* Tensor-core prefill GEMM with fused dequantization (see gemm.h).
 *
 * Column permutation. mma.sync m16n8k16 gives lane (g = lane / 4, q = lane % 4) the A elements
 * (row g and g + 8) x (k positions 2q, 2q + 1, 2q + 8, 2q + 9) of each 16-wide k slice. The
 * k-sum does not depend on the order of k, so position p of slice s (s < 4 within a 64-column
 * k-step) is mapped to column
 *     col(s, p) = 8 * (2q + s / 2) + 2 * (s % 2) + hi + 4 * e,  with p = 8 hi + 2q + e,
 * which makes each lane's weights of a k-step the 16 consecutive columns 16q .. 16q + 15 of its
 * two rows: one 8-byte Q4 load per row (16 bytes Q8, 32 bytes bf16) from the staged codes, and
 * the pairs (column c, c + 4) that a Q4 word yields with one mask (see dq4) are exactly an A
 * register. The activations are converted to bf16 once per block in the same order, so the B
 * fragments are ordinary ldmatrix loads. */
#include "backend/cuda/gemm.h"

#include <cuda_bf16.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/gemm_partial.h"
#include "backend/cuda/gemm_q4.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/gemm_wg.h"

namespace {

constexpr int BK = 64;        /* k-step: one quantization group */
constexpr int kThreads = 256; /* 8 warps, stacked along the weight rows */
constexpr int XRS = BK + 4;   /* fp32 staged X row stride (floats): 16-byte rows, fewer conflicts */
constexpr int LDX = BK + 8;   /* bf16 X row stride (elements): conflict-free ldmatrix */
/* Scale words are staged SBC groups (k-steps) at a time into two slots: one 32-byte copy per row
 * (a whole L2 sector) instead of a 4-byte copy per row and k-step, since the time per k-step
 * tracks the number of L2 sectors requested (NOTES-cuda-gemm.md). A slot is refilled by the
 * load of k-step SBC (c + 2), issued NS - 1 < SBC + 1 steps ahead, after chunk c's last step. */
constexpr int SBC = 8;

/* Staged code bytes per weight row and k-step, and their shared-memory row stride (bf16 rows are
 * padded so the 8 lanes of a 16-byte load phase hit distinct banks). */
template <int DT> struct wfmt {
    static constexpr int RB = DT == LILY_CW_Q4 ? 32 : DT == LILY_CW_Q8 ? 64 : 128;
    static constexpr int RS = DT == LILY_CW_BF16 ? RB + 16 : RB;
    static constexpr bool Q = DT != LILY_CW_BF16;
};

/* Block shape: MT 16-row tiles per warp (BM = 128 MT rows per block), NT 8-token tiles (BN = 8 NT
 * tokens, all warps share them), NMAT matrices (2: gate and up over the same rows); EX: the exact
 * form (gemm_split.h), with an fp16 hi and a lo tile of X instead of one bf16 tile. */
template <int DT, int MT, int NT, int NMAT, bool EX = false> struct shape {
    static constexpr int BM = 8 * MT * 16, BN = NT * 8;
    static constexpr int W_BYTES = NMAT * BM * wfmt<DT>::RS;
    static constexpr int SBUF = wfmt<DT>::Q ? 2 * NMAT * BM * SBC * 4 : 0; /* [2][NMAT][BM][SBC] */
    static constexpr int X_BYTES = BN * XRS * 4;
    static constexpr int STAGE = W_BYTES + X_BYTES;
    static constexpr int XT = EX ? 2 : 1; /* X tiles per buffer: hi (and lo) */
    static constexpr int XS_BYTES = XT * 2 * BN * LDX * 2 + BN * 12;
    /* blocks per SM: the gated 256 x 32 tile and the Q8/bf16 tiles of >= 256 x 32 need more than
     * 128 registers (their raw codes are 2-4x larger), so they run one block per SM with a deeper
     * ring instead of two */
    static constexpr int MINB = MT * NT >= 8 && (NMAT == 2 || DT != LILY_CW_Q4) ? 1 : 2;
    static constexpr int BUDGET = MINB == 1 ? 200 * 1024 : 110 * 1024;
    static constexpr int NS_FIT = (BUDGET - XS_BYTES - SBUF) / STAGE;
    static constexpr int NS = NS_FIT < 2 ? 2 : NS_FIT > 6 ? 6 : NS_FIT; /* ring depth */
    static constexpr int SMEM = NS * STAGE + XS_BYTES + SBUF;
    static_assert(NS - 1 < SBC + 1, "a scale slot would be refilled before its last use");
    /* A fragments of all tiles kept across the token tiles (fewer registers when the warp has
     * more token tiles than row tiles), else the B fragments of all token tiles */
    static constexpr bool AHOIST = NMAT * MT * 4 < NT * 2;
};

/* Q4 pair j (0..3) of code word v: (v >> 4j) & 0x000F000F | 0x43004300 is the exact bf16 pair
 * (128 + q_j, 128 + q_{j+4}), i.e. columns (8w + j, 8w + j + 4); one subtraction and one fma with
 * the group's (scale, bias) pair give the weights, rounded once to bf16. */
__device__ __forceinline__ uint32_t dq4(uint32_t v, int j, __nv_bfloat162 sc, __nv_bfloat162 bi) {
    const uint32_t k128 = 0x43004300u;
    uint32_t u = ((v >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 q = __hsub2(*(const __nv_bfloat162 *)&u, *(const __nv_bfloat162 *)&k128);
    __nv_bfloat162 w = __hfma2(q, sc, bi);
    return *(uint32_t *)&w;
}

/* Raw codes of one lane for one 16-row tile and k-step: rows g and g + 8, columns 16q..16q+15. */
template <int DT> struct araw {
    static constexpr int NW = DT == LILY_CW_Q4 ? 2 : DT == LILY_CW_Q8 ? 4 : 8; /* words per row */
    uint32_t w[2][NW];
    uint32_t sb[2];
    uint32_t sc2[2], bi2[2]; /* exact Q4: the scale and bias as fp16 pairs */
};

template <int DT, bool EX>
__device__ __forceinline__ void load_araw(araw<DT> &r, const uint8_t *sW, const uint32_t *sSB,
                                          int row, int q) {
    constexpr int RS = wfmt<DT>::RS;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint8_t *p = sW + (row + 8 * h) * RS;
        if (DT == LILY_CW_Q4) {
            uint2 v = *(const uint2 *)(p + 8 * q);
            r.w[h][0] = v.x, r.w[h][1] = v.y;
        } else if (DT == LILY_CW_Q8) {
            uint4 v = *(const uint4 *)(p + 16 * q);
            r.w[h][0] = v.x, r.w[h][1] = v.y, r.w[h][2] = v.z, r.w[h][3] = v.w;
        } else {
            uint4 v = *(const uint4 *)(p + 32 * q), u = *(const uint4 *)(p + 32 * q + 16);
            r.w[h][0] = v.x, r.w[h][1] = v.y, r.w[h][2] = v.z, r.w[h][3] = v.w;
            r.w[h][4] = u.x, r.w[h][5] = u.y, r.w[h][6] = u.z, r.w[h][7] = u.w;
        }
        r.sb[h] = wfmt<DT>::Q ? sSB[(row + 8 * h) * SBC] : 0u;
        if (EX && DT == LILY_CW_Q4) sb_f16(r.sb[h], &r.sc2[h], &r.bi2[h]);
    }
}

/* The bf16 pair (column 16q + 8(s/2) + jj, same + 4) of row half h: jj = 2(s%2) + hi. */
template <int DT, bool EX>
__device__ __forceinline__ uint32_t apair(const araw<DT> &r, int h, int s, int hi) {
    const int jj = 2 * (s & 1) + hi, hw = s >> 1;
    if constexpr (EX) { /* fp16 weights (gemm_split.h) */
        if (DT == LILY_CW_Q4) {
            return dq4h(r.w[h][hw], jj, r.sc2[h], r.bi2[h]);
        } else if (DT == LILY_CW_Q8) {
            const float sc = lo_bf16(r.sb[h]), bi = hi_bf16(r.sb[h]);
            uint32_t b0 = (r.w[h][2 * hw] >> (8 * jj)) & 255u,
                     b1 = (r.w[h][2 * hw + 1] >> (8 * jj)) & 255u;
            float q0 = __uint_as_float(0x4B000000u | b0) - 8388608.f;
            float q1 = __uint_as_float(0x4B000000u | b1) - 8388608.f;
            return h2(fmaf(sc, q0, bi), fmaf(sc, q1, bi));
        } else {
            const uint32_t p =
                __byte_perm(r.w[h][4 * hw + (jj >> 1)], r.w[h][4 * hw + 2 + (jj >> 1)],
                            (jj & 1) ? 0x7632 : 0x5410);
            return h2(lo_bf16(p), hi_bf16(p));
        }
    }
    if (DT == LILY_CW_Q4) {
        const uint32_t sc2 = __byte_perm(r.sb[h], 0, 0x1010), bi2 = __byte_perm(r.sb[h], 0, 0x3232);
        return dq4(r.w[h][hw], jj, *(const __nv_bfloat162 *)&sc2, *(const __nv_bfloat162 *)&bi2);
    } else if (DT == LILY_CW_Q8) {
        /* bytes jj of words 2hw (column c) and 2hw + 1 (column c + 4); 2^23 + q is exact */
        const float sc = lo_bf16(r.sb[h]), bi = hi_bf16(r.sb[h]);
        uint32_t b0 = (r.w[h][2 * hw] >> (8 * jj)) & 255u,
                 b1 = (r.w[h][2 * hw + 1] >> (8 * jj)) & 255u;
        float q0 = __uint_as_float(0x4B000000u | b0) - 8388608.f;
        float q1 = __uint_as_float(0x4B000000u | b1) - 8388608.f;
        return bf2(fmaf(sc, q0, bi), fmaf(sc, q1, bi));
    } else {
        /* halves jj % 2 of words 4hw + jj/2 (column c) and 4hw + 2 + jj/2 (column c + 4) */
        return __byte_perm(r.w[h][4 * hw + (jj >> 1)], r.w[h][4 * hw + 2 + (jj >> 1)],
                           (jj & 1) ? 0x7632 : 0x5410);
    }
}

struct gemm_args {
    const uint8_t *w[2];   /* codes of matrix 0 (and 1) */
    const uint32_t *sb[2]; /* their scale/bias words (Q) */
    size_t w_stride, sb_stride;
    int M, K;
    const float *X;   /* fp32 rows, or the split words of gemm_split.h (EX) */
    const float *mul; /* EX: the rows' multipliers */
    int ldx, n;
    const int32_t *gather, *tiles, *d_ntiles;
    float *Y;
    int ldy, accumulate;
    int split, kper; /* dense, one matrix: blockIdx.z takes k-steps [z kper, (z + 1) kper), kper a
                      * multiple of SBC, its sums to plane z of P [split][n][M] (gemm_partial.h) */
    float *P;
};

/* Dense: grid (token tiles, row blocks): consecutive blocks share a weight slice, which then
 * comes from HBM once. Grouped: grid (row blocks, tiles); tile y is tiles[y] when y < *d_ntiles. */
template <int DT, int MT, int NT, int NMAT, bool EX>
__global__ void __launch_bounds__(kThreads, (shape<DT, MT, NT, NMAT, EX>::MINB))
    gemm_kernel(const gemm_args a) {
    using S = shape<DT, MT, NT, NMAT, EX>;
    constexpr int BM = S::BM, BN = S::BN, NS = S::NS, RB = wfmt<DT>::RB, RS = wfmt<DT>::RS;
    extern __shared__ __align__(16) uint8_t smem[];
    /* [2][BN][LDX] bf16 (EX: fp16 hi), then EX: [2][BN][LDX] fp16 lo */
    uint16_t *Xs = (uint16_t *)(smem + NS * S::STAGE);
    uint16_t *Xl = Xs + 2 * BN * LDX;
    long long *s_xoff = (long long *)(Xs + S::XT * 2 * BN * LDX);      /* X row offsets, -1: none */
    float *s_mul = (float *)(s_xoff + BN);                             /* EX: row multipliers */
    uint32_t *sbuf = (uint32_t *)(smem + NS * S::STAGE + S::XS_BYTES); /* [2][NMAT][BM][SBC] */

    const uint8_t *W[NMAT];
    const uint32_t *SB[NMAT];
    int row0, rows, m0;
    if (a.tiles) {
        if ((int)blockIdx.y >= *a.d_ntiles) return;
        const int32_t *tl = a.tiles + 3 * blockIdx.y;
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
            W[m] = a.w[m] + (size_t)tl[0] * a.w_stride;
            SB[m] = wfmt<DT>::Q ? a.sb[m] + (size_t)tl[0] * a.sb_stride : nullptr;
        }
        row0 = tl[1];
        rows = min(tl[2], BN);
        m0 = blockIdx.x * BM;
    } else {
#pragma unroll
        for (int m = 0; m < NMAT; m++)
            W[m] = a.w[m], SB[m] = a.sb[m];
        row0 = blockIdx.x * BN;
        rows = min(BN, a.n - row0);
        m0 = blockIdx.y * BM;
    }
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, q = lane & 3;
    const int M = a.M, K = a.K, ksteps = K / BK;
    int kb = 0, nk = ksteps;
    if (NMAT == 1 && a.split > 1) {
        kb = blockIdx.z * a.kper;
        nk = min(ksteps - kb, a.kper);
        if (nk <= 0) return; /* uniform over the block (the launch leaves no range empty) */
    }
    const size_t rbytes = dmat_row_bytes(DT, K);
    if (t < BN) {
        s_xoff[t] = x_row_offset(t, rows, row0, a.gather, a.ldx);
        if (EX) s_mul[t] = t < rows ? a.mul[a.gather ? a.gather[row0 + t] : row0 + t] : 0.f;
    }
    __syncthreads();

    /* one k-step of codes, scale words and X into ring slot sl */
    auto load = [&](int kt, int sl) {
        uint8_t *st = smem + sl * S::STAGE;
        constexpr int WCH = BM * RB / 16; /* 16-byte chunks per matrix */
#pragma unroll
        for (int m = 0; m < NMAT; m++)
#pragma unroll
            for (int i = 0; i < (WCH + kThreads - 1) / kThreads; i++) {
                int c = t + i * kThreads;
                if (WCH % kThreads && c >= WCH) break;
                int r = c / (RB / 16), part = c % (RB / 16);
                bool ok = m0 + r < M;
                const uint8_t *src =
                    ok ? W[m] + (size_t)(m0 + r) * rbytes + (size_t)kt * RB + part * 16 : W[m];
                cp_async16(st + (m * BM + r) * RS + part * 16, src, ok);
            }
        if (wfmt<DT>::Q && kt % SBC == 0) { /* scale words of groups kt .. kt + SBC - 1 */
            const int kg = K / BK;
            const bool vec = (kg & 3) == 0; /* rows 16-byte aligned */
            uint32_t *d = sbuf + ((kt / SBC) & 1) * NMAT * BM * SBC;
            for (int u = t; u < NMAT * BM * 2; u += kThreads) {
                const int m = u / (2 * BM), r = (u >> 1) % BM, p = u & 1, g0 = kt + 4 * p;
                const bool ok = m0 + r < M;
                const uint32_t *src = SB[NMAT - 1];
                src = m == 0 ? SB[0] : src;
                src += (size_t)(m0 + r) * kg + g0;
                uint32_t *dd = d + (m * BM + r) * SBC + 4 * p;
                if (vec) {
                    const bool okv = ok && g0 < kg;
                    cp_async16(dd, okv ? src : SB[0], okv);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const bool okj = ok && g0 + j < kg;
                        cp_async4(dd + j, okj ? src + j : SB[0], okj);
                    }
                }
            }
        }
        float *sx = (float *)(st + S::W_BYTES);
        constexpr int XCH = BN * BK / 4;
#pragma unroll
        for (int i = 0; i < (XCH + kThreads - 1) / kThreads; i++) {
            int c = t + i * kThreads;
            if (XCH % kThreads && c >= XCH) break;
            int tr = c / (BK / 4), part = c % (BK / 4);
            long long off = s_xoff[tr];
            const float *src = off >= 0 ? a.X + off + (size_t)kt * BK + part * 4 : a.X;
            cp_async16(sx + tr * XRS + part * 4, src, off >= 0);
        }
    };

    /* staged fp32 X of slot sl -> bf16 Xs[b] in the permuted order (see the file comment): unit
     * (token, m, sub) writes slice s = 2m + sub, halves hi = 0, 1, lanes q = 0..3 */
    auto convert = [&](int sl, int b) {
        const float *sx = (const float *)(smem + sl * S::STAGE + S::W_BYTES);
        for (int u = t; u < BN * 4; u += kThreads) {
            const int tr = u % BN, ms = u / BN, m = ms >> 1, sub = ms & 1;
            const float *xr = sx + tr * XRS + 8 * m + 2 * sub;
            uint32_t v0[4], v1[4], l0[4], l1[4];
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                float2 lo = *(const float2 *)(xr + 16 * qq),
                       hi = *(const float2 *)(xr + 16 * qq + 4);
                if constexpr (EX) { /* split words: (hi, lo) fp16 of each column */
                    const uint2 u = *(const uint2 *)&lo, w = *(const uint2 *)&hi;
                    v0[qq] = hi_pair(u.x, w.x), v1[qq] = hi_pair(u.y, w.y);
                    l0[qq] = lo_pair(u.x, w.x), l1[qq] = lo_pair(u.y, w.y);
                } else {
                    v0[qq] = bf2(lo.x, hi.x); /* columns c, c + 4 */
                    v1[qq] = bf2(lo.y, hi.y); /* columns c + 1, c + 5 */
                }
            }
            uint16_t *d = Xs + (b * BN + tr) * LDX + (2 * m + sub) * 16;
            *(uint4 *)d = make_uint4(v0[0], v0[1], v0[2], v0[3]);
            *(uint4 *)(d + 8) = make_uint4(v1[0], v1[1], v1[2], v1[3]);
            if constexpr (EX) {
                uint16_t *dl = Xl + (b * BN + tr) * LDX + (2 * m + sub) * 16;
                *(uint4 *)dl = make_uint4(l0[0], l0[1], l0[2], l0[3]);
                *(uint4 *)(dl + 8) = make_uint4(l1[0], l1[1], l1[2], l1[3]);
            }
        }
    };

    float acc[NMAT][MT][NT][4];
#pragma unroll
    for (int m = 0; m < NMAT; m++)
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                acc[m][i][j][0] = acc[m][i][j][1] = acc[m][i][j][2] = acc[m][i][j][3] = 0.f;

    const bool active = m0 + warp * MT * 16 < M; /* warp has rows to compute */
    const int ntv = (rows + 7) / 8;              /* 8-token tiles holding tokens */

#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (s < nk) load(kb + s, s);
        cp_commit();
    }
    for (int it = 0; it < nk; it++) {
        const int kt = kb + it;
        cp_wait<NS - 2>();
        __syncthreads(); /* slot it landed for all; step it-1 is done with slot it-1 */
        if (it + NS - 1 < nk) load(kt + NS - 1, (it + NS - 1) % NS);
        cp_commit();
        const int sl = it % NS, b = it & 1;
        convert(sl, b);
        __syncthreads();
        if (!active) continue;
        const uint8_t *sW = smem + sl * S::STAGE;
        const uint32_t *sSB = sbuf + ((kt / SBC) & 1) * NMAT * BM * SBC + kt % SBC;
        araw<DT> raw[NMAT][MT];
#pragma unroll
        for (int m = 0; m < NMAT; m++)
#pragma unroll
            for (int i = 0; i < MT; i++)
                load_araw<DT, EX>(raw[m][i], sW + m * BM * RS, sSB + m * BM * SBC,
                                  (warp * MT + i) * 16 + g, q);
        const uint16_t *xb = Xs + b * BN * LDX;
        const int xl = (int)(Xl - Xs); /* EX: offset of the lo tile */
#pragma unroll
        for (int s = 0; s < BK / 16; s++) {
            const uint16_t *xp =
                xb + ((lane >> 4) * 8 + (lane & 7)) * LDX + s * 16 + ((lane >> 3) & 1) * 8;
            if constexpr (S::AHOIST) {
                uint32_t af[NMAT][MT][4];
#pragma unroll
                for (int m = 0; m < NMAT; m++)
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        af[m][i][0] = apair<DT, EX>(raw[m][i], 0, s, 0);
                        af[m][i][1] = apair<DT, EX>(raw[m][i], 1, s, 0);
                        af[m][i][2] = apair<DT, EX>(raw[m][i], 0, s, 1);
                        af[m][i][3] = apair<DT, EX>(raw[m][i], 1, s, 1);
                    }
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    if (2 * np >= ntv) break;
                    uint32_t bf[4], bl[4];
                    ldsm_x4(bf, xp + np * 16 * LDX);
                    if constexpr (EX) ldsm_x4(bl, xp + xl + np * 16 * LDX);
#pragma unroll
                    for (int m = 0; m < NMAT; m++)
#pragma unroll
                        for (int i = 0; i < MT; i++) {
                            if constexpr (EX) {
                                mma_f16(acc[m][i][2 * np], af[m][i], bf);
                                mma_f16(acc[m][i][2 * np], af[m][i], bl);
                                if (2 * np + 1 < ntv) {
                                    mma_f16(acc[m][i][2 * np + 1], af[m][i], bf + 2);
                                    mma_f16(acc[m][i][2 * np + 1], af[m][i], bl + 2);
                                }
                            } else {
                                mma_bf16(acc[m][i][2 * np], af[m][i], bf);
                                if (2 * np + 1 < ntv)
                                    mma_bf16(acc[m][i][2 * np + 1], af[m][i], bf + 2);
                            }
                        }
                }
            } else {
                uint32_t bf[NT / 2 > 0 ? NT / 2 : 1][4];
                uint32_t bl[EX && NT / 2 > 0 ? NT / 2 : 1][4];
#pragma unroll
                for (int np = 0; np < NT / 2; np++)
                    if (2 * np < ntv) {
                        ldsm_x4(bf[np], xp + np * 16 * LDX);
                        if constexpr (EX) ldsm_x4(bl[np], xp + xl + np * 16 * LDX);
                    }
#pragma unroll
                for (int m = 0; m < NMAT; m++)
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        uint32_t af[4];
                        af[0] = apair<DT, EX>(raw[m][i], 0, s, 0);
                        af[1] = apair<DT, EX>(raw[m][i], 1, s, 0);
                        af[2] = apair<DT, EX>(raw[m][i], 0, s, 1);
                        af[3] = apair<DT, EX>(raw[m][i], 1, s, 1);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            if (nt < ntv) {
                                if constexpr (EX) {
                                    mma_f16(acc[m][i][nt], af, bf[nt / 2] + (nt & 1) * 2);
                                    mma_f16(acc[m][i][nt], af, bl[nt / 2] + (nt & 1) * 2);
                                } else {
                                    mma_bf16(acc[m][i][nt], af, bf[nt / 2] + (nt & 1) * 2);
                                }
                            }
                    }
            }
        }
    }
    cp_wait<0>(); /* no copy may be in flight at exit */
    if (!active) return;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int o = m0 + (warp * MT + i) * 16 + g + (e >> 1) * 8;
                const int tr = nt * 8 + 2 * q + (e & 1);
                if (o < M && tr < rows) {
                    const float mu = EX ? s_mul[tr] : 1.f;
                    float v = acc[0][i][nt][e] * mu;
                    if (NMAT == 2) v = silu_f(v) * (acc[NMAT - 1][i][nt][e] * mu);
                    if (NMAT == 1 && a.split > 1) {
                        a.P[((size_t)blockIdx.z * a.n + row0 + tr) * M + o] = v;
                    } else {
                        float *y = a.Y + (size_t)(row0 + tr) * a.ldy + o;
                        *y = a.accumulate ? *y + v : v;
                    }
                }
            }
}

template <int DT, int MT, int NT, int NMAT, bool EX>
int launch_ex(const gemm_args &a, int grouped, int ytiles, lily_cuda_stream st, lily_err *e) {
    using S = shape<DT, MT, NT, NMAT, EX>;
    auto k = gemm_kernel<DT, MT, NT, NMAT, EX>;
    static bool attr = false; /* benign race: the call is idempotent */
    if (!attr) {
        LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM),
                    e);
        attr = true;
    }
    const int mblocks = (a.M + S::BM - 1) / S::BM;
    dim3 grid = grouped ? dim3(mblocks, ytiles)
                        : dim3((a.n + S::BN - 1) / S::BN, mblocks, a.split > 1 ? a.split : 1);
    if (grid.y > 65535) return lily_fail(e, "gemm: grid of %u x %u blocks", grid.x, grid.y);
    k<<<grid, kThreads, S::SMEM, st>>>(a);
    LILY_CU_LAUNCHED(e);
    return 0;
}

/* The exact form when a.mul is set (X then holds split words). */
template <int DT, int MT, int NT, int NMAT>
int launch_shape(const gemm_args &a, int grouped, int ytiles, lily_cuda_stream st, lily_err *e) {
    return a.mul ? launch_ex<DT, MT, NT, NMAT, true>(a, grouped, ytiles, st, e)
                 : launch_ex<DT, MT, NT, NMAT, false>(a, grouped, ytiles, st, e);
}

/* Shapes: 256 rows x 64 tokens when that fills the GPU (large M), else 256 x 32, else 128 x 16
 * (small M: the grid, not the per-warp work, is what limits those). Grouped: 256 x 32. */
template <int DT, int NMAT>
int launch_dt(const gemm_args &a, int grouped, int ytiles, lily_cuda_stream st, lily_err *e) {
    if (grouped) { /* grouped = the tiles' rows: 32, or 64 (not gated) */
        if constexpr (NMAT == 1)
            if (grouped == 64) return launch_shape<DT, 2, 8, NMAT>(a, 1, ytiles, st, e);
        return launch_shape<DT, 2, 4, NMAT>(a, 1, ytiles, st, e);
    }
    auto blocks = [&](int bm, int bn) {
        return (long)((a.M + bm - 1) / bm) * ((a.n + bn - 1) / bn);
    };
    if constexpr (NMAT == 1)
        if (blocks(256, 64) >= 200) return launch_shape<DT, 2, 8, NMAT>(a, 0, 0, st, e);
    if (blocks(256, 32) >= 120) return launch_shape<DT, 2, 4, NMAT>(a, 0, 0, st, e);
    return launch_shape<DT, 1, 2, NMAT>(a, 0, 0, st, e);
}

template <int NMAT>
int launch(const gemm_args &a, int dt, int grouped, int ytiles, lily_cuda_stream st, lily_err *e) {
    switch (dt) {
    case LILY_CW_Q4: return launch_dt<LILY_CW_Q4, NMAT>(a, grouped, ytiles, st, e);
    case LILY_CW_Q8: return launch_dt<LILY_CW_Q8, NMAT>(a, grouped, ytiles, st, e);
    default: return launch_dt<LILY_CW_BF16, NMAT>(a, grouped, ytiles, st, e);
    }
}

int check_x(const float *X, int ldx, lily_err *e) {
    if (ldx % 4 || ((uintptr_t)X & 15))
        return lily_fail(e, "gemm: X must be 16-byte aligned with ldx %% 4 == 0 (ldx %d)", ldx);
    return 0;
}

int check_pair(const lily_dmat *G, const lily_dmat *U, lily_err *e) {
    if (G->dt != U->dt || G->rows != U->rows || G->cols != U->cols || G->n_mats != U->n_mats ||
        G->w_stride != U->w_stride || G->sb_stride != U->sb_stride)
        return lily_fail(e, "gemm: gate [%d x %d] x %d and up [%d x %d] x %d differ", G->rows,
                         G->cols, G->n_mats, U->rows, U->cols, U->n_mats);
    return 0;
}

gemm_args make_args(const lily_dmat *W0, const lily_dmat *W1, const float *X, int ldx, int n,
                    const int32_t *gather, const int32_t *tiles, const int32_t *d_ntiles, float *Y,
                    int ldy, int accumulate) {
    gemm_args a;
    a.w[0] = W0->w, a.w[1] = W1 ? W1->w : W0->w;
    a.sb[0] = W0->sb, a.sb[1] = W1 ? W1->sb : W0->sb;
    a.w_stride = W0->w_stride, a.sb_stride = W0->sb_stride;
    a.M = W0->rows, a.K = W0->cols;
    a.X = X, a.mul = nullptr, a.ldx = ldx, a.n = n;
    a.gather = gather, a.tiles = tiles, a.d_ntiles = d_ntiles;
    a.Y = Y, a.ldy = ldy, a.accumulate = accumulate;
    a.split = 1, a.kper = 0, a.P = nullptr;
    return a;
}

/* > 0: the split-K factor of later dense one-matrix GEMMs (lily_cuda_gemm_force_split) */
int g_force_split = 0;

/* Split-K for a dense one-matrix GEMM that would run on the small 128 x 16 tiles with fewer than
 * 120 blocks (at a 256-token chunk: the Q8 router, 256 x 2048 on 32 blocks, and the shared
 * expert's gate logit, 1 row on 16 blocks): enough k ranges of whole scale
 * chunks (SBC k-steps) to give ~2 blocks per SM. Sets a.split (no range empty) and a.P. */
int plan_split(gemm_args &a, lily_cuda_stream st, lily_err *e) {
    const int ks = a.K / BK;
    if (g_force_split > 0) {
        a.split = g_force_split;
    } else {
        auto blocks = [&](int bm, int bn) {
            return (long)((a.M + bm - 1) / bm) * ((a.n + bn - 1) / bn);
        };
        if (blocks(256, 64) >= 200 || blocks(256, 32) >= 120) return 0; /* the larger tiles */
        const long b = blocks(128, 16);
        if (b >= 120 || ks < 2 * SBC) return 0;
        a.split = (int)((264 + b - 1) / b);
    }
    const int chunks = (ks + SBC - 1) / SBC;
    if (a.split > chunks) a.split = chunks;
    if (a.split <= 1) return a.split = 1, 0;
    const int per = (ks + a.split - 1) / a.split, perc = (per + SBC - 1) / SBC * SBC;
    a.split = (ks + perc - 1) / perc, a.kper = perc;
    if (a.split <= 1) return a.split = 1, 0;
    return (a.P = lily_cuda_partials((size_t)a.split * a.n * a.M, st, e)) ? 0 : -1;
}

/* Exact form: X's nx rows become split words (gemm_split.h) that the kernel reads instead. */
int split_x(gemm_args &a, int nx, lily_cuda_stream st, lily_err *e) {
    if (!lily_cuda_gemm_exact() || nx < 1) return 0;
    const uint32_t *w;
    const float *mul;
    if (lily_cuda_xsplit(a.X, a.ldx, nx, a.K, &w, &mul, st, e)) return -1;
    a.X = (const float *)w, a.ldx = a.K, a.mul = mul;
    return 0;
}

/* LILY_GEMM_AUTO, or the kernel a test forces (lily_cuda_gemm_select) */
int g_select = LILY_GEMM_AUTO;

/* Whether a Q4 GEMM of M rows and n tokens (dense) or a grouped one goes to gemm_q4.h: see
 * lily_cuda_gemm_select for the AUTO rule. */
bool use_q4(int dt, int M, int K, int n, bool grouped) {
    if (dt != LILY_CW_Q4) return false;
    if (g_select == LILY_GEMM_Q4) return true;
    /* gemm_q4.h wins where this file's 256 x 64 tiles give fewer than ~120 blocks and K >= 1024
     * (split-K pays), loses at K = 512 and ties or loses on fuller grids (NOTES-cuda-gemm.md) */
    return !grouped && K >= 1024 && (long)((M + 255) / 256) * ((n + 63) / 64) < 120;
}

/* AUTO sends a dense Q4 GEMM to the wgmma kernel (gemm_wg.h: 256 x 128 blocks, one per SM; exact
 * or one pass) when it has at least kWgMinBlocks blocks, and every grouped one with 64-row tiles
 * (measurements: bench/NOTES-cuda.md, "Moved from src comments"). */
constexpr int kWgMinBlocks = 16;

bool use_wg(int dt, int M, int n, bool grouped) {
    if (dt != LILY_CW_Q4) return false;
    if (g_select == LILY_GEMM_WG) return true;
    if (g_select != LILY_GEMM_AUTO) return false;
    if (grouped) return true;
    const int nt = lily_cuda_gemm_wg_dense_nt(M, n);
    return (long)((n + nt - 1) / nt) * ((M + 255) / 256) >= kWgMinBlocks;
}

} // namespace

extern "C" void lily_cuda_gemm_select(int which) {
    g_select = which;
}

extern "C" void lily_cuda_gemm_force_split(int split) {
    g_force_split = split;
}

extern "C" int lily_cuda_gemm(const lily_dmat *W, const float *X, int ldx, int n, float *Y, int ldy,
                              int accumulate, lily_cuda_stream st, lily_err *e) {
    if (W->n_mats != 1) return lily_fail(e, "gemm: a stack of %d matrices", W->n_mats);
    if (check_x(X, ldx, e)) return -1;
    if (use_wg(W->dt, W->rows, n, false))
        return lily_cuda_gemm_wg(W, X, ldx, n, Y, ldy, accumulate, st, e);
    if (use_q4(W->dt, W->rows, W->cols, n, false))
        return lily_cuda_gemm_q4(W, X, ldx, n, Y, ldy, accumulate, st, e);
    if (n < 1 || W->rows < 1) return 0;
    gemm_args a = make_args(W, nullptr, X, ldx, n, nullptr, nullptr, nullptr, Y, ldy, accumulate);
    if (split_x(a, n, st, e) || plan_split(a, st, e) || launch<1>(a, W->dt, 0, 0, st, e)) return -1;
    if (a.split <= 1) return 0;
    return lily_cuda_partials_reduce(a.P, a.split, n, W->rows, Y, ldy, accumulate, st, e);
}

extern "C" int lily_cuda_gemm_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                                      const int32_t *gather, const int32_t *tiles,
                                      const int32_t *d_ntiles, int max_tiles, int tile_rows,
                                      float *Y, int ldy, lily_cuda_stream st, lily_err *e) {
    if (check_x(X, ldx, e)) return -1;
    if (tile_rows == LILY_GEMM_SKINNY_BN) /* Q4 only (gemm_skinny.h) */
        return lily_cuda_gemm_skinny_grouped(W, X, ldx, nx, gather, tiles, d_ntiles, max_tiles, Y,
                                             ldy, st, e);
    if (tile_rows != LILY_GEMM_GROUP_BN && tile_rows != 64)
        return lily_fail(e, "gemm_grouped: tiles of %d rows (16, 32 or 64)", tile_rows);
    if (tile_rows == 64 && use_wg(W->dt, W->rows, nx, true))
        return lily_cuda_gemm_wg_grouped(W, X, ldx, nx, gather, tiles, d_ntiles, max_tiles, Y, ldy,
                                         st, e);
    if (use_q4(W->dt, W->rows, W->cols, 0, true) && tile_rows == LILY_GEMM_GROUP_BN)
        return lily_cuda_gemm_q4_grouped(W, X, ldx, nx, gather, tiles, d_ntiles, max_tiles, Y, ldy,
                                         st, e);
    if (max_tiles < 1 || W->rows < 1) return 0;
    gemm_args a = make_args(W, nullptr, X, ldx, 0, gather, tiles, d_ntiles, Y, ldy, 0);
    if (split_x(a, nx, st, e)) return -1;
    return launch<1>(a, W->dt, tile_rows, max_tiles, st, e);
}

extern "C" int lily_cuda_gemm_glu(const lily_dmat *G, const lily_dmat *U, const float *X, int ldx,
                                  int n, float *Y, int ldy, lily_cuda_stream st, lily_err *e) {
    if (G->n_mats != 1) return lily_fail(e, "gemm: a stack of %d matrices", G->n_mats);
    if (check_pair(G, U, e) || check_x(X, ldx, e)) return -1;
    if (n < 1 || G->rows < 1) return 0;
    gemm_args a = make_args(G, U, X, ldx, n, nullptr, nullptr, nullptr, Y, ldy, 0);
    if (split_x(a, n, st, e)) return -1;
    return launch<2>(a, G->dt, 0, 0, st, e);
}

extern "C" int lily_cuda_gemm_grouped_glu(const lily_dmat *G, const lily_dmat *U, const float *X,
                                          int ldx, int nx, const int32_t *gather,
                                          const int32_t *tiles, const int32_t *d_ntiles,
                                          int max_tiles, float *Y, int ldy, lily_cuda_stream st,
                                          lily_err *e) {
    if (check_pair(G, U, e) || check_x(X, ldx, e)) return -1;
    if (max_tiles < 1 || G->rows < 1) return 0;
    gemm_args a = make_args(G, U, X, ldx, 0, gather, tiles, d_ntiles, Y, ldy, 0);
    if (split_x(a, nx, st, e)) return -1;
    return launch<2>(a, G->dt, LILY_GEMM_GROUP_BN, max_tiles, st, e);
}
