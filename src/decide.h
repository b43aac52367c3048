/* sluice - decide.h: whether one request may go on.
 *
 * Allow lists, the keys of the route's limits (built into the request's own
 * buffer), the deny cache, one call to the worker's backend, on_error
 * (allow, deny, or a local in-process decision) and, after the response,
 * the count_status consumption. Everything is kept in the request, so an
 * answer arriving after a reload still sees the request's own keys. The
 * backend is reached only through backend.h. */
#ifndef SLUICE_DECIDE_H
#define SLUICE_DECIDE_H

#include "request.h"

struct backend;
struct denycache;
struct conf;
struct conf_route;
struct route_req;

/* What a decision is lent: the backend of the request's runtime, and the
 * worker's memory backend for on_error: local and its deny cache. Not
 * owned; each outlives the decision (the request retains its runtime). */
struct decide_env {
    struct backend *backend;
    struct backend *local;
    struct denycache *deny;
};

enum decide_verdict {
    DECIDE_PENDING,         /* the callback will tell */
    DECIDE_FORWARD,         /* allowed (rl filled when have_limits) */
    DECIDE_LIMITED,         /* 429 with rq->rl */
    DECIDE_UNAVAILABLE,     /* on_error: deny -> 503 */
    DECIDE_BAD_COST,        /* 400: a bad cost_header */
    DECIDE_AMBIGUOUS,       /* 400 ambiguous_key */
};

/* The verdict of a pending decision, once, from the event loop; never after
 * decide_cancel(). */
typedef void decide_done(void *arg, int verdict);

/* Decide rq on route (of conf, which must outlive the decision). req
 * carries the head and rq->path; rq->ip must be set. Returns a verdict, or
 * DECIDE_PENDING and done(arg, verdict) later. Counts the decision
 * (metrics_request) and sets rq->decision. */
int decide_start(struct request *rq, const struct decide_env *env, const struct conf *conf,
                 const struct conf_route *route, const struct route_req *req,
                 decide_done *done, void *arg);

/* The response status is known: the limits whose count_status lists it
 * consume now. Returns 1 when done(arg, 0) will follow (the response waits
 * for it), 0 when nothing waits. */
int decide_count_status(struct request *rq, int status, decide_done *done, void *arg);

/* The answers are no longer wanted: no callback runs after this. */
void decide_cancel(struct request *rq);

#endif
