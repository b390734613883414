/* What a decode step over several sessions costs on this build, without the server: N sessions
 * (1, 2, 4, 8) each consume T tokens, (a) one session after another (lily_session_decode, what a
 * FIFO server does) and (b) interleaved, one lily_session_decode_rows call a step (what
 * `lily serve --parallel` does); the rounds alternate (a) and (b). Reports tokens per second of
 * each and their ratio. Tokens are fixed (a cycle over the vocabulary), not sampled.
 *
 *   cmake -S . -B build -G Ninja && ninja -C build rows_cost
 *   build/rows_cost [model=models/tiny-trained] [tokens=128] [rounds=3] [threads=1]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lily.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "models/tiny-trained";
    const int T = argc > 2 ? atoi(argv[2]) : 128, R = argc > 3 ? atoi(argv[3]) : 3;
    lily_engine_opts eo = {.n_threads = argc > 4 ? atoi(argv[4]) : 1};
    lily_engine *eng;
    lily_err e;
    if (lily_engine_open(dir, &eo, &eng, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const int V = lily_engine_info(eng)->vocab_size;
    lily_session *ss[LILY_MAX_ROWS];
    for (int i = 0; i < LILY_MAX_ROWS; i++)
        if (lily_session_create(eng, T + 8, &ss[i], &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
    static const int NS[] = {1, 2, 4, 8};
    double ta[4] = {0}, tb[4] = {0};
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) {
            const int n = NS[k];
            for (int pass = 0; pass < 2; pass++) {
                const int rows = (pass + r) % 2; /* alternate which goes first */
                for (int i = 0; i < n; i++)
                    lily_session_reset(ss[i]);
                const double t0 = now();
                if (rows) {
                    for (int t = 0; t < T; t++) {
                        int32_t tok[LILY_MAX_ROWS];
                        for (int i = 0; i < n; i++)
                            tok[i] = (int32_t)((7 * t + 131 * i + 1) % V);
                        if (lily_session_decode_rows(ss, tok, n, &e)) return 1;
                    }
                } else {
                    for (int i = 0; i < n; i++)
                        for (int t = 0; t < T; t++)
                            if (lily_session_decode(ss[i], (int32_t)((7 * t + 131 * i + 1) % V),
                                                    &e))
                                return 1;
                }
                (rows ? tb : ta)[k] += now() - t0;
            }
        }
    printf("%s, %d tokens a session, %d rounds, %d threads\n", dir, T, R, eo.n_threads);
    printf("sessions  one after another tok/s  decode_rows tok/s  ratio\n");
    for (int k = 0; k < 4; k++) {
        const double a = NS[k] * T * R / ta[k], b = NS[k] * T * R / tb[k];
        printf("%8d  %27.1f  %17.1f  %5.2f\n", NS[k], a, b, b / a);
    }
    for (int i = 0; i < LILY_MAX_ROWS; i++)
        lily_session_free(ss[i]);
    lily_engine_close(eng);
    return 0;
}
