/* sluice - store_int.h: what the store's own modules share, and no one else.
 *
 * Included only by store.c (the calls, requests, refunds, redirects and
 * timeouts, and store.h's interface), store_util.c (the smallest helpers),
 * store_node.c (one node: one rconn),
 * store_topo.c (the cluster slot map and sentinel), store_batch.c (the
 * EVALSHA encoders and batches), store_sub.c and store_sync.c. The structs
 * here are a store's private state; store.h stays the interface for the
 * rest of sluice. Include store.h first (it gives conf_redis, the limits and
 * the result; including it from here would make a cycle store <-> store_int). */
#ifndef SLUICE_STORE_INT_H
#define SLUICE_STORE_INT_H

#ifndef SLUICE_STORE_H
#error "include store.h before store_int.h"
#endif

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "list.h"
#include "rconn.h"

/* Generated from scripts/NAME.lua by the Makefile (build/NAME_lua.c). */
extern const char limit_lua[];
extern const char limit_lua_sha[];
extern const char refund_lua[];
extern const char part_reset_lua[];
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
    int dropping;                   /* inside store_node_drop(): ignore onDisconnect */
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
    struct list_link refund;        /* on the store's refunds */
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
    int64_t time_s, time_us;        /* TIME the script ran at */
    int64_t mark[STORE_MAX_LIMITS];
    /* a settlement (store_settle): told when it is done, from notify_ev */
    void (*notify)(void *arg);
    void *notify_arg;
    struct event *notify_ev;
};

/* A call's life: it leaves the free list in store_decide(), is answered at
 * most once (reply, error or timeout; or cancelled, which also counts), and
 * returns to the free list only when it is answered AND no connection holds
 * any of its requests, so a late reply never touches a reused call. */
struct store_call {
    struct store *s;
    struct store_call *next;        /* free list */
    struct store_call *all_next;    /* every call ever made, for destroy */
    struct list_link due;           /* on the store's due list until answered */
    int on_due;
    int64_t due_us;                 /* clock_us(): answered STORE_TIMEOUT then */
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
    size_t ooff[STORE_MAX_LIMITS];  /* redis.overrides: each override key, in keys, */
    size_t olen[STORE_MAX_LIMITS];  /* its limit's key and the suffix */
    uint32_t part[STORE_MAX_LIMITS];  /* one key per route: the part decided in the
                                       * key (then its route's), 0: none */
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
    /* algo limit window_ms interval_us, as sent; then a calendar window's
     * period starts around now (4, sent after the requests) or zeros */
    int64_t pv[STORE_BATCH_ENTRIES][8];
    int ki[STORE_BATCH_ENTRIES], pi[STORE_BATCH_ENTRIES], oi[STORE_BATCH_ENTRIES];
    int16_t kslot[STORE_BATCH_KEYS], pslot[STORE_BATCH_ENTRIES];   /* to clear the tables */
    int nk, np;
};

struct store_addr {
    char *host;
    int port;
};

/* What the lower store modules tell the higher ones, through pointers
 * store.c sets (as conn.c's struct conn_ops), so that store_node.c and
 * store_batch.c call nothing above them: a node came up or was lost and the
 * master a sentinel names (store_topo.c's), the waiting requests look again,
 * a batch's reply goes to each of its requests and a batch not sent lets
 * each wait or fail (store.c's). */
struct store_ops {
    void (*node_up)(struct store *s, struct store_node *n);
    void (*node_lost)(struct store *s, struct store_node *n);
    void (*set_master)(struct store *s, const char *host, int port);
    void (*kick_waiting)(struct store *s);
    void (*req_take)(struct store_req *q, struct store_node *n, const redisReply *reply,
                     const long long *v, size_t at, int marks);
    void (*req_unsent)(struct store_req *q);
};

struct store {
    struct event_base *base;
    const struct store_ops *ops;    /* set by store_create(), never NULL after */
    struct conf_redis rc;           /* strings owned (copied) */
    /* Unanswered calls, newest first. Every call's timeout is rc.timeout_ms,
     * so the last is the next due: one timer for all of them (due_ev, armed
     * for the last's due time), where a timer per call cost libevent's heap
     * an insertion and a removal per decision. */
    struct list due;
    struct event *due_ev;
    int due_armed;
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
    struct list refunds;
    struct event *drain_ev;         /* store_drain(): all answered, or its time is up */
    void (*drain_done)(void *arg);
    void *drain_arg;
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

/* ---- store_util.c: shared helpers ---------------------------------------------- */

char *store_strdup(const char *p);
struct event *store_timer(struct store *s, event_callback_fn fn, void *arg);
int store_switch_master(const redisReply *reply, const char *name, char *ip, size_t ipsz,
                        int *port);

/* ---- store.c: waiting, requests ------------------------------------------------- */

/* Outside a cluster: a connection that decisions may wait for is being made. */
int store_connecting(const struct store *s);
/* Requests waiting for a connection look again now. */
void store_kick_waiting(struct store *s);

/* ---- store_node.c: one node, one connection ----------------------------------- */

void store_node_update_ready(struct store *s);
void store_node_set_ready(struct store_node *n, int ready);
void store_node_expect_reply(struct store_node *n);
void store_node_got_reply(struct store_node *n);
/* Send ASKING (the next command may run on a slot being imported) and
 * expect its reply; -1 when it could not be sent. */
int store_node_asking(struct store_node *n);
/* Drop the connection once the stack has unwound (from inside its callbacks). */
void store_node_kill_later(struct store_node *n, const char *reason);
/* Drop it now: only from outside its callbacks. */
void store_node_drop(struct store_node *n, const char *reason);
int store_node_load_scripts(struct store_node *n);
int store_node_is_master(const redisReply *reply);
void store_node_set_addr(struct store_node *n, const char *host, int port, int is_unix);
struct store_node *store_node_new(struct store *s, enum node_role role,
                                  const char *host, int port, int is_unix);
void store_node_start(struct store_node *n);
void store_node_stop(struct store_node *n);
void store_node_move(struct store_node *n, const char *host, int port);
void store_node_free(struct store_node *n);

/* ---- store_topo.c: which node owns a slot, or is the master ------------------- */

/* The index in s->nodes of host:port, added when new; -1 when full. */
int store_topo_node_index(struct store *s, const char *host, int port);
/* The node that owns slot (-1 outside a cluster), or NULL while unknown. */
struct store_node *store_topo_owner(const struct store *s, int slot);
/* MOVED: slot now belongs to to; the map is refreshed soon. */
void store_topo_moved(struct store *s, int slot, const struct store_node *to);
/* Ask for the slot map again, at most every STORE_REFRESH_MIN_MS (cluster). */
void store_topo_refresh_soon(struct store *s);
void store_topo_refresh_cb(evutil_socket_t fd, short what, void *arg);
void store_topo_periodic_cb(evutil_socket_t fd, short what, void *arg);
/* Sentinel: the data node follows the master a sentinel names. */
void store_topo_set_master(struct store *s, const char *host, int port);
/* A node came up, or was lost. */
void store_topo_node_up(struct store *s, struct store_node *n);
void store_topo_node_lost(struct store *s, struct store_node *n);
/* The node a MOVED or ASK error names, and its slot. */
struct store_node *store_topo_redirect_node(struct store *s, const char *err, int *slot);

/* ---- store_batch.c: EVALSHA encoding, batches ---------------------------------- */

void store_batch_encode_evalsha(struct store_req *q, const struct store_call *c,
                                const char *sha, const int *li, int n,
                                const int64_t *args, int nargs, const int64_t *last);
/* Append a decision's request to its node's (and slot's) open batch. */
void store_batch_add(struct store_node *n, struct store_req *q);
void store_batch_flush_cb(evutil_socket_t fd, short what, void *arg);
void store_batch_parse(struct store_req *q, const long long *v, size_t at, int marks);

#endif
