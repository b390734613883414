/* The chunked (WY) form of the Gated DeltaNet recurrence (gdn_chunk_ref.h, the reference of the
 * CUDA chunked prefill) against the sequential scan lily_cpu_gdn_scan on random inputs: lengths
 * around the 64-token chunk (1, 63, 64, 65, 200, 1000), value widths 128 and 40, weak and strong
 * decay, from a random non-zero state, and a prefill split into calls whose chunk boundaries fall
 * elsewhere than the scan's. Output and final state are compared (relative L2 error). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "backend/cpu/ops.h"
#include "gdn_chunk_ref.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(((uint32_t)(rng >> 11) & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}

static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* n tokens of one head (Dk = 128) in calls of `split` tokens (the chunked form restarts its
 * 64-token chunks at every call); decay scale: log lambda in [-decay, 0). */
static void run_case(int Dv, int n, int split, float decay) {
    const int Dk = 128;
    float *q = malloc((size_t)n * Dk * 4), *k = malloc((size_t)n * Dk * 4);
    float *v = malloc((size_t)n * Dv * 4), *beta = malloc((size_t)n * 4);
    float *lg = malloc((size_t)n * 4), *lam = malloc((size_t)n * 4);
    float *S0 = malloc((size_t)Dk * Dv * 4), *Sr = malloc((size_t)Dk * Dv * 4);
    float *Sc = malloc((size_t)Dk * Dv * 4);
    float *orf = malloc((size_t)n * Dv * 4), *oc = malloc((size_t)n * Dv * 4);
    for (int t = 0; t < n; t++) {
        double qq = 0, kk = 0;
        for (int d = 0; d < Dk; d++) {
            q[(size_t)t * Dk + d] = frand(), k[(size_t)t * Dk + d] = frand();
            qq += (double)q[(size_t)t * Dk + d] * q[(size_t)t * Dk + d];
            kk += (double)k[(size_t)t * Dk + d] * k[(size_t)t * Dk + d];
        }
        for (int d = 0; d < Dk; d++)
            q[(size_t)t * Dk + d] *= (float)(1.0 / sqrt(qq * Dk)),
                k[(size_t)t * Dk + d] *= (float)(1.0 / sqrt(kk));
        for (int x = 0; x < Dv; x++)
            v[(size_t)t * Dv + x] = 2.0f * frand();
        beta[t] = 0.5f + 0.5f * frand();
        lg[t] = -decay * 0.5f * (1.0f + frand());
        lam[t] = expf(lg[t]);
    }
    for (size_t x = 0; x < (size_t)Dk * Dv; x++)
        S0[x] = 0.5f * frand();
    memcpy(Sr, S0, (size_t)Dk * Dv * 4);
    memcpy(Sc, S0, (size_t)Dk * Dv * 4);
    memset(oc, 0, (size_t)n * Dv * 4);
    lily_cpu_gdn_scan(Sr, Dk, Dv, n, q, Dk, k, Dk, v, Dv, beta, lam, 1, orf, Dv);
    int rc = 0;
    for (int t0 = 0; t0 < n && !rc; t0 += split) {
        int m = n - t0 < split ? n - t0 : split;
        rc = gdn_chunk_ref(Sc, Dk, Dv, m, q + (size_t)t0 * Dk, Dk, k + (size_t)t0 * Dk, Dk,
                           v + (size_t)t0 * Dv, Dv, beta + t0, lg + t0, 1, oc + (size_t)t0 * Dv, Dv,
                           64);
    }
    double eo = rel_err(oc, orf, (size_t)n * Dv), es = rel_err(Sc, Sr, (size_t)Dk * Dv);
    char what[128];
    snprintf(what, sizeof what, "chunked vs scan Dv=%d n=%d calls of %d decay %.2g", Dv, n, split,
             decay);
    check(!rc && eo < 1e-5 && es < 1e-5, what, "out rel %.3g, state rel %.3g", eo, es);
    free(q), free(k), free(v), free(beta), free(lg), free(lam), free(S0), free(Sr), free(Sc);
    free(orf), free(oc);
}

int main(void) {
    const int lens[] = {1, 63, 64, 65, 200, 1000};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        run_case(128, lens[i], lens[i], 0.1f);
        run_case(40, lens[i], lens[i], 3.0f);
    }
    run_case(128, 1000, 1000, 30.0f); /* decay strong enough to empty the state in a step */
    run_case(128, 265, 100, 0.5f);    /* a prefill in calls of 100: boundaries at 64, 100, 164 */
    run_case(8, 130, 7, 1.0f);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
