/* sluice - h2srv.h: the HTTP/2 server side of one client connection.
 *
 * nghttp2 frames and decodes; every stream becomes an io stream (io.h)
 * carrying an HTTP/1.1 request (h2msg.c), handed to the layer above by
 * the open callback, which serves it as it serves any connection; the
 * HTTP/1.1 response it writes goes back as HEADERS, DATA and trailers. The
 * connection's output is bounded (H2SRV_OUT_MAX queued), windows are
 * given back only as the layer above reads the body, and a stream's slot
 * in the in-flight cap is held until its io is freed. Everything the
 * session does runs from its own events, never inside the layer above's
 * calls. */
#ifndef SLUICE_H2SRV_H
#define SLUICE_H2SRV_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct io;
struct h2srv;

/* The HTTP/2 connection preface a client sends first (RFC 9113 §3.4). */
#define H2SRV_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2SRV_PREFACE_LEN 24
/* Connection output queued before framing stops (nghttpx: 32 KiB). */
#define H2SRV_OUT_MAX     (64 * 1024)

struct h2srv_limits {
    uint32_t max_streams;       /* SETTINGS_MAX_CONCURRENT_STREAMS, and the
                                 * cap on streams whose io is still open */
    uint32_t max_requests;      /* then a graceful GOAWAY; 0: none */
    size_t max_header_bytes;    /* a request's header list (431 past it) */
    int64_t preface_timeout_ms; /* the preface and first SETTINGS */
    int64_t idle_timeout_ms;    /* no stream open: GOAWAY and close; also
                                 * the bound on a connection's output
                                 * waiting on a peer that does not read */
};

struct h2srv_ops {
    /* A new stream: io carries its HTTP/1.1 request, or, when refused is
     * not 0, nothing: its header list could not become one, and the callee
     * answers refused (400, 431, 501) as it answers a head it cannot parse
     * (logged and counted). The callee makes io its own (io_setcb...) and
     * frees it (io_free) when done; returns 0, or -1 when it cannot (the
     * stream is refused; io is freed here). */
    int (*open)(void *arg, struct io *io, int refused);
    /* The session is over (connection closed, no stream io left): the
     * caller now calls h2srv_free. From the session's own event. */
    void (*ended)(void *arg);
};

/* Takes io (a client connection whose protocol is h2: ALPN, or a preface
 * at the start of io_input(io), which it reads itself) and frees it when
 * the connection ends. tls: for :scheme. */
struct h2srv *h2srv_new(struct event_base *base, struct io *io, const struct h2srv_limits *lim,
                        int tls, const struct h2srv_ops *ops, void *arg);
/* Graceful: GOAWAY (a shutdown notice, then the last stream id after a
 * round trip); open streams finish, then the connection closes. */
void h2srv_shutdown(struct h2srv *s);
/* The connection closes now; streams still open get ECONNRESET. s is gone
 * once its last stream io is freed (at once when none is open). No more
 * callbacks after this. */
void h2srv_free(struct h2srv *s);

#endif
