/* One-pass attention prefill on wgmma, warp-specialised (attn_fa.h). The block, its barriers
 * and its turns are attn_ws.cu's; the operands are one fp16 pass:
 *   KFULL[c], VFULL[c]: the producer arrives when the K (V) plane of a tile is written,
 *     consumer c waits (128 + 128 threads);
 *   KEMPTY, VEMPTY: both consumers arrive when their products of a tile have read the plane,
 *     the producer waits before it overwrites it (128 + 256);
 *   TURN[c]: consumer c may issue its next products (S or P V) once the other has issued its
 *     own (128 + 128; consumer 0 starts);
 *   PROD: the producer's own (the landing area's reads before its next copy).
 * Shared memory: Q planes 64 KB (one per consumer), K plane 32 KB, V plane 32 KB, landing 64 KB;
 * the scales the consumers read after the products double-buffered by tile parity. */
#include "backend/cuda/attn_fa.h"

#include <cuda_fp16.h>
#include <string.h>

#include "backend/cuda/attn_wg.cuh"
#include "backend/cuda/attn_wg.h"
#include "backend/cuda/tma.cuh"

namespace {

using namespace attn_wg;

constexpr int kThreads = 384; /* producer warpgroup + two consumer warpgroups */
constexpr int kProdRegs = 40; /* setmaxnreg: 128 x 40 + 256 x 232 = 64 K registers */
constexpr int kConsRegs = 232;

/* Dynamic shared memory (bytes). Planes in wgmma's core-matrix order without swizzle (8 rows x
 * 16 bytes per core matrix, row groups of 8 at 128 bytes, 16-byte k chunks at LBO). */
constexpr int F_Q = 0;               /* [consumer][32 dim chunks][64 rows] f16: LBO 1024 */
constexpr int F_K = 65536;           /* [32 dim chunks][64 positions] f16: LBO 1024 */
constexpr int F_V = F_K + 32768;     /* [8 position chunks][256 dims] f16: LBO 4096 */
constexpr int F_RAW = F_V + 32768;   /* the landing: 64 K rows then 64 V rows (512 B each) */
constexpr int F_BAR = F_RAW + 65536; /* the K and V landings' mbarriers */
constexpr int kFaSmem = F_BAR + 16;  /* 196,624 */

enum { BAR_KFULL = 1, BAR_VFULL = 3, BAR_KEMPTY = 5, BAR_VEMPTY = 6, BAR_TURN = 7, BAR_PROD = 9 };

__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

/* D (64 x 64, f32, 32 registers) = A (64 x 16 f16) x B (16 x 64 f16), both from shared memory
 * (descriptors, K-major): D is not read. */
__device__ __forceinline__ void wgmma_f16_64_first(float *d, uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
        "0;\n}"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
          "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
          "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
          "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
          "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "l"(a), "l"(b));
}

/* D (64 x 64, f32) += A (64 x 16 f16) x B (16 x 64 f16), both from shared memory. */
__device__ __forceinline__ void wgmma_f16_64(float *d, uint64_t a, uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, "
        "0;"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b));
}

/* Two cache words u = c + 32768 (low half first) -> the codes c rounded to fp16, packed low
 * first. c comes as fp32 without a conversion instruction: u in the mantissa of 2^23, minus
 * 2^23 + 2^15 (attn.cu's codes_bf16). */
__device__ __forceinline__ uint32_t codes_h2(uint32_t w) {
    const float f0 = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7410)) - 8421376.f;
    const float f1 = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7432)) - 8421376.f;
    const __half2 h = __floats2half2_rn(f0, f1);
    return *(const uint32_t *)&h;
}

__device__ __forceinline__ uint32_t h2(float x0, float x1) {
    const __half2 h = __floats2half2_rn(x0, x1);
    return *(const uint32_t *)&h;
}

/* Row rr of the 16 rows warp wi of consumer wg writes: q row r = 64 wg + 16 wi + rr of the block
 * (position qt P + r / G, head j G + r % G; zero past n) times the power of two that puts its
 * max |q| in [2^12, 2^13), as fp16 into the consumer's plane; qs[r] gets the inverse factor. */
template <int G>
__device__ __forceinline__ void q_plane(uint8_t *smem, float *qs, const float *q, int n, int Nq,
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
        const uint32_t ex = (__float_as_uint(mx) >> 23) & 255u;
        const float f = ex >= 13u && ex <= 254u ? __uint_as_float((266u - ex) << 23) : 1.f;
        *(uint4 *)(smem + F_Q + wg * 32768 + lane * 1024 + (rl >> 3) * 128 + (rl & 7) * 16) =
            make_uint4(h2(x[0] * f, x[1] * f), h2(x[2] * f, x[3] * f), h2(x[4] * f, x[5] * f),
                       h2(x[6] * f, x[7] * f));
        if (lane == 0) qs[r] = 1.f / f;
    }
}

/* Unit u (0..1023) of a tile's K conversion: 16 dims of one landed K row as fp16 into the K
 * plane (two 8-dim chunks). The 16-dim piece is rotated by position against bank conflicts on
 * the landing (attn_wg.cuh's k_unit). */
__device__ __forceinline__ void k_unit_h(uint8_t *smem, int u) {
    const int p = u & 63, c = ((u >> 6) + p) & 15;
    const uint4 *src = (const uint4 *)(smem + F_RAW + p * 512 + c * 32);
    const uint4 a = src[0], b = src[1];
    const int off = F_K + 2 * c * 1024 + (p >> 3) * 128 + (p & 7) * 16;
    *(uint4 *)(smem + off) = make_uint4(codes_h2(a.x), codes_h2(a.y), codes_h2(a.z), codes_h2(a.w));
    *(uint4 *)(smem + off + 1024) =
        make_uint4(codes_h2(b.x), codes_h2(b.y), codes_h2(b.z), codes_h2(b.w));
}

/* Unit u (0..1023) of a tile's V conversion: dims 2 dp, 2 dp + 1 of the 8 landed V rows of chunk
 * pc as fp16, transposed into the V plane ([dim][position], K-major for P V). */
__device__ __forceinline__ void v_unit_h(uint8_t *smem, int u) {
    const int dp = u & 127, pc = u >> 7;
    float a[8], b[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t w = *(const uint32_t *)(smem + F_RAW + 32768 + (pc * 8 + i) * 512 + dp * 4);
        a[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7410)) - 8421376.f;
        b[i] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7432)) - 8421376.f;
    }
    const int d0 = 2 * dp;
    const int off = F_V + pc * 4096 + (d0 >> 3) * 128 + (d0 & 7) * 16; /* dim d0; d0 + 1 at +16 */
    *(uint4 *)(smem + off) =
        make_uint4(h2(a[0], a[1]), h2(a[2], a[3]), h2(a[4], a[5]), h2(a[6], a[7]));
    *(uint4 *)(smem + off + 16) =
        make_uint4(h2(b[0], b[1]), h2(b[2], b[3]), h2(b[4], b[5]), h2(b[6], b[7]));
}

/* Issue (not wait for) S = Q K^T of one tile: 16 k steps of 16 dims (2 KB apart in both planes). */
__device__ __forceinline__ void issue_s(uint32_t qz, uint32_t kz, float *s) {
#pragma unroll
    for (int ks = 0; ks < 16; ks++) {
        const uint64_t a = sdesc(qz + ks * 2048, 1024, 128), b = sdesc(kz + ks * 2048, 1024, 128);
        if (ks == 0)
            wgmma_f16_64_first(s, a, b);
        else
            wgmma_f16_64(s, a, b);
    }
}

/* Issue (not wait for) O += P V: P's fp16 A fragments (k step kk = positions 16 kk .. 16 kk + 15)
 * against the V plane (8 KB a k step). */
__device__ __forceinline__ void issue_pv(uint32_t vz, float *o, const uint32_t (*ph)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wgmma_f16_256(o, ph[kk], sdesc(vz + kk * 8192, 4096, 128));
}

/* Tensor maps of the K and V caches as [rows][row bytes / 2] u16, box 256 x 64 (a tile's rows
 * of one head); rows past the allocation arrive as zeros */
struct kv_maps {
    CUtensorMap k, v;
};

/* grid (ceil(n / P), Nkv, splits) with P = 128 / G positions per block, 384 threads: warpgroup 0
 * the producer, warpgroup 1 + c consumer c (block rows 64 c .. 64 c + 63). */
template <int G, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    attn_fa_kernel(const float *__restrict__ q, int n, const uint8_t *__restrict__ kc,
                   const uint8_t *__restrict__ vc, const int32_t *d_pos, int Nkv, float scale,
                   const float *__restrict__ gate, float *__restrict__ out,
                   float *__restrict__ part, const __grid_constant__ kv_maps mp) {
    constexpr int P = kRows / G;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float s_qs[kRows], s_ks[2][kKt], s_vs[2][kKt];
    const uint32_t sb = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t *const s_land = (uint64_t *)(smem + F_BAR);
    const BlockSpan bs = block_span<G, SPLIT>(n, Nkv, d_pos);
    const int Nq = bs.Nq, j = bs.j, qt = bs.qt, p0 = bs.p0, kv_end = bs.kv_end, qmin = bs.qmin;
    const int it_beg = bs.it_beg, it_end = bs.it_end;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wgi = warp >> 2, wi = warp & 3;
    if (SPLIT && it_beg == it_end) { /* nothing of the span: an empty partial */
        empty_partial<G>(part, bs, n, tid);
        return;
    }
    const size_t row = kv_row_bytes(Nkv, DH);
    const uint8_t *ksc = kc + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    const uint8_t *vsc = vc + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    /* (producer) tile i's K scale (tid < 64) or V scale (tid >= 64) of position kv0 + tid % 64
     * (0 past kv_end), loaded with its K rows, written to s_ks / s_vs with its K plane */
    float sc_next = 0.f;
    /* (producer) tile i's K (which 0, with the scales) or V rows into the landing: one tensor
     * copy by thread 0 on the landing's mbarrier (rows past kv_end hold finite codes whatever
     * they are: masked, or in rows that are not stored) */
    auto load = [&](int i, int which) {
        const int kv0 = i * kKt;
        if (tid == 0) {
            lily_mbar_expect(&s_land[which], kKt * 512);
            lily_tma_2d(smem + F_RAW + which * 32768, which ? &mp.v : &mp.k, j * DH, kv0,
                        &s_land[which]);
        }
        if (!which) {
            const int p = kv0 + (tid & (kKt - 1));
            sc_next = p < kv_end ? __ldg((const float *)((tid < kKt ? ksc : vsc) + (size_t)p * row))
                                 : 0.f;
        }
    };
    const int cw = wgi - 1, g = lane >> 2, tq = lane & 3;
    if (wgi == 0) { /* the first tile's copies */
        if (tid == 0) {
            lily_mbar_init(&s_land[0], 1);
            lily_mbar_init(&s_land[1], 1);
            lily_mbar_init_fence();
        }
        bar_sync(BAR_PROD, 128);
        load(it_beg, 0);
        load(it_beg, 1);
    } else { /* each consumer's Q plane */
        q_plane<G>(smem, s_qs, q, n, Nq, qt, j, cw, wi, lane);
        proxy_fence();
    }
    __syncthreads();

    if (wgi == 0) { /* the producer: the tiles' conversions */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProdRegs));
        for (int it = it_beg; it < it_end; it++) {
            const int b = it & 1;
            const uint32_t ph = (it - it_beg) & 1; /* the landings' phase */
            lily_mbar_wait(&s_land[0], ph);        /* K of tile it */
            /* both consumers done with the K plane's last tile (S) */
            if (it > it_beg) bar_sync(BAR_KEMPTY, 384);
#pragma unroll 2
            for (int x = 0; x < 8; x++)
                k_unit_h(smem, tid + 128 * x);
            const float sc = sc_next;
            if (tid < kKt)
                s_ks[b][tid] = sc;
            else
                s_vs[b][tid - kKt] = sc;
            proxy_fence();
            bar_arrive(BAR_KFULL, 256);
            bar_arrive(BAR_KFULL + 1, 256);
            bar_sync(BAR_PROD, 128); /* the K landing has been read */
            if (it + 1 < it_end) {
                proxy_fence(); /* the generic reads before the async proxy's writes */
                load(it + 1, 0);
            }
            lily_mbar_wait(&s_land[1], ph);             /* V of tile it */
            if (it > it_beg) bar_sync(BAR_VEMPTY, 384); /* both consumers' P V of it - 1 done */
#pragma unroll 2
            for (int x = 0; x < 8; x++)
                v_unit_h(smem, tid + 128 * x);
            proxy_fence();
            bar_arrive(BAR_VFULL, 256);
            bar_arrive(BAR_VFULL + 1, 256);
            bar_sync(BAR_PROD, 128); /* the V landing has been read */
            if (it + 1 < it_end) {
                proxy_fence();
                load(it + 1, 1);
            }
        }
        return;
    }

    /* the consumers */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsRegs));

    const int r0 = cw * 64 + wi * 16 + g, r1 = r0 + 8;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions (rows past n: beyond) */
    const float f0 = s_qs[r0] * scale * kLog2e, f1 = s_qs[r1] * scale * kLog2e;
    const uint32_t qa = sb + F_Q + cw * 32768;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float of_vf = 1.f;                      /* the V-scale factor O is kept in (attn_softmax.cuh) */
    if (cw == 1) bar_arrive(BAR_TURN, 256); /* consumer 0 takes the first turn */
    for (int it = it_beg; it < it_end; it++) {
        const int b = it & 1, kv0 = it * kKt;
        bar_sync(BAR_KFULL + cw, 256);
        float s[32];
        const uint32_t z = opaque_zero();
        bar_sync(BAR_TURN + cw, 256);
        wg_fence();
        issue_s(qa + z, sb + F_K + z, s);
        wg_commit();
        bar_arrive(BAR_TURN + (cw ^ 1), 256);
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 32; i++)
            reg_fence(s[i]);
        if (it + 1 < it_end) bar_arrive(BAR_KEMPTY, 384);
        /* scores in the log2 domain: K scales on the columns, row factors; the causal mask
         * only where the tile reaches past the block's first query position */
        const bool full = kv0 + kKt - 1 <= qmin;
#pragma unroll
        for (int nb = 0; nb < 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * nb + e, jc = nb * 8 + 2 * tq + (e & 1);
                float v = s[i] * (s_ks[b][jc] * (e < 2 ? f0 : f1));
                if (!full && kv0 + jc > (e < 2 ? qp0 : qp1)) v = -INFINITY;
                s[i] = v;
            }
        }
        const float vf = vscale_factor(warp_max(fmaxf(s_vs[b][lane], s_vs[b][lane + 32])));
        const float of = vf / of_vf;
        of_vf = vf;
        float d0, d1;
        softmax_tile<8>(s, s_vs[b], vf, of, tq, m0, m1, l0, l1, d0, d1);
        if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) {
#pragma unroll
            for (int nb = 0; nb < 32; nb++) {
                o[4 * nb + 0] *= d0, o[4 * nb + 1] *= d0;
                o[4 * nb + 2] *= d1, o[4 * nb + 3] *= d1;
            }
        }
        uint32_t ph[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const float *a = s + 8 * kk;
            ph[kk][0] = h2(a[0], a[1]), ph[kk][1] = h2(a[2], a[3]);
            ph[kk][2] = h2(a[4], a[5]), ph[kk][3] = h2(a[6], a[7]);
        }
        bar_sync(BAR_VFULL + cw, 256);
        bar_sync(BAR_TURN + cw, 256);
#pragma unroll
        for (int i = 0; i < 128; i++)
            reg_fence(o[i]);
        wg_fence();
        issue_pv(sb + F_V + opaque_zero(), o, ph);
        wg_commit();
        /* consumer 1's last turn is the block's last: nobody waits for it */
        if (cw == 0 || it + 1 < it_end) bar_arrive(BAR_TURN + (cw ^ 1), 256);
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 128; i++)
            reg_fence(o[i]);
        if (it + 1 < it_end) bar_arrive(BAR_VEMPTY, 384);
    }
    /* O holds vf sum P v (V plane: the codes themselves); finish_rows divides by of_vf / 256 */
    finish_rows<SPLIT>(part, o, m0, m1, l0, l1, 256.f * of_vf, t0, t1, j * G + r0 % G,
                       j * G + r1 % G, n, Nq, tq, gate, out);
}

/* The tensor map of a K or V cache at c: every row its allocation holds. */
int kv_map(CUtensorMap *m, const uint8_t *c, int Nkv, lily_err *e) {
    uintptr_t end = 0;
    if (lily_alloc_end(c, &end, e)) return -1;
    const size_t row = kv_row_bytes(Nkv, DH);
    const uint64_t rows = (uint64_t)(end - (uintptr_t)c) / row;
    if (rows < 1 || row % 16 || (uintptr_t)c % 16)
        return lily_fail(e, "attention (tensor map): a cache of %llu rows of %zu bytes at %p",
                         (unsigned long long)rows, row, (const void *)c);
    const uint64_t dims[2] = {row / 2, rows}, strides[1] = {row};
    const uint32_t box[2] = {DH, kKt};
    return lily_tma_map(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, c, dims, strides, box,
                        CU_TENSOR_MAP_SWIZZLE_NONE, e);
}

template <int G, bool SPLIT>
int launch(const float *q, int n, const uint8_t *kc, const uint8_t *vc, const int32_t *d_pos,
           int Nkv, float scale, const float *gate, float *out, float *part, int S,
           lily_cuda_stream st, lily_err *e) {
    constexpr int P = kRows / G;
    kv_maps mp;
    memset(&mp, 0, sizeof mp);
    if (kv_map(&mp.k, kc, Nkv, e) || kv_map(&mp.v, vc, Nkv, e)) return -1;
    auto kern = attn_fa_kernel<G, SPLIT>;
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kFaSmem),
                e);
    dim3 grid((n + P - 1) / P, Nkv, SPLIT ? S : 1);
    kern<<<grid, kThreads, kFaSmem, st>>>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, mp);
    LILY_CU_LAUNCHED(e);
    return SPLIT ? merge_splits(part, S, n, Nkv * G, gate, out, st, e) : 0;
}

template <int G>
int launch_s(int S, const float *q, int n, const uint8_t *kc, const uint8_t *vc,
             const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out, float *part,
             lily_cuda_stream st, lily_err *e) {
    if (S > 1) return launch<G, true>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, S, st, e);
    return launch<G, false>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, part, 1, st, e);
}

} // namespace

extern "C" int lily_cuda_attn_prefill_fa(const float *q, int n, const void *kc, const void *vc,
                                         const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                         const float *gate, float *out, float *part,
                                         lily_cuda_stream st, lily_err *e) {
    if (!lily_cuda_attn_wg_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention (wgmma, one pass): unsupported shape Nq=%d Nkv=%d Dh=%d", Nq,
                         Nkv, Dh);
    if (n < 1) return 0;
    const uint8_t *k = (const uint8_t *)kc, *v = (const uint8_t *)vc;
    const int G = Nq / Nkv;
    int S = 1;
    if (choose_splits(n, Nkv, G, part, &S, e)) return -1;
    switch (G) {
    case 1: return launch_s<1>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 2: return launch_s<2>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 4: return launch_s<4>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 8: return launch_s<8>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    case 16: return launch_s<16>(S, q, n, k, v, d_pos, Nkv, scale, gate, out, part, st, e);
    default: return lily_fail(e, "attention (wgmma, one pass): no kernel for G=%d", G);
    }
}
