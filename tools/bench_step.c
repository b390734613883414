/* lily bench --rows / --profile / --program (bench_step.h).
 *
 * Drives the backend directly (backend.h), as the engine does, so a step can be timed op by op:
 * one state is prefilled to each depth (untimed) and copied into every row's state; then, for
 * each row count R, --gen steps of R rows (one random token each, so the rows route to different
 * experts) run back to back, timed as a whole: the step time, the tokens per second of all rows
 * and per row, and the ratio to the 1-row step of the same run. A 1-row step is the decode step
 * (forward); R > 1 rows take forward_rows (or, on a backend without it, R decode steps).
 * --profile then runs the same steps again with the backend timing each op of the program and
 * prints, per op kind, its count, bytes per token, milliseconds per step and GB/s. */
#include "bench_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "backend/program.h"
#include "base/err.h"
#include "base/timer.h"
#include "cli.h"
#include "model/model.h"

typedef struct {
    const lily_backend_ops *ops;
    lily_backend *b;
    lily_bstate *s[LILY_MAX_ROWS];
    float *lg[LILY_MAX_ROWS];
    int V;
    uint64_t rng;
} ctx;

static int32_t rnd_token(ctx *c) {
    c->rng ^= c->rng << 13, c->rng ^= c->rng >> 7, c->rng ^= c->rng << 17;
    return (int32_t)(c->rng % (uint64_t)c->V);
}

/* One step of R rows at position pos. */
static int step(ctx *c, int R, int pos, lily_err *e) {
    int32_t tok[LILY_MAX_ROWS];
    int p[LILY_MAX_ROWS];
    for (int i = 0; i < R; i++)
        tok[i] = rnd_token(c), p[i] = pos;
    if (R > 1 && c->ops->forward_rows) return c->ops->forward_rows(c->b, c->s, tok, p, R, c->lg, e);
    for (int i = 0; i < R; i++)
        if (c->ops->forward(c->b, c->s[i], &tok[i], 1, pos, c->lg[i], 0, e)) return -1;
    return 0;
}

/* Sum of per-op times by kind: [LILY_OP_COUNT]. */
static void by_kind(const lily_program *p, const double *ms, double *kms, uint64_t *kbytes,
                    int *kcount) {
    for (int k = 0; k < LILY_OP_COUNT; k++)
        kms[k] = 0, kbytes[k] = 0, kcount[k] = 0;
    for (int i = 0; i < p->n_ops; i++) {
        const lily_op *op = &p->ops[i];
        kms[op->kind] += ms[i];
        kbytes[op->kind] += op->bytes;
        kcount[op->kind]++;
    }
}

int lily_bench_step_run(const lily_bench_step *o) {
    lily_err e = {0};
    lily_model *m = NULL;
    lily_engine_opts eo = o->eng;
    const lily_backend_ops *ops = lily_backend_get(eo.backend, &e);
    if (!ops || lily_model_load(o->model, &m, &e)) {
        fprintf(stderr, "lily bench: %s\n", e.msg);
        return 1;
    }
    if (eo.prefill_chunk <= 0) eo.prefill_chunk = ops->prefill_chunk;
    ctx c = {.ops = ops, .V = m->cfg.vocab, .rng = 0x2545f4914f6cdd1dull};
    lily_program own = {0};
    const lily_program *prog = NULL;
    int rc = 1, maxr = 1, maxd = 1;
    for (int i = 0; i < o->n_rows; i++)
        maxr = o->rows[i] > maxr ? o->rows[i] : maxr;
    for (int i = 0; i < o->n_depths; i++)
        maxd = o->depths[i] > maxd ? o->depths[i] : maxd;
    double *ms = NULL;
    lily_bstate *master = NULL;
    int32_t *tok = NULL;
    cJSON *json = NULL;
    FILE *csv = NULL;
    if (o->program) {
        lily_program_build(m, &own);
        lily_program_print(&own, NULL, stdout);
        rc = 0;
        goto done;
    }
    if (ops->open(m, &eo, &c.b, &e)) goto fail;
    if (ops->program) {
        prog = ops->program(c.b);
    } else {
        lily_program_build(m, &own);
        prog = &own;
    }
    const int ctxlen = maxd + o->gen + 2;
    if (ops->state_create(c.b, ctxlen, &master, &e)) goto fail;
    for (int i = 0; i < maxr; i++) {
        if (ops->state_create(c.b, ctxlen, &c.s[i], &e)) goto fail;
        c.lg[i] = lily_xmalloc((size_t)c.V * sizeof(float));
    }
    ms = lily_xcalloc((size_t)prog->n_ops, sizeof(double));
    tok = lily_xmalloc((size_t)maxd * sizeof(int32_t));
    if (o->csv && !(csv = fopen(o->csv, "w"))) {
        fprintf(stderr, "lily bench: cannot write %s\n", o->csv);
        goto done;
    }
    if (csv) fprintf(csv, "depth,rows,step_ms,tok_s,tok_s_per_row,step_vs_1row\n");
    json = cJSON_CreateObject();
    cJSON_AddStringToObject(json, "model", o->model);
    cJSON_AddStringToObject(json, "backend", ops->name);
    cJSON_AddStringToObject(json, "commit", lily_cli_commit());
    cJSON_AddNumberToObject(json, "threads", eo.n_threads);
    cJSON_AddNumberToObject(json, "gen", o->gen);
    cJSON *jrows = cJSON_AddArrayToObject(json, "rows");
    printf("lily bench (step): %s, backend %s, %d threads, %d steps per row count, commit %s\n",
           o->model, ops->name, eo.n_threads, o->gen, lily_cli_commit());
    printf("%7s %5s %10s %10s %12s %8s\n", "depth", "rows", "step ms", "tok/s", "tok/s/row",
           "vs 1row");
    for (int di = 0; di < o->n_depths; di++) {
        const int D = o->depths[di];
        for (int i = 0; i < D; i++)
            tok[i] = rnd_token(&c);
        ops->state_reset(c.b, master);
        for (int done = 0; done < D;) {
            int n = D - done < eo.prefill_chunk ? D - done : eo.prefill_chunk;
            if (ops->forward(c.b, master, tok + done, n, done, c.lg[0], 0, &e)) goto fail;
            done += n;
        }
        double one = 0;
        for (int ri = 0; ri < o->n_rows; ri++) {
            const int R = o->rows[ri];
            for (int i = 0; i < R; i++)
                if (ops->state_copy(c.b, c.s[i], master, D, &e)) goto fail;
            if (step(&c, R, D, &e)) goto fail; /* warm-up, then back to depth D */
            for (int i = 0; i < R; i++)
                if (ops->state_copy(c.b, c.s[i], master, D, &e)) goto fail;
            double t0 = lily_now();
            for (int g = 0; g < o->gen; g++)
                if (step(&c, R, D + g, &e)) goto fail;
            double sms = (lily_now() - t0) * 1e3 / o->gen;
            if (R == 1) one = sms;
            double ratio = one > 0 ? sms / one : 0;
            printf("%7d %5d %10.3f %10.1f %12.1f %8.2f\n", D, R, sms, R * 1e3 / sms, 1e3 / sms,
                   ratio);
            if (csv)
                fprintf(csv, "%d,%d,%.4f,%.2f,%.2f,%.3f\n", D, R, sms, R * 1e3 / sms, 1e3 / sms,
                        ratio);
            cJSON *jr = cJSON_CreateObject();
            cJSON_AddNumberToObject(jr, "depth", D);
            cJSON_AddNumberToObject(jr, "rows", R);
            cJSON_AddNumberToObject(jr, "step_ms", sms);
            cJSON_AddNumberToObject(jr, "tok_s", R * 1e3 / sms);
            cJSON_AddNumberToObject(jr, "step_vs_1row", ratio);
            if (o->profile && ops->set_profile) {
                for (int i = 0; i < R; i++)
                    if (ops->state_copy(c.b, c.s[i], master, D, &e)) goto fail;
                memset(ms, 0, (size_t)prog->n_ops * sizeof(double));
                ops->set_profile(c.b, ms);
                for (int g = 0; g < o->gen; g++)
                    if (step(&c, R, D + g, &e)) {
                        ops->set_profile(c.b, NULL);
                        goto fail;
                    }
                ops->set_profile(c.b, NULL);
                double kms[LILY_OP_COUNT], tot = 0;
                uint64_t kb[LILY_OP_COUNT];
                int kc[LILY_OP_COUNT];
                for (int i = 0; i < prog->n_ops; i++)
                    ms[i] /= o->gen, tot += ms[i];
                by_kind(prog, ms, kms, kb, kc);
                printf("  per op, depth %d, %d row%s (ms per step; bytes per token, one row):\n", D,
                       R, R > 1 ? "s" : "");
                printf("  %-10s %5s %14s %9s %6s %8s\n", "op", "count", "bytes/token", "ms", "%",
                       "GB/s");
                cJSON *jp = cJSON_AddArrayToObject(jr, "ops");
                for (int k = 0; k < LILY_OP_COUNT; k++) {
                    if (!kc[k]) continue;
                    printf("  %-10s %5d %14llu %9.4f %6.1f %8.2f\n", lily_op_name(k), kc[k],
                           (unsigned long long)kb[k], kms[k], tot > 0 ? 100 * kms[k] / tot : 0,
                           kms[k] > 0 ? (double)kb[k] / (kms[k] * 1e-3) / 1e9 : 0.0);
                    cJSON *jo = cJSON_CreateObject();
                    cJSON_AddStringToObject(jo, "op", lily_op_name(k));
                    cJSON_AddNumberToObject(jo, "count", kc[k]);
                    cJSON_AddNumberToObject(jo, "bytes_per_token", (double)kb[k]);
                    cJSON_AddNumberToObject(jo, "ms", kms[k]);
                    cJSON_AddItemToArray(jp, jo);
                }
                printf("  %-10s %5d %14s %9.4f (timed steps: %.3f ms)\n", "total", prog->n_ops, "",
                       tot, sms);
                int fused = 0;
                for (int k = 0; k < LILY_OP_COUNT; k++)
                    fused += kc[k] > 0 && kms[k] == 0;
                if (fused)
                    printf("  (%d op kind%s at 0 ms: run fused into another op's launches, which "
                           "is charged their time)\n",
                           fused, fused > 1 ? "s" : "");
            }
            cJSON_AddItemToArray(jrows, jr);
        }
    }
    if (o->json) {
        char *txt = cJSON_Print(json);
        FILE *f = strcmp(o->json, "-") ? fopen(o->json, "w") : stdout;
        if (!f) {
            fprintf(stderr, "lily bench: cannot write %s\n", o->json);
        } else {
            fprintf(f, "%s\n", txt);
            if (f != stdout) fclose(f);
        }
        free(txt);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lily bench: %s\n", e.msg);
    rc = 1;
done:
    if (csv) fclose(csv);
    cJSON_Delete(json);
    if (c.b) {
        for (int i = 0; i < maxr; i++)
            if (c.s[i]) ops->state_free(c.b, c.s[i]);
        if (master) ops->state_free(c.b, master);
        ops->close(c.b);
    }
    for (int i = 0; i < maxr; i++)
        free(c.lg[i]);
    free(ms), free(tok);
    lily_program_free(&own);
    lily_model_free(m);
    return rc;
}
