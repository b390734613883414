/* response_format parsing: the json_object grammar, or the request's JSON Schema compiled. */
#include "server/respfmt.h"

#include <string.h>

#include "grammar/json_gram.h"
#include "grammar/json_schema.h"

static const cJSON *member(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNull(v) ? NULL : v;
}

int lily_respfmt_parse(const cJSON *rf, lily_grammar **out, lily_api_error *e) {
    *out = NULL;
    const cJSON *t = member(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return lily_api_bad(e, "invalid_type", "response_format",
                            "'response_format' must be an object with a string 'type'");
    lily_err err;
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_object")) {
        if (lily_grammar_json_object(out, &err))
            return lily_api_fail(e, 500, "server_error", NULL, "response_format", "%s", err.msg);
        return 0;
    }
    if (strcmp(t->valuestring, "json_schema"))
        return lily_api_bad(e, "invalid_value", "response_format.type",
                            "unknown response_format type '%s'", t->valuestring);
    const cJSON *js = member(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return lily_api_bad(e, "invalid_type", "response_format.json_schema",
                            "'response_format.json_schema' must be an object with a 'schema'");
    const cJSON *name = member(js, "name"), *strict = member(js, "strict");
    if (name && !cJSON_IsString(name))
        return lily_api_bad(e, "invalid_type", "response_format.json_schema.name",
                            "'response_format.json_schema.name' must be a string");
    if (strict && !cJSON_IsBool(strict))
        return lily_api_bad(e, "invalid_type", "response_format.json_schema.strict",
                            "'response_format.json_schema.strict' must be a boolean");
    const cJSON *schema = member(js, "schema");
    if (!schema) /* OpenAI: a missing schema means any JSON */
        return lily_grammar_json_object(out, &err)
                   ? lily_api_fail(e, 500, "server_error", NULL, "response_format", "%s", err.msg)
                   : 0;
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return lily_api_bad(e, "invalid_type", "response_format.json_schema.schema",
                            "'response_format.json_schema.schema' must be an object");
    if (lily_grammar_from_schema(schema, out, &err))
        return lily_api_bad(e, "unsupported_value", "response_format.json_schema.schema", "%s",
                            err.msg);
    return 0;
}
