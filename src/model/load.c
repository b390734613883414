/* lily_model_load: config + safetensors set -> a fully bound, validated lily_model (model.h).
 *
 * The layout is detected from the tensor names (HF "model.language_model." or "model.", MLX
 * "language_model.model.") and from the conv1d shape, which tells whether zero-centred norms are
 * stored raw (HF [C,1,K]) or already shifted to 1+w (MLX [C,K,1]), the same test mlx-lm uses.
 * Experts are accepted as per-expert keys, HF fused stacks, or MLX switch_mlp stacks.
 *
 * No access hints are applied to the mappings: the kernel's default readahead suits both the
 * dense weights (read whole every token) and the expert blocks (each expert matrix is a contiguous
 * run of >= 64 KB), while MADV_RANDOM would turn a cold expert read into 4 KB faults. */
#include "model/model.h"
#include "base/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/bind.h"
#include "model/config.h"
#include "model/safetensors.h"

static const struct {
    const char *prefix, *head;
} layouts[] = {
    {"model.language_model.", "lm_head"},
    {"language_model.model.", "language_model.lm_head"},
    {"model.", "lm_head"},
};

typedef struct {
    lily_binder *b;
    const lily_config *c;
    char lp[256]; /* "<prefix>layers.<l>." */
} layer_ctx;

/* Fills buf with the layer prefix + suffix and returns buf. */
static const char *nm(layer_ctx *x, char *buf, size_t len, const char *suffix) {
    snprintf(buf, len, "%s%s", x->lp, suffix);
    return buf;
}

static int bind_attn(layer_ctx *x, lily_layer *L) {
    const lily_config *c = x->c;
    lily_binder *b = x->b;
    char n[512];
    int H = c->hidden, qd = c->n_q_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    b->comp = LILY_COMP_ATTN;
    if (lily_bind_mat(b, nm(x, n, sizeof n, "self_attn.q_proj"), qd * (c->attn_output_gate ? 2 : 1),
                      H, &L->q_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "self_attn.k_proj"), kvd, H, &L->k_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "self_attn.v_proj"), kvd, H, &L->v_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "self_attn.o_proj"), H, qd, &L->o_proj))
        return -1;
    b->comp = LILY_COMP_NORMS;
    if (lily_bind_vec(b, nm(x, n, sizeof n, "self_attn.q_norm.weight"), c->head_dim,
                      !b->shifted_norms, &L->q_norm) ||
        lily_bind_vec(b, nm(x, n, sizeof n, "self_attn.k_norm.weight"), c->head_dim,
                      !b->shifted_norms, &L->k_norm))
        return -1;
    return 0;
}

static int bind_gdn(layer_ctx *x, lily_layer *L) {
    const lily_config *c = x->c;
    lily_binder *b = x->b;
    char n[512];
    int H = c->hidden, kd = c->lin_nk * c->lin_dk, vd = c->lin_nv * c->lin_dv;
    if (!lily_st_find(b->st, nm(x, n, sizeof n, "linear_attn.in_proj_qkv.weight")) &&
        lily_st_find(b->st, nm(x, n, sizeof n, "linear_attn.in_proj_qkvz.weight")))
        return lily_fail(b->err,
                         "%s: tensor \"%s\": the fused qwen3_next in_proj_qkvz layout is "
                         "not supported (expected in_proj_qkv + in_proj_z)",
                         b->dir, n);
    b->comp = LILY_COMP_GDN;
    if (lily_bind_mat(b, nm(x, n, sizeof n, "linear_attn.in_proj_qkv"), 2 * kd + vd, H,
                      &L->qkv_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "linear_attn.in_proj_z"), vd, H, &L->z_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "linear_attn.in_proj_b"), c->lin_nv, H, &L->b_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "linear_attn.in_proj_a"), c->lin_nv, H, &L->a_proj) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "linear_attn.out_proj"), H, vd, &L->out_proj))
        return -1;
    b->comp = LILY_COMP_CONV;
    if (lily_bind_conv(b, nm(x, n, sizeof n, "linear_attn.conv1d.weight"), 2 * kd + vd, c->conv_k,
                       &L->conv_w))
        return -1;
    b->comp = LILY_COMP_NORMS;
    if (lily_bind_vec(b, nm(x, n, sizeof n, "linear_attn.dt_bias"), c->lin_nv, 0, &L->dt_bias) ||
        lily_bind_vec(b, nm(x, n, sizeof n, "linear_attn.A_log"), c->lin_nv, 0, &L->A_log) ||
        lily_bind_vec(b, nm(x, n, sizeof n, "linear_attn.norm.weight"), c->lin_dv, 0, &L->gdn_norm))
        return -1;
    return 0;
}

static int bind_experts(layer_ctx *x, lily_layer *L, int layer) {
    const lily_config *c = x->c;
    lily_binder *b = x->b;
    char n[512], n2[64];
    int E = c->n_experts, I = c->moe_inter, H = c->hidden;
    size_t sz = (size_t)E * sizeof(lily_mat);
    L->exp_gate = lily_binder_own(b, lily_xcalloc(1, sz));
    L->exp_up = lily_binder_own(b, lily_xcalloc(1, sz));
    L->exp_down = lily_binder_own(b, lily_xcalloc(1, sz));
    b->comp = LILY_COMP_EXPERTS;
    if (lily_st_find(b->st, nm(x, n, sizeof n, "mlp.switch_mlp.gate_proj.weight"))) {
        if (lily_bind_stack(b, nm(x, n, sizeof n, "mlp.switch_mlp.gate_proj"), 0, E, I, H,
                            L->exp_gate, NULL) ||
            lily_bind_stack(b, nm(x, n, sizeof n, "mlp.switch_mlp.up_proj"), 0, E, I, H, L->exp_up,
                            NULL) ||
            lily_bind_stack(b, nm(x, n, sizeof n, "mlp.switch_mlp.down_proj"), 0, E, H, I,
                            L->exp_down, NULL))
            return -1;
        return 0;
    }
    if (lily_st_find(b->st, nm(x, n, sizeof n, "mlp.experts.gate_up_proj"))) {
        if (lily_bind_stack(b, n, 1, E, I, H, L->exp_gate, L->exp_up) ||
            lily_bind_stack(b, nm(x, n, sizeof n, "mlp.experts.down_proj"), 1, E, H, I, L->exp_down,
                            NULL))
            return -1;
        return 0;
    }
    if (!lily_st_find(b->st, nm(x, n, sizeof n, "mlp.experts.0.gate_proj.weight")))
        return lily_fail(b->err,
                         "%s: missing the experts of layer %d: none of \"%s\", "
                         "\"%smlp.experts.gate_up_proj\", \"%smlp.switch_mlp.gate_proj.weight\"",
                         b->dir, layer, n, x->lp, x->lp);
    for (int e = 0; e < E; e++) {
        snprintf(n2, sizeof n2, "mlp.experts.%d.gate_proj", e);
        if (lily_bind_mat(b, nm(x, n, sizeof n, n2), I, H, &L->exp_gate[e])) return -1;
        snprintf(n2, sizeof n2, "mlp.experts.%d.up_proj", e);
        if (lily_bind_mat(b, nm(x, n, sizeof n, n2), I, H, &L->exp_up[e])) return -1;
        snprintf(n2, sizeof n2, "mlp.experts.%d.down_proj", e);
        if (lily_bind_mat(b, nm(x, n, sizeof n, n2), H, I, &L->exp_down[e])) return -1;
    }
    return 0;
}

static int bind_ffn(layer_ctx *x, lily_layer *L, int layer) {
    const lily_config *c = x->c;
    lily_binder *b = x->b;
    char n[512];
    int H = c->hidden;
    if (!c->is_moe) {
        b->comp = LILY_COMP_DENSE;
        if (lily_bind_mat(b, nm(x, n, sizeof n, "mlp.gate_proj"), c->intermediate, H,
                          &L->mlp_gate) ||
            lily_bind_mat(b, nm(x, n, sizeof n, "mlp.up_proj"), c->intermediate, H, &L->mlp_up) ||
            lily_bind_mat(b, nm(x, n, sizeof n, "mlp.down_proj"), H, c->intermediate, &L->mlp_down))
            return -1;
        return 0;
    }
    b->comp = LILY_COMP_ROUTERS;
    if (lily_bind_mat(b, nm(x, n, sizeof n, "mlp.gate"), c->n_experts, H, &L->router) ||
        bind_experts(x, L, layer))
        return -1;
    if (c->shared_inter == 0) return 0;
    int Is = c->shared_inter;
    b->comp = LILY_COMP_SHARED;
    if (lily_bind_mat(b, nm(x, n, sizeof n, "mlp.shared_expert.gate_proj"), Is, H, &L->sh_gate) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "mlp.shared_expert.up_proj"), Is, H, &L->sh_up) ||
        lily_bind_mat(b, nm(x, n, sizeof n, "mlp.shared_expert.down_proj"), H, Is, &L->sh_down))
        return -1;
    b->comp = LILY_COMP_ROUTERS;
    return lily_bind_mat(b, nm(x, n, sizeof n, "mlp.shared_expert_gate"), 1, H, &L->sh_gate_w);
}

static int bind_layer(lily_binder *b, const lily_config *c, const char *prefix, int l,
                      lily_layer *L) {
    layer_ctx x = {b, c, {0}};
    char n[512];
    snprintf(x.lp, sizeof x.lp, "%slayers.%d.", prefix, l);
    L->is_attn = c->layer_is_attn[l];
    b->comp = LILY_COMP_NORMS;
    if (lily_bind_vec(b, nm(&x, n, sizeof n, "input_layernorm.weight"), c->hidden,
                      !b->shifted_norms, &L->in_norm) ||
        lily_bind_vec(b, nm(&x, n, sizeof n, "post_attention_layernorm.weight"), c->hidden,
                      !b->shifted_norms, &L->post_norm))
        return -1;
    if (L->is_attn ? bind_attn(&x, L) : bind_gdn(&x, L)) return -1;
    return bind_ffn(&x, L, l);
}

/* Whether zero-centred norms are stored shifted: decided by the first GDN conv's shape. */
static int detect_shifted(const lily_st_set *st, const lily_config *c, int li) {
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_is_attn[l]) continue;
        char n[512];
        snprintf(n, sizeof n, "%slayers.%d.linear_attn.conv1d.weight", layouts[li].prefix, l);
        const lily_st_tensor *t = lily_st_find(st, n);
        if (t && t->ndim == 3 && t->shape[1] == 1 && t->shape[2] > 1) return 0;
        if (t && t->ndim == 3 && t->shape[2] == 1 && t->shape[1] > 1) return 1;
        break;
    }
    char n[512];
    snprintf(n, sizeof n, "%sembed_tokens.scales", layouts[li].prefix);
    return li == 1 || lily_st_find(st, n) != NULL;
}

static void set_quant(lily_model *m, const lily_binder *b) {
    unsigned s = b->dtypes_seen;
    unsigned q = s & ((1u << LILY_DT_Q4) | (1u << LILY_DT_Q8));
    if (q) {
        int bits = b->q && b->q->present ? b->q->bits : q == (1u << LILY_DT_Q8) ? 8 : 4;
        snprintf(m->quant, sizeof m->quant, "mlx-%dbit", bits);
    } else if (s == (1u << LILY_DT_BF16)) {
        snprintf(m->quant, sizeof m->quant, "bf16");
    } else if (s == (1u << LILY_DT_F32)) {
        snprintf(m->quant, sizeof m->quant, "f32");
    } else if (s == (1u << LILY_DT_F16)) {
        snprintf(m->quant, sizeof m->quant, "f16");
    } else {
        snprintf(m->quant, sizeof m->quant, "mixed");
    }
}

/* Biases are not part of the architecture; refusing them in the decoder layers beats silently
 * ignoring them. */
static int check_no_bias(const lily_st_set *st, const char *prefix, lily_err *err) {
    char lp[64];
    snprintf(lp, sizeof lp, "%slayers.", prefix);
    size_t pl = strlen(lp);
    for (int i = 0; i < lily_st_count(st); i++) {
        const lily_st_tensor *t = lily_st_at(st, i);
        size_t l = strlen(t->name);
        if (!strncmp(t->name, lp, pl) && l > 5 && !strcmp(t->name + l - 5, ".bias"))
            return lily_fail(err,
                             "%s: tensor \"%s\": linear biases are not supported by this "
                             "architecture",
                             lily_st_path_of(st, t), t->name);
    }
    return 0;
}

static int load(const char *dir, lily_model *m, lily_model_priv *p, lily_err *err) {
    lily_config *c = &m->cfg;
    lily_qconfig q;
    if (lily_config_load(dir, c, &q, err)) return -1;
    int rc = lily_st_set_open(dir, &p->st, err);
    int li = -1;
    for (int i = 0; rc == 0 && i < (int)(sizeof layouts / sizeof layouts[0]) && li < 0; i++) {
        char n[512];
        snprintf(n, sizeof n, "%sembed_tokens.weight", layouts[i].prefix);
        if (lily_st_find(p->st, n)) li = i;
    }
    if (rc == 0 && li < 0)
        rc = lily_fail(err,
                       "%s: no embedding tensor (model.language_model.embed_tokens.weight, "
                       "language_model.model.embed_tokens.weight or model.embed_tokens.weight)",
                       dir);
    if (rc == 0 && !strcmp(c->model_type, "qwen3_next"))
        rc = lily_fail(err,
                       "%s: model_type qwen3_next: its fused in_proj_qkvz/in_proj_ba layout "
                       "is not supported yet",
                       dir);
    if (rc) {
        lily_qconfig_free(&q);
        return -1;
    }
    const char *prefix = layouts[li].prefix;
    if (check_no_bias(p->st, prefix, err)) {
        lily_qconfig_free(&q);
        return -1;
    }
    lily_binder b = {.st = p->st, .q = &q, .dir = dir, .err = err};
    b.shifted_norms = detect_shifted(p->st, c, li);
    snprintf(m->layout, sizeof m->layout, "%s", b.shifted_norms ? "mlx" : "hf");
    char n[512];
    snprintf(n, sizeof n, "%sembed_tokens", prefix);
    b.comp = LILY_COMP_EMBED;
    rc = lily_bind_mat(&b, n, -1, c->hidden, &m->embed);
    if (rc == 0) {
        if (c->vocab && c->vocab != m->embed.rows)
            rc = lily_fail(err,
                           "%s: tensor \"%s.weight\" has %d rows but config.json vocab_size "
                           "is %d",
                           dir, n, m->embed.rows, c->vocab);
        c->vocab = m->embed.rows;
    }
    if (rc == 0 && c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if (rc == 0) {
        b.comp = LILY_COMP_LM_HEAD;
        rc = lily_bind_mat(&b, layouts[li].head, c->vocab, c->hidden, &m->lm_head);
    }
    for (int i = 0; rc == 0 && i < 4 && c->eos_ids[i] >= 0; i++)
        if (c->eos_ids[i] >= c->vocab)
            rc = lily_fail(err, "%s/config.json: eos_token_id %d is outside the vocabulary (%d)",
                           dir, c->eos_ids[i], c->vocab);
    b.comp = LILY_COMP_NORMS;
    snprintf(n, sizeof n, "%snorm.weight", prefix);
    if (rc == 0) rc = lily_bind_vec(&b, n, c->hidden, !b.shifted_norms, &m->final_norm);
    if (rc == 0)
        m->layers = lily_binder_own(&b, lily_xcalloc((size_t)c->n_layers, sizeof *m->layers));
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        rc = bind_layer(&b, c, prefix, l, &m->layers[l]);
    if (rc == 0) {
        set_quant(m, &b);
        m->n_params = b.n_params;
        m->weight_bytes = b.weight_bytes;
        memcpy(p->comp_params, b.comp_params, sizeof p->comp_params);
        memcpy(p->comp_bytes, b.comp_bytes, sizeof p->comp_bytes);
    }
    p->owned = b.owned;
    p->n_owned = b.n_owned;
    lily_qconfig_free(&q);
    return rc;
}

int lily_model_load(const char *dir, lily_model **out, lily_err *err) {
    *out = NULL;
    lily_model *m = lily_xcalloc(1, sizeof *m);
    lily_model_priv *p = lily_xcalloc(1, sizeof *p);
    m->priv = p;
    if (load(dir, m, p, err)) {
        lily_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void lily_model_free(lily_model *m) {
    if (!m) return;
    lily_model_priv *p = m->priv;
    if (p) {
        lily_binder_free_owned(p->owned, p->n_owned);
        lily_st_set_free(p->st);
        free(p);
    }
    free(m);
}

uint64_t lily_model_file_bytes(const lily_model *m) {
    const lily_model_priv *p = m->priv;
    uint64_t n = 0;
    for (int i = 0; p && i < lily_st_n_files(p->st); i++)
        n += lily_st_file_at(p->st, i)->map.size;
    return n;
}

void lily_model_prefault(const lily_model *m, void (*progress)(void *, uint64_t, uint64_t),
                         void *ud) {
    const lily_model_priv *p = m->priv;
    const size_t step = (size_t)64 << 20;
    uint64_t total = lily_model_file_bytes(m), done = 0;
    for (int i = 0; p && i < lily_st_n_files(p->st); i++) {
        const lily_mmap *map = &lily_st_file_at(p->st, i)->map;
        for (size_t off = 0; off < map->size; off += step) {
            size_t len = map->size - off < step ? map->size - off : step;
            lily_mmap_prefault_range(map, off, len);
            done += len;
            if (progress && done < total) progress(ud, done, total);
        }
    }
    if (progress) progress(ud, total, total);
}

uint64_t lily_mat_row_bytes(const lily_mat *m) {
    switch (m->dt) {
    case LILY_DT_F32: return 4ull * (uint64_t)m->cols;
    case LILY_DT_BF16:
    case LILY_DT_F16: return 2ull * (uint64_t)m->cols;
    case LILY_DT_Q4:
    case LILY_DT_Q8: {
        int bits = m->dt == LILY_DT_Q4 ? 4 : 8;
        return (uint64_t)m->cols * (uint64_t)bits / 8 + 4ull * (uint64_t)(m->cols / m->group);
    }
    }
    return 0;
}
