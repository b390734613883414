/* Added tokens (the "added_tokens" of tokenizer.json): strings such as <|im_start|> that are
 * found in the text before normalization and pre-tokenization, and become one id each.
 *
 * Matching follows HF tokenizers: scanning left to right, at the first position where any added
 * token occurs the longest one wins; text between matches goes on to the model. Tokens flagged
 * "normalized" are looked for in the normalized text instead of the raw text (group 1 vs 0).
 * single_word rejects a match touching a word character; lstrip / rstrip make the match swallow
 * the whitespace before / after it. Candidates are bucketed by first byte, and when all tokens
 * of a group start with the same byte (as Qwen's all start with '<') the scan is a memchr. */
#ifndef LILY_TOKENIZER_ADDED_H
#define LILY_TOKENIZER_ADDED_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "tokenizer/utf8.h"

typedef struct lily_added_tok {
    int32_t id;
    uint32_t off, len; /* content bytes in the set's strs */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} lily_added_tok;

typedef struct lily_added_set {
    lily_added_tok *tok; /* [n] */
    size_t n, cap;
    lily_u8buf strs;
    struct {
        uint32_t *order;     /* token indices sorted by first byte, then longest first */
        uint32_t start[257]; /* order[start[b] .. start[b+1]) begin with byte b */
        size_t n;            /* tokens in the group */
        int one_first;       /* all tokens start with byte `first` */
        unsigned char first;
    } grp[2];
} lily_added_set;

/* Adds a token (content must be non-empty). A later entry with the same id replaces the flags. */
void lily_added_add(lily_added_set *s, const lily_added_tok *t, const char *content);

/* Builds the lookup buckets. With skip_special, tokens flagged special are not matched in text
 * (tokenizer_config.json "split_special_tokens": true). */
void lily_added_finish(lily_added_set *s, int skip_special);

/* Finds the next match in t[from..n) of group g (0 raw, 1 normalized). Returns 1 with the
 * matched span [*ms, *me) (including stripped whitespace) and the id, or 0 if there is none. */
int lily_added_next(const lily_added_set *s, int g, const char *t, size_t n, size_t from,
                    size_t *ms, size_t *me, int32_t *id);

void lily_added_free(lily_added_set *s);

#endif
