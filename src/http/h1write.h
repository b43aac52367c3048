/* sluice - h1write.h: the heads sluice forwards, written from parsed ones.
 *
 * Pure functions over a parsed struct http1_head and its buffer: no socket,
 * no connection state. The request head sent upstream and the response head
 * sent back are written into an obuf; framing (Content-Length,
 * Transfer-Encoding) is always written from what http1 parsed, never copied
 * and never dropped because `Connection` names it. The *_check functions say
 * what must not be forwarded at all (400 for a request, 502 for a response).
 * Connection's tokens are read once per call, in time linear in the head. */
#ifndef SLUICE_H1WRITE_H
#define SLUICE_H1WRITE_H

#include <stddef.h>
#include "conf.h"
#include "http1.h"

struct obuf;

/* What the request head going upstream needs beyond the parsed head. */
struct h1write_req {
    const char *peer;           /* appended to X-Forwarded-For */
    size_t peer_len;
    const char *rid;            /* X-Request-Id sent upstream */
    size_t rid_len;
    const char *host;           /* Host for a request without one (HTTP/1.0) */
    size_t host_len;
    int trusted;                /* peer is in trusted_proxies: Forwarded,
                                 * X-Real-IP, X-Forwarded-Host/-Port kept */
    int upgrade;                /* tunnel: Upgrade and Connection: upgrade go up */
    enum conf_underscore underscore;
    int https;                  /* a TLS listener's: X-Forwarded-Proto: https */
};

/* What the response head going to the client needs. rid_seen is set by
 * h1write_response_begin and read by h1write_response_end. */
struct h1write_resp {
    const char *rid;            /* X-Request-Id unless the upstream sent one */
    size_t rid_len;
    enum conf_headers limits;   /* upstream rate-limit fields of this kind are
                                 * dropped (the caller writes merged ones) */
    int head_request;           /* the request was HEAD */
    int chunked;                /* body re-framed as chunked */
    int close;                  /* Connection: close */
    int keep_alive_10;          /* Connection: keep-alive (HTTP/1.0 client) */
    int rid_seen;
};

/* 0 when the request may be forwarded, otherwise 400: Connection names a
 * framing field or Host, or (underscore reject) a name holds '_'. */
int h1write_request_check(const char *buf, const struct http1_head *h,
                          enum conf_underscore underscore);

/* The request head for the upstream: request line as HTTP/1.1, end-to-end
 * fields, then X-Forwarded-For/-Proto, X-Request-Id and the framing. */
void h1write_request(struct obuf *out, const char *buf, const struct http1_head *h,
                     const struct h1write_req *o);

/* 0 when the response head may be relayed, otherwise 502: a status line
 * that is not "HTTP/1.x NNN", or Connection naming a framing field. */
int h1write_response_check(const char *buf, const struct http1_head *h);

/* Status line as HTTP/1.1 and the end-to-end fields (a 101 keeps Upgrade).
 * Only after h1write_response_check returned 0. */
void h1write_response_begin(struct obuf *out, const char *buf, const struct http1_head *h,
                            struct h1write_resp *o);

/* X-Request-Id, framing and Connection, and the empty line. */
void h1write_response_end(struct obuf *out, const char *buf, const struct http1_head *h,
                          const struct h1write_resp *o);

/* 1 when every protocol the request's Upgrade fields name is in protos
 * (protocol names, case-insensitive, "/version" ignored); protos NULL
 * means websocket only. 0 when one is not, or no Upgrade field is there. */
int h1write_upgrade_ok(const char *buf, const struct http1_head *h,
                       char *const *protos, int nprotos);

#endif
