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
 * OpenSSL is included here, in tls_upstream.c (the other side) and in
 * io.c (the connections' reads and writes). */
#ifndef SLUICE_TLS_SERVER_H
#define SLUICE_TLS_SERVER_H

#include "metrics.h"

#define TLS_SERVER_TICKET_ROTATE_MS (3600 * 1000)

struct ssl_st;
struct conf_tls;
struct tls_server;

/* The contexts for ct. NULL on failure, with *bad the index of the
 * certificate entry at fault and *err a malloc'd reason (caller frees). */
struct tls_server *tls_server_create(const struct conf_tls *ct, int *bad, char **err);
/* Any thread. NULL is a no-op for release. */
void tls_server_retain(struct tls_server *ts);
void tls_server_release(struct tls_server *ts);

/* A server SSL for one accepted connection, with the default certificate
 * (SNI may switch it); the caller owns it (io.h frees it). NULL when
 * OpenSSL could not make one. */
struct ssl_st *tls_server_ssl(struct tls_server *ts);
/* "TLSv1.3", "TLSv1.2" (a static string) for an established connection. */
const char *tls_server_version(struct ssl_st *ssl);
/* 1 when the handshake chose ALPN "h2". */
int tls_server_h2(struct ssl_st *ssl);
/* Why a handshake failed, from the first OpenSSL error code it left (0:
 * none, the peer closed or the socket failed). */
enum metrics_tls_failure tls_server_failure(unsigned long first);

#endif
