/* Generation with prefix reuse (see gen.h). */
#include "gen/gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"
#include "gen/pcache.h"
#include "gen/stopstr.h"

struct lily_gen {
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_session *sess;
    lily_pcache *cache;
    lily_detok *detok;
    int vocab;     /* logits per position */
    int tok_vocab; /* ids the tokenizer can decode */
    int max_ctx;
    int32_t *hist; /* tokens the session has consumed; [max_ctx] */
    int n_hist;
    int32_t eos[5]; /* end-of-turn ids: the config's (4 at most) and the tokenizer's */
    int n_eos;
    int32_t im_start;
    lily_logit_bias *bias; /* a request's bias list with its banned id, grown as needed */
    int bias_cap;
    int32_t pending_eos; /* end-of-turn token of the last run, not yet consumed (-1: none) */
    int snap_pending;    /* the last run's end-of-turn token was consumed: snapshot at its end */
    int32_t eot;         /* the token that ends a constrained turn: <|im_end|> when it is an
                          * end-of-turn id, else the first of them */
    /* constrained decoding scratch, sized on the first constrained request (never per token) */
    uint32_t *mask;
    size_t mask_words;
    float *masked; /* [vocab] the step's logits with the mask applied */
};

int lily_gen_create(lily_engine *eng, lily_tokenizer *tok, const lily_gen_opts *o, lily_gen **out,
                    lily_err *e) {
    lily_gen *g = lily_xcalloc(1, sizeof *g);
    g->eng = eng;
    g->tok = tok;
    const lily_model_info *info = lily_engine_info(eng);
    g->vocab = info->vocab_size;
    g->tok_vocab = lily_tokenizer_vocab_size(tok);
    if (g->tok_vocab > g->vocab) g->tok_vocab = g->vocab;
    int ctx = o->max_ctx > 0 ? o->max_ctx : LILY_GEN_DEFAULT_CTX;
    if (ctx > info->max_position) ctx = info->max_position;
    if (lily_session_create(eng, ctx, &g->sess, e) || lily_detok_create(tok, &g->detok, e)) {
        lily_gen_free(g);
        return -1;
    }
    g->max_ctx = lily_session_max_ctx(g->sess);
    g->hist = lily_xmalloc((size_t)g->max_ctx * sizeof *g->hist);
    g->cache = lily_pcache_create(o->cache_bytes);
    /* the end of a turn: the model config's eos ids (config.json, generation_config.json) and
     * the tokenizer's eos_token (tokenizer_config.json) */
    for (int i = 0; i < 4 && info->eos_ids[i] >= 0; i++)
        g->eos[g->n_eos++] = info->eos_ids[i];
    const int32_t tok_eos = lily_tokenizer_eos_id(tok);
    if (tok_eos >= 0 && !lily_gen_is_eos(g, tok_eos)) g->eos[g->n_eos++] = tok_eos;
    g->im_start = lily_tokenizer_token_to_id(tok, "<|im_start|>");
    g->pending_eos = -1;
    g->eot = g->n_eos ? g->eos[0] : -1;
    if (g->im_start >= 0) {
        const int32_t im_end = lily_tokenizer_token_to_id(tok, "<|im_end|>");
        if (im_end >= 0 && lily_gen_is_eos(g, im_end)) g->eot = im_end;
    }
    *out = g;
    return 0;
}

void lily_gen_free(lily_gen *g) {
    if (!g) return;
    lily_session_free(g->sess);
    lily_detok_free(g->detok);
    lily_pcache_free(g->cache);
    free(g->hist);
    free(g->bias);
    free(g->mask);
    free(g->masked);
    free(g);
}

int lily_gen_max_ctx(const lily_gen *g) {
    return g->max_ctx;
}

int lily_gen_eos_ids(const lily_gen *g, const int32_t **ids) {
    *ids = g->eos;
    return g->n_eos;
}

int lily_gen_is_eos(const lily_gen *g, int32_t id) {
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos[i] == id) return 1;
    return 0;
}

size_t lily_gen_eos_suffix(const lily_gen *g, const char *text, size_t len) {
    for (int i = 0; i < g->n_eos; i++) {
        size_t n;
        const char *t = lily_tokenizer_token_bytes(g->tok, g->eos[i], &n);
        if (t && n && n <= len && !memcmp(text + len - n, t, n)) return n;
    }
    return 0;
}

void lily_gen_reset(lily_gen *g) {
    lily_session_reset(g->sess);
    g->n_hist = 0;
    g->pending_eos = -1;
    g->snap_pending = 0;
}

void lily_gen_cache_stats(const lily_gen *g, int *entries, size_t *bytes) {
    *entries = lily_pcache_count(g->cache);
    *bytes = lily_pcache_bytes(g->cache);
}

/* ---- prefill ------------------------------------------------------------------------------- */

typedef struct {
    const lily_gen_req *r;
    int base, total; /* progress offset within the tokens to compute, and their number */
} prefill_ctx;

static int prefill_cb(void *ud, int done, int total) {
    (void)total;
    prefill_ctx *c = ud;
    if (c->r->on_prefill) c->r->on_prefill(c->r->ud, c->base + done, c->total);
    return c->r->cancelled && c->r->cancelled(c->r->ud);
}

static void snapshot_here(lily_gen *g) {
    if (!g->n_hist || lily_pcache_has(g->cache, g->hist, g->n_hist)) return;
    lily_snapshot *snap;
    lily_err e;
    if (lily_session_snapshot(g->sess, &snap, &e) == 0)
        lily_pcache_insert(g->cache, g->hist, g->n_hist, snap);
    else
        fprintf(stderr, "lily: snapshot failed: %s\n", e.msg);
}

/* Positions (ascending, in (from, n]) where the prefill stops to take a snapshot: after the
 * system prompt (the second <|im_start|>), at the start of the last two messages, and at n. */
static int boundaries(const lily_gen *g, const int32_t *p, int n, int from, int *out) {
    int starts[3] = {-1, -1, -1}; /* second, second-to-last, last <|im_start|> */
    int seen = 0;
    for (int i = 0; i < n && g->im_start >= 0; i++) {
        if (p[i] != g->im_start) continue;
        if (++seen == 2) starts[0] = i;
        starts[1] = starts[2];
        starts[2] = i;
    }
    int k = 0;
    for (int i = 0; i < 3; i++) {
        int b = starts[i];
        if (b <= from || b >= n) continue;
        int dup = 0;
        for (int j = 0; j < k; j++)
            dup |= out[j] == b;
        if (!dup) out[k++] = b;
    }
    for (int i = 1; i < k; i++) /* sort the (at most three) points */
        for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    out[k++] = n;
    return k;
}

/* Brings the session to the state after prompt[0..n) reusing what it can. Returns 0, 1 when
 * cancelled, -1 on an engine error. */
static int prefill(lily_gen *g, const lily_gen_req *r, lily_gen_result *res) {
    const int32_t *p = r->prompt;
    int n = r->n_prompt;
    /* the live session counts when its history is a prefix (a full match needs its logits) */
    int live =
        g->n_hist <= n && !memcmp(g->hist, p, (size_t)g->n_hist * sizeof *p) ? g->n_hist : -1;
    if (live == n && !lily_session_logits(g->sess)) live = -1;
    int snap_len = 0;
    const lily_snapshot *snap = lily_pcache_lookup(g->cache, p, n, n, &snap_len);
    if (snap && snap_len == n && !lily_snapshot_has_logits(snap)) /* taken after a device draw */
        snap = lily_pcache_lookup(g->cache, p, n, n - 1, &snap_len);
    lily_err e;
    int start;
    if (live >= snap_len && live > 0) {
        start = live;
    } else if (snap && snap_len > 0) {
        if (lily_session_restore(g->sess, snap, &e)) {
            snprintf(res->error, sizeof res->error, "%s", e.msg);
            lily_gen_reset(g);
            return -1;
        }
        memcpy(g->hist, p, (size_t)snap_len * sizeof *p);
        g->n_hist = snap_len;
        start = snap_len;
    } else {
        lily_gen_reset(g);
        start = 0;
    }
    res->n_cached = start;
    /* the history runs ahead of n_hist: it is valid up to the session's position */
    memcpy(g->hist + start, p + start, (size_t)(n - start) * sizeof *p);
    int pts[4];
    int npts = boundaries(g, p, n, start, pts);
    prefill_ctx pc = {r, 0, n - start};
    double t0 = lily_now();
    for (int i = 0; i < npts && g->n_hist < n; i++) {
        int from = g->n_hist, to = pts[i];
        if (to <= from) continue;
        pc.base = from - start;
        int rc = lily_session_prefill(g->sess, p + from, to - from, NULL, prefill_cb, &pc, &e);
        /* keep what was computed: the history follows the session's position */
        int pos = lily_session_pos(g->sess);
        if (pos >= from && pos <= to) {
            g->n_hist = pos;
        } else {
            lily_gen_reset(g);
        }
        res->n_prefilled = g->n_hist - start;
        if (rc) {
            res->prefill_s = lily_now() - t0;
            if (r->cancelled && r->cancelled(r->ud)) return 1;
            snprintf(res->error, sizeof res->error, "%s", e.msg);
            lily_gen_reset(g);
            return -1;
        }
        snapshot_here(g);
    }
    if (r->on_prefill && n > start) r->on_prefill(r->ud, n - start, n - start);
    res->prefill_s = lily_now() - t0;
    return 0;
}

/* ---- decode -------------------------------------------------------------------------------- */

/* What a generated token does after it is chosen: the end of the turn (1, res->eos), or text for
 * the detokenizer, the stop strings and the caller (1 when they end the run), else 0. */
static int emit(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_sampler *smp,
                lily_stopstr *stop, lily_sb *text, const lily_gen_token *t) {
    if (lily_gen_is_eos(g, t->id)) {
        res->finish = "stop";
        res->eos = 1;
        return 1;
    }
    res->n_gen++;
    lily_sampler_accept(smp, t->id);
    const char *piece;
    size_t plen = 0;
    lily_err e;
    if (lily_detok_push(g->detok, t->id, &piece, &plen, &e)) piece = "", plen = 0;
    lily_sb_clear(text);
    int hit = lily_stopstr_push(stop, piece, plen, text);
    if (hit) res->stop_hit = 1 + stop->which;
    if (r->on_text(r->ud, t, lily_sb_str(text), text->len) || hit) {
        res->finish = "stop";
        return 1;
    }
    return 0;
}

/* The next token from the logits on the host (forced tokens aside), drawn by the sampler at the
 * token's index as its step (as run_device's draws), with logprobs as the request asks. 0, or -1
 * with res->finish = "error". */
static int host_choose(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_sampler *smp,
                       lily_gen_token *t, int constrained) {
    const float *logits = lily_session_logits(g->sess);
    if (!logits) {
        snprintf(res->error, sizeof res->error, "session has no logits");
        res->finish = "error";
        return -1;
    }
    lily_err e;
    if (!t->forced && constrained && lily_gmatch_is_done(r->match)) {
        t->id = g->eot; /* nothing can follow: the turn ends */
        t->forced = 1;
    } else if (!t->forced && constrained) {
        const double t0 = lily_now();
        lily_gmatch_mask(r->match, g->mask);
        memcpy(g->masked, logits, (size_t)g->vocab * sizeof *logits);
        lily_gmatch_apply(g->mask, r->match_vocab, g->masked, (size_t)g->vocab);
        res->grammar_s += lily_now() - t0;
        t->id = lily_sampler_sample(smp, g->masked, g->hist, g->n_hist, (uint64_t)res->n_gen, &e);
        if (t->id < 0) {
            snprintf(res->error, sizeof res->error, "constrained draw: %.400s", e.msg);
            res->finish = "error";
            return -1;
        }
    } else if (!t->forced) {
        t->id = lily_sampler_sample(smp, logits, g->hist, g->n_hist, (uint64_t)res->n_gen, &e);
        if (t->id < 0) {
            snprintf(res->error, sizeof res->error, "%s", e.msg);
            res->finish = "error";
            return -1;
        }
    }
    const double t1 = constrained ? lily_now() : 0;
    const int refused =
        constrained && !lily_gen_is_eos(g, t->id) && lily_gmatch_accept_token(r->match, t->id);
    if (constrained) res->grammar_s += lily_now() - t1;
    if (refused && !t->forced) {
        snprintf(res->error, sizeof res->error, "constrained draw: token %d refused by the grammar",
                 t->id);
        res->finish = "error";
        return -1;
    }
    if (r->logprobs || r->top_logprobs > 0) {
        const int n = r->top_logprobs < LILY_GEN_MAX_TOP ? r->top_logprobs : LILY_GEN_MAX_TOP;
        const float lp =
            lily_sampler_logprobs(smp, logits, t->id, n, t->top_ids, t->top_lp, &t->n_top);
        t->logprob = r->logprobs ? lp : 0.0f;
    }
    return 0;
}

typedef struct {
    int32_t ids[64];
    int n, i;
} forced_q;

/* A forced token for the next position, when the request's force callback has one (it is asked
 * when the queue is empty, after the text so far has been emitted). */
static int next_forced(const lily_gen_req *r, forced_q *q, int32_t *id) {
    if (q->i == q->n && r->force) {
        q->n = r->force(r->ud, q->ids, 64);
        q->i = 0;
    }
    if (q->i >= q->n) return 0;
    *id = q->ids[q->i++];
    return 1;
}

static void gen_fail(lily_gen *g, lily_gen_result *res, const lily_err *e) {
    snprintf(res->error, sizeof res->error, "%s", e->msg);
    res->finish = "error";
    lily_gen_reset(g);
}

/* Host sampling: each step's logits come to the host. */
static void run_host(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_sampler *smp,
                     lily_stopstr *stop, lily_sb *text, int max_new) {
    forced_q fq = {{0}, 0, 0};
    lily_err e;
    int constrained = r->match && r->match_after <= 0; /* the grammar applies to the next token */
    while (!res->finish) {
        if (r->cancelled && r->cancelled(r->ud)) {
            res->finish = "cancelled";
            break;
        }
        if (res->n_gen >= max_new || g->n_hist >= g->max_ctx) {
            res->finish = "length";
            break;
        }
        lily_gen_token t = {0};
        t.forced = next_forced(r, &fq, &t.id);
        if (host_choose(g, r, res, smp, &t, constrained)) break;
        if (r->match && r->match_after > 0 && t.id == r->match_after) constrained = 1;
        if (emit(g, r, res, smp, stop, text, &t)) {
            if (res->eos) g->pending_eos = t.id;
            break;
        }
        if (res->n_gen >= max_new || g->n_hist + 1 >= g->max_ctx) {
            res->finish = "length";
            break;
        }
        if (lily_session_decode(g->sess, t.id, &e)) {
            gen_fail(g, res, &e);
            break;
        }
        g->hist[g->n_hist++] = t.id;
    }
}

/* Drawing on the backend, pipelined (lily_session_draw_enqueue): the step that consumes a token
 * is enqueued before the host emits that token, and the step that consumes the next draw is
 * enqueued before the host reads it, so the GPU runs step n + 1 while the host detokenizes and
 * streams token n. The price: a token that ends the run by its text (a stop string, the caller)
 * or the end-of-turn token may already be consumed; they join the history, as a finished turn's
 * end-of-turn token does anyway. Forced tokens need the text before them, so the force callback
 * is asked after each emit and before the next step is enqueued. */
static void run_device(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_sampler *smp,
                       const lily_draw *d, lily_stopstr *stop, lily_sb *text, int max_new) {
    lily_draw dr = *d;
    dr.step = 1; /* the first token is step 0 */
    forced_q fq = {{0}, 0, 0};
    lily_err e;
    if (r->cancelled && r->cancelled(r->ud)) {
        res->finish = "cancelled";
        return;
    }
    if (max_new < 1 || g->n_hist >= g->max_ctx) {
        res->finish = "length";
        return;
    }
    /* the first token: from the prompt's logits on the host */
    lily_gen_token t = {0};
    t.forced = next_forced(r, &fq, &t.id);
    if (host_choose(g, r, res, smp, &t, 0)) return;
    int consumed = 0; /* an enqueued step consumes t */
    for (;;) {
        /* room to consume t and emit one more: the host loop's length rule */
        const int room = res->n_gen + 1 < max_new && g->n_hist + 1 < g->max_ctx;
        if (!consumed && room && !lily_gen_is_eos(g, t.id)) {
            if (lily_session_draw_enqueue(g->sess, t.id, &dr, &e)) {
                gen_fail(g, res, &e);
                return;
            }
            dr.step++;
            g->hist[g->n_hist++] = t.id;
            consumed = 1;
        }
        if (emit(g, r, res, smp, stop, text, &t)) {
            if (res->eos && consumed)
                g->snap_pending = 1;
            else if (res->eos)
                g->pending_eos = t.id;
            return;
        }
        if (!consumed) {
            res->finish = "length";
            return;
        }
        if (r->cancelled && r->cancelled(r->ud)) {
            res->finish = "cancelled";
            return;
        }
        memset(&t, 0, sizeof t);
        if (next_forced(r, &fq, &t.id)) { /* the draw after the last token is not used */
            int32_t unused;
            t.forced = 1;
            if (lily_session_draw_next(g->sess, &unused, &e)) {
                gen_fail(g, res, &e);
                return;
            }
            consumed = 0;
            continue;
        }
        /* the step that consumes the coming draw, enqueued before the host reads it */
        consumed = res->n_gen + 1 < max_new && g->n_hist + 1 < g->max_ctx;
        if (consumed && lily_session_draw_enqueue(g->sess, -1, &dr, &e)) {
            gen_fail(g, res, &e);
            return;
        }
        dr.step += consumed;
        if (lily_session_draw_next(g->sess, &t.id, &e)) {
            gen_fail(g, res, &e);
            return;
        }
        res->n_drawn++;
        if (consumed) g->hist[g->n_hist++] = t.id;
    }
}

/* ---- constrained draws on the backend ------------------------------------------------------ */

/* One step of run_masked: pending consumed and the next token drawn on the backend under the
 * grammar's mask (when constrained), then fed to the matcher. 0, or -1 with res->finish set. */
static int masked_draw(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_draw *dr,
                       int constrained, int32_t pending, lily_gen_token *t) {
    lily_err e;
    const double t0 = lily_now();
    dr->allow = NULL;
    if (constrained) {
        lily_gmatch_mask(r->match, g->mask);
        dr->allow = g->mask;
        dr->n_allow = r->match_vocab < g->vocab ? r->match_vocab : g->vocab;
    }
    res->grammar_s += lily_now() - t0;
    dr->step = (uint64_t)res->n_gen;
    if (lily_session_draw_enqueue(g->sess, pending, dr, &e) ||
        lily_session_draw_next(g->sess, &t->id, &e)) {
        gen_fail(g, res, &e);
        return -1;
    }
    g->hist[g->n_hist++] = pending;
    res->n_drawn++;
    if (!constrained || lily_gen_is_eos(g, t->id)) return 0;
    const double t1 = lily_now();
    const int refused = lily_gmatch_accept_token(r->match, t->id);
    res->grammar_s += lily_now() - t1;
    if (refused) {
        snprintf(res->error, sizeof res->error, "constrained draw: token %d refused by the grammar",
                 t->id);
        res->finish = "error";
        return -1;
    }
    return 0;
}

/* A constrained request when the backend draws: the grammar's mask goes with the step
 * (lily_draw.allow) and the logits stay on the device. A step's mask depends on the token it
 * consumes, so the steps are not pipelined: each is enqueued once the token before it is read.
 * The tokens are run_host's: the same mask and chain at the same step (res->n_gen). The token
 * chosen last waits (pending) until the next step consumes it; a forced token, or the end of the
 * grammar, consumes it on the host instead (lily_session_decode) and chooses there. */
static void run_masked(lily_gen *g, const lily_gen_req *r, lily_gen_result *res, lily_sampler *smp,
                       const lily_draw *d, lily_stopstr *stop, lily_sb *text, int max_new) {
    forced_q fq = {{0}, 0, 0};
    lily_err e;
    lily_draw dr = *d;
    int constrained = r->match_after <= 0;
    int32_t pending = -1; /* chosen and emitted, not yet consumed */
    while (!res->finish) {
        if (r->cancelled && r->cancelled(r->ud)) {
            res->finish = "cancelled";
            break;
        }
        if (res->n_gen >= max_new || g->n_hist + (pending >= 0) >= g->max_ctx) {
            res->finish = "length";
            break;
        }
        lily_gen_token t = {0};
        t.forced = next_forced(r, &fq, &t.id);
        if (pending >= 0 && !t.forced && !(constrained && lily_gmatch_is_done(r->match))) {
            if (masked_draw(g, r, res, &dr, constrained, pending, &t)) break;
        } else {
            if (pending >= 0 && lily_session_decode(g->sess, pending, &e)) {
                gen_fail(g, res, &e);
                break;
            }
            if (pending >= 0) g->hist[g->n_hist++] = pending;
            if (host_choose(g, r, res, smp, &t, constrained)) break;
        }
        pending = -1;
        if (r->match_after > 0 && t.id == r->match_after) constrained = 1;
        if (emit(g, r, res, smp, stop, text, &t)) {
            if (res->eos) g->pending_eos = t.id;
            break;
        }
        if (res->n_gen >= max_new || g->n_hist + 1 >= g->max_ctx) {
            res->finish = "length";
            break;
        }
        pending = t.id;
    }
}

/* ---- the request's sampler ------------------------------------------------------------------ */

/* The request's sampler: its parameters, ids the tokenizer lacks never drawn, its logit_bias and
 * its banned id (a bias of -inf). */
static int sampler_for(lily_gen *g, const lily_gen_req *r, lily_sampler **out, lily_err *e) {
    if (r->n_bias + 1 > g->bias_cap) {
        g->bias_cap = r->n_bias + 1;
        g->bias = lily_xrealloc(g->bias, (size_t)g->bias_cap * sizeof *g->bias);
    }
    int n = 0;
    for (int i = 0; i < r->n_bias; i++)
        g->bias[n++] = r->bias[i];
    if (r->ban_id >= 0) g->bias[n++] = (lily_logit_bias){r->ban_id, -INFINITY};
    lily_sampler_params sp = r->sp;
    sp.n_ids = g->tok_vocab;
    sp.bias = g->bias;
    sp.n_bias = n;
    return lily_sampler_create(&sp, g->vocab, out, e);
}

int lily_gen_run(lily_gen *g, const lily_gen_req *r, lily_gen_result *res) {
    memset(res, 0, sizeof *res);
    res->n_prompt = r->n_prompt;
    res->finish = "error";
    g->pending_eos = -1;
    g->snap_pending = 0;
    if (r->n_prompt < 1 || r->n_prompt >= g->max_ctx) {
        snprintf(res->error, sizeof res->error,
                 "prompt of %d tokens does not fit a context of "
                 "%d",
                 r->n_prompt, g->max_ctx);
        return 0;
    }
    int rc = prefill(g, r, res);
    if (rc) {
        res->finish = rc > 0 ? "cancelled" : "error";
        return 0;
    }
    lily_sampler *smp;
    lily_err e;
    if (sampler_for(g, r, &smp, &e)) {
        snprintf(res->error, sizeof res->error, "%s", e.msg);
        return 0;
    }
    lily_stopstr stop;
    lily_stopstr_init(&stop, r->stop, r->n_stop);
    lily_sb text = {0};
    lily_detok_reset(g->detok);
    int max_new = r->max_new > 0 ? r->max_new : g->max_ctx;
    /* Draws on the backend when it can (CUDA: 4 bytes a token come back instead of the logits and
     * a host pass over them), unless the request needs the logits on the host: logprobs, or a
     * sampler the backend's chain cannot be (penalties, logit_bias). A grammar's mask goes to the
     * backend with each step (run_masked). The host draws with the same random numbers, so the same
     * seed gives the same tokens either way. */
    if (r->match) { /* the constrained draw's scratch, kept for the next requests */
        const size_t words = ((size_t)r->match_vocab + 31) / 32;
        if (words > g->mask_words) {
            free(g->mask);
            g->mask = lily_xcalloc(words, sizeof *g->mask);
            g->mask_words = words;
        }
        if (!g->masked) g->masked = lily_xmalloc((size_t)g->vocab * sizeof *g->masked);
    }
    lily_draw dr;
    const int dev = lily_session_can_decode_sample(g->sess) && !r->logprobs &&
                    r->top_logprobs == 0 && lily_sampler_as_draw(smp, &dr) == 0;
    double t0 = lily_now();
    res->finish = NULL;
    if (dev && r->match) /* the mask goes with each step (run_masked) */
        run_masked(g, r, res, smp, &dr, &stop, &text, max_new);
    else if (dev)
        run_device(g, r, res, smp, &dr, &stop, &text, max_new);
    else
        run_host(g, r, res, smp, &stop, &text, max_new);
    res->decode_s = lily_now() - t0;
    /* release what the detokenizer and the stop matcher still hold */
    const char *tail;
    size_t tlen;
    lily_detok_flush(g->detok, &tail, &tlen);
    lily_sb_clear(&text);
    if (strcmp(res->finish, "cancelled") && strcmp(res->finish, "error")) {
        lily_stopstr_push(&stop, tail, tlen, &text);
        lily_stopstr_flush(&stop, &text);
        r->on_text(r->ud, NULL, lily_sb_str(&text), text.len);
    }
    lily_sb_free(&text);
    lily_stopstr_free(&stop);
    lily_sampler_free(smp);
    return 0;
}

void lily_gen_finish_turn(lily_gen *g) {
    if (g->snap_pending) { /* the end-of-turn token was consumed while it was drawn */
        g->snap_pending = 0;
        snapshot_here(g);
        return;
    }
    if (g->pending_eos < 0 || g->n_hist + 1 >= g->max_ctx) return;
    lily_err e;
    int32_t id = g->pending_eos;
    g->pending_eos = -1;
    if (lily_session_decode(g->sess, id, &e)) {
        lily_gen_reset(g);
        return;
    }
    g->hist[g->n_hist++] = id;
    snapshot_here(g);
}
