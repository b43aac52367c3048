/* sluice - upstream.c: per-worker pools of upstream connections.
 *
 * Connections are made with non-blocking connects (io_connect); the
 * connect timeout bounds the TCP connect and a TLS handshake together. Idle
 * connections are watched for reads: any byte or EOF from an idle server
 * means the connection is no longer usable, so it is closed. An upstream
 * with tls gets ios over SSL objects from its context (tls_upstream.h):
 * the exchange reads and writes them as plain ones. An upstream with
 * protocol h2 hands out streams of its h2_client's sessions instead
 * (h2_client.h): also ios, which the exchange uses the same way.
 *
 * Churn: `keepalive` idle connections are kept; one returned above that is
 * closed at once, as nginx does, until the pool closes one and then has
 * to connect anew within CHURN_MS because none was idle. From then on, for
 * CHURN_HOLD_MS after the last such reconnect, up to `keepalive` more idle
 * connections (a burst's) are kept, each closed once idle CHURN_MS
 * (HAProxy's pools purge their idle surplus the same way, later): bursts
 * of requests above the pool reuse their connections instead of closing
 * and reconnecting them (on Linux each close leaves a TIME_WAIT socket on
 * a local port). */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"
#include "h2_client.h"
#include "io.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "tls_upstream.h"
#include "upstream.h"

#define CHURN_MS 1000              /* a close then a connect this close: churn;
                                 * and how long a surplus connection idles */
#define CHURN_HOLD_MS 5000         /* surplus kept this long after churn */

struct upstream_pool {
    struct event_base *base;
    const struct conf_upstream *cu;
    struct upstream_conn *idle;     /* newest first */
    int nidle;
    int64_t closed_ms;              /* the last close above keepalive (0: none) */
    int64_t churn_until_ms;         /* surplus kept until then */
    struct event *purge;            /* closes surplus idle CHURN_MS (lazy) */
    unsigned next_server;           /* round robin */
    int borrowed;                   /* connections handed out */
    int retired;                    /* drained: returned connections close */
    int orphaned;                   /* destroyed: free when all return */
    struct tls_upstream *tls;       /* cu->tls: its context; NULL: plain */
    struct h2_client *h2;           /* cu->h2: its sessions; NULL: HTTP/1.1 */
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
    if (cu->h2)
        p->h2 = h2_client_create(base, cu, p->tls);
    return p;
}

const struct conf_upstream *upstream_conf(const struct upstream_pool *p)
{
    return p->cu;
}

static void conn_free(struct upstream_conn *uc)
{
    if (!uc->h2)                /* h2: the session counts its connection */
        metrics_gauge_add(METRICS_CONN_UPSTREAM, -1);
    io_free(uc->io);            /* with our close_notify on TLS: a session
                                 * ended without one is not resumed */
    http1_destroy(uc->parser);
    free(uc);
}

static void pool_free(struct upstream_pool *p)
{
    if (p->purge)
        event_free(p->purge);
    while (p->idle) {
        struct upstream_conn *uc = p->idle;
        p->idle = uc->next;
        conn_free(uc);
    }
    h2_client_destroy(p->h2);
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
    if (p->h2)
        h2_client_drain(p->h2);
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

/* Close idle connections above keepalive that idled CHURN_MS (the list is
 * newest first: the oldest are past its first keepalive); again later while
 * a younger surplus stays. */
static void purge_cb(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_pool *p = arg;
    int64_t now = clock_ms(), next = 0;
    int i = 0;
    struct upstream_conn **pp = &p->idle;
    while (*pp) {
        struct upstream_conn *uc = *pp;
        if (i++ < p->cu->keepalive) {
            pp = &uc->next;
        } else if (now - uc->idle_ms >= CHURN_MS) {
            *pp = uc->next;
            p->nidle--;
            conn_free(uc);
        } else {
            if (next == 0 || uc->idle_ms + CHURN_MS < next)
                next = uc->idle_ms + CHURN_MS;
            pp = &uc->next;
        }
    }
    if (next) {
        struct timeval tv = clock_timeval(next - now);
        event_add(p->purge, &tv);
    }
}

/* A connection returned above keepalive: kept (1) while the pool churns,
 * up to keepalive more. */
static int keep_surplus(struct upstream_pool *p)
{
    int64_t now = clock_ms();
    if (now >= p->churn_until_ms || p->nidle >= 2 * p->cu->keepalive) {
        p->closed_ms = now;
        return 0;
    }
    if (p->purge == NULL)
        p->purge = evtimer_new(p->base, purge_cb, p);
    if (!evtimer_pending(p->purge, NULL)) {
        struct timeval tv = clock_timeval(CHURN_MS);
        evtimer_add(p->purge, &tv);
    }
    return 1;
}

/* An idle connection heard from its server: a close, or bytes nobody asked
 * for. Either way it cannot carry another request. */
static void idle_read_cb(struct io *io, void *arg)
{
    struct upstream_conn *uc = arg;
    idle_unlink(uc);
    conn_free(uc);
}

static void idle_event_cb(struct io *io, short what, void *arg)
{
    idle_read_cb(io, arg);
}

static struct upstream_conn *conn_new(struct upstream_pool *p)
{
    const struct conf_upstream *cu = p->cu;
    int server = (int)(p->next_server++ % (unsigned)cu->nservers);
    const struct conf_addr *a = &cu->servers[server];

    SSL *ssl = NULL;
    if (cu->tls && (p->tls == NULL || (ssl = tls_upstream_ssl(p->tls, server)) == NULL))
        return NULL;
    struct io *io = io_new(p->base, -1, ssl);
    if (io_connect(io, (const struct sockaddr *)&a->ss, (socklen_t)a->sslen,
                   cu->connect_timeout_ms) < 0) {
        log_warn("upstream: connect '%s' failed at once", a->text);
        io_free(io);
        return NULL;
    }
    int one = 1;
    setsockopt(io_fd(io), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    struct upstream_conn *uc = mem_calloc(1, sizeof(*uc));
    metrics_gauge_add(METRICS_CONN_UPSTREAM, 1);
    uc->pool = p;
    uc->io = io;
    uc->server = server;
    uc->parser = http1_create(HTTP1_RESPONSE);
    uc->tls = cu->tls != NULL;
    return uc;
}

void upstream_connected(struct upstream_conn *uc)
{
    if (uc->tls && !uc->connected)
        metrics_upstream_tls_handshake(SSL_session_reused(io_ssl(uc->io)));
    uc->connected = 1;
}

/* A TLS connection that was up failed: when OpenSSL says why (a TLS 1.3
 * server refusing our certificate after the handshake, a bad record), log
 * it and count it as an error. */
static int tls_error_after_handshake(struct upstream_conn *uc)
{
    unsigned long e, last = 0;
    while ((e = io_ssl_error(uc->io)) != 0)
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
        return (what & IO_TIMEOUT) ? 0 : tls_error_after_handshake(uc);
    const struct conf_upstream *cu = uc->pool->cu;
    const char *server = cu->servers[uc->server].text;
    enum tls_upstream_reason r;
    char why[256];
    SSL *ssl = io_ssl(uc->io);
    if (what & IO_TIMEOUT) {
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
        while ((e = io_ssl_error(uc->io)) != 0)
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

/* A stream of an h2 session, connected as far as the exchange can tell:
 * the session connects under it. */
static struct upstream_conn *stream_new(struct upstream_pool *p, int fresh)
{
    struct upstream_conn *uc = mem_calloc(1, sizeof(*uc));
    uc->io = h2_client_stream(p->h2, fresh, &uc->server, &uc->unprocessed);
    if (uc->io == NULL) {
        free(uc);
        return NULL;
    }
    uc->pool = p;
    uc->h2 = 1;
    uc->connected = 1;
    uc->parser = http1_create(HTTP1_RESPONSE);
    return uc;
}

struct upstream_conn *upstream_acquire(struct upstream_pool *p, int fresh)
{
    if (p->h2) {
        struct upstream_conn *uc = stream_new(p, fresh);
        if (uc)
            p->borrowed++;
        return uc;
    }
    if (!fresh && p->idle) {
        struct upstream_conn *uc = p->idle;
        p->idle = uc->next;
        p->nidle--;
        uc->next = NULL;
        uc->reused = 1;
        uc->connected = 1;
        p->borrowed++;
        io_setcb(uc->io, NULL, NULL, NULL, NULL);
        return uc;
    }
    struct upstream_conn *uc = conn_new(p);
    if (uc == NULL)
        return NULL;
    p->borrowed++;
    if (!fresh && p->closed_ms != 0) {  /* none idle: closed too soon? */
        int64_t now = clock_ms();
        if (now - p->closed_ms < CHURN_MS)
            p->churn_until_ms = now + CHURN_HOLD_MS;
    }
    return uc;
}

void upstream_release(struct upstream_conn *uc)
{
    struct upstream_pool *p = uc->pool;
    if (uc->h2 || p->retired || p->cu->keepalive == 0 ||
        evbuffer_get_length(io_input(uc->io)) != 0 ||
        (p->nidle >= p->cu->keepalive && !keep_surplus(p))) {
        conn_free(uc);
        pool_returned(p);
        return;
    }
    p->borrowed--;
    /* No timeout while idle: the server decides when to drop it, and we
     * notice through the read callback. */
    io_set_timeouts(uc->io, NULL, NULL);
    io_setcb(uc->io, idle_read_cb, NULL, idle_event_cb, uc);
    io_enable(uc->io, EV_READ);
    uc->idle_ms = clock_ms();
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
