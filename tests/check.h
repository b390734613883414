/* The check macro shared by the C tests: counts passes and failures and prints each failure
 * with its file and line. A test ends with printf("%d passed, %d failed\n", n_pass, n_fail). */
#ifndef LILY_TESTS_CHECK_H
#define LILY_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                \
    do {                                                \
        if (cond) {                                     \
            n_pass++;                                   \
        } else {                                        \
            n_fail++;                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

/* The same as a function with a label: prints "PASS what" or "FAIL what: details". */
static void check(int ok, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), unused));
static void check(int ok, const char *what, const char *fmt, ...) {
    if (ok)
        n_pass++;
    else
        n_fail++;
    printf("%s %s", ok ? "PASS" : "FAIL", what);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        printf(": ");
        vprintf(fmt, ap);
        va_end(ap);
    }
    printf("\n");
}

#endif
