/* lily bench --rows / --profile / --program: the decode step as the backend runs it. */
#ifndef LILY_TOOLS_BENCH_STEP_H
#define LILY_TOOLS_BENCH_STEP_H

#include "lily.h"

typedef struct lily_bench_step {
    const char *model;
    lily_engine_opts eng;
    const int *rows; /* row counts, 1..LILY_MAX_ROWS */
    int n_rows;
    const int *depths; /* context positions of the timed steps */
    int n_depths;
    int gen;     /* steps timed per row count and depth */
    int profile; /* also each op's time in a step */
    int program; /* only print the program */
    const char *json, *csv;
} lily_bench_step;

/* Runs it; prints the table on stdout. Returns the process exit code. */
int lily_bench_step_run(const lily_bench_step *o);

#endif
