/* sluice - store.c: rate-limit decisions in Redis, single, Cluster or Sentinel.
 *
 * With rconn.c, the only user of hiredis (as a reply parser). A store owns
 * one or more nodes (rconn connections: handshake, backoff, stall detection,
 * requests waiting for a connection being made), sends the decisions of
 * each loop iteration as one EVALSHA of scripts/limit.lua per node (and
 * slot), splits the reply back per call, and turns replies, errors and
 * timeouts into exactly one callback per call. Redis Cluster (hiredis 0.14
 * has none) is built here: CRC16 slots, CLUSTER SLOTS on a control
 * connection, MOVED/ASK/TRYAGAIN, and per-slot groups with refund.lua when a
 * route spans slots. Sentinel: a control connection asks for the master and
 * listens for +switch-master. See store.h for the contract. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/dns.h>

#include "addr.h"
#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "rconn.h"
#include "store.h"

/* Generated from scripts/NAME.lua by the Makefile (build/NAME_lua.c). */
extern const char limit_lua[];
extern const char limit_lua_sha[];
extern const char refund_lua[];
extern const char refund_lua_sha[];

#define STORE_BACKOFF_MIN_MS 100
#define STORE_BACKOFF_MAX_MS 500     /* limiting must resume within 1 s of Redis returning */
#define STORE_CONNECT_MIN_MS 1000     /* connect + handshake budget floor */
#define STORE_SLOTS 16384
#define STORE_MAX_NODES 1024
#define STORE_WAIT_MS 20              /* no usable node yet: look again after */
#define STORE_MAX_REDIRECTS 8         /* per request: MOVED/ASK loops end here */
#define STORE_REFRESH_MIN_MS 100      /* between two CLUSTER SLOTS */
#define STORE_REFRESH_EVERY_MS 5000   /* even when nothing asks for it */
#define STORE_REFUND_BUDGET_MS 2000   /* a refund is retried this long */
#define STORE_REDIRECT_LOG_MS 1000    /* one info line per kind this often */
#define STORE_OOM_LOG_MS 10000        /* one "out of memory" warning this often */
#define STORE_DNS_LINGER_MS 1000      /* a resolver outlives its store's cancelled lookups */
#define STORE_BATCH_MAX 64            /* requests (a call's limits of one slot) per EVALSHA */
#define STORE_BATCH_KEY_BYTES 65536   /* and their keys' bytes: a fuller batch is closed */
#define STORE_BATCH_ENTRIES (STORE_BATCH_MAX * STORE_MAX_LIMITS)
#define STORE_BATCH_KEYS (2 * STORE_BATCH_ENTRIES)  /* counters and override keys */
#define STORE_BATCH_HASH (2 * STORE_BATCH_KEYS)     /* open addressing, a power of 2 */

enum store_mode { STORE_SINGLE, STORE_CLUSTER, STORE_SENTINEL };
/* A data node runs the scripts; the control node asks the topology
 * (CLUSTER SLOTS, or a sentinel). */
enum node_role { NODE_DATA, NODE_CTL };

struct store_node {
    struct store *s;
    enum node_role role;
    char *host;                     /* or the socket path */
    int port;
    int is_unix;
    char name[300];                 /* "host:port", for logs */
    struct rconn *ac;               /* NULL while disconnected */
    int active;                     /* wanted: (re)connects; 0 = retired */
    int ready;                      /* connected and handshake done */
    int hs_left;                    /* handshake replies still due */
    int handshake_failed;
    int dropping;                   /* inside node_drop(): ignore onDisconnect */
    int down_logged;                /* "down" logged since the last "connected" */
    int64_t backoff_ms;
    struct event *retry_ev;         /* reconnect after backoff */
    int64_t retry_at_ms;            /* when retry_ev fires (clock_ms) */
    struct event *connect_ev;       /* connect + handshake deadline */
    struct event *kill_ev;          /* drop the connection outside its callbacks */
    const char *kill_reason;
    int inflight;                   /* our commands awaiting replies */
    int64_t progress_ms;            /* last reply, or when inflight rose from 0 */
    int script_loads;               /* SCRIPT LOADs awaiting replies */
    int in_map;                     /* cluster: owns slots in the last map */
    int slots_inflight;             /* ctl: CLUSTER SLOTS awaiting its reply */
};

/* One EVALSHA on one slot: a group of a call's limits, or a refund. A
 * request is in a connection at most once at a time (it is resent only from its
 * own reply or from its wait timer), and is released only outside it. */
struct store_req {
    struct store *s;
    struct store_call *call;        /* NULL: a refund, which owns itself */
    struct store_req *next, *prev;  /* the store's refunds */
    int slot;                       /* -1 outside a cluster */
    struct store_node *node;        /* where it was last sent */
    struct store_node *ask;         /* ASK: send ASKING and the command here */
    int asked;                      /* the last send went with ASKING */
    struct event *wait_ev;          /* resend after STORE_WAIT_MS */
    int in_hiredis;                 /* in a connection's reply FIFO (rconn) */
    int done;                       /* replied, or given up */
    int noscript_tried;
    int redirects;
    int64_t deadline_ms;            /* refunds: give up after this */
    char *cmd;                      /* RESP, kept for resending */
    size_t cmdlen, cmdcap;
    int n;
    int idx[STORE_MAX_LIMITS];      /* which limits of the call */
    int allowed;
    int64_t time_s, time_us;        /* with marks (m < 0): TIME the script ran at */
    int64_t mark[STORE_MAX_LIMITS];
};

/* A call's life: it leaves the free list in store_decide(), is answered at
 * most once (reply, error or timeout; or cancelled, which also counts), and
 * returns to the free list only when it is answered AND no connection holds
 * any of its requests, so a late reply never touches a reused call. */
struct store_call {
    struct store *s;
    struct store_call *next;        /* free list */
    struct store_call *all_next;    /* every call ever made, for destroy */
    struct event *timer;            /* created once, reused */
    store_cb *cb;
    void *arg;
    int answered;
    int pooled;
    int n;
    struct limiter_params params[STORE_MAX_LIMITS];
    int64_t cost[STORE_MAX_LIMITS];
    unsigned flags[STORE_MAX_LIMITS];
    int64_t slot[STORE_MAX_LIMITS];  /* concurrency: the request's slot id */
    char *keys;                     /* every key, back to back */
    size_t keycap;
    size_t koff[STORE_MAX_LIMITS], klen[STORE_MAX_LIMITS];
    size_t ooff[STORE_MAX_LIMITS];  /* redis.overrides: each override key, in keys,
                                     * klen + the suffix's length long */
    int nreq;
    int pending;                    /* requests not replied yet */
    struct store_req req[STORE_MAX_LIMITS];
    struct store_result res;
};

/* The decisions a worker makes in one loop iteration for one node (and,
 * in a cluster, one slot: a script's keys must share it) travel in one
 * EVALSHA: requests are appended while the loop runs and the batch is sent
 * by flush_ev, once the iteration's other callbacks have run. A batch
 * holds its requests (in_hiredis) from store_batch_add() until its reply,
 * or its failure, is handed to each of them. */
struct store_batch {
    struct store *s;
    struct store_batch *next;       /* the open list, or the free list */
    struct store_batch *all_next;   /* every batch ever made, for destroy */
    struct store_node *node;
    int slot;                       /* -1 outside a cluster */
    int asked;                      /* ASK: sent alone, after ASKING */
    int n;
    size_t key_bytes;
    struct store_req *req[STORE_BATCH_MAX];
    int marks[STORE_BATCH_MAX];     /* request i's reply carries refund marks */
    long long *ints;                /* the reply's integers, parsed by rconn into */
    size_t intcap;                  /* (kept for the batch's next use) */
};

/* Scratch of the batch encoder: the distinct keys and parameter sets of
 * one batch (limit.lua takes each once) and each entry's indexes. */
struct store_batch_enc {
    int16_t khash[STORE_BATCH_HASH], phash[STORE_BATCH_HASH];   /* index + 1, 0 = empty */
    const char *kp[STORE_BATCH_KEYS];
    size_t kl[STORE_BATCH_KEYS];
    int64_t pv[STORE_BATCH_ENTRIES][4];     /* algo limit window_ms interval_us, as sent */
    int ki[STORE_BATCH_ENTRIES], pi[STORE_BATCH_ENTRIES], oi[STORE_BATCH_ENTRIES];
    int16_t kslot[STORE_BATCH_KEYS], pslot[STORE_BATCH_ENTRIES];   /* to clear the tables */
    int nk, np;
};

struct store_addr {
    char *host;
    int port;
};

struct store {
    struct event_base *base;
    struct conf_redis rc;           /* strings owned (copied) */
    enum store_mode mode;
    struct store_node **nodes;      /* data nodes; single and sentinel: one */
    int nnodes, capnodes;
    struct store_node *ctl;         /* cluster or sentinel control connection */
    struct store_addr *seeds;       /* cluster seeds, or the sentinels */
    int nseeds;
    int cand;                       /* the ctl's current candidate address */
    int16_t owner[STORE_SLOTS];     /* slot -> index in nodes, -1 unknown */
    int map_known;                  /* some slots known */
    int map_complete;               /* every slot known */
    int ready;
    int counted;                    /* ready counts in sluice_redis_connected */
    int destroying;
    int in_user_cb;                 /* depth of user callbacks on the stack */
    struct event *refresh_ev;
    struct event *periodic_ev;
    int64_t last_refresh_ms;
    int refresh_wanted;
    struct store_call *free_calls, *all_calls;
    struct store_req *refunds;
    uint64_t redirects[2];          /* ask, moved: this store's */
    int64_t redirect_logged_ms[2];
    int64_t oom_logged_ms;
    struct evdns_base *dns;         /* names resolve here, never on getaddrinfo */
    struct rconn_tls *tls;          /* NULL: plain connections */
    int tls_failed;                 /* TLS wanted, the context did not load */
    struct event *flush_ev;         /* sends the open batches, once per iteration */
    struct store_batch *open, *open_tail;   /* batches still taking requests, in order */
    struct store_batch *single_open;        /* outside a cluster: the one open batch */
    struct store_batch **slot_open;         /* cluster: slot -> its open batch */
    struct store_batch *free_batches, *all_batches;
    struct store_batch_enc *enc;
    char *bcmd;                     /* the batch being encoded (rconn copies it) */
    size_t bcmdcap;
};

static void node_connect(struct store_node *n);
static void node_drop(struct store_node *n, const char *reason);
static void store_node_lost(struct store *s, struct store_node *n);
static void store_node_up(struct store *s, struct store_node *n);
static void store_refresh_soon(struct store *s);
static int req_dispatch(struct store_req *q);
static void req_wait(struct store_req *q);
static void req_settle(struct store_req *q);
static void store_kick_waiting(struct store *s);
static void store_batch_add(struct store_node *n, struct store_req *q);

static char *store_strdup(const char *p)
{
    return p ? mem_strndup(p, strlen(p)) : NULL;
}

static struct event *store_timer(struct store *s, event_callback_fn fn, void *arg)
{
    struct event *ev = evtimer_new(s->base, fn, arg);
    if (ev == NULL) {
        log_error("store: cannot create a timer");
        abort();
    }
    return ev;
}

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

/* ---- readiness ----------------------------------------------------------- */

/* Single and sentinel: the data node is ready. Cluster: every slot has a
 * master, and each of them is connected. */
static void store_update_ready(struct store *s)
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

void store_count_ready(struct store *s, int on)
{
    on = on != 0;
    if (s->counted == on)
        return;
    if (s->ready)
        metrics_gauge_add(METRICS_REDIS_CONNECTED, on ? 1 : -1);
    s->counted = on;
}

static void node_set_ready(struct store_node *n, int ready)
{
    n->ready = ready;
    store_update_ready(n->s);
}

/* ---- nodes: one connection each ------------------------------------------ */

static void node_expect_reply(struct store_node *n)
{
    if (n->inflight++ == 0)
        n->progress_ms = clock_ms();
}

static void node_got_reply(struct store_node *n)
{
    if (n->inflight > 0)
        n->inflight--;
    n->progress_ms = clock_ms();
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
    node_set_ready(n, 0);
    if (s->destroying)
        return;
    store_node_lost(s, n);
    if (!n->active)
        return;
    node_log_down(n, reason, n->backoff_ms);
    struct timeval tv = clock_timeval(n->backoff_ms);
    n->retry_at_ms = clock_ms() + n->backoff_ms;
    event_add(n->retry_ev, &tv);
    n->backoff_ms *= 2;
    if (n->backoff_ms > STORE_BACKOFF_MAX_MS)
        n->backoff_ms = STORE_BACKOFF_MAX_MS;
    store_kick_waiting(s);          /* what waited for this attempt fails now */
}

/* From inside a connection's callback it is not dropped (that would run
 * every pending callback, the store's own among them, underneath): ask the
 * event loop to do it once the stack has unwound. */
static void node_kill_later(struct store_node *n, const char *reason)
{
    node_set_ready(n, 0);
    n->kill_reason = reason;
    event_active(n->kill_ev, EV_TIMEOUT, 0);
}

static void node_kill_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_node *n = arg;
    if (n->ac != NULL)
        node_drop(n, n->kill_reason);
}

/* Free the connection from outside its callbacks. Pending requests get
 * NULL replies (already answered ones are merely released). */
static void node_drop(struct store_node *n, const char *reason)
{
    struct rconn *ac = n->ac;
    node_set_ready(n, 0);
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
    node_set_ready(n, 1);
    log_info("store: redis '%s' connected%s", n->name,
             n->role == NODE_CTL ? (n->s->mode == STORE_CLUSTER ?
                                    " (cluster topology)" : " (sentinel)") : "");
    store_node_up(n->s, n);
    store_kick_waiting(n->s);       /* what waited for the connection goes now */
}

static void store_set_master(struct store *s, const char *host, int port);

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
    store_set_master(n->s, reply->element[0]->str, port);
    return 0;
}

static int node_is_master(const redisReply *reply)
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
    node_got_reply(n);
    if (reply == NULL || n->handshake_failed)
        return;                     /* disconnecting, or the rest of a failure */
    const char *why = NULL;
    if (reply->type == REDIS_REPLY_ERROR)
        why = reply->str;
    else if (strcmp(step, "ROLE") == 0 && !node_is_master(reply))
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
        node_kill_later(n, "handshake failed");
        return;
    }
    if (--n->hs_left == 0)
        node_ready(n);
}

static int node_send_handshake(struct store_node *n, const char *step,
                               int argc, const char **argv)
{
    size_t len[4];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    if (rconn_send_argv(n->ac, argc, argv, len, node_handshake_cb, (void *)step) != 0)
        return -1;
    node_expect_reply(n);
    n->hs_left++;
    return 0;
}

/* The script reload after NOSCRIPT; its reply only needs checking. */
static void node_script_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    if (n == NULL || n->s->destroying)
        return;
    node_got_reply(n);
    if (n->script_loads > 0)
        n->script_loads--;
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR)
        log_error("store: SCRIPT LOAD failed '%s': %s", n->name, reply->str);
}

/* Commands are answered in order, so one SCRIPT LOAD already in the pipeline
 * serves every resend queued after it. */
static int node_load_scripts(struct store_node *n)
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
        node_expect_reply(n);
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
        node_kill_later(n, "cannot queue the handshake");
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
    node_drop(arg, "connect timed out");
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

static void node_set_addr(struct store_node *n, const char *host, int port, int is_unix)
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

static struct store_node *node_new(struct store *s, enum node_role role,
                                   const char *host, int port, int is_unix)
{
    struct store_node *n = mem_calloc(1, sizeof(*n));
    n->s = s;
    n->role = role;
    node_set_addr(n, host ? host : "?", port, is_unix);
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
static void node_start(struct store_node *n)
{
    n->active = 1;
    if (n->ac == NULL && !evtimer_pending(n->retry_ev, NULL))
        node_connect(n);
}

/* No longer wanted: close the connection (its requests go elsewhere). */
static void node_stop(struct store_node *n)
{
    n->active = 0;
    event_del(n->retry_ev);
    if (n->ac != NULL)
        node_kill_later(n, "no longer a master");
}

/* Point the node at another server (sentinel: the new master; cluster ctl:
 * the next candidate) and reconnect soon. */
static void node_move(struct store_node *n, const char *host, int port)
{
    node_set_addr(n, host, port, 0);
    n->backoff_ms = STORE_BACKOFF_MIN_MS;
    n->down_logged = 0;
    if (n->ac != NULL) {
        node_kill_later(n, "moving to another server");
    } else if (n->active) {
        event_del(n->retry_ev);
        struct timeval tv = clock_timeval(0);
        n->retry_at_ms = clock_ms();
        event_add(n->retry_ev, &tv);    /* not from inside a connection's callback */
    }
}

static void node_free(struct store_node *n)
{
    event_free(n->retry_ev);
    event_free(n->connect_ev);
    event_free(n->kill_ev);
    free(n->host);
    free(n);
}

/* ---- cluster: the slot map ------------------------------------------------ */

static int store_node_index(struct store *s, const char *host, int port)
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
    s->nodes[s->nnodes] = node_new(s, NODE_DATA, host, port, 0);
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
        int idx = store_node_index(s, host, (int)port);
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
            node_start(n);
        else if (!n->in_map && n->active)
            node_stop(n);
    }
    store_update_ready(s);
}

static void store_slots_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    struct store *s = n->s;
    if (s->destroying)
        return;
    node_got_reply(n);
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
        store_refresh_soon(s);
}

static void store_refresh_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    struct store_node *n = s->ctl;
    if (!n->ready || n->ac == NULL || n->slots_inflight)
        return;                 /* asked again when it is ready, or replies */
    const char *argv[2] = { "CLUSTER", "SLOTS" };
    size_t len[2] = { 7, 5 };
    if (rconn_send_argv(n->ac, 2, argv, len, store_slots_cb, NULL) != 0)
        return;
    node_expect_reply(n);
    n->slots_inflight = 1;
    s->refresh_wanted = 0;
    s->last_refresh_ms = clock_ms();
}

/* At most one CLUSTER SLOTS every STORE_REFRESH_MIN_MS, however many
 * redirects and lost connections ask for it. */
static void store_refresh_soon(struct store *s)
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

static void store_periodic_cb(evutil_socket_t fd, short what, void *arg)
{
    store_refresh_soon(arg);
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
    node_set_addr(s->ctl, host, port, 0);
}

/* ---- sentinel -------------------------------------------------------------- */

static void store_set_master(struct store *s, const char *host, int port)
{
    struct store_node *n = s->nodes[0];
    if (n->active && n->port == port && strcmp(n->host, host) == 0)
        return;
    log_info("store: sentinel master '%s' is %s:%d", s->rc.sentinel_master, host, port);
    if (!n->active) {
        node_set_addr(n, host, port, 0);
        node_start(n);
    } else {
        node_move(n, host, port);
    }
}

/* "+switch-master" carries "NAME OLDIP OLDPORT NEWIP NEWPORT". */
static void store_switch_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    if (n == NULL || n->s->destroying || reply == NULL)
        return;
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(reply->element[0]->str, "message") != 0 ||
        reply->element[2]->type != REDIS_REPLY_STRING)
        return;                 /* the subscribe confirmation */
    char name[256], oldip[64], newip[64];
    int oldport, newport;
    /* Counted fields and a bounded port: the conversions are checked. */
    if (sscanf(reply->element[2]->str, "%255s %63s %d %63s %d",  // NOLINT(cert-err34-c)
               name, oldip, &oldport, newip, &newport) != 5 ||
        strcmp(name, n->s->rc.sentinel_master) != 0 || newport < 1 || newport > 65535)
        return;
    log_info("store: sentinel '%s' switched master '%s' to %s:%d", n->name, name,
             newip, newport);
    store_set_master(n->s, newip, newport);
}

/* ---- what the store does when nodes come and go ---------------------------- */

static void store_node_up(struct store *s, struct store_node *n)
{
    if (n != s->ctl)
        return;
    if (s->mode == STORE_CLUSTER) {
        store_refresh_soon(s);
    } else if (s->mode == STORE_SENTINEL &&
               rconn_subscribe(n->ac, 2, (const char *[]){ "SUBSCRIBE", "+switch-master" },
                               store_switch_cb, NULL) != 0) {
        node_kill_later(n, "cannot subscribe");
    }
}

static void store_node_lost(struct store *s, struct store_node *n)
{
    if (n == s->ctl) {
        if (s->mode == STORE_CLUSTER)
            s->refresh_wanted = 1;
        store_ctl_next(s);
    } else if (s->mode == STORE_CLUSTER) {
        store_refresh_soon(s);
    } else if (s->mode == STORE_SENTINEL && s->ctl != NULL && s->ctl->ready) {
        /* the master may have changed while we were not listening: ask the
         * sentinels again (the subscribed connection cannot) */
        node_kill_later(s->ctl, "asking for the master again");
    }
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
static int store_connecting(const struct store *s)
{
    if (s->mode == STORE_CLUSTER || s->nnodes == 0)
        return 0;
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
static void store_kick_waiting(struct store *s)
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
    for (struct store_req *q = s->refunds; q != NULL; q = q->next)
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
    c->timer = NULL;
    c->all_next = s->all_calls;
    s->all_calls = c;
    for (int i = 0; i < STORE_MAX_LIMITS; i++) {
        c->req[i].s = s;
        c->req[i].call = c;
    }
    return c;
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
    event_del(c->timer);
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

/* Decimal digits of v (>= 0) written backwards from end; returns the start. */
static char *store_fmt_u64(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

static char *store_put(char *p, const char *src, size_t len)
{
    memcpy(p, src, len);
    return p + len;
}

/* One RESP bulk string: "$LEN\r\nDATA\r\n". */
static char *store_put_bulk(char *p, const char *data, size_t len)
{
    char num[24];
    char *start = store_fmt_u64(num + sizeof(num), len);
    *p++ = '$';
    p = store_put(p, start, (size_t)(num + sizeof(num) - start));
    p = store_put(p, "\r\n", 2);
    p = store_put(p, data, len);
    return store_put(p, "\r\n", 2);
}

static char *store_put_int(char *p, int64_t v)
{
    char num[24];
    char *end = num + sizeof(num);
    char *start = store_fmt_u64(end, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
    if (v < 0)
        *--start = '-';
    return store_put_bulk(p, start, (size_t)(end - start));
}

/* A command buffer of at least need bytes (its old contents dropped). */
static void store_cmd_room(char **buf, size_t *cap, size_t need)
{
    if (*cap >= need)
        return;
    free(*buf);
    *buf = mem_alloc(need);
    *cap = need;
}

static char *store_put_header(char *p, int argc)
{
    char num[24];
    char *start = store_fmt_u64(num + sizeof(num), (uint64_t)argc);
    *p++ = '*';
    p = store_put(p, start, (size_t)(num + sizeof(num) - start));
    return store_put(p, "\r\n", 2);
}

/* refund.lua's call: EVALSHA sha n key_1..key_n args[0..nargs) n
 * (algo limit window_ms interval_us cost last_i)*n for the call's limits
 * li[0..n), straight into q->cmd: RESP as redisFormatCommandArgv would build
 * it, and keeping it lets a retry resend it after the caller's keys are
 * gone. args is the TIME of the decision, last the marks. The buffer grows
 * to the largest request seen, then is reused. (limit.lua's batches:
 * store_batch_encode.) */
static void store_encode_evalsha(struct store_req *q, const struct store_call *c,
                                 const char *sha, const int *li, int n,
                                 const int64_t *args, int nargs, const int64_t *last)
{
    int argc = 3 + n + nargs + 1 + 6 * n;
    /* 24 bytes of bulk framing per argument bound every number's digits too */
    size_t need = 16 + (size_t)argc * (24 + 24) + 80;
    for (int i = 0; i < n; i++)
        need += c->klen[li[i]];
    store_cmd_room(&q->cmd, &q->cmdcap, need);
    char *p = store_put_header(q->cmd, argc);
    p = store_put_bulk(p, "EVALSHA", 7);
    p = store_put_bulk(p, sha, strlen(sha));
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++)
        p = store_put_bulk(p, c->keys + c->koff[li[i]], c->klen[li[i]]);
    for (int i = 0; i < nargs; i++)
        p = store_put_int(p, args[i]);
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++) {
        const struct limiter_params *lp = &c->params[li[i]];
        /* delay: the window's place carries it (flag 4); concurrency: the
         * interval's carries the slot id */
        int64_t window = lp->delay_ms > 0 ? lp->delay_ms : lp->window_ms;
        int64_t interval = lp->algo == LIMITER_CONCURRENCY ? c->slot[li[i]] : lp->interval_us;
        p = store_put_int(p, (int64_t)lp->algo);
        p = store_put_int(p, lp->limit);
        p = store_put_int(p, window);
        p = store_put_int(p, interval);
        p = store_put_int(p, c->cost[li[i]]);
        p = store_put_int(p, last[i]);
    }
    q->cmdlen = (size_t)(p - q->cmd);
    assert(q->cmdlen <= q->cmdcap);
}

/* ---- refunds ---------------------------------------------------------------- */

static void store_refund_release(struct store_req *q)
{
    if (q->wait_ev != NULL)
        event_free(q->wait_ev);
    free(q->cmd);
    free(q);
}

static void store_refund_free(struct store_req *q)
{
    struct store *s = q->s;
    if (q->prev != NULL)
        q->prev->next = q->next;
    else
        s->refunds = q->next;
    if (q->next != NULL)
        q->next->prev = q->prev;
    store_refund_release(q);
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
    store_encode_evalsha(q, c, refund_lua_sha, li, n, times, 2, marks);
    q->next = s->refunds;
    if (s->refunds != NULL)
        s->refunds->prev = q;
    s->refunds = q;
    if (req_dispatch(q) != 0) {
        q->done = 1;
        req_settle(q);
    }
}

/* One limit's give-back (store.h): refund.lua with TIME 0 0 (only
 * sliding_log reads it) and the slot id as the mark, sent like a refund. */
void store_give_back(struct store *s, const struct store_limit *l)
{
    struct store_call tmp;
    int li[1] = { 0 };
    int64_t times[2] = { 0, 0 }, marks[1] = { l->slot };
    if (l->params->algo == LIMITER_CONCURRENCY ? l->slot < 1 :
        l->params->algo != LIMITER_TOKEN_BUCKET && l->params->algo != LIMITER_GCRA)
        return;
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
    store_encode_evalsha(q, &tmp, refund_lua_sha, li, 1, times, 2, marks);
    q->next = s->refunds;
    if (s->refunds != NULL)
        s->refunds->prev = q;
    s->refunds = q;
    if (req_dispatch(q) != 0) {
        q->done = 1;
        req_settle(q);
    }
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

static int req_abandoned(const struct store_req *q)
{
    return q->call != NULL ? q->call->answered : q->done;
}

/* A request no longer in a connection may be released: a refund when done, a
 * call when answered and idle. */
static void req_settle(struct store_req *q)
{
    if (q->in_hiredis)
        return;
    if (q->call != NULL)
        store_call_settle(q->call);
    else if (q->done)
        store_refund_free(q);
}

static void req_finish(struct store_req *q, enum store_status status)
{
    q->done = 1;
    if (q->call != NULL && !q->call->answered)
        store_call_fail(q->call, status);
}

static void req_wait_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_req *q = arg;
    if (req_abandoned(q))
        return;
    if (req_dispatch(q) != 0)
        req_finish(q, STORE_ERROR);
    req_settle(q);              /* a refund past its deadline is freed */
}

/* No usable node now (cluster): look again shortly. A call's own timer
 * bounds how long; a refund has its deadline. */
static void req_wait(struct store_req *q)
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
    if (s->mode != STORE_CLUSTER)
        return s->nodes[0];
    int i = s->owner[q->slot];
    return i >= 0 ? s->nodes[i] : NULL;
}

static void req_asking_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_node *n = rconn_data(ac);
    if (n != NULL && !n->s->destroying)
        node_got_reply(n);
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
            req_wait(q);            /* sent when the connection is up */
            return 0;
        }
        if (s->mode != STORE_CLUSTER)
            return -1;
        /* a master that is down may have been replaced: ask (rate-limited) */
        store_refresh_soon(s);
        if (n != NULL)
            node_start(n);
        req_wait(q);
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
        if (rconn_send(n->ac, "*1\r\n$6\r\nASKING\r\n", 16, req_asking_cb, NULL) != 0)
            goto fail;
        node_expect_reply(n);
    }
    if (rconn_send(n->ac, q->cmd, q->cmdlen, req_reply_cb, q) != 0)
        goto fail;
    q->in_hiredis = 1;
    q->node = n;
    node_expect_reply(n);
    return 0;
fail:
    if (s->mode != STORE_CLUSTER)
        return -1;
    req_wait(q);
    return 0;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381". */
static struct store_node *store_redirect_node(struct store *s, const char *err, int *slot)
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
    int idx = store_node_index(s, host, port);
    if (idx < 0)
        return NULL;
    *slot = (int)k;
    return s->nodes[idx];
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
    struct store_node *to = store_redirect_node(s, err, &slot);
    if (to == NULL || ++q->redirects > STORE_MAX_REDIRECTS)
        return -1;
    store_count_redirect(s, ask ? 0 : 1, slot, to);
    if (ask) {
        q->ask = to;
    } else {
        for (int i = 0; i < s->nnodes; i++)
            if (s->nodes[i] == to)
                s->owner[slot] = (int16_t)i;
        store_refresh_soon(s);
    }
    if (!to->active)
        node_start(to);
    return req_dispatch(q);
}

/* An error reply: NOSCRIPT reloads and resends once; MOVED and ASK follow
 * the redirect; TRYAGAIN and a cluster in transition wait and resend. */
static int req_error(struct store_req *q, struct store_node *n, const char *err)
{
    struct store *s = q->s;
    if (strncmp(err, "NOSCRIPT", 8) == 0) {
        if (q->noscript_tried || n->ac == NULL || node_load_scripts(n) != 0)
            return -1;
        q->noscript_tried = 1;
        if (q->asked)
            q->ask = n;
        return req_dispatch(q);
    }
    if (s->mode != STORE_CLUSTER) {
        if (s->mode == STORE_SENTINEL && strncmp(err, "READONLY", 8) == 0)
            node_kill_later(n, "the master became a replica");
        return -1;
    }
    if (strncmp(err, "MOVED ", 6) == 0 || strncmp(err, "ASK ", 4) == 0)
        return req_redirect(q, err);
    if (strncmp(err, "TRYAGAIN", 8) == 0 || strncmp(err, "CLUSTERDOWN", 11) == 0 ||
        strncmp(err, "LOADING", 7) == 0 || strncmp(err, "MASTERDOWN", 10) == 0 ||
        strncmp(err, "READONLY", 8) == 0) {
        if (strncmp(err, "TRYAGAIN", 8) != 0)
            store_refresh_soon(s);
        req_wait(q);
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

static void store_parse_batch(struct store_req *q, const long long *v, size_t at, int marks);

/* One request's share of a reply, its own (a refund) or its batch's (a
 * decision, whose fields start at `at` in the batch's integers v;
 * readable: the batch reply has the shape limit.lua gives): a lost
 * connection, an error reply, or its decisions. */
static void req_take(struct store_req *q, struct store_node *n, const redisReply *reply,
                     const long long *v, size_t at, int marks)
{
    struct store *s = q->s;
    if (req_abandoned(q)) {
        req_settle(q);
        return;
    }
    if (reply == NULL) {
        if (s->mode == STORE_CLUSTER) {
            /* resent to the slot's master once the map is fresh: at worst
             * the lost command had run and the limit counts it twice */
            store_refresh_soon(s);
            req_wait(q);
        } else {
            req_finish(q, STORE_ERROR);
        }
    } else if (reply->type == REDIS_REPLY_ERROR) {
        if (req_error(q, n, reply->str) != 0) {
            log_debug("store: EVALSHA failed '%s': %s", n->name, reply->str);
            req_finish(q, store_error_status(s, n, reply->str));
        }
    } else if (q->call == NULL) {
        q->done = 1;            /* a refund: its count needs no check */
    } else if (v == NULL) {
        log_debug("store: unexpected reply from '%s'", n->name);
        req_finish(q, STORE_ERROR);
    } else {
        store_parse_batch(q, v, at, marks);
        q->done = 1;
        if (--q->call->pending == 0)
            store_call_complete(q->call);
    }
    req_settle(q);
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
    node_got_reply(n);
    if (reply == NULL)
        node_set_ready(n, 0);   /* the connection is going away */
    req_take(q, n, reply, NULL, 0, 0);
}

/* A timed-out call is answered now; late replies only release it. When
 * nothing at all came back from a node for two timeouts, the server is
 * paused or gone: drop that connection rather than queue behind it. */
static void store_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_call *c = arg;
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
            node_drop(stalled[i], "no reply within twice the timeout");
}

/* ---- batches: one EVALSHA per node (and slot) per loop iteration ------------ */

static struct store_batch *store_batch_new(struct store *s, struct store_node *n, int slot,
                                           int asked)
{
    struct store_batch *b = s->free_batches;
    if (b != NULL) {
        s->free_batches = b->next;
    } else {
        b = mem_calloc(1, sizeof(*b));
        b->s = s;
        b->all_next = s->all_batches;
        s->all_batches = b;
    }
    b->node = n;
    b->slot = slot;
    b->asked = asked;
    b->n = 0;
    b->key_bytes = 0;
    b->next = NULL;
    if (s->open_tail != NULL)
        s->open_tail->next = b;
    else
        s->open = b;
    s->open_tail = b;
    return b;
}

static void store_batch_free(struct store_batch *b)
{
    struct store *s = b->s;
    b->n = 0;
    b->next = s->free_batches;
    s->free_batches = b;
}

/* Append q (a call's limits of one slot) to the open batch of its node and
 * slot; a full batch is closed and another opened. ASK'd requests go alone
 * (ASKING holds for one command). Sent by store_flush_cb. */
static void store_batch_add(struct store_node *n, struct store_req *q)
{
    struct store *s = q->s;
    const struct store_call *c = q->call;
    struct store_batch **open = q->asked ? NULL :
                                s->mode == STORE_CLUSTER ? &s->slot_open[q->slot] : &s->single_open;
    size_t bytes = 0, sl = s->rc.overrides ? sizeof(STORE_OVERRIDE_SUFFIX) - 1 : 0;
    for (int i = 0; i < q->n; i++)
        bytes += c->klen[q->idx[i]] * (sl ? 2 : 1) + sl;
    struct store_batch *b = open != NULL ? *open : NULL;
    if (b != NULL && (b->node != n || b->n == STORE_BATCH_MAX ||
                      b->key_bytes + bytes > STORE_BATCH_KEY_BYTES))
        b = NULL;
    if (b == NULL) {
        b = store_batch_new(s, n, q->slot, q->asked);
        if (open != NULL)
            *open = b;
    }
    b->req[b->n] = q;
    b->marks[b->n] = c->nreq > 1;
    b->n++;
    b->key_bytes += bytes;
    q->in_hiredis = 1;          /* held by the batch, then by the connection */
    q->node = n;
    event_active(s->flush_ev, EV_TIMEOUT, 0);
}

/* FNV-1a, for the encoder's two small tables. */
static uint32_t store_hash(const void *p, size_t len, uint32_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

/* The index of key k among the batch's distinct keys (added when new). */
static int enc_key(struct store_batch_enc *e, const char *k, size_t len, int16_t *slots)
{
    uint32_t i = store_hash(k, len, 2166136261u) & (STORE_BATCH_HASH - 1);
    for (;; i = (i + 1) & (STORE_BATCH_HASH - 1)) {
        int x = e->khash[i];
        if (x == 0) {
            e->kp[e->nk] = k;
            e->kl[e->nk] = len;
            slots[e->nk] = (int16_t)i;
            e->khash[i] = (int16_t)++e->nk;
            return e->nk - 1;
        }
        if (e->kl[x - 1] == len && memcmp(e->kp[x - 1], k, len) == 0)
            return x - 1;
    }
}

/* A limit's parameter set as limit.lua takes it: a delay (flag 4) goes in
 * the window's place; a concurrency limit's interval is not sent (its slot
 * id travels per request: the set stays shared). */
static void enc_values(const struct limiter_params *lp, int64_t *f)
{
    f[0] = (int64_t)lp->algo;
    f[1] = lp->limit;
    f[2] = lp->delay_ms > 0 ? lp->delay_ms : lp->window_ms;
    f[3] = lp->algo == LIMITER_CONCURRENCY ? 0 : lp->interval_us;
}

/* The index of lp among the batch's distinct parameter sets. */
static int enc_param(struct store_batch_enc *e, const struct limiter_params *lp, int16_t *slots)
{
    int64_t f[4];
    enc_values(lp, f);
    uint32_t i = store_hash(f, sizeof(f), 2166136261u) & (STORE_BATCH_HASH - 1);
    for (;; i = (i + 1) & (STORE_BATCH_HASH - 1)) {
        int x = e->phash[i];
        if (x == 0) {
            memcpy(e->pv[e->np], f, sizeof(f));
            slots[e->np] = (int16_t)i;
            e->phash[i] = (int16_t)++e->np;
            return e->np - 1;
        }
        if (memcmp(e->pv[x - 1], f, sizeof(f)) == 0)
            return x - 1;
    }
}

/* The flags limit.lua takes for limit li of c: shadow and check only,
 * 4 delay, 8 override (an override key index follows). */
static int64_t enc_flags(const struct store *s, const struct store_call *c, int li)
{
    return (int64_t)c->flags[li] | (c->params[li].delay_ms > 0 ? 4 : 0) |
           (s->rc.overrides ? 8 : 0);
}

/* A request of one limit of cost 1 without marks (the common case) goes
 * as one argument, 32 + ref, instead of m, ref and cost. */
static int store_req_short(const struct store_batch *b, int i)
{
    const struct store_req *q = b->req[i];
    return q->n == 1 && !b->marks[i] && q->call->cost[q->idx[0]] == 1;
}

/* limit.lua's batch call into s->bcmd, returning its length:
 *   EVALSHA sha K key_1..key_K d P (algo limit window_ms interval_us)*P
 *           R (m (ref cost [slot] [ovr])*|m| | 32+ref [slot] [ovr])*R
 * with ref = (key * P + param) * 16 + flags (0-based indexes), slot the
 * concurrency slot id, ovr the 1-based index of the override key (flag 8,
 * redis.overrides), and m < 0 for a request whose reply must carry refund
 * marks; 32+ref: a request of one limit of cost 1 (store_req_short). See
 * limit.lua. */
static size_t store_batch_encode(struct store_batch *b)
{
    struct store *s = b->s;
    struct store_batch_enc *e = s->enc;
    int16_t *kslots = e->kslot, *pslots = e->pslot;
    int ne = 0, extra = 0;
    size_t sl = sizeof(STORE_OVERRIDE_SUFFIX) - 1;
    e->nk = e->np = 0;
    for (int i = 0; i < b->n; i++) {
        const struct store_req *q = b->req[i];
        const struct store_call *c = q->call;
        if (store_req_short(b, i))
            extra -= 2;             /* no m, no cost */
        for (int j = 0; j < q->n; j++, ne++) {
            int li = q->idx[j];
            e->ki[ne] = enc_key(e, c->keys + c->koff[li], c->klen[li], kslots);
            e->pi[ne] = enc_param(e, &c->params[li], pslots);
            e->oi[ne] = -1;
            if (s->rc.overrides) {
                e->oi[ne] = enc_key(e, c->keys + c->ooff[li], c->klen[li] + sl, kslots);
                extra++;
            }
            if (c->params[li].algo == LIMITER_CONCURRENCY)
                extra++;
        }
    }
    size_t key_bytes = 0;
    for (int k = 0; k < e->nk; k++)
        key_bytes += e->kl[k];
    int argc = 3 + e->nk + 2 + 4 * e->np + 1 + b->n + 2 * ne + extra;
    /* 24 bytes of bulk framing per argument bound every number's digits too */
    size_t need = 16 + (size_t)argc * (24 + 24) + key_bytes + 80;
    store_cmd_room(&s->bcmd, &s->bcmdcap, need);
    char *p = store_put_header(s->bcmd, argc);
    p = store_put_bulk(p, "EVALSHA", 7);
    p = store_put_bulk(p, limit_lua_sha, strlen(limit_lua_sha));
    p = store_put_int(p, e->nk);
    for (int k = 0; k < e->nk; k++)
        p = store_put_bulk(p, e->kp[k], e->kl[k]);
    p = store_put_bulk(p, "d", 1);
    p = store_put_int(p, e->np);
    for (int k = 0; k < e->np; k++)
        for (int f = 0; f < 4; f++)
            p = store_put_int(p, e->pv[k][f]);
    p = store_put_int(p, b->n);
    ne = 0;
    for (int i = 0; i < b->n; i++) {
        const struct store_req *q = b->req[i];
        const struct store_call *c = q->call;
        int short_form = store_req_short(b, i);
        if (!short_form)
            p = store_put_int(p, b->marks[i] ? -q->n : q->n);
        for (int j = 0; j < q->n; j++, ne++) {
            int li = q->idx[j];
            int64_t ref = ((int64_t)e->ki[ne] * e->np + e->pi[ne]) * 16 + enc_flags(s, c, li);
            if (short_form) {
                p = store_put_int(p, 32 + ref);
            } else {
                p = store_put_int(p, ref);
                p = store_put_int(p, c->cost[li]);
            }
            if (c->params[li].algo == LIMITER_CONCURRENCY)
                p = store_put_int(p, c->slot[li]);
            if (e->oi[ne] >= 0)
                p = store_put_int(p, e->oi[ne] + 1);
        }
    }
    for (int k = 0; k < e->nk; k++)
        e->khash[kslots[k]] = 0;
    for (int k = 0; k < e->np; k++)
        e->phash[pslots[k]] = 0;
    size_t len = (size_t)(p - s->bcmd);
    assert(len <= s->bcmdcap);
    return len;
}

/* How many integers limit.lua answers for limit li of c: v, reset_ms
 * [, mark] [, wait_ms (delay)] [, limit (overrides)]. */
static size_t store_reply_width(const struct store *s, const struct store_call *c, int li,
                                int marks)
{
    return 2 + (marks ? 1 : 0) + (c->params[li].delay_ms > 0 ? 1 : 0) +
           (s->rc.overrides ? 1 : 0);
}

static size_t store_req_width(const struct store_req *q, int marks)
{
    size_t w = 0;
    for (int i = 0; i < q->n; i++)
        w += store_reply_width(q->s, q->call, q->idx[i], marks);
    return w;
}

/* The batch's reply width: { time_s, time_us, then per request and limit:
 * v, reset_ms [, mark] [, wait_ms] [, limit] }, all integers. */
static size_t store_batch_width(const struct store_batch *b)
{
    size_t want = 2;
    for (int i = 0; i < b->n; i++)
        want += store_req_width(b->req[i], b->marks[i]);
    return want;
}

/* Its integers (b->ints, rconn_send_ints) when the reply has that shape. */
static const long long *store_batch_readable(const struct store_batch *b,
                                             const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ARRAY || reply->element != NULL ||
        reply->elements != store_batch_width(b))
        return NULL;
    return b->ints;
}

/* Request q's fields of a readable batch reply, from `at`: v = remaining
 * when the limit allows, -retry_ms when it denies; an admitted delayed
 * request's retry_ms is its wait. The limit an override applied is kept in
 * c->params too: a refund caps at it. */
static void store_parse_batch(struct store_req *q, const long long *v, size_t at, int marks)
{
    struct store_call *c = q->call;
    q->allowed = 1;
    for (int i = 0; i < q->n; i++) {
        const long long *e = v + at;
        int li = q->idx[i];
        struct limiter_result *r = &c->res.r[li];
        long long rv = e[0];
        size_t x = 2;
        at += store_reply_width(q->s, c, li, marks);
        r->allowed = rv >= 0;
        r->remaining = rv >= 0 ? rv : 0;
        r->reset_ms = e[1];
        r->retry_ms = rv >= 0 ? 0 : rv < -INT64_MAX ? INT64_MAX : -rv;
        if (!r->allowed && !(c->flags[li] & STORE_SHADOW))
            q->allowed = 0;
        if (marks)
            q->mark[i] = e[x++];
        if (c->params[li].delay_ms > 0 && rv >= 0)
            r->retry_ms = e[x];
        if (c->params[li].delay_ms > 0)
            x++;
        if (q->s->rc.overrides)
            c->params[li].limit = e[x];
        r->limit = c->params[li].limit;
    }
    if (marks) {
        q->time_s = v[0];
        q->time_us = v[1];
    }
}

static void store_batch_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_batch *b = privdata;
    struct store *s = b->s;
    struct store_node *n = rconn_data(ac);
    if (s->destroying)
        return;                 /* store_destroy() frees every batch */
    node_got_reply(n);
    if (reply == NULL)
        node_set_ready(n, 0);   /* the connection is going away */
    const long long *v = reply != NULL && reply->type != REDIS_REPLY_ERROR ?
                         store_batch_readable(b, reply) : NULL;
    size_t at = 2;
    for (int i = 0; i < b->n; i++) {
        struct store_req *q = b->req[i];
        size_t mine = at;
        /* q's call may be reused by a callback once q is released */
        at += store_req_width(q, b->marks[i]);
        q->in_hiredis = 0;
        req_take(q, n, reply, v, mine, b->marks[i]);
    }
    store_batch_free(b);
}

/* A batch that could not be sent: its requests wait for the map (cluster)
 * or for the connection being made, or fail, as a request that finds its
 * node down does. */
static void store_batch_unsent(struct store_batch *b)
{
    struct store *s = b->s;
    for (int i = 0; i < b->n; i++) {
        struct store_req *q = b->req[i];
        q->in_hiredis = 0;
        if (!req_abandoned(q)) {
            if (s->mode == STORE_CLUSTER) {
                store_refresh_soon(s);
                req_wait(q);
            } else if (store_connecting(s)) {
                req_wait(q);        /* sent when the connection is up */
            } else {
                req_finish(q, STORE_ERROR);
            }
        }
        req_settle(q);
    }
    store_batch_free(b);
}

static void store_batch_send(struct store_batch *b)
{
    struct store_node *n = b->node;
    if (!n->ready || n->ac == NULL)
        goto fail;
    size_t len = store_batch_encode(b);
    if (b->asked) {
        if (rconn_send(n->ac, "*1\r\n$6\r\nASKING\r\n", 16, req_asking_cb, NULL) != 0)
            goto fail;
        node_expect_reply(n);
    }
    /* the reply's integers are parsed straight into b->ints */
    size_t width = store_batch_width(b);
    if (b->intcap < width) {
        free(b->ints);
        b->intcap = width > 64 ? width : 64;
        b->ints = mem_alloc(b->intcap * sizeof(*b->ints));
    }
    if (rconn_send_ints(n->ac, b->s->bcmd, len, b->ints, width, store_batch_cb, b) != 0)
        goto fail;
    node_expect_reply(n);
    metrics_batch(b->n);
    return;
fail:
    log_debug("store: batch of %d not sent to '%s': not connected", b->n, n->name);
    store_batch_unsent(b);
}

/* Every batch opened since the last flush goes out, in order. Callbacks of
 * unsent ones may open new batches: those wait for the next flush. */
static void store_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    struct store_batch *b = s->open;
    s->open = s->open_tail = NULL;
    s->single_open = NULL;
    for (struct store_batch *x = b; x != NULL; x = x->next)
        if (s->slot_open != NULL && x->slot >= 0 && s->slot_open[x->slot] == x)
            s->slot_open[x->slot] = NULL;
    while (b != NULL) {
        struct store_batch *next = b->next;
        store_batch_send(b);
        b = next;
    }
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

struct store *store_create(struct event_base *base, const struct conf_redis *rc)
{
    struct store *s = mem_calloc(1, sizeof(*s));
    s->base = base;
    s->counted = 1;
    store_copy_conf(s, rc);
    store_open_net(s);
    for (int i = 0; i < STORE_SLOTS; i++)
        s->owner[i] = -1;
    s->refresh_ev = store_timer(s, store_refresh_cb, s);
    s->periodic_ev = event_new(base, -1, EV_PERSIST, store_periodic_cb, s);
    s->flush_ev = event_new(base, -1, 0, store_flush_cb, s);
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
        store_node_index(s, rc->host ? rc->host : "?", rc->port);
        if (rc->is_unix)
            node_set_addr(s->nodes[0], rc->host ? rc->host : "?", 0, 1);
        node_start(s->nodes[0]);
        return s;
    }
    if (s->mode == STORE_SENTINEL)
        store_node_index(s, "?", 0);    /* the master, once a sentinel names it */
    if (s->nseeds == 0) {
        log_error("store: no usable %s address", s->mode == STORE_CLUSTER ?
                  "cluster" : "sentinel");
        return s;                       /* never connected: on_error applies */
    }
    s->ctl = node_new(s, NODE_CTL, s->seeds[0].host, s->seeds[0].port, 0);
    node_start(s->ctl);
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
    store_update_ready(s);              /* drops the process-wide gauge */
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
        node_free(all[i]);
    for (struct store_req *q = s->refunds, *next; q != NULL; q = next) {
        next = q->next;
        store_refund_release(q);
    }
    s->refunds = NULL;
    while (s->all_calls != NULL) {
        struct store_call *c = s->all_calls;
        s->all_calls = c->all_next;
        if (c->timer != NULL)
            event_free(c->timer);
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
    free(s->slot_open);
    free(s->enc);
    free(s->bcmd);
    event_free(s->refresh_ev);
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
    /* with redis.overrides each key is followed by its override key */
    size_t sl = sizeof(STORE_OVERRIDE_SUFFIX) - 1, total = 0;
    int ovr = c->s->rc.overrides;
    for (int i = 0; i < n; i++)
        total += limits[i].keylen * (ovr ? 2 : 1) + (ovr ? sl : 0);
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
        c->koff[i] = off;
        c->klen[i] = limits[i].keylen;
        memcpy(c->keys + off, limits[i].key, limits[i].keylen);
        off += limits[i].keylen;
        c->ooff[i] = off;
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
    if (c->timer == NULL)
        c->timer = store_timer(s, store_timeout_cb, c);
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
    struct timeval tv = clock_timeval(s->rc.timeout_ms);
    event_add(c->timer, &tv);
    return c;
}

void store_cancel(struct store_call *c)
{
    if (c == NULL || c->answered)
        return;
    c->answered = 1;
    event_del(c->timer);
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

/* ---- the reset subscriber (issue 14): one SUBSCRIBE connection --------------
 *
 * Kept apart from the decision connections: an rconn on the caller's
 * base, subscribed to one channel, reconnecting every STORE_SUB_RETRY_MS.
 * cb runs for each message and once each time the subscription is
 * (re)made: messages sent while it was down are lost, so the caller treats
 * a new subscription as one. A cluster broadcasts PUBLISH to every node, so
 * the first seed will do. Sentinel: a second connection, to the sentinels
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
};

static void sub_connect(struct store_sub *ss);
static void sub_ask_again(struct store_sub *ss);

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
    ss->cb(ss->arg);
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
    if (ss->sentinels != NULL)
        sub_ask_again(ss);
    else
        sub_retry_later(ss);
}

/* The master a sentinel named: subscribe there (again, if it moved). */
static void sub_set_master(struct store_sub *ss, const char *host, int port)
{
    if (ss->conn != NULL && ss->port == port && strcmp(ss->host, host) == 0)
        return;
    log_info("store: reset subscriber: sentinel master '%s' is %s:%d", ss->master_name,
             host, port);
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
    if (reply == NULL || ss->stopping || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements != 3 || reply->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(reply->element[0]->str, "message") != 0 ||
        reply->element[2]->type != REDIS_REPLY_STRING)
        return;                 /* the subscribe confirmation */
    char name[256], oldip[64], newip[64];
    int oldport, newport;
    /* Counted fields and a bounded port: the conversions are checked. */
    if (sscanf(reply->element[2]->str, "%255s %63s %d %63s %d",  // NOLINT(cert-err34-c)
               name, oldip, &oldport, newip, &newport) != 5 ||
        strcmp(name, ss->master_name) != 0 || newport < 1 || newport > 65535)
        return;
    sub_set_master(ss, newip, newport);
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
                                   const char *channel, store_sub_cb *cb, void *arg)
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
    ss->channel = store_strdup(channel);
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
    free(ss);
}

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
    if (r != NULL && !node_is_master(r))
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

const char *store_limit_script(void)
{
    return limit_lua;
}
