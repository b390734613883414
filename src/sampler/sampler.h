/* Token sampling on the host: logits in, token id out, drawn exactly as the backend draws
 * (backend/draw.h: the device sampler's chain and its counter-based random numbers).
 *
 * The chain, applied to a private copy of the logits (the caller's array is never modified):
 *   1. logit_bias: each listed id's bias is added to its logit (-inf bans the id);
 *   2. penalties: repetition penalty over the last repeat_last_n tokens of the caller's history
 *      (llama.cpp/HF style: a positive logit is divided by the penalty, a negative one multiplied,
 *      once per distinct token), then presence/frequency penalties over the tokens passed to
 *      lily_sampler_accept (OpenAI style: logit -= presence*(count>0) + frequency*count);
 *   3. the draw chain (lily_draw_pick): NaN and -inf are never drawn, +inf counts as FLT_MAX,
 *      ids >= n_ids are never drawn; temperature <= 0: the argmax (lowest id on ties); else
 *      top-k, temperature, top-p, min-p, and one token from the survivors' softmax.
 * Without bias and penalties the copy is skipped: the draw reads the caller's logits.
 *
 * Randomness: none is kept. The random numbers of a draw are a function of (seed, step, id)
 * (backend/draw_rng.h), and the caller passes the step: the index of the token in its generation
 * (the first generated token is step 0). The backend draws with the same numbers
 * (lily_session_draw_enqueue with lily_sampler_as_draw's lily_draw at the same step), so a seeded
 * request gives the same tokens whether they are drawn on the backend or here.
 *
 * Log-probabilities for the API (lily_sampler_logprobs, lily_logprobs_top, lily_logprob) are the
 * log-softmax of the logits without penalties, temperature or filters (after logit_bias and
 * n_ids in lily_sampler_logprobs), as the OpenAI API reports them.
 *
 * Memory: all scratch is sized to the vocabulary at create time; sampling allocates nothing. */
#ifndef LILY_SAMPLER_SAMPLER_H
#define LILY_SAMPLER_SAMPLER_H

#include <stdint.h>

#include "lily.h"

/* A bias added to one token's logit before the draw (OpenAI's logit_bias). */
typedef struct lily_logit_bias {
    int32_t id;
    float bias; /* finite, or -inf: never draw id */
} lily_logit_bias;

/* Zero-initialised params mean greedy with every filter and penalty off. */
typedef struct lily_sampler_params {
    float temperature;       /* <= 0: greedy. Must not be negative-infinite or NaN. */
    int top_k;               /* <= 0: off */
    float top_p;             /* off unless 0 < top_p < 1 */
    float min_p;             /* off unless 0 < min_p; >= 1 keeps only the top tokens */
    float repeat_penalty;    /* off when 0 or 1; must be >= 0 */
    int repeat_last_n;       /* window over the caller's history; <= 0: all of it */
    float presence_penalty;  /* 0: off; may be negative (encourages repetition) */
    float frequency_penalty; /* 0: off; may be negative */
    uint64_t seed;           /* with the step: the random numbers of a draw */
    int n_ids;               /* ids >= n_ids are never drawn (padding rows); <= 0: none excluded */
    const lily_logit_bias *bias; /* n_bias entries, copied at create; ids out of range ignored */
    int n_bias;
} lily_sampler_params;

typedef struct lily_sampler lily_sampler;

/* temperature 1, top_k 0, top_p 1, min_p 0, repeat_penalty 1, repeat_last_n 64, presence and
 * frequency 0, seed 0, no bias: plain sampling from the softmax. */
lily_sampler_params lily_sampler_params_default(void);

/* Checks the parameters (a message names the bad one) and allocates the scratch. */
int lily_sampler_create(const lily_sampler_params *p, int vocab, lily_sampler **out, lily_err *err);
void lily_sampler_free(lily_sampler *s);

/* Draws the token at step from logits[vocab]. history holds the context tokens (prompt and
 * generated, in order) for the repetition penalty; it may be NULL when n_history is 0. Ids
 * outside the vocabulary in history are ignored. Returns the token id, or -1 (with a message)
 * when no logit is usable (all NaN, -inf, banned or excluded). */
int32_t lily_sampler_sample(lily_sampler *s, const float *logits, const int32_t *history,
                            int n_history, uint64_t step, lily_err *err);

/* Records a generated token for the presence/frequency penalties. Out-of-range ids are ignored. */
void lily_sampler_accept(lily_sampler *s, int32_t token);

/* Forgets the accepted tokens. */
void lily_sampler_reset(lily_sampler *s);

const lily_sampler_params *lily_sampler_get_params(const lily_sampler *s);

/* The draw the backend makes for this sampler (lily_session_draw_enqueue; step 0: the caller
 * sets it): 0 when the backend's chain is the whole of this sampler's, i.e. no penalty can act
 * and the only bias is one banned id (ban_id); -1 when the draws need the host. */
int lily_sampler_as_draw(const lily_sampler *s, lily_draw *d);

/* The log-probability of token and the n most likely tokens (descending; ties: lower id first)
 * under the log-softmax of logits after logit_bias and n_ids (no penalties, temperature 1, no
 * filters), as the API reports them. *n_top receives how many were written to ids / lp. Returns
 * token's log-probability (-INFINITY when it cannot be drawn). No allocation. */
float lily_sampler_logprobs(lily_sampler *s, const float *logits, int32_t token, int n,
                            int32_t *ids, float *lp, int *n_top);

/* The n most likely tokens of the RAW logits (descending; ties: lower id first) with their
 * natural-log probabilities under softmax(logits). NaN and -inf logits are never listed. Returns
 * how many were written (min(n, number of usable logits)); 0 when none. No allocation. */
int lily_logprobs_top(const float *logits, int vocab, int n, int32_t *ids, float *lp);

/* log softmax(logits)[token] of the raw logits; -INFINITY for an unusable or out-of-range token. */
float lily_logprob(const float *logits, int vocab, int32_t token);

#endif
