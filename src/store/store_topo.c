/* sluice - store_topo.c: which node owns a slot, or is the master.
 *
 * Redis Cluster: the slot map, asked for with CLUSTER SLOTS on the control
 * connection (at most every STORE_REFRESH_MIN_MS, and every
 * STORE_REFRESH_EVERY_MS), the nodes a MOVED or ASK names. Sentinel: the
 * master a sentinel names, followed on +switch-master. And what the store
 * does when a node comes up or is lost. Single Redis is one node owning
 * every slot; the calls (store.c) ask s->owner and s->nodes only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "mem.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

/* ---- cluster: the slot map ------------------------------------------------ */

int store_topo_node_index(struct store *s, const char *host, int port)
{
    for (int i = 0; i < s->nnodes; i++)
        if (s->nodes[i]->port == port && strcmp(s->nodes[i]->host, host) == 0)
            return i;
    if (s->nnodes == STORE_MAX_NODES)
        return -1;
    if (s->nnodes == s->capnodes) {
        s->capnodes = s->capnodes ? 2 * s->capnodes : 8;
        struct store_node **nn = mem_alloc(sizeof(*nn) * (size_t)s->capnodes);
        if (s->nnodes > 0)
            memcpy(nn, s->nodes, sizeof(*nn) * (size_t)s->nnodes);
        free(s->nodes);
        s->nodes = nn;
    }
    s->nodes[s->nnodes] = store_node_new(s, NODE_DATA, host, port, 0);
    return s->nnodes++;
}

/* CLUSTER SLOTS: [[start, end, [host, port, id], replicas...], ...]. */
static int store_parse_slots(struct store *s, const redisReply *reply, int16_t *owner)
{
    if (reply->type != REDIS_REPLY_ARRAY)
        return -1;
    for (int i = 0; i < STORE_SLOTS; i++)
        owner[i] = -1;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *e = reply->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return -1;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const char *host = e->element[2]->element[0]->str;
        long long port = e->element[2]->element[1]->integer;
        if (lo < 0 || hi >= STORE_SLOTS || lo > hi || port < 1 || port > 65535)
            return -1;
        if (host[0] == '\0')            /* "unknown": the node we asked */
            host = s->ctl->host;
        int idx = store_topo_node_index(s, host, (int)port);
        if (idx < 0)
            return -1;
        for (long long k = lo; k <= hi; k++)
            owner[k] = (int16_t)idx;
    }
    return 0;
}

static void store_apply_map(struct store *s, const int16_t *owner)
{
    int known = 0;
    for (int i = 0; i < s->nnodes; i++)
        s->nodes[i]->in_map = 0;
    for (int k = 0; k < STORE_SLOTS; k++) {
        s->owner[k] = owner[k];
        if (owner[k] >= 0) {
            s->nodes[owner[k]]->in_map = 1;
            known++;
        }
    }
    s->map_known = known > 0;
    s->map_complete = known == STORE_SLOTS;
    for (int i = 0; i < s->nnodes; i++) {
        struct store_node *n = s->nodes[i];
        if (n->in_map && !n->active)
            store_node_start(n);
        else if (!n->in_map && n->active)
            store_node_stop(n);
    }
    store_node_update_ready(s);
}

static void store_slots_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    struct store *s = n->s;
    if (s->destroying)
        return;
    store_node_got_reply(n);
    n->slots_inflight = 0;
    if (reply == NULL)
        return;
    int16_t *owner = mem_alloc(sizeof(int16_t) * STORE_SLOTS);
    if (reply->type == REDIS_REPLY_ERROR)
        log_error("store: CLUSTER SLOTS failed '%s': %s", n->name, reply->str);
    else if (store_parse_slots(s, reply, owner) != 0)
        log_error("store: CLUSTER SLOTS from '%s': unexpected reply", n->name);
    else
        store_apply_map(s, owner);
    free(owner);
    if (s->refresh_wanted)
        store_topo_refresh_soon(s);
}

void store_topo_refresh_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    struct store_node *n = s->ctl;
    if (!n->ready || n->ac == NULL || n->slots_inflight)
        return;                 /* asked again when it is ready, or replies */
    const char *argv[2] = { "CLUSTER", "SLOTS" };
    size_t len[2] = { 7, 5 };
    if (rconn_send_argv(n->ac, 2, argv, len, store_slots_cb, NULL) != 0)
        return;
    store_node_expect_reply(n);
    n->slots_inflight = 1;
    s->refresh_wanted = 0;
    s->last_refresh_ms = clock_ms();
}

/* At most one CLUSTER SLOTS every STORE_REFRESH_MIN_MS, however many
 * redirects and lost connections ask for it. */
void store_topo_refresh_soon(struct store *s)
{
    if (s->mode != STORE_CLUSTER || s->destroying)
        return;
    s->refresh_wanted = 1;
    if (evtimer_pending(s->refresh_ev, NULL))
        return;
    int64_t wait_ms = s->last_refresh_ms + STORE_REFRESH_MIN_MS - clock_ms();
    struct timeval tv = clock_timeval(wait_ms > 0 ? wait_ms : 0);
    event_add(s->refresh_ev, &tv);
}

void store_topo_periodic_cb(evutil_socket_t fd, short what, void *arg)
{
    store_topo_refresh_soon(arg);
}

/* The control connection failed: try the next address. Cluster: the seeds,
 * then every master learned; sentinel: the next sentinel. */
static void store_ctl_next(struct store *s)
{
    int total = s->nseeds + (s->mode == STORE_CLUSTER ? s->nnodes : 0);
    if (total == 0)
        return;
    s->cand = (s->cand + 1) % total;
    const char *host;
    int port;
    if (s->cand < s->nseeds) {
        host = s->seeds[s->cand].host;
        port = s->seeds[s->cand].port;
    } else {
        host = s->nodes[s->cand - s->nseeds]->host;
        port = s->nodes[s->cand - s->nseeds]->port;
    }
    store_node_set_addr(s->ctl, host, port, 0);
}

/* The node that owns slot (outside a cluster: the one data node), or NULL
 * while the map does not say. */
struct store_node *store_topo_owner(const struct store *s, int slot)
{
    if (s->mode != STORE_CLUSTER)
        return s->nodes[0];
    int i = s->owner[slot];
    return i >= 0 ? s->nodes[i] : NULL;
}

/* MOVED: the slot is to's from now on, and the map is asked for again. */
void store_topo_moved(struct store *s, int slot, const struct store_node *to)
{
    for (int i = 0; i < s->nnodes; i++)
        if (s->nodes[i] == to)
            s->owner[slot] = (int16_t)i;
    store_topo_refresh_soon(s);
}

/* ---- sentinel -------------------------------------------------------------- */

void store_topo_set_master(struct store *s, const char *host, int port)
{
    struct store_node *n = s->nodes[0];
    if (n->active && n->port == port && strcmp(n->host, host) == 0)
        return;
    log_info("store: sentinel master '%s' is %s:%d", s->rc.sentinel_master, host, port);
    if (!n->active) {
        store_node_set_addr(n, host, port, 0);
        store_node_start(n);
    } else {
        store_node_move(n, host, port);
    }
}

/* "+switch-master" carries "NAME OLDIP OLDPORT NEWIP NEWPORT". */
static void store_switch_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    char ip[64];
    int port;
    if (n == NULL || n->s->destroying ||
        store_switch_master(reply, n->s->rc.sentinel_master, ip, sizeof(ip), &port) < 0)
        return;                 /* the subscribe confirmation, or not our master */
    log_info("store: sentinel '%s' switched master '%s' to %s:%d", n->name,
             n->s->rc.sentinel_master, ip, port);
    store_topo_set_master(n->s, ip, port);
}

/* ---- what the store does when nodes come and go ---------------------------- */

void store_topo_node_up(struct store *s, struct store_node *n)
{
    if (n != s->ctl)
        return;
    if (s->mode == STORE_CLUSTER) {
        store_topo_refresh_soon(s);
    } else if (s->mode == STORE_SENTINEL &&
               rconn_subscribe(n->ac, 2, (const char *[]){ "SUBSCRIBE", "+switch-master" },
                               store_switch_cb, NULL) != 0) {
        store_node_kill_later(n, "cannot subscribe");
    }
}

void store_topo_node_lost(struct store *s, struct store_node *n)
{
    if (n == s->ctl) {
        if (s->mode == STORE_CLUSTER)
            s->refresh_wanted = 1;
        store_ctl_next(s);
    } else if (s->mode == STORE_CLUSTER) {
        store_topo_refresh_soon(s);
    } else if (s->mode == STORE_SENTINEL && s->ctl != NULL && s->ctl->ready) {
        /* the master may have changed while we were not listening: ask the
         * sentinels again (the subscribed connection cannot) */
        store_node_kill_later(s->ctl, "asking for the master again");
    }
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381". */
struct store_node *store_topo_redirect_node(struct store *s, const char *err, int *slot)
{
    char host[256];
    int port;
    const char *sp = strchr(err, ' ');
    if (sp == NULL)
        return NULL;
    char *end;
    long k = strtol(sp + 1, &end, 10);
    if (*end != ' ' || k < 0 || k >= STORE_SLOTS ||
        addr_split(end + 1, host, sizeof(host), &port) < 0)
        return NULL;
    int idx = store_topo_node_index(s, host, port);
    if (idx < 0)
        return NULL;
    *slot = (int)k;
    return s->nodes[idx];
}
