/* Incremental output parser (see outparse.h).
 *
 * Design: unconsumed input sits in `buf`; step() runs the handler of the current state, which
 * either consumes a prefix of buf (producing deltas) or reports that it needs more input. A
 * handler decides only when the bytes it has make the decision final, or at end of output; that
 * is the invariant that makes the result independent of how the output was split. Whitespace
 * trimming (reasoning and content are trimmed at both ends) is done with "pending whitespace"
 * buffers: trailing whitespace is held and released only when more text of the same kind
 * follows. */
#include "gen/outparse.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gen/jsonnorm.h"
#include "gen/toolschema.h"

typedef enum {
    S_REASONING,
    S_CONTENT,
    S_CALL_OPEN,  /* after <tool_call>: whitespace, then <function= or { */
    S_FUNC_NAME,  /* after <function=: name up to > */
    S_FUNC_BODY,  /* between parameters */
    S_PARAM_NAME, /* after <parameter=: name up to > */
    S_PARAM_VALUE,
    S_CALL_END,  /* after </function>: whitespace, then </tool_call> */
    S_JSON_CALL, /* after <tool_call> + {: JSON body up to </tool_call> */
    S_DONE,      /* single_call and the call completed: input is ignored */
} state;

static const char M_THINK[] = "<think>", M_END_THINK[] = "</think>", M_CALL[] = "<tool_call>",
                  M_END_CALL[] = "</tool_call>",
                  M_FUNC[] = "<function=", M_END_FUNC[] = "</function>",
                  M_PARAM[] = "<parameter=", M_END_PARAM[] = "</parameter>";

#define NAME_MAX_LEN 256

struct lily_outparse {
    lily_outparse_opts opts;
    state st;
    state origin; /* the text state a call was opened from (where a failed call's text goes) */
    int eof;
    lily_sb buf;
    lily_delta *deltas;
    size_t n_deltas, cap_deltas;
    /* trimming of reasoning and content */
    int r_started, c_started, any_output;
    lily_sb r_ws, c_ws;
    int implicit_think_end; /* reasoning ended by a tool call: drop a later stray </think> */
    /* the call being parsed */
    lily_sb raw; /* call text before its header is sent (returned as text on failure) */
    int n_calls, call_open, n_params, n_complete;
    const cJSON *params; /* schema of the current function's parameters, or NULL */
    lily_param_kind pkind;
    int value_start; /* the value's leading newline has not been checked yet */
    lily_sb val;     /* non-string value text, converted when it closes */
    lily_sb fb_ws;   /* whitespace between parameters: kept only if stray text follows */
    uint64_t rng;
};

/* ---- deltas --------------------------------------------------------------------------------- */

static lily_delta *new_delta(lily_outparse *p, lily_delta_kind kind, int call) {
    if (p->n_deltas == p->cap_deltas) {
        p->cap_deltas = p->cap_deltas ? p->cap_deltas * 2 : 16;
        p->deltas = lily_xrealloc(p->deltas, p->cap_deltas * sizeof *p->deltas);
    }
    lily_delta *d = &p->deltas[p->n_deltas++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->call = call;
    return d;
}

static void push(lily_outparse *p, lily_delta_kind kind, const char *s, size_t n) {
    if (!n) return;
    int call = p->n_calls - 1;
    lily_delta *last = p->n_deltas ? &p->deltas[p->n_deltas - 1] : NULL;
    if (!last || last->kind != kind || (kind == LILY_DELTA_ARGS && last->call != call))
        last = new_delta(p, kind, kind == LILY_DELTA_ARGS ? call : 0);
    lily_sb_append(&last->text, s, n);
    p->any_output = 1;
}

static void push_str(lily_outparse *p, lily_delta_kind kind, const char *s) {
    push(p, kind, s, strlen(s));
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Emits text of a trimmed kind: leading whitespace of the kind is dropped, trailing whitespace
 * is held until more text of the kind arrives. */
static void emit_text(lily_outparse *p, lily_delta_kind kind, const char *s, size_t n) {
    int *started = kind == LILY_DELTA_REASONING ? &p->r_started : &p->c_started;
    lily_sb *ws = kind == LILY_DELTA_REASONING ? &p->r_ws : &p->c_ws;
    size_t end = n;
    while (end && is_ws(s[end - 1]))
        end--;
    if (!end) {
        if (*started) lily_sb_append(ws, s, n);
        return;
    }
    size_t k = 0;
    if (!*started)
        while (is_ws(s[k]))
            k++;
    push(p, kind, ws->data, ws->len);
    lily_sb_clear(ws);
    push(p, kind, s + k, end - k);
    *started = 1;
    lily_sb_append(ws, s + end, n - end);
}

static lily_delta_kind text_kind(state s) {
    return s == S_REASONING ? LILY_DELTA_REASONING : LILY_DELTA_CONTENT;
}

/* ---- helpers over buf ----------------------------------------------------------------------- */

/* Bytes at the end of s[0..n) that start a UTF-8 sequence not yet complete. */
static size_t utf8_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

typedef enum { M_NONE, M_PARTIAL, M_FULL } match;

/* Does s[0..n) start with marker m (FULL), or is all of it a proper prefix of m (PARTIAL)? */
static match starts(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    if (n >= k) return memcmp(s, m, k) ? M_NONE : M_FULL;
    return memcmp(s, m, n) ? M_NONE : M_PARTIAL;
}

/* Finds the first position in s[0..n) where one of the markers starts fully or (at the end of
 * s) partially. Returns the position (n when none), and sets *which (-1 for a partial match). */
static size_t find_markers(const char *s, size_t n, const char *const *ms, int nm, int *which) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        int partial = 0;
        for (int k = 0; k < nm; k++) {
            match r = starts(s + i, n - i, ms[k]);
            if (r == M_FULL) {
                *which = k;
                return i;
            }
            if (r == M_PARTIAL) partial = 1;
        }
        if (partial) {
            *which = -1;
            return i;
        }
    }
    *which = -1;
    return n;
}

static void consume(lily_outparse *p, size_t n) {
    lily_sb_drop_front(&p->buf, n);
}

/* ---- calls ---------------------------------------------------------------------------------- */

static void start_call(lily_outparse *p, const char *marker, state next) {
    p->origin = p->st == S_REASONING ? S_REASONING : S_CONTENT;
    lily_sb_clear(&p->raw);
    lily_sb_puts(&p->raw, marker);
    p->st = next;
}

/* The call could not be interpreted: its text goes back to where it came from. */
static void fail_call(lily_outparse *p) {
    p->st = p->origin;
    emit_text(p, text_kind(p->st), p->raw.data, p->raw.len);
    lily_sb_clear(&p->raw);
}

static void make_id(lily_outparse *p, char *id) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(id, "call_", 5);
    for (int i = 0; i < 24; i++) {
        uint64_t z = (p->rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        id[5 + i] = alnum[z % 62];
    }
    id[29] = 0;
}

static void open_call(lily_outparse *p, const char *name, size_t n) {
    if (p->origin == S_REASONING) {
        lily_sb_clear(&p->r_ws);
        p->implicit_think_end = 1;
    }
    p->n_calls++;
    lily_delta *d = new_delta(p, LILY_DELTA_CALL, p->n_calls - 1);
    make_id(p, d->id);
    lily_sb_append(&d->text, name, n);
    p->any_output = 1;
    p->params = lily_tool_params(p->opts.tool_defs, d->text.data);
    p->call_open = 1;
    p->n_params = 0;
    lily_sb_clear(&p->raw);
}

static void close_args(lily_outparse *p) {
    if (!p->call_open) return;
    push_str(p, LILY_DELTA_ARGS, p->n_params ? "}" : "{}");
    p->call_open = 0;
}

static void finish_call(lily_outparse *p) {
    close_args(p);
    p->n_complete++;
    p->st = p->opts.single_call ? S_DONE : S_CONTENT;
}

/* ---- state handlers: each returns 1 when it made progress, 0 when it needs more input ------- */

/* At the very start of reasoning (or of the whole output, in content) a `<think>` tag, possibly
 * after whitespace, is skipped (reasoning) or opens the reasoning block (content). Returns 1 when
 * it consumed something, 0 when the start is not a <think>, -1 when more input is needed. */
static int think_at_start(lily_outparse *p) {
    const char *s = p->buf.data;
    size_t n = p->buf.len, w = 0;
    while (w < n && is_ws(s[w]))
        w++;
    match r = starts(s + w, n - w, M_THINK);
    if (r == M_FULL) {
        consume(p, w + strlen(M_THINK));
        p->st = S_REASONING;
        p->r_started = 0;
        return 1;
    }
    if (r == M_PARTIAL && !p->eof) return -1; /* also covers "all whitespace so far" */
    return 0;
}

static int h_text(lily_outparse *p) {
    const char *ms[4];
    int nm = 0;
    int reasoning = p->st == S_REASONING;
    if (reasoning ? !p->r_started : !p->any_output) {
        int t = think_at_start(p);
        if (t) return t > 0;
    }
    if (reasoning) {
        ms[nm++] = M_END_THINK;
    } else if (p->implicit_think_end) {
        ms[nm++] = M_END_THINK;
    }
    if (p->opts.tools) {
        ms[nm++] = M_CALL;
        ms[nm++] = M_FUNC;
    }
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    int which;
    size_t at = find_markers(s, n, ms, nm, &which);
    if (which < 0) {
        size_t keep = at < n ? n - at : utf8_tail(s, n);
        if (p->eof) keep = 0;
        if (n - keep == 0) return 0;
        emit_text(p, text_kind(p->st), s, n - keep);
        consume(p, n - keep);
        return 1;
    }
    const char *m = ms[which];
    emit_text(p, text_kind(p->st), s, at);
    consume(p, at + strlen(m));
    if (m == M_END_THINK) {
        if (reasoning) {
            lily_sb_clear(&p->r_ws);
            p->st = S_CONTENT;
        }
        p->implicit_think_end = 0; /* content: a stray close after a call is dropped once */
    } else {
        start_call(p, m, m == M_CALL ? S_CALL_OPEN : S_FUNC_NAME);
    }
    return 1;
}

/* Leading whitespace of a markup state goes to raw (in case the call fails) and is dropped. */
static int skip_ws(lily_outparse *p, int to_raw) {
    size_t k = 0;
    while (k < p->buf.len && is_ws(p->buf.data[k]))
        k++;
    if (to_raw) lily_sb_append(&p->raw, p->buf.data, k);
    consume(p, k);
    return k > 0;
}

static int h_call_open(lily_outparse *p) {
    int moved = skip_ws(p, 1);
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    if (!n) {
        if (!p->eof) return moved;
        fail_call(p);
        return 1;
    }
    if (s[0] == '{') {
        p->st = S_JSON_CALL;
        return 1;
    }
    match r = starts(s, n, M_FUNC);
    if (r == M_FULL) {
        lily_sb_puts(&p->raw, M_FUNC);
        consume(p, strlen(M_FUNC));
        p->st = S_FUNC_NAME;
        return 1;
    }
    if (r == M_PARTIAL && !p->eof) return moved;
    fail_call(p);
    return 1;
}

/* Scans a NAME> header. Returns the length of the name (index of '>'), -1 when it cannot be a
 * name, -2 when more input is needed. */
static long scan_name(const lily_outparse *p) {
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '>') return (long)i;
        if (s[i] == '\n' || s[i] == '<' || i >= NAME_MAX_LEN) return -1;
    }
    return p->eof ? -1 : -2;
}

static void trimmed(const char *s, size_t n, const char **ts, size_t *tn) {
    while (n && is_ws(*s))
        s++, n--;
    while (n && is_ws(s[n - 1]))
        n--;
    *ts = s;
    *tn = n;
}

static int h_func_name(lily_outparse *p) {
    long k = scan_name(p);
    if (k == -2) return 0;
    const char *name;
    size_t len = 0;
    if (k >= 0) trimmed(p->buf.data, (size_t)k, &name, &len);
    if (k < 0 || !len) {
        fail_call(p);
        return 1;
    }
    open_call(p, name, len);
    consume(p, (size_t)k + 1);
    p->st = S_FUNC_BODY;
    return 1;
}

static int h_func_body(lily_outparse *p) {
    static const char *const ms[] = {M_PARAM, M_END_FUNC, M_END_CALL, M_CALL, M_FUNC};
    size_t w = 0;
    while (w < p->buf.len && is_ws(p->buf.data[w]))
        w++;
    lily_sb_append(&p->fb_ws, p->buf.data, w);
    consume(p, w);
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    if (!n) return w > 0;
    int which;
    size_t at = find_markers(s, n, ms, 5, &which);
    if (at > 0 || (which < 0 && p->eof)) {
        /* Stray text inside a call: keep it as content rather than lose it. Its trailing
         * whitespace is left for the next round (fb_ws), so splits do not matter. */
        size_t take = at > 0 ? at : 1;
        if (at == n && !p->eof) take -= utf8_tail(s, n);
        while (take && is_ws(s[take - 1]))
            take--;
        if (!take) return w > 0;
        emit_text(p, LILY_DELTA_CONTENT, p->fb_ws.data, p->fb_ws.len);
        lily_sb_clear(&p->fb_ws);
        emit_text(p, LILY_DELTA_CONTENT, s, take);
        consume(p, take);
        return 1;
    }
    if (which < 0) return w > 0; /* a marker may be starting */
    const char *m = ms[which];
    lily_sb_clear(&p->fb_ws);
    consume(p, strlen(m));
    if (m == M_PARAM) {
        p->st = S_PARAM_NAME;
    } else if (m == M_END_FUNC) {
        close_args(p);
        p->st = S_CALL_END;
    } else if (m == M_END_CALL) {
        finish_call(p);
    } else {
        finish_call(p);
        if (p->st != S_DONE) start_call(p, m, m == M_CALL ? S_CALL_OPEN : S_FUNC_NAME);
    }
    return 1;
}

static int h_param_name(lily_outparse *p) {
    long k = scan_name(p);
    if (k == -2) return 0;
    const char *name;
    size_t len = 0;
    if (k >= 0) trimmed(p->buf.data, (size_t)k, &name, &len);
    if (k < 0 || !len) {
        emit_text(p, LILY_DELTA_CONTENT, M_PARAM, strlen(M_PARAM));
        p->st = S_FUNC_BODY;
        return 1;
    }
    lily_sb key = {0};
    lily_sb_append(&key, name, len);
    lily_sb frag = {0};
    lily_sb_puts(&frag, p->n_params ? ", " : "{");
    lily_sb_json_str(&frag, key.data, key.len);
    lily_sb_puts(&frag, ": ");
    p->pkind = lily_param_kind_of(p->params, key.data);
    if (p->pkind == LILY_PARAM_STRING) lily_sb_putc(&frag, '"');
    push(p, LILY_DELTA_ARGS, frag.data, frag.len);
    lily_sb_free(&frag);
    lily_sb_free(&key);
    p->n_params++;
    consume(p, (size_t)k + 1);
    lily_sb_clear(&p->val);
    p->value_start = 1;
    p->st = S_PARAM_VALUE;
    return 1;
}

/* Is s[0..n) the close of a parameter value: optional "\n", "</parameter>", whitespace, then
 * <parameter=, </function> or </tool_call> (or the end of output)? On M_FULL *len is the length
 * up to the following marker. */
static match close_at(const char *s, size_t n, int eof, size_t *len) {
    static const char *const follow[] = {M_PARAM, M_END_FUNC, M_END_CALL};
    size_t k = (n && s[0] == '\n') ? 1 : 0;
    match r = starts(s + k, n - k, M_END_PARAM);
    if (r != M_FULL) return (r == M_PARTIAL && !eof) ? M_PARTIAL : M_NONE;
    k += strlen(M_END_PARAM);
    while (k < n && is_ws(s[k]))
        k++;
    *len = k;
    if (k == n) return eof ? M_FULL : M_PARTIAL;
    for (int i = 0; i < 3; i++) {
        match f = starts(s + k, n - k, follow[i]);
        if (f == M_FULL || (f == M_PARTIAL && eof)) return M_FULL;
        if (f == M_PARTIAL) return M_PARTIAL;
    }
    return M_NONE;
}

static void value_text(lily_outparse *p, const char *s, size_t n) {
    if (!n) return;
    if (p->pkind == LILY_PARAM_STRING) {
        lily_sb esc = {0};
        lily_sb_json_esc(&esc, s, n);
        push(p, LILY_DELTA_ARGS, esc.data, esc.len);
        lily_sb_free(&esc);
    } else {
        lily_sb_append(&p->val, s, n);
    }
}

static void close_value(lily_outparse *p) {
    if (p->pkind == LILY_PARAM_STRING) {
        push_str(p, LILY_DELTA_ARGS, "\"");
    } else {
        lily_sb conv = {0};
        lily_param_convert(p->pkind, p->val.data ? p->val.data : "", p->val.len, &conv);
        push(p, LILY_DELTA_ARGS, conv.data, conv.len);
        lily_sb_free(&conv);
    }
    lily_sb_clear(&p->val);
}

static int h_param_value(lily_outparse *p) {
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    if (p->value_start) {
        if (!n && !p->eof) return 0;
        p->value_start = 0;
        if (n && s[0] == '\n') consume(p, 1);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\n' && s[i] != '<') continue;
        size_t len = 0;
        match r = close_at(s + i, n - i, p->eof, &len);
        if (r == M_NONE) continue;
        value_text(p, s, i);
        if (r == M_FULL) {
            close_value(p);
            p->st = S_FUNC_BODY;
            consume(p, i + len);
            return 1;
        }
        consume(p, i);
        return i > 0;
    }
    size_t keep = p->eof ? 0 : utf8_tail(s, n);
    value_text(p, s, n - keep);
    consume(p, n - keep);
    if (p->eof) { /* cut off inside the value: close it so the arguments stay valid JSON */
        close_value(p);
        close_args(p);
        p->st = S_CONTENT;
        return 1;
    }
    return n - keep > 0;
}

static int h_call_end(lily_outparse *p) {
    static const char *const ms[] = {M_END_CALL, M_CALL, M_FUNC};
    int moved = skip_ws(p, 0);
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    if (!n) {
        if (!p->eof) return moved;
        finish_call(p);
        return 1;
    }
    for (int i = 0; i < 3; i++) {
        match r = starts(s, n, ms[i]);
        if (r == M_PARTIAL && !p->eof) return moved;
        if (r != M_FULL) continue;
        consume(p, strlen(ms[i]));
        finish_call(p);
        if (i > 0 && p->st != S_DONE) start_call(p, ms[i], i == 1 ? S_CALL_OPEN : S_FUNC_NAME);
        return 1;
    }
    finish_call(p); /* no </tool_call>: the call is complete anyway; the text is content */
    return 1;
}

/* The Qwen3 JSON form: {"name": ..., "arguments": {...}} up to </tool_call>. */
static int h_json_call(lily_outparse *p) {
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    const char *end = memmem(s, n, M_END_CALL, strlen(M_END_CALL));
    if (!end && !p->eof) return 0;
    size_t body = end ? (size_t)(end - s) : n;
    cJSON *j = cJSON_ParseWithLength(s, body);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    lily_sb norm = {0};
    int ok = cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0];
    if (ok && cJSON_IsString(args)) {
        ok = !lily_json_normalize(args->valuestring, strlen(args->valuestring), 0, &norm);
    } else if (ok && (cJSON_IsObject(args) || cJSON_IsArray(args))) {
        char *txt = cJSON_PrintUnformatted(args);
        ok = txt && !lily_json_normalize(txt, strlen(txt), 0, &norm);
        free(txt);
    } else if (ok && (!args || cJSON_IsNull(args))) {
        lily_sb_puts(&norm, "{}");
    } else {
        ok = 0;
    }
    size_t used = end ? body + strlen(M_END_CALL) : n;
    if (ok) {
        open_call(p, name->valuestring, strlen(name->valuestring));
        push(p, LILY_DELTA_ARGS, norm.data, norm.len);
        p->call_open = 0;
        p->n_complete++;
        p->st = p->opts.single_call ? S_DONE : S_CONTENT;
    } else {
        lily_sb_append(&p->raw, s, used);
        fail_call(p);
    }
    consume(p, used);
    lily_sb_free(&norm);
    cJSON_Delete(j);
    return 1;
}

static int step(lily_outparse *p) {
    switch (p->st) {
    case S_REASONING:
    case S_CONTENT: return h_text(p);
    case S_CALL_OPEN: return h_call_open(p);
    case S_FUNC_NAME: return h_func_name(p);
    case S_FUNC_BODY: return h_func_body(p);
    case S_PARAM_NAME: return h_param_name(p);
    case S_PARAM_VALUE: return h_param_value(p);
    case S_CALL_END: return h_call_end(p);
    case S_JSON_CALL: return h_json_call(p);
    case S_DONE: consume(p, p->buf.len); return 0;
    }
    return 0;
}

/* ---- public --------------------------------------------------------------------------------- */

lily_outparse *lily_outparse_create(const lily_outparse_opts *opts) {
    lily_outparse *p = lily_xcalloc(1, sizeof *p);
    p->opts = *opts;
    p->st = opts->thinking ? S_REASONING : S_CONTENT;
    p->rng = opts->id_seed;
    return p;
}

void lily_outparse_free(lily_outparse *p) {
    if (!p) return;
    lily_outparse_clear(p);
    free(p->deltas);
    lily_sb_free(&p->buf);
    lily_sb_free(&p->r_ws);
    lily_sb_free(&p->c_ws);
    lily_sb_free(&p->raw);
    lily_sb_free(&p->val);
    lily_sb_free(&p->fb_ws);
    free(p);
}

void lily_outparse_feed(lily_outparse *p, const char *text, size_t len) {
    if (p->eof || p->st == S_DONE) return;
    lily_sb_append(&p->buf, text, len);
    while (p->buf.len && step(p)) {}
}

void lily_outparse_finish(lily_outparse *p) {
    if (p->eof) return;
    p->eof = 1;
    /* each handler consumes at least one byte or changes state at eof; the bound is a guard */
    for (int guard = 0; guard < 1000000 && p->st != S_DONE; guard++) {
        if (p->buf.len) {
            step(p);
            continue;
        }
        if (p->st == S_REASONING || p->st == S_CONTENT) break;
        if (p->st == S_PARAM_VALUE) {
            p->value_start = 0;
            close_value(p);
            close_args(p);
        } else if (p->st == S_CALL_OPEN || p->st == S_FUNC_NAME || p->st == S_JSON_CALL) {
            fail_call(p);
            continue;
        } else if (p->st == S_PARAM_NAME) {
            emit_text(p, LILY_DELTA_CONTENT, M_PARAM, strlen(M_PARAM));
            close_args(p);
        } else {
            close_args(p);
        }
        p->st = S_CONTENT;
    }
    lily_sb_clear(&p->r_ws);
    lily_sb_clear(&p->c_ws);
    lily_sb_clear(&p->fb_ws);
}

const lily_delta *lily_outparse_deltas(const lily_outparse *p, size_t *n) {
    *n = p->n_deltas;
    return p->deltas;
}

void lily_outparse_clear(lily_outparse *p) {
    for (size_t i = 0; i < p->n_deltas; i++)
        lily_sb_free(&p->deltas[i].text);
    p->n_deltas = 0;
}

int lily_outparse_in_reasoning(const lily_outparse *p) {
    return p->st == S_REASONING;
}
int lily_outparse_n_calls(const lily_outparse *p) {
    return p->n_calls;
}
int lily_outparse_in_call(const lily_outparse *p) {
    return p->call_open;
}
int lily_outparse_done(const lily_outparse *p) {
    return p->st == S_DONE;
}

void lily_outmsg_add(lily_outmsg *m, const lily_delta *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const lily_delta *x = &d[i];
        if (x->kind == LILY_DELTA_REASONING) {
            lily_sb_append(&m->reasoning, x->text.data, x->text.len);
        } else if (x->kind == LILY_DELTA_CONTENT) {
            lily_sb_append(&m->content, x->text.data, x->text.len);
        } else if (x->kind == LILY_DELTA_CALL) {
            m->calls = lily_xrealloc(m->calls, (size_t)(m->n_calls + 1) * sizeof *m->calls);
            lily_outcall *c = &m->calls[m->n_calls++];
            memset(c, 0, sizeof *c);
            memcpy(c->id, x->id, sizeof c->id);
            lily_sb_append(&c->name, x->text.data, x->text.len);
        } else if (x->call >= 0 && x->call < m->n_calls) {
            lily_sb_append(&m->calls[x->call].args, x->text.data, x->text.len);
        }
    }
}

void lily_outmsg_free(lily_outmsg *m) {
    lily_sb_free(&m->reasoning);
    lily_sb_free(&m->content);
    for (int i = 0; i < m->n_calls; i++) {
        lily_sb_free(&m->calls[i].name);
        lily_sb_free(&m->calls[i].args);
    }
    free(m->calls);
    memset(m, 0, sizeof *m);
}
