/* Values of the chat-template interpreter: arena, constructors, and the Python semantics of
 * truthiness, equality, ordering, str() and repr() that Jinja2 inherits from Python. */
#include "chat/tpl_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* ---- errors and arena ----------------------------------------------------------------------- */

void tpl_raise(tpl_rt *rt, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->msg, sizeof rt->msg, fmt, ap);
    va_end(ap);
    longjmp(rt->jmp, 1);
}

void tpl_raise_undef(tpl_rt *rt, const tpl_val *v) {
    const char *name = v->kind == TV_UNDEF && v->u.name ? v->u.name : "value";
    if (v->kind == TV_UNDEF && v->u.owner && !strcmp(v->u.owner, "!")) tpl_raise(rt, "%s", name);
    if (v->kind == TV_UNDEF && v->u.owner)
        tpl_raise(rt, "'%s object' has no attribute '%s'", v->u.owner, name);
    tpl_raise(rt, "'%s' is undefined", name);
}

struct tpl_chunk {
    tpl_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define TPL_CHUNK (64 * 1024)

void *tpl_alloc(tpl_rt *rt, size_t n) {
    void *p = tpl_alloc_raw(rt, n);
    memset(p, 0, n);
    return p;
}

void *tpl_alloc_raw(tpl_rt *rt, size_t n) {
    tpl_arena *a = &rt->arena;
    n = (n + 15) & ~(size_t)15;
    tpl_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > TPL_CHUNK / 4 ? n : TPL_CHUNK;
        if (a->limit && a->used + size > a->limit)
            tpl_raise(rt, "template used too much memory (limit %zu bytes)", a->limit);
        c = lily_xmalloc(sizeof *c + size);
        c->size = size;
        c->used = 0;
        a->used += size + sizeof *c;
        /* A big block goes behind the head so the head's free space stays usable. */
        if (size > TPL_CHUNK && a->head) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void tpl_step(tpl_rt *rt) {
    if (++rt->steps > rt->max_steps)
        tpl_raise(rt, "template ran too long (more than %llu steps)",
                  (unsigned long long)rt->max_steps);
}

/* ---- constructors ----------------------------------------------------------------------- */

void tpl_enter(tpl_rt *rt) {
    if (++rt->cdepth > TPL_MAX_CDEPTH)
        tpl_raise(rt, "expression or value nested too deeply (more than %d levels)",
                  TPL_MAX_CDEPTH);
}

tpl_val tpl_undef(const char *name, const char *owner) {
    tpl_val v = {.kind = TV_UNDEF};
    v.u.name = name;
    v.u.owner = owner;
    return v;
}
tpl_val tpl_none(void) {
    return (tpl_val){.kind = TV_NONE};
}
tpl_val tpl_bool(int b) {
    return (tpl_val){.kind = TV_BOOL, .b = b != 0};
}
tpl_val tpl_int(int64_t i) {
    return (tpl_val){.kind = TV_INT, .i = i};
}
tpl_val tpl_float(double f) {
    return (tpl_val){.kind = TV_FLOAT, .f = f};
}

tpl_val tpl_str_ref(const char *p, size_t n) {
    tpl_val v = {.kind = TV_STR};
    v.s.p = p;
    v.s.n = n;
    return v;
}

tpl_val tpl_cstr(const char *s) {
    return tpl_str_ref(s, strlen(s));
}

tpl_val tpl_str(tpl_rt *rt, const char *p, size_t n) {
    char *q = tpl_alloc(rt, n + 1);
    if (n) memcpy(q, p, n);
    return tpl_str_ref(q, n);
}

tpl_val tpl_new_list(tpl_rt *rt, size_t cap) {
    tpl_val v = {.kind = TV_LIST};
    v.l = tpl_alloc(rt, sizeof *v.l);
    if (cap) {
        v.l->v = tpl_alloc(rt, cap * sizeof(tpl_val));
        v.l->cap = cap;
    }
    return v;
}

tpl_val tpl_new_dict(tpl_rt *rt, size_t cap) {
    tpl_val v = {.kind = TV_DICT};
    v.d = tpl_alloc(rt, sizeof *v.d);
    if (cap) {
        v.d->k = tpl_alloc(rt, cap * sizeof(tpl_val));
        v.d->v = tpl_alloc(rt, cap * sizeof(tpl_val));
        v.d->cap = cap;
    }
    return v;
}

void tpl_list_push(tpl_rt *rt, tpl_list *l, tpl_val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tpl_val *nv = tpl_alloc(rt, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

tpl_val *tpl_dict_get(const tpl_dict *d, tpl_val k) {
    for (size_t i = 0; i < d->n; i++)
        if (tpl_equal(&d->k[i], &k)) return &d->v[i];
    return NULL;
}

tpl_val *tpl_dict_getn(const tpl_dict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == TV_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, key, n))
            return &d->v[i];
    return NULL;
}

void tpl_dict_set(tpl_rt *rt, tpl_dict *d, tpl_val k, tpl_val v) {
    tpl_val *old = tpl_dict_get(d, k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        tpl_val *nk = tpl_alloc(rt, cap * sizeof *nk), *nv = tpl_alloc(rt, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

/* ---- Python semantics ------------------------------------------------------------------- */

int tpl_truthy(const tpl_val *v) {
    switch (v->kind) {
    case TV_UNDEF:
    case TV_NONE: return 0;
    case TV_BOOL: return v->b;
    case TV_INT: return v->i != 0;
    case TV_FLOAT: return v->f != 0.0;
    case TV_STR: return v->s.n != 0;
    case TV_LIST: return v->l->n != 0;
    case TV_DICT: return v->d->n != 0;
    default: return 1;
    }
}

static int is_num(const tpl_val *v) {
    return v->kind == TV_BOOL || v->kind == TV_INT || v->kind == TV_FLOAT;
}

static double num_f(const tpl_val *v) {
    return v->kind == TV_FLOAT ? v->f : v->kind == TV_INT ? (double)v->i : (double)v->b;
}

static int64_t num_i(const tpl_val *v) {
    return v->kind == TV_INT ? v->i : v->b;
}

static int equal_depth(const tpl_val *a, const tpl_val *b, int depth);

int tpl_equal(const tpl_val *a, const tpl_val *b) {
    return equal_depth(a, b, 0);
}

/* Values nested deeper than the printer allows cannot be built by a render that finishes, but a
 * bound keeps the recursion safe regardless (beyond it, values compare unequal). */
static int equal_depth(const tpl_val *a, const tpl_val *b, int depth) {
    if (depth > TPL_MAX_CDEPTH) return 0;
    if (is_num(a) && is_num(b)) {
        if (a->kind == TV_FLOAT || b->kind == TV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case TV_UNDEF:
    case TV_NONE: return 1;
    case TV_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
    case TV_LIST:
        if ((a->flags & TV_F_TUPLE) != (b->flags & TV_F_TUPLE) || a->l->n != b->l->n) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal_depth(&a->l->v[i], &b->l->v[i], depth + 1)) return 0;
        return 1;
    case TV_DICT:
        if (a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            tpl_val *o = tpl_dict_get(b->d, a->d->k[i]);
            if (!o || !equal_depth(&a->d->v[i], o, depth + 1)) return 0;
        }
        return 1;
    case TV_NS: return a->d == b->d;
    case TV_MACRO: return a->macro == b->macro;
    case TV_FUNC: return a->func == b->func;
    case TV_LOOP: return a->loop == b->loop;
    case TV_METHOD: return a->m == b->m;
    default: return 0;
    }
}

int tpl_compare(tpl_rt *rt, const tpl_val *a, const tpl_val *b, const char *op) {
    if (a->kind == TV_UNDEF) tpl_raise_undef(rt, a);
    if (b->kind == TV_UNDEF) tpl_raise_undef(rt, b);
    if (is_num(a) && is_num(b)) {
        if (a->kind == TV_FLOAT || b->kind == TV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->kind == TV_STR && b->kind == TV_STR) {
        /* Byte order of UTF-8 is code point order, which is what Python compares. */
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int c = n ? memcmp(a->s.p, b->s.p, n) : 0;
        if (c) return c;
        return a->s.n < b->s.n ? -1 : a->s.n > b->s.n ? 1 : 0;
    }
    if (a->kind == TV_LIST && b->kind == TV_LIST) {
        size_t n = a->l->n < b->l->n ? a->l->n : b->l->n;
        for (size_t i = 0; i < n; i++) {
            if (tpl_equal(&a->l->v[i], &b->l->v[i])) continue;
            tpl_enter(rt);
            int c = tpl_compare(rt, &a->l->v[i], &b->l->v[i], op);
            tpl_leave(rt);
            return c;
        }
        return a->l->n < b->l->n ? -1 : a->l->n > b->l->n ? 1 : 0;
    }
    tpl_raise(rt, "'%s' not supported between instances of '%s' and '%s'", op, tpl_type_name(a),
              tpl_type_name(b));
}

const char *tpl_type_name(const tpl_val *v) {
    switch (v->kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v->flags & TV_F_TUPLE ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return "function";
    case TV_METHOD: return "builtin_function_or_method";
    case TV_LOOP: return "LoopContext";
    default: return "object";
    }
}

/* ---- buffers ---------------------------------------------------------------------------- */

void tpl_buf_put(tpl_rt *rt, tpl_buf *b, const char *p, size_t n) {
    if (!n) return;
    if (b->n + n > rt->max_output)
        tpl_raise(rt, "template output too large (limit %zu bytes)", rt->max_output);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n)
            cap *= 2;
        char *q = tpl_alloc_raw(rt, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void tpl_buf_puts(tpl_rt *rt, tpl_buf *b, const char *s) {
    tpl_buf_put(rt, b, s, strlen(s));
}
void tpl_buf_putc(tpl_rt *rt, tpl_buf *b, char c) {
    tpl_buf_put(rt, b, &c, 1);
}
tpl_val tpl_buf_val(const tpl_buf *b) {
    return tpl_str_ref(b->p ? b->p : "", b->n);
}

/* ---- str() and repr() ------------------------------------------------------------------- */

void tpl_float_repr(double f, char *out, size_t outlen) {
    if (isnan(f)) {
        snprintf(out, outlen, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, outlen, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest digit string that reads back as f, then Python's layout rules: positional when
     * the decimal exponent is in [-4, 16), else scientific with a two-digit exponent. */
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1; /* digits d1d2... mean 0.d1d2... x 10^decpt */
    char *o = out;
    size_t left = outlen;
#define PUT(...)                                 \
    do {                                         \
        int k_ = snprintf(o, left, __VA_ARGS__); \
        if (k_ > 0 && (size_t)k_ < left) {       \
            o += k_;                             \
            left -= (size_t)k_;                  \
        }                                        \
    } while (0)
    if (neg) PUT("-");
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            PUT("0.");
            for (int i = 0; i < -decpt; i++)
                PUT("0");
            PUT("%s", digits);
        } else if ((size_t)decpt >= nd) {
            PUT("%s", digits);
            for (size_t i = nd; i < (size_t)decpt; i++)
                PUT("0");
            PUT(".0");
        } else {
            PUT("%.*s.%s", decpt, digits, digits + decpt);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static void repr_str(tpl_rt *rt, tpl_buf *b, const char *p, size_t n) {
    /* Python picks single quotes unless the text has one and no double quote. */
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tpl_buf_putc(rt, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char tmp[8];
        if (c == (unsigned char)q || c == '\\') {
            tpl_buf_putc(rt, b, '\\');
            tpl_buf_putc(rt, b, (char)c);
        } else if (c == '\n') {
            tpl_buf_puts(rt, b, "\\n");
        } else if (c == '\r') {
            tpl_buf_puts(rt, b, "\\r");
        } else if (c == '\t') {
            tpl_buf_puts(rt, b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            tpl_buf_puts(rt, b, tmp);
        } else if (c == 0xc2 && i + 1 < n && (unsigned char)p[i + 1] < 0xa0) {
            /* U+0080..U+009F are not printable in Python's repr. */
            snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned char)p[i + 1]);
            tpl_buf_puts(rt, b, tmp);
            i++;
        } else {
            tpl_buf_putc(rt, b, (char)c);
        }
    }
    tpl_buf_putc(rt, b, q);
}

static void put_seq(tpl_rt *rt, tpl_buf *b, const tpl_val *v) {
    int tuple = v->flags & TV_F_TUPLE;
    tpl_buf_putc(rt, b, tuple ? '(' : '[');
    for (size_t i = 0; i < v->l->n; i++) {
        if (i) tpl_buf_puts(rt, b, ", ");
        tpl_repr(rt, b, &v->l->v[i]);
    }
    if (tuple && v->l->n == 1) tpl_buf_putc(rt, b, ',');
    tpl_buf_putc(rt, b, tuple ? ')' : ']');
}

static void put_dict(tpl_rt *rt, tpl_buf *b, tpl_dict *d) {
    if (d->busy) { /* Python's repr prints a container inside itself as {...} */
        tpl_buf_puts(rt, b, "{...}");
        return;
    }
    d->busy = 1;
    tpl_buf_putc(rt, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) tpl_buf_puts(rt, b, ", ");
        tpl_repr(rt, b, &d->k[i]);
        tpl_buf_puts(rt, b, ": ");
        tpl_repr(rt, b, &d->v[i]);
    }
    tpl_buf_putc(rt, b, '}');
    d->busy = 0;
}

void tpl_repr(tpl_rt *rt, tpl_buf *b, const tpl_val *v) {
    tpl_step(rt);
    if (v->kind == TV_STR) {
        repr_str(rt, b, v->s.p, v->s.n);
        return;
    }
    if (v->kind == TV_UNDEF) {
        tpl_buf_puts(rt, b, "Undefined");
        return;
    }
    tpl_enter(rt);
    tpl_to_str(rt, b, v);
    tpl_leave(rt);
}

void tpl_to_str(tpl_rt *rt, tpl_buf *b, const tpl_val *v) {
    char tmp[64];
    switch (v->kind) {
    case TV_UNDEF: return;
    case TV_NONE: tpl_buf_puts(rt, b, "None"); return;
    case TV_BOOL: tpl_buf_puts(rt, b, v->b ? "True" : "False"); return;
    case TV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->i);
        tpl_buf_puts(rt, b, tmp);
        return;
    case TV_FLOAT:
        tpl_float_repr(v->f, tmp, sizeof tmp);
        tpl_buf_puts(rt, b, tmp);
        return;
    case TV_STR: tpl_buf_put(rt, b, v->s.p, v->s.n); return;
    case TV_LIST: put_seq(rt, b, v); return;
    case TV_DICT: put_dict(rt, b, v->d); return;
    case TV_NS:
        tpl_buf_puts(rt, b, "<Namespace ");
        put_dict(rt, b, v->d);
        tpl_buf_putc(rt, b, '>');
        return;
    default:
        snprintf(tmp, sizeof tmp, "<%s object>", tpl_type_name(v));
        tpl_buf_puts(rt, b, tmp);
        return;
    }
}

tpl_val tpl_as_str(tpl_rt *rt, const tpl_val *v) {
    if (v->kind == TV_STR) return *v;
    tpl_buf b = {0};
    tpl_to_str(rt, &b, v);
    return tpl_buf_val(&b);
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

size_t tpl_utf8_next(const char *p, size_t n, int32_t *cp) {
    const unsigned char *s = (const unsigned char *)p;
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *cp = (int32_t)c;
        return 1;
    }
    int32_t v = len == 1 ? (int32_t)c : (int32_t)(c & (0x7f >> len));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp = (int32_t)c;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

size_t tpl_utf8_len(const char *p, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; count++) {
        int32_t cp;
        i += tpl_utf8_next(p + i, n - i, &cp);
    }
    return count;
}

size_t tpl_utf8_put(int32_t cp, char out[4]) {
    unsigned c = (unsigned)cp;
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xc0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xe0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        out[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    if (c > 0x10ffff) c = 0xfffd;
    out[0] = (char)(0xf0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    out[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

int tpl_is_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}
