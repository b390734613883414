/* Template lexer (see tpl_lex.h). The whitespace rules follow jinja2.lexer: a `-` on a tag strips
 * all whitespace on that side; with lstrip_blocks, spaces and tabs between a line start and a
 * {% or {# tag are dropped; with trim_blocks, one newline after %} or #} is dropped; `+` turns
 * either off for that tag side. */
#include "chat/tpl_lex.h"

#include <stdlib.h>
#include <string.h>

typedef struct lx {
    tpl_rt *rt;
    const char *s;
    size_t n, pos;
    int line;
    int line_starting; /* the previous token ended with a newline (or we are at the start) */
    tpl_tok *t;
    size_t nt, cap;
} lx;

static tpl_tok *push(lx *L, int kind, int line) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        tpl_tok *t = tpl_alloc(L->rt, cap * sizeof *t);
        if (L->nt) memcpy(t, L->t, L->nt * sizeof *t);
        L->t = t;
        L->cap = cap;
    }
    tpl_tok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line;
    return t;
}

static int count_nl(const char *p, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

static int ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Length of text after stripping trailing Python whitespace (ASCII and Unicode spaces). */
static size_t rstrip_len(const char *p, size_t n) {
    while (n > 0) {
        size_t k = 1;
        while (k < n && k < 4 && ((unsigned char)p[n - k] & 0xc0) == 0x80)
            k++;
        int32_t cp;
        if (tpl_utf8_next(p + n - k, k, &cp) != k || !tpl_is_space(cp)) break;
        n -= k;
    }
    return n;
}

static void emit_data(lx *L, const char *p, size_t n, int line) {
    if (!n) return;
    tpl_tok *t = push(L, TK_DATA, line);
    t->p = p;
    t->n = n;
}

/* Applies the `-` and lstrip_blocks rules to the text before a tag; returns its new length. */
static size_t strip_before(lx *L, const char *text, size_t n, char sign, int is_var) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign == '+' || is_var) return n;
    size_t l_pos = n;
    while (l_pos > 0 && text[l_pos - 1] != '\n')
        l_pos--;
    if (l_pos == 0 && !L->line_starting) return n;
    if (l_pos == n) return n;
    for (size_t i = l_pos; i < n; i++)
        if (text[i] != ' ' && text[i] != '\t') return n;
    return l_pos;
}

/* After an end marker: `-` eats all whitespace, trim_blocks one newline (block/comment ends). */
static void after_end(lx *L, char sign, int trim) {
    size_t st = L->pos;
    if (sign == '-') {
        while (L->pos < L->n && ws(L->s[L->pos]))
            L->pos++;
    } else if (sign != '+' && trim && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
    }
    L->line += count_nl(L->s + st, L->pos - st);
    L->line_starting = L->pos > 0 && L->s[L->pos - 1] == '\n';
}

static const struct {
    const char *s;
    int op;
} ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW},   {"==", OP_EQ},      {"!=", OP_NE},      {">=", OP_GE},
    {"<=", OP_LE},       {"+", OP_ADD},    {"-", OP_SUB},      {"*", OP_MUL},      {"/", OP_DIV},
    {"%", OP_MOD},       {"~", OP_TILDE},  {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN},    {"{", OP_LBRACE}, {"}", OP_RBRACE},   {">", OP_GT},       {"<", OP_LT},
    {"=", OP_ASSIGN},    {".", OP_DOT},    {":", OP_COLON},    {"|", OP_PIPE},     {",", OP_COMMA},
    {";", OP_SEMICOLON},
};

const char *tpl_op_name(int op) {
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op) return ops[i].s;
    return "?";
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal: Python unicode-escape rules for backslashes. */
static void lex_string(lx *L, tpl_tok *t) {
    char q = L->s[L->pos++];
    tpl_buf b = {0};
    while (1) {
        if (L->pos >= L->n) tpl_raise(L->rt, "unexpected end of template in a string literal");
        char c = L->s[L->pos];
        if (c == q) {
            L->pos++;
            break;
        }
        if (c == '\n') L->line++;
        if (c != '\\' || L->pos + 1 >= L->n) {
            tpl_buf_putc(L->rt, &b, c);
            L->pos++;
            continue;
        }
        char e = L->s[L->pos + 1];
        L->pos += 2;
        const char *simple = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
        const char *m = NULL;
        for (const char *k = simple; *k; k += 2)
            if (*k == e) m = k;
        if (m) {
            tpl_buf_putc(L->rt, &b, m[1]);
        } else if (e == '\n') {
            L->line++; /* backslash-newline continues the line */
        } else if (e >= '0' && e <= '7') {
            int v = e - '0', k = 1;
            while (k < 3 && L->pos < L->n && L->s[L->pos] >= '0' && L->s[L->pos] <= '7') {
                v = v * 8 + (L->s[L->pos++] - '0');
                k++;
            }
            char enc[4];
            tpl_buf_put(L->rt, &b, enc, tpl_utf8_put(v, enc));
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            int32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = L->pos < L->n ? hexval(L->s[L->pos]) : -1;
                if (h < 0) tpl_raise(L->rt, "truncated \\%c escape in a string literal", e);
                v = v * 16 + h;
                L->pos++;
            }
            if (v > 0x10ffff) tpl_raise(L->rt, "illegal Unicode character in a string literal");
            char enc[4];
            tpl_buf_put(L->rt, &b, enc, tpl_utf8_put(v, enc));
        } else {
            tpl_buf_putc(L->rt, &b, '\\'); /* unknown escapes stay as written */
            tpl_buf_putc(L->rt, &b, e);
        }
    }
    t->p = b.p ? b.p : "";
    t->n = b.n;
}

static int isdig(char c) {
    return c >= '0' && c <= '9';
}
static int isname0(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Digits with single underscores between them; returns the end position (start if none). */
static size_t digits_end(const char *s, size_t n, size_t i) {
    if (i >= n || !isdig(s[i])) return i;
    while (i < n && (isdig(s[i]) || (s[i] == '_' && i + 1 < n && isdig(s[i + 1]))))
        i++;
    return i;
}

static void lex_number(lx *L, tpl_tok *t) {
    size_t st = L->pos, i = digits_end(L->s, L->n, st), end = i;
    int is_float = 0;
    int after_dot = st > 0 && L->s[st - 1] == '.'; /* "a.0.1" is two subscripts, no float */
    if (!after_dot) {
        size_t j = i;
        if (j < L->n && L->s[j] == '.' && digits_end(L->s, L->n, j + 1) > j + 1) {
            j = digits_end(L->s, L->n, j + 1);
            is_float = 1;
            end = j;
        }
        if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
            size_t k = j + 1;
            if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
            size_t e = digits_end(L->s, L->n, k);
            if (e > k) {
                is_float = 1;
                end = e;
            }
        }
    }
    char tmp[128];
    size_t m = 0;
    for (size_t k = st; k < end && m < sizeof tmp - 1; k++)
        if (L->s[k] != '_') tmp[m++] = L->s[k];
    tmp[m] = 0;
    L->pos = end;
    if (is_float) {
        t->kind = TK_FLOAT;
        t->f = strtod(tmp, NULL);
        return;
    }
    t->kind = TK_INT;
    int64_t v = 0;
    for (size_t k = 0; k < m; k++) {
        if (v > (INT64_MAX - (tmp[k] - '0')) / 10) tpl_raise(L->rt, "integer literal too large");
        v = v * 10 + (tmp[k] - '0');
    }
    t->i = v;
}

/* Tokens inside {{ }} or {% %} up to and including the end marker. */
static void lex_tag(lx *L, int is_var) {
    int start_line = L->line;
    while (1) {
        while (L->pos < L->n && ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n) {
            L->rt->line = start_line;
            tpl_raise(L->rt, "unexpected end of template, expected '%s'", is_var ? "}}" : "%}");
        }
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        char close = is_var ? '}' : '%';
        char sign = 0;
        size_t mk = 0;
        if (left >= 2 && p[0] == close && p[1] == '}')
            mk = 2;
        else if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}' &&
                 !(is_var && p[0] == '+')) {
            sign = p[0];
            mk = 3;
        }
        if (mk) {
            push(L, is_var ? TK_VAR_END : TK_BLOCK_END, L->line);
            L->pos += mk;
            after_end(L, sign, !is_var);
            return;
        }
        tpl_tok *t = push(L, TK_OP, L->line);
        char c = *p;
        if (c == '\'' || c == '"') {
            t->kind = TK_STRING;
            lex_string(L, t);
        } else if (isdig(c)) {
            lex_number(L, t);
        } else if (isname0(c)) {
            size_t i = 1;
            while (i < left && (isname0(p[i]) || isdig(p[i])))
                i++;
            t->kind = TK_NAME;
            t->p = p;
            t->n = i;
            L->pos += i;
        } else {
            size_t k;
            for (k = 0; k < sizeof ops / sizeof ops[0]; k++) {
                size_t m = strlen(ops[k].s);
                if (m <= left && !memcmp(p, ops[k].s, m)) {
                    t->op = ops[k].op;
                    L->pos += m;
                    break;
                }
            }
            if (k == sizeof ops / sizeof ops[0]) {
                L->rt->line = L->line;
                tpl_raise(L->rt, "unexpected character '%c' in tag", c);
            }
        }
    }
}

/* {% raw %} ... {% endraw %}: the body is literal text. pos is just after the raw tag. */
static void lex_raw(lx *L, int line) {
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        size_t j = i + 2;
        char sign = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) sign = L->s[j++];
        while (j < L->n && ws(L->s[j]))
            j++;
        if (L->n - j < 6 || memcmp(L->s + j, "endraw", 6)) continue;
        j += 6;
        while (j < L->n && ws(L->s[j]))
            j++;
        char esign = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) esign = L->s[j++];
        if (L->n - j < 2 || L->s[j] != '%' || L->s[j + 1] != '}') continue;
        const char *text = L->s + L->pos;
        size_t tn = strip_before(L, text, i - L->pos, sign, 0);
        emit_data(L, text, tn, line);
        L->line += count_nl(L->s + L->pos, j + 2 - L->pos);
        L->pos = j + 2;
        after_end(L, esign, 1);
        return;
    }
    L->rt->line = line;
    tpl_raise(L->rt, "missing end of raw directive");
}

/* If a {% raw %} tag starts at i (just after "{%" and an optional sign), returns its length up to
 * and including "%}" and sets *sign to the closing modifier; else 0. */
static size_t raw_tag(const lx *L, size_t i, char *sign) {
    size_t j = i;
    while (j < L->n && ws(L->s[j]))
        j++;
    if (L->n - j < 3 || memcmp(L->s + j, "raw", 3)) return 0;
    j += 3;
    if (j < L->n && (isname0(L->s[j]) || isdig(L->s[j]))) return 0;
    while (j < L->n && ws(L->s[j]))
        j++;
    *sign = 0;
    if (j < L->n && L->s[j] == '-') *sign = L->s[j++];
    if (L->n - j < 2 || L->s[j] != '%' || L->s[j + 1] != '}') return 0;
    return j + 2 - i;
}

void tpl_lex(tpl_rt *rt, const char *src, size_t len, tpl_tok **toks, size_t *ntoks) {
    /* Newlines become "\n" and one trailing newline goes (keep_trailing_newline=False). */
    char *s = tpl_alloc(rt, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    lx L = {.rt = rt, .s = s, .n = n, .line = 1, .line_starting = 1};
    while (L.pos < L.n) {
        size_t t = L.pos;
        while (t + 1 < L.n &&
               !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')))
            t++;
        if (t + 1 >= L.n) {
            emit_data(&L, s + L.pos, L.n - L.pos, L.line);
            break;
        }
        char kind = s[t + 1];
        char sign = t + 2 < L.n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        size_t tn = strip_before(&L, s + L.pos, t - L.pos, sign, kind == '{');
        emit_data(&L, s + L.pos, tn, L.line);
        L.line += count_nl(s + L.pos, t - L.pos);
        int tag_line = L.line;
        L.pos = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = L.pos;
            while (e + 1 < L.n && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= L.n) {
                rt->line = tag_line;
                tpl_raise(rt, "missing end of comment tag");
            }
            char esign = e > L.pos && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            L.line += count_nl(s + L.pos, e - L.pos);
            L.pos = e + 2;
            after_end(&L, esign, 1);
            continue;
        }
        char rsign;
        size_t rl = kind == '%' ? raw_tag(&L, L.pos, &rsign) : 0;
        if (rl) {
            L.line += count_nl(s + L.pos, rl);
            L.pos += rl;
            if (rsign == '-')
                after_end(&L, '-', 0);
            else
                L.line_starting = 0;
            lex_raw(&L, tag_line);
            continue;
        }
        push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, tag_line);
        lex_tag(&L, kind == '{');
    }
    push(&L, TK_EOF, L.line);
    *toks = L.t;
    *ntoks = L.nt;
}
