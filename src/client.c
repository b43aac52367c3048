/* sluice - client.c: a downstream connection (client.h).
 *
 * Accept, the timers (header, body, discard, idle), pipelining (one
 * request at a time; pipelined heads wait in the input, which keeps
 * responses in order), backpressure by watermarks, write coalescing, and
 * the worker's client set. What each request does is request.c's. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "client.h"
#include "clock.h"
#include "conf.h"
#include "decide.h"
#include "exchange.h"
#include "http1.h"
#include "mem.h"
#include "metrics.h"
#include "request.h"
#include "runtime.h"
#include "route.h"
#include "upstream.h"
#include "worker.h"

/* Input kept from a client beyond the request being served (pipelining). */
#define CLIENT_INPUT_MAX    (64 * 1024)

/* ---- lifetime ---------------------------------------------------------- */

static void client_free(struct client *c)
{
    struct worker *w = c->w;
    decide_cancel(&c->rq);
    if (c->up)
        upstream_close(c->up);
    request_free(&c->rq);
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
    free(c);
    if (w->stopping && w->nclients == 0)    /* drained: the worker's loop ends */
        event_base_loopexit(w->base, NULL);
}

void client_enter(struct client *c)
{
    c->busy++;
}


/* Returns 1 when the client was freed. The outermost callback also writes
 * what the others queued (client_flush). */
int client_leave(struct client *c)
{
    if (c->busy == 1 && !c->dead)
        client_flush(c);
    if (--c->busy == 0 && c->dead) {
        client_free(c);
        return 1;
    }
    return 0;
}

void client_kill(struct client *c)
{
    request_log_end(c);      /* a request cut short is logged with what was sent */
    c->dead = 1;
    decide_cancel(&c->rq);
    if (c->up) {
        upstream_close(c->up);
        c->up = NULL;
    }
}

void client_timer(struct client *c, enum timer_mode mode, int64_t ms)
{
    c->timer_mode = mode;
    if (mode == TM_NONE) {
        event_del(c->timer);
        return;
    }
    struct timeval tv = clock_timeval(ms);
    event_add(c->timer, &tv);
}

/* Stop reading requests and close once what is queued has been written. */
void client_close_after_write(struct client *c)
{
    request_log_end(c);
    c->state = CS_CLOSING;
    c->keep_alive = 0;
    client_timer(c, TM_NONE, 0);
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        client_kill(c);
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
void client_out_idle(struct bufferevent *bev)
{
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
}

/* Flush both sides, then do what the freed space allows: resume a side that
 * backpressure stopped. Bounded: each round needs progress. */
void client_flush(struct client *c)
{
    for (int round = 0; round < 16 && !c->dead; round++) {
        int progress = 0;
        out_flush(c->bev);
        if (c->up && c->up->connected)
            out_flush(c->up->bev);
        if (c->client_paused && c->up &&
            evbuffer_get_length(bufferevent_get_output(c->up->bev)) <= CLIENT_HIGH_WATER / 2) {
            c->client_paused = 0;
            bufferevent_enable(c->bev, EV_READ);
            client_process(c);
            progress = 1;
        }
        if (!c->dead && c->up_paused && c->up &&
            evbuffer_get_length(bufferevent_get_output(c->bev)) <= CLIENT_HIGH_WATER / 2) {
            c->up_paused = 0;
            bufferevent_enable(c->up->bev, EV_READ);
            if (c->state == CS_TUNNEL) {
                exchange_tunnel_pump(c);
            } else {
                exchange_pump_response(c);
                if (!c->dead && c->up)
                    exchange_maybe_finish(c);
            }
            if (!c->dead)
                client_process(c);
            progress = 1;
        }
        /* Answers sluice wrote itself filled the output while pipelined
         * heads waited: once it drains, go on with them (a write that
         * completed at once arms no write event to do it). */
        if (!c->dead && c->heads_paused &&
            evbuffer_get_length(bufferevent_get_output(c->bev)) <= CLIENT_HIGH_WATER / 2) {
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
void client_request_done(struct client *c)
{
    request_log_end(c);
    request_drain_head(c);
    c->route = NULL;
    runtime_release(c->rq.rt);  /* an idle connection holds no runtime */
    c->rq.rt = NULL;
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
    request_head(c);
    return !c->dead && c->state == CS_HEAD && evbuffer_get_length(in) < before;
}

/* Do whatever the bytes in hand allow, until the state needs to wait. */
void client_process(struct client *c)
{
    for (int rounds = 0; !c->dead && rounds < 1000; rounds++) {
        enum client_state before = c->state;
        switch (c->state) {
        case CS_HEAD:
            /* Pipelined requests wait while our output is backed up. */
            if (evbuffer_get_length(bufferevent_get_output(c->bev)) > CLIENT_HIGH_WATER) {
                c->heads_paused = 1;    /* client_flush resumes once written */
                return;
            }
            if (parse_head_answered(c))
                continue;
            break;
        case CS_PROXY:
            if (!c->req_done && c->up)
                exchange_pump_request(c);
            if (!c->dead && c->up)
                exchange_maybe_finish(c);
            break;
        case CS_BUFFER:
            exchange_buffer_body(c);
            break;
        case CS_DISCARD:
            request_discard_body(c);
            break;
        case CS_TUNNEL:
            if (c->up)
                exchange_tunnel_pump(c);
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
    client_out_idle(bev);
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
            exchange_tunnel_pump(c);
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
        decide_cancel(&c->rq);
        request_reset(&c->rq);  /* not the id of the request before */
        c->head_request = 0;
        request_log_begin(c, 0);
        request_answer(c, 408, 1);
    } else if (c->timer_mode == TM_BODY && c->state == CS_BUFFER) {
        /* A small body too slow to arrive: nothing went upstream yet. */
        request_answer(c, 408, 1);
    } else {
        client_kill(c);     /* idle keep-alive, or a stalled body */
    }
    client_leave(c);
}

void client_accept(struct worker *w, int fd, const struct sockaddr *peer, int peerlen)
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
    struct timeval wt = clock_timeval(conf->client.idle_timeout_ms);
    bufferevent_set_timeouts(bev, NULL, &wt);
    bufferevent_setwatermark(bev, EV_READ, 0, conf->client.max_header_bytes + CLIENT_INPUT_MAX);
    bufferevent_setwatermark(bev, EV_WRITE, CLIENT_HIGH_WATER / 2, 0);
    bufferevent_setcb(bev, client_read_cb, client_write_cb, client_event_cb, c);
    bufferevent_enable(bev, EV_READ);
    bufferevent_disable(bev, EV_WRITE);     /* on by default; writes: client_flush */
    client_timer(c, TM_IDLE, conf->client.idle_timeout_ms);
}

void client_drain(struct worker *w)
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

void client_close_all(struct worker *w)
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

