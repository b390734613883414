/* lily bench: prefill and decode speed at a sweep of context lengths, as a table and JSON/CSV.
 *
 * Each round and length: a fresh session prefills L random tokens (timed: prefill tok/s and
 * TFLOP/s), then decodes --gen tokens greedily from that context (timed: decode tok/s and the
 * achieved GB/s of the bytes a decode step must read: active weights, the GDN state read and
 * written, and the KV cache at that context). A row's rounds run back to back and the row is
 * printed when they are done, with the mean and the standard deviation over the rounds; lengths
 * not asked for are absent ("-" in the table, null in the JSON, empty in the CSV). An untimed
 * warm-up pass (every length up to 8K once) comes first, so one-time costs (lazy kernel loading,
 * the decode graph's capture) stay out of the figures. The header names the machine (CPU or GPU
 * model, threads) and the commit, as does the JSON. On a GPU a last column gives the device's
 * memory in use after each length's rounds (GiB, the driver's count): the weights and the
 * session's state are allocated before the first row, so what it gains from row to row is memory
 * the longer prompts took (scratch, or what the driver allocates for kernels first run there).
 *
 * --turn N@D times what an agent loop pays per turn: N new tokens prefilled onto a session that
 * already holds D (the D-token context is prefilled once, untimed, and snapshotted; each round
 * restores it and times the N-token prefill). */
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/cpu/ops.h"
#include "base/err.h"
#include "base/timer.h"
#include "bench_plot.h"
#include "bench_step.h"
#include "cli.h"

#define MAX_LENS   32
#define MAX_ROUNDS 64

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: lily bench --model DIR [--backend cpu|cuda] [--threads N] [--chunk N]\n"
        "                  [--prefill LIST] [--decode LIST] [--gen N] [--rounds N]\n"
        "                  [--turn TURNS] [--json FILE|-] [--csv FILE]\n"
        "                  [--plot FILE.svg [--plot-ref FILE.json]...]\n"
        "                  [--precision default|exact|fast] [--cpu-isa auto|avx512|avx2|scalar]\n"
        "                  [--rows LIST [--profile]] [--program] [--cuda-mega]\n"
        "LIST is comma-separated lengths such as 256,512,1K,4K (default 128,512).\n"
        "--prefill times prefill at each length; --decode times --gen (default 32) decoded\n"
        "tokens at each context length. Lengths in both lists share one prefill per round.\n"
        "--turn times prefill of N new tokens onto a context of D tokens, for each N@D in\n"
        "TURNS (comma-separated, such as 512@32K,512@128K: an agent loop's turn).\n"
        "Each row runs --rounds N times (default 1, at most 64) and shows the mean and the\n"
        "standard deviation; rows are printed as they are measured. --json - writes the\n"
        "JSON to stdout (the table then goes to stderr). --plot draws prefill and decode\n"
        "tok/s against context length; --plot-ref adds the series of a reference file\n"
        "(llama-bench -o json output, or lily bench --json), up to 8 files.\n"
        "--rows times decode steps of 1..8 rows (sessions) each at every --decode depth\n"
        "(default 512), --gen steps each: step time and tok/s (CSV/JSON with --csv/--json);\n"
        "--profile adds the time of each op of the step program (CUDA: the profiled steps\n"
        "run their launches un-captured with an event after each group of launches; an op\n"
        "fused into another's launches shows 0 ms, its time counted in that op); --program\n"
        "lists the program (ops, weight bytes per token, buffers, dependencies). --cuda-mega\n"
        "(experimental, CUDA) runs each decode step as one persistent kernel; --profile\n"
        "then still times the per-launch step (the persistent kernel has no per-op times).\n");
}

static int parse_list(const char *s, int *out, int *n) {
    *n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long v;
        if (lily_cli_size(tok, &v) || v < 1 || v > (1 << 24) || *n >= MAX_LENS) return -1;
        out[(*n)++] = (int)v;
    }
    return *n ? 0 : -1;
}

/* "N@D,..." into new[] and depth[] (N >= 1, D >= 0). */
static int parse_turns(const char *s, int *nw, int *depth, int *n) {
    *n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *at = strchr(tok, '@');
        long a, b;
        if (!at || *n >= MAX_LENS) return -1;
        *at = 0;
        if (lily_cli_size(tok, &a) || lily_cli_size(at + 1, &b) || a < 1 || b < 0 ||
            a + b > (1 << 24))
            return -1;
        nw[*n] = (int)a, depth[*n] = (int)b, (*n)++;
    }
    return *n ? 0 : -1;
}

typedef struct {
    int len, do_prefill, do_decode;
    double pp_ts[MAX_ROUNDS], tg_ts[MAX_ROUNDS]; /* tok/s of each round */
    size_t dev_used;                             /* device bytes in use after the rounds */
} bench_row;

typedef struct {
    double mean, sd; /* sd: sample standard deviation; NAN for one round */
} stat;

static stat stats(const double *x, int n) {
    stat r = {0, NAN};
    for (int i = 0; i < n; i++)
        r.mean += x[i] / n;
    if (n > 1) {
        double v = 0;
        for (int i = 0; i < n; i++)
            v += (x[i] - r.mean) * (x[i] - r.mean);
        r.sd = sqrt(v / (n - 1));
    }
    return r;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A number, or JSON null when it was not measured (NAN). */
static cJSON *jnum(double v) {
    return isnan(v) ? cJSON_CreateNull() : cJSON_CreateNumber(v);
}

static cJSON *jsamples(const double *x, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(x[i]));
    return a;
}

/* "1234.5 ± 6.7" into buf (width w), "-" when not measured, no spread for one round. */
static void cell(char *buf, size_t len, int w, stat s, int prec) {
    if (isnan(s.mean))
        snprintf(buf, len, "%*s", w, "-");
    else if (isnan(s.sd))
        snprintf(buf, len, "%*.*f", w, prec, s.mean);
    else {
        char t[64];
        snprintf(t, sizeof t, "%.*f ± %.*f", prec, s.mean, prec, s.sd);
        snprintf(buf, len, "%*s", w + 1, t); /* ± is two bytes, one column */
    }
}

/* The CPU backend's kernel set for these options (lily_cpu_kern_for, as the backend picks it):
 * "avx512-vnni", "avx512", "avx2" or "scalar" into set, the products' arithmetic into prod;
 * NULL set on other backends. */
static const char *kernel_set(const lily_model_info *in, const lily_engine_opts *o,
                              const char **prod) {
    *prod = NULL;
    if (strcmp(in->backend, "cpu") != 0) return NULL;
    const lily_cpu_kern k = lily_cpu_kern_for(o->cpu_isa, o->precision);
    *prod = k.i8 ? "int8-decode" : k.i16 ? "int16" : "fp32"; /* int8-decode: prefill int16 */
    return lily_cpu_kern_name(&k);
}

/* Prints the header lines and fills the JSON's description of the run. */
static void header(FILE *t, cJSON *j, const char *model, const lily_model_info *in,
                   const lily_engine_opts *o, int gen, int rounds) {
    int gpu = strcmp(in->backend, "cpu") != 0;
    const char *prod, *kset = kernel_set(in, o, &prod);
    char kern[96] = "";
    if (kset) snprintf(kern, sizeof kern, ", kernels %s (%s Q4 products)", kset, prod);
    fprintf(t, "# lily bench: %s (%s, %s), backend %s, commit %s\n", model, in->model_type,
            in->quant, in->backend, lily_cli_commit());
    fprintf(t, "# %s %s, %d thread%s%s; %d round%s per row (mean%s), %d decoded tokens per row\n",
            gpu ? "GPU" : "CPU", in->device, in->n_threads, in->n_threads == 1 ? "" : "s", kern,
            rounds, rounds == 1 ? "" : "s", rounds == 1 ? "" : " ± sd", gen);
    if (kset) {
        cJSON_AddStringToObject(j, "kernels", kset);
        cJSON_AddStringToObject(j, "q4_products", prod);
    } else {
        cJSON_AddNullToObject(j, "kernels");
        cJSON_AddNullToObject(j, "q4_products");
    }
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddStringToObject(j, "model_type", in->model_type);
    cJSON_AddStringToObject(j, "quant", in->quant);
    cJSON_AddStringToObject(j, "backend", in->backend);
    cJSON_AddStringToObject(j, "device", in->device);
    if (gpu)
        cJSON_AddStringToObject(j, "gpu", in->device);
    else
        cJSON_AddNullToObject(j, "gpu");
    char cpu[128] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            char *v = strchr(line, ':') + 1;
            v += strspn(v, " \t");
            v[strcspn(v, "\n")] = 0;
            snprintf(cpu, sizeof cpu, "%s", v);
            break;
        }
    if (f) fclose(f);
    cJSON_AddStringToObject(j, "cpu", gpu ? cpu : in->device);
    cJSON_AddNumberToObject(j, "threads", in->n_threads);
    cJSON_AddStringToObject(j, "commit", lily_cli_commit());
    cJSON_AddNumberToObject(j, "gen", gen);
    cJSON_AddNumberToObject(j, "rounds", rounds);
}

typedef struct bench_lists {
    int *pl, *dl, *tn, *td, *rl, npl, ndl, nt, nref, nrl;
    const char **refs;
} bench_lists;

static int bad_list(const char *a, const char *v) {
    fprintf(stderr, "lily bench: bad list '%s' for %s\n", v, a);
    return -1;
}

static int prefill_list(void *ud, const char *v) {
    bench_lists *b = ud;
    return parse_list(v, b->pl, &b->npl) ? bad_list("--prefill", v) : 0;
}

static int decode_list(void *ud, const char *v) {
    bench_lists *b = ud;
    return parse_list(v, b->dl, &b->ndl) ? bad_list("--decode", v) : 0;
}

static int rows_list(void *ud, const char *v) {
    bench_lists *b = ud;
    if (parse_list(v, b->rl, &b->nrl)) return bad_list("--rows", v);
    for (int i = 0; i < b->nrl; i++)
        if (b->rl[i] > LILY_MAX_ROWS) return bad_list("--rows", v);
    return 0;
}

static int turn_list(void *ud, const char *v) {
    bench_lists *b = ud;
    return parse_turns(v, b->tn, b->td, &b->nt) ? bad_list("--turn", v) : 0;
}

static int add_ref(void *ud, const char *v) {
    bench_lists *b = ud;
    if (b->nref == 8) {
        fprintf(stderr, "lily bench: at most 8 --plot-ref files\n");
        return -1;
    }
    b->refs[b->nref++] = v;
    return 0;
}

int lily_cmd_bench(int argc, char **argv) {
    const char *model = NULL, *json = NULL, *csv = NULL, *plot = NULL, *refs[8];
    int pl[MAX_LENS], dl[MAX_LENS], npl = 0, ndl = 0, gen = 32, rounds = 1, nref = 0;
    int tn[MAX_LENS], td[MAX_LENS], nt = 0, rl[MAX_LENS], profile = 0, program = 0, mega = 0;
    lily_engine_opts opts = {0};
    bench_lists bl = {.pl = pl, .dl = dl, .tn = tn, .td = td, .rl = rl, .refs = refs};
    lily_cli_engine ce = {0};
    lily_arg engt[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ce, engt);
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"},
        {.name = "--json", .kind = LILY_ARG_STR, .dst = &json, .help = "JSON output (- stdout)"},
        {.name = "--csv", .kind = LILY_ARG_STR, .dst = &csv, .help = "CSV output"},
        {.name = "--plot", .kind = LILY_ARG_STR, .dst = &plot, .help = "SVG plot"},
        {.name = "--plot-ref",
         .kind = LILY_ARG_FN,
         .fn = add_ref,
         .ud = &bl,
         .help = "reference series"},
        {.name = "--chunk",
         .kind = LILY_ARG_INT,
         .dst = &opts.prefill_chunk,
         .lo = 0,
         .hi = INT_MAX,
         .help = "prefill chunk"},
        {.name = "--gen",
         .kind = LILY_ARG_INT,
         .dst = &gen,
         .lo = 1,
         .hi = INT_MAX,
         .help = "decode tokens"},
        {.name = "--rounds",
         .kind = LILY_ARG_INT,
         .dst = &rounds,
         .lo = 1,
         .hi = MAX_ROUNDS,
         .help = "rounds"},
        {.name = "--prefill",
         .kind = LILY_ARG_FN,
         .fn = prefill_list,
         .ud = &bl,
         .help = "prefill lengths"},
        {.name = "--decode",
         .kind = LILY_ARG_FN,
         .fn = decode_list,
         .ud = &bl,
         .help = "decode depths"},
        {.name = "--turn", .kind = LILY_ARG_FN, .fn = turn_list, .ud = &bl, .help = "turns"},
        {.name = "--rows", .kind = LILY_ARG_FN, .fn = rows_list, .ud = &bl, .help = "row counts"},
        {.name = "--profile", .kind = LILY_ARG_FLAG, .dst = &profile, .help = "per-op times"},
        {.name = "--program", .kind = LILY_ARG_FLAG, .dst = &program, .help = "list the step"},
        {.name = "--cuda-mega",
         .kind = LILY_ARG_FLAG,
         .dst = &mega,
         .help = "decode as one persistent kernel (experimental)"},
        {0}};
    const lily_arg *tabs[] = {own, engt};
    const int pr = lily_args_parse("bench", tabs, 2, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    npl = bl.npl, ndl = bl.ndl, nt = bl.nt, nref = bl.nref;
    {
        const int chunk = opts.prefill_chunk;
        lily_cli_engine_apply(&ce, &opts);
        opts.prefill_chunk = chunk;
        opts.cuda_mega = mega;
    }
    char mbuf[4096];
    if (model && !(model = lily_cli_model(model, mbuf, sizeof mbuf))) return 1;
    if (!model || gen < 1 || rounds < 1 || rounds > MAX_ROUNDS || (nref && !plot)) {
        if (nref && !plot) fprintf(stderr, "lily bench: --plot-ref needs --plot\n");
        if (rounds < 1 || rounds > MAX_ROUNDS)
            fprintf(stderr, "lily bench: --rounds must be 1 to %d\n", MAX_ROUNDS);
        usage(stderr);
        return 2;
    }
    if (bl.nrl || profile || program) {
        static const int depth512 = 512;
        const int one = 1;
        lily_bench_step st = {.model = model,
                              .eng = opts,
                              .rows = bl.nrl ? rl : &one,
                              .n_rows = bl.nrl ? bl.nrl : 1,
                              .depths = ndl ? dl : &depth512,
                              .n_depths = ndl ? ndl : 1,
                              .gen = gen,
                              .profile = profile,
                              .program = program,
                              .json = json,
                              .csv = csv};
        return lily_bench_step_run(&st);
    }
    /* reference series first, so a bad file fails before the measurement */
    lily_plot_series *ser = calloc(LILY_PLOT_MAX_SERIES, sizeof *ser);
    int nser = 1;
    lily_err e;
    for (int i = 0; i < nref; i++)
        if (lily_plot_read_ref(refs[i], ser, &nser, LILY_PLOT_MAX_SERIES, &e)) {
            fprintf(stderr, "lily bench: %s\n", e.msg);
            free(ser);
            return 2;
        }
    if (!npl && !ndl && !nt) {
        pl[0] = dl[0] = 128;
        pl[1] = dl[1] = 512;
        npl = ndl = 2;
    }
    /* merge the two lists into rows */
    bench_row rows[2 * MAX_LENS];
    int nr = 0, maxlen = 0;
    for (int k = 0; k < 2; k++) {
        int *l = k ? dl : pl, nl = k ? ndl : npl;
        for (int i = 0; i < nl; i++) {
            int j = 0;
            while (j < nr && rows[j].len != l[i])
                j++;
            if (j == nr) rows[nr++] = (bench_row){.len = l[i]};
            if (k)
                rows[j].do_decode = 1;
            else
                rows[j].do_prefill = 1;
            if (l[i] > maxlen) maxlen = l[i];
        }
    }
    int maxctx = maxlen + gen; /* the session's room: the sweep's rows and the turns */
    for (int i = 0; i < nt; i++) {
        if (tn[i] + td[i] > maxctx) maxctx = tn[i] + td[i];
        if (tn[i] > maxlen) maxlen = tn[i];
        if (td[i] > maxlen) maxlen = td[i];
    }
    lily_engine *eng = NULL;
    lily_session *s = NULL;
    lily_cli_load_bar(&opts);
    if (lily_engine_open(model, &opts, &eng, &e) != 0) {
        fprintf(stderr, "lily bench: %s\n", e.msg);
        free(ser);
        return 1;
    }
    const lily_model_info *in = lily_engine_info(eng);
    if (lily_session_create(eng, maxctx, &s, &e) != 0) {
        fprintf(stderr, "lily bench: %s\n", e.msg);
        lily_engine_close(eng);
        free(ser);
        return 1;
    }
    int32_t *tok = malloc((size_t)maxlen * sizeof(int32_t));
    int32_t *gen_out = malloc((size_t)gen * sizeof(int32_t));
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < maxlen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)in->vocab_size);
    }
    /* the table goes to stdout, unless the JSON does */
    int json_out = json && !strcmp(json, "-");
    FILE *t = json_out ? stderr : stdout;
    cJSON *j = cJSON_CreateObject(), *jrows = cJSON_CreateArray(), *jturns = cJSON_CreateArray();
    header(t, j, model, in, &opts, gen, rounds);
    const char *prod, *kset = kernel_set(in, &opts, &prod);
    FILE *cf = csv ? fopen(csv, "w") : NULL;
    if (csv && !cf) fprintf(stderr, "lily bench: %s: cannot write\n", csv);
    if (cf)
        fprintf(cf, "len,depth,prefill_tok_s,prefill_tok_s_sd,prefill_tflops,decode_tok_s,"
                    "decode_tok_s_sd,decode_gb_s,kernels\n");
    int rc = 0;
    /* Untimed warm-up: each length up to 8K once (prefill + a few decode steps), so the first
     * round does not pay one-time costs: lazy kernel loading on first launch (CUDA loads a
     * kernel's module on its first call), the decode graph's capture, allocator growth. Longer
     * prompts run the same 4K-chunk kernels as the 4K/8K rows. */
    for (int i = 0; i < nr && !rc; i++) {
        if (rows[i].len > 8192) continue;
        lily_session_reset(s);
        rc = lily_session_prefill(s, tok, rows[i].len, NULL, NULL, NULL, &e) != 0 ||
             (rows[i].do_decode &&
              lily_session_decode_greedy(s, argmax(lily_session_logits(s), in->vocab_size),
                                         gen < 4 ? gen : 4, gen_out, &e) != 0);
    }
    const int dev = lily_engine_device_used(eng) > 0;
    if (nr && !rc)
        fprintf(t, "%8s %22s %10s %20s %10s%s\n", "context", "prefill tok/s", "TFLOP/s",
                "decode tok/s", "GB/s", dev ? "  dev GiB" : "");
    /* Each row's rounds back to back, then the row is printed: the figures appear as they are
     * measured. FLOPs per prefill token: 2 per active matrix weight (lm_head only for the last
     * token), and the causal attention term over the prompt. Decode bytes: active weights + GDN
     * state read and written + the KV cache read at the mean context of the generated tokens. */
    for (int i = 0; i < nr && !rc; i++) {
        bench_row *row = &rows[i];
        for (int r = 0; r < rounds && !rc; r++) {
            lily_session_reset(s);
            double t0 = lily_now();
            if (lily_session_prefill(s, tok, row->len, NULL, NULL, NULL, &e) != 0) {
                rc = 1;
                break;
            }
            double t1 = lily_now();
            row->pp_ts[r] = row->len / (t1 - t0);
            if (!row->do_decode) continue;
            int next = argmax(lily_session_logits(s), in->vocab_size);
            double t2 = lily_now();
            /* greedy: on the CUDA backend the steps chain on the device (graph replays) */
            if (lily_session_decode_greedy(s, next, gen, gen_out, &e) != 0) {
                rc = 1;
                break;
            }
            row->tg_ts[r] = gen / (lily_now() - t2);
        }
        if (rc) break;
        row->dev_used = lily_engine_device_used(eng);
        stat pp = row->do_prefill ? stats(row->pp_ts, rounds) : (stat){NAN, NAN};
        stat tg = row->do_decode ? stats(row->tg_ts, rounds) : (stat){NAN, NAN};
        double flops = (double)in->flops_per_token * row->len +
                       (double)in->attn_flops_per_ctx * row->len * (row->len + 1) / 2.0 +
                       (double)in->lm_head_flops;
        double tflops = flops * pp.mean / row->len / 1e12;
        double ctx = row->len + gen / 2.0;
        double bytes = (double)in->bytes_per_token + 2.0 * in->recurrent_state_bytes +
                       ctx * (double)in->kv_bytes_per_token;
        double gbs = bytes * tg.mean / 1e9;
        char c1[64], c2[64], c3[64], c4[64];
        cell(c1, sizeof c1, 22, pp, 1);
        cell(c2, sizeof c2, 10, (stat){tflops, NAN}, 3);
        cell(c3, sizeof c3, 20, tg, 2);
        cell(c4, sizeof c4, 10, (stat){gbs, NAN}, 1);
        fprintf(t, "%8d %s %s %s %s", row->len, c1, c2, c3, c4);
        if (dev) fprintf(t, " %8.2f", row->dev_used / 1073741824.0);
        fputc('\n', t);
        fflush(t);
        cJSON *jr = cJSON_CreateObject();
        cJSON_AddNumberToObject(jr, "len", row->len);
        cJSON_AddItemToObject(jr, "prefill_tok_s", jnum(pp.mean));
        cJSON_AddItemToObject(jr, "prefill_tok_s_sd", jnum(pp.sd));
        cJSON_AddItemToObject(jr, "prefill_tflops", jnum(tflops));
        cJSON_AddItemToObject(jr, "decode_tok_s", jnum(tg.mean));
        cJSON_AddItemToObject(jr, "decode_tok_s_sd", jnum(tg.sd));
        cJSON_AddItemToObject(jr, "decode_gb_s", jnum(gbs));
        cJSON_AddItemToObject(jr, "device_used_bytes",
                              dev ? cJSON_CreateNumber((double)row->dev_used) : cJSON_CreateNull());
        if (row->do_prefill)
            cJSON_AddItemToObject(jr, "prefill_samples", jsamples(row->pp_ts, rounds));
        if (row->do_decode)
            cJSON_AddItemToObject(jr, "decode_samples", jsamples(row->tg_ts, rounds));
        cJSON_AddItemToArray(jrows, jr);
        if (cf) {
            fprintf(cf, "%d,0,", row->len);
            double v[] = {pp.mean, pp.sd, tflops, tg.mean, tg.sd, gbs};
            for (int k = 0; k < 6; k++) {
                if (!isnan(v[k])) fprintf(cf, "%.4f", v[k]);
                fputc(',', cf);
            }
            fprintf(cf, "%s\n", kset ? kset : "");
        }
        if (row->do_prefill) lily_plot_add(&ser[0], 0, row->len, pp.mean);
        if (row->do_decode) lily_plot_add(&ser[0], 1, row->len, tg.mean);
    }
    /* turns: the context of each prefilled and snapshotted once (tokens 0..D-1), then per round
     * restored and N tokens (D..D+N-1 of the same stream, wrapping) timed; the first restore's
     * prefill is an untimed warm-up */
    if (nt && !rc)
        fprintf(t, "%8s %8s %22s %10s %10s\n", "turn", "depth", "prefill tok/s", "TFLOP/s", "ms");
    for (int i = 0; i < nt && !rc; i++) {
        lily_snapshot *snap = NULL;
        double ts[MAX_ROUNDS];
        int32_t *nt_tok = malloc((size_t)tn[i] * sizeof(int32_t));
        for (int k = 0; k < tn[i]; k++)
            nt_tok[k] = tok[(td[i] + k) % maxlen];
        lily_session_reset(s);
        rc = (td[i] > 0 && lily_session_prefill(s, tok, td[i], NULL, NULL, NULL, &e) != 0) ||
             lily_session_snapshot(s, &snap, &e) != 0;
        for (int r = -1; r < rounds && !rc; r++) {
            rc = lily_session_restore(s, snap, &e) != 0;
            double t0 = lily_now();
            rc = rc || lily_session_prefill(s, nt_tok, tn[i], NULL, NULL, NULL, &e) != 0;
            if (r >= 0) ts[r] = tn[i] / (lily_now() - t0);
        }
        lily_snapshot_free(snap);
        free(nt_tok);
        if (rc) break;
        /* the turn's FLOPs: its tokens' matrix work and attention over depth + its causal span */
        const double n = tn[i], d = td[i];
        double flops = (double)in->flops_per_token * n +
                       (double)in->attn_flops_per_ctx * (n * d + n * (n + 1) / 2.0) +
                       (double)in->lm_head_flops;
        stat pp = stats(ts, rounds);
        double tflops = flops * pp.mean / n / 1e12, ms = n / pp.mean * 1e3;
        char c1[64];
        cell(c1, sizeof c1, 22, pp, 1);
        fprintf(t, "%8d %8d %s %10.3f %10.2f\n", tn[i], td[i], c1, tflops, ms);
        fflush(t);
        cJSON *jt = cJSON_CreateObject();
        cJSON_AddNumberToObject(jt, "new", tn[i]);
        cJSON_AddNumberToObject(jt, "depth", td[i]);
        cJSON_AddNumberToObject(jt, "prefill_tok_s", pp.mean);
        cJSON_AddItemToObject(jt, "prefill_tok_s_sd", jnum(pp.sd));
        cJSON_AddNumberToObject(jt, "prefill_tflops", tflops);
        cJSON_AddNumberToObject(jt, "ms", ms);
        cJSON_AddItemToObject(jt, "prefill_samples", jsamples(ts, rounds));
        cJSON_AddItemToArray(jturns, jt);
        if (cf)
            fprintf(cf, "%d,%d,%.4f,,%.4f,,,,%s\n", tn[i], td[i], pp.mean, tflops,
                    kset ? kset : "");
    }
    if (rc) fprintf(stderr, "lily bench: %s\n", e.msg);
    cJSON_AddItemToObject(j, "rows", jrows);
    cJSON_AddItemToObject(j, "turns", jturns);
    if (json && !rc) {
        char *text = cJSON_Print(j);
        FILE *jf = json_out ? stdout : fopen(json, "w");
        if (!jf) {
            fprintf(stderr, "lily bench: %s: cannot write\n", json);
            rc = 1;
        } else {
            fprintf(jf, "%s\n", text);
            if (!json_out) fclose(jf);
        }
        free(text);
    }
    if (plot && !rc) {
        snprintf(ser[0].name, sizeof ser[0].name, "lily %s, %s %s, %s", lily_cli_commit(),
                 in->quant, in->backend, in->device);
        char title[256];
        snprintf(title, sizeof title, "%s (%s, %s): %d thread%s", model, in->model_type, in->quant,
                 in->n_threads, in->n_threads == 1 ? "" : "s");
        if (lily_plot_svg(plot, title, ser, nser, &e)) {
            fprintf(stderr, "lily bench: %s\n", e.msg);
            rc = 1;
        }
    }
    cJSON_Delete(j);
    if (cf) fclose(cf);
    free(ser);
    free(tok);
    free(gen_out);
    lily_session_free(s);
    lily_engine_close(eng);
    return rc;
}
