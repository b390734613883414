/* The CPU backend's draw ops (LILY_SAMPLE_ON_BACKEND): a step runs at once and its draw
 * (lily_draw_pick, backend/draw.h: the device sampler's chain) waits in a ring until draw_next
 * reads it, so the engine's and the server's pipelined path runs without a GPU. */
#ifndef LILY_BACKEND_CPU_DRAW_H
#define LILY_BACKEND_CPU_DRAW_H

#include <stdint.h>

#include "lily.h"
#include "backend/draw.h"

/* Pipelined draws of one CPU state: steps run at once, their draws wait in a ring for draw_next. */
typedef struct lily_cpu_drawq {
    float *logits;       /* [V] the last step's logits */
    lily_draw_cand *scr; /* [V] lily_draw_pick's scratch */
    int32_t ring[LILY_DRAW_AHEAD];
    int head, unread;
    int32_t last; /* the last draw (the input of a step enqueued with token < 0) */
} lily_cpu_drawq;

lily_cpu_drawq *lily_cpu_drawq_create(int V);
void lily_cpu_drawq_free(lily_cpu_drawq *q);

#endif
