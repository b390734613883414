/* Lexer of the chat-template interpreter: turns template source into text and tag tokens with
 * Jinja2's whitespace rules as HF configures them (trim_blocks=True, lstrip_blocks=True, `-` and
 * `+` modifiers, newline normalisation, one trailing newline dropped, {% raw %} blocks). */
#ifndef LILY_CHAT_TPL_LEX_H
#define LILY_CHAT_TPL_LEX_H

#include "chat/tpl_value.h"

typedef enum tpl_tok_kind {
    TK_EOF = 0,
    TK_DATA,        /* literal text; p/n */
    TK_VAR_BEGIN,   /* {{ */
    TK_VAR_END,     /* }} */
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,   /* %} */
    TK_NAME,        /* p/n */
    TK_STRING,      /* p/n hold the decoded text */
    TK_INT,         /* i */
    TK_FLOAT,       /* f */
    TK_OP,          /* op */
} tpl_tok_kind;

typedef enum tpl_op {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_TILDE,
    OP_LBRACKET,
    OP_RBRACKET,
    OP_LPAREN,
    OP_RPAREN,
    OP_LBRACE,
    OP_RBRACE,
    OP_EQ,
    OP_NE,
    OP_GT,
    OP_GE,
    OP_LT,
    OP_LE,
    OP_ASSIGN,
    OP_DOT,
    OP_COLON,
    OP_PIPE,
    OP_COMMA,
    OP_SEMICOLON,
} tpl_op;

typedef struct tpl_tok {
    int kind; /* tpl_tok_kind */
    int line;
    int op; /* tpl_op for TK_OP */
    const char *p;
    size_t n;
    int64_t i;
    double f;
} tpl_tok;

/* Tokenizes src (len bytes). Tokens and their text live in rt's arena; the list ends with TK_EOF.
 * Raises (tpl_raise, with rt->line set) on an unterminated tag, comment or string. */
void tpl_lex(tpl_rt *rt, const char *src, size_t len, tpl_tok **toks, size_t *ntoks);

/* Printable name of an operator, for error messages. */
const char *tpl_op_name(int op);

#endif
