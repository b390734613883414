/* The feed-forward ops of the step program on the CPU: router, top-k, routed experts, shared
 * expert, combine (MoE) or the dense SwiGLU MLP.
 *
 * Rows (and a decode step) run each expert of the union of the rows' choices once over the rows
 * that chose it, all gate and up products in one job and all down products in another; a chunk
 * runs the prefill products expert by expert. Either way combine sums each token's terms in the
 * same order (shared expert, then its experts by ascending id), so a row's result does not
 * depend on the other rows. */
#include <string.h>

#include "backend/cpu/cpu.h"

/* SwiGLU of a chunk: out[t] = down(silu(gate x) * up x) for n rows of x. */
static void swiglu_chunk(lily_backend *b, const lily_mat *gate, const lily_mat *up,
                         const lily_mat *down, const float *x, int n, float *g, float *u,
                         float *out, int ldo) {
    const int H = b->m->cfg.hidden, I = gate->rows;
    if (!lily_cpu_matmul_glu(&b->kern, gate, up, x, n, H, g, I, b->pool)) {
        lily_cpu_matmul(&b->kern, gate, x, n, H, g, I, b->pool);
        lily_cpu_matmul(&b->kern, up, x, n, H, u, I, b->pool);
        for (size_t i = 0; i < (size_t)n * I; i++)
            g[i] = lily_silu(g[i]) * u[i];
    }
    lily_cpu_matmul(&b->kern, down, g, n, I, out, ldo, b->pool);
}

static void glu(float *g, const float *u, size_t len) {
    for (size_t i = 0; i < len; i++)
        g[i] = lily_silu(g[i]) * u[i];
}

/* rl = small0 [n][E]. */
void cpu_op_router(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    cpu_mm(b, st, &b->m->layers[l].router, b->a, c->hidden, b->small0, c->n_experts);
}

/* Each token's top k, then the slots grouped by expert (cpu_route_group). */
void cpu_op_topk(lily_backend *b, const cpu_step *st, int l) {
    (void)l;
    const lily_config *c = &b->m->cfg;
    const int E = c->n_experts, k = c->top_k;
    for (int t = 0; t < st->n; t++)
        lily_cpu_topk_softmax(b->small0 + (size_t)t * E, E, k, c->norm_topk_prob,
                              b->route_idx + (size_t)t * k, b->route_wt + (size_t)t * k);
    cpu_route_group(b, st->n);
}

void cpu_route_group(lily_backend *b, int n) {
    const lily_config *c = &b->m->cfg;
    const int E = c->n_experts, k = c->top_k;
    memset(b->ex_count, 0, (size_t)E * sizeof(int));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++)
            b->ex_count[b->route_idx[(size_t)t * k + j]]++;
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
}

/* ed [slot][H]: each slot's expert on its row of a. */
void cpu_op_experts(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    const int H = c->hidden, E = c->n_experts, I = c->moe_inter;
    if (!st->rows) {
        for (int e = 0; e < E; e++) {
            const int r0 = b->ex_off[e], cnt = b->ex_off[e + 1] - r0;
            if (!cnt) continue;
            for (int r = 0; r < cnt; r++)
                memcpy(b->ex_x + (size_t)r * H, b->a + (size_t)b->ex_rows[r0 + r] * H,
                       (size_t)H * sizeof(float));
            swiglu_chunk(b, &ly->exp_gate[e], &ly->exp_up[e], &ly->exp_down[e], b->ex_x, cnt,
                         b->ex_g, b->ex_u, b->ed + (size_t)r0 * H, H);
        }
        return;
    }
    /* rows: the union of the chosen experts, each over its rows (at most one slot per row) */
    lily_rows_op *o = b->ex_ops;
    const int slots = b->ex_off[E];
    int n_ops = 0;
    for (int e = 0; e < E; e++) {
        const int r0 = b->ex_off[e], cnt = b->ex_off[e + 1] - r0;
        if (!cnt) continue;
        o[n_ops++] = (lily_rows_op){&ly->exp_gate[e],         b->a, H, b->ex_rows + r0, cnt,
                                    b->ex_g + (size_t)r0 * I, I};
        o[n_ops++] = (lily_rows_op){&ly->exp_up[e],           b->a, H, b->ex_rows + r0, cnt,
                                    b->ex_u + (size_t)r0 * I, I};
    }
    lily_cpu_matmul_rows(&b->kern, o, n_ops, b->pool);
    glu(b->ex_g, b->ex_u, (size_t)slots * I);
    n_ops = 0;
    for (int e = 0; e < E; e++) {
        const int r0 = b->ex_off[e], cnt = b->ex_off[e + 1] - r0;
        if (!cnt) continue;
        o[n_ops++] = (lily_rows_op){
            &ly->exp_down[e], b->ex_g + (size_t)r0 * I, I, NULL, cnt, b->ed + (size_t)r0 * H, H};
    }
    lily_cpu_matmul_rows(&b->kern, o, n_ops, b->pool);
}

/* sd [n][H] and its gate sg [n]. */
void cpu_op_shared(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const lily_layer *ly = &b->m->layers[l];
    const int H = c->hidden, Is = c->shared_inter, n = st->n;
    if (Is <= 0) return;
    if (!st->rows) {
        swiglu_chunk(b, &ly->sh_gate, &ly->sh_up, &ly->sh_down, b->a, n, b->big0, b->big1, b->sd,
                     H);
        if (ly->sh_gate_w.w)
            lily_cpu_matmul(&b->kern, &ly->sh_gate_w, b->a, n, H, b->sg, 1, b->pool);
        return;
    }
    lily_rows_op ops[3] = {{&ly->sh_gate, b->a, H, NULL, n, b->sh_g, Is},
                           {&ly->sh_up, b->a, H, NULL, n, b->sh_u, Is},
                           {&ly->sh_gate_w, b->a, H, NULL, n, b->sg, 1}};
    lily_cpu_matmul_rows(&b->kern, ops, ly->sh_gate_w.w ? 3 : 2, b->pool);
    glu(b->sh_g, b->sh_u, (size_t)n * Is);
    lily_rows_op down = {&ly->sh_down, b->sh_g, Is, NULL, n, b->sd, H};
    lily_cpu_matmul_rows(&b->kern, &down, 1, b->pool);
}

/* ffn [n][H] = sigmoid(sg) sd, plus each of the token's experts by ascending id. */
void cpu_op_combine(lily_backend *b, const cpu_step *st, int l) {
    const lily_config *c = &b->m->cfg;
    const int H = c->hidden, E = c->n_experts, n = st->n;
    if (c->shared_inter > 0) {
        const int gated = b->m->layers[l].sh_gate_w.w != NULL; /* else a gate of 1 (blocks.h) */
        for (int t = 0; t < n; t++) {
            const float gte = gated ? cpu_sigmoid(b->sg[t]) : 1.0f;
            const float *d = b->sd + (size_t)t * H;
            float *out = b->ffn + (size_t)t * H;
            for (int i = 0; i < H; i++)
                out[i] = gte * d[i];
        }
    } else {
        memset(b->ffn, 0, (size_t)n * H * sizeof(float));
    }
    for (int slot = 0; slot < b->ex_off[E]; slot++) {
        const float w = b->ex_rw[slot], *src = b->ed + (size_t)slot * H;
        float *dst = b->ffn + (size_t)b->ex_rows[slot] * H;
        for (int i = 0; i < H; i++)
            dst[i] += w * src[i];
    }
}

/* The dense MLP: ffn [n][H]. */
void cpu_op_mlp(lily_backend *b, const cpu_step *st, int l) {
    const lily_layer *ly = &b->m->layers[l];
    const int H = b->m->cfg.hidden, I = ly->mlp_gate.rows, n = st->n;
    if (!st->rows) {
        swiglu_chunk(b, &ly->mlp_gate, &ly->mlp_up, &ly->mlp_down, b->a, n, b->big0, b->big1,
                     b->ffn, H);
        return;
    }
    lily_rows_op ops[2] = {{&ly->mlp_gate, b->a, H, NULL, n, b->big0, I},
                           {&ly->mlp_up, b->a, H, NULL, n, b->big1, I}};
    lily_cpu_matmul_rows(&b->kern, ops, 2, b->pool);
    glu(b->big0, b->big1, (size_t)n * I);
    lily_rows_op down = {&ly->mlp_down, b->big0, I, NULL, n, b->ffn, H};
    lily_cpu_matmul_rows(&b->kern, &down, 1, b->pool);
}
