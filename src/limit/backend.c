/* sluice - backend.c: the Redis and the in-process backends behind one
 * contract (backend.h).
 *
 * A Redis backend forwards to its store, whose calls already answer from the
 * loop. A memory backend decides at once in the shared memstore and keeps
 * the result in a call whose callback runs from the loop (an event made
 * active), so callers see the same asynchronous shape whatever the backend.
 * Calls of a memory backend are pooled per backend. */
#include <stdlib.h>
#include <event2/event.h>

#include "backend.h"
#include "clock.h"
#include "mem.h"
#include "list.h"
#include "memstore.h"

enum backend_kind { BACKEND_REDIS, BACKEND_MEMORY };

struct backend_call {
    struct backend *b;
    struct list_link link;              /* on the free list or the pending list */
    struct event *ev;                   /* made active once decided */
    struct store_call *scall;           /* Redis: the store's call */
    store_cb *cb;
    void *arg;
    struct store_result res;            /* memory: the decision */
};

struct backend {
    enum backend_kind kind;
    struct event_base *base;
    struct store *store;                /* Redis */
    struct memstore *mem;               /* memory, not owned */
    struct list free_calls;
    struct list pending;                /* memory calls awaiting their callback */
};

struct backend *backend_redis(struct event_base *base, const struct conf_redis *rc)
{
    struct backend *b = mem_calloc(1, sizeof(*b));
    b->kind = BACKEND_REDIS;
    b->base = base;
    b->store = store_create(base, rc);
    return b;
}

struct backend *backend_memory(struct event_base *base, struct memstore *m)
{
    struct backend *b = mem_calloc(1, sizeof(*b));
    b->kind = BACKEND_MEMORY;
    b->base = base;
    b->mem = m;
    return b;
}

static void call_unlink(struct backend_call *c)
{
    struct backend *b = c->b;
    list_unlink(&b->pending, &c->link);
    list_push(&b->free_calls, &c->link);
}

void backend_destroy(struct backend *b)
{
    if (b == NULL)
        return;
    while (b->pending.first) {
        struct backend_call *c = LIST_ITEM(b->pending.first, struct backend_call, link);
        event_del(c->ev);
        call_unlink(c);
    }
    while (b->free_calls.first) {
        struct backend_call *c = LIST_ITEM(b->free_calls.first, struct backend_call, link);
        list_unlink(&b->free_calls, &c->link);
        if (c->ev)
            event_free(c->ev);
        free(c);
    }
    if (b->store)
        store_destroy(b->store);
    free(b);
}

int backend_drain(struct backend *b, void (*done)(void *arg), void *arg)
{
    return b->store != NULL ? store_drain(b->store, done, arg) : 0;
}

/* The memory call's decision is due: the call goes back to the pool before
 * its callback runs, so the callback may decide again. */
static void memory_answer(evutil_socket_t fd, short what, void *arg)
{
    struct backend_call *c = arg;
    store_cb *cb = c->cb;
    void *cbarg = c->arg;
    struct store_result res = c->res;
    call_unlink(c);
    cb(cbarg, &res);
}

struct backend_call *backend_decide(struct backend *b, const struct store_limit *limits,
                                    int n, store_cb *cb, void *arg)
{
    if (b->kind == BACKEND_REDIS) {
        /* The store's call is the backend's call: a Redis backend hands
         * out store calls under the backend's name. */
        return (struct backend_call *)store_decide(b->store, limits, n, cb, arg);
    }
    struct backend_call *c = LIST_ITEM(b->free_calls.first, struct backend_call, link);
    if (c) {
        list_unlink(&b->free_calls, &c->link);
    } else {
        c = mem_calloc(1, sizeof(*c));
        c->b = b;
        c->ev = event_new(b->base, -1, 0, memory_answer, c);
    }
    c->cb = cb;
    c->arg = arg;
    if (memstore_decide(b->mem, limits, n, clock_wall_us(), &c->res) != 0)
        c->res.status = STORE_ERROR;
    list_push(&b->pending, &c->link);
    event_active(c->ev, 0, 0);
    return c;
}

void backend_cancel(struct backend *b, struct backend_call *call)
{
    if (call == NULL)
        return;
    if (b->kind == BACKEND_REDIS) {
        /* A Redis backend's calls are the store's own (backend_decide). */
        store_cancel((struct store_call *)call);
        return;
    }
    event_del(call->ev);
    call_unlink(call);
}

void backend_release(struct backend *b, const struct store_limit *l)
{
    if (b->kind == BACKEND_REDIS)
        store_give_back(b->store, l);
    else
        memstore_release(b->mem, l, clock_wall_us());
}

static void renew_answered(void *arg, const struct store_result *res)
{
    /* nothing waits: a lost renewal is retried by the next one */
}

void backend_renew(struct backend *b, const struct store_limit *l)
{
    if (b->kind == BACKEND_REDIS)   /* limit.lua with the held slot id renews it */
        store_decide(b->store, l, 1, renew_answered, NULL);
    else
        memstore_renew(b->mem, l, clock_wall_us());
}

void backend_refund(struct backend *b, const struct store_limit *l)
{
    if (b->kind == BACKEND_REDIS)
        store_give_back(b->store, l);
    else
        memstore_refund(b->mem, l, clock_wall_us());
}

int backend_ready(const struct backend *b)
{
    return b->kind == BACKEND_MEMORY || store_connected(b->store);
}

int64_t backend_retry_ms(const struct backend *b)
{
    return b->kind == BACKEND_REDIS ? store_retry_ms(b->store) : 0;
}

struct store *backend_store(const struct backend *b)
{
    return b->store;
}
