/* Request body parsing and validation (see request.h). */
#include "server/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "server/reqmsg.h"
#include "server/respfmt.h"

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

/* 1 if valid UTF-8 (the tokenizer and the SSE writer both need it); sets *bad to the offset. */
static int utf8_ok(const char *s, size_t n, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80                   ? 1
                   : (c >= 0xC2 && c <= 0xDF) ? 2
                   : (c >> 4) == 14           ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4
                                              : 0;
        if (!k || i + k > n) break;
        size_t j = 1;
        for (; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) break;
        if (j < k) break;
        if (k == 3) { /* overlong and surrogates */
            unsigned char c1 = (unsigned char)s[i + 1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) break;
        }
        if (k == 4) {
            unsigned char c1 = (unsigned char)s[i + 1];
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) break;
        }
        i += k;
    }
    *bad = i;
    return i == n;
}

/* ---- raw-text helpers ---------------------------------------------------------------------- */

/* Skips a JSON string starting at s[i] == '"'; returns the index after its closing quote. */
static size_t skip_str(const char *s, size_t n, size_t i) {
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

int lily_json_has_nul(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '"') continue;
        for (i++; i < n && s[i] != '"'; i++) {
            if (s[i] != '\\') continue;
            if (i + 5 < n && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) return 1;
            i++; /* the escaped character (a quote or backslash stays inside the string) */
        }
    }
    return 0;
}

/* The raw text of the first top-level member `key` of a JSON object (the body has already
 * parsed), or NULL. Keys written with escapes are not matched (the caller falls back). */
static const char *raw_member(const char *s, size_t n, const char *key, size_t *vlen) {
    size_t klen = strlen(key), i = 0;
    int depth = 0, want_key = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            size_t end = skip_str(s, n, i);
            if (depth == 1 && want_key) {
                int match = end - i == klen + 2 && !memcmp(s + i + 1, key, klen);
                i = end;
                while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
                    i++;
                if (i < n && s[i] == ':') i++;
                while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
                    i++;
                want_key = 0;
                if (match) {
                    size_t k = i;
                    while (k < n && (s[k] == '-' || s[k] == '+' || s[k] == '.' ||
                                     (s[k] >= '0' && s[k] <= '9') || s[k] == 'e' || s[k] == 'E'))
                        k++;
                    *vlen = k - i;
                    return s + i;
                }
                continue;
            }
            i = end;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
            want_key = depth == 1 && c == '{';
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1) {
            want_key = 1;
        }
        i++;
    }
    return NULL;
}

int lily_json_seed(const char *body, size_t len, double v, uint64_t *out) {
    size_t n = 0;
    const char *t = body ? raw_member(body, len, "seed", &n) : NULL;
    int neg = t && n && t[0] == '-';
    size_t d0 = (size_t)neg, k = d0;
    while (t && k < n && t[k] >= '0' && t[k] <= '9')
        k++;
    if (t && k == n && k > d0) { /* a plain integer: exact, whatever its size */
        uint64_t m = 0;
        for (size_t i = d0; i < n; i++) {
            unsigned dg = (unsigned)(t[i] - '0');
            if (m > (UINT64_MAX - dg) / 10) return -1;
            m = m * 10 + dg;
        }
        if (neg && m > (UINT64_C(1) << 63)) return -1;
        *out = neg ? (uint64_t)0 - m : m; /* two's complement of a negative seed */
        return 0;
    }
    /* written with a fraction or an exponent (1e3, 512.0): integral and in range as a double */
    if (!isfinite(v) || v != floor(v) || v < -0x1p63 || v >= 0x1p64) return -1;
    *out = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    return 0;
}

/* ---- typed field readers: 0 absent, 1 set, -1 error ---------------------------------------- */

static int get_bool(const cJSON *o, const char *name, int strings, int *out, lily_api_error *e) {
    const cJSON *j = field(o, name);
    if (!j) return 0;
    if (cJSON_IsBool(j)) {
        *out = cJSON_IsTrue(j);
        return 1;
    }
    if (strings && cJSON_IsString(j)) {
        if (!strcmp(j->valuestring, "true") || !strcmp(j->valuestring, "True")) {
            *out = 1;
            return 1;
        }
        if (!strcmp(j->valuestring, "false") || !strcmp(j->valuestring, "False")) {
            *out = 0;
            return 1;
        }
    }
    return lily_api_bad(e, "invalid_type", name, "'%s' must be a boolean", name);
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, double *out,
                   lily_api_error *e) {
    const cJSON *j = field(o, name);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return lily_api_bad(e, "invalid_type", name, "'%s' must be a number", name);
    if (j->valuedouble < lo || j->valuedouble > hi)
        return lily_api_bad(e, "invalid_value", name, "'%s' must be between %g and %g, got %g",
                            name, lo, hi, j->valuedouble);
    *out = j->valuedouble;
    return 1;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, long long *out,
                   lily_api_error *e) {
    const cJSON *j = field(o, name);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble != floor(j->valuedouble))
        return lily_api_bad(e, "invalid_type", name, "'%s' must be an integer", name);
    if (j->valuedouble < lo || j->valuedouble > hi)
        return lily_api_bad(e, "invalid_value", name,
                            "'%s' must be between %.0f and %.0f, got "
                            "%.0f",
                            name, lo, hi, j->valuedouble);
    *out = (long long)j->valuedouble;
    return 1;
}

/* ---- groups of fields ---------------------------------------------------------------------- */

static int parse_sampling(const cJSON *b, const char *body, size_t len, lily_request *r,
                          lily_api_error *e) {
    static const struct {
        const char *name;
        double lo, hi;
        unsigned bit;
        size_t off;
    } nums[] = {
        {"temperature", 0, 2, LILY_GIVEN_TEMPERATURE, offsetof(lily_request, temperature)},
        {"top_p", 0, 1, LILY_GIVEN_TOP_P, offsetof(lily_request, top_p)},
        {"min_p", 0, 1, LILY_GIVEN_MIN_P, offsetof(lily_request, min_p)},
        {"presence_penalty", -2, 2, LILY_GIVEN_PRESENCE, offsetof(lily_request, presence_penalty)},
        {"frequency_penalty", -2, 2, LILY_GIVEN_FREQUENCY,
         offsetof(lily_request, frequency_penalty)},
        {"repetition_penalty", 1e-6, 100, LILY_GIVEN_REPEAT,
         offsetof(lily_request, repeat_penalty)},
        {"repeat_penalty", 1e-6, 100, LILY_GIVEN_REPEAT, offsetof(lily_request, repeat_penalty)},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        double v = 0;
        int rc = get_num(b, nums[i].name, nums[i].lo, nums[i].hi, &v, e);
        if (rc < 0) return -1;
        if (rc) {
            *(float *)((char *)r + nums[i].off) = (float)v;
            r->given |= nums[i].bit;
        }
    }
    long long v = 0;
    int rc = get_int(b, "top_k", -1, 1e9, &v, e);
    if (rc < 0) return -1;
    if (rc) {
        r->top_k = v < 0 ? 0 : (int)v;
        r->given |= LILY_GIVEN_TOP_K;
    }
    const cJSON *seed = field(b, "seed");
    if (seed) {
        if (!cJSON_IsNumber(seed) || lily_json_seed(body, len, seed->valuedouble, &r->seed))
            return lily_api_bad(e, cJSON_IsNumber(seed) ? "invalid_value" : "invalid_type", "seed",
                                "'seed' must be an integer in [-2^63, 2^64)");
        r->has_seed = 1;
    }
    /* length: max_completion_tokens wins over max_tokens and n_predict; -1 means "no limit" */
    static const char *const lens[] = {"n_predict", "max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 3; i++) {
        rc = get_int(b, lens[i], -1, 1e9, &v, e);
        if (rc < 0) return -1;
        if (rc && v == 0)
            return lily_api_bad(e, "invalid_value", lens[i], "'%s' must be at least 1", lens[i]);
        if (rc) r->max_tokens = v < 0 ? 0 : (int)v;
    }
    return 0;
}

static int parse_stop(const cJSON *b, const lily_request_limits *lim, lily_request *r,
                      lily_api_error *e) {
    const cJSON *s = field(b, "stop");
    if (!s) return 0;
    int max = lim && lim->max_stop > 0 ? lim->max_stop : 16;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return 0;
        r->stop = lily_xcalloc(1, sizeof *r->stop);
        r->stop[r->n_stop++] = lily_xstrdup(s->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(s))
        return lily_api_bad(e, "invalid_type", "stop",
                            "'stop' must be a string or an array of "
                            "strings");
    int n = cJSON_GetArraySize(s);
    if (n > max)
        return lily_api_bad(e, "invalid_value", "stop", "at most %d stop strings are allowed", max);
    r->stop = lily_xcalloc((size_t)n + 1, sizeof *r->stop);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, s) {
        char path[32];
        snprintf(path, sizeof path, "stop[%d]", i++);
        if (!cJSON_IsString(x))
            return lily_api_bad(e, "invalid_type", path, "stop strings must be strings");
        if (x->valuestring[0]) r->stop[r->n_stop++] = lily_xstrdup(x->valuestring);
    }
    return 0;
}

static int parse_logprobs(const cJSON *b, lily_request *r, lily_api_error *e) {
    long long v = 0;
    if (r->kind == LILY_REQ_COMPLETION) { /* legacy: logprobs is an integer 0..5 */
        int rc = get_int(b, "logprobs", 0, 5, &v, e);
        if (rc < 0) return -1;
        if (rc) {
            r->logprobs = 1;
            r->top_logprobs = (int)v;
        }
        return 0;
    }
    if (get_bool(b, "logprobs", 0, &r->logprobs, e) < 0) return -1;
    int rc = get_int(b, "top_logprobs", 0, 20, &v, e);
    if (rc < 0) return -1;
    if (rc && v > 0 && !r->logprobs)
        return lily_api_bad(e, "invalid_value", "top_logprobs",
                            "'top_logprobs' requires 'logprobs' to be true");
    if (rc) r->top_logprobs = (int)v;
    return 0;
}

static int parse_bias(const cJSON *b, lily_request *r, lily_api_error *e) {
    const cJSON *lb = field(b, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb))
        return lily_api_bad(e, "invalid_type", "logit_bias", "'logit_bias' must be an object");
    int n = cJSON_GetArraySize(lb);
    r->bias = lily_xcalloc((size_t)n + 1, sizeof *r->bias);
    const cJSON *x;
    cJSON_ArrayForEach(x, lb) {
        char path[96];
        snprintf(path, sizeof path, "logit_bias.%.60s", x->string);
        char *end;
        long id = strtol(x->string, &end, 10);
        if (!x->string[0] || *end || id < 0 || id > INT32_MAX)
            return lily_api_bad(e, "invalid_value", path, "logit_bias keys must be token ids");
        if (!cJSON_IsNumber(x) || x->valuedouble < -100 || x->valuedouble > 100)
            return lily_api_bad(e, "invalid_value", path,
                                "logit_bias values must be numbers "
                                "between -100 and 100");
        r->bias[r->n_bias].id = (int32_t)id;
        r->bias[r->n_bias++].bias = (float)x->valuedouble;
    }
    return 0;
}

/* The thinking switch, in the priority order of api.md §2.1.8. */
static int parse_thinking(const cJSON *b, lily_request *r, lily_api_error *e) {
    const cJSON *kw = field(b, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw))
        return lily_api_bad(e, "invalid_type", "chat_template_kwargs",
                            "'chat_template_kwargs' must be an object");
    const cJSON *x;
    cJSON_ArrayForEach(x, kw) {
        if (!strcmp(x->string, "enable_thinking")) continue;
        cJSON_AddItemToObject(r->kwargs, x->string, cJSON_Duplicate(x, 1));
    }
    int on = 0;
    int rc = kw ? get_bool(kw, "enable_thinking", 1, &on, e) : 0;
    if (rc < 0) {
        snprintf(e->param, sizeof e->param, "chat_template_kwargs.enable_thinking");
        return -1;
    }
    static const char *const names[] = {"enable_thinking", "enableThinking", "think"};
    for (int i = 0; !rc && i < 3; i++) {
        rc = get_bool(b, names[i], 1, &on, e);
        if (rc < 0) return -1;
    }
    const cJSON *eff = field(b, "reasoning_effort");
    const char *effp = "reasoning_effort";
    const cJSON *reasoning = field(b, "reasoning");
    if (!eff && cJSON_IsObject(reasoning)) {
        eff = field(reasoning, "effort");
        effp = "reasoning.effort";
    }
    if (eff) {
        static const char *const levels[] = {"none", "minimal", "low", "medium",
                                             "high", "xhigh",   "max"};
        int lv = -1;
        for (int i = 0; cJSON_IsString(eff) && i < 7; i++)
            if (!strcmp(eff->valuestring, levels[i])) lv = i;
        if (lv < 0)
            return lily_api_bad(e, "invalid_value", effp,
                                "'%s' must be one of none, minimal, "
                                "low, medium, high, xhigh, max",
                                effp);
        if (!rc) {
            on = lv >= 2;
            rc = 1;
        }
    }
    r->thinking = rc ? on : -1;
    if (rc) cJSON_AddBoolToObject(r->kwargs, "enable_thinking", on);
    r->thinking_budget = -1;
    long long v = 0;
    static const char *const budgets[] = {"thinking_budget", "reasoning_budget_tokens"};
    for (int i = 0; i < 2; i++) {
        int brc = get_int(b, budgets[i], -1, 1e9, &v, e);
        if (brc < 0) return -1;
        if (brc) r->thinking_budget = (int)v;
    }
    const cJSON *fmt = field(b, "reasoning_format");
    if (fmt) {
        if (!cJSON_IsString(fmt))
            return lily_api_bad(e, "invalid_type", "reasoning_format",
                                "'reasoning_format' must be a string");
        if (!strcmp(fmt->valuestring, "none"))
            r->reasoning_raw = 1;
        else if (!strcmp(fmt->valuestring, "reasoning"))
            r->reasoning_name = 1;
        else if (strcmp(fmt->valuestring, "parsed") && strcmp(fmt->valuestring, "auto") &&
                 strcmp(fmt->valuestring, "deepseek") &&
                 strcmp(fmt->valuestring, "reasoning_content"))
            return lily_api_bad(e, "invalid_value", "reasoning_format",
                                "'reasoning_format' must be parsed, none or reasoning");
    }
    return 0;
}

static int parse_tool_choice(const cJSON *b, lily_request *r, lily_api_error *e) {
    r->parallel_tool_calls = 1;
    if (get_bool(b, "parallel_tool_calls", 0, &r->parallel_tool_calls, e) < 0) return -1;
    const cJSON *tc = field(b, "tool_choice");
    const char *path = "tool_choice";
    if (!tc) {
        tc = field(b, "function_call");
        path = "function_call";
    }
    if (!tc) return 0;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "none"))
            r->tool_choice = LILY_TOOLS_NONE;
        else if (!strcmp(tc->valuestring, "auto"))
            r->tool_choice = LILY_TOOLS_AUTO;
        else if (!strcmp(tc->valuestring, "required") || !strcmp(tc->valuestring, "any"))
            r->tool_choice = LILY_TOOLS_REQUIRED;
        else
            return lily_api_bad(e, "invalid_value", path,
                                "'%s' must be none, auto, required or "
                                "an object naming a function",
                                path);
        return 0;
    }
    if (!cJSON_IsObject(tc))
        return lily_api_bad(e, "invalid_type", path, "'%s' must be a string or an object", path);
    const cJSON *type = field(tc, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "allowed_tools")) {
        r->tool_choice = LILY_TOOLS_AUTO;
        return 0;
    }
    const cJSON *fn = field(tc, "function");
    const cJSON *name = field(fn ? fn : tc, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0] ||
        strlen(name->valuestring) >= sizeof r->tool_name)
        return lily_api_bad(e, "invalid_value", path, "'%s' object must name a function", path);
    r->tool_choice = LILY_TOOLS_NAMED;
    snprintf(r->tool_name, sizeof r->tool_name, "%s", name->valuestring);
    if (r->tools) {
        const cJSON *t;
        cJSON_ArrayForEach(t, r->tools) {
            const cJSON *n = field(field(t, "function"), "name");
            if (cJSON_IsString(n) && !strcmp(n->valuestring, r->tool_name)) return 0;
        }
    }
    return lily_api_bad(e, "invalid_value", path,
                        "tool_choice names function '%s', which is "
                        "not among 'tools'",
                        r->tool_name);
}

static int parse_prompt(const cJSON *b, lily_request *r, lily_api_error *e) {
    const cJSON *p = field(b, "prompt");
    if (!p) return lily_api_bad(e, "missing_required_parameter", "prompt", "'prompt' is required");
    if (cJSON_IsString(p)) {
        r->prompt = lily_xstrdup(p->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return lily_api_bad(e, "invalid_type", "prompt",
                            "'prompt' must be a string, an array "
                            "of one string, or an array of token ids");
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(first)) {
        if (cJSON_GetArraySize(p) > 1)
            return lily_api_bad(e, "unsupported_value", "prompt",
                                "only one prompt per request "
                                "is supported");
        r->prompt = lily_xstrdup(first->valuestring);
        return 0;
    }
    int n = cJSON_GetArraySize(p);
    r->prompt_ids = lily_xcalloc((size_t)n, sizeof *r->prompt_ids);
    const cJSON *x;
    cJSON_ArrayForEach(x, p) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > INT32_MAX)
            return lily_api_bad(e, "invalid_type", "prompt",
                                "'prompt' token ids must be "
                                "non-negative integers");
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)x->valuedouble;
    }
    return 0;
}

static int parse_rest(const cJSON *b, const lily_request_limits *lim, lily_request *r,
                      lily_api_error *e) {
    const cJSON *model = field(b, "model");
    if (model && !cJSON_IsString(model))
        return lily_api_bad(e, "invalid_type", "model", "'model' must be a string");
    if (model) snprintf(r->model, sizeof r->model, "%s", model->valuestring);
    if (get_bool(b, "stream", 0, &r->stream, e) < 0) return -1;
    const cJSON *so = field(b, "stream_options");
    if (so && !cJSON_IsObject(so))
        return lily_api_bad(e, "invalid_type", "stream_options",
                            "'stream_options' must be an "
                            "object");
    if (so && get_bool(so, "include_usage", 0, &r->include_usage, e) < 0) {
        snprintf(e->param, sizeof e->param, "stream_options.include_usage");
        return -1;
    }
    long long n;
    int rc = get_int(b, "n", 1, 128, &n, e);
    if (rc < 0) return -1;
    if (rc && n > 1) return lily_api_bad(e, "unsupported_value", "n", "n > 1 is not supported yet");
    /* other servers' ways to constrain the output: silently ignoring them would hand the
     * client unconstrained text it believes constrained (response_format is lily's way) */
    static const char *const foreign[] = {"grammar",
                                          "json_schema",
                                          "guided_json",
                                          "guided_regex",
                                          "guided_choice",
                                          "guided_grammar",
                                          "structured_outputs",
                                          "format",
                                          "regex",
                                          "ebnf",
                                          "json",
                                          NULL};
    for (int i = 0; foreign[i]; i++)
        if (field(b, foreign[i]))
            return lily_api_bad(e, "unsupported_parameter", foreign[i],
                                "'%s' is not supported: constrain the output with "
                                "'response_format' (json_object or json_schema) or with "
                                "'tool_choice'",
                                foreign[i]);
    const cJSON *rf = field(b, "response_format");
    if (rf) {
        if (lily_respfmt_parse(rf, &r->grammar, e)) return -1;
        if (r->grammar && !(lim && lim->constrained))
            return lily_api_bad(e, "unsupported_value", "response_format.type",
                                "constrained output ('%s') is not supported yet",
                                field(rf, "type")->valuestring);
    }
    const cJSON *mod = field(b, "modalities");
    const cJSON *x;
    if (!cJSON_IsArray(mod)) mod = NULL;
    cJSON_ArrayForEach(x, mod) {
        if (cJSON_IsString(x) && strcmp(x->valuestring, "text"))
            return lily_api_bad(e, "unsupported_value", "modalities",
                                "only text output is "
                                "supported");
    }
    if (r->kind == LILY_REQ_COMPLETION) {
        if (field(b, "suffix"))
            return lily_api_bad(e, "unsupported_value", "suffix",
                                "'suffix' (fill-in-the-middle) "
                                "is not supported");
        if (get_bool(b, "echo", 0, &r->echo, e) < 0) return -1;
        return parse_prompt(b, r, e);
    }
    return 0;
}

int lily_request_parse(lily_req_kind kind, const char *body, size_t len,
                       const lily_request_limits *lim, lily_request *r, lily_api_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->thinking = -1;
    r->thinking_budget = -1;
    r->parallel_tool_calls = 1;
    if (lim && lim->max_body && len > lim->max_body)
        return lily_api_fail(e, 413, "invalid_request_error", "request_too_large", NULL,
                             "request body of %zu bytes exceeds the limit of %zu bytes", len,
                             lim->max_body);
    size_t bad;
    if (!utf8_ok(body, len, &bad))
        return lily_api_bad(e, "invalid_json", NULL,
                            "request body is not valid UTF-8 (byte "
                            "offset %zu)",
                            bad);
    if (lily_json_has_nul(body, len))
        return lily_api_bad(e, "invalid_value", NULL,
                            "strings must not contain U+0000 (\\u0000): it would cut the text "
                            "short");
    const char *end = NULL;
    r->body = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!r->body) {
        size_t off = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return lily_api_bad(e, "invalid_json", NULL,
                            "request body is not valid JSON (error "
                            "near byte offset %zu)",
                            off);
    }
    size_t off = (size_t)(end - body);
    while (off < len &&
           (body[off] == ' ' || body[off] == '\n' || body[off] == '\r' || body[off] == '\t'))
        off++;
    if (off < len) {
        lily_request_free(r);
        return lily_api_bad(e, "invalid_json", NULL,
                            "unexpected data after the JSON value at "
                            "byte offset %zu",
                            off);
    }
    if (!cJSON_IsObject(r->body)) {
        lily_request_free(r);
        return lily_api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
    }
    const cJSON *b = r->body;
    int rc = parse_rest(b, lim, r, e);
    if (!rc) rc = parse_sampling(b, body, len, r, e);
    if (!rc) rc = parse_stop(b, lim, r, e);
    if (!rc) rc = parse_logprobs(b, r, e);
    if (!rc) rc = parse_bias(b, r, e);
    if (!rc && kind == LILY_REQ_CHAT) {
        r->kwargs = cJSON_CreateObject();
        r->messages =
            lily_reqmsg_messages(field(b, "messages"), lim ? lim->max_messages : 0, &r->prefill, e);
        rc = r->messages ? 0 : -1;
        if (!rc) rc = lily_reqmsg_tools(field(b, "tools"), field(b, "functions"), &r->tools, e);
        if (!rc) rc = parse_tool_choice(b, r, e);
        if (!rc) rc = parse_thinking(b, r, e);
    }
    if (rc) lily_request_free(r);
    return rc;
}

void lily_request_free(lily_request *r) {
    if (!r) return;
    cJSON_Delete(r->body);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->kwargs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->bias);
    lily_grammar_free(r->grammar);
    memset(r, 0, sizeof *r);
}
