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
    float *y;
    float *cs;
    const float *cw;
    int rows, row0, epi, ck;
    size_t rb; /* row bytes */
};

struct gv_params {
    gv_seg s[LILY_GEMV_SEGS];
    int nseg, cols, total;
    const float *x;
    int pro, head;
    const float *pw, *pz;
    float eps;
};

/* Builds x' in the transposed layout and its chunk sums, from float4 loads that are all
 * independent. RMSNORM stores x * w and returns the factor 1/rms for the caller to apply to the
 * dot products; GATED needs its per-head factors inside x' and rescales in place. red: shared
 * scratch of blockDim/32 + cols/head floats. */
template <int DT>
__device__ float gv_prologue(const gv_params &p, float4 *xs4, float *xsum, int nchunk, float *red) {
    constexpr int q_per_chunk = wtype<DT>::epc / 4; /* float4s per chunk */
    const int nq = p.cols / 4, nw = blockDim.x >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *x4 = (const float4 *)p.x;
    float ss = 0.f;
    if (p.pro == LILY_GP_GATED) {
        /* pass 1: u = x * w[i % head] * silu(z), and each float4's sum of x^2 */
        float *part = red + nw; /* [nq]: reused below for the per-head factors */
        const float4 *w4 = (const float4 *)p.pw, *z4 = (const float4 *)p.pz;
        const int hq = p.head / 4;
#pragma unroll 4
        for (int q = threadIdx.x; q < nq; q += blockDim.x) {
            const float4 a = x4[q], w = w4[q % hq], z = z4[q];
            part[q] = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            int c = q / q_per_chunk, i = q % q_per_chunk;
            xs4[i * nchunk + c] = make_float4(a.x * w.x * silu_f(z.x), a.y * w.y * silu_f(z.y),
                                              a.z * w.z * silu_f(z.z), a.w * w.w * silu_f(z.w));
        }
        __syncthreads();
        /* one warp per head sums its float4 partials in a fixed order (deterministic) */
        const int nh = p.cols / p.head;
        for (int h = warp; h < nh; h += nw) {
            float s = 0.f;
            for (int j = lane; j < hq; j += 32)
                s += part[h * hq + j];
            s = warp_sum(s);
            __syncwarp();
            if (lane == 0) red[nw + nq + h] = 1.0f / sqrtf(s / p.head + p.eps);
        }
        __syncthreads();
        /* q0 is warp-uniform: whole warps take part in the chunk-sum shuffles */
        for (int q0 = warp * 32; q0 < nq; q0 += blockDim.x) {
            const int q = q0 + lane, c = q / q_per_chunk, i = q % q_per_chunk;
            float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
            if (q < nq) {
                float r = red[nw + nq + q / hq];
                u = xs4[i * nchunk + c];
                u = make_float4(u.x * r, u.y * r, u.z * r, u.w * r);
                xs4[i * nchunk + c] = u;
            }
            /* a chunk's float4s are lanes of one warp, all or none below nq */
            if (DT != LILY_CW_BF16) {
                float t = group_sum<q_per_chunk>((u.x + u.y) + (u.z + u.w));
                if (i == 0 && q < nq) xsum[c] = t;
            }
        }
        __syncthreads();
        return 1.0f;
    }
    const float4 *w4 = (const float4 *)p.pw;
    const bool norm = p.pro == LILY_GP_RMSNORM;
#pragma unroll 4
    for (int q0 = warp * 32; q0 < nq; q0 += blockDim.x) { /* warp-uniform, as above */
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

__device__ __forceinline__ void gv_epilogue(const gv_seg &s, int r, float acc) {
    if (s.epi == LILY_GV_ADD) {
        s.y[r] += acc;
    } else if (s.epi == LILY_GV_CONV) {
        int K = s.ck;
        const float *w = s.cw + (size_t)r * K;
        float out = w[K - 1] * acc;
        for (int t = 0; t < K - 1; t++)
            out += w[t] * s.cs[(size_t)t * s.rows + r];
        for (int t = 0; t < K - 2; t++)
            s.cs[(size_t)t * s.rows + r] = s.cs[(size_t)(t + 1) * s.rows + r];
        s.cs[(size_t)(K - 2) * s.rows + r] = acc;
        s.y[r] = silu_f(out);
    } else {
        s.y[r] = acc;
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

template <int DT, int LPR, int NR, int CB>
__device__ __forceinline__ void gv_dot(const uint4 (&w)[NR][CB], const uint32_t (&sb)[NR][CB],
                                       const float4 *xs4, const float *xsum, int c0, int sl,
                                       int nchunk, float *acc) {
#pragma unroll
    for (int j = 0; j < CB; j++) {
        int c = c0 + sl + j * LPR;
        if (c >= nchunk) break;
        float xsm = DT != LILY_CW_BF16 ? xsum[c] : 0.f;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            float d = chunk_dot<DT>(w[i][j], xs4, c, nchunk);
            acc[i] = DT == LILY_CW_BF16
                         ? acc[i] + d
                         : fmaf(lo_bf16(sb[i][j]), d, fmaf(hi_bf16(sb[i][j]), xsm, acc[i]));
        }
    }
}

template <int DT, int LPR, int CB>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ gv_params p) {
    constexpr int NR = kSlots / CB;
    extern __shared__ float4 smem4[];
    constexpr int epc = wtype<DT>::epc;
    const int nchunk = p.cols / epc;
    float4 *xs4 = smem4;
    float *xsum = (float *)(smem4 + p.cols / 4);
    float *red = xsum + nchunk;
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
    const float scale = gv_prologue<DT>(p, xs4, xsum, nchunk, red);
    for (int base = base0; base < p.total; base += stride) {
        if (base != base0) {
            gv_rows<DT, LPR, NR>(p, base, sub, ng, wr, sbr, seg, lr);
            gv_load<DT, LPR, NR, CB>(wr, sbr, 0, sl, nchunk, w, sb);
        }
        float acc[NR];
#pragma unroll
        for (int i = 0; i < NR; i++)
            acc[i] = 0.f;
        for (int c0 = 0;;) {
            gv_dot<DT, LPR, NR, CB>(w, sb, xs4, xsum, c0, sl, nchunk, acc);
            c0 += LPR * CB;
            if (c0 >= nchunk) break;
            gv_load<DT, LPR, NR, CB>(wr, sbr, c0, sl, nchunk, w, sb);
        }
#pragma unroll
        for (int u = 0; u < NR; u++) {
            float a = group_sum<LPR>(acc[u]) * scale;
            if (sl == 0 && seg[u] >= 0) {
#pragma unroll
                for (int s = 0; s < LILY_GEMV_SEGS; s++)
                    if (s == seg[u]) gv_epilogue(p.s[s], lr[u], a);
            }
        }
    }
}

/* Q4 with cols % 256 == 0 on tensor cores (q4mma.cuh). A block owns T 16-row tiles (16 T rows);
 * its 8 warps split into T tiles x 8 / T step groups: warp w takes tile w % T and the 256-column
 * steps w / T, w / T + 8 / T, ..., two steps' loads issued together before any math. Partials meet
 * in shared memory in a fixed order. T is chosen per launch so that the grid fits in one wave
 * (2 blocks per SM): a second wave of a few blocks doubled a launch's time. */
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

template <int T>
__global__ void __launch_bounds__(kThreads) gemv_q4mma_kernel(const __grid_constant__ gv_params p) {
    constexpr int ROWS = 16 * T, NSG = 8 / T;
    extern __shared__ float4 smem4[];
    const int nchunk = p.cols / 32, ng = p.cols / 64, nsteps = p.cols / 256;
    float4 *xs4 = smem4;
    float *xsum = (float *)(smem4 + p.cols / 4);
    float *red = xsum + nchunk;                        /* prologue scratch */
    uint32_t *xh = (uint32_t *)(red + 8 + p.cols / 2); /* past any prologue's scratch */
    uint32_t *xl = xh + p.cols / 2;
    float *xs2 = (float *)(xl + p.cols / 2);
    float *part = xs2 + nchunk; /* [NSG step groups][ROWS] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = warp % T, sg = warp / T;
    const int ngroups = (p.total + ROWS - 1) / ROWS;
    const uint8_t *r0, *r1;
    const uint32_t *s0, *s1;
    q4_step_regs R[2];
    /* the first row group's loads do not depend on x: issue them before the prologue */
    int row0 = blockIdx.x * ROWS + tile * 16 + (lane >> 2);
    gv_row_ptr(p, row0, ng, r0, s0);
    gv_row_ptr(p, row0 + 8, ng, r1, s1);
    if (sg < nsteps) q4_step_load(r0, s0, r1, s1, sg, lane, R[0]);
    if (sg + NSG < nsteps) q4_step_load(r0, s0, r1, s1, sg + NSG, lane, R[1]);
    const float scale = gv_prologue<LILY_CW_Q4>(p, xs4, xsum, nchunk, red);
    const float *xsf = (const float *)xs4;
    q4x_convert(
        p.cols, [&](int col) { return xsf[xs_index(col, 32, nchunk)]; }, xh, xl, xs2);
    __syncthreads();
    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x) {
        if (grp != (int)blockIdx.x) {
            row0 = grp * ROWS + tile * 16 + (lane >> 2);
            gv_row_ptr(p, row0, ng, r0, s0);
            gv_row_ptr(p, row0 + 8, ng, r1, s1);
        }
        float acc0 = 0.f, acc1 = 0.f;
        for (int st = sg; st < nsteps; st += 2 * NSG) {
            if (st != sg || grp != (int)blockIdx.x) {
                q4_step_load(r0, s0, r1, s1, st, lane, R[0]);
                if (st + NSG < nsteps) q4_step_load(r0, s0, r1, s1, st + NSG, lane, R[1]);
            }
            q4_step_math(R[0], xh, xl, xs2, st, lane, acc0, acc1);
            if (st + NSG < nsteps) q4_step_math(R[1], xh, xl, xs2, st + NSG, lane, acc0, acc1);
        }
        acc0 = quad_sum(acc0);
        acc1 = quad_sum(acc1);
        if ((lane & 3) == 0) {
            part[sg * ROWS + tile * 16 + (lane >> 2)] = acc0;
            part[sg * ROWS + tile * 16 + (lane >> 2) + 8] = acc1;
        }
        __syncthreads();
        if (threadIdx.x < ROWS) {
            const int row = grp * ROWS + threadIdx.x;
            float a = 0.f;
#pragma unroll
            for (int g = 0; g < NSG; g++)
                a += part[g * ROWS + threadIdx.x];
            a *= scale;
#pragma unroll
            for (int s = 0; s < LILY_GEMV_SEGS; s++)
                if (s < p.nseg && row >= p.s[s].row0 && row < p.s[s].row0 + p.s[s].rows)
                    gv_epilogue(p.s[s], row - p.s[s].row0, a);
        }
        __syncthreads(); /* part is reused by the next group */
    }
}

template <int T>
int launch_q4mma_t(const gv_params &p, size_t smem, lily_cuda_stream st, lily_err *e) {
    if (smem > 48 * 1024)
        LILY_CU_TRY(cudaFuncSetAttribute(gemv_q4mma_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e);
    /* a longer matrix (lm_head) loops over row groups, so the prologue is not redone for each */
    int blocks = (p.total + 16 * T - 1) / (16 * T);
    if (blocks > 8 * g_sms) blocks = 8 * g_sms;
    LILY_CU_TRY(launch_kernel(gemv_q4mma_kernel<T>, dim3(blocks), dim3(kThreads), smem, st, p), e);
    return 0;
}

int launch_q4mma(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    const int nchunk = p.cols / 32;
    /* x' (fp32), its chunk sums, the prologue's scratch (8 + cols / 4 + cols / head floats at
     * most, head >= 4), then the hi/lo planes, their chunk sums and the partials (128 floats) */
    size_t floats = (size_t)p.cols + nchunk + 8 + p.cols / 2; /* up to xh */
    size_t smem =
        floats * 4 + (size_t)p.cols * 4 /* xh + xl: 2 bf16 planes */ + (size_t)nchunk * 4 + 128 * 4;
    smem = (smem + 15) & ~(size_t)15;
    if (!g_sms) {
        int dev = 0;
        LILY_CU_TRY(cudaGetDevice(&dev), e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev), e);
    }
    /* the fewest tiles per block whose grid fits in one wave of 2 blocks per SM */
    const int wave = 2 * g_sms;
    if ((p.total + 15) / 16 <= wave) return launch_q4mma_t<1>(p, smem, st, e);
    if ((p.total + 31) / 32 <= wave) return launch_q4mma_t<2>(p, smem, st, e);
    return launch_q4mma_t<4>(p, smem, st, e);
}

template <int DT, int LPR, int CB>
int launch(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    constexpr int epc = wtype<DT>::epc;
    int nchunk = p.cols / epc;
    int nh = p.pro == LILY_GP_GATED ? p.cols / p.head : 0;
    int nq = p.pro == LILY_GP_GATED ? p.cols / 4 : 0;
    size_t smem = (size_t)p.cols * 4 + (size_t)nchunk * 4 + (size_t)(kThreads / 32 + nq + nh) * 4;
    smem = (smem + 15) & ~(size_t)15;
    if (smem > 48 * 1024)
        LILY_CU_TRY(cudaFuncSetAttribute(gemv_kernel<DT, LPR, CB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e);
    if (!g_sms) {
        int dev = 0;
        LILY_CU_TRY(cudaGetDevice(&dev), e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev), e);
    }
    /* every block resident at once: each builds x' once, then loops over row steps */
    int per_sm = 1;
    LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<DT, LPR, CB>,
                                                              kThreads, smem),
                e);
    if (per_sm < 1) per_sm = 1;
    int rows_per_block = (kThreads / 32) * (32 / LPR) * (kSlots / CB);
    int blocks = (p.total + rows_per_block - 1) / rows_per_block;
    if (blocks > g_sms * per_sm) blocks = g_sms * per_sm;
    LILY_CU_TRY(launch_kernel(gemv_kernel<DT, LPR, CB>, dim3(blocks), dim3(kThreads), smem, st, p),
                e);
    return 0;
}

/* Lanes per row: the largest power of two <= 32 dividing the chunk count; chunks per lane per
 * load batch: 2 when each lane has at most 2 chunks of a row (4 rows in flight), else 4. */
template <int DT, int LPR> int launch_cb(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    int nchunk = p.cols / wtype<DT>::epc;
    if (nchunk <= 2 * LPR) return launch<DT, LPR, 2>(p, st, e);
    return launch<DT, LPR, 4>(p, st, e);
}

template <int DT> int launch_dt(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    int nchunk = p.cols / wtype<DT>::epc;
    if (nchunk % 32 == 0) return launch_cb<DT, 32>(p, st, e);
    if (nchunk % 16 == 0) return launch_cb<DT, 16>(p, st, e);
    if (nchunk % 8 == 0) return launch_cb<DT, 8>(p, st, e);
    if (nchunk % 4 == 0) return launch_cb<DT, 4>(p, st, e);
    return launch_cb<DT, 2>(p, st, e);
}

} // namespace
extern "C" int lily_cuda_gemv(const lily_gemv_seg *segs, int nseg, const float *x,
                              const lily_gemv_pro *pro, lily_cuda_stream st, lily_err *e) {
    if (nseg < 1 || nseg > LILY_GEMV_SEGS)
        return lily_fail(e, "gemv: %d segments (1..%d)", nseg, LILY_GEMV_SEGS);
    gv_params p = {};
    p.nseg = nseg;
    p.cols = segs[0].m->cols;
    p.x = x;
    int dt = segs[0].m->dt, row0 = 0;
    for (int i = 0; i < nseg; i++) {
        const lily_dmat *m = segs[i].m;
        if (m->dt != dt || m->cols != p.cols || m->n_mats != 1)
            return lily_fail(e, "gemv: segment %d differs in type or columns", i);
        if (segs[i].epi == LILY_GV_CONV && (segs[i].conv_k < 2 || segs[i].conv_k > 8))
            return lily_fail(e, "gemv: conv width %d (2..8)", segs[i].conv_k);
        gv_seg &s = p.s[i];
        s.w = m->w;
        s.sb = m->sb;
        s.y = segs[i].y;
        s.cs = segs[i].conv_state;
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
        p.pro = pro->kind;
        p.pw = pro->w;
        p.pz = pro->z;
        p.head = pro->head;
        p.eps = pro->eps;
        if (p.pro == LILY_GP_GATED && (p.head < 4 || p.head % 4 || p.cols % p.head))
            return lily_fail(e, "gemv: gated prologue head %d (a multiple of 4 dividing %d)",
                             p.head, p.cols);
    }
    if (dt == LILY_CW_Q4 && p.cols % 256 == 0) return launch_q4mma(p, st, e);
    switch (dt) {
    case LILY_CW_Q4: return launch_dt<LILY_CW_Q4>(p, st, e);
    case LILY_CW_Q8: return launch_dt<LILY_CW_Q8>(p, st, e);
    default: return launch_dt<LILY_CW_BF16>(p, st, e);
    }
}
