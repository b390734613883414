/* Token sampling on the device: the next token chosen from the logits without copying them to
 * the host, so a decode step (or a captured graph of one) can feed its own draw into the next.
 *
 * The chain is sampler.h's without the penalties, on the same total order (larger logit first,
 * then lower id): NaN logits are never drawn and +inf counts as FLT_MAX; temperature <= 0 is the
 * argmax (lowest id on ties); otherwise top-k (the k best in the order), weights
 * w = expf((l - max) * (float)(1 / T)), min-p (keep w >= min_p, and always the best logit), top-p
 * (the shortest prefix of the order whose weight reaches top_p times the weight of the top-k set,
 * sampler.h's target) and a draw proportional to w among the survivors. The selections are exact
 * in the order: radix selects over 64-bit keys (the logit's order bits, then the id), so ties at a
 * boundary are cut by id as the CPU sampler cuts them. Weights are summed in 2^-40 fixed point
 * (deterministic, whatever the block order). The draw is a Gumbel race: the survivor with the
 * largest (l - max) / T - log(-log u_i), u_i uniform from a counter hash of (seed, step, i), which
 * picks i with probability w_i / sum(w) in one pass. The sampler's CPU draw walks its candidates
 * in an order of its own, so the two agree in distribution, not token for token.
 *
 * Everything the kernels read lives in device memory: the settings (lily_cuda_sampling) and the
 * step counter that the draw increments, so a graph that captured a call draws a fresh token on
 * every replay and follows settings rewritten between replays.
 *
 * The engine's draws (lily_session_decode_sample, lily_session_draw_enqueue) run it as a graph
 * after the decode step's graph, the drawn token copied into the next step's input slot.
 *
 * A grammar's mask (cfg.mask, device words uploaded per step by the caller) makes the ids it
 * does not allow unusable, the same test as NaN or a banned id, in every pass: the chain then
 * runs over the allowed ids as the CPU reference (backend/draw.h) does.
 */
#ifndef LILY_BACKEND_CUDA_SAMPLE_H
#define LILY_BACKEND_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lily_cuda_sampling {
    float temperature; /* <= 0: argmax */
    int top_k;         /* <= 0: off */
    float top_p;       /* off unless 0 < top_p < 1 */
    float min_p;       /* off unless > 0; >= 1 keeps only the best logit(s) */
    int n_ids;         /* ids >= n_ids are never drawn (padding rows); <= 0: none excluded */
    int ban_id;        /* an id never drawn, or -1 */
    uint64_t seed;
    /* A grammar's mask (device memory, [ceil(n_allow / 32)] words) or NULL: only ids i < n_allow
     * with bit i % 32 of mask[i / 32] set may be drawn, as if the others were -inf (draw.h). */
    const uint32_t *mask;
    int n_allow;
} lily_cuda_sampling;

/* Bytes of device scratch one call needs (a fixed size, whatever the vocabulary). */
size_t lily_cuda_sample_scratch_bytes(void);

/* *d_out = the token drawn from logits[0..V) under *d_cfg (device memory) with the random numbers
 * of (d_cfg->seed, *d_step); then *d_step += 1. *d_out = -1 when no logit can be drawn (all NaN,
 * -inf, excluded, banned or masked). scratch: lily_cuda_sample_scratch_bytes() of device memory. */
int lily_cuda_sample(const float *logits, int V, const lily_cuda_sampling *d_cfg, uint64_t *d_step,
                     void *scratch, int32_t *d_out, lily_cuda_stream st, lily_err *e);

/* Before a pipelined decode step (one thread, stream-ordered): *d_tok = tok, or when tok < 0 the
 * token *d_last holds (a previous draw still on the device; clamped to >= 0 so that a failed draw
 * never indexes outside the embeddings: the host reports the failure when it reads it), *d_pos =
 * pos, *d_cfg = *cfg, *d_step = step. Everything goes by value in the launch, so nothing the host
 * rewrites for the next step can race with this one. */
int lily_cuda_draw_setup(int32_t *d_tok, int32_t *d_pos, const int32_t *d_last, int32_t tok,
                         int pos, lily_cuda_sampling *d_cfg, const lily_cuda_sampling *cfg,
                         uint64_t *d_step, uint64_t step, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
