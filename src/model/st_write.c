/* Safetensors header building and whole-file writing; see st_write.h. */
#include "model/st_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

uint64_t lily_st_entry_bytes(const lily_st_entry *t) {
    uint64_t n = lily_st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

typedef struct {
    char *p;
    size_t len, cap;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap)
            b->cap = b->cap ? 2 * b->cap : 4096;
        b->p = lily_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(sbuf *b, const char *s) {
    put(b, s, strlen(s));
}

/* A JSON string literal (names are ASCII in practice; anything else is escaped). */
static void put_json_str(sbuf *b, const char *s) {
    puts_(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(b, esc);
        } else {
            put(b, (const char *)&c, 1);
        }
    }
    puts_(b, "\"");
}

unsigned char *lily_st_header(const lily_st_entry *t, int n, size_t *len) {
    sbuf b = {0};
    char num[128];
    put(&b, "\0\0\0\0\0\0\0\0", 8);
    puts_(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        puts_(&b, ",");
        put_json_str(&b, t[i].name);
        puts_(&b, ":{\"dtype\":\"");
        puts_(&b, lily_st_dtype_name(t[i].dtype));
        puts_(&b, "\",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            puts_(&b, num);
        }
        uint64_t nb = lily_st_entry_bytes(&t[i]);
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + nb));
        puts_(&b, num);
        off += nb;
    }
    puts_(&b, "}");
    while (b.len % 8)
        puts_(&b, " ");
    uint64_t hl = b.len - 8;
    for (int i = 0; i < 8; i++)
        b.p[i] = (char)(hl >> (8 * i));
    *len = b.len;
    return (unsigned char *)b.p;
}

int lily_st_write_file(const char *path, const lily_st_entry *t, const void *const *data, int n,
                       lily_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return lily_fail(err, "%s: cannot create: %s", path, strerror(errno));
    size_t hl;
    unsigned char *h = lily_st_header(t, n, &hl);
    int ok = fwrite(h, 1, hl, f) == hl;
    free(h);
    for (int i = 0; ok && i < n; i++) {
        size_t nb = (size_t)lily_st_entry_bytes(&t[i]);
        ok = nb == 0 || fwrite(data[i], 1, nb, f) == nb;
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : lily_fail(err, "%s: write failed: %s", path, strerror(errno));
}
