/* The accepting front of `lily serve`: one thread owns the listening socket and an epoll set of
 * connections whose first request head has not arrived yet. It counts connections (in all and per
 * client address) and refuses those over the limits with a JSON error; it peeks at the first
 * request head (MSG_PEEK: the bytes stay in the socket; with TLS, on the plaintext end of the
 * relay's pair once the handshake is over) and answers what libmicrohttpd would answer with an
 * HTML page (a bad request line, 414, 431, 505, a bad or conflicting Content-Length, a malformed
 * chunked body) with the OpenAI error JSON itself; a head that does not arrive within
 * --header-timeout gets 408. A screened connection goes to libmicrohttpd (MHD_add_connection)
 * through a relay (relay.c), which screens the later requests of a kept-alive connection. Waiting
 * connections cost an fd and ~200 bytes. The relays run on this thread too. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timer.h"
#include "server/anthropic.h"
#include "server/reqlog.h"
#include "server/srv.h"

#define WINDOW   LILY_SCREEN_WINDOW
#define LINGER_S 2.0

/* ---- connections ---------------------------------------------------------------------------- */

static const char *reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* An error response from the front (in Anthropic's shape for /v1/messages), appended to out. */
static void error_bytes(const lily_api_error *e, int anthropic, lily_sb *out) {
    lily_sb b = {0};
    if (anthropic)
        lily_anth_error_json(e, &b);
    else
        lily_api_error_json(e, &b);
    char head[320];
    int n =
        snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n%s\r\n",
                 e->status, reason(e->status), b.len, e->retry_after ? "Retry-After: 1\r\n" : "");
    lily_sb_append(out, head, (size_t)n);
    lily_sb_append(out, b.data, b.len);
    lily_sb_free(&b);
}

/* Writes an error response on a socket that libmicrohttpd has not seen. */
static void write_error(int fd, const lily_api_error *e, int anthropic) {
    lily_sb out = {0};
    error_bytes(e, anthropic, &out);
    ssize_t w = send(fd, out.data, out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* best effort: a client that does not take ~400 bytes gets nothing */
    lily_sb_free(&out);
}

/* Per-address counts: a small open-addressing table (under lmu). */
typedef struct {
    unsigned char ip[16];
    int n;
} ipcount;
static ipcount *g_ips;
static size_t g_ips_cap;

static ipcount *ip_slot(const unsigned char *ip, int create) {
    if (!g_ips) return NULL;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 16; i++)
        h = (h ^ ip[i]) * 1099511628211ull;
    for (size_t k = 0; k < g_ips_cap; k++) {
        ipcount *c = &g_ips[(h + k) & (g_ips_cap - 1)];
        if (c->n > 0 && !memcmp(c->ip, ip, 16)) return c;
        if (c->n == -1) break; /* never used: the key is not further on */
    }
    if (!create) return NULL;
    for (size_t k = 0; k < g_ips_cap; k++) {
        ipcount *c = &g_ips[(h + k) & (g_ips_cap - 1)];
        if (c->n <= 0) {
            memcpy(c->ip, ip, 16);
            c->n = 0;
            return c;
        }
    }
    return NULL;
}

static lily_conn *g_byfd[1 << 16]; /* the record of each open socket, for STARTED */

static void conn_unlink(lily_srv *s, lily_conn *c) {
    if (c->fd >= 0 && c->fd < (1 << 16) && g_byfd[c->fd] == c) g_byfd[c->fd] = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    ipcount *ic = ip_slot(c->ip, 0);
    if (ic && ic->n > 0) ic->n--;
    free(c->addr);
    free(c);
}

static void conn_close(lily_srv *s, lily_conn *c) {
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conn_unlink(s, c);
}

/* Method and path (without the query) from what of the request line arrived ("-" where it did
 * not, or is not one). */
static void head_target(const char *head, size_t n, char method[16], char path[256]) {
    strcpy(method, "-");
    strcpy(path, "-");
    size_t i = 0;
    while (i < n && i < 15 && head[i] >= 'A' && head[i] <= 'Z')
        i++;
    if (i > 0 && i < n && head[i] == ' ') {
        memcpy(method, head, i);
        method[i] = 0;
        size_t p = i + 1, k = 0;
        while (p < n && k < 255 && head[p] != ' ' && head[p] != '?' && head[p] != '\r' &&
               head[p] != '\n') {
            unsigned char ch = (unsigned char)head[p++];
            path[k++] = ch > ' ' && ch < 0x7f ? (char)ch : '?';
        }
        path[k ? k : 1] = 0;
    }
}

/* The request log's line for a request the front answered itself. */
static void log_reject(lily_srv *s, const struct sockaddr_storage *addr, double t0, double now,
                       const char *method, const char *path, int status) {
    if (s->log_format == LILY_LOG_NONE) return;
    char client[80];
    lily_reqlog_client((const struct sockaddr *)addr, client, sizeof client);
    lily_reqlog_entry x = {.wall = lily_reqlog_wall() - (now - t0),
                           .client = client,
                           .method = method,
                           .path = path,
                           .status = status,
                           .queue_s = -1,
                           .ttft_s = -1,
                           .total_s = now - t0};
    lily_reqlog_write(stderr, s->log_format, &x);
}

/* Logs a refused request (its head in head[0..n)); whether it asked for /v1/messages. */
static int log_refused(lily_srv *s, const struct sockaddr_storage *addr, double t0, double now,
                       const char *head, size_t n, int status) {
    char method[16], path[256];
    head_target(head, n, method, path);
    log_reject(s, addr, t0, now, method, path, status);
    const char *url = !strncmp(path, "/v1/", 4) ? path + 3 : path;
    return !strncmp(url, "/messages", 9) && (!url[9] || url[9] == '/' || url[9] == '?');
}

void lily_front_refusal(lily_srv *s, const struct sockaddr_storage *addr, double t0, double now,
                        const char *head, size_t n, const lily_api_error *e, lily_sb *out) {
    error_bytes(e, log_refused(s, addr, t0, now, head, n, e->status), out);
}

/* Answers an error and lets the client read it: half-close, then drain until EOF or 2 s. */
static void conn_reject(lily_srv *s, lily_conn *c, const lily_api_error *e, double now) {
    char junk[4096];
    ssize_t h = recv(c->fd, junk, sizeof junk, MSG_PEEK | MSG_DONTWAIT);
    int anthropic = log_refused(s, c->addr, c->t0, now, junk, h > 0 ? (size_t)h : 0, e->status);
    while (recv(c->fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
    write_error(c->fd, e, anthropic);
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_LINGER;
    c->linger_until = now + LINGER_S;
}

static void conn_handoff(lily_srv *s, lily_conn *c, double now) {
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    c->state = CONN_MHD;
    c->phase = 0;
    if (!c->relayed) { /* plain: the relay screens the requests after this one (keep-alive) */
        int pfd = lily_relay_wrap(s, c, now);
        if (pfd >= 0 && pfd < (1 << 16)) {
            g_byfd[c->fd] = NULL;
            c->fd = pfd;
            g_byfd[pfd] = c;
            c->relayed = 1;
        } else if (pfd >= 0) {
            close(pfd); /* the relay sees the pair closed and ends the connection */
            conn_unlink(s, c);
            return;
        }
    }
    int fd = c->fd;
    struct sockaddr_storage addr = *c->addr;
    socklen_t alen = (socklen_t)c->addr_len;
    if (c->relayed) { /* a local socket: libmicrohttpd then leaves TCP options alone */
        memset(&addr, 0, sizeof addr);
        addr.ss_family = AF_UNIX;
        alen = sizeof(sa_family_t);
    }
    pthread_mutex_unlock(&s->lmu);
    enum MHD_Result ok = MHD_add_connection(s->mhd, fd, (struct sockaddr *)&addr, alen);
    pthread_mutex_lock(&s->lmu);
    if (ok != MHD_YES) conn_unlink(s, c); /* libmicrohttpd closed the socket */
}

lily_conn *lily_front_started(lily_srv *s, int fd) {
    pthread_mutex_lock(&s->lmu);
    lily_conn *c = fd >= 0 && fd < (1 << 16) ? g_byfd[fd] : NULL;
    if (c && (c->fd != fd || c->state != CONN_MHD)) c = NULL;
    pthread_mutex_unlock(&s->lmu);
    return c;
}

void lily_front_closed(lily_srv *s, lily_conn *c) {
    pthread_mutex_lock(&s->lmu);
    conn_unlink(s, c);
    pthread_mutex_unlock(&s->lmu);
}

static void on_accept(lily_srv *s, double now) {
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        int fd =
            accept4(s->listen_fd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        unsigned char ip[16] = {0};
        if (addr.ss_family == AF_INET) {
            memcpy(ip, &((struct sockaddr_in *)&addr)->sin_addr, 4);
        } else if (addr.ss_family == AF_INET6) {
            memcpy(ip, &((struct sockaddr_in6 *)&addr)->sin6_addr, 16);
            static const unsigned char v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
            if (!memcmp(ip, v4map, 12)) memmove(ip, ip + 12, 4), memset(ip + 4, 0, 12);
        }
        lily_api_error e;
        ipcount *ic = ip_slot(ip, 1);
        if (fd >= (1 << 16) || s->n_conns >= s->opts.max_conns || !ic) {
            lily_api_fail(&e, 503, "server_error", "server_overloaded", NULL,
                          "too many open connections (limit %d); retry shortly", s->opts.max_conns);
            e.retry_after = 1;
            if (!s->opts.tls_cert) write_error(fd, &e, 0); /* over TLS: no handshake, no answer */
            close(fd);
            log_reject(s, &addr, now, now, "-", "-", e.status);
            continue;
        }
        if (ic->n >= s->opts.conns_per_ip) {
            lily_api_fail(&e, 429, "rate_limit_exceeded", "too_many_connections", NULL,
                          "too many open connections from this address (limit %d)",
                          s->opts.conns_per_ip);
            e.retry_after = 1;
            if (!s->opts.tls_cert) write_error(fd, &e, 0); /* over TLS: no handshake, no answer */
            close(fd);
            log_reject(s, &addr, now, now, "-", "-", e.status);
            continue;
        }
        ic->n++;
        lily_conn *c = lily_xcalloc(1, sizeof *c);
        c->fd = fd;
        c->t0 = now;
        memcpy(c->ip, ip, 16);
        c->addr = lily_xmalloc(sizeof addr);
        *c->addr = addr;
        c->addr_len = alen;
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n_conns++;
        if (s->opts.tls_cert) /* TLS: the relay's handshake first, then the screen */
            lily_relay_start(s, c, now);
        else
            lily_front_screen(s, c, fd);
    }
}

void lily_front_screen(lily_srv *s, lily_conn *c, int fd) {
    if (fd >= (1 << 16)) {
        close(fd);
        conn_unlink(s, c);
        return;
    }
    c->relayed = c->state == CONN_TLS;
    c->fd = fd;
    g_byfd[fd] = c;
    c->state = CONN_SCREEN;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

void lily_front_drop(lily_srv *s, lily_conn *c) {
    conn_unlink(s, c);
}

static char g_window[WINDOW];

static void on_readable(lily_srv *s, lily_conn *c, double now) {
    if (c->state == CONN_LINGER) {
        char junk[4096];
        ssize_t r;
        while ((r = recv(c->fd, junk, sizeof junk, MSG_DONTWAIT)) > 0) {}
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) conn_close(s, c);
        return;
    }
    ssize_t r = recv(c->fd, g_window, sizeof g_window, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        conn_close(s, c);
        return;
    }
    if (r < 0) return;
    lily_api_error e;
    int rc = lily_http_screen(g_window, (size_t)r, (size_t)r == sizeof g_window, &c->http11, &e);
    if (rc < 0)
        conn_reject(s, c, &e, now);
    else if (rc == 0)
        conn_handoff(s, c, now);
}

static void sweep(lily_srv *s, double now) {
    for (lily_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == CONN_LINGER && now > c->linger_until) {
            conn_close(s, c);
        } else if (c->state == CONN_SCREEN && now - c->t0 > s->opts.header_timeout) {
            lily_api_error e;
            lily_api_fail(&e, 408, "invalid_request_error", "request_timeout", NULL,
                          "the request head did not arrive within %.0f s", s->opts.header_timeout);
            conn_reject(s, c, &e, now);
        }
    }
    lily_http_sweep(s, now);
}

static void *front_main(void *arg) {
    lily_srv *s = arg;
    struct epoll_event evs[64];
    double last_sweep = 0;
    while (!s->front_stop) {
        int n = epoll_wait(s->epoll_fd, evs, 64, 100);
        double now = lily_now();
        pthread_mutex_lock(&s->lmu);
        for (int i = 0; i < n; i++) {
            if (!evs[i].data.ptr)
                on_accept(s, now);
            else if (lily_relay_tagged(evs[i].data.ptr))
                lily_relay_event(s, evs[i].data.ptr, evs[i].events, now);
            else
                on_readable(s, evs[i].data.ptr, now);
        }
        if (now - last_sweep >= 0.2) {
            sweep(s, now);
            lily_relay_sweep(s, now);
            last_sweep = now;
        }
        lily_relay_reap();
        pthread_mutex_unlock(&s->lmu);
    }
    return NULL;
}

int lily_front_listen(lily_srv *s, lily_err *e) {
    const char *host = s->opts.host ? s->opts.host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)s->opts.port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)s->opts.port);
        sl = sizeof *a6;
    } else {
        return lily_fail(e, "--host must be an IPv4 or IPv6 address, got '%s'", host);
    }
    /* room for the connection limit: raise the soft fd limit to the hard one */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* a relayed connection holds 3 fds: the client's socket and the two ends of its pair */
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)s->opts.max_conns * 3 + 64 > rl.rlim_cur)
        s->opts.max_conns = rl.rlim_cur > 256 ? (int)((rl.rlim_cur - 64) / 3) : 64;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) return lily_fail(e, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 1024)) {
        int err = errno;
        close(fd);
        return lily_fail(e, "cannot listen on %s:%d (%s)", host, s->opts.port, strerror(err));
    }
    sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET ? a4->sin_port : a6->sin6_port);
    s->listen_fd = fd;
    return 0;
}

int lily_front_start(lily_srv *s, lily_err *e) {
    g_ips_cap = 1;
    while (g_ips_cap < (size_t)s->opts.max_conns * 2)
        g_ips_cap *= 2;
    g_ips = lily_xcalloc(g_ips_cap, sizeof *g_ips);
    for (size_t i = 0; i < g_ips_cap; i++)
        g_ips[i].n = -1;
    pthread_mutex_init(&s->lmu, NULL);
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (s->epoll_fd < 0 || epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &ev))
        return lily_fail(e, "epoll: %s", strerror(errno));
    if (pthread_create(&s->front, NULL, front_main, s)) return lily_fail(e, "cannot start thread");
    return 0;
}

void lily_front_stop(lily_srv *s) {
    s->front_stop = 1;
    pthread_join(s->front, NULL);
    close(s->listen_fd);
    pthread_mutex_lock(&s->lmu);
    lily_relay_stop_all(s);
    for (lily_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state != CONN_MHD) conn_close(s, c);
    }
    pthread_mutex_unlock(&s->lmu);
}
