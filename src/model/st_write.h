/* Safetensors writer: the header for tensors laid out back to back, and whole-file writes.
 *
 * Large files are written by the caller in a stream after the header (mkmodel generates tensor
 * data in parallel chunks); lily_st_header gives the bytes that precede the data and each
 * tensor's data offset. */
#ifndef LILY_MODEL_ST_WRITE_H
#define LILY_MODEL_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "model/safetensors.h"

typedef struct lily_st_entry {
    const char *name;
    lily_st_dtype dtype;
    int ndim;
    int64_t shape[LILY_ST_MAX_DIMS];
} lily_st_entry;

/* Data bytes of one entry (shape product times dtype size). */
uint64_t lily_st_entry_bytes(const lily_st_entry *t);

/* The file prefix for n tensors stored back to back in order: the 8-byte little-endian length
 * and the JSON header (with "__metadata__": {"format": "pt"}), padded with spaces to a multiple
 * of 8 so the data starts aligned. Caller frees the result with free(); *len gets its size. */
unsigned char *lily_st_header(const lily_st_entry *t, int n, size_t *len);

/* Writes path with tensors t[i] holding data[i] (lily_st_entry_bytes each). */
int lily_st_write_file(const char *path, const lily_st_entry *t, const void *const *data, int n,
                       lily_err *err);

#endif
