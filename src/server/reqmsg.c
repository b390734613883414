/* Chat messages and tools normalisation (see reqmsg.h). */
#include "server/reqmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/sb.h"

/* Null equals absent. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

/* Joins list-of-parts content; text and refusal parts in order, no separator. */
static int join_parts(const cJSON *parts, int mi, lily_sb *out, lily_api_error *e) {
    char path[96];
    int pi = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, parts) {
        snprintf(path, sizeof path, "messages[%d].content[%d]", mi, pi);
        if (cJSON_IsString(part)) { /* a bare string part: lenient */
            lily_sb_puts(out, part->valuestring);
            pi++;
            continue;
        }
        if (!cJSON_IsObject(part))
            return lily_api_bad(e, "invalid_type", path, "content part must be an object");
        const cJSON *type = field(part, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
        const char *key = NULL;
        if (!t || !strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text"))
            key = "text";
        else if (!strcmp(t, "refusal"))
            key = "refusal";
        if (!key) {
            if (!strcmp(t, "image_url") || !strcmp(t, "input_audio") || !strcmp(t, "file") ||
                !strcmp(t, "image") || !strcmp(t, "input_image") || !strcmp(t, "video"))
                return lily_api_bad(e, "unsupported_value", path,
                                    "content parts of type '%s' are not supported (this server "
                                    "has no vision/audio input)",
                                    t);
            return lily_api_bad(e, "invalid_value", path, "unknown content part type '%s'", t);
        }
        const cJSON *text = field(part, key);
        if (!cJSON_IsString(text))
            return lily_api_bad(e, "invalid_type", path, "content part needs a string '%s'", key);
        lily_sb_puts(out, text->valuestring);
        pi++;
    }
    return 0;
}

/* The content of message mi as a string; *absent set when missing or null. */
static int content_text(const cJSON *m, int mi, lily_sb *out, int *absent, lily_api_error *e) {
    char path[64];
    snprintf(path, sizeof path, "messages[%d].content", mi);
    const cJSON *c = field(m, "content");
    *absent = !c;
    if (!c) return 0;
    if (cJSON_IsString(c)) {
        lily_sb_puts(out, c->valuestring);
        return 0;
    }
    if (cJSON_IsArray(c)) return join_parts(c, mi, out, e);
    return lily_api_bad(e, "invalid_type", path, "content must be a string or an array of parts");
}

/* One assistant tool call, normalised to {id, type, function:{name, arguments: object}}. */
static cJSON *tool_call(const cJSON *tc, int mi, int ti, lily_api_error *e) {
    char path[96];
    snprintf(path, sizeof path, "messages[%d].tool_calls[%d]", mi, ti);
    if (!cJSON_IsObject(tc)) {
        lily_api_bad(e, "invalid_type", path, "tool call must be an object");
        return NULL;
    }
    const cJSON *fn = field(tc, "function");
    if (!fn) fn = tc; /* some bridges flatten {name, arguments} */
    const cJSON *name = field(fn, "name");
    if (!cJSON_IsString(name)) {
        snprintf(path + strlen(path), sizeof path - strlen(path), ".function.name");
        lily_api_bad(e, "invalid_type", path, "tool call needs a string function name");
        return NULL;
    }
    const cJSON *args = field(fn, "arguments");
    cJSON *argv = NULL;
    if (cJSON_IsString(args)) {
        argv = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(argv)) {
            /* a truncated earlier call: keep the raw string (the template renders it as is) */
            cJSON_Delete(argv);
            argv = cJSON_CreateString(args->valuestring);
            fprintf(stderr,
                    "lily serve: %s.function.arguments is not a JSON object; kept as "
                    "text\n",
                    path);
        }
    } else if (cJSON_IsObject(args)) {
        argv = cJSON_Duplicate(args, 1);
    } else if (!args) {
        argv = cJSON_CreateObject();
    } else {
        snprintf(path + strlen(path), sizeof path - strlen(path), ".function.arguments");
        lily_api_bad(e, "invalid_type", path, "arguments must be a JSON string or an object");
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    const cJSON *id = field(tc, "id");
    if (cJSON_IsString(id)) cJSON_AddStringToObject(out, "id", id->valuestring);
    cJSON_AddStringToObject(out, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(out, "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    cJSON_AddItemToObject(f, "arguments", argv);
    return out;
}

/* Normalises message mi into a new object (role, content, and per role extras). */
static cJSON *message(const cJSON *m, int mi, lily_api_error *e) {
    char path[64];
    snprintf(path, sizeof path, "messages[%d]", mi);
    if (!cJSON_IsObject(m)) {
        lily_api_bad(e, "invalid_type", path, "each message must be an object");
        return NULL;
    }
    snprintf(path, sizeof path, "messages[%d].role", mi);
    const cJSON *role = field(m, "role");
    if (!role) {
        lily_api_bad(e, "missing_required_parameter", path, "message is missing 'role'");
        return NULL;
    }
    if (!cJSON_IsString(role)) {
        lily_api_bad(e, "invalid_type", path, "'role' must be a string");
        return NULL;
    }
    const char *r = role->valuestring;
    if (!strcmp(r, "developer")) r = "system";
    if (!strcmp(r, "function")) r = "tool";
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
        lily_api_bad(e, "invalid_value", path,
                     "unknown role '%s' (expected system, developer, user, assistant or tool)",
                     role->valuestring);
        return NULL;
    }
    lily_sb text = {0};
    int absent = 0;
    if (content_text(m, mi, &text, &absent, e)) {
        lily_sb_free(&text);
        return NULL;
    }
    int assistant = !strcmp(r, "assistant");
    if (absent && !assistant && !cJSON_GetObjectItemCaseSensitive(m, "content")) {
        snprintf(path, sizeof path, "messages[%d].content", mi);
        lily_api_bad(e, "missing_required_parameter", path, "%s message is missing 'content'", r);
        lily_sb_free(&text);
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "role", r);
    cJSON_AddStringToObject(out, "content", lily_sb_str(&text));
    lily_sb_free(&text);
    if (assistant) {
        static const char *const names[] = {"reasoning_content", "reasoning", "thinking"};
        for (int k = 0; k < 3; k++) {
            const cJSON *rc = field(m, names[k]);
            if (cJSON_IsString(rc)) {
                cJSON_AddStringToObject(out, "reasoning_content", rc->valuestring);
                break;
            }
        }
        const cJSON *tcs = field(m, "tool_calls");
        const cJSON *fc = field(m, "function_call"); /* legacy single call */
        if (tcs && !cJSON_IsArray(tcs)) {
            snprintf(path, sizeof path, "messages[%d].tool_calls", mi);
            lily_api_bad(e, "invalid_type", path, "tool_calls must be an array");
            cJSON_Delete(out);
            return NULL;
        }
        if ((tcs && cJSON_GetArraySize(tcs) > 0) || fc) {
            cJSON *arr = cJSON_AddArrayToObject(out, "tool_calls");
            int ti = 0;
            const cJSON *tc;
            if (tcs) {
                cJSON_ArrayForEach(tc, tcs) {
                    cJSON *c = tool_call(tc, mi, ti++, e);
                    if (!c) {
                        cJSON_Delete(out);
                        return NULL;
                    }
                    cJSON_AddItemToArray(arr, c);
                }
            } else {
                cJSON *wrap = cJSON_CreateObject();
                cJSON_AddItemToObject(wrap, "function", cJSON_Duplicate(fc, 1));
                cJSON *c = tool_call(wrap, mi, 0, e);
                cJSON_Delete(wrap);
                if (!c) {
                    cJSON_Delete(out);
                    return NULL;
                }
                cJSON_AddItemToArray(arr, c);
            }
        }
    }
    if (!strcmp(r, "tool")) {
        const cJSON *id = field(m, "tool_call_id");
        if (cJSON_IsString(id)) cJSON_AddStringToObject(out, "tool_call_id", id->valuestring);
        const cJSON *name = field(m, "name");
        if (cJSON_IsString(name)) cJSON_AddStringToObject(out, "name", name->valuestring);
    }
    return out;
}

cJSON *lily_reqmsg_messages(const cJSON *msgs, int max_messages, int *prefill, lily_api_error *e) {
    if (!msgs) {
        lily_api_bad(e, "missing_required_parameter", "messages", "'messages' is required");
        return NULL;
    }
    if (!cJSON_IsArray(msgs)) {
        lily_api_bad(e, "invalid_type", "messages", "'messages' must be an array");
        return NULL;
    }
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) {
        lily_api_bad(e, "invalid_value", "messages",
                     "'messages' must contain at least one "
                     "message");
        return NULL;
    }
    if (max_messages > 0 && n > max_messages) {
        lily_api_bad(e, "invalid_value", "messages", "too many messages: %d (limit %d)", n,
                     max_messages);
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    cJSON *system = NULL; /* the merged system message, kept at the front */
    lily_sb sys = {0};
    int mi = 0, users = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        cJSON *x = message(m, mi, e);
        if (!x) {
            cJSON_Delete(out);
            cJSON_Delete(system);
            lily_sb_free(&sys);
            return NULL;
        }
        const char *role = cJSON_GetObjectItemCaseSensitive(x, "role")->valuestring;
        if (!strcmp(role, "system")) {
            /* The Qwen template accepts one system message, at position 0: merge the rest in. */
            const char *c = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
            if (system && c[0]) lily_sb_puts(&sys, sys.len ? "\n\n" : "");
            if (c[0] || !system) lily_sb_puts(&sys, c);
            if (!system)
                system = x;
            else
                cJSON_Delete(x);
        } else {
            users += !strcmp(role, "user");
            cJSON_AddItemToArray(out, x);
        }
        mi++;
    }
    if (system) {
        cJSON_ReplaceItemInObjectCaseSensitive(system, "content",
                                               cJSON_CreateString(lily_sb_str(&sys)));
        cJSON_InsertItemInArray(out, 0, system);
    }
    lily_sb_free(&sys);
    if (!users) {
        lily_api_bad(e, "invalid_value", "messages", "no user message found in 'messages'");
        cJSON_Delete(out);
        return NULL;
    }
    int total = cJSON_GetArraySize(out);
    const cJSON *last = cJSON_GetArrayItem(out, total - 1);
    const cJSON *prev = total > 1 ? cJSON_GetArrayItem(out, total - 2) : NULL;
    int last_asst =
        !strcmp(cJSON_GetObjectItemCaseSensitive(last, "role")->valuestring, "assistant");
    if (last_asst && prev &&
        !strcmp(cJSON_GetObjectItemCaseSensitive(prev, "role")->valuestring, "assistant")) {
        char path[64];
        snprintf(path, sizeof path, "messages[%d]", mi - 1);
        lily_api_bad(e, "invalid_value", path,
                     "two assistant messages at the end of the conversation");
        cJSON_Delete(out);
        return NULL;
    }
    *prefill = last_asst;
    return out;
}

int lily_reqmsg_tools(const cJSON *tools, const cJSON *functions, cJSON **out, lily_api_error *e) {
    *out = NULL;
    const cJSON *src = tools ? tools : functions;
    const char *base = tools ? "tools" : "functions";
    if (!src) return 0;
    if (!cJSON_IsArray(src))
        return lily_api_bad(e, "invalid_type", base, "'%s' must be an array", base);
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, src) {
        char path[96];
        snprintf(path, sizeof path, "%s[%d]", base, i++);
        if (!cJSON_IsObject(t)) {
            cJSON_Delete(arr);
            return lily_api_bad(e, "invalid_type", path, "each tool must be an object");
        }
        const cJSON *fn = t;
        if (tools) {
            const cJSON *type = field(t, "type");
            if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
                continue; /* custom and other tool kinds: ignored, not rejected */
            fn = field(t, "function");
            if (!cJSON_IsObject(fn)) {
                cJSON_Delete(arr);
                snprintf(path + strlen(path), sizeof path - strlen(path), ".function");
                return lily_api_bad(e, "invalid_type", path, "tool needs a 'function' object");
            }
        }
        const cJSON *name = field(fn, "name");
        if (!cJSON_IsString(name) || !name->valuestring[0]) {
            cJSON_Delete(arr);
            snprintf(path + strlen(path), sizeof path - strlen(path), "%s.name",
                     tools ? ".function" : "");
            return lily_api_bad(e, "invalid_value", path, "tool needs a non-empty string name");
        }
        const cJSON *params = field(fn, "parameters");
        if (params && !cJSON_IsObject(params)) {
            cJSON_Delete(arr);
            snprintf(path + strlen(path), sizeof path - strlen(path), "%s.parameters",
                     tools ? ".function" : "");
            return lily_api_bad(e, "invalid_type", path,
                                "parameters must be a JSON Schema "
                                "object");
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddItemToObject(x, "function", cJSON_Duplicate(fn, 1));
        cJSON_AddItemToArray(arr, x);
    }
    if (cJSON_GetArraySize(arr) == 0) {
        cJSON_Delete(arr);
        return 0;
    }
    *out = arr;
    return 0;
}
