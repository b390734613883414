/* lily info: what a model directory holds (shapes, layer schedule, sizes by component, bytes per
 * token, session state sizes), from the loader directly so it works without any backend. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"
#include "model/stats.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lily info --model DIR\n");
}

/* "1.67 GB (1.55 GiB)" style sizes. */
static const char *size_str(uint64_t b, char *buf, size_t len) {
    if (b >= 1000000000ull)
        snprintf(buf, len, "%.2f GB (%.2f GiB)", b / 1e9, b / 1073741824.0);
    else if (b >= 1000000ull)
        snprintf(buf, len, "%.2f MB (%.2f MiB)", b / 1e6, b / 1048576.0);
    else
        snprintf(buf, len, "%.2f KB (%.2f KiB)", b / 1e3, b / 1024.0);
    return buf;
}

static void print_model(const char *dir, const lily_model *m) {
    const lily_config *c = &m->cfg;
    lily_model_stats s;
    lily_model_stats_get(m, &s);
    char b1[64], b2[64];
    printf("model        %s\n", dir);
    printf("type         %s, layout %s, weights %s\n", c->model_type, m->layout, m->quant);
    printf("shape        hidden %d, %d layers (%d GDN + %d attention), vocab %d\n", c->hidden,
           c->n_layers, s.n_gdn, s.n_attn, c->vocab);
    printf("attention    %d query heads, %d KV heads, head dim %d, rope dims %d, theta %g%s\n",
           c->n_q_heads, c->n_kv_heads, c->head_dim, c->rope_dim, c->rope_theta,
           c->attn_output_gate ? ", output gate" : "");
    if (s.n_gdn)
        printf("gdn          %d key heads x %d, %d value heads x %d, conv %d\n", c->lin_nk,
               c->lin_dk, c->lin_nv, c->lin_dv, c->conv_k);
    if (c->is_moe)
        printf("moe          %d experts, top %d%s, expert width %d, shared expert width %d\n",
               c->n_experts, c->top_k, c->norm_topk_prob ? " (renormalised)" : "", c->moe_inter,
               c->shared_inter);
    else
        printf("mlp          dense, width %d\n", c->intermediate);
    printf("layers      ");
    for (int l = 0; l < c->n_layers; l++)
        printf(" %s", c->layer_is_attn[l] ? "ATTN" : "GDN");
    printf("\n");
    printf("norms        %s, eps %g, tied embeddings %s, max position %d\n",
           strcmp(m->layout, "hf") ? "stored shifted (1+w)" : "zero-centred (1+w applied)",
           (double)c->rms_eps, c->tie_embeddings ? "yes" : "no", c->max_position);
    printf("eos ids     ");
    for (int i = 0; i < 4 && c->eos_ids[i] >= 0; i++)
        printf(" %d", c->eos_ids[i]);
    printf("\n\n%-18s %16s %18s %7s\n", "component", "parameters", "bytes", "share");
    for (int i = 0; i < LILY_COMP_N; i++) {
        if (!s.params[i] && !s.bytes[i]) continue;
        printf("%-18s %16llu %18llu %6.2f%%\n", lily_comp_name((lily_comp)i),
               (unsigned long long)s.params[i], (unsigned long long)s.bytes[i],
               m->weight_bytes ? 100.0 * (double)s.bytes[i] / (double)m->weight_bytes : 0.0);
    }
    printf("%-18s %16llu %18llu\n\n", "total", (unsigned long long)m->n_params,
           (unsigned long long)m->weight_bytes);
    printf("parameters   %.3f B\n", m->n_params / 1e9);
    printf("weights      %s\n", size_str(m->weight_bytes, b1, sizeof b1));
    printf("per token    %s of weights read per decoded token (%llu B)\n",
           size_str(s.bytes_per_token, b2, sizeof b2), (unsigned long long)s.bytes_per_token);
    printf("kv cache     %llu B per token of context (bf16 K+V, %d layers)\n",
           (unsigned long long)s.kv_bytes_per_token, s.n_attn);
    printf("gdn state    %s per session (fp32 recurrent + bf16 conv, %d layers; %llu B)\n",
           size_str(s.recurrent_state_bytes, b1, sizeof b1), s.n_gdn,
           (unsigned long long)s.recurrent_state_bytes);
}

int lily_cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &dir, .help = "model directory"}, {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("info", tabs, 1, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    if (!dir) {
        usage(stderr);
        return 2;
    }
    lily_model *m = NULL;
    lily_err err = {{0}};
    char mbuf[4096];
    if (!(dir = lily_cli_model(dir, mbuf, sizeof mbuf))) return 1;
    if (lily_model_load(dir, &m, &err)) {
        fprintf(stderr, "lily info: %s\n", err.msg);
        return 1;
    }
    print_model(dir, m);
    lily_model_free(m);
    return 0;
}
