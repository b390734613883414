/* The Anthropic Messages API on `lily serve`: POST /v1/messages and /v1/messages/count_tokens.
 *
 * A Messages request is converted into the body of an OpenAI chat request and goes through the
 * chat path (lily_request_parse, the same template, the same session and prefix cache, so a
 * follow-up turn reuses the earlier one):
 *   system (string or text blocks)            the system message
 *   messages[].content string / blocks        text blocks joined by "\n"; a user turn's
 *                                             tool_result blocks become `tool` messages (before
 *                                             its text); an assistant turn's thinking blocks
 *                                             its reasoning_content, tool_use blocks its
 *                                             tool_calls
 *   tools[] {name, description, input_schema} function tools
 *   tool_choice auto / any / tool / none      auto / required / named / none
 *     (+ disable_parallel_tool_use)           parallel_tool_calls false
 *   max_tokens (required), temperature, top_p, top_k, stop_sequences, stream
 *   thinking {type: enabled, budget_tokens}   enable_thinking on + thinking_budget
 *   thinking {type: disabled}                 enable_thinking off (absent: the server default)
 *   metadata                                  accepted, unused
 * The answer is a `message` with thinking / text / tool_use content blocks, stop_reason
 * end_turn | max_tokens | stop_sequence | tool_use, and usage {input_tokens (not from the cache),
 * cache_read_input_tokens, output_tokens}; streamed as Anthropic's named SSE events. Errors use
 * Anthropic's shape {type: "error", error: {type, message}}. */
#ifndef LILY_SERVER_ANTHROPIC_H
#define LILY_SERVER_ANTHROPIC_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/srv.h"

/* The OpenAI chat body for a Messages body (borrowed). NULL with e (a 400) on a bad request. */
cJSON *lily_anth_to_chat(const cJSON *body, lily_api_error *e);

/* Parses and converts a /v1/messages body into j (lily_job_new'd; the preparation thread), to be
 * answered in the Messages shapes. -1 with e on failure. */
int lily_anth_fill(lily_srv *s, lily_job *j, const char *body, size_t len, lily_api_error *e);

/* /v1/messages/count_tokens: {"input_tokens": N} into out. 0, or -1 with e. */
int lily_anth_count_tokens(lily_srv *s, const char *body, size_t len, lily_sb *out,
                           lily_api_error *e);

/* Anthropic's error body for e: {"type":"error","error":{"type":..,"message":..}}. */
void lily_anth_error_json(const lily_api_error *e, lily_sb *out);

#endif
