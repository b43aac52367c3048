/* sluice - decide.h: whether one request may go on.
 *
 * Allow lists, the keys of the route's limits (built into the decision's
 * own buffer), the deny cache, one call to the worker's backend, on_error
 * (allow, deny, or a local in-process decision) and, after the response,
 * the count_status consumption. Everything is kept in struct decision
 * (embedded in the request), so an answer arriving after a reload still
 * sees the request's own keys. The backend is reached only through
 * backend.h; the request is not seen at all. */
#ifndef SLUICE_DECIDE_H
#define SLUICE_DECIDE_H

#include <stddef.h>
#include <stdint.h>
#include "reply.h"
#include "backend.h"

struct backend;
struct backend_call;
struct event;
struct event_base;
struct denycache;
struct conf;
struct conf_route;
struct route_req;

/* One limit's key, at off in the decision's key buffer. */
struct decide_key {
    size_t off, len;
    int64_t cost;
    unsigned flags;                     /* STORE_SHADOW, STORE_CHECK_ONLY */
    const struct limiter_params *params;    /* the limit's, or a config override's */
    int64_t slot;                       /* concurrency: this request's slot id */
    size_t poff, plen;                  /* one key per route: its route's key */
    uint32_t part;                      /* and its part there (0: none) */
};

/* One request's decision: its keys and limit results, and the call in
 * flight. Embedded in the request; the key buffer is kept across the
 * requests of a connection (decide_free frees it). */
struct decision {
    char *keybuf;                       /* the keys, back to back */
    size_t key_cap;
    struct event *hold_ev;              /* delay: forwards when due (made once) */
    struct event *renew_ev;             /* concurrency: renews the leases */
    struct event *settle_ev;            /* cost_from: bounds the wait for a settlement */

    /* Zeroed per request from here (decide_reset). */
    size_t key_used;
    int nkeys;
    int have_limits;
    int decision;                       /* enum metrics_decision, or -1 */
    unsigned counted;                   /* bit i: key i waits for count_status */
    unsigned fallback;                  /* bit i: key i is the client address's
                                         * (a source absent, on_missing_key: ip) */
    const struct conf *conf;
    struct backend *backend;            /* its runtime's (Redis or memory) */
    struct backend *call_b;             /* the one that made call */
    struct backend_call *call;
    struct backend_call *count_call;    /* count_status consumption, on backend */
    struct backend *local;              /* on_error: local */
    struct denycache *deny;
    int64_t call_start_us;
    /* Concurrency and delay: what the request holds, on slot_b (the backend
     * that decided). Given back exactly once: decide_release(). */
    unsigned held;                      /* bit i: key i's slot is taken */
    unsigned delayed;                   /* bit i: key i reserved, still held */
    int64_t wait_ms;                    /* the delay it is (was) held for */
    int64_t hold_start_us;
    struct backend *slot_b;
    /* cost_from: the keys admitted with their estimate (key[i].cost), each
     * settled once after the response, on settle_b (the backend that
     * decided), in the window mark[i] it was admitted in. */
    unsigned settle;                    /* bit i: key i waits for its settlement */
    struct backend *settle_b;
    struct backend_call *settle_call;   /* the response's end waits for it */
    int64_t charged;                    /* what the first such key was charged; -1: none */
    struct event_base *base;
    void (*done)(void *arg, int verdict);
    void (*holding)(void *arg);         /* decide_env's */
    void *arg;

    /* Not zeroed (decide_reset clears rl's counts only): entry i of each
     * is written before it is read, and read only for i < nkeys (build_keys
     * writes key[i] and rl.limit[i], rl.params[i]; the result or the deny
     * cache rl.r[i]; an admission mark[i] before its settlement). */
    struct decide_key key[STORE_MAX_LIMITS];    /* limit i is rl.limit[i] */
    int64_t mark[STORE_MAX_LIMITS];
    struct reply_limits rl;
};

/* Zero the per-request part; keeps the key buffer. */
void decide_reset(struct decision *dec);
void decide_free(struct decision *dec);

/* What a decision is lent: the backend of the request's runtime, and the
 * worker's memory backend for on_error: local and its deny cache. Not
 * owned; each outlives the decision (the request retains its runtime). */
struct decide_env {
    struct backend *backend;
    struct backend *local;
    struct denycache *deny;
    struct event_base *base;            /* the worker's: delay and renew timers */
    /* A delay began to hold the request (done comes when it is over), with
     * done's arg; NULL: not told. */
    void (*holding)(void *arg);
};

enum decide_verdict {
    DECIDE_PENDING,         /* the callback will tell */
    DECIDE_FORWARD,         /* allowed (rl filled when have_limits) */
    DECIDE_LIMITED,         /* 429 with rq->rl */
    DECIDE_UNAVAILABLE,     /* on_error: deny -> 503 */
    DECIDE_BAD_COST,        /* 400: a bad cost_header */
    DECIDE_AMBIGUOUS,       /* 400 ambiguous_key */
    DECIDE_MISSING_KEY,     /* 400 missing_key: on_missing_key: deny */
    DECIDE_BAD_KEY,         /* 400 bad_key: a capture with a control byte */
};

/* The verdict of a pending decision, once, from the event loop; never after
 * decide_cancel(). */
typedef void decide_done(void *arg, int verdict);

/* Decide on route (of conf, which must outlive the decision). req carries
 * the head, the client address and the normalised path. Returns a verdict,
 * or DECIDE_PENDING and done(arg, verdict) later. Counts the decision
 * (metrics_request) and sets dec->decision. */
int decide_start(struct decision *dec, const struct decide_env *env, const struct conf *conf,
                 const struct conf_route *route, const struct route_req *req,
                 decide_done *done, void *arg);

/* The response status is known: the limits whose count_status lists it
 * consume now. Returns 1 when done(arg, 0) will follow (the response waits
 * for it), 0 when nothing waits. */
int decide_count_status(struct decision *dec, int status, decide_done *done, void *arg);

/* The cost_from limit whose source the response is read for (a route's
 * cost_from limits share one source), or NULL when the request has nothing
 * to settle. */
const struct conf_limit *decide_cost_limit(const struct decision *dec);

/* The response reported cost (>= 0), or did not (-1: no value, an upstream
 * error, a client gone; the estimate stands): each key admitted with an
 * estimate is settled, the difference given back or charged (one
 * refund.lua call per key, pipelined with the decisions). Returns 1 when
 * done(arg, 0) follows once Redis has applied it, or after redis.timeout
 * without an answer (with done not NULL: the caller holds the response's
 * end until then, so the client's next request, through any proxy, is
 * decided after it), 0 when nothing waits.
 * Once; later calls do nothing. */
int decide_settle(struct decision *dec, int64_t cost, decide_done *done, void *arg);

/* The answers are no longer wanted: no callback runs after this. Gives back
 * what the request holds (decide_release), including the slots a decision
 * still in flight may take. */
void decide_cancel(struct decision *dec);

/* 1 while a delay holds the request (its reservation not yet used). */
int decide_holding(const struct decision *dec);

/* The request ended (its response was sent, the client went away, or the
 * upstream failed): its concurrency slots go back, and a reservation still
 * held for a delay is refunded. Fire and forget; once (later calls do
 * nothing). */
void decide_release(struct decision *dec);

#endif
