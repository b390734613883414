/* The CPU backend: the reference implementation of the backend contract (backend.h).
 *
 * A forward call runs one step of the program (backend/program.h, cpu/step.c): a chunk of n
 * tokens of one session (n = 1 is a decode step), or with forward_rows one token each of up to
 * LILY_ROWS_MAX sessions, each at its own position, the weights read once for all of them. The
 * residual stream and all activations are fp32; weights are applied in their stored format.
 * Scratch lives in the backend and is sized once at open (scratch.c), so steady-state steps
 * allocate nothing; per-session states are in state.c. Calls on one backend are serialised by a
 * mutex (the scratch is shared). */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"
#include "base/file.h"

static int cpu_open(const lily_model *m, const lily_engine_opts *opts, lily_backend **out,
                    lily_err *e) {
    if (opts->prefill_chunk < 1)
        return lily_fail(e, "prefill chunk of %d tokens", opts->prefill_chunk);
    lily_backend *b = lily_xcalloc(1, sizeof *b);
    b->m = m;
    b->pool = lily_pool_create(opts->n_threads);
    b->kern = lily_cpu_kern_for(opts->cpu_isa, opts->precision);
    b->chunk = opts->prefill_chunk;
    pthread_mutex_init(&b->mu, NULL);
    /* Weights are read in place from the mapping. When they fit comfortably in memory, map every
     * page now: otherwise each expert's first use costs thousands of page faults, which
     * dominates decode for the first few hundred tokens. */
    unsigned long long ram = lily_phys_mem();
    void (*progress)(void *, uint64_t, uint64_t) = opts ? opts->progress : NULL;
    void *pud = opts ? opts->progress_ud : NULL;
    if (ram && m->weight_bytes < ram / 10 * 9) {
        lily_model_prefault(m, progress, pud);
    } else if (progress) { /* mapped, read on first use: nothing to wait for */
        uint64_t total = lily_model_file_bytes(m);
        progress(pud, total, total);
    }
    lily_program_build(m, &b->prog);
    cpu_scratch_alloc(b);
    *out = b;
    return 0;
}

static void cpu_close(lily_backend *b) {
    if (!b) return;
    lily_pool_free(b->pool);
    pthread_mutex_destroy(&b->mu);
    cpu_scratch_free(b);
    lily_program_free(&b->prog);
    free(b);
}

static int cpu_forward(lily_backend *b, lily_bstate *s, const int32_t *tokens, int n, int pos,
                       float *logits, int all_logits, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (n < 1 || n > b->chunk)
        return lily_fail(e, "forward of %d tokens (chunk limit %d)", n, b->chunk);
    if (pos < 0 || pos + n > s->max_ctx)
        return lily_fail(e, "context overflow: %d + %d tokens exceed the context of %d", pos, n,
                         s->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[t], c->vocab);
    /* one token is a row step of one row: the decode path is the row path */
    cpu_step st = {.n = n, .rows = n == 1, .tokens = tokens};
    st.s[0] = s;
    st.pos[0] = pos;
    st.logits = logits;
    st.all_logits = all_logits;
    st.row_logits = &logits;
    pthread_mutex_lock(&b->mu);
    cpu_step_run(b, &st);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static int cpu_forward_rows(lily_backend *b, lily_bstate *const *s, const int32_t *tokens,
                            const int *pos, int n, float *const *logits, lily_err *e) {
    const lily_config *c = &b->m->cfg;
    if (n < 1 || n > LILY_ROWS_MAX)
        return lily_fail(e, "a step of %d rows (1 to %d)", n, LILY_ROWS_MAX);
    cpu_step st = {.n = n, .rows = 1, .tokens = tokens, .row_logits = logits};
    for (int i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] + 1 > s[i]->max_ctx)
            return lily_fail(e, "context overflow: row %d at %d exceeds the context of %d", i,
                             pos[i], s[i]->max_ctx);
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return lily_fail(e, "token id %d out of range [0, %d)", tokens[i], c->vocab);
        for (int j = 0; j < i; j++)
            if (s[j] == s[i]) return lily_fail(e, "rows %d and %d share a state", j, i);
        st.s[i] = s[i];
        st.pos[i] = pos[i];
    }
    pthread_mutex_lock(&b->mu);
    cpu_step_run(b, &st);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static const lily_program *cpu_program(lily_backend *b) {
    return &b->prog;
}

static void cpu_set_profile(lily_backend *b, double *ms) {
    pthread_mutex_lock(&b->mu);
    b->prof = ms;
    pthread_mutex_unlock(&b->mu);
}

/* The draw ops (backend.h) on the CPU: a step runs at once and its draw (lily_draw_pick, the
 * device sampler's reference) waits in the state's ring until draw_next reads it. */
static int cpu_draw_enqueue(lily_backend *b, lily_bstate *s, int32_t token, int pos,
                            const lily_draw *d, lily_err *e) {
    const int V = b->m->cfg.vocab;
    if (!s->dq) s->dq = lily_cpu_drawq_create(V);
    lily_cpu_drawq *q = s->dq;
    if (q->unread >= LILY_DRAW_AHEAD)
        return lily_fail(e, "%d draws are already waiting to be read", q->unread);
    if (lily_draw_mask_check(d, V, q->unread, e)) return -1; /* the mask is used at once */
    /* token < 0: the previous draw, clamped as the device clamps a failed one (reported when it
     * is read) */
    const int32_t t = token >= 0 ? token : q->last >= 0 ? q->last : 0;
    if (cpu_forward(b, s, &t, 1, pos, q->logits, 0, e)) return -1;
    q->last = lily_draw_pick(q->logits, V, d, q->scr);
    q->ring[(q->head + q->unread) % LILY_DRAW_AHEAD] = q->last;
    q->unread++;
    return 0;
}

/* Rows: one forward_rows step, then each row's draw as cpu_draw_enqueue makes it. */
static int cpu_draw_enqueue_rows(lily_backend *b, lily_bstate *const *s, const int32_t *tokens,
                                 const int *pos, int n, const lily_draw *d, lily_err *e) {
    const int V = b->m->cfg.vocab;
    if (n < 1 || n > LILY_ROWS_MAX)
        return lily_fail(e, "a step of %d rows (1 to %d)", n, LILY_ROWS_MAX);
    int32_t t[LILY_ROWS_MAX];
    float *lg[LILY_ROWS_MAX];
    for (int i = 0; i < n; i++) {
        if (!s[i]->dq) s[i]->dq = lily_cpu_drawq_create(V);
        const lily_cpu_drawq *q = s[i]->dq;
        if (q->unread >= LILY_DRAW_AHEAD)
            return lily_fail(e, "%d draws are already waiting to be read", q->unread);
        if (d[i].allow) return lily_fail(e, "a rows draw with a mask (row %d)", i);
        t[i] = tokens[i] >= 0 ? tokens[i] : q->last >= 0 ? q->last : 0;
        lg[i] = q->logits;
    }
    if (cpu_forward_rows(b, s, t, pos, n, lg, e)) return -1;
    for (int i = 0; i < n; i++) {
        lily_cpu_drawq *q = s[i]->dq;
        q->last = lily_draw_pick(q->logits, V, &d[i], q->scr);
        q->ring[(q->head + q->unread) % LILY_DRAW_AHEAD] = q->last;
        q->unread++;
    }
    return 0;
}

static int cpu_draw_next(lily_backend *b, lily_bstate *s, int32_t *out, lily_err *e) {
    (void)b;
    lily_cpu_drawq *q = s->dq;
    if (!q || q->unread == 0) return lily_fail(e, "no draw is waiting to be read");
    *out = q->ring[q->head];
    q->head = (q->head + 1) % LILY_DRAW_AHEAD;
    q->unread--;
    return 0;
}

static void cpu_draw_discard(lily_backend *b, lily_bstate *s) {
    (void)b;
    if (s->dq) s->dq->unread = 0;
}

/* Prefill chunk: the CPU is compute-bound per token, so a larger chunk gains little and 512
 * keeps the scratch small. The draw ops serve LILY_SAMPLE_ON_BACKEND (the GPU sampler's
 * reference, and how the pipelined generation path is tested without a GPU). */
const lily_backend_ops lily_backend_cpu = {
    .name = "cpu",
    .prefill_chunk = 512,
    .draws_by_default = 0,
    .open = cpu_open,
    .close = cpu_close,
    .state_create = cpu_state_create,
    .state_free = cpu_state_free,
    .state_reset = cpu_state_reset,
    .state_copy = cpu_state_copy,
    .state_bytes = cpu_state_bytes,
    .forward = cpu_forward,
    .forward_rows = cpu_forward_rows,
    .program = cpu_program,
    .set_profile = cpu_set_profile,
    .draw_enqueue = cpu_draw_enqueue,
    .draw_next = cpu_draw_next,
    .draw_discard = cpu_draw_discard,
    .draw_enqueue_rows = cpu_draw_enqueue_rows,
};
