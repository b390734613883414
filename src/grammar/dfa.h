/* Terminal builders: the DFAs that grammar terminals are made of (see grammar.h). Each returns
 * the start state of a new DFA inside the builder. */
#ifndef LILY_GRAMMAR_DFA_H
#define LILY_GRAMMAR_DFA_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* One item of a linear pattern: a byte from `set`, repeated min..max times (max < 0: no bound). */
typedef struct lily_dfa_item {
    uint8_t set[32]; /* bitmap over bytes */
    int min, max;
} lily_dfa_item;

#define LILY_DFA_SEQ_MAX_NODES 62 /* occurrences a linear pattern may unroll to */

lily_dfa_item lily_dfa_bytes(const char *bytes, int min, int max); /* any of the listed bytes */
lily_dfa_item lily_dfa_range(unsigned lo, unsigned hi, int min, int max);

/* The DFA of items[0] items[1] ... (a bounded repetition unrolls to one node per occurrence;
 * at most LILY_DFA_SEQ_MAX_NODES in all). */
int32_t lily_dfa_seq(lily_gbuild *b, const lily_dfa_item *items, size_t n);

/* Exactly the bytes s[0..n) (n > 0). */
int32_t lily_dfa_literal(lily_gbuild *b, const char *s, size_t n);

/* Any one of the byte strings s[i][0..n[i]) (a trie: deterministic however many share a
 * prefix). count > 0; empty strings allowed. */
int32_t lily_dfa_literals(lily_gbuild *b, const char *const *s, const size_t *n, size_t count);

/* A JSON string with its quotes: valid UTF-8 only (no overlongs, no surrogates encoded as
 * UTF-8), control characters escaped, escapes \" \\ \/ \b \f \n \r \t \uXXXX. Its length in
 * characters (an escape counts one) is min_chars .. max_chars (max_chars < 0: no bound). */
int32_t lily_dfa_json_string(lily_gbuild *b, int min_chars, int max_chars);

/* Bare text, as the XML tool-call form writes a string parameter's value: valid UTF-8 (tab,
 * newline, carriage return, and the printable characters) that never contains stop (ASCII,
 * non-empty). Its length in characters is min_chars .. max_chars (max_chars < 0: no bound);
 * with a bound (or a minimum) the first byte of stop never appears at all (a simpler
 * automaton: one state per length, not per length and matched prefix). */
int32_t lily_dfa_raw_text(lily_gbuild *b, int min_chars, int max_chars, const char *stop);

#endif
