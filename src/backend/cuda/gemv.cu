/* Decode-path GEMV kernels (see gemv.h). */
#include "backend/cuda/gemv.h"

#include "backend/cuda/common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kRowsUnroll = 4; /* row groups per warp step: loads in flight per lane */

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

/* Builds x' (the prologue) in the transposed layout, then the chunk sums. */
template <int DT>
__device__ void gv_prologue(const gv_params &p, float *xs, float *xsum, int nchunk) {
    __shared__ float red[32];
    constexpr int epc = wtype<DT>::epc;
    int cols = p.cols;
    if (p.pro == LILY_GP_RMSNORM) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += p.x[i] * p.x[i];
        ss = block_sum(ss, red);
        float r = 1.0f / sqrtf(ss / cols + p.eps);
        for (int i = threadIdx.x; i < cols; i += blockDim.x)
            xs[xs_index(i, epc, nchunk)] = p.x[i] * r * p.pw[i];
    } else if (p.pro == LILY_GP_GATED) {
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        int hd = p.head;
        for (int h = warp; h < cols / hd; h += nw) {
            const float *xh = p.x + (size_t)h * hd;
            float ss = 0.f;
            for (int i = lane; i < hd; i += 32) ss += xh[i] * xh[i];
            ss = warp_sum(ss);
            float r = 1.0f / sqrtf(ss / hd + p.eps);
            for (int i = lane; i < hd; i += 32)
                xs[xs_index(h * hd + i, epc, nchunk)] =
                    xh[i] * r * p.pw[i] * silu_f(p.pz[(size_t)h * hd + i]);
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x)
            xs[xs_index(i, epc, nchunk)] = p.x[i];
    }
    __syncthreads();
    store_xsum<DT>(xs, xsum, nchunk);
    __syncthreads();
}

__device__ __forceinline__ void gv_epilogue(const gv_seg &s, int r, float acc) {
    if (s.epi == LILY_GV_ADD) {
        s.y[r] += acc;
    } else if (s.epi == LILY_GV_CONV) {
        int K = s.ck;
        const float *w = s.cw + (size_t)r * K;
        float out = w[K - 1] * acc;
        for (int t = 0; t < K - 1; t++) out += w[t] * s.cs[(size_t)t * s.rows + r];
        for (int t = 0; t < K - 2; t++)
            s.cs[(size_t)t * s.rows + r] = s.cs[(size_t)(t + 1) * s.rows + r];
        s.cs[(size_t)(K - 2) * s.rows + r] = acc;
        s.y[r] = silu_f(out);
    } else {
        s.y[r] = acc;
    }
}

/* Row pointers of the kRowsUnroll rows this lane's group handles at step base. */
template <int DT, int LPR>
__device__ __forceinline__ void gv_rows(const gv_params &p, int base, int sub, int ng,
                                        const uint8_t **wr, const uint32_t **sbr, int *seg,
                                        int *lr) {
    constexpr int rpg = 32 / LPR;
#pragma unroll
    for (int u = 0; u < kRowsUnroll; u++) {
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

template <int DT, int LPR>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ gv_params p) {
    extern __shared__ float4 smem4[];
    constexpr int epc = wtype<DT>::epc;
    const int nchunk = p.cols / epc;
    float *xs = (float *)smem4, *xsum = xs + p.cols;
    constexpr int rpg = 32 / LPR;            /* rows per warp per unrolled group */
    constexpr int rps = rpg * kRowsUnroll;   /* rows per warp step */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int sub = lane / LPR, sl = lane % LPR;
    const int ng = p.cols / 64;
    const int base0 = (blockIdx.x * nw + warp) * rps, stride = gridDim.x * nw * rps;
    /* the first step's first chunks do not depend on x: load them before the prologue */
    const uint8_t *wr[kRowsUnroll];
    const uint32_t *sbr[kRowsUnroll];
    int seg[kRowsUnroll], lr[kRowsUnroll];
    uint4 first[kRowsUnroll];
    gv_rows<DT, LPR>(p, base0, sub, ng, wr, sbr, seg, lr);
#pragma unroll
    for (int u = 0; u < kRowsUnroll; u++)
        first[u] = wr[u] && sl < nchunk ? ldg_stream(wr[u] + (size_t)sl * 16)
                                        : make_uint4(0, 0, 0, 0);
    gv_prologue<DT>(p, xs, xsum, nchunk);
    for (int base = base0; base < p.total; base += stride) {
        if (base != base0) gv_rows<DT, LPR>(p, base, sub, ng, wr, sbr, seg, lr);
        float acc[kRowsUnroll];
        rows_dot<DT, LPR, kRowsUnroll>(wr, sbr, (const float4 *)xs, xsum, nchunk, sl, acc,
                                       base == base0 ? first : nullptr);
#pragma unroll
        for (int u = 0; u < kRowsUnroll; u++) {
            float a = group_sum<LPR>(acc[u]);
            if (sl == 0 && seg[u] >= 0) {
#pragma unroll
                for (int s = 0; s < LILY_GEMV_SEGS; s++)
                    if (s == seg[u]) gv_epilogue(p.s[s], lr[u], a);
            }
        }
    }
}

template <int DT, int LPR>
int launch(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    constexpr int epc = wtype<DT>::epc;
    int nchunk = p.cols / epc;
    size_t smem = (size_t)p.cols * 4 + (size_t)nchunk * 4;
    if (smem > 48 * 1024)
        LILY_CU_TRY(cudaFuncSetAttribute(gemv_kernel<DT, LPR>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e);
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        LILY_CU_TRY(cudaGetDevice(&dev), e);
        LILY_CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), e);
    }
    /* no more blocks than fit at once: each builds x' once, then loops over row groups */
    int per_sm = 1;
    LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<DT, LPR>,
                                                              kThreads, smem),
                e);
    if (per_sm < 1) per_sm = 1;
    int rows_per_block = (kThreads / 32) * (32 / LPR) * kRowsUnroll;
    int blocks = (p.total + rows_per_block - 1) / rows_per_block;
    if (blocks > sms * per_sm) blocks = sms * per_sm;
    gemv_kernel<DT, LPR><<<blocks, kThreads, smem, st>>>(p);
    LILY_CU_LAUNCHED(e);
    return 0;
}

template <int DT> int launch_dt(const gv_params &p, lily_cuda_stream st, lily_err *e) {
    int nchunk = p.cols / wtype<DT>::epc;
    if (nchunk % 32 == 0) return launch<DT, 32>(p, st, e);
    if (nchunk % 16 == 0) return launch<DT, 16>(p, st, e);
    if (nchunk % 8 == 0) return launch<DT, 8>(p, st, e);
    if (nchunk % 4 == 0) return launch<DT, 4>(p, st, e);
    return launch<DT, 2>(p, st, e);
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
        if (p.pro == LILY_GP_GATED && (p.head < 1 || p.cols % p.head))
            return lily_fail(e, "gemv: gated prologue head %d does not divide %d", p.head, p.cols);
    }
    switch (dt) {
    case LILY_CW_Q4: return launch_dt<LILY_CW_Q4>(p, st, e);
    case LILY_CW_Q8: return launch_dt<LILY_CW_Q8>(p, st, e);
    default: return launch_dt<LILY_CW_BF16>(p, st, e);
    }
}
