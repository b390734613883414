/* The chunked GDN prefill (lily_cuda_gdn_chunk, gdn_chunk.cu) against the CPU recurrence: L2
 * norms, gates and lily_cpu_gdn_scan per head, from a random non-zero state, at lengths 1..4096
 * (odd ones, 63/64/65 around the chunk), value/key head ratios 1 and 2, value widths that are not
 * a multiple of the 32-column slice or above the 128-column panel, and prefills split into calls
 * (the chunks restart at each call, one call of a single token). Output and final state are
 * compared (relative L2 error and max abs difference) for both forms of the state phase (SIMT:
 * fp32 CUDA cores; TC: 3xTF32 tensor cores), with the same inputs through today's scan
 * (lily_cuda_gdn_scan) alongside. LILY_CUDA_TIME=1 also prints microseconds per layer of the scan
 * and the chunked forms at the 35B-A3B shape (Nk 16, Nv 32, Dk = Dv = 128), n up to 4096. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "backend/cuda/gdn.h"
#include "parity_util.h"

static float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static float softplus_h(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* n tokens in the calls of `calls` (lengths summing to n), the chunked kernel (and the scan on
 * the same inputs) against the CPU recurrence over all n; tol: relative L2 bound of the chunked
 * form's output and state. */
static void chunk_case(int Nk, int Nv, int Dv, int n, const int *calls, int ncalls, double tol) {
    const int Dk = 128, C = 2 * Nk * Dk + Nv * Dv, ld = C + 4, ldba = 2 * Nv + 3;
    lily_err e;
    char name[160], split[64] = "";
    if (ncalls > 1) snprintf(split, sizeof split, " in %d calls", ncalls);
    float *qkv = malloc((size_t)n * ld * 4), *ba = malloc((size_t)n * ldba * 4);
    pt_fill(qkv, (size_t)n * ld, 1.0f);
    pt_fill(ba, (size_t)n * ldba, 3.0f);
    float *A_log = malloc(Nv * 4), *dtb = malloc(Nv * 4);
    for (int j = 0; j < Nv; j++)
        A_log[j] = pt_frand() * 1.5f, dtb[j] = pt_frand();
    size_t sn = (size_t)Nv * Dk * Dv;
    float *S = malloc(sn * 4), *Sg = malloc(sn * 4);
    pt_fill(S, sn, 0.3f);
    for (int j = 0; j < Nv; j++)
        for (int k = 0; k < Dk; k++)
            for (int v = 0; v < Dv; v++)
                Sg[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)] = S[((size_t)j * Dk + k) * Dv + v];
    float *dqkv = pt_dup(qkv, (size_t)n * ld), *dba = pt_dup(ba, (size_t)n * ldba);
    float *dA = pt_dup(A_log, Nv), *ddt = pt_dup(dtb, Nv);
    const int ldo = Nv * Dv + 8;
    /* CPU: norms and gates, then the reference scan per head */
    float *beta = malloc((size_t)n * Nv * 4), *lam = malloc((size_t)n * Nv * 4);
    for (int t = 0; t < n; t++) {
        float *row = qkv + (size_t)t * ld;
        for (int i = 0; i < 2 * Nk; i++) {
            float *h = row + (size_t)i * Dk;
            double ss = 0;
            for (int d = 0; d < Dk; d++)
                ss += (double)h[d] * h[d];
            float r = (i < Nk ? 1.0f / sqrtf((float)Dk) : 1.0f) / sqrtf((float)ss + 1e-6f);
            for (int d = 0; d < Dk; d++)
                h[d] *= r;
        }
        for (int j = 0; j < Nv; j++) {
            float bb = ba[(size_t)t * ldba + j], aa = ba[(size_t)t * ldba + Nv + j];
            beta[(size_t)t * Nv + j] = sig(bb);
            lam[(size_t)t * Nv + j] = expf(-expf(A_log[j]) * softplus_h(aa + dtb[j]));
        }
    }
    float *Sref = malloc(sn * 4), *o = malloc((size_t)n * Nv * Dv * 4);
    memcpy(Sref, S, sn * 4);
    for (int j = 0; j < Nv; j++) {
        int i = j / (Nv / Nk);
        lily_cpu_gdn_scan(Sref + (size_t)j * Dk * Dv, Dk, Dv, n, qkv + (size_t)i * Dk, ld,
                          qkv + (size_t)Nk * Dk + (size_t)i * Dk, ld,
                          qkv + (size_t)2 * Nk * Dk + (size_t)j * Dv, ld, beta + j, lam + j, Nv,
                          o + (size_t)j * Dv, Nv * Dv);
    }
    int maxcall = 0;
    for (int c = 0; c < ncalls; c++)
        maxcall = calls[c] > maxcall ? calls[c] : maxcall;
    size_t wsb = lily_cuda_gdn_chunk_ws(Nv, Dv, maxcall);
    float *dws = pt_dalloc(wsb);
    float *go = malloc((size_t)n * ldo * 4), *gS = malloc(sn * 4), *gSc = malloc(sn * 4);
    float *gop = malloc((size_t)n * Nv * Dv * 4);
    static const char *const fname[] = {"scan", "simt", "tc"};
    for (int form = 0; form < 3; form++) { /* today's scan, then the chunked forms */
        float *dS = pt_dup(Sg, sn), *dO = pt_dalloc((size_t)n * ldo * 4);
        int rc = 0, t0 = 0;
        for (int c = 0; c < ncalls && !rc; t0 += calls[c++]) {
            const float *q = dqkv + (size_t)t0 * ld, *bb = dba + (size_t)t0 * ldba;
            float *oo = dO + (size_t)t0 * ldo;
            rc = form == 0
                     ? lily_cuda_gdn_scan(dS, Nk, Nv, Dk, Dv, calls[c], q, ld, bb, bb + Nv, ldba,
                                          dA, ddt, oo, ldo, NULL, &e)
                     : lily_cuda_gdn_chunk_with(form == 1 ? LILY_GDN_CHUNK_SIMT : LILY_GDN_CHUNK_TC,
                                                dS, Nk, Nv, Dk, Dv, calls[c], q, ld, bb, bb + Nv,
                                                ldba, dA, ddt, oo, ldo, dws, wsb, NULL, &e);
        }
        if (!rc) rc = lily_cuda_sync(&e);
        const char *fn = fname[form];
        snprintf(name, sizeof name, "gdn %s launch", fn);
        if (!pt_ok(rc, name, &e)) return;
        if (t0 != n) {
            pt_check_true("chunk_case: the calls sum to n", 0);
            return;
        }
        pt_get(go, dO, (size_t)n * ldo);
        pt_get(gS, dS, sn);
        for (int t = 0; t < n; t++)
            memcpy(gop + (size_t)t * Nv * Dv, go + (size_t)t * ldo, (size_t)Nv * Dv * 4);
        for (int j = 0; j < Nv; j++)
            for (int k = 0; k < Dk; k++)
                for (int v = 0; v < Dv; v++)
                    gSc[((size_t)j * Dk + k) * Dv + v] = gS[lily_cuda_gdn_sidx(Dk, Dv, j, k, v)];
        const double t = form == 0 ? 1e-4 : tol; /* the scan: test_cuda_gdn's bound */
        snprintf(name, sizeof name, "gdn %-5s out   Nk=%d Nv=%d Dv=%d n=%d%s", fn, Nk, Nv, Dv, n,
                 split);
        pt_check(name, gop, o, (size_t)n * Nv * Dv, t);
        snprintf(name, sizeof name, "gdn %-5s state Nk=%d Nv=%d Dv=%d n=%d%s", fn, Nk, Nv, Dv, n,
                 split);
        pt_check(name, gSc, Sref, sn, t);
        lily_cuda_free(dS), lily_cuda_free(dO);
    }
    lily_cuda_free(dws);
    lily_cuda_free(dqkv), lily_cuda_free(dba), lily_cuda_free(dA), lily_cuda_free(ddt);
    free(qkv), free(ba), free(A_log), free(dtb), free(S), free(Sg), free(beta), free(lam);
    free(Sref), free(o), free(go), free(gS), free(gSc), free(gop);
}

static void one_call(int Nk, int Nv, int Dv, int n, double tol) {
    chunk_case(Nk, Nv, Dv, n, &n, 1, tol);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* LILY_CUDA_TIME=1: cudaEvent median of 20 launches of today's scan (lily_cuda_gdn_scan) and the
 * chunked forms (SIMT, TC) at the 35B-A3B shape, one GDN layer per launch (the chunked ones are two
 * kernels: gdn_chunk_prep_kernel, then the state kernel; nsys splits them). Prints, asserts
 * nothing. */
static void chunk_timing(void) {
    enum { reps = 20 };
    const int Nk = 16, Nv = 32, Dk = 128, Dv = 128, C = 2 * Nk * Dk + Nv * Dv;
    const int lens[] = {64, 256, 512, 1024, 2048, 4096};
    const int nmax = 4096;
    lily_err e;
    float *h = malloc((size_t)nmax * C * 4);
    pt_fill(h, (size_t)nmax * C, 1.0f);
    float *dqkv = pt_dup(h, (size_t)nmax * C);
    pt_fill(h, (size_t)nmax * 2 * Nv, 3.0f);
    float *dba = pt_dup(h, (size_t)nmax * 2 * Nv);
    pt_fill(h, (size_t)Nv * 2, 1.0f);
    float *dA = pt_dup(h, Nv), *ddt = pt_dup(h + Nv, Nv);
    pt_fill(h, (size_t)Nv * Dk * Dv, 0.3f);
    float *dS = pt_dup(h, (size_t)Nv * Dk * Dv);
    float *dO = pt_dalloc((size_t)nmax * Nv * Dv * 4);
    size_t wsb = lily_cuda_gdn_chunk_ws(Nv, Dv, nmax);
    float *dws = pt_dalloc(wsb);
    cudaEvent_t ev[2 * reps];
    for (int r = 0; r < 2 * reps; r++)
        cudaEventCreate(&ev[r]);
    printf("timing (us per layer, median of %d), Nk=%d Nv=%d Dk=Dv=%d, workspace %.1f MB at "
           "%d:\n%6s %9s %9s %9s %10s\n",
           reps, Nk, Nv, Dk, wsb / 1e6, nmax, "n", "scan", "simt", "tc", "scan/tc");
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        float us[3];
        for (int form = 0; form < 3; form++) {
            float ms[reps];
            int rc = 0;
            for (int r = -1; r < reps && !rc; r++) { /* r = -1: warm-up */
                if (r >= 0) cudaEventRecord(ev[2 * r], NULL);
                rc = form == 0 ? lily_cuda_gdn_scan(dS, Nk, Nv, Dk, Dv, n, dqkv, C, dba, dba + Nv,
                                                    2 * Nv, dA, ddt, dO, Nv * Dv, NULL, &e)
                               : lily_cuda_gdn_chunk_with(
                                     form == 1 ? LILY_GDN_CHUNK_SIMT : LILY_GDN_CHUNK_TC, dS, Nk,
                                     Nv, Dk, Dv, n, dqkv, C, dba, dba + Nv, 2 * Nv, dA, ddt, dO,
                                     Nv * Dv, dws, wsb, NULL, &e);
                if (r >= 0) cudaEventRecord(ev[2 * r + 1], NULL);
            }
            if (rc || lily_cuda_sync(&e)) {
                printf("\ntiming failed: %s\n", e.msg);
                pt_fail++;
                goto done;
            }
            for (int r = 0; r < reps; r++)
                cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]);
            qsort(ms, reps, sizeof *ms, cmp_float);
            us[form] = 1000.0f * (ms[reps / 2 - 1] + ms[reps / 2]) / 2;
        }
        printf("%6d %9.1f %9.1f %9.1f %10.2f\n", n, us[0], us[1], us[2], us[0] / us[2]);
    }
done:
    for (int r = 0; r < 2 * reps; r++)
        cudaEventDestroy(ev[r]);
    lily_cuda_free(dqkv), lily_cuda_free(dba), lily_cuda_free(dA), lily_cuda_free(ddt);
    lily_cuda_free(dS), lily_cuda_free(dO), lily_cuda_free(dws);
    free(h);
}

int main(void) {
    pt_need_gpu();
    const double tol = 1e-5; /* the exact mode's bound */
    /* LILY_GDN_QUICK=1 or LILY_CUDA_SAN=1/2 (compute-sanitizer runs) keep the short cases only */
    const char *quick = getenv("LILY_GDN_QUICK"), *san = getenv("LILY_CUDA_SAN");
    int full = !(quick && quick[0] == '1') && !(san && (san[0] == '1' || san[0] == '2'));
    one_call(16, 32, 128, 1, tol);
    one_call(16, 32, 128, 63, tol);
    one_call(16, 32, 128, 64, tol);
    one_call(16, 32, 128, 65, tol);
    one_call(3, 6, 40, 100, tol);  /* Dv not a multiple of the 32-column slice */
    one_call(2, 4, 136, 130, tol); /* Dv above the 128-column panel: two U panels */
    one_call(1, 1, 8, 17, tol);    /* ratio 1, one 8-column group */
    one_call(4, 4, 128, 333, tol); /* ratio 1 */
    const int split3[] = {100, 1, 199};
    chunk_case(16, 32, 128, 300, split3, 3, tol);
    if (full) {
        one_call(16, 32, 128, 1000, tol);
        one_call(2, 2, 64, 4095, tol); /* ratio 1, odd, long */
        one_call(16, 32, 128, 4096, tol);
        const int split2[] = {2048, 2047};
        chunk_case(4, 8, 128, 4095, split2, 2, tol);
    }
    lily_err e;
    pt_check_true("gdn chunk rejects Dk=64",
                  lily_cuda_gdn_chunk(NULL, 1, 1, 64, 64, 1, NULL, 4, NULL, NULL, 1, NULL, NULL,
                                      NULL, 1, NULL, 0, NULL, &e) == -1);
    pt_check_true("gdn chunk rejects an unknown form",
                  lily_cuda_gdn_chunk_with(LILY_GDN_CHUNK_TC + 1, NULL, 1, 1, 128, 8, 1, NULL, 4,
                                           NULL, NULL, 1, NULL, NULL, NULL, 1, NULL, 1 << 20, NULL,
                                           &e) == -1);
    pt_check_true("gdn chunk rejects a short workspace",
                  lily_cuda_gdn_chunk(NULL, 1, 1, 128, 8, 65, NULL, 4, NULL, NULL, 1, NULL, NULL,
                                      NULL, 1, NULL, lily_cuda_gdn_chunk_ws(1, 8, 65) - 4, NULL,
                                      &e) == -1);
    const char *tm = getenv("LILY_CUDA_TIME");
    if (tm && tm[0] == '1') chunk_timing();
    return pt_finish();
}
#endif
