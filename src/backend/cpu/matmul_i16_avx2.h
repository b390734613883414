/* The Q4 prefill GEMM of matmul_i16.h on AVX2 + FMA, with vpmaddwd (matmul.c picks it where the
 * CPU has AVX2 but not AVX-512 VNNI, or with --cpu-isa avx2).
 *
 * X is quantised exactly as matmul_i16.c does (per token and group of 64 columns: scale
 * max|x| / 32639, codes c rounded to nearest), but kept as int16 codes in column order. A 16-row
 * tile of W is repacked per call into centred int16 pairs: per pair of columns (2 j, 2 j + 1),
 * row r's dword holds q - 8 of both, rows across the lanes of two vectors. vpmaddwd of such a
 * vector with the broadcast code pair of a token adds the two products into int32, so a group's
 * sum (q - 8) c (at most 64 x 8 x 32639 < 2^24: exact, in int32 and as fp32) is the AVX-512
 * kernel's integer; the group's term, (sum (q - 8) c) x scale x x scale plus (bias + 8 scale) x
 * the exact fp32 sum of x, is accumulated per lane in the same order there, so Y is the AVX-512
 * kernel's bit for bit. */
#ifndef LILY_BACKEND_CPU_MATMUL_I16_AVX2_H
#define LILY_BACKEND_CPU_MATMUL_I16_AVX2_H

#include <stddef.h>

#include "model/model.h"

/* Bytes of the quantised X of n tokens and cols columns (cols % 64 == 0). */
size_t lily_cpu_i16_avx2_x_bytes(int n, int cols);
/* Quantises X [n][ldx] into xq (lily_cpu_i16_avx2_x_bytes, 32-byte aligned). */
void lily_cpu_i16_avx2_quant(const float *X, int n, int ldx, int cols, void *xq);

/* Bytes of one repacked tile of W (cols % 64 == 0). */
size_t lily_cpu_i16_avx2_tile_bytes(int cols);
/* As lily_cpu_i16_rows (matmul_i16.h): rows [r0, r0 + R) (R <= 16) of the Q4 group-64 matrix W
 * times the n tokens of xq into Y [t][r]; tile: lily_cpu_i16_avx2_tile_bytes of 32-byte aligned
 * scratch; ahead > 0 prefetches the tile ahead tiles further. */
void lily_cpu_i16_avx2_rows(const lily_mat *W, int r0, int R, const void *xq, int n, float *Y,
                            int ldy, void *tile, int ahead);

#endif
