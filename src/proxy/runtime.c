/* sluice - runtime.c: a config's pools and backend on one worker, freed by
 * the last request that uses them (runtime.h).
 *
 * A reload makes a new runtime and retires the old one; the old one goes
 * when its count drops to zero, from its own event, so the free never runs
 * inside a store or client callback that released it, and, when it is the
 * last on its Redis backend, once that has sent what it owes. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <event2/event.h>

#include "backend.h"
#include "mem.h"
#include "memstore.h"
#include "metrics.h"
#include "runtime.h"
#include "store.h"
#include "upstream.h"

/* A backend shared by consecutive runtimes whose backend settings agree. */
struct runtime_backend {
    int refs;
    enum conf_backend kind;
    struct backend *b;
};

void runtime_bind_metrics(struct conf *c)
{
    for (int i = 0; i < c->nroutes; i++)
        c->routes[i].metrics = metrics_route(c->routes[i].name);
    /* Envoy RLS domains: the series "rls:DOMAIN" */
    for (int i = 0; c->decision.rls && i < c->decision.rls->ndomains; i++) {
        struct conf_rls_domain *d = &c->decision.rls->domains[i];
        char *name = NULL;
        if (asprintf(&name, CONF_RLS_ROUTE_PREFIX "%s", d->name) < 0)
            abort();
        d->metrics = metrics_route(name);
        free(name);
    }
}

static int same_backend(const struct conf *a, const struct conf *b)
{
    if (a->backend != b->backend)
        return 0;
    return a->backend == CONF_BACKEND_MEMORY || store_same_conf(&a->redis, &b->redis);
}

static struct runtime_backend *backend_new(struct event_base *base, const struct conf *conf,
                                           struct memstore *mem)
{
    struct runtime_backend *rb = mem_calloc(1, sizeof(*rb));
    rb->refs = 1;
    rb->kind = conf->backend;
    rb->b = conf->backend == CONF_BACKEND_REDIS ? store_backend_create(base, &conf->redis)
                                                : memstore_backend_create(base, mem);
    return rb;
}

static void backend_put(struct runtime_backend *rb)
{
    if (--rb->refs > 0)
        return;
    backend_destroy(rb->b);     /* its Redis connections close */
    free(rb);
}

static void runtime_free(struct runtime *rt)
{
    for (int i = 0; i < rt->conf->nupstreams; i++)
        upstream_pool_destroy(rt->pools[i]);
    free(rt->pools);
    backend_put(rt->backend);
    if (rt->newer)
        rt->newer->older = rt->older;
    if (rt->older)
        rt->older->newer = rt->newer;
    event_free(rt->free_ev);
    conf_release(rt->conf);
    free(rt);
}

static void drained_cb(void *arg)
{
    runtime_free(arg);
}

static void free_cb(evutil_socket_t fd, short what, void *arg)
{
    struct runtime *rt = arg;
    if (rt->refs != 0)      /* somebody took it again in between */
        return;
    /* The last runtime on its backend: the slots and reservations its
     * requests gave back reach Redis before the connection closes (a lost
     * one would stay taken until its lease ends); the runtime stays in the
     * worker's list meanwhile. */
    if (rt->backend->refs == 1 && !rt->draining) {
        rt->draining = 1;
        if (backend_drain(rt->backend->b, drained_cb, rt))
            return;
    }
    runtime_free(rt);
}

struct runtime *runtime_create(struct event_base *base, struct conf *conf,
                               struct memstore *mem, struct runtime *prev)
{
    struct runtime *rt = mem_calloc(1, sizeof(*rt));
    rt->refs = 1;
    rt->conf = conf;
    conf_retain(conf);
    rt->pools = mem_calloc((size_t)(conf->nupstreams > 0 ? conf->nupstreams : 1),
                           sizeof(*rt->pools));
    for (int i = 0; i < conf->nupstreams; i++)
        rt->pools[i] = upstream_pool_create(base, &conf->upstreams[i]);
    if (prev && same_backend(prev->conf, conf)) {
        rt->backend = prev->backend;
        rt->backend->refs++;
    } else {
        rt->backend = backend_new(base, conf, mem);
    }
    rt->free_ev = event_new(base, -1, 0, free_cb, rt);
    if (rt->free_ev == NULL)
        abort();
    if (prev) {
        rt->older = prev;
        rt->newer = prev->newer;
        if (prev->newer)
            prev->newer->older = rt;
        prev->newer = rt;
    }
    return rt;
}

struct runtime *runtime_retain(struct runtime *rt)
{
    assert(rt->refs >= 0);
    rt->refs++;
    return rt;
}

void runtime_release(struct runtime *rt)
{
    if (rt == NULL)
        return;
    assert(rt->refs > 0);
    if (--rt->refs == 0 && rt->retired)
        event_active(rt->free_ev, 0, 0);
}

void runtime_retire(struct runtime *rt, const struct runtime *next)
{
    rt->retired = 1;
    for (int i = 0; i < rt->conf->nupstreams; i++)
        upstream_pool_drain(rt->pools[i]);
    struct store *s = runtime_store(rt);
    if (s && (next == NULL || next->backend != rt->backend))
        store_count_ready(s, 0);
}

struct backend *runtime_backend(const struct runtime *rt)
{
    return rt->backend->b;
}

struct store *runtime_store(const struct runtime *rt)
{
    return backend_store(rt->backend->b);
}

struct upstream_pool *runtime_pool(const struct runtime *rt, const struct conf_upstream *cu)
{
    assert(cu >= rt->conf->upstreams && cu < rt->conf->upstreams + rt->conf->nupstreams);
    return rt->pools[cu - rt->conf->upstreams];
}

int64_t runtime_owed_ms(const struct runtime *rt)
{
    int64_t most = 0;
    for (; rt != NULL; rt = rt->older) {
        struct store *s = runtime_store(rt);
        int64_t ms = s != NULL ? store_owed_ms(s) : 0;
        if (ms > most)
            most = ms;
    }
    return most;
}

void runtime_destroy_all(struct runtime *rt)
{
    if (rt == NULL)
        return;
    while (rt->newer)       /* from the newest */
        rt = rt->newer;
    while (rt) {
        struct runtime *older = rt->older;
        runtime_free(rt);
        rt = older;
    }
}
