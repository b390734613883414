/* Parsing and validation of /v1/chat/completions and /v1/completions request bodies (api.md
 * §2.1, §4) into a lily_request.
 *
 * Rules applied: null equals absent; unknown fields are ignored; integers may be sent as integral
 * numbers (512.0); `stop` is a string or an array; `max_completion_tokens` wins over `max_tokens`
 * and `n_predict`; the thinking switch is read from chat_template_kwargs.enable_thinking, then
 * enable_thinking / enableThinking / think, then reasoning_effort / reasoning.effort. Messages are
 * normalised for the chat template: `developer` becomes `system`, `function` becomes `tool`,
 * list-of-parts content is joined, later system messages are merged into the first, reasoning
 * sent as `reasoning` or `thinking` becomes `reasoning_content`, and tool-call `arguments`
 * strings are parsed into objects. Every rejection is a 4xx lily_api_error naming the field. */
#ifndef LILY_SERVER_REQUEST_H
#define LILY_SERVER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "sampler/sampler.h"
#include "server/apierr.h"

typedef enum lily_req_kind { LILY_REQ_CHAT, LILY_REQ_COMPLETION } lily_req_kind;

typedef enum lily_tool_choice {
    LILY_TOOLS_AUTO,
    LILY_TOOLS_NONE,
    LILY_TOOLS_REQUIRED,
    LILY_TOOLS_NAMED,
} lily_tool_choice;

/* Bits of lily_request.given: which sampling fields the client set (the rest take the model's
 * generation_config.json defaults). */
enum {
    LILY_GIVEN_TEMPERATURE = 1,
    LILY_GIVEN_TOP_P = 2,
    LILY_GIVEN_TOP_K = 4,
    LILY_GIVEN_MIN_P = 8,
    LILY_GIVEN_PRESENCE = 16,
    LILY_GIVEN_FREQUENCY = 32,
    LILY_GIVEN_REPEAT = 64,
};

typedef struct lily_request_limits {
    size_t max_body;  /* bytes; 0 = no limit */
    int max_messages; /* 0 = no limit */
    int max_stop;     /* stop strings; 0 = 16 */
    int constrained;  /* 1: the generation loop applies lily_request.grammar; 0: a response_format
                         that needs one is compiled (errors name the construct), then refused
                         with 400 unsupported_value */
} lily_request_limits;

typedef struct lily_request {
    lily_req_kind kind;
    cJSON *body;         /* the parsed body (owned) */
    cJSON *messages;     /* chat: normalised messages array (owned) */
    cJSON *tools;        /* chat: function tools array, or NULL (owned) */
    cJSON *kwargs;       /* chat: extra template kwargs object (owned; enable_thinking is set in it
                            only when the request chose) */
    char *prompt;        /* completion: prompt text, or NULL when given as token ids (owned) */
    int32_t *prompt_ids; /* completion: prompt token ids (owned), n_prompt_ids of them */
    int n_prompt_ids;
    char model[128];
    int stream, include_usage;
    int max_tokens; /* 0 = not given (use the remaining context) */
    unsigned given; /* LILY_GIVEN_* */
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repeat_penalty;
    int top_k;
    int has_seed;
    uint64_t seed;
    int logprobs, top_logprobs;
    char **stop; /* n_stop non-empty strings (owned) */
    int n_stop;
    lily_logit_bias *bias; /* owned */
    int n_bias;
    lily_tool_choice tool_choice;
    char tool_name[128];     /* LILY_TOOLS_NAMED */
    int parallel_tool_calls; /* default 1 */
    int thinking;            /* -1 = server default, 0 off, 1 on */
    int thinking_budget;     /* -1 = unlimited */
    int reasoning_raw;       /* reasoning_format "none": leave <think> markup in content */
    int reasoning_name;      /* 1: emit the field as "reasoning" instead of "reasoning_content" */
    int prefill;             /* chat: the last message is an assistant turn to continue */
    int echo;                /* completion: echo the prompt */
    lily_grammar *grammar;   /* response_format json_object / json_schema: what the output must
                                match (owned), or NULL (src/server/respfmt.h) */
} lily_request;

/* Parses body[0..len). On success returns 0 and fills r (free with lily_request_free); on
 * failure returns -1 with e filled (status 400 or 413) and r left empty. */
int lily_request_parse(lily_req_kind kind, const char *body, size_t len,
                       const lily_request_limits *lim, lily_request *r, lily_api_error *e);

void lily_request_free(lily_request *r);

/* 1 if a JSON text has a \u0000 escape inside a string (cJSON would cut the string there). */
int lily_json_has_nul(const char *s, size_t n);

/* The seed of a parsed body: the exact integer written for the top-level "seed" member (any in
 * [-2^63, 2^64); negatives wrap to their two's complement), or, when it is written with a
 * fraction or exponent, its double value v when integral and in range. -1 otherwise. */
int lily_json_seed(const char *body, size_t len, double v, uint64_t *out);

#endif
