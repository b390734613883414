/* gguf_q4: a lily checkpoint (MLX 4/8-bit or HF bf16, any size) as a GGUF for llama.cpp's
 * `qwen35moe` architecture -- the yardstick of issue 36 (bench/cpu_vs_llama.sh).
 *
 *   build/gguf_q4 --model DIR --out FILE.gguf [--type q4_0|q8_0|f32] [--tokenizer DIR]
 *   build/gguf_q4 --check FILE.gguf      header and tensor table, checked against the file size
 *   build/gguf_q4 --self-test            quantizers, fp16 and a small file round trip
 *
 * Weights are read through lily_model_load (zero-copy over the mapping), dequantized a row at a
 * time to fp32 and requantized: the large matrices to --type (Q4_0 by default: 18 bytes per 32
 * weights, the same 4.5 bits per weight as MLX 4-bit with group 64), the routers to Q8_0 (8.5 bits,
 * as MLX 8-bit; F32 with --type f32), the 1-D parameters and conv taps to F32. The file is
 * written tensor by tensor, so memory stays at a few rows whatever the model size. The run ends
 * with the relative RMS error of the requantization (Q4_0 and Q8_0 tensors, each over all their
 * values).
 *
 * The GGUF form (model.md section 7.3, checked against llama.cpp's qwen35moe loader): norms stored
 * as effective scales (1+w, which lily's loader already holds), `ssm_a` = -exp(A_log), and every
 * value-head-indexed tensor of the Gated DeltaNet in llama.cpp's tiled head order (GGUF head p is
 * HF head (p mod Nk)*r + p/Nk, r = Nv/Nk), because llama.cpp pairs value head p with key head
 * p mod Nk where HF pairs value head j with key head j/r. The MTP block is not exported. The
 * vocabulary is the byte-level BPE of tokenizer.json (model dir, or --tokenizer DIR for a
 * synthetic checkpoint that has none), padded with unused [PADn] tokens to the embedding rows. */
#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "backend/cpu/ops.h"
#include "gguf_write.h"
#include "model/model.h"

/* ---- the tensor plan ---------------------------------------------------------------------------- */

typedef enum { SRC_MAT, SRC_VEC, SRC_CONV } src_kind;
typedef enum { PERM_NONE, PERM_ROWS, PERM_COLS } perm_kind;
typedef enum { VEC_PLAIN, VEC_NEG_EXP } vec_op;

typedef struct {
    char name[80];
    int type, n_dims;
    int64_t ne[3];
    src_kind kind;
    const lily_mat *mat; /* SRC_MAT: n_mat matrices stacked along ne[2] */
    int n_mat;
    const float *vec; /* SRC_VEC: ne[0] values; SRC_CONV: [C][K] */
    vec_op op;
    perm_kind perm; /* value-head reordering of rows (or of vec/conv channels) or columns */
    int perm_first; /* index where the value-head block starts */
    int perm_block; /* elements per value head */
} plan_t;

typedef struct {
    plan_t *p;
    int n, cap;
    int nk, r; /* GDN key heads, value heads per key head */
} plan_list;

static plan_t *add(plan_list *l, int type, const char *fmt, int layer) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 512;
        l->p = lily_xrealloc(l->p, (size_t)l->cap * sizeof *l->p);
    }
    plan_t *t = &l->p[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->type = type;
    t->n_mat = 1;
    return t;
}

/* A matrix [rows, cols] (or n of them): ne = {cols, rows[, n]}. */
static plan_t *add_mat(plan_list *l, int type, const char *fmt, int layer, const lily_mat *m,
                       int n) {
    plan_t *t = add(l, type, fmt, layer);
    t->kind = SRC_MAT;
    t->mat = m;
    t->n_mat = n;
    t->ne[0] = m->cols, t->ne[1] = m->rows, t->ne[2] = n;
    t->n_dims = n > 1 ? 3 : 2;
    return t;
}

static plan_t *add_vec(plan_list *l, const char *fmt, int layer, const float *v, int n) {
    plan_t *t = add(l, GGML_T_F32, fmt, layer);
    t->kind = SRC_VEC;
    t->vec = v;
    t->ne[0] = n, t->ne[1] = 1, t->ne[2] = 1;
    t->n_dims = 1;
    return t;
}

static void set_perm(plan_t *t, perm_kind k, int first, int block) {
    t->perm = k, t->perm_first = first, t->perm_block = block;
}

/* The source index of GGUF index i along a value-head-reordered axis. */
static int64_t src_index(const plan_list *l, const plan_t *t, int64_t i) {
    if (t->perm == PERM_NONE || i < t->perm_first) return i;
    int64_t j = i - t->perm_first, p = j / t->perm_block, d = j % t->perm_block;
    int64_t hf = (p % l->nk) * l->r + p / l->nk;
    return t->perm_first + hf * t->perm_block + d;
}

static int build_plan(const lily_model *m, int big, int router, plan_list *l, lily_err *err) {
    const lily_config *c = &m->cfg;
    if (!c->is_moe) return lily_fail(err, "only MoE (qwen3_5_moe) checkpoints are supported");
    if (!c->attn_output_gate)
        return lily_fail(err, "llama.cpp's qwen35moe needs the attention output gate");
    if (c->lin_dk != c->lin_dv)
        return lily_fail(err, "llama.cpp's qwen35moe needs equal GDN key and value head dims");
    l->nk = c->lin_nk;
    l->r = c->lin_nv / c->lin_nk;
    int H = c->hidden, qk = 2 * c->lin_nk * c->lin_dk, Dv = c->lin_dv;
    add_mat(l, big, "token_embd.weight", 0, &m->embed, 1);
    add_vec(l, "output_norm.weight", 0, m->final_norm, H);
    if (!c->tie_embeddings) add_mat(l, big, "output.weight", 0, &m->lm_head, 1);
    for (int i = 0; i < c->n_layers; i++) {
        const lily_layer *y = &m->layers[i];
        add_vec(l, "blk.%d.attn_norm.weight", i, y->in_norm, H);
        add_vec(l, "blk.%d.post_attention_norm.weight", i, y->post_norm, H);
        if (y->is_attn) {
            add_mat(l, big, "blk.%d.attn_q.weight", i, &y->q_proj, 1);
            add_mat(l, big, "blk.%d.attn_k.weight", i, &y->k_proj, 1);
            add_mat(l, big, "blk.%d.attn_v.weight", i, &y->v_proj, 1);
            add_mat(l, big, "blk.%d.attn_output.weight", i, &y->o_proj, 1);
            add_vec(l, "blk.%d.attn_q_norm.weight", i, y->q_norm, c->head_dim);
            add_vec(l, "blk.%d.attn_k_norm.weight", i, y->k_norm, c->head_dim);
        } else {
            int C = qk + c->lin_nv * Dv;
            set_perm(add_mat(l, big, "blk.%d.attn_qkv.weight", i, &y->qkv_proj, 1), PERM_ROWS, qk,
                     Dv);
            set_perm(add_mat(l, big, "blk.%d.attn_gate.weight", i, &y->z_proj, 1), PERM_ROWS, 0,
                     Dv);
            plan_t *t = add(l, GGML_T_F32, "blk.%d.ssm_conv1d.weight", i);
            t->kind = SRC_CONV;
            t->vec = y->conv_w;
            t->ne[0] = c->conv_k, t->ne[1] = C, t->ne[2] = 1;
            t->n_dims = 2;
            set_perm(t, PERM_ROWS, qk, Dv);
            set_perm(add_vec(l, "blk.%d.ssm_dt.bias", i, y->dt_bias, c->lin_nv), PERM_ROWS, 0, 1);
            t = add_vec(l, "blk.%d.ssm_a", i, y->A_log, c->lin_nv);
            t->op = VEC_NEG_EXP;
            set_perm(t, PERM_ROWS, 0, 1);
            set_perm(add_mat(l, big, "blk.%d.ssm_beta.weight", i, &y->b_proj, 1), PERM_ROWS, 0, 1);
            set_perm(add_mat(l, big, "blk.%d.ssm_alpha.weight", i, &y->a_proj, 1), PERM_ROWS, 0, 1);
            add_vec(l, "blk.%d.ssm_norm.weight", i, y->gdn_norm, Dv);
            set_perm(add_mat(l, big, "blk.%d.ssm_out.weight", i, &y->out_proj, 1), PERM_COLS, 0,
                     Dv);
        }
        add_mat(l, router, "blk.%d.ffn_gate_inp.weight", i, &y->router, 1);
        add_mat(l, big, "blk.%d.ffn_gate_exps.weight", i, y->exp_gate, c->n_experts);
        add_mat(l, big, "blk.%d.ffn_up_exps.weight", i, y->exp_up, c->n_experts);
        add_mat(l, big, "blk.%d.ffn_down_exps.weight", i, y->exp_down, c->n_experts);
        if (c->shared_inter > 0) {
            /* The shared expert's scalar gate is a 1-D {H} tensor in llama.cpp. */
            plan_t *t =
                add_mat(l, GGML_T_F32, "blk.%d.ffn_gate_inp_shexp.weight", i, &y->sh_gate_w, 1);
            t->n_dims = 1;
            add_mat(l, big, "blk.%d.ffn_gate_shexp.weight", i, &y->sh_gate, 1);
            add_mat(l, big, "blk.%d.ffn_up_shexp.weight", i, &y->sh_up, 1);
            add_mat(l, big, "blk.%d.ffn_down_shexp.weight", i, &y->sh_down, 1);
        }
    }
    for (int i = 0; i < l->n; i++) {
        const plan_t *t = &l->p[i];
        if (t->type != GGML_T_F32 && t->ne[0] % 32)
            return lily_fail(err, "%s: %lld columns are not a multiple of 32", t->name,
                             (long long)t->ne[0]);
    }
    return 0;
}

/* Sums of squares of the quantized matrices' values and of their requantization error. */
typedef struct {
    double ss, se;
} qerr_t;

static void add_err(qerr_t *e, int type, const float *x, const uint8_t *q, int64_t n, float *y) {
    if (type == GGML_T_Q4_0)
        gguf_dequant_q4_0(q, n, y);
    else if (type == GGML_T_Q8_0)
        gguf_dequant_q8_0(q, n, y);
    else
        return;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - y[i];
        e->ss += (double)x[i] * x[i], e->se += d * d;
    }
}

/* Writes tensor t: rows of ne[0] values, converted to t->type. */
static int write_tensor(gguf_w *w, const plan_list *l, const plan_t *t, float *row, float *tmp,
                        uint8_t *q, qerr_t *qe) {
    int64_t cols = t->ne[0];
    uint64_t rb = gguf_row_size(t->type, cols);
    if (t->kind == SRC_VEC) {
        for (int64_t i = 0; i < cols; i++) {
            float v = t->vec[src_index(l, t, i)];
            row[i] = t->op == VEC_NEG_EXP ? -expf(v) : v;
        }
        return gguf_w_data(w, row, (size_t)cols * 4);
    }
    if (t->kind == SRC_CONV) {
        for (int64_t ch = 0; ch < t->ne[1]; ch++)
            if (gguf_w_data(w, t->vec + src_index(l, t, ch) * cols, (size_t)cols * 4)) return -1;
        return 0;
    }
    for (int e = 0; e < t->n_mat; e++) {
        const lily_mat *m = &t->mat[e];
        for (int64_t r = 0; r < t->ne[1]; r++) {
            if (t->perm == PERM_COLS) {
                lily_mat_row_f32(m, (int)r, tmp);
                for (int64_t c = 0; c < cols; c++)
                    row[c] = tmp[src_index(l, t, c)];
            } else {
                lily_mat_row_f32(m, (int)(t->perm == PERM_ROWS ? src_index(l, t, r) : r), row);
            }
            gguf_quant_row(t->type, row, cols, q);
            add_err(&qe[t->type == GGML_T_Q8_0], t->type, row, q, cols, tmp);
            if (gguf_w_data(w, q, (size_t)rb)) return -1;
        }
    }
    return 0;
}

/* ---- the vocabulary ----------------------------------------------------------------------------- */

typedef struct {
    char **tok;
    size_t *len;
    int32_t *type;
    int n;
    char **merges;
    size_t *mlen;
    int n_merges;
    int endoftext; /* id of <|endoftext|>, or -1 */
} vocab_t;

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5 };

static void vocab_free(vocab_t *v) {
    for (int i = 0; i < v->n; i++)
        free(v->tok[i]);
    for (int i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tok), free(v->len), free(v->type), free(v->merges), free(v->mlen);
}

static int set_tok(vocab_t *v, int id, const char *s, int type, const char *path, lily_err *err) {
    if (id < 0 || id >= v->n)
        return lily_fail(err, "%s: token id %d is outside the embedding's %d rows", path, id, v->n);
    free(v->tok[id]);
    v->tok[id] = lily_xstrdup(s);
    v->len[id] = strlen(s);
    v->type[id] = type;
    return 0;
}

/* tokenizer.json's model.vocab, model.merges ("a b" strings or [a, b] pairs) and added_tokens,
 * padded to n_vocab with [PADn] tokens. */
static int vocab_load(const char *dir, int n_vocab, vocab_t *v, lily_err *err) {
    char path[4096];
    if (lily_path_join(path, sizeof path, dir, "tokenizer.json"))
        return lily_fail(err, "%s: path too long", dir);
    char *text;
    size_t len;
    if (lily_read_file(path, (size_t)1 << 30, &text, &len, err)) return -1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return lily_fail(err, "%s: not JSON", path);
    memset(v, 0, sizeof *v);
    v->n = n_vocab;
    v->tok = lily_xcalloc((size_t)n_vocab, sizeof *v->tok);
    v->len = lily_xcalloc((size_t)n_vocab, sizeof *v->len);
    v->type = lily_xcalloc((size_t)n_vocab, sizeof *v->type);
    v->endoftext = -1;
    int rc = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(vocab) || !cJSON_IsString(type) || strcmp(type->valuestring, "BPE")) {
        rc = lily_fail(err, "%s: model.vocab of a BPE model expected", path);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || set_tok(v, (int)e->valuedouble, e->string, TT_NORMAL, path, err))
            goto fail;
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "special");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(c)) continue;
        if (set_tok(v, (int)id->valuedouble, c->valuestring,
                    cJSON_IsTrue(sp) ? TT_CONTROL : TT_USER, path, err))
            goto fail;
        if (!strcmp(c->valuestring, "<|endoftext|>")) v->endoftext = (int)id->valuedouble;
    }
    for (int i = 0; i < n_vocab; i++) {
        if (v->tok[i]) continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", i);
        set_tok(v, i, pad, TT_UNUSED, path, err);
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int nm = cJSON_GetArraySize(merges);
    v->merges = lily_xcalloc((size_t)nm + 1, sizeof *v->merges);
    v->mlen = lily_xcalloc((size_t)nm + 1, sizeof *v->mlen);
    cJSON_ArrayForEach(e, merges) {
        char *s = NULL;
        if (cJSON_IsString(e)) {
            s = lily_xstrdup(e->valuestring);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring;
            const char *b = cJSON_GetArrayItem(e, 1)->valuestring;
            s = lily_xmalloc(strlen(a) + strlen(b) + 2);
            sprintf(s, "%s %s", a, b);
        } else {
            rc = lily_fail(err, "%s: merge %d is neither \"a b\" nor [a, b]", path, v->n_merges);
            goto done;
        }
        v->mlen[v->n_merges] = strlen(s);
        v->merges[v->n_merges++] = s;
    }
    goto done;
fail:
    rc = -1;
done:
    cJSON_Delete(j);
    if (rc) vocab_free(v);
    return rc;
}

/* ---- metadata ----------------------------------------------------------------------------------- */

static int attn_interval(const lily_config *c, lily_err *err) {
    int k = 0;
    for (int i = 0; i < c->n_layers && !k; i++)
        if (c->layer_is_attn[i]) k = i + 1;
    if (!k) return lily_fail(err, "no full-attention layer: not a qwen35moe schedule");
    for (int i = 0; i < c->n_layers; i++)
        if (!!c->layer_is_attn[i] != ((i + 1) % k == 0))
            return lily_fail(err, "layer %d breaks the every-%d-th full-attention schedule", i, k);
    return k;
}

static void write_meta(gguf_w *w, const lily_model *m, const vocab_t *v, int big, int interval,
                       const char *name) {
    const lily_config *c = &m->cfg;
#define K(s) "qwen35moe." s
    gguf_w_kv_str(w, "general.architecture", "qwen35moe");
    gguf_w_kv_str(w, "general.name", name);
    /* llama_ftype: 0 all F32, 2 mostly Q4_0, 7 mostly Q8_0 */
    gguf_w_kv_u32(w, "general.file_type", big == GGML_T_Q4_0 ? 2 : big == GGML_T_Q8_0 ? 7 : 0);
    gguf_w_kv_u32(w, "general.quantization_version", 2);
    gguf_w_kv_u32(w, "general.alignment", GGUF_ALIGN);
    gguf_w_kv_u32(w, K("block_count"), (uint32_t)c->n_layers);
    gguf_w_kv_u32(w, K("context_length"), (uint32_t)c->max_position);
    gguf_w_kv_u32(w, K("embedding_length"), (uint32_t)c->hidden);
    gguf_w_kv_u32(w, K("feed_forward_length"), (uint32_t)c->moe_inter);
    gguf_w_kv_u32(w, K("attention.head_count"), (uint32_t)c->n_q_heads);
    gguf_w_kv_u32(w, K("attention.head_count_kv"), (uint32_t)c->n_kv_heads);
    gguf_w_kv_u32(w, K("attention.key_length"), (uint32_t)c->head_dim);
    gguf_w_kv_u32(w, K("attention.value_length"), (uint32_t)c->head_dim);
    gguf_w_kv_f32(w, K("attention.layer_norm_rms_epsilon"), c->rms_eps);
    gguf_w_kv_u32(w, K("rope.dimension_count"), (uint32_t)c->rope_dim);
    gguf_w_kv_f32(w, K("rope.freq_base"), (float)c->rope_theta);
    /* M-RoPE sections as Qwen splits the R/2 frequency slots (32 -> 11,11,10); for text all
     * three position streams are equal, so only their sum matters. */
    int s = c->rope_dim / 2, a = (s + 2) / 3, b = (s - a + 1) / 2;
    int32_t sect[4] = {a, b, s - a - b, 0};
    gguf_w_kv_arr_i32(w, K("rope.dimension_sections"), sect, 4);
    gguf_w_kv_u32(w, K("expert_count"), (uint32_t)c->n_experts);
    gguf_w_kv_u32(w, K("expert_used_count"), (uint32_t)c->top_k);
    gguf_w_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)c->moe_inter);
    gguf_w_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)c->shared_inter);
    gguf_w_kv_u32(w, K("ssm.conv_kernel"), (uint32_t)c->conv_k);
    gguf_w_kv_u32(w, K("ssm.state_size"), (uint32_t)c->lin_dk);
    gguf_w_kv_u32(w, K("ssm.group_count"), (uint32_t)c->lin_nk);
    gguf_w_kv_u32(w, K("ssm.time_step_rank"), (uint32_t)c->lin_nv);
    gguf_w_kv_u32(w, K("ssm.inner_size"), (uint32_t)(c->lin_nv * c->lin_dv));
    gguf_w_kv_u32(w, K("full_attention_interval"), (uint32_t)interval);
#undef K
    gguf_w_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_kv_str(w, "tokenizer.ggml.pre", "qwen35");
    gguf_w_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->len,
                      (uint64_t)v->n);
    gguf_w_kv_arr_i32(w, "tokenizer.ggml.token_type", v->type, (uint64_t)v->n);
    gguf_w_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, v->mlen,
                      (uint64_t)v->n_merges);
    if (c->eos_ids[0] >= 0)
        gguf_w_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0]);
    if (v->endoftext >= 0) {
        gguf_w_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->endoftext);
        gguf_w_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->endoftext);
    }
    gguf_w_kv_bool(w, "tokenizer.ggml.add_bos_token", 0);
}

/* ---- conversion --------------------------------------------------------------------------------- */

static int convert(const char *model_dir, const char *tok_dir, const char *out, int big) {
    lily_err err = {{0}};
    lily_model *m = NULL;
    plan_list pl = {0};
    vocab_t voc = {0};
    int have_voc = 0, rc = 1;
    if (lily_model_load(model_dir, &m, &err)) goto done;
    int interval = attn_interval(&m->cfg, &err);
    if (interval < 0) goto done;
    int router = big == GGML_T_F32 ? GGML_T_F32 : GGML_T_Q8_0;
    if (build_plan(m, big, router, &pl, &err)) goto done;
    if (vocab_load(tok_dir, m->cfg.vocab, &voc, &err)) goto done;
    have_voc = 1;

    char msg[512];
    gguf_w *w = gguf_w_open(out, msg, sizeof msg);
    if (!w) {
        fprintf(stderr, "gguf_q4: %s\n", msg);
        goto done;
    }
    const char *base = strrchr(model_dir, '/');
    write_meta(w, m, &voc, big, interval, base && base[1] ? base + 1 : model_dir);
    for (int i = 0; i < pl.n; i++)
        gguf_w_tensor(w, pl.p[i].name, pl.p[i].n_dims, pl.p[i].ne, pl.p[i].type);
    uint64_t total = gguf_w_data_bytes(w), done_b = 0, next = 0;
    int werr = gguf_w_begin_data(w, msg, sizeof msg);
    int64_t maxc = m->cfg.vocab;
    for (int i = 0; i < pl.n; i++)
        if (pl.p[i].ne[0] > maxc) maxc = pl.p[i].ne[0];
    float *row = lily_xmalloc((size_t)maxc * 4), *tmp = lily_xmalloc((size_t)maxc * 4);
    uint8_t *q = lily_xmalloc((size_t)maxc * 4);
    qerr_t qe[2] = {{0, 0}, {0, 0}}; /* Q4_0, Q8_0 */
    for (int i = 0; i < pl.n && !werr; i++) {
        werr = write_tensor(w, &pl, &pl.p[i], row, tmp, q, qe);
        const plan_t *t = &pl.p[i];
        done_b +=
            gguf_row_size(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * (t->ne[2] ? t->ne[2] : 1));
        if (done_b >= next || i == pl.n - 1) {
            fprintf(stderr, "\rgguf_q4: %.2f of %.2f GB", (double)done_b / 1e9,
                    (double)total / 1e9);
            next = done_b + (1ull << 30);
        }
    }
    fprintf(stderr, "\n");
    free(row), free(tmp), free(q);
    if (werr) snprintf(msg, sizeof msg, "writing %s failed", out);
    if (gguf_w_close(w, msg, sizeof msg) || werr) {
        fprintf(stderr, "gguf_q4: %s: %s\n", out, msg);
        goto done;
    }
    fprintf(stderr, "gguf_q4: %s: %d tensors, %d tokens, %d merges, large matrices %s\n", out, pl.n,
            voc.n, voc.n_merges,
            big == GGML_T_Q4_0   ? "Q4_0"
            : big == GGML_T_Q8_0 ? "Q8_0"
                                 : "F32");
    for (int k = 0; k < 2; k++)
        if (qe[k].ss > 0)
            fprintf(stderr, "gguf_q4: %s requantization error: rms(error) / rms(weights) = %.4f\n",
                    k ? "Q8_0" : "Q4_0", sqrt(qe[k].se / qe[k].ss));
    rc = 0;
done:
    if (rc && err.msg[0]) fprintf(stderr, "gguf_q4: %s\n", err.msg);
    if (have_voc) vocab_free(&voc);
    free(pl.p);
    lily_model_free(m);
    return rc;
}

/* ---- self-test ---------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int self_test(void) {
    int fails = 0;
    /* fp16: exact values, rounding to even, overflow, subnormals. */
    static const struct {
        float f;
        uint16_t h;
    } f16[] = {{1.0f, 0x3c00},          {-2.0f, 0xc000},          {65504.0f, 0x7bff},
               {65520.0f, 0x7c00},      {1e-8f, 0x0000},          {5.9604645e-8f, 0x0001},
               {6.1035156e-5f, 0x0400}, {1.00048828125f, 0x3c00}, {1.00146484375f, 0x3c02},
               {0.333333f, 0x3555}};
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++)
        if (gguf_f32_to_f16(f16[i].f) != f16[i].h) {
            fprintf(stderr, "fp16(%g) = %04x, want %04x\n", (double)f16[i].f,
                    gguf_f32_to_f16(f16[i].f), f16[i].h);
            fails++;
        }
    for (int i = 0; i < 100000; i++) { /* round trip of every value through fp16 is within 2^-11 */
        float x = frand() * 1000.0f, y = gguf_f16_to_f32(gguf_f32_to_f16(x));
        if (fabsf(x - y) > fabsf(x) * (1.0f / 2048) + 6e-8f) {
            fprintf(stderr, "fp16 round trip %g -> %g\n", (double)x, (double)y);
            fails++;
            break;
        }
    }
    /* Q4_0 / Q8_0: the error of every value is bounded by the step (plus the fp16 scale). */
    enum { N = 32 * 37 };
    float x[N], y[N];
    uint8_t q[N * 2];
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < N; i++)
            x[i] = frand() * (float)(1 + i % 7) * 0.1f;
        x[5] = 0.8f; /* a block whose largest magnitude is positive */
        int q4 = t == 0;
        if (q4) {
            gguf_quant_q4_0(x, N, q), gguf_dequant_q4_0(q, N, y);
        } else {
            gguf_quant_q8_0(x, N, q), gguf_dequant_q8_0(q, N, y);
        }
        for (int b = 0; b < N / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[32 * b + j]));
            /* Q4_0 codes span -8..7 steps from the extreme's side: the opposite extreme can
             * clip by up to a whole step; everything else is within half a step. */
            float step = amax / (q4 ? 8.0f : 127.0f),
                  tol = step * (q4 ? 1.0f : 0.5f) + amax * 2e-3f;
            for (int j = 0; j < 32; j++)
                if (fabsf(x[32 * b + j] - y[32 * b + j]) > tol) {
                    fprintf(stderr, "%s block %d value %d: %g -> %g (tol %g)\n",
                            q4 ? "Q4_0" : "Q8_0", b, j, (double)x[32 * b + j],
                            (double)y[32 * b + j], (double)tol);
                    fails++;
                    b = N;
                    break;
                }
        }
    }
    /* the largest magnitude of a Q4_0 block is kept exactly (up to the fp16 scale) */
    gguf_quant_q4_0(x, 32, q), gguf_dequant_q4_0(q, 32, y);
    if (fabsf(y[5] - 0.8f) > 1e-3f) fprintf(stderr, "Q4_0 max %g\n", (double)y[5]), fails++;

    /* A small file: metadata of every kind, three tensors, read back by the checker. */
    char path[] = "/tmp/gguf_q4_selftestXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return fprintf(stderr, "mkstemp failed\n"), 1;
    close(fd);
    char msg[256];
    gguf_w *w = gguf_w_open(path, msg, sizeof msg);
    if (!w) return fprintf(stderr, "%s\n", msg), 1;
    const char *strs[] = {"a", "b c", ""};
    size_t lens[] = {1, 3, 0};
    int32_t ints[] = {1, -2, 3};
    gguf_w_kv_str(w, "general.architecture", "test");
    gguf_w_kv_u32(w, "u", 7);
    gguf_w_kv_f32(w, "f", 0.5f);
    gguf_w_kv_bool(w, "b", 1);
    gguf_w_kv_arr_i32(w, "ai", ints, 3);
    gguf_w_kv_arr_str(w, "as", strs, lens, 3);
    int64_t ne1[] = {5}, ne2[] = {64, 3}, ne3[] = {32, 2, 3};
    gguf_w_tensor(w, "v", 1, ne1, GGML_T_F32);
    gguf_w_tensor(w, "m", 2, ne2, GGML_T_Q4_0);
    gguf_w_tensor(w, "s", 3, ne3, GGML_T_Q8_0);
    int rc = gguf_w_begin_data(w, msg, sizeof msg);
    rc |= gguf_w_data(w, x, 5 * 4);
    gguf_quant_q4_0(x, 64 * 3, q);
    rc |= gguf_w_data(w, q, gguf_row_size(GGML_T_Q4_0, 64) * 3);
    gguf_quant_q8_0(x, 32 * 6, q);
    rc |= gguf_w_data(w, q, gguf_row_size(GGML_T_Q8_0, 32) * 6);
    rc |= gguf_w_close(w, msg, sizeof msg);
    uint64_t nt = 0, nk = 0;
    if (rc || gguf_check(path, NULL, &nt, &nk, msg, sizeof msg) || nt != 3 || nk != 6) {
        fprintf(stderr, "file round trip: rc %d, %llu tensors, %llu keys: %s\n", rc,
                (unsigned long long)nt, (unsigned long long)nk, msg);
        fails++;
    }
    /* a short write is reported */
    w = gguf_w_open(path, msg, sizeof msg);
    gguf_w_tensor(w, "v", 1, ne1, GGML_T_F32);
    gguf_w_begin_data(w, msg, sizeof msg);
    gguf_w_data(w, x, 4);
    if (gguf_w_close(w, msg, sizeof msg) == 0) fprintf(stderr, "short write accepted\n"), fails++;
    remove(path);
    fprintf(stderr, "gguf_q4 self-test: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gguf_q4 --model DIR --out FILE.gguf [--type q4_0|q8_0|f32] "
               "[--tokenizer DIR]\n"
               "       gguf_q4 --check FILE.gguf\n"
               "       gguf_q4 --self-test\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *tok = NULL, *check = NULL;
    int big = GGML_T_Q4_0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--self-test")) return self_test();
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        if (!v) return usage(stderr), 2;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--tokenizer"))
            tok = v;
        else if (!strcmp(a, "--check"))
            check = v;
        else if (!strcmp(a, "--type")) {
            if (!strcmp(v, "q4_0"))
                big = GGML_T_Q4_0;
            else if (!strcmp(v, "q8_0"))
                big = GGML_T_Q8_0;
            else if (!strcmp(v, "f32"))
                big = GGML_T_F32;
            else
                return usage(stderr), 2;
        } else {
            return usage(stderr), 2;
        }
        i++;
    }
    if (check) {
        char msg[512];
        if (gguf_check(check, stdout, NULL, NULL, msg, sizeof msg))
            return fprintf(stderr, "gguf_q4: %s\n", msg), 1;
        return 0;
    }
    if (!model || !out) return usage(stderr), 2;
    return convert(model, tok ? tok : model, out, big);
}
