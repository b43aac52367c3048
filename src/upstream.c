/* sluice - upstream.c: per-worker pools of upstream connections.
 *
 * Connections are made with non-blocking connects; the connect timeout is
 * the bufferevent's write timeout until the connection is up. Idle
 * connections are watched for reads: any byte or EOF from an idle server
 * means the connection is no longer usable, so it is closed. An upstream
 * with tls gets TLS bufferevents over SSL objects from its context
 * (tls_upstream.h): the exchange reads and writes them as plain ones; the
 * connect timeout bounds the TCP connect and the handshake together. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "tls_upstream.h"
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
    struct tls_upstream *tls;       /* cu->tls: its context; NULL: plain */
};

struct upstream_pool *upstream_pool_create(struct event_base *base,
                                           const struct conf_upstream *cu)
{
    struct upstream_pool *p = mem_calloc(1, sizeof(*p));
    p->base = base;
    p->cu = cu;
    if (cu->tls) {
        char err[512];
        p->tls = tls_upstream_create(cu, err, sizeof(err));
        if (p->tls == NULL)     /* conf_load read the files: they changed since */
            log_error("upstream: TLS context failed '%s': %s (its requests get 502)",
                      cu->name, err);
    }
    return p;
}

const struct conf_upstream *upstream_conf(const struct upstream_pool *p)
{
    return p->cu;
}

/* A TLS connection that was up ends with our close_notify (best effort,
 * the socket is non-blocking): OpenSSL takes a session whose connection
 * ends without one for a cut connection, and will not resume it. After a
 * fatal error this sends nothing, and that session is dropped as it should. */
static void tls_close(struct upstream_conn *uc)
{
    SSL *ssl = bufferevent_openssl_get_ssl(uc->bev);
    if (ssl && uc->connected)
        SSL_shutdown(ssl);
    ERR_clear_error();
}

static void conn_free(struct upstream_conn *uc)
{
    metrics_gauge_add(METRICS_CONN_UPSTREAM, -1);
    if (uc->tls)
        tls_close(uc);
    if (uc->hs_timer)
        event_free(uc->hs_timer);
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
    tls_upstream_destroy(p->tls);   /* after the last SSL made from it */
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

/* The handshake of a TLS connection took connect_timeout: the borrower
 * hears a timeout, as from a connect that took too long. */
static void hs_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_conn *uc = arg;
    bufferevent_trigger_event(uc->bev, BEV_EVENT_TIMEOUT, 0);
}

/* A TLS bufferevent for server, not yet connected; NULL on failure. */
static struct bufferevent *tls_bev_new(struct upstream_pool *p, int server)
{
    if (p->tls == NULL)
        return NULL;
    SSL *ssl = tls_upstream_ssl(p->tls, server);
    if (ssl == NULL)
        return NULL;
    struct bufferevent *bev = bufferevent_openssl_socket_new(p->base, -1, ssl,
                                                             BUFFEREVENT_SSL_CONNECTING,
                                                             BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL) {
        SSL_free(ssl);
        return NULL;
    }
    /* The server's close without close_notify ends the stream as over TCP
     * (the ctx ignores an unexpected EOF too). */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

static struct upstream_conn *conn_new(struct upstream_pool *p)
{
    const struct conf_upstream *cu = p->cu;
    int server = (int)(p->next_server++ % (unsigned)cu->nservers);
    const struct conf_addr *a = &cu->servers[server];

    struct bufferevent *bev = cu->tls ? tls_bev_new(p, server)
                                      : bufferevent_socket_new(p->base, -1, BEV_OPT_CLOSE_ON_FREE);
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
    if (cu->tls) {
        uc->tls = 1;
        uc->hs_timer = evtimer_new(p->base, hs_timeout_cb, uc);
        if (uc->hs_timer == NULL)
            abort();    /* only on allocation failure */
        evtimer_add(uc->hs_timer, &tv);
    }
    return uc;
}

void upstream_connected(struct upstream_conn *uc)
{
    uc->connected = 1;
    if (uc->hs_timer) {
        event_free(uc->hs_timer);
        uc->hs_timer = NULL;
        metrics_upstream_tls_handshake(SSL_session_reused(bufferevent_openssl_get_ssl(uc->bev)));
    }
}

/* A TLS connection that was up failed: when OpenSSL says why (a TLS 1.3
 * server refusing our certificate after the handshake, a bad record), log
 * it and count it as an error. */
static int tls_error_after_handshake(struct upstream_conn *uc)
{
    unsigned long e, last = 0;
    while ((e = bufferevent_get_openssl_error(uc->bev)) != 0)
        if (ERR_GET_LIB(e) != 0)    /* not libevent's SSL_get_error code */
            last = e;
    if (last == 0 || ERR_SYSTEM_ERROR(last) ||
        ERR_GET_REASON(last) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        return 0;
    const struct conf_upstream *cu = uc->pool->cu;
    const char *why = ERR_reason_error_string(last);
    log_warn("upstream: TLS failed '%s' (upstream %s): %s", cu->servers[uc->server].text,
             cu->name, why ? why : "TLS protocol error");
    metrics_upstream_tls_failure(cu->name, tls_upstream_reason_name(TLS_UPSTREAM_ERROR));
    return 1;
}

int upstream_tls_failed(struct upstream_conn *uc, short what)
{
    if (!uc->tls)
        return 0;
    if (uc->connected)
        return (what & BEV_EVENT_TIMEOUT) ? 0 : tls_error_after_handshake(uc);
    const struct conf_upstream *cu = uc->pool->cu;
    const char *server = cu->servers[uc->server].text;
    enum tls_upstream_reason r;
    char why[256];
    SSL *ssl = bufferevent_openssl_get_ssl(uc->bev);
    if (what & BEV_EVENT_TIMEOUT) {
        BIO *w = SSL_get_wbio(ssl);
        if (w == NULL || BIO_number_written(w) == 0)
            return 0;           /* the TCP connect timed out */
        r = TLS_UPSTREAM_TIMEOUT;
        snprintf(why, sizeof(why), "not done within connect_timeout (%lld ms)",
                 (long long)cu->connect_timeout_ms);
    } else {
        unsigned long errs[8];
        int n = 0;
        unsigned long e;
        while ((e = bufferevent_get_openssl_error(uc->bev)) != 0)
            if (n < 8)
                errs[n++] = e;
        r = tls_upstream_why(ssl, errs, n, why, sizeof(why));
        if (r == TLS_UPSTREAM_NONE)
            return 0;
    }
    log_warn("upstream: TLS handshake failed '%s' (upstream %s): %s", server, cu->name, why);
    metrics_upstream_tls_failure(cu->name, tls_upstream_reason_name(r));
    return 1;
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
