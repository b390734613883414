/* config.json / generation_config.json writing and tokenizer sizing for mkmodel; see
 * mkmodel_json.h. */
#include "model/mkmodel_json.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"
#include "model/config.h"

static void add_int(cJSON *o, const char *k, double v) {
    cJSON_AddNumberToObject(o, k, v);
}

static cJSON *eos_value(const lily_config *c, int first_only) {
    int n = 0;
    while (n < 4 && c->eos_ids[n] >= 0)
        n++;
    if (first_only || n == 1) return cJSON_CreateNumber(n ? c->eos_ids[0] : 0);
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(c->eos_ids[i]));
    return a;
}

static cJSON *text_config(const lily_mk_opts *o) {
    const lily_config *c = &o->cfg;
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "model_type", c->is_moe ? "qwen3_5_moe_text" : "qwen3_5_text");
    add_int(t, "hidden_size", c->hidden);
    add_int(t, "num_hidden_layers", c->n_layers);
    add_int(t, "num_attention_heads", c->n_q_heads);
    add_int(t, "num_key_value_heads", c->n_kv_heads);
    add_int(t, "head_dim", c->head_dim);
    add_int(t, "linear_num_key_heads", c->lin_nk);
    add_int(t, "linear_num_value_heads", c->lin_nv);
    add_int(t, "linear_key_head_dim", c->lin_dk);
    add_int(t, "linear_value_head_dim", c->lin_dv);
    add_int(t, "linear_conv_kernel_dim", c->conv_k);
    if (c->is_moe) {
        add_int(t, "num_experts", c->n_experts);
        add_int(t, "num_experts_per_tok", c->top_k);
        add_int(t, "moe_intermediate_size", c->moe_inter);
        add_int(t, "shared_expert_intermediate_size", c->shared_inter);
        cJSON_AddNumberToObject(t, "router_aux_loss_coef", 0.001);
    } else {
        add_int(t, "intermediate_size", c->intermediate);
    }
    add_int(t, "vocab_size", c->vocab);
    /* Written as the double of the float eps (9.9999999747524271e-07 for 1e-6): the golden
     * fixtures hash config.json, so this text must not change. */
    cJSON_AddNumberToObject(t, "rms_norm_eps", c->rms_eps);
    cJSON_AddStringToObject(t, "hidden_act", "silu");
    cJSON_AddFalseToObject(t, "attention_bias");
    cJSON_AddNumberToObject(t, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(t, "attn_output_gate", c->attn_output_gate);
    cJSON *lt = cJSON_AddArrayToObject(t, "layer_types");
    for (int l = 0; l < c->n_layers; l++)
        cJSON_AddItemToArray(
            lt, cJSON_CreateString(c->layer_is_attn[l] ? "full_attention" : "linear_attention"));
    add_int(t, "full_attention_interval", o->attn_interval);
    add_int(t, "max_position_embeddings", c->max_position);
    double prf = (double)c->rope_dim / c->head_dim;
    cJSON *rp = cJSON_AddObjectToObject(t, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(rp, "partial_rotary_factor", prf);
    /* The rotary frequency slots split over the T/H/W streams as evenly as possible (the 35B
     * value [11, 11, 10] for 32 slots); for text all three streams carry the same position. */
    int half = c->rope_dim / 2, h3 = half / 3, rem = half % 3;
    int sec[3] = {h3 + (rem > 0), h3 + (rem > 1), h3};
    cJSON_AddItemToObject(rp, "mrope_section", cJSON_CreateIntArray(sec, 3));
    cJSON_AddTrueToObject(rp, "mrope_interleaved");
    cJSON_AddNumberToObject(t, "partial_rotary_factor", prf);
    cJSON_AddBoolToObject(t, "tie_word_embeddings", c->tie_embeddings);
    add_int(t, "mtp_num_hidden_layers", 0);
    cJSON_AddFalseToObject(t, "mtp_use_dedicated_embeddings");
    cJSON_AddStringToObject(t, "mamba_ssm_dtype", "float32");
    cJSON_AddNumberToObject(t, "initializer_range", 0.02);
    cJSON_AddTrueToObject(t, "use_cache");
    cJSON_AddStringToObject(t, "dtype", "bfloat16");
    if (c->eos_ids[1] >= 0)
        add_int(t, "eos_token_id", c->eos_ids[1]);
    else if (c->eos_ids[0] >= 0)
        add_int(t, "eos_token_id", c->eos_ids[0]);
    if (o->bos_id >= 0) {
        add_int(t, "bos_token_id", o->bos_id);
        add_int(t, "pad_token_id", o->bos_id);
    }
    return t;
}

/* The MLX table: default bits/group and the 8-bit router and shared-expert gate of each layer. */
static cJSON *quant_table(const lily_mk_opts *o) {
    cJSON *q = cJSON_CreateObject();
    add_int(q, "group_size", 64);
    add_int(q, "bits", o->bits);
    cJSON_AddStringToObject(q, "mode", "affine");
    for (int l = 0; l < o->cfg.n_layers && o->cfg.is_moe; l++) {
        char k[128];
        snprintf(k, sizeof k, "language_model.model.layers.%d.mlp.gate", l);
        cJSON *e = cJSON_AddObjectToObject(q, k);
        add_int(e, "group_size", 64);
        add_int(e, "bits", 8);
        if (o->cfg.shared_inter > 0) {
            snprintf(k, sizeof k, "language_model.model.layers.%d.mlp.shared_expert_gate", l);
            e = cJSON_AddObjectToObject(q, k);
            add_int(e, "group_size", 64);
            add_int(e, "bits", 8);
        }
    }
    return q;
}

char *lily_mk_config_json(const lily_mk_opts *o) {
    const lily_config *c = &o->cfg;
    cJSON *root = cJSON_CreateObject();
    const char *arch =
        c->is_moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration";
    cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(&arch, 1));
    cJSON_AddStringToObject(root, "model_type", c->is_moe ? "qwen3_5_moe" : "qwen3_5");
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_embeddings);
    if (c->eos_ids[0] >= 0) cJSON_AddItemToObject(root, "eos_token_id", eos_value(c, 1));
    cJSON_AddStringToObject(root, "dtype", "bfloat16");
    cJSON_AddItemToObject(root, "text_config", text_config(o));
    if (o->layout == LILY_MK_MLX) {
        cJSON_AddItemToObject(root, "quantization", quant_table(o));
        cJSON_AddItemToObject(root, "quantization_config", quant_table(o));
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

char *lily_mk_generation_json(const lily_mk_opts *o) {
    cJSON *root = cJSON_CreateObject();
    if (o->bos_id >= 0) {
        add_int(root, "bos_token_id", o->bos_id);
        add_int(root, "pad_token_id", o->bos_id);
    }
    if (o->cfg.eos_ids[0] >= 0) cJSON_AddItemToObject(root, "eos_token_id", eos_value(&o->cfg, 0));
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

int lily_mk_write_text(const char *dir, const char *name, const char *text, lily_err *err) {
    char path[4096];
    if (lily_path_join(path, sizeof path, dir, name))
        return lily_fail(err, "%s: path too long", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return lily_fail(err, "%s: cannot create: %s", path, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    ok &= fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : lily_fail(err, "%s: write failed", path);
}

static cJSON *read_json(const char *dir, const char *name, lily_err *err) {
    char path[4096], *text = NULL;
    size_t len = 0;
    if (lily_path_join(path, sizeof path, dir, name)) {
        lily_fail(err, "%s: path too long", dir);
        return NULL;
    }
    if (lily_read_file(path, 256u << 20, &text, &len, err)) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        lily_fail(err, "%s: not a JSON object", path);
    }
    return cJSON_IsObject(j) ? j : NULL;
}

/* Id of an added token (or a vocab entry) whose content is s; -1 if none. */
static int token_id(const cJSON *tok, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tok, "added_tokens")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, s))
            return (int)id->valuedouble;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "vocab"), s);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : -1;
}

int lily_mk_tokenizer_size(lily_mk_opts *o, lily_err *err) {
    cJSON *tok = read_json(o->tokenizer_dir, "tokenizer.json", err);
    if (!tok) return -1;
    cJSON *tcfg = read_json(o->tokenizer_dir, "tokenizer_config.json", err);
    if (!tcfg) {
        cJSON_Delete(tok);
        return -1;
    }
    double max_id = -1;
    const cJSON *e;
    const cJSON *vocab =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tok, "model"), "vocab");
    cJSON_ArrayForEach(e, vocab) if (cJSON_IsNumber(e) && e->valuedouble > max_id) max_id =
        e->valuedouble;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tok, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsNumber(id) && id->valuedouble > max_id) max_id = id->valuedouble;
    }
    int rc = 0;
    if (max_id < 0 || max_id >= (1 << 24)) {
        rc = lily_fail(err, "%s/tokenizer.json: no usable token ids in model.vocab / added_tokens",
                       o->tokenizer_dir);
    } else {
        int v = ((int)max_id + 1 + 63) / 64 * 64;
        if (v > o->cfg.vocab) o->cfg.vocab = v;
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(tcfg, "eos_token");
        if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
        int eid = cJSON_IsString(eos) ? token_id(tok, eos->valuestring) : -1;
        int end = token_id(tok, "<|endoftext|>");
        for (int i = 0; i < 4; i++)
            o->cfg.eos_ids[i] = -1;
        int n = 0;
        if (eid >= 0) o->cfg.eos_ids[n++] = eid;
        if (end >= 0 && end != eid) o->cfg.eos_ids[n++] = end;
        o->bos_id = end;
    }
    cJSON_Delete(tok);
    cJSON_Delete(tcfg);
    return rc;
}

static int copy_file(const char *src_dir, const char *dir, const char *name, int required,
                     lily_err *err) {
    char src[4096], dst[4096];
    if (lily_path_join(src, sizeof src, src_dir, name) ||
        lily_path_join(dst, sizeof dst, dir, name))
        return lily_fail(err, "%s: path too long", dir);
    if (!lily_file_exists(src)) return required ? lily_fail(err, "%s: missing", src) : 0;
    FILE *in = fopen(src, "rb");
    if (!in) return lily_fail(err, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return lily_fail(err, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok &= !ferror(in);
    fclose(in);
    if (fclose(out) != 0) ok = 0;
    return ok ? 0 : lily_fail(err, "%s: copy failed", dst);
}

int lily_mk_tokenizer_copy(const char *src_dir, const char *dir, lily_err *err) {
    return copy_file(src_dir, dir, "tokenizer.json", 1, err) ||
                   copy_file(src_dir, dir, "tokenizer_config.json", 1, err) ||
                   copy_file(src_dir, dir, "chat_template.jinja", 0, err)
               ? -1
               : 0;
}
