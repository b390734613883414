/* The enforced tool-call grammar (see toolgram.h). */
#include "server/toolgram.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gen/sb.h"
#include "grammar/dfa.h"
#include "grammar/json_gram.h"
#include "grammar/json_schema.h"

static const cJSON *member(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNull(v) ? NULL : v;
}

/* The rule of one tool's arguments: its schema when it compiles, else (not strict) any object. */
static int32_t args_rule(lily_jgram *j, const cJSON *fn, int idx, lily_api_error *e) {
    const cJSON *params = member(fn, "parameters");
    const int strict = cJSON_IsTrue(member(fn, "strict"));
    if (!params) return lily_jgram_object(j);
    lily_grammar *probe = NULL;
    lily_err err;
    if (lily_grammar_from_schema(params, &probe, &err)) {
        if (!strict) return lily_jgram_object(j);
        char path[64];
        snprintf(path, sizeof path, "tools[%d].function.parameters", idx);
        lily_api_bad(e, "unsupported_value", path, "tool '%s' (strict): %s",
                     member(fn, "name")->valuestring, err.msg);
        return -1;
    }
    lily_grammar_free(probe);
    int32_t r = lily_schema_rule(j, params, &err);
    if (r < 0) lily_api_fail(e, 500, "server_error", NULL, "tools", "%s", err.msg);
    return r;
}

int lily_toolgram_build(const cJSON *tools, const char *only, int parallel, int32_t open,
                        int32_t close, lily_grammar **out, lily_api_error *e) {
    *out = NULL;
    if (open < 0 || close < 0)
        return lily_api_bad(e, "unsupported_value", "tool_choice",
                            "this model's tokenizer has no <tool_call> / </tool_call> tokens: "
                            "tool calls cannot be enforced");
    lily_gbuild *b = lily_gbuild_new();
    lily_jgram j;
    lily_jgram_init(&j, b);
    const int32_t call = lily_gbuild_rule(b);
    const char tail[] = "}\n";
    const int32_t t_tail = lily_dfa_literal(b, tail, strlen(tail));
    int idx = -1, n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        idx++;
        const cJSON *fn = member(t, "function");
        const cJSON *name = member(fn, "name");
        if (!cJSON_IsString(name) || (only && strcmp(name->valuestring, only))) continue;
        const int32_t args = args_rule(&j, fn, idx, e);
        if (args < 0) {
            lily_gbuild_free(b);
            return -1;
        }
        lily_sb head = {0};
        lily_sb_puts(&head, "\n{\"name\": ");
        lily_sb_json_str(&head, name->valuestring, strlen(name->valuestring));
        lily_sb_puts(&head, ", \"arguments\": ");
        const lily_gelem seq[] = {lily_gtoken(open),
                                  lily_gterm(lily_dfa_literal(b, head.data, head.len)),
                                  lily_gref(args), lily_gterm(t_tail), lily_gtoken(close)};
        lily_sb_free(&head);
        lily_gbuild_alt(b, call, seq, sizeof seq / sizeof seq[0]);
        n++;
    }
    if (!n) {
        lily_gbuild_free(b);
        return lily_api_bad(e, "invalid_value", "tool_choice",
                            only ? "tool_choice names function '%s', which is not among 'tools'"
                                 : "tool_choice '%s' needs at least one function in 'tools'",
                            only ? only : "required");
    }
    int32_t root = call;
    if (parallel) { /* calls := call | call "\n" calls */
        root = lily_gbuild_rule(b);
        const int32_t nl = lily_dfa_literal(b, "\n", 1);
        const lily_gelem one[] = {lily_gref(call)};
        const lily_gelem more[] = {lily_gref(call), lily_gterm(nl), lily_gref(root)};
        lily_gbuild_alt(b, root, one, 1);
        lily_gbuild_alt(b, root, more, 3);
    }
    lily_err err;
    if (lily_gbuild_finish(b, root, out, &err))
        return lily_api_bad(e, "unsupported_value", "tools", "tool-call grammar: %s", err.msg);
    return 0;
}
