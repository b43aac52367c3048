/* sluice - client.c: a downstream connection (client.h).
 *
 * Accept, the timers' outcomes (header, body, discard, idle), pipelining
 * (one request at a time; pipelined heads wait in the input, which keeps
 * responses in order), resuming a side backpressure stopped, and the
 * worker's client set (lent in struct conn_env); the services under them
 * (lifetime, write coalescing, watermarks) are conn.c's. What each request
 * does is request.c's, its upstream exchange exchange.c's; they reach back
 * here only through client_ops (conn.h). */
#include <assert.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "client.h"
#include "clock.h"
#include "conn.h"
#include "conf.h"
#include "decide.h"
#include "exchange.h"
#include "h2srv.h"
#include "http1.h"
#include "io.h"
#include "mem.h"
#include "metrics.h"
#include "request.h"
#include "runtime.h"
#include "route.h"
#include "tls_server.h"
#include "upstream.h"

static_assert(CONF_MAX_HEADER_BYTES == HTTP1_MAX_HEAD_BYTES, /* NOLINT(misc-redundant-expression) */
              "client.max_header_bytes is bounded by what http1.c parses");

/* Input kept from a client beyond the request being served (pipelining). */
#define CLIENT_INPUT_MAX    (64 * 1024)

/* ---- lifetime ---------------------------------------------------------- */

static void client_free(struct client *c)
{
    struct conn_env *env = c->env;
    if (c->rq)
        decide_cancel(&c->rq->dec);
    if (c->rq && c->rq->up)
        upstream_close(c->rq->up);
    request_put(env, c->rq);
    list_unlink(&env->clients, &c->link);
    if (!c->h2_stream) {
        env->nclients--;
        metrics_gauge_add(METRICS_CONN_CLIENT, -1);
    }
    event_free(c->timer);
    h2srv_free(c->h2);      /* owns the connection's io then (c->io NULL) */
    io_free(c->io);
    http1_destroy(c->parser);
    if (c->body)
        evbuffer_free(c->body);
    if (c->held)
        evbuffer_free(c->held);
    if (c->tail)
        evbuffer_free(c->tail);
    if (c->trailers)
        evbuffer_free(c->trailers);
    conf_release(c->conf);
    free(c);
    if (env->stopping && env->nclients == 0)    /* drained: the worker's loop ends */
        event_base_loopexit(env->base, NULL);
}

/* ---- the client connection --------------------------------------------- */

/* Reading heads: input up to a whole head plus pipelined requests (a body
 * streaming upstream reads less: exchange.c's client_reads_fit). */
static void client_read_heads(struct client *c)
{
    io_setwatermark(c->io, EV_READ, c->conf->client.max_header_bytes + CLIENT_INPUT_MAX);
}

/* The current request is over (answered and its body read): wait for the
 * next one, or close. */
static void client_request_done(struct client *c)
{
    decide_release(&c->rq->dec);    /* the response is sent: concurrency slots go back */
    request_log_end(c);
    request_drain_head(c);
    c->rq->route = NULL;
    runtime_release(c->rq->rt);  /* an idle connection holds no runtime */
    c->rq->rt = NULL;
    if (!c->keep_alive || c->eof || c->env->stopping) {
        conn_close_after_write(c);
        return;
    }
    c->state = CS_HEAD;
    client_read_heads(c);
    if (evbuffer_get_length(io_input(c->io)) == 0) {
        conn_timer(c, TM_IDLE, c->conf->client.idle_timeout_ms);
        request_put(c->env, c->rq);     /* idle: no request state until the next head */
        c->rq = NULL;
    } else {
        conn_timer(c, TM_HEADER, c->conf->client.header_timeout_ms);
    }
}

/* The request state, taken from the worker's spares when a head begins. */
static struct request *client_request(struct client *c)
{
    if (c->rq == NULL)
        c->rq = request_get(c->env);
    return c->rq;
}

/* Parse the next head. Returns 1 when sluice answered it at once (404, 429
 * from the deny cache, 400 for a bad cost...) and waits for a head again:
 * the next pipelined request may be in the input already, and no read event
 * will come for bytes that were read. */
static int parse_head_answered(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    size_t before = evbuffer_get_length(in);
    if (before == 0)
        return 0;
    client_request(c);
    request_head(c);
    return !c->dead && c->state == CS_HEAD && evbuffer_get_length(in) < before;
}

/* While a request waits for its decision, or a delay holds it, no more of
 * the client is read: what sluice keeps of its body is what came with the
 * head in the same read (one read, at most 16 KiB on a plain connection);
 * the rest waits in the kernel's socket buffer. Reading resumes (and the
 * end watch the hold armed goes) once it is decided. */
static void client_bound_input(struct client *c)
{
    int deciding = c->state == CS_DECIDE;
    if (deciding == c->input_bounded)
        return;
    c->input_bounded = deciding;
    if (deciding) {
        size_t have = evbuffer_get_length(io_input(c->io));
        io_setwatermark(c->io, EV_READ, have ? have : 1);
        return;
    }
    io_watch_end(c->io, 0);
    if (c->state != CS_TUNNEL)          /* a tunnel reads without a mark */
        client_read_heads(c);           /* until a streaming body sets its own */
}

/* ---- HTTP/2 ------------------------------------------------------------- */

static int client_h2_open(void *arg, struct io *io, int refused);

static void client_h2_ended(void *arg)
{
    struct client *c = arg;
    conn_kill(c);
    if (c->busy == 0)
        client_free(c);
}

static const struct h2srv_ops client_h2_ops = {
    .open = client_h2_open,
    .ended = client_h2_ended,
};

/* The connection speaks HTTP/2 from here: the session takes its io, and
 * each stream becomes a client (client_h2_open). */
static void client_h2_start(struct client *c)
{
    const struct conf_client *cc = &c->conf->client;
    struct h2srv_limits lim = {
        .max_streams = cc->http2_max_streams,
        .max_requests = cc->http2_max_requests,
        .max_header_bytes = cc->max_header_bytes,
        .preface_timeout_ms = cc->header_timeout_ms,
        .idle_timeout_ms = cc->idle_timeout_ms,
    };
    conn_timer(c, TM_NONE, 0);
    c->first_bytes = 0;
    c->state = CS_H2;
    request_put(c->env, c->rq);
    c->rq = NULL;
    http1_destroy(c->parser);   /* its streams parse; the connection never does */
    c->parser = NULL;
    c->h2 = h2srv_new(c->env->base, c->io, &lim, c->tls, &client_h2_ops, c);
    c->io = NULL;
}

/* The first bytes of a plain connection: 0 for HTTP/1.x, 1 to wait for
 * the rest of what may be the HTTP/2 preface, 2 when it was (the
 * connection is the session's now). */
static int client_preface(struct client *c)
{
    struct evbuffer *in = io_input(c->io);
    size_t n = evbuffer_get_length(in);
    if (n == 0)
        return 1;
    size_t k = n < H2SRV_PREFACE_LEN ? n : H2SRV_PREFACE_LEN;
    if (memcmp(evbuffer_pullup(in, (ssize_t)k), H2SRV_PREFACE, k) != 0) {
        c->first_bytes = 0;
        return 0;
    }
    if (k < H2SRV_PREFACE_LEN)
        return 1;
    client_h2_start(c);
    return 2;
}

/* Do whatever the bytes in hand allow, until the state needs to wait. */
static void client_process(struct client *c)
{
    for (int rounds = 0; !c->dead && rounds < 1000; rounds++) {
        client_bound_input(c);
        enum client_state before = c->state;
        switch (c->state) {
        case CS_HEAD:
            /* Pipelined requests wait while our output is backed up. */
            if (evbuffer_get_length(io_output(c->io)) > CONN_HIGH_WATER) {
                c->heads_paused = 1;    /* conn_flush resumes once written */
                return;
            }
            if (c->first_bytes && client_preface(c) != 0)
                return;
            if (c->h2_refused) {
                int status = c->h2_refused;
                c->h2_refused = 0;
                client_request(c);
                request_refuse_head(c, status);
                continue;
            }
            if (parse_head_answered(c))
                continue;
            break;
        case CS_PROXY:
            if (!c->rq->req_done && c->rq->up)
                exchange_pump_request(c);
            if (!c->dead && c->rq->up)
                exchange_maybe_finish(c);
            break;
        case CS_BUFFER:
            exchange_buffer_body(c);
            break;
        case CS_DISCARD:
            request_discard_body(c);
            break;
        case CS_TUNNEL:
            if (c->rq->up)
                exchange_tunnel_pump(c);
            return;
        case CS_DECIDE:
        case CS_CLOSING:
        case CS_H2:
            return;
        }
        if (c->state == before)
            return;
    }
    /* Still going after many requests: go on from the event loop, after
     * the other connections have had their turn. */
    if (!c->dead)
        io_trigger_read(c->io);
}

static void client_cancel(struct client *c)
{
    if (c->rq)
        request_cancel(c->rq);
}

/* Our output drained below the low mark: the upstream may be read again. */
static void client_up_resumed(struct client *c)
{
    if (c->state == CS_TUNNEL) {
        exchange_tunnel_pump(c);
    } else {
        exchange_pump_response(c);
        if (!c->dead && c->rq->up)
            exchange_maybe_finish(c);
    }
    if (!c->dead)
        client_process(c);
}

/* An idle connection has no request to log. */
static void client_log_end(struct client *c)
{
    if (c->rq)
        request_log_end(c);
}

static const struct conn_ops client_ops = {
    .process = client_process,
    .request_done = client_request_done,
    .log_end = client_log_end,
    .cancel = client_cancel,
    .up_resumed = client_up_resumed,
    .free = client_free,
};

static void client_read_cb(struct io *io, void *arg)
{
    struct client *c = arg;
    conn_enter(c);
    client_process(c);
    conn_leave(c);
}

/* The output drained to the low mark after the socket had been full. */
static void client_write_cb(struct io *io, void *arg)
{
    struct client *c = arg;
    conn_enter(c);
    if (c->state != CS_CLOSING)
        client_process(c);
    conn_leave(c);        /* resumes the upstream, or ends a closing client */
}

/* The TLS handshake is done: from here the connection is as a plain one,
 * waiting for its first head. */
static void client_tls_done(struct client *c)
{
    c->handshaking = 0;
    c->tls_version = tls_server_version(io_ssl(c->io));
    metrics_tls_handshake();
    if (c->timer_mode == TM_HANDSHAKE)
        conn_timer(c, TM_IDLE, c->conf->client.idle_timeout_ms);
    if (c->http2 && tls_server_h2(io_ssl(c->io)))
        client_h2_start(c);
}

static void client_event_cb(struct io *io, short what, void *arg)
{
    struct client *c = arg;
    if (what & IO_CONNECTED) {
        client_tls_done(c);
        return;
    }
    conn_enter(c);
    if (c->handshaking) {
        /* Not TLS, a version or cipher refused, or gone: this one only. */
        c->handshaking = 0;
        metrics_tls_failure(tls_server_failure(io_ssl_error(io)));
        conn_kill(c);
        conn_leave(c);
        return;
    }
    if ((what & IO_EOF) && !(what & IO_ERROR)) {
        /* Half-close: a client may send its request and shut its side
         * down; it still gets the answer to a request already read. */
        c->eof = 1;
        c->keep_alive = 0;
        if (c->state == CS_TUNNEL && c->rq->up)
            exchange_tunnel_pump(c);
        /* Except while a delay holds the request: a held client that
         * ends its side is taken as gone (nginx's proxy_ignore_client_abort
         * off), so its reservation comes back at once. */
        int held = c->state == CS_DECIDE && decide_holding(&c->rq->dec);
        int waiting = (c->state == CS_DECIDE && !held) ||
                      (c->state == CS_PROXY && c->rq->req_done);
        if (!waiting && c->state != CS_CLOSING)
            conn_kill(c);
    } else {
        conn_kill(c);     /* reset, or a write timed out */
    }
    conn_leave(c);
}

static void client_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    if (!conn_timer_due(c))
        return;
    conn_enter(c);
    if (c->timer_mode == TM_HANDSHAKE) {
        /* A handshake not done within header_timeout: close, no answer. */
        c->handshaking = 0;
        metrics_tls_failure(METRICS_TLS_TIMEOUT);
        conn_kill(c);
    } else if (c->timer_mode == TM_HEADER && c->state == CS_HEAD) {
        /* A head that does not arrive in time (slowloris): 408, close. */
        decide_cancel(&client_request(c)->dec);
        request_reset(c->rq);  /* not the id of the request before */
        request_log_begin(c, 0);
        request_answer(c, 408, 1);
    } else if (c->timer_mode == TM_BODY && c->state == CS_BUFFER) {
        /* A small body too slow to arrive: nothing went upstream yet. */
        request_answer(c, 408, 1);
    } else {
        conn_kill(c);     /* idle keep-alive, or a stalled body */
    }
    conn_leave(c);
}

/* A client over io, on env's list, with the current config. */
static struct client *client_new(struct conn_env *env, struct io *io)
{
    struct client *c = mem_calloc(1, sizeof(*c));
    c->ops = &client_ops;
    c->env = env;
    c->conf = env->conf;
    conf_retain(c->conf);
    c->io = io;
    c->parser = http1_create(HTTP1_REQUEST);
    c->timer = evtimer_new(env->base, client_timer_cb, c);
    c->state = CS_HEAD;
    list_push(&env->clients, &c->link);
    return c;
}

static void client_start_io(struct client *c)
{
    /* A client that stops reading is dropped after idle_timeout. */
    struct timeval wt = clock_timeval(c->conf->client.idle_timeout_ms);
    io_set_timeouts(c->io, NULL, &wt);
    client_read_heads(c);
    io_setwatermark(c->io, EV_WRITE, CONN_HIGH_WATER / 2);
    io_setcb(c->io, client_read_cb, client_write_cb, client_event_cb, c);
    io_enable(c->io, EV_READ);
}

/* An HTTP/2 stream of connection arg: a client of its own, with the
 * connection's address and TLS, whose first head is in io already. Its
 * write timeout (idle_timeout) also ends a stream whose window the peer
 * never opens. The connection's config may be older: a stream takes the
 * current one, as a new connection would. */
static int client_h2_open(void *arg, struct io *io, int refused)
{
    struct client *p = arg;
    struct client *c = client_new(p->env, io);
    c->h2_stream = 1;
    c->peer = p->peer;
    memcpy(c->peer_text, p->peer_text, sizeof(c->peer_text));
    c->peer_len = p->peer_len;
    c->tls = p->tls;
    c->decision = p->decision;          /* a decision listener's streams are too */
    c->tls_version = p->tls_version;
    client_start_io(c);
    conn_timer(c, TM_HEADER, c->conf->client.header_timeout_ms);
    if (refused) {
        c->h2_refused = refused;
        io_trigger_read(c->io);     /* answered from the loop, not inside nghttp2 */
    }
    return 0;
}

void client_accept(struct conn_env *env, int fd, const struct sockaddr *peer, int peerlen,
                   struct tls_server *tls, int decision, int http2)
{
    struct conf *conf = env->conf;
    /* max_connections is per process; each worker takes its share. */
    int share = conf->max_connections ? (conf->max_connections + conf->workers - 1) / conf->workers : 0;
    if (share && env->nclients >= share) {
        evutil_closesocket(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct ssl_st *ssl = NULL;
    if (tls && (ssl = tls_server_ssl(tls)) == NULL) {
        evutil_closesocket(fd);
        return;
    }
    struct client *c = client_new(env, io_new(env->base, fd, ssl));
    memcpy(&c->peer, peer, (size_t)peerlen < sizeof(c->peer) ? (size_t)peerlen : sizeof(c->peer));
    c->peer_len = route_client_ip(conf, peer, NULL, NULL, c->peer_text);
    c->tls = tls != NULL;
    c->decision = decision;
    c->handshaking = c->tls;
    c->tls_version = "";
    c->http2 = http2;
    c->first_bytes = http2;
    env->nclients++;
    metrics_gauge_add(METRICS_CONN_CLIENT, 1);
    client_start_io(c);
    if (c->tls)
        conn_timer(c, TM_HANDSHAKE, conf->client.header_timeout_ms);
    else
        conn_timer(c, TM_IDLE, conf->client.idle_timeout_ms);
}

void client_drain(struct conn_env *env)
{
    for (struct client *c = LIST_ITEM(env->clients.first, struct client, link), *next; c;
         c = next) {
        next = LIST_ITEM(c->link.next, struct client, link);
        c->keep_alive = 0;
        if (c->state == CS_H2) {
            h2srv_shutdown(c->h2);      /* GOAWAY; its streams finish */
            continue;
        }
        if (c->state == CS_HEAD && evbuffer_get_length(io_input(c->io)) == 0) {
            conn_kill(c);
            if (c->busy == 0)
                client_free(c);
        }
    }
}

void client_close_all(struct conn_env *env)
{
    while (env->clients.first) {
        struct client *c = LIST_ITEM(env->clients.first, struct client, link);
        /* client_free() unlinks the list head, so this is a new client each
         * time; the analyser assumes the head may have a prev. */
        conn_kill(c);     /* NOLINT(clang-analyzer-unix.Malloc) */
        if (c->busy == 0) /* NOLINT(clang-analyzer-unix.Malloc): as above */
            client_free(c);
    }
}

