/* libFuzzer target: arbitrary bytes as a chat/completions and a completions request body. The
 * parser must answer every input with a request or a 4xx error (never crash, leak or read out of
 * bounds). The same bytes are then fed to the output parser as model output, in two pieces split
 * at a data-dependent point, with the request's tools when it had any, and the streamed result
 * must equal the one-piece result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/outparse.h"
#include "server/request.h"

static void assemble(const uint8_t *data, size_t size, size_t cut, const cJSON *tools, int thinking,
                     lily_outmsg *m) {
    lily_outparse_opts o = {.thinking = thinking, .tools = 1, .tool_defs = tools, .id_seed = 7};
    lily_outparse *p = lily_outparse_create(&o);
    size_t n;
    lily_outparse_feed(p, (const char *)data, cut);
    lily_outmsg_add(m, lily_outparse_deltas(p, &n), n);
    lily_outparse_clear(p);
    lily_outparse_feed(p, (const char *)data + cut, size - cut);
    lily_outparse_finish(p);
    lily_outmsg_add(m, lily_outparse_deltas(p, &n), n);
    lily_outparse_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lily_request_limits lim = {.max_body = 1 << 20, .max_messages = 256};
    lily_request r;
    lily_api_error e;
    const cJSON *tools = NULL;
    int have = 0;
    if (lily_request_parse(LILY_REQ_CHAT, (const char *)data, size, &lim, &r, &e) == 0) {
        if (!r.messages || cJSON_GetArraySize(r.messages) < 1) abort();
        tools = r.tools;
        have = 1;
    } else if (e.status != 400 && e.status != 413) {
        abort();
    }
    lily_request r2;
    if (lily_request_parse(LILY_REQ_COMPLETION, (const char *)data, size, &lim, &r2, &e) == 0)
        lily_request_free(&r2);
    else if (e.status != 400 && e.status != 413)
        abort();

    lily_outmsg a = {0}, b = {0};
    size_t cut = size ? data[0] % (size + 1) : 0;
    assemble(data, size, size, tools, size & 1, &a);
    assemble(data, size, cut, tools, size & 1, &b);
    int same = a.n_calls == b.n_calls && a.content.len == b.content.len &&
               a.reasoning.len == b.reasoning.len &&
               !memcmp(lily_sb_str(&a.content), lily_sb_str(&b.content), a.content.len) &&
               !memcmp(lily_sb_str(&a.reasoning), lily_sb_str(&b.reasoning), a.reasoning.len);
    for (int i = 0; same && i < a.n_calls; i++)
        same = !strcmp(lily_sb_str(&a.calls[i].args), lily_sb_str(&b.calls[i].args));
    if (!same) abort();
    lily_outmsg_free(&a);
    lily_outmsg_free(&b);
    if (have) lily_request_free(&r);
    return 0;
}
