/* Internal state of `lily serve` shared by the accepting front (front.c), the HTTP handlers
 * (http.c), the job preparation and output (job.c, jobrun.c) and the inference thread (sched.c).
 * Not a public interface.
 *
 * Threads: the front thread accepts connections, terminates TLS, screens each request head and
 * relays the connection to libmicrohttpd (a socketpair), whose one internal thread (epoll) runs
 * every connection without blocking; it also sweeps deadlines every 200 ms. A request that needs work is admitted (a slot
 * in the bounded queue) once its body has arrived, and goes as a lily_job to the preparation
 * thread (JSON parse, template, tokenization), then to the single inference thread through a
 * bounded FIFO, while its connection is suspended. The job is also the channel back: the threads
 * append response bytes (SSE events, or the final JSON body) to job->out and resume the suspended
 * connection (lily_job_wake). A job is reference counted (connection + queue/worker) so either
 * side may finish first. */
#ifndef LILY_SERVER_SRV_H
#define LILY_SERVER_SRV_H

#include <pthread.h>
#include <sys/socket.h>
#include <stdint.h>

#include "chat/template.h"
#include "grammar/matcher.h"
#include "grammar/trie.h"
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
struct MHD_Connection;
struct MHD_Daemon;

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE } lily_job_state;

typedef struct lily_job lily_job;

/* What a job does: a generation (chat, completion, /v1/messages, /v1/responses), or a tokenizer
 * call (tokenize, detokenize, /v1/messages/count_tokens) answered by the preparation thread. */
typedef enum {
    TASK_CHAT,
    TASK_COMPLETION,
    TASK_MESSAGES,
    TASK_RESPONSES,
    TASK_TOKENIZE,
    TASK_DETOKENIZE,
    TASK_COUNT_TOKENS
} lily_task;

static inline int lily_task_generates(lily_task t) {
    return t <= TASK_RESPONSES;
}

/* One accepted connection (front.c), in srv->conns under srv->lmu. */
typedef enum { CONN_SCREEN, CONN_LINGER, CONN_MHD, CONN_TLS } lily_conn_state; /* TLS: handshake */
typedef struct lily_conn {
    struct lily_conn *prev, *next;
    int fd;
    lily_conn_state state;
    double t0;            /* accepted; on a kept-alive connection, its last answer ended */
    double linger_until;  /* CONN_LINGER: close by then */
    int phase;            /* 0 reading the head, 1 the body, 2 the request is in */
    int killed;           /* shut down by a deadline */
    int http11;           /* the request said HTTP/1.1 */
    int relayed;          /* fd is libmicrohttpd's end of a relay's socketpair (relay.c) */
    int n_requests;       /* requests begun on it (keep-alive) */
    unsigned char ip[16]; /* client address (IPv4 mapped into the first 4 bytes) */
    int ip_len;
    struct sockaddr_storage *addr;
    unsigned addr_len;
    struct lily_job *job; /* the job its request waits on, or NULL */
} lily_conn;

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
    lily_task task;
    lily_sb body; /* the raw request body, until prepared */
    int prepared; /* preparation is over (failed or not) */
    int failed;   /* ... and failed: answer err */
    lily_api_error err;
    struct MHD_Connection *conn; /* the waiting connection (NULL once it is gone) */
    int suspended;               /* conn is suspended until lily_job_wake */
    int probed;                  /* a half-closed connection was probed */
    double last_drain;           /* a stream's bytes were last taken */
    double deadline;             /* generation stops here (finish "length"); 0 = none */
    int timed_out, overflow;     /* the deadline passed / the stream's buffer overflowed */
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
    lily_gmatch *match;  /* constrained (req.grammar): the request's matcher, past the content of
                            a continued assistant message (owned) */
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
    double t_queued, t_started;        /* lily_now() when queued / when a slot took it */
    const lily_apiout *api;            /* NULL: OpenAI chat/completions shapes */
    void *api_state;                   /* owned; freed by api->free */
};

struct lily_srv {
    lily_server_opts opts;
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_template *tmpl;
    lily_gen *gen;
    int slots;         /* the generator's slots (--parallel) */
    int prefill_chunk; /* prompt tokens prefilled per scheduler step (--prefill-chunk) */
    char model_id[256];
    int ctx;                      /* per-request context */
    int xml_tools;                /* the template uses the <function=NAME> call form */
    int32_t tool_call_tok;        /* id of <tool_call>, or -1 */
    int32_t tool_end_tok;         /* id of </tool_call>, or -1 */
    int32_t think_end_tok;        /* id of </think>, or -1 */
    lily_token_trie *trie;        /* the vocabulary for constrained decoding (shared, read-only) */
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
    /* admission and preparation (under qmu): jobs admitted and not yet taken by the worker */
    int admitted;
    lily_job **prep;
    int p_head, p_len;
    pthread_cond_t pcv;
    pthread_t prep_thread;
    /* connections (front.c, under lmu) */
    pthread_mutex_t lmu;
    lily_conn *conns;
    int n_conns;
    struct MHD_Daemon *mhd;
    int listen_fd, epoll_fd, port;
    pthread_t front;
    volatile int front_stop;
};

/* ---- job.c --------------------------------------------------------------------------------- */

/* A new job (one reference) that will run the task, in state JOB_QUEUED. */
lily_job *lily_job_new(lily_srv *s, lily_task task);
/* Fills a job from a parsed request (which it takes over; r is emptied): template, tokens,
 * context check, token cap, sampling parameters. -1 with e on failure. */
int lily_job_fill(lily_srv *s, lily_job *j, lily_request *r, lily_api_error *e);
/* Builds a job from a parsed request: lily_job_new + lily_job_fill. NULL with e on failure. */
lily_job *lily_job_prepare(lily_srv *s, lily_request *r, lily_api_error *e);
/* A job running on a slot of the generator (jobrun.c), on the inference thread. */
typedef struct lily_run lily_run;
/* Starts the job on an idle slot of s->gen (lily_gen_begin): the response's opening goes to
 * job->out at once, the rest as the scheduler steps the slot (lily_gen_prefill, lily_gen_step). */
lily_run *lily_job_begin(lily_srv *s, lily_job *j, int slot);
/* Once the slot is idle again: the response's end, the job done, the turn's end consumed
 * (lily_gen_slot_finish_turn), the counters; frees u (the job is not released). */
void lily_job_end(lily_run *u);
int lily_run_tokens(const lily_run *u); /* generated so far */
lily_job *lily_run_job(const lily_run *u);
void lily_job_release(lily_job *j);
/* prefix + 24 random alphanumerics into out (at least strlen(prefix) + 25 bytes). */
void lily_job_random_id(char *out, const char *prefix);
int lily_job_cancelled(lily_job *j);

/* ---- sched.c ------------------------------------------------------------------------------- */
/* The inference thread owns s->gen: up to s->slots jobs run at once; the rest wait in the FIFO
 * (at most opts.queue); beyond that, 503. */

int lily_sched_start(lily_srv *s, lily_err *e);
void lily_sched_stop(lily_srv *s);
/* Admits a job (taking a reference); -1 when the queue is full. */
int lily_sched_submit(lily_srv *s, lily_job *j);
/* Reserves a place for a request before any work on it; -1 when the queue is full. */
int lily_sched_admit(lily_srv *s);
/* Gives the place back (the job failed preparation, or needed no inference). */
void lily_sched_unadmit(lily_srv *s);

/* ---- http.c -------------------------------------------------------------------------------- */

/* Serves until *stop becomes non-zero. */
int lily_http_serve(lily_srv *s, volatile int *stop, lily_err *e);
/* Resumes the job's suspended connection, if it is; call with j->mu held. */
void lily_job_wake(lily_job *j);
/* The deadlines and waits of connections handed to libmicrohttpd (front thread, lmu held). */
void lily_http_sweep(lily_srv *s, double now);

/* ---- httphead.c, front.c ------------------------------------------------------------------- */

/* Checks a request head (and a chunked body) in buf[0..n): 0 = complete and acceptable, 1 = not
 * complete yet, -1 = rejected with e (an HTTP-level error: 400, 411, 414, 431, 501, 505). full
 * says no more bytes can be seen (the window is full): then incomplete is an error too. */
int lily_http_screen(const char *buf, size_t n, int full, int *http11, lily_api_error *e);
/* The same, and where an accepted request ends: head_len bytes of head (with a chunked body:
 * the whole body too), then body_len bytes of body (Content-Length; 0 when chunked). */
typedef struct {
    size_t head_len;
    unsigned long long body_len;
    int chunked;
} lily_http_frame;
int lily_http_screen_frame(const char *buf, size_t n, int full, int *http11, lily_http_frame *f,
                           lily_api_error *e);
/* Binds the listening socket (s->port is then the bound port). */
int lily_front_listen(lily_srv *s, lily_err *e);
/* Starts / stops the accepting thread (hands connections to s->mhd). */
int lily_front_start(lily_srv *s, lily_err *e);
void lily_front_stop(lily_srv *s);
/* libmicrohttpd's connection notifications: STARTED finds the lily_conn of a socket. */
lily_conn *lily_front_started(lily_srv *s, int fd);
void lily_front_closed(lily_srv *s, lily_conn *c);
/* For the TLS relay: the connection's plaintext socket goes to the screen; a record whose
 * handshake failed is forgotten (it has no socket of its own). */
void lily_front_screen(lily_srv *s, lily_conn *c, int fd);
void lily_front_drop(lily_srv *s, lily_conn *c);

/* The bytes of the answer to a request refused by a relay (its head in head[0..n)), and its
 * request-log line. */
void lily_front_refusal(lily_srv *s, const struct sockaddr_storage *addr, double t0, double now,
                        const char *head, size_t n, const lily_api_error *e, lily_sb *out);

/* ---- relay.c (front thread) ---------------------------------------------------------------- */

/* What the screen looks at: a request head and a chunked body (httphead.c). */
#define LILY_SCREEN_WINDOW (16 * 1024 + 64 * 1024 + 1024)

typedef struct lily_relay lily_relay;
/* Loads the PEM certificate and key (once, before serving). */
int lily_tls_init(const char *cert_pem, const char *key_pem, lily_err *e);
void lily_tls_free(void);
/* Takes an accepted TLS connection (its record c, counted; c->fd is the client's socket). */
void lily_relay_start(lily_srv *s, lily_conn *c, double now);
/* Relays a plain connection whose first head passed the screen: returns the socket for
 * libmicrohttpd (the relay keeps c->fd), or -1. */
int lily_relay_wrap(lily_srv *s, lily_conn *c, double now);
/* Whether an epoll data pointer names a relay, and its event. */
int lily_relay_tagged(void *ptr);
void lily_relay_event(lily_srv *s, void *tagged, unsigned events, double now);
/* Handshake and linger deadlines; frees what the last batch of events closed; all, at stop. */
void lily_relay_sweep(lily_srv *s, double now);
void lily_relay_reap(void);
void lily_relay_stop_all(lily_srv *s);

#endif
