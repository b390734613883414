/* Safetensors reader: one file parsed over a read-only mapping, and a set of shard files with a
 * name lookup across all of them.
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header mapping tensor names
 * to {dtype, shape, data_offsets}, then the raw data. Parsing validates everything the rest of the
 * loader relies on (header within the file, offsets within the data section, byte size equal to
 * the shape times the dtype size, unique names), so a bound tensor can be read without further
 * checks. Tensor data is never copied: lily_st_tensor.data points into the mapping. */
#ifndef LILY_MODEL_SAFETENSORS_H
#define LILY_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "lily.h"

#define LILY_ST_MAX_DIMS 8
/* Headers larger than this are rejected (the 35B per-expert HF header is ~3 MB). */
#define LILY_ST_MAX_HEADER (256u << 20)

typedef enum lily_st_dtype {
    LILY_ST_BOOL = 0,
    LILY_ST_U8,
    LILY_ST_I8,
    LILY_ST_F8_E4M3,
    LILY_ST_F8_E5M2,
    LILY_ST_U16,
    LILY_ST_I16,
    LILY_ST_F16,
    LILY_ST_BF16,
    LILY_ST_U32,
    LILY_ST_I32,
    LILY_ST_F32,
    LILY_ST_U64,
    LILY_ST_I64,
    LILY_ST_F64,
    LILY_ST_N_DTYPES
} lily_st_dtype;

typedef struct lily_st_tensor {
    char *name;
    lily_st_dtype dtype;
    int ndim;
    int64_t shape[LILY_ST_MAX_DIMS];
    const unsigned char *data; /* into the mapping (or the caller's buffer) */
    uint64_t nbytes;
    uint64_t offset; /* of the data from the start of the file */
    int file;        /* index of the owning file in a lily_st_set */
} lily_st_tensor;

typedef struct lily_st_file {
    char *path;    /* for messages */
    lily_mmap map; /* empty when parsed from a caller buffer */
    lily_st_tensor *tensors;
    int n_tensors;
    uint64_t header_len;
} lily_st_file;

/* The safetensors name of dt ("BF16", ...), and its element size in bytes. */
const char *lily_st_dtype_name(lily_st_dtype dt);
size_t lily_st_dtype_size(lily_st_dtype dt);
/* Parses a dtype name; returns 0 or -1 when unknown. */
int lily_st_dtype_parse(const char *s, lily_st_dtype *out);

/* Parses size bytes at buf (borrowed: must outlive f) as a safetensors file. name is used in
 * messages. On failure f is left empty and the message names the file and the tensor. */
int lily_st_parse(const unsigned char *buf, size_t size, const char *name, lily_st_file *f,
                  lily_err *err);
/* Maps path and parses it. */
int lily_st_open(const char *path, lily_st_file *f, lily_err *err);
/* Releases what parse/open created (accepts a zeroed or already closed f). */
void lily_st_close(lily_st_file *f);

/* Element count of t (the product of its shape; fits: checked against the byte size). */
uint64_t lily_st_numel(const lily_st_tensor *t);
/* Writes t's shape as "[a, b, c]" into buf. */
const char *lily_st_shape_str(const lily_st_tensor *t, char *buf, size_t len);

/* All the safetensors files of a model directory, with one name table over them. */
typedef struct lily_st_set lily_st_set;

/* Opens dir: model.safetensors.index.json (weight_map) if present, else model.safetensors, else
 * every *.safetensors file in dir (sorted by name). Names must be unique across the set, and
 * every name in weight_map must be in the file it names. */
int lily_st_set_open(const char *dir, lily_st_set **out, lily_err *err);
void lily_st_set_free(lily_st_set *s);
/* The tensor called name, or NULL. */
const lily_st_tensor *lily_st_find(const lily_st_set *s, const char *name);
/* Iteration over every tensor of the set, file by file. */
int lily_st_count(const lily_st_set *s);
const lily_st_tensor *lily_st_at(const lily_st_set *s, int i);
int lily_st_n_files(const lily_st_set *s);
const lily_st_file *lily_st_file_at(const lily_st_set *s, int i);
/* The path of the file holding t. */
const char *lily_st_path_of(const lily_st_set *s, const lily_st_tensor *t);

/* bf16 / f16 to f32 (exact), for loaders of small vectors. */
static inline float lily_st_bf16_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}
float lily_st_f16_f32(uint16_t h);
/* f32 to bf16, round to nearest even (NaN kept quiet). */
uint16_t lily_st_f32_bf16(float f);

#endif
