/* Exact dense Q4 GEMM on wgmma (see gemm_wg.h). */
#include "backend/cuda/gemm_wg.h"

#include <cuda_fp16.h>
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/gemm_partial.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/swizzle.h"
#include "backend/cuda/tma.cuh"

namespace {

/* Block tile 256 rows x 128 tokens: each warpgroup owns 128 rows as two m64 tiles (two 64-register
 * accumulators), so a k-step stages 8 KB of codes and 32 KB of activation planes for 2 x 2 x 4
 * wgmma of 64 x 128 x 16 per warpgroup (~2048 tensor cycles per SM): ~20 bytes per cycle from L2
 * per SM. 128-row blocks would need twice that for the same math. */
constexpr int BM = 256, BK = 64, NS = 4, kThreads = 256;
/* stage for NT tokens: codes [BM][32 B] (16-byte halves swapped when bit 2 of the row is set),
 * scale words [BM][SBW] (SBW 4 with TMA: the row's words of k-steps 4j .. 4j + 3), then the hi
 * and lo planes of NT tokens x 64 k in core-matrix order: token groups of 8 at 128 bytes (SBO),
 * k chunks of 8 at NT x 16 bytes (LBO) */
template <int NT, int SBW = 1> struct wshape {
    static constexpr int OFF_SB = BM * 32, OFF_HI = OFF_SB + BM * 4 * SBW, PLANE = NT * BK * 2;
    static constexpr int OFF_LO = OFF_HI + PLANE, STAGE = OFF_LO + PLANE;
    /* + the tokens' multipliers and X rows, and the stages' mbarriers (TMA) */
    static constexpr int SMEM = NS * STAGE + NT * 8 + NS * 8;
    static constexpr int KCH = NT * 16;
    static_assert(OFF_HI % 1024 == 0 && STAGE % 1024 == 0 && PLANE % 1024 == 0,
                  "planes on 1 KB boundaries (the 128-byte swizzle's 8-row atoms)");
};

/* SWZ (what runs; lily_cuda_gemm_wg_swizzle(0) in tests): the planes in the 128-byte swizzled K-major layout instead
 * (swizzle.h): token t's 64 k values (128 bytes) are row t, its 16-byte chunk c at
 * lily_swz128(t, c); the descriptor of k slice s starts 32 s bytes into the plane (SBO 1 KB
 * between 8-token atoms). The kernel then aligns the stages to 1 KB (1 KB more shared memory). */

/* Shared-memory matrix descriptor, no swizzle: start, leading (k) and stride (token) offsets. */
__device__ __forceinline__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}
/* The same with the 128-byte swizzle (layout type 1 in bits 62-63; LBO unused for K-major). */
__device__ __forceinline__ uint64_t desc_sw128(const void *p, uint32_t sbo) {
    return desc(p, 16, sbo) | (1ull << 62);
}

/* D (64 x 128, fp32, 64 registers) += A (64 x 16, registers) x B (16 x 128, descriptor). */
__device__ __forceinline__ void wgmma_128(float *d, const uint32_t *a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* D (64 x 64, 32 registers) += A (registers) x B (16 x 64, descriptor). */
__device__ __forceinline__ void wgmma_64(float *d, const uint32_t *a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
/* Keeps the compiler from moving uses of an accumulator across the wgmma that is still writing
 * it (no instruction is emitted). */
__device__ __forceinline__ void fence_operand(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}
/* cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy:
 * each thread fences its landed copies before the barrier after which the wgmma read them */
__device__ __forceinline__ void proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Waits until at most N of this thread's cp.async groups are pending, fences its landed copies
 * for the async proxy, and publishes every thread's with a block barrier. */
template <int N> __device__ __forceinline__ void publish() {
    cp_wait<N>();
    proxy_fence();
    __syncthreads();
}

/* Physical column (0..63) of a group that the planes put at slice s, position p (0..15): the
 * order of gemm_q4.cu's exact A fragments. Slice s = 2h + m; lane q = (p % 8) / 2 holds code word
 * w = q + 4h; positions 2q, 2q + 1 are columns 8w + 2m, 8w + 2m + 4 and 2q + 8, 2q + 9 are
 * 8w + 2m + 1, 8w + 2m + 5. */
__host__ __device__ __forceinline__ int plane_col(int s, int p) {
    const int h = s >> 1, m = s & 1, q = (p & 7) >> 1, e = p & 1, hi8 = p >> 3;
    return 8 * (q + 4 * h) + 2 * m + hi8 + 4 * e;
}

/* Split words [n][K] -> the hi and lo planes [n][K] in plane order: one thread per 16-position
 * slice (two 16-byte stores per plane; its 16 words lie in 32 columns of one group). With tiles
 * (a grouped launch without gather: each row in at most one tile), only the rows of the valid
 * tiles, grid.y over the tile list, trows rows a tile at most; with d_ntiles alone (grouped, with
 * gather), every row unless the list is empty. */
template <bool ONE>
__global__ void planes_kernel(const uint32_t *__restrict__ words, size_t slices, int K,
                              const int32_t *__restrict__ tiles,
                              const int32_t *__restrict__ d_ntiles, int trows,
                              uint16_t *__restrict__ hi, uint16_t *__restrict__ lo) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d_ntiles && *d_ntiles == 0) return;
    if (tiles) {
        if ((int)blockIdx.y >= *d_ntiles) return;
        const int32_t *tl = tiles + 3 * blockIdx.y;
        const int rows = min(tl[2], trows);
        if (rows <= 0 || i >= (size_t)rows * (K / 16)) return;
        i += (size_t)tl[1] * (K / 16);
    }
    if (i >= slices) return;
    const size_t base = i * 16, row = base / K;
    const int c = (int)(base % K), s = (c >> 4) & 3;
    const uint32_t *wr = words + row * K + (c & ~63);
    uint32_t h[8], l[8];
#pragma unroll
    for (int p = 0; p < 16; p += 2) {
        const uint32_t w0 = wr[plane_col(s, p)], w1 = wr[plane_col(s, p + 1)];
        h[p >> 1] = (w0 & 0xffffu) | (w1 << 16);
        l[p >> 1] = (w0 >> 16) | (w1 & 0xffff0000u);
    }
    uint4 *dh = (uint4 *)(hi + base), *dl = (uint4 *)(lo + base);
    dh[0] = make_uint4(h[0], h[1], h[2], h[3]);
    dh[1] = make_uint4(h[4], h[5], h[6], h[7]);
    if (ONE) return; /* the one-pass products read the hi plane alone */
    dl[0] = make_uint4(l[0], l[1], l[2], l[3]);
    dl[1] = make_uint4(l[4], l[5], l[6], l[7]);
}

struct wg_args {
    const uint8_t *w;
    const uint32_t *sb;
    size_t w_stride, sb_stride; /* grouped: between experts */
    int M, K, n;
    const int32_t *gather, *tiles, *d_ntiles; /* grouped: tiles (expert, first row, rows) */
    const uint16_t *hi, *lo;                  /* planes [n][K] */
    const float *mul;
    float *Y;
    int ldy, accumulate;
    int kper; /* dense split-K: blockIdx.z runs k-steps [z kper, (z + 1) kper) */
    float *P; /* split > 1: partial sums [split][n][M] (gemm_partial.h), else nullptr */
};

/* LOOP 4 (TMA): a stage's codes [M][K / 2] bytes (box 32 x 256, the 32-byte swizzle: exactly
 * the half swap on bit 2 of the row), scale words [M][KG] (box 4 x 256) and planes [2][n][K]
 * (box 64 x NT x 2, the 128-byte swizzle: the SWZ layout, lo one PLANE after hi) */
struct wg_maps {
    CUtensorMap codes, sb, planes;
};

/* Dense: grid (token blocks, row blocks, k splits). Grouped (a.tiles): grid (row blocks, tiles), tile y is
 * tiles[y] when y < *d_ntiles, its X rows through a.gather, its Y rows in tile order. ONE: one
 * product per weight, against the hi plane alone (the stages keep their layout; the lo plane's
 * place stays unused). */
template <int NT, int LOOP, bool SWZ, bool ONE>
__global__ void __launch_bounds__(kThreads, 1)
    wg_kernel(const wg_args a, const __grid_constant__ wg_maps mp) {
    constexpr bool TMA = LOOP == 4;
    static_assert(!TMA || SWZ, "the TMA copies land in the swizzled layout");
    using S = wshape<NT, TMA ? 4 : 1>;
    constexpr int STAGE = S::STAGE, KCH = S::KCH;
    extern __shared__ __align__(128) uint8_t smem_raw[];
    uint8_t *smem =
        smem_raw + (SWZ ? lily_swz128_pad((uint32_t)__cvta_generic_to_shared(smem_raw)) : 0);
    float *s_mul = (float *)(smem + NS * STAGE);
    int *s_xrow = (int *)(s_mul + NT);           /* X row of token t, -1: none */
    uint64_t *s_bar = (uint64_t *)(s_xrow + NT); /* TMA: stage s landed */
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int wg = tid >> 7, wi = (tid >> 5) & 3;
    const uint8_t *W = a.w;
    const uint32_t *SB = a.sb;
    int row0, rows, m0;
    if (a.tiles) {
        if ((int)blockIdx.y >= *a.d_ntiles) return;
        const int32_t *tl = a.tiles + 3 * blockIdx.y;
        W += (size_t)tl[0] * a.w_stride;
        SB += (size_t)tl[0] * a.sb_stride;
        row0 = tl[1], rows = min(tl[2], NT), m0 = blockIdx.x * BM;
    } else {
        row0 = blockIdx.x * NT, rows = min(NT, a.n - row0), m0 = blockIdx.y * BM;
    }
    const int M = a.M, K = a.K, KG = K / BK;
    /* this block's k-steps: kt0 .. kt0 + NK - 1 (the loops below count from 0) */
    const int kt0 = a.P ? (int)blockIdx.z * a.kper : 0, NK = a.P ? min(a.kper, KG - kt0) : KG;
    const size_t rbytes = (size_t)K / 2;
    if (tid < NT) {
        const int xr = tid < rows ? (a.gather ? a.gather[row0 + tid] : row0 + tid) : -1;
        s_xrow[tid] = xr;
        s_mul[tid] = xr >= 0 ? a.mul[xr] : 0.f;
    }
    if (TMA && tid == 0) {
        for (int i = 0; i < NS; i++)
            lily_mbar_init(s_bar + i, 1);
        lily_mbar_init_fence();
    }
    __syncthreads();
    /* The planes' copies: a warp's 32 pieces are k chunks c, c + 1 (c even: one 32-byte sector
     * of each token) of 16 consecutive tokens, so every global sector a copy touches is used
     * whole and each quarter warp writes 128 distinct bytes of shared memory (8 tokens of one
     * chunk, or 8 swizzled chunks). Piece j's source offset (without the k-step) and whether its
     * token exists are set once. */
    constexpr int PP = 8 * NT / kThreads, TW = NT / 16; /* pieces a thread, warps a chunk pair */
    auto pt = [&](int j) { return ((tid + kThreads * j) >> 5) % TW * 16 + (lane & 15); };
    auto pc = [&](int j) { return ((tid + kThreads * j) >> 5) / TW * 2 + (lane >> 4); };
    uint32_t xoff[PP], okm = 0;
#pragma unroll
    for (int j = 0; j < PP; j++) {
        const int xr = s_xrow[pt(j)];
        xoff[j] = xr >= 0 ? (uint32_t)xr * (uint32_t)K + (uint32_t)pc(j) * 8u : 0u;
        okm |= (xr >= 0 ? 1u : 0u) << j;
    }

    auto load = [&](int kr, int sl) {
        uint8_t *st = smem + sl * STAGE;
        const int kt = kt0 + kr;
        if constexpr (TMA) { /* one thread, three copies, counted in bytes on the barrier */
            if (tid == 0) {
                uint64_t *bar = s_bar + sl;
                lily_mbar_expect(bar, ONE ? S::OFF_LO : STAGE);
                lily_tma_2d(st, &mp.codes, kt * 32, m0, bar);
                lily_tma_2d(st + S::OFF_SB, &mp.sb, kt & ~3, m0, bar);
                lily_tma_3d(st + S::OFF_HI, &mp.planes, kt * BK, row0, 0, bar);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 2; j++) { /* codes: two 16-byte halves per thread */
                const int c = tid + kThreads * j, r = c >> 1, part = c & 1;
                const bool ok = m0 + r < M;
                cp_async16(st + lily_swz32(r, part),
                           ok ? W + (size_t)(m0 + r) * rbytes + (size_t)kt * 32 + part * 16 : W,
                           ok);
            }
            { /* scale words: one row per thread */
                const bool ok = m0 + tid < M;
                cp_async4(st + S::OFF_SB + tid * 4, ok ? SB + (size_t)(m0 + tid) * KG + kt : SB,
                          ok);
            }
            /* planes: piece j of this thread is 16-byte k chunk pc(j) of token pt(j) (above) */
#pragma unroll
            for (int j = 0; j < PP; j++) {
                const bool ok = (okm >> j) & 1;
                const int t = pt(j), c = pc(j);
                const size_t off = (size_t)xoff[j] + (size_t)kt * BK;
                uint8_t *d = st + (SWZ ? lily_swz128(t, c) : c * KCH + t * 16);
                cp_async16(d + S::OFF_HI, ok ? a.hi + off : a.hi, ok);
                if (!ONE) cp_async16(d + S::OFF_LO, ok ? a.lo + off : a.lo, ok);
            }
        }
    };

    constexpr int NA = NT / 2; /* accumulator registers per m64 tile */
    float acc[2][NA];
#pragma unroll
    for (int i = 0; i < NA; i++)
        acc[0][i] = acc[1][i] = 0.f;

    /* the lane's rows in the block: tile u (0, 1) of its warpgroup, rows ru and ru + 8 */
    const int rb = wg * 128 + wi * 16 + g;
    /* the A registers of k-step kt (slot kt % NS): [tile][slice][register] */
    auto dequant = [&](int kt, uint32_t(&af)[2][4][4]) {
        const uint8_t *st = smem + (kt % NS) * STAGE;
        const uint32_t *sSB = (const uint32_t *)(st + S::OFF_SB);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int r0 = rb + 64 * u;
            uint32_t sc[2], bi[2];
            const int w = TMA ? (kt0 + kt) & 3 : 0, SBW = TMA ? 4 : 1;
            sb_f16(sSB[r0 * SBW + w], &sc[0], &bi[0]);
            sb_f16(sSB[(r0 + 8) * SBW + w], &sc[1], &bi[1]);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t v[2];
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const int r = r0 + 8 * hr;
                    v[hr] = *(const uint32_t *)(st + lily_swz32(r, h) + 4 * q);
                }
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    af[u][2 * h + m][0] = dq4h(v[0], 2 * m, sc[0], bi[0]);
                    af[u][2 * h + m][1] = dq4h(v[1], 2 * m, sc[1], bi[1]);
                    af[u][2 * h + m][2] = dq4h(v[0], 2 * m + 1, sc[0], bi[0]);
                    af[u][2 * h + m][3] = dq4h(v[1], 2 * m + 1, sc[1], bi[1]);
                }
            }
        }
    };
    /* k-step kt's 2 x 4 x 2 wgmma (tiles, slices, hi / lo planes) as one commit group */
    auto issue = [&](int kt, const uint32_t(&af)[2][4][4]) {
        const uint8_t *st = smem + (kt % NS) * STAGE;
        wg_fence();
#pragma unroll
        for (int i = 0; i < NA; i++)
            fence_operand(acc[0][i]), fence_operand(acc[1][i]);
#pragma unroll
        for (int sl = 0; sl < 4; sl++) {
            const uint64_t dh = SWZ ? desc_sw128(st + S::OFF_HI + 32 * sl, 1024)
                                    : desc(st + S::OFF_HI + 2 * sl * KCH, KCH, 128);
            const uint64_t dl = SWZ ? desc_sw128(st + S::OFF_LO + 32 * sl, 1024)
                                    : desc(st + S::OFF_LO + 2 * sl * KCH, KCH, 128);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if constexpr (NT == 128) {
                    wgmma_128(acc[u], af[u][sl], dh);
                    if (!ONE) wgmma_128(acc[u], af[u][sl], dl);
                } else {
                    wgmma_64(acc[u], af[u][sl], dh);
                    if (!ONE) wgmma_64(acc[u], af[u][sl], dl);
                }
            }
        }
        wg_commit();
    };
    auto retire = [&]() {
        wg_wait0();
#pragma unroll
        for (int i = 0; i < NA; i++)
            fence_operand(acc[0][i]), fence_operand(acc[1][i]);
    };
    /* the first nst stages in flight, one cp.async group each (empty past the last k-step) */
    auto prime = [&](int nst) {
#pragma unroll
        for (int s = 0; s < nst; s++) {
            if (s < NK) load(s, s);
            cp_commit();
        }
    };
    if constexpr (LOOP == 0) {
        prime(NS - 1);
        for (int kt = 0; kt < NK; kt++) {
            publish<NS - 2>(); /* stage kt landed for all; every wgmma of step kt - 1 completed */
            if (kt + NS - 1 < NK) load(kt + NS - 1, (kt + NS - 1) % NS);
            cp_commit();
            uint32_t af[2][4][4];
            dequant(kt, af);
            issue(kt, af);
            retire();
        }
    } else {
        /* step kt + 1's dequantization runs while step kt's wgmma do, the two sets of A
         * registers alternating between steps */
        auto pipelined = [&](auto step) {
            uint32_t a0[2][4][4], a1[2][4][4];
            dequant(0, a0);
            for (int kt = 0; kt < NK; kt += 2) {
                step(kt, a0, a1);
                if (kt + 1 < NK) step(kt + 1, a1, a0);
            }
        };
        using areg = uint32_t[2][4][4];
        if constexpr (TMA) {
            /* As 2 with the stages copied by TMA: thread 0 fills a slot after the barrier that
             * ends the step which freed it, and each warp waits on the stage's mbarrier (phase
             * parity: the slot's use count) instead of a block barrier before dequantizing */
            if (tid == 0)
                for (int i = 0; i < NS && i < NK; i++)
                    load(i, i);
            lily_mbar_wait(s_bar, 0);
            pipelined([&](int kt, const areg &cur, areg &nxt) {
                issue(kt, cur);
                if (kt + 1 < NK) {
                    lily_mbar_wait(s_bar + (kt + 1) % NS, ((kt + 1) / NS) & 1);
                    dequant(kt + 1, nxt);
                }
                retire();
                __syncthreads();
                if (kt + NS < NK) load(kt + NS, kt % NS);
            });
        } else if constexpr (LOOP >= 2) {
            /* One barrier a step: after retiring step kt, every wgmma of step kt has retired in
             * both warpgroups (its slot takes stage kt + NS) and stage kt + 2 has landed for all
             * (so step kt + 1 dequantizes without waiting). 2: the slot is refilled right after
             * that barrier; 3 (late): after the next step's wgmma are issued, so only the
             * barrier sits between retiring one step and starting the next. cp.async groups:
             * NS (late: NS - 1) in the prologue and one a step, so stage kt + 2 has landed when
             * at most NS - 3 are pending. */
            constexpr bool late = LOOP == 3;
            static_assert(NS >= 4, "three stages ahead of the one in use");
            prime(late ? NS - 1 : NS);
            publish<late ? NS - 3 : NS - 2>();
            pipelined([&](int kt, const areg &cur, areg &nxt) {
                issue(kt, cur);
                if (late) {
                    if (kt + NS - 1 < NK) load(kt + NS - 1, (kt + NS - 1) % NS);
                    cp_commit();
                }
                if (kt + 1 < NK) dequant(kt + 1, nxt);
                retire();
                publish<NS - 3>();
                if (!late) {
                    if (kt + NS < NK) load(kt + NS, kt % NS);
                    cp_commit();
                }
            });
        } else {
            /* two barriers a step (B: stage kt + 1 landed for all; E: every wgmma of step kt
             * retired, so its slot takes stage kt + NS) */
            prime(NS);
            publish<NS - 1>();
            pipelined([&](int kt, const areg &cur, areg &nxt) {
                issue(kt, cur);
                if (kt + 1 < NK) {
                    publish<NS - 2>(); /* B */
                    dequant(kt + 1, nxt);
                }
                retire();
                __syncthreads(); /* E */
                if (kt + NS < NK) load(kt + NS, kt % NS);
                cp_commit();
            });
        }
    }
    cp_wait<0>();
    /* The output tile goes through shared memory (the stages are free once every warp is past
     * its last wgmma) so that each token's 256 outputs leave as 16-byte stores. D of tile u:
     * register 4j + e is row rb + 64u + 8 (e / 2), token 8j + 2q + (e % 2); a row of LDT floats
     * a token (LDT = 4 mod 32: the lanes' 8 rows x 4 tokens hit 32 banks). */
    constexpr int LDT = BM + 4;
    static_assert(NT * LDT * 4 <= NS * STAGE, "the output tile fits in the stages");
    float *sy = (float *)smem;
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int j = 0; j < NT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = 8 * j + 2 * q + (e & 1);
                sy[t * LDT + rb + 64 * u + 8 * (e >> 1)] = acc[u][4 * j + e] * s_mul[t];
            }
    __syncthreads();
    float *out = a.P ? a.P + ((size_t)blockIdx.z * a.n + row0) * M : a.Y + (size_t)row0 * a.ldy;
    const size_t ld = a.P ? (size_t)M : (size_t)a.ldy;
    const bool add = !a.P && a.accumulate;
    const bool vec = ((uintptr_t)out % 16 == 0) && ld % 4 == 0;
    const int o = m0 + 4 * (tid & 63);
    for (int t = tid >> 6; t < rows; t += kThreads / 64) {
        const float *v = sy + t * LDT + 4 * (tid & 63);
        float *y = out + (size_t)t * ld + o;
        if (vec && o + 3 < M) {
            float4 r = *(const float4 *)v;
            if (add) {
                const float4 w = *(const float4 *)y;
                r.x = w.x + r.x, r.y = w.y + r.y, r.z = w.z + r.z, r.w = w.w + r.w;
            }
            *(float4 *)y = r;
        } else {
            for (int i = 0; i < 4 && o + i < M; i++)
                y[i] = add ? y[i] + v[i] : v[i];
        }
    }
}

uint16_t *g_planes = nullptr;
size_t g_cap = 0; /* elements per plane */

/* The split words of X's nx rows as hi / lo planes (module buffer, grown outside any capture);
 * grouped (d_ntiles set): nothing when the tile list is empty, and with tiles (no gather) only
 * the rows of the valid tiles. */
int make_planes(const float *X, int ldx, int nx, int K, const int32_t *tiles,
                const int32_t *d_ntiles, int max_tiles, const uint16_t **hi, const uint16_t **lo,
                const float **mul, lily_cuda_stream st, lily_err *e) {
    const uint32_t *words;
    if (lily_cuda_xsplit(X, ldx, nx, K, &words, mul, st, e)) return -1;
    const size_t total = (size_t)nx * K;
    if (total > g_cap) {
        LILY_CU_TRY(cudaStreamSynchronize((cudaStream_t)st), e);
        cudaFree(g_planes);
        g_planes = nullptr, g_cap = 0;
        const size_t c = (total + total / 4 + 1024) & ~(size_t)63; /* lo plane 16-byte aligned */
        LILY_CU_TRY(cudaMalloc(&g_planes, c * 2 * 2), e);
        g_cap = c;
    }
    const size_t slices = total / 16; /* K is a multiple of 64 */
    /* tiles: the grouped tiles' rows only (64 a tile at most) */
    const size_t span = tiles ? (size_t)64 * (K / 16) : slices;
    const dim3 grid((unsigned)((span + 255) / 256), tiles ? (unsigned)max_tiles : 1u);
    if (lily_cuda_gemm_exact())
        planes_kernel<false><<<grid, 256, 0, (cudaStream_t)st>>>(words, slices, K, tiles, d_ntiles,
                                                                 64, g_planes, g_planes + g_cap);
    else
        planes_kernel<true><<<grid, 256, 0, (cudaStream_t)st>>>(words, slices, K, tiles, d_ntiles,
                                                                64, g_planes, g_planes + g_cap);
    LILY_CU_LAUNCHED(e);
    *hi = g_planes, *lo = g_planes + g_cap;
    return 0;
}

template <int NT, int LOOP, bool SWZ, bool ONE>
int launch_p(const wg_args &a, const wg_maps &mp, dim3 grid, lily_cuda_stream st, lily_err *e) {
    /* SWZ: room to align to 1 KB */
    constexpr int smem = wshape < NT, LOOP == 4 ? 4 : 1 > ::SMEM + (SWZ ? 1024 : 0);
    static bool attr = false; /* benign race: the call is idempotent */
    if (!attr) {
        LILY_CU_TRY(cudaFuncSetAttribute(wg_kernel<NT, LOOP, SWZ, ONE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                    e);
        attr = true;
    }
    if (grid.y > 65535) return lily_fail(e, "gemm_wg: grid of %u x %u blocks", grid.x, grid.y);
    wg_kernel<NT, LOOP, SWZ, ONE><<<grid, kThreads, smem, (cudaStream_t)st>>>(a, mp);
    LILY_CU_LAUNCHED(e);
    return 0;
}

int g_force_split = 0; /* > 0: the dense kernel's split-K factor (tests) */

/* The k-loop forms that run (the kernel template's LOOP): 4, the stages copied by TMA, for dense
 * launches whose maps apply (K a multiple of 256, 16-byte aligned weights); 2, pipelined with
 * cp.async copies and one barrier a step, for the rest (the grouped launches included). Planes
 * 128-byte swizzled, dense blocks of 128 tokens (grouped: 64). The other forms of the template
 * (LOOP 0, 1, 3; SWZ false; 64-token dense blocks) were measured slower (bench/NOTES-cuda.md)
 * and are not instantiated. */
template <int NT>
int launch(const wg_args &a, const wg_maps &mp, bool tma, dim3 grid, lily_cuda_stream st,
           lily_err *e) {
    if (lily_cuda_gemm_exact())
        return tma ? launch_p<NT, 4, true, false>(a, mp, grid, st, e)
                   : launch_p<NT, 2, true, false>(a, mp, grid, st, e);
    return tma ? launch_p<NT, 4, true, true>(a, mp, grid, st, e)
               : launch_p<NT, 2, true, true>(a, mp, grid, st, e);
}

/* The TMA maps of a dense launch (wg_maps): 0, 1 = this launch cannot use them (it runs form
 * 2), -1 = error. */
int tma_maps(const lily_dmat *W, const wg_args &a, int nt, wg_maps *mp, lily_err *e) {
    const int K = W->cols, M = W->rows, KG = K / BK;
    if (K % 256 || ((uintptr_t)W->w | (uintptr_t)W->sb | (uintptr_t)a.hi) % 16 ||
        (size_t)(a.lo - a.hi) % 8)
        return 1;
    const uint64_t cd[2] = {(uint64_t)K / 2, (uint64_t)M}, cs[1] = {(uint64_t)K / 2};
    const uint32_t cb[2] = {32, BM};
    const uint64_t sd[2] = {(uint64_t)KG, (uint64_t)M}, ss[1] = {(uint64_t)KG * 4};
    const uint32_t sbx[2] = {4, BM};
    const uint64_t pd[3] = {(uint64_t)K, (uint64_t)a.n, 2};
    const uint64_t ps[2] = {(uint64_t)K * 2, (uint64_t)(a.lo - a.hi) * 2};
    const uint32_t pb[3] = {BK, (uint32_t)nt, lily_cuda_gemm_exact() ? 2u : 1u};
    if (lily_tma_map(&mp->codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, W->w, cd, cs, cb,
                     CU_TENSOR_MAP_SWIZZLE_32B, e) ||
        lily_tma_map(&mp->sb, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, W->sb, sd, ss, sbx,
                     CU_TENSOR_MAP_SWIZZLE_NONE, e) ||
        lily_tma_map(&mp->planes, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, a.hi, pd, ps, pb,
                     CU_TENSOR_MAP_SWIZZLE_128B, e))
        return -1;
    return 0;
}

int check(const lily_dmat *W, int nx, lily_err *e) {
    if (W->dt != LILY_CW_Q4) return lily_fail(e, "gemm_wg: Q4 weights only (type %d)", W->dt);
    if ((size_t)nx * (size_t)W->cols > UINT32_MAX) /* the kernel's 32-bit plane offsets */
        return lily_fail(e, "gemm_wg: %d rows of %d columns", nx, W->cols);
    if (W->cols % BK || W->cols < BK)
        return lily_fail(e, "gemm_wg: %d columns (a multiple of 64)", W->cols);
    return 0;
}

} // namespace

extern "C" int lily_cuda_gemm_wg_dense_nt(int M, int n) {
    (void)M, (void)n; /* 128-token blocks: 64 measured no faster (bench/NOTES-cuda.md) */
    return 128;
}

extern "C" void lily_cuda_gemm_wg_force_split(int split) {
    g_force_split = split;
}

extern "C" int lily_cuda_gemm_wg(const lily_dmat *W, const float *X, int ldx, int n, float *Y,
                                 int ldy, int accumulate, lily_cuda_stream st, lily_err *e) {
    if (W->n_mats != 1) return lily_fail(e, "gemm_wg: a stack of %d matrices", W->n_mats);
    if (check(W, n, e)) return -1;
    if (n < 1 || W->rows < 1) return 0;
    wg_args a;
    a.w = W->w, a.sb = W->sb, a.w_stride = 0, a.sb_stride = 0;
    a.M = W->rows, a.K = W->cols, a.n = n;
    a.gather = a.tiles = a.d_ntiles = nullptr;
    if (make_planes(X, ldx, n, W->cols, nullptr, nullptr, 0, &a.hi, &a.lo, &a.mul, st, e))
        return -1;
    a.Y = Y, a.ldy = ldy, a.accumulate = accumulate;
    const int nt = lily_cuda_gemm_wg_dense_nt(W->rows, n);
    const int tb = (n + nt - 1) / nt, rb = (W->rows + BM - 1) / BM, KG = W->cols / BK;
    /* split-K for grids of at most half a wave (one block per SM): enough splits for ~132
     * blocks, at most 8, each >= 4 k-steps, no k range left empty */
    int split = g_force_split > 0    ? g_force_split
                : 2 * tb * rb <= 132 ? (132 + tb * rb - 1) / (tb * rb)
                                     : 1;
    if (g_force_split <= 0) split = min(split, min(8, KG / 4));
    split = max(1, min(split, KG));
    a.kper = (KG + split - 1) / split;
    split = (KG + a.kper - 1) / a.kper;
    a.P = nullptr;
    if (split > 1 && !(a.P = lily_cuda_partials((size_t)split * n * W->rows, st, e))) return -1;
    const dim3 grid((unsigned)tb, (unsigned)rb, (unsigned)split);
    wg_maps mp = {};
    const int r = tma_maps(W, a, nt, &mp, e);
    if (r < 0 || launch<128>(a, mp, r == 0, grid, st, e)) return -1;
    if (split == 1) return 0;
    return lily_cuda_partials_reduce(a.P, split, n, W->rows, Y, ldy, accumulate, st, e);
}

extern "C" int lily_cuda_gemm_wg_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                                         const int32_t *gather, const int32_t *tiles,
                                         const int32_t *d_ntiles, int max_tiles, float *Y, int ldy,
                                         lily_cuda_stream st, lily_err *e) {
    if (check(W, nx, e)) return -1;
    if (max_tiles < 1 || W->rows < 1 || nx < 1) return 0;
    wg_args a;
    a.w = W->w, a.sb = W->sb, a.w_stride = W->w_stride, a.sb_stride = W->sb_stride;
    a.M = W->rows, a.K = W->cols, a.n = nx;
    a.gather = gather, a.tiles = tiles, a.d_ntiles = d_ntiles;
    /* without gather, the planes of the tiles' rows alone (the kernel reads no other: a token
     * past the tile's rows is zero-filled) */
    if (make_planes(X, ldx, nx, W->cols, gather ? nullptr : tiles, d_ntiles, max_tiles, &a.hi,
                    &a.lo, &a.mul, st, e))
        return -1;
    a.Y = Y, a.ldy = ldy, a.accumulate = 0, a.kper = 0, a.P = nullptr;
    const wg_maps mp = {}; /* the gathered X rows are not a tile TMA can copy: form 2 */
    return launch<64>(a, mp, false, dim3((unsigned)((W->rows + BM - 1) / BM), (unsigned)max_tiles),
                      st, e);
}
