/* Token tables per terminal state, and the per-vocabulary store that shares them by DFA shape. */
#include "grammar/termtab.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static inline void set_bit(uint32_t *mask, int32_t id) {
    mask[id >> 5] |= 1u << (id & 31);
}

/* Adds the tokens of trie nodes [i, end) to the boundary list; 1 once it is too long. */
static int bnd_add(const lily_token_trie *t, lily_term_tab *x, int32_t i, int32_t end, int exit) {
    for (; i < end; i++) {
        for (int32_t k = 0; k < t->tok_n[i]; k++) {
            if (x->n_bnd == LILY_TERM_BND_MAX) {
                x->big = 1;
                return 1;
            }
            if (x->n_bnd == x->cap_bnd) {
                x->cap_bnd = x->cap_bnd ? 2 * x->cap_bnd : 1024;
                x->bnd = lily_xrealloc(x->bnd, (size_t)x->cap_bnd * sizeof *x->bnd);
                x->exit = lily_xrealloc(x->exit, (size_t)x->cap_bnd * sizeof *x->exit);
            }
            x->exit[x->n_bnd] = (uint16_t)exit;
            x->bnd[x->n_bnd++] = t->ids[t->tok_lo[i] + k];
        }
    }
    return 0;
}

/* The DFA alone over the trie from state s: a token that stays live is inner; one that dies or
 * ends in a final (accepting, edgeless) state after passing an accepting state leaves the
 * terminal (boundary); one that dies before any accepting state is refused. The accepting
 * state s itself does not count: the step that reached s also made the configurations past
 * the terminal. */
void lily_term_tab_fill(lily_term_tab *x, const lily_grammar *g, const lily_token_trie *t,
                        int32_t s, int32_t *ds, uint8_t *acc) {
    size_t words = lily_token_trie_mask_words(t);
    if (!x->inner) x->inner = lily_xmalloc(words * sizeof *x->inner);
    memset(x->inner, 0, words * sizeof *x->inner);
    x->n_bnd = 0;
    x->big = 0;
    ds[0] = s;
    acc[0] = 0;
    for (int32_t i = 0; i < t->n_nodes;) {
        int32_t d = t->depth[i];
        int32_t ns = lily_grammar_next(g, ds[d - 1], t->byte[i]);
        if (!ns) {
            if (acc[d - 1] && bnd_add(t, x, i, t->end[i], 0)) return;
            i = t->end[i];
            continue;
        }
        const lily_gstate *st = &g->states[ns];
        if (!st->live) {
            if (bnd_add(t, x, i, t->end[i], acc[d - 1] ? 0 : d)) return;
            i = t->end[i];
            continue;
        }
        for (int32_t k = 0; k < t->tok_n[i]; k++)
            set_bit(x->inner, t->ids[t->tok_lo[i] + k]);
        ds[d] = ns;
        acc[d] = acc[d - 1] | st->accept;
        i++;
    }
}

void lily_term_tab_release(lily_term_tab *x) {
    free(x->inner);
    free(x->bnd);
    free(x->exit);
    *x = (lily_term_tab){0};
}

/* ---- shapes -------------------------------------------------------------------------------- */

#define SHAPE_MAX_STATES 256
#define STORE_MAX        128

/* The DFA reachable from s, states renumbered in BFS order: per state its flags, its edge count
 * and its edges (lo | hi << 8, target number). Returns the length in *sig, or -1 if more than
 * SHAPE_MAX_STATES states are reachable. sig has room for SHAPE_MAX_STATES * (2 + 2 * 256). */
static int32_t shape(const lily_grammar *g, int32_t s, uint32_t *sig) {
    int32_t order[SHAPE_MAX_STATES];
    int32_t n = 0, k = 0;
    order[n++] = s;
    for (int32_t q = 0; q < n; q++) {
        const lily_gstate *st = &g->states[order[q]];
        sig[k++] = (uint32_t)st->accept | (uint32_t)st->live << 1;
        sig[k++] = (uint32_t)st->r_n;
        for (int32_t i = 0; i < st->r_n; i++) {
            const lily_grange *r = &g->ranges[st->r_off + i];
            int32_t j = 0;
            while (j < n && order[j] != r->to)
                j++;
            if (j == n) {
                if (n == SHAPE_MAX_STATES) return -1;
                order[n++] = r->to;
            }
            sig[k++] = (uint32_t)r->lo | (uint32_t)r->hi << 8;
            sig[k++] = (uint32_t)j;
        }
    }
    return k;
}

typedef struct store_entry {
    uint64_t hash;
    uint32_t *sig;
    int32_t n_sig;
    lily_term_tab tab;
} store_entry;

struct lily_term_store {
    pthread_mutex_t lock;
    store_entry e[STORE_MAX];
    int n;
    uint32_t *sig; /* scratch */
};

lily_term_store *lily_term_store_new(void) {
    lily_term_store *st = lily_xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->lock, NULL);
    st->sig = lily_xmalloc((size_t)SHAPE_MAX_STATES * (2 + 2 * 256) * sizeof *st->sig);
    return st;
}

void lily_term_store_free(lily_term_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        free(st->e[i].sig);
        lily_term_tab_release(&st->e[i].tab);
    }
    pthread_mutex_destroy(&st->lock);
    free(st->sig);
    free(st);
}

const lily_term_tab *lily_term_store_get(lily_term_store *st, const lily_grammar *g,
                                         const lily_token_trie *t, int32_t s) {
    const lily_term_tab *found = NULL;
    pthread_mutex_lock(&st->lock);
    int32_t n = shape(g, s, st->sig);
    if (n >= 0) {
        uint64_t h = 1469598103934665603ull;
        for (int32_t i = 0; i < n; i++)
            h = (h ^ st->sig[i]) * 1099511628211ull;
        for (int i = 0; i < st->n && !found; i++)
            if (st->e[i].hash == h && st->e[i].n_sig == n &&
                !memcmp(st->e[i].sig, st->sig, (size_t)n * sizeof *st->sig))
                found = &st->e[i].tab;
        if (!found && st->n < STORE_MAX) {
            store_entry *x = &st->e[st->n];
            int32_t *ds = lily_xmalloc(((size_t)t->max_depth + 2) * sizeof *ds);
            uint8_t *acc = lily_xmalloc((size_t)t->max_depth + 2);
            *x = (store_entry){.hash = h, .n_sig = n};
            x->sig = lily_xmalloc((size_t)n * sizeof *x->sig);
            memcpy(x->sig, st->sig, (size_t)n * sizeof *x->sig);
            lily_term_tab_fill(&x->tab, g, t, s, ds, acc);
            free(ds);
            free(acc);
            st->n++;
            found = &x->tab;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return found;
}
