/* Generation over engine sessions with prefix reuse: the part of a request that runs on the
 * inference thread, shared by `lily serve`, `lily chat` and `lily run`.
 *
 * A lily_gen owns one or more slots (a session each, with the token history it has consumed) and
 * one prefix cache of snapshots that all slots share. A run on a slot resumes from the longest
 * reusable prefix (the slot's live session when its history is a prefix of the new prompt, else
 * the longest cached snapshot, whichever slot took it), prefills the rest in pieces that end at
 * message boundaries (snapshots are taken there: after the system prompt, at the start of the
 * last two messages, and at the end of the prompt), then samples and decodes until an
 * end-of-turn token, a stop string, the token budget, the callback, or cancellation. Decoded text
 * is passed through the streaming detokenizer (no broken UTF-8) and the stop-string holdback
 * before it reaches the caller.
 *
 * A run is a state machine: lily_gen_begin, then lily_gen_prefill calls (one piece or chunk
 * each) while the slot is in LILY_GEN_PREFILL, then lily_gen_step calls while it is in
 * LILY_GEN_DECODE; it ends back in LILY_GEN_IDLE with the result filled. lily_gen_step takes one
 * token from every decoding slot it is given, and the slots that draw on the host consume theirs
 * in one lily_session_decode_rows call; a slot that draws on the backend (CUDA) keeps its own
 * pipelined draws and is stepped in turn. lily_gen_run is that loop for one request on slot 0.
 * Not thread-safe: one thread drives a lily_gen and all its slots. */
#ifndef LILY_GEN_GEN_H
#define LILY_GEN_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/matcher.h"
#include "lily.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define LILY_GEN_MAX_TOP 20

typedef struct lily_gen lily_gen;

/* The context of a lily_gen whose options leave it 0: a chat's working size, far below the 262,144
 * positions of the Qwen3.5/3.6 models (a session's K/V cache is sized to its context). */
#define LILY_GEN_DEFAULT_CTX 32768

typedef struct lily_gen_opts {
    int max_ctx;        /* session context (0: LILY_GEN_DEFAULT_CTX); at most the model's */
    size_t cache_bytes; /* snapshot budget of the prefix cache (0 = no cache) */
    int slots;          /* sessions (concurrent runs), 1..LILY_MAX_ROWS; 0 = 1 */
    int prefill_chunk;  /* prompt tokens per lily_gen_prefill call at most; 0 = a whole piece */
} lily_gen_opts;

typedef enum { LILY_GEN_IDLE, LILY_GEN_PREFILL, LILY_GEN_DECODE } lily_gen_phase;

/* Information about one sampled token. */
typedef struct lily_gen_token {
    int32_t id;
    int forced;    /* inserted by the force callback, not sampled */
    float logprob; /* log-softmax of the raw logits (after logit_bias); 0 unless the request
                      asked for logprobs */
    int n_top;     /* entries in top_* (the request's top_logprobs) */
    int32_t top_ids[LILY_GEN_MAX_TOP];
    float top_lp[LILY_GEN_MAX_TOP];
} lily_gen_token;

typedef struct lily_gen_req {
    const int32_t *prompt; /* borrowed */
    int n_prompt;
    lily_sampler_params sp;
    const lily_logit_bias *bias; /* borrowed; ids outside the vocabulary are ignored */
    int n_bias;
    int32_t ban_id; /* a token never to sample (tool_choice none: <tool_call>), or -1 */
    int max_new;    /* generated-token budget (clamped to the context) */
    char **stop;    /* borrowed */
    int n_stop;
    int logprobs;     /* non-zero: fill each token's logprob (a log-softmax over the whole
                       vocabulary, ~1-2 ms a token on the host: skipped when not asked) */
    int top_logprobs; /* 0..LILY_GEN_MAX_TOP */
    void *ud;
    /* Polled between prefill chunks and decode steps; non-zero cancels. May be NULL. */
    int (*cancelled)(void *ud);
    /* Prefill progress over the tokens that need computing. May be NULL. */
    void (*on_prefill)(void *ud, int done, int total);
    /* A generated token and the text it released (may be empty). With tok == NULL: the end,
     * with the text that was still held. Returning non-zero stops generation (finish "stop"). */
    int (*on_text)(void *ud, const lily_gen_token *tok, const char *text, size_t len);
    /* Before each sampling step: may write up to max token ids to emit instead of sampling;
     * returns how many. May be NULL. */
    int (*force)(void *ud, int32_t *ids, int max);
    /* Constrained decoding (may be NULL): a matcher at the start of the grammar the output must
     * follow (borrowed; advanced by the run). A constrained request draws on the host: each
     * step the matcher's mask (over match_vocab ids, the trie's) sets the disallowed logits to
     * -inf before logit_bias, penalties and the draw; the drawn token advances the matcher, and
     * once the matcher is done the end-of-turn token ends the turn. Forced tokens are fed to the
     * matcher as well (a forced token it refuses leaves it unchanged). logprobs are those of the
     * unmasked logits. */
    lily_gmatch *match;
    int32_t match_vocab;
    /* With match: the constraint starts after this token has been generated (</think> when the
     * prompt opened a think block), or from the first token when <= 0 (id 0 is never such a
     * marker: a zero-initialised request is constrained from the start). */
    int32_t match_after;
} lily_gen_req;

typedef struct lily_gen_result {
    int n_prompt;
    int n_cached;       /* prompt tokens reused (not recomputed) */
    int n_prefilled;    /* prompt tokens computed */
    int n_gen;          /* generated tokens (end-of-turn token not counted) */
    const char *finish; /* "stop", "length", "cancelled" or "error" */
    int eos;            /* ended on an end-of-turn token */
    int stop_hit;       /* ended on a stop string: 1 + its index in the request's stop, else 0 */
    double prefill_s, decode_s;
    double grammar_s; /* of decode_s, the constrained steps' extra work: masks, applying them to
                         a copy of the logits, advancing the matcher */
    int n_drawn;      /* tokens the backend drew (their logits stayed on the device) */
    char error[512];
} lily_gen_result;

int lily_gen_create(lily_engine *eng, lily_tokenizer *tok, const lily_gen_opts *o, lily_gen **out,
                    lily_err *e);
void lily_gen_free(lily_gen *g);
int lily_gen_max_ctx(const lily_gen *g);

/* Runs one generation on slot 0, start to end. Returns 0 (see res->finish, which is "error" with
 * res->error on an engine failure) — the request's own problems were checked before. */
int lily_gen_run(lily_gen *g, const lily_gen_req *r, lily_gen_result *res);

/* ---- slots: the run as steps (a scheduler serving several requests) ---- */
int lily_gen_slots(const lily_gen *g);
lily_gen_phase lily_gen_slot_phase(const lily_gen *g, int slot);
/* An idle slot for a run of prompt p[0..n): the one whose live session is the longest prefix of
 * it, else the least recently used one; -1 when every slot is busy. */
int lily_gen_pick(lily_gen *g, const int32_t *p, int n);
/* Starts a run of r on an idle slot (r and res are borrowed until the slot is idle again).
 * Reuses what it can (live session or snapshot); the slot is then in LILY_GEN_PREFILL, or in
 * LILY_GEN_DECODE when the whole prompt was reused, or idle again with res->finish "error". */
int lily_gen_begin(lily_gen *g, int slot, const lily_gen_req *r, lily_gen_result *res);
/* Prefills the slot's next piece of prompt (at most opts.prefill_chunk tokens): the chunks
 * depend on the prompt and the reused prefix only, never on other slots. Returns the tokens
 * computed. The slot moves to LILY_GEN_DECODE after its last chunk, or to idle on cancellation
 * or failure. */
int lily_gen_prefill(lily_gen *g, int slot);
/* The tokens the slot's next lily_gen_prefill call will compute (0: none). */
int lily_gen_prefill_next(const lily_gen *g, int slot);
/* The prompt tokens the slot has still to prefill (0: none). */
int lily_gen_prefill_left(const lily_gen *g, int slot);
/* One decode step: a token from each of the n slots (those in LILY_GEN_DECODE; the host-drawing
 * ones consume theirs in one lily_session_decode_rows call). Returns how many runs ended (their
 * slots are idle, their results filled). */
int lily_gen_step(lily_gen *g, const int *slots, int n);
/* After the caller has delivered the answer of the slot's last run: consume its end-of-turn
 * token (if it ended on one) and snapshot the end of the turn, so that a follow-up request that
 * replays this turn resumes after it. Cheap to skip. */
void lily_gen_slot_finish_turn(lily_gen *g, int slot);

/* lily_gen_slot_finish_turn of slot 0 (after lily_gen_run). */
void lily_gen_finish_turn(lily_gen *g);

/* Forgets the live sessions of the idle slots (the prefix cache is kept). */
void lily_gen_reset(lily_gen *g);

/* Prefix-cache occupancy for metrics. */
void lily_gen_cache_stats(const lily_gen *g, int *entries, size_t *bytes);

/* The end-of-turn ids (*ids borrowed; the count is returned): the end tokens of a grammar's
 * token trie. */
int lily_gen_eos_ids(const lily_gen *g, const int32_t **ids);

/* Is id an end-of-turn token? They are the model config's eos ids (config.json and
 * generation_config.json) and the tokenizer's eos_token (tokenizer_config.json). */
int lily_gen_is_eos(const lily_gen *g, int32_t id);

/* The length of the end-of-turn token's text that text[0..len) ends with (a rendered turn's
 * closing marker, "<|im_end|>" for Qwen), or 0 when it ends with none. Thread-safe. */
size_t lily_gen_eos_suffix(const lily_gen *g, const char *text, size_t len);

#endif
