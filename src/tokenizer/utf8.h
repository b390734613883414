/* UTF-8 helpers for the tokenizer: strict validation, code point decoding, Unicode whitespace,
 * and lossy decoding that replaces each maximal invalid subpart with U+FFFD (the policy of Rust's
 * String::from_utf8_lossy, which HF tokenizers uses, so our decode output matches byte for byte).
 * Also a small growable byte buffer and id vector shared by the tokenizer files. */
#ifndef LILY_TOKENIZER_UTF8_H
#define LILY_TOKENIZER_UTF8_H

#include <stddef.h>
#include <stdint.h>

typedef struct lily_u8buf {
    unsigned char *p; /* heap, owned; NULL when empty and never grown */
    size_t n, cap;    /* bytes used / allocated */
} lily_u8buf;

void lily_u8buf_put(lily_u8buf *b, const void *s, size_t n);
void lily_u8buf_free(lily_u8buf *b);

typedef struct lily_ids {
    int32_t *p;    /* heap, owned */
    size_t n, cap; /* ids used / allocated */
} lily_ids;

void lily_ids_push(lily_ids *v, int32_t id);

/* Returns the length of the longest valid UTF-8 prefix of s (== n when s is valid). Valid means
 * what Rust's str accepts: no overlongs, no surrogates, nothing above U+10FFFF. */
size_t lily_utf8_valid_prefix(const unsigned char *s, size_t n);

/* Decodes the code point at s, which must be valid UTF-8 with at least one byte; returns its
 * length in bytes (1..4). */
int lily_utf8_decode(const unsigned char *s, uint32_t *cp);

/* Encodes cp (<= 0x10FFFF) into out; returns the byte count. */
int lily_utf8_encode(uint32_t cp, unsigned char out[4]);

/* 1 if cp has the Unicode White_Space property (what Rust's char::is_whitespace and
 * Oniguruma's Unicode \s accept). */
int lily_utf8_is_space(uint32_t cp);

/* Appends s[0..n) to out with every maximal invalid subpart replaced by U+FFFD. When final is 0,
 * a valid but incomplete sequence at the very end is left unconsumed (more bytes may complete
 * it). Returns the number of bytes of s consumed. */
size_t lily_utf8_lossy(const unsigned char *s, size_t n, int final, lily_u8buf *out);

/* Decodes the JSON string literal s[0..n) (with its quotes, surrounding blanks allowed) into
 * out, keeping escaped NULs that cJSON would cut at. Returns 0, or -1 if s is not exactly one
 * valid JSON string (lone surrogate escapes are invalid). */
int lily_utf8_json_string(const char *s, size_t n, lily_u8buf *out);

#endif
