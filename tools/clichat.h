/* Shared pieces of the `lily run` and `lily chat` front ends: loading a model directory for
 * chat (engine, tokenizer, chat template, generation defaults, a lily_gen with a prefix cache),
 * rendering a message list to prompt tokens, and progress bars on a terminal. */
#ifndef LILY_TOOLS_CLICHAT_H
#define LILY_TOOLS_CLICHAT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "chat/template.h"
#include "gen/gen.h"

typedef struct lily_clichat {
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_template *tmpl;
    lily_gen *gen;
    lily_sampler_params defaults; /* from generation_config.json */
    int tty;                      /* stderr is a terminal: draw progress bars */
    int ctx;                      /* context length of the session */
} lily_clichat;

typedef struct lily_clichat_opts {
    const char *model_dir;
    lily_backend_kind backend;
    int threads;
    lily_precision precision; /* lily_engine_opts' fields of the same names */
    lily_cpu_isa cpu_isa;
    lily_sample_on sample_on;
    int ctx; /* 0: lily_gen's default (LILY_GEN_DEFAULT_CTX); above the model's maximum: an error */
    size_t cache_bytes; /* prefix-cache budget */
} lily_clichat_opts;

int lily_clichat_open(const lily_clichat_opts *o, lily_clichat *c, lily_err *e);
void lily_clichat_close(lily_clichat *c);

/* Writes "<who>: DIR (model type, quantisation), backend B (device), T threads, context N tokens
 * (X of KV cache and state)" and a newline to f. */
void lily_clichat_banner(const lily_clichat *c, const char *dir, const char *who, FILE *f);

/* Renders messages (with the generation prompt; think < 0 leaves the template default) and
 * tokenizes. *open_think tells whether the prompt ends inside <think>. */
int lily_clichat_encode(lily_clichat *c, const cJSON *messages, int think, int32_t **ids, int *n,
                        int *open_think, lily_err *e);

/* A prefill progress callback for lily_gen_req.on_prefill (ud: the lily_clichat): draws a bar
 * on stderr for prefills of more than 256 tokens when stderr is a terminal. */
void lily_clichat_prefill_bar(void *ud, int done, int total);

#endif
