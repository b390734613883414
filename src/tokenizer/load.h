/* The tokenizer object and its construction from parsed tokenizer.json / tokenizer_config.json.
 * Every field this implementation cannot reproduce exactly is rejected here with a message
 * naming it, so a loaded tokenizer always encodes like HF tokenizers. */
#ifndef LILY_TOKENIZER_LOAD_H
#define LILY_TOKENIZER_LOAD_H

#include <cjson/cJSON.h>
#include <pthread.h>

#include "lily.h"
#include "tokenizer/added.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"
#include "tokenizer/vocab.h"

struct lily_tokenizer {
    lily_vocab vocab;
    lily_bpe bpe;
    lily_pretok pre;
    lily_added_set added;
    int32_t eos_id;       /* tokenizer_config.json's eos_token, or -1 */
    pthread_mutex_t lock; /* serializes encode (the BPE cache and regex match data) */
};

/* Fills t (zeroed by the caller) from the parsed files; config may be NULL. On failure t holds
 * partial state that lily_tokenizer_load_free releases. */
int lily_tokenizer_load(struct lily_tokenizer *t, const cJSON *root, const cJSON *config,
                        lily_err *e);
void lily_tokenizer_load_free(struct lily_tokenizer *t);

#endif
