/* Token sampling: logits in, token id out.
 *
 * The chain, applied to a private copy of the logits (the caller's array is never modified):
 *   1. sanitise: NaN -> -inf (never chosen), +inf -> FLT_MAX (ties among them share the mass);
 *   2. penalties: repetition penalty over the last repeat_last_n tokens of the caller's history
 *      (llama.cpp/HF style: a positive logit is divided by the penalty, a negative one multiplied,
 *      once per distinct token), then presence/frequency penalties over the tokens passed to
 *      lily_sampler_accept (OpenAI style: logit -= presence*(count>0) + frequency*count);
 *   3. temperature <= 0: greedy argmax of the penalised logits (lowest id on ties), done;
 *   4. top-k (keep the k largest; ties broken by lower id);
 *   5. temperature (divide by T);
 *   6. top-p (keep the smallest prefix, in descending order, whose probability mass reaches p);
 *   7. min-p (keep tokens whose probability is >= min_p times the largest probability);
 *   8. draw one token from the renormalised survivors.
 * This is the order of llama.cpp's classic chain with temperature moved before top-p/min-p, so
 * that top-p and min-p see the distribution that is actually sampled. (Top-p and min-p each keep
 * a prefix of the descending order, so the code applies min-p first, as a linear pass, and then
 * finds the top-p boundary by a weighted quickselect against the full distribution's mass: the
 * same set, without sorting the vocabulary.)
 *
 * Randomness: xoshiro256** seeded with four outputs of splitmix64(seed). A non-greedy draw
 * consumes exactly one 64-bit output, so the same seed, parameters, logits and accept calls give
 * the same tokens (selection uses a total order: logit descending, then id ascending; only the C
 * library's expf could differ between builds, by an ulp). Greedy draws consume nothing.
 *
 * Log-probabilities for the API (lily_logprobs_top, lily_logprob) are the log-softmax of the RAW
 * logits (temperature 1, no penalties, no filters), as the OpenAI API reports them.
 *
 * Memory: all scratch is sized to the vocabulary at create time; sampling allocates nothing. */
#ifndef LILY_SAMPLER_SAMPLER_H
#define LILY_SAMPLER_SAMPLER_H

#include <stdint.h>

#include "lily.h"

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
    uint64_t seed;
} lily_sampler_params;

typedef struct lily_sampler lily_sampler;

/* temperature 1, top_k 0, top_p 1, min_p 0, repeat_penalty 1, repeat_last_n 64, presence and
 * frequency 0, seed 0: plain sampling from the softmax. */
lily_sampler_params lily_sampler_params_default(void);

int lily_sampler_create(const lily_sampler_params *p, int vocab, lily_sampler **out,
                        lily_err *err);
void lily_sampler_free(lily_sampler *s);

/* Draws a token from logits[vocab]. history holds the context tokens (prompt and generated, in
 * order) for the repetition penalty; it may be NULL when n_history is 0. Ids outside the
 * vocabulary in history are ignored. Returns the token id, or -1 (with a message) when no logit
 * is usable (all NaN or -inf). */
int32_t lily_sampler_sample(lily_sampler *s, const float *logits, const int32_t *history,
                            int n_history, lily_err *err);

/* Records a generated token for the presence/frequency penalties. Out-of-range ids are ignored. */
void lily_sampler_accept(lily_sampler *s, int32_t token);

/* Forgets the accepted tokens and reseeds the generator with the params' seed. */
void lily_sampler_reset(lily_sampler *s);

const lily_sampler_params *lily_sampler_get_params(const lily_sampler *s);

/* The n most likely tokens of the RAW logits (descending; ties: lower id first) with their
 * natural-log probabilities under softmax(logits). NaN and -inf logits are never listed. Returns
 * how many were written (min(n, number of usable logits)); 0 when none. No allocation. */
int lily_logprobs_top(const float *logits, int vocab, int n, int32_t *ids, float *lp);

/* log softmax(logits)[token] of the raw logits; -INFINITY for an unusable or out-of-range token. */
float lily_logprob(const float *logits, int vocab, int32_t token);

#endif
