/* Tool parameter types from the request's JSON Schemas, and conversion of a raw parameter value
 * (the text between <parameter=P> and </parameter>) into a JSON value (api.md §2.5.4). */
#ifndef LILY_GEN_TOOLSCHEMA_H
#define LILY_GEN_TOOLSCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "gen/sb.h"

typedef enum lily_param_kind {
    LILY_PARAM_ANY,    /* no schema: JSON if it parses, else a string */
    LILY_PARAM_STRING, /* verbatim string, even if it looks like JSON */
    LILY_PARAM_INTEGER,
    LILY_PARAM_NUMBER,
    LILY_PARAM_BOOLEAN,
    LILY_PARAM_OBJECT, /* object or array: JSON, else Python literal, else string */
    LILY_PARAM_NULL,
} lily_param_kind;

/* The schema's parameters object of function fn in the tools array (borrowed), or NULL. */
const cJSON *lily_tool_params(const cJSON *tools, const char *fn);

/* The kind of parameter param in the parameters schema (resolving local $ref, the first
 * non-null branch of anyOf/oneOf, and type lists). */
lily_param_kind lily_param_kind_of(const cJSON *params, const char *param);

/* Appends the JSON form of raw[0..n) for a parameter of the given kind (never fails: a value
 * that does not convert is kept as a string). */
void lily_param_convert(lily_param_kind kind, const char *raw, size_t n, lily_sb *out);

#endif
