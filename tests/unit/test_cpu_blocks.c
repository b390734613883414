/* The CPU reference blocks (backend/cpu/blocks.h) on a random tiny model's layers and random
 * inputs: the MoE block as a decode step equals, bit for bit, a plain composition of one-token
 * products (shared expert gated, experts added in the routing's order, here ascending), with the
 * router's routing and a given one; as a prefill chunk it stays close; the dense MLP likewise;
 * the GDN and attention blocks give the same outputs and states token by token (decode) as in one
 * chunk, within fp32 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "backend/cpu/blocks.h"
#include "model/mkmodel.h"
#include "model/model.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / 16777216.0 * 2.0 - 1.0);
}

static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)b[i]));
    return d / (m + 1e-30);
}

static lily_model *make(const char *dir, int dense) {
    lily_err e = {0};
    lily_mk_opts o;
    lily_mk_preset("tiny", &o, &e);
    o.layout = LILY_MK_MLX;
    o.bits = 4;
    o.seed = 5;
    o.n_threads = 1;
    if (dense) {
        o.cfg.intermediate = 128;
        snprintf(o.cfg.model_type, sizeof o.cfg.model_type, "qwen3_5");
    }
    lily_mk_result r;
    lily_model *m = NULL;
    if (lily_mk_write(dir, &o, &r, &e) || lily_model_load(dir, &m, &e)) {
        printf("FAIL model: %s\n", e.msg);
        exit(1);
    }
    return m;
}

static float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* The plain composition: per token, one-token products of the shared expert and the routed ones. */
static void moe_plain(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                      const float *u, int n, const int *idx, const float *wt, float *out) {
    const int H = c->hidden, I = c->moe_inter, Is = c->shared_inter;
    float *g = malloc(sizeof(float) * (I > Is ? I : Is)),
          *v = malloc(sizeof(float) * (I > Is ? I : Is));
    float *y = malloc(sizeof(float) * H);
    for (int t = 0; t < n; t++) {
        const float *x = u + (size_t)t * H;
        float *o = out + (size_t)t * H, l;
        lily_cpu_matmul(k, &ly->sh_gate, x, 1, H, g, Is, NULL);
        lily_cpu_matmul(k, &ly->sh_up, x, 1, H, v, Is, NULL);
        for (int i = 0; i < Is; i++)
            g[i] = lily_silu(g[i]) * v[i];
        lily_cpu_matmul(k, &ly->sh_down, g, 1, Is, y, H, NULL);
        lily_cpu_matmul(k, &ly->sh_gate_w, x, 1, H, &l, 1, NULL);
        for (int i = 0; i < H; i++)
            o[i] = sig(l) * y[i];
        for (int j = 0; j < c->top_k; j++) {
            int ex = idx[t * c->top_k + j];
            lily_cpu_matmul(k, &ly->exp_gate[ex], x, 1, H, g, I, NULL);
            lily_cpu_matmul(k, &ly->exp_up[ex], x, 1, H, v, I, NULL);
            for (int i = 0; i < I; i++)
                g[i] = lily_silu(g[i]) * v[i];
            lily_cpu_matmul(k, &ly->exp_down[ex], g, 1, I, y, H, NULL);
            for (int i = 0; i < H; i++)
                o[i] += wt[t * c->top_k + j] * y[i];
        }
    }
    free(g), free(v), free(y);
}

static void test_ffn(const lily_model *m, lily_pool *pool) {
    const lily_config *c = &m->cfg;
    const int H = c->hidden, n = 11, k = c->top_k;
    lily_err e = {0};
    float *u = malloc(sizeof(float) * n * H), *a = malloc(sizeof(float) * n * H);
    float *b = malloc(sizeof(float) * n * H), *ref = malloc(sizeof(float) * n * H);
    for (int i = 0; i < n * H; i++)
        u[i] = frand();
    int *idx = malloc(sizeof(int) * n * k);
    float *wt = malloc(sizeof(float) * n * k);
    float *lg = malloc(sizeof(float) * c->n_experts);
    const char *pn[] = {"default", "exact"};
    for (int p = 0; p < 2; p++) {
        lily_cpu_kern kk =
            lily_cpu_kern_for(LILY_CPU_ISA_AUTO, p ? LILY_PRECISION_EXACT : LILY_PRECISION_DEFAULT);
        const lily_layer *ly = &m->layers[1];
        if (!c->is_moe) {
            int rc = lily_cpu_ffn_block(&kk, c, ly, u, n, NULL, NULL, 1, a, pool, &e);
            rc |= lily_cpu_ffn_block(&kk, c, ly, u, n, NULL, NULL, 0, b, pool, &e);
            double d = rel(b, a, (size_t)n * H);
            check(!rc && d < (p ? 1e-5 : 1e-3), "mlp block", "%s: prefill vs decode %.3g", pn[p],
                  d);
            continue;
        }
        /* the router's routing: the plain reference routes with the same router product */
        for (int t = 0; t < n; t++) {
            lily_cpu_matmul(&kk, &ly->router, u + (size_t)t * H, 1, H, lg, c->n_experts, NULL);
            lily_cpu_topk_softmax(lg, c->n_experts, k, c->norm_topk_prob, idx + t * k, wt + t * k);
            for (int i = 0; i < k; i++) /* ascending ids: the block's order */
                for (int j = i + 1; j < k; j++)
                    if (idx[t * k + j] < idx[t * k + i]) {
                        int ti = idx[t * k + i];
                        float tw = wt[t * k + i];
                        idx[t * k + i] = idx[t * k + j], wt[t * k + i] = wt[t * k + j];
                        idx[t * k + j] = ti, wt[t * k + j] = tw;
                    }
        }
        moe_plain(&kk, c, ly, u, n, idx, wt, ref);
        int rc = lily_cpu_ffn_block(&kk, c, ly, u, n, NULL, NULL, 1, a, pool, &e);
        check(!rc && !memcmp(a, ref, sizeof(float) * n * H), "moe block",
              "%s: decode, the router's routing, bit for bit (%.3g)", pn[p], rel(a, ref, n * H));
        rc = lily_cpu_ffn_block(&kk, c, ly, u, n, NULL, NULL, 0, b, pool, &e);
        double d = rel(b, ref, (size_t)n * H);
        check(!rc && d < (p ? 1e-5 : 1e-3), "moe block", "%s: prefill chunk %.3g", pn[p], d);
        /* a given routing (every token on the same experts, reversed weights) */
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                idx[t * k + j] = j * 2 % c->n_experts, wt[t * k + j] = 0.3f + 0.1f * (k - j);
        moe_plain(&kk, c, ly, u, n, idx, wt, ref);
        rc = lily_cpu_ffn_block(&kk, c, ly, u, n, idx, wt, 1, a, pool, &e);
        check(!rc && !memcmp(a, ref, sizeof(float) * n * H), "moe block",
              "%s: decode, a given routing, bit for bit", pn[p]);
        idx[3] = c->n_experts;
        check(lily_cpu_ffn_block(&kk, c, ly, u, n, idx, wt, 1, a, pool, &e) != 0, "moe block",
              "an expert out of range is refused (%s)", e.msg);
    }
    free(u), free(a), free(b), free(ref), free(idx), free(wt), free(lg);
}

static void test_mixers(const lily_model *m, lily_pool *pool) {
    const lily_config *c = &m->cfg;
    const int H = c->hidden, n = 9, ctx = 80, pos = 50;
    const int C = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
    const size_t cl = (size_t)(c->conv_k - 1) * C, sl = (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
    const size_t kl = (size_t)ctx * c->n_kv_heads * c->head_dim;
    lily_cpu_kern kk = lily_cpu_kern_for(LILY_CPU_ISA_AUTO, LILY_PRECISION_EXACT);
    lily_err e = {0};
    float *u = malloc(sizeof(float) * n * H), *a = malloc(sizeof(float) * n * H);
    float *b = malloc(sizeof(float) * n * H);
    float *st[2][4];
    for (int i = 0; i < 2; i++) {
        st[i][0] = malloc(sizeof(float) * cl), st[i][1] = malloc(sizeof(float) * sl);
        st[i][2] = malloc(sizeof(float) * kl), st[i][3] = malloc(sizeof(float) * kl);
    }
    for (int i = 0; i < n * H; i++)
        u[i] = frand();
    for (size_t i = 0; i < cl; i++)
        st[0][0][i] = st[1][0][i] = frand();
    for (size_t i = 0; i < sl; i++)
        st[0][1][i] = st[1][1][i] = frand() * 0.1f;
    for (size_t i = 0; i < kl; i++)
        st[0][2][i] = st[1][2][i] = frand(), st[0][3][i] = st[1][3][i] = frand();
    int gl = -1, al = -1;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_is_attn[l])
            al = al < 0 ? l : al;
        else
            gl = gl < 0 ? l : gl;
    int rc = lily_cpu_gdn_block(&kk, c, &m->layers[gl], st[0][0], st[0][1], u, n, 1, a, pool, &e);
    rc |= lily_cpu_gdn_block(&kk, c, &m->layers[gl], st[1][0], st[1][1], u, n, 0, b, pool, &e);
    double d = rel(b, a, (size_t)n * H), ds = rel(st[1][1], st[0][1], sl);
    double dc = rel(st[1][0], st[0][0], cl);
    check(!rc && d < 1e-4 && ds < 1e-4 && dc < 1e-5, "gdn block",
          "decode vs chunk: out %.3g, state %.3g, conv state %.3g", d, ds, dc);
    rc = lily_cpu_attn_block(&kk, c, &m->layers[al], st[0][2], st[0][3], ctx, pos, u, n, 1, a, pool,
                             &e);
    rc |= lily_cpu_attn_block(&kk, c, &m->layers[al], st[1][2], st[1][3], ctx, pos, u, n, 0, b,
                              pool, &e);
    d = rel(b, a, (size_t)n * H);
    double dk = rel(st[1][2], st[0][2], kl);
    check(!rc && d < 1e-4 && dk < 1e-5, "attn block", "decode vs chunk: out %.3g, K cache %.3g", d,
          dk);
    check(lily_cpu_attn_block(&kk, c, &m->layers[al], st[0][2], st[0][3], ctx, ctx - 2, u, n, 1, a,
                              pool, &e) != 0,
          "attn block", "past the context is refused (%s)", e.msg);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            free(st[i][j]);
    free(u), free(a), free(b);
}

int main(void) {
    char root[64];
    snprintf(root, sizeof root, "/tmp/lily_test_blocks_XXXXXX");
    if (!mkdtemp(root)) return 1;
    char moe[128], dense[128];
    snprintf(moe, sizeof moe, "%s/moe", root);
    snprintf(dense, sizeof dense, "%s/dense", root);
    lily_model *m = make(moe, 0), *d = make(dense, 1);
    lily_pool *pool = lily_pool_create(2);
    test_ffn(m, pool);
    test_ffn(m, NULL);
    test_ffn(d, pool);
    test_mixers(m, pool);
    lily_pool_free(pool);
    lily_model_free(m);
    lily_model_free(d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("note: cleanup failed\n");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
