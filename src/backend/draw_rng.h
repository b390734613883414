/* The random numbers of a token draw, one definition for the CUDA sampler (sample.cu) and its
 * CPU reference (cpu/draw.c): u in (0, 1) from (seed, step, i) by a splitmix64 finaliser of a
 * counter, so the draw of candidate i at a given step needs no state and no order. */
#ifndef LILY_BACKEND_DRAW_RNG_H
#define LILY_BACKEND_DRAW_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define LILY_DRAW_FN __host__ __device__ __forceinline__
#else
#define LILY_DRAW_FN static inline
#endif

LILY_DRAW_FN double lily_draw_uniform(uint64_t seed, uint64_t step, int i) {
    uint64_t z = seed ^ (step * 0xd1b54a32d192ed03ull);
    z += ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) * 0x1p-53;
}

#endif
