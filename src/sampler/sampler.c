/* Token sampling: penalties, top-k, temperature, top-p, min-p and a seeded draw; plus the raw
 * log-probabilities the API reports. See sampler.h for the exact chain and its conventions. */
#include "sampler/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* A candidate token: its working logit, id and unnormalised probability exp((l - max) / T). */
typedef struct cand {
    float logit;
    int32_t id;
    float w;
} cand;

struct lily_sampler {
    lily_sampler_params p;
    int vocab;
    uint64_t rng[4];
    float *w;        /* [vocab] working logits */
    cand *c;         /* [vocab] candidates */
    uint8_t *mark;   /* [vocab] scratch marks for distinct-token passes, kept all zero */
    int32_t *count;  /* [vocab] accepted-token counts */
    int32_t *seen;   /* distinct accepted tokens, in first-seen order */
    int n_seen;
};

/* ---- random numbers: splitmix64 to seed xoshiro256** ------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static void seed_rng(lily_sampler *s) {
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

/* Uniform in [0, 1) with 53 random bits. */
static double uniform01(lily_sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1p-53; }

/* ---- ordering --------------------------------------------------------------------------------- */

/* The total order used everywhere: larger logit first, then lower id. */
static int better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap_cand(cand *a, cand *b) {
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Rearranges c[0..n) so that its k best elements come first (in no particular order).
 * Quickselect with a median-of-three pivot; deterministic because the order is total. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    if (k <= 0 || k >= n) return;
    while (hi > lo) {
        int mid = lo + (hi - lo) / 2;
        if (better(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
        if (better(&c[hi], &c[lo])) swap_cand(&c[hi], &c[lo]);
        if (better(&c[hi], &c[mid])) swap_cand(&c[hi], &c[mid]);
        /* now c[lo] >= c[mid] >= c[hi]; use c[mid] as pivot, parked at hi-1 */
        cand pivot = c[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (better(&c[i], &pivot)) i++;
            while (better(&pivot, &c[j])) j--;
            if (i <= j) {
                swap_cand(&c[i], &c[j]);
                i++;
                j--;
            }
        }
        /* [lo, j] >= pivot >= [i, hi] */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* Top-p without sorting: rearranges c[0..n) so that its first k elements are the k best (in
 * the total order) and k is the smallest count whose weight reaches target. Expected O(n):
 * a quickselect that recurses only into the side holding the boundary. */
static int select_mass(cand *c, int n, double target) {
    int lo = 0, hi = n - 1;
    double acc = 0.0; /* weight of c[0..lo), all known to be kept */
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (better(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
        if (better(&c[hi], &c[lo])) swap_cand(&c[hi], &c[lo]);
        if (better(&c[hi], &c[mid])) swap_cand(&c[hi], &c[mid]);
        swap_cand(&c[mid], &c[hi]); /* median pivot parked at hi */
        cand pivot = c[hi];
        int m = lo;
        double above = 0.0;
        for (int i = lo; i < hi; i++)
            if (better(&c[i], &pivot)) {
                above += c[i].w;
                swap_cand(&c[i], &c[m++]);
            }
        swap_cand(&c[m], &c[hi]); /* c[lo..m) better than the pivot, c[m] the pivot */
        if (acc + above >= target) {
            hi = m - 1;
        } else if (acc + above + pivot.w >= target) {
            return m + 1;
        } else {
            acc += above + pivot.w;
            lo = m + 1;
        }
    }
    /* target not reached (rounding) or reached exactly at lo: keep what is known to be needed */
    return lo > 0 ? (lo < n ? lo : n) : 1;
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

lily_sampler_params lily_sampler_params_default(void) {
    lily_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}

int lily_sampler_create(const lily_sampler_params *p, int vocab, lily_sampler **out,
                        lily_err *err) {
    *out = NULL;
    if (!p) return lily_fail(err, "sampler: no parameters");
    if (vocab < 1) return lily_fail(err, "sampler: vocabulary size %d must be >= 1", vocab);
    if (isnan(p->temperature) || p->temperature < 0.0f || isinf(p->temperature))
        return lily_fail(err, "sampler: temperature %g must be finite and >= 0",
                         (double)p->temperature);
    if (isnan(p->top_p) || isnan(p->min_p))
        return lily_fail(err, "sampler: top_p and min_p must not be NaN");
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty < 0.0f)
        return lily_fail(err, "sampler: repeat_penalty %g must be finite and >= 0",
                         (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return lily_fail(err, "sampler: presence/frequency penalties must be finite");
    lily_sampler *s = lily_xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    s->w = lily_xmalloc((size_t)vocab * sizeof *s->w);
    s->c = lily_xmalloc((size_t)vocab * sizeof *s->c);
    s->mark = lily_xcalloc((size_t)vocab, 1);
    s->count = lily_xcalloc((size_t)vocab, sizeof *s->count);
    s->seen = lily_xmalloc((size_t)vocab * sizeof *s->seen);
    seed_rng(s);
    *out = s;
    return 0;
}

void lily_sampler_free(lily_sampler *s) {
    if (!s) return;
    free(s->w);
    free(s->c);
    free(s->mark);
    free(s->count);
    free(s->seen);
    free(s);
}

void lily_sampler_accept(lily_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab) return;
    if (s->count[token]++ == 0) s->seen[s->n_seen++] = token;
}

void lily_sampler_reset(lily_sampler *s) {
    for (int i = 0; i < s->n_seen; i++) s->count[s->seen[i]] = 0;
    s->n_seen = 0;
    seed_rng(s);
}

const lily_sampler_params *lily_sampler_get_params(const lily_sampler *s) { return &s->p; }

/* ---- the chain -------------------------------------------------------------------------------- */

/* Keeps a penalised logit usable: a huge negative value times a penalty must not become -inf. */
static float clamp_finite(float x) { return x < -FLT_MAX ? -FLT_MAX : (x > FLT_MAX ? FLT_MAX : x); }

static void apply_penalties(lily_sampler *s, const int32_t *history, int n_history) {
    const lily_sampler_params *p = &s->p;
    float *w = s->w;
    if (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f && history && n_history > 0) {
        int start = 0;
        if (p->repeat_last_n > 0 && n_history > p->repeat_last_n)
            start = n_history - p->repeat_last_n;
        for (int i = start; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= s->vocab || s->mark[t]) continue;
            s->mark[t] = 1;
            if (w[t] == -INFINITY) continue;
            w[t] = clamp_finite(w[t] > 0.0f ? w[t] / p->repeat_penalty : w[t] * p->repeat_penalty);
        }
        for (int i = start; i < n_history; i++) {
            int32_t t = history[i];
            if (t >= 0 && t < s->vocab) s->mark[t] = 0;
        }
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int i = 0; i < s->n_seen; i++) {
            int32_t t = s->seen[i];
            if (w[t] == -INFINITY) continue;
            w[t] = clamp_finite(w[t] - p->presence_penalty -
                                p->frequency_penalty * (float)s->count[t]);
        }
    }
}

/* Whether the penalties would change any logit of this call. */
static int penalties_act(const lily_sampler *s, const int32_t *history, int n_history) {
    const lily_sampler_params *p = &s->p;
    return (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f && history && n_history > 0) ||
           ((p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) && s->n_seen > 0);
}

/* Greedy without penalties, straight from the caller's logits (no working copy): the largest
 * usable logit, +inf counting as FLT_MAX, the lowest id on ties; -1 when none is usable. */
static int32_t greedy_pick(const float *logits, int V) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++) /* NaN compares false: never the maximum */
        if (logits[i] > m) m = logits[i];
    if (m == -INFINITY) return -1;
    const float want = m == INFINITY ? FLT_MAX : m; /* FLT_MAX ties with +inf */
    for (int i = 0; i < V; i++)
        if (logits[i] == want || (want == FLT_MAX && logits[i] == INFINITY)) return i;
    return -1; /* not reached */
}

int32_t lily_sampler_sample(lily_sampler *s, const float *logits, const int32_t *history,
                            int n_history, lily_err *err) {
    const lily_sampler_params *p = &s->p;
    int V = s->vocab;
    if (p->temperature <= 0.0f && !penalties_act(s, history, n_history)) {
        int32_t t = greedy_pick(logits, V);
        if (t < 0) return lily_fail(err, "sampler: no usable logit (all NaN or -inf)");
        return t;
    }
    float *w = s->w;
    int n_usable = 0;
    for (int i = 0; i < V; i++) {
        float x = logits[i];
        if (isnan(x)) x = -INFINITY;
        else if (x == INFINITY) x = FLT_MAX;
        if (x != -INFINITY) n_usable++;
        w[i] = x;
    }
    if (n_usable == 0) return lily_fail(err, "sampler: no usable logit (all NaN or -inf)");
    apply_penalties(s, history, n_history);

    if (p->temperature <= 0.0f) return greedy_pick(w, V); /* the penalised logits */

    /* Candidates: every usable token. */
    cand *c = s->c;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (w[i] != -INFINITY) c[n++] = (cand){w[i], i, 0.0f};

    /* top-k */
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
    }

    /* Weights relative to the best candidate: the difference first, so that a logit of FLT_MAX
     * cannot overflow when divided by T < 1. */
    double inv_t = 1.0 / (double)p->temperature;
    float maxl = c[0].logit;
    for (int i = 1; i < n; i++)
        if (c[i].logit > maxl) maxl = c[i].logit;
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].w = expf((c[i].logit - maxl) * (float)inv_t);
        total += c[i].w;
    }
    /* min-p and top-p each keep a prefix of the candidates in descending order, so applying
     * min-p first (a cheap linear pass) and then top-p with the mass target of the full
     * distribution gives the same set as top-p followed by min-p. */
    if (p->min_p > 0.0f) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if ((double)c[i].w >= (double)p->min_p) c[m++] = c[i];
        if (m == 0) /* min_p > 1: keep the best token(s) */
            for (int i = 0; i < n; i++)
                if (c[i].logit == maxl) c[m++] = c[i];
        n = m;
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) n = select_mass(c, n, (double)p->top_p * total);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += c[i].w;
    double r = uniform01(s) * sum, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].w;
        if (r < cum) return c[i].id;
    }
    /* rounding left r just above the sum: take the last candidate with weight */
    for (int i = n - 1; i >= 0; i--)
        if (c[i].w > 0.0f) return c[i].id;
    return c[0].id;
}

/* ---- raw log-probabilities -------------------------------------------------------------------- */

/* log(sum(exp(logits))) over the usable logits, with +inf treated as FLT_MAX; NAN if none. */
static double log_sum_exp(const float *logits, int vocab, double *maxout) {
    double m = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float x = logits[i];
        if (isnan(x)) continue;
        double v = x == INFINITY ? FLT_MAX : x;
        if (v > m) m = v;
    }
    *maxout = m;
    if (m == -INFINITY) return NAN;
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) {
        float x = logits[i];
        if (isnan(x) || x == -INFINITY) continue;
        double v = x == INFINITY ? FLT_MAX : x;
        sum += exp(v - m);
    }
    return m + log(sum);
}

float lily_logprob(const float *logits, int vocab, int32_t token) {
    if (!logits || token < 0 || token >= vocab) return -INFINITY;
    float x = logits[token];
    if (isnan(x) || x == -INFINITY) return -INFINITY;
    double m, lse = log_sum_exp(logits, vocab, &m);
    double v = x == INFINITY ? FLT_MAX : x;
    return (float)(v - lse);
}

int lily_logprobs_top(const float *logits, int vocab, int n, int32_t *ids, float *lp) {
    if (!logits || vocab < 1 || n < 1) return 0;
    double m, lse = log_sum_exp(logits, vocab, &m);
    if (isnan(lse)) return 0;
    /* Keep a small sorted list in (ids, lp) while scanning; lp holds the raw logit for now. */
    int have = 0;
    for (int i = 0; i < vocab; i++) {
        float x = logits[i];
        if (isnan(x) || x == -INFINITY) continue;
        if (x == INFINITY) x = FLT_MAX;
        if (have == n && !(x > lp[n - 1])) continue; /* equal: the earlier (lower) id stays */
        int j = have < n ? have++ : n - 1;
        while (j > 0 && x > lp[j - 1]) {
            lp[j] = lp[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        lp[j] = x;
        ids[j] = i;
    }
    for (int i = 0; i < have; i++) lp[i] = (float)((double)lp[i] - lse);
    return have;
}
