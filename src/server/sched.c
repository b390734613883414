/* The inference thread and its bounded FIFO of jobs (api.md §10): first come, first served,
 * one job at a time (batch 1). A request is admitted (lily_sched_admit) before any work on it:
 * the admitted requests (being prepared or queued) never exceed the queue's size, and a full
 * queue is answered with 503 by the caller. */
#include <stdio.h>
#include <stdlib.h>

#include "base/err.h"
#include "server/srv.h"

static void set_depth(lily_srv *s, int busy) {
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.queue_depth = s->q_len;
    if (busy >= 0) s->metrics.busy = busy;
    pthread_mutex_unlock(&s->metrics.mu);
}

static void *worker(void *arg) {
    lily_srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (!s->q_len && !s->stopping)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (!s->q_len && s->stopping) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        lily_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        s->admitted--;
        set_depth(s, 1);
        pthread_mutex_unlock(&s->qmu);

        pthread_mutex_lock(&j->mu);
        int skip = lily_job_cancelled(j) || s->stopping;
        j->state = skip ? JOB_DONE : JOB_RUNNING;
        if (skip) {
            j->status = 503;
            pthread_cond_broadcast(&j->cv);
            lily_job_wake(j);
        }
        pthread_mutex_unlock(&j->mu);
        if (!skip) lily_job_run(s, j);
        lily_job_release(j);
        set_depth(s, 0);
    }
    return NULL;
}

int lily_sched_start(lily_srv *s, lily_err *e) {
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    s->q_cap = s->opts.queue > 0 ? s->opts.queue : 64;
    s->queue = lily_xcalloc((size_t)s->q_cap, sizeof *s->queue);
    if (pthread_create(&s->worker, NULL, worker, s)) return lily_fail(e, "cannot start thread");
    return 0;
}

void lily_sched_stop(lily_srv *s) {
    pthread_mutex_lock(&s->qmu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->worker, NULL);
    free(s->queue);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
}

int lily_sched_admit(lily_srv *s) {
    pthread_mutex_lock(&s->qmu);
    int ok = s->admitted < s->q_cap && !s->stopping;
    s->admitted += ok;
    pthread_mutex_unlock(&s->qmu);
    return ok ? 0 : -1;
}

void lily_sched_unadmit(lily_srv *s) {
    pthread_mutex_lock(&s->qmu);
    s->admitted--;
    pthread_mutex_unlock(&s->qmu);
}

int lily_sched_submit(lily_srv *s, lily_job *j) {
    pthread_mutex_lock(&s->qmu);
    if (s->q_len == s->q_cap || s->stopping) {
        pthread_mutex_unlock(&s->qmu);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    s->queue[(s->q_head + s->q_len) % s->q_cap] = j;
    s->q_len++;
    set_depth(s, -1);
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}
