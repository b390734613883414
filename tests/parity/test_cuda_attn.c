/* GPU attention (backend/cuda/attn.h) against lily_cpu_attention: the prep kernel (q/k RMSNorm,
 * partial RoPE, fp16 cache append with saturation) against lily_cpu_rmsnorm + lily_cpu_rope,
 * split-K decode at contexts from 1 to 131073 positions (one split, every split count from 1 to
 * 128, forced split targets, odd lengths, group sizes 1 to 16), and the tensor-core prefill over
 * chunks that start at 0 and deep in the cache, with and without the sigmoid output gate, for
 * head dims 64, 128, 256 and several group sizes. The reference is plain attention with
 * unrounded fp32 queries on the values the fp16 cache holds (random rows of random magnitude,
 * some in fp16's subnormal range), rounded on the host by a float -> fp16 conversion checked
 * here against every fp16 value and rounding tie; decode's reference accumulates in double (its
 * bound is below the rounding of an fp32 sum over 131K positions), prefill's is
 * lily_cpu_attention. A few cases also check that a reference on a bf16 cache (the format the
 * fixtures rejected) is told apart, so the bounds are tight enough to catch a wrong format.
 *
 * LILY_CUDA_TIME=1 also times decode at the 35B-A3B shape (Nq 16, Nkv 2, Dh 256, 128 splits as
 * the backend sizes them) at contexts 4K to 128K, alone and as a CUDA graph of 10 calls (the
 * 10 attention layers of a decode step), with a sweep of split targets, and one 512-token
 * prefill chunk at depth 130560 (cudaEvent, median of 20). */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "backend/cuda/attn.h"
#include "parity_util.h"

/* RMS relative bounds (pt_check) against the reference on the fp16 cache values.
 * Decode splits q and P into fp16 hi + lo (about 22 bits), so only fp32 accumulation is left
 * (tensor-core sums, exp2f, the split merge: ~1e-6 measured with the bf16 cache's kernel).
 * Prefill rounds q and P once to fp16 (2^-12 relative, RMS ~1.4e-4 each); a CPU emulation of the
 * kernel (its tiles, online softmax and group merge) gives 1.6e-4 to 2.6e-4 over this file's
 * prefill shapes, growing slowly with depth, and 1.75e-3 to 2.1e-3 against a bf16-cache
 * reference: 6e-4 sits between the two with a margin of about 2.3x on the pass side and 2.9x on
 * the detection side. */
#define TOL_DECODE 1e-5
#define TOL_PREFILL 6e-4

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- host fp16 ---- */

/* fp16 bits of x, round to nearest even (overflow to inf, NaN to a quiet NaN): the conversion
 * of __float2half_rn, written out so the reference does not depend on a compiler's _Float16. */
static uint16_t f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520: the tie above 65504 goes to inf */
    if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24 (x * 2^24 is exact, rintf RNE) */
        float m;
        memcpy(&m, &a, 4);
        return sign | (uint16_t)rintf(m * 16777216.0f);
    }
    uint32_t r = a - 0x38000000u; /* exponent rebased from 127 to 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

/* What the cache stores for x (attn.h): |x| > 65504 saturates, then round to nearest even. */
static uint16_t kv_f16(float x) {
    return f32_to_f16(fabsf(x) > 65504.f ? copysignf(65504.f, x) : x);
}
static float bf16r(float x) { return lily_bf16_to_f32(lily_f32_to_bf16(x)); }

/* The reference's rounding must be right: every finite fp16 value converts back to itself, the
 * midpoint of two neighbours goes to the even one and the floats next to it to the nearer one;
 * saturation and the subnormal range. */
static void check_host_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++)
        if ((h & 0x7c00u) != 0x7c00u && f32_to_f16(lily_f16_to_f32((uint16_t)h)) != h) bad++;
    for (uint32_t h = 0; h < 0x7bffu; h++) {
        double a = lily_f16_to_f32((uint16_t)h), b = lily_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact: 12 significant bits */
        uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        bad += f32_to_f16(mid) != even;
        bad += f32_to_f16(-mid) != (even | 0x8000u);
        bad += f32_to_f16(nextafterf(mid, 0.f)) != h;
        bad += f32_to_f16(nextafterf(mid, INFINITY)) != h + 1;
    }
    bad += kv_f16(1e5f) != 0x7bffu || kv_f16(-65520.f) != 0xfbffu;
    bad += f32_to_f16(65520.f) != 0x7c00u || f32_to_f16(1.0f) != 0x3c00u;
    bad += f32_to_f16(3e-8f) != 1 || f32_to_f16(ldexpf(1.f, -25)) != 0; /* 2^-25: tie to 0 */
    char name[120];
    snprintf(name, sizeof name, "host float -> fp16 (all values, ties, saturation): %d bad", bad);
    pt_check_true(name, bad == 0);
}

/* Relative L2 error as pt_check computes it. */
static double rel_l2(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The self-check: got must be further than tol from a reference computed on a bf16 cache. */
static void check_tells_apart(const char *what, const float *got, const float *wrong, size_t n,
                              double tol) {
    char name[240];
    double r = rel_l2(got, wrong, n);
    snprintf(name, sizeof name, "%s: a bf16-cache reference is told apart (rel %.3g > tol %.1g)",
             what, r, tol);
    pt_check_true(name, r > tol);
}

/* Random cache of ctx positions: host fp32 values [ctx][Nkv*Dh] as the fp16 cache holds them,
 * the device fp16 rows, and (bf != NULL) the same draws rounded to bf16 instead. Each (position,
 * head) row gets its own magnitude (0.25 to 2); every 37th position's head 0 is tiny (below
 * 3e-5: fp16 subnormals). */
static void make_cache(int ctx, int Nkv, int Dh, float **h, void **d, float **bf) {
    size_t w = (size_t)Nkv * Dh, n = (size_t)ctx * w;
    *h = malloc(n * 4);
    if (bf) *bf = malloc(n * 4);
    uint16_t *b = malloc(n * 2);
    for (int p = 0; p < ctx; p++)
        for (int j = 0; j < Nkv; j++) {
            float amp = (p % 37 == 5 && j == 0) ? 3e-5f : 1.125f + 0.875f * pt_frand();
            for (int i = 0; i < Dh; i++) {
                size_t o = (size_t)p * w + (size_t)j * Dh + i;
                float x = pt_frand() * amp;
                b[o] = kv_f16(x);
                (*h)[o] = lily_f16_to_f32(b[o]);
                if (bf) (*bf)[o] = bf16r(x);
            }
        }
    lily_err e;
    *d = pt_dalloc(lily_cuda_kv_bytes(ctx, Nkv, Dh));
    lily_cuda_h2d(*d, b, lily_cuda_kv_bytes(ctx, Nkv, Dh), &e);
    free(b);
}

static int32_t *dev_pos(int p) {
    lily_err e;
    int32_t *d = lily_cuda_alloc(4, &e);
    lily_cuda_h2d(d, &p, 4, &e);
    return d;
}

/* Attention of one query per head (q [Nq*Dh]) over cache rows 0..ctx-1, accumulated in double:
 * out [Nq*Dh]. */
static void ref_decode(const float *q, int ctx, const float *kc, const float *vc, int Nq, int Nkv,
                       int Dh, float scale, float *out) {
    double *s = malloc((size_t)ctx * sizeof(double)), o[256];
    size_t w = (size_t)Nkv * Dh;
    for (int h = 0; h < Nq; h++) {
        const float *qh = q + (size_t)h * Dh;
        size_t j = (size_t)(h / (Nq / Nkv)) * Dh;
        double m = -INFINITY, l = 0;
        for (int p = 0; p < ctx; p++) {
            double d = 0;
            for (int i = 0; i < Dh; i++) d += (double)qh[i] * kc[(size_t)p * w + j + i];
            s[p] = d * scale;
            m = fmax(m, s[p]);
        }
        for (int i = 0; i < Dh; i++) o[i] = 0;
        for (int p = 0; p < ctx; p++) {
            double e = exp(s[p] - m);
            l += e;
            for (int i = 0; i < Dh; i++) o[i] += e * vc[(size_t)p * w + j + i];
        }
        for (int i = 0; i < Dh; i++) out[(size_t)h * Dh + i] = (float)(o[i] / l);
    }
    free(s);
}

/* Decode of one query per head at position ctx - 1; wrong: also the bf16-cache self-check. */
static void decode_run(int Nq, int Nkv, int Dh, int ctx, int splits, int gated, int wrong) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh;
    float *kc, *vc, *kb = NULL, *vb = NULL;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk, wrong ? &kb : NULL);
    make_cache(ctx, Nkv, Dh, &vc, &dv, wrong ? &vb : NULL);
    float *q = malloc(qd * 4), *gate = malloc(qd * 4), *ref = malloc(qd * 4);
    pt_fill(q, qd, 1.5f);
    pt_fill(gate, qd, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    ref_decode(q, ctx, kc, vc, Nq, Nkv, Dh, scale, ref);
    if (gated)
        for (int i = 0; i < qd; i++) ref[i] *= sig(gate[i]);
    float *dq = pt_dup(q, qd), *dg = pt_dup(gate, qd), *dout = pt_dalloc(qd * 4);
    float *dscr = pt_dalloc(lily_cuda_attn_decode_scratch(Nq, Dh, splits) * 4);
    int32_t *dp = dev_pos(ctx - 1);
    float *got = malloc(qd * 4);
    const char *want = getenv("LILY_CUDA_ATTN_SPLITS");
    int rc = lily_cuda_attn_decode(dq, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL, dscr,
                                   splits, dout, NULL, &e);
    if (pt_ok(rc, "decode launch", &e)) {
        pt_get(got, dout, qd);
        snprintf(name, sizeof name, "attn decode Nq=%d Nkv=%d Dh=%d ctx=%d splits=%d%s%s%s", Nq,
                 Nkv, Dh, ctx, splits, gated ? " gated" : "", want ? " want=" : "",
                 want ? want : "");
        pt_check(name, got, ref, qd, TOL_DECODE);
        if (wrong) {
            ref_decode(q, ctx, kb, vb, Nq, Nkv, Dh, scale, ref);
            if (gated)
                for (int i = 0; i < qd; i++) ref[i] *= sig(gate[i]);
            check_tells_apart(name, got, ref, qd, TOL_DECODE);
        }
    }
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dscr), lily_cuda_free(dp);
    free(kc), free(vc), free(kb), free(vb), free(q), free(gate), free(ref), free(got);
}

static void decode_case(int Nq, int Nkv, int Dh, int ctx, int splits, int gated) {
    decode_run(Nq, Nkv, Dh, ctx, splits, gated, 0);
}

/* Prefill of n queries at positions pos0..; wrong: also the bf16-cache self-check. */
static void prefill_run(int Nq, int Nkv, int Dh, int pos0, int n, int gated, int wrong) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh, ctx = pos0 + n;
    float *kc, *vc, *kb = NULL, *vb = NULL;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk, wrong ? &kb : NULL);
    make_cache(ctx, Nkv, Dh, &vc, &dv, wrong ? &vb : NULL);
    size_t nq = (size_t)n * qd;
    float *q = malloc(nq * 4), *gate = malloc(nq * 4), *ref = malloc(nq * 4);
    pt_fill(q, nq, 1.5f);
    pt_fill(gate, nq, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    float *scr = malloc((size_t)(Nq / Nkv) * ctx * 4); /* [rep][ctx]: one thread */
    lily_cpu_attention(q, n, pos0, kc, vc, Nq, Nkv, Dh, scale, ref, scr, NULL);
    if (gated)
        for (size_t i = 0; i < nq; i++) ref[i] *= sig(gate[i]);
    float *dq = pt_dup(q, nq), *dg = pt_dup(gate, nq), *dout = pt_dalloc(nq * 4);
    int32_t *dp = dev_pos(pos0);
    float *got = malloc(nq * 4);
    int rc = lily_cuda_attn_prefill(dq, n, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL,
                                    dout, NULL, &e);
    if (pt_ok(rc, "prefill launch", &e)) {
        pt_get(got, dout, nq);
        snprintf(name, sizeof name, "attn prefill Nq=%d Nkv=%d Dh=%d pos0=%d n=%d%s", Nq, Nkv, Dh,
                 pos0, n, gated ? " gated" : "");
        pt_check(name, got, ref, nq, TOL_PREFILL);
        if (wrong) {
            lily_cpu_attention(q, n, pos0, kb, vb, Nq, Nkv, Dh, scale, ref, scr, NULL);
            if (gated)
                for (size_t i = 0; i < nq; i++) ref[i] *= sig(gate[i]);
            check_tells_apart(name, got, ref, nq, TOL_PREFILL);
        }
    }
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dp);
    free(kc), free(vc), free(kb), free(vb), free(q), free(gate), free(ref), free(scr), free(got);
}

static void prefill_case(int Nq, int Nkv, int Dh, int pos0, int n, int gated) {
    prefill_run(Nq, Nkv, Dh, pos0, n, gated, 0);
}

/* Spacing of fp16 values at |x| (2^-24 in the subnormal range). */
static double f16_ulp(float x) {
    if (x == 0.f) return ldexp(1.0, -24);
    int ex;
    frexpf(fabsf(x), &ex); /* |x| = m 2^ex, m in [0.5, 1) */
    return ldexp(1.0, (ex - 1 < -14 ? -14 : ex - 1) - 10);
}

/* Rows of the GPU cache (positions pos0.., all heads) against fp32 reference rows ref [n][Nkv*Dh]
 * (already saturated to +-65504). exact: every element must be the host's rounding of ref, bit for
 * bit (V, copied as is). Otherwise (K, after norm and RoPE, whose fp32 results differ from the
 * CPU's in the last bits) an element may land on the other fp16 neighbour only where ref is
 * within 1e-5 times the row's max of a rounding tie, and at least 99 % must match bit for bit.
 * Unwritten elements read as NaN (pt_dalloc's poison) and fail. */
static void check_rows(const char *what, const void *dcache, int pos0, int n, int Nkv, int Dh,
                       const float *ref, int exact) {
    lily_err e;
    size_t w = (size_t)Nkv * Dh, cnt = (size_t)n * w;
    uint16_t *b = malloc(cnt * 2);
    float *dec = malloc(cnt * 4);
    lily_cuda_d2h(b, (const uint8_t *)dcache + lily_cuda_kv_prefix_bytes(pos0, Nkv, Dh), cnt * 2,
                  &e);
    size_t same = 0, bad = 0;
    for (size_t r0 = 0; r0 < cnt; r0 += Dh) { /* one head's row */
        float mx = 0.f;
        for (int d = 0; d < Dh; d++) mx = fmaxf(mx, fabsf(ref[r0 + d]));
        for (int d = 0; d < Dh; d++) {
            size_t i = r0 + d;
            dec[i] = lily_f16_to_f32(b[i]);
            if (b[i] == kv_f16(ref[i])) {
                same++;
                continue;
            }
            double err = fabs((double)dec[i] - ref[i]);
            if (exact || !(err <= 0.5 * f16_ulp(ref[i]) + 1e-5 * mx)) bad++; /* NaN: bad */
        }
    }
    char name[240];
    snprintf(name, sizeof name, "%s: fp16 rows (%zu of %zu as the host rounds, %zu bad)", what,
             same, cnt, bad);
    pt_check_true(name, bad == 0 && (exact ? same == cnt : same >= cnt - cnt / 100));
    if (!exact) { /* (V's rows hold saturated values that would swamp the RMS) */
        snprintf(name, sizeof name, "%s: fp16 rows, relative error of the rounding", what);
        pt_check(name, dec, ref, cnt, 5e-4); /* fp16: <= 2^-11 per element, ~2e-4 RMS */
    }
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
    /* V of token 0, head 0: values past fp16's range (saturate), its largest finite value and
     * the ties around it, subnormals */
    static const float odd[] = {1e5f, -7e4f, 65519.f, 65520.f, -65504.f, 3e-8f, -1e-6f, 6e-5f};
    const int nodd = (int)(sizeof odd / sizeof odd[0]);
    for (int i = 0; i < nodd; i++) v[3 + i] = odd[i];
    for (int i = 0; i < Dh; i++) qn[i] = 1 + 0.3f * pt_frand(), kn[i] = 1 + 0.3f * pt_frand();
    float *inv = malloc((R / 2 + 1) * 4);
    for (int i = 0; i < R / 2; i++) inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)R);
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
    for (size_t i = 0; i < nk; i++) /* what the cache should hold: saturated */
        if (fabsf(rv[i]) > 65504.f) rv[i] = copysignf(65504.f, rv[i]);
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
    check_rows(name, dkc, pos0, n, Nkv, Dh, rk, 0);
    snprintf(name, sizeof name, "attn prep v cache Nkv=%d Dh=%d pos0=%d n=%d", Nkv, Dh, pos0, n);
    check_rows(name, dvc, pos0, n, Nkv, Dh, rv, 1);
    /* the odd values by name (check_rows compares against the same host conversion) */
    static const uint16_t want[] = {0x7bffu, 0xfbffu, 0x7bffu, 0x7bffu, 0xfbffu, 0x0001u, 0x8011u,
                                    0x03efu};
    uint16_t got[sizeof odd / sizeof odd[0]];
    lily_cuda_d2h(got, (const uint16_t *)dvc + (size_t)pos0 * kvw + 3, sizeof got, &e);
    int okb = 1;
    for (int i = 0; i < nodd; i++) okb &= got[i] == want[i];
    snprintf(name, sizeof name, "attn prep v cache pos0=%d: saturation to +-65504, subnormals",
             pos0);
    pt_check_true(name, okb);
    lily_cuda_free(dqg), lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dqn);
    lily_cuda_free(dkn), lily_cuda_free(dinv), lily_cuda_free(dq), lily_cuda_free(dgt);
    lily_cuda_free(dkc), lily_cuda_free(dvc), lily_cuda_free(dp);
    free(qg), free(k), free(v), free(qn), free(kn), free(inv), free(rq), free(rg), free(rk);
    free(rv), free(gq), free(gg);
}

/* ---- timing mode (LILY_CUDA_TIME=1) ---- */

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    float *q, *gate, *scr, *out;
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
                                  c->out, (lily_cuda_stream)c->st, &e);
}

/* Ten decode calls captured as one CUDA graph on c->st (re-captured per call, so the split
 * target of the environment applies), then replayed: the launches of a decode step. */
static int t_graph10(const tctx *c) {
    static cudaGraphExec_t ex;
    static const tctx *last;
    static char env[32];
    static unsigned gen; /* a reloaded tuning (lily_cuda_tune_reload) recaptures */
    const char *w = getenv("LILY_CUDA_ATTN_SPLITS");
    if (c != last || strcmp(env, w ? w : "") != 0 || !ex || gen != lily_cuda_tune_get()->gen) {
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
        gen = lily_cuda_tune_get()->gen;
        snprintf(env, sizeof env, "%s", w ? w : "");
    }
    return cudaGraphLaunch(ex, c->st) != cudaSuccess;
}

/* Median of 20 cudaEvent-timed calls (after 3 warm-ups), in microseconds; -1 on failure. */
static float time_median(int (*f)(const tctx *), const tctx *c) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float ms[20];
    for (int i = 0; i < 3; i++)
        if (f(c)) return -1;
    for (int i = 0; i < 20; i++) {
        cudaEventRecord(a, c->st);
        f(c);
        cudaEventRecord(b, c->st);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms[i], a, b);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    qsort(ms, 20, sizeof ms[0], cmp_f);
    return 1000.f * (ms[9] + ms[10]) / 2;
}

static void time_all(void) {
    const int maxc = 131072, w = 2 * 256, n = 512;
    lily_err e;
    const size_t cb = lily_cuda_kv_bytes(maxc, 2, 256);
    uint16_t *h = malloc(cb);
    tctx c = {0};
    c.k = pt_dalloc(cb);
    c.v = pt_dalloc(cb);
    for (int kv = 0; kv < 2; kv++) {
        for (size_t i = 0; i < (size_t)maxc * w; i++) h[i] = kv_f16(pt_frand() * 2.0f);
        lily_cuda_h2d(kv ? c.v : c.k, h, cb, &e);
    }
    free(h);
    float *hq = malloc((size_t)n * 16 * 256 * 4);
    pt_fill(hq, (size_t)n * 16 * 256, 1.5f);
    c.q = pt_dup(hq, (size_t)n * 16 * 256);
    pt_fill(hq, (size_t)n * 16 * 256, 3.0f);
    c.gate = pt_dup(hq, (size_t)n * 16 * 256);
    free(hq);
    c.out = pt_dalloc((size_t)n * 16 * 256 * 4);
    c.scr = pt_dalloc(lily_cuda_attn_decode_scratch(16, 256, 128) * 4);
    c.pos = dev_pos(0);
    cudaStreamCreate(&c.st);
    static const int ctxs[] = {4096, 32768, 65536, 131072};
    static const char *wants[] = {"8", "16", "33", "66", "128"};
    for (int i = 0; i < 4; i++) {
        int p = ctxs[i] - 1;
        lily_cuda_h2d(c.pos, &p, 4, &e);
        double gb = (double)lily_cuda_kv_bytes(ctxs[i], 2, 256) * 2 / 1e9; /* K and V */
        float t1 = time_median(t_decode, &c), t10 = time_median(t_graph10, &c) / 10;
        printf("time decode ctx=%-6d %8.1f us (%6.0f GB/s)  in a graph of 10: %8.1f us per call "
               "(%6.0f GB/s)\n",
               ctxs[i], t1, gb / t1 * 1e6, t10, gb / t10 * 1e6);
        for (int k = 0; k < 5; k++) {
            setenv("LILY_CUDA_ATTN_SPLITS", wants[k], 1);
            float t = time_median(t_graph10, &c) / 10;
            printf("time decode ctx=%-6d want=%-4s in a graph of 10: %8.1f us per call (%6.0f "
                   "GB/s)\n",
                   ctxs[i], wants[k], t, gb / t * 1e6);
        }
        unsetenv("LILY_CUDA_ATTN_SPLITS");
    }
    int p0 = maxc - n;
    lily_cuda_h2d(c.pos, &p0, 4, &e);
    c.n = n;
    double fl = 0; /* q.k and p.v multiply-adds of the causal chunk, 16 heads */
    for (int i = 0; i < n; i++) fl += 2.0 * 2 * 256 * 16 * (p0 + i + 1);
    float t = time_median(t_prefill, &c);
    printf("time prefill n=%d pos0=%d %10.1f us (%.1f TFLOP/s)\n", n, p0, t, fl / t / 1e6);
    lily_cuda_free(c.k), lily_cuda_free(c.v), lily_cuda_free(c.q), lily_cuda_free(c.gate);
    lily_cuda_free(c.out), lily_cuda_free(c.scr), lily_cuda_free(c.pos);
    cudaStreamDestroy(c.st);
}

int main(void) {
    pt_need_gpu();
    /* LILY_CUDA_SAN=1: only the cases small enough for compute-sanitizer's racecheck (every
     * kernel and split path still runs; the 40K-131K contexts and deep prefills are left out) */
    const int san = getenv("LILY_CUDA_SAN") && getenv("LILY_CUDA_SAN")[0] == '1';
    check_host_f16();
    prep_case(16, 2, 256, 64, 0, 1, 1);
    prep_case(16, 2, 256, 64, 131000, 3, 1);
    prep_case(4, 4, 64, 16, 7, 29, 0);
    decode_case(16, 2, 256, 1, 128, 1);
    decode_case(16, 2, 256, 7, 128, 1);
    decode_case(16, 2, 256, 17, 128, 1);
    decode_run(16, 2, 256, 1000, 128, 1, 1);
    decode_case(16, 2, 256, 4097, 128, 0);
    if (!san) decode_case(16, 2, 256, 40000, 128, 1);
    if (!san) decode_case(16, 2, 256, 131073, 128, 1);
    /* every split count the grid can have, at an odd length */
    static const int splits[] = {1, 2, 3, 5, 8, 13, 31, 32, 33, 64, 100, 127, 128};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
        decode_case(16, 2, 256, 2049 + 2 * (int)i, splits[i], (int)i & 1);
    /* forced split targets (more than the grid, one, odd) */
    static const char *wants[] = {"1", "7", "129", "500"};
    for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++) {
        setenv("LILY_CUDA_ATTN_SPLITS", wants[i], 1);
        decode_case(16, 2, 256, 9999, 128, 1);
    }
    unsetenv("LILY_CUDA_ATTN_SPLITS");
    decode_case(8, 2, 128, 300, 3, 1);
    decode_case(4, 2, 128, 5000, 40, 0);
    decode_run(4, 4, 64, 33, 1, 0, 1);
    decode_case(16, 1, 64, 95, 5, 1);
    decode_case(16, 1, 256, 3333, 128, 1);
    decode_case(32, 2, 128, 777, 9, 1);
    decode_case(8, 1, 64, 6001, 64, 1);
    decode_case(2, 2, 128, 12345, 100, 0);
    prefill_case(16, 2, 256, 0, 1, 1);
    prefill_case(16, 2, 256, 0, 77, 1);
    if (!san) prefill_case(16, 2, 256, 3000, 512, 1);
    prefill_run(8, 2, 128, 0, 33, 0, 1);
    prefill_run(4, 4, 64, 5, 100, 1, 1);
    prefill_case(2, 1, 256, 17, 9, 0);
    if (!san) prefill_case(16, 2, 256, 20011, 37, 1);
    prefill_case(16, 2, 256, 31, 1, 1);
    if (!san) prefill_run(16, 2, 256, 3000, 129, 1, 1);
    prefill_case(16, 1, 128, 100, 200, 0);
    prefill_case(4, 4, 128, 1000, 300, 1); /* G 1: 64 positions per block, 5 blocks */
    prefill_case(16, 1, 64, 7, 50, 1);
    prefill_case(8, 1, 256, 4000, 70, 0);
    if (!san) prefill_case(16, 2, 256, 0, 2048, 1); /* many tiles under the causal mask */
    lily_err e;
    pt_check_true("attention rejects Dh=96", lily_cuda_attn_prefill(NULL, 1, NULL, NULL, NULL, 2,
                                                                    1, 96, 1, NULL, NULL, NULL,
                                                                    &e) == -1);
    if (getenv("LILY_CUDA_TIME") && getenv("LILY_CUDA_TIME")[0] == '1') time_all();
    return pt_finish();
}
#endif
