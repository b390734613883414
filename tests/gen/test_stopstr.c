/* Stop-string matcher tests: texts fed in every two-piece split and byte by byte must release
 * exactly the text before the first stop string (or all of it), never a fragment of a stop
 * string that is later matched, and report the hit at the right piece. */
#include <stdio.h>
#include <string.h>

#include "gen/stopstr.h"

static int n_pass, n_fail;

typedef struct {
    const char *text;
    const char *stop[3];
    int n_stop;
    const char *want;
    int hit;
} tcase;

static const tcase CASES[] = {
    {"Hello world. END of story", {"END"}, 1, "Hello world. ", 1},
    {"no stop here at all", {"STOP", "zz"}, 2, "no stop here at all", 0},
    {"aaab", {"aab"}, 1, "a", 1},
    {"abcabd", {"abd", "ca"}, 2, "ab", 1},
    {"partial EN at the end EN", {"END"}, 1, "partial EN at the end EN", 0},
    {"multi\n\nline", {"\n\n"}, 1, "multi", 1},
    {"\xe6\x9d\xb1\xe4\xba\xac\xe3\x81\xa7\xe3\x81\x99",
     {"\xe3\x81\xa7"},
     1,
     "\xe6\x9d\xb1\xe4\xba\xac",
     1},
    {"stop at start", {"stop"}, 1, "", 1},
    {"xyz", {0}, 0, "xyz", 0},
};

static int run(const tcase *c, const size_t *cuts, int ncuts, char *out, size_t outlen) {
    lily_stopstr m;
    lily_stopstr_init(&m, (char **)c->stop, c->n_stop);
    lily_sb acc = {0}, piece = {0};
    size_t prev = 0, len = strlen(c->text);
    int hit = 0;
    for (int k = 0; k <= ncuts; k++) {
        size_t at = k < ncuts ? cuts[k] : len;
        lily_sb_clear(&piece);
        hit |= lily_stopstr_push(&m, c->text + prev, at - prev, &piece);
        lily_sb_append(&acc, lily_sb_str(&piece), piece.len);
        prev = at;
    }
    lily_sb_clear(&piece);
    lily_stopstr_flush(&m, &piece);
    lily_sb_append(&acc, lily_sb_str(&piece), piece.len);
    snprintf(out, outlen, "%s", lily_sb_str(&acc));
    lily_sb_free(&acc);
    lily_sb_free(&piece);
    lily_stopstr_free(&m);
    return hit;
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const tcase *c = &CASES[i];
        size_t len = strlen(c->text), cuts[256];
        char out[512];
        int ok = 1, splits = 0;
        for (size_t a = 0; ok && a <= len; a++) { /* one cut (a == 0: whole) */
            cuts[0] = a;
            int hit = run(c, cuts, a ? 1 : 0, out, sizeof out);
            ok = hit == c->hit && !strcmp(out, c->want);
            if (!ok) printf("  cut %zu: got [%s] hit %d\n", a, out, hit);
            splits++;
        }
        for (size_t k = 1; k < len; k++)
            cuts[k - 1] = k; /* byte by byte */
        if (ok) {
            int hit = run(c, cuts, (int)len - 1, out, sizeof out);
            ok = hit == c->hit && !strcmp(out, c->want);
            if (!ok) printf("  byte by byte: got [%s] hit %d\n", out, hit);
        }
        printf("%-40.40s -> %-24.24s %d splits %s\n", c->text, c->want, splits + 1,
               ok ? "ok" : "FAIL");
        ok ? n_pass++ : n_fail++;
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
