/* GPU MoE prefill (backend/cuda/moe.h) under forced routings, in exact and one-pass (bf16)
 * precision, against a CPU composition of the reference ops (lily_cpu_matmul, SwiGLU,
 * sigmoid-gated shared expert) with the same routing: every token on experts 0..k-1 (k = 1: every
 * row on one expert), one row per expert (a balanced load once n k > E), a few experts only (most
 * empty), a skewed load (heavy experts with partial last tiles, light ones, empty ones), and the
 * routing the GPU computes. n = 1, 7, 32, 64, 255, 256, 504, 512, 4096 (both tile heights: 16-row
 * skinny tiles below 64 rows per expert on average, 64-row tiles from there); hidden sizes odd
 * multiples of 64. Each case also checks that a second run is bit-identical; before every run a
 * decoy input fills the kernels' layout buffers and the scratch is poisoned, so no run can pass on
 * what an earlier one left. test_cuda_ops' moe_prefill rows cover the default precision's GPU,
 * hot and skewed routings; this program adds the one-pass precision and the load shapes above.
 * (Until 2026-12-07 it also compared per-expert tile heights, removed: bench/NOTES-cuda.md.) */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>

#include "backend/cuda/moe.h"
#include "parity_util.h"

typedef struct {
    int E, k, H, I, Is;
    lily_mat router, *gate, *up, *down, sg, su, sd, sgw;
    lily_dmat d_router, d_gate, d_up, d_down, d_sg, d_su, d_sd, d_sgw;
    lily_cuda_moe m;
} fix;

static int fix_make(fix *f, int E, int k, int H, int I, int Is) {
    lily_err e;
    memset(f, 0, sizeof *f);
    f->E = E, f->k = k, f->H = H, f->I = I, f->Is = Is;
    f->m.E = E, f->m.k = k, f->m.norm = 1;
    f->router = pt_mat(LILY_DT_Q8, E, H);
    f->gate = calloc(E, sizeof(lily_mat));
    f->up = calloc(E, sizeof(lily_mat));
    f->down = calloc(E, sizeof(lily_mat));
    for (int x = 0; x < E; x++) {
        f->gate[x] = pt_mat(LILY_DT_Q4, I, H);
        f->up[x] = pt_mat(LILY_DT_Q4, I, H);
        f->down[x] = pt_mat(LILY_DT_Q4, H, I);
    }
    if (lily_cuda_dmat_upload(&f->router, 1, &f->d_router, &e) ||
        lily_cuda_dmat_upload(f->gate, E, &f->d_gate, &e) ||
        lily_cuda_dmat_upload(f->up, E, &f->d_up, &e) ||
        lily_cuda_dmat_upload(f->down, E, &f->d_down, &e))
        return pt_ok(-1, "upload experts", &e), -1;
    f->m.router = &f->d_router, f->m.gate = &f->d_gate, f->m.up = &f->d_up;
    f->m.down = &f->d_down;
    if (Is) {
        f->sg = pt_mat(LILY_DT_Q4, Is, H);
        f->su = pt_mat(LILY_DT_Q4, Is, H);
        f->sd = pt_mat(LILY_DT_Q4, H, Is);
        f->sgw = pt_mat(LILY_DT_Q8, 1, H);
        if (lily_cuda_dmat_upload(&f->sg, 1, &f->d_sg, &e) ||
            lily_cuda_dmat_upload(&f->su, 1, &f->d_su, &e) ||
            lily_cuda_dmat_upload(&f->sd, 1, &f->d_sd, &e) ||
            lily_cuda_dmat_upload(&f->sgw, 1, &f->d_sgw, &e))
            return pt_ok(-1, "upload shared", &e), -1;
        f->m.sh_gate = &f->d_sg, f->m.sh_up = &f->d_su, f->m.sh_down = &f->d_sd;
        f->m.sh_gate_w = &f->d_sgw;
    }
    return 0;
}

static void fix_free(fix *f) {
    for (int x = 0; x < f->E; x++)
        pt_mat_free(&f->gate[x]), pt_mat_free(&f->up[x]), pt_mat_free(&f->down[x]);
    free(f->gate), free(f->up), free(f->down);
    pt_mat_free(&f->router), pt_mat_free(&f->sg), pt_mat_free(&f->su), pt_mat_free(&f->sd);
    pt_mat_free(&f->sgw);
    lily_cuda_dmat_free(&f->d_router), lily_cuda_dmat_free(&f->d_gate);
    lily_cuda_dmat_free(&f->d_up), lily_cuda_dmat_free(&f->d_down);
    lily_cuda_dmat_free(&f->d_sg), lily_cuda_dmat_free(&f->d_su), lily_cuda_dmat_free(&f->d_sd);
    lily_cuda_dmat_free(&f->d_sgw);
}

static float silu_h(float x) {
    return x / (1.0f + expf(-x));
}

/* ref [n][H] += the MoE block of rows u [n][H] with routing idx/wt [n][k]: per expert, its rows
 * gathered and run as one CPU matmul each for gate, up and down. */
static void moe_ref(const fix *f, const float *u, int n, const int *idx, const float *wt,
                    float *ref) {
    const int H = f->H, I = f->I, k = f->k;
    int *rows = malloc((size_t)n * k * sizeof(int));
    float *xg = malloc((size_t)n * H * 4), *g = malloc((size_t)n * I * 4);
    float *up = malloc((size_t)n * I * 4), *y = malloc((size_t)n * H * 4);
    for (int x = 0; x < f->E; x++) {
        int c = 0;
        for (int a = 0; a < n * k; a++)
            if (idx[a] == x) {
                rows[c] = a;
                memcpy(xg + (size_t)c * H, u + (size_t)(a / k) * H, (size_t)H * 4);
                c++;
            }
        if (!c) continue;
        lily_cpu_matmul(pt_cpu(), &f->gate[x], xg, c, H, g, I, NULL);
        lily_cpu_matmul(pt_cpu(), &f->up[x], xg, c, H, up, I, NULL);
        for (size_t i = 0; i < (size_t)c * I; i++)
            g[i] = silu_h(g[i]) * up[i];
        lily_cpu_matmul(pt_cpu(), &f->down[x], g, c, I, y, H, NULL);
        for (int r = 0; r < c; r++) {
            const int a = rows[r];
            for (int d = 0; d < H; d++)
                ref[(size_t)(a / k) * H + d] += wt[a] * y[(size_t)r * H + d];
        }
    }
    if (f->Is) {
        const int Is = f->Is;
        float *sg = malloc((size_t)n * Is * 4), *su = malloc((size_t)n * Is * 4);
        float *gl = malloc((size_t)n * 4);
        lily_cpu_matmul(pt_cpu(), &f->sg, u, n, H, sg, Is, NULL);
        lily_cpu_matmul(pt_cpu(), &f->su, u, n, H, su, Is, NULL);
        lily_cpu_matmul(pt_cpu(), &f->sgw, u, n, H, gl, 1, NULL);
        for (size_t i = 0; i < (size_t)n * Is; i++)
            sg[i] = silu_h(sg[i]) * su[i];
        lily_cpu_matmul(pt_cpu(), &f->sd, sg, n, Is, y, H, NULL);
        for (int t = 0; t < n; t++) {
            const float s = 1.0f / (1.0f + expf(-gl[t]));
            for (int d = 0; d < H; d++)
                ref[(size_t)t * H + d] += s * y[(size_t)t * H + d];
        }
        free(sg), free(su), free(gl);
    }
    free(rows), free(xg), free(g), free(up), free(y);
}

/* Routings forced on the GPU (R_GPU: the GPU's router picks). */
enum { R_GPU, R_HOT, R_SPREAD, R_FEW, R_SKEW, R_COUNT };
static const char *r_name[R_COUNT] = {"routed on GPU", "all on experts 0..k-1",
                                      "one row per expert", "few experts", "skewed"};

/* k distinct experts per token into idx, weights normalised to 1 into wt. */
static void make_routing(const fix *f, int n, int how, int *idx, float *wt) {
    const int E = f->E, k = f->k, few = E / 4 > k ? E / 4 : k;
    for (int t = 0; t < n; t++) {
        float s = 0;
        for (int j = 0; j < k; j++) {
            const int a = t * k + j;
            int ex = -1;
            while (ex < 0) {
                if (how == R_HOT) {
                    ex = j;
                } else if (how == R_SPREAD) {
                    ex = a % E;
                } else if (how == R_FEW) {
                    ex = (int)(pt_rnd() % few) * (E / few); /* every (E / few)-th expert */
                } else { /* skewed: about 1 / (r + 1) over ranks r of a fixed shuffle */
                    const double v = (pt_rnd() & 0xffffff) / 16777216.0;
                    const int r = (int)(pow((double)E + 1, v)) - 1;
                    ex = (r * 37 + 11) % E;
                }
                for (int i = 0; i < j; i++)
                    if (idx[t * k + i] == ex) ex = -1;
            }
            idx[a] = ex;
            wt[a] = 0.1f + fabsf(pt_frand());
            s += wt[a];
        }
        for (int j = 0; j < k; j++)
            wt[t * k + j] /= s;
    }
}

static void set_exact(int on) {
    lily_cuda_prec p = {on, 1};
    lily_cuda_prec_set(p);
}

/* Other inputs run through the same launches first (the kernels' layout buffers then hold the
 * decoy's rows), the scratch poisoned after: a run that leaves a row unwritten, or reads a row
 * its launches did not lay out, cannot pick up a value an earlier identical run left behind. */
static void decoy(const fix *f, int n, const int32_t *didx, const float *dwt, void *scr) {
    lily_err e;
    const size_t nh = (size_t)n * f->H;
    float *h = malloc(nh * 4);
    pt_fill(h, nh, 0.7f);
    float *du = pt_dup(h, nh), *dx = pt_dup(h, nh);
    int rc = didx ? lily_cuda_moe_prefill_routed(&f->m, du, n, didx, dwt, dx, scr, NULL, &e)
                  : lily_cuda_moe_prefill(&f->m, du, n, dx, scr, NULL, &e);
    pt_ok(rc, "decoy prefill", &e);
    lily_cuda_memset(scr, 0xff, lily_cuda_moe_prefill_scratch(&f->m, n), NULL, &e);
    lily_cuda_sync(&e);
    lily_cuda_free(du), lily_cuda_free(dx), free(h);
}

/* One GPU run of the block into a fresh copy of x0 (after a decoy); returns the output in got
 * (host). */
static int run_once(const fix *f, const float *du, const float *x0, int n, const int32_t *didx,
                    const float *dwt, void *scr, float *got) {
    lily_err e;
    const size_t nh = (size_t)n * f->H;
    decoy(f, n, didx, dwt, scr);
    float *dx = pt_dup(x0, nh);
    int rc = didx ? lily_cuda_moe_prefill_routed(&f->m, du, n, didx, dwt, dx, scr, NULL, &e)
                  : lily_cuda_moe_prefill(&f->m, du, n, dx, scr, NULL, &e);
    if (!rc) rc = lily_cuda_sync(&e);
    if (!pt_ok(rc, "moe prefill", &e)) {
        lily_cuda_free(dx);
        return -1;
    }
    pt_get(got, dx, nh);
    lily_cuda_free(dx);
    return 0;
}

static void prefill_case(const fix *f, int n, int how) {
    lily_err e;
    char name[200];
    const int H = f->H, k = f->k, nk = n * k;
    const size_t nh = (size_t)n * H;
    float *x = malloc(nh * 4), *u = malloc(nh * 4), *wt = malloc((size_t)nk * 4);
    int *idx = malloc((size_t)nk * 4);
    pt_fill(x, nh, 1.0f);
    pt_fill(u, nh, 1.5f);
    float *du = pt_dup(u, nh), *dwt = NULL;
    int32_t *didx = NULL;
    void *scr = pt_dalloc(lily_cuda_moe_prefill_scratch(&f->m, n));
    float *got = malloc(nh * 4), *again = malloc(nh * 4), *ref = malloc(nh * 4);
    float *wt2 = malloc((size_t)nk * 4);
    int *idx2 = malloc((size_t)nk * 4);
    if (how != R_GPU) {
        make_routing(f, n, how, idx, wt);
        didx = pt_idup((const int32_t *)idx, (size_t)nk);
        dwt = pt_dup(wt, (size_t)nk);
    } else { /* the GPU's routing, read back from a first run (exact) */
        set_exact(1);
        if (run_once(f, du, x, n, NULL, NULL, scr, got)) goto out;
        if (lily_cuda_d2h(idx, lily_cuda_moe_prefill_idx(&f->m, n, scr), (size_t)nk * 4, &e) ||
            lily_cuda_d2h(wt, lily_cuda_moe_prefill_wt(&f->m, n, scr), (size_t)nk * 4, &e)) {
            pt_ok(-1, "routing read-back", &e);
            goto out;
        }
    }
    memcpy(ref, x, nh * 4);
    moe_ref(f, u, n, idx, wt, ref);
    for (int exact = 1; exact >= 0; exact--) {
        set_exact(exact);
        if (run_once(f, du, x, n, didx, dwt, scr, got)) continue;
        if (how == R_GPU && !exact) {
            /* the one-pass router may break a near tie the other way: then the reference takes
             * this run's routing (its weights differ from the exact run's by the router's
             * rounding only, well within the tolerance) */
            if (lily_cuda_d2h(idx2, lily_cuda_moe_prefill_idx(&f->m, n, scr), (size_t)nk * 4, &e) ||
                lily_cuda_d2h(wt2, lily_cuda_moe_prefill_wt(&f->m, n, scr), (size_t)nk * 4, &e)) {
                pt_ok(-1, "routing read-back", &e);
                continue;
            }
            if (memcmp(idx, idx2, (size_t)nk * 4)) {
                memcpy(idx, idx2, (size_t)nk * 4), memcpy(wt, wt2, (size_t)nk * 4);
                memcpy(ref, x, nh * 4);
                moe_ref(f, u, n, idx, wt, ref);
            }
        }
        snprintf(name, sizeof name, "moe prefill E=%d k=%d H=%d I=%d n=%d %s, %s", f->E, k, H, f->I,
                 n, r_name[how], exact ? "exact" : "bf16");
        /* exact: fp16 weights and split activations (~1e-4 with the router's ties kept); one
         * pass: bf16 products (~4e-3 each, three in a row plus the router's weights); a row left
         * out or on the wrong expert is O(1), a poisoned one NaN */
        pt_check(name, got, ref, nh, exact ? 2e-3 : 2e-2);
        if (!run_once(f, du, x, n, didx, dwt, scr, again))
            pt_check_true("  a second run is bit-identical", !memcmp(got, again, nh * 4));
    }
    set_exact(1);
out:
    lily_cuda_free(du), lily_cuda_free(didx), lily_cuda_free(dwt), lily_cuda_free(scr);
    free(x), free(u), free(wt), free(idx), free(got), free(again), free(ref);
    free(wt2), free(idx2);
}

int main(void) {
    pt_need_gpu();
    static const int n_a[] = {1, 7, 64, 255, 256, 4096};
    fix f;
    /* 64 experts, H = 5 x 64, with a shared expert */
    if (fix_make(&f, 64, 8, 320, 192, 128)) return pt_finish();
    for (int i = 0; i < 6; i++) {
        prefill_case(&f, n_a[i], R_GPU);
        prefill_case(&f, n_a[i], R_SKEW);
        if (n_a[i] >= 64) prefill_case(&f, n_a[i], R_HOT);
    }
    prefill_case(&f, 7, R_SPREAD);   /* 56 rows over 64 experts: one each, 8 empty */
    prefill_case(&f, 255, R_SPREAD); /* ~32 rows each: partial 16-row tiles */
    prefill_case(&f, 504, R_SPREAD); /* 63 rows each: the last 16-row chunk */
    prefill_case(&f, 512, R_SPREAD); /* 64 each: the first on 64-row tiles */
    prefill_case(&f, 4096, R_SPREAD);
    prefill_case(&f, 256, R_FEW);
    fix_free(&f);
    /* 256 experts as the 35B (H = 7 x 64), no shared expert */
    if (fix_make(&f, 256, 8, 448, 128, 0)) return pt_finish();
    prefill_case(&f, 7, R_FEW);
    prefill_case(&f, 32, R_SPREAD); /* 256 rows: exactly one per expert */
    prefill_case(&f, 256, R_GPU);
    prefill_case(&f, 256, R_SKEW);
    prefill_case(&f, 4096, R_SKEW);
    prefill_case(&f, 4096, R_FEW);
    fix_free(&f);
    /* top-1 over 16 experts (H = 3 x 64): every row on one expert */
    if (fix_make(&f, 16, 1, 192, 64, 64)) return pt_finish();
    prefill_case(&f, 1, R_HOT);
    prefill_case(&f, 255, R_HOT);
    prefill_case(&f, 4096, R_HOT);
    prefill_case(&f, 255, R_SKEW);
    prefill_case(&f, 4096, R_GPU);
    fix_free(&f);
    return pt_finish();
}
#endif
