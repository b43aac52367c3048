/* sluice - rconn.h: one Redis connection that sluice owns.
 *
 * A libevent bufferevent (plain, or TLS through bufferevent_openssl), names
 * resolved by evdns (never getaddrinfo on the loop; /etc/hosts honoured),
 * hiredis' redisReader used only to parse replies, and a FIFO of callbacks:
 * replies come back in the order commands were sent. The store (store.c)
 * does the handshake, timeouts and backoff on top of it.
 *
 * Ownership, as hiredis' async contexts had it so store.c reads the same:
 *   on_connect(c, -1, why): the attempt failed; c is freed when it returns.
 *   on_close(c, why): an established connection ended; every pending
 *   callback has had its NULL reply; c is freed when on_close returns.
 *   rconn_free(c): pending callbacks get NULL replies, the event callbacks
 *   are not called. From inside one of c's callbacks it is deferred until
 *   that callback returns.
 *   A reply is freed by rconn after its callback returns.
 * A reply that declares more than rconn.c's bounds (elements of one array,
 * of the whole reply, nesting, string bytes) ends the connection, logged,
 * before anything is allocated for it: on_close, as for any failure. */
#ifndef SLUICE_RCONN_H
#define SLUICE_RCONN_H

#include <stddef.h>
#include <hiredis/read.h>
#include <hiredis/hiredis.h>

struct event_base;
struct evdns_base;
struct rconn;
struct rconn_tls;

/* reply is NULL when the connection went away before it came. */
typedef void rconn_reply_cb(struct rconn *c, redisReply *reply, void *privdata);
/* status 0: connected (and TLS verified); -1: failed, why says how. */
typedef void rconn_connect_cb(struct rconn *c, int status, const char *why);
typedef void rconn_close_cb(struct rconn *c, const char *why);

struct rconn_tls_conf {
    const char *ca_file;        /* NULL: the system trust store */
    const char *cert_file;      /* client certificate (chain), or NULL */
    const char *key_file;       /* its key; NULL: in cert_file */
    const char *server_name;    /* checked name; NULL: the host connected to */
    int verify;                 /* 0: no verification at all */
};

/* A TLS client context for every connection of one store (tls_client.h's).
 * NULL with the reason in whybuf when a file does not load. */
struct rconn_tls *rconn_tls_create(const struct rconn_tls_conf *tc, char *whybuf,
                                   size_t whylen);
void rconn_tls_destroy(struct rconn_tls *t);

/* Starts connecting to host:port (or the socket path host when is_unix)
 * over tls when not NULL; never blocks and never calls back from inside
 * this call. dns and tls must outlive c. */
struct rconn *rconn_connect(struct event_base *base, struct evdns_base *dns,
                            const struct rconn_tls *tls, const char *host, int port,
                            int is_unix, rconn_connect_cb *on_connect,
                            rconn_close_cb *on_close, void *data);
void *rconn_data(const struct rconn *c);
void rconn_free(struct rconn *c);

/* A connection that never connects, for the reply fuzzer: sends queue as
 * usual, and rconn_feed() gives it bytes as if read from the server (whole
 * replies go to their callbacks, through the same reader and bounds).
 * NULL, or why a real connection would end: this one is then dead (what
 * waits had its NULL reply; sends are refused). rconn_free() frees it, and
 * must not be called from one of its callbacks. */
struct rconn *rconn_detached(void);
const char *rconn_feed(struct rconn *c, const char *data, size_t len);

/* 1 while a name lookup is in flight. Freeing c then cancels it, and evdns
 * delivers the cancel from the loop later: dns must outlive that. */
int rconn_resolving(const struct rconn *c);

/* Queue one command (RESP bytes, copied; or argv) with its callback. Before
 * the connection is up the bytes wait for it. -1 when c is closing. */
int rconn_send(struct rconn *c, const char *cmd, size_t len, rconn_reply_cb *cb,
               void *privdata);
int rconn_send_argv(struct rconn *c, int argc, const char **argv, const size_t *lens,
                    rconn_reply_cb *cb, void *privdata);

/* rconn_send for a command answered by an array of at most cap integers
 * (limit.lua's batch reply): they are written to ints[] as they are parsed,
 * nothing is allocated for them, and cb gets a reply of type
 * REDIS_REPLY_ARRAY with `elements` set and `element` NULL. Such an array
 * holding anything but integers comes as the error "ERR not an array of
 * integers"; any other reply (an error, a longer array) as hiredis builds
 * it. ints must stay valid until cb has run (or c is freed). */
int rconn_send_ints(struct rconn *c, const char *cmd, size_t len, long long *ints,
                    size_t cap, rconn_reply_cb *cb, void *privdata);

/* SUBSCRIBE: every reply from then on goes to cb (the confirmation, then
 * each message). No command may follow it on c. */
int rconn_subscribe(struct rconn *c, int argc, const char **argv, rconn_reply_cb *cb,
                    void *privdata);

#endif
