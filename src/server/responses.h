/* The OpenAI Responses API on `lily serve`: POST /v1/responses (create; stateless).
 *
 * A request is converted into the body of a chat request and goes through the chat path (the
 * same template, session and prefix cache):
 *   instructions                          the system message
 *   input: string                         one user message
 *   input: items                          message items (role user / assistant / system /
 *                                         developer; content a string or input_text /
 *                                         output_text parts), function_call items (the tool
 *                                         calls of the assistant turn before them),
 *                                         function_call_output items (`tool` messages), reasoning
 *                                         items (the next assistant turn's reasoning_content)
 *   tools [{type: function, name, description, parameters}], tool_choice, parallel_tool_calls
 *   max_output_tokens, temperature, top_p, stream
 *   reasoning {effort}                    the thinking switch (none / minimal: off, else on)
 *   text {format}                         response_format (text / json_object / json_schema)
 *   store, metadata, user, truncation     accepted; nothing is stored (store: false)
 *   previous_response_id, background      400 unsupported_value (no stored responses)
 * The answer is a `response` object whose output holds reasoning, message (output_text) and
 * function_call items, with status completed or incomplete (max_output_tokens), and usage with
 * input_tokens_details.cached_tokens; streamed as the typed events response.created ...
 * response.completed, each with its sequence_number. */
#ifndef LILY_SERVER_RESPONSES_H
#define LILY_SERVER_RESPONSES_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/srv.h"

/* The chat body for a Responses body (borrowed). NULL with e (a 400) on a bad request. */
cJSON *lily_resp_to_chat(const cJSON *body, lily_api_error *e);

/* Parses and converts a /v1/responses body into j (lily_job_new'd; the preparation thread), to be
 * answered in the Responses shapes. -1 with e on failure. */
int lily_resp_fill(lily_srv *s, lily_job *j, const char *body, size_t len, lily_api_error *e);

#endif
