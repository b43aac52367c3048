/* sluice - request.c: the way each request takes, and what it owns.
 *
 *   client.c ──bytes──▶ head (http1) ──▶ normalise + route (route) ──▶ address, id
 *                                               │
 *                      404 ◀── no route ────────┤
 *                                               ▼
 *          decide.c: allow lists, keys (into rq->dec), deny cache,
 *                    one call to the worker's backend (backend.h) ──▶ Redis / memory
 *                                               │
 *            429 + headers ◀── denied ──────────┤
 *            on_error (allow / 503 / local) ◀── down
 *                                               ▼ allowed: exchange_start
 *        exchange.c: upstream pool (upstream) ◀── head + streamed body
 *                 │
 *                 └──▶ response head + rate-limit fields + streamed body ──▶ client
 *
 * Modules, each including only those below it (no cycles):
 *   worker ─▶ client ─▶ request ─▶ exchange ─▶ decide ─▶ backend ─▶ store, memstore
 *                 └──────────┴───────────┴──▶ conn (struct client, lifetime, timer, flush)
 * A lower layer tells an upper one through pointers it was given: the
 * exchange reports to the request through struct exchange_ops (exchange.h,
 * request_exchange_ops here); the request tells client.c through c->ops
 * (conn.h) that it is done (request_done) or more input may be processed
 * (process).
 *
 * One request is handled at a time per connection (client.c); its state is
 * *c->rq, zeroed per head, so nothing it needs after a wait (the backend, the
 * upstream, a timer) lives in worker scratch or in the previous request. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "accesslog.h"
#include "backend.h"
#include "clock.h"
#include "conn.h"
#include "conf.h"
#include "decide.h"
#include "exchange.h"
#include "fwdauth.h"
#include "rls.h"
#include "rls_wire.h"
#include "h1write.h"
#include "hex.h"
#include "http1.h"
#include "io.h"
#include "jwt.h"
#include "jwtcache.h"
#include "mem.h"
#include "metrics.h"
#include "reply.h"
#include "request.h"
#include "route.h"
#include "runtime.h"
#include "upstream.h"

/* A rejected request's body is read and dropped up to this size so the
 * connection can stay open; a larger one closes it. */
#define REQUEST_DISCARD_MAX  (1024 * 1024)

void request_reset(struct request *rq)
{
    size_t from = offsetof(struct request, path_len);
    memset((char *)rq + from, 0, sizeof(*rq) - from);
    decide_reset(&rq->dec);
}

void request_cancel(struct request *rq)
{
    decide_cancel(&rq->dec);
    if (rq->rls)
        rls_cancel(rq->rls);
}

void request_free(struct request *rq)
{
    rls_call_free(rq->rls);
    rq->rls = NULL;
    runtime_release(rq->rt);
    rq->rt = NULL;
    free(rq->path);
    free(rq->claims);
    rq->claims = NULL;
    rq->claims_cap = 0;
    decide_free(&rq->dec);
    free(rq->log);
    rq->path = NULL;
    rq->log = NULL;
    rq->path_cap = 0;
}

struct request *request_get(struct conn_env *env)
{
    struct request *rq = env->spares;
    if (rq) {
        env->spares = rq->spare_next;
        env->nspares--;
        rq->spare_next = NULL;
    } else {
        rq = mem_calloc(1, sizeof(*rq));
    }
    http1_head_clear(&rq->head);    /* a spare's was another request's: only nheaders of
                                     * its fields are ever read */
    request_reset(rq);
    return rq;
}

void request_put(struct conn_env *env, struct request *rq)
{
    if (rq == NULL)
        return;
    request_cancel(rq);
    runtime_release(rq->rt);
    rq->rt = NULL;
    if (env->nspares >= REQUEST_SPARES_MAX) {
        request_free(rq);
        free(rq);
        return;
    }
    rq->spare_next = env->spares;
    env->spares = rq;
    env->nspares++;
}

void request_spares_free(struct conn_env *env)
{
    while (env->spares) {
        struct request *rq = env->spares;
        env->spares = rq->spare_next;
        request_free(rq);
        free(rq);
    }
    env->nspares = 0;
}

/* Grown by doubling, never shrunk: the requests that reuse it keep it. */
static char *grow(char **buf, size_t *cap, size_t need)
{
    if (need > *cap) {
        size_t n = *cap ? *cap : 256;
        while (n < need)
            n *= 2;
        char *p = realloc(*buf, n);
        if (p == NULL)
            abort();
        *buf = p;
        *cap = n;
    }
    return *buf;
}

char *request_path_room(struct request *rq, size_t n)
{
    return grow(&rq->path, &rq->path_cap, n + 1);
}

/* ---- the request in progress on a client ----------------------------- */

static const char *hb(const struct client *c, struct http1_span s);
static void decide(struct client *c);
static int decision_view(struct client *c);
static void rls_begin(struct client *c);

/* ---- small helpers ----------------------------------------------------- */

static struct metrics_route *request_metrics(const struct client *c)
{
    return c->rq->route ? c->rq->route->metrics : metrics_unrouted();
}

/* The client's address as text, into the request: the peer's, computed
 * once per connection, unless the peer is a trusted proxy whose
 * X-Forwarded-For must be read for each request. */
static void request_address(struct client *c)
{
    const struct conf *conf = c->conf;
    struct request *rq = c->rq;
    if (conf->ntrusted == 0 ||
        !conf_cidr_match(conf->trusted, conf->ntrusted, (const struct sockaddr *)&c->peer)) {
        memcpy(rq->ip, c->peer_text, c->peer_len + 1);
        rq->ip_len = c->peer_len;
        return;
    }
    rq->ip_len = route_client_ip(conf, (const struct sockaddr *)&c->peer, rq->hbuf, &rq->head,
                                 rq->ip);
}

void request_count_response(struct client *c, int status)
{
    metrics_response(request_metrics(c), status);
    if (c->rq->log)
        c->rq->log->status = status;
}

void request_count_out(struct client *c, uint64_t n)
{
    if (c->rq->log)
        c->rq->log->bytes_out += n;
}

/* One access-log line for the request in progress, once. */
void request_log_end(struct client *c)
{
    static const char *const decisions[] = { "allowed", "limited", "shadow_limited", "error",
                                             "delayed" };
    struct reqlog *rq = c->rq->log;
    if (rq == NULL || !rq->active)
        return;
    rq->active = 0;
    const struct reply_limits *rl = &c->rq->dec.rl;
    const struct limiter_result *r = c->rq->dec.have_limits ? &rl->r[rl->shown] : NULL;
    struct accesslog_entry e = {
        .time_us = rq->wall_us,
        .client = rq->client, .client_len = rq->client_len,
        .method = rq->method, .method_len = rq->method_len,
        .path = rq->target, .path_len = rq->target_len,
        .status = rq->status,
        .route = c->rq->route ? c->rq->route->name : NULL,
        .decision = c->rq->dec.decision >= 0 ? decisions[c->rq->dec.decision] : NULL,
        .limit = r ? rl->limit[rl->shown]->name : NULL,
        .remaining = r ? r->remaining : -1,
        .upstream_us = rq->upstream_us,
        .total_us = clock_us() - rq->start_us,
        .bytes_in = rq->bytes_in, .bytes_out = rq->bytes_out,
        .request_id = c->rq->rid, .request_id_len = c->rq->rid_len,
        .tls = c->tls_version,
        .delay_ms = c->rq->dec.wait_ms,
        .key_fallback = c->rq->dec.fallback != 0,
        .has_cost = c->rq->dec.charged >= 0,
        .cost = c->rq->dec.charged,
        .has_grpc_status = rq->grpc_status >= 0,
        .grpc_status = rq->grpc_status,
        .http2 = c->h2_stream,
        .decision_mode = c->decision,
    };
    accesslog_write(c->env->alog, &e);
}

/* A head arrived: note what the log line will need. A head that did not
 * parse (parsed = 0) is logged without method and target. */
void request_log_begin(struct client *c, int parsed)
{
    if (c->env->alog == NULL)
        return;
    if (c->rq->log == NULL)
        c->rq->log = mem_alloc(sizeof(*c->rq->log));
    struct reqlog *rq = c->rq->log;
    rq->wall_us = clock_wall_us();
    rq->start_us = clock_us();
    rq->upstream_us = -1;
    rq->status = 0;
    rq->grpc_status = -1;
    rq->active = 1;
    rq->bytes_out = 0;
    if (!parsed) {
        rq->bytes_in = 0;
        rq->method_len = rq->target_len = 0;
        rq->client_len = route_client_ip(c->conf, (const struct sockaddr *)&c->peer, NULL,
                                         NULL, rq->client);
        return;
    }
    const struct http1_head *h = &c->rq->head;
    rq->bytes_in = h->len;
    rq->method_len = h->method.len < sizeof(rq->method) ? h->method.len : sizeof(rq->method);
    memcpy(rq->method, hb(c, h->method), rq->method_len);
    rq->target_len = h->target.len < sizeof(rq->target) ? h->target.len : sizeof(rq->target);
    memcpy(rq->target, hb(c, h->target), rq->target_len);
    memcpy(rq->client, c->rq->ip, c->rq->ip_len + 1);
    rq->client_len = c->rq->ip_len;
}

static const char *hb(const struct client *c, struct http1_span s)
{
    return c->rq->hbuf + s.off;
}

/* Reading more input may move bytes already in the buffer (libevent
 * realigns chains), so the head's address is taken again after every
 * wait before its spans are read. */
void request_refresh_head(struct client *c)
{
    if (c->rq->head_in_input)
        c->rq->hbuf = (const char *)evbuffer_pullup(io_input(c->io),
                                                (ssize_t)c->rq->head.len);
}

void request_drain_head(struct client *c)
{
    if (c->rq->head_in_input) {
        evbuffer_drain(io_input(c->io), c->rq->head.len);
        c->rq->head_in_input = 0;
        c->rq->hbuf = NULL;
    }
}

/* ---- local answers ----------------------------------------------------- */

/* The request's body can be dropped (rather than closing) after a local
 * answer when it is announced small enough or chunked. */
static int body_discardable(const struct http1_head *h)
{
    return h->body == HTTP1_BODY_NONE || h->body == HTTP1_BODY_CHUNKED ||
           (h->body == HTTP1_BODY_LENGTH && h->content_length <= REQUEST_DISCARD_MAX);
}

/* A HEAD gets the head of our answer alone (the client reads no body
 * after it): the reply, written to tmp, moves to out up to its empty line. */
static void move_reply_head(struct evbuffer *tmp, struct evbuffer *out)
{
    struct evbuffer_ptr end = evbuffer_search(tmp, "\r\n\r\n", 4, NULL);
    if (end.pos >= 0)
        evbuffer_remove_buffer(tmp, out, (size_t)end.pos + 4);
}

static void new_request_id(struct client *c);
static const struct exchange_ops request_exchange_ops;

/* A denial's status: a decision listener's decision.deny_status when set,
 * otherwise the denying limit's own (429 unless it sets one). */
static int limited_status(const struct client *c)
{
    const struct conf_limit *l = c->rq->dec.rl.limit[c->rq->dec.rl.shown];
    if (c->decision && c->conf->decision.deny_status)
        return c->conf->decision.deny_status;
    return l->status ? l->status : 429;
}

/* A local answer is in the output since out_before: count it, drop its
 * head, then close after it (0) or keep the connection for what follows
 * (1: in CS_DISCARD, the caller says what is left of the request). */
static int answer_sent(struct client *c, int status, size_t out_before, int keep)
{
    request_count_response(c, status);
    request_count_out(c, evbuffer_get_length(io_output(c->io)) - out_before);
    c->rq->resp_started = c->rq->resp_done = 1;
    request_drain_head(c);
    if (!keep) {
        conn_close_after_write(c);
        return 0;
    }
    c->keep_alive = 1;
    c->state = CS_DISCARD;
    return 1;
}

/* Answer the current request ourselves: an error, or with rl set, a 429.
 * Every answer carries an id: one that came before its head was read (a
 * head refused by the parser, a head timeout) gets a new one. */
void request_answer(struct client *c, int status, int close_after)
{
    if (c->rq->rid_len == 0)
        new_request_id(c);
    struct evbuffer *out = io_output(c->io);
    size_t out_before = evbuffer_get_length(out);
    int keep = !close_after && c->rq->head.keep_alive && !c->eof && !c->env->stopping &&
               body_discardable(&c->rq->head);
    /* As on proxied responses: HTTP/1.0 keeps alive only when told so. */
    int conn = !keep ? REPLY_CLOSE : c->rq->head.minor == 0 ? REPLY_KEEP_SAID : REPLY_KEEP;
    struct evbuffer *tmp = c->rq->head_request ? evbuffer_new() : NULL;
    const struct request *rq = c->rq;
    int64_t retry_ms = status == 503 && rq->rt ? backend_retry_ms(runtime_backend(rq->rt)) : 0;
    if (rq->grpc && !c->decision) {     /* an answer a gRPC client reads: Trailers-Only */
        const struct conf_limit *l = status == 429 ? rq->dec.rl.limit[rq->dec.rl.shown] : NULL;
        int code = reply_grpc_code(status, rq->route ? rq->route->grpc_limited
                                                     : REPLY_GRPC_RESOURCE_EXHAUSTED);
        const char *name = l ? (l->message ? l->message : "rate_limited")
                             : rq->error_name ? rq->error_name : reply_error_name(status);
        reply_grpc(tmp ? tmp : out, code, name, l ? &rq->dec.rl : NULL, retry_ms, conn,
                   rq->rid, rq->rid_len);
        if (rq->log)
            rq->log->grpc_status = code;
        metrics_grpc(request_metrics(c), code);
        status = 200;
    } else if (status == 429) { /* the denial: sent with its own status */
        status = limited_status(c);
        reply_limited_as(tmp ? tmp : out, &rq->dec.rl, status, conn, rq->rid, rq->rid_len);
    } else if (status == 200) { /* decision mode's "go on" */
        reply_allowed(tmp ? tmp : out, rq->dec.have_limits ? &rq->dec.rl : NULL, conn, rq->rid,
                      rq->rid_len);
    } else if (status == 503) { /* limiter_unavailable: try again after the backoff */
        reply_unavailable(tmp ? tmp : out, retry_ms, conn, rq->rid, rq->rid_len);
    } else {
        reply_error_named(tmp ? tmp : out, status, c->rq->error_name, conn, rq->rid, rq->rid_len);
    }
    c->rq->error_name = NULL;
    if (tmp) {
        move_reply_head(tmp, out);
        evbuffer_free(tmp);
    }
    if (!answer_sent(c, status, out_before, keep))
        return;
    c->rq->body_bytes = 0;
    if (c->rq->head.body == HTTP1_BODY_NONE) {
        c->rq->req_done = 1;
        c->ops->request_done(c);
    } else {        /* the rest of the body, with no gap over body_timeout */
        conn_timer(c, TM_BODY, c->conf->client.body_timeout_ms);
    }
}

/* A local error answer that names its reason in the JSON body. */
/* A head that is not a request (a parse error, or an HTTP/2 header list
 * that could not become one): answered and logged with no method or path,
 * then the connection (or stream) ends. */
void request_refuse_head(struct client *c, int status)
{
    request_log_begin(c, 0);
    request_answer(c, status, 1);
}

void request_answer_named(struct client *c, int status, const char *name, int close_after)
{
    c->rq->error_name = name;
    request_answer(c, status, close_after);
}

/* A request-level failure after the response may have started: answer if
 * nothing was sent, otherwise cut the connection (never a short response
 * that looks complete). */
void request_fail(struct client *c, int status)
{
    decide_release(&c->rq->dec);    /* the upstream failed: its slots go back now */
    if (c->rq->up) {
        upstream_close(c->rq->up);
        c->rq->up = NULL;
    }
    if (!c->rq->resp_started) {
        request_answer(c, status, 1);     /* body state unknown: close */
    } else {
        conn_kill(c);
    }
}

_Static_assert(METRICS_NJWT == METRICS_JWT_FAILED + JWT_BAD_AUDIENCE + 1,
              "metrics.h counts every jwt_status");

/* A route that reads tokens: the request's token verified through the
 * worker's cache and its claims copied into the request, which owns them
 * (a cache entry may go while the request waits). Without a valid token
 * the request is anonymous, or, under require_jwt, answered 401 (-1). */
static int request_jwt(struct client *c)
{
    struct request *rq = c->rq;
    const struct conf_jwt *j = &c->conf->jwt;
    struct jwt_rules rules = { j->issuer, j->audience, j->leeway_s };
    struct route_req req = { rq->hbuf, &c->rq->head };
    const char *tok, *claims;
    size_t len, claims_len;
    int hit = 0, st = -1;
    int found = route_jwt_token(c->conf, &req, &tok, &len);
    if (found == 1)
        st = jwtcache_verify(c->env->jwt, j->keys, &rules, tok, len, clock_wall_us() / 1000000,
                             &claims, &claims_len, &hit);
    metrics_jwt(found == 0 ? METRICS_JWT_MISSING : found < 0 ? METRICS_JWT_TWICE
                : st != JWT_OK ? METRICS_JWT_FAILED + st
                : hit ? METRICS_JWT_CACHED : METRICS_JWT_VERIFIED);
    if (st == JWT_OK) {
        /* one byte more: a token without claims still has a buffer */
        memcpy(grow(&rq->claims, &rq->claims_cap, claims_len + 1), claims, claims_len);
        rq->claims_len = claims_len;
        rq->jwt_ok = 1;
        return 0;
    }
    if (!rq->route->require_jwt)
        return 0;
    request_answer_named(c, 401, found == 0 ? "missing_token" : "invalid_token", 0);
    return -1;
}

/* ---- request head ------------------------------------------------------ */

static int rid_acceptable(const char *v, size_t n)
{
    if (n == 0 || n > REQUEST_RID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x21 || v[i] > 0x7e)
            return 0;
    return 1;
}

/* 64 random bits from the worker's xorshift128+ generator (not for
 * secrets), kept in its conn_env. */
static uint64_t request_random(struct conn_env *env)
{
    uint64_t x = env->rng[0], y = env->rng[1];
    env->rng[0] = y;
    x ^= x << 23;
    env->rng[1] = x ^ y ^ (x >> 17) ^ (y >> 26);
    return env->rng[1] + y;
}

/* The client's X-Request-Id when it is sane, otherwise a new one. */
static void set_request_id(struct client *c)
{
    int i = http1_find(c->rq->hbuf, &c->rq->head, "x-request-id", 0);
    if (i >= 0 && http1_find(c->rq->hbuf, &c->rq->head, "x-request-id", i + 1) < 0) {
        const char *v = hb(c, c->rq->head.h[i].value);
        size_t n = c->rq->head.h[i].value.len;
        if (rid_acceptable(v, n)) {
            memcpy(c->rq->rid, v, n);
            c->rq->rid_len = n;
            return;
        }
    }
    new_request_id(c);
}

/* 32 random hex digits from the worker's generator. */
static void new_request_id(struct client *c)
{
    uint64_t a = request_random(c->env), b = request_random(c->env);
    hex_u32_le8(c->rq->rid, (uint32_t)a);
    hex_u32_le8(c->rq->rid + 8, (uint32_t)(a >> 32));
    hex_u32_le8(c->rq->rid + 16, (uint32_t)b);
    hex_u32_le8(c->rq->rid + 24, (uint32_t)(b >> 32));
    c->rq->rid_len = 32;
}

/* A path_regex hit its match limit before it could tell whether it meets
 * the path: 400 regex_limit, counted on that route. The request was well
 * formed and its cost bounded, so the connection stays open. */
static void regex_over_limit(struct client *c)
{
    metrics_regex_limit(c->rq->caps.over_limit->metrics);
    request_answer_named(c, 400, "regex_limit", 0);
}

void request_head(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    size_t len = evbuffer_get_length(in);
    size_t max = c->conf->client.max_header_bytes;
    if (len == 0)
        return;
    if (c->timer_mode != TM_HEADER)
        conn_timer(c, TM_HEADER, c->conf->client.header_timeout_ms);
    size_t n = len > max + 1 ? max + 1 : len;
    const char *data = (const char *)evbuffer_pullup(in, (ssize_t)n);
    int rc = http1_head_feed(c->parser, data, n, max, 0, &c->rq->head);
    if (rc == 1)
        return;
    decide_cancel(&c->rq->dec);      /* none can be pending between requests */
    request_reset(c->rq);
    c->rq->hbuf = data;
    c->rq->head_in_input = 1;
    if (rc != 0) {
        request_refuse_head(c, rc);
        return;
    }
    conn_timer(c, TM_NONE, 0);
    struct conn_env *env = c->env;
    metrics_worker_request(env->id);
    metrics_count(c->h2_stream ? METRICS_REQUESTS_HTTP2 : METRICS_REQUESTS_HTTP1);
    /* The request keeps the runtime it starts with (config, pools,
     * backend) until it is done, whatever a reload does meanwhile. */
    runtime_release(c->rq->rt);
    c->rq->rt = runtime_retain(env->rt);
    if (env->conf != c->conf) {   /* a reload happened: new requests see it */
        conf_release(c->conf);
        c->conf = env->conf;
        conf_retain(c->conf);
    }
    c->keep_alive = c->rq->head.keep_alive && !env->stopping;
    c->state = CS_DECIDE;

    const struct http1_head *h = &c->rq->head;
    c->rq->head_request = h->method.len == 4 && memcmp(hb(c, h->method), "HEAD", 4) == 0;
    set_request_id(c);
    request_address(c);
    /* Connection naming the framing or Host (smuggling), or a '_' name
     * under underscore_headers: reject. */
    if (h1write_request_check(c->rq->hbuf, h, c->conf->client.underscore_headers) != 0) {
        request_log_begin(c, 1);
        request_answer(c, 400, 1);
        return;
    }
    /* Decision mode: the head becomes the described request's (the log's
     * method and path too). */
    if (c->decision && !decision_view(c))
        return;
    request_log_begin(c, 1);
    char *path = request_path_room(c->rq, h->target.len);
    long plen = route_normalize_paths(c->conf, hb(c, h->target), h->target.len, path);
    if (plen < 0) {
        request_answer(c, 400, 1);
        return;
    }
    c->rq->path_len = (size_t)plen;
    const char *host = h->host >= 0 ? hb(c, h->h[h->host].value) : NULL;
    size_t hostlen = h->host >= 0 ? h->h[h->host].value.len : 0;
    if (host != NULL && route_host_check(host, hostlen) < 0) {
        request_answer_named(c, 400, "bad_host", 1);
        return;
    }
    int64_t grpc_ms;
    c->rq->grpc = route_grpc_call(c->rq->hbuf, h, &grpc_ms);
    if (grpc_ms > 0)
        c->rq->grpc_deadline_ms = clock_ms() + grpc_ms;
    c->rq->route = route_match_in(c->conf, (c->decision ? 0 : ROUTE_PROXIED) |
                                  (c->rq->grpc ? ROUTE_GRPC : 0), path, (size_t)plen,
                                  hb(c, h->method), h->method.len, host, hostlen, &c->rq->caps);
    if (c->rq->route == NULL && c->rq->caps.over_limit) {
        regex_over_limit(c);
        return;
    }
    if (c->rq->route == NULL) {
        request_answer(c, 404, 0);
        return;
    }
    /* Only the route's protocols (WebSocket by default) are tunnelled; any
     * other Upgrade (h2c) goes up as a plain request without it. */
    c->rq->upgrade = h->upgrade && c->rq->route->upgrade && h->body == HTTP1_BODY_NONE &&
                     h1write_upgrade_ok(c->rq->hbuf, h, c->rq->route->upgrade_protos,
                                        c->rq->route->nupgrade_protos);
    uint64_t max_body = c->conf->client.max_body_bytes;
    if (max_body && h->body == HTTP1_BODY_LENGTH && h->content_length > max_body) {
        request_answer(c, 413, 1);
        return;
    }
    if (c->rq->route->uses_jwt && request_jwt(c) < 0)
        return;
    if (c->rq->route->body_estimate && exchange_buffer_first(c, &request_exchange_ops))
        return;                     /* request_buffered decides */
    decide(c);
}

/* ---- decision mode ----------------------------------------------------- */

/* A decision listener's request (docs/decision.md): c->rq->head becomes the
 * view of the request the gateway describes (fwdauth.h), and the request
 * goes on the ordinary way (route, keys, decide) to be answered, never
 * forwarded: decided() answers 200 for "go on", request_answer() the
 * denial with decision.deny_status. 0 when it was answered here. */
static int decision_view(struct client *c)
{
    const char *error = NULL;
    switch (fwdauth_describe(c->conf, c->rq->hbuf, &c->rq->head, &error)) {
    case FWDAUTH_DESCRIBED:
        return 1;
    case FWDAUTH_RLS:
        request_log_begin(c, 1);
        rls_begin(c);
        return 0;
    case FWDAUTH_NOT_FOUND:
        request_log_begin(c, 1);
        request_answer(c, 404, 0);
        return 0;
    case FWDAUTH_BAD:
        request_log_begin(c, 1);
        request_answer_named(c, 400, error, 0);
        return 0;
    }
    abort();
}

/* ---- Envoy's RLS v3 (gRPC) on the decision listener ------------------- */

/* The answer of the call in c->rq->rls, as HTTP/1.1 that the HTTP/2 layer
 * turns into gRPC's frames: 200, application/grpc, the framed message as
 * a chunked body and grpc-status 0 in the trailer; an error as a bodyless
 * 200 with grpc-status and grpc-message (gRPC's Trailers-Only). */
static void rls_reply(struct client *c)
{
    const uint8_t *msg = NULL;
    size_t len = 0;
    const char *why = NULL;
    int status = rls_answer(c->rq->rls, &msg, &len, &why);
    struct evbuffer *out = io_output(c->io);
    size_t before = evbuffer_get_length(out);
    int keep = c->rq->req_done && c->rq->head.keep_alive && !c->eof && !c->env->stopping &&
               c->rq->head.minor >= 1;
    if (status != 0) {      /* Trailers-Only, as every local gRPC answer */
        reply_grpc(out, status, why ? why : "", NULL, 0, keep ? REPLY_KEEP : REPLY_CLOSE,
                   c->rq->rid, c->rq->rid_len);
    } else {
        evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n"
                            "X-Request-Id: %.*s\r\n%sTransfer-Encoding: chunked\r\n\r\n%zx\r\n",
                            (int)c->rq->rid_len, c->rq->rid, keep ? "" : "Connection: close\r\n",
                            len);
        evbuffer_add(out, msg, len);
        static const char end[] = "\r\n0\r\ngrpc-status: 0\r\n\r\n";
        evbuffer_add(out, end, sizeof end - 1);
    }
    if (answer_sent(c, 200, before, keep))
        c->ops->request_done(c);
}

static void rls_done_cb(void *arg)
{
    struct client *c = arg;
    conn_enter(c);
    rls_reply(c);
    if (!c->dead)
        c->ops->process(c);
    conn_leave(c);
}

static void rls_body(struct client *c, const uint8_t *body, size_t len, int over)
{
    if (c->rq->rls == NULL)
        c->rq->rls = rls_call_new();
    if (over) {
        /* the rest of the body is not read: answered, then closed */
        c->rq->req_done = 0;
        rls_refuse(c->rq->rls, RLS_GRPC_RESOURCE_EXHAUSTED,
                   "the request message is larger than 64 KiB");
        rls_reply(c);
        return;
    }
    struct rls_env env = { runtime_backend(c->rq->rt), c->env->local, c->env->deny };
    if (rls_start(c->rq->rls, &env, c->conf, body, len, rls_done_cb, c)) {
        rls_reply(c);
        return;
    }
    c->state = CS_DECIDE;       /* rls_done_cb answers */
}

/* The body a decision waited for is in. */
static void request_buffered(struct client *c)
{
    c->state = CS_DECIDE;
    decide(c);
}

/* What the exchange reports back to the request. */
static const struct exchange_ops request_exchange_ops = {
    .answer = request_answer,
    .fail = request_fail,
    .drain_head = request_drain_head,
    .refresh_head = request_refresh_head,
    .consume_counted = request_consume_counted,
    .count_response = request_count_response,
    .count_out = request_count_out,
    .buffered = request_buffered,
    .body_read = rls_body,              /* exchange_read_body's: RLS calls */
};

/* A ShouldRateLimit call: a POST of application/grpc (or +proto); its
 * message is read whole (at most RLS_MAX_MESSAGE), then decided. */
static void rls_begin(struct client *c)
{
    const struct http1_head *h = &c->rq->head;
    int ct = http1_find(c->rq->hbuf, h, "content-type", 0);
    const char *v = ct >= 0 ? hb(c, h->h[ct].value) : NULL;
    size_t vlen = ct >= 0 ? h->h[ct].value.len : 0;
    int grpc = vlen >= 16 && strncasecmp(v, "application/grpc", 16) == 0 &&
               (vlen == 16 || v[16] == '+' || v[16] == ';');
    if (!(h->method.len == 4 && memcmp(hb(c, h->method), "POST", 4) == 0)) {
        request_answer(c, 405, 0);
        return;
    }
    if (!grpc) {
        request_answer(c, 415, 0);
        return;
    }
    exchange_read_body(c, &request_exchange_ops, RLS_MAX_MESSAGE + 5);
}

/* ---- decision ---------------------------------------------------------- */

/* The verdict is in: forward, or answer. */
static void decided(struct client *c, int verdict)
{
    if (verdict != DECIDE_FORWARD)
        exchange_buffer_drop(c);    /* a body buffered for the decision */
    if (c->decision && c->rq->dec.decision >= 0)
        metrics_decision_mode((enum metrics_decision)c->rq->dec.decision);
    switch (verdict) {
    case DECIDE_FORWARD:
        if (c->decision)
            request_answer(c, 200, 0);      /* the gateway's request may go on */
        else
            exchange_start(c, &request_exchange_ops);
        break;
    case DECIDE_LIMITED:
        request_answer(c, 429, 0);
        break;
    case DECIDE_UNAVAILABLE:
        request_answer(c, 503, 0);
        break;
    case DECIDE_AMBIGUOUS:      /* the connection stays open: the head itself was fine */
        request_answer_named(c, 400, "ambiguous_key", 0);
        break;
    case DECIDE_MISSING_KEY:
        request_answer_named(c, 400, "missing_key", 0);
        break;
    case DECIDE_BAD_KEY:
        request_answer_named(c, 400, "bad_key", 0);
        break;
    case DECIDE_BAD_COST:
        request_answer_named(c, 400, NULL, 0);
        break;
    }
}

static void request_decided(void *arg, int verdict)
{
    struct client *c = arg;
    conn_enter(c);
    request_refresh_head(c);
    decided(c, verdict);
    if (!c->dead)
        c->ops->process(c);
    conn_leave(c);
}

/* The consumption is recorded (or failed): the response may go on. */
static void counted_cb(void *arg, int verdict)
{
    struct client *c = arg;
    conn_enter(c);
    if (c->rq->up)
        io_enable(c->rq->up->io, EV_READ);
    exchange_resume(c);
    conn_leave(c);
}

/* The response status is known: limits whose count_status lists it
 * consume now. The response (and its body) waits for that call, so the
 * client's next attempt (on any worker) is decided after it. Returns 1
 * while it waits. */
int request_consume_counted(struct client *c, int status)
{
    if (!decide_count_status(&c->rq->dec, status, counted_cb, c))
        return 0;
    io_disable(c->rq->up->io, EV_READ);
    return 1;
}

/* A delay holds the request: nothing reads the client meanwhile (client.c
 * stops at what it has while deciding), but a client that goes away is
 * noticed at once, and its reservation given back (client_event_cb). */
static void request_holding(void *arg)
{
    struct client *c = arg;
    io_watch_end(c->io, 1);
}

static void decide(struct client *c)
{
    struct request *rq = c->rq;
    struct decide_env env = { runtime_backend(rq->rt), c->env->local, c->env->deny,
                              c->env->base, request_holding };
    struct route_req req = { c->rq->hbuf, &c->rq->head, rq->ip, rq->ip_len, rq->path, rq->path_len,
                             c->rq->route->regex ? &rq->caps : NULL,
                             rq->jwt_ok ? rq->claims : NULL, rq->claims_len, NULL, 0 };
    req.body = exchange_buffered(c, &req.body_len);
    int v = decide_start(&rq->dec, &env, c->conf, c->rq->route, &req, request_decided, c);
    if (v != DECIDE_PENDING)
        decided(c, v);
}

void request_discard_body(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    while (!c->rq->req_done) {
        size_t payload;
        int rc = conn_pump_once(c->parser, in, NULL, &payload);
        c->rq->body_bytes += payload;
        if (rc < 0 || c->rq->body_bytes > REQUEST_DISCARD_MAX) {
            conn_close_after_write(c);
            return;
        }
        if (rc == 0)
            return;
        if (rc == 1) {
            c->rq->req_done = 1;
            c->ops->request_done(c);    /* may give c->rq back: done with it */
            return;
        }
    }
}

