/* Decode-path GEMV kernels (see gemv.h).
 *
 * Latency, not bandwidth, bounds a 2-16 MB GEMV at batch 1: the whole matrix fits in the loads
 * that the resident blocks can have in flight at once. So each lane issues every 16-byte load of
 * its rows (NR rows x CB chunks, codes and scale words) before it touches x, the prologue builds
 * x' from loads that are all independent (one barrier), and the RMSNorm factor, a scalar, is
 * applied to the finished dot products instead of to x (one pass over x instead of two). */
#include "backend/cuda/gemv.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/q4mma.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kSlots = 8; /* 16-byte code loads in flight per lane: NR rows x CB chunks */

struct gv_seg {
    const uint8_t *w;
    const uint32_t *sb;
    const float *cw;
    int rows, row0, epi, ck;
    size_t rb; /* row bytes */
};

/* The input vectors x[r] and each segment's output y[r][s] and conv state cs[r][s] of vector
 * r < nx (at most the kernel's NX). */
struct gv_params {
    gv_seg s[LILY_GEMV_SEGS];
    float *y[LILY_GEMV_ROWS][LILY_GEMV_SEGS];
    float *cs[LILY_GEMV_ROWS][LILY_GEMV_SEGS];
    const float *x[LILY_GEMV_ROWS];
    int nseg, cols, total, nx;
    int pro;
    const float *pw;
    float eps;
};

/* Builds x' in the transposed layout and its chunk sums, from float4 loads that are all
 * independent. RMSNORM stores x * w and returns the factor 1/rms for the caller to apply to the
 * dot products. red: shared scratch of blockDim/32 floats. */
template <int DT>
__device__ float gv_prologue(const gv_params &p, const float *x, float4 *xs4, float *xsum,
                             int nchunk, float *red) {
    constexpr int q_per_chunk = wtype<DT>::epc / 4; /* float4s per chunk */
    const int nq = p.cols / 4, nw = blockDim.x >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *x4 = (const float4 *)x;
    float ss = 0.f;
    const float4 *w4 = (const float4 *)p.pw;
    const bool norm = p.pro == LILY_GP_RMSNORM;
#pragma unroll 4
    for (int q0 = warp * 32; q0 < nq; q0 += blockDim.x) { /* warp-uniform: shuffles below */
        const int q = q0 + lane, c = q / q_per_chunk, i = q % q_per_chunk;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (q < nq) {
            a = x4[q];
            if (norm) {
                float4 w = w4[q];
                ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
                a = make_float4(a.x * w.x, a.y * w.y, a.z * w.z, a.w * w.w);
            }
            xs4[i * nchunk + c] = a;
        }
        if (DT != LILY_CW_BF16) {
            float t = group_sum<q_per_chunk>((a.x + a.y) + (a.z + a.w));
            if (i == 0 && q < nq) xsum[c] = t;
        }
    }
    if (norm) {
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
    }
    __syncthreads();
    if (!norm) return 1.0f;
    float t = 0.f;
    for (int i = 0; i < nw; i++)
        t += red[i]; /* same order in every thread and block */
    return 1.0f / sqrtf(t / p.cols + p.eps);
}

__device__ __forceinline__ void gv_epilogue(const gv_seg &s, float *y, float *cs, int r,
                                            float acc) {
    if (s.epi == LILY_GV_ADD) {
        y[r] += acc;
    } else if (s.epi == LILY_GV_CONV) {
        int K = s.ck;
        const float *w = s.cw + (size_t)r * K;
        float out = w[K - 1] * acc;
        for (int t = 0; t < K - 1; t++)
            out += w[t] * cs[(size_t)t * s.rows + r];
        for (int t = 0; t < K - 2; t++)
            cs[(size_t)t * s.rows + r] = cs[(size_t)(t + 1) * s.rows + r];
        cs[(size_t)(K - 2) * s.rows + r] = acc;
        y[r] = silu_f(out);
    } else {
        y[r] = acc;
    }
}

/* Row pointers of the NR rows this lane's group handles at step base. */
template <int DT, int LPR, int NR>
__device__ __forceinline__ void gv_rows(const gv_params &p, int base, int sub, int ng,
                                        const uint8_t **wr, const uint32_t **sbr, int *seg,
                                        int *lr) {
    constexpr int rpg = 32 / LPR;
#pragma unroll
    for (int u = 0; u < NR; u++) {
        int row = base + u * rpg + sub;
        wr[u] = nullptr;
        sbr[u] = nullptr;
        seg[u] = -1;
        lr[u] = 0;
#pragma unroll
        for (int s = 0; s < LILY_GEMV_SEGS; s++) {
            if (s < p.nseg && row >= p.s[s].row0 && row < p.s[s].row0 + p.s[s].rows) {
                seg[u] = s;
                lr[u] = row - p.s[s].row0;
                wr[u] = p.s[s].w + (size_t)lr[u] * p.s[s].rb;
                if (DT != LILY_CW_BF16) sbr[u] = p.s[s].sb + (size_t)lr[u] * ng;
            }
        }
    }
}

/* Issues the loads of chunks c0 + sl + j * LPR (j < CB) of the NR rows; absent rows and chunks
 * past the row's end load nothing and read as zero codes with a zero scale. */
template <int DT, int LPR, int NR, int CB>
__device__ __forceinline__ void gv_load(const uint8_t *const *wr, const uint32_t *const *sbr,
                                        int c0, int sl, int nchunk, uint4 (&w)[NR][CB],
                                        uint32_t (&sb)[NR][CB]) {
#pragma unroll
    for (int i = 0; i < NR; i++)
#pragma unroll
        for (int j = 0; j < CB; j++) {
            int c = c0 + sl + j * LPR;
            bool ok = wr[i] && c < nchunk;
            w[i][j] = ok ? ldg_stream(wr[i] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
            if (DT != LILY_CW_BF16) sb[i][j] = ok ? __ldg(sbr[i] + c / wtype<DT>::cpg) : 0u;
        }
}

/* The products of the loaded chunks with each of the nx (<= NX) input vectors: vector x's x' at
 * xs + x rs floats (its chunk sums at + cols), the same arithmetic for every x. */
template <int DT, int LPR, int NR, int CB, int NX>
__device__ __forceinline__ void gv_dot(const uint4 (&w)[NR][CB], const uint32_t (&sb)[NR][CB],
                                       const float *xs, int rs, int cols, int c0, int sl,
                                       int nchunk, int nx, float (&acc)[NX][NR]) {
#pragma unroll
    for (int j = 0; j < CB; j++) {
        int c = c0 + sl + j * LPR;
        if (c >= nchunk) break;
#pragma unroll
        for (int x = 0; x < NX; x++) {
            if (x >= nx) break;
            const float4 *xs4 = (const float4 *)(xs + (size_t)x * rs);
            float xsm = DT != LILY_CW_BF16 ? xs[(size_t)x * rs + cols + c] : 0.f;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                float d = chunk_dot<DT>(w[i][j], xs4, c, nchunk);
                acc[x][i] = DT == LILY_CW_BF16 ? acc[x][i] + d
                                               : fmaf(lo_bf16(sb[i][j]), d,
                                                      fmaf(hi_bf16(sb[i][j]), xsm, acc[x][i]));
            }
        }
    }
}

/* Floats of shared memory per input vector of the fp32 kernel: x' and its chunk sums, rounded
 * to whole float4s. */
__host__ __device__ __forceinline__ int gv_row_floats(int cols, int nchunk) {
    return (cols + nchunk + 3) & ~3;
}

template <int DT, int LPR, int CB, int NX>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ gv_params p) {
    constexpr int NR = kSlots / CB;
    extern __shared__ float4 smem4[];
    constexpr int epc = wtype<DT>::epc;
    const int nchunk = p.cols / epc;
    const int rs = gv_row_floats(p.cols, nchunk);
    float *xs = (float *)smem4; /* [nx][rs]: x' of each input vector, then its chunk sums */
    float *red = xs + (size_t)p.nx * rs;
    constexpr int rpg = 32 / LPR; /* rows per warp per row slot */
    constexpr int rps = rpg * NR; /* rows per warp step */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int sub = lane / LPR, sl = lane % LPR;
    const int ng = p.cols / 64;
    const int base0 = (blockIdx.x * nw + warp) * rps, stride = gridDim.x * nw * rps;
    const uint8_t *wr[NR];
    const uint32_t *sbr[NR];
    int seg[NR], lr[NR];
    uint4 w[NR][CB];
    uint32_t sb[NR][CB];
    /* the first step's loads do not depend on x: issue them before the prologue */
    gv_rows<DT, LPR, NR>(p, base0, sub, ng, wr, sbr, seg, lr);
    gv_load<DT, LPR, NR, CB>(wr, sbr, 0, sl, nchunk, w, sb);
    float scale[NX];
#pragma unroll
    for (int x = 0; x < NX; x++) {
        scale[x] = 0.f;
        if (x >= p.nx) continue; /* block-uniform */
        if (x) __syncthreads();  /* the prologue's scratch (red) is reused */
        float *xr = xs + (size_t)x * rs;
        scale[x] = gv_prologue<DT>(p, p.x[x], (float4 *)xr, xr + p.cols, nchunk, red);
    }
    for (int base = base0; base < p.total; base += stride) {
        if (base != base0) {
            gv_rows<DT, LPR, NR>(p, base, sub, ng, wr, sbr, seg, lr);
            gv_load<DT, LPR, NR, CB>(wr, sbr, 0, sl, nchunk, w, sb);
        }
        float acc[NX][NR];
#pragma unroll
        for (int x = 0; x < NX; x++)
#pragma unroll
            for (int i = 0; i < NR; i++)
                acc[x][i] = 0.f;
        for (int c0 = 0;;) {
            gv_dot<DT, LPR, NR, CB, NX>(w, sb, xs, rs, p.cols, c0, sl, nchunk, p.nx, acc);
            c0 += LPR * CB;
            if (c0 >= nchunk) break;
            gv_load<DT, LPR, NR, CB>(wr, sbr, c0, sl, nchunk, w, sb);
        }
#pragma unroll
        for (int u = 0; u < NR; u++)
#pragma unroll
            for (int x = 0; x < NX; x++) {
                if (x >= p.nx) break; /* warp-uniform: the shuffles below see whole warps */
                float a = group_sum<LPR>(acc[x][u]) * scale[x];
                if (sl == 0 && seg[u] >= 0) {
#pragma unroll
                    for (int s = 0; s < LILY_GEMV_SEGS; s++)
                        if (s == seg[u]) gv_epilogue(p.s[s], p.y[x][s], p.cs[x][s], lr[u], a);
                }
            }
    }
}

/* Q4 with cols % 256 == 0 on tensor cores, 1 to 8 input vectors in one pass over the weights.
 * mma.sync m16n8k16: A = 16 weight rows x 16 columns (nibbles as the exact bf16 numbers 128 + q,
 * as in q4mma.cuh), B = those 16 columns of x for 8 columns n = 2 v + pl: vector v (of 4 per
 * pass; a second pass with the same A takes vectors 4..7) and plane pl, the high (0) or low (1)
 * bf16 half of x = hi + lo (x - hi - lo ~ 2^-17 |x|: the result matches fp32 to ~1e-6). So the
 * weights are unpacked once for every vector, and each mma's 16 columns lie in one 64-column
 * scale group: lane t of a quad owns columns 16 t .. 16 t + 15 of each group (two code words),
 * and the 4 mmas of a group take its columns 8 i + {pp, pp + 4} and 8 i + {pp + 1, pp + 5} of
 * word i = j / 2, pp = 2 (j % 2). Lane (g, t) ends with rows g and g + 8 of vector 4 p + t,
 * hi and lo in its two D columns, to which it applies the group's scale and bias itself; a
 * vector's arithmetic is the same whatever the other vectors are (each D column is computed
 * apart), so a row's result does not depend on how many rows share the launch.
 *
 * Shared layout of vector v's planes (cols words at v cols): group G's 64 words at 64 G; word
 * 32 i + 8 t + 4 pl + 2 jj + b holds plane pl of columns c = 64 G + 16 t + 8 i + 2 jj + b (low
 * half) and c + 4 (high half). Lane (g, t) reads its 8 words of a group as two 16-byte loads at
 * 8 t + 4 pl and + 32: the 8 lanes of a quarter warp hit 8 distinct 16-byte bank groups.
 *
 * A block owns T 16-row tiles (16 T rows); its 8 warps split into T tiles x 8 / T step groups
 * (a step is 256 columns), two steps' loads issued together before any math. Partials meet in
 * shared memory in a fixed order. T is chosen per matrix so that the grid fits in one wave (2
 * blocks per SM): a second wave of a few blocks doubled a launch's time. */
int g_sms = 0;

__device__ __forceinline__ void gv_row_ptr(const gv_params &p, int row, int ng, const uint8_t *&w,
                                           const uint32_t *&sb) {
    w = nullptr;
    sb = nullptr;
#pragma unroll
    for (int s = 0; s < LILY_GEMV_SEGS; s++)
        if (s < p.nseg && row >= p.s[s].row0 && row < p.s[s].row0 + p.s[s].rows) {
            int lr = row - p.s[s].row0;
            w = p.s[s].w + (size_t)lr * p.s[s].rb;
            sb = p.s[s].sb + (size_t)lr * ng;
        }
}

static __device__ __forceinline__ uint2 ldg_stream8(const void *p) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

/* The loads of one step for rows g (r0) and g + 8 (r1): this lane's two code words of each of
 * the step's 4 groups, and the 4 groups' scale/bias words. A NULL row loads zeros. */
struct q4r_regs {
    uint2 w[8];  /* [row][group of the step] */
    uint4 sb[2]; /* [row]: groups 4 step .. 4 step + 3 */
};

__device__ __forceinline__ void q4r_load(const uint8_t *r0, const uint32_t *s0, const uint8_t *r1,
                                         const uint32_t *s1, int step, int lane, q4r_regs &R) {
    const size_t off = (size_t)step * 128 + 8 * (lane & 3);
    const uint2 z2 = make_uint2(0u, 0u);
#pragma unroll
    for (int G = 0; G < 4; G++) {
        R.w[G] = r0 ? ldg_stream8(r0 + off + 32 * G) : z2;
        R.w[4 + G] = r1 ? ldg_stream8(r1 + off + 32 * G) : z2;
    }
    const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
    R.sb[0] = r0 ? __ldg((const uint4 *)(s0 + 4 * step)) : z4;
    R.sb[1] = r1 ? __ldg((const uint4 *)(s1 + 4 * step)) : z4;
}

__device__ __forceinline__ uint32_t u4_at(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

/* One step's math for the P passes: adds to acc0[p] / acc1[p] the products of rows g / g + 8
 * with vector 4 p + t (t = lane % 4) over the step's 4 groups. xp: the planes, xs: the group
 * sums of hi + lo [nx][ng]. */
template <int P>
__device__ __forceinline__ void q4r_math(const q4r_regs &R, const uint32_t *xp, const float *xs,
                                         int cols, int ng, int nx, int step, int lane,
                                         float (&acc0)[P], float (&acc1)[P]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int Gl = 0; Gl < 4; Gl++) {
        const int G = step * 4 + Gl;
        uint4 bq[P][2];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int v = 4 * p + (g >> 1);
            if (v < nx) {
                const uint4 *src =
                    (const uint4 *)(xp + (size_t)v * cols + 64 * G + 8 * t + 4 * (g & 1));
                bq[p][0] = src[0];
                bq[p][1] = src[8];
            } else {
                bq[p][0] = bq[p][1] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        float d[P][4];
#pragma unroll
        for (int p = 0; p < P; p++)
            d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = j >> 1, pp = (j & 1) * 2;
            const uint32_t w0 = i ? R.w[Gl].y : R.w[Gl].x, w1 = i ? R.w[4 + Gl].y : R.w[4 + Gl].x;
            const uint32_t a[4] = {q4_pair(w0, pp), q4_pair(w1, pp), q4_pair(w0, pp + 1),
                                   q4_pair(w1, pp + 1)};
#pragma unroll
            for (int p = 0; p < P; p++) {
                const uint4 &u = bq[p][i];
                const uint32_t b[2] = {(j & 1) ? u.z : u.x, (j & 1) ? u.w : u.y};
                mma_bf16(d[p], a, b);
            }
        }
        /* d[p][0], d[p][1]: row g, vector 4 p + t, hi and lo; d[p][2], d[p][3]: row g + 8 */
        const uint32_t sw0 = u4_at(R.sb[0], Gl), sw1 = u4_at(R.sb[1], Gl);
        const float s0 = lo_bf16(sw0), s1 = lo_bf16(sw1);
        const float c0 = hi_bf16(sw0) - 128.f * s0, c1 = hi_bf16(sw1) - 128.f * s1;
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int v = 4 * p + t;
            const float xg = v < nx ? xs[v * ng + G] : 0.f;
            acc0[p] = fmaf(c0, xg, fmaf(s0, d[p][0], fmaf(s0, d[p][1], acc0[p])));
            acc1[p] = fmaf(c1, xg, fmaf(s1, d[p][2], fmaf(s1, d[p][3], acc1[p])));
        }
    }
}

/* Shared memory of the rows kernel (floats): the planes [nx][cols], group sums and RMSNorm
 * item sums [nx][ng] each; RMSNorm: the sums of x^2 per float4 [nx][cols / 4]; the RMSNorm
 * factors [8], the partials [nx][128]. */
size_t q4r_smem(const gv_params &p, int nx) {
    const int ng = p.cols / 64;
    const int extra = p.pro == LILY_GP_RMSNORM ? p.cols / 4 : 0;
    size_t floats = (size_t)nx * ((size_t)p.cols + 2 * ng + extra + 128) + 8;
    return (floats * 4 + 15) & ~(size_t)15;
}

/* x' of every vector into the planes. Pass 1, every thread, float4 loads all independent:
 * x * w (RMSNORM) or x, with each float4's sum of x^2 into sq (RMSNORM), staged as fp32 in the
 * planes' own place, [v][c]. Pass 2, a warp per (vector, group) item, lane L taking the column
 * pair of word L (see above): x' = the staged value (RMSNORM: its factor is applied to the dot
 * products), split into hi and lo and written over the group's staged floats once the warp has
 * read them all; the group's sum of hi + lo into xs and, for RMSNORM, its sum of x^2 into ssi.
 * Ends with a barrier. */
__device__ __forceinline__ void q4r_prologue(const gv_params &p, uint32_t *xp, float *xs,
                                             float *ssi, float *sq) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int ng = p.cols / 64, nq = p.cols / 4;
    const bool norm = p.pro == LILY_GP_RMSNORM;
    float *xf = (float *)xp;
#pragma unroll 4
    for (int q = threadIdx.x; q < p.nx * nq; q += blockDim.x) {
        const int v = q / nq, c4 = q % nq;
        float4 a = __ldg((const float4 *)p.x[v] + c4);
        if (norm) {
            sq[q] = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            const float4 w = __ldg((const float4 *)p.pw + c4);
            a = make_float4(a.x * w.x, a.y * w.y, a.z * w.z, a.w * w.w);
        }
        ((float4 *)xf)[q] = a;
    }
    __syncthreads();
    const int i = lane >> 4, t = (lane >> 2) & 3, jj = (lane >> 1) & 1, b = lane & 1;
    const int cl = 16 * t + 8 * i + 2 * jj + b, wl = 32 * i + 8 * t + 2 * jj + b;
    for (int it = warp; it < p.nx * ng; it += nw) { /* warp-uniform */
        const int v = it / ng;
        float *g = xf + (size_t)v * p.cols + 64 * (it % ng);
        const float a0 = g[cl], a1 = g[cl + 4];
        /* RMSNORM: the group's 16 float4 sums of x^2 */
        float sqs = norm && lane < 16 ? sq[(size_t)v * nq + 16 * (it % ng) + lane] : 0.f;
        const uint16_t h0 = f2bf(a0), h1 = f2bf(a1);
        const uint16_t l0 = f2bf(a0 - bf16f(h0)), l1 = f2bf(a1 - bf16f(h1));
        __syncwarp(); /* every lane has read the group's staged floats */
        uint32_t *w = (uint32_t *)g + wl;
        w[0] = h0 | ((uint32_t)h1 << 16);
        w[4] = l0 | ((uint32_t)l1 << 16);
        const float gs = warp_sum((bf16f(h0) + bf16f(l0)) + (bf16f(h1) + bf16f(l1)));
        if (norm) sqs = warp_sum(sqs);
        if (lane == 0) {
            xs[it] = gs;
            ssi[it] = sqs;
        }
    }
    __syncthreads();
}

template <int T, int P>
__global__ void __launch_bounds__(kThreads) gemv_q4r_kernel(const __grid_constant__ gv_params p) {
    constexpr int ROWS = 16 * T, NSG = 8 / T;
    extern __shared__ float4 smem4[];
    const int ng = p.cols / 64, nsteps = p.cols / 256;
    uint32_t *xp = (uint32_t *)smem4;                  /* [nx][cols] planes */
    float *xs = (float *)(xp + (size_t)p.nx * p.cols); /* [nx][ng] group sums */
    float *ssi = xs + p.nx * ng;                       /* [nx][ng] RMSNorm: sums of x^2 */
    float *sq = ssi + p.nx * ng; /* [nx][cols / 4] RMSNorm: sums of x^2 per float4 */
    float *sc = sq + (p.pro == LILY_GP_RMSNORM ? p.nx * (p.cols / 4) : 0);
    float *part = sc + 8; /* [nx][NSG][ROWS] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = warp % T, sg = warp / T;
    const int ngroups = (p.total + ROWS - 1) / ROWS;
    const uint8_t *r0, *r1;
    const uint32_t *s0, *s1;
    q4r_regs R[2];
    /* the first row group's loads do not depend on x: issue them before the prologue */
    int row0 = blockIdx.x * ROWS + tile * 16 + (lane >> 2);
    gv_row_ptr(p, row0, ng, r0, s0);
    gv_row_ptr(p, row0 + 8, ng, r1, s1);
    if (sg < nsteps) q4r_load(r0, s0, r1, s1, sg, lane, R[0]);
    if (sg + NSG < nsteps) q4r_load(r0, s0, r1, s1, sg + NSG, lane, R[1]);
    q4r_prologue(p, xp, xs, ssi, sq);
    if (p.pro == LILY_GP_RMSNORM && warp < p.nx) { /* read after the first group's barrier */
        float s = 0.f;
        for (int G = lane; G < ng; G += 32)
            s += ssi[warp * ng + G];
        s = warp_sum(s);
        if (lane == 0) sc[warp] = 1.0f / sqrtf(s / p.cols + p.eps);
    }
    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x) {
        if (grp != (int)blockIdx.x) {
            row0 = grp * ROWS + tile * 16 + (lane >> 2);
            gv_row_ptr(p, row0, ng, r0, s0);
            gv_row_ptr(p, row0 + 8, ng, r1, s1);
        }
        float acc0[P], acc1[P];
#pragma unroll
        for (int q = 0; q < P; q++)
            acc0[q] = acc1[q] = 0.f;
        for (int st = sg; st < nsteps; st += 2 * NSG) {
            if (st != sg || grp != (int)blockIdx.x) {
                q4r_load(r0, s0, r1, s1, st, lane, R[0]);
                if (st + NSG < nsteps) q4r_load(r0, s0, r1, s1, st + NSG, lane, R[1]);
            }
            q4r_math<P>(R[0], xp, xs, p.cols, ng, p.nx, st, lane, acc0, acc1);
            if (st + NSG < nsteps)
                q4r_math<P>(R[1], xp, xs, p.cols, ng, p.nx, st + NSG, lane, acc0, acc1);
        }
#pragma unroll
        for (int q = 0; q < P; q++) {
            const int v = 4 * q + (lane & 3);
            if (v < p.nx) {
                part[(v * NSG + sg) * ROWS + tile * 16 + (lane >> 2)] = acc0[q];
                part[(v * NSG + sg) * ROWS + tile * 16 + (lane >> 2) + 8] = acc1[q];
            }
        }
        __syncthreads();
        if (threadIdx.x < ROWS) {
            const int row = grp * ROWS + threadIdx.x;
            for (int x = 0; x < p.nx; x++) {
                float a = 0.f;
#pragma unroll
                for (int g = 0; g < NSG; g++)
                    a += part[(x * NSG + g) * ROWS + threadIdx.x];
                if (p.pro == LILY_GP_RMSNORM) a *= sc[x];
#pragma unroll
                for (int s = 0; s < LILY_GEMV_SEGS; s++)
                    if (s < p.nseg && row >= p.s[s].row0 && row < p.s[s].row0 + p.s[s].rows)
                        gv_epilogue(p.s[s], p.y[x][s], p.cs[x][s], row - p.s[s].row0, a);
            }
        }
        __syncthreads(); /* part is reused by the next group */
    }
}

int g_smem_max = 0; /* opt-in shared memory per block */

int dev_init(lily_err *e) {
    if (g_sms) return 0;
    int dev = 0, sms = 0;
    LILY_CU_TRY(cudaGetDevice(&dev), e);
    LILY_CU_TRY(cudaDeviceGetAttribute(&g_smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                e);
    LILY_CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), e);
    g_sms = sms;
    return 0;
}

template <int T, int P> int launch_q4r_t(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    const size_t smem = q4r_smem(p, p.nx);
    if (smem > 48 * 1024) LILY_CU_TRY(smem_at_least(gemv_q4r_kernel<T, P>, smem), e);
    /* a longer matrix (lm_head) loops over row groups, so the prologue is not redone for each */
    int blocks = (p.total + 16 * T - 1) / (16 * T);
    if (blocks > 8 * g_sms) blocks = 8 * g_sms;
    LILY_CU_TRY(launch_kernel(gemv_q4r_kernel<T, P>, dim3(blocks), dim3(kThreads), smem, st, p), e);
    return 0;
}

/* Up to 4 vectors: one pass per mma; 5 to 8: two passes (vectors 4..7 in the second). */
template <int T> int launch_q4r_p(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    return p.nx <= 4 ? launch_q4r_t<T, 1>(p, st, e) : launch_q4r_t<T, 2>(p, st, e);
}

/* The tile count per block depends on the matrix alone (never on nx), so a row's partial sums
 * meet in the same order whatever the number of vectors. */
int launch_q4r(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    /* the fewest tiles per block whose grid fits in one wave of 2 blocks per SM */
    const int wave = 2 * g_sms;
    if ((p.total + 15) / 16 <= wave) return launch_q4r_p<1>(p, st, e);
    if ((p.total + 31) / 32 <= wave) return launch_q4r_p<2>(p, st, e);
    return launch_q4r_p<4>(p, st, e);
}

/* Shared memory of the fp32 kernel for nx input vectors of p. */
size_t gv_smem(const gv_params &p, int epc, int nx) {
    int nchunk = p.cols / epc;
    size_t smem = (size_t)nx * gv_row_floats(p.cols, nchunk) * 4 + (size_t)(kThreads / 32) * 4;
    return (smem + 15) & ~(size_t)15;
}

template <int DT, int LPR, int CB, int NX>
int launch(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    const size_t smem = gv_smem(p, wtype<DT>::epc, p.nx);
    if (smem > 48 * 1024) LILY_CU_TRY(smem_at_least(gemv_kernel<DT, LPR, CB, NX>, smem), e);
    /* every block resident at once: each builds x' once, then loops over row steps */
    int per_sm = 1;
    LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<DT, LPR, CB, NX>,
                                                              kThreads, smem),
                e);
    if (per_sm < 1) per_sm = 1;
    int rows_per_block = (kThreads / 32) * (32 / LPR) * (kSlots / CB);
    int blocks = (p.total + rows_per_block - 1) / rows_per_block;
    if (blocks > g_sms * per_sm) blocks = g_sms * per_sm;
    LILY_CU_TRY(
        launch_kernel(gemv_kernel<DT, LPR, CB, NX>, dim3(blocks), dim3(kThreads), smem, st, p), e);
    return 0;
}

/* One vector: the NX = 1 instance (the 1-row decode's kernel); more: the NX = 8 instance with
 * p.nx of them where rows take whole warps (LPR 32, the common shapes), else one NX = 1 launch
 * per vector (the same arithmetic per vector; the NX = 8 instances of the narrow row forms would
 * double the file's compile time and the binaries' size for shapes the real models do not run). */
template <int DT, int LPR, int CB>
int launch_nx(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    if (p.nx == 1) return launch<DT, LPR, CB, 1>(p, st, e);
    if constexpr (LPR == 32) {
        return launch<DT, LPR, CB, LILY_GEMV_ROWS>(p, st, e);
    } else {
        for (int r = 0; r < p.nx; r++) {
            gv_params q = p;
            q.nx = 1;
            q.x[0] = p.x[r];
            for (int s = 0; s < LILY_GEMV_SEGS; s++) {
                q.y[0][s] = p.y[r][s];
                q.cs[0][s] = p.cs[r][s];
            }
            if (launch<DT, LPR, CB, 1>(q, st, e)) return -1;
        }
        return 0;
    }
}

/* Lanes per row: the largest power of two <= 32 dividing the chunk count; chunks per lane per
 * load batch: 2 when each lane has at most 2 chunks of a row (4 rows in flight), else 4. */
template <int DT, int LPR> int launch_cb(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    int nchunk = p.cols / wtype<DT>::epc;
    if (nchunk <= 2 * LPR) return launch_nx<DT, LPR, 2>(p, st, e);
    return launch_nx<DT, LPR, 4>(p, st, e);
}

template <int DT> int launch_dt(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    int nchunk = p.cols / wtype<DT>::epc;
    if (nchunk % 32 == 0) return launch_cb<DT, 32>(p, st, e);
    if (nchunk % 16 == 0) return launch_cb<DT, 16>(p, st, e);
    if (nchunk % 8 == 0) return launch_cb<DT, 8>(p, st, e);
    if (nchunk % 4 == 0) return launch_cb<DT, 4>(p, st, e);
    return launch_cb<DT, 2>(p, st, e);
}

int epc_of(int dt) {
    return dt == LILY_CW_Q4   ? wtype<LILY_CW_Q4>::epc
           : dt == LILY_CW_Q8 ? wtype<LILY_CW_Q8>::epc
                              : wtype<LILY_CW_BF16>::epc;
}

} // namespace

extern "C" int lily_cuda_gemv_rows(const lily_gemv_seg *segs, int nseg, int nx,
                                   const float *const *x, const lily_gemv_pro *pro,
                                   lily_cuda_stream st, lily_err *e) {
    if (nseg < 1 || nseg > LILY_GEMV_SEGS)
        return lily_fail(e, "gemv: %d segments (1..%d)", nseg, LILY_GEMV_SEGS);
    if (nx < 1 || nx > LILY_GEMV_ROWS)
        return lily_fail(e, "gemv: %d input vectors (1..%d)", nx, LILY_GEMV_ROWS);
    if (dev_init(e)) return -1;
    gv_params p = {};
    p.nseg = nseg;
    p.cols = segs[0].m->cols;
    int dt = segs[0].m->dt, row0 = 0;
    for (int i = 0; i < nseg; i++) {
        const lily_dmat *m = segs[i].m;
        if (m->dt != dt || m->cols != p.cols || m->n_mats != 1)
            return lily_fail(e, "gemv: segment %d differs in type or columns", i);
        if (segs[i].epi == LILY_GV_CONV && (segs[i].conv_k < 2 || segs[i].conv_k > 8))
            return lily_fail(e, "gemv: conv width %d (2..8)", segs[i].conv_k);
        for (int r = 1; r < nx; r++) {
            const lily_gemv_seg *o = &segs[r * nseg + i];
            if (o->m != m || o->epi != segs[i].epi || o->conv_w != segs[i].conv_w ||
                o->conv_k != segs[i].conv_k)
                return lily_fail(e, "gemv: vector %d's segment %d differs from vector 0's", r, i);
        }
        gv_seg &s = p.s[i];
        s.w = m->w;
        s.sb = m->sb;
        s.cw = segs[i].conv_w;
        s.rows = m->rows;
        s.row0 = row0;
        s.epi = segs[i].epi;
        s.ck = segs[i].conv_k;
        s.rb = dmat_row_bytes(dt, p.cols);
        row0 += m->rows;
    }
    p.total = row0;
    if (pro) {
        if (pro->kind != LILY_GP_NONE && pro->kind != LILY_GP_RMSNORM)
            return lily_fail(e, "gemv: unknown prologue %d", pro->kind);
        p.pro = pro->kind;
        p.pw = pro->w;
        p.eps = pro->eps;
    }
    const bool mma = dt == LILY_CW_Q4 && p.cols % 256 == 0;
    /* the vectors in groups that fit one launch's shared memory: each vector's results do not
     * depend on the group it runs in */
    for (int r0 = 0; r0 < nx;) {
        int k = nx - r0;
        while (k > 1 && (mma ? q4r_smem(p, k) : gv_smem(p, epc_of(dt), k)) > (size_t)g_smem_max)
            k--;
        gv_params q = p;
        q.nx = k;
        for (int r = 0; r < k; r++) {
            q.x[r] = x[r0 + r];
            for (int i = 0; i < nseg; i++) {
                q.y[r][i] = segs[(r0 + r) * nseg + i].y;
                q.cs[r][i] = segs[(r0 + r) * nseg + i].conv_state;
            }
        }
        int rc;
        if (mma)
            rc = launch_q4r(q, st, e);
        else if (dt == LILY_CW_Q4)
            rc = launch_dt<LILY_CW_Q4>(q, st, e);
        else if (dt == LILY_CW_Q8)
            rc = launch_dt<LILY_CW_Q8>(q, st, e);
        else
            rc = launch_dt<LILY_CW_BF16>(q, st, e);
        if (rc) return -1;
        r0 += k;
    }
    return 0;
}

extern "C" int lily_cuda_gemv(const lily_gemv_seg *segs, int nseg, const float *x,
                              const lily_gemv_pro *pro, lily_cuda_stream st, lily_err *e) {
    return lily_cuda_gemv_rows(segs, nseg, 1, &x, pro, st, e);
}
