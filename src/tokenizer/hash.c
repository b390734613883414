/* Byte-string hash and the merge-pair map (see hash.h). */
#include "tokenizer/hash.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

uint64_t lily_tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xD6E8FEB86659FD93ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = 0;
        memcpy(&v, s, n);
        h = (h ^ v) * 0x94D049BB133111EBull;
    }
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

static void pairmap_grow(lily_pairmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *keys = lily_xmalloc(cap * sizeof *keys), *vals = lily_xmalloc(cap * sizeof *vals);
    memset(keys, 0xFF, cap * sizeof *keys);
    for (size_t j = 0; j < m->cap; j++) {
        uint64_t k = m->keys[j];
        if (k == UINT64_MAX) continue;
        size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 29) & (cap - 1);
        while (keys[i] != UINT64_MAX)
            i = (i + 1) & (cap - 1);
        keys[i] = k;
        vals[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
}

int lily_pairmap_put(lily_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    /* Keep the load at or below 1/2 so probe chains stay short. */
    if ((m->count + 1) * 2 > m->cap) pairmap_grow(m);
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 29) & mask;
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == k) return -1;
        i = (i + 1) & mask;
    }
    m->keys[i] = k;
    m->vals[i] = ((uint64_t)(uint32_t)rank << 32) | (uint32_t)merged;
    m->count++;
    return 0;
}

void lily_pairmap_free(lily_pairmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
