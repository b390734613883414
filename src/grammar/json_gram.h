/* The pieces of JSON shared by the json_object grammar and the JSON Schema compiler: the
 * terminals (bounded whitespace around punctuation, strings, numbers, literals) made once per
 * grammar, and the rules for any JSON value. */
#ifndef LILY_GRAMMAR_JSON_GRAM_H
#define LILY_GRAMMAR_JSON_GRAM_H

#include "grammar/grammar.h"
#include "lily.h"

/* Whitespace bytes allowed in a row between two JSON tokens: enough for indented output, not
 * enough for a model to spin on spaces forever. */
#define LILY_JSON_WS_MAX 20

typedef struct lily_jgram {
    lily_gbuild *b;
    /* terminals (DFA start states), made on first use; 0 = not yet */
    int32_t t_obj_open, t_obj_close, t_obj_empty; /* "{" ws | ws "}" | "}" */
    int32_t t_arr_open, t_arr_close, t_arr_empty; /* "[" ws | ws "]" | "]" */
    int32_t t_comma, t_colon;                     /* ws "," ws | ws ":" ws */
    int32_t t_string, t_bool, t_null;
    /* rules, made on first use; -1 = not yet */
    int32_t r_value, r_object, r_array, r_number, r_integer;
} lily_jgram;

void lily_jgram_init(lily_jgram *j, lily_gbuild *b);

int32_t lily_jgram_obj_open(lily_jgram *j);
int32_t lily_jgram_obj_close(lily_jgram *j);
int32_t lily_jgram_obj_empty(lily_jgram *j);
int32_t lily_jgram_arr_open(lily_jgram *j);
int32_t lily_jgram_arr_close(lily_jgram *j);
int32_t lily_jgram_arr_empty(lily_jgram *j);
int32_t lily_jgram_comma(lily_jgram *j);
int32_t lily_jgram_colon(lily_jgram *j);
int32_t lily_jgram_string(lily_jgram *j); /* any JSON string */
int32_t lily_jgram_bool(lily_jgram *j);
int32_t lily_jgram_null(lily_jgram *j);

/* Rules: any JSON value, any object, any array, a number, an integer (at most 16 digits before
 * the point, 16 after, 2 in the exponent: every number stays a finite double, as clients parse
 * them). */
int32_t lily_jgram_value(lily_jgram *j);
int32_t lily_jgram_object(lily_jgram *j);
int32_t lily_jgram_array(lily_jgram *j);
int32_t lily_jgram_number(lily_jgram *j);
int32_t lily_jgram_integer(lily_jgram *j);

/* A grammar for any JSON object (response_format json_object). Free with lily_grammar_free. */
int lily_grammar_json_object(lily_grammar **out, lily_err *e);

#endif
