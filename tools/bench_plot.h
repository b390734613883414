/* lily bench --plot: prefill and decode tok/s against context length as an SVG chart (two panels,
 * log-scaled x, linear y from 0, labelled axes, a legend), with optional reference series read
 * from llama-bench's `-o json` output or from lily bench's own --json. */
#ifndef LILY_TOOLS_BENCH_PLOT_H
#define LILY_TOOLS_BENCH_PLOT_H

#include "lily.h"

#define LILY_PLOT_MAX_POINTS 64
#define LILY_PLOT_MAX_SERIES 16

typedef struct lily_plot_series {
    char name[128];
    int n_pp, n_tg;                    /* points of the prefill and decode curves */
    double pp_x[LILY_PLOT_MAX_POINTS]; /* context length (tokens) */
    double pp_y[LILY_PLOT_MAX_POINTS]; /* prefill tok/s */
    double tg_x[LILY_PLOT_MAX_POINTS];
    double tg_y[LILY_PLOT_MAX_POINTS]; /* decode tok/s */
} lily_plot_series;

/* Adds a point to series s (prefill when decode == 0); points beyond the capacity are dropped. */
void lily_plot_add(lily_plot_series *s, int decode, double x, double y);

/* Appends the series of a reference file to s[*n..max). llama-bench JSON (an array of tests): a
 * test with n_gen == 0 is a prefill point at n_prompt + n_depth, one with n_prompt == 0 a decode
 * point at n_depth (n_gen when n_depth is 0), both at avg_ts; tests are grouped into series by
 * model_type, backends and n_threads. lily bench JSON (an object with "rows"): one series.
 * Returns 0, or -1 with a message. */
int lily_plot_read_ref(const char *path, lily_plot_series *s, int *n, int max, lily_err *e);

/* Writes the chart of s[0..n) to path. title goes on top. Returns 0, or -1 with a message. */
int lily_plot_svg(const char *path, const char *title, const lily_plot_series *s, int n,
                  lily_err *e);

#endif
