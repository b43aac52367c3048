/* sluice - tls_client.c: the one builder of client TLS contexts
 * (tls_client.h), for upstreams and Redis.
 *
 * A file is checked before OpenSSL reads it (a plain strerror for a missing
 * one, no endless read of a FIFO), and a CA file's trust store is cached. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "mem.h"
#include "tls_client.h"

/* The reason of the newest OpenSSL error queued, for a message. */
static const char *ssl_error_text(void)
{
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0)
        last = e;
    const char *r = last ? ERR_reason_error_string(last) : NULL;
    return r ? r : "unknown OpenSSL error";
}

/* Bigger than any CA bundle (Debian's is about 200 KiB). */
#define TLS_CLIENT_FILE_MAX (16 << 20)

/* A file OpenSSL is about to read opens, and is a regular file of a sane
 * size (not a FIFO or /dev/zero it would read forever): OpenSSL's own
 * errors for a missing file are less plain than strerror. NULL, or a
 * message in buf. */
static const char *file_unreadable(const char *file, char *buf, size_t n)
{
    struct stat st;
    FILE *f = fopen(file, "r");
    if (f == NULL) {
        snprintf(buf, n, "cannot read '%s': %s", file, strerror(errno));
        return buf;
    }
    int ok = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) &&
             st.st_size <= TLS_CLIENT_FILE_MAX;
    fclose(f);
    if (!ok) {
        snprintf(buf, n, "cannot read '%s': not a regular file of at most 16 MiB", file);
        return buf;
    }
    return NULL;
}

/* ---- trust stores, shared by the contexts that name the same file */

/* Parsing a CA file takes tens of ms (the system's, 140 certificates:
 * about 70), and every worker makes its contexts at every reload, on its
 * own thread. So a store is parsed once and shared (an X509_STORE is
 * reference counted and locked), keyed by the file's path and identity: a
 * file changed since (device, inode, size or mtime) is parsed again. */
#define TLS_CLIENT_STORES 16

struct trust_store {
    char *path;                 /* NULL: the system's default paths */
    struct stat st;             /* of path, or of OpenSSL's default file */
    X509_STORE *store;          /* the cache's reference */
};

static pthread_mutex_t stores_lock = PTHREAD_MUTEX_INITIALIZER;
static struct trust_store stores[TLS_CLIENT_STORES];     /* oldest first */
static int nstores;

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static X509_STORE *store_find(const char *ca_file, const struct stat *st)
{
    X509_STORE *found = NULL;
    pthread_mutex_lock(&stores_lock);
    for (int i = 0; i < nstores && found == NULL; i++) {
        const struct trust_store *t = &stores[i];
        if ((ca_file ? t->path && !strcmp(t->path, ca_file) : t->path == NULL) &&
            same_file(&t->st, st) && X509_STORE_up_ref(t->store) == 1)
            found = t->store;
    }
    pthread_mutex_unlock(&stores_lock);
    return found;
}

static void store_keep(const char *ca_file, const struct stat *st, X509_STORE *store)
{
    if (X509_STORE_up_ref(store) != 1)
        return;
    pthread_mutex_lock(&stores_lock);
    if (nstores == TLS_CLIENT_STORES) {       /* forget the oldest */
        X509_STORE_free(stores[0].store);
        free(stores[0].path);
        memmove(stores, stores + 1, sizeof(stores[0]) * (TLS_CLIENT_STORES - 1));
        nstores--;
    }
    stores[nstores].path = ca_file ? mem_strndup(ca_file, strlen(ca_file)) : NULL;
    stores[nstores].st = *st;
    stores[nstores].store = store;
    nstores++;
    pthread_mutex_unlock(&stores_lock);
}

/* The trust store of ca_file (NULL: the system's), with a reference for
 * the caller; NULL with OpenSSL's error queued when it cannot be loaded. */
static X509_STORE *store_get(const char *ca_file)
{
    struct stat st;
    if (stat(ca_file ? ca_file : X509_get_default_cert_file(), &st) != 0)
        memset(&st, 0, sizeof(st));
    X509_STORE *store = store_find(ca_file, &st);
    if (store)
        return store;
    store = X509_STORE_new();       /* parsed outside the lock */
    if (store == NULL)
        return NULL;
    int ok = ca_file ? X509_STORE_load_file(store, ca_file) : X509_STORE_set_default_paths(store);
    if (ok != 1) {
        X509_STORE_free(store);
        return NULL;
    }
    store_keep(ca_file, &st, store);
    return store;
}

/* ctx's trust store, verification and client certificate from f. NULL, or
 * what failed (a message in buf) and *key the key it belongs to. */
static const char *ctx_setup(SSL_CTX *ctx, const struct tls_client_files *f, char *buf,
                             size_t n, const char **key)
{
    const char *key_file = f->key_file ? f->key_file : f->cert_file;
    ERR_clear_error();
    *key = "ca_file";
    if (f->ca_file && file_unreadable(f->ca_file, buf, n))
        return buf;
    X509_STORE *store = store_get(f->ca_file);
    if (store == NULL)
        goto fail;
    SSL_CTX_set_cert_store(ctx, store);     /* takes our reference */
    SSL_CTX_set_verify(ctx, f->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (f->cert_file) {
        *key = "cert_file";
        if (file_unreadable(f->cert_file, buf, n))
            return buf;
        if (SSL_CTX_use_certificate_chain_file(ctx, f->cert_file) != 1)
            goto fail;
        *key = "key_file";
        if (file_unreadable(key_file, buf, n))
            return buf;
        if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1)
            goto fail;
        if (SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(buf, n, "cannot use '%s': the key does not match the certificate '%s'",
                     key_file, f->cert_file);
            ERR_clear_error();
            return buf;
        }
    }
    *key = NULL;
    return NULL;
fail: {
        const char *file = !strcmp(*key, "ca_file") ? f->ca_file
                         : !strcmp(*key, "cert_file") ? f->cert_file : key_file;
        unsigned long e = ERR_peek_last_error();
        const char *why = ssl_error_text();
        if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH)
            snprintf(buf, n, "cannot use '%s': the key does not match the certificate '%s'",
                     key_file, f->cert_file);
        else if (file)
            snprintf(buf, n, "cannot use '%s': %s", file, why);
        else
            snprintf(buf, n, "cannot load the system trust store: %s", why);
        return buf;
    }
}


SSL_CTX *tls_client_ctx(const struct tls_client_files *f, char *buf, size_t n, const char **key)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        snprintf(buf, n, "cannot make a TLS context: %s", ssl_error_text());
        *key = NULL;
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    if (ctx_setup(ctx, f, buf, n, key) != NULL) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}
