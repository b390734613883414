/* JSON in and out of template values, with Python's json module semantics: parsing keeps the
 * int/float distinction ("1" is an int, "1.0" a float) that cJSON loses, and dumping matches
 * json.dumps(ensure_ascii=False, separators=(", ", ": ")) as used by HF's tojson filter. */
#ifndef LILY_CHAT_TPL_JSON_H
#define LILY_CHAT_TPL_JSON_H

#include <cjson/cJSON.h>

#include "chat/tpl_value.h"

/* Parses JSON text into a value owned by rt's arena. Returns 0, or -1 with a message in err
 * (errlen bytes) naming the byte offset; never raises. */
int tpl_json_parse(tpl_rt *rt, const char *text, size_t len, tpl_val *out, char *err,
                   size_t errlen);

/* Converts a cJSON tree (numbers with an integral value within +-2^53 become ints). */
tpl_val tpl_from_cjson(tpl_rt *rt, const cJSON *j);

typedef struct tpl_json_opts {
    int ensure_ascii; /* escape non-ASCII as \uXXXX */
    int sort_keys;
    const char *indent;   /* NULL = one line; else the indent unit ("" for indent=0) */
    const char *item_sep; /* NULL = ", " without indent, "," with */
    const char *key_sep;  /* NULL = ": " */
} tpl_json_opts;

/* json.dumps(v) appended to b; raises on values JSON cannot hold (Undefined, macros, ...). */
void tpl_json_dump(tpl_rt *rt, tpl_buf *b, const tpl_val *v, const tpl_json_opts *o);

#endif
