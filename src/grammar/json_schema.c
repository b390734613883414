/* The JSON Schema compiler: one rule per schema node, $ref targets memoised so that recursive
 * schemas become recursive rules (the matcher's stack holds the nesting). */
#include "grammar/json_schema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/dfa.h"
#include "grammar/int_range.h"
#include "grammar/json_gram.h"

#define MAX_NESTING    128
#define MAX_ITEMS      1024
#define MAX_PROPERTIES 1024
#define MAX_LENGTH     4096
#define MAX_LITERALS   (1 << 20) /* bytes of enum / const values */

typedef struct ref_memo {
    const cJSON *node;
    const char *raw_stop;
    int32_t rule;
} ref_memo;

typedef struct jsc {
    lily_jgram j;
    lily_gbuild *b;
    const cJSON *root;
    ref_memo *memo;
    size_t n_memo, cap_memo;
    size_t lit_bytes;
    int depth;
    const char *raw_stop; /* non-NULL: strings as bare text without it (lily_schema_rule_at) */
    lily_err *e;
} jsc;

#define ALT(rule, ...)                                                     \
    do {                                                                   \
        const lily_gelem seq_[] = {__VA_ARGS__};                           \
        lily_gbuild_alt(c->b, (rule), seq_, sizeof seq_ / sizeof seq_[0]); \
    } while (0)

static int32_t compile(jsc *c, const cJSON *s);

static int32_t fail(jsc *c, const char *fmt, const char *what) {
    lily_fail(c->e, fmt, what);
    return -1;
}

/* ---- keywords ------------------------------------------------------------------------------ */

static const char *const ignored_kw[] = {
    "title",      "description", "default",   "examples", "$schema",     "$id", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", NULL};
static const char *const known_kw[] = {"type",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "items",
                                       "minItems",
                                       "maxItems",
                                       "enum",
                                       "const",
                                       "anyOf",
                                       "allOf",
                                       "$ref",
                                       "format",
                                       "minLength",
                                       "maxLength",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum",
                                       NULL};
static const char *const bound_kw[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                       NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

/* Every keyword of s must be known; with `only` set, s may hold no constraint but that one. */
static int check_keywords(jsc *c, const cJSON *s, const char *only) {
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!k->string || in_list(ignored_kw, k->string)) continue;
        if (!strcmp(k->string, "uniqueItems") && cJSON_IsFalse(k)) continue;
        if (!in_list(known_kw, k->string))
            return fail(c, "unsupported JSON Schema keyword '%s'", k->string), -1;
        if (only && strcmp(k->string, only)) {
            lily_fail(c->e, "unsupported JSON Schema: '%s' beside '%s'", k->string, only);
            return -1;
        }
    }
    return 0;
}

/* A non-negative integer keyword, at most max; dflt when absent. -2 on error. */
static int int_kw(jsc *c, const cJSON *s, const char *name, int dflt, int max) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, name);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        fail(c, "'%s' must be a non-negative integer", name);
        return -2;
    }
    if (v->valuedouble > max) {
        lily_fail(c->e, "unsupported JSON Schema: '%s' above %d", name, max);
        return -2;
    }
    return (int)v->valuedouble;
}

/* ---- leaves -------------------------------------------------------------------------------- */

static int32_t single(jsc *c, lily_gelem x) {
    int32_t r = lily_gbuild_rule(c->b);
    lily_gbuild_alt(c->b, r, &x, 1);
    return r;
}

/* enum / const: the values in their compact JSON form, as one trie terminal. */
static int32_t literals(jsc *c, const cJSON *values, int n, const char *kw) {
    if (n == 0) return fail(c, "'%s' is empty (nothing can match)", kw);
    char **s = lily_xcalloc((size_t)n, sizeof *s);
    size_t *len = lily_xcalloc((size_t)n, sizeof *len);
    int i = 0, bad = 0;
    for (const cJSON *v = values; v && i < n; v = v->next, i++) {
        s[i] =
            c->raw_stop && cJSON_IsString(v) ? strdup(v->valuestring) : cJSON_PrintUnformatted(v);
        if (!s[i]) {
            bad = 1;
            break;
        }
        len[i] = strlen(s[i]);
        c->lit_bytes += len[i];
    }
    int32_t r = -1;
    if (bad)
        lily_fail(c->e, "'%s': a value cannot be printed as JSON", kw);
    else if (c->lit_bytes > MAX_LITERALS)
        fail(c, "'%s' values too large", kw);
    else
        r = single(c, lily_gterm(lily_dfa_literals(c->b, (const char *const *)s, len, (size_t)n)));
    for (int k = 0; k < n; k++)
        free(s[k]);
    free(s);
    free(len);
    return r;
}

static int32_t seq_term(jsc *c, const lily_dfa_item *items, size_t n) {
    return lily_dfa_seq(c->b, items, n);
}

/* Two-digit fields with a range: one alternative per leading digit. */
static int32_t two_digits(jsc *c, int lo, int hi) {
    int32_t r = lily_gbuild_rule(c->b);
    for (int d = lo / 10; d <= hi / 10; d++) {
        int a = d * 10 > lo ? 0 : lo % 10, z = d * 10 + 9 < hi ? 9 : hi % 10;
        lily_dfa_item it[2] = {lily_dfa_range('0' + (unsigned)d, '0' + (unsigned)d, 1, 1),
                               lily_dfa_range('0' + (unsigned)a, '0' + (unsigned)z, 1, 1)};
        ALT(r, lily_gterm(seq_term(c, it, 2)));
    }
    return r;
}

static int32_t lit_term(jsc *c, const char *s) {
    return lily_dfa_literal(c->b, s, strlen(s));
}

/* Two-digit strings: the multiples of 4 from `from` (00 or 04) to 96. */
static int32_t fours(jsc *c, int from) {
    char s[25][3];
    const char *p[25];
    size_t n[25], k = 0;
    for (int v = from; v <= 96; v += 4, k++) {
        s[k][0] = (char)('0' + v / 10), s[k][1] = (char)('0' + v % 10), s[k][2] = 0;
        p[k] = s[k], n[k] = 2;
    }
    return lily_dfa_literals(c->b, p, n, k);
}

/* A calendar date: the days each month has, February 29th in leap years only (a multiple of 4,
 * not of 100 unless of 400), as date validators check it. */
static int32_t date_core(jsc *c) {
    int32_t r = lily_gbuild_rule(c->b), md = lily_gbuild_rule(c->b);
    const char *const m31[] = {"01", "03", "05", "07", "08", "10", "12"}, *const m30[] = {
                                                                              "04", "06", "09",
                                                                              "11"};
    const size_t two[7] = {2, 2, 2, 2, 2, 2, 2};
    const int32_t dash = lit_term(c, "-");
    ALT(md, lily_gterm(lily_dfa_literals(c->b, m31, two, 7)), lily_gterm(dash),
        lily_gref(two_digits(c, 1, 31)));
    ALT(md, lily_gterm(lily_dfa_literals(c->b, m30, two, 4)), lily_gterm(dash),
        lily_gref(two_digits(c, 1, 30)));
    ALT(md, lily_gterm(lit_term(c, "02-")), lily_gref(two_digits(c, 1, 28)));
    const lily_dfa_item dd[1] = {lily_dfa_range('0', '9', 2, 2)};
    const int32_t any2 = seq_term(c, dd, 1), feb29 = lit_term(c, "-02-29");
    ALT(r, lily_gterm(any2), lily_gterm(any2), lily_gterm(dash), lily_gref(md));
    ALT(r, lily_gterm(any2), lily_gterm(fours(c, 4)), lily_gterm(feb29)); /* 4 | y, 100 does not */
    ALT(r, lily_gterm(fours(c, 0)), lily_gterm(lit_term(c, "00")), lily_gterm(feb29)); /* 400 | y */
    return r;
}

static int32_t time_core(jsc *c) {
    int32_t r = lily_gbuild_rule(c->b), frac = lily_gbuild_rule(c->b), tz = lily_gbuild_rule(c->b);
    int32_t hour = two_digits(c, 0, 23), min = two_digits(c, 0, 59);
    lily_dfa_item f[2] = {lily_dfa_bytes(".", 1, 1), lily_dfa_range('0', '9', 1, 9)};
    lily_gbuild_alt(c->b, frac, NULL, 0);
    ALT(frac, lily_gterm(seq_term(c, f, 2)));
    ALT(tz, lily_gterm(lily_dfa_literals(c->b, (const char *const[]){"Z", "z"},
                                         (const size_t[]){1, 1}, 2)));
    ALT(tz,
        lily_gterm(
            lily_dfa_literals(c->b, (const char *const[]){"+", "-"}, (const size_t[]){1, 1}, 2)),
        lily_gref(hour), lily_gterm(lit_term(c, ":")), lily_gref(min));
    int32_t colon = lit_term(c, ":");
    ALT(r, lily_gref(hour), lily_gterm(colon), lily_gref(min), lily_gterm(colon),
        lily_gref(two_digits(c, 0, 59)), lily_gref(frac), lily_gref(tz));
    return r;
}

static int32_t string_format(jsc *c, const char *f) {
    int32_t r = lily_gbuild_rule(c->b);
    /* the quotes: a rule that is empty for bare text */
    int32_t q = lily_gbuild_rule(c->b);
    if (c->raw_stop)
        lily_gbuild_alt(c->b, q, NULL, 0);
    else
        ALT(q, lily_gterm(lit_term(c, "\"")));
    if (!strcmp(f, "date")) {
        ALT(r, lily_gref(q), lily_gref(date_core(c)), lily_gref(q));
    } else if (!strcmp(f, "time")) {
        ALT(r, lily_gref(q), lily_gref(time_core(c)), lily_gref(q));
    } else if (!strcmp(f, "date-time")) {
        ALT(r, lily_gref(q), lily_gref(date_core(c)), lily_gterm(lit_term(c, "T")),
            lily_gref(time_core(c)), lily_gref(q));
    } else if (!strcmp(f, "uuid")) {
        static const int groups[] = {8, 4, 4, 4, 12};
        lily_dfa_item it[9];
        size_t n = 0;
        for (int g = 0; g < 5; g++) {
            if (g) it[n++] = lily_dfa_bytes("-", 1, 1);
            it[n++] = lily_dfa_bytes("0123456789abcdefABCDEF", groups[g], groups[g]);
        }
        ALT(r, lily_gref(q), lily_gterm(seq_term(c, it, n)), lily_gref(q));
    } else {
        return fail(c, "unsupported JSON Schema string format '%s'", f);
    }
    return r;
}

static int32_t compile_string(jsc *c, const cJSON *s) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        if (!cJSON_IsString(f)) return fail(c, "'%s' must be a string", "format");
        return string_format(c, f->valuestring);
    }
    int lo = int_kw(c, s, "minLength", 0, MAX_LENGTH),
        hi = int_kw(c, s, "maxLength", -1, MAX_LENGTH);
    if (lo == -2 || hi == -2) return -1;
    if (hi >= 0 && hi < lo) return fail(c, "%s: maxLength below minLength", "string");
    if (c->raw_stop) return single(c, lily_gterm(lily_dfa_raw_text(c->b, lo, hi, c->raw_stop)));
    if (lo == 0 && hi < 0) return single(c, lily_gterm(lily_jgram_string(&c->j)));
    return single(c, lily_gterm(lily_dfa_json_string(c->b, lo, hi)));
}

/* ---- objects and arrays -------------------------------------------------------------------- */

static int32_t key_term(jsc *c, const char *name) {
    cJSON *k = cJSON_CreateString(name);
    char *s = cJSON_PrintUnformatted(k);
    int32_t t = lily_dfa_literal(c->b, s, strlen(s));
    free(s);
    cJSON_Delete(k);
    return t;
}

static int is_required(const cJSON *req, const char *name) {
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, name)) return 1;
    return 0;
}

static int32_t compile_object(jsc *c, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "'%s' must be an object", "properties");
    if (req && !cJSON_IsArray(req)) return fail(c, "'%s' must be an array", "required");
    if (addl && !cJSON_IsBool(addl))
        return fail(c, "unsupported JSON Schema: '%s' with a schema", "additionalProperties");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return fail(c, "'%s' entries must be strings", "required");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(c, "required property '%s' is not in properties", r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n > MAX_PROPERTIES)
        return fail(c, "unsupported JSON Schema: more than %s properties in one object", "1024");
    int32_t open = lily_jgram_obj_open(&c->j);
    if (n == 0) {
        if (!addl || cJSON_IsTrue(addl)) return lily_jgram_object(&c->j);
        int32_t r = lily_gbuild_rule(c->b);
        ALT(r, lily_gterm(open), lily_gterm(lily_jgram_obj_empty(&c->j)));
        return r;
    }
    /* seq[i][e]: the members from property i on, e = whether one was written before (a comma
     * is then due). Built from the last property back. */
    int32_t(*seq)[2] = lily_xmalloc(((size_t)n + 1) * sizeof *seq);
    int32_t *kv = lily_xmalloc(((size_t)n + 1) * sizeof *kv);
    const cJSON **pr = lily_xmalloc(((size_t)n + 1) * sizeof *pr);
    int i = 0, rc = 0;
    for (const cJSON *p = props->child; p && i < n; p = p->next)
        pr[i++] = p;
    for (i = 0; i < n && !rc; i++) { /* in schema order, so errors name the first bad one */
        int32_t v = compile(c, pr[i]);
        if (v < 0) {
            rc = -1;
            break;
        }
        kv[i] = lily_gbuild_rule(c->b);
        ALT(kv[i], lily_gterm(key_term(c, pr[i]->string)), lily_gterm(lily_jgram_colon(&c->j)),
            lily_gref(v));
    }
    int32_t r = -1;
    if (!rc) {
        int32_t comma = lily_jgram_comma(&c->j);
        for (int e = 0; e < 2; e++) {
            seq[n][e] = lily_gbuild_rule(c->b);
            lily_gbuild_alt(c->b, seq[n][e], NULL, 0);
        }
        for (i = n - 1; i >= 0; i--) {
            int opt = !is_required(req, pr[i]->string);
            for (int e = 0; e < 2; e++) {
                int32_t x = seq[i][e] = lily_gbuild_rule(c->b);
                if (e)
                    ALT(x, lily_gterm(comma), lily_gref(kv[i]), lily_gref(seq[i + 1][1]));
                else
                    ALT(x, lily_gref(kv[i]), lily_gref(seq[i + 1][1]));
                if (opt) ALT(x, lily_gref(seq[i + 1][e]));
            }
        }
        r = lily_gbuild_rule(c->b);
        ALT(r, lily_gterm(open), lily_gref(seq[0][0]), lily_gterm(lily_jgram_obj_close(&c->j)));
    }
    free(seq);
    free(kv);
    free(pr);
    return r;
}

static int32_t compile_array(jsc *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int lo = int_kw(c, s, "minItems", 0, MAX_ITEMS), hi = int_kw(c, s, "maxItems", -1, MAX_ITEMS);
    if (lo == -2 || hi == -2) return -1;
    if (hi >= 0 && hi < lo) return fail(c, "%s: maxItems below minItems", "array");
    int32_t item = items ? compile(c, items) : lily_jgram_value(&c->j);
    if (item < 0) return -1;
    int32_t open = lily_jgram_arr_open(&c->j), close = lily_jgram_arr_close(&c->j);
    int32_t comma = lily_jgram_comma(&c->j);
    int32_t r = lily_gbuild_rule(c->b);
    if (hi == 0) {
        ALT(r, lily_gterm(open), lily_gterm(lily_jgram_arr_empty(&c->j)));
        return r;
    }
    /* rest[i]: what follows the i-th item (1-based); the last one loops when unbounded */
    int k = hi >= 0 ? hi : (lo > 1 ? lo : 1);
    int32_t *rest = lily_xmalloc(((size_t)k + 1) * sizeof *rest);
    for (int i = 1; i <= k; i++)
        rest[i] = lily_gbuild_rule(c->b);
    for (int i = 1; i <= k; i++) {
        if (i >= lo) ALT(rest[i], lily_gterm(close));
        if (i < k)
            ALT(rest[i], lily_gterm(comma), lily_gref(item), lily_gref(rest[i + 1]));
        else if (hi < 0)
            ALT(rest[i], lily_gterm(comma), lily_gref(item), lily_gref(rest[i]));
    }
    if (lo == 0) ALT(r, lily_gterm(open), lily_gterm(lily_jgram_arr_empty(&c->j)));
    ALT(r, lily_gterm(open), lily_gref(item), lily_gref(rest[1]));
    free(rest);
    return r;
}

/* ---- bounded integers ---------------------------------------------------------------------- */

/* The first bound keyword of s, or NULL. */
static const char *bound_of(const cJSON *s) {
    for (const char *const *k = bound_kw; *k; k++)
        if (cJSON_GetObjectItemCaseSensitive(s, *k)) return *k;
    return NULL;
}

/* An integer with minimum / maximum / exclusiveMinimum / exclusiveMaximum (JSON Schema 2020-12:
 * the exclusive ones are numbers), within 16 digits as any integer here. */
static int32_t compile_integer(jsc *c, const cJSON *s) {
    if (!bound_of(s)) return lily_jgram_integer(&c->j);
    double lo = -(double)LILY_INT_RANGE_MAX, hi = (double)LILY_INT_RANGE_MAX;
    for (const char *const *k = bound_kw; *k; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, *k);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return fail(c, "'%s' must be a number", *k);
        const double x = v->valuedouble;
        if (!strcmp(*k, "minimum")) lo = fmax(lo, ceil(x));
        if (!strcmp(*k, "exclusiveMinimum")) lo = fmax(lo, floor(x) + 1);
        if (!strcmp(*k, "maximum")) hi = fmin(hi, floor(x));
        if (!strcmp(*k, "exclusiveMaximum")) hi = fmin(hi, ceil(x) - 1);
    }
    if (lo > (double)LILY_INT_RANGE_MAX || hi < -(double)LILY_INT_RANGE_MAX)
        return fail(c, "unsupported JSON Schema: integer bounds beyond %s digits", "16");
    if (lo > hi) return fail(c, "%s: the bounds leave no integer", "integer");
    /* the limit is not a double: clamp as integers */
    const int64_t a = lo <= -(double)LILY_INT_RANGE_MAX ? -LILY_INT_RANGE_MAX : (int64_t)lo;
    const int64_t z = hi >= (double)LILY_INT_RANGE_MAX ? LILY_INT_RANGE_MAX : (int64_t)hi;
    return lily_int_range_rule(c->b, a, z);
}

/* ---- dispatch ------------------------------------------------------------------------------ */

/* an object or array: JSON all the way down, bare strings or not at the top */
static int32_t compile_nested(jsc *c, const cJSON *s, int32_t (*f)(jsc *, const cJSON *)) {
    const char *raw = c->raw_stop;
    c->raw_stop = NULL;
    int32_t r = f(c, s);
    c->raw_stop = raw;
    return r;
}

static int32_t compile_type(jsc *c, const cJSON *s, const char *t) {
    if (!strcmp(t, "object")) return compile_nested(c, s, compile_object);
    if (!strcmp(t, "array")) return compile_nested(c, s, compile_array);
    if (!strcmp(t, "string")) return compile_string(c, s);
    if (!strcmp(t, "number") && bound_of(s))
        return fail(c, "unsupported JSON Schema: '%s' on a number (integers only)", bound_of(s));
    if (!strcmp(t, "number")) return lily_jgram_number(&c->j);
    if (!strcmp(t, "integer")) return compile_integer(c, s);
    if (!strcmp(t, "boolean")) return single(c, lily_gterm(lily_jgram_bool(&c->j)));
    if (!strcmp(t, "null")) return single(c, lily_gterm(lily_jgram_null(&c->j)));
    return fail(c, "unknown JSON Schema type '%s'", t);
}

/* "#", "#/a/b" with ~0 ~1 escapes; NULL if it does not resolve. */
static const cJSON *resolve(jsc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *n = c->root;
    const char *p = ref + 1;
    char tok[256];
    while (*p == '/' && n) {
        size_t k = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (k + 1 >= sizeof tok) return NULL;
            tok[k++] = ch;
        }
        tok[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(tok, &end, 10);
            n = *end || !k ? NULL : cJSON_GetArrayItem(n, (int)i);
        } else {
            n = cJSON_IsObject(n) ? cJSON_GetObjectItemCaseSensitive(n, tok) : NULL;
        }
    }
    return *p ? NULL : n;
}

static int32_t compile_ref(jsc *c, const cJSON *ref) {
    if (!cJSON_IsString(ref)) return fail(c, "'%s' must be a string", "$ref");
    const cJSON *target = resolve(c, ref->valuestring);
    if (!target)
        return fail(c,
                    "unsupported or unresolved $ref '%s' (only refs into this "
                    "document: \"#\", \"#/$defs/...\")",
                    ref->valuestring);
    for (size_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == target && c->memo[i].raw_stop == c->raw_stop) return c->memo[i].rule;
    int32_t r = lily_gbuild_rule(c->b);
    if (c->n_memo == c->cap_memo) {
        c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 16;
        c->memo = lily_xrealloc(c->memo, c->cap_memo * sizeof *c->memo);
    }
    c->memo[c->n_memo++] = (ref_memo){target, c->raw_stop, r};
    int32_t body = compile(c, target);
    if (body < 0) return -1;
    ALT(r, lily_gref(body));
    return r;
}

static int32_t compile_any_of(jsc *c, const cJSON *list, const char *kw) {
    int n = cJSON_GetArraySize(list);
    if (!cJSON_IsArray(list) || n == 0) return fail(c, "'%s' must be a non-empty array", kw);
    int32_t r = lily_gbuild_rule(c->b);
    for (const cJSON *x = list->child; x; x = x->next) {
        int32_t a = compile(c, x);
        if (a < 0) return -1;
        ALT(r, lily_gref(a));
    }
    return r;
}

static int32_t compile_node(jsc *c, const cJSON *s) {
    if (cJSON_IsTrue(s)) return lily_jgram_value(&c->j);
    if (cJSON_IsFalse(s)) return fail(c, "%s", "the schema 'false' matches nothing");
    if (!cJSON_IsObject(s)) return fail(c, "%s", "a schema must be an object or a boolean");
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (check_keywords(c, s, "$ref")) return -1;
        return compile_ref(c, x);
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        if (check_keywords(c, s, "anyOf")) return -1;
        return compile_any_of(c, x, "anyOf");
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (check_keywords(c, s, "allOf")) return -1;
        if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 1)
            return fail(c, "unsupported JSON Schema: '%s' with other than one member", "allOf");
        return compile(c, x->child);
    }
    if (check_keywords(c, s, NULL)) return -1;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(x)) return fail(c, "'%s' must be an array", "enum");
        return literals(c, x->child, cJSON_GetArraySize(x), "enum");
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "const"))) return literals(c, x, 1, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) return compile_type(c, s, type->valuestring);
    if (cJSON_IsArray(type)) {
        if (cJSON_GetArraySize(type) == 0) return fail(c, "'%s' is an empty list", "type");
        int32_t r = lily_gbuild_rule(c->b);
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return fail(c, "'%s' entries must be strings", "type");
            int32_t a = compile_type(c, s, t->valuestring);
            if (a < 0) return -1;
            ALT(r, lily_gref(a));
        }
        return r;
    }
    if (type) return fail(c, "'%s' must be a string or a list of strings", "type");
    if (bound_of(s))
        return fail(c, "unsupported JSON Schema: '%s' without type integer", bound_of(s));
    if (cJSON_GetObjectItemCaseSensitive(s, "properties"))
        return compile_nested(c, s, compile_object);
    if (cJSON_GetObjectItemCaseSensitive(s, "items")) return compile_nested(c, s, compile_array);
    return lily_jgram_value(&c->j);
}

static int32_t compile(jsc *c, const cJSON *s) {
    if (++c->depth > MAX_NESTING) return fail(c, "schema nested deeper than %s", "128");
    if (lily_gbuild_too_big(c->b)) return fail(c, "%s", "schema too large");
    int32_t r = compile_node(c, s);
    c->depth--;
    return r;
}

int lily_grammar_from_schema(const cJSON *schema, lily_grammar **out, lily_err *e) {
    *out = NULL;
    jsc c = {.b = lily_gbuild_new(), .root = schema, .e = e};
    lily_jgram_init(&c.j, c.b);
    int32_t root = compile(&c, schema);
    free(c.memo);
    if (root < 0) {
        lily_gbuild_free(c.b);
        return -1;
    }
    if (lily_gbuild_finish(c.b, root, out, e)) return lily_fail_prefix(e, "%s", "JSON Schema");
    return 0;
}

int32_t lily_schema_rule_at(lily_jgram *j, const cJSON *root, const cJSON *schema,
                            const char *raw_stop, lily_err *e) {
    jsc c = {.j = *j, .b = j->b, .root = root, .raw_stop = raw_stop, .e = e};
    int32_t r = compile(&c, schema);
    free(c.memo);
    *j = c.j;
    return r;
}

int32_t lily_schema_rule(lily_jgram *j, const cJSON *schema, lily_err *e) {
    jsc c = {.j = *j, .b = j->b, .root = schema, .e = e};
    int32_t r = compile(&c, schema);
    free(c.memo);
    *j = c.j;
    return r;
}

int lily_grammar_from_schema_text(const char *json, size_t len, lily_grammar **out, lily_err *e) {
    *out = NULL;
    cJSON *s = cJSON_ParseWithLength(json, len);
    if (!s) return lily_fail(e, "JSON Schema: not valid JSON");
    int rc = lily_grammar_from_schema(s, out, e);
    cJSON_Delete(s);
    return rc;
}
