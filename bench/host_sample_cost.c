/* What the server pays on the host per generated token when it samples there (src/gen/gen.c):
 * lily_sampler_sample over the 35B's 248320 logits under common settings (with a repetition
 * penalty of 1.1 over 64 tokens of history: the copy and the penalties, then the draw chain),
 * lily_logprob (a log-softmax over the vocabulary, which the server computes only when logprobs
 * are asked), and lily_draw_pick alone (backend/draw.h: the chain the sampler ends with, which
 * reads the caller's logits when no bias or penalty applies).
 * Logits are N(0, 3); the mean of N calls per setting.
 *
 *   cmake -S . -B build -G Ninja && ninja -C build lily_core
 *   cc -O2 -std=c11 -Iinclude -Isrc bench/host_sample_cost.c build/liblily_core.a -lm \
 *      -o /tmp/host_sample_cost && /tmp/host_sample_cost [N=50]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/draw.h"
#include "sampler/sampler.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int V = 248320, N = argc > 1 ? atoi(argv[1]) : 50;
    float *l = malloc((size_t)V * sizeof *l);
    srand(1);
    for (int i = 0; i < V; i++) {
        double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0);
        l[i] = (float)(3.0 * sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
    }
    static const struct {
        const char *name;
        float t, p, mp;
        int k;
    } cf[] = {{"greedy (T=0)", 0, 1, 0, 0},
              {"T=1", 1, 1, 0, 0},
              {"T=0.7 top_p=0.8", 0.7f, 0.8f, 0, 0},
              {"T=0.6 top_k=20 top_p=0.95", 0.6f, 0.95f, 0, 20},
              {"T=1 min_p=0.05", 1, 1, 0.05f, 0}};
    long sink = 0;
    lily_draw_cand *scr = malloc((size_t)V * sizeof *scr);
    for (size_t c = 0; c < sizeof cf / sizeof cf[0]; c++) {
        lily_sampler_params p = lily_sampler_params_default();
        p.temperature = cf[c].t, p.top_p = cf[c].p, p.min_p = cf[c].mp, p.top_k = cf[c].k;
        p.repeat_penalty = 1.1f;
        lily_sampler *s;
        lily_err e;
        if (lily_sampler_create(&p, V, &s, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        int32_t hist[64];
        for (int i = 0; i < 64; i++)
            hist[i] = i * 97;
        double t0 = now();
        for (int i = 0; i < N; i++)
            sink += lily_sampler_sample(s, l, hist, 64, (uint64_t)i, &e);
        double t1 = now();
        for (int i = 0; i < N; i++)
            sink += lily_logprob(l, V, i) < 0;
        double t2 = now();
        lily_draw d = {.temperature = cf[c].t,
                       .top_k = cf[c].k,
                       .top_p = cf[c].p,
                       .min_p = cf[c].mp,
                       .ban_id = -1,
                       .seed = 7};
        for (int i = 0; i < N; i++) {
            d.step = (uint64_t)i;
            sink += lily_draw_pick(l, V, &d, scr);
        }
        double t3 = now();
        printf("%-28s sample %7.3f ms   logprob %7.3f ms   draw_pick %7.3f ms\n", cf[c].name,
               (t1 - t0) / N * 1e3, (t2 - t1) / N * 1e3, (t3 - t2) / N * 1e3);
        lily_sampler_free(s);
    }
    free(l);
    free(scr);
    return sink == 42; /* keeps the calls */
}
