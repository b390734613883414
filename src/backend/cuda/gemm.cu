/* Tensor-core prefill GEMM with fused dequantization (see gemm.h). */
#include "backend/cuda/gemm.h"

#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"

namespace {

constexpr int BM = 128, BK = 64, LDS = BK + 8; /* padded rows: conflict-free ldmatrix */
constexpr int kThreads = 256;
/* k-steps of global loads in flight per thread (register stages): 3 for the grouped tiles, 2 for
 * the 64-token tiles, whose larger X share would otherwise spill at 2 blocks per SM */
template <int BN> struct depth {
    static constexpr int value = BN <= 32 ? 3 : 2;
};


/* Raw global data of one thread's share of a k-step: 32 weights of one row, and X as pairs of
 * float4 (8 consecutive columns of one token row). */
template <int DT, int BN> struct stage {
    static constexpr int WV = DT == LILY_CW_Q4 ? 1 : DT == LILY_CW_Q8 ? 2 : 4; /* uint4 of codes */
    static constexpr int XP = BN * BK / 8 / kThreads;                          /* X 8-col pieces */
    uint4 w[WV];
    uint32_t sb;
    float4 x[2 * XP];
};

struct tile_info {
    const uint8_t *w;    /* expert's codes */
    const uint32_t *sb;  /* expert's scale/bias words */
    int row0, rows;      /* token rows of this tile (grouped or plain) */
};

template <int DT, int BN>
__device__ __forceinline__ void load_stage(stage<DT, BN> &s, const tile_info &ti, int M, int K,
                                           int m0, int kt, const float *X, int ldx,
                                           const int32_t *gather) {
    const int t = threadIdx.x, r = t >> 1, half = t & 1;
    const int o = m0 + r;
    const size_t rb = dmat_row_bytes(DT, K);
    constexpr int bpk = DT == LILY_CW_Q4 ? 32 : DT == LILY_CW_Q8 ? 64 : 128; /* row bytes/k-step */
    const uint8_t *wp = ti.w + (size_t)o * rb + (size_t)kt * bpk + half * (bpk / 2);
#pragma unroll
    for (int i = 0; i < stage<DT, BN>::WV; i++)
        s.w[i] = o < M ? ldg_stream(wp + i * 16) : make_uint4(0, 0, 0, 0);
    if (DT != LILY_CW_BF16) s.sb = o < M ? __ldg(ti.sb + (size_t)o * (K / 64) + kt) : 0u;
#pragma unroll
    for (int i = 0; i < stage<DT, BN>::XP; i++) {
        int f = t + i * kThreads, tr = f / (BK / 8), c8 = f % (BK / 8);
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (tr < ti.rows) {
            int row = ti.row0 + tr;
            if (gather) row = gather[row];
            const float *xp = X + (size_t)row * ldx + (size_t)kt * BK + c8 * 8;
            a = *(const float4 *)xp;
            b = *(const float4 *)(xp + 4);
        }
        s.x[2 * i] = a;
        s.x[2 * i + 1] = b;
    }
}

__device__ __forceinline__ uint32_t bf2(float a, float b) { /* RNE, a in the low half */
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* Dequantizes the staged codes into As (bf16) and converts X into Bs.
 *
 * Q4 works on pairs of bf16 lanes: (v >> 4j) & 0x000F000F | 0x43004300 is the bf16 pair
 * (128 + q_j, 128 + q_{j+4}) of word v, exact; one subtraction and one fma with the group's
 * (scale, bias) give the weights, 4 instructions per pair instead of int->float conversions. The
 * pairs come out in the column order 0,4,1,5,2,6,3,7 within each 8 columns, so X is stored in
 * the same order: the k-sum of the mma does not depend on the order of k. */
template <int DT, int BN>
__device__ __forceinline__ void store_stage(const stage<DT, BN> &s, uint16_t *As, uint16_t *Bs) {
    const int t = threadIdx.x, r = t >> 1, half = t & 1;
    uint4 *dst = (uint4 *)(As + r * LDS + half * 32);
    if (DT == LILY_CW_Q4) {
        const uint32_t sc2 = __byte_perm(s.sb, 0, 0x1010), bi2 = __byte_perm(s.sb, 0, 0x3232);
        const __nv_bfloat162 sc = *(const __nv_bfloat162 *)&sc2;
        const __nv_bfloat162 bi = *(const __nv_bfloat162 *)&bi2;
        const uint32_t k128 = 0x43004300u;
        const __nv_bfloat162 c128 = *(const __nv_bfloat162 *)&k128;
        const uint32_t ws[4] = {s.w[0].x, s.w[0].y, s.w[0].z, s.w[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t p[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t u = ((ws[i] >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
                __nv_bfloat162 q = __hsub2(*(const __nv_bfloat162 *)&u, c128);
                __nv_bfloat162 w = __hfma2(q, sc, bi);
                p[j] = *(uint32_t *)&w;
            }
            dst[i] = make_uint4(p[0], p[1], p[2], p[3]);
        }
    } else if (DT == LILY_CW_Q8) {
        float sc = lo_bf16(s.sb), bi = hi_bf16(s.sb);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t ws[4] = {s.w[i].x, s.w[i].y, s.w[i].z, s.w[i].w};
            uint32_t p[8];
#pragma unroll
            for (int wi = 0; wi < 4; wi++) {
                uint32_t v = ws[wi];
                /* 2^23 + q is exact as a float: no int->float conversion */
                float q0 = __uint_as_float(0x4B000000u | (v & 255u)) - 8388608.f;
                float q1 = __uint_as_float(0x4B000000u | ((v >> 8) & 255u)) - 8388608.f;
                float q2 = __uint_as_float(0x4B000000u | ((v >> 16) & 255u)) - 8388608.f;
                float q3 = __uint_as_float(0x4B000000u | (v >> 24)) - 8388608.f;
                p[2 * wi] = bf2(fmaf(sc, q0, bi), fmaf(sc, q1, bi));
                p[2 * wi + 1] = bf2(fmaf(sc, q2, bi), fmaf(sc, q3, bi));
            }
            dst[2 * i] = make_uint4(p[0], p[1], p[2], p[3]);
            dst[2 * i + 1] = make_uint4(p[4], p[5], p[6], p[7]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) dst[i] = s.w[i];
    }
#pragma unroll
    for (int i = 0; i < stage<DT, BN>::XP; i++) {
        int f = t + i * kThreads, tr = f / (BK / 8), c8 = f % (BK / 8);
        float4 a = s.x[2 * i], b = s.x[2 * i + 1];
        uint4 v = DT == LILY_CW_Q4
                      ? make_uint4(bf2(a.x, b.x), bf2(a.y, b.y), bf2(a.z, b.z), bf2(a.w, b.w))
                      : make_uint4(bf2(a.x, a.y), bf2(a.z, a.w), bf2(b.x, b.y), bf2(b.z, b.w));
        *(uint4 *)(Bs + tr * LDS + c8 * 8) = v;
    }
}

/* grid (ceil(M/BM), token tiles). Plain: tile y covers tokens y*BN.. of n. Grouped: tile y is
 * tiles[y] when y < *d_ntiles. */
template <int DT, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(const uint8_t *__restrict__ W, const uint32_t *__restrict__ SB, size_t w_stride,
                size_t sb_stride, int M, int K, const float *__restrict__ X, int ldx, int n,
                const int32_t *__restrict__ gather, const int32_t *__restrict__ tiles,
                const int32_t *__restrict__ d_ntiles, float *Y, int ldy, int accumulate) {
    __shared__ __align__(16) uint16_t As[BM * LDS];
    __shared__ __align__(16) uint16_t Bs[BN * LDS];
    tile_info ti;
    if (tiles) {
        if ((int)blockIdx.y >= *d_ntiles) return;
        const int32_t *tl = tiles + 3 * blockIdx.y;
        ti.w = W + (size_t)tl[0] * w_stride;
        ti.sb = SB ? SB + (size_t)tl[0] * sb_stride : nullptr;
        ti.row0 = tl[1];
        ti.rows = tl[2];
    } else {
        ti.w = W;
        ti.sb = SB;
        ti.row0 = blockIdx.y * BN;
        ti.rows = min(BN, n - ti.row0);
    }
    const int m0 = blockIdx.x * BM;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp & 3, wn = warp >> 2; /* 4 x 2 warps: 32 rows x BN/2 tokens each */
    constexpr int NT = BN / 16;              /* n8 tiles per warp */
    float acc[2][NT][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < NT; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0;
    const int ksteps = K / BK;
    /* kDepth stages of loads in flight; the stage index is a compile-time constant (unrolled),
     * so the stages stay in registers */
    constexpr int kDepth = depth<BN>::value;
    stage<DT, BN> st[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; d++)
        if (d < ksteps) load_stage<DT, BN>(st[d], ti, M, K, m0, d, X, ldx, gather);
    for (int kt0 = 0; kt0 < ksteps; kt0 += kDepth) {
#pragma unroll
        for (int d = 0; d < kDepth; d++) {
            const int kt = kt0 + d;
            if (kt >= ksteps) break;
            __syncthreads(); /* the previous step's fragments are read */
            store_stage<DT, BN>(st[d], As, Bs);
            __syncthreads();
            if (kt + kDepth < ksteps)
                load_stage<DT, BN>(st[d], ti, M, K, m0, kt + kDepth, X, ldx, gather);
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4(a[mt], As + (wm * 32 + mt * 16 + (lane & 15)) * LDS + kk * 16 +
                                       (lane >> 4) * 8);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b[4];
                    ldsm_x4(b, Bs +
                                   (wn * (BN / 2) + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS +
                                   kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_bf16(acc[mt][2 * np], a[mt], b);
                        mma_bf16(acc[mt][2 * np + 1], a[mt], b + 2);
                    }
                }
            }
        }
    }
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int o = m0 + wm * 32 + mt * 16 + g + (e >> 1) * 8;
                int tr = wn * (BN / 2) + nt * 8 + 2 * tq + (e & 1);
                if (o < M && tr < ti.rows) {
                    float *y = Y + (size_t)(ti.row0 + tr) * ldy + o;
                    *y = accumulate ? *y + acc[mt][nt][e] : acc[mt][nt][e];
                }
            }
}

template <int BN>
int launch(const lily_dmat *W, const float *X, int ldx, int n, const int32_t *gather,
           const int32_t *tiles, const int32_t *d_ntiles, int ytiles, float *Y, int ldy, int acc,
           lily_cuda_stream st, lily_err *e) {
    dim3 grid((W->rows + BM - 1) / BM, ytiles);
#define LILY_GEMM_ARGS                                                                             \
    W->w, W->sb, W->w_stride, W->sb_stride, W->rows, W->cols, X, ldx, n, gather, tiles, d_ntiles, \
        Y, ldy, acc
    switch (W->dt) {
    case LILY_CW_Q4: gemm_kernel<LILY_CW_Q4, BN><<<grid, kThreads, 0, st>>>(LILY_GEMM_ARGS); break;
    case LILY_CW_Q8: gemm_kernel<LILY_CW_Q8, BN><<<grid, kThreads, 0, st>>>(LILY_GEMM_ARGS); break;
    default: gemm_kernel<LILY_CW_BF16, BN><<<grid, kThreads, 0, st>>>(LILY_GEMM_ARGS); break;
    }
#undef LILY_GEMM_ARGS
    LILY_CU_LAUNCHED(e);
    return 0;
}

} // namespace

extern "C" int lily_cuda_gemm(const lily_dmat *W, const float *X, int ldx, int n, float *Y,
                              int ldy, int accumulate, lily_cuda_stream st, lily_err *e) {
    if (W->n_mats != 1) return lily_fail(e, "gemm: a stack of %d matrices", W->n_mats);
    if (ldx % 4 || ((uintptr_t)X & 15))
        return lily_fail(e, "gemm: X must be 16-byte aligned with ldx %% 4 == 0 (ldx %d)", ldx);
    if (n < 1) return 0;
    constexpr int BN = 64;
    return launch<BN>(W, X, ldx, n, nullptr, nullptr, nullptr, (n + BN - 1) / BN, Y, ldy,
                      accumulate, st, e);
}

extern "C" int lily_cuda_gemm_grouped(const lily_dmat *W, const float *X, int ldx,
                                      const int32_t *gather, const int32_t *tiles,
                                      const int32_t *d_ntiles, int max_tiles, float *Y, int ldy,
                                      lily_cuda_stream st, lily_err *e) {
    if (ldx % 4 || ((uintptr_t)X & 15))
        return lily_fail(e, "gemm: X must be 16-byte aligned with ldx %% 4 == 0 (ldx %d)", ldx);
    if (max_tiles < 1) return 0;
    return launch<LILY_GEMM_GROUP_BN>(W, X, ldx, 0, gather, tiles, d_ntiles, max_tiles, Y, ldy, 0,
                                      st, e);
}
