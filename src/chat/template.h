/* Chat templates: renders a model's Jinja chat template the way Hugging Face transformers'
 * apply_chat_template(..., tokenize=False) does (jinja2 ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, HF's tojson, raise_exception, strftime_now, loop controls).
 *
 * The context is a JSON object whose keys become template variables: "messages", "tools",
 * "add_generation_prompt" and any extra keyword (e.g. "enable_thinking"). As in HF, "tools" and
 * "documents" default to None and "add_generation_prompt" to false; bos_token, eos_token and the
 * other special tokens of tokenizer_config.json are defined when the template was loaded from a
 * model directory (the context overrides them).
 *
 * Errors (syntax, runtime type errors, raise_exception, limits) come back as -1 with a message
 * "chat template line N: <message>"; for raise_exception the message is the template's text. */
#ifndef LILY_CHAT_TEMPLATE_H
#define LILY_CHAT_TEMPLATE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "lily.h"

typedef struct lily_template lily_template;

/* Bounds on one render; zero fields take the defaults shown. */
typedef struct lily_template_limits {
    size_t max_output;  /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;  /* scratch memory of one render (default 1 GiB) */
    uint64_t max_steps; /* evaluation steps, a bound on time (default 200 million) */
    int max_depth;      /* nested macro calls (default 200) */
} lily_template_limits;

/* Compiles template source (len bytes, UTF-8). Free with lily_template_free. */
int lily_template_compile(const char *src, size_t len, lily_template **out, lily_err *e);

/* Loads the chat template of a model directory: chat_template.jinja if present (it wins, as in
 * transformers), else "chat_template" of tokenizer_config.json (a string, or a list of
 * {"name", "template"} of which "default" is taken), else chat_template.json. Special tokens
 * (bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token) are read from
 * tokenizer_config.json when present. */
int lily_template_load(const char *model_dir, lily_template **out, lily_err *e);

void lily_template_set_limits(lily_template *t, const lily_template_limits *lim);

/* Renders with context ctx (a JSON object). *out is malloc'd and NUL-terminated (the text may
 * itself contain NUL bytes; *len is exact); caller frees with free(). A cJSON number with an
 * integral value within +-2^53 is taken as an int, any other as a float (cJSON cannot tell
 * 1.0 from 1; use lily_template_render_json to keep that distinction). */
int lily_template_render(const lily_template *t, const cJSON *ctx, char **out, size_t *len,
                         lily_err *e);

/* Same, with the context given as JSON text, parsed with Python's json semantics. */
int lily_template_render_json(const lily_template *t, const char *json, size_t json_len, char **out,
                              size_t *len, lily_err *e);

/* The template source (borrowed, valid until lily_template_free), e.g. to detect its format. */
const char *lily_template_source(const lily_template *t);

void lily_template_free(lily_template *t);

#endif
