/* sluice - tls_client.h: the one builder of client TLS contexts.
 *
 * Upstreams (tls_upstream.c) and Redis (rconn.c) connect out over TLS with
 * a context made here: TLS 1.2 or newer, no renegotiation or compression,
 * the trust store of a CA file or the system's (parsed once per file and
 * shared by every context naming it), verification on or off, and a client
 * certificate for mutual TLS. Each caller adds what is its own (ALPN and
 * session resumption for upstreams). */
#ifndef SLUICE_TLS_CLIENT_H
#define SLUICE_TLS_CLIENT_H

#include <stddef.h>

struct ssl_ctx_st;

struct tls_client_files {
    const char *ca_file;        /* NULL: the system trust store */
    const char *cert_file;      /* client certificate (chain), or NULL */
    const char *key_file;       /* its key; NULL: in cert_file */
    int verify;                 /* 0: no verification at all */
};

/* A new context (the caller frees it with SSL_CTX_free), or NULL with a
 * message in buf[n] naming the file at fault ("cannot read 'F': ...",
 * "cannot use 'F': ...") and *key the field it came from ("ca_file",
 * "cert_file" or "key_file"; NULL when OpenSSL's failure names no file). */
struct ssl_ctx_st *tls_client_ctx(const struct tls_client_files *f, char *buf, size_t n,
                                  const char **key);

#endif
