/* The sparse MoE block on the GPU (also the dense SwiGLU MLP, as a "shared expert" without
 * router or gate).
 *
 * Decode (one token, three launches, no host sync): a GEMV computes the router logits and the
 * shared-expert gate logit from the RMS-normed input; one kernel then recomputes softmax + top-k
 * per block (block 0 publishes it) and runs gate+up+SiLU for the k selected experts and the
 * shared expert; a last kernel does every down projection, scales by the routing weights and
 * sigmoid(shared gate), sums, and adds into the residual. With a
 * Q8 router, Q4 experts on the tensor-core kernels, a grid that is resident all at once) the
 * router rows are computed inside the gate/up launch instead, behind a grid barrier (two
 * launches, bit-identical results; moe_router.cuh).
 *
 * Decode of R rows (a step of several sessions, lily_cuda_moe_decode_rows; one token is R = 1):
 * the router and shared-gate rows in one rows GEMV (each matrix read once for all rows; the fused
 * router runs one row only), then the same two launches with R times the blocks, each row's
 * blocks doing exactly the one-row work on its own input and scratch rows (so each row's result
 * is the one-row result bit for bit), the rows' blocks over the same weight rows adjacent in
 * launch order so that the shared expert and the experts several rows chose come from L2.
 *
 * Prefill (a chunk of n tokens): router GEMM, per-token top-k with a per-expert histogram, a
 * one-block scan that makes expert offsets and the tile list of the grouped GEMMs, an ordered
 * scatter (deterministic: grouped rows keep token order within an expert), grouped GEMMs for
 * gate, up and down, and a gather-back that adds the weighted expert rows and the sigmoid-gated
 * shared expert into the residual. One tile height per chunk, from the average rows per expert:
 * 64 rows when the experts average >= 64, else 16 rows on the skinny Q4 kernel (gemm_skinny.h)
 * for Q4 experts, else 32; an expert with no rows makes no tile. Scratch is bounded by the chunk
 * size. */
#ifndef LILY_BACKEND_CUDA_MOE_H
#define LILY_BACKEND_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LILY_MOE_ROWS 8 /* rows of one lily_cuda_moe_decode_rows call (LILY_MAX_ROWS) */

typedef struct lily_cuda_moe {
    int E, k;                   /* routed experts and experts per token (0, 0 for a dense MLP) */
    int norm;                   /* renormalise the top-k weights */
    const lily_dmat *router;    /* [E, H], NULL when E == 0 */
    const lily_dmat *gate, *up; /* stacks of E: [I, H] */
    const lily_dmat *down;      /* stack of E: [H, I] */
    const lily_dmat *sh_gate, *sh_up, *sh_down; /* shared expert [Is,H],[Is,H],[H,Is]; or NULL */
    const lily_dmat *sh_gate_w; /* [1, H]: scalar sigmoid gate of the shared expert; or NULL */
    /* Optional stacks, one allocation each with the matrices above as views of its rows (or
     * NULL): the prefill runs each as one GEMM instead of two. */
    const lily_dmat *router_gw; /* [E + 1, H]: router over sh_gate_w */
    const lily_dmat *sh_gu;     /* [2 Is, H]: sh_gate over sh_up */
} lily_cuda_moe;

/* Bytes of scratch the decode step needs (of up to LILY_MOE_ROWS rows). Layers may share one
 * scratch (the fused router's barrier words sit at the same offset for every shape);
 * lily_cuda_moe_decode_scratch_init must run once on a new scratch before its first decode, the
 * rest needs no initialisation. */
size_t lily_cuda_moe_decode_scratch(const lily_cuda_moe *m);
/* Zeroes the fused router's barrier pair of a new decode scratch (moe_router.cuh): cudaMalloc
 * memory can hold a stale pair (a valid tag over a count that is not zero) from an earlier
 * allocation, which would release the first fused step's barrier early. */
int lily_cuda_moe_decode_scratch_init(void *scratch, lily_cuda_stream st, lily_err *e);
/* 1 when lily_cuda_moe_decode would run m with the router fused into the gate/up launch under
 * (the shapes fit and the grid is resident), else 0. For tests and logs. */
int lily_cuda_moe_decode_fuses(const lily_cuda_moe *m);
/* on != 0: the decode steps that follow run the router GEMV even where the fused form would run
 * (the two are designed to be bit-identical; tests compare them). Not thread-safe. */
void lily_cuda_moe_force_unfused(int on);
/* x [H] (residual, device) += MoE(RMSNorm(x; norm_w, eps)). lily_cuda_moe_decode_rows, R = 1. */
int lily_cuda_moe_decode(const lily_cuda_moe *m, float *x, const float *norm_w, float eps,
                         void *scratch, lily_cuda_stream st, lily_err *e);
/* For r < R (1..LILY_MOE_ROWS): x + r ldx [H] += MoE(RMSNorm(x + r ldx; norm_w, eps)), each row
 * bit for bit lily_cuda_moe_decode of that row alone (rows 16-byte aligned, ldx >= H when
 * R > 1). */
int lily_cuda_moe_decode_rows(const lily_cuda_moe *m, int R, float *x, int ldx, const float *norm_w,
                              float eps, void *scratch, lily_cuda_stream st, lily_err *e);
/* The routing of the last decode step (device pointers into scratch): idx [k] int32, wt [k];
 * row r of a step of several rows at idx + r k, wt + r k. */
const int32_t *lily_cuda_moe_decode_idx(const lily_cuda_moe *m, const void *scratch);
const float *lily_cuda_moe_decode_wt(const lily_cuda_moe *m, const void *scratch);

/* Bytes of scratch a prefill chunk of up to n tokens needs. */
size_t lily_cuda_moe_prefill_scratch(const lily_cuda_moe *m, int n);
/* x [n][H] (residual) += MoE(u) for the normed input u [n][H] (both ld = H). */
int lily_cuda_moe_prefill(const lily_cuda_moe *m, const float *u, int n, float *x, void *scratch,
                          lily_cuda_stream st, lily_err *e);
/* The routing of the last prefill of n tokens (device pointers into scratch): idx/wt [n][k]. */
const int32_t *lily_cuda_moe_prefill_idx(const lily_cuda_moe *m, int n, const void *scratch);
const float *lily_cuda_moe_prefill_wt(const lily_cuda_moe *m, int n, const void *scratch);
/* Same, with the routing given instead of computed: idx/wt [n][k] device arrays (tests use this
 * to force uneven loads: experts with no rows and with every row). */
int lily_cuda_moe_prefill_routed(const lily_cuda_moe *m, const float *u, int n, const int32_t *idx,
                                 const float *wt, float *x, void *scratch, lily_cuda_stream st,
                                 lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
