/* Normalization and pre-tokenization: the steps between raw text and the BPE model.
 *
 * The normalizer is a sequence of Unicode normal forms (utf8proc). The pre-tokenizer is a
 * sequence of regex splits (PCRE2 with UTF, UCP and JIT) whose matches become words; the
 * patterns come from tokenizer.json and are written for Oniguruma, the engine of HF tokenizers.
 * The one construct the two engines read differently in these patterns is \s: Oniguruma's
 * Unicode \s also accepts U+0085 (NEL), so \s and \S are rewritten into explicit classes before
 * compiling (lily_pretok_translate). */
#ifndef LILY_TOKENIZER_PRETOK_H
#define LILY_TOKENIZER_PRETOK_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>

#include "lily.h"
#include "tokenizer/utf8.h"

enum { LILY_NORM_NFC = 1, LILY_NORM_NFD, LILY_NORM_NFKC, LILY_NORM_NFKD };
enum { LILY_SPLIT_ISOLATED = 1, LILY_SPLIT_REMOVED };

#define LILY_PRETOK_MAX 8

typedef struct lily_pretok {
    int n_norm;
    int norm[LILY_PRETOK_MAX]; /* LILY_NORM_*, applied in order */
    int n_split;
    struct {
        pcre2_code *re;
        int behavior; /* LILY_SPLIT_* */
    } split[LILY_PRETOK_MAX];
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
} lily_pretok;

/* Adds a normal form to the normalizer sequence. */
int lily_pretok_add_norm(lily_pretok *p, int form, lily_err *e);

/* Adds a split stage. pattern is a regex (is_regex 1) or a literal string (0). */
int lily_pretok_add_split(lily_pretok *p, const char *pattern, size_t len, int is_regex,
                          int behavior, lily_err *e);

/* Rewrites \s and \S in an Oniguruma pattern to the same class in PCRE2 syntax. Returns a heap
 * string (caller frees with free()). */
char *lily_pretok_translate(const char *pattern, size_t len);

/* Normalizes s[0..n) (valid UTF-8). If the text is already normalized (always so for ASCII and
 * for common scripts under NFC), returns 0 with *out = NULL; else *out is a heap buffer of *outn
 * bytes (caller frees with free()). */
int lily_pretok_normalize(const lily_pretok *p, const char *s, size_t n, char **out, size_t *outn,
                          lily_err *e);

/* Splits s[0..n) (valid UTF-8) through every split stage and calls fn on each non-empty word in
 * order. Stops with fn's error if fn returns non-zero. With no split stage the whole text is one
 * word. */
typedef int (*lily_word_fn)(void *ud, const char *w, size_t n);
int lily_pretok_split(lily_pretok *p, const char *s, size_t n, lily_word_fn fn, void *ud,
                      lily_err *e);

void lily_pretok_free(lily_pretok *p);

#endif
