/* sluice - store_sync.c: the admin API's blocking Redis commands (store_sync
 * in store.h), on short connections of their own and a private event base,
 * on the admin thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

/* ---- the admin API's commands (issue 14): blocking, on the admin thread ------
 *
 * One short connection per admin request, over rconn (names by evdns, TLS
 * as redis.tls says): connect, AUTH and SELECT as the store does, the
 * commands pipelined, close, all within redis.timeout (at least 1 s). A Redis Cluster answer MOVED sends them all again,
 * once, to the named node. Sentinel: a round on the sentinels first (in
 * turn, until one names the master), then the commands on that master,
 * after a ROLE that must say "master" (not the old one mid-failover). The
 * admin thread is the only caller; a slow Redis delays the admin endpoint,
 * never the proxy. */

#define STORE_SYNC_MIN_MS 1000

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

/* One round of admin commands on a connection of its own (rconn: the same
 * names, TLS and handshake as the store's), run to its end on a private
 * event base: the admin thread waits for it. */
/* Whom a round talks to: a data node, the sentinel master (ROLE checked
 * first), or a sentinel (its own password, no SELECT; the one command's
 * answer is the master's address). */
enum sync_peer { SYNC_NODE, SYNC_MASTER, SYNC_SENTINEL };

struct sync_round {
    struct event_base *base;
    struct rconn *conn;         /* NULL once rconn freed it */
    struct store_sync_reply *out;
    int ncmds, got;
    const char *why;            /* set: the round failed */
    char whybuf[200];
    char master_host[256];      /* SYNC_SENTINEL: what the sentinel named */
    int master_port;
};

static void sync_fail(struct sync_round *sr, const char *why)
{
    if (sr->why == NULL) {
        snprintf(sr->whybuf, sizeof(sr->whybuf), "%s", why);
        sr->why = sr->whybuf;
    }
    event_base_loopbreak(sr->base);
}

static void sync_connect_cb(struct rconn *c, int status, const char *why)
{
    struct sync_round *sr = rconn_data(c);
    if (status != 0) {
        sr->conn = NULL;        /* freed when this returns */
        sync_fail(sr, why ? why : "cannot connect");
    }
}

static void sync_close_cb(struct rconn *c, const char *why)
{
    struct sync_round *sr = rconn_data(c);
    sr->conn = NULL;
    sync_fail(sr, why ? why : "connection closed");
}

static void sync_hello_cb(struct rconn *c, redisReply *r, void *privdata)
{
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        sync_fail(rconn_data(c), privdata);     /* "redis refused AUTH"... */
}

static void sync_role_cb(struct rconn *c, redisReply *r, void *privdata)
{
    if (r != NULL && !store_node_is_master(r))
        sync_fail(rconn_data(c), r->type == REDIS_REPLY_ERROR ? "redis refused ROLE"
                                 : "not a master (a failover is under way)");
}

/* SENTINEL get-master-addr-by-name: [ip, port], or nil for a name it does
 * not monitor. */
static void sync_master_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct sync_round *sr = rconn_data(c);
    int port;
    if (r == NULL) {
        sync_fail(sr, "no reply");
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len == 0 ||
        r->element[0]->len >= sizeof(sr->master_host) ||
        r->element[1]->type != REDIS_REPLY_STRING ||
        addr_port(r->element[1]->str, r->element[1]->len, &port) < 0) {
        sync_fail(sr, r->type == REDIS_REPLY_ERROR ? r->str
                      : "the sentinel does not know the master");
        return;
    }
    memcpy(sr->master_host, r->element[0]->str, r->element[0]->len);
    sr->master_host[r->element[0]->len] = '\0';
    sr->master_port = port;
    if (++sr->got == sr->ncmds)
        event_base_loopbreak(sr->base);
}

static void sync_reply_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct sync_round *sr = rconn_data(c);
    if (r == NULL) {
        sync_fail(sr, "no reply");
        return;
    }
    sync_copy(r, &sr->out[sr->got]);
    if (++sr->got == sr->ncmds)
        event_base_loopbreak(sr->base);
}

static int sync_round(const struct conf_redis *rc, enum sync_peer peer, const char *host,
                      int port, int is_unix, int ncmds, const struct store_sync_cmd *cmds,
                      struct store_sync_reply *out, struct sync_round *done_sr,
                      char *err, size_t errlen)
{
    struct sync_round sr = { .out = out, .ncmds = ncmds };
    const char *user = peer == SYNC_SENTINEL ? NULL : rc->user;
    const char *password = peer == SYNC_SENTINEL ? rc->sentinel_password : rc->password;
    struct evdns_base *dns = NULL;
    struct rconn_tls *tls = NULL;
    char db[16];
    sr.base = event_base_new();
    if (sr.base == NULL || (dns = evdns_base_new(sr.base, 0)) == NULL) {
        snprintf(err, errlen, "no memory");
        goto done;
    }
    evdns_base_resolv_conf_parse(dns, DNS_OPTIONS_ALL, "/etc/resolv.conf");
    if (rc->tls) {
        struct rconn_tls_conf tc = {
            rc->tls_conf.ca_file, rc->tls_conf.cert_file, rc->tls_conf.key_file,
            rc->tls_conf.server_name, rc->tls_conf.verify,
        };
        tls = rconn_tls_create(&tc, sr.whybuf, sizeof(sr.whybuf));
        if (tls == NULL) {
            snprintf(err, errlen, "redis TLS setup failed: %s", sr.whybuf);
            goto done;
        }
    }
    sr.conn = rconn_connect(sr.base, dns, tls, host, port, is_unix, sync_connect_cb,
                            sync_close_cb, &sr);
    if (sr.conn == NULL) {
        snprintf(err, errlen, "cannot connect to redis");
        goto done;
    }
    if (password != NULL) {
        const char *av[3] = { "AUTH", user ? user : password, password };
        size_t al[3] = { 4, strlen(av[1]), strlen(av[2]) };
        rconn_send_argv(sr.conn, user ? 3 : 2, av, al, sync_hello_cb,
                        (void *)"redis refused AUTH");
    }
    if (rc->db != 0 && rc->ncluster == 0 && peer != SYNC_SENTINEL) {
        snprintf(db, sizeof(db), "%d", rc->db);
        const char *av[2] = { "SELECT", db };
        size_t al[2] = { 6, strlen(db) };
        rconn_send_argv(sr.conn, 2, av, al, sync_hello_cb, (void *)"redis refused SELECT");
    }
    if (peer == SYNC_MASTER) {
        const char *av[1] = { "ROLE" };
        size_t al[1] = { 4 };
        rconn_send_argv(sr.conn, 1, av, al, sync_role_cb, NULL);
    }
    for (int i = 0; i < ncmds; i++)
        rconn_send_argv(sr.conn, cmds[i].argc, cmds[i].argv, cmds[i].lens,
                        peer == SYNC_SENTINEL ? sync_master_cb : sync_reply_cb, NULL);
    struct timeval tv = clock_timeval(rc->timeout_ms > STORE_SYNC_MIN_MS ? rc->timeout_ms
                                                                         : STORE_SYNC_MIN_MS);
    event_base_loopexit(sr.base, &tv);
    event_base_dispatch(sr.base);
    if (sr.why == NULL && sr.got < ncmds)
        sync_fail(&sr, "timed out");
    if (sr.why != NULL)
        snprintf(err, errlen, "redis: %s", sr.why);
done:
    if (sr.conn != NULL) {
        rconn_free(sr.conn);    /* its callbacks are not called */
        sr.conn = NULL;
    }
    if (sr.base != NULL)        /* a cancelled lookup is delivered from the loop */
        event_base_loop(sr.base, EVLOOP_NONBLOCK);
    if (dns != NULL)
        evdns_base_free(dns, 0);
    rconn_tls_destroy(tls);
    if (sr.base != NULL)
        event_base_free(sr.base);
    if (done_sr != NULL) {      /* SYNC_SENTINEL: the master it named */
        memcpy(done_sr->master_host, sr.master_host, sizeof(sr.master_host));
        done_sr->master_port = sr.master_port;
    }
    return sr.why == NULL && sr.got == ncmds ? 0 : -1;
}

/* Sentinel: the master's address, from the first sentinel (in the
 * configured order) that names it. */
static int sync_find_master(const struct conf_redis *rc, char *host, size_t hostlen,
                            int *port, char *err, size_t errlen)
{
    const char *av[3] = { "SENTINEL", "get-master-addr-by-name", rc->sentinel_master };
    size_t al[3] = { 8, 23, strlen(rc->sentinel_master) };
    struct store_sync_cmd cmd = { 3, av, al };
    snprintf(err, errlen, "no sentinel");
    for (int i = 0; i < rc->nsentinel_nodes; i++) {
        char sh[256];
        int sp;
        struct sync_round sr;
        if (addr_split(rc->sentinel_nodes[i], sh, sizeof(sh), &sp) < 0)
            continue;
        if (sync_round(rc, SYNC_SENTINEL, sh, sp, 0, 1, &cmd, NULL, &sr, err, errlen) == 0) {
            snprintf(host, hostlen, "%s", sr.master_host);
            *port = sr.master_port;
            return 0;
        }
        log_debug("store: admin API: sentinel '%s' did not name the master: %s",
                  rc->sentinel_nodes[i], err);
    }
    return -1;
}

int store_sync(const struct conf_redis *rc, int ncmds, const struct store_sync_cmd *cmds,
               struct store_sync_reply *out, char *err, size_t errlen)
{
    char host[256];
    int port = rc->port, rv = -1;
    if (rc->sentinel_master != NULL) {
        if (sync_find_master(rc, host, sizeof(host), &port, err, errlen) != 0)
            return -1;
        return sync_round(rc, SYNC_MASTER, host, port, 0, ncmds, cmds, out, NULL, err, errlen);
    }
    snprintf(host, sizeof(host), "%s", rc->host ? rc->host : "");
    if (rc->ncluster > 0 && addr_split(rc->cluster[0], host, sizeof(host), &port) < 0) {
        snprintf(err, errlen, "bad cluster seed");
        return -1;
    }
    int is_unix = rc->ncluster > 0 ? 0 : rc->is_unix;
    for (int attempt = 0; attempt < 2; attempt++) {
        rv = sync_round(rc, SYNC_NODE, host, port, is_unix, ncmds, cmds, out, NULL, err,
                        errlen);
        if (rv != 0)
            return rv;
        /* "MOVED 3999 127.0.0.1:6381": the key's slot is on that node */
        int moved = -1;
        for (int i = 0; i < ncmds && moved < 0; i++)
            if (out[i].type == STORE_SYNC_ERROR && !strncmp(out[i].str, "MOVED ", 6))
                moved = i;
        if (moved < 0 || rc->ncluster == 0)
            return 0;
        const char *sp = strchr(out[moved].str + 6, ' ');
        if (sp == NULL || addr_split(sp + 1, host, sizeof(host), &port) < 0)
            return 0;
    }
    return rv;
}
