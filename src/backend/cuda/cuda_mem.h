/* CUDA device memory: device selection, allocation and copies with lily_err reporting, and the
 * device form of a weight matrix (lily_dmat) with its upload from a bound lily_mat.
 *
 * Weight residency: every matrix is uploaded once. MLX Q4/Q8 codes are copied as stored (row
 * stride cols*bits/8 bytes, 16-byte aligned for cols % 64 == 0), and each group's bf16 scale and
 * bias are interleaved into one 32-bit word (scale low, bias high): the same bytes as the two
 * separate arrays (0 bytes of overhead), fetched with one load. BF16 matrices are copied as is;
 * F32 and F16 matrices are rounded to BF16 at upload (HF checkpoints are kept in bf16, not
 * re-quantized: the 35B-A3B in bf16 is 69 GB and fits the H200). A stack of experts is one
 * allocation with a fixed stride between experts, so kernels index an expert by id. */
#ifndef LILY_BACKEND_CUDA_CUDA_MEM_H
#define LILY_BACKEND_CUDA_CUDA_MEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* model.h declares C functions without its own guard */
#endif

#include "lily.h"
#include "model/model.h"

/* Same type as cudaStream_t, usable from C without the CUDA headers. NULL = legacy stream. */
typedef struct CUstream_st *lily_cuda_stream;

enum { LILY_CW_Q4 = 0, LILY_CW_Q8 = 1, LILY_CW_BF16 = 2 };

typedef struct lily_dmat {
    int dt;             /* LILY_CW_* */
    int rows, cols;     /* logical shape of one matrix; cols % 64 == 0 */
    int n_mats;         /* 1, or the number of stacked experts */
    const uint8_t *w;   /* device codes: [n_mats][rows][row bytes] */
    const uint32_t *sb; /* device, Q only: [n_mats][rows][cols/64] (scale | bias << 16) */
    size_t w_stride;    /* bytes between consecutive matrices of a stack */
    size_t sb_stride;   /* words between consecutive matrices of a stack */
    void *owned;        /* the allocation holding w and sb */
} lily_dmat;

/* Number of usable CUDA devices (0 when there is no driver or device). */
int lily_cuda_device_count(void);
/* Makes device the current one for this thread. */
int lily_cuda_set_device(int device, lily_err *e);
/* Name and memory of the current device, for logs. */
int lily_cuda_describe(char *buf, size_t n);

/* cudaMalloc of n bytes (n may be 0: returns a valid 256-byte block). NULL + message on failure. */
void *lily_cuda_alloc(size_t n, lily_err *e);
void lily_cuda_free(void *p);
int lily_cuda_h2d(void *dst, const void *src, size_t n, lily_err *e);
int lily_cuda_d2h(void *dst, const void *src, size_t n, lily_err *e);
int lily_cuda_d2d(void *dst, const void *src, size_t n, lily_cuda_stream st, lily_err *e);
int lily_cuda_memset(void *dst, int v, size_t n, lily_cuda_stream st, lily_err *e);
/* Waits for all work on the device and reports any asynchronous fault. */
int lily_cuda_sync(lily_err *e);
/* Allocates and uploads n floats (a norm weight, conv taps...). */
float *lily_cuda_upload_f32(const float *src, size_t n, lily_err *e);

/* Uploads one matrix (or, with n > 1, a stack of n experts of identical shape and type). */
int lily_cuda_dmat_upload(const lily_mat *mats, int n, lily_dmat *out, lily_err *e);
/* Uploads the n matrices ms (same type, columns and group; any row counts) stacked by rows as
 * one matrix *cat, and makes views[i] a non-owning view of matrix i's rows in it (free only
 * *cat). One GEMM over *cat computes them all. */
int lily_cuda_dmat_upload_cat(const lily_mat *ms, int n, lily_dmat *cat, lily_dmat *views,
                              lily_err *e);
void lily_cuda_dmat_free(lily_dmat *m);
/* Device bytes held by m. */
size_t lily_cuda_dmat_bytes(const lily_dmat *m);

/* Decode tuning switches, read from the environment by lily_cuda_tune_reload (the backend calls
 * it at open; the first lily_cuda_tune_get loads it otherwise), for A/B timing in one process
 * (test_cuda_bench LILY_CUDA_BENCH_VARIANTS):
 *   LILY_CUDA_PDL: 0 = ordinary launches (default), 1 = programmatic dependent launch with the
 *     trigger at kernel start, 2 = PDL with the trigger after the main loop. Both PDL modes
 *     measured slower on the H200 (bench/NOTES-cuda-dec.md).
 *   LILY_CUDA_FUSED_ROUTER: 1 (default) = the MoE decode router inside the gate/up launch when
 *     the whole grid is co-resident (moe.cu; +3.8 % decode at 4K on the H200); 0 = its own GEMV.
 *   LILY_CUDA_GEMM_EXACT: 1 (default) = prefill GEMMs with fp16 weights and the activations as
 *     fp16 hi + lo (about 21 bits); 0 = one bf16 pass (gemm.h).
 *   LILY_CUDA_ATTN_EXACT: 1 (default) = attention with the K/V cache and q, p split so the
 *     products carry about 16 bits; 0 = one bf16 pass (attn.h).
 *   LILY_CUDA_GROUP_BN: rows per tile of the grouped (expert) prefill GEMMs, 32 or 64; unset (0):
 *     chosen per chunk by moe_prefill.cu (64 when the experts average >= 64 rows: +3.9 % prefill
 *     at 4096-token chunks on the H200).
 *   LILY_CUDA_SKINNY: 1 (default) = expert tiles of <= 16 rows through the skinny grouped GEMM
 *     (gemm_skinny.h) when the experts average fewer than LILY_CUDA_SKINNY_BELOW rows (default
 *     64, where the 64-row tiles take over: chunks of up to ~2K tokens of the 35B's 256 experts x
 *     top-8; measured on the H200 against 16: +5.8 % at 512 tokens, +1.4 % at 1K, and against
 *     33: +4.0 % at 1280, +1.5 % at 1536, +0.8 % at 1792); 0 = the 32-row tiles.
 *   LILY_CUDA_SKINNY_PAIR: 1 (default) = a skinny MoE layer's gate and up projections in one
 *     launch (lily_cuda_gemm_skinny_grouped_pair); 0 = one launch each.
 *   LILY_CUDA_NORM_SPLIT: 1 (default) = the layers' input and post-attention RMSNorms also write
 *     the exact GEMMs' split words (lily_cuda_rmsnorm_split); 0 = a separate split launch.
 *     H200, 35B-A3B: +0.9 % at 256 tokens, +0.8 % at 512, +0.3 % at 1K.
 *   LILY_CUDA_MOE_STACK: 1 (default) = a MoE prefill runs the router and the shared expert's
 *     gate logit as one GEMM, and the shared expert's gate and up projections as one, where the
 *     backend uploaded them stacked (lily_cuda_moe.router_gw, .sh_gu); 0 = one GEMM each.
 *   LILY_CUDA_PROJ_STACK: 1 (default) = a layer's input projections as one prefill GEMM where the
 *     backend uploaded them stacked (GDN qkv, z, b, a; attention q, k, v); 0 = GDN qkv, z and
 *     b|a, attention q and k|v, one GEMM each.
 *   LILY_CUDA_GDN_KERNEL: forces the GDN prefill scan (gdn.h): tiled4 (what runs unset), tiled8,
 *     tiled16, tiled8x2, tiled16x2 or tiled16x4.
 *   LILY_CUDA_GDN_LAZY: 1 (default) = tiled4 keeps the state divided by its decay since the last
 *     fold (gdn.cu: no per-token scaling pass; -11 % per layer at 2048 tokens); 0 = scaled every
 *     token.
 *   LILY_CUDA_ATTN_BIAS: attn.cu's exact attention prefill (LILY_CUDA_ATTN_WG=0, or head dims
 *     other than 256): 1 (default) = the K lo bytes keep their fp16 bias (4 + lo) in the products
 *     and the bias comes off each score (H200: -7 % per chunk at depth); 0 = subtracted per code.
 *   LILY_CUDA_ATTN_WG: the exact attention prefill at head dim 256 on wgmma (attn_wg.h): 3
 *     (default) = S from the hh, hl and lh digit products with a producer warpgroup converting
 *     the cache rows for two consumers (attn_ws.cu; H200, 4096 tokens at depth 28672: 9.55 ms
 *     against 10.73 for 1); 1 = the same products, every warpgroup converting (attn_wg.cu;
 *     20.3 ms for attn.cu's kernel); 2 = 1 with ll too (-6 %, fixtures alike); 0 = attn.cu's
 *     mma.sync kernel (the only form for other head dims); 4 = 3 with P V on 8-bit wgmma (P as
 *     16-bit fixed point per row and tile against the V codes' s8 digits: attn_pv8.cuh) and two K
 *     buffers (H100, 4096 at 28672: 9.75 ms against 9.68; the consumers' turns hold it).
 *   LILY_CUDA_ATTN_SPLIT: the wgmma kernels split over the causal spans: 1 (default) = when a
 *     chunk's grid leaves SMs idle, as many splits as fill them (a short chunk deep in the
 *     cache, an agent's turn: 512 tokens at 128K 1.58x, at 32K 1.27x end to end); 0 = never;
 *     N in 2..16 = N splits (tests, measurements).
 *   LILY_CUDA_ATTN_SWZ: 1 = the warp-specialised attention kernel's operand planes in the
 *     128-byte swizzled layout (attn_wg.cuh); 0 (default) = the no-swizzle core-matrix layout.
 *   LILY_CUDA_ATTN_BULK: how the warp-specialised attention kernel's producer lands each
 *     tile's cache rows (not with ATTN_SWZ): 2 (default) = one tensor-map copy a tile on an
 *     mbarrier (P V on s8 takes 1 instead; H100, 4096 tokens at 28672: 9.56 -> 8.45 ms, 35B
 *     prefill at 128K +7.1 %); 1 = one bulk copy (TMA, no tensor map) a row (no gain); 0 =
 *     16 cp.async a thread.
 *   LILY_CUDA_WG_LOOP: the k-loop of the wgmma GEMM (gemm_wg.h): 4 (default) = the stages
 *     copied by TMA on mbarriers, the next step's dequantization under this step's wgmma (dense
 *     products with K a multiple of 256 and the swizzled planes; the rest, the grouped expert
 *     launches included, run 2; H100, 35B 4K chunk: 21.5K against 20.3K tok/s for 2), 2 = the
 *     same with cp.async copies and one barrier a step, 1 = 2 with two barriers a step, 3 = 2
 *     with each step's copies issued after its wgmma (+0.5 %, noise), 0 = simple.
 *   LILY_CUDA_WG_SWZ: 1 (default) = the wgmma GEMM's activation planes in the 128-byte
 *     swizzled layout; 0 = the no-swizzle core-matrix layout (20.1K against 18.8K tok/s there).
 *   LILY_CUDA_WG_N64: 1 = a dense wgmma GEMM whose 128-token blocks would not fill one wave
 *     runs 64-token blocks (twice the blocks; AUTO counts those against
 *     LILY_GEMM_WG_MIN_BLOCKS, so e.g. the stacked GDN projection at 256 tokens, 98 -> 196
 *     blocks, goes to it); 0 (default) = 128-token blocks only (H100, 35B, with
 *     LILY_GEMM_WG_MIN_BLOCKS=16: 256 tokens -2.6 %, 512 +1.0 %, 1K +2.2 % for 1).
 * Read once at first use by their kernels' files instead (not reloaded): LILY_GEMM_KERNEL,
 * LILY_GEMM_WG_MIN_BLOCKS and LILY_GEMM_WG_GROUPED (which prefill GEMMs run where: gemm.h),
 * LILY_CUDA_SKINNY_SUB, _CP and _PF (gemm_skinny.h),
 * LILY_CUDA_ATTN_WS_TURN (attn_ws.cu).
 * gen changes on every reload, so a captured decode graph can tell it is stale. */
typedef struct lily_cuda_tune {
    int pdl;
    int fused_router, gemm_exact, attn_exact, group_bn, skinny, skinny_below, skinny_pair;
    int norm_split, gdn_kernel, gdn_lazy, moe_stack, proj_stack, attn_bias, attn_wg, attn_split;
    int wg_loop, wg_swz, wg_n64, attn_swz, attn_bulk;
    unsigned gen;
} lily_cuda_tune;
const lily_cuda_tune *lily_cuda_tune_get(void);
void lily_cuda_tune_reload(void);

#ifdef __cplusplus
}
#endif

#endif
