/* The CPU reference of the device sampler (draw.h): every usable logit becomes a 64-bit key of
 * the total order (larger logit first, then lower id), sorted when top-k or top-p needs the
 * order; the filters and the Gumbel race then follow sample.cu step by step. */
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

static int key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int32_t lily_cpu_draw(const float *l, int V, const lily_draw *d, uint64_t *keys) {
    int n = 0;
    uint64_t best = 0;
    for (int i = 0; i < V; i++) {
        float x = l[i];
        if (isnan(x) || x == -INFINITY) continue; /* NaN counts as -inf */
        if ((d->n_ids > 0 && i >= d->n_ids) || i == d->ban_id) continue;
        if (x == INFINITY) x = FLT_MAX;
        keys[n] = key_of(x, i);
        best = keys[n] > best ? keys[n] : best;
        n++;
    }
    if (n == 0) return -1;
    if (!(d->temperature > 0.0f)) return id_of(best); /* argmax, lowest id on ties */
    const int k_on = d->top_k > 0 && d->top_k < n;
    const int p_on = d->top_p > 0.0f && d->top_p < 1.0f;
    if (k_on || p_on) qsort(keys, (size_t)n, sizeof *keys, key_desc);
    const int m = k_on ? d->top_k : n; /* the top-k set: keys[0..m) */
    const float maxl = order_float((uint32_t)(best >> 32));
    const float inv_t = (float)(1.0 / (double)d->temperature);
#define LW(x) ((x) == maxl ? 0.0f : ((x) - maxl) * inv_t)
#define MINP_OK(w, x) (!(d->min_p > 0.0f) || (double)(w) >= (double)d->min_p || (x) == maxl)
    int limit = m;
    if (p_on) { /* the shortest prefix whose min-p weight reaches top_p of the top-k set's */
        const double fix = 1099511627776.0; /* 2^40 fixed point, as sample.cu sums */
        uint64_t total = 0, acc = 0;
        for (int j = 0; j < m; j++)
            total += (uint64_t)((double)expf(LW(order_float((uint32_t)(keys[j] >> 32)))) * fix);
        const uint64_t target = (uint64_t)ceil((double)d->top_p * (double)total);
        for (int j = 0; j < m; j++) {
            const float x = order_float((uint32_t)(keys[j] >> 32));
            const float w = expf(LW(x));
            if (!MINP_OK(w, x)) continue;
            acc += (uint64_t)((double)w * fix);
            if (acc >= target) {
                limit = j + 1;
                break;
            }
        }
    }
    uint64_t race = 0;
    for (int j = 0; j < limit; j++) {
        const float x = order_float((uint32_t)(keys[j] >> 32));
        const int32_t i = id_of(keys[j]);
        const float lw = LW(x), w = expf(lw);
        if (w == 0.0f || !MINP_OK(w, x)) continue;
        const float g = (float)-log(-log(lily_draw_uniform(d->seed, d->step, i)));
        const uint64_t rk = ((uint64_t)order_bits(lw + g) << 32) | (0xffffffffu - (uint32_t)i);
        race = rk > race ? rk : race;
    }
#undef LW
#undef MINP_OK
    return race ? id_of(race) : -1;
}

lily_cpu_drawq *lily_cpu_drawq_create(int V) {
    lily_cpu_drawq *q = lily_xcalloc(1, sizeof *q);
    q->logits = lily_xcalloc((size_t)V, sizeof *q->logits);
    q->keys = lily_xcalloc((size_t)V, sizeof *q->keys);
    q->last = -1;
    return q;
}

void lily_cpu_drawq_free(lily_cpu_drawq *q) {
    if (!q) return;
    free(q->logits);
    free(q->keys);
    free(q);
}
