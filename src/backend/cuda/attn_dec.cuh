/* The decode attention on tensor cores (attn.h), as device functions that a block runs for one
 * (split, KV head group) and one (query head, 32 columns) merge: attn.cu's kernels are thin
 * wrappers over them and the persistent decode kernel (mega.cu) calls the same bodies from its
 * tiles. The tensor-core helpers here are shared with attn.cu's prefill. C++ only. */
#ifndef LILY_BACKEND_CUDA_ATTN_DEC_CUH
#define LILY_BACKEND_CUDA_ATTN_DEC_CUH

#include <math.h>
#include <stdint.h>

#include "backend/cuda/attn_kv.cuh"
#include "backend/cuda/common.cuh"

namespace {

/* ---- tensor-core helpers (decode and prefill) ---------------------------------------------- */

/* 16-byte async copy global -> shared; zero-fills when !valid. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    int sz = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(sz));
}
/* 4-byte async copy (a row's scale); zero-fills when !valid. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    int sz = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(a), "l"(gmem), "r"(sz));
}

/* Round-to-nearest-even bf16 of x0 (low half) and x1 (high half): one cvt instruction. */
__device__ __forceinline__ uint32_t bf16x2_rn(float x0, float x1) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
    return r;
}

/* Two cache words u = c + 32768 (low half first, as ldmatrix delivers them) -> bf16 hi parts of
 * the codes c, and with EX the lo parts: c = hi + lo exactly (|c| <= 32767: hi has 8 significant
 * bits, |lo| <= 64 is an integer, exact in bf16). The fp32 value of c comes without a conversion
 * instruction: u placed in the mantissa of 2^23, minus 2^23 + 2^15. lo is packed by taking the
 * upper halves (exact: a small integer's low 16 bits are zero). 5 instructions for hi only, 10
 * with lo. */
template <bool EX>
__device__ __forceinline__ void codes_bf16(uint32_t u, uint32_t *hi, uint32_t *lo) {
    float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7410)) - 8421376.f;
    float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7432)) - 8421376.f;
    uint32_t h = bf16x2_rn(f0, f1);
    *hi = h;
    if (EX) {
        float l0 = f0 - __uint_as_float(h << 16), l1 = f1 - __uint_as_float(h & 0xffff0000u);
        *lo = __byte_perm(__float_as_uint(l0), __float_as_uint(l1), 0x7632);
    }
}

/* ---- decode on tensor cores: the default ------------------------------------------------------
 * A block takes one KV head, up to 8 query heads of its group and one split of the positions;
 * its kDw warps each stream their own 16-position chunks (K and V codes and scales) with cp.async,
 * kDst chunks deep, and synchronise only within the warp. Scores S = Q K^T and the product P V
 * run on mma.sync m16n8k16 (bf16 in, fp32 accumulate) with q and P split into bf16 hi + lo parts,
 * which fill the 16 rows of the A operand (rows 0-7: hi of heads 0-7, rows 8-15: lo), so every
 * K/V element is read from shared memory once and the lo parts cost no extra product. The codes
 * go from shared memory to registers as int16 (ldmatrix moves 16-bit words of any type) and are
 * split there into bf16 hi (and, EX, lo: a second product per B tile, which then also gives the
 * qlo*klo terms); the K scale multiplies the score columns, the V scale is folded into P before
 * its split. Scores are in the log2 domain (scale * log2(e) folded into q). The warps' (m, l, acc)
 * are merged in a fixed order and each split writes one partial per head for the combine. */

constexpr int kDw = 4;       /* warps per block, each with its own cp.async pipeline */
constexpr int kDst = 3;      /* 16-position chunks in flight per warp */
constexpr int kDminPos = 64; /* positions per split at least: one chunk per warp */
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

/* Splits in use at a context of ctx positions (at most max_splits and want, at least kDminPos
 * positions each) and positions per split (a multiple of 16). Decode and combine agree on it. */
__device__ __forceinline__ void dec2_splits(int ctx, int max_splits, int want, int *ns,
                                            int *chunk) {
    int n = min(min(max_splits, want), (ctx + kDminPos - 1) / kDminPos);
    n = max(n, 1);
    int c = (ctx + n - 1) / n;
    c = (c + 15) & ~15;
    *chunk = c;
    *ns = (ctx + c - 1) / c;
}

/* mma.sync without the volatile of the shared helper: a pure register operation the compiler
 * may schedule freely (the ldmatrix loads stay volatile: they read what cp.async wrote). */
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* bf16 hi and lo parts of x (x ~ hi + lo to about 2^-17 relative), packed for two values
 * (round to nearest even, as f2bf, in cvt instructions). */
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    uint32_t h = bf16x2_rn(x0, x1);
    *hi = h;
    *lo = bf16x2_rn(x0 - __uint_as_float(h << 16), x1 - __uint_as_float(h & 0xffff0000u));
}

template <int DH> struct dec2_cfg {
    static constexpr int LD = DH + 8; /* padded smem row (16-bit words): conflict-free ldmatrix */
    /* 16-bit words of one stage: K code rows, V code rows, then 16 K and 16 V scales (fp32) */
    static constexpr int kChunk = 2 * 16 * LD + 2 * 16 * 2;
    static constexpr size_t smem = (size_t)(16 * LD + kDw * kDst * kChunk) * 2;
};

/* A float written by this launch (COH: L2-coherent, mega.cu) or before it. */
template <bool COH> __device__ __forceinline__ float dec_ld(const float *p) {
    return COH ? __ldcg(p) : *p;
}

/* The position *d_pos (COH: written before this launch, but read as mega.cu reads it: volatile). */
template <bool COH> __device__ __forceinline__ int dec_pos(const int32_t *d_pos) {
    if (COH) return *(volatile const int32_t *)d_pos;
    return *d_pos;
}

/* Barrier of the kDw warps that run the decode body (id 0 is __syncthreads): the per-op block is
 * exactly these warps; a larger block (mega.cu) runs the body on its warps 0..kDw-1 only. */
__device__ __forceinline__ void dec_bar() {
    asm volatile("bar.sync 1, %0;" ::"n"(kDw * 32) : "memory");
}

/* The work of one block of the split decode: split s (of dec2_splits(ctx, max_splits, want)) and
 * y in [0, Nkv * MT) with MT = ceil(G / 8): KV head y / MT and query heads 8 (y % MT) .. of its
 * group, run by warps 0..kDw-1 (threads 0..kDw*32-1); Qs: dec2_cfg<DH>::smem bytes of shared
 * memory, 16-byte aligned. Writes per (split, q head h) part[(s Nq + h) (DH + 2) + d]: acc[DH],
 * then m (natural log) and l. A split past the context's ns returns at once. EX: the exact
 * products (attn.h); else K and V hi only. COH: q and the cache may have been written by other
 * blocks of the same launch (mega.cu): every global read is L2-coherent (q through ld.global.cg,
 * the code rows through cp.async.cg, the scales through ld.global.cg into a register, stored
 * into the stage at the warp's next chunk issue, so their latency stays hidden like the
 * copies'; *d_pos volatile); else the plain loads and cp.async.ca of the per-op kernel. */
template <int DH, bool EX, bool COH>
__device__ __forceinline__ void
attn_decode_body(const float *__restrict__ q, const uint8_t *__restrict__ kc,
                 const uint8_t *__restrict__ vc, const int32_t *d_pos, int Nkv, int G, float qscale,
                 int max_splits, int want, float *__restrict__ part, int s, int y, uint16_t *Qs) {
    typedef dec2_cfg<DH> C;
    constexpr int LD = C::LD;
    const int ctx = dec_pos<COH>(d_pos) + 1;
    int ns, chunk;
    dec2_splits(ctx, max_splits, want, &ns, &chunk);
    if (s >= ns) return;
    const int MT = (G + 7) / 8, j = y / MT, hb = (y % MT) * 8;
    const int hn = min(8, G - hb), Nq = Nkv * G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    /* q (scaled into the log2 domain) as bf16 hi (rows 0-7) and lo (rows 8-15) */
    for (int i = tid; i < 8 * DH / 2; i += kDw * 32) {
        int r = i / (DH / 2), d = (i % (DH / 2)) * 2;
        float x0 = 0.f, x1 = 0.f;
        if (r < hn) {
            const float *qp = q + (size_t)(j * G + hb + r) * DH + d;
            x0 = dec_ld<COH>(qp) * qscale, x1 = dec_ld<COH>(qp + 1) * qscale;
        }
        uint32_t hi, lo;
        split_bf16x2(x0, x1, &hi, &lo);
        *(uint32_t *)(Qs + r * LD + d) = hi;
        *(uint32_t *)(Qs + (r + 8) * LD + d) = lo;
    }
    const int pb = s * chunk, pe = min(ctx, pb + chunk);
    const int nch = (pe - pb + 15) / 16;                            /* chunks of this split */
    const int mine = nch > warp ? (nch - warp + kDw - 1) / kDw : 0; /* this warp's: w, w+kDw.. */
    uint16_t *stg = Qs + 16 * LD + warp * kDst * C::kChunk;
    const uint32_t row = (uint32_t)kv_row_bytes(Nkv, DH);
    const uint8_t *kb = kc + (size_t)j * DH * 2, *vb = vc + (size_t)j * DH * 2;
    /* this lane's scale copy: lanes 0-15 K, 16-31 V (head j's scale in a row) */
    const uint8_t *sb = (lane < 16 ? kc : vc) + (size_t)Nkv * DH * 2 + (size_t)j * 4;
    float sc_pend = 0.f; /* COH: this lane's scale of the warp's chunk issued last */
    /* issues chunk i of this warp into its stage i % kDst (rows past the split read as zero);
     * COH: first stores chunk i - 1's scale into its stage (read from iteration i - 1 on, after
     * its __syncwarp) */
    auto load = [&](int i) {
        if (COH && i >= 1 && i - 1 < mine)
            ((float *)(stg + ((i - 1) % kDst) * C::kChunk + 32 * LD))[lane] = sc_pend;
        if (i < mine) {
            uint16_t *Ks = stg + (i % kDst) * C::kChunk, *Vs = Ks + 16 * LD;
            float *Ss = (float *)(Vs + 16 * LD); /* [16] K scales, [16] V scales */
            int p0 = pb + (warp + i * kDw) * 16;
#pragma unroll
            for (int it = 0; it < DH / 16; it++) {
                int idx = lane + 32 * it, r = idx / (DH / 8), c8 = idx % (DH / 8);
                int p = p0 + r;
                bool ok = p < pe;
                size_t go = (size_t)(ok ? p : 0) * row + c8 * 16;
                cp_async16(Ks + r * LD + c8 * 8, kb + go, ok);
                cp_async16(Vs + r * LD + c8 * 8, vb + go, ok);
            }
            int p = p0 + (lane & 15);
            bool ok = p < pe;
            if (COH)
                sc_pend = ok ? __ldcg((const float *)(sb + (size_t)p * row)) : 0.f;
            else
                cp_async4(Ss + lane, sb + (size_t)(ok ? p : 0) * row, ok);
        }
        cp_async_commit(); /* an empty group past the end keeps the wait count uniform */
    };
#pragma unroll
    for (int i = 0; i < kDst - 1; i++)
        load(i);
    dec_bar(); /* Q tile written */
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m = -INFINITY, l = 0.f; /* head g; l: this thread's positions only */
    for (int i = 0; i < mine; i++) {
        load(i + kDst - 1);
        cp_async_wait<kDst - 1>();
        __syncwarp(); /* every lane's copies of chunk i are visible to the warp */
        const uint16_t *Ks = stg + (i % kDst) * C::kChunk, *Vs = Ks + 16 * LD;
        const float *Ss = (const float *)(Vs + 16 * LD);
        /* S (rows: q hi / lo, columns: 16 positions); two accumulator sets halve the chains */
        float sa[2][2][4];
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int n = 0; n < 2; n++)
                sa[u][n][0] = sa[u][n][1] = sa[u][n][2] = sa[u][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint32_t a[4], b[4], bh[4], bl[4];
            ldsm_x4(a, Qs + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
            ldsm_x4(b, Ks + ((lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int x = 0; x < 4; x++)
                codes_bf16<EX>(b[x], &bh[x], &bl[x]);
            mma16816(sa[kk & 1][0], a, bh);
            mma16816(sa[kk & 1][1], a, bh + 2);
            if (EX) {
                mma16816(sa[kk & 1][0], a, bl);
                mma16816(sa[kk & 1][1], a, bl + 2);
            }
        }
        const int p0 = pb + (warp + i * kDw) * 16;
        float sc[2][2], mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const float2 ks = *(const float2 *)(Ss + n * 8 + 2 * tq); /* columns' K scales */
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = (sa[0][n][e] + sa[1][n][e]) + (sa[0][n][e + 2] + sa[1][n][e + 2]);
                v *= e ? ks.y : ks.x;
                v = p0 + n * 8 + 2 * tq + e < pe ? v : -INFINITY;
                sc[n][e] = v;
                mx = fmaxf(mx, v);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx); /* finite: every chunk has a valid position */
        const float c = exp2f(m - mn);
        m = mn;
        float ps = 0.f;
        uint32_t a[4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const float2 vs = *(const float2 *)(Ss + 16 + n * 8 + 2 * tq); /* V scales */
            float p0v = exp2f(sc[n][0] - mn), p1v = exp2f(sc[n][1] - mn);
            ps += p0v + p1v;
            split_bf16x2(p0v * vs.x, p1v * vs.y, &a[2 * n], &a[2 * n + 1]);
        }
        l = l * c + ps;
        if (__any_sync(0xffffffffu, c != 1.f)) { /* the running max moved: rescale */
#pragma unroll
            for (int d = 0; d < DH / 8; d++)
                o[d][0] *= c, o[d][1] *= c, o[d][2] *= c, o[d][3] *= c;
        }
        /* O += P V: A = P (rows hi / lo, k = the 16 positions), B = V via transposed ldmatrix */
#pragma unroll
        for (int dp = 0; dp < DH / 16; dp++) {
            uint32_t b[4], bh[4], bl[4];
            ldsm_x4_t(b,
                      Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int x = 0; x < 4; x++)
                codes_bf16<EX>(b[x], &bh[x], &bl[x]);
            mma16816(o[2 * dp], a, bh);
            mma16816(o[2 * dp + 1], a, bh + 2);
            if (EX) {
                mma16816(o[2 * dp], a, bl);
                mma16816(o[2 * dp + 1], a, bl + 2);
            }
        }
        __syncwarp(); /* chunk i's stage is reloaded by the next iteration */
    }
    cp_async_wait<0>();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    /* merge the warps (fixed order: the result does not depend on scheduling) */
    dec_bar(); /* all stages consumed: reuse them for the merge */
    float *wm = (float *)(Qs + 16 * LD), *wl = wm + kDw * 8, *acc = wl + kDw * 8;
    float *M = acc + 8 * DH, *L = M + 8;
    if (tq == 0) wm[warp * 8 + g] = m, wl[warp * 8 + g] = l;
    dec_bar();
    if (tid < 8) {
        float mm = -INFINITY, ll = 0.f;
        for (int w = 0; w < kDw; w++)
            mm = fmaxf(mm, wm[w * 8 + tid]);
        for (int w = 0; w < kDw; w++)
            if (wm[w * 8 + tid] != -INFINITY) ll += wl[w * 8 + tid] * exp2f(wm[w * 8 + tid] - mm);
        M[tid] = mm, L[tid] = ll;
    }
    dec_bar();
    const float f = m == -INFINITY ? 0.f : exp2f(m - M[g]);
    for (int w = 0; w < kDw; w++) {
        if (warp == w)
#pragma unroll
            for (int d = 0; d < DH / 8; d++) {
                float *ap = acc + g * DH + d * 8 + 2 * tq;
                float v0 = (o[d][0] + o[d][2]) * f, v1 = (o[d][1] + o[d][3]) * f;
                if (w == 0)
                    ap[0] = v0, ap[1] = v1;
                else
                    ap[0] += v0, ap[1] += v1;
            }
        dec_bar();
    }
    for (int i = tid; i < hn * DH; i += kDw * 32) {
        int h = i / DH, d = i % DH;
        float *pp = part + ((size_t)s * Nq + j * G + hb + h) * (DH + 2);
        pp[d] = acc[h * DH + d];
        if (d == 0) pp[DH] = M[h] * kLn2, pp[DH + 1] = L[h];
    }
}

/* The merge of the splits of 32 columns (cb * 32 ..) of query head h, by a block of exactly 256
 * threads (8 warps; its __syncthreads are the whole block's): warp w sums splits w, w + 8, ...,
 * then the warps add in a fixed order; out[h Dh + d] = the normalised sum, times sigmoid(gate)
 * when gate != NULL. fs: shared memory for min(max_splits, want) floats. COH: part, gate and
 * *d_pos may have been written by other blocks of the same launch (mega.cu): L2-coherent
 * loads; else plain ones. */
template <bool COH>
__device__ __forceinline__ void
attn_combine_body(const float *__restrict__ part, const int32_t *d_pos, int Nq, int Dh,
                  int max_splits, int want, const float *__restrict__ gate, float *__restrict__ out,
                  int h, int cb, float *fs) {
    __shared__ float red[32], accs[8][33];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = cb * 32 + lane;
    int ns, chunk;
    dec2_splits(dec_pos<COH>(d_pos) + 1, max_splits, want, &ns, &chunk);
    const size_t st = (size_t)Nq * (Dh + 2);
    const float *ph = part + (size_t)h * (Dh + 2);
    float mx = -INFINITY;
    for (int s = tid; s < ns; s += 256)
        mx = fmaxf(mx, dec_ld<COH>(ph + s * st + Dh));
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < 8; w++)
        mx = fmaxf(mx, red[w]);
    float ls = 0.f;
    for (int s = tid; s < ns; s += 256) {
        float f = expf(dec_ld<COH>(ph + s * st + Dh) - mx);
        fs[s] = f;
        ls += dec_ld<COH>(ph + s * st + Dh + 1) * f;
    }
    const float L = block_sum(ls, red); /* its barriers also publish fs */
    float a = 0.f;
    for (int s = warp; s < ns; s += 8)
        a = fmaf(dec_ld<COH>(ph + s * st + d), fs[s], a);
    accs[warp][lane] = a;
    __syncthreads();
    if (warp == 0) {
        float o = accs[0][lane];
        for (int w = 1; w < 8; w++)
            o += accs[w][lane];
        o /= L;
        if (gate) o *= sigmoid_f(dec_ld<COH>(gate + (size_t)h * Dh + d));
        out[(size_t)h * Dh + d] = o;
    }
}

} // namespace

#endif
