/* The grammar engine on hand-written text: json_object and JSON Schema grammars accept the JSON
 * they should and reject the rest (byte by byte through lily_gmatch_accept_bytes), unsupported
 * schemas fail with a message naming the construct, and the matcher's rollback and copy give
 * back the same state. Integer bounds (minimum, maximum and their exclusive forms): integers near
 * each bound and random ones of every length are accepted exactly when inside, on fixed and
 * random bounds of both signs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/json_gram.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

#include "../check.h"

static lily_token_trie *g_trie;

/* 256 single-byte tokens and an end token (256). */
static lily_token_trie *byte_trie(void) {
    const char *bytes[257];
    size_t lens[257];
    uint8_t text[257];
    static char store[256];
    for (int i = 0; i < 256; i++) {
        store[i] = (char)i;
        bytes[i] = &store[i];
        lens[i] = 1;
        text[i] = 1;
    }
    bytes[256] = "<|end|>";
    lens[256] = 7;
    text[256] = 0;
    int32_t end = 256;
    lily_token_trie *t;
    lily_err e;
    LILY_ASSERT(lily_token_trie_create(257, bytes, lens, text, &end, 1, &t, &e) == 0);
    return t;
}

/* 1 if the grammar accepts exactly s (and then the end token). */
static int accepts(const lily_grammar *g, const char *s) {
    lily_gmatch *m;
    lily_err e;
    LILY_ASSERT(lily_gmatch_create(g, g_trie, NULL, &m, &e) == 0);
    int ok = lily_gmatch_accept_bytes(m, s, strlen(s)) == 0 && lily_gmatch_is_accepting(m) &&
             lily_gmatch_accept_token(m, 256) == 0 && lily_gmatch_is_finished(m);
    lily_gmatch_free(m);
    return ok;
}

static lily_grammar *schema(const char *text) {
    lily_grammar *g = NULL;
    lily_err e;
    if (lily_grammar_from_schema_text(text, strlen(text), &g, &e)) {
        printf("FAIL schema %s: %s\n", text, e.msg);
        n_fail++;
        return NULL;
    }
    return g;
}

/* Each string in good must be accepted, each in bad rejected. Lists end with NULL. */
static void run_case(const char *label, lily_grammar *g, const char *const *good,
                     const char *const *bad) {
    if (!g) return;
    for (; *good; good++)
        CHECK(accepts(g, *good), "%s: should accept %s", label, *good);
    for (; *bad; bad++)
        CHECK(!accepts(g, *bad), "%s: should reject %s", label, *bad);
    lily_grammar_free(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_json_object(void) {
    lily_grammar *g;
    lily_err e;
    LILY_ASSERT(lily_grammar_json_object(&g, &e) == 0);
    run_case("json_object", g,
             L("{}", "{ }", "{\"a\":1}", "{\"a\": [1, 2.5, -3e+2, true, false, null]}",
               "{\"a\":{\"b\":{\"c\":[[],[{}]]}}}", "{\n  \"k\": \"v\\n\\u00e9\\\\\"\n}",
               "{\"caf\xC3\xA9\":\"\xE2\x82\xAC\xF0\x9F\x98\x80\"}", "{\"x\":0.5,\"y\":-0}"),
             L("", "[]", "1", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{a:1}",
               "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":tru}", "{\"a\":\"\x01\"}",
               "{\"a\":\"\\x\"}", "{\"a\":\"\xC0\xAF\"}", "{\"a\":\"\xED\xA0\x80\"}",
               "{\"a\":\"\xF5\x80\x80\x80\"}", "{}{}", " {}", "{} ",
               "{                                          }", "{\"a\":12345678901234567}"));
}

static void test_schemas(void) {
    run_case("types",
             schema("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                    "\"n\":{\"type\":\"number\"},\"i\":{\"type\":\"integer\"},"
                    "\"b\":{\"type\":\"boolean\"},\"z\":{\"type\":\"null\"}},"
                    "\"required\":[\"s\",\"n\",\"i\",\"b\",\"z\"],\"additionalProperties\":false}"),
             L("{\"s\":\"x\",\"n\":1.5,\"i\":-7,\"b\":true,\"z\":null}",
               "{ \"s\" : \"\" , \"n\" : 0 , \"i\" : 0 , \"b\" : false , \"z\" : null }"),
             L("{\"s\":1,\"n\":1.5,\"i\":-7,\"b\":true,\"z\":null}",
               "{\"s\":\"x\",\"n\":1.5,\"i\":1.5,\"b\":true,\"z\":null}",
               "{\"n\":1.5,\"s\":\"x\",\"i\":-7,\"b\":true,\"z\":null}",
               "{\"s\":\"x\",\"n\":1.5,\"i\":-7,\"b\":true}",
               "{\"s\":\"x\",\"n\":1.5,\"i\":-7,\"b\":true,\"z\":null,\"extra\":1}"));
    run_case("optional",
             schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                    "\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"}},"
                    "\"required\":[\"b\"]}"),
             L("{\"b\":1}", "{\"a\":1,\"b\":2}", "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"),
             L("{}", "{\"a\":1}", "{\"a\":1,\"c\":3}", "{,\"b\":1}", "{\"b\":1,}",
               "{\"b\":2,\"a\":1}", "{\"a\":1\"b\":2}"));
    run_case("all optional",
             schema("{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}"),
             L("{}", "{\"a\":1}", "{\"b\":1}", "{\"a\":1,\"b\":2}"),
             L("{\"b\":1,\"a\":2}", "{\"a\":1,}", "{,}"));
    run_case("empty object", schema("{\"type\":\"object\",\"additionalProperties\":false}"),
             L("{}", "{ }"), L("{\"a\":1}"));
    run_case("enum", schema("{\"enum\":[\"red\",\"green\",\"gr\",1,null,{\"a\":[1]}]}"),
             L("\"red\"", "\"green\"", "\"gr\"", "1", "null", "{\"a\":[1]}"),
             L("\"blue\"", "\"gre\"", "red", "2", "{\"a\": [1]}", "\"red\"\"red\""));
    run_case("const", schema("{\"const\":\"v1\"}"), L("\"v1\""), L("\"v2\"", "\"v1"));
    run_case("anyOf",
             schema("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":"
                    "{\"type\":\"integer\"}},{\"type\":\"null\"}]}"),
             L("\"x\"", "[1,2]", "[]", "null"), L("1", "[\"x\"]", "{}", "[1,]"));
    run_case("type list", schema("{\"type\":[\"integer\",\"null\"]}"), L("5", "null"),
             L("\"5\"", "1.5"));
    run_case("array bounds",
             schema("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,"
                    "\"maxItems\":3}"),
             L("[true,false]", "[true, false, true]", "[ true ,false ]"),
             L("[]", "[true]", "[true,true,true,true]", "[true,,true]"));
    run_case("array min only",
             schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1}"),
             L("[1]", "[1,2,3,4,5,6,7]"), L("[]"));
    run_case("array any", schema("{\"type\":\"array\"}"), L("[]", "[1,\"a\",{},[null]]"),
             L("[", "{}"));
    run_case("string lengths", schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}"),
             L("\"ab\"", "\"abc\"", "\"\\n\\u0041\"", "\"\xC3\xA9\xC3\xA9\""),
             L("\"a\"", "\"abcd\"", "\"\xC3\xA9\""));
    run_case("formats",
             schema("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":"
                    "\"date\"},\"t\":{\"type\":\"string\",\"format\":\"date-time\"},"
                    "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"h\":{\"type\":\"string\","
                    "\"format\":\"time\"}},\"required\":[\"d\",\"t\",\"u\",\"h\"]}"),
             L("{\"d\":\"2024-02-29\",\"t\":\"2024-12-31T23:59:59Z\","
               "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"08:00:00.5+02:00\"}"),
             L("{\"d\":\"2024-13-01\",\"t\":\"2024-12-31T23:59:59Z\","
               "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"08:00:00Z\"}",
               "{\"d\":\"2024-01-01\",\"t\":\"2024-12-31 23:59:59Z\","
               "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"08:00:00Z\"}",
               "{\"d\":\"2024-01-01\",\"t\":\"2024-12-31T23:59:59Z\","
               "\"u\":\"123e4567e89b-12d3-a456-426614174000\",\"h\":\"08:00:00Z\"}",
               "{\"d\":\"2024-01-32\",\"t\":\"2024-12-31T24:00:00Z\","
               "\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"08:00:00Z\"}"));
    run_case("refs",
             schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                    "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
                    "\"#/$defs/node\"}}},\"required\":[\"v\"],\"additionalProperties\":false}},"
                    "\"$ref\":\"#/$defs/node\"}"),
             L("{\"v\":1}", "{\"v\":1,\"kids\":[]}",
               "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"),
             L("{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"kids\":[{\"v\":\"x\"}]}"));
    run_case("root recursion",
             schema("{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#\"},"
                    "{\"type\":\"null\"}]}},\"required\":[\"next\"]}"),
             L("{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"),
             L("{\"next\":{}}", "{}"));
    run_case("definitions + allOf + annotations",
             schema("{\"title\":\"T\",\"description\":\"d\",\"definitions\":{\"e\":{\"type\":"
                    "\"string\",\"enum\":[\"a\",\"b\"]}},\"type\":\"object\",\"properties\":{"
                    "\"x\":{\"allOf\":[{\"$ref\":\"#/definitions/e\"}],\"default\":\"a\"}},"
                    "\"required\":[\"x\"]}"),
             L("{\"x\":\"a\"}", "{\"x\":\"b\"}"), L("{\"x\":\"c\"}"));
    run_case("true schema", schema("true"), L("1", "\"s\"", "{\"a\":[]}"), L("x"));
    run_case("escaped key",
             schema("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"integer\"}},"
                    "\"required\":[\"a\\\"b\"]}"),
             L("{\"a\\\"b\":1}"), L("{\"a\"b\":1}"));
}

static void expect_error(const char *text, const char *needle) {
    lily_grammar *g = NULL;
    lily_err e = {{0}};
    int rc = lily_grammar_from_schema_text(text, strlen(text), &g, &e);
    CHECK(rc == -1 && !g && strstr(e.msg, needle), "schema %s: want an error naming '%s', got '%s'",
          text, needle, rc ? e.msg : "(compiled)");
    lily_grammar_free(g);
}

static void test_errors(void) {
    expect_error("{\"type\":\"string\",\"pattern\":\"^a$\"}", "pattern");
    expect_error("{\"type\":\"number\",\"minimum\":0}", "minimum");
    expect_error("{\"oneOf\":[{\"type\":\"string\"}]}", "oneOf");
    expect_error("{\"type\":\"string\",\"format\":\"email\"}", "email");
    expect_error("{\"$ref\":\"http://x/y.json\"}", "$ref");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "missing");
    expect_error("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}",
                 "additionalProperties");
    expect_error("{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", "'a'");
    expect_error("{\"type\":\"array\",\"maxItems\":100000}", "maxItems");
    expect_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems");
    expect_error("{\"type\":\"widget\"}", "widget");
    expect_error("{\"enum\":[]}", "enum");
    expect_error("{\"$ref\":\"#\"}", "recursion");
    expect_error("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},"
                 "\"required\":[\"a\"]}",
                 "no finite");
    expect_error("false", "false");
    expect_error("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    expect_error("{\"allOf\":[{\"type\":\"string\"},{\"minLength\":1}]}", "allOf");
    expect_error("{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", "anyOf");
    expect_error("{\"type\":\"array\",\"items\":", "not valid JSON");
    /* nesting deeper than the compiler allows */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        n += (size_t)sprintf(deep + n, "{\"items\":");
    n += (size_t)sprintf(deep + n, "true");
    for (int i = 0; i < 200; i++)
        deep[n++] = '}';
    deep[n] = 0;
    expect_error(deep, "deeper");
}

/* ---- integer bounds --------------------------------------------------------------------------- */

static uint64_t g_rng = 0x853C49E6748FEA9Bull;
static uint64_t rnd64(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

#define LIM 9999999999999999LL

/* a magnitude of 1..16 random digits */
static long long rnd_mag(void) {
    long long m = 0;
    const int d = 1 + (int)(rnd64() % 16);
    for (int i = 0; i < d; i++)
        m = m * 10 + (long long)(rnd64() % 10);
    return m;
}

/* integers near each bound, and random ones of every length, accepted iff in [lo, hi] */
static void int_bounds_case(const char *kw_lo, double blo, const char *kw_hi, double bhi,
                            long long lo, long long hi) {
    char text[256];
    size_t n = (size_t)snprintf(text, sizeof text, "{\"type\":\"integer\"");
    if (kw_lo) n += (size_t)snprintf(text + n, sizeof text - n, ",\"%s\":%.17g", kw_lo, blo);
    if (kw_hi) n += (size_t)snprintf(text + n, sizeof text - n, ",\"%s\":%.17g", kw_hi, bhi);
    snprintf(text + n, sizeof text - n, "}");
    lily_grammar *g = schema(text);
    if (!g) return;
    int bad = 0, tried = 0;
    long long first_bad = 0;
    for (int k = 0; k < 260; k++) {
        long long v = k < 60    ? lo - 30 + k
                      : k < 120 ? hi - 30 + (k - 60)
                      : k < 130 ? (long long)(k - 125)
                                : (rnd64() & 1 ? -1 : 1) * rnd_mag();
        if (v < -LIM || v > LIM) continue;
        char num[32];
        snprintf(num, sizeof num, "%lld", v);
        tried++;
        if (accepts(g, num) != (v >= lo && v <= hi)) bad++, first_bad = v;
    }
    /* never a leading zero, "-0" or "+" */
    const int zero_in = lo <= 0 && hi >= 0, seven_in = lo <= 7 && hi >= 7;
    int forms = !accepts(g, "-0") && !accepts(g, "007") && !accepts(g, "+7") &&
                accepts(g, "0") == zero_in && accepts(g, "7") == seven_in;
    CHECK(bad == 0 && forms, "%s: [%lld, %lld]: %d of %d integers misjudged (e.g. %lld)%s", text,
          lo, hi, bad, tried, first_bad, forms ? "" : ", or a bad form accepted");
    lily_grammar_free(g);
}

static void test_int_bounds(void) {
    int_bounds_case("minimum", 3, NULL, 0, 3, LIM);
    int_bounds_case(NULL, 0, "maximum", -5, -LIM, -5);
    int_bounds_case("minimum", -17, "maximum", 42, -17, 42);
    int_bounds_case("minimum", 0, "maximum", 0, 0, 0);
    int_bounds_case("minimum", -1, "maximum", -1, -1, -1);
    int_bounds_case("minimum", 10, "maximum", 99, 10, 99);
    int_bounds_case("minimum", 100, "maximum", 1000, 100, 1000);
    int_bounds_case("minimum", -1000, "maximum", -100, -1000, -100);
    int_bounds_case("minimum", 1, "maximum", (double)LIM, 1, LIM);
    int_bounds_case("minimum", 123456, "maximum", 7890123, 123456, 7890123);
    int_bounds_case("exclusiveMinimum", 2.5, "exclusiveMaximum", 9, 3, 8);
    int_bounds_case("minimum", 2.5, "maximum", 9.5, 3, 9);
    int_bounds_case("exclusiveMinimum", -3, "maximum", 19999, -2, 19999);
    for (int i = 0; i < 30; i++) { /* random bounds, both signs, every length */
        long long a = (rnd64() & 1 ? -1 : 1) * rnd_mag(), b = (rnd64() & 1 ? -1 : 1) * rnd_mag();
        if (a > b) {
            long long t = a;
            a = b, b = t;
        }
        if ((double)a != (double)(long long)(double)a || (double)b != (double)(long long)(double)b)
            continue; /* bounds that a double does not hold exactly */
        int_bounds_case("minimum", (double)a, "maximum", (double)b, a, b);
    }
    /* inside objects, and the errors */
    const char *obj = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                      "\"minimum\":1,\"maximum\":12}},\"required\":[\"n\"]}";
    run_case("bounded member", schema(obj), L("{\"n\":1}", "{\"n\":12}", "{\"n\": 7}"),
             L("{\"n\":0}", "{\"n\":13}", "{\"n\":-1}", "{\"n\":120}"));
    run_case("date: the calendar", schema("{\"type\":\"string\",\"format\":\"date\"}"),
             L("\"2024-02-29\"", "\"2000-02-29\"", "\"0000-02-29\"", "\"1904-02-29\"",
               "\"1900-02-28\"", "\"2023-04-30\"", "\"2023-12-31\"", "\"2023-01-01\""),
             L("\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"",
               "\"2023-00-10\"", "\"2023-01-00\"", "\"2023-06-31\"", "\"2023-02-30\""));
    run_case("number exponent", schema("{\"type\":\"number\"}"), L("1e99", "-2.5E-12", "7"),
             L("1e999", "1e100", "2E+123")); /* every number a finite double */
    expect_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
    expect_error("{\"type\":\"integer\",\"minimum\":\"3\"}", "minimum");
    expect_error("{\"minimum\":3}", "minimum");
    expect_error("{\"type\":\"integer\",\"minimum\":1e17}", "16");
}

static void test_rollback_copy(void) {
    lily_grammar *g;
    lily_err e;
    LILY_ASSERT(lily_grammar_json_object(&g, &e) == 0);
    lily_gmatch *m, *m2;
    LILY_ASSERT(lily_gmatch_create(g, g_trie, NULL, &m, &e) == 0);
    LILY_ASSERT(lily_gmatch_create(g, g_trie, NULL, &m2, &e) == 0);
    const char *s = "{\"a\":[1,2]}";
    for (const char *p = s; *p; p++)
        CHECK(lily_gmatch_accept_token(m, (unsigned char)*p) == 0, "token %c", *p);
    CHECK(lily_gmatch_is_accepting(m), "accepting after %s", s);
    CHECK(lily_gmatch_accept_token(m, 'x') == -1 && lily_gmatch_is_accepting(m),
          "a rejected token leaves the state");
    CHECK(lily_gmatch_rollback(m, 3) == 3, "rollback 3");
    CHECK(!lily_gmatch_is_accepting(m), "not accepting after rolling back to {\"a\":[1,");
    lily_gmatch_copy(m2, m);
    CHECK(lily_gmatch_accept_bytes(m2, "3]}", 3) == 0 && lily_gmatch_is_accepting(m2),
          "the copy continues");
    CHECK(lily_gmatch_accept_bytes(m, "}", 1) == -1, "the original still needs ]");
    CHECK(lily_gmatch_accept_bytes(m, "2]}", 3) == 0 && lily_gmatch_is_accepting(m),
          "the original continues on its own");
    CHECK(lily_gmatch_rollback(m, 100) == 8, "rollback past the start stops at the start");
    CHECK(lily_gmatch_accept_bytes(m, "{}", 2) == 0 && lily_gmatch_is_accepting(m),
          "after the full rollback: a new object");
    /* a long generation: compaction keeps the state and the last 64 tokens undoable */
    lily_gmatch_reset(m);
    CHECK(lily_gmatch_accept_bytes(m, "{\"a\":[", 6) == 0, "prefix");
    int ok = 1;
    for (int i = 0; i < 20000 && ok; i++)
        ok = lily_gmatch_accept_token(m, i % 2 ? ',' : '7') == 0;
    CHECK(ok, "20000 tokens of an array");
    CHECK(lily_gmatch_rollback(m, 63) == 63, "63 tokens undone after compaction");
    CHECK(lily_gmatch_accept_bytes(m, "]}", 2) == 0 && lily_gmatch_is_accepting(m),
          "completes after the rollback");
    lily_gmatch_free(m);
    lily_gmatch_free(m2);
    lily_grammar_free(g);
}

static void test_apply(void) {
    uint32_t mask[2] = {0x80000001u, 0x2u}; /* tokens 0, 31 and 33 of 40 */
    float l[48];
    for (int i = 0; i < 48; i++)
        l[i] = (float)i;
    lily_gmatch_apply(mask, 40, l, 48);
    int ok = 1;
    for (int i = 0; i < 48; i++) {
        int allowed = i == 0 || i == 31 || i == 33;
        ok &= allowed ? l[i] == (float)i : isinf(l[i]) && l[i] < 0;
    }
    CHECK(ok, "lily_gmatch_apply masks disallowed tokens and the padding past the vocabulary");
}

int main(void) {
    g_trie = byte_trie();
    test_apply();
    test_json_object();
    test_schemas();
    test_errors();
    test_int_bounds();
    test_rollback_copy();
    lily_token_trie_free(g_trie);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
