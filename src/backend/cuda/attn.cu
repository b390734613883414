/* Attention kernels (see attn.h). */
#include "backend/cuda/attn.h"

#include <math.h>

#include "backend/cuda/common.cuh"

namespace {

/* ---- prep: norms, RoPE, cache append --------------------------------------------------------- */

/* grid (n, Nq + Nkv), block Dh threads. Block y < Nq: query head; else KV head y - Nq. */
__global__ void attn_prep_kernel(const float *__restrict__ qg, int ldqg,
                                 const float *__restrict__ k,
                                 const float *__restrict__ v, int ldkv, const int32_t *d_pos,
                                 int Nq, int Nkv, int Dh, int R, const float *__restrict__ inv_freq,
                                 const float *__restrict__ qn, const float *__restrict__ kn,
                                 float eps, int gated, float *q_out, float *gate_out,
                                 uint16_t *kc, uint16_t *vc) {
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
        kc[o] = f2bf(x);
        vc[o] = f2bf(v[(size_t)t * ldkv + (size_t)j * Dh + d]);
    }
}

/* ---- decode: split-K over the context ------------------------------------------------------ */

constexpr int kDecWarps = 8;
constexpr int kMinPerSplit = 256; /* few, long splits at short contexts: small merge */
constexpr int kDecPos = 4;        /* positions per warp step: K/V loads in flight */

/* Splits in use for a context of ctx positions, and positions per split. */
__device__ __forceinline__ void dec_splits(int ctx, int max_splits, int *ns, int *chunk) {
    int want = (ctx + kMinPerSplit - 1) / kMinPerSplit;
    if (want > max_splits) want = max_splits;
    int c = (ctx + want - 1) / want;
    *chunk = c;
    *ns = (ctx + c - 1) / c;
}

/* Raw bf16 K/V slice of one lane (DPL values) and its unpacking. */
template <int DPL> struct kvvec;
template <> struct kvvec<2> {
    typedef uint32_t raw;
    static __device__ __forceinline__ raw load(const uint16_t *p) { return *(const uint32_t *)p; }
    static __device__ __forceinline__ raw zero() { return 0u; }
    static __device__ __forceinline__ void unpack(raw a, float *o) {
        o[0] = lo_bf16(a), o[1] = hi_bf16(a);
    }
};
template <> struct kvvec<4> {
    typedef uint2 raw;
    static __device__ __forceinline__ raw load(const uint16_t *p) { return *(const uint2 *)p; }
    static __device__ __forceinline__ raw zero() { return make_uint2(0, 0); }
    static __device__ __forceinline__ void unpack(raw a, float *o) {
        o[0] = lo_bf16(a.x), o[1] = hi_bf16(a.x), o[2] = lo_bf16(a.y), o[3] = hi_bf16(a.y);
    }
};
template <> struct kvvec<8> {
    typedef uint4 raw;
    static __device__ __forceinline__ raw load(const uint16_t *p) { return *(const uint4 *)p; }
    static __device__ __forceinline__ raw zero() { return make_uint4(0, 0, 0, 0); }
    static __device__ __forceinline__ void unpack(raw a, float *o) {
        o[0] = lo_bf16(a.x), o[1] = hi_bf16(a.x), o[2] = lo_bf16(a.y), o[3] = hi_bf16(a.y);
        o[4] = lo_bf16(a.z), o[5] = hi_bf16(a.z), o[6] = lo_bf16(a.w), o[7] = hi_bf16(a.w);
    }
};

/* grid (max_splits, Nkv), kDecWarps warps. Writes per (split, q head): acc[Dh], m, l. */
template <int DPL, int G>
__global__ void __launch_bounds__(kDecWarps * 32)
    attn_decode_kernel(const float *__restrict__ q, const uint16_t *__restrict__ kc,
                       const uint16_t *__restrict__ vc, const int32_t *d_pos, int Nkv,
                       float scale, int max_splits, float *__restrict__ part) {
    constexpr int Dh = DPL * 32;
    __shared__ float sm_m[kDecWarps][G], sm_l[kDecWarps][G];
    __shared__ float sm_acc[G][Dh];
    const int ctx = *d_pos + 1;
    int ns, chunk;
    dec_splits(ctx, max_splits, &ns, &chunk);
    const int s = blockIdx.x, j = blockIdx.y;
    if (s >= ns) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int Nq = Nkv * G;
    float qv[G][DPL];
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int d = 0; d < DPL; d++)
            qv[h][d] = q[(size_t)(j * G + h) * Dh + lane * DPL + d] * scale;
    for (int i = threadIdx.x; i < G * Dh; i += blockDim.x) (&sm_acc[0][0])[i] = 0.f;
    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int h = 0; h < G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[h][d] = 0.f;
    }
    const int p0 = s * chunk, p1 = min(ctx, p0 + chunk);
    const size_t row = (size_t)Nkv * Dh, off = (size_t)j * Dh + lane * DPL;
    /* each warp takes kDecPos positions per step, their K/V loads issued together */
    for (int p = p0 + warp; p < p1; p += kDecWarps * kDecPos) {
        typename kvvec<DPL>::raw kr[kDecPos], vr[kDecPos];
#pragma unroll
        for (int u = 0; u < kDecPos; u++) {
            int pu = p + u * kDecWarps;
            kr[u] = pu < p1 ? kvvec<DPL>::load(kc + pu * row + off) : kvvec<DPL>::zero();
            vr[u] = pu < p1 ? kvvec<DPL>::load(vc + pu * row + off) : kvvec<DPL>::zero();
        }
#pragma unroll
        for (int u = 0; u < kDecPos; u++) {
            if (p + u * kDecWarps >= p1) break;
            float kv[DPL], vv[DPL];
            kvvec<DPL>::unpack(kr[u], kv);
            kvvec<DPL>::unpack(vr[u], vv);
#pragma unroll
            for (int h = 0; h < G; h++) {
                float dot = 0.f;
#pragma unroll
                for (int d = 0; d < DPL; d++) dot = fmaf(qv[h][d], kv[d], dot);
                dot = warp_sum(dot);
                float mn = fmaxf(m[h], dot);
                float c = expf(m[h] - mn), pr = expf(dot - mn);
                l[h] = l[h] * c + pr;
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[h][d] = fmaf(acc[h][d], c, pr * vv[d]);
                m[h] = mn;
            }
        }
    }
    if (lane == 0)
#pragma unroll
        for (int h = 0; h < G; h++) sm_m[warp][h] = m[h], sm_l[warp][h] = l[h];
    __syncthreads();
    float f[G];
#pragma unroll
    for (int h = 0; h < G; h++) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kDecWarps; w++) M = fmaxf(M, sm_m[w][h]);
        f[h] = m[h] == -INFINITY ? 0.f : expf(m[h] - M);
    }
    /* warps add in a fixed order, so the result does not depend on scheduling */
    for (int w = 0; w < kDecWarps; w++) {
        if (warp == w)
#pragma unroll
            for (int h = 0; h < G; h++)
#pragma unroll
                for (int d = 0; d < DPL; d++) sm_acc[h][lane * DPL + d] += acc[h][d] * f[h];
        __syncthreads();
    }
    for (int i = threadIdx.x; i < G * Dh; i += blockDim.x) {
        int h = i / Dh, d = i % Dh;
        float *pp = part + ((size_t)s * Nq + j * G + h) * (Dh + 2);
        pp[d] = sm_acc[h][d];
        if (d == 0) {
            float M = -INFINITY, L = 0.f;
            for (int w = 0; w < kDecWarps; w++) M = fmaxf(M, sm_m[w][h]);
            for (int w = 0; w < kDecWarps; w++)
                if (sm_m[w][h] != -INFINITY) L += sm_l[w][h] * expf(sm_m[w][h] - M);
            pp[Dh] = M;
            pp[Dh + 1] = L;
        }
    }
}

/* grid Nq, block Dh: merges the splits of one head. */
__global__ void attn_combine_kernel(const float *__restrict__ part, const int32_t *d_pos, int Nq,
                                    int Dh, int max_splits, const float *__restrict__ gate,
                                    float *__restrict__ out) {
    pdl_trigger(); /* lets the output projection's GEMV issue its weight loads meanwhile */
    int h = blockIdx.x, d = threadIdx.x;
    int ns, chunk;
    dec_splits(*d_pos + 1, max_splits, &ns, &chunk);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, part[((size_t)s * Nq + h) * (Dh + 2) + Dh]);
    float L = 0.f, acc = 0.f;
    for (int s = 0; s < ns; s++) {
        const float *pp = part + ((size_t)s * Nq + h) * (Dh + 2);
        float f = expf(pp[Dh] - M);
        L += pp[Dh + 1] * f;
        acc += pp[d] * f;
    }
    float o = acc / L;
    if (gate) o *= sigmoid_f(gate[(size_t)h * Dh + d]);
    out[(size_t)h * Dh + d] = o;
}

/* ---- prefill: flash attention on mma.sync -------------------------------------------------- */

constexpr int kFaRows = 64; /* query rows per block: (position, head-in-group) pairs */
constexpr int kFaKv = 32;   /* KV positions per tile */

/* 16-byte async copy global -> shared; zero-fills when !valid. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    int sz = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(sz));
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

/* grid (ceil(n / (64/G)), Nkv), 4 warps; warp w owns query rows 16w..16w+15. */
template <int DH, int G>
__global__ void __launch_bounds__(128)
    attn_prefill_kernel(const float *__restrict__ q, int n, const uint16_t *__restrict__ kc,
                        const uint16_t *__restrict__ vc, const int32_t *d_pos, int Nkv,
                        float scale, const float *__restrict__ gate, float *__restrict__ out) {
    constexpr int P = kFaRows / G; /* positions per block */
    constexpr int LD = DH + 8;     /* padded smem row (bf16): conflict-free ldmatrix */
    extern __shared__ uint4 fa_smem[];
    uint16_t *Qs = (uint16_t *)fa_smem, *Ks = Qs + kFaRows * LD, *Vs = Ks + kFaKv * LD;
    const int Nq = Nkv * G, j = blockIdx.y, qt = blockIdx.x;
    const int p0 = *d_pos, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    /* Q tile -> bf16 smem (invalid rows zero) */
    for (int i = tid; i < kFaRows * DH / 4; i += 128) {
        int r = i / (DH / 4), c4 = i % (DH / 4);
        int t = qt * P + r / G, h = j * G + r % G;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < n) x = *(const float4 *)(q + (size_t)t * Nq * DH + (size_t)h * DH + c4 * 4);
        uint2 pk = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
        *(uint2 *)(Qs + r * LD + c4 * 4) = pk;
    }
    /* rows of this thread's accumulators: r0 = 16w + g, r1 = r0 + 8 */
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int t0 = qt * P + r0 / G, t1 = qt * P + r1 / G;
    const int qp0 = p0 + t0, qp1 = p0 + t1; /* absolute query positions */
    const int last_t = min(n, (qt + 1) * P) - 1;
    const int kv_end = p0 + last_t + 1; /* positions 0..kv_end-1 are needed */
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const size_t row = (size_t)Nkv * DH;
    for (int kv0 = 0; kv0 < kv_end; kv0 += kFaKv) {
        __syncthreads(); /* previous tile fully consumed (and Q tile written, first time) */
        for (int i = tid; i < kFaKv * DH / 8; i += 128) {
            int r = i / (DH / 8), c8 = i % (DH / 8);
            int p = kv0 + r;
            bool ok = p < kv_end;
            size_t go = (size_t)(ok ? p : 0) * row + (size_t)j * DH + c8 * 8;
            cp_async16(Ks + r * LD + c8 * 8, kc + go, ok);
            cp_async16(Vs + r * LD + c8 * 8, vc + go, ok);
        }
        cp_async_wait_all();
        __syncthreads();
        /* S = Q K^T for this warp's 16 rows x 32 positions */
        float sacc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t b[4];
                ldsm_x4(b, Ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                               ((lane >> 3) & 1) * 8);
                mma_bf16(sacc[2 * np], a, b);
                mma_bf16(sacc[2 * np + 1], a, b + 2);
            }
        }
        /* scale, causal mask, online softmax (rows r0: elements 0,1; r1: 2,3) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int p = kv0 + nt * 8 + 2 * tq + (e & 1);
                bool ok = e < 2 ? (t0 < n && p <= qp0) : (t1 < n && p <= qp1);
                float v = ok ? sacc[nt][e] * scale : -INFINITY;
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
        float c0 = expf(m0 - b0), c1 = expf(m1 - b1);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            sacc[nt][0] = expf(sacc[nt][0] - b0);
            sacc[nt][1] = expf(sacc[nt][1] - b0);
            sacc[nt][2] = expf(sacc[nt][2] - b1);
            sacc[nt][3] = expf(sacc[nt][3] - b1);
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
#pragma unroll
        for (int i = 0; i < DH / 8; i++) o[i][0] *= c0, o[i][1] *= c0, o[i][2] *= c1, o[i][3] *= c1;
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t a[4];
            a[0] = pack_bf16x2(sacc[2 * kk][0], sacc[2 * kk][1]);
            a[1] = pack_bf16x2(sacc[2 * kk][2], sacc[2 * kk][3]);
            a[2] = pack_bf16x2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
            a[3] = pack_bf16x2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DH / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                 (lane >> 4) * 8);
                mma_bf16(o[2 * dp], a, b);
                mma_bf16(o[2 * dp + 1], a, b + 2);
            }
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

template <int DPL, int G>
void launch_decode(const float *q, const uint16_t *kc, const uint16_t *vc, const int32_t *d_pos,
                   int Nkv, float scale, int max_splits, float *part, lily_cuda_stream st) {
    dim3 grid(max_splits, Nkv);
    attn_decode_kernel<DPL, G><<<grid, kDecWarps * 32, 0, st>>>(q, kc, vc, d_pos, Nkv, scale,
                                                                max_splits, part);
}

template <int DH, int G>
int launch_prefill(const float *q, int n, const uint16_t *kc, const uint16_t *vc,
                   const int32_t *d_pos, int Nkv, float scale, const float *gate, float *out,
                   lily_cuda_stream st, lily_err *e) {
    constexpr int P = kFaRows / G;
    size_t smem = (size_t)(kFaRows + 2 * kFaKv) * (DH + 8) * 2;
    LILY_CU_TRY(cudaFuncSetAttribute(attn_prefill_kernel<DH, G>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                e);
    dim3 grid((n + P - 1) / P, Nkv);
    attn_prefill_kernel<DH, G><<<grid, 128, smem, st>>>(q, n, kc, vc, d_pos, Nkv, scale, gate,
                                                         out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

bool shape_ok(int Nq, int Nkv, int Dh) {
    if (Nkv < 1 || Nq % Nkv) return false;
    int G = Nq / Nkv;
    return (Dh == 64 || Dh == 128 || Dh == 256) &&
           (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

} // namespace

extern "C" int lily_cuda_attn_prep(const float *qg, int ldqg, const float *k, const float *v,
                                   int ldkv, int n, const int32_t *d_pos, int Nq, int Nkv, int Dh,
                                   int R, const float *inv_freq, const float *qn, const float *kn,
                                   float eps, int gated, float *q_out, float *gate_out,
                                   uint16_t *kc, uint16_t *vc, lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh) || R < 0 || R > Dh || R % 2)
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d R=%d", Nq, Nkv, Dh, R);
    if (n < 1) return 0;
    dim3 grid(n, Nq + Nkv);
    attn_prep_kernel<<<grid, Dh, 0, st>>>(qg, ldqg, k, v, ldkv, d_pos, Nq, Nkv, Dh, R, inv_freq,
                                          qn, kn, eps, gated, q_out, gate_out, kc, vc);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" size_t lily_cuda_attn_decode_scratch(int Nq, int Dh, int max_splits) {
    return (size_t)max_splits * Nq * (Dh + 2);
}

#define LILY_DEC_CASE(DPL, G)                                                                      \
    if (dpl == DPL && G_ == G)                                                                     \
        launch_decode<DPL, G>(q, kc, vc, d_pos, Nkv, scale, max_splits, scratch, st);

extern "C" int lily_cuda_attn_decode(const float *q, const uint16_t *kc, const uint16_t *vc,
                                     const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                                     const float *gate, float *scratch, int max_splits, float *out,
                                     lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh) || max_splits < 1)
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    int dpl = Dh / 32, G_ = Nq / Nkv;
    LILY_DEC_CASE(2, 1) LILY_DEC_CASE(2, 2) LILY_DEC_CASE(2, 4) LILY_DEC_CASE(2, 8)
    LILY_DEC_CASE(2, 16) LILY_DEC_CASE(4, 1) LILY_DEC_CASE(4, 2) LILY_DEC_CASE(4, 4)
    LILY_DEC_CASE(4, 8) LILY_DEC_CASE(4, 16) LILY_DEC_CASE(8, 1) LILY_DEC_CASE(8, 2)
    LILY_DEC_CASE(8, 4) LILY_DEC_CASE(8, 8) LILY_DEC_CASE(8, 16)
    LILY_CU_LAUNCHED(e);
    attn_combine_kernel<<<Nq, Dh, 0, st>>>(scratch, d_pos, Nq, Dh, max_splits, gate, out);
    LILY_CU_LAUNCHED(e);
    return 0;
}

#define LILY_PRE_CASE(DH, G)                                                                       \
    if (Dh == DH && G_ == G)                                                                       \
        return launch_prefill<DH, G>(q, n, kc, vc, d_pos, Nkv, scale, gate, out, st, e);

extern "C" int lily_cuda_attn_prefill(const float *q, int n, const uint16_t *kc,
                                      const uint16_t *vc, const int32_t *d_pos, int Nq, int Nkv,
                                      int Dh, float scale, const float *gate, float *out,
                                      lily_cuda_stream st, lily_err *e) {
    if (!shape_ok(Nq, Nkv, Dh))
        return lily_fail(e, "attention: unsupported shape Nq=%d Nkv=%d Dh=%d", Nq, Nkv, Dh);
    if (n < 1) return 0;
    int G_ = Nq / Nkv;
    LILY_PRE_CASE(64, 1) LILY_PRE_CASE(64, 2) LILY_PRE_CASE(64, 4) LILY_PRE_CASE(64, 8)
    LILY_PRE_CASE(64, 16) LILY_PRE_CASE(128, 1) LILY_PRE_CASE(128, 2) LILY_PRE_CASE(128, 4)
    LILY_PRE_CASE(128, 8) LILY_PRE_CASE(128, 16) LILY_PRE_CASE(256, 1) LILY_PRE_CASE(256, 2)
    LILY_PRE_CASE(256, 4) LILY_PRE_CASE(256, 8) LILY_PRE_CASE(256, 16)
    return lily_fail(e, "attention: no kernel for Dh=%d G=%d", Dh, G_);
}
