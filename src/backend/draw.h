/* The device sampler's chain (backend/cuda/sample.h) on the host: the same total order, filters
 * and random numbers (draw_rng.h), so the two draw the same token from the same logits
 * except where their expf or log round differently (a weight at a top-p boundary, a near tie in
 * the race; none in 70,840 GPU draws). It is the GPU sampler's CPU reference, the CPU backend's
 * draw (LILY_SAMPLE_ON_BACKEND), and what lily_gen samples with on the host when the backend draws, so
 * that a seeded request gives the same tokens whether or not its logits come to the host. */
#ifndef LILY_BACKEND_DRAW_H
#define LILY_BACKEND_DRAW_H

#include <stdint.h>

#include "lily.h"

/* A candidate: its key in the total order and its weight in 2^-40 fixed point. */
typedef struct lily_draw_cand {
    uint64_t key, wf;
} lily_draw_cand;

/* The token drawn from logits[0..V) under d at d->step (sample.h's chain); -1 when no logit can
 * be drawn (all NaN, -inf, excluded, banned or outside d->allow's mask). A token the mask
 * disallows is treated as a logit of -inf, before every filter. scratch: V entries. O(V), about the host
 * sampler's cost: a heap for top-k, the top-p boundary by quickselect on the keys (exact: the
 * keys are distinct and the mass an integer sum), and a race that computes the Gumbel variate
 * only for candidates whose uniform could beat the best so far. */
int32_t lily_draw_pick(const float *logits, int V, const lily_draw *d, lily_draw_cand *scratch);

/* The backends' check of d's mask before a step is enqueued (lily.h): 0 without one, or with one
 * that covers 1..V ids while none of the state's draws is unread; else -1 with a message. */
int lily_draw_mask_check(const lily_draw *d, int V, int unread, lily_err *e);

#endif
