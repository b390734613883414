/* The engine and its sessions: the public API of lily.h over a model and a backend.
 *
 * The engine owns the loaded model and one backend instance. A session owns a backend state and
 * the logits of its last position; prefill splits the input into chunks of at most
 * opts.prefill_chunk tokens so working memory does not grow with the prompt. Snapshots are
 * backend states holding exactly the positions consumed so far, plus the logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/err.h"
#include "model/model.h"
#include "model/stats.h"

struct lily_engine {
    lily_model *model;
    const lily_backend_ops *ops;
    lily_backend *be;
    lily_engine_opts opts;
    lily_model_info info;
    int draws;        /* sessions draw with the backend's draw ops (opts.sample_on) */
    char device[128]; /* info.device */
};

struct lily_session {
    lily_engine *eng;
    lily_bstate *st;
    int pos, max_ctx;
    float *logits; /* [V] */
    int has_logits;
    int unread; /* pipelined draws enqueued and not yet read (lily_session_draw_enqueue) */
    int chain;  /* the last call was lily_session_draw_enqueue: token < 0 may follow */
};

/* Before any call other than the pipelined draws: their unread tokens are dropped. */
static void settle(lily_session *s) {
    if (s->unread) s->eng->ops->draw_discard(s->eng->be, s->st);
    s->unread = 0;
    s->chain = 0;
}

struct lily_snapshot {
    lily_engine *eng;
    lily_bstate *st;
    int pos;
    float *logits;
    int has_logits;
    size_t bytes;
};

static uint64_t mat_bytes(const lily_mat *m) {
    return (uint64_t)m->rows * lily_mat_row_bytes(m);
}
static uint64_t mat_elems(const lily_mat *m) {
    return (uint64_t)m->rows * (uint64_t)m->cols;
}

/* The CPU's model name from /proc/cpuinfo ("model name", else "Hardware"), or "unknown CPU". */
static void cpu_name(char *buf, size_t len) {
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon || (strncmp(line, "model name", 10) && strncmp(line, "Hardware", 8))) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = 0;
        if (*v) snprintf(buf, len, "%s", v);
        break;
    }
    fclose(f);
}

static void fill_info(lily_engine *eng) {
    const lily_model *m = eng->model;
    const lily_config *c = &m->cfg;
    lily_model_info *in = &eng->info;
    in->model_type = c->model_type;
    in->layout = m->layout;
    in->quant = m->quant;
    in->backend = eng->ops->name;
    in->file_bytes = lily_model_file_bytes(m);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    in->n_threads = eng->opts.n_threads > 0 ? eng->opts.n_threads : online > 0 ? (int)online : 1;
    if (in->n_threads > 256) in->n_threads = 256;
    if (eng->ops->device_name)
        eng->ops->device_name(eng->be, eng->device, sizeof eng->device);
    else
        cpu_name(eng->device, sizeof eng->device);
    in->device = eng->device;
    in->vocab_size = c->vocab;
    in->hidden_size = c->hidden;
    in->n_layers = c->n_layers;
    for (int l = 0; l < c->n_layers; l++)
        in->n_attn_layers += c->layer_is_attn[l];
    in->n_experts = c->is_moe ? c->n_experts : 0;
    in->n_experts_used = c->is_moe ? c->top_k : 0;
    in->max_position = c->max_position;
    memcpy(in->eos_ids, c->eos_ids, sizeof in->eos_ids);
    in->n_params = m->n_params;
    in->weight_bytes = m->weight_bytes;
    /* bytes read per decoded token: every dense matrix, k of E experts, one embedding row */
    uint64_t b = mat_bytes(&m->lm_head) + lily_mat_row_bytes(&m->embed), w = 0;
#define ACT(mat) (b += mat_bytes(mat), w += mat_elems(mat))
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *ly = &m->layers[l];
        if (ly->is_attn) {
            ACT(&ly->q_proj), ACT(&ly->k_proj), ACT(&ly->v_proj), ACT(&ly->o_proj);
        } else {
            ACT(&ly->qkv_proj), ACT(&ly->z_proj), ACT(&ly->b_proj), ACT(&ly->a_proj);
            ACT(&ly->out_proj);
        }
        if (c->is_moe) {
            ACT(&ly->router);
            for (int k = 0; k < c->top_k; k++)
                ACT(&ly->exp_gate[0]), ACT(&ly->exp_up[0]), ACT(&ly->exp_down[0]);
            if (c->shared_inter > 0)
                ACT(&ly->sh_gate), ACT(&ly->sh_up), ACT(&ly->sh_down), ACT(&ly->sh_gate_w);
        } else {
            ACT(&ly->mlp_gate), ACT(&ly->mlp_up), ACT(&ly->mlp_down);
        }
    }
#undef ACT
    in->bytes_per_token = b;
    in->flops_per_token = 2 * w;
    in->lm_head_flops = 2 * mat_elems(&m->lm_head);
    in->attn_flops_per_ctx = (uint64_t)in->n_attn_layers * 4 * c->n_q_heads * c->head_dim;
    lily_model_stats st; /* the state sizes, as lily info reports them */
    lily_model_stats_get(m, &st);
    in->kv_bytes_per_token = st.kv_bytes_per_token;
    in->recurrent_state_bytes = st.recurrent_state_bytes;
}

int lily_engine_open(const char *dir, const lily_engine_opts *opts, lily_engine **out,
                     lily_err *err) {
    *out = NULL;
    lily_engine *eng = lily_xcalloc(1, sizeof *eng);
    if (opts) eng->opts = *opts;
    const lily_engine_opts *o = &eng->opts;
    if ((unsigned)o->precision > LILY_PRECISION_FAST ||
        (unsigned)o->cpu_isa > LILY_CPU_ISA_SCALAR ||
        (unsigned)o->sample_on > LILY_SAMPLE_ON_HOST) {
        lily_fail(err, "engine options: precision %d, cpu_isa %d or sample_on %d is out of range",
                  (int)o->precision, (int)o->cpu_isa, (int)o->sample_on);
        free(eng);
        return -1;
    }
    eng->ops = lily_backend_get(eng->opts.backend, err);
    if (!eng->ops) {
        free(eng);
        return -1;
    }
    if (eng->opts.prefill_chunk <= 0) eng->opts.prefill_chunk = eng->ops->prefill_chunk;
    eng->draws = eng->ops->draw_enqueue &&
                 (o->sample_on == LILY_SAMPLE_ON_BACKEND ||
                  (o->sample_on == LILY_SAMPLE_ON_AUTO && eng->ops->draws_by_default));
    if (lily_model_load(dir, &eng->model, err) != 0) {
        free(eng);
        return -1;
    }
    if (eng->ops->open(eng->model, &eng->opts, &eng->be, err) != 0) {
        lily_model_free(eng->model);
        free(eng);
        return -1;
    }
    fill_info(eng);
    *out = eng;
    return 0;
}

void lily_engine_close(lily_engine *eng) {
    if (!eng) return;
    eng->ops->close(eng->be);
    lily_model_free(eng->model);
    free(eng);
}

const lily_model_info *lily_engine_info(const lily_engine *eng) {
    return &eng->info;
}

size_t lily_engine_session_bytes(const lily_engine *eng, int max_ctx) {
    return eng->ops->state_bytes(eng->be, max_ctx);
}

size_t lily_engine_device_used(const lily_engine *eng) {
    return eng->ops->device_used ? eng->ops->device_used(eng->be) : 0;
}

int lily_session_create(lily_engine *eng, int max_ctx, lily_session **out, lily_err *err) {
    *out = NULL;
    int cap = eng->model->cfg.max_position;
    if (max_ctx <= 0) max_ctx = cap < 4096 ? cap : 4096;
    if (max_ctx > cap)
        return lily_fail(err, "context of %d exceeds the model's max_position_embeddings %d",
                         max_ctx, cap);
    lily_session *s = lily_xcalloc(1, sizeof *s);
    s->eng = eng;
    s->max_ctx = max_ctx;
    if (eng->ops->state_create(eng->be, max_ctx, &s->st, err) != 0) {
        free(s);
        return -1;
    }
    s->logits = lily_xaligned((size_t)eng->model->cfg.vocab * sizeof(float));
    *out = s;
    return 0;
}

void lily_session_free(lily_session *s) {
    if (!s) return;
    settle(s);
    s->eng->ops->state_free(s->eng->be, s->st);
    free(s->logits);
    free(s);
}

int lily_session_pos(const lily_session *s) {
    return s->pos;
}
int lily_session_max_ctx(const lily_session *s) {
    return s->max_ctx;
}

void lily_session_reset(lily_session *s) {
    settle(s);
    s->eng->ops->state_reset(s->eng->be, s->st);
    s->pos = 0;
    s->has_logits = 0;
}

int lily_session_prefill(lily_session *s, const int32_t *tokens, int n, float *all_logits,
                         lily_prefill_cb cb, void *ud, lily_err *err) {
    lily_engine *eng = s->eng;
    int V = eng->model->cfg.vocab, chunk = eng->opts.prefill_chunk;
    if (n <= 0) return lily_fail(err, "prefill of %d tokens", n);
    settle(s);
    if (s->pos + n > s->max_ctx)
        return lily_fail(err, "context overflow: %d tokens in the session + %d new exceed %d",
                         s->pos, n, s->max_ctx);
    for (int done = 0; done < n;) {
        int m = n - done < chunk ? n - done : chunk;
        float *dst = all_logits ? all_logits + (size_t)done * V : s->logits;
        if (eng->ops->forward(eng->be, s->st, tokens + done, m, s->pos, dst, all_logits != NULL,
                              err) != 0)
            return -1;
        s->pos += m;
        done += m;
        s->has_logits = 1;
        if (all_logits)
            memcpy(s->logits, all_logits + (size_t)(done - 1) * V, (size_t)V * sizeof(float));
        if (cb && done < n && cb(ud, done, n)) return lily_fail(err, "cancelled");
    }
    if (cb) cb(ud, n, n);
    return 0;
}

int lily_session_decode(lily_session *s, int32_t token, lily_err *err) {
    settle(s);
    if (s->pos + 1 > s->max_ctx)
        return lily_fail(err, "context overflow: the session holds its maximum of %d tokens",
                         s->max_ctx);
    if (s->eng->ops->forward(s->eng->be, s->st, &token, 1, s->pos, s->logits, 0, err) != 0)
        return -1;
    s->pos++;
    s->has_logits = 1;
    return 0;
}

int lily_session_decode_rows(lily_session *const *ss, const int32_t *tokens, int n, lily_err *err) {
    if (!ss || !tokens || n < 1 || n > LILY_MAX_ROWS)
        return lily_fail(err, "decode rows: %d rows (1 to %d)", n, LILY_MAX_ROWS);
    lily_engine *eng = ss[0]->eng;
    int V = eng->model->cfg.vocab;
    for (int i = 0; i < n; i++) {
        lily_session *s = ss[i];
        if (s->eng != eng) return lily_fail(err, "decode rows: sessions of different engines");
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return lily_fail(err, "decode rows: session %d appears twice", i);
        if (s->pos + 1 > s->max_ctx)
            return lily_fail(err, "context overflow: the session holds its maximum of %d tokens",
                             s->max_ctx);
        if (tokens[i] < 0 || tokens[i] >= V)
            return lily_fail(err, "token id %d out of range [0, %d)", tokens[i], V);
    }
    if (!eng->ops->forward_rows || n == 1) {
        for (int i = 0; i < n; i++)
            if (lily_session_decode(ss[i], tokens[i], err) != 0) return -1;
        return 0;
    }
    lily_bstate *st[LILY_MAX_ROWS];
    int pos[LILY_MAX_ROWS];
    float *lg[LILY_MAX_ROWS];
    for (int i = 0; i < n; i++) {
        settle(ss[i]);
        st[i] = ss[i]->st;
        pos[i] = ss[i]->pos;
        lg[i] = ss[i]->logits;
    }
    if (eng->ops->forward_rows(eng->be, st, tokens, pos, n, lg, err) != 0) return -1;
    for (int i = 0; i < n; i++) {
        ss[i]->pos++;
        ss[i]->has_logits = 1;
    }
    return 0;
}

int lily_session_can_decode_sample(const lily_session *s) {
    return s->eng->draws;
}

static int draw_check(lily_session *s, const lily_draw *d, lily_err *err) {
    if (!s->eng->draws)
        return lily_fail(err, "the %s backend does not draw tokens in this engine (sample_on)",
                         s->eng->ops->name);
    if (!d) return lily_fail(err, "draw: no settings");
    if (isnan(d->temperature) || isinf(d->temperature) || isnan(d->top_p) || isnan(d->min_p))
        return lily_fail(err, "draw: temperature, top_p and min_p must be numbers");
    if (s->pos + 1 > s->max_ctx)
        return lily_fail(err, "context overflow: the session holds its maximum of %d tokens",
                         s->max_ctx);
    return 0;
}

int lily_session_draw_enqueue(lily_session *s, int32_t token, const lily_draw *d, lily_err *err) {
    if (draw_check(s, d, err)) return -1;
    if (token < 0 && !s->chain)
        return lily_fail(err, "draw: token < 0 needs a draw enqueued by the previous call");
    if (s->unread >= LILY_DRAW_AHEAD)
        return lily_fail(err, "draw: %d draws are enqueued and unread", LILY_DRAW_AHEAD);
    if (d->allow && s->unread) /* its mask was made from every token before it */
        return lily_fail(err, "draw: a masked step needs the %d unread draws read first",
                         s->unread);
    if (s->eng->ops->draw_enqueue(s->eng->be, s->st, token, s->pos, d, err) != 0) {
        settle(s); /* whatever got enqueued: its position is not counted, its draws dropped */
        return -1;
    }
    s->pos++;
    s->unread++;
    s->chain = 1;
    s->has_logits = 0; /* they stay on the device */
    return 0;
}

int lily_session_draw_enqueue_rows(lily_session *const *ss, const int32_t *tokens,
                                   const lily_draw *d, int n, lily_err *err) {
    if (!ss || !tokens || !d || n < 1 || n > LILY_MAX_ROWS)
        return lily_fail(err, "draw rows: %d rows (1 to %d)", n, LILY_MAX_ROWS);
    lily_engine *eng = ss[0]->eng;
    const int V = eng->model->cfg.vocab;
    for (int i = 0; i < n; i++) {
        lily_session *s = ss[i];
        if (s->eng != eng) return lily_fail(err, "draw rows: sessions of different engines");
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return lily_fail(err, "draw rows: session %d appears twice", i);
        if (draw_check(s, &d[i], err)) return -1;
        if (d[i].allow)
            return lily_fail(err, "draw rows: row %d has a mask (masked steps go one at a time)",
                             i);
        if (tokens[i] >= V) return lily_fail(err, "token id %d out of range [0, %d)", tokens[i], V);
        if (tokens[i] < 0 && !s->chain)
            return lily_fail(err, "draw: token < 0 needs a draw enqueued by the previous call");
        if (s->unread >= LILY_DRAW_AHEAD)
            return lily_fail(err, "draw: %d draws are enqueued and unread", LILY_DRAW_AHEAD);
    }
    if (!eng->ops->draw_enqueue_rows || n == 1) {
        for (int i = 0; i < n; i++)
            if (lily_session_draw_enqueue(ss[i], tokens[i], &d[i], err) != 0) return -1;
        return 0;
    }
    lily_bstate *st[LILY_MAX_ROWS];
    int pos[LILY_MAX_ROWS];
    for (int i = 0; i < n; i++) {
        st[i] = ss[i]->st;
        pos[i] = ss[i]->pos;
    }
    if (eng->ops->draw_enqueue_rows(eng->be, st, tokens, pos, n, d, err) != 0) {
        for (int i = 0; i < n; i++)
            settle(ss[i]);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        ss[i]->pos++;
        ss[i]->unread++;
        ss[i]->chain = 1;
        ss[i]->has_logits = 0;
    }
    return 0;
}

int lily_session_draw_next(lily_session *s, int32_t *next, lily_err *err) {
    if (!next) return lily_fail(err, "draw: no output");
    if (!s->unread) return lily_fail(err, "draw: nothing enqueued to read");
    if (s->eng->ops->draw_next(s->eng->be, s->st, next, err) != 0) return -1;
    s->unread--;
    if (*next < 0)
        return lily_fail(err, "draw: no drawable logit (all NaN, -inf, excluded or banned)");
    return 0;
}

int lily_session_decode_sample(lily_session *s, int32_t token, const lily_draw *d, int32_t *next,
                               lily_err *err) {
    if (!next) return lily_fail(err, "decode_sample: no output");
    if (token < 0) return lily_fail(err, "decode_sample: token id %d", token);
    if (draw_check(s, d, err)) return -1;
    settle(s);
    if (lily_session_draw_enqueue(s, token, d, err)) return -1;
    int rc = lily_session_draw_next(s, next, err);
    s->chain = 0;
    return rc;
}

static int32_t argmax_f(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int lily_session_decode_greedy(lily_session *s, int32_t token, int n, int32_t *out, lily_err *err) {
    if (n < 1) return lily_fail(err, "greedy decode of %d tokens", n);
    settle(s);
    if (s->pos + n > s->max_ctx)
        return lily_fail(err, "context overflow: %d + %d tokens exceed the session's %d", s->pos, n,
                         s->max_ctx);
    const lily_backend_ops *ops = s->eng->ops;
    int V = s->eng->model->cfg.vocab;
    if (ops->decode_greedy) {
        if (ops->decode_greedy(s->eng->be, s->st, token, s->pos, n, out, s->logits, err) != 0)
            return -1;
        s->pos += n;
        s->has_logits = 1;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (lily_session_decode(s, i ? out[i - 1] : token, err) != 0) return -1;
        out[i] = argmax_f(s->logits, V);
    }
    return 0;
}

const float *lily_session_logits(lily_session *s) {
    return s->has_logits ? s->logits : NULL;
}

int lily_session_snapshot(lily_session *s, lily_snapshot **out, lily_err *err) {
    lily_engine *eng = s->eng;
    *out = NULL;
    settle(s);
    lily_snapshot *snap = lily_xcalloc(1, sizeof *snap);
    int cap = s->pos > 0 ? s->pos : 1;
    if (eng->ops->state_create(eng->be, cap, &snap->st, err) != 0) {
        free(snap);
        return -1;
    }
    if (eng->ops->state_copy(eng->be, snap->st, s->st, s->pos, err) != 0) {
        eng->ops->state_free(eng->be, snap->st);
        free(snap);
        return -1;
    }
    size_t V = (size_t)eng->model->cfg.vocab;
    snap->eng = eng;
    snap->pos = s->pos;
    snap->has_logits = s->has_logits;
    snap->logits = lily_xmalloc(V * sizeof(float));
    memcpy(snap->logits, s->logits, V * sizeof(float));
    snap->bytes = eng->ops->state_bytes(eng->be, cap) + V * sizeof(float);
    *out = snap;
    return 0;
}

int lily_session_restore(lily_session *s, const lily_snapshot *snap, lily_err *err) {
    if (snap->eng != s->eng) return lily_fail(err, "snapshot belongs to another engine");
    if (snap->pos > s->max_ctx)
        return lily_fail(err, "snapshot of %d positions does not fit a context of %d", snap->pos,
                         s->max_ctx);
    settle(s);
    if (s->eng->ops->state_copy(s->eng->be, s->st, snap->st, snap->pos, err) != 0) return -1;
    s->pos = snap->pos;
    s->has_logits = snap->has_logits;
    memcpy(s->logits, snap->logits, (size_t)s->eng->model->cfg.vocab * sizeof(float));
    return 0;
}

int lily_snapshot_pos(const lily_snapshot *snap) {
    return snap->pos;
}
int lily_snapshot_has_logits(const lily_snapshot *snap) {
    return snap->has_logits;
}
size_t lily_snapshot_bytes(const lily_snapshot *snap) {
    return snap->bytes;
}

void lily_snapshot_free(lily_snapshot *snap) {
    if (!snap) return;
    snap->eng->ops->state_free(snap->eng->be, snap->st);
    free(snap->logits);
    free(snap);
}
