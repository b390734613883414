/* Options that `lily run`, `lily chat` and `lily generate` share (tools/cli_chat.c). */
#ifndef LILY_TOOLS_CLI_CHAT_H
#define LILY_TOOLS_CLI_CHAT_H

#include "clichat.h"

typedef struct lily_chat_args {
    int n_new; /* -n: tokens to generate per turn */
    int think; /* --think on|off; -1 = the template's default */
    int seed_set;
    double temp, top_p, min_p; /* < 0: the model's generation defaults */
    long top_k, seed;          /* top_k < 0: default */
} lily_chat_args;

/* Parses option a with value v into co / g: --model --temp --top-p --min-p --top-k --seed -n
 * --think --ctx --threads --backend, and the engine options (lily_cli_engine_arg: --precision
 * --cpu-isa --sample-on). Returns 1 when a was one of these, 0 when it is not, -1 when
 * its value is bad (a message is printed). */
int lily_chat_arg(const char *a, const char *v, lily_clichat_opts *co, lily_chat_args *g);

#endif
