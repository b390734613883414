/* TLS for `lily serve`, terminated in the front thread (front.c) with GnuTLS: each accepted
 * connection gets a relay that runs the handshake and then pumps bytes between the TLS session
 * and one end of a socketpair; the other end is an ordinary plaintext connection that the front
 * screens (the request head) and hands to libmicrohttpd, exactly as a plain HTTP connection. So
 * errors libmicrohttpd would answer with an HTML page are answered with the OpenAI error JSON over
 * HTTPS too, and the deadlines, caps and stall checks see the same sockets on both.
 *
 * A relay holds two 16 KiB buffers (client to server, server to client) and never reads more than
 * fits: a client that stops reading stops the server side (the stall check of http.c then ends
 * it). The client's end of input (close_notify or FIN) becomes a write shutdown of the pair; the
 * server side's end (libmicrohttpd closed the connection) becomes close_notify, a write shutdown
 * and a short drain before the socket closes. Everything here runs on the front thread. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "server/srv.h"

#define BUF      (16 * 1024)
#define LINGER_S 2.0

typedef enum { R_HANDSHAKE, R_OPEN, R_CLOSING } relay_state;

struct lily_relay {
    struct lily_relay *prev, *next;
    relay_state state;
    int dead;
    int cfd;          /* the client's socket */
    int pfd;          /* our end of the pair (-1 before the handshake ends and once closed) */
    lily_conn *lc;    /* during the handshake: the connection record, counted by the front */
    unsigned cmask;   /* epoll interest of cfd and pfd now */
    unsigned pmask;   /* (0: not in the set) */
    double t0;        /* accepted */
    double t_sent;    /* bytes last went to the client */
    double linger_to; /* R_CLOSING: close by then */
    int c_eof;        /* the client will send no more */
    int p_shut;       /* ... and the pair was told so */
    int p_eof;        /* the server side closed */
    int p_hup;        /* ... hung up while down was full: pfd out of the epoll set */
    gnutls_session_t ses;
    size_t up_len, down_off, down_len;
    char up[BUF];   /* client -> server, decrypted, not yet written to pfd */
    char down[BUF]; /* server -> client, not yet taken by the TLS session */
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
        if (!r->c_eof && r->up_len < BUF) cm |= EPOLLIN;
        if (r->down_off < r->down_len) cm |= EPOLLOUT;
        if (!r->p_eof && !r->down_len) pm |= EPOLLIN;
        if (r->up_len) pm |= EPOLLOUT;
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
    gnutls_deinit(r->ses);
    if (r->lc) lily_front_drop(s, r->lc); /* the handshake did not end */
    if (r->prev)
        r->prev->next = r->next;
    else
        g_relays = r->next;
    if (r->next) r->next->prev = r->prev;
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
    gnutls_bye(r->ses, GNUTLS_SHUT_WR); /* best effort on a non-blocking socket */
    shutdown(r->cfd, SHUT_WR);
    set_mask(s, r, r->pfd, &r->pmask, 0);
    close(r->pfd);
    r->pfd = -1;
    r->state = R_CLOSING;
    r->linger_to = now + LINGER_S;
    update_masks(s, r);
}

void lily_relay_start(lily_srv *s, lily_conn *c, double now) {
    lily_relay *r = lily_xcalloc(1, sizeof *r);
    r->cfd = c->fd;
    r->pfd = -1;
    r->lc = c;
    r->t0 = now;
    r->t_sent = now;
    c->fd = -1; /* the record gets the pair's end once the handshake is over */
    c->state = CONN_TLS;
    r->next = g_relays;
    if (g_relays) g_relays->prev = r;
    g_relays = r;
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

/* The handshake is over: the pair, and its plaintext end to the front's screen. */
static int relay_attach(lily_srv *s, lily_relay *r) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp)) return -1;
    r->pfd = sp[0];
    lily_conn *c = r->lc;
    r->lc = NULL;
    r->state = R_OPEN;
    lily_front_screen(s, c, sp[1]);
    return 0;
}

/* ---- the pump ------------------------------------------------------------------------------- */

static int again(ssize_t rc) {
    return rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED;
}

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
            if (relay_attach(s, r)) {
                relay_free(s, r);
                return;
            }
        } else if (again(rc) || (rc < 0 && !gnutls_error_is_fatal(rc))) {
            update_masks(s, r);
            return;
        } else {
            relay_free(s, r); /* a failed handshake: nothing can be said to the client */
            return;
        }
    }
    for (int progress = 1; progress;) {
        progress = 0;
        while (!r->c_eof && r->up_len < BUF) { /* client -> up */
            ssize_t n = gnutls_record_recv(r->ses, r->up + r->up_len, BUF - r->up_len);
            if (n > 0) {
                r->up_len += (size_t)n;
                progress = 1;
            } else if (again(n)) {
                break;
            } else if (n == 0 || n == GNUTLS_E_PREMATURE_TERMINATION) {
                r->c_eof = 1; /* close_notify, or a FIN without one */
                progress = 1;
            } else if (!gnutls_error_is_fatal((int)n)) {
                continue; /* a warning alert, a key update */
            } else {
                relay_free(s, r);
                return;
            }
        }
        if (r->up_len && !r->p_eof) { /* up -> pair */
            ssize_t w = send(r->pfd, r->up, r->up_len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                memmove(r->up, r->up + w, r->up_len - (size_t)w);
                r->up_len -= (size_t)w;
                progress = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                r->up_len = 0; /* the server side is gone: its answer, if any, is read below */
            }
        }
        if (r->p_eof) r->up_len = 0;
        if (r->c_eof && !r->up_len && !r->p_shut && !r->p_eof) {
            shutdown(r->pfd, SHUT_WR);
            r->p_shut = 1;
        }
        if (!r->down_len && !r->p_eof) { /* pair -> down */
            ssize_t n = recv(r->pfd, r->down, BUF, MSG_DONTWAIT);
            if (n > 0) {
                r->down_len = (size_t)n;
                r->down_off = 0;
                progress = 1;
            } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                r->p_eof = 1;
                progress = 1;
            }
        }
        while (r->down_off < r->down_len) { /* down -> client */
            ssize_t w = gnutls_record_send(r->ses, r->down + r->down_off, r->down_len - r->down_off);
            if (w > 0) {
                r->down_off += (size_t)w;
                r->t_sent = now;
                progress = 1;
            } else if (again(w)) {
                break;
            } else {
                relay_free(s, r); /* the client is gone */
                return;
            }
        }
        if (r->down_len && r->down_off == r->down_len) r->down_len = r->down_off = 0;
    }
    if (r->p_eof && !r->down_len) {
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
    if (on_pair && (events & (EPOLLERR | EPOLLHUP)) && r->down_len) {
        r->p_hup = 1; /* read when down has room (pumped from the client's side) */
    }
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
        else if (r->state == R_OPEN && r->down_len && now - r->t_sent > s->opts.send_timeout &&
                 pair_hung_up(r->pfd))
            relay_free(s, r); /* the client stopped reading and the server side gave up */
    }
}

void lily_relay_stop_all(lily_srv *s) {
    while (g_relays)
        relay_free(s, g_relays);
    lily_relay_reap();
}
