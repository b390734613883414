/* The enforced tool-call grammar (see toolgram.h). */
#include "server/toolgram.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "gen/sb.h"
#include "gen/toolschema.h"
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

/* ---- the XML form ---------------------------------------------------------------------------- */

#define XML_STOP "</parameter>" /* what a bare string value never contains */

/* A name the XML form can carry between "=" and ">" (the parser reads up to the '>'). */
static int xml_name_ok(const char *s) {
    return *s && !strpbrk(s, "<>\n\r");
}

/* The tool can be called in the XML form: its parameters are an object schema the compiler
 * takes (lily_grammar_from_schema) with properties whose names fit, or with none and
 * additionalProperties false. Otherwise the JSON form (which also makes the 400 of a strict
 * tool, or any object for a non-strict one whose schema does not compile). */
static int xml_fits(const cJSON *fn) {
    const cJSON *params = member(fn, "parameters");
    if (!xml_name_ok(member(fn, "name")->valuestring) || !cJSON_IsObject(params)) return 0;
    if (member(params, "$ref") || member(params, "anyOf") || member(params, "allOf")) return 0;
    lily_grammar *probe = NULL;
    lily_err err;
    if (lily_grammar_from_schema(params, &probe, &err)) return 0;
    lily_grammar_free(probe);
    const cJSON *props = member(params, "properties"), *p;
    if (!cJSON_IsObject(props) || !props->child)
        return cJSON_IsFalse(member(params, "additionalProperties"));
    cJSON_ArrayForEach(p, props) if (!xml_name_ok(p->string)) return 0;
    return 1;
}

/* "<parameter=NAME>\n" VALUE "\n</parameter>\n", VALUE by the kind the output parser gives the
 * parameter (gen/toolschema.h): bare text for a string, else JSON. */
static int32_t xml_param(lily_jgram *j, const cJSON *params, const cJSON *prop, int32_t t_close,
                         lily_err *err) {
    lily_gbuild *b = j->b;
    lily_sb h = {0};
    lily_sb_printf(&h, "<parameter=%s>\n", prop->string);
    const int32_t head = lily_dfa_literal(b, h.data, h.len);
    lily_sb_free(&h);
    const int raw = lily_param_kind_of(params, prop->string) == LILY_PARAM_STRING;
    const int32_t v = lily_schema_rule_at(j, params, prop, raw ? XML_STOP : NULL, err);
    if (v < 0) return -1;
    const int32_t r = lily_gbuild_rule(b);
    const lily_gelem seq[] = {lily_gterm(head), lily_gref(v), lily_gterm(t_close)};
    lily_gbuild_alt(b, r, seq, 3);
    return r;
}

/* The parameters of one call: the schema's properties in its order, the required ones always,
 * the others optionally (none when it has none). -1 with err when a property's schema does not
 * compile (xml_fits has checked that it does). */
static int32_t xml_params(lily_jgram *j, const cJSON *params, lily_err *err) {
    lily_gbuild *b = j->b;
    const int32_t t_close = lily_dfa_literal(b, "\n" XML_STOP "\n", strlen(XML_STOP) + 2);
    const cJSON *props = member(params, "properties"), *req = member(params, "required");
    int32_t next = lily_gbuild_rule(b); /* what follows the last property: nothing */
    lily_gbuild_alt(b, next, NULL, 0);
    const int n = props ? cJSON_GetArraySize(props) : 0;
    if (!n) return next;
    const cJSON **pr = lily_xmalloc((size_t)n * sizeof *pr);
    int i = 0;
    for (const cJSON *p = props->child; p && i < n; p = p->next)
        pr[i++] = p;
    for (i = n - 1; i >= 0; i--) { /* from the last property back */
        const int32_t kv = xml_param(j, params, pr[i], t_close, err);
        if (kv < 0) {
            free(pr);
            return -1;
        }
        int opt = 1;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            opt &= !(cJSON_IsString(r) && !strcmp(r->valuestring, pr[i]->string));
        const int32_t x = lily_gbuild_rule(b);
        const lily_gelem with[] = {lily_gref(kv), lily_gref(next)}, without[] = {lily_gref(next)};
        lily_gbuild_alt(b, x, with, 2);
        if (opt) lily_gbuild_alt(b, x, without, 1);
        next = x;
    }
    free(pr);
    return next;
}

/* One tool's call in the XML form:
 * <tool_call>\n<function=NAME>\n PARAMS </function>\n</tool_call> */
static int xml_call(lily_jgram *j, const cJSON *fn, int32_t call, int32_t open, int32_t close,
                    lily_api_error *e) {
    lily_gbuild *b = j->b;
    lily_err err;
    const int32_t ps = xml_params(j, member(fn, "parameters"), &err);
    if (ps < 0) return lily_api_fail(e, 500, "server_error", NULL, "tools", "%s", err.msg);
    lily_sb head = {0};
    lily_sb_printf(&head, "\n<function=%s>\n", member(fn, "name")->valuestring);
    const char tail[] = "</function>\n";
    const lily_gelem seq[] = {
        lily_gtoken(open), lily_gterm(lily_dfa_literal(b, head.data, head.len)), lily_gref(ps),
        lily_gterm(lily_dfa_literal(b, tail, strlen(tail))), lily_gtoken(close)};
    lily_sb_free(&head);
    lily_gbuild_alt(b, call, seq, sizeof seq / sizeof seq[0]);
    return 0;
}

/* ---- the grammar ------------------------------------------------------------------------------ */

int lily_toolgram_build(const cJSON *tools, const char *only, int parallel, int xml, int32_t open,
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
        if (xml && xml_fits(fn)) {
            if (xml_call(&j, fn, call, open, close, e)) {
                lily_gbuild_free(b);
                return -1;
            }
            n++;
            continue;
        }
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
