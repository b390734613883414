/* Options that `lily run`, `lily chat` and `lily generate` share (tools/cli_chat.c). */
#ifndef LILY_TOOLS_CLI_CHAT_H
#define LILY_TOOLS_CLI_CHAT_H

#include "cli.h"
#include "clichat.h"

typedef struct lily_chat_args {
    int n_new; /* -n: tokens to generate per turn */
    int think; /* --think on|off; -1 = the template's default */
    int seed_set;
    double temp, top_p, min_p; /* < 0: the model's generation defaults */
    long top_k, seed;          /* top_k < 0: default */
    lily_cli_engine eng;       /* --backend --threads --precision --cpu-isa --sample-on */
    lily_arg tab[10];          /* the table lily_chat_table() fills */
} lily_chat_args;

/* Fills g->tab (for lily_args_parse) with --model (into co->model_dir) --temp --top-p --min-p
 * --top-k --seed -n --ctx (into co->ctx), and --think unless no_think; returns g->tab. The
 * engine options are a second table (lily_cli_engine_table over g->eng); lily_chat_apply()
 * copies them into co after parsing. */
lily_arg *lily_chat_table(lily_clichat_opts *co, lily_chat_args *g, int no_think);
void lily_chat_apply(const lily_chat_args *g, lily_clichat_opts *co);

#endif
