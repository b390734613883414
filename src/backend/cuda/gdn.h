/* Gated DeltaNet on the GPU: the causal conv + SiLU over a chunk, the recurrence (a sequential
 * scan with the fp32 state held in registers: one warp per 8 value columns per token for decode,
 * a tiled kernel with inputs staged in shared memory for every prefill chunk), and the per-head gated
 * RMSNorm of the prefill path (the decode step, lily_cuda_gdn_step_rows, applies it itself).
 *
 * Recurrent state layout (backend-internal): per value head j, the Dk x Dv fp32 matrix S[k][v] is
 * stored as [Dv/8][Dk][8], so the warp that owns 8 value columns reads one contiguous 4 KiB block
 * and each lane its 4 key rows x 8 columns (128 contiguous bytes). lily_cuda_gdn_sidx gives the
 * offset of S_j[k][v]. The scan needs Dk == 128 and Dv % 8 == 0. */
#ifndef LILY_BACKEND_CUDA_GDN_H
#define LILY_BACKEND_CUDA_GDN_H

#include <stddef.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline size_t lily_cuda_gdn_sidx(int Dk, int Dv, int j, int k, int v) {
    return (((size_t)j * (Dv / 8) + v / 8) * Dk + k) * 8 + v % 8;
}

/* Runs tokens 0..n) through the recurrence of all Nv value heads, updating S (layout above).
 * qkv: [n][ldqkv] post-conv, post-SiLU activations, columns [q: Nk*Dk | k: Nk*Dk | v: Nv*Dv];
 * b, a: raw beta and decay logits at b[t*ldba + j], a[t*ldba + j]; A_log, dt_bias: [Nv].
 * Per token and head: q, k are L2-normalised (eps 1e-6 inside the sum), q scaled by 1/sqrt(Dk),
 * beta = sigmoid(b), lambda = exp(-exp(A_log) * softplus(a + dt_bias)); then the delta rule.
 * o: [n][ldo], head j at columns j*Dv. One kernel (gdn.cu's tiled scan) for every n. */
int lily_cuda_gdn_scan(float *S, int Nk, int Nv, int Dk, int Dv, int n, const float *qkv, int ldqkv,
                       const float *b, const float *a, int ldba, const float *A_log,
                       const float *dt_bias, float *o, int ldo, lily_cuda_stream st, lily_err *e);

#define LILY_GDN_ROWS 8 /* rows of one lily_cuda_gdn_step_rows call (LILY_MAX_ROWS) */

/* One decode token of R rows (1..LILY_GDN_ROWS) in one launch, with the output's gated RMSNorm:
 * row r's state S[r], its inputs at qkv + r dqkv, b + r dba, a + r dba (as lily_cuda_gdn_scan's
 * at n = 1), its gate z + r dz [Nv * Dv] and its output at o + r dout (floats; dqkv a multiple
 * of 4): o_j = rmsnorm(S_j^T q, norm_w [Dv], eps) * silu(z_j) per value head j, the
 * recurrence as lily_cuda_gdn_scan's. Each row's result is the same whatever R is (the decode
 * step of one row is this call with R = 1). Needs Dv <= 256. */
int lily_cuda_gdn_step_rows(float *const *S, int R, int Nk, int Nv, int Dk, int Dv,
                            const float *qkv, size_t dqkv, const float *b, const float *a,
                            size_t dba, const float *A_log, const float *dt_bias, const float *z,
                            size_t dz, const float *norm_w, float eps, float *o, size_t dout,
                            lily_cuda_stream st, lily_err *e);

/* Depthwise causal conv (K taps, tap K-1 on the current input) + SiLU over n tokens of C
 * channels. in: [n][ldin]; state: [K-1][C] previous inputs, oldest first, updated; w: [C][K];
 * out: [n][ldout], a separate buffer (tokens run in parallel, so out must not alias in). */
int lily_cuda_conv_silu(const float *in, int ldin, int n, int C, int K, float *state,
                        const float *w, float *out, int ldout, lily_cuda_stream st, lily_err *e);

/* In place over n tokens: o[t][h*hd + i] = o * rsqrt(mean_i o^2 + eps) * w[i] * silu(z[t][...]),
 * for nh heads of hd values; o: [n][ldo], z: [n][ldz]. */
int lily_cuda_gated_rmsnorm(float *o, int ldo, const float *z, int ldz, int n, int nh, int hd,
                            const float *w, float eps, lily_cuda_stream st, lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
