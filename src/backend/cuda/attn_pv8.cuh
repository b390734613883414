/* P V on 8-bit wgmma for the warp-specialised attention prefill (attn_ws.cu's PV8 form, measured and not launched;
 * C++ only). attn_wg.cuh's form multiplies P (fp16 hi + lo, ~22 bits) by the V digits as exact
 * fp16 planes: three f16 products. Here P' (P times the columns' V scales, softmax_tile) becomes,
 * per row and tile, a 16-bit fixed-point fraction of the row's largest P' in the tile, u = 256 uh
 * + ul (u8 digits), and V's codes their balanced s8 digits (c = 256 h + l, as K): the tile adds
 * (P'max / 65535) (65536 uh.h + 256 (uh.l + ul.h)) to a row, i.e. three u8 x s8 products on the
 * integer tensor path (twice the f16 rate), exact in s32; the ul.l products (< 2^-16 of a term)
 * are left out. The rounding of P' to 16 bits is the only other change against the f16 form.
 *
 * Operand layouts. A (P, registers): wgmma's 8-bit A fragment (row g: k 4 tq .. 4 tq + 3 and
 * 16 + 4 tq .., row g + 8 the same) is filled from the S accumulator layout without shuffles by
 * taking the positions of a 32-position k step in a permuted order: logical k = 4 tq + i (and 16 +
 * 4 tq + i) holds position 2 tq + (i & 1) + 8 (i >> 1) (and 16 + that). B (V, shared memory):
 * K-major (8-bit wgmma has no transposed B), [vh, vl][4 chunks of 16 logical positions][256
 * dims][16 bytes], 8-dim core matrices 128 bytes apart (SBO), chunks 4 KB apart (LBO), each
 * chunk's 16 bytes the positions 16 kc + {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14,
 * 15}: the same permutation, so k matches position in both operands. 32 KB (the f16 planes'
 * 64 KB region, its first half). */
#ifndef LILY_BACKEND_CUDA_ATTN_PV8_CUH
#define LILY_BACKEND_CUDA_ATTN_PV8_CUH

#include "backend/cuda/attn_wg.cuh"

namespace attn_wg {

/* D (64 x 64, s32, 32 registers) (+)= A (64 x 32 u8, registers) x B (32 x 64 s8, descriptor,
 * K-major); FIRST: D = A B (D not read, so not live before). */
template <bool FIRST>
__device__ __forceinline__ void wgmma_u8s8_64(int *d, const uint32_t *a, uint64_t b) {
    if constexpr (FIRST)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
            "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
            "}, {%32, %33, %34, %35}, %36, p;\n}"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]),
              "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]),
              "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]),
              "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]),
              "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]),
              "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else
        asm volatile(
            "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
            "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 "
            "}, {%32, %33, %34, %35}, %36, 1;"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
              "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),
              "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),
              "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]),
              "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]),
              "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* Byte offset of (dim d, chunk kc) in a V digit plane (16 bytes: the chunk's 16 positions). */
__device__ __forceinline__ int pv8_off(int d, int kc) {
    return kc * 4096 + (d >> 3) * 128 + (d & 7) * 16;
}

/* Unit u (0..511) of a tile's V conversion: dims 2 dp, 2 dp + 1 (dp = u % 128) of the 16 landed V
 * rows of chunk kc = u / 128 into the vh, vl planes at smem + OFF_V (+ 16 KB), as balanced s8
 * digits in the chunk's position order (above). */
__device__ __forceinline__ void v_unit8(uint8_t *smem, int u) {
    const int dp = u & 127, kc = u >> 7;
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        w[i] = balance(*(const uint32_t *)(smem + OFF_RAW + 32768 + (kc * 16 + i) * 512 + dp * 4));
    uint32_t h0[4], h1[4], l0[4], l1[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        /* logical 4 m .. 4 m + 3 = positions 2 m, 2 m + 1, 8 + 2 m, 9 + 2 m; a word's bytes:
         * dim 2 dp lo, hi, dim 2 dp + 1 lo, hi (each + 128) */
        const uint32_t a = w[2 * m], b = w[2 * m + 1], c = w[8 + 2 * m], d = w[9 + 2 * m];
        const uint32_t th1 = __byte_perm(a, b, 0x7531), th2 = __byte_perm(c, d, 0x7531);
        const uint32_t tl1 = __byte_perm(a, b, 0x6420), tl2 = __byte_perm(c, d, 0x6420);
        h0[m] = __byte_perm(th1, th2, 0x6420) ^ 0x80808080u;
        h1[m] = __byte_perm(th1, th2, 0x7531) ^ 0x80808080u;
        l0[m] = __byte_perm(tl1, tl2, 0x6420) ^ 0x80808080u;
        l1[m] = __byte_perm(tl1, tl2, 0x7531) ^ 0x80808080u;
    }
    const int off = pv8_off(2 * dp, kc); /* dim 2 dp + 1: 16 bytes on */
    *(uint4 *)(smem + OFF_V + off) = make_uint4(h0[0], h0[1], h0[2], h0[3]);
    *(uint4 *)(smem + OFF_V + off + 16) = make_uint4(h1[0], h1[1], h1[2], h1[3]);
    *(uint4 *)(smem + OFF_V + 16384 + off) = make_uint4(l0[0], l0[1], l0[2], l0[3]);
    *(uint4 *)(smem + OFF_V + 16384 + off + 16) = make_uint4(l1[0], l1[1], l1[2], l1[3]);
}

/* Two 16-bit values as u8 digit pairs: (hi bytes, lo bytes) of x0 | x1 << 16 and y0 | y1 << 16,
 * in the order x0, x1, y0, y1. */
__device__ __forceinline__ void digits_u8x4(uint32_t x, uint32_t y, uint32_t *hi, uint32_t *lo) {
    *hi = __byte_perm(x, y, 0x7531);
    *lo = __byte_perm(x, y, 0x6420);
}

/* P' (s, the S accumulator layout after softmax_tile: values 0, 1 of an n8 block in row g, 2, 3
 * in row g + 8) as the 8-bit A fragments of the tile's two k steps: uh[kk], ul[kk]; w0, w1: the
 * rows' unit (P'max / 65535, 0 for a row with nothing in the tile). */
__device__ __forceinline__ void p_quant8(const float *s, uint32_t (*uh)[4], uint32_t (*ul)[4],
                                         float &w0, float &w1) {
    float m0 = 0.f, m1 = 0.f;
#pragma unroll
    for (int nb = 0; nb < 8; nb++) {
        m0 = fmaxf(m0, fmaxf(s[4 * nb], s[4 * nb + 1]));
        m1 = fmaxf(m1, fmaxf(s[4 * nb + 2], s[4 * nb + 3]));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    const float i0 = m0 > 0.f ? 65535.f / m0 : 0.f, i1 = m1 > 0.f ? 65535.f / m1 : 0.f;
    w0 = m0 * (1.f / 65535.f);
    w1 = m1 * (1.f / 65535.f);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            /* register r: row g (r even) or g + 8, n8 blocks 4 kk + 2 (r / 2) and + 1 */
            const float *a = s + 4 * (4 * kk + 2 * (r >> 1)) + 2 * (r & 1);
            const float inv = (r & 1) ? i1 : i0;
            const uint32_t q0 = min(65535u, __float2uint_rn(a[0] * inv));
            const uint32_t q1 = min(65535u, __float2uint_rn(a[1] * inv));
            const uint32_t q2 = min(65535u, __float2uint_rn(a[4] * inv));
            const uint32_t q3 = min(65535u, __float2uint_rn(a[5] * inv));
            digits_u8x4(q0 | q1 << 16, q2 | q3 << 16, &uh[kk][r], &ul[kk][r]);
        }
    }
}

/* x (|x| < 2^22) as float: two full-rate instructions instead of one quarter-rate conversion. */
__device__ __forceinline__ float s32_f32(int x) {
    return __int_as_float(x + 0x4B400000) - 12582912.f;
}

/* O += P V for one tile on 8-bit wgmma: per quarter of the 256 dims the hh (A) and hl + lh (B)
 * products of both k steps, waited for, then added to o's quarter as w (256 A + B) per row (O
 * is kept as sum P' c / 256, attn_wg.cuh's store_rows). turn: called after the first quarter's
 * products are issued (the consumers' turn-taking, attn_ws.cu). |A| <= 64 x 255 x 128 and |B|
 * <= 2 x that: both below 2^22. */
template <typename Turn>
__device__ __forceinline__ void pv8(uint32_t vz, float *o, const uint32_t (*uh)[4],
                                    const uint32_t (*ul)[4], float w0, float w1, Turn turn) {
    const float a0 = 256.f * w0, a1 = 256.f * w1;
#pragma unroll
    for (int qd = 0; qd < 4; qd++) {
        int A[32], B[32];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            const uint32_t z = vz + kk * 8192 + qd * 1024;
            const uint64_t bh = sdesc(z, 4096, 128), bl = sdesc(z + 16384, 4096, 128);
            if (kk == 0) {
                wgmma_u8s8_64<true>(A, uh[0], bh);
                wgmma_u8s8_64<true>(B, uh[0], bl);
            } else {
                wgmma_u8s8_64<false>(A, uh[1], bh);
                wgmma_u8s8_64<false>(B, uh[1], bl);
            }
            wgmma_u8s8_64<false>(B, ul[kk], bh);
        }
        wg_commit();
        if (qd == 0) turn();
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 32; i++) {
            reg_fence(A[i]);
            reg_fence(B[i]);
        }
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float &x = o[32 * qd + i];
            x = fmaf((i & 2) ? a1 : a0, s32_f32(A[i]), x);
            x = fmaf((i & 2) ? w1 : w0, s32_f32(B[i]), x);
        }
    }
}

} // namespace attn_wg

#endif
