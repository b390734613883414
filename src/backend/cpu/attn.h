/* What attn.c's task bodies share (the AVX-512 and plain ones there, the AVX2 one in
 * attn_avx2.c): one attention call's job. */
#ifndef LILY_BACKEND_CPU_ATTN_H
#define LILY_BACKEND_CPU_ATTN_H

#include <stddef.h>

#define AT_BLOCK             64 /* positions per softmax block */
#define LILY_ATTN_AVX2_LANES 8  /* query rows per task of the AVX2 body */

typedef struct {
    const float *q, *kc, *vc;
    float *out;
    int n, pos, Nq, Nkv, Dh;
    float scale;
    float *scratch;
    size_t stride; /* floats of scratch per thread */
    int chunks;    /* tasks per KV head (the lane-parallel bodies) */
} attn_job;

/* The AVX2 + FMA task (attn_avx2.c): task = KV head x chunks + chunk of LILY_ATTN_AVX2_LANES
 * query rows (token-major rows (t, r) of the head's group), as attn.c's AVX-512 task with 16. */
void lily_cpu_attn_task_avx2(void *ctx, int task, int thread);

#endif
