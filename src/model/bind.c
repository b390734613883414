/* Tensor binding with dtype and shape checks; see bind.h. */
#include "model/bind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

#define NAME_MAX_LEN 512

void *lily_binder_own(lily_binder *b, void *p) {
    if (b->n_owned == b->cap_owned) {
        b->cap_owned = b->cap_owned ? 2 * b->cap_owned : 256;
        b->owned = lily_xrealloc(b->owned, (size_t)b->cap_owned * sizeof *b->owned);
    }
    b->owned[b->n_owned++] = p;
    return p;
}

void lily_binder_free_owned(void **owned, int n) {
    for (int i = 0; i < n; i++)
        free(owned[i]);
    free(owned);
}

static void tally(lily_binder *b, uint64_t params, uint64_t bytes) {
    b->n_params += params;
    b->weight_bytes += bytes;
    b->comp_params[b->comp] += params;
    b->comp_bytes[b->comp] += bytes;
}

static const lily_st_tensor *find(lily_binder *b, const char *name) {
    return lily_st_find(b->st, name);
}

static int missing(lily_binder *b, const char *name, const char *expect) {
    return lily_fail(b->err, "%s: missing tensor \"%s\" (expected %s)", b->dir, name, expect);
}

/* Checks t's shape against want[0..nd) (a negative entry matches anything). */
static int check_shape(lily_binder *b, const lily_st_tensor *t, const int64_t *want, int nd) {
    int ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = want[i] < 0 || t->shape[i] == want[i];
    if (ok) return 0;
    char got[160], exp[160] = "[";
    size_t o = 1;
    for (int i = 0; i < nd && o < sizeof exp; i++) {
        if (want[i] < 0)
            o += (size_t)snprintf(exp + o, sizeof exp - o, "%s*", i ? ", " : "");
        else
            o += (size_t)snprintf(exp + o, sizeof exp - o, "%s%lld", i ? ", " : "",
                                  (long long)want[i]);
    }
    if (o < sizeof exp) snprintf(exp + o, sizeof exp - o, "]");
    return lily_fail(b->err, "%s: tensor \"%s\": shape %s, expected %s", lily_st_path_of(b->st, t),
                     t->name, lily_st_shape_str(t, got, sizeof got), exp);
}

static int check_dtype(lily_binder *b, const lily_st_tensor *t, unsigned allowed_mask,
                       const char *allowed) {
    if (allowed_mask & (1u << t->dtype)) return 0;
    return lily_fail(b->err, "%s: tensor \"%s\": dtype %s, expected %s", lily_st_path_of(b->st, t),
                     t->name, lily_st_dtype_name(t->dtype), allowed);
}

#define FLOAT_MASK ((1u << LILY_ST_BF16) | (1u << LILY_ST_F32) | (1u << LILY_ST_F16))

static lily_dtype float_dt(lily_st_dtype d) {
    return d == LILY_ST_F32 ? LILY_DT_F32 : d == LILY_ST_F16 ? LILY_DT_F16 : LILY_DT_BF16;
}

/* Quantization of module m that has a .scales companion: from the table, else from the shapes. */
static int quant_params(lily_binder *b, const char *module, const lily_st_tensor *w,
                        const lily_st_tensor *sc, int cols, int *bits, int *group) {
    int found = lily_qconfig_lookup(b->q, module, bits, group);
    if (found && *bits == 0)
        return lily_fail(b->err,
                         "%s: tensor \"%s.scales\" exists but the quantization table marks "
                         "\"%s\" as unquantized",
                         lily_st_path_of(b->st, sc), module, module);
    if (!found && b->q && b->q->present) {
        *bits = b->q->bits;
        *group = b->q->group;
    } else if (!found) { /* no table: infer from the packed width and the scale count */
        int64_t wc = w->ndim ? w->shape[w->ndim - 1] : 0,
                sc_c = sc->ndim ? sc->shape[sc->ndim - 1] : 0;
        *bits = cols > 0 && (wc * 32) % cols == 0 ? (int)(wc * 32 / cols) : 0;
        *group = sc_c > 0 && cols % sc_c == 0 ? (int)(cols / sc_c) : 0;
    }
    if (*bits != 4 && *bits != 8)
        return lily_fail(b->err, "%s: tensor \"%s\": %d-bit quantization is not supported (4 or 8)",
                         lily_st_path_of(b->st, w), w->name, *bits);
    if ((*group != 32 && *group != 64 && *group != 128) || cols % *group)
        return lily_fail(b->err,
                         "%s: tensor \"%s\": group size %d does not fit %d columns (32, 64 "
                         "or 128 dividing the columns)",
                         lily_st_path_of(b->st, w), w->name, *group, cols);
    return 0;
}

/* The bound core of lily_bind_mat / lily_bind_stack: n stacked [rows, cols] matrices (n = 0 for
 * a plain 2-D matrix). */
static int bind_any(lily_binder *b, const char *module, const char *wname, int n, int rows,
                    int cols, lily_mat *out, int split, lily_mat *out2) {
    char sname[NAME_MAX_LEN], bname[NAME_MAX_LEN], expect[128];
    int stacked = n > 0, nd = stacked ? 3 : 2, trows = split ? 2 * rows : rows;
    const lily_st_tensor *w = find(b, wname);
    if (stacked)
        snprintf(expect, sizeof expect, "[%d, %d, %d]", n, trows, cols);
    else if (rows < 0)
        snprintf(expect, sizeof expect, "[vocab, %d]", cols);
    else
        snprintf(expect, sizeof expect, "[%d, %d]", rows, cols);
    if (!w) return missing(b, wname, expect);
    snprintf(sname, sizeof sname, "%s.scales", module);
    snprintf(bname, sizeof bname, "%s.biases", module);
    const lily_st_tensor *sc = find(b, sname), *bi = find(b, bname);
    int64_t shp[3];
    int any_rows = rows < 0;
    if (any_rows) {
        if (w->ndim != 2 || w->shape[0] < 1 || w->shape[0] > (1 << 24))
            return lily_fail(b->err, "%s: tensor \"%s\": expected a 2-D [vocab, %d] matrix",
                             lily_st_path_of(b->st, w), w->name, cols);
        rows = trows = (int)w->shape[0];
    }
    if (stacked) shp[0] = n;
    shp[nd - 2] = any_rows ? -1 : trows; /* shp[nd - 1] is set per tensor below */
    uint64_t nmat = stacked ? (uint64_t)n : 1;
    lily_mat m = {0};
    m.rows = rows;
    m.cols = cols;
    uint64_t wstride, sstride = 0; /* bytes per stacked matrix */
    if (sc) {
        int bits, group;
        if (quant_params(b, module, w, sc, cols, &bits, &group)) return -1;
        if (!bi) return missing(b, bname, "the biases of a quantized module");
        int64_t words = (int64_t)cols * bits / 32, groups = cols / group;
        shp[nd - 1] = words;
        if (check_dtype(b, w, 1u << LILY_ST_U32, "U32 (packed quantized codes)") ||
            check_shape(b, w, shp, nd))
            return -1;
        shp[nd - 1] = groups;
        if (check_dtype(b, sc, 1u << LILY_ST_BF16, "BF16") || check_shape(b, sc, shp, nd) ||
            check_dtype(b, bi, 1u << LILY_ST_BF16, "BF16") || check_shape(b, bi, shp, nd))
            return -1;
        m.dt = bits == 4 ? LILY_DT_Q4 : LILY_DT_Q8;
        m.group = group;
        m.w = w->data;
        m.scales = (const uint16_t *)sc->data;
        m.biases = (const uint16_t *)bi->data;
        wstride = (uint64_t)trows * (uint64_t)words * 4;
        sstride = (uint64_t)trows * (uint64_t)groups * 2;
        tally(b, 0, w->nbytes + sc->nbytes + bi->nbytes);
    } else {
        int qbits = 0, qgroup = 0;
        if (lily_qconfig_lookup(b->q, module, &qbits, &qgroup) && qbits)
            return missing(b, sname, "by the quantization table");
        shp[nd - 1] = cols;
        if (check_dtype(b, w, FLOAT_MASK, "BF16, F16 or F32") || check_shape(b, w, shp, nd))
            return -1;
        m.dt = float_dt(w->dtype);
        m.w = w->data;
        wstride = (uint64_t)trows * (uint64_t)cols * lily_st_dtype_size(w->dtype);
        tally(b, 0, w->nbytes);
    }
    b->dtypes_seen |= 1u << m.dt;
    tally(b, nmat * (uint64_t)trows * (uint64_t)cols, 0);
    uint64_t half_w = wstride / (split ? 2 : 1), half_s = sstride / (split ? 2 : 1);
    for (uint64_t e = 0; e < nmat; e++) {
        lily_mat v = m;
        v.w = (const unsigned char *)m.w + e * wstride;
        if (m.scales) {
            v.scales = (const uint16_t *)((const unsigned char *)m.scales + e * sstride);
            v.biases = (const uint16_t *)((const unsigned char *)m.biases + e * sstride);
        }
        out[e] = v;
        if (split) {
            v.w = (const unsigned char *)v.w + half_w;
            if (m.scales) {
                v.scales = (const uint16_t *)((const unsigned char *)v.scales + half_s);
                v.biases = (const uint16_t *)((const unsigned char *)v.biases + half_s);
            }
            out2[e] = v;
        }
    }
    return 0;
}

int lily_bind_mat(lily_binder *b, const char *module, int rows, int cols, lily_mat *out) {
    char wname[NAME_MAX_LEN];
    snprintf(wname, sizeof wname, "%s.weight", module);
    return bind_any(b, module, wname, 0, rows, cols, out, 0, NULL);
}

int lily_bind_stack(lily_binder *b, const char *module, int fused_name, int n, int rows, int cols,
                    lily_mat *out, lily_mat *out2) {
    char wname[NAME_MAX_LEN];
    snprintf(wname, sizeof wname, fused_name ? "%s" : "%s.weight", module);
    return bind_any(b, module, wname, n, rows, cols, out, out2 != NULL, out2);
}

/* Converts n elements of t (F32/BF16/F16, validated) to fp32. */
static void to_f32(const lily_st_tensor *t, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; i++) {
        if (t->dtype == LILY_ST_F32) {
            memcpy(&out[i], t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            out[i] = t->dtype == LILY_ST_BF16 ? lily_st_bf16_f32(h) : lily_st_f16_f32(h);
        }
    }
}

int lily_bind_vec(lily_binder *b, const char *name, int n, int shift, float **out) {
    char expect[64];
    snprintf(expect, sizeof expect, "[%d]", n);
    const lily_st_tensor *t = find(b, name);
    if (!t) return missing(b, name, expect);
    int64_t shp[1] = {n};
    if (check_dtype(b, t, FLOAT_MASK, "F32, BF16 or F16") || check_shape(b, t, shp, 1)) return -1;
    float *v = lily_binder_own(b, lily_xmalloc((size_t)n * sizeof *v));
    to_f32(t, (uint64_t)n, v);
    if (shift)
        for (int i = 0; i < n; i++)
            v[i] += 1.0f;
    tally(b, (uint64_t)n, t->nbytes);
    *out = v;
    return 0;
}

int lily_bind_conv(lily_binder *b, const char *name, int C, int K, float **out) {
    char expect[96];
    snprintf(expect, sizeof expect, "[%d, 1, %d] or [%d, %d, 1]", C, K, C, K);
    const lily_st_tensor *t = find(b, name);
    if (!t) return missing(b, name, expect);
    if (check_dtype(b, t, FLOAT_MASK, "F32, BF16 or F16")) return -1;
    /* [C,1,K] (HF), [C,K,1] (MLX) and [C,K] all hold taps in the same [C][K] order. */
    int ok = t->shape[0] == C && ((t->ndim == 3 && ((t->shape[1] == 1 && t->shape[2] == K) ||
                                                    (t->shape[1] == K && t->shape[2] == 1))) ||
                                  (t->ndim == 2 && t->shape[1] == K));
    if (!ok) {
        char got[160];
        return lily_fail(b->err, "%s: tensor \"%s\": shape %s, expected %s",
                         lily_st_path_of(b->st, t), t->name, lily_st_shape_str(t, got, sizeof got),
                         expect);
    }
    float *v = lily_binder_own(b, lily_xmalloc((size_t)C * (size_t)K * sizeof *v));
    to_f32(t, (uint64_t)C * (uint64_t)K, v);
    tally(b, (uint64_t)C * (uint64_t)K, t->nbytes);
    *out = v;
    return 0;
}
