/* The pieces the wgmma attention prefill kernels share (attn_wg.cu: two warpgroups converting
 * and computing in turn; attn_ws.cu: a producer warpgroup converting for two consumers). C++
 * only. Layout of the operand planes (attn_wg.h): every plane is in wgmma's core-matrix order
 * without swizzle, 8 rows x 16 bytes per 128-byte core matrix, row groups of 8 at 128 bytes
 * (SBO), 16-byte k chunks at LBO. */
#ifndef LILY_BACKEND_CUDA_ATTN_WG_CUH
#define LILY_BACKEND_CUDA_ATTN_WG_CUH

#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>

#include "backend/cuda/attn_kv.cuh"
#include "backend/cuda/attn_softmax.cuh"
#include "backend/cuda/swizzle.h"

namespace attn_wg {

constexpr int DH = 256;    /* head dim (the model's; others run attn.cu's kernel) */
constexpr int kRows = 128; /* query rows per block: two warpgroups of 64 */
constexpr int kKt = 64;    /* KV positions per tile */
constexpr float kLog2e = 1.4426950408889634f;

/* Dynamic shared memory (bytes), the same in both kernels. */
constexpr int OFF_Q = 0;                /* [warpgroup][qh, ql][64 rows x 256] s8: LBO 1024 */
constexpr int OFF_K = 65536;            /* [kh, kl][64 positions x 256] s8: LBO 1024 */
constexpr int OFF_V = OFF_K + 32768;    /* [vh, vl][256 dims x 64 positions] f16: LBO 4096 */
constexpr int OFF_RAW = OFF_V + 65536;  /* cp.async landing: 64 K rows then 64 V rows (512 B) */
constexpr int OFF_SC = OFF_RAW + 65536; /* landing: 64 K scales then 64 V scales (fp32) */
constexpr int kSmem = OFF_SC + 512;     /* 229,888 of the 232,448 an SM gives a block */

/* What a block of query tile qt (blockIdx.x counted from the last tile: the longest causal
 * spans first, as attn.cu) and KV head j = blockIdx.y covers: positions 0 .. kv_end - 1 of the
 * cache in ntile tiles, of which split blockIdx.z of gridDim.z (SPLIT) takes it_beg .. it_end - 1;
 * qmin is its first query position. */
struct BlockSpan {
    int Nq, j, qt, p0, kv_end, qmin, ntile, it_beg, it_end;
};
template <int G, bool SPLIT>
__device__ __forceinline__ BlockSpan block_span(int n, int Nkv, const int32_t *d_pos) {
    constexpr int P = kRows / G;
    BlockSpan b;
    b.Nq = Nkv * G, b.j = blockIdx.y, b.qt = gridDim.x - 1 - blockIdx.x, b.p0 = *d_pos;
    const int last_t = min(n, (b.qt + 1) * P) - 1;
    b.kv_end = b.p0 + last_t + 1;
    b.qmin = b.p0 + b.qt * P;
    b.ntile = (b.kv_end + kKt - 1) / kKt;
    b.it_beg = SPLIT ? (int)((long)blockIdx.z * b.ntile / gridDim.z) : 0;
    b.it_end = SPLIT ? (int)((long)(blockIdx.z + 1) * b.ntile / gridDim.z) : b.ntile;
    return b;
}

/* Shared-memory matrix descriptor, no swizzle: start, leading (k) and stride (row) offsets. */
__device__ __forceinline__ uint64_t sdesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}

/* SWZ (a measured form of the ws kernel, not launched): the planes in the 128-byte swizzled K-major
 * layout instead (swizzle.h). A plane row's bytes in 128-byte blocks kb (Q / K: 2 blocks of
 * 256-byte rows, 8 KB apart; V: one block, a dim's 64 positions), each block a swizzled plane of
 * 128-byte rows. Descriptors: 1 KB between 8-row atoms (SBO), layout type 1; a k step inside a
 * block starts its byte offset into the row. The planes' offsets (OFF_Q / K / V) are multiples
 * of 1 KB and the kernel aligns the base to 1 KB. */
__device__ __forceinline__ uint64_t sdesc_sw128(uint32_t addr) {
    return sdesc(addr, 16, 1024) | (1ull << 62);
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
/* Generic-proxy shared writes (st.shared, cp.async) made visible to the wgmma (async proxy). */
__device__ __forceinline__ void proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* Keep the compiler from moving accesses of a register across a wgmma that writes it (no
 * instruction: the operand keeps its register class). */
__device__ __forceinline__ void reg_fence(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}
__device__ __forceinline__ void reg_fence(int &x) {
    asm volatile("" : "+r"(x)::"memory");
}

/* 0, which the compiler cannot see through (keeps loop-invariant values from being hoisted). */
__device__ __forceinline__ uint32_t opaque_zero() {
    uint32_t z;
    asm volatile("mov.b32 %0, 0;" : "=r"(z));
    return z;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;");
}
__device__ __forceinline__ void cp_async_wait0() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait1() {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
}

/* D (64 x 64, s32, 32 registers) = A (64 x 32 s8, descriptor) x B (32 x 64 s8, descriptor): D is
 * not read, so the accumulator is not live before it. */
__device__ __forceinline__ void wgmma_s8_64_first(int *d, uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p;"
        "\n}"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]),
          "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]),
          "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]),
          "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]),
          "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31])
        : "l"(a), "l"(b));
}

/* D (64 x 64, s32, 32 registers) += A (64 x 32 s8, descriptor) x B (32 x 64 s8, descriptor). */
__device__ __forceinline__ void wgmma_s8_64(int *d, uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1;"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
          "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
          "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
          "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
          "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(a), "l"(b));
}

/* D (64 x 256, f32, 128 registers) += A (64 x 16 f16, registers) x B (16 x 256 f16, descriptor,
 * K-major). */
__device__ __forceinline__ void wgmma_f16_256(float *d, const uint32_t *a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
        "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
        "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "
        "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
        "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, 1, 1, 1, 0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

/* fp16 hi and lo parts of two floats (hi = fp16(x), lo = fp16(x - hi)). */
__device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    __half2 h = __floats2half2_rn(x0, x1);
    const float2 f = __half22float2(h);
    __half2 l = __floats2half2_rn(x0 - f.x, x1 - f.y);
    *hi = *(uint32_t *)&h;
    *lo = *(uint32_t *)&l;
}

/* Four signed bytes (each in [-128, 127]) packed low first. */
__device__ __forceinline__ uint32_t pack_s8x4(int a, int b, int c, int d) {
    return (uint32_t)(a & 255) | (uint32_t)(b & 255) << 8 | (uint32_t)(c & 255) << 16 |
           (uint32_t)d << 24;
}

/* Two cache words u = c + 32768 plus 128 per half: the bytes become c's balanced digits plus 128
 * (c = 256 h + l, h and l in [-128, 127]; needs |c| <= kKvCodeMax, attn_kv.cuh). */
__device__ __forceinline__ uint32_t balance(uint32_t w) {
    return w + 0x00800080u;
}

/* Row rr of the 16 rows warp wi of warpgroup wg converts: q row r = 64 wg + 16 wi + rr of the
 * block as a 16-bit code row with scale max|q| / kKvCodeMax, split into balanced s8 digits qh, ql
 * (code = 256 qh + ql) in the warpgroup's planes at smem + OFF_Q + wg 32768; the scale goes to
 * qs[r]. A block row r is (position qt P + r / G, head j G + r % G). */
template <int G, bool SWZ = false>
__device__ __forceinline__ void q_planes(uint8_t *smem, float *qs, const float *q, int n, int Nq,
                                         int qt, int j, int wg, int wi, int lane) {
    constexpr int P = kRows / G;
    for (int rr = 0; rr < 16; rr++) {
        const int rl = wi * 16 + rr, r = wg * 64 + rl;
        const int t = qt * P + r / G, h = j * G + r % G;
        float x[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (t < n) {
            const float4 *src =
                (const float4 *)(q + (size_t)t * Nq * DH + (size_t)h * DH) + lane * 2;
            const float4 a = src[0], b = src[1];
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z;
            x[7] = b.w;
        }
        float mx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            mx = fmaxf(mx, fabsf(x[i]));
        mx = warp_max(mx);
        const float inv = mx > 0.f ? (float)kKvCodeMax / mx : 0.f;
        int hi[8], lo[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int c = max(-kKvCodeMax, min(kKvCodeMax, __float2int_rn(x[i] * inv)));
            hi[i] = (c + 128) >> 8;
            lo[i] = c - 256 * hi[i];
        }
        uint8_t *pl = smem + OFF_Q + wg * 32768 + (lane & 1) * 8 +
                      (SWZ ? (lane >> 4) * 8192 + lily_swz128(rl, lane >> 1)
                           : (lane >> 1) * 1024 + (rl >> 3) * 128 + (rl & 7) * 16);
        *(uint2 *)pl = make_uint2(pack_s8x4(hi[0], hi[1], hi[2], hi[3]),
                                  pack_s8x4(hi[4], hi[5], hi[6], hi[7]));
        *(uint2 *)(pl + 16384) = make_uint2(pack_s8x4(lo[0], lo[1], lo[2], lo[3]),
                                            pack_s8x4(lo[4], lo[5], lo[6], lo[7]));
        if (lane == 0) qs[r] = mx / (float)kKvCodeMax;
    }
}

/* Unit u (0..1023) of a tile's K conversion: 16 dims (32 bytes) of one landed K row into the kh,
 * kl planes at smem + koff (balanced s8 digits). The chunk order is rotated by position, against
 * bank conflicts: (u / 64 + p) % 16 reads the landing with 2-way conflicts; with SWZ the order of
 * swizzle.h (lily_attn_k_piece), which keeps that and makes the swizzled writes conflict-free. */
template <bool SWZ = false>
__device__ __forceinline__ void k_unit(uint8_t *smem, int u, int koff = OFF_K) {
    const int p = u & 63;
    const int c = SWZ ? lily_attn_k_piece(u) : ((u >> 6) + p) & 15;
    const uint4 *src = (const uint4 *)(smem + OFF_RAW + p * 512 + c * 32);
    const uint4 a = src[0], b = src[1];
    uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t w0 = balance(w[2 * k]), w1 = balance(w[2 * k + 1]);
        hi[k] = __byte_perm(w0, w1, 0x7531) ^ 0x80808080u;
        lo[k] = __byte_perm(w0, w1, 0x6420) ^ 0x80808080u;
    }
    const int off =
        SWZ ? (c >> 3) * 8192 + lily_swz128(p, c) : c * 1024 + (p >> 3) * 128 + (p & 7) * 16;
    *(uint4 *)(smem + koff + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *(uint4 *)(smem + koff + 16384 + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

/* Unit u (0..1023) of a tile's V conversion: two dims of 8 landed V rows into the vh, vl planes,
 * transposed (K-major for P V); digits as exact fp16, vh = h and vl = l / 256 (v = 256 (vh +
 * vl)). */
template <bool SWZ = false> __device__ __forceinline__ void v_unit(uint8_t *smem, int u) {
    const int dp = u & 127, pc = u >> 7;
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        w[i] = balance(*(const uint32_t *)(smem + OFF_RAW + 32768 + (pc * 8 + i) * 512 + dp * 4));
    uint32_t h0[4], h1[4], e0[4], e1[4];
    const __half2 k1152 = __halves2half2(__float2half(1152.f), __float2half(1152.f));
    const __half2 k45 = __halves2half2(__float2half(4.5f), __float2half(4.5f));
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const uint32_t xh = __byte_perm(w[2 * m], w[2 * m + 1], 0x7531);
        const uint32_t xl = __byte_perm(w[2 * m], w[2 * m + 1], 0x6420);
        uint32_t a0 = __byte_perm(xh, 0x64646464u, 0x4240);
        uint32_t a1 = __byte_perm(xh, 0x64646464u, 0x4341);
        uint32_t b0 = __byte_perm(xl, 0x44444444u, 0x4240);
        uint32_t b1 = __byte_perm(xl, 0x44444444u, 0x4341);
        __half2 v;
        v = __hsub2(*(const __half2 *)&a0, k1152), h0[m] = *(const uint32_t *)&v;
        v = __hsub2(*(const __half2 *)&a1, k1152), h1[m] = *(const uint32_t *)&v;
        v = __hsub2(*(const __half2 *)&b0, k45), e0[m] = *(const uint32_t *)&v;
        v = __hsub2(*(const __half2 *)&b1, k45), e1[m] = *(const uint32_t *)&v;
    }
    const int d0 = 2 * dp;
    const int off = SWZ ? lily_swz128(d0, pc) : pc * 4096 + (d0 >> 3) * 128 + (d0 & 7) * 16;
    const int off1 = SWZ ? lily_swz128(d0 + 1, pc) : off + 16; /* dim d0 + 1 */
    *(uint4 *)(smem + OFF_V + off) = make_uint4(h0[0], h0[1], h0[2], h0[3]);
    *(uint4 *)(smem + OFF_V + off1) = make_uint4(h1[0], h1[1], h1[2], h1[3]);
    *(uint4 *)(smem + OFF_V + 32768 + off) = make_uint4(e0[0], e0[1], e0[2], e0[3]);
    *(uint4 *)(smem + OFF_V + 32768 + off1) = make_uint4(e1[0], e1[1], e1[2], e1[3]);
}

/* Issue (not wait for) S = Q K^T over the digits of one tile: hh gets the hh products, md hl +
 * lh, ll (with LL) the ll products; qz, kz: the warpgroup's Q planes and the K planes. */
template <bool LL, bool SWZ = false>
__device__ __forceinline__ void issue_s(uint32_t qz, uint32_t kz, int *hh, int *md, int *ll) {
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
        /* k step ks: 32 digits, at 2 KB steps (no swizzle) or in block ks / 4 at (ks % 4) 32 */
        const uint32_t o = SWZ ? (ks >> 2) * 8192 + (ks & 3) * 32 : ks * 2048;
        const uint64_t ah = SWZ ? sdesc_sw128(qz + o) : sdesc(qz + o, 1024, 128);
        const uint64_t al = SWZ ? sdesc_sw128(qz + 16384 + o) : sdesc(qz + 16384 + o, 1024, 128);
        const uint64_t bh = SWZ ? sdesc_sw128(kz + o) : sdesc(kz + o, 1024, 128);
        const uint64_t bl = SWZ ? sdesc_sw128(kz + 16384 + o) : sdesc(kz + 16384 + o, 1024, 128);
        if (ks == 0) {
            wgmma_s8_64_first(hh, ah, bh);
            wgmma_s8_64_first(md, ah, bl);
            if constexpr (LL) wgmma_s8_64_first(ll, al, bl);
        } else {
            wgmma_s8_64(hh, ah, bh);
            wgmma_s8_64(md, ah, bl);
            if constexpr (LL) wgmma_s8_64(ll, al, bl);
        }
        wgmma_s8_64(md, al, bh);
    }
}

/* S in the log2 domain from the digit products: 65536 hh + 256 md (+ ll), times the K scales
 * (ks, the tile's 64) and the rows' factors f0, f1 (q row scale x scale x log2 e); positions
 * past a row's query position masked to -inf unless the whole tile is before the block's first
 * query (full). kv0: the tile's first position; qp0, qp1: the rows' positions. */
template <bool LL>
__device__ __forceinline__ void s_scores(const int *hh, const int *md, const int *ll,
                                         const float *ks, float f0, float f1, bool full, int kv0,
                                         int qp0, int qp1, int tq, float *s) {
#pragma unroll
    for (int nb = 0; nb < 8; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 4 * nb + e, jc = nb * 8 + 2 * tq + (e & 1);
            float si = fmaf(65536.f, (float)hh[i], 256.f * (float)md[i]);
            if constexpr (LL) si += (float)ll[i];
            float v = si * (ks[jc] * (e < 2 ? f0 : f1));
            if (!full && kv0 + jc > (e < 2 ? qp0 : qp1)) v = -INFINITY;
            s[i] = v;
        }
    }
}

/* P's fp16 hi and lo A fragments from the S accumulator layout: k-step kk = positions 16 kk ..
 * 16 kk + 15 (n8 blocks 2 kk and 2 kk + 1). */
__device__ __forceinline__ void p_split(const float *s, uint32_t (*ph)[4], uint32_t (*pl)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const float *a = s + 8 * kk;
        split_f16x2(a[0], a[1], &ph[kk][0], &pl[kk][0]);
        split_f16x2(a[2], a[3], &ph[kk][1], &pl[kk][1]);
        split_f16x2(a[4], a[5], &ph[kk][2], &pl[kk][2]);
        split_f16x2(a[6], a[7], &ph[kk][3], &pl[kk][3]);
    }
}

/* Issue (not wait for) O += P V: P hi and lo against the vh, vl planes at vz (three products). */
template <bool SWZ = false>
__device__ __forceinline__ void issue_pv(uint32_t vz, float *o, const uint32_t (*ph)[4],
                                         const uint32_t (*pl)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        /* k step kk: 16 positions, 8 KB apart (no swizzle) or 32 bytes into each dim's row */
        const uint64_t vh = SWZ ? sdesc_sw128(vz + kk * 32) : sdesc(vz + kk * 8192, 4096, 128);
        const uint64_t vl =
            SWZ ? sdesc_sw128(vz + 32768 + kk * 32) : sdesc(vz + 32768 + kk * 8192, 4096, 128);
        wgmma_f16_256(o, ph[kk], vh);
        wgmma_f16_256(o, ph[kk], vl);
        wgmma_f16_256(o, pl[kk], vh);
    }
}

/* The rows' outputs: O was kept as sum P vf (vh + vl) = vf / 256 sum P v (of_vf: the last
 * tile's vf); normalise by l, gate, store rows t0, t1 (heads h0, h1) where they are < n. */
__device__ __forceinline__ void store_rows(const float *o, float l0, float l1, float of_vf, int t0,
                                           int t1, int h0, int h1, int n, int Nq, int tq,
                                           const float *__restrict__ gate,
                                           float *__restrict__ out) {
    const float u = 256.f / of_vf;
    const float il0 = l0 > 0.f ? u / l0 : 0.f, il1 = l1 > 0.f ? u / l1 : 0.f;
#pragma unroll
    for (int nb = 0; nb < 32; nb++) {
        const int d = nb * 8 + 2 * tq;
        if (t0 < n) {
            const size_t off = (size_t)t0 * Nq * DH + (size_t)h0 * DH + d;
            float x0 = o[4 * nb + 0] * il0, x1 = o[4 * nb + 1] * il0;
            if (gate) x0 *= sigmoid_f(gate[off]), x1 *= sigmoid_f(gate[off + 1]);
            *(float2 *)(out + off) = make_float2(x0, x1);
        }
        if (t1 < n) {
            const size_t off = (size_t)t1 * Nq * DH + (size_t)h1 * DH + d;
            float x0 = o[4 * nb + 2] * il1, x1 = o[4 * nb + 3] * il1;
            if (gate) x0 *= sigmoid_f(gate[off]), x1 *= sigmoid_f(gate[off + 1]);
            *(float2 *)(out + off) = make_float2(x0, x1);
        }
    }
}

constexpr int kMaxSplits = 16;      /* of a chunk's causal spans (attn_wg.h) */
constexpr int kMaxPartBlocks = 256; /* blocks x splits the partials' scratch holds */

/* Partials of a split chunk (SPLIT kernels), in the scratch lily_cuda_attn_prefill takes:
 * for split s and query (t, h) the row i = (s n + t) Nq + h (< kMaxPartBlocks x kRows): O's
 * unnormalised sum of p v at part + i DH (DH floats), its (m, l) pair at part + kPartMl + 2 i
 * (the running max in the log2 domain and the sum of 2^(s - m); (-inf, 0) when the split had
 * nothing of the row's span). */
constexpr size_t kPartMl = (size_t)kMaxPartBlocks * kRows * DH;
__device__ __forceinline__ size_t split_row(int sp, int n, int Nq, int t, int h) {
    return ((size_t)sp * n + t) * Nq + h;
}
__device__ __forceinline__ size_t split_ml(int sp, int n, int Nq, int t, int h) {
    return kPartMl + 2 * split_row(sp, n, Nq, t, h);
}

/* A split with nothing of its block's span: (-inf, 0) for the block's rows (threads 0..127). */
template <int G>
__device__ __forceinline__ void empty_partial(float *__restrict__ part, const BlockSpan &b, int n,
                                              int tid) {
    constexpr int P = kRows / G;
    if (tid < kRows) {
        const int t = b.qt * P + tid / G, h = b.j * G + tid % G;
        if (t < n)
            *(float2 *)(part + split_ml(blockIdx.z, n, b.Nq, t, h)) = make_float2(-INFINITY, 0.f);
    }
}

/* A thread's two rows (t0, head h0; t1, h1) of a split's partial, where they are < n; O was kept
 * as sum P vf (vh + vl) = vf / 256 sum P v (store_rows). */
__device__ __forceinline__ void store_partial(float *__restrict__ part, int sp, const float *o,
                                              float m0, float m1, float l0, float l1, float of_vf,
                                              int t0, int t1, int h0, int h1, int n, int Nq,
                                              int tq) {
    const float u = 256.f / of_vf;
    float *p0 = part + split_row(sp, n, Nq, t0, h0) * DH + 2 * tq;
    float *p1 = part + split_row(sp, n, Nq, t1, h1) * DH + 2 * tq;
#pragma unroll
    for (int nb = 0; nb < 32; nb++) {
        if (t0 < n) *(float2 *)(p0 + nb * 8) = make_float2(o[4 * nb] * u, o[4 * nb + 1] * u);
        if (t1 < n) *(float2 *)(p1 + nb * 8) = make_float2(o[4 * nb + 2] * u, o[4 * nb + 3] * u);
    }
    if (tq == 0) {
        if (t0 < n) *(float2 *)(part + split_ml(sp, n, Nq, t0, h0)) = make_float2(m0, l0);
        if (t1 < n) *(float2 *)(part + split_ml(sp, n, Nq, t1, h1)) = make_float2(m1, l1);
    }
}

/* A thread's two rows at the end of the span: its split's partial (SPLIT) or the output. */
template <bool SPLIT>
__device__ __forceinline__ void
finish_rows(float *__restrict__ part, const float *o, float m0, float m1, float l0, float l1,
            float of_vf, int t0, int t1, int h0, int h1, int n, int Nq, int tq,
            const float *__restrict__ gate, float *__restrict__ out) {
    if constexpr (SPLIT)
        store_partial(part, blockIdx.z, o, m0, m1, l0, l1, of_vf, t0, t1, h0, h1, n, Nq, tq);
    else
        store_rows(o, l0, l1, of_vf, t0, t1, h0, h1, n, Nq, tq, gate, out);
}

/* How many splits a chunk of n tokens takes (*S = 1: none; attn_wg.cu). */
int choose_splits(int n, int Nkv, int G, const float *part, int *S, lily_err *e);
/* The splits' partials merged into out (times sigmoid(gate) when gate != NULL; attn_wg.cu). */
int merge_splits(const float *part, int S, int n, int Nq, const float *gate, float *out,
                 lily_cuda_stream st, lily_err *e);

} // namespace attn_wg

#endif
