/* Terminal helpers shared by the subcommands: the model-loading bar. */
#include <unistd.h>

#include "base/progress.h"
#include "cli.h"

void lily_cli_load_bar(lily_engine_opts *o) {
    static lily_bar bar; /* one model load per process */
    if (!isatty(2)) return;
    o->progress = lily_bar_update;
    o->progress_ud = &bar;
}
