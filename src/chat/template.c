/* Chat-template front end (see template.h): loading from a model directory, compiling, and the
 * render entry that sets up the runtime, the variable scopes and the error exit. */
#include "chat/template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"
#include "chat/tpl_eval.h"
#include "chat/tpl_json.h"
#include "chat/tpl_methods.h"

#define NSPECIAL 7
static const char *const special_names[NSPECIAL] = {
    "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"};

struct lily_template {
    tpl_rt ct; /* compile-time runtime: its arena owns source, tokens and AST */
    char *src; /* NUL-terminated copy of the source */
    tpl_node **body;
    size_t nbody;
    char *special[NSPECIAL]; /* special-token strings from tokenizer_config.json, or NULL */
    lily_template_limits lim;
};

static void fill_limits(lily_template_limits *l) {
    if (!l->max_output) l->max_output = (size_t)64 << 20;
    if (!l->max_memory) l->max_memory = (size_t)1 << 30;
    if (!l->max_steps) l->max_steps = 200000000ull;
    if (!l->max_depth) l->max_depth = 200;
}

int lily_template_compile(const char *src, size_t len, lily_template **out, lily_err *e) {
    *out = NULL;
    lily_template *t = lily_xcalloc(1, sizeof *t);
    fill_limits(&t->lim);
    t->src = lily_xmalloc(len + 1);
    memcpy(t->src, src, len);
    t->src[len] = 0;
    tpl_rt *rt = &t->ct;
    rt->max_output = (size_t)1 << 30;
    rt->max_steps = UINT64_MAX;
    rt->arena.limit = (size_t)1 << 30;
    if (setjmp(rt->jmp)) {
        lily_fail(e, "chat template line %d: %s", rt->line, rt->msg);
        lily_template_free(t);
        return -1;
    }
    tpl_tok *toks;
    size_t ntoks;
    tpl_lex(rt, t->src, len, &toks, &ntoks);
    tpl_parse(rt, toks, ntoks, &t->body, &t->nbody);
    *out = t;
    return 0;
}

void lily_template_set_limits(lily_template *t, const lily_template_limits *lim) {
    t->lim = *lim;
    fill_limits(&t->lim);
}

const char *lily_template_source(const lily_template *t) {
    return t->src;
}

void lily_template_free(lily_template *t) {
    if (!t) return;
    tpl_arena_free(&t->ct.arena);
    for (int i = 0; i < NSPECIAL; i++)
        free(t->special[i]);
    free(t->src);
    free(t);
}

/* ---- loading ---------------------------------------------------------------------------- */

static int read_json(const char *dir, const char *name, cJSON **out, lily_err *e) {
    char path[4096];
    *out = NULL;
    if (lily_path_join(path, sizeof path, dir, name)) return lily_fail(e, "path too long: %s", dir);
    if (!lily_file_exists(path)) return 0;
    char *text;
    size_t n;
    if (lily_read_file(path, (size_t)64 << 20, &text, &n, e)) return -1;
    *out = cJSON_ParseWithLength(text, n);
    free(text);
    if (!*out) return lily_fail(e, "%s: invalid JSON", path);
    return 0;
}

static const char *pick_template(const cJSON *ct, lily_err *e) {
    if (cJSON_IsString(ct)) return ct->valuestring;
    if (!cJSON_IsArray(ct)) {
        lily_fail(e, "chat_template must be a string or a list of named templates");
        return NULL;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, ct) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tpl))
            return tpl->valuestring;
    }
    lily_fail(e, "chat_template lists named templates but none is called \"default\"");
    return NULL;
}

int lily_template_load(const char *model_dir, lily_template **out, lily_err *e) {
    *out = NULL;
    char path[4096];
    cJSON *cfg = NULL, *ctj = NULL;
    char *text = NULL;
    size_t n = 0;
    int rc = -1;
    if (read_json(model_dir, "tokenizer_config.json", &cfg, e)) return -1;
    if (lily_path_join(path, sizeof path, model_dir, "chat_template.jinja")) {
        lily_fail(e, "path too long: %s", model_dir);
        goto done;
    }
    if (lily_file_exists(path)) {
        if (lily_read_file(path, (size_t)16 << 20, &text, &n, e)) goto done;
        rc = lily_template_compile(text, n, out, e);
        if (rc) lily_fail_prefix(e, "%s", path);
    } else {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *what = "tokenizer_config.json";
        if (!ct) {
            if (read_json(model_dir, "chat_template.json", &ctj, e)) goto done;
            ct = cJSON_GetObjectItemCaseSensitive(ctj, "chat_template");
            what = "chat_template.json";
        }
        if (!ct) {
            lily_fail(e,
                      "%s: no chat template (no chat_template.jinja, and no chat_template in "
                      "tokenizer_config.json or chat_template.json)",
                      model_dir);
            goto done;
        }
        const char *src = pick_template(ct, e);
        if (!src) {
            lily_fail_prefix(e, "%s/%s", model_dir, what);
            goto done;
        }
        rc = lily_template_compile(src, strlen(src), out, e);
        if (rc) lily_fail_prefix(e, "%s/%s", model_dir, what);
    }
    if (!rc && cfg) {
        for (int i = 0; i < NSPECIAL; i++) {
            const cJSON *tok = cJSON_GetObjectItemCaseSensitive(cfg, special_names[i]);
            if (cJSON_IsObject(tok)) tok = cJSON_GetObjectItemCaseSensitive(tok, "content");
            if (cJSON_IsString(tok)) (*out)->special[i] = lily_xstrdup(tok->valuestring);
        }
    }
done:
    free(text);
    cJSON_Delete(cfg);
    cJSON_Delete(ctj);
    return rc;
}

/* ---- rendering -------------------------------------------------------------------------- */

/* Renders with the context given either as a cJSON tree or as JSON text. */
static int render(const lily_template *t, const cJSON *cj, const char *json, size_t json_len,
                  char **out, size_t *len, lily_err *e) {
    *out = NULL;
    if (len) *len = 0;
    tpl_rt *rt = lily_xcalloc(1, sizeof *rt);
    rt->max_output = t->lim.max_output;
    rt->max_steps = t->lim.max_steps;
    rt->max_depth = t->lim.max_depth;
    rt->arena.limit = t->lim.max_memory;
    tpl_buf buf = {0};
    rt->out = &buf;
    int rc = -1;
    if (setjmp(rt->jmp)) {
        lily_fail(e, "chat template line %d: %s", rt->line, rt->msg);
        goto done;
    }
    tpl_val ctx;
    if (cj) {
        ctx = tpl_from_cjson(rt, cj);
    } else {
        char msg[200];
        if (tpl_json_parse(rt, json, json_len, &ctx, msg, sizeof msg)) {
            lily_fail(e, "template context: %s", msg);
            goto done;
        }
    }
    if (ctx.kind != TV_DICT) {
        lily_fail(e, "template context must be a JSON object");
        goto done;
    }
    rt->globals = tpl_scope_new(rt, NULL);
    tpl_define_globals(rt, rt->globals);
    tpl_scope *top = tpl_scope_new(rt, rt->globals);
    for (int i = 0; i < NSPECIAL; i++)
        if (t->special[i]) tpl_scope_set(rt, top, special_names[i], tpl_cstr(t->special[i]));
    tpl_scope_set(rt, top, "tools", tpl_none());
    tpl_scope_set(rt, top, "documents", tpl_none());
    tpl_scope_set(rt, top, "add_generation_prompt", tpl_bool(0));
    for (size_t i = 0; i < ctx.d->n; i++) {
        const tpl_val *k = &ctx.d->k[i];
        tpl_val name = tpl_str(rt, k->s.p, k->s.n); /* NUL-terminated */
        tpl_scope_set(rt, top, name.s.p, ctx.d->v[i]);
    }
    rt->scope = top;
    tpl_exec(rt, t->body, t->nbody);
    *out = lily_xmalloc(buf.n + 1);
    if (buf.n) memcpy(*out, buf.p, buf.n);
    (*out)[buf.n] = 0;
    if (len) *len = buf.n;
    rc = 0;
done:
    tpl_arena_free(&rt->arena);
    free(rt);
    return rc;
}

int lily_template_render(const lily_template *t, const cJSON *ctx, char **out, size_t *len,
                         lily_err *e) {
    if (!ctx) return lily_fail(e, "template context is missing");
    return render(t, ctx, NULL, 0, out, len, e);
}

int lily_template_render_json(const lily_template *t, const char *json, size_t json_len, char **out,
                              size_t *len, lily_err *e) {
    return render(t, NULL, json, json_len, out, len, e);
}
