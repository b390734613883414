/* lily chat: interactive chat in the terminal. Each turn renders the whole conversation with the
 * chat template; the session keeps its state between turns, so only the new tokens are
 * prefilled (the same prefix reuse as the server). Reasoning is shown dimmed, the answer plainly.
 * Input: end a line with \ to continue it, or wrap several lines in """ ... """. Commands: /reset,
 * /system TEXT, /quit, /help. Ctrl-C stops the answer being generated. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#ifdef LILY_HAVE_SERVER
#include "cli_chat.h"
#include "server/outparse.h"
#include "server/sb.h"

static volatile sig_atomic_t g_interrupt;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupt = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: lily chat --model DIR [options]\n"
               "  --system TEXT       system prompt\n"
               "  --think on|off      thinking switch (default: the template's)\n"
               "  -n N                max tokens per answer (default: the rest of the context)\n"
               "  --temp T --top-k K --top-p P --min-p P --seed S\n"
               "  --ctx N --backend cpu|cuda --threads N\n"
               "in the chat: end a line with \\ to continue it, or use \"\"\" blocks;\n"
               "  /reset  /system TEXT  /quit  /help\n");
}

typedef struct turn {
    lily_outparse *p;
    lily_sb content;
    int color, in_reasoning;
} turn;

static void show(turn *t) {
    size_t n;
    const lily_delta *d = lily_outparse_deltas(t->p, &n);
    for (size_t i = 0; i < n; i++) {
        int r = d[i].kind == LILY_DELTA_REASONING;
        if (r != t->in_reasoning && t->color) fputs(r ? "\033[2m" : "\033[0m", stdout);
        if (r != t->in_reasoning && !r) fputs("\n", stdout);
        t->in_reasoning = r;
        fwrite(lily_sb_str(&d[i].text), 1, d[i].text.len, stdout);
        if (!r) lily_sb_append(&t->content, lily_sb_str(&d[i].text), d[i].text.len);
    }
    lily_outparse_clear(t->p);
    fflush(stdout);
}

static int on_text(void *ud, const lily_gen_token *tok, const char *text, size_t len) {
    turn *t = ud;
    lily_outparse_feed(t->p, text, len);
    if (!tok) lily_outparse_finish(t->p);
    show(t);
    return 0;
}

static int cancelled(void *ud) {
    (void)ud;
    return g_interrupt;
}

/* Reads one user input (possibly several lines). Returns NULL at end of input. */
static char *read_input(int tty) {
    lily_sb in = {0};
    char line[8192];
    int block = 0;
    if (tty) fputs("\033[1m>\033[0m ", stdout), fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        size_t n = strcspn(line, "\n");
        line[n] = 0;
        if (!strcmp(line, "\"\"\"")) {
            if (block) return lily_sb_take(&in);
            block = 1;
            continue;
        }
        if (block) {
            lily_sb_puts(&in, line);
            lily_sb_putc(&in, '\n');
            continue;
        }
        if (n && line[n - 1] == '\\') {
            lily_sb_append(&in, line, n - 1);
            lily_sb_putc(&in, '\n');
            if (tty) fputs(". ", stdout), fflush(stdout);
            continue;
        }
        lily_sb_puts(&in, line);
        return lily_sb_take(&in);
    }
    if (in.len) return lily_sb_take(&in);
    lily_sb_free(&in);
    return NULL;
}

static cJSON *new_history(const char *system) {
    cJSON *m = cJSON_CreateArray();
    if (system && system[0]) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "role", "system");
        cJSON_AddStringToObject(s, "content", system);
        cJSON_AddItemToArray(m, s);
    }
    return m;
}

int lily_cmd_chat(int argc, char **argv) {
    lily_clichat_opts co = {.cache_bytes = (size_t)1 << 30};
    char *system = NULL;
    lily_chat_args ga = {.n_new = 0, .think = -1, .temp = -1, .top_p = -1, .min_p = -1,
                         .top_k = -1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!(v = lily_cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--system")) {
            free(system), system = strdup(v);
            continue;
        }
        int r = lily_chat_arg(a, v, &co, &ga);
        if (r <= 0) {
            if (!r) fprintf(stderr, "lily chat: bad option %s %s\n", a, v);
            if (!r) usage(stderr);
            free(system);
            return 2;
        }
    }
    int think = ga.think, n_new = ga.n_new, seed_set = ga.seed_set;
    double temp = ga.temp, top_p = ga.top_p, min_p = ga.min_p;
    long top_k = ga.top_k, seed = ga.seed;
    if (!co.model_dir) {
        usage(stderr);
        free(system);
        return 2;
    }
    lily_clichat c;
    lily_err e;
    if (lily_clichat_open(&co, &c, &e)) {
        fprintf(stderr, "lily chat: %s\n", e.msg);
        free(system);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt ends the chat */
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(0) && isatty(1);
    if (tty) {
        lily_clichat_banner(&c, co.model_dir, "lily chat", stderr);
        fprintf(stderr, "/help for commands, Ctrl-D or /bye to leave\n");
    }
    cJSON *hist = new_history(system);
    uint64_t turn_seed = seed_set ? (uint64_t)seed : (uint64_t)time(NULL);
    char *in;
    while (!g_interrupt && (in = read_input(tty))) {
        if (!strcmp(in, "/quit") || !strcmp(in, "/exit")) {
            free(in);
            break;
        }
        if (!strcmp(in, "/help")) {
            usage(stdout);
        } else if (!strcmp(in, "/reset")) {
            cJSON_Delete(hist);
            hist = new_history(system);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (!strncmp(in, "/system", 7)) {
            free(system);
            system = strdup(in[7] ? in + 8 : "");
            cJSON_Delete(hist);
            hist = new_history(system);
            fprintf(stderr, "(system prompt set; conversation cleared)\n");
        } else if (in[0]) {
            cJSON *u = cJSON_CreateObject();
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddStringToObject(u, "content", in);
            cJSON_AddItemToArray(hist, u);
            int32_t *ids = NULL;
            int n = 0, open = 0;
            if (lily_clichat_encode(&c, hist, think, &ids, &n, &open, &e)) {
                fprintf(stderr, "lily chat: %s\n", e.msg);
                cJSON_DeleteItemFromArray(hist, cJSON_GetArraySize(hist) - 1);
                free(in);
                continue;
            }
            lily_outparse_opts po = {.thinking = open};
            turn t = {.p = lily_outparse_create(&po), .color = isatty(1)};
            lily_gen_req g = {.prompt = ids,
                              .n_prompt = n,
                              .sp = c.defaults,
                              .ban_id = -1,
                              .max_new = n_new,
                              .ud = &t,
                              .on_text = on_text,
                              .cancelled = cancelled};
            if (temp >= 0) g.sp.temperature = (float)temp;
            if (top_p >= 0) g.sp.top_p = (float)top_p;
            if (min_p >= 0) g.sp.min_p = (float)min_p;
            if (top_k >= 0) g.sp.top_k = (int)top_k;
            g.sp.seed = turn_seed++;
            lily_gen_result res;
            lily_gen_run(c.gen, &g, &res);
            if (t.color && t.in_reasoning) fputs("\033[0m", stdout);
            fputc('\n', stdout);
            g_interrupt = 0;
            if (!strcmp(res.finish, "error")) {
                fprintf(stderr, "lily chat: %s\n", res.error);
                cJSON_DeleteItemFromArray(hist, cJSON_GetArraySize(hist) - 1);
            } else {
                lily_gen_finish_turn(c.gen);
                cJSON *a = cJSON_CreateObject();
                cJSON_AddStringToObject(a, "role", "assistant");
                cJSON_AddStringToObject(a, "content", lily_sb_str(&t.content));
                cJSON_AddItemToArray(hist, a);
                int dim = isatty(2);
                fprintf(stderr,
                        "%s[%d tokens, %.1f tok/s; prompt %d (%d reused), %.1f tok/s%s]%s\n",
                        dim ? "\033[2m" : "", res.n_gen,
                        res.decode_s > 0 ? res.n_gen / res.decode_s : 0, n, res.n_cached,
                        res.prefill_s > 0 ? res.n_prefilled / res.prefill_s : 0,
                        strcmp(res.finish, "cancelled") ? "" : ", stopped", dim ? "\033[0m" : "");
            }
            lily_outparse_free(t.p);
            lily_sb_free(&t.content);
            free(ids);
        }
        free(in);
    }
    cJSON_Delete(hist);
    free(system);
    lily_clichat_close(&c);
    return 0;
}

#else
int lily_cmd_chat(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "lily chat: this build has no server module (-DLILY_SERVER=OFF)\n");
    return 2;
}
#endif
