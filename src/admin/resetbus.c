/* sluice - resetbus.c: the process's reset epoch and its Redis subscriber.
 *
 * The subscriber runs on a thread and event base of its own, so it needs
 * no worker and no admin endpoint: every process that decides in Redis
 * hears every reset. The connection itself is store_sub.c's. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "loopthread.h"
#include "mem.h"
#include "plantable.h"
#include "resetbus.h"
#include "store.h"

static _Atomic uint64_t resetbus_epoch_now;

struct resetbus {
    struct loopthread *loop;
    struct store_sub *sub;
    struct store_sub *plans;    /* PREFIX "plans" (plantable.h), with plans: only */
    struct conf_redis rc;       /* as started: compared on reload (not owned) */
    char *prefix;
    struct conf *conf;          /* retained: rc's strings live in it */
};

uint64_t resetbus_epoch(void)
{
    return atomic_load_explicit(&resetbus_epoch_now, memory_order_relaxed);
}

void resetbus_bump(void)
{
    atomic_fetch_add(&resetbus_epoch_now, 1);
}

static void resetbus_message(void *arg, const char *msg, size_t len)
{
    resetbus_bump();
}

/* A plan assigned or cleared, or the plans read whole: the deny caches
 * may hold what the old plan denied under another plan's keys, which stay
 * right; nothing to forget. */
static void resetbus_plan(void *arg, const char *msg, size_t len)
{
    if (msg != NULL)
        plantable_message(msg, len);
}

static void resetbus_plans(void *arg, int n, const char *const *s, const size_t *lens)
{
    plantable_replace(n, s, lens);
}

static void resetbus_free(struct resetbus *rb)
{
    store_sub_destroy(rb->sub);
    store_sub_destroy(rb->plans);
    loopthread_destroy(rb->loop);
    if (rb->conf)
        conf_release(rb->conf);
    free(rb->prefix);
    free(rb);
}

struct resetbus *resetbus_start(const struct conf *conf)
{
    if (conf->backend != CONF_BACKEND_REDIS || !conf->redis.overrides)
        return NULL;            /* no admin.token: no writes to hear of */
    struct resetbus *rb = mem_calloc(1, sizeof(*rb));
    char channel[512];
    rb->conf = (struct conf *)conf;
    conf_retain(rb->conf);
    rb->rc = conf->redis;
    rb->prefix = strdup(conf->redis.prefix ? conf->redis.prefix : "");
    rb->loop = loopthread_create(NULL, NULL);
    if (rb->loop == NULL || rb->prefix == NULL)
        goto fail;
    snprintf(channel, sizeof(channel), "%s" RESETBUS_CHANNEL, rb->prefix);
    rb->sub = store_sub_create(loopthread_base(rb->loop), &conf->redis, channel, NULL,
                               resetbus_message, NULL, rb);
    if (conf->nplans > 0) {
        snprintf(channel, sizeof(channel), "%s" PLANTABLE_KEY, rb->prefix);
        rb->plans = store_sub_create(loopthread_base(rb->loop), &conf->redis, channel, channel,
                                     resetbus_plan, resetbus_plans, rb);
    }
    if (loopthread_start(rb->loop) != 0)
        goto fail;
    return rb;
fail:
    log_error("resetbus: cannot start the reset subscriber: no memory or thread");
    resetbus_free(rb);
    return NULL;
}

struct resetbus *resetbus_reload(struct resetbus *rb, const struct conf *conf)
{
    int wanted = conf->backend == CONF_BACKEND_REDIS && conf->redis.overrides;
    int same = rb != NULL && wanted &&
               store_same_conf(&rb->rc, &conf->redis) &&
               (rb->plans != NULL) == (conf->nplans > 0) &&
               !strcmp(rb->prefix, conf->redis.prefix ? conf->redis.prefix : "");
    if (same || (rb == NULL && !wanted))
        return rb;
    resetbus_stop(rb);
    resetbus_bump();            /* a new Redis: what was denied may differ */
    return resetbus_start(conf);
}

void resetbus_stop(struct resetbus *rb)
{
    if (rb == NULL)
        return;
    loopthread_stop(rb->loop);
    resetbus_free(rb);
}
