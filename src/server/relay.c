/* The relay between a client's socket and libmicrohttpd for `lily serve` (front thread): a
 * connection whose first request head passed the front's screen (with TLS: whose handshake is
 * over) gets a socketpair; libmicrohttpd serves the plaintext end and the relay pumps bytes
 * between the client and the other end. With TLS the relay is the TLS endpoint (GnuTLS; the front
 * screens the pair's end as it screens a plain socket). On the way in it screens every request
 * head with lily_http_screen_frame and follows each request to its end (Content-Length, or the
 * whole chunked body), so that on a kept-alive connection the second and later requests are held
 * to the same checks as the first: what libmicrohttpd would answer with an HTML page gets the
 * OpenAI error JSON, after the answers before it, and the connection closes.
 *
 * Memory: the way in holds at most one screen window (httphead.c) while a head arrives, the way out
 * 16 KiB; a client that stops reading stops the server side (the stall check of http.c then ends
 * it). The client's end of input (FIN, close_notify) becomes a write shutdown of the pair; the
 * server side's end (libmicrohttpd closed the connection) becomes close_notify, a write shutdown
 * and a short drain before the socket closes. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timer.h"
#include "server/srv.h"

#define OUT_BUF  (16 * 1024)
#define IN_MAX   LILY_SCREEN_WINDOW
#define LINGER_S 2.0

typedef enum { R_HANDSHAKE, R_OPEN, R_CLOSING } relay_state;

struct lily_relay {
    struct lily_relay *prev, *next;
    relay_state state;
    int dead;
    int cfd;              /* the client's socket */
    int pfd;              /* our end of the pair (-1 before it exists and once closed) */
    lily_conn *lc;        /* during the handshake: the connection record, counted by the front */
    unsigned cmask;       /* epoll interest of cfd and pfd now */
    unsigned pmask;       /* (0: not in the set) */
    double t0;            /* accepted */
    double t_sent;        /* bytes last went to the client */
    double t_req;         /* the request head being screened began to arrive */
    double linger_to;     /* R_CLOSING: close by then */
    int c_eof;            /* the client will send no more (or a request was refused) */
    int p_shut;           /* ... and the pair was told so */
    int p_eof;            /* the server side closed */
    int p_hup;            /* ... hung up while out was full: pfd out of the epoll set */
    gnutls_session_t ses; /* NULL: plain */
    struct sockaddr_storage addr;
    /* way in: in[0..fwd) may go to the pair; the rest is a head being screened */
    char *in;
    size_t in_len, fwd;
    unsigned long long body_left; /* body bytes of the current request still to come */
    lily_sb refusal;              /* the answer to a refused request, after the others */
    /* way out */
    char *out;
    size_t out_off, out_len;
};

static void pump(lily_srv *s, lily_relay *r, double now);

static gnutls_certificate_credentials_t g_cred;
static gnutls_priority_t g_prio;
static lily_relay *g_relays;
static lily_relay *g_dead; /* freed after the current batch of epoll events (lily_relay_reap) */

int lily_tls_init(const char *cert_pem, const char *key_pem, lily_err *e) {
    gnutls_datum_t c = {(unsigned char *)cert_pem, (unsigned)strlen(cert_pem)};
    gnutls_datum_t k = {(unsigned char *)key_pem, (unsigned)strlen(key_pem)};
    int rc = gnutls_certificate_allocate_credentials(&g_cred);
    if (!rc) rc = gnutls_certificate_set_x509_key_mem(g_cred, &c, &k, GNUTLS_X509_FMT_PEM);
    if (!rc) rc = gnutls_priority_init(&g_prio, NULL, NULL);
    if (rc) {
        lily_tls_free();
        return lily_fail(e, "TLS certificate or key: %s", gnutls_strerror(rc));
    }
    return 0;
}

void lily_tls_free(void) {
    if (g_prio) gnutls_priority_deinit(g_prio);
    if (g_cred) gnutls_certificate_free_credentials(g_cred);
    g_prio = NULL;
    g_cred = NULL;
}

/* ---- the client's transport: TLS or plain ---------------------------------------------------- */

enum { IO_AGAIN = -1, IO_FAIL = -2 };

static ssize_t c_recv(lily_relay *r, char *buf, size_t n) {
    if (!r->ses) {
        ssize_t k = recv(r->cfd, buf, n, MSG_DONTWAIT);
        if (k >= 0) return k;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_AGAIN : IO_FAIL;
    }
    for (;;) {
        ssize_t k = gnutls_record_recv(r->ses, buf, n);
        if (k >= 0) return k;
        if (k == GNUTLS_E_AGAIN || k == GNUTLS_E_INTERRUPTED) return IO_AGAIN;
        if (k == GNUTLS_E_PREMATURE_TERMINATION) return 0; /* a FIN without close_notify */
        if (gnutls_error_is_fatal((int)k)) return IO_FAIL;
        /* a warning alert, a key update: read on */
    }
}

static ssize_t c_send(lily_relay *r, const char *buf, size_t n) {
    if (!r->ses) {
        ssize_t k = send(r->cfd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k >= 0) return k;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_AGAIN : IO_FAIL;
    }
    ssize_t k = gnutls_record_send(r->ses, buf, n); /* after AGAIN: called again with the same */
    if (k >= 0) return k;
    return k == GNUTLS_E_AGAIN || k == GNUTLS_E_INTERRUPTED ? IO_AGAIN : IO_FAIL;
}

/* ---- epoll ---------------------------------------------------------------------------------- */

/* Relays share the front's epoll set with lily_conn records: their data carries tag bits (1: a
 * relay, 2: its pair end; allocations are 16-byte aligned). */
int lily_relay_tagged(void *ptr) {
    return (uintptr_t)ptr & 1;
}

static void set_mask(lily_srv *s, lily_relay *r, int fd, unsigned *cur, unsigned want) {
    if (fd < 0 || *cur == want) return;
    struct epoll_event ev = {.events = want,
                             .data.ptr = (void *)((uintptr_t)r | 1 | (fd == r->pfd ? 2 : 0))};
    if (!want)
        epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    else
        epoll_ctl(s->epoll_fd, *cur ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
    *cur = want;
}

static void update_masks(lily_srv *s, lily_relay *r) {
    unsigned cm = 0, pm = 0;
    if (r->state == R_HANDSHAKE) {
        cm = gnutls_record_get_direction(r->ses) ? EPOLLOUT : EPOLLIN;
    } else if (r->state == R_CLOSING) {
        cm = EPOLLIN;
    } else {
        cm = EPOLLERR; /* always in the set: a reset is news even while nothing is read */
        if (!r->c_eof && r->in_len < IN_MAX) cm |= EPOLLIN;
        if (r->out_off < r->out_len) cm |= EPOLLOUT;
        if (!r->p_eof && !r->out_len) pm |= EPOLLIN;
        if (r->fwd) pm |= EPOLLOUT;
        if (r->p_hup) pm = 0;
    }
    set_mask(s, r, r->cfd, &r->cmask, cm);
    set_mask(s, r, r->pfd, &r->pmask, pm);
}

/* ---- life ----------------------------------------------------------------------------------- */

static void relay_free(lily_srv *s, lily_relay *r) {
    if (r->dead) return;
    set_mask(s, r, r->cfd, &r->cmask, 0);
    set_mask(s, r, r->pfd, &r->pmask, 0);
    if (r->pfd >= 0) close(r->pfd);
    close(r->cfd);
    if (r->ses) gnutls_deinit(r->ses);
    if (r->lc) lily_front_drop(s, r->lc); /* the handshake did not end */
    if (r->prev)
        r->prev->next = r->next;
    else
        g_relays = r->next;
    if (r->next) r->next->prev = r->prev;
    free(r->in);
    free(r->out);
    lily_sb_free(&r->refusal);
    r->in = r->out = NULL;
    r->dead = 1;
    r->next = g_dead; /* another event of this batch may still name it */
    g_dead = r;
}

void lily_relay_reap(void) {
    while (g_dead) {
        lily_relay *r = g_dead;
        g_dead = r->next;
        free(r);
    }
}

/* The server side is done and its bytes are out: close_notify, then let the client read it. */
static void relay_finish(lily_srv *s, lily_relay *r, double now) {
    if (r->ses) gnutls_bye(r->ses, GNUTLS_SHUT_WR); /* best effort on a non-blocking socket */
    shutdown(r->cfd, SHUT_WR);
    set_mask(s, r, r->pfd, &r->pmask, 0);
    close(r->pfd);
    r->pfd = -1;
    r->state = R_CLOSING;
    r->linger_to = now + LINGER_S;
    update_masks(s, r);
}

static lily_relay *relay_new(lily_srv *s, int cfd, const struct sockaddr_storage *addr,
                             double now) {
    (void)s;
    lily_relay *r = lily_xcalloc(1, sizeof *r);
    r->cfd = cfd;
    r->pfd = -1;
    r->t0 = r->t_sent = r->t_req = now;
    r->addr = *addr;
    r->next = g_relays;
    if (g_relays) g_relays->prev = r;
    g_relays = r;
    return r;
}

/* The pair; returns libmicrohttpd's end, or -1. */
static int relay_open(lily_srv *s, lily_relay *r) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp)) return -1;
    r->pfd = sp[0];
    r->out = lily_xmalloc(OUT_BUF);
    r->state = R_OPEN;
    /* what a stream holds unsent on the way out is bounded here too (http.c sets the pair's) */
    int sb = s->opts.send_buffer < (256u << 10) ? (int)s->opts.send_buffer : 256 << 10;
    setsockopt(r->cfd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
    int one = 1; /* events leave as they come (libmicrohttpd's socket is the pair) */
    setsockopt(r->cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return sp[1];
}

void lily_relay_start(lily_srv *s, lily_conn *c, double now) {
    lily_relay *r = relay_new(s, c->fd, c->addr, now);
    r->lc = c;
    c->fd = -1; /* the record gets the pair's end once the handshake is over */
    c->state = CONN_TLS;
    if (gnutls_init(&r->ses, GNUTLS_SERVER | GNUTLS_NONBLOCK) ||
        gnutls_priority_set(r->ses, g_prio) ||
        gnutls_credentials_set(r->ses, GNUTLS_CRD_CERTIFICATE, g_cred)) {
        relay_free(s, r);
        return;
    }
    gnutls_certificate_server_set_request(r->ses, GNUTLS_CERT_IGNORE);
    gnutls_transport_set_int(r->ses, r->cfd);
    pump(s, r, now);
}

int lily_relay_wrap(lily_srv *s, lily_conn *c, double now) {
    lily_relay *r = relay_new(s, c->fd, c->addr, now);
    int fd = relay_open(s, r);
    if (fd < 0) {
        r->cfd = -1;
        relay_free(s, r);
        return -1;
    }
    pump(s, r, now);
    return fd;
}

/* ---- the way in: one request at a time ------------------------------------------------------ */

/* Refuses the request whose head starts at in[fwd]: what came before still goes to the server,
 * then the pair's write side closes; the answer follows the server's last bytes. */
static void refuse(lily_srv *s, lily_relay *r, const lily_api_error *e, double now) {
    lily_front_refusal(s, &r->addr, r->t_req, now, r->in + r->fwd, r->in_len - r->fwd, e,
                       &r->refusal);
    r->in_len = r->fwd;
    r->c_eof = 1;
}

/* Screens and frames what arrived; moves in[..fwd) on as far as requests are accepted. */
static void screen_in(lily_srv *s, lily_relay *r, double now) {
    while (!r->refusal.len) {
        if (r->body_left) {
            size_t take = r->in_len - r->fwd;
            if (take > r->body_left) take = (size_t)r->body_left;
            r->fwd += take;
            r->body_left -= take;
            if (r->body_left) return;
        }
        if (r->fwd == r->in_len) return;
        int h11;
        lily_http_frame f;
        lily_api_error e;
        size_t n = r->in_len - r->fwd;
        /* full: the head alone fills the window (bytes before it may still wait for the pair) */
        int rc = lily_http_screen_frame(r->in + r->fwd, n, n >= IN_MAX, &h11, &f, &e);
        if (rc == 1) return;
        if (rc < 0) {
            refuse(s, r, &e, now);
            return;
        }
        r->fwd += f.head_len;
        r->body_left = f.body_len;
        r->t_req = now;
    }
}

/* ---- the pump ------------------------------------------------------------------------------- */

static void pump(lily_srv *s, lily_relay *r, double now) {
    if (r->state == R_CLOSING) {
        char junk[4096];
        ssize_t n;
        while ((n = recv(r->cfd, junk, sizeof junk, MSG_DONTWAIT)) > 0) {}
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) relay_free(s, r);
        return;
    }
    if (r->state == R_HANDSHAKE) {
        int rc = gnutls_handshake(r->ses);
        if (rc == GNUTLS_E_SUCCESS) {
            int fd = relay_open(s, r);
            if (fd < 0) {
                relay_free(s, r);
                return;
            }
            lily_conn *c = r->lc;
            r->lc = NULL;
            lily_front_screen(s, c, fd); /* the first head, as on a plain socket */
        } else if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED ||
                   !gnutls_error_is_fatal(rc)) {
            update_masks(s, r);
            return;
        } else {
            relay_free(s, r); /* a failed handshake: nothing can be said to the client */
            return;
        }
    }
    for (int progress = 1; progress;) {
        progress = 0;
        while (!r->c_eof && r->in_len < IN_MAX) { /* client -> in */
            if (!r->in) r->in = lily_xmalloc(IN_MAX);
            if (r->in_len == r->fwd && !r->body_left) r->t_req = now;
            ssize_t n = c_recv(r, r->in + r->in_len, IN_MAX - r->in_len);
            if (n == IO_AGAIN) break;
            if (n == IO_FAIL) {
                relay_free(s, r);
                return;
            }
            if (n == 0) r->c_eof = 1;
            r->in_len += (size_t)n;
            progress = 1;
        }
        screen_in(s, r, now);
        if (r->fwd && !r->p_eof) { /* in -> pair */
            ssize_t w = send(r->pfd, r->in, r->fwd, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                memmove(r->in, r->in + w, r->in_len - (size_t)w);
                r->in_len -= (size_t)w;
                r->fwd -= (size_t)w;
                progress = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                r->p_eof = 1; /* the server side is gone */
                progress = 1;
            }
        }
        if (r->p_eof) r->in_len = r->fwd = 0;
        if (r->in && !r->in_len) {
            free(r->in); /* an idle connection keeps no window */
            r->in = NULL;
        }
        if (r->c_eof && !r->fwd && !r->p_shut && !r->p_eof) {
            shutdown(r->pfd, SHUT_WR);
            r->p_shut = 1;
        }
        if (!r->out_len && !r->p_eof) { /* pair -> out */
            ssize_t n = recv(r->pfd, r->out, OUT_BUF, MSG_DONTWAIT);
            if (n > 0) {
                r->out_len = (size_t)n;
                r->out_off = 0;
                progress = 1;
            } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                r->p_eof = 1;
                progress = 1;
            }
        }
        if (!r->out_len && r->p_eof && r->refusal.len) { /* the refused request's answer */
            size_t n = r->refusal.len < OUT_BUF ? r->refusal.len : OUT_BUF;
            memcpy(r->out, r->refusal.data, n);
            lily_sb_drop_front(&r->refusal, n);
            r->out_len = n;
            r->out_off = 0;
            progress = 1;
        }
        while (r->out_off < r->out_len) { /* out -> client */
            ssize_t w = c_send(r, r->out + r->out_off, r->out_len - r->out_off);
            if (w == IO_AGAIN) break;
            if (w == IO_FAIL) {
                relay_free(s, r); /* the client is gone */
                return;
            }
            r->out_off += (size_t)w;
            r->t_sent = now;
            progress = 1;
        }
        if (r->out_len && r->out_off == r->out_len) r->out_len = r->out_off = 0;
    }
    if (r->p_eof && !r->out_len && !r->refusal.len) {
        relay_finish(s, r, now);
        return;
    }
    update_masks(s, r);
}

void lily_relay_event(lily_srv *s, void *tagged, unsigned events, double now) {
    lily_relay *r = (lily_relay *)((uintptr_t)tagged & ~(uintptr_t)3);
    if (r->dead) return;
    int on_pair = ((uintptr_t)tagged & 2) != 0;
    if (!on_pair && (events & (EPOLLERR | EPOLLHUP)) && r->state != R_CLOSING) {
        relay_free(s, r); /* reset, or closed both ways: the client is gone */
        return;
    }
    if (on_pair && (events & (EPOLLERR | EPOLLHUP)) && r->out_len)
        r->p_hup = 1; /* read when out has room (pumped from the client's side) */
    pump(s, r, now);
}

/* ---- deadlines (front thread, lmu held) ----------------------------------------------------- */

static int pair_hung_up(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP));
}

void lily_relay_sweep(lily_srv *s, double now) {
    for (lily_relay *r = g_relays, *next; r; r = next) {
        next = r->next;
        if (r->state == R_HANDSHAKE && now - r->t0 > s->opts.header_timeout)
            relay_free(s, r);
        else if (r->state == R_CLOSING && now > r->linger_to)
            relay_free(s, r);
        else if (r->state == R_OPEN && r->out_len && now - r->t_sent > s->opts.send_timeout &&
                 pair_hung_up(r->pfd))
            relay_free(s, r); /* the client stopped reading and the server side gave up */
    }
}

void lily_relay_stop_all(lily_srv *s) {
    while (g_relays)
        relay_free(s, g_relays);
    lily_relay_reap();
}
