/* The step program (program.h): built from the model's config, printed for lily bench. */
#include "backend/program.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static const char *const op_names[LILY_OP_COUNT] = {
    [LILY_OP_EMBED] = "embed",         [LILY_OP_IN_NORM] = "in_norm",
    [LILY_OP_ATTN_PROJ] = "attn_proj", [LILY_OP_ATTN_QK] = "attn_qk",
    [LILY_OP_ATTN_CORE] = "attn_core", [LILY_OP_ATTN_GATE] = "attn_gate",
    [LILY_OP_ATTN_OUT] = "attn_out",   [LILY_OP_GDN_PROJ] = "gdn_proj",
    [LILY_OP_GDN_CONV] = "gdn_conv",   [LILY_OP_GDN_RECUR] = "gdn_recur",
    [LILY_OP_GDN_GATE] = "gdn_gate",   [LILY_OP_GDN_OUT] = "gdn_out",
    [LILY_OP_RESID_MIX] = "resid_mix", [LILY_OP_POST_NORM] = "post_norm",
    [LILY_OP_ROUTER] = "router",       [LILY_OP_TOPK] = "topk",
    [LILY_OP_EXPERTS] = "experts",     [LILY_OP_SHARED] = "shared",
    [LILY_OP_COMBINE] = "combine",     [LILY_OP_MLP] = "mlp",
    [LILY_OP_RESID_FFN] = "resid_ffn", [LILY_OP_FINAL_NORM] = "final_norm",
    [LILY_OP_LM_HEAD] = "lm_head",
};

static const char *const buf_names[LILY_BUF_COUNT] = {
    [LILY_BUF_TOKENS] = "tokens", [LILY_BUF_X] = "x",         [LILY_BUF_A] = "a",
    [LILY_BUF_QG] = "qg",         [LILY_BUF_KVNEW] = "kvnew", [LILY_BUF_Q] = "q",
    [LILY_BUF_KV] = "KV",         [LILY_BUF_O] = "o",         [LILY_BUF_QKV] = "qkv",
    [LILY_BUF_Z] = "z",           [LILY_BUF_BA] = "ba",       [LILY_BUF_CV] = "cv",
    [LILY_BUF_CONV] = "CONV",     [LILY_BUF_S] = "S",         [LILY_BUF_MIX] = "mix",
    [LILY_BUF_RL] = "rl",         [LILY_BUF_ROUTE] = "route", [LILY_BUF_ED] = "ed",
    [LILY_BUF_SD] = "sd",         [LILY_BUF_FFN] = "ffn",     [LILY_BUF_LOGITS] = "logits",
};

const char *lily_op_name(lily_op_kind k) {
    return k >= 0 && k < LILY_OP_COUNT ? op_names[k] : "?";
}

const char *lily_buf_name(lily_buf b) {
    return b >= 0 && b < LILY_BUF_COUNT ? buf_names[b] : "?";
}

#define B(name) (1u << LILY_BUF_##name)

static uint64_t mat_bytes(const lily_mat *m) {
    return m->w ? (uint64_t)m->rows * lily_mat_row_bytes(m) : 0;
}

typedef struct {
    lily_program *p;
    int cap;
    int last_writer[LILY_BUF_COUNT]; /* -1: written before the step (state, tokens) */
} builder;

/* Appends an op; its dependencies are the last writers of what it reads. */
static lily_op *add(builder *bd, lily_op_kind kind, int layer, uint32_t reads, uint32_t writes) {
    lily_program *p = bd->p;
    if (p->n_ops == bd->cap) {
        bd->cap = bd->cap ? 2 * bd->cap : 64;
        p->ops = lily_xrealloc(p->ops, (size_t)bd->cap * sizeof *p->ops);
    }
    lily_op *op = &p->ops[p->n_ops];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->layer = layer;
    op->reads = reads;
    op->writes = writes;
    for (int b = 0; b < LILY_BUF_COUNT; b++) {
        int w = bd->last_writer[b];
        if (!(reads & (1u << b)) || w < 0) continue;
        int seen = 0;
        for (int i = 0; i < op->n_deps; i++)
            seen |= op->deps[i] == w;
        if (!seen) { /* kept in ascending order */
            LILY_ASSERT(op->n_deps < LILY_OP_MAX_DEPS);
            int j = op->n_deps++;
            for (; j > 0 && op->deps[j - 1] > w; j--)
                op->deps[j] = op->deps[j - 1];
            op->deps[j] = w;
        }
    }
    for (int b = 0; b < LILY_BUF_COUNT; b++)
        if (writes & (1u << b)) bd->last_writer[b] = p->n_ops;
    p->n_ops++;
    return op;
}

static void weight(lily_op *op, const lily_mat *m) {
    if (!m->w) return;
    LILY_ASSERT(op->n_w < LILY_OP_MAX_W);
    op->w[op->n_w++] = m;
    op->bytes += mat_bytes(m);
}

void lily_program_build(const lily_model *m, lily_program *p) {
    const lily_config *c = &m->cfg;
    memset(p, 0, sizeof *p);
    builder bd = {p, 0, {0}};
    for (int b = 0; b < LILY_BUF_COUNT; b++)
        bd.last_writer[b] = -1;
    lily_op *op = add(&bd, LILY_OP_EMBED, -1, B(TOKENS), B(X));
    op->bytes = lily_mat_row_bytes(&m->embed);
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *ly = &m->layers[l];
        /* each layer has its own state: what it holds was written by the previous step */
        bd.last_writer[LILY_BUF_KV] = bd.last_writer[LILY_BUF_CONV] = -1;
        bd.last_writer[LILY_BUF_S] = -1;
        add(&bd, LILY_OP_IN_NORM, l, B(X), B(A));
        if (ly->is_attn) {
            op = add(&bd, LILY_OP_ATTN_PROJ, l, B(A), B(QG) | B(KVNEW));
            weight(op, &ly->q_proj), weight(op, &ly->k_proj), weight(op, &ly->v_proj);
            add(&bd, LILY_OP_ATTN_QK, l, B(QG) | B(KVNEW), B(Q) | B(KV));
            add(&bd, LILY_OP_ATTN_CORE, l, B(Q) | B(KV), B(O));
            if (c->attn_output_gate) add(&bd, LILY_OP_ATTN_GATE, l, B(QG) | B(O), B(O));
            op = add(&bd, LILY_OP_ATTN_OUT, l, B(O), B(MIX));
            weight(op, &ly->o_proj);
        } else {
            op = add(&bd, LILY_OP_GDN_PROJ, l, B(A), B(QKV) | B(Z) | B(BA));
            weight(op, &ly->qkv_proj), weight(op, &ly->z_proj);
            weight(op, &ly->b_proj), weight(op, &ly->a_proj);
            add(&bd, LILY_OP_GDN_CONV, l, B(QKV) | B(CONV), B(CV) | B(CONV));
            add(&bd, LILY_OP_GDN_RECUR, l, B(CV) | B(BA) | B(S), B(O) | B(S));
            add(&bd, LILY_OP_GDN_GATE, l, B(O) | B(Z), B(O));
            op = add(&bd, LILY_OP_GDN_OUT, l, B(O), B(MIX));
            weight(op, &ly->out_proj);
        }
        add(&bd, LILY_OP_RESID_MIX, l, B(X) | B(MIX), B(X));
        add(&bd, LILY_OP_POST_NORM, l, B(X), B(A));
        if (c->is_moe) {
            op = add(&bd, LILY_OP_ROUTER, l, B(A), B(RL));
            weight(op, &ly->router);
            add(&bd, LILY_OP_TOPK, l, B(RL), B(ROUTE));
            op = add(&bd, LILY_OP_EXPERTS, l, B(A) | B(ROUTE), B(ED));
            op->bytes =
                (uint64_t)c->top_k * (mat_bytes(&ly->exp_gate[0]) + mat_bytes(&ly->exp_up[0]) +
                                      mat_bytes(&ly->exp_down[0]));
            op = add(&bd, LILY_OP_SHARED, l, B(A), B(SD));
            if (c->shared_inter > 0) {
                weight(op, &ly->sh_gate), weight(op, &ly->sh_up), weight(op, &ly->sh_down);
                weight(op, &ly->sh_gate_w);
            }
            add(&bd, LILY_OP_COMBINE, l, B(SD) | B(ED) | B(ROUTE), B(FFN));
        } else {
            op = add(&bd, LILY_OP_MLP, l, B(A), B(FFN));
            weight(op, &ly->mlp_gate), weight(op, &ly->mlp_up), weight(op, &ly->mlp_down);
        }
        add(&bd, LILY_OP_RESID_FFN, l, B(X) | B(FFN), B(X));
    }
    add(&bd, LILY_OP_FINAL_NORM, -1, B(X), B(A));
    op = add(&bd, LILY_OP_LM_HEAD, -1, B(A), B(LOGITS));
    weight(op, &m->lm_head);
}

void lily_program_free(lily_program *p) {
    if (!p) return;
    free(p->ops);
    p->ops = NULL;
    p->n_ops = 0;
}

static int bufs(uint32_t mask, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
    for (int b = 0; b < LILY_BUF_COUNT && o < len; b++)
        if (mask & (1u << b)) {
            int w = snprintf(out + o, len - o, "%s%s", o ? "," : "", buf_names[b]);
            if (w > 0) o += (size_t)w;
        }
    return (int)o;
}

void lily_program_print(const lily_program *p, const double *ms, FILE *f) {
    uint64_t total = 0;
    double tms = 0;
    fprintf(f, "%5s %5s %-10s %12s%s  %-28s %s\n", "op", "layer", "name", "bytes/token",
            ms ? "       ms     GB/s" : "", "reads -> writes", "after");
    for (int i = 0; i < p->n_ops; i++) {
        const lily_op *op = &p->ops[i];
        char r[160], w[160], io[340], deps[64];
        bufs(op->reads, r, sizeof r);
        bufs(op->writes, w, sizeof w);
        snprintf(io, sizeof io, "%s -> %s", r, w);
        size_t o = 0;
        deps[0] = 0;
        for (int d = 0; d < op->n_deps && o < sizeof deps; d++) {
            int n = snprintf(deps + o, sizeof deps - o, "%s%d", d ? "," : "", op->deps[d]);
            if (n > 0) o += (size_t)n;
        }
        fprintf(f, "%5d %5d %-10s %12llu", i, op->layer, lily_op_name(op->kind),
                (unsigned long long)op->bytes);
        if (ms)
            fprintf(f, " %8.4f %8.2f", ms[i],
                    ms[i] > 0 ? (double)op->bytes / (ms[i] * 1e-3) / 1e9 : 0.0);
        fprintf(f, "  %-28s %s\n", io, deps);
        total += op->bytes;
        if (ms) tms += ms[i];
    }
    fprintf(f, "total: %d ops, %llu weight bytes per token", p->n_ops, (unsigned long long)total);
    if (ms) fprintf(f, ", %.3f ms", tms);
    fprintf(f, "\n");
}
