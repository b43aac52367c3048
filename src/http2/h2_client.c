/* sluice - h2_client.c: nghttp2 client sessions to an upstream (h2_client.h).
 *
 *   exchange --HTTP/1.1 request--> stream io output --h2msg--> HEADERS, DATA
 *   exchange <--HTTP/1.1 response-- stream io input <--------- HEADERS, DATA, trailers
 *
 * A session is one connection (io.h, plain or TLS) driven with
 * mem_recv / mem_send, its output bounded at H2C_OUT_MAX (a data provider
 * is asked for more only below it). No automatic window updates: DATA is
 * consumed (the server may send more) once the exchange read it from the
 * stream's input down to H2C_IN_MARK, so a slow client holds at most a
 * stream window per stream. The request body is taken from the stream's
 * output as far as H2C_BODY_MAX allows and sent as the server's window
 * does. nghttp2 is never re-entered from its own callbacks: sending from
 * outside them goes through the session's kick event. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>

#include "conf.h"
#include "h2_client.h"
#include "h2msg.h"
#include "http1.h"
#include "io.h"
#include "list.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "tls_upstream.h"

#define H2C_OUT_MAX       (64 * 1024)     /* session output queued at most */
#define H2C_IN_MARK       (64 * 1024)     /* stream input kept unread before
                                           * its window closes */
#define H2C_BODY_MAX      (64 * 1024)     /* request payload held per stream */
#define H2C_STREAM_WINDOW (128 * 1024)    /* what a server may send per stream */
#define H2C_CONN_WINDOW   (16 * 1024 * 1024)
#define H2C_HEAD_MAX      (64 * 1024)     /* response fields, as exchange.c reads */
#define H2C_ID_MARGIN     1024            /* new sessions before ids run out */
/* Streams opened on a session before the server's SETTINGS say how many
 * it takes: a burst beyond its limit would be refused (and tried again on
 * new connections), so a few, then more sessions. */
#define H2C_EARLY_STREAMS 16

struct h2_session;

struct h2_stream {
    struct list_link link;          /* on its session's streams */
    struct h2_session *s;           /* NULL once the session is gone */
    struct io *io;                  /* NULL once the exchange freed it */
    int32_t id;                     /* 0 until submitted */
    int gone;                       /* nghttp2 is done with it (closed, or
                                     * its HEADERS never went out) */
    int *unprocessed;               /* the borrower's flag (h2_client_stream) */
    /* The request as the exchange writes it. */
    struct h2msg_reader *req;
    int body_done;                  /* the payload is all in body */
    int deferred;                   /* the data provider waits for body */
    int sent;                       /* the HEADERS went out */
    struct evbuffer *body;          /* payload not yet in DATA frames */
    /* The response, written into the io's input. */
    struct h2msg_fields *fields;    /* the head or the trailers being read */
    int final;                      /* the final head was written */
    int chunked;                    /* its body goes chunked */
    int ended;                      /* END_STREAM came */
    size_t unconsumed;              /* DATA read, not yet given back */
};

struct h2_session {
    struct list_link link;          /* on the client's sessions */
    struct h2_client *hc;
    struct io *io;
    nghttp2_session *ngh;
    struct event *kick;             /* send from the loop */
    struct evbuffer *text;          /* scratch: HTTP/1.1 text for a stream */
    struct list streams;
    int nstreams;
    int server;
    int goaway;                     /* no new streams (sent or received) */
    int busy;                       /* inside nghttp2 */
    int failed;                     /* close when busy drops */
    int err;
};

struct h2_client {
    struct event_base *base;
    const struct conf_upstream *cu;
    struct tls_upstream *tls;
    struct list sessions;
    unsigned next_server;
    int draining;
};

/* A stream is freed when both its io and nghttp2 are done with it. */
static void stream_free(struct h2_stream *st)
{
    if (st->s) {
        list_unlink(&st->s->streams, &st->link);
        st->s->nstreams--;
    }
    h2msg_reader_free(st->req);
    evbuffer_free(st->body);
    h2msg_fields_free(st->fields);
    free(st);
}

static nghttp2_session_callbacks *callbacks;
static nghttp2_option *options;

static void session_send(struct h2_session *s);

/* ---- session lifetime -------------------------------------------------- */

static int idle_sessions(const struct h2_client *hc)
{
    int n = 0;
    for (const struct h2_session *x = LIST_ITEM(hc->sessions.first, struct h2_session, link); x;
         x = LIST_ITEM(x->link.next, struct h2_session, link))
        n += x->nstreams == 0;
    return n;
}

/* The connection is gone (err: why): every stream hears it, and one whose
 * HEADERS never went out may go again elsewhere. Not from inside nghttp2. */
static void session_free(struct h2_session *s, int err)
{
    struct h2_stream *st;
    while ((st = LIST_ITEM(s->streams.first, struct h2_stream, link)) != NULL) {
        list_unlink(&s->streams, &st->link);
        s->nstreams--;
        st->s = NULL;
        if (st->io == NULL) {
            stream_free(st);
            continue;
        }
        if (!st->sent && st->unprocessed)
            *st->unprocessed = 1;
        if (!st->ended)
            io_stream_end(st->io, err ? err : ECONNRESET);
    }
    list_unlink(&s->hc->sessions, &s->link);
    metrics_gauge_add(METRICS_CONN_UPSTREAM, -1);
    nghttp2_session_del(s->ngh);
    event_free(s->kick);
    evbuffer_free(s->text);
    io_free(s->io);
    free(s);
}

/* Has s work left? An idle one is kept while the client keeps idle
 * sessions (upstreams.keepalive), else it says GOAWAY and goes. 1: freed. */
static int session_settle(struct h2_session *s)
{
    if (s->failed && !s->busy) {
        session_free(s, s->err);
        return 1;
    }
    if (s->nstreams > 0 || s->busy)
        return 0;
    struct h2_client *hc = s->hc;
    if (s->goaway || hc->draining || idle_sessions(hc) > hc->cu->keepalive ||
        (!nghttp2_session_want_read(s->ngh) && !nghttp2_session_want_write(s->ngh))) {
        if (!s->goaway) {       /* best effort: the close follows at once */
            nghttp2_session_terminate_session(s->ngh, NGHTTP2_NO_ERROR);
            s->goaway = 1;
            s->busy++;
            const uint8_t *data;
            ssize_t n;
            while ((n = nghttp2_session_mem_send(s->ngh, &data)) > 0)
                evbuffer_add(io_output(s->io), data, (size_t)n);
            s->busy--;
            io_flush(s->io);
        }
        session_free(s, 0);
        return 1;
    }
    return 0;
}

/* Send what nghttp2 has, up to H2C_OUT_MAX queued at a time: more once
 * the socket took it all at once, else when it drains (sess_drained_cb). */
static void session_send(struct h2_session *s)
{
    if (s->busy)
        return;                 /* the outer call sends */
    struct evbuffer *out = io_output(s->io);
    ssize_t n = 0;
    s->busy++;
    do {
        while (!s->failed && evbuffer_get_length(out) < H2C_OUT_MAX) {
            const uint8_t *data;
            n = nghttp2_session_mem_send(s->ngh, &data);
            if (n < 0) {
                log_warn("h2_client: session with '%s' failed: %s",
                         s->hc->cu->servers[s->server].text, nghttp2_strerror((int)n));
                s->failed = 1;
                s->err = EPROTO;
            }
            if (n <= 0)
                break;
            evbuffer_add(out, data, (size_t)n);
        }
        io_flush(s->io);
    } while (!s->failed && n > 0 && evbuffer_get_length(out) == 0);
    s->busy--;
    session_settle(s);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    session_send(arg);
}

/* Send from the loop: for calls from the exchange's side. */
static void session_kick(struct h2_session *s)
{
    if (s && !event_pending(s->kick, EV_TIMEOUT, NULL))
        event_active(s->kick, EV_TIMEOUT, 1);
}

static void sess_read_cb(struct io *io, void *arg)
{
    struct h2_session *s = arg;
    struct evbuffer *in = io_input(io);
    size_t len;
    s->busy++;
    while (!s->failed && (len = evbuffer_get_contiguous_space(in)) > 0) {
        const uint8_t *data = evbuffer_pullup(in, (ssize_t)len);
        ssize_t n = nghttp2_session_mem_recv(s->ngh, data, len);
        if (n < 0) {
            log_warn("h2_client: bad HTTP/2 from '%s': %s",
                     s->hc->cu->servers[s->server].text, nghttp2_strerror((int)n));
            s->failed = 1;
            s->err = EPROTO;
            break;
        }
        evbuffer_drain(in, (size_t)n);
    }
    s->busy--;
    session_send(s);
}

static void sess_drained_cb(struct io *io, void *arg)
{
    session_send(arg);
}

/* ALPN must have picked h2 on a TLS connection. */
static int alpn_h2(struct io *io)
{
    const unsigned char *p = NULL;
    unsigned len = 0;
    if (io_ssl(io) == NULL)
        return 1;
    SSL_get0_alpn_selected(io_ssl(io), &p, &len);
    return len == 2 && memcmp(p, "h2", 2) == 0;
}

static void sess_event_cb(struct io *io, short what, void *arg)
{
    struct h2_session *s = arg;
    const char *server = s->hc->cu->servers[s->server].text;
    if (what & IO_CONNECTED) {
        if (alpn_h2(io))
            return;
        log_warn("h2_client: '%s' (upstream %s) did not choose h2 by ALPN: closing",
                 server, s->hc->cu->name);
        session_free(s, EPROTO);
        return;
    }
    if (what & IO_TIMEOUT)
        log_warn("h2_client: connect to '%s' timed out", server);
    else if (what & IO_ERROR)
        log_warn("h2_client: connection to '%s' failed: %s", server,
                 evutil_socket_error_to_string(io_errno(io)));
    session_free(s, (what & IO_TIMEOUT) ? ETIMEDOUT : ECONNRESET);
}

static struct h2_session *session_new(struct h2_client *hc, int server)
{
    const struct conf_addr *a = &hc->cu->servers[server];
    SSL *ssl = NULL;
    if (hc->cu->tls && (hc->tls == NULL || (ssl = tls_upstream_ssl(hc->tls, server)) == NULL))
        return NULL;
    struct io *io = io_new(hc->base, -1, ssl);
    if (io_connect(io, (const struct sockaddr *)&a->ss, (socklen_t)a->sslen,
                   hc->cu->connect_timeout_ms) < 0) {
        log_warn("h2_client: connect '%s' failed at once", a->text);
        io_free(io);
        return NULL;
    }
    struct h2_session *s = mem_calloc(1, sizeof(*s));
    s->hc = hc;
    s->io = io;
    s->server = server;
    if (nghttp2_session_client_new2(&s->ngh, callbacks, s, options) != 0)
        abort();    /* only on allocation failure */
    s->kick = event_new(hc->base, -1, 0, kick_cb, s);
    s->text = evbuffer_new();
    if (s->kick == NULL || s->text == NULL)
        abort();    /* only on allocation failure */
    const nghttp2_settings_entry iv[] = {
        { NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
        { NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2C_STREAM_WINDOW },
        { NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, H2C_HEAD_MAX },
    };
    nghttp2_submit_settings(s->ngh, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
    nghttp2_session_set_local_window_size(s->ngh, NGHTTP2_FLAG_NONE, 0, H2C_CONN_WINDOW);
    io_setcb(io, sess_read_cb, sess_drained_cb, sess_event_cb, s);
    io_setwatermark(io, EV_WRITE, H2C_OUT_MAX / 2);
    io_enable(io, EV_READ);
    list_push(&hc->sessions, &s->link);
    metrics_gauge_add(METRICS_CONN_UPSTREAM, 1);
    session_kick(s);            /* the preface and SETTINGS (once connected) */
    return s;
}

/* Can s take one more stream? */
static int session_room(struct h2_session *s)
{
    if (s->goaway || s->failed ||
        nghttp2_session_get_next_stream_id(s->ngh) > (1u << 31) - H2C_ID_MARGIN)
        return 0;
    uint32_t max = nghttp2_session_get_remote_settings(s->ngh,
                                                       NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
    return (uint32_t)s->nstreams < max;
}

/* ---- the request: HTTP/1.1 from the exchange to h2 --------------------- */

/* The data provider: payload taken from the stream's output. */
static ssize_t body_read_cb(nghttp2_session *ngh, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *arg)
{
    struct h2_stream *st = src->ptr;
    if (st->io == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;   /* the exchange left */
    if (!st->body_done && evbuffer_get_length(st->body) < length &&
        evbuffer_get_length(io_output(st->io)) > 0)
        io_stream_writable(st->io);     /* take more first (output()) */
    int n = evbuffer_remove(st->body, buf, length);
    if (n < 0)
        n = 0;
    if (evbuffer_get_length(st->body) == 0 && st->body_done)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    else if (n == 0) {
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    return n;
}

static void stream_output(struct io *io, void *owner);

/* The head the exchange wrote, as an h2 request on st's session, with
 * "te: trailers" (we read trailers, and gRPC servers want to be told).
 * -1 when it cannot go. */
static int submit_request(struct h2_stream *st)
{
    struct h2_session *s = st->s;
    size_t n;
    const nghttp2_nv *head = h2msg_reader_nv(st->req, &n);
    nghttp2_nv nv[HTTP1_MAX_HEADERS + 8];
    size_t k = 0;
    static char te[] = "te", trailers[] = "trailers";
    for (size_t i = 0; i < n && k < sizeof(nv) / sizeof(nv[0]) - 1; i++)
        if (!(head[i].namelen == 2 && memcmp(head[i].name, "te", 2) == 0))
            nv[k++] = head[i];
    nv[k++] = (nghttp2_nv){ (uint8_t *)te, (uint8_t *)trailers, 2, 8, NGHTTP2_NV_FLAG_NONE };
    nghttp2_data_provider dp = { .source.ptr = st, .read_callback = body_read_cb };
    int32_t id = nghttp2_submit_request(s->ngh, NULL, nv, k,
                                        h2msg_reader_body(st->req) ? &dp : NULL, st);
    if (id < 0) {
        log_warn("h2_client: request to '%s' not submitted: %s",
                 s->hc->cu->servers[s->server].text, nghttp2_strerror(id));
        return -1;
    }
    st->id = id;
    return 0;
}

/* output(): the exchange wrote (more of) its request. Take the head, then
 * payload while the stream holds less than H2C_BODY_MAX of it. */
static void stream_output(struct io *io, void *owner)
{
    struct h2_stream *st = owner;
    struct evbuffer *out = io_output(io);
    if (st->s == NULL || st->ended) {
        evbuffer_drain(out, evbuffer_get_length(out));  /* nobody reads it now */
        return;
    }
    while (!st->body_done && evbuffer_get_length(st->body) < H2C_BODY_MAX) {
        size_t room = H2C_BODY_MAX - evbuffer_get_length(st->body);
        enum h2msg_event ev = h2msg_read(st->req, out, st->body, room);
        if (ev == H2MSG_NEED)
            break;
        if (ev == H2MSG_ERROR || (ev == H2MSG_HEAD && submit_request(st) < 0)) {
            /* exchange.c writes what http1.c reads: only a refusal by
             * nghttp2 (no stream id left) lands here */
            evbuffer_drain(out, evbuffer_get_length(out));
            if (st->unprocessed)
                *st->unprocessed = ev == H2MSG_HEAD;
            if (st->id > 0)
                nghttp2_submit_rst_stream(st->s->ngh, NGHTTP2_FLAG_NONE, st->id,
                                          NGHTTP2_INTERNAL_ERROR);
            io_stream_end(io, ECONNRESET);
            st->ended = 1;
            break;
        }
        if (ev == H2MSG_HEAD) {
            st->body_done = !h2msg_reader_body(st->req);
        } else if (ev == H2MSG_END) {
            st->body_done = 1;      /* request trailers: exchange.c sends none */
        }
    }
    if (st->deferred && (evbuffer_get_length(st->body) > 0 || st->body_done)) {
        st->deferred = 0;
        nghttp2_session_resume_data(st->s->ngh, st->id);
    }
    session_kick(st->s);
}

/* ---- the response: h2 to HTTP/1.1 for the exchange --------------------- */

/* Give the server back the window of what the exchange read, as long as
 * the stream's input is below H2C_IN_MARK. */
static void stream_consume(struct h2_stream *st)
{
    if (st->s == NULL || st->unconsumed == 0 || st->id <= 0 ||
        evbuffer_get_length(io_input(st->io)) >= H2C_IN_MARK)
        return;
    nghttp2_session_consume(st->s->ngh, st->id, st->unconsumed);
    st->unconsumed = 0;
}

static void stream_consumed(struct io *io, void *owner, size_t n)
{
    struct h2_stream *st = owner;
    if (st->unconsumed > 0) {
        stream_consume(st);
        session_kick(st->s);
    }
}

/* The exchange is done with the stream: one nghttp2 still has is
 * cancelled, and freed once nghttp2 lets it go. */
static void stream_closed(struct io *io, void *owner)
{
    struct h2_stream *st = owner;
    struct h2_session *s = st->s;
    st->io = NULL;
    if (s == NULL || st->id == 0 || st->gone) {
        stream_free(st);
        if (s)
            session_kick(s);
        return;
    }
    if (st->unconsumed)             /* the connection's window comes back */
        nghttp2_session_consume(s->ngh, st->id, st->unconsumed);
    st->unconsumed = 0;
    nghttp2_submit_rst_stream(s->ngh, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
    session_kick(s);
}

static const struct io_stream_ops stream_ops = {
    stream_output, stream_consumed, stream_closed,
};

/* A field of a head or trailers (h2msg_fields); past H2C_HEAD_MAX the
 * stream is reset (the exchange sees a 502). */
static int on_header_cb(nghttp2_session *ngh, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *arg)
{
    struct h2_stream *st = nghttp2_session_get_stream_user_data(ngh, frame->hd.stream_id);
    if (st == NULL || st->io == NULL || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (h2msg_fields_add(st->fields, name, namelen, value, valuelen) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

/* The session's scratch text, into st's input. */
static void input_text(struct h2_stream *st)
{
    struct evbuffer *b = st->s->text;
    size_t n = evbuffer_get_length(b);
    io_stream_input(st->io, evbuffer_pullup(b, (ssize_t)n), n);
    evbuffer_drain(b, n);
}

/* A response head is complete: a 1xx, or the final head, chunked when a
 * body without a length follows (its trailers then end it), with
 * Content-Length: 0 when none follows. */
static void write_head(struct h2_stream *st, int end_stream)
{
    size_t n;
    const char *status = h2msg_fields_get(st->fields, ":status", &n);
    int interim = status && n == 3 && status[0] == '1';
    int bodyless = end_stream && !interim && status && n == 3 &&
                   memcmp(status, "204", 3) != 0 && memcmp(status, "304", 3) != 0 &&
                   h2msg_fields_get(st->fields, "content-length", NULL) == NULL;
    if (h2msg_head_text(st->fields, HTTP1_RESPONSE, !end_stream && !interim,
                        bodyless ? "Content-Length: 0\r\n" : NULL, st->s->text,
                        &st->chunked) != 0) {
        nghttp2_submit_rst_stream(st->s->ngh, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
        return;         /* on_stream_close tells the exchange */
    }
    h2msg_fields_clear(st->fields);
    st->final = !interim;
    input_text(st);
}

/* The body's end: the last chunk with the trailers read (when chunked;
 * trailers after a Content-Length body have no place in HTTP/1.1). */
static void write_end(struct h2_stream *st)
{
    if (st->chunked) {
        h2msg_last_chunk(st->s->text, st->fields);
        input_text(st);
    }
    h2msg_fields_clear(st->fields);
}

static int on_frame_recv_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *arg)
{
    struct h2_session *s = arg;
    if (frame->hd.type == NGHTTP2_GOAWAY) {
        s->goaway = 1;          /* streams above last_stream_id close as refused */
        return 0;
    }
    struct h2_stream *st = nghttp2_session_get_stream_user_data(ngh, frame->hd.stream_id);
    if (st == NULL || st->io == NULL || st->ended ||
        (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA))
        return 0;
    int end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (frame->hd.type == NGHTTP2_HEADERS && !st->final) {
        write_head(st, end);    /* a 1xx, or the final head (whole with END_STREAM) */
        st->ended = end;
        return 0;
    }
    if (end) {                  /* trailers, or the last DATA */
        st->ended = 1;
        write_end(st);
    }
    return 0;
}

static int on_data_cb(nghttp2_session *ngh, uint8_t flags, int32_t id, const uint8_t *data,
                      size_t len, void *arg)
{
    struct h2_stream *st = nghttp2_session_get_stream_user_data(ngh, id);
    if (st == NULL || st->io == NULL) {     /* the exchange left: the window back */
        nghttp2_session_consume(ngh, id, len);
        return 0;
    }
    if (st->chunked) {
        h2msg_chunk(st->s->text, data, len);
        input_text(st);
    } else {
        io_stream_input(st->io, data, len);
    }
    st->unconsumed += len;
    stream_consume(st);
    return 0;
}

/* nghttp2 is done with st's stream: free st if the exchange is too, else
 * tell the exchange of a stream that ended without its response (reset;
 * unprocessed: the server never took it, so it may go again). */
static void stream_gone(struct h2_stream *st, int unprocessed)
{
    st->gone = 1;
    if (st->io == NULL) {
        /* nghttp2 may still close the stream after reporting its HEADERS
         * not sent: it must not find st there again */
        if (st->s && st->id > 0)
            nghttp2_session_set_stream_user_data(st->s->ngh, st->id, NULL);
        stream_free(st);
        return;
    }
    if (st->ended)
        return;                 /* the response is whole: the exchange ends it */
    if (unprocessed && st->unprocessed)
        *st->unprocessed = 1;
    st->ended = 1;
    io_stream_end(st->io, ECONNRESET);
}

static int on_stream_close_cb(nghttp2_session *ngh, int32_t id, uint32_t error_code, void *arg)
{
    struct h2_stream *st = nghttp2_session_get_stream_user_data(ngh, id);
    if (st)     /* refused: also above a GOAWAY's last stream id */
        stream_gone(st, error_code == NGHTTP2_REFUSED_STREAM && !st->final);
    return 0;
}

static int on_frame_send_cb(nghttp2_session *ngh, const nghttp2_frame *frame, void *arg)
{
    if (frame->hd.type == NGHTTP2_HEADERS) {
        struct h2_stream *st = nghttp2_session_get_stream_user_data(ngh, frame->hd.stream_id);
        if (st)
            st->sent = 1;
    }
    return 0;
}

/* A request that could not start (a GOAWAY came first): not processed. */
static int on_frame_not_send_cb(nghttp2_session *ngh, const nghttp2_frame *frame,
                                int lib_error_code, void *arg)
{
    struct h2_session *s = arg;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    struct h2_stream *st = NULL;    /* a stream never opened has no user data */
    for (struct h2_stream *x = LIST_ITEM(s->streams.first, struct h2_stream, link); x && !st;
         x = LIST_ITEM(x->link.next, struct h2_stream, link))
        if (x->id == frame->hd.stream_id)
            st = x;
    if (st && !st->gone)
        stream_gone(st, 1);
    return 0;
}

/* ---- the client -------------------------------------------------------- */

static void setup_once(void)
{
    if (callbacks)
        return;
    if (nghttp2_session_callbacks_new(&callbacks) != 0 || nghttp2_option_new(&options) != 0)
        abort();
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header_cb);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close_cb);
    nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, on_frame_send_cb);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(callbacks, on_frame_not_send_cb);
    nghttp2_option_set_no_auto_window_update(options, 1);
    nghttp2_option_set_peer_max_concurrent_streams(options, H2C_EARLY_STREAMS);
}

struct h2_client *h2_client_create(struct event_base *base, const struct conf_upstream *cu,
                                   struct tls_upstream *tls)
{
    setup_once();
    struct h2_client *hc = mem_calloc(1, sizeof(*hc));
    hc->base = base;
    hc->cu = cu;
    hc->tls = tls;
    return hc;
}

void h2_client_destroy(struct h2_client *hc)
{
    if (hc == NULL)
        return;
    /* The worker ends: every session goes now, its streams hear it. */
    hc->draining = 1;
    struct h2_session *s;
    while ((s = LIST_ITEM(hc->sessions.first, struct h2_session, link)) != NULL)
        session_free(s, ECONNRESET);
    free(hc);
}

void h2_client_drain(struct h2_client *hc)
{
    hc->draining = 1;
    for (struct h2_session *s = LIST_ITEM(hc->sessions.first, struct h2_session, link), *next; s;
         s = next) {
        next = LIST_ITEM(s->link.next, struct h2_session, link);
        session_settle(s);
    }
}

struct io *h2_client_stream(struct h2_client *hc, int fresh, int *server, int *unprocessed)
{
    int sv = (int)(hc->next_server++ % (unsigned)hc->cu->nservers);
    struct h2_session *s = NULL;
    for (struct h2_session *x = LIST_ITEM(hc->sessions.first, struct h2_session, link);
         x && !fresh && !s; x = LIST_ITEM(x->link.next, struct h2_session, link))
        if (x->server == sv && session_room(x))
            s = x;
    if (s == NULL && (s = session_new(hc, sv)) == NULL)
        return NULL;
    struct h2_stream *st = mem_calloc(1, sizeof(*st));
    st->s = s;
    st->io = io_new_stream(hc->base, &stream_ops, st);
    st->unprocessed = unprocessed;
    st->req = h2msg_reader_new(HTTP1_REQUEST, HTTP1_MAX_HEAD_BYTES);
    h2msg_reader_scheme(st->req, hc->cu->tls ? "https" : "http");
    st->fields = h2msg_fields_new(H2C_HEAD_MAX);
    st->body = evbuffer_new();
    if (st->body == NULL)
        abort();    /* only on allocation failure */
    list_push(&s->streams, &st->link);
    s->nstreams++;
    *server = sv;
    *unprocessed = 0;
    return st->io;
}
