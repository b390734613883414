/* The CPU reference of the device sampler (draw.h). Every usable logit becomes a 64-bit key of
 * the total order (larger logit first, then lower id); top-k and the top-p boundary are found by
 * quickselects on the keys (exact: the keys are distinct and the top-p mass is an integer sum),
 * so nothing is sorted; the filters and the Gumbel race follow sample.cu step by step. */
#include "backend/cpu/draw.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/draw_rng.h"
#include "base/err.h"

static uint32_t order_bits(float x) { /* float -> unsigned of the same order */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
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
static int32_t id_of(uint64_t k) { return (int32_t)(0xffffffffu - (uint32_t)k); }
static float logit_of(uint64_t k) { return order_float((uint32_t)(k >> 32)); }

#define EXCL (1ull << 63) /* in wf: out of the race (min-p, or a weight of 0) */
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

/* c[0..k) becomes the k largest keys (in no order) */
static void select_top(lily_draw_cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        uint64_t unused;
        const int m = partition(c, lo, hi, &unused);
        if (m == k - 1 || m == k) return;
        if (m > k) hi = m - 1;
        else lo = m + 1;
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

int32_t lily_cpu_draw(const float *l, int V, const lily_draw *d, lily_draw_cand *c) {
    int n = 0;
    uint64_t best = 0;
    for (int i = 0; i < V; i++) {
        float x = l[i];
        if (isnan(x) || x == -INFINITY) continue; /* NaN counts as -inf */
        if ((d->n_ids > 0 && i >= d->n_ids) || i == d->ban_id) continue;
        if (x == INFINITY) x = FLT_MAX;
        c[n].key = key_of(x, i);
        best = c[n].key > best ? c[n].key : best;
        n++;
    }
    if (n == 0) return -1;
    if (!(d->temperature > 0.0f)) return id_of(best); /* argmax, lowest id on ties */
    int m = n; /* the top-k set: c[0..m) */
    if (d->top_k > 0 && d->top_k < n) {
        select_top(c, n, d->top_k);
        m = d->top_k;
    }
    const float maxl = logit_of(best);
    const float inv_t = (float)(1.0 / (double)d->temperature);
    const double fix = 1099511627776.0; /* 2^40 fixed point, as sample.cu sums */
#define LW(x) ((x) == maxl ? 0.0f : ((x) - maxl) * inv_t)
    /* weights: the total over the top-k set; min-p's failures then weigh nothing toward top-p,
     * and they and weights of 0 stay out of the race */
    uint64_t total = 0;
    for (int j = 0; j < m; j++) {
        const float x = logit_of(c[j].key), w = expf(LW(x));
        c[j].wf = (uint64_t)((double)w * fix);
        total += c[j].wf;
        if (d->min_p > 0.0f && !((double)w >= (double)d->min_p || x == maxl)) c[j].wf = EXCL;
        else if (w == 0.0f) c[j].wf |= EXCL;
    }
    int limit = m;
    if (d->top_p > 0.0f && d->top_p < 1.0f)
        limit = select_mass(c, m, (uint64_t)ceil((double)d->top_p * (double)total));
#undef LW
    /* The race: the survivor with the largest float lw + g, g = -log(-log u) (u from draw_rng.h),
     * lower id on ties. g(u) > t needs 1 - u < 1 - exp(-exp(-t)) <= exp(-t), so a candidate whose
     * 1 - u is at least exp(-(best - lw - slack)) cannot reach the best so far; the slack covers
     * the float rounding of g and of the sum. The best logit goes first. */
    uint64_t race = 0;
    float rbest = -INFINITY;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < limit; j++) {
            if (c[j].wf & EXCL) continue;
            const float x = logit_of(c[j].key);
            if ((pass == 0) != (x == maxl)) continue;
            const int32_t i = id_of(c[j].key);
            const float lw = x == maxl ? 0.0f : (x - maxl) * inv_t;
            const double u = lily_draw_uniform(d->seed, d->step, i);
            if (race) {
                const double t = (double)rbest - (double)lw;
                const double slack = (fabs((double)rbest) + fabs((double)lw) + 64.0) * 0x1p-20;
                if (1.0 - u >= exp(-(t - slack))) continue;
            }
            const float v = lw + (float)-log(-log(u));
            const uint64_t rk = ((uint64_t)order_bits(v) << 32) | (0xffffffffu - (uint32_t)i);
            if (rk > race) race = rk, rbest = v;
        }
    return race ? id_of(race) : -1;
}

lily_cpu_drawq *lily_cpu_drawq_create(int V) {
    lily_cpu_drawq *q = lily_xcalloc(1, sizeof *q);
    q->logits = lily_xcalloc((size_t)V, sizeof *q->logits);
    q->scr = lily_xcalloc((size_t)V, sizeof *q->scr);
    q->last = -1;
    return q;
}

void lily_cpu_drawq_free(lily_cpu_drawq *q) {
    if (!q) return;
    free(q->logits);
    free(q->scr);
    free(q);
}
