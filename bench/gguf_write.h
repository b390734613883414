/* A streaming GGUF (version 3) writer and the ggml block quantizers it needs (Q4_0, Q8_0), for
 * bench/gguf_q4.c (lily checkpoints as llama.cpp models, the yardstick of issue 36).
 *
 * GGUF, as llama.cpp's gguf.cpp reads it (all little-endian):
 *   "GGUF" | u32 version 3 | u64 n_tensors | u64 n_kv
 *   n_kv x (string key | u32 type | value)          string = u64 length | bytes (no NUL)
 *   n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset)
 *   zero padding to general.alignment (32), then the tensor data, each tensor at its offset
 *   (relative to the start of the data, a multiple of the alignment).
 * ne[0] is the fastest dimension: a PyTorch [rows, cols] matrix is ne = {cols, rows}.
 *
 * Use: gguf_w_open; the gguf_w_kv_* calls; gguf_w_tensor for every tensor (name, shape, type);
 * gguf_w_begin_data (writes the header and the tensor table); then the tensors' bytes in the
 * same order with gguf_w_data, each exactly gguf_type_size(type, ne) bytes; gguf_w_close checks
 * that every declared byte was written. Only the header is held in memory. */
#ifndef LILY_BENCH_GGUF_WRITE_H
#define LILY_BENCH_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define GGUF_ALIGN 32

/* ggml tensor types (ggml.h numbering). */
enum { GGML_T_F32 = 0, GGML_T_F16 = 1, GGML_T_Q4_0 = 2, GGML_T_Q8_0 = 8 };

/* GGUF metadata value types. */
enum {
    GGUF_V_U8 = 0,
    GGUF_V_I8 = 1,
    GGUF_V_U16 = 2,
    GGUF_V_I16 = 3,
    GGUF_V_U32 = 4,
    GGUF_V_I32 = 5,
    GGUF_V_F32 = 6,
    GGUF_V_BOOL = 7,
    GGUF_V_STR = 8,
    GGUF_V_ARR = 9,
    GGUF_V_U64 = 10,
    GGUF_V_I64 = 11,
    GGUF_V_F64 = 12
};

#define QK4_0 32 /* values per Q4_0 block: f16 scale + 16 bytes of 4-bit codes = 18 bytes */
#define QK8_0 32 /* values per Q8_0 block: f16 scale + 32 int8 codes = 34 bytes */

/* Bytes of one row of n values stored as type (n a multiple of the block size). */
uint64_t gguf_row_size(int type, int64_t n);

/* fp32 -> IEEE fp16, round to nearest even (overflow to inf, subnormals kept). */
uint16_t gguf_f32_to_f16(float f);
float gguf_f16_to_f32(uint16_t h);

/* x[n] (n a multiple of 32) as Q4_0 / Q8_0 blocks into out (gguf_row_size bytes): per block of
 * 32, Q4_0 takes the value of largest magnitude m, scale d = m / -8, codes
 * min(15, trunc(x/d + 8.5)) (low nibbles: values 0-15, high nibbles: 16-31), value = (q-8)*d;
 * Q8_0 takes d = max|x| / 127, codes round(x/d), value = q*d. */
void gguf_quant_q4_0(const float *x, int64_t n, uint8_t *out);
void gguf_quant_q8_0(const float *x, int64_t n, uint8_t *out);
/* The inverse, for checks. */
void gguf_dequant_q4_0(const uint8_t *in, int64_t n, float *x);
void gguf_dequant_q8_0(const uint8_t *in, int64_t n, float *x);
/* A row of n fp32 values into out as type (F32, F16, Q4_0 or Q8_0). */
void gguf_quant_row(int type, const float *x, int64_t n, uint8_t *out);

typedef struct gguf_w gguf_w;

/* Creates path. Returns NULL with a message in err (len bytes) on failure. */
gguf_w *gguf_w_open(const char *path, char *err, size_t len);

void gguf_w_kv_u32(gguf_w *w, const char *key, uint32_t v);
void gguf_w_kv_i32(gguf_w *w, const char *key, int32_t v);
void gguf_w_kv_f32(gguf_w *w, const char *key, float v);
void gguf_w_kv_bool(gguf_w *w, const char *key, int v);
void gguf_w_kv_str(gguf_w *w, const char *key, const char *v);
void gguf_w_kv_arr_i32(gguf_w *w, const char *key, const int32_t *v, uint64_t n);
/* An array of n strings; s[i] has len[i] bytes (may hold any bytes but NUL is allowed too). */
void gguf_w_kv_arr_str(gguf_w *w, const char *key, const char *const *s, const size_t *len,
                       uint64_t n);

/* Declares the next tensor: n_dims <= 4, ne[0] fastest. */
void gguf_w_tensor(gguf_w *w, const char *name, int n_dims, const int64_t *ne, int type);
/* Writes the header and the tensor table; returns 0 or -1 (err filled). */
int gguf_w_begin_data(gguf_w *w, char *err, size_t len);
/* Appends n bytes of the current tensor's data. */
int gguf_w_data(gguf_w *w, const void *p, size_t n);
/* Finishes; returns 0 when every tensor got exactly its bytes and the file closed cleanly. */
int gguf_w_close(gguf_w *w, char *err, size_t len);
/* Total bytes of tensor data declared (for progress). */
uint64_t gguf_w_data_bytes(const gguf_w *w);

/* A minimal reader of what the writer produces, for the self-test and --dump: walks the header,
 * checks every offset and size against the file, and prints the metadata and tensors to f when
 * f is not NULL. Returns 0 when the file is consistent. n_tensors/n_kv may be NULL. */
int gguf_check(const char *path, FILE *f, uint64_t *n_tensors, uint64_t *n_kv, char *err,
               size_t len);

#endif
