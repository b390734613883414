/* The step program: one forward step of the model as data, the same for every backend.
 *
 * lily_program_build lists, once per model, the ops of one step in the order they run: the
 * embedding, then per layer the input norm, the mixer (attention or Gated DeltaNet, split into
 * its projections, state updates and output projection), the residual add, the post norm and
 * the feed-forward block (router, top-k, experts, shared expert, combine; or a dense MLP), and
 * at the end the final norm and lm_head. Each op names the weights it reads (and their bytes per
 * token), the logical buffers it reads and writes, and the ops it depends on, derived from the
 * buffers (the last earlier writer of each buffer it reads).
 *
 * A backend runs the program op by op (the CPU backend: cpu/step.c); the model's layer loop is
 * written here once. Buffers are names, not memory: a backend maps them to its own scratch and
 * per-session states, and one step may hold several tokens (a prefill chunk) or several rows
 * (one token each of several sessions). Scratch buffers are reused by every layer, so ops of one
 * layer also overwrite what the previous layer read (write-after-read): a backend that runs ops
 * out of order must add those edges or give each layer its own scratch. */
#ifndef LILY_BACKEND_PROGRAM_H
#define LILY_BACKEND_PROGRAM_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

typedef enum lily_op_kind {
    LILY_OP_EMBED,      /* x = embed[token] */
    LILY_OP_IN_NORM,    /* a = rmsnorm(x) * in_norm */
    LILY_OP_ATTN_PROJ,  /* qg = a Wq (per head q | gate), kv = a Wk, a Wv */
    LILY_OP_ATTN_QK,    /* q = rope(rmsnorm(q)); k = rope(rmsnorm(k)); k, v into the KV cache */
    LILY_OP_ATTN_CORE,  /* o = softmax(q K^T / sqrt(Dh)) V over the cache (causal) */
    LILY_OP_ATTN_GATE,  /* o *= sigmoid(gate) */
    LILY_OP_ATTN_OUT,   /* mix = o Wo */
    LILY_OP_GDN_PROJ,   /* qkv = a Wqkv, z = a Wz, b = a Wb, a' = a Wa */
    LILY_OP_GDN_CONV,   /* cv = silu(causal conv(qkv)), updating the conv state */
    LILY_OP_GDN_RECUR,  /* l2norm q, k; beta, decay; S = decay S + k beta (v - S^T k); o = S^T q */
    LILY_OP_GDN_GATE,   /* o = rmsnorm(o) * silu(z) */
    LILY_OP_GDN_OUT,    /* mix = o Wout */
    LILY_OP_RESID_MIX,  /* x += mix */
    LILY_OP_POST_NORM,  /* a = rmsnorm(x) * post_norm */
    LILY_OP_ROUTER,     /* rl = a Wrouter */
    LILY_OP_TOPK,       /* route = top-k of softmax(rl), grouped by expert */
    LILY_OP_EXPERTS,    /* ed[slot] = SwiGLU of the slot's expert on its row of a */
    LILY_OP_SHARED,     /* sd = shared expert SwiGLU(a), sg = a Wsg */
    LILY_OP_COMBINE,    /* ffn = sigmoid(sg) sd + sum over the row's experts (ascending) w ed */
    LILY_OP_MLP,        /* ffn = dense SwiGLU(a) */
    LILY_OP_RESID_FFN,  /* x += ffn */
    LILY_OP_FINAL_NORM, /* a = rmsnorm(x) * final_norm */
    LILY_OP_LM_HEAD,    /* logits = a Wlm */
    LILY_OP_COUNT
} lily_op_kind;

/* Logical buffers. The state buffers (KV, CONV, S) are the session's, per layer. */
typedef enum lily_buf {
    LILY_BUF_TOKENS,
    LILY_BUF_X,      /* residual stream [H] */
    LILY_BUF_A,      /* normed input [H] */
    LILY_BUF_QG,     /* attention q and gate projections */
    LILY_BUF_KVNEW,  /* the new k and v rows */
    LILY_BUF_Q,      /* normed, rotated q */
    LILY_BUF_KV,     /* state: the KV cache of the layer */
    LILY_BUF_O,      /* mixer core output */
    LILY_BUF_QKV,    /* GDN pre-conv projections */
    LILY_BUF_Z,      /* GDN output gate */
    LILY_BUF_BA,     /* GDN beta and decay inputs */
    LILY_BUF_CV,     /* GDN post-conv q, k, v */
    LILY_BUF_CONV,   /* state: the last conv_k - 1 conv inputs */
    LILY_BUF_S,      /* state: the recurrent state [Nv][Dk][Dv] */
    LILY_BUF_MIX,    /* mixer output [H] */
    LILY_BUF_RL,     /* router logits [E] */
    LILY_BUF_ROUTE,  /* chosen experts and weights, grouped by expert */
    LILY_BUF_ED,     /* routed experts' outputs, per slot [H] */
    LILY_BUF_SD,     /* shared expert output [H] and its gate */
    LILY_BUF_FFN,    /* feed-forward output [H] */
    LILY_BUF_LOGITS, /* [V] */
    LILY_BUF_COUNT
} lily_buf;

#define LILY_OP_MAX_W    4
#define LILY_OP_MAX_DEPS 6

typedef struct lily_op {
    lily_op_kind kind;
    int layer;                        /* -1: before or after the layers */
    const lily_mat *w[LILY_OP_MAX_W]; /* the dense weights it reads (not the routed experts) */
    int n_w;
    uint64_t bytes;                     /* weight bytes read per token (experts: top_k of them) */
    uint32_t reads, writes;             /* masks of 1u << lily_buf */
    int deps[LILY_OP_MAX_DEPS], n_deps; /* the last earlier writer of each buffer it reads */
} lily_op;

typedef struct lily_program {
    lily_op *ops;
    int n_ops;
} lily_program;

/* The program of one step of m (borrowed; outlives the program). */
void lily_program_build(const lily_model *m, lily_program *p);
void lily_program_free(lily_program *p);

const char *lily_op_name(lily_op_kind k);
const char *lily_buf_name(lily_buf b);

/* One line per op (index, layer, name, bytes per token, buffers read -> written, dependencies)
 * and a total; ms, when not NULL, adds each op's time [n_ops] in milliseconds. */
void lily_program_print(const lily_program *p, const double *ms, FILE *f);

#endif
