/* sluice - conn.h: one downstream connection's state, and the services
 * request.c and exchange.c use on it.
 *
 * struct client is made by client.c (client_accept), which owns its
 * lifetime: callbacks never free it, they mark it dead (conn_kill) and the
 * outermost one frees it when the stack unwinds (conn_enter/leave). What a
 * lower layer must tell client.c (the request is done, more input may be
 * processed, the connection is freed) goes through the ops it set, never a
 * call upward. The request in progress is *c->rq (request.h). */
#ifndef SLUICE_CONN_H
#define SLUICE_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "http1.h"
#include "list.h"
#include "route.h"

struct evbuffer;
struct io;
struct event;
struct event_base;
struct request;
struct conf;
struct runtime;
struct backend;
struct denycache;
struct accesslog;
struct client;

/* Output above this stops reading the other side until it drains: what a
 * peer that does not read holds in sluice, per direction (about nginx's
 * proxy_buffers), plus at most one read or one decoded run. */
#define CONN_HIGH_WATER   (64 * 1024)
#define CONN_COPY_SLICE   2048          /* see conn_copy() */

enum client_state {
    CS_HEAD,        /* waiting for a request head */
    CS_DECIDE,      /* waiting for the store */
    CS_BUFFER,      /* allowed: reading a small body whole before going upstream */
    CS_PROXY,       /* forwarded: request body and response streaming */
    CS_DISCARD,     /* answered locally, dropping the request body */
    CS_TUNNEL,      /* after a 101: bytes pass both ways untouched */
    CS_CLOSING,     /* flushing the last response, then free */
    CS_H2,          /* an HTTP/2 connection: c->h2 serves it, each stream
                     * a client of its own (h2srv.h) */
};

enum timer_mode { TM_NONE, TM_IDLE, TM_HEADER, TM_BODY, TM_HANDSHAKE };

/* What a worker lends its connections (embedded in struct worker, written
 * only on the worker's thread): its loop, its client set, the runtime new
 * requests start with, and its own parts of the request path. */
struct conn_env {
    int id;                             /* the worker's */
    struct event_base *base;
    struct list clients;                /* all open client connections */
    int nclients;
    int stopping;                       /* draining: no accepts, no keep-alive */
    struct conf *conf;                  /* rt->conf; clients retain it */
    struct runtime *rt;                 /* current; requests retain their own */
    struct backend *local;              /* memory over mem, for on_error: local */
    struct denycache *deny;             /* keys Redis denied, until when */
    struct jwtcache *jwt;               /* tokens this worker verified */
    struct accesslog *alog;             /* shared; not owned; NULL when off */
    uint64_t rng[2];                    /* xorshift128+ state, for request ids */
    struct request *spares;             /* requests idle connections gave back */
    int nspares;                        /* at most REQUEST_SPARES_MAX (request.h) */
};

/* Set by client.c; each is called from inside a callback of c (busy). */
struct conn_ops {
    void (*process)(struct client *c);      /* do what the bytes in hand allow */
    void (*request_done)(struct client *c); /* answered, body read: next or close */
    void (*log_end)(struct client *c);      /* the request ends now: log it */
    void (*cancel)(struct client *c);       /* drop the decision in flight */
    void (*up_resumed)(struct client *c);   /* our output drained: move more */
    void (*free)(struct client *c);         /* busy dropped to 0 while dead */
};

struct client {
    const struct conn_ops *ops;
    struct conn_env *env;
    struct list_link link;              /* on env's list */
    struct conf *conf;                  /* retained */
    struct io *io;                      /* the socket, plain or TLS (io.h) */
    struct sockaddr_storage peer;
    char peer_text[ROUTE_IP_MAX];       /* the peer's address, as keys use it */
    size_t peer_len;
    struct http1 *parser;
    struct event *timer;
    enum timer_mode timer_mode;
    int64_t timer_due_ms;               /* clock_ms() when timer_mode's time is up */
    int64_t timer_fires_ms;             /* when the pending timer fires; 0: none */
    enum client_state state;
    int busy;                           /* callbacks on the stack */
    int dead;                           /* free when busy drops to 0 */
    int eof;                            /* client closed its sending side */
    int input_bounded;                  /* CS_DECIDE: reading stopped (client.c) */
    int tls;                            /* a TLS listener's (tls_server.h) */
    int decision;                       /* a decision listener's: requests are
                                         * decided and answered, never forwarded
                                         * (request.c, decision.c) */
    int handshaking;                    /* TLS handshake not done yet */
    const char *tls_version;            /* "TLSv1.3" once done; "" when plain */
    int http2;                          /* its listener takes HTTP/2 */
    int first_bytes;                    /* the preface check is still to do */
    int h2_stream;                      /* an HTTP/2 stream's (its io is one) */
    int h2_refused;                     /* its header list was not a request:
                                         * the status to answer (client.c) */
    struct h2srv *h2;                   /* CS_H2: the session; owns io */

    /* The request in progress: its state is *rq (request_state.h), its
     * upstream connection included. What stays here is the two sides'
     * backpressure, which conn_flush reaches also while idle (rq NULL), and
     * buffers reused across requests. */
    struct request *rq;                 /* what the request computed; owned; NULL
                                         * while idle (request_get/put) */
    int keep_alive;                     /* connection stays open afterwards */
    int client_paused;                  /* reading stopped: upstream full */
    int up_paused;                      /* upstream reading stopped: client full */
    int heads_paused;                   /* pipelined heads wait: our output is full */
    struct evbuffer *body;              /* CS_BUFFER: the payload read so far;
                                         * otherwise scratch for re-framing,
                                         * empty between calls (lazy) */
    struct evbuffer *held;              /* CS_BUFFER: the head, out of the input */
    struct evbuffer *tail;              /* cost_from: a response's last bytes, held
                                         * until its settlement is applied */
    struct evbuffer *trailers;          /* CS_PROXY: the response's framing since
                                         * its last payload byte, its trailers at
                                         * the end (lazy) */
};

void conn_enter(struct client *c);
int conn_leave(struct client *c);       /* 1: freed */
void conn_kill(struct client *c);
void conn_timer(struct client *c, enum timer_mode mode, int64_t ms);
/* At the top of the timer's callback: 0 when it fired early (re-armed) or
 * for nothing (TM_NONE), 1 when timer_mode's time is up. */
int conn_timer_due(struct client *c);
/* Stop reading requests and close once what is queued has been written. */
void conn_close_after_write(struct client *c);
void conn_flush(struct client *c);

/* Feed one contiguous run of src's body bytes to parser p; the payload goes
 * to dst (NULL: dropped). Returns 1 when the message is complete, 0 to wait
 * for more, 2 when there may be more to do, -1 on a framing error. *payload
 * gets the payload bytes moved. */
void conn_copy(struct evbuffer *dst, const char *data, size_t len);
int conn_pump_once(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                   size_t *payload);
/* conn_pump_once() that keeps in tail the framing read after the last
 * payload byte (dropped when payload comes): at the message's end, a
 * chunked body's last chunk and trailer section, as http1.c checked them. */
int conn_pump_tail(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                   struct evbuffer *tail, size_t *payload);

#endif
