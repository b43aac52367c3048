/* sluice - runtime.h: what one config turns into on one worker.
 *
 * A runtime is a config (retained) with the objects a worker made from it:
 * one upstream pool per conf->upstreams[i] and one backend (a Redis store,
 * or the in-process limiter). As nginx keeps a cycle: a reload builds a new
 * runtime, requests in flight keep the one they started with, and the last
 * release frees the old pools and the old backend (its Redis connections
 * close). The series of the config's routes are not per runtime: they live
 * in the metrics registry keyed by route name, so counters never go back;
 * runtime_bind_metrics() points a config's routes at them.
 *
 * Ownership. A runtime belongs to one worker and is touched only on that
 * worker's thread (its event base), so its count is a plain int:
 *   - the worker holds one reference to its current runtime (worker->rt);
 *   - a request holds one from its head until it ends (request_finish, or
 *     the client's free); an idle keep-alive connection holds none;
 *   - two runtimes share one backend when their backend settings are the
 *     same (store_same_conf), so a reload that does not touch redis keeps
 *     its connection; the backend goes with the last runtime using it.
 * The last release never frees at once (it may come from inside a store
 * callback): it makes the runtime's own event active and the loop frees it;
 * a runtime that is the last on its Redis backend first lets it send the
 * give-backs and refunds its requests queued (backend_drain, bounded by
 * 2 s + redis.timeout), so a reload loses no concurrency slot.
 * The runtimes of a worker form a list, newest first, from the current one;
 * runtime_destroy_all() frees them all once the worker's loop has ended
 * (the runtime made by worker_create on the main thread is only used by the
 * worker after its thread starts). */
#ifndef SLUICE_RUNTIME_H
#define SLUICE_RUNTIME_H

#include "conf.h"

struct event_base;
struct event;
struct memstore;
struct backend;
struct store;
struct upstream_pool;
struct runtime_backend;

struct runtime {
    int refs;                       /* worker's thread only */
    int retired;                    /* a reload replaced it */
    int draining;                   /* released; its backend sends what it owes */
    struct conf *conf;              /* retained */
    struct upstream_pool **pools;   /* one per conf->upstreams[i] */
    struct runtime_backend *backend;
    struct event *free_ev;          /* the last release frees from the loop */
    struct runtime *newer, *older;  /* the worker's runtimes */
};

/* Point every route of c at its series (created on first sight). Called by
 * the main thread before c is handed to workers. */
void runtime_bind_metrics(struct conf *c);

/* A runtime for conf on base with one reference (the caller's). conf is
 * retained. prev, the runtime it replaces (or NULL), gives its backend when
 * the settings are the same, and the new runtime goes before it in the
 * worker's list. mem is the process's memstore (not owned). */
struct runtime *runtime_create(struct event_base *base, struct conf *conf,
                               struct memstore *mem, struct runtime *prev);

struct runtime *runtime_retain(struct runtime *rt);
/* NULL is a no-op. The last release of a retired runtime frees it from the
 * loop, soon after. */
void runtime_release(struct runtime *rt);

/* A reload replaced rt by next: rt's pools stop keeping idle connections,
 * and its backend, unless next shares it, no longer counts for /readyz and
 * sluice_redis_connected. The caller then releases its reference. */
void runtime_retire(struct runtime *rt, const struct runtime *next);

/* The backend decisions of rt's requests go to; its Redis store (NULL for
 * the memory backend). */
struct backend *runtime_backend(const struct runtime *rt);
struct store *runtime_store(const struct runtime *rt);

/* The pool of rt for upstream cu of rt->conf. */
struct upstream_pool *runtime_pool(const struct runtime *rt, const struct conf_upstream *cu);

/* At worker exit, with the loop stopped and every client freed: free rt
 * (the current runtime, whatever its count) and every older one. */
void runtime_destroy_all(struct runtime *rt);

/* 0 when no runtime of rt's list (rt and the older ones still draining)
 * owes Redis a give-back or refund; else at most how long (ms) the longest
 * of them may still take (store_owed_ms). */
int64_t runtime_owed_ms(const struct runtime *rt);

#endif
