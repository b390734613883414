/* The CPU reference blocks: the MoE block, the Gated DeltaNet mixer and the attention block of one
 * layer, run by the same op functions the CPU backend's step runs (cpu/step_*.c), for tests that
 * check another backend against the CPU (no model or engine needed: a config and a layer of
 * weights are enough).
 *
 * as_decode = 1 runs each token as a decode step does (the row product; n consecutive decode
 * steps for the mixers), 0 as a prefill chunk of n tokens does (the prefill products). Each call
 * allocates its scratch (these are references, not a fast path). k: the kernels
 * (lily_cpu_kern_for); pool may be NULL. Returns 0, or -1 with a message. */
#ifndef LILY_BACKEND_CPU_BLOCKS_H
#define LILY_BACKEND_CPU_BLOCKS_H

#include "backend/cpu/ops.h"

/* out [n][H] = the feed-forward block of normed rows u [n][H] (c->is_moe: the shared expert,
 * gated by sigmoid(u sh_gate_w) or by 1 when ly->sh_gate_w has no weights, plus the routed
 * experts added in ascending id; else the dense MLP). idx/wt [n][top_k]: the routing to use, or
 * NULL for the router's own (softmax top-k). */
int lily_cpu_ffn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                       const float *u, int n, const int *idx, const float *wt, int as_decode,
                       float *out, lily_pool *pool, lily_err *e);

/* out [n][H] = the Gated DeltaNet mixer of normed rows u [n][H], advancing the layer's conv state
 * conv [conv_k - 1][C] and recurrent state S [Nv][Dk][Dv] (in place) by n tokens. */
int lily_cpu_gdn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                       float *conv, float *S, const float *u, int n, int as_decode, float *out,
                       lily_pool *pool, lily_err *e);

/* out [n][H] = the gated attention block of normed rows u [n][H] at positions pos .. pos + n - 1
 * over the caches kc, vc [max_ctx][Nkv Dh] (rows 0 .. pos - 1 filled; the new ones written). */
int lily_cpu_attn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                        float *kc, float *vc, int max_ctx, int pos, const float *u, int n,
                        int as_decode, float *out, lily_pool *pool, lily_err *e);

#endif
