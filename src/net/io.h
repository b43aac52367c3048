/* sluice - io.h: bytes between a socket and sluice's buffers, plain or TLS.
 *
 * One interface for client and upstream connections (nginx's recv/send on
 * the connection, HAProxy's transport layer): an io owns its socket, its
 * SSL object when it has one, two level-triggered events and an input and
 * an output evbuffer. The layers above read io_input() when the read
 * callback says bytes arrived, append to io_output() and call io_flush()
 * (once per outermost callback): whether the bytes are encrypted, or come
 * from a socket at all (an HTTP/2 stream, io_new_stream), is never their
 * concern. io_free() may be called from inside the io's own
 * callbacks: the io is freed when they return. */
#ifndef SLUICE_IO_H
#define SLUICE_IO_H

#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct timeval;
struct ssl_st;
struct io;

/* What an event callback hears (the values of libevent's BEV_EVENT_*). */
#define IO_READING   0x01       /* while reading */
#define IO_WRITING   0x02       /* while writing, or connecting */
#define IO_EOF       0x10       /* the peer ended its side (FIN or close_notify) */
#define IO_ERROR     0x20       /* io_errno(), io_ssl_error() say what */
#define IO_TIMEOUT   0x40
#define IO_CONNECTED 0x80       /* the connect, and the TLS handshake, are done */

/* Bytes arrived (read), or the output drained to the write low mark after
 * the socket had been full (drained). */
typedef void (*io_cb)(struct io *io, void *arg);
typedef void (*io_event_cb)(struct io *io, short what, void *arg);

/* An io over fd (accepted, non-blocking; -1: io_connect makes it) and ssl
 * (NULL: plain). Both are owned from here, also on failure. With an fd and
 * an ssl the server side of a handshake starts at once, and IO_CONNECTED
 * comes when it is done. */
struct io *io_new(struct event_base *base, int fd, struct ssl_st *ssl);
/* Sends a TLS close_notify when the connection was up (best effort), then
 * closes the socket. */
void io_free(struct io *io);

/* A non-blocking connect to sa; the TCP connect and a TLS handshake after
 * it must be done within timeout_ms (0: no bound), else IO_TIMEOUT. A
 * connect refused at once is reported from the loop, as IO_ERROR. Returns
 * -1 only when no socket could be made. */
int io_connect(struct io *io, const struct sockaddr *sa, socklen_t len, int64_t timeout_ms);

void io_setcb(struct io *io, io_cb read, io_cb drained, io_event_cb event, void *arg);
/* Read: stop reading while the input holds `mark` bytes or more (0: no
 * bound). Write: the drained callback's low mark. */
void io_setwatermark(struct io *io, short what, size_t mark);
/* A read timeout counts while reading is enabled, a write timeout while
 * output waits for a full socket; NULL: none. Either ends in IO_TIMEOUT
 * with reading (or writing) stopped. */
void io_set_timeouts(struct io *io, const struct timeval *rd, const struct timeval *wr);
/* EV_READ: read when bytes come (writes need no enabling). */
void io_enable(struct io *io, short what);
void io_disable(struct io *io, short what);
/* on: while nothing reads the socket (reading disabled, or stopped at the
 * read mark), still tell when the peer goes: IO_EOF when it ended its
 * side, IO_ERROR when it reset; the bytes it sent before stay unread in
 * the kernel. 0: no longer. */
void io_watch_end(struct io *io, int on);
/* Call the read callback from the loop, after the other events' turn. */
void io_trigger_read(struct io *io);

/* Write the output now; arm the write event only if the socket (or TLS)
 * cannot take it all. Never calls back: a failure is reported from the loop.
 * Reading stopped at the read mark resumes here once the input is below it
 * (the layer above flushes after taking input, once per callback). */
void io_flush(struct io *io);

/* ---- streams --------------------------------------------------------------
 * An io with no socket under it: one stream of a multiplexed connection
 * (an HTTP/2 stream), whose owner moves the bytes in and out. To the layers
 * above it is an io like a socket's (nginx gives each HTTP/2 stream a fake
 * connection the same way): the callbacks, read mark, timeouts (a read
 * timeout counts while reading is enabled and no input comes, a write
 * timeout while output waits for the owner), io_flush, io_free. It is
 * connected from the start; io_fd() is -1, io_ssl() NULL, io_connect() a
 * programming error. */
struct io_stream_ops {
    /* io_flush(), or io_stream_writable(): take what you can of
     * io_output(io) now; what is left waits for the next
     * io_stream_writable(). */
    void (*output)(struct io *io, void *owner);
    /* The layer above removed n bytes from io_input(io): the peer may send
     * that much more. Called from inside the layer above's code: record,
     * do not call back into it. */
    void (*consumed)(struct io *io, void *owner, size_t n);
    /* io_free(io): the owner forgets io. Called once; io_input(io) still
     * holds what was never read (no consumed() for it). */
    void (*closed)(struct io *io, void *owner);
};

struct io *io_new_stream(struct event_base *base, const struct io_stream_ops *ops, void *owner);
/* The owner's side; none of these calls the io's callbacks: they come
 * from the loop, as for a socket. Bytes from the peer: they wait as in a
 * socket's kernel buffer and enter io_input() as a read would, while
 * reading is enabled and up to the read mark, each time followed by the
 * read callback. The peer's flow control bounds what waits. */
void io_stream_input(struct io *io, const void *data, size_t len);
/* The peer ended its side: err 0 is IO_EOF (told after the input there is
 * read, while reading is enabled or the end watched), err != 0 is
 * IO_ERROR with io_errno() err (e.g. ECONNRESET for a reset stream). */
void io_stream_end(struct io *io, int err);
/* The owner can take output again: output() runs now if output waits, and
 * the drained callback from the loop once it is at the write low mark. */
void io_stream_writable(struct io *io);

struct evbuffer *io_input(struct io *io);
struct evbuffer *io_output(struct io *io);
int io_fd(const struct io *io);
struct ssl_st *io_ssl(const struct io *io);
int io_connected(const struct io *io);  /* connect and handshake done */
/* The socket error of the last IO_ERROR (0: none, or a TLS one). */
int io_errno(const struct io *io);
/* OpenSSL's error codes of the last failure, oldest first, one per call;
 * 0 when there are no more. */
unsigned long io_ssl_error(struct io *io);

#endif
