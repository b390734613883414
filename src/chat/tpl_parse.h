/* Parser of the chat-template interpreter: tokens to an abstract syntax tree following
 * jinja2.parser. This file's tpl_parse handles statements and blocks (for, if/elif/else, set,
 * macro, filter, with, break/continue, generation); expressions are in tpl_expr.h. */
#ifndef LILY_CHAT_TPL_PARSE_H
#define LILY_CHAT_TPL_PARSE_H

#include "chat/tpl_lex.h"

typedef enum tpl_node_kind {
    /* expressions */
    N_CONST = 1, /* val */
    N_NAME,      /* name */
    N_GETATTR,   /* a.name */
    N_GETITEM,   /* a[b] */
    N_SLICE,     /* a:b:c (any may be NULL) */
    N_CALL,      /* a(items..., names[i]=items2[i]...) */
    N_FILTER,    /* a|name(items..., kw...); a NULL in a filter block */
    N_TEST,      /* a is name(items..., kw...) */
    N_NOT,       /* not a */
    N_NEG,       /* -a */
    N_POS,       /* +a */
    N_BINOP,     /* a op b for + - * / // % ** */
    N_AND,       /* a and b */
    N_OR,        /* a or b */
    N_CMP,       /* a ops[0] items[0] ops[1] items[1] ... */
    N_CONCAT,    /* items[0] ~ items[1] ~ ... */
    N_COND,      /* b if a else c (c may be NULL) */
    N_LIST,      /* [items] */
    N_TUPLE,     /* (items) */
    N_DICT,      /* {items[i]: items2[i]} */
    /* statements */
    S_DATA,        /* literal text in val */
    S_OUTPUT,      /* {{ a }} */
    S_IF,          /* if a: items else items2 */
    S_FOR,         /* for a in b if c: items else items2; op = recursive */
    S_SET,         /* a = b */
    S_SETBLOCK,    /* a = output of items, through filter chain c (may be NULL) */
    S_MACRO,       /* name(names = items2 defaults): items; op = TPL_MACRO_* flags */
    S_FILTERBLOCK, /* output of items through filter chain a */
    S_WITH,        /* names = items2: items */
    S_BREAK,
    S_CONTINUE,
    S_GENERATION, /* HF's {% generation %}: renders items */
} tpl_node_kind;

enum { TPL_MACRO_VARARGS = 1, TPL_MACRO_KWARGS = 2, TPL_MACRO_CALLER = 4 };
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct tpl_node tpl_node;
struct tpl_node {
    int kind; /* tpl_node_kind */
    int line;
    int op; /* tpl_op for N_BINOP; flags for S_FOR/S_MACRO */
    tpl_node *a, *b, *c;
    tpl_node **items; /* arguments, elements, statements of a body */
    size_t nitems;
    tpl_node **items2; /* keyword values, dict values, else branch, macro defaults */
    size_t nitems2;
    const char **names; /* keyword names, macro parameters, with-targets */
    int *ops;           /* CMP_* for N_CMP */
    const char *name;   /* variable, attribute, filter, test or macro name (NUL-terminated) */
    tpl_val val;        /* N_CONST, S_DATA */
};

/* Parses tokens into the template body (a list of statements). Nodes live in rt's arena.
 * Raises on syntax errors with rt->line set. */
void tpl_parse(tpl_rt *rt, const tpl_tok *toks, size_t ntoks, tpl_node ***body, size_t *nbody);

#endif
