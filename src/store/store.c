/* sluice - store.c: rate-limit decisions in Redis, single, Cluster or Sentinel.
 *
 * With rconn.c, the only user of hiredis (as a reply parser). A store owns
 * one or more nodes (store_node.c: rconn connections, handshake, backoff,
 * stall detection), sends the decisions of each loop iteration as one
 * EVALSHA of scripts/limit.lua per node (and slot) (store_batch.c), splits
 * the reply back per call, and turns replies, errors and timeouts into
 * exactly one callback per call. This file holds the calls and their
 * requests (per-slot groups, waiting for a connection being made), the
 * refunds (refund.lua when a route spans slots and another slot denies),
 * sending, NOSCRIPT, MOVED/ASK/TRYAGAIN and timeouts, and store.h's
 * interface. Which node owns a slot or is the master: store_topo.c (CRC16
 * slots are here, CLUSTER SLOTS and +switch-master there). The reset
 * subscriber and the admin API's commands: store_sub.c, store_sync.c. The
 * modules share store_int.h. See store.h for the contract.
 *
 *   store_decide -> group by slot -> req_dispatch -> store_batch_add
 *     -> (end of iteration) store_batch_flush_cb -> rconn
 *     -> store_batch_cb -> store_req_take -> answer, refund, redirect, wait */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/dns.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

static int req_dispatch(struct store_req *q);
static void store_req_settle(struct store_req *q);

/* ---- slots ------------------------------------------------------------------ */

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as the Redis
 * Cluster specification defines the key slot. */
static uint16_t store_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint8_t)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

/* Only the part between the first '{' and the next '}' is hashed, when
 * that part is not empty: route keys put each limit's key under one tag. */
int store_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close != NULL && close > open + 1)
            return store_crc16(open + 1, (size_t)(close - open - 1)) & (STORE_SLOTS - 1);
    }
    return store_crc16(key, len) & (STORE_SLOTS - 1);
}

void store_redirects(uint64_t *ask, uint64_t *moved)
{
    *ask = metrics_counter_get(METRICS_REDIS_REDIRECTS_ASK);
    *moved = metrics_counter_get(METRICS_REDIS_REDIRECTS_MOVED);
}

static int streq(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static int strveq(char **a, int na, char **b, int nb)
{
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++)
        if (!streq(a[i], b[i]))
            return 0;
    return 1;
}

/* Everything store_create() reads: the address, the credentials, the db,
 * the timeout and the cluster and sentinel sections (not on_error, not the
 * key prefix, which are the proxy's). */
int store_same_conf(const struct conf_redis *a, const struct conf_redis *b)
{
    return streq(a->url, b->url) && a->is_unix == b->is_unix && streq(a->host, b->host) &&
           a->port == b->port && a->db == b->db && streq(a->user, b->user) &&
           streq(a->password, b->password) && a->timeout_ms == b->timeout_ms &&
           strveq(a->cluster, a->ncluster, b->cluster, b->ncluster) &&
           streq(a->sentinel_master, b->sentinel_master) &&
           strveq(a->sentinel_nodes, a->nsentinel_nodes, b->sentinel_nodes, b->nsentinel_nodes) &&
           streq(a->sentinel_password, b->sentinel_password) && a->overrides == b->overrides &&
           a->tls == b->tls &&
           streq(a->tls_conf.ca_file, b->tls_conf.ca_file) &&
           streq(a->tls_conf.cert_file, b->tls_conf.cert_file) &&
           streq(a->tls_conf.key_file, b->tls_conf.key_file) &&
           streq(a->tls_conf.server_name, b->tls_conf.server_name) &&
           a->tls_conf.verify == b->tls_conf.verify;
}
void store_count_ready(struct store *s, int on)
{
    on = on != 0;
    if (s->counted == on)
        return;
    if (s->ready)
        metrics_gauge_add(METRICS_REDIS_CONNECTED, on ? 1 : -1);
    s->counted = on;
}

/* ---- waiting for a connection ------------------------------------------------ */

/* An attempt is in flight: resolving, connecting, TLS or the handshake. */
static int node_connecting(const struct store_node *n)
{
    return n != NULL && n->active && n->ac != NULL && !n->ready;
}

/* Outside a cluster: the data node's connection is being made, or (sentinel)
 * the sentinel that will name the master is. Not while waiting out a
 * backoff: then the last attempt failed and decisions get on_error at once. */
int store_connecting(const struct store *s)
{
    if (s->mode == STORE_CLUSTER || s->nnodes == 0)
        return 0;
    assert(s->nodes[0] != NULL);    /* store_topo_node_index() fills every entry */
    if (node_connecting(s->nodes[0]))
        return 1;
    return s->mode == STORE_SENTINEL && !s->nodes[0]->active && node_connecting(s->ctl);
}

/* Whether a decision can be sent now or wait for a connection being made.
 * Cluster: the map is known and some master is up or connecting, or the
 * map is being asked for. */
static int store_usable(const struct store *s)
{
    if (s->ready)
        return 1;
    if (s->mode != STORE_CLUSTER)
        return store_connecting(s);
    if (!s->map_known)
        return s->ctl != NULL && (node_connecting(s->ctl) || s->ctl->ready);
    for (int i = 0; i < s->nnodes; i++)
        if (s->nodes[i]->ready || (s->nodes[i]->in_map && node_connecting(s->nodes[i])))
            return 1;
    return 0;
}

/* A connection came up or an attempt failed: the requests waiting for one
 * look again now rather than at their next STORE_WAIT_MS tick. */
void store_kick_waiting(struct store *s)
{
    for (struct store_call *c = s->all_calls; c != NULL; c = c->all_next) {
        if (c->answered)
            continue;
        for (int i = 0; i < c->nreq; i++)
            if (c->req[i].wait_ev != NULL && evtimer_pending(c->req[i].wait_ev, NULL)) {
                event_del(c->req[i].wait_ev);
                event_active(c->req[i].wait_ev, EV_TIMEOUT, 0);
            }
    }
    for (struct store_req *q = LIST_ITEM(s->refunds.first, struct store_req, refund); q != NULL;
         q = LIST_ITEM(q->refund.next, struct store_req, refund))
        if (q->wait_ev != NULL && evtimer_pending(q->wait_ev, NULL)) {
            event_del(q->wait_ev);
            event_active(q->wait_ev, EV_TIMEOUT, 0);
        }
}

/* ---- calls and requests ---------------------------------------------------- */

static struct store_call *store_call_get(struct store *s)
{
    struct store_call *c = s->free_calls;
    if (c != NULL) {
        s->free_calls = c->next;
        c->pooled = 0;
        return c;
    }
    c = mem_calloc(1, sizeof(*c));
    c->s = s;
    c->all_next = s->all_calls;
    s->all_calls = c;
    for (int i = 0; i < STORE_MAX_LIMITS; i++) {
        c->req[i].s = s;
        c->req[i].call = c;
    }
    return c;
}

/* ---- timeouts: one timer for every call ------------------------------------ */

/* Calls timed out in one turn of the loop at most; the rest in the next. */
#define STORE_DUE_MAX_PER_TURN 1024

/* Arm the store's timer for its oldest unanswered call's due time, unless it
 * is armed: it may then fire early (that call was answered), and the check
 * re-arms it for the next. */
static void store_due_arm(struct store *s, int64_t now_us)
{
    struct store_call *c = LIST_ITEM(s->due.last, struct store_call, due);
    if (c == NULL || s->due_armed)
        return;
    int64_t us = c->due_us > now_us ? c->due_us - now_us : 0;
    struct timeval tv = { (time_t)(us / 1000000), (suseconds_t)(us % 1000000) };
    event_add(s->due_ev, &tv);
    s->due_armed = 1;
}

static void store_call_due(struct store_call *c)
{
    int64_t now = clock_us();
    c->due_us = now + c->s->rc.timeout_ms * 1000;
    list_push(&c->s->due, &c->due);
    c->on_due = 1;
    store_due_arm(c->s, now);
}

static void store_call_undue(struct store_call *c)
{
    if (c->on_due) {
        list_unlink(&c->s->due, &c->due);
        c->on_due = 0;
    }
}

/* Back to the free list once answered and no request is held by a connection. */
static void store_call_settle(struct store_call *c)
{
    if (!c->answered || c->pooled)
        return;
    for (int i = 0; i < c->nreq; i++)
        if (c->req[i].in_hiredis)
            return;
    for (int i = 0; i < c->nreq; i++)
        if (c->req[i].wait_ev != NULL)
            event_del(c->req[i].wait_ev);
    c->cb = NULL;
    c->arg = NULL;
    c->pooled = 1;
    c->next = c->s->free_calls;
    c->s->free_calls = c;
}

/* Deliver the one answer of a call. The call stays alive while a connection
 * still holds any of its requests. */
static void store_call_answer(struct store_call *c, const struct store_result *res)
{
    struct store *s = c->s;
    assert(!c->answered);
    c->answered = 1;
    store_call_undue(c);
    for (int i = 0; i < c->nreq; i++)
        if (c->req[i].wait_ev != NULL)
            event_del(c->req[i].wait_ev);
    s->in_user_cb++;
    c->cb(c->arg, res);
    s->in_user_cb--;
}

static void store_call_fail(struct store_call *c, enum store_status status)
{
    struct store_result res;
    res.status = status;
    res.allowed = 0;
    res.n = 0;
    store_call_answer(c, &res);
}

/* ---- refunds ---------------------------------------------------------------- */

static void store_refund_release(struct store_req *q)
{
    if (q->wait_ev != NULL)
        event_free(q->wait_ev);
    if (q->notify_ev != NULL)
        event_free(q->notify_ev);
    free(q->cmd);
    free(q);
}

static void store_refund_notify_cb(evutil_socket_t fd, short what, void *arg);

static void store_refund_free(struct store_req *q)
{
    struct store *s = q->s;
    if (q->notify != NULL) {        /* a settlement: told from the loop, then freed */
        if (q->notify_ev == NULL)
            q->notify_ev = store_timer(s, store_refund_notify_cb, q);
        event_active(q->notify_ev, EV_TIMEOUT, 0);
        return;
    }
    list_unlink(&s->refunds, &q->refund);
    store_refund_release(q);
    if (s->refunds.first == NULL && s->drain_done != NULL)   /* a draining store owes nothing now */
        event_active(s->drain_ev, EV_TIMEOUT, 0);
}

static void store_drain_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    void (*done)(void *) = s->drain_done;
    if (s->refunds.first != NULL)
        log_warn("store: closing with give-backs unanswered after %lld ms; Redis keeps "
                 "those slots until their leases end",
                 (long long)(STORE_REFUND_BUDGET_MS + s->rc.timeout_ms));
    s->drain_done = NULL;
    done(s->drain_arg);             /* may free s */
}

int store_drain(struct store *s, void (*done)(void *arg), void *arg)
{
    assert(s->in_user_cb == 0 && s->drain_done == NULL && done != NULL);
    if (s->refunds.first == NULL)
        return 0;
    s->drain_done = done;
    s->drain_arg = arg;
    s->drain_ev = store_timer(s, store_drain_cb, s);
    struct timeval tv = clock_timeval(STORE_REFUND_BUDGET_MS + s->rc.timeout_ms);
    event_add(s->drain_ev, &tv);
    return 1;
}

int64_t store_owed_ms(const struct store *s)
{
    int64_t last = 0;
    for (const struct store_req *q = LIST_ITEM(s->refunds.first, struct store_req, refund);
         q != NULL; q = LIST_ITEM(q->refund.next, struct store_req, refund))
        if (q->deadline_ms > last)
            last = q->deadline_ms;
    if (last == 0)
        return 0;
    int64_t left = last - clock_ms();
    return (left > 0 ? left : 0) + s->rc.timeout_ms + 1;
}

/* Give back what an allowing group consumed, because another group denied:
 * one refund.lua call on the group's slot, fire and forget. Its keys,
 * params and marks are copied: the call may be reused before it runs. */
static void store_refund(struct store_call *c, const struct store_req *g)
{
    struct store *s = c->s;
    int k[STORE_MAX_LIMITS], n = 0;
    for (int i = 0; i < g->n; i++) {
        int li = g->idx[i];
        if (c->res.r[li].allowed && !(c->flags[li] & STORE_CHECK_ONLY))
            k[n++] = i;
    }
    if (n == 0)
        return;
    struct store_req *q = mem_calloc(1, sizeof(*q));
    q->s = s;
    q->slot = g->slot;
    q->deadline_ms = clock_ms() + STORE_REFUND_BUDGET_MS;
    int li[STORE_MAX_LIMITS];
    int64_t marks[STORE_MAX_LIMITS], times[2] = { g->time_s, g->time_us };
    for (int i = 0; i < n; i++) {
        li[i] = g->idx[k[i]];
        marks[i] = g->mark[k[i]];
    }
    store_batch_encode_evalsha(q, c, refund_lua_sha, li, n, times, 2, marks);
    list_push(&s->refunds, &q->refund);
    if (req_dispatch(q) != 0) {
        q->done = 1;
        store_req_settle(q);
    }
}

static void store_refund_notify_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_req *q = arg;
    void (*done)(void *) = q->notify;
    void *done_arg = q->notify_arg;
    q->notify = NULL;
    store_refund_free(q);
    if (done != NULL)
        done(done_arg);
}

static struct store_req *store_give_back_req(struct store *s, const struct store_limit *l);

void store_give_back(struct store *s, const struct store_limit *l)
{
    store_give_back_req(s, l);
}

struct store_req *store_settle(struct store *s, const struct store_limit *l,
                               void (*done)(void *arg), void *arg)
{
    struct store_req *q = store_give_back_req(s, l);
    if (q != NULL) {
        q->notify = done;
        q->notify_arg = arg;
    }
    return q;
}

void store_settle_cancel(struct store_req *q)
{
    q->notify = NULL;               /* a pending notify_ev then only frees it */
}

/* One limit's give-back (store.h): refund.lua with TIME 0 0 (only
 * sliding_log reads it) and the slot id (a settlement: the window) as the
 * mark, sent like a refund. Returns the request while it waits for its
 * answer, NULL when it is gone already (nothing sent). */
static struct store_req *store_give_back_req(struct store *s, const struct store_limit *l)
{
    struct store_call tmp;
    int li[1] = { 0 };
    int64_t times[2] = { 0, 0 }, marks[1] = { l->slot };
    if (l->params->algo == LIMITER_CONCURRENCY ? l->slot < 1 :
        l->params->algo == LIMITER_SLIDING_LOG || l->cost == 0)
        return NULL;
    memset(&tmp, 0, sizeof(tmp));
    tmp.n = 1;
    tmp.params[0] = *l->params;
    tmp.params[0].delay_ms = 0;             /* refund.lua takes no delay */
    tmp.cost[0] = l->cost;
    tmp.slot[0] = l->slot;
    tmp.keys = (char *)l->key;              /* read only, during the encoding */
    tmp.klen[0] = l->keylen;
    struct store_req *q = mem_calloc(1, sizeof(*q));
    q->s = s;
    q->slot = s->mode == STORE_CLUSTER ? store_slot(l->key, l->keylen) : -1;
    q->deadline_ms = clock_ms() + STORE_REFUND_BUDGET_MS;
    store_batch_encode_evalsha(q, &tmp, refund_lua_sha, li, 1, times, 2, marks);
    list_push(&s->refunds, &q->refund);
    if (req_dispatch(q) != 0) {
        q->done = 1;
        store_req_settle(q);
        return NULL;
    }
    return q;
}

/* Every group has answered: allowed only when all allowed. When some group
 * denied, the groups that allowed consumed: refund them, and report their
 * state without this request (as limit.lua does for a denied request). */
static void store_call_complete(struct store_call *c)
{
    struct store_result *res = &c->res;
    res->status = STORE_OK;
    res->n = c->n;
    res->allowed = 1;
    for (int i = 0; i < c->nreq; i++)
        res->allowed &= c->req[i].allowed;
    if (!res->allowed && c->nreq > 1) {
        for (int i = 0; i < c->nreq; i++) {
            struct store_req *g = &c->req[i];
            if (!g->allowed)
                continue;
            store_refund(c, g);
            for (int j = 0; j < g->n; j++) {
                int li = g->idx[j];
                struct limiter_result *r = &res->r[li];
                if (r->allowed && !(c->flags[li] & STORE_CHECK_ONLY)) {
                    /* a concurrency limit took one slot, whatever the cost */
                    r->remaining += c->params[li].algo == LIMITER_CONCURRENCY ? 1 : c->cost[li];
                    if (r->remaining > r->limit)
                        r->remaining = r->limit;
                }
            }
        }
    }
    store_call_answer(c, res);
}

/* ---- sending, replies, redirects --------------------------------------------- */

static int store_req_abandoned(const struct store_req *q)
{
    return q->call != NULL ? q->call->answered : q->done;
}

/* A request no longer in a connection may be released: a refund when done, a
 * call when answered and idle. */
static void store_req_settle(struct store_req *q)
{
    if (q->in_hiredis)
        return;
    if (q->call != NULL)
        store_call_settle(q->call);
    else if (q->done)
        store_refund_free(q);
}

static void store_req_finish(struct store_req *q, enum store_status status)
{
    q->done = 1;
    if (q->call != NULL && !q->call->answered)
        store_call_fail(q->call, status);
}

static void req_wait_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_req *q = arg;
    if (store_req_abandoned(q))
        return;
    if (req_dispatch(q) != 0)
        store_req_finish(q, STORE_ERROR);
    store_req_settle(q);              /* a refund past its deadline is freed */
}

/* No usable node now (cluster): look again shortly. A call's own timer
 * bounds how long; a refund has its deadline. */
static void store_req_wait(struct store_req *q)
{
    if (q->call == NULL && clock_ms() > q->deadline_ms) {
        log_warn("store: refund abandoned for slot %d: no master answered", q->slot);
        q->done = 1;
        return;
    }
    if (q->wait_ev == NULL)
        q->wait_ev = store_timer(q->s, req_wait_cb, q);
    struct timeval tv = clock_timeval(STORE_WAIT_MS);
    event_add(q->wait_ev, &tv);
}

static struct store_node *req_target(const struct store_req *q)
{
    struct store *s = q->s;
    if (q->ask != NULL)
        return q->ask;
    return store_topo_owner(s, q->slot);
}

static void req_reply_cb(struct rconn *ac, redisReply *reply, void *privdata);

/* Send the request to the node that should run it. Outside a cluster a
 * node that is not ready is a failure (-1); in a cluster the request waits
 * for the map or the connection (0). */
static int req_dispatch(struct store_req *q)
{
    struct store *s = q->s;
    struct store_node *n = req_target(q);
    if (n == NULL || !n->ready || n->ac == NULL) {
        if (s->mode != STORE_CLUSTER && store_connecting(s)) {
            store_req_wait(q);            /* sent when the connection is up */
            return 0;
        }
        if (s->mode != STORE_CLUSTER)
            return -1;
        /* a master that is down may have been replaced: ask (rate-limited) */
        store_topo_refresh_soon(s);
        if (n != NULL)
            store_node_start(n);
        store_req_wait(q);
        return 0;
    }
    q->asked = q->ask != NULL;
    if (q->call != NULL) {
        /* a decision: sent in the node's batch at the end of this iteration */
        q->ask = NULL;              /* ASK holds for this one command only */
        store_batch_add(n, q);
        return 0;
    }
    if (q->asked) {
        q->ask = NULL;              /* ASK holds for this one command only */
        if (store_node_asking(n) != 0)
            goto fail;
    }
    if (rconn_send(n->ac, q->cmd, q->cmdlen, req_reply_cb, q) != 0)
        goto fail;
    q->in_hiredis = 1;
    q->node = n;
    store_node_expect_reply(n);
    return 0;
fail:
    if (s->mode != STORE_CLUSTER)
        return -1;
    store_req_wait(q);
    return 0;
}


/* Counted per store and process; logged at debug each, at info at most
 * once a second per kind with the running totals. */
static void store_count_redirect(struct store *s, int kind, int slot,
                                 const struct store_node *to)
{
    static const char *const kinds[2] = { "ask", "moved" };
    s->redirects[kind]++;
    metrics_count(kind == 0 ? METRICS_REDIS_REDIRECTS_ASK : METRICS_REDIS_REDIRECTS_MOVED);
    log_debug("store: cluster redirect %s slot %d to '%s'", kinds[kind], slot, to->name);
    int64_t now = clock_ms();
    if (now - s->redirect_logged_ms[kind] >= STORE_REDIRECT_LOG_MS) {
        s->redirect_logged_ms[kind] = now;
        log_info("store: cluster redirect %s slot %d to '%s' (redirects so far: "
                 "ask %llu, moved %llu)", kinds[kind], slot, to->name,
                 (unsigned long long)s->redirects[0], (unsigned long long)s->redirects[1]);
    }
}

static int req_redirect(struct store_req *q, const char *err)
{
    struct store *s = q->s;
    int ask = strncmp(err, "ASK ", 4) == 0, slot;
    struct store_node *to = store_topo_redirect_node(s, err, &slot);
    if (to == NULL || ++q->redirects > STORE_MAX_REDIRECTS)
        return -1;
    store_count_redirect(s, ask ? 0 : 1, slot, to);
    if (ask) {
        q->ask = to;
    } else {
        store_topo_moved(s, slot, to);
    }
    if (!to->active)
        store_node_start(to);
    return req_dispatch(q);
}

/* An error reply: NOSCRIPT reloads and resends once; MOVED and ASK follow
 * the redirect; TRYAGAIN and a cluster in transition wait and resend. */
static int req_error(struct store_req *q, struct store_node *n, const char *err)
{
    struct store *s = q->s;
    if (strncmp(err, "NOSCRIPT", 8) == 0) {
        if (q->noscript_tried || n->ac == NULL || store_node_load_scripts(n) != 0)
            return -1;
        q->noscript_tried = 1;
        if (q->asked)
            q->ask = n;
        return req_dispatch(q);
    }
    if (s->mode != STORE_CLUSTER) {
        if (s->mode == STORE_SENTINEL && strncmp(err, "READONLY", 8) == 0)
            store_node_kill_later(n, "the master became a replica");
        return -1;
    }
    if (strncmp(err, "MOVED ", 6) == 0 || strncmp(err, "ASK ", 4) == 0)
        return req_redirect(q, err);
    if (strncmp(err, "TRYAGAIN", 8) == 0 || strncmp(err, "CLUSTERDOWN", 11) == 0 ||
        strncmp(err, "LOADING", 7) == 0 || strncmp(err, "MASTERDOWN", 10) == 0 ||
        strncmp(err, "READONLY", 8) == 0) {
        if (strncmp(err, "TRYAGAIN", 8) != 0)
            store_topo_refresh_soon(s);
        store_req_wait(q);
        return 0;
    }
    return -1;
}

/* The status an error reply ends a call with. Redis refuses a script over
 * maxmemory with "-OOM command not allowed ..."; a write inside a running
 * script may instead fail as "ERR ... -OOM command not allowed ...". A full
 * Redis fails every decision, so it is also logged (at most every 10 s). */
static enum store_status store_error_status(struct store *s, struct store_node *n,
                                            const char *err)
{
    if (strncmp(err, "OOM ", 4) != 0 && strstr(err, "OOM command not allowed") == NULL)
        return STORE_ERROR;
    int64_t now = clock_ms();
    if (s->oom_logged_ms == 0 || now - s->oom_logged_ms >= STORE_OOM_LOG_MS) {
        s->oom_logged_ms = now;
        log_warn("store: EVALSHA failed '%s': out of memory (maxmemory reached under "
                 "noeviction); decisions get on_error until Redis has room", n->name);
    }
    return STORE_OOM;
}


/* One request's share of a reply, its own (a refund) or its batch's (a
 * decision, whose fields start at `at` in the batch's integers v;
 * readable: the batch reply has the shape limit.lua gives): a lost
 * connection, an error reply, or its decisions. */
static void store_req_take(struct store_req *q, struct store_node *n, const redisReply *reply,
                           const long long *v, size_t at, int marks)
{
    struct store *s = q->s;
    if (store_req_abandoned(q)) {
        store_req_settle(q);
        return;
    }
    if (reply == NULL) {
        if (s->mode == STORE_CLUSTER) {
            /* resent to the slot's master once the map is fresh: at worst
             * the lost command had run and the limit counts it twice */
            store_topo_refresh_soon(s);
            store_req_wait(q);
        } else {
            store_req_finish(q, STORE_ERROR);
        }
    } else if (reply->type == REDIS_REPLY_ERROR) {
        if (req_error(q, n, reply->str) != 0) {
            log_debug("store: EVALSHA failed '%s': %s", n->name, reply->str);
            store_req_finish(q, store_error_status(s, n, reply->str));
        }
    } else if (q->call == NULL) {
        q->done = 1;            /* a refund: its count needs no check */
    } else if (v == NULL) {
        log_debug("store: unexpected reply from '%s'", n->name);
        store_req_finish(q, STORE_ERROR);
    } else {
        store_batch_parse(q, v, at, marks);
        q->done = 1;
        if (--q->call->pending == 0)
            store_call_complete(q->call);
    }
    store_req_settle(q);
}

/* A refund's reply (decisions come back in batches: store_batch_cb). */
static void req_reply_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_req *q = privdata;
    struct store *s = q->s;
    struct store_node *n = rconn_data(ac);
    q->in_hiredis = 0;
    if (s->destroying)
        return;                 /* store_destroy() frees everything */
    store_node_got_reply(n);
    if (reply == NULL)
        store_node_set_ready(n, 0);   /* the connection is going away */
    store_req_take(q, n, reply, NULL, 0, 0);
}

/* A timed-out call is answered now; late replies only release it. When
 * nothing at all came back from a node for two timeouts, the server is
 * paused or gone: drop that connection rather than queue behind it. */
static void store_call_timeout(struct store_call *c)
{
    struct store *s = c->s;
    if (c->answered)
        return;
    struct store_node *stalled[STORE_MAX_LIMITS];
    int nstalled = 0;
    int64_t now = clock_ms();
    for (int i = 0; i < c->nreq; i++) {
        struct store_node *n = c->req[i].node;
        if (c->req[i].in_hiredis && n != NULL && n->ac != NULL && n->inflight > 0 &&
            now - n->progress_ms > 2 * s->rc.timeout_ms)
            stalled[nstalled++] = n;
    }
    store_call_fail(c, STORE_TIMEOUT);
    store_call_settle(c);
    for (int i = 0; i < nstalled; i++)
        if (stalled[i]->ac != NULL)
            store_node_drop(stalled[i], "no reply within twice the timeout");
}

/* The store's timer: every call due by now times out, oldest first (an
 * answer's callback may start or cancel others meanwhile), then the timer
 * waits for the next. */
static void store_due_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    s->due_armed = 0;
    int64_t now = clock_us();
    for (int k = 0; k < STORE_DUE_MAX_PER_TURN; k++) {
        struct store_call *c = LIST_ITEM(s->due.last, struct store_call, due);
        if (c == NULL || c->due_us > now)
            break;
        store_call_undue(c);
        store_call_timeout(c);
    }
    store_due_arm(s, now);
}

/* ---- interface -------------------------------------------------------------- */

static char **store_strvdup(char **v, int n)
{
    if (n <= 0 || v == NULL)
        return NULL;
    char **out = mem_calloc((size_t)n, sizeof(*out));
    for (int i = 0; i < n; i++)
        out[i] = store_strdup(v[i]);
    return out;
}

static void store_strvfree(char **v, int n)
{
    for (int i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

static void store_copy_conf(struct store *s, const struct conf_redis *rc)
{
    s->rc = *rc;
    s->rc.url = store_strdup(rc->url);
    s->rc.host = store_strdup(rc->host);
    s->rc.user = store_strdup(rc->user);
    s->rc.password = store_strdup(rc->password);
    s->rc.prefix = store_strdup(rc->prefix);
    s->rc.cluster = store_strvdup(rc->cluster, rc->ncluster);
    s->rc.sentinel_master = store_strdup(rc->sentinel_master);
    s->rc.sentinel_nodes = store_strvdup(rc->sentinel_nodes, rc->nsentinel_nodes);
    s->rc.sentinel_password = store_strdup(rc->sentinel_password);
    s->rc.tls_conf.ca_file = store_strdup(rc->tls_conf.ca_file);
    s->rc.tls_conf.cert_file = store_strdup(rc->tls_conf.cert_file);
    s->rc.tls_conf.key_file = store_strdup(rc->tls_conf.key_file);
    s->rc.tls_conf.server_name = store_strdup(rc->tls_conf.server_name);
    if (s->rc.timeout_ms < 1)
        s->rc.timeout_ms = 1;
}

/* The cluster seeds or the sentinels; addresses that do not parse are
 * logged and skipped (conf.c validates them first). */
static void store_parse_seeds(struct store *s, char **addrs, int n)
{
    s->seeds = mem_calloc((size_t)(n > 0 ? n : 1), sizeof(*s->seeds));
    for (int i = 0; i < n; i++) {
        char host[256];
        int port;
        if (addr_split(addrs[i], host, sizeof(host), &port) < 0) {
            log_error("store: bad address '%s': want host:port", addrs[i]);
            continue;
        }
        s->seeds[s->nseeds].host = store_strdup(host);
        s->seeds[s->nseeds].port = port;
        s->nseeds++;
    }
}

/* The resolver and the TLS context every node of the store connects with.
 * evdns reads /etc/resolv.conf and /etc/hosts as getaddrinfo would. A TLS
 * context that does not load is logged; the store then never connects
 * (on_error), and never falls back to plain connections. */
static void store_open_net(struct store *s)
{
    s->dns = evdns_base_new(s->base, 0);
    if (s->dns == NULL) {
        log_error("store: cannot create a resolver");
        abort();
    }
    if (evdns_base_resolv_conf_parse(s->dns, DNS_OPTIONS_ALL, "/etc/resolv.conf") != 0)
        log_warn("store: cannot read '/etc/resolv.conf': names resolve from /etc/hosts "
                 "and 127.0.0.1");
    if (!s->rc.tls)
        return;
    char why[300];
    struct rconn_tls_conf tc = {
        s->rc.tls_conf.ca_file, s->rc.tls_conf.cert_file, s->rc.tls_conf.key_file,
        s->rc.tls_conf.server_name, s->rc.tls_conf.verify,
    };
    s->tls = rconn_tls_create(&tc, why, sizeof(why));
    if (s->tls == NULL) {
        log_error("store: TLS setup failed: %s; decisions get on_error", why);
        s->tls_failed = 1;
    }
}

/* A request of a batch that could not be sent waits for the map (cluster)
 * or for the connection being made, or fails, as a request that finds its
 * node down does. */
static void store_req_unsent(struct store_req *q)
{
    struct store *s = q->s;
    if (!store_req_abandoned(q)) {
        if (s->mode == STORE_CLUSTER) {
            store_topo_refresh_soon(s);
            store_req_wait(q);
        } else if (store_connecting(s)) {
            store_req_wait(q);        /* sent when the connection is up */
        } else {
            store_req_finish(q, STORE_ERROR);
        }
    }
    store_req_settle(q);
}

static const struct store_ops store_ops = {
    .node_up = store_topo_node_up,
    .node_lost = store_topo_node_lost,
    .set_master = store_topo_set_master,
    .kick_waiting = store_kick_waiting,
    .req_take = store_req_take,
    .req_unsent = store_req_unsent,
};

struct store *store_create(struct event_base *base, const struct conf_redis *rc)
{
    struct store *s = mem_calloc(1, sizeof(*s));
    s->base = base;
    s->ops = &store_ops;
    s->counted = 1;
    store_copy_conf(s, rc);
    store_open_net(s);
    for (int i = 0; i < STORE_SLOTS; i++)
        s->owner[i] = -1;
    s->refresh_ev = store_timer(s, store_topo_refresh_cb, s);
    s->due_ev = store_timer(s, store_due_cb, s);
    s->periodic_ev = event_new(base, -1, EV_PERSIST, store_topo_periodic_cb, s);
    s->flush_ev = event_new(base, -1, 0, store_batch_flush_cb, s);
    if (s->periodic_ev == NULL || s->flush_ev == NULL)
        abort();
    s->enc = mem_calloc(1, sizeof(*s->enc));
    if (rc->ncluster > 0)
        s->slot_open = mem_calloc(STORE_SLOTS, sizeof(*s->slot_open));
    if (rc->ncluster > 0) {
        s->mode = STORE_CLUSTER;
        store_parse_seeds(s, s->rc.cluster, s->rc.ncluster);
    } else if (rc->sentinel_master != NULL) {
        s->mode = STORE_SENTINEL;
        store_parse_seeds(s, s->rc.sentinel_nodes, s->rc.nsentinel_nodes);
    } else {
        s->mode = STORE_SINGLE;
    }
    if (s->mode == STORE_SINGLE) {
        store_topo_node_index(s, rc->host ? rc->host : "?", rc->port);
        if (rc->is_unix)
            store_node_set_addr(s->nodes[0], rc->host ? rc->host : "?", 0, 1);
        store_node_start(s->nodes[0]);
        return s;
    }
    if (s->mode == STORE_SENTINEL)
        store_topo_node_index(s, "?", 0);    /* the master, once a sentinel names it */
    if (s->nseeds == 0) {
        log_error("store: no usable %s address", s->mode == STORE_CLUSTER ?
                  "cluster" : "sentinel");
        return s;                       /* never connected: on_error applies */
    }
    s->ctl = store_node_new(s, NODE_CTL, s->seeds[0].host, s->seeds[0].port, 0);
    store_node_start(s->ctl);
    if (s->mode == STORE_CLUSTER) {
        struct timeval tv = clock_timeval(STORE_REFRESH_EVERY_MS);
        event_add(s->periodic_ev, &tv);
    }
    return s;
}

static void store_free_req_parts(struct store_req *q)
{
    if (q->wait_ev != NULL)
        event_free(q->wait_ev);
    free(q->cmd);
}

static void store_dns_free_cb(evutil_socket_t fd, short what, void *arg)
{
    evdns_base_free(arg, 0);
}

/* A lookup cancelled by store_destroy() is delivered from the loop later
 * and still reads its evdns_base: then the base is freed a second later,
 * once the loop has run that (a reload). A store destroyed at exit with a
 * lookup in flight leaves its resolver to the process' end. */
static void store_close_dns(struct event_base *base, struct evdns_base *dns, int resolving)
{
    struct timeval tv = clock_timeval(STORE_DNS_LINGER_MS);
    if (!resolving || event_base_once(base, -1, EV_TIMEOUT, store_dns_free_cb, dns, &tv) != 0)
        evdns_base_free(dns, 0);
}

/* Must not be called from inside a store callback. */
void store_destroy(struct store *s)
{
    if (s == NULL)
        return;
    assert(s->in_user_cb == 0);
    s->destroying = 1;
    store_node_update_ready(s);              /* drops the process-wide gauge */
    struct store_node *all[STORE_MAX_NODES + 1];
    int nall = 0;
    for (int i = 0; i < s->nnodes; i++)
        all[nall++] = s->nodes[i];
    if (s->ctl != NULL)
        all[nall++] = s->ctl;
    int resolving = 0;
    for (int i = 0; i < nall; i++) {
        if (all[i]->ac != NULL) {
            struct rconn *ac = all[i]->ac;
            resolving |= rconn_resolving(ac);
            all[i]->ac = NULL;
            rconn_free(ac);         /* pending replies: NULL, ignored */
        }
    }
    for (int i = 0; i < nall; i++)
        store_node_free(all[i]);
    while (s->refunds.first != NULL) {
        struct store_req *q = LIST_ITEM(s->refunds.first, struct store_req, refund);
        list_unlink(&s->refunds, &q->refund);
        store_refund_release(q);
    }
    while (s->all_calls != NULL) {
        struct store_call *c = s->all_calls;
        s->all_calls = c->all_next;
        for (int i = 0; i < STORE_MAX_LIMITS; i++)
            store_free_req_parts(&c->req[i]);
        free(c->keys);
        free(c);
    }
    while (s->all_batches != NULL) {
        struct store_batch *x = s->all_batches;
        s->all_batches = x->all_next;
        free(x->ints);
        free(x);
    }
    event_free(s->flush_ev);
    if (s->drain_ev != NULL)
        event_free(s->drain_ev);
    free(s->slot_open);
    free(s->enc);
    free(s->bcmd);
    event_free(s->refresh_ev);
    event_free(s->due_ev);
    event_free(s->periodic_ev);
    for (int i = 0; i < s->nseeds; i++)
        free(s->seeds[i].host);
    free(s->seeds);
    free(s->nodes);
    free(s->rc.url);
    free(s->rc.host);
    free(s->rc.user);
    free(s->rc.password);
    free(s->rc.prefix);
    store_strvfree(s->rc.cluster, s->rc.ncluster);
    free(s->rc.sentinel_master);
    store_strvfree(s->rc.sentinel_nodes, s->rc.nsentinel_nodes);
    free(s->rc.sentinel_password);
    free(s->rc.tls_conf.ca_file);
    free(s->rc.tls_conf.cert_file);
    free(s->rc.tls_conf.key_file);
    free(s->rc.tls_conf.server_name);
    rconn_tls_destroy(s->tls);
    store_close_dns(s->base, s->dns, resolving);
    free(s);
}

/* Copy what the requests need: the caller's keys and params go away when
 * store_decide() returns. */
static void store_call_copy(struct store_call *c, const struct store_limit *limits, int n)
{
    /* with redis.overrides each key is followed by its override key (its
     * limit's key and the suffix, also for a part of its route's key) */
    size_t sl = sizeof(STORE_OVERRIDE_SUFFIX) - 1, total = 0;
    int ovr = c->s->rc.overrides, parts = c->s->mode != STORE_CLUSTER;
    for (int i = 0; i < n; i++)
        total += limits[i].keylen + limits[i].pkeylen + (ovr ? limits[i].keylen + sl : 0);
    if (c->keycap < total || c->keys == NULL) {
        free(c->keys);
        c->keycap = total > 64 ? total : 64;
        c->keys = mem_alloc(c->keycap);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        c->params[i] = *limits[i].params;
        c->cost[i] = limits[i].cost;
        c->flags[i] = limits[i].flags;
        c->slot[i] = limits[i].slot;
        int part = parts && limits[i].part != 0 && limits[i].pkey != NULL;
        const char *k = part ? limits[i].pkey : limits[i].key;
        c->part[i] = part ? limits[i].part : 0;
        c->koff[i] = off;
        c->klen[i] = part ? limits[i].pkeylen : limits[i].keylen;
        memcpy(c->keys + off, k, c->klen[i]);
        off += c->klen[i];
        c->ooff[i] = off;
        c->olen[i] = limits[i].keylen + sl;
        if (ovr) {
            memcpy(c->keys + off, limits[i].key, limits[i].keylen);
            memcpy(c->keys + off + limits[i].keylen, STORE_OVERRIDE_SUFFIX, sl);
            off += limits[i].keylen + sl;
        }
    }
    c->n = n;
}

/* Limits whose keys share a slot go in one request (atomic there); outside
 * a cluster every limit goes in one. */
static void store_call_group(struct store_call *c)
{
    struct store *s = c->s;
    c->nreq = 0;
    for (int i = 0; i < c->n; i++) {
        int slot = s->mode == STORE_CLUSTER ?
                   store_slot(c->keys + c->koff[i], c->klen[i]) : -1;
        int g = 0;
        while (g < c->nreq && c->req[g].slot != slot)
            g++;
        struct store_req *q = &c->req[g];
        if (g == c->nreq) {
            c->nreq++;
            q->slot = slot;
            q->n = 0;
            q->node = NULL;
            q->ask = NULL;
            q->asked = q->in_hiredis = q->done = q->noscript_tried = q->redirects = 0;
            q->allowed = 0;
        }
        q->idx[q->n++] = i;
    }
    c->pending = c->nreq;
}

struct store_call *store_decide(struct store *s, const struct store_limit *limits,
                                int n, store_cb *cb, void *arg)
{
    assert(n >= 1 && n <= STORE_MAX_LIMITS && cb != NULL);
    if (n < 1 || n > STORE_MAX_LIMITS)
        return NULL;
    if (!store_usable(s))
        return NULL;
    struct store_call *c = store_call_get(s);
    c->cb = cb;
    c->arg = arg;
    c->answered = 0;
    store_call_copy(c, limits, n);
    store_call_group(c);
    for (int g = 0; g < c->nreq; g++) {
        if (req_dispatch(&c->req[g]) != 0) {
            /* outside a cluster: the only request; nothing was sent */
            assert(c->nreq == 1);
            c->answered = 1;
            store_call_settle(c);
            return NULL;
        }
    }
    store_call_due(c);
    return c;
}

void store_cancel(struct store_call *c)
{
    if (c == NULL || c->answered)
        return;
    c->answered = 1;
    store_call_undue(c);
    store_call_settle(c);
}

int store_connected(const struct store *s)
{
    return s->ready;
}

int64_t store_retry_ms(const struct store *s)
{
    int64_t now = clock_ms(), left = 0;
    if (s->ready)
        return 0;
    for (int i = -1; i < s->nnodes; i++) {
        const struct store_node *n = i < 0 ? s->ctl : s->nodes[i];
        if (n != NULL && n->active && n->ac == NULL && evtimer_pending(n->retry_ev, NULL) &&
            n->retry_at_ms - now > left)
            left = n->retry_at_ms - now;
    }
    return left;
}

const char *store_limit_script(void)
{
    return limit_lua;
}

const char *store_part_reset_script(void)
{
    return part_reset_lua;
}
