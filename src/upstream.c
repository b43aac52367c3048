/* sluice - upstream.c: per-worker pools of upstream connections.
 *
 * Connections are made with non-blocking connects; the connect timeout is
 * the bufferevent's write timeout until the connection is up. Idle
 * connections are watched for reads: any byte or EOF from an idle server
 * means the connection is no longer usable, so it is closed. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "upstream.h"

struct upstream_pool {
    struct event_base *base;
    const struct conf_upstream *cu;
    struct upstream_conn *idle;
    int nidle;
    unsigned next_server;           /* round robin */
    int borrowed;                   /* connections handed out */
    int retired;                    /* drained: returned connections close */
    int orphaned;                   /* destroyed: free when all return */
};

struct upstream_pool *upstream_pool_create(struct event_base *base,
                                           const struct conf_upstream *cu)
{
    struct upstream_pool *p = mem_calloc(1, sizeof(*p));
    p->base = base;
    p->cu = cu;
    return p;
}

const struct conf_upstream *upstream_conf(const struct upstream_pool *p)
{
    return p->cu;
}

static void conn_free(struct upstream_conn *uc)
{
    metrics_gauge_add(METRICS_CONN_UPSTREAM, -1);
    bufferevent_free(uc->bev);
    http1_destroy(uc->parser);
    free(uc);
}

static void pool_free(struct upstream_pool *p)
{
    while (p->idle) {
        struct upstream_conn *uc = p->idle;
        p->idle = uc->next;
        conn_free(uc);
    }
    free(p);
}

void upstream_pool_destroy(struct upstream_pool *p)
{
    if (p == NULL)
        return;
    if (p->borrowed > 0) {      /* requests still hold connections */
        upstream_pool_retire(p);
        return;
    }
    pool_free(p);
}

void upstream_pool_drain(struct upstream_pool *p)
{
    p->retired = 1;
    while (p->idle) {
        struct upstream_conn *uc = p->idle;
        p->idle = uc->next;
        p->nidle--;
        conn_free(uc);
    }
}

void upstream_pool_retire(struct upstream_pool *p)
{
    upstream_pool_drain(p);
    if (p->borrowed == 0)
        pool_free(p);
    else
        p->orphaned = 1;
}

/* A borrowed connection came back (kept or closed). */
static void pool_returned(struct upstream_pool *p)
{
    p->borrowed--;
    if (p->orphaned && p->borrowed == 0)
        pool_free(p);
}

static void idle_unlink(struct upstream_conn *uc)
{
    struct upstream_pool *p = uc->pool;
    for (struct upstream_conn **pp = &p->idle; *pp; pp = &(*pp)->next)
        if (*pp == uc) {
            *pp = uc->next;
            p->nidle--;
            return;
        }
}

/* An idle connection heard from its server: a close, or bytes nobody asked
 * for. Either way it cannot carry another request. */
static void idle_read_cb(struct bufferevent *bev, void *arg)
{
    struct upstream_conn *uc = arg;
    idle_unlink(uc);
    conn_free(uc);
}

static void idle_event_cb(struct bufferevent *bev, short what, void *arg)
{
    idle_read_cb(bev, arg);
}

static struct upstream_conn *conn_new(struct upstream_pool *p)
{
    const struct conf_upstream *cu = p->cu;
    int server = (int)(p->next_server++ % (unsigned)cu->nservers);
    const struct conf_addr *a = &cu->servers[server];

    struct bufferevent *bev = bufferevent_socket_new(p->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL;
    struct timeval tv = clock_timeval(cu->connect_timeout_ms);
    bufferevent_set_timeouts(bev, NULL, &tv);
    if (bufferevent_socket_connect(bev, (const struct sockaddr *)&a->ss, (int)a->sslen) < 0) {
        log_warn("upstream: connect '%s' failed at once", a->text);
        bufferevent_free(bev);
        return NULL;
    }
    int one = 1;
    setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    struct upstream_conn *uc = mem_calloc(1, sizeof(*uc));
    metrics_gauge_add(METRICS_CONN_UPSTREAM, 1);
    uc->pool = p;
    uc->bev = bev;
    uc->server = server;
    uc->parser = http1_create(HTTP1_RESPONSE);
    return uc;
}

struct upstream_conn *upstream_acquire(struct upstream_pool *p, int fresh)
{
    if (!fresh && p->idle) {
        struct upstream_conn *uc = p->idle;
        p->idle = uc->next;
        p->nidle--;
        uc->next = NULL;
        uc->reused = 1;
        uc->connected = 1;
        p->borrowed++;
        bufferevent_setcb(uc->bev, NULL, NULL, NULL, NULL);
        return uc;
    }
    struct upstream_conn *uc = conn_new(p);
    if (uc)
        p->borrowed++;
    return uc;
}

void upstream_release(struct upstream_conn *uc)
{
    struct upstream_pool *p = uc->pool;
    if (p->retired || p->nidle >= p->cu->keepalive ||
        evbuffer_get_length(bufferevent_get_input(uc->bev)) != 0) {
        conn_free(uc);
        pool_returned(p);
        return;
    }
    p->borrowed--;
    /* No timeout while idle: the server decides when to drop it, and we
     * notice through the read callback. */
    bufferevent_set_timeouts(uc->bev, NULL, NULL);
    bufferevent_setcb(uc->bev, idle_read_cb, NULL, idle_event_cb, uc);
    bufferevent_enable(uc->bev, EV_READ);
    uc->next = p->idle;
    p->idle = uc;
    p->nidle++;
}

void upstream_close(struct upstream_conn *uc)
{
    struct upstream_pool *p = uc->pool;
    conn_free(uc);
    pool_returned(p);
}
