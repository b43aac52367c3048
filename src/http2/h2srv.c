/* sluice - h2srv.c: the HTTP/2 server side of one client connection (h2srv.h).
 *
 *   connection io --mem_recv--> nghttp2 --HEADERS--> h2msg: HTTP/1.1 head
 *        ^                         |      --DATA---> (chunked) body     } stream io input
 *        |                         |                                    } -> open(): a client
 *        +--mem_send-- nghttp2 <---+---- h2msg_read <- HTTP/1.1 response  <- stream io output
 *
 * Built as nghttpx's Http2Upstream is (HTTP2.md §1): no automatic window
 * updates (a stream's DATA is consumed when the layer above reads it),
 * output bounded at H2SRV_OUT_MAX with data providers deferred and resumed,
 * GOAWAY in two steps, RST_STREAM(NO_ERROR) after an answer sent before the
 * request ended. Nothing here runs inside nghttp2's calls or the layer
 * above's except recording: the work is done from the session's kick
 * event. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "clock.h"
#include "h2msg.h"
#include "h2srv.h"
#include "io.h"
#include "list.h"
#include "log.h"
#include "mem.h"

/* What a stream holds of its response beyond its io: HTTP/1.1 bytes taken
 * and not parsed yet, and payload waiting for its DATA frames. */
#define STREAM_RAW_MAX  (16 * 1024)
#define STREAM_BODY_MAX (32 * 1024)
/* The connection window: what all streams' unread bodies may hold; each
 * stream's own is the default 65,535. */
#define CONN_WINDOW     (1024 * 1024)
/* nghttp2's rapid-reset bucket (its 1.57 default): 1000 at once, 33/s. */
#define RST_BURST       1000
#define RST_RATE        33
#define MAX_CONTINUATIONS 8
/* Frames that ask for work but carry no request (PING, SETTINGS,
 * WINDOW_UPDATE, PRIORITY, empty DATA, unknown types) spend a budget that
 * requests and payload refill, as does time (one per 10 ms); spent: GOAWAY
 * ENHANCE_YOUR_CALM. nghttp2 1.52 bounds only the acknowledgements it owes
 * (its glitch limiter came in 1.67). */
#define FLOOD_BUDGET    10000
#define FLOOD_REFILL_MS 10

/* The shutdown notice is followed by the last stream id after this. */
#define GOAWAY_DELAY_MS 1000
/* After the last frame (a GOAWAY), input is still read and dropped this
 * long: a close with unread input would reset the connection, and the
 * client could lose the GOAWAY that says why (nginx's lingering close). */
#define LINGER_MS       1000

/* nghttp2 1.52 allocates with each session a stream map of 256 buckets
 * (4 KiB, zeroed) and the buffer all output is framed in (its
 * NGHTTP2_FRAMEBUF_CHUNKLEN, 16 KiB), written from its start. On an idle
 * connection both are scratch: the frames were copied out, and a map with
 * no stream is all empty buckets (zeros). Taken page-aligned when the
 * session is made, their pages go back to the kernel once the connection
 * has had no stream for RELEASE_MS, as nginx frees an idle HTTP/2
 * connection's buffers. Not at once: for a client sending one request
 * after another, giving them back and faulting them in again cost about a
 * quarter of a request's CPU. */
#define PAGE_BYTES      4096        /* other page sizes: nothing goes back */
#define PAGES(n)        (((n) + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES)
#define NG_MAP_BYTES    (256 * 16)
#define NG_FRAMEBUF_LEN (9 + 1 + 16384)
#define BLOCK_BYTES     (NG_MAP_BYTES + PAGES(NG_FRAMEBUF_LEN))
#define RELEASE_MS      1000

struct h2stream {
    struct h2srv *s;
    int32_t id;
    struct list_link link;          /* on s->streams */
    struct io *io;                  /* NULL: not opened, or freed above */
    struct h2msg_fields *fields;    /* the request's, then its trailers */
    struct h2msg_reader *rd;        /* the response */
    struct evbuffer *raw, *body;
    size_t unacked;                 /* DATA given to io, not read yet */
    size_t to_consume;              /* read, window not given back yet */
    uint64_t sent, sent_mark;       /* response bytes framed; at the last tick */
    nghttp2_nv *trailers;           /* copied at the response's end */
    size_t ntrailers;
    char *trailer_text;
    unsigned opened : 1, chunked : 1, req_ended : 1, resp_final : 1, resp_ended : 1,
             deferred : 1, failed : 1, h2_closed : 1, dirty : 1;
    struct h2stream *next_dirty;
};

enum tmode { TM_PREFACE, TM_IDLE, TM_GOAWAY, TM_LINGER };

struct h2srv {
    struct event_base *base;
    struct io *io;                  /* NULL once the connection closed */
    nghttp2_session *ng;
    struct h2srv_limits lim;
    int tls;
    const struct h2srv_ops *ops;
    void *arg;
    struct event *kick, *timer, *release;
    enum tmode tmode;
    struct list streams;
    int nstreams;                   /* struct h2stream alive */
    uint32_t nopen;                 /* of them with an io open (in flight) */
    uint32_t nrequests;
    int64_t budget, budget_ms;      /* FLOOD_BUDGET; refilled up to clock_ms() budget_ms */
    struct h2stream *dirty;
    char *block;                    /* holds nghttp2's map and frame buffer */
    void *map, *framebuf;           /* in block, page-aligned; NULL once freed */
    unsigned creating : 1;          /* inside nghttp2_session_server_new3 */
    unsigned pages_back : 1;        /* the system's pages are PAGE_BYTES */
    unsigned pages_used : 1;        /* map or frame buffer written since released */
    unsigned sent_all : 1;          /* nghttp2 had nothing more to frame */
    unsigned got_frame : 1, goaway : 1, conn_closed : 1, ended_told : 1, freed : 1,
             lingering : 1, flooded : 1;
};

static void kick(struct h2srv *s)
{
    if (!s->freed)
        event_active(s->kick, EV_TIMEOUT, 0);
}

static void mark(struct h2stream *st)
{
    if (!st->dirty) {
        st->dirty = 1;
        st->next_dirty = st->s->dirty;
        st->s->dirty = st;
    }
    kick(st->s);
}

static void timer_set(struct h2srv *s, enum tmode m, int64_t ms)
{
    s->tmode = m;
    struct timeval tv = clock_timeval(ms);
    event_add(s->timer, &tv);
}

/* ---- streams --------------------------------------------------------------- */

/* What st owns, and st. */
static void stream_release(struct h2stream *st)
{
    h2msg_fields_free(st->fields);
    h2msg_reader_free(st->rd);
    if (st->raw)
        evbuffer_free(st->raw);
    if (st->body)
        evbuffer_free(st->body);
    free(st->trailers);
    free(st->trailer_text);
    free(st);
}

static void stream_free(struct h2stream *st)
{
    list_unlink(&st->s->streams, &st->link);
    st->s->nstreams--;
    stream_release(st);
}

/* Free st when both nghttp2 and the layer above are done with it (not while
 * on the dirty list: the pump frees it). */
static void stream_maybe_free(struct h2stream *st)
{
    if (st->h2_closed && st->io == NULL && !st->dirty)
        stream_free(st);
}

/* After h2srv_free, once no stream io is open: the rest goes. */
static void session_destroy(struct h2srv *s)
{
    for (struct h2stream *st = LIST_ITEM(s->streams.first, struct h2stream, link), *next; st;
         st = next) {
        next = LIST_ITEM(st->link.next, struct h2stream, link);
        stream_release(st);
    }
    event_free(s->kick);
    event_free(s->timer);
    event_free(s->release);
    free(s);
}

static void stream_output(struct io *io, void *owner)
{
    struct h2stream *st = owner;
    size_t have = evbuffer_get_length(st->raw);
    if (have < STREAM_RAW_MAX)
        evbuffer_remove_buffer(io_output(io), st->raw, STREAM_RAW_MAX - have);
    mark(st);
}

static void stream_consumed(struct io *io, void *owner, size_t n)
{
    struct h2stream *st = owner;
    size_t k = n < st->unacked ? n : st->unacked;
    st->unacked -= k;
    st->to_consume += k;
    if (k)
        mark(st);
}

static void stream_closed(struct io *io, void *owner)
{
    struct h2stream *st = owner;
    struct h2srv *s = st->s;
    st->io = NULL;
    s->nopen--;
    st->to_consume += st->unacked;      /* never read: the window comes back */
    st->unacked = 0;
    mark(st);
    if (s->freed && s->nopen == 0)
        session_destroy(s);     /* the connection is gone: the zombie goes with its last stream */
}

static const struct io_stream_ops stream_ops = {
    .output = stream_output,
    .consumed = stream_consumed,
    .closed = stream_closed,
};

static void reset(struct h2srv *s, struct h2stream *st, uint32_t code)
{
    st->failed = 1;
    nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, code);
}

/* The request's head is complete: an io carrying it, handed up; a header
 * list that cannot be one (status 400, 431, 501) goes up with no head, to
 * be answered and logged as the layer above answers a bad head. */
static void stream_open(struct h2srv *s, struct h2stream *st, int end_stream)
{
    struct evbuffer *head = evbuffer_new();
    int chunked = 0;
    int status = h2msg_head_text(st->fields, HTTP1_REQUEST, !end_stream, "Connection: close\r\n",
                                 head, &chunked);
    if (s->nopen >= s->lim.max_streams) {
        /* reset streams whose work is not cancelled yet hold their slots */
        evbuffer_free(head);
        reset(s, st, NGHTTP2_REFUSED_STREAM);
        return;
    }
    if (status) {
        evbuffer_drain(head, evbuffer_get_length(head));
        chunked = 0;
    }
    size_t mlen = 0;
    const char *method = h2msg_fields_get(st->fields, ":method", &mlen);
    st->rd = h2msg_reader_new(HTTP1_RESPONSE, HTTP1_MAX_HEAD_BYTES);
    h2msg_reader_head_request(st->rd, mlen == 4 && memcmp(method, "HEAD", 4) == 0);
    st->raw = evbuffer_new();
    st->body = evbuffer_new();
    st->chunked = (unsigned)chunked;
    st->opened = 1;
    st->io = io_new_stream(s->base, &stream_ops, st);
    s->nopen++;
    size_t hlen = evbuffer_get_length(head);
    if (hlen)
        io_stream_input(st->io, evbuffer_pullup(head, -1), hlen);
    evbuffer_free(head);
    h2msg_fields_clear(st->fields);
    if (s->ops->open(s->arg, st->io, status) < 0) {
        io_free(st->io);        /* closed(): the slot comes back */
        reset(s, st, NGHTTP2_REFUSED_STREAM);
        return;
    }
    if (s->lim.max_requests && ++s->nrequests >= s->lim.max_requests && !s->goaway) {
        s->goaway = 1;          /* this one is served; the client opens another connection */
        nghttp2_submit_goaway(s->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(s->ng), NGHTTP2_NO_ERROR,
                              NULL, 0);
    }
}

/* The request's end: the last chunk (with its trailers) when chunked. */
static void stream_req_end(struct h2stream *st)
{
    st->req_ended = 1;
    if (st->io && st->chunked) {
        struct evbuffer *b = evbuffer_new();
        h2msg_last_chunk(b, st->fields);
        size_t n = evbuffer_get_length(b);
        io_stream_input(st->io, evbuffer_pullup(b, -1), n);
        evbuffer_free(b);
    }
}

/* ---- the response -------------------------------------------------------------- */

static ssize_t data_read_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *user)
{
    struct h2stream *st = src->ptr;
    size_t n = evbuffer_remove(st->body, buf, length);
    st->sent += n;
    if (evbuffer_get_length(st->body) == 0 && st->resp_ended) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        if (st->ntrailers) {
            *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
            nghttp2_submit_trailer(ng, id, st->trailers, st->ntrailers);
        }
        return (ssize_t)n;
    }
    if (n == 0) {
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    mark(st);       /* room for more of the response */
    return (ssize_t)n;
}

static void keep_trailers(struct h2stream *st)
{
    size_t n, bytes = 0;
    const nghttp2_nv *nv = h2msg_reader_nv(st->rd, &n);
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        bytes += nv[i].namelen + nv[i].valuelen;
    st->trailers = mem_alloc(n * sizeof(*nv));
    st->trailer_text = mem_alloc(bytes ? bytes : 1);
    char *p = st->trailer_text;
    for (size_t i = 0; i < n; i++) {
        st->trailers[i] = nv[i];
        memcpy(p, nv[i].name, nv[i].namelen);
        st->trailers[i].name = (uint8_t *)p;
        p += nv[i].namelen;
        memcpy(p, nv[i].value, nv[i].valuelen);
        st->trailers[i].value = (uint8_t *)p;
        p += nv[i].valuelen;
    }
    st->ntrailers = n;
}

/* Turn what the layer above wrote into frames, as far as the bounds allow. */
static void stream_pump(struct h2srv *s, struct h2stream *st)
{
    if (st->to_consume) {
        if (!st->h2_closed)
            nghttp2_session_consume(s->ng, st->id, st->to_consume);
        else
            nghttp2_session_consume_connection(s->ng, st->to_consume);
        st->to_consume = 0;
    }
    if (!st->opened || st->failed || st->h2_closed || st->resp_ended)
        return;
    for (int rounds = 0; rounds < 64; rounds++) {
        size_t room = STREAM_BODY_MAX - evbuffer_get_length(st->body);
        if (evbuffer_get_length(st->body) >= STREAM_BODY_MAX)
            break;
        enum h2msg_event ev = h2msg_read(st->rd, st->raw, st->body, room);
        size_t n;
        const nghttp2_nv *nv;
        if (ev == H2MSG_NEED && st->io == NULL) {
            /* the layer above is done: a body up to its close ends here */
            if (h2msg_reader_eof(st->rd))
                continue;
            ev = H2MSG_ERROR;
        }
        if (ev == H2MSG_NEED)
            break;
        if (ev == H2MSG_ERROR) {
            reset(s, st, NGHTTP2_INTERNAL_ERROR);
            return;
        }
        if (ev == H2MSG_HEAD) {
            nv = h2msg_reader_nv(st->rd, &n);
            if (h2msg_reader_interim(st->rd)) {
                nghttp2_submit_headers(s->ng, NGHTTP2_FLAG_NONE, st->id, NULL, nv, n, NULL);
                continue;
            }
            st->resp_final = 1;
            if (h2msg_reader_body(st->rd)) {
                nghttp2_data_provider prd = {.source.ptr = st, .read_callback = data_read_cb};
                nghttp2_submit_response(s->ng, st->id, nv, n, &prd);
            } else {
                st->resp_ended = 1;
                nghttp2_submit_response(s->ng, st->id, nv, n, NULL);
                return;
            }
        } else if (ev == H2MSG_END) {
            keep_trailers(st);
            st->resp_ended = 1;
        }
        if (st->deferred) {
            st->deferred = 0;
            nghttp2_session_resume_data(s->ng, st->id);
        }
        if (st->resp_ended)
            return;
    }
    if (st->io && evbuffer_get_length(st->raw) < STREAM_RAW_MAX &&
        evbuffer_get_length(io_output(st->io)) > 0)
        io_stream_writable(st->io);     /* output() moves more and marks st again */
}

/* ---- the connection ------------------------------------------------------------ */

static void conn_close(struct h2srv *s)
{
    if (s->conn_closed)
        return;
    s->conn_closed = 1;
    io_free(s->io);
    s->io = NULL;
    for (struct h2stream *st = LIST_ITEM(s->streams.first, struct h2stream, link); st;
         st = LIST_ITEM(st->link.next, struct h2stream, link)) {
        if (st->io)
            io_stream_end(st->io, ECONNRESET);
    }
    kick(s);        /* tells ended() from the loop */
}

/* Nothing more to send or read: the FIN goes (plain connections; TLS sends
 * its close_notify at io_free), what still comes is dropped for LINGER_MS,
 * then the connection closes. */
static void conn_linger(struct h2srv *s)
{
    if (s->lingering)
        return;
    s->lingering = 1;
    if (io_ssl(s->io) == NULL && io_fd(s->io) >= 0)
        shutdown(io_fd(s->io), SHUT_WR);
    io_enable(s->io, EV_READ);
    timer_set(s, TM_LINGER, LINGER_MS);
}

static int page_zero(const void *page)
{
    const uint64_t *w = page;
    for (size_t i = 0; i < PAGE_BYTES / sizeof(*w); i++)
        if (w[i])
            return 0;
    return 1;
}

/* RELEASE_MS without a stream, everything framed copied out: the frame
 * buffer's pages and the stream map's go back (read as zeros after). A map
 * page that is not all zeros (an idle stream of a PRIORITY frame) stays. */
static void release_cb(evutil_socket_t fd, short what, void *arg)
{
    struct h2srv *s = arg;
    if (s->conn_closed || !s->sent_all || !s->pages_used || s->nstreams > 0)
        return;
    s->pages_used = 0;
    if (s->framebuf)
        madvise(s->framebuf, PAGES(NG_FRAMEBUF_LEN), MADV_DONTNEED);
    if (s->map && page_zero(s->map))
        madvise(s->map, PAGE_BYTES, MADV_DONTNEED);
}

static void session_send(struct h2srv *s)
{
    if (s->conn_closed || s->lingering)
        return;
    struct evbuffer *out = io_output(s->io);
    while (evbuffer_get_length(out) < H2SRV_OUT_MAX) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(s->ng, &data);
        if (n < 0) {
            conn_close(s);
            return;
        }
        s->sent_all = n == 0;
        if (n == 0)
            break;
        s->pages_used = 1;
        evbuffer_add(out, data, (size_t)n);
    }
    io_flush(s->io);
    if (s->sent_all && s->pages_used && s->nstreams == 0 && s->pages_back) {
        struct timeval tv = clock_timeval(RELEASE_MS);
        event_add(s->release, &tv);
    }
    if (!nghttp2_session_want_read(s->ng) && !nghttp2_session_want_write(s->ng) &&
        evbuffer_get_length(out) == 0)
        conn_linger(s);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct h2srv *s = arg;
    for (int rounds = 0; s->dirty && rounds < 64; rounds++) {
        struct h2stream *list = s->dirty;
        s->dirty = NULL;
        while (list) {
            struct h2stream *st = list;
            list = st->next_dirty;
            st->dirty = 0;
            if (!s->conn_closed)
                stream_pump(s, st);
            stream_maybe_free(st);
        }
    }
    if (s->dirty)
        kick(s);
    if (s->conn_closed) {
        if (!s->ended_told) {
            s->ended_told = 1;
            s->ops->ended(s->arg);      /* h2srv_free(s) comes from there */
        }
        return;
    }
    session_send(s);
    if (!s->conn_closed && !s->lingering && evbuffer_get_length(io_output(s->io)) < H2SRV_OUT_MAX)
        io_enable(s->io, EV_READ);
}

static void read_cb(struct io *io, void *arg)
{
    struct h2srv *s = arg;
    struct evbuffer *in = io_input(io);
    if (s->lingering) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    while (!s->conn_closed && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        ssize_t n = nghttp2_session_mem_recv(s->ng, v.iov_base, v.iov_len);
        if (n < 0) {
            /* flood, bad preface, too many CONTINUATIONs...: nghttp2
             * queued a GOAWAY where it could; send it, then close */
            evbuffer_drain(in, evbuffer_get_length(in));
            s->goaway = 1;
            nghttp2_session_terminate_session(s->ng, NGHTTP2_PROTOCOL_ERROR);
            break;
        }
        evbuffer_drain(in, (size_t)n);
    }
    if (s->tmode == TM_PREFACE && s->got_frame)
        timer_set(s, TM_IDLE, s->lim.idle_timeout_ms);
    /* a peer that does not read what it asks for stops being read */
    if (!s->conn_closed && !s->lingering && evbuffer_get_length(io_output(io)) >= H2SRV_OUT_MAX)
        io_disable(io, EV_READ);
    kick(s);
}

static void drained_cb(struct io *io, void *arg)
{
    kick(arg);
}

static void event_cb(struct io *io, short what, void *arg)
{
    conn_close(arg);    /* gone, reset, or a peer not reading within idle_timeout */
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct h2srv *s = arg;
    if (s->conn_closed)
        return;
    switch (s->tmode) {
    case TM_PREFACE:
    case TM_LINGER:
        conn_close(s);
        return;
    case TM_GOAWAY:
        nghttp2_submit_goaway(s->ng, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(s->ng), NGHTTP2_NO_ERROR,
                              NULL, 0);
        timer_set(s, TM_IDLE, s->lim.idle_timeout_ms);
        break;
    case TM_IDLE: {
        int busy = 0;
        /* A stream whose response made no progress in a whole period (a
         * window never opened) is reset, as the layer above's write
         * timeout would while its io was open. */
        for (struct h2stream *st = LIST_ITEM(s->streams.first, struct h2stream, link); st;
             st = LIST_ITEM(st->link.next, struct h2stream, link)) {
            if (st->h2_closed)
                continue;
            busy = 1;
            if (st->io == NULL && st->resp_final && st->sent == st->sent_mark && !st->failed)
                reset(s, st, NGHTTP2_CANCEL);
            st->sent_mark = st->sent;
        }
        if (!busy) {
            nghttp2_session_terminate_session(s->ng, NGHTTP2_NO_ERROR);
            s->goaway = 1;
        }
        timer_set(s, TM_IDLE, s->lim.idle_timeout_ms);
        break;
    }
    }
    kick(s);
}

/* ---- nghttp2's callbacks ---------------------------------------------------------- */

static struct h2stream *stream_of(struct h2srv *s, int32_t id)
{
    return nghttp2_session_get_stream_user_data(s->ng, id);
}

static int on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *user)
{
    struct h2srv *s = user;
    if (hd->type == NGHTTP2_HEADERS ||
        (hd->type == NGHTTP2_DATA && (hd->length > 0 || (hd->flags & NGHTTP2_FLAG_END_STREAM)))) {
        if (s->budget < FLOOD_BUDGET)
            s->budget++;
        return 0;
    }
    /* CONTINUATION and RST_STREAM have nghttp2's own bounds; GOAWAY ends */
    if (hd->type == NGHTTP2_CONTINUATION || hd->type == NGHTTP2_RST_STREAM ||
        hd->type == NGHTTP2_GOAWAY)
        return 0;
    int64_t now = clock_ms();
    int64_t refill = (now - s->budget_ms) / FLOOD_REFILL_MS;
    if (refill > 0) {
        s->budget = s->budget + refill > FLOOD_BUDGET ? FLOOD_BUDGET : s->budget + refill;
        s->budget_ms += refill * FLOOD_REFILL_MS;
    }
    if (--s->budget < 0 && !s->flooded) {
        s->flooded = 1;
        s->goaway = 1;
        nghttp2_session_terminate_session(ng, NGHTTP2_ENHANCE_YOUR_CALM);
    }
    return 0;
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    struct h2srv *s = user;
    s->got_frame = 1;
    s->pages_used = 1;      /* a stream in the map */
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        struct h2stream *st = mem_calloc(1, sizeof(*st));
        st->s = s;
        st->id = f->hd.stream_id;
        st->fields = h2msg_fields_new(s->lim.max_header_bytes);
        list_push(&s->streams, &st->link);
        s->nstreams++;
        nghttp2_session_set_stream_user_data(ng, st->id, st);
    } else {
        struct h2stream *st = stream_of(s, f->hd.stream_id);
        if (st)
            h2msg_fields_clear(st->fields);     /* trailers: counted alone */
    }
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user)
{
    struct h2stream *st = stream_of(user, f->hd.stream_id);
    if (st && f->hd.type == NGHTTP2_HEADERS)
        h2msg_fields_add(st->fields, name, namelen, value, valuelen);  /* past the bound: 431 */
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    struct h2srv *s = user;
    s->got_frame = 1;
    struct h2stream *st = f->hd.stream_id ? stream_of(s, f->hd.stream_id) : NULL;
    if (st == NULL)
        return 0;       /* closed already (a reset races its frames) */
    int end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        if (end)
            st->req_ended = 1;
        stream_open(s, st, end);
    } else if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) && end) {
        stream_req_end(st);
    }
    return 0;
}

static int on_data_chunk_recv(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                              size_t len, void *user)
{
    struct h2srv *s = user;
    struct h2stream *st = stream_of(s, id);
    if (st == NULL || st->io == NULL) {
        /* nobody reads it: the window comes back at once */
        nghttp2_session_consume(ng, id, len);
        return 0;
    }
    if (st->chunked) {
        char size[24];
        int k = snprintf(size, sizeof(size), "%zx\r\n", len);
        io_stream_input(st->io, size, (size_t)k);
        io_stream_input(st->io, data, len);
        io_stream_input(st->io, "\r\n", 2);
    } else {
        io_stream_input(st->io, data, len);
    }
    st->unacked += len;
    return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *f, void *user)
{
    struct h2srv *s = user;
    if ((f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) ||
        !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    struct h2stream *st = stream_of(s, f->hd.stream_id);
    /* answered before the request ended: it need not send the rest */
    if (st && !st->req_ended)
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *user)
{
    struct h2srv *s = user;
    struct h2stream *st = stream_of(s, id);
    if (st == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(ng, id, NULL);
    st->h2_closed = 1;
    if (st->unacked || st->to_consume) {
        nghttp2_session_consume_connection(ng, st->unacked + st->to_consume);
        st->unacked = st->to_consume = 0;
    }
    /* reset by the client, or its response cut short: the work is cancelled
     * (its Redis call, its upstream exchange); the slot comes back when the
     * layer above frees the io */
    if (st->io && !st->resp_ended)
        io_stream_end(st->io, ECONNRESET);
    mark(st);       /* freed from the kick, once the io is gone too */
    return 0;
}

/* ---- the session ---------------------------------------------------------------- */

/* nghttp2's allocator: sluice's, but the map and the frame buffer (told
 * apart by their sizes while the session is made) in s->block. */
static char *block_pages(struct h2srv *s)
{
    void *b;
    if (s->block == NULL) {
        if (posix_memalign(&b, PAGE_BYTES, BLOCK_BYTES) != 0)
            abort();    /* only on allocation failure */
        s->block = b;
    }
    return s->block;
}

static void *ng_malloc(size_t size, void *user)
{
    struct h2srv *s = user;
    if (s->creating && size == NG_FRAMEBUF_LEN && s->framebuf == NULL)
        return s->framebuf = block_pages(s) + NG_MAP_BYTES;
    return mem_alloc(size);
}

static void ng_free(void *ptr, void *user)
{
    struct h2srv *s = user;
    if (ptr == NULL || (ptr != s->map && ptr != s->framebuf)) {
        free(ptr);
        return;
    }
    if (ptr == s->map)
        s->map = NULL;      /* grown: the new map is an ordinary allocation */
    else
        s->framebuf = NULL;
    if (s->map == NULL && s->framebuf == NULL) {
        free(s->block);
        s->block = NULL;
    } else if (s->pages_back) {
        /* the other one lives on: this one's pages go back now */
        madvise(ptr, ptr == s->block ? NG_MAP_BYTES : PAGES(NG_FRAMEBUF_LEN), MADV_DONTNEED);
    }
}

static void *ng_calloc(size_t n, size_t size, void *user)
{
    struct h2srv *s = user;
    if (s->creating && n * size == NG_MAP_BYTES && s->map == NULL)
        return memset(s->map = block_pages(s), 0, NG_MAP_BYTES);
    return mem_calloc(n, size);
}

/* nghttp2 allocates its buffers as realloc(NULL, size). */
static void *ng_realloc(void *ptr, size_t size, void *user)
{
    struct h2srv *s = user;
    if (ptr == NULL)
        return ng_malloc(size, user);
    if (ptr == s->framebuf || ptr == s->map) {
        size_t had = ptr == s->map ? NG_MAP_BYTES : NG_FRAMEBUF_LEN;
        void *p = mem_alloc(size);
        memcpy(p, ptr, size < had ? size : had);
        ng_free(ptr, user);
        return p;
    }
    void *p = realloc(ptr, size);
    if (p == NULL && size)
        abort();    /* only on allocation failure */
    return p;
}

struct h2srv *h2srv_new(struct event_base *base, struct io *io, const struct h2srv_limits *lim,
                        int tls, const struct h2srv_ops *ops, void *arg)
{
    struct h2srv *s = mem_calloc(1, sizeof(*s));
    s->base = base;
    s->io = io;
    s->lim = *lim;
    s->tls = tls;
    s->ops = ops;
    s->arg = arg;
    s->budget = FLOOD_BUDGET;
    s->budget_ms = clock_ms();
    s->kick = event_new(base, -1, 0, kick_cb, s);
    s->timer = evtimer_new(base, timer_cb, s);
    s->release = evtimer_new(base, release_cb, s);

    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0)
        abort();
    nghttp2_session_callbacks_set_on_begin_frame_callback(cb, on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_stream_reset_rate_limit(opt, RST_BURST, RST_RATE);
    nghttp2_option_set_max_continuations(opt, MAX_CONTINUATIONS);
    /* a closed stream is not kept for RFC 7540 priorities: ~400 bytes
     * each on an idle connection */
    nghttp2_option_set_no_closed_streams(opt, 1);
    /* responses' fields are not indexed, as nginx sends them: a dynamic
     * table held ~1.7 KiB on each connection that made a request */
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 0);
    nghttp2_mem mem = {s, ng_malloc, ng_free, ng_calloc, ng_realloc};
    s->pages_back = sysconf(_SC_PAGESIZE) == PAGE_BYTES;
    s->creating = 1;
    if (nghttp2_session_server_new3(&s->ng, cb, s, opt, &mem) != 0)
        abort();
    s->creating = 0;
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);

    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, lim->max_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)lim->max_header_bytes},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
    nghttp2_session_set_local_window_size(s->ng, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);

    io_setcb(io, read_cb, drained_cb, event_cb, s);
    io_setwatermark(io, EV_READ, 0);
    io_setwatermark(io, EV_WRITE, H2SRV_OUT_MAX / 2);
    struct timeval wt = clock_timeval(lim->idle_timeout_ms);
    io_set_timeouts(io, NULL, &wt);
    io_enable(io, EV_READ);
    timer_set(s, TM_PREFACE, lim->preface_timeout_ms);
    if (evbuffer_get_length(io_input(io)))
        io_trigger_read(io);    /* the preface came with the bytes already read */
    kick(s);
    return s;
}

void h2srv_shutdown(struct h2srv *s)
{
    if (s->conn_closed || s->goaway)
        return;
    s->goaway = 1;
    nghttp2_submit_shutdown_notice(s->ng);
    timer_set(s, TM_GOAWAY, GOAWAY_DELAY_MS);
    kick(s);
}

void h2srv_free(struct h2srv *s)
{
    if (s == NULL)
        return;
    conn_close(s);
    s->freed = 1;
    nghttp2_session_del(s->ng);
    s->ng = NULL;
    event_del(s->kick);
    event_del(s->timer);
    event_del(s->release);
    for (struct h2stream *st = LIST_ITEM(s->streams.first, struct h2stream, link); st;
         st = LIST_ITEM(st->link.next, struct h2stream, link))
        st->dirty = 0;
    s->dirty = NULL;
    if (s->nopen == 0)
        session_destroy(s);     /* else stream_closed() does, with the last stream */
}
