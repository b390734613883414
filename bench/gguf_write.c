/* Streaming GGUF writer and ggml block quantizers; see gguf_write.h. */
#include "gguf_write.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- fp16 and block quantizers ---------------------------------------------------------------- */

uint16_t gguf_f32_to_f16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half the smallest: 0 */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24: value = man * 2^(e-150), unit 2^-24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((a >> 13) - (112u << 10)), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float gguf_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15), e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}

uint64_t gguf_row_size(int type, int64_t n) {
    switch (type) {
    case GGML_T_F32: return (uint64_t)n * 4;
    case GGML_T_F16: return (uint64_t)n * 2;
    case GGML_T_Q4_0: return (uint64_t)n / QK4_0 * (2 + QK4_0 / 2);
    case GGML_T_Q8_0: return (uint64_t)n / QK8_0 * (2 + QK8_0);
    default: return 0;
    }
}

static void put_f16(uint8_t *p, float f) {
    uint16_t h = gguf_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *p) {
    return gguf_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

void gguf_quant_q4_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / QK4_0; b++, x += QK4_0, out += 2 + QK4_0 / 2) {
        float amax = 0, m = 0;
        for (int j = 0; j < QK4_0; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), m = x[j];
        float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int q0 = (int)(int8_t)(x[j] * id + 8.5f), q1 = (int)(int8_t)(x[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            out[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void gguf_dequant_q4_0(const uint8_t *in, int64_t n, float *x) {
    for (int64_t b = 0; b < n / QK4_0; b++, x += QK4_0, in += 2 + QK4_0 / 2) {
        float d = get_f16(in);
        for (int j = 0; j < QK4_0 / 2; j++) {
            x[j] = (float)((in[2 + j] & 15) - 8) * d;
            x[j + 16] = (float)((in[2 + j] >> 4) - 8) * d;
        }
    }
}

void gguf_quant_q8_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0, out += 2 + QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int j = 0; j < QK8_0; j++)
            out[2 + j] = (uint8_t)(int8_t)lrintf(x[j] * id);
    }
}

void gguf_dequant_q8_0(const uint8_t *in, int64_t n, float *x) {
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0, in += 2 + QK8_0) {
        float d = get_f16(in);
        for (int j = 0; j < QK8_0; j++)
            x[j] = (float)(int8_t)in[2 + j] * d;
    }
}

void gguf_quant_row(int type, const float *x, int64_t n, uint8_t *out) {
    switch (type) {
    case GGML_T_F32: memcpy(out, x, (size_t)n * 4); return;
    case GGML_T_F16:
        for (int64_t i = 0; i < n; i++)
            put_f16(out + 2 * i, x[i]);
        return;
    case GGML_T_Q4_0: gguf_quant_q4_0(x, n, out); return;
    case GGML_T_Q8_0: gguf_quant_q8_0(x, n, out); return;
    default: return;
    }
}

/* ---- writer ------------------------------------------------------------------------------------ */

typedef struct {
    uint64_t bytes;
} tensor_rec;

struct gguf_w {
    FILE *f;
    uint8_t *kv; /* serialized metadata */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    uint8_t *ti; /* serialized tensor table */
    size_t ti_len, ti_cap;
    tensor_rec *t;
    uint64_t n_t, cap_t;
    uint64_t data_off; /* next tensor's offset in the data section */
    uint64_t cur, cur_written;
    int failed;
};

static void grow(uint8_t **buf, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 1 << 16;
        while (c < *len + n)
            c *= 2;
        uint8_t *b = realloc(*buf, c);
        if (!b) abort();
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
}

static void kv_raw(gguf_w *w, const void *p, size_t n) {
    grow(&w->kv, &w->kv_len, &w->kv_cap, p, n);
}
static void kv_u32(gguf_w *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    kv_raw(w, b, 4);
}
static void kv_u64(gguf_w *w, uint64_t v) {
    kv_u32(w, (uint32_t)v);
    kv_u32(w, (uint32_t)(v >> 32));
}
static void kv_strn(gguf_w *w, const char *s, size_t n) {
    kv_u64(w, n);
    kv_raw(w, s, n);
}
static void kv_key(gguf_w *w, const char *key, uint32_t type) {
    kv_strn(w, key, strlen(key));
    kv_u32(w, type);
    w->n_kv++;
}

gguf_w *gguf_w_open(const char *path, char *err, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, len, "%s: cannot create: %s", path, strerror(errno));
        return NULL;
    }
    gguf_w *w = calloc(1, sizeof *w);
    if (!w) abort();
    w->f = f;
    setvbuf(f, NULL, _IOFBF, 1 << 22);
    return w;
}

void gguf_w_kv_u32(gguf_w *w, const char *key, uint32_t v) {
    kv_key(w, key, GGUF_V_U32);
    kv_u32(w, v);
}
void gguf_w_kv_i32(gguf_w *w, const char *key, int32_t v) {
    kv_key(w, key, GGUF_V_I32);
    kv_u32(w, (uint32_t)v);
}
void gguf_w_kv_f32(gguf_w *w, const char *key, float v) {
    union {
        float f;
        uint32_t u;
    } c = {v};
    kv_key(w, key, GGUF_V_F32);
    kv_u32(w, c.u);
}
void gguf_w_kv_bool(gguf_w *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    kv_key(w, key, GGUF_V_BOOL);
    kv_raw(w, &b, 1);
}
void gguf_w_kv_str(gguf_w *w, const char *key, const char *v) {
    kv_key(w, key, GGUF_V_STR);
    kv_strn(w, v, strlen(v));
}
void gguf_w_kv_arr_i32(gguf_w *w, const char *key, const int32_t *v, uint64_t n) {
    kv_key(w, key, GGUF_V_ARR);
    kv_u32(w, GGUF_V_I32);
    kv_u64(w, n);
    for (uint64_t i = 0; i < n; i++)
        kv_u32(w, (uint32_t)v[i]);
}
void gguf_w_kv_arr_str(gguf_w *w, const char *key, const char *const *s, const size_t *len,
                       uint64_t n) {
    kv_key(w, key, GGUF_V_ARR);
    kv_u32(w, GGUF_V_STR);
    kv_u64(w, n);
    for (uint64_t i = 0; i < n; i++)
        kv_strn(w, s[i], len[i]);
}

static void ti_raw(gguf_w *w, const void *p, size_t n) {
    grow(&w->ti, &w->ti_len, &w->ti_cap, p, n);
}
static void ti_u32(gguf_w *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    ti_raw(w, b, 4);
}
static void ti_u64(gguf_w *w, uint64_t v) {
    ti_u32(w, (uint32_t)v);
    ti_u32(w, (uint32_t)(v >> 32));
}

void gguf_w_tensor(gguf_w *w, const char *name, int n_dims, const int64_t *ne, int type) {
    size_t nl = strlen(name);
    ti_u64(w, nl);
    ti_raw(w, name, nl);
    ti_u32(w, (uint32_t)n_dims);
    uint64_t rows = 1;
    for (int d = 0; d < n_dims; d++) {
        ti_u64(w, (uint64_t)ne[d]);
        if (d > 0) rows *= (uint64_t)ne[d];
    }
    ti_u32(w, (uint32_t)type);
    ti_u64(w, w->data_off);
    uint64_t bytes = gguf_row_size(type, ne[0]) * rows;
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? 2 * w->cap_t : 256;
        w->t = realloc(w->t, w->cap_t * sizeof *w->t);
        if (!w->t) abort();
    }
    w->t[w->n_t++].bytes = bytes;
    w->data_off += (bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
}

uint64_t gguf_w_data_bytes(const gguf_w *w) {
    return w->data_off;
}

static int put(gguf_w *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) w->failed = 1;
    return w->failed ? -1 : 0;
}

static int pad(gguf_w *w, uint64_t n) {
    static const uint8_t zero[GGUF_ALIGN];
    return put(w, zero, (size_t)n);
}

int gguf_w_begin_data(gguf_w *w, char *err, size_t len) {
    uint8_t h[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (int i = 0; i < 8; i++) {
        h[8 + i] = (uint8_t)(w->n_t >> (8 * i));
        h[16 + i] = (uint8_t)(w->n_kv >> (8 * i));
    }
    put(w, h, sizeof h);
    put(w, w->kv, w->kv_len);
    put(w, w->ti, w->ti_len);
    uint64_t hdr = sizeof h + w->kv_len + w->ti_len;
    pad(w, (GGUF_ALIGN - hdr % GGUF_ALIGN) % GGUF_ALIGN);
    free(w->kv), free(w->ti);
    w->kv = w->ti = NULL;
    w->cur = 0, w->cur_written = 0;
    if (w->failed) snprintf(err, len, "write failed: %s", strerror(errno));
    return w->failed ? -1 : 0;
}

int gguf_w_data(gguf_w *w, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n && !w->failed) {
        if (w->cur >= w->n_t) return w->failed = 1, -1;
        uint64_t room = w->t[w->cur].bytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        put(w, b, k);
        b += k, n -= k, w->cur_written += k;
        if (w->cur_written == w->t[w->cur].bytes) {
            uint64_t bytes = w->t[w->cur].bytes;
            pad(w, (GGUF_ALIGN - bytes % GGUF_ALIGN) % GGUF_ALIGN);
            w->cur++, w->cur_written = 0;
        }
    }
    return w->failed ? -1 : 0;
}

int gguf_w_close(gguf_w *w, char *err, size_t len) {
    int rc = 0;
    if (w->failed) {
        snprintf(err, len, "write failed: %s", strerror(errno));
        rc = -1;
    } else if (w->cur != w->n_t || w->cur_written) {
        snprintf(err, len, "%llu of %llu tensors written", (unsigned long long)w->cur,
                 (unsigned long long)w->n_t);
        rc = -1;
    }
    if (fclose(w->f) != 0 && rc == 0) {
        snprintf(err, len, "close failed: %s", strerror(errno));
        rc = -1;
    }
    free(w->kv), free(w->ti), free(w->t);
    free(w);
    return rc;
}

/* ---- checker ----------------------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    uint64_t pos, size;
    int bad;
} rd;

static uint64_t rd_n(rd *r, int n) {
    uint8_t b[8] = {0};
    if (r->bad || r->pos + (uint64_t)n > r->size || fread(b, 1, (size_t)n, r->f) != (size_t)n) {
        r->bad = 1;
        return 0;
    }
    r->pos += (uint64_t)n;
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

static void rd_skip(rd *r, uint64_t n) {
    if (r->bad || r->pos + n > r->size || fseeko(r->f, (off_t)n, SEEK_CUR) != 0) {
        r->bad = 1;
        return;
    }
    r->pos += n;
}

/* Reads a string into buf (truncated to len-1), skipping the rest. */
static void rd_str(rd *r, char *buf, size_t len) {
    uint64_t n = rd_n(r, 8);
    if (r->bad || n > r->size - r->pos) {
        r->bad = 1;
        buf[0] = 0;
        return;
    }
    size_t k = n < len - 1 ? (size_t)n : len - 1;
    if (fread(buf, 1, k, r->f) != k) r->bad = 1;
    buf[k] = 0;
    r->pos += k;
    rd_skip(r, n - k);
}

static const int scalar_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static void rd_value(rd *r, uint32_t type, FILE *out) {
    char s[80];
    if (type == GGUF_V_STR) {
        rd_str(r, s, sizeof s);
        if (out) fprintf(out, "\"%s\"", s);
    } else if (type == GGUF_V_ARR) {
        uint32_t et = (uint32_t)rd_n(r, 4);
        uint64_t n = rd_n(r, 8);
        if (out) fprintf(out, "[%llu x type %u]", (unsigned long long)n, et);
        if (et == GGUF_V_STR) {
            for (uint64_t i = 0; i < n && !r->bad; i++)
                rd_skip(r, rd_n(r, 8));
        } else if (et <= GGUF_V_F64 && scalar_size[et]) {
            if (n > r->size) r->bad = 1;
            rd_skip(r, n * (uint64_t)scalar_size[et]);
        } else {
            r->bad = 1;
        }
    } else if (type <= GGUF_V_F64 && scalar_size[type]) {
        uint64_t v = rd_n(r, scalar_size[type]);
        if (!out) return;
        if (type == GGUF_V_F32) {
            union {
                uint32_t u;
                float f;
            } c = {(uint32_t)v};
            fprintf(out, "%g", (double)c.f);
        } else {
            fprintf(out, "%llu", (unsigned long long)v);
        }
    } else {
        r->bad = 1;
    }
}

int gguf_check(const char *path, FILE *out, uint64_t *n_tensors, uint64_t *n_kv, char *err,
               size_t len) {
    rd r = {fopen(path, "rb"), 0, 0, 0};
    if (!r.f) {
        snprintf(err, len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    fseeko(r.f, 0, SEEK_END);
    r.size = (uint64_t)ftello(r.f);
    fseeko(r.f, 0, SEEK_SET);
    uint64_t magic = rd_n(&r, 4), version = rd_n(&r, 4), nt = rd_n(&r, 8), nk = rd_n(&r, 8);
    int rc = -1;
    if (r.bad || magic != 0x46554747u || version != 3) {
        snprintf(err, len, "%s: not a GGUF v3 file", path);
        goto done;
    }
    char key[256];
    uint32_t align = GGUF_ALIGN;
    for (uint64_t i = 0; i < nk && !r.bad; i++) {
        rd_str(&r, key, sizeof key);
        uint32_t type = (uint32_t)rd_n(&r, 4);
        if (out) fprintf(out, "kv %s = ", key);
        if (!strcmp(key, "general.alignment") && type == GGUF_V_U32) {
            align = (uint32_t)rd_n(&r, 4);
            if (out) fprintf(out, "%u", align);
        } else {
            rd_value(&r, type, out);
        }
        if (out) fprintf(out, "\n");
    }
    if (r.bad || align == 0 || align % 8) {
        snprintf(err, len, "%s: bad metadata", path);
        goto done;
    }
    uint64_t end = 0;
    for (uint64_t i = 0; i < nt && !r.bad; i++) {
        rd_str(&r, key, sizeof key);
        uint32_t nd = (uint32_t)rd_n(&r, 4);
        if (nd == 0 || nd > 4) r.bad = 1;
        int64_t ne[4] = {1, 1, 1, 1};
        for (uint32_t d = 0; d < nd && !r.bad; d++)
            ne[d] = (int64_t)rd_n(&r, 8);
        uint32_t type = (uint32_t)rd_n(&r, 4);
        uint64_t off = rd_n(&r, 8);
        uint64_t bytes = gguf_row_size((int)type, ne[0]) * (uint64_t)(ne[1] * ne[2] * ne[3]);
        if (r.bad || bytes == 0 || off % align || off < end) {
            snprintf(err, len, "%s: tensor %s: bad type, shape or offset", path, key);
            goto done;
        }
        end = off + bytes;
        if (out)
            fprintf(out, "tensor %s type %u ne [%lld %lld %lld %lld] offset %llu\n", key, type,
                    (long long)ne[0], (long long)ne[1], (long long)ne[2], (long long)ne[3],
                    (unsigned long long)off);
    }
    if (r.bad) {
        snprintf(err, len, "%s: truncated header", path);
        goto done;
    }
    uint64_t data = (r.pos + align - 1) / align * align;
    if (data + end > r.size) {
        snprintf(err, len, "%s: data ends at %llu, file has %llu bytes", path,
                 (unsigned long long)(data + end), (unsigned long long)r.size);
        goto done;
    }
    if (n_tensors) *n_tensors = nt;
    if (n_kv) *n_kv = nk;
    rc = 0;
done:
    fclose(r.f);
    return rc;
}
