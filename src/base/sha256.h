/* SHA-256 (FIPS 180-4), incremental: checks downloaded files against the hub's checksums. */
#ifndef LILY_BASE_SHA256_H
#define LILY_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct lily_sha256 {
    uint32_t h[8];
    uint64_t n;            /* bytes hashed */
    unsigned char buf[64]; /* the partial block */
} lily_sha256;

void lily_sha256_init(lily_sha256 *s);
void lily_sha256_update(lily_sha256 *s, const void *data, size_t len);
/* Writes the digest as 64 lowercase hex digits and a NUL into hex[65]. */
void lily_sha256_hex(lily_sha256 *s, char hex[65]);

#endif
