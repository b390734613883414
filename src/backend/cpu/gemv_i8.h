/* The Q4 decode product (1 to 8 tokens) with 8-bit activations, as llama.cpp multiplies Q4 by
 * Q8 (matmul.c picks it at LILY_PRECISION_FAST; BENCHMARKS.md gives its quality on the trained
 * model). Bodies for AVX-512 VNNI (vpdpbusd) and AVX2 (vpmaddubsw + vpmaddwd): the same x bytes
 * and the same results, bit for bit.
 *
 * X is quantised per token and group of 64 columns: scale sx = max|x| / 127, codes c = round(x /
 * sx) in [-127, 127] (each element off by at most half a step, max|x| / 254), laid out as the
 * weights are stored (gemv_i16.h): per block of 128 columns 64 bytes of the even columns' codes
 * and 64 of the odd ones', column 2 m (or 2 m + 1) at byte m, so a 64-byte load of a row (lane i:
 * columns 8 i .. 8 i + 7, low nibbles the even ones) meets its codes in the same byte positions
 * and two vpdpbusd give per lane sum q c over 8 columns, exact in int32. That times the group's
 * scale (weight scale x x scale), plus the bias times the group's exact fp32 sum of x, plus the
 * centring term 8 s (sum x - sx sum c) (as gemv_i16.c: the rounding of x meets s (q - 8)), is the
 * row's product. Per lane this is half the integer work of the int16 product. */
#ifndef LILY_BACKEND_CPU_GEMV_I8_H
#define LILY_BACKEND_CPU_GEMV_I8_H

#include <stddef.h>

#include "model/model.h"

#define LILY_GEMV_I8_MAX_COLS 16384 /* the kernel keeps a row's group scales on the stack */
#define LILY_GEMV_I8_MAX_N    8     /* as many as gemv_i16.h may take */
#define LILY_GEMV_I8_CODE_MAX 127

/* 1 when the CPU has AVX-512 VNNI (the VNNI bodies may run). */
int lily_cpu_gemv_i8_vnni_available(void);

/* Bytes of the quantised X of n tokens of cols columns (cols % 64 == 0). */
size_t lily_cpu_gemv_i8_x_bytes(int n, int cols);
/* Quantises X [n][ldx] into xq (lily_cpu_gemv_i8_x_bytes; 64-byte aligned): vnni 1 = the AVX-512
 * body, 0 = the AVX2 one (the same bytes). */
void lily_cpu_gemv_i8_quant(int vnni, const float *X, int n, int ldx, int cols, void *xq);
/* Rows [r0, r1) of the Q4 group-64 matrix W times the n <= LILY_GEMV_I8_MAX_N tokens of xq:
 * Y[t * ldy + r]; each token's result is the same for every n. */
void lily_cpu_gemv_i8_rows(int vnni, const lily_mat *W, int r0, int r1, const void *xq, int n,
                           float *Y, int ldy);

#endif
