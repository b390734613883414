/* Throughput of the CUDA backend on the 35B-A3B shape (a measurement, not a CI check): skipped
 * unless LILY_CUDA_BENCH_DIR names a directory, where a synthetic 35B-A3B MLX 4-bit checkpoint
 * is written by lily_mk_write when none is there yet. Times, through the backend contract:
 * prefill of a 4096-token prompt from an empty context (chunks of LILY_CUDA_BENCH_CHUNK, default
 * 512); greedy decode at 4K context (CUDA graph); and one prefill chunk and decode steps at a
 * depth of ~128K positions, with the engine precision LILY_CUDA_BENCH_PRECISION (default, exact
 * or fast; default: default). The deep measurements
 * reuse whatever the KV rows hold (their values do not change the work), so they need no 128K
 * prefill. Prints one line per measurement and a summary; fails only if the backend fails or the
 * 4K logits are not finite. bench/gpu_check.sh runs it on the GPU machine.

 * A/B of builds or precisions: bench/gpu_check.sh alternates `lily bench` runs. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <stdlib.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_mem.h"
#include "base/timer.h"
#include "model/mkmodel.h"
#include "parity_util.h"

static int argmax_h(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static const lily_backend_ops *g = &lily_backend_cuda;
static lily_backend *gb;
static lily_bstate *gs;
static float *logits;
static int V;

/* Prefills n tokens at pos in chunks; returns seconds (negative on failure). */
static double prefill(const int32_t *tok, int n, int pos, int chunk) {
    lily_err e;
    double t0 = lily_now();
    for (int i = 0; i < n; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        if (g->forward(gb, gs, tok + i, c, pos + i, logits, 0, &e)) {
            printf("FAIL prefill at %d: %s\n", pos + i, e.msg);
            return -1;
        }
    }
    return lily_now() - t0;
}

/* Decodes steps tokens greedily from pos; returns seconds per token after one warm-up step. */
static double decode(int pos, int steps) {
    lily_err e;
    /* a fixed token sequence: a host argmax over V logits would add ~0.2 ms per step */
    int32_t t = (int32_t)((pos * 7919u) % (unsigned)V);
    if (g->forward(gb, gs, &t, 1, pos, logits, 0, &e)) { /* warm-up (captures the graph) */
        printf("FAIL decode at %d: %s\n", pos, e.msg);
        return -1;
    }
    double t0 = lily_now();
    for (int i = 1; i <= steps; i++) {
        t = (int32_t)(((pos + i) * 7919u) % (unsigned)V);
        if (g->forward(gb, gs, &t, 1, pos + i, logits, 0, &e)) {
            printf("FAIL decode at %d: %s\n", pos + i, e.msg);
            return -1;
        }
    }
    return (lily_now() - t0) / steps;
}

int main(void) {
    const char *dir = getenv("LILY_CUDA_BENCH_DIR");
    if (!dir || !*dir) {
        printf("skipped: set LILY_CUDA_BENCH_DIR to run the 35B-A3B benchmark\n");
        return 77;
    }
    pt_need_gpu();
    lily_err e;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        lily_mk_opts o;
        lily_mk_result r;
        if (lily_mk_preset("35b-a3b", &o, &e)) return printf("FAIL %s\n", e.msg), 1;
        o.layout = LILY_MK_MLX;
        o.bits = 4;
        o.seed = 35;
        double t0 = lily_now();
        if (lily_mk_write(dir, &o, &r, &e)) return printf("FAIL mkmodel: %s\n", e.msg), 1;
        printf("mkmodel 35b-a3b mlx4: %.2f GB in %d files, %.1f s\n", r.bytes / 1e9, r.n_files,
               lily_now() - t0);
    }
    double t0 = lily_now();
    lily_model *m;
    if (lily_model_load(dir, &m, &e)) return printf("FAIL load: %s\n", e.msg), 1;
    double t_load = lily_now() - t0;
    const char *cs = getenv("LILY_CUDA_BENCH_CHUNK");
    int chunk = cs ? atoi(cs) : 512;
    if (chunk < 1 || chunk > 8192) chunk = 512;
    lily_engine_opts o = {0};
    o.prefill_chunk = chunk;
    const char *pv = getenv("LILY_CUDA_BENCH_PRECISION");
    if (pv && !strcmp(pv, "exact"))
        o.precision = LILY_PRECISION_EXACT;
    else if (pv && !strcmp(pv, "fast"))
        o.precision = LILY_PRECISION_FAST;
    else if (pv && *pv && strcmp(pv, "default"))
        return printf("FAIL LILY_CUDA_BENCH_PRECISION=%s (default, exact or fast)\n", pv), 1;
    printf("precision: %s\n", pv && *pv ? pv : "default");
    t0 = lily_now();
    if (g->open(m, &o, &gb, &e)) return printf("FAIL open: %s\n", e.msg), 1;
    double t_up = lily_now() - t0;
    char dev[256];
    lily_cuda_describe(dev, sizeof dev);
    printf("device: %s\n", dev);
    printf("load %.1f s, upload %.1f s (%.2f GB of weights as stored)\n", t_load, t_up,
           m->weight_bytes / 1e9);
    V = m->cfg.vocab;
    const char *prof = getenv("LILY_CUDA_BENCH_PROFILE");
    if (prof) {
        /* one prefill chunk or one decode step (its graph: ncu profiles the graph's kernels one
         * by one), for a per-kernel profile */
        int pctx = 2 * chunk + 8;
        logits = malloc((size_t)V * 4);
        int32_t *pt = malloc((size_t)chunk * 4);
        for (int i = 0; i < chunk; i++)
            pt[i] = (int32_t)(pt_rnd() % V);
        if (g->state_create(gb, pctx, &gs, &e)) return printf("FAIL state: %s\n", e.msg), 1;
        int rc = 0;
        if (!strcmp(prof, "prefill")) {
            rc = g->forward(gb, gs, pt, chunk, 0, logits, 0, &e);
        } else if (!strcmp(prof, "graph")) {
            /* graphed decode steps, for a per-node trace (nsys --cuda-graph-trace=node) */
            for (int i = 0; i < 21 && !rc; i++)
                rc = g->forward(gb, gs, pt + i, 1, chunk + i, logits, 0, &e);
        } else {
            rc = g->forward(gb, gs, pt, 1, chunk, logits, 0, &e);
        }
        if (rc) printf("FAIL profile run: %s\n", e.msg);
        g->state_free(gb, gs);
        g->close(gb);
        return rc ? 1 : 0;
    }
    int deep = 131072, ctx = deep + 1024;
    if (g->state_create(gb, ctx, &gs, &e)) return printf("FAIL state: %s\n", e.msg), 1;
    printf("state for %d positions: %.2f GB\n", ctx, g->state_bytes(gb, ctx) / 1e9);
    logits = malloc((size_t)V * 4);
    int n4k = 4096;
    int32_t *tok = malloc((size_t)(n4k + chunk) * 4);
    for (int i = 0; i < n4k + chunk; i++)
        tok[i] = (int32_t)(pt_rnd() % V);
    /* warm-up: one chunk, then reset */
    if (prefill(tok, chunk, 0, chunk) < 0) return 1;
    g->state_reset(gb, gs);
    double tp = prefill(tok, n4k, 0, chunk);
    if (tp < 0) return 1;
    int finite = 1;
    for (int i = 0; i < V; i++)
        finite &= isfinite(logits[i]) != 0;
    printf("prefill %d tokens from 0 (chunk %d): %.3f s = %.0f tok/s; logits finite: %s, "
           "argmax %d\n",
           n4k, chunk, tp, n4k / tp, finite ? "yes" : "NO", argmax_h(logits, V));
    pt_check_true("35B prefill logits are finite", finite);
    double td = decode(n4k, 64);
    if (td < 0) return 1;
    double wbytes = 1.67e9 + 1.29e8 + 20480.0 * n4k; /* spec 9.1: active weights + GDN + KV */
    printf("decode at %d (graph): %.3f ms/token = %.1f tok/s (%.0f GB/s of %.2f GB/token)\n",
           n4k + 1, td * 1e3, 1 / td, wbytes / td / 1e9, wbytes / 1e9);
    double tc = prefill(tok, chunk, n4k + 100, chunk);
    printf("prefill chunk of %d at depth %d: %.3f s = %.0f tok/s\n", chunk, n4k + 100, tc,
           chunk / tc);
    double tcd = prefill(tok, chunk, deep - chunk, chunk);
    if (tcd < 0) return 1;
    printf("prefill chunk of %d at depth %d: %.3f s = %.0f tok/s\n", chunk, deep - chunk, tcd,
           chunk / tcd);
    double tdd = decode(deep, 32);
    if (tdd < 0) return 1;
    double wdeep = 1.67e9 + 1.29e8 + 20480.0 * deep;
    printf("decode at %d (graph): %.3f ms/token = %.1f tok/s (%.0f GB/s of %.2f GB/token)\n",
           deep + 1, tdd * 1e3, 1 / tdd, wdeep / tdd / 1e9, wdeep / 1e9);
    printf("SUMMARY prefill4k=%.0f tok/s decode4k=%.1f tok/s prefill@128k=%.0f tok/s "
           "decode@128k=%.1f tok/s (floors: 15100, 380, 11700, 273)\n",
           n4k / tp, 1 / td, chunk / tcd, 1 / tdd);
    g->state_free(gb, gs);
    g->close(gb);
    lily_model_free(m);
    free(tok), free(logits);
    return pt_finish();
}
#endif
