/* Token table and byte-level alphabet (see vocab.h). */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tokenizer/hash.h"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68 bytes
 * (controls, space, DEL, NBSP, soft hyphen...) are moved, in byte order, to U+0100 upwards. */
static int printable_byte(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t lily_bytelevel_cp(unsigned b) {
    if (printable_byte(b)) return b;
    uint32_t k = 0;
    for (unsigned c = 0; c < b; c++)
        k += !printable_byte(c);
    return 256 + k;
}

int lily_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable_byte(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (unsigned c = 0; c < 256; c++)
        if (!printable_byte(c) && k-- == 0) return (int)c;
    return -1;
}

static const char *tok_str(const lily_vocab *v, int32_t id, size_t *n) {
    *n = v->str_len[id];
    return (const char *)v->strs.p + v->str_off[id];
}

typedef struct lily_vocab_map vocab_map;

static void map_insert(const lily_vocab *v, vocab_map *m, int32_t id) {
    size_t n;
    const char *s = tok_str(v, id, &n);
    size_t mask = m->cap - 1, i = (size_t)lily_tok_hash(s, n) & mask;
    while (m->slot[i])
        i = (i + 1) & mask;
    m->slot[i] = (uint32_t)id + 1;
    m->count++;
}

static void map_grow(const lily_vocab *v, vocab_map *m) {
    size_t old_cap = m->cap;
    uint32_t *old = m->slot;
    m->cap = old_cap ? old_cap * 2 : 1024;
    m->slot = lily_xcalloc(m->cap, sizeof *m->slot);
    m->count = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) map_insert(v, m, (int32_t)old[i] - 1);
    free(old);
}

static int32_t map_find(const lily_vocab *v, const vocab_map *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    size_t mask = m->cap - 1, i = (size_t)lily_tok_hash(s, n) & mask;
    while (m->slot[i]) {
        int32_t id = (int32_t)m->slot[i] - 1;
        if (v->str_len[id] == n && !memcmp(v->strs.p + v->str_off[id], s, n)) return id;
        i = (i + 1) & mask;
    }
    return -1;
}

int32_t lily_vocab_find(const lily_vocab *v, const char *s, size_t n) {
    return map_find(v, &v->model_map, s, n);
}

int32_t lily_vocab_find_any(const lily_vocab *v, const char *s, size_t n) {
    int32_t id = map_find(v, &v->added_map, s, n);
    return id >= 0 ? id : map_find(v, &v->model_map, s, n);
}

static void grow_ids(lily_vocab *v, size_t need) {
    size_t cap = v->cap_ids ? v->cap_ids : 1024;
    while (cap < need)
        cap *= 2;
    v->str_off = lily_xrealloc(v->str_off, cap * sizeof *v->str_off);
    v->str_len = lily_xrealloc(v->str_len, cap * sizeof *v->str_len);
    v->flags = lily_xrealloc(v->flags, cap);
    memset(v->flags + v->cap_ids, 0, cap - v->cap_ids);
    v->cap_ids = cap;
}

int lily_vocab_add(lily_vocab *v, int32_t id, const char *s, size_t n, unsigned flags,
                   lily_err *e) {
    /* Real vocabularies stay below 2^18; the bound keeps a corrupt id from allocating tables
     * for two billion entries. */
    if (id < 0 || id >= LILY_VOCAB_MAX_ID)
        return lily_fail(e, "token id %d out of range [0, %d)", (int)id, LILY_VOCAB_MAX_ID);
    if (n == 0) return lily_fail(e, "token id %d is an empty string", (int)id);
    if (n > 65535) return lily_fail(e, "token id %d is %zu bytes long", (int)id, n);
    if ((size_t)id >= v->cap_ids) grow_ids(v, (size_t)id + 1);
    vocab_map *m = (flags & LILY_VOCAB_ADDED) ? &v->added_map : &v->model_map;
    int32_t other = map_find(v, m, s, n);
    if (v->flags[id] & LILY_VOCAB_PRESENT) {
        size_t m0;
        const char *t0 = tok_str(v, id, &m0);
        if (m0 == n && !memcmp(t0, s, n)) {
            /* An added token repeating a model token: findable as added from now on. */
            if ((flags & LILY_VOCAB_ADDED) && other < 0) {
                if ((m->count + 1) * 2 > m->cap) map_grow(v, m);
                map_insert(v, m, id);
            }
            v->flags[id] |= (uint8_t)flags;
            return 0;
        }
        size_t m;
        const char *t = tok_str(v, id, &m);
        return lily_fail(e, "token id %d is both '%.*s' and '%.*s'", (int)id, (int)m, t, (int)n, s);
    }
    if (other >= 0)
        return lily_fail(e, "token '%.*s' has two ids (%d and %d)", (int)n, s, (int)other, (int)id);
    if (v->strs.n + n > UINT32_MAX) return lily_fail(e, "vocabulary strings exceed 4 GiB");
    v->str_off[id] = (uint32_t)v->strs.n;
    v->str_len[id] = (uint32_t)n;
    lily_u8buf_put(&v->strs, s, n);
    v->flags[id] = (uint8_t)(flags | LILY_VOCAB_PRESENT);
    if (id >= v->n) v->n = id + 1;
    if ((m->count + 1) * 2 > m->cap) map_grow(v, m);
    map_insert(v, m, id);
    return 0;
}

void lily_vocab_finish(lily_vocab *v) {
    int rev[0x144];
    for (uint32_t cp = 0; cp < 0x144; cp++)
        rev[cp] = lily_bytelevel_byte(cp);
    v->dec_off = lily_xcalloc(v->cap_ids, sizeof *v->dec_off);
    v->dec_len = lily_xcalloc(v->cap_ids, sizeof *v->dec_len);
    for (int32_t id = 0; id < v->n; id++) {
        if (!(v->flags[id] & LILY_VOCAB_PRESENT)) continue;
        size_t n;
        const unsigned char *s = (const unsigned char *)tok_str(v, id, &n);
        size_t start = v->decs.n, i = 0;
        int mapped = lily_utf8_valid_prefix(s, n) == n;
        while (mapped && i < n) {
            uint32_t cp;
            i += (size_t)lily_utf8_decode(s + i, &cp);
            if (cp >= 0x144 || rev[cp] < 0) {
                mapped = 0;
                break;
            }
            unsigned char b = (unsigned char)rev[cp];
            lily_u8buf_put(&v->decs, &b, 1);
        }
        if (!mapped) {
            v->decs.n = start;
            lily_u8buf_put(&v->decs, s, n);
        }
        v->dec_off[id] = (uint32_t)start;
        v->dec_len[id] = (uint32_t)(v->decs.n - start);
    }
}

void lily_vocab_free(lily_vocab *v) {
    free(v->str_off);
    free(v->str_len);
    free(v->dec_off);
    free(v->dec_len);
    free(v->flags);
    free(v->model_map.slot);
    free(v->added_map.slot);
    lily_u8buf_free(&v->strs);
    lily_u8buf_free(&v->decs);
    memset(v, 0, sizeof *v);
}
