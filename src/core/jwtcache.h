/* sluice - jwtcache.h: tokens one worker has verified, so a repeat costs
 * no signature check.
 *
 * Bounded (the least recently used goes first), keyed by the SHA-256 of
 * the token and the key set that verified it (jwt_keys_id: a reload's new
 * keys never see what old keys verified). An entry expires at its token's
 * exp (plus leeway): past it the token is expired, as jwt_verify says.
 * Only verified tokens are kept. One cache per worker, used from its
 * thread only. */
#ifndef SLUICE_JWTCACHE_H
#define SLUICE_JWTCACHE_H

#include <stddef.h>
#include <stdint.h>
#include "jwt.h"

#define JWTCACHE_MAX_TOKENS 10000

struct jwtcache;

/* max_tokens 0: every lookup verifies. */
struct jwtcache *jwtcache_create(size_t max_tokens);
void jwtcache_destroy(struct jwtcache *jc);

/* jwt_verify through the cache: the same status; on JWT_OK the claims in
 * *claims[0..*claims_len), which stay valid until the next call on jc (the
 * caller copies what it keeps), and *hit says whether the cache answered
 * (no signature was checked). */
int jwtcache_verify(struct jwtcache *jc, const struct jwt_keys *keys,
                    const struct jwt_rules *rules, const char *token, size_t len,
                    int64_t now_s, const char **claims, size_t *claims_len, int *hit);

size_t jwtcache_size(const struct jwtcache *jc);

#endif
