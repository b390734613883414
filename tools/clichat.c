/* Shared pieces of `lily run` and `lily chat` (see clichat.h). */
#include "clichat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "base/progress.h"

void lily_clichat_prefill_bar(void *ud, int done, int total) {
    const lily_clichat *c = ud;
    if (!c->tty || total <= 256) return;
    int w = 40, k = (int)((double)done / total * w);
    fprintf(stderr, "\rprefill [%.*s%*s] %d/%d", k,
            "========================================", w - k, "", done, total);
    if (done >= total) fprintf(stderr, "\r\033[K");
}

static void defaults(const char *dir, lily_sampler_params *p) {
    *p = lily_sampler_params_default();
    char path[4096];
    char *text = NULL;
    if (lily_path_join(path, sizeof path, dir, "generation_config.json") ||
        lily_read_file(path, 1 << 20, &text, NULL, NULL))
        return;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *v;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "temperature")))
        p->temperature = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_p")))
        p->top_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "top_k")))
        p->top_k = (int)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "min_p")))
        p->min_p = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "repetition_penalty")))
        p->repeat_penalty = (float)v->valuedouble;
    cJSON_Delete(j);
}

int lily_clichat_open(const lily_clichat_opts *o, lily_clichat *c, lily_err *e) {
    memset(c, 0, sizeof *c);
    c->tty = isatty(2);
    lily_engine_opts eo = {.backend = o->backend,
                           .n_threads = o->threads,
                           .precision = o->precision,
                           .cpu_isa = o->cpu_isa,
                           .sample_on = o->sample_on};
    lily_bar bar = {0};
    if (c->tty) eo.progress = lily_bar_update, eo.progress_ud = &bar;
    if (lily_engine_open(o->model_dir, &eo, &c->eng, e) ||
        lily_tokenizer_open(o->model_dir, &c->tok, e) ||
        lily_template_load(o->model_dir, &c->tmpl, e)) {
        lily_clichat_close(c);
        return -1;
    }
    int maxp = lily_engine_info(c->eng)->max_position;
    if (o->ctx > maxp) {
        lily_fail(e, "--ctx %d is above the model's maximum context (%d)", o->ctx, maxp);
        lily_clichat_close(c);
        return -1;
    }
    int ctx = o->ctx > 0 ? o->ctx : (maxp < LILY_GEN_DEFAULT_CTX ? maxp : LILY_GEN_DEFAULT_CTX);
    c->ctx = ctx;
    lily_gen_opts go = {.max_ctx = ctx, .cache_bytes = o->cache_bytes};
    if (lily_gen_create(c->eng, c->tok, &go, &c->gen, e)) {
        lily_clichat_close(c);
        return -1;
    }
    defaults(o->model_dir, &c->defaults);
    return 0;
}

void lily_clichat_banner(const lily_clichat *c, const char *dir, const char *who, FILE *f) {
    const lily_model_info *in = lily_engine_info(c->eng);
    char mem[32];
    lily_bar_bytes(mem, sizeof mem, lily_engine_session_bytes(c->eng, c->ctx));
    fprintf(f,
            "%s: %s (%s, %s), backend %s (%s), %d thread%s, context %d tokens (%s of KV cache "
            "and state)\n",
            who, dir, in->model_type, in->quant, in->backend, in->device, in->n_threads,
            in->n_threads == 1 ? "" : "s", c->ctx, mem);
}

void lily_clichat_close(lily_clichat *c) {
    lily_gen_free(c->gen);
    lily_template_free(c->tmpl);
    lily_tokenizer_free(c->tok);
    lily_engine_close(c->eng);
    memset(c, 0, sizeof *c);
}

int lily_clichat_encode(lily_clichat *c, const cJSON *messages, int think, int32_t **ids, int *n,
                        int *open_think, lily_err *e) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(ctx, "messages", (cJSON *)messages);
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", 1);
    if (think >= 0) cJSON_AddBoolToObject(ctx, "enable_thinking", think);
    char *text;
    size_t len, nn;
    int rc = lily_template_render(c->tmpl, ctx, &text, &len, e);
    cJSON_Delete(ctx);
    if (rc) return -1;
    size_t k = len;
    while (k && (text[k - 1] == '\n' || text[k - 1] == ' '))
        k--;
    *open_think = k >= 7 && !memcmp(text + k - 7, "<think>", 7);
    rc = lily_tokenizer_encode(c->tok, text, len, ids, &nn, e);
    free(text);
    *n = (int)nn;
    return rc;
}
