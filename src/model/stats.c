/* Per-component sizes, bytes per decoded token and session state sizes; see stats.h. */
#include "model/stats.h"

#include <string.h>

#include "model/bind.h"

static const char *const names[LILY_COMP_N] = {
    [LILY_COMP_EMBED] = "embedding",       [LILY_COMP_LM_HEAD] = "lm_head",
    [LILY_COMP_ATTN] = "attention",        [LILY_COMP_GDN] = "gdn",
    [LILY_COMP_CONV] = "gdn conv",         [LILY_COMP_EXPERTS] = "routed experts",
    [LILY_COMP_SHARED] = "shared experts", [LILY_COMP_ROUTERS] = "routers",
    [LILY_COMP_DENSE] = "dense mlp",       [LILY_COMP_NORMS] = "norms+gdn params",
};

const char *lily_comp_name(lily_comp c) {
    return (unsigned)c < LILY_COMP_N ? names[c] : "?";
}

void lily_model_stats_get(const lily_model *m, lily_model_stats *s) {
    memset(s, 0, sizeof *s);
    const lily_model_priv *p = m->priv;
    const lily_config *c = &m->cfg;
    memcpy(s->params, p->comp_params, sizeof s->params);
    memcpy(s->bytes, p->comp_bytes, sizeof s->bytes);
    /* Every weight is read once per token except the experts (top_k of n_experts, all stored
     * alike) and the embedding (one row; the tied head is counted as the lm_head). */
    uint64_t t = 0;
    for (int i = 0; i < LILY_COMP_N; i++)
        if (i != LILY_COMP_EMBED && i != LILY_COMP_EXPERTS && i != LILY_COMP_LM_HEAD)
            t += s->bytes[i];
    if (c->is_moe && c->n_experts > 0)
        t += s->bytes[LILY_COMP_EXPERTS] / (uint64_t)c->n_experts * (uint64_t)c->top_k;
    t += c->tie_embeddings ? s->bytes[LILY_COMP_EMBED] : s->bytes[LILY_COMP_LM_HEAD];
    t += lily_mat_row_bytes(&m->embed);
    s->bytes_per_token = t;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_is_attn[l])
            s->n_attn++;
        else
            s->n_gdn++;
    }
    s->kv_bytes_per_token = (uint64_t)s->n_attn * 2 * (uint64_t)c->n_kv_heads * c->head_dim * 2;
    uint64_t C = 2ull * c->lin_nk * c->lin_dk + (uint64_t)c->lin_nv * c->lin_dv;
    uint64_t per =
        (uint64_t)c->lin_nv * c->lin_dk * c->lin_dv * 4 + (uint64_t)(c->conv_k - 1) * C * 2;
    s->recurrent_state_bytes = (uint64_t)s->n_gdn * per;
}
