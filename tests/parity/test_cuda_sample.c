/* Device sampling (src/backend/cuda/sample.h) against a plain host reference of its chain.
 *
 * The reference (ref_set below) sorts the usable logits in the total order and applies top-k,
 * the weights, min-p and top-p exactly as sample.h documents them; it is first checked against
 * the CPU sampler itself (every token sampler.c draws lies in the reference's set, and greedy is
 * its first element), on the host, before the GPU is asked for. On the GPU, for vocabularies of
 * 1 to 248320 logits with NaN, -inf, excluded padding ids and a banned id mixed in, every
 * setting's draws must lie in the reference set; tie-cut boundaries must keep exactly the
 * reference's ids; the draws' histogram must match the reference probabilities (chi-square);
 * the same (seed, step) must draw the same token; nothing drawable must give -1; and a captured
 * graph must draw afresh on every replay; and the GPU must draw what lily_draw_pick (the CPU
 * backend's draw, cpu/draw.h) draws at the same step, token for token (their expf may round a
 * weight differently at a boundary: at most 1 draw in 200 may differ). lily_draw_pick itself is
 * checked on the host against the reference set and its probabilities. A grammar's mask
 * (lily_draw.allow, lily_cuda_sampling.mask): the same checks with the masked ids out of the
 * reference set, lily_draw_pick's masked draw equal to its draw from the logits with those ids at
 * -inf, and an empty mask giving -1, on the host and the GPU. The host checks run in every build (a CPU-only build
 * then skips the GPU part with 77, unless they fail). LILY_CUDA_TIME=1 times one call at 248320
 * logits; LILY_CUDA_SAN=1 (compute-sanitizer) stops the vocabularies at 4099 and draws 10x fewer,
 * LILY_CUDA_SAN=2 (racecheck, ~100x slower a launch) draws 4 tokens a setting, no chi-square.
 */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "backend/draw.h"
#include "backend/draw_rng.h"
#include "backend/cuda/sample.h"
#include "parity_util.h"
#include "sampler/sampler.h"

typedef struct {
    float x;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b) { /* larger logit first, then lower id */
    const cand *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return p->id < q->id ? -1 : p->id > q->id;
}

/* id i is outside c's mask (a grammar's allowed ids) */
static int masked_out(const lily_cuda_sampling *c, int i) {
    return c->mask && (i >= c->n_allow || !(c->mask[i >> 5] >> (i & 31) & 1));
}

/* The drawable ids in the total order and their probabilities; returns how many. */
static int ref_set(const float *l, int V, const lily_cuda_sampling *c, int32_t *ids, double *p) {
    cand *cs = malloc((size_t)V * sizeof *cs);
    float *w = malloc((size_t)V * sizeof *w);
    int n = 0;
    for (int i = 0; i < V; i++) {
        float x = l[i];
        if (isnan(x) || x == -INFINITY) continue;
        if (x == INFINITY) x = FLT_MAX;
        if ((c->n_ids > 0 && i >= c->n_ids) || i == c->ban_id || masked_out(c, i)) continue;
        cs[n++] = (cand){x, i};
    }
    qsort(cs, (size_t)n, sizeof *cs, cand_cmp);
    int m = 0;
    if (n > 0 && !(c->temperature > 0.0f)) {
        ids[0] = cs[0].id, p[0] = 1.0, m = 1;
    } else if (n > 0) {
        const int nk = c->top_k > 0 && c->top_k < n ? c->top_k : n;
        const float maxl = cs[0].x, inv_t = (float)(1.0 / (double)c->temperature);
        uint64_t total = 0;
        for (int i = 0; i < nk; i++) {
            w[i] = expf(cs[i].x == maxl ? 0.0f : (cs[i].x - maxl) * inv_t);
            total += (uint64_t)((double)w[i] * 1099511627776.0);
        }
        int keep = nk; /* min-p, then the top-p prefix of what is left */
        const int top_p = c->top_p > 0.0f && c->top_p < 1.0f;
        const uint64_t target = (uint64_t)ceil((double)c->top_p * (double)total);
        uint64_t acc = 0;
        int kept = 0;
        for (int i = 0; i < keep; i++) {
            if (c->min_p > 0.0f && !((double)w[i] >= (double)c->min_p || cs[i].x == maxl)) continue;
            if (w[i] > 0.0f) {
                ids[kept] = cs[i].id;
                p[kept++] = w[i];
            }
            acc += (uint64_t)((double)w[i] * 1099511627776.0);
            if (top_p && acc >= target) break;
        }
        double s = 0;
        for (int i = 0; i < kept; i++)
            s += p[i];
        for (int i = 0; i < kept; i++)
            p[i] /= s;
        m = kept;
    }
    free(cs);
    free(w);
    return m;
}

static int in_set(const int32_t *ids, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

/* random logits: N(0, scale) with NaN / -inf / +inf at the given rates (per mille) */
static void make_logits(float *l, int V, float scale, int nan_pm, int ninf_pm, int inf_pm) {
    for (int i = 0; i < V; i++) {
        float u1 = 0.5f * (pt_frand() + 1.0f) + 1e-7f, u2 = pt_frand();
        l[i] = scale * sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
        int r = (int)(pt_rnd() % 1000);
        if (r < nan_pm)
            l[i] = NAN;
        else if (r < nan_pm + ninf_pm)
            l[i] = -INFINITY;
        else if (r < nan_pm + ninf_pm + inf_pm)
            l[i] = INFINITY;
    }
}

static const lily_cuda_sampling k_cfgs[] = {
    /* T, top_k, top_p, min_p, n_ids, ban, seed (n_ids / ban filled per vocabulary) */
    {0.0f, 0, 1.0f, 0.0f, 0, -1, 1, NULL, 0},   {1.0f, 0, 1.0f, 0.0f, 0, -1, 2, NULL, 0},
    {0.7f, 0, 0.8f, 0.0f, 0, -1, 3, NULL, 0},   {0.6f, 20, 0.95f, 0.0f, 0, -1, 4, NULL, 0},
    {1.0f, 0, 1.0f, 0.05f, 0, -1, 5, NULL, 0},  {1.3f, 50, 1.0f, 0.0f, 0, -1, 6, NULL, 0},
    {0.8f, 40, 0.9f, 0.02f, 0, -1, 7, NULL, 0}, {1.0f, 0, 1.0f, 1.5f, 0, -1, 8, NULL, 0},
    {1.0f, 1, 1.0f, 0.0f, 0, -1, 9, NULL, 0},   {2.0f, 0, 0.3f, 0.0f, 0, -1, 10, NULL, 0},
    {0.2f, 7, 0.5f, 0.3f, 0, -1, 11, NULL, 0},
};
enum { NCFG = sizeof k_cfgs / sizeof k_cfgs[0] };

static void cfg_str(const lily_cuda_sampling *c, char *b, size_t n) {
    snprintf(b, n, "T=%g top_k=%d top_p=%g min_p=%g n_ids=%d ban=%d", (double)c->temperature,
             c->top_k, (double)c->top_p, (double)c->min_p, c->n_ids, c->ban_id);
}

/* ---- host: the reference against the CPU sampler and the CPU draw ---------------------------- */

static lily_draw as_draw(const lily_cuda_sampling *c, uint64_t step) {
    return (lily_draw){.temperature = c->temperature,
                       .top_k = c->top_k,
                       .top_p = c->top_p,
                       .min_p = c->min_p,
                       .n_ids = c->n_ids,
                       .ban_id = c->ban_id,
                       .seed = c->seed,
                       .step = step,
                       .allow = c->mask, /* a host pointer in the host checks */
                       .n_allow = c->n_allow};
}

/* The race of sample.h over the reference set, plainly: every survivor's Gumbel computed */
static int32_t full_race(const float *l, int V, const lily_cuda_sampling *c, uint64_t step,
                         const int32_t *ids, int m) {
    if (m == 0) return -1;
    if (!(c->temperature > 0.0f)) return ids[0];
    float maxl = -INFINITY;
    for (int i = 0; i < V; i++) {
        float x = l[i] == INFINITY ? FLT_MAX : l[i];
        if (!isnan(x) && (c->n_ids <= 0 || i < c->n_ids) && i != c->ban_id && !masked_out(c, i) &&
            x > maxl)
            maxl = x;
    }
    const float inv_t = (float)(1.0 / (double)c->temperature);
    uint64_t best = 0;
    for (int j = 0; j < m; j++) {
        const int32_t i = ids[j];
        const float x = l[i] == INFINITY ? FLT_MAX : l[i];
        const float lw = x == maxl ? 0.0f : (x - maxl) * inv_t;
        const float v = lw + (float)-log(-log(lily_draw_uniform(c->seed, step, i)));
        uint32_t u;
        memcpy(&u, &v, 4);
        u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
        const uint64_t k = ((uint64_t)u << 32) | (0xffffffffu - (uint32_t)i);
        best = k > best ? k : best;
    }
    return (int32_t)(0xffffffffu - (uint32_t)best);
}

/* lily_draw_pick (the CPU backend's draw, the device's reference) at steps 0..n-1: every token in
 * the reference set and the one full_race draws (lily_draw_pick skips the Gumbel of candidates
 * that cannot win), the histogram against its probabilities when chi, the same step the same
 * token */
static void cpu_draws_in_set(const float *l, int V, const lily_cuda_sampling *c, int n,
                             const char *what, int chi) {
    int32_t *ids = malloc((size_t)V * sizeof *ids);
    double *p = malloc((size_t)V * sizeof *p);
    lily_draw_cand *keys = malloc((size_t)V * sizeof *keys);
    int m = ref_set(l, V, c, ids, p);
    int *cnt = calloc((size_t)(m > 0 ? m : 1), sizeof *cnt);
    int ok = m > 0, same = 1, n_race = 0;
    for (int i = 0; i < n && ok; i++) {
        lily_draw d = as_draw(c, (uint64_t)i);
        const int32_t t = lily_draw_pick(l, V, &d, keys);
        n_race += t == full_race(l, V, c, (uint64_t)i, ids, m);
        int j = 0;
        while (j < m && ids[j] != t)
            j++;
        if (j == m)
            ok = 0;
        else
            cnt[j]++;
        if (i < 8) same = same && lily_draw_pick(l, V, &d, keys) == t;
    }
    char b[160], w[400];
    cfg_str(c, b, sizeof b);
    snprintf(w, sizeof w,
             "cpu draw %s V=%d %s: %d draws in the reference set of %d, repeatable, "
             "%d = the full race",
             what, V, b, n, m, n_race);
    pt_check_true(w, ok && same && n_race == n);
    if (chi && ok && m > 1) {
        double x2 = 0;
        int df = 0;
        for (int j = 0; j < m; j++) {
            double ex = n * p[j];
            if (ex < 5) continue;
            x2 += (cnt[j] - ex) * (cnt[j] - ex) / ex, df++;
        }
        df = df > 1 ? df - 1 : 1;
        double lim = df + 6.0 * sqrt(2.0 * df);
        snprintf(w, sizeof w, "cpu draw %s V=%d %s: chi-square %.1f over %d dof (limit %.1f)", what,
                 V, b, x2, df, lim);
        pt_check_true(w, x2 < lim);
    }
    free(ids), free(p), free(keys), free(cnt);
}

/* a random mask over n ids, about pm permille of them allowed (never none) */
static void make_mask(uint32_t *m, int n, int pm) {
    memset(m, 0, ((size_t)n + 31) / 32 * 4);
    for (int i = 0; i < n; i++)
        if ((int)(pt_rnd() % 1000) < pm) m[i >> 5] |= 1u << (i & 31);
    m[(n - 1) >> 5] |= 1u << ((n - 1) & 31);
}

/* A grammar's mask in lily_draw_pick: every setting's draws lie in the masked reference set,
 * and each draw is the one lily_draw_pick makes from the logits with the masked ids at -inf
 * (the host sampler's way, gen.c), at every step; a mask that leaves nothing drawable gives -1. */
static void check_cpu_mask(float *l) {
    static const int Vs[] = {7, 1000, 5003};
    lily_draw_cand *keys = malloc(5003 * sizeof *keys);
    float *inf = malloc(5003 * sizeof *inf);
    uint32_t mask[(5003 + 31) / 32];
    for (int v = 0; v < 3; v++) {
        const int V = Vs[v], na = V > 7 ? V - 5 : V; /* ids >= n_allow masked too */
        make_logits(l, V, 3.0f, V > 7 ? 2 : 0, V > 7 ? 2 : 0, 0);
        make_mask(mask, na, v == 2 ? 30 : 500);
        for (int i = 0; i < V; i++)
            inf[i] = i < na && (mask[i >> 5] >> (i & 31) & 1) ? l[i] : -INFINITY;
        for (int k = 0; k < NCFG; k++) {
            lily_cuda_sampling c = k_cfgs[k];
            c.ban_id = k == 3 ? 3 : -1;
            c.mask = mask, c.n_allow = na;
            cpu_draws_in_set(l, V, &c, 100, "masked", 0);
            lily_cuda_sampling u = c;
            u.mask = NULL, u.n_allow = 0;
            int same = 1;
            for (int st = 0; st < 100; st++) {
                lily_draw dm = as_draw(&c, (uint64_t)st), du = as_draw(&u, (uint64_t)st);
                same = same && lily_draw_pick(l, V, &dm, keys) == lily_draw_pick(inf, V, &du, keys);
            }
            char b[160], w[300];
            cfg_str(&c, b, sizeof b);
            snprintf(w, sizeof w, "cpu draw V=%d %s: masked = the masked ids at -inf, 100 steps", V,
                     b);
            pt_check_true(w, same);
        }
    }
    memset(mask, 0, sizeof mask);
    lily_draw d = {.temperature = 1.0f, .top_p = 1.0f, .ban_id = -1, .allow = mask, .n_allow = 7};
    pt_check_true("cpu draw: an empty mask gives -1", lily_draw_pick(l, 7, &d, keys) == -1);
    free(keys), free(inf);
}

static void check_cpu_draw(void) {
    const int V = 5003;
    float *l = malloc(V * sizeof *l);
    make_logits(l, V, 3.0f, 2, 2, 0);
    for (int k = 0; k < NCFG; k++) {
        lily_cuda_sampling c = k_cfgs[k];
        c.ban_id = k == 3 ? 17 : -1, c.n_ids = k == 4 ? V - 2 : 0;
        cpu_draws_in_set(l, V, &c, 300, "draws", 0);
    }
    { /* the whole vocabulary in the race */
        const int VL = 248320;
        float *ll = malloc((size_t)VL * sizeof *ll);
        make_logits(ll, VL, 4.0f, 1, 1, 0);
        lily_cuda_sampling cl = {1.0f, 0, 1.0f, 0.0f, VL - 3, 17, 41, NULL, 0};
        cpu_draws_in_set(ll, VL, &cl, 20, "draws", 0);
        cl.temperature = 0.8f, cl.top_p = 0.95f;
        cpu_draws_in_set(ll, VL, &cl, 20, "draws", 0);
        free(ll);
    }
    make_logits(l, 1000, 1.5f, 0, 0, 0);
    lily_cuda_sampling c1 = {1.0f, 30, 1.0f, 0.0f, 0, -1, 42, NULL, 0};
    cpu_draws_in_set(l, 1000, &c1, 8000, "distribution", 1);
    lily_cuda_sampling c2 = {0.7f, 0, 0.6f, 0.0f, 0, -1, 43, NULL, 0};
    cpu_draws_in_set(l, 1000, &c2, 8000, "distribution", 1);
    lily_cuda_sampling c3 = {1.5f, 0, 1.0f, 0.1f, 0, 5, 44, NULL, 0};
    cpu_draws_in_set(l, 1000, &c3, 8000, "distribution", 1);
    const float a[7] = {2, 2, 2, 1, 1, 0, -1};
    lily_cuda_sampling ck = {1.0f, 2, 1.0f, 0.0f, 0, -1, 50, NULL, 0}; /* top-k 2 of three equal */
    cpu_draws_in_set(a, 7, &ck, 400, "tied top-k", 1);
    float b[10];
    for (int i = 0; i < 10; i++)
        b[i] = 0.5f;
    lily_cuda_sampling cp = {1.0f, 0, 0.35f, 0.0f, 0, -1, 51, NULL, 0}; /* top-p: 4 of 10 equal */
    cpu_draws_in_set(b, 10, &cp, 800, "tied top-p", 1);
    lily_cuda_sampling ci = {1.0f, 0,  1.0f, 0.0f, 0,
                             -1,   52, NULL, 0}; /* +inf: only the infinities */
    float f[9] = {1, INFINITY, 3, NAN, INFINITY, -INFINITY, 2, 0, 5};
    cpu_draws_in_set(f, 9, &ci, 400, "+inf logits", 1);
    /* nothing drawable: -1 */
    float z[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    lily_draw_cand keys[5];
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        lily_draw d = as_draw(&k_cfgs[k], 0);
        ok = ok && lily_draw_pick(z, 5, &d, keys) == -1;
    }
    lily_draw d1 = {.temperature = 1.0f, .top_p = 1.0f, .ban_id = 0, .seed = 1};
    ok = ok && lily_draw_pick(b, 1, &d1, keys) == -1;
    pt_check_true("cpu draw: all NaN / -inf, or the only id banned: -1", ok);
    check_cpu_mask(l);
    free(l);
}

static void check_reference(void) {
    const int V = 5003;
    float *l = malloc(V * sizeof *l);
    int32_t *ids = malloc(V * sizeof *ids);
    double *p = malloc(V * sizeof *p);
    make_logits(l, V, 3.0f, 2, 2, 0);
    for (int k = 0; k < NCFG; k++) {
        lily_cuda_sampling c = k_cfgs[k];
        int m = ref_set(l, V, &c, ids, p);
        lily_sampler_params sp = lily_sampler_params_default();
        sp.temperature = c.temperature, sp.top_k = c.top_k, sp.top_p = c.top_p;
        sp.min_p = c.min_p, sp.seed = 77 + (uint64_t)k;
        lily_sampler *s;
        lily_err e;
        int ok = m > 0 && lily_sampler_create(&sp, V, &s, &e) == 0;
        for (int d = 0; ok && d < 300; d++)
            ok = in_set(ids, m, lily_sampler_sample(s, l, NULL, 0, (uint64_t)d, &e));
        if (m > 0 && !(c.temperature > 0.0f))
            ok = ok && lily_sampler_sample(s, l, NULL, 0, 0, &e) == ids[0];
        if (m > 0) lily_sampler_free(s);
        char b[160], w[256];
        cfg_str(&c, b, sizeof b);
        snprintf(w, sizeof w, "reference set (%d ids) holds 300 CPU sampler draws: %s", m, b);
        pt_check_true(w, ok);
    }
    free(l), free(ids), free(p);
}

/* ---- device ---------------------------------------------------------------------------------- */
#ifdef LILY_HAVE_CUDA

typedef struct {
    float *l;
    int V;
    lily_cuda_sampling *cfg;
    uint64_t *step;
    void *scr;
    int32_t *out;
    uint32_t *mask; /* [248320 / 32] device words for a cfg's mask */
    cudaStream_t st;
} dev;

static int draw(dev *d, int32_t *tok) {
    lily_err e;
    if (lily_cuda_sample(d->l, d->V, d->cfg, d->step, d->scr, d->out, d->st, &e)) {
        printf("FAIL sample: %s\n", e.msg);
        return -1;
    }
    if (cudaStreamSynchronize(d->st) != cudaSuccess ||
        cudaMemcpy(tok, d->out, 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("FAIL sample: %s\n", cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    return 0;
}
/* c's mask, when it has one, is a host pointer: uploaded, the device's cfg points at the copy */
static void set_cfg(dev *d, const lily_cuda_sampling *c) {
    lily_cuda_sampling dc = *c;
    if (c->mask) {
        cudaMemcpy(d->mask, c->mask, ((size_t)c->n_allow + 31) / 32 * 4, cudaMemcpyHostToDevice);
        dc.mask = d->mask;
    }
    cudaMemcpy(d->cfg, &dc, sizeof dc, cudaMemcpyHostToDevice);
}
static void set_step(dev *d, uint64_t s) {
    cudaMemcpy(d->step, &s, 8, cudaMemcpyHostToDevice);
}
static void set_logits(dev *d, const float *l, int V) {
    d->V = V;
    cudaMemcpy(d->l, l, (size_t)V * 4, cudaMemcpyHostToDevice);
}

/* draws n tokens; all must be in the reference set; returns the histogram over the set */
static int g_san; /* LILY_CUDA_SAN: 1 smaller shapes, 2 (racecheck) a few draws each */

static void draws_in_set(dev *d, const float *l, const lily_cuda_sampling *c, int n,
                         const char *what, int chi) {
    if (g_san >= 2) n = n < 4 ? n : 4, chi = 0; /* every path, not the statistics */
    int32_t *ids = malloc((size_t)d->V * sizeof *ids);
    double *p = malloc((size_t)d->V * sizeof *p);
    int m = ref_set(l, d->V, c, ids, p);
    int *cnt = calloc((size_t)(m > 0 ? m : 1), sizeof *cnt);
    set_cfg(d, c);
    int ok = m > 0, bad_tok = 0, n_same = 0, n_cmp = 0;
    lily_draw_cand *keys = malloc((size_t)d->V * sizeof *keys);
    for (int i = 0; i < n && ok; i++) {
        int32_t t;
        uint64_t step = 0;
        cudaMemcpy(&step, d->step, 8, cudaMemcpyDeviceToHost);
        if (draw(d, &t)) ok = 0;
        if (ok) { /* the CPU backend's draw at the same step */
            lily_draw cd = as_draw(c, step);
            n_same += lily_draw_pick(l, d->V, &cd, keys) == t, n_cmp++;
        }
        int j = 0;
        while (ok && j < m && ids[j] != t)
            j++;
        if (ok && j == m)
            ok = 0, bad_tok = t;
        else if (ok)
            cnt[j]++;
    }
    char b[160], w[400];
    cfg_str(c, b, sizeof b);
    snprintf(w, sizeof w, "%s V=%d %s: %d draws in the reference set of %d%s", what, d->V, b, n, m,
             ok ? "" : " (a token outside it)");
    if (!ok) printf("     first token outside: %d\n", bad_tok);
    pt_check_true(w, ok);
    snprintf(w, sizeof w, "%s V=%d %s: lily_draw_pick draws the same token in %d of %d", what, d->V,
             b, n_same, n_cmp);
    pt_check_true(w, ok && n_same * 200 >= n_cmp * 199);
    free(keys);
    if (chi && ok && m > 1) { /* the draws against the reference probabilities */
        double x2 = 0;
        int df = 0;
        for (int j = 0; j < m; j++) {
            double ex = n * p[j];
            if (ex < 5) continue; /* pooled out: too rare to test */
            x2 += (cnt[j] - ex) * (cnt[j] - ex) / ex, df++;
        }
        df = df > 1 ? df - 1 : 1;
        double lim = df + 6.0 * sqrt(2.0 * df);
        snprintf(w, sizeof w, "%s V=%d %s: chi-square %.1f over %d dof (limit %.1f)", what, d->V, b,
                 x2, df, lim);
        pt_check_true(w, x2 < lim);
    }
    free(ids), free(p), free(cnt);
}

static int t_call(void *ctx) {
    dev *d = ctx;
    lily_err e;
    return lily_cuda_sample(d->l, d->V, d->cfg, d->step, d->scr, d->out, d->st, &e);
}

#endif

int main(void) {
    check_reference();
    check_cpu_draw();
    if (pt_fail) return pt_finish(); /* the reference itself is wrong: fail without a GPU too */
#ifndef LILY_HAVE_CUDA
    printf("skipped: built without CUDA (the host reference checks passed)\n");
    return 77;
#else
    pt_need_gpu();
    const int Vmax = 248320;
    dev d = {0};
    float *l = malloc((size_t)Vmax * sizeof *l);
    d.l = pt_dalloc((size_t)Vmax * 4);
    d.cfg = pt_dalloc(sizeof(lily_cuda_sampling));
    d.step = pt_dalloc(8);
    d.scr = pt_dalloc(lily_cuda_sample_scratch_bytes());
    d.out = pt_dalloc(4);
    d.mask = pt_dalloc((248320 + 31) / 32 * 4);
    cudaStreamCreate(&d.st);
    set_step(&d, 0);

    /* every setting at several vocabularies: draws inside the reference set */
    static const int Vs[] = {1, 7, 1000, 4099, 248320};
    g_san = getenv("LILY_CUDA_SAN") ? atoi(getenv("LILY_CUDA_SAN")) : 0;
    const int san = g_san > 0, nd = san ? 2000 : 20000;
    for (int v = 0; v < (san ? 4 : 5); v++) {
        const int V = Vs[v];
        make_logits(l, V, V > 1000 ? 4.0f : 2.0f, V > 7 ? 3 : 0, V > 7 ? 3 : 0, 0);
        set_logits(&d, l, V);
        for (int k = 0; k < NCFG; k++) {
            lily_cuda_sampling c = k_cfgs[k];
            if (V == 248320) c.n_ids = V - 3, c.ban_id = 17; /* padding rows, a banned id */
            if (V == 4099) c.ban_id = 4098;
            draws_in_set(&d, l, &c, V == 248320 ? 40 : 200, "draws", 0);
        }
    }

    /* a grammar's mask: draws in the masked reference set, lily_draw_pick's tokens */
    {
        static const int Vm[] = {7, 4099, 248320};
        uint32_t *mask = malloc((248320 + 31) / 32 * 4);
        for (int v = 0; v < 3; v++) {
            const int V = Vm[v], na = V > 7 ? V - 9 : V;
            make_logits(l, V, 3.0f, V > 7 ? 3 : 0, V > 7 ? 3 : 0, 0);
            make_mask(mask, na, V == 248320 ? 5 : 300);
            set_logits(&d, l, V);
            for (int k = 0; k < NCFG; k++) {
                lily_cuda_sampling c = k_cfgs[k];
                c.mask = mask, c.n_allow = na;
                if (V == 248320) c.n_ids = V - 3, c.ban_id = 17;
                draws_in_set(&d, l, &c, V == 248320 ? 40 : 200, "masked", 0);
            }
        }
        make_logits(l, 1000, 1.5f, 0, 0, 0);
        make_mask(mask, 1000, 200);
        set_logits(&d, l, 1000);
        lily_cuda_sampling cm = {0.9f, 0, 0.8f, 0.0f, 0, -1, 61, mask, 1000};
        draws_in_set(&d, l, &cm, nd, "masked distribution", 1);
        memset(mask, 0, 32 * 4);
        lily_cuda_sampling ce = {1.0f, 0, 1.0f, 0.0f, 0, -1, 62, mask, 1000};
        int32_t t = 0;
        set_cfg(&d, &ce);
        pt_check_true("an empty mask: -1", draw(&d, &t) == 0 && t == -1);
        free(mask);
    }

    /* distributions: small sets, many draws */
    {
        const int V = 1000;
        make_logits(l, V, 1.5f, 0, 0, 0);
        set_logits(&d, l, V);
        lily_cuda_sampling c1 = {1.0f, 30, 1.0f, 0.0f, 0, -1, 42, NULL, 0};
        draws_in_set(&d, l, &c1, nd, "distribution", 1);
        lily_cuda_sampling c2 = {0.7f, 0, 0.6f, 0.0f, 0, -1, 43, NULL, 0};
        draws_in_set(&d, l, &c2, nd, "distribution", 1);
        lily_cuda_sampling c3 = {1.5f, 0, 1.0f, 0.1f, 0, 5, 44, NULL, 0};
        draws_in_set(&d, l, &c3, nd, "distribution", 1);
    }

    /* boundaries on ties: the order cuts them by id */
    {
        const float a[7] = {2, 2, 2, 1, 1, 0, -1};
        set_logits(&d, a, 7);
        lily_cuda_sampling c = {1.0f, 2,  1.0f, 0.0f, 0,
                                -1,   50, NULL, 0}; /* top-k 2 of three equal */
        draws_in_set(&d, a, &c, 400, "tied top-k", 1);
        float b[10];
        for (int i = 0; i < 10; i++)
            b[i] = 0.5f;
        set_logits(&d, b, 10);
        lily_cuda_sampling c2 = {1.0f, 0,  0.35f, 0.0f, 0,
                                 -1,   51, NULL,  0}; /* top-p: 4 of 10 equal */
        int32_t ids[10];
        double p[10];
        int m = ref_set(b, 10, &c2, ids, p);
        pt_check_true("tied top-p: the reference keeps ids 0..3", m == 4 && ids[3] == 3);
        draws_in_set(&d, b, &c2, 800, "tied top-p", 1);
        lily_cuda_sampling c3 = {1.0f, 0,  1.0f, 0.0f, 0,
                                 -1,   52, NULL, 0}; /* +inf: only the infinities */
        float f[9] = {1, INFINITY, 3, NAN, INFINITY, -INFINITY, 2, 0, 5};
        set_logits(&d, f, 9);
        draws_in_set(&d, f, &c3, 400, "+inf logits", 1);
    }

    /* nothing drawable: -1 */
    {
        float z[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
        set_logits(&d, z, 5);
        int ok = 1;
        for (int k = 0; k < 3; k++) {
            lily_cuda_sampling c = k_cfgs[k];
            int32_t t = 0;
            set_cfg(&d, &c);
            ok = ok && draw(&d, &t) == 0 && t == -1;
        }
        float one = 1.0f;
        set_logits(&d, &one, 1);
        lily_cuda_sampling c = {1.0f, 0, 1.0f, 0.0f, 0, 0, 1, NULL, 0}; /* the only id banned */
        int32_t t = 0;
        set_cfg(&d, &c);
        ok = ok && draw(&d, &t) == 0 && t == -1;
        pt_check_true("all NaN / -inf, or the only id banned: -1", ok);
    }

    /* the same (seed, step): the same token; steps advance */
    {
        const int V = san ? 4099 : 248320;
        make_logits(l, V, 1.0f, 0, 0, 0);
        set_logits(&d, l, V);
        lily_cuda_sampling c = {1.0f, 0, 0.9f, 0.0f, 0, -1, 1234, NULL, 0};
        set_cfg(&d, &c);
        int32_t a[8], b[8];
        int ok = 1, differ = 0;
        set_step(&d, 100);
        for (int i = 0; i < 8; i++)
            ok = ok && draw(&d, &a[i]) == 0;
        set_step(&d, 100);
        for (int i = 0; i < 8; i++)
            ok = ok && draw(&d, &b[i]) == 0;
        for (int i = 0; i < 8; i++)
            ok = ok && a[i] == b[i], differ += i && a[i] != a[0];
        uint64_t st = 0;
        cudaMemcpy(&st, d.step, 8, cudaMemcpyDeviceToHost);
        pt_check_true("same seed and step, same tokens; the step counter advances per draw",
                      ok && differ > 0 && st == 108);
        /* a captured graph draws afresh on every replay */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        lily_err e;
        set_step(&d, 100);
        int gok = cudaStreamBeginCapture(d.st, cudaStreamCaptureModeRelaxed) == cudaSuccess;
        gok = gok && lily_cuda_sample(d.l, d.V, d.cfg, d.step, d.scr, d.out, d.st, &e) == 0;
        gok = cudaStreamEndCapture(d.st, &g) == cudaSuccess && gok;
        gok = gok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
        for (int i = 0; i < 8 && gok; i++) {
            int32_t t;
            gok = cudaGraphLaunch(ge, d.st) == cudaSuccess &&
                  cudaStreamSynchronize(d.st) == cudaSuccess &&
                  cudaMemcpy(&t, d.out, 4, cudaMemcpyDeviceToHost) == cudaSuccess && t == a[i];
        }
        pt_check_true("a captured graph replays the draws of steps 100..107", gok);
        if (getenv("LILY_CUDA_TIME")) {
            float us = pt_time_median(t_call, &d, d.st);
            printf("time sample V=%d (T=1 top_p=0.9): %.1f us a call (19 launches + memset)\n", V,
                   us);
            cudaEvent_t x, y;
            cudaEventCreate(&x), cudaEventCreate(&y);
            float ms = 0;
            cudaEventRecord(x, d.st);
            for (int i = 0; i < 100 && gok; i++)
                cudaGraphLaunch(ge, d.st);
            cudaEventRecord(y, d.st);
            cudaEventSynchronize(y);
            cudaEventElapsedTime(&ms, x, y);
            printf("time sample V=%d in a graph: %.1f us a replay\n", V, ms * 10.0f);
        }
    }
    cudaStreamDestroy(d.st);
    lily_cuda_free(d.l), lily_cuda_free(d.cfg), lily_cuda_free(d.step), lily_cuda_free(d.scr);
    lily_cuda_free(d.out), lily_cuda_free(d.mask);
    free(l);
    return pt_finish();
#endif
}
