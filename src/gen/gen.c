/* Generation with prefix reuse, over one or more slots (see gen.h). */
#include "gen/gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"
#include "gen/pcache.h"
#include "gen/sb.h"
#include "gen/stopstr.h"

typedef struct {
    int32_t ids[64];
    int n, i;
} forced_q;

/* One slot: a session, the tokens it has consumed, and the state of the run it serves. */
typedef struct slot {
    lily_session *sess;
    lily_detok *detok;
    int32_t *hist; /* tokens the session has consumed; [max_ctx] */
    int n_hist;
    int32_t pending_eos; /* end-of-turn token of the last run, not yet consumed (-1: none) */
    int snap_pending;    /* the last run's end-of-turn token was consumed: snapshot at its end */
    uint64_t used;       /* when its last run began (the least recently used slot goes first) */
    /* the run (phase != LILY_GEN_IDLE) */
    lily_gen_phase phase;
    const lily_gen_req *r;
    lily_gen_result *res;
    lily_sampler *smp;
    lily_stopstr stop;
    lily_sb text;
    int max_new;
    int start;        /* prompt tokens reused */
    int pts[4], npts; /* prefill pieces: they end at pts[] (snapshots are taken there) */
    int ipt;          /* the piece being prefilled */
    double t_decode;  /* lily_now() when decoding began */
    int dev;          /* draws on the backend (run_device) */
    int masked;       /* dev with a grammar: one masked draw a step (masked_step) */
    int32_t pending;  /* masked: chosen and emitted, not yet consumed (-1: none) */
    int constrained;  /* the grammar applies to the next token */
    forced_q fq;
    lily_draw dr;     /* dev: the draw parameters, dr.step the next draw's */
    lily_gen_token t; /* dev: the token to emit next */
    int consumed;     /* dev: an enqueued step consumes t */
} slot;

struct lily_gen {
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_pcache *cache;
    slot *slots;
    int n_slots;
    int prefill_chunk; /* tokens per prefill call (0: a whole piece) */
    uint64_t clock;
    int vocab;     /* logits per position */
    int tok_vocab; /* ids the tokenizer can decode */
    int max_ctx;
    int32_t eos[5]; /* end-of-turn ids: the config's (4 at most) and the tokenizer's */
    int n_eos;
    int32_t im_start;
    lily_logit_bias *bias; /* a request's bias list with its banned id, grown as needed (the
                              sampler copies it) */
    int bias_cap;
    int32_t eot; /* the token that ends a constrained turn: <|im_end|> when it is an
                  * end-of-turn id, else the first of them */
    /* constrained decoding scratch, sized on the first constrained request (never per token);
     * shared by the slots, whose draws run one after another */
    uint32_t *mask;
    size_t mask_words;
    float *masked; /* [vocab] the step's logits with the mask applied */
};

static void slot_reset(slot *s) {
    lily_session_reset(s->sess);
    s->n_hist = 0;
    s->pending_eos = -1;
    s->snap_pending = 0;
}

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
    const int n = o->slots > 0 ? o->slots : 1;
    if (n > LILY_MAX_ROWS) {
        lily_fail(e, "%d slots: at most %d", n, LILY_MAX_ROWS);
        free(g);
        return -1;
    }
    g->prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 0;
    g->slots = lily_xcalloc((size_t)n, sizeof *g->slots);
    g->n_slots = n;
    for (int i = 0; i < n; i++) {
        slot *s = &g->slots[i];
        if (lily_session_create(eng, ctx, &s->sess, e) || lily_detok_create(tok, &s->detok, e)) {
            lily_gen_free(g);
            return -1;
        }
        g->max_ctx = lily_session_max_ctx(s->sess);
        s->hist = lily_xmalloc((size_t)g->max_ctx * sizeof *s->hist);
        s->pending_eos = -1;
    }
    g->cache = lily_pcache_create(o->cache_bytes);
    /* the end of a turn: the model config's eos ids (config.json, generation_config.json) and
     * the tokenizer's eos_token (tokenizer_config.json) */
    for (int i = 0; i < 4 && info->eos_ids[i] >= 0; i++)
        g->eos[g->n_eos++] = info->eos_ids[i];
    const int32_t tok_eos = lily_tokenizer_eos_id(tok);
    if (tok_eos >= 0 && !lily_gen_is_eos(g, tok_eos)) g->eos[g->n_eos++] = tok_eos;
    g->im_start = lily_tokenizer_token_to_id(tok, "<|im_start|>");
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
    for (int i = 0; i < g->n_slots; i++) {
        slot *s = &g->slots[i];
        lily_session_free(s->sess);
        lily_detok_free(s->detok);
        free(s->hist);
        lily_sampler_free(s->smp);
        lily_stopstr_free(&s->stop);
        lily_sb_free(&s->text);
    }
    free(g->slots);
    lily_pcache_free(g->cache);
    free(g->bias);
    free(g->mask);
    free(g->masked);
    free(g);
}

int lily_gen_max_ctx(const lily_gen *g) {
    return g->max_ctx;
}

int lily_gen_slots(const lily_gen *g) {
    return g->n_slots;
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
    for (int i = 0; i < g->n_slots; i++)
        if (g->slots[i].phase == LILY_GEN_IDLE) slot_reset(&g->slots[i]);
}

void lily_gen_cache_stats(const lily_gen *g, int *entries, size_t *bytes) {
    *entries = lily_pcache_count(g->cache);
    *bytes = lily_pcache_bytes(g->cache);
}

lily_gen_phase lily_gen_slot_phase(const lily_gen *g, int i) {
    return g->slots[i].phase;
}

/* The live history of slot s that is a prefix of p[0..n) usable to resume (-1: none). A full
 * match needs the session's logits. */
static int live_prefix(slot *s, const int32_t *p, int n) {
    if (s->n_hist > n || memcmp(s->hist, p, (size_t)s->n_hist * sizeof *p)) return -1;
    if (s->n_hist == n && !lily_session_logits(s->sess)) return -1;
    return s->n_hist;
}

int lily_gen_pick(lily_gen *g, const int32_t *p, int n) {
    int best = -1, best_live = 0;
    for (int i = 0; i < g->n_slots; i++) {
        slot *s = &g->slots[i];
        if (s->phase != LILY_GEN_IDLE) continue;
        const int live = live_prefix(s, p, n);
        if (best < 0 || live > best_live || (live == best_live && s->used < g->slots[best].used)) {
            best = i;
            best_live = live > 0 ? live : 0;
        }
    }
    return best;
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

static void snapshot_here(lily_gen *g, slot *s) {
    if (!s->n_hist || lily_pcache_has(g->cache, s->hist, s->n_hist)) return;
    lily_snapshot *snap;
    lily_err e;
    if (lily_session_snapshot(s->sess, &snap, &e) == 0)
        lily_pcache_insert(g->cache, s->hist, s->n_hist, snap);
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

/* Brings slot s to a reusable prefix of the prompt (the live session when its history is one,
 * else the longest cached snapshot) and plans the pieces of the rest. 0, or -1 with res->error. */
static int prefill_plan(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    const int32_t *p = r->prompt;
    const int n = r->n_prompt;
    const int live = live_prefix(s, p, n);
    int snap_len = 0;
    const lily_snapshot *snap = lily_pcache_lookup(g->cache, p, n, n, &snap_len);
    if (snap && snap_len == n && !lily_snapshot_has_logits(snap)) /* taken after a device draw */
        snap = lily_pcache_lookup(g->cache, p, n, n - 1, &snap_len);
    lily_err e;
    int start;
    if (live >= snap_len && live > 0) {
        start = live;
    } else if (snap && snap_len > 0) {
        if (lily_session_restore(s->sess, snap, &e)) {
            snprintf(res->error, sizeof res->error, "%s", e.msg);
            slot_reset(s);
            return -1;
        }
        memcpy(s->hist, p, (size_t)snap_len * sizeof *p);
        s->n_hist = snap_len;
        start = snap_len;
    } else {
        slot_reset(s);
        start = 0;
    }
    res->n_cached = start;
    s->start = start;
    /* the history runs ahead of n_hist: it is valid up to the session's position */
    memcpy(s->hist + start, p + start, (size_t)(n - start) * sizeof *p);
    s->npts = boundaries(g, p, n, start, s->pts);
    s->ipt = 0;
    return 0;
}

/* One prefill call of slot s: the rest of the current piece, at most prefill_chunk tokens (so
 * the calls a prompt is cut into depend on the prompt and the reused prefix only). Returns the
 * tokens computed; 0 when done, or after a failure or cancellation (res->finish set). */
static int prefill_chunk(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    const int32_t *p = r->prompt;
    const int n = r->n_prompt;
    while (s->ipt < s->npts && s->pts[s->ipt] <= s->n_hist)
        s->ipt++;
    if (s->ipt == s->npts || s->n_hist >= n) return 0;
    const int from = s->n_hist, to = s->pts[s->ipt];
    int k = to - from;
    if (g->prefill_chunk > 0 && k > g->prefill_chunk) k = g->prefill_chunk;
    prefill_ctx pc = {r, from - s->start, n - s->start};
    lily_err e;
    const double t0 = lily_now();
    const int rc = lily_session_prefill(s->sess, p + from, k, NULL, prefill_cb, &pc, &e);
    /* keep what was computed: the history follows the session's position */
    const int pos = lily_session_pos(s->sess);
    if (pos >= from && pos <= from + k)
        s->n_hist = pos;
    else
        slot_reset(s);
    res->n_prefilled = s->n_hist - s->start;
    res->prefill_s += lily_now() - t0;
    if (rc) {
        if (r->cancelled && r->cancelled(r->ud)) {
            res->finish = "cancelled";
        } else {
            snprintf(res->error, sizeof res->error, "%s", e.msg);
            res->finish = "error";
            slot_reset(s);
        }
        return 0;
    }
    if (s->n_hist == to) snapshot_here(g, s);
    return k;
}

/* ---- decode -------------------------------------------------------------------------------- */

/* What a generated token does after it is chosen: the end of the turn (1, res->eos), or text for
 * the detokenizer, the stop strings and the caller (1 when they end the run), else 0. */
static int emit(lily_gen *g, slot *s, const lily_gen_token *t) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    if (lily_gen_is_eos(g, t->id)) {
        res->finish = "stop";
        res->eos = 1;
        return 1;
    }
    res->n_gen++;
    lily_sampler_accept(s->smp, t->id);
    const char *piece;
    size_t plen = 0;
    lily_err e;
    if (lily_detok_push(s->detok, t->id, &piece, &plen, &e)) piece = "", plen = 0;
    lily_sb_clear(&s->text);
    int hit = lily_stopstr_push(&s->stop, piece, plen, &s->text);
    if (hit) res->stop_hit = 1 + s->stop.which;
    if (r->on_text(r->ud, t, lily_sb_str(&s->text), s->text.len) || hit) {
        res->finish = "stop";
        return 1;
    }
    return 0;
}

/* The next token from the logits on the host (forced tokens aside), drawn by the sampler at the
 * token's index as its step (as run_device's draws), with logprobs as the request asks. 0, or -1
 * with res->finish = "error". */
static int host_choose(lily_gen *g, slot *s, lily_gen_token *t, int constrained) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    const float *logits = lily_session_logits(s->sess);
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
        t->id =
            lily_sampler_sample(s->smp, g->masked, s->hist, s->n_hist, (uint64_t)res->n_gen, &e);
        if (t->id < 0) {
            snprintf(res->error, sizeof res->error, "constrained draw: %.400s", e.msg);
            res->finish = "error";
            return -1;
        }
    } else if (!t->forced) {
        t->id = lily_sampler_sample(s->smp, logits, s->hist, s->n_hist, (uint64_t)res->n_gen, &e);
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
            lily_sampler_logprobs(s->smp, logits, t->id, n, t->top_ids, t->top_lp, &t->n_top);
        t->logprob = r->logprobs ? lp : 0.0f;
    }
    return 0;
}

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

static void gen_fail(slot *s, const lily_err *e) {
    snprintf(s->res->error, sizeof s->res->error, "%s", e->msg);
    s->res->finish = "error";
    slot_reset(s);
}

/* Host sampling, the part of a step before the token is consumed: each step's logits come to
 * the host. Returns 1 with *id when the session must consume *id (the caller's decode, alone or
 * with other slots), 0 when the run has ended (res->finish). */
static int host_step(lily_gen *g, slot *s, int32_t *id) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    if (r->cancelled && r->cancelled(r->ud)) {
        res->finish = "cancelled";
        return 0;
    }
    if (res->n_gen >= s->max_new || s->n_hist >= g->max_ctx) {
        res->finish = "length";
        return 0;
    }
    lily_gen_token t = {0};
    t.forced = next_forced(r, &s->fq, &t.id);
    if (host_choose(g, s, &t, s->constrained)) return 0;
    if (r->match && r->match_after > 0 && t.id == r->match_after) s->constrained = 1;
    if (emit(g, s, &t)) {
        if (res->eos) s->pending_eos = t.id;
        return 0;
    }
    if (res->n_gen >= s->max_new || s->n_hist + 1 >= g->max_ctx) {
        res->finish = "length";
        return 0;
    }
    *id = t.id;
    return 1;
}

/* Drawing on the backend, pipelined (lily_session_draw_enqueue): the step that consumes a token
 * is enqueued before the host emits that token, and the step that consumes the next draw is
 * enqueued before the host reads it, so the GPU runs step n + 1 while the host detokenizes and
 * streams token n. The price: a token that ends the run by its text (a stop string, the caller)
 * or the end-of-turn token may already be consumed; they join the history, as a finished turn's
 * end-of-turn token does anyway. Forced tokens need the text before them, so the force callback
 * is asked after each emit and before the next step is enqueued. One call emits one token; the
 * first (from the prompt's logits) is drawn on the host by dev_begin. */
static int dev_begin(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    s->dr.step = 1; /* the first token is step 0 */
    if (r->cancelled && r->cancelled(r->ud)) {
        res->finish = "cancelled";
        return -1;
    }
    if (s->max_new < 1 || s->n_hist >= g->max_ctx) {
        res->finish = "length";
        return -1;
    }
    memset(&s->t, 0, sizeof s->t);
    s->t.forced = next_forced(r, &s->fq, &s->t.id);
    if (host_choose(g, s, &s->t, 0)) return -1;
    s->consumed = 0;
    return 0;
}

/* dev_step is in two halves so that the slots' steps that consume their coming draws go to the
 * backend as one rows step (lily_gen_step): dev_prep runs up to that step and returns 1 when the
 * slot reads a draw next (the step is enqueued first when s->consumed), then dev_read reads it. */
static int dev_prep(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    lily_err e;
    /* room to consume t and emit one more: the host loop's length rule */
    const int room = res->n_gen + 1 < s->max_new && s->n_hist + 1 < g->max_ctx;
    if (!s->consumed && room && !lily_gen_is_eos(g, s->t.id)) {
        if (lily_session_draw_enqueue(s->sess, s->t.id, &s->dr, &e)) {
            gen_fail(s, &e);
            return 0;
        }
        s->dr.step++;
        s->hist[s->n_hist++] = s->t.id;
        s->consumed = 1;
    }
    if (emit(g, s, &s->t)) {
        if (res->eos && s->consumed)
            s->snap_pending = 1;
        else if (res->eos)
            s->pending_eos = s->t.id;
        return 0;
    }
    if (!s->consumed) {
        res->finish = "length";
        return 0;
    }
    if (r->cancelled && r->cancelled(r->ud)) {
        res->finish = "cancelled";
        return 0;
    }
    memset(&s->t, 0, sizeof s->t);
    if (next_forced(r, &s->fq, &s->t.id)) { /* the draw after the last token is not used */
        int32_t unused;
        s->t.forced = 1;
        if (lily_session_draw_next(s->sess, &unused, &e)) {
            gen_fail(s, &e);
            return 0;
        }
        s->consumed = 0;
        return 0;
    }
    /* the step that consumes the coming draw, enqueued (by the caller) before the host reads it */
    s->consumed = res->n_gen + 1 < s->max_new && s->n_hist + 1 < g->max_ctx;
    return 1;
}

static void dev_read(slot *s) {
    lily_gen_result *res = s->res;
    lily_err e;
    s->dr.step += s->consumed;
    if (lily_session_draw_next(s->sess, &s->t.id, &e)) {
        gen_fail(s, &e);
        return;
    }
    res->n_drawn++;
    if (s->consumed) s->hist[s->n_hist++] = s->t.id;
}

/* The device slots' steps that consume their coming draws, as one rows step, then each slot's
 * draw read (dev_read). */
static void dev_rows(slot *const *dv, int nd) {
    lily_session *ss[LILY_MAX_ROWS];
    int32_t tok[LILY_MAX_ROWS];
    lily_draw dr[LILY_MAX_ROWS];
    int ne = 0;
    for (int k = 0; k < nd; k++)
        if (dv[k]->consumed) {
            ss[ne] = dv[k]->sess;
            tok[ne] = -1;
            dr[ne++] = dv[k]->dr;
        }
    lily_err e;
    if (ne && lily_session_draw_enqueue_rows(ss, tok, dr, ne, &e)) {
        for (int k = 0; k < nd; k++)
            if (dv[k]->consumed) gen_fail(dv[k], &e);
    }
    for (int k = 0; k < nd; k++)
        if (!dv[k]->res->finish) dev_read(dv[k]);
}

/* ---- constrained draws on the backend ------------------------------------------------------ */

/* masked_step's draw: pending consumed and the next token drawn on the backend under the
 * grammar's mask (when constrained), then fed to the matcher. 0, or -1 with res->finish set. */
static int masked_draw(lily_gen *g, slot *s, lily_gen_token *t) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    lily_draw *dr = &s->dr;
    lily_err e;
    const double t0 = lily_now();
    dr->allow = NULL;
    if (s->constrained) {
        lily_gmatch_mask(r->match, g->mask);
        dr->allow = g->mask;
        dr->n_allow = r->match_vocab < g->vocab ? r->match_vocab : g->vocab;
    }
    res->grammar_s += lily_now() - t0;
    dr->step = (uint64_t)res->n_gen;
    if (lily_session_draw_enqueue(s->sess, s->pending, dr, &e) ||
        lily_session_draw_next(s->sess, &t->id, &e)) {
        gen_fail(s, &e);
        return -1;
    }
    s->hist[s->n_hist++] = s->pending;
    res->n_drawn++;
    if (!s->constrained || lily_gen_is_eos(g, t->id)) return 0;
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

/* One step of a constrained request when the backend draws: the grammar's mask goes with the
 * step (lily_draw.allow) and the logits stay on the device. A step's mask depends on the token it
 * consumes, so the steps are not pipelined: each is enqueued once the token before it is read.
 * The tokens are host_step's: the same mask and chain at the same step (res->n_gen). The token
 * chosen last waits (pending) until the next step consumes it; a forced token, or the end of the
 * grammar, consumes it on the host instead (lily_session_decode) and chooses there. */
static void masked_step(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    lily_err e;
    if (r->cancelled && r->cancelled(r->ud)) {
        res->finish = "cancelled";
        return;
    }
    if (res->n_gen >= s->max_new || s->n_hist + (s->pending >= 0) >= g->max_ctx) {
        res->finish = "length";
        return;
    }
    lily_gen_token t = {0};
    t.forced = next_forced(r, &s->fq, &t.id);
    if (s->pending >= 0 && !t.forced && !(s->constrained && lily_gmatch_is_done(r->match))) {
        if (masked_draw(g, s, &t)) return;
    } else {
        if (s->pending >= 0 && lily_session_decode(s->sess, s->pending, &e)) {
            gen_fail(s, &e);
            return;
        }
        if (s->pending >= 0) s->hist[s->n_hist++] = s->pending;
        if (host_choose(g, s, &t, s->constrained)) return;
    }
    s->pending = -1;
    if (r->match_after > 0 && t.id == r->match_after) s->constrained = 1;
    if (emit(g, s, &t)) {
        if (res->eos) s->pending_eos = t.id;
        return;
    }
    if (res->n_gen >= s->max_new || s->n_hist + 1 >= g->max_ctx) {
        res->finish = "length";
        return;
    }
    s->pending = t.id;
}

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

/* The end of a run: the text the detokenizer and the stop matcher still hold goes to the
 * caller (unless cancelled or failed), and the slot is free again. */
static void slot_end(slot *s) {
    lily_gen_result *res = s->res;
    const lily_gen_req *r = s->r;
    if (s->phase == LILY_GEN_DECODE) {
        res->decode_s = lily_now() - s->t_decode;
        const char *tail;
        size_t tlen;
        lily_detok_flush(s->detok, &tail, &tlen);
        lily_sb_clear(&s->text);
        if (strcmp(res->finish, "cancelled") && strcmp(res->finish, "error")) {
            lily_stopstr_push(&s->stop, tail, tlen, &s->text);
            lily_stopstr_flush(&s->stop, &s->text);
            r->on_text(r->ud, NULL, lily_sb_str(&s->text), s->text.len);
        }
    }
    lily_stopstr_free(&s->stop);
    memset(&s->stop, 0, sizeof s->stop);
    lily_sampler_free(s->smp);
    s->smp = NULL;
    s->phase = LILY_GEN_IDLE;
    s->r = NULL;
    s->res = NULL;
}

/* Prefill is over: the decode state of the run. */
static void decode_begin(lily_gen *g, slot *s) {
    const lily_gen_req *r = s->r;
    lily_gen_result *res = s->res;
    const int n = r->n_prompt;
    if (r->on_prefill && n > s->start) r->on_prefill(r->ud, n - s->start, n - s->start);
    lily_stopstr_init(&s->stop, r->stop, r->n_stop);
    lily_detok_reset(s->detok);
    s->max_new = r->max_new > 0 ? r->max_new : g->max_ctx;
    memset(&s->fq, 0, sizeof s->fq);
    s->constrained = r->match && r->match_after <= 0;
    /* Draws on the backend when it can (CUDA: 4 bytes a token come back instead of the logits
     * and a host pass over them), unless the request needs the logits on the host: logprobs, or
     * a sampler the backend's chain cannot be (penalties, logit_bias). A grammar's mask goes to
     * the backend with each step (masked_step). The host draws with the same random numbers, so
     * the same seed gives the same tokens either way. */
    if (r->match) { /* the constrained draw's scratch, kept for the next requests */
        const size_t words = ((size_t)r->match_vocab + 31) / 32;
        if (words > g->mask_words) {
            free(g->mask);
            g->mask = lily_xcalloc(words, sizeof *g->mask);
            g->mask_words = words;
        }
        if (!g->masked) g->masked = lily_xmalloc((size_t)g->vocab * sizeof *g->masked);
    }
    s->dev = lily_session_can_decode_sample(s->sess) && !r->logprobs && r->top_logprobs == 0 &&
             lily_sampler_as_draw(s->smp, &s->dr) == 0;
    s->masked = s->dev && r->match;
    s->pending = -1;
    s->phase = LILY_GEN_DECODE;
    s->t_decode = lily_now();
    res->finish = NULL;
    if (s->dev && !s->masked && dev_begin(g, s)) slot_end(s);
}

int lily_gen_begin(lily_gen *g, int i, const lily_gen_req *r, lily_gen_result *res) {
    slot *s = &g->slots[i];
    memset(res, 0, sizeof *res);
    res->n_prompt = r->n_prompt;
    res->finish = "error";
    s->r = r;
    s->res = res;
    s->pending_eos = -1;
    s->snap_pending = 0;
    s->used = ++g->clock;
    s->phase = LILY_GEN_PREFILL;
    if (r->n_prompt < 1 || r->n_prompt >= g->max_ctx) {
        snprintf(res->error, sizeof res->error, "prompt of %d tokens does not fit a context of %d",
                 r->n_prompt, g->max_ctx);
        slot_end(s);
        return 0;
    }
    lily_err e;
    if (sampler_for(g, r, &s->smp, &e)) {
        snprintf(res->error, sizeof res->error, "%s", e.msg);
        slot_end(s);
        return 0;
    }
    if (prefill_plan(g, s)) {
        slot_end(s);
        return 0;
    }
    res->finish = NULL;
    if (s->n_hist >= r->n_prompt) decode_begin(g, s);
    return 0;
}

int lily_gen_prefill(lily_gen *g, int i) {
    slot *s = &g->slots[i];
    if (s->phase != LILY_GEN_PREFILL) return 0;
    const int k = prefill_chunk(g, s);
    if (s->res->finish)
        slot_end(s);
    else if (s->n_hist >= s->r->n_prompt)
        decode_begin(g, s);
    return k;
}

int lily_gen_prefill_next(const lily_gen *g, int i) {
    const slot *s = &g->slots[i];
    if (s->phase != LILY_GEN_PREFILL) return 0;
    int ipt = s->ipt;
    while (ipt < s->npts && s->pts[ipt] <= s->n_hist)
        ipt++;
    if (ipt == s->npts) return 0;
    const int k = s->pts[ipt] - s->n_hist;
    return g->prefill_chunk > 0 && k > g->prefill_chunk ? g->prefill_chunk : k;
}

int lily_gen_prefill_left(const lily_gen *g, int i) {
    const slot *s = &g->slots[i];
    return s->phase == LILY_GEN_PREFILL ? s->r->n_prompt - s->n_hist : 0;
}

int lily_gen_step(lily_gen *g, const int *which, int n) {
    lily_session *ss[LILY_MAX_ROWS];
    int32_t ids[LILY_MAX_ROWS];
    slot *rows[LILY_MAX_ROWS], *dv[LILY_MAX_ROWS];
    int nr = 0, nd = 0, done = 0;
    for (int k = 0; k < n; k++) {
        slot *s = &g->slots[which[k]];
        if (s->phase != LILY_GEN_DECODE) continue;
        if (s->masked) {
            masked_step(g, s);
        } else if (s->dev) {
            if (dev_prep(g, s)) dv[nd++] = s;
        } else if (host_step(g, s, &ids[nr])) {
            ss[nr] = s->sess;
            rows[nr++] = s;
        }
    }
    if (nd) dev_rows(dv, nd);
    if (nr) {
        lily_err e;
        if (lily_session_decode_rows(ss, ids, nr, &e)) {
            for (int k = 0; k < nr; k++)
                gen_fail(rows[k], &e);
        } else {
            for (int k = 0; k < nr; k++)
                rows[k]->hist[rows[k]->n_hist++] = ids[k];
        }
    }
    for (int k = 0; k < n; k++) {
        slot *s = &g->slots[which[k]];
        if (s->phase == LILY_GEN_DECODE && s->res->finish) {
            slot_end(s);
            done++;
        }
    }
    return done;
}

int lily_gen_run(lily_gen *g, const lily_gen_req *r, lily_gen_result *res) {
    const int only = 0;
    lily_gen_begin(g, only, r, res);
    while (g->slots[only].phase == LILY_GEN_PREFILL)
        lily_gen_prefill(g, only);
    while (g->slots[only].phase == LILY_GEN_DECODE)
        lily_gen_step(g, &only, 1);
    return 0;
}

void lily_gen_slot_finish_turn(lily_gen *g, int i) {
    slot *s = &g->slots[i];
    if (s->phase != LILY_GEN_IDLE) return;
    if (s->snap_pending) { /* the end-of-turn token was consumed while it was drawn */
        s->snap_pending = 0;
        snapshot_here(g, s);
        return;
    }
    if (s->pending_eos < 0 || s->n_hist + 1 >= g->max_ctx) return;
    lily_err e;
    int32_t id = s->pending_eos;
    s->pending_eos = -1;
    if (lily_session_decode(s->sess, id, &e)) {
        slot_reset(s);
        return;
    }
    s->hist[s->n_hist++] = id;
    snapshot_here(g, s);
}

void lily_gen_finish_turn(lily_gen *g) {
    lily_gen_slot_finish_turn(g, 0);
}
