/* The decode product of 1 to 8 rows: y_t = W x_t for n tokens of different sessions (or one
 * token, n = 1: the CPU backend's decode step runs every product through it).
 *
 * Each row's result is bit for bit what lily_cpu_matmul gives for that token alone, whatever n
 * and the other rows are: a row of several sessions' step equals that session's own step. The
 * weights are read from memory once for all n rows:
 *  - Q4 with int16 or int8 activations (gemv_i16.h, gemv_i8.h; AVX-512 VNNI or AVX2): one kernel
 *    for 1..8 tokens, each block of W split into nibbles once and applied to every token with
 *    the 1-token arithmetic;
 *  - the fp32 Q4 and Q8 kernels: W is walked in blocks of rows small enough to stay in L1, and
 *    each block is applied to every token with the 1-token kernel (lily_cpu_gemv1_rows);
 *  - other formats (bf16, f16, f32, other groups): the tiled product, whose rows do not depend on
 *    the number of tokens, over all n at once.
 * Several products run as one pool job (the experts of a step): their rows are balanced over the
 * threads and the pool synchronises once. */
#ifndef LILY_BACKEND_CPU_GEMV_ROWS_H
#define LILY_BACKEND_CPU_GEMV_ROWS_H

#include "backend/cpu/ops.h"

#define LILY_ROWS_MAX 8

typedef struct lily_rows_op {
    const lily_mat *W;
    const float *X; /* token t's x: X + t * ldx, or X + xrow[t] * ldx when xrow is set */
    int ldx;
    const int *xrow; /* NULL or [n] */
    int n;           /* 1..LILY_ROWS_MAX */
    float *Y;        /* token t's y: Y + t * ldy, [W->rows] */
    int ldy;
} lily_rows_op;

/* Runs n_ops independent products. Uses the pool's scratch slot lily_pool_threads(pool). */
void lily_cpu_matmul_rows(const lily_cpu_kern *k, const lily_rows_op *ops, int n_ops,
                          lily_pool *pool);

#endif
