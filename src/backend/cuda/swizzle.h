/* The 128-byte shared-memory swizzle of wgmma operands (descriptor layout type 1), as the
 * kernels that write such planes use it (gemm_wg.cu's activation planes, attn_wg.cuh's Q / K / V
 * planes with SWZ). C and CUDA, so a host test (tests/unit/test_swizzle.c) checks the index maps
 * against the hardware's reading of them without a GPU.
 *
 * A plane is rows of 128 bytes in atoms of 8 rows (1 KB, 1 KB-aligned); the 16-byte chunk c of
 * row r sits at chunk position (c ^ r) % 8 of its row. A wgmma descriptor of such a plane gives
 * the start address (the atom base plus the k step's byte offset inside the row), SBO = 1 KB
 * between atoms; the tensor core reads logical row r, byte b of the k step at the address
 * start + (r / 8) 1 KB + (r % 8) 128 + b with address bits [4, 7) xor bits [7, 10). */
#ifndef LILY_BACKEND_CUDA_SWIZZLE_H
#define LILY_BACKEND_CUDA_SWIZZLE_H

#include <stdint.h>

#ifdef __CUDACC__
#define LILY_SWZ_FN static __host__ __device__ __forceinline__
#else
#define LILY_SWZ_FN static inline
#endif

/* Byte offset of chunk c (16 bytes) of row r in a swizzled plane. */
LILY_SWZ_FN uint32_t lily_swz128(int r, int c) {
    return (uint32_t)(((r >> 3) << 10) + ((r & 7) << 7) + (((c ^ r) & 7) << 4));
}

/* Bytes to skip from a shared-memory address to the next 1 KB boundary (the swizzle is a
 * function of the absolute address, so a kernel aligns its planes' base with this). */
LILY_SWZ_FN uint32_t lily_swz128_pad(uint32_t shared_addr) {
    return (1024u - (shared_addr & 1023u)) & 1023u;
}

/* The byte the tensor core reads for row r, byte b (< 128 - the start's offset in the row) of a
 * k step whose descriptor starts at `start` (an offset from a 1 KB-aligned base). */
LILY_SWZ_FN uint32_t lily_swz128_read(uint32_t start, int r, int b) {
    const uint32_t x = start + (uint32_t)((r >> 3) << 10) + (uint32_t)((r & 7) << 7) + (uint32_t)b;
    return x ^ (((x >> 7) & 7u) << 4);
}

/* gemm_wg.cu's Q4 code tiles: rows of 32 bytes (64 codes), 16-byte half `part` of row r at
 * this offset; the halves swap where bit 2 of the row is set, so the dequantization's 32-bit
 * reads of 8 consecutive rows (4 lanes a row) hit 32 distinct banks. */
LILY_SWZ_FN uint32_t lily_swz32(int r, int part) {
    return (uint32_t)(r * 32 + ((part ^ ((r >> 2) & 1)) << 4));
}

/* Where a TMA copy with the 32-byte / 128-byte swizzle puts byte b of row r of its box (rows of
 * 32 / 128 bytes from a base aligned to 256 bytes / 1 KB): address bit 4 xor bit 7, bits [4, 7)
 * xor [7, 10) (CUDA's CU_TENSOR_MAP_SWIZZLE_32B / _128B; gemm_wg.cu's form 4 relies on them
 * landing as lily_swz32 and lily_swz128). */
LILY_SWZ_FN uint32_t lily_tma_swz32(int r, int b) {
    const uint32_t x = (uint32_t)(r * 32 + b);
    return x ^ (((x >> 7) & 1u) << 4);
}
LILY_SWZ_FN uint32_t lily_tma_swz128(int r, int b) {
    const uint32_t x = (uint32_t)(r * 128 + b);
    return x ^ (((x >> 7) & 7u) << 4);
}

/* The attention's K conversion with swizzled planes (attn_wg.cuh k_unit): unit u (0..1023) of
 * a tile converts the 32-byte piece (16 dims) lily_attn_k_piece(u) of landed position u % 64.
 * The piece is u / 64 with its low 3 bits xor (p % 8) / 2: per position a permutation of the 16
 * pieces, and over 8 consecutive positions the landing reads (piece % 4) stay 2-way while the
 * swizzled writes ((piece ^ p) % 8) hit 8 distinct 16-byte bank groups. */
LILY_SWZ_FN int lily_attn_k_piece(int u) {
    const int p = u & 63;
    return (u >> 6) ^ ((p & 7) >> 1);
}

#endif
