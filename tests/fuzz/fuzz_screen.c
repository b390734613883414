/* libFuzzer target: arbitrary bytes as a request head seen by the front of `lily serve`
 * (lily_http_screen_frame, with the window open and full; an accepted request ends inside the
 * input), as an error message (lily_utf8_copy) and as
 * a JSON body (lily_json_has_nul, lily_json_seed). Each must answer within its contract: the
 * screen 0, 1, or -1 with an HTTP error status and a message; the copy valid UTF-8 that fits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/request.h"
#include "server/srv.h"

static int valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int k = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        if (!k || (*p >= 0x80 && *p < 0xC2) || *p > 0xF4) return 0;
        for (int j = 1; j < k; j++)
            if ((p[j] & 0xC0) != 0x80) return 0;
        p += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    for (int full = 0; full < 2; full++) {
        lily_api_error e;
        memset(&e, 0, sizeof e);
        int h11 = 0;
        lily_http_frame f = {0};
        int rc = lily_http_screen_frame(s, size, full, &h11, &f, &e);
        if (rc < -1 || rc > 1) abort();
        if (rc == 0 && (!f.head_len || f.head_len > size || (f.chunked && f.body_len))) abort();
        if (rc != lily_http_screen(s, size, full, &h11, &e)) abort();
        if (rc == -1 && (e.status < 400 || e.status > 505 || !e.message[0] || !e.type)) abort();
        if (full && rc == 1) abort(); /* a full window is decided */
    }
    char *z = malloc(size + 1);
    memcpy(z, data, size);
    z[size] = 0;
    char out[64];
    lily_utf8_copy(out, sizeof out, z);
    if (strlen(out) >= sizeof out || !valid_utf8(out)) abort();
    uint64_t seed;
    (void)lily_json_has_nul(s, size);
    (void)lily_json_seed(s, size, size ? (double)data[0] * 1e17 - 1e19 : 0, &seed);
    free(z);
    return 0;
}
