/* Spin-then-sleep thread pool; see pool.h.
 *
 * A job lives on the caller's stack and is published through p->job. Workers claim tasks from the
 * job's atomic counter and count finished tasks; the caller returns once every task is done, so a
 * worker that the OS has descheduled never holds the caller up (on an oversubscribed machine that
 * would cost a time slice per job). The only thing the caller must wait for is a worker that has
 * the job's address in hand: each worker announces it in a hazard slot and re-checks that the job
 * is still published before touching it; after unpublishing, the caller waits for the slots that
 * still name its job. */
#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/err.h"

/* A worker between jobs first spins (a decode step issues its jobs microseconds apart), then
 * yields the core (other processes may need it), then sleeps on the condition variable. */
#define LILY_POOL_SPIN  4096
#define LILY_POOL_YIELD 256

typedef struct pool_job {
    lily_task_fn fn;
    void *ctx;
    int n;
    atomic_int next; /* next task to claim */
    atomic_int done; /* tasks finished */
} pool_job;

struct lily_pool {
    int n_threads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;             /* bumped once per job */
    _Atomic(pool_job *) job;     /* the published job, or NULL */
    _Atomic(pool_job *) *hazard; /* [n_threads]: the job a worker is inside */
    atomic_int stop;
    void **scratch; /* [n_threads + 1] */
    size_t *scratch_cap;
};

typedef struct {
    lily_pool *p;
    int id;
} lily_pool_arg;

static void pool_work(pool_job *j, int id) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= j->n) break;
        j->fn(j->ctx, t, id);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
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
            if (spins < LILY_POOL_SPIN + LILY_POOL_YIELD) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        pool_job *j = atomic_load(&p->job);
        if (!j) continue;
        atomic_store(&p->hazard[a.id], j);
        if (atomic_load(&p->job) == j) pool_work(j, a.id);
        atomic_store(&p->hazard[a.id], NULL);
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
    p->hazard = lily_xcalloc((size_t)n_threads, sizeof *p->hazard);
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
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int i = 0; i <= p->n_threads; i++)
        free(p->scratch[i]);
    free(p->scratch);
    free(p->scratch_cap);
    free((void *)p->hazard);
    free(p->threads);
    free(p);
}

int lily_pool_threads(const lily_pool *p) {
    return p->n_threads;
}

static void relax(int spins) {
    if (spins < LILY_POOL_SPIN) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

void lily_pool_run(lily_pool *p, lily_task_fn fn, void *ctx, int n) {
    if (n <= 0) return;
    if (p->n_threads == 1 || n == 1) {
        for (int t = 0; t < n; t++)
            fn(ctx, t, 0);
        return;
    }
    pool_job j;
    j.fn = fn;
    j.ctx = ctx;
    j.n = n;
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store(&p->job, &j);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_work(&j, 0);
    for (int spins = 0; atomic_load_explicit(&j.done, memory_order_acquire) < n; spins++)
        relax(spins);
    atomic_store(&p->job, NULL);
    for (int i = 1; i < p->n_threads; i++)
        for (int spins = 0; atomic_load(&p->hazard[i]) == &j; spins++)
            relax(spins);
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
