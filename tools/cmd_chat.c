/* lily chat: interactive chat in the terminal. Each turn renders the whole conversation with the
 * chat template; the session keeps its state between turns, so only the new tokens are
 * prefilled (the same prefix reuse as the server). Reasoning is shown dimmed, the answer plainly.
 * Input: line editing and history with libedit (tools/cli_line.h); end a line with \ to continue
 * it, or wrap several lines in """ ... """. Commands (the first word, matched exactly): /bye
 * /exit /quit, /clear /reset, /system TEXT, /save FILE, /load FILE, /help; // starts a message
 * with /. Ctrl-C clears the line at the prompt and stops the answer (or the prefill) being
 * computed; Ctrl-D at the prompt leaves. When the conversation outgrows the context, the oldest
 * turns are dropped with a note. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#include "base/file.h"
#include "cli_chat.h"
#include "cli_line.h"
#include "gen/outparse.h"
#include "gen/sb.h"

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
               "  --ctx N --backend cpu|cuda --threads N\n" LILY_CLI_ENGINE_USAGE
               "  --history FILE      line history (default ~/.lily_history; '' for none)\n");
}

static void chat_help(FILE *f) {
    fprintf(f, "end a line with \\ to continue it, or wrap lines in \"\"\" ... \"\"\"\n"
               "  /bye, /exit       leave (or Ctrl-D)\n"
               "  /clear, /reset    forget the conversation\n"
               "  /system TEXT      set the system prompt (clears the conversation)\n"
               "  /save FILE        write the conversation as JSON ({\"messages\": [...]})\n"
               "  /load FILE        read a conversation written by /save\n"
               "  /help             this list; //text sends /text\n"
               "Ctrl-C clears the line, or stops the answer being written.\n");
}

typedef struct turn {
    lily_clichat *c;
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

static void on_prefill(void *ud, int done, int total) {
    turn *t = ud;
    lily_clichat_prefill_bar(t->c, done, total);
}

/* Reads one user input (possibly several lines) into *out. Returns 1 with an input, 0 at end of
 * input, -1 when Ctrl-C discarded what was being typed. */
static int read_input(lily_line *ln, char **out) {
    lily_sb in = {0};
    int block = 0, cont = 0;
    char *line;
    while ((line = lily_line_read(ln, block || cont ? ". " : "> "))) {
        size_t n = strlen(line);
        if (!strcmp(line, "\"\"\"")) {
            free(line);
            if (block) break;
            block = 1;
            continue;
        }
        if (block) {
            lily_sb_puts(&in, line);
            lily_sb_putc(&in, '\n');
            free(line);
            continue;
        }
        if (n && line[n - 1] == '\\') {
            lily_sb_append(&in, line, n - 1);
            lily_sb_putc(&in, '\n');
            free(line);
            cont = 1;
            continue;
        }
        lily_sb_puts(&in, line);
        free(line);
        break;
    }
    if (!line && g_interrupt) {
        g_interrupt = 0;
        lily_sb_free(&in);
        return -1;
    }
    if (!line && !in.len && !block) {
        lily_sb_free(&in);
        return 0;
    }
    *out = lily_sb_take(&in);
    lily_line_remember(ln, *out);
    return 1;
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

static int is_role(const cJSON *m, const char *role) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) && !strcmp(r->valuestring, role);
}

/* Drops the oldest turn (a user message and the answers up to the next user message) but never
 * the last user message. Returns 0, or -1 when there is nothing left to drop. */
static int drop_oldest_turn(cJSON *hist) {
    int n = cJSON_GetArraySize(hist), first = -1, next = -1;
    for (int i = 0; i < n; i++) {
        if (!is_role(cJSON_GetArrayItem(hist, i), "user")) continue;
        if (first < 0)
            first = i;
        else {
            next = i;
            break;
        }
    }
    if (first < 0 || next < 0) return -1;
    for (int i = first; i < next; i++)
        cJSON_DeleteItemFromArray(hist, first);
    return 0;
}

/* /save FILE: the conversation as a template request ({"messages": [...]}). */
static void save(const cJSON *hist, const char *path) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(o, "messages", (cJSON *)hist);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f)) {
        fprintf(stderr, "lily chat: cannot write %s\n", path);
        if (f) fclose(f);
    } else {
        fprintf(stderr, "(conversation saved to %s: %d messages)\n", path,
                cJSON_GetArraySize(hist));
    }
    free(text);
}

/* /load FILE: {"messages": [...]} or [...], each message with string role and content. Returns
 * the new history (and the system prompt it holds in *system), or NULL with a message. */
static cJSON *load(const char *path, char **system) {
    char *text = NULL;
    lily_err e;
    if (lily_read_file(path, (size_t)64 << 20, &text, NULL, &e)) {
        fprintf(stderr, "lily chat: %s\n", e.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *m = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *x;
    int ok = cJSON_IsArray(m);
    if (ok) {
        cJSON_ArrayForEach(x, m) {
            ok = ok && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(x, "role")) &&
                 cJSON_IsString(cJSON_GetObjectItemCaseSensitive(x, "content"));
        }
    }
    if (!ok) {
        fprintf(stderr,
                "lily chat: %s: not a conversation ({\"messages\": [{\"role\": ..., "
                "\"content\": ...}, ...]})\n",
                path);
        cJSON_Delete(j);
        return NULL;
    }
    cJSON *h = cJSON_Duplicate(m, 1);
    cJSON_Delete(j);
    free(*system);
    *system = NULL;
    cJSON *first = cJSON_GetArrayItem(h, 0);
    if (first && is_role(first, "system"))
        *system = strdup(cJSON_GetObjectItemCaseSensitive(first, "content")->valuestring);
    fprintf(stderr, "(conversation loaded from %s: %d messages)\n", path, cJSON_GetArraySize(h));
    return h;
}

typedef struct chat {
    lily_clichat c;
    lily_chat_args ga;
    cJSON *hist;
    char *system;
    uint64_t seed;
} chat;

/* Encodes the conversation, dropping the oldest turns (with a note) until the prompt and room
 * for the answer fit the context. Returns 0, or -1 (the last user message was removed). */
static int encode_fitting(chat *ch, int32_t **ids, int *n, int *open) {
    lily_err e;
    int ctx = ch->c.ctx, dropped = 0;
    int room = ch->ga.n_new > 0 ? ch->ga.n_new : 256;
    if (room > ctx / 2) room = ctx / 2;
    for (;;) {
        if (lily_clichat_encode(&ch->c, ch->hist, ch->ga.think, ids, n, open, &e)) {
            fprintf(stderr, "lily chat: %s\n", e.msg);
            break;
        }
        if (*n + room <= ctx) {
            if (dropped)
                fprintf(stderr,
                        "(the conversation outgrew the context of %d tokens: dropped the "
                        "oldest %d turn%s)\n",
                        ctx, dropped, dropped == 1 ? "" : "s");
            return 0;
        }
        free(*ids);
        *ids = NULL;
        if (drop_oldest_turn(ch->hist)) {
            fprintf(stderr,
                    "lily chat: this message (%d tokens with the system prompt) leaves no "
                    "room for an answer in the context of %d tokens (--ctx)\n",
                    *n, ctx);
            break;
        }
        dropped++;
    }
    cJSON_DeleteItemFromArray(ch->hist, cJSON_GetArraySize(ch->hist) - 1);
    return -1;
}

static void answer(chat *ch, const char *in) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", in);
    cJSON_AddItemToArray(ch->hist, u);
    int32_t *ids = NULL;
    int n = 0, open = 0;
    if (encode_fitting(ch, &ids, &n, &open)) return;
    lily_outparse_opts po = {.thinking = open};
    turn t = {.c = &ch->c, .p = lily_outparse_create(&po), .color = isatty(1)};
    const lily_chat_args *ga = &ch->ga;
    lily_gen_req g = {.prompt = ids,
                      .n_prompt = n,
                      .sp = ch->c.defaults,
                      .ban_id = -1,
                      .max_new = ga->n_new,
                      .ud = &t,
                      .on_text = on_text,
                      .on_prefill = on_prefill,
                      .cancelled = cancelled};
    if (ga->temp >= 0) g.sp.temperature = (float)ga->temp;
    if (ga->top_p >= 0) g.sp.top_p = (float)ga->top_p;
    if (ga->min_p >= 0) g.sp.min_p = (float)ga->min_p;
    if (ga->top_k >= 0) g.sp.top_k = (int)ga->top_k;
    g.sp.seed = ch->seed++;
    lily_gen_result res;
    lily_gen_run(ch->c.gen, &g, &res);
    if (t.color && t.in_reasoning) fputs("\033[0m", stdout);
    fputc('\n', stdout);
    g_interrupt = 0;
    int stopped = !strcmp(res.finish, "cancelled"), dim = isatty(2);
    if (!strcmp(res.finish, "error") || (stopped && res.n_gen == 0)) {
        /* no answer: the message leaves the conversation */
        if (stopped && ch->c.tty) fputs("\r\033[K", stderr);
        if (stopped)
            fprintf(stderr, "%s[stopped during the prompt: %d of %d tokens computed]%s\n",
                    dim ? "\033[2m" : "", res.n_prefilled, n - res.n_cached, dim ? "\033[0m" : "");
        else
            fprintf(stderr, "lily chat: %s\n", res.error);
        cJSON_DeleteItemFromArray(ch->hist, cJSON_GetArraySize(ch->hist) - 1);
    } else {
        lily_gen_finish_turn(ch->c.gen);
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", lily_sb_str(&t.content));
        cJSON_AddItemToArray(ch->hist, a);
        char pre[64] = "";
        if (res.n_prefilled > 0 && res.prefill_s > 0)
            snprintf(pre, sizeof pre, ", %.1f tok/s", res.n_prefilled / res.prefill_s);
        fprintf(stderr, "%s[%d tokens, %.1f tok/s; prompt %d (%d reused)%s%s]%s\n",
                dim ? "\033[2m" : "", res.n_gen, res.decode_s > 0 ? res.n_gen / res.decode_s : 0, n,
                res.n_cached, pre, stopped ? ", stopped" : "", dim ? "\033[0m" : "");
    }
    lily_outparse_free(t.p);
    lily_sb_free(&t.content);
    free(ids);
}

/* The first word of in is a command: runs it. Returns 1 to leave the chat. */
static int command(chat *ch, const char *in) {
    size_t w = strcspn(in, " \t");
    const char *arg = in + w;
    arg += strspn(arg, " \t");
#define IS(name) (w == strlen(name) && !strncmp(in, name, w))
    if (IS("/bye") || IS("/exit") || IS("/quit")) return 1;
    if (IS("/help")) {
        chat_help(stdout);
    } else if (IS("/clear") || IS("/reset")) {
        cJSON_Delete(ch->hist);
        ch->hist = new_history(ch->system);
        fprintf(stderr, "(conversation cleared)\n");
    } else if (IS("/system")) {
        free(ch->system);
        ch->system = strdup(arg);
        cJSON_Delete(ch->hist);
        ch->hist = new_history(ch->system);
        fprintf(stderr, "(system prompt %s; conversation cleared)\n", arg[0] ? "set" : "removed");
    } else if (IS("/save") || IS("/load")) {
        if (!arg[0]) {
            fprintf(stderr, "lily chat: %.*s needs a file name\n", (int)w, in);
        } else if (IS("/save")) {
            save(ch->hist, arg);
        } else {
            cJSON *h = load(arg, &ch->system);
            if (h) cJSON_Delete(ch->hist), ch->hist = h;
        }
    } else {
        fprintf(stderr,
                "lily chat: unknown command '%.*s' (/help lists them; //text sends "
                "/text)\n",
                (int)w, in);
    }
#undef IS
    return 0;
}

int lily_cmd_chat(int argc, char **argv) {
    chat ch = {.ga = {.n_new = 0, .think = -1, .temp = -1, .top_p = -1, .min_p = -1, .top_k = -1}};
    lily_clichat_opts co = {.cache_bytes = (size_t)1 << 30};
    const char *histfile = NULL;
    const char *system = NULL;
    lily_arg eng[LILY_CLI_ENGINE_N];
    lily_cli_engine_table(&ch.ga.eng, eng);
    const lily_arg own[] = {
        {.name = "--system", .kind = LILY_ARG_STR, .dst = &system, .help = "system prompt"},
        {.name = "--history", .kind = LILY_ARG_STR, .dst = &histfile, .help = "history file"},
        {0}};
    const lily_arg *tabs[] = {own, lily_chat_table(&co, &ch.ga, 0), eng};
    const int pr = lily_args_parse("chat", tabs, 3, argc, argv, NULL, 0, NULL, usage);
    if (pr) return lily_args_exit(pr);
    lily_chat_apply(&ch.ga, &co);
    if (system) ch.system = strdup(system);
    char mbuf[4096];
    if (co.model_dir && !(co.model_dir = lily_cli_model(co.model_dir, mbuf, sizeof mbuf))) {
        free(ch.system);
        return 1;
    }
    if (!co.model_dir) {
        usage(stderr);
        free(ch.system);
        return 2;
    }
    lily_err e;
    if (lily_clichat_open(&co, &ch.c, &e)) {
        fprintf(stderr, "lily chat: %s\n", e.msg);
        free(ch.system);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: a read at the prompt returns on Ctrl-C */
    sigaction(SIGINT, &sa, NULL);
    char defhist[4096] = "";
    if (!histfile && getenv("HOME"))
        snprintf(defhist, sizeof defhist, "%s/.lily_history", getenv("HOME"));
    lily_line *ln = lily_line_open(
        histfile ? (histfile[0] ? histfile : NULL) : (defhist[0] ? defhist : NULL), &g_interrupt);
    if (isatty(0) && isatty(1)) {
        lily_clichat_banner(&ch.c, co.model_dir, "lily chat", stderr);
        fprintf(stderr, "/help for commands, Ctrl-D or /bye to leave\n");
    }
    ch.hist = new_history(ch.system);
    ch.seed = ch.ga.seed_set ? (uint64_t)ch.ga.seed : (uint64_t)time(NULL);
    char *in;
    int r;
    while ((r = read_input(ln, &in)) != 0) {
        if (r < 0) continue; /* Ctrl-C: the line is gone, a fresh prompt */
        int leave = 0;
        if (in[0] == '/' && in[1] != '/')
            leave = command(&ch, in);
        else if (in[0])
            answer(&ch, in[0] == '/' ? in + 1 : in);
        free(in);
        if (leave) break;
    }
    lily_line_close(ln);
    cJSON_Delete(ch.hist);
    free(ch.system);
    lily_clichat_close(&ch.c);
    return 0;
}
