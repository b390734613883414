/* Building the vocabulary trie: sort the text tokens by their bytes, then lay the trie out in
 * preorder from the longest common prefix of each token with the one before it. */
#include "grammar/trie.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/termtab.h"

typedef struct sorted_tok {
    const uint8_t *p;
    uint32_t n;
    int32_t id;
} sorted_tok;

static int tok_cmp(const void *pa, const void *pb) {
    const sorted_tok *a = pa, *b = pb;
    uint32_t m = a->n < b->n ? a->n : b->n;
    int c = m ? memcmp(a->p, b->p, m) : 0;
    if (c) return c;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

void lily_token_trie_free(lily_token_trie *t) {
    if (!t) return;
    free(t->byte);
    free(t->depth);
    free(t->end);
    free(t->tok_lo);
    free(t->tok_n);
    free(t->ids);
    free(t->kind);
    free(t->off);
    free(t->len);
    free(t->data);
    free(t->ends);
    lily_term_store_free(t->store);
    free(t);
}

static void layout(lily_token_trie *t, const sorted_tok *v, size_t nv, size_t total) {
    t->byte = lily_xmalloc(total + 1);
    t->depth = lily_xmalloc((total + 1) * sizeof *t->depth);
    t->end = lily_xmalloc((total + 1) * sizeof *t->end);
    t->tok_lo = lily_xmalloc((total + 1) * sizeof *t->tok_lo);
    t->tok_n = lily_xmalloc((total + 1) * sizeof *t->tok_n);
    int32_t path[LILY_TRIE_MAX_TOKEN + 1];
    int32_t n = 0;
    uint32_t open = 0;
    const sorted_tok *prev = NULL;
    for (size_t k = 0; k < nv; k++) {
        const sorted_tok *s = &v[k];
        uint32_t l = 0;
        if (prev) {
            uint32_t m = prev->n < s->n ? prev->n : s->n;
            while (l < m && prev->p[l] == s->p[l])
                l++;
        }
        for (uint32_t d = open; d > l; d--)
            t->end[path[d]] = n;
        for (uint32_t d = l + 1; d <= s->n; d++) {
            t->byte[n] = s->p[d - 1];
            t->depth[n] = (uint16_t)d;
            t->tok_lo[n] = 0;
            t->tok_n[n] = 0;
            path[d] = n++;
        }
        open = s->n;
        int32_t at = path[s->n];
        if (t->tok_n[at] == 0) t->tok_lo[at] = (int32_t)k;
        t->tok_n[at]++;
        t->ids[k] = s->id;
        if ((int32_t)s->n > t->max_depth) t->max_depth = (int32_t)s->n;
        prev = s;
    }
    for (uint32_t d = open; d > 0; d--)
        t->end[path[d]] = n;
    t->n_nodes = n;
}

int lily_token_trie_create(int32_t n, const char *const *bytes, const size_t *lens,
                           const uint8_t *text, const int32_t *ends, size_t n_ends,
                           lily_token_trie **out, lily_err *e) {
    *out = NULL;
    if (n <= 0) return lily_fail(e, "token trie: empty vocabulary");
    for (size_t i = 0; i < n_ends; i++)
        if (ends[i] < 0 || ends[i] >= n)
            return lily_fail(e, "token trie: end token %d outside the vocabulary (%d)",
                             (int)ends[i], (int)n);
    lily_token_trie *t = lily_xcalloc(1, sizeof *t);
    t->n_vocab = n;
    t->kind = lily_xcalloc((size_t)n, 1);
    t->off = lily_xcalloc((size_t)n, sizeof *t->off);
    t->len = lily_xcalloc((size_t)n, sizeof *t->len);
    t->ids = lily_xmalloc((size_t)n * sizeof *t->ids);
    size_t data_n = 0;
    for (int32_t i = 0; i < n; i++)
        if (bytes[i]) data_n += lens[i];
    t->data = lily_xmalloc(data_n + 1);
    sorted_tok *v = lily_xmalloc((size_t)n * sizeof *v);
    size_t nv = 0, total = 0, pos = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!bytes[i]) continue;
        memcpy(t->data + pos, bytes[i], lens[i]);
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)lens[i];
        pos += lens[i];
        if (!text[i] || lens[i] == 0 || lens[i] > LILY_TRIE_MAX_TOKEN) continue;
        t->kind[i] = LILY_TOK_TEXT;
        v[nv++] = (sorted_tok){t->data + t->off[i], (uint32_t)lens[i], i};
        total += lens[i];
    }
    t->ends = lily_xmalloc((n_ends + 1) * sizeof *t->ends);
    for (size_t i = 0; i < n_ends; i++) {
        if (t->kind[ends[i]] != LILY_TOK_END) t->ends[t->n_ends++] = ends[i];
        t->kind[ends[i]] = LILY_TOK_END;
    }
    qsort(v, nv, sizeof *v, tok_cmp);
    /* an end token that is also text keeps only its end role */
    size_t w = 0;
    for (size_t k = 0; k < nv; k++)
        if (t->kind[v[k].id] == LILY_TOK_TEXT) v[w++] = v[k];
    layout(t, v, w, total);
    free(v);
    t->store = lily_term_store_new();
    *out = t;
    return 0;
}

int lily_token_trie_from_tokenizer(const lily_tokenizer *tok, const int32_t *ends, size_t n_ends,
                                   lily_token_trie **out, lily_err *e) {
    int32_t n = lily_tokenizer_vocab_size(tok);
    const char **bytes = lily_xcalloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = lily_xcalloc((size_t)n + 1, sizeof *lens);
    uint8_t *text = lily_xcalloc((size_t)n + 1, 1);
    for (int32_t i = 0; i < n; i++) {
        bytes[i] = lily_tokenizer_token_bytes(tok, i, &lens[i]);
        text[i] = !lily_tokenizer_is_added(tok, i);
    }
    int rc = lily_token_trie_create(n, bytes, lens, text, ends, n_ends, out, e);
    free(bytes);
    free(lens);
    free(text);
    return rc;
}
