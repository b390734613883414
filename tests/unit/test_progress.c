/* Load progress: lily_engine_open calls opts.progress with bytes done that never decrease and
 * end at done == total == the weight files' bytes; the terminal bar (base/progress.h) draws a
 * bar line, then one final line, and nothing after it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/progress.h"
#include "lily.h"
#include "model/mkmodel.h"

#include "../check.h"

typedef struct {
    int calls, monotonic;
    uint64_t last, total;
} rec;

static void on_progress(void *ud, uint64_t done, uint64_t total) {
    rec *r = ud;
    if (done < r->last || done > total) r->monotonic = 0;
    r->calls++;
    r->last = done;
    r->total = total;
}

static void bar_lines(void) {
    FILE *f = tmpfile();
    lily_bar b = {.label = "x.bin", .out = f};
    lily_bar_update(&b, 0, 2500000);
    lily_bar_update(&b, 2500000, 2500000);
    lily_bar_update(&b, 2500000, 2500000); /* after the final line: nothing */
    char buf[512] = {0};
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(strstr(buf, "x.bin [") && strstr(buf, "0 B / 2.50 MB"), "bar line: %s", buf);
    CHECK(strstr(buf, "x.bin: 2.50 MB in ") != NULL, "final line: %s", buf);
    CHECK(n > 0 && buf[n - 1] == '\n' && strchr(buf, '\n') == buf + n - 1, "one newline: %s", buf);
    char s[32];
    lily_bar_bytes(s, sizeof s, 999);
    CHECK(!strcmp(s, "999 B"), "%s", s);
    lily_bar_bytes(s, sizeof s, 19500000000ull);
    CHECK(!strcmp(s, "19.5 GB"), "%s", s);
}

int main(void) {
    bar_lines();
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/lily_test_progress_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    lily_mk_opts o;
    lily_mk_result res;
    lily_err e = {{0}};
    lily_mk_preset("tiny", &o, NULL);
    o.n_threads = 2;
    CHECK(lily_mk_write(dir, &o, &res, &e) == 0, "mkmodel: %s", e.msg);
    rec r = {.monotonic = 1};
    lily_engine_opts eo = {.n_threads = 2, .progress = on_progress, .progress_ud = &r};
    lily_engine *eng = NULL;
    CHECK(lily_engine_open(dir, &eo, &eng, &e) == 0, "open: %s", e.msg);
    if (eng) {
        const lily_model_info *in = lily_engine_info(eng);
        CHECK(r.calls >= 1 && r.monotonic, "%d calls, monotonic %d", r.calls, r.monotonic);
        CHECK(r.total == in->file_bytes && r.last == r.total && r.total > 0,
              "last %llu total %llu file bytes %llu", (unsigned long long)r.last,
              (unsigned long long)r.total, (unsigned long long)in->file_bytes);
        CHECK(in->n_threads == 2 && in->device && in->device[0], "threads %d device %s",
              in->n_threads, in->device ? in->device : "(null)");
        CHECK(lily_engine_session_bytes(eng, 2048) > lily_engine_session_bytes(eng, 1024),
              "session bytes grow with the context");
    }
    lily_engine_close(eng);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) n_fail++;
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
