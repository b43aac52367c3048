/* sluice - store_node.c: one Redis node of a store, on one rconn connection.
 *
 * A node's address, its connection (connect budget, backoff, retry, a drop
 * deferred out of the connection's callbacks), its handshake (AUTH, SELECT,
 * ROLE, SENTINEL get-master-addr-by-name or PING, SCRIPT LOAD) and the
 * script reload after NOSCRIPT; and the store's readiness, which is made of
 * its nodes'. What a node coming or going means is store_topo.c's, told
 * through s->ops (set by store.c): this file calls nothing above it. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

static void node_connect(struct store_node *n);

/* ---- readiness ----------------------------------------------------------- */

/* Single and sentinel: the data node is ready. Cluster: every slot has a
 * master, and each of them is connected. */
void store_node_update_ready(struct store *s)
{
    int ready;
    if (s->destroying) {
        ready = 0;
    } else if (s->mode != STORE_CLUSTER) {
        ready = s->nnodes > 0 && s->nodes[0]->ready;
    } else {
        ready = s->map_complete;
        for (int i = 0; i < s->nnodes && ready; i++)
            if (s->nodes[i]->in_map && !s->nodes[i]->ready)
                ready = 0;
    }
    /* ready also feeds the process-wide gauge behind /readyz */
    if (s->ready != ready && s->counted)
        metrics_gauge_add(METRICS_REDIS_CONNECTED, ready ? 1 : -1);
    s->ready = ready;
}

void store_node_set_ready(struct store_node *n, int ready)
{
    n->ready = ready;
    store_node_update_ready(n->s);
}

/* ---- nodes: one connection each ------------------------------------------ */

void store_node_expect_reply(struct store_node *n)
{
    if (n->inflight++ == 0)
        n->progress_ms = clock_ms();
}

void store_node_got_reply(struct store_node *n)
{
    if (n->inflight > 0)
        n->inflight--;
    n->progress_ms = clock_ms();
}

static void node_asking_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    if (n != NULL && !n->s->destroying)
        store_node_got_reply(n);
}

int store_node_asking(struct store_node *n)
{
    if (rconn_send(n->ac, "*1\r\n$6\r\nASKING\r\n", 16, node_asking_cb, NULL) != 0)
        return -1;
    store_node_expect_reply(n);
    return 0;
}

static void node_log_down(struct store_node *n, const char *reason, int64_t retry_ms)
{
    if (n->down_logged)
        return;
    n->down_logged = 1;
    /* a TLS failure (a certificate that does not verify...) is a setup
     * error more than an outage: an error, though retried the same way */
    log_write(reason && strncmp(reason, "TLS", 3) == 0 ? LOG_ERROR : LOG_WARN,
              "store: redis '%s' down: %s, retrying in %lld ms", n->name,
              reason ? reason : "unknown error", (long long)retry_ms);
}

/* The connection is gone (or never came): tell the store, then wait and try
 * again while the node is still wanted. */
static void node_down(struct store_node *n, const char *reason)
{
    struct store *s = n->s;
    n->ac = NULL;
    n->inflight = 0;
    n->script_loads = 0;
    n->slots_inflight = 0;
    event_del(n->connect_ev);
    store_node_set_ready(n, 0);
    if (s->destroying)
        return;
    s->ops->node_lost(s, n);
    if (!n->active)
        return;
    node_log_down(n, reason, n->backoff_ms);
    struct timeval tv = clock_timeval(n->backoff_ms);
    n->retry_at_ms = clock_ms() + n->backoff_ms;
    event_add(n->retry_ev, &tv);
    n->backoff_ms *= 2;
    if (n->backoff_ms > STORE_BACKOFF_MAX_MS)
        n->backoff_ms = STORE_BACKOFF_MAX_MS;
    s->ops->kick_waiting(s);        /* what waited for this attempt fails now */
}

/* From inside a connection's callback it is not dropped (that would run
 * every pending callback, the store's own among them, underneath): ask the
 * event loop to do it once the stack has unwound. */
void store_node_kill_later(struct store_node *n, const char *reason)
{
    store_node_set_ready(n, 0);
    n->kill_reason = reason;
    event_active(n->kill_ev, EV_TIMEOUT, 0);
}

static void node_kill_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_node *n = arg;
    if (n->ac != NULL)
        store_node_drop(n, n->kill_reason);
}

/* Free the connection from outside its callbacks. Pending requests get
 * NULL replies (already answered ones are merely released). */
void store_node_drop(struct store_node *n, const char *reason)
{
    struct rconn *ac = n->ac;
    store_node_set_ready(n, 0);
    if (ac != NULL) {
        n->dropping = 1;
        rconn_free(ac);
        n->dropping = 0;
    }
    node_down(n, reason);
}

static void node_ready(struct store_node *n)
{
    event_del(n->connect_ev);
    n->backoff_ms = STORE_BACKOFF_MIN_MS;
    n->down_logged = 0;
    store_node_set_ready(n, 1);
    log_info("store: redis '%s' connected%s", n->name,
             n->role == NODE_CTL ? (n->s->mode == STORE_CLUSTER ?
                                    " (cluster topology)" : " (sentinel)") : "");
    n->s->ops->node_up(n->s, n);
    n->s->ops->kick_waiting(n->s);  /* what waited for the connection goes now */
}


/* Sentinel: "SENTINEL get-master-addr-by-name" answers [ip, port] or nil. */
static int node_take_master(struct store_node *n, const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING)
        return -1;
    int port;
    if (addr_port(reply->element[1]->str, reply->element[1]->len, &port) < 0)
        return -1;
    n->s->ops->set_master(n->s, reply->element[0]->str, port);
    return 0;
}

int store_node_is_master(const redisReply *reply)
{
    return reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 &&
           reply->element[0]->type == REDIS_REPLY_STRING &&
           strcmp(reply->element[0]->str, "master") == 0;
}

static void node_handshake_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    const char *step = privdata;
    if (n == NULL || n->s->destroying)
        return;
    store_node_got_reply(n);
    if (reply == NULL || n->handshake_failed)
        return;                     /* disconnecting, or the rest of a failure */
    const char *why = NULL;
    if (reply->type == REDIS_REPLY_ERROR)
        why = reply->str;
    else if (strcmp(step, "ROLE") == 0 && !store_node_is_master(reply))
        why = "not a master (a failover is under way)";
    else if (strcmp(step, "SENTINEL") == 0 && node_take_master(n, reply) != 0)
        why = "the sentinel does not know the master";
    else if (strcmp(step, "SCRIPT LOAD") == 0 &&
             (reply->type != REDIS_REPLY_STRING || strcmp(reply->str, limit_lua_sha) != 0))
        log_warn("store: script sha mismatch '%s': redis says %s, built %s", n->name,
                 reply->type == REDIS_REPLY_STRING ? reply->str : "?", limit_lua_sha);
    if (why != NULL) {
        /* once per outage, not at every retry */
        if (!n->down_logged)
            log_error("store: %s failed '%s': %s", step, n->name, why);
        n->handshake_failed = 1;
        store_node_kill_later(n, "handshake failed");
        return;
    }
    if (--n->hs_left == 0)
        node_ready(n);
}

static int node_send_handshake(struct store_node *n, const char *step,
                               int argc, const char **argv)
{
    size_t len[4];              /* AUTH user password is the longest step */
    assert(argc <= (int)(sizeof(len) / sizeof(len[0])));
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    if (rconn_send_argv(n->ac, argc, argv, len, node_handshake_cb, (void *)step) != 0)
        return -1;
    store_node_expect_reply(n);
    n->hs_left++;
    return 0;
}

/* The script reload after NOSCRIPT; its reply only needs checking. */
static void node_script_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    if (n == NULL || n->s->destroying)
        return;
    store_node_got_reply(n);
    if (n->script_loads > 0)
        n->script_loads--;
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR)
        log_error("store: SCRIPT LOAD failed '%s': %s", n->name, reply->str);
}

/* Commands are answered in order, so one SCRIPT LOAD already in the pipeline
 * serves every resend queued after it. */
int store_node_load_scripts(struct store_node *n)
{
    if (n->script_loads > 0)
        return 0;
    const char *scripts[2] = { limit_lua, refund_lua };
    int nscripts = 2;           /* refund.lua also gives slots back (store_give_back) */
    for (int i = 0; i < nscripts; i++) {
        const char *argv[3] = { "SCRIPT", "LOAD", scripts[i] };
        size_t len[3] = { 6, 4, strlen(scripts[i]) };
        if (rconn_send_argv(n->ac, 3, argv, len, node_script_cb, NULL) != 0)
            return -1;
        store_node_expect_reply(n);
        n->script_loads++;
    }
    return 0;
}

/* Pipelined: replies come back in this order; the last makes the node ready. */
static int node_handshake(struct store_node *n)
{
    struct store *s = n->s;
    const char *user = s->rc.user, *password = s->rc.password;
    int rc = 0;
    if (n->role == NODE_CTL && s->mode == STORE_SENTINEL) {
        user = NULL;
        password = s->rc.sentinel_password;
    }
    if (password != NULL) {
        const char *auth[3] = { "AUTH", NULL, NULL };
        int argc = 1;
        if (user != NULL)
            auth[argc++] = user;
        auth[argc++] = password;
        rc |= node_send_handshake(n, "AUTH", argc, auth);
    }
    if (n->role == NODE_CTL && s->mode == STORE_SENTINEL) {
        const char *q[3] = { "SENTINEL", "get-master-addr-by-name", s->rc.sentinel_master };
        return rc | node_send_handshake(n, "SENTINEL", 3, q);
    }
    if (n->role == NODE_CTL) {
        const char *ping[1] = { "PING" };
        return rc | node_send_handshake(n, "PING", 1, ping);
    }
    char db[16];
    if (s->rc.db != 0 && s->mode != STORE_CLUSTER) {
        const char *select[2] = { "SELECT", db };
        snprintf(db, sizeof(db), "%d", s->rc.db);
        rc |= node_send_handshake(n, "SELECT", 2, select);
    }
    if (s->mode == STORE_SENTINEL) {
        const char *role[1] = { "ROLE" };
        rc |= node_send_handshake(n, "ROLE", 1, role);
    }
    const char *load[3] = { "SCRIPT", "LOAD", limit_lua };
    rc |= node_send_handshake(n, "SCRIPT LOAD", 3, load);
    /* refund.lua: cluster refunds, and everywhere the release of concurrency
     * slots and of delayed requests' reservations */
    const char *refund[3] = { "SCRIPT", "LOAD", refund_lua };
    rc |= node_send_handshake(n, "SCRIPT LOAD refund", 3, refund);
    return rc;
}

static void node_connect_cb(struct rconn *ac, int status, const char *why)
{
    struct store_node *n = rconn_data(ac);
    if (n == NULL || n->s->destroying)
        return;
    if (status != 0) {
        node_down(n, why);          /* ac is freed when this returns */
        return;
    }
    if (node_handshake(n) != 0)
        store_node_kill_later(n, "cannot queue the handshake");
}

static void node_disconnect_cb(struct rconn *ac, const char *why)
{
    struct store_node *n = rconn_data(ac);
    if (n == NULL || n->dropping || n->s->destroying)
        return;
    node_down(n, why);              /* ac is freed when this returns */
}

static void node_connect_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    store_node_drop(arg, "connect timed out");
}

static void node_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    node_connect(arg);
}

static void node_connect(struct store_node *n)
{
    struct store *s = n->s;
    if (!n->active || n->ac != NULL || s->destroying)
        return;
    if (s->tls_failed) {
        node_down(n, "no TLS context (see the error above)");
        return;
    }
    /* never calls back from inside: n->ac is set before anything happens */
    n->ac = rconn_connect(s->base, s->dns, s->tls, n->host, n->port, n->is_unix,
                          node_connect_cb, node_disconnect_cb, n);
    n->handshake_failed = 0;
    n->hs_left = 0;
    n->inflight = 0;
    n->script_loads = 0;
    int64_t budget_ms = 2 * s->rc.timeout_ms;
    if (budget_ms < STORE_CONNECT_MIN_MS)
        budget_ms = STORE_CONNECT_MIN_MS;
    struct timeval tv = clock_timeval(budget_ms);
    event_add(n->connect_ev, &tv);
}

void store_node_set_addr(struct store_node *n, const char *host, int port, int is_unix)
{
    free(n->host);
    n->host = store_strdup(host);
    n->port = port;
    n->is_unix = is_unix;
    if (is_unix)
        snprintf(n->name, sizeof(n->name), "%s", host);
    else if (strchr(host, ':') != NULL)
        snprintf(n->name, sizeof(n->name), "[%s]:%d", host, port);
    else
        snprintf(n->name, sizeof(n->name), "%s:%d", host, port);
}

struct store_node *store_node_new(struct store *s, enum node_role role,
                                  const char *host, int port, int is_unix)
{
    struct store_node *n = mem_calloc(1, sizeof(*n));
    n->s = s;
    n->role = role;
    store_node_set_addr(n, host ? host : "?", port, is_unix);
    n->backoff_ms = STORE_BACKOFF_MIN_MS;
    n->retry_ev = store_timer(s, node_retry_cb, n);
    n->connect_ev = store_timer(s, node_connect_timeout_cb, n);
    n->kill_ev = event_new(s->base, -1, 0, node_kill_cb, n);
    if (n->kill_ev == NULL)
        abort();
    return n;
}

/* Wanted from now on: connect at once unless already connected or waiting
 * for a retry. */
void store_node_start(struct store_node *n)
{
    n->active = 1;
    if (n->ac == NULL && !evtimer_pending(n->retry_ev, NULL))
        node_connect(n);
}

/* No longer wanted: close the connection (its requests go elsewhere). */
void store_node_stop(struct store_node *n)
{
    n->active = 0;
    event_del(n->retry_ev);
    if (n->ac != NULL)
        store_node_kill_later(n, "no longer a master");
}

/* Point the node at another server (sentinel: the new master; cluster ctl:
 * the next candidate) and reconnect soon. */
void store_node_move(struct store_node *n, const char *host, int port)
{
    store_node_set_addr(n, host, port, 0);
    n->backoff_ms = STORE_BACKOFF_MIN_MS;
    n->down_logged = 0;
    if (n->ac != NULL) {
        store_node_kill_later(n, "moving to another server");
    } else if (n->active) {
        event_del(n->retry_ev);
        struct timeval tv = clock_timeval(0);
        n->retry_at_ms = clock_ms();
        event_add(n->retry_ev, &tv);    /* not from inside a connection's callback */
    }
}

void store_node_free(struct store_node *n)
{
    event_free(n->retry_ev);
    event_free(n->connect_ev);
    event_free(n->kill_ev);
    free(n->host);
    free(n);
}
