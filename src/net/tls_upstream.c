/* sluice - tls_upstream.c: client TLS contexts for upstreams (tls_upstream.h).
 *
 * The context is tls_client.c's (TLS 1.2 and 1.3, trust store, client
 * certificate) plus ALPN (http/1.1, or h2 for protocol h2) and resumption. Sessions: the context's
 * cache is in client mode without its internal store; the new-session
 * callback keeps the newest few sessions of each server (TLS 1.3 tickets
 * come after the handshake, two after a full one, one after a resumption),
 * and a new connection to that server offers the newest. A TLS 1.3 ticket
 * is offered once (RFC 8446 C.4; servers may refuse a second use), a TLS
 * 1.2 session as long as it is kept. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "addr.h"
#include "conf.h"
#include "mem.h"
#include "tls_client.h"
#include "tls_upstream.h"

/* Sessions kept per server: a TLS 1.3 ticket serves one connection, so
 * new connections at once beyond this many make full handshakes (with 8,
 * 32 connections at once made 40% of them full; with 64, 1%). */
#define TLS_UPSTREAM_SESSIONS 64

struct tls_upstream_server {
    char *name;                 /* SNI and verified name, or an IP address */
    int is_ip;                  /* name is an address: no SNI, IP SAN check */
    SSL_SESSION *sess[TLS_UPSTREAM_SESSIONS];   /* oldest first; owned */
    int nsess;
};

struct tls_upstream {
    SSL_CTX *ctx;
    const struct conf_upstream *cu;
    struct tls_upstream_server *servers;    /* one per cu->servers[i] */
};

static int session_new_cb(SSL *ssl, SSL_SESSION *sess)
{
    struct tls_upstream_server *s = SSL_get_app_data(ssl);
    if (s == NULL)
        return 0;
    if (s->nsess == TLS_UPSTREAM_SESSIONS) {    /* drop the oldest */
        SSL_SESSION_free(s->sess[0]);
        memmove(s->sess, s->sess + 1, sizeof(s->sess[0]) * (TLS_UPSTREAM_SESSIONS - 1));
        s->nsess--;
    }
    s->sess[s->nsess++] = sess;
    return 1;                   /* we keep the reference */
}

static SSL_CTX *ctx_new(const struct conf_tls_client *t, int h2, char *buf, size_t n,
                        const char **key)
{
    static const unsigned char alpn[] = "\x08http/1.1", alpn_h2[] = "\x02h2";
    const struct tls_client_files f = { t->ca_file, t->cert_file, t->key_file, t->verify };
    SSL_CTX *ctx = tls_client_ctx(&f, buf, n, key);
    if (ctx == NULL)
        return NULL;
    /* A close without close_notify reads as an end of stream, as over
     * plain TCP: framing (Content-Length, chunked) still catches a cut. */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (h2)
        SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof(alpn_h2) - 1);
    else
        SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, session_new_cb);
    return ctx;
}

const char *tls_upstream_check(const struct conf_tls_client *t, char *buf, size_t n,
                               const char **key)
{
    SSL_CTX *ctx = ctx_new(t, 0, buf, n, key);
    if (ctx == NULL)
        return buf;
    SSL_CTX_free(ctx);
    return NULL;
}

static int is_ip(const char *s)
{
    unsigned char b[16];
    return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

struct tls_upstream *tls_upstream_create(const struct conf_upstream *cu, char *err, size_t n)
{
    const char *key;
    SSL_CTX *ctx = ctx_new(cu->tls, cu->h2, err, n, &key);
    if (ctx == NULL)
        return NULL;
    struct tls_upstream *tu = mem_calloc(1, sizeof(*tu));
    tu->ctx = ctx;
    tu->cu = cu;
    tu->servers = mem_calloc((size_t)cu->nservers, sizeof(*tu->servers));
    for (int i = 0; i < cu->nservers; i++) {
        struct tls_upstream_server *s = &tu->servers[i];
        char host[ADDR_IP_MAX + 256];
        int port;
        const char *name = cu->tls->server_name;
        if (name == NULL && addr_split(cu->servers[i].text, host, sizeof(host), &port) > 0)
            name = host;
        if (name == NULL) {     /* never without a name to verify */
            snprintf(err, n, "no host name in '%s'", cu->servers[i].text);
            tls_upstream_destroy(tu);
            return NULL;
        }
        size_t len = strlen(name);
        if (len > 1 && name[len - 1] == '.')
            len--;              /* SNI has no trailing dot (RFC 6066) */
        s->name = mem_strndup(name, len);
        s->is_ip = is_ip(s->name);
    }
    return tu;
}

void tls_upstream_destroy(struct tls_upstream *tu)
{
    if (tu == NULL)
        return;
    for (int i = 0; i < tu->cu->nservers; i++) {
        for (int j = 0; j < tu->servers[i].nsess; j++)
            SSL_SESSION_free(tu->servers[i].sess[j]);
        free(tu->servers[i].name);
    }
    free(tu->servers);
    SSL_CTX_free(tu->ctx);
    free(tu);
}

/* Give ssl the newest session of s that can resume; a TLS 1.3 one leaves
 * the list (used once), a TLS 1.2 one stays. */
static void offer_session(struct tls_upstream_server *s, SSL *ssl)
{
    while (s->nsess > 0) {
        SSL_SESSION *sess = s->sess[s->nsess - 1];
        int ok = SSL_SESSION_is_resumable(sess);
        if (ok && SSL_SESSION_get_protocol_version(sess) != TLS1_3_VERSION) {
            SSL_set_session(ssl, sess);
            return;
        }
        s->nsess--;
        if (ok)
            SSL_set_session(ssl, sess);     /* takes its own reference */
        SSL_SESSION_free(sess);
        if (ok)
            return;
    }
}

struct ssl_st *tls_upstream_ssl(struct tls_upstream *tu, int server)
{
    struct tls_upstream_server *s = &tu->servers[server];
    SSL *ssl = SSL_new(tu->ctx);
    if (ssl == NULL)
        goto fail;
    SSL_set_app_data(ssl, s);
    if (s->is_ip) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), s->name) != 1)
            goto fail;
    } else {
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (SSL_set_tlsext_host_name(ssl, s->name) != 1 || SSL_set1_host(ssl, s->name) != 1)
            goto fail;
    }
    offer_session(s, ssl);
    return ssl;
fail:
    ERR_clear_error();
    SSL_free(ssl);
    return NULL;
}

enum tls_upstream_reason tls_upstream_why(struct ssl_st *ssl, const unsigned long *errs,
                                          int nerrs, char *buf, size_t n)
{
    long v = SSL_get_verify_result(ssl);
    if ((SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER) && v != X509_V_OK) {
        snprintf(buf, n, "certificate verify failed: %s", X509_verify_cert_error_string(v));
        return TLS_UPSTREAM_VERIFY;
    }
    BIO *w = SSL_get_wbio(ssl);
    if (w == NULL || BIO_number_written(w) == 0)
        return TLS_UPSTREAM_NONE;   /* no ClientHello went out: TCP failed */
    /* The newest real OpenSSL code says why (library 0 would be an
     * SSL_get_error code, never queued by io.c). */
    unsigned long e = 0;
    for (int i = 0; i < nerrs; i++)
        if (ERR_GET_LIB(errs[i]) != 0)
            e = errs[i];
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (e == 0 || ERR_SYSTEM_ERROR(e) || ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        snprintf(buf, n, "connection closed during the handshake%s%s",
                 e && r ? ": " : "", e && r ? r : "");
        return TLS_UPSTREAM_CLOSED;
    }
    snprintf(buf, n, "%s", r ? r : "TLS protocol error");
    return TLS_UPSTREAM_HANDSHAKE;
}

const char *tls_upstream_reason_name(enum tls_upstream_reason r)
{
    static const char *const names[TLS_UPSTREAM_NREASONS] = {
        "none", "verify", "handshake", "closed", "timeout", "error",
    };
    return r >= 0 && r < TLS_UPSTREAM_NREASONS ? names[r] : "none";
}
