/* sluice - digest.h: SHA-1 in hex, the one digest sluice shows (long key
 * parts in Redis keys, credentials on the console). OpenSSL's, behind two
 * calls, so no other file of those layers includes OpenSSL for it. */
#ifndef SLUICE_DIGEST_H
#define SLUICE_DIGEST_H

#include <stddef.h>

#define DIGEST_SHA1_HEX 40

struct digest;

/* A running SHA-1; aborts when out of memory, as mem.c. */
struct digest *digest_sha1(void);
void digest_update(struct digest *d, const void *data, size_t len);
/* Writes DIGEST_SHA1_HEX lowercase hex digits and a NUL; frees d. */
void digest_final_hex(struct digest *d, char hex[DIGEST_SHA1_HEX + 1]);
/* The same over one buffer. */
void digest_sha1_hex(const void *data, size_t len, char hex[DIGEST_SHA1_HEX + 1]);

#endif
