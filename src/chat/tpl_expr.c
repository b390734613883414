/* Expression parser of the chat-template interpreter (see tpl_expr.h): precedence climbing in
 * jinja2.parser's order, plus the token-stream helpers shared with the statement parser. */
#include "chat/tpl_expr.h"

#include <stdio.h>
#include <string.h>

void tpl_ps_push(tpl_ps *P, tpl_nodevec *v, tpl_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        tpl_node **nv = tpl_alloc(P->rt, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

const tpl_tok *tpl_ps_cur(tpl_ps *P) {
    return &P->t[P->i];
}
const tpl_tok *tpl_ps_peek(tpl_ps *P, size_t k) {
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}
void tpl_ps_adv(tpl_ps *P) {
    if (P->i + 1 < P->n) P->i++;
}

const char *tpl_ps_describe(const tpl_tok *t, char *buf, size_t n) {
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

_Noreturn void tpl_ps_fail(tpl_ps *P, const char *what) {
    char b[80];
    P->rt->line = tpl_ps_cur(P)->line;
    tpl_raise(P->rt, "syntax error: %s (got '%s')", what,
              tpl_ps_describe(tpl_ps_cur(P), b, sizeof b));
}

int tpl_ps_is_op(tpl_ps *P, int op) {
    return tpl_ps_cur(P)->kind == TK_OP && tpl_ps_cur(P)->op == op;
}
int tpl_ps_is_name(tpl_ps *P, const char *s) {
    const tpl_tok *t = tpl_ps_cur(P);
    return t->kind == TK_NAME && t->n == strlen(s) && !memcmp(t->p, s, t->n);
}
void tpl_ps_expect_op(tpl_ps *P, int op) {
    if (!tpl_ps_is_op(P, op)) {
        char w[40];
        snprintf(w, sizeof w, "expected '%s'", tpl_op_name(op));
        tpl_ps_fail(P, w);
    }
    tpl_ps_adv(P);
}
void tpl_ps_expect_name(tpl_ps *P, const char *s) {
    if (!tpl_ps_is_name(P, s)) {
        char w[40];
        snprintf(w, sizeof w, "expected '%s'", s);
        tpl_ps_fail(P, w);
    }
    tpl_ps_adv(P);
}
void tpl_ps_expect_block_end(tpl_ps *P) {
    if (tpl_ps_cur(P)->kind != TK_BLOCK_END) tpl_ps_fail(P, "expected end of statement block");
    tpl_ps_adv(P);
}

const char *tpl_ps_name(tpl_ps *P) {
    const tpl_tok *t = tpl_ps_cur(P);
    if (t->kind != TK_NAME) tpl_ps_fail(P, "expected a name");
    char *s = tpl_alloc(P->rt, t->n + 1);
    memcpy(s, t->p, t->n);
    tpl_ps_adv(P);
    return s;
}

tpl_node *tpl_ps_node(tpl_ps *P, int kind, int line) {
    tpl_node *x = tpl_alloc(P->rt, sizeof *x);
    x->kind = kind;
    x->line = line;
    return x;
}

void tpl_ps_enter(tpl_ps *P) {
    if (++P->depth > TPL_MAX_NEST) {
        P->rt->line = tpl_ps_cur(P)->line;
        tpl_raise(P->rt, "template nested too deeply (more than %d levels)", TPL_MAX_NEST);
    }
}

/* ---- expressions ------------------------------------------------------------------------ */

static tpl_node *parse_or(tpl_ps *P);
static tpl_node *parse_unary(tpl_ps *P, int with_filter);
static tpl_node *parse_primary(tpl_ps *P);
static tpl_node *parse_postfix(tpl_ps *P, tpl_node *x);
static tpl_node *parse_filter_expr(tpl_ps *P, tpl_node *x);

/* Parses "(args)" into x->items (positional) and x->names/items2 (keyword). */
void tpl_parse_call_args(tpl_ps *P, tpl_node *x) {
    tpl_ps_expect_op(P, OP_LPAREN);
    tpl_nodevec args = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t nkw = 0, kwcap = 0;
    while (!tpl_ps_is_op(P, OP_RPAREN)) {
        if (args.n || nkw) tpl_ps_expect_op(P, OP_COMMA);
        if (tpl_ps_is_op(P, OP_RPAREN)) break;
        if (tpl_ps_is_op(P, OP_MUL) || tpl_ps_is_op(P, OP_POW))
            tpl_ps_fail(P, "*args and **kwargs are not supported");
        if (tpl_ps_cur(P)->kind == TK_NAME && tpl_ps_peek(P, 1)->kind == TK_OP &&
            tpl_ps_peek(P, 1)->op == OP_ASSIGN) {
            const char *k = tpl_ps_name(P);
            tpl_ps_adv(P);
            if (nkw == kwcap) {
                kwcap = kwcap ? kwcap * 2 : 4;
                const char **nn = tpl_alloc(P->rt, kwcap * sizeof *nn);
                if (nkw) memcpy(nn, kwn, nkw * sizeof *nn);
                kwn = nn;
            }
            kwn[nkw++] = k;
            tpl_ps_push(P, &kwv, tpl_parse_expr(P));
        } else {
            if (nkw) tpl_ps_fail(P, "positional argument after a keyword argument");
            tpl_ps_push(P, &args, tpl_parse_expr(P));
        }
    }
    tpl_ps_expect_op(P, OP_RPAREN);
    x->items = args.v;
    x->nitems = args.n;
    x->items2 = kwv.v;
    x->nitems2 = nkw;
    x->names = kwn;
}

tpl_node *tpl_parse_tuple(tpl_ps *P, int with_condexpr, int explicit_parens) {
    int line = tpl_ps_cur(P)->line;
    tpl_nodevec v = {0};
    int is_tuple = 0;
    while (1) {
        if (v.n) tpl_ps_expect_op(P, OP_COMMA);
        const tpl_tok *t = tpl_ps_cur(P);
        if (v.n && (t->kind == TK_BLOCK_END || t->kind == TK_VAR_END ||
                    (t->kind == TK_OP && t->op == OP_RPAREN) || tpl_ps_is_name(P, "recursive") ||
                    tpl_ps_is_name(P, "if")))
            break;
        if (explicit_parens && !v.n && tpl_ps_is_op(P, OP_RPAREN)) {
            is_tuple = 1; /* () */
            break;
        }
        tpl_ps_push(P, &v, with_condexpr ? tpl_parse_expr(P) : parse_or(P));
        if (tpl_ps_is_op(P, OP_COMMA))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) return v.v[0];
    tpl_node *x = tpl_ps_node(P, N_TUPLE, line);
    x->items = v.v;
    x->nitems = v.n;
    return x;
}

tpl_node *tpl_parse_expr(tpl_ps *P) {
    tpl_ps_enter(P);
    int line = tpl_ps_cur(P)->line;
    tpl_node *x = parse_or(P);
    while (tpl_ps_is_name(P, "if")) {
        tpl_ps_adv(P);
        tpl_node *c = tpl_ps_node(P, N_COND, line);
        c->b = x;
        c->a = parse_or(P);
        if (tpl_ps_is_name(P, "else")) {
            tpl_ps_adv(P);
            c->c = tpl_parse_expr(P);
        }
        x = c;
    }
    P->depth--;
    return x;
}

static tpl_node *binary(tpl_ps *P, int kind, int op, tpl_node *a, tpl_node *b, int line) {
    tpl_node *x = tpl_ps_node(P, kind, line);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static tpl_node *parse_not(tpl_ps *P);
static tpl_node *parse_and(tpl_ps *P) {
    tpl_node *x = parse_not(P);
    while (tpl_ps_is_name(P, "and")) {
        int line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        x = binary(P, N_AND, 0, x, parse_not(P), line);
    }
    return x;
}

static tpl_node *parse_or(tpl_ps *P) {
    tpl_node *x = parse_and(P);
    while (tpl_ps_is_name(P, "or")) {
        int line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        x = binary(P, N_OR, 0, x, parse_and(P), line);
    }
    return x;
}

static tpl_node *parse_math1(tpl_ps *P);
static tpl_node *parse_compare(tpl_ps *P) {
    int line = tpl_ps_cur(P)->line;
    tpl_node *x = parse_math1(P);
    tpl_nodevec rest = {0};
    int ops[64], nops = 0;
    while (1) {
        int op = 0;
        const tpl_tok *t = tpl_ps_cur(P);
        if (t->kind == TK_OP) {
            op = t->op == OP_EQ   ? CMP_EQ
                 : t->op == OP_NE ? CMP_NE
                 : t->op == OP_LT ? CMP_LT
                 : t->op == OP_LE ? CMP_LE
                 : t->op == OP_GT ? CMP_GT
                 : t->op == OP_GE ? CMP_GE
                                  : 0;
            if (op) tpl_ps_adv(P);
        } else if (tpl_ps_is_name(P, "in")) {
            op = CMP_IN;
            tpl_ps_adv(P);
        } else if (tpl_ps_is_name(P, "not") && tpl_ps_peek(P, 1)->kind == TK_NAME &&
                   tpl_ps_peek(P, 1)->n == 2 && !memcmp(tpl_ps_peek(P, 1)->p, "in", 2)) {
            op = CMP_NOTIN;
            tpl_ps_adv(P);
            tpl_ps_adv(P);
        }
        if (!op) break;
        if (nops == 64) tpl_ps_fail(P, "comparison chain too long");
        ops[nops++] = op;
        tpl_ps_push(P, &rest, parse_math1(P));
    }
    if (!nops) return x;
    tpl_node *c = tpl_ps_node(P, N_CMP, line);
    c->a = x;
    c->items = rest.v;
    c->nitems = rest.n;
    c->ops = tpl_alloc(P->rt, (size_t)nops * sizeof(int));
    memcpy(c->ops, ops, (size_t)nops * sizeof(int));
    return c;
}

static tpl_node *parse_not(tpl_ps *P) {
    if (tpl_ps_is_name(P, "not")) {
        int line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        tpl_ps_enter(P);
        tpl_node *x = tpl_ps_node(P, N_NOT, line);
        x->a = parse_not(P);
        P->depth--;
        return x;
    }
    return parse_compare(P);
}

static tpl_node *parse_concat(tpl_ps *P);
static tpl_node *parse_math1(tpl_ps *P) {
    tpl_node *x = parse_concat(P);
    while (tpl_ps_is_op(P, OP_ADD) || tpl_ps_is_op(P, OP_SUB)) {
        int op = tpl_ps_cur(P)->op, line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        x = binary(P, N_BINOP, op, x, parse_concat(P), line);
    }
    return x;
}

static tpl_node *parse_math2(tpl_ps *P);
static tpl_node *parse_concat(tpl_ps *P) {
    int line = tpl_ps_cur(P)->line;
    tpl_node *x = parse_math2(P);
    if (!tpl_ps_is_op(P, OP_TILDE)) return x;
    tpl_nodevec v = {0};
    tpl_ps_push(P, &v, x);
    while (tpl_ps_is_op(P, OP_TILDE)) {
        tpl_ps_adv(P);
        tpl_ps_push(P, &v, parse_math2(P));
    }
    tpl_node *c = tpl_ps_node(P, N_CONCAT, line);
    c->items = v.v;
    c->nitems = v.n;
    return c;
}

static tpl_node *parse_pow(tpl_ps *P);
static tpl_node *parse_math2(tpl_ps *P) {
    tpl_node *x = parse_pow(P);
    while (tpl_ps_is_op(P, OP_MUL) || tpl_ps_is_op(P, OP_DIV) || tpl_ps_is_op(P, OP_FLOORDIV) ||
           tpl_ps_is_op(P, OP_MOD)) {
        int op = tpl_ps_cur(P)->op, line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        x = binary(P, N_BINOP, op, x, parse_pow(P), line);
    }
    return x;
}

static tpl_node *parse_pow(tpl_ps *P) {
    tpl_node *x = parse_unary(P, 1);
    while (tpl_ps_is_op(P, OP_POW)) {
        int line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        x = binary(P, N_BINOP, OP_POW, x, parse_unary(P, 1), line);
    }
    return x;
}

static tpl_node *parse_unary(tpl_ps *P, int with_filter) {
    tpl_ps_enter(P);
    int line = tpl_ps_cur(P)->line;
    tpl_node *x;
    if (tpl_ps_is_op(P, OP_SUB) || tpl_ps_is_op(P, OP_ADD)) {
        int neg = tpl_ps_is_op(P, OP_SUB);
        tpl_ps_adv(P);
        x = tpl_ps_node(P, neg ? N_NEG : N_POS, line);
        x->a = parse_unary(P, 0);
    } else {
        x = parse_primary(P);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static tpl_node *parse_primary(tpl_ps *P) {
    const tpl_tok *t = tpl_ps_cur(P);
    tpl_node *x;
    if (t->kind == TK_NAME) {
        x = tpl_ps_node(P, N_CONST, t->line);
        if (tpl_ps_is_name(P, "true") || tpl_ps_is_name(P, "True"))
            x->val = tpl_bool(1);
        else if (tpl_ps_is_name(P, "false") || tpl_ps_is_name(P, "False"))
            x->val = tpl_bool(0);
        else if (tpl_ps_is_name(P, "none") || tpl_ps_is_name(P, "None"))
            x->val = tpl_none();
        else {
            x->kind = N_NAME;
            x->name = tpl_ps_name(P);
            if (P->macro) {
                if (!strcmp(x->name, "varargs")) P->macro->op |= TPL_MACRO_VARARGS;
                if (!strcmp(x->name, "kwargs")) P->macro->op |= TPL_MACRO_KWARGS;
                if (!strcmp(x->name, "caller")) P->macro->op |= TPL_MACRO_CALLER;
            }
            return x;
        }
        tpl_ps_adv(P);
        return x;
    }
    if (t->kind == TK_STRING) {
        x = tpl_ps_node(P, N_CONST, t->line);
        tpl_buf b = {0};
        while (tpl_ps_cur(P)->kind == TK_STRING) { /* adjacent literals concatenate */
            tpl_buf_put(P->rt, &b, tpl_ps_cur(P)->p, tpl_ps_cur(P)->n);
            tpl_ps_adv(P);
        }
        x->val = tpl_buf_val(&b);
        return x;
    }
    if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        x = tpl_ps_node(P, N_CONST, t->line);
        x->val = t->kind == TK_INT ? tpl_int(t->i) : tpl_float(t->f);
        tpl_ps_adv(P);
        return x;
    }
    if (tpl_ps_is_op(P, OP_LPAREN)) {
        tpl_ps_adv(P);
        x = tpl_parse_tuple(P, 1, 1);
        tpl_ps_expect_op(P, OP_RPAREN);
        return x;
    }
    if (tpl_ps_is_op(P, OP_LBRACKET)) {
        x = tpl_ps_node(P, N_LIST, t->line);
        tpl_ps_adv(P);
        tpl_nodevec v = {0};
        while (!tpl_ps_is_op(P, OP_RBRACKET)) {
            if (v.n) tpl_ps_expect_op(P, OP_COMMA);
            if (tpl_ps_is_op(P, OP_RBRACKET)) break;
            tpl_ps_push(P, &v, tpl_parse_expr(P));
        }
        tpl_ps_expect_op(P, OP_RBRACKET);
        x->items = v.v;
        x->nitems = v.n;
        return x;
    }
    if (tpl_ps_is_op(P, OP_LBRACE)) {
        x = tpl_ps_node(P, N_DICT, t->line);
        tpl_ps_adv(P);
        tpl_nodevec k = {0}, v = {0};
        while (!tpl_ps_is_op(P, OP_RBRACE)) {
            if (k.n) tpl_ps_expect_op(P, OP_COMMA);
            if (tpl_ps_is_op(P, OP_RBRACE)) break;
            tpl_ps_push(P, &k, tpl_parse_expr(P));
            tpl_ps_expect_op(P, OP_COLON);
            tpl_ps_push(P, &v, tpl_parse_expr(P));
        }
        tpl_ps_expect_op(P, OP_RBRACE);
        x->items = k.v;
        x->nitems = k.n;
        x->items2 = v.v;
        x->nitems2 = v.n;
        return x;
    }
    tpl_ps_fail(P, "unexpected token in expression");
}

static tpl_node *parse_subscribed(tpl_ps *P) {
    int line = tpl_ps_cur(P)->line;
    tpl_node *a = NULL;
    if (!tpl_ps_is_op(P, OP_COLON)) {
        a = tpl_parse_expr(P);
        if (!tpl_ps_is_op(P, OP_COLON)) return a;
    }
    tpl_node *s = tpl_ps_node(P, N_SLICE, line);
    s->a = a;
    tpl_ps_adv(P); /* ':' */
    if (!tpl_ps_is_op(P, OP_RBRACKET) && !tpl_ps_is_op(P, OP_COMMA) && !tpl_ps_is_op(P, OP_COLON))
        s->b = tpl_parse_expr(P);
    if (tpl_ps_is_op(P, OP_COLON)) {
        tpl_ps_adv(P);
        if (!tpl_ps_is_op(P, OP_RBRACKET) && !tpl_ps_is_op(P, OP_COMMA)) s->c = tpl_parse_expr(P);
    }
    return s;
}

static tpl_node *parse_postfix(tpl_ps *P, tpl_node *x) {
    while (1) {
        int line = tpl_ps_cur(P)->line;
        if (tpl_ps_is_op(P, OP_DOT)) {
            tpl_ps_adv(P);
            if (tpl_ps_cur(P)->kind == TK_NAME) {
                tpl_node *g = tpl_ps_node(P, N_GETATTR, line);
                g->a = x;
                g->name = tpl_ps_name(P);
                x = g;
            } else if (tpl_ps_cur(P)->kind == TK_INT) {
                tpl_node *g = tpl_ps_node(P, N_GETITEM, line), *k = tpl_ps_node(P, N_CONST, line);
                k->val = tpl_int(tpl_ps_cur(P)->i);
                tpl_ps_adv(P);
                g->a = x;
                g->b = k;
                x = g;
            } else {
                tpl_ps_fail(P, "expected name or number after '.'");
            }
        } else if (tpl_ps_is_op(P, OP_LBRACKET)) {
            tpl_ps_adv(P);
            tpl_nodevec v = {0};
            while (!tpl_ps_is_op(P, OP_RBRACKET)) {
                if (v.n) tpl_ps_expect_op(P, OP_COMMA);
                tpl_ps_push(P, &v, parse_subscribed(P));
            }
            tpl_ps_expect_op(P, OP_RBRACKET);
            if (!v.n) tpl_ps_fail(P, "expected a subscript");
            tpl_node *g = tpl_ps_node(P, N_GETITEM, line);
            g->a = x;
            if (v.n == 1) {
                g->b = v.v[0];
            } else {
                g->b = tpl_ps_node(P, N_TUPLE, line);
                g->b->items = v.v;
                g->b->nitems = v.n;
            }
            x = g;
        } else if (tpl_ps_is_op(P, OP_LPAREN)) {
            tpl_node *c = tpl_ps_node(P, N_CALL, line);
            c->a = x;
            tpl_parse_call_args(P, c);
            x = c;
        } else {
            return x;
        }
    }
}

const char *tpl_parse_dotted_name(tpl_ps *P) {
    const char *name = tpl_ps_name(P);
    while (tpl_ps_is_op(P, OP_DOT) && tpl_ps_peek(P, 1)->kind == TK_NAME) {
        tpl_ps_adv(P);
        const char *more = tpl_ps_name(P);
        size_t a = strlen(name), b = strlen(more);
        char *s = tpl_alloc(P->rt, a + b + 2);
        memcpy(s, name, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b);
        name = s;
    }
    return name;
}

tpl_node *tpl_parse_filter(tpl_ps *P, tpl_node *x) {
    while (tpl_ps_is_op(P, OP_PIPE)) {
        int line = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        tpl_node *f = tpl_ps_node(P, N_FILTER, line);
        f->a = x;
        f->name = tpl_parse_dotted_name(P);
        if (tpl_ps_is_op(P, OP_LPAREN)) tpl_parse_call_args(P, f);
        x = f;
    }
    return x;
}

static tpl_node *parse_test(tpl_ps *P, tpl_node *x) {
    int line = tpl_ps_cur(P)->line;
    tpl_ps_adv(P); /* is */
    int negated = 0;
    if (tpl_ps_is_name(P, "not")) {
        negated = 1;
        tpl_ps_adv(P);
    }
    tpl_node *t = tpl_ps_node(P, N_TEST, line);
    t->a = x;
    t->name = tpl_parse_dotted_name(P);
    const tpl_tok *c = tpl_ps_cur(P);
    if (tpl_ps_is_op(P, OP_LPAREN)) {
        tpl_parse_call_args(P, t);
    } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT ||
                c->kind == TK_FLOAT || tpl_ps_is_op(P, OP_LBRACKET) ||
                tpl_ps_is_op(P, OP_LBRACE)) &&
               !tpl_ps_is_name(P, "else") && !tpl_ps_is_name(P, "or") &&
               !tpl_ps_is_name(P, "and")) {
        /* Jinja takes one bare argument: "x is divisibleby 3", "x is sameas none". */
        if (tpl_ps_is_name(P, "is")) tpl_ps_fail(P, "you cannot chain multiple tests with is");
        tpl_node *arg = parse_postfix(P, parse_primary(P));
        t->items = tpl_alloc(P->rt, sizeof *t->items);
        t->items[0] = arg;
        t->nitems = 1;
    }
    if (!negated) return t;
    tpl_node *n = tpl_ps_node(P, N_NOT, line);
    n->a = t;
    return n;
}

static tpl_node *parse_filter_expr(tpl_ps *P, tpl_node *x) {
    while (1) {
        if (tpl_ps_is_op(P, OP_PIPE))
            x = tpl_parse_filter(P, x);
        else if (tpl_ps_is_name(P, "is"))
            x = parse_test(P, x);
        else if (tpl_ps_is_op(P, OP_LPAREN)) {
            tpl_node *c = tpl_ps_node(P, N_CALL, tpl_ps_cur(P)->line);
            c->a = x;
            tpl_parse_call_args(P, c);
            x = c;
        } else
            return x;
    }
}
