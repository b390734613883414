/* Reading tokenizer.json into the tokenizer object (see load.h). */
#include "tokenizer/load.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* GPT-2's split regex, used by a ByteLevel pre-tokenizer with use_regex true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Reads boolean field name of o into *v; absent or null leaves the default. */
static int get_bool(const cJSON *o, const char *name, int *v, const char *where, lily_err *e) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!b || cJSON_IsNull(b)) return 0;
    if (!cJSON_IsBool(b)) return lily_fail(e, "%s.%s is not a boolean", where, name);
    *v = cJSON_IsTrue(b);
    return 0;
}

static int get_id(const cJSON *n, int32_t *id) {
    if (!cJSON_IsNumber(n)) return -1;
    double d = n->valuedouble;
    if (!(d >= 0 && d < 2147483647.0) || floor(d) != d) return -1;
    *id = (int32_t)d;
    return 0;
}

/* Empty string or null: the BPE options we do not implement must be off. */
static int is_empty_opt(const cJSON *o) {
    return !o || cJSON_IsNull(o) || (cJSON_IsString(o) && !o->valuestring[0]) || cJSON_IsFalse(o);
}

/* ---- normalizer ---------------------------------------------------------------------- */

static int load_normalizer(struct lily_tokenizer *t, const cJSON *n, lily_err *e) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = type_of(n);
    if (!type) return lily_fail(e, "normalizer has no type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return lily_fail(e, "normalizer Sequence has no list");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) if (load_normalizer(t, it, e)) return -1;
        return 0;
    }
    static const struct {
        const char *name;
        int form;
    } forms[] = {{"NFC", LILY_NORM_NFC},
                 {"NFD", LILY_NORM_NFD},
                 {"NFKC", LILY_NORM_NFKC},
                 {"NFKD", LILY_NORM_NFKD}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (!strcmp(type, forms[i].name)) return lily_pretok_add_norm(&t->pre, forms[i].form, e);
    return lily_fail(e, "unsupported normalizer type '%s'", type);
}

/* ---- pre-tokenizer ------------------------------------------------------------------- */

static int load_pretok(struct lily_tokenizer *t, const cJSON *p, int *n_bytelevel, lily_err *e) {
    const char *type = type_of(p);
    if (!type) return lily_fail(e, "pre_tokenizer has no type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return lily_fail(e, "pre_tokenizer Sequence has no list");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) if (load_pretok(t, it, n_bytelevel, e)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        int prefix = 1, use_regex = 1; /* HF defaults */
        if (get_bool(p, "add_prefix_space", &prefix, "ByteLevel", e) ||
            get_bool(p, "use_regex", &use_regex, "ByteLevel", e))
            return -1;
        if (prefix) return lily_fail(e, "ByteLevel add_prefix_space true is not supported");
        (*n_bytelevel)++;
        if (use_regex)
            return lily_pretok_add_split(&t->pre, gpt2_pattern, sizeof gpt2_pattern - 1, 1,
                                         LILY_SPLIT_ISOLATED, e);
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        int invert = 0;
        if (get_bool(p, "invert", &invert, "Split", e)) return -1;
        if (invert) return lily_fail(e, "Split with invert true is not supported");
        if (!cJSON_IsString(beh)) return lily_fail(e, "Split has no behavior");
        int b;
        if (!strcmp(beh->valuestring, "Isolated"))
            b = LILY_SPLIT_ISOLATED;
        else if (!strcmp(beh->valuestring, "Removed"))
            b = LILY_SPLIT_REMOVED;
        else
            return lily_fail(e, "Split behavior '%s' is not supported", beh->valuestring);
        if (cJSON_IsString(re))
            return lily_pretok_add_split(&t->pre, re->valuestring, strlen(re->valuestring), 1, b,
                                         e);
        if (cJSON_IsString(str) && str->valuestring[0])
            return lily_pretok_add_split(&t->pre, str->valuestring, strlen(str->valuestring), 0, b,
                                         e);
        return lily_fail(e, "Split has no Regex or String pattern");
    }
    return lily_fail(e, "unsupported pre_tokenizer type '%s'", type);
}

/* Decoder and post-processor: only the byte-level ones (a post-processor that adds BOS/EOS would
 * change the ids HF returns, so it is refused rather than ignored). */
static int check_bytelevel(const cJSON *d, const char *what, int allow_null, lily_err *e) {
    if (!d || cJSON_IsNull(d)) {
        if (allow_null) return 0;
        return lily_fail(e, "%s is missing; a ByteLevel %s is required", what, what);
    }
    const char *type = type_of(d);
    if (type && !strcmp(type, "Sequence")) {
        const char *key = !strcmp(what, "decoder") ? "decoders" : "processors";
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, key), *it;
        if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list))
            return lily_fail(e, "%s Sequence has no %s", what, key);
        cJSON_ArrayForEach(it, list) if (check_bytelevel(it, what, 0, e)) return -1;
        return 0;
    }
    if (!type || strcmp(type, "ByteLevel"))
        return lily_fail(e, "unsupported %s type '%s'", what, type ? type : "(none)");
    return 0;
}

/* ---- vocabulary, merges, added tokens -------------------------------------------------- */

static int load_added(struct lily_tokenizer *t, const cJSON *a, int32_t id, const char *where,
                      lily_err *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
    if (!cJSON_IsString(c) || !c->valuestring[0])
        return lily_fail(e, "%s: added token %d has no content", where, (int)id);
    int special = 0, lstrip = 0, rstrip = 0, single = 0, normalized = 0;
    if (get_bool(a, "special", &special, where, e) || get_bool(a, "lstrip", &lstrip, where, e) ||
        get_bool(a, "rstrip", &rstrip, where, e) || get_bool(a, "single_word", &single, where, e) ||
        get_bool(a, "normalized", &normalized, where, e))
        return -1;
    size_t len = strlen(c->valuestring);
    unsigned flags = LILY_VOCAB_ADDED | (special ? LILY_VOCAB_SPECIAL : 0);
    if (lily_vocab_add(&t->vocab, id, c->valuestring, len, flags, e))
        return lily_fail_prefix(e, "%s", where);
    /* HF looks for a normalized added token in normalized text, so match its normal form. */
    char *norm = NULL;
    size_t norm_len = 0;
    if (normalized && lily_pretok_normalize(&t->pre, c->valuestring, len, &norm, &norm_len, e))
        return -1;
    lily_added_tok tok = {.id = id,
                          .len = (uint32_t)(norm ? norm_len : len),
                          .special = (uint8_t)special,
                          .lstrip = (uint8_t)lstrip,
                          .rstrip = (uint8_t)rstrip,
                          .single_word = (uint8_t)single,
                          .normalized = (uint8_t)normalized};
    if (tok.len) lily_added_add(&t->added, &tok, norm ? norm : c->valuestring);
    free(norm);
    return 0;
}

static int load_merges(struct lily_tokenizer *t, const cJSON *merges, lily_err *e) {
    if (!cJSON_IsArray(merges)) return lily_fail(e, "model.merges is missing or not a list");
    int32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *l, *r;
        size_t ln, rn;
        if (cJSON_IsString(m)) { /* "left right" */
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return lily_fail(e, "merge %d '%s' is not two tokens separated by one space",
                                 (int)rank, s);
            l = s;
            ln = (size_t)(sp - s);
            r = sp + 1;
            rn = strlen(r);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) { /* ["left", "right"] */
            l = cJSON_GetArrayItem(m, 0)->valuestring;
            r = cJSON_GetArrayItem(m, 1)->valuestring;
            ln = strlen(l);
            rn = strlen(r);
        } else {
            return lily_fail(e, "merge %d is neither a string nor a pair of strings", (int)rank);
        }
        if (!ln || !rn) return lily_fail(e, "merge %d has an empty side", (int)rank);
        if (lily_bpe_add_merge(&t->bpe, &t->vocab, l, ln, r, rn, rank, e)) return -1;
        rank++;
    }
    return 0;
}

static int load_model(struct lily_tokenizer *t, const cJSON *model, lily_err *e) {
    if (!cJSON_IsObject(model)) return lily_fail(e, "'model' is missing");
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE"))
        return lily_fail(e, "unsupported model type '%s' (only BPE)", type);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return lily_fail(e, "BPE dropout is not supported");
    static const char *const off[] = {"continuing_subword_prefix", "end_of_word_suffix",
                                      "byte_fallback"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (!is_empty_opt(cJSON_GetObjectItemCaseSensitive(model, off[i])))
            return lily_fail(e, "BPE option %s is not supported", off[i]);
    if (get_bool(model, "ignore_merges", &t->bpe.ignore_merges, "model", e)) return -1;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *v;
    if (!cJSON_IsObject(vocab)) return lily_fail(e, "model.vocab is missing or not an object");
    cJSON_ArrayForEach(v, vocab) {
        int32_t id;
        if (get_id(v, &id))
            return lily_fail(e, "model.vocab: token '%s' has an invalid id", v->string);
        if (lily_vocab_add(&t->vocab, id, v->string, strlen(v->string), 0, e))
            return lily_fail_prefix(e, "model.vocab");
    }
    if (t->vocab.n == 0) return lily_fail(e, "model.vocab is empty");
    if (lily_bpe_init(&t->bpe, &t->vocab, e)) return -1;
    return 0;
}

int lily_tokenizer_load(struct lily_tokenizer *t, const cJSON *root, const cJSON *config,
                        lily_err *e) {
    if (!cJSON_IsObject(root)) return lily_fail(e, "tokenizer.json is not a JSON object");
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    if (trunc && !cJSON_IsNull(trunc)) return lily_fail(e, "truncation is not supported");
    if (load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), e)) return -1;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    int n_bytelevel = 0;
    if (pre && !cJSON_IsNull(pre) && load_pretok(t, pre, &n_bytelevel, e)) return -1;
    if (n_bytelevel != 1)
        return lily_fail(e,
                         "pre_tokenizer must contain exactly one ByteLevel step (has %d); "
                         "only byte-level BPE is supported",
                         n_bytelevel);
    if (check_bytelevel(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder", 0, e) ||
        check_bytelevel(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor",
                        1, e))
        return -1;
    if (load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), e)) return -1;

    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *a;
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return lily_fail(e, "added_tokens is not a list");
    cJSON_ArrayForEach(a, added) {
        int32_t id;
        if (get_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id))
            return lily_fail(e, "added_tokens: an entry has no valid id");
        if (load_added(t, a, id, "added_tokens", e)) return -1;
    }
    int split_special = 0;
    if (config) {
        if (!cJSON_IsObject(config))
            return lily_fail(e, "tokenizer_config.json is not a JSON object");
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(config, "added_tokens_decoder");
        cJSON_ArrayForEach(a, dec) {
            char *end = NULL;
            long id = strtol(a->string, &end, 10);
            if (!a->string[0] || *end || id < 0 || id >= INT32_MAX)
                return lily_fail(e, "tokenizer_config.json: added token key '%s' is not an id",
                                 a->string);
            if (load_added(t, a, (int32_t)id, "tokenizer_config.json", e)) return -1;
        }
        if (get_bool(config, "split_special_tokens", &split_special, "tokenizer_config", e))
            return -1;
    }
    /* Merges last: they may refer to tokens listed only in added_tokens. */
    if (load_merges(t,
                    cJSON_GetObjectItemCaseSensitive(
                        cJSON_GetObjectItemCaseSensitive(root, "model"), "merges"),
                    e))
        return -1;
    lily_vocab_finish(&t->vocab);
    lily_added_finish(&t->added, split_special);
    return 0;
}

void lily_tokenizer_load_free(struct lily_tokenizer *t) {
    lily_vocab_free(&t->vocab);
    lily_bpe_free(&t->bpe);
    lily_pretok_free(&t->pre);
    lily_added_free(&t->added);
}
