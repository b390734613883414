/* config.json to lily_config, with validation; see config.h.
 *
 * Lookups go to text_config first and then to the top level, because HF nests the language model
 * of the VLM-shaped release under text_config while text-only exports and qwen3_next are flat. */
#include "model/config.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"

/* Upper bounds that keep every derived size (rows * cols, per-layer byte counts) in range. */
#define MAX_DIM   (1 << 20)
#define MAX_HEADS 4096
#define MAX_VOCAB (1 << 24)

typedef struct {
    const cJSON *tc;  /* text_config, or NULL */
    const cJSON *top; /* the root object */
    const char *name; /* for messages */
    lily_err *err;
} src;

static const cJSON *field(const src *s, const char *key) {
    const cJSON *j = s->tc ? cJSON_GetObjectItemCaseSensitive(s->tc, key) : NULL;
    if (!j || cJSON_IsNull(j)) j = cJSON_GetObjectItemCaseSensitive(s->top, key);
    return (j && !cJSON_IsNull(j)) ? j : NULL;
}

/* An integer field in [lo, hi]; absent gives def, or an error when def < lo (required). */
static int get_int(const src *s, const char *key, int def, int lo, int hi, int *out) {
    const cJSON *j = field(s, key);
    if (!j) {
        if (def < lo) return lily_fail(s->err, "%s: missing field \"%s\"", s->name, key);
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return lily_fail(s->err, "%s: field \"%s\" must be an integer in [%d, %d]", s->name, key,
                         lo, hi);
    *out = (int)d;
    return 0;
}

static int get_bool(const src *s, const char *key, int def, int *out) {
    const cJSON *j = field(s, key);
    if (!j) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(j))
        return lily_fail(s->err, "%s: field \"%s\" must be true or false", s->name, key);
    *out = cJSON_IsTrue(j);
    return 0;
}

/* A number field; absent gives def. Must be finite and in (lo, hi]. */
static int get_num(const cJSON *j, const src *s, const char *key, double def, double lo, double hi,
                   double *out) {
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d > lo && d <= hi))
        return lily_fail(s->err, "%s: field \"%s\" must be a number in (%g, %g]", s->name, key, lo,
                         hi);
    *out = d;
    return 0;
}

static void add_eos(lily_config *cfg, int id) {
    for (int i = 0; i < 4; i++) {
        if (cfg->eos_ids[i] == id) return;
        if (cfg->eos_ids[i] < 0) {
            cfg->eos_ids[i] = id;
            return;
        }
    }
}

static int parse_eos(const cJSON *j, const char *name, const char *key, lily_config *cfg,
                     lily_err *err) {
    if (!j || cJSON_IsNull(j)) return 0;
    if (cJSON_IsNumber(j)) {
        if (!(j->valuedouble >= 0 && j->valuedouble < MAX_VOCAB) ||
            j->valuedouble != floor(j->valuedouble))
            return lily_fail(err, "%s: \"%s\" must be a token id", name, key);
        add_eos(cfg, (int)j->valuedouble);
        return 0;
    }
    if (!cJSON_IsArray(j)) return lily_fail(err, "%s: \"%s\" must be an id or a list", name, key);
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!cJSON_IsNumber(e) || parse_eos(e, name, key, cfg, err))
            return lily_fail(err, "%s: \"%s\" must be a token id or a list of token ids", name,
                             key);
    }
    return 0;
}

static int parse_model_type(const src *s, lily_config *cfg) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(s->top, "model_type");
    if (!cJSON_IsString(mt) && s->tc) mt = cJSON_GetObjectItemCaseSensitive(s->tc, "model_type");
    if (!cJSON_IsString(mt)) return lily_fail(s->err, "%s: missing field \"model_type\"", s->name);
    static const char *const known[] = {"qwen3_5_moe", "qwen3_5", "qwen3_next"};
    char base[64];
    snprintf(base, sizeof base, "%s", mt->valuestring);
    size_t l = strlen(base);
    if (l > 5 && !strcmp(base + l - 5, "_text")) base[l - 5] = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(base, known[i])) {
            snprintf(cfg->model_type, sizeof cfg->model_type, "%s", known[i]);
            cfg->is_moe = strcmp(base, "qwen3_5") != 0;
            return 0;
        }
    return lily_fail(s->err,
                     "%s: model_type \"%.60s\" is not supported (qwen3_5_moe, qwen3_5, "
                     "qwen3_next)",
                     s->name, mt->valuestring);
}

static int parse_layers(const src *s, lily_config *cfg) {
    const cJSON *lt = field(s, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layers)
            return lily_fail(s->err, "%s: field \"layer_types\" must list %d layer types", s->name,
                             cfg->n_layers);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            const char *v = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(v, "full_attention"))
                cfg->layer_is_attn[i] = 1;
            else if (!strcmp(v, "linear_attention"))
                cfg->layer_is_attn[i] = 0;
            else
                return lily_fail(s->err,
                                 "%s: layer_types[%d] must be \"full_attention\" or "
                                 "\"linear_attention\"",
                                 s->name, i);
            i++;
        }
        return 0;
    }
    int interval;
    if (get_int(s, "full_attention_interval", 4, 1, LILY_MAX_LAYERS, &interval)) return -1;
    for (int i = 0; i < cfg->n_layers; i++)
        cfg->layer_is_attn[i] = (i + 1) % interval == 0;
    return 0;
}

static int parse_rope(const src *s, lily_config *cfg) {
    const cJSON *rp = field(s, "rope_parameters");
    if (!rp) rp = field(s, "rope_scaling");
    if (rp && !cJSON_IsObject(rp))
        return lily_fail(s->err, "%s: field \"rope_parameters\" must be an object", s->name);
    const cJSON *theta = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") : NULL;
    if (!theta || cJSON_IsNull(theta)) theta = field(s, "rope_theta");
    if (get_num(theta, s, "rope_theta", 10000.0, 0.0, 1e12, &cfg->rope_theta)) return -1;
    const cJSON *prf = rp ? cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor") : NULL;
    if (!prf || cJSON_IsNull(prf)) prf = field(s, "partial_rotary_factor");
    double f;
    if (get_num(prf, s, "partial_rotary_factor", 0.25, 0.0, 1.0, &f)) return -1;
    cfg->rope_dim = (int)(cfg->head_dim * f);
    if (cfg->rope_dim < 2 || cfg->rope_dim % 2)
        return lily_fail(s->err,
                         "%s: head_dim %d x partial_rotary_factor %g gives %d rotary dims; "
                         "must be even and at least 2",
                         s->name, cfg->head_dim, f, cfg->rope_dim);
    if (rp) {
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (!rt) rt = cJSON_GetObjectItemCaseSensitive(rp, "type");
        if (cJSON_IsString(rt) && strcmp(rt->valuestring, "default"))
            return lily_fail(s->err, "%s: rope_type \"%.40s\" is not supported (only \"default\")",
                             s->name, rt->valuestring);
    }
    return 0;
}

static int parse_override(const cJSON *e, const char *name, lily_qoverride *o, lily_err *err) {
    o->path = lily_xstrdup(e->string);
    if (cJSON_IsFalse(e)) return 0;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bits");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(e, "group_size");
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(g) ||
        !(b->valuedouble >= 1 && b->valuedouble <= 16) ||
        !(g->valuedouble >= 1 && g->valuedouble <= 4096))
        return lily_fail(err, "%s: quantization entry \"%.200s\" needs integer bits and group_size",
                         name, e->string);
    o->bits = (int)b->valuedouble;
    o->group = (int)g->valuedouble;
    return 0;
}

static int parse_quant(const cJSON *root, const char *name, lily_qconfig *q, lily_err *err) {
    const char *key = "quantization";
    const cJSON *qj = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!qj || cJSON_IsNull(qj))
        qj = cJSON_GetObjectItemCaseSensitive(root, key = "quantization_config");
    if (!qj || cJSON_IsNull(qj)) return 0;
    if (!cJSON_IsObject(qj)) return lily_fail(err, "%s: \"%s\" must be an object", name, key);
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(qj, "quant_method");
    if (cJSON_IsString(method))
        return lily_fail(err, "%s: %s.quant_method \"%.40s\" is not supported (MLX affine only)",
                         name, key, method->valuestring);
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(qj, "mode");
    if (mode && (!cJSON_IsString(mode) || strcmp(mode->valuestring, "affine")))
        return lily_fail(err, "%s: %s.mode must be \"affine\"", name, key);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(qj, "bits");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(qj, "group_size");
    if (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble) ||
        !(b->valuedouble >= 1 && b->valuedouble <= 16))
        return lily_fail(err, "%s: %s.bits must be an integer in [1, 16]", name, key);
    if (!cJSON_IsNumber(g) || g->valuedouble != floor(g->valuedouble) ||
        !(g->valuedouble >= 1 && g->valuedouble <= 4096))
        return lily_fail(err, "%s: %s.group_size must be an integer in [1, 4096]", name, key);
    q->present = 1;
    q->bits = (int)b->valuedouble;
    q->group = (int)g->valuedouble;
    const cJSON *e;
    cJSON_ArrayForEach(e, qj) {
        if (!e->string || !(cJSON_IsObject(e) || cJSON_IsFalse(e))) continue;
        q->over = lily_xrealloc(q->over, (size_t)(q->n_over + 1) * sizeof *q->over);
        memset(&q->over[q->n_over], 0, sizeof *q->over);
        if (parse_override(e, name, &q->over[q->n_over++], err)) return -1;
    }
    return 0;
}

static int parse_all(const src *s, lily_config *cfg) {
    if (parse_model_type(s, cfg)) return -1;
    if (get_int(s, "hidden_size", 0, 1, MAX_DIM, &cfg->hidden) ||
        get_int(s, "num_hidden_layers", 0, 1, LILY_MAX_LAYERS, &cfg->n_layers) ||
        get_int(s, "num_attention_heads", 0, 1, MAX_HEADS, &cfg->n_q_heads) ||
        get_int(s, "num_key_value_heads", cfg->n_q_heads, 1, MAX_HEADS, &cfg->n_kv_heads) ||
        get_int(s, "vocab_size", 0, 0, MAX_VOCAB, &cfg->vocab))
        return -1;
    int dh_def = cfg->hidden % cfg->n_q_heads == 0 ? cfg->hidden / cfg->n_q_heads : -1;
    if (get_int(s, "head_dim", dh_def, 1, 65536, &cfg->head_dim)) return -1;
    if (cfg->n_q_heads % cfg->n_kv_heads)
        return lily_fail(s->err,
                         "%s: num_attention_heads %d is not a multiple of "
                         "num_key_value_heads %d",
                         s->name, cfg->n_q_heads, cfg->n_kv_heads);
    if (parse_rope(s, cfg) || parse_layers(s, cfg)) return -1;
    if (get_bool(s, "attn_output_gate", 1, &cfg->attn_output_gate)) return -1;
    /* GDN sizes are required (lo = 1 > default 0) only when some layer is linear attention. */
    int n_lin = cfg->n_layers - lily_config_n_attn(cfg), lo = n_lin ? 1 : 0;
    if (get_int(s, "linear_num_key_heads", 0, lo, MAX_HEADS, &cfg->lin_nk) ||
        get_int(s, "linear_num_value_heads", 0, lo, MAX_HEADS, &cfg->lin_nv) ||
        get_int(s, "linear_key_head_dim", 0, lo, 65536, &cfg->lin_dk) ||
        get_int(s, "linear_value_head_dim", 0, lo, 65536, &cfg->lin_dv) ||
        get_int(s, "linear_conv_kernel_dim", 4, 1, 64, &cfg->conv_k))
        return -1;
    if (n_lin && cfg->lin_nv % cfg->lin_nk)
        return lily_fail(s->err,
                         "%s: linear_num_value_heads %d is not a multiple of "
                         "linear_num_key_heads %d",
                         s->name, cfg->lin_nv, cfg->lin_nk);
    if (cfg->is_moe) {
        if (get_int(s, "num_experts", 0, 1, 65536, &cfg->n_experts) ||
            get_int(s, "num_experts_per_tok", 0, 1, 65536, &cfg->top_k) ||
            get_int(s, "moe_intermediate_size", 0, 1, MAX_DIM, &cfg->moe_inter) ||
            get_int(s, "shared_expert_intermediate_size", 0, 0, MAX_DIM, &cfg->shared_inter))
            return -1;
        if (cfg->top_k > cfg->n_experts)
            return lily_fail(s->err, "%s: num_experts_per_tok %d exceeds num_experts %d", s->name,
                             cfg->top_k, cfg->n_experts);
        if (get_bool(s, "norm_topk_prob", 1, &cfg->norm_topk_prob)) return -1;
        /* Qwen3.5 MoE renormalises whatever the config says (model.md section 5). */
        if (!strcmp(cfg->model_type, "qwen3_5_moe")) cfg->norm_topk_prob = 1;
        const cJSON *mol = field(s, "mlp_only_layers");
        if (mol && (!cJSON_IsArray(mol) || cJSON_GetArraySize(mol) > 0))
            return lily_fail(s->err,
                             "%s: \"mlp_only_layers\" (dense layers inside a MoE model) is "
                             "not supported",
                             s->name);
        int step;
        if (get_int(s, "decoder_sparse_step", 1, 1, 1, &step)) return -1;
    } else {
        if (get_int(s, "intermediate_size", 0, 1, MAX_DIM, &cfg->intermediate)) return -1;
    }
    double eps;
    if (get_num(field(s, "rms_norm_eps"), s, "rms_norm_eps", 1e-6, 0.0, 0.1, &eps)) return -1;
    cfg->rms_eps = (float)eps;
    if (get_int(s, "max_position_embeddings", 262144, 1, 1 << 30, &cfg->max_position)) return -1;
    /* Tying is decided by the top-level config (the model class reads it there). */
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(s->top, "tie_word_embeddings");
    if (!tie && s->tc) tie = cJSON_GetObjectItemCaseSensitive(s->tc, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie))
        return lily_fail(s->err, "%s: field \"tie_word_embeddings\" must be true or false",
                         s->name);
    cfg->tie_embeddings = tie && cJSON_IsTrue(tie);
    const cJSON *act = field(s, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return lily_fail(s->err, "%s: hidden_act must be \"silu\"", s->name);
    int bias;
    if (get_bool(s, "attention_bias", 0, &bias)) return -1;
    if (bias) return lily_fail(s->err, "%s: attention_bias = true is not supported", s->name);
    if (parse_eos(cJSON_GetObjectItemCaseSensitive(s->top, "eos_token_id"), s->name, "eos_token_id",
                  cfg, s->err))
        return -1;
    if (s->tc && parse_eos(cJSON_GetObjectItemCaseSensitive(s->tc, "eos_token_id"), s->name,
                           "text_config.eos_token_id", cfg, s->err))
        return -1;
    return 0;
}

int lily_config_parse(const char *text, size_t len, const char *name, lily_config *cfg,
                      lily_qconfig *q, lily_err *err) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < 4; i++)
        cfg->eos_ids[i] = -1;
    if (q) memset(q, 0, sizeof *q);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return lily_fail(err, "%s: not valid JSON", name);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = lily_fail(err, "%s: not a JSON object", name);
    } else {
        src s = {cJSON_GetObjectItemCaseSensitive(root, "text_config"), root, name, err};
        if (s.tc && !cJSON_IsObject(s.tc))
            rc = lily_fail(err, "%s: text_config is not an object", name);
        else
            rc = parse_all(&s, cfg);
        if (rc == 0 && q) rc = parse_quant(root, name, q, err);
    }
    cJSON_Delete(root);
    if (rc && q) lily_qconfig_free(q);
    return rc;
}

int lily_config_load(const char *dir, lily_config *cfg, lily_qconfig *q, lily_err *err) {
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    if (lily_path_join(path, sizeof path, dir, "config.json"))
        return lily_fail(err, "%s: path too long", dir);
    if (lily_read_file(path, 16u << 20, &text, &len, err)) return -1;
    int rc = lily_config_parse(text, len, path, cfg, q, err);
    free(text);
    if (rc) return -1;
    /* generation_config.json lists every stop id (e.g. both <|im_end|> and <|endoftext|>). */
    if (lily_path_join(path, sizeof path, dir, "generation_config.json") == 0 &&
        lily_file_exists(path) && lily_read_file(path, 1u << 20, &text, &len, NULL) == 0) {
        cJSON *g = cJSON_ParseWithLength(text, len);
        free(text);
        lily_err ignored;
        if (cJSON_IsObject(g))
            parse_eos(cJSON_GetObjectItemCaseSensitive(g, "eos_token_id"), path, "eos_token_id",
                      cfg, &ignored);
        cJSON_Delete(g);
    }
    return 0;
}

void lily_qconfig_free(lily_qconfig *q) {
    if (!q) return;
    for (int i = 0; i < q->n_over; i++)
        free(q->over[i].path);
    free(q->over);
    memset(q, 0, sizeof *q);
}

int lily_qconfig_lookup(const lily_qconfig *q, const char *path, int *bits, int *group) {
    for (int i = 0; q && i < q->n_over; i++)
        if (!strcmp(q->over[i].path, path)) {
            *bits = q->over[i].bits;
            *group = q->over[i].group;
            return 1;
        }
    return 0;
}

int lily_config_n_attn(const lily_config *cfg) {
    int n = 0;
    for (int i = 0; i < cfg->n_layers; i++)
        n += cfg->layer_is_attn[i];
    return n;
}
