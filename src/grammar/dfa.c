/* Terminal builders. A linear pattern goes through a small NFA (one node per occurrence of an
 * item) and the subset construction; literal sets become a trie; the JSON string DFA is written
 * out by hand, one copy of its 13 inner states per character count when the length is bounded. */
#include "grammar/dfa.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static void set_add(uint8_t *set, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi; c++)
        set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static int set_has(const uint8_t *set, unsigned c) {
    return set[c >> 3] >> (c & 7) & 1;
}

lily_dfa_item lily_dfa_bytes(const char *bytes, int min, int max) {
    lily_dfa_item it = {.min = min, .max = max};
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++)
        set_add(it.set, *p, *p);
    return it;
}

lily_dfa_item lily_dfa_range(unsigned lo, unsigned hi, int min, int max) {
    lily_dfa_item it = {.min = min, .max = max};
    set_add(it.set, lo, hi);
    return it;
}

/* ---- linear patterns: NFA of occurrences, then subsets ------------------------------------- */

#define END_BIT (1ull << 63)

typedef struct seq_nfa {
    const uint8_t *set[LILY_DFA_SEQ_MAX_NODES];
    uint64_t follow[LILY_DFA_SEQ_MAX_NODES];
    int n;
} seq_nfa;

/* Returns the entry mask of the whole pattern. */
static uint64_t seq_build(seq_nfa *a, const lily_dfa_item *items, size_t n) {
    uint64_t next_entry = END_BIT;
    for (size_t k = n; k-- > 0;) {
        const lily_dfa_item *it = &items[k];
        LILY_ASSERT(it->min >= 0 && (it->max < 0 || it->max >= it->min));
        int count = it->max >= 0 ? it->max : it->min + 1;
        if (count == 0) continue;
        LILY_ASSERT(a->n + count <= LILY_DFA_SEQ_MAX_NODES);
        int base = a->n;
        a->n += count;
        for (int j = 1; j <= count; j++) {
            int id = base + j - 1;
            uint64_t f = j >= it->min ? next_entry : 0;
            if (it->max >= 0 ? j < it->max : j <= it->min) f |= 1ull << (base + j);
            if (it->max < 0 && j == count) f |= 1ull << id; /* the unbounded tail loops */
            a->set[id] = it->set;
            a->follow[id] = f;
        }
        next_entry = (1ull << base) | (it->min == 0 ? next_entry : 0);
    }
    return next_entry;
}

int32_t lily_dfa_seq(lily_gbuild *b, const lily_dfa_item *items, size_t n) {
    seq_nfa a = {0};
    uint64_t start = seq_build(&a, items, n);
    enum { MAXS = 512 };
    uint64_t masks[MAXS];
    int32_t ids[MAXS];
    int ns = 0;
    masks[ns] = start;
    ids[ns++] = lily_gbuild_state(b, (start & END_BIT) != 0);
    for (int q = 0; q < ns; q++) {
        uint64_t tgt[256];
        for (unsigned c = 0; c < 256; c++) {
            uint64_t t = 0;
            for (int i = 0; i < a.n; i++)
                if ((masks[q] >> i & 1) && set_has(a.set[i], c)) t |= a.follow[i];
            tgt[c] = t;
        }
        for (unsigned lo = 0; lo < 256;) {
            unsigned hi = lo;
            while (hi + 1 < 256 && tgt[hi + 1] == tgt[lo])
                hi++;
            if (tgt[lo]) {
                int k = 0;
                while (k < ns && masks[k] != tgt[lo])
                    k++;
                if (k == ns) {
                    LILY_ASSERT(ns < MAXS);
                    masks[ns] = tgt[lo];
                    ids[ns++] = lily_gbuild_state(b, (tgt[lo] & END_BIT) != 0);
                }
                lily_gbuild_edge(b, ids[q], lo, hi, ids[k]);
            }
            lo = hi + 1;
        }
    }
    return ids[0];
}

int32_t lily_dfa_literal(lily_gbuild *b, const char *s, size_t n) {
    const char *const ss[1] = {s};
    return lily_dfa_literals(b, ss, &n, 1);
}

/* ---- literal sets: a trie over the sorted strings ------------------------------------------ */

typedef struct lit {
    const unsigned char *p;
    size_t n;
} lit;

static int lit_cmp(const void *pa, const void *pb) {
    const lit *a = pa, *b = pb;
    size_t m = a->n < b->n ? a->n : b->n;
    int c = m ? memcmp(a->p, b->p, m) : 0;
    if (c) return c;
    return a->n < b->n ? -1 : a->n > b->n;
}

/* Emits the edges below `state` for the sorted strings v[lo..hi), which share their first d
 * bytes. Strings of length exactly d come first (sorted) and are already accounted for. */
static void lit_emit(lily_gbuild *b, int32_t state, const lit *v, size_t lo, size_t hi, size_t d) {
    while (lo < hi && v[lo].n == d)
        lo++;
    while (lo < hi) {
        unsigned c = v[lo].p[d];
        size_t end = lo;
        while (end < hi && v[end].p[d] == c)
            end++;
        int acc = 0;
        for (size_t i = lo; i < end && v[i].n <= d + 1; i++)
            acc |= v[i].n == d + 1;
        int32_t child = lily_gbuild_state(b, acc);
        if (lily_gbuild_too_big(b)) return;
        lily_gbuild_edge(b, state, c, c, child);
        lit_emit(b, child, v, lo, end, d + 1);
        lo = end;
    }
}

int32_t lily_dfa_literals(lily_gbuild *b, const char *const *s, const size_t *n, size_t count) {
    LILY_ASSERT(count > 0);
    lit *v = lily_xmalloc(count * sizeof *v);
    int acc = 0;
    for (size_t i = 0; i < count; i++) {
        v[i] = (lit){(const unsigned char *)s[i], n[i]};
        acc |= n[i] == 0;
    }
    qsort(v, count, sizeof *v, lit_cmp);
    int32_t start = lily_gbuild_state(b, acc);
    lit_emit(b, start, v, 0, count, 0);
    free(v);
    return start;
}

/* ---- JSON strings -------------------------------------------------------------------------- */

enum { S_M, S_ESC, S_U1, S_U2, S_U3, S_U4, S_C1, S_C2, S_C3, S_E0, S_ED, S_F0, S_F4, S_COUNT };

static void hex_edges(lily_gbuild *b, int32_t from, int32_t to) {
    lily_gbuild_edge(b, from, '0', '9', to);
    lily_gbuild_edge(b, from, 'A', 'F', to);
    lily_gbuild_edge(b, from, 'a', 'f', to);
}

/* The inner states of one character count c; m_next is the main state after one more char. */
static void string_level(lily_gbuild *b, const int32_t *s, int32_t m_next) {
    lily_gbuild_edge(b, s[S_M], 0x20, 0x21, m_next);
    lily_gbuild_edge(b, s[S_M], 0x23, 0x5B, m_next);
    lily_gbuild_edge(b, s[S_M], 0x5C, 0x5C, s[S_ESC]);
    lily_gbuild_edge(b, s[S_M], 0x5D, 0x7F, m_next);
    lily_gbuild_edge(b, s[S_M], 0xC2, 0xDF, s[S_C1]);
    lily_gbuild_edge(b, s[S_M], 0xE0, 0xE0, s[S_E0]);
    lily_gbuild_edge(b, s[S_M], 0xE1, 0xEC, s[S_C2]);
    lily_gbuild_edge(b, s[S_M], 0xED, 0xED, s[S_ED]);
    lily_gbuild_edge(b, s[S_M], 0xEE, 0xEF, s[S_C2]);
    lily_gbuild_edge(b, s[S_M], 0xF0, 0xF0, s[S_F0]);
    lily_gbuild_edge(b, s[S_M], 0xF1, 0xF3, s[S_C3]);
    lily_gbuild_edge(b, s[S_M], 0xF4, 0xF4, s[S_F4]);
    static const char esc[] = "\"\\/bfnrt";
    for (const char *p = esc; *p; p++)
        lily_gbuild_edge(b, s[S_ESC], (unsigned char)*p, (unsigned char)*p, m_next);
    lily_gbuild_edge(b, s[S_ESC], 'u', 'u', s[S_U1]);
    hex_edges(b, s[S_U1], s[S_U2]);
    hex_edges(b, s[S_U2], s[S_U3]);
    hex_edges(b, s[S_U3], s[S_U4]);
    hex_edges(b, s[S_U4], m_next);
    lily_gbuild_edge(b, s[S_C1], 0x80, 0xBF, m_next);
    lily_gbuild_edge(b, s[S_C2], 0x80, 0xBF, s[S_C1]);
    lily_gbuild_edge(b, s[S_C3], 0x80, 0xBF, s[S_C2]);
    lily_gbuild_edge(b, s[S_E0], 0xA0, 0xBF, s[S_C1]);
    lily_gbuild_edge(b, s[S_ED], 0x80, 0x9F, s[S_C1]);
    lily_gbuild_edge(b, s[S_F0], 0x90, 0xBF, s[S_C2]);
    lily_gbuild_edge(b, s[S_F4], 0x80, 0x8F, s[S_C2]);
}

int32_t lily_dfa_json_string(lily_gbuild *b, int min_chars, int max_chars) {
    LILY_ASSERT(min_chars >= 0 && (max_chars < 0 || max_chars >= min_chars));
    int levels = max_chars >= 0 ? max_chars + 1 : min_chars + 1;
    int32_t start = lily_gbuild_state(b, 0), quote = lily_gbuild_state(b, 1);
    int32_t *st = lily_xmalloc((size_t)levels * S_COUNT * sizeof *st);
    for (int c = 0; c < levels && !lily_gbuild_too_big(b); c++) {
        int has_next = c + 1 < levels || max_chars < 0;
        st[c * S_COUNT + S_M] = lily_gbuild_state(b, 0);
        for (int k = 1; k < S_COUNT; k++)
            st[c * S_COUNT + k] = has_next ? lily_gbuild_state(b, 0) : 0;
    }
    if (!lily_gbuild_too_big(b)) {
        lily_gbuild_edge(b, start, '"', '"', st[S_M]);
        for (int c = 0; c < levels; c++) {
            const int32_t *s = st + c * S_COUNT;
            if (c >= min_chars) lily_gbuild_edge(b, s[S_M], '"', '"', quote);
            if (c + 1 < levels)
                string_level(b, s, st[(c + 1) * S_COUNT + S_M]);
            else if (max_chars < 0)
                string_level(b, s, s[S_M]);
        }
    }
    free(st);
    return start;
}

/* ---- raw text (the XML tool-call form's parameter values) ---------------------------------- */

enum { R_C1, R_C2, R_C3, R_E0, R_ED, R_F0, R_F4, R_COUNT };

/* A byte table's edges from state `from`: runs of one target become one edge (0: none). */
static void table_edges(lily_gbuild *b, int32_t from, const int32_t *tgt) {
    for (unsigned lo = 0; lo < 256;) {
        unsigned hi = lo;
        while (hi + 1 < 256 && tgt[hi + 1] == tgt[lo])
            hi++;
        if (tgt[lo]) lily_gbuild_edge(b, from, lo, hi, tgt[lo]);
        lo = hi + 1;
    }
}

/* tgt[c] for the lead bytes of multi-byte UTF-8 characters (u: their continuation states) */
static void utf8_leads(const int32_t *u, int32_t *tgt) {
    for (unsigned c = 0xC2; c <= 0xF4; c++)
        tgt[c] = c <= 0xDF   ? u[R_C1]
                 : c == 0xE0 ? u[R_E0]
                 : c == 0xED ? u[R_ED]
                 : c <= 0xEF ? u[R_C2]
                 : c == 0xF0 ? u[R_F0]
                 : c <= 0xF3 ? u[R_C3]
                             : u[R_F4];
}

/* the continuation states' edges, once per set: a character's last byte leads to done */
static void utf8_tails(lily_gbuild *b, const int32_t *u, int32_t done) {
    lily_gbuild_edge(b, u[R_C1], 0x80, 0xBF, done);
    lily_gbuild_edge(b, u[R_C2], 0x80, 0xBF, u[R_C1]);
    lily_gbuild_edge(b, u[R_C3], 0x80, 0xBF, u[R_C2]);
    lily_gbuild_edge(b, u[R_E0], 0xA0, 0xBF, u[R_C1]);
    lily_gbuild_edge(b, u[R_ED], 0x80, 0x9F, u[R_C1]);
    lily_gbuild_edge(b, u[R_F0], 0x90, 0xBF, u[R_C2]);
    lily_gbuild_edge(b, u[R_F4], 0x80, 0x8F, u[R_C2]);
}

static int text_byte(unsigned c) { /* the ASCII a raw text may hold */
    return c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c < 0x80);
}

static void new_states(lily_gbuild *b, int32_t *u, int n) {
    for (int i = 0; i < n; i++)
        u[i] = lily_gbuild_state(b, 0);
}

/* Unbounded, no minimum: the stop string's prefix matched so far (KMP over its bytes) is the
 * state; a multi-byte character resets it (the stop string is ASCII). */
static int32_t raw_unbounded(lily_gbuild *b, const char *stop, size_t n) {
    int32_t *k = lily_xmalloc(n * sizeof *k), u[R_COUNT];
    for (size_t i = 0; i < n; i++)
        k[i] = lily_gbuild_state(b, 1);
    new_states(b, u, R_COUNT);
    for (size_t i = 0; i < n; i++) {
        int32_t tgt[256] = {0};
        for (unsigned c = 0; c < 0x80; c++) {
            if (!text_byte(c)) continue;
            /* the longest prefix of stop that ends stop[0..i) + c */
            size_t m = i + 1;
            while (m > 0) {
                size_t off = i + 1 - m;
                if ((unsigned char)stop[m - 1] == c && (m == 1 || !memcmp(stop, stop + off, m - 1)))
                    break;
                m--;
            }
            if (m < n) tgt[c] = k[m];
        }
        utf8_leads(u, tgt);
        table_edges(b, k[i], tgt);
    }
    utf8_tails(b, u, k[0]);
    int32_t start = k[0];
    free(k);
    return start;
}

int32_t lily_dfa_raw_text(lily_gbuild *b, int min_chars, int max_chars, const char *stop) {
    const size_t n = strlen(stop);
    LILY_ASSERT(n > 0 && min_chars >= 0 && (max_chars < 0 || max_chars >= min_chars));
    if (max_chars < 0 && min_chars == 0) return raw_unbounded(b, stop, n);
    /* counted: one main state per character count (the last loops when unbounded), each with
     * its own continuation states; the stop string's first byte never appears */
    const int levels = max_chars >= 0 ? max_chars + 1 : min_chars + 1;
    int32_t *m = lily_xmalloc((size_t)levels * sizeof *m);
    for (int c = 0; c < levels; c++)
        m[c] = lily_gbuild_state(b, c >= min_chars);
    for (int c = 0; c < levels && !lily_gbuild_too_big(b); c++) {
        const int32_t next = c + 1 < levels ? m[c + 1] : max_chars < 0 ? m[c] : 0;
        if (!next) break;
        int32_t tgt[256] = {0}, u[R_COUNT];
        for (unsigned x = 0; x < 0x80; x++)
            if (text_byte(x) && x != (unsigned char)stop[0]) tgt[x] = next;
        new_states(b, u, R_COUNT);
        utf8_leads(u, tgt);
        table_edges(b, m[c], tgt);
        utf8_tails(b, u, next);
    }
    int32_t start = m[0];
    free(m);
    return start;
}
