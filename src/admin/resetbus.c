/* sluice - resetbus.c: the process's reset epoch and its Redis subscriber.
 *
 * The subscriber runs on a thread and event base of its own, so it needs
 * no worker and no admin endpoint: every process that decides in Redis
 * hears every reset. The connection itself is store_sub.c's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "log.h"
#include "mem.h"
#include "resetbus.h"
#include "store.h"

static _Atomic uint64_t resetbus_epoch_now;

struct resetbus {
    pthread_t thread;
    struct event_base *base;
    struct event *stop_ev;
    struct store_sub *sub;
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

static void resetbus_message(void *arg)
{
    resetbus_bump();
}

static void *resetbus_main(void *arg)
{
    struct resetbus *rb = arg;
    event_base_dispatch(rb->base);
    return NULL;
}

static void resetbus_stop_cb(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopexit(((struct resetbus *)arg)->base, NULL);
}

static void resetbus_free(struct resetbus *rb)
{
    store_sub_destroy(rb->sub);
    if (rb->stop_ev)
        event_free(rb->stop_ev);
    if (rb->base)
        event_base_free(rb->base);
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
    rb->base = event_base_new();
    if (rb->base == NULL || rb->prefix == NULL)
        goto fail;
    snprintf(channel, sizeof(channel), "%s" RESETBUS_CHANNEL, rb->prefix);
    rb->sub = store_sub_create(rb->base, &conf->redis, channel, resetbus_message, rb);
    rb->stop_ev = event_new(rb->base, -1, 0, resetbus_stop_cb, rb);
    if (rb->stop_ev == NULL || pthread_create(&rb->thread, NULL, resetbus_main, rb) != 0)
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
    event_active(rb->stop_ev, EV_TIMEOUT, 0);
    pthread_join(rb->thread, NULL);
    resetbus_free(rb);
}
