/* libFuzzer target for the chat-template interpreter: the input is template source, compiled and
 * rendered against a fixed small chat context with tight limits (steps, output, memory, macro
 * depth), so every input finishes quickly; any crash, leak or sanitizer report is a finding. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat/template.h"

static const char ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S \\u00e9\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}, {\"type\": "
    "\"image\"}]},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"tool_calls\": "
    "[{\"type\":"
    " \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true], "
    "\"b\": {}}}}]},"
    " {\"role\": \"tool\", \"content\": null}, {\"role\": \"user\", \"content\": \"\\u4f60\\u597d "
    "\\ud83d\\ude00\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
    "{\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"n\": -3, \"x\": 1e300}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    lily_template *t = NULL;
    lily_err e;
    if (lily_template_compile((const char *)data, size, &t, &e)) return 0;
    lily_template_limits lim = {
        .max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 200000, .max_depth = 40};
    lily_template_set_limits(t, &lim);
    char *out = NULL;
    size_t len = 0;
    if (!lily_template_render_json(t, ctx, strlen(ctx), &out, &len, &e)) {
        /* the output is a NUL-terminated buffer of exactly len bytes */
        if (out[len] != 0) abort();
    }
    free(out);
    lily_template_free(t);
    return 0;
}
