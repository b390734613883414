/* The Q4 decode product (1 to 8 tokens) with 16-bit activations on AVX-512 VNNI, or AVX2 (below)
 * (matmul.c picks it unless the engine runs LILY_PRECISION_EXACT, which keeps the fp32 kernels).
 *
 * Decode reads every weight once per token, so the kernel has to keep up with memory: the fp32
 * kernel spends ~27 vector instructions on each 64 bytes of a row (nibble to float, FMA); this
 * one spends ~12. X is quantised per token and group of 64 exactly as the prefill GEMM does
 * (matmul_i16.h: codes |c| <= 32639, c = 256 h + l, signed bytes), but laid out to match the
 * weights as they are stored, so no weight is moved: a 64-byte load of a row holds columns
 * 128 b .. 128 b + 127, dword lane i the columns 8 i .. 8 i + 7, its low nibbles the even ones.
 * The h and l digits of those columns sit in the same byte positions of four 64-byte vectors,
 * and four vpdpbusd (nibbles unsigned, digits signed) give per lane
 * 256 sum q h + sum q l = sum q c over 8 columns, exact in int32 (|.| < 2^22). That times the
 * lane's group scale (weight scale x x scale), plus the group bias times the group's exact fp32
 * sum of x, is the row's product; the weights are centred as in the prefill GEMM, so the
 * rounding of x meets s (q - 8) (gemv_i16.c says how). */
#ifndef LILY_BACKEND_CPU_GEMV_I16_H
#define LILY_BACKEND_CPU_GEMV_I16_H

#include <stddef.h>

#include "model/model.h"

#define LILY_GEMV_I16_MAX_COLS 16384 /* the kernel keeps a row's group scales on the stack */
#define LILY_GEMV_I16_MAX_N    8

/* Bytes of the quantised X of n tokens of cols columns (cols % 64 == 0). */
size_t lily_cpu_gemv_i16_x_bytes(int n, int cols);
/* Quantises X [n][ldx] into xq (lily_cpu_gemv_i16_x_bytes; 64-byte aligned). */
void lily_cpu_gemv_i16_quant(const float *X, int n, int ldx, int cols, void *xq);
/* Rows [r0, r1) of the Q4 group-64 matrix W times the n <= 8 tokens of xq: Y[t * ldy + r]; each
 * token's result is the same for every n (gemv_rows.h relies on it). */
void lily_cpu_gemv_i16_rows(const lily_mat *W, int r0, int r1, const void *xq, int n, float *Y,
                            int ldy);

/* The same two on AVX2 + FMA (gemv_i16_avx2.c): the same xq byte for byte, the same Y bit for
 * bit (a token's result the same for every n); either quantiser feeds either product. */
void lily_cpu_gemv_i16_quant_avx2(const float *X, int n, int ldx, int cols, void *xq);
void lily_cpu_gemv_i16_rows_avx2(const lily_mat *W, int r0, int r1, const void *xq, int n, float *Y,
                                 int ldy);

#endif
