/* CPU time of the Q4 products per kernel set, one thread, the sets alternated round by round
 * (a loaded shared machine moves wall time a lot and thread CPU time much less).
 *
 *   build/cpu_kernels [rows=2048] [cols=2048] [n=1] [rounds=5]
 *
 * Prints, per kernel set (lily_cpu_kern_for of an ISA cap and a precision), the best and the
 * median over the rounds of the CPU time of one lily_cpu_matmul call on random Q4 weights (the
 * matrix is re-read every call: for rows x cols / 2 bytes beyond the L2 that is a memory-bound
 * figure), and the weight bytes per CPU second of the best. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/ops.h"
#include "base/err.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 2048, cols = argc > 2 ? atoi(argv[2]) : 2048;
    const int n = argc > 3 ? atoi(argv[3]) : 1, rounds = argc > 4 ? atoi(argv[4]) : 5;
    if (rows < 1 || cols < 64 || cols % 64 || n < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: cpu_kernels [rows] [cols (multiple of 64)] [n] [rounds]\n");
        return 2;
    }
    lily_mat W = {0};
    W.dt = LILY_DT_Q4, W.rows = rows, W.cols = cols, W.group = 64;
    const size_t ng = (size_t)rows * cols / 64, wb = (size_t)rows * cols / 2;
    uint8_t *q = lily_xaligned(wb);
    uint16_t *s = lily_xmalloc(ng * 2), *b = lily_xmalloc(ng * 2);
    for (size_t i = 0; i < wb; i++)
        q[i] = (uint8_t)rnd();
    for (size_t i = 0; i < ng; i++)
        s[i] = lily_f32_to_bf16(0.01f), b[i] = lily_f32_to_bf16(-0.08f);
    W.w = q, W.scales = s, W.biases = b;
    float *X = lily_xaligned((size_t)n * cols * 4), *Y = lily_xaligned((size_t)n * rows * 4);
    for (size_t i = 0; i < (size_t)n * cols; i++)
        X[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    const struct {
        const char *name;
        lily_cpu_isa isa;
        lily_precision p;
    } sets[] = {{"vnni int16", LILY_CPU_ISA_AVX512, LILY_PRECISION_DEFAULT},
                {"vnni int8", LILY_CPU_ISA_AVX512, LILY_PRECISION_FAST},
                {"avx512 fp32", LILY_CPU_ISA_AVX512, LILY_PRECISION_EXACT},
                {"avx2 int16", LILY_CPU_ISA_AVX2, LILY_PRECISION_DEFAULT},
                {"avx2 int8", LILY_CPU_ISA_AVX2, LILY_PRECISION_FAST},
                {"avx2 fp32", LILY_CPU_ISA_AVX2, LILY_PRECISION_EXACT},
                {"scalar fp32", LILY_CPU_ISA_SCALAR, LILY_PRECISION_EXACT}};
    enum { NS = sizeof sets / sizeof sets[0] };
    double t[NS][64];
    /* calls per sample: about 20 ms of the fastest kernel, at least 1 */
    const int reps = (int)(2e7 / ((double)wb * n / 4 + 1)) + 1;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < NS; k++) {
            const lily_cpu_kern kern = lily_cpu_kern_for(sets[k].isa, sets[k].p);
            const int nr = sets[k].isa == LILY_CPU_ISA_SCALAR ? (reps + 9) / 10 : reps;
            lily_cpu_matmul(&kern, &W, X, n, cols, Y, rows, NULL); /* warm */
            const double t0 = cpu_now();
            for (int i = 0; i < nr; i++)
                lily_cpu_matmul(&kern, &W, X, n, cols, Y, rows, NULL);
            t[k][r] = (cpu_now() - t0) / nr;
        }
    printf("# Q4 %d x %d (%.2f MB of weights), n = %d, 1 thread, %d rounds alternated\n", rows,
           cols, wb / 1e6, n, rounds);
    printf("%-12s %-12s %12s %12s %10s\n", "set", "kernels", "best us", "median us", "GB/s");
    for (int k = 0; k < NS; k++) {
        const lily_cpu_kern kern = lily_cpu_kern_for(sets[k].isa, sets[k].p);
        qsort(t[k], (size_t)rounds, sizeof(double), cmp_d);
        printf("%-12s %-12s %12.1f %12.1f %10.2f\n", sets[k].name, lily_cpu_kern_name(&kern),
               t[k][0] * 1e6, t[k][rounds / 2] * 1e6, wb / t[k][0] / 1e9);
    }
    free(q), free(s), free(b), free(X), free(Y);
    return 0;
}
