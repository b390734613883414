/* Argument helpers shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

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

int lily_cli_backend(const char *s, lily_backend_kind *out) {
    if (!strcmp(s, "cpu")) *out = LILY_BACKEND_CPU;
    else if (!strcmp(s, "cuda")) *out = LILY_BACKEND_CUDA;
    else {
        fprintf(stderr, "lily: unknown backend '%s' (cpu or cuda)\n", s);
        return -1;
    }
    return 0;
}

int lily_cli_read_tokens(const char *path, int32_t **out, int *n) {
    lily_err e;
    char *buf = NULL;
    size_t len = 0;
    if (lily_read_file(path, (size_t)1 << 30, &buf, &len, &e) != 0) {
        fprintf(stderr, "lily: %s\n", e.msg);
        return -1;
    }
    if (len % 4 != 0 || len == 0) {
        fprintf(stderr, "lily: %s: %zu bytes is not a non-empty array of int32 tokens\n", path,
                len);
        free(buf);
        return -1;
    }
    *n = (int)(len / 4);
    *out = malloc(len);
    for (int i = 0; i < *n; i++) {
        const unsigned char *p = (const unsigned char *)buf + 4 * (size_t)i;
        (*out)[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
    }
    free(buf);
    return 0;
}
