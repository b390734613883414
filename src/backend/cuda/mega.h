/* The decode step as one persistent, dataflow-scheduled kernel (experimental; issue 32).
 *
 * lily_cuda_mega_create turns the step program (backend/program.h) into a device instruction
 * list: the program's ops, fused where a tile can do two of them (the norms into the GEMV
 * prologues, the residual adds, the GDN conv and the output gates into epilogues), become "mega
 * ops", each split into tiles (a slice of output rows of a GEMV, a value head of the GDN
 * recurrence, a KV head of the attention prep, a (context split, KV head group) of the attention,
 * ...). Every mega op has a completion counter in device memory; a tile waits (thread 0 spins
 * with backoff on an acquire load) until the counters of the ops it depends on reach
 * (epoch + 1) x their tile counts, where epoch is the number of steps completed, so counters are
 * never reset. The tiles are dealt to the blocks in program order (tile i of the whole list to
 * block i mod grid); every block walks its tiles in that order and the grid is at most one block
 * per SM, all resident, so the lowest unfinished tile can always run: no deadlock. While a block
 * waits, the weights of its tile and of its next one are prefetched into L2 (a TMA bulk prefetch
 * on sm_90; weights never depend on activations, except the routed experts', which are known
 * only after top-k). The last block to finish advances the epoch.
 *
 * A wait that lasts longer than the timeout (10 s) sets the error flag (host-mapped memory) and every
 * block leaves: lily_cuda_mega_failed reports it after the stream has synchronised, and a
 * failed instance refuses further steps (no hang on a wrong result).
 *
 * Activations are read with L2-coherent loads (ld.global.cg), never through the read-only path:
 * other SMs wrote them during the same launch.
 *
 * Rows: the instruction list is laid out for one row (one token of one session). The design for
 * up to 8 rows: activation buffers [rows][width], GEMV tiles computing all rows from one read of
 * their weights, per-row tiles for the recurrence and attention, and the routed-expert tiles
 * over the union of the rows' experts. */
#ifndef LILY_BACKEND_CUDA_MEGA_H
#define LILY_BACKEND_CUDA_MEGA_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LILY_MEGA_MAX_LAYERS 96

/* One layer's device weights as the backend uploaded them (NULL / w == NULL when absent). */
typedef struct lily_mega_layer {
    const float *in_norm, *post_norm;
    /* attention */
    const lily_dmat *q, *k, *v, *o;
    const float *q_norm, *k_norm;
    /* Gated DeltaNet */
    const lily_dmat *qkv, *z, *b, *a, *out;
    const float *conv_w, *dt_bias, *A_log, *gdn_norm;
    /* feed-forward: MoE (router, expert stacks, optional shared expert and its gate row) or,
     * with router NULL, a dense MLP in sh_gate / sh_up / sh_down */
    const lily_dmat *router, *gate, *up, *down, *sh_gate, *sh_up, *sh_down, *sh_gw;
} lily_mega_layer;

/* What the step reads and writes besides the per-session state. */
typedef struct lily_mega_model {
    const lily_model *m; /* the config and the step program's source */
    const lily_mega_layer *L;
    const lily_dmat *embed, *lm_head;
    const float *final_norm, *inv_freq;
    float *x;          /* [hidden] residual stream (device) */
    float *logits;     /* [vocab] (device) */
    int32_t *d_tok;    /* the step's token (device) */
    int32_t *d_pos;    /* its position (device) */
    int32_t *d_argmax; /* [4]: the argmax index, pad, and its u64 key (device) */
} lily_mega_model;

/* A session's state on the device, per layer (attention: K and V caches, attn.h format; GDN:
 * conv state [K-1][C] and recurrent state, gdn.h layout). */
typedef struct lily_mega_state {
    void *k[LILY_MEGA_MAX_LAYERS], *v[LILY_MEGA_MAX_LAYERS];
    float *conv[LILY_MEGA_MAX_LAYERS], *S[LILY_MEGA_MAX_LAYERS];
} lily_mega_state;

typedef struct lily_mega lily_mega;

/* Builds the instruction list and scratch for mm (read during the call; the weights and buffers
 * it points to must outlive the instance). Fails on shapes the kernel does not take. */
int lily_cuda_mega_create(const lily_mega_model *mm, lily_mega **out, lily_err *e);
void lily_cuda_mega_free(lily_mega *g);

/* Enqueues one decode step on st (capturable in a CUDA graph): x, logits and the argmax for the
 * token *d_tok at position *d_pos, updating the state. The attention runs the per-op decode's
 * products in the calling thread's precision (lily_cuda_prec_get().attn_exact). */
int lily_cuda_mega_step(lily_mega *g, const lily_mega_state *s, lily_cuda_stream st, lily_err *e);

/* After the stream has synchronised: non-zero (with a message) when a step timed out waiting. */
int lily_cuda_mega_failed(const lily_mega *g, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
