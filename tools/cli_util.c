/* Argument helpers shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

const char *lily_cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "lily: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

int lily_cli_size(const char *s, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || v < 0) return -1;
    if (*end == 'k' || *end == 'K') {
        v *= 1024;
        end++;
    } else if (*end == 'm' || *end == 'M') {
        v *= 1024 * 1024;
        end++;
    }
    if (*end) return -1;
    *out = v;
    return 0;
}
