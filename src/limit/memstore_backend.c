/* sluice - memstore_backend.c: the in-process backend (backend.h) over the
 * process's shared memstore.
 *
 * It decides at once in the memstore and keeps the result in a call whose
 * callback runs from the loop (an event made active), so callers see the
 * same asynchronous shape as the Redis backend's. Calls are pooled per
 * backend. */
#include <stdlib.h>
#include <event2/event.h>

#include "backend.h"
#include "clock.h"
#include "mem.h"
#include "memstore.h"

struct backend_call {
    struct memstore_backend *mb;
    struct backend_call *next;          /* free list, or pending list */
    struct backend_call *prev;
    struct event *ev;                   /* made active once decided */
    store_cb *cb;
    void *arg;
    struct store_result res;            /* the decision */
};

struct memstore_backend {
    struct event_base *base;
    struct memstore *mem;               /* not owned */
    struct backend_call *free_calls;
    struct backend_call *pending;       /* calls awaiting their callback */
};

static void call_unlink(struct backend_call *c)
{
    struct memstore_backend *mb = c->mb;
    if (c->prev)
        c->prev->next = c->next;
    else
        mb->pending = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = mb->free_calls;
    mb->free_calls = c;
}

/* Pending calls are dropped without their callbacks. */
static void mb_destroy(void *impl)
{
    struct memstore_backend *mb = impl;
    while (mb->pending) {
        struct backend_call *c = mb->pending;
        event_del(c->ev);
        call_unlink(c);
    }
    while (mb->free_calls) {
        struct backend_call *c = mb->free_calls;
        mb->free_calls = c->next;
        if (c->ev)
            event_free(c->ev);
        free(c);
    }
    free(mb);
}

static int mb_drain(void *impl, void (*done)(void *arg), void *arg)
{
    return 0;   /* owes nothing: give-backs are made at once */
}

/* The call's decision is due: the call goes back to the pool before its
 * callback runs, so the callback may decide again. */
static void memory_answer(evutil_socket_t fd, short what, void *arg)
{
    struct backend_call *c = arg;
    store_cb *cb = c->cb;
    void *cbarg = c->arg;
    struct store_result res = c->res;
    call_unlink(c);
    cb(cbarg, &res);
}

static struct backend_call *mb_decide(void *impl, const struct store_limit *limits, int n,
                                      store_cb *cb, void *arg)
{
    struct memstore_backend *mb = impl;
    struct backend_call *c = mb->free_calls;
    if (c) {
        mb->free_calls = c->next;
    } else {
        c = mem_calloc(1, sizeof(*c));
        c->mb = mb;
        c->ev = event_new(mb->base, -1, 0, memory_answer, c);
    }
    c->cb = cb;
    c->arg = arg;
    if (memstore_decide(mb->mem, limits, n, clock_wall_us(), &c->res) != 0)
        c->res.status = STORE_ERROR;
    c->prev = NULL;
    c->next = mb->pending;
    if (mb->pending)
        mb->pending->prev = c;
    mb->pending = c;
    event_active(c->ev, 0, 0);
    return c;
}

static void mb_cancel(void *impl, struct backend_call *call)
{
    event_del(call->ev);
    call_unlink(call);
}

static void mb_release(void *impl, const struct store_limit *l)
{
    memstore_release(((struct memstore_backend *)impl)->mem, l, clock_wall_us());
}

static void mb_renew(void *impl, const struct store_limit *l)
{
    memstore_renew(((struct memstore_backend *)impl)->mem, l, clock_wall_us());
}

static void mb_refund(void *impl, const struct store_limit *l)
{
    memstore_refund(((struct memstore_backend *)impl)->mem, l, clock_wall_us());
}

static int mb_ready(const void *impl)
{
    return 1;
}

static int64_t mb_retry_ms(const void *impl)
{
    return 0;
}

static const struct backend_ops memstore_backend_ops = {
    .decide = mb_decide, .cancel = mb_cancel, .release = mb_release, .renew = mb_renew,
    .refund = mb_refund, .ready = mb_ready, .retry_ms = mb_retry_ms, .drain = mb_drain,
    .destroy = mb_destroy, .redis = 0,
};

struct backend *memstore_backend_create(struct event_base *base, struct memstore *m)
{
    struct memstore_backend *mb = mem_calloc(1, sizeof(*mb));
    mb->base = base;
    mb->mem = m;
    return backend_create(&memstore_backend_ops, mb);
}
