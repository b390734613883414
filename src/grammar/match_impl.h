/* The matcher's internals, shared by matcher.c (steps, history) and mask.c (the trie walk and
 * its cache). Not for use outside src/grammar. */
#ifndef LILY_GRAMMAR_MATCH_IMPL_H
#define LILY_GRAMMAR_MATCH_IMPL_H

#include "grammar/matcher.h"
#include "grammar/termtab.h"

/* A node of the persistent stacks: a configuration (dstate >= 0: inside the terminal at elem)
 * or a return frame (dstate < 0: continue at elem when the rule entered above it ends). */
typedef struct gm_node {
    int32_t elem, dstate, parent, depth; /* parent: a frame, or -1 at the root */
} gm_node;

/* A state: the configurations cfg[cfg_off .. cfg_off + cfg_n) and the pool's top when it was
 * made (every node it uses lies below). */
typedef struct gm_pos {
    int32_t cfg_off, cfg_n, pool_top;
    uint8_t accept, finished;
} gm_pos;

typedef struct gm_cache_entry {
    uint64_t hash, used; /* used: LRU clock, 0 = empty */
    uint32_t *key;       /* [key_n] */
    int32_t key_n, key_cap;
    uint32_t *mask; /* [mask words] */
} gm_cache_entry;

/* A matcher's first-level cache of terminal tables (termtab.h) by DFA state id: the shared
 * table from the trie's store, or its own when the store has none. */
typedef struct gm_dfa_entry {
    int32_t dstate;
    uint64_t used; /* LRU clock, 0 = empty */
    const lily_term_tab *tab;
    lily_term_tab own;
} gm_dfa_entry;

#define GM_SUFFIX_SLOTS 4096

struct lily_gmatch {
    const lily_grammar *g;
    const lily_token_trie *t;
    int max_depth;
    gm_node *pool; /* [cap] */
    int32_t top, cap;
    int32_t *cfg; /* [cfg_cap] node ids */
    int32_t cfg_top, cfg_cap;
    gm_pos cur;
    gm_pos *hist; /* [cap_hist] the state before each accepted token */
    int32_t n_hist, cap_hist;
    gm_pos *walk;       /* [t->max_depth + 1] the trie walk's state per depth */
    int32_t step_start; /* first node made by the current step (duplicates are looked up there) */
    int32_t compact_at; /* compact the pool when top passes this */
    int step_accept;
    /* compaction scratch, grown with the pool and the configuration buffer */
    int32_t *remap; /* [cap] */
    int32_t *cfg2;  /* [cfg_cap] */
    /* the mask cache */
    gm_cache_entry *cache;
    int n_cache;
    uint64_t clock;
    uint32_t *key;
    int32_t key_cap;
    struct gm_suffix { /* [GM_SUFFIX_SLOTS] boundary checks by the bytes after the exit */
        uint32_t gen;  /* valid when equal to suffix_gen */
        int32_t tok;   /* a token with this suffix */
        uint16_t off;  /* where the suffix starts in it */
        uint8_t ok;
    } * suffix;
    uint32_t suffix_gen;
    gm_dfa_entry *dfa; /* [n_dfa] */
    int n_dfa;
    int32_t *dfa_ds;  /* [t->max_depth + 1] the DFA-only walk's state per depth */
    uint8_t *dfa_acc; /* [t->max_depth + 1] whether it passed an accepting state */
    lily_gmatch_stats stats;
};

/* The state right after configuration `node` leaves its terminal (what follows the terminal,
 * entered from the pool's and buffer's tops). Returns 1 if it is alive. */
int lily_gm_exit(lily_gmatch *m, int32_t node, gm_pos *to);

/* Appends node id to the configuration buffer (growing it). */
void lily_gm_push_cfg(lily_gmatch *m, int32_t id);

/* One byte from state *from into *to (pool and buffer tops reset to from's first). Returns 1
 * if *to is alive (some configuration, or accepting). */
int lily_gm_step(lily_gmatch *m, const gm_pos *from, unsigned b, gm_pos *to);

/* Resets the pool and buffer tops to just after state p. */
static inline void lily_gm_restore(lily_gmatch *m, const gm_pos *p) {
    m->top = p->pool_top;
    m->cfg_top = p->cfg_off + p->cfg_n;
}

#endif
