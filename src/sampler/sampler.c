/* Token sampling: logit_bias and penalties on a copy of the logits, then the device's draw chain
 * (backend/draw.h); plus the log-probabilities the API reports. See sampler.h. */
#include "sampler/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/draw.h"
#include "base/err.h"

struct lily_sampler {
    lily_sampler_params p; /* p.bias points at bias */
    int vocab;
    lily_logit_bias *bias; /* the create-time bias list, ids in range */
    int n_bias;
    int32_t ban_id;    /* the bias list is this one id at -inf (-1: it is not) */
    float *w;          /* [vocab] working logits */
    lily_draw_cand *c; /* [vocab] the draw's scratch */
    uint8_t *mark;     /* [vocab] scratch marks for distinct-token passes, kept all zero */
    int32_t *count;    /* [vocab] accepted-token counts */
    int32_t *seen;     /* distinct accepted tokens, in first-seen order */
    int n_seen;
};

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
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return lily_fail(err, "sampler: %d logit_bias entries without a list", p->n_bias);
    for (int i = 0; i < p->n_bias; i++)
        if (isnan(p->bias[i].bias) || p->bias[i].bias == INFINITY)
            return lily_fail(err, "sampler: logit_bias of token %d must be finite or -inf",
                             (int)p->bias[i].id);
    lily_sampler *s = lily_xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    const int lim = p->n_ids > 0 && p->n_ids < vocab ? p->n_ids : vocab;
    s->bias = lily_xmalloc(((size_t)p->n_bias + 1) * sizeof *s->bias);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].id >= 0 && p->bias[i].id < lim) s->bias[s->n_bias++] = p->bias[i];
    s->p.bias = s->bias;
    s->p.n_bias = s->n_bias;
    s->ban_id = s->n_bias == 1 && s->bias[0].bias == -INFINITY ? s->bias[0].id : -1;
    s->w = lily_xmalloc((size_t)vocab * sizeof *s->w);
    s->c = lily_xmalloc((size_t)vocab * sizeof *s->c);
    s->mark = lily_xcalloc((size_t)vocab, 1);
    s->count = lily_xcalloc((size_t)vocab, sizeof *s->count);
    s->seen = lily_xmalloc((size_t)vocab * sizeof *s->seen);
    *out = s;
    return 0;
}

void lily_sampler_free(lily_sampler *s) {
    if (!s) return;
    free(s->bias);
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
    for (int i = 0; i < s->n_seen; i++)
        s->count[s->seen[i]] = 0;
    s->n_seen = 0;
}

const lily_sampler_params *lily_sampler_get_params(const lily_sampler *s) {
    return &s->p;
}

/* ---- the chain -------------------------------------------------------------------------------- */

/* Keeps a penalised logit usable: a huge negative value times a penalty must not become -inf. */
static float clamp_finite(float x) {
    return x < -FLT_MAX ? -FLT_MAX : (x > FLT_MAX ? FLT_MAX : x);
}

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

/* Whether the penalties could change a logit of some call (the backend cannot apply them). */
static int penalties_on(const lily_sampler_params *p) {
    return (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* Whether the penalties would change any logit of this call. */
static int penalties_act(const lily_sampler *s, const int32_t *history, int n_history) {
    const lily_sampler_params *p = &s->p;
    return (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f && history && n_history > 0) ||
           ((p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) && s->n_seen > 0);
}

static lily_draw draw_of(const lily_sampler_params *p, int32_t ban_id, uint64_t step) {
    return (lily_draw){.temperature = p->temperature,
                       .top_k = p->top_k,
                       .top_p = p->top_p,
                       .min_p = p->min_p,
                       .n_ids = p->n_ids,
                       .ban_id = ban_id,
                       .seed = p->seed,
                       .step = step};
}

int lily_sampler_as_draw(const lily_sampler *s, lily_draw *d) {
    if (penalties_on(&s->p) || (s->n_bias > 0 && s->ban_id < 0)) return -1;
    *d = draw_of(&s->p, s->ban_id, 0);
    return 0;
}

/* logits with the bias added into s->w */
static float *biased(lily_sampler *s, const float *logits) {
    memcpy(s->w, logits, (size_t)s->vocab * sizeof *s->w);
    for (int i = 0; i < s->n_bias; i++)
        s->w[s->bias[i].id] += s->bias[i].bias;
    return s->w;
}

int32_t lily_sampler_sample(lily_sampler *s, const float *logits, const int32_t *history,
                            int n_history, uint64_t step, lily_err *err) {
    const float *l = logits;
    if (s->n_bias > 0 || penalties_act(s, history, n_history)) {
        l = biased(s, logits);
        apply_penalties(s, history, n_history);
    }
    const lily_draw d = draw_of(&s->p, -1, step);
    const int32_t t = lily_draw_pick(l, s->vocab, &d, s->c);
    if (t < 0)
        return lily_fail(err, "sampler: no usable logit (all NaN, -inf, banned or excluded)");
    return t;
}

float lily_sampler_logprobs(lily_sampler *s, const float *logits, int32_t token, int n,
                            int32_t *ids, float *lp, int *n_top) {
    const float *l = logits;
    if (s->n_bias > 0 || (s->p.n_ids > 0 && s->p.n_ids < s->vocab)) {
        float *w = biased(s, logits);
        for (int i = s->p.n_ids > 0 ? s->p.n_ids : s->vocab; i < s->vocab; i++)
            w[i] = -INFINITY;
        l = w;
    }
    *n_top = n > 0 ? lily_logprobs_top(l, s->vocab, n, ids, lp) : 0;
    return lily_logprob(l, s->vocab, token);
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
    for (int i = 0; i < have; i++)
        lp[i] = (float)((double)lp[i] - lse);
    return have;
}
