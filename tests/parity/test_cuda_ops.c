/* The CUDA ops against the CPU reference from one table of ops and shapes (as ggml's
 * test-backend-ops): each row names an op, its shape, its variant and its tolerance; the driver
 * seeds the generator from the row's index, builds random inputs (never zeros), runs the CUDA op
 * and the CPU reference (the exported blocks of backend/cpu/blocks.h where the op is a block, the
 * reference ops otherwise), prints a line per check and one ROW line per row (op, shape, the
 * largest relative and absolute errors, PASS/FAIL). Exits 77 without a GPU.
 *
 *   test_cuda_ops [FILTER...]   only the rows whose op name contains one of the FILTERs
 *                               (e.g. "gemv", "moe", "moe_prefill", "embed")
 *
 * Ops: gemv (decode GEMV: every weight type, prologue copy / RMSNorm,
 * epilogue store / add / causal conv + SiLU with its state update, odd row counts, 64 .. 16384
 * columns); gemv_rows (lily_cuda_gemv_rows, 1 to 8 input vectors through the same weights, against
 * lily_cuda_gemv of each vector alone, bit for bit: outputs and conv states); moe_decode (the fused
 * decode MoE block, with the router GEMV and with the router fused into the gate/up launch behind a
 * grid barrier, each step twice on one scratch; the routing against the CPU top-k and the output
 * against lily_cpu_ffn_block with the GPU's routing, so a near-tie flip cannot fail); moe_graph
 * (two fused layers captured in a CUDA graph and replayed three times against the eager unfused
 * run); moe_prefill (the grouped prefill: routed on the GPU, every token on experts 0..k-1, and a
 * skewed random load; a dense SwiGLU MLP when E = 0; the stacked router/shared-gate uploads when
 * stack = 1); embed (Q4, Q8, BF16, F32 rounded to BF16 rows against lily_mat_row_f32); rmsnorm (odd
 * widths and strides, and the RMSNorm that also writes the exact GEMMs' split words: the same y
 * bits and the words a separate split gives); argmax (odd lengths, the maximum first / last /
 * random, a tie won by the lowest index); advance (the decode ring's step counter near the ends of
 * int32); gdn_conv (causal conv + SiLU and its state against lily_cpu_conv_silu); gdn_scan (the
 * recurrence: L2 norms, gates and lily_cpu_gdn_scan per head from a random non-zero state, 1 token
 * to 2048, output and final state); gdn_gnorm (the per-head gated RMSNorm);
 * skinny (the grouped Q4 GEMM's 16-row expert tiles, backend/cuda/gemm_skinny.h, against
 * lily_cpu_matmul: uneven expert loads, with and without the row gather, odd group counts, X rows
 * 1e-6 .. 1e6, in every A form, staging and precision), skinny_pair (the gate/up pair launch bit
 * for bit as two launches), skinny_args;
 * moe_rows (the decode of 1 to 8 rows at a padded stride: each row bit for bit the row alone, its
 * routing the row alone's, its output against the CPU block; rows on their own experts, all on the
 * same ones, pairs on the same ones); gdn_rows (the GDN decode step of 1 to 8 rows in one launch
 * at padded strides, with the output's gated RMSNorm: each row bit for bit the row alone, and
 * against lily_cpu_gdn_scan and the gated RMSNorm; heads of 1 to 32 warps); attn_rows (the
 * attention decode of 1 to 8 rows, prep and split decode, each row its own cache, context and
 * split count: bit for bit the row alone, in both precisions).
 *
 * attn_prep (q/k RMSNorm, partial RoPE, int16 + scale cache rows against lily_cpu_rmsnorm +
 * lily_cpu_rope); attn_decode (split-K decode at contexts 1 to 131073, every split count 1 to 128,
 * forced split targets, group sizes 1 to 16); attn_prefill (the tensor-core prefill over chunks
 * from 0, continuing at 1000 and 3000 and deep in the cache (20011, 70000), gated or not, head dims
 * 64, 128, 256, in every prefill mode: default (exact), fast (at head dim 256 attn_fa.cu's one-pass
 * fp16 wgmma kernel, to its own bound TOL_FA; attn.cu's one-pass bf16 kernel at other head dims),
 * and at head dim 256 the ws kernel unsplit and split in 3 (lily_cuda_attn_prefill_force_splits),
 * the fa kernel unsplit and split in 3). The attention reference is attention with double sums on
 * the values the int16 cache holds; the exact modes agree to fp32 accumulation level, the one-pass
 * modes to a looser bound.
 *
 * Sanitizer-sized runs: LILY_GDN_QUICK=1 leaves out the long scans, LILY_CUDA_SAN=1 the 40K-131K
 * attention contexts and deep prefills and the 35B-sized skinny shapes, LILY_CUDA_SAN=2 runs the
 * racecheck-sized attention rows alone. LILY_CUDA_TIME=1 also prints, after the rows, the GDN scan
 * kernels' times (gdn_scan selected) and, in each prefill mode, attention decode and prefill times
 * at the 35B-A3B shape (attn_prefill selected: decode at 4K-128K alone, in a CUDA graph of 10 and
 * with a sweep of split targets; prefill chunks of 512 tokens at depth 130560 and of 4096 from 0,
 * 28672, 32768, 65536 and 126976, in microseconds and TFLOP/s of the causal products; cudaEvent,
 * median of 20); LILY_CUDA_TIME=1p the prefill chunks alone (no rows: for profilers, 23 launches
 * per chunk and mode, 3 warm-ups and 20 timed); LILY_CUDA_TIME=1f the same for the one-pass modes
 * alone (attn_fa.cu's kernel split as the SMs call for, and unsplit). With the skinny rows
 * selected LILY_CUDA_TIME=1 also times the 35B-A3B expert GEMMs (skinny_timing);
 * LILY_CUDA_TIME=1s that alone (LILY_SKINNY_TIME_N / _V pick a chunk size / a variant). The prefill
 * GEMMs (test_cuda_gemm) and the sampler (test_cuda_sample) keep their programs. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>

#include "backend/cpu/blocks.h"
#include "backend/cuda/attn.h"
#include "backend/cuda/attn_wg.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/misc.h"
#include "backend/cuda/moe.h"
#include "parity_util.h"

typedef enum {
    OP_GEMV,
    OP_GEMV_ROWS,
    OP_SKINNY,
    OP_SKINNY_PAIR,
    OP_SKINNY_ARGS,
    OP_MOE_DECODE,
    OP_MOE_GRAPH,
    OP_MOE_PREFILL,
    OP_EMBED,
    OP_RMSNORM,
    OP_ARGMAX,
    OP_ADVANCE,
    OP_GDN_CONV,
    OP_GDN_SCAN,
    OP_GDN_GNORM,
    OP_GEMV_ARGS,
    OP_GDN_ARGS,
    OP_ATTN_PREP,
    OP_ATTN_DECODE,
    OP_ATTN_PREFILL,
    OP_ATTN_ARGS,
    OP_MOE_ROWS,
    OP_GDN_ROWS,
    OP_ATTN_ROWS,
} op_kind;
static const char *op_names[] = {
    "gemv",        "gemv_rows",    "skinny",    "skinny_pair", "skinny_args",   "moe_decode",
    "moe_graph",   "moe_prefill",  "embed",     "rmsnorm",     "argmax",        "advance",
    "gdn_conv",    "gdn_scan",     "gdn_gnorm", "gemv_args",   "gdn_scan_args", "attn_prep",
    "attn_decode", "attn_prefill", "attn_args", "moe_rows",    "gdn_rows",      "attn_rows"};
static const char *dt_names[] = {"f32", "bf16", "f16", "q4", "q8"};

/* One row of the table. Fields an op does not use stay 0. */
typedef struct {
    op_kind op;
    lily_dtype dt;    /* gemv, embed: the weight type */
    int dim;          /* gemv: columns; moe: H; embed: H; rmsnorm: width */
    int n;            /* moe_prefill: tokens; embed: tokens; rmsnorm: rows; argmax: length;
                       * gemv_rows: input vectors */
    int rows[4];      /* gemv: the segments' row counts (nseg of them) */
    int M, cset;      /* skinny: weight rows (dim: columns), the experts' row counts (SK_C*) */
    int gather;       /* skinny: grouped rows read X rows at random of n (0: row r reads row r) */
    int spread;       /* skinny: X rows 1e-6 .. 1e6 (exact only) */
    int nseg;         /* gemv */
    int pro, epi;     /* gemv: LILY_GP_*, LILY_GV_* */
    int E, k, I;      /* moe: experts (0: a dense MLP of width Is), top-k, expert width */
    int Is, sg;       /* moe: shared expert width (0: none), its sigmoid gate row */
    int stack;        /* moe: router + shared gate row and shared gate + up uploaded stacked */
    int route;        /* moe_prefill: 0 routed on the GPU, 1 all on experts 0..k-1, 2 skewed */
    int V;            /* embed: vocabulary rows */
    int at;           /* argmax: index of the maximum, -1 random */
    int32_t step;     /* advance: the step counter before */
    int cap;          /* advance: ring size */
    int K;            /* gdn_conv: taps (dim: channels, n: tokens) */
    int Nk, Nv;       /* gdn_scan: key / value heads (dim: Dv, Dk = 128, n: tokens, every kernel);
                     * gdn_gnorm: Nv heads of dim (n: tokens) */
    int big;          /* skipped under LILY_GDN_QUICK=1 (sanitizer-sized runs) */
    int R, pos, ctx;  /* attn: rotary dims (prep), first position (prep, prefill), context (decode);
                      * Nk, Nv: query / KV heads, dim: head dim, n: tokens */
    int splits, want; /* attn_decode: split count of the grid, forced split target (0: auto) */
    int gated;        /* attn: the sigmoid output gate */
    int nosan;        /* skipped under LILY_CUDA_SAN=1 (memcheck-sized runs) */
    int race;         /* LILY_CUDA_SAN=2 (racecheck-sized) runs only rows with race != 0; race 2:
                        * only then */
    double tol;       /* relative L2 tolerance of the float checks */
} op_row;

#define GEMV(d, c, p, e, t, ...)                                                            \
    {                                                                                       \
        .op = OP_GEMV, .dt = LILY_DT_##d, .dim = c, .pro = LILY_GP_##p, .epi = LILY_GV_##e, \
        .tol = t, .rows = {__VA_ARGS__}, .nseg = sizeof((int[]){__VA_ARGS__}) / sizeof(int) \
    }
#define GEMV_ROWS(d, c, p, e, nx, ...)                                                           \
    {                                                                                            \
        .op = OP_GEMV_ROWS, .dt = LILY_DT_##d, .dim = c, .pro = LILY_GP_##p, .epi = LILY_GV_##e, \
        .n = nx, .rows = {__VA_ARGS__}, .nseg = sizeof((int[]){__VA_ARGS__}) / sizeof(int)       \
    }
/* skinny expert row count sets (sk_counts): SK_ROUTED is n tokens x top-k over E experts */
enum { SK_C1, SK_C2, SK_C3, SK_C4, SK_ROUTED, SK_MAXE = 256 };
#define SKINNY(m, kk, cs, n_, g, ...) \
    { .op = OP_SKINNY, .M = m, .dim = kk, .cset = SK_##cs, .n = n_, .gather = g, __VA_ARGS__ }
#define MOE(o, e_, k_, h, i, is, g, st, n_, r)                                                \
    {                                                                                         \
        .op = OP_MOE_##o, .E = e_, .k = k_, .dim = h, .I = i, .Is = is, .sg = g, .stack = st, \
        .n = n_, .route = r, .tol = OP_MOE_##o == OP_MOE_PREFILL ? 2e-3 : 1e-4                \
    }
/* share: 0 rows of their own, 1 every row the same input, 2 row r = row r % ceil(R / 2) */
#define MOE_ROWS(e_, k_, h, i, is, g, st, rows, share, ...)                                    \
    {                                                                                          \
        .op = OP_MOE_ROWS, .E = e_, .k = k_, .dim = h, .I = i, .Is = is, .sg = g, .stack = st, \
        .n = rows, .route = share, .tol = 1e-4, __VA_ARGS__                                    \
    }

#define ATTN_DEC(nq, nkv, dh, c, sp, g, ...)                                                      \
    {                                                                                             \
        .op = OP_ATTN_DECODE, .Nk = nq, .Nv = nkv, .dim = dh, .ctx = c, .splits = sp, .gated = g, \
        __VA_ARGS__                                                                               \
    }
#define ATTN_PRE(nq, nkv, dh, p0, n_, g, ...)                                                  \
    {                                                                                          \
        .op = OP_ATTN_PREFILL, .Nk = nq, .Nv = nkv, .dim = dh, .pos = p0, .n = n_, .gated = g, \
        __VA_ARGS__                                                                            \
    }

static const op_row table[] = {
    /* gemv: weight type, columns, prologue, epilogue, tolerance (F32 is rounded to BF16 on
     * upload: ~2^-9 per weight), the segments' rows */
    GEMV(Q4, 2048, RMSNORM, STORE, 1e-4, 1000, 37, 513),
    GEMV(Q4, 2048, NONE, STORE, 1e-4, 8192),
    GEMV(Q4, 4096, NONE, ADD, 1e-4, 1000, 37),
    GEMV(Q4, 512, NONE, ADD, 1e-4, 1000, 37, 513),
    GEMV(Q4, 64, RMSNORM, STORE, 1e-4, 256, 1, 7, 300),
    GEMV(Q4, 192, NONE, STORE, 1e-4, 5),
    GEMV(Q4, 1024, RMSNORM, CONV, 1e-4, 1000, 37, 513),
    GEMV(Q8, 2048, RMSNORM, STORE, 1e-4, 256, 1),
    GEMV(Q8, 320, NONE, STORE, 1e-4, 1000, 37, 513),
    GEMV(BF16, 2048, RMSNORM, STORE, 1e-4, 1000, 37, 513),
    GEMV(BF16, 576, NONE, ADD, 1e-4, 256, 1, 7, 300),
    GEMV(BF16, 64, NONE, CONV, 1e-4, 5),
    GEMV(F32, 768, NONE, STORE, 1e-2, 1000, 37),
    /* a wide input: dynamic shared memory above 48 KiB (16384 columns is the widest the CPU
     * reference's matmul takes, 256 groups) */
    GEMV(Q4, 16384, RMSNORM, STORE, 1e-4, 33),
    /* gemv_rows: several input vectors at once (a decode step of rows) against lily_cuda_gemv of
     * each vector alone, bit for bit: tensor-core Q4 (every count 1..8), the fp32 kernels (counts
     * split into launches of 8, 4, 2, 1), every prologue and epilogue, and a width whose vectors
     * do not all fit one launch's shared memory. Weight type, columns, prologue, epilogue,
     * vectors, the segments' rows */
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 1, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 2, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, CONV, 3, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 4, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 5, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 6, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 7, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 2048, RMSNORM, STORE, 8, 300, 37, 5, 1000),
    GEMV_ROWS(Q4, 4096, NONE, ADD, 8, 1000, 37),
    GEMV_ROWS(Q4, 512, NONE, ADD, 5, 1000, 37, 513),
    GEMV_ROWS(Q4, 320, RMSNORM, CONV, 7, 1000, 37, 513),
    GEMV_ROWS(Q4, 64, RMSNORM, STORE, 8, 256, 1, 7, 300),
    GEMV_ROWS(Q8, 2048, RMSNORM, STORE, 6, 256, 1),
    GEMV_ROWS(BF16, 576, NONE, ADD, 3, 256, 1, 7, 300),
    GEMV_ROWS(BF16, 4096, RMSNORM, STORE, 8, 5),
    GEMV_ROWS(F32, 768, NONE, CONV, 8, 1000, 37),
    GEMV_ROWS(Q4, 16384, RMSNORM, STORE, 3, 33),
    /* vectors split over launches of the 8-vector kernels (227 KB per block): tensor-core Q4 at
     * 8192 columns 5 + 3, the fp32 kernel (BF16) at 16384 columns 3 + 3 + 2; at Q4 16384 above
     * one vector a launch (the 1-vector kernel alone) */
    GEMV_ROWS(Q4, 8192, RMSNORM, STORE, 8, 33),
    GEMV_ROWS(BF16, 16384, RMSNORM, STORE, 8, 33),

    /* skinny: the grouped Q4 GEMM's 16-row expert tiles (lily_cuda_gemm_grouped, tile_rows 16)
     * against lily_cpu_matmul: M, K, count set, tokens, gather. Count sets: C1 {0, 1, 7, 8, 9, 0,
     * 16, 17, 53, 3, 15, 0} (0 rows, 1, odd, 8, 9, 16, 17, 4 tiles), C2 {0, 37, 1, 0, 5}, C3 {0,
     * 11, 0}, C4 {13, 0, 16, 1, 29, 2}; K an odd number of groups (576, 192), one group (64); M
     * not a multiple of the 128-row blocks or 16-row slabs; more tiles in the grid than valid.
     * Each row in every form (sk_set_mode); skinny_pair: the gate/up pair launch bit for bit as
     * two launches */
    SKINNY(200, 576, C1, 40, 1),
    SKINNY(200, 576, C1, 0, 0),
    SKINNY(130, 192, C2, 30, 1),
    SKINNY(72, 64, C2, 0, 0),
    SKINNY(48, 128, C3, 9, 1),
    {.op = OP_SKINNY_PAIR, .M = 200, .dim = 576, .cset = SK_C1, .n = 40},
    {.op = OP_SKINNY_PAIR, .M = 512, .dim = 2048, .cset = SK_C2, .n = 60, .nosan = 1},
    SKINNY(512, 2048, C1, 40, 1, .nosan = 1), /* gate / up shape */
    SKINNY(2048, 512, C1, 0, 0, .nosan = 1),  /* down shape */
    SKINNY(2048, 512, C2, 60, 1, .nosan = 1),
    SKINNY(512, 2048, C2, 0, 0, .nosan = 1),
    /* 64 tokens x top-8 over 64 experts: ~8 rows each, as a short prompt gives */
    SKINNY(512, 2048, ROUTED, 64, 1, .E = 64, .k = 8, .nosan = 1),
    SKINNY(2048, 512, ROUTED, 64, 0, .E = 64, .k = 8, .nosan = 1),
    /* X rows from 1e-6 to 1e6 (the split's row scale keeps fp16 in range) */
    SKINNY(200, 576, C4, 26, 1, .spread = 1),
    SKINNY(512, 2048, C4, 26, 1, .spread = 1, .nosan = 1),
    {.op = OP_SKINNY_ARGS},

    /* MoE: (E, k, H, I, Is, shared gate, stacked, n, routing). Decode rows: each step with the
     * router GEMV and with the fused router (first step and through the barrier). Prefill: Q4
     * experts averaging fewer than 64 rows take the skinny 16-row tiles, at least 64 the 64-row
     * tiles (600 tokens on 16 experts, top-2). */
    MOE(DECODE, 32, 8, 2048, 512, 512, 1, 0, 1, 0),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 0, 1, 0),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 0, 77, 0),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 0, 300, 1),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 0, 129, 2),
    MOE(DECODE, 32, 8, 2048, 512, 512, 1, 1, 1, 0),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 1, 77, 0),
    MOE(PREFILL, 32, 8, 2048, 512, 512, 1, 1, 129, 2),
    MOE(DECODE, 256, 8, 256, 128, 128, 1, 0, 1, 0),
    MOE(PREFILL, 256, 8, 256, 128, 128, 1, 0, 200, 0),
    MOE(PREFILL, 256, 8, 256, 128, 128, 1, 0, 64, 1),
    MOE(PREFILL, 256, 8, 256, 128, 128, 1, 0, 1000, 2), /* 8000 assignments: 16 scatter chunks */
    MOE(DECODE, 16, 2, 320, 192, 0, 0, 0, 1, 0),
    MOE(PREFILL, 16, 2, 320, 192, 0, 0, 0, 33, 0),
    MOE(PREFILL, 16, 2, 320, 192, 0, 0, 0, 50, 2),
    MOE(PREFILL, 16, 2, 320, 192, 0, 0, 0, 600, 0), /* 1200 assignments: the 64-row tiles */
    MOE(PREFILL, 16, 2, 320, 192, 0, 0, 0, 700, 2),
    MOE(DECODE, 32, 4, 256, 128, 192, 1, 0, 1, 0), /* Is != I */
    MOE(PREFILL, 32, 4, 256, 128, 192, 1, 0, 65, 0),
    MOE(PREFILL, 32, 4, 256, 128, 192, 1, 1, 65, 0),
    MOE(DECODE, 0, 0, 512, 0, 1344, 0, 0, 1, 0), /* a dense SwiGLU MLP */
    MOE(PREFILL, 0, 0, 512, 0, 1344, 0, 0, 45, 0),
    MOE(DECODE, 0, 0, 512, 0, 1344, 0, 1, 1, 0), /* its gate and up as one */
    MOE(PREFILL, 0, 0, 512, 0, 1344, 0, 1, 45, 0),
    /* fused-router shapes: the 35B's grid (16 x 9 = 144 blocks, fewer router rows than blocks),
     * no shared expert, a shared expert without its gate (H = 768: 16 lanes per router row),
     * 1024 experts + the gate row over 6 blocks (many rows per warp); the 35B's expert shapes in
     * prefill (24 tokens x top-8 over 64 experts, ~3 rows each: the skinny tiles; skewed) */
    MOE(DECODE, 64, 8, 2048, 512, 512, 1, 0, 1, 0),
    MOE(GRAPH, 64, 8, 2048, 512, 512, 1, 0, 1, 0),
    MOE(PREFILL, 64, 8, 2048, 512, 512, 1, 0, 24, 0),
    MOE(PREFILL, 64, 8, 2048, 512, 512, 1, 0, 24, 2),
    MOE(DECODE, 64, 6, 512, 256, 0, 0, 0, 1, 0),
    MOE(DECODE, 40, 3, 768, 320, 256, 0, 0, 1, 0),
    MOE(DECODE, 1024, 2, 256, 64, 64, 1, 0, 1, 0),
    MOE(GRAPH, 1024, 2, 256, 64, 64, 1, 0, 1, 0),

    /* embed: weight type, V, H, tokens (the first token is V - 1) */
    {.op = OP_EMBED, .dt = LILY_DT_Q4, .V = 1000, .dim = 2048, .n = 7, .tol = 1e-6},
    {.op = OP_EMBED, .dt = LILY_DT_Q8, .V = 77, .dim = 320, .n = 3, .tol = 1e-6},
    {.op = OP_EMBED, .dt = LILY_DT_BF16, .V = 129, .dim = 256, .n = 64, .tol = 1e-6},
    {.op = OP_EMBED, .dt = LILY_DT_F32, .V = 33, .dim = 192, .n = 5, .tol = 1e-6},
    /* rmsnorm: rows, width (input stride width + 3, output stride width + 1) */
    {.op = OP_RMSNORM, .n = 1, .dim = 2048, .tol = 1e-5},
    {.op = OP_RMSNORM, .n = 37, .dim = 4096, .tol = 1e-5},
    {.op = OP_RMSNORM, .n = 5, .dim = 100, .tol = 1e-5},
    /* argmax: length, index of the maximum (-1: random; a copy at index + 7 when it fits) */
    {.op = OP_ARGMAX, .n = 248320, .at = -1},
    {.op = OP_ARGMAX, .n = 248320, .at = 0},
    {.op = OP_ARGMAX, .n = 248320, .at = 248319},
    {.op = OP_ARGMAX, .n = 1, .at = 0},
    {.op = OP_ARGMAX, .n = 4093, .at = -1},
    /* advance: step counter, ring size */
    {.op = OP_ADVANCE, .step = 0, .cap = 1024},
    {.op = OP_ADVANCE, .step = 1500, .cap = 1024},
    {.op = OP_ADVANCE, .step = -5, .cap = 1024},
    {.op = OP_ADVANCE, .step = INT32_MIN, .cap = 1000},
    {.op = OP_ADVANCE, .step = INT32_MAX, .cap = 1000},
    /* gdn_conv: channels, taps, tokens (state and output) */
    {.op = OP_GDN_CONV, .dim = 8192, .K = 4, .n = 1, .tol = 1e-5},
    {.op = OP_GDN_CONV, .dim = 1001, .K = 4, .n = 2, .tol = 1e-5},
    {.op = OP_GDN_CONV, .dim = 777, .K = 4, .n = 301, .tol = 1e-5},
    {.op = OP_GDN_CONV, .dim = 130, .K = 3, .n = 5, .tol = 1e-5},
    /* gdn_scan: key heads, value heads, Dv, tokens; from one random non-zero state, output and
     * final state */
    {.op = OP_GDN_SCAN, .Nk = 16, .Nv = 32, .dim = 128, .n = 1, .tol = 1e-4},
    {.op = OP_GDN_SCAN, .Nk = 16, .Nv = 32, .dim = 128, .n = 7, .tol = 1e-4},
    {.op = OP_GDN_SCAN, .Nk = 16, .Nv = 32, .dim = 128, .n = 64, .tol = 1e-4, .big = 1},
    {.op = OP_GDN_SCAN, .Nk = 16, .Nv = 32, .dim = 128, .n = 512, .tol = 1e-4, .big = 1},
    {.op = OP_GDN_SCAN, .Nk = 16, .Nv = 32, .dim = 128, .n = 37, .tol = 1e-4},
    {.op = OP_GDN_SCAN, .Nk = 2, .Nv = 6, .dim = 64, .n = 513, .tol = 1e-4, .big = 1},
    {.op = OP_GDN_SCAN, .Nk = 3, .Nv = 9, .dim = 40, .n = 100, .tol = 1e-4},
    {.op = OP_GDN_SCAN, .Nk = 1, .Nv = 2, .dim = 8, .n = 17, .tol = 1e-4},
    {.op = OP_GDN_SCAN, .Nk = 4, .Nv = 8, .dim = 128, .n = 2048, .tol = 1e-4, .big = 1},
    /* gdn_gnorm: tokens, heads, head width (the per-head gated RMSNorm) */
    {.op = OP_GDN_GNORM, .n = 1, .Nv = 32, .dim = 128, .tol = 1e-5},
    {.op = OP_GDN_GNORM, .n = 19, .Nv = 5, .dim = 96, .tol = 1e-5},
    /* bad arguments are an error, not a crash */
    {.op = OP_GEMV_ARGS},
    {.op = OP_GDN_ARGS},
    /* attn_prep: Nq, Nkv, Dh, R, pos0, n, gated (q/k RMSNorm + partial RoPE, int16 cache rows) */
    {.op = OP_ATTN_PREP, .Nk = 16, .Nv = 2, .dim = 256, .R = 64, .pos = 0, .n = 1, .gated = 1},
    {.op = OP_ATTN_PREP, .Nk = 16, .Nv = 2, .dim = 256, .R = 64, .pos = 131000, .n = 3, .gated = 1},
    {.op = OP_ATTN_PREP, .Nk = 4, .Nv = 4, .dim = 64, .R = 16, .pos = 7, .n = 29},
    {.op = OP_ATTN_PREP,
     .Nk = 16,
     .Nv = 2,
     .dim = 256,
     .R = 64,
     .pos = 5,
     .n = 3,
     .gated = 1,
     .race = 2},
    /* attn_decode: Nq, Nkv, Dh, ctx, splits, gated (each exact and fast) */
    ATTN_DEC(16, 2, 256, 1, 128, 1),
    ATTN_DEC(16, 2, 256, 7, 128, 1),
    ATTN_DEC(16, 2, 256, 17, 128, 1),
    ATTN_DEC(16, 2, 256, 1000, 128, 1),
    ATTN_DEC(16, 2, 256, 4097, 128, 0),
    ATTN_DEC(16, 2, 256, 40000, 128, 1, .nosan = 1),
    ATTN_DEC(16, 2, 256, 131073, 128, 1, .nosan = 1),
    /* every split count the grid can have, at an odd length */
    ATTN_DEC(16, 2, 256, 2049, 1, 0),
    ATTN_DEC(16, 2, 256, 2051, 2, 1),
    ATTN_DEC(16, 2, 256, 2053, 3, 0),
    ATTN_DEC(16, 2, 256, 2055, 5, 1),
    ATTN_DEC(16, 2, 256, 2057, 8, 0),
    ATTN_DEC(16, 2, 256, 2059, 13, 1),
    ATTN_DEC(16, 2, 256, 2061, 31, 0),
    ATTN_DEC(16, 2, 256, 2063, 32, 1),
    ATTN_DEC(16, 2, 256, 2065, 33, 0),
    ATTN_DEC(16, 2, 256, 2067, 64, 1),
    ATTN_DEC(16, 2, 256, 2069, 100, 0),
    ATTN_DEC(16, 2, 256, 2071, 127, 1),
    ATTN_DEC(16, 2, 256, 2073, 128, 0),
    /* forced split targets (more than the grid, one, odd) */
    ATTN_DEC(16, 2, 256, 9999, 128, 1, .want = 1),
    ATTN_DEC(16, 2, 256, 9999, 128, 1, .want = 7),
    ATTN_DEC(16, 2, 256, 9999, 128, 1, .want = 129),
    ATTN_DEC(16, 2, 256, 9999, 128, 1, .want = 500),
    ATTN_DEC(8, 2, 128, 300, 3, 1),
    ATTN_DEC(4, 2, 128, 5000, 40, 0),
    ATTN_DEC(4, 4, 64, 33, 1, 0),
    ATTN_DEC(16, 1, 64, 95, 5, 1),
    ATTN_DEC(16, 1, 256, 3333, 128, 1),
    ATTN_DEC(32, 2, 128, 777, 9, 1),
    ATTN_DEC(8, 1, 64, 6001, 64, 1),
    ATTN_DEC(2, 2, 128, 12345, 100, 0),
    ATTN_DEC(16, 2, 256, 7, 1, 1, .race = 2),
    ATTN_DEC(8, 2, 128, 300, 3, 0, .race = 2),
    /* attn_prefill: Nq, Nkv, Dh, pos0, n, gated (every prefill mode: default, fast, and at Dh 256
     * the ws kernel unsplit and split in 3, the fa kernel unsplit and split in 3) */
    ATTN_PRE(16, 2, 256, 0, 1, 1),
    ATTN_PRE(16, 2, 256, 0, 77, 1),
    ATTN_PRE(16, 2, 256, 3000, 512, 1, .nosan = 1),
    ATTN_PRE(8, 2, 128, 0, 33, 0),
    ATTN_PRE(4, 4, 64, 5, 100, 1),
    ATTN_PRE(2, 1, 256, 17, 9, 0),
    ATTN_PRE(16, 2, 256, 20011, 37, 1, .nosan = 1),
    ATTN_PRE(16, 2, 256, 31, 1, 1),
    ATTN_PRE(16, 2, 256, 3000, 129, 1, .nosan = 1),
    ATTN_PRE(16, 1, 128, 100, 200, 0),
    ATTN_PRE(4, 4, 128, 1000, 300, 1), /* G 1: 64 positions per block, 5 blocks */
    ATTN_PRE(16, 1, 64, 7, 50, 1, .race = 1),
    ATTN_PRE(8, 1, 256, 4000, 70, 0),
    ATTN_PRE(16, 2, 256, 0, 2048, 1, .nosan = 1), /* many tiles under the causal mask */
    /* the wgmma kernel's other group sizes at head dim 256 (128 / G positions per block) */
    ATTN_PRE(16, 1, 256, 0, 45, 1),   /* G 16: 8 positions per block */
    ATTN_PRE(8, 2, 256, 130, 67, 0),  /* G 4 */
    ATTN_PRE(2, 2, 256, 999, 200, 1), /* G 1: 128 positions per block, two blocks */
    /* chunks continuing at 1000 and deep at 70000, odd lengths, G 8, 2, 1 */
    ATTN_PRE(16, 2, 256, 1000, 301, 1, .nosan = 1),
    ATTN_PRE(4, 2, 256, 1000, 257, 0),
    ATTN_PRE(16, 2, 256, 70000, 9, 1, .nosan = 1),
    ATTN_PRE(4, 2, 256, 70001, 9, 0, .nosan = 1),
    ATTN_PRE(2, 2, 256, 69999, 5, 1, .nosan = 1),
    ATTN_PRE(16, 2, 256, 0, 33, 1, .race = 2),
    ATTN_PRE(4, 4, 128, 70, 20, 0, .race = 2),
    {.op = OP_ATTN_ARGS},
    /* attn_rows: Nq, Nkv, Dh, rows, gated (the rows step's prep and split decode, each row bit for
     * bit alone, both precisions) */
    {.op = OP_ATTN_ROWS, .Nk = 16, .Nv = 2, .dim = 256, .n = 1, .gated = 1},
    {.op = OP_ATTN_ROWS, .Nk = 16, .Nv = 2, .dim = 256, .n = 8, .gated = 1, .nosan = 1},
    {.op = OP_ATTN_ROWS, .Nk = 16, .Nv = 2, .dim = 256, .n = 3, .gated = 0},
    {.op = OP_ATTN_ROWS, .Nk = 8, .Nv = 1, .dim = 128, .n = 5, .gated = 1},
    {.op = OP_ATTN_ROWS, .Nk = 4, .Nv = 4, .dim = 64, .n = 2, .gated = 0},
    /* the decode of R rows: the 35B-A3B's expert shapes (tensor-core kernels), rows on their own
     * experts, all on the same ones, pairs on the same ones; the GEMV-kernel shapes; a dense MLP */
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 0, 1, 0),
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 0, 2, 0),
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 0, 2, 1, .nosan = 1),
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 0, 3, 2, .nosan = 1),
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 0, 8, 0, .nosan = 1),
    MOE_ROWS(64, 8, 2048, 512, 512, 1, 1, 8, 1, .nosan = 1),
    MOE_ROWS(256, 8, 2048, 512, 512, 1, 1, 8, 2, .nosan = 1),
    MOE_ROWS(256, 8, 256, 128, 128, 1, 0, 5, 0),
    MOE_ROWS(16, 2, 320, 192, 0, 0, 0, 7, 2),
    MOE_ROWS(32, 4, 256, 128, 192, 1, 0, 4, 1),
    MOE_ROWS(40, 3, 768, 320, 256, 0, 0, 8, 2),
    MOE_ROWS(1024, 2, 256, 64, 64, 1, 0, 6, 0),
    MOE_ROWS(0, 0, 512, 0, 1344, 0, 0, 3, 0),
    MOE_ROWS(0, 0, 512, 0, 1344, 0, 1, 8, 2),
    /* the GDN decode step of R rows in one launch (n: rows; the 35B's heads, odd head counts) */
    {.op = OP_GDN_ROWS, .Nk = 16, .Nv = 32, .dim = 128, .n = 1, .tol = 1e-4},
    {.op = OP_GDN_ROWS, .Nk = 16, .Nv = 32, .dim = 128, .n = 8, .tol = 1e-4, .nosan = 1},
    {.op = OP_GDN_ROWS, .Nk = 4, .Nv = 12, .dim = 64, .n = 3, .tol = 1e-4},
    {.op = OP_GDN_ROWS, .Nk = 1, .Nv = 3, .dim = 24, .n = 7, .tol = 1e-4},
    {.op = OP_GDN_ROWS, .Nk = 2, .Nv = 2, .dim = 8, .n = 5, .tol = 1e-4},
    /* a head of 32 warps (a cluster of 8 blocks), of 5 warps (5 blocks of one) */
    {.op = OP_GDN_ROWS, .Nk = 2, .Nv = 4, .dim = 256, .n = 2, .tol = 1e-4},
    {.op = OP_GDN_ROWS, .Nk = 1, .Nv = 2, .dim = 40, .n = 3, .tol = 1e-4},
};

/* The CPU reference blocks' threads (one per core: the references of the larger rows are GFLOPs) */
static lily_pool *g_pool;

static float silu_h(float x) {
    return x / (1.0f + expf(-x));
}

/* ---- gemv ------------------------------------------------------------------------------------ */

static void run_gemv(const op_row *r) {
    char name[160];
    lily_err e;
    const lily_dtype dt = r->dt;
    const int cols = r->dim, nseg = r->nseg, pk = r->pro, epi = r->epi;
    const int *rows = r->rows;
    lily_mat m[LILY_GEMV_SEGS];
    lily_dmat dm[LILY_GEMV_SEGS];
    lily_gemv_seg seg[LILY_GEMV_SEGS];
    if (nseg < 1 || nseg > LILY_GEMV_SEGS) {
        pt_check_true("gemv row: segment count in range", 0);
        return;
    }
    float *x = malloc(cols * 4), *xp = malloc(cols * 4), *w = malloc(cols * 4);
    pt_fill(x, cols, 2.0f);
    for (int i = 0; i < cols; i++)
        w[i] = 0.5f + pt_frand() * 0.5f;
    /* the CPU form of the prologue */
    if (pk == LILY_GP_RMSNORM)
        lily_cpu_rmsnorm(x, w, cols, 1e-6f, xp);
    else
        memcpy(xp, x, cols * 4);
    float *dx = pt_dup(x, cols), *dw = pt_dup(w, cols);
    float *ref[LILY_GEMV_SEGS], *dy[LILY_GEMV_SEGS], *dcs[LILY_GEMV_SEGS], *dcw[LILY_GEMV_SEGS];
    float *cs[LILY_GEMV_SEGS], *cw[LILY_GEMV_SEGS];
    const int K = 4;
    for (int s = 0; s < nseg; s++) {
        m[s] = pt_mat(dt, rows[s], cols);
        if (!pt_ok(lily_cuda_dmat_upload(&m[s], 1, &dm[s], &e), "upload", &e)) return;
        ref[s] = malloc(rows[s] * 4);
        lily_cpu_matmul(pt_cpu(), &m[s], xp, 1, cols, ref[s], rows[s], NULL);
        float *y0 = malloc(rows[s] * 4);
        pt_fill(y0, rows[s], 1.0f);
        cs[s] = malloc((size_t)(K - 1) * rows[s] * 4);
        cw[s] = malloc((size_t)K * rows[s] * 4);
        pt_fill(cs[s], (size_t)(K - 1) * rows[s], 1.0f);
        pt_fill(cw[s], (size_t)K * rows[s], 0.7f);
        dcs[s] = pt_dup(cs[s], (size_t)(K - 1) * rows[s]);
        dcw[s] = pt_dup(cw[s], (size_t)K * rows[s]);
        if (epi == LILY_GV_ADD) {
            dy[s] = pt_dup(y0, rows[s]);
            for (int i = 0; i < rows[s]; i++)
                ref[s][i] += y0[i];
        } else {
            dy[s] = pt_dalloc(rows[s] * 4);
        }
        if (epi == LILY_GV_CONV) {
            float *o = malloc(rows[s] * 4);
            lily_cpu_conv_silu(ref[s], 1, rows[s], K, cs[s], cw[s], o);
            memcpy(ref[s], o, rows[s] * 4); /* cs[s] now holds the expected new state */
            free(o);
        }
        free(y0);
        seg[s] = (lily_gemv_seg){&dm[s], dy[s], epi, dcs[s], dcw[s], K};
    }
    lily_gemv_pro pro = {pk, dw, 1e-6f};
    int rc = lily_cuda_gemv(seg, nseg, dx, &pro, NULL, &e);
    if (!pt_ok(rc, "gemv launch", &e)) return;
    static const char *pks[] = {"copy", "rmsnorm"};
    static const char *eps[] = {"store", "add", "conv"};
    for (int s = 0; s < nseg; s++) {
        float *got = malloc(rows[s] * 4);
        pt_get(got, dy[s], rows[s]);
        snprintf(name, sizeof name, "gemv %s [%d x %d] seg %d/%d %s %s", dt_names[dt], rows[s],
                 cols, s, nseg, pks[pk], eps[epi]);
        pt_check(name, got, ref[s], rows[s], r->tol);
        if (epi == LILY_GV_CONV) {
            float *st = malloc((size_t)(K - 1) * rows[s] * 4);
            pt_get(st, dcs[s], (size_t)(K - 1) * rows[s]);
            snprintf(name, sizeof name, "gemv conv state [%d x %d] seg %d", K - 1, rows[s], s);
            pt_check(name, st, cs[s], (size_t)(K - 1) * rows[s], r->tol);
            free(st);
        }
        free(got);
        free(ref[s]), free(cs[s]), free(cw[s]);
        lily_cuda_free(dy[s]), lily_cuda_free(dcs[s]), lily_cuda_free(dcw[s]);
        lily_cuda_dmat_free(&dm[s]);
        pt_mat_free(&m[s]);
    }
    lily_cuda_free(dx), lily_cuda_free(dw);
    free(x), free(xp), free(w);
}

/* lily_cuda_gemv_rows with r->n input vectors (their own x, outputs and conv states)
 * against lily_cuda_gemv of each vector alone: bit for bit (memcmp), outputs and conv states. */
static void run_gemv_rows(const op_row *r) {
    enum { K = 4, NX = LILY_GEMV_ROWS, MAXR = 8192 };
    lily_err e;
    const lily_dtype dt = r->dt;
    const int cols = r->dim, nseg = r->nseg, pk = r->pro, epi = r->epi, nx = r->n;
    const int *rows = r->rows;
    int shape_ok = nseg >= 1 && nseg <= LILY_GEMV_SEGS && nx >= 1 && nx <= NX;
    for (int s = 0; s < nseg && shape_ok; s++)
        shape_ok = rows[s] >= 1 && rows[s] <= MAXR;
    if (!shape_ok) {
        pt_check_true("gemv_rows row: segments, vectors and rows in range", 0);
        return;
    }
    lily_mat m[LILY_GEMV_SEGS];
    lily_dmat dm[LILY_GEMV_SEGS];
    lily_gemv_seg seg[NX * LILY_GEMV_SEGS], one[LILY_GEMV_SEGS];
    const float *xr[NX];
    float *dx[NX], *y[2][NX][LILY_GEMV_SEGS], *cs[2][NX][LILY_GEMV_SEGS];
    float *cw[LILY_GEMV_SEGS];
    float *h = malloc((size_t)(cols > MAXR ? cols : MAXR) * K * 4);
    pt_fill(h, cols, 1.0f);
    for (int i = 0; i < cols; i++)
        h[i] = 0.5f + 0.5f * h[i];
    float *dw = pt_dup(h, cols);
    for (int s = 0; s < nseg; s++) {
        m[s] = pt_mat(dt, rows[s], cols);
        if (!pt_ok(lily_cuda_dmat_upload(&m[s], 1, &dm[s], &e), "upload", &e)) return;
        pt_fill(h, (size_t)K * rows[s], 0.7f);
        cw[s] = pt_dup(h, (size_t)K * rows[s]);
    }
    for (int v = 0; v < nx; v++) {
        pt_fill(h, cols, 2.0f);
        xr[v] = dx[v] = pt_dup(h, cols);
        for (int s = 0; s < nseg; s++) {
            pt_fill(h, rows[s], 1.0f); /* both runs start from the same y (ADD) and state */
            y[0][v][s] = pt_dup(h, rows[s]);
            y[1][v][s] = pt_dup(h, rows[s]);
            pt_fill(h, (size_t)(K - 1) * rows[s], 1.0f);
            cs[0][v][s] = pt_dup(h, (size_t)(K - 1) * rows[s]);
            cs[1][v][s] = pt_dup(h, (size_t)(K - 1) * rows[s]);
            seg[v * nseg + s] = (lily_gemv_seg){&dm[s], y[0][v][s], epi, cs[0][v][s], cw[s], K};
        }
    }
    const lily_gemv_pro pro = {pk, dw, 1e-6f};
    int ok = pt_ok(lily_cuda_gemv_rows(seg, nseg, nx, xr, pk ? &pro : NULL, NULL, &e), "rows", &e);
    for (int v = 0; v < nx && ok; v++) {
        for (int s = 0; s < nseg; s++)
            one[s] = (lily_gemv_seg){&dm[s], y[1][v][s], epi, cs[1][v][s], cw[s], K};
        ok = pt_ok(lily_cuda_gemv(one, nseg, dx[v], pk ? &pro : NULL, NULL, &e), "alone", &e);
    }
    static const char *pks[] = {"copy", "rmsnorm"};
    static const char *eps[] = {"store", "add", "conv"};
    int same = ok;
    float *a = malloc((size_t)MAXR * K * 4), *b = malloc((size_t)MAXR * K * 4);
    for (int v = 0; v < nx && same; v++)
        for (int s = 0; s < nseg && same; s++) {
            pt_get(a, y[0][v][s], rows[s]);
            pt_get(b, y[1][v][s], rows[s]);
            same = !memcmp(a, b, (size_t)rows[s] * 4);
            pt_get(a, cs[0][v][s], (size_t)(K - 1) * rows[s]);
            pt_get(b, cs[1][v][s], (size_t)(K - 1) * rows[s]);
            same = same && !memcmp(a, b, (size_t)(K - 1) * rows[s] * 4);
            if (!same) printf("  vector %d segment %d differs\n", v, s);
        }
    char name[160];
    snprintf(name, sizeof name, "gemv rows %s x%d [.. x %d] %d segs %s %s = each vector alone",
             dt_names[dt], nx, cols, nseg, pks[pk], eps[epi]);
    pt_check_true(name, same);
    for (int v = 0; v < nx; v++) {
        lily_cuda_free(dx[v]);
        for (int s = 0; s < nseg; s++)
            for (int k = 0; k < 2; k++)
                lily_cuda_free(y[k][v][s]), lily_cuda_free(cs[k][v][s]);
    }
    for (int s = 0; s < nseg; s++) {
        lily_cuda_free(cw[s]);
        lily_cuda_dmat_free(&dm[s]);
        pt_mat_free(&m[s]);
    }
    lily_cuda_free(dw);
    free(h), free(a), free(b);
}

/* ---- the skinny grouped Q4 GEMM ------------------------------------------------------------ */

/* Every row runs in each of the kernel's forms (sk_set_mode): A as fp16 subnormal codes or by
 * subtraction, codes through the register ring or the cp.async stages (with the B prefetch), exact
 * GEMMs or one pass (lily_cuda_prec.gemm_exact 0: the kernel splits X itself); spread rows (X rows
 * 1e-6 .. 1e6) exact only, without the prefetch. Y is filled with a sentinel first.
 *
 * Bound: per grouped row (token), max_o |y_gpu - y_cpu| <= 1e-5 * max_o |y_cpu|. The device result
 * carries the activation split (x = (hi + lo) 2^e, two fp16: ~2^-22 relative per element), the
 * fp32 accumulations of the tensor cores (each mma rounds or truncates once at ~2^-23 of the
 * largest partial sum of its group) and the fp32 FMAs of the group sums; the CPU reference rounds
 * its own fp32 sums. With random weights |y| ~ sqrt(K) |w| |x|, these give ~1e-7 .. 1e-6 of the
 * row's largest output; 1e-5 leaves a 10x margin while any slip of the fragment order, a missing
 * lo plane (~2^-12 per element) or a wrong group scale (~1 / sqrt(K / 64)) is far above it. With
 * gemm_exact 0 the kernel multiplies the hi plane alone (one product per weight, the activations
 * as fp16: ~2^-11 relative per element, ~3e-4 of the row's largest output): bound 3e-3. The ROW
 * line's rel is the worst row's max relative error. */
static const float kSentinel = -777.0f;
static float g_sk_spread; /* > 0: X row t scaled by 10^(spread * (t % 13 - 6) / 6) */
static char g_sk_tag[80];

static void sk_fill_x(float *X, int rows, int ld) {
    pt_fill(X, (size_t)rows * ld, 2.0f);
    for (size_t i = 0; i < (size_t)rows * ld; i++)
        if (X[i] == 0.f) X[i] = 0.5f; /* never zeros */
    if (g_sk_spread <= 0) return;
    for (int t = 0; t < rows; t++) {
        float f = powf(10.f, g_sk_spread * (float)(t % 13 - 6) / 6.f);
        for (int c = 0; c < ld; c++)
            X[(size_t)t * ld + c] *= f;
    }
}

/* gemm_exact of the GEMMs that follow (lily_cuda_prec; attention stays exact) */
static void set_gemm_exact(int on) {
    lily_cuda_prec p = {on, 1};
    lily_cuda_prec_set(p);
}

/* Mode m of a row: 0..7 = (cp, sub, fast) as bits 2, 1, 0 (pf with cp: it changes no value); a
 * spread row's modes 0..3 = (cp, sub) as bits 1, 0, exact, no prefetch. */
static int sk_modes(const op_row *r) {
    return r->spread ? 4 : 8;
}
static void sk_set_mode(const op_row *r, int m) {
    static const char *vname[2] = {"denorm", "sub"};
    const int cp = r->spread ? m >> 1 : m >> 2, sub = r->spread ? m & 1 : (m >> 1) & 1;
    const int fast = r->spread ? 0 : m & 1;
    lily_cuda_skinny_cp(cp);
    lily_cuda_skinny_pf(r->spread ? 0 : cp);
    lily_cuda_skinny_variant(sub ? LILY_SKINNY_SUB : LILY_SKINNY_DENORM);
    set_gemm_exact(!fast);
    g_sk_spread = r->spread ? 6.f : 0.f;
    snprintf(g_sk_tag, sizeof g_sk_tag, " [%s%s%s%s]", vname[sub], cp ? ", cp" : "",
             fast ? ", fast" : "", r->spread ? ", rows 1e-6..1e6" : "");
}
/* the defaults (gemm_skinny.cu): subnormal codes, cp.async stages, prefetch 1, exact GEMMs */
static void sk_reset(void) {
    lily_cuda_skinny_variant(LILY_SKINNY_DENORM);
    lily_cuda_skinny_cp(1);
    lily_cuda_skinny_pf(1);
    set_gemm_exact(1);
    g_sk_spread = 0;
    g_sk_tag[0] = 0;
}

/* n tokens x top-k over E experts, uniformly random distinct picks: the row counts. */
static void route_counts(int n, int E, int k, int *counts) {
    memset(counts, 0, sizeof(int) * E);
    int *sel = malloc(sizeof(int) * k);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int x, dup;
            do {
                x = (int)(pt_rnd() % E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= sel[i] == x;
            } while (dup);
            sel[j] = x;
            counts[x]++;
        }
    free(sel);
}

/* The row's expert row counts (SK_ROUTED: r->n tokens x top-r->k over r->E experts): E. */
static int sk_counts(const op_row *r, int *counts) {
    /* 0 rows, 1, odd, 8, 9, 16, 17, 53 (4 tiles), 15 */
    static const int c1[12] = {0, 1, 7, 8, 9, 0, 16, 17, 53, 3, 15, 0};
    static const int c2[5] = {0, 37, 1, 0, 5}, c3[3] = {0, 11, 0}, c4[6] = {13, 0, 16, 1, 29, 2};
    static const int *const sets[] = {c1, c2, c3, c4};
    static const int sizes[] = {12, 5, 3, 6};
    if (r->cset == SK_ROUTED) {
        if (r->E < 1 || r->E > SK_MAXE || r->k < 1 || r->k > r->E) return -1;
        route_counts(r->n, r->E, r->k, counts);
        return r->E;
    }
    if (r->cset < 0 || r->cset >= SK_ROUTED) return -1;
    memcpy(counts, sets[r->cset], sizeof(int) * sizes[r->cset]);
    return sizes[r->cset];
}

/* Experts of the given row counts, M x K Q4 each; grouped row r reads X row gather[r] (random
 * tokens of n) or row r. Bound: per grouped row (token), max_o |y_gpu - y_cpu| <= tol * max_o
 * |y_cpu| (1e-5 exact, 3e-3 one pass); every valid element written, the padding columns of Y
 * (ldy > M) keep the sentinel. */
static void sk_grouped_case(int M, int K, int E, const int *counts, int n, int use_gather) {
    lily_err e;
    char name[240];
    int R = 0, ntmax = 0;
    for (int x = 0; x < E; x++)
        R += counts[x], ntmax += (counts[x] + 15) / 16;
    const int xrows = use_gather ? n : R, ldx = K + 4, ldy = M + 3;
    lily_mat *G = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        G[x] = pt_mat(LILY_DT_Q4, M, K);
    lily_dmat dG;
    if (!pt_ok(lily_cuda_dmat_upload(G, E, &dG, &e), "upload", &e)) return;
    float *X = malloc((size_t)(xrows > 0 ? xrows : 1) * ldx * 4);
    sk_fill_x(X, xrows, ldx);
    int32_t *gather = malloc((size_t)(R + 1) * 4), *tiles = malloc((size_t)(ntmax + 1) * 12);
    for (int r = 0; r < R; r++)
        gather[r] = use_gather ? (int32_t)(pt_rnd() % n) : r;
    const int nt = pt_make_tiles(counts, E, LILY_GEMM_SKINNY_BN, tiles);
    const size_t ny = (size_t)(R > 0 ? R : 1) * ldy;
    float *ref = malloc(ny * 4), *got = malloc(ny * 4);
    float *xg = malloc((size_t)(R + 1) * K * 4), *tg = malloc((size_t)(R + 1) * M * 4);
    for (size_t i = 0; i < ny; i++)
        ref[i] = kSentinel;
    for (int x = 0, r0 = 0; x < E; r0 += counts[x], x++) {
        if (!counts[x]) continue;
        for (int i = 0; i < counts[x]; i++)
            memcpy(xg + (size_t)i * K, X + (size_t)gather[r0 + i] * ldx, (size_t)K * 4);
        lily_cpu_matmul(pt_cpu(), &G[x], xg, counts[x], K, tg, M, NULL);
        for (int i = 0; i < counts[x]; i++)
            memcpy(ref + (size_t)(r0 + i) * ldy, tg + (size_t)i * M, (size_t)M * 4);
    }
    int32_t *dgather = pt_idup(gather, (size_t)R + 1), *dtiles = pt_idup(tiles, (size_t)3 * nt + 1);
    int32_t *dnt = pt_idup(&nt, 1);
    float *dX = pt_dup(X, (size_t)(xrows > 0 ? xrows : 1) * ldx);
    for (size_t i = 0; i < ny; i++)
        got[i] = kSentinel;
    float *dY = pt_dup(got, ny);
    /* max_tiles above the valid count: the extra tiles must exit on *d_ntiles */
    int rc = lily_cuda_gemm_grouped(&dG, dX, ldx, xrows, use_gather ? dgather : NULL, dtiles, dnt,
                                    nt + 5, LILY_GEMM_SKINNY_BN, dY, ldy, NULL, &e);
    if (pt_ok(rc, "skinny grouped launch", &e)) {
        pt_get(got, dY, ny);
        double worst = 0, wabs = 0;
        int bad = 0, pad = 0;
        for (int r = 0; r < R; r++) {
            double mx = 0, d = 0;
            for (int o = 0; o < M; o++) {
                const float g = got[(size_t)r * ldy + o], f = ref[(size_t)r * ldy + o];
                if (!isfinite(g) || g == kSentinel) bad++;
                mx = fmax(mx, fabs(f));
                d = fmax(d, fabs((double)g - f));
            }
            for (int o = M; o < ldy; o++)
                pad += got[(size_t)r * ldy + o] != kSentinel;
            const double rel = mx > 0 ? d / mx : d;
            if (rel > worst) worst = rel;
            if (d > wabs) wabs = d;
        }
        const double tol = lily_cuda_gemm_exact() ? 1e-5 : 3e-3;
        const int ok = !bad && !pad && worst <= tol;
        if (ok)
            pt_pass++;
        else
            pt_fail++;
        if (worst > pt_row_rel) pt_row_rel = worst;
        if (wabs > pt_row_abs) pt_row_abs = wabs;
        int k = snprintf(name, sizeof name, "skinny W[%d x %d] x %d rows {", M, K, E);
        for (int x = 0; x < E && k < 150; x++)
            k += snprintf(name + k, sizeof name - k, "%s%d", x ? "," : "", counts[x]);
        snprintf(name + k, sizeof name - k, "}%s%s", use_gather ? " gather" : "", g_sk_tag);
        printf("%s %s: worst row rel %.3g (tol %.0e), %d unwritten/non-finite, %d padding "
               "written\n",
               ok ? "ok  " : "FAIL", name, worst, tol, bad, pad);
    }
    lily_cuda_free(dX), lily_cuda_free(dY), lily_cuda_free(dgather), lily_cuda_free(dtiles);
    lily_cuda_free(dnt);
    lily_cuda_dmat_free(&dG);
    for (int x = 0; x < E; x++)
        pt_mat_free(&G[x]);
    free(G), free(X), free(gather), free(tiles), free(ref), free(got), free(xg), free(tg);
}

/* The pair launch (gate and up in one grid) against the two single launches, which the
 * skinny rows check against the CPU: the same bits, every row of both outputs. */
static void sk_pair_case(int M, int K, int E, const int *counts, int n) {
    lily_err e;
    int R = 0, ntmax = 0;
    for (int x = 0; x < E; x++)
        R += counts[x], ntmax += (counts[x] + 15) / 16;
    const int ldx = K + 4, ldy = M + 3;
    lily_mat *G = malloc(sizeof(lily_mat) * E), *U = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        G[x] = pt_mat(LILY_DT_Q4, M, K), U[x] = pt_mat(LILY_DT_Q4, M, K);
    lily_dmat dG, dU;
    if (!pt_ok(lily_cuda_dmat_upload(G, E, &dG, &e), "upload", &e) ||
        !pt_ok(lily_cuda_dmat_upload(U, E, &dU, &e), "upload", &e))
        return;
    float *X = malloc((size_t)n * ldx * 4);
    sk_fill_x(X, n, ldx);
    int32_t *gather = malloc((size_t)(R + 1) * 4), *tiles = malloc((size_t)(ntmax + 1) * 12);
    for (int r = 0; r < R; r++)
        gather[r] = (int32_t)(pt_rnd() % n);
    const int nt = pt_make_tiles(counts, E, LILY_GEMM_SKINNY_BN, tiles);
    int32_t *dgather = pt_idup(gather, (size_t)R + 1), *dtiles = pt_idup(tiles, (size_t)3 * nt + 1);
    int32_t *dnt = pt_idup(&nt, 1);
    float *dX = pt_dup(X, (size_t)n * ldx);
    const size_t ny = (size_t)(R > 0 ? R : 1) * ldy;
    float *h[4], *d[4];
    for (int i = 0; i < 4; i++) {
        h[i] = malloc(ny * 4);
        for (size_t j = 0; j < ny; j++)
            h[i][j] = kSentinel;
        d[i] = pt_dup(h[i], ny);
    }
    int rc = lily_cuda_gemm_skinny_grouped(&dG, dX, ldx, n, dgather, dtiles, dnt, nt + 3, d[0], ldy,
                                           NULL, &e) ||
             lily_cuda_gemm_skinny_grouped(&dU, dX, ldx, n, dgather, dtiles, dnt, nt + 3, d[1], ldy,
                                           NULL, &e) ||
             lily_cuda_gemm_skinny_grouped_pair(&dG, &dU, dX, ldx, n, dgather, dtiles, dnt, nt + 3,
                                                d[2], d[3], ldy, NULL, &e);
    if (pt_ok(rc, "skinny pair launch", &e)) {
        for (int i = 0; i < 4; i++)
            pt_get(h[i], d[i], ny);
        char name[240];
        snprintf(name, sizeof name,
                 "skinny pair W[%d x %d] x %d experts, %d rows: same bits as two launches%s", M, K,
                 E, R, g_sk_tag);
        pt_check_true(name, !memcmp(h[0], h[2], ny * 4) && !memcmp(h[1], h[3], ny * 4));
    }
    for (int i = 0; i < 4; i++)
        lily_cuda_free(d[i]), free(h[i]);
    lily_cuda_free(dX), lily_cuda_free(dgather), lily_cuda_free(dtiles), lily_cuda_free(dnt);
    lily_cuda_dmat_free(&dG), lily_cuda_dmat_free(&dU);
    for (int x = 0; x < E; x++)
        pt_mat_free(&G[x]), pt_mat_free(&U[x]);
    free(G), free(U), free(X), free(gather), free(tiles);
}

static void run_skinny(const op_row *r) {
    if (r->op == OP_SKINNY_ARGS) { /* 16-row tiles are Q4 only */
        lily_err e;
        lily_mat b = pt_mat(LILY_DT_BF16, 64, 64);
        lily_dmat db;
        if (pt_ok(lily_cuda_dmat_upload(&b, 1, &db, &e), "upload", &e)) {
            float *d = pt_dalloc(64 * 64 * 4);
            int32_t one = 1, *dn = pt_idup(&one, 1);
            pt_check_true("gemm_grouped refuses 16-row tiles of bf16 weights",
                          lily_cuda_gemm_grouped(&db, d, 64, 1, NULL, dn, dn, 1,
                                                 LILY_GEMM_SKINNY_BN, d, 64, NULL, &e) == -1);
            lily_cuda_free(d), lily_cuda_free(dn);
            lily_cuda_dmat_free(&db);
        }
        pt_mat_free(&b);
        return;
    }
    int counts[SK_MAXE];
    const int E = sk_counts(r, counts);
    if (E < 1 || r->M < 1 || r->dim < 1 || ((r->gather || r->op == OP_SKINNY_PAIR) && r->n < 1)) {
        pt_check_true("skinny row: counts and shape in range", 0);
        return;
    }
    for (int m = 0; m < sk_modes(r); m++) {
        sk_set_mode(r, m);
        if (r->op == OP_SKINNY_PAIR)
            sk_pair_case(r->M, r->dim, E, counts, r->n);
        else
            sk_grouped_case(r->M, r->dim, E, counts, r->n, r->gather);
    }
    sk_reset();
}

/* LILY_CUDA_TIME=1 (skinny selected) or 1s: the 35B-A3B expert GEMMs (256 experts, top-8;
 * gate/up 512 x 2048 and down 2048 x 512) for chunks of 64 .. 512 tokens: the 32-row tiles of
 * gemm.cu, the skinny kernel's forms, and the default form with one-pass GEMMs (variant 8: the hi
 * plane alone); LILY_SKINNY_TIME_N (64, 128, 256, 512) and LILY_SKINNY_TIME_V (0 = 32-row tiles ..
 * 8) pick one chunk size and one variant. */
typedef struct {
    lily_dmat *W;
    float *X, *Y;
    int ldx, nx, ldy, max_tiles, bn;
    int32_t *gather, *tiles, *nt;
} sk_tctx;

static int sk_t_grouped(void *p) {
    const sk_tctx *c = p;
    lily_err e;
    return lily_cuda_gemm_grouped(c->W, c->X, c->ldx, c->nx, c->gather, c->tiles, c->nt,
                                  c->max_tiles, c->bn, c->Y, c->ldy, NULL, &e);
}

static lily_dmat sk_up_q4(int M, int K, int E) {
    lily_err e;
    lily_mat m = pt_mat(LILY_DT_Q4, M, K); /* one random expert, uploaded E times */
    lily_mat *ms = malloc(sizeof(lily_mat) * E);
    for (int x = 0; x < E; x++)
        ms[x] = m;
    lily_dmat d;
    if (lily_cuda_dmat_upload(ms, E, &d, &e)) {
        printf("FAIL upload: %s\n", e.msg);
        exit(1);
    }
    pt_mat_free(&m);
    free(ms);
    return d;
}

static void skinny_timing(void) {
    const int H = 2048, I = 512, E = 256, k = 8, nmax = 512;
    lily_dmat Gs = sk_up_q4(I, H, E), Ds = sk_up_q4(H, I, E);
    const size_t wbytes = lily_cuda_dmat_bytes(&Gs);
    float *X = malloc((size_t)nmax * k * H * 4);
    pt_fill(X, (size_t)nmax * k * H, 1.0f);
    float *dX = pt_dup(X, (size_t)nmax * k * H);
    float *dY = pt_dalloc((size_t)nmax * k * H * 4);
    int counts[256];
    int32_t *gather = malloc(sizeof(int32_t) * nmax * k), *tiles = malloc(12 * (nmax * k + E));
    const int ns[4] = {64, 128, 256, 512};
    const char *only_n = getenv("LILY_SKINNY_TIME_N"), *only_v = getenv("LILY_SKINNY_TIME_V");
    for (int j = 0; j < 4; j++) {
        const int n = ns[j];
        if (only_n && atoi(only_n) != n) continue;
        route_counts(n, E, k, counts);
        for (int r = 0; r < n * k; r++)
            gather[r] = (int32_t)(pt_rnd() % n);
        int32_t *dgather = pt_idup(gather, (size_t)n * k);
        /* 32-row tiles, then the skinny variants; 8: the default (cp pf1) with one-pass GEMMs */
        for (int v = 0; v < 9; v++) {
            if (only_v && atoi(only_v) != v) continue;
            static const char *vn[9] = {"32-row tiles",  "skinny denorm", "skinny sub",
                                        "skinny cp",     "skinny pf1",    "skinny pf2",
                                        "skinny cp pf1", "skinny cp pf2", "cp pf1 1-pass"};
            const int bn = v == 0 ? LILY_GEMM_GROUP_BN : LILY_GEMM_SKINNY_BN;
            if (v) lily_cuda_skinny_variant(v == 2 ? LILY_SKINNY_SUB : LILY_SKINNY_DENORM);
            lily_cuda_skinny_cp(v == 3 || v >= 6);
            lily_cuda_skinny_pf(v == 4 || v == 6 || v == 8 ? 1 : v == 5 || v == 7 ? 2 : 0);
            set_gemm_exact(v != 8);
            int nt = pt_make_tiles(counts, E, bn, tiles);
            sk_tctx c;
            c.tiles = pt_idup(tiles, (size_t)3 * nt), c.nt = pt_idup(&nt, 1);
            c.max_tiles = n * k / bn + E, c.bn = bn, c.Y = dY;
            c.W = &Gs, c.X = dX, c.ldx = H, c.ldy = I, c.nx = n, c.gather = dgather;
            float us = pt_time_median(sk_t_grouped, &c, 0);
            printf("time gate/up 512 x 2048 x 256 n=%-4d %-14s %8.1f us  %6.2f TB/s of weights "
                   "(%d tiles)\n",
                   n, vn[v], us, wbytes / us * 1e-6, nt);
            c.W = &Ds, c.ldx = I, c.ldy = H, c.nx = n * k, c.gather = NULL;
            us = pt_time_median(sk_t_grouped, &c, 0);
            printf("time down    2048 x 512 x 256 n=%-4d %-14s %8.1f us  %6.2f TB/s of weights\n",
                   n, vn[v], us, wbytes / us * 1e-6);
            lily_cuda_free(c.tiles), lily_cuda_free(c.nt);
        }
        set_gemm_exact(1);
        lily_cuda_free(dgather);
    }
    sk_reset();
    lily_cuda_dmat_free(&Gs), lily_cuda_dmat_free(&Ds);
    lily_cuda_free(dX), lily_cuda_free(dY);
    free(X), free(gather), free(tiles);
}

/* ---- MoE ------------------------------------------------------------------------------------- */

/* The weights of one MoE (or dense MLP) layer, on the host as a lily_layer + lily_config for the
 * CPU block and on the device as a lily_cuda_moe. */
typedef struct {
    int E, k, H, I, Is, has_sg;
    lily_config cfg;
    lily_layer ly;
    lily_mat router, *gate, *up, *down, sh_gate, sh_up, sh_down, sh_gw;
    lily_dmat d_router, d_gate, d_up, d_down, d_sg, d_su, d_sd, d_sgw;
    lily_dmat d_rgw, d_sgu, v_router, v_sgw, v_sg, v_su; /* moe_stack: stacks and their views */
    lily_cuda_moe m;
    float *norm_w;
} moe_fix;

static int moe_make(moe_fix *f, const op_row *r) {
    lily_err e;
    const int E = r->E, k = r->k, H = r->dim, I = r->I, Is = r->Is, has_sg = r->sg;
    memset(f, 0, sizeof *f);
    f->E = E, f->k = k, f->H = H, f->I = I, f->Is = Is, f->has_sg = has_sg;
    f->norm_w = malloc(H * 4);
    for (int i = 0; i < H; i++)
        f->norm_w[i] = 1 + 0.2f * pt_frand();
    f->m.E = E, f->m.k = k, f->m.norm = 1;
    if (E) {
        f->router = pt_mat(LILY_DT_Q8, E, H);
        f->gate = calloc(E, sizeof(lily_mat));
        f->up = calloc(E, sizeof(lily_mat));
        f->down = calloc(E, sizeof(lily_mat));
        for (int x = 0; x < E; x++) {
            f->gate[x] = pt_mat(LILY_DT_Q4, I, H);
            f->up[x] = pt_mat(LILY_DT_Q4, I, H);
            f->down[x] = pt_mat(LILY_DT_Q4, H, I);
        }
        if (lily_cuda_dmat_upload(&f->router, 1, &f->d_router, &e) ||
            lily_cuda_dmat_upload(f->gate, E, &f->d_gate, &e) ||
            lily_cuda_dmat_upload(f->up, E, &f->d_up, &e) ||
            lily_cuda_dmat_upload(f->down, E, &f->d_down, &e))
            return pt_ok(-1, "upload experts", &e), -1;
        f->m.router = &f->d_router, f->m.gate = &f->d_gate, f->m.up = &f->d_up;
        f->m.down = &f->d_down;
    }
    if (Is) {
        f->sh_gate = pt_mat(LILY_DT_Q4, Is, H);
        f->sh_up = pt_mat(LILY_DT_Q4, Is, H);
        f->sh_down = pt_mat(LILY_DT_Q4, H, Is);
        if (lily_cuda_dmat_upload(&f->sh_gate, 1, &f->d_sg, &e) ||
            lily_cuda_dmat_upload(&f->sh_up, 1, &f->d_su, &e) ||
            lily_cuda_dmat_upload(&f->sh_down, 1, &f->d_sd, &e))
            return pt_ok(-1, "upload shared", &e), -1;
        f->m.sh_gate = &f->d_sg, f->m.sh_up = &f->d_su, f->m.sh_down = &f->d_sd;
        if (has_sg) {
            f->sh_gw = pt_mat(LILY_DT_Q8, 1, H);
            if (lily_cuda_dmat_upload(&f->sh_gw, 1, &f->d_sgw, &e))
                return pt_ok(-1, "upload shared gate", &e), -1;
            f->m.sh_gate_w = &f->d_sgw;
        }
    }
    /* the CPU block's view of the same weights: E = 0 is the dense MLP (gate, up, down) */
    lily_config *c = &f->cfg;
    snprintf(c->model_type, sizeof c->model_type, "%s", E ? "qwen3_5_moe" : "qwen3_5");
    c->is_moe = E > 0;
    c->hidden = H, c->n_layers = 1, c->vocab = 1, c->rms_eps = 1e-6f;
    c->n_experts = E, c->top_k = k, c->moe_inter = I, c->norm_topk_prob = 1;
    c->shared_inter = E ? Is : 0;
    c->intermediate = E ? 0 : Is;
    c->conv_k = 4;
    if (E) {
        f->ly.router = f->router;
        f->ly.exp_gate = f->gate, f->ly.exp_up = f->up, f->ly.exp_down = f->down;
        f->ly.sh_gate = f->sh_gate, f->ly.sh_up = f->sh_up, f->ly.sh_down = f->sh_down;
        f->ly.sh_gate_w = f->sh_gw; /* no weights when has_sg = 0: a gate of 1 */
    } else {
        f->ly.mlp_gate = f->sh_gate, f->ly.mlp_up = f->sh_up, f->ly.mlp_down = f->sh_down;
    }
    return 0;
}

/* The stacked form the backend uploads (lily_cuda_moe.router_gw, .sh_gu): router over the shared
 * gate row and shared gate over up, one allocation each, the matrices as views of their rows. */
static int moe_stack(moe_fix *f) {
    lily_err e;
    if (f->E && f->has_sg) {
        const lily_mat ms[2] = {f->router, f->sh_gw};
        lily_dmat v[2];
        if (!pt_ok(lily_cuda_dmat_upload_cat(ms, 2, &f->d_rgw, v, &e), "stack router/shared gate",
                   &e))
            return -1;
        f->v_router = v[0], f->v_sgw = v[1];
        f->m.router = &f->v_router, f->m.sh_gate_w = &f->v_sgw, f->m.router_gw = &f->d_rgw;
    }
    if (f->Is) {
        const lily_mat ms[2] = {f->sh_gate, f->sh_up};
        lily_dmat v[2];
        if (!pt_ok(lily_cuda_dmat_upload_cat(ms, 2, &f->d_sgu, v, &e), "stack shared gate/up", &e))
            return -1;
        f->v_sg = v[0], f->v_su = v[1];
        f->m.sh_gate = &f->v_sg, f->m.sh_up = &f->v_su, f->m.sh_gu = &f->d_sgu;
    }
    return 0;
}

static void moe_free(moe_fix *f) {
    lily_cuda_dmat_free(&f->d_rgw), lily_cuda_dmat_free(&f->d_sgu);
    for (int x = 0; x < f->E && f->gate; x++) {
        pt_mat_free(&f->gate[x]), pt_mat_free(&f->up[x]), pt_mat_free(&f->down[x]);
    }
    free(f->gate), free(f->up), free(f->down), free(f->norm_w);
    pt_mat_free(&f->router), pt_mat_free(&f->sh_gate), pt_mat_free(&f->sh_up);
    pt_mat_free(&f->sh_down), pt_mat_free(&f->sh_gw);
    lily_cuda_dmat_free(&f->d_router), lily_cuda_dmat_free(&f->d_gate);
    lily_cuda_dmat_free(&f->d_up), lily_cuda_dmat_free(&f->d_down), lily_cuda_dmat_free(&f->d_sg);
    lily_cuda_dmat_free(&f->d_su), lily_cuda_dmat_free(&f->d_sd), lily_cuda_dmat_free(&f->d_sgw);
}

/* x [n][H] += lily_cpu_ffn_block of the normed rows u [n][H] with the given routing (ignored for
 * a dense MLP); as_decode picks the block's decode (row) or prefill products. 0 or -1. */
static int moe_ref(moe_fix *f, const float *u, int n, const int *idx, const float *wt,
                   int as_decode, float *x) {
    lily_err e;
    const size_t nh = (size_t)n * f->H;
    float *out = malloc(nh * 4);
    int rc = lily_cpu_ffn_block(pt_cpu(), &f->cfg, &f->ly, u, n, f->k ? idx : NULL,
                                f->k ? wt : NULL, as_decode, out, g_pool, &e);
    if (pt_ok(rc, "lily_cpu_ffn_block", &e))
        for (size_t i = 0; i < nh; i++)
            x[i] += out[i];
    free(out);
    return rc ? -1 : 0;
}

/* The CPU top-k of the router for normed rows u [n][H]: idx, wt [n][k]. */
static void moe_topk(moe_fix *f, const float *u, int n, int *idx, float *wt) {
    float *lg = malloc((size_t)f->E * 4);
    for (int t = 0; t < n; t++) {
        lily_cpu_matmul(pt_cpu(), &f->router, u + (size_t)t * f->H, 1, f->H, lg, f->E, NULL);
        lily_cpu_topk_softmax(lg, f->E, f->k, 1, idx + (size_t)t * f->k, wt + (size_t)t * f->k);
    }
    free(lg);
}

/* Whether the fixture's decode should take the fused-router path when the switch is on: the
 * fixtures have a Q8 router and Q4 experts, so it is the tensor-core gate/up kernel's shapes
 * (and every grid here is small enough to be resident). */
static int expect_fused(const moe_fix *f) {
    return f->k > 0 && f->H % 256 == 0;
}

/* One decode step of x [H] on scratch scr: the output, and the routing when k > 0. */
static int dec_run(moe_fix *f, const float *x, const float *dw, void *scr, float *got, int *gidx,
                   float *gwt) {
    lily_err e;
    float *dx = pt_dup(x, f->H);
    int rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, NULL, &e);
    if (!pt_ok(rc, "moe decode launch", &e)) return lily_cuda_free(dx), -1;
    if (f->k) {
        lily_cuda_sync(&e);
        lily_cuda_d2h(gidx, lily_cuda_moe_decode_idx(&f->m, scr), f->k * 4, &e);
        lily_cuda_d2h(gwt, lily_cuda_moe_decode_wt(&f->m, scr), f->k * 4, &e);
    }
    pt_get(got, dx, f->H);
    lily_cuda_free(dx);
    return 0;
}

/* The decode step with the router GEMV (fused 0) and with the router fused into the gate/up
 * launch (fused 1), each twice on one scratch that starts poisoned: with the switch on, the
 * first step finds no barrier tag and computes the router per block, the second goes through
 * the grid barrier (moe_router.cuh). Every step is checked against the CPU block; the fused steps
 * must also route exactly as the unfused one and give the same output (the kernels are designed
 * to be bit-identical; the count of differing floats is printed). */
static void moe_decode_case(moe_fix *f, double tol) {
    char name[200];
    int H = f->H, k = f->k;
    if (k > 32) {
        pt_check_true("moe decode row: top-k <= 32", 0);
        return;
    }
    float *x = malloc(H * 4), *u = malloc(H * 4);
    pt_fill(x, H, 2.0f);
    lily_cpu_rmsnorm(x, f->norm_w, H, 1e-6f, u);
    float *dw = pt_dup(f->norm_w, H);
    float *got[2][2], *ref = malloc(H * 4);
    int gidx[2][2][32] = {{{0}}}, cidx[32] = {0};
    float gwt[2][2][32] = {{{0}}}, cw[32] = {0};
    if (k) moe_topk(f, u, 1, cidx, cw);
    for (int fu = 0; fu < 2; fu++) {
        lily_cuda_moe_force_unfused(!fu);
        int fuses = lily_cuda_moe_decode_fuses(&f->m);
        snprintf(name, sizeof name, "moe decode E=%d k=%d H=%d fused router %s (switch %d)", f->E,
                 k, H, fuses ? "on" : "off", fu);
        pt_check_true(name, fuses == (fu && expect_fused(f)));
        void *scr = pt_dalloc(lily_cuda_moe_decode_scratch(&f->m));
        /* a recycled allocation: a valid barrier tag over a count that is not zero */
        const uint32_t stale[2] = {37u, 0x7fa11e5du};
        lily_err ei;
        pt_ok(lily_cuda_h2d(scr, stale, sizeof stale, &ei) ||
                  lily_cuda_moe_decode_scratch_init(scr, NULL, &ei),
              "moe decode scratch init", &ei);
        for (int call = 0; call < 2; call++) {
            const char *tag = fu ? (call ? " [fused, barrier]" : " [fused, first step]")
                                 : (call ? " [unfused, again]" : " [unfused]");
            got[fu][call] = malloc(H * 4);
            if (dec_run(f, x, dw, scr, got[fu][call], gidx[fu][call], gwt[fu][call])) {
                memset(got[fu][call], 0, H * 4);
                continue;
            }
            memcpy(ref, x, H * 4);
            if (moe_ref(f, u, 1, gidx[fu][call], gwt[fu][call], 1, ref)) continue;
            if (k) {
                int same = 1;
                for (int j = 0; j < k; j++)
                    same &= gidx[fu][call][j] == cidx[j];
                snprintf(name, sizeof name, "moe decode routing E=%d k=%d matches the CPU top-k%s",
                         f->E, k, tag);
                pt_check_true(name, same);
                snprintf(name, sizeof name, "moe decode routing weights E=%d k=%d%s", f->E, k, tag);
                pt_check(name, gwt[fu][call], cw, k, tol);
            }
            snprintf(name, sizeof name, "moe decode out E=%d k=%d H=%d I=%d Is=%d%s%s", f->E, k, H,
                     f->I, f->Is, f->has_sg ? " gated shared" : "", tag);
            pt_check(name, got[fu][call], ref, H, tol);
        }
        lily_cuda_free(scr);
    }
    for (int call = 0; call < 2; call++) {
        int same = !memcmp(gidx[0][0], gidx[1][call], sizeof gidx[0][0]) &&
                   !memcmp(gwt[0][0], gwt[1][call], sizeof gwt[0][0]);
        int diff = 0;
        for (int i = 0; i < H; i++)
            diff += memcmp(&got[0][0][i], &got[1][call][i], 4) != 0;
        snprintf(name, sizeof name,
                 "moe decode E=%d k=%d H=%d fused step %d routes as unfused (idx, wt bitwise)",
                 f->E, k, H, call + 1);
        pt_check_true(name, same);
        snprintf(name, sizeof name,
                 "moe decode E=%d H=%d fused step %d vs unfused (%d of %d differ)", f->E, H,
                 call + 1, diff, H);
        pt_check(name, got[1][call], got[0][0], H, 1e-6);
    }
    lily_cuda_moe_force_unfused(1);
    for (int fu = 0; fu < 2; fu++)
        free(got[fu][0]), free(got[fu][1]);
    lily_cuda_free(dw);
    free(x), free(u), free(ref);
}

/* The decode of R rows (lily_cuda_moe_decode_rows) at a padded row stride, under the router
 * switch off (the router GEMV everywhere) and on (the default: one row alone runs the fused
 * router, R rows the rows GEMV). Each row against the one-row decode of that row alone on a
 * scratch of its own under the same switch: bit for bit, except R > 1 with the switch on, which
 * compares the fused router with the GEMV (designed bit-identical, checked to 1e-6, the count of
 * differing floats printed, as moe_decode does); its routing (idx, wt at r k) the same bits; its
 * output against the CPU block with that routing; the padding between rows untouched. share: 0
 * rows of their own (experts shared only by chance), 1 every row the same input (every expert
 * shared by every row), 2 row r = row r % ceil(R / 2) (rows on the same experts beside others). */
static void moe_rows_case(moe_fix *f, int R, int share, double tol) {
    char name[240];
    lily_err e;
    const int H = f->H, k = f->k, ld = H + 4, kk = k ? k : 1;
    if (R < 1 || R > LILY_MOE_ROWS || k > 32) {
        pt_check_true("moe rows row: 1 <= rows <= LILY_MOE_ROWS, top-k <= 32", 0);
        return;
    }
    const int distinct = share == 1 ? 1 : share == 2 ? (R + 1) / 2 : R;
    const size_t nx = (size_t)R * ld;
    float *x = malloc(nx * 4), *got = malloc(nx * 4), *one = malloc(H * 4), *u = malloc(H * 4);
    float *ref = malloc(H * 4), *gwt = malloc((size_t)R * kk * 4), wt1[32];
    int *gidx = malloc((size_t)R * kk * 4), idx1[32], cidx[32];
    float *lg = malloc(((size_t)f->E + 1) * 4);
    float cw[32];
    for (int r = 0; r < R; r++) {
        if (r < distinct)
            pt_fill(x + (size_t)r * ld, ld, 2.0f);
        else
            memcpy(x + (size_t)r * ld, x + (size_t)(r % distinct) * ld, ld * 4);
    }
    float *dw = pt_dup(f->norm_w, H);
    const size_t sb = lily_cuda_moe_decode_scratch(&f->m);
    void *scr = pt_dalloc(sb), *scr1 = pt_dalloc(sb);
    for (int sw = 1; sw >= 0; sw--) {
        const char *tag = sw ? "router GEMV" : "default router";
        lily_cuda_moe_force_unfused(sw);
        float *dx = pt_dup(x, nx);
        int rc = lily_cuda_moe_decode_scratch_init(scr, NULL, &e) ||
                 lily_cuda_moe_decode_scratch_init(scr1, NULL, &e) ||
                 lily_cuda_moe_decode_rows(&f->m, R, dx, ld, dw, 1e-6f, scr, NULL, &e) ||
                 lily_cuda_sync(&e);
        snprintf(name, sizeof name, "moe rows R=%d E=%d k=%d H=%d (%s): launch", R, f->E, k, H,
                 tag);
        if (!pt_ok(rc, name, &e)) {
            lily_cuda_free(dx);
            continue;
        }
        pt_get(got, dx, nx);
        if (k) {
            lily_cuda_d2h(gidx, lily_cuda_moe_decode_idx(&f->m, scr), (size_t)R * k * 4, &e);
            lily_cuda_d2h(gwt, lily_cuda_moe_decode_wt(&f->m, scr), (size_t)R * k * 4, &e);
        }
        lily_cuda_free(dx);
        int pad_bad = 0;
        for (int r = 0; r < R; r++)
            pad_bad += memcmp(got + (size_t)r * ld + H, x + (size_t)r * ld + H, (ld - H) * 4) != 0;
        snprintf(name, sizeof name, "moe rows R=%d E=%d H=%d (%s): padding untouched (%d rows)", R,
                 f->E, H, tag, pad_bad);
        pt_check_true(name, pad_bad == 0);
        const int bitwise = sw || R == 1;
        for (int r = 0; r < R; r++) {
            const float *xr = x + (size_t)r * ld, *gr = got + (size_t)r * ld;
            /* the row alone, on the other scratch (its barrier pair set up for the fused form) */
            float *d1 = pt_dup(xr, H);
            rc = lily_cuda_moe_decode(&f->m, d1, dw, 1e-6f, scr1, NULL, &e) || lily_cuda_sync(&e);
            if (!pt_ok(rc, "moe rows: the one-row decode", &e)) {
                lily_cuda_free(d1);
                continue;
            }
            pt_get(one, d1, H);
            lily_cuda_free(d1);
            int diff = 0;
            for (int i = 0; i < H; i++)
                diff += memcmp(&gr[i], &one[i], 4) != 0;
            snprintf(name, sizeof name,
                     "moe rows R=%d row %d E=%d k=%d H=%d I=%d Is=%d%s (%s) vs the row alone: %d "
                     "of %d differ",
                     R, r, f->E, k, H, f->I, f->Is, f->has_sg ? " gated" : "", tag, diff, H);
            if (bitwise)
                pt_check_true(name, diff == 0);
            else
                pt_check(name, gr, one, H, 1e-6);
            lily_cpu_rmsnorm(xr, f->norm_w, H, 1e-6f, u);
            if (k) {
                lily_cuda_d2h(idx1, lily_cuda_moe_decode_idx(&f->m, scr1), k * 4, &e);
                lily_cuda_d2h(wt1, lily_cuda_moe_decode_wt(&f->m, scr1), k * 4, &e);
                snprintf(name, sizeof name,
                         "moe rows R=%d row %d E=%d k=%d (%s): routing as the row alone (bitwise)",
                         R, r, f->E, k, tag);
                pt_check_true(name, !memcmp(idx1, gidx + (size_t)r * k, k * 4) &&
                                        !memcmp(wt1, gwt + (size_t)r * k, k * 4));
                /* against the CPU top-k, up to near ties: every chosen expert's CPU logit at
                 * least the CPU's k-th largest (to 1e-4) */
                moe_topk(f, u, 1, cidx, cw);
                lily_cpu_matmul(pt_cpu(), &f->router, u, 1, H, lg, f->E, NULL);
                float kth = lg[cidx[0]];
                for (int j = 1; j < k; j++)
                    kth = fminf(kth, lg[cidx[j]]);
                int same = 1;
                for (int j = 0; j < k; j++)
                    same &= lg[gidx[(size_t)r * k + j]] >= kth - 1e-4f * (1.0f + fabsf(kth));
                snprintf(name, sizeof name,
                         "moe rows R=%d row %d E=%d k=%d (%s): routing is the CPU top-k (up to "
                         "near ties)",
                         R, r, f->E, k, tag);
                pt_check_true(name, same);
            }
            memcpy(ref, xr, H * 4);
            if (moe_ref(f, u, 1, k ? gidx + (size_t)r * k : NULL, k ? gwt + (size_t)r * k : NULL, 1,
                        ref))
                continue;
            snprintf(name, sizeof name, "moe rows R=%d row %d E=%d k=%d H=%d (%s): out vs CPU", R,
                     r, f->E, k, H, tag);
            pt_check(name, gr, ref, H, tol);
        }
    }
    lily_cuda_moe_force_unfused(1);
    lily_cuda_free(scr), lily_cuda_free(scr1), lily_cuda_free(dw);
    free(x), free(got), free(one), free(u), free(ref), free(gwt), free(gidx), free(lg);
}

/* The fused router under CUDA graph replay, as the backend runs it: two MoE "layers" on one
 * scratch captured into a graph with the switch on, replayed three times from the same input.
 * Replay 1 starts on a new scratch (poisoned, its barrier pair zeroed by
 * lily_cuda_moe_decode_scratch_init: layer 1 without the barrier tag, layer 2 with the tag
 * that layer 1's down kernel wrote); replays 2 and 3 reuse the self-resetting barrier. Each must
 * equal the same two layers run eagerly through the router GEMV. */
static void moe_graph_case(moe_fix *f) {
    lily_err e;
    char name[200];
    int H = f->H, k = f->k;
    if (k < 1 || k > 32) {
        pt_check_true("moe graph row: 1 <= top-k <= 32", 0);
        return;
    }
    float *x = malloc(H * 4), *want = malloc(H * 4), *got = malloc(H * 4);
    int widx[32] = {0}, gidx[32] = {0};
    pt_fill(x, H, 2.0f);
    float *dw = pt_dup(f->norm_w, H), *dx = pt_dup(x, H);
    size_t sb = lily_cuda_moe_decode_scratch(&f->m);
    lily_cuda_moe_force_unfused(1);
    void *scr0 = pt_dalloc(sb);
    int rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr0, NULL, &e) ||
             lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr0, NULL, &e);
    if (!pt_ok(rc, "moe decode (graph reference)", &e)) return;
    pt_get(want, dx, H);
    lily_cuda_d2h(widx, lily_cuda_moe_decode_idx(&f->m, scr0), k * 4, &e);
    lily_cuda_moe_force_unfused(0);
    void *scr = pt_dalloc(sb);
    if (lily_cuda_moe_decode_scratch_init(scr, NULL, &e) || lily_cuda_sync(&e))
        return (void)pt_ok(-1, "init, sync", &e); /* the poison and init (legacy stream) */
    cudaStream_t st = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
             cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (ok) {
        rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, st, &e) ||
             lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, st, &e);
        ok = cudaStreamEndCapture(st, &g) == cudaSuccess && !rc &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    if (rc) printf("     capture: %s\n", e.msg);
    snprintf(name, sizeof name, "moe decode E=%d H=%d: two fused layers captured in a graph", f->E,
             H);
    pt_check_true(name, ok && lily_cuda_moe_decode_fuses(&f->m) == expect_fused(f));
    for (int rep = 0; ok && rep < 3; rep++) {
        ok = cudaMemcpyAsync(dx, x, H * 4, cudaMemcpyHostToDevice, st) == cudaSuccess &&
             cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;
        if (!ok) {
            snprintf(name, sizeof name, "moe decode graph replay %d: %s", rep + 1,
                     cudaGetErrorString(cudaGetLastError()));
            pt_check_true(name, 0);
            break;
        }
        pt_get(got, dx, H);
        lily_cuda_d2h(gidx, lily_cuda_moe_decode_idx(&f->m, scr), k * 4, &e);
        snprintf(name, sizeof name, "moe decode graph replay %d routes layer 2 as unfused",
                 rep + 1);
        pt_check_true(name, !memcmp(gidx, widx, sizeof gidx));
        snprintf(name, sizeof name, "moe decode graph replay %d (fused) vs eager unfused", rep + 1);
        pt_check(name, got, want, H, 1e-6);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (st) cudaStreamDestroy(st);
    lily_cuda_moe_force_unfused(1);
    lily_cuda_free(dw), lily_cuda_free(dx), lily_cuda_free(scr0), lily_cuda_free(scr);
    free(x), free(want), free(got);
}

/* route 0: computed routing; 1: every token on experts 0..k-1; 2: skewed random. */
static void moe_prefill_case(moe_fix *f, int n, int route, double tol) {
    lily_err e;
    char name[160];
    int H = f->H, k = f->k, E = f->E;
    size_t nh = (size_t)n * H;
    float *x = malloc(nh * 4), *u = malloc(nh * 4);
    pt_fill(x, nh, 1.0f);
    pt_fill(u, nh, 1.5f);
    int *idx = malloc((size_t)n * (k + 1) * 4), *cidx = malloc((size_t)n * (k + 1) * 4);
    float *wt = malloc((size_t)n * (k + 1) * 4), *cwt = malloc((size_t)n * (k + 1) * 4);
    if (route && k) {
        for (int t = 0; t < n; t++) {
            float s = 0;
            for (int j = 0; j < k; j++) {
                int ex;
                if (route == 1)
                    ex = j;
                else
                    do {
                        ex = (pt_rnd() % 4 == 0) ? (int)(pt_rnd() % E) : (int)(pt_rnd() % 3);
                        for (int i = 0; i < j; i++)
                            if (idx[(size_t)t * k + i] == ex) ex = -1;
                    } while (ex < 0);
                idx[(size_t)t * k + j] = ex;
                wt[(size_t)t * k + j] = 0.1f + fabsf(pt_frand());
                s += wt[(size_t)t * k + j];
            }
            for (int j = 0; j < k; j++)
                wt[(size_t)t * k + j] /= s;
        }
    }
    float *du = pt_dup(u, nh), *dx = pt_dup(x, nh);
    void *scr = pt_dalloc(lily_cuda_moe_prefill_scratch(&f->m, n));
    int rc;
    if (route && k) {
        int32_t *didx = pt_idup(idx, (size_t)n * k);
        float *dwt = pt_dup(wt, (size_t)n * k);
        rc = lily_cuda_moe_prefill_routed(&f->m, du, n, didx, dwt, dx, scr, NULL, &e);
        lily_cuda_sync(&e);
        lily_cuda_free(didx), lily_cuda_free(dwt);
    } else {
        rc = lily_cuda_moe_prefill(&f->m, du, n, dx, scr, NULL, &e);
        if (k) {
            lily_cuda_sync(&e);
            lily_cuda_d2h(idx, lily_cuda_moe_prefill_idx(&f->m, n, scr), (size_t)n * k * 4, &e);
            lily_cuda_d2h(wt, lily_cuda_moe_prefill_wt(&f->m, n, scr), (size_t)n * k * 4, &e);
        }
    }
    if (!pt_ok(rc, "moe prefill launch", &e)) return;
    if (route == 0 && k) {
        moe_topk(f, u, n, cidx, cwt);
        int same = 0;
        for (int i = 0; i < n * k; i++)
            same += idx[i] == cidx[i];
        snprintf(name, sizeof name, "moe prefill routing n=%d: %d of %d picks as on the CPU", n,
                 same, n * k);
        /* the router GEMM is exact to ~1e-4 (fp16 weights, split activations): a flip would take
         * a near tie */
        pt_check_true(name, same >= n * k * 99 / 100);
    }
    float *ref = malloc(nh * 4), *got = malloc(nh * 4);
    memcpy(ref, x, nh * 4);
    if (!moe_ref(f, u, n, idx, wt, 0, ref)) {
        pt_get(got, dx, nh);
        static const char *routes[] = {"routed on GPU", "all tokens on experts 0..k-1", "skewed"};
        snprintf(name, sizeof name, "moe prefill out E=%d k=%d H=%d I=%d n=%d %s", E, k, H, f->I, n,
                 k ? routes[route] : "dense");
        pt_check(name, got, ref, nh, tol);
    }
    lily_cuda_free(du), lily_cuda_free(dx), lily_cuda_free(scr);
    free(x), free(u), free(idx), free(cidx), free(wt), free(cwt), free(ref), free(got);
}

static void run_moe(const op_row *r) {
    moe_fix f;
    if (moe_make(&f, r) == 0 && (!r->stack || moe_stack(&f) == 0)) {
        if (r->op == OP_MOE_DECODE)
            moe_decode_case(&f, r->tol);
        else if (r->op == OP_MOE_ROWS)
            moe_rows_case(&f, r->n, r->route, r->tol);
        else if (r->op == OP_MOE_GRAPH)
            moe_graph_case(&f);
        else
            moe_prefill_case(&f, r->n, r->route, r->tol);
    }
    moe_free(&f);
}

/* ---- Gated DeltaNet: conv, scan, gated RMSNorm --------------------------------------------- */

static float sig_h(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static float softplus_h(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* The CPU reference from a random non-zero state, then the scan from the same state, comparing
 * output and final state. */
static void scan_case(int Nk, int Nv, int Dv, int n, double tol) {
    const int Dk = 128, C = 2 * Nk * Dk + Nv * Dv, ld = C + 4, ldba = 2 * Nv + 3;
    lily_err e;
    char name[128];
    float *qkv = malloc((size_t)n * ld * 4), *ba = malloc((size_t)n * ldba * 4);
    pt_fill(qkv, (size_t)n * ld, 1.0f);
    pt_fill(ba, (size_t)n * ldba, 3.0f);
    float *A_log = malloc(Nv * 4), *dtb = malloc(Nv * 4);
    for (int j = 0; j < Nv; j++)
        A_log[j] = pt_frand() * 1.5f, dtb[j] = pt_frand();
    size_t sn = (size_t)Nv * Dk * Dv;
    float *S = malloc(sn * 4), *Sg = malloc(sn * 4);
    pt_fill(S, sn, 0.3f);
    for (int j = 0; j < Nv; j++)
        for (int k = 0; k < Dk; k++)
            for (int v = 0; v < Dv; v++)
                Sg[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)] = S[((size_t)j * Dk + k) * Dv + v];
    /* device inputs first (the CPU run normalises q, k in place and updates S) */
    float *dqkv = pt_dup(qkv, (size_t)n * ld), *dba = pt_dup(ba, (size_t)n * ldba);
    float *dA = pt_dup(A_log, Nv), *ddt = pt_dup(dtb, Nv);
    int ldo = Nv * Dv + 8;
    /* CPU: norms and gates, then the reference scan per head */
    float *beta = malloc((size_t)n * Nv * 4), *lam = malloc((size_t)n * Nv * 4);
    for (int t = 0; t < n; t++) {
        float *row = qkv + (size_t)t * ld;
        for (int i = 0; i < 2 * Nk; i++) {
            float *h = row + (size_t)i * Dk;
            double ss = 0;
            for (int d = 0; d < Dk; d++)
                ss += (double)h[d] * h[d];
            float r = (i < Nk ? 1.0f / sqrtf((float)Dk) : 1.0f) / sqrtf((float)ss + 1e-6f);
            for (int d = 0; d < Dk; d++)
                h[d] *= r;
        }
        for (int j = 0; j < Nv; j++) {
            float bb = ba[(size_t)t * ldba + j], aa = ba[(size_t)t * ldba + Nv + j];
            beta[(size_t)t * Nv + j] = sig_h(bb);
            lam[(size_t)t * Nv + j] = expf(-expf(A_log[j]) * softplus_h(aa + dtb[j]));
        }
    }
    float *Sref = malloc(sn * 4), *o = malloc((size_t)n * Nv * Dv * 4);
    memcpy(Sref, S, sn * 4);
    for (int j = 0; j < Nv; j++) {
        int i = j / (Nv / Nk);
        lily_cpu_gdn_scan(Sref + (size_t)j * Dk * Dv, Dk, Dv, n, qkv + (size_t)i * Dk, ld,
                          qkv + (size_t)Nk * Dk + (size_t)i * Dk, ld,
                          qkv + (size_t)2 * Nk * Dk + (size_t)j * Dv, ld, beta + j, lam + j, Nv,
                          o + (size_t)j * Dv, Nv * Dv);
    }
    float *go = malloc((size_t)n * ldo * 4), *gS = malloc(sn * 4), *gSc = malloc(sn * 4);
    float *gop = malloc((size_t)n * Nv * Dv * 4);
    {
        float *dS = pt_dup(Sg, sn), *dO = pt_dalloc((size_t)n * ldo * 4);
        int rc = lily_cuda_gdn_scan(dS, Nk, Nv, Dk, Dv, n, dqkv, ld, dba, dba + Nv, ldba, dA, ddt,
                                    dO, ldo, NULL, &e);
        if (!pt_ok(rc, "gdn scan launch", &e)) return;
        pt_get(go, dO, (size_t)n * ldo);
        pt_get(gS, dS, sn);
        for (int t = 0; t < n; t++)
            memcpy(gop + (size_t)t * Nv * Dv, go + (size_t)t * ldo, Nv * Dv * 4);
        for (int j = 0; j < Nv; j++)
            for (int k = 0; k < Dk; k++)
                for (int v = 0; v < Dv; v++)
                    gSc[((size_t)j * Dk + k) * Dv + v] = gS[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)];
        snprintf(name, sizeof name, "gdn scan out   Nk=%d Nv=%d Dv=%d n=%d", Nk, Nv, Dv, n);
        pt_check(name, gop, o, (size_t)n * Nv * Dv, tol);
        snprintf(name, sizeof name, "gdn scan state Nk=%d Nv=%d Dv=%d n=%d", Nk, Nv, Dv, n);
        pt_check(name, gSc, Sref, sn, tol);
        lily_cuda_free(dS), lily_cuda_free(dO);
    }
    lily_cuda_free(dqkv), lily_cuda_free(dba), lily_cuda_free(dA), lily_cuda_free(ddt);
    free(qkv), free(ba), free(A_log), free(dtb), free(S), free(Sg), free(beta), free(lam);
    free(Sref), free(o), free(go), free(gS), free(gSc), free(gop);
}

/* LILY_CUDA_TIME=1: cudaEvent median of 20 launches of the scan at the 35B-A3B shape
 * (Nk=16, Nv=32, Dk=Dv=128), one GDN layer per launch. Prints, asserts nothing. */
static void scan_timing(void) {
    enum { reps = 20 };
    const int Nk = 16, Nv = 32, Dk = 128, Dv = 128, C = 2 * Nk * Dk + Nv * Dv;
    const int lens[] = {1, 2, 4, 8, 16, 32, 64, 128, 512, 2048};
    const int nmax = 2048;
    lily_err e;
    float *h = malloc((size_t)nmax * C * 4);
    pt_fill(h, (size_t)nmax * C, 1.0f);
    float *dqkv = pt_dup(h, (size_t)nmax * C);
    pt_fill(h, (size_t)nmax * 2 * Nv, 3.0f);
    float *dba = pt_dup(h, (size_t)nmax * 2 * Nv);
    pt_fill(h, (size_t)Nv * 2, 1.0f);
    float *dA = pt_dup(h, Nv), *ddt = pt_dup(h + Nv, Nv);
    pt_fill(h, (size_t)Nv * Dk * Dv, 0.3f);
    float *dS = pt_dup(h, (size_t)Nv * Dk * Dv);
    float *dO = pt_dalloc((size_t)nmax * Nv * Dv * 4);
    cudaEvent_t ev[2 * reps];
    for (int r = 0; r < 2 * reps; r++)
        cudaEventCreate(&ev[r]);
    printf("timing (us per layer, median of %d), Nk=%d Nv=%d Dk=Dv=%d:\n%6s %9s\n", reps, Nk, Nv,
           Dk, "n", "scan");
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        printf("%6d", n);
        {
            float ms[reps];
            int rc = lily_cuda_gdn_scan(dS, Nk, Nv, Dk, Dv, n, dqkv, C, dba, dba + Nv, 2 * Nv, dA,
                                        ddt, dO, Nv * Dv, NULL, &e); /* warm */
            for (int r = 0; r < reps && !rc; r++) {
                cudaEventRecord(ev[2 * r], NULL);
                rc = lily_cuda_gdn_scan(dS, Nk, Nv, Dk, Dv, n, dqkv, C, dba, dba + Nv, 2 * Nv, dA,
                                        ddt, dO, Nv * Dv, NULL, &e);
                cudaEventRecord(ev[2 * r + 1], NULL);
            }
            if (rc || lily_cuda_sync(&e)) {
                printf("\ntiming failed: %s\n", e.msg);
                pt_fail++;
                goto done;
            }
            for (int r = 0; r < reps; r++)
                cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]);
            qsort(ms, reps, sizeof *ms, pt_cmp_float);
            printf(" %9.1f", 1000.0f * (ms[reps / 2 - 1] + ms[reps / 2]) / 2);
        }
        printf("\n");
    }
done:
    for (int r = 0; r < 2 * reps; r++)
        cudaEventDestroy(ev[r]);
    lily_cuda_free(dqkv), lily_cuda_free(dba), lily_cuda_free(dA), lily_cuda_free(ddt);
    lily_cuda_free(dS), lily_cuda_free(dO);
    free(h);
}

static void conv_case(int C, int K, int n, double tol) {
    lily_err e;
    char name[128];
    int ld = C + 3;
    float *in = malloc((size_t)n * ld * 4), *st = malloc((size_t)(K - 1) * C * 4);
    float *w = malloc((size_t)C * K * 4), *out = malloc((size_t)n * C * 4);
    pt_fill(in, (size_t)n * ld, 2.0f);
    pt_fill(st, (size_t)(K - 1) * C, 2.0f);
    pt_fill(w, (size_t)C * K, 0.8f);
    float *din = pt_dup(in, (size_t)n * ld), *dst = pt_dup(st, (size_t)(K - 1) * C);
    float *dw = pt_dup(w, (size_t)C * K), *dout = pt_dalloc((size_t)n * C * 4);
    int rc = lily_cuda_conv_silu(din, ld, n, C, K, dst, dw, dout, C, NULL, &e);
    if (!pt_ok(rc, "conv launch", &e)) return;
    float *inp = malloc((size_t)n * C * 4);
    for (int t = 0; t < n; t++)
        memcpy(inp + (size_t)t * C, in + (size_t)t * ld, C * 4);
    lily_cpu_conv_silu(inp, n, C, K, st, w, out);
    float *g = malloc((size_t)n * C * 4), *gs = malloc((size_t)(K - 1) * C * 4);
    pt_get(g, dout, (size_t)n * C);
    pt_get(gs, dst, (size_t)(K - 1) * C);
    snprintf(name, sizeof name, "conv+silu out C=%d K=%d n=%d", C, K, n);
    pt_check(name, g, out, (size_t)n * C, tol);
    snprintf(name, sizeof name, "conv state C=%d K=%d n=%d", C, K, n);
    pt_check(name, gs, st, (size_t)(K - 1) * C, 1e-6);
    lily_cuda_free(din), lily_cuda_free(dst), lily_cuda_free(dw), lily_cuda_free(dout);
    free(in), free(st), free(w), free(out), free(inp), free(g), free(gs);
}

static void gnorm_case(int n, int nh, int hd, double tol) {
    lily_err e;
    char name[128];
    int ldo = nh * hd + 5, ldz = nh * hd + 1;
    float *o = malloc((size_t)n * ldo * 4), *z = malloc((size_t)n * ldz * 4), *w = malloc(hd * 4);
    pt_fill(o, (size_t)n * ldo, 1.5f);
    pt_fill(z, (size_t)n * ldz, 3.0f);
    for (int i = 0; i < hd; i++)
        w[i] = 1.0f + 0.3f * pt_frand();
    float *d_o = pt_dup(o, (size_t)n * ldo), *dz = pt_dup(z, (size_t)n * ldz), *dw = pt_dup(w, hd);
    int rc = lily_cuda_gated_rmsnorm(d_o, ldo, dz, ldz, n, nh, hd, dw, 1e-6f, NULL, &e);
    if (!pt_ok(rc, "gated rmsnorm launch", &e)) return;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            float *oh = o + (size_t)t * ldo + h * hd;
            lily_cpu_rmsnorm(oh, w, hd, 1e-6f, oh);
            for (int i = 0; i < hd; i++)
                oh[i] *= silu_h(z[(size_t)t * ldz + h * hd + i]);
        }
    float *g = malloc((size_t)n * ldo * 4);
    pt_get(g, d_o, (size_t)n * ldo);
    snprintf(name, sizeof name, "gated rmsnorm n=%d heads=%d x %d", n, nh, hd);
    pt_check(name, g, o, (size_t)n * ldo, tol);
    lily_cuda_free(d_o), lily_cuda_free(dz), lily_cuda_free(dw);
    free(o), free(z), free(w), free(g);
}

/* The GDN decode step of R rows in one launch (lily_cuda_gdn_step_rows) from random non-zero
 * states, the rows' inputs, gates and outputs at padded strides: each row's output and state bit
 * for bit the same call with that row alone (R = 1), and against lily_cpu_gdn_scan per head
 * (norms and gates as scan_case) followed by the gated RMSNorm (lily_cpu_rmsnorm, silu(z)); the
 * padding between output rows untouched. */
static void gdn_rows_case(int Nk, int Nv, int Dv, int R, double tol) {
    const int Dk = 128, C = 2 * Nk * Dk + Nv * Dv;
    const size_t dq = (size_t)C + 12, dba = 2 * (size_t)Nv + 5, dout = (size_t)Nv * Dv + 8;
    const size_t dzs = (size_t)Nv * Dv + 3;
    const size_t sn = (size_t)Nv * Dk * Dv;
    lily_err e;
    char name[160];
    if (R < 1 || R > LILY_GDN_ROWS) {
        pt_check_true("gdn rows row: 1 <= rows <= LILY_GDN_ROWS", 0);
        return;
    }
    float *qkv = malloc(R * dq * 4), *ba = malloc(R * dba * 4), *A_log = malloc(Nv * 4);
    float *dtb = malloc(Nv * 4), *S = malloc(R * sn * 4), *go = malloc(R * dout * 4);
    float *gS = malloc(sn * 4), *one = malloc(dout * 4), *oneS = malloc(sn * 4);
    float *Sref = malloc(sn * 4), *oref = malloc((size_t)Nv * Dv * 4), *gSc = malloc(sn * 4);
    float *beta = malloc(Nv * 4), *lam = malloc(Nv * 4), *q = malloc(C * 4);
    float *z = malloc(R * dzs * 4), *nw = malloc(Dv * 4);
    pt_fill(z, R * dzs, 3.0f);
    for (int i = 0; i < Dv; i++)
        nw[i] = 0.5f + 0.5f * pt_frand();
    float *dz = pt_dup(z, R * dzs), *dnw = pt_dup(nw, Dv);
    pt_fill(qkv, R * dq, 1.0f);
    pt_fill(ba, R * dba, 3.0f);
    pt_fill(S, R * sn, 0.3f);
    for (int j = 0; j < Nv; j++)
        A_log[j] = pt_frand() * 1.5f, dtb[j] = pt_frand();
    float *dq_ = pt_dup(qkv, R * dq), *dba_ = pt_dup(ba, R * dba);
    float *dA = pt_dup(A_log, Nv), *ddt = pt_dup(dtb, Nv);
    float *dS[LILY_GDN_ROWS] = {0};
    for (int r = 0; r < R; r++)
        dS[r] = pt_dup(S + (size_t)r * sn, sn); /* random contents: the device layout as is */
    float *dO = pt_dalloc(R * dout * 4);
    cudaMemset(dO, 0x7f, R * dout * 4); /* the padding's bytes, checked after */
    int rc = lily_cuda_gdn_step_rows(dS, R, Nk, Nv, Dk, Dv, dq_, dq, dba_, dba_ + Nv, dba, dA, ddt,
                                     dz, dzs, dnw, 1e-6f, dO, dout, NULL, &e);
    snprintf(name, sizeof name, "gdn rows R=%d Nk=%d Nv=%d Dv=%d: launch", R, Nk, Nv, Dv);
    if (pt_ok(rc, name, &e)) {
        pt_get(go, dO, R * dout);
        int pad_bad = 0;
        for (int r = 0; r < R; r++)
            for (size_t c = (size_t)Nv * Dv; c < dout; c++) {
                uint32_t w;
                memcpy(&w, &go[r * dout + c], 4);
                pad_bad += w != 0x7f7f7f7fu;
            }
        snprintf(name, sizeof name, "gdn rows R=%d Nv=%d Dv=%d: padding untouched (%d)", R, Nv, Dv,
                 pad_bad);
        pt_check_true(name, pad_bad == 0);
        for (int r = 0; r < R; r++) {
            const float *xq = qkv + (size_t)r * dq, *xb = ba + (size_t)r * dba;
            /* the row alone: R = 1 on a copy of its state */
            float *s1 = pt_dup(S + (size_t)r * sn, sn), *o1 = pt_dalloc(dout * 4);
            rc = lily_cuda_gdn_step_rows(&s1, 1, Nk, Nv, Dk, Dv, dq_ + (size_t)r * dq, 0,
                                         dba_ + (size_t)r * dba, dba_ + (size_t)r * dba + Nv, 0, dA,
                                         ddt, dz + (size_t)r * dzs, 0, dnw, 1e-6f, o1, 0, NULL, &e);
            if (!pt_ok(rc, "gdn rows: the row alone", &e)) break;
            pt_get(one, o1, Nv * Dv);
            pt_get(oneS, s1, sn);
            pt_get(gS, dS[r], sn);
            lily_cuda_free(s1), lily_cuda_free(o1);
            snprintf(name, sizeof name,
                     "gdn rows R=%d row %d Nk=%d Nv=%d Dv=%d: out and state = the row alone "
                     "(bitwise)",
                     R, r, Nk, Nv, Dv);
            pt_check_true(name, !memcmp(one, go + (size_t)r * dout, (size_t)Nv * Dv * 4) &&
                                    !memcmp(oneS, gS, sn * 4));
            /* CPU: norms and gates of the row, then the reference step per head */
            memcpy(q, xq, C * 4);
            for (int i = 0; i < 2 * Nk; i++) {
                float *h = q + (size_t)i * Dk;
                double ss = 0;
                for (int d = 0; d < Dk; d++)
                    ss += (double)h[d] * h[d];
                float f = (i < Nk ? 1.0f / sqrtf((float)Dk) : 1.0f) / sqrtf((float)ss + 1e-6f);
                for (int d = 0; d < Dk; d++)
                    h[d] *= f;
            }
            for (int j = 0; j < Nv; j++) {
                beta[j] = sig_h(xb[j]);
                lam[j] = expf(-expf(A_log[j]) * softplus_h(xb[Nv + j] + dtb[j]));
            }
            const float *Sr = S + (size_t)r * sn;
            for (int j = 0; j < Nv; j++)
                for (int k = 0; k < Dk; k++)
                    for (int v = 0; v < Dv; v++)
                        Sref[((size_t)j * Dk + k) * Dv + v] =
                            Sr[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)];
            for (int j = 0; j < Nv; j++) {
                int i = j / (Nv / Nk);
                lily_cpu_gdn_scan(Sref + (size_t)j * Dk * Dv, Dk, Dv, 1, q + (size_t)i * Dk, C,
                                  q + (size_t)Nk * Dk + (size_t)i * Dk, C,
                                  q + (size_t)2 * Nk * Dk + (size_t)j * Dv, C, beta + j, lam + j,
                                  Nv, oref + (size_t)j * Dv, Nv * Dv);
            }
            for (int j = 0; j < Nv; j++) { /* the gated RMSNorm of each head */
                float *oh = oref + (size_t)j * Dv;
                lily_cpu_rmsnorm(oh, nw, Dv, 1e-6f, oh);
                for (int v = 0; v < Dv; v++)
                    oh[v] *= silu_h(z[(size_t)r * dzs + (size_t)j * Dv + v]);
            }
            for (int j = 0; j < Nv; j++)
                for (int k = 0; k < Dk; k++)
                    for (int v = 0; v < Dv; v++)
                        gSc[((size_t)j * Dk + k) * Dv + v] =
                            gS[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)];
            snprintf(name, sizeof name, "gdn rows R=%d row %d Nk=%d Nv=%d Dv=%d: out vs CPU", R, r,
                     Nk, Nv, Dv);
            pt_check(name, go + (size_t)r * dout, oref, (size_t)Nv * Dv, tol);
            snprintf(name, sizeof name, "gdn rows R=%d row %d Nk=%d Nv=%d Dv=%d: state vs CPU", R,
                     r, Nk, Nv, Dv);
            pt_check(name, gSc, Sref, sn, tol);
        }
    }
    for (int r = 0; r < R; r++)
        lily_cuda_free(dS[r]);
    lily_cuda_free(dO), lily_cuda_free(dq_), lily_cuda_free(dba_), lily_cuda_free(dA);
    lily_cuda_free(ddt), lily_cuda_free(dz), lily_cuda_free(dnw);
    free(qkv), free(ba), free(A_log), free(dtb), free(S), free(go), free(gS), free(one);
    free(oneS), free(Sref), free(oref), free(gSc), free(beta), free(lam), free(q), free(z);
    free(nw);
}

static void run_gdn(const op_row *r) {
    if (r->op == OP_GDN_CONV)
        conv_case(r->dim, r->K, r->n, r->tol);
    else if (r->op == OP_GDN_SCAN)
        scan_case(r->Nk, r->Nv, r->dim, r->n, r->tol);
    else if (r->op == OP_GDN_ROWS)
        gdn_rows_case(r->Nk, r->Nv, r->dim, r->n, r->tol);
    else
        gnorm_case(r->n, r->Nv, r->dim, r->tol);
}

static void run_args(const op_row *r) {
    lily_err e;
    if (r->op == OP_GEMV_ARGS) {
        pt_check_true("gemv rejects 0 segments",
                      lily_cuda_gemv(NULL, 0, NULL, NULL, NULL, &e) == -1);
        pt_check_true("gemv rows rejects 9 vectors",
                      lily_cuda_gemv_rows(NULL, 1, LILY_GEMV_ROWS + 1, NULL, NULL, NULL, &e) == -1);
        return;
    }
    pt_check_true("gdn scan rejects Dk=64",
                  lily_cuda_gdn_scan(NULL, 1, 1, 64, 64, 1, NULL, 4, NULL, NULL, 1, NULL, NULL,
                                     NULL, 1, NULL, &e) == -1);
    pt_check_true("gdn scan rejects Dv=12 (not a multiple of 8)",
                  lily_cuda_gdn_scan(NULL, 1, 1, 128, 12, 1, NULL, 4, NULL, NULL, 1, NULL, NULL,
                                     NULL, 1, NULL, &e) == -1);
    float *S0 = NULL;
    pt_check_true("gdn step rows rejects Dv=264 (a head of 33 warps)",
                  lily_cuda_gdn_step_rows(&S0, 1, 1, 1, 128, 264, NULL, 0, NULL, NULL, 0, NULL,
                                          NULL, NULL, 0, NULL, 1e-6f, NULL, 0, NULL, &e) == -1);
    pt_check_true("gdn step rows rejects 9 rows",
                  lily_cuda_gdn_step_rows(&S0, LILY_GDN_ROWS + 1, 1, 1, 128, 128, NULL, 0, NULL,
                                          NULL, 0, NULL, NULL, NULL, 0, NULL, 1e-6f, NULL, 0, NULL,
                                          &e) == -1);
}

/* ---- attention: prep, decode, prefill ---------------------------------------------------- */

/* RMS relative bounds (pt_check) of the two modes: exact products leave fp32 accumulation error
 * (tensor-core sums, exp2f: ~1e-5); one bf16 pass rounds q, K, V and P to 8 bits (~2e-3). */
#define TOL_EXACT 5e-5 /* relative to the RMS of sum p |v| / l: pt_check_scaled */
#define TOL_FAST  1e-2
/* attn_fa.cu's one fp16 pass rounds q, K, V and P to 11 bits (~2.4e-4 each) */
#define TOL_FA    2e-3

static float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* The reference: causal GQA attention as lily_cpu_attention computes it, but with the softmax
 * sum and the weighted sum of V accumulated in double. lily_cpu_attention's fp32 sums over a long
 * context are themselves off by ~1e-5 of the output's RMS where attention is flat (|O| much
 * smaller than the sum of |p v|), which is the size of TOL_EXACT. One task of g_pool per (token,
 * query head), each with its own sums: the same numbers as one thread. */
typedef struct {
    const float *q, *kc, *vc;
    int pos, Nq, Nkv, Dh;
    float scale;
    float *out, *mag;
} ref_attn_ctx;

static void ref_attention_task(void *p, int task, int thread) {
    const ref_attn_ctx *c = p;
    (void)thread;
    const int Nq = c->Nq, Dh = c->Dh, t = task / Nq, h = task % Nq;
    int rep = Nq / c->Nkv, qd = Nq * Dh, kd = c->Nkv * Dh;
    const float *qv = c->q + (size_t)t * qd + (size_t)h * Dh;
    int g = h / rep, len = c->pos + t + 1;
    double *acc = malloc((size_t)Dh * 2 * sizeof(double)), *am = acc + Dh;
    float *scr = malloc((size_t)len * sizeof(float));
    float mx = -INFINITY;
    for (int s = 0; s < len; s++) {
        const float *kv = c->kc + (size_t)s * kd + (size_t)g * Dh;
        double dot = 0;
        for (int d = 0; d < Dh; d++)
            dot += (double)qv[d] * kv[d];
        scr[s] = (float)(dot * c->scale);
        mx = fmaxf(mx, scr[s]);
    }
    double sum = 0;
    for (int d = 0; d < Dh; d++)
        acc[d] = am[d] = 0;
    for (int s = 0; s < len; s++) {
        double w = exp((double)scr[s] - mx);
        const float *vv = c->vc + (size_t)s * kd + (size_t)g * Dh;
        sum += w;
        for (int d = 0; d < Dh; d++)
            acc[d] += w * vv[d], am[d] += w * fabsf(vv[d]);
    }
    float *o = c->out + (size_t)t * qd + (size_t)h * Dh;
    float *m = c->mag + (size_t)t * qd + (size_t)h * Dh;
    for (int d = 0; d < Dh; d++)
        o[d] = (float)(acc[d] / sum), m[d] = (float)(am[d] / sum);
    free(acc), free(scr);
}

static void ref_attention(const float *q, int n, int pos, const float *kc, const float *vc, int Nq,
                          int Nkv, int Dh, float scale, float *out, float *mag) {
    ref_attn_ctx c = {q, kc, vc, pos, Nq, Nkv, Dh, scale, out, mag};
    lily_pool_run(g_pool, ref_attention_task, &c, n * Nq);
}

/* attn_exact of the calls that follow (the GEMMs stay exact) */
static void set_exact(int on) {
    lily_cuda_prec p = {1, on};
    lily_cuda_prec_set(p);
}

/* The decode split target of the calls that follow (0: as the SMs call for) */
static int g_want;
static void set_want(int want) {
    g_want = want;
    lily_cuda_attn_decode_force_splits(want);
}

/* Prefill modes: the default (exact, split auto), fast (at head dim 256 attn_fa.cu's one-pass
 * wgmma kernel, split auto; attn.cu's one-pass kernel at other head dims), the ws kernel unsplit
 * and split in 3, and the fa kernel unsplit and split in 3 (modes 2-5 differ from modes 0 and 1
 * at head dim 256 only). */
static const int k_pre_modes = 6;
static int pre_mode_exact(int m) {
    return m == 0 || m == 2 || m == 3;
}
static int pre_mode_dh256_only(int m) {
    return m >= 2;
}
/* the fa kernel's bound where it runs (modes 1, 4, 5 at head dim 256) */
static double pre_mode_tol(int m, int Dh) {
    if (pre_mode_exact(m)) return TOL_EXACT;
    return Dh == 256 ? TOL_FA : TOL_FAST;
}
static void set_pre_mode(int m) {
    set_exact(pre_mode_exact(m));
    lily_cuda_attn_prefill_force_splits(m == 2 || m == 4 ? 1 : m == 3 || m == 5 ? 3 : 0);
}
static const char *pre_mode_name(int m) {
    static const char *nm[] = {" (default)",    " (fast)",       " (ws unsplit)",
                               " (ws split 3)", " (fa unsplit)", " (fa split 3)"};
    return nm[m];
}

/* One cache row (all Nkv heads of a position) in the format of attn.h, from x [Nkv*Dh]; x is
 * replaced by the values the row holds (code * scale), which is what the reference sees. */
static void kv_pack_row(float *x, int Nkv, int Dh, uint8_t *row) {
    uint16_t *codes = (uint16_t *)row; /* offset binary: code + 32768 */
    float *scales = (float *)(row + (size_t)Nkv * Dh * 2);
    for (int j = 0; j < Nkv; j++) {
        float *xj = x + (size_t)j * Dh, mx = 0.f;
        for (int d = 0; d < Dh; d++)
            mx = fmaxf(mx, fabsf(xj[d]));
        const float cm = (float)LILY_CUDA_KV_CODE_MAX;
        float sc = mx / cm;
        scales[j] = sc;
        for (int d = 0; d < Dh; d++) {
            float c = sc > 0.f ? rintf(xj[d] / sc) : 0.f;
            c = fminf(fmaxf(c, -cm), cm);
            codes[(size_t)j * Dh + d] = (uint16_t)(32768 + (int)c);
            xj[d] = c * sc;
        }
    }
}

/* Random cache of ctx positions: host fp32 values [ctx][Nkv*Dh] (as the cache holds them) and the
 * device rows. Each (position, head) row gets its own magnitude (0.25 to 2), and every 37th
 * position's head 0 is all zero (scale 0). */
static void make_cache(int ctx, int Nkv, int Dh, float **h, void **d) {
    size_t w = (size_t)Nkv * Dh, rb = lily_cuda_kv_bytes(1, Nkv, Dh);
    *h = malloc((size_t)ctx * w * 4);
    uint8_t *b = calloc((size_t)ctx, rb);
    for (int p = 0; p < ctx; p++) {
        float *x = *h + (size_t)p * w;
        for (int j = 0; j < Nkv; j++) {
            float amp = (p % 37 == 5 && j == 0) ? 0.f : 1.125f + 0.875f * pt_frand();
            for (int i = 0; i < Dh; i++)
                x[(size_t)j * Dh + i] = pt_frand() * amp;
        }
        kv_pack_row(x, Nkv, Dh, b + (size_t)p * rb);
    }
    lily_err e;
    *d = lily_cuda_alloc(lily_cuda_kv_bytes(ctx, Nkv, Dh), &e);
    lily_cuda_h2d(*d, b, lily_cuda_kv_bytes(ctx, Nkv, Dh), &e);
    free(b);
}

static int32_t *dev_pos(int p) {
    lily_err e;
    int32_t *d = lily_cuda_alloc(4, &e);
    lily_cuda_h2d(d, &p, 4, &e);
    return d;
}

static void decode_case(int Nq, int Nkv, int Dh, int ctx, int splits, int gated) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh;
    float *kc, *vc;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk);
    make_cache(ctx, Nkv, Dh, &vc, &dv);
    float *q = malloc(qd * 4), *gate = malloc(qd * 4), *ref = malloc(qd * 4);
    float *mag = malloc(qd * 4);
    pt_fill(q, qd, 1.5f);
    pt_fill(gate, qd, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    ref_attention(q, 1, ctx - 1, kc, vc, Nq, Nkv, Dh, scale, ref, mag);
    if (gated)
        for (int i = 0; i < qd; i++)
            ref[i] *= sig(gate[i]), mag[i] *= sig(gate[i]);
    float *dq = pt_dup(q, qd), *dg = pt_dup(gate, qd), *dout = pt_dalloc(qd * 4);
    float *dscr = pt_dalloc(lily_cuda_attn_decode_scratch(Nq, Dh, splits) * 4);
    int32_t *dp = dev_pos(ctx - 1);
    float *got = malloc(qd * 4);
    char want[16] = "";
    if (g_want) snprintf(want, sizeof want, " want=%d", g_want);
    for (int ex = 1; ex >= 0; ex--) {
        set_exact(ex);
        int rc = lily_cuda_attn_decode(dq, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL, dscr,
                                       splits, dout, NULL, &e);
        if (!pt_ok(rc, "decode launch", &e)) break;
        pt_get(got, dout, qd);
        snprintf(name, sizeof name, "attn decode%s Nq=%d Nkv=%d Dh=%d ctx=%d splits=%d%s%s",
                 ex ? "" : " (fast)", Nq, Nkv, Dh, ctx, splits, gated ? " gated" : "", want);
        pt_check_scaled(name, got, ref, mag, qd, ex ? TOL_EXACT : TOL_FAST);
    }
    set_exact(1);
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dscr), lily_cuda_free(dp);
    free(kc), free(vc), free(q), free(gate), free(ref), free(mag), free(got);
}

static void prefill_case(int Nq, int Nkv, int Dh, int pos0, int n, int gated) {
    lily_err e;
    char name[200];
    int qd = Nq * Dh, ctx = pos0 + n;
    float *kc, *vc;
    void *dk, *dv;
    make_cache(ctx, Nkv, Dh, &kc, &dk);
    make_cache(ctx, Nkv, Dh, &vc, &dv);
    size_t nq = (size_t)n * qd;
    float *q = malloc(nq * 4), *gate = malloc(nq * 4), *ref = malloc(nq * 4);
    float *mag = malloc(nq * 4);
    pt_fill(q, nq, 1.5f);
    pt_fill(gate, nq, 3.0f);
    float scale = 1.0f / sqrtf((float)Dh);
    ref_attention(q, n, pos0, kc, vc, Nq, Nkv, Dh, scale, ref, mag);
    if (gated)
        for (size_t i = 0; i < nq; i++)
            ref[i] *= sig(gate[i]), mag[i] *= sig(gate[i]);
    float *dq = pt_dup(q, nq), *dg = pt_dup(gate, nq), *dout = pt_dalloc(nq * 4);
    const size_t np = lily_cuda_attn_prefill_scratch(Nq, Nkv, Dh);
    float *dpart = np ? pt_dalloc(np * 4) : NULL;
    int32_t *dp = dev_pos(pos0);
    float *got = malloc(nq * 4);
    for (int m = 0; m < k_pre_modes; m++) {
        if (pre_mode_dh256_only(m) && Dh != 256) continue;
        set_pre_mode(m);
        cudaMemset(dout, 0xff, nq * 4); /* NaN: every output must be written */
        int rc = lily_cuda_attn_prefill(dq, n, dk, dv, dp, Nq, Nkv, Dh, scale, gated ? dg : NULL,
                                        dout, dpart, NULL, &e);
        if (!pt_ok(rc, "prefill launch", &e)) break;
        pt_get(got, dout, nq);
        snprintf(name, sizeof name, "attn prefill%s Nq=%d Nkv=%d Dh=%d pos0=%d n=%d%s",
                 pre_mode_name(m), Nq, Nkv, Dh, pos0, n, gated ? " gated" : "");
        pt_check_scaled(name, got, ref, mag, nq, pre_mode_tol(m, Dh));
    }
    set_pre_mode(0); /* back to the defaults */
    lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dq), lily_cuda_free(dg);
    lily_cuda_free(dout), lily_cuda_free(dp), lily_cuda_free(dpart);
    free(kc), free(vc), free(q), free(gate), free(ref), free(mag), free(got);
}

/* Rows of the GPU cache (positions pos0.., all heads) against fp32 reference rows ref [n][Nkv*Dh]:
 * each head's scale is max|ref row| / LILY_CUDA_KV_CODE_MAX (to 1e-5) and each code * scale is within scale / 2
 * of the reference (plus 1e-5 of the row's max for the fp32 differences of norm and RoPE). */
static void check_rows(const char *what, const void *dcache, int pos0, int n, int Nkv, int Dh,
                       const float *ref) {
    lily_err e;
    size_t rb = lily_cuda_kv_bytes(1, Nkv, Dh), w = (size_t)Nkv * Dh;
    uint8_t *b = malloc((size_t)n * rb);
    float *dec = malloc((size_t)n * w * 4);
    lily_cuda_d2h(b, (const uint8_t *)dcache + lily_cuda_kv_prefix_bytes(pos0, Nkv, Dh),
                  (size_t)n * rb, &e);
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        const uint16_t *codes = (const uint16_t *)(b + (size_t)t * rb); /* code + 32768 */
        const float *scales = (const float *)(b + (size_t)t * rb + w * 2);
        for (int j = 0; j < Nkv; j++) {
            const float *r = ref + (size_t)t * w + (size_t)j * Dh;
            float mx = 0.f, sc = scales[j];
            const float cm = (float)LILY_CUDA_KV_CODE_MAX;
            for (int d = 0; d < Dh; d++)
                mx = fmaxf(mx, fabsf(r[d]));
            if (fabsf(sc - mx / cm) > 1e-5f * mx / cm + 1e-30f) bad++;
            for (int d = 0; d < Dh; d++) {
                const int c = (int)codes[(size_t)j * Dh + d] - 32768;
                if (c < -LILY_CUDA_KV_CODE_MAX || c > LILY_CUDA_KV_CODE_MAX) bad++; /* clamped */
                float x = c * sc;
                dec[(size_t)t * w + (size_t)j * Dh + d] = x;
                double err = fabs((double)x - r[d]), lim = 0.5 * sc + 1e-5 * mx;
                if (err > lim) bad++;
                if (sc > 0 && err / sc > worst) worst = err / sc;
            }
        }
    }
    char name[200];
    snprintf(name, sizeof name, "%s: int16 rows within scale/2 (worst %.3f scale, %d bad)", what,
             worst, bad);
    pt_check_true(name, bad == 0);
    snprintf(name, sizeof name, "%s: decoded rows", what);
    pt_check(name, dec, ref, (size_t)n * w, 1e-4);
    free(b), free(dec);
}

static void prep_case(int Nq, int Nkv, int Dh, int R, int pos0, int n, int gated) {
    lily_err e;
    char name[200];
    int qw = Nq * Dh * (gated ? 2 : 1), ldqg = qw + 3, kvw = Nkv * Dh, ldkv = kvw + 1;
    int ctx = pos0 + n;
    double theta = 1e7;
    float *qg = malloc((size_t)n * ldqg * 4), *k = malloc((size_t)n * ldkv * 4);
    float *v = malloc((size_t)n * ldkv * 4), *qn = malloc(Dh * 4), *kn = malloc(Dh * 4);
    pt_fill(qg, (size_t)n * ldqg, 2.0f);
    pt_fill(k, (size_t)n * ldkv, 2.0f);
    pt_fill(v, (size_t)n * ldkv, 2.0f);
    if (n > 1) /* an all-zero V row: scale 0, codes 0 */
        for (int d = 0; d < Dh; d++)
            v[(size_t)1 * ldkv + d] = 0.f;
    for (int i = 0; i < Dh; i++)
        qn[i] = 1 + 0.3f * pt_frand(), kn[i] = 1 + 0.3f * pt_frand();
    float *inv = malloc((R / 2 + 1) * 4);
    for (int i = 0; i < R / 2; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)R);
    float *dqg = pt_dup(qg, (size_t)n * ldqg), *dk = pt_dup(k, (size_t)n * ldkv);
    float *dv = pt_dup(v, (size_t)n * ldkv), *dqn = pt_dup(qn, Dh), *dkn = pt_dup(kn, Dh);
    float *dinv = pt_dup(inv, R / 2 + 1);
    float *dq = pt_dalloc((size_t)n * Nq * Dh * 4), *dgt = pt_dalloc((size_t)n * Nq * Dh * 4);
    void *dkc = pt_dalloc(lily_cuda_kv_bytes(ctx, Nkv, Dh));
    void *dvc = pt_dalloc(lily_cuda_kv_bytes(ctx, Nkv, Dh));
    int32_t *dp = dev_pos(pos0);
    int rc = lily_cuda_attn_prep(dqg, ldqg, dk, dv, ldkv, n, dp, Nq, Nkv, Dh, R, dinv, dqn, dkn,
                                 1e-6f, gated, dq, dgt, dkc, dvc, NULL, &e);
    if (!pt_ok(rc, "prep launch", &e)) return;
    size_t nq = (size_t)n * Nq * Dh, nk = (size_t)n * kvw;
    float *rq = malloc(nq * 4), *rg = malloc(nq * 4), *rk = malloc(nk * 4), *rv = malloc(nk * 4);
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < Nq; h++) {
            const float *src = qg + (size_t)t * ldqg + (size_t)h * Dh * (gated ? 2 : 1);
            float *dst = rq + ((size_t)t * Nq + h) * Dh;
            lily_cpu_rmsnorm(src, qn, Dh, 1e-6f, dst);
            lily_cpu_rope(dst, R, pos0 + t, theta);
            if (gated) memcpy(rg + ((size_t)t * Nq + h) * Dh, src + Dh, Dh * 4);
        }
        for (int h = 0; h < Nkv; h++) {
            float *dst = rk + ((size_t)t * Nkv + h) * Dh;
            lily_cpu_rmsnorm(k + (size_t)t * ldkv + h * Dh, kn, Dh, 1e-6f, dst);
            lily_cpu_rope(dst, R, pos0 + t, theta);
            memcpy(rv + ((size_t)t * Nkv + h) * Dh, v + (size_t)t * ldkv + h * Dh, Dh * 4);
        }
    }
    float *gq = malloc(nq * 4), *gg = malloc(nq * 4);
    pt_get(gq, dq, nq);
    if (gated) pt_get(gg, dgt, nq);
    snprintf(name, sizeof name, "attn prep q Nq=%d Dh=%d R=%d pos0=%d n=%d", Nq, Dh, R, pos0, n);
    pt_check(name, gq, rq, nq, 2e-5);
    if (gated) {
        snprintf(name, sizeof name, "attn prep gate Nq=%d n=%d", Nq, n);
        pt_check(name, gg, rg, nq, 0);
    }
    snprintf(name, sizeof name, "attn prep k cache Nkv=%d Dh=%d pos0=%d n=%d", Nkv, Dh, pos0, n);
    check_rows(name, dkc, pos0, n, Nkv, Dh, rk);
    snprintf(name, sizeof name, "attn prep v cache Nkv=%d Dh=%d pos0=%d n=%d", Nkv, Dh, pos0, n);
    check_rows(name, dvc, pos0, n, Nkv, Dh, rv);
    lily_cuda_free(dqg), lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dqn);
    lily_cuda_free(dkn), lily_cuda_free(dinv), lily_cuda_free(dq), lily_cuda_free(dgt);
    lily_cuda_free(dkc), lily_cuda_free(dvc), lily_cuda_free(dp);
    free(qg), free(k), free(v), free(qn), free(kn), free(inv), free(rq), free(rg), free(rk);
    free(rv), free(gq), free(gg);
}

/* R rows of the attention decode step (lily_cuda_attn_prep_rows, lily_cuda_attn_decode_rows):
 * each row its own cache (contexts 1 to ~5000, random rows), position, split count and scratch,
 * its inputs at a padded row stride; against the same token run alone through lily_cuda_attn_prep
 * and lily_cuda_attn_decode on copies of its cache, bit for bit: q, gate, the K/V rows written,
 * the output; in both precisions. (The alone path's accuracy: prep_case and decode_case.) */
static void attn_rows_case(int Nq, int Nkv, int Dh, int R, int gated) {
    enum { MR = LILY_ATTN_ROWS };
    lily_err e;
    char name[200];
    if (R < 1 || R > MR) {
        pt_check_true("attn rows row: 1 <= rows <= LILY_ATTN_ROWS", 0);
        return;
    }
    static const int ctxs[MR] = {4097, 1, 700, 33, 2050, 17, 5003, 129};
    static const int splits[MR] = {128, 1, 22, 2, 64, 1, 128, 5};
    const int qw = Nq * Dh * (gated ? 2 : 1), kvw = Nkv * Dh, Rr = Dh / 4;
    const int W = (qw > 2 * kvw ? qw : 2 * kvw) + 12; /* the rows' stride, padded */
    const size_t part = lily_cuda_attn_decode_scratch(Nq, Dh, 128),
                 rb = lily_cuda_kv_bytes(1, Nkv, Dh);
    float *in = malloc((size_t)R * W * 4 * 3), *qn = malloc(Dh * 4), *kn = malloc(Dh * 4);
    float *inv = malloc((Rr / 2 + 1) * 4);
    pt_fill(in, (size_t)R * W * 3, 2.0f);
    for (int i = 0; i < Dh; i++)
        qn[i] = 1 + 0.3f * pt_frand(), kn[i] = 1 + 0.3f * pt_frand();
    for (int i = 0; i < Rr / 2; i++)
        inv[i] = 1.0f / powf(1e7f, (float)(2 * i) / (float)Rr);
    float *dqg = pt_dup(in, (size_t)R * W), *dk = pt_dup(in + (size_t)R * W, (size_t)R * W);
    float *dv = pt_dup(in + (size_t)2 * R * W, (size_t)R * W);
    float *dqn = pt_dup(qn, Dh), *dkn = pt_dup(kn, Dh), *dinv = pt_dup(inv, Rr / 2 + 1);
    void *kc[MR], *vc[MR], *kc1[MR], *vc1[MR];
    int32_t pos[MR], *dpos = lily_cuda_alloc(MR * 4, &e);
    for (int i = 0; i < R; i++) {
        float *hk, *hv;
        pos[i] = ctxs[i] - 1;
        make_cache(ctxs[i], Nkv, Dh, &hk, &kc[i]);
        make_cache(ctxs[i], Nkv, Dh, &hv, &vc[i]);
        free(hk), free(hv);
        const size_t cb = lily_cuda_kv_bytes(ctxs[i], Nkv, Dh);
        kc1[i] = pt_dalloc(cb), vc1[i] = pt_dalloc(cb);
        cudaMemcpy(kc1[i], kc[i], cb, cudaMemcpyDeviceToDevice);
        cudaMemcpy(vc1[i], vc[i], cb, cudaMemcpyDeviceToDevice);
    }
    lily_cuda_h2d(dpos, pos, R * 4, &e);
    float *dq = pt_dalloc((size_t)R * W * 4), *dg = pt_dalloc((size_t)R * W * 4);
    float *dout = pt_dalloc((size_t)R * W * 4), *dpart = pt_dalloc(R * part * 4);
    float *q1 = pt_dalloc((size_t)Nq * Dh * 4), *g1 = pt_dalloc((size_t)Nq * Dh * 4);
    float *o1 = pt_dalloc((size_t)Nq * Dh * 4), *p1 = pt_dalloc(part * 4);
    float *a = malloc((size_t)Nq * Dh * 4), *b = malloc((size_t)Nq * Dh * 4);
    uint8_t *ra = malloc(rb), *rbb = malloc(rb);
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int ex = 1; ex >= 0; ex--) {
        set_exact(ex);
        lily_attn_drow dr[MR];
        for (int i = 0; i < R; i++)
            dr[i] = (lily_attn_drow){dq + (size_t)i * W,
                                     kc[i],
                                     vc[i],
                                     dpos + i,
                                     gated ? dg + (size_t)i * W : NULL,
                                     dpart + i * part,
                                     splits[i],
                                     dout + (size_t)i * W};
        int rc = lily_cuda_attn_prep_rows(dqg, W, dk, dv, W, R, dpos, Nq, Nkv, Dh, Rr, dinv, dqn,
                                          dkn, 1e-6f, gated, dq, dg, W, kc, vc, NULL, &e);
        snprintf(name, sizeof name, "attn rows R=%d Nq=%d Nkv=%d Dh=%d: prep", R, Nq, Nkv, Dh);
        if (!pt_ok(rc, name, &e)) break;
        rc = lily_cuda_attn_decode_rows(dr, R, Nq, Nkv, Dh, scale, NULL, &e);
        snprintf(name, sizeof name, "attn rows R=%d Nq=%d Nkv=%d Dh=%d: decode", R, Nq, Nkv, Dh);
        if (!pt_ok(rc, name, &e)) break;
        for (int i = 0; i < R; i++) {
            rc = lily_cuda_attn_prep(dqg + (size_t)i * W, W, dk + (size_t)i * W, dv + (size_t)i * W,
                                     W, 1, dpos + i, Nq, Nkv, Dh, Rr, dinv, dqn, dkn, 1e-6f, gated,
                                     q1, g1, kc1[i], vc1[i], NULL, &e);
            rc = rc || lily_cuda_attn_decode(q1, kc1[i], vc1[i], dpos + i, Nq, Nkv, Dh, scale,
                                             gated ? g1 : NULL, p1, splits[i], o1, NULL, &e);
            if (!pt_ok(rc, "attn rows: the row alone", &e)) break;
            int same = 1;
            pt_get(a, dq + (size_t)i * W, (size_t)Nq * Dh);
            pt_get(b, q1, (size_t)Nq * Dh);
            same = same && !memcmp(a, b, (size_t)Nq * Dh * 4);
            if (gated) {
                pt_get(a, dg + (size_t)i * W, (size_t)Nq * Dh);
                pt_get(b, g1, (size_t)Nq * Dh);
                same = same && !memcmp(a, b, (size_t)Nq * Dh * 4);
            }
            for (int kv = 0; kv < 2; kv++) {
                lily_cuda_d2h(ra, (uint8_t *)(kv ? vc[i] : kc[i]) + (size_t)pos[i] * rb, rb, &e);
                lily_cuda_d2h(rbb, (uint8_t *)(kv ? vc1[i] : kc1[i]) + (size_t)pos[i] * rb, rb, &e);
                same = same && !memcmp(ra, rbb, rb);
            }
            pt_get(a, dout + (size_t)i * W, (size_t)Nq * Dh);
            pt_get(b, o1, (size_t)Nq * Dh);
            same = same && !memcmp(a, b, (size_t)Nq * Dh * 4);
            snprintf(name, sizeof name,
                     "attn rows R=%d row %d ctx=%d splits=%d Nq=%d Nkv=%d Dh=%d%s %s: q, gate, K/V "
                     "rows, out = the row alone (bitwise)",
                     R, i, ctxs[i], splits[i], Nq, Nkv, Dh, gated ? " gated" : "",
                     ex ? "exact" : "fast");
            pt_check_true(name, same);
        }
    }
    set_exact(1);
    for (int i = 0; i < R; i++)
        lily_cuda_free(kc[i]), lily_cuda_free(vc[i]), lily_cuda_free(kc1[i]),
            lily_cuda_free(vc1[i]);
    lily_cuda_free(dqg), lily_cuda_free(dk), lily_cuda_free(dv), lily_cuda_free(dqn);
    lily_cuda_free(dkn), lily_cuda_free(dinv), lily_cuda_free(dpos), lily_cuda_free(dq);
    lily_cuda_free(dg), lily_cuda_free(dout), lily_cuda_free(dpart), lily_cuda_free(q1);
    lily_cuda_free(g1), lily_cuda_free(o1), lily_cuda_free(p1);
    free(in), free(qn), free(kn), free(inv), free(a), free(b), free(ra), free(rbb);
}

/* ---- timing mode (LILY_CUDA_TIME=1) ---- */

typedef struct {
    float *q, *gate, *scr, *out, *part;
    void *k, *v;
    int32_t *pos;
    int n;
    cudaStream_t st;
} tctx;

static int t_decode(const tctx *c) {
    lily_err e;
    return lily_cuda_attn_decode(c->q, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate, c->scr,
                                 128, c->out, (lily_cuda_stream)c->st, &e);
}
static int t_prefill(const tctx *c) {
    lily_err e;
    return lily_cuda_attn_prefill(c->q, c->n, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate,
                                  c->out, c->part, (lily_cuda_stream)c->st, &e);
}

/* Ten decode calls captured as one CUDA graph on c->st (re-captured when the split target or the
 * precision changed), then replayed: the launches of a decode step. */
static int t_graph10(const tctx *c) {
    static cudaGraphExec_t ex;
    static const tctx *last;
    static int want = -1, exact = -1; /* both apply at capture */
    if (c != last || want != g_want || exact != lily_cuda_prec_get().attn_exact || !ex) {
        if (ex) cudaGraphExecDestroy(ex), ex = NULL;
        cudaGraph_t gr;
        if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
        lily_err e;
        for (int i = 0; i < 10; i++)
            if (lily_cuda_attn_decode(c->q, c->k, c->v, c->pos, 16, 2, 256, 0.0625f, c->gate,
                                      c->scr, 128, c->out, (lily_cuda_stream)c->st, &e))
                printf("FAIL graph decode: %s\n", e.msg);
        if (cudaStreamEndCapture(c->st, &gr) != cudaSuccess) return -1;
        if (cudaGraphInstantiate(&ex, gr, 0) != cudaSuccess) return -1;
        cudaGraphDestroy(gr);
        last = c;
        want = g_want;
        exact = lily_cuda_prec_get().attn_exact;
    }
    return cudaGraphLaunch(ex, c->st) != cudaSuccess;
}

/* the timed calls as pt_time_fn */
static int t_decode_v(void *c) {
    return t_decode(c);
}
static int t_prefill_v(void *c) {
    return t_prefill(c);
}
static int t_graph10_v(void *c) {
    return t_graph10(c);
}
static float time_median(pt_time_fn f, tctx *c) {
    return pt_time_median(f, c, c->st);
}

/* Decode at 4K-128K (alone, in a graph of 10, split sweep) and one prefill chunk: one mode. */
static void time_mode(tctx *cp, int maxc, int n) {
    tctx c = *cp; /* t_graph10 re-captures for each mode's precision */
    lily_err e;
    const double rb = (double)lily_cuda_kv_bytes(1, 2, 256);
    static const int ctxs[] = {4096, 32768, 65536, 131072};
    static const int wants[] = {8, 16, 33, 66, 128};
    /* "1p", "1f": prefill only */
    const int pre_only = getenv("LILY_CUDA_TIME")[1] == 'p' || getenv("LILY_CUDA_TIME")[1] == 'f';
    for (int i = 0; i < 4 && !pre_only; i++) {
        int p = ctxs[i] - 1;
        lily_cuda_h2d(c.pos, &p, 4, &e);
        double gb = ctxs[i] * rb * 2 / 1e9; /* K and V bytes of the 2 KV heads */
        float t1 = time_median(t_decode_v, &c), t10 = time_median(t_graph10_v, &c) / 10;
        printf("time decode ctx=%-6d %8.1f us (%6.0f GB/s)  in a graph of 10: %8.1f us per call "
               "(%6.0f GB/s)\n",
               ctxs[i], t1, gb / t1 * 1e6, t10, gb / t10 * 1e6);
        for (int k = 0; k < 5; k++) {
            set_want(wants[k]);
            float t = time_median(t_graph10_v, &c) / 10;
            printf("time decode ctx=%-6d want=%-4d in a graph of 10: %8.1f us per call (%6.0f "
                   "GB/s)\n",
                   ctxs[i], wants[k], t, gb / t * 1e6);
        }
        set_want(0);
    }
    /* a 512-token chunk at 128K, and 4096-token chunks from 0, at 28K (a 32K prompt's last), at
     * 32K, 64K and 124K (a 128K prompt's last) */
    const int pn[6] = {n, 4096, 4096, 4096, 4096, 4096};
    const int pp[6] = {maxc - n, 0, 32768 - 4096, 32768, 65536, maxc - 4096};
    for (int k = 0; k < 6; k++) {
        const int p0 = pp[k];
        lily_cuda_h2d(c.pos, &p0, 4, &e);
        c.n = pn[k];
        double fl = 0; /* q.k and p.v multiply-adds of the causal chunk, 16 heads */
        for (int i = 0; i < c.n; i++)
            fl += 2.0 * 2 * 256 * 16 * (p0 + i + 1);
        float t = time_median(t_prefill_v, &c);
        printf("time prefill n=%d pos0=%d %10.1f us (%.1f TFLOP/s)\n", c.n, p0, t, fl / t / 1e6);
    }
}

static void time_all(void) {
    const int maxc = 131072, w = 2 * 256, n = 512, nq_max = 4096;
    lily_err e;
    const size_t rb = lily_cuda_kv_bytes(1, 2, 256), cb = lily_cuda_kv_bytes(maxc, 2, 256);
    uint8_t *h = malloc(cb);
    float row[2 * 256];
    tctx c = {0};
    c.k = pt_dalloc(cb);
    c.v = pt_dalloc(cb);
    for (int kv = 0; kv < 2; kv++) {
        for (int p = 0; p < maxc; p++) {
            pt_fill(row, w, 2.0f);
            kv_pack_row(row, 2, 256, h + (size_t)p * rb);
        }
        lily_cuda_h2d(kv ? c.v : c.k, h, cb, &e);
    }
    free(h);
    float *hq = malloc((size_t)nq_max * 16 * 256 * 4);
    pt_fill(hq, (size_t)nq_max * 16 * 256, 1.5f);
    c.q = pt_dup(hq, (size_t)nq_max * 16 * 256);
    pt_fill(hq, (size_t)nq_max * 16 * 256, 3.0f);
    c.gate = pt_dup(hq, (size_t)nq_max * 16 * 256);
    free(hq);
    c.out = pt_dalloc((size_t)nq_max * 16 * 256 * 4);
    c.scr = pt_dalloc(lily_cuda_attn_decode_scratch(16, 256, 128) * 4);
    c.part = pt_dalloc(lily_cuda_attn_prefill_scratch(16, 2, 256) * 4);
    c.pos = dev_pos(0);
    cudaStreamCreate(&c.st);
    /* "1f": the one-pass modes alone, attn_fa.cu's kernel (auto split, unsplit) */
    static const int fast_modes[] = {1, 4};
    const int fast_only = getenv("LILY_CUDA_TIME")[1] == 'f';
    const int nm = fast_only ? 2 : k_pre_modes;
    for (int i = 0; i < nm; i++) {
        const int m = fast_only ? fast_modes[i] : i;
        set_pre_mode(m);
        printf("time: mode%s\n", pre_mode_name(m));
        time_mode(&c, maxc, n);
    }
    set_pre_mode(0); /* back to the defaults */
    lily_cuda_free(c.k), lily_cuda_free(c.v), lily_cuda_free(c.q), lily_cuda_free(c.gate);
    lily_cuda_free(c.out), lily_cuda_free(c.scr), lily_cuda_free(c.pos), lily_cuda_free(c.part);
    cudaStreamDestroy(c.st);
}

static void run_attn(const op_row *r) {
    if (r->op == OP_ATTN_PREP) {
        prep_case(r->Nk, r->Nv, r->dim, r->R, r->pos, r->n, r->gated);
    } else if (r->op == OP_ATTN_DECODE) {
        set_want(r->want);
        decode_case(r->Nk, r->Nv, r->dim, r->ctx, r->splits, r->gated);
        set_want(0);
    } else if (r->op == OP_ATTN_PREFILL) {
        prefill_case(r->Nk, r->Nv, r->dim, r->pos, r->n, r->gated);
    } else if (r->op == OP_ATTN_ROWS) {
        attn_rows_case(r->Nk, r->Nv, r->dim, r->n, r->gated);
    } else {
        lily_err e;
        pt_check_true("attention rejects Dh=96",
                      lily_cuda_attn_prefill(NULL, 1, NULL, NULL, NULL, 2, 1, 96, 1, NULL, NULL,
                                             NULL, NULL, &e) == -1);
    }
}

/* ---- embed, rmsnorm, argmax, advance --------------------------------------------------------- */

static void run_embed(const op_row *r) {
    lily_err e;
    char name[128];
    const lily_dtype dt = r->dt;
    const int V = r->V, H = r->dim, n = r->n;
    lily_mat m = pt_mat(dt, V, H);
    lily_dmat d;
    if (!pt_ok(lily_cuda_dmat_upload(&m, 1, &d, &e), "upload", &e)) return;
    int32_t *tok = malloc(n * 4);
    for (int i = 0; i < n; i++)
        tok[i] = i == 0 ? V - 1 : (int32_t)(pt_rnd() % V);
    int ld = H + 4;
    float *ref = malloc((size_t)n * ld * 4), *got = malloc((size_t)n * ld * 4);
    for (int t = 0; t < n; t++) {
        lily_mat_row_f32(&m, tok[t], ref + (size_t)t * ld);
        if (dt == LILY_DT_F32)
            for (int c = 0; c < H; c++)
                ref[(size_t)t * ld + c] =
                    lily_bf16_to_f32(lily_f32_to_bf16(ref[(size_t)t * ld + c]));
        for (int c = H; c < ld; c++)
            ref[(size_t)t * ld + c] = 0;
    }
    int32_t *dtok = pt_idup(tok, n);
    float *dx = pt_dalloc((size_t)n * ld * 4);
    lily_cuda_memset(dx, 0, (size_t)n * ld * 4, NULL, &e);
    if (!pt_ok(lily_cuda_embed(&d, dtok, n, dx, ld, NULL, &e), "embed", &e)) return;
    pt_get(got, dx, (size_t)n * ld);
    snprintf(name, sizeof name, "embed %s V=%d H=%d n=%d", dt_names[dt], V, H, n);
    pt_check(name, got, ref, (size_t)n * ld, r->tol);
    lily_cuda_free(dtok), lily_cuda_free(dx);
    lily_cuda_dmat_free(&d);
    pt_mat_free(&m);
    free(tok), free(ref), free(got);
}

/* Words and multipliers of the module's last split, copied out. */
static void get_words(const uint32_t *w, const float *mul, int n, int dim, uint32_t *hw,
                      float *hm) {
    lily_err e;
    lily_cuda_sync(&e);
    lily_cuda_d2h(hw, w, (size_t)n * dim * 4, &e);
    lily_cuda_d2h(hm, mul, (size_t)n * 4, &e);
}

/* lily_cuda_rmsnorm_split against lily_cuda_rmsnorm (dy: its rows) and a separate split of them:
 * the same bits. The fused rows are then overwritten before the hold, so the words the GEMMs
 * would read can only match if the hold kept the norm's words. Also in place (x == y). */
static void rmsnorm_split_check(const float *dx, int ldx, const float *dw, int n, int dim,
                                const float *dy, int ldy) {
    lily_err e;
    char name[160];
    const size_t ny = (size_t)n * ldy;
    uint32_t *wa = malloc((size_t)n * dim * 4), *wb = malloc((size_t)n * dim * 4);
    float *ma = malloc(n * 4), *mb = malloc(n * 4), *ya = malloc(ny * 4), *yb = malloc(ny * 4);
    const uint32_t *w;
    const float *mul;
    float *dy2 = pt_dalloc(ny * 4), *dxy = pt_dalloc((size_t)n * ldx * 4);
    lily_cuda_memset(dy2, 0, ny * 4, NULL, &e);
    lily_cuda_xsplit_hold(NULL);
    if (!pt_ok(lily_cuda_xsplit(dy, ldy, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wa, ma);
    if (!pt_ok(lily_cuda_rmsnorm_split(dx, ldx, dw, n, dim, 1e-6f, dy2, ldy, NULL, &e),
               "rmsnorm_split", &e))
        return;
    pt_get(ya, dy, ny);
    pt_get(yb, dy2, ny);
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d: y bits as rmsnorm", n, dim);
    pt_check_true(name, memcmp(ya, yb, ny * 4) == 0);
    lily_cuda_memset(dy2, 0, ny * 4, NULL, &e); /* not split again below if the hold keeps */
    lily_cuda_xsplit_hold(dy2);
    if (!pt_ok(lily_cuda_xsplit(dy2, ldy, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wb, mb);
    lily_cuda_xsplit_hold(NULL);
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d: held words as a split of y", n, dim);
    pt_check_true(name, memcmp(wa, wb, (size_t)n * dim * 4) == 0 && memcmp(ma, mb, n * 4) == 0);
    /* in place: x == y */
    lily_cuda_d2d(dxy, dx, (size_t)n * ldx * 4, NULL, &e);
    if (!pt_ok(lily_cuda_rmsnorm_split(dxy, ldx, dw, n, dim, 1e-6f, dxy, ldx, NULL, &e),
               "rmsnorm_split in place", &e))
        return;
    lily_cuda_xsplit_hold(dxy);
    if (!pt_ok(lily_cuda_xsplit(dxy, ldx, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wb, mb);
    lily_cuda_xsplit_hold(NULL);
    float *yc = malloc((size_t)n * ldx * 4);
    pt_get(yc, dxy, (size_t)n * ldx);
    int same = memcmp(wa, wb, (size_t)n * dim * 4) == 0 && memcmp(ma, mb, n * 4) == 0;
    for (int t = 0; t < n; t++)
        same &= memcmp(yc + (size_t)t * ldx, ya + (size_t)t * ldy, (size_t)dim * 4) == 0;
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d in place: same y and words", n, dim);
    pt_check_true(name, same);
    lily_cuda_free(dy2), lily_cuda_free(dxy);
    free(wa), free(wb), free(ma), free(mb), free(ya), free(yb), free(yc);
}

static void run_rmsnorm(const op_row *r) {
    lily_err e;
    char name[128];
    const int n = r->n, dim = r->dim, ldx = dim + 3, ldy = dim + 1;
    float *x = malloc((size_t)n * ldx * 4), *w = malloc(dim * 4);
    float *ref = malloc((size_t)n * ldy * 4), *got = malloc((size_t)n * ldy * 4);
    pt_fill(x, (size_t)n * ldx, 3.0f);
    for (int i = 0; i < dim; i++)
        w[i] = 1 + 0.5f * pt_frand();
    for (int t = 0; t < n; t++) {
        lily_cpu_rmsnorm(x + (size_t)t * ldx, w, dim, 1e-6f, ref + (size_t)t * ldy);
        ref[(size_t)t * ldy + dim] = 0;
    }
    float *dx = pt_dup(x, (size_t)n * ldx), *dw = pt_dup(w, dim);
    float *dy = pt_dalloc((size_t)n * ldy * 4);
    lily_cuda_memset(dy, 0, (size_t)n * ldy * 4, NULL, &e);
    if (!pt_ok(lily_cuda_rmsnorm(dx, ldx, dw, n, dim, 1e-6f, dy, ldy, NULL, &e), "rmsnorm", &e))
        return;
    pt_get(got, dy, (size_t)n * ldy);
    snprintf(name, sizeof name, "rmsnorm rows n=%d dim=%d", n, dim);
    pt_check(name, got, ref, (size_t)n * ldy, r->tol);
    rmsnorm_split_check(dx, ldx, dw, n, dim, dy, ldy);
    lily_cuda_free(dx), lily_cuda_free(dw), lily_cuda_free(dy);
    free(x), free(w), free(ref), free(got);
}

static void run_argmax(const op_row *r) {
    lily_err e;
    char name[128];
    const int n = r->n;
    float *x = malloc(n * 4);
    for (int i = 0; i < n; i++)
        x[i] = -5.0f + pt_frand();
    int best = r->at >= 0 ? r->at : (int)(pt_rnd() % n);
    x[best] = 3.0f;
    if (best + 7 < n) x[best + 7] = 3.0f; /* a tie: the lower index must win */
    float *dx = pt_dup(x, n);
    void *scr = pt_dalloc(16);
    int32_t got = -1;
    int rc = lily_cuda_argmax(dx, n, (uint64_t *)scr + 1, (int32_t *)scr, NULL, &e);
    if (!pt_ok(rc, "argmax", &e)) return;
    lily_cuda_sync(&e);
    lily_cuda_d2h(&got, scr, 4, &e);
    snprintf(name, sizeof name, "argmax n=%d: got %d, expected %d", n, got, best);
    pt_check_true(name, got == best);
    lily_cuda_free(dx), lily_cuda_free(scr);
    free(x);
}

/* lily_cuda_advance with step counters near the ends of int32 (a negative one indexed before the
 * ring once): the token lands at (unsigned)step % cap, nothing outside the ring changes. */
static void run_advance(const op_row *r) {
    lily_err e;
    char name[128];
    const int32_t step0 = r->step;
    const int cap = r->cap, guard = 256, total = 2 * guard + cap;
    int32_t *h = malloc(total * 4), *got = malloc(total * 4), st[4] = {4321, 77, 10, step0};
    for (int i = 0; i < total; i++)
        h[i] = -1000 - i;
    int32_t *d = pt_idup(h, total), *ds = pt_idup(st, 4);
    /* ds: [0] argmax, [1] tok, [2] pos, [3] step */
    int rc = lily_cuda_advance(ds, ds + 1, ds + 2, d + guard, cap, ds + 3, NULL, &e) ||
             lily_cuda_sync(&e);
    snprintf(name, sizeof name, "advance step %d ring %d: launch", (int)step0, cap);
    if (!pt_ok(rc, name, &e)) return;
    lily_cuda_d2h(got, d, total * 4, &e);
    lily_cuda_d2h(st, ds, 16, &e);
    const int slot = (int)((uint32_t)step0 % (uint32_t)cap);
    int bad = 0;
    for (int i = 0; i < total; i++)
        bad += got[i] != (i == guard + slot ? 4321 : h[i]);
    snprintf(name, sizeof name, "advance step %d ring %d: token at slot %d only (%d wrong)",
             (int)step0, cap, slot, bad);
    pt_check_true(name, bad == 0);
    snprintf(name, sizeof name, "advance step %d: tok, pos, step", (int)step0);
    pt_check_true(name, st[1] == 4321 && st[2] == 11 && st[3] == (int32_t)((uint32_t)step0 + 1u));
    lily_cuda_free(d), lily_cuda_free(ds);
    free(h), free(got);
}

/* ---- the driver ------------------------------------------------------------------------------ */

/* The row's shape and variant in words. */
static void row_desc(const op_row *r, char *s, size_t cap) {
    static const char *pks[] = {"copy", "rmsnorm"}, *eps[] = {"store", "add", "conv"};
    static const char *routes[] = {"gpu-routed", "experts-0..k-1", "skewed"};
    switch (r->op) {
    case OP_GEMV:
    case OP_GEMV_ROWS: {
        int o = snprintf(s, cap, "%s cols=%d rows=", dt_names[r->dt], r->dim);
        for (int i = 0; i < r->nseg && o > 0 && (size_t)o < cap; i++)
            o += snprintf(s + o, cap - o, "%s%d", i ? "," : "", r->rows[i]);
        if (o > 0 && (size_t)o < cap)
            o += snprintf(s + o, cap - o, " %s %s", pks[r->pro], eps[r->epi]);
        if (r->op == OP_GEMV_ROWS && o > 0 && (size_t)o < cap)
            snprintf(s + o, cap - o, " x%d vectors", r->n);
        break;
    }
    case OP_MOE_DECODE:
    case OP_MOE_GRAPH:
    case OP_MOE_PREFILL:
        snprintf(s, cap, "E=%d k=%d H=%d I=%d Is=%d%s%s n=%d%s%s", r->E, r->k, r->dim, r->I, r->Is,
                 r->sg ? " gated-shared" : "", r->stack ? " stacked" : "",
                 r->op == OP_MOE_PREFILL ? r->n : 1, r->op == OP_MOE_PREFILL ? " " : "",
                 r->op == OP_MOE_PREFILL ? (r->E ? routes[r->route] : "dense") : "");
        break;
    case OP_MOE_ROWS: {
        static const char *shares[] = {"own", "same", "pairs"};
        snprintf(s, cap, "E=%d k=%d H=%d I=%d Is=%d%s%s rows=%d %s", r->E, r->k, r->dim, r->I,
                 r->Is, r->sg ? " gated-shared" : "", r->stack ? " stacked" : "", r->n,
                 shares[r->route]);
        break;
    }
    case OP_SKINNY:
    case OP_SKINNY_PAIR: {
        static const char *cs[] = {"C1", "C2", "C3", "C4", "routed"};
        int o = snprintf(s, cap, "M=%d K=%d counts=%s", r->M, r->dim,
                         r->cset >= 0 && r->cset <= SK_ROUTED ? cs[r->cset] : "?");
        if (r->cset == SK_ROUTED && o > 0 && (size_t)o < cap)
            o += snprintf(s + o, cap - o, " top-%d of %d", r->k, r->E);
        if (o > 0 && (size_t)o < cap)
            snprintf(s + o, cap - o, " n=%d%s%s", r->n, r->gather ? " gather" : "",
                     r->spread ? " rows 1e-6..1e6" : "");
        break;
    }
    case OP_EMBED:
        snprintf(s, cap, "%s V=%d H=%d n=%d", dt_names[r->dt], r->V, r->dim, r->n);
        break;
    case OP_RMSNORM: snprintf(s, cap, "n=%d dim=%d", r->n, r->dim); break;
    case OP_ARGMAX: snprintf(s, cap, "n=%d at=%d", r->n, r->at); break;
    case OP_ADVANCE: snprintf(s, cap, "step=%d cap=%d", (int)r->step, r->cap); break;
    case OP_GDN_CONV: snprintf(s, cap, "C=%d K=%d n=%d", r->dim, r->K, r->n); break;
    case OP_GDN_SCAN:
        snprintf(s, cap, "Nk=%d Nv=%d Dk=128 Dv=%d n=%d", r->Nk, r->Nv, r->dim, r->n);
        break;
    case OP_GDN_GNORM: snprintf(s, cap, "n=%d heads=%d x %d", r->n, r->Nv, r->dim); break;
    case OP_GDN_ROWS:
        snprintf(s, cap, "Nk=%d Nv=%d Dk=128 Dv=%d rows=%d", r->Nk, r->Nv, r->dim, r->n);
        break;
    case OP_ATTN_PREP:
        snprintf(s, cap, "Nq=%d Nkv=%d Dh=%d R=%d pos0=%d n=%d%s", r->Nk, r->Nv, r->dim, r->R,
                 r->pos, r->n, r->gated ? " gated" : "");
        break;
    case OP_ATTN_DECODE:
        snprintf(s, cap, "Nq=%d Nkv=%d Dh=%d ctx=%d splits=%d want=%d%s", r->Nk, r->Nv, r->dim,
                 r->ctx, r->splits, r->want, r->gated ? " gated" : "");
        break;
    case OP_ATTN_PREFILL:
        snprintf(s, cap, "Nq=%d Nkv=%d Dh=%d pos0=%d n=%d%s", r->Nk, r->Nv, r->dim, r->pos, r->n,
                 r->gated ? " gated" : "");
        break;
    case OP_ATTN_ROWS:
        snprintf(s, cap, "Nq=%d Nkv=%d Dh=%d rows=%d%s", r->Nk, r->Nv, r->dim, r->n,
                 r->gated ? " gated" : "");
        break;
    case OP_GEMV_ARGS:
    case OP_GDN_ARGS:
    case OP_ATTN_ARGS:
    case OP_SKINNY_ARGS: snprintf(s, cap, "bad arguments"); break;
    }
}

static void run_row(const op_row *r) {
    switch (r->op) {
    case OP_GEMV: run_gemv(r); break;
    case OP_GEMV_ROWS: run_gemv_rows(r); break;
    case OP_SKINNY:
    case OP_SKINNY_PAIR:
    case OP_SKINNY_ARGS: run_skinny(r); break;
    case OP_MOE_DECODE:
    case OP_MOE_GRAPH:
    case OP_MOE_PREFILL:
    case OP_MOE_ROWS: run_moe(r); break;
    case OP_EMBED: run_embed(r); break;
    case OP_RMSNORM: run_rmsnorm(r); break;
    case OP_ARGMAX: run_argmax(r); break;
    case OP_ADVANCE: run_advance(r); break;
    case OP_GDN_CONV:
    case OP_GDN_SCAN:
    case OP_GDN_GNORM:
    case OP_GDN_ROWS: run_gdn(r); break;
    case OP_GEMV_ARGS:
    case OP_GDN_ARGS: run_args(r); break;
    case OP_ATTN_PREP:
    case OP_ATTN_DECODE:
    case OP_ATTN_PREFILL:
    case OP_ATTN_ROWS:
    case OP_ATTN_ARGS: run_attn(r); break;
    }
}

static int selected(const char *op, int argc, char **argv) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(op, argv[i])) return 1;
    return 0;
}

static int env_is(const char *name, char c) {
    const char *v = getenv(name);
    return v && v[0] == c;
}

int main(int argc, char **argv) {
    pt_need_gpu();
    /* sanitizer-sized runs: LILY_GDN_QUICK=1 skips the long scans, LILY_CUDA_SAN=1 the rows marked
     * nosan, LILY_CUDA_SAN=2 runs the racecheck-sized rows alone */
    const int small = env_is("LILY_GDN_QUICK", '1'), san1 = env_is("LILY_CUDA_SAN", '1');
    const int san2 = env_is("LILY_CUDA_SAN", '2');
    const char *tm = getenv("LILY_CUDA_TIME");
    if (tm && (!strcmp(tm, "1p") || !strcmp(tm, "1f"))) { /* attention prefill timing alone */
        time_all();
        return pt_finish();
    }
    if (tm && !strcmp(tm, "1s")) { /* the skinny expert GEMMs' timing alone */
        skinny_timing();
        return pt_finish();
    }
    const int nrows = (int)(sizeof table / sizeof table[0]);
    g_pool = lily_pool_create(0);
    int ran = 0, rows_failed = 0;
    char desc[200];
    for (int i = 0; i < nrows; i++) {
        const op_row *r = &table[i];
        if (!selected(op_names[r->op], argc, argv) || (small && r->big) || (san1 && r->nosan) ||
            (san2 ? !r->race : r->race == 2))
            continue;
        /* each row its own stream of random numbers: a filtered run repeats the full run's rows */
        pt_rng = 0x2545f4914f6cdd1dull ^ ((uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
        if (!pt_rng) pt_rng = 1;
        pt_row_rel = pt_row_abs = 0;
        const int fail0 = pt_fail, pass0 = pt_pass;
        run_row(r);
        const int ok = pt_fail == fail0 && pt_pass > pass0;
        if (!ok && pt_fail == fail0) pt_fail++; /* a row that checked nothing */
        rows_failed += !ok;
        ran++;
        row_desc(r, desc, sizeof desc);
        printf("ROW %3d %-12s %-58s rel=%-9.3g maxabs=%-9.3g %s\n", i, op_names[r->op], desc,
               pt_row_rel, pt_row_abs, ok ? "PASS" : "FAIL");
    }
    lily_pool_free(g_pool);
    if (!ran) {
        printf("FAIL no row matches the filter\n");
        return 1;
    }
    printf("%d rows, %d failed\n", ran, rows_failed);
    /* LILY_CUDA_TIME=1 with the gdn_scan rows selected: the scan kernels' times */
    if (env_is("LILY_CUDA_TIME", '1') && selected("gdn_scan", argc, argv)) scan_timing();
    /* and with the attention rows selected: decode and prefill at the 35B-A3B shape */
    if (env_is("LILY_CUDA_TIME", '1') && selected("attn_prefill", argc, argv)) time_all();
    /* and with the skinny rows selected: the 35B-A3B expert GEMMs */
    if (env_is("LILY_CUDA_TIME", '1') && selected("skinny", argc, argv)) skinny_timing();
    return pt_finish();
}
#endif
