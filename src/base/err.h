/* Error reporting: a message buffer filled by the failing call, and always-on assertions.
 *
 * Recoverable failures (files, user input, requests) return -1 and write a message into a
 * caller-supplied lily_err; invariants use LILY_ASSERT, which is never compiled out. */
#ifndef LILY_BASE_ERR_H
#define LILY_BASE_ERR_H

#include "lily.h"

/* Formats a message into e (if non-NULL) and returns -1, so callers can `return lily_fail(...)`. */
int lily_fail(lily_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the message already in e with "prefix: " (used to add a file or tensor name). */
int lily_fail_prefix(lily_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

_Noreturn void lily_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LILY_ASSERT(cond)                                                           \
    do {                                                                            \
        if (!(cond)) lily_abort(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

/* Allocation that aborts on failure: out-of-memory is not something a caller can fix up. */
void *lily_xmalloc(size_t n);
void *lily_xcalloc(size_t n, size_t size);
void *lily_xrealloc(void *p, size_t n);
char *lily_xstrdup(const char *s);
/* 64-byte aligned allocation (free with free()). */
void *lily_xaligned(size_t n);

#endif
