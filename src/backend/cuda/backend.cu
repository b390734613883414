/* The CUDA backend: implements the backend contract (backend.h) on one GPU.
 *
 * Residency: open uploads every weight once (cuda_mem.h says in which form) plus the norms and
 * GDN parameters as fp32; nothing is read from host memory afterwards. A state (one per session or
 * snapshot) holds, on the device, a bf16 K and V cache of max_ctx rows per attention layer, and
 * per GDN layer the fp32 conv state [K-1][C] and recurrent state [Nv][Dk][Dv] (gdn.h layout).
 * state_copy is device-to-device.
 *
 * Decode (n == 1) runs the fused GEMV/MoE/GDN/attention kernels; the whole step (embedding to
 * logits and argmax) is captured once per state as a CUDA graph and replayed for every token:
 * the token id and position are read from device memory, refreshed by two small copies before
 * each replay. With the experimental engine option cuda_mega the graph holds the persistent
 * kernel of mega.h instead of the per-op launches. A decode step of several sessions
 * (forward_rows, draw_enqueue_rows) runs the GEMVs and the MoE block once for all rows
 * (lily_cuda_gemv_rows, lily_cuda_moe_decode_rows), the GDN step of all rows in one launch
 * (lily_cuda_gdn_step_rows) and the attention steps per row on its own state, captured once per
 * row count and set of states. Prefill runs a chunk through the tensor-core GEMMs, the grouped
 * MoE, the GDN scan and flash attention on one stream with no host synchronisation inside the
 * chunk. Scratch is sized at open for the prefill chunk, so memory beyond the KV caches does not
 * grow with the prompt. Calls on one backend are serialised by a mutex. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attn.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/mega.h"
#include "backend/cuda/misc.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/sample.h"

extern "C" {
#include "backend/backend.h"
#include "backend/draw.h"
}

namespace {

constexpr int kMaxSplits = 128; /* decode attention splits (device-side choice below this) */
constexpr int kRing = 1024;     /* greedy loop: replays between two reads of the token ring */

struct cu_layer {
    float *in_norm, *post_norm;
    lily_dmat q, k, v, o;
    float *q_norm, *k_norm;
    lily_dmat qkv, z, b, a, out;
    /* k|v and b|a stacked in one allocation when in_all (below) is not and their types match: one
     * prefill GEMM of 2x the rows each (k, v, b, a are then views into them); w == NULL otherwise */
    lily_dmat kv, ba;
    float *conv_w, *dt_bias, *A_log, *gdn_norm;
    lily_dmat router, gate, up, down, sh_gate, sh_up, sh_down, sh_gw;
    /* router over sh_gw and sh_gate over sh_up in one allocation each when their types match
     * (lily_cuda_moe.router_gw, .sh_gu; the four are then views into them); w == NULL otherwise */
    lily_dmat router_gw, sh_gu;
    /* the input projections stacked by rows (views into it): GDN qkv, z, b, a; attention q, k,
     * v; or w NULL */
    lily_dmat in_all;
    lily_cuda_moe moe;
};

} // namespace

/* what a device draw reads and writes (sample.h) */
struct smp_io {
    lily_cuda_sampling cfg;
    uint64_t step;
    int32_t out;
};

struct lily_backend {
    const lily_model *m;
    lily_cuda_prec prec; /* the engine's precision (cu_open), set before each launching call */
    int chunk, C, qw, kvw, Zw, maxw;
    cudaStream_t st;
    pthread_mutex_t mu;
    lily_dmat embed, lm_head_own;
    const lily_dmat *lm_head;
    float *final_norm, *inv_freq;
    cu_layer *L;
    /* scratch */
    float *x, *a, *buf[5], *attn_part, *attn_pre, *logits, *logits_all;
    void *moe_dec, *moe_pre;
    int32_t *d_tok, *d_pos, *d_argmax;
    int32_t *d_ring, *d_step; /* greedy loop: tokens of consecutive graph replays */
    int32_t *h_tok, *h_pos;   /* pinned */
    /* draws: the settings, step and token the sampler reads and writes (device; smp_h, a pinned
     * copy, is no longer written per step: draw_setup passes them by value), the sampler's
     * scratch, and the sampler's launches captured once as a graph */
    smp_io *smp_d, *smp_h;
    void *smp_scr;
    cudaGraphExec_t smp_graph;
    int logits_all_rows;
    size_t weight_bytes;
    /* forward_rows: the rows' tokens and positions (device [LILY_MAX_ROWS], pinned copies), their
     * logits [LILY_MAX_ROWS][V], and one captured step per row count R (rows_graph[R - 1]) with
     * the states it was captured for (re-captured when they change; dropped when one is freed) */
    int32_t *d_trow, *d_prow, *h_trow, *h_prow;
    float *logits_rows; /* row i at i * rows_ld(b) */
    cudaGraphExec_t rows_graph[LILY_MAX_ROWS];
    lily_bstate *rows_s[LILY_MAX_ROWS][LILY_MAX_ROWS];
    /* rows draws: each row's sampler settings, step and token (device), and the sampler's
     * launches over the first R rows' logits captured once per R (smp_rows_graph[R - 1]) */
    smp_io *smp_rows;
    cudaGraphExec_t smp_rows_graph[LILY_MAX_ROWS];
    lily_mega *mega; /* the persistent decode kernel (opts.cuda_mega, experimental) or NULL */
    /* profiling (set_profile): ms per op of the step program while not NULL; the op index of
     * (layer + 1, kind) at prof_idx[(layer + 1) * LILY_OP_COUNT + kind] (-1: no such op), built
     * once; a pool of n_prof_ev events (made while profiling), and per step the events recorded
     * (prof_n) with the op each one closes (prof_op; -1 for the step's start) */
    double *prof;
    int *prof_idx;
    cudaEvent_t *prof_ev;
    int *prof_op;
    int n_prof_ev, prof_n;
};

struct lily_bstate {
    int max_ctx, splits;
    uint16_t **k, **v; /* int16 codes + scales per position (attn.h): lily_cuda_kv_bytes each */
    float **conv, **S;
    cudaGraphExec_t graph;
    /* pipelined draws (draw_enqueue / draw_next), made on the first draw: the last token drawn
     * (device), a ring of drawn tokens for the host (pinned) with an event per slot, and the
     * counts of draws enqueued and read */
    int32_t *d_last, *h_draw;
    cudaEvent_t draw_ev[LILY_DRAW_AHEAD];
    unsigned n_enq, n_read;
    /* a masked draw's allowed ids (lily_draw.allow), made on the first one: a pinned copy the
     * upload reads (rewritten only once every draw of s is read, so its last upload is done) and
     * the device words the sampler reads; [vocab / 32 rounded up] each */
    uint32_t *h_mask, *d_mask;
};

namespace {

/* Floats from one row's logits to the next in b->logits_rows (16-byte aligned rows). */
size_t rows_ld(const lily_backend *b) {
    return ((size_t)b->m->cfg.vocab + 3) & ~(size_t)3;
}

int up_mat(const lily_mat *m, lily_dmat *d, size_t *bytes, lily_err *e, const char *what, int l) {
    if (!m->w) return 0; /* absent (e.g. no shared expert) */
    if (lily_cuda_dmat_upload(m, 1, d, e)) return lily_fail_prefix(e, "layer %d %s", l, what);
    *bytes += lily_cuda_dmat_bytes(d);
    return 0;
}

/* The n matrices ms stacked by rows in *cat (lily_cuda_dmat_upload_cat) when they all exist and
 * have the same type, columns and group, *views[i] views of their rows; otherwise (cat->w NULL)
 * each uploaded on its own when sep, else nothing (the caller uploads them otherwise). */
int up_rows(const lily_mat *ms, int n, lily_dmat *cat, lily_dmat *const *views, bool sep,
            size_t *bytes, lily_err *e, const char *what, int l) {
    memset(cat, 0, sizeof *cat);
    bool same = true;
    for (int i = 0; i < n; i++)
        same = same && ms[i].w && ms[i].dt == ms[0].dt && ms[i].cols == ms[0].cols &&
               ms[i].group == ms[0].group;
    if (!same) {
        for (int i = 0; sep && i < n; i++)
            if (up_mat(&ms[i], views[i], bytes, e, what, l)) return -1;
        return 0;
    }
    lily_dmat v[8];
    if (n > 8 || lily_cuda_dmat_upload_cat(ms, n, cat, v, e))
        return lily_fail_prefix(e, "layer %d %s", l, what);
    for (int i = 0; i < n; i++)
        *views[i] = v[i];
    *bytes += lily_cuda_dmat_bytes(cat);
    return 0;
}

int up_f32(const float *h, size_t n, float **d, lily_err *e) {
    if (!h) {
        *d = nullptr;
        return 0;
    }
    *d = lily_cuda_upload_f32(h, n, e);
    return *d ? 0 : -1;
}

void free_layer(cu_layer *c) {
    lily_dmat *ms[] = {&c->q,     &c->k,         &c->v,     &c->kv,      &c->o,     &c->qkv,
                       &c->z,     &c->b,         &c->a,     &c->ba,      &c->out,   &c->router,
                       &c->gate,  &c->up,        &c->down,  &c->sh_gate, &c->sh_up, &c->sh_down,
                       &c->sh_gw, &c->router_gw, &c->sh_gu, &c->in_all};
    for (lily_dmat *d : ms)
        lily_cuda_dmat_free(d);
    float *fs[] = {c->in_norm, c->post_norm, c->q_norm, c->k_norm,
                   c->conv_w,  c->dt_bias,   c->A_log,  c->gdn_norm};
    for (float *f : fs)
        lily_cuda_free(f);
}

int check_config(const lily_config *c, lily_err *e) {
    int has_gdn = 0, has_attn = 0;
    for (int l = 0; l < c->n_layers; l++)
        (c->layer_is_attn[l] ? has_attn : has_gdn) = 1;
    if (has_gdn && (c->lin_dk != 128 || c->lin_dv % 8 || c->lin_nk < 1 || c->lin_nv % c->lin_nk))
        return lily_fail(e,
                         "CUDA backend: GDN shape Nk=%d Nv=%d Dk=%d Dv=%d unsupported (needs"
                         " Dk=128, Dv%%8==0)",
                         c->lin_nk, c->lin_nv, c->lin_dk, c->lin_dv);
    if (has_gdn && (c->conv_k < 2 || c->conv_k > 6))
        return lily_fail(e, "CUDA backend: conv width %d unsupported (2..6)", c->conv_k);
    if (has_attn) {
        int G = c->n_kv_heads > 0 ? c->n_q_heads / c->n_kv_heads : 0;
        if ((c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256) || c->n_kv_heads < 1 ||
            c->n_q_heads % c->n_kv_heads || (G != 1 && G != 2 && G != 4 && G != 8 && G != 16) ||
            c->rope_dim > c->head_dim)
            return lily_fail(e, "CUDA backend: attention shape Nq=%d Nkv=%d Dh=%d unsupported",
                             c->n_q_heads, c->n_kv_heads, c->head_dim);
    }
    if (c->hidden % 64)
        return lily_fail(e, "CUDA backend: hidden size %d not a multiple of 64", c->hidden);
    return 0;
}

int upload_layer(const lily_model *m, int l, cu_layer *c, size_t *bytes, lily_err *e) {
    const lily_config *cf = &m->cfg;
    const lily_layer *ly = &m->layers[l];
    int H = cf->hidden;
    memset(c, 0, sizeof *c);
    if (up_f32(ly->in_norm, H, &c->in_norm, e) || up_f32(ly->post_norm, H, &c->post_norm, e))
        return -1;
    if (ly->is_attn) {
        /* q, k and v stacked in one matrix when they can be (one prefill GEMM), else q alone and
         * k|v as a pair */
        const lily_mat in[3] = {ly->q_proj, ly->k_proj, ly->v_proj};
        lily_dmat *const inv[3] = {&c->q, &c->k, &c->v};
        const lily_mat kv[2] = {ly->k_proj, ly->v_proj};
        lily_dmat *const kvv[2] = {&c->k, &c->v};
        if (up_rows(in, 3, &c->in_all, inv, false, bytes, e, "q_proj/k_proj/v_proj", l)) return -1;
        if ((!c->in_all.w && (up_mat(&ly->q_proj, &c->q, bytes, e, "q_proj", l) ||
                              up_rows(kv, 2, &c->kv, kvv, true, bytes, e, "k_proj/v_proj", l))) ||
            up_mat(&ly->o_proj, &c->o, bytes, e, "o_proj", l) ||
            up_f32(ly->q_norm, cf->head_dim, &c->q_norm, e) ||
            up_f32(ly->k_norm, cf->head_dim, &c->k_norm, e))
            return -1;
    } else {
        int C = 2 * cf->lin_nk * cf->lin_dk + cf->lin_nv * cf->lin_dv;
        /* qkv, z, b and a stacked in one matrix when they can be (one prefill GEMM), else qkv
         * and z alone and b|a as a pair */
        const lily_mat in[4] = {ly->qkv_proj, ly->z_proj, ly->b_proj, ly->a_proj};
        lily_dmat *const inv[4] = {&c->qkv, &c->z, &c->b, &c->a};
        const lily_mat ba[2] = {ly->b_proj, ly->a_proj};
        lily_dmat *const bav[2] = {&c->b, &c->a};
        if (up_rows(in, 4, &c->in_all, inv, false, bytes, e, "in_proj_qkv/z/b/a", l)) return -1;
        if ((!c->in_all.w &&
             (up_mat(&ly->qkv_proj, &c->qkv, bytes, e, "in_proj_qkv", l) ||
              up_mat(&ly->z_proj, &c->z, bytes, e, "in_proj_z", l) ||
              up_rows(ba, 2, &c->ba, bav, true, bytes, e, "in_proj_b/in_proj_a", l))) ||
            up_mat(&ly->out_proj, &c->out, bytes, e, "out_proj", l) ||
            up_f32(ly->conv_w, (size_t)C * cf->conv_k, &c->conv_w, e) ||
            up_f32(ly->dt_bias, cf->lin_nv, &c->dt_bias, e) ||
            up_f32(ly->A_log, cf->lin_nv, &c->A_log, e) ||
            up_f32(ly->gdn_norm, cf->lin_dv, &c->gdn_norm, e))
            return -1;
    }
    lily_cuda_moe *mo = &c->moe;
    memset(mo, 0, sizeof *mo);
    lily_dmat *const guv[2] = {&c->sh_gate, &c->sh_up};
    if (cf->is_moe) {
        int E = cf->n_experts;
        const bool gw = cf->shared_inter > 0 && ly->sh_gate_w.w;
        const lily_mat gu[2] = {ly->sh_gate, ly->sh_up};
        const lily_mat rg[2] = {ly->router, ly->sh_gate_w};
        lily_dmat *const rgv[2] = {&c->router, &c->sh_gw};
        if (gw ? up_rows(rg, 2, &c->router_gw, rgv, true, bytes, e, "router/shared_expert_gate", l)
               : up_mat(&ly->router, &c->router, bytes, e, "router", l))
            return -1;
        if (lily_cuda_dmat_upload(ly->exp_gate, E, &c->gate, e) ||
            lily_cuda_dmat_upload(ly->exp_up, E, &c->up, e) ||
            lily_cuda_dmat_upload(ly->exp_down, E, &c->down, e))
            return lily_fail_prefix(e, "layer %d experts", l);
        *bytes += lily_cuda_dmat_bytes(&c->gate) + lily_cuda_dmat_bytes(&c->up) +
                  lily_cuda_dmat_bytes(&c->down);
        if (cf->shared_inter > 0 &&
            (up_rows(gu, 2, &c->sh_gu, guv, true, bytes, e, "shared gate_proj/up_proj", l) ||
             up_mat(&ly->sh_down, &c->sh_down, bytes, e, "shared down_proj", l)))
            return -1;
        mo->E = E;
        mo->k = cf->top_k;
        mo->norm = cf->norm_topk_prob;
        mo->router = &c->router;
        mo->gate = &c->gate;
        mo->up = &c->up;
        mo->down = &c->down;
        if (c->sh_gate.w) {
            mo->sh_gate = &c->sh_gate;
            mo->sh_up = &c->sh_up;
            mo->sh_down = &c->sh_down;
            mo->sh_gate_w = c->sh_gw.w ? &c->sh_gw : nullptr;
            mo->sh_gu = c->sh_gu.w ? &c->sh_gu : nullptr;
        }
        mo->router_gw = c->router_gw.w ? &c->router_gw : nullptr;
    } else {
        const lily_mat gu[2] = {ly->mlp_gate, ly->mlp_up};
        if (up_rows(gu, 2, &c->sh_gu, guv, true, bytes, e, "mlp gate_proj/up_proj", l) ||
            up_mat(&ly->mlp_down, &c->sh_down, bytes, e, "mlp down_proj", l))
            return -1;
        mo->sh_gate = &c->sh_gate;
        mo->sh_up = &c->sh_up;
        mo->sh_down = &c->sh_down;
        mo->sh_gu = c->sh_gu.w ? &c->sh_gu : nullptr;
    }
    return 0;
}

/* GEMV over segments that may differ in weight type: one launch per type. */
int gemv_any(const lily_gemv_seg *segs, int n, const float *x, const lily_gemv_pro *pro,
             cudaStream_t st, lily_err *e) {
    int done[LILY_GEMV_SEGS] = {0};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        lily_gemv_seg grp[LILY_GEMV_SEGS];
        int ng = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && segs[j].m->dt == segs[i].m->dt) grp[ng++] = segs[j], done[j] = 1;
        if (lily_cuda_gemv(grp, ng, x, pro, st, e)) return -1;
    }
    return 0;
}

/* gemv_any over nx input vectors (lily_cuda_gemv_rows): segs [nx][n], x [nx], pro NULL or the
 * one prologue of every vector. */
int gemv_any_rows(const lily_gemv_seg *segs, int n, int nx, const float *const *x,
                  const lily_gemv_pro *pro, cudaStream_t st, lily_err *e) {
    int done[LILY_GEMV_SEGS] = {0};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        lily_gemv_seg grp[LILY_GEMV_ROWS * LILY_GEMV_SEGS];
        int pick[LILY_GEMV_SEGS], ng = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && segs[j].m->dt == segs[i].m->dt) pick[ng++] = j, done[j] = 1;
        for (int r = 0; r < nx; r++)
            for (int g = 0; g < ng; g++)
                grp[r * ng + g] = segs[r * n + pick[g]];
        if (lily_cuda_gemv_rows(grp, ng, nx, x, pro, st, e)) return -1;
    }
    return 0;
}

/* The persistent decode kernel over the uploaded weights (mega.h). */
int mega_open(lily_backend *b, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    lily_mega_layer *L = (lily_mega_layer *)calloc(c->n_layers, sizeof *L);
    if (!L) return lily_fail(e, "out of memory");
    auto dm = [](const lily_dmat *d) { return d->w ? d : nullptr; };
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer *y = &b->L[l];
        lily_mega_layer *o = &L[l];
        o->in_norm = y->in_norm, o->post_norm = y->post_norm;
        o->q = dm(&y->q), o->k = dm(&y->k), o->v = dm(&y->v), o->o = dm(&y->o);
        o->q_norm = y->q_norm, o->k_norm = y->k_norm;
        o->qkv = dm(&y->qkv), o->z = dm(&y->z), o->b = dm(&y->b), o->a = dm(&y->a);
        o->out = dm(&y->out);
        o->conv_w = y->conv_w, o->dt_bias = y->dt_bias, o->A_log = y->A_log;
        o->gdn_norm = y->gdn_norm;
        o->router = dm(&y->router), o->gate = dm(&y->gate), o->up = dm(&y->up);
        o->down = dm(&y->down), o->sh_gate = dm(&y->sh_gate), o->sh_up = dm(&y->sh_up);
        o->sh_down = dm(&y->sh_down), o->sh_gw = dm(&y->sh_gw);
    }
    lily_mega_model mm = {b->m, L,         &b->embed, b->lm_head, b->final_norm, b->inv_freq,
                          b->x, b->logits, b->d_tok,  b->d_pos,   b->d_argmax};
    int rc = lily_cuda_mega_create(&mm, &b->mega, e);
    free(L);
    return rc;
}

/* One decode step of s through the persistent kernel. */
int mega_step(lily_backend *b, lily_bstate *s, lily_err *e) {
    const int L = b->m->cfg.n_layers;
    lily_mega_state ms;
    memset(&ms, 0, sizeof ms);
    for (int l = 0; l < L; l++)
        ms.k[l] = s->k[l], ms.v[l] = s->v[l], ms.conv[l] = s->conv[l], ms.S[l] = s->S[l];
    return lily_cuda_mega_step(b->mega, &ms, b->st, e);
}

/* ---- profiling (set_profile) ---------------------------------------------------------------
 *
 * While b->prof is set, the decode step and the rows step run their launches directly on the
 * stream instead of replaying their graphs (the same launches in the same order, so the same
 * logits), with an event recorded after each group of launches: prof_begin before the first,
 * prof_mark after each group, naming the program op the group is charged to, and prof_end at the
 * end of the step adds each group's elapsed time to b->prof[op]. A group that fuses several
 * program ops is charged to one of them (decode_layers says which); the others stay at 0. The
 * capture functions clear b->prof around the capture, so no event is recorded into a graph. */

/* Stops profiling and drops its events. */
void prof_stop(lily_backend *b) {
    if (b->prof_ev) {
        cudaStreamSynchronize(b->st);
        for (int i = 0; i < b->n_prof_ev; i++)
            cudaEventDestroy(b->prof_ev[i]);
    }
    free(b->prof_ev);
    free(b->prof_op);
    b->prof_ev = nullptr;
    b->prof_op = nullptr;
    b->n_prof_ev = b->prof_n = 0;
    b->prof = nullptr;
}

/* The (layer, kind) -> op index map of the step program (once) and the event pool (events: one
 * for the step's start, then one per group, at most 5 a layer plus the embedding and lm_head).
 * Returns 0, or -1 with profiling left off when something could not be made. */
int prof_start(lily_backend *b, double *ms) {
    const lily_config *c = &b->m->cfg;
    if (!b->prof_idx) {
        const size_t n = (size_t)(c->n_layers + 1) * LILY_OP_COUNT;
        if (!(b->prof_idx = (int *)malloc(n * sizeof(int)))) return -1;
        for (size_t i = 0; i < n; i++)
            b->prof_idx[i] = -1;
        lily_program prog;
        lily_program_build(b->m, &prog);
        for (int i = 0; i < prog.n_ops; i++)
            b->prof_idx[(size_t)(prog.ops[i].layer + 1) * LILY_OP_COUNT + prog.ops[i].kind] = i;
        lily_program_free(&prog);
    }
    if (!b->prof_ev) {
        const int n = 6 * c->n_layers + 4;
        b->prof_ev = (cudaEvent_t *)calloc((size_t)n, sizeof(cudaEvent_t));
        b->prof_op = (int *)calloc((size_t)n, sizeof(int));
        if (!b->prof_ev || !b->prof_op) {
            prof_stop(b);
            return -1;
        }
        for (; b->n_prof_ev < n; b->n_prof_ev++)
            if (cudaEventCreate(&b->prof_ev[b->n_prof_ev]) != cudaSuccess) {
                (void)cudaGetLastError();
                prof_stop(b);
                return -1;
            }
    }
    b->prof = ms;
    return 0;
}

/* An event after the group of launches just enqueued, charged to the op (layer, kind) of the
 * program; nothing when not profiling. */
void prof_mark(lily_backend *b, int layer, lily_op_kind kind) {
    if (!b->prof || b->prof_n >= b->n_prof_ev) return;
    b->prof_op[b->prof_n] = b->prof_idx[(size_t)(layer + 1) * LILY_OP_COUNT + kind];
    cudaEventRecord(b->prof_ev[b->prof_n++], b->st);
}

void prof_begin(lily_backend *b) {
    if (!b->prof) return;
    b->prof_n = 0;
    b->prof_op[b->prof_n] = -1;
    cudaEventRecord(b->prof_ev[b->prof_n++], b->st);
}

/* Waits for the step and adds each group's time to b->prof. */
int prof_end(lily_backend *b, lily_err *e) {
    if (!b->prof) return 0;
    LILY_CU_TRY(cudaStreamSynchronize(b->st), e);
    for (int i = 1; i < b->prof_n; i++) {
        float t = 0;
        LILY_CU_TRY(cudaEventElapsedTime(&t, b->prof_ev[i - 1], b->prof_ev[i]), e);
        if (b->prof_op[i] >= 0) b->prof[b->prof_op[i]] += t;
    }
    b->prof_n = 0;
    return 0;
}

void cu_set_profile(lily_backend *b, double *ms) {
    pthread_mutex_lock(&b->mu);
    if (!ms || prof_start(b, ms)) prof_stop(b);
    pthread_mutex_unlock(&b->mu);
}

void cu_close_impl(lily_backend *b) {
    if (!b) return;
    prof_stop(b);
    free(b->prof_idx);
    lily_cuda_mega_free(b->mega);
    if (b->L) {
        for (int l = 0; l < b->m->cfg.n_layers; l++)
            free_layer(&b->L[l]);
        free(b->L);
    }
    lily_cuda_dmat_free(&b->embed);
    lily_cuda_dmat_free(&b->lm_head_own);
    float *fs[] = {b->final_norm, b->inv_freq, b->x,         b->a,      b->buf[0],
                   b->buf[1],     b->buf[2],   b->buf[3],    b->buf[4], b->attn_part,
                   b->attn_pre,   b->logits,   b->logits_all};
    for (float *f : fs)
        lily_cuda_free(f);
    lily_cuda_free(b->moe_dec);
    lily_cuda_free(b->moe_pre);
    lily_cuda_free(b->d_tok);
    lily_cuda_free(b->d_pos);
    lily_cuda_free(b->d_argmax);
    lily_cuda_free(b->d_ring);
    lily_cuda_free(b->d_step);
    if (b->h_tok) cudaFreeHost(b->h_tok);
    if (b->h_pos) cudaFreeHost(b->h_pos);
    if (b->smp_graph) cudaGraphExecDestroy(b->smp_graph);
    for (int r = 0; r < LILY_MAX_ROWS; r++) {
        if (b->rows_graph[r]) cudaGraphExecDestroy(b->rows_graph[r]);
        if (b->smp_rows_graph[r]) cudaGraphExecDestroy(b->smp_rows_graph[r]);
    }
    lily_cuda_free(b->smp_rows);
    lily_cuda_free(b->d_trow);
    lily_cuda_free(b->d_prow);
    lily_cuda_free(b->logits_rows);
    if (b->h_trow) cudaFreeHost(b->h_trow);
    if (b->h_prow) cudaFreeHost(b->h_prow);
    lily_cuda_free(b->smp_d);
    lily_cuda_free(b->smp_scr);
    if (b->smp_h) cudaFreeHost(b->smp_h);
    if (b->st) cudaStreamDestroy(b->st);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

int cu_open(const lily_model *m, const lily_engine_opts *opts, lily_backend **out, lily_err *e) {
    const lily_config *c = &m->cfg;
    *out = nullptr;
    if (check_config(c, e)) return -1;
    if (opts->prefill_chunk < 1)
        return lily_fail(e, "prefill chunk of %d tokens", opts->prefill_chunk);
    if (lily_cuda_set_device(opts->device, e)) return -1;
    lily_backend *b = (lily_backend *)calloc(1, sizeof *b);
    if (!b) return lily_fail(e, "out of memory");
    b->m = m;
    /* the one place that maps a precision to the CUDA kernels: EXACT runs the exact (split
     * operand) GEMMs and attention, DEFAULT and FAST one pass of each (the trained model's
     * quality gate, BENCHMARKS.md) */
    const int exact = opts->precision == LILY_PRECISION_EXACT;
    b->prec.gemm_exact = exact;
    b->prec.attn_exact = exact;
    pthread_mutex_init(&b->mu, nullptr);
    b->chunk = opts->prefill_chunk;
    int H = c->hidden, n = b->chunk;
    b->C = 2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv;
    b->qw = c->n_q_heads * c->head_dim * (c->attn_output_gate ? 2 : 1);
    b->kvw = c->n_kv_heads * c->head_dim;
    b->Zw = c->lin_nv * c->lin_dv;
    int maxw = H;
    int ws[] = {b->C, b->qw, 2 * b->kvw, b->Zw, c->n_q_heads * c->head_dim, 2 * c->lin_nv};
    for (int w : ws)
        maxw = w > maxw ? w : maxw;
    b->maxw = (maxw + 3) & ~3;
    /* buf[0] also takes the stacked input projections (GDN qkv | z | b | a, attention q | k | v) */
    const int inw0 = c->lin_nk > 0 ? b->C + b->Zw + 2 * c->lin_nv : 0;
    const int inw = ((inw0 > b->qw + 2 * b->kvw ? inw0 : b->qw + 2 * b->kvw) + 3) & ~3;
    int rc = -1;
    do {
        if (cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking) != cudaSuccess) {
            lily_fail(e, "cudaStreamCreate failed");
            break;
        }
        size_t bytes = 0;
        if (lily_cuda_dmat_upload(&m->embed, 1, &b->embed, e)) {
            lily_fail_prefix(e, "embed_tokens");
            break;
        }
        bytes += lily_cuda_dmat_bytes(&b->embed);
        if (m->lm_head.w == m->embed.w && m->lm_head.dt == m->embed.dt) {
            b->lm_head = &b->embed;
        } else {
            if (lily_cuda_dmat_upload(&m->lm_head, 1, &b->lm_head_own, e)) {
                lily_fail_prefix(e, "lm_head");
                break;
            }
            bytes += lily_cuda_dmat_bytes(&b->lm_head_own);
            b->lm_head = &b->lm_head_own;
        }
        if (up_f32(m->final_norm, H, &b->final_norm, e)) break;
        float inv[256];
        int half = c->rope_dim / 2;
        for (int i = 0; i < half && i < 256; i++)
            inv[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rope_dim);
        if (up_f32(inv, half > 0 ? half : 1, &b->inv_freq, e)) break;
        b->L = (cu_layer *)calloc(c->n_layers, sizeof(cu_layer));
        /* progress: the layers' share of the file bytes, the rest (embeddings) counted first */
        const uint64_t total = lily_model_file_bytes(m);
        int l = 0;
        for (; l < c->n_layers; l++) {
            if (upload_layer(m, l, &b->L[l], &bytes, e)) break;
            if (opts && opts->progress)
                opts->progress(opts->progress_ud, total / (c->n_layers + 1) * (l + 1), total);
        }
        if (l < c->n_layers) break;
        b->weight_bytes = bytes;
        /* the scratch rows serve a prefill chunk or a decode step of LILY_MAX_ROWS rows */
        size_t fn = (size_t)(n > LILY_MAX_ROWS ? n : LILY_MAX_ROWS);
        if (!(b->x = (float *)lily_cuda_alloc(fn * H * 4, e))) break;
        if (!(b->a = (float *)lily_cuda_alloc(fn * H * 4, e))) break;
        int i = 0;
        for (; i < 5; i++)
            if (!(b->buf[i] = (float *)lily_cuda_alloc(
                      fn * (i == 0 && inw > b->maxw ? inw : b->maxw) * 4, e)))
                break;
        if (i < 5) break;
        /* each row of a rows step its own (lily_cuda_attn_decode_rows) */
        if (!(b->attn_part = (float *)lily_cuda_alloc(
                  LILY_MAX_ROWS *
                      lily_cuda_attn_decode_scratch(c->n_q_heads, c->head_dim, kMaxSplits) * 4,
                  e)))
            break;
        /* the split form of the attention prefill (short chunks deep in the cache) */
        const size_t pre = lily_cuda_attn_prefill_scratch(c->n_q_heads, c->n_kv_heads, c->head_dim);
        if (pre && !(b->attn_pre = (float *)lily_cuda_alloc(pre * 4, e))) break;
        if (!(b->logits = (float *)lily_cuda_alloc((size_t)c->vocab * 4, e))) break;
        if (!(b->logits_rows = (float *)lily_cuda_alloc(LILY_MAX_ROWS * rows_ld(b) * 4, e)) ||
            !(b->d_trow = (int32_t *)lily_cuda_alloc(LILY_MAX_ROWS * 4, e)) ||
            !(b->d_prow = (int32_t *)lily_cuda_alloc(LILY_MAX_ROWS * 4, e)))
            break;
        size_t md = 0, mp = 0;
        for (int j = 0; j < c->n_layers; j++) {
            size_t d = lily_cuda_moe_decode_scratch(&b->L[j].moe);
            size_t p = lily_cuda_moe_prefill_scratch(&b->L[j].moe, n);
            md = d > md ? d : md;
            mp = p > mp ? p : mp;
        }
        if (!(b->moe_dec = lily_cuda_alloc(md, e)) || !(b->moe_pre = lily_cuda_alloc(mp, e)) ||
            lily_cuda_moe_decode_scratch_init(b->moe_dec, b->st, e))
            break;
        if (!(b->d_tok = (int32_t *)lily_cuda_alloc(fn * 4, e)) ||
            !(b->d_pos = (int32_t *)lily_cuda_alloc(4, e)) ||
            !(b->d_argmax = (int32_t *)lily_cuda_alloc(16, e)) || /* index, pad, u64 key */
            !(b->d_ring = (int32_t *)lily_cuda_alloc(kRing * 4, e)) ||
            !(b->d_step = (int32_t *)lily_cuda_alloc(4, e)) ||
            /* every decode graph replay advances the step (lily_cuda_advance), greedy or not */
            lily_cuda_memset(b->d_step, 0, 4, b->st, e) ||
            lily_cuda_memset(b->d_ring, 0, kRing * 4, b->st, e))
            break;
        if (!(b->smp_d = (smp_io *)lily_cuda_alloc(sizeof(smp_io), e)) ||
            !(b->smp_rows = (smp_io *)lily_cuda_alloc(LILY_MAX_ROWS * sizeof(smp_io), e)) ||
            !(b->smp_scr = lily_cuda_alloc(lily_cuda_sample_scratch_bytes(), e)))
            break;
        if (cudaMallocHost((void **)&b->h_tok, fn * 4) != cudaSuccess ||
            cudaMallocHost((void **)&b->h_pos, 4) != cudaSuccess ||
            cudaMallocHost((void **)&b->smp_h, sizeof(smp_io)) != cudaSuccess ||
            cudaMallocHost((void **)&b->h_trow, LILY_MAX_ROWS * 4) != cudaSuccess ||
            cudaMallocHost((void **)&b->h_prow, LILY_MAX_ROWS * 4) != cudaSuccess) {
            lily_fail(e, "cudaMallocHost failed");
            break;
        }
        rc = opts->cuda_mega ? mega_open(b, e) : 0;
    } while (0);
    if (rc) {
        cu_close_impl(b);
        return -1;
    }
    if (opts && opts->progress)
        opts->progress(opts->progress_ud, lily_model_file_bytes(m), lily_model_file_bytes(m));
    *out = b;
    return 0;
}

void cu_close(lily_backend *b) {
    cu_close_impl(b);
}

size_t s_len(const lily_config *c) {
    return (size_t)c->lin_nv * c->lin_dk * c->lin_dv;
}
size_t conv_len(const lily_config *c) {
    return (size_t)(c->conv_k - 1) * (2 * c->lin_nk * c->lin_dk + c->lin_nv * c->lin_dv);
}

size_t cu_state_bytes(lily_backend *b, int max_ctx) {
    const lily_config *c = &b->m->cfg;
    size_t total = 0;
    for (int l = 0; l < c->n_layers; l++)
        total += c->layer_is_attn[l] ? 2 * lily_cuda_kv_bytes(max_ctx, c->n_kv_heads, c->head_dim)
                                     : (conv_len(c) + s_len(c)) * 4;
    return total;
}

/* Drops the rows steps captured over s (its buffers are about to go). */
void rows_forget(lily_backend *b, const lily_bstate *s) {
    for (int r = 0; r < LILY_MAX_ROWS; r++)
        for (int i = 0; i <= r; i++)
            if (b->rows_graph[r] && b->rows_s[r][i] == s) {
                cudaGraphExecDestroy(b->rows_graph[r]);
                b->rows_graph[r] = nullptr;
            }
}

void cu_state_free(lily_backend *b, lily_bstate *s) {
    if (!s) return;
    for (int l = 0; l < b->m->cfg.n_layers; l++) {
        if (s->k) lily_cuda_free(s->k[l]);
        if (s->v) lily_cuda_free(s->v[l]);
        if (s->conv) lily_cuda_free(s->conv[l]);
        if (s->S) lily_cuda_free(s->S[l]);
    }
    free(s->k), free(s->v), free(s->conv), free(s->S);
    if (s->graph) cudaGraphExecDestroy(s->graph);
    rows_forget(b, s);
    if (s->h_draw) {
        cudaStreamSynchronize(b->st); /* no enqueued step may still write them */
        for (int i = 0; i < LILY_DRAW_AHEAD; i++)
            cudaEventDestroy(s->draw_ev[i]);
        cudaFreeHost(s->h_draw);
    }
    if (s->h_mask) cudaFreeHost(s->h_mask);
    lily_cuda_free(s->d_mask);
    lily_cuda_free(s->d_last);
    free(s);
}

void state_zero(lily_backend *b, lily_bstate *s) {
    const lily_config *c = &b->m->cfg;
    lily_err e;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv[l]) lily_cuda_memset(s->conv[l], 0, conv_len(c) * 4, b->st, &e);
        if (s->S[l]) lily_cuda_memset(s->S[l], 0, s_len(c) * 4, b->st, &e);
    }
    cudaStreamSynchronize(b->st);
}

void cu_state_reset(lily_backend *b, lily_bstate *s) {
    pthread_mutex_lock(&b->mu);
    state_zero(b, s);
    pthread_mutex_unlock(&b->mu);
}

int cu_state_create(lily_backend *b, int max_ctx, lily_bstate **out, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    *out = nullptr;
    if (max_ctx < 1) return lily_fail(e, "context size must be at least 1 (got %d)", max_ctx);
    lily_bstate *s = (lily_bstate *)calloc(1, sizeof *s);
    int L = c->n_layers;
    s->max_ctx = max_ctx;
    s->splits = (max_ctx + 31) / 32 < kMaxSplits ? (max_ctx + 31) / 32 : kMaxSplits;
    s->k = (uint16_t **)calloc(L, sizeof(void *));
    s->v = (uint16_t **)calloc(L, sizeof(void *));
    s->conv = (float **)calloc(L, sizeof(void *));
    s->S = (float **)calloc(L, sizeof(void *));
    for (int l = 0; l < L; l++) {
        int bad;
        if (c->layer_is_attn[l]) {
            size_t bytes = lily_cuda_kv_bytes(max_ctx, c->n_kv_heads, c->head_dim);
            s->k[l] = (uint16_t *)lily_cuda_alloc(bytes, e);
            s->v[l] = s->k[l] ? (uint16_t *)lily_cuda_alloc(bytes, e) : nullptr;
            /* zeroed once (~1 ms per 2.7 GB): the rows' padding is never written, and a state
             * copy of the prefix would otherwise move undefined bytes (compute-sanitizer
             * initcheck) */
            bad = !s->v[l] || lily_cuda_memset(s->k[l], 0, bytes, b->st, e) ||
                  lily_cuda_memset(s->v[l], 0, bytes, b->st, e);
        } else {
            s->conv[l] = (float *)lily_cuda_alloc(conv_len(c) * 4, e);
            s->S[l] = s->conv[l] ? (float *)lily_cuda_alloc(s_len(c) * 4, e) : nullptr;
            bad = !s->S[l];
        }
        if (bad) {
            cu_state_free(b, s);
            return lily_fail_prefix(e, "state for a context of %d", max_ctx);
        }
    }
    cu_state_reset(b, s);
    *out = s;
    return 0;
}

int cu_state_copy(lily_backend *b, lily_bstate *dst, const lily_bstate *src, int pos, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (pos > dst->max_ctx || pos > src->max_ctx)
        return lily_fail(e, "state copy of %d positions exceeds a context of %d", pos,
                         pos > dst->max_ctx ? dst->max_ctx : src->max_ctx);
    pthread_mutex_lock(&b->mu);
    int rc = 0;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        if (c->layer_is_attn[l]) {
            size_t bytes = lily_cuda_kv_prefix_bytes(pos, c->n_kv_heads, c->head_dim);
            rc = lily_cuda_d2d(dst->k[l], src->k[l], bytes, b->st, e) ||
                 lily_cuda_d2d(dst->v[l], src->v[l], bytes, b->st, e);
        } else {
            rc = lily_cuda_d2d(dst->conv[l], src->conv[l], conv_len(c) * 4, b->st, e) ||
                 lily_cuda_d2d(dst->S[l], src->S[l], s_len(c) * 4, b->st, e);
        }
    }
    if (!rc && cudaStreamSynchronize(b->st) != cudaSuccess)
        rc = lily_fail(e, "state copy: %s", cudaGetErrorString(cudaGetLastError()));
    pthread_mutex_unlock(&b->mu);
    return rc ? -1 : 0;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* The program op the feed-forward block (one lily_cuda_moe_decode) is charged to. */
lily_op_kind ffn_op(const lily_config *c) {
    return c->is_moe ? LILY_OP_EXPERTS : LILY_OP_MLP;
}

/* One decode step of s. With profiling on (prof_mark), each group of launches is charged to one
 * op of the program; the ops it fuses stay at 0: the q/k/v GEMV (with the in_norm prologue) to
 * ATTN_PROJ, lily_cuda_attn_prep to ATTN_QK, lily_cuda_attn_decode (with the gate) to ATTN_CORE,
 * the o GEMV (with the residual add) to ATTN_OUT; the qkv/z/b/a GEMV (in_norm, conv) to GDN_PROJ,
 * lily_cuda_gdn_step_rows (with the gated norm) to GDN_RECUR, the out GEMV (residual add) to
 * GDN_OUT; the MoE block (post norm, router, top-k, experts, shared expert, combine, residual add)
 * to EXPERTS (MLP for a dense model); the lm_head GEMV (with the final norm) to LM_HEAD. The
 * argmax is no op of the program and is not timed. */
int decode_layers(lily_backend *b, lily_bstate *s, lily_err *e) {
    const lily_model *m = b->m;
    const lily_config *c = &m->cfg;
    cudaStream_t st = b->st;
    int H = c->hidden, Nv = c->lin_nv;
    float eps = c->rms_eps;
    if (lily_cuda_embed(&b->embed, b->d_tok, 1, b->x, H, st, e)) return -1;
    prof_mark(b, -1, LILY_OP_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *ly = &b->L[l];
        lily_gemv_pro norm = {LILY_GP_RMSNORM, ly->in_norm, eps};
        if (c->layer_is_attn[l]) {
            float *qg = b->buf[0], *kb = b->buf[1], *vb = b->buf[2], *q = b->buf[3];
            float *gt = b->buf[4], *o = b->buf[1];
            lily_gemv_seg seg[3] = {{&ly->q, qg, LILY_GV_STORE, nullptr, nullptr, 0},
                                    {&ly->k, kb, LILY_GV_STORE, nullptr, nullptr, 0},
                                    {&ly->v, vb, LILY_GV_STORE, nullptr, nullptr, 0}};
            if (gemv_any(seg, 3, b->x, &norm, st, e)) return -1;
            prof_mark(b, l, LILY_OP_ATTN_PROJ);
            if (lily_cuda_attn_prep(qg, b->qw, kb, vb, b->kvw, 1, b->d_pos, c->n_q_heads,
                                    c->n_kv_heads, c->head_dim, c->rope_dim, b->inv_freq,
                                    ly->q_norm, ly->k_norm, eps, c->attn_output_gate, q, gt,
                                    s->k[l], s->v[l], st, e))
                return -1;
            prof_mark(b, l, LILY_OP_ATTN_QK);
            if (lily_cuda_attn_decode(q, s->k[l], s->v[l], b->d_pos, c->n_q_heads, c->n_kv_heads,
                                      c->head_dim, 1.0f / sqrtf((float)c->head_dim),
                                      c->attn_output_gate ? gt : nullptr, b->attn_part, s->splits,
                                      o, st, e))
                return -1;
            prof_mark(b, l, LILY_OP_ATTN_CORE);
            lily_gemv_seg os = {&ly->o, b->x, LILY_GV_ADD, nullptr, nullptr, 0};
            if (lily_cuda_gemv(&os, 1, o, nullptr, st, e)) return -1;
            prof_mark(b, l, LILY_OP_ATTN_OUT);
        } else {
            float *cv = b->buf[0], *z = b->buf[1], *ba = b->buf[2], *o = b->buf[3];
            lily_gemv_seg seg[4] = {{&ly->qkv, cv, LILY_GV_CONV, s->conv[l], ly->conv_w, c->conv_k},
                                    {&ly->z, z, LILY_GV_STORE, nullptr, nullptr, 0},
                                    {&ly->b, ba, LILY_GV_STORE, nullptr, nullptr, 0},
                                    {&ly->a, ba + Nv, LILY_GV_STORE, nullptr, nullptr, 0}};
            if (gemv_any(seg, 4, b->x, &norm, st, e)) return -1;
            prof_mark(b, l, LILY_OP_GDN_PROJ);
            float *S = s->S[l];
            if (lily_cuda_gdn_step_rows(&S, 1, c->lin_nk, Nv, c->lin_dk, c->lin_dv, cv, 0, ba,
                                        ba + Nv, 0, ly->A_log, ly->dt_bias, z, 0, ly->gdn_norm, eps,
                                        o, 0, st, e))
                return -1;
            prof_mark(b, l, LILY_OP_GDN_RECUR);
            lily_gemv_seg os = {&ly->out, b->x, LILY_GV_ADD, nullptr, nullptr, 0};
            if (lily_cuda_gemv(&os, 1, o, nullptr, st, e)) return -1;
            prof_mark(b, l, LILY_OP_GDN_OUT);
        }
        if (lily_cuda_moe_decode(&ly->moe, b->x, ly->post_norm, eps, b->moe_dec, st, e)) return -1;
        prof_mark(b, l, ffn_op(c));
    }
    lily_gemv_pro fn = {LILY_GP_RMSNORM, b->final_norm, eps};
    lily_gemv_seg hs = {b->lm_head, b->logits, LILY_GV_STORE, nullptr, nullptr, 0};
    if (lily_cuda_gemv(&hs, 1, b->x, &fn, st, e)) return -1;
    prof_mark(b, -1, LILY_OP_LM_HEAD);
    return lily_cuda_argmax(b->logits, c->vocab, (uint64_t *)(b->d_argmax + 2), b->d_argmax, st, e);
}

/* One decode step of R rows: row i consumes b->d_trow[i] at position b->d_prow[i] of s[i] and
 * writes its logits to b->logits_rows + i rows_ld(b). Op by op over the rows, each row with its own scratch
 * rows (x + i H, buf[k] + i maxw): the GEMVs take all rows in one pass over the weights
 * (lily_cuda_gemv_rows, the same per-row arithmetic as decode_layers' lily_cuda_gemv), and so
 * does the MoE block (lily_cuda_moe_decode_rows, each row bit for bit lily_cuda_moe_decode); the
 * GDN step of all rows is one launch of decode_layers' kernel (lily_cuda_gdn_step_rows), the
 * attention steps run per row on its own state, with decode_layers' kernels and arguments. So
 * each row's logits are the 1-row step's bit for bit. Profiling charges its groups to the ops
 * decode_layers names, a group of per-row launches (attention prep, attention) as one. */
int decode_rows(lily_backend *b, lily_bstate *const *s, int R, lily_err *e) {
    const lily_model *m = b->m;
    const lily_config *c = &m->cfg;
    cudaStream_t st = b->st;
    const int H = c->hidden, Nv = c->lin_nv;
    const size_t W = (size_t)b->maxw;
    const float eps = c->rms_eps;
    static_assert(LILY_MAX_ROWS == LILY_GEMV_ROWS, "a rows step is one rows GEMV");
    static_assert(LILY_MAX_ROWS == LILY_MOE_ROWS, "a rows step is one rows MoE decode");
    static_assert(LILY_MAX_ROWS == LILY_GDN_ROWS, "a rows step is one rows GDN step");
    static_assert(LILY_MAX_ROWS == LILY_ATTN_ROWS, "a rows step is one rows attention decode");
    const float *xr[LILY_MAX_ROWS]; /* the rows' residuals */
    for (int i = 0; i < R; i++)
        xr[i] = b->x + (size_t)i * H;
    if (lily_cuda_embed(&b->embed, b->d_trow, R, b->x, H, st, e)) return -1;
    prof_mark(b, -1, LILY_OP_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *ly = &b->L[l];
        const lily_gemv_pro norm = {LILY_GP_RMSNORM, ly->in_norm, eps};
        if (c->layer_is_attn[l]) {
            lily_gemv_seg seg[LILY_MAX_ROWS][3];
            for (int i = 0; i < R; i++) {
                float *qg = b->buf[0] + i * W, *kb = b->buf[1] + i * W, *vb = b->buf[2] + i * W;
                seg[i][0] = {&ly->q, qg, LILY_GV_STORE, nullptr, nullptr, 0};
                seg[i][1] = {&ly->k, kb, LILY_GV_STORE, nullptr, nullptr, 0};
                seg[i][2] = {&ly->v, vb, LILY_GV_STORE, nullptr, nullptr, 0};
            }
            if (gemv_any_rows(&seg[0][0], 3, R, xr, &norm, st, e)) return -1;
            prof_mark(b, l, LILY_OP_ATTN_PROJ);
            void *kc[LILY_MAX_ROWS], *vc[LILY_MAX_ROWS];
            lily_attn_drow ar[LILY_MAX_ROWS];
            const size_t part =
                lily_cuda_attn_decode_scratch(c->n_q_heads, c->head_dim, kMaxSplits);
            for (int i = 0; i < R; i++) {
                kc[i] = s[i]->k[l], vc[i] = s[i]->v[l];
                const float *gt = c->attn_output_gate ? b->buf[4] + i * W : nullptr;
                ar[i] = {b->buf[3] + i * W,       s[i]->k[l],   s[i]->v[l],       b->d_prow + i, gt,
                         b->attn_part + i * part, s[i]->splits, b->buf[1] + i * W};
            }
            if (lily_cuda_attn_prep_rows(
                    b->buf[0], W, b->buf[1], b->buf[2], W, R, b->d_prow, c->n_q_heads,
                    c->n_kv_heads, c->head_dim, c->rope_dim, b->inv_freq, ly->q_norm, ly->k_norm,
                    eps, c->attn_output_gate, b->buf[3], b->buf[4], W, kc, vc, st, e))
                return -1;
            prof_mark(b, l, LILY_OP_ATTN_QK);
            if (lily_cuda_attn_decode_rows(ar, R, c->n_q_heads, c->n_kv_heads, c->head_dim,
                                           1.0f / sqrtf((float)c->head_dim), st, e))
                return -1;
            prof_mark(b, l, LILY_OP_ATTN_CORE);
            lily_gemv_seg os[LILY_MAX_ROWS];
            const float *ov[LILY_MAX_ROWS];
            for (int i = 0; i < R; i++) {
                os[i] = {&ly->o, b->x + (size_t)i * H, LILY_GV_ADD, nullptr, nullptr, 0};
                ov[i] = b->buf[1] + i * W;
            }
            if (lily_cuda_gemv_rows(os, 1, R, ov, nullptr, st, e)) return -1;
            prof_mark(b, l, LILY_OP_ATTN_OUT);
        } else {
            lily_gemv_seg seg[LILY_MAX_ROWS][4];
            for (int i = 0; i < R; i++) {
                float *cv = b->buf[0] + i * W, *z = b->buf[1] + i * W, *ba = b->buf[2] + i * W;
                seg[i][0] = {&ly->qkv, cv, LILY_GV_CONV, s[i]->conv[l], ly->conv_w, c->conv_k};
                seg[i][1] = {&ly->z, z, LILY_GV_STORE, nullptr, nullptr, 0};
                seg[i][2] = {&ly->b, ba, LILY_GV_STORE, nullptr, nullptr, 0};
                seg[i][3] = {&ly->a, ba + Nv, LILY_GV_STORE, nullptr, nullptr, 0};
            }
            if (gemv_any_rows(&seg[0][0], 4, R, xr, &norm, st, e)) return -1;
            prof_mark(b, l, LILY_OP_GDN_PROJ);
            float *Sr[LILY_MAX_ROWS];
            for (int i = 0; i < R; i++)
                Sr[i] = s[i]->S[l];
            if (lily_cuda_gdn_step_rows(Sr, R, c->lin_nk, Nv, c->lin_dk, c->lin_dv, b->buf[0], W,
                                        b->buf[2], b->buf[2] + Nv, W, ly->A_log, ly->dt_bias,
                                        b->buf[1], W, ly->gdn_norm, eps, b->buf[3], W, st, e))
                return -1;
            prof_mark(b, l, LILY_OP_GDN_RECUR);
            lily_gemv_seg os[LILY_MAX_ROWS];
            const float *ov[LILY_MAX_ROWS];
            for (int i = 0; i < R; i++) {
                os[i] = {&ly->out, b->x + (size_t)i * H, LILY_GV_ADD, nullptr, nullptr, 0};
                ov[i] = b->buf[3] + i * W;
            }
            if (lily_cuda_gemv_rows(os, 1, R, ov, nullptr, st, e)) return -1;
            prof_mark(b, l, LILY_OP_GDN_OUT);
        }
        if (lily_cuda_moe_decode_rows(&ly->moe, R, b->x, H, ly->post_norm, eps, b->moe_dec, st, e))
            return -1;
        prof_mark(b, l, ffn_op(c));
    }
    const lily_gemv_pro fn = {LILY_GP_RMSNORM, b->final_norm, eps};
    lily_gemv_seg hs[LILY_MAX_ROWS];
    for (int i = 0; i < R; i++) {
        hs[i] = {b->lm_head, b->logits_rows + i * rows_ld(b), LILY_GV_STORE, nullptr, nullptr, 0};
    }
    if (lily_cuda_gemv_rows(hs, 1, R, xr, &fn, st, e)) return -1;
    prof_mark(b, -1, LILY_OP_LM_HEAD);
    return 0;
}

/* RMSNorm of rows that the exact GEMMs read next (held right after): the norm also writes their
 * split words (lily_cuda_rmsnorm_split). */
int norm_for_gemms(const float *x, int ldx, const float *w, int n, int dim, float eps, float *y,
                   int ldy, cudaStream_t st, lily_err *e) {
    if (lily_cuda_gemm_exact())
        return lily_cuda_rmsnorm_split(x, ldx, w, n, dim, eps, y, ldy, st, e);
    return lily_cuda_rmsnorm(x, ldx, w, n, dim, eps, y, ldy, st, e);
}

int prefill_layers(lily_backend *b, lily_bstate *s, int n, int all_logits, lily_err *e) {
    const lily_model *m = b->m;
    const lily_config *c = &m->cfg;
    cudaStream_t st = b->st;
    int H = c->hidden, Nv = c->lin_nv, Nq = c->n_q_heads, Dh = c->head_dim;
    float eps = c->rms_eps;
    float *X = b->x, *A = b->a;
    if (lily_cuda_embed(&b->embed, b->d_tok, n, X, H, st, e)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *ly = &b->L[l];
        if (norm_for_gemms(X, H, ly->in_norm, n, H, eps, A, H, st, e)) return -1;
        if (c->layer_is_attn[l]) {
            float *qg = b->buf[0], *kb = b->buf[1], *vb = b->buf[2], *q = b->buf[3];
            float *gt = b->buf[4], *o = b->buf[1];
            int gated = c->attn_output_gate;
            int ldkv = b->kvw, ldq = b->qw, rc;
            lily_cuda_xsplit_hold(A); /* the exact GEMMs split A once for q, k, v */
            if (ly->in_all.w) {       /* one GEMM, rows [q k v] */
                ldq = ldkv = ly->in_all.rows;
                kb = qg + b->qw, vb = kb + b->kvw;
                rc = lily_cuda_gemm(&ly->in_all, A, H, n, qg, ldq, 0, st, e);
            } else if (!(rc = lily_cuda_gemm(&ly->q, A, H, n, qg, b->qw, 0, st, e)) && ly->kv.w) {
                /* k and v in one GEMM: rows [k | v] */
                ldkv = 2 * b->kvw, vb = kb + b->kvw;
                rc = lily_cuda_gemm(&ly->kv, A, H, n, kb, ldkv, 0, st, e);
            } else if (!rc) {
                rc = lily_cuda_gemm(&ly->k, A, H, n, kb, b->kvw, 0, st, e) ||
                     lily_cuda_gemm(&ly->v, A, H, n, vb, b->kvw, 0, st, e);
            }
            lily_cuda_xsplit_hold(nullptr);
            if (rc ||
                lily_cuda_attn_prep(qg, ldq, kb, vb, ldkv, n, b->d_pos, Nq, c->n_kv_heads, Dh,
                                    c->rope_dim, b->inv_freq, ly->q_norm, ly->k_norm, eps, gated, q,
                                    gt, s->k[l], s->v[l], st, e) ||
                lily_cuda_attn_prefill(q, n, s->k[l], s->v[l], b->d_pos, Nq, c->n_kv_heads, Dh,
                                       1.0f / sqrtf((float)Dh), gated ? gt : nullptr, o,
                                       b->attn_pre, st, e) ||
                lily_cuda_gemm(&ly->o, o, Nq * Dh, n, X, H, 1, st, e))
                return -1;
        } else {
            float *raw = b->buf[0], *z = b->buf[1], *ba = b->buf[2], *o = b->buf[3];
            float *cv = b->buf[4];
            int C = b->C, Zw = b->Zw, ldr = C, ldz = Zw, ldba = 2 * Nv, rc;
            lily_cuda_xsplit_hold(A); /* split once for the four input projections */
            if (ly->in_all.w) {       /* one GEMM: [qkv z b a] */
                ldr = ldz = ldba = ly->in_all.rows;
                z = raw + C, ba = raw + C + Zw;
                rc = lily_cuda_gemm(&ly->in_all, A, H, n, raw, ldr, 0, st, e);
            } else {
                rc = lily_cuda_gemm(&ly->qkv, A, H, n, raw, C, 0, st, e) ||
                     lily_cuda_gemm(&ly->z, A, H, n, z, Zw, 0, st, e) ||
                     (ly->ba.w ? lily_cuda_gemm(&ly->ba, A, H, n, ba, 2 * Nv, 0, st, e)
                               : lily_cuda_gemm(&ly->b, A, H, n, ba, 2 * Nv, 0, st, e) ||
                                     lily_cuda_gemm(&ly->a, A, H, n, ba + Nv, 2 * Nv, 0, st, e));
            }
            lily_cuda_xsplit_hold(nullptr);
            if (rc ||
                lily_cuda_conv_silu(raw, ldr, n, C, c->conv_k, s->conv[l], ly->conv_w, cv, C, st,
                                    e) ||
                lily_cuda_gdn_scan(s->S[l], c->lin_nk, Nv, c->lin_dk, c->lin_dv, n, cv, C, ba,
                                   ba + Nv, ldba, ly->A_log, ly->dt_bias, o, Zw, st, e) ||
                lily_cuda_gated_rmsnorm(o, Zw, z, ldz, n, Nv, c->lin_dv, ly->gdn_norm, eps, st,
                                        e) ||
                lily_cuda_gemm(&ly->out, o, Zw, n, X, H, 1, st, e))
                return -1;
        }
        if (norm_for_gemms(X, H, ly->post_norm, n, H, eps, A, H, st, e) ||
            lily_cuda_moe_prefill(&ly->moe, A, n, X, b->moe_pre, st, e))
            return -1;
    }
    if (all_logits) {
        if (lily_cuda_rmsnorm(X, H, b->final_norm, n, H, eps, A, H, st, e)) return -1;
        return lily_cuda_gemm(b->lm_head, A, H, n, b->logits_all, c->vocab, 0, st, e);
    }
    lily_gemv_pro fn = {LILY_GP_RMSNORM, b->final_norm, eps};
    lily_gemv_seg hs = {b->lm_head, b->logits, LILY_GV_STORE, nullptr, nullptr, 0};
    return lily_cuda_gemv(&hs, 1, X + (size_t)(n - 1) * H, &fn, st, e);
}

/* The launches of one decode step of s (the persistent kernel when mega, else decode_layers), then
 * its argmax fed into the next step's input (lily_cuda_advance). */
int decode_step(lily_backend *b, lily_bstate *s, bool mega, lily_err *e) {
    if (mega ? mega_step(b, s, e) : decode_layers(b, s, e)) return -1;
    return lily_cuda_advance(b->d_argmax, b->d_tok, b->d_pos, b->d_ring, kRing, b->d_step, b->st,
                             e);
}

/* Captures the decode step of state s into s->graph (once). */
int capture_decode(lily_backend *b, lily_bstate *s, lily_err *e) {
    cudaGraph_t g = nullptr;
    lily_cuda_prec_set(b->prec); /* the captured kernels are this engine's */
    double *prof = b->prof;      /* no profiling event goes into the graph */
    b->prof = nullptr;
    cudaError_t ce = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeRelaxed);
    /* the step ends by feeding its argmax into the next replay's input (used by
     * decode_greedy; forward() overwrites token and position before each replay) */
    int rc = ce != cudaSuccess ? lily_fail(e, "graph capture: %s", cudaGetErrorString(ce))
                               : decode_step(b, s, b->mega != nullptr, e);
    if (ce == cudaSuccess) ce = cudaStreamEndCapture(b->st, &g);
    b->prof = prof;
    if (rc) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return -1;
    }
    if (ce != cudaSuccess) return lily_fail(e, "graph capture: %s", cudaGetErrorString(ce));
    ce = cudaGraphInstantiate(&s->graph, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        s->graph = nullptr;
        return lily_fail(e, "graph instantiate: %s", cudaGetErrorString(ce));
    }
    return 0;
}

int forward_locked(lily_backend *b, lily_bstate *s, const int32_t *tokens, int n, int pos,
                   float *logits, int all_logits, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    memcpy(b->h_tok, tokens, (size_t)n * 4);
    *b->h_pos = pos;
    LILY_CU_TRY(cudaMemcpyAsync(b->d_tok, b->h_tok, (size_t)n * 4, cudaMemcpyHostToDevice, b->st),
                e);
    LILY_CU_TRY(cudaMemcpyAsync(b->d_pos, b->h_pos, 4, cudaMemcpyHostToDevice, b->st), e);
    const float *src = b->logits;
    size_t bytes = (size_t)c->vocab * 4;
    lily_cuda_prec_set(b->prec);
    if (n == 1 && !all_logits && b->prof) {
        /* profiled: the graph's launches run directly, timed op by op (the per-launch step even
         * when the graph holds the persistent kernel) */
        prof_begin(b);
        if (decode_step(b, s, false, e) || prof_end(b, e)) return -1;
    } else if (n == 1 && !all_logits) {
        if (!s->graph && capture_decode(b, s, e)) return -1;
        LILY_CU_TRY(cudaGraphLaunch(s->graph, b->st), e);
    } else {
        if (all_logits && b->logits_all_rows < n) {
            lily_cuda_free(b->logits_all);
            b->logits_all_rows = 0;
            b->logits_all = (float *)lily_cuda_alloc((size_t)b->chunk * c->vocab * 4, e);
            if (!b->logits_all) return -1;
            b->logits_all_rows = b->chunk;
        }
        if (prefill_layers(b, s, n, all_logits, e)) return -1;
        if (all_logits) {
            src = b->logits_all;
            bytes *= n;
        }
    }
    if (logits) LILY_CU_TRY(cudaMemcpyAsync(logits, src, bytes, cudaMemcpyDeviceToHost, b->st), e);
    LILY_CU_TRY(cudaStreamSynchronize(b->st), e);
    LILY_CU_TRY(cudaGetLastError(), e);
    return b->mega ? lily_cuda_mega_failed(b->mega, e) : 0;
}

int cu_forward(lily_backend *b, lily_bstate *s, const int32_t *tokens, int n, int pos,
               float *logits, int all_logits, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (n < 1 || n > b->chunk)
        return lily_fail(e, "forward of %d tokens (chunk limit %d)", n, b->chunk);
    if (pos < 0 || pos + n > s->max_ctx)
        return lily_fail(e, "context overflow: %d + %d tokens exceed the context of %d", pos, n,
                         s->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[t], c->vocab);
    pthread_mutex_lock(&b->mu);
    int rc = forward_locked(b, s, tokens, n, pos, logits, all_logits, e);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* Captures the step of R rows over the states s into b->rows_graph[R - 1]. */
int capture_rows(lily_backend *b, lily_bstate *const *s, int R, lily_err *e) {
    cudaGraphExec_t *ge = &b->rows_graph[R - 1];
    if (*ge) {
        cudaGraphExecDestroy(*ge);
        *ge = nullptr;
    }
    cudaGraph_t g = nullptr;
    lily_cuda_prec_set(b->prec);
    double *prof = b->prof; /* no profiling event goes into the graph */
    b->prof = nullptr;
    cudaError_t ce = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeRelaxed);
    int rc = ce != cudaSuccess ? lily_fail(e, "rows graph capture: %s", cudaGetErrorString(ce))
                               : decode_rows(b, s, R, e);
    if (ce == cudaSuccess) ce = cudaStreamEndCapture(b->st, &g);
    b->prof = prof;
    if (rc) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return -1;
    }
    if (ce != cudaSuccess) return lily_fail(e, "rows graph capture: %s", cudaGetErrorString(ce));
    ce = cudaGraphInstantiate(ge, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        *ge = nullptr;
        return lily_fail(e, "rows graph instantiate: %s", cudaGetErrorString(ce));
    }
    for (int i = 0; i < R; i++)
        b->rows_s[R - 1][i] = s[i];
    return 0;
}

/* The captured step of R rows over s, captured first when there is none for these states; when
 * profiling, its launches run directly, timed op by op (waits for the step). */
int rows_launch(lily_backend *b, lily_bstate *const *s, int R, lily_err *e) {
    if (b->prof) {
        lily_cuda_prec_set(b->prec);
        prof_begin(b);
        if (decode_rows(b, s, R, e)) return -1;
        return prof_end(b, e);
    }
    bool same = b->rows_graph[R - 1] != nullptr;
    for (int i = 0; i < R && same; i++)
        same = b->rows_s[R - 1][i] == s[i];
    if (!same && capture_rows(b, s, R, e)) return -1;
    LILY_CU_TRY(cudaGraphLaunch(b->rows_graph[R - 1], b->st), e);
    return 0;
}

/* Checks the arguments of a step of n rows (backend.h's forward_rows contract). */
int rows_check(lily_backend *b, lily_bstate *const *s, const int32_t *tokens, const int *pos, int n,
               lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (n < 1 || n > LILY_MAX_ROWS)
        return lily_fail(e, "decode rows: %d rows (1 to %d)", n, LILY_MAX_ROWS);
    for (int i = 0; i < n; i++) {
        if (!s[i]) return lily_fail(e, "decode rows: row %d has no state", i);
        for (int j = 0; j < i; j++)
            if (s[j] == s[i])
                return lily_fail(e, "decode rows: rows %d and %d share a state", j, i);
        if (pos[i] < 0 || pos[i] + 1 > s[i]->max_ctx)
            return lily_fail(e, "context overflow: %d + 1 tokens exceed the context of %d", pos[i],
                             s[i]->max_ctx);
        if (tokens && (tokens[i] < 0 || tokens[i] >= c->vocab))
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[i], c->vocab);
    }
    return 0;
}

int cu_forward_rows(lily_backend *b, lily_bstate *const *s, const int32_t *tokens, const int *pos,
                    int n, float *const *logits, lily_err *e) {
    if (rows_check(b, s, tokens, pos, n, e)) return -1;
    const size_t V = (size_t)b->m->cfg.vocab;
    pthread_mutex_lock(&b->mu);
    int rc = -1;
    do {
        memcpy(b->h_trow, tokens, (size_t)n * 4);
        memcpy(b->h_prow, pos, (size_t)n * 4);
        if (cudaMemcpyAsync(b->d_trow, b->h_trow, (size_t)n * 4, cudaMemcpyHostToDevice, b->st) !=
                cudaSuccess ||
            cudaMemcpyAsync(b->d_prow, b->h_prow, (size_t)n * 4, cudaMemcpyHostToDevice, b->st) !=
                cudaSuccess) {
            lily_fail(e, "decode rows: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        if (rows_launch(b, s, n, e)) break;
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = !logits[i] || cudaMemcpyAsync(logits[i], b->logits_rows + i * rows_ld(b), V * 4,
                                               cudaMemcpyDeviceToHost, b->st) == cudaSuccess;
        if (!ok || cudaStreamSynchronize(b->st) != cudaSuccess ||
            cudaGetLastError() != cudaSuccess) {
            lily_fail(e, "decode rows: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        rc = 0;
    } while (0);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* Greedy steps as back-to-back replays of the decode graph: each replay's last kernel writes its
 * argmax into the next replay's token slot and ring, so the host only enqueues launches and
 * reads the ring every kRing steps. */
int cu_decode_greedy(lily_backend *b, lily_bstate *s, int32_t token, int pos, int n, int32_t *out,
                     float *logits, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (n < 1) return lily_fail(e, "greedy decode of %d steps", n);
    if (pos < 0 || pos + n > s->max_ctx)
        return lily_fail(e, "context overflow: %d + %d tokens exceed the context of %d", pos, n,
                         s->max_ctx);
    if (token < 0 || token >= c->vocab)
        return lily_fail(e, "token id %d out of range [0, %d)", token, c->vocab);
    pthread_mutex_lock(&b->mu);
    int rc = -1;
    do {
        *b->h_tok = token;
        *b->h_pos = pos;
        if (cudaMemcpyAsync(b->d_tok, b->h_tok, 4, cudaMemcpyHostToDevice, b->st) != cudaSuccess ||
            cudaMemcpyAsync(b->d_pos, b->h_pos, 4, cudaMemcpyHostToDevice, b->st) != cudaSuccess ||
            cudaMemsetAsync(b->d_step, 0, 4, b->st) != cudaSuccess) {
            lily_fail(e, "greedy decode: copy failed");
            break;
        }
        if (!s->graph && capture_decode(b, s, e)) break;
        int done = 0;
        while (done < n) {
            int batch = n - done < kRing ? n - done : kRing;
            int ok = 1;
            for (int i = 0; i < batch && ok; i++)
                ok = cudaGraphLaunch(s->graph, b->st) == cudaSuccess;
            /* the ring holds replays done .. done + batch at indices done % kRing .. */
            if (!ok ||
                cudaMemcpyAsync(out + done, b->d_ring, (size_t)batch * 4, cudaMemcpyDeviceToHost,
                                b->st) != cudaSuccess ||
                cudaStreamSynchronize(b->st) != cudaSuccess) {
                lily_fail(e, "greedy decode: %s", cudaGetErrorString(cudaGetLastError()));
                ok = 0;
            }
            if (!ok) break;
            done += batch;
        }
        if (done < n || (b->mega && lily_cuda_mega_failed(b->mega, e))) break;
        if (logits && (cudaMemcpyAsync(logits, b->logits, (size_t)c->vocab * 4,
                                       cudaMemcpyDeviceToHost, b->st) != cudaSuccess ||
                       cudaStreamSynchronize(b->st) != cudaSuccess)) {
            lily_fail(e, "greedy decode: logits copy failed");
            break;
        }
        rc = 0;
    } while (0);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* The sampler's launches on b->logits (its settings and step in b->smp_d), captured once. */
int capture_sample(lily_backend *b, lily_err *e) {
    cudaGraph_t g = nullptr;
    LILY_CU_TRY(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeRelaxed), e);
    int rc = lily_cuda_sample(b->logits, b->m->cfg.vocab, &b->smp_d->cfg, &b->smp_d->step,
                              b->smp_scr, &b->smp_d->out, b->st, e);
    cudaError_t ce = cudaStreamEndCapture(b->st, &g);
    if (rc || ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return rc ? -1 : lily_fail(e, "sampler graph capture: %s", cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(&b->smp_graph, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        b->smp_graph = nullptr;
        return lily_fail(e, "sampler graph instantiate: %s", cudaGetErrorString(ce));
    }
    return 0;
}

/* The draw resources of s, made once (not per token). */
int draw_init(lily_bstate *s, lily_err *e) {
    if (s->h_draw) return 0;
    if (!(s->d_last = (int32_t *)lily_cuda_alloc(4, e))) return -1;
    int n = 0;
    while (n < LILY_DRAW_AHEAD &&
           cudaEventCreateWithFlags(&s->draw_ev[n], cudaEventDisableTiming) == cudaSuccess)
        n++;
    if (n < LILY_DRAW_AHEAD ||
        cudaMallocHost((void **)&s->h_draw, LILY_DRAW_AHEAD * sizeof(int32_t)) != cudaSuccess) {
        while (n-- > 0)
            cudaEventDestroy(s->draw_ev[n]);
        s->h_draw = nullptr;
        lily_cuda_free(s->d_last);
        s->d_last = nullptr;
        return lily_fail(e, "draw: %s", cudaGetErrorString(cudaGetLastError()));
    }
    s->n_enq = s->n_read = 0;
    return 0;
}

/* d's mask (lily_draw.allow) uploaded to s->d_mask on the stream, made on the first masked
 * draw; *dev = the device copy, or NULL without a mask. The caller has checked that every draw
 * of s is read (lily_draw_mask_check), so the pinned copy's previous upload is done. */
int mask_upload(lily_backend *b, lily_bstate *s, const lily_draw *d, const uint32_t **dev,
                lily_err *e) {
    *dev = nullptr;
    if (!d->allow) return 0;
    const size_t cap = ((size_t)b->m->cfg.vocab + 31) / 32 * 4;
    if (!s->h_mask) {
        if (!(s->d_mask = (uint32_t *)lily_cuda_alloc(cap, e))) return -1;
        if (cudaMallocHost((void **)&s->h_mask, cap) != cudaSuccess) {
            s->h_mask = nullptr;
            lily_cuda_free(s->d_mask);
            s->d_mask = nullptr;
            return lily_fail(e, "draw mask: %s", cudaGetErrorString(cudaGetLastError()));
        }
    }
    const size_t bytes = ((size_t)d->n_allow + 31) / 32 * 4;
    memcpy(s->h_mask, d->allow, bytes);
    LILY_CU_TRY(cudaMemcpyAsync(s->d_mask, s->h_mask, bytes, cudaMemcpyHostToDevice, b->st), e);
    *dev = s->d_mask;
    return 0;
}

/* One decode step whose logits stay on the device, then the draw there, enqueued without a
 * wait: a launch sets the step's token (given, or the last draw, still on the device), position
 * and draw settings by value; the step's graph; the sampler's graph; the drawn token copied to
 * s->d_last (the next step's input when it is enqueued with token < 0) and into the pinned ring
 * slot the host reads when the slot's event has fired. The host enqueues step n + 1 while step n
 * runs and reads its tokens as they finish. */
int cu_draw_enqueue(lily_backend *b, lily_bstate *s, int32_t token, int pos, const lily_draw *d,
                    lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (pos < 0 || pos + 1 > s->max_ctx)
        return lily_fail(e, "context overflow: %d + 1 tokens exceed the context of %d", pos,
                         s->max_ctx);
    if (token >= c->vocab) return lily_fail(e, "token id %d out of range [0, %d)", token, c->vocab);
    pthread_mutex_lock(&b->mu);
    int rc = -1;
    do {
        if (draw_init(s, e)) break;
        if (s->n_enq - s->n_read >= LILY_DRAW_AHEAD) {
            lily_fail(e, "draw: %d draws are enqueued and unread", LILY_DRAW_AHEAD);
            break;
        }
        if (token < 0 && s->n_enq == 0) {
            lily_fail(e, "draw: no earlier draw to consume");
            break;
        }
        const uint32_t *d_mask;
        if (lily_draw_mask_check(d, c->vocab, (int)(s->n_enq - s->n_read), e) ||
            mask_upload(b, s, d, &d_mask, e))
            break;
        if (!s->graph && capture_decode(b, s, e)) break;
        if (!b->smp_graph && capture_sample(b, e)) break;
        lily_cuda_sampling cfg = {d->temperature, d->top_k, d->top_p, d->min_p,  d->n_ids,
                                  d->ban_id,      d->seed,  d_mask,   d->n_allow};
        const unsigned slot = s->n_enq % LILY_DRAW_AHEAD;
        if (lily_cuda_draw_setup(b->d_tok, b->d_pos, s->d_last, token, pos, &b->smp_d->cfg, &cfg,
                                 &b->smp_d->step, d->step, b->st, e))
            break;
        if (cudaGraphLaunch(s->graph, b->st) != cudaSuccess ||
            cudaGraphLaunch(b->smp_graph, b->st) != cudaSuccess ||
            cudaMemcpyAsync(s->d_last, &b->smp_d->out, 4, cudaMemcpyDeviceToDevice, b->st) !=
                cudaSuccess ||
            cudaMemcpyAsync(&s->h_draw[slot], s->d_last, 4, cudaMemcpyDeviceToHost, b->st) !=
                cudaSuccess ||
            cudaEventRecord(s->draw_ev[slot], b->st) != cudaSuccess) {
            lily_fail(e, "draw: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        s->n_enq++;
        rc = 0;
    } while (0);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* The sampler's launches over the logits of the first R rows (b->logits_rows), row i under
 * b->smp_rows[i], captured once per R. */
int capture_sample_rows(lily_backend *b, int R, lily_err *e) {
    cudaGraph_t g = nullptr;
    const size_t V = (size_t)b->m->cfg.vocab;
    LILY_CU_TRY(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeRelaxed), e);
    int rc = 0;
    for (int i = 0; i < R && !rc; i++)
        rc = lily_cuda_sample(b->logits_rows + i * rows_ld(b), (int)V, &b->smp_rows[i].cfg,
                              &b->smp_rows[i].step, b->smp_scr, &b->smp_rows[i].out, b->st, e);
    cudaError_t ce = cudaStreamEndCapture(b->st, &g);
    if (rc || ce != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        return rc ? -1 : lily_fail(e, "rows sampler graph capture: %s", cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(&b->smp_rows_graph[R - 1], g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        b->smp_rows_graph[R - 1] = nullptr;
        return lily_fail(e, "rows sampler graph instantiate: %s", cudaGetErrorString(ce));
    }
    return 0;
}

/* cu_draw_enqueue for n rows: per row a setup launch (its token or last draw, position, settings
 * and step), the step of n rows (rows_launch), the sampler over each row's logits, and per row
 * the drawn token into its d_last and its pinned ring slot with the slot's event, as
 * cu_draw_enqueue does for one state. */
int cu_draw_enqueue_rows(lily_backend *b, lily_bstate *const *s, const int32_t *tokens,
                         const int *pos, int n, const lily_draw *d, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (rows_check(b, s, nullptr, pos, n, e)) return -1;
    for (int i = 0; i < n; i++) {
        if (tokens[i] >= c->vocab)
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[i], c->vocab);
        if (d[i].allow) return lily_fail(e, "draw rows: row %d has a mask", i);
    }
    pthread_mutex_lock(&b->mu);
    int rc = -1;
    do {
        int i = 0;
        for (; i < n; i++) {
            if (draw_init(s[i], e)) break;
            if (s[i]->n_enq - s[i]->n_read >= LILY_DRAW_AHEAD) {
                lily_fail(e, "draw: %d draws are enqueued and unread", LILY_DRAW_AHEAD);
                break;
            }
            if (tokens[i] < 0 && s[i]->n_enq == 0) {
                lily_fail(e, "draw: no earlier draw to consume");
                break;
            }
        }
        if (i < n) break;
        if (!b->smp_rows_graph[n - 1] && capture_sample_rows(b, n, e)) break;
        for (i = 0; i < n; i++) {
            const lily_draw *di = &d[i];
            lily_cuda_sampling cfg = {di->temperature, di->top_k, di->top_p, di->min_p, di->n_ids,
                                      di->ban_id,      di->seed,  nullptr,   0};
            if (lily_cuda_draw_setup(b->d_trow + i, b->d_prow + i, s[i]->d_last, tokens[i], pos[i],
                                     &b->smp_rows[i].cfg, &cfg, &b->smp_rows[i].step, di->step,
                                     b->st, e))
                break;
        }
        if (i < n || rows_launch(b, s, n, e)) break;
        if (cudaGraphLaunch(b->smp_rows_graph[n - 1], b->st) != cudaSuccess) {
            lily_fail(e, "draw rows: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        for (i = 0; i < n; i++) {
            const unsigned slot = s[i]->n_enq % LILY_DRAW_AHEAD;
            if (cudaMemcpyAsync(s[i]->d_last, &b->smp_rows[i].out, 4, cudaMemcpyDeviceToDevice,
                                b->st) != cudaSuccess ||
                cudaMemcpyAsync(&s[i]->h_draw[slot], s[i]->d_last, 4, cudaMemcpyDeviceToHost,
                                b->st) != cudaSuccess ||
                cudaEventRecord(s[i]->draw_ev[slot], b->st) != cudaSuccess)
                break;
        }
        if (i < n) {
            lily_fail(e, "draw rows: %s", cudaGetErrorString(cudaGetLastError()));
            break;
        }
        for (i = 0; i < n; i++)
            s[i]->n_enq++;
        rc = 0;
    } while (0);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* The oldest unread draw of s, when its step has finished (no lock: only s's event and slot). */
int cu_draw_next(lily_backend *b, lily_bstate *s, int32_t *out, lily_err *e) {
    if (!s->h_draw || s->n_read == s->n_enq) return lily_fail(e, "draw: nothing enqueued to read");
    const unsigned slot = s->n_read % LILY_DRAW_AHEAD;
    cudaError_t ce = cudaEventSynchronize(s->draw_ev[slot]);
    if (ce != cudaSuccess) return lily_fail(e, "draw: %s", cudaGetErrorString(ce));
    if (b->mega && lily_cuda_mega_failed(b->mega, e)) return -1; /* abandoned step: stale logits */
    *out = s->h_draw[slot];
    s->n_read++;
    return 0;
}

void cu_draw_discard(lily_backend *b, lily_bstate *s) {
    if (!s->h_draw || s->n_read == s->n_enq) return;
    cudaEventSynchronize(s->draw_ev[(s->n_enq - 1) % LILY_DRAW_AHEAD]);
    (void)b;
    s->n_read = s->n_enq;
}

void cu_device_name(lily_backend *b, char *buf, size_t len) {
    (void)b;
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
        snprintf(buf, len, "CUDA device");
    else
        snprintf(buf, len, "%s", p.name);
}

size_t cu_device_used(lily_backend *b) {
    (void)b;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return tot - fr;
}

} // namespace

/* Prefill chunk 8192: a larger chunk gives every expert more rows per grouped GEMM (8192 tokens
 * x top-8 / 256 experts = 256 rows, against 16 at 512) and the dense GEMMs fuller grids; scratch
 * grows with the chunk (~2.5 GB of GPU memory at 8192 for the 35B), not with the prompt
 * (measurements: bench/NOTES-cuda.md, "Moved from src comments"). The backend draws tokens
 * itself by default (sample.h). */
extern "C" const lily_backend_ops lily_backend_cuda = {
    "cuda",
    8192,
    1,
    cu_open,
    cu_close,
    cu_state_create,
    cu_state_free,
    cu_state_reset,
    cu_state_copy,
    cu_state_bytes,
    cu_forward,
    cu_forward_rows,
    cu_decode_greedy,
    cu_draw_enqueue,
    cu_draw_next,
    cu_draw_discard,
    cu_draw_enqueue_rows,
    nullptr, /* program: the CUDA backend does not run the step program yet */
    cu_set_profile,
    cu_device_name,
    cu_device_used,
};
