/* Skinny grouped Q4 GEMM (see gemm_skinny.h).
 *
 * Fragment order. mma.sync m16n8k16 gives lane (g = lane / 4, q = lane % 4) the A elements
 * (rows g, g + 8) x (k = 2q, 2q + 1, 2q + 8, 2q + 9) of a 16-wide k slice and the B elements
 * (k = 2q, 2q + 1, 2q + 8, 2q + 9) x (token g). The k order inside a group is free as long as A
 * and B agree, so lane q takes the 16 consecutive columns 16q .. 16q + 15 of each 64-column group
 * (code words w0 = columns 16q..16q+7 and w1 = 16q+8..16q+15 of its rows: one 8-byte load per
 * row), and slice s (0..3) of the group is
 *     k = 2q, 2q + 1   <- columns 16q + s, 16q + s + 4      (nibbles s, s + 4 of w0)
 *     k = 2q + 8, 2q + 9 <- columns 16q + 8 + s, 16q + 12 + s (nibbles s, s + 4 of w1)
 * so A register (w >> 4s) & 0x000F000F is the pair as fp16 subnormals (q * 2^-24, q' * 2^-24).
 * The prep kernel writes the B words of token row t in the same order: for group G, lane q, slice
 * s one 16-byte word {hi(b0), hi(b1), lo(b0), lo(b1)} at uint4 index t * K / 4 + 16 G + 4 s + q,
 * b0 = (x[16q + s], x[16q + s + 4]), b1 = (x[16q + 8 + s], x[16q + 12 + s]) of the group: the 4
 * lanes of a token read 64 contiguous bytes per slice (one cache line of L1 wavefronts per token
 * and load; with 4 q + s the 4 lanes' words were 64 bytes apart, two lines per token). */
#include "backend/cuda/gemm_skinny.h"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/gemm_split.h"

namespace {

constexpr int kWarps = 4;              /* warps per block, stacked along the weight rows */
constexpr int kMT = 2;                 /* 16-row slabs per warp */
constexpr int kBM = kWarps * kMT * 16; /* weight rows per block */
/* Quantization groups of codes in flight per lane (the ring). ptxas, sm_90a (CUDA 12), 2 slabs
 * per warp: a ring of 2 takes 160 registers, no spill, at 3 blocks (12 warps) per SM: ~24 KB of
 * codes in flight per SM, issued ~2 groups of work (~900 cycles at 12 warps) ahead of their use.
 * A ring of 3 needs 176-188 registers (2 blocks per SM, spills at 168); 4 took 244. */
constexpr int kRing = 2;
constexpr int kMinBlocks = 3;
constexpr int kBN = LILY_GEMM_SKINNY_BN;
/* CP (the default): each warp copies its rows' codes into its own shared-memory stages with
 * cp.async (4 groups = 128 bytes per row and stage, kStages stages: one 128-byte line per row
 * and 8 lanes), instead of the register ring above. Stage rows are 128 bytes, the 32-byte group
 * chunks XOR-swizzled by (row & 3) so a warp's 8-byte reads of 8 rows take 2 wavefronts. With it,
 * the B (token) lines of the next group are prefetched into L1 (sk_args::pf): the ring kernel
 * stalled on long scoreboard; alone neither change helped, together they did. */
constexpr int kStages = 4;
constexpr int kStageBytes = kMT * 16 * 128;             /* one warp's stage: 4 KB */
constexpr int kCpSmem = kWarps * kStages * kStageBytes; /* per block: 64 KB */

struct sk_args {
    const uint8_t *w;   /* codes of expert 0 */
    const uint32_t *sb; /* scale/bias words of expert 0 */
    size_t w_stride, sb_stride;
    int M, K, kg4;    /* kg4: xs row stride (groups rounded up to 4) */
    const uint4 *xp;  /* prepped B words [nx][K / 4] */
    const float *xs;  /* group sums [nx][kg4] */
    const float *mul; /* row multipliers [nx] (gemm_split.h) */
    const int32_t *gather, *tiles, *d_ntiles;
    float *Y;
    int ldy;
    int pf; /* B prefetch into L1 this many groups ahead (0: none) */
    /* a pair (gate and up of the same experts): row blocks >= nb run w2 / sb2 into Y2 */
    const uint8_t *w2;
    const uint32_t *sb2;
    float *Y2;
    int nb;
};

/* Streaming 8-byte load of read-once codes (no L1 allocation). */
__device__ __forceinline__ uint2 ldg_stream8(const void *p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

/* Nibbles j and j + 4 of code word v as an fp16 pair: subnormals q * 2^-24 (exact), or (SUB)
 * (1024 + q) - 1024 = q (exact). */
template <bool SUB> __device__ __forceinline__ uint32_t apair(uint32_t v, int j) {
    const uint32_t m = (v >> (4 * j)) & 0x000F000Fu;
    if constexpr (SUB) {
        const uint32_t k1024 = 0x64006400u, u = m | k1024;
        const __half2 r = __hsub2(*(const __half2 *)&u, *(const __half2 *)&k1024);
        return *(const uint32_t *)&r;
    } else {
        return m;
    }
}

/* One warp: weight rows mw .. mw + 16 kMT - 1 (clamped to M - 1 for the loads, not stored) of
 * expert codes W / words SB, against NT 8-token tiles of the tile (rows tokens from row0). */
template <int NT, bool SUB, bool CP, bool ONE>
__device__ __forceinline__ void run(const sk_args &a, const uint8_t *W, const uint32_t *SB,
                                    float *Y, int row0, int rows, int mw, int lane, uint8_t *sm) {
    const int g = lane >> 2, q = lane & 3;
    const int K = a.K, KG = K >> 6, M = a.M;
    /* CP: stage t (groups 4 t .. 4 t + 3) into slot t % kStages; lane copies 16-byte pieces
     * c = lane + 32 j of the warp's 32 rows x 128 bytes (row c / 8, piece c % 8: 8 lanes per
     * row, one 128-byte line each). Every lane commits a group per stage, empty or not. */
    auto issue = [&](int t) {
        if (CP && 4 * t < KG) {
            uint8_t *slot = sm + (t % kStages) * kStageBytes;
#pragma unroll
            for (int j = 0; j < kMT * 16 * 8 / 32; j++) {
                const int c = lane + 32 * j, r = c >> 3, p = c & 7;
                const int row = min(mw + r, M - 1);
                const bool ok = 4 * t + (p >> 1) < KG;
                const uint8_t *src = W + (size_t)row * (K / 2) + (ok ? 128 * t + 16 * p : 0);
                cp_async16(slot + r * 128 + ((((p >> 1) ^ r) & 3) << 5) + (p & 1) * 16, src, ok);
            }
        }
        cp_commit();
    };
    if constexpr (CP) {
#pragma unroll
        for (int t = 0; t < kStages - 1; t++)
            issue(t);
    }
    /* 32-bit offsets from four base pointers (fewer registers than a pointer per row) */
    const uint8_t *wb = W + 8 * q;
    uint32_t wo[kMT][2], so[kMT][2];
#pragma unroll
    for (int i = 0; i < kMT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = min(mw + 16 * i + 8 * h + g, M - 1);
            wo[i][h] = (uint32_t)r * (uint32_t)(K / 2);
            so[i][h] = (uint32_t)r * (uint32_t)KG;
        }
    /* tokens: B column g of n-tile j; D columns 2q, 2q + 1 (padding tokens read row 0's data) */
    auto xrow = [&](int t) {
        t = t < rows ? t : 0;
        return a.gather ? a.gather[row0 + t] : row0 + t;
    };
    /* ONE: the hi plane alone, 8-byte words (one group of a token: one 128-byte line) */
    using BW = typename std::conditional<ONE, uint2, uint4>::type;
    const BW *xpb = (const BW *)a.xp + q;
    uint32_t xo[NT], xso[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        xo[j] = (uint32_t)xrow(8 * j + g) * (uint32_t)(K / 4);
#pragma unroll
        for (int c = 0; c < 2; c++)
            xso[j][c] = (uint32_t)xrow(8 * j + 2 * q + c) * (uint32_t)a.kg4;
    }

    float y[kMT][NT][4];
#pragma unroll
    for (int i = 0; i < kMT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            y[i][j][0] = y[i][j][1] = y[i][j][2] = y[i][j][3] = 0.f;

    /* Codes: a ring of kRing groups per lane. Scale words and group sums: 4 groups per load,
     * spread over the lanes (lane (g, q) holds the scale word of group G4 + q of each of its rows,
     * and the sum of group G4 + (g & 3) of each of its tokens), broadcast by a shuffle when used:
     * ncu had the kernel bound by L1 wavefronts (83 % L1/TEX throughput, 26 % DRAM), a quarter
     * of them for 4-byte scale and sum loads made once per group by all 4 lanes of a row. */
    static_assert(kRing == 2, "the group loop below steps 4 groups = 2 ring turns");
    uint2 wq[CP ? 1 : kRing][kMT][2];
    uint32_t scur[kMT][2], snext[kMT][2];
    float xcur[NT][2], xnext[NT][2];
    auto load_sx = [&](int G4, uint32_t(&sv)[kMT][2], float(&xv4)[NT][2]) {
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                sv[i][h] = G4 + q < KG ? __ldg(SB + so[i][h] + G4 + q) : 0u;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 2; c++)
                xv4[j][c] = G4 + (g & 3) < KG ? __ldg(a.xs + xso[j][c] + G4 + (g & 3)) : 0.f;
    };
#pragma unroll
    for (int d = 0; d < kRing; d++)
        if (!CP && d < KG)
#pragma unroll
            for (int i = 0; i < kMT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    wq[d][i][h] = ldg_stream8(wb + wo[i][h] + 32 * d);
    load_sx(0, scur, xcur);
    load_sx(4, snext, xnext);

    for (int G0 = 0; G0 < KG; G0 += 4) {
        if constexpr (CP) { /* stage G0 / 4 has landed (for every lane: the warp sync); its slot
                             * minus one is free, all lanes being past the previous stage */
            cp_wait<kStages - 2>();
            __syncwarp();
            issue(G0 / 4 + kStages - 1);
        }
        const uint8_t *cur = sm + ((G0 / 4) % kStages) * kStageBytes;
#pragma unroll
        for (int d = 0; d < 4; d++) {
            const int G = G0 + d, sl = d & 1;
            if (G >= KG) break;
            uint2 cw[kMT][2];
            uint32_t cs[kMT][2];
#pragma unroll
            for (int i = 0; i < kMT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if constexpr (CP) {
                        const int r = 16 * i + 8 * h + g;
                        cw[i][h] = *(const uint2 *)(cur + r * 128 + (((d ^ r) & 3) << 5) + 8 * q);
                    } else {
                        cw[i][h] = wq[sl][i][h];
                    }
                    cs[i][h] = __shfl_sync(0xffffffffu, scur[i][h], (lane & ~3) | d);
                }
            if constexpr (!CP) {
                if (G + kRing < KG) /* refill the slot: group G + kRing */
#pragma unroll
                    for (int i = 0; i < kMT; i++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            wq[sl][i][h] = ldg_stream8(wb + wo[i][h] + 32 * (G + kRing));
            }
            if (a.pf && G + a.pf < KG && q < (ONE ? 1 : 2)) /* a later group's B lines, into L1 */
#pragma unroll
                for (int j = 0; j < NT; j++)
                    asm volatile("prefetch.global.L1 [%0];" ::"l"((const BW *)a.xp + xo[j] +
                                                                  16 * (G + a.pf) + 8 * q));
            BW b[NT][4];
            float xv[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int s = 0; s < 4; s++)
                    b[j][s] = __ldg(xpb + xo[j] + 16 * G + 4 * s);
                xv[j][0] = __shfl_sync(0xffffffffu, xcur[j][0], (d << 2) | q);
                xv[j][1] = __shfl_sync(0xffffffffu, xcur[j][1], (d << 2) | q);
            }
            float acc[kMT][NT][4];
#pragma unroll
            for (int i = 0; i < kMT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int i = 0; i < kMT; i++) {
                    uint32_t af[4];
                    af[0] = apair<SUB>(cw[i][0].x, s); /* row g, w0 */
                    af[1] = apair<SUB>(cw[i][1].x, s); /* row g + 8, w0 */
                    af[2] = apair<SUB>(cw[i][0].y, s); /* row g, w1 */
                    af[3] = apair<SUB>(cw[i][1].y, s); /* row g + 8, w1 */
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const uint32_t *bp = (const uint32_t *)&b[j][s];
                        mma_f16(acc[i][j], af, bp);                         /* hi plane */
                        if constexpr (!ONE) mma_f16(acc[i][j], af, bp + 2); /* lo plane */
                    }
                }
                /* y += scale * acc + bias * xsum (scale * 2^24: the codes were q * 2^-24) */
#pragma unroll
            for (int i = 0; i < kMT; i++) {
                const float f = SUB ? 1.f : 16777216.f;
                const float sc0 = lo_bf16(cs[i][0]) * f, bi0 = hi_bf16(cs[i][0]);
                const float sc1 = lo_bf16(cs[i][1]) * f, bi1 = hi_bf16(cs[i][1]);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    y[i][j][0] = fmaf(sc0, acc[i][j][0], fmaf(bi0, xv[j][0], y[i][j][0]));
                    y[i][j][1] = fmaf(sc0, acc[i][j][1], fmaf(bi0, xv[j][1], y[i][j][1]));
                    y[i][j][2] = fmaf(sc1, acc[i][j][2], fmaf(bi1, xv[j][0], y[i][j][2]));
                    y[i][j][3] = fmaf(sc1, acc[i][j][3], fmaf(bi1, xv[j][1], y[i][j][3]));
                }
            }
        }
        /* the next 4 groups' words: prefetched a turn ahead */
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                scur[i][h] = snext[i][h];
#pragma unroll
        for (int j = 0; j < NT; j++)
            xcur[j][0] = xnext[j][0], xcur[j][1] = xnext[j][1];
        if (G0 + 8 < KG) load_sx(G0 + 8, snext, xnext);
    }
    /* D element e: row g + 8 (e / 2) of the slab, token 2q + e % 2 of the n-tile */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int t = 8 * j + 2 * q + c;
            if (t >= rows) continue;
            const float mu = a.mul[xrow(t)];
            float *yr = Y + (size_t)(row0 + t) * a.ldy;
#pragma unroll
            for (int i = 0; i < kMT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int o = mw + 16 * i + 8 * h + g;
                    if (o < M) yr[o] = y[i][j][2 * h + c] * mu;
                }
        }
}

/* Grid (row blocks, tiles): tile y is tiles[y] when y < *d_ntiles. No block-wide barrier: warps
 * without rows and blocks without a tile leave at once. */
template <bool SUB, bool CP, bool ONE>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) skinny_kernel(const sk_args a) {
    extern __shared__ __align__(128) uint8_t sk_smem[];
    if ((int)blockIdx.y >= *a.d_ntiles) return;
    const int32_t *tl = a.tiles + 3 * blockIdx.y;
    const int ex = tl[0], row0 = tl[1], rows = min(tl[2], kBN);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool second = (int)blockIdx.x >= a.nb; /* the pair's second matrix */
    const int mw = ((int)blockIdx.x - (second ? a.nb : 0)) * kBM + warp * kMT * 16;
    if (rows <= 0 || mw >= a.M) return;
    const uint8_t *W = (second ? a.w2 : a.w) + (size_t)ex * a.w_stride;
    const uint32_t *SB = (second ? a.sb2 : a.sb) + (size_t)ex * a.sb_stride;
    float *Y = second ? a.Y2 : a.Y;
    uint8_t *sm = sk_smem + (CP ? warp * kStages * kStageBytes : 0);
    if (rows > 8)
        run<2, SUB, CP, ONE>(a, W, SB, Y, row0, rows, mw, lane, sm);
    else
        run<1, SUB, CP, ONE>(a, W, SB, Y, row0, rows, mw, lane, sm);
    if constexpr (CP) cp_wait<0>(); /* no copy outstanding at exit */
}

/* One thread per (row, group, lane q): the 16 split words of columns 64 G + 16 q .. + 15 become
 * the 4 B words of lane q (see the file comment), and the quad sums the group's hi + lo. Rows:
 * all nx, or (tiles != NULL: X read without gather, so each row is in at most one tile) those
 * of the valid tiles, grid.y being the tile list (a MoE chunk's down projection: the rows its
 * tiles read); none when the list is empty. ONE:
 * the hi halves of those words alone, as 8-byte words at the same indices (rows of K / 4), and
 * the sums of hi (then y = sum_c w_c hi_c exactly up to the fp32 sums: an fp16-activation
 * product, its error centred like the weights, not carried by the uncentred codes). */
constexpr int kPrepThreads = 256;
template <bool ONE>
__global__ void __launch_bounds__(kPrepThreads)
    skinny_prep_kernel(const uint32_t *__restrict__ words, int nx, int K, int kg4,
                       const int32_t *__restrict__ tiles, const int32_t *__restrict__ d_ntiles,
                       uint4 *__restrict__ xp, float *__restrict__ xs) {
    const int KG = K >> 6;
    const size_t i = (size_t)blockIdx.x * kPrepThreads + threadIdx.x;
    size_t row = i / ((size_t)KG * 4);
    const int rem = (int)(i % ((size_t)KG * 4)), G = rem >> 2, q = rem & 3;
    bool ok;                    /* whole quads are in or out */
    if (*d_ntiles == 0) return; /* block-wide: no tile reads these rows */
    if (tiles) { /* the rows of tile blockIdx.y alone (a block-wide exit: no lane shuffles after) */
        if ((int)blockIdx.y >= *d_ntiles) return;
        const int32_t *tl = tiles + 3 * blockIdx.y;
        const int tr = min(tl[2], kBN);
        ok = tr > 0 && row < (size_t)tr;
        row += (size_t)tl[1];
        ok = ok && row < (size_t)nx;
    } else {
        ok = row < (size_t)nx;
    }
    float sum = 0.f;
    if (ok) {
        const size_t base = row * K + (size_t)G * 64 + 16 * q; /* in words */
        const uint4 *src = (const uint4 *)(words + base);
        uint32_t w[16];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint4 v = src[c];
            w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
#pragma unroll
        for (int c = 0; c < 16; c++) { /* hi + lo: exact in fp32 (two 11-bit halves) */
            const float hi = __half2float(__ushort_as_half((unsigned short)(w[c] & 0xffffu)));
            const float lo = __half2float(__ushort_as_half((unsigned short)(w[c] >> 16)));
            sum += ONE ? hi : hi + lo;
        }
        const size_t o = (row * K + (size_t)G * 64) / 4 + q;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            if constexpr (ONE)
                ((uint2 *)xp)[o + 4 * s] =
                    make_uint2(hi_pair(w[s], w[s + 4]), hi_pair(w[8 + s], w[12 + s]));
            else
                xp[o + 4 * s] = make_uint4(hi_pair(w[s], w[s + 4]), hi_pair(w[8 + s], w[12 + s]),
                                           lo_pair(w[s], w[s + 4]), lo_pair(w[8 + s], w[12 + s]));
        }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (ok && q == 0) xs[row * kg4 + G] = sum;
}

/* Prepped B words and group sums, grown (stream synchronized first: queued kernels may read the
 * old ones) to the largest call; the backend runs one stream, so one buffer serves every call. */
uint4 *g_xp = nullptr;
float *g_xs = nullptr;
size_t g_xp_cap = 0, g_xs_cap = 0; /* in uint4 / floats */

int grow(size_t nxp, size_t nxs, lily_cuda_stream st, lily_err *e) {
    if (nxp <= g_xp_cap && nxs <= g_xs_cap) return 0;
    LILY_CU_TRY(cudaStreamSynchronize((cudaStream_t)st), e);
    cudaFree(g_xp);
    cudaFree(g_xs);
    g_xp = nullptr, g_xs = nullptr, g_xp_cap = g_xs_cap = 0;
    const size_t cp = nxp + nxp / 4 + 64, cs = nxs + nxs / 4 + 64;
    LILY_CU_TRY(cudaMalloc(&g_xp, cp * 16), e);
    LILY_CU_TRY(cudaMalloc(&g_xs, cs * 4), e);
    g_xp_cap = cp, g_xs_cap = cs;
    return 0;
}

/* What runs unless a test forces another form (gemm_skinny.h): the denormal fp16 dequantization,
 * the codes through shared memory, B prefetched one group ahead */
int g_variant = LILY_SKINNY_DENORM;
int g_cp = 1;
int g_pf = 1;

int pf_dist() {
    return g_pf;
}

bool cp_on() {
    return g_cp == 1;
}

int variant() {
    return g_variant;
}

} // namespace

extern "C" void lily_cuda_skinny_variant(int v) {
    g_variant = v;
}

extern "C" void lily_cuda_skinny_cp(int on) {
    g_cp = on ? 1 : 0;
}

extern "C" void lily_cuda_skinny_pf(int groups) {
    g_pf = groups < 0 ? 0 : groups > 8 ? 8 : groups;
}

namespace {

/* W alone (W2 NULL), or the pair W, W2 (same shape) in one launch: twice the row blocks, so the
 * grid's last partial wave is a smaller share of it. */
int skinny(const lily_dmat *W, const lily_dmat *W2, const float *X, int ldx, int nx,
           const int32_t *gather, const int32_t *tiles, const int32_t *d_ntiles, int max_tiles,
           float *Y, float *Y2, int ldy, lily_cuda_stream st, lily_err *e) {
    if (W->dt != LILY_CW_Q4 || (W2 && W2->dt != LILY_CW_Q4))
        return lily_fail(e, "gemm_skinny: Q4 weights only (type %d)",
                         W->dt != LILY_CW_Q4 ? W->dt : W2->dt);
    if (W->cols % 64 || W->cols < 64)
        return lily_fail(e, "gemm_skinny: %d columns (a multiple of 64)", W->cols);
    if (W2 && (W2->rows != W->rows || W2->cols != W->cols || W2->w_stride != W->w_stride ||
               W2->sb_stride != W->sb_stride))
        return lily_fail(e, "gemm_skinny: a pair of different shapes (%d x %d, %d x %d)", W->rows,
                         W->cols, W2->rows, W2->cols);
    if (max_tiles < 1 || W->rows < 1 || nx < 1) return 0;
    if (max_tiles > 65535) return lily_fail(e, "gemm_skinny: %d tiles", max_tiles);
    const int K = W->cols, KG = K / 64, kg4 = (KG + 3) & ~3;
    const uint32_t *words;
    const float *mul;
    if (lily_cuda_xsplit(X, ldx, nx, K, &words, &mul, st, e)) return -1;
    if (grow((size_t)nx * K / 4, (size_t)nx * kg4, st, e)) return -1;
    /* one-pass GEMMs (gemm_split.h): the hi plane alone, one product per weight */
    const bool one = !lily_cuda_gemm_exact();
    /* without gather, only the tiles' rows are laid out (grid.y over the tile list) */
    const bool by_tile = gather == nullptr;
    const size_t nthr = (size_t)(by_tile ? kBN : nx) * KG * 4;
    const dim3 pgrid((unsigned)((nthr + kPrepThreads - 1) / kPrepThreads),
                     by_tile ? (unsigned)max_tiles : 1u);
    const int32_t *ptiles = by_tile ? tiles : nullptr;
    if (one)
        skinny_prep_kernel<true><<<pgrid, kPrepThreads, 0, (cudaStream_t)st>>>(
            words, nx, K, kg4, ptiles, d_ntiles, g_xp, g_xs);
    else
        skinny_prep_kernel<false><<<pgrid, kPrepThreads, 0, (cudaStream_t)st>>>(
            words, nx, K, kg4, ptiles, d_ntiles, g_xp, g_xs);
    LILY_CU_LAUNCHED(e);
    sk_args a;
    a.w = W->w, a.sb = W->sb, a.w_stride = W->w_stride, a.sb_stride = W->sb_stride;
    a.M = W->rows, a.K = K, a.kg4 = kg4;
    a.xp = g_xp, a.xs = g_xs, a.mul = mul;
    a.gather = gather, a.tiles = tiles, a.d_ntiles = d_ntiles;
    a.Y = Y, a.ldy = ldy;
    a.pf = pf_dist();
    a.nb = (W->rows + kBM - 1) / kBM;
    a.w2 = W2 ? W2->w : nullptr, a.sb2 = W2 ? W2->sb : nullptr, a.Y2 = W2 ? Y2 : nullptr;
    const dim3 grid((unsigned)(a.nb * (W2 ? 2 : 1)), (unsigned)max_tiles);
    const bool sub = variant() == LILY_SKINNY_SUB, cp = cp_on();
    auto kern =
        one ? (sub ? (cp ? skinny_kernel<true, true, true> : skinny_kernel<true, false, true>)
                   : (cp ? skinny_kernel<false, true, true> : skinny_kernel<false, false, true>))
            : (sub ? (cp ? skinny_kernel<true, true, false> : skinny_kernel<true, false, false>)
                   : (cp ? skinny_kernel<false, true, false> : skinny_kernel<false, false, false>));
    if (cp) {
        static bool attr_set[2][2];
        if (!attr_set[one][sub]) {
            LILY_CU_TRY(
                cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kCpSmem),
                e);
            attr_set[one][sub] = true;
        }
    }
    kern<<<grid, kWarps * 32, cp ? kCpSmem : 0, (cudaStream_t)st>>>(a);
    LILY_CU_LAUNCHED(e);
    return 0;
}

} // namespace

extern "C" int lily_cuda_gemm_skinny_grouped(const lily_dmat *W, const float *X, int ldx, int nx,
                                             const int32_t *gather, const int32_t *tiles,
                                             const int32_t *d_ntiles, int max_tiles, float *Y,
                                             int ldy, lily_cuda_stream st, lily_err *e) {
    return skinny(W, nullptr, X, ldx, nx, gather, tiles, d_ntiles, max_tiles, Y, nullptr, ldy, st,
                  e);
}

extern "C" int lily_cuda_gemm_skinny_grouped_pair(const lily_dmat *W, const lily_dmat *W2,
                                                  const float *X, int ldx, int nx,
                                                  const int32_t *gather, const int32_t *tiles,
                                                  const int32_t *d_ntiles, int max_tiles, float *Y,
                                                  float *Y2, int ldy, lily_cuda_stream st,
                                                  lily_err *e) {
    return skinny(W, W2, X, ldx, nx, gather, tiles, d_ntiles, max_tiles, Y, Y2, ldy, st, e);
}
