/* sluice - store.h: rate-limit decisions in Redis.
 *
 * One store is one Redis connection (rconn.h) on one event base (one per
 * worker), with its own resolver (evdns) and TLS context. A decision
 * carries all limits of a route: scripts/limit.lua reads Redis TIME,
 * decides every limit, and consumes from all of them only when all allow.
 * The decisions made in one event-loop iteration travel to a node in one
 * EVALSHA (a batch, per slot on a cluster, at most 64), sent once the
 * iteration's callbacks have run. The store reconnects by itself
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
#include "backend.h"        /* the decision types: struct store_limit, store_result */
#include "conf.h"

struct event_base;
struct store;
struct store_call;

/* A limit's run-time override (the admin API's PUT .../override) lives in
 * Redis at its counter key followed by this suffix (the same hash tag),
 * holding "ALGO LIMIT INTERVAL_US" (enum limiter_algo; the limit or burst;
 * microseconds per token, 0 for the window algorithms). limit.lua reads it
 * in the call that decides, so every proxy applies it at once. */
#define STORE_OVERRIDE_SUFFIX ":ovr"

/* Connects in the background; never blocks. rc is copied. */
struct store *store_create(struct event_base *base, const struct conf_redis *rc);
void store_destroy(struct store *s);   /* pending callbacks are not called; what it
                                        * owes is dropped (see store_drain) */

/* A Redis backend (backend.h) on base: a store of its own (store_create),
 * behind the backend contract; backend_destroy destroys the store. */
struct backend *store_backend_create(struct event_base *base, const struct conf_redis *rc);

/* Decide limits[0..n) (1 <= n <= STORE_MAX_LIMITS). While a connection is
 * being made the call waits for it (within redis.timeout, then
 * STORE_TIMEOUT). Returns NULL when the store is neither connected nor
 * connecting (waiting out a backoff): the caller applies on_error at once. */
struct store_call *store_decide(struct store *s, const struct store_limit *limits,
                                int n, store_cb *cb, void *arg);

/* The caller no longer wants the answer (its client went away). */
void store_cancel(struct store_call *call);

int store_connected(const struct store *s);

/* Give back what one limit holds for a request, fire and forget (one
 * refund.lua call, pipelined with the decisions; nothing waits for it): a
 * concurrency limit's slot (l->slot) when the request ends, or the cost a
 * held (delayed) token_bucket or gcra request reserved when its client went
 * away. Dropped when the store is not connected: a slot's lease ends it. */
void store_give_back(struct store *s, const struct store_limit *l);
/* The same for a cost_from settlement, and done(arg) once it is answered
 * or given up (from the loop, never from inside this call), unless
 * store_settle_cancel(its request) first. NULL: nothing was sent (nothing
 * to settle, or Redis unavailable: given up at once), nothing follows. */
struct store_req;
struct store_req *store_settle(struct store *s, const struct store_limit *l,
                               void (*done)(void *arg), void *arg);
void store_settle_cancel(struct store_req *q);

/* The owner is done with s (every call answered or cancelled) but s may
 * still owe Redis give-backs and refunds it has queued: a reload that
 * replaced the store must not drop them, or Redis keeps those concurrency
 * slots and reservations until their leases end. Returns 0 when s owes
 * nothing (free it now). Else 1: s stays connected until every one is
 * answered or given up, at most 2 s (a refund's own budget) + redis.timeout,
 * and then
 * done(arg) runs once, from the loop, outside the store's callbacks; the
 * caller then frees s with store_destroy() (which may also come first:
 * done is then never called). Not from inside a store callback. */
int store_drain(struct store *s, void (*done)(void *arg), void *arg);

/* 0 when s owes Redis nothing; else at most how long (ms) its queued
 * give-backs and refunds may still take before s answers or gives them up:
 * a stopping worker runs its loop that long at most (worker.c). */
int64_t store_owed_ms(const struct store *s);

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

/* ---- Issue 14: the reset channel and the admin API's commands --------- */

/* A SUBSCRIBE to channel on the Redis rc names, on base, reconnecting by
 * itself; cb(arg, msg, len) runs on base for every message (its payload)
 * and each time the subscription is made (again), with msg NULL. With hash
 * not NULL, HGETALL hash goes before each SUBSCRIBE, in the same write
 * (Redis runs them back to back, so no message falls between), and
 * snap(arg, n, s, lens) gets its field, value, field... strings first (not
 * on an error reply). With redis.sentinel it subscribes on the master the
 * sentinels name and follows +switch-master. */
typedef void store_sub_cb(void *arg, const char *msg, size_t len);
typedef void store_sub_snap_cb(void *arg, int n, const char *const *s, const size_t *lens);
struct store_sub;
struct store_sub *store_sub_create(struct event_base *base, const struct conf_redis *rc,
                                   const char *channel, const char *hash, store_sub_cb *cb,
                                   store_sub_snap_cb *snap, void *arg);
void store_sub_destroy(struct store_sub *ss);

/* The admin thread's commands, asynchronous on its event base (store_sync.c):
 * ncmds commands pipelined on a persistent connection of the store_sync's
 * own, a Cluster MOVED followed once; with redis.sentinel on the master a
 * sentinel named (ROLE checked before each call). At most
 * STORE_SYNC_MAX_CALLS calls wait at once. */
#define STORE_SYNC_MAX_INTS 64
enum store_sync_type { STORE_SYNC_NIL, STORE_SYNC_INT, STORE_SYNC_STR, STORE_SYNC_ARRAY,
                       STORE_SYNC_ERROR };
struct store_sync_cmd {
    int argc;
    const char **argv;
    const size_t *lens;
};
struct store_sync_reply {
    enum store_sync_type type;
    int64_t integer;
    char str[256];              /* STR and ERROR, truncated */
    size_t len;
    int64_t ints[STORE_SYNC_MAX_INTS];  /* ARRAY of integers */
    int nints;
};
#define STORE_SYNC_MAX_CALLS 16
struct event_base;
struct store_sync;
struct store_sync_call;
/* Called once per call, from the loop: out[ncmds] (error replies included)
 * and err NULL, or out NULL and err (a timeout after redis.timeout, at
 * least 1 s; a connection that failed). Valid during the callback only. */
typedef void store_sync_cb(void *arg, const struct store_sync_reply *out, const char *err);
struct store_sync *store_sync_create(struct event_base *base);
/* Calls still waiting are dropped without their callbacks. */
void store_sync_destroy(struct store_sync *ss);
/* Starts a call (the commands are copied); cb is never called from inside
 * this. NULL with err when it cannot start: STORE_SYNC_MAX_CALLS wait, or
 * rc differs from the settings of calls still in flight. rc must stay
 * valid until a call with another rc starts or ss is destroyed. */
struct store_sync_call *store_sync_start(struct store_sync *ss, const struct conf_redis *rc,
                                         int ncmds, const struct store_sync_cmd *cmds,
                                         store_sync_cb *cb, void *arg, char *err,
                                         size_t errlen);
/* The caller is gone: cb will not be called. Only before cb ran. */
void store_sync_cancel(struct store_sync_call *call);

/* scripts/limit.lua's text (EVAL from the admin thread). */
const char *store_limit_script(void);
/* scripts/part_reset.lua's: the reset of one part of a route's key. */
const char *store_part_reset_script(void);

#endif
