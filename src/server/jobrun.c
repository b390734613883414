/* Running a job on the inference thread and writing its answer in the OpenAI shapes: SSE chunks
 * (api.md §2.4) or one JSON body (§2.3, §4), with usage, timings and logprobs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"
#include "gen/outparse.h"
#include "server/srv.h"

typedef struct lily_run {
    lily_srv *s;
    lily_job *j;
    int slot;       /* the generator's slot */
    lily_gen_req g; /* the run's request and result (the generator borrows them) */
    lily_gen_result res;
    int n_tok; /* tokens generated so far (for the slot's metrics) */
    int chat, stream;
    lily_outparse *parser; /* chat with parsed reasoning; NULL: raw text */
    lily_outmsg msg;       /* non-streaming chat answer */
    lily_sb text;          /* completions: the text (non-streaming) */
    lily_sb ev;            /* the event being built */
    int reasoning_tokens;
    int content_started, forced, budget_done;
    lily_sb lp; /* logprob entries (JSON, comma separated) not yet sent */
    int lp_n;
    /* completions logprobs arrays */
    lily_sb c_tok, c_lp, c_top, c_off;
    int c_n, c_offset;
} run;

int lily_run_tokens(const lily_run *u) {
    return u->n_tok;
}

lily_job *lily_run_job(const lily_run *u) {
    return u->j;
}

/* Appends bytes for the client. A stream whose client does not take them holds at most
 * --send-buffer bytes: beyond that the job is cancelled (the reader stopped reading). */
static void emit(run *u, const lily_sb *b) {
    lily_job *j = u->j;
    size_t cap = j->srv->opts.send_buffer;
    pthread_mutex_lock(&j->mu);
    if (j->req.stream && cap && j->out.len + b->len > cap) {
        j->overflow = 1;
        j->cancelled = 1;
    } else {
        lily_sb_append(&j->out, b->data ? b->data : "", b->len);
    }
    pthread_cond_broadcast(&j->cv);
    lily_job_wake(j);
    pthread_mutex_unlock(&j->mu);
}

/* JSON string of raw token bytes; invalid UTF-8 becomes U+FFFD. */
static void lossy_str(lily_sb *o, const char *s, size_t n) {
    lily_sb t = {0};
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        size_t m = 1;
        while (k && m < k && i + m < n && ((unsigned char)s[i + m] & 0xC0) == 0x80)
            m++;
        if (k && m == k) {
            lily_sb_append(&t, s + i, k);
            i += k;
        } else {
            lily_sb_puts(&t, "\xef\xbf\xbd");
            i += k && m > 1 ? m : 1;
        }
    }
    lily_sb_json_str(o, lily_sb_str(&t), t.len);
    lily_sb_free(&t);
}

static double finite_lp(float lp) {
    return isfinite(lp) ? lp : -9999.0;
}

static void token_json(run *u, lily_sb *o, int32_t id, float lp) {
    size_t n = 0;
    const char *b = lily_tokenizer_token_bytes(u->s->tok, id, &n);
    lily_sb_puts(o, "{\"token\":");
    lossy_str(o, b ? b : "", b ? n : 0);
    lily_sb_printf(o, ",\"logprob\":%.6g,\"bytes\":[", finite_lp(lp));
    for (size_t i = 0; i < n; i++)
        lily_sb_printf(o, "%s%u", i ? "," : "", (unsigned char)b[i]);
    lily_sb_putc(o, ']');
}

static void add_logprob(run *u, const lily_gen_token *t) {
    if (!u->chat) { /* legacy completions arrays */
        size_t n = 0;
        const char *b = lily_tokenizer_token_bytes(u->s->tok, t->id, &n);
        const char *sep = u->c_n ? "," : "";
        lily_sb_puts(&u->c_tok, sep);
        lossy_str(&u->c_tok, b ? b : "", b ? n : 0);
        lily_sb_printf(&u->c_lp, "%s%.6g", sep, finite_lp(t->logprob));
        lily_sb_printf(&u->c_off, "%s%d", sep, u->c_offset);
        u->c_offset += (int)n;
        lily_sb_printf(&u->c_top, "%s{", sep);
        for (int i = 0; i < t->n_top; i++) {
            const char *tb = lily_tokenizer_token_bytes(u->s->tok, t->top_ids[i], &n);
            if (i) lily_sb_putc(&u->c_top, ',');
            lossy_str(&u->c_top, tb ? tb : "", tb ? n : 0);
            lily_sb_printf(&u->c_top, ":%.6g", finite_lp(t->top_lp[i]));
        }
        lily_sb_putc(&u->c_top, '}');
        u->c_n++;
        return;
    }
    if (u->lp_n++) lily_sb_putc(&u->lp, ',');
    token_json(u, &u->lp, t->id, t->logprob);
    lily_sb_puts(&u->lp, ",\"top_logprobs\":[");
    for (int i = 0; i < t->n_top; i++) {
        if (i) lily_sb_putc(&u->lp, ',');
        token_json(u, &u->lp, t->top_ids[i], t->top_lp[i]);
        lily_sb_putc(&u->lp, '}');
    }
    lily_sb_puts(&u->lp, "]}");
}

/* The logprobs value of a choice: null, or the pending entries (which are then taken). */
static void logprobs_value(run *u, lily_sb *o) {
    if (!u->j->req.logprobs) {
        lily_sb_puts(o, "null");
        return;
    }
    if (!u->chat) {
        lily_sb_printf(o,
                       "{\"tokens\":[%s],\"token_logprobs\":[%s],\"top_logprobs\":[%s],"
                       "\"text_offset\":[%s]}",
                       lily_sb_str(&u->c_tok), lily_sb_str(&u->c_lp), lily_sb_str(&u->c_top),
                       lily_sb_str(&u->c_off));
        lily_sb_clear(&u->c_tok), lily_sb_clear(&u->c_lp), lily_sb_clear(&u->c_top);
        lily_sb_clear(&u->c_off);
        u->c_n = 0;
    } else {
        lily_sb_printf(o, "{\"content\":[%s],\"refusal\":null}", lily_sb_str(&u->lp));
        lily_sb_clear(&u->lp);
        u->lp_n = 0;
    }
}

static void chunk_head(run *u, lily_sb *o) {
    lily_job *j = u->j;
    lily_sb_printf(o, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->id,
                   u->chat ? "chat.completion.chunk" : "text_completion", j->created);
    lily_sb_json_str(o, u->s->model_id, strlen(u->s->model_id));
    lily_sb_puts(o, ",\"system_fingerprint\":\"lily\",\"choices\":[{\"index\":0,");
}

static void chunk_tail(run *u, lily_sb *o, const char *finish) {
    lily_sb_puts(o, ",\"logprobs\":");
    logprobs_value(u, o);
    if (finish)
        lily_sb_printf(o, ",\"finish_reason\":\"%s\"}]}\n\n", finish);
    else
        lily_sb_puts(o, ",\"finish_reason\":null}]}\n\n");
}

/* One streamed chat delta. */
static void stream_delta(run *u, const lily_delta *d) {
    lily_sb *o = &u->ev;
    lily_sb_clear(o);
    chunk_head(u, o);
    lily_sb_puts(o, "\"delta\":{");
    switch (d->kind) {
    case LILY_DELTA_REASONING:
        lily_sb_puts(o, u->j->req.reasoning_name ? "\"reasoning\":" : "\"reasoning_content\":");
        lily_sb_json_str(o, lily_sb_str(&d->text), d->text.len);
        break;
    case LILY_DELTA_CONTENT:
        lily_sb_puts(o, "\"content\":");
        lily_sb_json_str(o, lily_sb_str(&d->text), d->text.len);
        break;
    case LILY_DELTA_CALL:
        lily_sb_printf(o,
                       "\"tool_calls\":[{\"index\":%d,\"id\":\"%s\",\"type\":\"function\","
                       "\"function\":{\"name\":",
                       d->call, d->id);
        lily_sb_json_str(o, lily_sb_str(&d->text), d->text.len);
        lily_sb_puts(o, ",\"arguments\":\"\"}}]");
        break;
    case LILY_DELTA_ARGS:
        lily_sb_printf(o, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", d->call);
        lily_sb_json_str(o, lily_sb_str(&d->text), d->text.len);
        lily_sb_puts(o, "}}]");
        break;
    }
    lily_sb_putc(o, '}');
    if (d->kind == LILY_DELTA_CONTENT) {
        chunk_tail(u, o, NULL);
    } else { /* logprobs ride on content chunks only */
        lily_sb_puts(o, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
    emit(u, o);
}

static void take_deltas(run *u) {
    size_t n;
    const lily_delta *d = lily_outparse_deltas(u->parser, &n);
    if (u->j->api) { /* another API's shapes (anthropic.c, responses.c) */
        for (size_t i = 0; i < n; i++) {
            if (d[i].kind == LILY_DELTA_CONTENT) u->content_started = 1;
            lily_sb_clear(&u->ev);
            u->j->api->delta(u->j, &d[i], &u->ev);
            if (u->ev.len) emit(u, &u->ev);
        }
        lily_outparse_clear(u->parser);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i].kind == LILY_DELTA_CONTENT) u->content_started = 1;
        if (u->stream) stream_delta(u, &d[i]);
    }
    if (!u->stream) lily_outmsg_add(&u->msg, d, n);
    lily_outparse_clear(u->parser);
}

/* Text for the raw paths (completions, reasoning_format none). */
static void raw_text(run *u, const char *text, size_t len) {
    if (!len) return;
    u->content_started = 1;
    if (!u->stream) {
        lily_sb_append(u->chat ? &u->msg.content : &u->text, text, len);
        return;
    }
    lily_sb *o = &u->ev;
    lily_sb_clear(o);
    chunk_head(u, o);
    lily_sb_puts(o, u->chat ? "\"delta\":{\"content\":" : "\"text\":");
    lily_sb_json_str(o, text, len);
    if (u->chat) lily_sb_putc(o, '}');
    chunk_tail(u, o, NULL);
    emit(u, o);
}

static int cb_cancelled(void *ud) {
    lily_job *j = ((run *)ud)->j;
    if (j->deadline > 0 && lily_now() > j->deadline) j->timed_out = 1; /* --request-timeout */
    return j->timed_out || lily_job_cancelled(j);
}

static void cb_prefill(void *ud, int done, int total) {
    lily_job *j = ((run *)ud)->j;
    pthread_mutex_lock(&j->mu);
    j->prefill_done = done;
    j->prefill_total = total;
    pthread_mutex_unlock(&j->mu);
}

static int cb_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    run *u = ud;
    if (t) u->n_tok++;
    if (t && !u->j->t_first) u->j->t_first = lily_now();
    if (!u->parser) {
        if (t && u->j->req.logprobs) add_logprob(u, t);
        raw_text(u, text, len);
        return 0;
    }
    int was_reasoning = lily_outparse_in_reasoning(u->parser);
    int calls = lily_outparse_n_calls(u->parser);
    int was_call = lily_outparse_in_call(u->parser);
    if (t && was_reasoning) u->reasoning_tokens++;
    lily_outparse_feed(u->parser, text, len);
    if (!t) lily_outparse_finish(u->parser);
    if (t && u->j->req.logprobs && !was_reasoning && !was_call &&
        !lily_outparse_in_reasoning(u->parser) && !lily_outparse_in_call(u->parser) &&
        calls == lily_outparse_n_calls(u->parser))
        add_logprob(u, t);
    take_deltas(u);
    return lily_outparse_done(u->parser);
}

static int cb_force(void *ud, int32_t *ids, int max) {
    run *u = ud;
    lily_job *j = u->j;
    if (!u->budget_done && j->n_budget && u->parser && lily_outparse_in_reasoning(u->parser) &&
        u->reasoning_tokens >= j->req.thinking_budget) {
        u->budget_done = 1;
        int n = j->n_budget < max ? j->n_budget : max;
        memcpy(ids, j->budget_ids, (size_t)n * sizeof *ids);
        return n;
    }
    if (u->forced || !j->n_force || !u->parser || lily_outparse_in_reasoning(u->parser) ||
        u->content_started || lily_outparse_n_calls(u->parser))
        return 0;
    u->forced = 1;
    int n = j->n_force < max ? j->n_force : max;
    memcpy(ids, j->force_ids, (size_t)n * sizeof *ids);
    return n;
}

static void usage_json(run *u, lily_sb *o, const lily_gen_result *g) {
    lily_sb_printf(o,
                   "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d}",
                   g->n_prompt, g->n_gen, g->n_prompt + g->n_gen, g->n_cached);
    if (u->chat)
        lily_sb_printf(o, ",\"completion_tokens_details\":{\"reasoning_tokens\":%d}",
                       u->reasoning_tokens);
    lily_sb_putc(o, '}');
}

static void timings_json(lily_sb *o, const lily_gen_result *g) {
    double pms = g->prefill_s * 1e3, dms = g->decode_s * 1e3;
    lily_sb_printf(o,
                   "{\"cache_n\":%d,\"prompt_n\":%d,\"prompt_ms\":%.3f,"
                   "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
                   "\"predicted_per_second\":%.3f",
                   g->n_cached, g->n_prefilled, pms, pms > 0 ? g->n_prefilled / g->prefill_s : 0,
                   g->n_gen, dms, dms > 0 ? g->n_gen / g->decode_s : 0);
    if (g->grammar_s > 0) /* constrained: the grammar's share of predicted_ms */
        lily_sb_printf(o, ",\"grammar_ms\":%.3f", g->grammar_s * 1e3);
    lily_sb_putc(o, '}');
}

static void message_json(run *u, lily_sb *o) {
    lily_outmsg *m = &u->msg;
    lily_sb_puts(o, "{\"role\":\"assistant\",\"content\":");
    if (m->content.len)
        lily_sb_json_str(o, lily_sb_str(&m->content), m->content.len);
    else
        lily_sb_puts(o, "null");
    if (m->reasoning.len) {
        lily_sb_puts(o, u->j->req.reasoning_name ? ",\"reasoning\":" : ",\"reasoning_content\":");
        lily_sb_json_str(o, lily_sb_str(&m->reasoning), m->reasoning.len);
    }
    if (m->n_calls) {
        lily_sb_puts(o, ",\"tool_calls\":[");
        for (int i = 0; i < m->n_calls; i++) {
            lily_sb_printf(o, "%s{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":",
                           i ? "," : "", m->calls[i].id);
            lily_sb_json_str(o, lily_sb_str(&m->calls[i].name), m->calls[i].name.len);
            lily_sb_puts(o, ",\"arguments\":");
            lily_sb_json_str(o, lily_sb_str(&m->calls[i].args), m->calls[i].args.len);
            lily_sb_puts(o, "}}");
        }
        lily_sb_putc(o, ']');
    }
    lily_sb_puts(o, ",\"refusal\":null}");
}

static void finish_ok(run *u, const lily_gen_result *g) {
    if (u->j->api) {
        lily_sb_clear(&u->ev);
        u->j->api->finish(u->j, g, u->reasoning_tokens, &u->ev);
        emit(u, &u->ev);
        return;
    }
    const char *fr = g->finish;
    int calls = u->parser ? lily_outparse_n_calls(u->parser) : 0;
    if (strcmp(fr, "length") && calls > 0) fr = "tool_calls";
    lily_sb *o = &u->ev;
    lily_sb_clear(o);
    if (u->stream) {
        chunk_head(u, o);
        lily_sb_puts(o, u->chat ? "\"delta\":{}" : "\"text\":\"\"");
        chunk_tail(u, o, fr);
        if (u->j->req.include_usage) {
            lily_sb_printf(
                o, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", u->j->id,
                u->chat ? "chat.completion.chunk" : "text_completion", u->j->created);
            lily_sb_json_str(o, u->s->model_id, strlen(u->s->model_id));
            lily_sb_puts(o, ",\"system_fingerprint\":\"lily\",\"choices\":[],\"usage\":");
            usage_json(u, o, g);
            lily_sb_puts(o, ",\"timings\":");
            timings_json(o, g);
            lily_sb_puts(o, "}\n\n");
        }
        lily_sb_puts(o, "data: [DONE]\n\n");
    } else {
        lily_sb_printf(o, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", u->j->id,
                       u->chat ? "chat.completion" : "text_completion", u->j->created);
        lily_sb_json_str(o, u->s->model_id, strlen(u->s->model_id));
        lily_sb_puts(o, ",\"system_fingerprint\":\"lily\",\"choices\":[{\"index\":0,");
        if (u->chat) {
            lily_sb_puts(o, "\"message\":");
            message_json(u, o);
        } else {
            lily_sb_puts(o, "\"text\":");
            lily_sb tx = {0};
            if (u->j->echo) lily_sb_puts(&tx, u->j->echo);
            lily_sb_append(&tx, lily_sb_str(&u->text), u->text.len);
            lily_sb_json_str(o, lily_sb_str(&tx), tx.len);
            lily_sb_free(&tx);
        }
        lily_sb_puts(o, ",\"logprobs\":");
        logprobs_value(u, o);
        lily_sb_printf(o, ",\"finish_reason\":\"%s\"}],\"usage\":", fr);
        usage_json(u, o, g);
        lily_sb_puts(o, ",\"timings\":");
        timings_json(o, g);
        lily_sb_puts(o, "}");
    }
    emit(u, o);
}

static void finish_error(run *u, const lily_gen_result *g) {
    lily_api_error e;
    lily_api_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", g->error);
    lily_sb *o = &u->ev;
    lily_sb_clear(o);
    if (u->j->api) {
        u->j->api->error(u->j, e.message, o);
    } else {
        if (u->stream) lily_sb_puts(o, "data: ");
        lily_api_error_json(&e, o);
        if (u->stream) lily_sb_puts(o, "\n\n");
    }
    pthread_mutex_lock(&u->j->mu);
    u->j->status = 500;
    pthread_mutex_unlock(&u->j->mu);
    emit(u, o);
    fprintf(stderr, "lily serve: request %s failed: %s\n", u->j->id, g->error);
}

lily_run *lily_job_begin(lily_srv *s, lily_job *j, int slot) {
    run *u = lily_xcalloc(1, sizeof *u);
    u->s = s;
    u->j = j;
    u->slot = slot;
    lily_request *r = &j->req;
    u->chat = r->kind == LILY_REQ_CHAT;
    u->stream = r->stream;
    if (u->chat && !r->reasoning_raw) {
        lily_outparse_opts po = {
            .thinking = j->thinking_open,
            .tools = r->tools && r->tool_choice != LILY_TOOLS_NONE,
            .tool_defs = r->tools,
            .single_call = !r->parallel_tool_calls,
            .id_seed = j->sp.seed ^ 0xA5A5A5A5A5A5A5A5ull ^ (uint64_t)j->created,
        };
        u->parser = lily_outparse_create(&po);
    }
    if (j->api) {
        j->api->begin(j, &u->ev);
        emit(u, &u->ev);
    } else if (u->stream && u->chat) { /* role chunk first */
        chunk_head(u, &u->ev);
        lily_sb_puts(&u->ev,
                     "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                     "\"finish_reason\":null}]}\n\n");
        emit(u, &u->ev);
    }
    if (u->chat && r->reasoning_raw && j->thinking_open) raw_text(u, "<think>\n", 8);
    if (!u->chat && u->stream && j->echo) raw_text(u, j->echo, strlen(j->echo));
    u->g = (lily_gen_req){
        .prompt = j->prompt,
        .n_prompt = j->n_prompt,
        .sp = j->sp,
        .bias = r->bias,
        .n_bias = r->n_bias,
        .ban_id = u->chat && r->tools && r->tool_choice == LILY_TOOLS_NONE ? s->tool_call_tok : -1,
        .max_new = j->max_new,
        .stop = r->stop,
        .n_stop = r->n_stop,
        .logprobs = r->logprobs,
        .top_logprobs = r->logprobs ? r->top_logprobs : 0,
        .ud = u,
        .cancelled = cb_cancelled,
        .on_prefill = cb_prefill,
        .on_text = cb_text,
        .force = cb_force,
    };
    if (j->match) { /* constrained: the request's matcher over the server's trie */
        u->g.match = j->match;
        u->g.match_vocab = s->trie->n_vocab;
        /* a think block the prompt opened runs free; the grammar starts after </think> */
        u->g.match_after = u->chat && j->thinking_open ? s->think_end_tok : -1;
    }
    if (s->opts.request_timeout > 0) j->deadline = lily_now() + s->opts.request_timeout;
    lily_gen_begin(s->gen, slot, &u->g, &u->res);
    return u;
}

void lily_job_end(lily_run *u) {
    lily_srv *s = u->s;
    lily_job *j = u->j;
    lily_gen_result res = u->res;
    /* the wall-clock limit ends the answer as the token budget does (the text held back for a
     * possible stop string is dropped) */
    if (j->timed_out && !strcmp(res.finish, "cancelled") && !lily_job_cancelled(j))
        res.finish = "length";
    pthread_mutex_lock(&j->mu);
    j->cached_tokens = res.n_cached;
    j->prefill_tokens = res.n_prefilled;
    j->n_gen = res.n_gen;
    pthread_mutex_unlock(&j->mu);
    if (!strcmp(res.finish, "error"))
        finish_error(u, &res);
    else if (strcmp(res.finish, "cancelled"))
        finish_ok(u, &res);
    else if (!s->opts.quiet)
        fprintf(stderr,
                "lily serve: request %s cancelled by client after %d prompt / %d "
                "generated tokens\n",
                j->id, res.n_cached + res.n_prefilled, res.n_gen);
    pthread_mutex_lock(&j->mu);
    j->state = JOB_DONE;
    if (!j->status) j->status = 200;
    pthread_cond_broadcast(&j->cv);
    lily_job_wake(j);
    pthread_mutex_unlock(&j->mu);
    lily_gen_slot_finish_turn(s->gen, u->slot);

    lily_metrics *m = &s->metrics;
    int entries;
    size_t bytes;
    lily_gen_cache_stats(s->gen, &entries, &bytes);
    pthread_mutex_lock(&m->mu);
    m->generations++;
    m->cancelled += !strcmp(res.finish, "cancelled");
    m->prompt_tokens += (uint64_t)res.n_prompt;
    m->prefill_tokens += (uint64_t)res.n_prefilled;
    m->cached_tokens += (uint64_t)res.n_cached;
    m->cache_hits += res.n_cached > 0;
    m->generated_tokens += (uint64_t)res.n_gen;
    m->prefill_s += res.prefill_s;
    m->decode_s += res.decode_s;
    m->cache_entries = entries;
    m->cache_bytes = bytes;
    pthread_mutex_unlock(&m->mu);

    lily_outparse_free(u->parser);
    lily_outmsg_free(&u->msg);
    lily_sb_free(&u->text);
    lily_sb_free(&u->ev);
    lily_sb_free(&u->lp);
    lily_sb_free(&u->c_tok), lily_sb_free(&u->c_lp), lily_sb_free(&u->c_top),
        lily_sb_free(&u->c_off);
    free(u);
}
