/* Batch-1 Q4 matrix-vector products on tensor cores (decode GEMV and MoE decode kernels).
 *
 * Why: the fp32 path (chunk_dot) spends ~4 instructions per weight per lane unpacking nibbles to
 * floats and multiplying them; at batch 1 that instruction stream, not HBM, bounded the decode
 * GEMVs (ncu: 30 % SM issue at 13 % of DRAM bandwidth). Here a warp turns 8 nibbles into four
 * bf16x2 registers with 7 integer instructions and lets mma.sync m16n8k16 do the products.
 *
 * Unit of work: a "tile step" = 16 rows x 256 columns of one matrix. Lane (g = lane / 4,
 * t = lane % 4) loads the 16-byte code chunks t and 4 + t of the step for rows g and g + 8
 * (columns 32 t .. and 128 + 32 t ..). A code word holds 8 consecutive columns; nibbles p and
 * p + 4 become one bf16x2 A register as the exact numbers 128 + q ((v >> 4p) & 0x000F000F |
 * 0x43004300), so the A fragment's k order is a fixed permutation of the chunk's columns, and x
 * is stored in shared memory in that same permuted order (q4x_convert).
 *
 * B carries x, and its 8 columns n select what is summed: n = 4 hl + 2 m + h takes the group of
 * chunk pair (m, h) (64 columns: chunks 4 m + 2 h, 4 m + 2 h + 1), from the high (hl = 0) or the
 * low (hl = 1) bf16 half of x = hi + lo. So one mma sequence yields per row 4 group sums for each
 * half, the group scales are applied in fp32 afterwards, and x keeps ~16 bits of mantissa
 * (x - hi - lo ~ 2^-17 |x|): the result matches the fp32 path to ~1e-6. With the 128 offset,
 * y = sum_G s_G (D_G) + (b_G - 128 s_G) * xs_G, xs_G = sum of (hi + lo) over the group.
 *
 * Shared layout per input vector of C columns: hi plane and lo plane, C / 2 words each, chunk c
 * (32 columns) at words [16 c, 16 c + 16) in mma-step order (word 2 st + b of a chunk holds
 * columns 8 (st / 2) + 2 (st % 2) + b and that + 4); xs: C / 32 floats, the chunk sums of hi + lo. */
#ifndef LILY_BACKEND_CUDA_Q4MMA_CUH
#define LILY_BACKEND_CUDA_Q4MMA_CUH

#include "backend/cuda/common.cuh"

/* Builds the hi/lo planes and chunk sums of x[0..cols) (cols % 32 == 0) with every thread of
 * the block: thread q of a pass writes word q of both planes (two columns), and the 16 words of a
 * chunk are 16 lanes of one warp, which sum the chunk with shuffles. ld(col) returns x[col]. The
 * caller places a barrier before the planes are read. */
template <typename Ld>
static __device__ __forceinline__ void q4x_convert(int cols, Ld ld, uint32_t *xh, uint32_t *xl,
                                                   float *xs) {
    const int nq = cols / 2, lane = threadIdx.x & 31;
    for (int base = (threadIdx.x & ~31); base < nq; base += blockDim.x) { /* warp-uniform */
        const int q = base + lane;
        float part = 0.f;
        if (q < nq) {
            const int c = q >> 4, w = q & 15, st = w >> 1;
            const int col0 = 32 * c + 8 * (st >> 1) + (st & 1) * 2 + (w & 1);
            const float x0 = ld(col0), x1 = ld(col0 + 4);
            const uint16_t h0 = f2bf(x0), h1 = f2bf(x1);
            const uint16_t l0 = f2bf(x0 - bf16f(h0)), l1 = f2bf(x1 - bf16f(h1));
            xh[q] = h0 | ((uint32_t)h1 << 16);
            xl[q] = l0 | ((uint32_t)l1 << 16);
            part = (bf16f(h0) + bf16f(l0)) + (bf16f(h1) + bf16f(l1));
        }
        part = group_sum<16>(part); /* a chunk's 16 words: all valid or all not */
        if (q < nq && (q & 15) == 0) xs[q >> 4] = part;
    }
}

/* The loads of one tile step: codes of rows g (r0) and g + 8 (r1) for chunks t and 4 + t, and
 * the two scale/bias words of the groups this lane applies (8-byte loads). A NULL row loads
 * zeros (a zero scale and bias: the row contributes nothing). */
struct q4_step_regs {
    uint4 w[4];  /* r0 chunk t, r0 chunk 4+t, r1 chunk t, r1 chunk 4+t */
    uint2 sb[2]; /* r0, r1: groups G, G+1 */
};

static __device__ __forceinline__ void q4_step_load(const uint8_t *r0, const uint32_t *sb0,
                                                    const uint8_t *r1, const uint32_t *sb1,
                                                    int step, int lane, q4_step_regs &R) {
    const int t = lane & 3;
    const size_t c0 = ((size_t)step * 8 + t) * 16, c1 = c0 + 64;
    const int G = step * 4 + ((2 * t) & 3);
    const uint4 z = make_uint4(0, 0, 0, 0);
    R.w[0] = r0 ? ldg_stream(r0 + c0) : z;
    R.w[1] = r0 ? ldg_stream(r0 + c1) : z;
    R.w[2] = r1 ? ldg_stream(r1 + c0) : z;
    R.w[3] = r1 ? ldg_stream(r1 + c1) : z;
    R.sb[0] = r0 ? __ldg((const uint2 *)(sb0 + G)) : make_uint2(0, 0);
    R.sb[1] = r1 ? __ldg((const uint2 *)(sb1 + G)) : make_uint2(0, 0);
}

static __device__ __forceinline__ uint32_t q4_pair(uint32_t v, int p) {
    return ((v >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
}

/* The math of one tile step: adds this lane's partial dot products of rows g and g + 8 to
 * acc0 / acc1 (the caller sums the 4 lanes of a quad). xh/xl: the hi/lo planes of x, xs: its
 * chunk sums (see above). */
static __device__ __forceinline__ void q4_step_math(const q4_step_regs &R, const uint32_t *xh,
                                                    const uint32_t *xl, const float *xs, int step,
                                                    int lane, float &acc0, float &acc1) {
    const int g = lane >> 2, t = lane & 3;
    const int hl = g >> 2, ms = (g >> 1) & 1, h = g & 1;
    const bool active = (t >> 1) == h;
    /* this lane's B: x of chunk 4 ms + t of the step, plane hl */
    uint32_t bb[16];
    {
        const uint4 *src = (const uint4 *)((hl ? xl : xh) + ((size_t)step * 8 + 4 * ms + t) * 16);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint4 u = active ? src[q] : make_uint4(0, 0, 0, 0);
            bb[4 * q] = u.x, bb[4 * q + 1] = u.y, bb[4 * q + 2] = u.z, bb[4 * q + 3] = u.w;
        }
    }
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const uint32_t wg[4] = {R.w[m].x, R.w[m].y, R.w[m].z, R.w[m].w};
        const uint32_t wg8[4] = {R.w[2 + m].x, R.w[2 + m].y, R.w[2 + m].z, R.w[2 + m].w};
        const bool mine = ms == m;
#pragma unroll
        for (int st = 0; st < 8; st++) {
            const int i = st >> 1, pp = (st & 1) * 2;
            uint32_t a[4] = {q4_pair(wg[i], pp), q4_pair(wg8[i], pp), q4_pair(wg[i], pp + 1),
                             q4_pair(wg8[i], pp + 1)};
            uint32_t b[2] = {mine ? bb[2 * st] : 0u, mine ? bb[2 * st + 1] : 0u};
            mma_bf16(d, a, b);
        }
    }
    /* d0, d1: row g, groups G, G+1 (plane t >> 1); d2, d3: row g + 8 */
    const int G = step * 4 + ((2 * t) & 3);
    acc0 = fmaf(lo_bf16(R.sb[0].x), d[0], fmaf(lo_bf16(R.sb[0].y), d[1], acc0));
    acc1 = fmaf(lo_bf16(R.sb[1].x), d[2], fmaf(lo_bf16(R.sb[1].y), d[3], acc1));
    if (t < 2) { /* once per group: the bias and the 128 offset */
        const float x0 = xs[2 * G] + xs[2 * G + 1], x1 = xs[2 * G + 2] + xs[2 * G + 3];
        acc0 = fmaf(hi_bf16(R.sb[0].x) - 128.f * lo_bf16(R.sb[0].x), x0,
                    fmaf(hi_bf16(R.sb[0].y) - 128.f * lo_bf16(R.sb[0].y), x1, acc0));
        acc1 = fmaf(hi_bf16(R.sb[1].x) - 128.f * lo_bf16(R.sb[1].x), x0,
                    fmaf(hi_bf16(R.sb[1].y) - 128.f * lo_bf16(R.sb[1].y), x1, acc1));
    }
}

/* Sum over the 4 lanes of a quad (fixed order: deterministic). */
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

#endif
