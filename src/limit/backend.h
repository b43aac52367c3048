/* sluice - backend.h: the one contract every deciding backend keeps.
 *
 * The Redis store (store.c) and the in-process store (memstore.c) both
 * decide a request's limits through it, so the decision code never asks
 * which backend it has. One backend object belongs to one worker (one event
 * base) and one runtime; backend.c makes both kinds.
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
#include "store.h"          /* struct store_limit, store_result, store_cb */

struct event_base;
struct memstore;
struct backend;
struct backend_call;

/* A Redis backend on base: a store of its own, connecting in the
 * background. rc is copied. */
struct backend *backend_redis(struct event_base *base, const struct conf_redis *rc);

/* An in-process backend on base over the process's shared memstore m (not
 * owned: it outlives every backend made on it). */
struct backend *backend_memory(struct event_base *base, struct memstore *m);

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
 *                    the cost its token_bucket or gcra reservation took */
void backend_release(struct backend *b, const struct store_limit *l);
void backend_renew(struct backend *b, const struct store_limit *l);
void backend_refund(struct backend *b, const struct store_limit *l);

/* While Redis is unreachable: ms until the next reconnect attempt (for
 * Retry-After); 0 otherwise, and always 0 for the memory backend. */
int64_t backend_retry_ms(const struct backend *b);

/* The Redis store behind a Redis backend (NULL for a memory one): for the
 * store's own gauges and tests. */
struct store *backend_store(const struct backend *b);

#endif
