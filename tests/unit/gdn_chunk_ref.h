/* The chunked (WY) form of the Gated DeltaNet recurrence, in plain C: the reference of the CUDA
 * chunked prefill (backend/cuda/gdn_chunk.cu), which follows the same two phases. Header-only,
 * for tests (test_gdn_chunk checks it against lily_cpu_gdn_scan).
 *
 * One value head; the recurrence is S_t = lam_t S_{t-1} + k_t d_t^T with
 * d_t = beta_t (v_t - lam_t S_{t-1}^T k_t) and o_t = S_t^T q_t (q, k already normalised). Within a
 * chunk of c tokens from state S0, with G_t = sum of log(lam) over the chunk's tokens up to t (so
 * exp(G_t - G_s) <= 1 is the decay from s to t):
 *     A[t][s] = beta_t exp(G_t - G_s) k_t.k_s   (s < t)        P[t][s] = exp(G_t - G_s) q_t.k_s  (s <= t)
 *     (I + A) W = diag(beta exp(G)) K,   (I + A) U = diag(beta) V     (forward substitution)
 *     d = U - W S0,   o_t = exp(G_t) S0^T q_t + sum_{s<=t} P[t][s] d_s,
 *     S = exp(G_c) S0 + sum_s exp(G_c - G_s) k_s d_s^T.
 * Phase 1 (A, P, W, U) does not depend on the state, so every chunk runs it in parallel; phase 2
 * (d, o, S) is the chain over chunks. */
#ifndef LILY_TESTS_UNIT_GDN_CHUNK_REF_H
#define LILY_TESTS_UNIT_GDN_CHUNK_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* S: [Dk][Dv] row-major, updated; q, k, v rows at their strides; beta and lg (log lambda) at
 * t * ldg; o: [n][ldo]. Chunks of `chunk` tokens (the last one shorter). Returns 0, or -1 when
 * out of memory. */
static int gdn_chunk_ref(float *S, int Dk, int Dv, int n, const float *q, int ldq, const float *k,
                         int ldk, const float *v, int ldv, const float *beta, const float *lg,
                         int ldg, float *o, int ldo, int chunk) {
    const int C = chunk;
    double *G = malloc((size_t)C * sizeof *G);
    float *A = malloc((size_t)C * C * 4), *P = malloc((size_t)C * C * 4);
    float *W = malloc((size_t)C * Dk * 4), *U = malloc((size_t)C * Dv * 4);
    float *D = malloc((size_t)C * Dv * 4);
    int rc = G && A && P && W && U && D ? 0 : -1;
    for (int t0 = 0; t0 < n && !rc; t0 += C) {
        const int c = n - t0 < C ? n - t0 : C;
        const float *qc = q + (size_t)t0 * ldq, *kc = k + (size_t)t0 * ldk;
        const float *vc = v + (size_t)t0 * ldv;
        double acc = 0;
        for (int t = 0; t < c; t++)
            acc += lg[(size_t)(t0 + t) * ldg], G[t] = acc;
        /* phase 1: A, P, then W and U by forward substitution */
        for (int t = 0; t < c; t++)
            for (int s = 0; s < c; s++) {
                float kk = 0, qk = 0;
                for (int d = 0; d < Dk; d++) {
                    kk += kc[(size_t)t * ldk + d] * kc[(size_t)s * ldk + d];
                    qk += qc[(size_t)t * ldq + d] * kc[(size_t)s * ldk + d];
                }
                float dec = s <= t ? (float)exp(G[t] - G[s]) : 0.f;
                A[(size_t)t * C + s] = s < t ? beta[(size_t)(t0 + t) * ldg] * dec * kk : 0.f;
                P[(size_t)t * C + s] = qk * dec;
            }
        for (int t = 0; t < c; t++) {
            float bt = beta[(size_t)(t0 + t) * ldg], bg = bt * (float)exp(G[t]);
            for (int d = 0; d < Dk; d++)
                W[(size_t)t * Dk + d] = bg * kc[(size_t)t * ldk + d];
            for (int x = 0; x < Dv; x++)
                U[(size_t)t * Dv + x] = bt * vc[(size_t)t * ldv + x];
            for (int s = 0; s < t; s++) {
                float a = A[(size_t)t * C + s];
                for (int d = 0; d < Dk; d++)
                    W[(size_t)t * Dk + d] -= a * W[(size_t)s * Dk + d];
                for (int x = 0; x < Dv; x++)
                    U[(size_t)t * Dv + x] -= a * U[(size_t)s * Dv + x];
            }
        }
        /* phase 2: d = U - W S0; o; the new state */
        for (int t = 0; t < c; t++) {
            float *ot = o + (size_t)(t0 + t) * ldo, gt = (float)exp(G[t]);
            for (int x = 0; x < Dv; x++) {
                float ws = 0, qs = 0;
                for (int d = 0; d < Dk; d++) {
                    ws += W[(size_t)t * Dk + d] * S[(size_t)d * Dv + x];
                    qs += qc[(size_t)t * ldq + d] * S[(size_t)d * Dv + x];
                }
                D[(size_t)t * Dv + x] = U[(size_t)t * Dv + x] - ws;
                ot[x] = gt * qs;
            }
        }
        for (int t = 0; t < c; t++)
            for (int s = 0; s <= t; s++) {
                float p = P[(size_t)t * C + s];
                for (int x = 0; x < Dv; x++)
                    o[(size_t)(t0 + t) * ldo + x] += p * D[(size_t)s * Dv + x];
            }
        float gc = (float)exp(G[c - 1]);
        for (int d = 0; d < Dk; d++)
            for (int x = 0; x < Dv; x++) {
                float a = gc * S[(size_t)d * Dv + x];
                for (int s = 0; s < c; s++)
                    a += (float)exp(G[c - 1] - G[s]) * kc[(size_t)s * ldk + d] *
                         D[(size_t)s * Dv + x];
                S[(size_t)d * Dv + x] = a;
            }
    }
    free(G), free(A), free(P), free(W), free(U), free(D);
    return rc;
}

#endif
