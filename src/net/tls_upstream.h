/* sluice - tls_upstream.h: TLS to the servers of one upstream.
 *
 * One client context per upstream per worker, made with the runtime's pools
 * (a reload makes new ones; requests in flight keep theirs): the trust store
 * (ca_file, or the system's), verification on or off, the client certificate
 * for mutual TLS, and per server the name sent as SNI and verified and the
 * last session, so new connections resume. The OpenSSL side only:
 * upstream.c gives the SSL objects made here to its ios (io.h). A context is
 * used on its worker's thread only. */
#ifndef SLUICE_TLS_UPSTREAM_H
#define SLUICE_TLS_UPSTREAM_H

#include <stddef.h>

struct ssl_st;
struct conf_upstream;
struct conf_tls_client;
struct tls_upstream;

/* Why a handshake failed (the reason label of
 * sluice_upstream_tls_failures_total). */
enum tls_upstream_reason {
    TLS_UPSTREAM_NONE,          /* not TLS's doing: the TCP connect failed */
    TLS_UPSTREAM_VERIFY,        /* the certificate (chain or name) was refused */
    TLS_UPSTREAM_HANDSHAKE,     /* a protocol error or an alert from the server */
    TLS_UPSTREAM_CLOSED,        /* the server closed during the handshake */
    TLS_UPSTREAM_TIMEOUT,       /* not done within upstreams.connect_timeout */
    TLS_UPSTREAM_ERROR,         /* after the handshake: an alert, a bad record */
    TLS_UPSTREAM_NREASONS
};

/* For confcheck.c: can t's files be used (readable, PEM, the key matching the
 * certificate)? NULL when they can; otherwise a message in buf[n] and *key
 * the key at fault ("ca_file", "cert_file" or "key_file"). */
const char *tls_upstream_check(const struct conf_tls_client *t, char *buf, size_t n,
                               const char **key);

/* The context for cu (cu->tls set), or NULL with a message in err[n]. cu
 * must outlive it (the pool's config does). */
struct tls_upstream *tls_upstream_create(const struct conf_upstream *cu, char *err, size_t n);
/* After every SSL made from it is freed (they point at its sessions). */
void tls_upstream_destroy(struct tls_upstream *tu);

/* A client SSL for cu->servers[server]: SNI (never for an IP address, as
 * RFC 6066 says), the name or IP address to verify, the last session of
 * that server. The caller owns it (io_free frees it). NULL when
 * OpenSSL could not make one. */
struct ssl_st *tls_upstream_ssl(struct tls_upstream *tu, int server);

/* Why the handshake on ssl failed, from its verify result and the error
 * codes collected for it (errs[0..nerrs), as io_ssl_error gives them): a
 * line in buf[n]. */
enum tls_upstream_reason tls_upstream_why(struct ssl_st *ssl, const unsigned long *errs,
                                          int nerrs, char *buf, size_t n);
const char *tls_upstream_reason_name(enum tls_upstream_reason r);

#endif
