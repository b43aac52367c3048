/* sluice - proxy.c: a client connection and the way each request takes.
 *
 *   client ──bytes──▶ parse head (http1) ──▶ normalise + route (route)
 *                                               │
 *                      404 ◀── no route ────────┤
 *                                               ▼
 *                        keys (route) ──▶ one EVALSHA (store) ──▶ Redis
 *                                               │
 *            429 + headers ◀── denied ──────────┤
 *            on_error (allow / 503) ◀── down ───┤
 *                                               ▼ allowed
 *        upstream pool (upstream) ◀── head + streamed body
 *                 │
 *                 └──▶ response head + rate-limit fields + streamed body ──▶ client
 *
 * One request is handled at a time per connection; pipelined requests wait
 * in the input buffer, which keeps responses in order. Bodies move between
 * evbuffers piece by piece (http1 reports where payload is); only a small
 * request body is held whole, before an upstream connection is taken.
 * Callbacks never free a client directly: they mark it dead and the
 * outermost callback frees it when the stack unwinds. */
#include <arpa/inet.h>
#include <assert.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "accesslog.h"
#include "backend.h"
#include "denycache.h"
#include "h1write.h"
#include "http1.h"
#include "log.h"
#include "mem.h"
#include "memstore.h"
#include "metrics.h"
#include "obuf.h"
#include "proxy.h"
#include "reply.h"
#include "route.h"
#include "runtime.h"
#include "store.h"
#include "upstream.h"
#include "worker.h"

/* Output above this stops reading the other side until it drains: what a
 * peer that does not read holds in sluice, per direction (about nginx's
 * proxy_buffers), plus at most one read or one decoded run. */
#define PROXY_HIGH_WATER   (64 * 1024)
/* Input kept from a client beyond the request being served (pipelining). */
#define PROXY_INPUT_MAX    (64 * 1024)
/* A rejected request's body is read and dropped up to this size so the
 * connection can stay open; a larger one closes it. */
#define PROXY_DISCARD_MAX  (1024 * 1024)
#define PROXY_RESP_HEAD_MAX (64 * 1024)
/* A client's X-Request-Id is kept when it is this long at most and only
 * visible ASCII; otherwise sluice makes its own. */
#define PROXY_RID_MAX 128
/* Interim (1xx) responses relayed to a client per request; more are read
 * and dropped, within the upstream timeout counted across all of them. */
#define PROXY_INTERIM_RELAYED 10

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

/* What the access-log line needs once the head is gone. */
#define PROXY_LOG_TARGET_MAX 1024
struct reqlog {
    int64_t wall_us, start_us, upstream_us;
    int status;
    int decision;                       /* enum metrics_decision, or -1 */
    uint64_t bytes_in, bytes_out;
    int active;                         /* a request is being served */
    size_t method_len, target_len, client_len;
    char client[ROUTE_IP_MAX];
    char method[32];
    char target[PROXY_LOG_TARGET_MAX];
};

/* Limits with count_status were only checked before forwarding; their keys
 * wait here for the response status that decides whether they consume. */
struct counted {
    int n;
    const struct conf_limit *limit[STORE_MAX_LIMITS];
    int64_t cost[STORE_MAX_LIMITS];
    size_t off[STORE_MAX_LIMITS], len[STORE_MAX_LIMITS];
    char keys[];
};

struct client {
    struct worker *w;
    struct client *prev, *next;         /* worker's list */
    struct conf *conf;                  /* retained */
    struct runtime *rt;                 /* retained from head to request_finish */
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
    struct store_call *call;
    struct store_call *count_call;      /* count_status consumption in flight */
    struct reply_limits rl;
    int have_limits;
    struct upstream_conn *up;
    int retried;
    int head_request;                   /* method HEAD: response has no body */
    int upgrade;                        /* Upgrade request on an upgrade route */
    struct route_captures caps;         /* path_regex groups */
    struct counted *counted;            /* count_status limits, until the status is known */
    struct reqlog *reqlog;              /* access-log facts; NULL when logging is off */
    const char *error_name;             /* JSON error of the next local answer; NULL: the status's */
    char rid[PROXY_RID_MAX + 1];        /* X-Request-Id, sent up and back */
    size_t rid_len;
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
    int64_t redis_start_us;             /* when the decision was sent */
    int64_t upstream_start_us;          /* when the request was forwarded */
    int64_t up_deadline_ms;             /* response head due by then; 0: not yet */
    int interims;                       /* 1xx heads read for this request */
    int interims_relayed;
};

static void client_process(struct client *c);
static void request_finish(struct client *c);
static void forward(struct client *c);
static void decide(struct client *c, size_t pathlen);
static void reqlog_end(struct client *c);
static const char *hb(const struct client *c, struct http1_span s);

/* ---- lifetime ---------------------------------------------------------- */

static void client_free(struct client *c)
{
    struct worker *w = c->w;
    if (c->call)
        store_cancel(c->call);
    if (c->count_call)
        store_cancel(c->count_call);
    if (c->up)
        upstream_close(c->up);
    free(c->counted);
    free(c->reqlog);
    if (c->prev)
        c->prev->next = c->next;
    else
        w->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    w->nclients--;
    metrics_gauge_add(METRICS_CONN_CLIENT, -1);
    event_free(c->timer);
    bufferevent_free(c->bev);
    http1_destroy(c->parser);
    if (c->body)
        evbuffer_free(c->body);
    if (c->held)
        evbuffer_free(c->held);
    conf_release(c->conf);
    runtime_release(c->rt);
    free(c);
    if (w->stopping && w->nclients == 0)
        worker_drained(w);
}

static void client_enter(struct client *c)
{
    c->busy++;
}

static void client_flush(struct client *c);
static void out_idle(struct bufferevent *bev);

/* Returns 1 when the client was freed. The outermost callback also writes
 * what the others queued (client_flush). */
static int client_leave(struct client *c)
{
    if (c->busy == 1 && !c->dead)
        client_flush(c);
    if (--c->busy == 0 && c->dead) {
        client_free(c);
        return 1;
    }
    return 0;
}

static void client_kill(struct client *c)
{
    reqlog_end(c);      /* a request cut short is logged with what was sent */
    c->dead = 1;
    if (c->call) {
        store_cancel(c->call);
        c->call = NULL;
    }
    if (c->count_call) {
        store_cancel(c->count_call);
        c->count_call = NULL;
    }
    if (c->up) {
        upstream_close(c->up);
        c->up = NULL;
    }
}

static void client_timer(struct client *c, enum timer_mode mode, int64_t ms)
{
    c->timer_mode = mode;
    if (mode == TM_NONE) {
        event_del(c->timer);
        return;
    }
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    event_add(c->timer, &tv);
}

/* Stop reading requests and close once what is queued has been written. */
static void client_close_after_write(struct client *c)
{
    reqlog_end(c);
    c->state = CS_CLOSING;
    c->keep_alive = 0;
    client_timer(c, TM_NONE, 0);
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        client_kill(c);
}

/* ---- small helpers ----------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static struct metrics_route *client_metrics(const struct client *c)
{
    return c->route ? c->route->metrics : metrics_unrouted();
}

/* The client's address as text: the peer's, computed once per connection,
 * unless the peer is a trusted proxy whose X-Forwarded-For must be read for
 * each request. Returns a pointer to the text (buf or the connection's). */
static const char *client_ip(struct client *c, char *buf, size_t *len)
{
    const struct conf *conf = c->conf;
    if (conf->ntrusted == 0 ||
        !conf_cidr_match(conf->trusted, conf->ntrusted, (const struct sockaddr *)&c->peer)) {
        *len = c->peer_len;
        return c->peer_text;
    }
    *len = route_client_ip(conf, (const struct sockaddr *)&c->peer, c->hbuf, &c->head, buf);
    return buf;
}

static void count_decision(struct client *c, enum metrics_decision d)
{
    metrics_request(c->route->metrics, d);
    if (c->reqlog)
        c->reqlog->decision = (int)d;
}

static void count_response(struct client *c, int status)
{
    metrics_response(client_metrics(c), status);
    if (c->reqlog)
        c->reqlog->status = status;
}

static void count_out(struct client *c, uint64_t n)
{
    if (c->reqlog)
        c->reqlog->bytes_out += n;
}

/* One access-log line for the request in progress, once. */
static void reqlog_end(struct client *c)
{
    static const char *const decisions[] = { "allowed", "limited", "shadow_limited", "error" };
    struct reqlog *rq = c->reqlog;
    if (rq == NULL || !rq->active)
        return;
    rq->active = 0;
    const struct limiter_result *r = c->have_limits ? &c->rl.r[c->rl.shown] : NULL;
    struct accesslog_entry e = {
        .time_us = rq->wall_us,
        .client = rq->client, .client_len = rq->client_len,
        .method = rq->method, .method_len = rq->method_len,
        .path = rq->target, .path_len = rq->target_len,
        .status = rq->status,
        .route = c->route ? c->route->name : NULL,
        .decision = rq->decision >= 0 ? decisions[rq->decision] : NULL,
        .limit = r ? c->rl.limit[c->rl.shown]->name : NULL,
        .remaining = r ? r->remaining : -1,
        .upstream_us = rq->upstream_us,
        .total_us = now_us() - rq->start_us,
        .bytes_in = rq->bytes_in, .bytes_out = rq->bytes_out,
        .request_id = c->rid, .request_id_len = c->rid_len,
    };
    accesslog_write(c->w->alog, &e);
}

/* A head arrived: note what the log line will need. A head that did not
 * parse (parsed = 0) is logged without method and target. */
static void reqlog_begin(struct client *c, int parsed)
{
    if (c->w->alog == NULL)
        return;
    if (c->reqlog == NULL)
        c->reqlog = mem_alloc(sizeof(*c->reqlog));
    struct reqlog *rq = c->reqlog;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rq->wall_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    rq->start_us = now_us();
    rq->upstream_us = -1;
    rq->status = 0;
    rq->decision = -1;
    rq->active = 1;
    rq->bytes_out = 0;
    if (!parsed) {
        rq->bytes_in = 0;
        rq->method_len = rq->target_len = 0;
        rq->client_len = route_client_ip(c->conf, (const struct sockaddr *)&c->peer, NULL,
                                         NULL, rq->client);
        return;
    }
    rq->bytes_in = c->head.len;
    rq->method_len = c->head.method.len < sizeof(rq->method) ? c->head.method.len : sizeof(rq->method);
    memcpy(rq->method, hb(c, c->head.method), rq->method_len);
    rq->target_len = c->head.target.len < sizeof(rq->target) ? c->head.target.len : sizeof(rq->target);
    memcpy(rq->target, hb(c, c->head.target), rq->target_len);
    const char *ip = client_ip(c, rq->client, &rq->client_len);
    if (ip != rq->client)
        memcpy(rq->client, ip, rq->client_len + 1);
}

static const char *hb(const struct client *c, struct http1_span s)
{
    return c->hbuf + s.off;
}

/* Reading more input may move bytes already in the buffer (libevent
 * realigns chains), so the head's address is taken again after every
 * wait before its spans are read. */
static void refresh_head(struct client *c)
{
    if (c->head_in_input)
        c->hbuf = (const char *)evbuffer_pullup(bufferevent_get_input(c->bev),
                                                (ssize_t)c->head.len);
}

static int span_int(const char *buf, struct http1_span v, int64_t *out)
{
    if (v.len == 0 || v.len > 18)
        return 0;
    int64_t n = 0;
    for (uint32_t i = 0; i < v.len; i++) {
        char ch = buf[v.off + i];
        if (ch < '0' || ch > '9')
            return 0;
        n = n * 10 + (ch - '0');
    }
    *out = n;
    return 1;
}

static void drain_head(struct client *c)
{
    if (c->head_in_input) {
        evbuffer_drain(bufferevent_get_input(c->bev), c->head.len);
        c->head_in_input = 0;
        c->hbuf = NULL;
    }
}

static int span_is(const char *buf, struct http1_span s, const char *lit)
{
    size_t n = strlen(lit);
    return s.len == n && strncasecmp(buf + s.off, lit, n) == 0;
}

static void add_hex(struct evbuffer *out, size_t n)
{
    char tmp[20];
    char *p = tmp + sizeof(tmp);
    *--p = '\n';
    *--p = '\r';
    do {
        *--p = "0123456789abcdef"[n & 15];
        n >>= 4;
    } while (n);
    evbuffer_add(out, p, (size_t)(tmp + sizeof(tmp) - p));
}

/* Bytes move from buffer to buffer by copying into the destination's own
 * chains, never by handing chains over: a socket read leaves its bytes in a
 * chain about twice their size, and a stalled peer's output made of such
 * chains would hold twice what PROXY_HIGH_WATER allows. */

/* Copy the payload pieces of run (the first `used` bytes of src) to dst, or
 * drop them when dst is NULL, then drop the run, framing included. */
static void move_pieces(struct evbuffer *src, struct evbuffer *dst, const char *run,
                        size_t used, const struct http1_piece *pieces, int n)
{
    for (int i = 0; dst && i < n; i++)
        evbuffer_add(dst, run + pieces[i].off, pieces[i].len);
    evbuffer_drain(src, used);
}

/* Feed one contiguous run of src's body bytes to parser p; the payload goes
 * to dst as is. Returns 1 when the message is complete, 0 to wait for more,
 * 2 when there may be more to do, -1 on a framing error. *payload gets the
 * payload bytes moved. */
static int pump_once(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                     size_t *payload)
{
    struct evbuffer_iovec v;
    struct http1_piece pieces[HTTP1_MAX_PIECES];
    int npieces = 0, done = 0;
    *payload = 0;
    if (evbuffer_peek(src, -1, NULL, &v, 1) < 1 || v.iov_len == 0)
        return 0;
    long used = http1_body_feed(p, v.iov_base, v.iov_len, pieces, &npieces, &done);
    if (used < 0)
        return -1;
    for (int i = 0; i < npieces; i++)
        *payload += pieces[i].len;
    move_pieces(src, dst, v.iov_base, (size_t)used, pieces, npieces);
    if (done)
        return 1;
    return used == 0 && npieces == 0 ? 0 : 2;
}

/* Append all of src to dst (copying, as above). A buffer may keep empty
 * chains a read reserved: only the length says when it is empty. */
static void move_all(struct evbuffer *dst, struct evbuffer *src)
{
    struct evbuffer_iovec v[8];
    size_t left;
    while ((left = evbuffer_get_length(src)) > 0) {
        int n = evbuffer_peek(src, (ev_ssize_t)left, NULL, v, 8);
        size_t total = 0;
        for (int i = 0; i < n && i < 8; i++) {
            evbuffer_add(dst, v[i].iov_base, v[i].iov_len);
            total += v[i].iov_len;
        }
        if (total == 0) {       /* only empty chains in view: hand them over */
            evbuffer_add_buffer(dst, src);
            return;
        }
        evbuffer_drain(src, total);
    }
}

/* Decode what src holds of a body into dst, about `room` payload bytes at
 * most (one run more): as is, or with chunked, as one chunk of our own
 * framing for all of it, so a body of 1-byte chunks goes on in chunks as
 * large as what arrived, not one chunk per byte. scratch is empty before and
 * after. Returns as pump_once; *payload gets the payload bytes moved. */
static int pump_body(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                     struct evbuffer *scratch, int chunked, size_t room, size_t *payload)
{
    struct evbuffer *to = chunked ? scratch : dst;
    int rc;
    assert(!chunked || evbuffer_get_length(scratch) == 0);
    *payload = 0;
    do {
        size_t n;
        rc = pump_once(p, src, to, &n);
        *payload += n;
    } while (rc == 2 && *payload < room);
    if (!chunked)
        return rc;
    size_t n = evbuffer_get_length(scratch);
    if (rc < 0) {
        evbuffer_drain(scratch, n);     /* a broken body goes no further */
        return rc;
    }
    if (n > 0) {
        add_hex(dst, n);
        move_all(dst, scratch);
        evbuffer_add(dst, "\r\n", 2);
    }
    if (rc == 1)
        evbuffer_add(dst, "0\r\n\r\n", 5);
    return rc;
}

/* The evbuffer *b, made on first use. */
static struct evbuffer *lazy_buffer(struct evbuffer **b)
{
    if (*b == NULL && (*b = evbuffer_new()) == NULL)
        abort();    /* only on allocation failure */
    return *b;
}

/* ---- local answers ----------------------------------------------------- */

/* The request's body can be dropped (rather than closing) after a local
 * answer when it is announced small enough or chunked. */
static int body_discardable(const struct http1_head *h)
{
    return h->body == HTTP1_BODY_NONE || h->body == HTTP1_BODY_CHUNKED ||
           (h->body == HTTP1_BODY_LENGTH && h->content_length <= PROXY_DISCARD_MAX);
}

/* A HEAD gets the head of our answer alone (the client reads no body
 * after it): the reply, written to tmp, moves to out up to its empty line. */
static void move_reply_head(struct evbuffer *tmp, struct evbuffer *out)
{
    struct evbuffer_ptr end = evbuffer_search(tmp, "\r\n\r\n", 4, NULL);
    if (end.pos >= 0)
        evbuffer_remove_buffer(tmp, out, (size_t)end.pos + 4);
}

/* Answer the current request ourselves: an error, or with rl set, a 429. */
static void answer_local(struct client *c, int status, int close_after)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t out_before = evbuffer_get_length(out);
    int keep = !close_after && c->head.keep_alive && !c->eof && !c->w->stopping &&
               body_discardable(&c->head);
    /* As on proxied responses: HTTP/1.0 keeps alive only when told so. */
    int conn = !keep ? REPLY_CLOSE : c->head.minor == 0 ? REPLY_KEEP_SAID : REPLY_KEEP;
    struct evbuffer *tmp = c->head_request ? evbuffer_new() : NULL;
    if (status == 429)
        reply_limited(tmp ? tmp : out, &c->rl, conn, c->rid, c->rid_len);
    else if (status == 503)     /* limiter_unavailable: try again after the backoff */
        reply_unavailable(tmp ? tmp : out, c->rt ? backend_retry_ms(runtime_backend(c->rt)) : 0, conn,
                          c->rid, c->rid_len);
    else
        reply_error_named(tmp ? tmp : out, status, c->error_name, conn, c->rid, c->rid_len);
    c->error_name = NULL;
    if (tmp) {
        move_reply_head(tmp, out);
        evbuffer_free(tmp);
    }
    if (status == 429)      /* a limit may answer with its own status */
        status = c->rl.limit[c->rl.shown]->status ? c->rl.limit[c->rl.shown]->status : 429;
    count_response(c, status);
    count_out(c, evbuffer_get_length(out) - out_before);
    c->resp_started = c->resp_done = 1;
    drain_head(c);
    if (!keep) {
        client_close_after_write(c);
        return;
    }
    c->keep_alive = 1;
    c->body_bytes = 0;
    c->state = CS_DISCARD;
    if (c->head.body == HTTP1_BODY_NONE) {
        c->req_done = 1;
        request_finish(c);
    }
}

/* A local error answer that names its reason in the JSON body. */
static void answer_named(struct client *c, int status, const char *name, int close_after)
{
    c->error_name = name;
    answer_local(c, status, close_after);
}

/* A request-level failure after the response may have started: answer if
 * nothing was sent, otherwise cut the connection (never a short response
 * that looks complete). */
static void fail_request(struct client *c, int status)
{
    if (c->up) {
        upstream_close(c->up);
        c->up = NULL;
    }
    if (!c->resp_started) {
        answer_local(c, status, 1);     /* body state unknown: close */
    } else {
        client_kill(c);
    }
}

/* ---- request head ------------------------------------------------------ */

static int rid_acceptable(const char *v, size_t n)
{
    if (n == 0 || n > PROXY_RID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x21 || v[i] > 0x7e)
            return 0;
    return 1;
}

/* The client's X-Request-Id when it is sane, otherwise 32 random hex digits
 * from the worker's generator. */
static void set_request_id(struct client *c)
{
    int i = http1_find(c->hbuf, &c->head, "x-request-id", 0);
    if (i >= 0 && http1_find(c->hbuf, &c->head, "x-request-id", i + 1) < 0) {
        const char *v = hb(c, c->head.h[i].value);
        size_t n = c->head.h[i].value.len;
        if (rid_acceptable(v, n)) {
            memcpy(c->rid, v, n);
            c->rid_len = n;
            return;
        }
    }
    static const char hex[] = "0123456789abcdef";
    uint64_t a = worker_random(c->w), b = worker_random(c->w);
    for (int k = 0; k < 16; k++) {
        c->rid[k] = hex[(a >> (4 * k)) & 15];
        c->rid[16 + k] = hex[(b >> (4 * k)) & 15];
    }
    c->rid_len = 32;
}

/* A path_regex hit its match limit before it could tell whether it meets
 * the path: 400 regex_limit, counted on that route. The request was well
 * formed and its cost bounded, so the connection stays open. */
static void regex_over_limit(struct client *c)
{
    metrics_regex_limit(c->caps.over_limit->metrics);
    answer_named(c, 400, "regex_limit", 0);
}

static void parse_head(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    size_t max = c->conf->client.max_header_bytes;
    if (len == 0)
        return;
    if (c->timer_mode != TM_HEADER)
        client_timer(c, TM_HEADER, c->conf->client.header_timeout_ms);
    size_t n = len > max + 1 ? max + 1 : len;
    const char *data = (const char *)evbuffer_pullup(in, (ssize_t)n);
    int rc = http1_head_feed(c->parser, data, n, max, 0, &c->head);
    if (rc == 1)
        return;
    c->hbuf = data;
    c->head_in_input = 1;
    if (rc != 0) {
        c->route = NULL;
        c->have_limits = 0;
        c->rid_len = 0;
        c->head_request = 0;
        reqlog_begin(c, 0);
        answer_local(c, rc, 1);
        return;
    }
    client_timer(c, TM_NONE, 0);
    struct worker *w = c->w;
    metrics_worker_request(w->id);
    if (w->conf != c->conf) {   /* a reload happened: new requests see it */
        conf_release(c->conf);
        c->conf = w->conf;
        conf_retain(c->conf);
    }
    runtime_release(c->rt);
    c->rt = runtime_retain(w->rt);
    c->route = NULL;
    c->have_limits = 0;
    c->up = NULL;
    c->retried = 0;
    free(c->counted);
    c->counted = NULL;
    c->req_done = c->resp_started = c->resp_done = 0;
    c->out_chunked = 0;
    c->body_bytes = 0;
    c->up_deadline_ms = 0;
    c->interims = c->interims_relayed = 0;
    c->keep_alive = c->head.keep_alive && !w->stopping;
    c->state = CS_DECIDE;

    const struct http1_head *h = &c->head;
    c->head_request = h->method.len == 4 && memcmp(hb(c, h->method), "HEAD", 4) == 0;
    c->upgrade = 0;
    set_request_id(c);
    reqlog_begin(c, 1);
    /* Connection naming the framing or Host (smuggling), or a '_' name
     * under underscore_headers: reject. */
    if (h1write_request_check(c->hbuf, h, c->conf->client.underscore_headers) != 0) {
        answer_local(c, 400, 1);
        return;
    }
    long plen = route_normalize_paths(c->conf, hb(c, h->target), h->target.len, w->path_buf);
    if (plen < 0) {
        answer_local(c, 400, 1);
        return;
    }
    const char *host = h->host >= 0 ? hb(c, h->h[h->host].value) : NULL;
    size_t hostlen = h->host >= 0 ? h->h[h->host].value.len : 0;
    if (host != NULL && route_host_check(host, hostlen) < 0) {
        answer_named(c, 400, "bad_host", 1);
        return;
    }
    c->route = route_match(c->conf, w->path_buf, (size_t)plen, hb(c, h->method),
                           h->method.len, host, hostlen, &c->caps);
    if (c->route == NULL && c->caps.over_limit) {
        regex_over_limit(c);
        return;
    }
    if (c->route == NULL) {
        answer_local(c, 404, 0);
        return;
    }
    /* Only the route's protocols (WebSocket by default) are tunnelled; any
     * other Upgrade (h2c) goes up as a plain request without it. */
    c->upgrade = h->upgrade && c->route->upgrade && h->body == HTTP1_BODY_NONE &&
                 h1write_upgrade_ok(c->hbuf, h, c->route->upgrade_protos,
                                    c->route->nupgrade_protos);
    uint64_t max_body = c->conf->client.max_body_bytes;
    if (max_body && h->body == HTTP1_BODY_LENGTH && h->content_length > max_body) {
        answer_local(c, 413, 1);
        return;
    }
    decide(c, (size_t)plen);
}

/* ---- decision ---------------------------------------------------------- */



/* cost_header: a whole number 1..1000000 replaces the route's cost; a
 * missing field keeps it; anything else is a bad request. */
static int request_cost(struct client *c, const char *name, int64_t *cost)
{
    int i = http1_find(c->hbuf, &c->head, name, 0);
    if (i < 0)
        return 0;
    int64_t v;
    if (http1_find(c->hbuf, &c->head, name, i + 1) >= 0 ||
        !span_int(c->hbuf, c->head.h[i].value, &v) || v < 1 || v > 1000000)
        return -1;
    *cost = v;
    return 0;
}

/* Build the keys of the route's limits for this request into the worker's
 * scratch, filling sl[] and c->rl.limit[]; returns how many count it, -1 for
 * a bad cost_header, ROUTE_KEY_AMBIGUOUS for a key source given twice. The
 * normalised path must be in w->path_buf. */
static int build_keys(struct client *c, size_t pathlen, struct store_limit *sl)
{
    struct worker *w = c->w;
    const struct conf_route *r = c->route;
    char buf[ROUTE_IP_MAX];
    size_t iplen;
    const char *ip = client_ip(c, buf, &iplen);
    struct route_req req = { c->hbuf, &c->head, ip, iplen, w->path_buf, pathlen,
                             c->route->regex ? &c->caps : NULL };
    int n = 0;
    for (int i = 0; i < r->nlimits && n < STORE_MAX_LIMITS; i++) {
        const struct conf_limit *l = &r->limits[i];
        long klen = route_key(c->conf, r, l, &req, w->keys[n]);
        if (klen == ROUTE_KEY_AMBIGUOUS)
            return ROUTE_KEY_AMBIGUOUS;
        if (klen <= 0)      /* a key source is absent: not counted */
            continue;
        int64_t cost = r->cost > 0 ? r->cost : 1;
        if (l->cost_header && request_cost(c, l->cost_header, &cost) < 0)
            return -1;
        unsigned flags = (l->shadow ? STORE_SHADOW : 0) |
                         (l->has_count_status ? STORE_CHECK_ONLY : 0);
        sl[n] = (struct store_limit){ w->keys[n], (size_t)klen, &l->params, cost, flags };
        c->rl.limit[n] = l;
        n++;
    }
    return n;
}

/* After a wait for Redis the worker's scratch has served other requests:
 * the keys are built again (normalising the path again first). Only the
 * rare paths need this: a denial, or a Redis failure. */
static int rebuild_keys(struct client *c, struct store_limit *sl)
{
    long plen = route_normalize_paths(c->conf, hb(c, c->head.target), c->head.target.len,
                                      c->w->path_buf);
    return plen < 0 ? -1 : build_keys(c, (size_t)plen, sl);
}

/* Redis denied: remember each denying key until its retry time; later
 * requests for the key stop at the cache. */
static void remember_denials(struct client *c, const struct store_result *res)
{
    struct worker *w = c->w;
    struct store_limit sl[STORE_MAX_LIMITS];
    if (rebuild_keys(c, sl) != res->n)
        return;
    int64_t now = now_ms();
    for (int i = 0; i < res->n; i++)
        if (!res->r[i].allowed && res->r[i].retry_ms > 0 && !(sl[i].flags & STORE_SHADOW))
            denycache_put(w->deny, sl[i].key, sl[i].keylen, now + res->r[i].retry_ms,
                          sl[i].cost);
}

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A decision is in: forward, or reject with the limits' fields. */
static void apply_decision(struct client *c, const struct store_result *res, int from_redis)
{
    memcpy(c->rl.r, res->r, sizeof(res->r[0]) * (size_t)res->n);
    reply_pick(&c->rl, res->allowed);
    c->have_limits = 1;
    if (res->allowed) {
        int shadow_denied = 0;
        for (int i = 0; i < res->n; i++)
            shadow_denied |= !res->r[i].allowed;    /* only shadow ones can */
        count_decision(c, shadow_denied ? METRICS_SHADOW_LIMITED : METRICS_ALLOWED);
        forward(c);
    } else {
        count_decision(c, METRICS_LIMITED);
        if (from_redis)
            remember_denials(c, res);
        answer_local(c, 429, 0);
    }
}

/* on_error local: decide in process instead. */
static int decide_locally(struct client *c, struct store_result *res)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    int n = rebuild_keys(c, sl);
    if (n <= 0)
        return -1;
    return memstore_decide(c->w->mem, sl, n, wall_us(), res);
}

/* A decision Redis did not answer (res NULL: not connected, nothing sent),
 * counted by reason. */
static void count_redis_error(const struct store_result *res)
{
    enum metrics_redis_error why = METRICS_REDIS_ERR_UNAVAILABLE;
    if (res != NULL)
        why = res->status == STORE_TIMEOUT ? METRICS_REDIS_ERR_TIMEOUT :
              res->status == STORE_OOM ? METRICS_REDIS_ERR_OOM : METRICS_REDIS_ERR_ERROR;
    metrics_redis_error(why);
}

/* Redis could not decide: on_error says what the request gets. */
static void apply_on_error(struct client *c)
{
    struct store_result res;
    switch (c->conf->redis.on_error) {
    case CONF_ON_ERROR_DENY:
        c->have_limits = 0;
        count_decision(c, METRICS_ERROR);
        answer_local(c, 503, 0);
        break;
    case CONF_ON_ERROR_LOCAL:
        if (decide_locally(c, &res) == 0) {
            apply_decision(c, &res, 0);
            break;
        }
        /* no local answer either: as allow */
        __attribute__((fallthrough));
    default:        /* allow: forwarded without rate-limit fields */
        c->have_limits = 0;
        count_decision(c, METRICS_ERROR);
        forward(c);
        break;
    }
}

static void decide_cb(void *arg, const struct store_result *res)
{
    struct client *c = arg;
    client_enter(c);
    c->call = NULL;
    refresh_head(c);
    metrics_observe(METRICS_REDIS_SECONDS, now_us() - c->redis_start_us);
    if (res->status != STORE_OK) {
        count_redis_error(res);
        apply_on_error(c);
    } else {
        apply_decision(c, res, 1);
    }
    if (!c->dead)
        client_process(c);
    client_leave(c);
}

static void save_counted(struct client *c, const struct store_limit *sl, int n)
{
    size_t total = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (sl[i].flags & STORE_CHECK_ONLY)
            total += sl[i].keylen, k++;
    if (k == 0)
        return;
    struct counted *ct = mem_alloc(sizeof(*ct) + total);
    size_t off = 0;
    ct->n = 0;
    for (int i = 0; i < n; i++) {
        if (!(sl[i].flags & STORE_CHECK_ONLY))
            continue;
        ct->limit[ct->n] = c->rl.limit[i];
        ct->cost[ct->n] = sl[i].cost;
        ct->off[ct->n] = off;
        ct->len[ct->n] = sl[i].keylen;
        memcpy(ct->keys + off, sl[i].key, sl[i].keylen);
        off += sl[i].keylen;
        ct->n++;
    }
    c->counted = ct;
}

static void resume_response(struct client *c);

/* The consumption is recorded (or failed): the response may go on. */
static void counted_done_cb(void *arg, const struct store_result *res)
{
    struct client *c = arg;
    client_enter(c);
    c->count_call = NULL;
    if (res->status != STORE_OK)
        count_redis_error(res);
    if (c->up)
        bufferevent_enable(c->up->bev, EV_READ);
    resume_response(c);
    client_leave(c);
}

/* The response status is known: limits whose count_status lists it consume
 * now, in one call of their own. The response waits for that call, so the
 * client's next attempt (on any worker) is decided after it. Returns 1
 * while it waits. */
static int consume_counted(struct client *c, int status)
{
    struct counted *ct = c->counted;
    struct store_limit sl[STORE_MAX_LIMITS];
    int n = 0;
    if (ct == NULL || status < 0 || status >= CONF_MAX_STATUS)
        return 0;
    for (int i = 0; i < ct->n; i++)
        if (ct->limit[i]->count_status[status])
            sl[n++] = (struct store_limit){ ct->keys + ct->off[i], ct->len[i],
                                            &ct->limit[i]->params, ct->cost[i],
                                            ct->limit[i]->shadow ? STORE_SHADOW : 0 };
    if (n > 0 && c->conf->backend == CONF_BACKEND_MEMORY) {
        struct store_result res;
        memstore_decide(c->w->mem, sl, n, wall_us(), &res);
    } else if (n > 0) {
        metrics_count(METRICS_REDIS_REQUESTS);
        c->count_call = store_decide(runtime_store(c->rt), sl, n, counted_done_cb, c);
        if (c->count_call == NULL)
            count_redis_error(NULL);
        else    /* hold the response (and its body) until the answer */
            bufferevent_disable(c->up->bev, EV_READ);
    }
    free(ct);
    c->counted = NULL;
    return c->count_call != NULL;
}

/* Is the client on the top-level or the route's allow list? */
static int client_allowed(struct client *c)
{
    const struct conf *conf = c->conf;
    if (conf->nallow == 0 && c->route->nallow == 0)
        return 0;
    char buf[ROUTE_IP_MAX];
    size_t iplen;
    const char *ip = client_ip(c, buf, &iplen);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else
        return 0;
    return conf_cidr_match(conf->allow, conf->nallow, (struct sockaddr *)&ss) ||
           conf_cidr_match(c->route->allow, c->route->nallow, (struct sockaddr *)&ss);
}

/* A key in the deny cache decides the request without Redis. */
static int denied_by_cache(struct client *c, const struct store_limit *sl, int n)
{
    struct worker *w = c->w;
    int64_t now = now_ms(), denied = 0;
    for (int i = 0; i < n; i++) {
        int64_t left = denycache_get(w->deny, sl[i].key, sl[i].keylen, now, sl[i].cost);
        struct limiter_result *r = &c->rl.r[i];
        r->limit = sl[i].params->limit;
        r->allowed = left == 0;
        r->remaining = left ? 0 : r->limit;
        r->reset_ms = r->retry_ms = left;
        denied |= left;
    }
    return denied != 0;
}

static void decide(struct client *c, size_t pathlen)
{
    struct store_limit sl[STORE_MAX_LIMITS];
    c->rl.route = c->route;
    if (client_allowed(c)) {        /* allow lists bypass limiting */
        count_decision(c, METRICS_ALLOWED);
        forward(c);
        return;
    }
    int n = build_keys(c, pathlen, sl);
    if (n < 0) {    /* the connection stays open: the head itself was fine */
        answer_named(c, 400, n == ROUTE_KEY_AMBIGUOUS ? "ambiguous_key" : NULL, 0);
        return;
    }
    c->rl.n = n;
    if (n == 0) {
        count_decision(c, METRICS_ALLOWED);
        forward(c);
        return;
    }
    if (denied_by_cache(c, sl, n)) {
        metrics_count(METRICS_DENY_CACHE_HITS);
        count_decision(c, METRICS_LIMITED);
        reply_pick(&c->rl, 0);
        c->have_limits = 1;
        answer_local(c, 429, 0);
        return;
    }
    save_counted(c, sl, n);
    if (c->conf->backend == CONF_BACKEND_MEMORY) {
        struct store_result res;
        if (memstore_decide(c->w->mem, sl, n, wall_us(), &res) == 0)
            apply_decision(c, &res, 0);
        else
            answer_local(c, 500, 0);
        return;
    }
    c->redis_start_us = now_us();
    metrics_count(METRICS_REDIS_REQUESTS);
    c->call = store_decide(runtime_store(c->rt), sl, n, decide_cb, c);
    if (c->call == NULL) {
        count_redis_error(NULL);
        apply_on_error(c);
    }
}

/* ---- forwarding the request -------------------------------------------- */

static void up_read_cb(struct bufferevent *bev, void *arg);
static void up_write_cb(struct bufferevent *bev, void *arg);
static void up_event_cb(struct bufferevent *bev, short what, void *arg);

/* Is the peer (not an X-Forwarded-For entry) a trusted proxy? */
static int peer_trusted(const struct client *c)
{
    return c->conf->ntrusted > 0 &&
           conf_cidr_match(c->conf->trusted, c->conf->ntrusted,
                           (const struct sockaddr *)&c->peer);
}

static void write_request_head(struct client *c, struct evbuffer *dst)
{
    struct obuf ob;
    const char *t = upstream_conf(c->up->pool)->servers[c->up->server].text;
    struct h1write_req o = {
        .peer = c->peer_text, .peer_len = c->peer_len,
        .rid = c->rid, .rid_len = c->rid_len,
        .host = t, .host_len = strlen(t),
        .trusted = peer_trusted(c),
        .upgrade = c->upgrade,
        .underscore = c->conf->client.underscore_headers,
    };
    obuf_begin(&ob, dst, c->head.len + 512);
    h1write_request(&ob, c->hbuf, &c->head, &o);
    obuf_end(&ob);
}

/* upstreams.timeout bounds each wait on the upstream: for a write while the
 * request is sent, and for the response only once the request is all sent
 * (an upload taking longer than the timeout is not the upstream's delay).
 * Until connected, the connect timeout set by the pool is in force. */
static void up_timeouts(struct client *c)
{
    struct upstream_conn *uc = c->up;
    if (!uc->connected)
        return;
    int64_t ms = upstream_conf(uc->pool)->timeout_ms;
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    if (c->req_done && c->up_deadline_ms == 0)
        c->up_deadline_ms = now_ms() + ms;
    bufferevent_set_timeouts(uc->bev, c->req_done ? &tv : NULL, &tv);
}

/* Borrow a connection from pool p (the worker's pool for the route's
 * upstream unless given). */
static int pool_connect(struct client *c, struct upstream_pool *p, int fresh)
{
    if (p == NULL)
        p = worker_pool(c->w, c->conf, c->route->upstream);
    if (p == NULL)
        return -1;
    c->up = upstream_acquire(p, fresh);
    if (c->up == NULL)
        return -1;
    struct bufferevent *ub = c->up->bev;
    bufferevent_setcb(ub, up_read_cb, up_write_cb, up_event_cb, c);
    bufferevent_setwatermark(ub, EV_WRITE, PROXY_HIGH_WATER / 2, 0);
    c->up_deadline_ms = 0;      /* counted on this connection */
    up_timeouts(c);
    /* A connect completes on the write event; a connected socket is
     * written by client_flush. */
    bufferevent_enable(ub, c->up->connected ? EV_READ : EV_READ | EV_WRITE);
    c->up_paused = 0;
    return 0;
}

static int buffer_wanted(const struct client *c);
static void buffer_begin(struct client *c);
static void buffer_send(struct client *c);
static void buffer_drop(struct client *c);

/* Send the request upstream. A request without a body keeps its head in the
 * client's input until the response begins, so that it can be sent again on
 * a fresh connection if a kept-alive one turns out to be closed. A small
 * body is read whole first (CS_BUFFER), which calls here again with it. */
static void forward(struct client *c)
{
    if (c->state != CS_BUFFER && buffer_wanted(c)) {
        buffer_begin(c);
        return;
    }
    if (pool_connect(c, NULL, 0) < 0) {
        buffer_drop(c);
        answer_local(c, 502, c->req_done);  /* a body already read: close */
        return;
    }
    c->state = CS_PROXY;
    c->upstream_start_us = now_us();
    write_request_head(c, bufferevent_get_output(c->up->bev));
    if (c->head.body == HTTP1_BODY_NONE) {
        c->req_done = 1;
        up_timeouts(c);
        return;
    }
    drain_head(c);
    buffer_send(c);
    if (c->req_done) {
        up_timeouts(c);
        return;
    }
    client_timer(c, TM_BODY, c->conf->client.body_timeout_ms);
}

/* ---- request buffering ---------------------------------------------- */

/* A body up to client.buffer_body_bytes (announced, or chunked while it
 * stays that small) is read whole before an upstream connection is taken,
 * as nginx's request buffering does: a client dripping it holds only its
 * own connection. Larger bodies stream. */
static int buffer_wanted(const struct client *c)
{
    size_t max = c->conf->client.buffer_body_bytes;
    const struct http1_head *h = &c->head;
    return max > 0 && (h->body == HTTP1_BODY_CHUNKED ||
                       (h->body == HTTP1_BODY_LENGTH && h->content_length <= max));
}

/* The held head is written: let it go. */
static void buffer_release_head(struct client *c)
{
    if (c->head_held) {
        evbuffer_drain(c->held, evbuffer_get_length(c->held));
        c->head_held = 0;
        c->hbuf = NULL;
    }
}

/* Empty what a request left in the buffering buffers. */
static void buffer_drop(struct client *c)
{
    if (c->body)
        evbuffer_drain(c->body, evbuffer_get_length(c->body));
    buffer_release_head(c);
}

/* body_timeout between bytes, and the whole body within header_timeout of
 * when buffering began (the bound a head has too). */
static void buffer_wait(struct client *c)
{
    int64_t left = c->buffer_until_ms - now_ms();
    int64_t ms = c->conf->client.body_timeout_ms;
    client_timer(c, TM_BODY, left < 0 ? 0 : left < ms ? left : ms);
}

/* The head leaves the input (the body behind it is read into c->body); a
 * client waiting on Expect: 100-continue gets our 100, and the upstream's
 * is not relayed. */
static void buffer_begin(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    buffer_drop(c);
    lazy_buffer(&c->body);
    evbuffer_remove_buffer(in, lazy_buffer(&c->held), c->head.len);
    c->hbuf = (const char *)evbuffer_pullup(c->held, -1);
    c->head_in_input = 0;
    c->head_held = 1;
    c->state = CS_BUFFER;
    c->buffer_until_ms = now_ms() + c->conf->client.header_timeout_ms;
    if (c->head.expect_continue && c->head.minor >= 1 && evbuffer_get_length(in) == 0)
        evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    c->head.expect_continue = 0;
    buffer_wait(c);
}

/* Read body bytes into c->body; forward once the body is whole, or once a
 * chunked one outgrows the limit (it then streams). */
static void buffer_body(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    uint64_t max_body = c->conf->client.max_body_bytes;
    for (;;) {
        size_t payload;
        int rc = pump_once(c->parser, in, c->body, &payload);
        c->body_bytes += payload;
        if (c->reqlog)
            c->reqlog->bytes_in += payload;
        if (rc < 0) {
            fail_request(c, 400);
            return;
        }
        if (max_body && c->body_bytes > max_body) {
            fail_request(c, 413);
            return;
        }
        if (rc == 1) {
            c->req_done = 1;
            break;
        }
        if (c->body_bytes > c->conf->client.buffer_body_bytes)
            break;
        if (rc == 0) {
            if (c->eof)         /* the rest can never come */
                client_kill(c);
            else
                buffer_wait(c);
            return;
        }
    }
    client_timer(c, TM_NONE, 0);
    forward(c);
}

/* Behind the head: the body read so far, framed as streaming would have
 * framed it (as is, or as one chunk of ours and the last chunk when whole). */
static void buffer_send(struct client *c)
{
    struct evbuffer *uo = bufferevent_get_output(c->up->bev);
    int chunked = c->head.body == HTTP1_BODY_CHUNKED;
    size_t n = c->body ? evbuffer_get_length(c->body) : 0;
    buffer_release_head(c);
    if (chunked && n > 0)
        add_hex(uo, n);
    if (n > 0)
        evbuffer_add_buffer(uo, c->body);
    if (chunked && n > 0)
        evbuffer_add(uo, "\r\n", 2);
    if (chunked && c->req_done)
        evbuffer_add(uo, "0\r\n\r\n", 5);
}

static void pump_request_body(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    struct evbuffer *uo = bufferevent_get_output(c->up->bev);
    int chunked = c->head.body == HTTP1_BODY_CHUNKED;
    uint64_t max_body = c->conf->client.max_body_bytes;

    while (!c->req_done && c->up) {
        size_t queued = evbuffer_get_length(uo);
        if (queued > PROXY_HIGH_WATER) {
            bufferevent_disable(c->bev, EV_READ);
            c->client_paused = 1;
            return;
        }
        size_t payload;
        int rc = pump_body(c->parser, in, uo, lazy_buffer(&c->body), chunked,
                           PROXY_HIGH_WATER - queued, &payload);
        c->body_bytes += payload;
        if (c->reqlog)
            c->reqlog->bytes_in += payload;
        if (rc < 0) {
            fail_request(c, 400);
            return;
        }
        if (max_body && c->body_bytes > max_body) {
            fail_request(c, 413);
            return;
        }
        if (rc == 1) {
            c->req_done = 1;
            up_timeouts(c);
            client_timer(c, TM_NONE, 0);
        } else if (rc == 0) {
            client_timer(c, TM_BODY, c->conf->client.body_timeout_ms);
            return;
        }
    }
}

static void discard_body(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (!c->req_done) {
        size_t payload;
        int rc = pump_once(c->parser, in, NULL, &payload);
        c->body_bytes += payload;
        if (rc < 0 || c->body_bytes > PROXY_DISCARD_MAX) {
            client_close_after_write(c);
            return;
        }
        if (rc == 0)
            return;
        if (rc == 1) {
            c->req_done = 1;
            request_finish(c);
        }
    }
}

/* ---- the response ------------------------------------------------------ */

static void upstream_limits(const char *buf, const struct http1_head *h,
                            struct reply_upstream *up)
{
    int have[3] = { 0, 0, 0 };
    memset(up, 0, sizeof(*up));
    for (int i = 0; i < h->nheaders; i++) {
        const struct http1_header *hd = &h->h[i];
        if (span_is(buf, hd->name, "x-ratelimit-limit"))
            have[0] = span_int(buf, hd->value, &up->limit);
        else if (span_is(buf, hd->name, "x-ratelimit-remaining"))
            have[1] = span_int(buf, hd->value, &up->remaining);
        else if (span_is(buf, hd->name, "x-ratelimit-reset"))
            have[2] = span_int(buf, hd->value, &up->reset);
        else if (span_is(buf, hd->name, "ratelimit-policy") && !up->policy) {
            up->policy = buf + hd->value.off;
            up->policy_len = hd->value.len;
        } else if (span_is(buf, hd->name, "ratelimit") && !up->ratelimit) {
            up->ratelimit = buf + hd->value.off;
            up->ratelimit_len = hd->value.len;
        }
    }
    up->has_legacy = have[0] && have[1] && have[2];
}

/* Status line and fields as the upstream sent them, less hop-by-hop fields,
 * plus ours; the body framing chosen for this client. A 101 gets the same,
 * with its Upgrade field and Connection: upgrade. */
static void write_response_head(struct client *c, const char *buf)
{
    const struct http1_head *h = &c->up->head;
    struct obuf ob;
    enum conf_headers mode = c->have_limits ? c->route->headers : CONF_HEADERS_NONE;

    if (h->body == HTTP1_BODY_CHUNKED || h->body == HTTP1_BODY_EOF) {
        if (c->head.minor >= 1)
            c->out_chunked = 1;
        else
            c->keep_alive = 0;      /* HTTP/1.0: the close ends the body */
    }
    struct h1write_resp o = {
        .rid = c->rid, .rid_len = c->rid_len,
        .limits = mode,
        .head_request = c->head_request,
        .chunked = c->out_chunked,
        .close = !c->keep_alive || c->eof,
        .keep_alive_10 = c->head.minor == 0,
    };
    obuf_begin(&ob, bufferevent_get_output(c->bev), h->len + 1024);
    h1write_response_begin(&ob, buf, h, &o);
    if (mode != CONF_HEADERS_NONE) {
        struct reply_upstream up;
        upstream_limits(buf, h, &up);
        reply_limit_headers(&ob, &c->rl, 0, &up);
    }
    h1write_response_end(&ob, buf, h, &o);
    obuf_end(&ob);
}

/* Move what each side has to the other. */
static void tunnel_pump(struct client *c)
{
    struct bufferevent *ub = c->up->bev;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    struct evbuffer *uo = bufferevent_get_output(ub);
    move_all(uo, bufferevent_get_input(c->bev));
    move_all(out, bufferevent_get_input(ub));
    /* Whichever side is slow to read holds back the other. */
    if (evbuffer_get_length(uo) > PROXY_HIGH_WATER) {
        bufferevent_disable(c->bev, EV_READ);
        c->client_paused = 1;
    }
    if (evbuffer_get_length(out) > PROXY_HIGH_WATER) {
        bufferevent_disable(ub, EV_READ);
        c->up_paused = 1;
    }
}

/* After the 101 the connection belongs to the upgraded protocol: no more
 * HTTP parsing, no timeouts (a WebSocket may idle for long). */
static void start_tunnel(struct client *c)
{
    c->state = CS_TUNNEL;
    c->resp_started = 1;
    c->keep_alive = 0;
    client_timer(c, TM_NONE, 0);
    bufferevent_set_timeouts(c->bev, NULL, NULL);
    bufferevent_set_timeouts(c->up->bev, NULL, NULL);
    bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
    tunnel_pump(c);
}

/* An interim response was read: pass on a clean 100 Continue the client
 * asked for (a bounded number), and hold the wait for the final head to
 * the upstream timeout counted from the request's end, however many come.
 * Returns -1 when the time is up (answered). */
static int interim_response(struct client *c, int status)
{
    struct upstream_conn *uc = c->up;
    c->interims++;
    if (status == 100 && c->head.expect_continue &&
        c->interims_relayed < PROXY_INTERIM_RELAYED) {
        evbuffer_add(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        c->interims_relayed++;
    }
    if (c->up_deadline_ms == 0)
        return 0;           /* the request is still being sent */
    int64_t left = c->up_deadline_ms - now_ms();
    if (left <= 0) {
        log_warn("proxy: upstream '%s' timed out after %d interim responses",
                 upstream_conf(uc->pool)->servers[uc->server].text, c->interims);
        fail_request(c, 504);
        return -1;
    }
    struct timeval tv = { left / 1000, (left % 1000) * 1000 };
    bufferevent_set_timeouts(uc->bev, &tv, &tv);
    return 0;
}

/* Parse response heads until a final one is sent to the client.
 * Returns 0 to wait, 1 when the final head was written, -1 on failure
 * (already handled). */
static int read_response_head(struct client *c)
{
    struct upstream_conn *uc = c->up;
    struct evbuffer *ui = bufferevent_get_input(uc->bev);
    for (;;) {
        size_t len = evbuffer_get_length(ui);
        if (len == 0)
            return 0;
        size_t n = len > PROXY_RESP_HEAD_MAX + 1 ? PROXY_RESP_HEAD_MAX + 1 : len;
        const char *data = (const char *)evbuffer_pullup(ui, (ssize_t)n);
        int rc = http1_head_feed(uc->parser, data, n, PROXY_RESP_HEAD_MAX,
                                 c->head_request, &uc->head);
        if (rc == 1)
            return 0;
        if (rc == 0)
            rc = h1write_response_check(data, &uc->head);
        if (rc != 0) {
            log_warn("proxy: bad response head from upstream '%s': closing it",
                     upstream_conf(uc->pool)->servers[uc->server].text);
            fail_request(c, 502);
            return -1;
        }
        int status = uc->head.status;
        if (status >= 100 && status < 200 && status != 101) {
            evbuffer_drain(ui, uc->head.len);
            if (interim_response(c, status) < 0)
                return -1;
            continue;
        }
        if (c->interims > 0)
            up_timeouts(c);     /* body reads get the whole timeout again */
        if (status == 101) {
            const struct conf_route *r = c->route;
            /* a switch nobody asked for, or to a protocol not asked for */
            if (!c->upgrade ||
                !h1write_upgrade_ok(data, &uc->head, r->upgrade_protos, r->nupgrade_protos)) {
                fail_request(c, 502);
                return -1;
            }
            drain_head(c);
            count_response(c, status);
            write_response_head(c, data);
            evbuffer_drain(ui, uc->head.len);
            start_tunnel(c);
            return -1;
        }
        if (c->count_call || consume_counted(c, status))
            return 0;   /* counted_done_cb resumes */
        drain_head(c);  /* the request head is no longer needed for a retry */
        count_response(c, status);
        size_t out_before = evbuffer_get_length(bufferevent_get_output(c->bev));
        write_response_head(c, data);
        count_out(c, evbuffer_get_length(bufferevent_get_output(c->bev)) - out_before);
        evbuffer_drain(ui, uc->head.len);
        c->resp_started = 1;
        if (uc->head.body == HTTP1_BODY_NONE)
            c->resp_done = 1;
        return 1;
    }
}

static void pump_response_body(struct client *c)
{
    struct upstream_conn *uc = c->up;
    struct evbuffer *ui = bufferevent_get_input(uc->bev);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (!c->resp_done) {
        size_t queued = evbuffer_get_length(out);
        if (queued > PROXY_HIGH_WATER) {
            bufferevent_disable(uc->bev, EV_READ);
            c->up_paused = 1;
            return;
        }
        size_t payload;
        int rc = pump_body(uc->parser, ui, out, lazy_buffer(&c->body), c->out_chunked,
                           PROXY_HIGH_WATER - queued, &payload);
        count_out(c, payload);
        if (rc < 0) {
            log_warn("proxy: bad response body from upstream '%s': cutting the client",
                     upstream_conf(uc->pool)->servers[uc->server].text);
            fail_request(c, 502);
            return;
        }
        if (rc == 1)
            c->resp_done = 1;
        else if (rc == 0)
            return;
    }
}

/* Both directions finished: give the upstream connection back when it is
 * clean, then serve the next request or close. */
static void maybe_finish(struct client *c)
{
    if (!c->req_done || !c->resp_done || c->state != CS_PROXY)
        return;
    struct upstream_conn *uc = c->up;
    c->up = NULL;
    int64_t up_us = now_us() - c->upstream_start_us;
    metrics_observe(METRICS_UPSTREAM_SECONDS, up_us);
    if (c->reqlog)
        c->reqlog->upstream_us = up_us;
    if (uc->head.keep_alive && uc->head.body != HTTP1_BODY_EOF)
        upstream_release(uc);
    else
        upstream_close(uc);
    request_finish(c);
}

static void up_read_cb(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    if (c->state == CS_TUNNEL) {
        tunnel_pump(c);
        goto out;
    }
    if (!c->resp_started && read_response_head(c) <= 0)
        goto out;
    pump_response_body(c);
    if (!c->dead && c->up)
        maybe_finish(c);
    if (!c->dead)
        client_process(c);
out:
    client_leave(c);
}

/* Carry on with a response that waited (count_status consumption). */
static void resume_response(struct client *c)
{
    if (!c->dead && c->up && !c->resp_started && read_response_head(c) > 0) {
        pump_response_body(c);
        if (!c->dead && c->up)
            maybe_finish(c);
    }
    if (!c->dead)
        client_process(c);
}

static void up_write_cb(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    out_idle(bev);
    client_leave(c);        /* resumes the client if it was held back */
}

static void up_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct client *c = arg;
    struct upstream_conn *uc = c->up;
    const struct conf_upstream *cu = upstream_conf(uc->pool);
    client_enter(c);
    if (what & BEV_EVENT_CONNECTED) {
        uc->connected = 1;
        up_timeouts(c);
        goto out;
    }
    if (c->state == CS_TUNNEL) {
        tunnel_pump(c);
        upstream_close(uc);
        c->up = NULL;
        client_close_after_write(c);
        goto out;
    }
    if ((what & BEV_EVENT_EOF) && c->resp_started && uc->head.body == HTTP1_BODY_EOF) {
        pump_response_body(c);
        if (!c->dead && !c->resp_done && http1_body_eof(uc->parser)) {
            c->resp_done = 1;
            if (c->out_chunked)
                evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
            maybe_finish(c);
            client_process(c);
            goto out;
        }
    }
    /* A kept-alive connection the server had closed: try once more on a
     * fresh one if nothing was sent back and the request can be resent. */
    if (!c->resp_started && uc->reused && !c->retried && c->head_in_input &&
        !(what & BEV_EVENT_TIMEOUT)) {
        /* Borrow first: closing the last borrowed connection of a retired
         * pool frees the pool. */
        c->up = NULL;
        c->retried = 1;
        int ok = pool_connect(c, uc->pool, 1) == 0;
        upstream_close(uc);
        if (ok) {
            refresh_head(c);
            write_request_head(c, bufferevent_get_output(c->up->bev));
        } else {
            fail_request(c, 502);
            if (!c->dead)
                client_process(c);
        }
        goto out;
    }
    if (what & BEV_EVENT_TIMEOUT)
        log_warn("proxy: upstream '%s' timed out", cu->servers[uc->server].text);
    else
        log_warn("proxy: upstream '%s' failed: %s", cu->servers[uc->server].text,
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    fail_request(c, (what & BEV_EVENT_TIMEOUT) ? 504 : 502);
    if (!c->dead)
        client_process(c);
out:
    client_leave(c);
}

/* ---- writing ----------------------------------------------------------- */

/* Write a socket's queued output now, in this loop iteration, instead of
 * arming the write event and writing in the next one: a bufferevent adds
 * its write event when output is queued and deletes it once written, two
 * epoll_ctl calls per response and per forwarded request. Here the write
 * event stays off while writes complete at once, and is enabled only when
 * the socket is full (EAGAIN), or on an error, which the bufferevent then
 * meets and reports through its event callback as usual. */
static void out_flush(struct bufferevent *bev)
{
    struct evbuffer *out = bufferevent_get_output(bev);
    if (evbuffer_get_length(out) == 0 || (bufferevent_get_enabled(bev) & EV_WRITE))
        return;
    /* A bufferevent keeps its output's start frozen against others
     * draining it; its own write callback thaws it the same way. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, bufferevent_getfd(bev));
    evbuffer_freeze(out, 1);
    if (n < 0 || evbuffer_get_length(out) > 0)
        bufferevent_enable(bev, EV_WRITE);
}

/* The write event is needed again only when output waits. */
static void out_idle(struct bufferevent *bev)
{
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
}

/* Flush both sides, then do what the freed space allows: resume a side that
 * backpressure stopped. Bounded: each round needs progress. */
static void client_flush(struct client *c)
{
    for (int round = 0; round < 16 && !c->dead; round++) {
        int progress = 0;
        out_flush(c->bev);
        if (c->up && c->up->connected)
            out_flush(c->up->bev);
        if (c->client_paused && c->up &&
            evbuffer_get_length(bufferevent_get_output(c->up->bev)) <= PROXY_HIGH_WATER / 2) {
            c->client_paused = 0;
            bufferevent_enable(c->bev, EV_READ);
            client_process(c);
            progress = 1;
        }
        if (!c->dead && c->up_paused && c->up &&
            evbuffer_get_length(bufferevent_get_output(c->bev)) <= PROXY_HIGH_WATER / 2) {
            c->up_paused = 0;
            bufferevent_enable(c->up->bev, EV_READ);
            if (c->state == CS_TUNNEL) {
                tunnel_pump(c);
            } else {
                pump_response_body(c);
                if (!c->dead && c->up)
                    maybe_finish(c);
            }
            if (!c->dead)
                client_process(c);
            progress = 1;
        }
        /* Answers sluice wrote itself filled the output while pipelined
         * heads waited: once it drains, go on with them (a write that
         * completed at once arms no write event to do it). */
        if (!c->dead && c->heads_paused &&
            evbuffer_get_length(bufferevent_get_output(c->bev)) <= PROXY_HIGH_WATER / 2) {
            c->heads_paused = 0;
            client_process(c);
            progress = 1;
        }
        if (!progress)
            break;
    }
    if (!c->dead && c->state == CS_CLOSING &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        client_kill(c);
}

/* ---- the client connection --------------------------------------------- */

/* The current request is over (answered and its body read): wait for the
 * next one, or close. */
static void request_finish(struct client *c)
{
    reqlog_end(c);
    drain_head(c);
    c->route = NULL;
    runtime_release(c->rt);
    c->rt = NULL;
    if (!c->keep_alive || c->eof || c->w->stopping) {
        client_close_after_write(c);
        return;
    }
    c->state = CS_HEAD;
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) == 0)
        client_timer(c, TM_IDLE, c->conf->client.idle_timeout_ms);
    else
        client_timer(c, TM_HEADER, c->conf->client.header_timeout_ms);
}

/* Parse the next head. Returns 1 when sluice answered it at once (404, 429
 * from the deny cache, 400 for a bad cost...) and waits for a head again:
 * the next pipelined request may be in the input already, and no read event
 * will come for bytes that were read. */
static int parse_head_answered(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t before = evbuffer_get_length(in);
    parse_head(c);
    return !c->dead && c->state == CS_HEAD && evbuffer_get_length(in) < before;
}

/* Do whatever the bytes in hand allow, until the state needs to wait. */
static void client_process(struct client *c)
{
    for (int rounds = 0; !c->dead && rounds < 1000; rounds++) {
        enum client_state before = c->state;
        switch (c->state) {
        case CS_HEAD:
            /* Pipelined requests wait while our output is backed up. */
            if (evbuffer_get_length(bufferevent_get_output(c->bev)) > PROXY_HIGH_WATER) {
                c->heads_paused = 1;    /* client_flush resumes once written */
                return;
            }
            if (parse_head_answered(c))
                continue;
            break;
        case CS_PROXY:
            if (!c->req_done && c->up)
                pump_request_body(c);
            if (!c->dead && c->up)
                maybe_finish(c);
            break;
        case CS_BUFFER:
            buffer_body(c);
            break;
        case CS_DISCARD:
            discard_body(c);
            break;
        case CS_TUNNEL:
            if (c->up)
                tunnel_pump(c);
            return;
        case CS_DECIDE:
        case CS_CLOSING:
            return;
        }
        if (c->state == before)
            return;
    }
    /* Still going after many requests: go on from the event loop, after
     * the other connections have had their turn. */
    if (!c->dead)
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
}

static void client_read_cb(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    client_process(c);
    client_leave(c);
}

static void client_write_cb(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    out_idle(bev);
    if (c->state != CS_CLOSING)
        client_process(c);
    client_leave(c);        /* resumes the upstream, or ends a closing client */
}

static void client_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR)) {
        /* Half-close: a client may send its request and shut its side
         * down; it still gets the answer to a request already read. */
        c->eof = 1;
        c->keep_alive = 0;
        if (c->state == CS_TUNNEL && c->up)
            tunnel_pump(c);
        int waiting = c->state == CS_DECIDE ||
                      (c->state == CS_PROXY && c->req_done);
        if (!waiting && c->state != CS_CLOSING)
            client_kill(c);
    } else {
        client_kill(c);     /* reset, or a write timed out */
    }
    client_leave(c);
}

static void client_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    client_enter(c);
    if (c->timer_mode == TM_HEADER && c->state == CS_HEAD) {
        /* A head that does not arrive in time (slowloris): 408, close. */
        c->head_in_input = 0;
        c->route = NULL;
        c->have_limits = 0;
        c->rid_len = 0;     /* not the id of the request before */
        c->head_request = 0;
        reqlog_begin(c, 0);
        answer_local(c, 408, 1);
    } else if (c->timer_mode == TM_BODY && c->state == CS_BUFFER) {
        /* A small body too slow to arrive: nothing went upstream yet. */
        answer_local(c, 408, 1);
    } else {
        client_kill(c);     /* idle keep-alive, or a stalled body */
    }
    client_leave(c);
}

void proxy_accept(struct worker *w, int fd, const struct sockaddr *peer, int peerlen)
{
    struct conf *conf = w->conf;
    /* max_connections is per process; each worker takes its share. */
    int share = conf->max_connections ? (conf->max_connections + conf->workers - 1) / conf->workers : 0;
    if (share && w->nclients >= share) {
        evutil_closesocket(fd);
        return;
    }
    struct bufferevent *bev = bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL) {
        evutil_closesocket(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    struct client *c = mem_calloc(1, sizeof(*c));
    c->w = w;
    c->conf = conf;
    conf_retain(conf);
    c->bev = bev;
    memcpy(&c->peer, peer, (size_t)peerlen < sizeof(c->peer) ? (size_t)peerlen : sizeof(c->peer));
    c->peer_len = route_client_ip(conf, peer, NULL, NULL, c->peer_text);
    c->parser = http1_create(HTTP1_REQUEST);
    c->timer = evtimer_new(w->base, client_timer_cb, c);
    c->state = CS_HEAD;
    c->next = w->clients;
    if (w->clients)
        w->clients->prev = c;
    w->clients = c;
    w->nclients++;
    metrics_gauge_add(METRICS_CONN_CLIENT, 1);

    /* A client that stops reading is dropped after idle_timeout. */
    struct timeval wt = { conf->client.idle_timeout_ms / 1000,
                          (conf->client.idle_timeout_ms % 1000) * 1000 };
    bufferevent_set_timeouts(bev, NULL, &wt);
    bufferevent_setwatermark(bev, EV_READ, 0, conf->client.max_header_bytes + PROXY_INPUT_MAX);
    bufferevent_setwatermark(bev, EV_WRITE, PROXY_HIGH_WATER / 2, 0);
    bufferevent_setcb(bev, client_read_cb, client_write_cb, client_event_cb, c);
    bufferevent_enable(bev, EV_READ);
    bufferevent_disable(bev, EV_WRITE);     /* on by default; writes: client_flush */
    client_timer(c, TM_IDLE, conf->client.idle_timeout_ms);
}

void proxy_drain(struct worker *w)
{
    for (struct client *c = w->clients, *next; c; c = next) {
        next = c->next;
        c->keep_alive = 0;
        if (c->state == CS_HEAD && evbuffer_get_length(bufferevent_get_input(c->bev)) == 0) {
            client_kill(c);
            if (c->busy == 0)
                client_free(c);
        }
    }
}

void proxy_close_all(struct worker *w)
{
    while (w->clients) {
        struct client *c = w->clients;
        /* client_free() unlinks the list head, so this is a new client each
         * time; the analyser assumes the head may have a prev. */
        client_kill(c);     /* NOLINT(clang-analyzer-unix.Malloc) */
        if (c->busy == 0)
            client_free(c);
    }
}
