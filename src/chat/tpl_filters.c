/* Filters and tests (see tpl_filters.h). Each filter follows the Python source of Jinja2 3.1's
 * filters.py / tests.py in argument names, defaults and edge cases (Undefined input, empty
 * sequences), because chat templates lean on those edges. */
#include "chat/tpl_filters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tpl_format.h"
#include "chat/tpl_json.h"
#include "chat/tpl_methods.h"

static int is_num(const tpl_val *v) {
    return v->kind == TV_BOOL || v->kind == TV_INT || v->kind == TV_FLOAT;
}

static tpl_val str_of(tpl_rt *rt, const tpl_val *v) {
    return tpl_as_str(rt, v);
}

static tpl_val sub_args(tpl_rt *rt, const tpl_args *a, size_t skip, const tpl_val *first,
                        tpl_args *out) {
    /* Builds the argument list for a nested filter/test call: first, then a's positionals
     * from index skip on, and a's keywords. */
    out->npos = 1 + (a->npos > skip ? a->npos - skip : 0);
    out->pos = tpl_alloc(rt, out->npos * sizeof *out->pos);
    out->pos[0] = *first;
    for (size_t i = 1; i < out->npos; i++)
        out->pos[i] = a->pos[skip + i - 1];
    out->kwn = a->kwn;
    out->kwv = a->kwv;
    out->nkw = a->nkw;
    return *first;
}

/* The value of item's attribute path "a.b.0" (Jinja's make_attrgetter), or Undefined. */
static tpl_val attr_path(tpl_rt *rt, tpl_val item, const tpl_val *attr) {
    if (attr->kind == TV_INT) return tpl_getitem(rt, &item, attr);
    tpl_val s = str_of(rt, attr);
    size_t st = 0;
    for (size_t i = 0; i <= s.s.n; i++) {
        if (i < s.s.n && s.s.p[i] != '.') continue;
        tpl_val part = tpl_str(rt, s.s.p + st, i - st);
        char *end;
        long long k = strtoll(part.s.p, &end, 10);
        if (part.s.n && *end == 0) {
            tpl_val kv = tpl_int(k);
            item = tpl_getitem(rt, &item, &kv);
        } else {
            item = tpl_getitem(rt, &item, &part);
        }
        st = i + 1;
    }
    return item;
}

static tpl_val tojson(tpl_rt *rt, const tpl_args *a) {
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    tpl_args_check(rt, a, 5, kw, "tojson");
    const tpl_val *ea = tpl_arg(a, 1, "ensure_ascii"), *ind = tpl_arg(a, 2, "indent");
    const tpl_val *sep = tpl_arg(a, 3, "separators"), *sk = tpl_arg(a, 4, "sort_keys");
    tpl_json_opts o = {0};
    o.ensure_ascii = ea && tpl_truthy(ea);
    o.sort_keys = sk && tpl_truthy(sk);
    if (ind && ind->kind != TV_NONE) {
        if (ind->kind == TV_STR) {
            o.indent = tpl_str(rt, ind->s.p, ind->s.n).s.p;
        } else if (ind->kind == TV_INT || ind->kind == TV_BOOL) {
            int64_t n = ind->kind == TV_INT ? ind->i : ind->b;
            if (n > 64) tpl_raise(rt, "tojson: indent too large");
            char *sp = tpl_alloc(rt, (size_t)(n > 0 ? n : 0) + 1);
            for (int64_t i = 0; i < n; i++)
                sp[i] = ' ';
            o.indent = sp;
        } else {
            tpl_raise(rt, "tojson: indent must be an int or a string");
        }
    }
    if (sep && sep->kind != TV_NONE) {
        if (sep->kind != TV_LIST || sep->l->n != 2 || sep->l->v[0].kind != TV_STR ||
            sep->l->v[1].kind != TV_STR)
            tpl_raise(rt, "tojson: separators must be a pair of strings");
        o.item_sep = tpl_str(rt, sep->l->v[0].s.p, sep->l->v[0].s.n).s.p;
        o.key_sep = tpl_str(rt, sep->l->v[1].s.p, sep->l->v[1].s.n).s.p;
    }
    tpl_buf b = {0};
    tpl_json_dump(rt, &b, &a->pos[0], &o);
    return tpl_buf_val(&b);
}

/* Python int() of a string: optional sign, digits with single underscores, surrounding space. */
static int parse_int(tpl_val s, int base, int64_t *out) {
    tpl_val t = tpl_str_strip(NULL, s, NULL, 3);
    size_t i = 0, n = t.s.n;
    int neg = 0;
    if (i < n && (t.s.p[i] == '+' || t.s.p[i] == '-')) neg = t.s.p[i++] == '-';
    if (i == n) return -1;
    __int128 v = 0;
    int prev_us = 1;
    for (; i < n; i++) {
        char c = t.s.p[i];
        if (c == '_' && !prev_us) {
            prev_us = 1;
            continue;
        }
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'z' ? c - 'a' + 10
                : c >= 'A' && c <= 'Z' ? c - 'A' + 10
                                       : 99;
        if (d >= base) return -1;
        v = v * base + d;
        if (v > INT64_MAX) return -1;
        prev_us = 0;
    }
    if (prev_us) return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int parse_float(tpl_rt *rt, tpl_val s, double *out) {
    tpl_val t = tpl_str_strip(rt, s, NULL, 3);
    if (!t.s.n || t.s.n > 100) return -1;
    char buf[128], *end;
    memcpy(buf, t.s.p, t.s.n);
    buf[t.s.n] = 0;
    if (strchr(buf, 'x') || strchr(buf, 'X')) return -1; /* strtod reads hex; Python does not */
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static tpl_val reverse_list(tpl_rt *rt, tpl_list *l) {
    tpl_val r = tpl_new_list(rt, l->n);
    for (size_t i = l->n; i > 0; i--)
        tpl_list_push(rt, r.l, l->v[i - 1]);
    return r;
}

/* Sort key: the item (or its attribute), lower-cased when it is a string and !case_sensitive. */
static tpl_val sort_key(tpl_rt *rt, tpl_val v, const tpl_val *attr, int cs) {
    if (attr && attr->kind != TV_NONE) v = attr_path(rt, v, attr);
    if (!cs && v.kind == TV_STR) v = tpl_str_case(rt, v, 'l');
    return v;
}

static void stable_sort(tpl_rt *rt, tpl_val *items, tpl_val *keys, size_t n, int rev) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int c = tpl_compare(rt, &keys[j - 1], &keys[j], "<");
            if (rev ? c >= 0 : c <= 0) break;
            tpl_val t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
            t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
            tpl_step(rt);
        }
}

static tpl_val select_like(tpl_rt *rt, const tpl_args *a, int by_attr, int keep) {
    tpl_list *l = tpl_iter(rt, &a->pos[0]);
    tpl_val out = tpl_new_list(rt, 0);
    size_t tpos = by_attr ? 2 : 1;
    const tpl_val *attr = by_attr ? tpl_arg(a, 1, NULL) : NULL;
    if (by_attr && !attr) tpl_raise(rt, "Missing parameter for attribute name");
    const tpl_val *test = tpl_arg(a, tpos, NULL);
    if (test && test->kind != TV_STR) tpl_raise(rt, "test name must be a string");
    for (size_t i = 0; i < l->n; i++) {
        tpl_val v = attr ? attr_path(rt, l->v[i], attr) : l->v[i];
        int ok;
        if (!test) {
            ok = tpl_truthy(&v);
        } else {
            tpl_args ta;
            sub_args(rt, a, tpos + 1, &v, &ta);
            ta.nkw = 0;
            tpl_val name = tpl_str(rt, test->s.p, test->s.n);
            ok = tpl_test(rt, name.s.p, &ta);
        }
        if (ok == keep) tpl_list_push(rt, out.l, l->v[i]);
    }
    return out;
}

static tpl_val do_map(tpl_rt *rt, const tpl_args *a) {
    tpl_list *l = tpl_iter(rt, &a->pos[0]);
    tpl_val out = tpl_new_list(rt, l->n);
    const tpl_val *attr = tpl_arg(a, 99, "attribute"), *def = tpl_arg(a, 99, "default");
    for (size_t i = 0; i < l->n; i++) {
        if (attr) {
            tpl_val v = attr_path(rt, l->v[i], attr);
            if (v.kind == TV_UNDEF && def) v = *def;
            tpl_list_push(rt, out.l, v);
            continue;
        }
        const tpl_val *f = tpl_arg(a, 1, NULL);
        if (!f || f->kind != TV_STR) tpl_raise(rt, "map requires a filter name or attribute=");
        tpl_args fa;
        sub_args(rt, a, 2, &l->v[i], &fa);
        tpl_val name = tpl_str(rt, f->s.p, f->s.n);
        tpl_list_push(rt, out.l, tpl_filter(rt, name.s.p, &fa));
    }
    return out;
}

static tpl_val do_round(tpl_rt *rt, const tpl_args *a) {
    const tpl_val *v = &a->pos[0], *pr = tpl_arg(a, 1, "precision"), *m = tpl_arg(a, 2, "method");
    int64_t prec = pr ? (pr->kind == TV_INT ? pr->i : 0) : 0;
    if (!is_num(v)) tpl_raise(rt, "type %s doesn't define __round__ method", tpl_type_name(v));
    if (prec < -300 || prec > 300) tpl_raise(rt, "round: precision out of range");
    const char *method = m && m->kind == TV_STR ? tpl_str(rt, m->s.p, m->s.n).s.p : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        tpl_raise(rt, "method must be common, ceil or floor");
    if (!strcmp(method, "common")) {
        if (v->kind != TV_FLOAT) return tpl_int(v->kind == TV_INT ? v->i : v->b);
        if (prec < 0 || !isfinite(v->f)) {
            double p = pow(10.0, (double)-prec);
            return tpl_float(nearbyint(v->f / p) * p);
        }
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, v->f); /* correctly rounded, half-even */
        return tpl_float(strtod(buf, NULL));
    }
    double p = pow(10.0, (double)prec),
           x = (v->kind == TV_FLOAT ? v->f : (double)(v->kind == TV_INT ? v->i : v->b));
    return tpl_float((method[0] == 'c' ? ceil(x * p) : floor(x * p)) / p);
}

static tpl_val do_indent(tpl_rt *rt, const tpl_args *a) {
    tpl_val s = str_of(rt, &a->pos[0]);
    const tpl_val *w = tpl_arg(a, 1, "width"), *first = tpl_arg(a, 2, "first"),
                  *blank = tpl_arg(a, 3, "blank");
    tpl_val ind;
    if (w && w->kind == TV_STR) {
        ind = *w;
    } else {
        int64_t n = w ? (w->kind == TV_INT ? w->i : 4) : 4;
        if (n < 0) n = 0;
        if (n > 256) tpl_raise(rt, "indent: width too large");
        char *sp = tpl_alloc(rt, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = tpl_str_ref(sp, (size_t)n);
    }
    /* Jinja appends "\n" and splits into lines (Python splitlines on "\n" here). */
    tpl_buf b = {0};
    if (first && tpl_truthy(first)) tpl_buf_put(rt, &b, ind.s.p, ind.s.n);
    size_t st = 0;
    int line_no = 0;
    for (size_t i = 0; i <= s.s.n; i++) {
        if (i < s.s.n && s.s.p[i] != '\n') continue;
        if (i == s.s.n && st == s.s.n && line_no > 0) break; /* the appended "\n" */
        if (line_no > 0) {
            tpl_buf_putc(rt, &b, '\n');
            if (i > st || (blank && tpl_truthy(blank))) tpl_buf_put(rt, &b, ind.s.p, ind.s.n);
        }
        tpl_buf_put(rt, &b, s.s.p + st, i - st);
        st = i + 1;
        line_no++;
    }
    return b.n ? tpl_buf_val(&b) : tpl_cstr("");
}

static tpl_val escape_html(tpl_rt *rt, const tpl_val *v) {
    if (v->kind == TV_STR && (v->flags & TV_F_SAFE)) return *v;
    tpl_val s = str_of(rt, v);
    tpl_buf b = {0};
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        if (c == '&')
            tpl_buf_puts(rt, &b, "&amp;");
        else if (c == '<')
            tpl_buf_puts(rt, &b, "&lt;");
        else if (c == '>')
            tpl_buf_puts(rt, &b, "&gt;");
        else if (c == '"')
            tpl_buf_puts(rt, &b, "&#34;");
        else if (c == '\'')
            tpl_buf_puts(rt, &b, "&#39;");
        else
            tpl_buf_putc(rt, &b, c);
    }
    tpl_val r = b.n ? tpl_buf_val(&b) : tpl_cstr("");
    r.flags = TV_F_SAFE;
    return r;
}

tpl_val tpl_filter(tpl_rt *rt, const char *name, const tpl_args *a) {
    const tpl_val *v = &a->pos[0];
    const tpl_val *a1 = tpl_arg(a, 1, NULL);
#define IS(n) (!strcmp(name, n))
    if (IS("tojson")) return tojson(rt, a);
    if (IS("trim")) {
        const tpl_val *ch = tpl_arg(a, 1, "chars");
        if (ch && ch->kind != TV_NONE && ch->kind != TV_STR)
            tpl_raise(rt, "trim: chars must be a string");
        return tpl_str_strip(rt, str_of(rt, v), ch && ch->kind == TV_STR ? ch : NULL, 3);
    }
    if (IS("length") || IS("count")) return tpl_int(tpl_len(rt, v));
    if (IS("string")) return str_of(rt, v);
    if (IS("safe")) {
        tpl_val s = str_of(rt, v);
        s.flags = TV_F_SAFE;
        return s;
    }
    if (IS("default") || IS("d")) {
        const tpl_val *def = tpl_arg(a, 1, "default_value"), *bo = tpl_arg(a, 2, "boolean");
        int use = v->kind == TV_UNDEF || (bo && tpl_truthy(bo) && !tpl_truthy(v));
        return use ? (def ? *def : tpl_cstr("")) : *v;
    }
    if (IS("items")) {
        if (v->kind == TV_UNDEF) return tpl_new_list(rt, 0);
        if (v->kind != TV_DICT) tpl_raise(rt, "Can only get item pairs from a mapping.");
        tpl_method m = {.self = *v, .name = "items"};
        tpl_args none = {0};
        return tpl_call_method(rt, &m, &none);
    }
    if (IS("join")) {
        tpl_list *l = tpl_iter(rt, v);
        const tpl_val *d = tpl_arg(a, 1, "d"), *attr = tpl_arg(a, 2, "attribute");
        tpl_val sep = d ? str_of(rt, d) : tpl_cstr("");
        tpl_buf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) tpl_buf_put(rt, &b, sep.s.p, sep.s.n);
            tpl_val it = attr && attr->kind != TV_NONE ? attr_path(rt, l->v[i], attr) : l->v[i];
            tpl_to_str(rt, &b, &it);
        }
        return b.n ? tpl_buf_val(&b) : tpl_cstr("");
    }
    if (IS("lower")) return tpl_str_case(rt, str_of(rt, v), 'l');
    if (IS("upper")) return tpl_str_case(rt, str_of(rt, v), 'u');
    if (IS("capitalize")) return tpl_str_case(rt, str_of(rt, v), 'c');
    if (IS("title")) return tpl_str_case(rt, str_of(rt, v), 'T');
    if (IS("replace")) {
        const tpl_val *o = tpl_arg(a, 1, "old"), *n = tpl_arg(a, 2, "new"),
                      *c = tpl_arg(a, 3, "count");
        if (!o || !n) tpl_raise(rt, "replace() needs old and new");
        int64_t cnt = c && c->kind == TV_INT ? c->i : -1;
        return tpl_str_replace(rt, str_of(rt, v), str_of(rt, o), str_of(rt, n), cnt);
    }
    if (IS("first") || IS("last")) {
        tpl_list *l = tpl_iter(rt, v);
        if (!l->n)
            return tpl_undef(IS("first") ? "No first item, sequence was empty."
                                         : "No last item, sequence was empty.",
                             "!");
        return IS("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (IS("list")) {
        tpl_list *l = tpl_iter(rt, v);
        tpl_val out = tpl_new_list(rt, l->n);
        for (size_t i = 0; i < l->n; i++)
            tpl_list_push(rt, out.l, l->v[i]);
        return out;
    }
    if (IS("int")) {
        const tpl_val *def = tpl_arg(a, 1, "default"), *base = tpl_arg(a, 2, "base");
        int64_t r;
        double f;
        int b = base && base->kind == TV_INT ? (int)base->i : 10;
        if (v->kind == TV_UNDEF) tpl_raise_undef(rt, v);
        if (v->kind == TV_INT || v->kind == TV_BOOL)
            return tpl_int(v->kind == TV_INT ? v->i : v->b);
        if (v->kind == TV_FLOAT && isfinite(v->f) && fabs(v->f) < 9.2e18)
            return tpl_int((int64_t)v->f);
        if (v->kind == TV_STR) {
            if (b >= 2 && b <= 36 && !parse_int(*v, b, &r)) return tpl_int(r);
            if (!parse_float(rt, *v, &f) && isfinite(f) && fabs(f) < 9.2e18)
                return tpl_int((int64_t)f);
        }
        return def ? *def : tpl_int(0);
    }
    if (IS("float")) {
        const tpl_val *def = tpl_arg(a, 1, "default");
        double f;
        if (v->kind == TV_UNDEF) tpl_raise_undef(rt, v);
        if (is_num(v))
            return tpl_float(v->kind == TV_FLOAT ? v->f : v->kind == TV_INT ? (double)v->i : v->b);
        if (v->kind == TV_STR && !parse_float(rt, *v, &f)) return tpl_float(f);
        return def ? *def : tpl_float(0.0);
    }
    if (IS("abs")) {
        if (v->kind == TV_FLOAT) return tpl_float(fabs(v->f));
        if (v->kind == TV_INT) {
            if (v->i == INT64_MIN) tpl_raise(rt, "integer overflow");
            return tpl_int(v->i < 0 ? -v->i : v->i);
        }
        if (v->kind == TV_BOOL) return tpl_int(v->b);
        tpl_raise(rt, "bad operand type for abs(): '%s'", tpl_type_name(v));
    }
    if (IS("round")) return do_round(rt, a);
    if (IS("map")) return do_map(rt, a);
    if (IS("select")) return select_like(rt, a, 0, 1);
    if (IS("reject")) return select_like(rt, a, 0, 0);
    if (IS("selectattr")) return select_like(rt, a, 1, 1);
    if (IS("rejectattr")) return select_like(rt, a, 1, 0);
    if (IS("reverse")) {
        if (v->kind == TV_STR) return tpl_slice(rt, v, NULL, NULL, (tpl_val[]){tpl_int(-1)});
        return reverse_list(rt, tpl_iter(rt, v));
    }
    if (IS("sort") || IS("unique") || IS("min") || IS("max") || IS("dictsort")) {
        int dsort = IS("dictsort");
        const tpl_val *rev = tpl_arg(a, IS("sort") || dsort ? (dsort ? 3 : 1) : 99, "reverse");
        const tpl_val *cs = tpl_arg(a, IS("sort") ? 2 : 1, "case_sensitive");
        const tpl_val *attr = dsort ? NULL : tpl_arg(a, IS("sort") ? 3 : 2, "attribute");
        const tpl_val *by = dsort ? tpl_arg(a, 2, "by") : NULL;
        tpl_list *l;
        if (dsort) {
            if (v->kind != TV_DICT) tpl_raise(rt, "dictsort: expected a mapping");
            tpl_method m = {.self = *v, .name = "items"};
            tpl_args none = {0};
            l = tpl_call_method(rt, &m, &none).l;
        } else {
            l = tpl_iter(rt, v);
        }
        tpl_val items = tpl_new_list(rt, l->n), keys = tpl_new_list(rt, l->n);
        int by_value = by && by->kind == TV_STR && by->s.n == 5 && !memcmp(by->s.p, "value", 5);
        for (size_t i = 0; i < l->n; i++) {
            tpl_list_push(rt, items.l, l->v[i]);
            tpl_val kv = dsort ? l->v[i].l->v[by_value ? 1 : 0] : l->v[i];
            tpl_list_push(rt, keys.l, sort_key(rt, kv, attr, cs && tpl_truthy(cs)));
        }
        if (IS("unique")) {
            tpl_val out = tpl_new_list(rt, 0), seen = tpl_new_list(rt, 0);
            for (size_t i = 0; i < l->n; i++) {
                if (tpl_contains(rt, &seen, &keys.l->v[i])) continue;
                tpl_list_push(rt, seen.l, keys.l->v[i]);
                tpl_list_push(rt, out.l, items.l->v[i]);
            }
            return out;
        }
        if (IS("min") || IS("max")) {
            if (!l->n) return tpl_undef("No aggregated item, sequence was empty.", "!");
            size_t best = 0;
            for (size_t i = 1; i < l->n; i++) {
                int c = tpl_compare(rt, &keys.l->v[i], &keys.l->v[best], "<");
                if (IS("min") ? c < 0 : c > 0) best = i;
            }
            return items.l->v[best];
        }
        stable_sort(rt, items.l->v, keys.l->v, items.l->n, rev && tpl_truthy(rev));
        return items;
    }
    if (IS("sum")) {
        tpl_list *l = tpl_iter(rt, v);
        const tpl_val *attr = tpl_arg(a, 1, "attribute"), *start = tpl_arg(a, 2, "start");
        tpl_val acc = start ? *start : tpl_int(0);
        for (size_t i = 0; i < l->n; i++) {
            tpl_val it = attr && attr->kind != TV_NONE ? attr_path(rt, l->v[i], attr) : l->v[i];
            if (!is_num(&acc) || !is_num(&it))
                tpl_raise(rt, "unsupported operand type(s) for +: '%s' and '%s'",
                          tpl_type_name(&acc), tpl_type_name(&it));
            if (acc.kind == TV_FLOAT || it.kind == TV_FLOAT) {
                double x = acc.kind == TV_FLOAT ? acc.f
                           : acc.kind == TV_INT ? (double)acc.i
                                                : acc.b;
                double y = it.kind == TV_FLOAT ? it.f : it.kind == TV_INT ? (double)it.i : it.b;
                acc = tpl_float(x + y);
            } else {
                int64_t x = acc.kind == TV_INT ? acc.i : acc.b, y = it.kind == TV_INT ? it.i : it.b;
                if (__builtin_add_overflow(x, y, &x)) tpl_raise(rt, "integer overflow");
                acc = tpl_int(x);
            }
        }
        return acc;
    }
    if (IS("indent")) return do_indent(rt, a);
    if (IS("format")) { /* soft_str(value) % (kwargs or args) */
        tpl_val args = tpl_new_dict(rt, a->nkw);
        if (a->nkw) {
            for (size_t k = 0; k < a->nkw; k++)
                tpl_dict_set(rt, args.d, tpl_cstr(a->kwn[k]), a->kwv[k]);
        } else {
            args = tpl_new_list(rt, a->npos);
            args.flags = TV_F_TUPLE;
            for (size_t i = 1; i < a->npos; i++)
                tpl_list_push(rt, args.l, a->pos[i]);
        }
        return tpl_percent_format(rt, str_of(rt, v), &args);
    }
    if (IS("escape") || IS("e") || IS("forceescape")) return escape_html(rt, v);
    if (IS("attr")) {
        if (!a1) tpl_raise(rt, "attr() needs a name");
        tpl_val n = str_of(rt, a1);
        return tpl_getattr(rt, v, tpl_str(rt, n.s.p, n.s.n).s.p);
    }
    if (IS("wordcount"))
        return tpl_int(
            (int64_t)tpl_call_method(rt, &(tpl_method){.self = str_of(rt, v), .name = "split"},
                                     &(tpl_args){0})
                .l->n);
    if (IS("center")) {
        tpl_val s = str_of(rt, v);
        int64_t w = a1 && a1->kind == TV_INT ? a1->i : 80, n = (int64_t)tpl_utf8_len(s.s.p, s.s.n);
        if (w > 100000) tpl_raise(rt, "center: width too large");
        if (w <= n) return s;
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        tpl_buf b = {0};
        for (int64_t i = 0; i < left; i++)
            tpl_buf_putc(rt, &b, ' ');
        tpl_buf_put(rt, &b, s.s.p, s.s.n);
        for (int64_t i = 0; i < pad - left; i++)
            tpl_buf_putc(rt, &b, ' ');
        return tpl_buf_val(&b);
    }
#undef IS
    tpl_raise(rt, "No filter named '%s'.", name);
}

/* ---- tests ------------------------------------------------------------------------------ */

int tpl_test(tpl_rt *rt, const char *name, const tpl_args *a) {
    const tpl_val *v = &a->pos[0], *arg = tpl_arg(a, 1, NULL);
    int k = v->kind;
#define IS(n) (!strcmp(name, n))
    if (IS("defined")) return k != TV_UNDEF;
    if (IS("undefined")) return k == TV_UNDEF;
    if (IS("none")) return k == TV_NONE;
    if (IS("string")) return k == TV_STR;
    if (IS("mapping")) return k == TV_DICT;
    /* Undefined is iterable and a sequence in Jinja (it has __iter__, __len__, __getitem__). */
    if (IS("iterable")) return k == TV_STR || k == TV_LIST || k == TV_DICT || k == TV_UNDEF;
    if (IS("sequence")) return k == TV_STR || k == TV_LIST || k == TV_DICT || k == TV_UNDEF;
    if (IS("number")) return is_num(v);
    if (IS("integer")) return k == TV_INT;
    if (IS("float")) return k == TV_FLOAT;
    if (IS("boolean")) return k == TV_BOOL;
    if (IS("true")) return k == TV_BOOL && v->b;
    if (IS("false")) return k == TV_BOOL && !v->b;
    if (IS("callable")) return k == TV_MACRO || k == TV_FUNC || k == TV_METHOD;
    if (IS("lower") || IS("upper")) {
        tpl_val s = str_of(rt, v);
        tpl_method m = {.self = s, .name = IS("lower") ? "islower" : "isupper"};
        tpl_args none = {0};
        return tpl_call_method(rt, &m, &none).b;
    }
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (k == TV_UNDEF) tpl_raise_undef(rt, v);
        if (k != TV_INT && k != TV_BOOL) tpl_raise(rt, "test '%s' needs an integer", name);
        int64_t x = k == TV_INT ? v->i : v->b, d = 2;
        if (IS("divisibleby")) {
            if (!arg || (arg->kind != TV_INT && arg->kind != TV_BOOL))
                tpl_raise(rt, "divisibleby needs an integer argument");
            d = arg->kind == TV_INT ? arg->i : arg->b;
            if (!d) tpl_raise(rt, "integer division or modulo by zero");
            return x % d == 0;
        }
        return (x % 2 != 0) == IS("odd");
    }
    if (IS("escaped")) return k == TV_STR && (v->flags & TV_F_SAFE);
    if (IS("filter") || IS("test")) {
        static const char *const filters[] = {
            "tojson",  "trim",   "length",      "count",  "string",     "safe",       "default",
            "d",       "items",  "join",        "lower",  "upper",      "capitalize", "title",
            "replace", "first",  "last",        "list",   "int",        "float",      "abs",
            "round",   "map",    "select",      "reject", "selectattr", "rejectattr", "reverse",
            "sort",    "unique", "min",         "max",    "dictsort",   "sum",        "indent",
            "escape",  "e",      "forceescape", "attr",   "wordcount",  "center",     NULL};
        static const char *const tests[] = {
            "defined",  "undefined", "none",    "string",  "mapping",     "iterable",    "sequence",
            "number",   "integer",   "float",   "boolean", "true",        "false",       "callable",
            "lower",    "upper",     "odd",     "even",    "divisibleby", "escaped",     "filter",
            "test",     "eq",        "equalto", "==",      "ne",          "!=",          "lt",
            "lessthan", "<",         "le",      "<=",      "gt",          "greaterthan", ">",
            "ge",       ">=",        "in",      "sameas",  NULL};
        if (k != TV_STR) return 0;
        const char *const *list = IS("filter") ? filters : tests;
        for (size_t i = 0; list[i]; i++)
            if (strlen(list[i]) == v->s.n && !memcmp(list[i], v->s.p, v->s.n)) return 1;
        return 0;
    }
    if (!arg && (IS("eq") || IS("equalto") || IS("==") || IS("ne") || IS("!=") || IS("lt") ||
                 IS("lessthan") || IS("<") || IS("le") || IS("<=") || IS("gt") ||
                 IS("greaterthan") || IS(">") || IS("ge") || IS(">=") || IS("in") || IS("sameas")))
        tpl_raise(rt, "test '%s' needs an argument", name);
    if (IS("eq") || IS("equalto") || IS("==")) return tpl_equal(v, arg);
    if (IS("ne") || IS("!=")) return !tpl_equal(v, arg);
    if (IS("lt") || IS("lessthan") || IS("<")) return tpl_compare(rt, v, arg, "<") < 0;
    if (IS("le") || IS("<=")) return tpl_compare(rt, v, arg, "<=") <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return tpl_compare(rt, v, arg, ">") > 0;
    if (IS("ge") || IS(">=")) return tpl_compare(rt, v, arg, ">=") >= 0;
    if (IS("in")) return tpl_contains(rt, arg, v);
    if (IS("sameas")) {
        if (k != arg->kind) return 0;
        switch (k) {
        case TV_NONE:
        case TV_UNDEF: return 1;
        case TV_BOOL: return v->b == arg->b;
        case TV_INT: return v->i == arg->i;
        case TV_STR: return v->s.p == arg->s.p && v->s.n == arg->s.n;
        default: return tpl_equal(v, arg) && v->l == arg->l;
        }
    }
#undef IS
    tpl_raise(rt, "No test named '%s'.", name);
}
