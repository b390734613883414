/* Read bandwidth of this machine's memory from N threads (the ceiling for CPU decode, which reads
 * every active weight once per token). Each thread sums its own half-open slice of a buffer far
 * larger than the caches; the figure is bytes read / wall time, best of the rounds.
 *
 *   cc -O3 -march=native -pthread bench/cpu_read_bw.c -o /tmp/cpu_read_bw
 *   /tmp/cpu_read_bw [threads=2] [GiB=2] [rounds=5]
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} slice;

static void *read_slice(void *arg) {
    slice *s = arg;
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= s->n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += s->p[i + k];
    for (int k = 0; k < 8; k++)
        s->sum += a[k];
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 3 ? atoi(argv[3]) : 5;
    double gib = argc > 2 ? atof(argv[2]) : 2.0;
    if (threads < 1 || threads > 256 || rounds < 1 || !(gib > 0)) {
        fprintf(stderr, "usage: %s [threads] [GiB] [rounds]\n", argv[0]);
        return 2;
    }
    size_t words = (size_t)(gib * (1 << 27)), per = words / (size_t)threads / 8 * 8;
    uint64_t *buf = aligned_alloc(64, words * 8);
    if (!buf) {
        fprintf(stderr, "cannot allocate %.1f GiB\n", gib);
        return 1;
    }
    memset(buf, 1, words * 8); /* touch every page before timing */
    slice *s = calloc((size_t)threads, sizeof *s);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double best = 0;
    uint64_t check = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < threads; i++) {
            s[i] = (slice){buf + (size_t)i * per, per, 0};
            pthread_create(&th[i], NULL, read_slice, &s[i]);
        }
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            check += s[i].sum;
        }
        double gbs = (double)per * (size_t)threads * 8 / (now() - t0) / 1e9;
        printf("round %d: %.1f GB/s\n", r + 1, gbs);
        if (gbs > best) best = gbs;
    }
    printf("best of %d: %.1f GB/s read, %d threads (checksum %llu)\n", rounds, best, threads,
           (unsigned long long)check);
    free(s);
    free(th);
    free(buf);
    return 0;
}
