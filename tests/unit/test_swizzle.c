/* The 128-byte swizzled operand planes (src/backend/cuda/swizzle.h) checked on the host: every
 * plane the kernels write that way is a bijection onto its bytes, the tensor core's reading of
 * each descriptor (the documented xor of address bits [4, 7) with [7, 10)) returns exactly the
 * element the kernel wrote there, and the attention's K conversion order covers each tile once
 * with conflict-free swizzled writes. Runs without a GPU (the kernels' index maps only). */
#include "backend/cuda/swizzle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"

/* Marks bytes [off, off + len) of a plane of `size` bytes as written by element id; returns 0
 * when one was already written or the range leaves the plane. */
static int mark(int *owner, int size, uint32_t off, int len, int id) {
    if (off + (uint32_t)len > (uint32_t)size) return 0;
    for (int i = 0; i < len; i++) {
        if (owner[off + i] >= 0) return 0;
        owner[off + i] = id;
    }
    return 1;
}

/* gemm_wg.cu, SWZ: a stage's activation plane of NT tokens x 64 k values (fp16, 128 bytes a
 * token); token t's chunk c (k values 8c .. 8c + 7) at lily_swz128(t, c); k slice s (16 values)
 * is read by a descriptor starting 32 s bytes into the plane. */
static void gemm_planes(int NT) {
    const int size = NT * 128;
    int *owner = malloc(sizeof(int) * size);
    memset(owner, 0xff, sizeof(int) * size);
    int ok = 1, bad_read = 0;
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < 8; c++)
            ok &= mark(owner, size, lily_swz128(t, c), 16, t * 8 + c);
    for (int i = 0; i < size; i++)
        ok &= owner[i] >= 0;
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < NT; t++)
            for (int b = 0; b < 32; b++) {
                /* byte b of slice s of token t: chunk 2 s + b / 16, byte b % 16 of it */
                const uint32_t at = lily_swz128_read(32u * s, t, b);
                const int want = t * 8 + 2 * s + b / 16;
                const uint32_t wrote = lily_swz128(t, 2 * s + b / 16) + (uint32_t)(b % 16);
                bad_read += at >= (uint32_t)size || owner[at] != want || at != wrote;
            }
    char what[96];
    snprintf(what, sizeof what, "gemm_wg planes, %d tokens: a bijection", NT);
    check(ok, what, NULL);
    snprintf(what, sizeof what, "gemm_wg planes, %d tokens: descriptors read what was written", NT);
    check(bad_read == 0, what, "%d bytes wrong", bad_read);
    free(owner);
}

/* gemm_wg.cu's code tiles (256 rows of 32 bytes) and form 4's TMA copies: the tile is a
 * bijection, the dequantization's reads (row r = 8 j + g, 32-bit word q of half h) of a warp's 8
 * rows x 4 lanes hit 32 distinct banks, and the 32-byte swizzled TMA box lands every byte where
 * lily_swz32 puts it; the 128-byte swizzled box of both planes ([2][NT][128 bytes]) lands where
 * lily_swz128 puts it, the lo plane NT x 128 bytes after hi. */
static void gemm_tma(void) {
    const int size = 256 * 32;
    int *owner = malloc(sizeof(int) * size);
    memset(owner, 0xff, sizeof(int) * size);
    int ok = 1, conflicts = 0, bad32 = 0, bad128 = 0;
    for (int r = 0; r < 256; r++)
        for (int p = 0; p < 2; p++)
            ok &= mark(owner, size, lily_swz32(r, p), 16, 2 * r + p);
    for (int r0 = 0; r0 < 256; r0 += 8)
        for (int h = 0; h < 2; h++) {
            uint32_t banks = 0;
            for (int g = 0; g < 8; g++)
                for (int q = 0; q < 4; q++)
                    banks |= 1u << ((lily_swz32(r0 + g, h) / 4 + q) % 32);
            conflicts += banks != 0xffffffffu;
        }
    for (int r = 0; r < 256; r++)
        for (int b = 0; b < 32; b++)
            bad32 += lily_tma_swz32(r, b) != lily_swz32(r, b / 16) + (uint32_t)(b % 16);
    for (int NT = 64; NT <= 128; NT += 64)
        for (int pl = 0; pl < 2; pl++)
            for (int t = 0; t < NT; t++)
                for (int b = 0; b < 128; b++) {
                    const uint32_t want = (uint32_t)(pl * NT * 128) + lily_swz128(t, b / 16);
                    bad128 += lily_tma_swz128(pl * NT + t, b) != want + (uint32_t)(b % 16);
                }
    check(ok, "gemm_wg code tiles: a bijection", NULL);
    check(conflicts == 0, "gemm_wg code tiles: the dequantization's reads are conflict-free",
          "%d warps with conflicts", conflicts);
    check(bad32 == 0, "gemm_wg code tiles: TMA's 32-byte swizzle lands as lily_swz32",
          "%d bytes elsewhere", bad32);
    check(bad128 == 0, "gemm_wg planes: TMA's 128-byte swizzle lands as lily_swz128",
          "%d bytes elsewhere", bad128);
    free(owner);
}

/* attn_wg.cuh, SWZ: Q and K planes of 64 rows x 256 s8 digits as two 128-byte blocks 8 KB
 * apart (byte col x of row r at (x / 128) 8 KB + lily_swz128(r, (x % 128) / 16) + x % 16), k
 * step ks (32 digits) read from (ks / 4) 8 KB + (ks % 4) 32; V planes of 256 dims x 64
 * positions (fp16: one 128-byte row per dim), k step kk (16 positions) from 32 kk. */
static uint32_t qk_off(int r, int x) {
    return (uint32_t)((x >> 7) * 8192) + lily_swz128(r, (x & 127) >> 4) + (uint32_t)(x & 15);
}

static void attn_planes(void) {
    const int size = 16384;
    int *owner = malloc(sizeof(int) * 32768);
    memset(owner, 0xff, sizeof(int) * size);
    int ok = 1, bad = 0;
    for (int r = 0; r < 64; r++)
        for (int x = 0; x < 256; x++)
            ok &= mark(owner, size, qk_off(r, x), 1, r * 256 + x);
    for (int i = 0; i < size; i++)
        ok &= owner[i] >= 0;
    check(ok, "attention Q / K planes: a bijection", NULL);
    for (int ks = 0; ks < 8; ks++)
        for (int r = 0; r < 64; r++)
            for (int b = 0; b < 32; b++) {
                const uint32_t at = (uint32_t)((ks >> 2) * 8192) +
                                    lily_swz128_read((uint32_t)((ks & 3) * 32), r, b);
                bad += owner[at] != r * 256 + ks * 32 + b;
            }
    check(bad == 0, "attention Q / K descriptors read digit ks * 32 + b of row r", "%d wrong", bad);
    /* V: dim d's positions 8 pc .. 8 pc + 7 (16 bytes) at lily_swz128(d, pc) */
    memset(owner, 0xff, sizeof(int) * 32768);
    ok = 1, bad = 0;
    for (int d = 0; d < 256; d++)
        for (int pc = 0; pc < 8; pc++)
            ok &= mark(owner, 32768, lily_swz128(d, pc), 16, d * 8 + pc);
    for (int i = 0; i < 32768; i++)
        ok &= owner[i] >= 0;
    check(ok, "attention V planes: a bijection", NULL);
    for (int kk = 0; kk < 4; kk++)
        for (int d = 0; d < 256; d++)
            for (int b = 0; b < 32; b++) {
                const uint32_t at = lily_swz128_read(32u * kk, d, b);
                bad += owner[at] != d * 8 + 2 * kk + b / 16;
            }
    check(bad == 0, "attention V descriptors read positions 16 kk .. of dim d", "%d wrong", bad);
    free(owner);
}

/* The K conversion order: units u = 0..1023 cover (position, piece) once; a warp's 32
 * consecutive units, in phases of 8 lanes (16-byte shared accesses), read the landing (row p at
 * 512 p, piece at 32 c: bank group (2 c) % 8) at most 2-way and write the swizzled plane (bank
 * group (c ^ p) % 8) without conflict. */
static void attn_k_order(void) {
    int seen[64 * 16], ok = 1, worst_read = 0, worst_write = 0;
    memset(seen, 0, sizeof seen);
    for (int u = 0; u < 1024; u++) {
        const int c = lily_attn_k_piece(u);
        ok &= c >= 0 && c < 16;
        if (c >= 0 && c < 16) seen[(u & 63) * 16 + c]++;
    }
    for (int i = 0; i < 64 * 16; i++)
        ok &= seen[i] == 1;
    check(ok, "attention K conversion units: each (position, piece) once", NULL);
    for (int u0 = 0; u0 < 1024; u0 += 8) {
        int rd[8] = {0}, wr[8] = {0};
        for (int u = u0; u < u0 + 8; u++) {
            const int p = u & 63, c = lily_attn_k_piece(u);
            rd[(2 * c) & 7]++;
            wr[(c ^ p) & 7]++;
        }
        for (int g = 0; g < 8; g++) {
            worst_read = rd[g] > worst_read ? rd[g] : worst_read;
            worst_write = wr[g] > worst_write ? wr[g] : worst_write;
        }
    }
    check(worst_read <= 2, "attention K conversion: landing reads at most 2-way", "%d-way",
          worst_read);
    check(worst_write == 1, "attention K conversion: swizzled writes conflict-free", "%d-way",
          worst_write);
}

int main(void) {
    gemm_planes(128);
    gemm_planes(64);
    gemm_tma();
    attn_planes();
    attn_k_order();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
