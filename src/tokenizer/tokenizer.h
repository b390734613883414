/* Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2/3/3.5 family).
 *
 * Encoding follows HF tokenizers step by step: added tokens (<|im_start|>, <think>, ...) are cut
 * out of the text first, special ones included (as HF does by default); the rest is normalized
 * (NFC), split by the pre-tokenizer regex from the file, mapped to the byte-level alphabet and
 * merged by rank. Decoding maps tokens back to bytes; invalid UTF-8 in the result becomes U+FFFD.
 * A streaming decoder for generation is in detok.h (included here).
 *
 * Thread safety: encode takes an internal lock (it updates a word cache), so one tokenizer may be
 * shared by threads; every other call only reads. */
#ifndef LILY_TOKENIZER_TOKENIZER_H
#define LILY_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "lily.h"
#include "tokenizer/detok.h"

typedef struct lily_tokenizer lily_tokenizer;

/* Opens model_dir/tokenizer.json and, when present, model_dir/tokenizer_config.json (its
 * added_tokens_decoder and split_special_tokens). A file this tokenizer cannot reproduce exactly
 * (another model type, normalizer, pre-tokenizer or decoder) is an error naming the field. Free
 * with lily_tokenizer_free. */
int lily_tokenizer_open(const char *model_dir, lily_tokenizer **out, lily_err *e);

/* Same from memory: json[0..json_len) is tokenizer.json, config (may be NULL) is
 * tokenizer_config.json. The buffers are not kept. */
int lily_tokenizer_open_mem(const char *json, size_t json_len, const char *config,
                            size_t config_len, lily_tokenizer **out, lily_err *e);

void lily_tokenizer_free(lily_tokenizer *tok);

/* Encodes text[0..len), which must be valid UTF-8 (else an error giving the byte offset). No BOS
 * or EOS is added. *ids is a heap array of *n ids (caller frees with free(); never NULL on
 * success, even for n = 0). */
int lily_tokenizer_encode(lily_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                          size_t *n, lily_err *e);

/* Decodes ids into *text, a NUL-terminated heap string of *len bytes (caller frees with free()).
 * Every token is decoded, special ones included; an id outside [0, vocab_size) is an error; an
 * id inside the range with no token (a hole) decodes to nothing, as in HF. */
int lily_tokenizer_decode(const lily_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                          size_t *len, lily_err *e);

/* Highest token id + 1, counting added tokens. */
int32_t lily_tokenizer_vocab_size(const lily_tokenizer *tok);

/* The id of a token given as written in tokenizer.json ("<|im_end|>", "Ġthe"), or -1. */
int32_t lily_tokenizer_token_to_id(const lily_tokenizer *tok, const char *token);

/* The raw bytes token id decodes to (not NUL-terminated; may be a partial UTF-8 character),
 * borrowed from the tokenizer; NULL if id has no token. */
const char *lily_tokenizer_token_bytes(const lily_tokenizer *tok, int32_t id, size_t *len);

/* The end-of-sequence token tokenizer_config.json names (eos_token: "<|im_end|>" in the Qwen chat
 * models), or -1 when it names none the vocabulary has. */
int32_t lily_tokenizer_eos_id(const lily_tokenizer *tok);

/* 1 if id is an added token flagged special (<|im_start|>, <|endoftext|>, ...), else 0. */
int lily_tokenizer_is_special(const lily_tokenizer *tok, int32_t id);

/* 1 if id is an added token (special or not: <|im_end|>, <think>, <tool_call>, ...), else 0. */
int lily_tokenizer_is_added(const lily_tokenizer *tok, int32_t id);

#endif
