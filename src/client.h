/* sluice - client.h: one downstream connection.
 *
 * A client is created for each accepted socket (client_accept) and owned by
 * its worker's client set; it frees itself when the connection ends:
 * callbacks never free it directly, they mark it dead (client_kill) and the
 * outermost one frees it when the stack unwinds (client_enter/leave).
 * client.c owns accept, the timers (header, body, discard, idle),
 * pipelining, backpressure and write coalescing; the request in progress is
 * c->rq and its way is request.c's, its upstream exchange exchange.c's. */
#ifndef SLUICE_CLIENT_H
#define SLUICE_CLIENT_H

#include <stdint.h>
#include <sys/socket.h>
#include "http1.h"
#include "request.h"

struct worker;
struct bufferevent;
struct evbuffer;
struct event;
struct upstream_conn;

/* Output above this stops reading the other side until it drains: what a
 * peer that does not read holds in sluice, per direction (about nginx's
 * proxy_buffers), plus at most one read or one decoded run. */
#define CLIENT_HIGH_WATER   (64 * 1024)

enum client_state {
    CS_HEAD,        /* waiting for a request head */
    CS_DECIDE,      /* waiting for the store */
    CS_BUFFER,      /* allowed: reading a small body whole before going upstream */
    CS_PROXY,       /* forwarded: request body and response streaming */
    CS_DISCARD,     /* answered locally, dropping the request body */
    CS_TUNNEL,      /* after a 101: bytes pass both ways untouched */
    CS_CLOSING,     /* flushing the last response, then free */
};

enum timer_mode { TM_NONE, TM_IDLE, TM_HEADER, TM_BODY };


struct client {
    struct worker *w;
    struct client *prev, *next;         /* worker's list */
    struct conf *conf;                  /* retained */
    struct bufferevent *bev;
    struct sockaddr_storage peer;
    char peer_text[ROUTE_IP_MAX];       /* the peer's address, as keys use it */
    size_t peer_len;
    struct http1 *parser;
    struct http1_head head;
    struct event *timer;
    enum timer_mode timer_mode;
    enum client_state state;
    int busy;                           /* callbacks on the stack */
    int dead;                           /* free when busy drops to 0 */
    int eof;                            /* client closed its sending side */

    /* The request in progress. */
    const char *hbuf;                   /* head bytes while still in input */
    int head_in_input;
    const struct conf_route *route;
    struct request rq;                  /* what the request computed */
    struct upstream_conn *up;
    int retried;
    int head_request;                   /* method HEAD: response has no body */
    int upgrade;                        /* Upgrade request on an upgrade route */
    const char *error_name;             /* JSON error of the next local answer; NULL: the status's */
    int req_done;                       /* request body fully read */
    int resp_started;                   /* response head sent to client */
    int resp_done;
    int keep_alive;                     /* connection stays open afterwards */
    int out_chunked;                    /* response re-framed as chunked */
    int client_paused;                  /* reading stopped: upstream full */
    int up_paused;                      /* upstream reading stopped: client full */
    int heads_paused;                   /* pipelined heads wait: our output is full */
    uint64_t body_bytes;                /* request payload so far */
    struct evbuffer *body;              /* CS_BUFFER: the payload read so far;
                                         * otherwise scratch for re-framing,
                                         * empty between calls (lazy) */
    struct evbuffer *held;              /* CS_BUFFER: the head, out of the input */
    int head_held;                      /* hbuf points into held */
    int64_t buffer_until_ms;            /* CS_BUFFER: the whole body by then */
    int64_t upstream_start_us;          /* when the request was forwarded */
    int64_t up_deadline_ms;             /* response head due by then; 0: not yet */
    int interims;                       /* 1xx heads read for this request */
    int interims_relayed;
};
void client_accept(struct worker *w, int fd, const struct sockaddr *peer, int peerlen);
/* Shutting down: close idle connections now, the others after the response
 * in progress; the worker's loop exits when none is left. */
void client_drain(struct worker *w);
void client_close_all(struct worker *w);

/* For request.c and exchange.c. */
void client_enter(struct client *c);
int client_leave(struct client *c);     /* 1: freed */
void client_kill(struct client *c);
void client_timer(struct client *c, enum timer_mode mode, int64_t ms);
/* Stop reading requests and close once what is queued has been written. */
void client_close_after_write(struct client *c);
void client_flush(struct client *c);
void client_out_idle(struct bufferevent *bev);
/* Do whatever the bytes in hand allow, until the state needs to wait. */
void client_process(struct client *c);
/* The request is over (answered, its body read): the next one, or close. */
void client_request_done(struct client *c);

#endif
