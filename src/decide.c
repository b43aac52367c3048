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

#include "admin_console.h"
#include "backend.h"
#include "clock.h"
#include "conf.h"
#include "decide.h"
#include "denycache.h"
#include "http1.h"
#include "metrics.h"
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
    size_t from = offsetof(struct decision, key_used);
    memset((char *)dec + from, 0, sizeof(*dec) - from);
    dec->decision = -1;
}

void decide_free(struct decision *dec)
{
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

/* The keys of the route's limits, into the request's buffer, with
 * dec->rl.limit[]; returns how many count the request, -1 for a bad
 * cost_header, ROUTE_KEY_AMBIGUOUS for a key source given twice. */
static int build_keys(struct decision *dec, const struct conf *conf,
                      const struct conf_route *r, const struct route_req *req)
{
    char key[ROUTE_MAX_KEY];
    int n = 0;
    dec->key_used = 0;
    for (int i = 0; i < r->nlimits && n < STORE_MAX_LIMITS; i++) {
        const struct conf_limit *l = &r->limits[i];
        long klen = route_key(conf, r, l, req, key);
        if (klen == ROUTE_KEY_AMBIGUOUS)
            return ROUTE_KEY_AMBIGUOUS;
        if (klen <= 0)      /* a key source is absent: not counted */
            continue;
        int64_t cost = r->cost > 0 ? r->cost : 1;
        if (l->cost_header && decide_cost(req, l->cost_header, &cost) < 0)
            return -1;
        unsigned flags = (l->shadow ? STORE_SHADOW : 0) |
                         (l->has_count_status ? STORE_CHECK_ONLY : 0);
        /* a config override of this key: its parameters (a run-time one,
         * in the store, still goes before them) */
        const struct conf_override *o = l->noverrides ? route_override(l, key, (size_t)klen)
                                                      : NULL;
        size_t off = decide_key_add(dec, key, (size_t)klen);
        dec->key[n] = (struct decide_key){ off, (size_t)klen, cost, flags,
                                           o ? &o->params : &l->params };
        dec->rl.limit[n] = l;
        if (flags & STORE_CHECK_ONLY)
            dec->counted |= 1u << n;
        n++;
    }
    return n;
}

/* The request's keys as the backend takes them. */
static int limits_of(const struct decision *dec, struct store_limit *sl)
{
    for (int i = 0; i < dec->nkeys; i++)
        sl[i] = (struct store_limit){ dec->keybuf + dec->key[i].off, dec->key[i].len,
                                      dec->key[i].params, dec->key[i].cost,
                                      dec->key[i].flags };
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
    int64_t now = clock_ms(), denied = 0;
    denycache_sync(dec->deny, resetbus_epoch());    /* a reset or override since */
    for (int i = 0; i < dec->nkeys; i++) {
        int64_t left = denycache_get(dec->deny, dec->keybuf + dec->key[i].off, dec->key[i].len,
                                     now, dec->key[i].cost);
        struct limiter_result *r = &dec->rl.r[i];
        r->limit = dec->key[i].params->limit;
        r->allowed = left == 0;
        r->remaining = left ? 0 : r->limit;
        r->reset_ms = r->retry_ms = left;
        denied |= left;
    }
    return denied != 0;
}

/* The backend denied: remember each denying key until its retry time;
 * later requests for the key stop at the cache. */
static void remember_denials(struct decision *dec, const struct store_result *res)
{
    if (res->n != dec->nkeys)
        return;
    int64_t now = clock_ms();
    for (int i = 0; i < res->n; i++)
        if (!res->r[i].allowed && res->r[i].retry_ms > 0 && !(dec->key[i].flags & STORE_SHADOW))
            denycache_put(dec->deny, dec->keybuf + dec->key[i].off, dec->key[i].len,
                          now + res->r[i].retry_ms, dec->key[i].cost);
}

/* The console's heavy hitters: each key that denied this request. */
static void note_denials(const struct decision *dec, int n)
{
    size_t prefix_len = strlen(dec->conf->redis.prefix);
    for (int i = 0; i < dec->nkeys && i < n; i++)
        if (!dec->rl.r[i].allowed && !(dec->key[i].flags & STORE_SHADOW))
            admin_console_denied(dec->rl.route->name, dec->rl.limit[i]->name, prefix_len,
                                 dec->keybuf + dec->key[i].off, dec->key[i].len);
}

/* An answer is in: allowed (forward) or denied (429). */
static int apply_decision(struct decision *dec, const struct store_result *res, int remember)
{
    memcpy(dec->rl.r, res->r, sizeof(res->r[0]) * (size_t)res->n);
    reply_pick(&dec->rl, res->allowed);
    dec->have_limits = 1;
    if (res->allowed) {
        int shadow_denied = 0;
        for (int i = 0; i < res->n; i++)
            shadow_denied |= !res->r[i].allowed;    /* only shadow ones can */
        count_decision(dec, shadow_denied ? METRICS_SHADOW_LIMITED : METRICS_ALLOWED);
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
        /* no local answer either: as allow */
        __attribute__((fallthrough));
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
    if (res->status != STORE_OK) {      /* as allow */
        dec->have_limits = 0;
        count_decision(dec, METRICS_ERROR);
        finish(dec, DECIDE_FORWARD);
        return;
    }
    finish(dec, apply_decision(dec, res, 0));
}

static void backend_cb(void *arg, const struct store_result *res)
{
    struct decision *dec = arg;
    dec->call = NULL;
    if (backend_store(dec->backend) != NULL)
        metrics_observe(METRICS_REDIS_SECONDS, clock_us() - dec->call_start_us);
    if (res->status != STORE_OK) {
        count_backend_error(dec->backend, res);
        finish(dec, apply_on_error(dec));
        return;
    }
    finish(dec, apply_decision(dec, res, 1));
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
    dec->arg = arg;
    dec->decision = -1;
    dec->rl.route = route;
    if (decide_allowed(conf, route, req->ip)) {      /* allow lists bypass limiting */
        count_decision(dec, METRICS_ALLOWED);
        return DECIDE_FORWARD;
    }
    int n = build_keys(dec, conf, route, req);
    if (n < 0)
        return n == ROUTE_KEY_AMBIGUOUS ? DECIDE_AMBIGUOUS : DECIDE_BAD_COST;
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
        dec->call = NULL;
    }
    if (dec->count_call) {
        backend_cancel(dec->backend, dec->count_call);
        dec->count_call = NULL;
    }
}
