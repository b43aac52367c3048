/* sluice - rconn.c: one Redis connection over a bufferevent, plain or TLS.
 *
 * Resolve (evdns, asynchronous; each address in turn), connect, TLS
 * handshake and verification (bufferevent_openssl), then RESP out and
 * replies in through hiredis' redisReader, matched to a FIFO of callbacks.
 * The only OpenSSL user on the Redis side. See rconn.h for who frees what. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "log.h"
#include "mem.h"
#include "rconn.h"
#include "tls_client.h"

#define RCONN_MAX_REPLY_BYTES (16u << 20)   /* unparsed bytes, and string bytes, of one reply */
#define RCONN_READ_BYTES 65536              /* read at most this per readiness */
/* What a reply may declare before anything is allocated for it. sluice's
 * largest are a batch's integers (2 + 64 requests x 16 limits x 5) and
 * CLUSTER SLOTS of a big cluster (a range per element, each with its
 * nodes, each node with its metadata: 4 levels); hiredis alone would
 * calloc whatever count a header names ("*2147483647") and nest 7 deep. */
#define RCONN_MAX_ARRAY 65536               /* elements one array declares */
#define RCONN_MAX_ELEMENTS 262144           /* declared by one reply, all levels */
#define RCONN_MAX_DEPTH 4                   /* arrays within arrays */

struct rconn_tls {
    SSL_CTX *ctx;
    char *server_name;
    int verify;
};

struct rconn_pending {
    rconn_reply_cb *cb;
    void *privdata;
    long long *ints;                /* rconn_send_ints: the integers go here */
    size_t cap;
};

struct rconn {
    struct event_base *base;
    struct evdns_base *dns;
    const struct rconn_tls *tls;
    char *host;
    int port, is_unix;
    rconn_connect_cb *on_connect;
    rconn_close_cb *on_close;
    void *data;
    struct evdns_getaddrinfo_request *dns_req;
    struct evutil_addrinfo *ai, *ai_cur;
    struct bufferevent *bev;
    SSL *ssl;                       /* owned by bev once it exists */
    struct evbuffer *early;         /* commands sent before the connection is up */
    redisReader *reader;
    redisReplyObjectFunctions fn;   /* the reader's: rconn_reply_* */
    redisReplyObjectFunctions dfn;  /* hiredis' own, which ours call */
    size_t reply_elems, reply_bytes;/* declared so far by the reply being read */
    long long *sink;                /* the reply being read goes to these integers */
    size_t sink_n;
    int sinking, sink_bad;          /* ... and has something else than integers */
    char refused[160];              /* why the reply being read was refused */
    struct rconn_pending *fifo;     /* ring of callbacks awaiting replies */
    size_t head, count, cap;
    rconn_reply_cb *push_cb;        /* subscribed: every reply goes here */
    void *push_priv;
    struct event *fail_ev;          /* reports a failure from the loop */
    char why[256];
    const char *alert;              /* a TLS alert the server sent, or NULL */
    int connected;
    int in_cb;                      /* depth of our callbacks on the stack */
    int freeing;                    /* rconn_free() asked from inside one */
    int dead;                       /* failed or closed: sends refused */
};

static void rconn_try_next(struct rconn *c);

/* ---- TLS context ---------------------------------------------------------- */

struct rconn_tls *rconn_tls_create(const struct rconn_tls_conf *tc, char *whybuf,
                                   size_t whylen)
{
    const struct tls_client_files f = { tc->ca_file, tc->cert_file, tc->key_file, tc->verify };
    const char *key;
    SSL_CTX *ctx = tls_client_ctx(&f, whybuf, whylen, &key);
    if (ctx == NULL)
        return NULL;
    struct rconn_tls *t = mem_calloc(1, sizeof(*t));
    t->ctx = ctx;
    t->verify = tc->verify;
    if (tc->server_name != NULL)
        t->server_name = mem_strndup(tc->server_name, strlen(tc->server_name));
    return t;
}

void rconn_tls_destroy(struct rconn_tls *t)
{
    if (t == NULL)
        return;
    if (t->ctx != NULL)
        SSL_CTX_free(t->ctx);
    free(t->server_name);
    free(t);
}

/* Keeps the alert a server sends before it closes ("certificate
 * required", "unknown ca"): the only reason a rejected client sees. */
static void rconn_ssl_info_cb(const SSL *ssl, int where, int ret)
{
    struct rconn *c = SSL_get_app_data(ssl);
    if (c != NULL && (where & SSL_CB_READ_ALERT) && (ret >> 8) == SSL3_AL_FATAL)
        c->alert = SSL_alert_desc_string_long(ret);
}

/* SNI for a name, and the name or IP address the certificate must carry. */
static SSL *rconn_ssl_new(struct rconn *c)
{
    const struct rconn_tls *t = c->tls;
    const char *name = t->server_name ? t->server_name : c->host;
    unsigned char probe[16];
    int is_ip = inet_pton(AF_INET, name, probe) == 1 || inet_pton(AF_INET6, name, probe) == 1;
    SSL *ssl = SSL_new(t->ctx);
    if (ssl == NULL)
        return NULL;
    SSL_set_app_data(ssl, c);
    SSL_set_info_callback(ssl, rconn_ssl_info_cb);
    if (!is_ip)
        SSL_set_tlsext_host_name(ssl, name);
    if (t->verify) {
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name)
                       : SSL_set1_host(ssl, name);
        if (ok != 1) {
            SSL_free(ssl);
            return NULL;
        }
    }
    return ssl;
}

/* ---- callbacks and teardown ----------------------------------------------- */

static void rconn_fifo_push(struct rconn *c, rconn_reply_cb *cb, void *privdata,
                            long long *ints, size_t cap)
{
    if (c->count == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 16;
        struct rconn_pending *nf = mem_alloc(ncap * sizeof(*nf));
        for (size_t i = 0; i < c->count; i++)
            nf[i] = c->fifo[(c->head + i) % c->cap];
        free(c->fifo);
        c->fifo = nf;
        c->head = 0;
        c->cap = ncap;
    }
    c->fifo[(c->head + c->count) % c->cap] = (struct rconn_pending){ cb, privdata, ints, cap };
    c->count++;
}

static struct rconn_pending rconn_fifo_pop(struct rconn *c)
{
    struct rconn_pending p = c->fifo[c->head];
    c->head = (c->head + 1) % c->cap;
    c->count--;
    return p;
}

/* Every callback still waiting gets its NULL reply, oldest first. */
static void rconn_fail_pending(struct rconn *c)
{
    c->dead = 1;
    c->in_cb++;
    while (c->count > 0) {
        struct rconn_pending p = rconn_fifo_pop(c);
        if (p.cb != NULL)
            p.cb(c, NULL, p.privdata);
    }
    if (c->push_cb != NULL) {
        rconn_reply_cb *cb = c->push_cb;
        c->push_cb = NULL;
        cb(c, NULL, c->push_priv);
    }
    c->in_cb--;
}

static void rconn_release(struct rconn *c)
{
    if (c->dns_req != NULL) {
        struct evdns_getaddrinfo_request *r = c->dns_req;
        c->dns_req = NULL;
        evdns_getaddrinfo_cancel(r);    /* its callback sees the cancel, and returns */
    }
    if (c->bev != NULL)
        bufferevent_free(c->bev);       /* frees the SSL too */
    else if (c->ssl != NULL)
        SSL_free(c->ssl);
    if (c->ai != NULL)
        evutil_freeaddrinfo(c->ai);
    if (c->reader != NULL)
        redisReaderFree(c->reader);
    evbuffer_free(c->early);
    if (c->fail_ev != NULL)             /* none on a detached one */
        event_free(c->fail_ev);
    free(c->fifo);
    free(c->host);
    free(c);
}

/* The connection is over: stop its events, fail what waits, tell the
 * owner (once), free. Called only from libevent callbacks. */
static void rconn_end(struct rconn *c, const char *why)
{
    if (why != c->why)
        snprintf(c->why, sizeof(c->why), "%s", why);
    if (c->bev != NULL) {
        bufferevent_free(c->bev);
        c->bev = NULL;
        c->ssl = NULL;
    }
    rconn_fail_pending(c);
    if (!c->freeing) {
        c->in_cb++;
        if (c->connected)
            c->on_close(c, c->why);
        else
            c->on_connect(c, -1, c->why);
        c->in_cb--;
    }
    rconn_release(c);
}

static void rconn_fail_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rconn *c = arg;
    rconn_end(c, c->why);
}

/* A failure found outside a libevent callback is reported from the loop. */
static void rconn_fail_later(struct rconn *c, const char *why)
{
    snprintf(c->why, sizeof(c->why), "%s", why);
    c->dead = 1;
    event_active(c->fail_ev, EV_TIMEOUT, 0);
}

void rconn_free(struct rconn *c)
{
    if (c == NULL)
        return;
    c->freeing = 1;
    if (c->in_cb > 0)
        return;                     /* the callback's caller frees it */
    rconn_fail_pending(c);
    rconn_release(c);
}

void *rconn_data(const struct rconn *c)
{
    return c->data;
}

int rconn_resolving(const struct rconn *c)
{
    return c->dns_req != NULL;
}

/* ---- reading replies ------------------------------------------------------ */

/* The reader's object functions: hiredis' own, once the counts a reply
 * declares have been checked against the bounds above (a refused reply
 * ends the connection before anything is allocated for it), except for a
 * reply to rconn_send_ints(), whose integers go straight to the caller's
 * array: nothing is allocated for it at all. */
static const char rconn_marker;         /* stands for every object of such a reply */
static char rconn_not_ints[] = "ERR not an array of integers";

static void *rconn_refuse(struct rconn *c, const char *what, long long n, long long max)
{
    snprintf(c->refused, sizeof(c->refused), "%lld %s (at most %lld)", n, what, max);
    return NULL;                        /* hiredis: an error; rconn_deliver reads ours */
}

/* The first object of a reply (its root) starts the counts afresh. */
static struct rconn *rconn_reply_of(const redisReadTask *t)
{
    struct rconn *c = t->privdata;
    if (t->parent == NULL) {
        c->reply_elems = c->reply_bytes = 0;
        c->sinking = c->sink_bad = 0;
    }
    return c;
}

static void *rconn_reply_array(const redisReadTask *t, int n)
{
    struct rconn *c = rconn_reply_of(t);
    int depth = 1;
    for (const redisReadTask *p = t->parent; p != NULL; p = p->parent)
        depth++;
    if (n > RCONN_MAX_ARRAY)
        return rconn_refuse(c, "elements in one array", n, RCONN_MAX_ARRAY);
    if (depth > RCONN_MAX_DEPTH)
        return rconn_refuse(c, "levels of nested arrays", depth, RCONN_MAX_DEPTH);
    c->reply_elems += (size_t)n;
    if (c->reply_elems > RCONN_MAX_ELEMENTS)
        return rconn_refuse(c, "elements in one reply", (long long)c->reply_elems,
                            RCONN_MAX_ELEMENTS);
    if (t->parent == NULL && c->count > 0 && c->fifo[c->head].ints != NULL &&
        (size_t)n <= c->fifo[c->head].cap) {
        c->sinking = 1;
        c->sink = c->fifo[c->head].ints;
        c->sink_n = (size_t)n;
    }
    if (c->sinking) {
        c->sink_bad |= t->parent != NULL;
        return (void *)&rconn_marker;
    }
    return c->dfn.createArray(t, n);
}

static void *rconn_reply_integer(const redisReadTask *t, long long v)
{
    struct rconn *c = rconn_reply_of(t);
    if (!c->sinking)
        return c->dfn.createInteger(t, v);
    if (t->parent->parent == NULL)      /* hiredis: idx < the array's count */
        c->sink[t->idx] = v;
    return (void *)&rconn_marker;
}

static void *rconn_reply_string(const redisReadTask *t, char *str, size_t len)
{
    struct rconn *c = rconn_reply_of(t);
    c->reply_bytes += len;
    if (c->reply_bytes > RCONN_MAX_REPLY_BYTES)
        return rconn_refuse(c, "string bytes in one reply", (long long)c->reply_bytes,
                            RCONN_MAX_REPLY_BYTES);
    if (!c->sinking)
        return c->dfn.createString(t, str, len);
    c->sink_bad = 1;
    return (void *)&rconn_marker;
}

static void *rconn_reply_nil(const redisReadTask *t)
{
    struct rconn *c = rconn_reply_of(t);
    if (!c->sinking)
        return c->dfn.createNil(t);
    c->sink_bad = 1;
    return (void *)&rconn_marker;
}

static void rconn_reply_free(void *obj)
{
    if (obj != &rconn_marker)
        freeReplyObject(obj);
}

static redisReader *rconn_reader_new(struct rconn *c)
{
    redisReader *r = redisReaderCreate();
    if (r == NULL)
        return NULL;
    c->dfn = *r->fn;
    c->fn = (redisReplyObjectFunctions){ rconn_reply_string, rconn_reply_array,
                                         rconn_reply_integer, rconn_reply_nil,
                                         rconn_reply_free };
    r->fn = &c->fn;
    r->privdata = c;
    return r;
}

/* Every whole reply the reader holds, each to its callback. NULL, or why
 * the connection must end. */
static const char *rconn_deliver(struct rconn *c)
{
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            if (c->refused[0] != '\0') {
                log_warn("rconn: reply refused '%s': %s", c->host, c->refused);
                snprintf(c->why, sizeof(c->why), "reply refused: %s", c->refused);
            } else {
                snprintf(c->why, sizeof(c->why), "protocol error: %s", c->reader->errstr);
            }
            return c->why;
        }
        if (r == NULL)
            break;
        struct rconn_pending p;
        if (c->count > 0) {
            p = rconn_fifo_pop(c);
        } else if (c->push_cb != NULL) {
            p = (struct rconn_pending){ c->push_cb, c->push_priv, NULL, 0 };
        } else {
            rconn_reply_free(r);
            return "a reply nobody asked for";
        }
        redisReply view, *reply = r;
        if (r == &rconn_marker) {       /* parsed into p.ints */
            memset(&view, 0, sizeof(view));
            view.type = c->sink_bad ? REDIS_REPLY_ERROR : REDIS_REPLY_ARRAY;
            view.elements = c->sink_bad ? 0 : c->sink_n;
            view.str = c->sink_bad ? rconn_not_ints : NULL;
            view.len = c->sink_bad ? sizeof(rconn_not_ints) - 1 : 0;
            reply = &view;
            c->sinking = 0;
        }
        c->in_cb++;
        if (p.cb != NULL)
            p.cb(c, reply, p.privdata);
        c->in_cb--;
        rconn_reply_free(r);
        if (c->freeing)
            return NULL;
    }
    /* sluice's replies are small: a server that sends more than this in one
     * reply is not one to wait for */
    if (c->reader->len - c->reader->pos > RCONN_MAX_REPLY_BYTES)
        return "a reply larger than 16 MB";
    return NULL;
}

/* Bytes from the server: into the reader, and every whole reply out. */
static const char *rconn_take(struct rconn *c, const char *data, size_t len)
{
    if (redisReaderFeed(c->reader, data, len) != REDIS_OK)
        return "protocol error";
    return rconn_deliver(c);
}

static void rconn_read_cb(struct bufferevent *bev, void *arg)
{
    struct rconn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    const char *why = NULL;
    while (why == NULL && !c->freeing && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        why = rconn_take(c, v.iov_base, v.iov_len);
        evbuffer_drain(in, v.iov_len);
    }
    if (c->freeing) {
        rconn_fail_pending(c);
        rconn_release(c);
    } else if (why != NULL) {
        rconn_end(c, why);
    }
}

/* ---- connecting ----------------------------------------------------------- */

/* Why a bufferevent failed: the certificate check, another TLS error, or
 * the socket's errno. */
static const char *rconn_bev_error(struct rconn *c, short what)
{
    unsigned long e, last = 0;
    while ((e = bufferevent_get_openssl_error(c->bev)) != 0)
        last = e;
    long vr = c->ssl != NULL ? SSL_get_verify_result(c->ssl) : X509_V_OK;
    int err = EVUTIL_SOCKET_ERROR();
    if (vr != X509_V_OK) {
        snprintf(c->why, sizeof(c->why), "TLS certificate verify failed: %s",
                 X509_verify_cert_error_string(vr));
    } else if (c->alert != NULL) {
        snprintf(c->why, sizeof(c->why), "TLS alert from the server: %s", c->alert);
    } else if (last != 0 && ERR_GET_LIB(last) == 0) {
        /* libevent passes SSL_get_error() codes through: 5 is a close
         * without a TLS shutdown, 1 a protocol failure */
        snprintf(c->why, sizeof(c->why), "TLS: %s%s%s",
                 last == SSL_ERROR_SYSCALL ? "the server closed the connection" :
                 "the TLS session failed", err != 0 ? ": " : "",
                 err != 0 ? evutil_socket_error_to_string(err) : "");
    } else if (last != 0) {
        char buf[200];
        ERR_error_string_n(last, buf, sizeof(buf));
        snprintf(c->why, sizeof(c->why), "TLS: %s", buf);
    } else if ((what & BEV_EVENT_ERROR) && err != 0) {
        snprintf(c->why, sizeof(c->why), "%s", evutil_socket_error_to_string(err));
    } else {
        snprintf(c->why, sizeof(c->why), "connection closed");
    }
    return c->why;
}

static void rconn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct rconn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = 1;
        if (!c->is_unix) {      /* a command is never held back for an ACK (Nagle) */
            int one = 1;
            setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (c->ai != NULL) {
            evutil_freeaddrinfo(c->ai);
            c->ai = c->ai_cur = NULL;
        }
        if (evbuffer_get_length(c->early) > 0)
            bufferevent_write_buffer(bev, c->early);
        c->in_cb++;
        c->on_connect(c, 0, NULL);
        c->in_cb--;
        if (c->freeing) {
            rconn_fail_pending(c);
            rconn_release(c);
        }
        return;
    }
    if (!(what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)))
        return;
    const char *why = rconn_bev_error(c, what);
    int verify_failed = c->ssl != NULL && SSL_get_verify_result(c->ssl) != X509_V_OK;
    if (!c->connected && !verify_failed && c->ai_cur != NULL && c->ai_cur->ai_next != NULL) {
        log_debug("rconn: connect failed '%s': %s, trying its next address", c->host, why);
        bufferevent_free(c->bev);
        c->bev = NULL;
        c->ssl = NULL;
        c->ai_cur = c->ai_cur->ai_next;
        rconn_try_next(c);
        return;
    }
    rconn_end(c, why);
}

/* Connect the current address (c->ai_cur; a unix socket has its own). */
static void rconn_start(struct rconn *c, const struct sockaddr *sa, int salen)
{
    const char *why = "cannot create a connection";
    if (c->tls != NULL) {
        c->ssl = rconn_ssl_new(c);
        if (c->ssl == NULL) {
            why = "cannot set up TLS for this server name";
            goto fail;
        }
        c->bev = bufferevent_openssl_socket_new(c->base, -1, c->ssl, BUFFEREVENT_SSL_CONNECTING,
                                                BEV_OPT_CLOSE_ON_FREE);
        if (c->bev == NULL) {
            SSL_free(c->ssl);
            c->ssl = NULL;
            goto fail;
        }
    } else {
        c->bev = bufferevent_socket_new(c->base, -1, BEV_OPT_CLOSE_ON_FREE);
        if (c->bev == NULL)
            goto fail;
    }
    bufferevent_setcb(c->bev, rconn_read_cb, NULL, rconn_event_cb, c);
    bufferevent_set_max_single_read(c->bev, RCONN_READ_BYTES);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)sa, salen) != 0) {
        /* an immediate failure: the next address, or the end, from the loop */
        snprintf(c->why, sizeof(c->why), "%s",
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        bufferevent_free(c->bev);
        c->bev = NULL;
        c->ssl = NULL;
        if (c->ai_cur != NULL && c->ai_cur->ai_next != NULL) {
            c->ai_cur = c->ai_cur->ai_next;
            rconn_try_next(c);
            return;
        }
        why = c->why;
        goto fail;
    }
    return;
fail:
    rconn_fail_later(c, why);
}

static void rconn_try_next(struct rconn *c)
{
    rconn_start(c, c->ai_cur->ai_addr, (int)c->ai_cur->ai_addrlen);
}

static void rconn_dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
    struct rconn *c = arg;
    if (result == EVUTIL_EAI_CANCEL)
        return;                     /* c is being freed */
    c->dns_req = NULL;
    if (result != 0) {
        char why[200];
        snprintf(why, sizeof(why), "cannot resolve: %s", evutil_gai_strerror(result));
        rconn_fail_later(c, why);
        return;
    }
    c->ai = c->ai_cur = res;
    rconn_try_next(c);
}

struct rconn *rconn_connect(struct event_base *base, struct evdns_base *dns,
                            const struct rconn_tls *tls, const char *host, int port,
                            int is_unix, rconn_connect_cb *on_connect,
                            rconn_close_cb *on_close, void *data)
{
    struct rconn *c = mem_calloc(1, sizeof(*c));
    c->base = base;
    c->dns = dns;
    c->tls = tls;
    c->host = mem_strndup(host, strlen(host));
    c->port = port;
    c->is_unix = is_unix;
    c->on_connect = on_connect;
    c->on_close = on_close;
    c->data = data;
    c->early = evbuffer_new();
    c->reader = rconn_reader_new(c);
    c->fail_ev = event_new(base, -1, 0, rconn_fail_cb, c);
    if (c->early == NULL || c->reader == NULL || c->fail_ev == NULL) {
        log_error("rconn: out of memory connecting '%s'", host);
        abort();
    }
    if (is_unix) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(host) >= sizeof(sun.sun_path)) {
            rconn_fail_later(c, "socket path too long");
            return c;
        }
        memcpy(sun.sun_path, host, strlen(host));
        rconn_start(c, (struct sockaddr *)&sun, (int)sizeof(sun));
        return c;
    }
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", port);
    struct evutil_addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    /* a numeric host or one in /etc/hosts is answered before this returns */
    c->dns_req = evdns_getaddrinfo(dns, host, ps, &hints, rconn_dns_cb, c);
    return c;
}

struct rconn *rconn_detached(void)
{
    struct rconn *c = mem_calloc(1, sizeof(*c));
    c->host = mem_strndup("detached", 8);
    c->early = evbuffer_new();
    c->reader = rconn_reader_new(c);
    if (c->early == NULL || c->reader == NULL) {
        log_error("rconn: out of memory for a detached connection");
        abort();
    }
    return c;
}

const char *rconn_feed(struct rconn *c, const char *data, size_t len)
{
    if (c->dead)
        return c->why;
    const char *why = rconn_take(c, data, len);
    if (why != NULL) {
        if (why != c->why)
            snprintf(c->why, sizeof(c->why), "%s", why);
        rconn_fail_pending(c);          /* as rconn_end, without the owner's callback */
        return c->why;
    }
    return NULL;
}

/* ---- sending -------------------------------------------------------------- */

static struct evbuffer *rconn_out(struct rconn *c)
{
    return c->connected && c->bev != NULL ? bufferevent_get_output(c->bev) : c->early;
}

/* A plain connection that is up with nothing queued writes the command
 * now: the bufferevent would write it from its write event, a loop turn
 * later and two epoll_ctl per batch (arm, then disarm, the write event).
 * What the socket does not take, or a failure, goes the bufferevent's way,
 * which writes the rest in order and reports the error as before. */
static size_t rconn_write_now(struct rconn *c, const char *cmd, size_t len)
{
    if (!c->connected || c->bev == NULL || c->tls != NULL || c->ssl != NULL ||
        evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
        return 0;
    ssize_t n = send(bufferevent_getfd(c->bev), cmd, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n > 0 ? (size_t)n : 0;
}

static int rconn_queue(struct rconn *c, const char *cmd, size_t len, rconn_reply_cb *cb,
                       void *privdata, long long *ints, size_t cap)
{
    if (c->dead || c->freeing || c->push_cb != NULL)
        return -1;
    size_t sent = rconn_write_now(c, cmd, len);
    if (sent < len && evbuffer_add(rconn_out(c), cmd + sent, len - sent) != 0)
        return -1;
    rconn_fifo_push(c, cb, privdata, ints, cap);
    return 0;
}

int rconn_send(struct rconn *c, const char *cmd, size_t len, rconn_reply_cb *cb,
               void *privdata)
{
    return rconn_queue(c, cmd, len, cb, privdata, NULL, 0);
}

int rconn_send_ints(struct rconn *c, const char *cmd, size_t len, long long *ints,
                    size_t cap, rconn_reply_cb *cb, void *privdata)
{
    return rconn_queue(c, cmd, len, cb, privdata, ints, cap);
}

int rconn_send_argv(struct rconn *c, int argc, const char **argv, const size_t *lens,
                    rconn_reply_cb *cb, void *privdata)
{
    char *cmd = NULL;
    long long len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0)
        return -1;
    int rc = rconn_send(c, cmd, (size_t)len, cb, privdata);
    free(cmd);
    return rc;
}

int rconn_subscribe(struct rconn *c, int argc, const char **argv, rconn_reply_cb *cb,
                    void *privdata)
{
    size_t lens[8];
    assert(argc <= 8);
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    if (rconn_send_argv(c, argc, argv, lens, NULL, NULL) != 0)
        return -1;
    /* no FIFO entry of its own: replies to earlier commands still come
     * first, then the confirmation and every message go to cb */
    c->count--;
    c->push_cb = cb;
    c->push_priv = privdata;
    return 0;
}
