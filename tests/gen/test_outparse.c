/* Output parser tests: realistic Qwen3.5 outputs (reasoning, content, tool calls in XML and JSON
 * form, nested values, non-ASCII, malformed and truncated calls) are parsed in one piece and
 * checked against the expected message; then each is re-fed split at every byte position, byte
 * by byte, and in random token-sized pieces, and the streamed deltas must assemble into exactly
 * the same message (same text, same call ids, same argument bytes), with valid UTF-8 in every
 * delta and every call's arguments valid JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/outparse.h"

static int n_pass, n_fail;

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":"
    "\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set_opts\",\"parameters\":{\"type\":"
    "\"object\",\"$defs\":{\"Flags\":{\"type\":\"object\"}},\"properties\":{\"flags\":{\"$ref\":"
    "\"#/$defs/Flags\"},\"verbose\":{\"type\":\"boolean\"},\"ratio\":{\"anyOf\":[{\"type\":"
    "\"null\"},{\"type\":\"number\"}]},\"tags\":{\"type\":[\"array\",\"null\"]},\"mode\":{"
    "\"enum\":[\"fast\",\"slow\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

typedef struct {
    const char *name;
    int thinking, tools, single;
    const char *input;
    const char *reasoning, *content;
    int n_calls;
    const char *call_name[3];
    const char *call_args[3];
} tcase;

static const tcase CASES[] = {
    {"think+content",
     1,
     1,
     0,
     "The user asks for the capital.\nIt is Canberra.\n</think>\n\nCanberra is the capital.",
     "The user asks for the capital.\nIt is Canberra.",
     "Canberra is the capital.",
     0,
     {0},
     {0}},
    {"think+call (spec example)",
     1,
     1,
     0,
     "The user wants Oslo weather for two days.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
     "</tool_call>",
     "The user wants Oslo weather for two days.",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Oslo\", \"days\": 2}"}},
    {"text then two calls",
     0,
     1,
     0,
     "Let me check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
     "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=city>\nBergen\n</parameter>\n</function>\n"
     "</tool_call>",
     "",
     "Let me check both.",
     2,
     {"get_weather", "get_weather"},
     {"{\"city\": \"Oslo\"}", "{\"days\": 3, \"city\": \"Bergen\"}"}},
    {"nested JSON and python values",
     0,
     1,
     0,
     "<tool_call>\n<function=set_opts>\n<parameter=flags>\n{\"a\": [1, 2,{\"b\" :null}],\n"
     "  \"c\":\"x\\u00e9\"}\n</parameter>\n<parameter=verbose>\nTrue\n</parameter>\n"
     "<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n['x', 'y',]\n</parameter>\n"
     "<parameter=mode>\n123\n</parameter>\n</function>\n</tool_call>",
     "",
     "",
     1,
     {"set_opts"},
     {"{\"flags\": {\"a\": [1, 2, {\"b\": null}], \"c\": \"x\xc3\xa9\"}, \"verbose\": true, "
      "\"ratio\": 0.5, \"tags\": [\"x\", \"y\"], \"mode\": \"123\"}"}},
    {"non-ASCII everywhere",
     1,
     1,
     0,
     "\xe7\x94\xa8\xe6\x88\xb7\xe6\x83\xb3\xe7\x9f\xa5\xe9\x81\x93\xe5\xa4\xa9\xe6\xb0\x94 "
     "\xf0\x9f\x8c\xa6\n</think>\n\n\xe5\xa5\xbd\xe7\x9a\x84 \xf0\x9f\x98\x80\n<tool_call>\n"
     "<function=get_weather>\n<parameter=city>\n\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x8c\xb8\n"
     "</parameter>\n</function>\n</tool_call>",
     "\xe7\x94\xa8\xe6\x88\xb7\xe6\x83\xb3\xe7\x9f\xa5\xe9\x81\x93\xe5\xa4\xa9\xe6\xb0\x94 "
     "\xf0\x9f\x8c\xa6",
     "\xe5\xa5\xbd\xe7\x9a\x84 \xf0\x9f\x98\x80",
     1,
     {"get_weather"},
     {"{\"city\": \"\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x8c\xb8\"}"}},
    {"XML value containing </parameter>",
     0,
     1,
     0,
     "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.xml\n</parameter>\n"
     "<parameter=content>\n<a>\n</parameter>\n</a>\n\"q\"\ttab\n</parameter>\n</function>\n"
     "</tool_call>",
     "",
     "",
     1,
     {"write_file"},
     {"{\"path\": \"/tmp/a.xml\", \"content\": \"<a>\\n</parameter>\\n</a>\\n\\\"q\\\"\\ttab\"}"}},
    {"call inside think, no </think>",
     1,
     1,
     0,
     "I should call the tool.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n"
     "</parameter>\n</function>\n</tool_call>",
     "I should call the tool.",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Lima\"}"}},
    {"call inside think, then stray </think>",
     1,
     1,
     0,
     "Need data.\n<tool_call>\n<function=now>\n</function>\n</tool_call>\n</think>\n\nWaiting.",
     "Need data.",
     "Waiting.",
     1,
     {"now"},
     {"{}"}},
    {"malformed: tool_call then prose",
     0,
     1,
     0,
     "<tool_call>\nI think the answer is 4.\n",
     "",
     "<tool_call>\nI think the answer is 4.",
     0,
     {0},
     {0}},
    {"malformed inside reasoning returns to reasoning",
     1,
     1,
     0,
     "Maybe use <tool_call> syntax? No.\n</think>\nAnswer.",
     "Maybe use <tool_call> syntax? No.",
     "Answer.",
     0,
     {0},
     {0}},
    {"truncated inside a value",
     0,
     1,
     0,
     "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.txt\n</parameter>\n"
     "<parameter=content>\nhello wor",
     "",
     "",
     1,
     {"write_file"},
     {"{\"path\": \"/tmp/a.txt\", \"content\": \"hello wor\"}"}},
    {"truncated inside a non-string value",
     0,
     1,
     0,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
     "<parameter=days>\n1",
     "",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Oslo\", \"days\": 1}"}},
    {"truncated in the function name",
     0,
     1,
     0,
     "Sure.\n<tool_call>\n<function=get_wea",
     "",
     "Sure.\n<tool_call>\n<function=get_wea",
     0,
     {0},
     {0}},
    {"truncated after </parameter",
     0,
     1,
     0,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</paramet",
     "",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Oslo\\n</paramet\"}"}},
    {"no tools: XML stays content",
     0,
     0,
     0,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
     "</tool_call>",
     "",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
     "</tool_call>",
     0,
     {0},
     {0}},
    {"Qwen3 JSON form",
     1,
     1,
     0,
     "Call it.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\":\"Paris\",\"days\":1}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
     "\"arguments\": \"{}\"}\n</tool_call>",
     "Call it.",
     "",
     2,
     {"get_weather", "now"},
     {"{\"city\": \"Paris\", \"days\": 1}", "{}"}},
    {"JSON form malformed",
     0,
     1,
     0,
     "<tool_call>\n{\"nam\": 1}\n</tool_call>\nok",
     "",
     "<tool_call>\n{\"nam\": 1}\n</tool_call>\nok",
     0,
     {0},
     {0}},
    {"missing <tool_call>",
     0,
     1,
     0,
     "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>",
     "",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Rome\"}"}},
    {"unknown function, no schema",
     0,
     1,
     0,
     "<tool_call>\n<function=mystery>\n<parameter=x>\n42\n</parameter>\n<parameter=y>\nhello\n"
     "</parameter>\n<parameter=z>\n[1, {\"k\": true}]\n</parameter>\n</function>\n</tool_call>",
     "",
     "",
     1,
     {"mystery"},
     {"{\"x\": 42, \"y\": \"hello\", \"z\": [1, {\"k\": true}]}"}},
    {"string param that looks like JSON",
     0,
     1,
     0,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\n{\"a\":1}\n</parameter>\n"
     "<parameter=days>\n2.0\n</parameter>\n</function>\n</tool_call>",
     "",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"{\\\"a\\\":1}\", \"days\": 2}"}},
    {"model re-emits <think>", 1, 1, 0, "<think>\nhmm\n</think>\nok", "hmm", "ok", 0, {0}, {0}},
    {"stray think at content start", 0, 0, 0, "<think>x y</think>\n\nz", "x y", "z", 0, {0}, {0}},
    {"angle brackets that are not markers",
     0,
     1,
     0,
     "a < b and <b>bold</b> <tool>x</tool> <func <param",
     "",
     "a < b and <b>bold</b> <tool>x</tool> <func <param",
     0,
     {0},
     {0}},
    {"single call (parallel_tool_calls false)",
     0,
     1,
     1,
     "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
     "</function>\n</tool_call>",
     "",
     "",
     1,
     {"now"},
     {"{}"}},
    {"reasoning truncated",
     1,
     1,
     0,
     "Let me think about th",
     "Let me think about th",
     "",
     0,
     {0},
     {0}},
    {"text after calls",
     0,
     1,
     0,
     "<tool_call>\n<function=now>\n</function>\n</tool_call>\nDone, \xc3\xa9t\xc3\xa9.",
     "",
     "Done, \xc3\xa9t\xc3\xa9.",
     1,
     {"now"},
     {"{}"}},
    {"markers in reasoning without tools",
     1,
     0,
     0,
     "Use <tool_call> here?\n</think>\nNo <function=x> either.",
     "Use <tool_call> here?",
     "No <function=x> either.",
     0,
     {0},
     {0}},
    {"bare </parameter> before </function>",
     0,
     1,
     0,
     "<tool_call><function=get_weather><parameter=city>Oslo</parameter></function></tool_call>",
     "",
     "",
     1,
     {"get_weather"},
     {"{\"city\": \"Oslo\"}"}},
    {"stray text between parameters",
     0,
     1,
     0,
     "<tool_call>\n<function=get_weather>\nnote  this\n<parameter=city>\nOslo\n</parameter>\n"
     "</function>\njunk\n</tool_call>",
     "",
     "note  thisjunk\n</tool_call>",
     1,
     {"get_weather"},
     {"{\"city\": \"Oslo\"}"}},
    {"content paragraphs and trailing space",
     0,
     1,
     0,
     "\n\nPara one.\n\nPara two.  \n",
     "",
     "Para one.\n\nPara two.",
     0,
     {0},
     {0}},
    {"empty output", 1, 1, 0, "", "", "", 0, {0}, {0}},
    {"<think> after reasoning text stays text (fuzz find)",
     1,
     1,
     0,
     "abc<think>def</think>x",
     "abc<think>def",
     "x",
     0,
     {0},
     {0}},
    {"<think> after content stays content",
     0,
     1,
     0,
     "  hi <think>x</think>",
     "",
     "hi <think>x</think>",
     0,
     {0},
     {0}},
};

/* ---- checks ------------------------------------------------------------------------------- */

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Feeds input in the pieces given by cut positions (ascending, exclusive of 0 and len). */
static int run(const tcase *c, const cJSON *tools, const size_t *cuts, int ncuts, lily_outmsg *m,
               char *why, size_t whylen) {
    lily_outparse_opts o = {.thinking = c->thinking,
                            .tools = c->tools,
                            .tool_defs = tools,
                            .single_call = c->single,
                            .id_seed = 42};
    lily_outparse *p = lily_outparse_create(&o);
    size_t len = strlen(c->input), prev = 0;
    int ok = 1, headers = 0;
    for (int k = 0; k <= ncuts + 1; k++) {
        if (k <= ncuts) {
            size_t at = k < ncuts ? cuts[k] : len;
            lily_outparse_feed(p, c->input + prev, at - prev);
            prev = at;
        } else {
            lily_outparse_finish(p);
        }
        size_t n;
        const lily_delta *d = lily_outparse_deltas(p, &n);
        for (size_t i = 0; i < n; i++) {
            if (!valid_utf8(d[i].text.data ? d[i].text.data : "", d[i].text.len)) {
                snprintf(why, whylen, "delta with invalid UTF-8");
                ok = 0;
            }
            if (d[i].kind == LILY_DELTA_CALL) {
                if (d[i].call != headers++) ok = 0, snprintf(why, whylen, "call index order");
            } else if (d[i].kind == LILY_DELTA_ARGS && d[i].call != headers - 1) {
                ok = 0;
                snprintf(why, whylen, "args for call %d after header %d", d[i].call, headers);
            }
        }
        lily_outmsg_add(m, d, n);
        lily_outparse_clear(p);
    }
    lily_outparse_free(p);
    return ok;
}

static int same(const lily_outmsg *a, const lily_outmsg *b, char *why, size_t whylen) {
    if (strcmp(lily_sb_str(&a->reasoning), lily_sb_str(&b->reasoning))) {
        snprintf(why, whylen, "reasoning [%s] vs [%s]", lily_sb_str(&a->reasoning),
                 lily_sb_str(&b->reasoning));
        return 0;
    }
    if (strcmp(lily_sb_str(&a->content), lily_sb_str(&b->content))) {
        snprintf(why, whylen, "content [%s] vs [%s]", lily_sb_str(&a->content),
                 lily_sb_str(&b->content));
        return 0;
    }
    if (a->n_calls != b->n_calls) {
        snprintf(why, whylen, "%d calls vs %d", a->n_calls, b->n_calls);
        return 0;
    }
    for (int i = 0; i < a->n_calls; i++) {
        if (strcmp(a->calls[i].id, b->calls[i].id) ||
            strcmp(lily_sb_str(&a->calls[i].name), lily_sb_str(&b->calls[i].name)) ||
            strcmp(lily_sb_str(&a->calls[i].args), lily_sb_str(&b->calls[i].args))) {
            snprintf(why, whylen, "call %d: %s %s vs %s %s", i, lily_sb_str(&a->calls[i].name),
                     lily_sb_str(&a->calls[i].args), lily_sb_str(&b->calls[i].name),
                     lily_sb_str(&b->calls[i].args));
            return 0;
        }
    }
    return 1;
}

static int check_expected(const tcase *c, const lily_outmsg *m) {
    int ok = !strcmp(lily_sb_str(&m->reasoning), c->reasoning) &&
             !strcmp(lily_sb_str(&m->content), c->content) && m->n_calls == c->n_calls;
    for (int i = 0; ok && i < c->n_calls; i++) {
        ok = !strcmp(lily_sb_str(&m->calls[i].name), c->call_name[i]) &&
             !strcmp(lily_sb_str(&m->calls[i].args), c->call_args[i]) &&
             !strncmp(m->calls[i].id, "call_", 5) && strlen(m->calls[i].id) == 29;
        cJSON *j = cJSON_Parse(lily_sb_str(&m->calls[i].args));
        ok = ok && cJSON_IsObject(j);
        cJSON_Delete(j);
    }
    if (!ok) {
        printf("  got: reasoning=[%s] content=[%s] calls=%d\n", lily_sb_str(&m->reasoning),
               lily_sb_str(&m->content), m->n_calls);
        for (int i = 0; i < m->n_calls; i++)
            printf("       call %d %s %s %s\n", i, m->calls[i].id, lily_sb_str(&m->calls[i].name),
                   lily_sb_str(&m->calls[i].args));
    }
    return ok;
}

static void test_case(const tcase *c, const cJSON *tools) {
    char why[1024] = "";
    lily_outmsg whole = {0};
    int ok = run(c, tools, NULL, 0, &whole, why, sizeof why) && check_expected(c, &whole);
    size_t len = strlen(c->input);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    long splits = 0;
    /* every single cut position, and every pair of cuts for short inputs */
    for (size_t a = 1; ok && a < len; a++) {
        for (size_t b = a; ok && b < (len <= 120 ? len : a + 1); b++) {
            int nc = 0;
            cuts[nc++] = a;
            if (b > a) cuts[nc++] = b;
            lily_outmsg m = {0};
            ok = run(c, tools, cuts, nc, &m, why, sizeof why) && same(&whole, &m, why, sizeof why);
            if (!ok) printf("  split at %zu,%zu: %s\n", a, b, why);
            lily_outmsg_free(&m);
            splits++;
        }
    }
    /* byte by byte, then random token-sized pieces (1..7 bytes) */
    for (int seed = 0; ok && seed < 40; seed++) {
        int nc = 0;
        unsigned r = (unsigned)seed * 2654435761u + 1;
        for (size_t at = 0;;) {
            r = r * 1103515245u + 12345u;
            at += seed == 0 ? 1 : 1 + (r >> 16) % 7;
            if (at >= len) break;
            cuts[nc++] = at;
        }
        lily_outmsg m = {0};
        ok = run(c, tools, cuts, nc, &m, why, sizeof why) && same(&whole, &m, why, sizeof why);
        if (!ok) printf("  random pieces seed %d: %s\n", seed, why);
        lily_outmsg_free(&m);
        splits++;
    }
    free(cuts);
    lily_outmsg_free(&whole);
    printf("%-50s %ld splits  %s\n", c->name, splits, ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

/* Ids differ between seeds and between calls of one response. */
static void test_ids(const cJSON *tools) {
    const char *out = "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n"
                      "<function=now>\n</function>\n</tool_call>";
    char ids[2][2][32];
    for (int s = 0; s < 2; s++) {
        lily_outparse_opts o = {.tools = 1, .tool_defs = tools, .id_seed = 1000u + (unsigned)s};
        lily_outparse *p = lily_outparse_create(&o);
        lily_outparse_feed(p, out, strlen(out));
        lily_outparse_finish(p);
        lily_outmsg m = {0};
        size_t n;
        const lily_delta *d = lily_outparse_deltas(p, &n);
        lily_outmsg_add(&m, d, n);
        memcpy(ids[s][0], m.calls[0].id, 32);
        memcpy(ids[s][1], m.calls[1].id, 32);
        lily_outmsg_free(&m);
        lily_outparse_free(p);
    }
    int ok = strcmp(ids[0][0], ids[0][1]) && strcmp(ids[0][0], ids[1][0]);
    printf("%-50s %s %s %s  %s\n", "call ids unique", ids[0][0], ids[0][1], ids[1][0],
           ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

int main(void) {
    cJSON *tools = cJSON_Parse(TOOLS);
    if (!tools) {
        printf("bad tools JSON\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        test_case(&CASES[i], tools);
    test_ids(tools);
    cJSON_Delete(tools);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
