/* The argument parser every subcommand uses (tools/args.h). */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const lily_arg *find(const lily_arg *const *tabs, int ntabs, const char *a) {
    for (int t = 0; t < ntabs; t++)
        for (const lily_arg *o = tabs[t]; o->name; o++)
            if (!strcmp(a, o->name) || (o->alias && !strcmp(a, o->alias))) return o;
    return NULL;
}

/* Parses v as an integer (with a K/M suffix when size), 0 or -1. */
static int parse_int(const char *v, int size, double *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v) return -1;
    if (size && (*end == 'k' || *end == 'K')) {
        x *= 1024;
        end++;
    } else if (size && (*end == 'm' || *end == 'M')) {
        x *= 1024 * 1024;
        end++;
    }
    if (*end) return -1;
    *out = (double)x;
    return 0;
}

static void range_msg(const char *cmd, const char *a, const lily_arg *o, const char *v) {
    const char *what = o->kind == LILY_ARG_FLOAT  ? "a number"
                       : o->kind == LILY_ARG_SIZE ? "a size (such as 512, 4K, 1M)"
                                                  : "an integer";
    if (o->kind == LILY_ARG_FLOAT)
        fprintf(stderr, "lily %s: %s takes %s from %g to %g, not '%s'\n", cmd, a, what, o->lo,
                o->hi, v);
    else
        fprintf(stderr, "lily %s: %s takes %s from %.0f to %.0f, not '%s'\n", cmd, a, what, o->lo,
                o->hi, v);
}

static int store(const char *cmd, const char *a, const lily_arg *o, const char *v) {
    double x = 0;
    switch (o->kind) {
    case LILY_ARG_FLAG: *(int *)o->dst = 1; break;
    case LILY_ARG_STR: *(const char **)o->dst = v; break;
    case LILY_ARG_INT:
    case LILY_ARG_LONG:
    case LILY_ARG_SIZE:
        if (parse_int(v, 1, &x) || x < o->lo || x > o->hi) {
            range_msg(cmd, a, o, v);
            return 2;
        }
        if (o->kind == LILY_ARG_INT)
            *(int *)o->dst = (int)x;
        else
            *(long *)o->dst = (long)x;
        break;
    case LILY_ARG_FLOAT: {
        char *end = NULL;
        errno = 0;
        x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < o->lo || x > o->hi) {
            range_msg(cmd, a, o, v);
            return 2;
        }
        *(double *)o->dst = x;
        break;
    }
    case LILY_ARG_ENUM: {
        int i = 0;
        for (; o->values[i]; i++)
            if (!strcmp(v, o->values[i])) break;
        if (!o->values[i]) {
            fprintf(stderr, "lily %s: %s takes ", cmd, a);
            for (int j = 0; o->values[j]; j++)
                fprintf(stderr, "%s%s", j ? "|" : "", o->values[j]);
            fprintf(stderr, ", not '%s'\n", v);
            return 2;
        }
        *(int *)o->dst = i;
        break;
    }
    case LILY_ARG_FN:
        if (o->fn(o->ud, v)) return 2;
        break;
    }
    if (o->set) *o->set = 1;
    return 0;
}

int lily_args_parse(const char *cmd, const lily_arg *const *tabs, int ntabs, int argc, char **argv,
                    const char **pos, int max_pos, int *n_pos, void (*usage)(FILE *f)) {
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (a[0] != '-' || !a[1]) {
            if (np >= max_pos) {
                fprintf(stderr, "lily %s: unexpected argument '%s' (see lily %s --help)\n", cmd, a,
                        cmd);
                return 2;
            }
            pos[np++] = a;
            continue;
        }
        const lily_arg *o = find(tabs, ntabs, a);
        if (!o) {
            fprintf(stderr, "lily %s: unknown option '%s' (see lily %s --help)\n", cmd, a, cmd);
            return 2;
        }
        const char *v = NULL;
        if (o->kind != LILY_ARG_FLAG) {
            if (i + 1 >= argc) {
                fprintf(stderr, "lily %s: option '%s' needs a value (see lily %s --help)\n", cmd, a,
                        cmd);
                return 2;
            }
            v = argv[++i];
        }
        const int r = store(cmd, a, o, v);
        if (r) return r;
    }
    if (n_pos) *n_pos = np;
    return 0;
}
