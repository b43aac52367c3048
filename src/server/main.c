/* sluice - main.c: command line, signals, and the workers' lives.
 *
 * The main thread loads the config, starts the workers and then only
 * waits for signals; all traffic is served on the workers' threads. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <event2/event.h>
#include <event2/thread.h>

#include "accesslog.h"
#include "admin.h"
#include "admin_api.h"
#include "admin_console.h"
#include "clock.h"
#include "conf.h"
#include "confcheck.h"
#include "listener.h"
#include "log.h"
#include "mem.h"
#include "memstore.h"
#include "resetbus.h"
#include "metrics.h"
#include "runtime.h"
#include "worker.h"

#define SLUICE_VERSION "0.1.0"

/* Descriptors kept aside from client connections (see fit_connections). */
#define FD_RESERVE_FIXED  32    /* stdio, event bases, signals, logs, DNS */
#define FD_RESERVE_WORKER 8     /* per worker: listener, notify pipe, epoll... */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice [-t] -c FILE | -V | -h\n"
            "  -c FILE  run with the YAML config FILE\n"
            "  -t       check the config and exit (0 valid, 1 invalid)\n"
            "  -V       print the version\n"
            "  -h       print this help\n");
}

/* What the signal handlers act on; lives in serve()'s frame. */
struct main_state {
    const char *file;
    struct conf *conf;              /* the running config */
    struct worker **workers;
    int n;
    struct event_base *base;
    struct admin *admin;
    struct resetbus *resetbus;      /* the reset subscriber (backend redis) */
    struct memstore *mem;           /* in-process limiter, when configured */
    struct accesslog *alog;         /* NULL when access_log is off */
};

/* What the process holds besides client connections: FD_RESERVE_FIXED, and
 * per worker FD_RESERVE_WORKER, its Redis connections (one, plus one per
 * cluster or sentinel node given) and its upstream connections up to every
 * pool's keepalive, and the admin endpoint's connections and listener. */
static long fd_reserve(const struct conf *c, int workers, int admin)
{
    long keepalive = 0;
    for (int i = 0; i < c->nupstreams; i++)
        keepalive += c->upstreams[i].keepalive;
    long redis = c->backend == CONF_BACKEND_REDIS
                     ? 1 + c->redis.ncluster + c->redis.nsentinel_nodes : 0;
    return FD_RESERVE_FIXED + (long)workers * (FD_RESERVE_WORKER + redis + keepalive) +
           (admin ? ADMIN_MAX_CONNECTIONS + 1 : 0);
}

/* Fit max_connections (0: unlimited) to RLIMIT_NOFILE: at most
 * limit - fd_reserve, at least 1 (nginx's count: one descriptor per client;
 * upstream connections beyond the pools' keepalive take what idle clients
 * leave, and a connect that finds none is a 502). A soft limit that is short
 * is raised towards the hard one first; what still does not fit is clamped,
 * with a warning. */
static void fit_connections(struct conf *c, int workers, int admin)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    long reserve = fd_reserve(c, workers, admin);
    rlim_t want = c->max_connections ? (rlim_t)reserve + (rlim_t)c->max_connections
                                     : rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want && want != RLIM_INFINITY) {
        struct rlimit up = { want < rl.rlim_max ? want : rl.rlim_max, rl.rlim_max };
        if (up.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0) {
            log_info("main: raised the open file limit (RLIMIT_NOFILE) from %llu to %llu",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)up.rlim_cur);
            rl = up;
        }
    }
    if (rl.rlim_cur == RLIM_INFINITY)
        return;
    long fit = (long)rl.rlim_cur - reserve;
    if (fit < 1)
        fit = 1;
    if (fit > 10000000)
        fit = 10000000;
    if (c->max_connections == 0 || c->max_connections > fit) {
        log_warn("main: max_connections %d%s needs more file descriptors than RLIMIT_NOFILE "
                 "%llu allows; using %ld (%ld kept for Redis, upstream pools, admin and "
                 "logs)", c->max_connections, c->max_connections ? "" : " (unlimited)",
                 (unsigned long long)rl.rlim_cur, fit, reserve);
        c->max_connections = (int)fit;
    }
}

static void stop_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct main_state *ms = arg;
    log_info("main: signal %d, stopping", (int)sig);
    event_base_loopexit(ms->base, NULL);
}

/* The same listening sockets (address, TLS or not): a reload keeps the
 * running ones, and takes only new certificates for them. */
static int listens_same(const struct conf *a, const struct conf *b)
{
    if (a->nlistens != b->nlistens)
        return 0;
    for (int i = 0; i < a->nlistens; i++)
        if (strcmp(a->listens[i].addr.text, b->listens[i].addr.text) != 0 ||
            !a->listens[i].tls != !b->listens[i].tls ||
            a->listens[i].decision != b->listens[i].decision)
            return 0;
    return 1;
}

/* SIGHUP: load the file again; a bad file is reported and changes nothing.
 * The listening sockets stay open across a reload, so listen and workers
 * keep their running values until a restart. */
static void reload_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct main_state *ms = arg;
    char *err = NULL;
    int64_t t0 = clock_us();
    struct conf *nc = confcheck_load(ms->file, &err);
    admin_console_config_loaded(nc != NULL, err, clock_us() - t0);
    if (nc == NULL) {
        log_error("main: reload failed, keeping the running config: %s", err);
        free(err);
        metrics_count(METRICS_RELOADS_FAILED);
        return;
    }
    if (!listens_same(nc, ms->conf) || nc->workers != ms->conf->workers)
        log_warn("main: reload: listen and workers changes apply after a restart; "
                 "still %s with %d workers", ms->conf->listen.text, ms->conf->workers);
    fit_connections(nc, ms->n, ms->admin != NULL);
    runtime_bind_metrics(nc);
    for (int i = 0; i < ms->n; i++)
        worker_reload(ms->workers[i], nc);
    admin_reload(ms->admin, nc);
    admin_api_set(nc, ms->mem);
    ms->resetbus = resetbus_reload(ms->resetbus, nc);
    resetbus_bump();                /* config overrides may have changed */
    conf_release(ms->conf);
    ms->conf = nc;
    metrics_count(METRICS_RELOADS_OK);
    log_info("main: reloaded '%s'", ms->file);
}

static void reopen_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct main_state *ms = arg;
    if (ms->alog) {
        accesslog_reopen(ms->alog);
        log_info("main: SIGUSR1, reopening the access log");
    }
}

/* The start-up line names every listener ("a, b (tls)"), not the first. */
static void log_listening(const struct conf *conf, int workers)
{
    size_t cap = 1;
    for (int i = 0; i < conf->nlistens; i++)
        cap += strlen(conf->listens[i].addr.text) + sizeof(", (tls) (decision)");
    char *all = mem_alloc(cap), *p = all;
    for (int i = 0; i < conf->nlistens; i++)
        p += sprintf(p, "%s%s%s%s", i ? ", " : "", conf->listens[i].addr.text,
                     conf->listens[i].tls ? " (tls)" : "",
                     conf->listens[i].decision ? " (decision)" : "");
    *p = '\0';
    log_info("main: sluice %s listening on %s with %d worker%s", SLUICE_VERSION, all,
             workers, workers == 1 ? "" : "s");
    free(all);
}

static int serve(struct main_state *ms)
{
    struct conf *conf = ms->conf;
    struct worker **workers = mem_calloc((size_t)conf->workers, sizeof(*workers));
    struct event_base *base = event_base_new();
    struct event *sigs[4] = { NULL, NULL, NULL, NULL };
    int n = 0, rc = 1;

    ms->workers = workers;
    ms->base = base;
    /* Before anything listens: a SIGTERM as soon as a port answers is a
     * graceful stop (handled once the loop runs), not the default death. */
    sigs[0] = evsignal_new(base, SIGTERM, stop_signal_cb, ms);
    sigs[1] = evsignal_new(base, SIGINT, stop_signal_cb, ms);
    sigs[2] = evsignal_new(base, SIGHUP, reload_signal_cb, ms);
    sigs[3] = evsignal_new(base, SIGUSR1, reopen_signal_cb, ms);
    for (int i = 0; i < 4; i++)
        evsignal_add(sigs[i], NULL);

    /* Every worker binds each address with SO_REUSEPORT, which another
     * process of the same user could share unnoticed: first make sure no
     * one listens there, and serve nothing if someone does. */
    for (int i = 0; i < conf->nlistens; i++) {
        const struct conf_addr *a = &conf->listens[i].addr;
        if (listener_check_free((const struct sockaddr *)&a->ss, a->sslen) != 0) {
            log_error("main: cannot listen on '%s': %s", a->text, errno == EADDRINUSE ?
                      "address in use (another process listens there)" : strerror(errno));
            goto out;
        }
    }
    for (; n < conf->workers; n++) {
        workers[n] = worker_create(n, conf, ms->mem, ms->alog);
        if (workers[n] == NULL)
            goto out;
    }
    ms->n = n;
    admin_api_set(conf, ms->mem);
    ms->resetbus = resetbus_start(conf);
    if (conf->has_admin) {
        ms->admin = admin_start(conf);
        if (ms->admin == NULL)
            goto out;
    }
    for (int i = 0; i < n; i++)
        if (worker_start(workers[i]) != 0) {
            log_error("main: cannot start worker %d", i);
            for (int j = 0; j < i; j++) {
                worker_stop(workers[j], 0);
                worker_join(workers[j]);
            }
            goto out;
        }
    log_listening(conf, n);
    event_base_dispatch(base);
    for (int i = 0; i < n; i++)
        worker_stop(workers[i], ms->conf->shutdown_timeout_ms);
    for (int i = 0; i < n; i++)
        worker_join(workers[i]);
    rc = 0;
out:
    admin_stop(ms->admin);
    resetbus_stop(ms->resetbus);
    admin_api_set(NULL, NULL);
    for (int i = 0; i < n; i++)
        worker_destroy(workers[i]);
    for (int i = 0; i < 4; i++)
        if (sigs[i])
            event_free(sigs[i]);
    event_base_free(base);
    free(workers);
    return rc;
}

int main(int argc, char **argv)
{
    const char *file = NULL;
    int test_only = 0, opt;

    while ((opt = getopt(argc, argv, "c:tVh")) != -1) {
        switch (opt) {
        case 'c': file = optarg; break;
        case 't': test_only = 1; break;
        case 'V': printf("sluice %s\n", SLUICE_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 1;
        }
    }
    if (file == NULL || optind != argc) {
        usage(stderr);
        return 1;
    }

    char *err = NULL;
    conf_check_names(test_only);
    int64_t t0 = clock_us();
    struct conf *conf = confcheck_load(file, &err);
    admin_console_config_loaded(conf != NULL, err, clock_us() - t0);
    if (conf == NULL) {
        fprintf(stderr, "%s\n", err);
        free(err);
        return 1;
    }
    if (test_only) {
        printf("%s: configuration ok\n", file);
        conf_release(conf);
        return 0;
    }

    signal(SIGPIPE, SIG_IGN);
    mem_pool_install();
    evthread_use_pthreads();
    fit_connections(conf, conf->workers, conf->has_admin);
    runtime_bind_metrics(conf);
    struct main_state ms = { .file = file, .conf = conf };
    /* The in-process limiter outlives reloads, so its counts do too, and a
     * reload may switch to it: it always exists (empty costs little). The
     * access log's target is fixed until a restart. */
    ms.mem = memstore_create(conf->memory_max_keys);
    if (conf->access_log) {
        ms.alog = accesslog_open(conf->access_log, &err);
        if (ms.alog == NULL) {
            fprintf(stderr, "%s\n", err);
            free(err);
            memstore_destroy(ms.mem);
            conf_release(conf);
            return 1;
        }
    }
    int rc = serve(&ms);
    accesslog_close(ms.alog);       /* every worker has been joined */
    memstore_destroy(ms.mem);
    conf_release(ms.conf);
    metrics_shutdown();
    admin_console_shutdown();
    libevent_global_shutdown();
    mem_pool_drain();
    return rc;
}
