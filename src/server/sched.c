/* The inference thread and its bounded FIFO of jobs (api.md §10): continuous batching over the
 * generator's slots. A request is admitted (lily_sched_admit) before any work on it: the admitted
 * requests (being prepared or queued) never exceed the queue's size, and a full queue is
 * answered with 503 by the caller; so at most slots + queue requests are in the server.
 *
 * Each turn of the loop: jobs from the head of the FIFO take the idle slots (first come, first
 * served); then prefill chunks of the slots still prefilling, fewest tokens left first, up to
 * prefill_chunk tokens in all (the first chunk always runs: a chunk is at most that size), so a
 * long prompt holds up the others' decoding by one chunk at most; then one decode step takes a token from
 * every decoding slot (lily_gen_step: one lily_session_decode_rows call for the slots that draw
 * on the host); the slots whose runs ended finish their answers and take the next jobs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"
#include "server/srv.h"

typedef struct sched {
    lily_srv *s;
    lily_run *run[LILY_MAX_ROWS]; /* the job on each slot, or NULL */
    double t0[LILY_MAX_ROWS];     /* when it started there */
    int order[LILY_MAX_ROWS];     /* busy slots, oldest job first */
    int n_busy;
} sched;

static void set_depth(lily_srv *s) {
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.queue_depth = s->q_len;
    pthread_mutex_unlock(&s->metrics.mu);
}

/* A job taken from the FIFO: started on an idle slot, or answered 503 when it was cancelled or
 * the server is stopping. */
static void start(sched *c, lily_job *j) {
    lily_srv *s = c->s;
    pthread_mutex_lock(&j->mu);
    const int skip = lily_job_cancelled(j) || s->stopping;
    j->state = skip ? JOB_DONE : JOB_RUNNING;
    j->t_started = lily_now();
    if (skip) {
        j->status = 503;
        pthread_cond_broadcast(&j->cv);
        lily_job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
    lily_metrics *m = &s->metrics;
    pthread_mutex_lock(&m->mu);
    m->queued++;
    m->queue_s += j->t_started - j->t_queued;
    pthread_mutex_unlock(&m->mu);
    if (skip) {
        lily_job_release(j);
        return;
    }
    const int slot = lily_gen_pick(s->gen, j->prompt, j->n_prompt);
    c->run[slot] = lily_job_begin(s, j, slot);
    c->t0[slot] = j->t_started;
    c->order[c->n_busy++] = slot;
    pthread_mutex_lock(&m->mu);
    m->busy = c->n_busy;
    m->slot[slot].busy = 1;
    m->slot[slot].requests++;
    m->slot[slot].tps = 0;
    pthread_mutex_unlock(&m->mu);
}

/* Prefill chunks within the step's token budget, for the slot with the fewest prompt tokens
 * left first (oldest first among equals): a short prompt arriving behind a long one gets its
 * first token after a chunk or two, not after the long prefill. */
static void prefill(sched *c) {
    lily_gen *g = c->s->gen;
    int spent = 0;
    for (;;) {
        int best = -1, best_left = 0;
        for (int k = 0; k < c->n_busy; k++) {
            const int left = lily_gen_prefill_left(g, c->order[k]);
            if (left > 0 && (best < 0 || left < best_left)) best = c->order[k], best_left = left;
        }
        if (best < 0) return;
        const int next = lily_gen_prefill_next(g, best);
        if (spent && spent + next > c->s->prefill_chunk) return;
        spent += lily_gen_prefill(g, best);
        if (spent >= c->s->prefill_chunk) return;
    }
}

/* One decode step over the decoding slots. */
static void step(sched *c) {
    lily_srv *s = c->s;
    int rows[LILY_MAX_ROWS], n = 0;
    for (int k = 0; k < c->n_busy; k++)
        if (lily_gen_slot_phase(s->gen, c->order[k]) == LILY_GEN_DECODE) rows[n++] = c->order[k];
    if (!n) return;
    const double t0 = lily_now();
    lily_gen_step(s->gen, rows, n);
    const double t1 = lily_now();
    lily_metrics *m = &s->metrics;
    pthread_mutex_lock(&m->mu);
    m->decode_steps++;
    m->decode_rows += (uint64_t)n;
    m->step_s += t1 - t0;
    for (int k = 0; k < n; k++) {
        const lily_run *u = c->run[rows[k]];
        const lily_job *j = u ? lily_run_job(u) : NULL;
        if (j && j->t_first > 0 && t1 > j->t_first)
            m->slot[rows[k]].tps = (lily_run_tokens(u) - 1) / (t1 - j->t_first);
    }
    pthread_mutex_unlock(&m->mu);
}

/* The slots whose runs ended: their answers finish and the slots are free. */
static void reap(sched *c) {
    lily_srv *s = c->s;
    for (int k = 0; k < c->n_busy; k++) {
        const int slot = c->order[k];
        if (lily_gen_slot_phase(s->gen, slot) != LILY_GEN_IDLE) continue;
        lily_run *u = c->run[slot];
        lily_job *j = lily_run_job(u);
        const int tokens = lily_run_tokens(u);
        lily_job_end(u);
        lily_job_release(j);
        c->run[slot] = NULL;
        memmove(&c->order[k], &c->order[k + 1], (size_t)(c->n_busy - k - 1) * sizeof *c->order);
        c->n_busy--;
        k--;
        lily_metrics *m = &s->metrics;
        pthread_mutex_lock(&m->mu);
        m->busy = c->n_busy;
        m->slot[slot].busy = 0;
        m->slot[slot].tokens += (uint64_t)tokens;
        m->slot[slot].busy_s += lily_now() - c->t0[slot];
        pthread_mutex_unlock(&m->mu);
    }
}

static void *worker(void *arg) {
    sched c = {.s = arg};
    lily_srv *s = c.s;
    for (;;) {
        lily_job *take[LILY_MAX_ROWS];
        int nt = 0;
        pthread_mutex_lock(&s->qmu);
        while (!c.n_busy && !s->q_len && !s->stopping)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (!c.n_busy && !s->q_len && s->stopping) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        while (s->q_len && c.n_busy + nt < s->slots) {
            take[nt++] = s->queue[s->q_head];
            s->q_head = (s->q_head + 1) % s->q_cap;
            s->q_len--;
            s->admitted--;
        }
        set_depth(s);
        pthread_mutex_unlock(&s->qmu);
        for (int i = 0; i < nt; i++)
            start(&c, take[i]);
        prefill(&c);
        step(&c);
        reap(&c);
    }
    return NULL;
}

int lily_sched_start(lily_srv *s, lily_err *e) {
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    s->q_cap = s->opts.queue > 0 ? s->opts.queue : 64;
    s->queue = lily_xcalloc((size_t)s->q_cap, sizeof *s->queue);
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.n_slots = s->slots;
    pthread_mutex_unlock(&s->metrics.mu);
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
    j->t_queued = lily_now();
    pthread_mutex_unlock(&j->mu);
    s->queue[(s->q_head + s->q_len) % s->q_cap] = j;
    s->q_len++;
    set_depth(s);
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}
