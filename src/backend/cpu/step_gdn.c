/* The Gated DeltaNet ops of the step program on the CPU. A chunk runs its n tokens in order on
 * one session's conv and recurrent states; rows run one token each on their own session's. */
#include "backend/cpu/cpu.h"

typedef struct {
    int Nk, Nv, Dk, Dv, C, Z;
} gdn_dims;

static gdn_dims dims(const lily_config *c) {
    gdn_dims d;
    d.Nk = c->lin_nk, d.Nv = c->lin_nv, d.Dk = c->lin_dk, d.Dv = c->lin_dv;
    d.C = 2 * d.Nk * d.Dk + d.Nv * d.Dv;
    d.Z = d.Nv * d.Dv;
    return d;
}

/* qkv = big0 [n][C], z = big2 [n][Z], b = small0 [n][Nv], a = small1 [n][Nv]. */
void cpu_op_gdn_proj(lily_backend *b, const cpu_step *st, int l) {
    const lily_layer *ly = &b->m->layers[l];
    const int H = b->m->cfg.hidden;
    const gdn_dims d = dims(&b->m->cfg);
    lily_rows_op ops[4] = {{&ly->qkv_proj, b->a, H, NULL, st->n, b->big0, d.C},
                           {&ly->z_proj, b->a, H, NULL, st->n, b->big2, d.Z},
                           {&ly->b_proj, b->a, H, NULL, st->n, b->small0, d.Nv},
                           {&ly->a_proj, b->a, H, NULL, st->n, b->small1, d.Nv}};
    cpu_mm_many(b, st, ops, 4);
}

/* cv = big1 [n][C]. */
void cpu_op_gdn_conv(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const float *w = b->m->layers[l].conv_w;
    const gdn_dims d = dims(c);
    if (!st->rows) {
        lily_cpu_conv_silu_isa(b->kern.isa, b->big0, st->n, d.C, c->conv_k, st->s[0]->conv[l], w,
                               b->big1);
        return;
    }
    for (int i = 0; i < st->n; i++)
        lily_cpu_conv_silu_isa(b->kern.isa, b->big0 + (size_t)i * d.C, 1, d.C, c->conv_k,
                               st->s[i]->conv[l], w, b->big1 + (size_t)i * d.C);
}

typedef struct {
    const cpu_step *st;
    gdn_dims d;
    int l, tokens;           /* tokens per task: the chunk's n, or 1 for rows */
    const float *conv_out;   /* [n][C] */
    const float *beta, *lam; /* [n][Nv] */
    float *o;                /* [n][Z] */
    int isa;                 /* the kernel set's (lily_cpu_gdn_scan_isa) */
} gdn_job;

/* Task j: value head j % Nv of row j / Nv (rows), or of the chunk (j < Nv). */
static void gdn_head_task(void *ctx, int j, int thread) {
    (void)thread;
    const gdn_job *g = ctx;
    const gdn_dims *d = &g->d;
    const int row = j / d->Nv, h = j % d->Nv, i = h / (d->Nv / d->Nk);
    float *S = g->st->s[row]->S[g->l] + (size_t)h * d->Dk * d->Dv;
    const float *cv = g->conv_out + (size_t)row * d->C;
    lily_cpu_gdn_scan_isa(g->isa, S, d->Dk, d->Dv, g->tokens, cv + (size_t)i * d->Dk, d->C,
                          cv + (size_t)d->Nk * d->Dk + (size_t)i * d->Dk, d->C,
                          cv + (size_t)2 * d->Nk * d->Dk + (size_t)h * d->Dv, d->C,
                          g->beta + (size_t)row * d->Nv + h, g->lam + (size_t)row * d->Nv + h,
                          d->Nv, g->o + (size_t)row * d->Z + (size_t)h * d->Dv, d->Z);
}

static void l2norm_scaled(float *x, int n, float scale) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = scale / sqrtf((float)ss + 1e-6f);
    for (int i = 0; i < n; i++)
        x[i] *= r;
}

static float softplusf(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* The recurrence; its output o = big0 [n][Z] (over qkv, no longer needed). */
void cpu_op_gdn_recur(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    const gdn_dims d = dims(c);
    float *cv = b->big1, *bb = b->small0, *aa = b->small1;
    const float qscale = 1.0f / sqrtf((float)d.Dk);
    for (int t = 0; t < st->n; t++) {
        float *row = cv + (size_t)t * d.C;
        for (int i = 0; i < d.Nk; i++) {
            l2norm_scaled(row + (size_t)i * d.Dk, d.Dk, qscale);
            l2norm_scaled(row + (size_t)d.Nk * d.Dk + (size_t)i * d.Dk, d.Dk, 1.0f);
        }
        for (int j = 0; j < d.Nv; j++) {
            float *bj = bb + (size_t)t * d.Nv + j, *aj = aa + (size_t)t * d.Nv + j;
            float g = -expf(ly->A_log[j]) * softplusf(*aj + ly->dt_bias[j]);
            *bj = cpu_sigmoid(*bj); /* beta */
            *aj = expf(g);          /* per-step decay lambda */
        }
    }
    gdn_job job = {st, d, l, st->rows ? 1 : st->n, cv, bb, aa, b->big0, b->kern.isa};
    lily_pool_run(b->pool, gdn_head_task, &job, (st->rows ? st->n : 1) * d.Nv);
}

void cpu_op_gdn_gate(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    const gdn_dims d = dims(c);
    for (int t = 0; t < st->n; t++)
        for (int j = 0; j < d.Nv; j++) {
            float *oj = b->big0 + (size_t)t * d.Z + (size_t)j * d.Dv;
            const float *zj = b->big2 + (size_t)t * d.Z + (size_t)j * d.Dv;
            lily_cpu_rmsnorm(oj, ly->gdn_norm, d.Dv, c->rms_eps, oj);
            for (int k = 0; k < d.Dv; k++)
                oj[k] *= lily_silu(zj[k]);
        }
}

void cpu_op_gdn_out(lily_backend *b, const cpu_step *st, int l) {
    const gdn_dims d = dims(&b->m->cfg);
    cpu_mm(b, st, &b->m->layers[l].out_proj, b->big0, d.Z, b->mix, b->m->cfg.hidden);
}
