/* The mask of allowed tokens: a depth-first walk of the vocabulary trie that steps the matcher
 * one byte per trie node and skips a node's whole subtree when its prefix is dead, with the
 * results remembered per state (inside a JSON string, or between digits, the state repeats
 * token after token). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/match_impl.h"
#include "grammar/matcher.h"

/* Keys longer than this (very deep stacks) are not cached. */
#define KEY_MAX (1 << 16)

/* The state as a key: the accept flag, then each configuration's (element, DFA state) and its
 * stack's return elements up to the root. Returns the length, or -1 if too long. */
static int32_t make_key(lily_gmatch *m) {
    int32_t n = 0;
    const gm_pos *p = &m->cur;
#define PUT(v)                                                                   \
    do {                                                                         \
        if (n == m->key_cap) {                                                   \
            if (n >= KEY_MAX) return -1;                                         \
            m->key_cap *= 2;                                                     \
            m->key = lily_xrealloc(m->key, (size_t)m->key_cap * sizeof *m->key); \
        }                                                                        \
        m->key[n++] = (uint32_t)(v);                                             \
    } while (0)
    PUT(p->accept);
    for (int32_t i = 0; i < p->cfg_n; i++) {
        int32_t id = m->cfg[p->cfg_off + i];
        PUT(m->pool[id].dstate);
        for (; id >= 0; id = m->pool[id].parent)
            PUT(m->pool[id].elem);
        PUT(0xFFFFFFFFu);
    }
#undef PUT
    return n;
}

static uint64_t key_hash(const uint32_t *k, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 1099511628211ull;
    }
    return h;
}

static gm_cache_entry *cache_find(lily_gmatch *m, uint64_t h, int32_t n) {
    for (int i = 0; i < m->n_cache; i++) {
        gm_cache_entry *c = &m->cache[i];
        if (c->used && c->hash == h && c->key_n == n &&
            !memcmp(c->key, m->key, (size_t)n * sizeof *m->key))
            return c;
    }
    return NULL;
}

static gm_cache_entry *cache_slot(lily_gmatch *m) {
    gm_cache_entry *best = &m->cache[0];
    for (int i = 1; i < m->n_cache; i++)
        if (m->cache[i].used < best->used) best = &m->cache[i];
    return best;
}

static inline void set_bit(uint32_t *mask, int32_t id) {
    mask[id >> 5] |= 1u << (id & 31);
}

/* The trie walk from state `from`: sets the bit of every token whose bytes it can take. */
static void walk(lily_gmatch *m, const gm_pos *from, uint32_t *mask) {
    const lily_token_trie *t = m->t;
    gm_pos *st = m->walk;
    st[0] = *from;
    uint64_t visited = 0;
    for (int32_t i = 0; i < t->n_nodes;) {
        int32_t d = t->depth[i];
        visited++;
        if (!lily_gm_step(m, &st[d - 1], t->byte[i], &st[d])) {
            i = t->end[i];
            continue;
        }
        for (int32_t k = 0; k < t->tok_n[i]; k++)
            set_bit(mask, t->ids[t->tok_lo[i] + k]);
        i = st[d].cfg_n ? i + 1 : t->end[i];
    }
    m->stats.nodes_walked += visited;
}

/* ---- terminal tables ---------------------------------------------------------------------- */

static const lily_term_tab *dfa_get(lily_gmatch *m, int32_t s) {
    gm_dfa_entry *best = &m->dfa[0];
    for (int i = 0; i < m->n_dfa; i++) {
        gm_dfa_entry *x = &m->dfa[i];
        if (x->used && x->dstate == s) {
            x->used = ++m->clock;
            return x->tab;
        }
        if (x->used < best->used) best = x;
    }
    best->tab = lily_term_store_get(m->t->store, m->g, m->t, s);
    if (!best->tab) {
        lily_term_tab_fill(&best->own, m->g, m->t, s, m->dfa_ds, m->dfa_acc);
        best->tab = &best->own;
    }
    best->dstate = s;
    best->used = ++m->clock;
    return best->tab;
}

/* 1 if the state *from takes tok's bytes from offset off on. */
static int check_bytes(lily_gmatch *m, const gm_pos *from, int32_t tok, uint32_t off) {
    const uint8_t *b = m->t->data + m->t->off[tok];
    uint32_t n = m->t->len[tok];
    gm_pos a = *from, nx;
    for (uint32_t k = off; k < n; k++) {
        if (!lily_gm_step(m, &a, b[k], &nx)) return 0;
        a = nx;
    }
    return 1;
}

/* A token with a forced exit at byte off: what matters is the bytes after the exit, from the
 * state past the terminal (*ex, alive). Many tokens share those bytes ("\",", "\"}"): the answer
 * is remembered by them for the current configuration (m->suffix_gen). */
static int check_suffix(lily_gmatch *m, const gm_pos *ex, int32_t tok, uint32_t off) {
    const lily_token_trie *t = m->t;
    const uint8_t *b = t->data + t->off[tok] + off;
    uint32_t n = t->len[tok] - off;
    if (n == 0) return 1;
    uint64_t h = 1469598103934665603ull;
    for (uint32_t k = 0; k < n; k++)
        h = (h ^ b[k]) * 1099511628211ull;
    for (uint32_t probe = 0; probe < 8; probe++) {
        struct gm_suffix *s = &m->suffix[(h + probe) & (GM_SUFFIX_SLOTS - 1)];
        if (s->gen != m->suffix_gen) {
            int ok = check_bytes(m, ex, tok, off);
            *s = (struct gm_suffix){m->suffix_gen, tok, (uint16_t)off, (uint8_t)ok};
            return ok;
        }
        if (t->len[s->tok] - s->off == n && !memcmp(t->data + t->off[s->tok] + s->off, b, n))
            return s->ok;
    }
    return check_bytes(m, ex, tok, off);
}

/* The boundary tokens of configuration `id` (table x), the one at *one: those with a forced
 * exit by their bytes past it, the others from the configuration itself. */
static void check_boundary(lily_gmatch *m, int32_t id, const gm_pos *one, const lily_term_tab *x,
                           uint32_t *mask) {
    if (++m->suffix_gen == 0) {
        memset(m->suffix, 0, GM_SUFFIX_SLOTS * sizeof *m->suffix);
        m->suffix_gen = 1;
    }
    gm_pos ex;
    int ex_alive = -1;
    for (int32_t k = 0; k < x->n_bnd; k++) {
        int32_t tok = x->bnd[k];
        if (!x->exit[k] || (mask[tok >> 5] >> (tok & 31) & 1)) continue;
        if (ex_alive < 0) ex_alive = lily_gm_exit(m, id, &ex);
        if (ex_alive && check_suffix(m, &ex, tok, x->exit[k])) set_bit(mask, tok);
    }
    for (int32_t k = 0; k < x->n_bnd; k++) {
        int32_t tok = x->bnd[k];
        if (x->exit[k] || (mask[tok >> 5] >> (tok & 31) & 1)) continue;
        if (check_bytes(m, one, tok, 0)) set_bit(mask, tok);
    }
}

/* The union over the current configurations (each one alone decides what it allows): tables
 * and boundary checks for those in small DFA states, one trie walk for the others. */
static void compute(lily_gmatch *m, uint32_t *mask) {
    size_t words = lily_token_trie_mask_words(m->t);
    const gm_pos cur = m->cur;
    lily_gm_restore(m, &cur);
    if (!m->n_dfa) {
        walk(m, &cur, mask);
        lily_gm_restore(m, &cur);
        return;
    }
    int32_t wbase = m->cfg_top;
    for (int32_t i = 0; i < cur.cfg_n; i++) {
        int32_t id = m->cfg[cur.cfg_off + i];
        if (m->pool[id].dstate && dfa_get(m, m->pool[id].dstate)->big) lily_gm_push_cfg(m, id);
    }
    gm_pos rest = {wbase, m->cfg_top - wbase, m->top, 0, 0};
    for (int32_t i = 0; i < cur.cfg_n; i++) {
        int32_t id = m->cfg[cur.cfg_off + i];
        if (!m->pool[id].dstate) continue; /* a placed token: see lily_gmatch_mask */
        const lily_term_tab *x = dfa_get(m, m->pool[id].dstate);
        if (x->big) continue;
        for (size_t w = 0; w < words; w++)
            mask[w] |= x->inner[w];
        lily_gm_restore(m, &rest);
        lily_gm_push_cfg(m, id);
        gm_pos one = {rest.cfg_off + rest.cfg_n, 1, m->top, 0, 0};
        check_boundary(m, id, &one, x, mask);
        m->stats.nodes_walked += (uint64_t)x->n_bnd;
    }
    if (rest.cfg_n) walk(m, &rest, mask);
    lily_gm_restore(m, &cur);
}

void lily_gmatch_mask(lily_gmatch *m, uint32_t *mask) {
    const lily_token_trie *t = m->t;
    size_t words = lily_token_trie_mask_words(t);
    m->stats.masks++;
    memset(mask, 0, words * sizeof *mask);
    if (m->cur.finished) {
        for (size_t i = 0; i < t->n_ends; i++)
            set_bit(mask, t->ends[i]);
        return;
    }
    int32_t kn = m->n_cache ? make_key(m) : -1;
    uint64_t h = kn >= 0 ? key_hash(m->key, kn) : 0;
    gm_cache_entry *c = kn >= 0 ? cache_find(m, h, kn) : NULL;
    if (c) {
        memcpy(mask, c->mask, words * sizeof *mask);
        c->used = ++m->clock;
        m->stats.cache_hits++;
        return;
    }
    compute(m, mask);
    for (int32_t i = 0; i < m->cur.cfg_n; i++) { /* tokens the grammar places here */
        const gm_node *n = &m->pool[m->cfg[m->cur.cfg_off + i]];
        if (!n->dstate) set_bit(mask, m->g->elems[n->elem].arg);
    }
    if (m->cur.accept)
        for (size_t i = 0; i < t->n_ends; i++)
            set_bit(mask, t->ends[i]);
    if (kn < 0) return;
    c = cache_slot(m);
    if (kn > c->key_cap) {
        c->key_cap = kn;
        c->key = lily_xrealloc(c->key, (size_t)kn * sizeof *c->key);
    }
    memcpy(c->key, m->key, (size_t)kn * sizeof *m->key);
    c->key_n = kn;
    c->hash = h;
    c->used = ++m->clock;
    memcpy(c->mask, mask, words * sizeof *mask);
}

void lily_gmatch_apply(const uint32_t *mask, int32_t n_vocab, float *logits, size_t n_logits) {
    size_t n = (size_t)n_vocab < n_logits ? (size_t)n_vocab : n_logits;
    for (size_t w = 0; w * 32 < n; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        size_t end = w * 32 + 32 < n ? w * 32 + 32 : n;
        if (!bits) { /* most words of a mask in JSON structure: one vectorised fill */
            for (size_t i = w * 32; i < end; i++)
                logits[i] = -INFINITY;
            continue;
        }
        for (size_t i = w * 32; i < end; i++)
            if (!(bits >> (i & 31) & 1)) logits[i] = -INFINITY;
    }
    for (size_t i = n; i < n_logits; i++)
        logits[i] = -INFINITY;
}
