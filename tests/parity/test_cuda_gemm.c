/* GPU tensor-core prefill GEMM (backend/cuda/gemm.h) against lily_cpu_matmul on random Q4, Q8,
 * BF16 and F32 (rounded to BF16) weights: odd row counts (partial 128-row tiles), token counts
 * around the 64-token tile (1, 63, 64, 65, 200), widths from one group (64) to 4096, strided X and
 * Y, and the accumulate epilogue. Operands go through bf16 on the tensor cores, so the tolerance is
 * that of a bf16 matmul with fp32 accumulation. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include "backend/cuda/gemm.h"
#include "parity_util.h"

static void gemm_case(lily_dtype dt, int M, int K, int n, int accumulate) {
    lily_err e;
    char name[160];
    int ldx = K + 4, ldy = M + 3;
    lily_mat W = pt_mat(dt, M, K);
    lily_dmat dW;
    if (!pt_ok(lily_cuda_dmat_upload(&W, 1, &dW, &e), "upload", &e)) return;
    float *X = malloc((size_t)n * ldx * 4), *Y0 = malloc((size_t)n * ldy * 4);
    float *ref = malloc((size_t)n * ldy * 4);
    pt_fill(X, (size_t)n * ldx, 2.0f);
    pt_fill(Y0, (size_t)n * ldy, 1.0f);
    memcpy(ref, Y0, (size_t)n * ldy * 4);
    float *tmp = malloc((size_t)n * M * 4);
    lily_cpu_matmul(&W, X, n, ldx, tmp, M, NULL);
    for (int t = 0; t < n; t++)
        for (int o = 0; o < M; o++)
            ref[(size_t)t * ldy + o] =
                (accumulate ? ref[(size_t)t * ldy + o] : 0) + tmp[(size_t)t * M + o];
    float *dX = pt_dup(X, (size_t)n * ldx), *dY = pt_dup(Y0, (size_t)n * ldy);
    int rc = lily_cuda_gemm(&dW, dX, ldx, n, dY, ldy, accumulate, NULL, &e);
    if (!pt_ok(rc, "gemm launch", &e)) return;
    float *got = malloc((size_t)n * ldy * 4);
    pt_get(got, dY, (size_t)n * ldy);
    static const char *dts[] = {"f32", "bf16", "f16", "q4", "q8"};
    snprintf(name, sizeof name, "gemm %s W[%d x %d] n=%d%s", dts[dt], M, K, n,
             accumulate ? " accumulate" : "");
    pt_check(name, got, ref, (size_t)n * ldy, 1e-2);
    lily_cuda_free(dX), lily_cuda_free(dY);
    lily_cuda_dmat_free(&dW);
    pt_mat_free(&W);
    free(X), free(Y0), free(ref), free(tmp), free(got);
}

int main(void) {
    pt_need_gpu();
    gemm_case(LILY_DT_Q4, 1000, 2048, 65, 0);
    gemm_case(LILY_DT_Q4, 8192, 2048, 200, 0);
    gemm_case(LILY_DT_Q4, 37, 4096, 64, 1);
    gemm_case(LILY_DT_Q4, 2048, 512, 1, 1);
    gemm_case(LILY_DT_Q4, 129, 64, 63, 0);
    gemm_case(LILY_DT_Q8, 256, 2048, 77, 0);
    gemm_case(LILY_DT_Q8, 1, 2048, 130, 0);
    gemm_case(LILY_DT_BF16, 300, 1024, 64, 0);
    gemm_case(LILY_DT_BF16, 127, 192, 3, 1);
    gemm_case(LILY_DT_F32, 200, 320, 100, 0);
    lily_err e;
    float dummy[8];
    lily_dmat bad = {0};
    bad.n_mats = 2;
    pt_check_true("gemm rejects a stack of matrices",
                  lily_cuda_gemm(&bad, dummy, 8, 1, dummy, 8, 0, NULL, &e) == -1);
    return pt_finish();
}
#endif
