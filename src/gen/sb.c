/* Growable byte strings (see sb.h). */
#include "gen/sb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static void reserve(lily_sb *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->data = lily_xrealloc(b->data, cap);
    b->cap = cap;
}

void lily_sb_append(lily_sb *b, const char *s, size_t n) {
    reserve(b, n);
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void lily_sb_puts(lily_sb *b, const char *s) {
    lily_sb_append(b, s, strlen(s));
}

void lily_sb_putc(lily_sb *b, char c) {
    lily_sb_append(b, &c, 1);
}

void lily_sb_printf(lily_sb *b, const char *fmt, ...) {
    char small[256];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof small) {
        lily_sb_append(b, small, (size_t)n);
    } else if (n > 0) {
        reserve(b, (size_t)n);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void lily_sb_json_esc(lily_sb *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        lily_sb_append(b, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': lily_sb_append(b, "\\\"", 2); break;
        case '\\': lily_sb_append(b, "\\\\", 2); break;
        case '\n': lily_sb_append(b, "\\n", 2); break;
        case '\r': lily_sb_append(b, "\\r", 2); break;
        case '\t': lily_sb_append(b, "\\t", 2); break;
        case '\b': lily_sb_append(b, "\\b", 2); break;
        case '\f': lily_sb_append(b, "\\f", 2); break;
        default: {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            lily_sb_append(b, u, 6);
        }
        }
    }
    lily_sb_append(b, s + run, n - run);
}

void lily_sb_json_str(lily_sb *b, const char *s, size_t n) {
    lily_sb_putc(b, '"');
    lily_sb_json_esc(b, s, n);
    lily_sb_putc(b, '"');
}

void lily_sb_drop_front(lily_sb *b, size_t n) {
    if (n >= b->len) {
        lily_sb_clear(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

void lily_sb_clear(lily_sb *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

const char *lily_sb_str(const lily_sb *b) {
    return b->data ? b->data : "";
}

char *lily_sb_take(lily_sb *b) {
    char *p = b->data ? b->data : lily_xstrdup("");
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void lily_sb_free(lily_sb *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
