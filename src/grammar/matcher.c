/* The matcher: steps over bytes, accepted tokens, their history and the pool's compaction. */
#include "grammar/matcher.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/match_impl.h"

#define POOL_INIT (1 << 14)
#define CFG_INIT  (1 << 12)

static void grow_pool(lily_gmatch *m, int32_t want) {
    if (want <= m->cap) return;
    int32_t c = m->cap;
    while (c < want)
        c *= 2;
    m->pool = lily_xrealloc(m->pool, (size_t)c * sizeof *m->pool);
    m->remap = lily_xrealloc(m->remap, (size_t)c * sizeof *m->remap);
    m->cap = c;
}

static void grow_cfg(lily_gmatch *m, int32_t want) {
    if (want <= m->cfg_cap) return;
    int32_t c = m->cfg_cap;
    while (c < want)
        c *= 2;
    m->cfg = lily_xrealloc(m->cfg, (size_t)c * sizeof *m->cfg);
    m->cfg2 = lily_xrealloc(m->cfg2, (size_t)c * sizeof *m->cfg2);
    m->cfg_cap = c;
}

/* ---- one step ------------------------------------------------------------------------------ */

/* The node (elem, dstate, parent), reusing an equal one made by this step; *fresh says which. */
static int32_t node_get(lily_gmatch *m, int32_t elem, int32_t dstate, int32_t parent, int *fresh) {
    for (int32_t i = m->step_start; i < m->top; i++) {
        const gm_node *n = &m->pool[i];
        if (n->elem == elem && n->dstate == dstate && n->parent == parent) {
            *fresh = 0;
            return i;
        }
    }
    grow_pool(m, m->top + 1);
    int32_t depth = parent >= 0 ? m->pool[parent].depth : 0;
    m->pool[m->top] = (gm_node){elem, dstate, parent, dstate < 0 ? depth + 1 : depth};
    *fresh = 1;
    return m->top++;
}

void lily_gm_push_cfg(lily_gmatch *m, int32_t id) {
    grow_cfg(m, m->cfg_top + 1);
    m->cfg[m->cfg_top++] = id;
}

static void add_config(lily_gmatch *m, int32_t elem, int32_t dstate, int32_t parent) {
    int fresh;
    int32_t id = node_get(m, elem, dstate, parent, &fresh);
    if (!fresh) return;
    grow_cfg(m, m->cfg_top + 1);
    m->cfg[m->cfg_top++] = id;
}

/* Reaches every terminal that can consume the next byte from element e with stack `parent`:
 * enters rules, skips terminals that may be empty, returns from finished rules. The grammar has
 * no left recursion (checked when it was built), so this ends. */
static void expand(lily_gmatch *m, int32_t e, int32_t parent) {
    const lily_grammar *g = m->g;
    const lily_gelem *x = &g->elems[e];
    if (x->kind == LILY_GE_END) {
        if (parent < 0) {
            m->step_accept = 1;
            return;
        }
        gm_node p = m->pool[parent];
        expand(m, p.elem, p.parent);
    } else if (x->kind == LILY_GE_TOKEN) {
        add_config(m, e, 0, parent); /* DFA state 0: waits for the token, dies on any byte */
    } else if (x->kind == LILY_GE_TERM) {
        const lily_gstate *st = &g->states[x->arg];
        if (st->live) add_config(m, e, x->arg, parent);
        if (st->accept) expand(m, e + 1, parent);
    } else {
        int32_t ret = parent;
        if (g->elems[e + 1].kind != LILY_GE_END) { /* not a tail call: push a return frame */
            if (parent >= 0 && m->pool[parent].depth >= m->max_depth) return;
            int fresh;
            ret = node_get(m, e + 1, -1, parent, &fresh);
            if (!fresh) return; /* this step already entered this rule from here */
        }
        for (int32_t a = g->rule_alt[x->arg]; a < g->rule_alt[x->arg + 1]; a++)
            expand(m, g->alt_start[a], ret);
    }
}

int lily_gm_step(lily_gmatch *m, const gm_pos *from, unsigned b, gm_pos *to) {
    const lily_grammar *g = m->g;
    lily_gm_restore(m, from);
    m->step_start = m->top;
    m->step_accept = 0;
    int32_t c0 = m->cfg_top;
    for (int32_t i = 0; i < from->cfg_n; i++) {
        gm_node n = m->pool[m->cfg[from->cfg_off + i]];
        int32_t ns = lily_grammar_next(g, n.dstate, b);
        if (!ns) continue;
        if (g->states[ns].live) add_config(m, n.elem, ns, n.parent);
        if (g->states[ns].accept) expand(m, n.elem + 1, n.parent);
    }
    *to = (gm_pos){c0, m->cfg_top - c0, m->top, (uint8_t)m->step_accept, 0};
    return to->cfg_n > 0 || to->accept;
}

int lily_gm_exit(lily_gmatch *m, int32_t node, gm_pos *to) {
    gm_node n = m->pool[node];
    m->step_start = m->top;
    m->step_accept = 0;
    int32_t c0 = m->cfg_top;
    expand(m, n.elem + 1, n.parent);
    *to = (gm_pos){c0, m->cfg_top - c0, m->top, (uint8_t)m->step_accept, 0};
    return to->cfg_n > 0 || to->accept;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

void lily_gmatch_reset(lily_gmatch *m) {
    m->top = m->cfg_top = m->step_start = 0;
    m->step_accept = 0;
    m->n_hist = 0;
    const lily_grammar *g = m->g;
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        expand(m, g->alt_start[a], -1);
    m->cur = (gm_pos){0, m->cfg_top, m->top, (uint8_t)m->step_accept, 0};
    m->compact_at = m->cap / 2;
}

int lily_gmatch_create(const lily_grammar *g, const lily_token_trie *t,
                       const lily_gmatch_opts *opts, lily_gmatch **out, lily_err *e) {
    *out = NULL;
    if (!g || !t) return lily_fail(e, "grammar matcher: no grammar or no vocabulary");
    for (int32_t i = 0; i < g->n_elems; i++)
        if (g->elems[i].kind == LILY_GE_TOKEN &&
            (g->elems[i].arg < 0 || g->elems[i].arg >= t->n_vocab))
            return lily_fail(e,
                             "grammar matcher: the grammar places token %d, outside the "
                             "vocabulary (%d)",
                             (int)g->elems[i].arg, (int)t->n_vocab);
    lily_gmatch *m = lily_xcalloc(1, sizeof *m);
    m->g = g;
    m->t = t;
    m->max_depth = opts && opts->max_depth > 0 ? opts->max_depth : 512;
    int nc = opts && opts->cache_entries ? opts->cache_entries : 64;
    m->n_cache = nc > 0 ? nc : 0;
    m->cap = POOL_INIT;
    m->pool = lily_xmalloc((size_t)m->cap * sizeof *m->pool);
    m->remap = lily_xmalloc((size_t)m->cap * sizeof *m->remap);
    m->cfg_cap = CFG_INIT;
    m->cfg = lily_xmalloc((size_t)m->cfg_cap * sizeof *m->cfg);
    m->cfg2 = lily_xmalloc((size_t)m->cfg_cap * sizeof *m->cfg2);
    m->cap_hist = 256;
    m->hist = lily_xmalloc((size_t)m->cap_hist * sizeof *m->hist);
    m->walk = lily_xmalloc(((size_t)t->max_depth + 2) * sizeof *m->walk);
    m->key_cap = 1024;
    m->key = lily_xmalloc((size_t)m->key_cap * sizeof *m->key);
    size_t words = lily_token_trie_mask_words(t);
    m->cache = lily_xcalloc((size_t)m->n_cache + 1, sizeof *m->cache);
    for (int i = 0; i < m->n_cache; i++) {
        m->cache[i].mask = lily_xmalloc(words * sizeof(uint32_t));
        m->cache[i].key_cap = 256;
        m->cache[i].key = lily_xmalloc(256 * sizeof(uint32_t));
    }
    m->n_dfa = m->n_cache ? 32 : 0;
    m->suffix = lily_xcalloc(GM_SUFFIX_SLOTS, sizeof *m->suffix);
    m->dfa = lily_xcalloc((size_t)m->n_dfa + 1, sizeof *m->dfa);
    m->dfa_ds = lily_xmalloc(((size_t)t->max_depth + 2) * sizeof *m->dfa_ds);
    m->dfa_acc = lily_xmalloc((size_t)t->max_depth + 2);
    lily_gmatch_reset(m);
    *out = m;
    return 0;
}

void lily_gmatch_free(lily_gmatch *m) {
    if (!m) return;
    for (int i = 0; i < m->n_cache; i++) {
        free(m->cache[i].mask);
        free(m->cache[i].key);
    }
    free(m->cache);
    for (int i = 0; i < m->n_dfa; i++)
        lily_term_tab_release(&m->dfa[i].own);
    free(m->dfa);
    free(m->suffix);
    free(m->dfa_ds);
    free(m->dfa_acc);
    free(m->key);
    free(m->pool);
    free(m->remap);
    free(m->cfg);
    free(m->cfg2);
    free(m->hist);
    free(m->walk);
    free(m);
}

void lily_gmatch_copy(lily_gmatch *dst, const lily_gmatch *src) {
    LILY_ASSERT(dst->g == src->g && dst->t == src->t);
    grow_pool(dst, src->top + 1);
    grow_cfg(dst, src->cfg_top + 1);
    if (src->n_hist > dst->cap_hist) {
        dst->cap_hist = src->cap_hist;
        dst->hist = lily_xrealloc(dst->hist, (size_t)dst->cap_hist * sizeof *dst->hist);
    }
    memcpy(dst->pool, src->pool, (size_t)src->top * sizeof *src->pool);
    memcpy(dst->cfg, src->cfg, (size_t)src->cfg_top * sizeof *src->cfg);
    memcpy(dst->hist, src->hist, (size_t)src->n_hist * sizeof *src->hist);
    dst->top = src->top;
    dst->cfg_top = src->cfg_top;
    dst->n_hist = src->n_hist;
    dst->cur = src->cur;
    dst->max_depth = src->max_depth;
    dst->compact_at = src->compact_at > dst->cap / 2 ? src->compact_at : dst->cap / 2;
}

/* ---- history and compaction ---------------------------------------------------------------- */

/* Keeps the nodes that the current state and the last LILY_GMATCH_ROLLBACK history states
 * reach, in their order (a parent always precedes its children), and renumbers them. */
static void compact(lily_gmatch *m) {
    int32_t h0 = m->n_hist > LILY_GMATCH_ROLLBACK ? m->n_hist - LILY_GMATCH_ROLLBACK : 0;
    memmove(m->hist, m->hist + h0, (size_t)(m->n_hist - h0) * sizeof *m->hist);
    m->n_hist -= h0;
    int32_t *mark = m->remap;
    memset(mark, 0, (size_t)m->top * sizeof *mark);
    for (int32_t k = 0; k <= m->n_hist; k++) {
        const gm_pos *p = k < m->n_hist ? &m->hist[k] : &m->cur;
        for (int32_t i = 0; i < p->cfg_n; i++)
            for (int32_t id = m->cfg[p->cfg_off + i]; id >= 0 && !mark[id]; id = m->pool[id].parent)
                mark[id] = 1;
    }
    int32_t w = 0;
    for (int32_t i = 0; i < m->top; i++) {
        int live = mark[i];
        mark[i] = w; /* from here on: the new index of i, or of the next kept node */
        if (!live) continue;
        gm_node n = m->pool[i];
        if (n.parent >= 0) n.parent = mark[n.parent];
        m->pool[w++] = n;
    }
    int32_t c = 0;
    for (int32_t k = 0; k <= m->n_hist; k++) {
        gm_pos *p = k < m->n_hist ? &m->hist[k] : &m->cur;
        int32_t off = c;
        for (int32_t i = 0; i < p->cfg_n; i++)
            m->cfg2[c++] = mark[m->cfg[p->cfg_off + i]];
        p->cfg_off = off;
        p->pool_top = p->pool_top < m->top ? mark[p->pool_top] : w;
    }
    int32_t *t = m->cfg;
    m->cfg = m->cfg2;
    m->cfg2 = t;
    m->top = w;
    m->cfg_top = c;
    m->compact_at = 2 * w > m->cap / 2 ? 2 * w : m->cap / 2;
}

int lily_gmatch_accept_bytes(lily_gmatch *m, const void *bytes, size_t n) {
    if (m->cur.finished) return -1;
    gm_pos save = m->cur, nx;
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        if (!lily_gm_step(m, &m->cur, p[i], &nx)) {
            m->cur = save;
            lily_gm_restore(m, &save);
            return -1;
        }
        m->cur = nx;
    }
    return 0;
}

static void hist_push(lily_gmatch *m) {
    if (m->n_hist == m->cap_hist) {
        m->cap_hist *= 2;
        m->hist = lily_xrealloc(m->hist, (size_t)m->cap_hist * sizeof *m->hist);
    }
    m->hist[m->n_hist++] = m->cur;
}

/* The token tok where the grammar places it (TOKEN elements): 1 if some configuration waits
 * for it, with the state after it in *to. */
static int step_token(lily_gmatch *m, int32_t tok, gm_pos *to) {
    const gm_pos cur = m->cur;
    lily_gm_restore(m, &cur);
    m->step_start = m->top;
    m->step_accept = 0;
    int32_t c0 = m->cfg_top;
    int matched = 0;
    for (int32_t i = 0; i < cur.cfg_n; i++) {
        gm_node n = m->pool[m->cfg[cur.cfg_off + i]];
        if (n.dstate != 0 || m->g->elems[n.elem].arg != tok) continue;
        matched = 1;
        expand(m, n.elem + 1, n.parent);
    }
    *to = (gm_pos){c0, m->cfg_top - c0, m->top, (uint8_t)m->step_accept, 0};
    if (!matched || !(to->cfg_n || to->accept)) {
        lily_gm_restore(m, &cur);
        return 0;
    }
    return 1;
}

int lily_gmatch_accept_token(lily_gmatch *m, int32_t tok) {
    const lily_token_trie *t = m->t;
    if (tok < 0 || tok >= t->n_vocab || m->cur.finished) return -1;
    gm_pos nx;
    if (t->kind[tok] != LILY_TOK_TEXT && step_token(m, tok, &nx)) {
        hist_push(m);
        m->cur = nx;
        return 0;
    }
    if (t->kind[tok] == LILY_TOK_END) {
        if (!m->cur.accept) return -1;
        hist_push(m);
        m->cur.finished = 1;
        return 0;
    }
    if (t->kind[tok] != LILY_TOK_TEXT) return -1;
    hist_push(m);
    if (lily_gmatch_accept_bytes(m, t->data + t->off[tok], t->len[tok])) {
        m->n_hist--;
        return -1;
    }
    if (m->top > m->compact_at || m->cfg_top > m->cfg_cap / 2) {
        compact(m);
        if (m->cfg_top > m->cfg_cap / 4) grow_cfg(m, m->cfg_cap * 2);
    }
    return 0;
}

int lily_gmatch_rollback(lily_gmatch *m, int n) {
    int k = n < m->n_hist ? n : m->n_hist;
    if (k <= 0) return 0;
    m->n_hist -= k;
    m->cur = m->hist[m->n_hist];
    lily_gm_restore(m, &m->cur);
    return k;
}

int lily_gmatch_is_accepting(const lily_gmatch *m) {
    return m->cur.accept && !m->cur.finished;
}

int lily_gmatch_is_finished(const lily_gmatch *m) {
    return m->cur.finished;
}

int lily_gmatch_is_done(const lily_gmatch *m) {
    return m->cur.finished || m->cur.cfg_n == 0;
}

void lily_gmatch_get_stats(const lily_gmatch *m, lily_gmatch_stats *s) {
    *s = m->stats;
}
