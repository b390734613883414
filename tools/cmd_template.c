/* lily template: renders a model's chat template for a request, exactly as the server would,
 * without loading weights. The request file holds the template context:
 * {"messages": [...], "tools": [...], "add_generation_prompt": bool, ...extra variables}. The
 * prompt goes to stdout byte for byte, with no newline added. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"
#include "chat/template.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lily template --model DIR --request FILE.json|-\n"
               "       lily template --template FILE.jinja --request FILE.json|-\n"
               "--request - reads the request from stdin.\n"
               "Renders the chat template (DIR needs only tokenizer_config.json and/or\n"
               "chat_template.jinja) with the request's messages, tools, add_generation_prompt\n"
               "and extra variables such as enable_thinking.\n");
}

/* All of stdin into a NUL-terminated heap buffer (caller frees). */
static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
        size_t k = fread(buf + n, 1, cap - n - 1, stdin);
        n += k;
        if (k == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return -1;
    }
    buf[n] = 0;
    *out = buf, *len = n;
    return 0;
}

int lily_cmd_template(int argc, char **argv) {
    const char *model = NULL, *request = NULL, *tpl_file = NULL;
    const lily_arg own[] = {
        {.name = "--model", .kind = LILY_ARG_STR, .dst = &model, .help = "model directory"},
        {.name = "--request", .kind = LILY_ARG_STR, .dst = &request, .help = "JSON file or -"},
        {.name = "--template", .kind = LILY_ARG_STR, .dst = &tpl_file, .help = "template file"},
        {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("template", tabs, 1, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    if ((!model == !tpl_file) || !request) {
        usage(stderr);
        return 2;
    }
    lily_err e = {{0}};
    lily_template *t = NULL;
    char *req = NULL, *src = NULL, *out = NULL;
    size_t req_len = 0, src_len = 0, out_len = 0;
    int rc = 1;
    if (model) {
        if (lily_template_load(model, &t, &e)) goto fail;
    } else {
        if (lily_read_file(tpl_file, (size_t)16 << 20, &src, &src_len, &e)) goto fail;
        if (lily_template_compile(src, src_len, &t, &e)) {
            lily_fail_prefix(&e, "%s", tpl_file);
            goto fail;
        }
    }
    if (!strcmp(request, "-")) {
        if (read_stdin(&req, &req_len)) {
            lily_fail(&e, "cannot read the request from stdin");
            goto fail;
        }
    } else if (lily_read_file(request, (size_t)256 << 20, &req, &req_len, &e)) {
        goto fail;
    }
    if (lily_template_render_json(t, req, req_len, &out, &out_len, &e)) goto fail;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        fprintf(stderr, "lily template: write error\n");
        goto done;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lily template: %s\n", e.msg);
done:
    free(out);
    free(req);
    free(src);
    lily_template_free(t);
    return rc;
}
