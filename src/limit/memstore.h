/* sluice - memstore.h: rate-limit decisions in process (backend: memory).
 *
 * The same decisions as the Redis store (scripts/limit.lua), made by the pure
 * C algorithms of limiter.c on a table of keys shared by all worker threads.
 * Synchronous and thread-safe: keys live in striped hash tables, each stripe
 * with its own mutex; one decision locks the stripes of its keys in ascending
 * order, checks every limit, and consumes from all of them or from none. */
#ifndef SLUICE_MEMSTORE_H
#define SLUICE_MEMSTORE_H

#include <stddef.h>
#include <stdint.h>
#include "backend.h"

struct event_base;
struct memstore;

/* At most max_keys keys are kept (raised to STORE_MAX_LIMITS if lower).
 * Keys whose state is back to "absent" (what Redis would have expired) are
 * reclaimed by a bounded sweep on each decision; beyond the bound the least
 * recently used key of its stripe is evicted, which forgets its count (the
 * client gets a fresh quota: the limiter fails open, never closed). Keys
 * that deny now (a denial's retry time, or a used-up quota, still ahead) go
 * only when every key of the stripe denies, so new keys cannot push a
 * denied one out. */
struct memstore *memstore_create(size_t max_keys);
void memstore_destroy(struct memstore *m);  /* no decision may be running */

/* An in-process backend (backend.h) on base over the process's shared
 * memstore m (not owned: it outlives every backend made on it). */
struct backend *memstore_backend_create(struct event_base *base, struct memstore *m);

/* Decide limits[0..n) at now_us (the caller's clock, CLOCK_REALTIME-based
 * microseconds in the proxy) and fill res as the Redis store does: status
 * STORE_OK, allowed, and per limit r[i] with limit filled, honouring
 * STORE_SHADOW and STORE_CHECK_ONLY as limit.lua does. Keys are copied;
 * limits[] need only live during the call. Returns 0, or -1 with res->status
 * STORE_ERROR when n is outside 1..STORE_MAX_LIMITS or a limit's parameters
 * or cost are ones limit.lua would refuse. */
int memstore_decide(struct memstore *m, const struct store_limit *limits, int n,
                    int64_t now_us, struct store_result *res);

/* Concurrency and delay, for the backend's release/renew/refund verbs
 * (backend.h), under the key's stripe lock:
 *   memstore_release   gives slot back (a request ended)
 *   memstore_renew     renews slot's lease (or takes it again if free);
 *                      1 when held after
 *   memstore_refund    gives back cost units a token_bucket or gcra
 *                      reservation took (a held request's client went away) */
void memstore_release(struct memstore *m, const struct store_limit *l, int64_t now_us);
int memstore_renew(struct memstore *m, const struct store_limit *l, int64_t now_us);
void memstore_refund(struct memstore *m, const struct store_limit *l, int64_t now_us);

/* Keys held now (tests, metrics). */
size_t memstore_count(struct memstore *m);

/* Run-time overrides (the admin API): key (a limit's key, as for
 * decisions) gets params instead of the caller's, for limits of the same
 * algorithm, until expire_us (CLOCK_REALTIME-based us; 0: until deleted).
 * Thread-safe. set: 0, or -1 when MEMSTORE_MAX_OVERRIDES are held. get: 1
 * and *p (and *expire_us when not NULL) when one is set. del: 1 when one
 * was. */
#define MEMSTORE_MAX_OVERRIDES 100000
int memstore_override_set(struct memstore *m, const char *key, size_t len,
                          const struct limiter_params *p, int64_t expire_us);
int memstore_override_get(struct memstore *m, const char *key, size_t len, int64_t now_us,
                          struct limiter_params *p, int64_t *expire_us);
int memstore_override_del(struct memstore *m, const char *key, size_t len);

/* Forget key's counts (the admin API's reset): 1 when it was held. */
int memstore_reset(struct memstore *m, const char *key, size_t len);

#endif
