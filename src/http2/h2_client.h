/* sluice - h2_client.h: HTTP/2 connections to the servers of one upstream.
 *
 * The mirror image of the h2 front: per worker and per upstream with
 * protocol h2, a set of nghttp2 client sessions (h2c with prior knowledge,
 * or ALPN h2 over the upstream's TLS). An exchange borrows a stream, an io
 * stream (io.h) on a session with room: it writes its HTTP/1.1 request into
 * the io's output, which becomes an h2 request (h2msg.h), and reads the h2
 * response from the io's input as HTTP/1.1 response text (chunked with
 * trailers when it has no length), so the exchange runs on it as on a
 * socket. Flow control both ways: DATA is given back to the server's window
 * only as the exchange reads it, and the request body goes out as the
 * server's window allows. Used on its worker's thread only. */
#ifndef SLUICE_H2_CLIENT_H
#define SLUICE_H2_CLIENT_H

struct event_base;
struct conf_upstream;
struct tls_upstream;
struct io;
struct h2_client;

/* For cu (cu->h2 set); tls is the pool's context for cu->tls (NULL: h2c,
 * or a context that failed: then every stream fails). Both outlive it. */
struct h2_client *h2_client_create(struct event_base *base, const struct conf_upstream *cu,
                                   struct tls_upstream *tls);
/* Closes every session. Every stream io handed out must be freed first. */
void h2_client_destroy(struct h2_client *hc);
/* The config was replaced: close idle sessions and keep none idle from now
 * on (sessions with streams end with their last stream). */
void h2_client_drain(struct h2_client *hc);

/* A stream for one exchange, on a session to the next server (round
 * robin) with room below the server's SETTINGS_MAX_CONCURRENT_STREAMS, or
 * on a new connection when none has room (or fresh). *server gets the
 * server's index. *unprocessed becomes 1 if the server did not process the
 * request (REFUSED_STREAM, above a GOAWAY's last stream id, or never sent
 * before the connection failed), so that it may go again on another
 * stream; it must stay valid until the io is freed. The caller owns the
 * io: io_free() ends the stream (RST_STREAM CANCEL while it is open).
 * NULL when no socket could be made. */
struct io *h2_client_stream(struct h2_client *hc, int fresh, int *server, int *unprocessed);

#endif
