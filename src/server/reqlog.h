/* The request log of `lily serve`: one line per HTTP request on stderr, written when the request
 * ends (a stream when its last byte is sent or its client goes away):
 *   text: 2026-12-06T23:59:01.123Z 127.0.0.1:51234 POST /v1/messages 200 prompt=41 cached=32
 *         gen=12 queue=0.002s ttft=0.051s total=0.210s
 *   json: {"time":"..","client":"..","method":"POST","path":"/v1/messages","status":200,
 *          "prompt_tokens":41,"cached_tokens":32,"generated_tokens":12,"queue_s":0.002,
 *          "ttft_s":0.051,"total_s":0.210}
 * Requests that ran no generation leave the token fields out (text) or null (json); queue (the
 * wait for a free slot, from the end of preparation) is left out when the request never waited
 * in the queue, ttft when no token was generated. Status 499 means the client closed the connection before its
 * answer. Requests that the front thread answers itself (front.c: a malformed head, 408, the
 * connection caps) are logged too, with "-" for a method or path that did not arrive.
 * `--log-format none` turns it off (the default under --quiet). */
#ifndef LILY_SERVER_REQLOG_H
#define LILY_SERVER_REQLOG_H

#include <stddef.h>
#include <stdio.h>

struct sockaddr;

typedef enum lily_log_format {
    LILY_LOG_DEFAULT = 0, /* text, or none under --quiet */
    LILY_LOG_TEXT,
    LILY_LOG_JSON,
    LILY_LOG_NONE,
} lily_log_format;

typedef struct lily_reqlog_entry {
    double wall;        /* request arrival, seconds since the epoch */
    const char *client; /* "ADDR:PORT" ("[ADDR]:PORT" for IPv6) */
    const char *method;
    const char *path;
    int status;
    int has_tokens; /* a generation ran: the token counts below are meaningful */
    int n_prompt, n_cached, n_gen;
    double queue_s; /* < 0: it never entered the generation queue */
    double ttft_s;  /* < 0: no token */
    double total_s;
} lily_reqlog_entry;

/* "text", "json" or "none" into *out; 0, or -1 for anything else. */
int lily_reqlog_parse_format(const char *s, lily_log_format *out);

/* "ADDR:PORT" ("[ADDR]:PORT" for IPv6; an IPv4-mapped address as IPv4) of sa into out; "-" when
 * sa is NULL or of another family. */
void lily_reqlog_client(const struct sockaddr *sa, char *out, size_t n);

/* Now, in seconds since the epoch (lily_reqlog_entry.wall). */
double lily_reqlog_wall(void);

/* Formats one line (with its newline) and writes it to f in one call. */
void lily_reqlog_write(FILE *f, lily_log_format fmt, const lily_reqlog_entry *x);

#endif
