/* Option tables shared by `lily run`, `lily chat` and `lily generate`. */
#include "cli_chat.h"

#include <limits.h>

static const char *const on_off[] = {"off", "on", NULL};

lily_arg *lily_chat_table(lily_clichat_opts *co, lily_chat_args *g, int no_think) {
    lily_arg *t = g->tab;
    int n = 0;
    t[n++] = (lily_arg){.name = "--model",
                        .kind = LILY_ARG_STR,
                        .dst = &co->model_dir,
                        .help = "model directory or hub OWNER/NAME[:REVISION]"};
    t[n++] = (lily_arg){.name = "--temp",
                        .kind = LILY_ARG_FLOAT,
                        .dst = &g->temp,
                        .lo = 0,
                        .hi = 100,
                        .help = "temperature"};
    t[n++] = (lily_arg){.name = "--top-p",
                        .kind = LILY_ARG_FLOAT,
                        .dst = &g->top_p,
                        .lo = 0,
                        .hi = 1,
                        .help = "nucleus sampling"};
    t[n++] = (lily_arg){.name = "--min-p",
                        .kind = LILY_ARG_FLOAT,
                        .dst = &g->min_p,
                        .lo = 0,
                        .hi = 1,
                        .help = "min-p sampling"};
    t[n++] = (lily_arg){.name = "--top-k",
                        .kind = LILY_ARG_LONG,
                        .dst = &g->top_k,
                        .lo = 0,
                        .hi = INT_MAX,
                        .help = "top-k sampling (0: off)"};
    t[n++] = (lily_arg){.name = "--seed",
                        .kind = LILY_ARG_LONG,
                        .dst = &g->seed,
                        .lo = 0,
                        .hi = (double)LONG_MAX,
                        .set = &g->seed_set,
                        .help = "random seed"};
    t[n++] = (lily_arg){.name = "-n",
                        .kind = LILY_ARG_INT,
                        .dst = &g->n_new,
                        .lo = 1,
                        .hi = INT_MAX,
                        .help = "max new tokens"};
    t[n++] = (lily_arg){.name = "--ctx",
                        .kind = LILY_ARG_INT,
                        .dst = &co->ctx,
                        .lo = 2,
                        .hi = INT_MAX,
                        .help = "context length (such as 4K)"};
    if (!no_think)
        t[n++] = (lily_arg){.name = "--think",
                            .kind = LILY_ARG_ENUM,
                            .dst = &g->think,
                            .values = on_off,
                            .help = "thinking switch"};
    t[n] = (lily_arg){0};
    return t;
}

void lily_chat_apply(const lily_chat_args *g, lily_clichat_opts *co) {
    co->backend = (lily_backend_kind)g->eng.backend;
    co->threads = g->eng.threads;
    co->precision = (lily_precision)g->eng.precision;
    co->cpu_isa = (lily_cpu_isa)g->eng.cpu_isa;
    co->sample_on = (lily_sample_on)g->eng.sample_on;
}
