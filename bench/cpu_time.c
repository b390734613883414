/* Prefill and decode speed of the CPU backend in CPU time, one thread: on a machine shared with
 * other work, wall time moves by factors while the CPU time a token costs moves little. Public
 * API only, so the same file builds against an older tree (to compare binaries).
 *
 *   build/cpu_time MODEL_DIR ISA [precision: default|exact|fast] [gen=64] [rounds=3]
 *
 * ISA: auto, avx512, avx2 or scalar. Per round: a 512-token prefill (tok per CPU second), then
 * gen decode steps after 64 and after 512 tokens of context. Prints the best round of each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lily.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: cpu_time MODEL_DIR auto|avx512|avx2|scalar [precision] [gen] "
                        "[rounds]\n");
        return 2;
    }
    const char *isas[] = {"auto", "avx512", "avx2", "scalar"},
               *precs[] = {"default", "exact", "fast"};
    lily_engine_opts o = {0};
    o.n_threads = 1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(argv[2], isas[i])) o.cpu_isa = (lily_cpu_isa)i;
    for (int i = 0; argc > 3 && i < 3; i++)
        if (!strcmp(argv[3], precs[i])) o.precision = (lily_precision)i;
    const int gen = argc > 4 ? atoi(argv[4]) : 64, rounds = argc > 5 ? atoi(argv[5]) : 3;
    lily_err e = {0};
    lily_engine *eng;
    lily_session *s;
    if (lily_engine_open(argv[1], &o, &eng, &e) || lily_session_create(eng, 1024, &s, &e)) {
        fprintf(stderr, "cpu_time: %s\n", e.msg);
        return 1;
    }
    const lily_model_info *in = lily_engine_info(eng);
    int32_t tok[512], out[1024];
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < 512; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)in->vocab_size);
    }
    double best[3] = {0, 0, 0}; /* prefill 512, decode at 64, decode at 512: tokens / CPU s */
    for (int r = 0; r <= rounds; r++) { /* round 0: warm-up */
        const int ctx[2] = {64, 512};
        double v[3];
        lily_session_reset(s);
        double t0 = cpu_now();
        if (lily_session_prefill(s, tok, 512, NULL, NULL, NULL, &e)) goto fail;
        v[0] = 512 / (cpu_now() - t0);
        for (int c = 0; c < 2; c++) {
            lily_session_reset(s);
            if (lily_session_prefill(s, tok, ctx[c], NULL, NULL, NULL, &e)) goto fail;
            t0 = cpu_now();
            if (lily_session_decode_greedy(s, tok[0], gen, out, &e)) goto fail;
            v[1 + c] = gen / (cpu_now() - t0);
        }
        for (int k = 0; r > 0 && k < 3; k++)
            if (v[k] > best[k]) best[k] = v[k];
    }
    printf("%s %s %s: prefill512 %.1f decode64 %.2f decode512 %.2f tok/CPU-s\n", argv[1], argv[2],
           argc > 3 ? argv[3] : "default", best[0], best[1], best[2]);
    lily_session_free(s);
    lily_engine_close(eng);
    return 0;
fail:
    fprintf(stderr, "cpu_time: %s\n", e.msg);
    return 1;
}
