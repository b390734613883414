/* JSON / Python-literal normaliser (see jsonnorm.h): a small recursive-descent parser that
 * writes as it reads. */
#include "gen/jsonnorm.h"

#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t n, i;
    int python;
    lily_sb *out;
} parser;

static void skip_ws(parser *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int lit(parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k)) return 0;
    p->i += k;
    return 1;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex(parser *p, int digits, unsigned *v) {
    if (p->n - p->i < (size_t)digits) return -1;
    *v = 0;
    for (int k = 0; k < digits; k++) {
        int h = hexval(p->s[p->i + k]);
        if (h < 0) return -1;
        *v = *v * 16 + (unsigned)h;
    }
    p->i += (size_t)digits;
    return 0;
}

static void put_utf8(lily_sb *b, unsigned cp) {
    char u[4];
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* lone surrogate */
    if (cp < 0x80) {
        u[0] = (char)cp;
        lily_sb_append(b, u, 1);
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        lily_sb_append(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        lily_sb_append(b, u, 3);
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        lily_sb_append(b, u, 4);
    }
}

/* Decodes a string literal (quote char at p->i) and writes it re-escaped. */
static int string(parser *p) {
    char q = p->s[p->i];
    if (q != '"' && !(p->python && q == '\'')) return -1;
    p->i++;
    lily_sb raw = {0};
    int rc = -1;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i++];
        if (c == (unsigned char)q) {
            rc = 0;
            break;
        }
        if (c < 0x20 && !p->python) break;
        if (c != '\\') {
            lily_sb_putc(&raw, (char)c);
            continue;
        }
        if (p->i >= p->n) break;
        char e = p->s[p->i++];
        unsigned v;
        switch (e) {
        case '"': lily_sb_putc(&raw, '"'); continue;
        case '\\': lily_sb_putc(&raw, '\\'); continue;
        case '/': lily_sb_putc(&raw, '/'); continue;
        case 'b': lily_sb_putc(&raw, '\b'); continue;
        case 'f': lily_sb_putc(&raw, '\f'); continue;
        case 'n': lily_sb_putc(&raw, '\n'); continue;
        case 'r': lily_sb_putc(&raw, '\r'); continue;
        case 't': lily_sb_putc(&raw, '\t'); continue;
        case 'u':
            if (read_hex(p, 4, &v)) goto done;
            if (v >= 0xD800 && v <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                unsigned lo;
                p->i += 2;
                if (!read_hex(p, 4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF)
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                else
                    p->i = save;
            }
            put_utf8(&raw, v);
            continue;
        default:
            if (!p->python) goto done;
            if (e == '\'') {
                lily_sb_putc(&raw, '\'');
            } else if (e == 'x') {
                if (read_hex(p, 2, &v)) goto done;
                put_utf8(&raw, v);
            } else { /* Python keeps unknown escapes as written */
                lily_sb_putc(&raw, '\\');
                lily_sb_putc(&raw, e);
            }
        }
    }
done:
    if (!rc) lily_sb_json_str(p->out, lily_sb_str(&raw), raw.len);
    lily_sb_free(&raw);
    return rc;
}

static int digits(parser *p) {
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i > start ? 0 : -1;
}

static int number(parser *p) {
    size_t start = p->i;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n) return -1;
    if (p->s[p->i] == '0') {
        p->i++;
    } else if (digits(p)) {
        return -1;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (digits(p)) return -1;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (digits(p)) return -1;
    }
    lily_sb_append(p->out, p->s + start, p->i - start);
    return 0;
}

static int value(parser *p, int depth);

/* Object or array; close is the closing bracket. */
static int container(parser *p, int depth, char close) {
    lily_sb_putc(p->out, p->s[p->i]);
    p->i++;
    skip_ws(p);
    int first = 1;
    while (1) {
        if (p->i >= p->n) return -1;
        if (p->s[p->i] == close && (first || p->python)) break;
        if (!first) lily_sb_puts(p->out, ", ");
        if (close == '}') {
            if (p->i >= p->n || string(p)) return -1;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return -1;
            p->i++;
            lily_sb_puts(p->out, ": ");
            skip_ws(p);
        }
        if (value(p, depth + 1)) return -1;
        skip_ws(p);
        first = 0;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == close && p->python) {
                /* trailing comma: undo the separator we would have written */
                break;
            }
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) break;
        return -1;
    }
    p->i++;
    lily_sb_putc(p->out, close);
    return 0;
}

static int value(parser *p, int depth) {
    if (depth > MAX_DEPTH || p->i >= p->n) return -1;
    char c = p->s[p->i];
    if (c == '{') return container(p, depth, '}');
    if (c == '[') return container(p, depth, ']');
    if (c == '"' || c == '\'') return string(p);
    if (c == '-' || (c >= '0' && c <= '9')) return number(p);
    if (lit(p, "true") || (p->python && lit(p, "True"))) {
        lily_sb_puts(p->out, "true");
        return 0;
    }
    if (lit(p, "false") || (p->python && lit(p, "False"))) {
        lily_sb_puts(p->out, "false");
        return 0;
    }
    if (lit(p, "null") || (p->python && lit(p, "None"))) {
        lily_sb_puts(p->out, "null");
        return 0;
    }
    return -1;
}

int lily_json_normalize(const char *s, size_t n, int python, lily_sb *out) {
    parser p = {s, n, 0, python, out};
    size_t mark = out->len;
    skip_ws(&p);
    if (value(&p, 0) == 0) {
        skip_ws(&p);
        if (p.i == n) return 0;
    }
    out->len = mark;
    if (out->data) out->data[mark] = 0;
    return -1;
}
