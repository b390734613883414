/* GPU attention (backend/cuda/attn.h) against a CPU reference: the prep kernel (q/k RMSNorm,
 * partial RoPE, int16 + scale cache rows) against lily_cpu_rmsnorm + lily_cpu_rope, split-K
 * decode at contexts from 1 to 131073 positions (one split, every split count from 1 to 128,
 * forced split targets, odd lengths, group sizes 1 to 16), and the tensor-core prefill over chunks
 * that start at 0 and deep in the cache, with and without the sigmoid output gate, for head dims
 * 64, 128, 256 and several group sizes. The reference is attention with double sums
 * (ref_attention) on the values the cache holds (code * scale, rows of random magnitude, some
 * all zero), with unrounded queries; each case runs with lily_cuda_prec.attn_exact 1 (the exact
 * split products: the result must agree to fp32 accumulation level) and 0 (one pass, the
 * engine's FAST precision: a looser bound).
 *
 * Prefill runs the default (exact: at head dim 256 the warp-specialised wgmma kernel, attn_ws.cu,
 * split over the causal spans as the SMs call for; attn.cu's exact kernel at other head dims),
 * fast (at head dim 256 attn_fa.cu's one-pass fp16 wgmma kernel, to its own bound TOL_FA;
 * attn.cu's one-pass bf16 kernel at other head dims), and at head dim 256 the ws kernel unsplit
 * and split in three (lily_cuda_attn_prefill_force_splits; some splits of short spans are empty),
 * to the exact bound, attn.cu's one-pass kernel (lily_cuda_attn_prefill_force_fast_kernel), and
 * the fa kernel unsplit and split in three. Chunks start at 0, 1000, 3000, 20011 and 70000.
 *
 * LILY_CUDA_TIME=1 also times, in each mode, decode at the 35B-A3B shape (Nq 16, Nkv 2, Dh 256,
 * 128 splits as the backend sizes them) at contexts 4K to 128K, alone and as a CUDA graph of 10
 * calls (the 10 attention layers of a decode step), with a sweep of split targets, and prefill
 * chunks: 512 tokens at depth 130560, 4096 from 0, at 28672, 32768, 65536 and 126976 (cudaEvent,
 * median of 20; microseconds and TFLOP/s of the causal products); LILY_CUDA_TIME=1p the prefill
 * chunks alone (no parity cases: for profilers, 23 launches per chunk and mode, 3 warm-ups and 20
 * timed, in the order above); LILY_CUDA_TIME=1f the same for the one-pass modes alone (attn.cu's
 * mma.sync kernel, then attn_fa.cu's split as the SMs call for, and unsplit). */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "backend/cuda/attn.h"
#include "backend/cuda/attn_fa.h"
#include "backend/cuda/attn_wg.h"
#include "parity_util.h"

/* RMS relative bounds (pt_check) of the two modes: exact products leave fp32 accumulation error
 * (tensor-core sums, exp2f: ~1e-5); one bf16 pass rounds q, K, V and P to 8 bits (~2e-3). */
#define TOL_EXACT 5e-5 /* relative to the RMS of sum p |v| / l: pt_check_scaled */
#define TOL_FAST  1e-2
/* attn_fa.cu's one fp16 pass rounds q, K, V and P to 11 bits (~2.4e-4 each) */
#define TOL_FA    2e-3

static float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* The reference: causal GQA attention as lily_cpu_attention computes it, but with the softmax
 * sum and the weighted sum of V accumulated in double. lily_cpu_attention's fp32 sums over a long
 * context are themselves off by ~1e-5 of the output's RMS where attention is flat (|O| much
 * smaller than the sum of |p v|), which is the size of TOL_EXACT. scr: [ctx] floats. */
static void ref_attention(const float *q, int n, int pos, const float *kc, const float *vc, int Nq,
                          int Nkv, int Dh, float scale, float *out, float *mag, float *scr) {
    int rep = Nq / Nkv, qd = Nq * Dh, kd = Nkv * Dh;
    double *acc = malloc((size_t)Dh * 2 * sizeof(double)), *am = acc + Dh;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Nq; h++) {
            const float *qv = q + (size_t)t * qd + (size_t)h * Dh;
            int g = h / rep, len = pos + t + 1;
            float mx = -INFINITY;
            for (int s = 0; s < len; s++) {
                const float *kv = kc + (size_t)s * kd + (size_t)g * Dh;
                double dot = 0;
                for (int d = 0; d < Dh; d++)
                    dot += (double)qv[d] * kv[d];
                scr[s] = (float)(dot * scale);
                mx = fmaxf(mx, scr[s]);
            }
            double sum = 0;
            for (int d = 0; d < Dh; d++)
                acc[d] = am[d] = 0;
            for (int s = 0; s < len; s++) {
                double w = exp((double)scr[s] - mx);
                const float *vv = vc + (size_t)s * kd + (size_t)g * Dh;
                sum += w;
                for (int d = 0; d < Dh; d++)
                    acc[d] += w * vv[d], am[d] += w * fabsf(vv[d]);
            }
            float *o = out + (size_t)t * qd + (size_t)h * Dh;
            float *m = mag + (size_t)t * qd + (size_t)h * Dh;
            for (int d = 0; d < Dh; d++)
                o[d] = (float)(acc[d] / sum), m[d] = (float)(am[d] / sum);
        }
    free(acc);
}

/* attn_exact of the calls that follow (the GEMMs stay exact) */
static void set_exact(int on) {
    lily_cuda_prec p = {1, on};
    lily_cuda_prec_set(p);
}

/* The decode split target of the calls that follow (0: as the SMs call for) */
static int g_want;
static void set_want(int want) {
    g_want = want;
    lily_cuda_attn_decode_force_splits(want);
}

/* Prefill modes: the default (exact, split auto), fast (at head dim 256 attn_fa.cu's one-pass
 * wgmma kernel, split auto; attn.cu's one-pass kernel at other head dims), the ws kernel unsplit
 * and split in 3, attn.cu's one-pass mma.sync kernel at head dim 256 (the kernel attn_fa.cu
 * replaces), and the fa kernel unsplit and split in 3 (modes 2-6 differ from modes 0 and 1 at
 * head dim 256 only). */
static const int k_pre_modes = 7;
static int pre_mode_exact(int m) {
    return m == 0 || m == 2 || m == 3;
}
static int pre_mode_dh256_only(int m) {
    return m >= 2;
}
/* the fa kernel's bound where it runs (modes 1, 5, 6 at head dim 256) */
static double pre_mode_tol(int m, int Dh) {
    if (pre_mode_exact(m)) return TOL_EXACT;
    return Dh == 256 && m != 4 ? TOL_FA : TOL_FAST;
}
static void set_pre_mode(int m) {
    set_exact(pre_mode_exact(m));
    lily_cuda_attn_prefill_force_splits(m == 2 || m == 5 ? 1 : m == 3 || m == 6 ? 3 : 0);
    lily_cuda_attn_prefill_force_fast_kernel(m == 4);
}
static const char *pre_mode_name(int m) {
    static const char *nm[] = {" (default)",    " (fast)",          " (ws unsplit)",
                               " (ws split 3)", " (fast mma.sync)", " (fa unsplit)",
                               " (fa split 3)"};
    return nm[m];
}

/* One cache row (all Nkv heads of a position) in the format of attn.h, from x [Nkv*Dh]; x is
 * replaced by the values the row holds (code * scale), which is what the reference sees. */
static void kv_pack_row(float *x, int Nkv, int Dh, uint8_t *row) {
    uint16_t *codes = (uint16_t *)row; /* offset binary: code + 32768 */
    float *scales = (float *)(row + (size_t)Nkv * Dh * 2);
    for (int j = 0; j < Nkv; j++) {
        float *xj = x + (size_t)j * Dh, mx = 0.f;
        for (int d = 0; d < Dh; d++)
            mx = fmaxf(mx, fabsf(xj[d]));
        const float cm = (float)LILY_CUDA_KV_CODE_MAX;
        float sc = mx / cm;
        scales[j] = sc;
        for (int d = 0; d < Dh; d++) {
            float c = sc > 0.f ? rintf(xj[d] / sc) : 0.f;
            c = fminf(fmaxf(c, -cm), cm);
            codes[(size_t)j * Dh + d] = (uint16_t)(32768 + (int)c);
            xj[d] = c * sc;
        }
    }
}

/* Random cache of ctx positions: host fp32 values [ctx][Nkv*Dh] (as the cache holds them) and the
 * device rows. Each (position, head) row gets its own magnitude (0.25 to 2), and every 37th
 * position's head 0 is all zero (scale 0). */
static void make_cache(int ctx, int Nkv, int Dh, float **h, void **d) {
    size_t w = (size_t)Nkv * Dh, rb = lily_cuda_kv_bytes(1, Nkv, Dh);
    *h = malloc((size_t)ctx * w * 4);
    uint8_t *b = calloc((size_t)ctx, rb);
    for (int p = 0; p < ctx; p++) {
        float *x = *h + (size_t)p * w;
        for (int j = 0; j < Nkv; j++) {
            float amp = (p % 37 == 5 && j == 0) ? 0.f : 1.125f + 0.875f * pt_frand();
            for (int i = 0; i < Dh; i++)
                x[(size_t)j * Dh + i] = pt_frand() * amp;
        }
        kv_pack_row(x, Nkv, Dh, b + (size_t)p * rb);
    }
    lily_err e;
    *d = lily_cuda_alloc(lily_cuda_kv_bytes(ctx, Nkv, Dh), &e);
    lily_cuda_h2d(*d, b, lily_cuda_kv_bytes(ctx, Nkv, Dh), &e);
    free(b);
}

static int32_t *dev_pos(int p) {
    lily_err e;
    int32_t *d = lily_cuda_alloc(4, &e);
    lily_cuda_h2d(d, &p, 4, &e);
    return d;
}

static void decode_case(int Nq, int Nkv, int Dh, int ctx, int splits, int gated) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh;
    float *kc, *vc;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk);
    make_cache(ctx, Nkv, Dh, &vc, &dv);
    float *q = malloc(qd * 4), *gate = malloc(qd * 4), *ref = malloc(qd * 4);
    float *mag = malloc(qd * 4);
    pt_fill(q, qd, 1.5f);
    pt_fill(gate, qd, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    float *scr = malloc((size_t)ctx * 4);
    ref_attention(q, 1, ctx - 1, kc, vc, Nq, Nkv, Dh, scale, ref, mag, scr);
    if (gated)
        for (int i = 0; i < qd; i++)
            ref[i] *= sig(gate[i]), mag[i] *= sig(gate[i]);
    float *dq = pt_dup(q, qd), *dg = pt_dup(gate, qd), *dout = pt_dalloc(qd * 4);
    float *dscr = pt_dalloc(lily_cuda_attn_decode_scratch(Nq, Dh, splits) * 4);
    int32_t *dp = dev_pos(ctx - 1);
    float *got = malloc(qd * 4);
    char want[16] = "";
    if (g_want) snprintf(want, sizeof want, " want=%d", g_want);
    for (int ex = 1; ex >= 0; ex--) {
        set_exact(ex);
        int rc = lily_cuda_attn_decode(dq, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL, dscr,
                                       splits, dout, NULL, &e);
        if (!pt_ok(rc, "decode launch", &e)) break;
        pt_get(got, dout, qd);
        snprintf(name, sizeof name, "attn decode%s Nq=%d Nkv=%d Dh=%d ctx=%d splits=%d%s%s",
                 ex ? "" : " (fast)", Nq, Nkv, Dh, ctx, splits, gated ? " gated" : "", want);
        pt_check_scaled(name, got, ref, mag, qd, ex ? TOL_EXACT : TOL_FAST);
    }
    set_exact(1);
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dscr), lily_cuda_free(dp);
    free(kc), free(vc), free(q), free(gate), free(ref), free(mag), free(scr), free(got);
}

static void prefill_case(int Nq, int Nkv, int Dh, int pos0, int n, int gated) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh, ctx = pos0 + n;
    float *kc, *vc;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk);
    make_cache(ctx, Nkv, Dh, &vc, &dv);
    size_t nq = (size_t)n * qd;
    float *q = malloc(nq * 4), *gate = malloc(nq * 4), *ref = malloc(nq * 4);
    float *mag = malloc(nq * 4);
    pt_fill(q, nq, 1.5f);
    pt_fill(gate, nq, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    float *scr = malloc((size_t)ctx * 4);
    ref_attention(q, n, pos0, kc, vc, Nq, Nkv, Dh, scale, ref, mag, scr);
    if (gated)
        for (size_t i = 0; i < nq; i++)
            ref[i] *= sig(gate[i]), mag[i] *= sig(gate[i]);
    float *dq = pt_dup(q, nq), *dg = pt_dup(gate, nq), *dout = pt_dalloc(nq * 4);
    const size_t np = lily_cuda_attn_prefill_scratch(Nq, Nkv, Dh);
    float *dpart = np ? pt_dalloc(np * 4) : NULL;
    int32_t *dp = dev_pos(pos0);
    float *got = malloc(nq * 4);
    for (int m = 0; m < k_pre_modes; m++) {
        if (pre_mode_dh256_only(m) && Dh != 256) continue;
        set_pre_mode(m);
        cudaMemset(dout, 0xff, nq * 4); /* NaN: every output must be written */
        int rc = lily_cuda_attn_prefill(dq, n, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL,
                                        dout, dpart, NULL, &e);
        if (!pt_ok(rc, "prefill launch", &e)) break;
        pt_get(got, dout, nq);
        snprintf(name, sizeof name, "attn prefill%s Nq=%d Nkv=%d Dh=%d pos0=%d n=%d%s",
                 pre_mode_name(m), Nq, Nkv, Dh, pos0, n, gated ? " gated" : "");
        pt_check_scaled(name, got, ref, mag, nq, pre_mode_tol(m, Dh));
    }
    set_pre_mode(0); /* back to the defaults */
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dp), lily_cuda_free(dpart);
    free(kc), free(vc), free(q), free(gate), free(ref), free(mag), free(scr), free(got);
}

/* Rows of the GPU cache (positions pos0.., all heads) against fp32 reference rows ref [n][Nkv*Dh]:
 * each head's scale is max|ref row| / LILY_CUDA_KV_CODE_MAX (to 1e-5) and each code * scale is within scale / 2
 * of the reference (plus 1e-5 of the row's max for the fp32 differences of norm and RoPE). */
static void check_rows(const char *what, const void *dcache, int pos0, int n, int Nkv, int Dh,
                       const float *ref) {
    lily_err e;
    size_t rb = lily_cuda_kv_bytes(1, Nkv, Dh), w = (size_t)Nkv * Dh;
    uint8_t *b = malloc((size_t)n * rb);
    float *dec = malloc((size_t)n * w * 4);
    lily_cuda_d2h(b, (const uint8_t *)dcache + lily_cuda_kv_prefix_bytes(pos0, Nkv, Dh),
                  (size_t)n * rb, &e);
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        const uint16_t *codes = (const uint16_t *)(b + (size_t)t * rb); /* code + 32768 */
        const float *scales = (const float *)(b + (size_t)t * rb + w * 2);
        for (int j = 0; j < Nkv; j++) {
            const float *r = ref + (size_t)t * w + (size_t)j * Dh;
            float mx = 0.f, sc = scales[j];
            const float cm = (float)LILY_CUDA_KV_CODE_MAX;
            for (int d = 0; d < Dh; d++)
                mx = fmaxf(mx, fabsf(r[d]));
            if (fabsf(sc - mx / cm) > 1e-5f * mx / cm + 1e-30f) bad++;
            for (int d = 0; d < Dh; d++) {
                const int c = (int)codes[(size_t)j * Dh + d] - 32768;
                if (c < -LILY_CUDA_KV_CODE_MAX || c > LILY_CUDA_KV_CODE_MAX) bad++; /* clamped */
                float x = c * sc;
                dec[(size_t)t * w + (size_t)j * Dh + d] = x;
                double err = fabs((double)x - r[d]), lim = 0.5 * sc + 1e-5 * mx;
                if (err > lim) bad++;
                if (sc > 0 && err / sc > worst) worst = err / sc;
            }
        }
    }
    char name[200];
    snprintf(name, sizeof name, "%s: int16 rows within scale/2 (worst %.3f scale, %d bad)", what,
             worst, bad);
    pt_check_true(name, bad == 0);
    snprintf(name, sizeof name, "%s: decoded rows", what);
    pt_check(name, dec, ref, (size_t)n * w, 1e-4);
    free(b), free(dec);
}

static void prep_case(int Nq, int Nkv, int Dh, int R, int pos0, int n, int gated) {
    lily_err e;
    char name[200];
    int qw = Nq * Dh * (gated ? 2 : 1), ldqg = qw + 3, kvw = Nkv * Dh, ldkv = kvw + 1;
    int ctx = pos0 + n;
    double theta = 1e7;
    float *qg = malloc((size_t)n * ldqg * 4), *k = malloc((size_t)n * ldkv * 4);
    float *v = malloc((size_t)n * ldkv * 4), *qn = malloc(Dh * 4), *kn = malloc(Dh * 4);
    pt_fill(qg, (size_t)n * ldqg, 2.0f);
    pt_fill(k, (size_t)n * ldkv, 2.0f);
    pt_fill(v, (size_t)n * ldkv, 2.0f);
    if (n > 1) /* an all-zero V row: scale 0, codes 0 */
        for (int d = 0; d < Dh; d++)
            v[(size_t)1 * ldkv + d] = 0.f;
    for (int i = 0; i < Dh; i++)
        qn[i] = 1 + 0.3f * pt_frand(), kn[i] = 1 + 0.3f * pt_frand();
    float *inv = malloc((R / 2 + 1) * 4);
    for (int i = 0; i < R / 2; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)R);
    float *dqg = pt_dup(qg, (size_t)n * ldqg), *dk = pt_dup(k, (size_t)n * ldkv);
    float *dv = pt_dup(v, (size_t)n * ldkv), *dqn = pt_dup(qn, Dh), *dkn = pt_dup(kn, Dh);
    float *dinv = pt_dup(inv, R / 2 + 1);
    float *dq = pt_dalloc((size_t)n * Nq * Dh * 4), *dgt = pt_dalloc((size_t)n * Nq * Dh * 4);
    void *dkc = pt_dalloc(lily_cuda_kv_bytes(ctx, Nkv, Dh));
    void *dvc = pt_dalloc(lily_cuda_kv_bytes(ctx, Nkv, Dh));
    int32_t *dp = dev_pos(pos0);
    int rc = lily_cuda_attn_prep(dqg, ldqg, dk, dv, ldkv, n, dp, Nq, Nkv, Dh, R, dinv, dqn, dkn,
                                 1e-6f, gated, dq, dgt, dkc, dvc, NULL, &e);
    if (!pt_ok(rc, "prep launch", &e)) return;
    size_t nq = (size_t)n * Nq * Dh, nk = (size_t)n * kvw;
    float *rq = malloc(nq * 4), *rg = malloc(nq * 4), *rk = malloc(nk * 4), *rv = malloc(nk * 4);
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < Nq; h++) {
            const float *src = qg + (size_t)t * ldqg + (size_t)h * Dh * (gated ? 2 : 1);
            float *dst = rq + ((size_t)t * Nq + h) * Dh;
            lily_cpu_rmsnorm(src, qn, Dh, 1e-6f, dst);
            lily_cpu_rope(dst, R, pos0 + t, theta);
            if (gated) memcpy(rg + ((size_t)t * Nq + h) * Dh, src + Dh, Dh * 4);
        }
        for (int h = 0; h < Nkv; h++) {
            float *dst = rk + ((size_t)t * Nkv + h) * Dh;
            lily_cpu_rmsnorm(k + (size_t)t * ldkv + h * Dh, kn, Dh, 1e-6f, dst);
            lily_cpu_rope(dst, R, pos0 + t, theta);
            memcpy(rv + ((size_t)t * Nkv + h) * Dh, v + (size_t)t * ldkv + h * Dh, Dh * 4);
        }
    }
    float *gq = malloc(nq * 4), *gg = malloc(nq * 4);
    pt_get(gq, dq, nq);
    if (gated) pt_get(gg, dgt, nq);
    snprintf(name, sizeof name, "attn prep q Nq=%d Dh=%d R=%d pos0=%d n=%d", Nq, Dh, R, pos0, n);
    pt_check(name, gq, rq, nq, 2e-5);
    if (gated) {
        snprintf(name, sizeof name, "attn prep gate Nq=%d n=%d", Nq, n);
        pt_check(name, gg, rg, nq, 0);
    }
    snprintf(name, sizeof name, "attn prep k cache Nkv=%d Dh=%d pos0=%d n=%d", Nkv, Dh, pos0, n);
    check_rows(name, dkc, pos0, n, Nkv, Dh, rk);
    snprintf(name, sizeof name, "attn prep v cache Nkv=%d Dh=%d pos0=%d n=%d", Nkv, Dh, pos0, n);
    check_rows(name, dvc, pos0, n, Nkv, Dh, rv);
    lily_cuda_free(dqg), lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dqn);
    lily_cuda_free(dkn), lily_cuda_free(dinv), lily_cuda_free(dq), lily_cuda_free(dgt);
    lily_cuda_free(dkc), lily_cuda_free(dvc), lily_cuda_free(dp);
    free(qg), free(k), free(v), free(qn), free(kn), free(inv), free(rq), free(rg), free(rk);
    free(rv), free(gq), free(gg);
}

/* ---- timing mode (LILY_CUDA_TIME=1) ---- */

typedef struct {
    float *q, *gate, *scr, *out, *part;
    void *k, *v;
    int32_t *pos;
    int n;
    cudaStream_t st;
} tctx;

static int t_decode(const tctx *c) {
    lily_err e;
    return lily_cuda_attn_decode(c->q, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate, c->scr,
                                 128, c->out, (lily_cuda_stream)c->st, &e);
}
static int t_prefill(const tctx *c) {
    lily_err e;
    return lily_cuda_attn_prefill(c->q, c->n, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate,
                                  c->out, c->part, (lily_cuda_stream)c->st, &e);
}

/* Ten decode calls captured as one CUDA graph on c->st (re-captured when the split target or the
 * precision changed), then replayed: the launches of a decode step. */
static int t_graph10(const tctx *c) {
    static cudaGraphExec_t ex;
    static const tctx *last;
    static int want = -1, exact = -1; /* both apply at capture */
    if (c != last || want != g_want || exact != lily_cuda_prec_get().attn_exact || !ex) {
        if (ex) cudaGraphExecDestroy(ex), ex = NULL;
        cudaGraph_t gr;
        if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
        lily_err e;
        for (int i = 0; i < 10; i++)
            if (lily_cuda_attn_decode(c->q, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate,
                                      c->scr, 128, c->out, (lily_cuda_stream)c->st, &e))
                printf("FAIL graph decode: %s\n", e.msg);
        if (cudaStreamEndCapture(c->st, &gr) != cudaSuccess) return -1;
        if (cudaGraphInstantiate(&ex, gr, 0) != cudaSuccess) return -1;
        cudaGraphDestroy(gr);
        last = c;
        want = g_want;
        exact = lily_cuda_prec_get().attn_exact;
    }
    return cudaGraphLaunch(ex, c->st) != cudaSuccess;
}

/* the timed calls as pt_time_fn */
static int t_decode_v(void *c) {
    return t_decode(c);
}
static int t_prefill_v(void *c) {
    return t_prefill(c);
}
static int t_graph10_v(void *c) {
    return t_graph10(c);
}
static float time_median(pt_time_fn f, tctx *c) {
    return pt_time_median(f, c, c->st);
}

/* Decode at 4K-128K (alone, in a graph of 10, split sweep) and one prefill chunk: one mode. */
static void time_mode(tctx *cp, int maxc, int n) {
    tctx c = *cp; /* t_graph10 re-captures for each mode's precision */
    lily_err e;
    const double rb = (double)lily_cuda_kv_bytes(1, 2, 256);
    static const int ctxs[] = {4096, 32768, 65536, 131072};
    static const int wants[] = {8, 16, 33, 66, 128};
    /* "1p", "1f": prefill only */
    const int pre_only = getenv("LILY_CUDA_TIME")[1] == 'p' || getenv("LILY_CUDA_TIME")[1] == 'f';
    for (int i = 0; i < 4 && !pre_only; i++) {
        int p = ctxs[i] - 1;
        lily_cuda_h2d(c.pos, &p, 4, &e);
        double gb = ctxs[i] * rb * 2 / 1e9; /* K and V bytes of the 2 KV heads */
        float t1 = time_median(t_decode_v, &c), t10 = time_median(t_graph10_v, &c) / 10;
        printf("time decode ctx=%-6d %8.1f us (%6.0f GB/s)  in a graph of 10: %8.1f us per call "
               "(%6.0f GB/s)\n",
               ctxs[i], t1, gb / t1 * 1e6, t10, gb / t10 * 1e6);
        for (int k = 0; k < 5; k++) {
            set_want(wants[k]);
            float t = time_median(t_graph10_v, &c) / 10;
            printf("time decode ctx=%-6d want=%-4d in a graph of 10: %8.1f us per call (%6.0f "
                   "GB/s)\n",
                   ctxs[i], wants[k], t, gb / t * 1e6);
        }
        set_want(0);
    }
    /* a 512-token chunk at 128K, and 4096-token chunks from 0, at 28K (a 32K prompt's last), at
     * 32K, 64K and 124K (a 128K prompt's last) */
    const int pn[6] = {n, 4096, 4096, 4096, 4096, 4096};
    const int pp[6] = {maxc - n, 0, 32768 - 4096, 32768, 65536, maxc - 4096};
    for (int k = 0; k < 6; k++) {
        const int p0 = pp[k];
        lily_cuda_h2d(c.pos, &p0, 4, &e);
        c.n = pn[k];
        double fl = 0; /* q.k and p.v multiply-adds of the causal chunk, 16 heads */
        for (int i = 0; i < c.n; i++)
            fl += 2.0 * 2 * 256 * 16 * (p0 + i + 1);
        float t = time_median(t_prefill_v, &c);
        printf("time prefill n=%d pos0=%d %10.1f us (%.1f TFLOP/s)\n", c.n, p0, t, fl / t / 1e6);
    }
}

static void time_all(void) {
    const int maxc = 131072, w = 2 * 256, n = 512, nq_max = 4096;
    lily_err e;
    const size_t rb = lily_cuda_kv_bytes(1, 2, 256), cb = lily_cuda_kv_bytes(maxc, 2, 256);
    uint8_t *h = malloc(cb);
    float row[2 * 256];
    tctx c = {0};
    c.k = pt_dalloc(cb);
    c.v = pt_dalloc(cb);
    for (int kv = 0; kv < 2; kv++) {
        for (int p = 0; p < maxc; p++) {
            pt_fill(row, w, 2.0f);
            kv_pack_row(row, 2, 256, h + (size_t)p * rb);
        }
        lily_cuda_h2d(kv ? c.v : c.k, h, cb, &e);
    }
    free(h);
    float *hq = malloc((size_t)nq_max * 16 * 256 * 4);
    pt_fill(hq, (size_t)nq_max * 16 * 256, 1.5f);
    c.q = pt_dup(hq, (size_t)nq_max * 16 * 256);
    pt_fill(hq, (size_t)nq_max * 16 * 256, 3.0f);
    c.gate = pt_dup(hq, (size_t)nq_max * 16 * 256);
    free(hq);
    c.out = pt_dalloc((size_t)nq_max * 16 * 256 * 4);
    c.scr = pt_dalloc(lily_cuda_attn_decode_scratch(16, 256, 128) * 4);
    c.part = pt_dalloc(lily_cuda_attn_prefill_scratch(16, 2, 256) * 4);
    c.pos = dev_pos(0);
    cudaStreamCreate(&c.st);
    /* "1f": the one-pass modes alone, attn.cu's mma.sync kernel then attn_fa.cu's (auto split,
     * unsplit) */
    static const int fast_modes[] = {4, 1, 5};
    const int fast_only = getenv("LILY_CUDA_TIME")[1] == 'f';
    const int nm = fast_only ? 3 : k_pre_modes;
    for (int i = 0; i < nm; i++) {
        const int m = fast_only ? fast_modes[i] : i;
        set_pre_mode(m);
        printf("time: mode%s\n", pre_mode_name(m));
        time_mode(&c, maxc, n);
    }
    set_pre_mode(0); /* back to the defaults */
    lily_cuda_free(c.k), lily_cuda_free(c.v), lily_cuda_free(c.q), lily_cuda_free(c.gate);
    lily_cuda_free(c.out), lily_cuda_free(c.scr), lily_cuda_free(c.pos), lily_cuda_free(c.part);
    cudaStreamDestroy(c.st);
}

int main(void) {
    pt_need_gpu();
    const char *tm = getenv("LILY_CUDA_TIME");
    if (tm && (!strcmp(tm, "1p") || !strcmp(tm, "1f"))) { /* prefill timing alone, no parity */
        time_all();
        return pt_finish();
    }
    /* LILY_CUDA_SAN=1: only the cases small enough for compute-sanitizer's memcheck (every
     * kernel and split path still runs; the 40K-131K contexts and deep prefills are left out);
     * LILY_CUDA_SAN=2: fewer still, for racecheck */
    const int san = getenv("LILY_CUDA_SAN") && getenv("LILY_CUDA_SAN")[0] == '1';
    if (getenv("LILY_CUDA_SAN") && getenv("LILY_CUDA_SAN")[0] == '2') {
        /* racecheck-sized (its shared-memory tracking is ~1000x slower): one small case per
         * kernel and path, each in both modes: prep, decode with one split and with several,
         * prefill with 8, 1 and 16 query heads per KV head (Dh 256, 128, 64) */
        prep_case(16, 2, 256, 64, 5, 3, 1);
        decode_case(16, 2, 256, 7, 1, 1);
        decode_case(8, 2, 128, 300, 3, 0);
        prefill_case(16, 2, 256, 0, 33, 1);
        prefill_case(4, 4, 128, 70, 20, 0);
        prefill_case(16, 1, 64, 7, 50, 1);
        return pt_finish();
    }
    prep_case(16, 2, 256, 64, 0, 1, 1);
    prep_case(16, 2, 256, 64, 131000, 3, 1);
    prep_case(4, 4, 64, 16, 7, 29, 0);
    decode_case(16, 2, 256, 1, 128, 1);
    decode_case(16, 2, 256, 7, 128, 1);
    decode_case(16, 2, 256, 17, 128, 1);
    decode_case(16, 2, 256, 1000, 128, 1);
    decode_case(16, 2, 256, 4097, 128, 0);
    if (!san) decode_case(16, 2, 256, 40000, 128, 1);
    if (!san) decode_case(16, 2, 256, 131073, 128, 1);
    /* every split count the grid can have, at an odd length */
    static const int splits[] = {1, 2, 3, 5, 8, 13, 31, 32, 33, 64, 100, 127, 128};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
        decode_case(16, 2, 256, 2049 + 2 * (int)i, splits[i], (int)i & 1);
    /* forced split targets (more than the grid, one, odd) */
    static const int wants[] = {1, 7, 129, 500};
    for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++) {
        set_want(wants[i]);
        decode_case(16, 2, 256, 9999, 128, 1);
    }
    set_want(0);
    decode_case(8, 2, 128, 300, 3, 1);
    decode_case(4, 2, 128, 5000, 40, 0);
    decode_case(4, 4, 64, 33, 1, 0);
    decode_case(16, 1, 64, 95, 5, 1);
    decode_case(16, 1, 256, 3333, 128, 1);
    decode_case(32, 2, 128, 777, 9, 1);
    decode_case(8, 1, 64, 6001, 64, 1);
    decode_case(2, 2, 128, 12345, 100, 0);
    prefill_case(16, 2, 256, 0, 1, 1);
    prefill_case(16, 2, 256, 0, 77, 1);
    if (!san) prefill_case(16, 2, 256, 3000, 512, 1);
    prefill_case(8, 2, 128, 0, 33, 0);
    prefill_case(4, 4, 64, 5, 100, 1);
    prefill_case(2, 1, 256, 17, 9, 0);
    if (!san) prefill_case(16, 2, 256, 20011, 37, 1);
    prefill_case(16, 2, 256, 31, 1, 1);
    if (!san) prefill_case(16, 2, 256, 3000, 129, 1);
    prefill_case(16, 1, 128, 100, 200, 0);
    prefill_case(4, 4, 128, 1000, 300, 1); /* G 1: 64 positions per block, 5 blocks */
    prefill_case(16, 1, 64, 7, 50, 1);
    prefill_case(8, 1, 256, 4000, 70, 0);
    if (!san) prefill_case(16, 2, 256, 0, 2048, 1); /* many tiles under the causal mask */
    /* the wgmma kernel's other group sizes at head dim 256 (128 / G positions per block) */
    prefill_case(16, 1, 256, 0, 45, 1);   /* G 16: 8 positions per block */
    prefill_case(8, 2, 256, 130, 67, 0);  /* G 4 */
    prefill_case(2, 2, 256, 999, 200, 1); /* G 1: 128 positions per block, two blocks */
    /* chunks continuing at 1000 and deep at 70000, odd lengths, G 8, 2, 1 */
    if (!san) prefill_case(16, 2, 256, 1000, 301, 1);
    prefill_case(4, 2, 256, 1000, 257, 0);
    if (!san) prefill_case(16, 2, 256, 70000, 9, 1);
    if (!san) prefill_case(4, 2, 256, 70001, 9, 0);
    if (!san) prefill_case(2, 2, 256, 69999, 5, 1);
    lily_err e;
    pt_check_true("attention rejects Dh=96",
                  lily_cuda_attn_prefill(NULL, 1, NULL, NULL, NULL, 2, 1, 96, 1, NULL, NULL, NULL,
                                         NULL, &e) == -1);
    if (getenv("LILY_CUDA_TIME") && getenv("LILY_CUDA_TIME")[0] == '1') time_all();
    return pt_finish();
}
#endif
