/* The tensor list of a synthetic checkpoint and the generator of each tensor's bytes.
 *
 * A plan is the ordered list of tensors mkmodel writes, each with the recipe for its values: a
 * kind (normal, quantized codes, scales, biases, decay parameters), its statistics and a stream
 * key derived from the seed and the tensor's logical name. lily_mk_gen produces any element range
 * of any tensor independently, which is what makes parallel chunked writing deterministic. */
#ifndef LILY_MODEL_MKMODEL_PLAN_H
#define LILY_MODEL_MKMODEL_PLAN_H

#include <stdint.h>

#include "model/mkmodel.h"
#include "model/safetensors.h"

typedef enum mk_kind {
    MK_NORMAL = 0, /* mean + std * N(0,1) */
    MK_ALOG,       /* log(U(1, 16)) */
    MK_DTBIAS,     /* inverse softplus of dt = exp(U(log 1e-3, log 1e-1)) (the Mamba init) */
    MK_CODES,      /* random uint32 words of packed codes */
    MK_SCALES,     /* bf16 per-group scale giving dequantized std `std` */
    MK_BIASES,     /* bf16 per-group bias giving dequantized mean 0 (same key as the scales) */
} mk_kind;

typedef struct lily_mk_tensor {
    char name[192];
    lily_st_dtype dtype;
    int ndim;
    int64_t shape[LILY_ST_MAX_DIMS];
    mk_kind kind;
    float mean, std;
    int bits;         /* MK_SCALES / MK_BIASES */
    float scale_base; /* MK_SCALES / MK_BIASES: std / (std of a uniform b-bit code) */
    uint64_t key;     /* value stream */
    /* Expert stacks in HF layout share values with per-expert keys: element i belongs to expert
     * i / per_expert and is drawn from stream derive(key, expert); with split_rows > 0 the rows at
     * or past split_rows (of row length cols) come from derive(key2, expert) instead. */
    int64_t per_expert, split_rows, cols;
    uint64_t key2;
    uint64_t nbytes;
} lily_mk_tensor;

typedef struct lily_mk_plan {
    lily_mk_tensor *t;
    int n, cap;
} lily_mk_plan;

/* Builds the tensor list for o (already checked). */
void lily_mk_plan_build(const lily_mk_opts *o, lily_mk_plan *p);
void lily_mk_plan_free(lily_mk_plan *p);

/* Writes elements [e0, e1) of t into dst (packed in t's dtype). */
void lily_mk_gen(const lily_mk_tensor *t, uint64_t e0, uint64_t e1, void *dst);

#endif
