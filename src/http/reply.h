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
#include "backend.h"

struct evbuffer;
struct obuf;

/* The outcome of one decision, as the headers show it. */
struct reply_limits {
    const struct conf_route *route;
    const struct conf_route *plan;          /* the client's plan's, or NULL */
    int n;                                  /* limits decided */
    const struct conf_limit *limit[STORE_MAX_LIMITS];
    /* the parameters applied: a config override's, or NULL (the limit's);
     * a run-time override's limit comes back in r[].limit */
    const struct limiter_params *params[STORE_MAX_LIMITS];
    struct limiter_result r[STORE_MAX_LIMITS];
    int shown;      /* index shown: least remaining, or the denying limit */
};

/* The upstream's own rate-limit fields on a proxied response (values point
 * into its head). sluice merges with them and never shows a client more
 * quota than the upstream did. */
struct reply_upstream {
    int has_legacy;             /* X-RateLimit-Remaining present and numeric */
    int64_t limit, remaining, reset;
    const char *policy;         /* RateLimit-Policy value, or NULL */
    size_t policy_len;
    const char *ratelimit;      /* RateLimit value, or NULL */
    size_t ratelimit_len;
};

/* Pick the limit the headers show: on a denial, the denying limit that
 * waits longest; otherwise the one with least remaining. */
void reply_pick(struct reply_limits *rl, int allowed);

/* Append the rate-limit header fields the route's `headers` setting asks
 * for (each ending in CRLF), merged with the upstream's (up may be NULL). */
void reply_limit_headers(struct obuf *out, const struct reply_limits *rl, int denied,
                         const struct reply_upstream *up);

/* The fields alone, each ending in CRLF, into buf: Retry-After when denied
 * (as reply_limited sends it), then reply_limit_headers' (no upstream).
 * For answers that carry them in another form (Envoy's RLS
 * response_headers_to_add). */
void reply_limit_fields(struct evbuffer *buf, const struct reply_limits *rl, int denied);

/* keep_alive for the replies below: close after it (Connection: close),
 * stay open as HTTP/1.1 does by default, or stay open and say so, for an
 * HTTP/1.0 client that asked for keep-alive. */
#define REPLY_CLOSE      0
#define REPLY_KEEP       1
#define REPLY_KEEP_SAID  2

/* A complete rejection: the denying limit's status (429 unless set) with
 * Retry-After, the rate-limit fields and a JSON body. */
void reply_limited(struct evbuffer *out, const struct reply_limits *rl, int keep_alive,
                   const char *request_id, size_t request_id_len);

/* The same with the status given (a decision listener's decision.deny_status). */
void reply_limited_as(struct evbuffer *out, const struct reply_limits *rl, int status,
                      int keep_alive, const char *request_id, size_t request_id_len);

/* A decision listener's "go on": 200 with the rate-limit fields of rl (NULL:
 * none, the route has no limits) and no body. */
void reply_allowed(struct evbuffer *out, const struct reply_limits *rl, int keep_alive,
                   const char *request_id, size_t request_id_len);

/* A complete error response with a JSON body {"error":"..."}. */
void reply_error(struct evbuffer *out, int status, int keep_alive,
                 const char *request_id, size_t request_id_len);

/* The same with the JSON error name given (NULL: the status's own), for
 * the 400s that say why: "ambiguous_key", "missing_key", "bad_key", "bad_host",
 * "regex_limit"; a 401 carries WWW-Authenticate: Bearer, with
 * error="invalid_token" when name is "invalid_token" (RFC 6750 3.1). */
void reply_error_named(struct evbuffer *out, int status, const char *name, int keep_alive,
                       const char *request_id, size_t request_id_len);

/* The 503 limiter_unavailable (on_error: deny), with Retry-After: retry_ms
 * in whole seconds rounded up, at least 1. */
void reply_unavailable(struct evbuffer *out, int64_t retry_ms, int keep_alive,
                       const char *request_id, size_t request_id_len);

/* gRPC status codes (grpc's include/grpc/status.h) of sluice's answers. */
#define REPLY_GRPC_UNKNOWN            2
#define REPLY_GRPC_INVALID_ARGUMENT   3
#define REPLY_GRPC_DEADLINE_EXCEEDED  4
#define REPLY_GRPC_RESOURCE_EXHAUSTED 8
#define REPLY_GRPC_UNIMPLEMENTED      12
#define REPLY_GRPC_UNAVAILABLE        14

/* The gRPC status of a local answer that would have HTTP status `status`
 * (limited: the code of a 429, the route's grpc_limited). */
int reply_grpc_code(int status, int limited);

/* A gRPC call's local answer, Trailers-Only written as HTTP/1.1 (an h2
 * front sends it as one HEADERS frame with END_STREAM): 200,
 * Content-Type: application/grpc, grpc-status `code`, grpc-message (name,
 * percent-encoded), no body. With rl, a rejection: Retry-After,
 * grpc-retry-pushback-ms (gRFC A6) and the rate-limit fields; without,
 * retry_ms > 0 adds Retry-After (an unavailable limiter). */
void reply_grpc(struct evbuffer *out, int code, const char *name, const struct reply_limits *rl,
                int64_t retry_ms, int keep_alive, const char *request_id, size_t request_id_len);

/* The JSON error name of a status ("no_route" for 404...). */
const char *reply_error_name(int status);

/* Whole seconds, rounded up, at least 1 when ms > 0. */
int64_t reply_seconds(int64_t ms);

#endif
