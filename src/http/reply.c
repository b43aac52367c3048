/* sluice - reply.c: sluice's own responses and the rate-limit header fields.
 *
 * Numbers are written with a small integer formatter, not printf: these
 * fields go on every response of a limited route. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>

#include "esc.h"
#include "obuf.h"

#include "reply.h"

#define ADD_LIT(out, s) OBUF_LIT(out, s)
#define add_int obuf_int
#define add_str obuf_str

/* Names come from the config file; escape them for JSON and for the quoted
 * strings of the IETF fields (both treat '"' and '\' the same way). */
static void add_quoted(struct obuf *out, const char *s)
{
    char buf[ESC_MAX(64)];
    ADD_LIT(out, "\"");
    for (size_t n = strlen(s), i = 0; i < n; i += 64) {
        size_t k = n - i < 64 ? n - i : 64;
        obuf_add(out, buf, (size_t)(esc_put(buf, s + i, k, ESC_QUOTED) - buf));
    }
    ADD_LIT(out, "\"");
}

int64_t reply_seconds(int64_t ms)
{
    if (ms <= 0)
        return 0;
    return (ms + 999) / 1000;
}

void reply_pick(struct reply_limits *rl, int allowed)
{
    int best = 0;
    for (int i = 1; i < rl->n; i++) {
        const struct limiter_result *a = &rl->r[i], *b = &rl->r[best];
        /* A shadow limit never denies, so it is never the one shown for
         * a rejection. */
        int a_denies = !a->allowed && !rl->limit[i]->shadow;
        int b_denies = !b->allowed && !rl->limit[best]->shadow;
        if (allowed ? a->remaining < b->remaining
                    : (a_denies && (!b_denies || a->retry_ms > b->retry_ms)))
            best = i;
    }
    rl->shown = best;
}

/* The quota and window (ms) of route limit l as this decision applied it:
 * an override's (config or run-time) when one did, so that the policy and
 * RateLimit describe one quota. A bucket's window is its burst's refill
 * time at the interval sluice knows (a run-time override's own rate is in
 * Redis only). */
static void policy_of(const struct reply_limits *rl, const struct conf_limit *l,
                      int64_t *q, int64_t *w_ms)
{
    const struct limiter_params *p = &l->params;
    *q = p->limit;
    for (int j = 0; j < rl->n; j++)
        if (rl->limit[j] == l) {
            p = rl->params[j] ? rl->params[j] : p;
            *q = rl->r[j].limit;
        }
    *w_ms = p->window_ms;
    if ((p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA) && *q != p->limit)
        *w_ms = *q > 0 && p->interval_us > (LIMITER_MAX_TIME_MS * 1000) / *q ?
                LIMITER_MAX_TIME_MS : (*q * p->interval_us + 999) / 1000;
}

/* Did this decision apply every limit as configured (no override)? Then
 * the route's RateLimit-Policy is the text conf_load built. */
static int policy_configured(const struct reply_limits *rl)
{
    for (int j = 0; j < rl->n; j++)
        if (rl->params[j] || rl->r[j].limit != rl->limit[j]->params.limit)
            return 0;
    return 1;
}

/* One route's (or plan's) limits in RateLimit-Policy form. */
static void add_route_policy(struct obuf *out, const struct reply_limits *rl,
                             const struct conf_route *route, int configured)
{
    if (route->policy && configured) {
        obuf_add(out, route->policy, route->policy_len);    /* built at load */
    } else {
        int64_t q[CONF_MAX_LIMITS], w_ms[CONF_MAX_LIMITS];
        size_t n;
        for (int i = 0; i < route->nlimits; i++)
            policy_of(rl, &route->limits[i], &q[i], &w_ms[i]);
        char *t = conf_route_policy(route, q, w_ms, &n);
        obuf_add(out, t, n);
        free(t);
    }
}

static void add_policy(struct obuf *out, const struct reply_limits *rl,
                       const char *more, size_t more_len)
{
    int configured = policy_configured(rl);
    ADD_LIT(out, "RateLimit-Policy: ");
    if (rl->route->nlimits > 0)
        add_route_policy(out, rl, rl->route, configured);
    if (rl->plan) {         /* the client's plan's limits after the route's */
        if (rl->route->nlimits > 0)
            ADD_LIT(out, ", ");
        add_route_policy(out, rl, rl->plan, configured);
    }
    if (more) {
        ADD_LIT(out, ", ");
        obuf_add(out, more, more_len);
    }
    ADD_LIT(out, "\r\n");
}

static void add_legacy(struct obuf *out, int64_t limit, int64_t remaining, int64_t reset)
{
    ADD_LIT(out, "X-RateLimit-Limit: ");
    add_int(out, limit);
    ADD_LIT(out, "\r\nX-RateLimit-Remaining: ");
    add_int(out, remaining);
    ADD_LIT(out, "\r\nX-RateLimit-Reset: ");
    add_int(out, reset);
    ADD_LIT(out, "\r\n");
}

void reply_limit_headers(struct obuf *out, const struct reply_limits *rl, int denied,
                         const struct reply_upstream *up)
{
    enum conf_headers mode = rl->route->headers;
    const struct limiter_result *r = &rl->r[rl->shown];
    /* On a denial the quota is "reset" for this client when its next
     * request would pass: the same value as Retry-After. */
    int64_t reset = reply_seconds(denied ? r->retry_ms : r->reset_ms);
    if (denied && reset < 1)
        reset = 1;
    if (mode == CONF_HEADERS_FULL || mode == CONF_HEADERS_LEGACY) {
        if (up && up->has_legacy && up->remaining < r->remaining)
            add_legacy(out, up->limit, up->remaining, up->reset);
        else
            add_legacy(out, r->limit, r->remaining, reset);
    }
    if (mode == CONF_HEADERS_FULL || mode == CONF_HEADERS_IETF) {
        /* Both are lists: the upstream's items follow ours, and a client
         * heeds the most restrictive item. */
        add_policy(out, rl, up ? up->policy : NULL, up ? up->policy_len : 0);
        ADD_LIT(out, "RateLimit: ");
        add_quoted(out, rl->limit[rl->shown]->name);
        ADD_LIT(out, ";r=");
        add_int(out, r->remaining);
        if (rl->limit[rl->shown]->params.algo != LIMITER_CONCURRENCY) {   /* free slots: no time */
            ADD_LIT(out, ";t=");
            add_int(out, reset);
        }
        if (up && up->ratelimit) {
            ADD_LIT(out, ", ");
            obuf_add(out, up->ratelimit, up->ratelimit_len);
        }
        ADD_LIT(out, "\r\n");
    }
}

static void add_status_line(struct obuf *out, int status)
{
    static const struct { int code; const char *line; } lines[] = {
        { 200, "HTTP/1.1 200 OK\r\n" },
        { 400, "HTTP/1.1 400 Bad Request\r\n" },
        { 401, "HTTP/1.1 401 Unauthorized\r\n" },
        { 403, "HTTP/1.1 403 Forbidden\r\n" },
        { 404, "HTTP/1.1 404 Not Found\r\n" },
        { 408, "HTTP/1.1 408 Request Timeout\r\n" },
        { 413, "HTTP/1.1 413 Content Too Large\r\n" },
        { 414, "HTTP/1.1 414 URI Too Long\r\n" },
        { 429, "HTTP/1.1 429 Too Many Requests\r\n" },
        { 431, "HTTP/1.1 431 Request Header Fields Too Large\r\n" },
        { 500, "HTTP/1.1 500 Internal Server Error\r\n" },
        { 501, "HTTP/1.1 501 Not Implemented\r\n" },
        { 502, "HTTP/1.1 502 Bad Gateway\r\n" },
        { 503, "HTTP/1.1 503 Service Unavailable\r\n" },
        { 504, "HTTP/1.1 504 Gateway Timeout\r\n" },
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        if (lines[i].code == status) {
            add_str(out, lines[i].line);
            return;
        }
    ADD_LIT(out, "HTTP/1.1 ");
    add_int(out, status);
    ADD_LIT(out, " Error\r\n");
}

const char *reply_error_name(int status)
{
    switch (status) {
    case 400: return "bad_request";
    case 401: return "missing_token";
    case 404: return "no_route";
    case 408: return "request_timeout";
    case 413: return "body_too_large";
    case 414: return "uri_too_long";
    case 431: return "headers_too_large";
    case 501: return "not_implemented";
    case 502: return "bad_gateway";
    case 503: return "limiter_unavailable";
    case 504: return "gateway_timeout";
    default:  return "error";
    }
}

/* The head's last fields: X-Request-Id, Content-Type (json: JSON; none
 * without a body), Content-Length, Connection. */
static void add_head_end(struct obuf *out, int json, size_t body_len, int keep_alive,
                         const char *rid, size_t rid_len)
{
    if (rid_len) {
        ADD_LIT(out, "X-Request-Id: ");
        obuf_add(out, rid, rid_len);
        ADD_LIT(out, "\r\n");
    }
    if (json)
        ADD_LIT(out, "Content-Type: application/json\r\n");
    ADD_LIT(out, "Content-Length: ");
    add_int(out, (int64_t)body_len);
    if (keep_alive == REPLY_KEEP_SAID)
        ADD_LIT(out, "\r\nConnection: keep-alive\r\n\r\n");
    else if (keep_alive)
        ADD_LIT(out, "\r\n\r\n");
    else
        ADD_LIT(out, "\r\nConnection: close\r\n\r\n");
}

/* name NULL: the status's own; retry_s > 0 adds Retry-After. */
static void add_error(struct evbuffer *buf, int status, const char *name, int64_t retry_s,
                      int keep_alive, const char *rid, size_t rid_len)
{
    struct obuf ob, *out = &ob;
    obuf_begin(out, buf, 256 + rid_len);
    char body[64];
    int n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}",
                     name != NULL ? name : reply_error_name(status));
    if (n < 0 || (size_t)n >= sizeof(body))
        abort();                        /* names are ours and short */
    add_status_line(out, status);
    if (status == 401 && name != NULL && strcmp(name, "invalid_token") == 0)
        ADD_LIT(out, "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
    else if (status == 401)     /* no token: no error code (RFC 6750 3.1) */
        ADD_LIT(out, "WWW-Authenticate: Bearer\r\n");
    if (retry_s > 0) {
        ADD_LIT(out, "Retry-After: ");
        add_int(out, retry_s);
        ADD_LIT(out, "\r\n");
    }
    add_head_end(out, 1, (size_t)n, keep_alive, rid, rid_len);
    obuf_add(out, body, (size_t)n);
    obuf_end(out);
}

void reply_error(struct evbuffer *buf, int status, int keep_alive,
                 const char *rid, size_t rid_len)
{
    add_error(buf, status, NULL, 0, keep_alive, rid, rid_len);
}

void reply_error_named(struct evbuffer *buf, int status, const char *name, int keep_alive,
                       const char *rid, size_t rid_len)
{
    add_error(buf, status, name, 0, keep_alive, rid, rid_len);
}

void reply_unavailable(struct evbuffer *buf, int64_t retry_ms, int keep_alive,
                       const char *rid, size_t rid_len)
{
    int64_t retry_s = reply_seconds(retry_ms);
    add_error(buf, 503, NULL, retry_s < 1 ? 1 : retry_s, keep_alive, rid, rid_len);
}

static size_t quoted_len(const char *s)
{
    return 2 + esc_len(s, strlen(s), ESC_QUOTED);
}

static size_t int_len(int64_t v)
{
    size_t n = 1;
    for (; v >= 10; v /= 10)
        n++;
    return n;
}

void reply_limited(struct evbuffer *buf, const struct reply_limits *rl, int keep_alive,
                   const char *rid, size_t rid_len)
{
    const struct conf_limit *l = rl->limit[rl->shown];
    reply_limited_as(buf, rl, l->status ? l->status : 429, keep_alive, rid, rid_len);
}

void reply_allowed(struct evbuffer *buf, const struct reply_limits *rl, int keep_alive,
                   const char *rid, size_t rid_len)
{
    struct obuf ob, *out = &ob;
    obuf_begin(out, buf, 1024 + rid_len);
    add_status_line(out, 200);
    if (rl)
        reply_limit_headers(out, rl, 0, NULL);
    add_head_end(out, 0, 0, keep_alive, rid, rid_len);
    obuf_end(out);
}

void reply_limit_fields(struct evbuffer *buf, const struct reply_limits *rl, int denied)
{
    struct obuf ob, *out = &ob;
    obuf_begin(out, buf, 512);
    if (denied) {
        int64_t retry = reply_seconds(rl->r[rl->shown].retry_ms);
        ADD_LIT(out, "Retry-After: ");
        add_int(out, retry < 1 ? 1 : retry);
        ADD_LIT(out, "\r\n");
    }
    reply_limit_headers(out, rl, denied, NULL);
    obuf_end(out);
}

void reply_limited_as(struct evbuffer *buf, const struct reply_limits *rl, int status,
                      int keep_alive, const char *rid, size_t rid_len)
{
    struct obuf ob, *out = &ob;
    obuf_begin(out, buf, 1024 + rid_len);
    static const char b1[] = "{\"error\":\"rate_limited\",\"route\":";
    static const char b2[] = ",\"limit\":";
    static const char b3[] = ",\"retry_after\":";
    static const char b4[] = ",\"message\":";
    const struct conf_limit *l = rl->limit[rl->shown];
    const struct limiter_result *r = &rl->r[rl->shown];
    int64_t retry = reply_seconds(r->retry_ms);
    if (retry < 1)
        retry = 1;

    add_status_line(out, status);
    ADD_LIT(out, "Retry-After: ");
    add_int(out, retry);
    ADD_LIT(out, "\r\n");
    reply_limit_headers(out, rl, 1, NULL);
    size_t body_len = sizeof(b1) - 1 + quoted_len(rl->route->name) + sizeof(b2) - 1
                      + quoted_len(l->name) + sizeof(b3) - 1 + int_len(retry) + 1;
    if (l->message)
        body_len += sizeof(b4) - 1 + quoted_len(l->message);
    add_head_end(out, 1, body_len, keep_alive, rid, rid_len);
    ADD_LIT(out, b1);
    add_quoted(out, rl->route->name);
    ADD_LIT(out, b2);
    add_quoted(out, l->name);
    ADD_LIT(out, b3);
    add_int(out, retry);
    if (l->message) {
        ADD_LIT(out, b4);
        add_quoted(out, l->message);
    }
    ADD_LIT(out, "}");
    obuf_end(out);
}

int reply_grpc_code(int status, int limited)
{
    switch (status) {
    case 400: return REPLY_GRPC_INVALID_ARGUMENT;
    case 404: case 501: return REPLY_GRPC_UNIMPLEMENTED;
    case 408: case 504: return REPLY_GRPC_DEADLINE_EXCEEDED;
    case 413: case 414: case 431: return REPLY_GRPC_RESOURCE_EXHAUSTED;
    case 429: return limited;
    case 502: case 503: return REPLY_GRPC_UNAVAILABLE;
    default: return REPLY_GRPC_UNKNOWN;
    }
}

void reply_grpc(struct evbuffer *buf, int code, const char *name, const struct reply_limits *rl,
                int64_t retry_ms, int keep_alive, const char *rid, size_t rid_len)
{
    struct obuf ob, *out = &ob;
    char msg[ESC_MAX(64)];
    size_t nlen = strlen(name);
    obuf_begin(out, buf, 1024 + rid_len + ESC_MAX(nlen));
    ADD_LIT(out, "HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\ngrpc-status: ");
    add_int(out, code);
    ADD_LIT(out, "\r\ngrpc-message: ");
    for (size_t i = 0; i < nlen; i += 64) {
        size_t k = nlen - i < 64 ? nlen - i : 64;
        obuf_add(out, msg, (size_t)(esc_put(msg, name + i, k, ESC_PERCENT) - msg));
    }
    ADD_LIT(out, "\r\n");
    if (rl) {
        retry_ms = rl->r[rl->shown].retry_ms;
        if (retry_ms < 1)
            retry_ms = 1;
        ADD_LIT(out, "grpc-retry-pushback-ms: ");
        add_int(out, retry_ms);
        ADD_LIT(out, "\r\n");
        reply_limit_headers(out, rl, 1, NULL);
    }
    if (retry_ms > 0) {
        ADD_LIT(out, "Retry-After: ");
        add_int(out, reply_seconds(retry_ms));
        ADD_LIT(out, "\r\n");
    }
    add_head_end(out, 0, 0, keep_alive, rid, rid_len);
    obuf_end(out);
}
