/* The CPU backend runs the step program (backend/program.h) op by op; the small ops (embedding,
 * norms, residual adds, lm_head) live here, the mixers' and the feed-forward block's in
 * step_attn.c, step_gdn.c and step_ffn.c. */
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

void cpu_mm(lily_backend *b, const cpu_step *st, const lily_mat *W, const float *X, int ldx,
            float *Y, int ldy) {
    if (st->rows) {
        lily_rows_op op = {W, X, ldx, NULL, st->n, Y, ldy};
        lily_cpu_matmul_rows(&b->kern, &op, 1, b->pool);
    } else {
        lily_cpu_matmul(&b->kern, W, X, st->n, ldx, Y, ldy, b->pool);
    }
}

void cpu_mm_many(lily_backend *b, const cpu_step *st, const lily_rows_op *ops, int n_ops) {
    if (st->rows) {
        lily_cpu_matmul_rows(&b->kern, ops, n_ops, b->pool);
        return;
    }
    for (int i = 0; i < n_ops; i++) {
        LILY_ASSERT(!ops[i].xrow && ops[i].n == st->n);
        lily_cpu_matmul(&b->kern, ops[i].W, ops[i].X, st->n, ops[i].ldx, ops[i].Y, ops[i].ldy,
                        b->pool);
    }
}

static void op_embed(lily_backend *b, const cpu_step *st) {
    const int H = b->m->cfg.hidden;
    for (int t = 0; t < st->n; t++)
        lily_mat_row_f32(&b->m->embed, st->tokens[t], b->x + (size_t)t * H);
}

static void norm(lily_backend *b, int t0, int n, const float *w, float *dst) {
    const int H = b->m->cfg.hidden;
    for (int t = t0; t < t0 + n; t++)
        lily_cpu_rmsnorm(b->x + (size_t)t * H, w, H, b->m->cfg.rms_eps, dst + (size_t)(t - t0) * H);
}

static void add(lily_backend *b, int n, const float *src) {
    const size_t len = (size_t)n * b->m->cfg.hidden;
    for (size_t i = 0; i < len; i++)
        b->x[i] += src[i];
}

/* The tokens whose logits the step returns: a chunk's last, or all of them. */
static int first_out(const cpu_step *st) {
    return st->rows || st->all_logits ? 0 : st->n - 1;
}

static void op_lm_head(lily_backend *b, const cpu_step *st) {
    const lily_config *c = &b->m->cfg;
    const int H = c->hidden, V = c->vocab;
    if (!st->rows) {
        int first = first_out(st);
        lily_cpu_matmul(&b->kern, &b->m->lm_head, b->a, st->n - first, H, st->logits, V, b->pool);
        return;
    }
    /* rows: one product for all, then each row's logits to its session */
    float *y = st->n == 1 ? st->row_logits[0] : b->lg;
    lily_rows_op op = {&b->m->lm_head, b->a, H, NULL, st->n, y, V};
    lily_cpu_matmul_rows(&b->kern, &op, 1, b->pool);
    if (st->n > 1)
        for (int i = 0; i < st->n; i++)
            memcpy(st->row_logits[i], b->lg + (size_t)i * V, (size_t)V * sizeof(float));
}

static void run_op(lily_backend *b, const cpu_step *st, const lily_op *op) {
    const lily_model *m = b->m;
    const int l = op->layer;
    const lily_layer *ly = l >= 0 ? &m->layers[l] : NULL;
    switch (op->kind) {
    case LILY_OP_EMBED: op_embed(b, st); break;
    case LILY_OP_IN_NORM: norm(b, 0, st->n, ly->in_norm, b->a); break;
    case LILY_OP_ATTN_PROJ: cpu_op_attn_proj(b, st, l); break;
    case LILY_OP_ATTN_QK: cpu_op_attn_qk(b, st, l); break;
    case LILY_OP_ATTN_CORE: cpu_op_attn_core(b, st, l); break;
    case LILY_OP_ATTN_GATE: cpu_op_attn_gate(b, st, l); break;
    case LILY_OP_ATTN_OUT: cpu_op_attn_out(b, st, l); break;
    case LILY_OP_GDN_PROJ: cpu_op_gdn_proj(b, st, l); break;
    case LILY_OP_GDN_CONV: cpu_op_gdn_conv(b, st, l); break;
    case LILY_OP_GDN_RECUR: cpu_op_gdn_recur(b, st, l); break;
    case LILY_OP_GDN_GATE: cpu_op_gdn_gate(b, st, l); break;
    case LILY_OP_GDN_OUT: cpu_op_gdn_out(b, st, l); break;
    case LILY_OP_RESID_MIX: add(b, st->n, b->mix); break;
    case LILY_OP_POST_NORM: norm(b, 0, st->n, ly->post_norm, b->a); break;
    case LILY_OP_ROUTER: cpu_op_router(b, st, l); break;
    case LILY_OP_TOPK: cpu_op_topk(b, st, l); break;
    case LILY_OP_EXPERTS: cpu_op_experts(b, st, l); break;
    case LILY_OP_SHARED: cpu_op_shared(b, st, l); break;
    case LILY_OP_COMBINE: cpu_op_combine(b, st, l); break;
    case LILY_OP_MLP: cpu_op_mlp(b, st, l); break;
    case LILY_OP_RESID_FFN: add(b, st->n, b->ffn); break;
    case LILY_OP_FINAL_NORM: {
        int first = first_out(st);
        norm(b, first, st->n - first, m->final_norm, b->a);
        break;
    }
    case LILY_OP_LM_HEAD: op_lm_head(b, st); break;
    default: LILY_ASSERT(!"unknown op");
    }
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void cpu_step_run(lily_backend *b, const cpu_step *st) {
    const lily_program *p = &b->prog;
    if (!b->prof) {
        for (int i = 0; i < p->n_ops; i++)
            run_op(b, st, &p->ops[i]);
        return;
    }
    double t = now_ms();
    for (int i = 0; i < p->n_ops; i++) {
        run_op(b, st, &p->ops[i]);
        double t1 = now_ms();
        b->prof[i] += t1 - t;
        t = t1;
    }
}
