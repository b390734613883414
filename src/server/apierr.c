/* OpenAI-shaped API errors (see apierr.h). */
#include "server/apierr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid or cut short. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t k = c < 0x80                   ? 1
               : (c >= 0xC2 && c <= 0xDF) ? 2
               : (c >> 4) == 14           ? 3
               : (c >= 0xF0 && c <= 0xF4) ? 4
                                          : 0;
    if (!k || k > n) return 0;
    for (size_t j = 1; j < k; j++)
        if ((s[j] & 0xC0) != 0x80) return 0;
    if (k == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (k == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return k;
}

void lily_utf8_copy(char *dst, size_t cap, const char *src) {
    const unsigned char *s = (const unsigned char *)src;
    size_t n = strlen(src), o = 0;
    if (!cap) return;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        const char *piece = k ? src + i : "\xEF\xBF\xBD"; /* U+FFFD for a bad byte */
        size_t pn = k ? k : 3;
        if (o + pn + 1 > cap) break; /* never cut a character */
        memcpy(dst + o, piece, pn);
        o += pn;
        i += k ? k : 1;
    }
    dst[o] = 0;
}

static void fill(lily_api_error *e, int status, const char *type, const char *code,
                 const char *param, const char *fmt, va_list ap) {
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = type;
    e->code = code;
    lily_utf8_copy(e->param, sizeof e->param, param ? param : "");
    char raw[4 * sizeof e->message];
    vsnprintf(raw, sizeof raw, fmt, ap);
    lily_utf8_copy(e->message, sizeof e->message, raw);
}

int lily_api_fail(lily_api_error *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    fill(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

int lily_api_bad(lily_api_error *e, const char *code, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    fill(e, 400, "invalid_request_error", code, param, fmt, ap);
    va_end(ap);
    return -1;
}

void lily_api_error_json(const lily_api_error *e, lily_sb *out) {
    lily_sb_puts(out, "{\"error\":{\"message\":");
    lily_sb_json_str(out, e->message, strlen(e->message));
    lily_sb_puts(out, ",\"type\":");
    lily_sb_json_str(out, e->type ? e->type : "server_error",
                     strlen(e->type ? e->type : "server_error"));
    lily_sb_puts(out, ",\"param\":");
    if (e->param[0])
        lily_sb_json_str(out, e->param, strlen(e->param));
    else
        lily_sb_puts(out, "null");
    lily_sb_puts(out, ",\"code\":");
    if (e->code)
        lily_sb_json_str(out, e->code, strlen(e->code));
    else
        lily_sb_puts(out, "null");
    if (e->n_ctx > 0)
        lily_sb_printf(out, ",\"n_prompt_tokens\":%ld,\"n_ctx\":%ld", e->n_prompt_tokens, e->n_ctx);
    lily_sb_puts(out, "}}");
}
