/* response_format (api.md; OpenAI chat completions) into the grammar that constrains the output:
 *   {"type": "text"}                         no grammar
 *   {"type": "json_object"}                  any JSON object (src/grammar/json_gram.h)
 *   {"type": "json_schema", "json_schema": {"name": .., "schema": {..}, "strict": bool}}
 *                                            the schema compiled (src/grammar/json_schema.h)
 * A schema construct the compiler does not support is a 400 unsupported_value whose message
 * names it, with param response_format.json_schema.schema. */
#ifndef LILY_SERVER_RESPFMT_H
#define LILY_SERVER_RESPFMT_H

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "server/apierr.h"

/* rf is the response_format value (not NULL). On success *out is the grammar (NULL for text;
 * caller frees with lily_grammar_free). */
int lily_respfmt_parse(const cJSON *rf, lily_grammar **out, lily_api_error *e);

#endif
