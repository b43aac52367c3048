/* sluice - fuzz_redis_reply.c: libFuzzer target for the Redis reply reader.
 *
 * The bytes a Redis server sends go through rconn.c's reader exactly as
 * from a socket (rconn_detached + rconn_feed: hiredis' redisReader with
 * rconn's object functions, which bound arrays, nesting and string bytes
 * and parse rconn_send_ints replies straight into the caller's integers),
 * cut into pieces of a size the input picks. Every reply is also offered
 * to store_switch_master, the parser of a sentinel's +switch-master.
 *
 * Input: byte 0 is the piece size (0: all at once) and byte 1 says which of
 * eight commands were sent with rconn_send_ints (bit i: command i), byte 2
 * their integer capacity (0-15), byte 3 whether a SUBSCRIBE follows them;
 * the rest is the server's stream. Invariants: a reply to rconn_send_ints
 * is an array of at most cap integers (written into exactly cap heap
 * longs, so ASan sees any write past them) or an error; every other reply
 * is hiredis' tree within rconn's bounds (arrays 4 deep, 65536 elements
 * each, strings NUL-ended at len); each callback is called once (a reply
 * or NULL), in order; a refused stream leaves the connection dead. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "log.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

#define NCMDS 8
#define MAX_DEPTH 4                     /* rconn.c's RCONN_MAX_DEPTH */
#define MAX_ARRAY 65536                 /* rconn.c's RCONN_MAX_ARRAY */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct cmd {
    int ints;                           /* sent with rconn_send_ints */
    long long *v;                       /* cap of them, on the heap */
    size_t cap;
    int answered;                       /* 1: a reply, 2: NULL */
};

struct state {
    struct cmd cmd[NCMDS];
    int next;                           /* the command the next reply is for */
    int pushes;
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR);           /* refused replies are logged as warnings */
    return 0;
}

/* depth: of r's array, if it is one (the root's is 1) */
static void tree_ok(const redisReply *r, int depth)
{
    switch (r->type) {
    case REDIS_REPLY_ARRAY:
        fuzz_check(depth <= MAX_DEPTH && r->elements <= MAX_ARRAY);
        for (size_t i = 0; i < r->elements; i++) {
            fuzz_check(r->element[i] != NULL);
            tree_ok(r->element[i], depth + 1);
        }
        break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        fuzz_check(r->str != NULL && r->str[r->len] == '\0');
        break;
    case REDIS_REPLY_INTEGER:
    case REDIS_REPLY_NIL:
        break;
    default:
        fuzz_check(0);                  /* rconn's reader makes no other type */
    }
}

/* A sentinel's message, if it is one: a bounded address and port. */
static void switch_master_ok(const redisReply *r)
{
    char ip[46];
    int port = 0;
    if (store_switch_master(r, "mymaster", ip, sizeof(ip), &port) == 0) {
        fuzz_check(port >= 1 && port <= 65535);
        fuzz_check(strlen(ip) < sizeof(ip));
    }
}

static void reply_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct cmd *k = privdata;
    fuzz_check(k->answered == 0);
    k->answered = r != NULL ? 1 : 2;
    if (r == NULL)
        return;
    if (k->ints && r->type == REDIS_REPLY_ARRAY && r->elements <= k->cap) {
        fuzz_check(r->element == NULL);     /* parsed into k->v, nothing allocated */
        return;
    }
    tree_ok(r, 1);
    switch_master_ok(r);
}

static void push_cb(struct rconn *c, redisReply *r, void *privdata)
{
    struct state *st = privdata;
    st->pushes++;
    if (r != NULL) {
        tree_ok(r, 1);
        switch_master_ok(r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    size_t piece = data[0] ? data[0] : size;
    unsigned mask = data[1];
    size_t cap = data[2] & 15;
    int subscribe = data[3] & 1;
    data += 4;
    size -= 4;

    struct state st;
    memset(&st, 0, sizeof(st));
    struct rconn *c = rconn_detached();
    static const char cmd[] = "*1\r\n$4\r\nPING\r\n";
    for (int i = 0; i < NCMDS; i++) {
        struct cmd *k = &st.cmd[i];
        k->ints = (mask >> i) & 1;
        if (k->ints) {
            k->cap = cap;
            k->v = malloc(cap ? cap * sizeof(long long) : 1);
            fuzz_check(rconn_send_ints(c, cmd, sizeof(cmd) - 1, k->v, cap, reply_cb, k) == 0);
        } else {
            fuzz_check(rconn_send(c, cmd, sizeof(cmd) - 1, reply_cb, k) == 0);
        }
    }
    if (subscribe) {
        const char *argv[] = { "SUBSCRIBE", "chan" };
        fuzz_check(rconn_subscribe(c, 2, argv, push_cb, &st) == 0);
    }

    const char *why = NULL;
    for (size_t off = 0; off < size && why == NULL; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        why = rconn_feed(c, (const char *)data + off, n);
    }
    if (why != NULL) {
        /* dead: everything waiting had its NULL, and nothing more is taken */
        for (int i = 0; i < NCMDS; i++)
            fuzz_check(st.cmd[i].answered != 0);
        fuzz_check(rconn_send(c, cmd, sizeof(cmd) - 1, reply_cb, &st.cmd[0]) != 0);
        fuzz_check(rconn_feed(c, "+OK\r\n", 5) != NULL);
    }
    /* answers come in order: no command answered after one still waiting */
    int waiting = 0;
    for (int i = 0; i < NCMDS; i++) {
        if (st.cmd[i].answered == 0)
            waiting = 1;
        else
            fuzz_check(!waiting);
    }
    rconn_free(c);
    for (int i = 0; i < NCMDS; i++) {
        fuzz_check(st.cmd[i].answered != 0);  /* rconn_free gave the rest NULL */
        free(st.cmd[i].v);
    }
    return 0;
}
