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
    if (!strcmp(s, "cpu"))
        *out = LILY_BACKEND_CPU;
    else if (!strcmp(s, "cuda"))
        *out = LILY_BACKEND_CUDA;
    else {
        fprintf(stderr, "lily: unknown backend '%s' (cpu or cuda)\n", s);
        return -1;
    }
    return 0;
}

/* The index of v in names (n of them), or -1 with a message naming option a. */
static int pick(const char *a, const char *v, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) return i;
    fprintf(stderr, "lily: %s takes", a);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i ? "|" : " ", names[i]);
    fprintf(stderr, ", not '%s'\n", v);
    return -1;
}

int lily_cli_engine_arg(const char *a, const char *v, lily_engine_opts *o) {
    /* each list names its enum's values in order (lily.h) */
    static const char *const prec[] = {"default", "exact", "fast"};
    static const char *const isa[] = {"auto", "avx512", "avx2", "scalar"};
    static const char *const on[] = {"auto", "device", "host"};
    int i;
    if (!strcmp(a, "--precision")) {
        if ((i = pick(a, v, prec, 3)) < 0) return -1;
        o->precision = (lily_precision)i;
    } else if (!strcmp(a, "--cpu-isa")) {
        if ((i = pick(a, v, isa, 4)) < 0) return -1;
        o->cpu_isa = (lily_cpu_isa)i;
    } else if (!strcmp(a, "--sample-on")) {
        if ((i = pick(a, v, on, 3)) < 0) return -1;
        o->sample_on = (lily_sample_on)i;
    } else {
        return 0;
    }
    return 1;
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
