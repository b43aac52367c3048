/* sluice - rls.c: one ShouldRateLimit call (rls.h).
 *
 *   body ──▶ decode (rls_wire) ──▶ per descriptor: the call's own limit,
 *            or the configured one it meets (rls_match); unlimited and
 *            replaced ones drop out
 *        ──▶ a key the worker's deny cache holds: OVER_LIMIT without Redis
 *        ──▶ ONE backend call with every limited descriptor (batched with
 *            the proxy's decisions) ──▶ statuses in request order, the
 *            proxy's rate-limit fields ──▶ framed RateLimitResponse
 *        Redis down: decision.rls_on_error (allow, deny, gRPC 14), else
 *        redis.on_error (allow, deny, local).
 *
 * Semantics as envoyproxy/ratelimit answers (src/service/ratelimit.go):
 * an unknown domain or descriptor is OK with no current_limit; unlimited
 * is OK with limit_remaining 2^32-1; a request's limit override counts
 * under the descriptor's own key; hits_addend per descriptor (0: a peek
 * that consumes nothing) over the request's (0 or unset: 1). sluice's
 * own: a concurrency descriptor takes a slot (one id per call, named in
 * request_headers_to_add) until its lease ends or a call whose descriptor
 * ends in a sluice_lease entry gives it back (backend_release). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>

#include "admin_console.h"
#include "backend.h"
#include "clock.h"
#include "conf.h"
#include "denycache.h"
#include "mem.h"
#include "metrics.h"
#include "reply.h"
#include "resetbus.h"
#include "rls.h"
#include "rls_match.h"
#include "rls_wire.h"

enum item_kind { ITEM_NONE, ITEM_UNLIMITED, ITEM_LIMITED, ITEM_RELEASE };

/* A concurrency descriptor's slot: taken by a call that passes, named in
 * its answer's request_headers_to_add, given back by a call whose
 * descriptor ends in this entry with that value (docs/rls.md). */
#define RLS_LEASE_HEADER "X-Sluice-Lease"
#define RLS_LEASE_ENTRY  "sluice_lease"

struct rls_item {
    enum item_kind kind;
    const struct conf_rls_limit *cl;    /* the configured limit; NULL: an override */
    struct limiter_params params;       /* an override's */
    uint32_t rpu;
    int unit;
    int shadow;
    int slot;                           /* its place in the backend call */
    int nentries;                       /* the entries matched (a release's last is not) */
    int64_t lease;                      /* ITEM_RELEASE: the slot given back */
};

struct rls_call {
    const struct conf *conf;
    struct rls_env env;
    struct rls_req req;
    const struct conf_rls_domain *domain;
    struct rls_item item[RLS_MAX_DESCRIPTORS];
    int nlim;
    int item_of[STORE_MAX_LIMITS];      /* the descriptor of each backend limit */
    int64_t slot_id;                    /* the call's concurrency slot, 0: none */
    struct store_limit sl[STORE_MAX_LIMITS];
    char key[STORE_MAX_LIMITS][RLS_MAX_KEY];
    struct backend *call_b;
    struct backend_call *bcall;
    int64_t start_us;
    rls_done *done;
    void *arg;
    /* the answer */
    int grpc;
    const char *message;
    uint8_t *msg;
    size_t msglen;
    /* the synthetic route and limits the proxy's field writer reads */
    struct conf_route route;
    struct conf_limit limits[STORE_MAX_LIMITS];
};

struct rls_call *rls_call_new(void)
{
    return mem_calloc(1, sizeof(struct rls_call));
}

void rls_cancel(struct rls_call *call)
{
    if (call->bcall) {
        backend_cancel(call->call_b, call->bcall);
        call->bcall = NULL;
    }
}

static void call_reset(struct rls_call *call)
{
    rls_cancel(call);
    rls_wire_free(&call->req);
    free(call->msg);
    call->msg = NULL;
    call->msglen = 0;
    call->grpc = 0;
    call->message = NULL;
    call->nlim = 0;
    call->domain = NULL;
    call->slot_id = 0;
}

void rls_call_free(struct rls_call *call)
{
    if (call == NULL)
        return;
    call_reset(call);
    free(call);
}

int rls_answer(const struct rls_call *call, const uint8_t **msg, size_t *len,
               const char **message)
{
    *msg = call->msg;
    *len = call->msglen;
    *message = call->message;
    return call->grpc;
}

static int fail(struct rls_call *call, int grpc, const char *why)
{
    call->grpc = grpc;
    call->message = why;
    return 1;
}

void rls_refuse(struct rls_call *call, int grpc, const char *why)
{
    call_reset(call);
    fail(call, grpc, why);
}

/* The unit of a request's override (envoy.type.v3.RateLimitUnit, which has
 * no WEEK) is the response's unit of the same number. */
static int override_item(struct rls_item *it, const struct rls_desc *d)
{
    int64_t s = d->limit_unit >= 1 && d->limit_unit <= 6 ? conf_rls_unit_seconds(d->limit_unit) : 0;
    if (s == 0)
        return -1;
    it->kind = ITEM_LIMITED;
    it->rpu = d->limit_rpu;
    it->unit = d->limit_unit;
    it->params.algo = LIMITER_FIXED_WINDOW;
    it->params.limit = d->limit_rpu > LIMITER_MAX_LIMIT ? LIMITER_MAX_LIMIT : d->limit_rpu;
    it->params.window_ms = s * 1000;
    it->params.cal = TZCAL_NONE;
    return 0;
}

/* A limited descriptor gives up its limit when another matched one
 * replaces it by name (the reference's rate_limit.replaces). */
static void apply_replaces(struct rls_call *call)
{
    int n = call->req.ndescs;
    for (int i = 0; i < n; i++) {
        const struct conf_rls_limit *l = call->item[i].cl;
        if (call->item[i].kind != ITEM_LIMITED || l == NULL || l->name == NULL)
            continue;
        for (int j = 0; j < n && call->item[i].kind == ITEM_LIMITED; j++) {
            const struct conf_rls_limit *r = call->item[j].cl;
            for (int k = 0; r && k < r->nreplaces; k++)
                if (strcmp(r->replaces[k], l->name) == 0)
                    call->item[i].kind = ITEM_NONE;
        }
    }
}

/* The cost of descriptor d: its own hits_addend, else the request's (0:
 * 1). 0 is a peek. Beyond the limit it can only be denied: capped there
 * (a run-time override's limit, with admin.token, can be any). */
static int64_t item_cost(const struct rls_req *req, const struct rls_desc *d,
                         const struct limiter_params *p, int overrides)
{
    uint64_t hits = d->has_hits ? d->hits : req->hits_addend ? req->hits_addend : 1;
    uint64_t cap = (uint64_t)(overrides ? LIMITER_MAX_LIMIT : p->limit) + 1;
    return (int64_t)(hits > cap ? cap : hits);
}

static const struct limiter_params *item_params(const struct rls_item *it)
{
    return it->cl ? &it->cl->params : &it->params;
}

static void status_limit(const struct rls_item *it, const struct limiter_result *r,
                         struct rls_status *st);

static void statuses_plain(struct rls_call *call, struct rls_status *st)
{
    memset(st, 0, sizeof(*st) * (size_t)call->req.ndescs);
    for (int i = 0; i < call->req.ndescs; i++)
        if (call->item[i].kind == ITEM_UNLIMITED)
            st[i].remaining = UINT32_MAX;
        else if (call->item[i].kind == ITEM_RELEASE)
            status_limit(&call->item[i], NULL, &st[i]);
}

/* r: the decision, whose limit is a run-time override's when one applied
 * (a window's requests_per_unit, concurrency's slots); NULL: none made. */
static void status_limit(const struct rls_item *it, const struct limiter_result *r,
                         struct rls_status *st)
{
    const struct limiter_params *p = item_params(it);
    int conc = p->algo == LIMITER_CONCURRENCY;     /* slots, not per a unit */
    st->has_limit = 1;
    st->rpu = conc ? (uint32_t)p->limit : it->rpu;
    if (r && r->limit != p->limit && (p->algo <= LIMITER_SLIDING_LOG || conc))
        st->rpu = r->limit > UINT32_MAX ? UINT32_MAX : (uint32_t)r->limit;
    st->unit = conc ? 0 : it->unit;
    st->name = it->cl && it->cl->name ? it->cl->name : "";
}

/* Split "Name: value\r\n" lines into headers (pointing into text). */
static int split_fields(char *text, size_t len, struct rls_header *h, int max)
{
    int n = 0;
    char *p = text, *end = text + len;
    while (p < end && n < max) {
        char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        char *colon = eol ? memchr(p, ':', (size_t)(eol - p)) : NULL;
        if (eol == NULL || colon == NULL)
            break;
        char *v = colon + 1;
        while (v < eol && *v == ' ')
            v++;
        h[n++] = (struct rls_header){ p, v, (size_t)(colon - p), (size_t)(eol - v) };
        p = eol + 2;
    }
    return n;
}

static void count(struct rls_call *call, enum metrics_decision d)
{
    if (call->domain && call->domain->metrics)
        metrics_request(call->domain->metrics, d);
    metrics_decision_mode(d);
}

/* The console's heavy hitters: a descriptor that denied the call, under
 * its route rls:DOMAIN and its limit, each entry a key part "key=value"
 * (the proxy's denials go there as PREFIX{ROUTE|LIMIT|PARTS}, parts as
 * LEN:BYTES: the same form, no prefix). */
static void note_denial(const struct rls_call *call, int i, const char *limit)
{
    char route[RLS_MAX_KEY / 4], key[RLS_MAX_KEY];
    const struct rls_desc *d = &call->req.descs[i];
    if (call->domain == NULL)
        return;
    int n = snprintf(route, sizeof route, CONF_RLS_ROUTE_PREFIX "%s", call->domain->name);
    if (n < 0 || (size_t)n >= sizeof route)
        return;
    size_t at = (size_t)snprintf(key, sizeof key, "{%s|%s|", route, limit);
    for (int e = 0; e < d->nentries && at < sizeof key; e++)     /* parts: LEN:BYTES */
        at += (size_t)snprintf(key + at, sizeof key - at, "%zu:%s=%s",
                               strlen(d->entries[e].key) + 1 + strlen(d->entries[e].value),
                               d->entries[e].key, d->entries[e].value);
    if (at + 1 >= sizeof key)
        return;         /* too long to show whole */
    key[at++] = '}';
    admin_console_denied(route, limit, 0, key, at, 0);
}

/* The backend's answer into statuses, fields and the framed message. */
static void answer_results(struct rls_call *call, const struct store_result *res)
{
    int n = call->req.ndescs, over = 0, shadow_over = 0, leased = 0;
    struct rls_status st[RLS_MAX_DESCRIPTORS];
    statuses_plain(call, st);
    struct reply_limits rl;
    memset(&rl, 0, sizeof rl);
    memset(&call->route, 0, sizeof call->route);
    call->route.name = (char *)call->req.domain;
    call->route.headers = CONF_HEADERS_FULL;
    call->route.limits = call->limits;
    call->route.nlimits = call->nlim;
    rl.route = &call->route;
    rl.n = call->nlim;
    for (int s = 0; s < call->nlim && s < res->n; s++) {
        int i = call->item_of[s];
        const struct rls_item *it = &call->item[i];
        const struct limiter_result *r = &res->r[s];
        status_limit(it, r, &st[i]);
        st[i].over = !r->allowed && !it->shadow;
        over |= st[i].over;
        shadow_over |= !r->allowed && it->shadow;
        st[i].remaining = r->remaining > UINT32_MAX ? UINT32_MAX : (uint32_t)r->remaining;
        st[i].reset_ms = r->reset_ms;
        leased |= call->sl[s].slot != 0 && r->allowed && !(call->sl[s].flags & STORE_CHECK_ONLY);
        struct conf_limit *cl = &call->limits[s];
        memset(cl, 0, sizeof *cl);
        cl->name = (char *)(it->cl ? (it->cl->name ? it->cl->name : it->cl->path) : "override");
        if (st[i].over)
            note_denial(call, i, cl->name);
        cl->params = *item_params(it);
        cl->shadow = it->shadow;
        rl.limit[s] = cl;
        rl.r[s] = *r;
    }
    struct rls_header h[16];
    int nh = 0;
    struct evbuffer *fields = evbuffer_new();
    if (fields == NULL)
        abort();
    if (call->nlim > 0) {
        reply_pick(&rl, !over);
        reply_limit_fields(fields, &rl, over);
        size_t flen = evbuffer_get_length(fields);
        nh = split_fields((char *)evbuffer_pullup(fields, -1), flen, h, 16);
    }
    /* a slot is held when its descriptor allowed and the call passed (or
     * each descriptor consumes on its own) */
    char id[24];
    struct rls_header lease = { RLS_LEASE_HEADER, id, sizeof(RLS_LEASE_HEADER) - 1, 0 };
    leased &= !over || call->conf->decision.rls_count_each;
    if (leased)
        lease.value_len = (size_t)snprintf(id, sizeof id, "%lld", (long long)call->slot_id);
    call->msg = rls_wire_encode(over, st, n, h, nh, &lease, leased, &call->msglen);
    evbuffer_free(fields);
    count(call, over ? METRICS_LIMITED : shadow_over ? METRICS_SHADOW_LIMITED : METRICS_ALLOWED);
}

/* Redis could not decide: decision.rls_on_error, or redis.on_error. */
static void answer_on_error(struct rls_call *call);

static void backend_cb(void *arg, const struct store_result *res)
{
    struct rls_call *call = arg;
    call->bcall = NULL;
    if (backend_store(call->call_b) != NULL)
        metrics_observe(METRICS_REDIS_SECONDS, clock_us() - call->start_us);
    if (res->status != STORE_OK) {
        if (backend_store(call->call_b) != NULL)
            metrics_redis_error(res->status == STORE_TIMEOUT ? METRICS_REDIS_ERR_TIMEOUT :
                                res->status == STORE_OOM ? METRICS_REDIS_ERR_OOM :
                                METRICS_REDIS_ERR_ERROR);
        if (call->call_b == call->env.local || backend_store(call->call_b) == NULL)
            fail(call, RLS_GRPC_UNAVAILABLE, "the memory limiter could not decide");
        else
            answer_on_error(call);
        if (call->bcall)
            return;             /* on_error: local decides */
    } else {
        if (call->env.deny && call->call_b == call->env.backend)
            denycache_remember(call->env.deny, call->sl, call->nlim, res->r, clock_ms());
        answer_results(call, res);
    }
    call->done(call->arg);
}

static int decide(struct rls_call *call, struct backend *b)
{
    call->call_b = b;
    call->start_us = clock_us();
    if (backend_store(b) != NULL)
        metrics_count(METRICS_REDIS_REQUESTS);
    call->bcall = backend_decide(b, call->sl, call->nlim, backend_cb, call);
    return call->bcall != NULL;
}

static void answer_on_error(struct rls_call *call)
{
    enum conf_rls_on_error how = call->conf->decision.rls_on_error;
    if (how == CONF_RLS_ON_ERROR_REDIS)
        how = call->conf->redis.on_error == CONF_ON_ERROR_DENY ? CONF_RLS_ON_ERROR_DENY :
              call->conf->redis.on_error == CONF_ON_ERROR_LOCAL ? CONF_RLS_ON_ERROR_REDIS :
              CONF_RLS_ON_ERROR_ALLOW;
    if (how == CONF_RLS_ON_ERROR_REDIS) {       /* local: the worker's memory limiter */
        if (call->env.local && call->call_b != call->env.local && decide(call, call->env.local))
            return;
        how = CONF_RLS_ON_ERROR_UNAVAILABLE;
    }
    count(call, METRICS_ERROR);
    if (how == CONF_RLS_ON_ERROR_UNAVAILABLE) {
        fail(call, RLS_GRPC_UNAVAILABLE, "the rate limit backend is unavailable");
        return;
    }
    struct rls_status st[RLS_MAX_DESCRIPTORS];
    int over = 0;
    statuses_plain(call, st);
    for (int s = 0; how == CONF_RLS_ON_ERROR_DENY && s < call->nlim; s++) {
        int i = call->item_of[s];
        status_limit(&call->item[i], NULL, &st[i]);
        st[i].over = !call->item[i].shadow;
        over |= st[i].over;
    }
    call->msg = rls_wire_encode(over, st, call->req.ndescs, NULL, 0, NULL, 0, &call->msglen);
}

/* All or nothing: a key the worker's deny cache holds (Redis denied it
 * until a time not yet come) answers the call without Redis, as the
 * proxy's requests are answered; nothing would have been consumed. Each
 * descriptor consuming on its own (every_descriptor) must ask Redis. */
static int deny_cached(struct rls_call *call)
{
    struct denycache *dc = call->env.deny;
    struct store_result res = { .status = STORE_OK, .n = call->nlim };
    if (dc == NULL || call->conf->decision.rls_count_each)
        return 0;
    denycache_sync(dc, resetbus_epoch());       /* a reset or override since */
    if (!denycache_check(dc, call->sl, call->nlim, clock_ms(), res.r))
        return 0;
    metrics_count(METRICS_DENY_CACHE_HITS);
    answer_results(call, &res);
    return 1;
}

/* A descriptor ending in RLS_LEASE_ENTRY: its value into *lease (0: none).
 * -1 when the value is no slot id. */
static int release_entry(const struct rls_desc *d, int64_t *lease)
{
    const struct rls_entry *e = d->nentries > 1 ? &d->entries[d->nentries - 1] : NULL;
    *lease = 0;
    if (e == NULL || strcmp(e->key, RLS_LEASE_ENTRY) != 0)
        return 0;
    char *end;
    errno = 0;
    long long v = strtoll(e->value, &end, 10);
    if (errno || end == e->value || *end || v < 1 || v >= (1LL << 53))
        return -1;
    *lease = v;
    return 0;
}

/* Give back the slot of release item i, fire and forget (refund.lua,
 * pipelined with the decisions; unknown or expired: nothing happens). */
static void release(struct rls_call *call, int i)
{
    const struct rls_desc *d = &call->req.descs[i];
    const struct rls_item *it = &call->item[i];
    const char *share[RLS_MAX_ENTRIES] = { 0 };
    char key[RLS_MAX_KEY];
    rls_match(call->domain, d->entries, it->nentries, share);
    size_t klen = rls_key(call->conf->redis.prefix, call->req.domain, d->entries, it->nentries,
                          share, key);
    struct store_limit l = { key, klen, item_params(it), 1, 0, it->lease };
    backend_release(call->env.backend, &l);
}

int rls_start(struct rls_call *call, const struct rls_env *env, const struct conf *conf,
              const uint8_t *body, size_t len, rls_done *done, void *arg)
{
    call_reset(call);
    call->conf = conf;
    call->env = *env;
    call->done = done;
    call->arg = arg;
    const char *why = NULL;
    int rc = rls_wire_decode(body, len, &call->req, &why);
    if (rc != RLS_GRPC_OK)
        return fail(call, rc, why);
    call->domain = rls_domain(conf->decision.rls, call->req.domain);
    for (int i = 0; i < call->req.ndescs; i++) {
        const struct rls_desc *d = &call->req.descs[i];
        struct rls_item *it = &call->item[i];
        memset(it, 0, sizeof *it);
        if (call->domain == NULL)
            continue;
        if (d->has_limit) {
            if (override_item(it, d) < 0)
                return fail(call, RLS_GRPC_INVALID_ARGUMENT, "a descriptor's limit has an unknown unit");
            continue;
        }
        it->nentries = d->nentries;
        if (release_entry(d, &it->lease) < 0)
            return fail(call, RLS_GRPC_INVALID_ARGUMENT, "a " RLS_LEASE_ENTRY " entry's value "
                        "is not a lease id");
        it->nentries -= it->lease != 0;
        const char *share[RLS_MAX_ENTRIES];
        const struct conf_rls_node *node = rls_match(call->domain, d->entries, it->nentries, share);
        if (node == NULL)
            continue;
        if (it->lease && node->limit->params.algo != LIMITER_CONCURRENCY)
            return fail(call, RLS_GRPC_INVALID_ARGUMENT, "a descriptor ending in "
                        RLS_LEASE_ENTRY " meets no concurrency limit");
        it->cl = node->limit;
        it->kind = node->limit->unlimited ? ITEM_UNLIMITED : ITEM_LIMITED;
        it->rpu = (uint32_t)node->limit->requests_per_unit;
        it->unit = node->limit->unit;
        it->shadow = node->limit->shadow;
        if (it->lease)
            it->kind = ITEM_RELEASE;
    }
    apply_replaces(call);
    for (int i = 0; i < call->req.ndescs; i++) {
        struct rls_item *it = &call->item[i];
        if (it->kind == ITEM_RELEASE)
            release(call, i);
        if (it->kind != ITEM_LIMITED)
            continue;
        if (call->nlim == STORE_MAX_LIMITS)
            return fail(call, RLS_GRPC_INVALID_ARGUMENT,
                        "more than 16 descriptors with a limit in one call");
        const struct rls_desc *d = &call->req.descs[i];
        const char *share[RLS_MAX_ENTRIES] = { 0 };
        if (it->cl)
            rls_match(call->domain, d->entries, d->nentries, share);
        int s = it->slot = call->nlim++;
        size_t klen = rls_key(conf->redis.prefix, call->req.domain, d->entries, d->nentries,
                              share, call->key[s]);
        int64_t slot = 0;
        if (item_params(it)->algo == LIMITER_CONCURRENCY) {
            if (call->slot_id == 0)
                call->slot_id = backend_slot_id();  /* one per call */
            slot = call->slot_id;
        }
        int64_t cost = item_cost(&call->req, d, item_params(it), conf->redis.overrides);
        unsigned flags = it->shadow || conf->decision.rls_count_each ? STORE_SHADOW : 0;
        if (cost == 0)
            flags |= STORE_CHECK_ONLY;      /* a peek: decided, nothing consumed */
        call->sl[s] = (struct store_limit){ call->key[s], klen, item_params(it),
                                            cost ? cost : 1, flags, slot };
        call->item_of[s] = i;
    }
    if (call->nlim == 0) {
        struct store_result none = { .status = STORE_OK, .allowed = 1 };
        answer_results(call, &none);
        return 1;
    }
    if (deny_cached(call))
        return 1;
    if (decide(call, env->backend))
        return 0;
    if (backend_store(env->backend) != NULL)
        metrics_redis_error(METRICS_REDIS_ERR_UNAVAILABLE);
    answer_on_error(call);
    return call->bcall == NULL;
}
