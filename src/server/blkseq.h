/* Output blocks in sequence for the APIs whose answers are a list of blocks streamed one after
 * another (Anthropic content blocks, Responses output items): the output parser's deltas
 * (reasoning, content, tool-call headers and argument fragments, which may interleave: a call's
 * closing fragment can come after text) become blocks that open, grow and close strictly in
 * order. Text that arrives while a tool call is the open block is held and becomes the blocks
 * after that call, when the next call starts or at the end. */
#ifndef LILY_SERVER_BLKSEQ_H
#define LILY_SERVER_BLKSEQ_H

#include "gen/outparse.h"
#include "gen/sb.h"

typedef struct lily_blk {
    lily_delta_kind kind; /* REASONING, CONTENT or CALL */
    lily_sb text;         /* the text, or a call's arguments JSON */
    lily_sb name;         /* CALL: the function name */
    char call_id[32];     /* CALL: "call_..." */
} lily_blk;

/* What a stream writes as blocks open, grow and close (any may be NULL; o is the output). */
typedef struct lily_blkseq_cb {
    void *ud;
    void (*start)(void *ud, int index, const lily_blk *b, lily_sb *o);
    void (*delta)(void *ud, int index, const lily_blk *b, const char *text, size_t len, lily_sb *o);
    void (*stop)(void *ud, int index, const lily_blk *b, lily_sb *o);
} lily_blkseq_cb;

typedef struct lily_blkseq {
    lily_blk *b; /* the blocks so far, in order */
    int n, cap;
    int open;       /* the last block is open */
    lily_blk *held; /* text held while a call is open (kind + text only) */
    int n_held, held_cap;
} lily_blkseq;

void lily_blkseq_delta(lily_blkseq *q, const lily_delta *d, const lily_blkseq_cb *cb, lily_sb *o);
/* The end of output: releases held text and closes the open block. */
void lily_blkseq_finish(lily_blkseq *q, const lily_blkseq_cb *cb, lily_sb *o);
int lily_blkseq_n_calls(const lily_blkseq *q);
void lily_blkseq_free(lily_blkseq *q);

#endif
