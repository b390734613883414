/* config.json parsing: hyperparameters (lily_config) and the MLX quantization table.
 *
 * Fields are read from text_config when present, else from the top level (flat configs), per
 * model.md section 1. Every value is validated (positive, divisible, within limits) and a failure
 * names config.json and the field. */
#ifndef LILY_MODEL_CONFIG_H
#define LILY_MODEL_CONFIG_H

#include <stddef.h>

#include "lily.h"
#include "model/model.h"

/* One per-module override of the MLX quantization table. bits == 0: not quantized. */
typedef struct lily_qoverride {
    char *path; /* module path, e.g. "language_model.model.layers.0.mlp.gate" */
    int bits, group;
} lily_qoverride;

/* The "quantization" (or "quantization_config") block of an MLX checkpoint. */
typedef struct lily_qconfig {
    int present;     /* a block was found */
    int bits, group; /* defaults for modules that have .scales */
    lily_qoverride *over;
    int n_over;
} lily_qconfig;

/* Parses config.json text (len bytes; need not be NUL-terminated). name is used in messages.
 * q may be NULL. On success the caller frees q with lily_qconfig_free. */
int lily_config_parse(const char *text, size_t len, const char *name, lily_config *cfg,
                      lily_qconfig *q, lily_err *err);
/* Reads dir/config.json and, when present, merges the eos ids of dir/generation_config.json. */
int lily_config_load(const char *dir, lily_config *cfg, lily_qconfig *q, lily_err *err);
void lily_qconfig_free(lily_qconfig *q);

/* Quantization of the module at path (the tensor name without ".weight"): returns 1 and sets
 * bits/group when the table has an entry for it (bits 0 = unquantized), else 0. */
int lily_qconfig_lookup(const lily_qconfig *q, const char *path, int *bits, int *group);

/* Number of full-attention layers in cfg. */
int lily_config_n_attn(const lily_config *cfg);

#endif
