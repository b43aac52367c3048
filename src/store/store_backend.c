/* sluice - store_backend.c: the Redis store behind the backend contract
 * (backend.h), so the decision code above never includes store.h.
 *
 * The store's calls already keep the contract (answered from the loop,
 * cancellable): each verb is the store's own, and a store call is handed out
 * as the backend's call. */
#include "store.h"

static struct backend_call *sb_decide(void *impl, const struct store_limit *limits, int n,
                                      store_cb *cb, void *arg)
{
    return (struct backend_call *)store_decide(impl, limits, n, cb, arg);
}

static void sb_cancel(void *impl, struct backend_call *call)
{
    store_cancel((struct store_call *)call);
}

/* A slot given back and a delayed request's cost refunded are one call:
 * limit.lua's give-back. */
static void sb_give_back(void *impl, const struct store_limit *l)
{
    store_give_back(impl, l);
}

static struct backend_call *sb_settle(void *impl, const struct store_limit *l,
                                      void (*done)(void *arg), void *arg)
{
    return (struct backend_call *)store_settle(impl, l, done, arg);
}

static void sb_settle_cancel(void *impl, struct backend_call *call)
{
    store_settle_cancel((struct store_req *)call);
}

static void renew_answered(void *arg, const struct store_result *res)
{
    /* nothing waits: a lost renewal is retried by the next one */
}

static void sb_renew(void *impl, const struct store_limit *l)
{
    /* limit.lua with the held slot id renews it */
    store_decide(impl, l, 1, renew_answered, NULL);
}

static int sb_ready(const void *impl)
{
    return store_connected(impl);
}

static int64_t sb_retry_ms(const void *impl)
{
    return store_retry_ms(impl);
}

static int sb_drain(void *impl, void (*done)(void *arg), void *arg)
{
    return store_drain(impl, done, arg);
}

static void sb_destroy(void *impl)
{
    store_destroy(impl);
}

static const struct backend_ops store_backend_ops = {
    .decide = sb_decide, .cancel = sb_cancel, .release = sb_give_back, .renew = sb_renew,
    .refund = sb_give_back, .settle = sb_settle, .settle_cancel = sb_settle_cancel,
    .ready = sb_ready, .retry_ms = sb_retry_ms, .drain = sb_drain,
    .destroy = sb_destroy, .redis = 1,
};

struct backend *store_backend_create(struct event_base *base, const struct conf_redis *rc)
{
    return backend_create(&store_backend_ops, store_create(base, rc));
}
