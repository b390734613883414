/* OpenAI-shaped API errors (api.md §6): an HTTP status plus the four keys of the error body
 * (message, type, param, code), and extras for context-length errors and overload. */
#ifndef LILY_SERVER_APIERR_H
#define LILY_SERVER_APIERR_H

#include <stddef.h>

#include "gen/sb.h"

typedef struct lily_api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... (static) */
    const char *code; /* "invalid_json", ... (static), or NULL for a JSON null */
    char param[160];  /* JSON path of the offending field, "" for null */
    char message[640];
    long n_prompt_tokens; /* context_length_exceeded only (else 0) */
    long n_ctx;
    int retry_after; /* seconds, for 503 (0: no Retry-After header) */
} lily_api_error;

/* Fills e (if non-NULL) and returns -1. param may be NULL. */
int lily_api_fail(lily_api_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Shorthand for 400 invalid_request_error. */
int lily_api_bad(lily_api_error *e, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copies src into dst[cap] as valid UTF-8: a byte that does not start a valid sequence becomes
 * U+FFFD, and the copy stops before a character that would not fit (never mid-character). */
void lily_utf8_copy(char *dst, size_t cap, const char *src);

/* Appends {"error":{"message":..,"type":..,"param":..,"code":..}} to out. */
void lily_api_error_json(const lily_api_error *e, lily_sb *out);

#endif
