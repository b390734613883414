/* The Anthropic Messages API: the request conversion (see anthropic.h). Apart from the job
 * and its writers (anthropic.c), so that it links without the engine (tests/fuzz). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

static const char *block_type(const cJSON *b) {
    const cJSON *t = field(b, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Appends text (separated by "\n" from what out holds) from a string or an array of text
 * blocks. */
static int text_of(const cJSON *c, const char *path, lily_sb *out, lily_api_error *e) {
    if (cJSON_IsString(c)) {
        if (out->len && c->valuestring[0]) lily_sb_putc(out, '\n');
        lily_sb_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return lily_api_bad(e, "invalid_type", path, "%s must be a string or an array of blocks",
                            path);
    int i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", path, i++);
        const char *t = block_type(b);
        const cJSON *text = field(b, "text");
        if (!t || strcmp(t, "text") || !cJSON_IsString(text)) {
            if (t && (!strcmp(t, "image") || !strcmp(t, "document")))
                return lily_api_bad(e, "unsupported_value", p,
                                    "content blocks of type '%s' are not supported (this server "
                                    "has no vision/document input)",
                                    t);
            return lily_api_bad(e, "invalid_value", p,
                                "expected a text block {type: \"text\", text}");
        }
        if (out->len && text->valuestring[0]) lily_sb_putc(out, '\n');
        lily_sb_puts(out, text->valuestring);
    }
    return 0;
}

/* One Messages turn into chat messages appended to msgs. */
static int convert_turn(const cJSON *m, int mi, cJSON *msgs, lily_api_error *e) {
    char path[96];
    snprintf(path, sizeof path, "messages[%d]", mi);
    if (!cJSON_IsObject(m))
        return lily_api_bad(e, "invalid_type", path, "each message must be an object");
    const cJSON *role = field(m, "role");
    snprintf(path, sizeof path, "messages[%d].role", mi);
    if (!cJSON_IsString(role) ||
        (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return lily_api_bad(e, "invalid_value", path, "role must be \"user\" or \"assistant\"");
    int user = !strcmp(role->valuestring, "user");
    const cJSON *c = field(m, "content");
    snprintf(path, sizeof path, "messages[%d].content", mi);
    if (!c)
        return lily_api_bad(e, "missing_required_parameter", path, "message is missing 'content'");
    if (cJSON_IsString(c)) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "role", role->valuestring);
        cJSON_AddStringToObject(x, "content", c->valuestring);
        cJSON_AddItemToArray(msgs, x);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return lily_api_bad(e, "invalid_type", path,
                            "content must be a string or an array of blocks");
    lily_sb text = {0}, thinking = {0};
    cJSON *calls = NULL;
    int bi = 0, rc = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char p[128];
        snprintf(p, sizeof p, "messages[%d].content[%d]", mi, bi++);
        const char *t = block_type(b);
        if (!cJSON_IsObject(b) || !t) {
            rc = lily_api_bad(e, "invalid_value", p, "content block needs a string 'type'");
            break;
        }
        if (!strcmp(t, "text")) {
            const cJSON *tx = field(b, "text");
            if (!cJSON_IsString(tx)) {
                rc = lily_api_bad(e, "invalid_type", p, "text block needs a string 'text'");
                break;
            }
            if (text.len && tx->valuestring[0]) lily_sb_putc(&text, '\n');
            lily_sb_puts(&text, tx->valuestring);
        } else if (user && !strcmp(t, "tool_result")) {
            const cJSON *id = field(b, "tool_use_id");
            if (!cJSON_IsString(id)) {
                rc =
                    lily_api_bad(e, "invalid_value", p, "tool_result needs a string 'tool_use_id'");
                break;
            }
            lily_sb out = {0};
            const cJSON *rc_ = field(b, "content");
            char cp[160];
            snprintf(cp, sizeof cp, "%s.content", p);
            if (rc_ && text_of(rc_, cp, &out, e)) {
                lily_sb_free(&out);
                rc = -1;
                break;
            }
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "role", "tool");
            cJSON_AddStringToObject(x, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(x, "content", lily_sb_str(&out));
            cJSON_AddItemToArray(msgs, x);
            lily_sb_free(&out);
        } else if (!user && !strcmp(t, "tool_use")) {
            const cJSON *id = field(b, "id"), *name = field(b, "name"), *input = field(b, "input");
            if (!cJSON_IsString(name) || !name->valuestring[0] ||
                (input && !cJSON_IsObject(input))) {
                rc = lily_api_bad(e, "invalid_value", p,
                                  "tool_use needs a string 'name' and an object 'input'");
                break;
            }
            if (!calls) calls = cJSON_CreateArray();
            cJSON *call = cJSON_CreateObject();
            if (cJSON_IsString(id)) cJSON_AddStringToObject(call, "id", id->valuestring);
            cJSON_AddStringToObject(call, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(call, "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddItemToObject(fn, "arguments",
                                  input ? cJSON_Duplicate(input, 1) : cJSON_CreateObject());
            cJSON_AddItemToArray(calls, call);
        } else if (!user && !strcmp(t, "thinking")) {
            const cJSON *th = field(b, "thinking");
            if (!cJSON_IsString(th)) {
                rc = lily_api_bad(e, "invalid_type", p, "thinking block needs a string 'thinking'");
                break;
            }
            if (thinking.len && th->valuestring[0]) lily_sb_putc(&thinking, '\n');
            lily_sb_puts(&thinking, th->valuestring);
        } else if (!user && !strcmp(t, "redacted_thinking")) {
            continue; /* opaque: nothing to render */
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            rc = lily_api_bad(e, "unsupported_value", p,
                              "content blocks of type '%s' are not supported (this server has "
                              "no vision/document input)",
                              t);
            break;
        } else {
            rc = lily_api_bad(e, "invalid_value", p,
                              "unexpected content block type '%s' in a%s turn", t,
                              user ? " user" : "n assistant");
            break;
        }
    }
    int has_results = 0;
    cJSON_ArrayForEach(b, c) {
        const char *t = block_type(b);
        has_results |= t && !strcmp(t, "tool_result");
    }
    /* a user turn of tool results only is those `tool` messages */
    if (!rc && (!user || text.len || !has_results)) {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "role", role->valuestring);
        cJSON_AddStringToObject(out, "content", lily_sb_str(&text));
        if (thinking.len) cJSON_AddStringToObject(out, "reasoning_content", lily_sb_str(&thinking));
        if (calls) {
            cJSON_AddItemToObject(out, "tool_calls", calls);
            calls = NULL;
        }
        cJSON_AddItemToArray(msgs, out);
    }
    cJSON_Delete(calls);
    lily_sb_free(&text);
    lily_sb_free(&thinking);
    return rc;
}

static int convert_tools(const cJSON *tools, cJSON *out, lily_api_error *e) {
    if (!cJSON_IsArray(tools))
        return lily_api_bad(e, "invalid_type", "tools", "'tools' must be an array");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i++);
        const char *type = block_type(t);
        if (!cJSON_IsObject(t))
            return lily_api_bad(e, "invalid_type", p, "each tool must be an object");
        if (type && strcmp(type, "custom"))
            return lily_api_bad(e, "unsupported_value", p,
                                "server tools ('%s') are not supported; only client tools with "
                                "an input_schema",
                                type);
        const cJSON *name = field(t, "name"), *desc = field(t, "description"),
                    *schema = field(t, "input_schema");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return lily_api_bad(e, "invalid_value", p, "tool needs a non-empty string 'name'");
        if (!cJSON_IsObject(schema))
            return lily_api_bad(e, "invalid_value", p, "tool needs an object 'input_schema'");
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(x, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        cJSON_AddItemToArray(out, x);
    }
    return 0;
}

static int convert_tool_choice(const cJSON *tc, cJSON *out, lily_api_error *e) {
    const char *type = block_type(tc);
    if (!cJSON_IsObject(tc) || !type)
        return lily_api_bad(e, "invalid_value", "tool_choice",
                            "'tool_choice' must be an object {type: auto|any|tool|none}");
    if (!strcmp(type, "auto") || !strcmp(type, "none")) {
        cJSON_AddStringToObject(out, "tool_choice", type);
    } else if (!strcmp(type, "any")) {
        cJSON_AddStringToObject(out, "tool_choice", "required");
    } else if (!strcmp(type, "tool")) {
        const cJSON *name = field(tc, "name");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return lily_api_bad(e, "invalid_value", "tool_choice.name",
                                "tool_choice {type: \"tool\"} needs a 'name'");
        cJSON *x = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "function"), "name", name->valuestring);
    } else {
        return lily_api_bad(e, "invalid_value", "tool_choice.type",
                            "tool_choice.type must be auto, any, tool or none, got '%s'", type);
    }
    const cJSON *dp = field(tc, "disable_parallel_tool_use");
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls");
    return 0;
}

static int copy_num(const cJSON *b, const char *from, cJSON *out, const char *to,
                    lily_api_error *e) {
    const cJSON *x = field(b, from);
    if (!x) return 0;
    if (!cJSON_IsNumber(x))
        return lily_api_bad(e, "invalid_type", from, "'%s' must be a number", from);
    cJSON_AddNumberToObject(out, to, x->valuedouble);
    return 0;
}

cJSON *lily_anth_to_chat(const cJSON *b, lily_api_error *e) {
    if (!cJSON_IsObject(b)) {
        lily_api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON *msgs = cJSON_CreateArray();
    cJSON_AddItemToObject(out, "messages", msgs);
    int rc = 0;
    const cJSON *model = field(b, "model");
    if (cJSON_IsString(model))
        cJSON_AddStringToObject(out, "model", model->valuestring);
    else if (model)
        rc = lily_api_bad(e, "invalid_type", "model", "'model' must be a string");
    const cJSON *sys = field(b, "system");
    if (!rc && sys) {
        lily_sb t = {0};
        rc = text_of(sys, "system", &t, e);
        if (!rc) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "role", "system");
            cJSON_AddStringToObject(x, "content", lily_sb_str(&t));
            cJSON_AddItemToArray(msgs, x);
        }
        lily_sb_free(&t);
    }
    const cJSON *m = field(b, "messages");
    if (!rc && !cJSON_IsArray(m))
        rc = lily_api_bad(e, m ? "invalid_type" : "missing_required_parameter", "messages",
                          "'messages' must be an array of messages");
    if (!rc && !cJSON_GetArraySize(m))
        rc = lily_api_bad(e, "invalid_value", "messages", "'messages' must not be empty");
    int mi = 0;
    const cJSON *x;
    if (!rc) {
        cJSON_ArrayForEach(x, m) {
            if ((rc = convert_turn(x, mi++, msgs, e))) break;
        }
    }
    const cJSON *mt = field(b, "max_tokens");
    if (!rc && !mt)
        rc = lily_api_bad(e, "missing_required_parameter", "max_tokens", "Field required");
    if (!rc && (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > 1e9 ||
                mt->valuedouble != (double)(long long)mt->valuedouble))
        rc = lily_api_bad(e, "invalid_value", "max_tokens",
                          "'max_tokens' must be an integer of at least 1");
    if (!rc) cJSON_AddNumberToObject(out, "max_tokens", mt->valuedouble);
    if (!rc) rc = copy_num(b, "temperature", out, "temperature", e);
    if (!rc) rc = copy_num(b, "top_p", out, "top_p", e);
    if (!rc) rc = copy_num(b, "top_k", out, "top_k", e);
    const cJSON *ss = field(b, "stop_sequences");
    if (!rc && ss) {
        if (!cJSON_IsArray(ss))
            rc = lily_api_bad(e, "invalid_type", "stop_sequences",
                              "'stop_sequences' must be an array of strings");
        else
            cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(ss, 1));
    }
    const cJSON *st = field(b, "stream");
    if (!rc && st) {
        if (!cJSON_IsBool(st))
            rc = lily_api_bad(e, "invalid_type", "stream", "'stream' must be a boolean");
        else
            cJSON_AddBoolToObject(out, "stream", cJSON_IsTrue(st));
    }
    const cJSON *tools = field(b, "tools");
    if (!rc && tools) {
        cJSON *arr = cJSON_AddArrayToObject(out, "tools");
        rc = convert_tools(tools, arr, e);
    }
    const cJSON *tc = field(b, "tool_choice");
    if (!rc && tc) rc = convert_tool_choice(tc, out, e);
    const cJSON *th = field(b, "thinking");
    if (!rc && th) {
        const char *t = block_type(th);
        if (!cJSON_IsObject(th) || !t ||
            (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive"))) {
            rc = lily_api_bad(e, "invalid_value", "thinking",
                              "'thinking' must be {type: \"enabled\", budget_tokens} or "
                              "{type: \"disabled\"}");
        } else {
            int on = strcmp(t, "disabled") != 0;
            cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"),
                                  "enable_thinking", on);
            const cJSON *bt = field(th, "budget_tokens");
            if (on && bt && !cJSON_IsNumber(bt))
                rc = lily_api_bad(e, "invalid_type", "thinking.budget_tokens",
                                  "'budget_tokens' must be an integer");
            else if (on && bt)
                cJSON_AddNumberToObject(out, "thinking_budget", bt->valuedouble);
        }
    }
    const cJSON *md = field(b, "metadata");
    if (!rc && md && !cJSON_IsObject(md))
        rc = lily_api_bad(e, "invalid_type", "metadata", "'metadata' must be an object");
    if (rc) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void lily_anth_error_json(const lily_api_error *e, lily_sb *out) {
    lily_sb_printf(
        out, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(e->status));
    if (e->param[0]) {
        lily_sb m = {0};
        lily_sb_printf(&m, "%s: %s", e->param, e->message);
        lily_sb_json_str(out, lily_sb_str(&m), m.len);
        lily_sb_free(&m);
    } else {
        lily_sb_json_str(out, e->message, strlen(e->message));
    }
    lily_sb_puts(out, "}}");
}
