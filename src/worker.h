/* sluice - worker.h: one thread serving clients on its own event base.
 *
 * A worker owns everything on its request path: its listener (its own
 * SO_REUSEPORT socket, so the kernel spreads connections), its runtimes (a
 * config's Redis connection and upstream pools, runtime.h), its deny cache
 * and the memory backend of on_error: local. Nothing but the read-only
 * config is shared with other workers.
 * The main thread creates workers, and asks them to stop from outside their
 * thread. */
#ifndef SLUICE_WORKER_H
#define SLUICE_WORKER_H

#include <pthread.h>
#include "conf.h"

struct event_base;
struct event;
struct listener;
struct upstream_pool;
struct client;
struct denycache;
struct accesslog;
struct memstore;
struct runtime;
struct backend;

struct worker {
    int id;
    pthread_t thread;
    struct event_base *base;
    struct listener *listener;      /* NULL once stopping */
    int notify[2];                  /* pipe: other threads -> this one */
    struct event *notify_ev;
    pthread_mutex_t reload_lock;
    struct conf *pending;           /* under reload_lock */
    struct runtime *rt;             /* current; requests retain their own */
    struct backend *local;          /* memory over mem, for on_error: local */
    struct denycache *deny;         /* keys Redis denied, until when */
    struct memstore *mem;           /* in-process limiter, shared; not owned */
    struct accesslog *alog;         /* shared; not owned; NULL when off */
    struct conf *conf;              /* rt->conf; clients retain it */
    int nclients;
    int stopping;                   /* draining: no accepts, no keep-alive */
    struct event *drain_timer;      /* shutdown_timeout */
    int64_t shutdown_timeout_ms;    /* written before the stop byte */
    struct client *clients;         /* all open client connections */
    uint64_t rng[2];                /* xorshift128+ state, for request ids */
};

/* Create a worker listening on conf->listen (SO_REUSEPORT). Returns NULL and
 * logs when the socket cannot be bound. */
struct worker *worker_create(int id, struct conf *conf, struct memstore *mem,
                             struct accesslog *alog);
int worker_start(struct worker *w);
/* Thread-safe: stop accepting, let requests in flight finish (up to
 * shutdown_timeout_ms), then leave the loop. */
void worker_stop(struct worker *w, int64_t shutdown_timeout_ms);
void worker_join(struct worker *w);
void worker_destroy(struct worker *w);

/* 64 random bits from the worker's own generator (not for secrets). */
uint64_t worker_random(struct worker *w);

/* The backend new requests decide on (the current runtime's). */
struct backend *worker_backend(const struct worker *w);

/* Thread-safe: apply a newly loaded config (retained here) to new requests. */
void worker_reload(struct worker *w, struct conf *conf);

#endif
