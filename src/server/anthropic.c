/* The Anthropic Messages API (see anthropic.h). */
#include "server/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "server/blkseq.h"

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

/* ---- preparing a job ------------------------------------------------------------------------ */

/* Body text -> chat request (parsed and validated by the chat path). */
static int parse_request(lily_srv *s, const char *body, size_t len, int count, lily_request *r,
                         lily_api_error *e) {
    memset(r, 0, sizeof *r);
    if (len > s->opts.max_body)
        return lily_api_fail(e, 413, "invalid_request_error", "request_too_large", NULL,
                             "request body of %zu bytes exceeds the limit of %zu bytes", len,
                             s->opts.max_body);
    cJSON *b = cJSON_ParseWithLength(body, len);
    if (!b) return lily_api_bad(e, "invalid_json", NULL, "request body is not valid JSON");
    if (count && cJSON_IsObject(b) && !field(b, "max_tokens")) /* not part of count_tokens */
        cJSON_AddNumberToObject(b, "max_tokens", 1);
    cJSON *chat = lily_anth_to_chat(b, e);
    cJSON_Delete(b);
    if (!chat) return -1;
    char *text = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    lily_request_limits lim = {.max_messages = 100000};
    int rc = lily_request_parse(LILY_REQ_CHAT, text, strlen(text), &lim, r, e);
    free(text);
    return rc;
}

typedef struct anth {
    char id[48];
    lily_blkseq q;
} anth;

static void anth_free(void *p) {
    anth *a = p;
    if (!a) return;
    lily_blkseq_free(&a->q);
    free(a);
}

static void event(lily_sb *o, const char *name) {
    lily_sb_printf(o, "event: %s\ndata: ", name);
}

static void model_str(lily_job *j, lily_sb *o) {
    const char *m = j->req.model[0] ? j->req.model : j->srv->model_id;
    lily_sb_json_str(o, m, strlen(m));
}

/* "toolu_" + the 24 characters of the parser's "call_" id */
static void tool_id(const lily_blk *b, char *out, size_t n) {
    const char *rest = !strncmp(b->call_id, "call_", 5) ? b->call_id + 5 : b->call_id;
    snprintf(out, n, "toolu_%s", rest);
}

static void a_begin(lily_job *j, lily_sb *o) {
    anth *a = j->api_state;
    if (!j->req.stream) return;
    event(o, "message_start");
    lily_sb_printf(o,
                   "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\","
                   "\"role\":\"assistant\",\"model\":",
                   a->id);
    model_str(j, o);
    lily_sb_printf(o,
                   ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
                   "\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                   "\"cache_read_input_tokens\":0,\"output_tokens\":0}}}\n\n",
                   j->n_prompt);
    event(o, "ping");
    lily_sb_puts(o, "{\"type\":\"ping\"}\n\n");
}

static void s_start(void *ud, int index, const lily_blk *b, lily_sb *o) {
    (void)ud;
    event(o, "content_block_start");
    lily_sb_printf(o, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", index);
    if (b->kind == LILY_DELTA_REASONING) {
        lily_sb_puts(o, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    } else if (b->kind == LILY_DELTA_CONTENT) {
        lily_sb_puts(o, "{\"type\":\"text\",\"text\":\"\"}");
    } else {
        char id[48];
        tool_id(b, id, sizeof id);
        lily_sb_printf(o, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":", id);
        lily_sb_json_str(o, lily_sb_str(&b->name), b->name.len);
        lily_sb_puts(o, ",\"input\":{}}");
    }
    lily_sb_puts(o, "}\n\n");
}

static void s_delta(void *ud, int index, const lily_blk *b, const char *t, size_t n, lily_sb *o) {
    (void)ud;
    event(o, "content_block_delta");
    lily_sb_printf(o, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":", index);
    if (b->kind == LILY_DELTA_REASONING)
        lily_sb_puts(o, "{\"type\":\"thinking_delta\",\"thinking\":");
    else if (b->kind == LILY_DELTA_CONTENT)
        lily_sb_puts(o, "{\"type\":\"text_delta\",\"text\":");
    else
        lily_sb_puts(o, "{\"type\":\"input_json_delta\",\"partial_json\":");
    lily_sb_json_str(o, t, n);
    lily_sb_puts(o, "}}\n\n");
}

static void s_stop(void *ud, int index, const lily_blk *b, lily_sb *o) {
    (void)ud, (void)b;
    event(o, "content_block_stop");
    lily_sb_printf(o, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", index);
}

static const lily_blkseq_cb stream_cb = {NULL, s_start, s_delta, s_stop};

static void a_delta(lily_job *j, const lily_delta *d, lily_sb *o) {
    anth *a = j->api_state;
    lily_blkseq_delta(&a->q, d, j->req.stream ? &stream_cb : NULL, o);
}

static void stop_reason(lily_job *j, const lily_gen_result *g, lily_sb *o) {
    anth *a = j->api_state;
    int calls = lily_blkseq_n_calls(&a->q);
    const char *sr = "end_turn";
    if (!strcmp(g->finish, "length"))
        sr = "max_tokens";
    else if (calls)
        sr = "tool_use";
    else if (g->stop_hit > 0 && g->stop_hit <= j->req.n_stop)
        sr = "stop_sequence";
    lily_sb_printf(o, "\"stop_reason\":\"%s\",\"stop_sequence\":", sr);
    if (!strcmp(sr, "stop_sequence")) {
        const char *ss = j->req.stop[g->stop_hit - 1];
        lily_sb_json_str(o, ss, strlen(ss));
    } else {
        lily_sb_puts(o, "null");
    }
}

static void usage(const lily_gen_result *g, lily_sb *o) {
    lily_sb_printf(o,
                   "\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                   "\"cache_read_input_tokens\":%d,\"output_tokens\":%d}",
                   g->n_prompt - g->n_cached, g->n_cached, g->n_gen);
}

static void a_finish(lily_job *j, const lily_gen_result *g, int reasoning_tokens, lily_sb *o) {
    (void)reasoning_tokens;
    anth *a = j->api_state;
    lily_blkseq_finish(&a->q, j->req.stream ? &stream_cb : NULL, o);
    if (j->req.stream) {
        event(o, "message_delta");
        lily_sb_puts(o, "{\"type\":\"message_delta\",\"delta\":{");
        stop_reason(j, g, o);
        lily_sb_puts(o, "},");
        usage(g, o);
        lily_sb_puts(o, "}\n\n");
        event(o, "message_stop");
        lily_sb_puts(o, "{\"type\":\"message_stop\"}\n\n");
        return;
    }
    lily_sb_printf(o,
                   "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":", a->id);
    model_str(j, o);
    lily_sb_puts(o, ",\"content\":[");
    for (int i = 0; i < a->q.n; i++) {
        const lily_blk *b = &a->q.b[i];
        if (i) lily_sb_putc(o, ',');
        if (b->kind == LILY_DELTA_REASONING) {
            lily_sb_puts(o, "{\"type\":\"thinking\",\"thinking\":");
            lily_sb_json_str(o, lily_sb_str(&b->text), b->text.len);
            lily_sb_puts(o, ",\"signature\":\"\"}");
        } else if (b->kind == LILY_DELTA_CONTENT) {
            lily_sb_puts(o, "{\"type\":\"text\",\"text\":");
            lily_sb_json_str(o, lily_sb_str(&b->text), b->text.len);
            lily_sb_putc(o, '}');
        } else {
            char id[48];
            tool_id(b, id, sizeof id);
            lily_sb_printf(o, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":", id);
            lily_sb_json_str(o, lily_sb_str(&b->name), b->name.len);
            lily_sb_puts(o, ",\"input\":");
            cJSON *in = cJSON_ParseWithLength(lily_sb_str(&b->text), b->text.len);
            char *txt = cJSON_IsObject(in) ? cJSON_PrintUnformatted(in) : NULL;
            lily_sb_puts(o, txt ? txt : "{}");
            free(txt);
            cJSON_Delete(in);
            lily_sb_putc(o, '}');
        }
    }
    lily_sb_puts(o, "],");
    stop_reason(j, g, o);
    lily_sb_putc(o, ',');
    usage(g, o);
    lily_sb_putc(o, '}');
}

static void a_error(lily_job *j, const char *msg, lily_sb *o) {
    lily_api_error e;
    lily_api_fail(&e, 500, "api_error", NULL, NULL, "%s", msg);
    if (j->req.stream) event(o, "error");
    lily_anth_error_json(&e, o);
    if (j->req.stream) lily_sb_puts(o, "\n\n");
}

static const lily_apiout anth_out = {a_begin, a_delta, a_finish, a_error, anth_free};

int lily_anth_fill(lily_srv *s, lily_job *j, const char *body, size_t len, lily_api_error *e) {
    lily_request r;
    if (parse_request(s, body, len, 0, &r, e)) return -1;
    int rc = lily_job_fill(s, j, &r, e);
    lily_request_free(&r);
    if (rc) return -1;
    anth *a = lily_xcalloc(1, sizeof *a);
    lily_job_random_id(a->id, "msg_");
    j->api = &anth_out;
    j->api_state = a;
    return 0;
}

int lily_anth_count_tokens(lily_srv *s, const char *body, size_t len, lily_sb *out,
                           lily_api_error *e) {
    lily_request r;
    if (parse_request(s, body, len, 1, &r, e)) return -1;
    lily_job *j = lily_job_prepare(s, &r, e);
    lily_request_free(&r);
    if (!j && e->code && !strcmp(e->code, "context_length_exceeded")) {
        /* counting is what a client does to find out: answer it */
        lily_sb_printf(out, "{\"input_tokens\":%ld}", e->n_prompt_tokens);
        return 0;
    }
    if (!j) return -1;
    lily_sb_printf(out, "{\"input_tokens\":%d}", j->n_prompt);
    lily_job_release(j);
    return 0;
}
