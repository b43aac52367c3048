/* sluice - client.h: the downstream connections of a worker.
 *
 * A client is created for each accepted socket (client_accept) and kept in
 * the env's client set until the connection ends; it frees itself then
 * (conn.h: never from inside its own callbacks). client.c owns accept, the
 * timers' outcomes (header, body, discard, idle), pipelining and the client
 * set; the state is struct client (conn.h), the request in progress is
 * request.c's, its upstream exchange exchange.c's. */
#ifndef SLUICE_CLIENT_H
#define SLUICE_CLIENT_H

#include <sys/socket.h>

struct conn_env;
struct tls_server;

/* tls: the listener's contexts (NULL: plain HTTP); the handshake must be
 * done within client.header_timeout. decision: a decision listener's
 * connection (conf.h: struct conf_listen), whose requests are decided and
 * answered, never forwarded (request.c). http2: the connection may speak
 * HTTP/2 (ALPN h2, or the preface on a plain one); each stream is then a
 * client of its own over an io stream, not counted in max_connections. */
void client_accept(struct conn_env *env, int fd, const struct sockaddr *peer, int peerlen,
                   struct tls_server *tls, int decision, int http2);
/* Shutting down: close idle connections now, the others after the response
 * in progress; the worker's loop exits when none is left. */
void client_drain(struct conn_env *env);
void client_close_all(struct conn_env *env);

#endif
