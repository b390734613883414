/* Decode-path matrix-vector products (batch 1) on the GPU, bandwidth-bound.
 *
 * One launch computes y_s = W_s x' for up to LILY_GEMV_SEGS matrices ("segments") that share the
 * input vector and weight type (e.g. q/k/v, or qkv/z/b/a of a GDN layer). Each block first builds
 * x' in shared memory through a prologue (copy, or RMSNorm with a weight), then warps take groups of rows; a row is split over LPR lanes that
 * each load 16-byte code chunks, several rows at once so that many loads are in flight. The
 * per-row epilogue stores, adds into y (the residual), or applies the GDN causal conv + SiLU with
 * its conv state (one thread per channel, so the state update has no race). The rows form
 * (lily_cuda_gemv_rows) builds x' of each of up to 8 input vectors in shared memory and applies
 * every loaded weight chunk to all of them, so a decode step of R rows reads each matrix once. */
#ifndef LILY_BACKEND_CUDA_GEMV_H
#define LILY_BACKEND_CUDA_GEMV_H

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LILY_GEMV_SEGS 4
#define LILY_GEMV_ROWS 8 /* input vectors of one lily_cuda_gemv_rows call (LILY_MAX_ROWS) */

enum { LILY_GV_STORE = 0, LILY_GV_ADD = 1, LILY_GV_CONV = 2 };
enum { LILY_GP_NONE = 0, LILY_GP_RMSNORM = 1 };

typedef struct lily_gemv_seg {
    const lily_dmat *m;  /* one matrix (n_mats == 1) */
    float *y;            /* [rows] output */
    int epi;             /* LILY_GV_* */
    float *conv_state;   /* CONV: [K-1][rows] previous pre-conv values, oldest first */
    const float *conv_w; /* CONV: [rows][K], tap K-1 multiplies the current value */
    int conv_k;          /* CONV: K (2..8) */
} lily_gemv_seg;

typedef struct lily_gemv_pro {
    int kind;       /* LILY_GP_* */
    const float *w; /* RMSNORM: [cols] */
    float eps;
} lily_gemv_pro;

/* x: [cols] device fp32. pro may be NULL (plain copy). Segments must share cols and type. */
int lily_cuda_gemv(const lily_gemv_seg *segs, int nseg, const float *x, const lily_gemv_pro *pro,
                   lily_cuda_stream st, lily_err *e);

/* nx input vectors (1..LILY_GEMV_ROWS) through the same matrices, the weights read once for all
 * of them (a decode step of several rows): vector r reads x[r] and writes the segments
 * segs[r * nseg .. r * nseg + nseg), which name the same matrices, epilogues and conv weights for
 * every r (y and conv_state are its own). pro: NULL or the one prologue of every vector.
 * Each vector's results are bit for bit lily_cuda_gemv's for that vector alone (the same
 * arithmetic in the same order; lily_cuda_gemv is this with nx = 1). */
int lily_cuda_gemv_rows(const lily_gemv_seg *segs, int nseg, int nx, const float *const *x,
                        const lily_gemv_pro *pro, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
