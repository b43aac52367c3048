/* sluice - exchange.c: one upstream exchange (exchange.h).
 *
 * Bodies move between evbuffers piece by piece (http1 reports where payload
 * is); only a small request body is held whole, before an upstream
 * connection is taken. Backpressure: a side whose output is above
 * CONN_HIGH_WATER stops the other side's reading (conn_flush resumes). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "clock.h"
#include "conn.h"
#include "conf.h"
#include "exchange.h"
#include "h1write.h"
#include "hex.h"
#include "http1.h"
#include "io.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "obuf.h"
#include "reply.h"
#include "runtime.h"
#include "request_state.h"
#include "route.h"
#include "upstream.h"

#define EXCHANGE_RESP_HEAD_MAX (64 * 1024)
/* Interim (1xx) responses relayed to a client per request; more are read
 * and dropped, within the upstream timeout counted across all of them. */
#define EXCHANGE_INTERIM_RELAYED 10

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
    p = hex_u64_back(p, n);
    evbuffer_add(out, p, (size_t)(tmp + sizeof(tmp) - p));
}

/* Bytes move from buffer to buffer by copying into the destination's own
 * chains, never by handing chains over (conn_pump_once). */

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
            conn_copy(dst, v[i].iov_base, v[i].iov_len);
            total += v[i].iov_len;
        }
        if (total == 0) {       /* only empty chains in view: hand them over */
            evbuffer_add_buffer(dst, src);
            return;
        }
        evbuffer_drain(src, total);
    }
}

/* cost_from json and sse: the response body is scanned up to this many
 * payload bytes; what comes after streams on unread. */
#define EXCHANGE_COST_SCAN_MAX (16u << 20)

/* The last n bytes of b are payload of a response scanned for its cost. */
static void cost_feed(struct request *rq, struct evbuffer *b, size_t n)
{
    if (n > EXCHANGE_COST_SCAN_MAX - rq->cost_scanned)
        n = EXCHANGE_COST_SCAN_MAX - rq->cost_scanned;
    if (n == 0)
        return;
    rq->cost_scanned += n;
    struct evbuffer_ptr at;
    struct evbuffer_iovec v[8];
    evbuffer_ptr_set(b, &at, evbuffer_get_length(b) - n, EVBUFFER_PTR_SET);
    while (n > 0) {
        int k = evbuffer_peek(b, (ev_ssize_t)n, &at, v, 8);
        size_t fed = 0;
        for (int i = 0; i < k && i < 8 && fed < n; i++) {
            size_t m = v[i].iov_len < n - fed ? v[i].iov_len : n - fed;
            jsonscan_feed(&rq->cost_scan, v[i].iov_base, m);
            fed += m;
        }
        if (fed == 0)
            return;
        n -= fed;
        evbuffer_ptr_set(b, &at, fed, EVBUFFER_PTR_ADD);
    }
}

/* The last chunk, with the trailer section a chunked body ended with
 * (tail: what conn_pump_tail kept: "\r\n" ending a data chunk, maybe, the
 * last chunk's size line, the trailer lines, "\r\n"), or none. The tail is
 * left as it is, the trailer section at its start. */
static void last_chunk(struct evbuffer *dst, struct evbuffer *tail)
{
    size_t n = tail ? evbuffer_get_length(tail) : 0;
    struct evbuffer_ptr p = { .pos = -1 };
    if (n > 0)
        p = evbuffer_search(tail, "0", 1, NULL);    /* the size line: 0[;ext] */
    if (p.pos >= 0)
        p = evbuffer_search(tail, "\n", 1, &p);
    if (p.pos < 0 || (size_t)p.pos + 3 > n) {    /* no trailers */
        evbuffer_add(dst, "0\r\n\r\n", 5);
        return;
    }
    evbuffer_drain(tail, (size_t)p.pos + 1);
    evbuffer_add(dst, "0\r\n", 3);
    evbuffer_add(dst, evbuffer_pullup(tail, -1), evbuffer_get_length(tail));
}

/* Decode what src holds of a body into dst, about `room` payload bytes at
 * most (one run more): as is, or with chunked, as one chunk of our own
 * framing for all of it, so a body of 1-byte chunks goes on in chunks as
 * large as what arrived, not one chunk per byte; a chunked body's trailers
 * go on after it when tail keeps them (NULL: dropped). scratch is empty
 * before and after. Returns as pump_once; *payload gets the payload bytes
 * moved. A response scanned for its cost (cost not NULL) has its payload fed. */
static int pump_body(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                     struct evbuffer *scratch, struct evbuffer *tail, int chunked,
                     size_t room, size_t *payload, struct request *cost)
{
    struct evbuffer *to = chunked ? scratch : dst;
    int rc;
    assert(!chunked || evbuffer_get_length(scratch) == 0);
    *payload = 0;
    do {
        size_t n;
        rc = conn_pump_tail(p, src, to, tail, &n);
        *payload += n;
        if (cost && cost->cost_scanning && n > 0)
            cost_feed(cost, to, n);
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
        last_chunk(dst, tail);
    return rc;
}

/* The evbuffer *b, made on first use. */
static struct evbuffer *lazy_buffer(struct evbuffer **b)
{
    if (*b == NULL && (*b = evbuffer_new()) == NULL)
        abort();    /* only on allocation failure */
    return *b;
}

/* ---- forwarding the request -------------------------------------------- */

static void up_read_cb(struct io *io, void *arg);
static void up_write_cb(struct io *io, void *arg);
static void up_event_cb(struct io *io, short what, void *arg);

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
    const char *t = upstream_conf(c->rq->up->pool)->servers[c->rq->up->server].text;
    struct h1write_req o = {
        .peer = c->peer_text, .peer_len = c->peer_len,
        .rid = c->rq->rid, .rid_len = c->rq->rid_len,
        .host = t, .host_len = strlen(t),
        .trusted = peer_trusted(c),
        .upgrade = c->rq->upgrade,
        .underscore = c->conf->client.underscore_headers,
        .https = c->tls,
    };
    obuf_begin(&ob, dst, c->rq->head.len + 512);
    h1write_request(&ob, c->rq->hbuf, &c->rq->head, &o);
    obuf_end(&ob);
}

/* upstreams.timeout bounds each wait on the upstream: for a write while the
 * request is sent, and for the response only once the request is all sent
 * (an upload taking longer than the timeout is not the upstream's delay).
 * A gRPC call's grpc-timeout caps it at what is left of its deadline.
 * Until connected, the connect timeout set by the pool is in force. */
static void up_timeouts(struct client *c)
{
    struct upstream_conn *uc = c->rq->up;
    if (!uc->connected)
        return;
    int64_t ms = upstream_conf(uc->pool)->timeout_ms;
    if (c->rq->grpc_deadline_ms) {
        int64_t left = c->rq->grpc_deadline_ms - clock_ms();
        ms = left < 1 ? 1 : left < ms ? left : ms;
    }
    struct timeval tv = clock_timeval(ms);
    if (c->rq->req_done && c->rq->up_deadline_ms == 0)
        c->rq->up_deadline_ms = clock_ms() + ms;
    io_set_timeouts(uc->io, c->rq->req_done ? &tv : NULL, &tv);
}

/* Borrow a connection from pool p (the request's runtime's pool for the
 * route's upstream unless given). */
static int pool_connect(struct client *c, struct upstream_pool *p, int fresh)
{
    if (p == NULL)
        p = runtime_pool(c->rq->rt, c->rq->route->upstream);
    if (p == NULL)
        return -1;
    c->rq->up = upstream_acquire(p, fresh);
    if (c->rq->up == NULL)
        return -1;
    struct io *ub = c->rq->up->io;
    io_setcb(ub, up_read_cb, up_write_cb, up_event_cb, c);
    io_setwatermark(ub, EV_WRITE, CONN_HIGH_WATER / 2);
    c->rq->up_deadline_ms = 0;      /* counted on this connection */
    up_timeouts(c);
    /* Reading starts once connected; what is queued before goes out then,
     * later writes from conn_flush. */
    io_enable(ub, EV_READ);
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
void exchange_start(struct client *c, const struct exchange_ops *ops)
{
    c->rq->xops = ops;
    if (c->state != CS_BUFFER && !c->rq->body_buffered && buffer_wanted(c)) {
        buffer_begin(c);
        return;
    }
    if (pool_connect(c, NULL, 0) < 0) {
        buffer_drop(c);
        c->rq->xops->answer(c, 502, c->rq->req_done);  /* a body already read: close */
        return;
    }
    c->state = CS_PROXY;
    c->rq->upstream_start_us = clock_us();
    write_request_head(c, io_output(c->rq->up->io));
    if (c->rq->head.body == HTTP1_BODY_NONE) {
        c->rq->req_done = 1;
        up_timeouts(c);
        return;
    }
    c->rq->xops->drain_head(c);
    buffer_send(c);
    if (c->rq->req_done) {
        up_timeouts(c);
        return;
    }
    conn_timer(c, TM_BODY, c->conf->client.body_timeout_ms);
}

/* ---- request buffering ---------------------------------------------- */

/* A body up to client.buffer_body_bytes (announced, or chunked while it
 * stays that small) is read whole before an upstream connection is taken,
 * as nginx's request buffering does: a client dripping it holds only its
 * own connection. Larger bodies stream. */
static int buffer_wanted(const struct client *c)
{
    size_t max = c->conf->client.buffer_body_bytes;
    const struct http1_head *h = &c->rq->head;
    return max > 0 && (h->body == HTTP1_BODY_CHUNKED ||
                       (h->body == HTTP1_BODY_LENGTH && h->content_length <= max));
}

/* The held head is written: let it go. */
static void buffer_release_head(struct client *c)
{
    if (c->rq->head_held) {
        evbuffer_drain(c->held, evbuffer_get_length(c->held));
        c->rq->head_held = 0;
        c->rq->hbuf = NULL;
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
    int64_t left = c->rq->buffer_until_ms - clock_ms();
    int64_t ms = c->conf->client.body_timeout_ms;
    conn_timer(c, TM_BODY, left < 0 ? 0 : left < ms ? left : ms);
}

/* The head leaves the input (the body behind it is read into c->body); a
 * client waiting on Expect: 100-continue gets our 100, and the upstream's
 * is not relayed. */
static void buffer_begin(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    buffer_drop(c);
    lazy_buffer(&c->body);
    evbuffer_remove_buffer(in, lazy_buffer(&c->held), c->rq->head.len);
    c->rq->hbuf = (const char *)evbuffer_pullup(c->held, -1);
    c->rq->head_in_input = 0;
    c->rq->head_held = 1;
    c->state = CS_BUFFER;
    c->rq->buffer_until_ms = clock_ms() + c->conf->client.header_timeout_ms;
    if (c->rq->head.expect_continue && c->rq->head.minor >= 1 && evbuffer_get_length(in) == 0)
        evbuffer_add(io_output(c->io), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    c->rq->head.expect_continue = 0;
    buffer_wait(c);
}

/* Read body bytes into c->body; forward once the body is whole, or once a
 * chunked one outgrows the limit (it then streams). */
/* payload more request body bytes were read (pump rc): count them, and
 * fail the request on bad framing (400) or a body over max_body_bytes
 * (413). Returns -1 when the request failed. */
static int body_counted(struct client *c, int rc, size_t payload)
{
    uint64_t max_body = c->conf->client.max_body_bytes;
    c->rq->body_bytes += payload;
    if (c->rq->log)
        c->rq->log->bytes_in += payload;
    if (rc < 0) {
        c->rq->xops->fail(c, 400);
        return -1;
    }
    if (max_body && c->rq->body_bytes > max_body) {
        c->rq->xops->fail(c, 413);
        return -1;
    }
    return 0;
}

int exchange_buffer_first(struct client *c, const struct exchange_ops *ops)
{
    if (!buffer_wanted(c))
        return 0;
    c->rq->xops = ops;
    c->rq->body_first = 1;
    buffer_begin(c);
    exchange_buffer_body(c);        /* what came with the head */
    return 1;
}

const char *exchange_buffered(struct client *c, size_t *len)
{
    if (!c->rq->body_buffered || c->body == NULL)
        return NULL;
    *len = evbuffer_get_length(c->body);
    return (const char *)evbuffer_pullup(c->body, -1);
}

void exchange_buffer_drop(struct client *c)
{
    if (c->rq->body_buffered)
        buffer_drop(c);
}

/* exchange_read_body's end: the body (a copy, as c->body is let go first:
 * the answer may start the next request) to the request's body_read. */
static void read_body_done(struct client *c, int over)
{
    size_t n = c->body ? evbuffer_get_length(c->body) : 0;
    uint8_t *copy = mem_alloc(n);
    if (n)
        evbuffer_remove(c->body, copy, n);
    buffer_drop(c);
    c->rq->xops->body_read(c, copy, n, over);
    free(copy);
}

void exchange_read_body(struct client *c, const struct exchange_ops *ops, size_t max)
{
    c->rq->xops = ops;
    c->rq->read_max = max > 0 ? max : 1;
    if (c->rq->head.body == HTTP1_BODY_NONE) {
        c->rq->req_done = 1;
        read_body_done(c, 0);
    } else if (c->rq->head.body == HTTP1_BODY_LENGTH && c->rq->head.content_length > max)
        read_body_done(c, 1);
    else
        buffer_begin(c);
}

void exchange_buffer_body(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    size_t max = c->rq->read_max ? c->rq->read_max : c->conf->client.buffer_body_bytes;
    for (;;) {
        size_t payload;
        int rc = conn_pump_once(c->parser, in, c->body, &payload);
        if (body_counted(c, rc, payload) < 0)
            return;
        if (rc == 1) {
            c->rq->req_done = 1;
            break;
        }
        if (c->rq->body_bytes > max)
            break;
        if (rc == 0) {
            if (c->eof)         /* the rest can never come */
                conn_kill(c);
            else
                buffer_wait(c);
            return;
        }
    }
    conn_timer(c, TM_NONE, 0);
    if (c->rq->body_first) {        /* the decision waited for the body */
        c->rq->body_first = 0;
        c->rq->body_buffered = 1;
        c->rq->xops->buffered(c);
        return;
    }
    if (c->rq->read_max)
        read_body_done(c, !c->rq->req_done);
    else
        exchange_start(c, c->rq->xops);
}

/* Behind the head: the body read so far, framed as streaming would have
 * framed it (as is, or as one chunk of ours and the last chunk when whole). */
static void buffer_send(struct client *c)
{
    struct evbuffer *uo = io_output(c->rq->up->io);
    int chunked = c->rq->head.body == HTTP1_BODY_CHUNKED;
    size_t n = c->body ? evbuffer_get_length(c->body) : 0;
    buffer_release_head(c);
    if (chunked && n > 0)
        add_hex(uo, n);
    if (n > 0)
        evbuffer_add_buffer(uo, c->body);
    if (chunked && n > 0)
        evbuffer_add(uo, "\r\n", 2);
    if (chunked && c->rq->req_done)
        evbuffer_add(uo, "0\r\n\r\n", 5);
}

/* While a body streams, a read from the client brings at most what the
 * upstream's output may still take (up to CONN_HIGH_WATER), and reading
 * stops when it can take nothing: a stalled upload holds CONN_HIGH_WATER,
 * not that plus a read's 16 KiB chain behind it. 0: reading stopped.
 * client_request_done() gives the heads' read mark back. */
static int client_reads_fit(struct client *c, struct evbuffer *uo)
{
    size_t queued = evbuffer_get_length(uo);
    if (queued >= CONN_HIGH_WATER) {
        io_disable(c->io, EV_READ);
        c->client_paused = 1;
        return 0;
    }
    io_setwatermark(c->io, EV_READ, evbuffer_get_length(io_input(c->io)) +
                                    CONN_HIGH_WATER - queued);
    return 1;
}

void exchange_pump_request(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    struct evbuffer *uo = io_output(c->rq->up->io);
    int chunked = c->rq->head.body == HTTP1_BODY_CHUNKED;

    while (!c->rq->req_done && c->rq->up) {
        size_t queued = evbuffer_get_length(uo);
        if (!client_reads_fit(c, uo))
            return;
        size_t payload;
        int rc = pump_body(c->parser, in, uo, lazy_buffer(&c->body), NULL, chunked,
                           CONN_HIGH_WATER - queued, &payload, NULL);
        if (body_counted(c, rc, payload) < 0)
            return;
        if (rc == 1) {
            c->rq->req_done = 1;
            up_timeouts(c);
            conn_timer(c, TM_NONE, 0);
        } else if (rc == 0) {
            client_reads_fit(c, uo);
            conn_timer(c, TM_BODY, c->conf->client.body_timeout_ms);
            return;
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
            have[0] = http1_span_uint(buf, hd->value, &up->limit);
        else if (span_is(buf, hd->name, "x-ratelimit-remaining"))
            have[1] = http1_span_uint(buf, hd->value, &up->remaining);
        else if (span_is(buf, hd->name, "x-ratelimit-reset"))
            have[2] = http1_span_uint(buf, hd->value, &up->reset);
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

/* A header's or trailer's cost: a whole number, OWS around it; -1 when
 * it is not one (or above LIMITER_MAX_LIMIT). */
static int64_t cost_number(const char *v, size_t n)
{
    size_t i = 0;
    int64_t x = 0;
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (i < n && (v[i] == ' ' || v[i] == '\t'))
        i++;
    if (i == n)
        return -1;
    for (; i < n; i++) {
        if (v[i] < '0' || v[i] > '9' || x > LIMITER_MAX_LIMIT)
            return -1;
        x = x * 10 + (v[i] - '0');
    }
    return x > LIMITER_MAX_LIMIT ? -1 : x;
}

static void cost_settled(void *arg, int verdict);

/* The final response head is in: where its cost_from limit's cost comes
 * from. A header settles now, and the head waits until Redis has applied
 * it (returns 1: cost_settled resumes); a trailer is watched for and a
 * JSON or SSE body scanned, both settled at the body's end (cost_end),
 * the body passing through c->tail so that its last bytes can wait. */
static int cost_begin(struct client *c, const char *buf)
{
    const struct conf_limit *l = decide_cost_limit(&c->rq->dec);
    struct upstream_conn *uc = c->rq->up;
    if (l == NULL)
        return 0;
    int body = uc->head.body != HTTP1_BODY_NONE;
    if (l->cost_from == CONF_COST_HEADER) {
        int i = http1_find(buf, &uc->head, l->cost_name, 0);
        int64_t v = i < 0 || http1_find(buf, &uc->head, l->cost_name, i + 1) >= 0 ? -1 :
                    cost_number(buf + uc->head.h[i].value.off, uc->head.h[i].value.len);
        if (!decide_settle(&c->rq->dec, v, cost_settled, c))
            return 0;
        io_disable(uc->io, EV_READ);
        return 1;
    }
    if (l->cost_from == CONF_COST_TRAILER && uc->head.body == HTTP1_BODY_CHUNKED) {
        http1_trailer_watch(uc->parser, l->cost_name);
        c->rq->cost_hold = 1;
    } else if ((l->cost_from == CONF_COST_JSON || l->cost_from == CONF_COST_SSE) && body) {
        jsonscan_init(&c->rq->cost_scan, l->cost_name, l->cost_from == CONF_COST_SSE);
        c->rq->cost_scanning = 1;
        c->rq->cost_hold = 1;
    } else {
        decide_settle(&c->rq->dec, -1, NULL, NULL);     /* no body, no trailer: the estimate */
    }
    return 0;
}

/* The cost the response's body or trailer carried; -1: none. */
static int64_t cost_end_value(struct client *c)
{
    const struct conf_limit *l = decide_cost_limit(&c->rq->dec);
    int64_t v = -1;
    if (l != NULL && l->cost_from == CONF_COST_TRAILER) {
        const char *t;
        size_t n;
        if (http1_trailer_value(c->rq->up->parser, &t, &n))
            v = cost_number(t, n);
    } else if (c->rq->cost_scanning && !jsonscan_result(&c->rq->cost_scan, &v)) {
        v = -1;
    }
    c->rq->cost_scanning = 0;
    return v;
}

/* The response body ended: settle with what it carried. Returns 1 while
 * its end waits for that (cost_settled follows). */
static int cost_end(struct client *c)
{
    return decide_settle(&c->rq->dec, cost_end_value(c), cost_settled, c);
}

/* Status line and fields as the upstream sent them, less hop-by-hop fields,
 * plus ours; the body framing chosen for this client. A 101 gets the same,
 * with its Upgrade field and Connection: upgrade. */
static void write_response_head(struct client *c, const char *buf)
{
    const struct http1_head *h = &c->rq->up->head;
    struct obuf ob;
    enum conf_headers mode = c->rq->dec.have_limits ? c->rq->route->headers : CONF_HEADERS_NONE;

    if (h->body == HTTP1_BODY_CHUNKED || h->body == HTTP1_BODY_EOF) {
        if (c->rq->head.minor >= 1)
            c->rq->out_chunked = 1;
        else
            c->keep_alive = 0;      /* HTTP/1.0: the close ends the body */
    }
    struct h1write_resp o = {
        .rid = c->rq->rid, .rid_len = c->rq->rid_len,
        .limits = mode,
        .head_request = c->rq->head_request,
        .chunked = c->rq->out_chunked,
        .close = !c->keep_alive || c->eof,
        .keep_alive_10 = c->rq->head.minor == 0,
    };
    obuf_begin(&ob, io_output(c->io), h->len + 1024);
    h1write_response_begin(&ob, buf, h, &o);
    if (mode != CONF_HEADERS_NONE) {
        struct reply_upstream up;
        upstream_limits(buf, h, &up);
        reply_limit_headers(&ob, &c->rq->dec.rl, 0, &up);
    }
    h1write_response_end(&ob, buf, h, &o);
    obuf_end(&ob);
}

/* Move what each side has to the other. */
void exchange_tunnel_pump(struct client *c)
{
    struct io *ub = c->rq->up->io;
    struct evbuffer *out = io_output(c->io);
    struct evbuffer *uo = io_output(ub);
    move_all(uo, io_input(c->io));
    move_all(out, io_input(ub));
    /* Whichever side is slow to read holds back the other. */
    if (evbuffer_get_length(uo) > CONN_HIGH_WATER) {
        io_disable(c->io, EV_READ);
        c->client_paused = 1;
    }
    if (evbuffer_get_length(out) > CONN_HIGH_WATER) {
        io_disable(ub, EV_READ);
        c->up_paused = 1;
    }
}

/* After the 101 the connection belongs to the upgraded protocol: no more
 * HTTP parsing, no timeouts (a WebSocket may idle for long). */
static void start_tunnel(struct client *c)
{
    c->state = CS_TUNNEL;
    c->rq->resp_started = 1;
    c->keep_alive = 0;
    conn_timer(c, TM_NONE, 0);
    io_set_timeouts(c->io, NULL, NULL);
    io_set_timeouts(c->rq->up->io, NULL, NULL);
    io_setwatermark(c->io, EV_READ, 0);
    exchange_tunnel_pump(c);
}

/* An interim response was read: pass on a clean 100 Continue the client
 * asked for (a bounded number), and hold the wait for the final head to
 * the upstream timeout counted from the request's end, however many come.
 * Returns -1 when the time is up (answered). */
static int interim_response(struct client *c, int status)
{
    struct upstream_conn *uc = c->rq->up;
    c->rq->interims++;
    if (status == 100 && c->rq->head.expect_continue &&
        c->rq->interims_relayed < EXCHANGE_INTERIM_RELAYED) {
        evbuffer_add(io_output(c->io), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        c->rq->interims_relayed++;
    }
    if (c->rq->up_deadline_ms == 0)
        return 0;           /* the request is still being sent */
    int64_t left = c->rq->up_deadline_ms - clock_ms();
    if (left <= 0) {
        log_warn("exchange: upstream '%s' timed out after %d interim responses",
                 upstream_conf(uc->pool)->servers[uc->server].text, c->rq->interims);
        c->rq->xops->fail(c, 504);
        return -1;
    }
    struct timeval tv = clock_timeval(left);
    io_set_timeouts(uc->io, &tv, &tv);
    return 0;
}

/* A gRPC answer's grpc-status (in a Trailers-Only head, or in trailers),
 * for the access log and the metrics. */
static void grpc_status_count(struct client *c, const char *buf, struct http1_span v)
{
    int64_t code;
    if (!http1_span_uint(buf, v, &code) || code >= METRICS_NGRPC)
        return;
    if (c->rq->log)
        c->rq->log->grpc_status = (int)code;
    metrics_grpc(c->rq->route->metrics, (int)code);
}

static void grpc_status_seen(struct client *c, const char *buf, const struct http1_head *h)
{
    int i = c->rq->grpc ? http1_find(buf, h, "grpc-status", 0) : -1;
    if (i >= 0)
        grpc_status_count(c, buf, h->h[i].value);
}

/* The same from the trailer section of a chunked response (c->trailers,
 * "name: value" lines checked by http1.c, then an empty one). */
static void grpc_trailers_seen(struct client *c)
{
    struct evbuffer *t = c->trailers;
    if (!c->rq->grpc || t == NULL || evbuffer_get_length(t) == 0)
        return;
    size_t n = evbuffer_get_length(t);
    const char *s = (const char *)evbuffer_pullup(t, -1), *end = s + n;
    for (const char *line = s; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL)
            break;
        if (eol - line > 13 && strncasecmp(line, "grpc-status:", 12) == 0) {
            const char *p = line + 12;
            while (*p == ' ' || *p == '\t')
                p++;
            struct http1_span sp = { (uint32_t)(p - s), 0 };
            while (p < eol && *p >= '0' && *p <= '9')
                p++;
            sp.len = (uint32_t)(p - s) - sp.off;
            grpc_status_count(c, s, sp);
            break;
        }
        line = eol + 1;
    }
    evbuffer_drain(t, n);
}

/* Parse response heads until a final one is sent to the client.
 * Returns 0 to wait, 1 when the final head was written, -1 on failure
 * (already handled). */
static int read_response_head(struct client *c)
{
    struct upstream_conn *uc = c->rq->up;
    struct evbuffer *ui = io_input(uc->io);
    for (;;) {
        size_t len = evbuffer_get_length(ui);
        if (len == 0)
            return 0;
        size_t n = len > EXCHANGE_RESP_HEAD_MAX + 1 ? EXCHANGE_RESP_HEAD_MAX + 1 : len;
        const char *data = (const char *)evbuffer_pullup(ui, (ssize_t)n);
        int rc = http1_head_feed(uc->parser, data, n, EXCHANGE_RESP_HEAD_MAX,
                                 c->rq->head_request, &uc->head);
        if (rc == 1)
            return 0;
        if (rc == 0)
            rc = h1write_response_check(data, &uc->head);
        if (rc != 0) {
            log_warn("exchange: bad response head from upstream '%s': closing it",
                     upstream_conf(uc->pool)->servers[uc->server].text);
            c->rq->xops->fail(c, 502);
            return -1;
        }
        int status = uc->head.status;
        if (status >= 100 && status < 200 && status != 101) {
            evbuffer_drain(ui, uc->head.len);
            if (interim_response(c, status) < 0)
                return -1;
            continue;
        }
        if (c->rq->interims > 0)
            up_timeouts(c);     /* body reads get the whole timeout again */
        if (status == 101) {
            const struct conf_route *r = c->rq->route;
            /* a switch nobody asked for, or to a protocol not asked for */
            if (!c->rq->upgrade ||
                !h1write_upgrade_ok(data, &uc->head, r->upgrade_protos, r->nupgrade_protos)) {
                c->rq->xops->fail(c, 502);
                return -1;
            }
            c->rq->xops->drain_head(c);
            c->rq->xops->count_response(c, status);
            write_response_head(c, data);
            evbuffer_drain(ui, uc->head.len);
            start_tunnel(c);
            return -1;
        }
        if (c->rq->dec.count_call || c->rq->xops->consume_counted(c, status))
            return 0;   /* counted_done_cb resumes */
        if (c->rq->dec.settle_call || cost_begin(c, data))
            return 0;   /* cost_settled resumes */
        c->rq->xops->drain_head(c);  /* the request head is no longer needed for a retry */
        c->rq->xops->count_response(c, status);
        grpc_status_seen(c, data, &uc->head);
        size_t out_before = evbuffer_get_length(io_output(c->io));
        if (c->trailers)            /* what the last response left */
            evbuffer_drain(c->trailers, evbuffer_get_length(c->trailers));
        write_response_head(c, data);
        c->rq->xops->count_out(c, evbuffer_get_length(io_output(c->io)) - out_before);
        evbuffer_drain(ui, uc->head.len);
        c->rq->resp_started = 1;
        if (uc->head.body == HTTP1_BODY_NONE)
            c->rq->resp_done = 1;
        return 1;
    }
}

void exchange_pump_response(struct client *c)
{
    struct upstream_conn *uc = c->rq->up;
    struct evbuffer *ui = io_input(uc->io);
    struct evbuffer *out = io_output(c->io);
    while (!c->rq->resp_done && !c->rq->dec.settle_call) {
        size_t queued = evbuffer_get_length(out);
        if (queued > CONN_HIGH_WATER) {
            io_disable(uc->io, EV_READ);
            c->up_paused = 1;
            return;
        }
        size_t payload;
        struct evbuffer *to = c->rq->cost_hold ? lazy_buffer(&c->tail) : out;
        int rc = pump_body(uc->parser, ui, to, lazy_buffer(&c->body),
                           lazy_buffer(&c->trailers), c->rq->out_chunked,
                           CONN_HIGH_WATER - queued, &payload, c->rq);
        c->rq->xops->count_out(c, payload);
        if (rc < 0) {
            evbuffer_drain(to, evbuffer_get_length(to));
            log_warn("exchange: bad response body from upstream '%s': cutting the client",
                     upstream_conf(uc->pool)->servers[uc->server].text);
            c->rq->xops->fail(c, 502);
            return;
        }
        if (rc == 1 && cost_end(c)) {
            io_disable(uc->io, EV_READ);    /* the end waits: cost_settled */
            return;
        }
        if (to != out)
            move_all(out, to);
        if (rc == 1) {
            c->rq->resp_done = 1;
            grpc_trailers_seen(c);
        } else if (rc == 0) {
            return;
        }
    }
}

/* A settlement is applied: the response's head, or its last bytes, go on. */
static void cost_settled(void *arg, int verdict)
{
    struct client *c = arg;
    conn_enter(c);
    if (c->rq->up)
        io_enable(c->rq->up->io, EV_READ);
    if (!c->rq->resp_started) {
        exchange_resume(c);
    } else {
        if (c->tail)
            move_all(io_output(c->io), c->tail);
        c->rq->resp_done = 1;
        grpc_trailers_seen(c);
        if (!c->dead && c->rq->up)
            exchange_maybe_finish(c);
        if (!c->dead)
            c->ops->process(c);
    }
    conn_leave(c);
}

/* Both directions finished: give the upstream connection back when it is
 * clean, then serve the next request or close. */
void exchange_maybe_finish(struct client *c)
{
    if (!c->rq->req_done || !c->rq->resp_done || c->state != CS_PROXY)
        return;
    struct upstream_conn *uc = c->rq->up;
    c->rq->up = NULL;
    int64_t up_us = clock_us() - c->rq->upstream_start_us;
    metrics_observe(METRICS_UPSTREAM_SECONDS, up_us);
    if (c->rq->log)
        c->rq->log->upstream_us = up_us;
    if (uc->head.keep_alive && uc->head.body != HTTP1_BODY_EOF)
        upstream_release(uc);
    else
        upstream_close(uc);
    c->ops->request_done(c);
}

static void up_read_cb(struct io *io, void *arg)
{
    struct client *c = arg;
    conn_enter(c);
    if (c->state == CS_TUNNEL) {
        exchange_tunnel_pump(c);
        goto out;
    }
    if (!c->rq->resp_started && read_response_head(c) <= 0)
        goto out;
    exchange_pump_response(c);
    if (!c->dead && c->rq->up)
        exchange_maybe_finish(c);
    if (!c->dead)
        c->ops->process(c);
out:
    conn_leave(c);
}

/* Carry on with a response that waited (count_status consumption). */
void exchange_resume(struct client *c)
{
    if (!c->dead && c->rq->up && !c->rq->resp_started && read_response_head(c) > 0) {
        exchange_pump_response(c);
        if (!c->dead && c->rq->up)
            exchange_maybe_finish(c);
    }
    if (!c->dead)
        c->ops->process(c);
}

/* The request's output drained to the low mark after the socket had been
 * full. */
static void up_write_cb(struct io *io, void *arg)
{
    struct client *c = arg;
    conn_enter(c);
    conn_leave(c);        /* resumes the client if it was held back */
}

static void up_event_cb(struct io *io, short what, void *arg)
{
    struct client *c = arg;
    struct upstream_conn *uc = c->rq->up;
    const struct conf_upstream *cu = upstream_conf(uc->pool);
    conn_enter(c);
    if (what & IO_CONNECTED) {
        upstream_connected(uc);
        up_timeouts(c);
        goto out;
    }
    if (c->state == CS_TUNNEL) {
        exchange_tunnel_pump(c);
        upstream_close(uc);
        c->rq->up = NULL;
        conn_close_after_write(c);
        goto out;
    }
    if ((what & IO_EOF) && c->rq->resp_started && uc->head.body == HTTP1_BODY_EOF) {
        exchange_pump_response(c);
        if (!c->dead && !c->rq->resp_done && http1_body_eof(uc->parser)) {
            c->rq->resp_done = 1;
            decide_settle(&c->rq->dec, cost_end_value(c), NULL, NULL);  /* the close ends it */
            if (c->tail)
                move_all(io_output(c->io), c->tail);
            if (c->rq->out_chunked)
                evbuffer_add(io_output(c->io), "0\r\n\r\n", 5);
            exchange_maybe_finish(c);
            c->ops->process(c);
            goto out;
        }
    }
    /* A kept-alive connection the server had closed, or an h2 request the
     * server did not process: try once more on a fresh connection if
     * nothing was sent back and the request can be resent. */
    if (!c->rq->resp_started && (uc->reused || uc->unprocessed) && !c->rq->retried &&
        c->rq->head_in_input &&
        !(what & IO_TIMEOUT)) {
        /* Borrow first: closing the last borrowed connection of a retired
         * pool frees the pool. */
        c->rq->up = NULL;
        c->rq->retried = 1;
        int ok = pool_connect(c, uc->pool, 1) == 0;
        upstream_close(uc);
        if (ok) {
            c->rq->xops->refresh_head(c);
            write_request_head(c, io_output(c->rq->up->io));
        } else {
            c->rq->xops->fail(c, 502);
            if (!c->dead)
                c->ops->process(c);
        }
        goto out;
    }
    if (upstream_tls_failed(uc, what))
        ;                       /* logged and counted */
    else if (what & IO_TIMEOUT)
        log_warn("exchange: upstream '%s' timed out", cu->servers[uc->server].text);
    else
        log_warn("exchange: upstream '%s' failed: %s", cu->servers[uc->server].text,
                 evutil_socket_error_to_string(io_errno(uc->io)));
    c->rq->xops->fail(c, (what & IO_TIMEOUT) ? 504 : 502);
    if (!c->dead)
        c->ops->process(c);
out:
    conn_leave(c);
}

