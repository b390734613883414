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

/* How the prefill GEMMs (gemm.h, gemm_split.h) and attention (attn.h) multiply: exact (GEMM
 * activations split into fp16 hi + lo; attention on the K/V codes and q, p split into exact
 * parts) or one pass (the Q4 GEMMs that gemm_wg.h runs: the fp16 hi words alone; the others and
 * attention: bf16). The backend sets it from its engine's precision at the start of every
 * call that launches work (backend.cu), tests directly; it holds for the calling thread. A new
 * thread starts with both exact. */
typedef struct lily_cuda_prec {
    int gemm_exact, attn_exact;
} lily_cuda_prec;
void lily_cuda_prec_set(lily_cuda_prec p);
lily_cuda_prec lily_cuda_prec_get(void);

#ifdef __cplusplus
}
#endif

#endif
