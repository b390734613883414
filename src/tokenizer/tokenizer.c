/* Tokenizer entry points: opening, encoding and decoding (see tokenizer.h). */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "base/err.h"
#include "base/file.h"
#include "tokenizer/load.h"

/* tokenizer.json of the largest vocabularies is ~30 MB; anything far beyond is not one. */
#define MAX_JSON_BYTES (512u << 20)

static int parse_json(const char *buf, size_t len, const char *name, cJSON **out, lily_err *e) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!*out) {
        size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : len;
        size_t rest = at;
        while (rest < len &&
               (buf[rest] == ' ' || buf[rest] == '\n' || buf[rest] == '\r' || buf[rest] == '\t'))
            rest++;
        if (rest >= len)
            return lily_fail(e, "%s: JSON is truncated or empty (%zu bytes)", name, len);
        return lily_fail(e, "%s: invalid JSON near byte %zu", name, at);
    }
    return 0;
}

/* tokenizer_config.json's eos_token ("<|im_end|>" or {"content": ...}) as an id, or -1 */
static int32_t config_eos(const lily_tokenizer *t, const cJSON *cfg) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
    if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
    return cJSON_IsString(eos) ? lily_tokenizer_token_to_id(t, eos->valuestring) : -1;
}

int lily_tokenizer_open_mem(const char *json, size_t json_len, const char *config,
                            size_t config_len, lily_tokenizer **out, lily_err *e) {
    *out = NULL;
    cJSON *root = NULL, *cfg = NULL;
    if (parse_json(json, json_len, "tokenizer.json", &root, e)) return -1;
    if (config && parse_json(config, config_len, "tokenizer_config.json", &cfg, e)) {
        cJSON_Delete(root);
        return -1;
    }
    lily_tokenizer *t = lily_xcalloc(1, sizeof *t);
    int rc = lily_tokenizer_load(t, root, cfg, e);
    t->eos_id = rc ? -1 : config_eos(t, cfg);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
#ifdef __GLIBC__
    /* The parse tree was ~10^6 small blocks. Consolidating them now, instead of inside the
     * first large malloc (which happens in the first encode), moves ~50 ms off the first
     * request and returns the memory to the system. */
    malloc_trim(0);
#endif
    if (rc) {
        lily_tokenizer_load_free(t);
        free(t);
        return -1;
    }
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return 0;
}

int lily_tokenizer_open(const char *model_dir, lily_tokenizer **out, lily_err *e) {
    char path[4096], cpath[4096];
    *out = NULL;
    if (lily_path_join(path, sizeof path, model_dir, "tokenizer.json") ||
        lily_path_join(cpath, sizeof cpath, model_dir, "tokenizer_config.json"))
        return lily_fail(e, "model directory path too long");
    if (!lily_file_exists(path)) return lily_fail(e, "%s: no such file", path);
    char *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    if (lily_read_file(path, MAX_JSON_BYTES, &json, &json_len, e)) return -1;
    if (lily_file_exists(cpath) && lily_read_file(cpath, MAX_JSON_BYTES, &cfg, &cfg_len, e)) {
        free(json);
        return -1;
    }
    int rc = lily_tokenizer_open_mem(json, json_len, cfg, cfg_len, out, e);
    free(json);
    free(cfg);
    if (rc) return lily_fail_prefix(e, "%s", model_dir);
    return 0;
}

void lily_tokenizer_free(lily_tokenizer *t) {
    if (!t) return;
    lily_tokenizer_load_free(t);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct enc_ctx {
    lily_tokenizer *t;
    lily_ids *out;
} enc_ctx;

static int on_word(void *ud, const char *w, size_t n) {
    enc_ctx *c = ud;
    lily_bpe_word(&c->t->bpe, &c->t->vocab, (const unsigned char *)w, n, c->out);
    return 0;
}

/* Text between raw-matched added tokens: normalize, cut out normalized added tokens, split. */
static int encode_segment(lily_tokenizer *t, const char *s, size_t n, lily_ids *out, lily_err *e) {
    if (!n) return 0;
    char *norm = NULL;
    size_t nn = 0;
    if (lily_pretok_normalize(&t->pre, s, n, &norm, &nn, e)) return -1;
    if (norm) {
        s = norm;
        n = nn;
    }
    enc_ctx c = {t, out};
    size_t pos = 0, ms, me;
    int32_t id;
    int rc = 0;
    while (!rc && lily_added_next(&t->added, 1, s, n, pos, &ms, &me, &id)) {
        rc = lily_pretok_split(&t->pre, s + pos, ms - pos, on_word, &c, e);
        lily_ids_push(out, id);
        pos = me;
    }
    if (!rc) rc = lily_pretok_split(&t->pre, s + pos, n - pos, on_word, &c, e);
    free(norm);
    return rc;
}

int lily_tokenizer_encode(lily_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                          lily_err *e) {
    *ids = NULL;
    *n = 0;
    size_t ok = lily_utf8_valid_prefix((const unsigned char *)text, len);
    if (ok != len)
        return lily_fail(e, "input is not valid UTF-8 (bad byte 0x%02X at offset %zu)",
                         (unsigned char)text[ok], ok);
    lily_ids out = {0};
    int rc = 0;
    pthread_mutex_lock(&t->lock);
    size_t pos = 0, ms, me;
    int32_t id;
    while (!rc && lily_added_next(&t->added, 0, text, len, pos, &ms, &me, &id)) {
        rc = encode_segment(t, text + pos, ms - pos, &out, e);
        lily_ids_push(&out, id);
        pos = me;
    }
    if (!rc) rc = encode_segment(t, text + pos, len - pos, &out, e);
    pthread_mutex_unlock(&t->lock);
    if (rc) {
        free(out.p);
        return -1;
    }
    *ids = out.p ? out.p : lily_xmalloc(sizeof(int32_t));
    *n = out.n;
    return 0;
}

/* ---- decoding and lookups ------------------------------------------------------------ */

int lily_tokenizer_decode(const lily_tokenizer *t, const int32_t *ids, size_t n, char **text,
                          size_t *len, lily_err *e) {
    *text = NULL;
    *len = 0;
    lily_u8buf raw = {0}, out = {0};
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (ids[i] < 0 || ids[i] >= t->vocab.n) {
            lily_u8buf_free(&raw);
            return lily_fail(e, "token id %d at position %zu is out of range [0, %d)", (int)ids[i],
                             i, (int)t->vocab.n);
        }
        const char *b = lily_tokenizer_token_bytes(t, ids[i], &k);
        if (b) lily_u8buf_put(&raw, b, k);
    }
    lily_utf8_lossy(raw.p, raw.n, 1, &out);
    lily_u8buf_free(&raw);
    lily_u8buf_put(&out, "", 1);
    *text = (char *)out.p;
    *len = out.n - 1;
    return 0;
}

int32_t lily_tokenizer_vocab_size(const lily_tokenizer *t) {
    return t->vocab.n;
}

int32_t lily_tokenizer_token_to_id(const lily_tokenizer *t, const char *token) {
    return lily_vocab_find_any(&t->vocab, token, strlen(token));
}

const char *lily_tokenizer_token_bytes(const lily_tokenizer *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->vocab.n || !(t->vocab.flags[id] & LILY_VOCAB_PRESENT)) return NULL;
    *len = t->vocab.dec_len[id];
    return (const char *)t->vocab.decs.p + t->vocab.dec_off[id];
}

int lily_tokenizer_is_special(const lily_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab.n && (t->vocab.flags[id] & LILY_VOCAB_SPECIAL) != 0;
}

int32_t lily_tokenizer_eos_id(const lily_tokenizer *t) {
    return t->eos_id;
}

int lily_tokenizer_is_added(const lily_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab.n && (t->vocab.flags[id] & LILY_VOCAB_ADDED) != 0;
}
