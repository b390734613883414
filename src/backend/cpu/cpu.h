/* The CPU backend's own types: the backend, its per-session states and one step of the program.
 *
 * forward.c holds the backend ops (backend.h), state.c the states, scratch.c the scratch sized at
 * open, step.c the program's runner and its small ops; step_attn.c, step_gdn.c and step_ffn.c
 * the ops of the mixers and of the feed-forward block; blocks.c runs them as reference blocks. */
#ifndef LILY_BACKEND_CPU_CPU_H
#define LILY_BACKEND_CPU_CPU_H

#include <math.h>
#include <pthread.h>

#include "backend/backend.h"
#include "backend/cpu/draw.h"
#include "backend/cpu/gemv_rows.h"
#include "backend/cpu/ops.h"
#include "backend/program.h"
#include "base/pool.h"

/* The row product takes as many rows as a step of the contract (lily.h) may have. */
_Static_assert(LILY_MAX_ROWS <= LILY_ROWS_MAX, "forward_rows needs the row product for all rows");

struct lily_backend {
    const lily_model *m;
    lily_pool *pool;
    lily_cpu_kern kern; /* the kernels' instruction set and precision (the engine's options) */
    int chunk;          /* max tokens per forward */
    int rows;           /* max(chunk, LILY_ROWS_MAX): tokens or rows the scratch holds */
    lily_program prog;  /* the step, built at open */
    double *prof;       /* NULL, or each op's time in ms is added to prof[op] (set_profile) */
    pthread_mutex_t mu;
    /* scratch, [rows][...] each */
    float *x, *a, *mix, *ffn;         /* [H] residual, normed input, mixer output, FFN output */
    float *big0, *big1, *big2;        /* [maxw] projections */
    float *small0, *small1;           /* [maxs] per-head gates, router logits */
    float *kvnew;                     /* [LILY_ROWS_MAX][2 Nkv Dh] new k, v rows of a row step */
    float *ex_x, *ex_g, *ex_u;        /* expert gather [H], gate/up [I] ([rows * k] slots) */
    float *ed;                        /* [rows * k][H] routed experts' outputs per slot */
    float *sd, *sg, *sh_g, *sh_u;     /* shared expert: out [H], gate [1], gate/up [Is] */
    int *route_idx;                   /* [rows][k] */
    float *route_wt;                  /* [rows][k] */
    int *ex_count, *ex_off, *ex_rows; /* [E], [E+1], [rows*k] */
    float *ex_rw;                     /* [rows*k] routing weight per slot */
    lily_rows_op *ex_ops;             /* [2 LILY_ROWS_MAX k] the experts' products of a row step */
    float *lg;                        /* [LILY_ROWS_MAX][V] logits of a row step */
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

/* One step: a chunk of n tokens of one session at positions pos[0] .. pos[0] + n - 1 (rows ==
 * 0, n > 1: the prefill products), or n <= LILY_ROWS_MAX rows (rows == 1), row i one token of
 * session s[i] at pos[i] (a decode step is one row). */
typedef struct cpu_step {
    int n, rows;
    lily_bstate *s[LILY_ROWS_MAX];
    int pos[LILY_ROWS_MAX];
    const int32_t *tokens;
    float *logits; /* chunk: [n][V] when all_logits, else the last token's [V] */
    int all_logits;
    float *const *row_logits; /* rows: [n] of [V] */
} cpu_step;

/* scratch.c */
void cpu_scratch_alloc(lily_backend *b);
void cpu_scratch_free(lily_backend *b);

/* state.c */
size_t cpu_state_bytes(lily_backend *b, int max_ctx);
int cpu_state_create(lily_backend *b, int max_ctx, lily_bstate **out, lily_err *e);
void cpu_state_free(lily_backend *b, lily_bstate *s);
void cpu_state_reset(lily_backend *b, lily_bstate *s);
int cpu_state_copy(lily_backend *b, lily_bstate *dst, const lily_bstate *src, int pos, lily_err *e);

/* step.c: runs the program; the caller holds b->mu. */
void cpu_step_run(lily_backend *b, const cpu_step *st);
/* Y = X W^T for the step's n tokens or rows (the row product for rows, the prefill product for a
 * chunk); cpu_mm_many: several products of the same step as one job where it can. */
void cpu_mm(lily_backend *b, const cpu_step *st, const lily_mat *W, const float *X, int ldx,
            float *Y, int ldy);
void cpu_mm_many(lily_backend *b, const cpu_step *st, const lily_rows_op *ops, int n_ops);

/* The ops of the program, one function per lily_op_kind (step_attn.c, step_gdn.c, step_ffn.c). */
void cpu_op_attn_proj(lily_backend *b, const cpu_step *st, int l);
void cpu_op_attn_qk(lily_backend *b, const cpu_step *st, int l);
void cpu_op_attn_core(lily_backend *b, const cpu_step *st, int l);
void cpu_op_attn_gate(lily_backend *b, const cpu_step *st, int l);
void cpu_op_attn_out(lily_backend *b, const cpu_step *st, int l);
void cpu_op_gdn_proj(lily_backend *b, const cpu_step *st, int l);
void cpu_op_gdn_conv(lily_backend *b, const cpu_step *st, int l);
void cpu_op_gdn_recur(lily_backend *b, const cpu_step *st, int l);
void cpu_op_gdn_gate(lily_backend *b, const cpu_step *st, int l);
void cpu_op_gdn_out(lily_backend *b, const cpu_step *st, int l);
void cpu_op_router(lily_backend *b, const cpu_step *st, int l);
void cpu_op_topk(lily_backend *b, const cpu_step *st, int l);
/* Groups the routing in route_idx / route_wt [n][k] by expert: expert e's slots are
 * ex_off[e] .. ex_off[e + 1] - 1, their rows ex_rows (ascending) and weights ex_rw. */
void cpu_route_group(lily_backend *b, int n);
void cpu_op_experts(lily_backend *b, const cpu_step *st, int l);
void cpu_op_shared(lily_backend *b, const cpu_step *st, int l);
void cpu_op_combine(lily_backend *b, const cpu_step *st, int l);
void cpu_op_mlp(lily_backend *b, const cpu_step *st, int l);

static inline float cpu_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

#endif
