/* The decode product of 1 to 8 rows (gemv_rows.h). */
#include "backend/cpu/gemv_rows.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemv_i16.h"
#include "base/err.h"

/* Bytes of W's rows in L1 while every token passes over them (the fp32 kernels). */
#define ROWS_BLOCK_BYTES (16 << 10)

typedef struct {
    const lily_cpu_kern *k;
    const lily_rows_op *ops;
    const char *buf; /* prepared x: op i's tokens at xoff[i], xb[i] bytes apart */
    const size_t *xoff, *xb;
    const int *t_op, *t_r0, *t_r1; /* task table */
} rows_job;

static size_t row_bytes(const lily_mat *W) {
    return (size_t)W->cols * (W->dt == LILY_DT_Q8 ? 1 : 2) / 2 + (size_t)W->cols / 16;
}

static void rows_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_job *j = ctx;
    const lily_rows_op *op = &j->ops[j->t_op[task]];
    const lily_mat *W = op->W;
    const int r0 = j->t_r0[task], r1 = j->t_r1[task], n = op->n;
    const char *xp = j->buf + j->xoff[j->t_op[task]];
    const size_t xb = j->xb[j->t_op[task]];
    const int form = lily_cpu_gemv1_form(j->k, W);
    if (form == 2 || form == 3) { /* the int16 and int8 products: every token in one pass */
        lily_cpu_gemv1_rows_n(j->k, W, r0, r1, xp, n, op->Y, op->ldy);
        return;
    }
    if (n == 1) {
        lily_cpu_gemv1_rows(j->k, W, r0, r1, xp, op->Y);
        return;
    }
    int rb = (int)(ROWS_BLOCK_BYTES / row_bytes(W));
    rb = rb < 2 ? 2 : rb & ~1;
    for (int b0 = r0; b0 < r1; b0 += rb) {
        const int b1 = b0 + rb < r1 ? b0 + rb : r1;
        for (int t = 0; t < n; t++)
            lily_cpu_gemv1_rows(j->k, W, b0, b1, xp + (size_t)t * xb, op->Y + (size_t)t * op->ldy);
    }
}

static const float *x_of(const lily_rows_op *op, int t) {
    return op->X + (size_t)(op->xrow ? op->xrow[t] : t) * op->ldx;
}

/* A product on the tiled path: rows gathered when they are not evenly spaced. */
static void tiled(const lily_cpu_kern *k, const lily_rows_op *op, lily_pool *pool) {
    const lily_mat *W = op->W;
    if (!op->xrow) {
        lily_cpu_matmul(k, W, op->X, op->n, op->ldx, op->Y, op->ldy, pool);
        return;
    }
    /* the tiled path uses the threads' own scratch slots, not the caller's */
    size_t bytes = (size_t)op->n * W->cols * sizeof(float);
    float *g = pool ? lily_pool_scratch(pool, lily_pool_threads(pool), bytes) : lily_xmalloc(bytes);
    for (int t = 0; t < op->n; t++)
        memcpy(g + (size_t)t * W->cols, x_of(op, t), (size_t)W->cols * sizeof(float));
    lily_cpu_matmul(k, W, g, op->n, W->cols, op->Y, op->ldy, pool);
    if (!pool) free(g);
}

void lily_cpu_matmul_rows(const lily_cpu_kern *k, const lily_rows_op *ops, int n_ops,
                          lily_pool *pool) {
    int n_fused = 0;
    size_t btot = 0, xtot = 0;
    for (int i = 0; i < n_ops; i++) {
        LILY_ASSERT(ops[i].n >= 1 && ops[i].n <= LILY_ROWS_MAX);
        if (lily_cpu_gemv1_form(k, ops[i].W) < 0) {
            tiled(k, &ops[i], pool);
            continue;
        }
        n_fused++;
        btot += (size_t)ops[i].W->rows * row_bytes(ops[i].W);
        xtot += (size_t)ops[i].n * lily_cpu_gemv1_x_bytes(k, ops[i].W);
    }
    if (!n_fused) return;
    const int threads = pool ? lily_pool_threads(pool) : 1;
    const size_t chunk = btot / ((size_t)threads * 4) + 1;
    const int max_tasks = threads * 4 + n_ops * 2;
    const size_t tbl =
        (2 * (size_t)n_ops * sizeof(size_t) + 3 * (size_t)max_tasks * sizeof(int) + 63) &
        ~(size_t)63;
    char *buf = pool ? lily_pool_scratch(pool, threads, tbl + xtot) : lily_xaligned(tbl + xtot);
    size_t *xoff = (size_t *)buf, *xb = xoff + n_ops;
    int *t_op = (int *)(xb + n_ops), *t_r0 = t_op + max_tasks, *t_r1 = t_r0 + max_tasks;
    size_t xo = tbl;
    int nt = 0;
    for (int i = 0; i < n_ops; i++) {
        const lily_rows_op *op = &ops[i];
        const lily_mat *W = op->W;
        const int form = lily_cpu_gemv1_form(k, W);
        if (form < 0) continue;
        xb[i] = lily_cpu_gemv1_x_bytes(k, W);
        /* products of the same x in the same form (an expert's gate and up) share it */
        int same = -1;
        for (int q = 0; q < i && same < 0; q++)
            if (ops[q].X == op->X && ops[q].xrow == op->xrow && ops[q].n == op->n &&
                ops[q].ldx == op->ldx && ops[q].W->cols == W->cols && ops[q].W->dt == W->dt &&
                lily_cpu_gemv1_form(k, ops[q].W) == form)
                same = q;
        if (same >= 0) {
            xoff[i] = xoff[same];
        } else {
            xoff[i] = xo;
            for (int t = 0; t < op->n; t++)
                lily_cpu_gemv1_prep(k, W, x_of(op, t), buf + xo + (size_t)t * xb[i]);
            xo += (size_t)op->n * xb[i];
        }
        /* parts of about `chunk` bytes, rows rounded to pairs */
        size_t bytes = (size_t)W->rows * row_bytes(W);
        int parts = (int)((bytes + chunk - 1) / chunk);
        if (parts < 1) parts = 1;
        int per = (W->rows + parts - 1) / parts;
        per = (per + 1) & ~1;
        for (int r = 0; r < W->rows; r += per) {
            LILY_ASSERT(nt < max_tasks);
            t_op[nt] = i;
            t_r0[nt] = r;
            t_r1[nt] = r + per < W->rows ? r + per : W->rows;
            nt++;
        }
    }
    rows_job j = {k, ops, buf, xoff, xb, t_op, t_r0, t_r1};
    if (pool) {
        lily_pool_run(pool, rows_task, &j, nt);
    } else {
        for (int t = 0; t < nt; t++)
            rows_task(&j, t, 0);
        free(buf);
    }
}
