/* The incremental matcher: where one constrained generation stands in its grammar, and the mask
 * of tokens allowed next.
 *
 * The state is a set of configurations, each a terminal's DFA state plus a stack of return
 * points (rules entered and not finished), and an accept flag (the root rule may end here).
 * Stacks are persistent: nodes {element, DFA state, parent} in a pool, never changed once
 * written, so a step only appends, a configuration shares its stack with its siblings, and
 * going back is resetting the pool's top. That makes the trie walk of lily_gmatch_mask cheap
 * (a depth-first walk that rolls back at each sibling) and makes committed tokens rollable.
 *
 * Use per request, per generation step:
 *     lily_gmatch_mask(m, mask);            // bit i of mask[i / 32]: token i allowed
 *     ... sample a token from the logits with disallowed tokens at -inf ...
 *     lily_gmatch_accept_token(m, tok);     // -1 if tok was not allowed (state unchanged)
 *     if (lily_gmatch_is_finished(m)) ...   // an end token was accepted
 * The pool, the configuration buffer and the mask cache are preallocated and only grow (by
 * doubling) past their high-water mark; nothing is allocated per token in steady state.
 * A matcher is used by one thread at a time; its grammar and trie are shared read-only. */
#ifndef LILY_GRAMMAR_MATCHER_H
#define LILY_GRAMMAR_MATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "grammar/trie.h"
#include "lily.h"

typedef struct lily_gmatch lily_gmatch;

typedef struct lily_gmatch_opts {
    int cache_entries; /* masks remembered by state (LRU); 0 = 64; < 0 = none, and no per-DFA-
                        * state tables either: every mask is a full trie walk (for tests) */
    int max_depth;     /* nesting limit of the stack; 0 = 512 */
} lily_gmatch_opts;

/* Tokens back that lily_gmatch_rollback can always undo. */
#define LILY_GMATCH_ROLLBACK 64

/* A matcher at the start of grammar g over the vocabulary trie t (both borrowed: they must
 * outlive it). opts may be NULL. Free with lily_gmatch_free. */
int lily_gmatch_create(const lily_grammar *g, const lily_token_trie *t,
                       const lily_gmatch_opts *opts, lily_gmatch **out, lily_err *e);
void lily_gmatch_free(lily_gmatch *m);

/* Back to the start of the grammar (the mask cache is kept: it depends on the state only). */
void lily_gmatch_reset(lily_gmatch *m);

/* Makes dst the same state as src (same grammar and trie required; dst's cache is kept). */
void lily_gmatch_copy(lily_gmatch *dst, const lily_gmatch *src);

/* Fills mask[0 .. lily_token_trie_mask_words(t)) with the allowed tokens: text tokens whose
 * bytes the grammar can take next, and the end tokens where the grammar accepts (once
 * finished, only the end tokens). */
void lily_gmatch_mask(lily_gmatch *m, uint32_t *mask);

/* The host sampler's side of a mask: sets logits[i] to -INFINITY for every token the mask
 * (over n_vocab tokens) disallows, and for ids from n_vocab to n_logits (the model's padding
 * rows past the tokenizer's vocabulary). */
void lily_gmatch_apply(const uint32_t *mask, int32_t n_vocab, float *logits, size_t n_logits);

/* Advances by token id: 0 if it was allowed, -1 if not (the state is then unchanged). */
int lily_gmatch_accept_token(lily_gmatch *m, int32_t tok);

/* Advances by raw bytes (not a token step: rollback counts tokens only). 0 or -1 as above. */
int lily_gmatch_accept_bytes(lily_gmatch *m, const void *bytes, size_t n);

/* Undoes the last n accepted tokens; returns how many were undone (fewer when the history is
 * shorter: at least the last LILY_GMATCH_ROLLBACK are kept). */
int lily_gmatch_rollback(lily_gmatch *m, int n);

/* 1 when the text so far is a complete sentence of the grammar (an end token is allowed). */
int lily_gmatch_is_accepting(const lily_gmatch *m);

/* 1 after an end token was accepted. */
int lily_gmatch_is_finished(const lily_gmatch *m);

/* 1 when no token can follow: finished, or accepting with nothing left to extend. */
int lily_gmatch_is_done(const lily_gmatch *m);

typedef struct lily_gmatch_stats {
    uint64_t masks, cache_hits, nodes_walked;
} lily_gmatch_stats;

void lily_gmatch_get_stats(const lily_gmatch *m, lily_gmatch_stats *s);

#endif
