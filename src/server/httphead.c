/* The request-head screen of `lily serve` (lily_http_screen, see srv.h): the checks the front
 * (front.c) makes on the bytes it peeks at before libmicrohttpd reads them, so that what
 * libmicrohttpd would answer with an HTML page is answered with the OpenAI error JSON. Pure: no
 * sockets, no state. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/srv.h"

#define MAX_LINE    (8 * 1024)  /* the request line; 414 beyond */
#define MAX_HEAD    (16 * 1024) /* request line + headers; 431 beyond */
#define MAX_CHUNKED (64 * 1024) /* a chunked body must be whole within this; 411 beyond */
#define MAX_FIELDS  100

/* ---- the request head screen ---------------------------------------------------------------- */

static int bad(lily_api_error *e, int status, const char *code, const char *msg) {
    return lily_api_fail(e, status, "invalid_request_error", code, NULL, "%s", msg);
}

static int is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The end of the line starting at p (the '\n'), or NULL. */
static const char *eol(const char *p, const char *end) {
    return memchr(p, '\n', (size_t)(end - p));
}

/* Validates a chunked body in p[0..end): 0 whole (*stop: just past it), 1 incomplete, -1
 * malformed. */
static int screen_chunked(const char *p, const char *end, const char **stop, lily_api_error *e) {
    for (;;) {
        const char *nl = eol(p, end);
        if (!nl)
            return (size_t)(end - p) > 32
                       ? bad(e, 400, "malformed_chunked_encoding", "malformed chunk size line")
                       : 1;
        const char *q = p;
        unsigned long long size = 0;
        int digits = 0;
        for (; q < nl; q++, digits++) {
            char c = *q;
            int v = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (v < 0) break;
            if (digits >= 8) return bad(e, 411, "length_required", "chunk too large");
            size = size * 16 + (unsigned)v;
        }
        if (!digits || (q < nl && *q != ';' && *q != '\r') || (*q == '\r' && q + 1 != nl) ||
            nl[-1] != '\r')
            return bad(e, 400, "malformed_chunked_encoding", "malformed chunk size line");
        p = nl + 1;
        if (!size) { /* trailers, then an empty line */
            for (;;) {
                nl = eol(p, end);
                if (!nl) return 1;
                if (nl == p || (nl == p + 1 && *p == '\r')) {
                    *stop = nl + 1;
                    return 0;
                }
                p = nl + 1;
            }
        }
        if ((size_t)(end - p) < size + 2) return 1;
        if (p[size] != '\r' || p[size + 1] != '\n')
            return bad(e, 400, "malformed_chunked_encoding", "chunk data not followed by CRLF");
        p += size + 2;
    }
}

int lily_http_screen(const char *buf, size_t n, int full, int *http11, lily_api_error *e) {
    lily_http_frame f;
    return lily_http_screen_frame(buf, n, full, http11, &f, e);
}

int lily_http_screen_frame(const char *buf, size_t n, int full, int *http11, lily_http_frame *f,
                           lily_api_error *e) {
    const char *p = buf, *end = buf + n;
    while (p + 1 < end && p[0] == '\r' && p[1] == '\n') /* empty lines before a request */
        p += 2;
    const char *nl = eol(p, end);
    if (!nl) {
        if ((size_t)(end - p) > MAX_LINE || full)
            return bad(e, 414, "uri_too_long", "the request line is too long");
        return 1;
    }
    if ((size_t)(nl - p) > MAX_LINE)
        return bad(e, 414, "uri_too_long", "the request line is too long");
    /* METHOD SP target SP HTTP/x.y */
    const char *q = p, *le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    while (q < le && is_tchar((unsigned char)*q))
        q++;
    if (q == p || q >= le || *q != ' ') return bad(e, 400, "bad_request", "malformed request line");
    const char *t = ++q;
    while (q < le && (unsigned char)*q > ' ' && *q != 0x7f)
        q++;
    if (q == t || q >= le || *q != ' ') return bad(e, 400, "bad_request", "malformed request line");
    const char *v = q + 1;
    size_t vn = (size_t)(le - v);
    if (vn != 8 || memcmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' ||
        v[7] > '9')
        return bad(e, 400, "bad_request", "malformed request line");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return lily_api_fail(e, 505, "invalid_request_error", "http_version_not_supported", NULL,
                             "HTTP version %.8s is not supported (use HTTP/1.1)", v);
    *http11 = v[7] == '1';
    /* header fields */
    long long clen = -1;
    int chunked = 0, hosts = 0, fields = 0;
    p = nl + 1;
    for (;;) {
        nl = eol(p, end);
        if (!nl) {
            if ((size_t)(end - buf) > MAX_HEAD || full)
                return bad(e, 431, "request_header_fields_too_large",
                           "the request header fields are too large");
            return 1;
        }
        if ((size_t)(nl + 1 - buf) > MAX_HEAD)
            return bad(e, 431, "request_header_fields_too_large",
                       "the request header fields are too large");
        le = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
        if (le == p) break; /* the empty line */
        if (++fields > MAX_FIELDS)
            return bad(e, 431, "request_header_fields_too_large", "too many header fields");
        if (*p == ' ' || *p == '\t')
            return bad(e, 400, "bad_request", "folded header lines are not accepted");
        q = p;
        while (q < le && is_tchar((unsigned char)*q))
            q++;
        if (q == p || q >= le || *q != ':')
            return bad(e, 400, "bad_request", "malformed header field");
        size_t kn = (size_t)(q - p);
        const char *val = q + 1, *ve = le;
        for (const char *c = val; c < ve; c++)
            if (((unsigned char)*c < ' ' && *c != '\t') || *c == 0x7f)
                return bad(e, 400, "bad_request", "control character in a header field");
        while (val < ve && (*val == ' ' || *val == '\t'))
            val++;
        while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t vl = (size_t)(ve - val);
        if (kn == 14 && !strncasecmp(p, "Content-Length", 14)) {
            long long x = 0;
            if (!vl || vl > 15)
                return bad(e, 400, "invalid_content_length", "invalid Content-Length");
            for (size_t i = 0; i < vl; i++) {
                if (val[i] < '0' || val[i] > '9')
                    return bad(e, 400, "invalid_content_length", "invalid Content-Length");
                x = x * 10 + (val[i] - '0');
            }
            if (clen >= 0 && x != clen)
                return bad(e, 400, "invalid_content_length", "conflicting Content-Length headers");
            clen = x;
        } else if (kn == 17 && !strncasecmp(p, "Transfer-Encoding", 17)) {
            if (vl != 7 || strncasecmp(val, "chunked", 7) || chunked)
                return lily_api_fail(e, 501, "invalid_request_error",
                                     "unsupported_transfer_encoding", NULL,
                                     "only Transfer-Encoding: chunked is supported");
            chunked = 1;
        } else if (kn == 4 && !strncasecmp(p, "Host", 4)) {
            hosts++;
        }
        p = nl + 1;
    }
    if (hosts > 1) return bad(e, 400, "bad_request", "more than one Host header");
    if (!hosts && *http11)
        return bad(e, 400, "bad_request", "HTTP/1.1 requests need a Host header");
    if (chunked && clen >= 0)
        return bad(e, 400, "invalid_content_length",
                   "Content-Length and Transfer-Encoding: chunked together");
    f->head_len = (size_t)(nl + 1 - buf);
    f->body_len = clen > 0 ? (unsigned long long)clen : 0;
    f->chunked = chunked;
    if (!chunked) return 0;
    const char *stop = NULL;
    int rc = screen_chunked(nl + 1, end, &stop, e);
    if (rc == 0) f->head_len = (size_t)(stop - buf); /* the whole chunked body goes with the head */
    if (rc == 1 && (full || (size_t)(end - (nl + 1)) > MAX_CHUNKED))
        return lily_api_fail(e, 411, "invalid_request_error", "length_required", NULL,
                             "chunked request bodies over %d bytes are not accepted; send "
                             "Content-Length",
                             MAX_CHUNKED);
    return rc;
}
