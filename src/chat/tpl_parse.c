/* Template parser (see tpl_parse.h): statements and blocks; expressions are parsed by
 * tpl_expr.c. */
#include "chat/tpl_parse.h"

#include <string.h>

#include "chat/tpl_expr.h"

/* ---- statements ------------------------------------------------------------------------- */

static void subparse(tpl_ps *P, const char *const *ends, tpl_nodevec *out, int *which);

/* Assignment target: a name, "ns.attr" (with_ns), or a tuple of names. */
static tpl_node *parse_target(tpl_ps *P, int with_ns) {
    int line = tpl_ps_cur(P)->line;
    tpl_nodevec v = {0};
    int tuple = 0;
    while (1) {
        tpl_node *x = tpl_ps_node(P, N_NAME, tpl_ps_cur(P)->line);
        x->name = tpl_ps_name(P);
        if (with_ns && !v.n && tpl_ps_is_op(P, OP_DOT)) {
            tpl_ps_adv(P);
            tpl_node *g = tpl_ps_node(P, N_GETATTR, line);
            g->a = x;
            g->name = tpl_ps_name(P);
            return g;
        }
        tpl_ps_push(P, &v, x);
        if (!tpl_ps_is_op(P, OP_COMMA)) break;
        tuple = 1;
        tpl_ps_adv(P);
        if (tpl_ps_cur(P)->kind != TK_NAME || tpl_ps_is_name(P, "in")) break;
    }
    if (!tuple) return v.v[0];
    tpl_node *t = tpl_ps_node(P, N_TUPLE, line);
    t->items = v.v;
    t->nitems = v.n;
    return t;
}

static tpl_node *parse_for(tpl_ps *P, int line) {
    tpl_node *f = tpl_ps_node(P, S_FOR, line);
    f->a = parse_target(P, 0);
    tpl_ps_expect_name(P, "in");
    f->b = tpl_parse_tuple(P, 0, 0);
    if (tpl_ps_is_name(P, "if")) {
        tpl_ps_adv(P);
        f->c = tpl_parse_expr(P);
    }
    if (tpl_ps_is_name(P, "recursive")) {
        tpl_ps_adv(P);
        f->op = 1;
    }
    tpl_ps_expect_block_end(P);
    static const char *const ends[] = {"endfor", "else", NULL};
    tpl_nodevec body = {0}, els = {0};
    int which;
    P->loops++;
    subparse(P, ends, &body, &which);
    P->loops--;
    if (which == 1) {
        static const char *const ends2[] = {"endfor", NULL};
        tpl_ps_adv(P);
        tpl_ps_expect_block_end(P);
        subparse(P, ends2, &els, &which);
    }
    tpl_ps_adv(P);
    tpl_ps_expect_block_end(P);
    f->items = body.v;
    f->nitems = body.n;
    f->items2 = els.v;
    f->nitems2 = els.n;
    return f;
}

static tpl_node *parse_if(tpl_ps *P, int line) {
    tpl_node *f = tpl_ps_node(P, S_IF, line);
    f->a = tpl_parse_tuple(P, 0, 0);
    tpl_ps_expect_block_end(P);
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    tpl_nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    f->items = body.v;
    f->nitems = body.n;
    if (which == 1) { /* elif: an if nested in the else branch */
        int l2 = tpl_ps_cur(P)->line;
        tpl_ps_adv(P);
        tpl_node *inner = parse_if(P, l2);
        f->items2 = tpl_alloc(P->rt, sizeof *f->items2);
        f->items2[0] = inner;
        f->nitems2 = 1;
        return f; /* the nested if consumed the endif */
    }
    if (which == 2) {
        static const char *const ends2[] = {"endif", NULL};
        tpl_nodevec els = {0};
        tpl_ps_adv(P);
        tpl_ps_expect_block_end(P);
        subparse(P, ends2, &els, &which);
        f->items2 = els.v;
        f->nitems2 = els.n;
    }
    tpl_ps_adv(P);
    tpl_ps_expect_block_end(P);
    return f;
}

static tpl_node *parse_macro(tpl_ps *P, int line) {
    tpl_node *m = tpl_ps_node(P, S_MACRO, line);
    m->name = tpl_ps_name(P);
    tpl_ps_expect_op(P, OP_LPAREN);
    tpl_nodevec defs = {0};
    const char **names = NULL;
    size_t n = 0, cap = 0;
    while (!tpl_ps_is_op(P, OP_RPAREN)) {
        if (n) tpl_ps_expect_op(P, OP_COMMA);
        if (tpl_ps_is_op(P, OP_RPAREN)) break;
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nn = tpl_alloc(P->rt, cap * sizeof *nn);
            if (n) memcpy(nn, names, n * sizeof *nn);
            names = nn;
        }
        names[n++] = tpl_ps_name(P);
        tpl_node *def = NULL;
        if (tpl_ps_is_op(P, OP_ASSIGN)) {
            tpl_ps_adv(P);
            def = tpl_parse_expr(P);
        } else if (defs.n && defs.v[defs.n - 1]) {
            tpl_ps_fail(P, "non-default argument follows default argument");
        }
        tpl_ps_push(P, &defs, def);
    }
    tpl_ps_expect_op(P, OP_RPAREN);
    tpl_ps_expect_block_end(P);
    tpl_node *outer = P->macro;
    int outer_loops = P->loops;
    P->macro = m;
    P->loops = 0;
    static const char *const ends[] = {"endmacro", NULL};
    tpl_nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    P->macro = outer;
    P->loops = outer_loops;
    tpl_ps_adv(P);
    tpl_ps_expect_block_end(P);
    m->names = names;
    m->nitems2 = n;
    m->items2 = defs.v;
    m->items = body.v;
    m->nitems = body.n;
    return m;
}

static tpl_node *parse_set(tpl_ps *P, int line) {
    tpl_node *s = tpl_ps_node(P, S_SET, line);
    s->a = parse_target(P, 1);
    if (tpl_ps_is_op(P, OP_ASSIGN)) {
        tpl_ps_adv(P);
        s->b = tpl_parse_tuple(P, 1, 0);
        tpl_ps_expect_block_end(P);
        return s;
    }
    s->kind = S_SETBLOCK;
    if (tpl_ps_is_op(P, OP_PIPE)) s->c = tpl_parse_filter(P, NULL);
    tpl_ps_expect_block_end(P);
    static const char *const ends[] = {"endset", NULL};
    tpl_nodevec body = {0};
    int which;
    subparse(P, ends, &body, &which);
    tpl_ps_adv(P);
    tpl_ps_expect_block_end(P);
    s->items = body.v;
    s->nitems = body.n;
    return s;
}

static tpl_node *parse_statement(tpl_ps *P) {
    const tpl_tok *t = tpl_ps_cur(P);
    int line = t->line;
    if (t->kind != TK_NAME) tpl_ps_fail(P, "expected a tag name");
    tpl_ps_enter(P);
    const char *prev_block = P->block;
    tpl_node *x = NULL;
    static const char *const simple[] = {"for",  "if",         "macro", "set",      "filter",
                                         "with", "generation", "break", "continue", NULL};
    int k;
    for (k = 0; simple[k] && !tpl_ps_is_name(P, simple[k]); k++) {}
    if (!simple[k]) {
        char b[80];
        P->rt->line = line;
        tpl_raise(P->rt, "syntax error: unknown or unexpected tag '%s'",
                  tpl_ps_describe(t, b, sizeof b));
    }
    P->block = simple[k];
    tpl_ps_adv(P);
    tpl_nodevec body = {0};
    int which;
    switch (k) {
    case 0: x = parse_for(P, line); break;
    case 1: x = parse_if(P, line); break;
    case 2: x = parse_macro(P, line); break;
    case 3: x = parse_set(P, line); break;
    case 4: {
        static const char *const ends[] = {"endfilter", NULL};
        x = tpl_ps_node(P, S_FILTERBLOCK, line);
        tpl_node *chain = tpl_parse_filter(P, NULL);
        /* parse_filter wants a leading '|'; "filter upper" has none, so build it here. */
        if (!chain) {
            chain = tpl_ps_node(P, N_FILTER, line);
            chain->name = tpl_parse_dotted_name(P);
            if (tpl_ps_is_op(P, OP_LPAREN)) tpl_parse_call_args(P, chain);
            chain = tpl_parse_filter(P, chain);
        }
        x->a = chain;
        tpl_ps_expect_block_end(P);
        subparse(P, ends, &body, &which);
        tpl_ps_adv(P);
        tpl_ps_expect_block_end(P);
        break;
    }
    case 5: {
        static const char *const ends[] = {"endwith", NULL};
        x = tpl_ps_node(P, S_WITH, line);
        tpl_nodevec vals = {0};
        const char **names = NULL;
        size_t n = 0, cap = 0;
        while (tpl_ps_cur(P)->kind != TK_BLOCK_END) {
            if (n) tpl_ps_expect_op(P, OP_COMMA);
            if (n == cap) {
                cap = cap ? cap * 2 : 4;
                const char **nn = tpl_alloc(P->rt, cap * sizeof *nn);
                if (n) memcpy(nn, names, n * sizeof *nn);
                names = nn;
            }
            names[n++] = tpl_ps_name(P);
            tpl_ps_expect_op(P, OP_ASSIGN);
            tpl_ps_push(P, &vals, tpl_parse_expr(P));
        }
        tpl_ps_expect_block_end(P);
        subparse(P, ends, &body, &which);
        tpl_ps_adv(P);
        tpl_ps_expect_block_end(P);
        x->names = names;
        x->items2 = vals.v;
        x->nitems2 = n;
        break;
    }
    case 6: {
        static const char *const ends[] = {"endgeneration", NULL};
        x = tpl_ps_node(P, S_GENERATION, line);
        tpl_ps_expect_block_end(P);
        subparse(P, ends, &body, &which);
        tpl_ps_adv(P);
        tpl_ps_expect_block_end(P);
        break;
    }
    default:
        if (!P->loops) {
            P->rt->line = line;
            tpl_raise(P->rt, "syntax error: '%s' outside of a loop", simple[k]);
        }
        x = tpl_ps_node(P, k == 7 ? S_BREAK : S_CONTINUE, line);
        tpl_ps_expect_block_end(P);
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
static void subparse(tpl_ps *P, const char *const *ends, tpl_nodevec *out, int *which) {
    while (1) {
        const tpl_tok *t = tpl_ps_cur(P);
        if (t->kind == TK_EOF) {
            if (!ends[0]) return;
            P->rt->line = t->line;
            tpl_raise(P->rt,
                      "syntax error: unexpected end of template, expected '%s' to close "
                      "'%s'",
                      ends[0], P->block ? P->block : "block");
        }
        if (t->kind == TK_DATA) {
            tpl_node *d = tpl_ps_node(P, S_DATA, t->line);
            d->val = tpl_str_ref(t->p, t->n);
            tpl_ps_push(P, out, d);
            tpl_ps_adv(P);
        } else if (t->kind == TK_VAR_BEGIN) {
            tpl_ps_adv(P);
            tpl_node *o = tpl_ps_node(P, S_OUTPUT, t->line);
            o->a = tpl_parse_tuple(P, 1, 0);
            if (tpl_ps_cur(P)->kind != TK_VAR_END)
                tpl_ps_fail(P, "expected end of print statement");
            tpl_ps_adv(P);
            tpl_ps_push(P, out, o);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            tpl_ps_adv(P);
            for (int k = 0; ends[k]; k++)
                if (tpl_ps_is_name(P, ends[k])) {
                    *which = k;
                    return;
                }
            tpl_ps_push(P, out, parse_statement(P));
        } else {
            tpl_ps_fail(P, "unexpected token");
        }
    }
}

void tpl_parse(tpl_rt *rt, const tpl_tok *toks, size_t ntoks, tpl_node ***body, size_t *nbody) {
    tpl_ps P = {.rt = rt, .t = toks, .n = ntoks};
    static const char *const none[] = {NULL};
    tpl_nodevec out = {0};
    int which;
    subparse(&P, none, &out, &which);
    *body = out.v;
    *nbody = out.n;
}
