/* UTF-8 validation, decoding and lossy repair for the tokenizer (see utf8.h). */
#include "tokenizer/utf8.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void lily_u8buf_put(lily_u8buf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        b->p = lily_xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

void lily_u8buf_free(lily_u8buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

void lily_ids_push(lily_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->p = lily_xrealloc(v->p, v->cap * sizeof *v->p);
    }
    v->p[v->n++] = id;
}

/* Classifies the sequence starting at s[0] (n >= 1 bytes available). Returns the length of a
 * complete valid character with *bad = 0; or the length of the maximal invalid subpart with
 * *bad = 1; or 0 when s[0..n) is a valid but incomplete prefix. The second-byte ranges exclude
 * overlongs (E0, F0), surrogates (ED) and code points above U+10FFFF (F4). */
static size_t seq_len(const unsigned char *s, size_t n, int *bad) {
    unsigned c = s[0];
    *bad = 0;
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 1;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) return 0;
        if (s[i] < lo || s[i] > hi) {
            *bad = 1;
            return i;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

size_t lily_utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII runs are the common case: skip them eight bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int bad;
        size_t k = seq_len(s + i, n - i, &bad);
        if (k == 0 || bad) return i;
        i += k;
    }
    return n;
}

int lily_utf8_decode(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}

int lily_utf8_encode(uint32_t cp, unsigned char out[4]) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int lily_utf8_is_space(uint32_t cp) {
    if (cp == 0x20 || (cp >= 0x09 && cp <= 0x0D)) return 1;
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t lily_utf8_lossy(const unsigned char *s, size_t n, int final, lily_u8buf *out) {
    static const unsigned char fffd[3] = {0xEF, 0xBF, 0xBD};
    if (!n) return 0;      /* s may be NULL then */
    size_t i = 0, run = 0; /* [run, i) is valid text not yet copied */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int bad;
        size_t k = seq_len(s + i, n - i, &bad);
        if (k && !bad) {
            i += k;
            continue;
        }
        lily_u8buf_put(out, s + run, i - run);
        if (k == 0) { /* incomplete tail */
            if (!final) return i;
            lily_u8buf_put(out, fffd, 3);
            return n;
        }
        lily_u8buf_put(out, fffd, 3);
        i += k;
        run = i;
    }
    lily_u8buf_put(out, s + run, i - run);
    return n;
}

static int hex4(const char *s, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

int lily_utf8_json_string(const char *s, size_t n, lily_u8buf *out) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
        i++;
    if (i >= n || s[i] != '"') return -1;
    i++;
    for (;;) {
        if (i >= n) return -1;
        unsigned char c = (unsigned char)s[i];
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c != '\\') {
            size_t k = i;
            while (k < n && s[k] != '"' && s[k] != '\\' && (unsigned char)s[k] >= 0x20)
                k++;
            lily_u8buf_put(out, s + i, k - i);
            i = k;
            continue;
        }
        if (i + 1 >= n) return -1;
        char d = s[i + 1];
        static const char esc[] = "\"\\/bfnrt", map[] = "\"\\/\b\f\n\r\t";
        const char *simple = d ? strchr(esc, d) : NULL;
        if (simple) {
            lily_u8buf_put(out, &map[simple - esc], 1);
            i += 2;
            continue;
        }
        uint32_t cp, lo;
        if (d != 'u' || i + 6 > n || hex4(s + i + 2, &cp)) return -1;
        i += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i + 6 > n || s[i] != '\\' || s[i + 1] != 'u' || hex4(s + i + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return -1;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        }
        unsigned char u[4];
        lily_u8buf_put(out, u, (size_t)lily_utf8_encode(cp, u));
    }
    i++;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
        i++;
    return i == n ? 0 : -1;
}
