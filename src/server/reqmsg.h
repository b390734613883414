/* Normalisation of the chat `messages` and `tools` of a request for the chat template (the
 * message rules of api.md §2.1.2 and the tool rules of §2.1.3). Internal to request.c. */
#ifndef LILY_SERVER_REQMSG_H
#define LILY_SERVER_REQMSG_H

#include <cjson/cJSON.h>

#include "server/apierr.h"

/* Builds the normalised messages array from the request's `messages` (borrowed). Sets *prefill
 * when the last message is an assistant turn. max_messages 0 = no limit. Returns NULL with e
 * filled on a client error. */
cJSON *lily_reqmsg_messages(const cJSON *msgs, int max_messages, int *prefill, lily_api_error *e);

/* Builds the function-tools array from `tools` (or the legacy `functions`), skipping entries
 * whose type is not "function". Sets *out to NULL when there are none. Returns 0 or -1. */
int lily_reqmsg_tools(const cJSON *tools, const cJSON *functions, cJSON **out, lily_api_error *e);

#endif
