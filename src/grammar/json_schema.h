/* JSON Schema to grammar: the subset OpenAI structured outputs accept.
 *
 * Supported: type (object, array, string, number, integer, boolean, null, or a list of them),
 * properties (emitted in the schema's order; those in `required` always, the others optionally),
 * required, additionalProperties (false, true or absent: only the listed properties are
 * generated; with no properties and not false: any object), items, minItems / maxItems (up to
 * 1024), enum and const (any JSON values, generated in their compact form), anyOf, allOf with one
 * member, $ref to "#" or a JSON pointer into the document ($defs, definitions; recursion
 * allowed), string formats date, time, date-time, uuid, minLength / maxLength (up to 4096),
 * boolean schemas (true: any value); minimum, maximum, exclusiveMinimum, exclusiveMaximum on
 * integers (16 digits at most, as any integer here); up to 1024 properties per object, nesting
 * up to 128. Annotations (title, description, default, examples, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly) are ignored, and so is `format` on a number.
 * Everything else (pattern, bounds on a number, multipleOf, oneOf, not, if/then/else,
 * patternProperties, uniqueItems, prefixItems, other formats, remote $ref, ...) is an error
 * naming the keyword. */
#ifndef LILY_GRAMMAR_JSON_SCHEMA_H
#define LILY_GRAMMAR_JSON_SCHEMA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "grammar/grammar.h"
#include "grammar/json_gram.h"
#include "lily.h"

/* From a parsed schema (borrowed; not kept). Free *out with lily_grammar_free. */
int lily_grammar_from_schema(const cJSON *schema, lily_grammar **out, lily_err *e);

/* Compiles schema into the builder of j as one rule of a larger grammar (the tool-call grammar
 * embeds each tool's parameters this way): returns the rule id, or -1 with e naming the
 * construct. After a failure the builder may hold unfinished rules: discard it (check a schema
 * first with lily_grammar_from_schema to keep a builder usable). */
int32_t lily_schema_rule(lily_jgram *j, const cJSON *schema, lily_err *e);

/* As lily_schema_rule for schema inside the document root (its $refs resolve there). With
 * raw_stop, a string at the top (not inside an object or array) is its bare text, without
 * quotes or escapes and never containing raw_stop (lily_dfa_raw_text): a parameter's value in
 * the XML tool-call form; enum and const strings likewise; anything else is JSON. */
int32_t lily_schema_rule_at(lily_jgram *j, const cJSON *root, const cJSON *schema,
                            const char *raw_stop, lily_err *e);

/* From schema text json[0..len). */
int lily_grammar_from_schema_text(const char *json, size_t len, lily_grammar **out, lily_err *e);

#endif
