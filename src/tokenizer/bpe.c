/* BPE merges and the per-word cache (see bpe.h). */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* Words longer than this are not cached: they are rare and would bloat the cache. */
#define CACHE_MAX_WORD 256
/* When the cache holds this many words it is emptied and refilled; a prompt rarely has more
 * distinct words, and the bound keeps memory flat over a long-running server. */
#define CACHE_MAX_ENTRIES (1u << 17)

int lily_bpe_init(lily_bpe *b, const lily_vocab *v, lily_err *e) {
    for (unsigned c = 0; c < 256; c++) {
        unsigned char u[4];
        int k = lily_utf8_encode(lily_bytelevel_cp(c), u);
        b->byte_id[c] = lily_vocab_find(v, (const char *)u, (size_t)k);
        if (b->byte_id[c] < 0)
            return lily_fail(e,
                             "vocabulary has no token for byte 0x%02X ('%.*s'); only "
                             "byte-level BPE vocabularies are supported",
                             c, k, (char *)u);
    }
    return 0;
}

int lily_bpe_add_merge(lily_bpe *b, const lily_vocab *v, const char *l, size_t ln, const char *r,
                       size_t rn, int32_t rank, lily_err *e) {
    int32_t a = lily_vocab_find(v, l, ln), c = lily_vocab_find(v, r, rn);
    if (a < 0)
        return lily_fail(e, "merge %d: '%.*s' is not in the vocabulary", (int)rank, (int)ln, l);
    if (c < 0)
        return lily_fail(e, "merge %d: '%.*s' is not in the vocabulary", (int)rank, (int)rn, r);
    lily_u8buf_put(&b->mapped, l, ln);
    lily_u8buf_put(&b->mapped, r, rn);
    int32_t m = lily_vocab_find(v, (const char *)b->mapped.p, ln + rn);
    b->mapped.n = 0;
    if (m < 0)
        return lily_fail(e, "merge %d: '%.*s%.*s' is not in the vocabulary", (int)rank, (int)ln, l,
                         (int)rn, r);
    /* A repeated pair keeps its first (lowest) rank, as a later duplicate can never apply. */
    lily_pairmap_put(&b->merges, a, c, rank, m);
    return 0;
}

/* ---- merging strategies ---------------------------------------------------------------- */

static size_t merge_scan(const lily_pairmap *m, int32_t *s, size_t n) {
    int32_t rank[LILY_BPE_SCAN_MAX], merged[LILY_BPE_SCAN_MAX];
    for (size_t i = 0; i + 1 < n; i++)
        if (!lily_pairmap_get(m, s[i], s[i + 1], &rank[i], &merged[i])) rank[i] = INT32_MAX;
    while (n > 1) {
        int32_t best = INT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (best == INT32_MAX) break;
        s[bi] = merged[bi];
        /* Drop symbol bi+1 and the pair entry that started at it. */
        memmove(s + bi + 1, s + bi + 2, (n - bi - 2) * sizeof *s);
        memmove(rank + bi + 1, rank + bi + 2, (n - bi - 2) * sizeof *rank);
        memmove(merged + bi + 1, merged + bi + 2, (n - bi - 2) * sizeof *merged);
        n--;
        if (bi + 1 < n && !lily_pairmap_get(m, s[bi], s[bi + 1], &rank[bi], &merged[bi]))
            rank[bi] = INT32_MAX;
        if (bi > 0 && !lily_pairmap_get(m, s[bi - 1], s[bi], &rank[bi - 1], &merged[bi - 1]))
            rank[bi - 1] = INT32_MAX;
    }
    return n;
}

typedef struct heap_item {
    int32_t rank, pos;   /* ordered by rank, then by position (leftmost first) */
    int32_t left, right; /* the ids the pair had when pushed; stale entries no longer match */
} heap_item;

static int item_less(const heap_item *x, const heap_item *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && item_less(&h[c + 1], &h[c])) c++;
        if (!item_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Heap strategy: symbols form a doubly linked list over positions; each merge pushes at most two
 * new pairs, so the heap never exceeds 3n entries. */
static size_t merge_heap(lily_bpe *b, int32_t *s, size_t n) {
    size_t need = n * sizeof(heap_item) * 3 + n * 2 * sizeof(int32_t);
    if (b->heap_cap < need) {
        free(b->heap);
        b->heap = lily_xmalloc(need);
        b->heap_cap = need;
    }
    heap_item *h = b->heap;
    int32_t *prev = (int32_t *)(h + 3 * n), *next = prev + n;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    int32_t rank, merged;
    for (size_t i = 0; i + 1 < n; i++)
        if (lily_pairmap_get(&b->merges, s[i], s[i + 1], &rank, &merged))
            heap_push(h, &hn, (heap_item){rank, (int32_t)i, s[i], s[i + 1]});
    while (hn) {
        heap_item it = heap_pop(h, &hn);
        int32_t p = it.pos, q = next[p];
        if (s[p] < 0 || q < 0 || s[p] != it.left || s[q] != it.right) continue;
        if (!lily_pairmap_get(&b->merges, it.left, it.right, &rank, &merged)) continue;
        s[p] = merged;
        s[q] = -1; /* dead */
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0 && lily_pairmap_get(&b->merges, s[prev[p]], s[p], &rank, &merged))
            heap_push(h, &hn, (heap_item){rank, prev[p], s[prev[p]], s[p]});
        if (next[p] >= 0 && lily_pairmap_get(&b->merges, s[p], s[next[p]], &rank, &merged))
            heap_push(h, &hn, (heap_item){rank, p, s[p], s[next[p]]});
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0) s[k++] = s[i];
    return k;
}

void lily_bpe_merge(lily_bpe *b, int32_t *sym, size_t *n, int use_heap) {
    if (*n < 2) return;
    if (!use_heap && *n <= LILY_BPE_SCAN_MAX)
        *n = merge_scan(&b->merges, sym, *n);
    else
        *n = merge_heap(b, sym, *n);
}

/* ---- the word cache ------------------------------------------------------------------ */

static void cache_clear(lily_bpe *b) {
    if (b->slots) memset(b->slots, 0, b->slot_cap * sizeof *b->slots);
    b->n_ent = 0;
    b->keys.n = 0;
    b->ids.n = 0;
}

static const lily_bpe_cache_entry *cache_find(const lily_bpe *b, const unsigned char *w, size_t n,
                                              uint64_t h) {
    if (!b->slot_cap) return NULL;
    size_t mask = b->slot_cap - 1, i = (size_t)h & mask;
    while (b->slots[i]) {
        const lily_bpe_cache_entry *c = &b->ent[b->slots[i] - 1];
        if (c->hash == h && c->key_len == n && !memcmp(b->keys.p + c->key_off, w, n)) return c;
        i = (i + 1) & mask;
    }
    return NULL;
}

static void cache_put(lily_bpe *b, const unsigned char *w, size_t n, uint64_t h, const int32_t *ids,
                      size_t k) {
    if (b->n_ent >= CACHE_MAX_ENTRIES) cache_clear(b);
    if (!b->slot_cap) {
        b->slot_cap = 2 * CACHE_MAX_ENTRIES;
        b->slots = lily_xcalloc(b->slot_cap, sizeof *b->slots);
    }
    if (b->n_ent == b->cap_ent) {
        b->cap_ent = b->cap_ent ? b->cap_ent * 2 : 4096;
        b->ent = lily_xrealloc(b->ent, b->cap_ent * sizeof *b->ent);
    }
    lily_bpe_cache_entry *c = &b->ent[b->n_ent];
    c->hash = h;
    c->key_off = (uint32_t)b->keys.n;
    c->key_len = (uint32_t)n;
    c->ids_off = (uint32_t)b->ids.n;
    c->ids_n = (uint32_t)k;
    lily_u8buf_put(&b->keys, w, n);
    for (size_t i = 0; i < k; i++)
        lily_ids_push(&b->ids, ids[i]);
    size_t mask = b->slot_cap - 1, i = (size_t)h & mask;
    while (b->slots[i])
        i = (i + 1) & mask;
    b->slots[i] = (uint32_t)++b->n_ent;
}

void lily_bpe_word(lily_bpe *b, const lily_vocab *v, const unsigned char *w, size_t n,
                   lily_ids *out) {
    if (n == 1) {
        lily_ids_push(out, b->byte_id[w[0]]);
        return;
    }
    int cacheable = n <= CACHE_MAX_WORD;
    uint64_t h = 0;
    if (cacheable) {
        h = lily_tok_hash(w, n);
        const lily_bpe_cache_entry *c = cache_find(b, w, n, h);
        if (c) {
            for (uint32_t i = 0; i < c->ids_n; i++)
                lily_ids_push(out, b->ids.p[c->ids_off + i]);
            return;
        }
    }
    if (b->ignore_merges) {
        b->mapped.n = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char u[4];
            lily_u8buf_put(&b->mapped, u, (size_t)lily_utf8_encode(lily_bytelevel_cp(w[i]), u));
        }
        int32_t id = lily_vocab_find(v, (const char *)b->mapped.p, b->mapped.n);
        if (id >= 0) {
            lily_ids_push(out, id);
            if (cacheable) cache_put(b, w, n, h, &id, 1);
            return;
        }
    }
    if (b->sym_cap < n) {
        free(b->sym);
        b->sym_cap = n < 256 ? 256 : n;
        b->sym = lily_xmalloc(b->sym_cap * sizeof *b->sym);
    }
    for (size_t i = 0; i < n; i++)
        b->sym[i] = b->byte_id[w[i]];
    size_t k = n;
    lily_bpe_merge(b, b->sym, &k, 0);
    for (size_t i = 0; i < k; i++)
        lily_ids_push(out, b->sym[i]);
    if (cacheable) cache_put(b, w, n, h, b->sym, k);
}

void lily_bpe_free(lily_bpe *b) {
    lily_pairmap_free(&b->merges);
    free(b->slots);
    free(b->ent);
    lily_u8buf_free(&b->keys);
    free(b->ids.p);
    free(b->sym);
    free(b->heap);
    lily_u8buf_free(&b->mapped);
    memset(b, 0, sizeof *b);
}
