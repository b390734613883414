/* lily tokenize / lily detokenize: text <-> token ids with a model directory's tokenizer.json.
 *
 *   lily tokenize --model DIR [--file F]     UTF-8 text (stdin or F) -> ids on one line
 *   lily tokenize --model DIR --jsonl [...]  one JSON string per input line -> one line of ids
 *   lily tokenize --model DIR --pieces       one line per token: id -> 'piece'
 *   lily tokenize --model DIR --bench F      encode throughput on F (MB/s, one thread)
 *   lily detokenize --model DIR              whitespace-separated ids on stdin -> text */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "base/file.h"
#include "base/timer.h"
#include "cli.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

/* Reads all of f into a heap buffer (caller frees). */
static int read_all(FILE *f, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = lily_xmalloc(cap);
    for (;;) {
        if (n == cap) buf = lily_xrealloc(buf, cap *= 2);
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int read_input(const char *file, char **buf, size_t *len) {
    if (!file) {
        if (read_all(stdin, buf, len)) {
            fprintf(stderr, "lily: cannot read stdin: %s\n", strerror(errno));
            return -1;
        }
        return 0;
    }
    lily_err e;
    if (lily_read_file(file, (size_t)1 << 32, buf, len, &e)) {
        fprintf(stderr, "lily: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static int open_tok(const char *model, lily_tokenizer **tok) {
    lily_err e;
    if (!model) {
        fprintf(stderr, "lily: --model DIR is required\n");
        return -1;
    }
    if (lily_tokenizer_open(model, tok, &e)) {
        fprintf(stderr, "lily: %s\n", e.msg);
        return -1;
    }
    return 0;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Encodes the text of file once on a fresh tokenizer (cold word cache), then repeatedly for
 * about a second, and reports wall and CPU time (CPU time is the steadier figure on a busy
 * machine). One thread. */
static int bench(lily_tokenizer *tok, const char *file) {
    char *text;
    size_t len;
    if (read_input(file, &text, &len)) return 1;
    lily_err e;
    int32_t *ids;
    size_t n = 0;
    double best = 1e30, best_cpu = 1e30, first = 0, first_cpu = 0, start = lily_now();
    int reps = 0;
    while (reps < 4 || lily_now() - start < 1.0) {
        double w = lily_now(), c = cpu_now();
        if (lily_tokenizer_encode(tok, text, len, &ids, &n, &e)) {
            fprintf(stderr, "lily: %s\n", e.msg);
            free(text);
            return 1;
        }
        w = lily_now() - w;
        c = cpu_now() - c;
        free(ids);
        if (reps++ == 0) {
            first = w;
            first_cpu = c;
        } else {
            if (w < best) best = w;
            if (c < best_cpu) best_cpu = c;
        }
    }
    printf("%zu bytes -> %zu tokens, one thread\n", len, n);
    printf("cold cache:      wall %7.2f ms (%6.1f MB/s)  cpu %7.2f ms (%6.1f MB/s)\n", first * 1e3,
           len / first / 1e6, first_cpu * 1e3, len / first_cpu / 1e6);
    printf("warm, best of %2d: wall %7.2f ms (%6.1f MB/s)  cpu %7.2f ms (%6.1f MB/s)\n", reps - 1,
           best * 1e3, len / best / 1e6, best_cpu * 1e3, len / best_cpu / 1e6);
    free(text);
    return 0;
}

static void print_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", (int)ids[i]);
    printf("\n");
}

/* Length of the complete UTF-8 character at p (n bytes left), or 0 when p does not start one. */
static int utf8_char(const unsigned char *p, size_t n) {
    int k = p[0] < 0x80             ? 1
            : (p[0] & 0xe0) == 0xc0 ? 2
            : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (!k || (size_t)k > n) return 0;
    for (int i = 1; i < k; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return k;
}

/* --pieces: "id -> 'piece'" per token, as llama-tokenize shows them. The piece is the token's
 * bytes; control characters, quotes, backslashes and bytes that are not a whole UTF-8 character
 * (byte-level tokens that split one) are escaped (\n, \t, \', \\, \xNN). */
static void print_pieces(const lily_tokenizer *tok, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const unsigned char *p =
            (const unsigned char *)lily_tokenizer_token_bytes(tok, ids[i], &len);
        printf("%6d -> '", (int)ids[i]);
        for (size_t j = 0; p && j < len;) {
            int k = utf8_char(p + j, len - j);
            unsigned char c = p[j];
            if (k > 1)
                fwrite(p + j, 1, (size_t)k, stdout), j += (size_t)k;
            else {
                if (c == '\n')
                    fputs("\\n", stdout);
                else if (c == '\t')
                    fputs("\\t", stdout);
                else if (c == '\r')
                    fputs("\\r", stdout);
                else if (c == '\'' || c == '\\')
                    printf("\\%c", c);
                else if (c < 0x20 || c >= 0x7f)
                    printf("\\x%02x", c);
                else
                    fputc(c, stdout);
                j++;
            }
        }
        printf("'\n");
    }
}

/* --jsonl: each line of text is a JSON string (so texts may hold newlines); prints one line of
 * ids per input line. Lines are split on '\n' only. */
static int tokenize_jsonl(lily_tokenizer *tok, const char *text, size_t len) {
    size_t line = 0;
    lily_u8buf s = {0};
    int rc = 0;
    for (size_t pos = 0; pos < len && !rc; line++) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        s.n = 0;
        int32_t *ids;
        size_t n;
        lily_err e;
        if (lily_utf8_json_string(text + pos, end - pos, &s)) {
            fprintf(stderr, "lily tokenize: line %zu is not a JSON string\n", line + 1);
            rc = 1;
        } else if (lily_tokenizer_encode(tok, (const char *)s.p, s.n, &ids, &n, &e)) {
            fprintf(stderr, "lily tokenize: line %zu: %s\n", line + 1, e.msg);
            rc = 1;
        } else {
            print_ids(ids, n);
            free(ids);
        }
        pos = end + 1;
    }
    lily_u8buf_free(&s);
    return rc || ferror(stdout) ? 1 : 0;
}

static void tok_usage(FILE *f) {
    fprintf(f, "usage: lily tokenize --model DIR [--jsonl | --pieces] [--file F | --bench F]\n"
               "Reads UTF-8 text (stdin or F) and prints its token ids on one line.\n"
               "--pieces prints one line per token instead: id -> 'piece'.\n"
               "--jsonl reads one JSON string per line and prints one line of ids each.\n"
               "--bench F encodes F repeatedly on one thread and prints MB/s.\n");
}

static void detok_usage(FILE *f) {
    fprintf(f, "usage: lily detokenize --model DIR\n"
               "Reads whitespace-separated token ids on stdin and writes their text.\n");
}

int lily_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *bench_file = NULL;
    int jsonl = 0, pieces = 0;
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"},
        {.name = "--file", .kind = LILY_ARG_STR, .dst = &file, .help = "input file"},
        {.name = "--bench", .kind = LILY_ARG_STR, .dst = &bench_file, .help = "bench file"},
        {.name = "--jsonl", .kind = LILY_ARG_FLAG, .dst = &jsonl, .help = "JSON lines"},
        {.name = "--pieces", .kind = LILY_ARG_FLAG, .dst = &pieces, .help = "id -> 'piece'"},
        {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("tokenize", tabs, 1, argc, argv, NULL, 0, NULL, tok_usage);
    if (pr) return lily_args_exit(pr);
    lily_tokenizer *tok;
    if (open_tok(model, &tok)) return 1;
    if (bench_file) {
        int rc = bench(tok, bench_file);
        lily_tokenizer_free(tok);
        return rc;
    }
    char *text;
    size_t len;
    if (read_input(file, &text, &len)) {
        lily_tokenizer_free(tok);
        return 1;
    }
    if (jsonl) {
        int rc = tokenize_jsonl(tok, text, len);
        free(text);
        lily_tokenizer_free(tok);
        return rc;
    }
    int32_t *ids;
    size_t n;
    lily_err e;
    int rc = lily_tokenizer_encode(tok, text, len, &ids, &n, &e);
    free(text);
    if (rc) {
        fprintf(stderr, "lily tokenize: %s\n", e.msg);
        lily_tokenizer_free(tok);
        return 1;
    }
    if (pieces)
        print_pieces(tok, ids, n);
    else
        print_ids(ids, n);
    lily_tokenizer_free(tok);
    free(ids);
    return ferror(stdout) ? 1 : 0;
}

int lily_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"}, {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("detokenize", tabs, 1, argc, argv, NULL, 0, NULL, detok_usage);
    if (pr) return lily_args_exit(pr);
    lily_tokenizer *tok;
    if (open_tok(model, &tok)) return 1;
    char *in;
    size_t len;
    if (read_input(NULL, &in, &len)) {
        lily_tokenizer_free(tok);
        return 1;
    }
    in = lily_xrealloc(in, len + 1);
    in[len] = 0;
    int32_t *ids = lily_xmalloc((len / 2 + 1) * sizeof *ids);
    size_t n = 0;
    int rc = 0;
    for (char *p = in; *p;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
            int w = (int)strcspn(p, " \t\r\n");
            fprintf(stderr, "lily detokenize: '%.*s' is not a token id\n", w > 40 ? 40 : w, p);
            rc = 1;
            break;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!rc) {
        char *text;
        size_t tl;
        lily_err e;
        if (lily_tokenizer_decode(tok, ids, n, &text, &tl, &e)) {
            fprintf(stderr, "lily detokenize: %s\n", e.msg);
            rc = 1;
        } else {
            fwrite(text, 1, tl, stdout);
            free(text);
            if (ferror(stdout)) rc = 1;
        }
    }
    free(ids);
    free(in);
    lily_tokenizer_free(tok);
    return rc;
}
