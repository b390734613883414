/* Request parsing tests: every error class of api.md §6.2 that the body parser produces (status,
 * code and param checked), and the normalisations of §2.1 (null equals absent, lenient integers,
 * stop forms, length aliases, thinking switch spellings and priority, message normalisation,
 * tool-call argument strings parsed to objects, tools filtering, tool_choice forms). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "server/request.h"

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    printf("%-72s %s\n", what, ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

/* Expects a rejection with the given status, code and param ("" = null). */
static void reject(lily_req_kind kind, const char *body, int status, const char *code,
                   const char *param) {
    lily_request r;
    lily_api_error e;
    lily_request_limits lim = {.max_body = 4096, .max_messages = 8};
    memset(&e, 0, sizeof e);
    int rc = lily_request_parse(kind, body, strlen(body), &lim, &r, &e);
    int ok = rc == -1 && e.status == status && e.code && !strcmp(e.code, code) &&
             !strcmp(e.param, param) && e.message[0];
    char what[200];
    snprintf(what, sizeof what, "reject %d %s %s", status, code, param[0] ? param : "(null)");
    if (!ok)
        printf("  body %.80s\n  got rc=%d status=%d code=%s param=%s msg=%s\n", body, rc, e.status,
               e.code ? e.code : "null", e.param, e.message);
    check(ok, what);
    if (!rc) lily_request_free(&r);
}

static int parse(lily_req_kind kind, const char *body, lily_request *r) {
    lily_api_error e;
    int rc = lily_request_parse(kind, body, strlen(body), NULL, r, &e);
    if (rc) printf("  unexpected error: %d %s %s %s\n", e.status, e.code, e.param, e.message);
    return rc;
}

static const char *msg_str(const lily_request *r, int i, const char *key) {
    const cJSON *m = cJSON_GetArrayItem(r->messages, i);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_errors(void) {
    const lily_req_kind C = LILY_REQ_CHAT;
    reject(C, "{\"messages\": [", 400, "invalid_json", "");
    reject(C, "{\"messages\": []} trailing", 400, "invalid_json", "");
    reject(C, "{\"messages\": \"\xff\xfe\"}", 400, "invalid_json", "");
    reject(C, "[1, 2]", 400, "invalid_type", "");
    reject(C, "{\"model\": \"x\"}", 400, "missing_required_parameter", "messages");
    reject(C, "{\"messages\": null}", 400, "missing_required_parameter", "messages");
    reject(C, "{\"messages\": {\"role\": \"user\"}}", 400, "invalid_type", "messages");
    reject(C, "{\"messages\": []}", 400, "invalid_value", "messages");
    reject(C, "{\"messages\": [3]}", 400, "invalid_type", "messages[0]");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}", 400,
           "missing_required_parameter", "messages[1].role");
    reject(C, "{\"messages\": [{\"role\": 7, \"content\": \"a\"}]}", 400, "invalid_type",
           "messages[0].role");
    reject(C, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"a\"}]}", 400, "invalid_value",
           "messages[0].role");
    reject(C, "{\"messages\": [{\"role\": \"user\"}]}", 400, "missing_required_parameter",
           "messages[0].content");
    reject(C, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "invalid_type",
           "messages[0].content");
    reject(C,
           "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\":\"text\",\"text\":"
           "\"a\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
           400, "unsupported_value", "messages[0].content[1]");
    reject(C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\":\"hologram\"}]}]}", 400,
           "invalid_value", "messages[0].content[0]");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
           "\"content\":\"b\"},{\"role\":\"assistant\",\"content\":\"c\"}]}",
           400, "invalid_value", "messages[2]");
    reject(C, "{\"messages\": [{\"role\": \"system\", \"content\": \"a\"}]}", 400, "invalid_value",
           "messages");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"temperature\": 3}", 400,
           "invalid_value", "temperature");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"temperature\": \"hot\"}",
           400, "invalid_type", "temperature");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"max_tokens\": 1.5}", 400,
           "invalid_type", "max_tokens");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"max_tokens\": 0}", 400,
           "invalid_value", "max_tokens");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"stop\": 4}", 400,
           "invalid_type", "stop");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"stop\": [\"a\", 1]}", 400,
           "invalid_type", "stop[1]");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"top_logprobs\": 3}", 400,
           "invalid_value", "top_logprobs");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"logprobs\": true, "
           "\"top_logprobs\": 21}",
           400, "invalid_value", "top_logprobs");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"n\": 2}", 400,
           "unsupported_value", "n");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"stream\": \"yes\"}", 400,
           "invalid_type", "stream");
    reject(C, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"model\": 5}", 400,
           "invalid_type", "model");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"reasoning_effort\": "
           "\"extreme\"}",
           400, "invalid_value", "reasoning_effort");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"chat_template_kwargs\": "
           "{\"enable_thinking\": 3}}",
           400, "invalid_type", "chat_template_kwargs.enable_thinking");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"logit_bias\": "
           "{\"abc\": 1}}",
           400, "invalid_value", "logit_bias.abc");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"tools\": [{\"type\":"
           "\"function\",\"function\":{\"description\":\"no name\"}}]}",
           400, "invalid_value", "tools[0].function.name");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"tools\": [{\"type\":"
           "\"function\",\"function\":{\"name\":\"f\"}}], \"tool_choice\": {\"type\":"
           "\"function\",\"function\":{\"name\":\"g\"}}}",
           400, "invalid_value", "tool_choice");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"tool_choice\": "
           "\"sometimes\"}",
           400, "invalid_value", "tool_choice");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"response_format\": "
           "{\"type\": \"json_schema\"}}",
           400, "invalid_type", "response_format.json_schema");
    /* a schema compiles (or fails naming the construct) before the loop's support is asked */
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"response_format\": "
           "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
           "{\"type\": \"string\", \"pattern\": \"^a\"}}}}",
           400, "unsupported_value", "response_format.json_schema.schema");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"response_format\": "
           "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
           "{\"type\": \"object\"}}}}",
           400, "unsupported_value", "response_format.type");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"response_format\": "
           "{\"type\": \"json_object\"}}",
           400, "unsupported_value", "response_format.type");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"}], \"response_format\": "
           "{\"type\": \"xml\"}}",
           400, "invalid_value", "response_format.type");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
           "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
           "\"arguments\":7}}]}]}",
           400, "invalid_type", "messages[1].tool_calls[0].function.arguments");
    /* limits */
    char big[5000];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = 0;
    memcpy(big, "{\"messages\":[]}", 15);
    reject(C, big, 413, "request_too_large", "");
    reject(C,
           "{\"messages\": [{\"role\":\"user\",\"content\":\"1\"},{\"role\":\"user\",\"content\":"
           "\"2\"},{\"role\":\"user\",\"content\":\"3\"},{\"role\":\"user\",\"content\":\"4\"},"
           "{\"role\":\"user\",\"content\":\"5\"},{\"role\":\"user\",\"content\":\"6\"},"
           "{\"role\":\"user\",\"content\":\"7\"},{\"role\":\"user\",\"content\":\"8\"},"
           "{\"role\":\"user\",\"content\":\"9\"}]}",
           400, "invalid_value", "messages");
    /* legacy completions */
    const lily_req_kind P = LILY_REQ_COMPLETION;
    reject(P, "{\"model\": \"m\"}", 400, "missing_required_parameter", "prompt");
    reject(P, "{\"prompt\": \"a\", \"suffix\": \"b\"}", 400, "unsupported_value", "suffix");
    reject(P, "{\"prompt\": \"a\", \"logprobs\": 9}", 400, "invalid_value", "logprobs");
    reject(P, "{\"prompt\": [\"a\", \"b\"]}", 400, "unsupported_value", "prompt");
    reject(P, "{\"prompt\": {}}", 400, "invalid_type", "prompt");
}

static void test_fields(void) {
    lily_request r;
    const char *b =
        "{\"model\": \"gpt-4o\", \"messages\": [{\"role\":\"user\",\"content\":\"hi\"}],"
        " \"temperature\": null, \"top_p\": 0.9, \"top_k\": 40.0, \"min_p\": 0.05, \"seed\": 1234,"
        " \"max_tokens\": 512.0, \"max_completion_tokens\": 77, \"stop\": \"END\","
        " \"stream\": true, \"stream_options\": {\"include_usage\": true},"
        " \"logprobs\": true, \"top_logprobs\": 3, \"presence_penalty\": 1.5,"
        " \"repeat_penalty\": 1.1, \"logit_bias\": {\"42\": -100, \"7\": 5},"
        " \"store\": true, \"metadata\": {\"x\": 1}, \"service_tier\": \"auto\"}";
    int ok = !parse(LILY_REQ_CHAT, b, &r);
    ok = ok && !strcmp(r.model, "gpt-4o") && r.max_tokens == 77 && r.n_stop == 1 &&
         !strcmp(r.stop[0], "END") && r.stream && r.include_usage && r.has_seed && r.seed == 1234 &&
         r.top_k == 40 && r.logprobs && r.top_logprobs == 3 &&
         !(r.given & LILY_GIVEN_TEMPERATURE) && (r.given & LILY_GIVEN_TOP_P) && r.top_p > 0.89f &&
         r.top_p < 0.91f && r.n_bias == 2 && r.bias[0].id == 42 && r.bias[0].bias == -100 &&
         r.presence_penalty == 1.5f && (r.given & LILY_GIVEN_REPEAT) && r.thinking == -1 &&
         r.parallel_tool_calls == 1 && !r.prefill;
    printf("  model=%s max_tokens=%d seed=%llu top_k=%d given=%#x\n", r.model, r.max_tokens,
           (unsigned long long)r.seed, r.top_k, r.given);
    check(ok, "fields: lenient ints, null = absent, aliases, unknown fields ignored");
    lily_request_free(&r);

    ok = !parse(LILY_REQ_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":[\"x\",\"\",\"yz\"]"
                ",\"n_predict\":-1}",
                &r);
    ok = ok && r.n_stop == 2 && !strcmp(r.stop[1], "yz") && r.max_tokens == 0;
    check(ok, "stop array (empty strings dropped), n_predict -1 = no limit");
    lily_request_free(&r);
}

static int thinking_of(const char *extra) {
    char b[512];
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]%s}", extra);
    lily_request r;
    if (parse(LILY_REQ_CHAT, b, &r)) return -2;
    int t = r.thinking;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(r.kwargs, "enable_thinking");
    if (t >= 0 && (!cJSON_IsBool(kw) || cJSON_IsTrue(kw) != t)) t = -3;
    if (t < 0 && kw) t = -4;
    lily_request_free(&r);
    return t;
}

static void test_thinking(void) {
    static const struct {
        const char *extra;
        int want;
    } cases[] = {
        {"", -1},
        {",\"chat_template_kwargs\":{\"enable_thinking\":false}", 0},
        {",\"chat_template_kwargs\":{\"enable_thinking\":\"false\"}", 0},
        {",\"chat_template_kwargs\":{\"enable_thinking\":\"true\"}", 1},
        {",\"enable_thinking\":false", 0},
        {",\"enableThinking\":false", 0},
        {",\"think\":false", 0},
        {",\"think\":true", 1},
        {",\"reasoning_effort\":\"none\"", 0},
        {",\"reasoning_effort\":\"minimal\"", 0},
        {",\"reasoning_effort\":\"high\"", 1},
        {",\"reasoning\":{\"effort\":\"low\"}", 1},
        {",\"reasoning\":{\"effort\":\"none\"}", 0},
        {",\"chat_template_kwargs\":{\"enable_thinking\":true},\"reasoning_effort\":\"none\"", 1},
        {",\"enable_thinking\":false,\"reasoning_effort\":\"high\"", 0},
        {",\"chat_template_kwargs\":{\"preserve_thinking\":true},\"think\":false", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = thinking_of(cases[i].extra);
        char what[200];
        snprintf(what, sizeof what, "thinking%s -> %d (got %d)", cases[i].extra, cases[i].want,
                 got);
        check(got == cases[i].want, what);
    }
    lily_request r;
    int ok = !parse(LILY_REQ_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                    "\"chat_template_kwargs\":{\"preserve_thinking\":true,\"foo\":\"bar\"}}",
                    &r);
    ok = ok && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r.kwargs, "preserve_thinking")) &&
         cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r.kwargs, "foo"));
    check(ok, "other chat_template_kwargs passed through");
    lily_request_free(&r);
}

static void test_messages(void) {
    lily_request r;
    const char *b =
        "{\"messages\":["
        "{\"role\":\"developer\",\"content\":\"Be terse.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Wea\"},{\"type\":\"text\","
        "\"text\":\"ther?\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning\":\"need tool\",\"tool_calls\":[{"
        "\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": 2}\"}},{\"id\":\"call_2\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\": \\\"Os\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"4C\"},"
        "{\"role\":\"function\",\"name\":\"get_weather\",\"content\":\"?\"},"
        "{\"role\":\"system\",\"content\":\"Use metric.\"},"
        "{\"role\":\"assistant\",\"content\":\"It is\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
        "{\"type\":\"object\"}}},{\"type\":\"custom\",\"custom\":{\"name\":\"x\"}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
        "\"parallel_tool_calls\":false}";
    int ok = !parse(LILY_REQ_CHAT, b, &r);
    if (ok) {
        char *dump = cJSON_PrintUnformatted(r.messages);
        printf("  %s\n", dump);
        cJSON_free(dump);
        const cJSON *asst = cJSON_GetArrayItem(r.messages, 2);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(asst, "tool_calls");
        const cJSON *a0 = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "function"),
            "arguments");
        const cJSON *a1 = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 1), "function"),
            "arguments");
        ok = cJSON_GetArraySize(r.messages) == 6 && !strcmp(msg_str(&r, 0, "role"), "system") &&
             !strcmp(msg_str(&r, 0, "content"), "Be terse.\n\nUse metric.") &&
             !strcmp(msg_str(&r, 1, "content"), "Weather?") &&
             !strcmp(msg_str(&r, 2, "content"), "") &&
             !strcmp(msg_str(&r, 2, "reasoning_content"), "need tool") && cJSON_IsObject(a0) &&
             cJSON_GetObjectItemCaseSensitive(a0, "days")->valuedouble == 2 && cJSON_IsString(a1) &&
             !strcmp(msg_str(&r, 3, "role"), "tool") && !strcmp(msg_str(&r, 4, "role"), "tool") &&
             r.prefill && cJSON_GetArraySize(r.tools) == 1 && r.tool_choice == LILY_TOOLS_NAMED &&
             !strcmp(r.tool_name, "get_weather") && !r.parallel_tool_calls;
    }
    check(ok, "messages: developer->system, merge, parts, reasoning, arguments->object, prefill");
    if (ok) lily_request_free(&r);

    ok = !parse(LILY_REQ_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                "\"system\",\"content\":\"late\"}],\"functions\":[{\"name\":\"f\"}],"
                "\"function_call\":\"none\"}",
                &r);
    ok = ok && !strcmp(msg_str(&r, 0, "role"), "system") &&
         !strcmp(msg_str(&r, 0, "content"), "late") && !strcmp(msg_str(&r, 1, "role"), "user") &&
         cJSON_GetArraySize(r.tools) == 1 && r.tool_choice == LILY_TOOLS_NONE && !r.prefill;
    check(ok, "late system moved to front; legacy functions/function_call");
    lily_request_free(&r);
}

static void test_completion(void) {
    lily_request r;
    int ok = !parse(LILY_REQ_COMPLETION,
                    "{\"prompt\":\"Once upon\",\"max_tokens\":16,"
                    "\"logprobs\":2,\"echo\":true}",
                    &r);
    ok = ok && r.prompt && !strcmp(r.prompt, "Once upon") && r.max_tokens == 16 && r.logprobs &&
         r.top_logprobs == 2 && r.echo && !r.messages;
    check(ok, "completion: prompt string, integer logprobs, echo");
    lily_request_free(&r);
    ok = !parse(LILY_REQ_COMPLETION, "{\"prompt\":[11, 22, 33]}", &r);
    ok = ok && !r.prompt && r.n_prompt_ids == 3 && r.prompt_ids[2] == 33;
    check(ok, "completion: prompt as token ids");
    lily_request_free(&r);
}

/* With a generation loop that applies grammars (limits.constrained), response_format gives one. */
static void test_response_format(void) {
    lily_request_limits lim = {.constrained = 1};
    const char *bodies[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":"
        "{\"type\":\"json_object\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":"
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,"
        "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
        "\"required\":[\"a\"],\"additionalProperties\":false}}}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":"
        "{\"type\":\"text\"}}",
    };
    for (int i = 0; i < 3; i++) {
        lily_request r;
        lily_api_error e;
        int rc = lily_request_parse(LILY_REQ_CHAT, bodies[i], strlen(bodies[i]), &lim, &r, &e);
        check(rc == 0 && (i < 2 ? r.grammar != NULL : r.grammar == NULL),
              i == 0   ? "response_format json_object gives a grammar"
              : i == 1 ? "response_format json_schema gives a grammar"
                       : "response_format text gives none");
        if (!rc) lily_request_free(&r);
    }
}

/* Seeds: any JSON integer in [-2^63, 2^64), written exactly or as an integral number; the rest
 * 400, with no float-to-integer cast out of range (the sanitizer build traps those). */
static void seed_ok(const char *lit, uint64_t want) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"seed\":%s}", lit);
    lily_request r;
    int ok = !parse(LILY_REQ_CHAT, body, &r) && r.has_seed && r.seed == want;
    char what[160];
    snprintf(what, sizeof what, "seed %s accepted", lit);
    if (!ok) printf("  got seed=%llu\n", (unsigned long long)r.seed);
    check(ok, what);
    lily_request_free(&r);
}

static void seed_bad(const char *lit) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"seed\":%s}", lit);
    reject(LILY_REQ_CHAT, body, 400, "invalid_value", "seed");
}

static void test_seeds(void) {
    seed_ok("0", 0);
    seed_ok("18446744073709551615", UINT64_MAX);
    seed_ok("9223372036854775807", (uint64_t)INT64_MAX);
    seed_ok("-9223372036854775808", UINT64_C(1) << 63);
    seed_ok("-1", UINT64_MAX);
    seed_ok("1e3", 1000);
    seed_ok("512.0", 512);
    seed_ok("-1e18", (uint64_t)0 - UINT64_C(1000000000000000000));
    seed_bad("18446744073709551616");
    seed_bad("-9223372036854775809");
    seed_bad("-1.5e19"); /* was an out-of-range (int64_t) cast: UB */
    seed_ok("1.8e19", UINT64_C(18000000000000000000));
    seed_bad("1.9e19"); /* above 2^64 */
    seed_bad("1.5");
    seed_bad("1e300");
    reject(LILY_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"seed\":\"1\"}",
           400, "invalid_type", "seed");
    /* a nested "seed" is not the top-level one */
    lily_request r;
    int ok = !parse(LILY_REQ_CHAT,
                    "{\"x\":{\"seed\":5},\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                    "\"seed\":7}",
                    &r) &&
             r.seed == 7;
    check(ok, "seed: the top-level member, not a nested one");
    lily_request_free(&r);
}

/* NUL in a string: rejected with 400 (cJSON would cut the string at it); an escaped backslash
 * followed by "u0000" is plain text. */
static void test_nul(void) {
    reject(LILY_REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000 b c d e f\"}]}",
           400, "invalid_value", "");
    reject(LILY_REQ_COMPLETION, "{\"prompt\":\"x\\u0000\"}", 400, "invalid_value", "");
    lily_request r;
    int ok = !parse(LILY_REQ_CHAT,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000 b\"}]}", &r) &&
             !strcmp(msg_str(&r, 0, "content"), "a\\u0000 b");
    check(ok, "nul: an escaped backslash before u0000 is text");
    lily_request_free(&r);
}

/* Error messages are valid UTF-8, cut on a character boundary. */
static int valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int k = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        if (!k || (*p >= 0x80 && *p < 0xC2)) return 0;
        for (int j = 1; j < k; j++)
            if ((p[j] & 0xC0) != 0x80) return 0;
        p += k;
    }
    return 1;
}

static void test_error_text(void) {
    lily_api_error e;
    lily_api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                  "The model '%s' does not exist", "\xff\xfe");
    check(valid_utf8(e.message) && strstr(e.message, "\xEF\xBF\xBD\xEF\xBF\xBD"),
          "error text: invalid bytes become U+FFFD");
    char big[2000];
    for (int i = 0; i < 999; i++)
        memcpy(big + 2 * i, "\xC3\xA9", 2); /* é */
    big[1998] = 0;
    for (int shift = 0; shift < 2; shift++) {
        lily_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "%.*s%s", shift, "x", big);
        check(valid_utf8(e.message) && strlen(e.message) >= sizeof e.message - 4,
              "error text: a long message is cut on a character boundary");
    }
    lily_sb b = {0};
    lily_api_fail(&e, 400, "invalid_request_error", NULL, "a\"b", "quote \" and \\ and \n");
    lily_api_error_json(&e, &b);
    cJSON *j = cJSON_Parse(lily_sb_str(&b));
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
    check(cJSON_IsString(m) && !strcmp(m->valuestring, "quote \" and \\ and \n"),
          "error text: escaped in the JSON body");
    cJSON_Delete(j);
    lily_sb_free(&b);
}

/* Other servers' ways to constrain output: a 400 naming the field, not silence; null is absent,
 * and harmless unknown fields stay accepted. */
static void test_foreign_constraints(void) {
    static const char *const fields[] = {"grammar",        "guided_json",       "guided_regex",
                                         "guided_choice",  "json_schema",       "format",
                                         "guided_grammar", "structured_outputs"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"%s\":\"x\"}", fields[i]);
        reject(LILY_REQ_CHAT, body, 400, "unsupported_parameter", fields[i]);
    }
    reject(LILY_REQ_COMPLETION, "{\"prompt\":\"a\",\"guided_regex\":\"[a-z]+\"}", 400,
           "unsupported_parameter", "guided_regex");
    lily_request r;
    int rc = parse(LILY_REQ_CHAT,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"grammar\":null,"
                   "\"store\":true,\"metadata\":{\"k\":\"v\"},\"format\":null}",
                   &r);
    check(rc == 0, "null constraint fields and harmless unknown fields are accepted");
    if (!rc) lily_request_free(&r);
}

int main(void) {
    test_errors();
    test_foreign_constraints();
    test_fields();
    test_thinking();
    test_messages();
    test_completion();
    test_response_format();
    test_seeds();
    test_nul();
    test_error_text();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
