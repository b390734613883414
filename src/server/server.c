/* `lily serve` start-up and shutdown (see server.h): loads the engine, tokenizer, chat template
 * and generation defaults, starts the inference thread and the HTTP front, and stops on
 * SIGINT/SIGTERM. */
#include "server/server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "base/progress.h"
#include "server/reqlog.h"
#include "server/srv.h"

static volatile int g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* Sampling defaults from generation_config.json (vLLM does the same; api.md §2.1.4). */
static void load_defaults(lily_srv *s) {
    s->defaults = lily_sampler_params_default();
    char path[4096];
    char *text = NULL;
    if (lily_path_join(path, sizeof path, s->opts.model_dir, "generation_config.json") ||
        lily_read_file(path, 1 << 20, &text, NULL, NULL))
        return;
    cJSON *j = cJSON_Parse(text);
    free(text);
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"temperature", offsetof(lily_sampler_params, temperature)},
        {"top_p", offsetof(lily_sampler_params, top_p)},
        {"min_p", offsetof(lily_sampler_params, min_p)},
        {"repetition_penalty", offsetof(lily_sampler_params, repeat_penalty)},
        {"presence_penalty", offsetof(lily_sampler_params, presence_penalty)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i].key);
        if (cJSON_IsNumber(v))
            *(float *)((char *)&s->defaults + keys[i].off) = (float)v->valuedouble;
    }
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "top_k");
    if (cJSON_IsNumber(k)) s->defaults.top_k = (int)k->valuedouble;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(j, "do_sample");
    if (cJSON_IsFalse(ds)) s->defaults.temperature = 0;
    cJSON_Delete(j);
}

int lily_server_main(const lily_server_opts *o) {
    lily_srv *s = lily_xcalloc(1, sizeof *s);
    s->opts = *o;
    if (!s->opts.max_body) s->opts.max_body = 32u << 20;
    if (!s->opts.snapshot_mem) s->opts.snapshot_mem = (size_t)2 << 30;
    if (s->opts.request_timeout <= 0) s->opts.request_timeout = 600;
    if (s->opts.max_conns <= 0) s->opts.max_conns = 2048;
    if (s->opts.conns_per_ip <= 0) s->opts.conns_per_ip = 256;
    if (s->opts.conn_requests <= 0) s->opts.conn_requests = 100;
    if (s->opts.header_timeout <= 0) s->opts.header_timeout = 10;
    if (s->opts.body_timeout <= 0) s->opts.body_timeout = 60;
    if (s->opts.body_timeout < s->opts.header_timeout)
        s->opts.body_timeout = s->opts.header_timeout;
    if (s->opts.send_timeout <= 0) s->opts.send_timeout = 30;
    if (!s->opts.send_buffer) s->opts.send_buffer = (size_t)4 << 20;
    if (!s->opts.tls_cert != !s->opts.tls_key) {
        fprintf(stderr, "lily serve: --tls-cert and --tls-key go together\n");
        free(s);
        return 2;
    }
    lily_metrics_init(&s->metrics);
    s->log_format = o->log_format ? o->log_format : o->quiet ? LILY_LOG_NONE : LILY_LOG_TEXT;
    s->created = (long)time(NULL);
    lily_err e;
    int rc = 1;
    lily_engine_opts eo = {.backend = o->backend,
                           .n_threads = o->threads,
                           .precision = o->precision,
                           .cpu_isa = o->cpu_isa,
                           .sample_on = o->sample_on};
    lily_bar bar = {0};
    if (!o->quiet && isatty(2)) eo.progress = lily_bar_update, eo.progress_ud = &bar;
    if (lily_engine_open(o->model_dir, &eo, &s->eng, &e) ||
        lily_tokenizer_open(o->model_dir, &s->tok, &e) ||
        lily_template_load(o->model_dir, &s->tmpl, &e)) {
        fprintf(stderr, "lily serve: %s\n", e.msg);
        goto out;
    }
    const lily_model_info *mi = lily_engine_info(s->eng);
    if (o->ctx > mi->max_position) {
        fprintf(stderr, "lily serve: --ctx %d is above the model's maximum context (%d)\n", o->ctx,
                mi->max_position);
        goto out;
    }
    s->ctx = o->ctx > 0 ? o->ctx : LILY_GEN_DEFAULT_CTX;
    if (s->ctx > mi->max_position) s->ctx = mi->max_position;
    /* slots: each holds a session of the full context */
    s->slots = o->parallel > 0 ? o->parallel : o->backend == LILY_BACKEND_CUDA ? 4 : 2;
    if (s->slots > LILY_MAX_ROWS) {
        fprintf(stderr, "lily serve: --parallel %d is above the limit of %d\n", s->slots,
                LILY_MAX_ROWS);
        goto out;
    }
    s->prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 512;
    if (!o->quiet) {
        char mem[32];
        lily_bar_bytes(mem, sizeof mem,
                       (size_t)s->slots * lily_engine_session_bytes(s->eng, s->ctx));
        fprintf(stderr, "lily serve: %d slots of %d tokens of context (%s of KV cache and state)\n",
                s->slots, s->ctx, mem);
    }
    if (o->model_id) {
        snprintf(s->model_id, sizeof s->model_id, "%s", o->model_id);
    } else {
        const char *d = o->model_dir;
        size_t n = strlen(d);
        while (n > 1 && d[n - 1] == '/')
            n--;
        size_t b = n;
        while (b && d[b - 1] != '/')
            b--;
        snprintf(s->model_id, sizeof s->model_id, "%.*s", (int)(n - b), d + b);
    }
    s->xml_tools = strstr(lily_template_source(s->tmpl), "<function=") != NULL;
    s->tool_call_tok = lily_tokenizer_token_to_id(s->tok, "<tool_call>");
    s->tool_end_tok = lily_tokenizer_token_to_id(s->tok, "</tool_call>");
    s->think_end_tok = lily_tokenizer_token_to_id(s->tok, "</think>");
    load_defaults(s);
    lily_gen_opts go = {.max_ctx = s->ctx,
                        .cache_bytes = s->opts.snapshot_mem,
                        .slots = s->slots,
                        .prefill_chunk = s->prefill_chunk};
    const int32_t *eos = NULL;
    int n_eos = 0;
    if (lily_gen_create(s->eng, s->tok, &go, &s->gen, &e) ||
        ((n_eos = lily_gen_eos_ids(s->gen, &eos)),
         lily_token_trie_from_tokenizer(s->tok, eos, (size_t)n_eos, &s->trie, &e)) ||
        lily_sched_start(s, &e)) {
        fprintf(stderr, "lily serve: %s\n", e.msg);
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rc = lily_http_serve(s, &g_stop, &e) ? 1 : 0;
    if (rc) fprintf(stderr, "lily serve: %s\n", e.msg);
    __atomic_store_n(&s->shutdown, 1, __ATOMIC_RELAXED);
    lily_sched_stop(s);
out:
    lily_gen_free(s->gen);
    lily_token_trie_free(s->trie);
    lily_template_free(s->tmpl);
    lily_tokenizer_free(s->tok);
    lily_engine_close(s->eng);
    lily_metrics_destroy(&s->metrics);
    free(s);
    return rc;
}
