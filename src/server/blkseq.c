/* Output blocks in sequence (see blkseq.h). */
#include "server/blkseq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static lily_blk *grow(lily_blk **arr, int *n, int *cap) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 4;
        *arr = lily_xrealloc(*arr, (size_t)*cap * sizeof **arr);
    }
    lily_blk *b = &(*arr)[(*n)++];
    memset(b, 0, sizeof *b);
    return b;
}

static void close_open(lily_blkseq *q, const lily_blkseq_cb *cb, lily_sb *o) {
    if (!q->open) return;
    q->open = 0;
    if (cb && cb->stop) cb->stop(cb->ud, q->n - 1, &q->b[q->n - 1], o);
}

static lily_blk *open_block(lily_blkseq *q, lily_delta_kind kind, const lily_delta *call,
                            const lily_blkseq_cb *cb, lily_sb *o) {
    close_open(q, cb, o);
    lily_blk *b = grow(&q->b, &q->n, &q->cap);
    b->kind = kind;
    if (call) {
        snprintf(b->call_id, sizeof b->call_id, "%s", call->id);
        lily_sb_append(&b->name, lily_sb_str(&call->text), call->text.len);
    }
    q->open = 1;
    if (cb && cb->start) cb->start(cb->ud, q->n - 1, b, o);
    return b;
}

static void add_text(lily_blkseq *q, lily_delta_kind kind, const char *t, size_t n,
                     const lily_blkseq_cb *cb, lily_sb *o) {
    lily_blk *last = q->n ? &q->b[q->n - 1] : NULL;
    if (!last || !q->open || last->kind != kind) last = open_block(q, kind, NULL, cb, o);
    lily_sb_append(&last->text, t, n);
    if (cb && cb->delta && n) cb->delta(cb->ud, q->n - 1, last, t, n, o);
}

static void release_held(lily_blkseq *q, const lily_blkseq_cb *cb, lily_sb *o) {
    for (int i = 0; i < q->n_held; i++) {
        add_text(q, q->held[i].kind, lily_sb_str(&q->held[i].text), q->held[i].text.len, cb, o);
        lily_sb_free(&q->held[i].text);
    }
    q->n_held = 0;
}

void lily_blkseq_delta(lily_blkseq *q, const lily_delta *d, const lily_blkseq_cb *cb, lily_sb *o) {
    lily_blk *last = q->n ? &q->b[q->n - 1] : NULL;
    int in_call = last && q->open && last->kind == LILY_DELTA_CALL;
    switch (d->kind) {
    case LILY_DELTA_CALL:
        release_held(q, cb, o);
        open_block(q, LILY_DELTA_CALL, d, cb, o);
        break;
    case LILY_DELTA_ARGS:
        if (in_call) {
            lily_sb_append(&last->text, lily_sb_str(&d->text), d->text.len);
            if (cb && cb->delta && d->text.len)
                cb->delta(cb->ud, q->n - 1, last, lily_sb_str(&d->text), d->text.len, o);
        }
        break;
    case LILY_DELTA_REASONING:
    case LILY_DELTA_CONTENT:
        if (!d->text.len) break;
        if (in_call) {
            lily_blk *h = q->n_held ? &q->held[q->n_held - 1] : NULL;
            if (!h || h->kind != d->kind) {
                h = grow(&q->held, &q->n_held, &q->held_cap);
                h->kind = d->kind;
            }
            lily_sb_append(&h->text, lily_sb_str(&d->text), d->text.len);
        } else {
            add_text(q, d->kind, lily_sb_str(&d->text), d->text.len, cb, o);
        }
        break;
    }
}

void lily_blkseq_finish(lily_blkseq *q, const lily_blkseq_cb *cb, lily_sb *o) {
    release_held(q, cb, o);
    close_open(q, cb, o);
}

int lily_blkseq_n_calls(const lily_blkseq *q) {
    int n = 0;
    for (int i = 0; i < q->n; i++)
        n += q->b[i].kind == LILY_DELTA_CALL;
    return n;
}

void lily_blkseq_free(lily_blkseq *q) {
    for (int i = 0; i < q->n; i++) {
        lily_sb_free(&q->b[i].text);
        lily_sb_free(&q->b[i].name);
    }
    for (int i = 0; i < q->n_held; i++)
        lily_sb_free(&q->held[i].text);
    free(q->b);
    free(q->held);
    memset(q, 0, sizeof *q);
}
