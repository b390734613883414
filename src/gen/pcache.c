/* Prefix cache of snapshots (see pcache.h). A linear list: entries number in the tens, and a
 * lookup costs a memcmp of the prompt per entry, which is nothing next to a prefill. */
#include "gen/pcache.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

typedef struct entry {
    int32_t *ids;
    int n;
    lily_snapshot *snap;
    size_t bytes;
    uint64_t used; /* LRU clock */
} entry;

struct lily_pcache {
    entry *e;
    int n, cap;
    size_t budget, bytes;
    uint64_t clock;
};

lily_pcache *lily_pcache_create(size_t budget_bytes) {
    lily_pcache *c = lily_xcalloc(1, sizeof *c);
    c->budget = budget_bytes;
    return c;
}

static void drop(lily_pcache *c, int i) {
    c->bytes -= c->e[i].bytes;
    lily_snapshot_free(c->e[i].snap);
    free(c->e[i].ids);
    c->e[i] = c->e[--c->n];
}

void lily_pcache_free(lily_pcache *c) {
    if (!c) return;
    while (c->n)
        drop(c, c->n - 1);
    free(c->e);
    free(c);
}

const lily_snapshot *lily_pcache_lookup(lily_pcache *c, const int32_t *ids, int n, int max_len,
                                        int *len) {
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        const entry *x = &c->e[i];
        if (x->n > n || x->n > max_len || (best >= 0 && x->n <= c->e[best].n)) continue;
        if (!memcmp(x->ids, ids, (size_t)x->n * sizeof *ids)) best = i;
    }
    *len = best >= 0 ? c->e[best].n : 0;
    if (best < 0) return NULL;
    c->e[best].used = ++c->clock;
    return c->e[best].snap;
}

int lily_pcache_has(const lily_pcache *c, const int32_t *ids, int n) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].n == n && !memcmp(c->e[i].ids, ids, (size_t)n * sizeof *ids)) return 1;
    return 0;
}

void lily_pcache_insert(lily_pcache *c, const int32_t *ids, int n, lily_snapshot *snap) {
    size_t bytes = lily_snapshot_bytes(snap) + (size_t)n * sizeof *ids;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].n == n && !memcmp(c->e[i].ids, ids, (size_t)n * sizeof *ids)) drop(c, i--);
    if (bytes > c->budget) {
        lily_snapshot_free(snap);
        return;
    }
    while (c->n && c->bytes + bytes > c->budget) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[lru].used) lru = i;
        drop(c, lru);
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->e = lily_xrealloc(c->e, (size_t)c->cap * sizeof *c->e);
    }
    entry *x = &c->e[c->n++];
    x->ids = lily_xmalloc((size_t)(n ? n : 1) * sizeof *ids);
    memcpy(x->ids, ids, (size_t)n * sizeof *ids);
    x->n = n;
    x->snap = snap;
    x->bytes = bytes;
    x->used = ++c->clock;
    c->bytes += bytes;
}

int lily_pcache_count(const lily_pcache *c) {
    return c->n;
}
size_t lily_pcache_bytes(const lily_pcache *c) {
    return c->bytes;
}
