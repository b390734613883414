/* Chat-template interpreter tests:
 *  1. features: tests/fixtures/template/unit/features.json, one small template per feature with
 *     a hand-written expected output or error (cross-checked against jinja2 by make_features.py);
 *  2. own templates: tests/fixtures/template/own/<name>.jinja rendered with <name>.json against
 *     the hand-derived <name>.txt (or the error text in <name>.err);
 *  3. loading from a model directory (chat_template.jinja vs tokenizer_config.json, named
 *     templates, special tokens) and the cJSON entry point;
 *  4. randomized properties: string slicing against a code-point reference, tojson round trips;
 *  5. the `lily template` command (when LILY_BIN is set). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "chat/template.h"

static int passed, failed;

static void check(int ok, const char *name, const char *fmt, const char *a, const char *b) {
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s: ", name);
    printf(fmt, a, b);
    printf("\n");
}

/* Renders src with JSON context text; returns 0 and *out, or -1 and the message in e. */
static int render(const char *src, const char *ctx, const lily_template_limits *lim, char **out,
                  size_t *len, lily_err *e) {
    lily_template *t;
    if (lily_template_compile(src, strlen(src), &t, e)) return -1;
    if (lim) lily_template_set_limits(t, lim);
    int rc = lily_template_render_json(t, ctx, strlen(ctx), out, len, e);
    lily_template_free(t);
    return rc;
}

static void test_features(void) {
    char *text;
    size_t n;
    lily_err e;
    if (lily_read_file("tests/fixtures/template/unit/features.json", 1 << 24, &text, &n, &e)) {
        printf("FAIL features: %s\n", e.msg);
        failed++;
        return;
    }
    cJSON *all = cJSON_Parse(text);
    free(text);
    int count = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, all) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *tpl = cJSON_GetObjectItem(c, "template")->valuestring;
        const char *ctx = cJSON_GetObjectItem(c, "context")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "want"), *err = cJSON_GetObjectItem(c, "error");
        const cJSON *lj = cJSON_GetObjectItem(c, "limits");
        lily_template_limits lim = {0};
        if (lj) {
            const cJSON *v;
            if ((v = cJSON_GetObjectItem(lj, "max_steps")))
                lim.max_steps = (uint64_t)v->valuedouble;
            if ((v = cJSON_GetObjectItem(lj, "max_output")))
                lim.max_output = (size_t)v->valuedouble;
            if ((v = cJSON_GetObjectItem(lj, "max_memory")))
                lim.max_memory = (size_t)v->valuedouble;
        }
        char *out = NULL;
        size_t len = 0;
        memset(&e, 0, sizeof e);
        int rc = render(tpl, ctx, lj ? &lim : NULL, &out, &len, &e);
        if (want) {
            check(rc == 0 && len == strlen(want->valuestring) &&
                      !memcmp(out, want->valuestring, len),
                  name, "got [%s], want [%s]", rc ? e.msg : out, want->valuestring);
        } else {
            /* Errors must carry the expected text and a line number. */
            check(rc != 0 && strstr(e.msg, err->valuestring) && strstr(e.msg, "line "), name,
                  "got [%s], want an error containing [%s]", rc ? e.msg : out, err->valuestring);
        }
        free(out);
        count++;
    }
    cJSON_Delete(all);
    printf("features: %d cases\n", count);
}

static void test_own(void) {
    const char *dir = "tests/fixtures/template/own";
    DIR *d = opendir(dir);
    if (!d) {
        printf("FAIL own: cannot open %s\n", dir);
        failed++;
        return;
    }
    struct dirent *de;
    int count = 0;
    while ((de = readdir(d))) {
        size_t nl = strlen(de->d_name);
        if (nl < 7 || strcmp(de->d_name + nl - 6, ".jinja")) continue;
        char base[512], path[600];
        snprintf(base, sizeof base, "%s/%.*s", dir, (int)(nl - 6), de->d_name);
        char *tpl = NULL, *ctx = NULL, *want = NULL, *out = NULL;
        size_t tn, cn, wn, on = 0;
        lily_err e = {{0}};
        snprintf(path, sizeof path, "%s.jinja", base);
        int ok = !lily_read_file(path, 1 << 20, &tpl, &tn, &e);
        snprintf(path, sizeof path, "%s.json", base);
        ok = ok && !lily_read_file(path, 1 << 20, &ctx, &cn, &e);
        if (!ok) {
            check(0, base, "%s%s", e.msg, "");
            continue;
        }
        lily_template *t = NULL;
        int rc = lily_template_compile(tpl, tn, &t, &e);
        if (!rc) rc = lily_template_render_json(t, ctx, cn, &out, &on, &e);
        snprintf(path, sizeof path, "%s.txt", base);
        if (lily_file_exists(path)) {
            lily_read_file(path, 1 << 20, &want, &wn, &e);
            check(rc == 0 && on == wn && !memcmp(out, want, wn), base, "got [%s], want [%s]",
                  rc ? e.msg : out, want);
        } else {
            snprintf(path, sizeof path, "%s.err", base);
            lily_err e2;
            if (lily_read_file(path, 1 << 20, &want, &wn, &e2)) want = NULL;
            check(rc != 0 && want && strstr(e.msg, want), base,
                  "got [%s], want an error containing [%s]", rc ? e.msg : out, want ? want : "?");
        }
        count++;
        lily_template_free(t);
        free(tpl);
        free(ctx);
        free(want);
        free(out);
    }
    closedir(d);
    printf("own templates: %d\n", count);
    if (count < 3) check(0, "own", "%s%s", "fewer than 3 own templates found", "");
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static void expect_load(const char *dir, const char *ctx, const char *want, const char *name) {
    lily_template *t = NULL;
    lily_err e = {{0}};
    char *out = NULL;
    size_t len = 0;
    int rc = lily_template_load(dir, &t, &e);
    if (!rc) rc = lily_template_render_json(t, ctx, strlen(ctx), &out, &len, &e);
    if (want)
        check(rc == 0 && !strcmp(out, want), name, "got [%s], want [%s]", rc ? e.msg : out, want);
    else
        check(rc != 0, name, "got [%s], want an error%s", rc ? e.msg : out, "");
    if (rc) printf("  (%s: %s)\n", name, e.msg);
    free(out);
    lily_template_free(t);
}

static void test_load(const char *tmp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/model", tmp);
    mkdir(dir, 0755);
    write_file(
        dir, "tokenizer_config.json",
        "{\"bos_token\": null, \"eos_token\": {\"content\": \"<|im_end|>\", \"lstrip\": false},"
        " \"pad_token\": \"<|endoftext|>\", \"chat_template\": \"cfg:{{ messages[0].content }}"
        "{{ eos_token }}{{ pad_token }}[{{ bos_token }}]\"}");
    expect_load(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                "cfg:x<|im_end|><|endoftext|>[]", "load_tokenizer_config");
    expect_load(dir, "{\"messages\": [{\"content\": \"y\"}], \"eos_token\": \"E\"}",
                "cfg:yE<|endoftext|>[]", "load_context_overrides_special");
    write_file(dir, "chat_template.jinja", "jinja:{{ messages|length }}\n");
    expect_load(dir, "{\"messages\": [1, 2]}", "jinja:2", "load_jinja_wins");
    snprintf(dir, sizeof dir, "%s/named", tmp);
    mkdir(dir, 0755);
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
               " {\"name\": \"default\", \"template\": \"D{{ add_generation_prompt }}\"}]}");
    expect_load(dir, "{\"messages\": []}", "DFalse", "load_named_default");
    snprintf(dir, sizeof dir, "%s/none", tmp);
    mkdir(dir, 0755);
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"x\"}");
    expect_load(dir, "{}", NULL, "load_no_template");
    expect_load("/nonexistent/dir/for/lily", "{}", NULL, "load_missing_dir");

    /* The cJSON entry point: integral numbers become ints. */
    lily_template *t = NULL;
    lily_err e = {{0}};
    const char *src = "{{ a }} {{ b }} {{ c|tojson }} {{ tools }}";
    char *out = NULL;
    size_t len;
    cJSON *ctx = cJSON_Parse("{\"a\": 3, \"b\": 2.5, \"c\": {\"k\": [true, null, \"\\u00e9\"]}}");
    int rc = lily_template_compile(src, strlen(src), &t, &e);
    if (!rc) rc = lily_template_render(t, ctx, &out, &len, &e);
    check(rc == 0 && !strcmp(out, "3 2.5 {\"k\": [true, null, \"\xc3\xa9\"]} None"), "render_cjson",
          "got [%s], want [%s]", rc ? e.msg : out,
          "3 2.5 {\"k\": [true, null, \"\xc3\xa9\"]} None");
    free(out);
    out = NULL;
    cJSON *arr = cJSON_Parse("[1]");
    rc = lily_template_render(t, arr, &out, &len, &e);
    check(rc != 0 && strstr(e.msg, "object"), "render_non_object", "got [%s]%s", rc ? e.msg : out,
          "");
    free(out);
    out = NULL;
    rc = lily_template_render_json(t, "{\"a\": ", 6, &out, &len, &e);
    check(rc != 0 && strstr(e.msg, "JSON"), "render_bad_json", "got [%s]%s", rc ? e.msg : out, "");
    free(out);
    cJSON_Delete(arr);
    cJSON_Delete(ctx);
    lily_template_free(t);
}

/* ---- randomized properties ------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A random UTF-8 string of n code points from a mix of scripts, stored as code points too. */
static size_t random_text(char *buf, int32_t *cps, int n) {
    static const int32_t pool[] = {'a', 'b', 'z',  ' ',    '\n',   '"',     '\\',   '\'', '{',
                                   '}', 0x1, 0xe9, 0x4e2d, 0x6587, 0x1f600, 0x2028, 0x7f, 0x3000};
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int32_t c = pool[rnd() % (sizeof pool / sizeof pool[0])];
        cps[i] = c;
        if (c < 0x80)
            buf[len++] = (char)c;
        else if (c < 0x800) {
            buf[len++] = (char)(0xc0 | (c >> 6));
            buf[len++] = (char)(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            buf[len++] = (char)(0xe0 | (c >> 12));
            buf[len++] = (char)(0x80 | ((c >> 6) & 0x3f));
            buf[len++] = (char)(0x80 | (c & 0x3f));
        } else {
            buf[len++] = (char)(0xf0 | (c >> 18));
            buf[len++] = (char)(0x80 | ((c >> 12) & 0x3f));
            buf[len++] = (char)(0x80 | ((c >> 6) & 0x3f));
            buf[len++] = (char)(0x80 | (c & 0x3f));
        }
    }
    buf[len] = 0;
    return len;
}

static void test_random(void) {
    int bad_slice = 0, bad_json = 0, runs = 300;
    for (int r = 0; r < runs; r++) {
        char s[256];
        int32_t cps[40];
        int n = (int)(rnd() % 23);
        random_text(s, cps, n);
        int a = (int)(rnd() % 31) - 15, b = (int)(rnd() % 31) - 15, st = (int)(rnd() % 7) - 3;
        if (!st) st = 1;
        /* Reference slice with Python's index rules. */
        int lo = a < 0 ? a + n : a, hi = b < 0 ? b + n : b;
        if (st > 0) {
            lo = lo < 0 ? 0 : lo > n ? n : lo;
            hi = hi < 0 ? 0 : hi > n ? n : hi;
        } else {
            lo = lo < 0 ? -1 : lo >= n ? n - 1 : lo;
            hi = hi < 0 ? -1 : hi >= n ? n - 1 : hi;
        }
        char want[256];
        int32_t sel[40];
        int ns = 0;
        for (int i = lo; st > 0 ? i < hi : i > hi; i += st)
            sel[ns++] = cps[i];
        size_t wl = 0;
        for (int i = 0; i < ns; i++) {
            char one[8];
            int32_t c = sel[i];
            size_t k = 0;
            if (c < 0x80)
                one[k++] = (char)c;
            else if (c < 0x800) {
                one[k++] = (char)(0xc0 | (c >> 6));
                one[k++] = (char)(0x80 | (c & 0x3f));
            } else if (c < 0x10000) {
                one[k++] = (char)(0xe0 | (c >> 12));
                one[k++] = (char)(0x80 | ((c >> 6) & 0x3f));
                one[k++] = (char)(0x80 | (c & 0x3f));
            } else {
                one[k++] = (char)(0xf0 | (c >> 18));
                one[k++] = (char)(0x80 | ((c >> 12) & 0x3f));
                one[k++] = (char)(0x80 | ((c >> 6) & 0x3f));
                one[k++] = (char)(0x80 | (c & 0x3f));
            }
            memcpy(want + wl, one, k);
            wl += k;
        }
        want[wl] = 0;
        cJSON *ctx = cJSON_CreateObject();
        cJSON_AddStringToObject(ctx, "s", s);
        char *ctx_text = cJSON_PrintUnformatted(ctx);
        char src[128];
        snprintf(src, sizeof src, "{{ s[%d:%d:%d] }}|{{ s|tojson }}", a, b, st);
        char *out = NULL;
        size_t len = 0;
        lily_err e;
        if (render(src, ctx_text, NULL, &out, &len, &e)) {
            printf("FAIL random render: %s\n", e.msg);
            bad_slice++;
        } else {
            char *bar = memchr(out, '|', len);
            /* the character pool has no '|', so the first one splits the two outputs */
            if (!bar || (size_t)(bar - out) != wl || memcmp(out, want, wl)) {
                if (bad_slice++ < 3)
                    printf("FAIL slice s[%d:%d:%d] of \"%s\": got [%.*s] want [%s]\n", a, b, st, s,
                           (int)(bar ? bar - out : 0), out, want);
            }
            cJSON *back = bar ? cJSON_Parse(bar + 1) : NULL;
            if (!back || !cJSON_IsString(back) || strcmp(back->valuestring, s)) {
                if (bad_json++ < 3)
                    printf("FAIL tojson round trip of \"%s\": [%s]\n", s, bar ? bar + 1 : "");
            }
            cJSON_Delete(back);
        }
        free(out);
        free(ctx_text);
        cJSON_Delete(ctx);
    }
    printf("random: %d slices and tojson round trips, %d slice and %d json mismatches\n", runs,
           bad_slice, bad_json);
    check(!bad_slice && !bad_json, "random_properties", "%s%s", "mismatches above", "");
}

/* ---- the CLI ---------------------------------------------------------------------------- */

static int run_cli(const char *cmd, char *out, size_t cap, size_t *n) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    *n = fread(out, 1, cap, p);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(const char *tmp) {
    const char *bin = getenv("LILY_BIN");
    if (!bin) {
        printf("LILY_BIN not set: CLI checks skipped\n");
        return;
    }
    char cmd[2048], out[4096];
    size_t n;
    write_file(tmp, "req.json",
               "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\\u00e9\"}], "
               "\"add_generation_prompt\": true, \"enable_thinking\": false}");
    write_file(tmp, "bad.json", "{\"messages\": [");
    char model[600];
    snprintf(model, sizeof model, "%s/model", tmp);
    snprintf(cmd, sizeof cmd, "'%s' template --model '%s' --request '%s/req.json' 2>&1", bin, model,
             tmp);
    int rc = run_cli(cmd, out, sizeof out, &n);
    out[n < sizeof out ? n : sizeof out - 1] = 0;
    check(rc == 0 && n == 7 && !memcmp(out, "jinja:1", 7), "cli_render", "got [%s]%s", out, "");
    write_file(tmp, "t.jinja",
               "{{ messages[0].content }}|{{ enable_thinking }}|{% if add_generation_prompt %}G{% "
               "endif %}");
    snprintf(cmd, sizeof cmd, "'%s' template --template '%s/t.jinja' --request '%s/req.json' 2>&1",
             bin, tmp, tmp);
    rc = run_cli(cmd, out, sizeof out, &n);
    check(rc == 0 && n == strlen("caf\xc3\xa9|False|G") && !memcmp(out, "caf\xc3\xa9|False|G", n),
          "cli_template_file", "got [%s]%s", rc == 0 ? "ok" : "rc!=0", "");
    snprintf(cmd, sizeof cmd, "'%s' template --model '%s' --request '%s/bad.json' 2>&1", bin, model,
             tmp);
    rc = run_cli(cmd, out, sizeof out - 1, &n);
    out[n] = 0;
    check(rc != 0 && strstr(out, "JSON"), "cli_bad_json", "got rc=%s [%s]", rc ? "nonzero" : "0",
          out);
    write_file(tmp, "raise.jinja", "a\n{{ raise_exception('No user query found in messages.') }}");
    snprintf(cmd, sizeof cmd,
             "'%s' template --template '%s/raise.jinja' --request '%s/req.json' 2>&1", bin, tmp,
             tmp);
    rc = run_cli(cmd, out, sizeof out - 1, &n);
    out[n] = 0;
    check(rc != 0 && strstr(out, "line 2: No user query found in messages."), "cli_raise",
          "got rc=%s [%s]", rc ? "nonzero" : "0", out);
}

int main(void) {
    char tmp[] = "/tmp/lily_test_template_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_features();
    test_own();
    test_load(tmp);
    test_random();
    test_cli(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) printf("warning: could not remove %s\n", tmp);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
