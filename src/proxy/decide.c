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
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <event2/event.h>

#include "admin_console.h"
#include "backend.h"
#include "clock.h"
#include "conf.h"
#include "decide.h"
#include "denycache.h"
#include "http1.h"
#include "jsonscan.h"
#include "log.h"
#include "metrics.h"
#include "plantable.h"
#include "resetbus.h"
#include "route.h"

/* cost_header: a whole number 1..1000000 replaces the route's cost; a
 * missing field keeps it; anything else is a bad request. */
static int decide_cost(const struct route_req *req, const char *name, int64_t *cost)
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

/* cost_from: the estimate taken at admission; with estimate: {json: PATH},
 * the whole number at PATH of a request body buffered before the decision
 * (at least 1), else the default. */
#define DECIDE_MAX_ESTIMATE 1000000     /* as conf bounds a fixed estimate */
static int64_t decide_estimate(const struct conf_limit *l, const struct route_req *req)
{
    struct jsonscan j;
    int64_t v;
    if (l->estimate_json == NULL || req->body == NULL)
        return l->estimate;
    jsonscan_init(&j, l->estimate_json, 0);
    jsonscan_feed(&j, req->body, req->body_len);
    if (!jsonscan_result(&j, &v))
        return l->estimate;
    return v < 1 ? 1 : v > DECIDE_MAX_ESTIMATE ? DECIDE_MAX_ESTIMATE : v;
}

/* Is the client on the top-level or the route's allow list? */
static int decide_allowed(const struct conf *conf, const struct conf_route *route,
                          const char *ip)
{
    if (conf->nallow == 0 && route->nallow == 0)
        return 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else
        return 0;
    return conf_cidr_match(conf->allow, conf->nallow, (struct sockaddr *)&ss) ||
           conf_cidr_match(route->allow, route->nallow, (struct sockaddr *)&ss);
}

void decide_reset(struct decision *dec)
{
    size_t from = offsetof(struct decision, key_used), to = offsetof(struct decision, key);
    memset((char *)dec + from, 0, to - from);
    dec->rl.route = dec->rl.plan = NULL;
    dec->rl.n = dec->rl.shown = 0;
    dec->decision = -1;
    dec->charged = -1;
}

void decide_free(struct decision *dec)
{
    if (dec->hold_ev)
        event_free(dec->hold_ev);
    if (dec->renew_ev)
        event_free(dec->renew_ev);
    if (dec->settle_ev)
        event_free(dec->settle_ev);
    dec->hold_ev = dec->renew_ev = dec->settle_ev = NULL;
    free(dec->keybuf);
    dec->keybuf = NULL;
    dec->key_cap = 0;
}

/* Append a key to the key buffer (grown by doubling, never shrunk: a
 * connection's requests reuse it); returns its offset. */
static size_t decide_key_add(struct decision *dec, const char *key, size_t len)
{
    size_t off = dec->key_used;
    if (off + len > dec->key_cap) {
        size_t n = dec->key_cap ? dec->key_cap : 256;
        while (n < off + len)
            n *= 2;
        char *p = realloc(dec->keybuf, n);
        if (p == NULL)
            abort();
        dec->keybuf = p;
        dec->key_cap = n;
    }
    memcpy(dec->keybuf + off, key, len);
    dec->key_used += len;
    return off;
}

/* ---- concurrency slots and delay -------------------------------------- */

static int is_concurrency(const struct decision *dec, int i)
{
    return dec->rl.limit[i]->params.algo == LIMITER_CONCURRENCY;
}

static struct store_limit key_limit(const struct decision *dec, int i)
{
    const struct decide_key *k = &dec->key[i];
    return (struct store_limit){ dec->keybuf + k->off, k->len, k->params, k->cost, k->flags,
                                 k->slot, k->part ? dec->keybuf + k->poff : NULL, k->plen,
                                 k->part };
}

/* Give back the slots in mask (and refund the reservations in refund) on b. */
static void give_back(struct decision *dec, struct backend *b, unsigned mask, unsigned refund)
{
    for (int i = 0; i < dec->nkeys && b != NULL; i++) {
        struct store_limit l = key_limit(dec, i);
        if (mask & (1u << i))
            backend_release(b, &l);
        if (refund & (1u << i))
            backend_refund(b, &l);
    }
}

static unsigned concurrency_keys(const struct decision *dec)
{
    unsigned m = 0;
    for (int i = 0; i < dec->nkeys; i++)
        if (is_concurrency(dec, i))
            m |= 1u << i;
    return m;
}

int decide_holding(const struct decision *dec)
{
    return dec->delayed != 0;
}

void decide_release(struct decision *dec)
{
    if (dec->held == 0 && dec->delayed == 0)
        return;
    if (dec->renew_ev)
        event_del(dec->renew_ev);
    if (dec->hold_ev)
        event_del(dec->hold_ev);
    give_back(dec, dec->slot_b, dec->held, dec->delayed);
    dec->held = dec->delayed = 0;
}

/* A third of the shortest lease held, at least 100 ms. */
static void renew_arm(struct decision *dec)
{
    int64_t lease = INT64_MAX;
    for (int i = 0; i < dec->nkeys; i++)
        if ((dec->held & (1u << i)) && dec->rl.limit[i]->params.window_ms < lease)
            lease = dec->rl.limit[i]->params.window_ms;
    if (lease == INT64_MAX || dec->renew_ev == NULL)
        return;
    struct timeval tv = clock_timeval(lease / 3 > 100 ? lease / 3 : 100);
    event_add(dec->renew_ev, &tv);
}

/* The request (or its tunnel) still runs: renew each slot's lease. */
static void renew_cb(evutil_socket_t fd, short what, void *arg)
{
    struct decision *dec = arg;
    for (int i = 0; i < dec->nkeys; i++)
        if (dec->held & (1u << i)) {
            struct store_limit l = key_limit(dec, i);
            backend_renew(dec->slot_b, &l);
        }
    renew_arm(dec);
}

static void finish(struct decision *dec, int verdict);

/* The delay is over: the reservation is used, the request goes on. */
static void hold_cb(evutil_socket_t fd, short what, void *arg)
{
    struct decision *dec = arg;
    dec->delayed = 0;
    metrics_observe(METRICS_DELAY_SECONDS, clock_us() - dec->hold_start_us);
    finish(dec, DECIDE_FORWARD);
}

/* An allowed request takes its slots and reservations: note them (the
 * backend that decided gets them back), and hold a delayed request until
 * its reserved time. Returns the verdict to give now. */
static int take_shaping(struct decision *dec, const struct store_result *res, int verdict)
{
    if (verdict != DECIDE_FORWARD || !res->allowed)
        return verdict;
    dec->slot_b = dec->call_b;
    for (int i = 0; i < res->n; i++) {
        const struct limiter_result *r = &res->r[i];
        if (!r->allowed || (dec->key[i].flags & STORE_CHECK_ONLY))
            continue;
        if (is_concurrency(dec, i))
            dec->held |= 1u << i;
        else if (dec->rl.limit[i]->params.delay_ms > 0 && r->retry_ms > 0) {
            dec->delayed |= 1u << i;
            if (r->retry_ms > dec->wait_ms)
                dec->wait_ms = r->retry_ms;
        }
    }
    if (dec->held && dec->base) {
        if (dec->renew_ev == NULL)
            dec->renew_ev = event_new(dec->base, -1, 0, renew_cb, dec);
        renew_arm(dec);
    }
    if (dec->wait_ms <= 0 || dec->base == NULL) {
        dec->delayed = 0;
        return verdict;
    }
    if (dec->hold_ev == NULL)
        dec->hold_ev = event_new(dec->base, -1, 0, hold_cb, dec);
    dec->hold_start_us = clock_us();
    struct timeval tv = clock_timeval(dec->wait_ms);
    event_add(dec->hold_ev, &tv);
    if (dec->holding)
        dec->holding(dec->arg);
    return DECIDE_PENDING;
}

/* An admitted request's cost_from keys wait for their settlement, in the
 * window the backend that decided consumed from. */
static void note_settle(struct decision *dec, const struct store_result *res, int verdict)
{
    dec->settle = 0;
    if (verdict != DECIDE_FORWARD || !res->allowed)
        return;
    for (int i = 0; i < res->n && i < dec->nkeys; i++)
        if (dec->rl.limit[i]->cost_from && res->r[i].allowed) {
            dec->settle |= 1u << i;
            dec->mark[i] = limiter_mark(dec->key[i].params, res->time_us);
            if (dec->charged < 0)
                dec->charged = dec->key[i].cost;
        }
    dec->settle_b = dec->call_b;
}

const struct conf_limit *decide_cost_limit(const struct decision *dec)
{
    for (int i = 0; i < dec->nkeys; i++)
        if (dec->settle & (1u << i))
            return dec->rl.limit[i];
    return NULL;
}

/* The settlement is applied: the response's end may go. */
static void settled_cb(void *arg)
{
    struct decision *dec = arg;
    dec->settle_call = NULL;
    if (dec->settle_ev)
        event_del(dec->settle_ev);
    dec->done(dec->arg, 0);
}

/* Redis did not answer within redis.timeout: the response goes on, the
 * settlement is still applied when it arrives. */
static void settle_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct decision *dec = arg;
    backend_settle_cancel(dec->settle_b, dec->settle_call);
    dec->settle_call = NULL;
    dec->done(dec->arg, 0);
}

int decide_settle(struct decision *dec, int64_t cost, decide_done *done, void *arg)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    int n = 0;
    unsigned settle = dec->settle;
    dec->settle = 0;
    if (settle == 0)
        return 0;
    if (cost < 0) {                 /* the estimate stands */
        metrics_cost(dec->rl.route->metrics, dec->charged);
        return 0;
    }
    if (cost > LIMITER_MAX_LIMIT)
        cost = LIMITER_MAX_LIMIT;
    dec->charged = cost;
    metrics_cost(dec->rl.route->metrics, cost);
    for (int i = 0; i < dec->nkeys; i++)
        if ((settle & (1u << i)) && dec->key[i].cost != cost) {
            sl[n] = key_limit(dec, i);
            sl[n].cost = dec->key[i].cost - cost;   /* < 0: a charge */
            sl[n].slot = dec->mark[i];
            n++;
        }
    if (n == 0)
        return 0;
    if (done == NULL) {
        backend_settle(dec->settle_b, sl, n, NULL, NULL);
        return 0;
    }
    dec->done = done;
    dec->arg = arg;
    dec->settle_call = backend_settle(dec->settle_b, sl, n, settled_cb, dec);
    if (dec->settle_call == NULL)
        return 0;
    if (dec->base != NULL) {
        if (dec->settle_ev == NULL)
            dec->settle_ev = event_new(dec->base, -1, 0, settle_timeout_cb, dec);
        struct timeval tv = clock_timeval(dec->conf->redis.timeout_ms);
        event_add(dec->settle_ev, &tv);
    }
    return 1;
}

/* The plan of the request's client (docs/plans.md): its plan_key value's
 * run-time assignment, then its plans.assign, then the plan plan_from
 * names, then plans.default. A name no plan of this config has is passed. */
static const struct conf_plan *decide_plan(const struct conf *conf, const struct conf_route *r,
                                           const struct route_req *req)
{
    char v[ROUTE_MAX_KEY], name[PLANTABLE_MAX_PLAN + 1];
    const struct conf_plan *p = NULL;
    long n = r->plan_key ? route_key_value(r->plan_key, req, v) : -1;
    if (n >= 0 && plantable_get(v, (size_t)n, name))
        p = conf_plan_find(conf, name, strlen(name));
    if (p == NULL && n >= 0)
        p = conf_plan_assigned(conf, v, (size_t)n);
    n = p == NULL && r->plan_from ? route_key_value(r->plan_from, req, v) : -1;
    if (n > 0)
        p = conf_plan_find(conf, v, (size_t)n);
    return p ? p : &conf->plans[conf->plan_default];
}

/* The keys of the route's limits, into the request's buffer, with
 * dec->rl.limit[]; returns how many count the request, -1 for a bad
 * cost_header, ROUTE_KEY_AMBIGUOUS for a key source given twice,
 * ROUTE_KEY_BAD for a capture refused, DECIDE_KEY_MISSING for a source
 * absent under on_missing_key: deny. Absent under ip: the client address's
 * own key (route_key_fallback), counted in the metrics. */
#define DECIDE_KEY_MISSING (-100)

static int build_keys(struct decision *dec, const struct conf *conf,
                      const struct conf_route *r, const struct route_req *req)
{
    char key[ROUTE_MAX_KEY];
    int n = 0;
    dec->key_used = 0;
    /* the route's limits, then its client's plan's (keys of the plan's own) */
    const struct conf_plan *plan = r->plan_key || r->plan_from ? decide_plan(conf, r, req)
                                                               : NULL;
    int total = r->nlimits + (plan ? plan->route.nlimits : 0);
    dec->rl.plan = plan ? &plan->route : NULL;
    for (int i = 0; i < total && n < STORE_MAX_LIMITS; i++) {
        const struct conf_route *kr = i < r->nlimits || plan == NULL ? r : &plan->route;
        const struct conf_limit *l = &kr->limits[i < r->nlimits ? i : i - r->nlimits];
        long klen = route_key(conf, kr, l, req, key);
        if (klen == ROUTE_KEY_AMBIGUOUS || klen == ROUTE_KEY_BAD)
            return (int)klen;
        if (klen == 0 && l->on_missing_key == CONF_MISSING_DENY)
            return DECIDE_KEY_MISSING;
        int fallback = klen == 0 && l->on_missing_key == CONF_MISSING_IP;
        if (fallback)
            klen = route_key_fallback(conf, kr, l, req, key);
        if (klen <= 0)      /* absent under pass, or too long: not counted */
            continue;
        int64_t cost = r->cost > 0 ? r->cost : 1;
        if (l->cost_header && decide_cost(req, l->cost_header, &cost) < 0)
            return -1;
        if (l->cost_from) {     /* an estimate above the limit counts as the limit */
            cost = decide_estimate(l, req);
            if (cost > l->params.limit && l->params.limit >= 1)
                cost = l->params.limit;
        }
        unsigned flags = (l->shadow ? STORE_SHADOW : 0) |
                         (l->has_count_status ? STORE_CHECK_ONLY : 0);
        /* a config override of this key: its parameters (a run-time one,
         * in the store, still goes before them) */
        const struct conf_override *o = l->noverrides ? route_override(l, key, (size_t)klen)
                                                      : NULL;
        size_t off = decide_key_add(dec, key, (size_t)klen);
        dec->key[n] = (struct decide_key){ off, (size_t)klen, cost, flags,
                                           o ? &o->params : &l->params,
                                           l->params.algo == LIMITER_CONCURRENCY ?
                                           backend_slot_id() : 0 };
        if (l->part) {          /* one key per route: the key without the limit's name */
            char pkey[ROUTE_MAX_KEY];
            long plen = route_part_key(conf, kr, l, key, (size_t)klen, pkey);
            if (plen > 0) {
                dec->key[n].poff = decide_key_add(dec, pkey, (size_t)plen);
                dec->key[n].plen = (size_t)plen;
                dec->key[n].part = l->part;
            }
        }
        dec->rl.limit[n] = l;
        dec->rl.params[n] = o ? &o->params : NULL;
        if (flags & STORE_CHECK_ONLY)
            dec->counted |= 1u << n;
        if (fallback)
            dec->fallback |= 1u << n;
        n++;
    }
    for (unsigned f = dec->fallback; f != 0; f &= f - 1)  /* once the request counts */
        metrics_count(METRICS_KEY_FALLBACKS);
    return n;
}

/* The request's keys as the backend takes them. */
static int limits_of(const struct decision *dec, struct store_limit *sl)
{
    for (int i = 0; i < dec->nkeys; i++)
        sl[i] = key_limit(dec, i);
    return dec->nkeys;
}

static void count_decision(struct decision *dec, enum metrics_decision d)
{
    metrics_request(dec->rl.route->metrics, d);
    dec->decision = (int)d;
}

/* A key in the deny cache decides the request without the backend. */
static int denied_by_cache(struct decision *dec)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    denycache_sync(dec->deny, resetbus_epoch());    /* a reset or override since */
    limits_of(dec, sl);
    return denycache_check(dec->deny, sl, dec->nkeys, clock_ms(), dec->rl.r);
}

/* The backend denied: remember each denying key until its retry time;
 * later requests for the key stop at the cache. */
static void remember_denials(struct decision *dec, const struct store_result *res)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    if (res->n != dec->nkeys)
        return;
    limits_of(dec, sl);
    denycache_remember(dec->deny, sl, res->n, res->r, clock_ms());
}

/* The console's heavy hitters: each key that denied this request. */
static void note_denials(const struct decision *dec, int n)
{
    size_t prefix_len = strlen(dec->conf->redis.prefix);
    for (int i = 0; i < dec->nkeys && i < n; i++)
        if (!dec->rl.r[i].allowed && !(dec->key[i].flags & STORE_SHADOW))
            admin_console_denied(dec->rl.route->name, dec->rl.limit[i]->name, prefix_len,
                                 dec->keybuf + dec->key[i].off, dec->key[i].len,
                                 route_secret_parts(dec->rl.limit[i]));
}

/* An answer is in: allowed (forward) or denied (429). */
static int apply_decision(struct decision *dec, const struct store_result *res, int remember)
{
    memcpy(dec->rl.r, res->r, sizeof(res->r[0]) * (size_t)res->n);
    reply_pick(&dec->rl, res->allowed);
    dec->have_limits = 1;
    if (res->allowed) {
        int shadow_denied = 0, delayed = 0;
        for (int i = 0; i < res->n; i++) {
            shadow_denied |= !res->r[i].allowed;    /* only shadow ones can */
            delayed |= res->r[i].allowed && res->r[i].retry_ms > 0 &&
                       dec->rl.limit[i]->params.delay_ms > 0;
        }
        count_decision(dec, delayed ? METRICS_DELAYED :
                            shadow_denied ? METRICS_SHADOW_LIMITED : METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    count_decision(dec, METRICS_LIMITED);
    note_denials(dec, res->n);
    if (remember)
        remember_denials(dec, res);
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

/* The memory limiter could not decide (a limit it cannot compute): that is
 * no outage on_error was written for, and passing would mean no limit at
 * all, so the request gets the 503 limiter_unavailable, logged (at most once
 * a second) and counted as decision="error". */
static int memory_failed(struct decision *dec, const char *which)
{
    static struct log_every failures;
    long n = log_every_second(&failures);
    if (n)
        log_error("decide: the memory limiter could not decide route '%s' (%s); answering "
                  "503 (%ld such request%s since the last such line)", dec->rl.route->name,
                  which, n, n == 1 ? "" : "s");
    dec->have_limits = 0;
    count_decision(dec, METRICS_ERROR);
    return DECIDE_UNAVAILABLE;
}

/* The backend could not decide: on_error says what the request gets. */
static int apply_on_error(struct decision *dec)
{
    switch (dec->conf->redis.on_error) {
    case CONF_ON_ERROR_DENY:
        dec->have_limits = 0;
        count_decision(dec, METRICS_ERROR);
        return DECIDE_UNAVAILABLE;
    case CONF_ON_ERROR_LOCAL:
        if (dec->local != NULL && dec->nkeys > 0) {
            struct store_limit sl[STORE_MAX_LIMITS];
            int n = limits_of(dec, sl);
            dec->call_b = dec->local;
            dec->call = backend_decide(dec->local, sl, n, local_cb, dec);
            if (dec->call != NULL)
                return DECIDE_PENDING;
        }
        return memory_failed(dec, "on_error: local");
    default:        /* allow: forwarded without rate-limit fields */
        dec->have_limits = 0;
        count_decision(dec, METRICS_ERROR);
        return DECIDE_FORWARD;
    }
}

static void finish(struct decision *dec, int verdict)
{
    if (verdict != DECIDE_PENDING)
        dec->done(dec->arg, verdict);
}

/* on_error: local answered. */
static void local_cb(void *arg, const struct store_result *res)
{
    struct decision *dec = arg;
    dec->call = NULL;
    if (res->status != STORE_OK) {
        finish(dec, memory_failed(dec, "on_error: local"));
        return;
    }
    int verdict = apply_decision(dec, res, 0);
    note_settle(dec, res, verdict);
    finish(dec, take_shaping(dec, res, verdict));
}

static void backend_cb(void *arg, const struct store_result *res)
{
    struct decision *dec = arg;
    dec->call = NULL;
    if (backend_store(dec->backend) != NULL)
        metrics_observe(METRICS_REDIS_SECONDS, clock_us() - dec->call_start_us);
    if (res->status != STORE_OK && backend_store(dec->backend) == NULL) {
        finish(dec, memory_failed(dec, "backend: memory"));
        return;
    }
    if (res->status != STORE_OK) {
        /* a timed-out script may still have taken slots: give them back */
        give_back(dec, dec->backend, concurrency_keys(dec), 0);
        count_backend_error(dec->backend, res);
        finish(dec, apply_on_error(dec));
        return;
    }
    int verdict = apply_decision(dec, res, 1);
    note_settle(dec, res, verdict);
    finish(dec, take_shaping(dec, res, verdict));
}

int decide_start(struct decision *dec, const struct decide_env *env, const struct conf *conf,
                 const struct conf_route *route, const struct route_req *req,
                 decide_done *done, void *arg)
{
    dec->conf = conf;
    dec->deny = env->deny;
    dec->local = env->local;
    dec->backend = env->backend;
    dec->done = done;
    dec->holding = env->holding;
    dec->arg = arg;
    dec->decision = -1;
    dec->base = env->base;
    dec->rl.route = route;
    dec->rl.plan = NULL;
    if (decide_allowed(conf, route, req->ip)) {      /* allow lists bypass limiting */
        count_decision(dec, METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    int n = build_keys(dec, conf, route, req);
    if (n < 0)
        return n == ROUTE_KEY_AMBIGUOUS ? DECIDE_AMBIGUOUS :
               n == ROUTE_KEY_BAD ? DECIDE_BAD_KEY :
               n == DECIDE_KEY_MISSING ? DECIDE_MISSING_KEY : DECIDE_BAD_COST;
    dec->nkeys = dec->rl.n = n;
    if (n == 0) {
        count_decision(dec, METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    if (denied_by_cache(dec)) {
        metrics_count(METRICS_DENY_CACHE_HITS);
        count_decision(dec, METRICS_LIMITED);
        note_denials(dec, dec->nkeys);
        reply_pick(&dec->rl, 0);
        dec->have_limits = 1;
        return DECIDE_LIMITED;
    }
    struct store_limit sl[STORE_MAX_LIMITS];
    limits_of(dec, sl);
    dec->call_start_us = clock_us();
    if (backend_store(dec->backend) != NULL)
        metrics_count(METRICS_REDIS_REQUESTS);
    dec->call_b = dec->backend;
    dec->call = backend_decide(dec->backend, sl, n, backend_cb, dec);
    if (dec->call != NULL)
        return DECIDE_PENDING;
    count_backend_error(dec->backend, NULL);
    return apply_on_error(dec);
}

/* The consumption is recorded (or failed): the response may go on. */
static void counted_cb(void *arg, const struct store_result *res)
{
    struct decision *dec = arg;
    dec->count_call = NULL;
    if (res->status != STORE_OK)
        count_backend_error(dec->backend, res);
    dec->done(dec->arg, 0);
}

int decide_count_status(struct decision *dec, int status, decide_done *done, void *arg)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    int n = 0;
    unsigned counted = dec->counted;
    dec->counted = 0;
    if (counted == 0 || status < 0 || status >= CONF_MAX_STATUS)
        return 0;
    for (int i = 0; i < dec->nkeys; i++) {
        const struct conf_limit *l = dec->rl.limit[i];
        if ((counted & (1u << i)) && l->count_status[status])
            sl[n++] = (struct store_limit){ dec->keybuf + dec->key[i].off, dec->key[i].len,
                                            dec->key[i].params, dec->key[i].cost,
                                            l->shadow ? STORE_SHADOW : 0 };
    }
    if (n == 0)
        return 0;
    /* Always the worker's backend, even after an on_error: local decision. */
    if (backend_store(dec->backend) != NULL)
        metrics_count(METRICS_REDIS_REQUESTS);
    dec->done = done;
    dec->arg = arg;
    dec->count_call = backend_decide(dec->backend, sl, n, counted_cb, dec);
    if (dec->count_call == NULL)
        count_backend_error(dec->backend, NULL);
    return dec->count_call != NULL;
}

void decide_cancel(struct decision *dec)
{
    if (dec->call) {
        backend_cancel(dec->call_b, dec->call);
        /* its answer is lost, not its effect: the slots it may have taken
         * go back (after it, on the same connection) */
        give_back(dec, dec->call_b, concurrency_keys(dec), 0);
        dec->call = NULL;
    }
    decide_release(dec);
    decide_settle(dec, -1, NULL, NULL);     /* the estimate stands */
    if (dec->settle_call) {         /* applied in Redis all the same */
        backend_settle_cancel(dec->settle_b, dec->settle_call);
        dec->settle_call = NULL;
    }
    if (dec->settle_ev)
        event_del(dec->settle_ev);
    if (dec->count_call) {
        backend_cancel(dec->backend, dec->count_call);
        dec->count_call = NULL;
    }
}
