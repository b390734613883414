/* The device sampler's chain on the host (draw.h). Every usable logit becomes a 64-bit key of
 * the total order (larger logit first, then lower id); top-k and the top-p boundary are found by
 * quickselects on the keys (exact: the keys are distinct and the top-p mass is an integer sum),
 * so nothing is sorted; the filters and the Gumbel race follow sample.cu step by step. */
#include "backend/draw.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/draw_rng.h"
#include "base/err.h"

static uint32_t order_bits(float x) { /* float -> unsigned of the same order, branch-free */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u ^ (-(u >> 31) | 0x80000000u); /* negative: ~u; else u | sign */
}
static float order_float(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? k & 0x7fffffffu : ~k;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static uint64_t key_of(float x, int i) {
    return ((uint64_t)order_bits(x) << 32) | (0xffffffffu - (uint32_t)i);
}
static int32_t id_of(uint64_t k) {
    return (int32_t)(0xffffffffu - (uint32_t)k);
}
static float logit_of(uint64_t k) {
    return order_float((uint32_t)(k >> 32));
}

#define EXCL  (1ull << 63) /* in wf: out of the race (min-p, or a weight of 0) */
#define WF(c) ((c).wf & ~EXCL)

static void swap_c(lily_draw_cand *a, lily_draw_cand *b) {
    lily_draw_cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo..hi] around a median-of-three pivot: returns m with c[lo..m) above the pivot,
 * c[m] the pivot, c(m..hi] below; *above = the sum of wf over c[lo..m) */
static int partition(lily_draw_cand *c, int lo, int hi, uint64_t *above) {
    const int mid = lo + (hi - lo) / 2;
    if (c[mid].key > c[lo].key) swap_c(&c[mid], &c[lo]);
    if (c[hi].key > c[lo].key) swap_c(&c[hi], &c[lo]);
    if (c[hi].key > c[mid].key) swap_c(&c[hi], &c[mid]);
    swap_c(&c[mid], &c[hi]); /* the median, parked at hi */
    const uint64_t pivot = c[hi].key;
    int m = lo;
    uint64_t s = 0;
    for (int i = lo; i < hi; i++)
        if (c[i].key > pivot) {
            s += WF(c[i]);
            swap_c(&c[i], &c[m++]);
        }
    swap_c(&c[m], &c[hi]);
    *above = s;
    return m;
}

static void heap_down(lily_draw_cand *h, int k, int j) { /* a min-heap by key */
    for (;;) {
        const int a = 2 * j + 1, b = a + 1;
        int s = j;
        if (a < k && h[a].key < h[s].key) s = a;
        if (b < k && h[b].key < h[s].key) s = b;
        if (s == j) return;
        swap_c(&h[j], &h[s]);
        j = s;
    }
}

/* The shortest prefix of c[0..n) in key order whose wf reaches target: c[0..r) becomes it (in no
 * order) and r is returned; n when the whole set stays below target. */
static int select_mass(lily_draw_cand *c, int n, uint64_t target) {
    int lo = 0, hi = n - 1;
    uint64_t acc = 0; /* wf of c[0..lo), all above the boundary */
    while (lo <= hi) {
        uint64_t above;
        const int m = partition(c, lo, hi, &above);
        if (acc + above >= target) {
            hi = m - 1;
        } else if (acc + above + WF(c[m]) >= target) {
            return m + 1;
        } else {
            acc += above + WF(c[m]);
            lo = m + 1;
        }
    }
    return n;
}

/* logits[i] as the sampler sees it; 0 when it cannot be drawn */
static int usable(const float *l, int i, const lily_draw *d, float *x) {
    float v = l[i];
    if (isnan(v) || v == -INFINITY) return 0; /* NaN counts as -inf */
    if ((d->n_ids > 0 && i >= d->n_ids) || i == d->ban_id) return 0;
    if (d->allow && (i >= d->n_allow || !(d->allow[i >> 5] >> (i & 31) & 1))) return 0;
    *x = v == INFINITY ? FLT_MAX : v;
    return 1;
}

typedef struct {
    const lily_draw *d;
    float maxl, inv_t;
    uint64_t race; /* the best race key so far (0: none) */
    float rbest;   /* its lw + g */
} racer;

static float lw_of(const racer *r, float x) {
    return x == r->maxl ? 0.0f : (x - r->maxl) * r->inv_t;
}

/* One candidate in the race: the largest float lw + g, g = -log(-log u) (u from draw_rng.h),
 * lower id on ties. g(u) >= t needs 1 - u < 1 - exp(-exp(-t)) < exp(-t), so a candidate with
 * 2^E <= 1 - u (E from the exponent bits) and E ln 2 >= -t, t = best - lw - slack (the float
 * rounding of g and of the sum), cannot reach the best so far: only the few others pay for the
 * logarithms. check: the candidate's min-p and weight are still to be checked (they cost an
 * expf, paid only by candidates that pass the bound). */
static void race_one(racer *r, float x, int32_t i, int check) {
    const float lw = lw_of(r, x);
    const double u = lily_draw_uniform(r->d->seed, r->d->step, i);
    if (r->race) {
        const double t = (double)r->rbest - (double)lw -
                         (fabs((double)r->rbest) + fabs((double)lw) + 64.0) * 0x1p-20;
        const double om = 1.0 - u;
        uint64_t bits;
        memcpy(&bits, &om, sizeof bits);
        const int e = (int)((bits >> 52) & 0x7ff) - 1023;
        if ((double)e * 0.6931471805599453 >= -t) return;
    }
    if (check) {
        const float w = expf(lw);
        if (w == 0.0f) return; /* a weight of 0 is never drawn */
        if (r->d->min_p > 0.0f && !((double)w >= (double)r->d->min_p || x == r->maxl)) return;
    }
    const float v = lw + (float)-log(-log(u));
    const uint64_t rk = ((uint64_t)order_bits(v) << 32) | (0xffffffffu - (uint32_t)i);
    if (rk > r->race) r->race = rk, r->rbest = v;
}

/* the race over c[0..n) (weighed: EXCL marks those out of it), the best logit first */
static void race_set(racer *r, const lily_draw_cand *c, int n) {
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < n; j++) {
            if (c[j].wf & EXCL) continue;
            const float x = logit_of(c[j].key);
            if ((pass == 0) == (x == r->maxl)) race_one(r, x, id_of(c[j].key), 0);
        }
}

/* weights of c[0..m) (2^-40 fixed point, as sample.cu sums): returns the total; min-p's
 * failures then weigh nothing toward top-p, and they and weights of 0 stay out of the race */
static uint64_t weigh(const racer *r, lily_draw_cand *c, int m) {
    uint64_t total = 0;
    for (int j = 0; j < m; j++) {
        const float x = logit_of(c[j].key), w = expf(lw_of(r, x));
        c[j].wf = (uint64_t)((double)w * 1099511627776.0);
        total += c[j].wf;
        if (r->d->min_p > 0.0f && !((double)w >= (double)r->d->min_p || x == r->maxl))
            c[j].wf = EXCL;
        else if (w == 0.0f)
            c[j].wf |= EXCL;
    }
    return total;
}

int32_t lily_draw_pick(const float *l, int V, const lily_draw *d, lily_draw_cand *c) {
    int n = 0;
    uint64_t best = 0;
    float x;
    for (int i = 0; i < V; i++)
        if (usable(l, i, d, &x)) {
            const uint64_t k = key_of(x, i);
            best = k > best ? k : best;
            n++;
        }
    if (n == 0) return -1;
    if (!(d->temperature > 0.0f)) return id_of(best); /* argmax, lowest id on ties */
    racer r = {d, logit_of(best), (float)(1.0 / (double)d->temperature), 0, -INFINITY};
    const int p_on = d->top_p > 0.0f && d->top_p < 1.0f;
    const int maxid = id_of(best);
    if (d->top_k > 0 && d->top_k < n) { /* top-k: a heap of the best k, then as below */
        const int k = d->top_k;
        int h = 0;
        for (int i = 0; i < V; i++) {
            if (!usable(l, i, d, &x)) continue;
            const uint64_t key = key_of(x, i);
            if (h < k) {
                c[h++].key = key;
                if (h == k)
                    for (int j = k / 2 - 1; j >= 0; j--)
                        heap_down(c, k, j);
            } else if (key > c[0].key) {
                c[0].key = key;
                heap_down(c, k, 0);
            }
        }
        const uint64_t total = weigh(&r, c, k);
        const int limit =
            p_on ? select_mass(c, k, (uint64_t)ceil((double)d->top_p * (double)total)) : k;
        race_set(&r, c, limit);
    } else if (!p_on) { /* the whole set races: no copy, min-p checked past the bound */
        race_one(&r, r.maxl, maxid, 0);
        for (int i = 0; i < V; i++)
            if (i != maxid && usable(l, i, d, &x)) race_one(&r, x, i, 1);
    } else {
        /* top-p over every usable logit: the total, and the weights >= 2^-20 gathered: being monotone in the logit they
         * are the top of the order, so when their mass reaches the target the boundary lies
         * among them; otherwise every logit is gathered. */
        uint64_t total = 0;
        int h = 0;
        for (int i = 0; i < V; i++) {
            if (!usable(l, i, d, &x)) continue;
            const float w = expf(lw_of(&r, x));
            total += (uint64_t)((double)w * 1099511627776.0);
            if (w >= 0x1p-20f) c[h++].key = key_of(x, i);
        }
        const uint64_t target = (uint64_t)ceil((double)d->top_p * (double)total);
        uint64_t heavy = 0;
        (void)weigh(&r, c, h);
        for (int j = 0; j < h; j++)
            heavy += WF(c[j]);
        int m = h;
        if (heavy < target) { /* the boundary is among the light ones: gather all */
            m = 0;
            for (int i = 0; i < V; i++)
                if (usable(l, i, d, &x)) c[m++].key = key_of(x, i);
            (void)weigh(&r, c, m);
        }
        race_set(&r, c, select_mass(c, m, target));
    }
    return r.race ? id_of(r.race) : -1;
}

int lily_draw_mask_check(const lily_draw *d, int V, int unread, lily_err *e) {
    if (!d->allow) return 0;
    if (d->n_allow < 1 || d->n_allow > V)
        return lily_fail(e, "draw: a mask over %d ids (the vocabulary has %d)", d->n_allow, V);
    if (unread)
        return lily_fail(e, "draw: a masked step needs the %d unread draws read first", unread);
    return 0;
}
