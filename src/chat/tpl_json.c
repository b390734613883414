/* JSON parsing into template values and json.dumps-compatible output (see tpl_json.h). */
#include "chat/tpl_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parser ----------------------------------------------------------------------------- */

typedef struct jp {
    tpl_rt *rt;
    const char *s;
    size_t n, i;
    int depth;
    char *err;
    size_t errlen;
} jp;

#define JP_MAX_DEPTH 500

static int jp_fail(jp *p, const char *what) {
    snprintf(p->err, p->errlen, "bad JSON at byte %zu: %s", p->i, what);
    return -1;
}

static void jp_ws(jp *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int jp_string(jp *p, tpl_val *out) {
    p->i++; /* opening quote */
    tpl_buf b = {0};
    size_t start = p->i;
    while (1) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') break;
        if (c < 0x20) return jp_fail(p, "control character in string");
        if (c != '\\') {
            p->i++;
            continue;
        }
        tpl_buf_put(p->rt, &b, p->s + start, p->i - start);
        if (p->i + 1 >= p->n) return jp_fail(p, "unterminated escape");
        char e = p->s[p->i + 1];
        p->i += 2;
        const char *map = "\"\"\\\\//b\bf\fn\nr\rt\t";
        const char *m = NULL;
        for (const char *q = map; *q; q += 2)
            if (*q == e) m = q;
        if (m) {
            tpl_buf_putc(p->rt, &b, m[1]);
        } else if (e == 'u') {
            unsigned u, lo;
            if (p->i + 4 > p->n || hex4(p->s + p->i, &u)) return jp_fail(p, "bad \\u escape");
            p->i += 4;
            if (u >= 0xd800 && u < 0xdc00 && p->i + 6 <= p->n && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u' && !hex4(p->s + p->i + 2, &lo) && lo >= 0xdc00 &&
                lo < 0xe000) {
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                p->i += 6;
            } else if (u >= 0xd800 && u < 0xe000) {
                u = 0xfffd; /* a lone surrogate cannot be written as UTF-8 */
            }
            char enc[4];
            tpl_buf_put(p->rt, &b, enc, tpl_utf8_put((int32_t)u, enc));
        } else {
            return jp_fail(p, "bad escape");
        }
        start = p->i;
    }
    tpl_buf_put(p->rt, &b, p->s + start, p->i - start);
    p->i++;
    *out = b.n ? tpl_buf_val(&b) : tpl_str_ref("", 0);
    return 0;
}

static int jp_number(jp *p, tpl_val *out) {
    size_t st = p->i;
    int is_float = 0;
    if (p->s[p->i] == '-') p->i++;
    if (p->i < p->n && p->s[p->i] == 'I') {
        if (p->n - p->i < 8 || memcmp(p->s + p->i, "Infinity", 8)) return jp_fail(p, "bad value");
        p->i += 8;
        *out = tpl_float(p->s[st] == '-' ? -INFINITY : INFINITY);
        return 0;
    }
    size_t digits = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++, digits++;
    if (!digits) return jp_fail(p, "bad number");
    if (p->i < p->n && p->s[p->i] == '.') {
        is_float = 1;
        p->i++;
        digits = 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++, digits++;
        if (!digits) return jp_fail(p, "bad number");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        is_float = 1;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        digits = 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++, digits++;
        if (!digits) return jp_fail(p, "bad number");
    }
    char tmp[64];
    size_t len = p->i - st;
    if (len >= sizeof tmp) {
        /* Too long for an int64 anyway; keep it as a float. */
        char *big = tpl_alloc(p->rt, len + 1);
        memcpy(big, p->s + st, len);
        *out = tpl_float(strtod(big, NULL));
        return 0;
    }
    memcpy(tmp, p->s + st, len);
    tmp[len] = 0;
    if (!is_float) {
        errno = 0;
        long long v = strtoll(tmp, NULL, 10);
        if (errno != ERANGE) {
            *out = tpl_int(v);
            return 0;
        }
    }
    *out = tpl_float(strtod(tmp, NULL));
    return 0;
}

static int jp_value(jp *p, tpl_val *out);

static int jp_array(jp *p, tpl_val *out) {
    p->i++;
    *out = tpl_new_list(p->rt, 0);
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        return 0;
    }
    while (1) {
        tpl_val v;
        if (jp_value(p, &v)) return -1;
        tpl_list_push(p->rt, out->l, v);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return 0;
        }
        return jp_fail(p, "expected ',' or ']'");
    }
}

static int jp_object(jp *p, tpl_val *out) {
    p->i++;
    *out = tpl_new_dict(p->rt, 0);
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return 0;
    }
    while (1) {
        tpl_val k, v;
        jp_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a key string");
        if (jp_string(p, &k)) return -1;
        jp_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
        p->i++;
        if (jp_value(p, &v)) return -1;
        tpl_dict_set(p->rt, out->d, k, v);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return 0;
        }
        return jp_fail(p, "expected ',' or '}'");
    }
}

static int jp_lit(jp *p, const char *word, tpl_val v, tpl_val *out) {
    size_t n = strlen(word);
    if (p->n - p->i < n || memcmp(p->s + p->i, word, n)) return jp_fail(p, "bad value");
    p->i += n;
    *out = v;
    return 0;
}

static int jp_value(jp *p, tpl_val *out) {
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    if (++p->depth > JP_MAX_DEPTH) return jp_fail(p, "nested too deeply");
    int rc;
    char c = p->s[p->i];
    if (c == '{')
        rc = jp_object(p, out);
    else if (c == '[')
        rc = jp_array(p, out);
    else if (c == '"')
        rc = jp_string(p, out);
    else if (c == 't')
        rc = jp_lit(p, "true", tpl_bool(1), out);
    else if (c == 'f')
        rc = jp_lit(p, "false", tpl_bool(0), out);
    else if (c == 'n')
        rc = jp_lit(p, "null", tpl_none(), out);
    else if (c == 'N')
        rc = jp_lit(p, "NaN", tpl_float(NAN), out);
    else if (c == '-' || c == 'I' || (c >= '0' && c <= '9'))
        rc = jp_number(p, out);
    else
        rc = jp_fail(p, "unexpected character");
    p->depth--;
    return rc;
}

int tpl_json_parse(tpl_rt *rt, const char *text, size_t len, tpl_val *out, char *err,
                   size_t errlen) {
    jp p = {.rt = rt, .s = text, .n = len, .err = err, .errlen = errlen};
    if (jp_value(&p, out)) return -1;
    jp_ws(&p);
    if (p.i != p.n) return jp_fail(&p, "extra data after the value");
    return 0;
}

tpl_val tpl_from_cjson(tpl_rt *rt, const cJSON *j) {
    if (!j) return tpl_none();
    if (cJSON_IsBool(j)) return tpl_bool(cJSON_IsTrue(j));
    if (cJSON_IsNull(j)) return tpl_none();
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) return tpl_int((int64_t)d);
        return tpl_float(d);
    }
    if (cJSON_IsString(j)) return tpl_str(rt, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        tpl_val l = tpl_new_list(rt, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next)
            tpl_list_push(rt, l.l, tpl_from_cjson(rt, c));
        return l;
    }
    if (cJSON_IsObject(j)) {
        tpl_val d = tpl_new_dict(rt, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c; c = c->next)
            tpl_dict_set(rt, d.d, tpl_str(rt, c->string, strlen(c->string)), tpl_from_cjson(rt, c));
        return d;
    }
    return tpl_none();
}

/* ---- dumper ----------------------------------------------------------------------------- */

static void dump_str(tpl_rt *rt, tpl_buf *b, const char *p, size_t n, int ascii) {
    tpl_buf_putc(rt, b, '"');
    size_t run = 0; /* bytes copied verbatim, flushed lazily */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[16];
        size_t step = 1;
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80 && ascii) {
            int32_t cp;
            step = tpl_utf8_next(p + i, n - i, &cp);
            if (cp >= 0x10000) {
                unsigned v = (unsigned)cp - 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (v >> 10),
                         0xdc00 + (v & 0x3ff));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
            }
            esc = tmp;
        }
        if (esc) {
            tpl_buf_put(rt, b, p + i - run, run);
            run = 0;
            tpl_buf_puts(rt, b, esc);
        } else {
            run += step;
        }
        i += step;
    }
    tpl_buf_put(rt, b, p + n - run, run);
    tpl_buf_putc(rt, b, '"');
}

static void dump_key(tpl_rt *rt, tpl_buf *b, const tpl_val *k, int ascii) {
    switch (k->kind) {
    case TV_STR: dump_str(rt, b, k->s.p, k->s.n, ascii); return;
    case TV_BOOL: tpl_buf_puts(rt, b, k->b ? "\"true\"" : "\"false\""); return;
    case TV_NONE: tpl_buf_puts(rt, b, "\"null\""); return;
    case TV_INT:
    case TV_FLOAT:
        tpl_buf_putc(rt, b, '"');
        tpl_to_str(rt, b, k);
        tpl_buf_putc(rt, b, '"');
        return;
    default: tpl_raise(rt, "keys must be str, int, float, bool or None, not %s", tpl_type_name(k));
    }
}

static void newline(tpl_rt *rt, tpl_buf *b, const tpl_json_opts *o, int level) {
    tpl_buf_putc(rt, b, '\n');
    for (int i = 0; i < level; i++)
        tpl_buf_puts(rt, b, o->indent);
}

static int key_cmp_rt(tpl_rt *rt, const tpl_val *a, const tpl_val *b) {
    return tpl_compare(rt, a, b, "<");
}

static void dump(tpl_rt *rt, tpl_buf *b, const tpl_val *v, const tpl_json_opts *o, int level) {
    tpl_step(rt);
    if (level > JP_MAX_DEPTH) tpl_raise(rt, "tojson: value nested too deeply");
    const char *isep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    char tmp[64];
    switch (v->kind) {
    case TV_NONE: tpl_buf_puts(rt, b, "null"); return;
    case TV_BOOL: tpl_buf_puts(rt, b, v->b ? "true" : "false"); return;
    case TV_INT: tpl_to_str(rt, b, v); return;
    case TV_FLOAT:
        if (isnan(v->f))
            tpl_buf_puts(rt, b, "NaN");
        else if (isinf(v->f))
            tpl_buf_puts(rt, b, v->f < 0 ? "-Infinity" : "Infinity");
        else {
            tpl_float_repr(v->f, tmp, sizeof tmp);
            tpl_buf_puts(rt, b, tmp);
        }
        return;
    case TV_STR: dump_str(rt, b, v->s.p, v->s.n, o->ensure_ascii); return;
    case TV_LIST:
        if (!v->l->n) {
            tpl_buf_puts(rt, b, "[]");
            return;
        }
        tpl_buf_putc(rt, b, '[');
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) tpl_buf_puts(rt, b, isep);
            if (o->indent) newline(rt, b, o, level + 1);
            dump(rt, b, &v->l->v[i], o, level + 1);
        }
        if (o->indent) newline(rt, b, o, level);
        tpl_buf_putc(rt, b, ']');
        return;
    case TV_DICT: {
        const tpl_dict *d = v->d;
        if (!d->n) {
            tpl_buf_puts(rt, b, "{}");
            return;
        }
        size_t *order = tpl_alloc(rt, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, and dicts here are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i;
                     j > 0 && key_cmp_rt(rt, &d->k[order[j]], &d->k[order[j - 1]]) < 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        tpl_buf_putc(rt, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) tpl_buf_puts(rt, b, isep);
            if (o->indent) newline(rt, b, o, level + 1);
            dump_key(rt, b, &d->k[order[i]], o->ensure_ascii);
            tpl_buf_puts(rt, b, ksep);
            dump(rt, b, &d->v[order[i]], o, level + 1);
        }
        if (o->indent) newline(rt, b, o, level);
        tpl_buf_putc(rt, b, '}');
        return;
    }
    default: tpl_raise(rt, "Object of type %s is not JSON serializable", tpl_type_name(v));
    }
}

void tpl_json_dump(tpl_rt *rt, tpl_buf *b, const tpl_val *v, const tpl_json_opts *o) {
    dump(rt, b, v, o, 0);
}
