/* Attention kernels (see attn.h). */
#include "backend/cuda/attn.h"

#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/common.cuh"

namespace {

/* ---- KV cache elements (format: attn.h) ------------------------------------------------------ */

/* fp16 bits of a cache value: round to nearest even, |x| > 65504 saturates to +-65504 (an inf in
 * K or V would turn the attention output into NaN); NaN stays NaN. */
__device__ __forceinline__ uint16_t kv_f16(float x) {
    x = fabsf(x) > 65504.f ? copysignf(65504.f, x) : x;
    return __half_as_ushort(__float2half_rn(x));
}

/* ---- prep: norms, RoPE, cache append --------------------------------------------------------- */

/* grid (n, Nq + Nkv), block Dh threads. Block y < Nq: query head; else KV head y - Nq. */
__global__ void attn_prep_kernel(const float *__restrict__ qg, int ldqg,
                                 const float *__restrict__ k,
                                 const float *__restrict__ v, int ldkv, const int32_t *d_pos,
                                 int Nq, int Nkv, int Dh, int R, const float *__restrict__ inv_freq,
                                 const float *__restrict__ qn, const float *__restrict__ kn,
                                 float eps, int gated, float *q_out, float *gate_out,
                                 uint16_t *kc, uint16_t *vc) { /* fp16 bits */
    __shared__ float red[32];
    __shared__ float xs[256];
    int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    int pos = *d_pos + t;
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
        size_t o = (size_t)t * Nq * Dh + (size_t)h * Dh + d;
        q_out[o] = x;
        if (gated) gate_out[o] = src[Dh + d];
    } else {
        int j = h - Nq;
        size_t o = (size_t)pos * Nkv * Dh + (size_t)j * Dh + d;
        kc[o] = kv_f16(x);
        vc[o] = kv_f16(v[(size_t)t * ldkv + (size_t)j * Dh + d]);
    }
}

/* ---- tensor-core helpers (decode and prefill) ---------------------------------------------- */

/* 16-byte async copy global -> shared; zero-fills when !valid. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    int sz = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(sz));
}

/* ---- decode on tensor cores: the default ------------------------------------------------------
 * A block takes one KV head, up to 8 query heads of its group and one split of the positions;
 * its kDw warps each stream their own 16-position chunks (K and V) with 16-byte cp.async, kDst
 * chunks deep, and synchronise only within the warp. Scores S = Q K^T and the product P V run
 * on mma.sync m16n8k16 (fp16 in, fp32 accumulate) with q and P split into fp16 hi + lo parts,
 * which fill the 16 rows of the A operand (rows 0-7: hi of heads 0-7, rows 8-15: lo), so the
 * results are those of fp32 q and P against the fp16 cache (to about 2^-22 relative) while
 * every K/V element is read from shared memory once and the lo rows cost no extra product.
 * Scores are in the log2 domain (scale * log2(e) folded into q). The warps' (m, l, acc) are
 * merged in a fixed order and each split writes one partial per head for the combine. */

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

/* fp16 mma.sync (fp32 accumulate) without the volatile of the shared helpers: a pure register
 * operation the compiler may schedule freely (the ldmatrix loads stay volatile: they read what
 * cp.async wrote). */
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Two floats as an fp16 pair (round to nearest even, x0 in the low half: one cvt). */
__device__ __forceinline__ uint32_t pack_f16x2(float x0, float x1) {
    __half2 h = __floats2half2_rn(x0, x1);
    return *(uint32_t *)&h;
}

/* fp16 hi and lo parts of x (hi = fp16(x), lo = fp16(x - hi)), packed for two values:
 * x ~ hi + lo to about 2^-22 relative, or 2^-25 absolute where x - hi is below fp16's normal
 * range (2^-14), which is far below what q.k and the sums of P can resolve. */
__device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    __half2 h = __floats2half2_rn(x0, x1);
    float2 f = __half22float2(h);
    __half2 l = __floats2half2_rn(x0 - f.x, x1 - f.y);
    *hi = *(uint32_t *)&h;
    *lo = *(uint32_t *)&l;
}

template <int DH> struct dec2_cfg {
    static constexpr int LD = DH + 8; /* padded smem row (fp16): conflict-free ldmatrix */
    static constexpr int kChunk = 2 * 16 * LD; /* fp16 of one stage: K then V rows */
    static constexpr size_t smem = (size_t)(16 * LD + kDw * kDst * kChunk) * 2;
};

/* grid (max_splits, Nkv * MT) with MT = ceil(G / 8): block y takes KV head y / MT and query
 * heads 8 (y % MT) .. of its group. Writes per (split, q head): acc[DH], m (natural log), l. */
template <int DH>
__global__ void __launch_bounds__(kDw * 32, 1)
    attn_decode_mma_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
                           const uint16_t *__restrict__ vc, const int32_t *d_pos, int Nkv,
                           int G, float qscale, int max_splits, int want,
                           float *__restrict__ part) {
    typedef dec2_cfg<DH> C;
    constexpr int LD = C::LD;
    extern __shared__ uint4 dec_smem[];
    uint16_t *Qs = (uint16_t *)dec_smem;
    const int ctx = *d_pos + 1;
    int ns, chunk;
    dec2_splits(ctx, max_splits, want, &ns, &chunk);
    const int s = blockIdx.x;
    if (s >= ns) return;
    const int MT = (G + 7) / 8, j = blockIdx.y / MT, hb = (blockIdx.y % MT) * 8;
    const int hn = min(8, G - hb), Nq = Nkv * G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    /* q (scaled into the log2 domain) as fp16 hi (rows 0-7) and lo (rows 8-15) */
    for (int i = tid; i < 8 * DH / 2; i += kDw * 32) {
        int r = i / (DH / 2), d = (i % (DH / 2)) * 2;
        float x0 = 0.f, x1 = 0.f;
        if (r < hn) {
            const float *qp = q + (size_t)(j * G + hb + r) * DH + d;
            x0 = qp[0] * qscale, x1 = qp[1] * qscale;
        }
        uint32_t hi, lo;
        split_f16x2(x0, x1, &hi, &lo);
        *(uint32_t *)(Qs + r * LD + d) = hi;
        *(uint32_t *)(Qs + (r + 8) * LD + d) = lo;
    }
    const int pb = s * chunk, pe = min(ctx, pb + chunk);
    const int nch = (pe - pb + 15) / 16;                              /* chunks of this split */
    const int mine = nch > warp ? (nch - warp + kDw - 1) / kDw : 0; /* this warp's: w, w+kDw.. */
    uint16_t *stg = Qs + 16 * LD + warp * kDst * C::kChunk;
    const size_t row = (size_t)Nkv * DH;
    const uint16_t *kb = kc + (size_t)j * DH, *vb = vc + (size_t)j * DH;
    /* issues chunk i of this warp into its stage i % kDst (rows past the split read as zero) */
    auto load = [&](int i) {
        if (i < mine) {
            uint16_t *Ks = stg + (i % kDst) * C::kChunk, *Vs = Ks + 16 * LD;
            int p0 = pb + (warp + i * kDw) * 16;
#pragma unroll
            for (int it = 0; it < DH / 16; it++) {
                int idx = lane + 32 * it, r = idx / (DH / 8), c8 = idx % (DH / 8);
                int p = p0 + r;
                bool ok = p < pe;
                size_t go = (size_t)(ok ? p : 0) * row + c8 * 8;
                cp_async16(Ks + r * LD + c8 * 8, kb + go, ok);
                cp_async16(Vs + r * LD + c8 * 8, vb + go, ok);
            }
        }
        cp_async_commit(); /* an empty group past the end keeps the wait count uniform */
    };
#pragma unroll
    for (int i = 0; i < kDst - 1; i++) load(i);
    __syncthreads(); /* Q tile written */
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m = -INFINITY, l = 0.f; /* head g; l: this thread's positions only */
    for (int i = 0; i < mine; i++) {
        load(i + kDst - 1);
        cp_async_wait<kDst - 1>();
        __syncwarp(); /* every lane's copies of chunk i are visible to the warp */
        const uint16_t *Ks = stg + (i % kDst) * C::kChunk, *Vs = Ks + 16 * LD;
        /* S (rows: q hi / lo, columns: 16 positions); two accumulator sets halve the chains */
        float sa[2][2][4];
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int n = 0; n < 2; n++) sa[u][n][0] = sa[u][n][1] = sa[u][n][2] = sa[u][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint32_t a[4], b[4];
            ldsm_x4(a, Qs + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
            ldsm_x4(b, Ks + ((lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma16816(sa[kk & 1][0], a, b);
            mma16816(sa[kk & 1][1], a, b + 2);
        }
        const int p0 = pb + (warp + i * kDw) * 16;
        float sc[2][2], mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = (sa[0][n][e] + sa[1][n][e]) + (sa[0][n][e + 2] + sa[1][n][e + 2]);
                v = p0 + n * 8 + 2 * tq + e < pe ? v : -INFINITY;
                sc[n][e] = v;
                mx = fmaxf(mx, v);
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
            float p0v = exp2f(sc[n][0] - mn), p1v = exp2f(sc[n][1] - mn);
            ps += p0v + p1v;
            split_f16x2(p0v, p1v, &a[2 * n], &a[2 * n + 1]);
        }
        l = l * c + ps;
        if (__any_sync(0xffffffffu, c != 1.f)) { /* the running max moved: rescale */
#pragma unroll
            for (int d = 0; d < DH / 8; d++) o[d][0] *= c, o[d][1] *= c, o[d][2] *= c, o[d][3] *= c;
        }
        /* O += P V: A = P (rows hi / lo, k = the 16 positions), B = V via transposed ldmatrix */
#pragma unroll
        for (int dp = 0; dp < DH / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_t(b, Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                             (lane >> 4) * 8);
            mma16816(o[2 * dp], a, b);
            mma16816(o[2 * dp + 1], a, b + 2);
        }
        __syncwarp(); /* chunk i's stage is reloaded by the next iteration */
    }
    cp_async_wait<0>();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    /* merge the warps (fixed order: the result does not depend on scheduling) */
    __syncthreads(); /* all stages consumed: reuse them for the merge */
    float *wm = (float *)(Qs + 16 * LD), *wl = wm + kDw * 8, *acc = wl + kDw * 8;
    float *M = acc + 8 * DH, *L = M + 8;
    if (tq == 0) wm[warp * 8 + g] = m, wl[warp * 8 + g] = l;
    __syncthreads();
    if (tid < 8) {
        float mm = -INFINITY, ll = 0.f;
        for (int w = 0; w < kDw; w++) mm = fmaxf(mm, wm[w * 8 + tid]);
        for (int w = 0; w < kDw; w++)
            if (wm[w * 8 + tid] != -INFINITY) ll += wl[w * 8 + tid] * exp2f(wm[w * 8 + tid] - mm);
        M[tid] = mm, L[tid] = ll;
    }
    __syncthreads();
    const float f = m == -INFINITY ? 0.f : exp2f(m - M[g]);
    for (int w = 0; w < kDw; w++) {
        if (warp == w)
#pragma unroll
            for (int d = 0; d < DH / 8; d++) {
                float *ap = acc + g * DH + d * 8 + 2 * tq;
                float v0 = (o[d][0] + o[d][2]) * f, v1 = (o[d][1] + o[d][3]) * f;
                if (w == 0) ap[0] = v0, ap[1] = v1;
                else ap[0] += v0, ap[1] += v1;
            }
        __syncthreads();
    }
    for (int i = tid; i < hn * DH; i += kDw * 32) {
        int h = i / DH, d = i % DH;
        float *pp = part + ((size_t)s * Nq + j * G + hb + h) * (DH + 2);
        pp[d] = acc[h * DH + d];
        if (d == 0) pp[DH] = M[h] * kLn2, pp[DH + 1] = L[h];
    }
}

/* grid (Nq, Dh / 32), 8 warps; dynamic smem: max_splits floats. Merges the splits of 32 columns
 * of one head: warp w sums splits w, w + 8, ..., then the warps add in a fixed order. */
__global__ void __launch_bounds__(256)
    attn_combine2_kernel(const float *__restrict__ part, const int32_t *d_pos, int Nq, int Dh,
                         int max_splits, int want, const float *__restrict__ gate,
                         float *__restrict__ out) {
    pdl_trigger(); /* lets the output projection's GEMV issue its weight loads meanwhile */
    extern __shared__ float fs[];
    __shared__ float red[32], accs[8][33];
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = blockIdx.y * 32 + lane;
    int ns, chunk;
    dec2_splits(*d_pos + 1, max_splits, want, &ns, &chunk);
    const size_t st = (size_t)Nq * (Dh + 2);
    const float *ph = part + (size_t)h * (Dh + 2);
    float mx = -INFINITY;
    for (int s = tid; s < ns; s += 256) mx = fmaxf(mx, ph[s * st + Dh]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < 8; w++) mx = fmaxf(mx, red[w]);
    float ls = 0.f;
    for (int s = tid; s < ns; s += 256) {
        float f = expf(ph[s * st + Dh] - mx);
        fs[s] = f;
        ls += ph[s * st + Dh + 1] * f;
    }
    const float L = block_sum(ls, red); /* its barriers also publish fs */
    float a = 0.f;
    for (int s = warp; s < ns; s += 8) a = fmaf(ph[s * st + d], fs[s], a);
    accs[warp][lane] = a;
    __syncthreads();
    if (warp == 0) {
        float o = accs[0][lane];
        for (int w = 1; w < 8; w++) o += accs[w][lane];
        o /= L;
        if (gate) o *= sigmoid_f(gate[(size_t)h * Dh + d]);
        out[(size_t)h * Dh + d] = o;
    }
}

template <int DH>
int launch_decode_mma(const float *q, const uint16_t *kc, const uint16_t *vc,
                      const int32_t *d_pos, int Nq, int Nkv, float scale, const float *gate,
                      float *part, int max_splits, float *out, lily_cuda_stream st, lily_err *e) {
    const size_t smem = dec2_cfg<DH>::smem;
    /* blocks resident at once, per device: set up once, so the host cost stays off the step */
    static int resident[64];
    int dev = 0;
    LILY_CU_TRY(cudaGetDevice(&dev), e);
    if (dev < 0 || dev >= 64) return lily_fail(e, "attention: device %d out of range", dev);
    if (resident[dev] == 0) {
        int occ = 0, nsm = 0;
        LILY_CU_TRY(cudaFuncSetAttribute(attn_decode_mma_kernel<DH>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e);
        LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &occ, attn_decode_mma_kernel<DH>, kDw * 32, smem),
                    e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev), e);
        if (occ < 1) return lily_fail(e, "attention: decode kernel does not fit on an SM");
        resident[dev] = nsm * occ;
    }
    const int G = Nq / Nkv, MT = (G + 7) / 8;
    /* one wave: as many splits as fill the SMs (blocks of a split past the live context exit) */
    int want = resident[dev] / (Nkv * MT);
    const char *ov = getenv("LILY_CUDA_ATTN_SPLITS"); /* measurement override */
    if (ov && atoi(ov) > 0) want = atoi(ov);
    if (want < 1) want = 1;
    dim3 grid(max_splits, Nkv * MT);
    attn_decode_mma_kernel<DH><<<grid, kDw * 32, smem, st>>>(q, kc, vc, d_pos, Nkv, G,
                                                             scale * kLog2e, max_splits, want,
                                                             part);
    LILY_CU_LAUNCHED(e);
    size_t fsm = (size_t)(want < max_splits ? want : max_splits) * sizeof(float);
    attn_combine2_kernel<<<dim3(Nq, DH / 32), 256, fsm, st>>>(part, d_pos, Nq, DH, max_splits,
                                                              want, gate, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

/* ---- prefill: flash attention on mma.sync -------------------------------------------------- */

constexpr int kFaRows = 64; /* query rows per block: (position, head-in-group) pairs */
constexpr int kFaKv = 32;   /* KV positions per tile */
/* warp groups splitting a block's KV tiles (H200, 512 tokens at depth 130560: one group 6.58 ms,
 * two 4.67 ms; more do not fit: each warp holds a 16 x Dh fp32 accumulator) */
constexpr int kFaGroups = 2;

/* Barrier of the 128 threads of warp group grp (ids 1.. ; 0 is __syncthreads). */
__device__ __forceinline__ void group_bar(int grp) {
    asm volatile("bar.sync %0, 128;" ::"r"(grp + 1) : "memory");
}

/* grid (ceil(n / (64/G)), Nkv), NG groups of 4 warps. Warp w of a group owns query rows
 * 16w..16w+15 (every group has all 64 rows); group k takes KV tiles k, k+NG, ..., streamed two
 * deep with cp.async, and the groups' (m, l, O) are merged at the end. Scores are in the log2
 * domain (scale * log2(e) applied to S); tiles wholly below the block's first query position
 * skip the causal mask. Products: mma.sync m16n8k16, fp16 in, fp32 accumulate, one pass with q
 * and P rounded once to fp16 (attn.h: why that is enough); the fp16 K/V tiles go from shared
 * memory straight into ldmatrix. */
template <int DH, int G, int NG>
__global__ void __launch_bounds__(128 * NG)
    attn_prefill_kernel(const float *__restrict__ q, int n, const uint16_t *__restrict__ kc,
                        const uint16_t *__restrict__ vc, const int32_t *d_pos, int Nkv,
                        float scale, const float *__restrict__ gate, float *__restrict__ out) {
    constexpr int P = kFaRows / G; /* positions per block */
    constexpr int LD = DH + 8;     /* padded smem row (fp16): conflict-free ldmatrix */
    constexpr int TILE = 2 * kFaKv * LD; /* one stage: K rows then V rows */
    extern __shared__ uint4 fa_smem[];
    uint16_t *Qs = (uint16_t *)fa_smem;
    const int Nq = Nkv * G, j = blockIdx.y, qt = blockIdx.x;
    const int p0 = *d_pos, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = warp / 4, wr = warp % 4, gt = tid % 128;
    const int g = lane >> 2, tq = lane & 3;
    uint16_t *stg = Qs + kFaRows * LD + grp * 2 * TILE;
    const int last_t = min(n, (qt + 1) * P) - 1;
    const int kv_end = p0 + last_t + 1; /* positions 0..kv_end-1 are needed */
    const int qmin = p0 + qt * P;       /* the block's first query position */
    const int ntile = (kv_end + kFaKv - 1) / kFaKv;
    const int mine = ntile > grp ? (ntile - grp + NG - 1) / NG : 0;
    const size_t row = (size_t)Nkv * DH;
    auto load = [&](int i) { /* tile i of this group into stage i & 1 */
        if (i < mine) {
            int kv0 = (grp + i * NG) * kFaKv;
            uint16_t *Ks = stg + (i & 1) * TILE, *Vs = Ks + kFaKv * LD;
            for (int x = gt; x < kFaKv * DH / 8; x += 128) {
                int r = x / (DH / 8), c8 = x % (DH / 8);
                int p = kv0 + r;
                bool ok = p < kv_end;
                size_t go = (size_t)(ok ? p : 0) * row + (size_t)j * DH + c8 * 8;
                cp_async16(Ks + r * LD + c8 * 8, kc + go, ok);
                cp_async16(Vs + r * LD + c8 * 8, vc + go, ok);
            }
        }
        cp_async_commit();
    };
    load(0);
    /* Q tile -> fp16 smem (rows past n zero), unscaled: scale * log2(e) multiplies S in fp32,
     * so q only has to fit fp16 itself (|q| <= sqrt(Dh) * max|q norm weight| after the RMSNorm) */
    for (int i = tid; i < kFaRows * DH / 4; i += 128 * NG) {
        int r = i / (DH / 4), c4 = i % (DH / 4);
        int t = qt * P + r / G, h = j * G + r % G;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < n) x = *(const float4 *)(q + (size_t)t * Nq * DH + (size_t)h * DH + c4 * 4);
        uint2 pk = make_uint2(pack_f16x2(x.x, x.y), pack_f16x2(x.z, x.w));
        *(uint2 *)(Qs + r * LD + c4 * 4) = pk;
    }
    __syncthreads();
    /* rows of this thread's accumulators: r0 = 16 wr + g, r1 = r0 + 8 */
    const int r0 = wr * 16 + g, r1 = r0 + 8;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions (rows past n: beyond) */
    const float sl2 = scale * kLog2e;
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    for (int it = 0; it < mine; it++) {
        load(it + 1);
        cp_async_wait<1>();
        group_bar(grp); /* tile it landed for the whole group */
        const uint16_t *Ks = stg + (it & 1) * TILE, *Vs = Ks + kFaKv * LD;
        const int kv0 = (grp + it * NG) * kFaKv;
        /* S = Q K^T for this warp's 16 rows x 32 positions */
        float sacc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, Qs + (wr * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4];
                ldsm_x4(b, Ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                               ((lane >> 3) & 1) * 8);
                mma16816(sacc[2 * np], a, b);
                mma16816(sacc[2 * np + 1], a, b + 2);
            }
        }
        /* scale, causal mask (only where the tile reaches a query position), online softmax */
        const bool full = kv0 + kFaKv - 1 <= qmin;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int p = kv0 + nt * 8 + 2 * tq + (e & 1);
                float v = sacc[nt][e] * sl2;
                if (!full && p > (e < 2 ? qp0 : qp1)) v = -INFINITY;
                sacc[nt][e] = v;
                if (e < 2) mx0 = fmaxf(mx0, v);
                else mx1 = fmaxf(mx1, v);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        /* a row with nothing valid yet keeps m = -inf: use 0 as the base to avoid inf - inf */
        float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
        float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            sacc[nt][0] = exp2f(sacc[nt][0] - b0);
            sacc[nt][1] = exp2f(sacc[nt][1] - b0);
            sacc[nt][2] = exp2f(sacc[nt][2] - b1);
            sacc[nt][3] = exp2f(sacc[nt][3] - b1);
            s0 += sacc[nt][0] + sacc[nt][1];
            s1 += sacc[nt][2] + sacc[nt][3];
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
        m0 = mn0;
        m1 = mn1;
        if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) { /* deep in the cache: rarely */
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
                o[i][0] *= c0, o[i][1] *= c0, o[i][2] *= c1, o[i][3] *= c1;
        }
        /* O += P V with P in [0, 1] rounded once to fp16 (2^-12 relative, like q) */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t a[4];
            a[0] = pack_f16x2(sacc[2 * kk][0], sacc[2 * kk][1]);
            a[1] = pack_f16x2(sacc[2 * kk][2], sacc[2 * kk][3]);
            a[2] = pack_f16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
            a[3] = pack_f16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DH / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                 (lane >> 4) * 8);
                mma16816(o[2 * dp], a, b);
                mma16816(o[2 * dp + 1], a, b + 2);
            }
        }
        group_bar(grp); /* stage it & 1 is reloaded next iteration */
    }
    cp_async_wait<0>();
    if (NG > 1) { /* group 1 hands its (m, l, O) to group 0 through the stage memory */
        __syncthreads();
        float *xo = (float *)(Qs + kFaRows * LD); /* [DH / 2 + 4][128]: conflict-free */
        if (grp == 1) {
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) xo[(i * 4 + e) * 128 + gt] = o[i][e];
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

template <int DH, int G, int NG>
int launch_prefill_ng(const float *q, int n, const uint16_t *kc, const uint16_t *vc,
                      const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
                      lily_cuda_stream st, lily_err *e) {
    constexpr int P = kFaRows / G;
    /* bytes: the Q tile, then two stages (K and V rows) per warp group, fp16 rows of DH + 8 */
    constexpr size_t smem = (size_t)(kFaRows + NG * 4 * kFaKv) * (DH + 8) * 2;
    static_assert(smem <= 227 * 1024, "prefill tiles exceed the shared memory of an SM");
    LILY_CU_TRY(cudaFuncSetAttribute(attn_prefill_kernel<DH, G, NG>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                e);
    dim3 grid((n + P - 1) / P, Nkv);
    attn_prefill_kernel<DH, G, NG><<<grid, 128 * NG, smem, st>>>(q, n, kc, vc, d_pos, Nkv, scale,
                                                                  gate, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

template <int DH, int G>
int launch_prefill(const float *q, int n, const uint16_t *kc, const uint16_t *vc,
                   const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
                   lily_cuda_stream st, lily_err *e) {
    return launch_prefill_ng<DH, G, kFaGroups>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, st, e);
}

bool shape_ok(int Nq, int Nkv, int Dh) {
    if (Nkv < 1 || Nq % Nkv) return false;
    int G = Nq / Nkv;
    return (Dh == 64 || Dh == 128 || Dh == 256) &&
           (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

} // namespace

extern "C" size_t lily_cuda_kv_bytes(int max_ctx, int Nkv, int Dh) {
    return max_ctx < 1 ? 0 : (size_t)max_ctx * Nkv * Dh * 2; /* fp16, no padding */
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
    dim3 grid(n, Nq + Nkv);
    attn_prep_kernel<<<grid, Dh, 0, st>>>(qg, ldqg, k, v, ldkv, d_pos, Nq, Nkv, Dh, R, inv_freq,
                                          qn, kn, eps, gated, q_out, gate_out, (uint16_t *)kc,
                                          (uint16_t *)vc);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" size_t lily_cuda_attn_decode_scratch(int Nq, int Dh, int max_splits) {
    return (size_t)max_splits * Nq * (Dh + 2);
}

extern "C" int lily_cuda_attn_decode(const float *q, const void *kc_, const void *vc_,
                                     const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                     const float *gate, float *scratch, int max_splits, float *out,
                                     lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh) || max_splits < 1)
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    const uint16_t *kc = (const uint16_t *)kc_, *vc = (const uint16_t *)vc_; /* fp16 bits */
    if (Dh == 64)
        return launch_decode_mma<64>(q, kc, vc, d_pos, Nq, Nkv, scale, gate, scratch, max_splits,
                                     out, st, e);
    if (Dh == 128)
        return launch_decode_mma<128>(q, kc, vc, d_pos, Nq, Nkv, scale, gate, scratch,
                                      max_splits, out, st, e);
    return launch_decode_mma<256>(q, kc, vc, d_pos, Nq, Nkv, scale, gate, scratch, max_splits,
                                  out, st, e);
}

#define LILY_PRE_CASE(DH, G)                                                                       \
    if (Dh == DH && G_ == G)                                                                       \
        return launch_prefill<DH, G>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, st, e);

extern "C" int lily_cuda_attn_prefill(const float *q, int n, const void *kc_, const void *vc_,
                                      const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                      const float *gate, float *out, lily_cuda_stream st,
                                      lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    if (n < 1) return 0;
    const uint16_t *kc = (const uint16_t *)kc_, *vc = (const uint16_t *)vc_; /* fp16 bits */
    int G_ = Nq / Nkv;
    LILY_PRE_CASE(64, 1) LILY_PRE_CASE(64, 2) LILY_PRE_CASE(64, 4) LILY_PRE_CASE(64, 8)
    LILY_PRE_CASE(64, 16) LILY_PRE_CASE(128, 1) LILY_PRE_CASE(128, 2) LILY_PRE_CASE(128, 4)
    LILY_PRE_CASE(128, 8) LILY_PRE_CASE(128, 16) LILY_PRE_CASE(256, 1) LILY_PRE_CASE(256, 2)
    LILY_PRE_CASE(256, 4) LILY_PRE_CASE(256, 8) LILY_PRE_CASE(256, 16)
    return lily_fail(e, "attention: no kernel for Dh=%d G=%d", Dh, G_);
}
