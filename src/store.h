/* sluice - store.h: rate-limit decisions in Redis.
 *
 * One store is one Redis connection (rconn.h) on one event base (one per
 * worker), with its own resolver (evdns) and TLS context. Every decision is one EVALSHA of scripts/limit.lua carrying all
 * limits of a route: the script reads Redis TIME, decides every limit, and
 * consumes from all of them only when all allow. Calls from concurrent
 * requests are pipelined on the connection. The store reconnects by itself
 * with backoff, reloads the script on NOSCRIPT, and times each call out after
 * redis.timeout.
 *
 * With redis.cluster a store keeps one connection per master, learns the
 * slot map (CLUSTER SLOTS), sends each limit to the master of its key's slot
 * and follows MOVED, ASK and TRYAGAIN; limits of one route in several slots
 * are decided per slot in parallel and given back (scripts/refund.lua) when
 * another slot denies. With redis.sentinel it asks the sentinels for the
 * master and follows +switch-master. */
#ifndef SLUICE_STORE_H
#define SLUICE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "conf.h"
#include "limiter.h"

#define STORE_MAX_LIMITS CONF_MAX_LIMITS

struct event_base;
struct store;
struct store_call;

/* One limit of a decision. key and params must stay valid until
 * store_decide() returns (the store copies what it sends). */
struct store_limit {
    const char *key;
    size_t keylen;
    const struct limiter_params *params;
    int64_t cost;               /* units this request consumes, >= 1 */
    unsigned flags;             /* STORE_SHADOW, STORE_CHECK_ONLY */
};

/* A shadow limit is decided and consumed like the others but its denial
 * never denies the request. A check-only limit can deny but consumes
 * nothing (count_status: it is consumed after the response, if at all). */
#define STORE_SHADOW     1u
#define STORE_CHECK_ONLY 2u

/* STORE_OOM: Redis refused the script with -OOM (maxmemory reached under
 * maxmemory-policy noeviction); any other error reply is STORE_ERROR. */
enum store_status { STORE_OK, STORE_ERROR, STORE_TIMEOUT, STORE_OOM };

struct store_result {
    enum store_status status;
    int allowed;                /* STORE_OK: every limit allowed */
    int n;
    struct limiter_result r[STORE_MAX_LIMITS];  /* in the order given */
};

/* Called exactly once per call not cancelled, never from inside
 * store_decide(). res is valid only during the call. */
typedef void store_cb(void *arg, const struct store_result *res);

/* Connects in the background; never blocks. rc is copied. */
struct store *store_create(struct event_base *base, const struct conf_redis *rc);
void store_destroy(struct store *s);   /* pending callbacks are not called */

/* Decide limits[0..n) (1 <= n <= STORE_MAX_LIMITS). While a connection is
 * being made the call waits for it (within redis.timeout, then
 * STORE_TIMEOUT). Returns NULL when the store is neither connected nor
 * connecting (waiting out a backoff): the caller applies on_error at once. */
struct store_call *store_decide(struct store *s, const struct store_limit *limits,
                                int n, store_cb *cb, void *arg);

/* The caller no longer wants the answer (its client went away). */
void store_cancel(struct store_call *call);

int store_connected(const struct store *s);

/* Whether s's readiness counts in the process-wide gauge behind /readyz and
 * sluice_redis_connected (on from store_create). A store a reload replaced
 * but that still answers the requests started before it counts no more. */
void store_count_ready(struct store *s, int on);

/* 1 when a store made from a would be the same as one made from b. */
int store_same_conf(const struct conf_redis *a, const struct conf_redis *b);

/* While the store is not connected: milliseconds until its next reconnect
 * attempt (the backoff left), 0 when connected or not waiting for one. */
int64_t store_retry_ms(const struct store *s);

/* The Redis Cluster slot of a key (CRC16 of its hash tag, mod 16384). */
int store_slot(const char *key, size_t len);

/* Cluster redirects followed so far by every store of the process (what
 * the store pushed to sluice_redis_redirects_total{kind="ask|moved"}).
 * Thread-safe. */
void store_redirects(uint64_t *ask, uint64_t *moved);

#endif
