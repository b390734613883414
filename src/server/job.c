/* Job preparation on the connection thread: prompt rendering, tokenization, the context check and
 * sampling parameters (api.md §2.1, §2.2, §6.3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "server/srv.h"
#include "server/toolgram.h"

static uint64_t random_u64(void) {
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    if (f) fclose(f);
    return x;
}

void lily_job_random_id(char *out, const char *prefix) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t a = random_u64(), b = random_u64();
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    for (int i = 0; i < 24; i++) {
        uint64_t *r = i < 12 ? &a : &b;
        out[n + (size_t)i] = alnum[*r % 62];
        *r /= 62;
    }
    out[n + 24] = 0;
}

static int ends_with(const char *s, size_t n, const char *suf) {
    size_t k = strlen(suf);
    return n >= k && !memcmp(s + n - k, suf, k);
}

/* Does the prompt end inside an open <think> block (only whitespace after it)? */
static int think_open(const char *s, size_t n) {
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        n--;
    return ends_with(s, n, "<think>");
}

/* Renders the chat prompt. Returns a malloc'd string or NULL with e (400 for template errors). */
static char *render_chat(lily_srv *s, lily_request *r, size_t *len, int *open, lily_api_error *e) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(ctx, "messages", r->messages);
    if (r->tools) cJSON_AddItemReferenceToObject(ctx, "tools", r->tools);
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", !r->prefill);
    const cJSON *kw;
    cJSON_ArrayForEach(kw, r->kwargs) {
        if (!cJSON_GetObjectItemCaseSensitive(ctx, kw->string))
            cJSON_AddItemReferenceToObject(ctx, kw->string, (cJSON *)kw);
    }
    if (r->thinking < 0 && r->grammar) /* constrained output: no think block unless asked */
        cJSON_AddBoolToObject(ctx, "enable_thinking", 0);
    else if (r->thinking < 0 && s->opts.reasoning >= 0)
        cJSON_AddBoolToObject(ctx, "enable_thinking", s->opts.reasoning);
    char *out = NULL;
    lily_err err;
    int rc = lily_template_render(s->tmpl, ctx, &out, len, &err);
    cJSON_Delete(ctx);
    if (rc) {
        lily_api_bad(e, "invalid_value", "messages",
                     "the chat template rejected the "
                     "conversation: %s",
                     err.msg);
        return NULL;
    }
    *open = think_open(out, *len);
    if (r->prefill) {
        /* continue the last assistant message: drop its end-of-turn, and reopen the think
         * block when it has reasoning but no content yet */
        while (*len && out[*len - 1] == '\n')
            (*len)--;
        *len -= lily_gen_eos_suffix(s->gen, out, *len);
        const cJSON *last = cJSON_GetArrayItem(r->messages, cJSON_GetArraySize(r->messages) - 1);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(last, "content");
        size_t n = *len;
        while (n && out[n - 1] == '\n')
            n--;
        if (cJSON_IsString(c) && !c->valuestring[0] && ends_with(out, n, "</think>")) {
            *len = n - strlen("</think>");
            while (*len && out[*len - 1] == '\n')
                (*len)--;
            *open = 1;
        } else {
            *open = 0;
        }
        out[*len] = 0;
    }
    return out;
}

static int tokenize(lily_srv *s, const char *text, size_t len, int32_t **ids, int *n,
                    lily_api_error *e) {
    size_t nn;
    lily_err err;
    if (lily_tokenizer_encode(s->tok, text, len, ids, &nn, &err))
        return lily_api_bad(e, "invalid_value", "messages", "cannot tokenize the prompt: %s",
                            err.msg);
    *n = (int)nn;
    return 0;
}

static void sampling(lily_srv *s, const lily_request *r, lily_sampler_params *sp) {
    *sp = s->defaults;
    if (r->given & LILY_GIVEN_TEMPERATURE) sp->temperature = r->temperature;
    if (r->given & LILY_GIVEN_TOP_P) sp->top_p = r->top_p;
    if (r->given & LILY_GIVEN_TOP_K) sp->top_k = r->top_k;
    if (r->given & LILY_GIVEN_MIN_P) sp->min_p = r->min_p;
    if (r->given & LILY_GIVEN_PRESENCE) sp->presence_penalty = r->presence_penalty;
    if (r->given & LILY_GIVEN_FREQUENCY) sp->frequency_penalty = r->frequency_penalty;
    if (r->given & LILY_GIVEN_REPEAT) sp->repeat_penalty = r->repeat_penalty;
    sp->seed = r->has_seed ? r->seed : random_u64();
}

/* tool_choice required / named: the output is the tool-call grammar (toolgram.h), which takes the
 * place of a response_format grammar. */
static int tool_grammar(lily_srv *s, lily_request *r, lily_api_error *e) {
    if (!r->tools || (r->tool_choice != LILY_TOOLS_REQUIRED && r->tool_choice != LILY_TOOLS_NAMED))
        return 0;
    if (s->tool_call_tok < 0 || s->tool_end_tok < 0) return 0; /* force_tokens opens the call */
    lily_grammar *g;
    if (lily_toolgram_build(r->tools, r->tool_choice == LILY_TOOLS_NAMED ? r->tool_name : NULL,
                            r->parallel_tool_calls, s->xml_tools, s->tool_call_tok, s->tool_end_tok,
                            &g, e))
        return -1;
    lily_grammar_free(r->grammar);
    r->grammar = g;
    return 0;
}

/* Tokens that open a tool call for tool_choice required / named, when no grammar enforces it. */
static void force_tokens(lily_srv *s, lily_job *j) {
    const lily_request *r = &j->req;
    if (!r->tools || r->grammar ||
        (r->tool_choice != LILY_TOOLS_REQUIRED && r->tool_choice != LILY_TOOLS_NAMED))
        return;
    lily_sb t = {0};
    lily_sb_puts(&t, "<tool_call>\n");
    if (r->tool_choice == LILY_TOOLS_NAMED) {
        if (s->xml_tools) {
            lily_sb_printf(&t, "<function=%s>\n", r->tool_name);
        } else {
            lily_sb_puts(&t, "{\"name\": ");
            lily_sb_json_str(&t, r->tool_name, strlen(r->tool_name));
            lily_sb_puts(&t, ", \"arguments\": ");
        }
    }
    size_t n;
    lily_err e;
    if (!lily_tokenizer_encode(s->tok, t.data, t.len, &j->force_ids, &n, &e)) j->n_force = (int)n;
    lily_sb_free(&t);
}

lily_job *lily_job_new(lily_srv *s, lily_task task) {
    lily_job *j = lily_xcalloc(1, sizeof *j);
    j->srv = s;
    j->task = task;
    j->refs = 1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->created = (long)time(NULL);
    j->state = JOB_QUEUED;
    return j;
}

lily_job *lily_job_prepare(lily_srv *s, lily_request *r, lily_api_error *e) {
    lily_job *j = lily_job_new(s, r->kind == LILY_REQ_CHAT ? TASK_CHAT : TASK_COMPLETION);
    if (lily_job_fill(s, j, r, e)) {
        lily_job_release(j);
        return NULL;
    }
    return j;
}

int lily_job_fill(lily_srv *s, lily_job *j, lily_request *r, lily_api_error *e) {
    if (s->opts.strict_model && r->model[0] && strcmp(r->model, s->model_id)) {
        lily_api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                      "The model '%s' does not exist (this server serves '%s')", r->model,
                      s->model_id);
        lily_request_free(r);
        return -1;
    }
    j->req = *r;
    memset(r, 0, sizeof *r);
    r = &j->req;
    lily_job_random_id(j->id, r->kind == LILY_REQ_CHAT ? "chatcmpl-" : "cmpl-");
    int rc = 0;
    if (r->kind == LILY_REQ_CHAT) {
        size_t len;
        char *text = tool_grammar(s, r, e) ? NULL : render_chat(s, r, &len, &j->thinking_open, e);
        rc = text ? tokenize(s, text, len, &j->prompt, &j->n_prompt, e) : -1;
        free(text);
        if (!rc) force_tokens(s, j);
        if (!rc && r->thinking_budget >= 0 && j->thinking_open) {
            /* the end-of-thinking sequence injected when the budget runs out (api.md §2.1.8) */
            static const char close[] = "\n</think>\n\n";
            size_t nb;
            lily_err te;
            if (!lily_tokenizer_encode(s->tok, close, strlen(close), &j->budget_ids, &nb, &te))
                j->n_budget = (int)nb;
        }
    } else if (r->prompt) {
        rc = tokenize(s, r->prompt, strlen(r->prompt), &j->prompt, &j->n_prompt, e);
        if (r->echo) j->echo = lily_xstrdup(r->prompt);
    } else {
        j->n_prompt = r->n_prompt_ids;
        j->prompt = lily_xmalloc((size_t)(j->n_prompt ? j->n_prompt : 1) * sizeof *j->prompt);
        memcpy(j->prompt, r->prompt_ids, (size_t)j->n_prompt * sizeof *j->prompt);
        int32_t nv = lily_tokenizer_vocab_size(s->tok);
        for (int i = 0; i < j->n_prompt && !rc; i++)
            if (j->prompt[i] >= nv)
                rc = lily_api_bad(e, "invalid_value", "prompt",
                                  "token id %d is outside the "
                                  "vocabulary",
                                  j->prompt[i]);
        if (!rc && r->echo) { /* echo the prompt as text, as for a string prompt */
            char *text = NULL;
            size_t tl = 0;
            lily_err te;
            if (lily_tokenizer_decode(s->tok, j->prompt, (size_t)j->n_prompt, &text, &tl, &te))
                rc = lily_api_bad(e, "invalid_value", "prompt", "cannot decode the prompt: %s",
                                  te.msg);
            else
                j->echo = text;
        }
    }
    if (!rc && j->n_prompt == 0)
        rc = lily_api_bad(e, "invalid_value", r->kind == LILY_REQ_CHAT ? "messages" : "prompt",
                          "the prompt is empty");
    if (!rc && j->n_prompt >= s->ctx) {
        rc = lily_api_bad(e, "context_length_exceeded",
                          r->kind == LILY_REQ_CHAT ? "messages" : "prompt",
                          "This model's maximum context length is %d tokens. However, your "
                          "messages resulted in %d tokens. Please reduce the length of the "
                          "messages.",
                          s->ctx, j->n_prompt);
        e->n_prompt_tokens = j->n_prompt;
        e->n_ctx = s->ctx;
    }
    if (rc) return -1;
    if (r->grammar) { /* the matcher, past a continued assistant message's content */
        lily_err me;
        if (lily_gmatch_create(r->grammar, s->trie, NULL, &j->match, &me)) {
            rc = lily_api_fail(e, 500, "server_error", NULL, NULL, "grammar: %s", me.msg);
        } else if (r->prefill && !j->thinking_open) {
            const cJSON *last =
                cJSON_GetArrayItem(r->messages, cJSON_GetArraySize(r->messages) - 1);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(last, "content");
            if (cJSON_IsString(c) &&
                lily_gmatch_accept_bytes(j->match, c->valuestring, strlen(c->valuestring)))
                rc = lily_api_bad(e, "invalid_value", "messages",
                                  "the assistant message to continue does not match the "
                                  "constrained output (response_format or tool_choice)");
        }
    }
    if (rc) return -1;
    /* the output budget: what was asked, clipped to the rest of the context (api.md §2.1) and to
     * --max-tokens-cap; a clipped request finishes with "length" */
    int room = s->ctx - j->n_prompt;
    j->max_new = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
    if (s->opts.max_tokens_cap > 0 && j->max_new > s->opts.max_tokens_cap)
        j->max_new = s->opts.max_tokens_cap;
    sampling(s, r, &j->sp);
    return 0;
}

void lily_job_release(lily_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    if (j->api && j->api->free) j->api->free(j->api_state);
    lily_request_free(&j->req);
    free(j->prompt);
    free(j->echo);
    free(j->force_ids);
    free(j->budget_ids);
    lily_gmatch_free(j->match);
    lily_sb_free(&j->out);
    lily_sb_free(&j->body);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

int lily_job_cancelled(lily_job *j) {
    return __atomic_load_n(&j->cancelled, __ATOMIC_RELAXED) ||
           __atomic_load_n(&j->srv->shutdown, __ATOMIC_RELAXED);
}
