/* sluice - tls_server.c: TLS for the clients of a listener (tls_server.h).
 *
 * The settings are fixed, chosen so that a scanner finds nothing to report:
 * TLS 1.2 and 1.3 only, forward-secret AEAD suites only (for 1.2: ECDHE
 * with ECDSA or RSA, AES-GCM or ChaCha20-Poly1305), the server's order,
 * no renegotiation, no compression, ALPN h2 then http/1.1 (http/1.1 only
 * on a listener with http2: false), stateless session
 * tickets under process-wide keys rotated every hour, no session cache. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "clock.h"
#include "conf.h"
#include "mem.h"
#include "tls_server.h"

#define TLS_CIPHERS_12 "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:" \
                       "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:" \
                       "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define TLS_SUITES_13  "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define TLS_GROUPS     "X25519:P-256:P-384"
#define TLS_SESSION_TIMEOUT_S 3600      /* a ticket's lifetime: one rotation */
#define TLS_MAX_NAMES  256              /* names kept per certificate */

struct tls_cert {
    SSL_CTX *ctx;
    char **names;               /* lower case; "*.example.com" for wildcards */
    int nnames;
};

struct tls_server {
    int refs;                   /* atomic */
    struct tls_cert *certs;     /* certs[0]: the default */
    int ncerts;
};

/* ---- session ticket keys ----------------------------------------------- */

/* The keys every context encrypts tickets with: the current one, and the
 * one before it, accepted (and its tickets renewed) for one more period.
 * Rotated when a handshake finds the current one older than the period,
 * which has the effect of a timer without one per worker. */
struct ticket_key {
    unsigned char name[16], aes[32], hmac[32];
};

static struct {
    pthread_mutex_t lock;
    int have_cur, have_prev;
    struct ticket_key cur, prev;
    int64_t cur_since_ms;
    int64_t prev_until_ms;
} tickets = { .lock = PTHREAD_MUTEX_INITIALIZER };

static int ticket_key_new(struct ticket_key *k)
{
    return RAND_bytes((unsigned char *)k, (int)sizeof(*k)) == 1 ? 0 : -1;
}

/* Under tickets.lock: rotate when due. */
static int tickets_rotate(int64_t now)
{
    if (tickets.have_cur && now - tickets.cur_since_ms < TLS_SERVER_TICKET_ROTATE_MS)
        return 0;
    struct ticket_key k;
    if (ticket_key_new(&k) < 0)
        return -1;
    tickets.have_prev = tickets.have_cur;
    tickets.prev = tickets.cur;
    tickets.prev_until_ms = now + TLS_SERVER_TICKET_ROTATE_MS;
    tickets.cur = k;
    tickets.have_cur = 1;
    tickets.cur_since_ms = now;
    OPENSSL_cleanse(&k, sizeof(k));
    return 0;
}

/* A copy of the key to encrypt with (name NULL), or of the key named name:
 * returns 1 for the current key, 2 for the previous one, 0 for none, -1 on
 * an error. */
static int tickets_get(const unsigned char *name, struct ticket_key *out)
{
    int64_t now = clock_ms();
    int rc = 0;
    pthread_mutex_lock(&tickets.lock);
    if (tickets_rotate(now) < 0) {
        rc = -1;
    } else if (name == NULL || memcmp(name, tickets.cur.name, 16) == 0) {
        *out = tickets.cur;
        rc = 1;
    } else if (tickets.have_prev && now < tickets.prev_until_ms &&
               memcmp(name, tickets.prev.name, 16) == 0) {
        *out = tickets.prev;
        rc = 2;
    }
    pthread_mutex_unlock(&tickets.lock);
    return rc;
}

/* OpenSSL's ticket callback: 1 encrypted or decrypted, 2 decrypted with the
 * previous key (OpenSSL sends a new ticket), 0 unknown key (full handshake),
 * -1 error. */
static int ticket_cb(SSL *s, unsigned char *name, unsigned char *iv, EVP_CIPHER_CTX *cctx,
                     EVP_MAC_CTX *hctx, int enc)
{
    struct ticket_key k;
    int which, ok;
    if (enc) {
        if (RAND_bytes(iv, 16) != 1 || tickets_get(NULL, &k) != 1)
            return -1;
        memcpy(name, k.name, 16);
        which = 1;
        ok = EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv);
    } else {
        which = tickets_get(name, &k);
        if (which <= 0)
            return which;
        ok = EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, k.aes, iv);
    }
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.hmac, sizeof(k.hmac)),
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    ok = ok && EVP_MAC_CTX_set_params(hctx, params);
    OPENSSL_cleanse(&k, sizeof(k));
    return ok ? which : -1;
}

/* ---- SNI and ALPN ------------------------------------------------------- */

/* 1 when host (lower case) is name, or under a wildcard name by one label. */
static int name_matches(const char *name, const char *host)
{
    if (name[0] == '*' && name[1] == '.') {
        const char *dot = strchr(host, '.');
        return dot && dot != host && strcmp(dot, name + 1) == 0;
    }
    return strcmp(name, host) == 0;
}

/* The certificate for host: an exact name first, then a wildcard; the
 * default when none matches. */
static int cert_for(const struct tls_server *ts, const char *host)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < ts->ncerts; i++)
            for (int j = 0; j < ts->certs[i].nnames; j++) {
                const char *n = ts->certs[i].names[j];
                if ((n[0] == '*') == pass && name_matches(n, host))
                    return i;
            }
    return 0;
}

static int servername_cb(SSL *ssl, int *alert, void *arg)
{
    const struct tls_server *ts = arg;
    const char *sni = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    char host[256];
    size_t n;
    if (sni == NULL || ts->ncerts < 2 || (n = strlen(sni)) >= sizeof(host))
        return SSL_TLSEXT_ERR_OK;       /* the default certificate */
    for (size_t i = 0; i <= n; i++)
        host[i] = (sni[i] >= 'A' && sni[i] <= 'Z') ? (char)(sni[i] + 32) : sni[i];
    int i = cert_for(ts, host);
    if (i > 0 && SSL_set_SSL_CTX(ssl, ts->certs[i].ctx) == NULL)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    return SSL_TLSEXT_ERR_OK;
}

/* h2 first, then http/1.1 (arg non-NULL: the listener's http2: false, only
 * http/1.1). A client offering neither gets no ALPN. */
static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    static const unsigned char both[] = "\x02h2\x08http/1.1";
    const unsigned char *ours = arg ? both + 3 : both;
    unsigned ourlen = arg ? sizeof(both) - 4 : sizeof(both) - 1;
    unsigned char *sel;
    if (SSL_select_next_proto(&sel, outlen, ours, ourlen, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

/* ---- contexts ----------------------------------------------------------- */

/* The reason of the last OpenSSL error, for messages. */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

static void add_name(struct tls_cert *tc, const unsigned char *s, int len)
{
    if (len <= 0 || len > 253 || tc->nnames >= TLS_MAX_NAMES || memchr(s, '\0', (size_t)len))
        return;
    char *n = mem_strndup((const char *)s, (size_t)len);
    for (char *p = n; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p + 32);
    char **names = realloc(tc->names, (size_t)(tc->nnames + 1) * sizeof(*tc->names));
    if (names == NULL)
        abort();
    tc->names = names;
    tc->names[tc->nnames++] = n;
}

/* The names SNI matches: the SAN DNS names, or the common name when the
 * certificate has none. */
static void cert_names(struct tls_cert *tc, X509 *x)
{
    GENERAL_NAMES *gens = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, i);
        if (g->type == GEN_DNS)
            add_name(tc, ASN1_STRING_get0_data(g->d.dNSName), ASN1_STRING_length(g->d.dNSName));
    }
    GENERAL_NAMES_free(gens);
    if (tc->nnames > 0)
        return;
    X509_NAME *subj = X509_get_subject_name(x);
    int at = X509_NAME_get_index_by_NID(subj, NID_commonName, -1);
    if (at >= 0) {
        ASN1_STRING *cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, at));
        add_name(tc, ASN1_STRING_get0_data(cn), ASN1_STRING_length(cn));
    }
}

static int file_readable(const char *what, const char *path, char **err)
{
    FILE *f = fopen(path, "r");
    if (f) {
        fclose(f);
        return 0;
    }
    if (asprintf(err, "cannot read %s '%s': %s", what, path, strerror(errno)) < 0)
        abort();
    return -1;
}

static SSL_CTX *ctx_new(const struct conf_tls *ct, struct tls_server *ts)
{
    static const unsigned char sid_ctx[] = "sluice";
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        return NULL;
    if (!SSL_CTX_set_min_proto_version(ctx, ct->min_version == 13 ? TLS1_3_VERSION : TLS1_2_VERSION) ||
        !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_cipher_list(ctx, TLS_CIPHERS_12) ||
        !SSL_CTX_set_ciphersuites(ctx, TLS_SUITES_13) ||
        !SSL_CTX_set1_groups_list(ctx, TLS_GROUPS) ||
        !SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof(sid_ctx) - 1) ||
        !SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_cb)) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                             SSL_OP_NO_RENEGOTIATION |
                             SSL_OP_PRIORITIZE_CHACHA);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_timeout(ctx, TLS_SESSION_TIMEOUT_S);
    SSL_CTX_set_num_tickets(ctx, 1);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, ct->no_h2 ? (void *)1 : NULL);
    SSL_CTX_set_tlsext_servername_callback(ctx, servername_cb);
    SSL_CTX_set_tlsext_servername_arg(ctx, ts);
    return ctx;
}

/* Certificate entry cc into tc. */
static int cert_load(struct tls_server *ts, struct tls_cert *tc, const struct conf_tls *ct,
                     const struct conf_cert *cc, char **err)
{
    const char *why = NULL;
    if (file_readable("cert_file", cc->cert_file, err) < 0 ||
        file_readable("key_file", cc->key_file, err) < 0)
        return -1;
    ERR_clear_error();
    tc->ctx = ctx_new(ct, ts);
    if (tc->ctx == NULL) {
        why = "cannot set up a TLS context";
        goto fail;
    }
    if (SSL_CTX_use_certificate_chain_file(tc->ctx, cc->cert_file) != 1) {
        if (asprintf(err, "cannot load cert_file '%s': %s", cc->cert_file, ssl_reason()) < 0)
            abort();
        return -1;
    }
    if (SSL_CTX_use_PrivateKey_file(tc->ctx, cc->key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(tc->ctx) != 1) {
        if (asprintf(err, "key_file '%s' does not match cert_file '%s' (%s)", cc->key_file,
                     cc->cert_file, ssl_reason()) < 0)
            abort();
        return -1;
    }
    cert_names(tc, SSL_CTX_get0_certificate(tc->ctx));
    ERR_clear_error();
    return 0;
fail:
    if (asprintf(err, "%s: %s", why, ssl_reason()) < 0)
        abort();
    return -1;
}

struct tls_server *tls_server_create(const struct conf_tls *ct, int *bad, char **err)
{
    struct tls_server *ts = mem_calloc(1, sizeof(*ts));
    ts->refs = 1;
    ts->certs = mem_calloc((size_t)ct->ncerts, sizeof(*ts->certs));
    ts->ncerts = ct->ncerts;
    *err = NULL;
    for (int i = 0; i < ct->ncerts; i++) {
        if (cert_load(ts, &ts->certs[i], ct, &ct->certs[i], err) < 0) {
            *bad = i;
            ERR_clear_error();
            tls_server_release(ts);
            return NULL;
        }
    }
    return ts;
}

void tls_server_retain(struct tls_server *ts)
{
    __atomic_fetch_add(&ts->refs, 1, __ATOMIC_RELAXED);
}

void tls_server_release(struct tls_server *ts)
{
    if (ts == NULL || __atomic_sub_fetch(&ts->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (int i = 0; i < ts->ncerts; i++) {
        SSL_CTX_free(ts->certs[i].ctx);     /* connections hold their own references */
        for (int j = 0; j < ts->certs[i].nnames; j++)
            free(ts->certs[i].names[j]);
        free(ts->certs[i].names);
    }
    free(ts->certs);
    free(ts);
}

/* ---- connections -------------------------------------------------------- */

struct ssl_st *tls_server_ssl(struct tls_server *ts)
{
    SSL *ssl = SSL_new(ts->certs[0].ctx);
    if (ssl == NULL)
        ERR_clear_error();
    return ssl;
}

const char *tls_server_version(struct ssl_st *ssl)
{
    return ssl ? SSL_get_version(ssl) : "";
}

enum metrics_tls_failure tls_server_failure(unsigned long first)
{
    if (first == 0)
        return METRICS_TLS_CLOSED;     /* EOF or a socket error, no TLS error */
    if (ERR_GET_LIB(first) != ERR_LIB_SSL)
        return METRICS_TLS_OTHER;
    switch (ERR_GET_REASON(first)) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_RECORD_LENGTH_MISMATCH:
        return METRICS_TLS_NOT_TLS;
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_VERSION_TOO_LOW:
    case SSL_R_NO_PROTOCOLS_AVAILABLE:
        return METRICS_TLS_VERSION;
    case SSL_R_NO_SHARED_CIPHER:
    case SSL_R_NO_SHARED_GROUPS:
    case SSL_R_NO_SUITABLE_KEY_SHARE:
        return METRICS_TLS_CIPHER;
    default:
        return METRICS_TLS_OTHER;
    }
}

int tls_server_h2(struct ssl_st *ssl)
{
    const unsigned char *p = NULL;
    unsigned n = 0;
    SSL_get0_alpn_selected(ssl, &p, &n);
    return n == 2 && memcmp(p, "h2", 2) == 0;
}
