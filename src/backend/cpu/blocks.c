/* The CPU reference blocks (blocks.h): a one-layer model around the caller's config and weights,
 * and a backend of its own scratch, run through the step's op functions. */
#include "backend/cpu/blocks.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

typedef struct {
    lily_backend b;
    lily_model m;
    lily_bstate s;
    float *kp, *vp, *cp, *sp; /* the state's layer 0 */
    lily_pool *own;
} ref;

static void ref_open(ref *r, const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                     int n, int max_ctx, lily_pool *pool) {
    memset(r, 0, sizeof *r);
    r->m.cfg = *c;
    r->m.cfg.n_layers = 1;
    r->m.layers = (lily_layer *)ly; /* read only: the ops never write weights */
    r->b.m = &r->m;
    r->b.kern = *k;
    r->b.pool = pool ? pool : (r->own = lily_pool_create(1));
    r->b.chunk = n;
    cpu_scratch_alloc(&r->b);
    if (max_ctx > 0) {
        size_t per =
            lily_cpu_attention_scratch(c->n_q_heads, c->n_kv_heads, c->head_dim, max_ctx + n);
        r->b.attn_scratch =
            lily_xaligned((size_t)lily_pool_threads(r->b.pool) * per * sizeof(float));
    }
    r->s.max_ctx = max_ctx;
    r->s.k = &r->kp, r->s.v = &r->vp, r->s.conv = &r->cp, r->s.S = &r->sp;
}

static void ref_close(ref *r) {
    cpu_scratch_free(&r->b);
    lily_pool_free(r->own);
}

/* A step over n tokens of the one state (a chunk) or one token (a decode step) at pos. */
static cpu_step one_step(ref *r, int n, int rows, int pos) {
    cpu_step st = {.n = n, .rows = rows};
    for (int i = 0; i < (rows ? n : 1); i++)
        st.s[i] = &r->s, st.pos[i] = pos;
    return st;
}

static int check_n(int n, lily_err *e) {
    return n < 1 ? lily_fail(e, "a block of %d rows", n) : 0;
}

int lily_cpu_ffn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                       const float *u, int n, const int *idx, const float *wt, int as_decode,
                       float *out, lily_pool *pool, lily_err *e) {
    if (check_n(n, e)) return -1;
    if ((idx != NULL) != (wt != NULL)) return lily_fail(e, "a routing needs both idx and wt");
    if (idx)
        for (int i = 0; i < n * c->top_k; i++)
            if (idx[i] < 0 || idx[i] >= c->n_experts)
                return lily_fail(e, "expert %d out of range [0, %d)", idx[i], c->n_experts);
    const int H = c->hidden, step_n = as_decode ? LILY_ROWS_MAX : n;
    ref r;
    ref_open(&r, k, c, ly, step_n, 0, pool);
    for (int t0 = 0; t0 < n; t0 += step_n) {
        const int m = n - t0 < step_n ? n - t0 : step_n;
        cpu_step st = {.n = m, .rows = as_decode || m == 1};
        memcpy(r.b.a, u + (size_t)t0 * H, (size_t)m * H * sizeof(float));
        if (!c->is_moe) {
            cpu_op_mlp(&r.b, &st, 0);
        } else {
            if (idx) {
                const size_t kk = (size_t)c->top_k;
                memcpy(r.b.route_idx, idx + t0 * kk, m * kk * sizeof(int));
                memcpy(r.b.route_wt, wt + t0 * kk, m * kk * sizeof(float));
                cpu_route_group(&r.b, m);
            } else {
                cpu_op_router(&r.b, &st, 0);
                cpu_op_topk(&r.b, &st, 0);
            }
            cpu_op_shared(&r.b, &st, 0);
            cpu_op_experts(&r.b, &st, 0);
            cpu_op_combine(&r.b, &st, 0);
        }
        memcpy(out + (size_t)t0 * H, r.b.ffn, (size_t)m * H * sizeof(float));
    }
    ref_close(&r);
    return 0;
}

int lily_cpu_gdn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                       float *conv, float *S, const float *u, int n, int as_decode, float *out,
                       lily_pool *pool, lily_err *e) {
    if (check_n(n, e)) return -1;
    const int H = c->hidden, step_n = as_decode ? 1 : n;
    ref r;
    ref_open(&r, k, c, ly, step_n, 0, pool);
    r.cp = conv, r.sp = S;
    for (int t0 = 0; t0 < n; t0 += step_n) {
        cpu_step st = one_step(&r, step_n, step_n == 1, 0);
        memcpy(r.b.a, u + (size_t)t0 * H, (size_t)step_n * H * sizeof(float));
        cpu_op_gdn_proj(&r.b, &st, 0);
        cpu_op_gdn_conv(&r.b, &st, 0);
        cpu_op_gdn_recur(&r.b, &st, 0);
        cpu_op_gdn_gate(&r.b, &st, 0);
        cpu_op_gdn_out(&r.b, &st, 0);
        memcpy(out + (size_t)t0 * H, r.b.mix, (size_t)step_n * H * sizeof(float));
    }
    ref_close(&r);
    return 0;
}

int lily_cpu_attn_block(const lily_cpu_kern *k, const lily_config *c, const lily_layer *ly,
                        float *kc, float *vc, int max_ctx, int pos, const float *u, int n,
                        int as_decode, float *out, lily_pool *pool, lily_err *e) {
    if (check_n(n, e)) return -1;
    if (pos < 0 || pos + n > max_ctx)
        return lily_fail(e, "attention block: %d + %d tokens exceed a context of %d", pos, n,
                         max_ctx);
    const int H = c->hidden, step_n = as_decode ? 1 : n;
    ref r;
    ref_open(&r, k, c, ly, step_n, max_ctx, pool);
    r.kp = kc, r.vp = vc;
    for (int t0 = 0; t0 < n; t0 += step_n) {
        cpu_step st = one_step(&r, step_n, step_n == 1, pos + t0);
        memcpy(r.b.a, u + (size_t)t0 * H, (size_t)step_n * H * sizeof(float));
        cpu_op_attn_proj(&r.b, &st, 0);
        cpu_op_attn_qk(&r.b, &st, 0);
        cpu_op_attn_core(&r.b, &st, 0);
        if (c->attn_output_gate) cpu_op_attn_gate(&r.b, &st, 0);
        cpu_op_attn_out(&r.b, &st, 0);
        memcpy(out + (size_t)t0 * H, r.b.mix, (size_t)step_n * H * sizeof(float));
    }
    ref_close(&r);
    return 0;
}
