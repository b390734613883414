/* Error buffers, aborting assertions and aborting allocators. */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int lily_fail(lily_err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int lily_fail_prefix(lily_err *e, const char *fmt, ...) {
    if (e) {
        char prefix[256], old[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, e->msg, sizeof old);
        size_t n = strlen(prefix);
        if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
        memcpy(e->msg, prefix, n);
        e->msg[n] = ':';
        e->msg[n + 1] = ' ';
        size_t m = strnlen(old, sizeof old);
        if (m > sizeof e->msg - n - 3) m = sizeof e->msg - n - 3;
        memcpy(e->msg + n + 2, old, m);
        e->msg[n + 2 + m] = 0;
    }
    return -1;
}

void lily_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "lily: fatal at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void *lily_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) lily_abort(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
    return p;
}

void *lily_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) lily_abort(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *lily_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) lily_abort(__FILE__, __LINE__, "out of memory reallocating %zu bytes", n);
    return q;
}

char *lily_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = lily_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void *lily_xaligned(size_t n) {
    void *p = NULL;
    size_t r = (n + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, r ? r : 64) != 0)
        lily_abort(__FILE__, __LINE__, "out of memory allocating %zu aligned bytes", n);
    return p;
}
