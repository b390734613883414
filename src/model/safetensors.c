/* Safetensors parsing over a mapping, and the shard set of a model directory; see safetensors.h.
 *
 * Every number in the header is untrusted: shapes and offsets are checked as integers below 2^53
 * (exact in the double cJSON stores), products are overflow-checked, and the data range is checked
 * against the data section before any pointer into it is formed. */
#include "model/safetensors.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[LILY_ST_N_DTYPES] = {
    [LILY_ST_BOOL] = {"BOOL", 1},       [LILY_ST_U8] = {"U8", 1},
    [LILY_ST_I8] = {"I8", 1},           [LILY_ST_F8_E4M3] = {"F8_E4M3", 1},
    [LILY_ST_F8_E5M2] = {"F8_E5M2", 1}, [LILY_ST_U16] = {"U16", 2},
    [LILY_ST_I16] = {"I16", 2},         [LILY_ST_F16] = {"F16", 2},
    [LILY_ST_BF16] = {"BF16", 2},       [LILY_ST_U32] = {"U32", 4},
    [LILY_ST_I32] = {"I32", 4},         [LILY_ST_F32] = {"F32", 4},
    [LILY_ST_U64] = {"U64", 8},         [LILY_ST_I64] = {"I64", 8},
    [LILY_ST_F64] = {"F64", 8},
};

const char *lily_st_dtype_name(lily_st_dtype dt) {
    return (unsigned)dt < LILY_ST_N_DTYPES ? dtypes[dt].name : "?";
}

size_t lily_st_dtype_size(lily_st_dtype dt) {
    return (unsigned)dt < LILY_ST_N_DTYPES ? dtypes[dt].size : 0;
}

int lily_st_dtype_parse(const char *s, lily_st_dtype *out) {
    for (int i = 0; i < LILY_ST_N_DTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (lily_st_dtype)i;
            return 0;
        }
    return -1;
}

float lily_st_f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union {
        uint32_t u;
        float f;
    } v = {u};
    return v.f;
}

uint16_t lily_st_f32_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

uint64_t lily_st_numel(const lily_st_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (uint64_t)t->shape[i];
    return n;
}

const char *lily_st_shape_str(const lily_st_tensor *t, char *buf, size_t len) {
    size_t o = 0;
    if (len == 0) return buf;
    buf[0] = 0;
    o += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- name hash table (open addressing, power-of-two size) ------------------------------------ */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

typedef struct {
    const lily_st_tensor **slot;
    size_t cap;
} name_table;

static void table_init(name_table *t, size_t n) {
    t->cap = 16;
    while (t->cap < 2 * n + 2)
        t->cap *= 2;
    t->slot = lily_xcalloc(t->cap, sizeof *t->slot);
}

/* Inserts x; returns the tensor already holding that name, or NULL when inserted. */
static const lily_st_tensor *table_put(name_table *t, const lily_st_tensor *x) {
    size_t i = hash_str(x->name) & (t->cap - 1);
    while (t->slot[i]) {
        if (!strcmp(t->slot[i]->name, x->name)) return t->slot[i];
        i = (i + 1) & (t->cap - 1);
    }
    t->slot[i] = x;
    return NULL;
}

static const lily_st_tensor *table_get(const name_table *t, const char *name) {
    if (!t->slot) return NULL;
    size_t i = hash_str(name) & (t->cap - 1);
    while (t->slot[i]) {
        if (!strcmp(t->slot[i]->name, name)) return t->slot[i];
        i = (i + 1) & (t->cap - 1);
    }
    return NULL;
}

/* ---- one file ------------------------------------------------------------------------------ */

#define ST_MAX_INT 9007199254740992.0 /* 2^53: doubles are exact integers below this */

static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0 && d < ST_MAX_INT) || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int parse_tensor(const cJSON *e, lily_st_tensor *t, uint64_t data_size, lily_err *err) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e)) return lily_fail(err, "entry is not an object");
    if (!cJSON_IsString(dt)) return lily_fail(err, "missing or non-string \"dtype\"");
    if (lily_st_dtype_parse(dt->valuestring, &t->dtype))
        return lily_fail(err, "unknown dtype \"%.40s\"", dt->valuestring);
    if (!cJSON_IsArray(sh)) return lily_fail(err, "missing or non-array \"shape\"");
    int nd = cJSON_GetArraySize(sh);
    if (nd > LILY_ST_MAX_DIMS)
        return lily_fail(err, "%d dimensions (at most %d supported)", nd, LILY_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int zero = 0, i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        uint64_t v;
        if (json_uint(d, &v)) return lily_fail(err, "shape[%d] is not a non-negative integer", i);
        t->shape[i++] = (int64_t)v;
        if (v == 0)
            zero = 1;
        else if (numel > UINT64_MAX / v)
            return lily_fail(err, "shape overflows");
        else
            numel *= v;
    }
    if (zero) numel = 0;
    uint64_t es = lily_st_dtype_size(t->dtype);
    if (numel > UINT64_MAX / es) return lily_fail(err, "byte size overflows");
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return lily_fail(err, "\"data_offsets\" is not a pair");
    uint64_t b, en;
    if (json_uint(cJSON_GetArrayItem(off, 0), &b) || json_uint(cJSON_GetArrayItem(off, 1), &en))
        return lily_fail(err, "\"data_offsets\" are not non-negative integers");
    if (en < b)
        return lily_fail(err, "data_offsets end %llu < begin %llu", (unsigned long long)en,
                         (unsigned long long)b);
    if (en > data_size)
        return lily_fail(err, "data_offsets [%llu, %llu) beyond the data section (%llu bytes)",
                         (unsigned long long)b, (unsigned long long)en,
                         (unsigned long long)data_size);
    if (en - b != numel * es) {
        char shape[160];
        return lily_fail(err, "data_offsets span %llu bytes, but %s %s needs %llu",
                         (unsigned long long)(en - b), dt->valuestring,
                         lily_st_shape_str(t, shape, sizeof shape),
                         (unsigned long long)(numel * es));
    }
    t->nbytes = en - b;
    t->offset = b;
    return 0;
}

void lily_st_close(lily_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    lily_mmap_close(&f->map);
    memset(f, 0, sizeof *f);
}

int lily_st_parse(const unsigned char *buf, size_t size, const char *name, lily_st_file *f,
                  lily_err *err) {
    memset(f, 0, sizeof *f);
    if (size < 8)
        return lily_fail(err, "%s: truncated: %zu bytes, not even the 8-byte header length", name,
                         size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | buf[i];
    if (hl > size - 8)
        return lily_fail(err, "%s: header length %llu runs past the end of the file (%zu bytes)",
                         name, (unsigned long long)hl, size);
    if (hl > LILY_ST_MAX_HEADER)
        return lily_fail(err, "%s: header length %llu is implausibly large", name,
                         (unsigned long long)hl);
    if (hl < 2)
        return lily_fail(err, "%s: header of %llu bytes is not a JSON object", name,
                         (unsigned long long)hl);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hl);
    if (!root) return lily_fail(err, "%s: header is not valid JSON", name);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lily_fail(err, "%s: header is not a JSON object", name);
    }
    int n = cJSON_GetArraySize(root);
    f->tensors = lily_xcalloc((size_t)n, sizeof *f->tensors);
    f->header_len = hl;
    uint64_t data_size = size - 8 - hl;
    const unsigned char *data = buf + 8 + hl;
    name_table names;
    table_init(&names, (size_t)n);
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *key = e->string ? e->string : "";
        if (!strcmp(key, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                rc = lily_fail(err, "%s: __metadata__ is not an object", name);
                break;
            }
            continue;
        }
        lily_st_tensor *t = &f->tensors[f->n_tensors];
        if (parse_tensor(e, t, data_size, err)) {
            rc = lily_fail_prefix(err, "%s: tensor \"%.200s\"", name, key);
            break;
        }
        t->name = lily_xstrdup(key);
        t->data = data + t->offset;
        t->offset += 8 + hl;
        f->n_tensors++;
        if (table_put(&names, t)) {
            rc = lily_fail(err, "%s: tensor \"%.200s\" appears twice in the header", name, key);
            break;
        }
    }
    free(names.slot);
    cJSON_Delete(root);
    if (rc) {
        lily_st_close(f);
        return -1;
    }
    f->path = lily_xstrdup(name);
    return 0;
}

int lily_st_open(const char *path, lily_st_file *f, lily_err *err) {
    lily_mmap m;
    memset(f, 0, sizeof *f);
    if (lily_mmap_open(&m, path, err)) return -1;
    if (lily_st_parse(m.data, m.size, path, f, err)) {
        lily_mmap_close(&m);
        return -1;
    }
    f->map = m;
    return 0;
}

/* ---- the set of shards --------------------------------------------------------------------- */

struct lily_st_set {
    lily_st_file *files;
    int n_files;
    int n_tensors;
    name_table names;
};

static int set_add_file(lily_st_set *s, const char *dir, const char *fname, lily_err *err) {
    char path[4096];
    if (lily_path_join(path, sizeof path, dir, fname))
        return lily_fail(err, "%s/%s: path too long", dir, fname);
    for (int i = 0; i < s->n_files; i++)
        if (!strcmp(s->files[i].path, path)) return i;
    s->files = lily_xrealloc(s->files, (size_t)(s->n_files + 1) * sizeof *s->files);
    if (lily_st_open(path, &s->files[s->n_files], err)) return -1;
    return s->n_files++;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Shard files named by the index: the weight_map values, each once, in order of first use. */
static int set_from_index(lily_st_set *s, const char *dir, const char *index_path, cJSON **wm_out,
                          lily_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (lily_read_file(index_path, 64u << 20, &text, &len, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return lily_fail(err, "%s: not valid JSON", index_path);
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        cJSON_Delete(root);
        return lily_fail(err, "%s: missing or empty \"weight_map\" object", index_path);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/')) {
            lily_fail(err, "%s: weight_map[\"%.200s\"] is not a file name in the directory",
                      index_path, e->string ? e->string : "");
            cJSON_Delete(root);
            return -1;
        }
        if (set_add_file(s, dir, e->valuestring, err) < 0) {
            cJSON_Delete(root);
            return -1;
        }
    }
    *wm_out = root;
    return 0;
}

static int set_from_scan(lily_st_set *s, const char *dir, lily_err *err) {
    DIR *d = opendir(dir);
    if (!d) return lily_fail(err, "%s: cannot open directory", dir);
    char **names = NULL;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors") && de->d_name[0] != '.') {
            names = lily_xrealloc(names, (size_t)(n + 1) * sizeof *names);
            names[n++] = lily_xstrdup(de->d_name);
        }
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    int rc = n ? 0 : lily_fail(err, "%s: no *.safetensors files", dir);
    for (int i = 0; i < n && !rc; i++)
        if (set_add_file(s, dir, names[i], err) < 0) rc = -1;
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

int lily_st_set_open(const char *dir, lily_st_set **out, lily_err *err) {
    *out = NULL;
    lily_st_set *s = lily_xcalloc(1, sizeof *s);
    char path[4096];
    cJSON *index = NULL;
    int rc;
    if (lily_path_join(path, sizeof path, dir, "model.safetensors.index.json")) {
        rc = lily_fail(err, "%s: path too long", dir);
    } else if (lily_file_exists(path)) {
        rc = set_from_index(s, dir, path, &index, err);
    } else if (lily_path_join(path, sizeof path, dir, "model.safetensors") == 0 &&
               lily_file_exists(path)) {
        rc = set_add_file(s, dir, "model.safetensors", err) < 0 ? -1 : 0;
    } else {
        rc = set_from_scan(s, dir, err);
    }
    if (rc == 0) {
        for (int i = 0; i < s->n_files; i++)
            s->n_tensors += s->files[i].n_tensors;
        table_init(&s->names, (size_t)s->n_tensors);
        for (int i = 0; i < s->n_files && rc == 0; i++) {
            for (int j = 0; j < s->files[i].n_tensors; j++) {
                lily_st_tensor *t = &s->files[i].tensors[j];
                t->file = i;
                const lily_st_tensor *old = table_put(&s->names, t);
                if (old) {
                    rc = lily_fail(err, "tensor \"%.200s\" is in both %s and %s", t->name,
                                   s->files[old->file].path, s->files[i].path);
                    break;
                }
            }
        }
    }
    if (rc == 0 && index) {
        /* Every weight_map entry must name a tensor that is really in that shard. */
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(index, "weight_map")) {
            const lily_st_tensor *t = table_get(&s->names, e->string ? e->string : "");
            char want[4096];
            lily_path_join(want, sizeof want, dir, e->valuestring);
            if (!t || strcmp(s->files[t->file].path, want)) {
                rc = lily_fail(err,
                               "%s/model.safetensors.index.json: tensor \"%.200s\" is not "
                               "in %s",
                               dir, e->string ? e->string : "", e->valuestring);
                break;
            }
        }
    }
    cJSON_Delete(index);
    if (rc) {
        lily_st_set_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void lily_st_set_free(lily_st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++)
        lily_st_close(&s->files[i]);
    free(s->files);
    free(s->names.slot);
    free(s);
}

const lily_st_tensor *lily_st_find(const lily_st_set *s, const char *name) {
    return table_get(&s->names, name);
}

int lily_st_count(const lily_st_set *s) {
    return s->n_tensors;
}

const lily_st_tensor *lily_st_at(const lily_st_set *s, int i) {
    for (int f = 0; f < s->n_files; f++) {
        if (i < s->files[f].n_tensors) return &s->files[f].tensors[i];
        i -= s->files[f].n_tensors;
    }
    return NULL;
}

int lily_st_n_files(const lily_st_set *s) {
    return s->n_files;
}

const lily_st_file *lily_st_file_at(const lily_st_set *s, int i) {
    return &s->files[i];
}

const char *lily_st_path_of(const lily_st_set *s, const lily_st_tensor *t) {
    return s->files[t->file].path;
}
