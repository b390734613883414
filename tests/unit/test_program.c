/* The step program (backend/program.h) of random tiny models (MoE and dense): the ops of every
 * layer in order, dependencies that point back to the last writer of each buffer read, the weight
 * bytes per token equal to a sum over the model's matrices, and the printed listing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "backend/program.h"
#include "model/mkmodel.h"
#include "model/model.h"

static uint64_t mb(const lily_mat *m) {
    return m->w ? (uint64_t)m->rows * lily_mat_row_bytes(m) : 0;
}

static void one(const char *dir, int dense, const char *what) {
    lily_err e = {0};
    lily_mk_opts o;
    lily_mk_preset("tiny", &o, &e);
    o.layout = LILY_MK_MLX, o.bits = 4, o.seed = 9, o.n_threads = 1;
    o.cfg.n_layers = 6; /* 3 GDN, 1 attention, 2 GDN */
    if (dense) {
        o.cfg.intermediate = 128;
        snprintf(o.cfg.model_type, sizeof o.cfg.model_type, "qwen3_5");
    }
    lily_mk_result r;
    lily_model *m = NULL;
    if (lily_mk_write(dir, &o, &r, &e) || lily_model_load(dir, &m, &e)) {
        check(0, what, "model: %s", e.msg);
        return;
    }
    const lily_config *c = &m->cfg;
    lily_program p;
    lily_program_build(m, &p);
    /* the expected sequence and bytes, independently */
    lily_op_kind want[512];
    int nw = 0;
    uint64_t bytes = lily_mat_row_bytes(&m->embed) + mb(&m->lm_head);
    want[nw++] = LILY_OP_EMBED;
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *ly = &m->layers[l];
        want[nw++] = LILY_OP_IN_NORM;
        if (ly->is_attn) {
            want[nw++] = LILY_OP_ATTN_PROJ, want[nw++] = LILY_OP_ATTN_QK;
            want[nw++] = LILY_OP_ATTN_CORE;
            if (c->attn_output_gate) want[nw++] = LILY_OP_ATTN_GATE;
            want[nw++] = LILY_OP_ATTN_OUT;
            bytes += mb(&ly->q_proj) + mb(&ly->k_proj) + mb(&ly->v_proj) + mb(&ly->o_proj);
        } else {
            want[nw++] = LILY_OP_GDN_PROJ, want[nw++] = LILY_OP_GDN_CONV;
            want[nw++] = LILY_OP_GDN_RECUR, want[nw++] = LILY_OP_GDN_GATE;
            want[nw++] = LILY_OP_GDN_OUT;
            bytes += mb(&ly->qkv_proj) + mb(&ly->z_proj) + mb(&ly->b_proj) + mb(&ly->a_proj) +
                     mb(&ly->out_proj);
        }
        want[nw++] = LILY_OP_RESID_MIX, want[nw++] = LILY_OP_POST_NORM;
        if (c->is_moe) {
            want[nw++] = LILY_OP_ROUTER, want[nw++] = LILY_OP_TOPK, want[nw++] = LILY_OP_EXPERTS;
            want[nw++] = LILY_OP_SHARED, want[nw++] = LILY_OP_COMBINE;
            bytes += mb(&ly->router) + mb(&ly->sh_gate) + mb(&ly->sh_up) + mb(&ly->sh_down) +
                     mb(&ly->sh_gate_w);
            for (int k = 0; k < c->top_k; k++)
                bytes += mb(&ly->exp_gate[0]) + mb(&ly->exp_up[0]) + mb(&ly->exp_down[0]);
        } else {
            want[nw++] = LILY_OP_MLP;
            bytes += mb(&ly->mlp_gate) + mb(&ly->mlp_up) + mb(&ly->mlp_down);
        }
        want[nw++] = LILY_OP_RESID_FFN;
    }
    want[nw++] = LILY_OP_FINAL_NORM, want[nw++] = LILY_OP_LM_HEAD;
    int order = p.n_ops == nw;
    for (int i = 0; order && i < nw; i++)
        order = p.ops[i].kind == want[i];
    check(order, what, "%d ops in the model's order (want %d)", p.n_ops, nw);
    uint64_t got = 0;
    for (int i = 0; i < p.n_ops; i++)
        got += p.ops[i].bytes;
    check(got == bytes, what, "weight bytes per token %llu (want %llu)", (unsigned long long)got,
          (unsigned long long)bytes);
    /* every dependency: earlier, and the last writer of a buffer the op reads; every scratch
     * buffer read has one (the state buffers may come from the previous step) */
    const uint32_t state =
        1u << LILY_BUF_KV | 1u << LILY_BUF_CONV | 1u << LILY_BUF_S | 1u << LILY_BUF_TOKENS;
    int bad = 0;
    for (int i = 0; i < p.n_ops; i++) {
        const lily_op *op = &p.ops[i];
        uint32_t covered = 0;
        for (int d = 0; d < op->n_deps; d++) {
            int j = op->deps[d];
            if (j >= i || j < 0 || (d && op->deps[d - 1] >= j)) bad++;
            uint32_t wr = p.ops[j].writes & op->reads;
            if (!wr) bad++;
            if ((wr & state) && p.ops[j].layer != op->layer) bad++; /* another layer's state */
            /* no later writer before op i (of the same layer, for a layer's own state) */
            for (int b = 0; b < LILY_BUF_COUNT; b++)
                if (wr & (1u << b))
                    for (int q = j + 1; q < i; q++)
                        if (p.ops[q].writes & (1u << b) &&
                            (!(state & (1u << b)) || p.ops[q].layer == op->layer))
                            bad++;
            covered |= wr;
        }
        if ((op->reads & ~state) & ~covered) bad++;
    }
    check(!bad, what, "dependencies point to the last writers (%d wrong)", bad);
    check(p.ops[p.n_ops - 1].n_w == 1 && p.ops[p.n_ops - 1].w[0] == &m->lm_head, what,
          "lm_head reads the model's lm_head");
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    double *ms = calloc((size_t)p.n_ops, sizeof(double));
    ms[1] = 0.5;
    lily_program_print(&p, ms, f);
    fclose(f);
    char tot[64];
    snprintf(tot, sizeof tot, "total: %d ops", p.n_ops);
    check(txt && strstr(txt, tot) && strstr(txt, "lm_head") && strstr(txt, "0.500"), what,
          "the listing names the ops and the total");
    free(txt), free(ms);
    lily_program_free(&p);
    lily_model_free(m);
}

int main(void) {
    char root[64];
    snprintf(root, sizeof root, "/tmp/lily_test_program_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/moe", root);
    snprintf(b, sizeof b, "%s/dense", root);
    one(a, 0, "program moe");
    one(b, 1, "program dense");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("note: cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
