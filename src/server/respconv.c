/* The OpenAI Responses API: the request conversion (see responses.h). Apart from the job and
 * its writer (responses.c), so that it links without the engine (tests/fuzz). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/responses.h"

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(j) ? NULL : j;
}

static const char *type_of(const cJSON *b) {
    const cJSON *t = field(b, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Text of a string or of an array of text parts (input_text, output_text, text, and the
 * reasoning item's summary_text / reasoning_text), joined without separator. */
static int parts_text(const cJSON *c, const char *path, lily_sb *out, lily_api_error *e) {
    if (cJSON_IsString(c)) {
        lily_sb_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return lily_api_bad(e, "invalid_type", path, "%s must be a string or an array of parts",
                            path);
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        char pp[128];
        snprintf(pp, sizeof pp, "%s[%d]", path, i++);
        const char *t = type_of(p);
        const cJSON *text = field(p, "text");
        if (t &&
            (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio")))
            return lily_api_bad(e, "unsupported_value", pp,
                                "content parts of type '%s' are not supported (this server has "
                                "no vision/audio/file input)",
                                t);
        if (!t ||
            (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") &&
             strcmp(t, "summary_text") && strcmp(t, "reasoning_text")) ||
            !cJSON_IsString(text))
            return lily_api_bad(e, "invalid_value", pp,
                                "expected a text part {type: \"input_text\", text}");
        lily_sb_puts(out, text->valuestring);
    }
    return 0;
}

/* The last chat message when it is an assistant turn that may take tool calls, else a new one
 * (with the pending reasoning). */
static cJSON *assistant_for_calls(cJSON *msgs, lily_sb *reasoning) {
    int n = cJSON_GetArraySize(msgs);
    cJSON *last = n ? cJSON_GetArrayItem(msgs, n - 1) : NULL;
    const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    if (last && cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && !reasoning->len)
        return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", "");
    if (reasoning->len) cJSON_AddStringToObject(m, "reasoning_content", lily_sb_str(reasoning));
    lily_sb_clear(reasoning);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

static int convert_item(const cJSON *it, int i, cJSON *msgs, lily_sb *reasoning,
                        lily_api_error *e) {
    char path[64];
    snprintf(path, sizeof path, "input[%d]", i);
    if (!cJSON_IsObject(it))
        return lily_api_bad(e, "invalid_type", path, "each input item must be an object");
    const char *t = type_of(it);
    const cJSON *role = field(it, "role");
    if ((!t && role) || (t && !strcmp(t, "message"))) {
        if (!cJSON_IsString(role) ||
            (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant") &&
             strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer")))
            return lily_api_bad(e, "invalid_value", path,
                                "message role must be user, assistant, system or developer");
        char cp[96];
        snprintf(cp, sizeof cp, "input[%d].content", i);
        const cJSON *c = field(it, "content");
        if (!c) return lily_api_bad(e, "missing_required_parameter", cp, "message needs 'content'");
        lily_sb text = {0};
        if (parts_text(c, cp, &text, e)) {
            lily_sb_free(&text);
            return -1;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role->valuestring);
        cJSON_AddStringToObject(m, "content", lily_sb_str(&text));
        if (!strcmp(role->valuestring, "assistant") && reasoning->len) {
            cJSON_AddStringToObject(m, "reasoning_content", lily_sb_str(reasoning));
            lily_sb_clear(reasoning);
        }
        cJSON_AddItemToArray(msgs, m);
        lily_sb_free(&text);
        return 0;
    }
    if (!t) return lily_api_bad(e, "invalid_value", path, "input item needs a 'type' or a 'role'");
    if (!strcmp(t, "function_call")) {
        const cJSON *name = field(it, "name"), *args = field(it, "arguments"),
                    *cid = field(it, "call_id");
        if (!cJSON_IsString(name) || !name->valuestring[0] || !cJSON_IsString(cid) ||
            (args && !cJSON_IsString(args)))
            return lily_api_bad(e, "invalid_value", path,
                                "function_call needs string 'call_id', 'name' and 'arguments'");
        cJSON *m = assistant_for_calls(msgs, reasoning);
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *call = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", cid->valuestring);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        cJSON_AddStringToObject(fn, "arguments", args ? args->valuestring : "{}");
        cJSON_AddItemToArray(calls, call);
        return 0;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *cid = field(it, "call_id"), *out = field(it, "output");
        if (!cJSON_IsString(cid) || !out)
            return lily_api_bad(e, "invalid_value", path,
                                "function_call_output needs a string 'call_id' and an 'output'");
        char op[96];
        snprintf(op, sizeof op, "input[%d].output", i);
        lily_sb text = {0};
        if (parts_text(out, op, &text, e)) {
            lily_sb_free(&text);
            return -1;
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", cid->valuestring);
        cJSON_AddStringToObject(m, "content", lily_sb_str(&text));
        cJSON_AddItemToArray(msgs, m);
        lily_sb_free(&text);
        return 0;
    }
    if (!strcmp(t, "reasoning")) {
        /* the full reasoning text when sent back, else its summary */
        const cJSON *c = field(it, "content");
        if (!cJSON_IsArray(c) || !cJSON_GetArraySize(c)) c = field(it, "summary");
        char rp[96];
        snprintf(rp, sizeof rp, "input[%d].content", i);
        return c ? parts_text(c, rp, reasoning, e) : 0;
    }
    if (!strcmp(t, "item_reference"))
        return lily_api_bad(e, "unsupported_value", path,
                            "item_reference needs stored responses, which this server does not "
                            "keep: send the items themselves");
    return lily_api_bad(e, "unsupported_value", path, "input items of type '%s' are not supported",
                        t);
}

static int convert_tools(const cJSON *tools, cJSON *out, lily_api_error *e) {
    if (!cJSON_IsArray(tools))
        return lily_api_bad(e, "invalid_type", "tools", "'tools' must be an array");
    cJSON *arr = cJSON_AddArrayToObject(out, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i++);
        const char *type = type_of(t);
        if (!type || strcmp(type, "function"))
            return lily_api_bad(e, "unsupported_value", p,
                                "only function tools are supported, got '%s'",
                                type ? type : "(none)");
        const cJSON *name = field(t, "name"), *params = field(t, "parameters"),
                    *desc = field(t, "description");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return lily_api_bad(e, "invalid_value", p, "function tool needs a non-empty 'name'");
        if (params && !cJSON_IsObject(params))
            return lily_api_bad(e, "invalid_type", p, "'parameters' must be a JSON Schema object");
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(x, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        if (params) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(params, 1));
        const cJSON *strict = field(t, "strict");
        if (cJSON_IsBool(strict)) cJSON_AddBoolToObject(fn, "strict", cJSON_IsTrue(strict));
        cJSON_AddItemToArray(arr, x);
    }
    return 0;
}

static int convert_tool_choice(const cJSON *tc, cJSON *out, lily_api_error *e) {
    if (cJSON_IsString(tc)) {
        cJSON_AddStringToObject(out, "tool_choice", tc->valuestring); /* checked by the chat path */
        return 0;
    }
    const char *t = type_of(tc);
    if (t && !strcmp(t, "function")) {
        const cJSON *name = field(tc, "name");
        if (!cJSON_IsString(name))
            return lily_api_bad(e, "invalid_value", "tool_choice.name",
                                "tool_choice {type: \"function\"} needs a 'name'");
        cJSON *x = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "function"), "name", name->valuestring);
        return 0;
    }
    if (t && !strcmp(t, "allowed_tools")) {
        cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(tc, 1));
        return 0;
    }
    return lily_api_bad(e, "unsupported_value", "tool_choice",
                        "tool_choice must be none, auto, required or {type: \"function\", name}");
}

/* text.format -> response_format */
static int convert_format(const cJSON *text, cJSON *out, lily_api_error *e) {
    if (!cJSON_IsObject(text))
        return lily_api_bad(e, "invalid_type", "text", "'text' must be an object");
    const cJSON *f = field(text, "format");
    if (!f) return 0;
    const char *t = type_of(f);
    if (!t) return lily_api_bad(e, "invalid_value", "text.format", "'text.format' needs a 'type'");
    cJSON *rf = cJSON_AddObjectToObject(out, "response_format");
    cJSON_AddStringToObject(rf, "type", t);
    if (!strcmp(t, "json_schema")) {
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        static const char *const keys[] = {"name", "schema", "strict", "description"};
        for (int i = 0; i < 4; i++) {
            const cJSON *v = field(f, keys[i]);
            if (v) cJSON_AddItemToObject(js, keys[i], cJSON_Duplicate(v, 1));
        }
    }
    return 0;
}

cJSON *lily_resp_to_chat(const cJSON *b, lily_api_error *e) {
    if (!cJSON_IsObject(b)) {
        lily_api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    lily_sb reasoning = {0};
    int rc = 0;
    static const char *const unsupported[] = {"previous_response_id", "conversation", "prompt"};
    for (int i = 0; i < 3 && !rc; i++)
        if (field(b, unsupported[i]))
            rc = lily_api_bad(e, "unsupported_value", unsupported[i],
                              "'%s' is not supported: this server keeps no responses or "
                              "conversations; send the whole input",
                              unsupported[i]);
    if (!rc && cJSON_IsTrue(field(b, "background")))
        rc = lily_api_bad(e, "unsupported_value", "background",
                          "background responses are not supported");
    const cJSON *model = field(b, "model");
    if (!rc && model && !cJSON_IsString(model))
        rc = lily_api_bad(e, "invalid_type", "model", "'model' must be a string");
    if (!rc && model) cJSON_AddStringToObject(out, "model", model->valuestring);
    const cJSON *ins = field(b, "instructions");
    if (!rc && ins) {
        if (!cJSON_IsString(ins)) {
            rc = lily_api_bad(e, "invalid_type", "instructions", "'instructions' must be a string");
        } else {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", ins->valuestring);
            cJSON_AddItemToArray(msgs, m);
        }
    }
    const cJSON *in = field(b, "input");
    if (!rc && !in)
        rc = lily_api_bad(e, "missing_required_parameter", "input", "'input' is required");
    if (!rc && cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        cJSON_AddItemToArray(msgs, m);
    } else if (!rc && cJSON_IsArray(in)) {
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, in) {
            if ((rc = convert_item(it, i++, msgs, &reasoning, e))) break;
        }
    } else if (!rc) {
        rc = lily_api_bad(e, "invalid_type", "input",
                          "'input' must be a string or an array of items");
    }
    const cJSON *mt = field(b, "max_output_tokens");
    if (!rc && mt) cJSON_AddItemToObject(out, "max_tokens", cJSON_Duplicate(mt, 1));
    static const char *const same[] = {"temperature", "top_p", "stream", "parallel_tool_calls",
                                       "seed"};
    for (int i = 0; i < 5 && !rc; i++) {
        const cJSON *v = field(b, same[i]);
        if (v) cJSON_AddItemToObject(out, same[i], cJSON_Duplicate(v, 1));
    }
    const cJSON *tools = field(b, "tools");
    if (!rc && tools) rc = convert_tools(tools, out, e);
    const cJSON *tc = field(b, "tool_choice");
    if (!rc && tc) rc = convert_tool_choice(tc, out, e);
    const cJSON *r = field(b, "reasoning");
    if (!rc && r && !cJSON_IsObject(r))
        rc = lily_api_bad(e, "invalid_type", "reasoning", "'reasoning' must be an object");
    const cJSON *eff = r ? field(r, "effort") : NULL;
    if (!rc && eff) cJSON_AddItemToObject(out, "reasoning_effort", cJSON_Duplicate(eff, 1));
    const cJSON *text = field(b, "text");
    if (!rc && text) rc = convert_format(text, out, e);
    lily_sb_free(&reasoning);
    if (rc) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}
