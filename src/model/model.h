/* The loaded model: hyperparameters and every weight bound by name, validated, zero-copy.
 *
 * lily_model_load reads config.json and the safetensors files of a model directory (HF bf16 or
 * MLX affine-quantized layout), maps the files read-only and binds each tensor the forward pass
 * uses into the structs below, after checking its dtype and every dimension. Matrices stay in the
 * mapping in their stored format (lily_mat); small 1-D parameters (norms, conv taps, gates) are
 * converted once to owned fp32 arrays in the form the forward pass applies them (zero-centred HF
 * norms are stored here already as 1+w, so every norm is a plain multiply). */
#ifndef LILY_MODEL_MODEL_H
#define LILY_MODEL_MODEL_H

#include <stdint.h>

#include "lily.h"

#define LILY_MAX_LAYERS 256

typedef enum lily_dtype {
    LILY_DT_F32 = 0,
    LILY_DT_BF16 = 1,
    LILY_DT_F16 = 2,
    LILY_DT_Q4 = 3, /* MLX affine 4-bit: uint32 words, 8 codes each, LSB first */
    LILY_DT_Q8 = 4, /* MLX affine 8-bit: uint32 words, 4 codes each, LSB first */
} lily_dtype;

/* A weight matrix, logical shape [rows, cols], row-major, used as y = W x (PyTorch Linear).
 * F32/BF16/F16: w holds rows*cols elements.
 * Q4/Q8: w holds rows * cols*bits/32 uint32 words (row stride cols*bits/32 words); scales and
 *        biases are bf16 [rows][cols/group]; W[r][c] = scale[r][c/group]*q[r][c] + bias[r][c/group]. */
typedef struct lily_mat {
    lily_dtype dt;
    int rows, cols;
    int group;              /* quantization group size (64); 0 for float types */
    const void *w;          /* borrowed from the mapping */
    const uint16_t *scales; /* bf16 [rows][cols/group], Q types only */
    const uint16_t *biases; /* bf16 [rows][cols/group], Q types only */
} lily_mat;

typedef struct lily_config {
    char model_type[32]; /* "qwen3_5_moe" | "qwen3_5" | "qwen3_next" */
    int is_moe;          /* routed experts in every layer (else a dense SwiGLU MLP) */
    int hidden;          /* H */
    int n_layers;        /* L */
    int vocab;           /* V: rows of embed_tokens / lm_head */
    int n_q_heads;       /* Nq */
    int n_kv_heads;      /* Nkv */
    int head_dim;        /* Dh */
    int rope_dim;        /* R = Dh * partial_rotary_factor, even */
    double rope_theta;
    int attn_output_gate; /* q_proj carries a per-head sigmoid gate (interleaved) */
    int lin_nk, lin_nv;   /* GDN key heads, value heads */
    int lin_dk, lin_dv;   /* GDN key / value head dims */
    int conv_k;           /* causal conv width (4) */
    int n_experts, top_k; /* E, k */
    int moe_inter;        /* I: routed expert width */
    int shared_inter;     /* Is: shared expert width, 0 if none */
    int intermediate;     /* dense MLP width (qwen3_5) */
    int norm_topk_prob;   /* renormalise top-k weights */
    int tie_embeddings;
    float rms_eps;
    int max_position;
    int eos_ids[4]; /* -1 padded */
    uint8_t layer_is_attn[LILY_MAX_LAYERS];
} lily_config;

typedef struct lily_layer {
    int is_attn;
    float *in_norm;   /* [H], effective scale (1+w already applied for HF) */
    float *post_norm; /* [H], effective scale */

    /* Full attention (is_attn). */
    lily_mat q_proj; /* [Nq*Dh*(1+gate), H]: per head [q(Dh) | gate(Dh)] when gated */
    lily_mat k_proj; /* [Nkv*Dh, H] */
    lily_mat v_proj; /* [Nkv*Dh, H] */
    lily_mat o_proj; /* [H, Nq*Dh] */
    float *q_norm;   /* [Dh], effective scale */
    float *k_norm;   /* [Dh], effective scale */

    /* Gated DeltaNet (!is_attn). */
    lily_mat qkv_proj; /* [2*Nk*Dk + Nv*Dv, H]: rows [q | k | v], head-major */
    lily_mat z_proj;   /* [Nv*Dv, H] */
    lily_mat b_proj;   /* [Nv, H] */
    lily_mat a_proj;   /* [Nv, H] */
    lily_mat out_proj; /* [H, Nv*Dv] */
    float *conv_w;     /* [C_qkv][conv_k], tap conv_k-1 multiplies the current input */
    float *dt_bias;    /* [Nv] */
    float *A_log;      /* [Nv] (raw; decay g = -exp(A_log) * softplus(a + dt_bias)) */
    float *gdn_norm;   /* [Dv], plain weight (never shifted) */

    /* Sparse MoE (cfg.is_moe). */
    lily_mat router;    /* [E, H] */
    lily_mat *exp_gate; /* [E] of [I, H] */
    lily_mat *exp_up;   /* [E] of [I, H] */
    lily_mat *exp_down; /* [E] of [H, I] */
    lily_mat sh_gate;   /* [Is, H] */
    lily_mat sh_up;     /* [Is, H] */
    lily_mat sh_down;   /* [H, Is] */
    lily_mat sh_gate_w; /* [1, H] scalar sigmoid gate of the shared expert */

    /* Dense SwiGLU MLP (!cfg.is_moe). */
    lily_mat mlp_gate; /* [intermediate, H] */
    lily_mat mlp_up;   /* [intermediate, H] */
    lily_mat mlp_down; /* [H, intermediate] */
} lily_layer;

typedef struct lily_model {
    lily_config cfg;
    char layout[8];        /* "hf" | "mlx" */
    char quant[32];        /* "bf16", "f32", "mlx-4bit", "mlx-8bit", "mixed" */
    lily_mat embed;        /* [V, H] */
    lily_mat lm_head;      /* [V, H] (the embedding when tied) */
    float *final_norm;     /* [H], effective scale */
    lily_layer *layers;    /* [L] */
    uint64_t n_params;     /* text-model parameters bound */
    uint64_t weight_bytes; /* bytes of the bound tensors as stored */
    void *priv;            /* loader-owned: mappings, owned arrays */
} lily_model;

/* Loads dir. On failure returns -1 with a message naming the file and tensor at fault. */
int lily_model_load(const char *dir, lily_model **out, lily_err *err);
void lily_model_free(lily_model *m);
/* Maps all of m's weight files into memory now (see lily_mmap_prefault): decode then takes no
 * page faults on first use of an expert. progress (may be NULL) is called with the bytes mapped
 * so far of lily_model_file_bytes(m), after every 64 MiB and once at the end. */
void lily_model_prefault(const lily_model *m, void (*progress)(void *, uint64_t, uint64_t),
                         void *ud);
/* Bytes of all of m's weight files (what loading reads). */
uint64_t lily_model_file_bytes(const lily_model *m);

/* Bytes one row of m occupies as stored (codes + scales + biases for Q types). */
uint64_t lily_mat_row_bytes(const lily_mat *m);

#endif
