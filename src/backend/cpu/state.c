/* The CPU backend's per-session states: for each full-attention layer an fp32 K and V cache of
 * max_ctx positions, for each Gated DeltaNet layer the last conv_k-1 pre-conv inputs and the fp32
 * recurrent state [Nv][Dk][Dv]. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

static size_t kv_row(const lily_config *c) {
    return (size_t)c->n_kv_heads * c->head_dim;
}
static size_t conv_len(const lily_config *c) {
    return (size_t)(c->conv_k - 1) * (2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv);
}
static size_t s_len(const lily_config *c) {
    return (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
}

size_t cpu_state_bytes(lily_backend *b, int max_ctx) {
    const lily_config *c = &b->m->cfg;
    size_t total = 0;
    for (int l = 0; l < c->n_layers; l++)
        total += c->layer_is_attn[l] ? 2 * (size_t)max_ctx * kv_row(c) * sizeof(float)
                                     : (conv_len(c) + s_len(c)) * sizeof(float);
    return total;
}

void cpu_state_free(lily_backend *b, lily_bstate *s) {
    if (!s) return;
    for (int l = 0; l < b->m->cfg.n_layers; l++) {
        free(s->k[l]), free(s->v[l]), free(s->conv[l]), free(s->S[l]);
    }
    free(s->k), free(s->v), free(s->conv), free(s->S);
    lily_cpu_drawq_free(s->dq);
    free(s);
}

void cpu_state_reset(lily_backend *b, lily_bstate *s) {
    const lily_config *c = &b->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv[l]) memset(s->conv[l], 0, conv_len(c) * sizeof(float));
        if (s->S[l]) memset(s->S[l], 0, s_len(c) * sizeof(float));
    }
}

int cpu_state_create(lily_backend *b, int max_ctx, lily_bstate **out, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (max_ctx < 1) return lily_fail(e, "context size must be at least 1 (got %d)", max_ctx);
    lily_bstate *s = lily_xcalloc(1, sizeof *s);
    int L = c->n_layers;
    s->max_ctx = max_ctx;
    s->k = lily_xcalloc((size_t)L, sizeof(float *));
    s->v = lily_xcalloc((size_t)L, sizeof(float *));
    s->conv = lily_xcalloc((size_t)L, sizeof(float *));
    s->S = lily_xcalloc((size_t)L, sizeof(float *));
    for (int l = 0; l < L; l++) {
        if (c->layer_is_attn[l]) {
            size_t bytes = (size_t)max_ctx * kv_row(c) * sizeof(float);
            s->k[l] = malloc(bytes);
            s->v[l] = malloc(bytes);
            if (!s->k[l] || !s->v[l]) {
                cpu_state_free(b, s);
                return lily_fail(e, "out of memory for a KV cache of %d positions", max_ctx);
            }
        } else {
            s->conv[l] = lily_xcalloc(conv_len(c), sizeof(float));
            s->S[l] = lily_xcalloc(s_len(c), sizeof(float));
        }
    }
    pthread_mutex_lock(&b->mu);
    int need = max_ctx + b->chunk;
    if (need > b->attn_cap) {
        free(b->attn_scratch);
        b->attn_scratch = lily_xaligned(
            (size_t)lily_pool_threads(b->pool) *
            lily_cpu_attention_scratch(c->n_q_heads, c->n_kv_heads, c->head_dim, need) *
            sizeof(float));
        b->attn_cap = need;
    }
    pthread_mutex_unlock(&b->mu);
    *out = s;
    return 0;
}

int cpu_state_copy(lily_backend *b, lily_bstate *dst, const lily_bstate *src, int pos,
                   lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (pos > dst->max_ctx || pos > src->max_ctx)
        return lily_fail(e, "state copy of %d positions exceeds a context of %d", pos,
                         pos > dst->max_ctx ? dst->max_ctx : src->max_ctx);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_is_attn[l]) {
            size_t bytes = (size_t)pos * kv_row(c) * sizeof(float);
            memcpy(dst->k[l], src->k[l], bytes);
            memcpy(dst->v[l], src->v[l], bytes);
        } else {
            memcpy(dst->conv[l], src->conv[l], conv_len(c) * sizeof(float));
            memcpy(dst->S[l], src->S[l], s_len(c) * sizeof(float));
        }
    }
    return 0;
}
