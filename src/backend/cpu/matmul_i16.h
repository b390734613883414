/* The Q4 prefill GEMM on AVX-512 VNNI with 16-bit activations (matmul.c picks it).
 *
 * X is quantised once per call: per token and group of 64 columns a scale max|x| / 32767 and
 * int16 codes (round to nearest), so an element is off by at most 2^-16 of its group's largest
 * (relative 1.5e-5; llama.cpp's Q8 activations keep 8 bits per 32). The weights' nibbles q of a
 * 16-row tile are repacked per call into int16 pairs (q - 8, centred so the products' rounding
 * errors partly cancel) with rows across the vector lanes, and vpdpwssd accumulates 2 products
 * per lane per instruction in int32 (a group of 64 columns sums to at most 64 x 8 x 32767, exact).
 * Per group the int32 sums become fp32 with the weight scale times the x scale, and the affine
 * term (bias + 8 scale) times the group's exact fp32 sum of x. */
#ifndef LILY_BACKEND_CPU_MATMUL_I16_H
#define LILY_BACKEND_CPU_MATMUL_I16_H

#include <stddef.h>

#include "model/model.h"

#define LILY_I16_ROWS 16 /* rows of W per tile (the vector lanes) */

/* 1 when the CPU has AVX-512 VNNI (and the kernels were built for it). */
int lily_cpu_i16_available(void);

/* Bytes of the quantised X of n tokens and cols columns (cols % 64 == 0). */
size_t lily_cpu_i16_x_bytes(int n, int cols);
/* Quantises X [n][ldx] into xq (lily_cpu_i16_x_bytes, 64-byte aligned). */
void lily_cpu_i16_quant(const float *X, int n, int ldx, int cols, void *xq);

/* Bytes of one repacked tile of W (cols % 64 == 0). */
size_t lily_cpu_i16_tile_bytes(int cols);
/* Rows [r0, r0 + R) (R <= LILY_I16_ROWS) of the Q4 group-64 matrix W times all n tokens of xq:
 * Y[t][r0 + r] for t < n, r < R; tile: lily_cpu_i16_tile_bytes of 64-byte aligned scratch.
 * ahead > 0: the weights of the tile ahead tiles further are prefetched into L2 (the pool hands
 * tiles out in order, one per thread: ahead = the thread count). */
void lily_cpu_i16_rows(const lily_mat *W, int r0, int R, const void *xq, int n, float *Y,
                       int ldy, void *tile, int ahead);

#endif
