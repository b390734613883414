/* Unit tests of the tokenizer on small hand-made tokenizer.json files: merges applied by rank,
 * both merge spellings, added tokens (longest match, special, lstrip/rstrip/single_word,
 * normalized, tokenizer_config.json additions and split_special_tokens), decoding and the
 * streaming detokenizer, and malformed or truncated files (every prefix of a valid file must be
 * refused with a message, never crash). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

#include "../check.h"

static const char *qwen_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Raw bytes -> the byte-level spelling used in vocabularies. */
static void bl(const char *raw, char *out) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++)
        n += (size_t)lily_utf8_encode(lily_bytelevel_cp(*p), (unsigned char *)out + n);
    out[n] = 0;
}

/* A tokenizer.json with token id b for every byte b, then one token per merge (ids 256...) in
 * merge order. merges: raw left/right pairs, NULL-terminated. added: a JSON array or NULL. */
static cJSON *tiny(const char *const *merges, int pairs, const char *added) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *ml = cJSON_CreateArray();
    char a[64], b[64], m[128];
    for (unsigned c = 0; c < 256; c++) {
        char raw[2] = {(char)c, 0}, s[8];
        if (c == 0) { /* "\0" cannot go through bl(); U+0100 is its byte-level character */
            strcpy(s, "\xC4\x80");
        } else {
            bl(raw, s);
        }
        cJSON_AddNumberToObject(vocab, s, c);
    }
    for (int i = 0; merges && merges[2 * i]; i++) {
        bl(merges[2 * i], a);
        bl(merges[2 * i + 1], b);
        snprintf(m, sizeof m, "%s%s", a, b);
        if (!cJSON_GetObjectItemCaseSensitive(vocab, m)) cJSON_AddNumberToObject(vocab, m, 256 + i);
        if (pairs) {
            const char *pr[2] = {a, b};
            cJSON_AddItemToArray(ml, cJSON_CreateStringArray(pr, 2));
        } else {
            snprintf(m, sizeof m, "%s %s", a, b);
            cJSON_AddItemToArray(ml, cJSON_CreateString(m));
        }
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", ml);
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddItemToObject(root, "added_tokens", added ? cJSON_Parse(added) : cJSON_CreateArray());
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse("{\"type\": \"NFC\"}"));
    cJSON *split = cJSON_Parse("{\"type\": \"Split\", \"behavior\": \"Isolated\","
                               " \"invert\": false, \"pattern\": {}}");
    cJSON_AddStringToObject(cJSON_GetObjectItem(split, "pattern"), "Regex", qwen_pattern);
    cJSON *pre = cJSON_Parse("{\"type\": \"Sequence\", \"pretokenizers\": []}");
    cJSON_AddItemToArray(cJSON_GetObjectItem(pre, "pretokenizers"), split);
    cJSON_AddItemToArray(cJSON_GetObjectItem(pre, "pretokenizers"),
                         cJSON_Parse("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                                     "\"trim_offsets\": false, \"use_regex\": false}"));
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "post_processor", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    cJSON_AddItemToObject(root, "model", model);
    return root;
}

static lily_tokenizer *open_json(cJSON *root, const char *config, lily_err *e) {
    char *s = cJSON_PrintUnformatted(root);
    lily_tokenizer *t = NULL;
    if (lily_tokenizer_open_mem(s, strlen(s), config, config ? strlen(config) : 0, &t, e)) t = NULL;
    free(s);
    return t;
}

/* Encodes text and compares with want (n ids); prints both on failure. */
static void expect(lily_tokenizer *t, const char *what, const char *text, const int32_t *want,
                   size_t n) {
    int32_t *ids = NULL;
    size_t k = 0;
    lily_err e = {{0}};
    int rc = lily_tokenizer_encode(t, text, strlen(text), &ids, &k, &e);
    int ok = rc == 0 && k == n && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    if (!ok) {
        printf("  %s: got", what);
        for (size_t i = 0; i < k; i++)
            printf(" %d", (int)ids[i]);
        printf("  want");
        for (size_t i = 0; i < n; i++)
            printf(" %d", (int)want[i]);
        printf("  %s\n", rc ? e.msg : "");
    }
    CHECK(ok, "%s", what);
    free(ids);
}

#define EXPECT(t, what, text, ...)                           \
    do {                                                     \
        static const int32_t w_[] = {__VA_ARGS__};           \
        expect(t, what, text, w_, sizeof w_ / sizeof w_[0]); \
    } while (0)

static void test_merge_order(void) {
    lily_err e = {{0}};
    /* rank 0: b+c (id 256), rank 1: a+b (id 257): "abc" -> a, bc */
    static const char *const m1[] = {"b", "c", "a", "b", NULL};
    cJSON *j = tiny(m1, 0, NULL);
    lily_tokenizer *t = open_json(j, NULL, &e);
    cJSON_Delete(j);
    CHECK(t != NULL, "open tiny tokenizer: %s", e.msg);
    if (!t) return;
    EXPECT(t, "lower rank wins (bc before ab)", "abc", 'a', 256);
    EXPECT(t, "ab alone", "ab", 257);
    lily_tokenizer_free(t);

    static const char *const m2[] = {"a", "b", "b", "c", NULL};
    j = tiny(m2, 1, NULL); /* [left, right] pair spelling */
    t = open_json(j, NULL, &e);
    cJSON_Delete(j);
    CHECK(t != NULL, "open tiny tokenizer (pair merges): %s", e.msg);
    if (!t) return;
    EXPECT(t, "lower rank wins (ab before bc)", "abc", 256, 'c');
    lily_tokenizer_free(t);

    /* ties: equal pairs merge leftmost first; merged tokens merge again */
    static const char *const m3[] = {"a", "a", "aa", "aa", " ", "a", NULL};
    j = tiny(m3, 0, NULL);
    t = open_json(j, NULL, &e);
    cJSON_Delete(j);
    if (!t) return;
    EXPECT(t, "aaa -> aa a", "aaa", 256, 'a');
    EXPECT(t, "aaaa -> aaaa", "aaaa", 257);
    EXPECT(t, "aaaaa -> aaaa a", "aaaaa", 257, 'a');
    EXPECT(t, "space joins the word after it", "a a", 'a', 258);
    EXPECT(t, "rank decides inside ' aa'", "a aa", 'a', ' ', 256);
    EXPECT(t, "empty text", "", );
    lily_tokenizer_free(t);
}

static void test_added(void) {
    lily_err e = {{0}};
    static const char *const m[] = {"c", "a", "ca", "t", NULL}; /* 256 "ca", 257 "cat" */
    const char *added = "[{\"id\": 300, \"content\": \"<s>\", \"special\": true},"
                        " {\"id\": 301, \"content\": \"<x>\", \"special\": false},"
                        " {\"id\": 302, \"content\": \"<xy>\", \"special\": false},"
                        " {\"id\": 303, \"content\": \"[L]\", \"lstrip\": true},"
                        " {\"id\": 304, \"content\": \"[R]\", \"rstrip\": true},"
                        " {\"id\": 305, \"content\": \"dog\", \"single_word\": true},"
                        " {\"id\": 306, \"content\": \"\\u00e9t\\u00e9\", \"normalized\": true},"
                        " {\"id\": 307, \"content\": \"\\u00e0\", \"normalized\": false}]";
    cJSON *j = tiny(m, 0, added);
    lily_tokenizer *t = open_json(j, NULL, &e);
    CHECK(t != NULL, "open tiny tokenizer with added tokens: %s", e.msg);
    if (!t) {
        cJSON_Delete(j);
        return;
    }
    EXPECT(t, "added tokens split the text", "a<s>b<xy>c<x>", 'a', 300, 'b', 302, 'c', 301);
    EXPECT(t, "longest match, then no match", "<xy<x>", '<', 'x', 'y', 301);
    EXPECT(t, "merges do not cross added tokens", "ca<s>t", 256, 300, 't');
    EXPECT(t, "lstrip swallows spaces before", "a  [L]b", 'a', 303, 'b');
    EXPECT(t, "rstrip swallows spaces after", "a[R] \t b", 'a', 304, 'b');
    EXPECT(t, "no strip keeps spaces", "a <s> b", 'a', ' ', 300, ' ', 'b');
    EXPECT(t, "single_word alone", "dog", 305);
    EXPECT(t, "single_word inside a word is text", "hotdog", 'h', 'o', 't', 'd', 'o', 'g');
    EXPECT(t, "single_word between spaces", "a dog.", 'a', ' ', 305, '.');
    /* normalized token: found after NFC, so a decomposed spelling matches */
    EXPECT(t, "normalized added token matches NFC text", "e\xCC\x81te\xCC\x81!", 306, '!');
    /* not normalized: only the exact raw bytes match */
    EXPECT(t, "raw added token, precomposed", "\xC3\xA0", 307);
    EXPECT(t, "raw added token, decomposed text stays text", "a\xCC\x80", 0xC3, 0xA0);
    CHECK(lily_tokenizer_is_special(t, 300) && !lily_tokenizer_is_special(t, 301) &&
              !lily_tokenizer_is_special(t, 'a'),
          "special flags");
    CHECK(lily_tokenizer_token_to_id(t, "<xy>") == 302 &&
              lily_tokenizer_token_to_id(t, "\xC3\xA0") == 307 && /* added wins over byte 0xE0 */
              lily_tokenizer_token_to_id(t, "ca") == 256 &&
              lily_tokenizer_token_to_id(t, "\xC4\xA0") == ' ' &&
              lily_tokenizer_token_to_id(t, "nope") == -1,
          "token_to_id");
    CHECK(lily_tokenizer_vocab_size(t) == 308, "vocab_size %d", lily_tokenizer_vocab_size(t));
    /* HF passes added tokens through the ByteLevel decoder too, so "\u00e9t\u00e9" (whose
     * letters are in the byte-level alphabet) decodes to bytes E9 74 E9: invalid UTF-8. This
     * mirrors HF (tokenizers issues #1392, #1996); Qwen's added tokens are ASCII. */
    static const int32_t ids[] = {'a', 300, ' ', 257, 306, 0xE2, 0x82};
    char *text = NULL;
    size_t len = 0;
    int rc = lily_tokenizer_decode(t, ids, 7, &text, &len, &e);
    const char *want = "a<s> cat\xEF\xBF\xBDt\xEF\xBF\xBD\xEF\xBF\xBD";
    CHECK(rc == 0 && len == strlen(want) && !memcmp(text, want, len),
          "decode with added tokens and a broken tail: '%s'", text ? text : e.msg);
    free(text);
    static const int32_t bad[] = {1, 308};
    CHECK(lily_tokenizer_decode(t, bad, 2, &text, &len, &e) == -1 && strstr(e.msg, "308"),
          "decode of an out-of-range id fails: %s", e.msg);
    int32_t *out = NULL;
    size_t n = 0;
    CHECK(lily_tokenizer_encode(t, "ok\xC3(", 4, &out, &n, &e) == -1 && strstr(e.msg, "offset 2"),
          "invalid UTF-8 input is refused: %s", e.msg);
    lily_tokenizer_free(t);

    /* tokenizer_config.json: split_special_tokens and an extra added token */
    const char *config = "{\"split_special_tokens\": true, \"added_tokens_decoder\": "
                         "{\"310\": {\"content\": \"<new>\", \"special\": false}}}";
    t = open_json(j, config, &e);
    CHECK(t != NULL, "open with tokenizer_config.json: %s", e.msg);
    if (t) {
        EXPECT(t, "split_special_tokens: special <s> is plain text", "<s><x>", '<', 's', '>', 301);
        EXPECT(t, "config added token", "a<new>", 'a', 310);
        CHECK(lily_tokenizer_vocab_size(t) == 311, "vocab_size with config token");
        CHECK(lily_tokenizer_eos_id(t) == -1, "no eos_token: eos id -1");
        lily_tokenizer_free(t);
    }
    /* eos_token as a string, as an object with content, and naming no token */
    static const char *const eos_cfg[3] = {"{\"eos_token\": \"<new>\", \"added_tokens_decoder\": "
                                           "{\"310\": {\"content\": \"<new>\"}}}",
                                           "{\"eos_token\": {\"content\": \"<xy>\"}}",
                                           "{\"eos_token\": \"<none>\"}"};
    static const int32_t eos_want[3] = {310, 302, -1};
    for (int i = 0; i < 3; i++) {
        t = open_json(j, eos_cfg[i], &e);
        CHECK(t && lily_tokenizer_eos_id(t) == eos_want[i], "eos_token %d: id %d, want %d", i,
              t ? lily_tokenizer_eos_id(t) : -2, eos_want[i]);
        lily_tokenizer_free(t);
    }
    const char *clash = "{\"added_tokens_decoder\": {\"300\": {\"content\": \"<other>\"}}}";
    t = open_json(j, clash, &e);
    CHECK(t == NULL && strstr(e.msg, "300"), "config token with a clashing id fails: %s", e.msg);
    lily_tokenizer_free(t);
    cJSON_Delete(j);
}

static void test_stream(void) {
    lily_err e = {{0}};
    cJSON *j = tiny(NULL, 0, "[{\"id\": 256, \"content\": \"<|end|>\", \"special\": true}]");
    lily_tokenizer *t = open_json(j, NULL, &e);
    cJSON_Delete(j);
    CHECK(t != NULL, "open byte tokenizer: %s", e.msg);
    if (!t) return;
    lily_detok *d = NULL;
    CHECK(lily_detok_create(t, &d, &e) == 0, "detok create");
    /* one token per byte of "a\u00e9\U0001F600": output appears only when a character is whole */
    const unsigned char bytes[] = {'a', 0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80};
    const size_t want_len[] = {1, 0, 2, 0, 0, 0, 4};
    int ok = 1;
    for (size_t i = 0; i < sizeof bytes; i++) {
        const char *s;
        size_t n;
        lily_detok_push(d, bytes[i], &s, &n, &e);
        ok &= n == want_len[i];
    }
    CHECK(ok, "detok emits each character only once complete");
    const char *s;
    size_t n;
    lily_detok_push(d, 0xF0, &s, &n, &e);
    lily_detok_push(d, 0x9F, &s, &n, &e);
    lily_detok_flush(d, &s, &n);
    CHECK(n == 3 && !memcmp(s, "\xEF\xBF\xBD", 3), "flush turns a held tail into U+FFFD");
    lily_detok_push(d, 0xC3, &s, &n, &e);
    lily_detok_push(d, 'A', &s, &n, &e);
    CHECK(n == 4 && !memcmp(s,
                            "\xEF\xBF\xBD"
                            "A",
                            4),
          "a broken sequence becomes U+FFFD");
    lily_detok_push(d, 256, &s, &n, &e);
    CHECK(n == 7 && !memcmp(s, "<|end|>", 7), "special token decodes to its content");
    CHECK(lily_detok_push(d, 257, &s, &n, &e) == -1 && lily_detok_push(d, -1, &s, &n, &e) == -1,
          "detok refuses out-of-range ids");
    lily_detok_flush(d, &s, &n);

    /* random byte tokens: chunks are valid UTF-8 and join to the full decode */
    unsigned long long r = 88172645463325252ull;
    int bad = 0;
    for (int iter = 0; iter < 2000; iter++) {
        int32_t ids[24];
        size_t k = 1 + iter % 24;
        for (size_t i = 0; i < k; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            /* bias towards lead/continuation bytes so sequences are often almost valid */
            unsigned v = (unsigned)(r >> 20);
            ids[i] = (int32_t)(v % 3 == 0   ? 0x80 + (v >> 2) % 64
                               : v % 3 == 1 ? 0xC2 + (v >> 2) % 51
                                            : (v >> 2) % 257);
        }
        char *full;
        size_t fl;
        lily_tokenizer_decode(t, ids, k, &full, &fl, &e);
        lily_u8buf cat = {0};
        for (size_t i = 0; i <= k; i++) {
            if (i < k)
                lily_detok_push(d, ids[i], &s, &n, &e);
            else
                lily_detok_flush(d, &s, &n);
            bad += lily_utf8_valid_prefix((const unsigned char *)s, n) != n;
            lily_u8buf_put(&cat, s, n);
        }
        bad += cat.n != fl || memcmp(cat.p, full, fl);
        lily_u8buf_free(&cat);
        free(full);
    }
    CHECK(bad == 0, "random streams: %d invalid chunks or joins differing from decode", bad);
    printf("stream: 2000 random byte-token sequences, chunks valid and equal to decode: %s\n",
           bad ? "no" : "yes");
    lily_detok_free(d);
    lily_tokenizer_free(t);
}

/* Edits a valid tiny file with fn and expects open to fail with a message containing want. */
static void expect_bad(const char *what, void (*fn)(cJSON *), const char *want) {
    static const char *const m[] = {"a", "b", NULL};
    cJSON *j = tiny(m, 0, "[{\"id\": 300, \"content\": \"<s>\", \"special\": true}]");
    fn(j);
    lily_err e = {{0}};
    lily_tokenizer *t = open_json(j, NULL, &e);
    cJSON_Delete(j);
    CHECK(t == NULL && strstr(e.msg, want), "%s: want error with '%s', got '%s'", what, want,
          t ? "(opened)" : e.msg);
    if (!t) printf("  %-28s -> %s\n", what, e.msg);
    lily_tokenizer_free(t);
}

#define MODEL(j) cJSON_GetObjectItem(j, "model")
static void bad_model_type(cJSON *j) {
    cJSON_ReplaceItemInObject(MODEL(j), "type", cJSON_CreateString("WordPiece"));
}
static void bad_merge_token(cJSON *j) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(MODEL(j), "merges"), cJSON_CreateString("zz q"));
}
static void bad_merge_spaces(cJSON *j) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(MODEL(j), "merges"), cJSON_CreateString("a b c"));
}
static void bad_merge_kind(cJSON *j) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(MODEL(j), "merges"), cJSON_CreateNumber(3));
}
static void bad_vocab_id(cJSON *j) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(MODEL(j), "vocab"), "zz", -4);
}
static void bad_vocab_frac(cJSON *j) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(MODEL(j), "vocab"), "zz", 1.5);
}
static void huge_vocab_id(cJSON *j) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(MODEL(j), "vocab"), "zz", 2000000000);
}
static void dup_vocab_id(cJSON *j) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(MODEL(j), "vocab"), "zz", 65);
}
static void missing_byte(cJSON *j) {
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItem(MODEL(j), "vocab"), "q");
}
static void bad_normalizer(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "normalizer", cJSON_Parse("{\"type\": \"Lowercase\"}"));
}
static void no_bytelevel(cJSON *j) {
    cJSON_DeleteItemFromArray(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 1);
}
static cJSON *split_of(cJSON *j) {
    return cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 0);
}
static void bad_regex(cJSON *j) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(split_of(j), "pattern"), "Regex",
                              cJSON_CreateString("(\\p{L}"));
}
static void bad_behavior(cJSON *j) {
    cJSON_ReplaceItemInObject(split_of(j), "behavior", cJSON_CreateString("Contiguous"));
}
static void no_decoder(cJSON *j) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, "decoder");
}
static void bad_post(cJSON *j) {
    cJSON_ReplaceItemInObject(j, "post_processor",
                              cJSON_Parse("{\"type\": \"TemplateProcessing\"}"));
}
static void added_no_content(cJSON *j) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(j, "added_tokens"), cJSON_Parse("{\"id\": 301}"));
}
static void added_clash(cJSON *j) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(j, "added_tokens"),
                         cJSON_Parse("{\"id\": 97, \"content\": \"<t>\"}"));
}
static void dropout(cJSON *j) {
    cJSON_ReplaceItemInObject(MODEL(j), "dropout", cJSON_CreateNumber(0.1));
}
static void prefix_space(cJSON *j) {
    cJSON *bl = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 1);
    cJSON_ReplaceItemInObject(bl, "add_prefix_space", cJSON_CreateTrue());
}
static void no_model(cJSON *j) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, "model");
}

static void test_malformed(void) {
    expect_bad("model type", bad_model_type, "unsupported model type 'WordPiece'");
    expect_bad("merge of unknown token", bad_merge_token, "not in the vocabulary");
    expect_bad("merge with two spaces", bad_merge_spaces, "one space");
    expect_bad("merge of wrong kind", bad_merge_kind, "neither a string");
    expect_bad("negative id", bad_vocab_id, "invalid id");
    expect_bad("fractional id", bad_vocab_frac, "invalid id");
    expect_bad("huge id", huge_vocab_id, "out of range");
    expect_bad("one id, two tokens", dup_vocab_id, "token id 65 is both");
    expect_bad("vocabulary without a byte", missing_byte, "no token for byte 0x71");
    expect_bad("normalizer", bad_normalizer, "unsupported normalizer type 'Lowercase'");
    expect_bad("no ByteLevel", no_bytelevel, "exactly one ByteLevel");
    expect_bad("bad regex", bad_regex, "cannot compile split pattern");
    expect_bad("split behavior", bad_behavior, "behavior 'Contiguous'");
    expect_bad("no decoder", no_decoder, "decoder is missing");
    expect_bad("post processor", bad_post, "unsupported post_processor type");
    expect_bad("added token without content", added_no_content, "no content");
    expect_bad("added token id clash", added_clash, "token id 97 is both");
    expect_bad("dropout", dropout, "dropout");
    expect_bad("add_prefix_space", prefix_space, "add_prefix_space");
    expect_bad("no model", no_model, "'model' is missing");

    lily_err e = {{0}};
    lily_tokenizer *t = NULL;
    CHECK(lily_tokenizer_open("/nonexistent/dir", &t, &e) == -1 && strstr(e.msg, "no such file"),
          "missing directory: %s", e.msg);
    CHECK(lily_tokenizer_open_mem("[1, 2]", 6, NULL, 0, &t, &e) == -1 &&
              strstr(e.msg, "not a JSON object"),
          "array root: %s", e.msg);
    CHECK(lily_tokenizer_open_mem("{\"model\": }", 11, NULL, 0, &t, &e) == -1 &&
              strstr(e.msg, "invalid JSON near byte"),
          "syntax error: %s", e.msg);

    /* every strict prefix of a valid file is refused, with a message */
    static const char *const m[] = {"a", "b", "ab", "c", NULL};
    cJSON *j = tiny(m, 1, "[{\"id\": 300, \"content\": \"<s>\", \"special\": true}]");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    size_t len = strlen(s), refused = 0, silent = 0;
    for (size_t cut = 0; cut < len; cut++) {
        e.msg[0] = 0;
        t = NULL;
        if (lily_tokenizer_open_mem(s, cut, NULL, 0, &t, &e) == -1) {
            refused++;
            silent += e.msg[0] == 0;
        } else {
            lily_tokenizer_free(t);
        }
    }
    CHECK(refused == len && silent == 0, "truncated files: %zu of %zu refused, %zu silently",
          refused, len, silent);
    printf("truncation: all %zu prefixes of a %zu-byte file refused with a message: %s\n", refused,
           len, refused == len && !silent ? "yes" : "no");
    CHECK(lily_tokenizer_open_mem(s, len, NULL, 0, &t, &e) == 0, "the full file opens");
    lily_tokenizer_free(t);
    free(s);
}

int main(void) {
    test_merge_order();
    test_added();
    test_stream();
    test_malformed();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
