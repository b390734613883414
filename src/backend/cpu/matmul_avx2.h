/* fp32 kernels on AVX2 + FMA that matmul.c's AVX-512 path has and its AVX2 path lacked: the
 * one-token 8-bit product (the MLX routers and shared-expert gates) and the Q4 tile dequant of
 * the fp32 prefill GEMM (--precision exact). */
#ifndef LILY_BACKEND_CPU_MATMUL_AVX2_H
#define LILY_BACKEND_CPU_MATMUL_AVX2_H

#include "model/model.h"

/* Rows [r0, r1) of an 8-bit affine group-64 matrix times one token x (as is): Y[r]; xs: the
 * per-group sums of x (the bias term). */
void lily_cpu_q8_rows1_avx2(const lily_mat *W, int r0, int r1, const float *x, const float *xs,
                            float *Y);
/* Rows [r0, r0 + R) of a Q4 group-64 matrix as fp32 into Wt [R][cols] (lily_mat_row_f32's
 * values: s q + b, rounded once by an FMA). */
void lily_cpu_dequant_q4_avx2(const lily_mat *W, int r0, int R, float *Wt);

#endif
