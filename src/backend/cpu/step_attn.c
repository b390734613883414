/* The gated full-attention ops of the step program on the CPU. A chunk writes its K and V
 * straight into the session's cache rows pos .. pos + n - 1; rows write theirs to scratch and
 * copy them into each session's cache at its own position. */
#include <string.h>

#include "backend/cpu/cpu.h"

typedef struct {
    int Nq, Nkv, Dh, qw, kvw, gated;
} attn_dims;

static attn_dims dims(const lily_config *c) {
    attn_dims d;
    d.Nq = c->n_q_heads, d.Nkv = c->n_kv_heads, d.Dh = c->head_dim;
    d.gated = c->attn_output_gate;
    d.qw = d.Nq * d.Dh * (d.gated ? 2 : 1);
    d.kvw = d.Nkv * d.Dh;
    return d;
}

/* qg = big0 [n][qw]; the new k, v: the cache (chunk) or kvnew [n][2 kvw] (rows). */
void cpu_op_attn_proj(lily_backend *b, const cpu_step *st, int l) {
    const lily_layer *ly = &b->m->layers[l];
    const int H = b->m->cfg.hidden;
    const attn_dims d = dims(&b->m->cfg);
    float *kdst, *vdst;
    int ld;
    if (st->rows) {
        kdst = b->kvnew, vdst = b->kvnew + d.kvw, ld = 2 * d.kvw;
    } else {
        kdst = st->s[0]->k[l] + (size_t)st->pos[0] * d.kvw;
        vdst = st->s[0]->v[l] + (size_t)st->pos[0] * d.kvw;
        ld = d.kvw;
    }
    lily_rows_op ops[3] = {{&ly->q_proj, b->a, H, NULL, st->n, b->big0, d.qw},
                           {&ly->k_proj, b->a, H, NULL, st->n, kdst, ld},
                           {&ly->v_proj, b->a, H, NULL, st->n, vdst, ld}};
    cpu_mm_many(b, st, ops, 3);
}

/* q = big1 [n][Nq Dh]: per head rmsnorm and RoPE; k the same, in the cache. */
void cpu_op_attn_qk(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    const attn_dims d = dims(c);
    const float *qg = b->big0;
    float *q = b->big1;
    for (int t = 0; t < st->n; t++) {
        const int row = st->rows ? t : 0, pos = st->rows ? st->pos[t] : st->pos[0] + t;
        for (int h = 0; h < d.Nq; h++) {
            const float *src = qg + (size_t)t * d.qw + (size_t)h * d.Dh * (d.gated ? 2 : 1);
            float *qh = q + (size_t)t * d.Nq * d.Dh + (size_t)h * d.Dh;
            lily_cpu_rmsnorm(src, ly->q_norm, d.Dh, c->rms_eps, qh);
            lily_cpu_rope(qh, c->rope_dim, pos, c->rope_theta);
        }
        float *kc = st->s[row]->k[l] + (size_t)pos * d.kvw;
        const float *knew = st->rows ? b->kvnew + (size_t)t * 2 * d.kvw : kc;
        if (st->rows)
            memcpy(st->s[row]->v[l] + (size_t)pos * d.kvw, knew + d.kvw,
                   (size_t)d.kvw * sizeof(float));
        for (int h = 0; h < d.Nkv; h++) {
            float *kh = kc + (size_t)h * d.Dh;
            lily_cpu_rmsnorm(knew + (size_t)h * d.Dh, ly->k_norm, d.Dh, c->rms_eps, kh);
            lily_cpu_rope(kh, c->rope_dim, pos, c->rope_theta);
        }
    }
}

/* o = big2 [n][Nq Dh]. */
void cpu_op_attn_core(lily_backend *b, const cpu_step *st, int l) {
    const attn_dims d = dims(&b->m->cfg);
    const float scale = 1.0f / sqrtf((float)d.Dh);
    const size_t qo = (size_t)d.Nq * d.Dh;
    if (!st->rows) {
        lily_cpu_attention(&b->kern, b->big1, st->n, st->pos[0], st->s[0]->k[l], st->s[0]->v[l],
                           d.Nq, d.Nkv, d.Dh, scale, b->big2, b->attn_scratch, b->pool);
        return;
    }
    for (int i = 0; i < st->n; i++)
        lily_cpu_attention(&b->kern, b->big1 + i * qo, 1, st->pos[i], st->s[i]->k[l],
                           st->s[i]->v[l], d.Nq, d.Nkv, d.Dh, scale, b->big2 + i * qo,
                           b->attn_scratch, b->pool);
}

void cpu_op_attn_gate(lily_backend *b, const cpu_step *st, int l) {
    (void)l;
    const attn_dims d = dims(&b->m->cfg);
    for (int t = 0; t < st->n; t++)
        for (int h = 0; h < d.Nq; h++) {
            const float *g = b->big0 + (size_t)t * d.qw + (size_t)h * d.Dh * 2 + d.Dh;
            float *oh = b->big2 + (size_t)t * d.Nq * d.Dh + (size_t)h * d.Dh;
            for (int i = 0; i < d.Dh; i++)
                oh[i] *= cpu_sigmoid(g[i]);
        }
}

void cpu_op_attn_out(lily_backend *b, const cpu_step *st, int l) {
    const attn_dims d = dims(&b->m->cfg);
    cpu_mm(b, st, &b->m->layers[l].o_proj, b->big2, d.Nq * d.Dh, b->mix, b->m->cfg.hidden);
}
