/* The backend contract: a backend executes whole steps of the model.
 *
 * The engine hands a backend the bound model once (open) and then asks it to run whole steps:
 * one prefill chunk or one decode step per call (forward), over a per-session state object that
 * the backend owns (KV caches, GDN conv and recurrent states, scratch). A GPU backend keeps all of
 * it on the device; only token ids go in and logits come out. Snapshots of a session are states
 * too, cloned and copied by the backend (device-to-device on a GPU).
 *
 * The CPU backend (src/backend/cpu) is the reference implementation of this contract. */
#ifndef LILY_BACKEND_BACKEND_H
#define LILY_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "backend/program.h"
#include "model/model.h"

typedef struct lily_backend lily_backend; /* one per engine, backend-defined */
typedef struct lily_bstate lily_bstate;   /* one per session or snapshot, backend-defined */

typedef struct lily_backend_ops {
    const char *name; /* "cpu", "cuda" */
    /* Tokens per prefill step when the engine's options leave it 0: the engine fills
     * opts.prefill_chunk with it before open, so open always sees a chunk > 0. */
    int prefill_chunk;
    /* Non-zero: with LILY_SAMPLE_ON_AUTO the engine uses the draw ops (when there are any). */
    int draws_by_default;

    /* Prepares the backend for model m (borrowed; outlives the backend): uploads or repacks
     * weights, creates thread pools or streams. opts->prefill_chunk > 0, and opts->precision
     * and opts->cpu_isa hold values of their enums (the engine checks them). */
    int (*open)(const lily_model *m, const lily_engine_opts *opts, lily_backend **out, lily_err *e);
    void (*close)(lily_backend *b);

    /* A state with KV room for max_ctx positions, empty (position 0). */
    int (*state_create)(lily_backend *b, int max_ctx, lily_bstate **out, lily_err *e);
    void (*state_free)(lily_backend *b, lily_bstate *s);
    /* Back to position 0 (zeroes the recurrent and conv states). */
    void (*state_reset)(lily_backend *b, lily_bstate *s);
    /* Copies the first pos positions of src (KV) and all of its recurrent/conv state into dst,
     * which must have max_ctx >= pos. Used for snapshot and restore. */
    int (*state_copy)(lily_backend *b, lily_bstate *dst, const lily_bstate *src, int pos,
                      lily_err *e);
    /* Bytes a state of max_ctx positions holds. */
    size_t (*state_bytes)(lily_backend *b, int max_ctx);

    /* Runs tokens[0..n) at positions pos..pos+n-1, updating s. n is at most the prefill chunk the
     * engine was opened with. logits receives [n][V] floats when all_logits, else the [V] logits
     * of the last token. */
    int (*forward)(lily_backend *b, lily_bstate *s, const int32_t *tokens, int n, int pos,
                   float *logits, int all_logits, lily_err *e);

    /* Optional (NULL: the engine loops over forward): one decode step of n rows (1 <= n <=
     * LILY_MAX_ROWS), row i consuming tokens[i] at position pos[i] of its own state s[i] (the
     * states are distinct) and writing its [V] logits to logits[i]. Each row's logits are bit for
     * bit those forward gives for that state alone. */
    int (*forward_rows)(lily_backend *b, lily_bstate *const *s, const int32_t *tokens,
                        const int *pos, int n, float *const *logits, lily_err *e);

    /* Optional (NULL: the engine loops over forward): n greedy decode steps without the host in
     * the loop. Step i consumes token (i == 0) or out[i-1] at position pos + i and writes the
     * argmax of its logits (lowest index on ties) to out[i]; logits, when not NULL, receives the
     * [V] logits of the last step. */
    int (*decode_greedy)(lily_backend *b, lily_bstate *s, int32_t token, int pos, int n,
                         int32_t *out, float *logits, lily_err *e);

    /* Optional, all three or none (NULL: the engine samples on the host). The engine calls them
     * when opts.sample_on is LILY_SAMPLE_ON_BACKEND, or LILY_SAMPLE_ON_AUTO and draws_by_default
     * is set. draw_enqueue enqueues
     * one decode step at pos that consumes token, or when token < 0 the token s's previous
     * draw_enqueue drew (still on the device), leaves its logits on the device and draws the next
     * token from them under d (lily.h), without waiting for any of it. draw_next waits for the
     * oldest draw of s not yet read and gives it (-1: nothing was drawable). At most
     * LILY_DRAW_AHEAD draws of s are unread at a time. A step with a mask (d->allow) draws only
     * the ids it allows, as if the others' logits were -inf; the backend copies the mask during
     * the call, and refuses it while a draw of s is unread (lily_draw_mask_check). draw_discard
     * waits for s's enqueued steps and drops their unread draws. */
    int (*draw_enqueue)(lily_backend *b, lily_bstate *s, int32_t token, int pos, const lily_draw *d,
                        lily_err *e);
    int (*draw_next)(lily_backend *b, lily_bstate *s, int32_t *out, lily_err *e);
    void (*draw_discard)(lily_backend *b, lily_bstate *s);
    /* Optional (NULL: the engine loops over draw_enqueue; needs the three above): draw_enqueue
     * for n rows (1 <= n <= LILY_MAX_ROWS) in one step, as forward_rows is forward for n rows:
     * row i consumes tokens[i] (or, when < 0, s[i]'s previous draw) at pos[i] of its own state
     * s[i] (distinct) and draws under d[i], which carries no mask (masked steps go one at a
     * time). Each row's draw is the one draw_enqueue would make for that state alone; the draws
     * are read with draw_next per state. */
    int (*draw_enqueue_rows)(lily_backend *b, lily_bstate *const *s, const int32_t *tokens,
                             const int *pos, int n, const lily_draw *d, lily_err *e);

    /* Optional (NULL: not run from a program): the step program the backend runs
     * (backend/program.h), built at open. */
    const lily_program *(*program)(lily_backend *b);
    /* Optional: with ms not NULL, every later step adds each op's time in milliseconds to
     * ms[op] ([the program's n_ops]); NULL stops it. For profiling (lily bench --profile). */
    void (*set_profile)(lily_backend *b, double *ms);

    /* The device's name (the GPU's) into buf; NULL for the CPU backends (the engine reads the
     * CPU's model name itself). */
    void (*device_name)(lily_backend *b, char *buf, size_t len);
    /* Optional (NULL: no device of its own): the bytes of the device's memory in use now, as its
     * driver reports them (weights, states and the backend's scratch, plus any other process's);
     * 0 when it cannot tell. */
    size_t (*device_used)(lily_backend *b);
} lily_backend_ops;

extern const lily_backend_ops lily_backend_cpu;
#ifdef LILY_HAVE_CUDA
extern const lily_backend_ops lily_backend_cuda;
#endif

/* The ops table for kind, or NULL with a message when that backend is not built in. */
const lily_backend_ops *lily_backend_get(lily_backend_kind kind, lily_err *e);

#endif
