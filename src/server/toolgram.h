/* The grammar of an enforced tool call (tool_choice "required" or a named function), in a form
 * the output parser reads (src/gen/outparse.h). The JSON form:
 *     <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 * with <tool_call> and </tool_call> placed as tokens, NAME one of the request's tools (or the
 * named one) and ARGS that tool's `parameters` schema compiled (src/grammar/json_schema.h).
 * The XML form, which the Qwen3.5/3.6 chat template teaches the model (xml, when the template
 * has "<function="):
 *     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 * the parameters in the schema's order (the required ones always, the others optionally), each
 * VALUE by the kind the parser gives it (gen/toolschema.h): a string's bare text (never holding
 * "</parameter>"), anything else as JSON (numbers, booleans, objects, arrays), as the template
 * writes arguments. A tool whose parameters the XML form cannot carry (no properties and
 * additionalProperties not false: any names; names holding '<', '>' or a newline; a top-level
 * $ref / anyOf / allOf; a schema the compiler does not take) is called in the JSON form.
 * With parallel calls the block may repeat, separated by "\n"; else exactly one.
 * A tool with `strict: true` whose schema the compiler cannot handle is a 400 naming the tool
 * and the construct; without strict such a tool's arguments fall back to any JSON object. */
#ifndef LILY_SERVER_TOOLGRAM_H
#define LILY_SERVER_TOOLGRAM_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "server/apierr.h"

/* tools: the request's normalised tools array; only: the function to call, or NULL for any;
 * open / close: the ids of <tool_call> and </tool_call>. *out: free with lily_grammar_free. */
int lily_toolgram_build(const cJSON *tools, const char *only, int parallel, int xml, int32_t open,
                        int32_t close, lily_grammar **out, lily_api_error *e);

#endif
