/* Template evaluator (see tpl_eval.h): statements, expressions, operators and macro calls. */
#include "chat/tpl_eval.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chat/tpl_filters.h"
#include "chat/tpl_format.h"
#include "chat/tpl_methods.h"

/* ---- arguments and scopes --------------------------------------------------------------- */

const tpl_val *tpl_arg(const tpl_args *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

void tpl_args_check(tpl_rt *rt, const tpl_args *a, size_t max_pos, const char *const *names,
                    const char *what) {
    if (a->npos > max_pos)
        tpl_raise(rt, "%s takes at most %zu positional argument(s) (%zu given)", what, max_pos,
                  a->npos);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t j = 0;
        while (names && names[j] && strcmp(names[j], a->kwn[k]))
            j++;
        if (!names || !names[j])
            tpl_raise(rt, "%s got an unexpected keyword argument '%s'", what, a->kwn[k]);
    }
}

tpl_scope *tpl_scope_new(tpl_rt *rt, tpl_scope *parent) {
    tpl_scope *s = tpl_alloc(rt, sizeof *s);
    s->parent = parent;
    return s;
}

void tpl_scope_set(tpl_rt *rt, tpl_scope *s, const char *name, tpl_val v) {
    tpl_dict_set(rt, &s->vars, tpl_cstr(name), v);
}

static tpl_val lookup(tpl_rt *rt, const char *name) {
    size_t n = strlen(name);
    for (tpl_scope *s = rt->scope; s; s = s->parent) {
        tpl_val *v = tpl_dict_getn(&s->vars, name, n);
        if (v) return *v;
    }
    return tpl_undef(name, NULL);
}

tpl_list *tpl_iter(tpl_rt *rt, const tpl_val *v) {
    switch (v->kind) {
    case TV_LIST: return v->l;
    case TV_UNDEF: return tpl_new_list(rt, 0).l;
    case TV_DICT: {
        tpl_list *l = tpl_new_list(rt, v->d->n).l;
        for (size_t i = 0; i < v->d->n; i++)
            tpl_list_push(rt, l, v->d->k[i]);
        return l;
    }
    case TV_STR: {
        tpl_list *l = tpl_new_list(rt, v->s.n).l;
        for (size_t i = 0; i < v->s.n;) {
            int32_t cp;
            size_t k = tpl_utf8_next(v->s.p + i, v->s.n - i, &cp);
            tpl_list_push(rt, l, tpl_str_ref(v->s.p + i, k));
            i += k;
        }
        return l;
    }
    default: tpl_raise(rt, "'%s' object is not iterable", tpl_type_name(v));
    }
}

/* ---- operators -------------------------------------------------------------------------- */

static int is_num(const tpl_val *v) {
    return v->kind == TV_BOOL || v->kind == TV_INT || v->kind == TV_FLOAT;
}
static double as_f(const tpl_val *v) {
    return v->kind == TV_FLOAT ? v->f : v->kind == TV_INT ? (double)v->i : (double)v->b;
}
static int64_t as_i(const tpl_val *v) {
    return v->kind == TV_INT ? v->i : v->b;
}

static const char *op_sym(int op) {
    return tpl_op_name(op);
}

_Noreturn static void bad_operands(tpl_rt *rt, int op, const tpl_val *a, const tpl_val *b) {
    if (op == OP_ADD && a->kind == TV_STR)
        tpl_raise(rt, "can only concatenate str (not \"%s\") to str", tpl_type_name(b));
    if (op == OP_ADD && a->kind == TV_LIST)
        tpl_raise(rt, "can only concatenate %s (not \"%s\") to %s", tpl_type_name(a),
                  tpl_type_name(b), tpl_type_name(a));
    tpl_raise(rt, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tpl_type_name(a),
              tpl_type_name(b));
}

/* HTML escaping, used when a plain str meets a Markup str under `+` (markupsafe semantics). */
static void put_escaped(tpl_rt *rt, tpl_buf *b, const tpl_val *s) {
    for (size_t i = 0; i < s->s.n; i++) {
        char c = s->s.p[i];
        if (c == '&')
            tpl_buf_puts(rt, b, "&amp;");
        else if (c == '<')
            tpl_buf_puts(rt, b, "&lt;");
        else if (c == '>')
            tpl_buf_puts(rt, b, "&gt;");
        else if (c == '"')
            tpl_buf_puts(rt, b, "&#34;");
        else if (c == '\'')
            tpl_buf_puts(rt, b, "&#39;");
        else
            tpl_buf_putc(rt, b, c);
    }
}

static tpl_val repeat(tpl_rt *rt, const tpl_val *seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq->kind == TV_STR) {
        if (seq->s.n && (uint64_t)times > rt->max_output / seq->s.n)
            tpl_raise(rt, "template output too large (limit %zu bytes)", rt->max_output);
        tpl_buf b = {0};
        for (int64_t k = 0; k < times; k++)
            tpl_buf_put(rt, &b, seq->s.p, seq->s.n);
        return b.n ? tpl_buf_val(&b) : tpl_cstr("");
    }
    if (seq->l->n && (uint64_t)times > rt->max_steps / seq->l->n)
        tpl_raise(rt, "list repetition too large");
    tpl_val r = tpl_new_list(rt, 0);
    r.flags = seq->flags;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < seq->l->n; i++)
            tpl_list_push(rt, r.l, seq->l->v[i]);
    return r;
}

static tpl_val int_result(tpl_rt *rt, __int128 v) {
    if (v > INT64_MAX || v < INT64_MIN) tpl_raise(rt, "integer overflow");
    return tpl_int((int64_t)v);
}

static tpl_val binop(tpl_rt *rt, int op, const tpl_val *a, const tpl_val *b) {
    if (a->kind == TV_UNDEF) tpl_raise_undef(rt, a);
    if (b->kind == TV_UNDEF) tpl_raise_undef(rt, b);
    int nums = is_num(a) && is_num(b), fl = a->kind == TV_FLOAT || b->kind == TV_FLOAT;
    switch (op) {
    case OP_ADD:
        if (nums)
            return fl ? tpl_float(as_f(a) + as_f(b)) : int_result(rt, (__int128)as_i(a) + as_i(b));
        if (a->kind == TV_STR && b->kind == TV_STR) {
            tpl_buf buf = {0};
            int safe = (a->flags | b->flags) & TV_F_SAFE;
            if (safe && !(a->flags & TV_F_SAFE))
                put_escaped(rt, &buf, a);
            else
                tpl_buf_put(rt, &buf, a->s.p, a->s.n);
            if (safe && !(b->flags & TV_F_SAFE))
                put_escaped(rt, &buf, b);
            else
                tpl_buf_put(rt, &buf, b->s.p, b->s.n);
            tpl_val r = buf.n ? tpl_buf_val(&buf) : tpl_cstr("");
            r.flags = (uint8_t)safe;
            return r;
        }
        if (a->kind == TV_LIST && b->kind == TV_LIST &&
            (a->flags & TV_F_TUPLE) == (b->flags & TV_F_TUPLE)) {
            tpl_val r = tpl_new_list(rt, a->l->n + b->l->n);
            r.flags = a->flags;
            for (size_t i = 0; i < a->l->n; i++)
                tpl_list_push(rt, r.l, a->l->v[i]);
            for (size_t i = 0; i < b->l->n; i++)
                tpl_list_push(rt, r.l, b->l->v[i]);
            return r;
        }
        break;
    case OP_SUB:
        if (nums)
            return fl ? tpl_float(as_f(a) - as_f(b)) : int_result(rt, (__int128)as_i(a) - as_i(b));
        break;
    case OP_MUL:
        if (nums)
            return fl ? tpl_float(as_f(a) * as_f(b)) : int_result(rt, (__int128)as_i(a) * as_i(b));
        if ((a->kind == TV_STR || a->kind == TV_LIST) && (b->kind == TV_INT || b->kind == TV_BOOL))
            return repeat(rt, a, as_i(b));
        if ((b->kind == TV_STR || b->kind == TV_LIST) && (a->kind == TV_INT || a->kind == TV_BOOL))
            return repeat(rt, b, as_i(a));
        break;
    case OP_DIV:
        if (nums) {
            if (as_f(b) == 0.0) tpl_raise(rt, "division by zero");
            return tpl_float(as_f(a) / as_f(b));
        }
        break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (nums) {
            if (fl) {
                double x = as_f(a), y = as_f(b);
                if (y == 0.0) tpl_raise(rt, "float division by zero");
                double m = fmod(x, y);
                if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
                return tpl_float(op == OP_MOD ? m : floor((x - m) / y + 0.5));
            }
            int64_t x = as_i(a), y = as_i(b);
            if (y == 0) tpl_raise(rt, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) tpl_raise(rt, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                m += y;
                q--;
            }
            return tpl_int(op == OP_MOD ? m : q);
        }
        break;
    case OP_POW:
        if (nums) {
            if (!fl && as_i(b) >= 0) {
                __int128 r = 1, base = as_i(a);
                for (int64_t e = as_i(b); e > 0; e--) {
                    r *= base;
                    if (r > INT64_MAX || r < INT64_MIN) tpl_raise(rt, "integer overflow");
                }
                return tpl_int((int64_t)r);
            }
            if (as_f(a) == 0.0 && as_f(b) < 0)
                tpl_raise(rt, "0.0 cannot be raised to a negative power");
            return tpl_float(pow(as_f(a), as_f(b)));
        }
        break;
    }
    if (op == OP_MOD && a->kind == TV_STR) return tpl_percent_format(rt, *a, b);
    bad_operands(rt, op, a, b);
}

static int compare(tpl_rt *rt, int op, const tpl_val *a, const tpl_val *b) {
    switch (op) {
    case CMP_EQ: return tpl_equal(a, b);
    case CMP_NE: return !tpl_equal(a, b);
    case CMP_IN: return tpl_contains(rt, b, a);
    case CMP_NOTIN: return !tpl_contains(rt, b, a);
    case CMP_LT: return tpl_compare(rt, a, b, "<") < 0;
    case CMP_LE: return tpl_compare(rt, a, b, "<=") <= 0;
    case CMP_GT: return tpl_compare(rt, a, b, ">") > 0;
    default: return tpl_compare(rt, a, b, ">=") >= 0;
    }
}

/* ---- calls ------------------------------------------------------------------------------ */

static tpl_val capture(tpl_rt *rt, tpl_node *const *body, size_t n) {
    tpl_buf *saved = rt->out, b = {0};
    rt->out = &b;
    tpl_exec(rt, body, n);
    rt->out = saved;
    return b.n ? tpl_buf_val(&b) : tpl_cstr("");
}

static tpl_val call_macro(tpl_rt *rt, const tpl_macro *m, const tpl_args *a) {
    const tpl_node *def = m->def;
    if (++rt->depth > rt->max_depth)
        tpl_raise(rt, "maximum recursion depth exceeded (%d nested macro calls)", rt->max_depth);
    tpl_scope *saved = rt->scope;
    tpl_scope *s = tpl_scope_new(rt, m->closure);
    rt->scope = s;
    size_t np = def->nitems2;
    if (a->npos > np && !(def->op & TPL_MACRO_VARARGS))
        tpl_raise(rt, "macro '%s' takes not more than %zu argument(s)", def->name, np);
    for (size_t i = 0; i < np; i++) {
        const char *pn = def->names[i];
        tpl_val v;
        const tpl_val *given = i < a->npos ? &a->pos[i] : NULL;
        for (size_t k = 0; !given && k < a->nkw; k++)
            if (!strcmp(a->kwn[k], pn)) given = &a->kwv[k];
        if (given)
            v = *given;
        else if (def->items2[i])
            v = tpl_eval(rt, def->items2[i]);
        else
            v = tpl_undef(pn, NULL);
        tpl_scope_set(rt, s, pn, v);
    }
    tpl_val kw = tpl_new_dict(rt, 0);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(def->names[i], a->kwn[k]))
            i++;
        if (i < np) continue;
        if (!(def->op & TPL_MACRO_KWARGS))
            tpl_raise(rt, "macro '%s' takes no keyword argument '%s'", def->name, a->kwn[k]);
        tpl_dict_set(rt, kw.d, tpl_cstr(a->kwn[k]), a->kwv[k]);
    }
    if (def->op & TPL_MACRO_KWARGS) tpl_scope_set(rt, s, "kwargs", kw);
    if (def->op & TPL_MACRO_VARARGS) {
        tpl_val va = tpl_new_list(rt, 0);
        va.flags = TV_F_TUPLE;
        for (size_t i = np; i < a->npos; i++)
            tpl_list_push(rt, va.l, a->pos[i]);
        tpl_scope_set(rt, s, "varargs", va);
    }
    tpl_val out = capture(rt, def->items, def->nitems);
    rt->scope = saved;
    rt->depth--;
    return out;
}

static void run_for(tpl_rt *rt, const tpl_node *f, const tpl_val *iterable, int depth);

tpl_val tpl_call(tpl_rt *rt, const tpl_val *callee, const tpl_args *a) {
    switch (callee->kind) {
    case TV_MACRO: return call_macro(rt, callee->macro, a);
    case TV_FUNC: return tpl_call_global(rt, callee->func, a);
    case TV_METHOD: return tpl_call_method(rt, callee->m, a);
    case TV_LOOP: {
        const tpl_loop *lp = callee->loop;
        if (!lp->node->op) tpl_raise(rt, "the loop is not recursive; add 'recursive' to call it");
        if (a->npos != 1 || a->nkw) tpl_raise(rt, "loop() takes exactly one argument");
        if (++rt->depth > rt->max_depth)
            tpl_raise(rt, "maximum recursion depth exceeded (%d nested loops)", rt->max_depth);
        tpl_buf *saved = rt->out, b = {0};
        rt->out = &b;
        run_for(rt, lp->node, &a->pos[0], lp->depth + 1);
        rt->out = saved;
        rt->depth--;
        return b.n ? tpl_buf_val(&b) : tpl_cstr("");
    }
    case TV_UNDEF: tpl_raise_undef(rt, callee);
    default: tpl_raise(rt, "'%s' object is not callable", tpl_type_name(callee));
    }
}

static void eval_args(tpl_rt *rt, const tpl_node *x, tpl_args *a, size_t extra_front) {
    a->npos = x->nitems + extra_front;
    a->pos = tpl_alloc(rt, (a->npos + 1) * sizeof *a->pos);
    for (size_t i = 0; i < x->nitems; i++)
        a->pos[extra_front + i] = tpl_eval(rt, x->items[i]);
    a->nkw = x->nitems2;
    a->kwn = x->names;
    a->kwv = tpl_alloc(rt, (a->nkw + 1) * sizeof *a->kwv);
    for (size_t i = 0; i < a->nkw; i++)
        a->kwv[i] = tpl_eval(rt, x->items2[i]);
}

/* Applies filter node f. In an expression, f->a is the input. In the filter chain of a block
 * ({% filter %}, {% set x | f %}) block_input is the captured text, taken by the innermost
 * filter (whose a is NULL). */
static tpl_val apply_filter(tpl_rt *rt, const tpl_node *f, const tpl_val *block_input) {
    tpl_val v;
    if (block_input)
        v = f->a ? apply_filter(rt, f->a, block_input) : *block_input;
    else
        v = tpl_eval(rt, f->a);
    tpl_args a;
    eval_args(rt, f, &a, 1);
    a.pos[0] = v;
    rt->line = f->line;
    return tpl_filter(rt, f->name, &a);
}

/* ---- expressions ------------------------------------------------------------------------ */

static tpl_val eval_node(tpl_rt *rt, const tpl_node *x);

tpl_val tpl_eval(tpl_rt *rt, const tpl_node *x) {
    tpl_enter(rt);
    tpl_val v = eval_node(rt, x);
    tpl_leave(rt);
    return v;
}

static tpl_val eval_node(tpl_rt *rt, const tpl_node *x) {
    tpl_step(rt);
    rt->line = x->line;
    switch (x->kind) {
    case N_CONST: return x->val;
    case N_NAME: return lookup(rt, x->name);
    case N_GETATTR: {
        tpl_val o = tpl_eval(rt, x->a);
        rt->line = x->line;
        return tpl_getattr(rt, &o, x->name);
    }
    case N_GETITEM: {
        tpl_val o = tpl_eval(rt, x->a);
        if (x->b->kind == N_SLICE) {
            const tpl_node *s = x->b;
            tpl_val st, sp, stp;
            if (s->a) st = tpl_eval(rt, s->a);
            if (s->b) sp = tpl_eval(rt, s->b);
            if (s->c) stp = tpl_eval(rt, s->c);
            rt->line = x->line;
            return tpl_slice(rt, &o, s->a ? &st : NULL, s->b ? &sp : NULL, s->c ? &stp : NULL);
        }
        tpl_val k = tpl_eval(rt, x->b);
        rt->line = x->line;
        return tpl_getitem(rt, &o, &k);
    }
    case N_CALL: {
        tpl_val f = tpl_eval(rt, x->a);
        tpl_args a;
        eval_args(rt, x, &a, 0);
        rt->line = x->line;
        return tpl_call(rt, &f, &a);
    }
    case N_FILTER: return apply_filter(rt, x, NULL);
    case N_TEST: {
        tpl_args a;
        eval_args(rt, x, &a, 1);
        a.pos[0] = tpl_eval(rt, x->a);
        rt->line = x->line;
        return tpl_bool(tpl_test(rt, x->name, &a));
    }
    case N_NOT: {
        tpl_val v = tpl_eval(rt, x->a);
        return tpl_bool(!tpl_truthy(&v));
    }
    case N_NEG:
    case N_POS: {
        tpl_val v = tpl_eval(rt, x->a);
        rt->line = x->line;
        if (v.kind == TV_UNDEF) tpl_raise_undef(rt, &v);
        if (v.kind == TV_FLOAT) return tpl_float(x->kind == N_NEG ? -v.f : v.f);
        if (v.kind == TV_INT || v.kind == TV_BOOL) {
            int64_t i = as_i(&v);
            if (x->kind == N_POS) return tpl_int(i);
            if (i == INT64_MIN) tpl_raise(rt, "integer overflow");
            return tpl_int(-i);
        }
        tpl_raise(rt, "bad operand type for unary %s: '%s'", x->kind == N_NEG ? "-" : "+",
                  tpl_type_name(&v));
    }
    case N_BINOP: {
        tpl_val a = tpl_eval(rt, x->a), b = tpl_eval(rt, x->b);
        rt->line = x->line;
        return binop(rt, x->op, &a, &b);
    }
    case N_AND: {
        tpl_val a = tpl_eval(rt, x->a);
        return tpl_truthy(&a) ? tpl_eval(rt, x->b) : a;
    }
    case N_OR: {
        tpl_val a = tpl_eval(rt, x->a);
        return tpl_truthy(&a) ? a : tpl_eval(rt, x->b);
    }
    case N_CMP: {
        tpl_val l = tpl_eval(rt, x->a);
        for (size_t i = 0; i < x->nitems; i++) {
            tpl_val r = tpl_eval(rt, x->items[i]);
            rt->line = x->line;
            if (!compare(rt, x->ops[i], &l, &r)) return tpl_bool(0);
            l = r;
        }
        return tpl_bool(1);
    }
    case N_CONCAT: {
        tpl_buf b = {0};
        for (size_t i = 0; i < x->nitems; i++) {
            tpl_val v = tpl_eval(rt, x->items[i]);
            tpl_to_str(rt, &b, &v);
        }
        return b.n ? tpl_buf_val(&b) : tpl_cstr("");
    }
    case N_COND: {
        tpl_val c = tpl_eval(rt, x->a);
        if (tpl_truthy(&c)) return tpl_eval(rt, x->b);
        return x->c ? tpl_eval(rt, x->c) : tpl_undef("inline if-expression", NULL);
    }
    case N_LIST:
    case N_TUPLE: {
        tpl_val l = tpl_new_list(rt, x->nitems);
        if (x->kind == N_TUPLE) l.flags = TV_F_TUPLE;
        for (size_t i = 0; i < x->nitems; i++)
            tpl_list_push(rt, l.l, tpl_eval(rt, x->items[i]));
        return l;
    }
    case N_DICT: {
        tpl_val d = tpl_new_dict(rt, x->nitems);
        for (size_t i = 0; i < x->nitems; i++) {
            tpl_val k = tpl_eval(rt, x->items[i]), v = tpl_eval(rt, x->items2[i]);
            if (k.kind == TV_LIST && !(k.flags & TV_F_TUPLE))
                tpl_raise(rt, "unhashable type: 'list'");
            if (k.kind == TV_DICT || k.kind == TV_UNDEF)
                tpl_raise(rt, "unhashable type: '%s'", tpl_type_name(&k));
            tpl_dict_set(rt, d.d, k, v);
        }
        return d;
    }
    default: tpl_raise(rt, "internal error: bad expression node %d", x->kind);
    }
}

/* ---- statements ------------------------------------------------------------------------- */

static void assign(tpl_rt *rt, const tpl_node *target, tpl_val v) {
    if (target->kind == N_NAME) {
        tpl_scope_set(rt, rt->scope, target->name, v);
        return;
    }
    if (target->kind == N_GETATTR) {
        tpl_val ns = lookup(rt, target->a->name);
        if (ns.kind != TV_NS) tpl_raise(rt, "cannot assign attribute on non-namespace object");
        tpl_dict_set(rt, ns.d, tpl_cstr(target->name), v);
        return;
    }
    /* tuple unpacking */
    tpl_list *l = tpl_iter(rt, &v);
    if (l->n != target->nitems)
        tpl_raise(rt,
                  l->n < target->nitems ? "not enough values to unpack (expected %zu, got %zu)"
                                        : "too many values to unpack (expected %zu, got %zu)",
                  target->nitems, l->n);
    for (size_t i = 0; i < l->n; i++)
        assign(rt, target->items[i], l->v[i]);
}

static void run_for(tpl_rt *rt, const tpl_node *f, const tpl_val *iterable, int depth) {
    tpl_list *src = tpl_iter(rt, iterable), *items = src;
    tpl_scope *outer = rt->scope;
    if (f->c) { /* "for x in y if cond": filter first, so loop.* counts the kept items */
        items = tpl_new_list(rt, 0).l;
        for (size_t i = 0; i < src->n; i++) {
            rt->scope = tpl_scope_new(rt, outer);
            assign(rt, f->a, src->v[i]);
            tpl_val keep = tpl_eval(rt, f->c);
            if (tpl_truthy(&keep)) tpl_list_push(rt, items, src->v[i]);
        }
        rt->scope = outer;
    }
    tpl_loop *lp = tpl_alloc(rt, sizeof *lp);
    lp->items = items;
    lp->depth = depth;
    lp->node = f;
    tpl_val lv = {.kind = TV_LOOP};
    lv.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        tpl_step(rt);
        lp->i = i;
        rt->scope = tpl_scope_new(rt, outer);
        assign(rt, f->a, items->v[i]);
        tpl_scope_set(rt, rt->scope, "loop", lv);
        tpl_exec(rt, f->items, f->nitems);
        rt->scope = outer;
        int ctl = rt->ctl;
        rt->ctl = 0;
        if (ctl == 1) break;
    }
    if (!items->n && f->nitems2) {
        rt->scope = tpl_scope_new(rt, outer);
        tpl_exec(rt, f->items2, f->nitems2);
        rt->scope = outer;
    }
}

static void exec_one(tpl_rt *rt, const tpl_node *x) {
    tpl_step(rt);
    rt->line = x->line;
    switch (x->kind) {
    case S_DATA: tpl_buf_put(rt, rt->out, x->val.s.p, x->val.s.n); return;
    case S_OUTPUT: {
        tpl_val v = tpl_eval(rt, x->a);
        tpl_to_str(rt, rt->out, &v);
        return;
    }
    case S_IF: {
        tpl_val c = tpl_eval(rt, x->a);
        if (tpl_truthy(&c))
            tpl_exec(rt, x->items, x->nitems);
        else
            tpl_exec(rt, x->items2, x->nitems2);
        return;
    }
    case S_FOR: {
        tpl_val it = tpl_eval(rt, x->b);
        rt->line = x->line;
        int depth = 1;
        for (tpl_scope *s = rt->scope; s; s = s->parent) {
            tpl_val *l = tpl_dict_getn(&s->vars, "loop", 4);
            if (l && l->kind == TV_LOOP) {
                depth = l->loop->depth + 1;
                break;
            }
        }
        run_for(rt, x, &it, depth);
        return;
    }
    case S_SET: assign(rt, x->a, tpl_eval(rt, x->b)); return;
    case S_SETBLOCK: {
        tpl_val v = capture(rt, x->items, x->nitems);
        if (x->c) v = apply_filter(rt, x->c, &v);
        rt->line = x->line;
        assign(rt, x->a, v);
        return;
    }
    case S_MACRO: {
        tpl_macro *m = tpl_alloc(rt, sizeof *m);
        m->def = x;
        m->closure = rt->scope;
        tpl_val v = {.kind = TV_MACRO};
        v.macro = m;
        tpl_scope_set(rt, rt->scope, x->name, v);
        return;
    }
    case S_FILTERBLOCK: {
        tpl_val body = capture(rt, x->items, x->nitems);
        tpl_val v = apply_filter(rt, x->a, &body);
        tpl_to_str(rt, rt->out, &v);
        return;
    }
    case S_WITH: {
        tpl_scope *outer = rt->scope, *s = tpl_scope_new(rt, outer);
        for (size_t i = 0; i < x->nitems2; i++)
            tpl_scope_set(rt, s, x->names[i], tpl_eval(rt, x->items2[i]));
        rt->scope = s;
        tpl_exec(rt, x->items, x->nitems);
        rt->scope = outer;
        return;
    }
    case S_BREAK: rt->ctl = 1; return;
    case S_CONTINUE: rt->ctl = 2; return;
    case S_GENERATION: tpl_exec(rt, x->items, x->nitems); return;
    default: tpl_raise(rt, "internal error: bad statement node %d", x->kind);
    }
}

void tpl_exec(tpl_rt *rt, tpl_node *const *body, size_t n) {
    for (size_t i = 0; i < n && !rt->ctl; i++)
        exec_one(rt, body[i]);
}
