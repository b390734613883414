/* Small GPU kernels (backend/cuda/misc.h) against the CPU reference: the embedding lookup of
 * Q4, Q8, BF16 and F32 (rounded to BF16) rows against lily_mat_row_f32, row-wise RMSNorm against
 * lily_cpu_rmsnorm at odd widths and strides (and the RMSNorm that also writes the exact GEMMs'
 * split words: the same y bits, and the words a separate split gives), and argmax over odd
 * lengths with the maximum at the first and last index, negative values and a tie (the lowest
 * index wins). */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "backend/cuda/gemm_split.h"
#include "backend/cuda/misc.h"
#include "parity_util.h"

static void embed_case(lily_dtype dt, int V, int H, int n) {
    lily_err e;
    char name[128];
    lily_mat m = pt_mat(dt, V, H);
    lily_dmat d;
    if (!pt_ok(lily_cuda_dmat_upload(&m, 1, &d, &e), "upload", &e)) return;
    int32_t *tok = malloc(n * 4);
    for (int i = 0; i < n; i++)
        tok[i] = i == 0 ? V - 1 : (int32_t)(pt_rnd() % V);
    int ld = H + 4;
    float *ref = malloc((size_t)n * ld * 4), *got = malloc((size_t)n * ld * 4);
    for (int t = 0; t < n; t++) {
        lily_mat_row_f32(&m, tok[t], ref + (size_t)t * ld);
        if (dt == LILY_DT_F32)
            for (int c = 0; c < H; c++)
                ref[(size_t)t * ld + c] =
                    lily_bf16_to_f32(lily_f32_to_bf16(ref[(size_t)t * ld + c]));
        for (int c = H; c < ld; c++)
            ref[(size_t)t * ld + c] = got[(size_t)t * ld + c] = 0;
    }
    int32_t *dtok = (int32_t *)pt_dup((const float *)tok, n);
    float *dx = pt_dalloc((size_t)n * ld * 4);
    lily_cuda_memset(dx, 0, (size_t)n * ld * 4, NULL, &e);
    if (!pt_ok(lily_cuda_embed(&d, dtok, n, dx, ld, NULL, &e), "embed", &e)) return;
    pt_get(got, dx, (size_t)n * ld);
    static const char *dts[] = {"f32", "bf16", "f16", "q4", "q8"};
    snprintf(name, sizeof name, "embed %s V=%d H=%d n=%d", dts[dt], V, H, n);
    pt_check(name, got, ref, (size_t)n * ld, 1e-6);
    lily_cuda_free(dtok), lily_cuda_free(dx);
    lily_cuda_dmat_free(&d);
    pt_mat_free(&m);
    free(tok), free(ref), free(got);
}

/* Words and multipliers of the module's last split, copied out. */
static void get_words(const uint32_t *w, const float *mul, int n, int dim, uint32_t *hw,
                      float *hm) {
    lily_err e;
    lily_cuda_sync(&e);
    lily_cuda_d2h(hw, w, (size_t)n * dim * 4, &e);
    lily_cuda_d2h(hm, mul, (size_t)n * 4, &e);
}

/* lily_cuda_rmsnorm_split against lily_cuda_rmsnorm (dy: its rows) and a separate split of them:
 * the same bits. The fused rows are then overwritten before the hold, so the words the GEMMs
 * would read can only match if the hold kept the norm's words. Also in place (x == y). */
static void rmsnorm_split_check(const float *dx, int ldx, const float *dw, int n, int dim,
                                const float *dy, int ldy) {
    lily_err e;
    char name[160];
    const size_t ny = (size_t)n * ldy;
    uint32_t *wa = malloc((size_t)n * dim * 4), *wb = malloc((size_t)n * dim * 4);
    float *ma = malloc(n * 4), *mb = malloc(n * 4), *ya = malloc(ny * 4), *yb = malloc(ny * 4);
    const uint32_t *w;
    const float *mul;
    float *dy2 = pt_dalloc(ny * 4), *dxy = pt_dalloc((size_t)n * ldx * 4);
    lily_cuda_memset(dy2, 0, ny * 4, NULL, &e);
    lily_cuda_xsplit_hold(NULL);
    if (!pt_ok(lily_cuda_xsplit(dy, ldy, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wa, ma);
    if (!pt_ok(lily_cuda_rmsnorm_split(dx, ldx, dw, n, dim, 1e-6f, dy2, ldy, NULL, &e),
               "rmsnorm_split", &e))
        return;
    pt_get(ya, dy, ny);
    pt_get(yb, dy2, ny);
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d: y bits as rmsnorm", n, dim);
    pt_check_true(name, memcmp(ya, yb, ny * 4) == 0);
    lily_cuda_memset(dy2, 0, ny * 4, NULL, &e); /* not split again below if the hold keeps */
    lily_cuda_xsplit_hold(dy2);
    if (!pt_ok(lily_cuda_xsplit(dy2, ldy, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wb, mb);
    lily_cuda_xsplit_hold(NULL);
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d: held words as a split of y", n, dim);
    pt_check_true(name, memcmp(wa, wb, (size_t)n * dim * 4) == 0 && memcmp(ma, mb, n * 4) == 0);
    /* in place: x == y */
    lily_cuda_d2d(dxy, dx, (size_t)n * ldx * 4, NULL, &e);
    if (!pt_ok(lily_cuda_rmsnorm_split(dxy, ldx, dw, n, dim, 1e-6f, dxy, ldx, NULL, &e),
               "rmsnorm_split in place", &e))
        return;
    lily_cuda_xsplit_hold(dxy);
    if (!pt_ok(lily_cuda_xsplit(dxy, ldx, n, dim, &w, &mul, NULL, &e), "xsplit", &e)) return;
    get_words(w, mul, n, dim, wb, mb);
    lily_cuda_xsplit_hold(NULL);
    float *yc = malloc((size_t)n * ldx * 4);
    pt_get(yc, dxy, (size_t)n * ldx);
    int same = memcmp(wa, wb, (size_t)n * dim * 4) == 0 && memcmp(ma, mb, n * 4) == 0;
    for (int t = 0; t < n; t++)
        same &= memcmp(yc + (size_t)t * ldx, ya + (size_t)t * ldy, (size_t)dim * 4) == 0;
    snprintf(name, sizeof name, "rmsnorm_split n=%d dim=%d in place: same y and words", n, dim);
    pt_check_true(name, same);
    lily_cuda_free(dy2), lily_cuda_free(dxy);
    free(wa), free(wb), free(ma), free(mb), free(ya), free(yb), free(yc);
}

static void rmsnorm_case(int n, int dim) {
    lily_err e;
    char name[128];
    int ldx = dim + 3, ldy = dim + 1;
    float *x = malloc((size_t)n * ldx * 4), *w = malloc(dim * 4);
    float *ref = malloc((size_t)n * ldy * 4), *got = malloc((size_t)n * ldy * 4);
    pt_fill(x, (size_t)n * ldx, 3.0f);
    for (int i = 0; i < dim; i++)
        w[i] = 1 + 0.5f * pt_frand();
    for (int t = 0; t < n; t++) {
        lily_cpu_rmsnorm(x + (size_t)t * ldx, w, dim, 1e-6f, ref + (size_t)t * ldy);
        ref[(size_t)t * ldy + dim] = 0;
    }
    float *dx = pt_dup(x, (size_t)n * ldx), *dw = pt_dup(w, dim);
    float *dy = pt_dalloc((size_t)n * ldy * 4);
    lily_cuda_memset(dy, 0, (size_t)n * ldy * 4, NULL, &e);
    if (!pt_ok(lily_cuda_rmsnorm(dx, ldx, dw, n, dim, 1e-6f, dy, ldy, NULL, &e), "rmsnorm", &e))
        return;
    pt_get(got, dy, (size_t)n * ldy);
    snprintf(name, sizeof name, "rmsnorm rows n=%d dim=%d", n, dim);
    pt_check(name, got, ref, (size_t)n * ldy, 1e-5);
    rmsnorm_split_check(dx, ldx, dw, n, dim, dy, ldy);
    lily_cuda_free(dx), lily_cuda_free(dw), lily_cuda_free(dy);
    free(x), free(w), free(ref), free(got);
}

/* where: -1 random position, else the index of the maximum (a copy goes at where + 7 too). */
static void argmax_case(int n, int where) {
    lily_err e;
    char name[128];
    float *x = malloc(n * 4);
    for (int i = 0; i < n; i++)
        x[i] = -5.0f + pt_frand();
    int best = where >= 0 ? where : (int)(pt_rnd() % n);
    x[best] = 3.0f;
    if (best + 7 < n) x[best + 7] = 3.0f; /* a tie: the lower index must win */
    float *dx = pt_dup(x, n);
    void *scr = pt_dalloc(16);
    int32_t got = -1;
    int rc = lily_cuda_argmax(dx, n, (uint64_t *)scr + 1, (int32_t *)scr, NULL, &e);
    if (!pt_ok(rc, "argmax", &e)) return;
    lily_cuda_sync(&e);
    lily_cuda_d2h(&got, scr, 4, &e);
    snprintf(name, sizeof name, "argmax n=%d: got %d, expected %d", n, got, best);
    pt_check_true(name, got == best);
    lily_cuda_free(dx), lily_cuda_free(scr);
    free(x);
}

/* lily_cuda_advance with step counters near the ends of int32 (a negative one indexed before the
 * ring once): the token lands at (unsigned)step % cap, nothing outside the ring changes. */
static void advance_case(int32_t step0, int cap) {
    lily_err e;
    char name[128];
    const int guard = 256, total = 2 * guard + cap;
    int32_t *h = malloc(total * 4), *got = malloc(total * 4), st[4] = {4321, 77, 10, step0};
    for (int i = 0; i < total; i++)
        h[i] = -1000 - i;
    int32_t *d = (int32_t *)pt_dup((const float *)h, total),
            *ds = (int32_t *)pt_dup((const float *)st, 4);
    /* ds: [0] argmax, [1] tok, [2] pos, [3] step */
    int rc = lily_cuda_advance(ds, ds + 1, ds + 2, d + guard, cap, ds + 3, NULL, &e) ||
             lily_cuda_sync(&e);
    snprintf(name, sizeof name, "advance step %d ring %d: launch", (int)step0, cap);
    if (!pt_ok(rc, name, &e)) return;
    lily_cuda_d2h(got, d, total * 4, &e);
    lily_cuda_d2h(st, ds, 16, &e);
    const int slot = (int)((uint32_t)step0 % (uint32_t)cap);
    int bad = 0;
    for (int i = 0; i < total; i++)
        bad += got[i] != (i == guard + slot ? 4321 : h[i]);
    snprintf(name, sizeof name, "advance step %d ring %d: token at slot %d only (%d wrong)",
             (int)step0, cap, slot, bad);
    pt_check_true(name, bad == 0);
    snprintf(name, sizeof name, "advance step %d: tok, pos, step", (int)step0);
    pt_check_true(name, st[1] == 4321 && st[2] == 11 && st[3] == (int32_t)((uint32_t)step0 + 1u));
    lily_cuda_free(d), lily_cuda_free(ds);
    free(h), free(got);
}

int main(void) {
    pt_need_gpu();
    advance_case(0, 1024);
    advance_case(1500, 1024);
    advance_case(-5, 1024);
    advance_case(INT32_MIN, 1000);
    advance_case(INT32_MAX, 1000);
    embed_case(LILY_DT_Q4, 1000, 2048, 7);
    embed_case(LILY_DT_Q8, 77, 320, 3);
    embed_case(LILY_DT_BF16, 129, 256, 64);
    embed_case(LILY_DT_F32, 33, 192, 5);
    rmsnorm_case(1, 2048);
    rmsnorm_case(37, 4096);
    rmsnorm_case(5, 100);
    argmax_case(248320, -1);
    argmax_case(248320, 0);
    argmax_case(248320, 248319);
    argmax_case(1, 0);
    argmax_case(4093, -1);
    return pt_finish();
}
#endif
