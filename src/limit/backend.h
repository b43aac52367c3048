/* sluice - backend.h: the one contract every deciding backend keeps.
 *
 * The Redis store (store.c) and the in-process store (memstore.c) both
 * decide a request's limits through it, so the decision code never asks
 * which backend it has. One backend object belongs to one worker (one event
 * base) and one runtime; backend.c makes the memory kind, store_backend.c
 * the Redis kind (above this layer: it gives its verbs, struct backend_ops).
 *
 * The contract, for every kind:
 *   backend_decide() either returns a call, whose callback then runs exactly
 *   once, later, from the event loop (never from inside backend_decide), or
 *   returns NULL: the backend cannot decide now (Redis neither connected nor
 *   connecting) and the caller applies on_error at once. The limits (keys, params) need only live
 *   during backend_decide(): the backend copies what it keeps.
 *   backend_cancel(b, call) means the answer is no longer wanted; its callback
 *   will not run. b is the backend that made the call. It may be called from
 *   any callback except the call's own.
 *   backend_ready() says whether decisions can be made now (/readyz). */
#ifndef SLUICE_BACKEND_H
#define SLUICE_BACKEND_H

#include <stdint.h>
#include "conf.h"
#include "limiter.h"

/* The decision types, which every backend takes and gives; their names are
 * the Redis store's, the first backend. */
#define STORE_MAX_LIMITS CONF_MAX_LIMITS

/* One limit of a decision. key and params must stay valid until the
 * decide call returns (the backend copies what it keeps). */
struct store_limit {
    const char *key;
    size_t keylen;
    const struct limiter_params *params;
    int64_t cost;               /* units this request consumes, >= 1 */
    unsigned flags;             /* STORE_SHADOW, STORE_CHECK_ONLY */
    int64_t slot;               /* concurrency: this request's slot id (1..2^53-1),
                                 * sent per request in the batch, out of the
                                 * shared parameter set; 0 otherwise */
    /* One key per route (conf_limit.part): the Redis store decides this
     * limit as the part `part` of pkey, the key its route's limits share;
     * key still names the limit everywhere else (deny cache, console,
     * override key). part 0: none, pkey NULL. */
    const char *pkey;
    size_t pkeylen;
    uint32_t part;
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
    int64_t time_us;            /* STORE_OK: the decider's clock when it decided
                                 * (Redis TIME), for limiter_mark() */
};

/* Called exactly once per call not cancelled, never from inside the decide
 * call. res is valid only during the call. */
typedef void store_cb(void *arg, const struct store_result *res);

struct store;
struct backend;
struct backend_call;

/* What one kind of backend does, on its own object impl: the in-process
 * kind's (memstore_backend_create in memstore.h) and the Redis store's
 * (store_backend_create in store.h). Each verb keeps the contract above for
 * its backend_* namesake; a call decide returns is the backend's call. */
struct backend_ops {
    struct backend_call *(*decide)(void *impl, const struct store_limit *limits, int n,
                                   store_cb *cb, void *arg);
    void (*cancel)(void *impl, struct backend_call *call);     /* call not NULL */
    void (*release)(void *impl, const struct store_limit *l);
    void (*renew)(void *impl, const struct store_limit *l);
    void (*refund)(void *impl, const struct store_limit *l);
    /* refund with done(arg) once applied; NULL: refund alone (the kind
     * applies it at once) */
    struct backend_call *(*settle)(void *impl, const struct store_limit *l,
                                   void (*done)(void *arg), void *arg);
    void (*settle_cancel)(void *impl, struct backend_call *call);
    int (*ready)(const void *impl);
    int64_t (*retry_ms)(const void *impl);
    int (*drain)(void *impl, void (*done)(void *arg), void *arg);
    void (*destroy)(void *impl);
    int redis;                  /* impl is a Redis store (backend_store) */
};

/* A backend doing ops (static, not owned) on impl, which it owns from here:
 * backend_destroy frees it with ops->destroy. For the kinds' constructors. */
struct backend *backend_create(const struct backend_ops *ops, void *impl);

/* Pending calls are dropped without their callbacks. */
void backend_destroy(struct backend *b);
/* The owner is done with b: 0 when b owes nothing (destroy it now); 1 when a
 * Redis backend still has give-backs or refunds queued (store_drain): done(arg)
 * then runs from the loop once they are answered, bounded in time, and the
 * owner destroys b then (or earlier, dropping them). */
int backend_drain(struct backend *b, void (*done)(void *arg), void *arg);

struct backend_call *backend_decide(struct backend *b, const struct store_limit *limits,
                                    int n, store_cb *cb, void *arg);
void backend_cancel(struct backend *b, struct backend_call *call);
int backend_ready(const struct backend *b);

/* Concurrency slots and delayed requests, fire and forget (nothing waits
 * for Redis; no callback). l needs to live during the call only.
 *   backend_release  a request ended: give its slot (l->slot) back
 *   backend_renew    a request still runs: renew its slot's lease
 *   backend_refund   a held (delayed) request's client went away: give back
 *                    the cost its token_bucket or gcra reservation took; or
 *                    a cost_from settlement: l->cost is what to give back
 *                    (< 0: charge more), l->slot the admission's
 *                    limiter_mark() */
void backend_release(struct backend *b, const struct store_limit *l);
void backend_renew(struct backend *b, const struct store_limit *l);
void backend_refund(struct backend *b, const struct store_limit *l);

/* A new concurrency slot id for a request (store_limit.slot): unique in
 * the process, random across processes, 1..2^53-1. Thread-safe. */
int64_t backend_slot_id(void);

/* A cost_from settlement of the keys l[0..n) (each l->cost to give back,
 * < 0 to charge more; l->slot the admission's limiter_mark()), as
 * backend_refund on each. Returns a call when something waits: done(arg)
 * then runs once, from the loop, when Redis has applied the last of them
 * (or they were given up), unless backend_settle_cancel() came first; NULL
 * when nothing waits (the memory backend applies them at once). */
struct backend_call *backend_settle(struct backend *b, const struct store_limit *l, int n,
                                    void (*done)(void *arg), void *arg);
void backend_settle_cancel(struct backend *b, struct backend_call *call);

/* While Redis is unreachable: ms until the next reconnect attempt (for
 * Retry-After); 0 otherwise, and always 0 for the memory backend. */
int64_t backend_retry_ms(const struct backend *b);

/* The Redis store behind a Redis backend, the impl it was made with (NULL
 * for a memory one): for the store's own gauges and tests. */
struct store *backend_store(const struct backend *b);

#endif
