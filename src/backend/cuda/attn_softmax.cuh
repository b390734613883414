/* The online-softmax step the attention prefill kernels share (attn.cu, attn_wg.cu; C++ only). */
#ifndef LILY_BACKEND_CUDA_ATTN_SOFTMAX_CUH
#define LILY_BACKEND_CUDA_ATTN_SOFTMAX_CUH

#include <math.h>
#include <stdint.h>

/* One KV tile for the two rows a thread holds in the mma.sync / wgmma accumulator layout: s has NB
 * n8 blocks of 4 scores in the log2 domain (masked ones -inf), values 0 and 1 of a block in row r0,
 * 2 and 3 in row r1, columns 8 nb + 2 tq and + 1; the lane's quad holds the rest of its rows. The
 * running max (m0, m1) and sum (l0, l1) take the tile in; s becomes P times the columns' V scales
 * (vs, 8 NB floats in shared memory) times vf; d0, d1 are the factors O's rows must be rescaled by
 * (the max's change times of, the change of the kernels' V-scale factor). */
template <int NB>
static __device__ __forceinline__ void softmax_tile(float *s, const float *vs, float vf, float of,
                                                    int tq, float &m0, float &m1, float &l0,
                                                    float &l1, float &d0, float &d1) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4 * NB; i++) {
        if ((i & 3) < 2)
            mx0 = fmaxf(mx0, s[i]);
        else
            mx1 = fmaxf(mx1, s[i]);
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    /* a row with nothing valid yet keeps m = -inf: use 0 as the base to avoid inf - inf */
    const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const float2 v = *(const float2 *)(vs + nb * 8 + 2 * tq);
        const float vx = v.x * vf, vy = v.y * vf;
        float *a = s + 4 * nb;
        a[0] = exp2f(a[0] - b0), a[1] = exp2f(a[1] - b0);
        a[2] = exp2f(a[2] - b1), a[3] = exp2f(a[3] - b1);
        s0 += a[0] + a[1];
        s1 += a[2] + a[3];
        /* the V scales of the columns, folded into P once l has its terms */
        a[0] *= vx, a[1] *= vy, a[2] *= vx, a[3] *= vy;
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    l0 = l0 * c0 + s0;
    l1 = l1 * c1 + s1;
    m0 = mn0;
    m1 = mn1;
    d0 = c0 * of;
    d1 = c1 * of;
}

/* The power of two vf the exact prefills scale a tile's V scales by so that P's fp16 parts stay
 * in range and its lo parts normal: max scale * vf in [2^12, 2^13) (P * scale * vf <= 2^13; lo
 * parts fall below 2^-14 only where P * scale * vf < 2^-3, negligible against the row's largest
 * terms). mv: the tile's largest V scale. */
static __device__ __forceinline__ float vscale_factor(float mv) {
    const uint32_t ex = (__float_as_uint(mv) >> 23) & 255u;
    return ex >= 13u && ex <= 253u ? __uint_as_float((266u - ex) << 23) : 1.f;
}

#endif
