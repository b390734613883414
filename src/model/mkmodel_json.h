/* The JSON side of synthetic checkpoints: config.json, generation_config.json, and sizing the
 * vocabulary from a tokenizer directory whose files are copied into the checkpoint. */
#ifndef LILY_MODEL_MKMODEL_JSON_H
#define LILY_MODEL_MKMODEL_JSON_H

#include "lily.h"
#include "model/mkmodel.h"

/* config.json for o, in the HF nesting transformers reads (text_config), plus the MLX
 * quantization table for the MLX layout. Caller frees with free(). */
char *lily_mk_config_json(const lily_mk_opts *o);
/* generation_config.json for o (eos list, bos/pad). Caller frees with free(). */
char *lily_mk_generation_json(const lily_mk_opts *o);

/* Reads o->tokenizer_dir: sets o->cfg.vocab to the highest token id + 1 rounded up to 64 (never
 * below the current value when that already fits), and the eos ids (eos_token of
 * tokenizer_config.json first, then <|endoftext|>) and bos_id. */
int lily_mk_tokenizer_size(lily_mk_opts *o, lily_err *err);
/* Copies tokenizer.json, tokenizer_config.json and (if present) chat_template.jinja into dir. */
int lily_mk_tokenizer_copy(const char *src_dir, const char *dir, lily_err *err);

/* Writes text into dir/name. */
int lily_mk_write_text(const char *dir, const char *name, const char *text, lily_err *err);

#endif
