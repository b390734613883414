/* HTTP front of `lily serve` on libmicrohttpd (thread per connection): routing, body limits,
 * API keys (§8.1), CORS (§8.2), and the two ways an answer leaves: one JSON body, or a stream of
 * SSE events fed by the inference thread with ": " keep-alive comments while nothing else is
 * ready. A vanished client is noticed by write failure or by polling its socket for hang-up, and
 * cancels its job (§7). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timer.h"
#include "server/anthropic.h"
#include "server/reqlog.h"
#include "server/responses.h"
#include "server/srv.h"

#define KEEPALIVE_S 10.0

typedef struct conn {
    lily_sb body;
    int too_big;
    /* for the request log (reqlog.h) and the error shape */
    double t0, wall;
    char method[16];
    char path[256];
    char client[80];
    int status;
    int anthropic; /* /v1/messages: errors in Anthropic's shape */
    lily_job *job; /* a reference, for the log's token counts */
} conn;

/* The request being handled on this connection's thread (thread per connection): where the
 * answer's status is noted, and which error shape it takes. */
static _Thread_local conn *t_cur;

typedef struct stream {
    lily_job *job;
    int fd;
    double last_send;
} stream;

/* ---- helpers -------------------------------------------------------------------------------- */

static int socket_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
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
    snprintf(out, n, "-");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    char a[INET6_ADDRSTRLEN];
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)(const void *)sa;
        if (inet_ntop(AF_INET, &v4->sin_addr, a, sizeof a))
            snprintf(out, n, "%s:%u", a, (unsigned)ntohs(v4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (inet_ntop(AF_INET6, &v6->sin6_addr, a, sizeof a))
            snprintf(out, n, "[%s]:%u", a, (unsigned)ntohs(v6->sin6_port));
    }
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
                       !busy, busy, q);
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

static enum MHD_Result tokenize_route(lily_srv *s, struct MHD_Connection *c, route rt,
                                      const conn *k) {
    lily_api_error e;
    cJSON *j = cJSON_ParseWithLength(lily_sb_str(&k->body), k->body.len);
    lily_sb b = {0};
    lily_err err;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        lily_api_bad(&e, "invalid_json", NULL, "request body must be a JSON object");
        return send_error(s, c, &e);
    }
    if (rt == R_TOKENIZE) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!t) t = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        int32_t *ids = NULL;
        size_t n = 0;
        if (!cJSON_IsString(t)) {
            lily_api_bad(&e, "invalid_type", "content", "'content' must be a string");
        } else if (lily_tokenizer_encode(s->tok, t->valuestring, strlen(t->valuestring), &ids, &n,
                                         &err)) {
            lily_api_bad(&e, "invalid_value", "content", "%s", err.msg);
        } else {
            lily_sb_puts(&b, "{\"tokens\":[");
            for (size_t i = 0; i < n; i++)
                lily_sb_printf(&b, "%s%d", i ? "," : "", ids[i]);
            lily_sb_printf(&b, "],\"count\":%zu,\"max_model_len\":%d}", n, s->ctx);
        }
        free(ids);
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
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
            lily_api_bad(&e, "invalid_type", "tokens", "'tokens' must be an array of token ids");
        else if (lily_tokenizer_decode(s->tok, ids, (size_t)n, &text, &len, &err))
            ok = 0, lily_api_bad(&e, "invalid_value", "tokens", "%s", err.msg);
        if (ok) {
            lily_sb_puts(&b, "{\"content\":");
            lily_sb_json_str(&b, text, len);
            lily_sb_putc(&b, '}');
        }
        free(text);
        free(ids);
    }
    cJSON_Delete(j);
    if (!b.len) return send_error(s, c, &e);
    return send_sb(s, c, 200, &b);
}

/* ---- streaming ------------------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    lily_job *j = st->job;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out.len) {
            size_t n = j->out.len < max ? j->out.len : max;
            memcpy(buf, j->out.data, n);
            lily_sb_drop_front(&j->out, n);
            pthread_mutex_unlock(&j->mu);
            st->last_send = lily_now();
            return (ssize_t)n;
        }
        if (j->state == JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        int rc = pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (rc != ETIMEDOUT) continue;
        if (socket_gone(st->fd)) {
            j->cancelled = 1;
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (lily_now() - st->last_send >= KEEPALIVE_S) {
            char msg[96];
            int n;
            if (j->state == JOB_QUEUED)
                n = snprintf(msg, sizeof msg, ": queued\n\n");
            else if (j->prefill_total > 0 && j->prefill_done < j->prefill_total)
                n = snprintf(msg, sizeof msg, ": prefill %d/%d\n\n", j->prefill_done,
                             j->prefill_total);
            else
                n = snprintf(msg, sizeof msg, ": ping\n\n");
            pthread_mutex_unlock(&j->mu);
            if ((size_t)n > max) n = (int)max;
            memcpy(buf, msg, (size_t)n);
            st->last_send = lily_now();
            return n;
        }
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    __atomic_store_n(&st->job->cancelled, 1, __ATOMIC_RELAXED); /* no-op once it is done */
    lily_job_release(st->job);
    free(st);
}

/* ---- completions ---------------------------------------------------------------------------- */

static enum MHD_Result completion_route(lily_srv *s, struct MHD_Connection *c, route rt, conn *k) {
    lily_api_error e;
    lily_job *j;
    if (rt == R_COUNT_TOKENS) {
        lily_sb b = {0};
        if (lily_anth_count_tokens(s, lily_sb_str(&k->body), k->body.len, &b, &e))
            return send_error(s, c, &e);
        return send_sb(s, c, 200, &b);
    } else if (rt == R_MESSAGES) {
        j = lily_anth_prepare(s, lily_sb_str(&k->body), k->body.len, &e);
    } else if (rt == R_RESPONSES) {
        j = lily_resp_prepare(s, lily_sb_str(&k->body), k->body.len, &e);
    } else {
        lily_request req;
        lily_request_limits lim = {.max_body = s->opts.max_body, .max_messages = 100000};
        if (lily_request_parse(rt == R_CHAT ? LILY_REQ_CHAT : LILY_REQ_COMPLETION,
                               lily_sb_str(&k->body), k->body.len, &lim, &req, &e))
            return send_error(s, c, &e);
        j = lily_job_prepare(s, &req, &e);
        lily_request_free(&req);
    }
    if (!j) return send_error(s, c, &e);
    pthread_mutex_lock(&j->mu); /* the log reads its counts when the request ends */
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    k->job = j;
    if (lily_sched_submit(s, j)) {
        lily_job_release(j);
        lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL,
                      "The server is busy (request queue full); retry shortly");
        e.retry_after = 1;
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.rejected_busy++;
        pthread_mutex_unlock(&s->metrics.mu);
        return send_error(s, c, &e);
    }
    int fd = conn_fd(c);
    if (j->req.stream) {
        stream *st = lily_xcalloc(1, sizeof *st);
        st->job = j;
        st->fd = fd;
        st->last_send = lily_now();
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                   stream_read, st, stream_free);
        if (!r) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        add_cors(s, c, r);
        if (fd >= 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        count(s, 200);
        return rc;
    }
    /* non-streaming: wait, watching the socket so a vanished client cancels its work */
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT && socket_gone(fd)) {
            j->cancelled = 1;
            break;
        }
    }
    int done = j->state == JOB_DONE, status = j->status;
    char cached[64];
    snprintf(cached, sizeof cached, "%d", j->cached_tokens);
    lily_sb body = j->out;
    memset(&j->out, 0, sizeof j->out);
    pthread_mutex_unlock(&j->mu);
    lily_job_release(j);
    if (!done || status == 503) {
        lily_sb_free(&body);
        if (done) {
            lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL, "shutting down");
            return send_error(s, c, &e);
        }
        /* the client is gone: answer anyway (MHD_NO would be logged as an internal error) */
        enum MHD_Result rc = send_body(s, c, 499, "text/plain", "", 0, NULL, NULL);
        k->status = 499;
        return rc;
    }
    enum MHD_Result rc = send_body(s, c, status, "application/json", lily_sb_str(&body), body.len,
                                   "x-lily-cached-tokens", cached);
    lily_sb_free(&body);
    return rc;
}

/* ---- the access handler --------------------------------------------------------------------- */

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
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        k->wall = (double)now.tv_sec + now.tv_nsec * 1e-9;
        snprintf(k->method, sizeof k->method, "%s", method);
        snprintf(k->path, sizeof k->path, "%s", url);
        k->anthropic = rt == R_MESSAGES || rt == R_COUNT_TOKENS;
        client_name(c, k->client, sizeof k->client);
        if (!strcmp(method, "OPTIONS")) { /* CORS preflight */
            const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
            if (origin && !origin_allowed(s, origin))
                return send_body(s, c, 403, "text/plain", "origin not allowed", 18, NULL, NULL);
            struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            const char *hdrs =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    hdrs ? hdrs : "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
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
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->opts.max_body) {
            lily_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                          "request body of %s bytes exceeds the limit of %zu bytes", cl,
                          s->opts.max_body);
            return send_error(s, c, &e);
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
    if (k->too_big) {
        lily_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body exceeds the limit of %zu bytes", s->opts.max_body);
        return send_error(s, c, &e);
    }
    if (rt == R_CHAT || rt == R_COMPLETIONS || rt >= R_MESSAGES)
        return completion_route(s, c, rt, k);
    if (rt == R_TOKENIZE || rt == R_DETOKENIZE) return tokenize_route(s, c, rt, k);
    return get_route(s, c, rt, arg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)c;
    lily_srv *s = cls;
    conn *k = *con_cls;
    if (!k) return;
    t_cur = NULL;
    if (s->log_format != LILY_LOG_NONE) {
        lily_reqlog_entry x = {.wall = k->wall,
                               .client = k->client,
                               .method = k->method,
                               .path = k->path,
                               .status = k->status,
                               .ttft_s = -1,
                               .total_s = lily_now() - k->t0};
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && x.status < 400)
            x.status = 499; /* the client closed the connection before the end */
        if (k->job) {
            lily_job *j = k->job;
            pthread_mutex_lock(&j->mu);
            x.has_tokens = j->state == JOB_DONE && j->status != 503;
            x.n_prompt = j->n_prompt;
            x.n_cached = j->cached_tokens;
            x.n_gen = j->n_gen;
            if (j->t_first > 0) x.ttft_s = j->t_first - k->t0;
            pthread_mutex_unlock(&j->mu);
        }
        lily_reqlog_write(stderr, s->log_format, &x);
    }
    lily_job_release(k->job);
    lily_sb_free(&k->body);
    free(k);
    *con_cls = NULL;
}

int lily_http_serve(lily_srv *s, volatile int *stop, lily_err *e) {
    struct sockaddr_in addr = {0};
    struct sockaddr_in6 addr6 = {0};
    const struct sockaddr *sa = (const struct sockaddr *)&addr;
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->opts.port);
    const char *host = s->opts.host ? s->opts.host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    /* MHD's own log reports every client that hangs up mid-stream: noise under --quiet */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
    int v6 = 0;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        addr6.sin6_family = AF_INET6;
        addr6.sin6_port = htons((uint16_t)s->opts.port);
        if (inet_pton(AF_INET6, host, &addr6.sin6_addr) != 1)
            return lily_fail(e, "--host must be an IPv4 or IPv6 address, got '%s'", host);
        sa = (const struct sockaddr *)&addr6;
        flags |= MHD_USE_IPv6;
        v6 = 1;
    }
    if (!s->opts.quiet) flags |= MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->opts.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
        MHD_OPTION_CONNECTION_LIMIT, 1000u, MHD_OPTION_END);
    if (!d) return lily_fail(e, "cannot listen on %s:%d (%s)", host, s->opts.port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : s->opts.port;
    if (!s->opts.quiet) {
        fprintf(stderr, "lily serve: %s listening on http://%s%s%s:%d/v1 (ctx %d)\n", s->model_id,
                v6 ? "[" : "", host, v6 ? "]" : "", port, s->ctx);
    }
    if (s->opts.port_file) {
        FILE *f = fopen(s->opts.port_file, "w");
        if (f) {
            fprintf(f, "%d\n", port);
            fclose(f);
        }
    }
    while (!*stop)
        usleep(100 * 1000);
    /* cancel running work first, so streams blocked on their jobs end promptly */
    __atomic_store_n(&s->shutdown, 1, __ATOMIC_RELAXED);
    MHD_stop_daemon(d);
    return 0;
}
