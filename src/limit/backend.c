/* sluice - backend.c: the backends behind one contract (backend.h).
 *
 * A backend is a kind's verbs (struct backend_ops) on the kind's object:
 * the in-process one's (memstore_backend.c) or the Redis store's
 * (store_backend.c, above this layer). Both answer from the loop already,
 * so this file only forwards. */
#include <stdlib.h>

#include "backend.h"
#include "mem.h"

struct backend {
    const struct backend_ops *ops;
    void *impl;                         /* owned: ops->destroy frees it */
};

struct backend *backend_create(const struct backend_ops *ops, void *impl)
{
    struct backend *b = mem_calloc(1, sizeof(*b));
    b->ops = ops;
    b->impl = impl;
    return b;
}

void backend_destroy(struct backend *b)
{
    if (b == NULL)
        return;
    b->ops->destroy(b->impl);
    free(b);
}

int backend_drain(struct backend *b, void (*done)(void *arg), void *arg)
{
    return b->ops->drain(b->impl, done, arg);
}

struct backend_call *backend_decide(struct backend *b, const struct store_limit *limits,
                                    int n, store_cb *cb, void *arg)
{
    return b->ops->decide(b->impl, limits, n, cb, arg);
}

void backend_cancel(struct backend *b, struct backend_call *call)
{
    if (call != NULL)
        b->ops->cancel(b->impl, call);
}

void backend_release(struct backend *b, const struct store_limit *l)
{
    b->ops->release(b->impl, l);
}

void backend_renew(struct backend *b, const struct store_limit *l)
{
    b->ops->renew(b->impl, l);
}

void backend_refund(struct backend *b, const struct store_limit *l)
{
    b->ops->refund(b->impl, l);
}

struct backend_call *backend_settle(struct backend *b, const struct store_limit *l, int n,
                                    void (*done)(void *arg), void *arg)
{
    for (int i = 0; i < n - 1; i++)
        b->ops->refund(b->impl, &l[i]);
    if (n < 1)
        return NULL;
    if (b->ops->settle == NULL) {
        b->ops->refund(b->impl, &l[n - 1]);
        return NULL;
    }
    /* one connection answers in order: the last one's answer is all of them's */
    return b->ops->settle(b->impl, &l[n - 1], done, arg);
}

void backend_settle_cancel(struct backend *b, struct backend_call *call)
{
    if (call != NULL && b->ops->settle_cancel != NULL)
        b->ops->settle_cancel(b->impl, call);
}

int backend_ready(const struct backend *b)
{
    return b->ops->ready(b->impl);
}

int64_t backend_retry_ms(const struct backend *b)
{
    return b->ops->retry_ms(b->impl);
}

struct store *backend_store(const struct backend *b)
{
    return b->ops->redis ? b->impl : NULL;
}
