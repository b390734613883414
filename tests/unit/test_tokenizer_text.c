/* Unit tests of the tokenizer's text layer: UTF-8 validation and lossy repair, the JSON string
 * decoder, the Oniguruma -> PCRE2 \s rewrite, the regex splitter, the NFC fast path (checked
 * against utf8proc on random strings) and the two BPE merge strategies (checked against a
 * textbook implementation on random merge tables). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/err.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

#include "../check.h"

static uint64_t rng = 0x1234567887654321ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void hex(const unsigned char *s, size_t n, char *out) {
    for (size_t i = 0; i < n && i < 40; i++)
        sprintf(out + 3 * i, "%02X ", s[i]);
    if (!n) out[0] = 0;
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */

static void test_valid_prefix(void) {
    static const struct {
        const char *s;
        size_t n, valid;
    } cases[] = {
        {"plain ascii text", 16, 16},
        {"caf\xC3\xA9", 5, 5},
        {"\xF0\x9F\x98\x80!", 5, 5},
        {"ab\xC3", 3, 2},           /* truncated */
        {"\xC0\x80", 2, 0},         /* overlong NUL */
        {"x\xE0\x80\x80", 4, 1},    /* overlong 3-byte */
        {"\xED\xA0\x80", 3, 0},     /* surrogate */
        {"\xF4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"12345678\xFF", 9, 8},     /* after the 8-byte ASCII fast path */
        {"\xEF\xBF\xBD\xF4\x8F\xBF\xBF", 7, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = lily_utf8_valid_prefix((const unsigned char *)cases[i].s, cases[i].n);
        CHECK(got == cases[i].valid, "valid_prefix case %zu: got %zu want %zu", i, got,
              cases[i].valid);
    }
}

static void test_lossy(void) {
    /* Expected outputs follow the maximal-subpart rule of Rust's from_utf8_lossy. */
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {
        {"ok", 2, "ok"},
        {"\xE2\x82", 2, "\xEF\xBF\xBD"},
        {"\xF0\x9F\x98"
         "A",
         4,
         "\xEF\xBF\xBD"
         "A"},
        {"\xC0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"a\x80"
         "b",
         3,
         "a\xEF\xBF\xBD"
         "b"},
        {"\xF4\x90", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xE0\xA0", 2, "\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lily_u8buf b = {0};
        size_t used = lily_utf8_lossy((const unsigned char *)cases[i].in, cases[i].n, 1, &b);
        char h[128];
        hex(b.p, b.n, h);
        CHECK(used == cases[i].n && b.n == strlen(cases[i].want) &&
                  !memcmp(b.p, cases[i].want, b.n),
              "lossy case %zu: got [%s]", i, h);
        lily_u8buf_free(&b);
    }
    /* Not final: a valid incomplete tail is left for later. */
    lily_u8buf b = {0};
    size_t used = lily_utf8_lossy((const unsigned char *)"ab\xF0\x9F\x98", 5, 0, &b);
    CHECK(used == 2 && b.n == 2, "lossy non-final keeps the tail (used %zu, out %zu)", used, b.n);
    lily_u8buf_free(&b);
}

static void test_json_string(void) {
    lily_u8buf b = {0};
    int rc = lily_utf8_json_string("\"a\\u0000b\\ud83d\\ude00\\n\\\"\" ", 26, &b);
    CHECK(rc == 0 && b.n == 9 && !memcmp(b.p, "a\0b\xF0\x9F\x98\x80\n\"", 9),
          "json string with NUL and surrogate pair (rc %d, %zu bytes)", rc, b.n);
    static const char *bad[] = {"\"\\ud800\"", "\"abc",       "\"a\"x",       "abc",
                                "\"\\q\"",     "\"\\u12G4\"", "\"tab\there\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b.n = 0;
        CHECK(lily_utf8_json_string(bad[i], strlen(bad[i]), &b) == -1,
              "json string %s must be rejected", bad[i]);
    }
    lily_u8buf_free(&b);
}

/* ---- pre-tokenizer -------------------------------------------------------------------- */

static void test_translate(void) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"\\s+(?!\\S)", "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])"},
        {"[^\\s\\p{L}]", "[^\\t-\\r\\x{85}\\p{Z}\\p{L}]"},
        {"[]\\s]x", "[]\\t-\\r\\x{85}\\p{Z}]x"},
        {"\\\\s", "\\\\s"},
        {"[[:alpha:]\\s]", "[[:alpha:]\\t-\\r\\x{85}\\p{Z}]"},
        {"a[\\S]", "a[\\S]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = lily_pretok_translate(cases[i].in, strlen(cases[i].in));
        CHECK(!strcmp(got, cases[i].want), "translate %s: got %s want %s", cases[i].in, got,
              cases[i].want);
        free(got);
    }
}

typedef struct words {
    char buf[512];
    size_t n;
    int count;
} words;

static int collect(void *ud, const char *w, size_t n) {
    words *c = ud;
    if (c->n + n + 1 < sizeof c->buf) {
        memcpy(c->buf + c->n, w, n);
        c->buf[c->n + n] = '|';
        c->n += n + 1;
        c->buf[c->n] = 0;
    }
    c->count++;
    return 0;
}

static void test_split(void) {
    lily_pretok p = {0};
    lily_err e = {{0}};
    const char *qwen = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
                       "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    int rc = lily_pretok_add_split(&p, qwen, strlen(qwen), 1, LILY_SPLIT_ISOLATED, &e);
    CHECK(rc == 0, "compile qwen pattern: %s", e.msg);
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"Hello world", "Hello| world|"},
        {"DON'T stop", "DON|'T| stop|"},
        {"x  y", "x| | y|"},
        {"a 123", "a| |1|2|3|"},
        {"a\r\n\r\nb", "a|\r\n\r\n|b|"},
        {"end   ", "end|   |"},
        /* NEL is whitespace for Oniguruma: two NELs are not one punctuation run */
        {"a\xC2\x85\xC2\x85"
         "b",
         "a|\xC2\x85|\xC2\x85"
         "b|"},
        /* ...and U+FEFF is not whitespace (it is for JavaScript's \s) */
        {"a\xEF\xBB\xBF\xEF\xBB\xBF"
         "b",
         "a|\xEF\xBB\xBF\xEF\xBB\xBF|b|"},
        {"\xE3\x80\x80\xE4\xB8\xAD", "\xE3\x80\x80\xE4\xB8\xAD|"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !rc; i++) {
        words w = {{0}, 0, 0};
        lily_pretok_split(&p, cases[i].in, strlen(cases[i].in), collect, &w, &e);
        CHECK(!strcmp(w.buf, cases[i].want), "split case %zu: got '%s' want '%s'", i, w.buf,
              cases[i].want);
    }
    lily_pretok_free(&p);

    /* Literal pattern with Removed behavior, then a second stage. */
    lily_pretok q = {0};
    rc = lily_pretok_add_split(&q, "--", 2, 0, LILY_SPLIT_REMOVED, &e) ||
         lily_pretok_add_split(&q, "\\p{N}", 5, 1, LILY_SPLIT_ISOLATED, &e);
    CHECK(rc == 0, "compile literal + digit stages: %s", e.msg);
    words w = {{0}, 0, 0};
    lily_pretok_split(&q, "ab--c1d----e", 12, collect, &w, &e);
    CHECK(!strcmp(w.buf, "ab|c|1|d|e|"), "two-stage split: got '%s'", w.buf);
    lily_pretok_free(&q);

    /* A pattern that can match empty must not loop. */
    lily_pretok r = {0};
    rc = lily_pretok_add_split(&r, "x*", 2, 1, LILY_SPLIT_ISOLATED, &e);
    words w2 = {{0}, 0, 0};
    lily_pretok_split(&r, "axxb\xC3\xA9x", 8, collect, &w2, &e);
    CHECK(rc == 0 && !strcmp(w2.buf, "a|xx|b\xC3\xA9|x|"), "empty-match split: got '%s'", w2.buf);
    lily_pretok_free(&r);

    lily_pretok bad = {0};
    CHECK(lily_pretok_add_split(&bad, "(", 1, 1, LILY_SPLIT_ISOLATED, &e) == -1 &&
              strstr(e.msg, "cannot compile"),
          "bad regex must fail: %s", e.msg);
    lily_pretok_free(&bad);
}

/* Random text mixing the NFC fast-path ranges with characters that do change or compose. */
static void test_nfc_fastpath(void) {
    static const uint32_t tricky[] = {0x0301,  0x0308, 0x0323, 0x0344, 0x0958, 0x093C, 0x1100,
                                      0x1161,  0x11A8, 0x3099, 0x309A, 0x212B, 0x2126, 0xF900,
                                      0x2F800, 0x0B3E, 0x0B47, 0x1E0A, 0x0340, 0x0F73, 0x302A};
    static const uint32_t lo[] = {0x20, 0xC0, 0x4E00, 0x3041, 0x30A1, 0xAC00};
    static const uint32_t hi[] = {0x2FF, 0x2FF, 0x9FFF, 0x3096, 0x30FA, 0xD7A3};
    lily_pretok p = {0};
    lily_err e;
    lily_pretok_add_norm(&p, LILY_NORM_NFC, &e);
    int bad = 0, changed = 0;
    for (int iter = 0; iter < 3000; iter++) {
        unsigned char s[256];
        size_t n = 0;
        int len = 1 + (int)(rnd() % 12);
        for (int k = 0; k < len; k++) {
            uint32_t cp;
            if (iter % 2 == 0 || rnd() % 4) {
                int r = (int)(rnd() % 6);
                cp = lo[r] + rnd() % (hi[r] - lo[r] + 1);
            } else {
                cp = tricky[rnd() % (sizeof tricky / sizeof tricky[0])];
            }
            n += (size_t)lily_utf8_encode(cp, s + n);
        }
        char *out;
        size_t outn;
        lily_pretok_normalize(&p, (const char *)s, n, &out, &outn, &e);
        utf8proc_uint8_t *ref = NULL;
        utf8proc_ssize_t m =
            utf8proc_map(s, (utf8proc_ssize_t)n, &ref, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        const char *got = out ? out : (const char *)s;
        size_t gotn = out ? outn : n;
        if (m < 0 || (size_t)m != gotn || memcmp(ref, got, gotn)) bad++;
        changed += out != NULL;
        free(out);
        free(ref);
    }
    CHECK(bad == 0, "NFC fast path differs from utf8proc on %d of 3000 random strings", bad);
    printf("nfc: 3000 random strings, %d went through utf8proc, all equal to utf8proc NFC: %s\n",
           changed, bad ? "no" : "yes");
    lily_pretok_free(&p);
}

/* ---- BPE strategies ------------------------------------------------------------------- */

/* Builds a vocabulary of the 256 byte tokens plus random merges over the alphabet "abcd", then
 * checks scan and heap merging against a direct implementation of the BPE definition. */
static void test_bpe_random(void) {
    lily_vocab v = {0};
    lily_bpe b = {0};
    lily_err e;
    for (unsigned c = 0; c < 256; c++) {
        unsigned char u[4];
        int k = lily_utf8_encode(lily_bytelevel_cp(c), u);
        lily_vocab_add(&v, (int32_t)c, (const char *)u, (size_t)k, 0, &e);
    }
    lily_bpe_init(&b, &v, &e);
    /* merges as strings over "abcd" (ASCII letters are their own byte-level characters) */
    char toks[200][16];
    int n_toks = 4, n_merges = 0;
    char ml[160][16], mr[160][16];
    for (int i = 0; i < 4; i++)
        snprintf(toks[i], sizeof toks[i], "%c", 'a' + i);
    while (n_merges < 150) {
        const char *l = toks[rnd() % (unsigned)n_toks], *r = toks[rnd() % (unsigned)n_toks];
        if (strlen(l) + strlen(r) > 10) continue;
        char m[32];
        snprintf(m, sizeof m, "%s%s", l, r);
        if (lily_vocab_find(&v, m, strlen(m)) >= 0) continue;
        lily_vocab_add(&v, 256 + n_merges, m, strlen(m), 0, &e);
        lily_bpe_add_merge(&b, &v, l, strlen(l), r, strlen(r), n_merges, &e);
        strcpy(ml[n_merges], l);
        strcpy(mr[n_merges], r);
        strcpy(toks[n_toks++], m);
        n_merges++;
    }
    int bad = 0;
    for (int iter = 0; iter < 400; iter++) {
        size_t n = 1 + rnd() % (iter < 200 ? 64 : 300);
        char word[301];
        for (size_t i = 0; i < n; i++)
            word[i] = (char)('a' + rnd() % 4);
        word[n] = 0;
        /* reference: symbols as strings, merge the lowest-ranked adjacent pair, leftmost */
        static char sym[301][64];
        size_t ns = n;
        for (size_t i = 0; i < n; i++)
            snprintf(sym[i], sizeof sym[i], "%c", word[i]);
        for (;;) {
            int best = n_merges;
            size_t bi = 0;
            for (size_t i = 0; i + 1 < ns; i++)
                for (int r = 0; r < best; r++)
                    if (!strcmp(sym[i], ml[r]) && !strcmp(sym[i + 1], mr[r])) {
                        best = r;
                        bi = i;
                        break;
                    }
            if (best == n_merges) break;
            size_t la = strlen(sym[bi]), lb = strlen(sym[bi + 1]);
            memcpy(sym[bi] + la, sym[bi + 1], lb + 1);
            memmove(sym[bi + 1], sym[bi + 2], (ns - bi - 2) * sizeof sym[0]);
            ns--;
        }
        int32_t a[301], h[301];
        for (size_t i = 0; i < n; i++)
            a[i] = h[i] = b.byte_id[(unsigned char)word[i]];
        size_t na = n, nh = n;
        if (n <= LILY_BPE_SCAN_MAX) lily_bpe_merge(&b, a, &na, 0);
        lily_bpe_merge(&b, h, &nh, 1);
        int ok = nh == ns;
        for (size_t i = 0; ok && i < ns; i++)
            ok = h[i] == lily_vocab_find(&v, sym[i], strlen(sym[i]));
        if (n <= LILY_BPE_SCAN_MAX) {
            ok = ok && na == nh;
            for (size_t i = 0; ok && i < na; i++)
                ok = a[i] == h[i];
        }
        if (!ok && bad++ < 3)
            printf("bpe mismatch on word %s (ref %zu symbols, heap %zu)\n", word, ns, nh);
    }
    CHECK(bad == 0, "BPE scan/heap vs reference: %d of 400 random words differ", bad);
    printf("bpe: 150 random merges, 400 random words (1..300 bytes), "
           "scan/heap/reference agree: %s\n",
           bad ? "no" : "yes");
    lily_bpe_free(&b);
    lily_vocab_free(&v);
}

static void test_bytelevel(void) {
    int ok = 1;
    for (unsigned c = 0; c < 256; c++)
        ok &= lily_bytelevel_byte(lily_bytelevel_cp(c)) == (int)c;
    CHECK(ok, "byte-level map must round-trip all 256 bytes");
    CHECK(lily_bytelevel_cp(' ') == 0x120 && lily_bytelevel_cp('\n') == 0x10A &&
              lily_bytelevel_cp('A') == 'A' && lily_bytelevel_cp(0xAD) == 0x143,
          "byte-level map: space->U+0120, newline->U+010A, A->A, 0xAD->U+0143");
    CHECK(lily_bytelevel_byte(0x144) == -1 && lily_bytelevel_byte(' ') == -1,
          "code points outside the alphabet map to no byte");
}

int main(void) {
    test_valid_prefix();
    test_lossy();
    test_json_string();
    test_translate();
    test_split();
    test_nfc_fastpath();
    test_bpe_random();
    test_bytelevel();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
