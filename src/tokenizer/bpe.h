/* The BPE model: merges applied by rank to the bytes of one pre-tokenized word.
 *
 * A word starts as one symbol per byte (the byte-level alphabet guarantees a token for each);
 * then the adjacent pair with the lowest merge rank is merged, leftmost first on ties, until no
 * adjacent pair is a merge. This is the order HF tokenizers uses. Short words use a scan over a
 * cached rank per pair; long ones a binary heap, so a 100 KB word without spaces stays
 * O(n log n). Results are cached per word, which is what makes real text fast: most words repeat.
 * The cache makes lily_bpe_word mutate the object, so callers serialize it. */
#ifndef LILY_TOKENIZER_BPE_H
#define LILY_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "tokenizer/hash.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

typedef struct lily_bpe_cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len; /* word bytes in keys */
    uint32_t ids_off, ids_n;   /* result in ids */
} lily_bpe_cache_entry;

typedef struct lily_bpe {
    int32_t byte_id[256]; /* id of the one-character token for each byte */
    lily_pairmap merges;  /* (left id, right id) -> (rank, merged id) */
    int ignore_merges;    /* HF option: a word that is itself a token is taken whole */
    /* word cache: open addressing over entry indices (+1, 0 = empty) */
    uint32_t *slots;
    size_t slot_cap;
    lily_bpe_cache_entry *ent;
    size_t n_ent, cap_ent;
    lily_u8buf keys;
    lily_ids ids;
    /* scratch reused across words */
    int32_t *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    lily_u8buf mapped;
} lily_bpe;

/* Looks up the token of every byte (fails naming the first byte without one). */
int lily_bpe_init(lily_bpe *b, const lily_vocab *v, lily_err *e);

/* Adds merge (left, right) with the given rank; both and their concatenation must be tokens. */
int lily_bpe_add_merge(lily_bpe *b, const lily_vocab *v, const char *l, size_t ln, const char *r,
                       size_t rn, int32_t rank, lily_err *e);

/* Appends the ids of word w[0..n) (n >= 1) to out. */
void lily_bpe_word(lily_bpe *b, const lily_vocab *v, const unsigned char *w, size_t n,
                   lily_ids *out);

/* Merges the symbols sym[0..*n) in place (exposed so tests can check the scan and the heap
 * strategies against each other): use_heap 0 = scan (n must be <= LILY_BPE_SCAN_MAX), 1 = heap. */
#define LILY_BPE_SCAN_MAX 64
void lily_bpe_merge(lily_bpe *b, int32_t *sym, size_t *n, int use_heap);

void lily_bpe_free(lily_bpe *b);

#endif
