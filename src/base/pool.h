/* A fixed thread pool for data-parallel loops.
 *
 * lily_pool_run splits n tasks over the workers and the calling thread; tasks are taken from a
 * shared atomic counter, so uneven tasks balance themselves without locks. Workers spin briefly
 * between jobs (a decode step issues hundreds of small jobs per token) and then sleep. */
#ifndef LILY_BASE_POOL_H
#define LILY_BASE_POOL_H

#include <stddef.h>

typedef struct lily_pool lily_pool;

/* fn(ctx, task, thread) is called once for each task in [0, n); thread is in [0, n_threads). */
typedef void (*lily_task_fn)(void *ctx, int task, int thread);

/* n_threads <= 0 means one per online core. Caller frees with lily_pool_free. */
lily_pool *lily_pool_create(int n_threads);
void lily_pool_free(lily_pool *p);
int lily_pool_threads(const lily_pool *p);
/* Runs all tasks and returns when every one has finished. Not reentrant. */
void lily_pool_run(lily_pool *p, lily_task_fn fn, void *ctx, int n);
/* Per-thread scratch owned by the pool: slot is a thread index, or n_threads for one extra
 * buffer that the calling thread may use around a run. Grows (64-byte aligned) to at least bytes
 * and keeps its contents' memory between calls, so steady-state use allocates nothing. */
void *lily_pool_scratch(lily_pool *p, int slot, size_t bytes);

#endif
