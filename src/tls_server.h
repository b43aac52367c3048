/* sluice - tls_server.h: TLS for the clients of a listener (OpenSSL 3).
 *
 * A tls_server is what one `listen:` entry with `tls:` turns into: one
 * SSL_CTX per certificate, all with the same settings, the first the
 * default; a handshake's SNI picks the certificate among its names (SAN DNS
 * names, wildcards as "*.example.com"). confcheck_load() builds them (so `-t`
 * and a SIGHUP check every key against its certificate) and the conf owns them;
 * a connection's SSL holds its own reference to its SSL_CTX, so a reload
 * that frees the old conf leaves open connections their certificates.
 * Session tickets are encrypted with process-wide keys rotated every
 * TLS_SERVER_TICKET_ROTATE_MS, the previous one still accepted.
 * Only this file (and tls_upstream.c, for the other side) includes OpenSSL. */
#ifndef SLUICE_TLS_SERVER_H
#define SLUICE_TLS_SERVER_H

#include "metrics.h"

#define TLS_SERVER_TICKET_ROTATE_MS (3600 * 1000)

struct bufferevent;
struct event_base;
struct conf_tls;
struct tls_server;

/* The contexts for ct. NULL on failure, with *bad the index of the
 * certificate entry at fault and *err a malloc'd reason (caller frees). */
struct tls_server *tls_server_create(const struct conf_tls *ct, int *bad, char **err);
/* Any thread. NULL is a no-op for release. */
void tls_server_retain(struct tls_server *ts);
void tls_server_release(struct tls_server *ts);

/* A bufferevent accepting a TLS handshake on fd (owned, closed on free).
 * Its event callback gets BEV_EVENT_CONNECTED once the handshake is done.
 * NULL on failure (fd is closed). */
struct bufferevent *tls_server_bufferevent(struct tls_server *ts, struct event_base *base,
                                           int fd);
/* Write bev's queued output now (conn_flush, once per outermost callback);
 * what cannot go at once is left to the bufferevent. */
void tls_server_flush(struct bufferevent *bev);
/* "TLSv1.3", "TLSv1.2" (a static string) for an established connection. */
const char *tls_server_version(struct bufferevent *bev);
/* Why the handshake on bev ended with event flags `what`. */
enum metrics_tls_failure tls_server_failure(struct bufferevent *bev, short what);

#endif
