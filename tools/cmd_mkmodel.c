/* lily mkmodel: write a random-weight checkpoint (HF bf16 or MLX affine layout) of a preset shape,
 * with optional shape overrides. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/mkmodel.h"

static void usage(FILE *f) {
    fprintf(
        f, "usage: lily mkmodel --out DIR [options]\n"
           "  --preset NAME       tiny (default), small, 35b-a3b\n"
           "  --layout L          hf (bf16, default), mlx4, mlx8 (MLX affine, group 64)\n"
           "  --experts per|fused HF expert tensors: per-expert keys (default) or fused stacks\n"
           "  --seed N            weights are a pure function of the seed (default 1)\n"
           "  --tokenizer DIR     copy tokenizer.json, tokenizer_config.json, chat_template.jinja\n"
           "                      and size the vocabulary / eos ids to them\n"
           "  --threads N         generator threads (default: all cores)\n"
           "  --shard-size N      max bytes per shard, with K/M/G suffix (default 5G)\n"
           "  --quiet             no progress or summary\n"
           "shape overrides:\n"
           "  --hidden N --layers N --vocab N --heads N --kv-heads N --head-dim N --rope-dim N\n"
           "  --attn-interval N --lin-k-heads N --lin-v-heads N --lin-k-dim N --lin-v-dim N\n"
           "  --conv-k N --experts N --top-k N --moe-inter N --shared-inter N --max-pos N\n"
           "  --rope-theta X --dense N (a dense qwen3_5 model with MLP width N) --tied\n");
}

static int parse_int(const char *opt, const char *v, int lo, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > (1 << 30)) {
        fprintf(stderr, "lily mkmodel: %s needs an integer >= %d, got '%s'\n", opt, lo, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_bytes(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v) return -1;
    switch (*end) {
    case 'k':
    case 'K': x <<= 10, end++; break;
    case 'm':
    case 'M': x <<= 20, end++; break;
    case 'g':
    case 'G': x <<= 30, end++; break;
    default: break;
    }
    if (*end || x == 0) return -1;
    *out = x;
    return 0;
}

typedef struct {
    const char *name;
    size_t off; /* offset of the int field in lily_mk_opts */
    int lo;
} int_opt;

#define CFG(f) offsetof(lily_mk_opts, cfg) + offsetof(lily_config, f)
static const int_opt int_opts[] = {
    {"--hidden", CFG(hidden), 1},
    {"--layers", CFG(n_layers), 1},
    {"--vocab", CFG(vocab), 2},
    {"--heads", CFG(n_q_heads), 1},
    {"--kv-heads", CFG(n_kv_heads), 1},
    {"--head-dim", CFG(head_dim), 1},
    {"--rope-dim", CFG(rope_dim), 2},
    {"--lin-k-heads", CFG(lin_nk), 1},
    {"--lin-v-heads", CFG(lin_nv), 1},
    {"--lin-k-dim", CFG(lin_dk), 1},
    {"--lin-v-dim", CFG(lin_dv), 1},
    {"--conv-k", CFG(conv_k), 1},
    {"--top-k", CFG(top_k), 1},
    {"--moe-inter", CFG(moe_inter), 1},
    {"--shared-inter", CFG(shared_inter), 0},
    {"--max-pos", CFG(max_position), 1},
    {"--attn-interval", offsetof(lily_mk_opts, attn_interval), 1},
    {"--threads", offsetof(lily_mk_opts, n_threads), 1},
};

static int mk_layout(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    if (!strcmp(v, "hf"))
        o->layout = LILY_MK_HF;
    else if (!strcmp(v, "mlx4") || !strcmp(v, "mlx8")) {
        o->layout = LILY_MK_MLX;
        o->bits = v[3] - '0';
    } else {
        fprintf(stderr, "lily mkmodel: --layout takes hf|mlx4|mlx8, not '%s'\n", v);
        return -1;
    }
    return 0;
}

static int mk_experts(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    if (!strcmp(v, "fused"))
        o->fused_experts = 1;
    else if (!strcmp(v, "per") || !strcmp(v, "per-expert"))
        o->fused_experts = 0;
    else if (parse_int("--experts", v, 1, &o->cfg.n_experts))
        return -1;
    return 0;
}

static int mk_seed(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    char *end;
    errno = 0;
    o->seed = strtoull(v, &end, 0);
    if (errno || end == v || *end) {
        fprintf(stderr, "lily mkmodel: --seed needs an integer, not '%s'\n", v);
        return -1;
    }
    return 0;
}

static int mk_shard(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    if (parse_bytes(v, &o->shard_bytes)) {
        fprintf(stderr, "lily mkmodel: bad --shard-size '%s' (a size such as 64M)\n", v);
        return -1;
    }
    return 0;
}

static int mk_dense(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    if (parse_int("--dense", v, 1, &o->cfg.intermediate)) return -1;
    snprintf(o->cfg.model_type, sizeof o->cfg.model_type, "qwen3_5");
    return 0;
}

static int mk_theta(void *ud, const char *v) {
    lily_mk_opts *o = ud;
    char *end;
    o->cfg.rope_theta = strtod(v, &end);
    if (end == v || *end || !(o->cfg.rope_theta > 0)) {
        fprintf(stderr, "lily mkmodel: bad --rope-theta '%s' (a number > 0)\n", v);
        return -1;
    }
    return 0;
}

int lily_cmd_mkmodel(int argc, char **argv) {
    const char *out = NULL, *preset = "tiny";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[i + 1];
    }
    lily_mk_opts o;
    lily_err err = {{0}};
    if (lily_mk_preset(preset, &o, &err)) {
        fprintf(stderr, "lily mkmodel: %s\n", err.msg);
        return 2;
    }
    o.verbose = 1;
    int tied = 0, quiet = 0;
    const char *preset_again = NULL;
    lily_arg tab[sizeof int_opts / sizeof int_opts[0] + 12];
    size_t n = 0;
    for (size_t k = 0; k < sizeof int_opts / sizeof int_opts[0]; k++)
        tab[n++] = (lily_arg){.name = int_opts[k].name,
                              .kind = LILY_ARG_INT,
                              .dst = (char *)&o + int_opts[k].off,
                              .lo = int_opts[k].lo,
                              .hi = 1 << 30};
    tab[n++] = (lily_arg){.name = "--out", .kind = LILY_ARG_STR, .dst = &out};
    tab[n++] = (lily_arg){.name = "--preset", .kind = LILY_ARG_STR, .dst = &preset_again};
    tab[n++] = (lily_arg){.name = "--layout", .kind = LILY_ARG_FN, .fn = mk_layout, .ud = &o};
    tab[n++] = (lily_arg){.name = "--experts", .kind = LILY_ARG_FN, .fn = mk_experts, .ud = &o};
    tab[n++] = (lily_arg){.name = "--seed", .kind = LILY_ARG_FN, .fn = mk_seed, .ud = &o};
    tab[n++] = (lily_arg){.name = "--tokenizer", .kind = LILY_ARG_STR, .dst = &o.tokenizer_dir};
    tab[n++] = (lily_arg){.name = "--shard-size", .kind = LILY_ARG_FN, .fn = mk_shard, .ud = &o};
    tab[n++] = (lily_arg){.name = "--dense", .kind = LILY_ARG_FN, .fn = mk_dense, .ud = &o};
    tab[n++] = (lily_arg){.name = "--rope-theta", .kind = LILY_ARG_FN, .fn = mk_theta, .ud = &o};
    tab[n++] = (lily_arg){.name = "--tied", .kind = LILY_ARG_FLAG, .dst = &tied};
    tab[n++] = (lily_arg){.name = "--quiet", .kind = LILY_ARG_FLAG, .dst = &quiet};
    tab[n] = (lily_arg){0};
    const lily_arg *tabs[] = {tab};
    const int pr = lily_args_parse("mkmodel", tabs, 1, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    if (tied) o.cfg.tie_embeddings = 1;
    if (quiet) o.verbose = 0;
    if (!out) {
        fprintf(stderr, "lily mkmodel: --out DIR is required\n");
        usage(stderr);
        return 2;
    }
    lily_mk_result r;
    if (lily_mk_write(out, &o, &r, &err)) {
        fprintf(stderr, "lily mkmodel: %s\n", err.msg);
        return 1;
    }
    if (o.verbose)
        printf("wrote %s: %s layout, %d tensors in %d file%s, %.3f GB, %.1f s (%.2f GB/s)\n", out,
               o.layout == LILY_MK_MLX ? (o.bits == 4 ? "mlx4" : "mlx8") : "hf", r.n_tensors,
               r.n_files, r.n_files == 1 ? "" : "s", (double)r.bytes / 1e9, r.seconds,
               r.seconds > 0 ? (double)r.bytes / 1e9 / r.seconds : 0.0);
    return 0;
}
