/* lily bench: prefill and decode speed at a sweep of context lengths, as a table and JSON/CSV.
 *
 * Each round and length: a fresh session prefills L random tokens (timed: prefill tok/s and
 * TFLOP/s), then decodes --gen tokens greedily from that context (timed: decode tok/s and the
 * achieved GB/s of the bytes a decode step must read: active weights, the GDN state read and
 * written, and the KV cache at that context). Rounds alternate over the lengths so drift in the
 * machine's speed spreads over all of them; the best round is reported. An untimed warm-up pass
 * (every length up to 8K once) comes first, so one-time costs (lazy kernel loading, the decode
 * graph's capture) stay out of the figures.
 *
 * --turn N@D times what an agent loop pays per turn: N new tokens prefilled onto a session that
 * already holds D (the D-token context is prefilled once, untimed, and snapshotted; each round
 * restores it and times the N-token prefill). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli.h"

#define MAX_LENS 32

static void usage(FILE *f) {
    fprintf(f,
            "usage: lily bench --model DIR [--backend cpu|cuda] [--threads N] [--chunk N]\n"
            "                  [--prefill LIST] [--decode LIST] [--gen N] [--rounds N]\n"
            "                  [--turn TURNS] [--json FILE] [--csv FILE]\n"
            "LIST is comma-separated lengths such as 256,512,1K,4K (default 128,512).\n"
            "--prefill times prefill at each length; --decode times --gen (default 32) decoded\n"
            "tokens at each context length. Lengths in both lists share one prefill per round.\n"
            "--turn times prefill of N new tokens onto a context of D tokens, for each N@D in\n"
            "TURNS (comma-separated, such as 512@32K,512@128K: an agent loop's turn).\n");
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
    double prefill_s, decode_s; /* best over rounds */
} bench_row;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int lily_cmd_bench(int argc, char **argv) {
    const char *model = NULL, *json = NULL, *csv = NULL;
    int pl[MAX_LENS], dl[MAX_LENS], npl = 0, ndl = 0, gen = 32, rounds = 1;
    int tn[MAX_LENS], td[MAX_LENS], nt = 0;
    lily_engine_opts opts = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!(v = lily_cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--csv")) csv = v;
        else if (!strcmp(a, "--backend")) {
            if (lily_cli_backend(v, &opts.backend)) return 2;
        } else if (!strcmp(a, "--threads")) opts.n_threads = atoi(v);
        else if (!strcmp(a, "--chunk")) opts.prefill_chunk = atoi(v);
        else if (!strcmp(a, "--gen")) gen = atoi(v);
        else if (!strcmp(a, "--rounds")) rounds = atoi(v);
        else if (!strcmp(a, "--prefill")) {
            if (parse_list(v, pl, &npl)) goto badlist;
        } else if (!strcmp(a, "--decode")) {
            if (parse_list(v, dl, &ndl)) goto badlist;
        } else if (!strcmp(a, "--turn")) {
            if (parse_turns(v, tn, td, &nt)) goto badlist;
        } else {
            fprintf(stderr, "lily bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        continue;
    badlist:
        fprintf(stderr, "lily bench: bad list '%s' for %s\n", v, a);
        return 2;
    }
    if (!model || gen < 1 || rounds < 1) {
        usage(stderr);
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
            while (j < nr && rows[j].len != l[i]) j++;
            if (j == nr) rows[nr++] = (bench_row){l[i], 0, 0, INFINITY, INFINITY};
            if (k) rows[j].do_decode = 1;
            else rows[j].do_prefill = 1;
            if (l[i] > maxlen) maxlen = l[i];
        }
    }
    int maxctx = maxlen + gen; /* the session's room: the sweep's rows and the turns */
    for (int i = 0; i < nt; i++) {
        if (tn[i] + td[i] > maxctx) maxctx = tn[i] + td[i];
        if (tn[i] > maxlen) maxlen = tn[i];
        if (td[i] > maxlen) maxlen = td[i];
    }
    lily_err e;
    lily_engine *eng = NULL;
    lily_session *s = NULL;
    lily_cli_load_bar(&opts);
    if (lily_engine_open(model, &opts, &eng, &e) != 0) {
        fprintf(stderr, "lily bench: %s\n", e.msg);
        return 1;
    }
    const lily_model_info *in = lily_engine_info(eng);
    if (lily_session_create(eng, maxctx, &s, &e) != 0) {
        fprintf(stderr, "lily bench: %s\n", e.msg);
        lily_engine_close(eng);
        return 1;
    }
    int32_t *tok = malloc((size_t)maxlen * sizeof(int32_t));
    int32_t *gen_out = malloc((size_t)(gen > 0 ? gen : 1) * sizeof(int32_t));
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < maxlen; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)in->vocab_size);
    }
    fprintf(stderr, "lily bench: %s (%s, %s), backend %s, %d round(s)\n", model, in->model_type,
            in->quant, in->backend, rounds);
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
    for (int r = 0; r < rounds && !rc; r++)
        for (int i = 0; i < nr && !rc; i++) {
            bench_row *row = &rows[i];
            lily_session_reset(s);
            double t0 = lily_now();
            if (lily_session_prefill(s, tok, row->len, NULL, NULL, NULL, &e) != 0) {
                rc = 1;
                break;
            }
            double t1 = lily_now();
            if (t1 - t0 < row->prefill_s) row->prefill_s = t1 - t0;
            if (!row->do_decode) continue;
            int next = argmax(lily_session_logits(s), in->vocab_size);
            double t2 = lily_now();
            /* greedy: on the CUDA backend the steps chain on the device (graph replays) */
            if (lily_session_decode_greedy(s, next, gen, gen_out, &e) != 0) {
                rc = 1;
                break;
            }
            double t3 = lily_now();
            if (t3 - t2 < row->decode_s) row->decode_s = t3 - t2;
        }
    /* turns: the context of each prefilled and snapshotted once (tokens 0..D-1), then per round
     * restored and N tokens (D..D+N-1 of the same stream, wrapping) timed; the first restore's
     * prefill is an untimed warm-up */
    double turn_s[MAX_LENS];
    for (int i = 0; i < nt && !rc; i++) {
        lily_snapshot *snap = NULL;
        int32_t *nt_tok = malloc((size_t)tn[i] * sizeof(int32_t));
        for (int k = 0; k < tn[i]; k++) nt_tok[k] = tok[(td[i] + k) % maxlen];
        lily_session_reset(s);
        turn_s[i] = INFINITY;
        rc = (td[i] > 0 && lily_session_prefill(s, tok, td[i], NULL, NULL, NULL, &e) != 0) ||
             lily_session_snapshot(s, &snap, &e) != 0;
        for (int r = -1; r < rounds && !rc; r++) {
            rc = lily_session_restore(s, snap, &e) != 0;
            double t0 = lily_now();
            rc = rc || lily_session_prefill(s, nt_tok, tn[i], NULL, NULL, NULL, &e) != 0;
            double t1 = lily_now();
            if (r >= 0 && t1 - t0 < turn_s[i]) turn_s[i] = t1 - t0;
        }
        lily_snapshot_free(snap);
        free(nt_tok);
    }
    if (rc) fprintf(stderr, "lily bench: %s\n", e.msg);
    /* FLOPs per prefill token: 2 per active matrix weight (lm_head only for the last token), and
     * the causal attention term over the prompt. Decode bytes: active weights + GDN state read and
     * written + the KV cache read at the mean context of the generated tokens. */
    FILE *jf = json ? fopen(json, "w") : NULL, *cf = csv ? fopen(csv, "w") : NULL;
    if (jf) fprintf(jf, "{\"model\": \"%s\", \"backend\": \"%s\", \"quant\": \"%s\", "
                        "\"gen\": %d, \"rounds\": %d, \"rows\": [", model, in->backend,
                    in->quant, gen, rounds);
    if (cf) fprintf(cf, "len,depth,prefill_tok_s,prefill_tflops,decode_tok_s,decode_gb_s\n");
    if (nr)
        printf("%8s %14s %10s %13s %10s\n", "context", "prefill tok/s", "TFLOP/s",
               "decode tok/s", "GB/s");
    for (int i = 0; i < nr && !rc; i++) {
        bench_row *row = &rows[i];
        double pts = row->len / row->prefill_s;
        double flops = (double)in->flops_per_token * row->len +
                       (double)in->attn_flops_per_ctx * row->len * (row->len + 1) / 2.0 +
                       (double)in->lm_head_flops;
        double tflops = flops / row->prefill_s / 1e12;
        double dts = row->do_decode ? gen / row->decode_s : 0;
        double ctx = row->len + gen / 2.0;
        double bytes = (double)in->bytes_per_token + 2.0 * in->recurrent_state_bytes +
                       ctx * (double)in->kv_bytes_per_token;
        double gbs = row->do_decode ? bytes * dts / 1e9 : 0;
        if (row->do_prefill) printf("%8d %14.1f %10.3f", row->len, pts, tflops);
        else printf("%8d %14s %10s", row->len, "-", "-");
        if (row->do_decode) printf(" %13.2f %10.1f\n", dts, gbs);
        else printf(" %13s %10s\n", "-", "-");
        if (jf)
            fprintf(jf, "%s\n  {\"len\": %d, \"prefill_tok_s\": %.3f, \"prefill_tflops\": %.4f, "
                        "\"decode_tok_s\": %.3f, \"decode_gb_s\": %.2f}",
                    i ? "," : "", row->len, row->do_prefill ? pts : 0.0,
                    row->do_prefill ? tflops : 0.0, dts, gbs);
        if (cf)
            fprintf(cf, "%d,0,%.3f,%.4f,%.3f,%.2f\n", row->len, row->do_prefill ? pts : 0.0,
                    row->do_prefill ? tflops : 0.0, dts, gbs);
    }
    if (jf) fprintf(jf, "\n], \"turns\": [");
    if (nt && !rc) printf("%8s %8s %14s %10s %10s\n", "turn", "depth", "prefill tok/s", "TFLOP/s",
                          "ms");
    for (int i = 0; i < nt && !rc; i++) {
        /* the turn's FLOPs: its tokens' matrix work and attention over depth + its causal span */
        const double n = tn[i], d = td[i];
        double flops = (double)in->flops_per_token * n +
                       (double)in->attn_flops_per_ctx * (n * d + n * (n + 1) / 2.0) +
                       (double)in->lm_head_flops;
        double pts = n / turn_s[i], tflops = flops / turn_s[i] / 1e12;
        printf("%8d %8d %14.1f %10.3f %10.2f\n", tn[i], td[i], pts, tflops, turn_s[i] * 1e3);
        if (jf)
            fprintf(jf, "%s\n  {\"new\": %d, \"depth\": %d, \"prefill_tok_s\": %.3f, "
                        "\"prefill_tflops\": %.4f, \"ms\": %.3f}",
                    i ? "," : "", tn[i], td[i], pts, tflops, turn_s[i] * 1e3);
        if (cf) fprintf(cf, "%d,%d,%.3f,%.4f,0.000,0.00\n", tn[i], td[i], pts, tflops);
    }
    if (jf) fprintf(jf, "\n]}\n"), fclose(jf);
    if (cf) fclose(cf);
    free(tok);
    free(gen_out);
    lily_session_free(s);
    lily_engine_close(eng);
    return rc;
}
