/* OpenAI-shaped API errors (see apierr.h). */
#include "server/apierr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void fill(lily_api_error *e, int status, const char *type, const char *code,
                 const char *param, const char *fmt, va_list ap) {
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
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
