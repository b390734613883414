/* Hashing for the tokenizer's tables: a fast 64-bit byte-string hash and an open-addressing map
 * from a pair of token ids to (merge rank, merged id). Both sit on the hot path of encoding, so
 * the map probes linearly over flat arrays with no per-entry allocation. */
#ifndef LILY_TOKENIZER_HASH_H
#define LILY_TOKENIZER_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t lily_tok_hash(const void *p, size_t n);

typedef struct lily_pairmap {
    uint64_t *keys; /* (a << 32 | b), UINT64_MAX = empty; cap entries */
    uint64_t *vals; /* (rank << 32 | merged id) */
    size_t cap;     /* power of two */
    size_t count;
} lily_pairmap;

/* Inserts (a, b) -> (rank, merged). Returns 0, or -1 if the pair is already present (the
 * existing entry is kept). */
int lily_pairmap_put(lily_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* Returns 1 and fills *rank, *merged if (a, b) is a merge; else 0. */
static inline int lily_pairmap_get(const lily_pairmap *m, int32_t a, int32_t b, int32_t *rank,
                                   int32_t *merged) {
    if (!m->cap) return 0;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h >> 29) & mask;
    for (;;) {
        uint64_t kk = m->keys[i];
        if (kk == k) {
            *rank = (int32_t)(m->vals[i] >> 32);
            *merged = (int32_t)(uint32_t)m->vals[i];
            return 1;
        }
        if (kk == UINT64_MAX) return 0;
        i = (i + 1) & mask;
    }
}
void lily_pairmap_free(lily_pairmap *m);

#endif
