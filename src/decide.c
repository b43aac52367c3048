/* sluice - decide.c: whether one request may go on (decide.h).
 *
 *   allow lists ──▶ keys (route, into the request) ──▶ deny cache ──▶ backend
 *                                                                      │
 *        on_error: allow / deny (503) / local (memory backend) ◀─ down ┤
 *                                  forward, or 429 + remember denials ◀┘
 *
 * The keys are built once, into the request's own buffer, and serve the
 * call, the deny cache after a denial, a local decision and the
 * count_status consumption after the response. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "backend.h"
#include "clock.h"
#include "conf.h"
#include "decide.h"
#include "denycache.h"
#include "http1.h"
#include "metrics.h"

/* cost_header: a whole number 1..1000000 replaces the route's cost; a
 * missing field keeps it; anything else is a bad request. */
static int request_cost(const struct route_req *req, const char *name, int64_t *cost)
{
    int i = http1_find(req->buf, req->h, name, 0);
    if (i < 0)
        return 0;
    int64_t v;
    if (http1_find(req->buf, req->h, name, i + 1) >= 0 ||
        !http1_span_uint(req->buf, req->h->h[i].value, &v) || v < 1 || v > 1000000)
        return -1;
    *cost = v;
    return 0;
}

/* Is the client on the top-level or the route's allow list? */
static int client_allowed(const struct conf *conf, const struct conf_route *route,
                          const struct request *rq)
{
    if (conf->nallow == 0 && route->nallow == 0)
        return 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, rq->ip, &s4->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, rq->ip, &s6->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else
        return 0;
    return conf_cidr_match(conf->allow, conf->nallow, (struct sockaddr *)&ss) ||
           conf_cidr_match(route->allow, route->nallow, (struct sockaddr *)&ss);
}

/* The keys of the route's limits, into the request's buffer, with
 * rq->rl.limit[]; returns how many count the request, -1 for a bad
 * cost_header, ROUTE_KEY_AMBIGUOUS for a key source given twice. */
static int build_keys(struct request *rq, const struct conf *conf,
                      const struct conf_route *r, const struct route_req *req)
{
    char key[ROUTE_MAX_KEY];
    int n = 0;
    rq->key_used = 0;
    for (int i = 0; i < r->nlimits && n < STORE_MAX_LIMITS; i++) {
        const struct conf_limit *l = &r->limits[i];
        long klen = route_key(conf, r, l, req, key);
        if (klen == ROUTE_KEY_AMBIGUOUS)
            return ROUTE_KEY_AMBIGUOUS;
        if (klen <= 0)      /* a key source is absent: not counted */
            continue;
        int64_t cost = r->cost > 0 ? r->cost : 1;
        if (l->cost_header && request_cost(req, l->cost_header, &cost) < 0)
            return -1;
        unsigned flags = (l->shadow ? STORE_SHADOW : 0) |
                         (l->has_count_status ? STORE_CHECK_ONLY : 0);
        size_t off = request_key_add(rq, key, (size_t)klen);
        rq->key[n] = (struct request_key){ off, (size_t)klen, cost, flags };
        rq->rl.limit[n] = l;
        if (flags & STORE_CHECK_ONLY)
            rq->counted |= 1u << n;
        n++;
    }
    return n;
}

/* The request's keys as the backend takes them. */
static int limits_of(const struct request *rq, struct store_limit *sl)
{
    for (int i = 0; i < rq->nkeys; i++)
        sl[i] = (struct store_limit){ rq->keybuf + rq->key[i].off, rq->key[i].len,
                                      &rq->rl.limit[i]->params, rq->key[i].cost,
                                      rq->key[i].flags };
    return rq->nkeys;
}

static void count_decision(struct request *rq, enum metrics_decision d)
{
    metrics_request(rq->rl.route->metrics, d);
    rq->decision = (int)d;
}

/* A key in the deny cache decides the request without the backend. */
static int denied_by_cache(struct request *rq)
{
    int64_t now = clock_ms(), denied = 0;
    for (int i = 0; i < rq->nkeys; i++) {
        int64_t left = denycache_get(rq->deny, rq->keybuf + rq->key[i].off, rq->key[i].len,
                                     now, rq->key[i].cost);
        struct limiter_result *r = &rq->rl.r[i];
        r->limit = rq->rl.limit[i]->params.limit;
        r->allowed = left == 0;
        r->remaining = left ? 0 : r->limit;
        r->reset_ms = r->retry_ms = left;
        denied |= left;
    }
    return denied != 0;
}

/* The backend denied: remember each denying key until its retry time;
 * later requests for the key stop at the cache. */
static void remember_denials(struct request *rq, const struct store_result *res)
{
    if (res->n != rq->nkeys)
        return;
    int64_t now = clock_ms();
    for (int i = 0; i < res->n; i++)
        if (!res->r[i].allowed && res->r[i].retry_ms > 0 && !(rq->key[i].flags & STORE_SHADOW))
            denycache_put(rq->deny, rq->keybuf + rq->key[i].off, rq->key[i].len,
                          now + res->r[i].retry_ms, rq->key[i].cost);
}

/* An answer is in: allowed (forward) or denied (429). */
static int apply_decision(struct request *rq, const struct store_result *res, int remember)
{
    memcpy(rq->rl.r, res->r, sizeof(res->r[0]) * (size_t)res->n);
    reply_pick(&rq->rl, res->allowed);
    rq->have_limits = 1;
    if (res->allowed) {
        int shadow_denied = 0;
        for (int i = 0; i < res->n; i++)
            shadow_denied |= !res->r[i].allowed;    /* only shadow ones can */
        count_decision(rq, shadow_denied ? METRICS_SHADOW_LIMITED : METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    count_decision(rq, METRICS_LIMITED);
    if (remember)
        remember_denials(rq, res);
    return DECIDE_LIMITED;
}

/* A decision Redis did not answer (res NULL: not connected, nothing sent),
 * counted by reason. The memory backend has no Redis to count. */
static void count_backend_error(const struct backend *b, const struct store_result *res)
{
    if (backend_store(b) == NULL)
        return;
    enum metrics_redis_error why = METRICS_REDIS_ERR_UNAVAILABLE;
    if (res != NULL)
        why = res->status == STORE_TIMEOUT ? METRICS_REDIS_ERR_TIMEOUT :
              res->status == STORE_OOM ? METRICS_REDIS_ERR_OOM : METRICS_REDIS_ERR_ERROR;
    metrics_redis_error(why);
}

static void local_cb(void *arg, const struct store_result *res);

/* The backend could not decide: on_error says what the request gets. */
static int apply_on_error(struct request *rq)
{
    switch (rq->conf->redis.on_error) {
    case CONF_ON_ERROR_DENY:
        rq->have_limits = 0;
        count_decision(rq, METRICS_ERROR);
        return DECIDE_UNAVAILABLE;
    case CONF_ON_ERROR_LOCAL:
        if (rq->local != NULL && rq->nkeys > 0) {
            struct store_limit sl[STORE_MAX_LIMITS];
            int n = limits_of(rq, sl);
            rq->call_b = rq->local;
            rq->call = backend_decide(rq->local, sl, n, local_cb, rq);
            if (rq->call != NULL)
                return DECIDE_PENDING;
        }
        /* no local answer either: as allow */
        __attribute__((fallthrough));
    default:        /* allow: forwarded without rate-limit fields */
        rq->have_limits = 0;
        count_decision(rq, METRICS_ERROR);
        return DECIDE_FORWARD;
    }
}

static void finish(struct request *rq, int verdict)
{
    if (verdict != DECIDE_PENDING)
        rq->done(rq->arg, verdict);
}

/* on_error: local answered. */
static void local_cb(void *arg, const struct store_result *res)
{
    struct request *rq = arg;
    rq->call = NULL;
    if (res->status != STORE_OK) {      /* as allow */
        rq->have_limits = 0;
        count_decision(rq, METRICS_ERROR);
        finish(rq, DECIDE_FORWARD);
        return;
    }
    finish(rq, apply_decision(rq, res, 0));
}

static void backend_cb(void *arg, const struct store_result *res)
{
    struct request *rq = arg;
    rq->call = NULL;
    if (backend_store(rq->backend) != NULL)
        metrics_observe(METRICS_REDIS_SECONDS, clock_us() - rq->call_start_us);
    if (res->status != STORE_OK) {
        count_backend_error(rq->backend, res);
        finish(rq, apply_on_error(rq));
        return;
    }
    finish(rq, apply_decision(rq, res, 1));
}

int decide_start(struct request *rq, const struct decide_env *env, const struct conf *conf,
                 const struct conf_route *route, const struct route_req *req,
                 decide_done *done, void *arg)
{
    rq->conf = conf;
    rq->deny = env->deny;
    rq->local = env->local;
    rq->backend = env->backend;
    rq->done = done;
    rq->arg = arg;
    rq->decision = -1;
    rq->rl.route = route;
    if (client_allowed(conf, route, rq)) {      /* allow lists bypass limiting */
        count_decision(rq, METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    int n = build_keys(rq, conf, route, req);
    if (n < 0)
        return n == ROUTE_KEY_AMBIGUOUS ? DECIDE_AMBIGUOUS : DECIDE_BAD_COST;
    rq->nkeys = rq->rl.n = n;
    if (n == 0) {
        count_decision(rq, METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    if (denied_by_cache(rq)) {
        metrics_count(METRICS_DENY_CACHE_HITS);
        count_decision(rq, METRICS_LIMITED);
        reply_pick(&rq->rl, 0);
        rq->have_limits = 1;
        return DECIDE_LIMITED;
    }
    struct store_limit sl[STORE_MAX_LIMITS];
    limits_of(rq, sl);
    rq->call_start_us = clock_us();
    if (backend_store(rq->backend) != NULL)
        metrics_count(METRICS_REDIS_REQUESTS);
    rq->call_b = rq->backend;
    rq->call = backend_decide(rq->backend, sl, n, backend_cb, rq);
    if (rq->call != NULL)
        return DECIDE_PENDING;
    count_backend_error(rq->backend, NULL);
    return apply_on_error(rq);
}

/* The consumption is recorded (or failed): the response may go on. */
static void counted_cb(void *arg, const struct store_result *res)
{
    struct request *rq = arg;
    rq->count_call = NULL;
    if (res->status != STORE_OK)
        count_backend_error(rq->backend, res);
    rq->done(rq->arg, 0);
}

int decide_count_status(struct request *rq, int status, decide_done *done, void *arg)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    int n = 0;
    unsigned counted = rq->counted;
    rq->counted = 0;
    if (counted == 0 || status < 0 || status >= CONF_MAX_STATUS)
        return 0;
    for (int i = 0; i < rq->nkeys; i++) {
        const struct conf_limit *l = rq->rl.limit[i];
        if ((counted & (1u << i)) && l->count_status[status])
            sl[n++] = (struct store_limit){ rq->keybuf + rq->key[i].off, rq->key[i].len,
                                            &l->params, rq->key[i].cost,
                                            l->shadow ? STORE_SHADOW : 0 };
    }
    if (n == 0)
        return 0;
    /* Always the worker's backend, even after an on_error: local decision. */
    if (backend_store(rq->backend) != NULL)
        metrics_count(METRICS_REDIS_REQUESTS);
    rq->done = done;
    rq->arg = arg;
    rq->count_call = backend_decide(rq->backend, sl, n, counted_cb, rq);
    if (rq->count_call == NULL)
        count_backend_error(rq->backend, NULL);
    return rq->count_call != NULL;
}

void decide_cancel(struct request *rq)
{
    if (rq->call) {
        backend_cancel(rq->call_b, rq->call);
        rq->call = NULL;
    }
    if (rq->count_call) {
        backend_cancel(rq->backend, rq->count_call);
        rq->count_call = NULL;
    }
}
