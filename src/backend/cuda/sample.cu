/* Token sampling on the device (sample.h): a statistics pass, 8 radix rounds for top-k, 8 for
 * top-p, the Gumbel race. Every pass runs over the whole vocabulary (1 MB of fp32 logits, L2
 * resident after the first) with a small grid; the last block to finish a pass (a ticket counter)
 * reads the pass's 256-bin histogram and fixes 8 more bits of the boundary key for the next. */
#include "backend/cuda/sample.h"

#include <float.h>

#include "backend/cuda/common.cuh"
#include "backend/draw_rng.h"

namespace {

constexpr int kThreads = 256; /* = the 256 digits of a radix round (pick_digit) */
constexpr int kMaxBlocks = 264;
constexpr double kFix = 1099511627776.0; /* 2^40: a weight in [0, 1] in fixed point */

typedef unsigned long long u64;

struct smp_state {
    u64 maxkey;      /* the best usable key (atomicMax); 0: none */
    u64 n_usable;    /* usable logits */
    unsigned ticket; /* blocks done with the running pass; the last one resets it */
    int k_on, p_on;  /* top-k / top-p selection in effect */
    u64 k_prefix;    /* top-k: the bits of the k-th key fixed so far */
    u64 k_need;      /* how many keys under the current prefix are still needed */
    u64 p_prefix;    /* top-p: the bits of the boundary key fixed so far */
    u64 p_acc;       /* weight of the kept keys above the current prefix (fixed point) */
    u64 p_target;    /* ceil(top_p * p_total) */
    u64 p_total;     /* weight of the top-k set */
    u64 race;        /* the best race key (atomicMax) */
    u64 hist[256];   /* the running round's counts or weights per digit */
};

/* float -> unsigned with the same order (finite values and infinities) */
__device__ __forceinline__ uint32_t order_bits(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float order_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}
/* the total order's key: larger logit first, then lower id */
__device__ __forceinline__ u64 key_of(float x, int i) {
    return ((u64)order_bits(x) << 32) | (0xffffffffu - (uint32_t)i);
}
__device__ __forceinline__ int32_t id_of(u64 k) {
    return (int32_t)(0xffffffffu - (uint32_t)k);
}

/* logits[i] as the sampler sees it, false when it cannot be drawn */
__device__ __forceinline__ bool usable(const float *__restrict__ l, int i,
                                       const lily_cuda_sampling &c, float &x) {
    x = l[i];
    const uint32_t a = __float_as_uint(x) & 0x7fffffffu;
    if (a > 0x7f800000u || x == -INFINITY) return false; /* NaN counts as -inf */
    if (x == INFINITY) x = FLT_MAX;
    if ((c.n_ids > 0 && i >= c.n_ids) || i == c.ban_id) return false;
    return !c.mask || (i < c.n_allow && (__ldg(&c.mask[i >> 5]) >> (i & 31) & 1u));
}

__device__ u64 block_sum(u64 v) {
    __shared__ u64 w[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 s = 0;
    for (int i = 0; i < kThreads / 32; i++)
        s += w[i];
    return s;
}
__device__ u64 block_max(u64 v) {
    __shared__ u64 w[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, v, o);
        v = y > v ? y : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 m = 0;
    for (int i = 0; i < kThreads / 32; i++)
        m = w[i] > m ? w[i] : m;
    return m;
}

/* true in the last block to finish the pass (its atomics and the others' are then visible) */
__device__ bool last_block(smp_state *s) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&s->ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    return last;
}

/* The digit where the histogram, summed from digit 255 down, reaches need: above(d) < need <=
 * above(d) + hist[d], with above(d) the sum over the digits above d; -1 when the whole sum stays
 * below need. Every thread of the block calls it (256 threads, one digit each). */
__device__ int pick_digit(const u64 *hist, u64 need, u64 *above_out) {
    __shared__ u64 w[kThreads / 32];
    __shared__ int res;
    __shared__ u64 res_above;
    const int t = threadIdx.x, lane = t & 31;
    const u64 v = __ldcg(&hist[255 - t]);
    u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) w[t >> 5] = x;
    if (t == 0) res = -1, res_above = 0;
    __syncthreads();
    for (int i = 0; i < (t >> 5); i++)
        x += w[i];
    const u64 above = x - v;
    if (above < need && x >= need) res = 255 - t, res_above = above;
    __syncthreads();
    *above_out = res_above;
    return res;
}

/* the block's 256-bin histogram into the pass's */
__device__ void push_hist(u64 *sh, smp_state *s) {
    __syncthreads();
    for (int j = threadIdx.x; j < 256; j += kThreads)
        if (sh[j]) atomicAdd(&s->hist[j], sh[j]);
}

/* in the last block, after pick_digit has read the histogram: zero it and the ticket */
__device__ void reset_pass(smp_state *s) {
    __syncthreads();
    for (int j = threadIdx.x; j < 256; j += kThreads)
        s->hist[j] = 0;
    if (threadIdx.x == 0) s->ticket = 0;
}

__global__ void __launch_bounds__(kThreads)
    stats_kernel(const float *__restrict__ l, int V, const lily_cuda_sampling *cfg, smp_state *s) {
    const lily_cuda_sampling c = *cfg;
    u64 best = 0, n = 0;
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < V; i += gridDim.x * kThreads) {
        float x;
        if (!usable(l, i, c, x)) continue;
        n++;
        const u64 k = key_of(x, i);
        best = k > best ? k : best;
    }
    best = block_max(best);
    n = block_sum(n);
    if (threadIdx.x == 0) {
        if (best) atomicMax(&s->maxkey, best);
        if (n) atomicAdd(&s->n_usable, n);
    }
    if (last_block(s) && threadIdx.x == 0) {
        const u64 nu = __ldcg(&s->n_usable);
        s->k_on = c.temperature > 0.0f && c.top_k > 0 && (u64)c.top_k < nu;
        s->k_need = (u64)(c.top_k > 0 ? c.top_k : 0);
        s->ticket = 0;
    }
}

/* top-k, round r: counts per digit r (bits 56 - 8 r .. 63 - 8 r) of the keys under the prefix */
__global__ void __launch_bounds__(kThreads)
    count_kernel(const float *__restrict__ l, int V, const lily_cuda_sampling *cfg, smp_state *s,
                 int r) {
    if (!s->k_on) return;
    __shared__ u64 h[256];
    for (int j = threadIdx.x; j < 256; j += kThreads)
        h[j] = 0;
    __syncthreads();
    const lily_cuda_sampling c = *cfg;
    const u64 pre = s->k_prefix;
    const int sh = 56 - 8 * r;
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < V; i += gridDim.x * kThreads) {
        float x;
        if (!usable(l, i, c, x)) continue;
        const u64 k = key_of(x, i);
        if (r > 0 && (k >> (sh + 8)) != (pre >> (sh + 8))) continue;
        atomicAdd(&h[(k >> sh) & 255], 1ull);
    }
    push_hist(h, s);
    if (!last_block(s)) return;
    u64 above;
    const u64 need = s->k_need;
    const int d = pick_digit(s->hist, need, &above); /* >= 0: the prefix holds >= need keys */
    if (threadIdx.x == 0) {
        s->k_need = need - above;
        s->k_prefix = pre | ((u64)(d < 0 ? 0 : d) << sh);
    }
    reset_pass(s);
}

/* the weight of key x as the CPU sampler computes it, and the drawable filters before top-p */
struct weights {
    float maxl, inv_t;
    bool k_on;
    u64 k_min; /* keys below the k-th are outside the top-k set */
};
/* log of the weight: (x - max) / T, 0 for the best logit even when 1 / T overflows */
__device__ __forceinline__ float lw_of(float x, const weights &w) {
    return x == w.maxl ? 0.0f : (x - w.maxl) * w.inv_t;
}
__device__ __forceinline__ weights weights_of(const smp_state *s, const lily_cuda_sampling &c) {
    weights w;
    w.maxl = order_float((uint32_t)(s->maxkey >> 32));
    w.inv_t = (float)(1.0 / (double)c.temperature);
    w.k_on = s->k_on != 0;
    w.k_min = s->k_prefix;
    return w;
}

/* top-p, round r: weights per digit r of the top-k, min-p keys under the prefix; round 0 also
 * sums the top-k set's weight (the target's base) */
__global__ void __launch_bounds__(kThreads)
    mass_kernel(const float *__restrict__ l, int V, const lily_cuda_sampling *cfg, smp_state *s,
                int r) {
    const lily_cuda_sampling c = *cfg;
    if (!(c.temperature > 0.0f) || !(c.top_p > 0.0f && c.top_p < 1.0f) || !s->maxkey) return;
    if (r > 0 && !s->p_on) return;
    __shared__ u64 h[256];
    for (int j = threadIdx.x; j < 256; j += kThreads)
        h[j] = 0;
    __syncthreads();
    const weights wt = weights_of(s, c);
    const u64 pre = s->p_prefix;
    const int sh = 56 - 8 * r;
    u64 tot = 0;
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < V; i += gridDim.x * kThreads) {
        float x;
        if (!usable(l, i, c, x)) continue;
        const u64 k = key_of(x, i);
        if (wt.k_on && k < wt.k_min) continue;
        const float w = expf(lw_of(x, wt));
        const u64 wf = (u64)((double)w * kFix);
        tot += wf;
        if (c.min_p > 0.0f && !((double)w >= (double)c.min_p || x == wt.maxl)) continue;
        if (r > 0 && (k >> (sh + 8)) != (pre >> (sh + 8))) continue;
        if (wf) atomicAdd(&h[(k >> sh) & 255], wf);
    }
    push_hist(h, s);
    if (r == 0) {
        tot = block_sum(tot);
        if (threadIdx.x == 0 && tot) atomicAdd(&s->p_total, tot);
    }
    if (!last_block(s)) return;
    if (r == 0 && threadIdx.x == 0)
        s->p_target = (u64)ceil((double)c.top_p * (double)__ldcg(&s->p_total));
    __syncthreads();
    const u64 acc = s->p_acc, target = __ldcg(&s->p_target);
    u64 above;
    const int d = pick_digit(s->hist, target > acc ? target - acc : 1, &above);
    if (threadIdx.x == 0) {
        if (d < 0) { /* the target is out of reach (round 0 only): keep every survivor */
            s->p_on = 0;
        } else {
            s->p_on = 1;
            s->p_acc = acc + above;
            s->p_prefix = pre | ((u64)d << sh);
        }
    }
    reset_pass(s);
}

/* u_i in (0, 1) from (seed, step, i) (draw_rng.h), as a Gumbel variate */
__device__ __forceinline__ float gumbel(uint64_t seed, uint64_t step, int i) {
    return (float)-log(-log(lily_draw_uniform(seed, step, i)));
}

/* the draw: the survivor with the largest (x - max) / T + Gumbel; argmax when T <= 0 */
__global__ void __launch_bounds__(kThreads)
    race_kernel(const float *__restrict__ l, int V, const lily_cuda_sampling *cfg, smp_state *s,
                uint64_t *d_step, int32_t *out) {
    const lily_cuda_sampling c = *cfg;
    const bool draw = c.temperature > 0.0f && s->maxkey;
    if (draw) {
        const weights wt = weights_of(s, c);
        const bool p_on = c.top_p > 0.0f && c.top_p < 1.0f && s->p_on;
        const u64 p_min = s->p_prefix;
        const uint64_t step = *d_step;
        u64 best = 0;
        for (int i = blockIdx.x * kThreads + threadIdx.x; i < V; i += gridDim.x * kThreads) {
            float x;
            if (!usable(l, i, c, x)) continue;
            const u64 k = key_of(x, i);
            if ((wt.k_on && k < wt.k_min) || (p_on && k < p_min)) continue;
            const float lw = lw_of(x, wt);
            const float w = expf(lw);
            if (w == 0.0f) continue; /* weight 0: the CPU sampler never draws it either */
            if (c.min_p > 0.0f && !((double)w >= (double)c.min_p || x == wt.maxl)) continue;
            const u64 rk =
                ((u64)order_bits(lw + gumbel(c.seed, step, i)) << 32) | (0xffffffffu - (uint32_t)i);
            best = rk > best ? rk : best;
        }
        best = block_max(best);
        if (threadIdx.x == 0 && best) atomicMax(&s->race, best);
    }
    if (!last_block(s) || threadIdx.x != 0) return;
    const u64 k = draw ? __ldcg(&s->race) : __ldcg(&s->maxkey);
    *out = k ? id_of(k) : -1;
    *d_step += 1;
    s->ticket = 0;
}

/* one thread: a pipelined step's input token, position, and its draw's settings and step */
__global__ void draw_setup_kernel(int32_t *d_tok, int32_t *d_pos, const int32_t *d_last,
                                  int32_t tok, int pos, lily_cuda_sampling *d_cfg,
                                  lily_cuda_sampling cfg, uint64_t *d_step, uint64_t step) {
    const int32_t last = d_last ? *d_last : 0;
    *d_tok = tok >= 0 ? tok : last >= 0 ? last : 0;
    *d_pos = pos;
    *d_cfg = cfg;
    *d_step = step;
}

} // namespace

extern "C" int lily_cuda_draw_setup(int32_t *d_tok, int32_t *d_pos, const int32_t *d_last,
                                    int32_t tok, int pos, lily_cuda_sampling *d_cfg,
                                    const lily_cuda_sampling *cfg, uint64_t *d_step, uint64_t step,
                                    lily_cuda_stream st, lily_err *e) {
    draw_setup_kernel<<<1, 1, 0, st>>>(d_tok, d_pos, d_last, tok, pos, d_cfg, *cfg, d_step, step);
    LILY_CU_LAUNCHED(e);
    return 0;
}

extern "C" size_t lily_cuda_sample_scratch_bytes(void) {
    return sizeof(smp_state);
}

extern "C" int lily_cuda_sample(const float *logits, int V, const lily_cuda_sampling *d_cfg,
                                uint64_t *d_step, void *scratch, int32_t *d_out,
                                lily_cuda_stream st, lily_err *e) {
    if (V < 1) return lily_fail(e, "sample: a vocabulary of %d logits", V);
    if (!logits || !d_cfg || !d_step || !scratch || !d_out)
        return lily_fail(e, "sample: a device buffer is missing");
    smp_state *s = (smp_state *)scratch;
    LILY_CU_TRY(cudaMemsetAsync(s, 0, sizeof *s, st), e);
    int blocks = (V + kThreads * 4 - 1) / (kThreads * 4);
    blocks = blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks;
    stats_kernel<<<blocks, kThreads, 0, st>>>(logits, V, d_cfg, s);
    LILY_CU_LAUNCHED(e);
    for (int r = 0; r < 8; r++) {
        count_kernel<<<blocks, kThreads, 0, st>>>(logits, V, d_cfg, s, r);
        LILY_CU_LAUNCHED(e);
    }
    for (int r = 0; r < 8; r++) {
        mass_kernel<<<blocks, kThreads, 0, st>>>(logits, V, d_cfg, s, r);
        LILY_CU_LAUNCHED(e);
    }
    race_kernel<<<blocks, kThreads, 0, st>>>(logits, V, d_cfg, s, d_step, d_out);
    LILY_CU_LAUNCHED(e);
    return 0;
}
