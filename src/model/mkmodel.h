/* Synthetic checkpoints: random-weight qwen3_5_moe (or dense qwen3_5) models in the HF bf16 or
 * the MLX affine-quantized layout, for tests and benchmarks without downloading real weights.
 *
 * Weights are a pure function of (seed, logical tensor name, element index) through a
 * counter-based generator, so output is identical whatever the thread count or chunking, and the
 * same logical weight has the same value in per-expert and fused HF expert layouts. Data is
 * generated in parallel chunks and written with pwrite straight into the shard files, so memory
 * stays at a few MB per thread whatever the model size. Scales keep activations O(1) through every
 * layer: input projections have std 1/sqrt(fan_in), residual-writing ones a further 1/sqrt(2L). */
#ifndef LILY_MODEL_MKMODEL_H
#define LILY_MODEL_MKMODEL_H

#include <stdint.h>

#include "lily.h"
#include "model/model.h"

typedef enum lily_mk_layout {
    LILY_MK_HF = 0,  /* bf16, model.language_model.* + lm_head.weight */
    LILY_MK_MLX = 1, /* affine-quantized, language_model.model.* with switch_mlp stacks */
} lily_mk_layout;

typedef struct lily_mk_opts {
    lily_config cfg;   /* shapes; model_type "qwen3_5_moe" or "qwen3_5" (dense) */
    int attn_interval; /* full_attention_interval; sets cfg.layer_is_attn */
    lily_mk_layout layout;
    int bits;          /* MLX: 4 or 8 (router and shared-expert gate are always 8) */
    int fused_experts; /* HF: experts.gate_up_proj / down_proj instead of per-expert */
    uint64_t seed;
    int n_threads;             /* 0: one per core */
    uint64_t shard_bytes;      /* max data bytes per shard; 0: 5e9 */
    const char *tokenizer_dir; /* copy tokenizer files from here and size the vocab to them */
    int bos_id;                /* bos/pad id written to the configs (-1: none) */
    int verbose;               /* progress lines on stderr, one per shard */
} lily_mk_opts;

typedef struct lily_mk_result {
    int n_files; /* safetensors shards */
    int n_tensors;
    uint64_t bytes; /* total bytes of the shards */
    double seconds;
} lily_mk_result;

/* Fills o with a preset: "tiny", "small" or "35b-a3b". Shape fields may be changed afterwards. */
int lily_mk_preset(const char *name, lily_mk_opts *o, lily_err *err);

/* Applies attn_interval, checks the shapes (the generated config.json must pass the loader's
 * validation; the MLX layout needs every input dim divisible by 64). Called by lily_mk_write. */
int lily_mk_check(lily_mk_opts *o, lily_err *err);

/* Writes the checkpoint into dir (created if absent): config.json, generation_config.json, the
 * shards (+ model.safetensors.index.json when more than one), and the tokenizer files when
 * tokenizer_dir is set (which also sets cfg.vocab and the eos ids in o). */
int lily_mk_write(const char *dir, lily_mk_opts *o, lily_mk_result *res, lily_err *err);

/* The value element idx of tensor name holds in the checkpoint o describes: the float value
 * (after bf16 rounding where stored as bf16), or the uint32 word for packed codes. For tests. */
int lily_mk_value(const lily_mk_opts *o, const char *name, uint64_t idx, double *out,
                  lily_err *err);

#endif
