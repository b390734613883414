/* Attribute/item lookup, slicing, `in`, Python methods and global functions (see
 * tpl_methods.h). Strings are UTF-8 but Python indexes them by code point, so index, slice and
 * find results are converted between byte offsets and code point counts here. */
#include "chat/tpl_methods.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

static tpl_val msg_undef(tpl_rt *rt, const char *fmt, const char *a, const char *b) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, fmt, a, b);
    tpl_val s = tpl_str(rt, tmp, strlen(tmp));
    return tpl_undef(s.s.p, "!");
}

static int in_list(const char *name, const char *const *names) {
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

static const char *const str_methods[] = {
    "startswith", "endswith", "split",      "rsplit",       "strip",        "lstrip",  "rstrip",
    "lower",      "upper",    "title",      "capitalize",   "replace",      "find",    "rfind",
    "count",      "join",     "splitlines", "isdigit",      "isalpha",      "isalnum", "isspace",
    "islower",    "isupper",  "format",     "removeprefix", "removesuffix", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append",  "extend", "insert", "pop", "remove",
                                          "reverse", "sort",   "clear",  NULL};

static tpl_val method(tpl_rt *rt, const tpl_val *self, const char *name) {
    tpl_method *m = tpl_alloc(rt, sizeof *m);
    m->self = *self;
    m->name = name;
    tpl_val v = {.kind = TV_METHOD};
    v.m = m;
    return v;
}

static tpl_val unsafe(tpl_rt *rt, const char *name, const tpl_val *obj) {
    return msg_undef(rt, "access to attribute '%s' of '%s' object is unsafe.", name,
                     tpl_type_name(obj));
}

static tpl_val loop_attr(tpl_rt *rt, const tpl_val *obj, const char *name) {
    const tpl_loop *lp = obj->loop;
    int64_t n = (int64_t)lp->items->n, i = (int64_t)lp->i;
    if (!strcmp(name, "index")) return tpl_int(i + 1);
    if (!strcmp(name, "index0")) return tpl_int(i);
    if (!strcmp(name, "revindex")) return tpl_int(n - i);
    if (!strcmp(name, "revindex0")) return tpl_int(n - i - 1);
    if (!strcmp(name, "first")) return tpl_bool(i == 0);
    if (!strcmp(name, "last")) return tpl_bool(i == n - 1);
    if (!strcmp(name, "length")) return tpl_int(n);
    if (!strcmp(name, "depth")) return tpl_int(lp->depth);
    if (!strcmp(name, "depth0")) return tpl_int(lp->depth - 1);
    if (!strcmp(name, "previtem"))
        return i > 0 ? lp->items->v[i - 1] : tpl_undef("there is no previous item", "!");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? lp->items->v[i + 1] : tpl_undef("there is no next item", "!");
    if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return method(rt, obj, name);
    return tpl_undef(name, "LoopContext");
}

tpl_val tpl_getattr(tpl_rt *rt, const tpl_val *obj, const char *name) {
    switch (obj->kind) {
    case TV_UNDEF: tpl_raise_undef(rt, obj);
    case TV_DICT: {
        if (in_list(name, dict_methods)) return method(rt, obj, name);
        if (in_list(name, dict_unsafe)) return unsafe(rt, name, obj);
        tpl_val *v = tpl_dict_getn(obj->d, name, strlen(name));
        return v ? *v : tpl_undef(name, "dict");
    }
    case TV_NS: {
        tpl_val *v = tpl_dict_getn(obj->d, name, strlen(name));
        return v ? *v : tpl_undef(name, "Namespace");
    }
    case TV_STR:
        if (in_list(name, str_methods)) return method(rt, obj, name);
        break;
    case TV_LIST:
        if (in_list(name, list_methods)) return method(rt, obj, name);
        if (in_list(name, list_unsafe)) return unsafe(rt, name, obj);
        break;
    case TV_LOOP: return loop_attr(rt, obj, name);
    default: break;
    }
    if (name[0] == '_' && name[1] == '_') return unsafe(rt, name, obj);
    return tpl_undef(name, tpl_type_name(obj));
}

/* Byte offset of code point index i in s (i may equal the length). */
static size_t cp_offset(const tpl_val *s, size_t i) {
    size_t off = 0;
    for (size_t k = 0; k < i && off < s->s.n; k++) {
        int32_t cp;
        off += tpl_utf8_next(s->s.p + off, s->s.n - off, &cp);
    }
    return off;
}

tpl_val tpl_getitem(tpl_rt *rt, const tpl_val *obj, const tpl_val *key) {
    if (obj->kind == TV_UNDEF) tpl_raise_undef(rt, obj);
    if (obj->kind == TV_DICT) {
        tpl_val *v = tpl_dict_get(obj->d, *key);
        if (v) return *v;
    } else if ((obj->kind == TV_LIST || obj->kind == TV_STR) &&
               (key->kind == TV_INT || key->kind == TV_BOOL)) {
        int64_t n =
            obj->kind == TV_LIST ? (int64_t)obj->l->n : (int64_t)tpl_utf8_len(obj->s.p, obj->s.n);
        int64_t i = key->kind == TV_INT ? key->i : key->b;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj->kind == TV_LIST) return obj->l->v[i];
            size_t off = cp_offset(obj, (size_t)i);
            int32_t cp;
            return tpl_str_ref(obj->s.p + off, tpl_utf8_next(obj->s.p + off, obj->s.n - off, &cp));
        }
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)(key->kind == TV_INT ? key->i : key->b));
        return msg_undef(rt, "%s object has no element %s", tpl_type_name(obj), num);
    }
    if (key->kind == TV_STR) {
        tpl_val name = tpl_str(rt, key->s.p, key->s.n); /* NUL-terminated copy */
        if (strlen(name.s.p) == key->s.n) return tpl_getattr(rt, obj, name.s.p);
    }
    tpl_buf b = {0};
    tpl_repr(rt, &b, key);
    tpl_buf_putc(rt, &b, 0);
    return msg_undef(rt, "%s object has no element %s", tpl_type_name(obj), b.p);
}

static int slice_index(const tpl_val *v, int64_t *out) {
    if (!v || v->kind == TV_NONE) return 0;
    if (v->kind == TV_INT)
        *out = v->i;
    else if (v->kind == TV_BOOL)
        *out = v->b;
    else
        return -1;
    return 1;
}

tpl_val tpl_slice(tpl_rt *rt, const tpl_val *obj, const tpl_val *start, const tpl_val *stop,
                  const tpl_val *step) {
    if (obj->kind == TV_UNDEF) tpl_raise_undef(rt, obj);
    int64_t a = 0, b = 0, st = 1;
    int ha = slice_index(start, &a), hb = slice_index(stop, &b), hs = slice_index(step, &st);
    if (ha < 0 || hb < 0 || hs < 0 || (obj->kind != TV_LIST && obj->kind != TV_STR))
        return tpl_undef("slice", tpl_type_name(obj));
    if (st == 0) tpl_raise(rt, "slice step cannot be zero");
    int64_t n =
        obj->kind == TV_LIST ? (int64_t)obj->l->n : (int64_t)tpl_utf8_len(obj->s.p, obj->s.n);
    /* Python's PySlice_AdjustIndices. */
    if (!ha)
        a = st < 0 ? n - 1 : 0;
    else if (a < 0)
        a = a + n < 0 ? (st < 0 ? -1 : 0) : a + n;
    else if (a >= n)
        a = st < 0 ? n - 1 : n;
    if (!hb)
        b = st < 0 ? -1 : n;
    else if (b < 0)
        b = b + n < 0 ? (st < 0 ? -1 : 0) : b + n;
    else if (b >= n)
        b = st < 0 ? n - 1 : n;
    if (obj->kind == TV_LIST) {
        tpl_val r = tpl_new_list(rt, 0);
        r.flags = obj->flags;
        for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
            tpl_list_push(rt, r.l, obj->l->v[i]);
        return r;
    }
    /* Strings: code point offsets first, then copy the selected characters. */
    size_t *offs = tpl_alloc(rt, ((size_t)n + 1) * sizeof *offs);
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t cp;
        offs[i] = off;
        off += tpl_utf8_next(obj->s.p + off, obj->s.n - off, &cp);
    }
    offs[n] = obj->s.n;
    if (st == 1) return a < b ? tpl_str_ref(obj->s.p + offs[a], offs[b] - offs[a]) : tpl_cstr("");
    tpl_buf out = {0};
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
        tpl_buf_put(rt, &out, obj->s.p + offs[i], offs[i + 1] - offs[i]);
    return out.n ? tpl_buf_val(&out) : tpl_cstr("");
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

int tpl_contains(tpl_rt *rt, const tpl_val *c, const tpl_val *item) {
    switch (c->kind) {
    case TV_STR:
        if (item->kind == TV_UNDEF) tpl_raise_undef(rt, item);
        if (item->kind != TV_STR)
            tpl_raise(rt, "'in <string>' requires string as left operand, not %s",
                      tpl_type_name(item));
        return find_bytes(c->s.p, c->s.n, item->s.p, item->s.n) != NULL;
    case TV_LIST:
        for (size_t i = 0; i < c->l->n; i++)
            if (tpl_equal(&c->l->v[i], item)) return 1;
        return 0;
    case TV_DICT: return tpl_dict_get(c->d, *item) != NULL;
    case TV_UNDEF: return 0;
    default: tpl_raise(rt, "argument of type '%s' is not iterable", tpl_type_name(c));
    }
}

int64_t tpl_len(tpl_rt *rt, const tpl_val *v) {
    switch (v->kind) {
    case TV_STR: return (int64_t)tpl_utf8_len(v->s.p, v->s.n);
    case TV_LIST: return (int64_t)v->l->n;
    case TV_DICT: return (int64_t)v->d->n;
    case TV_UNDEF: return 0;
    default: tpl_raise(rt, "object of type '%s' has no len()", tpl_type_name(v));
    }
}

/* ---- string helpers --------------------------------------------------------------------- */

static int in_chars(int32_t cp, const tpl_val *chars) {
    if (!chars) return tpl_is_space(cp);
    for (size_t i = 0; i < chars->s.n;) {
        int32_t c;
        i += tpl_utf8_next(chars->s.p + i, chars->s.n - i, &c);
        if (c == cp) return 1;
    }
    return 0;
}

tpl_val tpl_str_strip(tpl_rt *rt, tpl_val s, const tpl_val *chars, int what) {
    (void)rt;
    size_t a = 0, b = s.s.n;
    if (what & 1)
        while (a < b) {
            int32_t cp;
            size_t k = tpl_utf8_next(s.s.p + a, b - a, &cp);
            if (!in_chars(cp, chars)) break;
            a += k;
        }
    if (what & 2)
        while (b > a) {
            size_t k = 1;
            while (k < b - a && k < 4 && ((unsigned char)s.s.p[b - k] & 0xc0) == 0x80)
                k++;
            int32_t cp;
            if (tpl_utf8_next(s.s.p + b - k, k, &cp) != k) k = 1, cp = (unsigned char)s.s.p[b - 1];
            if (!in_chars(cp, chars)) break;
            b -= k;
        }
    tpl_val r = tpl_str_ref(s.s.p + a, b - a);
    r.flags = s.flags;
    return r;
}

static int is_cased_letter(int32_t cp) {
    return utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
}

tpl_val tpl_str_case(tpl_rt *rt, tpl_val s, int mode) {
    tpl_buf b = {0};
    int prev_cased = 0, first = 1, word_start = 1;
    for (size_t i = 0; i < s.s.n;) {
        int32_t cp;
        i += tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
        int32_t o = cp;
        switch (mode) {
        case 'l': o = utf8proc_tolower(cp); break;
        case 'u': o = utf8proc_toupper(cp); break;
        case 'c': o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case 't': /* str.title: a cased letter after a non-cased character starts a word */
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = is_cased_letter(cp);
            break;
        default: /* Jinja's title filter: words start after -, whitespace and ( { [ < */
            o = word_start ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
            word_start =
                cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tpl_is_space(cp);
            break;
        }
        first = 0;
        char enc[4];
        tpl_buf_put(rt, &b, enc, tpl_utf8_put(o, enc));
    }
    tpl_val r = b.n ? tpl_buf_val(&b) : tpl_cstr("");
    r.flags = s.flags;
    return r;
}

tpl_val tpl_str_replace(tpl_rt *rt, tpl_val s, tpl_val old, tpl_val rep, int64_t count) {
    tpl_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (!old.s.n) { /* Python inserts rep between characters and at both ends */
        while (count < 0 || done < count) {
            tpl_buf_put(rt, &b, rep.s.p, rep.s.n);
            done++;
            if (i >= s.s.n) break;
            int32_t cp;
            size_t k = tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
            tpl_buf_put(rt, &b, s.s.p + i, k);
            i += k;
        }
    } else {
        while (count < 0 || done < count) {
            const char *f = find_bytes(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!f) break;
            tpl_buf_put(rt, &b, s.s.p + i, (size_t)(f - (s.s.p + i)));
            tpl_buf_put(rt, &b, rep.s.p, rep.s.n);
            i = (size_t)(f - s.s.p) + old.s.n;
            done++;
        }
    }
    tpl_buf_put(rt, &b, s.s.p + i, s.s.n - i);
    return b.n ? tpl_buf_val(&b) : tpl_cstr("");
}

/* ---- method calls ----------------------------------------------------------------------- */

static tpl_val need_str(tpl_rt *rt, const tpl_val *v, const char *what) {
    if (!v || v->kind != TV_STR)
        tpl_raise(rt, "%s: expected a string argument, got %s", what,
                  v ? tpl_type_name(v) : "none");
    return *v;
}

static tpl_val split(tpl_rt *rt, tpl_val s, const tpl_val *sep, int64_t maxsplit, int right) {
    tpl_val out = tpl_new_list(rt, 0);
    if (sep && sep->kind != TV_NONE) {
        tpl_val d = need_str(rt, sep, "split");
        if (!d.s.n) tpl_raise(rt, "empty separator");
        /* rsplit with a limit splits from the right; collect then reverse. */
        size_t end = s.s.n, i = 0;
        int64_t done = 0;
        if (!right) {
            while (maxsplit < 0 || done < maxsplit) {
                const char *f = find_bytes(s.s.p + i, s.s.n - i, d.s.p, d.s.n);
                if (!f) break;
                tpl_list_push(rt, out.l, tpl_str_ref(s.s.p + i, (size_t)(f - s.s.p) - i));
                i = (size_t)(f - s.s.p) + d.s.n;
                done++;
            }
            tpl_list_push(rt, out.l, tpl_str_ref(s.s.p + i, s.s.n - i));
            return out;
        }
        while (maxsplit < 0 || done < maxsplit) {
            size_t k = end;
            const char *f = NULL;
            while (k >= d.s.n) {
                if (!memcmp(s.s.p + k - d.s.n, d.s.p, d.s.n)) {
                    f = s.s.p + k - d.s.n;
                    break;
                }
                k--;
            }
            if (!f) break;
            tpl_list_push(rt, out.l, tpl_str_ref(f + d.s.n, end - (size_t)(f - s.s.p) - d.s.n));
            end = (size_t)(f - s.s.p);
            done++;
        }
        tpl_list_push(rt, out.l, tpl_str_ref(s.s.p, end));
    } else {
        /* Whitespace runs; leading and trailing whitespace yields no empty strings. */
        size_t i = 0;
        int64_t done = 0;
        if (!right) {
            while (i < s.s.n) {
                int32_t cp;
                size_t k = tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
                if (tpl_is_space(cp)) {
                    i += k;
                    continue;
                }
                if (maxsplit >= 0 && done >= maxsplit) {
                    tpl_val rest = tpl_str_strip(rt, tpl_str_ref(s.s.p + i, s.s.n - i), NULL, 2);
                    tpl_list_push(rt, out.l, rest);
                    return out;
                }
                size_t st = i;
                while (i < s.s.n) {
                    k = tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
                    if (tpl_is_space(cp)) break;
                    i += k;
                }
                tpl_list_push(rt, out.l, tpl_str_ref(s.s.p + st, i - st));
                done++;
            }
            return out;
        }
        tpl_val w = split(rt, s, NULL, -1, 0);
        size_t nw = w.l->n;
        if (maxsplit < 0 || (size_t)maxsplit >= nw) return w;
        /* Keep the last maxsplit words; the head is the text before them, right-stripped. */
        const tpl_val *first_kept = &w.l->v[nw - (size_t)maxsplit];
        tpl_val head =
            tpl_str_strip(rt, tpl_str_ref(s.s.p, (size_t)(first_kept->s.p - s.s.p)), NULL, 3);
        tpl_list_push(rt, out.l, head);
        for (size_t k = nw - (size_t)maxsplit; k < nw; k++)
            tpl_list_push(rt, out.l, w.l->v[k]);
        return out;
    }
    /* reverse the rsplit result */
    for (size_t a = 0, b = out.l->n - 1; a < b; a++, b--) {
        tpl_val t = out.l->v[a];
        out.l->v[a] = out.l->v[b];
        out.l->v[b] = t;
    }
    return out;
}

static int64_t opt_int(tpl_rt *rt, const tpl_val *v, int64_t def) {
    if (!v || v->kind == TV_NONE) return def;
    if (v->kind == TV_INT) return v->i;
    if (v->kind == TV_BOOL) return v->b;
    tpl_raise(rt, "'%s' object cannot be interpreted as an integer", tpl_type_name(v));
}

static int prefix_match(tpl_rt *rt, tpl_val s, const tpl_val *arg, int suffix) {
    if (arg && arg->kind == TV_LIST && (arg->flags & TV_F_TUPLE)) {
        for (size_t i = 0; i < arg->l->n; i++)
            if (prefix_match(rt, s, &arg->l->v[i], suffix)) return 1;
        return 0;
    }
    tpl_val p = need_str(rt, arg, suffix ? "endswith" : "startswith");
    if (p.s.n > s.s.n) return 0;
    return !memcmp(s.s.p + (suffix ? s.s.n - p.s.n : 0), p.s.p, p.s.n);
}

static int str_class(tpl_val s, int what) {
    if (!s.s.n) return 0;
    int cased = 0;
    for (size_t i = 0; i < s.s.n;) {
        int32_t cp;
        i += tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        int alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        switch (what) {
        case 'd':
            if (!digit) return 0;
            break;
        case 'a':
            if (!alpha) return 0;
            break;
        case 'n':
            if (!alpha && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO)
                return 0;
            break;
        case 's':
            if (!tpl_is_space(cp)) return 0;
            break;
        case 'l':
            if (utf8proc_tolower(cp) != cp) return 0;
            cased |= utf8proc_toupper(cp) != cp;
            break;
        default:
            if (utf8proc_toupper(cp) != cp) return 0;
            cased |= utf8proc_tolower(cp) != cp;
            break;
        }
    }
    return what == 'l' || what == 'u' ? cased : 1;
}

static tpl_val str_format(tpl_rt *rt, tpl_val s, const tpl_args *a) {
    tpl_buf b = {0};
    size_t auto_idx = 0;
    for (size_t i = 0; i < s.s.n; i++) {
        char c = s.s.p[i];
        if ((c == '{' || c == '}') && i + 1 < s.s.n && s.s.p[i + 1] == c) {
            tpl_buf_putc(rt, &b, c);
            i++;
            continue;
        }
        if (c == '}') tpl_raise(rt, "Single '}' encountered in format string");
        if (c != '{') {
            tpl_buf_putc(rt, &b, c);
            continue;
        }
        const char *end = memchr(s.s.p + i, '}', s.s.n - i);
        if (!end) tpl_raise(rt, "Single '{' encountered in format string");
        const char *f = s.s.p + i + 1;
        size_t fn = (size_t)(end - f);
        if (memchr(f, ':', fn) || memchr(f, '!', fn) || memchr(f, '.', fn) || memchr(f, '[', fn))
            tpl_raise(rt, "format: conversions, specs and field attributes are not supported");
        const tpl_val *v = NULL;
        if (fn == 0) {
            v = auto_idx < a->npos ? &a->pos[auto_idx] : NULL;
            auto_idx++;
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = 0;
            for (size_t j = 0; j < fn; j++)
                k = k * 10 + (size_t)(f[j] - '0');
            v = k < a->npos ? &a->pos[k] : NULL;
        } else {
            for (size_t k = 0; k < a->nkw; k++)
                if (strlen(a->kwn[k]) == fn && !memcmp(a->kwn[k], f, fn)) v = &a->kwv[k];
        }
        if (!v) tpl_raise(rt, "format: replacement field {%.*s} has no argument", (int)fn, f);
        tpl_to_str(rt, &b, v);
        i = (size_t)(end - s.s.p);
    }
    return b.n ? tpl_buf_val(&b) : tpl_cstr("");
}

static tpl_val str_method(tpl_rt *rt, tpl_val s, const char *n, const tpl_args *a) {
    const tpl_val *a0 = tpl_arg(a, 0, NULL), *a1 = tpl_arg(a, 1, NULL), *a2 = tpl_arg(a, 2, NULL);
    if (!strcmp(n, "startswith") || !strcmp(n, "endswith")) {
        if (a->npos > 1) tpl_raise(rt, "%s: start/end arguments are not supported", n);
        return tpl_bool(prefix_match(rt, s, a0, n[0] == 'e'));
    }
    if (!strcmp(n, "split") || !strcmp(n, "rsplit")) {
        const tpl_val *sep = tpl_arg(a, 0, "sep"), *mx = tpl_arg(a, 1, "maxsplit");
        return split(rt, s, sep, opt_int(rt, mx, -1), n[0] == 'r');
    }
    if (!strcmp(n, "strip") || !strcmp(n, "lstrip") || !strcmp(n, "rstrip")) {
        const tpl_val *ch = a0 && a0->kind != TV_NONE ? a0 : NULL;
        if (ch) need_str(rt, ch, n);
        return tpl_str_strip(rt, s, ch, n[0] == 'l' ? 1 : n[0] == 'r' ? 2 : 3);
    }
    if (!strcmp(n, "lower")) return tpl_str_case(rt, s, 'l');
    if (!strcmp(n, "upper")) return tpl_str_case(rt, s, 'u');
    if (!strcmp(n, "title")) return tpl_str_case(rt, s, 't');
    if (!strcmp(n, "capitalize")) return tpl_str_case(rt, s, 'c');
    if (!strcmp(n, "replace"))
        return tpl_str_replace(rt, s, need_str(rt, a0, n), need_str(rt, a1, n),
                               opt_int(rt, a2, -1));
    if (!strcmp(n, "find") || !strcmp(n, "rfind") || !strcmp(n, "count")) {
        tpl_val sub = need_str(rt, a0, n);
        if (a->npos > 1) tpl_raise(rt, "%s: start/end arguments are not supported", n);
        if (n[0] == 'c') {
            if (!sub.s.n) return tpl_int((int64_t)tpl_utf8_len(s.s.p, s.s.n) + 1);
            int64_t k = 0;
            for (const char *p = s.s.p, *e = s.s.p + s.s.n;
                 (p = find_bytes(p, (size_t)(e - p), sub.s.p, sub.s.n)); p += sub.s.n)
                k++;
            return tpl_int(k);
        }
        const char *hit = NULL;
        for (const char *p = s.s.p, *e = s.s.p + s.s.n;
             (p = find_bytes(p, (size_t)(e - p), sub.s.p, sub.s.n)); p++) {
            hit = p;
            if (n[0] == 'f' || p == e) break;
        }
        return tpl_int(hit ? (int64_t)tpl_utf8_len(s.s.p, (size_t)(hit - s.s.p)) : -1);
    }
    if (!strcmp(n, "join")) {
        if (!a0) tpl_raise(rt, "join() takes exactly one argument");
        tpl_list *l = tpl_iter(rt, a0);
        tpl_buf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].kind != TV_STR)
                tpl_raise(rt, "sequence item %zu: expected str instance, %s found", i,
                          tpl_type_name(&l->v[i]));
            if (i) tpl_buf_put(rt, &b, s.s.p, s.s.n);
            tpl_buf_put(rt, &b, l->v[i].s.p, l->v[i].s.n);
        }
        return b.n ? tpl_buf_val(&b) : tpl_cstr("");
    }
    if (!strcmp(n, "splitlines")) {
        tpl_val out = tpl_new_list(rt, 0);
        int keep = a0 && tpl_truthy(a0);
        size_t st = 0;
        for (size_t i = 0; i < s.s.n;) {
            int32_t cp;
            size_t k = tpl_utf8_next(s.s.p + i, s.s.n - i, &cp);
            int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c ||
                      (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
            if (!brk) {
                i += k;
                continue;
            }
            size_t e = i;
            i += k;
            if (cp == '\r' && i < s.s.n && s.s.p[i] == '\n') i++;
            tpl_list_push(rt, out.l, tpl_str_ref(s.s.p + st, (keep ? i : e) - st));
            st = i;
        }
        if (st < s.s.n) tpl_list_push(rt, out.l, tpl_str_ref(s.s.p + st, s.s.n - st));
        return out;
    }
    if (!strcmp(n, "isdigit")) return tpl_bool(str_class(s, 'd'));
    if (!strcmp(n, "isalpha")) return tpl_bool(str_class(s, 'a'));
    if (!strcmp(n, "isalnum")) return tpl_bool(str_class(s, 'n'));
    if (!strcmp(n, "isspace")) return tpl_bool(str_class(s, 's'));
    if (!strcmp(n, "islower")) return tpl_bool(str_class(s, 'l'));
    if (!strcmp(n, "isupper")) return tpl_bool(str_class(s, 'u'));
    if (!strcmp(n, "format")) return str_format(rt, s, a);
    if (!strcmp(n, "removeprefix") || !strcmp(n, "removesuffix")) {
        tpl_val p = need_str(rt, a0, n);
        int suf = n[6] == 's';
        if (p.s.n <= s.s.n && !memcmp(s.s.p + (suf ? s.s.n - p.s.n : 0), p.s.p, p.s.n))
            return tpl_str_ref(s.s.p + (suf ? 0 : p.s.n), s.s.n - p.s.n);
        return s;
    }
    tpl_raise(rt, "unknown str method '%s'", n);
}

tpl_val tpl_call_method(tpl_rt *rt, const tpl_method *m, const tpl_args *a) {
    const tpl_val *self = &m->self;
    const char *n = m->name;
    if (self->kind == TV_STR) return str_method(rt, *self, n, a);
    const tpl_val *a0 = tpl_arg(a, 0, NULL);
    if (self->kind == TV_DICT) {
        const tpl_dict *d = self->d;
        if (!strcmp(n, "get")) {
            if (!a0) tpl_raise(rt, "get expected at least 1 argument, got 0");
            tpl_val *v = tpl_dict_get(d, *a0);
            const tpl_val *def = tpl_arg(a, 1, NULL);
            return v ? *v : def ? *def : tpl_none();
        }
        if (!strcmp(n, "copy")) {
            tpl_val c = tpl_new_dict(rt, d->n);
            for (size_t i = 0; i < d->n; i++)
                tpl_dict_set(rt, c.d, d->k[i], d->v[i]);
            return c;
        }
        tpl_val out = tpl_new_list(rt, d->n);
        for (size_t i = 0; i < d->n; i++) {
            if (n[0] == 'k')
                tpl_list_push(rt, out.l, d->k[i]);
            else if (n[0] == 'v')
                tpl_list_push(rt, out.l, d->v[i]);
            else {
                tpl_val pair = tpl_new_list(rt, 2);
                pair.flags = TV_F_TUPLE;
                tpl_list_push(rt, pair.l, d->k[i]);
                tpl_list_push(rt, pair.l, d->v[i]);
                tpl_list_push(rt, out.l, pair);
            }
        }
        return out;
    }
    if (self->kind == TV_LIST) {
        if (!strcmp(n, "copy")) {
            tpl_val c = tpl_new_list(rt, self->l->n);
            for (size_t i = 0; i < self->l->n; i++)
                tpl_list_push(rt, c.l, self->l->v[i]);
            return c;
        }
        if (!a0) tpl_raise(rt, "%s() takes exactly one argument (0 given)", n);
        int64_t k = 0;
        for (size_t i = 0; i < self->l->n; i++)
            if (tpl_equal(&self->l->v[i], a0)) {
                if (n[0] == 'i') return tpl_int((int64_t)i);
                k++;
            }
        if (n[0] == 'i') tpl_raise(rt, "value is not in list");
        return tpl_int(k);
    }
    if (self->kind == TV_LOOP) {
        tpl_loop *lp = self->loop;
        if (!strcmp(n, "cycle")) {
            if (!a->npos) tpl_raise(rt, "no items for cycling given");
            return a->pos[lp->i % a->npos];
        }
        tpl_val cur = tpl_new_list(rt, a->npos);
        for (size_t i = 0; i < a->npos; i++)
            tpl_list_push(rt, cur.l, a->pos[i]);
        int changed = !lp->has_changed || !tpl_equal(&lp->last_changed, &cur);
        lp->last_changed = cur;
        lp->has_changed = 1;
        return tpl_bool(changed);
    }
    tpl_raise(rt, "'%s' object has no method '%s'", tpl_type_name(self), n);
}

/* ---- global functions ------------------------------------------------------------------- */

static void fill_from(tpl_rt *rt, tpl_dict *d, const tpl_args *a, const char *what) {
    if (a->npos > 1) tpl_raise(rt, "%s expected at most 1 positional argument", what);
    if (a->npos == 1) {
        const tpl_val *src = &a->pos[0];
        if (src->kind == TV_DICT || src->kind == TV_NS) {
            for (size_t i = 0; i < src->d->n; i++)
                tpl_dict_set(rt, d, src->d->k[i], src->d->v[i]);
        } else {
            tpl_list *l = tpl_iter(rt, src);
            for (size_t i = 0; i < l->n; i++) {
                tpl_list *pair = tpl_iter(rt, &l->v[i]);
                if (pair->n != 2) tpl_raise(rt, "%s: sequence elements must be pairs", what);
                tpl_dict_set(rt, d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (size_t k = 0; k < a->nkw; k++)
        tpl_dict_set(rt, d, tpl_cstr(a->kwn[k]), a->kwv[k]);
}

tpl_val tpl_call_global(tpl_rt *rt, int fn, const tpl_args *a) {
    switch (fn) {
    case TPL_FN_RANGE: {
        if (a->nkw || !a->npos || a->npos > 3)
            tpl_raise(rt, "range expected 1 to 3 positional arguments");
        int64_t v[3];
        for (size_t i = 0; i < a->npos; i++) {
            if (a->pos[i].kind != TV_INT && a->pos[i].kind != TV_BOOL)
                tpl_raise(rt, "'%s' object cannot be interpreted as an integer",
                          tpl_type_name(&a->pos[i]));
            v[i] = a->pos[i].kind == TV_INT ? a->pos[i].i : a->pos[i].b;
        }
        int64_t start = a->npos > 1 ? v[0] : 0, stop = a->npos > 1 ? v[1] : v[0];
        int64_t step = a->npos > 2 ? v[2] : 1;
        if (!step) tpl_raise(rt, "range() arg 3 must not be zero");
        __int128 count = step > 0 ? ((__int128)stop - start + step - 1) / step
                                  : ((__int128)start - stop - step - 1) / -step;
        if (count < 0) count = 0;
        if (count > 100000)
            tpl_raise(rt,
                      "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tpl_val l = tpl_new_list(rt, (size_t)count);
        for (int64_t i = 0; i < (int64_t)count; i++)
            tpl_list_push(rt, l.l, tpl_int(start + i * step));
        return l;
    }
    case TPL_FN_NAMESPACE:
    case TPL_FN_DICT: {
        tpl_val d = tpl_new_dict(rt, a->nkw);
        fill_from(rt, d.d, a, fn == TPL_FN_DICT ? "dict" : "namespace");
        if (fn == TPL_FN_NAMESPACE) d.kind = TV_NS;
        return d;
    }
    case TPL_FN_RAISE: {
        const tpl_val *m = tpl_arg(a, 0, "message");
        tpl_val s = m ? tpl_as_str(rt, m) : tpl_cstr("");
        tpl_raise(rt, "%.*s", (int)(s.s.n > 400 ? 400 : s.s.n), s.s.p);
    }
    case TPL_FN_STRFTIME: {
        const tpl_val *f = tpl_arg(a, 0, "format");
        if (!f || f->kind != TV_STR) tpl_raise(rt, "strftime_now expects a format string");
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f->s.n > 255 ? 255 : f->s.n), f->s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(out, sizeof out, fmt, &tm);
        return tpl_str(rt, out, n);
    }
    default: tpl_raise(rt, "internal error: unknown function %d", fn);
    }
}

void tpl_define_globals(tpl_rt *rt, tpl_scope *s) {
    static const struct {
        const char *name;
        int fn;
    } g[] = {{"range", TPL_FN_RANGE},
             {"namespace", TPL_FN_NAMESPACE},
             {"dict", TPL_FN_DICT},
             {"raise_exception", TPL_FN_RAISE},
             {"strftime_now", TPL_FN_STRFTIME}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        tpl_val v = {.kind = TV_FUNC};
        v.func = g[i].fn;
        tpl_scope_set(rt, s, g[i].name, v);
    }
}
