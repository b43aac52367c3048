/* sluice - request_state.h: what one request computed (struct request).
 *
 * The request's state apart from its way (request.h, request.c), so that
 * the parts below the way that read it (the upstream exchange) include
 * this and not the way: they call nothing of request.c. Ownership and
 * lifetime are request.h's. */
#ifndef SLUICE_REQUEST_STATE_H
#define SLUICE_REQUEST_STATE_H

#include <stddef.h>
#include <stdint.h>
#include "decide.h"
#include "jsonscan.h"
#include "route.h"

struct exchange_ops;
struct rls_call;
struct upstream_conn;

/* A client's X-Request-Id is kept when it is this long at most and only
 * visible ASCII; otherwise sluice makes its own. */
#define REQUEST_RID_MAX 128
#define REQUEST_LOG_TARGET_MAX 1024

/* What the access-log line needs once the head is gone. */
struct reqlog {
    int64_t wall_us, start_us, upstream_us;
    int status;
    int grpc_status;                    /* -1: none seen */
    uint64_t bytes_in, bytes_out;
    int active;                         /* a request is being served */
    size_t method_len, target_len, client_len;
    char client[ROUTE_IP_MAX];
    char method[32];
    char target[REQUEST_LOG_TARGET_MAX];
};

struct request {
    /* Kept across the requests of a connection. */
    char *path;                         /* normalised path, NUL-terminated */
    size_t path_cap;
    struct reqlog *log;                 /* NULL when logging is off */
    struct runtime *rt;                 /* retained from the head until the request
                                         * is done (the config, pools and backend it
                                         * started with); NULL between requests */
    struct decision dec;                /* keys, limit results, the call (decide.h);
                                         * reset with the request */
    struct request *spare_next;         /* in the worker's spares (request_put) */
    struct rls_call *rls;               /* an Envoy RLS call's (rls.h), made on the
                                         * first; kept across requests */
    char *claims;                       /* the verified token's claims (jwt.h) */
    size_t claims_cap;
    struct http1_head head;             /* parsed into as the head arrives (so not
                                         * zeroed by request_reset); zeroed by
                                         * request_get */

    /* Zeroed per head from here (request_reset). */
    size_t path_len;
    char ip[ROUTE_IP_MAX];              /* the client's address as keys use it */
    size_t ip_len;
    char rid[REQUEST_RID_MAX + 1];      /* X-Request-Id, sent up and back */
    size_t rid_len;
    struct route_captures caps;         /* path_regex groups, into path */
    const char *hbuf;                   /* head bytes while still in input */
    int head_in_input;
    int head_held;                      /* hbuf points into the client's held */
    const struct conf_route *route;
    int jwt_ok;                         /* claims[0..claims_len) hold a verified
                                         * token's claims */
    size_t claims_len;
    int head_request;                   /* method HEAD: response has no body */
    int req_done;                       /* request body fully read */
    int upgrade;                        /* Upgrade request on an upgrade route */
    const char *error_name;             /* JSON error of the next local answer; NULL: the status's */
    uint64_t body_bytes;                /* request payload so far */
    int grpc;                           /* a gRPC call: Content-Type application/grpc* */
    int64_t grpc_deadline_ms;           /* clock_ms() by grpc-timeout; 0: none */
    int resp_started;                   /* response head sent to client */
    int resp_done;

    /* The upstream exchange's (exchange.c), zeroed with the rest. */
    struct upstream_conn *up;           /* borrowed from the route's pool; owned */
    const struct exchange_ops *xops;    /* the request's, from exchange_start */
    int retried;
    int out_chunked;                    /* response re-framed as chunked */
    int64_t buffer_until_ms;            /* CS_BUFFER: the whole body by then */
    size_t read_max;                    /* exchange_read_body: its bound; 0: forwarding */
    int64_t upstream_start_us;          /* when the request was forwarded */
    int64_t up_deadline_ms;             /* response head due by then; 0: not yet */
    int interims;                       /* 1xx heads read for this request */
    int interims_relayed;
    int body_first;                     /* buffering before the decision */
    int body_buffered;                  /* the body was buffered before it */
    /* cost_from: the response body scanned for the cost (exchange.c) */
    int cost_scanning;
    int cost_hold;                      /* the body goes through c->tail */
    uint64_t cost_scanned;              /* payload bytes fed so far */
    struct jsonscan cost_scan;
};

#endif
