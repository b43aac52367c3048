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
#include "conn.h"

struct event;
struct listener;
struct worker_listen;
struct upstream_pool;
struct memstore;
struct backend;

struct worker {
    struct conn_env env;            /* id, loop, client set, runtime, deny cache,
                                     * local backend, access log, rng: lent to
                                     * its connections */
    pthread_t thread;
    struct worker_listen *listens;  /* one per conf->listens[i]; sockets closed once stopping */
    int nlistens;
    int notify[2];                  /* pipe: other threads -> this one */
    struct event *notify_ev;
    pthread_mutex_t reload_lock;
    struct conf *pending;           /* under reload_lock */
    struct memstore *mem;           /* in-process limiter, shared; not owned */
    struct event *drain_timer;      /* shutdown_timeout */
    int64_t shutdown_timeout_ms;    /* written before the stop byte */
};

/* Create a worker listening on each of conf->listens (SO_REUSEPORT). Returns NULL and
 * logs when the socket cannot be bound. */
struct worker *worker_create(int id, struct conf *conf, struct memstore *mem,
                             struct accesslog *alog);
int worker_start(struct worker *w);
/* Thread-safe: stop accepting, let requests in flight finish (up to
 * shutdown_timeout_ms), then leave the loop. */
void worker_stop(struct worker *w, int64_t shutdown_timeout_ms);
void worker_join(struct worker *w);
void worker_destroy(struct worker *w);

/* The backend new requests decide on (the current runtime's). */
struct backend *worker_backend(const struct worker *w);

/* Thread-safe: apply a newly loaded config (retained here) to new requests. */
void worker_reload(struct worker *w, struct conf *conf);

#endif
