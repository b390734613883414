/* Streaming detokenizer: turns ids into text one at a time without ever emitting a broken UTF-8
 * sequence. A token may end in the middle of a multi-byte character (byte-level BPE splits
 * characters freely); those bytes are held until the next token completes them. Bytes that can
 * never become valid are replaced by U+FFFD exactly as lily_tokenizer_decode does, so the pieces
 * of a stream always concatenate to the decode of the whole sequence. */
#ifndef LILY_TOKENIZER_DETOK_H
#define LILY_TOKENIZER_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"

typedef struct lily_tokenizer lily_tokenizer;
typedef struct lily_detok lily_detok;

/* Creates a stream over tok, which must outlive it. Free with lily_detok_free. */
int lily_detok_create(const lily_tokenizer *tok, lily_detok **out, lily_err *e);

/* Appends token id. *text / *len receive the newly completed text (possibly empty), borrowed
 * from the stream and valid until its next call. Fails (changing nothing) on an id outside
 * [0, vocab_size). */
int lily_detok_push(lily_detok *d, int32_t id, const char **text, size_t *len, lily_err *e);

/* Ends the stream: an incomplete tail becomes U+FFFD. Returns the final text as push does, and
 * leaves the stream empty, ready for a new sequence. */
void lily_detok_flush(lily_detok *d, const char **text, size_t *len);

/* Drops any held bytes without emitting them. */
void lily_detok_reset(lily_detok *d);

void lily_detok_free(lily_detok *d);

#endif
