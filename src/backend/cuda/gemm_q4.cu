/* Q4 prefill GEMM: Y = X W^T with MLX 4-bit weights dequantized into mma fragments (see
 * gemm_q4.h).
 *
 * Why this layout. The previous kernel (gemm.cu) stacked its 8 warps along the weight rows, so
 * every warp re-read the whole bf16 activation tile with ldmatrix, and it converted the staged fp32
 * activations to bf16 in a separate pass with a second barrier per k-step: about 120 KB of shared
 * traffic per 1M multiply-adds, at the shared-memory limit (ncu: L1/shared 81 %). Here warps form
 * a 2 x 4 (or 4 x 2) grid over rows x tokens, each B element is read by only 2-4 warps, and each
 * lane builds its B fragments from the staged fp32 rows itself (two 16-byte loads and four
 * conversions per 8 tokens and two k-slices), so a k-step needs one barrier.
 *
 * Column permutation. mma.sync m16n8k16 gives lane (g = lane / 4, q = lane % 4) the k positions
 * (2q, 2q + 1) in registers a0/a1/b0 and (2q + 8, 2q + 9) in a2/a3/b1 of each 16-wide slice. The
 * k-sum does not care which physical column sits in which logical position as long as A and B
 * agree, and the assignment below depends only on (q, slice, register), never on g. Within a
 * 64-column k-step, lane q owns the code words q and q + 4 (columns 8w .. 8w + 7, w = q + 4h for
 * slice pair h); slice 2h + m puts columns (8w + 2m, 8w + 2m + 4) in the first register and
 * (8w + 2m + 1, 8w + 2m + 5) in the second. A Q4 word gives exactly the pair (8w + j, 8w + j + 4)
 * with one shift and one mask (nibble j and j + 4 into the two bf16 halves as 128 + q), and the
 * staged fp32 chunks 2w and 2w + 1 (columns 8w .. 8w + 3, 8w + 4 .. 8w + 7) give the same pairs
 * for B.
 *
 * Shared-memory swizzles (16-byte chunks, so cp.async keeps working): code row r keeps its two
 * chunks swapped when bit 2 of r is set, so the 32 lanes' word loads (rows g, words q) hit 32
 * distinct banks; activation row t keeps chunk c at c ^ (t & 1), so each quarter-warp's 16-byte
 * loads (rows g = 0/1, chunks 2q + p) hit 8 distinct bank groups. */
#include "backend/cuda/gemm_q4.h"

#include <cuda_bf16.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_partial.h"
#include "backend/cuda/gemm_split.h"

namespace {

constexpr int BK = 64;        /* k-step: one quantization group */
constexpr int kThreads = 256; /* 8 warps */
/* Scale words are staged SBC groups (k-steps) at a time: one 16-byte copy per row instead of one
 * 4-byte copy per row and k-step (the time per k-step tracks the L2 sectors requested). */
constexpr int SBC = 4;

/* Block shape: WR x WC warps over rows x tokens, each warp MT 16-row tiles x NT 8-token tiles. */
template <int MT, int NT, int WR, int WC> struct shape {
    static constexpr int BM = WR * MT * 16, BN = WC * NT * 8;
    static constexpr int W_BYTES = BM * 32, X_BYTES = BN * BK * 4;
    static constexpr int STAGE = W_BYTES + X_BYTES;
    static constexpr int TAIL = BN * 12;          /* X row offsets, row multipliers (exact) */
    static constexpr int SBUF = 2 * BM * SBC * 4; /* scale words: 2 slots of SBC groups per row */
    /* two blocks per SM: 2 x (SMEM + 1 KB reserved) within the H200's 228 KB; at most 5 stages,
     * so a scale slot is refilled only after its last k-step (see load_sb) */
    static constexpr int NS_FIT = (113 * 1024 - TAIL - SBUF) / STAGE;
    static constexpr int NS = NS_FIT < 2 ? 2 : NS_FIT > 5 ? 5 : NS_FIT; /* ring depth */
    static constexpr int SMEM = NS * STAGE + TAIL + SBUF;
};

/* Nibbles j and j + 4 of code word v as the bf16 pair (128 + q) (exact), minus 128 (exact), times
 * the group scale plus the bias: one rounding to bf16, as the previous kernel. */
__device__ __forceinline__ uint32_t dq4(uint32_t v, int j, uint32_t sc2, uint32_t bi2) {
    const uint32_t k128 = 0x43004300u;
    uint32_t u = ((v >> (4 * j)) & 0x000F000Fu) | k128;
    __nv_bfloat162 q = __hsub2(*(const __nv_bfloat162 *)&u, *(const __nv_bfloat162 *)&k128);
    __nv_bfloat162 w = __hfma2(q, *(const __nv_bfloat162 *)&sc2, *(const __nv_bfloat162 *)&bi2);
    return *(uint32_t *)&w;
}

struct q4_args {
    const uint8_t *w;   /* codes (of expert 0 when grouped) */
    const uint32_t *sb; /* scale/bias words */
    size_t w_stride, sb_stride;
    int M, K;
    const float *X;   /* fp32 rows, or the split words of gemm_split.h (EX) */
    const float *mul; /* EX: the rows' multipliers */
    int ldx, n;
    const int32_t *gather, *tiles, *d_ntiles;
    float *Y;
    int ldy, accumulate, split; /* split > 1: blockIdx.z takes a k range, its sums go to P */
    float *P;                   /* split > 1: partial sums [split][n][M], reduced in k order */
};

/* Dense: grid (token tiles, row blocks, k splits), token tiles fastest so the blocks sharing a
 * weight slice run together and read it from HBM once. Grouped: grid (row blocks, tiles). */
template <int MT, int NT, int WR, int WC, bool EX>
__global__ void __launch_bounds__(kThreads, 2) q4_kernel(const q4_args a) {
    using S = shape<MT, NT, WR, WC>;
    constexpr int BM = S::BM, BN = S::BN, NS = S::NS;
    extern __shared__ __align__(16) uint8_t smem[];
    long long *s_xoff = (long long *)(smem + NS * S::STAGE);       /* X row offsets, -1: none */
    float *s_mul = (float *)(s_xoff + BN);                         /* EX: row multipliers */
    uint32_t *sbuf = (uint32_t *)(smem + NS * S::STAGE + S::TAIL); /* [2][BM][SBC] */

    const uint8_t *W = a.w;
    const uint32_t *SB = a.sb;
    int row0, rows, m0;
    if (a.tiles) {
        if ((int)blockIdx.y >= *a.d_ntiles) return;
        const int32_t *tl = a.tiles + 3 * blockIdx.y;
        W += (size_t)tl[0] * a.w_stride;
        SB += (size_t)tl[0] * a.sb_stride;
        row0 = tl[1];
        rows = min(tl[2], BN);
        m0 = blockIdx.x * BM;
    } else {
        row0 = blockIdx.x * BN;
        rows = min(BN, a.n - row0);
        m0 = blockIdx.y * BM;
    }
    const int M = a.M, kgroups = a.K / BK;
    int kb = 0, nk = kgroups;
    if (a.split > 1) {
        const int per = (kgroups + a.split - 1) / a.split;
        kb = blockIdx.z * per;
        nk = min(kgroups - kb, per);
        if (nk <= 0) return; /* uniform over the block */
    }
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, q = lane & 3;
    const size_t rbytes = (size_t)a.K / 2;
    if (t < BN) {
        s_xoff[t] = x_row_offset(t, rows, row0, a.gather, a.ldx);
        if (EX) s_mul[t] = t < rows ? a.mul[a.gather ? a.gather[row0 + t] : row0 + t] : 0.f;
    }
    __syncthreads();

    /* scale words of groups SBC c .. SBC c + SBC - 1 into slot c & 1. A slot is refilled by the
     * load of k-step SBC (c + 2), issued NS - 1 <= 4 steps ahead, after chunk c's last step. */
    auto load_sb = [&](int c) {
        uint32_t *d = sbuf + (c & 1) * BM * SBC;
        const bool vec = (kgroups & 3) == 0; /* rows 16-byte aligned */
        for (int r = t; r < BM; r += kThreads) {
            const bool ok = m0 + r < M;
            const uint32_t *src = SB + (size_t)(m0 + r) * kgroups + SBC * c;
            if (vec) {
                cp_async16(d + r * SBC, ok ? src : SB, ok);
            } else {
#pragma unroll
                for (int j = 0; j < SBC; j++) {
                    const bool okj = ok && SBC * c + j < kgroups;
                    cp_async4(d + r * SBC + j, okj ? src + j : SB, okj);
                }
            }
        }
    };

    /* k-step kt (absolute) into ring slot sl: codes (swizzled), fp32 X (swizzled), and the scale
     * words of the next SBC groups when kt starts them (or is the block's first step) */
    auto load = [&](int kt, int sl) {
        uint8_t *st = smem + sl * S::STAGE;
        if (kt % SBC == 0 || kt == kb) load_sb(kt / SBC);
        constexpr int WCH = BM * 2;
#pragma unroll
        for (int i = 0; i < (WCH + kThreads - 1) / kThreads; i++) {
            const int c = t + i * kThreads;
            if (WCH % kThreads && c >= WCH) break;
            const int r = c >> 1, part = c & 1;
            const bool ok = m0 + r < M;
            const uint8_t *src =
                ok ? W + (size_t)(m0 + r) * rbytes + (size_t)kt * 32 + part * 16 : W;
            cp_async16(st + r * 32 + ((part ^ ((r >> 2) & 1)) << 4), src, ok);
        }
        float *sx = (float *)(st + S::W_BYTES);
        constexpr int XCH = BN * BK / 4;
#pragma unroll
        for (int i = 0; i < (XCH + kThreads - 1) / kThreads; i++) {
            const int c = t + i * kThreads;
            if (XCH % kThreads && c >= XCH) break;
            const int tr = c >> 4, part = c & 15;
            const long long off = s_xoff[tr];
            const float *src = off >= 0 ? a.X + off + (size_t)kt * BK + part * 4 : a.X;
            cp_async16(sx + tr * BK + ((part ^ (tr & 1)) << 2), src, off >= 0);
        }
    };

    const int wr = warp / WC, wc = warp % WC;
    const int rbase = wr * MT * 16, tbase = wc * NT * 8;
    const int ntv = min(NT, max(0, (rows - tbase + 7) / 8)); /* token tiles holding tokens */
    const bool active = ntv > 0 && m0 + rbase < M;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (s < nk) load(kb + s, s);
        cp_commit();
    }
    for (int it = 0; it < nk; it++) {
        cp_wait<NS - 2>();
        __syncthreads(); /* slot it landed for all; step it-1 is done with the slot refilled next */
        if (it + NS - 1 < nk) load(kb + it + NS - 1, (it + NS - 1) % NS);
        cp_commit();
        if (!active) continue;
        const uint8_t *sW = smem + (it % NS) * S::STAGE;
        const int kt = kb + it;
        const uint32_t *sSB = sbuf + ((kt / SBC) & 1) * BM * SBC + kt % SBC;
        const float4 *sX = (const float4 *)(sW + S::W_BYTES);
        if constexpr (EX) {
            /* slice by slice (the hi and lo B fragments of all token tiles for one slice at a
             * time: the whole k-step's would not fit in 128 registers with the 64 x 32 warp tile) */
            /* the rows' scale and bias as fp16 pairs, once per k-step (not per slice) */
            uint32_t sc[MT][2], bi[MT][2];
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    sb_f16(sSB[(rbase + i * 16 + g + 8 * hr) * SBC], &sc[i][hr], &bi[i][hr]);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int w = q + 4 * h; /* this lane's code word (8 columns) of the k-step */
                uint32_t v[MT][2];       /* that word of the lane's rows, for both slices */
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int r = rbase + i * 16 + g + 8 * hr;
                        v[i][hr] =
                            ((const uint32_t *)(sW + r * 32))[((h ^ ((r >> 2) & 1)) << 2) + q];
                    }
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    uint32_t bf[NT][2], bl[NT][2]; /* [token tile][register]: hi, lo parts */
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        if (nt < ntv) {
                            const int tr = tbase + nt * 8 + g, sw = tr & 1;
                            const uint4 u0 = *(const uint4 *)&sX[tr * 16 + ((2 * w) ^ sw)];
                            const uint4 u1 = *(const uint4 *)&sX[tr * 16 + ((2 * w + 1) ^ sw)];
                            const uint32_t a0 = m ? u0.z : u0.x, a1 = m ? u0.w : u0.y;
                            const uint32_t b0 = m ? u1.z : u1.x, b1 = m ? u1.w : u1.y;
                            bf[nt][0] = hi_pair(a0, b0), bf[nt][1] = hi_pair(a1, b1);
                            bl[nt][0] = lo_pair(a0, b0), bl[nt][1] = lo_pair(a1, b1);
                        } else {
                            bf[nt][0] = bf[nt][1] = bl[nt][0] = bl[nt][1] = 0u;
                        }
                    }
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        uint32_t af[4];
                        af[0] = dq4h(v[i][0], 2 * m, sc[i][0], bi[i][0]);
                        af[1] = dq4h(v[i][1], 2 * m, sc[i][1], bi[i][1]);
                        af[2] = dq4h(v[i][0], 2 * m + 1, sc[i][0], bi[i][0]);
                        af[3] = dq4h(v[i][1], 2 * m + 1, sc[i][1], bi[i][1]);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            if (nt < ntv) {
                                mma_f16(acc[i][nt], af, bf[nt]);
                                mma_f16(acc[i][nt], af, bl[nt]);
                            }
                    }
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int w = q + 4 * h; /* this lane's code word (8 columns) of the k-step */
                uint32_t bf[NT][2][2];   /* [token tile][slice m][register] */
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (nt < ntv) {
                        const int tr = tbase + nt * 8 + g, sw = tr & 1;
                        const float4 c0 = sX[tr * 16 + ((2 * w) ^ sw)];
                        const float4 c1 = sX[tr * 16 + ((2 * w + 1) ^ sw)];
                        bf[nt][0][0] = bf2(c0.x, c1.x), bf[nt][0][1] = bf2(c0.y, c1.y);
                        bf[nt][1][0] = bf2(c0.z, c1.z), bf[nt][1][1] = bf2(c0.w, c1.w);
                    } else {
                        bf[nt][0][0] = bf[nt][0][1] = bf[nt][1][0] = bf[nt][1][1] = 0u;
                    }
                }
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    uint32_t v[2], sc[2], bi[2];
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int r = rbase + i * 16 + g + 8 * hr;
                        const uint32_t *p = (const uint32_t *)(sW + r * 32);
                        v[hr] = p[((h ^ ((r >> 2) & 1)) << 2) + q];
                        const uint32_t s = sSB[r * SBC];
                        sc[hr] = __byte_perm(s, 0, 0x1010);
                        bi[hr] = __byte_perm(s, 0, 0x3232);
                    }
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        uint32_t af[4];
                        af[0] = dq4(v[0], 2 * m, sc[0], bi[0]);
                        af[1] = dq4(v[1], 2 * m, sc[1], bi[1]);
                        af[2] = dq4(v[0], 2 * m + 1, sc[0], bi[0]);
                        af[3] = dq4(v[1], 2 * m + 1, sc[1], bi[1]);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            if (nt < ntv) mma_bf16(acc[i][nt], af, bf[nt][m]);
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
                const int o = m0 + rbase + i * 16 + g + (e >> 1) * 8;
                const int tr = tbase + nt * 8 + 2 * q + (e & 1);
                if (o < M && tr < rows) {
                    const float v = EX ? acc[i][nt][e] * s_mul[tr] : acc[i][nt][e];
                    if (a.split > 1) {
                        a.P[((size_t)blockIdx.z * a.n + row0 + tr) * M + o] = v;
                    } else {
                        float *y = a.Y + (size_t)(row0 + tr) * a.ldy + o;
                        *y = a.accumulate ? *y + v : v;
                    }
                }
            }
}

template <int MT, int NT, int WR, int WC, bool EX>
int launch_ex(const q4_args &a, dim3 grid, lily_cuda_stream st, lily_err *e) {
    using S = shape<MT, NT, WR, WC>;
    auto k = q4_kernel<MT, NT, WR, WC, EX>;
    static bool attr = false; /* benign race: the call is idempotent */
    if (!attr) {
        LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM),
                    e);
        attr = true;
    }
    if (grid.y > 65535 || grid.z > 65535)
        return lily_fail(e, "gemm_q4: grid of %u x %u x %u blocks", grid.x, grid.y, grid.z);
    k<<<grid, kThreads, S::SMEM, st>>>(a);
    LILY_CU_LAUNCHED(e);
    return 0;
}

/* The exact form when a.mul is set (X then holds split words). */
template <int MT, int NT, int WR, int WC>
int launch(const q4_args &a, dim3 grid, lily_cuda_stream st, lily_err *e) {
    return a.mul ? launch_ex<MT, NT, WR, WC, true>(a, grid, st, e)
                 : launch_ex<MT, NT, WR, WC, false>(a, grid, st, e);
}

int g_force_tile = LILY_Q4T_AUTO, g_force_split = 0;

int sm_count() {
    static int n = 0;
    if (!n) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            n = v;
        else
            n = 132;
    }
    return n;
}

/* Tile and split from a crude model: waves of 2 blocks per SM times the k-steps of one block, each
 * costing its tile's work over the relative speed of its warp tile (64 x 32 warps 1.0, 32 x 32
 * 0.85, 32 x 16 0.65), a full wave's k-step costing us_per_step32 at speed 1.0 (measured, as the
 * round trip and launch costs: bench/NOTES-cuda.md); plus for a split the partial sums' round trip
 * through memory and a launch. Splits keep >= 4 k-steps per block. */
void choose(int M, int n, int K, int *tile, int *split) {
    static const int bn[3] = {128, 64, 32};
    static const double eff[3] = {1.0, 0.85, 0.65};
    const double us_per_step32 = 62.0 / 32 * 0.65; /* us per k-step of a 128 x 32 tile at eff 1 */
    const long slots = 2L * sm_count();
    const int ks = K / BK;
    double best = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int s = 1; s <= 8; s *= 2) {
            if (s > 1 && ks / s < 4) continue;
            const long blocks = (long)((M + 127) / 128) * ((n + bn[ti] - 1) / bn[ti]) * s;
            const double waves = (double)((blocks + slots - 1) / slots);
            const int steps = (ks + s - 1) / s;
            double cost = waves * steps * us_per_step32 * (bn[ti] / 32.0) / eff[ti];
            if (s > 1) cost += 2.0 + (double)(s + 2) * n * M * 4 / 3e6;
            if (best == 0 || cost < best) best = cost, *tile = ti, *split = s;
        }
}

/* Exact form: X's rows become split words (gemm_split.h) that the kernel reads instead. */
int split_x(q4_args &a, int rows, lily_cuda_stream st, lily_err *e) {
    const uint32_t *w;
    const float *mul;
    if (lily_cuda_xsplit(a.X, a.ldx, rows, a.K, &w, &mul, st, e)) return -1;
    a.X = (const float *)w, a.ldx = a.K, a.mul = mul;
    return 0;
}

} // namespace

extern "C" void lily_cuda_gemm_q4_force(int tile, int split) {
    g_force_tile = tile;
    g_force_split = split;
}

extern "C" int lily_cuda_gemm_q4(const lily_dmat *W, const float *X, int ldx, int n, float *Y,
                                 int ldy, int accumulate, lily_cuda_stream st, lily_err *e) {
    if (W->n_mats != 1) return lily_fail(e, "gemm: a stack of %d matrices", W->n_mats);
    if (W->dt != LILY_CW_Q4) return lily_fail(e, "gemm_q4: weights of type %d", W->dt);
    if (ldx % 4 || ((uintptr_t)X & 15))
        return lily_fail(e, "gemm: X must be 16-byte aligned with ldx %% 4 == 0 (ldx %d)", ldx);
    if (n < 1 || W->rows < 1) return 0;
    int tile = 0, split = 1;
    choose(W->rows, n, W->cols, &tile, &split);
    if (g_force_tile >= 0 && g_force_tile <= LILY_Q4T_128x32) tile = g_force_tile;
    if (g_force_split > 0) split = g_force_split;
    if (split > W->cols / BK) split = W->cols / BK;
    if (split > 1) { /* no empty k range: every split writes its whole slab of P */
        const int per = (W->cols / BK + split - 1) / split;
        split = (W->cols / BK + per - 1) / per;
    }
    q4_args a;
    a.w = W->w, a.sb = W->sb, a.w_stride = W->w_stride, a.sb_stride = W->sb_stride;
    a.M = W->rows, a.K = W->cols, a.X = X, a.ldx = ldx, a.n = n, a.mul = nullptr;
    if (lily_cuda_gemm_exact() && split_x(a, n, st, e)) return -1;
    a.gather = a.tiles = a.d_ntiles = nullptr;
    a.Y = Y, a.ldy = ldy, a.accumulate = accumulate, a.split = split, a.P = nullptr;
    if (split > 1 && !(a.P = lily_cuda_partials((size_t)split * n * W->rows, st, e))) return -1;
    const unsigned mb = (unsigned)((W->rows + 127) / 128);
    int rc;
    switch (tile) {
    case LILY_Q4T_128x128:
        rc = launch<4, 4, 2, 4>(a, dim3((n + 127) / 128, mb, split), st, e);
        break;
    case LILY_Q4T_128x64: rc = launch<2, 4, 4, 2>(a, dim3((n + 63) / 64, mb, split), st, e); break;
    default: rc = launch<2, 2, 4, 2>(a, dim3((n + 31) / 32, mb, split), st, e); break;
    }
    if (rc || split == 1) return rc;
    return lily_cuda_partials_reduce(a.P, split, n, W->rows, Y, ldy, accumulate, st, e);
}

extern "C" int lily_cuda_gemm_q4_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                                         const int32_t *gather, const int32_t *tiles,
                                         const int32_t *d_ntiles, int max_tiles, float *Y, int ldy,
                                         lily_cuda_stream st, lily_err *e) {
    if (W->dt != LILY_CW_Q4) return lily_fail(e, "gemm_q4: weights of type %d", W->dt);
    if (ldx % 4 || ((uintptr_t)X & 15))
        return lily_fail(e, "gemm: X must be 16-byte aligned with ldx %% 4 == 0 (ldx %d)", ldx);
    if (max_tiles < 1 || W->rows < 1) return 0;
    q4_args a;
    a.w = W->w, a.sb = W->sb, a.w_stride = W->w_stride, a.sb_stride = W->sb_stride;
    a.M = W->rows, a.K = W->cols, a.X = X, a.ldx = ldx, a.n = 0, a.mul = nullptr;
    if (lily_cuda_gemm_exact() && nx > 0 && split_x(a, nx, st, e)) return -1;
    a.gather = gather, a.tiles = tiles, a.d_ntiles = d_ntiles;
    a.Y = Y, a.ldy = ldy, a.accumulate = 0, a.split = 1, a.P = nullptr;
    /* 256 (or 128) rows x 32 tokens (LILY_GEMM_GROUP_BN): 8 warps stacked along the rows */
    static_assert(shape<2, 4, 8, 1>::BN == LILY_GEMM_GROUP_BN, "grouped token tile");
    if (g_force_tile == LILY_Q4T_GROUPED128)
        return launch<1, 4, 8, 1>(a, dim3((W->rows + 127) / 128, max_tiles, 1), st, e);
    return launch<2, 4, 8, 1>(a, dim3((W->rows + 255) / 256, max_tiles, 1), st, e);
}
