/* Runs on several slots of one lily_gen, stepped together (lily_gen_begin / lily_gen_prefill /
 * lily_gen_step, as `lily serve`'s scheduler does), against each request run alone with
 * lily_gen_run: the same tokens, log-probabilities, text and finish reason for seeded sampling,
 * penalties, a stop string, logprobs and a token budget, with more requests than slots, prompts
 * prefilled in chunks while other slots decode, and one run cancelled midway. Then the prefix
 * cache shared by the slots: a second conversation with the same system prompt, on another slot,
 * reuses the prefix the first one prefilled. Twice: sampling on the host (every slot in the
 * rows step), and with the CPU backend's draw ops (LILY_SAMPLE_ON_BACKEND: the plain seeded
 * requests draw on the backend, pipelined, their steps batched into one rows draw step
 * (lily_session_draw_enqueue_rows), as on CUDA, while the ones with penalties or logprobs go
 * through the rows step with host draws). On models/tiny-trained (skipped, 77, without it), with the
 * CPU backend, or the CUDA one with LILY_TEST_BACKEND=cuda. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/gen.h"

#define MODEL   "models/tiny-trained"
#define NREQ    7
#define MAX_TOK 96

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    printf("%-72s %s\n", what, ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

typedef struct {
    int32_t ids[MAX_TOK];
    float lp[MAX_TOK];
    int n;
    char text[4096];
    size_t tlen;
    int cancel_after; /* tokens after which the run is cancelled (0 = never) */
} collect;

static int on_text(void *ud, const lily_gen_token *t, const char *text, size_t len) {
    collect *c = ud;
    if (t && c->n < MAX_TOK) {
        c->ids[c->n] = t->id;
        c->lp[c->n++] = t->logprob;
    }
    if (c->tlen + len < sizeof c->text) {
        memcpy(c->text + c->tlen, text, len);
        c->tlen += len;
        c->text[c->tlen] = 0;
    }
    return 0;
}

static int cancelled(void *ud) {
    const collect *c = ud;
    return c->cancel_after && c->n >= c->cancel_after;
}

static char *stop_dot[] = {"."};

/* Request i: its prompt (ids, borrowed) and sampling. */
static lily_gen_req request(int i, const int32_t *ids, int n, collect *c) {
    lily_gen_req r = {.prompt = ids,
                      .n_prompt = n,
                      .ban_id = -1,
                      .max_new = 24 + 9 * i,
                      .ud = c,
                      .on_text = on_text,
                      .cancelled = cancelled};
    r.sp = lily_sampler_params_default();
    r.sp.temperature = i == 3 ? 0.0f : 0.7f + 0.1f * (float)(i % 3);
    r.sp.seed = 100 + (uint64_t)i;
    if (i == 1) r.sp.frequency_penalty = 0.6f;
    if (i == 2) r.sp.top_p = 0.9f;
    if (i == 4) r.stop = stop_dot, r.n_stop = 1;
    r.logprobs = i == 2 || i == 5;
    r.top_logprobs = i == 5 ? 3 : 0;
    return r;
}

static int32_t *encode(lily_tokenizer *tok, const char *s, int *n) {
    int32_t *ids;
    size_t nn;
    lily_err e;
    if (lily_tokenizer_encode(tok, s, strlen(s), &ids, &nn, &e)) {
        printf("encode: %s\n", e.msg);
        exit(1);
    }
    *n = (int)nn;
    return ids;
}

static const char *const texts[NREQ] = {
    "<|im_start|>user\nWhat does ls do?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nDefine the word river.<|im_end|>\n<|im_start|>assistant\n",
    "The python module os provides",
    "<|im_start|>user\nWhat is grep?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nDescribe the tar command in detail, with its options for creating, "
    "listing and extracting archives, compression with gzip, bzip2 and xz, and the ways to "
    "exclude files from an archive.<|im_end|>\n<|im_start|>assistant\n",
    "NAME\n       cp - copy files and directories\n\nSYNOPSIS\n",
    "<|im_start|>user\nTell me about the man command.<|im_end|>\n<|im_start|>assistant\n",
};

/* Runs every request on the slots of g, stepped together; request 6 is cancelled after 5
 * tokens. */
static void batched(lily_gen *g, int32_t **ids, const int *n, collect *c, lily_gen_result *res) {
    lily_gen_req rq[NREQ];
    int on[8], next = 0, busy = 0, steps = 0;
    for (int i = 0; i < 8; i++)
        on[i] = -1;
    for (;;) {
        while (next < NREQ) { /* idle slots take the next requests */
            const int slot = lily_gen_pick(g, ids[next], n[next]);
            if (slot < 0) break;
            rq[next] = request(next, ids[next], n[next], &c[next]);
            lily_gen_begin(g, slot, &rq[next], &res[next]);
            on[slot] = next++;
        }
        int rows[8], nr = 0;
        busy = 0;
        for (int s = 0; s < lily_gen_slots(g); s++) {
            if (on[s] < 0) continue;
            busy++;
            if (lily_gen_slot_phase(g, s) == LILY_GEN_PREFILL) lily_gen_prefill(g, s);
            if (lily_gen_slot_phase(g, s) == LILY_GEN_DECODE) rows[nr++] = s;
        }
        if (!busy) break;
        if (nr) lily_gen_step(g, rows, nr), steps++;
        for (int s = 0; s < lily_gen_slots(g); s++)
            if (on[s] >= 0 && lily_gen_slot_phase(g, s) == LILY_GEN_IDLE) {
                lily_gen_slot_finish_turn(g, s);
                on[s] = -1;
            }
    }
    printf("batched: %d requests on %d slots in %d steps\n", NREQ, lily_gen_slots(g), steps);
}

static lily_backend_kind g_backend = LILY_BACKEND_CPU; /* LILY_TEST_BACKEND=cuda: CUDA */

static int run_all(lily_sample_on on) {
    lily_err e;
    lily_engine *eng;
    lily_tokenizer *tok;
    lily_engine_opts eo = {.backend = g_backend, .n_threads = 1, .sample_on = on};
    if (lily_engine_open(MODEL, &eo, &eng, &e) || lily_tokenizer_open(MODEL, &tok, &e)) {
        printf("open: %s\n", e.msg);
        return 1;
    }
    printf("-- sampling on the %s\n", on == LILY_SAMPLE_ON_BACKEND ? "backend" : "host");
    int32_t *ids[NREQ];
    int n[NREQ];
    for (int i = 0; i < NREQ; i++)
        ids[i] = encode(tok, texts[i], &n[i]);
    /* alone: one slot, no cache; the same prefill chunks as the slots' */
    lily_gen_opts ao = {.max_ctx = 1024, .slots = 1, .prefill_chunk = 8};
    lily_gen_opts bo = {.max_ctx = 1024, .slots = 3, .prefill_chunk = 8};
    lily_gen *ga, *gb;
    if (lily_gen_create(eng, tok, &ao, &ga, &e) || lily_gen_create(eng, tok, &bo, &gb, &e)) {
        printf("gen: %s\n", e.msg);
        return 1;
    }
    static collect ca[NREQ], cb[NREQ];
    memset(ca, 0, sizeof ca);
    memset(cb, 0, sizeof cb);
    lily_gen_result ra[NREQ], rb[NREQ];
    for (int i = 0; i < NREQ; i++) {
        if (i == 6) ca[i].cancel_after = 5;
        lily_gen_req r = request(i, ids[i], n[i], &ca[i]);
        lily_gen_run(ga, &r, &ra[i]);
        lily_gen_finish_turn(ga);
        lily_gen_reset(ga);
    }
    cb[6].cancel_after = 5;
    batched(gb, ids, n, cb, rb);
    for (int i = 0; i < NREQ; i++) {
        const collect *a = &ca[i], *b = &cb[i];
        char what[128];
        snprintf(what, sizeof what, "request %d: %d tokens, finish %s, the same batched", i, a->n,
                 ra[i].finish);
        const int same = a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) &&
                         !memcmp(a->lp, b->lp, (size_t)a->n * sizeof *a->lp) &&
                         a->tlen == b->tlen && !memcmp(a->text, b->text, a->tlen) &&
                         !strcmp(ra[i].finish, rb[i].finish) && ra[i].n_gen == rb[i].n_gen;
        check(same && a->n > 0, what);
    }
    check(!strcmp(rb[6].finish, "cancelled") && cb[6].n == 5, "the cancelled run stopped at 5");
    check(rb[4].stop_hit == 1 && !strchr(cb[4].text, '.'), "the stop string ended its run");
    check(rb[2].n_gen > 0 && cb[2].lp[0] < 0, "logprobs filled");

    /* the prefix cache across slots: the system prompt prefilled by one slot serves another */
    lily_gen_opts co = {.max_ctx = 1024, .slots = 2, .cache_bytes = 64u << 20};
    lily_gen *gc;
    if (lily_gen_create(eng, tok, &co, &gc, &e)) {
        printf("gen: %s\n", e.msg);
        return 1;
    }
    const char *sys = "<|im_start|>system\nYou are a careful assistant for the command line. "
                      "Answer briefly and name the manual page.<|im_end|>\n";
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s<|im_start|>user\nWhat is ls?<|im_end|>\n<|im_start|>assistant\n",
             sys);
    snprintf(p2, sizeof p2, "%s<|im_start|>user\nWhat is cp?<|im_end|>\n<|im_start|>assistant\n",
             sys);
    int n1, n2, ns;
    int32_t *i1 = encode(tok, p1, &n1), *i2 = encode(tok, p2, &n2), *is = encode(tok, sys, &ns);
    collect c1 = {0}, c2 = {0};
    lily_gen_result r1, r2;
    lily_gen_req q1 = request(0, i1, n1, &c1), q2 = request(1, i2, n2, &c2);
    const int s1 = lily_gen_pick(gc, i1, n1);
    lily_gen_begin(gc, s1, &q1, &r1);
    while (lily_gen_slot_phase(gc, s1) == LILY_GEN_PREFILL)
        lily_gen_prefill(gc, s1);
    const int s2 = lily_gen_pick(gc, i2, n2); /* s1 is busy decoding */
    lily_gen_begin(gc, s2, &q2, &r2);
    check(s2 >= 0 && s2 != s1 && r2.n_cached == ns,
          "a second conversation on the other slot resumed after the shared system prompt");
    while (lily_gen_slot_phase(gc, s2) == LILY_GEN_PREFILL)
        lily_gen_prefill(gc, s2);
    const int both[2] = {s1, s2};
    while (lily_gen_slot_phase(gc, s1) != LILY_GEN_IDLE ||
           lily_gen_slot_phase(gc, s2) != LILY_GEN_IDLE)
        lily_gen_step(gc, both, 2);
    check(strcmp(r1.finish, "error") && strcmp(r2.finish, "error") && r1.n_gen > 0 && r2.n_gen > 0,
          "both ran to the end");
    int entries;
    size_t bytes;
    lily_gen_cache_stats(gc, &entries, &bytes);
    check(entries >= 3 && bytes > 0, "one cache for both slots");

    free(i1), free(i2), free(is);
    for (int i = 0; i < NREQ; i++)
        free(ids[i]);
    lily_gen_free(ga);
    lily_gen_free(gb);
    lily_gen_free(gc);
    lily_tokenizer_free(tok);
    lily_engine_close(eng);
    return 0;
}

int main(void) {
    if (access(MODEL "/model.safetensors", R_OK)) {
        printf("skipped: no %s\n", MODEL);
        return 77;
    }
    const char *be = getenv("LILY_TEST_BACKEND");
    if (be && !strcmp(be, "cuda")) g_backend = LILY_BACKEND_CUDA;
    printf("backend %s\n", g_backend == LILY_BACKEND_CUDA ? "cuda" : "cpu");
    if (run_all(LILY_SAMPLE_ON_HOST) || run_all(LILY_SAMPLE_ON_BACKEND)) return 1;
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
