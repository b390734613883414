/* Template parser (see tpl_parse.h): a recursive-descent parser over the token list. */
#include "chat/tpl_parse.h"

#include <stdio.h>
#include <string.h>

#define MAX_NEST 200 /* expression and block nesting; deeper input is rejected, not recursed */

typedef struct ps {
    tpl_rt *rt;
    const tpl_tok *t;
    size_t n, i;
    int depth;
    tpl_node *macro; /* the macro being parsed, to note uses of varargs/kwargs/caller */
    const char *block; /* innermost open block, for end-of-template messages */
    int loops;         /* for loops open around the current statement (reset inside macros) */
} ps;

typedef struct nodevec {
    tpl_node **v;
    size_t n, cap;
} nodevec;

static void vpush(ps *P, nodevec *v, tpl_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        tpl_node **nv = tpl_alloc(P->rt, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static const tpl_tok *cur(ps *P) { return &P->t[P->i]; }
static const tpl_tok *peek(ps *P, size_t k) {
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}
static void adv(ps *P) {
    if (P->i + 1 < P->n) P->i++;
}

static const char *describe(const tpl_tok *t, char *buf, size_t n) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: snprintf(buf, n, "%.*s", (int)(t->n > 60 ? 60 : t->n), t->p); return buf;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: snprintf(buf, n, "%s", tpl_op_name(t->op)); return buf;
    }
}

_Noreturn static void fail(ps *P, const char *what) {
    char b[80];
    P->rt->line = cur(P)->line;
    tpl_raise(P->rt, "syntax error: %s (got '%s')", what, describe(cur(P), b, sizeof b));
}

static int is_op(ps *P, int op) { return cur(P)->kind == TK_OP && cur(P)->op == op; }
static int is_name(ps *P, const char *s) {
    const tpl_tok *t = cur(P);
    return t->kind == TK_NAME && t->n == strlen(s) && !memcmp(t->p, s, t->n);
}
static void expect_op(ps *P, int op) {
    if (!is_op(P, op)) {
        char w[40];
        snprintf(w, sizeof w, "expected '%s'", tpl_op_name(op));
        fail(P, w);
    }
    adv(P);
}
static void expect_name_kw(ps *P, const char *s) {
    if (!is_name(P, s)) {
        char w[40];
        snprintf(w, sizeof w, "expected '%s'", s);
        fail(P, w);
    }
    adv(P);
}
static void expect_block_end(ps *P) {
    if (cur(P)->kind != TK_BLOCK_END) fail(P, "expected end of statement block");
    adv(P);
}

static const char *tok_name(ps *P) {
    const tpl_tok *t = cur(P);
    if (t->kind != TK_NAME) fail(P, "expected a name");
    char *s = tpl_alloc(P->rt, t->n + 1);
    memcpy(s, t->p, t->n);
    adv(P);
    return s;
}

static tpl_node *mk(ps *P, int kind, int line) {
    tpl_node *x = tpl_alloc(P->rt, sizeof *x);
    x->kind = kind;
    x->line = line;
    return x;
}

static void enter(ps *P) {
    if (++P->depth > MAX_NEST) {
        P->rt->line = cur(P)->line;
        tpl_raise(P->rt, "template nested too deeply (more than %d levels)", MAX_NEST);
    }
}

/* ---- expressions ------------------------------------------------------------------------ */

static tpl_node *parse_expr(ps *P);
static tpl_node *parse_or(ps *P);
static tpl_node *parse_unary(ps *P, int with_filter);
static tpl_node *parse_primary(ps *P);
static tpl_node *parse_postfix(ps *P, tpl_node *x);
static tpl_node *parse_filter_expr(ps *P, tpl_node *x);

/* Parses "(args)" into x->items (positional) and x->names/items2 (keyword). */
static void parse_call_args(ps *P, tpl_node *x) {
    expect_op(P, OP_LPAREN);
    nodevec args = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t nkw = 0, kwcap = 0;
    while (!is_op(P, OP_RPAREN)) {
        if (args.n || nkw) expect_op(P, OP_COMMA);
        if (is_op(P, OP_RPAREN)) break;
        if (is_op(P, OP_MUL) || is_op(P, OP_POW)) fail(P, "*args and **kwargs are not supported");
        if (cur(P)->kind == TK_NAME && peek(P, 1)->kind == TK_OP && peek(P, 1)->op == OP_ASSIGN) {
            const char *k = tok_name(P);
            adv(P);
            if (nkw == kwcap) {
                kwcap = kwcap ? kwcap * 2 : 4;
                const char **nn = tpl_alloc(P->rt, kwcap * sizeof *nn);
                if (nkw) memcpy(nn, kwn, nkw * sizeof *nn);
                kwn = nn;
            }
            kwn[nkw++] = k;
            vpush(P, &kwv, parse_expr(P));
        } else {
            if (nkw) fail(P, "positional argument after a keyword argument");
            vpush(P, &args, parse_expr(P));
        }
    }
    expect_op(P, OP_RPAREN);
    x->items = args.v;
    x->nitems = args.n;
    x->items2 = kwv.v;
    x->nitems2 = nkw;
    x->names = kwn;
}

static tpl_node *parse_tuple(ps *P, int with_condexpr, int explicit_parens) {
    int line = cur(P)->line;
    nodevec v = {0};
    int is_tuple = 0;
    while (1) {
        if (v.n) expect_op(P, OP_COMMA);
        const tpl_tok *t = cur(P);
        if (v.n && (t->kind == TK_BLOCK_END || t->kind == TK_VAR_END ||
                    (t->kind == TK_OP && t->op == OP_RPAREN) || is_name(P, "recursive") ||
                    is_name(P, "if")))
            break;
        if (explicit_parens && !v.n && is_op(P, OP_RPAREN)) {
            is_tuple = 1; /* () */
            break;
        }
        vpush(P, &v, with_condexpr ? parse_expr(P) : parse_or(P));
        if (is_op(P, OP_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) return v.v[0];
    tpl_node *x = mk(P, N_TUPLE, line);
    x->items = v.v;
    x->nitems = v.n;
    return x;
}

static tpl_node *parse_expr(ps *P) {
    enter(P);
    int line = cur(P)->line;
    tpl_node *x = parse_or(P);
    while (is_name(P, "if")) {
        adv(P);
        tpl_node *c = mk(P, N_COND, line);
        c->b = x;
        c->a = parse_or(P);
        if (is_name(P, "else")) {
            adv(P);
            c->c = parse_expr(P);
        }
        x = c;
    }
    P->depth--;
    return x;
}

static tpl_node *binary(ps *P, int kind, int op, tpl_node *a, tpl_node *b, int line) {
    tpl_node *x = mk(P, kind, line);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static tpl_node *parse_not(ps *P);
static tpl_node *parse_and(ps *P) {
    tpl_node *x = parse_not(P);
    while (is_name(P, "and")) {
        int line = cur(P)->line;
        adv(P);
        x = binary(P, N_AND, 0, x, parse_not(P), line);
    }
    return x;
}

static tpl_node *parse_or(ps *P) {
    tpl_node *x = parse_and(P);
    while (is_name(P, "or")) {
        int line = cur(P)->line;
        adv(P);
        x = binary(P, N_OR, 0, x, parse_and(P), line);
    }
    return x;
}

static tpl_node *parse_math1(ps *P);
static tpl_node *parse_compare(ps *P) {
    int line = cur(P)->line;
    tpl_node *x = parse_math1(P);
    nodevec rest = {0};
    int ops[64], nops = 0;
    while (1) {
        int op = 0;
        const tpl_tok *t = cur(P);
        if (t->kind == TK_OP) {
            op = t->op == OP_EQ ? CMP_EQ : t->op == OP_NE ? CMP_NE : t->op == OP_LT ? CMP_LT
               : t->op == OP_LE ? CMP_LE : t->op == OP_GT ? CMP_GT : t->op == OP_GE ? CMP_GE : 0;
            if (op) adv(P);
        } else if (is_name(P, "in")) {
            op = CMP_IN;
            adv(P);
        } else if (is_name(P, "not") && peek(P, 1)->kind == TK_NAME && peek(P, 1)->n == 2 &&
                   !memcmp(peek(P, 1)->p, "in", 2)) {
            op = CMP_NOTIN;
            adv(P);
            adv(P);
        }
        if (!op) break;
        if (nops == 64) fail(P, "comparison chain too long");
        ops[nops++] = op;
        vpush(P, &rest, parse_math1(P));
    }
    if (!nops) return x;
    tpl_node *c = mk(P, N_CMP, line);
    c->a = x;
    c->items = rest.v;
    c->nitems = rest.n;
    c->ops = tpl_alloc(P->rt, (size_t)nops * sizeof(int));
    memcpy(c->ops, ops, (size_t)nops * sizeof(int));
    return c;
}

static tpl_node *parse_not(ps *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        adv(P);
        enter(P);
        tpl_node *x = mk(P, N_NOT, line);
        x->a = parse_not(P);
        P->depth--;
        return x;
    }
    return parse_compare(P);
}

static tpl_node *parse_concat(ps *P);
static tpl_node *parse_math1(ps *P) {
    tpl_node *x = parse_concat(P);
    while (is_op(P, OP_ADD) || is_op(P, OP_SUB)) {
        int op = cur(P)->op, line = cur(P)->line;
        adv(P);
        x = binary(P, N_BINOP, op, x, parse_concat(P), line);
    }
    return x;
}

static tpl_node *parse_math2(ps *P);
static tpl_node *parse_concat(ps *P) {
    int line = cur(P)->line;
    tpl_node *x = parse_math2(P);
    if (!is_op(P, OP_TILDE)) return x;
    nodevec v = {0};
    vpush(P, &v, x);
    while (is_op(P, OP_TILDE)) {
        adv(P);
        vpush(P, &v, parse_math2(P));
    }
    tpl_node *c = mk(P, N_CONCAT, line);
    c->items = v.v;
    c->nitems = v.n;
    return c;
}

static tpl_node *parse_pow(ps *P);
static tpl_node *parse_math2(ps *P) {
    tpl_node *x = parse_pow(P);
    while (is_op(P, OP_MUL) || is_op(P, OP_DIV) || is_op(P, OP_FLOORDIV) || is_op(P, OP_MOD)) {
        int op = cur(P)->op, line = cur(P)->line;
        adv(P);
        x = binary(P, N_BINOP, op, x, parse_pow(P), line);
    }
    return x;
}

static tpl_node *parse_pow(ps *P) {
    tpl_node *x = parse_unary(P, 1);
    while (is_op(P, OP_POW)) {
        int line = cur(P)->line;
        adv(P);
        x = binary(P, N_BINOP, OP_POW, x, parse_unary(P, 1), line);
    }
    return x;
}

static tpl_node *parse_unary(ps *P, int with_filter) {
    enter(P);
    int line = cur(P)->line;
    tpl_node *x;
    if (is_op(P, OP_SUB) || is_op(P, OP_ADD)) {
        int neg = is_op(P, OP_SUB);
        adv(P);
        x = mk(P, neg ? N_NEG : N_POS, line);
        x->a = parse_unary(P, 0);
    } else {
        x = parse_primary(P);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static tpl_node *parse_primary(ps *P) {
    const tpl_tok *t = cur(P);
    tpl_node *x;
    if (t->kind == TK_NAME) {
        x = mk(P, N_CONST, t->line);
        if (is_name(P, "true") || is_name(P, "True")) x->val = tpl_bool(1);
        else if (is_name(P, "false") || is_name(P, "False")) x->val = tpl_bool(0);
        else if (is_name(P, "none") || is_name(P, "None")) x->val = tpl_none();
        else {
            x->kind = N_NAME;
            x->name = tok_name(P);
            if (P->macro) {
                if (!strcmp(x->name, "varargs")) P->macro->op |= TPL_MACRO_VARARGS;
                if (!strcmp(x->name, "kwargs")) P->macro->op |= TPL_MACRO_KWARGS;
                if (!strcmp(x->name, "caller")) P->macro->op |= TPL_MACRO_CALLER;
            }
            return x;
        }
        adv(P);
        return x;
    }
    if (t->kind == TK_STRING) {
        x = mk(P, N_CONST, t->line);
        tpl_buf b = {0};
        while (cur(P)->kind == TK_STRING) { /* adjacent literals concatenate */
            tpl_buf_put(P->rt, &b, cur(P)->p, cur(P)->n);
            adv(P);
        }
        x->val = tpl_buf_val(&b);
        return x;
    }
    if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        x = mk(P, N_CONST, t->line);
        x->val = t->kind == TK_INT ? tpl_int(t->i) : tpl_float(t->f);
        adv(P);
        return x;
    }
    if (is_op(P, OP_LPAREN)) {
        adv(P);
        x = parse_tuple(P, 1, 1);
        expect_op(P, OP_RPAREN);
        return x;
    }
    if (is_op(P, OP_LBRACKET)) {
        x = mk(P, N_LIST, t->line);
        adv(P);
        nodevec v = {0};
        while (!is_op(P, OP_RBRACKET)) {
            if (v.n) expect_op(P, OP_COMMA);
            if (is_op(P, OP_RBRACKET)) break;
            vpush(P, &v, parse_expr(P));
        }
        expect_op(P, OP_RBRACKET);
        x->items = v.v;
        x->nitems = v.n;
        return x;
    }
    if (is_op(P, OP_LBRACE)) {
        x = mk(P, N_DICT, t->line);
        adv(P);
        nodevec k = {0}, v = {0};
        while (!is_op(P, OP_RBRACE)) {
            if (k.n) expect_op(P, OP_COMMA);
            if (is_op(P, OP_RBRACE)) break;
            vpush(P, &k, parse_expr(P));
            expect_op(P, OP_COLON);
            vpush(P, &v, parse_expr(P));
        }
        expect_op(P, OP_RBRACE);
        x->items = k.v;
        x->nitems = k.n;
        x->items2 = v.v;
        x->nitems2 = v.n;
        return x;
    }
    fail(P, "unexpected token in expression");
}

static tpl_node *parse_subscribed(ps *P) {
    int line = cur(P)->line;
    tpl_node *a = NULL;
    if (!is_op(P, OP_COLON)) {
        a = parse_expr(P);
        if (!is_op(P, OP_COLON)) return a;
    }
    tpl_node *s = mk(P, N_SLICE, line);
    s->a = a;
    adv(P); /* ':' */
    if (!is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA) && !is_op(P, OP_COLON)) s->b = parse_expr(P);
    if (is_op(P, OP_COLON)) {
        adv(P);
        if (!is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA)) s->c = parse_expr(P);
    }
    return s;
}

static tpl_node *parse_postfix(ps *P, tpl_node *x) {
    while (1) {
        int line = cur(P)->line;
        if (is_op(P, OP_DOT)) {
            adv(P);
            if (cur(P)->kind == TK_NAME) {
                tpl_node *g = mk(P, N_GETATTR, line);
                g->a = x;
                g->name = tok_name(P);
                x = g;
            } else if (cur(P)->kind == TK_INT) {
                tpl_node *g = mk(P, N_GETITEM, line), *k = mk(P, N_CONST, line);
                k->val = tpl_int(cur(P)->i);
                adv(P);
                g->a = x;
                g->b = k;
                x = g;
            } else {
                fail(P, "expected name or number after '.'");
            }
        } else if (is_op(P, OP_LBRACKET)) {
            adv(P);
            nodevec v = {0};
            while (!is_op(P, OP_RBRACKET)) {
                if (v.n) expect_op(P, OP_COMMA);
                vpush(P, &v, parse_subscribed(P));
            }
            expect_op(P, OP_RBRACKET);
            if (!v.n) fail(P, "expected a subscript");
            tpl_node *g = mk(P, N_GETITEM, line);
            g->a = x;
            if (v.n == 1) {
                g->b = v.v[0];
            } else {
                g->b = mk(P, N_TUPLE, line);
                g->b->items = v.v;
                g->b->nitems = v.n;
            }
            x = g;
        } else if (is_op(P, OP_LPAREN)) {
            tpl_node *c = mk(P, N_CALL, line);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else {
            return x;
        }
    }
}

static const char *dotted_name(ps *P) {
    const char *name = tok_name(P);
    while (is_op(P, OP_DOT) && peek(P, 1)->kind == TK_NAME) {
        adv(P);
        const char *more = tok_name(P);
        size_t a = strlen(name), b = strlen(more);
        char *s = tpl_alloc(P->rt, a + b + 2);
        memcpy(s, name, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b);
        name = s;
    }
    return name;
}

static tpl_node *parse_filter(ps *P, tpl_node *x) {
    while (is_op(P, OP_PIPE)) {
        int line = cur(P)->line;
        adv(P);
        tpl_node *f = mk(P, N_FILTER, line);
        f->a = x;
        f->name = dotted_name(P);
        if (is_op(P, OP_LPAREN)) parse_call_args(P, f);
        x = f;
    }
    return x;
}

static tpl_node *parse_test(ps *P, tpl_node *x) {
    int line = cur(P)->line;
    adv(P); /* is */
    int negated = 0;
    if (is_name(P, "not")) {
        negated = 1;
        adv(P);
    }
    tpl_node *t = mk(P, N_TEST, line);
    t->a = x;
    t->name = dotted_name(P);
    const tpl_tok *c = cur(P);
    if (is_op(P, OP_LPAREN)) {
        parse_call_args(P, t);
    } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT ||
                c->kind == TK_FLOAT || is_op(P, OP_LBRACKET) || is_op(P, OP_LBRACE)) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        /* Jinja takes one bare argument: "x is divisibleby 3", "x is sameas none". */
        if (is_name(P, "is")) fail(P, "you cannot chain multiple tests with is");
        tpl_node *arg = parse_postfix(P, parse_primary(P));
        t->items = tpl_alloc(P->rt, sizeof *t->items);
        t->items[0] = arg;
        t->nitems = 1;
    }
    if (!negated) return t;
    tpl_node *n = mk(P, N_NOT, line);
    n->a = t;
    return n;
}

static tpl_node *parse_filter_expr(ps *P, tpl_node *x) {
    while (1) {
        if (is_op(P, OP_PIPE)) x = parse_filter(P, x);
        else if (is_name(P, "is")) x = parse_test(P, x);
        else if (is_op(P, OP_LPAREN)) {
            tpl_node *c = mk(P, N_CALL, cur(P)->line);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else return x;
    }
}

/* ---- statements ------------------------------------------------------------------------- */

static void subparse(ps *P, const char *const *ends, nodevec *out, int *which);

/* Assignment target: a name, "ns.attr" (with_ns), or a tuple of names. */
static tpl_node *parse_target(ps *P, int with_ns) {
    int line = cur(P)->line;
    nodevec v = {0};
    int tuple = 0;
    while (1) {
        tpl_node *x = mk(P, N_NAME, cur(P)->line);
        x->name = tok_name(P);
        if (with_ns && !v.n && is_op(P, OP_DOT)) {
            adv(P);
            tpl_node *g = mk(P, N_GETATTR, line);
            g->a = x;
            g->name = tok_name(P);
            return g;
        }
        vpush(P, &v, x);
        if (!is_op(P, OP_COMMA)) break;
        tuple = 1;
        adv(P);
        if (cur(P)->kind != TK_NAME || is_name(P, "in")) break;
    }
    if (!tuple) return v.v[0];
    tpl_node *t = mk(P, N_TUPLE, line);
    t->items = v.v;
    t->nitems = v.n;
    return t;
}

static tpl_node *parse_for(ps *P, int line) {
    tpl_node *f = mk(P, S_FOR, line);
    f->a = parse_target(P, 0);
    expect_name_kw(P, "in");
    f->b = parse_tuple(P, 0, 0);
    if (is_name(P, "if")) {
        adv(P);
        f->c = parse_expr(P);
    }
    if (is_name(P, "recursive")) {
        adv(P);
        f->op = 1;
    }
    expect_block_end(P);
    static const char *const ends[] = {"endfor", "else", NULL};
    nodevec body = {0}, els = {0};
    int which;
    P->loops++;
    subparse(P, ends, &body, &which);
    P->loops--;
    if (which == 1) {
        static const char *const ends2[] = {"endfor", NULL};
        adv(P);
        expect_block_end(P);
        subparse(P, ends2, &els, &which);
    }
    adv(P);
    expect_block_end(P);
    f->items = body.v;
    f->nitems = body.n;
    f->items2 = els.v;
    f->nitems2 = els.n;
    return f;
}

static tpl_node *parse_if(ps *P, int line) {
    tpl_node *f = mk(P, S_IF, line);
    f->a = parse_tuple(P, 0, 0);
    expect_block_end(P);
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    f->items = body.v;
    f->nitems = body.n;
    if (which == 1) { /* elif: an if nested in the else branch */
        int l2 = cur(P)->line;
        adv(P);
        tpl_node *inner = parse_if(P, l2);
        f->items2 = tpl_alloc(P->rt, sizeof *f->items2);
        f->items2[0] = inner;
        f->nitems2 = 1;
        return f; /* the nested if consumed the endif */
    }
    if (which == 2) {
        static const char *const ends2[] = {"endif", NULL};
        nodevec els = {0};
        adv(P);
        expect_block_end(P);
        subparse(P, ends2, &els, &which);
        f->items2 = els.v;
        f->nitems2 = els.n;
    }
    adv(P);
    expect_block_end(P);
    return f;
}

static tpl_node *parse_macro(ps *P, int line) {
    tpl_node *m = mk(P, S_MACRO, line);
    m->name = tok_name(P);
    expect_op(P, OP_LPAREN);
    nodevec defs = {0};
    const char **names = NULL;
    size_t n = 0, cap = 0;
    while (!is_op(P, OP_RPAREN)) {
        if (n) expect_op(P, OP_COMMA);
        if (is_op(P, OP_RPAREN)) break;
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nn = tpl_alloc(P->rt, cap * sizeof *nn);
            if (n) memcpy(nn, names, n * sizeof *nn);
            names = nn;
        }
        names[n++] = tok_name(P);
        tpl_node *def = NULL;
        if (is_op(P, OP_ASSIGN)) {
            adv(P);
            def = parse_expr(P);
        } else if (defs.n && defs.v[defs.n - 1]) {
            fail(P, "non-default argument follows default argument");
        }
        vpush(P, &defs, def);
    }
    expect_op(P, OP_RPAREN);
    expect_block_end(P);
    tpl_node *outer = P->macro;
    int outer_loops = P->loops;
    P->macro = m;
    P->loops = 0;
    static const char *const ends[] = {"endmacro", NULL};
    nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    P->macro = outer;
    P->loops = outer_loops;
    adv(P);
    expect_block_end(P);
    m->names = names;
    m->nitems2 = n;
    m->items2 = defs.v;
    m->items = body.v;
    m->nitems = body.n;
    return m;
}

static tpl_node *parse_set(ps *P, int line) {
    tpl_node *s = mk(P, S_SET, line);
    s->a = parse_target(P, 1);
    if (is_op(P, OP_ASSIGN)) {
        adv(P);
        s->b = parse_tuple(P, 1, 0);
        expect_block_end(P);
        return s;
    }
    s->kind = S_SETBLOCK;
    if (is_op(P, OP_PIPE)) s->c = parse_filter(P, NULL);
    expect_block_end(P);
    static const char *const ends[] = {"endset", NULL};
    nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    adv(P);
    expect_block_end(P);
    s->items = body.v;
    s->nitems = body.n;
    return s;
}

static tpl_node *parse_statement(ps *P) {
    const tpl_tok *t = cur(P);
    int line = t->line;
    if (t->kind != TK_NAME) fail(P, "expected a tag name");
    enter(P);
    const char *prev_block = P->block;
    tpl_node *x = NULL;
    static const char *const simple[] = {"for", "if", "macro", "set", "filter", "with",
                                         "generation", "break", "continue", NULL};
    int k;
    for (k = 0; simple[k] && !is_name(P, simple[k]); k++) {}
    if (!simple[k]) {
        char b[80];
        P->rt->line = line;
        tpl_raise(P->rt, "syntax error: unknown or unexpected tag '%s'", describe(t, b, sizeof b));
    }
    P->block = simple[k];
    adv(P);
    nodevec body = {0};
    int which;
    switch (k) {
    case 0: x = parse_for(P, line); break;
    case 1: x = parse_if(P, line); break;
    case 2: x = parse_macro(P, line); break;
    case 3: x = parse_set(P, line); break;
    case 4: {
        static const char *const ends[] = {"endfilter", NULL};
        x = mk(P, S_FILTERBLOCK, line);
        tpl_node *chain = parse_filter(P, NULL);
        /* parse_filter wants a leading '|'; "filter upper" has none, so build it here. */
        if (!chain) {
            chain = mk(P, N_FILTER, line);
            chain->name = dotted_name(P);
            if (is_op(P, OP_LPAREN)) parse_call_args(P, chain);
            chain = parse_filter(P, chain);
        }
        x->a = chain;
        expect_block_end(P);
        subparse(P, ends, &body, &which);
        adv(P);
        expect_block_end(P);
        break;
    }
    case 5: {
        static const char *const ends[] = {"endwith", NULL};
        x = mk(P, S_WITH, line);
        nodevec vals = {0};
        const char **names = NULL;
        size_t n = 0, cap = 0;
        while (cur(P)->kind != TK_BLOCK_END) {
            if (n) expect_op(P, OP_COMMA);
            if (n == cap) {
                cap = cap ? cap * 2 : 4;
                const char **nn = tpl_alloc(P->rt, cap * sizeof *nn);
                if (n) memcpy(nn, names, n * sizeof *nn);
                names = nn;
            }
            names[n++] = tok_name(P);
            expect_op(P, OP_ASSIGN);
            vpush(P, &vals, parse_expr(P));
        }
        expect_block_end(P);
        subparse(P, ends, &body, &which);
        adv(P);
        expect_block_end(P);
        x->names = names;
        x->items2 = vals.v;
        x->nitems2 = n;
        break;
    }
    case 6: {
        static const char *const ends[] = {"endgeneration", NULL};
        x = mk(P, S_GENERATION, line);
        expect_block_end(P);
        subparse(P, ends, &body, &which);
        adv(P);
        expect_block_end(P);
        break;
    }
    default:
        if (!P->loops) {
            P->rt->line = line;
            tpl_raise(P->rt, "syntax error: '%s' outside of a loop", simple[k]);
        }
        x = mk(P, k == 7 ? S_BREAK : S_CONTINUE, line);
        expect_block_end(P);
        break;
    }
    if (body.n) {
        x->items = body.v;
        x->nitems = body.n;
    }
    P->block = prev_block;
    P->depth--;
    return x;
}

/* Parses statements until a {% tag %} named in ends (NULL-terminated; may be empty): returns
 * with the stream on that tag's name and its index in *which. At the top level (no ends) it
 * runs to the end of the template. */
static void subparse(ps *P, const char *const *ends, nodevec *out, int *which) {
    while (1) {
        const tpl_tok *t = cur(P);
        if (t->kind == TK_EOF) {
            if (!ends[0]) return;
            P->rt->line = t->line;
            tpl_raise(P->rt, "syntax error: unexpected end of template, expected '%s' to close "
                      "'%s'", ends[0], P->block ? P->block : "block");
        }
        if (t->kind == TK_DATA) {
            tpl_node *d = mk(P, S_DATA, t->line);
            d->val = tpl_str_ref(t->p, t->n);
            vpush(P, out, d);
            adv(P);
        } else if (t->kind == TK_VAR_BEGIN) {
            adv(P);
            tpl_node *o = mk(P, S_OUTPUT, t->line);
            o->a = parse_tuple(P, 1, 0);
            if (cur(P)->kind != TK_VAR_END) fail(P, "expected end of print statement");
            adv(P);
            vpush(P, out, o);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            adv(P);
            for (int k = 0; ends[k]; k++)
                if (is_name(P, ends[k])) {
                    *which = k;
                    return;
                }
            vpush(P, out, parse_statement(P));
        } else {
            fail(P, "unexpected token");
        }
    }
}

void tpl_parse(tpl_rt *rt, const tpl_tok *toks, size_t ntoks, tpl_node ***body, size_t *nbody) {
    ps P = {.rt = rt, .t = toks, .n = ntoks};
    static const char *const none[] = {NULL};
    nodevec out = {0};
    int which;
    subparse(&P, none, &out, &which);
    *body = out.v;
    *nbody = out.n;
}
