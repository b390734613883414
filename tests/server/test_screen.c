/* The request-head screen of `lily serve` (front.c and relay.c, lily_http_screen): what
 * libmicrohttpd would answer with an HTML page is caught here and answered with the OpenAI error JSON (414, 431,
 * 505, a bad or conflicting Content-Length, malformed chunked bodies, 411 for chunked bodies
 * that do not fit the window), incomplete heads wait, good ones pass and say where they end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "server/srv.h"

static int screen(const char *req, size_t n, int full, lily_api_error *e) {
    int h11 = -1;
    memset(e, 0, sizeof *e);
    return lily_http_screen(req, n, full, &h11, e);
}

static void expect(const char *what, const char *req, int want_rc, int want_status) {
    lily_api_error e;
    int rc = screen(req, strlen(req), 0, &e);
    int ok = rc == want_rc && (want_rc >= 0 || e.status == want_status);
    check(ok, what, "rc %d status %d msg %s", rc, e.status, e.message);
}

int main(void) {
    expect("a GET passes", "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", 0, 0);
    expect("HTTP/1.0 without Host passes", "GET /health HTTP/1.0\r\n\r\n", 0, 0);
    expect("a POST with Content-Length passes",
           "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n", 0, 0);
    expect("a head in pieces waits", "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nCont", 1, 0);
    expect("a request line in pieces waits", "GET /hea", 1, 0);
    expect("HTTP/2.0: 505", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", -1, 505);
    expect("HTTP/1.2: 505", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", -1, 505);
    expect("garbage request line: 400", "HELLO\r\n\r\n", -1, 400);
    expect("no version: 400", "GET /\r\n\r\n", -1, 400);
    expect("HTTP/1.1 without Host: 400", "GET / HTTP/1.1\r\n\r\n", -1, 400);
    expect("two Hosts: 400", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", -1, 400);
    expect("conflicting Content-Length: 400",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", -1, 400);
    expect("repeated equal Content-Length passes",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 0, 0);
    expect("Content-Length not a number: 400",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5x\r\n\r\n", -1, 400);
    expect("negative Content-Length: 400",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", -1, 400);
    expect("huge Content-Length: 400",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", -1, 400);
    expect("Content-Length with chunked: 400",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
           "0\r\n\r\n",
           -1, 400);
    expect("Transfer-Encoding gzip: 501",
           "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", -1, 501);
    expect("folded header: 400", "GET / HTTP/1.1\r\nHost: a\r\n x\r\n\r\n", -1, 400);
    expect("space before colon: 400", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", -1, 400);
    expect("a whole chunked body passes",
           "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
           "3;x=y\r\n{}}\r\n0\r\n\r\n",
           0, 0);
    expect("a chunked body in pieces waits",
           "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", 1, 0);
    expect(
        "chunk size not hex: 400",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        -1, 400);
    expect(
        "chunk data without CRLF: 400",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n",
        -1, 400);

    /* sizes: a long request line is 414, long headers 431, a chunked body beyond the window 411 */
    size_t big = 20000;
    char *r = malloc(big + 256);
    lily_api_error e;
    strcpy(r, "GET /");
    memset(r + 5, 'a', 9000);
    strcpy(r + 9005, " HTTP/1.1\r\nHost: a\r\n\r\n");
    check(screen(r, strlen(r), 0, &e) == -1 && e.status == 414, "request line over 8 KiB: 414",
          "%d", e.status);
    check(screen(r, 8500, 0, &e) == -1 && e.status == 414,
          "request line still coming past 8 KiB: 414", "%d", e.status);
    strcpy(r, "GET / HTTP/1.1\r\nHost: a\r\n");
    size_t n = strlen(r);
    while (n < 17000) {
        memcpy(r + n, "X-Pad: 0123456789012345678901234567890123456789\r\n", 49);
        n += 49;
    }
    strcpy(r + n, "\r\n");
    check(screen(r, strlen(r), 0, &e) == -1 && e.status == 431, "headers over 16 KiB: 431", "%d",
          e.status);
    strcpy(r, "GET / HTTP/1.1\r\nHost: a\r\n");
    n = strlen(r);
    for (int i = 0; i < 120; i++) {
        memcpy(r + n, "X: y\r\n", 6);
        n += 6;
    }
    strcpy(r + n, "\r\n");
    check(screen(r, strlen(r), 0, &e) == -1 && e.status == 431, "over 100 header fields: 431", "%d",
          e.status);
    const char *ch = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel";
    check(screen(ch, strlen(ch), 1, &e) == -1 && e.status == 411,
          "a chunked body that fills the window: 411", "%d", e.status);
    check(e.message[0] && e.type, "errors carry a message and a type", NULL);
    free(r);

    /* framing (relay.c follows each request on a kept-alive connection to its end) */
    lily_http_frame f;
    int h11;
    const char *two = "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\n\r\n{\"x\":1}"
                      "GET /b HTTP/1.1\r\nHost: a\r\n\r\n";
    size_t head1 = strstr(two, "{") - two;
    int rc = lily_http_screen_frame(two, strlen(two), 0, &h11, &f, &e);
    check(rc == 0 && f.head_len == head1 && f.body_len == 7 && !f.chunked,
          "frame: a head with Content-Length", "rc %d head %zu body %llu", rc, f.head_len,
          f.body_len);
    const char *next = two + head1 + 7;
    rc = lily_http_screen_frame(next, strlen(next), 0, &h11, &f, &e);
    check(rc == 0 && f.head_len == strlen(next) && f.body_len == 0, "frame: the next request",
          "rc %d head %zu", rc, f.head_len);
    const char *chk =
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        "0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n";
    rc = lily_http_screen_frame(chk, strlen(chk), 0, &h11, &f, &e);
    check(rc == 0 && f.chunked && f.body_len == 0 &&
              f.head_len == (size_t)(strstr(chk, "GET") - chk),
          "frame: a chunked body (with a trailer) goes with its head", "rc %d head %zu", rc,
          f.head_len);
    const char *lead = "\r\n\r\nGET / HTTP/1.0\r\n\r\n";
    rc = lily_http_screen_frame(lead, strlen(lead), 0, &h11, &f, &e);
    check(rc == 0 && f.head_len == strlen(lead) && !h11, "frame: empty lines before a request",
          "rc %d head %zu", rc, f.head_len);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
