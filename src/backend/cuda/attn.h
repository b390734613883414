/* Full (gated GQA) attention on the GPU: the prep kernel (per-head q/k RMSNorm, partial NeoX RoPE,
 * K/V quantised into the cache), split-K decode attention on tensor cores (one block per KV head
 * and split, the query heads of a group packed so each K/V row is read once; splits sized from
 * the context to fill the SMs; a second kernel merges the splits and applies the sigmoid output
 * gate), and flash-attention prefill on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate;
 * rows of a query tile are (position, head-in-group) pairs, so K/V tiles are shared by the whole
 * group).
 *
 * KV cache format: a bf16 cache (8 significant bits) moved near-ties in the transformers fixtures
 * (bench/NOTES-cuda.md); int16 codes with one fp32 scale per (position, KV head) keep 16 bits in
 * the same bytes. Row of K (or V) for one position, lily_cuda_kv_bytes(1, Nkv, Dh) bytes:
 *   [Nkv][Dh] codes as uint16 c + 32768 (offset binary) | [Nkv] fp32 scales | zero to 16 padding
 * value = code * scale, scale = max|row of the head| / LILY_CUDA_KV_CODE_MAX (32639, so that
 * c + 128 < 2^15: codes split into balanced bytes, attn_wg.h; 0 for an all-zero row, and for the
 * zeroed rows of a fresh cache, whose words read as c = -32768). Offset binary puts the code's
 * high byte plus 128 straight into the byte the conversions need (attn.cu). Rows are
 * 16-byte aligned (Dh % 8 == 0) for the 16-byte copies, and position-major, so the first pos
 * positions are one contiguous prefix (lily_cuda_kv_prefix_bytes) for snapshots.
 *
 * Products on the tensor cores (bf16 in, fp32 accumulate): a code c splits exactly into
 * hi = bf16(c) and lo = c - hi (|lo| <= 64, exact in bf16); q and P (with the V scale folded in)
 * split into bf16 hi + lo; the K scale multiplies the score columns after the product. With
 * lily_cuda_prec_get().attn_exact (cuda_mem.h: the engine's DEFAULT and EXACT) the products keep about
 * 16 bits (qhi*khi + qlo*khi + qhi*klo, likewise P V); with 0 one pass of the hi parts (decode
 * keeps its free q/P lo rows, see attn.cu), as fast as the bf16 cache was, less the code
 * conversion. The exact prefill instead splits a code into its bytes as exact fp16 values
 * (c = 256 (c >> 8) + (c & 255), cheaper to extract than a bf16 split) against fp16 hi + lo of q
 * and P, with q rows and P tiles scaled by powers of two into fp16's range (attn.cu); the K lo
 * bytes enter as 4 + lo and the bias is taken off each score (4 x the row's sum of q hi parts).
 * An fp16 cache with one fp16 pass (11 bits) was tried and measured 2.5x faster at depth, but it
 * flipped near-ties of two fixtures on the GPU (bench/NOTES-cuda.md). At head dim 256
 * the exact prefill runs attn_wg.h's kernel instead (int8 wgmma over the codes' balanced bytes for
 * S, f16 wgmma for P V), and the one-pass prefill attn_fa.h's (q, codes and P rounded to fp16, one
 * f16 wgmma pass).
 *
 * Positions come from device memory (*d_pos is the position of the first token of the call), so a
 * captured decode graph can be replayed at every position. Supported: Dh in {64, 128, 256},
 * G = Nq/Nkv in {1, 2, 4, 8, 16}. */
#ifndef LILY_BACKEND_CUDA_ATTN_H
#define LILY_BACKEND_CUDA_ATTN_H

#include <stdint.h>

#include "backend/cuda/cuda_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LILY_CUDA_KV_CODE_MAX 32639 /* largest |code| in the cache */

/* Bytes of one K (or V) cache of max_ctx positions, and of its first pos positions (a contiguous
 * prefix: what a snapshot copies). */
size_t lily_cuda_kv_bytes(int max_ctx, int Nkv, int Dh);
size_t lily_cuda_kv_prefix_bytes(int pos, int Nkv, int Dh);

/* For n tokens at positions p0+t (p0 = *d_pos): q head h is read from qg + t*ldqg + h*Dh*(1+gated)
 * (its gate follows it when gated), normalised with qn [Dh], rotated on its first R dims, and
 * written to q_out [n][Nq*Dh] (fp32); the gate goes to gate_out [n][Nq*Dh] (unless !gated).
 * k [n][ldkv] is normalised with kn and rotated, v taken as is: both quantised into row p0+t of
 * kc/vc (the format above).
 * inv_freq: [R/2] device, 1/theta^(2i/R) as the CPU reference computes it (fp32). */
int lily_cuda_attn_prep(const float *qg, int ldqg, const float *k, const float *v, int ldkv, int n,
                        const int32_t *d_pos, int Nq, int Nkv, int Dh, int R, const float *inv_freq,
                        const float *qn, const float *kn, float eps, int gated, float *q_out,
                        float *gate_out, void *kc, void *vc, lily_cuda_stream st, lily_err *e);

#define LILY_ATTN_ROWS 8 /* rows of one rows call (LILY_MAX_ROWS) */

/* lily_cuda_attn_prep of one token of each of n sequences (rows, 1..LILY_ATTN_ROWS): token t at
 * position d_pos[t] (d_pos: [n] device), its q/k/v at row t of qg / k / v, its q and gate at
 * row t of q_out / gate_out (stride ldq >= Nq Dh) and its K/V rows into its own kc[t] / vc[t].
 * Each row bit for bit lily_cuda_attn_prep of that token alone. */
int lily_cuda_attn_prep_rows(const float *qg, int ldqg, const float *k, const float *v, int ldkv,
                             int n, const int32_t *d_pos, int Nq, int Nkv, int Dh, int R,
                             const float *inv_freq, const float *qn, const float *kn, float eps,
                             int gated, float *q_out, float *gate_out, int ldq, void *const *kc,
                             void *const *vc, lily_cuda_stream st, lily_err *e);

/* Floats of split scratch lily_cuda_attn_decode needs. */
size_t lily_cuda_attn_decode_scratch(int Nq, int Dh, int max_splits);

/* One query per head (q [Nq*Dh]) at position p = *d_pos over cache rows 0..p; scale multiplies
 * q.k. out [Nq*Dh] = softmax(q k^T) V, times sigmoid(gate) when gate != NULL. */
int lily_cuda_attn_decode(const float *q, const void *kc, const void *vc, const int32_t *d_pos,
                          int Nq, int Nkv, int Dh, float scale, const float *gate, float *scratch,
                          int max_splits, float *out, lily_cuda_stream st, lily_err *e);

/* One row of a decode launch: lily_cuda_attn_decode's arguments (scratch = part). */
typedef struct lily_attn_drow {
    const float *q;
    const void *kc, *vc;
    const int32_t *d_pos;
    const float *gate; /* NULL: no output gate */
    float *part;       /* lily_cuda_attn_decode_scratch(Nq, Dh, max_splits) floats, its own */
    int max_splits;
    float *out;
} lily_attn_drow;

/* lily_cuda_attn_decode of R rows (1..LILY_ATTN_ROWS; each its own cache, position, splits and
 * scratch) in one split launch and one merge: row i's output is bit for bit what
 * lily_cuda_attn_decode gives it alone (which is this call with R = 1). */
int lily_cuda_attn_decode_rows(const lily_attn_drow *rows, int R, int Nq, int Nkv, int Dh,
                               float scale, lily_cuda_stream st, lily_err *e);

/* Forces the split target of the decode calls that follow (want > 0: that many splits, capped
 * by max_splits) or restores the automatic one (0: as many as fill the SMs). Tests and
 * measurements; not thread-safe. */
void lily_cuda_attn_decode_force_splits(int want);

/* Floats of scratch lily_cuda_attn_prefill can split a chunk's causal spans with (any n; 0 when
 * the shape has no split form: head dims other than 256). */
size_t lily_cuda_attn_prefill_scratch(int Nq, int Nkv, int Dh);

/* n queries q [n][Nq*Dh] at positions p0..p0+n-1 (p0 = *d_pos), causal over cache rows
 * 0..p0+t. out [n][Nq*Dh], times sigmoid(gate [n][Nq*Dh]) when gate != NULL. part: NULL or
 * lily_cuda_attn_prefill_scratch floats, for the split form (attn_wg.h). */
int lily_cuda_attn_prefill(const float *q, int n, const void *kc, const void *vc,
                           const int32_t *d_pos, int Nq, int Nkv, int Dh, float scale,
                           const float *gate, float *out, float *part, lily_cuda_stream st,
                           lily_err *e);

#ifdef __cplusplus
}
#endif

#endif
