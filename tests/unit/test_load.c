/* Loading synthetic checkpoints of every layout: HF per-expert and fused experts, MLX 4-bit and
 * 8-bit, dense and tied variants. Checks that every tensor is bound, that values reach the model
 * as the writer intended (HF norms shifted to 1+w, MLX norms and the GDN norm not; conv taps in
 * [C][K] order from both [C,1,K] and [C,K,1]; Q4/Q8 codes, scales and biases at the right
 * places), that fused and per-expert HF files give identical logical weights, and that
 * dequantized weights have the intended statistics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/mkmodel.h"
#include "model/model.h"
#include "model/safetensors.h"

#include "../check.h"

static char root[64];

/* Writes preset tiny with the given layout into root/name and loads it. */
static lily_model *make(const char *name, lily_mk_opts *o) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    lily_mk_result r;
    lily_err err = {{0}};
    if (lily_mk_write(dir, o, &r, &err)) {
        check(0, name, "mkmodel: %s", err.msg);
        return NULL;
    }
    lily_model *m = NULL;
    if (lily_model_load(dir, &m, &err)) {
        check(0, name, "load: %s", err.msg);
        return NULL;
    }
    check(1, name, "%d tensors, %d file(s), %llu params, %llu bytes, layout %s, %s", r.n_tensors,
          r.n_files, (unsigned long long)m->n_params, (unsigned long long)m->weight_bytes,
          m->layout, m->quant);
    return m;
}

static float bf16(uint16_t h) {
    return lily_st_bf16_f32(h);
}

/* W[r][c] of any stored format, following model.md section 7.2 for the packed codes. */
static float deq(const lily_mat *m, int r, int c) {
    if (m->dt == LILY_DT_BF16) return bf16(((const uint16_t *)m->w)[(size_t)r * m->cols + c]);
    if (m->dt == LILY_DT_F32) return ((const float *)m->w)[(size_t)r * m->cols + c];
    int bits = m->dt == LILY_DT_Q4 ? 4 : 8, per = 32 / bits;
    uint32_t w = ((const uint32_t *)m->w)[(size_t)r * (m->cols / per) + c / per];
    uint32_t q = (w >> (bits * (c % per))) & ((1u << bits) - 1);
    size_t g = (size_t)r * (m->cols / m->group) + c / m->group;
    return bf16(m->scales[g]) * (float)q + bf16(m->biases[g]);
}

/* What the writer says element (r, c) of quantized module `mod` is (stack index e, rows R). */
static float want_q(const lily_mk_opts *o, const char *mod, int e, int R, int cols, int bits, int r,
                    int c) {
    char n[256];
    double w, s, b;
    int per = 32 / bits;
    uint64_t row = (uint64_t)e * R + r;
    snprintf(n, sizeof n, "%s.weight", mod);
    lily_mk_value(o, n, row * (cols / per) + c / per, &w, NULL);
    snprintf(n, sizeof n, "%s.scales", mod);
    lily_mk_value(o, n, row * (cols / 64) + c / 64, &s, NULL);
    snprintf(n, sizeof n, "%s.biases", mod);
    lily_mk_value(o, n, row * (cols / 64) + c / 64, &b, NULL);
    uint32_t q = ((uint32_t)w >> (bits * (c % per))) & ((1u << bits) - 1);
    return (float)s * (float)q + (float)b;
}

static void stats(const lily_mat *m, double *mean, double *sd) {
    double s = 0, s2 = 0, n = (double)m->rows * m->cols;
    for (int r = 0; r < m->rows; r++)
        for (int c = 0; c < m->cols; c++) {
            double v = deq(m, r, c);
            s += v;
            s2 += v * v;
        }
    *mean = s / n;
    *sd = sqrt(s2 / n - *mean * *mean);
}

static int all_bound(const lily_model *m) {
    const lily_config *c = &m->cfg;
    int ok = m->embed.w && m->lm_head.w && m->final_norm;
    for (int l = 0; ok && l < c->n_layers; l++) {
        const lily_layer *L = &m->layers[l];
        ok = L->in_norm && L->post_norm && L->is_attn == c->layer_is_attn[l];
        if (L->is_attn)
            ok = ok && L->q_proj.w && L->k_proj.w && L->v_proj.w && L->o_proj.w && L->q_norm &&
                 L->k_norm;
        else
            ok = ok && L->qkv_proj.w && L->z_proj.w && L->b_proj.w && L->a_proj.w &&
                 L->out_proj.w && L->conv_w && L->dt_bias && L->A_log && L->gdn_norm;
        if (c->is_moe) {
            ok = ok && L->router.w && L->sh_gate.w && L->sh_up.w && L->sh_down.w && L->sh_gate_w.w;
            for (int e = 0; ok && e < c->n_experts; e++)
                ok = L->exp_gate[e].w && L->exp_up[e].w && L->exp_down[e].w &&
                     L->exp_gate[e].rows == c->moe_inter && L->exp_down[e].cols == c->moe_inter;
        } else {
            ok = ok && L->mlp_gate.w && L->mlp_up.w && L->mlp_down.w;
        }
    }
    return ok;
}

static void check_norms(const lily_model *m, const lily_mk_opts *o, const char *what) {
    int mlx = o->layout == LILY_MK_MLX;
    const char *p = mlx ? "language_model.model." : "model.language_model.";
    char n[256];
    int ok = 1, gdn_ok = 1, conv_ok = 1, alog_ok = 1;
    double v, worst = 0;
    snprintf(n, sizeof n, "%snorm.weight", p);
    for (int i = 0; i < m->cfg.hidden && ok; i++) {
        lily_mk_value(o, n, (uint64_t)i, &v, NULL);
        float want = mlx ? (float)v : 1.0f + (float)v;
        ok = m->final_norm[i] == want;
        if (fabs(v - (mlx ? 1 : 0)) > worst) worst = fabs(v - (mlx ? 1 : 0));
    }
    snprintf(n, sizeof n, "%slayers.3.self_attn.q_norm.weight", p);
    for (int i = 0; i < m->cfg.head_dim && ok; i++) {
        lily_mk_value(o, n, (uint64_t)i, &v, NULL);
        ok = m->layers[3].q_norm[i] == (mlx ? (float)v : 1.0f + (float)v);
    }
    check(ok, what, "final/q norms %s (stored values centred on %d, max dev %.3f)",
          mlx ? "used as stored" : "stored w, used as 1+w", mlx, worst);
    const lily_layer *L = &m->layers[1];
    int K = m->cfg.conv_k, C = L->qkv_proj.rows;
    snprintf(n, sizeof n, "%slayers.1.linear_attn.norm.weight", p);
    for (int i = 0; i < m->cfg.lin_dv && gdn_ok; i++) {
        lily_mk_value(o, n, (uint64_t)i, &v, NULL);
        gdn_ok = L->gdn_norm[i] == (float)v;
    }
    snprintf(n, sizeof n, "%slayers.1.linear_attn.conv1d.weight", p);
    for (int i = 0; i < C * K && conv_ok; i++) {
        lily_mk_value(o, n, (uint64_t)i, &v, NULL);
        conv_ok = L->conv_w[i] == (float)v;
    }
    snprintf(n, sizeof n, "%slayers.1.linear_attn.A_log", p);
    for (int i = 0; i < m->cfg.lin_nv && alog_ok; i++) {
        lily_mk_value(o, n, (uint64_t)i, &v, NULL);
        alog_ok = L->A_log[i] == (float)v && v >= 0 && v <= log(16.0) + 1e-6;
    }
    check(gdn_ok, what, "linear_attn.norm never shifted (w[0] = %.4f)", L->gdn_norm[0]);
    check(conv_ok, what, "conv taps [%d][%d] from %s", C, K, mlx ? "[C,K,1]" : "[C,1,K]");
    check(alog_ok, what, "A_log f32 values, in [0, log 16]");
}

static void check_quant(const lily_model *m, const lily_mk_opts *o, const char *what) {
    int bits = o->bits, H = m->cfg.hidden, I = m->cfg.moe_inter, ok = 1, nchk = 0;
    const lily_layer *L0 = &m->layers[0];
    const char *p = "language_model.model.layers.0.";
    char mod[256];
    /* in_proj_qkv (default bits), router (8 bits), expert 5 of the down stack. */
    snprintf(mod, sizeof mod, "%slinear_attn.in_proj_qkv", p);
    for (int r = 0; r < L0->qkv_proj.rows && ok; r += 7)
        for (int c = 0; c < H && ok; c++, nchk++)
            ok = deq(&L0->qkv_proj, r, c) == want_q(o, mod, 0, 0, H, bits, r, c);
    snprintf(mod, sizeof mod, "%smlp.gate", p);
    for (int r = 0; r < L0->router.rows && ok; r++)
        for (int c = 0; c < H && ok; c++, nchk++)
            ok = deq(&L0->router, r, c) == want_q(o, mod, 0, 0, H, 8, r, c);
    snprintf(mod, sizeof mod, "%smlp.switch_mlp.down_proj", p);
    for (int r = 0; r < H && ok; r += 5)
        for (int c = 0; c < I && ok; c++, nchk++)
            ok = deq(&L0->exp_down[5], r, c) == want_q(o, mod, 5, H, I, bits, r, c);
    check(ok && L0->qkv_proj.dt == (bits == 4 ? LILY_DT_Q4 : LILY_DT_Q8) &&
              L0->router.dt == LILY_DT_Q8 && L0->sh_gate_w.dt == LILY_DT_Q8 &&
              L0->qkv_proj.group == 64,
          what, "%d dequantized values match the writer's codes/scales/biases (Q%d, router Q8)",
          nchk, bits);
    double mean, sd;
    stats(&m->layers[2].exp_gate[3], &mean, &sd);
    double want = 1.0 / sqrt((double)H);
    check(fabs(mean) < 0.1 * want && fabs(sd - want) < 0.1 * want, what,
          "expert gate dequantized mean %.5f, std %.5f (want 0, %.5f)", mean, sd, want);
}

static void check_same_experts(const lily_model *a, const lily_model *b) {
    const lily_config *c = &a->cfg;
    int ok = 1, n = 0;
    size_t gb = (size_t)c->moe_inter * c->hidden * 2;
    for (int l = 0; l < c->n_layers && ok; l++)
        for (int e = 0; e < c->n_experts && ok; e++, n += 3)
            ok = !memcmp(a->layers[l].exp_gate[e].w, b->layers[l].exp_gate[e].w, gb) &&
                 !memcmp(a->layers[l].exp_up[e].w, b->layers[l].exp_up[e].w, gb) &&
                 !memcmp(a->layers[l].exp_down[e].w, b->layers[l].exp_down[e].w, gb);
    check(ok && a->n_params == b->n_params && a->weight_bytes == b->weight_bytes,
          "fused == per-expert", "%d expert matrices bit-identical, params %llu", n,
          (unsigned long long)a->n_params);
    double mean, sd, want = 1.0 / sqrt((double)c->hidden);
    stats(&b->layers[1].exp_up[6], &mean, &sd);
    check(fabs(mean) < 0.1 * want && fabs(sd - want) < 0.1 * want, "hf expert statistics",
          "mean %.5f std %.5f (want 0, %.5f)", mean, sd, want);
}

static void rm_tree(const char *name) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", root, name);
    if (system(cmd) != 0) printf("note: cleanup of %s failed\n", name);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/lily_test_load_XXXXXX");
    if (!mkdtemp(root)) return 1;
    lily_mk_opts o[6];
    lily_model *m[6];
    const char *names[6] = {"hf", "hf-fused", "mlx4", "mlx8", "dense-hf-tied", "small-mlx4"};
    for (int i = 0; i < 6; i++) {
        lily_mk_preset(i == 5 ? "small" : "tiny", &o[i], NULL);
        o[i].seed = 7;
        o[i].n_threads = 2;
    }
    o[1].fused_experts = 1;
    o[2].layout = o[3].layout = o[5].layout = LILY_MK_MLX;
    o[3].bits = 8;
    snprintf(o[4].cfg.model_type, sizeof o[4].cfg.model_type, "qwen3_5");
    o[4].cfg.intermediate = 96;
    o[4].cfg.tie_embeddings = 1;
    for (int i = 0; i < 6; i++) {
        m[i] = make(names[i], &o[i]);
        if (m[i])
            check(all_bound(m[i]), names[i], "every tensor of %d layers bound", m[i]->cfg.n_layers);
    }
    if (m[0] && m[1]) check_same_experts(m[0], m[1]);
    if (m[0]) {
        check(!strcmp(m[0]->layout, "hf") && !strcmp(m[0]->quant, "bf16") &&
                  m[0]->cfg.vocab == 512 && m[0]->embed.rows == 512 &&
                  m[0]->lm_head.w != m[0]->embed.w,
              "hf", "layout %s quant %s vocab %d", m[0]->layout, m[0]->quant, m[0]->cfg.vocab);
        check_norms(m[0], &o[0], "hf");
    }
    for (int i = 2; i <= 3; i++) {
        if (!m[i]) continue;
        char q[16];
        snprintf(q, sizeof q, "mlx-%dbit", o[i].bits);
        check(!strcmp(m[i]->layout, "mlx") && !strcmp(m[i]->quant, q) && m[0] &&
                  m[i]->n_params == m[0]->n_params,
              names[i], "layout %s quant %s, params %llu == hf", m[i]->layout, m[i]->quant,
              (unsigned long long)m[i]->n_params);
        check_norms(m[i], &o[i], names[i]);
        check_quant(m[i], &o[i], names[i]);
    }
    if (m[4])
        check(!m[4]->cfg.is_moe && m[4]->cfg.tie_embeddings && m[4]->lm_head.w == m[4]->embed.w &&
                  m[4]->layers[0].exp_gate == NULL && m[4]->layers[2].mlp_down.cols == 96,
              "dense-hf-tied", "dense MLP bound, lm_head is the embedding");
    if (m[5]) {
        const lily_config *c = &m[5]->cfg;
        check(c->lin_nv == 3 * c->lin_nk && c->n_kv_heads == 4 && c->layer_is_attn[2] &&
                  c->layer_is_attn[5] && !c->layer_is_attn[3] && c->vocab == 4093 &&
                  m[5]->layers[0].qkv_proj.rows == 2 * 4 * 32 + 12 * 64 &&
                  m[5]->layers[2].q_proj.rows == 8 * 64 * 2,
              "small-mlx4", "shapes: Nv = 3 Nk, 4 KV heads, attention at 2 and 5, vocab 4093");
    }
    /* Failures that need no corruption tooling. */
    lily_model *bad = NULL;
    lily_err err = {{0}};
    int rc = lily_model_load("/nonexistent/lily", &bad, &err);
    check(rc != 0 && bad == NULL && strstr(err.msg, "config.json"), "missing directory", "%s",
          err.msg);
    for (int i = 0; i < 6; i++) {
        lily_model_free(m[i]);
        rm_tree(names[i]);
    }
    lily_model_free(NULL);
    rmdir(root);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
