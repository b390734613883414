/* The CPU backend: the reference implementation of the backend contract (backend.h).
 *
 * One forward call runs a chunk of n tokens through every layer (n = 1 is a decode step). The
 * residual stream and all activations are fp32; weights are applied in their stored format by
 * lily_cpu_matmul. Per session the state holds, for each full-attention layer, an fp32 K and V
 * cache of max_ctx positions, and for each Gated DeltaNet layer the last conv_k-1 pre-conv inputs
 * and the fp32 recurrent state [Nv][Dk][Dv]. Scratch for a chunk lives in the backend and is
 * sized once at open, so steady-state steps allocate nothing. Calls on one backend are
 * serialised by a mutex (the scratch is shared). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/draw.h"
#include "backend/cpu/ops.h"
#include "base/err.h"
#include "base/file.h"
#include "base/pool.h"

struct lily_backend {
    const lily_model *m;
    lily_pool *pool;
    lily_cpu_kern kern; /* the kernels' instruction set and precision (the engine's options) */
    int chunk;          /* max tokens per forward */
    pthread_mutex_t mu;
    /* scratch, [chunk][...] each */
    float *x, *a, *mix, *tmp;         /* [H] residual, normed input, mixer output, MoE output */
    float *big0, *big1, *big2;        /* [maxw] projections */
    float *small0, *small1;           /* [maxs] per-head gates, router logits */
    float *ex_x, *ex_g, *ex_u, *ex_d; /* expert gather [H], gate/up [I], down out [H] */
    int *route_idx;                   /* [chunk][k] */
    float *route_wt;                  /* [chunk][k] */
    int *ex_count, *ex_off, *ex_rows; /* [E], [E+1], [chunk*k] */
    float *ex_rw;                     /* [chunk*k] routing weight per gathered row */
    float *dec_g, *dec_u, *dec_d;     /* one-token MoE: [k+1][max(I, Is)] x2, [k+1][H] */
    float *attn_scratch;              /* [threads][attn_cap] */
    int attn_cap;
};

struct lily_bstate {
    int max_ctx;
    float **k, **v;     /* [L] of [max_ctx][Nkv*Dh] (attention layers) */
    float **conv;       /* [L] of [conv_k-1][C_qkv] (GDN layers) */
    float **S;          /* [L] of [Nv][Dk][Dv] (GDN layers) */
    lily_cpu_drawq *dq; /* pipelined draws (the draw ops), made by the first one */
};

static int imax(int a, int b) {
    return a > b ? a : b;
}

static int cpu_open(const lily_model *m, const lily_engine_opts *opts, lily_backend **out,
                    lily_err *e) {
    if (opts->prefill_chunk < 1)
        return lily_fail(e, "prefill chunk of %d tokens", opts->prefill_chunk);
    const lily_config *c = &m->cfg;
    lily_backend *b = lily_xcalloc(1, sizeof *b);
    b->m = m;
    b->pool = lily_pool_create(opts->n_threads);
    b->kern = lily_cpu_kern_for(opts->cpu_isa, opts->precision);
    b->chunk = opts->prefill_chunk;
    pthread_mutex_init(&b->mu, NULL);
    /* Weights are read in place from the mapping. When they fit comfortably in memory, map every
     * page now: otherwise each expert's first use costs thousands of page faults, which
     * dominates decode for the first few hundred tokens. */
    unsigned long long ram = lily_phys_mem();
    void (*progress)(void *, uint64_t, uint64_t) = opts ? opts->progress : NULL;
    void *pud = opts ? opts->progress_ud : NULL;
    if (ram && m->weight_bytes < ram / 10 * 9) {
        lily_model_prefault(m, progress, pud);
    } else if (progress) { /* mapped, read on first use: nothing to wait for */
        uint64_t total = lily_model_file_bytes(m);
        progress(pud, total, total);
    }
    int n = b->chunk, H = c->hidden;
    int C = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
    int maxw = imax(imax(c->n_q_heads * c->head_dim * 2, C), imax(c->lin_nv * c->lin_dv, H));
    maxw = imax(maxw, imax(c->shared_inter, c->intermediate));
    int maxs = imax(imax(c->n_experts, c->lin_nv), 1);
    size_t fn = (size_t)n;
    b->x = lily_xaligned(fn * H * sizeof(float));
    b->a = lily_xaligned(fn * H * sizeof(float));
    b->mix = lily_xaligned(fn * H * sizeof(float));
    b->tmp = lily_xaligned(fn * H * sizeof(float));
    b->big0 = lily_xaligned(fn * maxw * sizeof(float));
    b->big1 = lily_xaligned(fn * maxw * sizeof(float));
    b->big2 = lily_xaligned(fn * maxw * sizeof(float));
    b->small0 = lily_xaligned(fn * maxs * sizeof(float));
    b->small1 = lily_xaligned(fn * maxs * sizeof(float));
    if (c->is_moe) {
        int k = c->top_k, I = c->moe_inter;
        b->ex_x = lily_xaligned(fn * H * sizeof(float));
        b->ex_g = lily_xaligned(fn * I * sizeof(float));
        b->ex_u = lily_xaligned(fn * I * sizeof(float));
        b->ex_d = lily_xaligned(fn * H * sizeof(float));
        b->route_idx = lily_xmalloc(fn * k * sizeof(int));
        b->route_wt = lily_xmalloc(fn * k * sizeof(float));
        b->ex_count = lily_xmalloc((size_t)c->n_experts * sizeof(int));
        b->ex_off = lily_xmalloc(((size_t)c->n_experts + 1) * sizeof(int));
        b->ex_rows = lily_xmalloc(fn * k * sizeof(int));
        b->ex_rw = lily_xmalloc(fn * k * sizeof(float));
        size_t wi = (size_t)imax(I, c->shared_inter);
        b->dec_g = lily_xaligned((size_t)(k + 1) * wi * sizeof(float));
        b->dec_u = lily_xaligned((size_t)(k + 1) * wi * sizeof(float));
        b->dec_d = lily_xaligned((size_t)(k + 1) * H * sizeof(float));
    }
    *out = b;
    return 0;
}

static void cpu_close(lily_backend *b) {
    if (!b) return;
    lily_pool_free(b->pool);
    pthread_mutex_destroy(&b->mu);
    free(b->x), free(b->a), free(b->mix), free(b->tmp);
    free(b->big0), free(b->big1), free(b->big2), free(b->small0), free(b->small1);
    free(b->ex_x), free(b->ex_g), free(b->ex_u), free(b->ex_d);
    free(b->route_idx), free(b->route_wt), free(b->ex_count), free(b->ex_off);
    free(b->ex_rows), free(b->ex_rw), free(b->attn_scratch);
    free(b->dec_g), free(b->dec_u), free(b->dec_d);
    free(b);
}

static size_t kv_row(const lily_config *c) {
    return (size_t)c->n_kv_heads * c->head_dim;
}
static size_t conv_len(const lily_config *c) {
    return (size_t)(c->conv_k - 1) * (2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv);
}
static size_t s_len(const lily_config *c) {
    return (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
}

static size_t cpu_state_bytes(lily_backend *b, int max_ctx) {
    const lily_config *c = &b->m->cfg;
    size_t total = 0;
    for (int l = 0; l < c->n_layers; l++)
        total += c->layer_is_attn[l] ? 2 * (size_t)max_ctx * kv_row(c) * sizeof(float)
                                     : (conv_len(c) + s_len(c)) * sizeof(float);
    return total;
}

static void cpu_state_free(lily_backend *b, lily_bstate *s) {
    if (!s) return;
    for (int l = 0; l < b->m->cfg.n_layers; l++) {
        free(s->k[l]), free(s->v[l]), free(s->conv[l]), free(s->S[l]);
    }
    free(s->k), free(s->v), free(s->conv), free(s->S);
    lily_cpu_drawq_free(s->dq);
    free(s);
}

static void cpu_state_reset(lily_backend *b, lily_bstate *s) {
    const lily_config *c = &b->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv[l]) memset(s->conv[l], 0, conv_len(c) * sizeof(float));
        if (s->S[l]) memset(s->S[l], 0, s_len(c) * sizeof(float));
    }
}

static int cpu_state_create(lily_backend *b, int max_ctx, lily_bstate **out, lily_err *e) {
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

static int cpu_state_copy(lily_backend *b, lily_bstate *dst, const lily_bstate *src, int pos,
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

/* ---- layers ----------------------------------------------------------------------------------- */

static inline float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

static void attn_layer(lily_backend *b, lily_bstate *s, int l, int n, int pos) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    int Nq = c->n_q_heads, Nkv = c->n_kv_heads, Dh = c->head_dim, H = c->hidden;
    int gated = c->attn_output_gate;
    int qw = Nq * Dh * (gated ? 2 : 1), kvw = Nkv * Dh;
    float *qg = b->big0, *q = b->big1, *o = b->big2;
    float *kc = s->k[l], *vc = s->v[l];
    /* K and V go straight into the cache rows pos..pos+n-1 */
    if (n == 1) { /* one parallel job for the three products of one token */
        lily_mm_op ops[3] = {{&ly->q_proj, b->a, qg},
                             {&ly->k_proj, b->a, kc + (size_t)pos * kvw},
                             {&ly->v_proj, b->a, vc + (size_t)pos * kvw}};
        lily_cpu_matmul_many(&b->kern, ops, 3, b->pool);
    } else {
        lily_cpu_matmul(&b->kern, &ly->q_proj, b->a, n, H, qg, qw, b->pool);
        float *kdst = kc + (size_t)pos * kvw, *vdst = vc + (size_t)pos * kvw;
        lily_cpu_matmul(&b->kern, &ly->k_proj, b->a, n, H, kdst, kvw, b->pool);
        lily_cpu_matmul(&b->kern, &ly->v_proj, b->a, n, H, vdst, kvw, b->pool);
    }
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < Nq; h++) {
            const float *src = qg + (size_t)t * qw + (size_t)h * Dh * (gated ? 2 : 1);
            float *qh = q + (size_t)t * Nq * Dh + (size_t)h * Dh;
            lily_cpu_rmsnorm(src, ly->q_norm, Dh, c->rms_eps, qh);
            lily_cpu_rope(qh, c->rope_dim, pos + t, c->rope_theta);
        }
        for (int h = 0; h < Nkv; h++) {
            float *kh = kc + (size_t)(pos + t) * kvw + (size_t)h * Dh;
            lily_cpu_rmsnorm(kh, ly->k_norm, Dh, c->rms_eps, kh);
            lily_cpu_rope(kh, c->rope_dim, pos + t, c->rope_theta);
        }
    }
    lily_cpu_attention(&b->kern, q, n, pos, kc, vc, Nq, Nkv, Dh, 1.0f / sqrtf((float)Dh), o,
                       b->attn_scratch, b->pool);
    if (gated) {
        for (int t = 0; t < n; t++)
            for (int h = 0; h < Nq; h++) {
                const float *g = qg + (size_t)t * qw + (size_t)h * Dh * 2 + Dh;
                float *oh = o + (size_t)t * Nq * Dh + (size_t)h * Dh;
                for (int i = 0; i < Dh; i++)
                    oh[i] *= sigmoidf(g[i]);
            }
    }
    lily_cpu_matmul(&b->kern, &ly->o_proj, o, n, Nq * Dh, b->mix, H, b->pool);
}

typedef struct {
    lily_backend *b;
    lily_bstate *s;
    int l, n;
    const float *conv_out;   /* [n][C] */
    const float *beta, *lam; /* [n][Nv] */
    float *o;                /* [n][Nv*Dv] */
} gdn_job;

static void gdn_head_task(void *ctx, int j, int thread) {
    (void)thread;
    gdn_job *g = ctx;
    const lily_config *c = &g->b->m->cfg;
    int Nk = c->lin_nk, Nv = c->lin_nv, Dk = c->lin_dk, Dv = c->lin_dv;
    int C = 2 * Nk * Dk + Nv * Dv;
    int i = j / (Nv / Nk);
    float *S = g->s->S[g->l] + (size_t)j * Dk * Dv;
    lily_cpu_gdn_scan(S, Dk, Dv, g->n, g->conv_out + (size_t)i * Dk, C,
                      g->conv_out + (size_t)Nk * Dk + (size_t)i * Dk, C,
                      g->conv_out + (size_t)2 * Nk * Dk + (size_t)j * Dv, C, g->beta + j,
                      g->lam + j, Nv, g->o + (size_t)j * Dv, Nv * Dv);
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

static void gdn_layer(lily_backend *b, lily_bstate *s, int l, int n) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    int H = c->hidden, Nk = c->lin_nk, Nv = c->lin_nv, Dk = c->lin_dk, Dv = c->lin_dv;
    int C = 2 * Nk * Dk + Nv * Dv, Z = Nv * Dv;
    float *qkv = b->big0, *cv = b->big1, *z = b->big2;
    float *bb = b->small0, *aa = b->small1;
    if (n == 1) { /* one parallel job for the four products of one token */
        lily_mm_op ops[4] = {{&ly->qkv_proj, b->a, qkv},
                             {&ly->z_proj, b->a, z},
                             {&ly->b_proj, b->a, bb},
                             {&ly->a_proj, b->a, aa}};
        lily_cpu_matmul_many(&b->kern, ops, 4, b->pool);
    } else {
        lily_cpu_matmul(&b->kern, &ly->qkv_proj, b->a, n, H, qkv, C, b->pool);
        lily_cpu_matmul(&b->kern, &ly->z_proj, b->a, n, H, z, Z, b->pool);
        lily_cpu_matmul(&b->kern, &ly->b_proj, b->a, n, H, bb, Nv, b->pool);
        lily_cpu_matmul(&b->kern, &ly->a_proj, b->a, n, H, aa, Nv, b->pool);
    }
    lily_cpu_conv_silu(qkv, n, C, c->conv_k, s->conv[l], ly->conv_w, cv);
    float qscale = 1.0f / sqrtf((float)Dk);
    for (int t = 0; t < n; t++) {
        float *row = cv + (size_t)t * C;
        for (int i = 0; i < Nk; i++) {
            l2norm_scaled(row + (size_t)i * Dk, Dk, qscale);
            l2norm_scaled(row + (size_t)Nk * Dk + (size_t)i * Dk, Dk, 1.0f);
        }
        for (int j = 0; j < Nv; j++) {
            float *bj = bb + (size_t)t * Nv + j, *aj = aa + (size_t)t * Nv + j;
            float g = -expf(ly->A_log[j]) * softplusf(*aj + ly->dt_bias[j]);
            *bj = sigmoidf(*bj); /* beta */
            *aj = expf(g);       /* per-step decay lambda */
        }
    }
    /* the recurrence writes its output over qkv (no longer needed) */
    float *o = qkv;
    gdn_job job = {b, s, l, n, cv, bb, aa, o};
    lily_pool_run(b->pool, gdn_head_task, &job, Nv);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < Nv; j++) {
            float *oj = o + (size_t)t * Z + (size_t)j * Dv;
            const float *zj = z + (size_t)t * Z + (size_t)j * Dv;
            lily_cpu_rmsnorm(oj, ly->gdn_norm, Dv, c->rms_eps, oj);
            for (int d = 0; d < Dv; d++)
                oj[d] *= lily_silu(zj[d]);
        }
    lily_cpu_matmul(&b->kern, &ly->out_proj, o, n, Z, b->mix, H, b->pool);
}

/* SwiGLU: out[t] = down(silu(gate x) * up x) for n rows of x. */
static void swiglu(lily_backend *b, const lily_mat *gate, const lily_mat *up, const lily_mat *down,
                   const float *x, int n, float *g, float *u, float *out) {
    int H = b->m->cfg.hidden, I = gate->rows;
    if (!lily_cpu_matmul_glu(&b->kern, gate, up, x, n, H, g, I, b->pool)) {
        lily_cpu_matmul(&b->kern, gate, x, n, H, g, I, b->pool);
        lily_cpu_matmul(&b->kern, up, x, n, H, u, I, b->pool);
        for (size_t i = 0; i < (size_t)n * I; i++)
            g[i] = lily_silu(g[i]) * u[i];
    }
    lily_cpu_matmul(&b->kern, down, g, n, I, out, H, b->pool);
}

/* One token through the routed experts and the shared expert: all gate/up products in one
 * parallel job, all down products in another (a decode step would otherwise synchronise the
 * pool 3 times per expert). */
static void moe_one_token(lily_backend *b, const lily_layer *ly, const int *idx, const float *wt,
                          float *out) {
    const lily_config *c = &b->m->cfg;
    int H = c->hidden, k = c->top_k, I = c->moe_inter, Is = c->shared_inter;
    int wi = imax(I, Is), has_sh = Is > 0;
    lily_mm_op ops[2 * 64 + 3];
    int n_ops = 0;
    for (int j = 0; j < k; j++) {
        ops[n_ops++] = (lily_mm_op){&ly->exp_gate[idx[j]], b->a, b->dec_g + (size_t)j * wi};
        ops[n_ops++] = (lily_mm_op){&ly->exp_up[idx[j]], b->a, b->dec_u + (size_t)j * wi};
    }
    float sg = 0;
    if (has_sh) {
        ops[n_ops++] = (lily_mm_op){&ly->sh_gate, b->a, b->dec_g + (size_t)k * wi};
        ops[n_ops++] = (lily_mm_op){&ly->sh_up, b->a, b->dec_u + (size_t)k * wi};
        ops[n_ops++] = (lily_mm_op){&ly->sh_gate_w, b->a, &sg};
    }
    lily_cpu_matmul_many(&b->kern, ops, n_ops, b->pool);
    for (int j = 0; j < k + has_sh; j++) {
        int w = j < k ? I : Is;
        float *g = b->dec_g + (size_t)j * wi, *u = b->dec_u + (size_t)j * wi;
        for (int i = 0; i < w; i++)
            g[i] = lily_silu(g[i]) * u[i];
    }
    n_ops = 0;
    for (int j = 0; j < k; j++)
        ops[n_ops++] = (lily_mm_op){&ly->exp_down[idx[j]], b->dec_g + (size_t)j * wi,
                                    b->dec_d + (size_t)j * H};
    if (has_sh)
        ops[n_ops++] =
            (lily_mm_op){&ly->sh_down, b->dec_g + (size_t)k * wi, b->dec_d + (size_t)k * H};
    lily_cpu_matmul_many(&b->kern, ops, n_ops, b->pool);
    if (has_sh) {
        float gte = sigmoidf(sg);
        const float *d = b->dec_d + (size_t)k * H;
        for (int i = 0; i < H; i++)
            out[i] = gte * d[i];
    } else {
        memset(out, 0, (size_t)H * sizeof(float));
    }
    /* ascending expert order, like the prefill path, so both sum in the same order */
    for (int e = 0; e < c->n_experts; e++)
        for (int j = 0; j < k; j++)
            if (idx[j] == e) {
                const float *d = b->dec_d + (size_t)j * H;
                for (int i = 0; i < H; i++)
                    out[i] += wt[j] * d[i];
            }
}

static void moe_layer(lily_backend *b, int l, int n) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    int H = c->hidden, E = c->n_experts, k = c->top_k;
    float *out = b->tmp;
    if (!c->is_moe) {
        swiglu(b, &ly->mlp_gate, &ly->mlp_up, &ly->mlp_down, b->a, n, b->big0, b->big1, out);
        return;
    }
    float *logits = b->small0;
    lily_cpu_matmul(&b->kern, &ly->router, b->a, n, H, logits, E, b->pool);
    if (n == 1 && k <= 64) {
        lily_cpu_topk_softmax(logits, E, k, c->norm_topk_prob, b->route_idx, b->route_wt);
        moe_one_token(b, ly, b->route_idx, b->route_wt, out);
        return;
    }
    memset(b->ex_count, 0, (size_t)E * sizeof(int));
    for (int t = 0; t < n; t++) {
        lily_cpu_topk_softmax(logits + (size_t)t * E, E, k, c->norm_topk_prob,
                              b->route_idx + (size_t)t * k, b->route_wt + (size_t)t * k);
        for (int j = 0; j < k; j++)
            b->ex_count[b->route_idx[(size_t)t * k + j]]++;
    }
    b->ex_off[0] = 0;
    for (int e = 0; e < E; e++)
        b->ex_off[e + 1] = b->ex_off[e] + b->ex_count[e];
    memset(b->ex_count, 0, (size_t)E * sizeof(int));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int e = b->route_idx[(size_t)t * k + j];
            int slot = b->ex_off[e] + b->ex_count[e]++;
            b->ex_rows[slot] = t;
            b->ex_rw[slot] = b->route_wt[(size_t)t * k + j];
        }
    /* shared expert first (it initialises out), then each routed expert over its rows */
    if (c->shared_inter > 0) {
        swiglu(b, &ly->sh_gate, &ly->sh_up, &ly->sh_down, b->a, n, b->big0, b->big1, out);
        float *sg = b->small1;
        lily_cpu_matmul(&b->kern, &ly->sh_gate_w, b->a, n, H, sg, 1, b->pool);
        for (int t = 0; t < n; t++) {
            float gte = sigmoidf(sg[t]);
            for (int i = 0; i < H; i++)
                out[(size_t)t * H + i] *= gte;
        }
    } else {
        memset(out, 0, (size_t)n * H * sizeof(float));
    }
    for (int e = 0; e < E; e++) {
        int r0 = b->ex_off[e], cnt = b->ex_off[e + 1] - r0;
        if (!cnt) continue;
        for (int r = 0; r < cnt; r++)
            memcpy(b->ex_x + (size_t)r * H, b->a + (size_t)b->ex_rows[r0 + r] * H,
                   (size_t)H * sizeof(float));
        swiglu(b, &ly->exp_gate[e], &ly->exp_up[e], &ly->exp_down[e], b->ex_x, cnt, b->ex_g,
               b->ex_u, b->ex_d);
        for (int r = 0; r < cnt; r++) {
            float w = b->ex_rw[r0 + r];
            float *dst = out + (size_t)b->ex_rows[r0 + r] * H;
            const float *src = b->ex_d + (size_t)r * H;
            for (int i = 0; i < H; i++)
                dst[i] += w * src[i];
        }
    }
}

static int cpu_forward(lily_backend *b, lily_bstate *s, const int32_t *tokens, int n, int pos,
                       float *logits, int all_logits, lily_err *e) {
    const lily_model *m = b->m;
    const lily_config *c = &m->cfg;
    int H = c->hidden;
    if (n < 1 || n > b->chunk)
        return lily_fail(e, "forward of %d tokens (chunk limit %d)", n, b->chunk);
    if (pos < 0 || pos + n > s->max_ctx)
        return lily_fail(e, "context overflow: %d + %d tokens exceed the context of %d", pos, n,
                         s->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[t], c->vocab);
    pthread_mutex_lock(&b->mu);
    for (int t = 0; t < n; t++)
        lily_mat_row_f32(&m->embed, tokens[t], b->x + (size_t)t * H);
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *ly = &m->layers[l];
        for (int t = 0; t < n; t++)
            lily_cpu_rmsnorm(b->x + (size_t)t * H, ly->in_norm, H, c->rms_eps,
                             b->a + (size_t)t * H);
        if (ly->is_attn)
            attn_layer(b, s, l, n, pos);
        else
            gdn_layer(b, s, l, n);
        for (size_t i = 0; i < (size_t)n * H; i++)
            b->x[i] += b->mix[i];
        for (int t = 0; t < n; t++)
            lily_cpu_rmsnorm(b->x + (size_t)t * H, ly->post_norm, H, c->rms_eps,
                             b->a + (size_t)t * H);
        moe_layer(b, l, n);
        for (size_t i = 0; i < (size_t)n * H; i++)
            b->x[i] += b->tmp[i];
    }
    int first = all_logits ? 0 : n - 1;
    for (int t = first; t < n; t++)
        lily_cpu_rmsnorm(b->x + (size_t)t * H, m->final_norm, H, c->rms_eps,
                         b->a + (size_t)(t - first) * H);
    lily_cpu_matmul(&b->kern, &m->lm_head, b->a, n - first, H, logits, c->vocab, b->pool);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* The draw ops (backend.h) on the CPU: a step runs at once and its draw (lily_draw_pick, the
 * device sampler's reference) waits in the state's ring until draw_next reads it. */
static int cpu_draw_enqueue(lily_backend *b, lily_bstate *s, int32_t token, int pos,
                            const lily_draw *d, lily_err *e) {
    const int V = b->m->cfg.vocab;
    if (!s->dq) s->dq = lily_cpu_drawq_create(V);
    lily_cpu_drawq *q = s->dq;
    if (q->unread >= LILY_DRAW_AHEAD)
        return lily_fail(e, "%d draws are already waiting to be read", q->unread);
    if (lily_draw_mask_check(d, V, q->unread, e)) return -1; /* the mask is used at once */
    /* token < 0: the previous draw, clamped as the device clamps a failed one (reported when it
     * is read) */
    const int32_t t = token >= 0 ? token : q->last >= 0 ? q->last : 0;
    if (cpu_forward(b, s, &t, 1, pos, q->logits, 0, e)) return -1;
    q->last = lily_draw_pick(q->logits, V, d, q->scr);
    q->ring[(q->head + q->unread) % LILY_DRAW_AHEAD] = q->last;
    q->unread++;
    return 0;
}

static int cpu_draw_next(lily_backend *b, lily_bstate *s, int32_t *out, lily_err *e) {
    (void)b;
    lily_cpu_drawq *q = s->dq;
    if (!q || q->unread == 0) return lily_fail(e, "no draw is waiting to be read");
    *out = q->ring[q->head];
    q->head = (q->head + 1) % LILY_DRAW_AHEAD;
    q->unread--;
    return 0;
}

static void cpu_draw_discard(lily_backend *b, lily_bstate *s) {
    (void)b;
    if (s->dq) s->dq->unread = 0;
}

/* Prefill chunk: the CPU is compute-bound per token, so a larger chunk gains little and 512
 * keeps the scratch small. The draw ops serve LILY_SAMPLE_ON_BACKEND (the GPU sampler's
 * reference, and how the pipelined generation path is tested without a GPU). */
const lily_backend_ops lily_backend_cpu = {
    .name = "cpu",
    .prefill_chunk = 512,
    .draws_by_default = 0,
    .open = cpu_open,
    .close = cpu_close,
    .state_create = cpu_state_create,
    .state_free = cpu_state_free,
    .state_reset = cpu_state_reset,
    .state_copy = cpu_state_copy,
    .state_bytes = cpu_state_bytes,
    .forward = cpu_forward,
    .draw_enqueue = cpu_draw_enqueue,
    .draw_next = cpu_draw_next,
    .draw_discard = cpu_draw_discard,
};
