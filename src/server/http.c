/* HTTP handlers of `lily serve` on libmicrohttpd's one internal thread (epoll; the connections
 * come from front.c): routing, the browser checks (Host allow-list, Content-Type, CORS §8.2), API
 * keys (§8.1), body limits, and admission. Nothing here blocks: a request that needs work is
 * admitted (a queue slot) once its body is in, handed to the preparation thread as a lily_job
 * (JSON parse, template, tokens) and on to the inference thread, and its connection is suspended
 * until the job has something for it (lily_job_wake). An answer leaves as one JSON body, or as a
 * stream of SSE events with ": " keep-alive comments while nothing else is ready. The front
 * thread's sweep (lily_http_sweep) enforces the read deadlines, notices vanished clients (§7) and
 * cancels a stream whose reader stopped reading. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "base/timer.h"
#include "server/anthropic.h"
#include "server/reqlog.h"
#include "server/responses.h"
#include "server/srv.h"

#define KEEPALIVE_S 10.0

typedef struct conn { /* one request (libmicrohttpd's con_cls) */
    lily_sb body;
    int too_big;
    lily_job *job; /* the job it waits on (a reference) */
    lily_conn *lc; /* its connection's record (front.c), or NULL */
    /* for the request log (reqlog.h) and the error shape */
    double t0, wall;
    char method[16];
    char path[256];
    char client[80];
    int status;
    int anthropic; /* /v1/messages: errors in Anthropic's shape */
} conn;

/* The request being handled (libmicrohttpd calls the handler on its one thread, which sets this
 * on each call): where the answer's status is noted, and which error shape it takes. */
static _Thread_local conn *t_cur;

typedef struct stream {
    lily_job *job; /* a reference */
    struct MHD_Connection *c;
} stream;

/* ---- helpers -------------------------------------------------------------------------------- */

/* The client reset or fully closed the connection (a half-close alone is not "gone"). */
static int socket_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

static int socket_rdhup(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLRDHUP);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

void lily_job_wake(lily_job *j) {
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
}

/* Suspends the connection until the job wakes it (j->mu held; released here). */
static enum MHD_Result wait_job(lily_srv *s, struct MHD_Connection *c, lily_job *j) {
    if (__atomic_load_n(&s->shutdown, __ATOMIC_ACQUIRE)) {
        j->cancelled = 1;
        pthread_mutex_unlock(&j->mu);
        return MHD_NO;
    }
    j->conn = c;
    j->suspended = 1;
    MHD_suspend_connection(c);
    pthread_mutex_unlock(&j->mu);
    return MHD_YES;
}

static int origin_allowed(const lily_srv *s, const char *origin) {
    const char *list = s->opts.cors_origins;
    if (list && !strcmp(list, "*")) return 1;
    if (list) {
        size_t n = strlen(origin);
        for (const char *p = list; *p;) {
            const char *comma = strchr(p, ',');
            size_t k = comma ? (size_t)(comma - p) : strlen(p);
            if (k == n && !strncmp(p, origin, n)) return 1;
            p += k + (comma ? 1 : 0);
        }
        return 0;
    }
    static const char *const ok[] = {"http://localhost",  "https://localhost", "http://127.0.0.1",
                                     "https://127.0.0.1", "http://[::1]",      "https://[::1]"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t k = strlen(ok[i]);
        if (!strncmp(origin, ok[i], k) && (origin[k] == 0 || origin[k] == ':')) return 1;
    }
    return 0;
}

static void add_cors(lily_srv *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin || !origin_allowed(s, origin)) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

/* Keep-alive (HTTP/1.1 persistent connections, left to libmicrohttpd): the last request a
 * connection may carry (--conn-requests) is answered with Connection: close; the others say how
 * long an idle connection is kept (the head deadline, counted from the end of each answer). */
static void add_conn_headers(lily_srv *s, struct MHD_Response *r) {
    lily_conn *lc = t_cur ? t_cur->lc : NULL;
    if (!lc || __atomic_load_n(&lc->n_requests, __ATOMIC_ACQUIRE) >= s->opts.conn_requests) {
        MHD_add_response_header(r, "Connection", "close");
        return;
    }
    char v[32];
    snprintf(v, sizeof v, "timeout=%d", (int)s->opts.header_timeout);
    MHD_add_response_header(r, "Keep-Alive", v);
}

static void count(lily_srv *s, int status) {
    if (t_cur) t_cur->status = status;
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.requests++;
    s->metrics.requests_error += status >= 400;
    pthread_mutex_unlock(&s->metrics.mu);
}

static enum MHD_Result send_body(lily_srv *s, struct MHD_Connection *c, int status,
                                 const char *type, const char *body, size_t len, const char *h1,
                                 const char *v1) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (type) MHD_add_response_header(r, "Content-Type", type);
    if (h1) MHD_add_response_header(r, h1, v1);
    add_conn_headers(s, r);
    add_cors(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count(s, status);
    return rc;
}

static enum MHD_Result send_error(lily_srv *s, struct MHD_Connection *c, const lily_api_error *e) {
    lily_sb b = {0};
    if (t_cur && t_cur->anthropic)
        lily_anth_error_json(e, &b);
    else
        lily_api_error_json(e, &b);
    struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.data, MHD_RESPMEM_MUST_COPY);
    lily_sb_free(&b);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", e->retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (e->status >= 500 && !e->retry_after) MHD_add_response_header(r, "x-should-retry", "false");
    add_conn_headers(s, r);
    add_cors(s, c, r);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    count(s, e->status);
    return rc;
}

static enum MHD_Result send_sb(lily_srv *s, struct MHD_Connection *c, int status, lily_sb *b) {
    enum MHD_Result rc =
        send_body(s, c, status, "application/json", lily_sb_str(b), b->len, NULL, NULL);
    lily_sb_free(b);
    return rc;
}

/* "ADDR:PORT" of the client ("[ADDR]:PORT" for IPv6), "-" when unknown. */
static void client_name(struct MHD_Connection *c, char *out, size_t n) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    lily_reqlog_client(ci ? ci->client_addr : NULL, out, n);
}

/* Constant-time key check (api.md §8.1): Authorization: Bearer KEY or X-Api-Key: KEY. */
static int authorized(const lily_srv *s, struct MHD_Connection *c) {
    if (!s->opts.n_api_keys) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *key = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) key = h + 7;
    if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
    if (!key) return 0;
    size_t kn = strlen(key);
    int ok = 0;
    for (int i = 0; i < s->opts.n_api_keys; i++) {
        const char *want = s->opts.api_keys[i];
        size_t wn = strlen(want);
        unsigned char diff = (unsigned char)(kn != wn);
        for (size_t k = 0; k < wn; k++)
            diff |= (unsigned char)(want[k] ^ (k < kn ? key[k] : 0));
        ok |= !diff;
    }
    return ok;
}

/* ---- routes --------------------------------------------------------------------------------- */

typedef enum {
    R_NONE,
    R_HEALTH,
    R_MODELS,
    R_MODEL,
    R_METRICS,
    R_CHAT,
    R_COMPLETIONS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_MESSAGES,
    R_COUNT_TOKENS,
    R_RESPONSES,
} route;

static route find_route(const char *url, const char **arg, const char **want_method) {
    if (!strncmp(url, "/v1/", 4)) url += 3;
    *arg = NULL;
    *want_method = "GET";
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/models")) return R_MODELS;
    if (!strncmp(url, "/models/", 8) && url[8]) {
        *arg = url + 8;
        return R_MODEL;
    }
    if (!strcmp(url, "/metrics")) return R_METRICS;
    *want_method = "POST";
    if (!strcmp(url, "/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/messages")) return R_MESSAGES;
    if (!strcmp(url, "/messages/count_tokens")) return R_COUNT_TOKENS;
    if (!strcmp(url, "/responses")) return R_RESPONSES;
    return R_NONE;
}

static void model_json(const lily_srv *s, lily_sb *o) {
    const lily_model_info *mi = lily_engine_info(s->eng);
    lily_sb_puts(o, "{\"id\":");
    lily_sb_json_str(o, s->model_id, strlen(s->model_id));
    lily_sb_printf(o,
                   ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"local\","
                   "\"context_length\":%d,\"max_model_len\":%d,\"meta\":{\"n_ctx\":%d,"
                   "\"n_ctx_train\":%d,\"n_params\":%llu}}",
                   s->created, s->ctx, s->ctx, s->ctx, mi->max_position,
                   (unsigned long long)mi->n_params);
}

static enum MHD_Result get_route(lily_srv *s, struct MHD_Connection *c, route rt, const char *arg) {
    lily_sb b = {0};
    if (rt == R_HEALTH) {
        pthread_mutex_lock(&s->metrics.mu);
        int q = s->metrics.queue_depth, busy = s->metrics.busy;
        pthread_mutex_unlock(&s->metrics.mu);
        lily_sb_printf(&b,
                       "{\"status\":\"ok\",\"slots_idle\":%d,\"slots_processing\":%d,"
                       "\"queue_depth\":%d}",
                       s->slots - busy, busy, q);
        return send_sb(s, c, 200, &b);
    }
    if (rt == R_MODELS) {
        lily_sb_puts(&b, "{\"object\":\"list\",\"data\":[");
        model_json(s, &b);
        lily_sb_puts(&b, "]}");
        return send_sb(s, c, 200, &b);
    }
    if (rt == R_MODEL) {
        if (strcmp(arg, s->model_id)) {
            lily_api_error e;
            lily_api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                          "The model '%s' does not exist", arg);
            return send_error(s, c, &e);
        }
        model_json(s, &b);
        return send_sb(s, c, 200, &b);
    }
    lily_metrics_text(&s->metrics, &b);
    enum MHD_Result rc =
        send_body(s, c, 200, "text/plain; version=0.0.4", lily_sb_str(&b), b.len, NULL, NULL);
    lily_sb_free(&b);
    return rc;
}

/* ---- preparation (its own thread) ----------------------------------------------------------- */

static void tokenize_task(lily_srv *s, lily_job *j, lily_sb *b, lily_api_error *e) {
    lily_err err;
    cJSON *js = cJSON_ParseWithLength(lily_sb_str(&j->body), j->body.len);
    if (!cJSON_IsObject(js)) {
        cJSON_Delete(js);
        lily_api_bad(e, "invalid_json", NULL, "request body must be a JSON object");
        return;
    }
    if (j->task == TASK_TOKENIZE) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(js, "content");
        if (!t) t = cJSON_GetObjectItemCaseSensitive(js, "prompt");
        int32_t *ids = NULL;
        size_t n = 0;
        if (!cJSON_IsString(t)) {
            lily_api_bad(e, "invalid_type", "content", "'content' must be a string");
        } else if (lily_json_has_nul(lily_sb_str(&j->body), j->body.len)) {
            lily_api_bad(e, "invalid_value", "content", "strings must not contain U+0000");
        } else if (lily_tokenizer_encode(s->tok, t->valuestring, strlen(t->valuestring), &ids, &n,
                                         &err)) {
            lily_api_bad(e, "invalid_value", "content", "%s", err.msg);
        } else {
            lily_sb_puts(b, "{\"tokens\":[");
            for (size_t i = 0; i < n; i++)
                lily_sb_printf(b, "%s%d", i ? "," : "", ids[i]);
            lily_sb_printf(b, "],\"count\":%zu,\"max_model_len\":%d}", n, s->ctx);
        }
        free(ids);
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(js, "tokens");
        int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
        int32_t *ids = lily_xcalloc((size_t)(n > 0 ? n : 1), sizeof *ids);
        int ok = n >= 0, i = 0;
        const cJSON *x;
        if (ok) {
            cJSON_ArrayForEach(x, t) {
                ok &= cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < 2147483647.0;
                if (ok) ids[i++] = (int32_t)x->valuedouble;
            }
        }
        char *text = NULL;
        size_t len = 0;
        if (!ok)
            lily_api_bad(e, "invalid_type", "tokens", "'tokens' must be an array of token ids");
        else if (lily_tokenizer_decode(s->tok, ids, (size_t)n, &text, &len, &err))
            ok = 0, lily_api_bad(e, "invalid_value", "tokens", "%s", err.msg);
        if (ok) {
            lily_sb_puts(b, "{\"content\":");
            lily_sb_json_str(b, text, len);
            lily_sb_putc(b, '}');
        }
        free(text);
        free(ids);
    }
    cJSON_Delete(js);
}

/* Parses, renders and tokenizes one admitted request, then queues it for inference. */
static void prepare(lily_srv *s, lily_job *j) {
    lily_api_error e;
    memset(&e, 0, sizeof e);
    lily_sb out = {0};
    int failed = 0;
    if (lily_job_cancelled(j)) {
        failed = 1;
        lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL, "shutting down");
    } else if (j->task == TASK_CHAT || j->task == TASK_COMPLETION) {
        lily_request req;
        lily_request_limits lim = {
            .max_body = s->opts.max_body, .max_messages = 100000, .constrained = 1};
        failed = lily_request_parse(j->task == TASK_CHAT ? LILY_REQ_CHAT : LILY_REQ_COMPLETION,
                                    lily_sb_str(&j->body), j->body.len, &lim, &req, &e) ||
                 lily_job_fill(s, j, &req, &e);
    } else if (j->task == TASK_MESSAGES) {
        failed = lily_anth_fill(s, j, lily_sb_str(&j->body), j->body.len, &e) != 0;
    } else if (j->task == TASK_RESPONSES) {
        failed = lily_resp_fill(s, j, lily_sb_str(&j->body), j->body.len, &e) != 0;
    } else if (j->task == TASK_COUNT_TOKENS) {
        failed = lily_anth_count_tokens(s, lily_sb_str(&j->body), j->body.len, &out, &e) != 0;
        if (failed) lily_sb_free(&out);
    } else {
        tokenize_task(s, j, &out, &e);
        failed = !out.len;
    }
    lily_sb_free(&j->body);
    int generate = !failed && lily_task_generates(j->task);
    if (!generate) lily_sched_unadmit(s);
    pthread_mutex_lock(&j->mu);
    j->prepared = 1;
    j->failed = failed;
    j->err = e;
    if (!generate) {
        j->out = out;
        j->state = JOB_DONE;
    }
    lily_job_wake(j);
    pthread_mutex_unlock(&j->mu);
    if (generate && lily_sched_submit(s, j)) { /* only while stopping */
        lily_sched_unadmit(s);
        pthread_mutex_lock(&j->mu);
        j->failed = 1;
        lily_api_fail(&j->err, 503, "server_error", "server_overloaded", NULL, "shutting down");
        j->state = JOB_DONE;
        lily_job_wake(j);
        pthread_mutex_unlock(&j->mu);
    }
}

static void *prep_main(void *arg) {
    lily_srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (!s->p_len && !s->stopping)
            pthread_cond_wait(&s->pcv, &s->qmu);
        if (!s->p_len) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        lily_job *j = s->prep[s->p_head];
        s->p_head = (s->p_head + 1) % s->q_cap;
        s->p_len--;
        pthread_mutex_unlock(&s->qmu);
        prepare(s, j);
        lily_job_release(j);
    }
    return NULL;
}

static void prep_push(lily_srv *s, lily_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->qmu);
    s->prep[(s->p_head + s->p_len) % s->q_cap] = j; /* admitted <= q_cap: there is room */
    s->p_len++;
    pthread_cond_signal(&s->pcv);
    pthread_mutex_unlock(&s->qmu);
}

/* ---- streaming ------------------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    lily_job *j = st->job;
    lily_srv *s = j->srv;
    pthread_mutex_lock(&j->mu);
    double now = lily_now();
    if (j->overflow) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (j->out.len) {
        size_t n = j->out.len < max ? j->out.len : max;
        memcpy(buf, j->out.data, n);
        lily_sb_drop_front(&j->out, n);
        j->last_drain = now;
        pthread_mutex_unlock(&j->mu);
        return (ssize_t)n;
    }
    if (j->state == JOB_DONE) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (lily_job_cancelled(j)) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (now - j->last_drain >= KEEPALIVE_S) {
        char msg[96];
        int n;
        if (j->state == JOB_QUEUED)
            n = snprintf(msg, sizeof msg, ": queued\n\n");
        else if (j->prefill_total > 0 && j->prefill_done < j->prefill_total)
            n = snprintf(msg, sizeof msg, ": prefill %d/%d\n\n", j->prefill_done, j->prefill_total);
        else
            n = snprintf(msg, sizeof msg, ": ping\n\n");
        j->last_drain = now;
        pthread_mutex_unlock(&j->mu);
        if ((size_t)n > max) n = (int)max;
        memcpy(buf, msg, (size_t)n);
        return n;
    }
    if (wait_job(s, st->c, j) != MHD_YES) return MHD_CONTENT_READER_END_WITH_ERROR;
    return 0;
}

static void stream_free(void *cls) {
    stream *st = cls;
    lily_job *j = st->job;
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1; /* no-op once it is done */
    j->conn = NULL;
    j->suspended = 0;
    pthread_mutex_unlock(&j->mu);
    lily_job_release(j);
    free(st);
}

static enum MHD_Result start_stream(lily_srv *s, struct MHD_Connection *c, lily_job *j) {
    stream *st = lily_xcalloc(1, sizeof *st);
    st->job = j;
    st->c = c;
    pthread_mutex_lock(&j->mu);
    j->refs++;
    j->last_drain = lily_now();
    pthread_mutex_unlock(&j->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_conn_headers(s, r);
    add_cors(s, c, r);
    int fd = conn_fd(c);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* a fixed kernel send buffer (no autotuning up to 4 MiB): what a stream holds unsent is
         * bounded by it (doubled by the kernel) + --send-buffer */
        int sb = s->opts.send_buffer < (256u << 10) ? (int)s->opts.send_buffer : 256 << 10;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
    }
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count(s, 200);
    return rc;
}

/* ---- admitted work: completions and the tokenizer ------------------------------------------ */

static enum MHD_Result task_route(lily_srv *s, struct MHD_Connection *c, route rt, conn *k) {
    lily_api_error e;
    lily_job *j = k->job;
    if (!j) {
        if (lily_sched_admit(s)) {
            lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL,
                          "The server is busy (request queue full); retry shortly");
            e.retry_after = 1;
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.rejected_busy++;
            pthread_mutex_unlock(&s->metrics.mu);
            return send_error(s, c, &e);
        }
        lily_task task = rt == R_CHAT           ? TASK_CHAT
                         : rt == R_COMPLETIONS  ? TASK_COMPLETION
                         : rt == R_MESSAGES     ? TASK_MESSAGES
                         : rt == R_COUNT_TOKENS ? TASK_COUNT_TOKENS
                         : rt == R_RESPONSES    ? TASK_RESPONSES
                         : rt == R_TOKENIZE     ? TASK_TOKENIZE
                                                : TASK_DETOKENIZE;
        j = lily_job_new(s, task);
        j->body = k->body;
        memset(&k->body, 0, sizeof k->body);
        j->conn = c;
        k->job = j;
        if (k->lc) {
            pthread_mutex_lock(&s->lmu);
            k->lc->job = j;
            pthread_mutex_unlock(&s->lmu);
        }
        prep_push(s, j);
    }
    pthread_mutex_lock(&j->mu);
    if (j->cancelled) { /* the client went away: answer anyway (MHD_NO would be logged as an
                         * internal error); the log records 499 */
        pthread_mutex_unlock(&j->mu);
        return send_body(s, c, 499, "text/plain", "", 0, NULL, NULL);
    }
    if (!j->prepared) return wait_job(s, c, j);
    if (j->failed) {
        e = j->err;
        pthread_mutex_unlock(&j->mu);
        return send_error(s, c, &e);
    }
    if (!lily_task_generates(j->task)) {
        lily_sb b = j->out;
        memset(&j->out, 0, sizeof j->out);
        pthread_mutex_unlock(&j->mu);
        return send_sb(s, c, 200, &b);
    }
    if (j->req.stream) {
        pthread_mutex_unlock(&j->mu);
        return start_stream(s, c, j);
    }
    if (j->state != JOB_DONE) return wait_job(s, c, j);
    int status = j->status;
    char cached[64];
    snprintf(cached, sizeof cached, "%d", j->cached_tokens);
    lily_sb body = j->out;
    memset(&j->out, 0, sizeof j->out);
    pthread_mutex_unlock(&j->mu);
    if (status == 503) {
        lily_sb_free(&body);
        lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL, "shutting down");
        return send_error(s, c, &e);
    }
    enum MHD_Result rc = send_body(s, c, status, "application/json", lily_sb_str(&body), body.len,
                                   "x-lily-cached-tokens", cached);
    lily_sb_free(&body);
    return rc;
}

/* ---- browser-facing checks ------------------------------------------------------------------ */

/* Host header allow-list (DNS rebinding): localhost names, the bound address, --allow-host. */
static int host_allowed(const lily_srv *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!h) return 1; /* HTTP/1.0 without Host (HTTP/1.1 needs one: the front checks) */
    char name[256];
    size_t n;
    if (h[0] == '[') {
        const char *close = strchr(h, ']');
        if (!close) return 0;
        n = (size_t)(close - h - 1);
        h++;
    } else {
        const char *colon = strchr(h, ':');
        n = colon ? (size_t)(colon - h) : strlen(h);
    }
    if (n >= sizeof name) return 0;
    memcpy(name, h, n);
    name[n] = 0;
    if (n && name[n - 1] == '.') name[--n] = 0;
    static const char *const local[] = {"localhost", "127.0.0.1", "::1"};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        if (!strcasecmp(name, local[i])) return 1;
    if (n > 10 && !strcasecmp(name + n - 10, ".localhost")) return 1;
    const char *bound = s->opts.host ? s->opts.host : "127.0.0.1";
    if (strcmp(bound, "0.0.0.0") && strcmp(bound, "::") && !strcasecmp(name, bound)) return 1;
    for (int i = 0; i < s->opts.n_allow_hosts; i++)
        if (!strcmp(s->opts.allow_hosts[i], "*") || !strcasecmp(name, s->opts.allow_hosts[i]))
            return 1;
    return 0;
}

static int json_content_type(struct MHD_Connection *c) {
    const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!t) return 0;
    while (*t == ' ')
        t++;
    return !strncasecmp(t, "application/json", 16) && (t[16] == 0 || t[16] == ';' || t[16] == ' ');
}

typedef struct {
    int n;
    char first[32];
    int conflict;
} clen_scan;

static enum MHD_Result scan_clen(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value) {
    (void)kind;
    clen_scan *cs = cls;
    if (strcasecmp(key, "Content-Length")) return MHD_YES;
    if (cs->n++ == 0)
        snprintf(cs->first, sizeof cs->first, "%s", value ? value : "");
    else if (strcmp(cs->first, value ? value : ""))
        cs->conflict = 1;
    return MHD_YES;
}

/* ---- the access handler --------------------------------------------------------------------- */

static void set_phase(lily_conn *lc, int phase) {
    if (lc) __atomic_store_n(&lc->phase, phase, __ATOMIC_RELEASE);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    (void)version;
    lily_srv *s = cls;
    const char *arg, *want;
    route rt = find_route(url, &arg, &want);
    lily_api_error e;
    if (!*con_cls) {
        conn *k = lily_xcalloc(1, sizeof *k);
        *con_cls = k;
        t_cur = k;
        k->t0 = lily_now();
        k->wall = lily_reqlog_wall();
        snprintf(k->method, sizeof k->method, "%s", method);
        snprintf(k->path, sizeof k->path, "%s", url);
        k->anthropic = rt == R_MESSAGES || rt == R_COUNT_TOKENS;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        k->lc = ci ? ci->socket_context : NULL;
        if (k->lc) __atomic_add_fetch(&k->lc->n_requests, 1, __ATOMIC_ACQ_REL);
        if (k->lc && k->lc->relayed) /* libmicrohttpd sees the pair (tlsrelay.c) */
            lily_reqlog_client((const struct sockaddr *)k->lc->addr, k->client, sizeof k->client);
        else
            client_name(c, k->client, sizeof k->client);
        set_phase(k->lc, 1);
        if (!host_allowed(s, c)) {
            lily_api_fail(&e, 403, "invalid_request_error", "host_not_allowed", NULL,
                          "Host header not allowed (start the server with --allow-host NAME)");
            return send_error(s, c, &e);
        }
        clen_scan cs = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, scan_clen, &cs);
        if (cs.conflict) {
            lily_api_fail(&e, 400, "invalid_request_error", "invalid_content_length", NULL,
                          "conflicting Content-Length headers");
            return send_error(s, c, &e);
        }
        if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
            const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
            if (origin && !origin_allowed(s, origin)) {
                lily_api_fail(&e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                              "origin not allowed");
                return send_error(s, c, &e);
            }
            struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            const char *hdrs =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    hdrs ? hdrs : "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
            add_conn_headers(s, r);
            add_cors(s, c, r);
            enum MHD_Result rc = MHD_queue_response(c, 204, r);
            MHD_destroy_response(r);
            count(s, 204);
            return rc;
        }
        if (rt == R_NONE) {
            lily_api_fail(&e, 404, "invalid_request_error", "unknown_url", NULL,
                          "Unknown request URL: %s %s", method, url);
            return send_error(s, c, &e);
        }
        if (strcmp(method, want) && !(rt <= R_METRICS && !strcmp(method, "HEAD"))) {
            lily_api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                          "Method %s is not allowed for %s (use %s)", method, url, want);
            return send_error(s, c, &e);
        }
        if (rt != R_HEALTH && rt != R_MODELS && rt != R_MODEL && !authorized(s, c)) {
            lily_api_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                          "Incorrect or missing API key (send Authorization: Bearer <key>)");
            return send_error(s, c, &e);
        }
        if (rt > R_METRICS && !json_content_type(c)) {
            lily_api_fail(&e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                          "Content-Type must be application/json");
            return send_error(s, c, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->opts.max_body) {
            lily_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                          "request body of %s bytes exceeds the limit of %zu bytes", cl,
                          s->opts.max_body);
            return send_error(s, c, &e);
        }
        if (rt > R_METRICS) { /* refuse before reading a body that could not be queued */
            pthread_mutex_lock(&s->qmu);
            int full = s->admitted >= s->q_cap;
            pthread_mutex_unlock(&s->qmu);
            if (full) {
                lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL,
                              "The server is busy (request queue full); retry shortly");
                e.retry_after = 1;
                pthread_mutex_lock(&s->metrics.mu);
                s->metrics.rejected_busy++;
                pthread_mutex_unlock(&s->metrics.mu);
                return send_error(s, c, &e);
            }
        }
        return MHD_YES;
    }
    conn *k = *con_cls;
    t_cur = k;
    if (*upload_size) {
        if (!k->too_big && k->body.len + *upload_size > s->opts.max_body) {
            k->too_big = 1;
            lily_sb_free(&k->body);
        }
        if (!k->too_big) lily_sb_append(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    set_phase(k->lc, 2);
    if (k->too_big) {
        lily_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body exceeds the limit of %zu bytes", s->opts.max_body);
        return send_error(s, c, &e);
    }
    if (rt > R_METRICS) return task_route(s, c, rt, k);
    return get_route(s, c, rt, arg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)c;
    lily_srv *s = cls;
    conn *k = *con_cls;
    if (!k) return;
    if (t_cur == k) t_cur = NULL;
    lily_job *j = k->job;
    if (s->log_format != LILY_LOG_NONE) {
        lily_reqlog_entry x = {.wall = k->wall,
                               .client = k->client,
                               .method = k->method,
                               .path = k->path,
                               .status = k->status,
                               .ttft_s = -1,
                               .queue_s = -1,
                               .total_s = lily_now() - k->t0};
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && x.status < 400)
            x.status = 499; /* the client closed the connection before the end */
        if (j) {
            pthread_mutex_lock(&j->mu);
            x.has_tokens = j->state == JOB_DONE && j->status != 503 &&
                           lily_task_generates(j->task) && !j->failed;
            x.n_prompt = j->n_prompt;
            x.n_cached = j->cached_tokens;
            x.n_gen = j->n_gen;
            if (j->t_first > 0) x.ttft_s = j->t_first - k->t0;
            x.queue_s = j->t_started > 0 && j->t_queued > 0 ? j->t_started - j->t_queued : -1;
            pthread_mutex_unlock(&j->mu);
        }
        lily_reqlog_write(stderr, s->log_format, &x);
    }
    if (k->lc) { /* a kept-alive connection: the next head's deadlines count from now */
        pthread_mutex_lock(&s->lmu);
        k->lc->job = NULL;
        k->lc->t0 = lily_now();
        __atomic_store_n(&k->lc->phase, 0, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&s->lmu);
    }
    if (j) {
        pthread_mutex_lock(&j->mu);
        j->conn = NULL;
        j->suspended = 0;
        if (j->state != JOB_DONE) j->cancelled = 1;
        pthread_mutex_unlock(&j->mu);
        lily_job_release(j);
    }
    lily_sb_free(&k->body);
    free(k);
    *con_cls = NULL;
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code) {
    lily_srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = lily_front_started(s, conn_fd(c));
    } else if (*socket_context) {
        lily_front_closed(s, *socket_context);
        *socket_context = NULL;
    }
}

/* ---- the sweep (front thread, lmu held) ----------------------------------------------------- */

void lily_http_sweep(lily_srv *s, double now) {
    for (lily_conn *lc = s->conns; lc; lc = lc->next) {
        if (lc->state != CONN_MHD) continue;
        int phase = __atomic_load_n(&lc->phase, __ATOMIC_ACQUIRE);
        /* read deadlines, from accept: not renewed by each byte */
        if (!lc->killed && ((phase < 1 && now - lc->t0 > s->opts.header_timeout) ||
                            (phase < 2 && now - lc->t0 > s->opts.body_timeout))) {
            shutdown(lc->fd, SHUT_RDWR);
            lc->killed = 1;
        }
        lily_job *j = lc->job;
        if (!j) continue;
        pthread_mutex_lock(&j->mu);
        int stream = j->prepared && !j->failed && j->req.stream;
        if (j->suspended) {
            if (socket_gone(lc->fd)) {
                j->cancelled = 1;
                lily_job_wake(j);
            } else if (!j->probed && socket_rdhup(lc->fd)) {
                /* closed, or only half-closed (answered all the same): a write tells them
                 * apart, as the peer of a closed socket answers it with a reset */
                j->probed = 1;
                if (stream) {
                    j->last_drain = 0; /* a keep-alive comment at once */
                    lily_job_wake(j);
                } else if (lc->http11) { /* through the relay (relay.c), TLS or not */
                    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
                    ssize_t w = send(lc->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
                    (void)w;
                }
            } else if (stream && now - j->last_drain >= KEEPALIVE_S) {
                lily_job_wake(j);
            }
        } else if (stream && j->last_drain > 0 && j->out.len &&
                   now - j->last_drain > s->opts.send_timeout) {
            /* the reader stopped reading: its bytes wait, the slot is held. Only once the stream
             * has started (start_stream sets last_drain): between the wake of a prepared job and
             * libmicrohttpd calling the handler again, output may already wait in j->out with
             * nobody to blame (TLS handshakes on the same thread make that window long) */
            j->cancelled = 1;
            shutdown(lc->fd, SHUT_RDWR);
        }
        pthread_mutex_unlock(&j->mu);
    }
}

/* ---- start and stop ------------------------------------------------------------------------- */

static void wake_all(lily_srv *s) {
    pthread_mutex_lock(&s->lmu);
    for (lily_conn *lc = s->conns; lc; lc = lc->next) {
        if (!lc->job) continue;
        pthread_mutex_lock(&lc->job->mu);
        lily_job_wake(lc->job);
        pthread_mutex_unlock(&lc->job->mu);
    }
    pthread_mutex_unlock(&s->lmu);
}

/* libmicrohttpd's error log, less what it says of the TLS relay's local sockets, which have no
 * TCP options to set (TCP_NODELAY, TCP_CORK and the push it would have made with them). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if ((!strncmp(fmt, "Setting ", 8) && strstr(fmt, " option to ")) ||
        !strncmp(fmt, "Failed to push the data", 23))
        return;
    vfprintf(stderr, fmt, ap);
}

int lily_http_serve(lily_srv *s, volatile int *stop, lily_err *e) {
    if (lily_front_listen(s, e)) return -1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_NO_LISTEN_SOCKET;
    /* MHD's own log reports every client that hangs up mid-stream: noise under --quiet */
    if (!s->opts.quiet) flags |= MHD_USE_ERROR_LOG;
    if (s->opts.tls_cert) { /* terminated by the front (relay.c) */
        char *cert = NULL, *key = NULL;
        int rc = lily_read_file(s->opts.tls_cert, 1 << 20, &cert, NULL, e) ||
                 lily_read_file(s->opts.tls_key, 1 << 20, &key, NULL, e) ||
                 lily_tls_init(cert, key, e);
        free(cert), free(key);
        if (rc) {
            close(s->listen_fd);
            return -1;
        }
    }
    s->prep = lily_xcalloc((size_t)s->q_cap, sizeof *s->prep);
    pthread_cond_init(&s->pcv, NULL);
    /* idle limit between bytes once libmicrohttpd has the connection (the read deadlines are
     * the sweep's); a suspended connection does not time out */
    unsigned idle = (unsigned)(s->opts.body_timeout + 0.5);
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                              NULL, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, notify_conn, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)s->opts.max_conns + 16, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                              (size_t)64 * 1024, MHD_OPTION_END);
    if (!s->mhd) {
        lily_tls_free();
        close(s->listen_fd);
        return lily_fail(e, "cannot start the HTTP daemon (%s)", strerror(errno));
    }
    if (lily_front_start(s, e) || pthread_create(&s->prep_thread, NULL, prep_main, s)) {
        MHD_stop_daemon(s->mhd);
        lily_tls_free();
        return e->msg[0] ? -1 : lily_fail(e, "cannot start thread");
    }
    const char *host = s->opts.host ? s->opts.host : "127.0.0.1";
    if (!s->opts.quiet) {
        fprintf(stderr, "lily serve: %s listening on %s://%s%s%s:%d/v1 (ctx %d)\n", s->model_id,
                s->opts.tls_cert ? "https" : "http", strchr(host, ':') ? "[" : "", host,
                strchr(host, ':') ? "]" : "", s->port, s->ctx);
    }
    if (s->opts.port_file) {
        FILE *f = fopen(s->opts.port_file, "w");
        if (f) {
            fprintf(f, "%d\n", s->port);
            fclose(f);
        }
    }
    while (!*stop)
        usleep(100 * 1000);
    /* cancel running work first, so connections waiting on their jobs end promptly; no
     * connection may stay suspended when the daemon stops */
    __atomic_store_n(&s->shutdown, 1, __ATOMIC_RELEASE);
    lily_front_stop(s);
    pthread_mutex_lock(&s->qmu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->pcv);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->prep_thread, NULL);
    for (int i = 0; i < 20; i++) {
        wake_all(s);
        usleep(20 * 1000);
    }
    MHD_stop_daemon(s->mhd);
    free(s->prep);
    pthread_cond_destroy(&s->pcv);
    lily_tls_free();
    return 0;
}
