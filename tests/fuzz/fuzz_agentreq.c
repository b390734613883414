/* libFuzzer target: arbitrary bytes as a /v1/messages and a /v1/responses body. Each conversion
 * must answer with a chat body or a 400 (never crash, leak or read out of bounds), and the chat
 * body it produces must be accepted by the chat parser or refused with a 4xx. The same bytes then
 * drive the output-block sequencer as a series of deltas, whose blocks must come out in order
 * with every call's fragments in its one block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/blkseq.h"
#include "server/responses.h"

static void convert(cJSON *(*f)(const cJSON *, lily_api_error *), const cJSON *b) {
    lily_api_error e;
    memset(&e, 0, sizeof e);
    cJSON *chat = f(b, &e);
    if (!chat) {
        if (e.status != 400 || !e.message[0]) abort();
        return;
    }
    char *text = cJSON_PrintUnformatted(chat);
    cJSON_Delete(chat);
    lily_request r;
    lily_request_limits lim = {.max_body = 1 << 20, .max_messages = 256};
    if (lily_request_parse(LILY_REQ_CHAT, text, strlen(text), &lim, &r, &e) == 0)
        lily_request_free(&r);
    else if (e.status < 400 || e.status > 499)
        abort();
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cJSON *b = cJSON_ParseWithLength((const char *)data, size);
    if (b) {
        convert(lily_anth_to_chat, b);
        convert(lily_resp_to_chat, b);
        cJSON_Delete(b);
    }
    /* bytes as deltas: the low 2 bits pick the kind, the rest is one byte of text */
    lily_blkseq q = {0};
    lily_sb o = {0};
    int calls = 0;
    for (size_t i = 0; i < size; i++) {
        lily_delta d;
        memset(&d, 0, sizeof d);
        d.kind = (lily_delta_kind)(data[i] & 3);
        if (d.kind == LILY_DELTA_CALL) calls++;
        d.call = calls - 1;
        snprintf(d.id, sizeof d.id, "call_%d", calls);
        char c = (char)('a' + (data[i] >> 2) % 26);
        lily_sb_append(&d.text, &c, 1);
        lily_blkseq_delta(&q, &d, NULL, &o);
        lily_sb_free(&d.text);
    }
    lily_blkseq_finish(&q, NULL, &o);
    if (lily_blkseq_n_calls(&q) != calls || q.n_held) abort();
    for (int i = 1; i < q.n; i++) /* adjacent text blocks differ in kind */
        if (q.b[i].kind != LILY_DELTA_CALL && q.b[i].kind == q.b[i - 1].kind) abort();
    lily_blkseq_free(&q);
    lily_sb_free(&o);
    return 0;
}
