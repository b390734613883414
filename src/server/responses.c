/* The OpenAI Responses API (see responses.h). */
#include "server/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "server/blkseq.h"

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

/* ---- the answer ----------------------------------------------------------------------------- */

typedef struct resp {
    char id[48];
    long created;
    cJSON *echo; /* request fields the response object repeats (owned) */
    lily_blkseq q;
    char (*ids)[48]; /* the output items' ids, by block */
    int n_ids;
    int stream;
    int seq; /* the next sequence_number */
} resp;

static void resp_free(void *p) {
    resp *r = p;
    if (!r) return;
    lily_blkseq_free(&r->q);
    free(r->ids);
    cJSON_Delete(r->echo);
    free(r);
}

/* "event: TYPE\ndata: {"type":"TYPE","sequence_number":N," — the caller writes the rest. */
static void ev(resp *r, lily_sb *o, const char *type) {
    lily_sb_printf(o, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,", type, type,
                   r->seq++);
}

static void item_json(const resp *r, int k, int done, lily_sb *o) {
    const lily_blk *it = &r->q.b[k];
    const char *id = r->ids[k];
    const char *status = done ? "completed" : "in_progress";
    if (it->kind == LILY_DELTA_REASONING) {
        lily_sb_printf(o, "{\"id\":\"%s\",\"type\":\"reasoning\",\"summary\":[],\"content\":[", id);
        if (done) {
            lily_sb_puts(o, "{\"type\":\"reasoning_text\",\"text\":");
            lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
            lily_sb_putc(o, '}');
        }
        lily_sb_puts(o, "]}");
    } else if (it->kind == LILY_DELTA_CONTENT) {
        lily_sb_printf(
            o,
            "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\","
            "\"content\":[",
            id, status);
        if (done) {
            lily_sb_puts(o, "{\"type\":\"output_text\",\"text\":");
            lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
            lily_sb_puts(o, ",\"annotations\":[],\"logprobs\":[]}");
        }
        lily_sb_puts(o, "]}");
    } else {
        lily_sb_printf(
            o,
            "{\"id\":\"%s\",\"type\":\"function_call\",\"status\":\"%s\",\"call_id\":\"%s\","
            "\"name\":",
            id, status, it->call_id);
        lily_sb_json_str(o, lily_sb_str(&it->name), it->name.len);
        lily_sb_puts(o, ",\"arguments\":");
        if (done)
            lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
        else
            lily_sb_puts(o, "\"\"");
        lily_sb_putc(o, '}');
    }
}

static void response_json(lily_job *j, const lily_gen_result *g, int reasoning_tokens, lily_sb *o) {
    resp *r = j->api_state;
    const char *status = !g                             ? "in_progress"
                         : !strcmp(g->finish, "length") ? "incomplete"
                                                        : "completed";
    lily_sb_printf(o,
                   "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%ld,\"status\":\"%s\","
                   "\"error\":null,\"incomplete_details\":",
                   r->id, r->created, status);
    if (!strcmp(status, "incomplete"))
        lily_sb_puts(o, "{\"reason\":\"max_output_tokens\"}");
    else
        lily_sb_puts(o, "null");
    lily_sb_puts(o, ",\"model\":");
    const char *m = j->req.model[0] ? j->req.model : j->srv->model_id;
    lily_sb_json_str(o, m, strlen(m));
    lily_sb_puts(o, ",\"output\":[");
    for (int i = 0; g && i < r->q.n; i++) {
        if (i) lily_sb_putc(o, ',');
        item_json(r, i, 1, o);
    }
    lily_sb_putc(o, ']');
    const cJSON *x;
    cJSON_ArrayForEach(x, r->echo) {
        char *v = cJSON_PrintUnformatted(x);
        lily_sb_putc(o, ',');
        lily_sb_json_str(o, x->string, strlen(x->string));
        lily_sb_printf(o, ":%s", v);
        free(v);
    }
    lily_sb_puts(o, ",\"previous_response_id\":null,\"store\":false,\"truncation\":\"disabled\","
                    "\"usage\":");
    if (g)
        lily_sb_printf(o,
                       "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},"
                       "\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":%d},"
                       "\"total_tokens\":%d}",
                       g->n_prompt, g->n_cached, g->n_gen, reasoning_tokens,
                       g->n_prompt + g->n_gen);
    else
        lily_sb_puts(o, "null");
    lily_sb_putc(o, '}');
}

static void r_begin(lily_job *j, lily_sb *o) {
    resp *r = j->api_state;
    if (!j->req.stream) return;
    ev(r, o, "response.created");
    lily_sb_puts(o, "\"response\":");
    response_json(j, NULL, 0, o);
    lily_sb_puts(o, "}\n\n");
    ev(r, o, "response.in_progress");
    lily_sb_puts(o, "\"response\":");
    response_json(j, NULL, 0, o);
    lily_sb_puts(o, "}\n\n");
}

static void s_start(void *ud, int k, const lily_blk *b, lily_sb *o) {
    resp *r = ud;
    if (k >= r->n_ids) {
        r->n_ids = 2 * k + 4;
        r->ids = lily_xrealloc(r->ids, (size_t)r->n_ids * sizeof *r->ids);
    }
    lily_job_random_id(r->ids[k], b->kind == LILY_DELTA_REASONING ? "rs_"
                                  : b->kind == LILY_DELTA_CONTENT ? "msg_"
                                                                  : "fc_");
    if (!r->stream) return;
    ev(r, o, "response.output_item.added");
    lily_sb_printf(o, "\"output_index\":%d,\"item\":", k);
    item_json(r, k, 0, o);
    lily_sb_puts(o, "}\n\n");
    if (b->kind == LILY_DELTA_CALL) return;
    ev(r, o, "response.content_part.added");
    lily_sb_printf(
        o, "\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":%s}\n\n", r->ids[k],
        k,
        b->kind == LILY_DELTA_CONTENT
            ? "{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],\"logprobs\":[]}"
            : "{\"type\":\"reasoning_text\",\"text\":\"\"}");
}

static void s_delta(void *ud, int k, const lily_blk *b, const char *t, size_t n, lily_sb *o) {
    resp *r = ud;
    if (!r->stream) return;
    if (b->kind == LILY_DELTA_CALL) {
        ev(r, o, "response.function_call_arguments.delta");
        lily_sb_printf(o, "\"item_id\":\"%s\",\"output_index\":%d,\"delta\":", r->ids[k], k);
    } else {
        ev(r, o,
           b->kind == LILY_DELTA_CONTENT ? "response.output_text.delta"
                                         : "response.reasoning_text.delta");
        lily_sb_printf(o, "\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"delta\":",
                       r->ids[k], k);
    }
    lily_sb_json_str(o, t, n);
    lily_sb_puts(o, b->kind == LILY_DELTA_CONTENT ? ",\"logprobs\":[]}\n\n" : "}\n\n");
}

static void s_stop(void *ud, int k, const lily_blk *it, lily_sb *o) {
    resp *r = ud;
    if (!r->stream) return;
    if (it->kind == LILY_DELTA_CALL) {
        ev(r, o, "response.function_call_arguments.done");
        lily_sb_printf(o, "\"item_id\":\"%s\",\"output_index\":%d,\"name\":", r->ids[k], k);
        lily_sb_json_str(o, lily_sb_str(&it->name), it->name.len);
        lily_sb_puts(o, ",\"arguments\":");
        lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
        lily_sb_puts(o, "}\n\n");
    } else {
        int text = it->kind == LILY_DELTA_CONTENT;
        ev(r, o, text ? "response.output_text.done" : "response.reasoning_text.done");
        lily_sb_printf(o, "\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"text\":",
                       r->ids[k], k);
        lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
        lily_sb_puts(o, text ? ",\"logprobs\":[]}\n\n" : "}\n\n");
        ev(r, o, "response.content_part.done");
        lily_sb_printf(o,
                       "\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":{"
                       "\"type\":\"%s\",\"text\":",
                       r->ids[k], k, text ? "output_text" : "reasoning_text");
        lily_sb_json_str(o, lily_sb_str(&it->text), it->text.len);
        lily_sb_puts(o, text ? ",\"annotations\":[],\"logprobs\":[]}}\n\n" : "}}\n\n");
    }
    ev(r, o, "response.output_item.done");
    lily_sb_printf(o, "\"output_index\":%d,\"item\":", k);
    item_json(r, k, 1, o);
    lily_sb_puts(o, "}\n\n");
}

static void r_delta(lily_job *j, const lily_delta *d, lily_sb *o) {
    resp *r = j->api_state;
    lily_blkseq_cb cb = {r, s_start, s_delta, s_stop};
    lily_blkseq_delta(&r->q, d, &cb, o);
}

static void r_finish(lily_job *j, const lily_gen_result *g, int reasoning_tokens, lily_sb *o) {
    resp *r = j->api_state;
    lily_blkseq_cb cb = {r, s_start, s_delta, s_stop};
    lily_blkseq_finish(&r->q, &cb, o);
    if (!j->req.stream) {
        response_json(j, g, reasoning_tokens, o);
        return;
    }
    ev(r, o, strcmp(g->finish, "length") ? "response.completed" : "response.incomplete");
    lily_sb_puts(o, "\"response\":");
    response_json(j, g, reasoning_tokens, o);
    lily_sb_puts(o, "}\n\n");
}

static void r_error(lily_job *j, const char *msg, lily_sb *o) {
    resp *r = j->api_state;
    if (j->req.stream) {
        ev(r, o, "error");
        lily_sb_puts(o, "\"code\":\"server_error\",\"message\":");
        lily_sb_json_str(o, msg, strlen(msg));
        lily_sb_puts(o, ",\"param\":null}\n\n");
        return;
    }
    lily_api_error e;
    lily_api_fail(&e, 500, "server_error", NULL, NULL, "%s", msg);
    lily_api_error_json(&e, o);
}

static const lily_apiout resp_out = {r_begin, r_delta, r_finish, r_error, resp_free};

/* The request fields the response object repeats, with their defaults. */
static cJSON *echo_fields(const cJSON *b) {
    cJSON *x = cJSON_CreateObject();
    static const struct {
        const char *key, *dflt;
    } keys[] = {
        {"instructions", "null"},
        {"max_output_tokens", "null"},
        {"parallel_tool_calls", "true"},
        {"temperature", "null"},
        {"top_p", "null"},
        {"tool_choice", "\"auto\""},
        {"tools", "[]"},
        {"metadata", "{}"},
        {"user", "null"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = field(b, keys[i].key);
        cJSON_AddItemToObject(x, keys[i].key,
                              v ? cJSON_Duplicate(v, 1) : cJSON_Parse(keys[i].dflt));
    }
    const cJSON *r = field(b, "reasoning");
    cJSON *rr = cJSON_AddObjectToObject(x, "reasoning");
    const cJSON *eff = field(r, "effort");
    cJSON_AddItemToObject(rr, "effort", eff ? cJSON_Duplicate(eff, 1) : cJSON_CreateNull());
    cJSON_AddNullToObject(rr, "summary");
    const cJSON *t = field(b, "text");
    cJSON_AddItemToObject(
        x, "text", t ? cJSON_Duplicate(t, 1) : cJSON_Parse("{\"format\":{\"type\":\"text\"}}"));
    return x;
}

int lily_resp_fill(lily_srv *s, lily_job *j, const char *body, size_t len, lily_api_error *e) {
    if (len > s->opts.max_body) {
        lily_api_fail(e, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body of %zu bytes exceeds the limit of %zu bytes", len,
                      s->opts.max_body);
        return -1;
    }
    cJSON *b = cJSON_ParseWithLength(body, len);
    if (!b) {
        lily_api_bad(e, "invalid_json", NULL, "request body is not valid JSON");
        return -1;
    }
    cJSON *chat = lily_resp_to_chat(b, e);
    if (!chat) {
        cJSON_Delete(b);
        return -1;
    }
    char *text = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    lily_request req;
    lily_request_limits lim = {.max_messages = 100000};
    int rc = -1;
    if (!lily_request_parse(LILY_REQ_CHAT, text, strlen(text), &lim, &req, e)) {
        rc = lily_job_fill(s, j, &req, e) ? -1 : 0;
        lily_request_free(&req);
    }
    free(text);
    if (!rc) {
        resp *r = lily_xcalloc(1, sizeof *r);
        lily_job_random_id(r->id, "resp_");
        r->created = (long)time(NULL);
        r->echo = echo_fields(b);
        r->stream = j->req.stream;
        j->api = &resp_out;
        j->api_state = r;
    }
    cJSON_Delete(b);
    return rc;
}
