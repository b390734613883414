/* Size accounting of a loaded model: parameters and stored bytes by component, bytes read per
 * decoded token (model.md section 9.1), and per-session state sizes (section 8). */
#ifndef LILY_MODEL_STATS_H
#define LILY_MODEL_STATS_H

#include <stdint.h>

#include "model/model.h"

typedef enum lily_comp {
    LILY_COMP_EMBED = 0,
    LILY_COMP_LM_HEAD, /* 0 when tied to the embedding */
    LILY_COMP_ATTN,    /* q/k/v/o projections */
    LILY_COMP_GDN,     /* in_proj_qkv/z/b/a and out_proj */
    LILY_COMP_CONV,    /* GDN conv1d taps */
    LILY_COMP_EXPERTS, /* routed experts, all of them */
    LILY_COMP_SHARED,  /* shared experts */
    LILY_COMP_ROUTERS, /* router + shared-expert gate */
    LILY_COMP_DENSE,   /* dense SwiGLU MLPs (qwen3_5) */
    LILY_COMP_NORMS,   /* norms, A_log, dt_bias */
    LILY_COMP_N
} lily_comp;

typedef struct lily_model_stats {
    uint64_t params[LILY_COMP_N];
    uint64_t bytes[LILY_COMP_N];    /* as stored in the checkpoint */
    uint64_t bytes_per_token;       /* weights read per decoded token (top-k experts only) */
    uint64_t kv_bytes_per_token;    /* bf16 K and V of every attention layer */
    uint64_t recurrent_state_bytes; /* fp32 GDN state + bf16 conv state, all GDN layers */
    int n_attn, n_gdn;
} lily_model_stats;

/* Short name of a component ("embedding", "attention", ...). */
const char *lily_comp_name(lily_comp c);

/* Fills s for m (loaded by lily_model_load). */
void lily_model_stats_get(const lily_model *m, lily_model_stats *s);

#endif
