/* Tool parameter schemas and value conversion (see toolschema.h). */
#include "gen/toolschema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gen/jsonnorm.h"

const cJSON *lily_tool_params(const cJSON *tools, const char *fn) {
    if (!cJSON_IsArray(tools) || !fn) return NULL;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, fn))
            return cJSON_GetObjectItemCaseSensitive(f, "parameters");
    }
    return NULL;
}

/* Resolves "#/a/b" against the root schema. */
static const cJSON *resolve_ref(const cJSON *root, const char *ref) {
    if (strncmp(ref, "#/", 2)) return NULL;
    const cJSON *node = root;
    const char *p = ref + 2;
    while (node && *p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        char key[128];
        if (n >= sizeof key) return NULL;
        memcpy(key, p, n);
        key[n] = 0;
        node = cJSON_GetObjectItemCaseSensitive(node, key);
        p += n + (slash ? 1 : 0);
    }
    return node;
}

static lily_param_kind kind_of_type(const char *t) {
    if (!strcmp(t, "string")) return LILY_PARAM_STRING;
    if (!strcmp(t, "integer")) return LILY_PARAM_INTEGER;
    if (!strcmp(t, "number")) return LILY_PARAM_NUMBER;
    if (!strcmp(t, "boolean")) return LILY_PARAM_BOOLEAN;
    if (!strcmp(t, "object") || !strcmp(t, "array")) return LILY_PARAM_OBJECT;
    if (!strcmp(t, "null")) return LILY_PARAM_NULL;
    return LILY_PARAM_ANY;
}

static int is_null_schema(const cJSON *s) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, "null");
}

lily_param_kind lily_param_kind_of(const cJSON *params, const char *param) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(props, param);
    for (int hop = 0; s && cJSON_IsObject(s) && hop < 16; hop++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (cJSON_IsString(ref)) {
            s = resolve_ref(params, ref->valuestring);
            continue;
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
        if (cJSON_IsString(t)) return kind_of_type(t->valuestring);
        if (cJSON_IsArray(t)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, t) {
                if (cJSON_IsString(e) && strcmp(e->valuestring, "null"))
                    return kind_of_type(e->valuestring);
            }
            return LILY_PARAM_NULL;
        }
        const cJSON *alt = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
        if (!alt) alt = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
        if (cJSON_IsArray(alt)) {
            const cJSON *e, *pick = NULL;
            cJSON_ArrayForEach(e, alt) {
                if (!is_null_schema(e)) {
                    pick = e;
                    break;
                }
            }
            s = pick;
            continue;
        }
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
        if (cJSON_IsArray(en)) {
            const cJSON *e;
            int all_str = cJSON_GetArraySize(en) > 0;
            cJSON_ArrayForEach(e, en) all_str &= cJSON_IsString(e);
            return all_str ? LILY_PARAM_STRING : LILY_PARAM_ANY;
        }
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "const"))) return LILY_PARAM_STRING;
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
            cJSON_GetObjectItemCaseSensitive(s, "items"))
            return LILY_PARAM_OBJECT;
        return LILY_PARAM_ANY;
    }
    return LILY_PARAM_ANY;
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Validates a JSON number token covering all of s[0..n). */
static int json_number(const char *s, size_t n, int *integral) {
    size_t i = 0;
    *integral = 1;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return 0;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        *integral = 0;
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *integral = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d) return 0;
    }
    return i == n;
}

static int word_ci(const char *s, size_t n, const char *w) {
    return strlen(w) == n && !strncasecmp(s, w, n);
}

void lily_param_convert(lily_param_kind kind, const char *raw, size_t n, lily_sb *out) {
    const char *t = raw;
    size_t tn = n;
    while (tn && is_ws(*t))
        t++, tn--;
    while (tn && is_ws(t[tn - 1]))
        tn--;
    int integral;
    if (kind != LILY_PARAM_STRING && (word_ci(t, tn, "null") || word_ci(t, tn, "none"))) {
        lily_sb_puts(out, "null");
        return;
    }
    switch (kind) {
    case LILY_PARAM_STRING: break;
    case LILY_PARAM_NULL: lily_sb_puts(out, "null"); return;
    case LILY_PARAM_BOOLEAN:
        if (word_ci(t, tn, "true")) {
            lily_sb_puts(out, "true");
            return;
        }
        if (word_ci(t, tn, "false")) {
            lily_sb_puts(out, "false");
            return;
        }
        break;
    case LILY_PARAM_INTEGER:
        if (json_number(t, tn, &integral)) {
            if (integral) {
                lily_sb_append(out, t, tn);
                return;
            }
            char tmp[64];
            if (tn < sizeof tmp) {
                memcpy(tmp, t, tn);
                tmp[tn] = 0;
                double d = strtod(tmp, NULL);
                if (d == floor(d) && fabs(d) < 9007199254740992.0) {
                    lily_sb_printf(out, "%.0f", d);
                    return;
                }
            }
        }
        break;
    case LILY_PARAM_NUMBER:
        if (json_number(t, tn, &integral)) {
            lily_sb_append(out, t, tn);
            return;
        }
        break;
    case LILY_PARAM_OBJECT:
        if (!lily_json_normalize(t, tn, 0, out) || !lily_json_normalize(t, tn, 1, out)) return;
        break;
    case LILY_PARAM_ANY:
        if (!lily_json_normalize(t, tn, 0, out)) return;
        break;
    }
    lily_sb_json_str(out, raw, n);
}
