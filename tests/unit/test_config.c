/* config.json parsing: HF nesting vs flat, layer_types vs interval, RoPE fallbacks, eos merging,
 * the MLX quantization table, and rejection (naming the field) of every invalid value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *detail) {
    if (ok)
        n_pass++;
    else
        n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

/* The text fields of a small MoE model, as a JSON object body (no braces). */
#define TEXT_FIELDS                                                                              \
    "\"hidden_size\": 96, \"num_hidden_layers\": 6, \"num_attention_heads\": 6,"                 \
    "\"num_key_value_heads\": 3, \"head_dim\": 40, \"linear_num_key_heads\": 3,"                 \
    "\"linear_num_value_heads\": 9, \"linear_key_head_dim\": 24, \"linear_value_head_dim\": 20," \
    "\"linear_conv_kernel_dim\": 5, \"num_experts\": 12, \"num_experts_per_tok\": 3,"            \
    "\"moe_intermediate_size\": 44, \"shared_expert_intermediate_size\": 36,"                    \
    "\"vocab_size\": 1001, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 7777,"           \
    "\"full_attention_interval\": 3,"                                                            \
    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000,"                  \
    "\"partial_rotary_factor\": 0.5}"

static int parse(const char *json, lily_config *c, lily_qconfig *q, char *msg) {
    lily_err err = {{0}};
    int rc = lily_config_parse(json, strlen(json), "config.json", c, q, &err);
    strcpy(msg, err.msg);
    return rc;
}

static int same_config(const lily_config *a, const lily_config *b) {
    return !strcmp(a->model_type, b->model_type) && a->hidden == b->hidden &&
           a->n_layers == b->n_layers && a->vocab == b->vocab && a->n_q_heads == b->n_q_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->rope_dim == b->rope_dim && a->rope_theta == b->rope_theta && a->lin_nk == b->lin_nk &&
           a->lin_nv == b->lin_nv && a->lin_dk == b->lin_dk && a->lin_dv == b->lin_dv &&
           a->conv_k == b->conv_k && a->n_experts == b->n_experts && a->top_k == b->top_k &&
           a->moe_inter == b->moe_inter && a->shared_inter == b->shared_inter &&
           a->rms_eps == b->rms_eps && a->max_position == b->max_position &&
           !memcmp(a->layer_is_attn, b->layer_is_attn, sizeof a->layer_is_attn);
}

static void test_nesting(void) {
    lily_config nested, flat;
    char msg[512];
    int rc =
        parse("{\"model_type\": \"qwen3_5_moe\", \"eos_token_id\": 1000, \"text_config\": {"
              "\"model_type\": \"qwen3_5_moe_text\", \"eos_token_id\": [998, 1000], " TEXT_FIELDS
              "}, \"hidden_size\": 5}",
              &nested, NULL, msg);
    check(rc == 0, "nested config parses", msg);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS "}", &flat, NULL, msg);
    check(rc == 0, "flat config parses", msg);
    check(same_config(&nested, &flat), "nested (text_config wins over top level) == flat", NULL);
    char d[256];
    snprintf(d, sizeof d, "H %d L %d Dh %d R %d theta %g eps %g experts %d/%d", nested.hidden,
             nested.n_layers, nested.head_dim, nested.rope_dim, nested.rope_theta,
             (double)nested.rms_eps, nested.top_k, nested.n_experts);
    check(nested.hidden == 96 && nested.rope_dim == 20 && nested.rope_theta == 500000 &&
              nested.conv_k == 5 && nested.is_moe && nested.norm_topk_prob &&
              fabsf(nested.rms_eps - 1e-5f) < 1e-12f && nested.attn_output_gate,
          "values", d);
    int sched = 1;
    for (int l = 0; l < 6; l++)
        sched &= nested.layer_is_attn[l] == ((l + 1) % 3 == 0);
    check(sched && lily_config_n_attn(&nested) == 2, "interval 3 -> attention at 2 and 5", NULL);
    snprintf(d, sizeof d, "%d %d %d", nested.eos_ids[0], nested.eos_ids[1], nested.eos_ids[2]);
    check(nested.eos_ids[0] == 1000 && nested.eos_ids[1] == 998 && nested.eos_ids[2] == -1,
          "eos: top level, then text_config, deduplicated", d);
}

static void test_fields(void) {
    lily_config c;
    char msg[512];
    /* layer_types overrides the interval. */
    int rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS ", \"layer_types\": ["
                   "\"full_attention\", \"linear_attention\", \"linear_attention\","
                   "\"full_attention\", \"full_attention\", \"linear_attention\"]}",
                   &c, NULL, msg);
    check(rc == 0 && c.layer_is_attn[0] && !c.layer_is_attn[1] && c.layer_is_attn[3] &&
              c.layer_is_attn[4] && !c.layer_is_attn[5],
          "layer_types used over full_attention_interval", msg);
    /* Defaults: head_dim = hidden/heads, interval 4, theta from top level, factor 0.25. */
    rc = parse("{\"model_type\": \"qwen3_5_moe\", \"rope_theta\": 1234.5, \"hidden_size\": 128,"
               "\"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"linear_num_key_heads\": 2,"
               "\"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8,"
               "\"linear_value_head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 1,"
               "\"moe_intermediate_size\": 8}",
               &c, NULL, msg);
    char d[200];
    snprintf(d, sizeof d, "Dh %d kv %d R %d theta %g eps %g attn %d%d conv %d Is %d max %d",
             c.head_dim, c.n_kv_heads, c.rope_dim, c.rope_theta, (double)c.rms_eps,
             c.layer_is_attn[3], c.layer_is_attn[2], c.conv_k, c.shared_inter, c.max_position);
    check(rc == 0 && c.head_dim == 32 && c.n_kv_heads == 4 && c.rope_dim == 8 &&
              c.rope_theta == 1234.5 && c.layer_is_attn[3] && !c.layer_is_attn[2] &&
              c.layer_is_attn[7] && c.conv_k == 4 && fabsf(c.rms_eps - 1e-6f) < 1e-13f,
          "defaults and top-level rope_theta", rc ? msg : d);
    /* partial_rotary_factor from text_config when rope_parameters lacks it. */
    rc = parse("{\"model_type\": \"qwen3_5_moe\", \"text_config\": {\"partial_rotary_factor\": 0.1,"
               "\"rope_parameters\": {\"rope_theta\": 77}, " TEXT_FIELDS "}}",
               &c, NULL, msg);
    check(rc == 0 && c.rope_dim == 4 && c.rope_theta == 77, "partial_rotary_factor fallback", msg);
    /* Dense qwen3_5 and qwen3_5_moe forcing renormalisation. */
    rc = parse("{\"model_type\": \"qwen3_5\", \"text_config\": {\"hidden_size\": 64,"
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
               "\"full_attention_interval\": 2, \"linear_num_key_heads\": 1,"
               "\"linear_num_value_heads\": 2, \"linear_key_head_dim\": 8,"
               "\"linear_value_head_dim\": 8, \"intermediate_size\": 100,"
               "\"tie_word_embeddings\": true}, \"eos_token_id\": 7}",
               &c, NULL, msg);
    check(rc == 0 && !c.is_moe && c.intermediate == 100 && c.tie_embeddings && c.eos_ids[0] == 7 &&
              !strcmp(c.model_type, "qwen3_5"),
          "dense qwen3_5 with tied embeddings (from text_config)", msg);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", \"norm_topk_prob\": false, " TEXT_FIELDS "}", &c,
               NULL, msg);
    check(rc == 0 && c.norm_topk_prob == 1, "qwen3_5_moe always renormalises", msg);
    rc = parse("{\"model_type\": \"qwen3_next\", \"norm_topk_prob\": false, " TEXT_FIELDS "}", &c,
               NULL, msg);
    check(rc == 0 && c.norm_topk_prob == 0 && !strcmp(c.model_type, "qwen3_next"),
          "qwen3_next follows norm_topk_prob", msg);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false, \"text_config\":"
               "{\"tie_word_embeddings\": true, " TEXT_FIELDS "}}",
               &c, NULL, msg);
    check(rc == 0 && !c.tie_embeddings, "top-level tie_word_embeddings decides", msg);
}

static void test_quant(void) {
    lily_config c;
    lily_qconfig q;
    char msg[512];
    int rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS ", \"quantization\": {"
                   "\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\","
                   "\"language_model.model.layers.0.mlp.gate\": {\"group_size\": 64, \"bits\": 8},"
                   "\"language_model.model.layers.0.mlp.shared_expert_gate\": false}}",
                   &c, &q, msg);
    int bits = -1, group = -1, bits2 = -1, g2 = -1;
    int f1 = lily_qconfig_lookup(&q, "language_model.model.layers.0.mlp.gate", &bits, &group);
    int f2 = lily_qconfig_lookup(&q, "language_model.model.layers.0.mlp.shared_expert_gate", &bits2,
                                 &g2);
    int f3 = lily_qconfig_lookup(&q, "language_model.model.layers.1.mlp.gate", &g2, &g2);
    check(rc == 0 && q.present && q.bits == 4 && q.group == 64 && q.n_over == 2 && f1 &&
              bits == 8 && group == 64 && f2 && bits2 == 0 && !f3,
          "quantization table with overrides and false", msg);
    lily_qconfig_free(&q);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS ", \"quantization_config\": {"
               "\"group_size\": 32, \"bits\": 8}}",
               &c, &q, msg);
    check(rc == 0 && q.present && q.bits == 8 && q.group == 32, "quantization_config fallback",
          msg);
    lily_qconfig_free(&q);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS ", \"quantization_config\": {"
               "\"quant_method\": \"fp8\"}}",
               &c, &q, msg);
    check(rc != 0 && strstr(msg, "fp8"), "non-MLX quant_method rejected", msg);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS ", \"quantization\": {"
               "\"group_size\": 64, \"bits\": 4, \"mode\": \"mxfp4\"}}",
               &c, &q, msg);
    check(rc != 0 && strstr(msg, "mode"), "mode other than affine rejected", msg);
}

/* Each case replaces or adds one field of a valid config and must fail naming `want`. */
static void test_bad(void) {
    static const struct {
        const char *extra, *want;
    } cases[] = {
        {"\"hidden_size\": 0", "hidden_size"},
        {"\"hidden_size\": -3", "hidden_size"},
        {"\"hidden_size\": \"96\"", "hidden_size"},
        {"\"hidden_size\": 96.5", "hidden_size"},
        {"\"num_hidden_layers\": 300", "num_hidden_layers"},
        {"\"num_key_value_heads\": 4", "num_key_value_heads"},
        {"\"head_dim\": 0", "head_dim"},
        {"\"linear_num_key_heads\": 4", "linear_num_key_heads"},
        {"\"num_experts_per_tok\": 13", "num_experts_per_tok"},
        {"\"num_experts\": 0", "num_experts"},
        {"\"moe_intermediate_size\": null, \"x\": 0", NULL},
        {"\"rms_norm_eps\": 0", "rms_norm_eps"},
        {"\"rms_norm_eps\": -1e-6", "rms_norm_eps"},
        {"\"rope_parameters\": {\"rope_theta\": 0}", "rope_theta"},
        {"\"rope_parameters\": {\"partial_rotary_factor\": 1.5}", "partial_rotary_factor"},
        {"\"rope_parameters\": {\"partial_rotary_factor\": 0.0125}", "rotary dims"},
        {"\"rope_parameters\": {\"rope_type\": \"yarn\"}", "rope_type"},
        {"\"rope_parameters\": 3", "rope_parameters"},
        {"\"layer_types\": [\"full_attention\"]", "layer_types"},
        {"\"layer_types\": [\"full_attention\", \"full_attention\", \"mamba\", \"full_attention\", "
         "\"full_attention\", \"full_attention\"]",
         "layer_types[2]"},
        {"\"full_attention_interval\": 0", "full_attention_interval"},
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"attention_bias\": true", "attention_bias"},
        {"\"attn_output_gate\": 1", "attn_output_gate"},
        {"\"max_position_embeddings\": 0", "max_position_embeddings"},
        {"\"eos_token_id\": \"x\"", "eos_token_id"},
        {"\"eos_token_id\": [1, -2]", "eos_token_id"},
        {"\"tie_word_embeddings\": 1", "tie_word_embeddings"},
        {"\"mlp_only_layers\": [1]", "mlp_only_layers"},
        {"\"linear_conv_kernel_dim\": 0", "linear_conv_kernel_dim"},
    };
    char json[4096], msg[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* Later duplicate keys are ignored by lookups, so the bad field goes first. */
        snprintf(json, sizeof json, "{%s, \"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS "}",
                 cases[i].extra);
        lily_config c;
        int rc = parse(json, &c, NULL, msg);
        char what[160];
        snprintf(what, sizeof what, "rejects %s", cases[i].extra);
        if (!cases[i].want) {
            /* moe_intermediate_size: null, the later valid duplicate is not used either. */
            check(rc != 0 && strstr(msg, "moe_intermediate_size"), what, msg);
            continue;
        }
        check(rc != 0 && strstr(msg, cases[i].want) && strstr(msg, "config.json"), what, msg);
    }
    lily_config c;
    int rc = parse("{\"model_type\": \"qwen3_5_moe\", " TEXT_FIELDS, &c, NULL, msg);
    check(rc != 0 && strstr(msg, "JSON"), "truncated JSON rejected", msg);
    rc = parse("[1]", &c, NULL, msg);
    check(rc != 0 && strstr(msg, "object"), "non-object rejected", msg);
    rc = parse("{\"model_type\": \"llama\", " TEXT_FIELDS "}", &c, NULL, msg);
    check(rc != 0 && strstr(msg, "llama"), "unsupported model_type rejected", msg);
    rc = parse("{" TEXT_FIELDS "}", &c, NULL, msg);
    check(rc != 0 && strstr(msg, "model_type"), "missing model_type rejected", msg);
    rc = parse("{\"model_type\": \"qwen3_5\", " TEXT_FIELDS "}", &c, NULL, msg);
    check(rc != 0 && strstr(msg, "intermediate_size"), "dense model needs intermediate_size", msg);
    rc = parse("{\"model_type\": \"qwen3_5_moe\", \"text_config\": 5}", &c, NULL, msg);
    check(rc != 0 && strstr(msg, "text_config"), "non-object text_config rejected", msg);
}

int main(void) {
    test_nesting();
    test_fields();
    test_quant();
    test_bad();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
