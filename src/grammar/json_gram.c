/* JSON's terminals and the rules for any value. */
#include "grammar/json_gram.h"

#include "base/err.h"
#include "grammar/dfa.h"

#define WS " \t\n\r"

void lily_jgram_init(lily_jgram *j, lily_gbuild *b) {
    *j = (lily_jgram){.b = b};
    j->r_value = j->r_object = j->r_array = j->r_number = j->r_integer = -1;
}

/* ws? c ws? as one terminal, with whitespace before and/or after as asked. */
static int32_t punct(lily_jgram *j, const char *c, int before, int after) {
    lily_dfa_item it[3];
    size_t n = 0;
    if (before) it[n++] = lily_dfa_bytes(WS, 0, LILY_JSON_WS_MAX);
    it[n++] = lily_dfa_bytes(c, 1, 1);
    if (after) it[n++] = lily_dfa_bytes(WS, 0, LILY_JSON_WS_MAX);
    return lily_dfa_seq(j->b, it, n);
}

#define LAZY(field, expr)                 \
    do {                                  \
        if (!j->field) j->field = (expr); \
        return j->field;                  \
    } while (0)

int32_t lily_jgram_obj_open(lily_jgram *j) {
    LAZY(t_obj_open, punct(j, "{", 0, 1));
}
int32_t lily_jgram_obj_close(lily_jgram *j) {
    LAZY(t_obj_close, punct(j, "}", 1, 0));
}
int32_t lily_jgram_obj_empty(lily_jgram *j) {
    LAZY(t_obj_empty, punct(j, "}", 0, 0));
}
int32_t lily_jgram_arr_open(lily_jgram *j) {
    LAZY(t_arr_open, punct(j, "[", 0, 1));
}
int32_t lily_jgram_arr_close(lily_jgram *j) {
    LAZY(t_arr_close, punct(j, "]", 1, 0));
}
int32_t lily_jgram_arr_empty(lily_jgram *j) {
    LAZY(t_arr_empty, punct(j, "]", 0, 0));
}
int32_t lily_jgram_comma(lily_jgram *j) {
    LAZY(t_comma, punct(j, ",", 1, 1));
}
int32_t lily_jgram_colon(lily_jgram *j) {
    LAZY(t_colon, punct(j, ":", 1, 1));
}
int32_t lily_jgram_string(lily_jgram *j) {
    LAZY(t_string, lily_dfa_json_string(j->b, 0, -1));
}
int32_t lily_jgram_null(lily_jgram *j) {
    LAZY(t_null, lily_dfa_literal(j->b, "null", 4));
}

int32_t lily_jgram_bool(lily_jgram *j) {
    static const char *const s[] = {"true", "false"};
    static const size_t n[] = {4, 5};
    LAZY(t_bool, lily_dfa_literals(j->b, s, n, 2));
}

#define ALT(rule, ...)                                                     \
    do {                                                                   \
        const lily_gelem seq_[] = {__VA_ARGS__};                           \
        lily_gbuild_alt(j->b, (rule), seq_, sizeof seq_ / sizeof seq_[0]); \
    } while (0)

int32_t lily_jgram_integer(lily_jgram *j) {
    if (j->r_integer >= 0) return j->r_integer;
    int32_t r = j->r_integer = lily_gbuild_rule(j->b);
    lily_dfa_item zero[] = {lily_dfa_bytes("-", 0, 1), lily_dfa_bytes("0", 1, 1)};
    lily_dfa_item digits[] = {lily_dfa_bytes("-", 0, 1), lily_dfa_range('1', '9', 1, 1),
                              lily_dfa_range('0', '9', 0, 15)};
    ALT(r, lily_gterm(lily_dfa_seq(j->b, zero, 2)));
    ALT(r, lily_gterm(lily_dfa_seq(j->b, digits, 3)));
    return r;
}

int32_t lily_jgram_number(lily_jgram *j) {
    if (j->r_number >= 0) return j->r_number;
    int32_t r = j->r_number = lily_gbuild_rule(j->b);
    int32_t tail = lily_gbuild_rule(j->b);
    lily_dfa_item frac[] = {lily_dfa_bytes(".", 1, 1), lily_dfa_range('0', '9', 1, 16),
                            lily_dfa_bytes("eE", 1, 1), lily_dfa_bytes("+-", 0, 1),
                            lily_dfa_range('0', '9', 1, 2)}; /* e99 at most: a double */
    lily_gbuild_alt(j->b, tail, NULL, 0);
    ALT(tail, lily_gterm(lily_dfa_seq(j->b, frac, 2)));     /* .5 */
    ALT(tail, lily_gterm(lily_dfa_seq(j->b, frac + 2, 3))); /* e5 */
    ALT(tail, lily_gterm(lily_dfa_seq(j->b, frac, 5)));     /* .5e5 */
    ALT(r, lily_gref(lily_jgram_integer(j)), lily_gref(tail));
    return r;
}

/* value, object and array refer to each other: make the three rule ids first. */
static void any_rules(lily_jgram *j) {
    if (j->r_value >= 0) return;
    lily_gbuild *b = j->b;
    int32_t v = j->r_value = lily_gbuild_rule(b);
    int32_t o = j->r_object = lily_gbuild_rule(b);
    int32_t a = j->r_array = lily_gbuild_rule(b);
    ALT(v, lily_gref(o));
    ALT(v, lily_gref(a));
    ALT(v, lily_gterm(lily_jgram_string(j)));
    ALT(v, lily_gref(lily_jgram_number(j)));
    ALT(v, lily_gterm(lily_jgram_bool(j)));
    ALT(v, lily_gterm(lily_jgram_null(j)));
    int32_t members = lily_gbuild_rule(b), more = lily_gbuild_rule(b);
    ALT(o, lily_gterm(lily_jgram_obj_open(j)), lily_gterm(lily_jgram_obj_empty(j)));
    ALT(o, lily_gterm(lily_jgram_obj_open(j)), lily_gref(members));
    ALT(members, lily_gterm(lily_jgram_string(j)), lily_gterm(lily_jgram_colon(j)), lily_gref(v),
        lily_gref(more));
    ALT(more, lily_gterm(lily_jgram_obj_close(j)));
    ALT(more, lily_gterm(lily_jgram_comma(j)), lily_gref(members));
    int32_t items = lily_gbuild_rule(b), rest = lily_gbuild_rule(b);
    ALT(a, lily_gterm(lily_jgram_arr_open(j)), lily_gterm(lily_jgram_arr_empty(j)));
    ALT(a, lily_gterm(lily_jgram_arr_open(j)), lily_gref(items));
    ALT(items, lily_gref(v), lily_gref(rest));
    ALT(rest, lily_gterm(lily_jgram_arr_close(j)));
    ALT(rest, lily_gterm(lily_jgram_comma(j)), lily_gref(items));
}

int32_t lily_jgram_value(lily_jgram *j) {
    any_rules(j);
    return j->r_value;
}

int32_t lily_jgram_object(lily_jgram *j) {
    any_rules(j);
    return j->r_object;
}

int32_t lily_jgram_array(lily_jgram *j) {
    any_rules(j);
    return j->r_array;
}

int lily_grammar_json_object(lily_grammar **out, lily_err *e) {
    lily_gbuild *b = lily_gbuild_new();
    lily_jgram j;
    lily_jgram_init(&j, b);
    return lily_gbuild_finish(b, lily_jgram_object(&j), out, e);
}
