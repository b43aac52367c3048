/* sluice - conn.c: services on a downstream connection (conn.h).
 *
 * Lifetime (busy/dead, freed by the outermost callback), the connection's
 * timer, close-after-write, write coalescing with backpressure by
 * watermarks, and the body pump both request.c and exchange.c use. What
 * needs the layers above goes through c->ops. */
#include <event2/buffer.h>
#include <event2/event.h>

#include "clock.h"
#include "conn.h"
#include "http1.h"
#include "io.h"
#include "request_state.h"
#include "upstream.h"

/* ---- lifetime ---------------------------------------------------------- */

void conn_enter(struct client *c)
{
    c->busy++;
}


/* Returns 1 when the client was freed. The outermost callback also writes
 * what the others queued (conn_flush). */
int conn_leave(struct client *c)
{
    if (c->busy == 1 && !c->dead)
        conn_flush(c);
    if (--c->busy == 0 && c->dead) {
        c->ops->free(c);
        return 1;
    }
    return 0;
}

void conn_kill(struct client *c)
{
    c->ops->log_end(c);     /* a request cut short is logged with what was sent */
    c->dead = 1;
    c->ops->cancel(c);
    if (c->rq && c->rq->up) {
        upstream_close(c->rq->up);
        c->rq->up = NULL;
    }
}

static void timer_arm(struct client *c, int64_t now, int64_t ms)
{
    struct timeval tv = clock_timeval(ms);
    c->timer_fires_ms = now + ms;
    event_add(c->timer, &tv);
}

/* Each request would otherwise add the timer twice and delete it once
 * (header, none, idle), libevent's heap work every time. The timer is left
 * pending instead: a later time than the pending one is only noted, and
 * the callback re-arms for the rest (conn_timer_due); TM_NONE leaves it
 * to fire for nothing. Only an earlier time re-adds it. */
void conn_timer(struct client *c, enum timer_mode mode, int64_t ms)
{
    c->timer_mode = mode;
    if (mode == TM_NONE)
        return;
    int64_t now = clock_ms();
    c->timer_due_ms = now + ms;
    if (c->timer_fires_ms != 0 && c->timer_fires_ms <= c->timer_due_ms)
        return;
    timer_arm(c, now, ms);
}

int conn_timer_due(struct client *c)
{
    c->timer_fires_ms = 0;
    if (c->timer_mode == TM_NONE)
        return 0;
    int64_t now = clock_ms();
    if (now < c->timer_due_ms) {
        timer_arm(c, now, c->timer_due_ms - now);
        return 0;
    }
    return 1;
}

/* Stop reading requests and close once what is queued has been written. */
void conn_close_after_write(struct client *c)
{
    c->ops->log_end(c);
    c->state = CS_CLOSING;
    c->keep_alive = 0;
    conn_timer(c, TM_NONE, 0);
    io_disable(c->io, EV_READ);
    if (evbuffer_get_length(io_output(c->io)) == 0)
        conn_kill(c);
}

/* ---- writing ----------------------------------------------------------- */

/* Flush both sides, then do what the freed space allows: resume a side that
 * backpressure stopped. Bounded: each round needs progress. */
void conn_flush(struct client *c)
{
    if (c->state == CS_H2)
        return;         /* the session writes its connection itself */
    for (int round = 0; round < 16 && !c->dead; round++) {
        int progress = 0;
        io_flush(c->io);
        /* the request may end, and give c->rq back, in any callback: its
         * upstream connection is looked up again after each */
        struct upstream_conn *up = c->rq ? c->rq->up : NULL;
        if (up)
            io_flush(up->io);       /* a no-op until connected */
        if (c->client_paused && up &&
            evbuffer_get_length(io_output(up->io)) <= CONN_HIGH_WATER / 2) {
            c->client_paused = 0;
            io_enable(c->io, EV_READ);
            c->ops->process(c);
            progress = 1;
        }
        up = c->rq ? c->rq->up : NULL;
        if (!c->dead && c->up_paused && up &&
            evbuffer_get_length(io_output(c->io)) <= CONN_HIGH_WATER / 2) {
            c->up_paused = 0;
            io_enable(up->io, EV_READ);
            c->ops->up_resumed(c);
            progress = 1;
        }
        /* Answers sluice wrote itself filled the output while pipelined
         * heads waited: once it drains, go on with them (a write that
         * completed at once arms no write event to do it). */
        if (!c->dead && c->heads_paused &&
            evbuffer_get_length(io_output(c->io)) <= CONN_HIGH_WATER / 2) {
            c->heads_paused = 0;
            c->ops->process(c);
            progress = 1;
        }
        if (!progress)
            break;
    }
    if (!c->dead && c->state == CS_CLOSING &&
        evbuffer_get_length(io_output(c->io)) == 0)
        conn_kill(c);
}

/* ---- bodies ------------------------------------------------------------ */

/* Bytes move from buffer to buffer by copying into the destination's own
 * chains, never by handing chains over: a socket read leaves its bytes in a
 * chain about twice their size, and a stalled peer's output made of such
 * chains would hold twice what CONN_HIGH_WATER allows. */

/* Copy len bytes to the end of dst in slices of at most CONN_COPY_SLICE:
 * evbuffer_add() gives a piece that does not fit the last chain a chain of
 * its own size rounded up to a power of two (a 16 KiB read: 32 KiB), and
 * a stalled peer's output keeps its first chain's written part resident
 * after a partial write. Slices keep dst's chains at 4 KiB (a page), so a
 * stall wastes less than one (measured: 50 stalled uploads, 82 KB of RSS
 * each without, 79 KB with; responses 90 KB and 80 KB). */
void conn_copy(struct evbuffer *dst, const char *data, size_t len)
{
    while (len > 0) {
        size_t k = len < CONN_COPY_SLICE ? len : CONN_COPY_SLICE;
        evbuffer_add(dst, data, k);
        data += k;
        len -= k;
    }
}

/* Copy the payload pieces of run (the first `used` bytes of src) to dst, or
 * drop them when dst is NULL, then drop the run, framing included. */
static void move_pieces(struct evbuffer *src, struct evbuffer *dst, const char *run,
                        size_t used, const struct http1_piece *pieces, int n)
{
    for (int i = 0; dst && i < n; i++)
        conn_copy(dst, run + pieces[i].off, pieces[i].len);
    evbuffer_drain(src, used);
}

/* Feed one contiguous run of src's body bytes to parser p; the payload goes
 * to dst as is. Returns 1 when the message is complete, 0 to wait for more,
 * 2 when there may be more to do, -1 on a framing error. *payload gets the
 * payload bytes moved. */
int conn_pump_once(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                   size_t *payload)
{
    return conn_pump_tail(p, src, dst, NULL, payload);
}

int conn_pump_tail(struct http1 *p, struct evbuffer *src, struct evbuffer *dst,
                   struct evbuffer *tail, size_t *payload)
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
    if (tail) {                 /* the framing after the last payload byte */
        size_t from = npieces ? pieces[npieces - 1].off + pieces[npieces - 1].len : 0;
        if (npieces)
            evbuffer_drain(tail, evbuffer_get_length(tail));
        if ((size_t)used > from)
            evbuffer_add(tail, (const char *)v.iov_base + from, (size_t)used - from);
    }
    move_pieces(src, dst, v.iov_base, (size_t)used, pieces, npieces);
    if (done)
        return 1;
    return used == 0 && npieces == 0 ? 0 : 2;
}

