/* The CPU backend's scratch: sized once at open for max(chunk, LILY_ROWS_MAX) tokens, so steps
 * allocate nothing. */
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

static int imax(int a, int b) {
    return a > b ? a : b;
}

static float *fbuf(size_t n) {
    return lily_xaligned(n * sizeof(float));
}

void cpu_scratch_alloc(lily_backend *b) {
    const lily_config *c = &b->m->cfg;
    const int H = c->hidden;
    const int C = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
    int maxw = imax(imax(c->n_q_heads * c->head_dim * 2, C), imax(c->lin_nv * c->lin_dv, H));
    maxw = imax(maxw, imax(c->shared_inter, c->intermediate));
    const int maxs = imax(imax(c->n_experts, c->lin_nv), 1);
    b->rows = imax(b->chunk, LILY_ROWS_MAX);
    const size_t fn = (size_t)b->rows;
    b->x = fbuf(fn * H);
    b->a = fbuf(fn * H);
    b->mix = fbuf(fn * H);
    b->ffn = fbuf(fn * H);
    b->big0 = fbuf(fn * maxw);
    b->big1 = fbuf(fn * maxw);
    b->big2 = fbuf(fn * maxw);
    b->small0 = fbuf(fn * maxs);
    b->small1 = fbuf(fn * maxs);
    b->kvnew = fbuf((size_t)LILY_ROWS_MAX * 2 * imax(c->n_kv_heads * c->head_dim, 1));
    b->lg = fbuf((size_t)LILY_ROWS_MAX * c->vocab);
    if (c->is_moe) {
        const size_t k = (size_t)c->top_k, I = (size_t)c->moe_inter;
        const size_t Is = (size_t)imax(c->shared_inter, 1);
        b->ex_x = fbuf(fn * H);
        b->ex_g = fbuf(fn * k * I);
        b->ex_u = fbuf(fn * k * I);
        b->ed = fbuf(fn * k * H);
        b->sd = fbuf(fn * H);
        b->sg = fbuf(fn);
        b->sh_g = fbuf(fn * Is);
        b->sh_u = fbuf(fn * Is);
        b->route_idx = lily_xmalloc(fn * k * sizeof(int));
        b->route_wt = lily_xmalloc(fn * k * sizeof(float));
        b->ex_count = lily_xmalloc((size_t)c->n_experts * sizeof(int));
        b->ex_off = lily_xmalloc(((size_t)c->n_experts + 1) * sizeof(int));
        b->ex_rows = lily_xmalloc(fn * k * sizeof(int));
        b->ex_rw = lily_xmalloc(fn * k * sizeof(float));
        b->ex_ops = lily_xmalloc(2 * LILY_ROWS_MAX * k * sizeof(lily_rows_op));
    }
}

void cpu_scratch_free(lily_backend *b) {
    free(b->x), free(b->a), free(b->mix), free(b->ffn);
    free(b->big0), free(b->big1), free(b->big2), free(b->small0), free(b->small1);
    free(b->kvnew), free(b->lg);
    free(b->ex_x), free(b->ex_g), free(b->ex_u), free(b->ed);
    free(b->sd), free(b->sg), free(b->sh_g), free(b->sh_u);
    free(b->route_idx), free(b->route_wt), free(b->ex_count), free(b->ex_off);
    free(b->ex_rows), free(b->ex_rw), free(b->ex_ops), free(b->attn_scratch);
}
