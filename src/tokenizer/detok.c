/* Streaming detokenizer (see detok.h). */
#include "tokenizer/detok.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

struct lily_detok {
    const lily_tokenizer *tok;
    unsigned char held[4]; /* an incomplete UTF-8 sequence (at most 3 bytes) */
    size_t n_held;
    lily_u8buf in, out; /* scratch reused across calls */
};

int lily_detok_create(const lily_tokenizer *tok, lily_detok **out, lily_err *e) {
    if (!tok) return lily_fail(e, "detokenizer needs a tokenizer");
    *out = lily_xcalloc(1, sizeof **out);
    (*out)->tok = tok;
    return 0;
}

int lily_detok_push(lily_detok *d, int32_t id, const char **text, size_t *len, lily_err *e) {
    *text = "";
    *len = 0;
    int32_t n = lily_tokenizer_vocab_size(d->tok);
    if (id < 0 || id >= n)
        return lily_fail(e, "token id %d is out of range [0, %d)", (int)id, (int)n);
    size_t k;
    const char *b = lily_tokenizer_token_bytes(d->tok, id, &k);
    d->in.n = d->out.n = 0;
    lily_u8buf_put(&d->in, d->held, d->n_held);
    if (b) lily_u8buf_put(&d->in, b, k);
    size_t used = lily_utf8_lossy(d->in.p, d->in.n, 0, &d->out);
    d->n_held = d->in.n - used; /* lossy leaves only a valid incomplete prefix: < 4 bytes */
    if (d->n_held) memcpy(d->held, d->in.p + used, d->n_held);
    *text = d->out.n ? (const char *)d->out.p : "";
    *len = d->out.n;
    return 0;
}

void lily_detok_flush(lily_detok *d, const char **text, size_t *len) {
    d->out.n = 0;
    lily_utf8_lossy(d->held, d->n_held, 1, &d->out);
    d->n_held = 0;
    *text = d->out.n ? (const char *)d->out.p : "";
    *len = d->out.n;
}

void lily_detok_reset(lily_detok *d) {
    d->n_held = 0;
}

void lily_detok_free(lily_detok *d) {
    if (!d) return;
    lily_u8buf_free(&d->in);
    lily_u8buf_free(&d->out);
    free(d);
}
