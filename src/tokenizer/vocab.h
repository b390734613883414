/* The token table of a tokenizer: id -> token string (as written in tokenizer.json), id -> the
 * bytes the token decodes to, id -> flags (added, special), and a hash from token string to id.
 * Also the GPT-2 "byte-level" alphabet that maps each byte to a printable code point, since the
 * vocabulary strings are written in it. */
#ifndef LILY_TOKENIZER_VOCAB_H
#define LILY_TOKENIZER_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "tokenizer/utf8.h"

enum {
    LILY_VOCAB_PRESENT = 1, /* the id has a token (ids may have holes) */
    LILY_VOCAB_ADDED = 2,   /* from "added_tokens": matched in text before the model runs */
    LILY_VOCAB_SPECIAL = 4, /* an added token flagged "special" */
};

#define LILY_VOCAB_MAX_ID (1 << 24) /* ids must be below this */

typedef struct lily_vocab {
    int32_t n;                   /* highest id + 1 */
    size_t cap_ids;              /* allocated entries in the per-id arrays */
    uint32_t *str_off, *str_len; /* [cap_ids] token string in strs */
    uint32_t *dec_off, *dec_len; /* [cap_ids] decoded bytes in decs (after lily_vocab_finish) */
    uint8_t *flags;              /* [cap_ids] LILY_VOCAB_* */
    lily_u8buf strs, decs;       /* string storage */
    /* string -> id hashes: id + 1 per slot, 0 = empty. Added tokens have their own, because HF
     * keeps them apart: an added token may spell the same string as a model token (which merges
     * keep referring to) and then wins in token_to_id. */
    struct lily_vocab_map {
        uint32_t *slot;
        size_t cap, count;
    } model_map, added_map;
} lily_vocab;

/* Adds token s[0..n) with the given id (an added token when flags has LILY_VOCAB_ADDED).
 * Re-adding an id with the same string only ORs the flags (added tokens often repeat vocabulary
 * entries); a different string for a present id, or the same string under two ids of the same
 * kind, is an error. */
int lily_vocab_add(lily_vocab *v, int32_t id, const char *s, size_t n, unsigned flags, lily_err *e);

/* The id of model token s[0..n) (added tokens not considered), or -1. */
int32_t lily_vocab_find(const lily_vocab *v, const char *s, size_t n);

/* The id of token s[0..n), added tokens first (HF token_to_id), or -1. */
int32_t lily_vocab_find_any(const lily_vocab *v, const char *s, size_t n);

/* Computes every token's decoded bytes the way the HF ByteLevel decoder does: map each character
 * back through the byte-level alphabet; a token with a character outside the alphabet decodes to
 * its own UTF-8 bytes. HF sends added tokens through the same decoder, so an added token spelled
 * only with alphabet characters (e.g. "\u00e9t\u00e9") decodes to raw bytes, not to its text;
 * that is an HF quirk (tokenizers issues #1392, #1996) kept here for parity. Qwen's added tokens
 * are ASCII, which decodes to itself either way. */
void lily_vocab_finish(lily_vocab *v);

void lily_vocab_free(lily_vocab *v);

/* The byte-level alphabet: the code point standing for byte b, and the byte a code point stands
 * for (-1 if it is not in the alphabet). */
uint32_t lily_bytelevel_cp(unsigned b);
int lily_bytelevel_byte(uint32_t cp);

#endif
