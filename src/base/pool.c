/* Spin-then-sleep thread pool; see pool.h. */
#include "base/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <unistd.h>

#include "base/err.h"

#define LILY_POOL_SPIN 200000

struct lily_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;   /* bumped once per job */
    atomic_int next;   /* next task index */
    atomic_int active; /* workers still inside the current job */
    atomic_int stop;
    void **scratch;     /* [n_threads + 1] */
    size_t *scratch_cap;
    lily_task_fn fn;
    void *ctx;
    int n;
};

typedef struct {
    lily_pool *p;
    int id;
} lily_pool_arg;

static void pool_work(lily_pool *p, int id) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n) break;
        p->fn(p->ctx, t, id);
    }
}

static void *pool_main(void *arg) {
    lily_pool_arg a = *(lily_pool_arg *)arg;
    free(arg);
    lily_pool *p = a.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < LILY_POOL_SPIN) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        pool_work(p, a.id);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
    }
}

lily_pool *lily_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    lily_pool *p = lily_xcalloc(1, sizeof *p);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = lily_xcalloc((size_t)n_threads, sizeof(pthread_t));
    p->scratch = lily_xcalloc((size_t)n_threads + 1, sizeof(void *));
    p->scratch_cap = lily_xcalloc((size_t)n_threads + 1, sizeof(size_t));
    for (int i = 1; i < n_threads; i++) {
        lily_pool_arg *a = lily_xmalloc(sizeof *a);
        a->p = p;
        a->id = i;
        if (pthread_create(&p->threads[i], NULL, pool_main, a) != 0)
            lily_abort(__FILE__, __LINE__, "cannot create worker thread");
    }
    return p;
}

void lily_pool_free(lily_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int i = 0; i <= p->n_threads; i++) free(p->scratch[i]);
    free(p->scratch);
    free(p->scratch_cap);
    free(p->threads);
    free(p);
}

int lily_pool_threads(const lily_pool *p) { return p->n_threads; }

void lily_pool_run(lily_pool *p, lily_task_fn fn, void *ctx, int n) {
    if (n <= 0) return;
    if (p->n_threads == 1 || n == 1) {
        for (int t = 0; t < n; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, 0);
    while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}

void *lily_pool_scratch(lily_pool *p, int slot, size_t bytes) {
    LILY_ASSERT(slot >= 0 && slot <= p->n_threads);
    if (p->scratch_cap[slot] < bytes) {
        free(p->scratch[slot]);
        p->scratch[slot] = lily_xaligned(bytes);
        p->scratch_cap[slot] = bytes;
    }
    return p->scratch[slot];
}
