/* Attention kernels (see attn.h). */
#include "backend/cuda/attn.h"

#include <cuda_fp16.h>

#include <math.h>

#include "backend/cuda/attn_dec.cuh"
#include "backend/cuda/attn_fa.h"
#include "backend/cuda/attn_kv.cuh"
#include "backend/cuda/attn_softmax.cuh"
#include "backend/cuda/attn_wg.h"

namespace {

/* ---- KV cache rows (format: attn.h; kv_row_bytes: attn_kv.cuh) ------------------------------ */

/* Max over the block (all threads get it). red: 32 floats of shared scratch. */
__device__ __forceinline__ float block_max(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads(); /* red may still be read from a previous reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? red[lane] : 0.f);
}

/* Cache word of x for scale s = max|row| / kKvCodeMax: the code c = rint(x / s) (|c| <=
 * kKvCodeMax up to rounding: clamped) stored offset binary, c + 32768 (attn.h). */
__device__ __forceinline__ uint16_t kv_code(float x, float s) {
    if (!(s > 0.f)) return 32768u;
    const float cm = (float)kKvCodeMax;
    return (uint16_t)(32768 + (int)fminf(fmaxf(rintf(x / s), -cm), cm));
}

/* ---- prep: norms, RoPE, cache append --------------------------------------------------------- */

/* The caches of a prep launch: one for every token (a chunk of one sequence), or token t's own
 * (rows: one token of each of n sequences, at its own position d_pos[t]). */
struct prep_caches {
    uint8_t *kc[LILY_ATTN_ROWS], *vc[LILY_ATTN_ROWS];
    int rows;
};

/* grid (n, Nq + Nkv), block Dh threads. Block y < Nq: query head; else KV head y - Nq (the branch
 * is uniform per block, so the KV blocks' reductions may synchronise). */
__global__ void attn_prep_kernel(const float *__restrict__ qg, int ldqg,
                                 const float *__restrict__ k, const float *__restrict__ v, int ldkv,
                                 const int32_t *d_pos, int Nq, int Nkv, int Dh, int R,
                                 const float *__restrict__ inv_freq, const float *__restrict__ qn,
                                 const float *__restrict__ kn, float eps, int gated, float *q_out,
                                 float *gate_out, int ldq, const __grid_constant__ prep_caches cs) {
    __shared__ float red[32];
    __shared__ float xs[256];
    int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    int pos = cs.rows ? d_pos[t] : *d_pos + t;
    uint8_t *kc = cs.kc[cs.rows ? t : 0], *vc = cs.vc[cs.rows ? t : 0];
    bool isq = h < Nq;
    const float *src = isq ? qg + (size_t)t * ldqg + (size_t)h * Dh * (gated ? 2 : 1)
                           : k + (size_t)t * ldkv + (size_t)(h - Nq) * Dh;
    float x = src[d];
    float ss = block_sum(x * x, red);
    float r = 1.0f / sqrtf(ss / Dh + eps);
    x = x * r * (isq ? qn[d] : kn[d]);
    xs[d] = x;
    __syncthreads();
    int half = R / 2;
    if (d < R) {
        int i = d < half ? d : d - half;
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        x = d < half ? xs[d] * c - xs[d + half] * s : xs[d] * c + xs[d - half] * s;
    }
    if (isq) {
        size_t o = (size_t)t * ldq + (size_t)h * Dh + d;
        q_out[o] = x;
        if (gated) gate_out[o] = src[Dh + d];
    } else {
        int j = h - Nq;
        float vx = v[(size_t)t * ldkv + (size_t)j * Dh + d];
        const float cm = (float)kKvCodeMax;
        float ks = block_max(fabsf(x), red) / cm, vs = block_max(fabsf(vx), red) / cm;
        size_t rb = kv_row_bytes(Nkv, Dh) * pos, so = (size_t)Nkv * Dh * 2 + (size_t)j * 4;
        ((uint16_t *)(kc + rb))[(size_t)j * Dh + d] = kv_code(x, ks);
        ((uint16_t *)(vc + rb))[(size_t)j * Dh + d] = kv_code(vx, vs);
        if (d == 0) *(float *)(kc + rb + so) = ks, *(float *)(vc + rb + so) = vs;
    }
}

/* ---- tensor-core helpers of the prefill (the decode's and the shared ones: attn_dec.cuh) ---- */

__device__ __forceinline__ void mma16816h(float *c, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* fp16 hi and lo parts of x (hi = fp16(x), lo = fp16(x - hi): ~22 significant bits; lo may be
 * subnormal, an absolute error of 2^-25 at most, far below what the sums resolve). */
__device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    __half2 h = __floats2half2_rn(x0, x1);
    const float2 f = __half22float2(h);
    __half2 l = __floats2half2_rn(x0 - f.x, x1 - f.y);
    *hi = *(uint32_t *)&h;
    *lo = *(uint32_t *)&l;
}

/* Two cache words u = c + 32768 (low half first) as exact fp16 pairs of the codes' bytes: c =
 * 256 hi + 256 lo with hi = c >> 8 (signed) and lo = (c & 255) / 256. A byte b goes into the
 * mantissa of an fp16 constant with unit 1 (1024 + b) or 1/256 (4 + b/256), and one subtraction
 * removes the constant; u's high byte is hi + 128 already (the offset binary of attn.h saves the
 * flip of the sign bit: ncu had the ALU pipe the busiest in the exact prefill, at 56 %): 4
 * instructions for both parts of two codes (codes_bf16: 10). LOB: lo is left as 4 + lo (one
 * subtraction less); the caller removes 4 x (the sum of the A hi parts) from the products. */
template <bool LOB = false>
__device__ __forceinline__ void codes_f16(uint32_t u, uint32_t *hi, uint32_t *lo) {
    const uint32_t k1152 = 0x64806480u, k4 = 0x44004400u; /* fp16 1152 and 4 */
    uint32_t h = __byte_perm(u, 0x64u, 0x4341);           /* 1024 + (hi + 128) */
    uint32_t l = __byte_perm(u, 0x44u, 0x4240);           /* 4 + lo */
    __half2 hh = __hsub2(*(const __half2 *)&h, *(const __half2 *)&k1152);
    *hi = *(uint32_t *)&hh;
    if constexpr (LOB) {
        *lo = l;
    } else {
        __half2 ll = __hsub2(*(const __half2 *)&l, *(const __half2 *)&k4);
        *lo = *(uint32_t *)&ll;
    }
}

/* The exact products of one 16 x 16 B tile of codes (two n8 halves into c0 and c1) against A =
 * hi (a) and lo (al) fp16 parts: (ahi (bhi + blo) + alo bhi) / 256 over the codes' bytes; LOB:
 * plus 4 x the sum of the A hi parts over the 16 k (codes_f16). */
template <bool LOB = false>
__device__ __forceinline__ void byte_products(float *c0, float *c1, const uint32_t *a,
                                              const uint32_t *al, const uint32_t *b) {
    uint32_t bh[4], bl[4];
#pragma unroll
    for (int x = 0; x < 4; x++)
        codes_f16<LOB>(b[x], &bh[x], &bl[x]);
    mma16816h(c0, a, bh);
    mma16816h(c1, a, bh + 2);
    mma16816h(c0, a, bl);
    mma16816h(c1, a, bl + 2);
    mma16816h(c0, al, bh);
    mma16816h(c1, al, bh + 2);
}

/* ---- decode on tensor cores: the default (attn_dec.cuh) -------------------------------------- */

/* The rows of one decode launch (lily_attn_drow each), by value in the kernels' parameters. */
struct dec_rows {
    lily_attn_drow r[LILY_ATTN_ROWS];
};

/* grid (the rows' largest max_splits, Nkv * MT, R) with MT = ceil(G / 8): block (s, y, i) runs
 * attn_decode_body for row i (nothing past the row's own max_splits). */
template <int DH, bool EX>
__global__ void __launch_bounds__(kDw * 32, 1)
    attn_decode_mma_kernel(const __grid_constant__ dec_rows rows, int Nkv, int G, float qscale,
                           int want) {
    extern __shared__ uint4 dec_smem[];
    const lily_attn_drow &r = rows.r[blockIdx.z];
    if ((int)blockIdx.x >= r.max_splits) return;
    attn_decode_body<DH, EX, false>(r.q, (const uint8_t *)r.kc, (const uint8_t *)r.vc, r.d_pos, Nkv,
                                    G, qscale, r.max_splits, want, r.part, blockIdx.x, blockIdx.y,
                                    (uint16_t *)dec_smem);
}

/* grid (Nq, Dh / 32, R), 256 threads; dynamic smem: min(max_splits, want) floats of the rows'
 * largest max_splits. Block (h, cb, i) runs attn_combine_body for row i. */
__global__ void __launch_bounds__(256)
    attn_combine2_kernel(const __grid_constant__ dec_rows rows, int Nq, int Dh, int want) {
    extern __shared__ float fs[];
    const lily_attn_drow &r = rows.r[blockIdx.z];
    attn_combine_body<false>(r.part, r.d_pos, Nq, Dh, r.max_splits, want, r.gate, r.out, blockIdx.x,
                             blockIdx.y, fs);
}

/* lily_cuda_attn_decode_force_splits: the split target of the decode calls, 0 = automatic */
int g_decode_want = 0;

template <int DH, bool EX>
int launch_decode_mma(const dec_rows &rows, int R, int Nq, int Nkv, float scale,
                      lily_cuda_stream st, lily_err *e) {
    const size_t smem = dec2_cfg<DH>::smem;
    /* blocks resident at once, per device (and variant): set up once, so the host cost stays off
     * the step */
    static int resident[64];
    int dev = 0;
    LILY_CU_TRY(cudaGetDevice(&dev), e);
    if (dev < 0 || dev >= 64) return lily_fail(e, "attention: device %d out of range", dev);
    if (resident[dev] == 0) {
        int occ = 0, nsm = 0;
        LILY_CU_TRY(cudaFuncSetAttribute(attn_decode_mma_kernel<DH, EX>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e);
        LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &occ, attn_decode_mma_kernel<DH, EX>, kDw * 32, smem),
                    e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev), e);
        if (occ < 1) return lily_fail(e, "attention: decode kernel does not fit on an SM");
        resident[dev] = nsm * occ;
    }
    const int G = Nq / Nkv, MT = (G + 7) / 8;
    /* one wave: as many splits as fill the SMs (blocks of a split past the live context exit) */
    int want = g_decode_want > 0 ? g_decode_want : resident[dev] / (Nkv * MT);
    if (want < 1) want = 1;
    int ms = 1;
    for (int i = 0; i < R; i++)
        ms = rows.r[i].max_splits > ms ? rows.r[i].max_splits : ms;
    dim3 grid(ms, Nkv * MT, R);
    attn_decode_mma_kernel<DH, EX>
        <<<grid, kDw * 32, smem, st>>>(rows, Nkv, G, scale * kLog2e, want);
    LILY_CU_LAUNCHED(e);
    size_t fsm = (size_t)(want < ms ? want : ms) * sizeof(float);
    attn_combine2_kernel<<<dim3(Nq, DH / 32, R), 256, fsm, st>>>(rows, Nq, DH, want);
    LILY_CU_LAUNCHED(e);
    return 0;
}

/* ---- prefill: flash attention on mma.sync -------------------------------------------------- */

constexpr int kFaRows = 64; /* query rows per block: (position, head-in-group) pairs */
constexpr int kFaKv = 32;   /* KV positions per tile */
/* warp groups splitting a block's KV tiles (more do not fit: each warp holds a 16 x Dh fp32
 * accumulator) */
constexpr int kFaGroups = 2;

/* Barrier of the 128 threads of warp group grp (ids 1.. ; 0 is __syncthreads). */
__device__ __forceinline__ void group_bar(int grp) {
    asm volatile("bar.sync %0, 128;" ::"r"(grp + 1) : "memory");
}

/* grid (ceil(n / (64/G)), Nkv), NG groups of 4 warps. Warp w of a group owns query rows
 * 16w..16w+15 (every group has all 64 rows); group k takes KV tiles k, k+NG, ..., streamed two
 * deep with cp.async, and the groups' (m, l, O) are merged at the end. Scores are in the log2
 * domain (scale * log2(e) and the K scales applied to S); tiles wholly below the block's first
 * query position skip the causal mask. The K/V codes are split into bf16 hi (and, EX, lo) in
 * registers after ldmatrix, by each warp for its own products: converting a tile once in shared
 * memory would need room for the hi and lo tiles, which Dh 256 with two groups did not have
 * (head dim 256 now runs attn_wg.h's and attn_fa.h's kernels; this one runs 64 and 128).
 * EX: the codes split into their bytes as exact fp16 values instead (codes_f16: hi = c >> 8,
 * lo = (c & 255) / 256, 5 instructions per two codes where the bf16 split takes 11), q and P into
 * fp16 hi + lo (q lo as a second smem tile); products qhi*(khi + klo) + qlo*khi and likewise
 * P V give S / 256 and O / 256 (the qlo*klo terms, <= 2^-19 of a row's largest, are dropped).
 * fp16's narrow exponent range is handled by powers of two: each q row scaled to a max in
 * [2^12, 2^13) (undone on S), each KV tile's V scales relative to its largest (O rescaled when
 * that factor changes, like the running max); cheaper than the bf16 split. */
template <int DH, bool EX> struct fa_cfg {
    static constexpr int LD = DH + 8; /* padded smem row (16-bit words): no ldmatrix conflicts */
    static constexpr int QT = EX ? 2 : 1; /* Q tiles in smem: hi (and lo) */
    /* one stage (16-bit words): K code rows, V code rows, kFaKv K then kFaKv V scales (fp32) */
    static constexpr int TILE = 2 * kFaKv * LD + 2 * kFaKv * 2;
    /* bytes: the Q tiles, then two stages per warp group */
    static constexpr size_t smem(int NG) {
        return (size_t)(QT * kFaRows * LD + NG * 2 * TILE) * 2;
    }
};

template <int DH, int G, int NG, bool EX, int KB>
__global__ void __launch_bounds__(128 * NG)
    attn_prefill_kernel(const float *__restrict__ q, int n, const uint8_t *__restrict__ kc,
                        const uint8_t *__restrict__ vc, const int32_t *d_pos, int Nkv, float scale,
                        const float *__restrict__ gate, float *__restrict__ out) {
    typedef fa_cfg<DH, EX> C;
    constexpr int P = kFaRows / G; /* positions per block */
    constexpr int LD = C::LD, QT = C::QT, TILE = C::TILE;
    extern __shared__ uint4 fa_smem[];
    uint16_t *Qs = (uint16_t *)fa_smem, *Ql = Qs + (QT - 1) * kFaRows * LD;
    /* the last query tiles (the longest causal spans) first: the short ones then fill the
     * grid's last wave instead of the longest */
    const int Nq = Nkv * G, j = blockIdx.y, qt = gridDim.x - 1 - blockIdx.x;
    const int p0 = *d_pos, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = warp / 4, wr = warp % 4, gt = tid % 128;
    const int g = lane >> 2, tq = lane & 3;
    uint16_t *stg = Qs + QT * kFaRows * LD + grp * 2 * TILE;
    const int last_t = min(n, (qt + 1) * P) - 1;
    const int kv_end = p0 + last_t + 1; /* positions 0..kv_end-1 are needed */
    const int qmin = p0 + qt * P;       /* the block's first query position */
    const int ntile = (kv_end + kFaKv - 1) / kFaKv;
    const int mine = ntile > grp ? (ntile - grp + NG - 1) / NG : 0;
    const uint32_t row = (uint32_t)kv_row_bytes(Nkv, DH);
    const uint8_t *kh = kc + (size_t)j * DH * 2, *vh = vc + (size_t)j * DH * 2;
    /* thread gt < 2 kFaKv copies one scale per tile: K (gt < kFaKv) or V of row gt % kFaKv */
    const uint8_t *ss = (gt < kFaKv ? kc : vc) + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    auto load = [&](int i) { /* tile i of this group into stage i & 1 */
                             if (i < mine) {
                                 int kv0 = (grp + i * NG) * kFaKv;
                                 uint16_t *Ks = stg + (i & 1) * TILE, *Vs = Ks + kFaKv * LD;
                                 float *Ss = (float *)(Vs + kFaKv * LD);
                                 for (int x = gt; x < kFaKv * DH / 8; x += 128) {
                                     int r = x / (DH / 8), c8 = x % (DH / 8);
                                     int p = kv0 + r;
                                     bool ok = p < kv_end;
                                     size_t go = (size_t)(ok ? p : 0) * row + c8 * 16;
                                     cp_async16(Ks + r * LD + c8 * 8, kh + go, ok);
                                     cp_async16(Vs + r * LD + c8 * 8, vh + go, ok);
                                 }
                                 if (gt < 2 * kFaKv) {
                                     int p = kv0 + gt % kFaKv;
                                     bool ok = p < kv_end;
                                     cp_async4(Ss + gt, ss + (size_t)(ok ? p : 0) * row, ok);
                                 }
                             }
                             cp_async_commit();
    };
    load(0);
    /* EX: each query row scaled by a power of two that puts its max |q| in [2^12, 2^13): fp16's
     * exponent range is narrow, and q's lo parts must stay normal (undone on S per row) */
    __shared__ float s_qsc[kFaRows];
    if (EX) {
        for (int r = warp; r < kFaRows; r += 4 * NG) {
            const int t = qt * P + r / G, h = j * G + r % G;
            float mx = 0.f;
            if (t < n)
                for (int d = lane; d < DH; d += 32)
                    mx = fmaxf(mx, fabsf(q[(size_t)t * Nq * DH + (size_t)h * DH + d]));
#pragma unroll
            for (int o2 = 16; o2 > 0; o2 >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
            const uint32_t ex = (__float_as_uint(mx) >> 23) & 255u;
            if (lane == 0)
                s_qsc[r] = ex >= 13u && ex <= 254u ? __uint_as_float((266u - ex) << 23) : 1.f;
        }
        __syncthreads();
    }
    /* Q tile -> bf16 hi (and lo) in smem (rows past n zero) */
    for (int i = tid; i < kFaRows * DH / 4; i += 128 * NG) {
        int r = i / (DH / 4), c4 = i % (DH / 4);
        int t = qt * P + r / G, h = j * G + r % G;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < n) x = *(const float4 *)(q + (size_t)t * Nq * DH + (size_t)h * DH + c4 * 4);
        uint32_t h0, l0, h1, l1;
        if (EX) { /* fp16: the products with the codes' bytes (codes_f16) */
            const float sc = s_qsc[r];
            x.x *= sc, x.y *= sc, x.z *= sc, x.w *= sc;
            split_f16x2(x.x, x.y, &h0, &l0);
            split_f16x2(x.z, x.w, &h1, &l1);
        } else {
            split_bf16x2(x.x, x.y, &h0, &l0);
            split_bf16x2(x.z, x.w, &h1, &l1);
        }
        *(uint2 *)(Qs + r * LD + c4 * 4) = make_uint2(h0, h1);
        if (EX) *(uint2 *)(Ql + r * LD + c4 * 4) = make_uint2(l0, l1);
    }
    __syncthreads();
    /* KB >= 1: S's K lo parts keep their bias of 4 (codes_f16<true>), so the products carry 4 x
     * the row's sum of q hi parts, removed from every score: one subtraction per score instead of
     * one per two codes of every tile (the bias adds under a tenth of the hi products' magnitude
     * to the fp32 sums, so their rounding stays where it was). */
    __shared__ float s_qb[kFaRows];
    if (KB) {
        for (int r = warp; r < kFaRows; r += 4 * NG) {
            float sm = 0.f;
            for (int d = lane; d < DH; d += 32)
                sm += __half2float(((const __half *)Qs)[r * LD + d]);
#pragma unroll
            for (int o2 = 16; o2 > 0; o2 >>= 1)
                sm += __shfl_xor_sync(0xffffffffu, sm, o2);
            if (lane == 0) s_qb[r] = 4.f * sm;
        }
        __syncthreads();
    }
    /* rows of this thread's accumulators: r0 = 16 wr + g, r1 = r0 + 8 */
    const int r0 = wr * 16 + g, r1 = r0 + 8;
    const float qb0 = KB ? s_qb[r0] : 0.f, qb1 = KB ? s_qb[r1] : 0.f;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions (rows past n: beyond) */
    const float sl2 = scale * kLog2e;
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float of_vf = 1.f; /* EX: the V-scale factor O is kept in (see the softmax step) */
    for (int it = 0; it < mine; it++) {
        load(it + 1);
        cp_async_wait<1>();
        group_bar(grp); /* tile it landed for the whole group */
        const uint16_t *Ks = stg + (it & 1) * TILE, *Vs = Ks + kFaKv * LD;
        const float *Ss = (const float *)(Vs + kFaKv * LD);
        const int kv0 = (grp + it * NG) * kFaKv;
        /* S = Q K^T for this warp's 16 rows x 32 positions */
        float sacc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint32_t a[4], al[4];
            ldsm_x4(a, Qs + (wr * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
            if (EX) ldsm_x4(al, Ql + (wr * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4], bh[4], bl[4];
                ldsm_x4(b, Ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                               ((lane >> 3) & 1) * 8);
                if (EX) { /* S / 256 = qhi (khi + klo) + qlo khi over the code bytes */
                    byte_products<(KB >= 1)>(sacc[2 * np], sacc[2 * np + 1], a, al, b);
                } else {
#pragma unroll
                    for (int x = 0; x < 4; x++)
                        codes_bf16<false>(b[x], &bh[x], &bl[x]);
                    mma16816(sacc[2 * np], a, bh);
                    mma16816(sacc[2 * np + 1], a, bh + 2);
                }
            }
        }
        /* scale (per column: K scale), causal mask (only where the tile reaches a query
         * position), online softmax */
        const bool full = kv0 + kFaKv - 1 <= qmin;
        /* EX: the products gave S / 256 of the scaled q rows */
        const float sl2a = EX ? sl2 * 256.f / s_qsc[r0] : sl2;
        const float sl2b = EX ? sl2 * 256.f / s_qsc[r1] : sl2;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const float2 ks = *(const float2 *)(Ss + nt * 8 + 2 * tq);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int p = kv0 + nt * 8 + 2 * tq + (e & 1);
                const float sv = KB ? sacc[nt][e] - (e < 2 ? qb0 : qb1) : sacc[nt][e];
                float v = sv * ((e & 1 ? ks.y : ks.x) * (e < 2 ? sl2a : sl2b));
                if (!full && p > (e < 2 ? qp0 : qp1)) v = -INFINITY;
                sacc[nt][e] = v;
            }
        }
        /* EX: P's fp16 parts need the V scales relative to a power of two vf of the tile
         * (vscale_factor); O is kept times the vf of the last tile (of = vf_now / vf_before
         * rescales it when that changes) */
        float vf = 1.f;
        if (EX) vf = vscale_factor(warp_max(Ss[kFaKv + lane]));
        const float of = vf / of_vf;
        of_vf = vf;
        float d0, d1;
        softmax_tile<4>(&sacc[0][0], Ss + kFaKv, vf, of, tq, m0, m1, l0, l1, d0, d1);
        if (__any_sync(0xffffffffu, d0 != 1.f || d1 != 1.f)) {
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
                o[i][0] *= d0, o[i][1] *= d0, o[i][2] *= d1, o[i][3] *= d1;
        }
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t a[4], al[4];
            if (EX) {
                split_f16x2(sacc[2 * kk][0], sacc[2 * kk][1], &a[0], &al[0]);
                split_f16x2(sacc[2 * kk][2], sacc[2 * kk][3], &a[1], &al[1]);
                split_f16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1], &a[2], &al[2]);
                split_f16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3], &a[3], &al[3]);
            } else {
                split_bf16x2(sacc[2 * kk][0], sacc[2 * kk][1], &a[0], &al[0]);
                split_bf16x2(sacc[2 * kk][2], sacc[2 * kk][3], &a[1], &al[1]);
                split_bf16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1], &a[2], &al[2]);
                split_bf16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3], &a[3], &al[3]);
            }
#pragma unroll
            for (int dp = 0; dp < DH / 16; dp++) {
                uint32_t b[4], bh[4], bl[4];
                ldsm_x4_t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                 (lane >> 4) * 8);
                if (EX) { /* O / 256 = phi (vhi + vlo) + plo vhi over the code bytes */
                    byte_products(o[2 * dp], o[2 * dp + 1], a, al, b);
                } else {
#pragma unroll
                    for (int x = 0; x < 4; x++)
                        codes_bf16<false>(b[x], &bh[x], &bl[x]);
                    mma16816(o[2 * dp], a, bh);
                    mma16816(o[2 * dp + 1], a, bh + 2);
                }
            }
        }
        group_bar(grp); /* stage it & 1 is reloaded next iteration */
    }
    cp_async_wait<0>();
    if (EX) { /* undo the tile factor and the byte products' 1/256 */
        const float u = 256.f / of_vf;
#pragma unroll
        for (int i = 0; i < DH / 8; i++)
            o[i][0] *= u, o[i][1] *= u, o[i][2] *= u, o[i][3] *= u;
    }
    if (NG > 1) { /* group 1 hands its (m, l, O) to group 0 through the stage memory */
        __syncthreads();
        float *xo = (float *)(Qs + kFaRows * LD); /* [DH / 2 + 4][128]: conflict-free */
        if (grp == 1) {
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    xo[(i * 4 + e) * 128 + gt] = o[i][e];
            xo[(DH / 2) * 128 + gt] = m0, xo[(DH / 2 + 1) * 128 + gt] = m1;
            xo[(DH / 2 + 2) * 128 + gt] = l0, xo[(DH / 2 + 3) * 128 + gt] = l1;
        }
        __syncthreads();
        if (grp == 1) return;
        float n0 = xo[(DH / 2) * 128 + gt], n1 = xo[(DH / 2 + 1) * 128 + gt];
        /* group 0 always holds tile 0, so m0, m1 are finite */
        float M0 = fmaxf(m0, n0), M1 = fmaxf(m1, n1);
        float fa0 = exp2f(m0 - M0), fa1 = exp2f(m1 - M1);
        float fb0 = n0 == -INFINITY ? 0.f : exp2f(n0 - M0);
        float fb1 = n1 == -INFINITY ? 0.f : exp2f(n1 - M1);
        l0 = l0 * fa0 + xo[(DH / 2 + 2) * 128 + gt] * fb0;
        l1 = l1 * fa1 + xo[(DH / 2 + 3) * 128 + gt] * fb1;
#pragma unroll
        for (int i = 0; i < DH / 8; i++) {
            o[i][0] = o[i][0] * fa0 + xo[(i * 4 + 0) * 128 + gt] * fb0;
            o[i][1] = o[i][1] * fa0 + xo[(i * 4 + 1) * 128 + gt] * fb0;
            o[i][2] = o[i][2] * fa1 + xo[(i * 4 + 2) * 128 + gt] * fb1;
            o[i][3] = o[i][3] * fa1 + xo[(i * 4 + 3) * 128 + gt] * fb1;
        }
    }
    /* normalise, gate, store */
    float il0 = l0 > 0.f ? 1.0f / l0 : 0.f, il1 = l1 > 0.f ? 1.0f / l1 : 0.f;
    const int h0 = j * G + r0 % G, h1 = j * G + r1 % G;
#pragma unroll
    for (int i = 0; i < DH / 8; i++) {
        int d = i * 8 + 2 * tq;
        if (t0 < n) {
            size_t off = (size_t)t0 * Nq * DH + (size_t)h0 * DH + d;
            float x0 = o[i][0] * il0, x1 = o[i][1] * il0;
            if (gate) x0 *= sigmoid_f(gate[off]), x1 *= sigmoid_f(gate[off + 1]);
            *(float2 *)(out + off) = make_float2(x0, x1);
        }
        if (t1 < n) {
            size_t off = (size_t)t1 * Nq * DH + (size_t)h1 * DH + d;
            float x0 = o[i][2] * il1, x1 = o[i][3] * il1;
            if (gate) x0 *= sigmoid_f(gate[off]), x1 *= sigmoid_f(gate[off + 1]);
            *(float2 *)(out + off) = make_float2(x0, x1);
        }
    }
}

template <int DH, int G, int NG, bool EX, int KB>
int launch_prefill_ng(const float *q, int n, const uint8_t *kc, const uint8_t *vc,
                      const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
                      lily_cuda_stream st, lily_err *e) {
    constexpr int P = kFaRows / G;
    constexpr size_t smem = fa_cfg<DH, EX>::smem(NG);
    static_assert(smem <= 227 * 1024, "prefill tiles exceed the shared memory of an SM");
    LILY_CU_TRY(cudaFuncSetAttribute(attn_prefill_kernel<DH, G, NG, EX, KB>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                e);
    dim3 grid((n + P - 1) / P, Nkv);
    attn_prefill_kernel<DH, G, NG, EX, KB>
        <<<grid, 128 * NG, smem, st>>>(q, n, kc, vc, d_pos, Nkv, scale, gate, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

template <int DH, int G>
int launch_prefill(const float *q, int n, const uint8_t *kc, const uint8_t *vc,
                   const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
                   lily_cuda_stream st, lily_err *e) {
    if (lily_cuda_prec_get().attn_exact)
        return launch_prefill_ng<DH, G, kFaGroups, true, 1>(q, n, kc, vc, d_pos, Nkv, scale, gate,
                                                            out, st, e);
    return launch_prefill_ng<DH, G, kFaGroups, false, 0>(q, n, kc, vc, d_pos, Nkv, scale, gate, out,
                                                         st, e);
}

bool shape_ok(int Nq, int Nkv, int Dh) {
    if (Nkv < 1 || Nq % Nkv) return false;
    int G = Nq / Nkv;
    return (Dh == 64 || Dh == 128 || Dh == 256) &&
           (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

} // namespace

extern "C" size_t lily_cuda_kv_bytes(int max_ctx, int Nkv, int Dh) {
    return max_ctx < 1 ? 0 : (size_t)max_ctx * kv_row_bytes(Nkv, Dh);
}

extern "C" size_t lily_cuda_kv_prefix_bytes(int pos, int Nkv, int Dh) {
    return lily_cuda_kv_bytes(pos, Nkv, Dh); /* rows are position-major */
}

extern "C" int lily_cuda_attn_prep(const float *qg, int ldqg, const float *k, const float *v,
                                   int ldkv, int n, const int32_t *d_pos, int Nq, int Nkv, int Dh,
                                   int R, const float *inv_freq, const float *qn, const float *kn,
                                   float eps, int gated, float *q_out, float *gate_out, void *kc,
                                   void *vc, lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh) || R < 0 || R > Dh || R % 2)
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d R=%d", Nq, Nkv, Dh, R);
    if (n < 1) return 0;
    prep_caches cs = {};
    cs.kc[0] = (uint8_t *)kc, cs.vc[0] = (uint8_t *)vc;
    dim3 grid(n, Nq + Nkv);
    attn_prep_kernel<<<grid, Dh, 0, st>>>(qg, ldqg, k, v, ldkv, d_pos, Nq, Nkv, Dh, R, inv_freq, qn,
                                          kn, eps, gated, q_out, gate_out, Nq * Dh, cs);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" int lily_cuda_attn_prep_rows(const float *qg, int ldqg, const float *k, const float *v,
                                        int ldkv, int n, const int32_t *d_pos, int Nq, int Nkv,
                                        int Dh, int R, const float *inv_freq, const float *qn,
                                        const float *kn, float eps, int gated, float *q_out,
                                        float *gate_out, int ldq, void *const *kc, void *const *vc,
                                        lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh) || R < 0 || R > Dh || R % 2)
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d R=%d", Nq, Nkv, Dh, R);
    if (n < 1 || n > LILY_ATTN_ROWS)
        return lily_fail(e, "attention prep: %d rows (1..%d)", n, LILY_ATTN_ROWS);
    if (ldq < Nq * Dh) return lily_fail(e, "attention prep: q stride %d < %d", ldq, Nq * Dh);
    prep_caches cs = {};
    cs.rows = 1;
    for (int i = 0; i < n; i++) {
        if (!kc[i] || !vc[i]) return lily_fail(e, "attention prep: row %d has no cache", i);
        cs.kc[i] = (uint8_t *)kc[i], cs.vc[i] = (uint8_t *)vc[i];
    }
    dim3 grid(n, Nq + Nkv);
    attn_prep_kernel<<<grid, Dh, 0, st>>>(qg, ldqg, k, v, ldkv, d_pos, Nq, Nkv, Dh, R, inv_freq, qn,
                                          kn, eps, gated, q_out, gate_out, ldq, cs);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" void lily_cuda_attn_decode_force_splits(int want) {
    g_decode_want = want > 0 ? want : 0;
}

extern "C" size_t lily_cuda_attn_decode_scratch(int Nq, int Dh, int max_splits) {
    return (size_t)max_splits * Nq * (Dh + 2);
}

namespace {
template <int DH>
int launch_decode(const dec_rows &rows, int R, int Nq, int Nkv, float scale, lily_cuda_stream st,
                  lily_err *e) {
    if (lily_cuda_prec_get().attn_exact)
        return launch_decode_mma<DH, true>(rows, R, Nq, Nkv, scale, st, e);
    return launch_decode_mma<DH, false>(rows, R, Nq, Nkv, scale, st, e);
}
} // namespace

extern "C" int lily_cuda_attn_decode_rows(const lily_attn_drow *r, int R, int Nq, int Nkv, int Dh,
                                          float scale, lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    if (R < 1 || R > LILY_ATTN_ROWS)
        return lily_fail(e, "attention: %d decode rows (1..%d)", R, LILY_ATTN_ROWS);
    dec_rows rows = {};
    for (int i = 0; i < R; i++) {
        if (r[i].max_splits < 1 || !r[i].q || !r[i].kc || !r[i].vc || !r[i].part || !r[i].out)
            return lily_fail(e, "attention: decode row %d lacks a buffer or splits", i);
        rows.r[i] = r[i];
    }
    if (Dh == 64) return launch_decode<64>(rows, R, Nq, Nkv, scale, st, e);
    if (Dh == 128) return launch_decode<128>(rows, R, Nq, Nkv, scale, st, e);
    return launch_decode<256>(rows, R, Nq, Nkv, scale, st, e);
}

extern "C" int lily_cuda_attn_decode(const float *q, const void *kc, const void *vc,
                                     const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                     const float *gate, float *scratch, int max_splits, float *out,
                                     lily_cuda_stream st, lily_err *e) {
    const lily_attn_drow r = {q, kc, vc, d_pos, gate, scratch, max_splits, out};
    return lily_cuda_attn_decode_rows(&r, 1, Nq, Nkv, Dh, scale, st, e);
}

#define LILY_PRE_CASE(DH, G) \
    if (Dh == DH && G_ == G) \
        return launch_prefill<DH, G>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, st, e);

extern "C" int lily_cuda_attn_prefill(const float *q, int n, const void *kc_, const void *vc_,
                                      const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                      const float *gate, float *out, float *part,
                                      lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    if (n < 1) return 0;
    /* head dim 256 (every G of shape_ok): the wgmma kernels, exact (attn_wg.h) or one-pass
     * (attn_fa.h); 64 and 128: this file's mma.sync kernel */
    if (lily_cuda_attn_wg_ok(Nq, Nkv, Dh)) {
        if (lily_cuda_prec_get().attn_exact)
            return lily_cuda_attn_prefill_ws(q, n, kc_, vc_, d_pos, Nq, Nkv, Dh, scale, gate, out,
                                             part, st, e);
        return lily_cuda_attn_prefill_fa(q, n, kc_, vc_, d_pos, Nq, Nkv, Dh, scale, gate, out, part,
                                         st, e);
    }
    const uint8_t *kc = (const uint8_t *)kc_, *vc = (const uint8_t *)vc_;
    int G_ = Nq / Nkv;
    // clang-format off
    LILY_PRE_CASE(64, 1) LILY_PRE_CASE(64, 2) LILY_PRE_CASE(64, 4) LILY_PRE_CASE(64, 8)
    LILY_PRE_CASE(64, 16) LILY_PRE_CASE(128, 1) LILY_PRE_CASE(128, 2) LILY_PRE_CASE(128, 4)
    LILY_PRE_CASE(128, 8) LILY_PRE_CASE(128, 16)
        // clang-format on
        return lily_fail(e, "attention: no kernel for Dh=%d G=%d", Dh, G_);
}
