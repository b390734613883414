/* A growable byte string for building JSON bodies, SSE events and parser output.
 *
 * The buffer is always NUL-terminated (data may be NULL only while cap is 0, and lily_sb_str
 * returns "" then), so it can be handed to C string functions at any time. Allocation failure
 * aborts (lily_x* allocators), so appends cannot fail. */
#ifndef LILY_GEN_SB_H
#define LILY_GEN_SB_H

#include <stdarg.h>
#include <stddef.h>

typedef struct lily_sb {
    char *data; /* NUL-terminated once anything was appended; owned */
    size_t len; /* bytes, not counting the NUL */
    size_t cap; /* bytes allocated */
} lily_sb;

void lily_sb_append(lily_sb *b, const char *s, size_t n);
void lily_sb_puts(lily_sb *b, const char *s);
void lily_sb_putc(lily_sb *b, char c);
void lily_sb_printf(lily_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as the body of a JSON string (no quotes): escapes ", \ and control bytes,
 * leaves UTF-8 unescaped. */
void lily_sb_json_esc(lily_sb *b, const char *s, size_t n);
/* Appends s as a quoted JSON string. */
void lily_sb_json_str(lily_sb *b, const char *s, size_t n);
/* Removes the first n bytes. */
void lily_sb_drop_front(lily_sb *b, size_t n);
void lily_sb_clear(lily_sb *b);
/* The contents as a C string (never NULL); borrowed. */
const char *lily_sb_str(const lily_sb *b);
/* Hands the buffer over to the caller (free with free(); never NULL) and empties b. */
char *lily_sb_take(lily_sb *b);
void lily_sb_free(lily_sb *b);

#endif
