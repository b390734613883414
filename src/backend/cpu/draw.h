/* The CPU reference of the device sampler (backend/cuda/sample.h): the same chain on the same
 * total order with the same random numbers (draw_rng.h), so the two draw the same token from the
 * same logits except where their expf or log round differently (a weight at a top-p boundary, a
 * near tie in the race). The CPU backend draws with it when it offers the pipelined draw ops
 * (lily_backend_cpu_draws), so the engine's and the server's pipelined path runs without a GPU. */
#ifndef LILY_BACKEND_CPU_DRAW_H
#define LILY_BACKEND_CPU_DRAW_H

#include <stdint.h>

#include "lily.h"

/* A candidate: its key in the total order and its weight in 2^-40 fixed point. */
typedef struct lily_draw_cand {
    uint64_t key, wf;
} lily_draw_cand;

/* The token drawn from logits[0..V) under d at d->step (sample.h's chain); -1 when no logit can
 * be drawn (all NaN, -inf, excluded or banned). scratch: V entries. Expected O(V): quickselects
 * for top-k and the top-p boundary, and a race that computes the Gumbel variate only for the
 * candidates whose uniform could beat the best so far. */
int32_t lily_cpu_draw(const float *logits, int V, const lily_draw *d, lily_draw_cand *scratch);

/* Pipelined draws of one CPU state: steps run at once, their draws wait in a ring for draw_next. */
typedef struct lily_cpu_drawq {
    float *logits;  /* [V] the last step's logits */
    lily_draw_cand *scr; /* [V] lily_cpu_draw's scratch */
    int32_t ring[LILY_DRAW_AHEAD];
    int head, unread;
    int32_t last; /* the last draw (the input of a step enqueued with token < 0) */
} lily_cpu_drawq;

lily_cpu_drawq *lily_cpu_drawq_create(int V);
void lily_cpu_drawq_free(lily_cpu_drawq *q);

#endif
