/* sluice - store_sub.c: the reset subscriber (store_sub_create in store.h).
 *
 * One SUBSCRIBE connection of its own, apart from the store's decision
 * connections; with redis.sentinel a second one asks the sentinels for the
 * master and follows +switch-master. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "mem.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

/* ---- the reset subscriber (issue 14): one SUBSCRIBE connection --------------
 *
 * Kept apart from the decision connections: an rconn on the caller's
 * base, subscribed to one channel, reconnecting every STORE_SUB_RETRY_MS.
 * cb runs for each message and once each time the subscription is
 * (re)made: messages sent while it was down are lost, so the caller treats
 * a new subscription as one. A cluster broadcasts PUBLISH to every node, so
 * any node will do: the first seed, the next one when it is lost, and the
 * node a MOVED names when the snapshot's hash lives there. Sentinel: a second connection, to the sentinels
 * in turn, asks for the master (as the store does) and stays subscribed to
 * +switch-master; the subscriber connects to the master it names and moves
 * when it switches. When the master's connection is lost, a sentinel is
 * asked again. */

#define STORE_SUB_RETRY_MS 200

struct store_sub {
    struct event_base *base;
    struct conf_redis rc;           /* strings owned */
    char *host;
    int port;
    char *channel;
    char *hash;                     /* HGETALL before SUBSCRIBE, or NULL */
    store_sub_snap_cb *snap;
    store_sub_cb *cb;
    void *arg;
    struct evdns_base *dns;
    struct rconn_tls *tls;          /* NULL: plain */
    struct rconn *conn;
    struct event *retry_ev;
    int stopping;
    /* redis.sentinel: host is NULL until a sentinel names the master */
    struct store_addr *sentinels;
    int nsentinels, cand;
    char *master_name, *sentinel_password;
    struct rconn *sconn;            /* to sentinels[cand] */
    struct event *sretry_ev;
    /* redis.cluster: the seeds, tried in turn when the node is lost */
    struct store_addr *seeds;
    int nseeds, seed;
};

static void sub_connect(struct store_sub *ss);
static void sub_ask_again(struct store_sub *ss);
static void sub_move(struct store_sub *ss, const char *host, int port);

static void sub_retry_later(struct store_sub *ss)
{
    struct timeval tv = clock_timeval(STORE_SUB_RETRY_MS);
    if (!ss->stopping)
        event_add(ss->retry_ev, &tv);
}

static void sub_message_cb(struct rconn *c, redisReply *reply, void *privdata)
{
    struct store_sub *ss = privdata;
    if (reply == NULL || ss->stopping || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements < 3 || reply->element[0]->type != REDIS_REPLY_STRING)
        return;
    /* "subscribe" (made, or made again) and "message" both tell */
    const redisReply *m = reply->element[2];
    if (reply->element[0]->len == 7 && !memcmp(reply->element[0]->str, "message", 7) &&
        m->type == REDIS_REPLY_STRING)
        ss->cb(ss->arg, m->str, m->len);
    else
        ss->cb(ss->arg, NULL, 0);
}

/* HGETALL's reply, before the subscription's. */
static void sub_snap_cb(struct rconn *c, redisReply *reply, void *privdata)
{
    struct store_sub *ss = privdata;
    if (reply == NULL || ss->stopping)
        return;
    char host[256];
    int port;
    if (reply->type == REDIS_REPLY_ERROR && reply->len > 6 && !memcmp(reply->str, "MOVED ", 6) &&
        ss->nseeds > 0) {
        /* a cluster node that does not hold the hash: the one that does
         * takes the subscription too ("MOVED slot host:port") */
        const char *at = strchr(reply->str + 6, ' ');
        if (at && addr_split(at + 1, host, sizeof(host), &port) > 0) {
            log_info("store: subscriber: '%s' is on %s:%d; subscribing there", ss->hash, host,
                     port);
            sub_move(ss, host, port);
            return;
        }
    }
    if (reply->type != REDIS_REPLY_ARRAY) {
        log_warn("store: subscriber: HGETALL '%s' failed: %s", ss->hash,
                 reply->type == REDIS_REPLY_ERROR ? reply->str : "not an array");
        return;
    }
    const char **s = mem_calloc(reply->elements + 1, sizeof(*s));
    size_t *lens = mem_calloc(reply->elements + 1, sizeof(*lens));
    int n = 0;
    for (size_t i = 0; i < reply->elements; i++) {
        if (reply->element[i]->type != REDIS_REPLY_STRING)
            continue;
        s[n] = reply->element[i]->str;
        lens[n++] = reply->element[i]->len;
    }
    ss->snap(ss->arg, n, s, lens);
    free(s);
    free(lens);
}

static void sub_connect_cb(struct rconn *c, int status, const char *why)
{
    struct store_sub *ss = rconn_data(c);
    if (status != 0) {
        ss->conn = NULL;        /* rconn frees it */
        if (ss->sentinels != NULL)
            sub_ask_again(ss);
        else
            sub_retry_later(ss);
    }
}

/* Sentinel: the master's connection failed or ended; it may have moved
 * while we were not told: ask a sentinel again (it connects to the master
 * it names). */
static void sub_ask_again(struct store_sub *ss)
{
    if (ss->sconn != NULL) {
        struct rconn *sc = ss->sconn;
        ss->sconn = NULL;
        rconn_free(sc);         /* its callbacks are not called */
    }
    struct timeval tv = clock_timeval(STORE_SUB_RETRY_MS);
    if (!ss->stopping && !evtimer_pending(ss->sretry_ev, NULL))
        event_add(ss->sretry_ev, &tv);
}

static void sub_close_cb(struct rconn *c, const char *why)
{
    struct store_sub *ss = rconn_data(c);
    log_warn("store: reset subscriber lost '%s:%d': %s; retrying", ss->host, ss->port,
             why && why[0] ? why : "connection closed");
    ss->conn = NULL;
    if (ss->nseeds > 0) {               /* the next seed (a MOVED, if any, comes again) */
        ss->seed = (ss->seed + 1) % ss->nseeds;
        free(ss->host);
        ss->host = store_strdup(ss->seeds[ss->seed].host);
        ss->port = ss->seeds[ss->seed].port;
    }
    if (ss->sentinels != NULL)
        sub_ask_again(ss);
    else
        sub_retry_later(ss);
}

/* Subscribe at host:port from now on (the connection there, if any, goes). */
static void sub_move(struct store_sub *ss, const char *host, int port)
{
    free(ss->host);
    ss->host = store_strdup(host);
    ss->port = port;
    if (ss->conn != NULL) {
        struct rconn *c = ss->conn;
        ss->conn = NULL;
        rconn_free(c);          /* its callbacks are not called */
    }
    event_del(ss->retry_ev);
    sub_connect(ss);
}

/* The master a sentinel named: subscribe there (again, if it moved). */
static void sub_set_master(struct store_sub *ss, const char *host, int port)
{
    if (ss->conn != NULL && ss->port == port && strcmp(ss->host, host) == 0)
        return;
    log_info("store: reset subscriber: sentinel master '%s' is %s:%d", ss->master_name,
             host, port);
    sub_move(ss, host, port);
}

static void sub_sentinel_next(struct store_sub *ss)
{
    ss->cand = (ss->cand + 1) % ss->nsentinels;
    sub_ask_again(ss);
}

static void sub_master_cb(struct rconn *c, redisReply *reply, void *privdata)
{
    struct store_sub *ss = privdata;
    if (reply == NULL || ss->stopping)
        return;
    int port;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING && reply->element[0]->len > 0 &&
        reply->element[1]->type == REDIS_REPLY_STRING &&
        addr_port(reply->element[1]->str, reply->element[1]->len, &port) == 0) {
        sub_set_master(ss, reply->element[0]->str, port);
        return;
    }
    log_warn("store: reset subscriber: sentinel '%s:%d' does not name master '%s': %s",
             ss->sentinels[ss->cand].host, ss->sentinels[ss->cand].port, ss->master_name,
             reply->type == REDIS_REPLY_ERROR ? reply->str : "no such master");
    sub_sentinel_next(ss);      /* frees c: deferred until this returns */
}

/* "+switch-master" carries "NAME OLDIP OLDPORT NEWIP NEWPORT". */
static void sub_switch_cb(struct rconn *c, redisReply *reply, void *privdata)
{
    struct store_sub *ss = privdata;
    char ip[64];
    int port;
    if (ss->stopping || store_switch_master(reply, ss->master_name, ip, sizeof(ip), &port) < 0)
        return;                 /* the subscribe confirmation, or not our master */
    sub_set_master(ss, ip, port);
}

static void sub_sconnect_cb(struct rconn *c, int status, const char *why)
{
    struct store_sub *ss = rconn_data(c);
    if (status != 0) {
        log_debug("store: reset subscriber: sentinel '%s:%d': %s",
                  ss->sentinels[ss->cand].host, ss->sentinels[ss->cand].port,
                  why ? why : "cannot connect");
        ss->sconn = NULL;       /* rconn frees it */
        sub_sentinel_next(ss);
    }
}

static void sub_sclose_cb(struct rconn *c, const char *why)
{
    struct store_sub *ss = rconn_data(c);
    ss->sconn = NULL;
    sub_sentinel_next(ss);
}

/* AUTH (the sentinels' password), the master's address, then
 * +switch-master for as long as the connection lasts. */
static void sub_sentinel_connect(struct store_sub *ss)
{
    if (ss->stopping || ss->sconn != NULL || (ss->rc.tls && ss->tls == NULL))
        return;
    const struct store_addr *a = &ss->sentinels[ss->cand];
    struct rconn *c = rconn_connect(ss->base, ss->dns, ss->tls, a->host, a->port, 0,
                                    sub_sconnect_cb, sub_sclose_cb, ss);
    ss->sconn = c;
    if (ss->sentinel_password != NULL) {
        const char *av[2] = { "AUTH", ss->sentinel_password };
        size_t al[2] = { 4, strlen(av[1]) };
        rconn_send_argv(c, 2, av, al, NULL, NULL);
    }
    const char *q[3] = { "SENTINEL", "get-master-addr-by-name", ss->master_name };
    size_t ql[3] = { 8, 23, strlen(ss->master_name) };
    rconn_send_argv(c, 3, q, ql, sub_master_cb, ss);
    const char *sv[2] = { "SUBSCRIBE", "+switch-master" };
    rconn_subscribe(c, 2, sv, sub_switch_cb, ss);
}

static void sub_sretry_cb(evutil_socket_t fd, short what, void *arg)
{
    sub_sentinel_connect(arg);
}

static void sub_connect(struct store_sub *ss)
{
    if (ss->rc.tls && ss->tls == NULL)
        return;                 /* a TLS context that did not load: logged at create */
    struct rconn *c = rconn_connect(ss->base, ss->dns, ss->tls, ss->host, ss->port,
                                    ss->rc.is_unix, sub_connect_cb, sub_close_cb, ss);
    if (c == NULL) {
        sub_retry_later(ss);
        return;
    }
    ss->conn = c;
    if (ss->rc.password != NULL) {
        const char *av[3] = { "AUTH", ss->rc.user ? ss->rc.user : ss->rc.password,
                              ss->rc.password };
        size_t al[3] = { 4, strlen(av[1]), strlen(av[2]) };
        rconn_send_argv(c, ss->rc.user ? 3 : 2, av, al, NULL, NULL);
    }
    if (ss->hash != NULL) {
        const char *hv[2] = { "HGETALL", ss->hash };
        size_t hl[2] = { 7, strlen(ss->hash) };
        rconn_send_argv(c, 2, hv, hl, sub_snap_cb, ss);
    }
    const char *sv[2] = { "SUBSCRIBE", ss->channel };
    rconn_subscribe(c, 2, sv, sub_message_cb, ss);
}

static void sub_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_sub *ss = arg;
    if (ss->host != NULL)
        sub_connect(ss);
}

struct store_sub *store_sub_create(struct event_base *base, const struct conf_redis *rc,
                                   const char *channel, const char *hash, store_sub_cb *cb,
                                   store_sub_snap_cb *snap, void *arg)
{
    char host[256];
    int port = rc->port;
    snprintf(host, sizeof(host), "%s", rc->host ? rc->host : "");
    if (rc->ncluster > 0 && addr_split(rc->cluster[0], host, sizeof(host), &port) < 0)
        return NULL;
    struct store_sub *ss = mem_calloc(1, sizeof(*ss));
    ss->base = base;
    ss->rc.is_unix = rc->ncluster > 0 ? 0 : rc->is_unix;
    ss->rc.user = rc->user ? store_strdup(rc->user) : NULL;
    ss->rc.password = rc->password ? store_strdup(rc->password) : NULL;
    ss->rc.tls = rc->tls;
    if (rc->sentinel_master != NULL) {
        ss->rc.is_unix = 0;
        ss->master_name = store_strdup(rc->sentinel_master);
        ss->sentinel_password = rc->sentinel_password ? store_strdup(rc->sentinel_password)
                                                      : NULL;
        ss->sentinels = mem_calloc((size_t)rc->nsentinel_nodes + 1, sizeof(*ss->sentinels));
        for (int i = 0; i < rc->nsentinel_nodes; i++) {
            int sp;
            if (addr_split(rc->sentinel_nodes[i], host, sizeof(host), &sp) > 0) {
                ss->sentinels[ss->nsentinels].host = store_strdup(host);
                ss->sentinels[ss->nsentinels++].port = sp;
            }
        }
    } else {
        ss->host = store_strdup(host);
        ss->port = port;
    }
    if (rc->ncluster > 0) {
        ss->seeds = mem_calloc((size_t)rc->ncluster, sizeof(*ss->seeds));
        for (int i = 0; i < rc->ncluster; i++) {
            int sp;
            if (addr_split(rc->cluster[i], host, sizeof(host), &sp) > 0) {
                ss->seeds[ss->nseeds].host = store_strdup(host);
                ss->seeds[ss->nseeds++].port = sp;
            }
        }
    }
    ss->channel = store_strdup(channel);
    ss->hash = hash ? store_strdup(hash) : NULL;
    ss->snap = snap;
    ss->cb = cb;
    ss->arg = arg;
    ss->dns = evdns_base_new(base, 0);
    if (ss->dns == NULL)
        abort();
    if (evdns_base_resolv_conf_parse(ss->dns, DNS_OPTIONS_ALL, "/etc/resolv.conf") != 0)
        log_warn("store: cannot read '/etc/resolv.conf': names resolve from /etc/hosts "
                 "and 127.0.0.1");
    if (rc->tls) {
        char why[300];
        struct rconn_tls_conf tc = {
            rc->tls_conf.ca_file, rc->tls_conf.cert_file, rc->tls_conf.key_file,
            rc->tls_conf.server_name, rc->tls_conf.verify,
        };
        ss->tls = rconn_tls_create(&tc, why, sizeof(why));
        if (ss->tls == NULL)
            log_error("store: reset subscriber: TLS setup failed: %s", why);
    }
    ss->retry_ev = evtimer_new(base, sub_retry_cb, ss);
    ss->sretry_ev = evtimer_new(base, sub_sretry_cb, ss);
    if (ss->retry_ev == NULL || ss->sretry_ev == NULL)
        abort();
    if (ss->sentinels == NULL)
        sub_connect(ss);
    else if (ss->nsentinels > 0)
        sub_sentinel_connect(ss);
    else
        log_error("store: reset subscriber: no usable sentinel address");
    return ss;
}

void store_sub_destroy(struct store_sub *ss)
{
    if (ss == NULL)
        return;
    ss->stopping = 1;
    event_free(ss->retry_ev);
    event_free(ss->sretry_ev);
    int resolving = 0;
    if (ss->conn != NULL) {
        resolving = rconn_resolving(ss->conn);
        rconn_free(ss->conn);   /* its callbacks are not called */
    }
    if (ss->sconn != NULL) {
        resolving |= rconn_resolving(ss->sconn);
        rconn_free(ss->sconn);
    }
    for (int i = 0; i < ss->nsentinels; i++)
        free(ss->sentinels[i].host);
    free(ss->sentinels);
    for (int i = 0; i < ss->nseeds; i++)
        free(ss->seeds[i].host);
    free(ss->seeds);
    free(ss->master_name);
    free(ss->sentinel_password);
    /* a cancelled lookup is delivered later and reads the resolver: then
     * it is left (a few hundred bytes, once per reload at most) */
    if (!resolving)
        evdns_base_free(ss->dns, 0);
    rconn_tls_destroy(ss->tls);
    free(ss->rc.user);
    free(ss->rc.password);
    free(ss->host);
    free(ss->channel);
    free(ss->hash);
    free(ss);
}

