/* Safetensors parser and shard set: valid files written by st_write round-trip exactly (random
 * data, odd shapes, every dtype); every malformed header is rejected with a message naming the
 * file and, where there is one, the tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "model/safetensors.h"
#include "model/st_write.h"

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *detail) {
    if (ok)
        n_pass++;
    else
        n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

static uint64_t rng = 0x1234567887654321ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Parses a header given as JSON text with data_len bytes of random data after it. Expects
 * failure with `want` in the message (or success when want is NULL). */
static void expect_header(const char *what, const char *json, size_t data_len, const char *want) {
    size_t hl = strlen(json), size = 8 + hl + data_len;
    unsigned char *buf = malloc(size);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (unsigned char)next();
    lily_st_file f;
    lily_err err = {{0}};
    int rc = lily_st_parse(buf, size, "bad.safetensors", &f, &err);
    if (want) {
        int ok = rc != 0 && strstr(err.msg, want) && strstr(err.msg, "bad.safetensors");
        check(ok, what, err.msg[0] ? err.msg : "(accepted)");
    } else {
        check(rc == 0, what, rc ? err.msg : "accepted");
        lily_st_close(&f);
    }
    free(buf);
}

static void test_malformed(void) {
    lily_st_file f;
    lily_err err = {{0}};
    unsigned char tiny[5] = {1, 2, 3, 4, 5};
    check(lily_st_parse(tiny, sizeof tiny, "bad.safetensors", &f, &err) != 0 &&
              strstr(err.msg, "truncated"),
          "5-byte file rejected", err.msg);
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    check(lily_st_parse(big, sizeof big, "bad.safetensors", &f, &err) != 0 &&
              strstr(err.msg, "past the end"),
          "header length beyond the file rejected", err.msg);
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    check(lily_st_parse(huge, sizeof huge, "bad.safetensors", &f, &err) != 0,
          "header length 2^63 rejected", err.msg);

    expect_header("valid two-tensor header accepted",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                  "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[12,24]}}",
                  24, NULL);
    expect_header("bad JSON", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],", 12, "not valid JSON");
    expect_header("header not an object", "[1,2,3]", 0, "not a JSON object");
    expect_header("offsets beyond the data",
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, "\"w\"");
    expect_header("end before begin",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 12, "end");
    expect_header("byte size != shape x dtype",
                  "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
                  "needs 16");
    expect_header("unknown dtype",
                  "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                  "unknown dtype \"Q4_K\"");
    expect_header("duplicate names",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
                  8, "twice");
    expect_header("negative dim",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4,
                  "shape[0]");
    expect_header("fractional dim",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4,
                  "shape[0]");
    expect_header("shape product overflows",
                  "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],"
                  "\"data_offsets\":[0,4]}}",
                  4, "overflows");
    expect_header("dtype missing", "{\"w\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_header("shape not an array",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, "shape");
    expect_header("offsets not a pair",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", 8, "pair");
    expect_header("offsets not numbers",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[\"0\",4]}}", 8,
                  "data_offsets");
    expect_header("entry not an object", "{\"w\":5}", 0, "not an object");
    expect_header("__metadata__ not an object", "{\"__metadata__\":[1]}", 0, "__metadata__");
    expect_header("__metadata__ skipped",
                  "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"I8\",\"shape\":[4],"
                  "\"data_offsets\":[0,4]}}",
                  4, NULL);
    expect_header("9 dimensions rejected",
                  "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                  1, "dimensions");
}

/* Writes tensors of every dtype with odd shapes, reopens, compares everything. */
static void test_roundtrip(const char *dir) {
    lily_st_entry ent[LILY_ST_N_DTYPES + 2];
    void *data[LILY_ST_N_DTYPES + 2];
    char names[LILY_ST_N_DTYPES + 2][32];
    int n = 0;
    for (int d = 0; d < LILY_ST_N_DTYPES; d++, n++) {
        snprintf(names[n], sizeof names[n], "layer.%d.w\"q", d); /* a quote to test escaping */
        ent[n] = (lily_st_entry){names[n], (lily_st_dtype)d, 3, {3, 1 + d % 4, 7}};
    }
    snprintf(names[n], sizeof names[n], "scalar");
    ent[n] = (lily_st_entry){names[n], LILY_ST_F32, 0, {0}};
    n++;
    snprintf(names[n], sizeof names[n], "empty");
    ent[n] = (lily_st_entry){names[n], LILY_ST_BF16, 2, {0, 5}};
    n++;
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)lily_st_entry_bytes(&ent[i]);
        unsigned char *p = malloc(nb ? nb : 1);
        for (size_t j = 0; j < nb; j++)
            p[j] = (unsigned char)next();
        data[i] = p;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    lily_err err = {{0}};
    int rc = lily_st_write_file(path, ent, (const void *const *)data, n, &err);
    check(rc == 0, "write file", err.msg);
    lily_st_file f;
    rc = lily_st_open(path, &f, &err);
    check(rc == 0, "reopen", err.msg);
    if (rc == 0) {
        int same = f.n_tensors == n;
        for (int i = 0; same && i < n; i++) {
            const lily_st_tensor *t = &f.tensors[i];
            same = !strcmp(t->name, ent[i].name) && t->dtype == ent[i].dtype &&
                   t->ndim == ent[i].ndim && t->nbytes == lily_st_entry_bytes(&ent[i]) &&
                   !memcmp(t->data, data[i], (size_t)t->nbytes);
            for (int d = 0; same && d < t->ndim; d++)
                same = t->shape[d] == ent[i].shape[d];
        }
        char msg[64];
        snprintf(msg, sizeof msg, "%d tensors", f.n_tensors);
        check(same, "names, dtypes, shapes and bytes round-trip", msg);
        check(f.header_len % 8 == 0, "header padded to 8 bytes", NULL);
        lily_st_close(&f);
    }
    /* The same directory as a set (single model.safetensors), then truncated. */
    lily_st_set *s = NULL;
    rc = lily_st_set_open(dir, &s, &err);
    check(rc == 0 && lily_st_count(s) == n && lily_st_find(s, "scalar") && !lily_st_find(s, "nope"),
          "set over model.safetensors, lookup by name", err.msg);
    lily_st_set_free(s);
    truncate(path, 100);
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "model.safetensors"), "truncated file rejected", err.msg);
    unlink(path);
    for (int i = 0; i < n; i++)
        free(data[i]);
}

static void write_shard(const char *dir, const char *name, const char *t1, const char *t2) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    lily_st_entry ent[2] = {{t1, LILY_ST_BF16, 2, {3, 5}}, {t2, LILY_ST_F32, 1, {7}}};
    unsigned char a[30], b[28];
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = (unsigned char)next();
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (unsigned char)next();
    const void *data[2] = {a, b};
    lily_st_write_file(path, ent, data, 2, NULL);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_sets(const char *dir) {
    lily_err err = {{0}};
    lily_st_set *s = NULL;
    int rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "no *.safetensors"), "empty directory rejected", err.msg);
    write_shard(dir, "b.safetensors", "x.1", "x.2");
    write_shard(dir, "a.safetensors", "y.1", "y.2");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc == 0 && lily_st_n_files(s) == 2 && lily_st_count(s) == 4 &&
              strstr(lily_st_path_of(s, lily_st_find(s, "x.2")), "b.safetensors") &&
              strstr(lily_st_file_at(s, 0)->path, "a.safetensors"),
          "scan without index: both shards, sorted, lookup", err.msg);
    lily_st_set_free(s);
    write_text(
        dir, "model.safetensors.index.json",
        "{\"metadata\":{},\"weight_map\":{\"x.1\":\"b.safetensors\",\"x.2\":\"b.safetensors\","
        "\"y.1\":\"a.safetensors\",\"y.2\":\"a.safetensors\"}}");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc == 0 && lily_st_count(s) == 4 && lily_st_find(s, "y.1"), "index with two shards",
          err.msg);
    lily_st_set_free(s);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x.1\":\"a.safetensors\",\"y.1\":\"a.safetensors\"}}");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "\"x.1\""), "index naming the wrong shard rejected", err.msg);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x.1\":\"missing.safetensors\"}}");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "missing.safetensors"), "index naming a missing file",
          err.msg);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"x.1\":\"../b\"}}");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0, "index naming a path outside the directory rejected", err.msg);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": 3");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "index.json"), "bad index JSON rejected", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    write_shard(dir, "c.safetensors", "x.1", "z.2");
    rc = lily_st_set_open(dir, &s, &err);
    check(rc != 0 && strstr(err.msg, "\"x.1\"") && strstr(err.msg, "c.safetensors"),
          "duplicate tensor across shards rejected", err.msg);
    const char *files[] = {"a.safetensors", "b.safetensors", "c.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
}

/* bf16 keeps 8 significant bits: round to nearest is within 2^-8 relative. */
static int bf16_close(float back, float f) {
    if (isinf(back)) return fabsf(f) > 3.38e38f;
    if (fabsf(f) < 1.2e-38f) return fabsf(back - f) < 1e-40f; /* subnormal: absolute */
    return fabsf(back - f) <= fabsf(f) * (1.0f / 256.0f);
}

static void test_convert(void) {
    int ok = 1;
    for (int i = 0; i < 1000 && ok; i++) {
        union {
            uint32_t u;
            float f;
        } v = {(uint32_t)next()};
        if (v.f != v.f) continue;
        uint16_t h = lily_st_f32_bf16(v.f);
        float back = lily_st_bf16_f32(h);
        ok = back == back && bf16_close(back, v.f);
    }
    check(ok, "bf16 round trip within half an ulp", NULL);
    check(lily_st_f16_f32(0x3c00) == 1.0f && lily_st_f16_f32(0xc000) == -2.0f &&
              lily_st_f16_f32(0x0001) == 5.9604644775390625e-8f &&
              lily_st_f16_f32(0x7bff) == 65504.0f,
          "f16 to f32 (normal, subnormal, max)", NULL);
}

int main(void) {
    char dir[] = "/tmp/lily_test_st_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_malformed();
    test_roundtrip(dir);
    test_sets(dir);
    test_convert();
    rmdir(dir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
