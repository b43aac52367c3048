/* sluice - reply.h: the responses and header fields sluice writes itself.
 *
 * Error replies (400, 404, 408, 413, 414, 431, 502, 503, 504...) carry a short
 * JSON body; the 429 carries the route, the limit and Retry-After. The
 * rate-limit fields (X-RateLimit-*, RateLimit-Policy, RateLimit) are written
 * here both for rejections and for proxied responses. Everything is appended
 * to an evbuffer the caller owns; nothing is allocated but evbuffer space. */
#ifndef SLUICE_REPLY_H
#define SLUICE_REPLY_H

#include <stdint.h>
#include "conf.h"
#include "store.h"

struct evbuffer;

/* The outcome of one decision, as the headers show it. */
struct reply_limits {
    const struct conf_route *route;
    int n;                                  /* limits decided */
    const struct conf_limit *limit[STORE_MAX_LIMITS];
    struct limiter_result r[STORE_MAX_LIMITS];
    int shown;      /* index shown: least remaining, or the denying limit */
};

/* Pick the limit the headers show: on a denial, the denying limit that
 * waits longest; otherwise the one with least remaining. */
void reply_pick(struct reply_limits *rl, int allowed);

/* Append the rate-limit header fields (each ending in CRLF). */
void reply_limit_headers(struct evbuffer *out, const struct reply_limits *rl, int denied);

/* A complete 429 response. */
void reply_429(struct evbuffer *out, const struct reply_limits *rl, int keep_alive);

/* A complete error response with a JSON body {"error":"..."}. */
void reply_error(struct evbuffer *out, int status, int keep_alive);

/* Whole seconds, rounded up, at least 1 when ms > 0. */
int64_t reply_seconds(int64_t ms);

#endif
