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
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        size_t k;
        for (k = 0; k < sizeof int_opts / sizeof int_opts[0]; k++)
            if (!strcmp(a, int_opts[k].name)) break;
        if (k < sizeof int_opts / sizeof int_opts[0]) {
            if (!(v = lily_cli_value(argc, argv, &i)) ||
                parse_int(a, v, int_opts[k].lo, (int *)((char *)&o + int_opts[k].off)))
                return 2;
            continue;
        }
        if (!strcmp(a, "--out") || !strcmp(a, "--preset") || !strcmp(a, "--layout") ||
            !strcmp(a, "--experts") || !strcmp(a, "--seed") || !strcmp(a, "--tokenizer") ||
            !strcmp(a, "--shard-size") || !strcmp(a, "--dense") || !strcmp(a, "--rope-theta")) {
            if (!(v = lily_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tied")) {
            o.cfg.tie_embeddings = 1;
            continue;
        } else if (!strcmp(a, "--quiet")) {
            o.verbose = 0;
            continue;
        } else {
            fprintf(stderr, "lily mkmodel: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!strcmp(a, "--out")) {
            out = v;
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "hf"))
                o.layout = LILY_MK_HF;
            else if (!strcmp(v, "mlx4") || !strcmp(v, "mlx8")) {
                o.layout = LILY_MK_MLX;
                o.bits = v[3] - '0';
            } else {
                fprintf(stderr, "lily mkmodel: --layout must be hf, mlx4 or mlx8\n");
                return 2;
            }
        } else if (!strcmp(a, "--experts")) {
            if (!strcmp(v, "fused"))
                o.fused_experts = 1;
            else if (!strcmp(v, "per") || !strcmp(v, "per-expert"))
                o.fused_experts = 0;
            else if (parse_int(a, v, 1, &o.cfg.n_experts))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o.seed = strtoull(v, &end, 0);
            if (errno || end == v || *end) {
                fprintf(stderr, "lily mkmodel: --seed needs an integer\n");
                return 2;
            }
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer_dir = v;
        } else if (!strcmp(a, "--shard-size")) {
            if (parse_bytes(v, &o.shard_bytes)) {
                fprintf(stderr, "lily mkmodel: bad --shard-size '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--dense")) {
            if (parse_int(a, v, 1, &o.cfg.intermediate)) return 2;
            snprintf(o.cfg.model_type, sizeof o.cfg.model_type, "qwen3_5");
        } else if (!strcmp(a, "--rope-theta")) {
            char *end;
            o.cfg.rope_theta = strtod(v, &end);
            if (end == v || *end || !(o.cfg.rope_theta > 0)) {
                fprintf(stderr, "lily mkmodel: bad --rope-theta '%s'\n", v);
                return 2;
            }
        }
    }
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
