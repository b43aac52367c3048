/* sluice - store_sync.c: the admin API's Redis commands (store_sync in
 * store.h), asynchronous on the admin thread's own event base, over
 * persistent connections of their own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "addr.h"
#include "clock.h"
#include "list.h"
#include "log.h"
#include "mem.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

/* ---- the admin API's commands (issues 14, 18, 19) ---------------------------
 *
 * One persistent connection per Redis the admin API talks to (rconn: names
 * by evdns, TLS as redis.tls says, AUTH and SELECT as the store does), kept
 * across requests; a call's commands are pipelined on it and the caller is
 * answered from the loop when the last reply comes, or after redis.timeout
 * (at least 1 s) with "timed out", and then the connection is dropped (a
 * Redis that does not answer in time is not trusted with the next call). A
 * Redis Cluster answer MOVED sends the call's commands again, once, to the
 * named node (a connection of its own, kept too). Sentinel: the master is
 * asked of the sentinels in turn once, remembered, and asked again when its
 * connection ends or its ROLE (sent before every call's commands) is not
 * "master". At most STORE_SYNC_MAX_CALLS calls wait at once. */

#define STORE_SYNC_MIN_MS 1000
#define SYNC_MAX_CONNS 16

enum sync_peer { SYNC_NODE, SYNC_MASTER, SYNC_SENTINEL };

struct sync_conn {
    struct store_sync *ss;
    struct rconn *conn;         /* NULL once rconn freed it */
    enum sync_peer peer;
    char host[256];
    int port, is_unix;
    const char *why;            /* set before the connection is dropped */
};

struct store_sync_call {
    struct store_sync *ss;
    store_sync_cb *cb;          /* NULL: cancelled (or answered) */
    void *arg;
    struct event *timer;
    struct sync_conn *sc;       /* where its commands wait */
    char *resp;                 /* the commands, RESP, for a MOVED resend */
    size_t *off, *len;
    int ncmds, got, pending;    /* replies had, callbacks still owed by rconn */
    int redirected, sentinel;   /* sentinel: the next one to ask */
    int done;
    struct store_sync_reply *out;
    struct list_link link;      /* on the sync store's calls */
};

struct store_sync {
    struct event_base *base;
    struct evdns_base *dns;
    struct rconn_tls *tls;
    const struct conf_redis *rc;    /* the settings the connections follow */
    struct sync_conn *conns[SYNC_MAX_CONNS];
    struct list calls;          /* every call not yet freed */
    int ncalls;
    int master_known;               /* sentinel: master_host:port is it */
    char master_host[256];
    int master_port;
};

static void sync_copy(const redisReply *r, struct store_sync_reply *out)
{
    memset(out, 0, sizeof(*out));
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
        out->type = STORE_SYNC_INT;
        out->integer = r->integer;
        break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        out->type = r->type == REDIS_REPLY_ERROR ? STORE_SYNC_ERROR : STORE_SYNC_STR;
        out->len = r->len < sizeof(out->str) - 1 ? r->len : sizeof(out->str) - 1;
        memcpy(out->str, r->str, out->len);
        break;
    case REDIS_REPLY_ARRAY:
        out->type = STORE_SYNC_ARRAY;
        for (size_t i = 0; i < r->elements && i < STORE_SYNC_MAX_INTS; i++)
            out->ints[out->nints++] = r->element[i]->type == REDIS_REPLY_INTEGER
                                      ? r->element[i]->integer : 0;
        break;
    default:
        out->type = STORE_SYNC_NIL;
    }
}

/* argv as one RESP command appended to *buf (grown) at *len. */
static void sync_encode(char **buf, size_t *len, int argc, const char **argv,
                        const size_t *lens)
{
    size_t need = 16;
    for (int i = 0; i < argc; i++)
        need += lens[i] + 24;
    *buf = realloc(*buf, *len + need);
    if (*buf == NULL)
        abort();
    char *p = *buf + *len;
    p += sprintf(p, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        p += sprintf(p, "$%zu\r\n", lens[i]);
        memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r', *p++ = '\n';
    }
    *len = (size_t)(p - *buf);
}

/* ---- calls ---- */

#define CALL_OF(l) LIST_ITEM((l), struct store_sync_call, link)

static void call_free(struct store_sync_call *call)
{
    struct store_sync *ss = call->ss;
    list_unlink(&ss->calls, &call->link);
    ss->ncalls--;
    event_free(call->timer);
    free(call->resp);
    free(call->off);
    free(call->len);
    free(call->out);
    free(call);
}

/* The call is over: its caller is told (unless it cancelled). Freed once
 * rconn owes it no more callbacks (by whoever sees pending reach 0). */
static void call_finish(struct store_sync_call *call, const char *err)
{
    if (call->done)
        return;
    call->done = 1;
    evtimer_del(call->timer);
    store_sync_cb *cb = call->cb;
    call->cb = NULL;
    if (cb != NULL)
        cb(call->arg, err == NULL ? call->out : NULL, err);
}

static void call_unref(struct store_sync_call *call)
{
    if (--call->pending == 0 && call->done)
        call_free(call);
}

/* ---- connections ---- */

static void conn_forget(struct sync_conn *sc)
{
    struct store_sync *ss = sc->ss;
    for (struct store_sync_call *call = CALL_OF(ss->calls.first); call;
         call = CALL_OF(call->link.next))
        if (call->sc == sc)
            call->sc = NULL;
    for (int i = 0; i < SYNC_MAX_CONNS; i++)
        if (ss->conns[i] == sc)
            ss->conns[i] = NULL;
    if (sc->peer == SYNC_MASTER)
        ss->master_known = 0;   /* ask the sentinels again */
}

/* Every call waiting on sc fails with why; the connection is closed and
 * sc freed. rconn's NULL replies then free those calls. */
static void conn_drop(struct sync_conn *sc, const char *why)
{
    struct store_sync *ss = sc->ss;
    for (struct store_sync_call *call = CALL_OF(ss->calls.first); call;
         call = CALL_OF(call->link.next))
        if (call->sc == sc && !call->done)
            call_finish(call, why);
    conn_forget(sc);
    struct rconn *c = sc->conn;
    free(sc);
    rconn_free(c);              /* NULL replies to what waits; deferred inside a callback */
}

static void conn_connect_cb(struct rconn *c, int status, const char *why)
{
    struct sync_conn *sc = rconn_data(c);
    if (status == 0)
        return;
    log_debug("store: admin API: cannot connect to '%s:%d': %s", sc->host, sc->port,
              why ? why : "?");
    conn_forget(sc);            /* the calls had their NULL replies */
    free(sc);
}

static void conn_close_cb(struct rconn *c, const char *why)
{
    struct sync_conn *sc = rconn_data(c);
    conn_forget(sc);
    free(sc);
}

/* AUTH or SELECT refused: the connection is of no use. */
static void conn_hello_cb(struct rconn *c, redisReply *r, void *privdata)
{
    if (r == NULL || r->type != REDIS_REPLY_ERROR)
        return;
    struct sync_conn *sc = rconn_data(c);
    log_warn("store: admin API: %s '%s:%d': %.*s", (const char *)privdata, sc->host,
             sc->port, (int)r->len, r->str);
    conn_drop(sc, privdata);
}

/* The connection to peer host:port, kept or made now; NULL when
 * SYNC_MAX_CONNS are all busy. */
static struct sync_conn *conn_get(struct store_sync *ss, enum sync_peer peer, const char *host,
                                  int port, int is_unix)
{
    const struct conf_redis *rc = ss->rc;
    int slot = -1;
    for (int i = 0; i < SYNC_MAX_CONNS; i++) {
        struct sync_conn *sc = ss->conns[i];
        if (sc == NULL)
            slot = slot < 0 ? i : slot;
        else if (sc->peer == peer && sc->port == port && sc->is_unix == is_unix &&
                 strcmp(sc->host, host) == 0)
            return sc;
    }
    for (int i = 0; i < SYNC_MAX_CONNS && slot < 0; i++) {
        int busy = 0;
        for (struct store_sync_call *call = CALL_OF(ss->calls.first); call && !busy;
             call = CALL_OF(call->link.next))
            busy = call->sc == ss->conns[i];
        if (!busy) {
            conn_drop(ss->conns[i], "closed");
            slot = i;
        }
    }
    if (slot < 0 || strlen(host) >= sizeof(ss->conns[0]->host))
        return NULL;
    struct sync_conn *sc = mem_calloc(1, sizeof(*sc));
    sc->ss = ss;
    sc->peer = peer;
    snprintf(sc->host, sizeof(sc->host), "%s", host);
    sc->port = port;
    sc->is_unix = is_unix;
    sc->conn = rconn_connect(ss->base, ss->dns, ss->tls, host, port, is_unix, conn_connect_cb,
                             conn_close_cb, sc);
    if (sc->conn == NULL) {
        free(sc);
        return NULL;
    }
    ss->conns[slot] = sc;
    const char *user = peer == SYNC_SENTINEL ? NULL : rc->user;
    const char *password = peer == SYNC_SENTINEL ? rc->sentinel_password : rc->password;
    if (password != NULL) {
        const char *av[3] = { "AUTH", user ? user : password, password };
        size_t al[3] = { 4, strlen(av[1]), strlen(av[2]) };
        rconn_send_argv(sc->conn, user ? 3 : 2, av, al, conn_hello_cb,
                        (void *)"redis refused AUTH");
    }
    if (rc->db != 0 && rc->ncluster == 0 && peer != SYNC_SENTINEL) {
        char db[16];
        snprintf(db, sizeof(db), "%d", rc->db);
        const char *av[2] = { "SELECT", db };
        size_t al[2] = { 6, strlen(db) };
        rconn_send_argv(sc->conn, 2, av, al, conn_hello_cb, (void *)"redis refused SELECT");
    }
    return sc;
}

/* ---- a call's way ---- */

static int call_route(struct store_sync_call *call);

static void call_reply_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct store_sync_call *call = privdata;
    if (!call->done) {
        if (r == NULL) {
            call_finish(call, "connection closed");
        } else {
            sync_copy(r, &call->out[call->got]);
            if (++call->got == call->ncmds) {
                /* "MOVED 3999 127.0.0.1:6381": the key's slot is on that node */
                const char *moved = NULL;
                for (int i = 0; i < call->ncmds && moved == NULL; i++)
                    if (call->out[i].type == STORE_SYNC_ERROR &&
                        !strncmp(call->out[i].str, "MOVED ", 6))
                        moved = strchr(call->out[i].str + 6, ' ');
                char host[256];
                int port;
                if (moved != NULL && call->ss->rc->ncluster > 0 && !call->redirected &&
                    addr_split(moved + 1, host, sizeof(host), &port) >= 0) {
                    call->redirected = 1;
                    call->got = 0;
                    struct sync_conn *sc = conn_get(call->ss, SYNC_NODE, host, port, 0);
                    if (sc == NULL)
                        call_finish(call, "too many redis connections");
                    else
                        call->sc = sc, call_route(call);
                } else {
                    call_finish(call, NULL);
                }
            }
        }
    }
    call_unref(call);
}

static void call_role_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct store_sync_call *call = privdata;
    if (!call->done && r != NULL && !store_node_is_master(r))
        conn_drop(rconn_data(c), r->type == REDIS_REPLY_ERROR ? "redis refused ROLE"
                                 : "not a master (a failover is under way)");
    call_unref(call);
}

/* SENTINEL get-master-addr-by-name: [ip, port], or nil for a name it does
 * not monitor; else the next sentinel is asked. */
static void call_master_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct store_sync_call *call = privdata;
    struct store_sync *ss = call->ss;
    int port;
    if (call->done) {
        call_unref(call);
        return;
    }
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len > 0 &&
        r->element[0]->len < sizeof(ss->master_host) &&
        r->element[1]->type == REDIS_REPLY_STRING &&
        addr_port(r->element[1]->str, r->element[1]->len, &port) == 0) {
        memcpy(ss->master_host, r->element[0]->str, r->element[0]->len);
        ss->master_host[r->element[0]->len] = '\0';
        ss->master_port = port;
        ss->master_known = 1;
    } else {
        call->sentinel++;
    }
    if (ss->master_known || call->sentinel < ss->rc->nsentinel_nodes) {
        call->sc = NULL;
        call_route(call);
    } else {
        call_finish(call, "no sentinel named the master");
    }
    call_unref(call);
}

/* Sends the call where it goes now: a sentinel (the master not known), the
 * master, a cluster node (call->sc set by a MOVED) or the one Redis. 0, or
 * -1 with the call finished. */
static int call_route(struct store_sync_call *call)
{
    struct store_sync *ss = call->ss;
    const struct conf_redis *rc = ss->rc;
    const char *why = "too many redis connections";
    struct sync_conn *sc = call->sc;
    if (sc == NULL && rc->sentinel_master != NULL && !ss->master_known) {
        char host[256];
        int port;
        while (call->sentinel < rc->nsentinel_nodes &&
               addr_split(rc->sentinel_nodes[call->sentinel], host, sizeof(host), &port) < 0)
            call->sentinel++;
        if (call->sentinel >= rc->nsentinel_nodes) {
            why = "no sentinel named the master";
            goto fail;
        }
        sc = conn_get(ss, SYNC_SENTINEL, host, port, 0);
        if (sc == NULL)
            goto fail;
        const char *av[3] = { "SENTINEL", "get-master-addr-by-name", rc->sentinel_master };
        size_t al[3] = { 8, 23, strlen(rc->sentinel_master) };
        call->sc = sc;
        if (rconn_send_argv(sc->conn, 3, av, al, call_master_cb, call) < 0) {
            why = "connection closed";
            goto fail;
        }
        call->pending++;
        return 0;
    }
    if (sc == NULL && rc->sentinel_master != NULL) {
        sc = conn_get(ss, SYNC_MASTER, ss->master_host, ss->master_port, 0);
    } else if (sc == NULL) {
        char host[256];
        int port = rc->port;
        snprintf(host, sizeof(host), "%s", rc->host ? rc->host : "");
        if (rc->ncluster > 0 && addr_split(rc->cluster[0], host, sizeof(host), &port) < 0) {
            why = "bad cluster seed";
            goto fail;
        }
        sc = conn_get(ss, SYNC_NODE, host, port, rc->ncluster > 0 ? 0 : rc->is_unix);
    }
    if (sc == NULL)
        goto fail;
    call->sc = sc;
    why = "connection closed";
    if (sc->peer == SYNC_MASTER) {
        const char *av[1] = { "ROLE" };
        size_t al[1] = { 4 };
        if (rconn_send_argv(sc->conn, 1, av, al, call_role_cb, call) < 0)
            goto fail;
        call->pending++;
    }
    for (int i = 0; i < call->ncmds; i++) {
        if (rconn_send(sc->conn, call->resp + call->off[i], call->len[i], call_reply_cb,
                       call) < 0)
            goto fail;
        call->pending++;
    }
    return 0;
fail:
    call_finish(call, why);
    return -1;
}

static void call_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_sync_call *call = arg;
    struct sync_conn *sc = call->sc;
    call_finish(call, "timed out");
    if (sc != NULL)
        conn_drop(sc, "timed out");     /* the call is freed with its NULL replies */
    else if (call->pending == 0)
        call_free(call);
}

/* ---- the interface ---- */

struct store_sync *store_sync_create(struct event_base *base)
{
    struct store_sync *ss = mem_calloc(1, sizeof(*ss));
    ss->base = base;
    ss->dns = evdns_base_new(base, 0);
    if (ss->dns == NULL)
        abort();
    evdns_base_resolv_conf_parse(ss->dns, DNS_OPTIONS_ALL, "/etc/resolv.conf");
    return ss;
}

/* Every connection closed (no call waits on any), the TLS context gone. */
static int sync_unbind(struct store_sync *ss)
{
    int resolving = 0;
    for (int i = 0; i < SYNC_MAX_CONNS; i++)
        if (ss->conns[i] != NULL) {
            resolving |= ss->conns[i]->conn && rconn_resolving(ss->conns[i]->conn);
            conn_drop(ss->conns[i], "closed");
        }
    rconn_tls_destroy(ss->tls);
    ss->tls = NULL;
    ss->rc = NULL;
    ss->master_known = 0;
    return resolving;
}

void store_sync_destroy(struct store_sync *ss)
{
    if (ss == NULL)
        return;
    for (struct store_sync_call *call = CALL_OF(ss->calls.first); call;
         call = CALL_OF(call->link.next))
        call->cb = NULL;        /* no one to tell any more */
    for (struct store_sync_call *call = CALL_OF(ss->calls.first); call;
         call = CALL_OF(call->link.next))
        if (!call->done)
            call_finish(call, "closed");
    if (sync_unbind(ss))        /* a cancelled lookup is delivered from the loop */
        event_base_loop(ss->base, EVLOOP_NONBLOCK);
    /* calls no connection owed anything */
    for (struct store_sync_call *call = CALL_OF(ss->calls.first), *next; call; call = next) {
        next = CALL_OF(call->link.next);
        call_free(call);
    }
    evdns_base_free(ss->dns, 0);
    free(ss);
}

struct store_sync_call *store_sync_start(struct store_sync *ss, const struct conf_redis *rc,
                                         int ncmds, const struct store_sync_cmd *cmds,
                                         store_sync_cb *cb, void *arg, char *err,
                                         size_t errlen)
{
    int waiting = 0;
    for (struct store_sync_call *call = CALL_OF(ss->calls.first); call;
         call = CALL_OF(call->link.next))
        waiting += !call->done;
    if (waiting >= STORE_SYNC_MAX_CALLS) {
        snprintf(err, errlen, "%d admin requests wait for redis already (the most)",
                 STORE_SYNC_MAX_CALLS);
        return NULL;
    }
    if (rc != ss->rc) {         /* a reload changed the settings */
        if (ss->calls.first != NULL) {
            snprintf(err, errlen, "redis settings changed; requests of the old ones are in "
                     "flight: try again");
            return NULL;
        }
        sync_unbind(ss);
        if (rc->tls) {
            struct rconn_tls_conf tc = {
                rc->tls_conf.ca_file, rc->tls_conf.cert_file, rc->tls_conf.key_file,
                rc->tls_conf.server_name, rc->tls_conf.verify,
            };
            char why[200];
            ss->tls = rconn_tls_create(&tc, why, sizeof(why));
            if (ss->tls == NULL) {
                snprintf(err, errlen, "redis TLS setup failed: %s", why);
                return NULL;
            }
        }
        ss->rc = rc;
    }
    struct store_sync_call *call = mem_calloc(1, sizeof(*call));
    call->ss = ss;
    call->ncmds = ncmds;
    call->out = mem_calloc((size_t)ncmds, sizeof(*call->out));
    call->off = mem_calloc((size_t)ncmds, sizeof(*call->off));
    call->len = mem_calloc((size_t)ncmds, sizeof(*call->len));
    size_t total = 0;
    for (int i = 0; i < ncmds; i++) {
        call->off[i] = total;
        sync_encode(&call->resp, &total, cmds[i].argc, cmds[i].argv, cmds[i].lens);
        call->len[i] = total - call->off[i];
    }
    call->timer = evtimer_new(ss->base, call_timer_cb, call);
    if (call->timer == NULL)
        abort();
    list_push(&ss->calls, &call->link);
    ss->ncalls++;
    if (call_route(call) != 0) {        /* cb was still NULL: no one told */
        snprintf(err, errlen, "redis: cannot send: too many connections or closing");
        if (call->pending == 0)
            call_free(call);
        return NULL;
    }
    call->cb = cb;
    call->arg = arg;
    struct timeval tv = clock_timeval(rc->timeout_ms > STORE_SYNC_MIN_MS ? rc->timeout_ms
                                                                         : STORE_SYNC_MIN_MS);
    evtimer_add(call->timer, &tv);
    return call;
}

void store_sync_cancel(struct store_sync_call *call)
{
    if (call != NULL)
        call->cb = NULL;        /* freed when rconn owes it nothing more */
}
