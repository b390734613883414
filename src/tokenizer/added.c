/* Added-token matching (see added.h). */
#include "tokenizer/added.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/err.h"

void lily_added_add(lily_added_set *s, const lily_added_tok *t, const char *content) {
    for (size_t i = 0; i < s->n; i++)
        if (s->tok[i].id == t->id) {
            uint32_t off = s->tok[i].off, len = s->tok[i].len;
            s->tok[i] = *t;
            s->tok[i].off = off;
            s->tok[i].len = len;
            return;
        }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 32;
        s->tok = lily_xrealloc(s->tok, s->cap * sizeof *s->tok);
    }
    lily_added_tok *d = &s->tok[s->n++];
    *d = *t;
    d->off = (uint32_t)s->strs.n;
    lily_u8buf_put(&s->strs, content, t->len);
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

void lily_added_finish(lily_added_set *s, int skip_special) {
    for (int g = 0; g < 2; g++) {
        free(s->grp[g].order);
        s->grp[g].order = lily_xmalloc((s->n + 1) * sizeof *s->grp[g].order);
        /* Sort keys: first byte, then longest first, then insertion order. */
        uint64_t *key = lily_xmalloc((s->n + 1) * sizeof *key);
        size_t k = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (s->tok[i].normalized != g) continue;
            if (skip_special && s->tok[i].special) continue;
            uint64_t first = s->strs.p[s->tok[i].off];
            key[k++] = first << 56 | (uint64_t)(0xFFFFFFu - s->tok[i].len) << 32 | i;
        }
        qsort(key, k, sizeof *key, cmp_u64);
        for (size_t i = 0; i < k; i++)
            s->grp[g].order[i] = (uint32_t)key[i];
        s->grp[g].n = k;
        uint32_t *start = s->grp[g].start;
        memset(start, 0, sizeof s->grp[g].start);
        for (size_t i = 0; i < k; i++)
            start[(key[i] >> 56) + 1]++;
        for (int b = 0; b < 256; b++)
            start[b + 1] += start[b];
        s->grp[g].one_first = k > 0;
        if (k) s->grp[g].first = (unsigned char)(key[0] >> 56);
        for (size_t i = 0; i < k; i++)
            if ((unsigned char)(key[i] >> 56) != s->grp[g].first) s->grp[g].one_first = 0;
        free(key);
    }
}

/* The code point ending just before t[end] (t valid UTF-8, end > 0); *start gets its offset. */
static uint32_t cp_before(const char *t, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)t[i] & 0xC0) == 0x80)
        i--;
    uint32_t cp;
    lily_utf8_decode((const unsigned char *)t + i, &cp);
    *start = i;
    return cp;
}

static int is_word_cp(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

int lily_added_next(const lily_added_set *s, int g, const char *t, size_t n, size_t from,
                    size_t *ms, size_t *me, int32_t *id) {
    if (!s->grp[g].n) return 0;
    const uint32_t *start = s->grp[g].start, *order = s->grp[g].order;
    size_t i = from;
    while (i < n) {
        if (s->grp[g].one_first) {
            const char *p = memchr(t + i, s->grp[g].first, n - i);
            if (!p) return 0;
            i = (size_t)(p - t);
        }
        unsigned char b = (unsigned char)t[i];
        const lily_added_tok *hit = NULL;
        for (uint32_t j = start[b]; j < start[b + 1]; j++) {
            const lily_added_tok *c = &s->tok[order[j]];
            if (c->len <= n - i && !memcmp(t + i, s->strs.p + c->off, c->len)) {
                hit = c;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t a = i, z = i + hit->len;
        if (hit->single_word) {
            size_t dummy;
            int word_before = a > 0 && is_word_cp(cp_before(t, a, &dummy));
            uint32_t next = 0;
            if (z < n) lily_utf8_decode((const unsigned char *)t + z, &next);
            if (word_before || (z < n && is_word_cp(next))) {
                i = z; /* the rejected match still consumes its span, as in HF */
                continue;
            }
        }
        if (hit->lstrip) {
            while (a > from) {
                size_t prev;
                if (!lily_utf8_is_space(cp_before(t, a, &prev))) break;
                a = prev;
            }
        }
        if (hit->rstrip) {
            while (z < n) {
                uint32_t cp;
                int k = lily_utf8_decode((const unsigned char *)t + z, &cp);
                if (!lily_utf8_is_space(cp)) break;
                z += (size_t)k;
            }
        }
        *ms = a;
        *me = z;
        *id = hit->id;
        return 1;
    }
    return 0;
}

void lily_added_free(lily_added_set *s) {
    free(s->tok);
    lily_u8buf_free(&s->strs);
    free(s->grp[0].order);
    free(s->grp[1].order);
    memset(s, 0, sizeof *s);
}
