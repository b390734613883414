/* libFuzzer target for the JSON Schema compiler and the matcher. The input is a schema: it must
 * compile or fail with a message. A compiled grammar is then driven for up to 64 tokens over a
 * small vocabulary (the 256 bytes, a few JSON pieces, an end token), the token at each step
 * picked from the allowed ones by a hash of the input: every allowed token must be accepted,
 * every refused one rejected, and the mask is never empty before the end token. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lily_token_trie *g_trie;

static void init(void) {
    if (g_trie) return;
    static const char *const pieces[] = {"{\"", "\":",   "\",",      "}", "]",    "true",   "null",
                                         "12",  "\"a\"", "\xC3\xA9", " ", "\n  ", "<|end|>"};
    enum { NP = sizeof pieces / sizeof *pieces, N = 256 + NP };
    static char bytes_store[256];
    const char *bytes[N];
    size_t lens[N];
    uint8_t text[N];
    for (int i = 0; i < 256; i++) {
        bytes_store[i] = (char)i;
        bytes[i] = &bytes_store[i];
        lens[i] = 1;
        text[i] = 1;
    }
    for (int i = 0; i < NP; i++) {
        bytes[256 + i] = pieces[i];
        lens[256 + i] = strlen(pieces[i]);
        text[256 + i] = i + 1 < NP;
    }
    int32_t end = N - 1;
    lily_err e;
    if (lily_token_trie_create(N, bytes, lens, text, &end, 1, &g_trie, &e))
        lily_abort(__FILE__, __LINE__, "trie: %s", e.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    lily_grammar *g = NULL;
    lily_err e;
    e.msg[0] = 0;
    if (lily_grammar_from_schema_text((const char *)data, size, &g, &e)) {
        LILY_ASSERT(e.msg[0] != 0 && g == NULL);
        return 0;
    }
    lily_gmatch *m, *tmp;
    LILY_ASSERT(lily_gmatch_create(g, g_trie, NULL, &m, &e) == 0);
    LILY_ASSERT(lily_gmatch_create(g, g_trie, NULL, &tmp, &e) == 0);
    size_t words = lily_token_trie_mask_words(g_trie);
    uint32_t mask[16];
    LILY_ASSERT(words <= 16);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 1099511628211ull;
    for (int step = 0; step < 64 && !lily_gmatch_is_finished(m); step++) {
        lily_gmatch_mask(m, mask);
        int32_t allowed[16 * 32], n = 0;
        for (int32_t id = 0; id < g_trie->n_vocab; id++) {
            int bit = mask[id >> 5] >> (id & 31) & 1;
            if (bit) allowed[n++] = id;
            if (id % 7 == step % 7) { /* spot-check the mask against the matcher */
                lily_gmatch_copy(tmp, m);
                LILY_ASSERT((lily_gmatch_accept_token(tmp, id) == 0) == bit);
            }
        }
        LILY_ASSERT(n > 0);
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        LILY_ASSERT(lily_gmatch_accept_token(m, allowed[(h >> 33) % (uint64_t)n]) == 0);
    }
    lily_gmatch_free(m);
    lily_gmatch_free(tmp);
    lily_grammar_free(g);
    return 0;
}
