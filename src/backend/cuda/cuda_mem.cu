/* CUDA device memory and weight upload (see cuda_mem.h). */
#include "backend/cuda/cuda_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
extern "C" {
#include "backend/cpu/ops.h"
}

extern "C" int lily_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int lily_cuda_set_device(int device, lily_err *e) {
    int n = lily_cuda_device_count();
    if (n == 0) return lily_fail(e, "no CUDA device is available");
    if (device < 0 || device >= n)
        return lily_fail(e, "CUDA device %d does not exist (%d present)", device, n);
    LILY_CU_TRY(cudaSetDevice(device), e);
    return 0;
}

extern "C" int lily_cuda_describe(char *buf, size_t n) {
    int dev = 0;
    cudaDeviceProp p;
    size_t fr = 0, tot = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess ||
        cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        snprintf(buf, n, "no CUDA device");
        return -1;
    }
    snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f of %.1f GiB free)", p.name, p.major, p.minor,
             p.multiProcessorCount, fr / 1073741824.0, tot / 1073741824.0);
    return 0;
}

extern "C" void *lily_cuda_alloc(size_t n, lily_err *e) {
    void *p = NULL;
    cudaError_t r = cudaMalloc(&p, n ? n : 256);
    if (r != cudaSuccess) {
        (void)cudaGetLastError();
        lily_fail(e, "cudaMalloc of %zu bytes: %s", n, cudaGetErrorString(r));
        return NULL;
    }
    return p;
}

extern "C" void lily_cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int lily_cuda_h2d(void *dst, const void *src, size_t n, lily_err *e) {
    LILY_CU_TRY(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), e);
    return 0;
}

extern "C" int lily_cuda_d2h(void *dst, const void *src, size_t n, lily_err *e) {
    LILY_CU_TRY(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), e);
    return 0;
}

extern "C" int lily_cuda_d2d(void *dst, const void *src, size_t n, lily_cuda_stream st,
                             lily_err *e) {
    LILY_CU_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st), e);
    return 0;
}

extern "C" int lily_cuda_memset(void *dst, int v, size_t n, lily_cuda_stream st, lily_err *e) {
    LILY_CU_TRY(cudaMemsetAsync(dst, v, n, st), e);
    return 0;
}

extern "C" int lily_cuda_sync(lily_err *e) {
    LILY_CU_TRY(cudaDeviceSynchronize(), e);
    LILY_CU_TRY(cudaGetLastError(), e);
    return 0;
}

extern "C" float *lily_cuda_upload_f32(const float *src, size_t n, lily_err *e) {
    float *d = (float *)lily_cuda_alloc(n * sizeof(float), e);
    if (!d) return NULL;
    if (lily_cuda_h2d(d, src, n * sizeof(float), e)) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

static int dev_type(const lily_mat *m, lily_err *e) {
    switch (m->dt) {
    case LILY_DT_Q4:
    case LILY_DT_Q8:
        if (m->group != 64)
            return lily_fail(e, "quantization group %d is not supported (CUDA needs 64)", m->group);
        return m->dt == LILY_DT_Q4 ? LILY_CW_Q4 : LILY_CW_Q8;
    case LILY_DT_BF16:
    case LILY_DT_F16:
    case LILY_DT_F32: return LILY_CW_BF16;
    }
    return lily_fail(e, "unknown weight dtype %d", (int)m->dt);
}

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* Fills host buffer dst (row bytes * rows) with the codes of m in device layout. */
static void host_codes(const lily_mat *m, int dt, uint8_t *dst) {
    size_t n = (size_t)m->rows * m->cols;
    if (m->dt == LILY_DT_F32) {
        const float *s = (const float *)m->w;
        uint16_t *d = (uint16_t *)dst;
        for (size_t i = 0; i < n; i++)
            d[i] = lily_f32_to_bf16(s[i]);
    } else if (m->dt == LILY_DT_F16) {
        const uint16_t *s = (const uint16_t *)m->w;
        uint16_t *d = (uint16_t *)dst;
        for (size_t i = 0; i < n; i++)
            d[i] = lily_f32_to_bf16(lily_f16_to_f32(s[i]));
    } else {
        memcpy(dst, m->w, dmat_row_bytes(dt, m->cols) * m->rows);
    }
}

extern "C" int lily_cuda_dmat_upload(const lily_mat *mats, int n, lily_dmat *out, lily_err *e) {
    memset(out, 0, sizeof *out);
    if (n < 1) return lily_fail(e, "upload of %d matrices", n);
    int dt = dev_type(&mats[0], e);
    if (dt < 0) return -1;
    int rows = mats[0].rows, cols = mats[0].cols;
    if (rows < 1 || cols < 64 || cols % 64)
        return lily_fail(e, "matrix [%d, %d]: the CUDA backend needs columns a multiple of 64",
                         rows, cols);
    for (int i = 1; i < n; i++)
        if (mats[i].dt != mats[0].dt || mats[i].rows != rows || mats[i].cols != cols ||
            mats[i].group != mats[0].group)
            return lily_fail(e, "expert %d differs in type or shape from expert 0", i);
    size_t wb = dmat_row_bytes(dt, cols) * rows, ws = align256(wb);
    int q = dt != LILY_CW_BF16;
    size_t ng = (size_t)cols / 64, sbw = q ? ng * rows : 0, sbs = align256(sbw * 4) / 4;
    size_t total = ws * n + sbs * 4 * n;
    uint8_t *d = (uint8_t *)lily_cuda_alloc(total, e);
    if (!d) return -1;
    uint8_t *host = (uint8_t *)malloc(wb > sbw * 4 ? wb : sbw * 4);
    if (!host) {
        cudaFree(d);
        return lily_fail(e, "out of host memory staging a %zu-byte matrix", wb);
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const lily_mat *m = &mats[i];
        if (m->dt == LILY_DT_F32 || m->dt == LILY_DT_F16) {
            host_codes(m, dt, host);
            rc = lily_cuda_h2d(d + ws * i, host, wb, e);
        } else {
            rc = lily_cuda_h2d(d + ws * i, m->w, wb, e);
        }
        if (!rc && q) {
            uint32_t *sb = (uint32_t *)host;
            for (size_t j = 0; j < sbw; j++)
                sb[j] = (uint32_t)m->scales[j] | ((uint32_t)m->biases[j] << 16);
            rc = lily_cuda_h2d(d + ws * n + sbs * 4 * i, sb, sbw * 4, e);
        }
    }
    free(host);
    if (rc) {
        cudaFree(d);
        return -1;
    }
    out->dt = dt;
    out->rows = rows;
    out->cols = cols;
    out->n_mats = n;
    out->w = d;
    out->sb = q ? (const uint32_t *)(d + ws * n) : NULL;
    out->w_stride = ws;
    out->sb_stride = sbs;
    out->owned = d;
    return 0;
}

extern "C" int lily_cuda_dmat_upload_cat(const lily_mat *ms, int n, lily_dmat *cat,
                                         lily_dmat *views, lily_err *e) {
    memset(cat, 0, sizeof *cat);
    if (n < 1) return lily_fail(e, "row stack of %d matrices", n);
    const lily_mat *m0 = &ms[0];
    size_t R = 0;
    for (int i = 0; i < n; i++) {
        if (!ms[i].w || ms[i].dt != m0->dt || ms[i].cols != m0->cols || ms[i].group != m0->group)
            return lily_fail(e,
                             "row stack: matrix %d differs from matrix 0 (type %d / %d, "
                             "columns %d / %d)",
                             i, (int)ms[i].dt, (int)m0->dt, ms[i].cols, m0->cols);
        R += (size_t)ms[i].rows;
    }
    const bool q = m0->dt == LILY_DT_Q4 || m0->dt == LILY_DT_Q8;
    const size_t wr =
        q ? (size_t)m0->cols * (m0->dt == LILY_DT_Q4 ? 4 : 8) / 8 : (size_t)lily_mat_row_bytes(m0);
    const size_t gr = q ? (size_t)(m0->cols / m0->group) * 2 : 0; /* bf16 scales (biases) a row */
    uint8_t *w = (uint8_t *)malloc(wr * R);
    uint8_t *sc = q ? (uint8_t *)malloc(gr * R) : NULL;
    uint8_t *bi = q ? (uint8_t *)malloc(gr * R) : NULL;
    if (!w || (q && (!sc || !bi))) {
        free(w), free(sc), free(bi);
        return lily_fail(e, "out of host memory stacking [%zu, %d]", R, m0->cols);
    }
    for (size_t i = 0, r = 0; i < (size_t)n; r += (size_t)ms[i].rows, i++) {
        memcpy(w + wr * r, ms[i].w, wr * ms[i].rows);
        if (q) {
            memcpy(sc + gr * r, ms[i].scales, gr * ms[i].rows);
            memcpy(bi + gr * r, ms[i].biases, gr * ms[i].rows);
        }
    }
    lily_mat c = *m0;
    c.rows = (int)R;
    c.w = w, c.scales = (const uint16_t *)sc, c.biases = (const uint16_t *)bi;
    const int rc = lily_cuda_dmat_upload(&c, 1, cat, e);
    free(w), free(sc), free(bi);
    if (rc) return -1;
    for (size_t i = 0, r = 0; i < (size_t)n; r += (size_t)ms[i].rows, i++) {
        lily_dmat v = *cat;
        v.owned = NULL;
        v.rows = ms[i].rows;
        v.w += dmat_row_bytes(cat->dt, cat->cols) * r;
        if (v.sb) v.sb += r * (size_t)(cat->cols / 64);
        views[i] = v;
    }
    return 0;
}

extern "C" void lily_cuda_dmat_free(lily_dmat *m) {
    if (!m) return;
    lily_cuda_free(m->owned);
    memset(m, 0, sizeof *m);
}

extern "C" size_t lily_cuda_dmat_bytes(const lily_dmat *m) {
    if (!m->owned) return 0;
    return (m->w_stride + m->sb_stride * 4) * (size_t)m->n_mats;
}

namespace {
thread_local lily_cuda_prec t_prec = {1, 1};
} // namespace

extern "C" void lily_cuda_prec_set(lily_cuda_prec p) {
    t_prec = p;
}

extern "C" lily_cuda_prec lily_cuda_prec_get(void) {
    return t_prec;
}
