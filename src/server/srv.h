/* Internal state of `lily serve` shared by the HTTP front (http.c), the job preparation and
 * output (job.c) and the inference thread (sched.c). Not a public interface.
 *
 * Threads: libmicrohttpd runs one thread per connection; each parses and validates its request,
 * renders the template and tokenizes (all thread-safe, read-only on the shared objects), then
 * hands a lily_job to the single inference thread through a bounded FIFO. The job is also the
 * channel back: the inference thread appends response bytes (SSE events, or the final JSON body)
 * to job->out and signals job->cv; the connection thread drains them. A job is reference
 * counted (connection + queue/worker) so either side may finish first. */
#ifndef LILY_SERVER_SRV_H
#define LILY_SERVER_SRV_H

#include <pthread.h>
#include <stdint.h>

#include "chat/template.h"
#include "lily.h"
#include "sampler/sampler.h"
#include "server/apierr.h"
#include "gen/gen.h"
#include "gen/outparse.h"
#include "server/metrics.h"
#include "server/request.h"
#include "gen/sb.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

typedef struct lily_srv lily_srv;

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE } lily_job_state;

typedef struct lily_job lily_job;

/* An answer shape other than OpenAI chat completions (anthropic.c: /v1/messages, responses.c:
 * /v1/responses). The inference thread hands it the start, every parsed delta (reasoning,
 * content, tool calls; streaming or not), and the end; it appends the bytes for the client to o
 * (SSE events when the request streams, else the whole body at the end). */
typedef struct lily_apiout {
    void (*begin)(lily_job *j, lily_sb *o);
    void (*delta)(lily_job *j, const lily_delta *d, lily_sb *o);
    void (*finish)(lily_job *j, const lily_gen_result *g, int reasoning_tokens, lily_sb *o);
    void (*error)(lily_job *j, const char *msg, lily_sb *o);
    void (*free)(void *state);
} lily_apiout;

struct lily_job {
    lily_srv *srv;
    lily_request req;
    int32_t *prompt; /* prompt token ids (owned) */
    int n_prompt;
    char *echo;        /* completions with echo: the prompt text (owned) */
    int thinking_open; /* the prompt ends inside <think> */
    int max_new;
    lily_sampler_params sp;
    int32_t *force_ids; /* tool_choice required/named: tokens that open the call (owned) */
    int n_force;
    int32_t *budget_ids; /* thinking_budget: tokens that close the think block (owned) */
    int n_budget;
    char id[48];
    long created;
    /* channel (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lily_sb out; /* bytes for the client not yet taken */
    lily_job_state state;
    int status;    /* HTTP status of a non-streaming answer */
    int cancelled; /* the client went away */
    int refs;
    int prefill_done, prefill_total;
    int cached_tokens, prefill_tokens; /* for response headers */
    int n_gen;                         /* generated tokens (set at the end, for the log) */
    double t_first;                    /* lily_now() of the first generated token, 0 = none */
    const lily_apiout *api;            /* NULL: OpenAI chat/completions shapes */
    void *api_state;                   /* owned; freed by api->free */
};

struct lily_srv {
    lily_server_opts opts;
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_template *tmpl;
    lily_gen *gen;
    char model_id[256];
    int ctx;                      /* per-request context */
    int xml_tools;                /* the template uses the <function=NAME> call form */
    int32_t tool_call_tok;        /* id of <tool_call>, or -1 */
    lily_sampler_params defaults; /* generation_config.json sampling defaults */
    long created;
    lily_metrics metrics;
    int log_format; /* lily_log_format (reqlog.h), resolved: never LILY_LOG_DEFAULT */
    /* the queue (under qmu) */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    lily_job **queue;
    int q_head, q_len, q_cap;
    int stopping;
    int shutdown; /* set once at exit: every job counts as cancelled */
    pthread_t worker;
};

/* ---- job.c --------------------------------------------------------------------------------- */

/* Builds a job from a parsed request (which it takes over; r is emptied): template, tokens,
 * context check, sampling parameters. Runs on the connection thread. NULL with e on failure. */
lily_job *lily_job_prepare(lily_srv *s, lily_request *r, lily_api_error *e);
/* Runs the job on the inference thread, writing the response into job->out. */
void lily_job_run(lily_srv *s, lily_job *j);
void lily_job_release(lily_job *j);
/* prefix + 24 random alphanumerics into out (at least strlen(prefix) + 25 bytes). */
void lily_job_random_id(char *out, const char *prefix);
int lily_job_cancelled(lily_job *j);

/* ---- sched.c ------------------------------------------------------------------------------- */

int lily_sched_start(lily_srv *s, lily_err *e);
void lily_sched_stop(lily_srv *s);
/* Admits a job (taking a reference); -1 when the queue is full. */
int lily_sched_submit(lily_srv *s, lily_job *j);

/* ---- http.c -------------------------------------------------------------------------------- */

/* Serves until *stop becomes non-zero. */
int lily_http_serve(lily_srv *s, volatile int *stop, lily_err *e);

#endif
