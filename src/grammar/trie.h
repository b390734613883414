/* The vocabulary as a byte trie, built once per tokenizer and shared read-only by every matcher.
 *
 * Nodes are stored in preorder: node i has byte[i] at depth[i] (1 = a token's first byte), and
 * its subtree ends before end[i], so a walk that finds a prefix dead jumps to end[i]. The tokens
 * whose bytes end at node i are ids[tok_lo[i] .. tok_lo[i] + tok_n[i]).
 *
 * Only text tokens are in the trie. Added tokens (<|im_end|>, <think>, ...) and ids without
 * bytes are not: a grammar never produces them as text. The end tokens given at creation are
 * the exception the matcher knows of: allowed exactly where the grammar accepts. */
#ifndef LILY_GRAMMAR_TRIE_H
#define LILY_GRAMMAR_TRIE_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "tokenizer/tokenizer.h"

typedef struct lily_term_store lily_term_store; /* termtab.h */

enum { LILY_TOK_NONE = 0, LILY_TOK_TEXT = 1, LILY_TOK_END = 2 };

typedef struct lily_token_trie {
    int32_t n_vocab; /* ids 0 .. n_vocab - 1; a mask has (n_vocab + 31) / 32 words */
    int32_t n_nodes;
    uint8_t *byte;       /* [n_nodes] */
    uint16_t *depth;     /* [n_nodes] */
    int32_t *end;        /* [n_nodes] */
    int32_t *tok_lo;     /* [n_nodes] */
    int32_t *tok_n;      /* [n_nodes] */
    int32_t *ids;        /* [n_vocab] text tokens in trie order */
    int32_t max_depth;   /* longest text token, in bytes */
    uint8_t *kind;       /* [n_vocab] LILY_TOK_* */
    uint32_t *off, *len; /* [n_vocab] each token's bytes in data */
    uint8_t *data;
    int32_t *ends; /* [n_ends] the end tokens */
    size_t n_ends;
    lily_term_store *store; /* token tables per terminal shape (termtab.h): the one part that
                             * fills as matchers use it (thread-safe) */
} lily_token_trie;

/* Tokens longer than this are left out of the trie (none in the Qwen vocabularies comes near). */
#define LILY_TRIE_MAX_TOKEN 1024

/* From a table of n tokens: bytes[i][0..lens[i]) (bytes[i] NULL: no such token), text[i] != 0
 * for a token the grammar may produce as text (0: an added / special token), and the end
 * tokens ends[0..n_ends). Nothing is kept of the arguments. Free with lily_token_trie_free. */
int lily_token_trie_create(int32_t n, const char *const *bytes, const size_t *lens,
                           const uint8_t *text, const int32_t *ends, size_t n_ends,
                           lily_token_trie **out, lily_err *e);

/* From a tokenizer: every token as it decodes, added tokens excluded from text. */
int lily_token_trie_from_tokenizer(const lily_tokenizer *tok, const int32_t *ends, size_t n_ends,
                                   lily_token_trie **out, lily_err *e);

void lily_token_trie_free(lily_token_trie *t);

/* uint32 words in a mask over this vocabulary. */
static inline size_t lily_token_trie_mask_words(const lily_token_trie *t) {
    return ((size_t)t->n_vocab + 31) / 32;
}

#endif
