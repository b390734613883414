/* Prefix cache of session snapshots (api.md §9): each entry is a lily_snapshot together with the
 * token sequence it has consumed. A new prompt resumes from the longest entry whose tokens are a
 * prefix of it, and only the rest is prefilled. Snapshots of a hybrid model cannot be truncated
 * (the recurrent state has absorbed every token), so only entries that are whole prefixes count.
 * Entries are evicted least-recently-used first to keep the total snapshot bytes under a budget.
 * Not thread-safe: owned by the one inference thread. */
#ifndef LILY_GEN_PCACHE_H
#define LILY_GEN_PCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"

typedef struct lily_pcache lily_pcache;

lily_pcache *lily_pcache_create(size_t budget_bytes);
void lily_pcache_free(lily_pcache *c);

/* The entry with the longest token prefix of ids[0..n) (at most max_len tokens), or NULL.
 * *len receives its length. The snapshot is borrowed until the next insert. */
const lily_snapshot *lily_pcache_lookup(lily_pcache *c, const int32_t *ids, int n, int max_len,
                                        int *len);

/* Does an entry for exactly ids[0..n) exist? (Lets callers skip taking a snapshot.) */
int lily_pcache_has(const lily_pcache *c, const int32_t *ids, int n);

/* Stores snap (ownership passes to the cache, which may free it at once if it does not fit) for
 * the tokens ids[0..n), replacing an entry with the same tokens. */
void lily_pcache_insert(lily_pcache *c, const int32_t *ids, int n, lily_snapshot *snap);

/* Entries and bytes held, for /metrics. */
int lily_pcache_count(const lily_pcache *c);
size_t lily_pcache_bytes(const lily_pcache *c);

#endif
