/* Token tables per terminal state: what a configuration inside DFA state s allows whatever its
 * stack. `inner` holds the tokens that keep it inside its terminal (allowed); `bnd` the tokens
 * that leave the terminal (allowed or not depending on what the stack lets follow: the mask
 * checks them one by one); a state where leaving takes too many tokens (whitespace, before
 * anything) is `big`, and the mask walks the trie for it instead.
 *
 * Tables depend on the DFA reachable from s and on the vocabulary only, so the store below
 * (one per trie, shared by every matcher and every grammar over that vocabulary) keys them by
 * that DFA's shape: every request's JSON string body, number and punctuation share one table,
 * computed once per process. */
#ifndef LILY_GRAMMAR_TERMTAB_H
#define LILY_GRAMMAR_TERMTAB_H

#include <stdint.h>

#include "grammar/grammar.h"
#include "grammar/trie.h"

typedef struct lily_term_tab {
    int big;
    uint32_t *inner; /* [mask words] */
    int32_t *bnd;    /* [n_bnd] */
    uint16_t *exit;  /* [n_bnd] bytes up to a forced exit from the terminal (the first accepting
                      * state on the token's path has no edges), 0 when the exit point varies */
    int32_t n_bnd, cap_bnd;
} lily_term_tab;

/* Boundary tokens above this make a state big. */
#define LILY_TERM_BND_MAX 16384

/* Fills tab (inner allocated if NULL) for state s of g over t; ds and acc are scratch of
 * t->max_depth + 1 entries. */
void lily_term_tab_fill(lily_term_tab *tab, const lily_grammar *g, const lily_token_trie *t,
                        int32_t s, int32_t *ds, uint8_t *acc);
void lily_term_tab_release(lily_term_tab *tab); /* frees the arrays */

lily_term_store *lily_term_store_new(void);
void lily_term_store_free(lily_term_store *st);

/* The stored table for the shape of state s of g, computed and stored if absent. NULL when s
 * reaches too many states to key, or the store is full: the caller then fills its own.
 * Thread-safe; a returned table is immutable and lives as long as the store. */
const lily_term_tab *lily_term_store_get(lily_term_store *st, const lily_grammar *g,
                                         const lily_token_trie *t, int32_t s);

#endif
