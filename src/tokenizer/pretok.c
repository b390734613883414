/* Normalizer and regex pre-tokenizer (see pretok.h). */
#include "tokenizer/pretok.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/err.h"

/* ---- normalizer ---------------------------------------------------------------------- */

int lily_pretok_add_norm(lily_pretok *p, int form, lily_err *e) {
    if (p->n_norm >= LILY_PRETOK_MAX) return lily_fail(e, "too many normalizers");
    p->norm[p->n_norm++] = form;
    return 0;
}

/* Code points that NFC leaves alone on their own and that compose with nothing next to them
 * unless that neighbour is outside these ranges: below U+0300 (ASCII, Latin-1, Latin
 * Extended-A/B, IPA; every canonical composition's second character is U+0300 or above), CJK
 * unified ideographs, kana without the combining voicing marks, and Hangul syllables (an LV
 * syllable composes only with a trailing jamo, which is outside). Text made only of these is
 * returned as is, which skips utf8proc for nearly all real text. */
static int nfc_inert(uint32_t cp) {
    return cp < 0x300 || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3041 && cp <= 0x3096) ||
           (cp >= 0x30A1 && cp <= 0x30FA) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

static int needs_norm(int form, const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (form != LILY_NORM_NFC) return 1; /* only ASCII is inert under every form */
        uint32_t cp;
        i += (size_t)lily_utf8_decode(s + i, &cp);
        if (!nfc_inert(cp)) return 1;
    }
    return 0;
}

int lily_pretok_normalize(const lily_pretok *p, const char *s, size_t n, char **out, size_t *outn,
                          lily_err *e) {
    *out = NULL;
    *outn = 0;
    const char *cur = s;
    size_t curn = n;
    for (int k = 0; k < p->n_norm; k++) {
        if (!needs_norm(p->norm[k], (const unsigned char *)cur, curn)) continue;
        int opt = UTF8PROC_STABLE;
        switch (p->norm[k]) {
        case LILY_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case LILY_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case LILY_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)curn,
                                          &res, (utf8proc_option_t)opt);
        if (m < 0) {
            free(*out);
            *out = NULL;
            return lily_fail(e, "normalization failed: %s", utf8proc_errmsg(m));
        }
        free(*out);
        *out = (char *)res;
        *outn = (size_t)m;
        cur = *out;
        curn = *outn;
    }
    return 0;
}

/* ---- regex split --------------------------------------------------------------------- */

/* Oniguruma's Unicode \s: TAB..CR, NEL, and the separators (Zs, Zl, Zp). */
#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"

char *lily_pretok_translate(const char *pat, size_t len) {
    lily_u8buf b = {0};
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            if (d == 's') {
                const char *r = in_class ? ONIG_SPACE : "[" ONIG_SPACE "]";
                lily_u8buf_put(&b, r, strlen(r));
            } else if (d == 'S' && !in_class) {
                const char *r = "[^" ONIG_SPACE "]";
                lily_u8buf_put(&b, r, strlen(r));
            } else {
                /* Anything else escaped (including \S inside a class, which has no class
                 * spelling) is kept; PCRE2's \S differs from Oniguruma's only at U+0085. */
                lily_u8buf_put(&b, pat + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            lily_u8buf_put(&b, pat + i, 1);
            /* A ']' right after '[' or '[^' is a literal, not the end of the class. */
            if (i + 1 < len && pat[i + 1] == '^') lily_u8buf_put(&b, pat + ++i, 1);
            if (i + 1 < len && pat[i + 1] == ']') lily_u8buf_put(&b, pat + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {
            /* POSIX class such as [:alpha:]: copy through its closing ":]". */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < len; j++)
                if (pat[j] == ':' && pat[j + 1] == ']') {
                    end = pat + j + 2;
                    break;
                }
            if (end) {
                lily_u8buf_put(&b, pat + i, (size_t)(end - (pat + i)));
                i = (size_t)(end - pat) - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        lily_u8buf_put(&b, &c, 1);
    }
    lily_u8buf_put(&b, "", 1);
    return (char *)b.p;
}

int lily_pretok_add_split(lily_pretok *p, const char *pattern, size_t len, int is_regex,
                          int behavior, lily_err *e) {
    if (p->n_split >= LILY_PRETOK_MAX) return lily_fail(e, "too many split pre-tokenizers");
    char *pat = is_regex ? lily_pretok_translate(pattern, len) : NULL;
    int code;
    PCRE2_SIZE off;
    /* PCRE2 refuses UCP together with LITERAL (it has no meaning there). The pattern comes from
     * the file and may be invalid UTF-8, so compile checks it (no PCRE2_NO_UTF_CHECK here). */
    uint32_t opts = PCRE2_UTF | (is_regex ? PCRE2_UCP : PCRE2_LITERAL);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(pat ? pat : pattern),
                                   pat ? PCRE2_ZERO_TERMINATED : len, opts, &code, &off, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lily_fail(e, "cannot compile split pattern '%.*s' at offset %zu: %s",
                         (int)(len > 200 ? 200 : len), pattern, (size_t)off, (char *)msg);
    }
    /* JIT is an optimization: if it is unavailable pcre2_match interprets the pattern. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    p->split[p->n_split].re = re;
    p->split[p->n_split].behavior = behavior;
    p->n_split++;
    if (!p->md) {
        p->md = pcre2_match_data_create(4, NULL);
        p->mctx = pcre2_match_context_create(NULL);
        /* The default 32 KiB JIT stack is enough for these patterns; 4 MiB leaves room for
         * unusual ones from other tokenizer files. */
        p->jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!p->md || !p->mctx || !p->jit_stack)
            return lily_fail(e, "out of memory creating regex match data");
        pcre2_jit_stack_assign(p->mctx, NULL, p->jit_stack);
    }
    return 0;
}

static int split_stage(lily_pretok *p, int k, const char *s, size_t n, lily_word_fn fn, void *ud,
                       lily_err *e);

static int emit(lily_pretok *p, int k, const char *s, size_t n, lily_word_fn fn, void *ud,
                lily_err *e) {
    if (!n) return 0;
    if (k + 1 < p->n_split) return split_stage(p, k + 1, s, n, fn, ud, e);
    return fn(ud, s, n);
}

static int split_stage(lily_pretok *p, int k, const char *s, size_t n, lily_word_fn fn, void *ud,
                       lily_err *e) {
    const pcre2_code *re = p->split[k].re;
    int removed = p->split[k].behavior == LILY_SPLIT_REMOVED;
    size_t pos = 0, gap = 0; /* gap: start of the text not yet emitted */
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, p->md, p->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lily_fail(e, "pre-tokenizer regex failed at byte %zu: %s", pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing; step over one character and search again. */
            pos = ms + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (emit(p, k, s + gap, ms - gap, fn, ud, e)) return -1;
        if (!removed && emit(p, k, s + ms, me - ms, fn, ud, e)) return -1;
        pos = gap = me;
    }
    return emit(p, k, s + gap, n - gap, fn, ud, e);
}

int lily_pretok_split(lily_pretok *p, const char *s, size_t n, lily_word_fn fn, void *ud,
                      lily_err *e) {
    if (!n) return 0;
    if (!p->n_split) return fn(ud, s, n);
    return split_stage(p, 0, s, n, fn, ud, e);
}

void lily_pretok_free(lily_pretok *p) {
    for (int k = 0; k < p->n_split; k++)
        pcre2_code_free(p->split[k].re);
    pcre2_match_data_free(p->md);
    pcre2_match_context_free(p->mctx);
    pcre2_jit_stack_free(p->jit_stack);
    memset(p, 0, sizeof *p);
}
