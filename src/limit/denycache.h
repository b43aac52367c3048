/* sluice - denycache.h: keys Redis has just denied, remembered per worker.
 *
 * When Redis denies a limit's key with a retry-after, nothing can give that
 * key quota back before then, so the worker may deny it by itself until
 * that moment without asking Redis: a flood from one client then costs one
 * Redis call. Bounded: the least recently used entry goes first. One cache
 * per worker, used from its thread only; keys are copied in. */
#ifndef SLUICE_DENYCACHE_H
#define SLUICE_DENYCACHE_H

#include <stddef.h>
#include <stdint.h>

struct denycache;

/* max_keys 0 disables the cache (every lookup misses). */
struct denycache *denycache_create(size_t max_keys);
void denycache_destroy(struct denycache *dc);

/* Remember that a request costing `cost` on key is denied until until_ms
 * (a monotonic clock), by a limit of `limit` (the one the backend applied:
 * a run-time override's, shown again in the cached answers' headers). */
void denycache_put(struct denycache *dc, const char *key, size_t len, int64_t until_ms,
                   int64_t cost, int64_t limit);

/* How long a request costing `cost` on key stays denied after now_ms, or 0
 * when the cache does not know (expired entries are dropped on the way). A
 * cheaper request than the one denied may still fit, so it is not denied.
 * When denied and limit is not NULL, *limit is the limit put with it. */
int64_t denycache_get(struct denycache *dc, const char *key, size_t len, int64_t now_ms,
                      int64_t cost, int64_t *limit);

/* A decision's limits sl[0..n) against the cache at now_ms, each result
 * into r[i] (denied: retry and reset until the entry ends, with the limit
 * put; else allowed with the whole limit, unknown here). 1 when one is
 * denied: the decision is made without the backend. */
struct store_limit;
struct limiter_result;
int denycache_check(struct denycache *dc, const struct store_limit *sl, int n, int64_t now_ms,
                    struct limiter_result *r);

/* The backend's results r[0..n) for sl: each key denied with a retry time
 * is remembered until then, less one tick of the coarse clock the cache is
 * read with (denycache_tick_ms), and not at all when the retry is within a
 * tick, so the cache never refuses a request past the limit's own retry;
 * shadow limits and concurrency (denied until a slot comes back, not for a
 * time) are not remembered. */
void denycache_remember(struct denycache *dc, const struct store_limit *sl, int n,
                        const struct limiter_result *r, int64_t now_ms);

/* The coarse clock's tick (clock_ms: CLOCK_MONOTONIC_COARSE), in ms, >= 1. */
int64_t denycache_tick_ms(void);

size_t denycache_size(const struct denycache *dc);

/* A key was reset or its override changed somewhere (resetbus.h: epoch
 * counts those events): when epoch differs from the one the cache last saw,
 * every entry goes, so no stale denial outlives it. */
void denycache_sync(struct denycache *dc, uint64_t epoch);

#endif
