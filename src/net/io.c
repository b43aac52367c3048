/* sluice - io.c: the connection I/O layer (io.h), plain or TLS.
 *
 * Why not bufferevents: libevent's socket reads ask the kernel how much is
 * waiting (ioctl FIONREAD) before every read, a TLS bufferevent writes only
 * from its own write event (the next loop iteration, two epoll_ctl), and
 * each needed special cases above it. Here:
 * - one read per readiness event, into evbuffer space of a size we pick
 *   (IO_READ_SIZE, one 16 KiB allocation), never more than the read mark
 *   allows: no FIONREAD;
 * - writes go out when the layer above flushes (once per outermost
 *   callback, so whatever a callback queued is coalesced into one writev or
 *   one TLS record per 16 KiB), and the write event is armed only while the
 *   socket is full;
 * - TLS goes through the same two calls (struct io_ops: recv, send,
 *   shutdown): SSL_read draining what OpenSSL holds within the event,
 *   SSL_write with partial writes, WANT_READ / WANT_WRITE turned into which
 *   event is armed (a write that needs a read and a read that needs a write
 *   included), the handshakes driven by the same events.
 * Both events are level-triggered and persistent; an event nothing can be
 * done for is not armed (never a spin on readiness we cannot serve). A third,
 * edge-triggered, watches a socket nothing reads for its peer's end
 * (io_watch_end), armed only while the other two are not.
 * A stream (io_new_stream) is an io with no socket: the connection that
 * multiplexes it (HTTP/2) moves its bytes, through the same input, output
 * and callbacks, so the layers above run on it unchanged. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"
#include "io.h"
#include "mem.h"

/* Bytes per read: with libevent's chain header, one 16 KiB allocation. */
#define IO_READ_SIZE   (16384 - 128)
/* Plaintext bytes per SSL_write: one full TLS record. */
#define IO_TLS_RECORD  16384
/* SSL_read calls per readiness event; what is left comes next iteration. */
#define IO_TLS_READS   16
#define IO_WRITE_IOV   16
#define IO_SSL_ERRS    8

/* What recv and send return besides a byte count. */
#define IO_AGAIN   0
#define IO_FAIL   (-1)
#define IO_CLOSED (-2)

struct io;

struct io_ops {
    /* Read at most max bytes into the input: >0 bytes read, IO_AGAIN,
     * IO_CLOSED (the peer's end) or IO_FAIL. */
    long (*recv)(struct io *io, size_t max);
    /* Write the output: 1 all written, IO_AGAIN when it must wait (which
     * event: io->want_*), IO_FAIL. */
    int (*send)(struct io *io);
    void (*shutdown)(struct io *io);
};

struct io {
    const struct io_ops *ops;
    struct event_base *base;
    int fd;
    SSL *ssl;
    struct event rev, wev;
    struct event eev;               /* io_watch_end: edge-triggered, alone on fd */
    struct event kev;               /* activated only, never added: see io_kick */
    struct event *deadline;         /* connect + handshake bound; NULL after */
    struct evbuffer *in, *out;
    io_cb read_cb, drained_cb;
    io_event_cb event_cb;
    void *arg;
    struct timeval rtv, wtv;
    int has_rtv, has_wtv;
    size_t read_mark;               /* 0: no bound */
    size_t write_low;
    short enabled;                  /* EV_READ: the layer above reads */
    unsigned rd_armed : 1, wr_armed : 1, end_armed : 1;
    unsigned rd_idle : 1;           /* rev left armed while nothing reads: see io_update */
    unsigned watch_end : 1;         /* io_watch_end(io, 1) */
    unsigned connecting : 1;        /* TCP connect under way */
    unsigned handshaking : 1;       /* TLS handshake under way */
    unsigned hs_wants_write : 1;    /* the handshake waits for writability */
    unsigned write_blocked : 1;     /* output waits for the socket */
    unsigned rd_wants_write : 1;    /* SSL_read needs the socket writable */
    unsigned wr_wants_read : 1;     /* SSL_write needs the socket readable */
    unsigned ssl_more : 1;          /* OpenSSL holds input we did not take */
    unsigned paused : 1;            /* reading stopped at the read mark */
    unsigned kick : 1;              /* io_trigger_read pending */
    unsigned failed : 1;            /* an error: no more events */
    unsigned error_pending : 1;     /* failed, to be reported from the loop */
    unsigned up : 1;                /* connected, handshake done */
    int term;                       /* IO_CLOSED or IO_FAIL met after bytes read */
    /* A stream (io_new_stream): no socket; rev and wev are the read and
     * write timeouts' timers, kev delivers input, the end and drains. */
    const struct io_stream_ops *sops;
    void *owner;
    struct evbuffer_cb_entry *in_cb;    /* tells the owner what was consumed */
    struct evbuffer *pending;       /* given by the owner, not yet in the input:
                                     * a socket's kernel buffer (stream_fill) */
    unsigned end_pending : 1;       /* io_stream_end, not yet reported */
    unsigned drain_pending : 1;     /* the drained callback is due */
    int end_err;
    int busy;                       /* our callbacks on the stack */
    int dead;                       /* io_free called while busy */
    int err;                        /* errno of the last failure */
    unsigned long errs[IO_SSL_ERRS];
    int nerrs, errs_at;
};

static void io_update(struct io *io);

/* ---- errors ------------------------------------------------------------ */

/* Keep OpenSSL's queued error codes for io_ssl_error, and empty the queue
 * (it is per thread, shared by every connection of the worker). */
static void ssl_errors_take(struct io *io)
{
    unsigned long e;
    io->nerrs = io->errs_at = 0;
    while ((e = ERR_get_error()) != 0)
        if (io->nerrs < IO_SSL_ERRS)
            io->errs[io->nerrs++] = e;
}

/* A failure after SSL_get_error said `code` (ret: what the call returned):
 * IO_CLOSED for the peer's end, clean (close_notify) or dirty (a close
 * without it, tolerated as over TCP: framing says whether a message was
 * whole), IO_FAIL otherwise. */
static int ssl_failure(struct io *io, int code)
{
    io->err = errno;
    ssl_errors_take(io);
    if (code == SSL_ERROR_ZERO_RETURN)
        return IO_CLOSED;
    if (code == SSL_ERROR_SYSCALL && io->nerrs == 0) {
        if (io->err == 0 || io->err == EAGAIN)
            return IO_CLOSED;
        return IO_FAIL;
    }
    if (code == SSL_ERROR_SSL && io->nerrs == 1 &&
        ERR_GET_REASON(io->errs[0]) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        io->nerrs = 0;
        return IO_CLOSED;
    }
    io->err = 0;
    return IO_FAIL;
}

/* ---- plain ------------------------------------------------------------- */

static long plain_recv(struct io *io, size_t max)
{
    struct evbuffer_iovec v[2];
    size_t want = max < IO_READ_SIZE ? max : IO_READ_SIZE;
    int n = evbuffer_reserve_space(io->in, (ev_ssize_t)want, v, 2);
    if (n <= 0)
        abort();    /* only on allocation failure */
    size_t room = 0;
    for (int i = 0; i < n; i++) {
        if (room + v[i].iov_len > want)
            v[i].iov_len = want - room;
        room += v[i].iov_len;
    }
    ssize_t r = readv(io->fd, (struct iovec *)v, n);
    if (r <= 0) {
        evbuffer_commit_space(io->in, v, 0);
        if (evbuffer_get_length(io->in) == 0)
            evbuffer_drain(io->in, 0);      /* frees the reserved chain */
        if (r == 0)
            return IO_CLOSED;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return IO_AGAIN;
        io->err = errno;
        return IO_FAIL;
    }
    size_t left = (size_t)r;
    for (int i = 0; i < n; i++) {
        if (v[i].iov_len > left)
            v[i].iov_len = left;
        left -= v[i].iov_len;
    }
    evbuffer_commit_space(io->in, v, n);
    return (long)r;
}

static int plain_send(struct io *io)
{
    for (;;) {
        struct evbuffer_iovec v[IO_WRITE_IOV];
        size_t len = evbuffer_get_length(io->out);
        if (len == 0)
            return 1;
        int n = evbuffer_peek(io->out, (ev_ssize_t)len, NULL, v, IO_WRITE_IOV);
        if (n > IO_WRITE_IOV)
            n = IO_WRITE_IOV;
        size_t total = 0;
        for (int i = 0; i < n; i++)
            total += v[i].iov_len;
        ssize_t r = writev(io->fd, (struct iovec *)v, n);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return IO_AGAIN;
            io->err = errno;
            return IO_FAIL;
        }
        evbuffer_drain(io->out, (size_t)r);
        if ((size_t)r < total)
            return IO_AGAIN;        /* the socket is full */
    }
}

static void plain_shutdown(struct io *io)
{
}

static const struct io_ops plain_ops = { plain_recv, plain_send, plain_shutdown };

/* ---- TLS --------------------------------------------------------------- */

/* SSL_get_error wants this thread's error queue empty before the call.
 * ERR_clear_error costs about 800 instructions in OpenSSL 3 even when the
 * queue is empty (it clears every slot), twice per request over TLS;
 * looking first is a fraction of that. */
static void tls_clear_errors(void)
{
    if (ERR_peek_error() != 0)
        ERR_clear_error();
}

/* SSL_read into reserved input space while OpenSSL holds input, within max
 * bytes and IO_TLS_READS records: the socket is read once (read ahead), and
 * the records that read brought are all taken now, since no readiness event
 * will come for them. The next read(2) waits for the next event. */
static long tls_recv(struct io *io, size_t max)
{
    long total = 0;
    io->ssl_more = 0;
    for (int i = 0; i < IO_TLS_READS && (size_t)total < max; i++) {
        struct evbuffer_iovec v;
        size_t want = max - (size_t)total;
        if (want > IO_READ_SIZE)
            want = IO_READ_SIZE;
        if (evbuffer_reserve_space(io->in, (ev_ssize_t)want, &v, 1) != 1)
            abort();    /* only on allocation failure */
        tls_clear_errors();
        errno = 0;
        int r = SSL_read(io->ssl, v.iov_base, (int)want);
        if (r > 0) {
            v.iov_len = (size_t)r;
            evbuffer_commit_space(io->in, &v, 1);
            total += r;
            if (!SSL_has_pending(io->ssl))
                return total;   /* what the read brought is all taken */
            continue;
        }
        evbuffer_commit_space(io->in, &v, 0);
        if (evbuffer_get_length(io->in) == 0)
            evbuffer_drain(io->in, 0);
        int code = SSL_get_error(io->ssl, r);
        if (code == SSL_ERROR_WANT_READ)
            return total;
        if (code == SSL_ERROR_WANT_WRITE) {
            io->rd_wants_write = 1;
            return total;
        }
        int rc = ssl_failure(io, code);
        if (total == 0)
            return rc;
        io->term = rc;          /* reported after the bytes before it */
        return total;
    }
    io->ssl_more = SSL_has_pending(io->ssl) != 0;
    return total;
}

static int tls_send(struct io *io)
{
    for (;;) {
        size_t len = evbuffer_get_length(io->out);
        if (len == 0)
            return 1;
        int n = len > IO_TLS_RECORD ? IO_TLS_RECORD : (int)len;
        /* Small pieces (a head, a chunk header) go out in one record. */
        const unsigned char *p = evbuffer_pullup(io->out, n);
        tls_clear_errors();
        errno = 0;
        int r = SSL_write(io->ssl, p, n);
        if (r > 0) {
            evbuffer_drain(io->out, (size_t)r);
            continue;
        }
        int code = SSL_get_error(io->ssl, r);
        if (code == SSL_ERROR_WANT_WRITE) {
            io->write_blocked = 1;
            return IO_AGAIN;
        }
        if (code == SSL_ERROR_WANT_READ) {
            io->wr_wants_read = 1;
            return IO_AGAIN;
        }
        ssl_failure(io, code);
        return IO_FAIL;
    }
}

/* Our close_notify, best effort on a non-blocking socket: a peer (and
 * OpenSSL, for the session) takes a connection ended without one for a
 * cut one. Nothing after a fatal error, or before the handshake is done. */
static void tls_shutdown(struct io *io)
{
    if (io->up && !io->failed)
        SSL_shutdown(io->ssl);
    ERR_clear_error();
}

static const struct io_ops tls_ops = { tls_recv, tls_send, tls_shutdown };

/* ---- stream -------------------------------------------------------------- */

/* A stream has no socket to read: its owner appends input (io_stream_input). */
static long stream_recv(struct io *io, size_t max)
{
    return IO_AGAIN;
}

/* The owner takes what it can of the output; what it leaves waits for its
 * io_stream_writable(). */
static int stream_send(struct io *io)
{
    io->sops->output(io, io->owner);
    return evbuffer_get_length(io->out) == 0 ? 1 : IO_AGAIN;
}

static const struct io_ops stream_ops = { stream_recv, stream_send, plain_shutdown };

/* ---- events ------------------------------------------------------------ */

/* Add or delete ev as wanted; a timeout restarts only when (re)armed. */
static void arm(struct event *ev, int want, unsigned *armed, const struct timeval *tv)
{
    if (want && !*armed) {
        event_add(ev, tv);
        *armed = 1;
    } else if (!want && *armed) {
        event_del(ev);
        *armed = 0;
    }
}

/* A stream's read: what the owner gave goes into the input as a socket's
 * bytes would, while the layer above reads and no further than its read
 * mark, followed by the read callback (stream_deliver). A layer that stops
 * at its mark hears of every byte once it takes more, as from a socket;
 * bytes pushed past the mark at once would wait for a callback that comes
 * only when the input falls below it. */
static int stream_fill(struct io *io)
{
    size_t have = evbuffer_get_length(io->pending);
    size_t in = evbuffer_get_length(io->in), room = have;
    if (io->read_mark)
        room = io->read_mark > in ? io->read_mark - in : 0;
    if (room > have)
        room = have;
    if (room > 0)
        evbuffer_remove_buffer(io->pending, io->in, room);
    return room > 0;
}

/* The peer's end (or reset) is told after the input before it, or at once
 * to a layer that is not reading and watches the end or meets an error. */
static int stream_end_due(const struct io *io, int reading)
{
    if (!io->end_pending)
        return 0;
    if (reading)
        return evbuffer_get_length(io->pending) == 0;
    return io->watch_end || io->end_err;
}

/* A stream's state: the timers armed while their time counts (reading
 * enabled; output waiting for the owner), and the loop's turn (kev) when
 * input, the end or a drain is to be told. */
static void stream_update(struct io *io)
{
    if (io->dead)
        return;
    int full = io->read_mark && evbuffer_get_length(io->in) >= io->read_mark;
    int reading = !io->failed && (io->enabled & EV_READ) && !full;
    io->paused = (io->enabled & EV_READ) && full;
    unsigned ra = io->rd_armed, wa = io->wr_armed;
    arm(&io->rev, reading && io->has_rtv, &ra, &io->rtv);
    arm(&io->wev, !io->failed && io->write_blocked && io->has_wtv, &wa, &io->wtv);
    io->rd_armed = ra;
    io->wr_armed = wa;
    if (io->failed)
        return;
    int more = reading && evbuffer_get_length(io->pending) > 0;
    if (more || stream_end_due(io, reading) || io->drain_pending || io->kick)
        event_active(&io->kev, EV_READ, 1);
}

/* Which events the state needs armed. */
static void io_update(struct io *io)
{
    int r = 0, w = 0;
    if (io->sops) {
        stream_update(io);
        return;
    }
    if (io->dead || io->fd < 0)
        return;
    if (io->failed) {
        /* nothing: the failure is reported, or about to be */
    } else if (io->connecting) {
        w = 1;
    } else if (io->handshaking) {
        w = io->hs_wants_write;
        r = !w;
    } else {
        int full = io->read_mark && evbuffer_get_length(io->in) >= io->read_mark;
        int reading = (io->enabled & EV_READ) && !full;
        io->paused = (io->enabled & EV_READ) && full;
        r = io->wr_wants_read || (reading && !io->rd_wants_write);
        w = io->rd_wants_write || (io->write_blocked && !io->wr_wants_read);
        if (reading && io->ssl_more && !io->rd_wants_write)
            event_active(&io->kev, EV_READ, 1);     /* no readiness will say so */
    }
    /* Reading stopped on a healthy connection (a request being decided, a
     * full input): the read event stays in epoll, without its timeout, and
     * comes off only if the socket turns readable meanwhile (io_read_event).
     * A peer that sends nothing until its answer, nearly every client,
     * then costs no epoll_ctl at all for the pause, where taking the
     * event off and putting it back cost two per request (nginx, with its
     * edge-triggered events, makes none either). */
    int idle = !r && io->rd_armed && !io->failed && io->up && !io->connecting &&
               !io->handshaking;
    if (idle && !io->rd_idle) {
        event_remove_timer(&io->rev);   /* libevent's timer heap only */
        io->rd_idle = 1;
    } else if (r && io->rd_idle) {
        if (io->has_rtv)
            event_add(&io->rev, &io->rtv);  /* already in epoll: the timer restarts */
        io->rd_idle = 0;
    }
    /* The end watch is edge-triggered: it is armed only while neither
     * level-triggered event is (epoll keeps one mode per fd), taken off
     * before they are armed and put on after they are taken off. */
    int e = io->watch_end && !io->failed && io->up && !r && !idle && !w;
    unsigned ra = io->rd_armed, wa = io->wr_armed, ea = io->end_armed;
    if (!e)
        arm(&io->eev, 0, &ea, NULL);
    if (!idle)
        io->rd_idle = 0;
    arm(&io->rev, r || idle, &ra, io->has_rtv ? &io->rtv : NULL);
    arm(&io->wev, w, &wa, io->has_wtv ? &io->wtv : NULL);
    if (e)
        arm(&io->eev, 1, &ea, NULL);
    io->rd_armed = ra;
    io->wr_armed = wa;
    io->end_armed = ea;
}

static void io_destroy(struct io *io)
{
    if (io->in_cb)
        evbuffer_remove_cb_entry(io->in, io->in_cb);
    io->ops->shutdown(io);
    if (io->ssl)
        SSL_free(io->ssl);
    if (io->fd >= 0)
        close(io->fd);
    evbuffer_free(io->in);
    evbuffer_free(io->out);
    if (io->pending)
        evbuffer_free(io->pending);
    free(io);
}

/* Our callbacks on the stack: io_free waits for the outermost to return. */
static void io_hold(struct io *io)
{
    io->busy++;
}

static void io_unhold(struct io *io)
{
    if (--io->busy == 0 && io->dead)
        io_destroy(io);
}

/* Report what to the layer above; reading and writing stop after an error
 * or a timeout, reading after an end. */
static void io_report(struct io *io, short what)
{
    if (what & (IO_ERROR | IO_TIMEOUT))
        io->failed = 1;
    if (what & (IO_EOF | IO_ERROR | IO_TIMEOUT))
        io->enabled &= ~EV_READ;
    io_update(io);
    if (io->event_cb)
        io->event_cb(io, what, io->arg);
}

/* Established: the deadline goes, queued output goes out. */
static void io_established(struct io *io)
{
    io->up = 1;
    io->connecting = io->handshaking = 0;
    if (io->deadline) {
        event_free(io->deadline);
        io->deadline = NULL;
    }
    io_flush(io);
    io_report(io, IO_CONNECTED);
}

static void io_handshake(struct io *io)
{
    ERR_clear_error();
    errno = 0;
    int r = SSL_do_handshake(io->ssl);
    if (r == 1) {
        /* read ahead may have taken application data with the Finished */
        io->ssl_more = SSL_has_pending(io->ssl) != 0;
        io_established(io);
        return;
    }
    int code = SSL_get_error(io->ssl, r);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
        io->hs_wants_write = code == SSL_ERROR_WANT_WRITE;
        io_update(io);
        return;
    }
    int rc = ssl_failure(io, code);
    io->handshaking = 0;
    io->failed = 1;             /* never an SSL_read on a failed handshake */
    io_report(io, rc == IO_CLOSED ? IO_EOF | IO_READING : IO_ERROR | IO_READING);
}

/* The TCP connect ended (the write event): up, or why not. */
static void io_connect_done(struct io *io)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err == EINPROGRESS || err == EALREADY)
        return;                 /* not yet */
    if (err != 0) {
        io->err = err;
        io->connecting = 0;
        io_report(io, IO_ERROR | IO_WRITING);
        return;
    }
    io->connecting = 0;
    if (io->ssl == NULL) {
        io_established(io);
        return;
    }
    io->handshaking = 1;
    SSL_set_connect_state(io->ssl);
    io_handshake(io);
}

/* One read, and what it brought to the layer above. */
static void io_read_now(struct io *io)
{
    size_t max = IO_READ_SIZE * IO_TLS_READS;
    if (io->read_mark) {
        size_t len = evbuffer_get_length(io->in);
        if (len >= io->read_mark) {
            io_update(io);      /* paused until the input is taken */
            return;
        }
        if (io->read_mark - len < max)
            max = io->read_mark - len;
    }
    long r = io->ops->recv(io, max);
    if (r > 0 && io->read_cb) {
        io->read_cb(io, io->arg);
        if (io->dead)
            return;
    }
    if (r > 0 && io->term) {
        r = io->term;
        io->term = 0;
    }
    if (r == IO_CLOSED)
        io_report(io, IO_EOF | IO_READING);
    else if (r == IO_FAIL)
        io_report(io, IO_ERROR | IO_READING);
    else
        io_update(io);
}

/* A write the write event (or a read, for TLS) made possible. */
static void io_write_now(struct io *io)
{
    io->write_blocked = io->wr_wants_read = 0;
    size_t before = evbuffer_get_length(io->out);
    int r = io->ops->send(io);
    if (r == IO_FAIL) {
        io_report(io, IO_ERROR | IO_WRITING);
        return;
    }
    if (r == IO_AGAIN && io->ssl == NULL)
        io->write_blocked = 1;
    io_update(io);
    size_t after = evbuffer_get_length(io->out);
    if (after < before && after <= io->write_low && io->drained_cb)
        io->drained_cb(io, io->arg);
}

static void io_read_event(evutil_socket_t fd, short what, void *arg)
{
    struct io *io = arg;
    if (io->rd_idle) {
        /* Readable while nothing reads it (bytes pipelined behind a request
         * being decided, the peer's end): now the event comes off, or it
         * would fire on every turn of the loop; the end watch takes over. */
        event_del(&io->rev);
        io->rd_armed = io->rd_idle = 0;
        io_update(io);
        return;
    }
    io_hold(io);
    if (what & EV_TIMEOUT) {
        io_report(io, IO_TIMEOUT | IO_READING);     /* disarms it */
    } else if (io->handshaking) {
        io_handshake(io);
    } else if (!io->failed) {
        if (io->wr_wants_read)
            io_write_now(io);
        if (!io->dead && !io->failed && (io->enabled & EV_READ) && !io->rd_wants_write)
            io_read_now(io);
    }
    io_unhold(io);
}

/* Something happened on a socket io_watch_end watches while nothing reads
 * it: more bytes (they stay in the kernel), the peer's end, or a reset. */
static void io_end_event(evutil_socket_t fd, short what, void *arg)
{
    struct io *io = arg;
    struct pollfd p = { .fd = io->fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) != 1 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
        return;
    io_hold(io);
    io->watch_end = 0;          /* told once */
    if (p.revents & POLLERR) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        io->err = err ? err : ECONNRESET;
        io_report(io, IO_ERROR | IO_READING);
    } else {
        io_report(io, IO_EOF | IO_READING);
    }
    io_unhold(io);
}

/* A stream's turn of the loop: a drain, fresh input, then the end. */
static void stream_deliver(struct io *io)
{
    if (io->drain_pending) {
        io->drain_pending = 0;
        if (io->drained_cb && evbuffer_get_length(io->out) <= io->write_low)
            io->drained_cb(io, io->arg);
        if (io->dead)
            return;
    }
    if (io->failed)
        return;
    int full = io->read_mark && evbuffer_get_length(io->in) >= io->read_mark;
    int reading = (io->enabled & EV_READ) && !full;
    if (reading && stream_fill(io)) {
        if (io->read_cb)
            io->read_cb(io, io->arg);
        if (io->dead || io->failed)
            return;
        full = io->read_mark && evbuffer_get_length(io->in) >= io->read_mark;
        reading = (io->enabled & EV_READ) && !full;
    }
    if (stream_end_due(io, reading)) {
        io->end_pending = 0;
        io->err = io->end_err;
        io_report(io, io->end_err ? IO_ERROR | IO_READING : IO_EOF | IO_READING);
        return;
    }
    io_update(io);
}

/* What needs the loop's turn without readiness: an error io_flush or
 * io_connect met, io_trigger_read, input OpenSSL holds. Its own event:
 * libevent does not insert an event that is active into epoll, so
 * activating rev or wev could leave them unarmed. */
static void io_kick_event(evutil_socket_t fd, short what, void *arg)
{
    struct io *io = arg;
    io_hold(io);
    if (io->error_pending) {
        io->error_pending = 0;
        io_report(io, IO_ERROR | IO_WRITING);
    } else if (io->kick) {
        io->kick = 0;
        if (io->read_cb)
            io->read_cb(io, io->arg);
        io_update(io);
    } else if (io->sops) {
        stream_deliver(io);
    } else if (!io->failed && !io->handshaking && io->up && (io->enabled & EV_READ) &&
               !io->rd_wants_write) {
        io_read_now(io);
    }
    io_unhold(io);
}

static void io_write_event(evutil_socket_t fd, short what, void *arg)
{
    struct io *io = arg;
    io_hold(io);
    if (what & EV_TIMEOUT) {
        io_report(io, IO_TIMEOUT | IO_WRITING);
    } else if (io->failed) {
        io_update(io);
    } else if (io->connecting) {
        io_connect_done(io);
    } else if (io->handshaking) {
        io_handshake(io);
    } else {
        if (io->rd_wants_write) {
            io->rd_wants_write = 0;
            if (io->enabled & EV_READ)
                io_read_now(io);
        }
        if (!io->dead && !io->failed && io->write_blocked)
            io_write_now(io);
        else
            io_update(io);
    }
    io_unhold(io);
}

/* connect + handshake took too long. */
static void io_deadline_event(evutil_socket_t fd, short what, void *arg)
{
    struct io *io = arg;
    io_hold(io);
    event_free(io->deadline);
    io->deadline = NULL;
    if (!io->up && !io->failed) {
        io->connecting = io->handshaking = 0;
        io_report(io, IO_TIMEOUT | IO_WRITING);
    }
    io_unhold(io);
}

/* ---- the interface ----------------------------------------------------- */

static void io_events_assign(struct io *io)
{
    event_assign(&io->rev, io->base, io->fd, EV_READ | EV_PERSIST, io_read_event, io);
    event_assign(&io->wev, io->base, io->fd, EV_WRITE | EV_PERSIST, io_write_event, io);
    event_assign(&io->kev, io->base, -1, 0, io_kick_event, io);
    event_assign(&io->eev, io->base, io->fd, EV_READ | EV_ET | EV_PERSIST, io_end_event, io);
}

struct io *io_new(struct event_base *base, int fd, struct ssl_st *ssl)
{
    struct io *io = mem_calloc(1, sizeof(*io));
    io->base = base;
    io->fd = fd;
    io->ssl = ssl;
    io->ops = ssl ? &tls_ops : &plain_ops;
    io->in = evbuffer_new();
    io->out = evbuffer_new();
    if (io->in == NULL || io->out == NULL)
        abort();    /* only on allocation failure */
    io_events_assign(io);
    if (ssl) {
        SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_set_read_ahead(ssl, 1);     /* one read(2) takes what is there */
    }
    if (fd >= 0 && ssl) {
        SSL_set_fd(ssl, fd);
        SSL_set_accept_state(ssl);
        io->handshaking = 1;
        io_update(io);
    } else if (fd >= 0) {
        io->up = 1;
    }
    return io;
}

void io_free(struct io *io)
{
    if (io == NULL)
        return;
    event_del(&io->rev);
    event_del(&io->wev);
    event_del(&io->kev);
    event_del(&io->eev);
    io->rd_armed = io->wr_armed = io->end_armed = io->rd_idle = 0;
    if (io->deadline) {
        event_free(io->deadline);
        io->deadline = NULL;
    }
    io->dead = 1;
    if (io->sops) {
        /* The owner forgets the stream now, and hears of no more reads. */
        evbuffer_remove_cb_entry(io->in, io->in_cb);
        io->in_cb = NULL;
        evbuffer_add_buffer(io->in, io->pending);   /* all that was never read */
        io->sops->closed(io, io->owner);
    }
    if (io->busy == 0)
        io_destroy(io);
}

int io_connect(struct io *io, const struct sockaddr *sa, socklen_t len, int64_t timeout_ms)
{
    if (io->sops)
        abort();    /* a stream is connected by its owner */
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    io->fd = fd;
    io_events_assign(io);
    if (io->ssl && SSL_set_fd(io->ssl, fd) != 1) {
        ERR_clear_error();
        return -1;
    }
    io->connecting = 1;
    if (connect(fd, sa, len) < 0 && errno != EINPROGRESS) {
        io->err = errno;        /* refused at once (loopback): said from the loop */
        io->failed = io->error_pending = 1;
        event_active(&io->kev, EV_WRITE, 1);
    }
    if (timeout_ms > 0) {
        struct timeval tv = clock_timeval(timeout_ms);
        io->deadline = evtimer_new(io->base, io_deadline_event, io);
        if (io->deadline == NULL)
            abort();    /* only on allocation failure */
        evtimer_add(io->deadline, &tv);
    }
    io_update(io);
    return 0;
}

void io_setcb(struct io *io, io_cb read, io_cb drained, io_event_cb event, void *arg)
{
    io->read_cb = read;
    io->drained_cb = drained;
    io->event_cb = event;
    io->arg = arg;
}

void io_setwatermark(struct io *io, short what, size_t mark)
{
    if (what & EV_WRITE)
        io->write_low = mark;   /* read when output drains: no event changes */
    if (what & EV_READ) {
        io->read_mark = mark;
        io_update(io);
    }
}

/* An armed event gets the new timeout in place (libevent's timer heap
 * only, no epoll_ctl: set_timeouts comes once or twice per request). */
static void retime(struct event *ev, unsigned armed, const struct timeval *tv)
{
    if (!armed)
        return;
    if (tv)
        event_add(ev, tv);
    else
        event_remove_timer(ev);
}

void io_set_timeouts(struct io *io, const struct timeval *rd, const struct timeval *wr)
{
    io->has_rtv = rd != NULL;
    if (rd)
        io->rtv = *rd;
    io->has_wtv = wr != NULL;
    if (wr)
        io->wtv = *wr;
    retime(&io->rev, io->rd_armed && !io->rd_idle, rd);
    retime(&io->wev, io->wr_armed, wr);
}

void io_enable(struct io *io, short what)
{
    io->enabled |= what & EV_READ;
    io_update(io);
}

void io_disable(struct io *io, short what)
{
    io->enabled &= ~(what & EV_READ);
    io_update(io);
}

void io_watch_end(struct io *io, int on)
{
    io->watch_end = on != 0;
    io_update(io);
}

void io_trigger_read(struct io *io)
{
    io->kick = 1;
    event_active(&io->kev, EV_READ, 1);
}

void io_flush(struct io *io)
{
    if (io->paused && evbuffer_get_length(io->in) < io->read_mark)
        io_update(io);          /* the input was taken: read again */
    if (!io->up || io->dead || io->failed || io->write_blocked || io->wr_wants_read ||
        evbuffer_get_length(io->out) == 0)
        return;
    int r = io->ops->send(io);
    if (r == IO_FAIL) {
        io->failed = io->error_pending = 1;
        io_update(io);
        event_active(&io->kev, EV_WRITE, 1);
        return;
    }
    if (r == IO_AGAIN && io->ssl == NULL)
        io->write_blocked = 1;
    if (r == IO_AGAIN)
        io_update(io);
}

struct evbuffer *io_input(struct io *io)
{
    return io->in;
}

struct evbuffer *io_output(struct io *io)
{
    return io->out;
}

int io_fd(const struct io *io)
{
    return io->fd;
}

struct ssl_st *io_ssl(const struct io *io)
{
    return io->ssl;
}

int io_connected(const struct io *io)
{
    return io->up;
}

int io_errno(const struct io *io)
{
    return io->err;
}

unsigned long io_ssl_error(struct io *io)
{
    return io->errs_at < io->nerrs ? io->errs[io->errs_at++] : 0;
}

/* ---- streams ------------------------------------------------------------- */

/* The layer above took input: the owner may let its peer send that much. */
static void stream_in_changed(struct evbuffer *buf, const struct evbuffer_cb_info *info,
                              void *arg)
{
    struct io *io = arg;
    if (info->n_deleted > 0)
        io->sops->consumed(io, io->owner, info->n_deleted);
}

struct io *io_new_stream(struct event_base *base, const struct io_stream_ops *ops, void *owner)
{
    struct io *io = mem_calloc(1, sizeof(*io));
    io->base = base;
    io->fd = -1;
    io->ops = &stream_ops;
    io->sops = ops;
    io->owner = owner;
    io->in = evbuffer_new();
    io->out = evbuffer_new();
    io->pending = evbuffer_new();
    if (io->in == NULL || io->out == NULL || io->pending == NULL)
        abort();    /* only on allocation failure */
    io->in_cb = evbuffer_add_cb(io->in, stream_in_changed, io);
    if (io->in_cb == NULL)
        abort();
    evtimer_assign(&io->rev, base, io_read_event, io);
    evtimer_assign(&io->wev, base, io_write_event, io);
    event_assign(&io->kev, base, -1, 0, io_kick_event, io);
    event_assign(&io->eev, base, -1, 0, io_kick_event, io);     /* never added */
    io->up = 1;
    return io;
}

void io_stream_input(struct io *io, const void *data, size_t len)
{
    if (io->dead || io->failed || len == 0)
        return;
    if (evbuffer_add(io->pending, data, len) != 0)
        abort();    /* only on allocation failure */
    if (io->rd_armed)
        event_add(&io->rev, &io->rtv);  /* input came: the read timeout restarts */
    stream_update(io);
}

void io_stream_end(struct io *io, int err)
{
    if (io->dead || io->failed || (io->end_pending && !err))
        return;
    io->end_pending = 1;
    io->end_err = err;
    stream_update(io);
}

void io_stream_writable(struct io *io)
{
    if (io->dead || io->failed)
        return;
    size_t before = evbuffer_get_length(io->out);
    if (before > 0)
        io->sops->output(io, io->owner);
    size_t after = evbuffer_get_length(io->out);
    if (io->write_blocked && after < before) {
        if (io->wr_armed)
            event_add(&io->wev, &io->wtv);  /* progress: the write timeout restarts */
        if (after <= io->write_low)
            io->drain_pending = 1;
    }
    io->write_blocked = after > 0;
    stream_update(io);
}
