/* sluice - worker.c: a thread with its own event base, listener and
 * runtimes (a config's Redis connection and upstream pools).
 *
 * Each worker binds its own listening socket with SO_REUSEPORT, so the
 * kernel balances new connections across threads without a shared accept
 * lock, and a worker's requests never touch another worker's state. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <event2/event.h>
#include <event2/thread.h>

#include "admin_console.h"
#include "backend.h"
#include "client.h"
#include "conn.h"
#include "clock.h"
#include "denycache.h"
#include "jwtcache.h"
#include "listener.h"
#include "log.h"
#include "mem.h"
#include "memstore.h"
#include "request.h"
#include "runtime.h"
#include "tls_server.h"
#include "upstream.h"
#include "worker.h"


/* One listening socket of a worker. A reload cannot change the sockets
 * (main.c says so), but it brings new certificates: a TLS listener takes
 * the current config's contexts for its entry, or keeps the ones it
 * started with when the new config has no TLS entry for its address. */
struct worker_listen {
    struct worker *w;
    int index;                      /* in conf->listens */
    char *addr;                     /* as written */
    struct listener *l;
    struct tls_server *tls;         /* retained, from the first config; NULL: plain */
    int decision;                   /* a decision.listen entry's (conf.h) */
};

static struct tls_server *listen_tls(const struct worker_listen *wl)
{
    const struct conf *c = wl->w->env.conf;
    if (wl->tls == NULL)
        return NULL;
    if (wl->index < c->nlistens && c->listens[wl->index].server &&
        strcmp(c->listens[wl->index].addr.text, wl->addr) == 0)
        return c->listens[wl->index].server;
    return wl->tls;
}

/* HTTP/2 unless the listener's entry says http2: false. */
static int listen_http2(const struct worker_listen *wl)
{
    const struct conf *c = wl->w->env.conf;
    return !(wl->index < c->nlistens && strcmp(c->listens[wl->index].addr.text, wl->addr) == 0 &&
             c->listens[wl->index].no_http2);
}

static void accept_cb(void *arg, int fd, struct sockaddr *sa, int salen)
{
    struct worker_listen *wl = arg;
    client_accept(&wl->w->env, fd, sa, salen, listen_tls(wl), wl->decision, listen_http2(wl));
}

/* Close the listening sockets; with all, free the rest too (the contexts
 * wait until the worker's clients are gone: one may be in a handshake). */
static void listens_close(struct worker *w, int all)
{
    for (int i = 0; i < w->nlistens; i++) {
        listener_destroy(w->listens[i].l);
        w->listens[i].l = NULL;
        if (all) {
            tls_server_release(w->listens[i].tls);
            free(w->listens[i].addr);
        }
    }
    if (all) {
        free(w->listens);
        w->listens = NULL;
        w->nlistens = 0;
    }
}

static void reload_cb(evutil_socket_t fd, short what, void *arg);
static void stop_cb(evutil_socket_t fd, short what, void *arg);

/* From another thread: one byte per request ('s' stop, 'r' reload). The
 * pipe cannot fill up: at most a few bytes are ever pending. */
static void notify(struct worker *w, char what)
{
    ssize_t n;
    do
        n = write(w->notify[1], &what, 1);
    while (n < 0 && errno == EINTR);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    char cmds[16];
    ssize_t n = read(fd, cmds, sizeof(cmds));
    for (ssize_t i = 0; i < n; i++) {
        if (cmds[i] == 's')
            stop_cb(-1, 0, arg);
        else if (cmds[i] == 'r')
            reload_cb(-1, 0, arg);
    }
}

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    log_warn("worker %d: %d connection%s still busy at shutdown_timeout; closing", w->env.id,
             w->env.nclients, w->env.nclients == 1 ? "" : "s");
    event_base_loopexit(w->env.base, NULL);
}

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    w->env.stopping = 1;
    listens_close(w, 0);    /* closed, not paused: new clients are refused */
    client_drain(&w->env);
    if (w->env.nclients == 0) {
        event_base_loopexit(w->env.base, NULL);
        return;
    }
    struct timeval tv = clock_timeval(w->shutdown_timeout_ms);
    w->drain_timer = evtimer_new(w->env.base, drain_timeout_cb, w);
    evtimer_add(w->drain_timer, &tv);
}

struct worker *worker_create(int id, struct conf *conf, struct memstore *mem,
                             struct accesslog *alog)
{
    struct worker *w = mem_calloc(1, sizeof(*w));
    w->mem = mem;
    w->env.alog = alog;
    const char *step = "event base", *addr = conf->listen.text;
    w->env.id = id;
    if (getrandom(w->env.rng, sizeof(w->env.rng), 0) != (ssize_t)sizeof(w->env.rng) || (w->env.rng[0] | w->env.rng[1]) == 0) {
        w->env.rng[0] = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)w;
        w->env.rng[1] = 0xbf58476d1ce4e5b9ULL ^ (uint64_t)id;
    }
    pthread_mutex_init(&w->reload_lock, NULL);
    /* Only this worker's thread touches its base, so it needs no lock:
     * requests make many event calls, each of which would take one. The
     * main thread reaches the worker through the notify pipe instead. */
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    /* Coalesce the epoll_ctl calls of one loop iteration (a request enables
     * and disables write events several times): measured 4.7 per request. */
    event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    w->env.base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (w->env.base == NULL)
        goto fail;
    step = "notify pipe";
    if (pipe2(w->notify, O_NONBLOCK | O_CLOEXEC) < 0)
        goto fail;

    step = "listen";
    char who[32];
    snprintf(who, sizeof(who), "worker %d", id);
    w->listens = mem_calloc((size_t)conf->nlistens, sizeof(*w->listens));
    for (; w->nlistens < conf->nlistens; w->nlistens++) {
        const struct conf_listen *cl = &conf->listens[w->nlistens];
        struct worker_listen *wl = &w->listens[w->nlistens];
        wl->w = w;
        wl->index = w->nlistens;
        wl->addr = mem_strndup(cl->addr.text, strlen(cl->addr.text));
        wl->decision = cl->decision;
        addr = cl->addr.text;
        int fd = listener_socket((const struct sockaddr *)&cl->addr.ss, cl->addr.sslen, 4096,
                                 LISTENER_REUSEPORT | LISTENER_V6ONLY);
        if (fd < 0)
            goto fail;
        wl->l = listener_create(w->env.base, fd, who, cl->addr.text, accept_cb, wl);
        if (wl->l == NULL)
            goto fail;
        wl->tls = cl->server;
        if (wl->tls)
            tls_server_retain(wl->tls);
    }

    w->notify_ev = event_new(w->env.base, w->notify[0], EV_READ | EV_PERSIST, notify_cb, w);
    event_add(w->notify_ev, NULL);
    /* Made on the main thread, used only once the worker's thread runs. */
    w->env.rt = runtime_create(w->env.base, conf, mem, NULL);
    w->env.conf = w->env.rt->conf;
    w->env.deny = denycache_create(conf->deny_cache_max_keys);
    w->env.jwt = jwtcache_create(JWTCACHE_MAX_TOKENS);
    w->env.local = memstore_backend_create(w->env.base, mem);
    return w;

fail:
    log_error("worker %d: %s failed on '%s': %s", id, step, addr, strerror(errno));
    worker_destroy(w);
    return NULL;
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;    /* only ends settle()'s last wait */
}

/* The loop has ended (the last client is gone, or shutdown_timeout): the
 * give-backs and refunds the last requests queued still reach Redis, as at
 * a reload (store_drain), or a stop would leave their concurrency slots and
 * reservations taken until the leases end. Each store gives up on its own
 * budget (2 s + redis.timeout); the timer only bounds the wait. */
static void settle(struct worker *w)
{
    int64_t ms = runtime_owed_ms(w->env.rt);
    if (ms == 0)
        return;
    int64_t end = clock_ms() + ms;
    struct event *wake = evtimer_new(w->env.base, wake_cb, w);
    struct timeval tv = clock_timeval(ms);
    if (wake == NULL || evtimer_add(wake, &tv) != 0)
        abort();
    while (runtime_owed_ms(w->env.rt) > 0 && clock_ms() < end)
        event_base_loop(w->env.base, EVLOOP_ONCE);
    event_free(wake);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    admin_console_worker(w->env.id);
    event_base_dispatch(w->env.base);
    client_close_all(&w->env);
    settle(w);
    return NULL;
}

int worker_start(struct worker *w)
{
    return pthread_create(&w->thread, NULL, worker_main, w);
}

void worker_stop(struct worker *w, int64_t shutdown_timeout_ms)
{
    w->shutdown_timeout_ms = shutdown_timeout_ms;
    notify(w, 's');
}

void worker_join(struct worker *w)
{
    pthread_join(w->thread, NULL);
}

struct backend *worker_backend(const struct worker *w)
{
    return runtime_backend(w->env.rt);
}

/* In the worker's thread: a new runtime (pools, and a backend unless the
 * backend settings are the same) and scratch for the new config. The old
 * runtime retires: its idle upstream connections close, its Redis store
 * stops counting for /readyz, and it is freed with its connections when the
 * last request that started under it ends. */
static void reload_cb(evutil_socket_t fd, short what, void *arg)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->reload_lock);
    struct conf *nc = w->pending;
    w->pending = NULL;
    pthread_mutex_unlock(&w->reload_lock);
    if (nc == NULL)
        return;

    struct runtime *old = w->env.rt;
    w->env.rt = runtime_create(w->env.base, nc, w->mem, old);
    conf_release(nc);       /* the reference taken in worker_reload(): rt has its own */
    runtime_retire(old, w->env.rt);
    runtime_release(old);   /* the worker's; requests in flight hold theirs */
    w->env.conf = w->env.rt->conf;
}

void worker_reload(struct worker *w, struct conf *conf)
{
    conf_retain(conf);
    pthread_mutex_lock(&w->reload_lock);
    struct conf *old = w->pending;
    w->pending = conf;
    pthread_mutex_unlock(&w->reload_lock);
    if (old)
        conf_release(old);
    notify(w, 'r');
}

void worker_destroy(struct worker *w)
{
    if (w == NULL)
        return;
    client_close_all(&w->env);
    request_spares_free(&w->env);
    runtime_destroy_all(w->env.rt);     /* the loop has ended: freed here */
    w->env.rt = NULL;
    backend_destroy(w->env.local);
    if (w->pending)
        conf_release(w->pending);

    denycache_destroy(w->env.deny);
    jwtcache_destroy(w->env.jwt);
    listens_close(w, 1);
    if (w->notify_ev)
        event_free(w->notify_ev);
    if (w->notify[0] > 0) {
        close(w->notify[0]);
        close(w->notify[1]);
    }
    if (w->drain_timer)
        event_free(w->drain_timer);
    if (w->env.base)
        event_base_free(w->env.base);
    pthread_mutex_destroy(&w->reload_lock);
    free(w);
}
