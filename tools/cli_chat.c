/* Option parsing shared by `lily run`, `lily chat` and `lily generate`. */
#include "cli_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int lily_chat_arg(const char *a, const char *v, lily_clichat_opts *co, lily_chat_args *g) {
    long x;
    if (!strcmp(a, "--model"))
        co->model_dir = v;
    else if (!strcmp(a, "--temp"))
        g->temp = atof(v);
    else if (!strcmp(a, "--top-p"))
        g->top_p = atof(v);
    else if (!strcmp(a, "--min-p"))
        g->min_p = atof(v);
    else if (!strcmp(a, "-n") || !strcmp(a, "--top-k") || !strcmp(a, "--seed") ||
             !strcmp(a, "--ctx") || !strcmp(a, "--threads")) {
        if (lily_cli_size(v, &x) || (!strcmp(a, "-n") && x < 1) || (!strcmp(a, "--ctx") && x < 2)) {
            fprintf(stderr, "lily: bad value for %s: '%s'\n", a, v);
            return -1;
        }
        if (!strcmp(a, "-n"))
            g->n_new = (int)x;
        else if (!strcmp(a, "--top-k"))
            g->top_k = x;
        else if (!strcmp(a, "--seed"))
            g->seed = x, g->seed_set = 1;
        else if (!strcmp(a, "--ctx"))
            co->ctx = (int)x;
        else
            co->threads = (int)x;
    } else if (!strcmp(a, "--think")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            fprintf(stderr, "lily: --think takes on or off, not '%s'\n", v);
            return -1;
        }
        g->think = !strcmp(v, "on");
    } else if (!strcmp(a, "--backend")) {
        if (lily_cli_backend(v, &co->backend)) return -1;
    } else {
        lily_engine_opts eo = {
            .precision = co->precision, .cpu_isa = co->cpu_isa, .sample_on = co->sample_on};
        const int r = lily_cli_engine_arg(a, v, &eo);
        co->precision = eo.precision, co->cpu_isa = eo.cpu_isa, co->sample_on = eo.sample_on;
        return r;
    }
    return 1;
}
