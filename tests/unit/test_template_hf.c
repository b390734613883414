/* Conformance of the chat-template renderer with Hugging Face transformers: every request case
 * in tests/fixtures/template/cases x each official Qwen template (read from ../shared/data) is
 * rendered and compared byte for byte with tests/fixtures/template/hf/<case>.<template>.txt, or,
 * where transformers raised, required to fail with a message containing the text of
 * <case>.<template>.error. Those files are written by tools/hf_template_render.py on a machine
 * with transformers; until they exist this test is skipped (exit 77), never passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include "base/file.h"
#include "chat/template.h"

static const char *const templates[] = {"qwen3", "qwen3_5", "qwen3_coder"};

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void) {
    const char *cases_dir = "tests/fixtures/template/cases", *hf_dir = "tests/fixtures/template/hf";
    char path[1024];
    snprintf(path, sizeof path, "../shared/data/%s_chat_template.jinja", templates[0]);
    if (!lily_file_exists(path)) {
        printf("skipped: ../shared/data has no official templates\n");
        return 77;
    }
    DIR *d = opendir(cases_dir);
    if (!d) {
        printf("FAIL: cannot open %s\n0 passed, 1 failed\n", cases_dir);
        return 1;
    }
    char *names[512];
    int ncases = 0;
    struct dirent *de;
    while ((de = readdir(d)) && ncases < 512) {
        size_t n = strlen(de->d_name);
        if (n > 5 && !strcmp(de->d_name + n - 5, ".json"))
            names[ncases++] = strndup(de->d_name, n - 5);
    }
    closedir(d);
    qsort(names, (size_t)ncases, sizeof *names, cmp_names);

    int have = 0;
    for (int i = 0; i < ncases && !have; i++)
        for (int k = 0; k < 3 && !have; k++) {
            snprintf(path, sizeof path, "%s/%s.%s.txt", hf_dir, names[i], templates[k]);
            have = lily_file_exists(path);
            snprintf(path, sizeof path, "%s/%s.%s.error", hf_dir, names[i], templates[k]);
            have = have || lily_file_exists(path);
        }
    if (!have) {
        printf("skipped: no HF renders yet (run tools/hf_template_render.py into %s)\n", hf_dir);
        for (int i = 0; i < ncases; i++)
            free(names[i]);
        return 77;
    }

    int passed = 0, failed = 0, missing = 0;
    for (int k = 0; k < 3; k++) {
        lily_template *t = NULL;
        lily_err e = {{0}};
        char *src = NULL;
        size_t sn;
        snprintf(path, sizeof path, "../shared/data/%s_chat_template.jinja", templates[k]);
        if (lily_read_file(path, 1 << 20, &src, &sn, &e) ||
            lily_template_compile(src, sn, &t, &e)) {
            printf("FAIL %s: %s\n", templates[k], e.msg);
            failed++;
            free(src);
            continue;
        }
        for (int i = 0; i < ncases; i++) {
            char *req = NULL, *want = NULL, *out = NULL;
            size_t rn, wn, on = 0;
            snprintf(path, sizeof path, "%s/%s.json", cases_dir, names[i]);
            if (lily_read_file(path, 1 << 24, &req, &rn, &e)) {
                printf("FAIL %s: %s\n", names[i], e.msg);
                failed++;
                continue;
            }
            lily_err re = {{0}};
            int rc = lily_template_render_json(t, req, rn, &out, &on, &re);
            snprintf(path, sizeof path, "%s/%s.%s.txt", hf_dir, names[i], templates[k]);
            int is_txt = lily_file_exists(path);
            if (!is_txt)
                snprintf(path, sizeof path, "%s/%s.%s.error", hf_dir, names[i], templates[k]);
            if (!lily_file_exists(path)) {
                printf("MISSING %s.%s: no HF render\n", names[i], templates[k]);
                missing++;
            } else if (lily_read_file(path, 1 << 24, &want, &wn, &e)) {
                printf("FAIL %s.%s: %s\n", names[i], templates[k], e.msg);
                failed++;
            } else if (is_txt) {
                if (rc == 0 && on == wn && !memcmp(out, want, wn)) {
                    passed++;
                } else if (rc) {
                    printf("FAIL %s.%s: lily failed (%s), HF rendered %zu bytes\n", names[i],
                           templates[k], re.msg, wn);
                    failed++;
                } else {
                    size_t p = 0;
                    while (p < on && p < wn && out[p] == want[p])
                        p++;
                    size_t from = p > 40 ? p - 40 : 0;
                    printf("FAIL %s.%s: %zu vs %zu bytes, first difference at byte %zu\n"
                           "  lily: [%.*s]\n  hf:   [%.*s]\n",
                           names[i], templates[k], on, wn, p,
                           (int)((on < p + 40 ? on : p + 40) - from), out + from,
                           (int)((wn < p + 40 ? wn : p + 40) - from), want + from);
                    failed++;
                }
            } else {
                /* The HF message is the exception text; lily's carries it after the line. */
                while (wn && (want[wn - 1] == '\n' || want[wn - 1] == ' '))
                    want[--wn] = 0;
                if (rc && strstr(re.msg, want)) {
                    passed++;
                    printf("ok   %s.%s: both fail: %s\n", names[i], templates[k], re.msg);
                } else {
                    printf("FAIL %s.%s: HF raised [%s], lily %s [%s]\n", names[i], templates[k],
                           want, rc ? "raised" : "rendered", rc ? re.msg : "");
                    failed++;
                }
            }
            free(req);
            free(want);
            free(out);
        }
        lily_template_free(t);
        free(src);
    }
    for (int i = 0; i < ncases; i++)
        free(names[i]);
    if (missing) {
        printf("%d renders missing from %s: rerun tools/hf_template_render.py\n", missing, hf_dir);
        failed += missing;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
