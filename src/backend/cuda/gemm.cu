/* Tensor-core prefill GEMM with fused dequantization (see gemm.h). */
#include "backend/cuda/gemm.h"

#include "backend/cuda/common.cuh"

namespace {

constexpr int BM = 128, BK = 64, LDS = BK + 8; /* padded rows: conflict-free ldmatrix */
constexpr int kThreads = 256;

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Raw global data of one thread's share of a k-step: 32 weights of one row, and X float4s. */
template <int DT, int BN> struct stage {
    static constexpr int WV = DT == LILY_CW_Q4 ? 1 : DT == LILY_CW_Q8 ? 2 : 4; /* uint4 of codes */
    static constexpr int XV = BN * BK / 4 / kThreads;                          /* float4 of X */
    uint4 w[WV];
    uint32_t sb;
    float4 x[XV];
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
    for (int i = 0; i < stage<DT, BN>::XV; i++) {
        int f = t + i * kThreads, tr = f / (BK / 4), c4 = f % (BK / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (tr < ti.rows) {
            int row = ti.row0 + tr;
            if (gather) row = gather[row];
            v = *(const float4 *)(X + (size_t)row * ldx + (size_t)kt * BK + c4 * 4);
        }
        s.x[i] = v;
    }
}

/* Dequantizes the staged codes into As (bf16) and converts X into Bs. */
template <int DT, int BN>
__device__ __forceinline__ void store_stage(const stage<DT, BN> &s, uint16_t *As, uint16_t *Bs) {
    const int t = threadIdx.x, r = t >> 1, half = t & 1;
    uint4 *dst = (uint4 *)(As + r * LDS + half * 32);
    if (DT == LILY_CW_Q4) {
        float sc = lo_bf16(s.sb), bi = hi_bf16(s.sb);
        const uint32_t ws[4] = {s.w[0].x, s.w[0].y, s.w[0].z, s.w[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = ws[i];
            uint32_t p[4];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float a = fmaf(sc, (float)((v >> (8 * m)) & 15u), bi);
                float b = fmaf(sc, (float)((v >> (8 * m + 4)) & 15u), bi);
                p[m] = pack_bf16x2(a, b);
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
                p[2 * wi] = pack_bf16x2(fmaf(sc, (float)(v & 255u), bi),
                                        fmaf(sc, (float)((v >> 8) & 255u), bi));
                p[2 * wi + 1] = pack_bf16x2(fmaf(sc, (float)((v >> 16) & 255u), bi),
                                            fmaf(sc, (float)(v >> 24), bi));
            }
            dst[2 * i] = make_uint4(p[0], p[1], p[2], p[3]);
            dst[2 * i + 1] = make_uint4(p[4], p[5], p[6], p[7]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) dst[i] = s.w[i];
    }
#pragma unroll
    for (int i = 0; i < stage<DT, BN>::XV; i++) {
        int f = t + i * kThreads, tr = f / (BK / 4), c4 = f % (BK / 4);
        float4 v = s.x[i];
        *(uint2 *)(Bs + tr * LDS + c4 * 4) =
            make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
}

/* grid (ceil(M/BM), token tiles). Plain: tile y covers tokens y*BN.. of n. Grouped: tile y is
 * tiles[y] when y < *d_ntiles. */
template <int DT, int BN>
__global__ void __launch_bounds__(kThreads)
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
    stage<DT, BN> st;
    load_stage<DT, BN>(st, ti, M, K, m0, 0, X, ldx, gather);
    for (int kt = 0; kt < ksteps; kt++) {
        __syncthreads(); /* the previous step's fragments are read */
        store_stage<DT, BN>(st, As, Bs);
        __syncthreads();
        if (kt + 1 < ksteps) load_stage<DT, BN>(st, ti, M, K, m0, kt + 1, X, ldx, gather);
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
                ldsm_x4(b, Bs + (wn * (BN / 2) + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS +
                               kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma_bf16(acc[mt][2 * np], a[mt], b);
                    mma_bf16(acc[mt][2 * np + 1], a[mt], b + 2);
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
