/* The request conversions of /v1/messages (lily_anth_to_chat) and /v1/responses
 * (lily_resp_to_chat): each input form becomes the expected chat body (compared as JSON), the
 * result passes the chat parser, and bad requests are 400s naming the field. Also the
 * Anthropic error shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "server/anthropic.h"
#include "server/blkseq.h"
#include "server/responses.h"

typedef cJSON *(*conv_fn)(const cJSON *, lily_api_error *);

/* Converts in and compares with want (both JSON text); the result must parse as a chat request. */
static void same(conv_fn f, const char *what, const char *in, const char *want) {
    cJSON *b = cJSON_Parse(in), *w = cJSON_Parse(want);
    if (!b || !w) {
        CHECK(0, "%s: bad test JSON", what);
        cJSON_Delete(b);
        cJSON_Delete(w);
        return;
    }
    lily_api_error e;
    memset(&e, 0, sizeof e);
    cJSON *got = f(b, &e);
    char *gs = got ? cJSON_PrintUnformatted(got) : NULL;
    int ok = got && cJSON_Compare(got, w, 1);
    if (ok)
        check(1, what, NULL);
    else
        check(0, what, "\n  got  %s\n  want %s\n  err %s %s", gs ? gs : "NULL", want, e.param,
              e.message);
    /* (a response_format needs the constrained decoding of the chat path: not parsed here) */
    if (gs && !cJSON_GetObjectItemCaseSensitive(got, "response_format")) {
        lily_request r;
        int rc = lily_request_parse(LILY_REQ_CHAT, gs, strlen(gs), NULL, &r, &e);
        CHECK(rc == 0, "%s: the chat parser rejects the conversion: %s %s", what, e.param,
              e.message);
        if (!rc) lily_request_free(&r);
    }
    free(gs);
    cJSON_Delete(got);
    cJSON_Delete(b);
    cJSON_Delete(w);
}

static void bad(conv_fn f, const char *in, const char *code, const char *param) {
    cJSON *b = cJSON_Parse(in);
    lily_api_error e;
    memset(&e, 0, sizeof e);
    cJSON *got = f(b, &e);
    int ok = !got && e.status == 400 && e.code && !strcmp(e.code, code) &&
             !strcmp(e.param, param) && e.message[0];
    char what[200];
    snprintf(what, sizeof what, "400 %s %s", code, param[0] ? param : "(body)");
    if (ok)
        check(1, what, NULL);
    else
        check(0, what, "%s -> status %d code %s param '%s' (%s)", in, e.status,
              e.code ? e.code : "null", e.param, e.message);
    cJSON_Delete(got);
    cJSON_Delete(b);
}

#define WEATHER "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}"

static void messages(void) {
    conv_fn f = lily_anth_to_chat;
    same(f, "messages: string content, system string, sampling, stop_sequences",
         "{\"model\":\"m\",\"max_tokens\":5,\"system\":\"S\",\"temperature\":0.5,\"top_p\":0.9,"
         "\"top_k\":20,\"stop_sequences\":[\"x\"],\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
         "\"hi\"}],\"model\":\"m\",\"max_tokens\":5,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,"
         "\"stop\":[\"x\"],\"stream\":true}");
    same(
        f, "messages: system and content as text blocks (joined by newlines)",
        "{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"A\",\"cache_control\":{"
        "\"type\":\"ephemeral\"}},{\"type\":\"text\",\"text\":\"B\"}],\"messages\":[{\"role\":"
        "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},{\"type\":\"text\",\"text\":"
        "\"y\"}]}]}",
        "{\"messages\":[{\"role\":\"system\",\"content\":\"A\\nB\"},{\"role\":\"user\",\"content\":"
        "\"x\\ny\"}],\"max_tokens\":5}");
    same(f, "messages: tool_use / tool_result round trip, thinking block, tools, tool_choice tool",
         "{\"max_tokens\":5,\"tools\":[{\"name\":\"w\",\"description\":\"D\",\"input_"
         "schema\":" WEATHER
         "}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"w\",\"disable_parallel_tool_use\":true},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
         "{\"type\":\"thinking\",\"thinking\":\"T\",\"signature\":\"s\"},{\"type\":\"text\","
         "\"text\":"
         "\"ok\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"city\":"
         "\"P\"}}]},"
         "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
         "\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"and?"
         "\"}]}]}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
         "\"ok\",\"reasoning_content\":\"T\",\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":"
         "\"function\","
         "\"function\":{\"name\":\"w\",\"arguments\":{\"city\":\"P\"}}}]},{\"role\":\"tool\","
         "\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},{\"role\":\"user\",\"content\":"
         "\"and?\"}],\"max_tokens\":5,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"w\","
         "\"description\":\"D\",\"parameters\":" WEATHER
         "}}],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"w\"}},\"parallel_tool_calls\":false}");
    same(f, "messages: tool_result only (string content): tool messages, no empty user turn",
         "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":"
         "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"w\",\"input\":{"
         "}}]},"
         "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\","
         "\"content\":"
         "\"r1\",\"is_error\":true}]}]}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
         "\"\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"w\","
         "\"arguments\":{}}}]},{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r1\"}],"
         "\"max_tokens\":5}");
    same(f, "messages: tool_choice any -> required, thinking enabled -> switch + budget",
         "{\"max_tokens\":5,\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"enabled\","
         "\"budget_tokens\":1024},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"max_tokens\":5,\"tool_choice\":"
         "\"required\",\"chat_template_kwargs\":{\"enable_thinking\":true},\"thinking_budget\":"
         "1024}");
    same(f, "messages: tool_choice none, thinking disabled",
         "{\"max_tokens\":5,\"tool_choice\":{\"type\":\"none\"},\"thinking\":{\"type\":"
         "\"disabled\"},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"max_tokens\":5,\"tool_choice\":"
         "\"none\",\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    const char *u = "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]";
    char b[512];
    bad(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "missing_required_parameter",
        "max_tokens");
    snprintf(b, sizeof b, "{\"max_tokens\":0,%s}", u);
    bad(f, b, "invalid_value", "max_tokens");
    bad(f, "{\"max_tokens\":5}", "missing_required_parameter", "messages");
    bad(f, "{\"max_tokens\":5,\"messages\":[]}", "invalid_value", "messages");
    bad(f, "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"q\"}]}",
        "invalid_value", "messages[0].role");
    bad(f,
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
        "\"source\":{}}]}]}",
        "unsupported_value", "messages[0].content[0]");
    bad(f,
        "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\","
        "\"name\":\"w\",\"input\":{}}]}]}",
        "invalid_value", "messages[0].content[0]");
    snprintf(b, sizeof b,
             "{\"max_tokens\":5,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"s\"}],%s}",
             u);
    bad(f, b, "unsupported_value", "tools[0]");
    snprintf(b, sizeof b, "{\"max_tokens\":5,\"tools\":[{\"name\":\"s\"}],%s}", u);
    bad(f, b, "invalid_value", "tools[0]");
    snprintf(b, sizeof b, "{\"max_tokens\":5,\"tool_choice\":{\"type\":\"tool\"},%s}", u);
    bad(f, b, "invalid_value", "tool_choice.name");
    snprintf(b, sizeof b, "{\"max_tokens\":5,\"thinking\":{\"type\":\"on\"},%s}", u);
    bad(f, b, "invalid_value", "thinking");
    snprintf(b, sizeof b, "{\"max_tokens\":5,\"stop_sequences\":\"x\",%s}", u);
    bad(f, b, "invalid_type", "stop_sequences");

    lily_api_error e;
    lily_api_bad(&e, "invalid_value", "max_tokens", "too big");
    lily_sb o = {0};
    lily_anth_error_json(&e, &o);
    CHECK(!strcmp(lily_sb_str(&o),
                  "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                  "\"message\":\"max_tokens: too big\"}}"),
          "anthropic error shape: %s", lily_sb_str(&o));
    lily_sb_clear(&o);
    lily_api_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL, "no key");
    lily_anth_error_json(&e, &o);
    CHECK(strstr(lily_sb_str(&o), "\"authentication_error\""), "401 -> authentication_error: %s",
          lily_sb_str(&o));
    lily_sb_free(&o);
}

static void responses(void) {
    conv_fn f = lily_resp_to_chat;
    same(f, "responses: string input, instructions, limits, reasoning effort, store ignored",
         "{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"S\",\"max_output_tokens\":7,"
         "\"temperature\":0.2,\"top_p\":0.5,\"stream\":true,\"store\":true,\"reasoning\":{"
         "\"effort\":"
         "\"low\",\"summary\":\"auto\"},\"metadata\":{\"a\":\"b\"}}",
         "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
         "\"hi\"}],\"model\":\"m\",\"max_tokens\":7,\"temperature\":0.2,\"top_p\":0.5,\"stream\":"
         "true,"
         "\"reasoning_effort\":\"low\"}");
    same(
        f, "responses: items: message parts, reasoning, function_call, function_call_output",
        "{\"input\":[{\"role\":\"developer\",\"content\":\"D\"},{\"type\":\"message\",\"role\":"
        "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\","
        "\"text\":\"b\"}]},{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{"
        "\"type\":\"reasoning_text\",\"text\":\"R\"}]},{\"type\":\"function_call\",\"id\":\"fc_1\","
        "\"call_id\":\"call_1\",\"name\":\"w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"},{"
        "\"type\":"
        "\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},{\"role\":"
        "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"It is sunny\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"description\":\"D\","
        "\"parameters\":" WEATHER
        ",\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":\"w\"}}",
        "{\"messages\":[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"user\",\"content\":"
        "\"ab\"},{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"R\",\"tool_"
        "calls\":"
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
        "\"{\\\"city\\\":\\\"P\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
        "\"content\":"
        "\"sunny\"},{\"role\":\"assistant\",\"content\":\"It is sunny\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"w\",\"description\":\"D\",\"parameters\":" WEATHER
        ",\"strict\":true}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"w\"}}"
        "}");
    same(f, "responses: function_calls after an assistant message join its tool_calls",
         "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
         "\"x\"},"
         "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"a\",\"arguments\":\"{}\"},{"
         "\"type\":"
         "\"function_call\",\"call_id\":\"c2\",\"name\":\"b\",\"arguments\":\"{}\"}],\"text\":{"
         "\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"},"
         "\"strict\":true}}}",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
         "\"x\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"a\","
         "\"arguments\":\"{}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"b\","
         "\"arguments\":\"{}\"}}]}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
         "\"name\":\"n\",\"schema\":{\"type\":\"object\"},\"strict\":true}}}");
    bad(f, "{\"model\":\"m\"}", "missing_required_parameter", "input");
    bad(f, "{\"input\":5}", "invalid_type", "input");
    bad(f, "{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "unsupported_value",
        "previous_response_id");
    bad(f, "{\"input\":\"x\",\"background\":true}", "unsupported_value", "background");
    bad(f, "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "unsupported_value",
        "tools[0]");
    bad(f, "{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "unsupported_value",
        "input[0]");
    bad(f, "{\"input\":[{\"type\":\"function_call\",\"name\":\"w\"}]}", "invalid_value",
        "input[0]");
    bad(f,
        "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
        "\"x\"}]}]}",
        "unsupported_value", "input[0].content[0]");
    bad(f, "{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "invalid_value", "input[0]");
}

static lily_delta mk(lily_delta_kind k, int call, const char *text) {
    lily_delta d;
    memset(&d, 0, sizeof d);
    d.kind = k;
    d.call = call;
    snprintf(d.id, sizeof d.id, "call_%d", call);
    lily_sb_puts(&d.text, text);
    return d;
}

static int n_events;
static void ev_start(void *ud, int i, const lily_blk *b, lily_sb *o) {
    (void)ud, (void)b;
    lily_sb_printf(o, "[%d", i);
    n_events++;
}
static void ev_delta(void *ud, int i, const lily_blk *b, const char *t, size_t n, lily_sb *o) {
    (void)ud, (void)b;
    lily_sb_printf(o, "%d:%.*s", i, (int)n, t);
}
static void ev_stop(void *ud, int i, const lily_blk *b, lily_sb *o) {
    (void)ud, (void)b;
    lily_sb_printf(o, "%d]", i);
}

/* Blocks in sequence: a call's closing fragment after text keeps the call one block, and the
 * text follows it. */
static void blocks(void) {
    lily_delta ds[] = {mk(LILY_DELTA_REASONING, 0, "r"), mk(LILY_DELTA_CONTENT, 0, "a"),
                       mk(LILY_DELTA_CALL, 0, "w"),      mk(LILY_DELTA_ARGS, 0, "{"),
                       mk(LILY_DELTA_CONTENT, 0, "x"),   mk(LILY_DELTA_REASONING, 0, "y"),
                       mk(LILY_DELTA_ARGS, 0, "}"),      mk(LILY_DELTA_CALL, 1, "v"),
                       mk(LILY_DELTA_ARGS, 1, "{}")};
    size_t n = sizeof ds / sizeof ds[0];
    lily_blkseq q = {0};
    lily_blkseq_cb cb = {NULL, ev_start, ev_delta, ev_stop};
    lily_sb o = {0};
    for (size_t i = 0; i < n; i++)
        lily_blkseq_delta(&q, &ds[i], &cb, &o);
    lily_blkseq_finish(&q, &cb, &o);
    CHECK(!strcmp(lily_sb_str(&o), "[00:r0][11:a1][22:{2:}2][33:x3][44:y4][55:{}5]"),
          "blkseq events: %s", lily_sb_str(&o));
    CHECK(q.n == 6 && q.b[2].kind == LILY_DELTA_CALL && !strcmp(lily_sb_str(&q.b[2].text), "{}") &&
              !strcmp(lily_sb_str(&q.b[2].name), "w") && !strcmp(q.b[2].call_id, "call_0") &&
              q.b[3].kind == LILY_DELTA_CONTENT && lily_blkseq_n_calls(&q) == 2,
          "blkseq blocks");
    lily_blkseq_free(&q);
    lily_sb_free(&o);
    for (size_t i = 0; i < n; i++)
        lily_sb_free(&ds[i].text);
}

int main(void) {
    blocks();
    messages();
    responses();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
