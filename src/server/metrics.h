/* Server counters exported on GET /metrics in the Prometheus text format. */
#ifndef LILY_SERVER_METRICS_H
#define LILY_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "gen/sb.h"

#define LILY_METRICS_SLOTS 8 /* LILY_MAX_ROWS */

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
    int busy;        /* slots running a job */
    int cache_entries;
    uint64_t cache_bytes;
    /* the scheduler (sched.c) */
    int n_slots;
    uint64_t decode_steps; /* decode steps (one token from each decoding slot) */
    uint64_t decode_rows;  /* tokens those steps took */
    double step_s;         /* time in steps with at least one decoding slot */
    uint64_t queued;       /* jobs that waited for a slot (started or not) */
    double queue_s;        /* their waits */
    struct lily_slot_metrics {
        int busy;          /* 1 while a job runs on the slot */
        uint64_t requests; /* jobs started on it */
        uint64_t tokens;   /* generated tokens */
        double busy_s;     /* time it held a job (its occupancy: the rate of this) */
        double tps;        /* its current (else last) job's generated tokens per second */
    } slot[LILY_METRICS_SLOTS];
} lily_metrics;

void lily_metrics_init(lily_metrics *m);
void lily_metrics_destroy(lily_metrics *m);
/* Appends the Prometheus text of a consistent copy of m. */
void lily_metrics_text(lily_metrics *m, lily_sb *out);

#endif
