/* Server counters exported on GET /metrics in the Prometheus text format. */
#ifndef LILY_SERVER_METRICS_H
#define LILY_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "gen/sb.h"

typedef struct lily_metrics {
    pthread_mutex_t mu;
    uint64_t requests;       /* HTTP requests answered */
    uint64_t requests_error; /* answered with a 4xx/5xx */
    uint64_t generations;    /* completions run on the inference thread */
    uint64_t cancelled;      /* generations cancelled by a client disconnect */
    uint64_t rejected_busy;  /* 503 because the queue was full */
    uint64_t prompt_tokens;  /* all prompt tokens of finished generations */
    uint64_t prefill_tokens; /* prompt tokens actually computed */
    uint64_t cached_tokens;  /* prompt tokens reused from the cache */
    uint64_t cache_hits;     /* generations that reused at least one token */
    uint64_t generated_tokens;
    double prefill_s, decode_s;
    int queue_depth; /* jobs waiting */
    int busy;        /* a job is running */
    int cache_entries;
    uint64_t cache_bytes;
} lily_metrics;

void lily_metrics_init(lily_metrics *m);
void lily_metrics_destroy(lily_metrics *m);
/* Appends the Prometheus text of a consistent copy of m. */
void lily_metrics_text(lily_metrics *m, lily_sb *out);

#endif
