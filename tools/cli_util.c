/* Argument helpers shared by the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

#include "cli.h"

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

void lily_cli_engine_table(lily_cli_engine *e, lily_arg t[LILY_CLI_ENGINE_N]) {
    /* each list names its enum's values in order (lily.h) */
    static const char *const backend[] = {"cpu", "cuda", NULL};
    static const char *const prec[] = {"default", "exact", "fast", NULL};
    static const char *const isa[] = {"auto", "avx512", "avx2", "scalar", NULL};
    static const char *const on[] = {"auto", "device", "host", NULL};
    t[0] = (lily_arg){.name = "--backend",
                      .kind = LILY_ARG_ENUM,
                      .dst = &e->backend,
                      .values = backend,
                      .help = "cpu|cuda"};
    t[1] = (lily_arg){.name = "--threads",
                      .kind = LILY_ARG_INT,
                      .dst = &e->threads,
                      .lo = 0,
                      .hi = 4096,
                      .help = "CPU threads (0: all cores)"};
    t[2] = (lily_arg){.name = "--precision",
                      .kind = LILY_ARG_ENUM,
                      .dst = &e->precision,
                      .values = prec,
                      .help = "default|exact|fast"};
    t[3] = (lily_arg){.name = "--cpu-isa",
                      .kind = LILY_ARG_ENUM,
                      .dst = &e->cpu_isa,
                      .values = isa,
                      .help = "auto|avx512|avx2|scalar"};
    t[4] = (lily_arg){.name = "--sample-on",
                      .kind = LILY_ARG_ENUM,
                      .dst = &e->sample_on,
                      .values = on,
                      .help = "auto|device|host"};
    t[5] = (lily_arg){0};
}

void lily_cli_engine_apply(const lily_cli_engine *e, lily_engine_opts *o) {
    o->backend = (lily_backend_kind)e->backend;
    o->n_threads = e->threads;
    o->precision = (lily_precision)e->precision;
    o->cpu_isa = (lily_cpu_isa)e->cpu_isa;
    o->sample_on = (lily_sample_on)e->sample_on;
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
