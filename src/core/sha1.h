/* sluice - sha1.h: SHA-1 (FIPS 180-4), our own small implementation.
 *
 * Used where a long or hostile byte string must become a short fixed token:
 * route.c replaces key parts longer than ROUTE_MAX_PART by their SHA-1, so a
 * Redis key stays bounded whatever a client sends. Not for anything that
 * needs collision resistance against a determined attacker's choice of both
 * inputs; a key part only needs that distinct values stay distinct in practice.
 * Pure functions, no allocation. */
#ifndef SLUICE_SHA1_H
#define SLUICE_SHA1_H

#include <stddef.h>
#include <stdint.h>

#define SHA1_DIGEST_BYTES 20
#define SHA1_HEX_BYTES    41    /* 40 hex digits and a NUL */

/* Incremental state: init, any number of updates, final. Lives on the
 * caller's stack; nothing to free. */
struct sha1_ctx {
    uint32_t h[5];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t used;                /* bytes waiting in block */
};

void sha1_init(struct sha1_ctx *s);
void sha1_update(struct sha1_ctx *s, const void *data, size_t len);
void sha1_final(struct sha1_ctx *s, uint8_t out[SHA1_DIGEST_BYTES]);

/* One-shot digest of data[0..len). */
void sha1_digest(const void *data, size_t len, uint8_t out[SHA1_DIGEST_BYTES]);

/* Lower-case hex of the digest, NUL-terminated, into out[41]. */
void sha1_hex(const void *data, size_t len, char out[SHA1_HEX_BYTES]);

/* Lower-case hex of a finished digest into out[41]. */
void sha1_tohex(const uint8_t digest[SHA1_DIGEST_BYTES], char out[SHA1_HEX_BYTES]);

#endif
