/* Grammar building and the checks that make a grammar safe for the matcher. */
#include "grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

typedef struct gb_alt {
    int32_t rule, off, n; /* elements tmp[off .. off + n) */
} gb_alt;

typedef struct gb_edge {
    int32_t from, to;
    uint8_t lo, hi;
} gb_edge;

struct lily_gbuild {
    int32_t n_rules;
    gb_alt *alts;
    size_t n_alts, cap_alts;
    lily_gelem *tmp;
    size_t n_tmp, cap_tmp;
    uint8_t *accept; /* [n_states] */
    int32_t n_states, cap_states;
    gb_edge *edges;
    size_t n_edges, cap_edges;
    int too_big;
};

#define GROW(p, n, cap, want)                            \
    do {                                                 \
        if ((want) > (cap)) {                            \
            size_t nc_ = (cap) ? (size_t)(cap)*2 : 64;   \
            while (nc_ < (size_t)(want))                 \
                nc_ *= 2;                                \
            (p) = lily_xrealloc((p), nc_ * sizeof *(p)); \
            (cap) = nc_;                                 \
        }                                                \
        (void)(n);                                       \
    } while (0)

lily_gbuild *lily_gbuild_new(void) {
    lily_gbuild *b = lily_xcalloc(1, sizeof *b);
    b->n_states = 1; /* state 0: dead */
    b->cap_states = 64;
    b->accept = lily_xcalloc(64, 1);
    return b;
}

void lily_gbuild_free(lily_gbuild *b) {
    if (!b) return;
    free(b->alts);
    free(b->tmp);
    free(b->accept);
    free(b->edges);
    free(b);
}

int lily_gbuild_too_big(const lily_gbuild *b) {
    return b->too_big;
}

int32_t lily_gbuild_rule(lily_gbuild *b) {
    return b->n_rules++;
}

void lily_gbuild_alt(lily_gbuild *b, int32_t r, const lily_gelem *seq, size_t n) {
    if (b->n_tmp + n + b->n_alts > LILY_GRAMMAR_MAX_ELEMS) {
        b->too_big = 1;
        return;
    }
    GROW(b->tmp, b->n_tmp, b->cap_tmp, b->n_tmp + n);
    GROW(b->alts, b->n_alts, b->cap_alts, b->n_alts + 1);
    if (n) memcpy(b->tmp + b->n_tmp, seq, n * sizeof *seq);
    b->alts[b->n_alts++] = (gb_alt){r, (int32_t)b->n_tmp, (int32_t)n};
    b->n_tmp += n;
}

int32_t lily_gbuild_state(lily_gbuild *b, int accept) {
    if (b->n_states >= LILY_GRAMMAR_MAX_STATES) {
        b->too_big = 1;
        return b->n_states - 1;
    }
    if (b->n_states == b->cap_states) {
        b->accept = lily_xrealloc(b->accept, (size_t)b->cap_states * 2);
        b->cap_states *= 2;
    }
    b->accept[b->n_states] = accept != 0;
    return b->n_states++;
}

void lily_gbuild_edge(lily_gbuild *b, int32_t from, unsigned lo, unsigned hi, int32_t to) {
    LILY_ASSERT(from > 0 && from < b->n_states && to > 0 && to < b->n_states && lo <= hi &&
                hi < 256);
    GROW(b->edges, b->n_edges, b->cap_edges, b->n_edges + 1);
    b->edges[b->n_edges++] = (gb_edge){from, to, (uint8_t)lo, (uint8_t)hi};
}

static int edge_cmp(const void *pa, const void *pb) {
    const gb_edge *a = pa, *b = pb;
    if (a->from != b->from) return a->from < b->from ? -1 : 1;
    return (int)a->lo - (int)b->lo;
}

void lily_grammar_free(lily_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->states);
    free(g->ranges);
    free(g->dense_tab);
    free(g);
}

/* States with many edges (a JSON string body) get a 256-entry table: one load per byte. */
#define DENSE_MIN_RANGES 5

static void freeze_states(lily_gbuild *b, lily_grammar *g) {
    if (b->n_edges) qsort(b->edges, b->n_edges, sizeof *b->edges, edge_cmp);
    g->n_states = b->n_states;
    g->states = lily_xcalloc((size_t)b->n_states, sizeof *g->states);
    g->ranges = lily_xmalloc((b->n_edges + 1) * sizeof *g->ranges);
    int32_t n_dense = 0;
    size_t e = 0;
    for (int32_t s = 0; s < b->n_states; s++) {
        lily_gstate *st = &g->states[s];
        st->r_off = (int32_t)e;
        st->accept = s ? b->accept[s] : 0;
        st->dense = -1;
        while (e < b->n_edges && b->edges[e].from == s) {
            const gb_edge *x = &b->edges[e];
            LILY_ASSERT(e == (size_t)st->r_off || x->lo > b->edges[e - 1].hi);
            g->ranges[e] = (lily_grange){x->lo, x->hi, x->to};
            e++;
        }
        st->r_n = (int32_t)e - st->r_off;
        st->live = st->r_n > 0;
        if (st->r_n >= DENSE_MIN_RANGES) st->dense = n_dense++;
    }
    g->dense_tab = lily_xcalloc((size_t)n_dense * 256 + 1, sizeof *g->dense_tab);
    for (int32_t s = 0; s < g->n_states; s++) {
        const lily_gstate *st = &g->states[s];
        if (st->dense < 0) continue;
        int32_t *t = g->dense_tab + (size_t)st->dense * 256;
        for (int32_t i = 0; i < st->r_n; i++) {
            const lily_grange *r = &g->ranges[st->r_off + i];
            for (unsigned c = r->lo; c <= r->hi; c++)
                t[c] = r->to;
        }
    }
}

static void freeze_rules(lily_gbuild *b, lily_grammar *g) {
    g->n_rules = b->n_rules;
    g->rule_alt = lily_xcalloc((size_t)b->n_rules + 1, sizeof *g->rule_alt);
    for (size_t i = 0; i < b->n_alts; i++)
        g->rule_alt[b->alts[i].rule + 1]++;
    for (int32_t r = 0; r < b->n_rules; r++)
        g->rule_alt[r + 1] += g->rule_alt[r];
    int32_t *fill = lily_xmalloc(((size_t)b->n_rules + 1) * sizeof *fill);
    memcpy(fill, g->rule_alt, ((size_t)b->n_rules + 1) * sizeof *fill);
    g->alt_start = lily_xmalloc((b->n_alts + 1) * sizeof *g->alt_start);
    g->elems = lily_xmalloc((b->n_tmp + b->n_alts + 1) * sizeof *g->elems);
    int32_t n = 0;
    for (size_t i = 0; i < b->n_alts; i++) {
        const gb_alt *a = &b->alts[i];
        g->alt_start[fill[a->rule]++] = n;
        if (a->n) memcpy(g->elems + n, b->tmp + a->off, (size_t)a->n * sizeof *g->elems);
        n += a->n;
        g->elems[n++] = (lily_gelem){LILY_GE_END, 0};
    }
    g->n_elems = n;
    free(fill);
}

/* ---- checks -------------------------------------------------------------------------------- */

static int elem_nullable(const lily_grammar *g, const lily_gelem *x, const uint8_t *nullable) {
    if (x->kind == LILY_GE_TOKEN) return 0;
    return x->kind == LILY_GE_TERM ? g->states[x->arg].accept : nullable[x->arg];
}

/* Fixpoints: which rules derive the empty string, and which derive any finite string. */
static void fixpoints(const lily_grammar *g, uint8_t *nullable, uint8_t *productive) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                int nul = 1, prod = 1;
                for (const lily_gelem *x = g->elems + g->alt_start[a]; x->kind != LILY_GE_END;
                     x++) {
                    if (!elem_nullable(g, x, nullable)) nul = 0;
                    if (x->kind == LILY_GE_REF && !productive[x->arg]) prod = 0;
                }
                if (nul && !nullable[r]) nullable[r] = 1, changed = 1;
                if (prod && !productive[r]) productive[r] = 1, changed = 1;
            }
        }
    }
}

/* Left recursion: a cycle among "r may call s before consuming a byte" edges. Iterative DFS
 * over an adjacency list (schemas can nest deeply). Returns a rule on a cycle, or -1. */
static int32_t left_cycle(const lily_grammar *g, const uint8_t *nullable) {
    size_t n = (size_t)g->n_rules;
    int32_t *off = lily_xcalloc(n + 1, sizeof *off);
    int32_t *adj = lily_xmalloc(((size_t)g->n_elems + 1) * sizeof *adj);
    int32_t m = 0;
    for (int32_t r = 0; r < g->n_rules; r++) {
        off[r] = m;
        for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            for (const lily_gelem *x = g->elems + g->alt_start[a]; x->kind != LILY_GE_END; x++) {
                if (x->kind == LILY_GE_REF) adj[m++] = x->arg;
                if (!elem_nullable(g, x, nullable)) break;
            }
        }
    }
    off[n] = m;
    uint8_t *color = lily_xcalloc(n + 1, 1); /* 0 new, 1 on the DFS stack, 2 done */
    int32_t *st_r = lily_xmalloc((n + 1) * sizeof *st_r),
            *st_i = lily_xmalloc((n + 1) * sizeof *st_i);
    int32_t bad = -1;
    for (int32_t r0 = 0; r0 < g->n_rules && bad < 0; r0++) {
        if (color[r0]) continue;
        size_t sp = 0;
        st_r[sp] = r0, st_i[sp++] = off[r0];
        color[r0] = 1;
        while (sp && bad < 0) {
            int32_t r = st_r[sp - 1];
            if (st_i[sp - 1] == off[r + 1]) {
                color[r] = 2;
                sp--;
                continue;
            }
            int32_t s = adj[st_i[sp - 1]++];
            if (color[s] == 1)
                bad = s;
            else if (color[s] == 0) {
                color[s] = 1;
                st_r[sp] = s, st_i[sp++] = off[s];
            }
        }
    }
    free(off);
    free(adj);
    free(color);
    free(st_r);
    free(st_i);
    return bad;
}

int lily_gbuild_finish(lily_gbuild *b, int32_t root, lily_grammar **out, lily_err *e) {
    *out = NULL;
    if (b->too_big) {
        lily_gbuild_free(b);
        return lily_fail(e, "grammar too large (more than %d states or elements)",
                         LILY_GRAMMAR_MAX_STATES);
    }
    LILY_ASSERT(root >= 0 && root < b->n_rules);
    lily_grammar *g = lily_xcalloc(1, sizeof *g);
    g->root = root;
    freeze_states(b, g);
    freeze_rules(b, g);
    lily_gbuild_free(b);
    for (int32_t r = 0; r < g->n_rules; r++) {
        if (g->rule_alt[r] == g->rule_alt[r + 1]) {
            lily_grammar_free(g);
            return lily_fail(e, "grammar rule %d has no alternatives", (int)r);
        }
    }
    uint8_t *nullable = lily_xcalloc((size_t)g->n_rules + 1, 1);
    uint8_t *productive = lily_xcalloc((size_t)g->n_rules + 1, 1);
    fixpoints(g, nullable, productive);
    int rc = 0;
    int32_t bad = -1;
    for (int32_t r = 0; r < g->n_rules && bad < 0; r++)
        if (!productive[r]) bad = r;
    if (bad >= 0) {
        rc = lily_fail(e, "grammar rule %d derives no finite string (a recursion with no way out)",
                       (int)bad);
    } else if ((bad = left_cycle(g, nullable)) >= 0) {
        rc = lily_fail(e, "grammar rule %d is left-recursive (a recursion that consumes nothing)",
                       (int)bad);
    }
    free(nullable);
    free(productive);
    if (rc) {
        lily_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
