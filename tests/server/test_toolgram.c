/* The enforced tool-call grammar (server/toolgram.h) in the XML form of the Qwen3.5/3.6 chat
 * template: random walks under each tool's grammar (a random allowed token per step over a
 * synthetic vocabulary with <tool_call> / </tool_call> as added tokens) must finish, read as the
 * template writes a call (<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
 * </function>\n</tool_call>), and come out of the output parser (gen/outparse.h) as exactly one
 * call of that name whose arguments are a JSON object holding the required parameters, each of
 * its declared type. Strings are bare text, numbers, booleans, objects and arrays JSON; a tool
 * the form cannot carry (a parameter name holding '>', any parameter names, a non-strict schema
 * the compiler does not take) falls back to the JSON form; without xml the JSON form is kept; a strict tool with an unsupported schema is a 400. With --emit FILE each
 * call's schema and arguments go to FILE (one JSON line each) for the independent validator
 * (tests/scripts/toolgram_ajv.sh: ajv). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "base/err.h"
#include "gen/outparse.h"
#include "grammar/matcher.h"
#include "grammar/trie.h"
#include "server/toolgram.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static FILE *g_emit;
static int32_t g_open, g_close, g_end;

/* 256 byte tokens, pieces of the XML call form and of JSON, random strings, the two call
 * markers as added tokens and an end token */
static lily_token_trie *make_trie(void) {
    static const char *const pieces[] = {"<parameter=",
                                         "</parameter>",
                                         "\n</parameter>\n",
                                         "<function=",
                                         "</function>",
                                         "</function>\n",
                                         "\n",
                                         ">\n",
                                         "{",
                                         "}",
                                         "{\"",
                                         "\":",
                                         "\": ",
                                         "\",",
                                         "\"}",
                                         "]",
                                         "[",
                                         "true",
                                         "false",
                                         "null",
                                         "12",
                                         "-3",
                                         "0.5",
                                         "e+",
                                         "2024-",
                                         "01",
                                         "abc",
                                         "city",
                                         "days",
                                         "\xC3\xA9",
                                         "\xE2\x82\xAC",
                                         "<",
                                         "</",
                                         "</para",
                                         "meter>",
                                         " ",
                                         "  "};
    const char *alpha = "abcxyz0123456789 -_.,:<>/=\"{}[]\n";
    enum { N = 1200 };
    static char store[N * 8];
    const char *bytes[N];
    size_t lens[N];
    uint8_t text[N];
    int32_t n = 0;
    size_t pos = 0;
    for (int b = 0; b < 256; b++) {
        store[pos] = (char)b;
        bytes[n] = store + pos++;
        lens[n] = 1;
        text[n++] = 1;
    }
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        bytes[n] = pieces[i];
        lens[n] = strlen(pieces[i]);
        text[n++] = 1;
    }
    g_open = n, bytes[n] = "<tool_call>", lens[n] = 11, text[n++] = 0;
    g_close = n, bytes[n] = "</tool_call>", lens[n] = 12, text[n++] = 0;
    g_end = n, bytes[n] = "<|im_end|>", lens[n] = 10, text[n++] = 0;
    while (n < N) {
        size_t len = 2 + rnd() % 5;
        for (size_t k = 0; k < len; k++)
            store[pos + k] = alpha[rnd() % strlen(alpha)];
        bytes[n] = store + pos;
        lens[n] = len;
        text[n++] = 1;
        pos += len;
    }
    lily_token_trie *t;
    lily_err e;
    LILY_ASSERT(lily_token_trie_create(n, bytes, lens, text, &g_end, 1, &t, &e) == 0);
    return t;
}

/* One random generation under g: the output text (markers written out), 0 when it did not
 * finish within the budget. Short tokens first, then ones that close something. */
static int walk(const lily_grammar *g, const lily_token_trie *t, lily_sb *out) {
    enum { MAX_STEPS = 4000 };
    lily_gmatch *m;
    lily_err e;
    LILY_ASSERT(lily_gmatch_create(g, t, NULL, &m, &e) == 0);
    uint32_t *mask = malloc(lily_token_trie_mask_words(t) * 4);
    int32_t *all = malloc((size_t)t->n_vocab * sizeof *all), *pref = malloc((size_t)t->n_vocab * 4);
    lily_sb_clear(out);
    for (int step = 0; step < MAX_STEPS && !lily_gmatch_is_finished(m); step++) {
        lily_gmatch_mask(m, mask);
        int n = 0, np = 0;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (!(mask[id >> 5] >> (id & 31) & 1)) continue;
            all[n++] = id;
            const char *b =
                id == g_open || id == g_close ? "<" : (const char *)t->data + t->off[id];
            const size_t l = id == g_open || id == g_close ? 1 : t->len[id];
            const int closing =
                memchr(b, '<', l) || memchr(b, '}', l) || memchr(b, ']', l) || memchr(b, '"', l);
            if (t->kind[id] == LILY_TOK_END || (step < 60 ? l <= 3 : closing)) pref[np++] = id;
        }
        if (!n) break;
        const int32_t tok = np && rnd() % 4 ? pref[rnd() % (uint32_t)np] : all[rnd() % (uint32_t)n];
        LILY_ASSERT(lily_gmatch_accept_token(m, tok) == 0);
        if (tok == g_open)
            lily_sb_puts(out, "<tool_call>");
        else if (tok == g_close)
            lily_sb_puts(out, "</tool_call>");
        else if (t->kind[tok] == LILY_TOK_TEXT)
            lily_sb_append(out, (const char *)t->data + t->off[tok], t->len[tok]);
    }
    const int done = lily_gmatch_is_finished(m);
    lily_gmatch_free(m);
    free(mask), free(all), free(pref);
    return done;
}

/* the parser's message for text, fed in random pieces */
static void parse(const cJSON *tools, const lily_sb *text, lily_outmsg *msg) {
    lily_outparse_opts o = {.tools = 1, .tool_defs = tools, .id_seed = 1};
    lily_outparse *p = lily_outparse_create(&o);
    for (size_t i = 0; i < text->len;) {
        size_t k = 1 + rnd() % 7;
        if (k > text->len - i) k = text->len - i;
        lily_outparse_feed(p, text->data + i, k);
        i += k;
    }
    lily_outparse_finish(p);
    size_t n;
    const lily_delta *d = lily_outparse_deltas(p, &n);
    memset(msg, 0, sizeof *msg);
    lily_outmsg_add(msg, d, n);
    lily_outparse_free(p);
}

static int type_ok(const cJSON *v, const cJSON *s) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!cJSON_IsString(t)) return 1; /* anyOf, $ref, enum: left to the validator */
    const char *n = t->valuestring;
    if (!strcmp(n, "string")) return cJSON_IsString(v);
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(s, "minimum"),
                *hi = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    if (cJSON_IsNumber(v) &&
        ((lo && v->valuedouble < lo->valuedouble) || (hi && v->valuedouble > hi->valuedouble)))
        return 0;
    if (!strcmp(n, "integer"))
        return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
    if (!strcmp(n, "number")) return cJSON_IsNumber(v);
    if (!strcmp(n, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(n, "object")) return cJSON_IsObject(v);
    if (!strcmp(n, "array")) return cJSON_IsArray(v);
    return cJSON_IsNull(v);
}

/* the arguments hold the required parameters, each present one of its declared type (and
 * within its minimum / maximum) */
static int args_ok(const cJSON *args, const cJSON *params) {
    if (!cJSON_IsObject(args)) return 0;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required"), *r, *a;
    cJSON_ArrayForEach(r,
                       req) if (!cJSON_GetObjectItemCaseSensitive(args, r->valuestring)) return 0;
    cJSON_ArrayForEach(a, args) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(props, a->string);
        if (props && props->child && !s) return 0;
        if (s && !type_ok(a, s)) return 0;
    }
    return 1;
}

static const char k_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,"
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},\"unit\":{\"enum\":[\"celsius\","
    "\"fahrenheit\"]},"
    "\"when\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"city\",\"days\"],"
    "\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"strict\":true,\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":12},\"limit\":{\"type\":\"integer\"},\"exact\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":\"number\"},\"filters\":{\"type\":\"object\",\"properties\":{"
    "\"lang\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"string\"},\"maxItems\":3}},\"required\":[\"lang\"],\"additionalProperties\":false},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"}},"
    "\"required\":[\"query\",\"filters\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"locate\",\"strict\":true,\"parameters\":{"
    "\"$defs\":{\"place\":{\"type\":\"string\",\"maxLength\":8}},\"type\":\"object\","
    "\"properties\":{\"where\":{\"$ref\":\"#/$defs/place\"},\"n\":{\"type\":[\"integer\","
    "\"null\"]}},\"required\":[\"where\",\"n\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"anything\",\"parameters\":{\"type\":"
    "\"object\"}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"nothing\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{},\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"loose\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":3}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"odd\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a>b\":{\"type\":\"integer\"}},\"required\":[\"a>b\"]}}}]";

static void emit_line(const cJSON *params, const char *args) {
    if (!g_emit) return;
    cJSON *l = cJSON_CreateObject();
    cJSON_AddItemToObject(l, "schema", params ? cJSON_Duplicate(params, 1) : cJSON_CreateNull());
    cJSON_AddStringToObject(l, "output", args);
    char *s = cJSON_PrintUnformatted(l);
    fprintf(g_emit, "%s\n", s);
    free(s);
    cJSON_Delete(l);
}

/* walks under the grammar of one named tool */
static void tool_walks(const cJSON *tools, const lily_token_trie *t, const cJSON *fn, int xml,
                       int walks) {
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    /* loose: its schema does not compile (multipleOf): any object */
    const cJSON *params =
        strcmp(name, "loose") ? cJSON_GetObjectItemCaseSensitive(fn, "parameters") : NULL;
    lily_grammar *g;
    lily_api_error ae;
    memset(&ae, 0, sizeof ae);
    if (lily_toolgram_build(tools, name, 0, xml, g_open, g_close, &g, &ae)) {
        CHECK(0, "%s: grammar: %s", name, ae.message);
        return;
    }
    const int want_xml =
        xml && strcmp(name, "odd") && strcmp(name, "anything") && strcmp(name, "loose");
    char head[128];
    snprintf(head, sizeof head, want_xml ? "<tool_call>\n<function=%s>\n" : "<tool_call>\n{", name);
    const char *tail = want_xml ? "</function>\n</tool_call>" : "}\n</tool_call>";
    int fin = 0, form = 0, parsed = 0;
    lily_sb out = {0};
    for (int w = 0; w < walks; w++) {
        if (!walk(g, t, &out)) continue;
        fin++;
        form += !strncmp(out.data, head, strlen(head)) && out.len > strlen(tail) &&
                !strcmp(out.data + out.len - strlen(tail), tail);
        lily_outmsg msg;
        parse(tools, &out, &msg);
        cJSON *args = msg.n_calls == 1 ? cJSON_Parse(lily_sb_str(&msg.calls[0].args)) : NULL;
        const int ok = args && !strcmp(lily_sb_str(&msg.calls[0].name), name) &&
                       msg.content.len == 0 &&
                       (params ? args_ok(args, params) : cJSON_IsObject(args));
        parsed += ok;
        if (!ok)
            printf("   %s: %d calls, args %s\n   from [%s]\n", name, msg.n_calls,
                   msg.n_calls ? lily_sb_str(&msg.calls[0].args) : "-", lily_sb_str(&out));
        else
            emit_line(params, lily_sb_str(&msg.calls[0].args));
        cJSON_Delete(args);
        lily_outmsg_free(&msg);
    }
    CHECK(fin == walks, "%s (%s): %d/%d walks finished", name, xml ? "xml" : "json", fin, walks);
    CHECK(form == fin, "%s (%s): %d/%d in the %s form", name, xml ? "xml" : "json", form, fin,
          want_xml ? "template's XML" : "JSON");
    CHECK(parsed == fin, "%s (%s): %d/%d parse to one call with valid arguments", name,
          xml ? "xml" : "json", parsed, fin);
    lily_sb_free(&out);
    lily_grammar_free(g);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--emit")) g_emit = fopen(argv[2], "w");
    lily_token_trie *t = make_trie();
    cJSON *tools = cJSON_Parse(k_tools);
    LILY_ASSERT(tools);
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        tool_walks(tools, t, fn, 1, 24);
        if (!g_emit && !strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, "search"))
            tool_walks(tools, t, fn, 0, 6); /* the JSON form, as before */
    }
    /* any tool, parallel calls: each call one of the tools */
    lily_grammar *g;
    lily_api_error ae;
    memset(&ae, 0, sizeof ae);
    CHECK(lily_toolgram_build(tools, NULL, 1, 1, g_open, g_close, &g, &ae) == 0, "any tool: %s",
          ae.message);
    int calls = 0, good = 0;
    lily_sb out = {0};
    for (int w = 0; w < 10; w++) {
        if (!walk(g, t, &out)) continue;
        lily_outmsg msg;
        parse(tools, &out, &msg);
        for (int i = 0; i < msg.n_calls; i++) {
            cJSON *args = cJSON_Parse(lily_sb_str(&msg.calls[i].args));
            calls++;
            good += cJSON_IsObject(args);
            cJSON_Delete(args);
        }
        lily_outmsg_free(&msg);
    }
    CHECK(calls >= 10 && good == calls, "any tool, parallel: %d/%d calls with object arguments",
          good, calls);
    lily_sb_free(&out);
    lily_grammar_free(g);
    /* a strict tool whose schema the compiler does not support: a 400 naming it */
    cJSON *bad = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{"
                             "\"type\":\"string\",\"pattern\":\"a+\"}}}}}]");
    memset(&ae, 0, sizeof ae);
    CHECK(lily_toolgram_build(bad, NULL, 0, 1, g_open, g_close, &g, &ae) != 0 && ae.status == 400 &&
              strstr(ae.message, "pattern"),
          "strict tool with 'pattern': 400 (%s)", ae.message);
    cJSON_Delete(bad);
    cJSON_Delete(tools);
    lily_token_trie_free(t);
    if (g_emit) fclose(g_emit);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
