/* Expression parser of the chat-template interpreter, and the token-stream state and helpers the
 * statement parser (tpl_parse.c) shares with it. Operator precedence follows jinja2.parser:
 * conditional expressions, or, and, not, comparison chains (with in / not in), + -, ~,
 * * / // %, **, unary signs, then postfix subscripts and calls, |filters and `is` tests. */
#ifndef LILY_CHAT_TPL_EXPR_H
#define LILY_CHAT_TPL_EXPR_H

#include "chat/tpl_parse.h"

#define TPL_MAX_NEST 200 /* expression and block nesting; deeper input is rejected */

typedef struct tpl_ps {
    tpl_rt *rt;
    const tpl_tok *t;
    size_t n, i;
    int depth;
    tpl_node *macro;   /* the macro being parsed, to note uses of varargs/kwargs/caller */
    const char *block; /* innermost open block, for end-of-template messages */
    int loops;         /* for loops open around the current statement (reset inside macros) */
} tpl_ps;

typedef struct tpl_nodevec {
    tpl_node **v;
    size_t n, cap;
} tpl_nodevec;

/* ---- token stream ---- */
const tpl_tok *tpl_ps_cur(tpl_ps *P);
const tpl_tok *tpl_ps_peek(tpl_ps *P, size_t k);
void tpl_ps_adv(tpl_ps *P);
const char *tpl_ps_describe(const tpl_tok *t, char *buf, size_t n);
/* Raises "syntax error: <what> (got '<token>')" at the current token's line. */
_Noreturn void tpl_ps_fail(tpl_ps *P, const char *what);
int tpl_ps_is_op(tpl_ps *P, int op);
int tpl_ps_is_name(tpl_ps *P, const char *s);
void tpl_ps_expect_op(tpl_ps *P, int op);
void tpl_ps_expect_name(tpl_ps *P, const char *s);
void tpl_ps_expect_block_end(tpl_ps *P);
/* Consumes a name token; returns it NUL-terminated in the arena. */
const char *tpl_ps_name(tpl_ps *P);
tpl_node *tpl_ps_node(tpl_ps *P, int kind, int line);
/* Counts one level of nesting; raises beyond TPL_MAX_NEST (the caller decrements P->depth). */
void tpl_ps_enter(tpl_ps *P);
void tpl_ps_push(tpl_ps *P, tpl_nodevec *v, tpl_node *x);

/* ---- expressions ---- */
tpl_node *tpl_parse_expr(tpl_ps *P);
/* An expression or an implicit tuple "a, b"; with_condexpr=0 stops before "x if c else y". */
tpl_node *tpl_parse_tuple(tpl_ps *P, int with_condexpr, int explicit_parens);
/* "|f(args)|g..." applied to x (x may be NULL for the chain of a filter block). */
tpl_node *tpl_parse_filter(tpl_ps *P, tpl_node *x);
/* "(args, name=value)" into x->items, x->names/x->items2. */
void tpl_parse_call_args(tpl_ps *P, tpl_node *x);
/* A name, possibly dotted ("a.b"), as used for filter and test names. */
const char *tpl_parse_dotted_name(tpl_ps *P);

#endif
