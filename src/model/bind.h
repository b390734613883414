/* Binding tensors of a safetensors set to lily_mat views and owned fp32 vectors, with checks.
 *
 * Each bind call looks a tensor up by name, checks its dtype and every dimension against what the
 * config implies, and reports expected vs actual with the file and tensor name on a mismatch. The
 * binder accumulates parameter and byte counts and owns the fp32 arrays it creates. */
#ifndef LILY_MODEL_BIND_H
#define LILY_MODEL_BIND_H

#include <stdint.h>

#include "lily.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/stats.h"

typedef struct lily_binder {
    const lily_st_set *st;
    const lily_qconfig *q;
    const char *dir;   /* for messages about missing tensors */
    int shifted_norms; /* zero-centred norms are stored as 1+w already (MLX) */
    uint64_t n_params, weight_bytes;
    unsigned dtypes_seen; /* bit per lily_dtype of bound matrices */
    lily_comp comp;       /* component the next binds count towards */
    uint64_t comp_params[LILY_COMP_N], comp_bytes[LILY_COMP_N];
    void **owned; /* arrays freed with the model */
    int n_owned, cap_owned;
    lily_err *err;
} lily_binder;

/* What lily_model.priv points to: the mappings, the owned arrays and the per-component tallies
 * (shared by load.c and stats.c). */
typedef struct lily_model_priv {
    lily_st_set *st;
    void **owned;
    int n_owned;
    uint64_t comp_params[LILY_COMP_N], comp_bytes[LILY_COMP_N];
} lily_model_priv;

/* Records p (heap) to be freed by lily_binder_free_owned; returns p. */
void *lily_binder_own(lily_binder *b, void *p);
void lily_binder_free_owned(void **owned, int n);

/* Binds the matrix of module path (tensor path + ".weight", with ".scales"/".biases" when MLX
 * quantized) as [rows, cols]. rows < 0 accepts any row count (the embedding). */
int lily_bind_mat(lily_binder *b, const char *module, int rows, int cols, lily_mat *out);
/* Binds a stack [n, rows, cols] (MLX switch_mlp: module.weight/.scales/.biases; or an HF fused
 * tensor named exactly module with no suffix when fused_name) as n views of [rows, cols]. When
 * split > 0 the stack is [n, 2*rows, cols] and row block 0 goes to out, block 1 to out2. */
int lily_bind_stack(lily_binder *b, const char *module, int fused_name, int n, int rows, int cols,
                    lily_mat *out, lily_mat *out2);
/* Binds the 1-D tensor name ([n], F32/BF16/F16) into an owned fp32 array; adds 1 when shift. */
int lily_bind_vec(lily_binder *b, const char *name, int n, int shift, float **out);
/* Binds a depthwise conv weight (HF [C,1,K], MLX [C,K,1], or [C,K]) into owned fp32 [C][K]. */
int lily_bind_conv(lily_binder *b, const char *name, int C, int K, float **out);

#endif
