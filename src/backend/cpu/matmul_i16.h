/* The Q4 prefill GEMM on AVX-512 VNNI with 16-bit activations (matmul.c picks it).
 *
 * X is quantised once per call: per token and group of 64 columns a scale max|x| / 32639 and
 * codes c (round to nearest; |c| <= 32639, so c = 256 h + l with h, l signed bytes), so an
 * element is off by at most 2^-16 of its group's largest (llama.cpp's Q8 activations keep 8 bits
 * per 32). The nibbles q of a 16-row weight tile are transposed per call (permutes) into bytes
 * with rows across the vector lanes, and vpdpbusd multiplies them (unsigned) with the broadcast
 * h and l digits (signed), 4 columns per lane, into int32 (a group sums to at most 64 x 15 x 128
 * per digit: exact). Per group sum q c = 256 sum q h + sum q l, minus 8 sum c (computed with X),
 * gives sum (q - 8) c exactly (weights centred: the rounding errors partly cancel); that times
 * the weight scale and the x scale, plus (bias + 8 scale) times the group's exact fp32 sum of x,
 * is the group's term. */
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
 * Y[t][r] for t < n, r < R (Y points at the tile's first row); tile: lily_cpu_i16_tile_bytes of
 * 64-byte aligned scratch.
 * ahead > 0: the weights of the tile ahead tiles further are prefetched into L2 (the pool hands
 * tiles out in order, one per thread: ahead = the thread count). */
void lily_cpu_i16_rows(const lily_mat *W, int r0, int R, const void *xq, int n, float *Y, int ldy,
                       void *tile, int ahead);

#endif
