/* The check macro shared by the C tests: counts passes and failures and prints each failure
 * with its file and line. A test ends with printf("%d passed, %d failed\n", n_pass, n_fail). */
#ifndef LILY_TESTS_CHECK_H
#define LILY_TESTS_CHECK_H

#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#endif
