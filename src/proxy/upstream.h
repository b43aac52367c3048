/* sluice - upstream.h: connections to the servers of one upstream.
 *
 * One pool per upstream per worker (never shared between threads). A pool
 * hands out a connection, idle or freshly connecting, round robin over the
 * servers, and takes it back when the exchange left it clean. While a
 * connection is handed out its io callbacks belong to the borrower;
 * while idle the pool watches it and frees it if the server closes it.
 * The response parser lives here, not in the client, because there are far
 * fewer upstream connections than idle clients. */
#ifndef SLUICE_UPSTREAM_H
#define SLUICE_UPSTREAM_H

#include "conf.h"
#include "http1.h"

struct event_base;
struct event;
struct io;
struct upstream_pool;

struct upstream_conn {
    struct upstream_pool *pool;
    struct io *io;                  /* plain or TLS (io.h) */
    struct upstream_conn *next;     /* idle list */
    int64_t idle_ms;                /* idle since (clock_ms) */
    int server;                     /* index into the upstream's servers */
    int reused;                     /* came from the idle list */
    int connected;                  /* the connect completed */
    struct http1 *parser;           /* response framing */
    struct http1_head head;         /* the response being read */
    int tls;                        /* io is over TLS (tls_upstream.h) */
    int h2;                         /* io is a stream of an h2 session
                                     * (h2_client.h); its session keeps
                                     * the connection */
    int unprocessed;                /* h2: the server did not process the
                                     * request (refused, above a GOAWAY): it
                                     * may go again */
};

struct upstream_pool *upstream_pool_create(struct event_base *base,
                                           const struct conf_upstream *cu);
/* Free the pool; with connections still handed out it is retired instead. */
void upstream_pool_destroy(struct upstream_pool *p);
/* The config that made the pool was replaced: close idle connections, stop
 * keeping returned ones, and free the pool when the last one comes back. The
 * pool's conf_upstream must stay valid until then (the borrowers' requests
 * hold a reference to their config). */
void upstream_pool_retire(struct upstream_pool *p);
/* The config that made the pool was replaced but its owner (a runtime)
 * keeps it until its requests end: close idle connections and stop keeping
 * returned ones; upstream_pool_destroy() frees it later. */
void upstream_pool_drain(struct upstream_pool *p);

/* An idle connection, or a new one whose connect is under way (fresh: never
 * an idle one). The borrower sets the callbacks. NULL when no socket could be
 * made. */
struct upstream_conn *upstream_acquire(struct upstream_pool *p, int fresh);

/* Give a connection back after a clean exchange: kept idle if the pool has
 * room (keepalive; more for a while when it churns: upstream.c), closed
 * otherwise (an h2 stream ends; its session stays). */
void upstream_release(struct upstream_conn *uc);

/* Close a connection that cannot be reused. */
void upstream_close(struct upstream_conn *uc);

const struct conf_upstream *upstream_conf(const struct upstream_pool *p);

/* The borrower's event callback saw IO_CONNECTED (after the TLS
 * handshake on a TLS connection): the connection is up. */
void upstream_connected(struct upstream_conn *uc);
/* The borrower's event callback saw a failure (what): when TLS says why
 * (the handshake failed; or, on a connection that was up, OpenSSL has an
 * error), log it, count it and return 1; 0 when it was not TLS's doing (a
 * plain connection, a refused connect, a close, a timeout). A handshake not
 * done within connect_timeout comes as IO_TIMEOUT. */
int upstream_tls_failed(struct upstream_conn *uc, short what);

#endif
