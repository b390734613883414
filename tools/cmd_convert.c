/* lily convert: an MLX affine-quantized checkpoint (model.md 7.2) to the HF bf16 layout (7.1).
 *
 *   lily convert --model DIR --out DIR
 *
 * Every quantized module is dequantized (W = scale * q + bias, in fp32) and stored as bf16; the
 * names go back to HF (language_model.model.X -> model.language_model.X, language_model.lm_head ->
 * lm_head, mtp.* kept), the switch_mlp stacks become the fused mlp.experts.gate_up_proj [E, 2I, H]
 * and mlp.experts.down_proj [E, H, I], conv1d goes from [C, K, 1] back to [C, 1, K], the
 * zero-centred norms are un-shifted (w - 1), A_log stays f32. config.json loses its quantization
 * tables; tokenizer and generation files are copied. The result is what transformers would load,
 * with the quantized values exactly (up to the bf16 rounding of each dequantized weight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "base/err.h"
#include "base/file.h"
#include "cli.h"
#include "model/safetensors.h"
#include "model/st_write.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lily convert --model DIR --out DIR\n"
            "Writes the HF bf16 layout of an MLX affine-quantized checkpoint into --out\n"
            "(config.json without the quantization tables, model.safetensors, tokenizer files).\n");
}

static uint16_t f32_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Zero-centred ("1 + w") norms, stored shifted in MLX files (model.md 2.1). */
static int is_shifted_norm(const char *hf) {
    static const char *const suf[] = {
        "input_layernorm.weight",  "post_attention_layernorm.weight", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "pre_fc_norm_embedding.weight",    "pre_fc_norm_hidden.weight"};
    for (size_t i = 0; i < sizeof suf / sizeof suf[0]; i++)
        if (ends_with(hf, suf[i])) return 1;
    return !strcmp(hf, "model.language_model.norm.weight") || !strcmp(hf, "mtp.norm.weight");
}

typedef struct {
    lily_st_entry *e;
    void **data;
    int n, cap;
} out_set;

static void add(out_set *o, const char *name, lily_st_dtype dt, int ndim, const int64_t *shape,
                void *data) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 256;
        o->e = lily_xrealloc(o->e, (size_t)o->cap * sizeof *o->e);
        o->data = lily_xrealloc(o->data, (size_t)o->cap * sizeof *o->data);
    }
    lily_st_entry *e = &o->e[o->n];
    memset(e, 0, sizeof *e);
    e->name = lily_xstrdup(name);
    e->dtype = dt;
    e->ndim = ndim;
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    o->data[o->n++] = data;
}

/* HF name of an MLX name (module path or tensor name); buf of len bytes. */
static void hf_name(const char *mlx, char *buf, size_t len) {
    if (!strncmp(mlx, "language_model.model.", 21))
        snprintf(buf, len, "model.language_model.%s", mlx + 21);
    else if (!strncmp(mlx, "language_model.lm_head", 22))
        snprintf(buf, len, "lm_head%s", mlx + 22);
    else
        snprintf(buf, len, "%s", mlx);
}

/* Dequantizes module mod (weight/scales/biases) to fp32 [rows][cols] (rows = all leading dims). */
static float *dequant(const lily_st_set *st, const char *mod, int64_t *rows_out, int64_t *cols_out,
                      lily_err *e) {
    char n[600];
    snprintf(n, sizeof n, "%s.weight", mod);
    const lily_st_tensor *w = lily_st_find(st, n);
    snprintf(n, sizeof n, "%s.scales", mod);
    const lily_st_tensor *s = lily_st_find(st, n);
    snprintf(n, sizeof n, "%s.biases", mod);
    const lily_st_tensor *b = lily_st_find(st, n);
    if (!w || !s || !b || w->dtype != LILY_ST_U32 || s->dtype != LILY_ST_BF16 ||
        b->dtype != LILY_ST_BF16 || s->ndim != w->ndim || b->ndim != w->ndim) {
        lily_fail(e, "%s: expected U32 weight with BF16 scales and biases of the same rank", mod);
        return NULL;
    }
    int64_t words = w->shape[w->ndim - 1], groups = s->shape[s->ndim - 1];
    int64_t rows = (int64_t)(lily_st_numel(w) / (uint64_t)words);
    if ((int64_t)(lily_st_numel(s) / (uint64_t)groups) != rows ||
        lily_st_numel(b) != lily_st_numel(s) || groups < 1 || (words * 32) % (groups * 64)) {
        lily_fail(e, "%s: weight and scales shapes disagree", mod);
        return NULL;
    }
    int bits = (int)(words * 32 / (groups * 64));
    if (bits != 4 && bits != 8) {
        lily_fail(e, "%s: %d-bit (group 64) packing is not supported here (4 or 8)", mod, bits);
        return NULL;
    }
    int64_t cols = groups * 64;
    float *out = malloc((size_t)(rows * cols) * sizeof(float));
    if (!out) {
        lily_fail(e, "%s: out of memory", mod);
        return NULL;
    }
    const unsigned char *wd = w->data;
    const unsigned char *sd = s->data, *bd = b->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t bit = c * bits, byte = r * words * 4 + bit / 8;
            unsigned q = bits == 8 ? wd[byte] : (wd[byte] >> (bit % 8)) & 15u;
            int64_t g = r * groups + c / 64;
            uint16_t sc = (uint16_t)(sd[2 * g] | sd[2 * g + 1] << 8);
            uint16_t bi = (uint16_t)(bd[2 * g] | bd[2 * g + 1] << 8);
            out[r * cols + c] = lily_st_bf16_f32(sc) * (float)q + lily_st_bf16_f32(bi);
        }
    *rows_out = rows;
    *cols_out = cols;
    return out;
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *o = lily_xmalloc(n * sizeof *o);
    for (size_t i = 0; i < n; i++)
        o[i] = f32_bf16(x[i]);
    return o;
}

static int convert_tensors(const lily_st_set *st, out_set *o, lily_err *e) {
    char hf[640], mod[600];
    for (int i = 0; i < lily_st_count(st); i++) {
        const lily_st_tensor *t = lily_st_at(st, i);
        if (ends_with(t->name, ".scales") || ends_with(t->name, ".biases")) continue;
        size_t l = strlen(t->name);
        int quant = 0;
        if (ends_with(t->name, ".weight") && l - 7 < sizeof mod) {
            snprintf(mod, sizeof mod, "%.*s.scales", (int)(l - 7), t->name);
            quant = lily_st_find(st, mod) != NULL;
            mod[l - 7] = 0;
        }
        if (quant) {
            int64_t rows, cols;
            float *w = dequant(st, mod, &rows, &cols, e);
            if (!w) return -1;
            const char *sw = strstr(mod, ".switch_mlp.");
            if (sw && t->ndim == 3) {
                int64_t E = t->shape[0], R = rows / E;
                char pre[512];
                snprintf(pre, sizeof pre, "%.*s", (int)(sw - mod) < 500 ? (int)(sw - mod) : 500,
                         mod);
                if (ends_with(mod, "down_proj")) {
                    snprintf(mod, sizeof mod, "%s.experts.down_proj", pre);
                    hf_name(mod, hf, sizeof hf);
                    int64_t sh[3] = {E, R, cols};
                    add(o, hf, LILY_ST_BF16, 3, sh, to_bf16(w, (size_t)(rows * cols)));
                } else if (ends_with(mod, "gate_proj")) {
                    /* fused [E, 2I, H]: gate rows then up rows, per expert */
                    char up[640];
                    snprintf(up, sizeof up, "%s.switch_mlp.up_proj", pre);
                    int64_t r2, c2;
                    float *u = dequant(st, up, &r2, &c2, e);
                    if (!u) {
                        free(w);
                        return -1;
                    }
                    if (r2 != rows || c2 != cols) {
                        free(w);
                        free(u);
                        return lily_fail(e, "%s: gate and up stacks differ in shape", pre);
                    }
                    uint16_t *f = lily_xmalloc((size_t)(2 * rows * cols) * sizeof *f);
                    for (int64_t x = 0; x < E; x++) {
                        size_t blk = (size_t)(R * cols);
                        for (size_t k = 0; k < blk; k++) {
                            f[(size_t)x * 2 * blk + k] = f32_bf16(w[(size_t)x * blk + k]);
                            f[(size_t)x * 2 * blk + blk + k] = f32_bf16(u[(size_t)x * blk + k]);
                        }
                    }
                    free(u);
                    snprintf(mod, sizeof mod, "%s.experts.gate_up_proj", pre);
                    hf_name(mod, hf, sizeof hf);
                    int64_t sh[3] = {E, 2 * R, cols};
                    add(o, hf, LILY_ST_BF16, 3, sh, f);
                } /* up_proj: written with gate_proj */
            } else {
                snprintf(hf, sizeof hf, "%s", t->name);
                char tmp[640];
                hf_name(t->name, tmp, sizeof tmp);
                int64_t sh[LILY_ST_MAX_DIMS];
                memcpy(sh, t->shape, sizeof sh);
                sh[t->ndim - 1] = cols;
                add(o, tmp, LILY_ST_BF16, t->ndim, sh, to_bf16(w, (size_t)(rows * cols)));
            }
            free(w);
            continue;
        }
        hf_name(t->name, hf, sizeof hf);
        size_t n = (size_t)lily_st_numel(t);
        if (t->dtype == LILY_ST_F32 && ends_with(hf, "A_log")) {
            void *d = lily_xmalloc(t->nbytes);
            memcpy(d, t->data, t->nbytes);
            add(o, hf, LILY_ST_F32, t->ndim, t->shape, d);
            continue;
        }
        float *x = lily_xmalloc(n * sizeof *x);
        for (size_t k = 0; k < n; k++) {
            const unsigned char *p = t->data;
            if (t->dtype == LILY_ST_BF16)
                x[k] = lily_st_bf16_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
            else if (t->dtype == LILY_ST_F32)
                memcpy(&x[k], p + 4 * k, 4);
            else {
                free(x);
                return lily_fail(e, "tensor %s: dtype %s not handled", t->name,
                                 lily_st_dtype_name(t->dtype));
            }
        }
        int64_t sh[LILY_ST_MAX_DIMS];
        memcpy(sh, t->shape, sizeof sh);
        if (ends_with(hf, "conv1d.weight") && t->ndim == 3 && t->shape[2] == 1) {
            /* [C, K, 1] -> [C, 1, K]: the same order of values */
            sh[1] = 1;
            sh[2] = t->shape[1];
        }
        if (t->ndim == 1 && is_shifted_norm(hf))
            for (size_t k = 0; k < n; k++)
                x[k] -= 1.0f;
        add(o, hf, LILY_ST_BF16, t->ndim, sh, to_bf16(x, n));
        free(x);
    }
    return 0;
}

static int copy_file(const char *from, const char *to, const char *name, lily_err *e) {
    char a[4096], b[4096];
    if (lily_path_join(a, sizeof a, from, name) || lily_path_join(b, sizeof b, to, name))
        return lily_fail(e, "path too long");
    if (!lily_file_exists(a)) return 0;
    char *buf = NULL;
    size_t len = 0;
    if (lily_read_file(a, 64u << 20, &buf, &len, e)) return -1;
    FILE *f = fopen(b, "wb");
    int rc = f && fwrite(buf, 1, len, f) == len ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(buf);
    return rc ? lily_fail(e, "%s: cannot write", b) : 0;
}

static int write_config(const char *from, const char *to, lily_err *e) {
    char a[4096], b[4096];
    if (lily_path_join(a, sizeof a, from, "config.json") ||
        lily_path_join(b, sizeof b, to, "config.json"))
        return lily_fail(e, "path too long");
    char *text = NULL;
    size_t len = 0;
    if (lily_read_file(a, 16u << 20, &text, &len, e)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lily_fail(e, "%s: not a JSON object", a);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = fopen(b, "wb");
    int rc = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(s);
    return rc ? lily_fail(e, "%s: cannot write", b) : 0;
}

int lily_cmd_convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "MLX checkpoint"},
        {.name = "--out", .kind = LILY_ARG_STR, .dst = &out, .help = "output directory"},
        {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("convert", tabs, 1, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    if (!model || !out) {
        usage(stderr);
        return 2;
    }
    lily_err e;
    lily_st_set *st = NULL;
    out_set o = {0};
    int rc = 1;
    if (mkdir(out, 0755) && !lily_file_exists(out)) {
        snprintf(e.msg, sizeof e.msg, "%s: cannot create the directory", out);
        goto fail;
    }
    if (lily_st_set_open(model, &st, &e) || convert_tensors(st, &o, &e)) goto fail;
    char path[4096];
    if (lily_path_join(path, sizeof path, out, "model.safetensors")) {
        snprintf(e.msg, sizeof e.msg, "%s: path too long", out);
        goto fail;
    }
    if (lily_st_write_file(path, o.e, (const void *const *)o.data, o.n, &e) ||
        write_config(model, out, &e))
        goto fail;
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (copy_file(model, out, files[i], &e)) goto fail;
    printf("%s: %d tensors (HF bf16 layout)\n", out, o.n);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lily convert: %s\n", e.msg);
done:
    for (int i = 0; i < o.n; i++) {
        free((void *)o.e[i].name);
        free(o.data[i]);
    }
    free(o.e);
    free(o.data);
    lily_st_set_free(st);
    return rc;
}
