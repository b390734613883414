/* lily eval: perplexity of a text, and agreement with reference logits (mean / max KL divergence,
 * top-1 agreement, PPL ratio) -- the numerical-consistency report of a numeric path.
 *
 * The reference file (written by tools/train_tiny.py from transformers in float32) is
 *   "LILYREF1" | u32 n | u32 vocab | u32 0 | u32 0 | i32 ids[n] | i32 argmax[n] | f32 nll[n] |
 *   f16 logprob[n][vocab]
 * all little-endian: the token ids, the reference's argmax of each row, -log p(ids[i+1]) after row
 * i (0 for the last row), and the full log-softmax of every row rounded to fp16. The text must
 * tokenize to exactly ids[] with the model's tokenizer (checked: the tokenizer is part of what is
 * compared). The fp16 rows are exponentiated and renormalised before use, so the KL is between
 * two proper distributions; the fp16 rounding adds about 1e-7 to the mean KL. */
#include <math.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"
#include "base/timer.h"
#include "cli.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(
        f, "usage: lily eval --model DIR --text FILE [--ref FILE] [--backend cpu|cuda]\n"
           "                 [--threads N] [--mode prefill|decode] [--chunk N] [--json]\n"
           "                 [--max-ppl-delta PCT] [--max-mean-kl X] [--min-top1 PCT]\n"
           "                 [--precision default|exact|fast] [--cpu-isa auto|avx512|avx2|scalar]\n"
           "Perplexity of the text under the model; with --ref (reference logits of the same\n"
           "text, see tools/train_tiny.py) also mean and max KL(ref || lily), top-1 agreement\n"
           "and the PPL ratio. The --max/--min options are quality bars: the exit status is 1\n"
           "when one is not met. --mode decode feeds one token at a time (the decode path).\n");
}

typedef struct {
    uint32_t n, vocab;
    int32_t *ids, *argmax;
    float *nll;
    uint16_t *lp; /* fp16 [n][vocab] */
    char *buf;
} ref_file;

static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}

static int read_ref(const char *path, ref_file *r, lily_err *e) {
    memset(r, 0, sizeof *r);
    size_t len = 0;
    if (lily_read_file(path, (size_t)1 << 34, &r->buf, &len, e)) return -1;
    const unsigned char *p = (const unsigned char *)r->buf;
    if (len < 24 || memcmp(p, "LILYREF1", 8))
        return lily_fail(e, "%s: not a lily reference file (magic LILYREF1)", path);
    r->n = rd_u32(p + 8);
    r->vocab = rd_u32(p + 12);
    uint64_t need = 24 + (uint64_t)r->n * 12 + (uint64_t)r->n * r->vocab * 2;
    if (r->n < 2 || r->vocab < 2 || need != len)
        return lily_fail(e, "%s: %u rows x %u vocab need %llu bytes, the file has %zu", path, r->n,
                         r->vocab, (unsigned long long)need, len);
    /* the arrays are 4-byte aligned within the heap buffer (24-byte header) */
    r->ids = (int32_t *)(void *)(r->buf + 24);
    r->argmax = r->ids + r->n;
    r->nll = (float *)(void *)(r->argmax + r->n);
    r->lp = (uint16_t *)(void *)(r->nll + r->n);
    return 0;
}

typedef struct {
    double nll_sum;     /* lily, rows 0..n-2 */
    double ref_nll_sum; /* reference, rows 0..n-2 */
    double kl_sum, kl_max;
    int kl_argmax;
    int top1, rows;
} stats;

/* Log-softmax of one row of logits into lp (double), returns nothing. */
static void log_softmax(const float *x, int V, double *lp) {
    double mx = -INFINITY;
    for (int j = 0; j < V; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int j = 0; j < V; j++)
        s += exp((double)x[j] - mx);
    double lse = mx + log(s);
    for (int j = 0; j < V; j++)
        lp[j] = (double)x[j] - lse;
}

/* Folds row i (logits x) into the statistics. */
static void add_row(stats *st, const float *x, int V, int i, const int32_t *ids, int n,
                    const ref_file *ref, double *lp) {
    log_softmax(x, V, lp);
    if (i + 1 < n) st->nll_sum -= lp[ids[i + 1]];
    if (!ref) return;
    if (i + 1 < n) st->ref_nll_sum += ref->nll[i];
    const uint16_t *rl = ref->lp + (size_t)i * V;
    double z = 0;
    for (int j = 0; j < V; j++)
        z += exp((double)half_to_float(rl[j]));
    double lz = log(z), kl = 0;
    for (int j = 0; j < V; j++) {
        double lq = (double)half_to_float(rl[j]) - lz;
        if (lq > -80) kl += exp(lq) * (lq - lp[j]);
    }
    if (kl < 0) kl = 0; /* rounding of a KL that is 0 to within 1e-16 */
    st->kl_sum += kl;
    if (kl > st->kl_max || st->rows == 0) {
        st->kl_max = kl;
        st->kl_argmax = i;
    }
    int am = 0;
    for (int j = 1; j < V; j++)
        if (x[j] > x[am]) am = j;
    st->top1 += am == ref->argmax[i];
    st->rows++;
}

static const char *precision_name(lily_precision p) {
    return p == LILY_PRECISION_EXACT ? "exact" : p == LILY_PRECISION_FAST ? "fast" : "default";
}

int lily_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL, *ref_path = NULL, *mode = "prefill";
    double max_ppl_delta = -1, max_mean_kl = -1, min_top1 = -1;
    int json = 0, chunk = 0;
    lily_engine_opts opts = {0};
    lily_cli_engine ce = {0};
    lily_arg engt[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ce, engt);
    const lily_arg own[] = {
        {.name = "--json", .kind = LILY_ARG_FLAG, .dst = &json, .help = "JSON output"},
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"},
        {.name = "--text", .kind = LILY_ARG_STR, .dst = &text_path, .help = "text file"},
        {.name = "--ref", .kind = LILY_ARG_STR, .dst = &ref_path, .help = "reference logits"},
        {.name = "--mode", .kind = LILY_ARG_STR, .dst = &mode, .help = "prefill|decode"},
        {.name = "--chunk",
         .kind = LILY_ARG_INT,
         .dst = &chunk,
         .lo = 0,
         .hi = INT_MAX,
         .help = "window length"},
        {.name = "--max-ppl-delta",
         .kind = LILY_ARG_FLOAT,
         .dst = &max_ppl_delta,
         .lo = 0,
         .hi = 1e9,
         .help = "quality bar"},
        {.name = "--max-mean-kl",
         .kind = LILY_ARG_FLOAT,
         .dst = &max_mean_kl,
         .lo = 0,
         .hi = 1e9,
         .help = "quality bar"},
        {.name = "--min-top1",
         .kind = LILY_ARG_FLOAT,
         .dst = &min_top1,
         .lo = 0,
         .hi = 100,
         .help = "quality bar"},
        {0}};
    const lily_arg *tabs[] = {own, engt};
    const int pr = lily_args_parse("eval", tabs, 2, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    lily_cli_engine_apply(&ce, &opts);
    int decode = !strcmp(mode, "decode");
    if (!model || !text_path || (!decode && strcmp(mode, "prefill")) || chunk < 0) {
        if (model && text_path) fprintf(stderr, "lily eval: bad --mode or --chunk\n");
        usage(stderr);
        return 2;
    }
    if ((max_ppl_delta >= 0 || max_mean_kl >= 0 || min_top1 >= 0) && !ref_path) {
        fprintf(stderr, "lily eval: the quality bars need --ref\n");
        return 2;
    }
    lily_err e;
    char *text = NULL;
    size_t tlen = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    lily_tokenizer *tok = NULL;
    ref_file ref = {0};
    lily_engine *eng = NULL;
    lily_session *s = NULL;
    float *logits = NULL;
    double *lp = NULL;
    int rc = 1;
    if (lily_read_file(text_path, (size_t)1 << 32, &text, &tlen, &e) ||
        lily_tokenizer_open(model, &tok, &e) ||
        lily_tokenizer_encode(tok, text, tlen, &ids, &n_ids, &e))
        goto fail;
    int n = (int)n_ids;
    if (n < 2) {
        snprintf(e.msg, sizeof e.msg, "%s: %d tokens; at least 2 are needed", text_path, n);
        goto fail;
    }
    if (ref_path) {
        if (read_ref(ref_path, &ref, &e)) goto fail;
        if ((int)ref.n != n) {
            snprintf(e.msg, sizeof e.msg, "%s tokenizes to %d tokens, the reference %s has %u",
                     text_path, n, ref_path, ref.n);
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (ids[i] != ref.ids[i]) {
                snprintf(e.msg, sizeof e.msg,
                         "%s: token %d is %d here but %d in the reference "
                         "(tokenizers disagree)",
                         text_path, i, ids[i], ref.ids[i]);
                goto fail;
            }
    }
    if (!chunk) chunk = n;
    opts.prefill_chunk = chunk;
    double t0 = lily_now();
    if (lily_engine_open(model, &opts, &eng, &e)) goto fail;
    const lily_model_info *mi = lily_engine_info(eng);
    int V = mi->vocab_size;
    if (ref_path && (int)ref.vocab != V) {
        snprintf(e.msg, sizeof e.msg, "the reference has %u logits per row, the model %d",
                 ref.vocab, V);
        goto fail;
    }
    if (lily_session_create(eng, n, &s, &e)) goto fail;
    double t_load = lily_now() - t0;
    int step = decode ? 1 : chunk;
    logits = malloc((size_t)step * V * sizeof(float));
    lp = malloc((size_t)V * sizeof(double));
    if (!logits || !lp) {
        snprintf(e.msg, sizeof e.msg, "out of memory for %d x %d logits", step, V);
        goto fail;
    }
    stats st = {0};
    double t_run = lily_now();
    for (int i = 0; i < n; i += step) {
        int m = n - i < step ? n - i : step;
        if (decode) {
            if (lily_session_decode(s, ids[i], &e)) goto fail;
            memcpy(logits, lily_session_logits(s), (size_t)V * sizeof(float));
        } else if (lily_session_prefill(s, ids + i, m, logits, NULL, NULL, &e)) {
            goto fail;
        }
        for (int r = 0; r < m; r++)
            add_row(&st, logits + (size_t)r * V, V, i + r, ids, n, ref_path ? &ref : NULL, lp);
    }
    t_run = lily_now() - t_run;
    double ppl = exp(st.nll_sum / (n - 1));
    double ref_ppl = ref_path ? exp(st.ref_nll_sum / (n - 1)) : 0;
    double delta = ref_path ? (ppl / ref_ppl - 1) * 100 : 0;
    double mean_kl = st.rows ? st.kl_sum / st.rows : 0;
    double top1 = st.rows ? 100.0 * st.top1 / st.rows : 0;
    char fails[512] = "";
    size_t fl = 0;
    if (max_ppl_delta >= 0 && !(fabs(delta) <= max_ppl_delta))
        fl += (size_t)snprintf(fails + fl, sizeof fails - fl, " PPL delta %+.3f %% (bar %.3g %%);",
                               delta, max_ppl_delta);
    if (max_mean_kl >= 0 && !(mean_kl <= max_mean_kl) && fl < sizeof fails)
        fl += (size_t)snprintf(fails + fl, sizeof fails - fl, " mean KL %.3g (bar %.3g);", mean_kl,
                               max_mean_kl);
    if (min_top1 >= 0 && !(top1 >= min_top1) && fl < sizeof fails)
        fl += (size_t)snprintf(fails + fl, sizeof fails - fl, " top-1 %.2f %% (bar %.3g %%);", top1,
                               min_top1);
    int bars = max_ppl_delta >= 0 || max_mean_kl >= 0 || min_top1 >= 0;
    if (json) {
        printf("{\"model\": \"%s\", \"quant\": \"%s\", \"backend\": \"%s\", \"mode\": \"%s\", "
               "\"precision\": \"%s\"",
               model, mi->quant, mi->backend, decode ? "decode" : "prefill",
               precision_name(opts.precision));
        printf(", \"tokens\": %d, \"ppl\": %.6f", n, ppl);
        if (ref_path)
            printf(", \"ref_ppl\": %.6f, \"ppl_delta_pct\": %.6f, \"mean_kl\": %.6g, "
                   "\"max_kl\": %.6g, \"max_kl_row\": %d, \"top1_pct\": %.4f",
                   ref_ppl, delta, mean_kl, st.kl_max, st.kl_argmax, top1);
        printf(", \"seconds\": %.3f, \"tok_per_s\": %.1f", t_run, n / t_run);
        if (bars) printf(", \"pass\": %s", fl ? "false" : "true");
        printf("}\n");
    } else {
        printf("model      %s (%s, %s layout, %s backend)\n", model, mi->quant, mi->layout,
               mi->backend);
        printf("path       %s, precision %s", decode ? "decode (one token per step)" : "prefill",
               precision_name(opts.precision));
        printf("\ntext       %s: %d tokens\n", text_path, n);
        printf("time       load %.2f s, %s %.2f s (%.0f tok/s)\n", t_load,
               decode ? "decode" : "prefill", t_run, n / t_run);
        printf("\n%-10s %12s", "", "lily");
        if (ref_path) printf(" %12s %12s", "reference", "delta");
        printf("\n%-10s %12.4f", "PPL", ppl);
        if (ref_path) {
            printf(" %12.4f %+11.3f%%\n", ref_ppl, delta);
            printf("%-10s %12.3g\n", "mean KL", mean_kl);
            printf("%-10s %12.3g  (row %d)\n", "max KL", st.kl_max, st.kl_argmax);
            printf("%-10s %11.2f%%  (%d of %d rows)\n", "top-1", top1, st.top1, st.rows);
        } else {
            printf("\n");
        }
        if (bars) printf("\nbars       %s\n", fl ? "NOT MET" : "met");
    }
    if (fl) {
        fprintf(stderr, "lily eval: quality bar not met:%s\n", fails);
        rc = 1;
    } else {
        rc = 0;
    }
    goto done;
fail:
    fprintf(stderr, "lily eval: %s\n", e.msg);
done:
    free(lp);
    free(logits);
    lily_session_free(s);
    lily_engine_close(eng);
    free(ref.buf);
    free(ids);
    lily_tokenizer_free(tok);
    free(text);
    return rc;
}
