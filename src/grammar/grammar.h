/* A grammar for constrained decoding: a context-free grammar whose terminals are small DFAs over
 * bytes.
 *
 * A rule is a list of alternatives; an alternative is a sequence of elements, each either a
 * terminal (a DFA given by its start state) or a reference to a rule. Terminals carry the lexical
 * detail (a literal, "[0-9]{1,16}", a whole JSON string with its UTF-8 and escapes, bounded
 * whitespace), so that the matcher (matcher.h) follows one configuration through a string body
 * instead of a fan of single-byte alternatives; rules carry the nesting (objects, arrays, $ref
 * recursion), which the matcher keeps on a stack.
 *
 * A grammar is built with lily_gbuild (below) and is immutable afterwards: one grammar may be
 * shared by any number of matchers and threads. lily_gbuild_finish refuses grammars the matcher
 * cannot run: left recursion (a rule that can reach itself without consuming a byte) and rules
 * that derive no finite string. */
#ifndef LILY_GRAMMAR_GRAMMAR_H
#define LILY_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"

enum { LILY_GE_END = 0, LILY_GE_TERM = 1, LILY_GE_REF = 2, LILY_GE_TOKEN = 3 };

/* TOKEN places one token by id (an added token such as <tool_call>, which has no bytes the
 * grammar could spell): the matcher allows it exactly there. */
typedef struct lily_gelem {
    int32_t kind; /* LILY_GE_* */
    int32_t arg;  /* TERM: DFA start state; REF: rule id; TOKEN: token id; END: unused */
} lily_gelem;

/* One DFA state. State 0 is the dead state (no edges); lily_grammar_next returns 0 for a byte
 * with no edge. */
typedef struct lily_gstate {
    int32_t r_off; /* its edges: ranges[r_off .. r_off + r_n), sorted, disjoint */
    int32_t r_n;
    int32_t dense;  /* >= 0: next state for every byte in dense_tab[dense * 256 ..]; else -1 */
    uint8_t accept; /* the terminal may end here */
    uint8_t live;   /* has at least one edge */
} lily_gstate;

typedef struct lily_grange {
    uint8_t lo, hi; /* bytes lo..hi inclusive */
    int32_t to;
} lily_grange;

typedef struct lily_grammar {
    lily_gelem *elems; /* [n_elems] every alternative's elements, each alternative ended by END */
    int32_t n_elems;
    int32_t *alt_start; /* [n_alts] index in elems of each alternative's first element */
    int32_t *rule_alt;  /* [n_rules + 1] alternatives of rule r: alt_start[rule_alt[r] .. r+1] */
    int32_t n_rules;
    int32_t root;
    lily_gstate *states; /* [n_states] */
    int32_t n_states;
    lily_grange *ranges; /* [n_ranges] */
    int32_t *dense_tab;  /* [n_dense * 256] */
} lily_grammar;

/* The state after byte b from state s (0 = dead). */
static inline int32_t lily_grammar_next(const lily_grammar *g, int32_t s, unsigned b) {
    const lily_gstate *st = &g->states[s];
    if (st->dense >= 0) return g->dense_tab[(size_t)st->dense * 256 + b];
    const lily_grange *r = g->ranges + st->r_off;
    for (int32_t i = 0; i < st->r_n; i++)
        if (b <= r[i].hi) return b >= r[i].lo ? r[i].to : 0;
    return 0;
}

void lily_grammar_free(lily_grammar *g);

/* ---- building ------------------------------------------------------------------------------ */

typedef struct lily_gbuild lily_gbuild;

/* Limits that keep a hostile schema from asking for unbounded memory. */
#define LILY_GRAMMAR_MAX_STATES (1 << 20)
#define LILY_GRAMMAR_MAX_ELEMS  (1 << 20)

lily_gbuild *lily_gbuild_new(void);
void lily_gbuild_free(lily_gbuild *b);

/* A new rule with no alternatives yet; returns its id. */
int32_t lily_gbuild_rule(lily_gbuild *b);

/* Adds the alternative seq[0..n) to rule r (n = 0: the empty alternative). */
void lily_gbuild_alt(lily_gbuild *b, int32_t r, const lily_gelem *seq, size_t n);

/* A new DFA state (accepting or not); returns its id (never 0). */
int32_t lily_gbuild_state(lily_gbuild *b, int accept);

/* An edge from state `from` on bytes lo..hi to state `to`. A state's edges must not overlap. */
void lily_gbuild_edge(lily_gbuild *b, int32_t from, unsigned lo, unsigned hi, int32_t to);

/* 1 once the builder passed LILY_GRAMMAR_MAX_STATES or _MAX_ELEMS (further calls are no-ops
 * that keep ids valid; finish then fails). */
int lily_gbuild_too_big(const lily_gbuild *b);

/* Checks and freezes the grammar with rule `root` as the start; the builder is consumed (freed)
 * either way. Errors: a rule without alternatives, left recursion, a rule deriving no finite
 * string, too large. Free *out with lily_grammar_free. */
int lily_gbuild_finish(lily_gbuild *b, int32_t root, lily_grammar **out, lily_err *e);

static inline lily_gelem lily_gterm(int32_t start) {
    return (lily_gelem){LILY_GE_TERM, start};
}
static inline lily_gelem lily_gref(int32_t rule) {
    return (lily_gelem){LILY_GE_REF, rule};
}
static inline lily_gelem lily_gtoken(int32_t id) {
    return (lily_gelem){LILY_GE_TOKEN, id};
}

#endif
