/* Tensor list and value generator of synthetic checkpoints; see mkmodel_plan.h. */
#include "model/mkmodel_plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/config.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

/* The splitmix64 finaliser: a strong 64-bit mix, used in counter mode. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t stream(uint64_t key, uint64_t i) {
    return mix64(key + (i + 1) * GOLDEN);
}

static inline uint64_t derive(uint64_t key, uint64_t e) {
    return mix64(key ^ mix64((e + 1) * 0xd1b54a32d192ed03ull));
}

/* Approximately N(0,1): a scaled sum of four 16-bit uniforms (Irwin-Hall), bounded by +-3.46. */
static inline float normal(uint64_t x) {
    uint32_t s = (uint32_t)(x & 0xffff) + (uint32_t)((x >> 16) & 0xffff) +
                 (uint32_t)((x >> 32) & 0xffff) + (uint32_t)(x >> 48);
    return ((float)s + 2.0f) * (1.0f / 65536.0f) * 1.7320508f - 2.0f * 1.7320508f;
}

/* f32 -> bf16, round to nearest even (inputs here are finite). Local so the loops inline it. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline double uniform(uint64_t x) {
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* std of a code drawn uniformly from [0, 2^bits): sqrt((4^bits - 1) / 12). */
static double code_std(int bits) {
    return sqrt((pow(4.0, bits) - 1.0) / 12.0);
}

static float group_scale(const lily_mk_tensor *t, uint64_t i) {
    float s = t->scale_base * (1.0f + 0.1f * normal(stream(t->key, i)));
    return lily_st_bf16_f32(to_bf16(s));
}

static float value(const lily_mk_tensor *t, uint64_t i) {
    switch (t->kind) {
    case MK_NORMAL: {
        uint64_t key = t->key, j = i;
        if (t->per_expert) {
            uint64_t e = i / (uint64_t)t->per_expert;
            j = i % (uint64_t)t->per_expert;
            key = derive(t->key, e);
            if (t->split_rows && j / (uint64_t)t->cols >= (uint64_t)t->split_rows) {
                key = derive(t->key2, e);
                j -= (uint64_t)t->split_rows * (uint64_t)t->cols;
            }
        }
        return t->mean + t->std * normal(stream(key, j));
    }
    case MK_ALOG: return (float)log(1.0 + 15.0 * uniform(stream(t->key, i)));
    case MK_DTBIAS: {
        double dt = exp(log(1e-3) + uniform(stream(t->key, i)) * (log(1e-1) - log(1e-3)));
        return (float)(dt + log(-expm1(-dt)));
    }
    case MK_SCALES: return group_scale(t, i);
    case MK_BIASES: return -0.5f * (float)((1u << t->bits) - 1) * group_scale(t, i);
    case MK_CODES: break;
    }
    return 0.0f;
}

static inline void store(lily_st_dtype dt, unsigned char *d, float v) {
    if (dt == LILY_ST_F32) {
        memcpy(d, &v, 4);
    } else {
        uint16_t h = to_bf16(v);
        memcpy(d, &h, 2);
    }
}

/* MK_NORMAL in runs of constant stream key: the same values as value(), without a division per
 * element (this loop makes most of the 35B HF checkpoint). */
static void gen_normal(const lily_mk_tensor *t, uint64_t e0, uint64_t e1, unsigned char *d) {
    const lily_st_dtype dt = t->dtype;
    const size_t es = lily_st_dtype_size(dt);
    const float mean = t->mean, sd = t->std;
    for (uint64_t i = e0; i < e1;) {
        uint64_t key = t->key, base = 0, end = e1;
        if (t->per_expert) {
            uint64_t pe = (uint64_t)t->per_expert, e = i / pe, start = e * pe;
            key = derive(t->key, e);
            base = start;
            if (start + pe < end) end = start + pe;
            if (t->split_rows) {
                uint64_t split = (uint64_t)t->split_rows * (uint64_t)t->cols;
                if (i - start >= split) {
                    key = derive(t->key2, e);
                    base = start + split;
                } else if (start + split < end) {
                    end = start + split;
                }
            }
        }
        unsigned char *o = d + es * (i - e0);
        if (dt == LILY_ST_BF16) {
            for (; i < end; i++, o += 2)
                store(LILY_ST_BF16, o, mean + sd * normal(stream(key, i - base)));
        } else {
            for (; i < end; i++, o += 4)
                store(LILY_ST_F32, o, mean + sd * normal(stream(key, i - base)));
        }
    }
}

void lily_mk_gen(const lily_mk_tensor *t, uint64_t e0, uint64_t e1, void *dst) {
    unsigned char *d = dst;
    if (t->kind == MK_NORMAL) {
        gen_normal(t, e0, e1, d);
    } else if (t->kind == MK_CODES) {
        /* Two words per 64-bit draw: code generation dominates the MLX 35B write. */
        for (uint64_t i = e0; i < e1;) {
            uint64_t x = stream(t->key, i >> 1);
            for (int h = (int)(i & 1); h < 2 && i < e1; h++, i++) {
                uint32_t w = (uint32_t)(x >> (32 * h));
                memcpy(d + 4 * (i - e0), &w, 4);
            }
        }
    } else {
        size_t es = lily_st_dtype_size(t->dtype);
        for (uint64_t i = e0; i < e1; i++)
            store(t->dtype, d + es * (i - e0), value(t, i));
    }
}

/* ---- plan building ------------------------------------------------------------------------- */

typedef struct {
    lily_mk_plan *p;
    const lily_mk_opts *o;
    const char *prefix; /* text-trunk prefix */
    int mlx;
} builder;

static uint64_t name_key(const lily_mk_opts *o, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *s = name; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return mix64(h ^ mix64(o->seed + GOLDEN));
}

static lily_mk_tensor *add(builder *b, lily_st_dtype dt, mk_kind kind, int ndim,
                           const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static lily_mk_tensor *add(builder *b, lily_st_dtype dt, mk_kind kind, int ndim,
                           const int64_t *shape, const char *fmt, ...) {
    lily_mk_plan *p = b->p;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = lily_xrealloc(p->t, (size_t)p->cap * sizeof *p->t);
    }
    lily_mk_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dt;
    t->kind = kind;
    t->ndim = ndim;
    t->nbytes = lily_st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->nbytes *= (uint64_t)shape[i];
    }
    t->key = name_key(b->o, t->name);
    return t;
}

/* A 1-D tensor `name` of n values, mean + std * N(0,1). */
static void add_vec(builder *b, const char *name, int64_t n, float mean, float std,
                    lily_st_dtype dt) {
    lily_mk_tensor *t = add(b, dt, MK_NORMAL, 1, &n, "%s", name);
    t->mean = mean;
    t->std = std;
}

/* The zero-centred norm `name`: HF stores w ~ 0.1 N, MLX stores bf16(1 + w). */
static void add_norm(builder *b, const char *name, int64_t n) {
    add_vec(b, name, n, b->mlx ? 1.0f : 0.0f, 0.1f, LILY_ST_BF16);
}

/* A linear module as [n,] rows x cols: HF bf16 `.weight`, or MLX packed codes + scales + biases.
 * n > 0 makes an MLX switch_mlp stack. */
static void add_lin(builder *b, const char *module, int n, int64_t rows, int64_t cols, float std,
                    int bits) {
    int64_t shp[3], *s = shp;
    int nd = 2;
    if (n > 0) {
        *s++ = n;
        nd = 3;
    }
    s[0] = rows;
    if (!b->mlx) {
        s[1] = cols;
        lily_mk_tensor *t = add(b, LILY_ST_BF16, MK_NORMAL, nd, shp, "%s.weight", module);
        t->std = std;
        return;
    }
    s[1] = cols * bits / 32;
    add(b, LILY_ST_U32, MK_CODES, nd, shp, "%s.weight", module);
    s[1] = cols / 64;
    int si = b->p->n; /* indices, not pointers: add() may move the array */
    add(b, LILY_ST_BF16, MK_SCALES, nd, shp, "%s.scales", module);
    add(b, LILY_ST_BF16, MK_BIASES, nd, shp, "%s.biases", module);
    lily_mk_tensor *sc = &b->p->t[si], *bi = &b->p->t[si + 1];
    sc->std = std;
    sc->bits = bits;
    sc->scale_base = (float)(std / code_std(bits));
    *bi = *sc; /* same key: each bias is derived from its group's scale */
    bi->kind = MK_BIASES;
    snprintf(bi->name, sizeof bi->name, "%s.biases", module);
}

static void add_experts(builder *b, const char *lp, int l, float res) {
    const lily_config *c = &b->o->cfg;
    int E = c->n_experts, I = c->moe_inter, H = c->hidden;
    float sin = 1.0f / sqrtf((float)H), sdown = res / sqrtf((float)I);
    char mod[256], logical[96];
    if (b->mlx) {
        snprintf(mod, sizeof mod, "%smlp.switch_mlp.gate_proj", lp);
        add_lin(b, mod, E, I, H, sin, b->o->bits);
        snprintf(mod, sizeof mod, "%smlp.switch_mlp.up_proj", lp);
        add_lin(b, mod, E, I, H, sin, b->o->bits);
        snprintf(mod, sizeof mod, "%smlp.switch_mlp.down_proj", lp);
        add_lin(b, mod, E, H, I, sdown, b->o->bits);
        return;
    }
    /* Logical keys independent of the expert layout, so fused and per-expert files agree. */
    snprintf(logical, sizeof logical, "layers.%d.experts.gate", l);
    uint64_t kg = name_key(b->o, logical);
    snprintf(logical, sizeof logical, "layers.%d.experts.up", l);
    uint64_t ku = name_key(b->o, logical);
    snprintf(logical, sizeof logical, "layers.%d.experts.down", l);
    uint64_t kd = name_key(b->o, logical);
    if (b->o->fused_experts) {
        int64_t gu[3] = {E, 2 * I, H}, dn[3] = {E, H, I};
        lily_mk_tensor *t =
            add(b, LILY_ST_BF16, MK_NORMAL, 3, gu, "%smlp.experts.gate_up_proj", lp);
        t->std = sin;
        t->key = kg;
        t->key2 = ku;
        t->per_expert = 2 * (int64_t)I * H;
        t->split_rows = I;
        t->cols = H;
        t = add(b, LILY_ST_BF16, MK_NORMAL, 3, dn, "%smlp.experts.down_proj", lp);
        t->std = sdown;
        t->key = kd;
        t->per_expert = (int64_t)H * I;
        return;
    }
    int64_t up[2] = {I, H}, dn[2] = {H, I};
    for (int e = 0; e < E; e++) {
        lily_mk_tensor *t =
            add(b, LILY_ST_BF16, MK_NORMAL, 2, up, "%smlp.experts.%d.gate_proj.weight", lp, e);
        t->std = sin;
        t->key = derive(kg, (uint64_t)e);
        t = add(b, LILY_ST_BF16, MK_NORMAL, 2, up, "%smlp.experts.%d.up_proj.weight", lp, e);
        t->std = sin;
        t->key = derive(ku, (uint64_t)e);
        t = add(b, LILY_ST_BF16, MK_NORMAL, 2, dn, "%smlp.experts.%d.down_proj.weight", lp, e);
        t->std = sdown;
        t->key = derive(kd, (uint64_t)e);
    }
}

static void add_layer(builder *b, int l) {
    const lily_config *c = &b->o->cfg;
    int H = c->hidden, bits = b->o->bits;
    float sin = 1.0f / sqrtf((float)H), res = 1.0f / sqrtf(2.0f * (float)c->n_layers);
    char lp[160], n[256];
    snprintf(lp, sizeof lp, "%slayers.%d.", b->prefix, l);
    snprintf(n, sizeof n, "%sinput_layernorm.weight", lp);
    add_norm(b, n, H);
    snprintf(n, sizeof n, "%spost_attention_layernorm.weight", lp);
    add_norm(b, n, H);
    if (c->layer_is_attn[l]) {
        int qd = c->n_q_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
        snprintf(n, sizeof n, "%sself_attn.q_proj", lp);
        add_lin(b, n, 0, (int64_t)qd * (c->attn_output_gate ? 2 : 1), H, sin, bits);
        snprintf(n, sizeof n, "%sself_attn.k_proj", lp);
        add_lin(b, n, 0, kvd, H, sin, bits);
        snprintf(n, sizeof n, "%sself_attn.v_proj", lp);
        add_lin(b, n, 0, kvd, H, sin, bits);
        snprintf(n, sizeof n, "%sself_attn.o_proj", lp);
        add_lin(b, n, 0, H, qd, res / sqrtf((float)qd), bits);
        snprintf(n, sizeof n, "%sself_attn.q_norm.weight", lp);
        add_norm(b, n, c->head_dim);
        snprintf(n, sizeof n, "%sself_attn.k_norm.weight", lp);
        add_norm(b, n, c->head_dim);
    } else {
        int kd = c->lin_nk * c->lin_dk, vd = c->lin_nv * c->lin_dv, C = 2 * kd + vd;
        snprintf(n, sizeof n, "%slinear_attn.in_proj_qkv", lp);
        add_lin(b, n, 0, C, H, sin, bits);
        snprintf(n, sizeof n, "%slinear_attn.in_proj_z", lp);
        add_lin(b, n, 0, vd, H, sin, bits);
        snprintf(n, sizeof n, "%slinear_attn.in_proj_b", lp);
        add_lin(b, n, 0, c->lin_nv, H, sin, bits);
        snprintf(n, sizeof n, "%slinear_attn.in_proj_a", lp);
        add_lin(b, n, 0, c->lin_nv, H, sin, bits);
        /* HF [C,1,K]; MLX moves the kernel axis to the middle: [C,K,1]. Same element order. */
        int64_t cs[3] = {C, b->mlx ? c->conv_k : 1, b->mlx ? 1 : c->conv_k};
        lily_mk_tensor *t =
            add(b, LILY_ST_BF16, MK_NORMAL, 3, cs, "%slinear_attn.conv1d.weight", lp);
        t->std = 0.5f;
        int64_t nv = c->lin_nv;
        add(b, LILY_ST_BF16, MK_DTBIAS, 1, &nv, "%slinear_attn.dt_bias", lp);
        add(b, LILY_ST_F32, MK_ALOG, 1, &nv, "%slinear_attn.A_log", lp);
        snprintf(n, sizeof n, "%slinear_attn.norm.weight", lp);
        add_vec(b, n, c->lin_dv, 1.0f, 0.1f, b->mlx ? LILY_ST_BF16 : LILY_ST_F32);
        snprintf(n, sizeof n, "%slinear_attn.out_proj", lp);
        add_lin(b, n, 0, H, vd, res / sqrtf((float)vd), bits);
    }
    if (!c->is_moe) {
        int I = c->intermediate;
        snprintf(n, sizeof n, "%smlp.gate_proj", lp);
        add_lin(b, n, 0, I, H, sin, bits);
        snprintf(n, sizeof n, "%smlp.up_proj", lp);
        add_lin(b, n, 0, I, H, sin, bits);
        snprintf(n, sizeof n, "%smlp.down_proj", lp);
        add_lin(b, n, 0, H, I, res / sqrtf((float)I), bits);
        return;
    }
    snprintf(n, sizeof n, "%smlp.gate", lp);
    add_lin(b, n, 0, c->n_experts, H, sin, 8);
    add_experts(b, lp, l, res);
    if (c->shared_inter > 0) {
        int Is = c->shared_inter;
        snprintf(n, sizeof n, "%smlp.shared_expert.gate_proj", lp);
        add_lin(b, n, 0, Is, H, sin, bits);
        snprintf(n, sizeof n, "%smlp.shared_expert.up_proj", lp);
        add_lin(b, n, 0, Is, H, sin, bits);
        snprintf(n, sizeof n, "%smlp.shared_expert.down_proj", lp);
        add_lin(b, n, 0, H, Is, res / sqrtf((float)Is), bits);
        snprintf(n, sizeof n, "%smlp.shared_expert_gate", lp);
        add_lin(b, n, 0, 1, H, sin, 8);
    }
}

void lily_mk_plan_build(const lily_mk_opts *o, lily_mk_plan *p) {
    memset(p, 0, sizeof *p);
    builder b = {p, o, o->layout == LILY_MK_MLX ? "language_model.model." : "model.language_model.",
                 o->layout == LILY_MK_MLX};
    const lily_config *c = &o->cfg;
    char n[256];
    snprintf(n, sizeof n, "%sembed_tokens", b.prefix);
    add_lin(&b, n, 0, c->vocab, c->hidden, 1.0f, o->bits);
    for (int l = 0; l < c->n_layers; l++)
        add_layer(&b, l);
    snprintf(n, sizeof n, "%snorm.weight", b.prefix);
    add_norm(&b, n, c->hidden);
    if (!c->tie_embeddings)
        add_lin(&b, b.mlx ? "language_model.lm_head" : "lm_head", 0, c->vocab, c->hidden,
                4.0f / sqrtf((float)c->hidden), o->bits);
}

void lily_mk_plan_free(lily_mk_plan *p) {
    if (!p) return;
    free(p->t);
    memset(p, 0, sizeof *p);
}
