/* A one-line progress bar on a terminal: bytes done of total, a bar, the percentage and the time
 * since the first call. Used for model loading (lily_engine_opts.progress) and downloads. */
#ifndef LILY_BASE_PROGRESS_H
#define LILY_BASE_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct lily_bar {
    const char *label; /* "loading", "model.safetensors", ...; NULL = "loading" */
    FILE *out;         /* NULL = stderr */
    double t0;         /* time of the first update (set by it) */
    double last;       /* time of the last line drawn */
    int finished;      /* the final line is out: later updates print nothing */
} lily_bar;

/* Writes n bytes as "512 B", "12.3 KB", "4.56 MB" or "19.50 GB" (decimal units) into buf. */
void lily_bar_bytes(char *buf, size_t len, uint64_t n);

/* Redraws the bar (ud: a lily_bar) at most ten times a second; done >= total prints the final
 * line "<label>: <total> in <seconds> s" and a newline, once. Fits lily_engine_opts.progress. */
void lily_bar_update(void *ud, uint64_t done, uint64_t total);

#endif
