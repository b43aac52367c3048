/* sluice - backend.c: the backends behind one contract (backend.h).
 *
 * A backend is a kind's verbs (struct backend_ops) on the kind's object:
 * the in-process one's (memstore_backend.c) or the Redis store's
 * (store_backend.c, above this layer). Both answer from the loop already,
 * so this file only forwards. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "backend.h"
#include "clock.h"
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

/* Slot ids: unique within the process (an odd multiplier is a bijection
 * mod 2^53), random across processes (a salt from getrandom), below 2^53 so
 * the Lua's doubles hold them exactly, never 0. */
#define SLOT_MASK (((uint64_t)1 << 53) - 1)
static uint64_t slot_salt;
static _Atomic uint64_t slot_next;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;

static void slot_salt_init(void)
{
    if (getrandom(&slot_salt, sizeof(slot_salt), 0) != (ssize_t)sizeof(slot_salt))
        slot_salt = (uint64_t)clock_wall_us() ^ ((uint64_t)getpid() << 32);
}

int64_t backend_slot_id(void)
{
    pthread_once(&slot_once, slot_salt_init);
    for (;;) {
        uint64_t n = atomic_fetch_add_explicit(&slot_next, 1, memory_order_relaxed);
        uint64_t id = (slot_salt + n * 0x9e3779b97f4a7c15ULL) & SLOT_MASK;
        if (id != 0)
            return (int64_t)id;
    }
}
