/* One argument parser for every lily subcommand (tools/args.c). A command declares its options
 * in a table of lily_arg (ended by an entry with name NULL); lily_args_parse() walks argv,
 * stores each value through its entry's pointer, and answers every mistake with one message
 * on stderr and exit code 2:
 *   lily CMD: unknown option '--bogus' (see lily CMD --help)
 *   lily CMD: option '--model' needs a value
 *   lily CMD: --port takes an integer from 0 to 65535, not '99999'
 *   lily CMD: --think takes on|off, not 'maybe'
 * -h / --help prints the usage to stdout (exit 0). */
#ifndef LILY_TOOLS_ARGS_H
#define LILY_TOOLS_ARGS_H

#include <stdio.h>

typedef enum {
    LILY_ARG_FLAG,  /* no value; *(int *)dst = 1 */
    LILY_ARG_STR,   /* *(const char **)dst = value */
    LILY_ARG_INT,   /* *(int *)dst, an integer (K and M suffixes taken) within [lo, hi] */
    LILY_ARG_LONG,  /* *(long *)dst, the same */
    LILY_ARG_FLOAT, /* *(double *)dst, a number within [lo, hi] */
    LILY_ARG_SIZE,  /* *(long *)dst, a size such as 512, 4K, 1M within [lo, hi] */
    LILY_ARG_ENUM,  /* *(int *)dst = the index of the value in values (NULL-terminated) */
    LILY_ARG_FN,    /* fn(ud, value): 0, or -1 after printing why the value is bad */
} lily_arg_kind;

typedef struct lily_arg {
    const char *name;  /* "--temp" */
    const char *alias; /* "-n", or NULL */
    lily_arg_kind kind;
    void *dst;
    double lo, hi;             /* the allowed range of INT, LONG, FLOAT and SIZE */
    const char *const *values; /* ENUM's allowed values, NULL-terminated */
    int (*fn)(void *ud, const char *v);
    void *ud;
    int *set; /* when not NULL: set to 1 when the option is given */
    const char *help;
} lily_arg;

/* Parses argv (argc of them, after the subcommand name) against the tables tabs (ntabs of them,
 * each ended by name == NULL). Arguments that are no option (not starting with '-', or "-")
 * are positional: stored in pos[0..max_pos) with their count in *n_pos (pos may be NULL when
 * the command takes none). usage(f) prints the command's usage. Returns 0 to go on, 1 when
 * --help was printed (the command returns 0), 2 after a message (the command returns 2). */
int lily_args_parse(const char *cmd, const lily_arg *const *tabs, int ntabs, int argc, char **argv,
                    const char **pos, int max_pos, int *n_pos, void (*usage)(FILE *f));

/* The exit code for lily_args_parse()'s result r: 0 for help, r otherwise. */
static inline int lily_args_exit(int r) {
    return r == 1 ? 0 : r;
}

#endif
