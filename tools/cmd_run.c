/* lily run: one-shot generation. Renders the chat template with one user message (and an
 * optional system prompt), streams the decoded text to stdout, prints speed to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#include "cli_chat.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lily run --model DIR [-p] PROMPT [options]\n"
               "  (no PROMPT: the prompt is read from stdin when it is not a terminal)\n"
               "  -n N                max new tokens (default 256)\n"
               "  --temp T --top-k K --top-p P --min-p P --seed S   sampling (default: the\n"
               "                      model's generation_config.json)\n"
               "  --system TEXT       system prompt\n"
               "  --think on|off      thinking switch (default: the template's)\n"
               "  --raw               no chat template: the prompt is the text to continue\n"
               "  --ctx N --backend cpu|cuda --threads N\n" LILY_CLI_ENGINE_USAGE);
}

static int on_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    (void)ud, (void)t;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int lily_cmd_run(int argc, char **argv) {
    lily_clichat_opts co = {.cache_bytes = 0};
    const char *prompt = NULL, *system = NULL;
    int raw = 0;
    lily_chat_args ga = {
        .n_new = 256, .think = -1, .temp = -1, .top_p = -1, .min_p = -1, .top_k = -1};
    const char *pos[1] = {NULL};
    lily_arg eng[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ga.eng, eng);
    const lily_arg own[] = {
        {.name = "-p",
         .alias = "--prompt",
         .kind = LILY_ARG_STR,
         .dst = &prompt,
         .help = "the prompt"},
        {.name = "--system", .kind = LILY_ARG_STR, .dst = &system, .help = "system prompt"},
        {.name = "--raw", .kind = LILY_ARG_FLAG, .dst = &raw, .help = "no chat template"},
        {0}};
    const lily_arg *tabs[] = {own, lily_chat_table(&co, &ga, 0), eng};
    int np = 0;
    const int pr = lily_args_parse("run", tabs, 3, argc, argv, pos, 1, &np, usage);
    if (pr) return lily_args_exit(pr);
    lily_chat_apply(&ga, &co);
    if (np && prompt) {
        fprintf(stderr, "lily run: two prompts: -p and '%s' (see lily run --help)\n", pos[0]);
        return 2;
    }
    if (np) prompt = pos[0];
    int think = ga.think, n_new = ga.n_new, seed_set = ga.seed_set;
    double temp = ga.temp, top_p = ga.top_p, min_p = ga.min_p;
    long top_k = ga.top_k, seed = ga.seed;
    char mbuf[4096];
    if (co.model_dir && !(co.model_dir = lily_cli_model(co.model_dir, mbuf, sizeof mbuf))) return 1;
    char *piped = NULL; /* no prompt and stdin not a terminal: the prompt is stdin */
    if (co.model_dir && !prompt && !isatty(0)) {
        size_t cap = 1 << 12, n = 0, k;
        piped = malloc(cap);
        while ((k = fread(piped + n, 1, cap - n - 1, stdin)) > 0)
            if ((n += k) + 1 == cap) piped = realloc(piped, cap *= 2);
        while (n && (piped[n - 1] == '\n' || piped[n - 1] == '\r'))
            n--;
        piped[n] = 0;
        prompt = piped;
    }
    if (!co.model_dir || !prompt) {
        usage(stderr);
        free(piped);
        return 2;
    }
    lily_clichat c;
    lily_err e;
    if (lily_clichat_open(&co, &c, &e)) {
        fprintf(stderr, "lily run: %s\n", e.msg);
        free(piped);
        return 1;
    }
    if (co.ctx || c.tty) lily_clichat_banner(&c, co.model_dir, "lily run", stderr);
    int32_t *ids = NULL;
    int n = 0, open_think = 0, rc = 1;
    if (raw) {
        size_t nn;
        if (lily_tokenizer_encode(c.tok, prompt, strlen(prompt), &ids, &nn, &e)) goto fail;
        n = (int)nn;
    } else {
        cJSON *msgs = cJSON_CreateArray();
        if (system) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddStringToObject(s, "role", "system");
            cJSON_AddStringToObject(s, "content", system);
            cJSON_AddItemToArray(msgs, s);
        }
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", prompt);
        cJSON_AddItemToArray(msgs, u);
        int r = lily_clichat_encode(&c, msgs, think, &ids, &n, &open_think, &e);
        cJSON_Delete(msgs);
        if (r) goto fail;
    }
    lily_gen_req g = {.prompt = ids,
                      .n_prompt = n,
                      .sp = c.defaults,
                      .ban_id = -1,
                      .max_new = n_new,
                      .on_text = on_text,
                      .on_prefill = lily_clichat_prefill_bar,
                      .ud = &c};
    if (temp >= 0) g.sp.temperature = (float)temp;
    if (top_p >= 0) g.sp.top_p = (float)top_p;
    if (min_p >= 0) g.sp.min_p = (float)min_p;
    if (top_k >= 0) g.sp.top_k = (int)top_k;
    g.sp.seed = seed_set ? (uint64_t)seed : (uint64_t)time(NULL);
    g.ud = &c;
    if (open_think) fputs("<think>\n", stdout);
    lily_gen_result res;
    lily_gen_run(c.gen, &g, &res);
    fputc('\n', stdout);
    if (!strcmp(res.finish, "error")) {
        fprintf(stderr, "lily run: %s\n", res.error);
    } else {
        fprintf(stderr, "[prompt %d tokens: %.1f tok/s; generated %d tokens: %.1f tok/s; %s]\n", n,
                res.prefill_s > 0 ? res.n_prefilled / res.prefill_s : 0, res.n_gen,
                res.decode_s > 0 ? res.n_gen / res.decode_s : 0, res.finish);
        rc = 0;
    }
    free(ids);
    free(piped);
    lily_clichat_close(&c);
    return rc;
fail:
    fprintf(stderr, "lily run: %s\n", e.msg);
    free(ids);
    free(piped);
    lily_clichat_close(&c);
    return 1;
}
