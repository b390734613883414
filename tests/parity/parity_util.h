/* Helpers shared by the GPU-vs-CPU parity tests (header-only; not a test itself): a seeded RNG,
 * random weight matrices in every stored format, relative-error comparison with a printed line per
 * check, and device buffers. Every check prints what it compares and its error; main prints the
 * final "N passed, N failed" line. */
#ifndef LILY_TESTS_PARITY_PARITY_UTIL_H
#define LILY_TESTS_PARITY_PARITY_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "model/model.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_mem.h"
#endif

static int pt_pass, pt_fail;
/* The largest relative and absolute errors of the checks since the caller last zeroed them (the
 * table driver of test_cuda_ops.c reports them per row). */
static double pt_row_rel, pt_row_abs;
static uint64_t pt_rng = 0x2545f4914f6cdd1dull;

static inline uint32_t pt_rnd(void) {
    pt_rng ^= pt_rng << 13;
    pt_rng ^= pt_rng >> 7;
    pt_rng ^= pt_rng << 17;
    return (uint32_t)(pt_rng >> 11);
}
/* uniform in [-1, 1) */
static inline float pt_frand(void) {
    return (float)((pt_rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}

static inline void pt_fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = pt_frand() * scale;
}

/* L2 error of got vs ref relative to the L2 norm of mag (NaN anywhere fails), with the max abs
 * difference: mag = ref is pt_check; a larger mag bounds the error against the size of the terms
 * a result was summed from (e.g. attention's sum of p |v| where the softmax averages V down). */
static inline int pt_check_scaled(const char *what, const float *got, const float *ref,
                                  const float *mag, size_t n, double tol) {
    double num = 0, den = 0, mx = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) nan = 1;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)mag[i] * mag[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = !nan && rel <= tol;
    if (nan || rel > pt_row_rel) pt_row_rel = nan ? INFINITY : rel;
    if (mx > pt_row_abs) pt_row_abs = mx;
    if (ok)
        pt_pass++;
    else
        pt_fail++;
    printf("%s %-60s n=%-8zu rel=%.3g maxabs=%.3g (tol %.1g)%s\n", ok ? "ok  " : "FAIL", what, n,
           rel, mx, tol, nan ? " NaN" : "");
    return ok;
}

/* Relative L2 error of got vs ref (NaN anywhere fails), with the max abs difference. */
static inline int pt_check(const char *what, const float *got, const float *ref, size_t n,
                           double tol) {
    return pt_check_scaled(what, got, ref, ref, n, tol);
}

static inline void pt_check_true(const char *what, int ok) {
    if (ok)
        pt_pass++;
    else
        pt_fail++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static inline int pt_finish(void) {
    printf("%d passed, %d failed\n", pt_pass, pt_fail);
    return pt_fail ? 1 : 0;
}

/* A random host matrix [rows, cols] of type dt (Q4/Q8 group 64, BF16, F32). Scales are small
 * and biases centred so that dequantized weights are O(1/sqrt(cols)). Free with pt_mat_free. */
static inline lily_mat pt_mat(lily_dtype dt, int rows, int cols) {
    lily_mat m;
    memset(&m, 0, sizeof m);
    m.dt = dt;
    m.rows = rows;
    m.cols = cols;
    size_t n = (size_t)rows * cols;
    float amp = 1.0f / sqrtf((float)cols);
    if (dt == LILY_DT_Q4 || dt == LILY_DT_Q8) {
        int bits = dt == LILY_DT_Q4 ? 4 : 8, qmax = (1 << bits) - 1;
        m.group = 64;
        size_t ng = n / 64;
        uint8_t *w = malloc(n * bits / 8);
        for (size_t i = 0; i < n * bits / 8; i++)
            w[i] = (uint8_t)pt_rnd();
        uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
        for (size_t g = 0; g < ng; g++) {
            float sc = (0.5f + 0.5f * fabsf(pt_frand())) * 2.0f * amp / qmax * 1.7f;
            s[g] = lily_f32_to_bf16(sc);
            b[g] = lily_f32_to_bf16(-sc * qmax / 2 + 0.2f * amp * pt_frand());
        }
        m.w = w;
        m.scales = s;
        m.biases = b;
    } else if (dt == LILY_DT_BF16) {
        uint16_t *w = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            w[i] = lily_f32_to_bf16(pt_frand() * 1.7f * amp);
        m.w = w;
    } else {
        float *w = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            w[i] = pt_frand() * 1.7f * amp;
        m.w = w;
    }
    return m;
}

static inline void pt_mat_free(lily_mat *m) {
    free((void *)m->w);
    free((void *)m->scales);
    free((void *)m->biases);
    memset(m, 0, sizeof *m);
}

/* Tile list of the grouped expert GEMMs for per-expert row counts, as moe_prefill.cu's scan
 * builds it: tiles of <= bn rows, (expert, first grouped row, rows) triples; returns the count
 * (tiles has room for sum ceil(count / bn) triples). */
static inline int pt_make_tiles(const int *counts, int E, int bn, int32_t *tiles) {
    int nt = 0, r0 = 0;
    for (int x = 0; x < E; x++) {
        for (int i = 0; i * bn < counts[x]; i++, nt++) {
            tiles[3 * nt] = x;
            tiles[3 * nt + 1] = r0 + i * bn;
            int left = counts[x] - i * bn;
            tiles[3 * nt + 2] = left < bn ? left : bn;
        }
        r0 += counts[x];
    }
    return nt;
}

#ifdef LILY_HAVE_CUDA
static inline int pt_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Timing modes (LILY_CUDA_TIME=1): the median of 20 cudaEvent-timed calls of f(ctx) on stream st
 * after 3 warm-ups, in microseconds; -1 when a call fails. */
typedef int (*pt_time_fn)(void *ctx);
static inline float pt_time_median(pt_time_fn f, void *ctx, cudaStream_t st) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float ms[20], r = -1.f;
    int bad = 0;
    for (int i = 0; i < 3 && !bad; i++)
        bad = f(ctx) != 0;
    for (int i = 0; i < 20 && !bad; i++) {
        cudaEventRecord(a, st);
        bad = f(ctx) != 0;
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms[i], a, b);
    }
    if (!bad) {
        qsort(ms, 20, sizeof ms[0], pt_cmp_float);
        r = 1000.f * (ms[9] + ms[10]) / 2;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return r;
}

/* Device copy of n int32 (4 bytes of slack: n may be 0); aborts the test on failure. */
static inline int32_t *pt_idup(const int32_t *h, size_t n) {
    lily_err e;
    int32_t *d = lily_cuda_alloc(n * 4 + 4, &e);
    if (!d || lily_cuda_h2d(d, h, n * 4, &e)) {
        printf("FAIL upload: %s\n", e.msg);
        exit(1);
    }
    return d;
}

/* Device copy of n floats (aborts the test on failure: nothing to recover). */
static inline float *pt_dup(const float *h, size_t n) {
    lily_err e;
    float *d = lily_cuda_upload_f32(h, n, &e);
    if (!d) {
        printf("FAIL upload: %s\n", e.msg);
        exit(1);
    }
    return d;
}
static inline void *pt_dalloc(size_t bytes) {
    lily_err e;
    void *d = lily_cuda_alloc(bytes, &e);
    if (!d) {
        printf("FAIL alloc: %s\n", e.msg);
        exit(1);
    }
    /* poison: a kernel that leaves an element unwritten shows up as NaN */
    lily_cuda_memset(d, 0xff, bytes, NULL, &e);
    return d;
}
static inline void pt_get(float *h, const void *d, size_t n) {
    lily_err e;
    if (lily_cuda_sync(&e) || lily_cuda_d2h(h, d, n * sizeof(float), &e)) {
        printf("FAIL device: %s\n", e.msg);
        exit(1);
    }
}
static inline int pt_ok(int rc, const char *what, const lily_err *e) {
    if (rc) {
        printf("FAIL %s: %s\n", what, e->msg);
        pt_fail++;
    }
    return rc == 0;
}
/* Exits 77 unless a CUDA device is present. */
static inline void pt_need_gpu(void) {
    if (lily_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        exit(77);
    }
    lily_err e;
    if (lily_cuda_set_device(0, &e)) {
        printf("skipped: %s\n", e.msg);
        exit(77);
    }
}
/* The reference CPU kernels: fp32 products (LILY_PRECISION_EXACT), never the int16-activation Q4
 * products the CPU backend runs by default on AVX-512 VNNI. */
static inline const lily_cpu_kern *pt_cpu(void) {
    static lily_cpu_kern k;
    static int made;
    if (!made) k = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_EXACT), made = 1;
    return &k;
}
#endif

#endif
