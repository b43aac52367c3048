/* sluice - test_store.c: the Redis store and limit.lua against a real redis-server.
 *
 * The test starts its own redis-server on a free loopback port, drives the
 * store through a libevent loop in real time, and checks the algorithms'
 * seed behaviours, all-or-nothing multi-limit decisions, key expiry, NOSCRIPT
 * recovery, timeouts, stalls, reconnection and cancellation. Every wait is
 * bounded; the server is killed by its PID at the end. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <cmocka.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "store.h"
#include "testlib.h"

static pid_t redis_pid = -1;
static int redis_port;
static redisContext *rc;               /* blocking connection for checks */
static struct event_base *base;
static struct event *tick;
static struct store *st;               /* timeout 1000 ms: slow under valgrind */
static int key_seq;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- the redis-server ------------------------------------------------------ */

static redisContext *redis_connect(void)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (c == NULL)
        return NULL;
    if (c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

static void redis_start(void)
{
    redis_pid = testlib_redis_start(redis_port, NULL);
    for (int i = 0; i < 200; i++) {          /* up to ~4 s */
        redisContext *c = redis_connect();
        if (c != NULL) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
            if (ok) {
                rc = c;
                return;
            }
            redisFree(c);
        }
        sleep_ms(20);
    }
    fprintf(stderr, "test_store: redis-server did not start on port %d\n", redis_port);
    abort();
}

static void redis_stop(void)
{
    if (rc != NULL) {
        redisFree(rc);
        rc = NULL;
    }
    testlib_redis_stop(redis_pid);
    redis_pid = -1;
}

static redisReply *cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    assert_non_null(r);
    return r;
}

static int64_t redis_now_ms(void)
{
    redisReply *r = cmd("TIME");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    int64_t ms = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

/* Sleep until Redis time is phase_ms into a window of window_ms. */
static void wait_phase(int64_t window_ms, int64_t phase_ms)
{
    int64_t now = redis_now_ms();
    int64_t wait = (phase_ms - now % window_ms + window_ms) % window_ms;
    sleep_ms(wait);
}

/* ---- the event loop and decisions ------------------------------------------ */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

/* Run the loop until *flag is nonzero or max_ms passed. */
static void loop_until(const int *flag, int64_t max_ms)
{
    int64_t end = mono_ms() + max_ms;
    while ((flag == NULL || !*flag) && mono_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
}

static void loop_until_connected(struct store *s, int want, int64_t max_ms)
{
    int64_t end = mono_ms() + max_ms;
    while (store_connected(s) != want && mono_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
}

struct got {
    int calls;
    int64_t at_ms;
    struct store_result res;
};

static void got_cb(void *arg, const struct store_result *res)
{
    struct got *g = arg;
    g->calls++;
    g->at_ms = mono_ms();
    g->res = *res;
}

static struct store *store_new(int64_t timeout_ms, int port)
{
    struct conf_redis cr = { 0 };
    cr.host = "127.0.0.1";
    cr.port = port;
    cr.timeout_ms = timeout_ms;
    cr.prefix = "st:";
    struct store *s = store_create(base, &cr);
    assert_non_null(s);
    return s;
}

static void key_new(char *out, size_t size, const char *what)
{
    snprintf(out, size, "st:{test|%s|%d|%d}", what, (int)getpid(), ++key_seq);
}

/* One decision, waited for. Returns the status, or -1 when store_decide()
 * returned NULL. */
static int decide_on(struct store *s, const struct store_limit *l, int n,
                     struct store_result *out)
{
    struct got g = { 0 };
    struct store_call *c = store_decide(s, l, n, got_cb, &g);
    if (c == NULL)
        return -1;
    assert_int_equal(g.calls, 0);         /* never from inside store_decide */
    loop_until(&g.calls, 5000);
    assert_int_equal(g.calls, 1);
    if (out != NULL)
        *out = g.res;
    return (int)g.res.status;
}

/* A single limit decided on the shared store; returns allowed. */
static int decide1(const char *key, const struct limiter_params *p, int64_t cost,
                   struct limiter_result *r)
{
    struct store_limit l = { key, strlen(key), p, cost };
    struct store_result res;
    assert_int_equal(decide_on(st, &l, 1, &res), STORE_OK);
    assert_int_equal(res.n, 1);
    assert_int_equal(res.allowed, res.r[0].allowed);
    if (r != NULL)
        *r = res.r[0];
    return res.allowed;
}

static const struct limiter_params fixed_5s = { LIMITER_FIXED_WINDOW, 5, 1000, 0 };
static const struct limiter_params sliding_5s = { LIMITER_SLIDING_WINDOW, 5, 1000, 0 };
static const struct limiter_params log_5s = { LIMITER_SLIDING_LOG, 5, 1000, 0 };
static const struct limiter_params bucket_3 = { LIMITER_TOKEN_BUCKET, 3, 3000, 1000000 };
static const struct limiter_params gcra_3 = { LIMITER_GCRA, 3, 3000, 1000000 };
static const struct limiter_params fixed_5m = { LIMITER_FIXED_WINDOW, 5, 60000, 0 };

/* ---- seed behaviours ------------------------------------------------------- */

/* 5 just before a window edge and 5 just after: how many pass. */
static int around_edge(const struct limiter_params *p, int *first, int *second)
{
    char key[128];
    key_new(key, sizeof(key), "edge");
    *first = *second = 0;
    wait_phase(1000, 780);
    for (int i = 0; i < 5; i++)
        *first += decide1(key, p, 1, NULL);
    wait_phase(1000, 60);
    for (int i = 0; i < 5; i++)
        *second += decide1(key, p, 1, NULL);
    return *first + *second;
}

static void test_seed_fixed_window(void **state)
{
    int a, b;
    assert_int_equal(around_edge(&fixed_5s, &a, &b), 10);
    assert_int_equal(a, 5);
    assert_int_equal(b, 5);
}

static void test_seed_sliding_log(void **state)
{
    int a, b;
    assert_int_equal(around_edge(&log_5s, &a, &b), 5);
    assert_int_equal(a, 5);
    assert_int_equal(b, 0);
}

static void bucket_seed(const struct limiter_params *p)
{
    char key[128];
    key_new(key, sizeof(key), "bucket");
    int want[5] = { 1, 1, 1, 0, 0 };
    struct limiter_result r;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(decide1(key, p, 1, &r), want[i]);
        assert_int_equal(r.limit, 3);
        if (want[i]) {
            assert_int_equal(r.remaining, 2 - i);
            assert_int_equal(r.retry_ms, 0);
        } else {
            assert_int_equal(r.remaining, 0);
            assert_in_range(r.retry_ms, 800, 1000);
        }
    }
    sleep_ms(1100);
    assert_int_equal(decide1(key, p, 1, &r), 1);
    assert_int_equal(decide1(key, p, 1, &r), 0);
}

static void test_seed_token_bucket(void **state)
{
    bucket_seed(&bucket_3);
}

static void test_seed_gcra(void **state)
{
    bucket_seed(&gcra_3);
}

/* Retry-After is exact for every algorithm: once the limit is spent, a
 * request just before retry_ms is still denied and one just after passes. */
static void retry_exact(const struct limiter_params *p, int64_t lo_ms, int64_t hi_ms,
                        int one_only)
{
    char key[128];
    key_new(key, sizeof(key), "retry");
    struct limiter_result r;
    wait_phase(1000, 100);
    for (int i = 0; i < p->limit; i++) {
        assert_int_equal(decide1(key, p, 1, &r), 1);
        assert_int_equal(r.remaining, p->limit - 1 - i);
    }
    assert_int_equal(decide1(key, p, 1, &r), 0);
    assert_int_equal(r.remaining, 0);
    assert_in_range(r.retry_ms, lo_ms, hi_ms);
    int64_t retry_ms = r.retry_ms, t0 = mono_ms();
    sleep_ms(retry_ms - 80);
    assert_int_equal(decide1(key, p, 1, &r), 0);
    assert_in_range(r.retry_ms, 1, 120);
    sleep_ms(t0 + retry_ms + 40 - mono_ms());
    assert_int_equal(decide1(key, p, 1, &r), 1);
    /* windows restore the whole quota at once, the others one unit */
    assert_int_equal(decide1(key, p, 1, &r), !one_only);
}

static void test_retry_exact_fixed_window(void **state)
{
    retry_exact(&fixed_5s, 800, 900, 0);           /* the window's end */
}

static void test_retry_exact_sliding_window(void **state)
{
    /* next window starts in ~900 ms, then 1/5 of the count must decay */
    retry_exact(&sliding_5s, 900 + 200 - 80, 900 + 200, 1);
}

static void test_retry_exact_sliding_log(void **state)
{
    retry_exact(&log_5s, 900, 1000, 0);           /* the oldest entry leaves */
}

static void test_retry_exact_token_bucket(void **state)
{
    retry_exact(&bucket_3, 900, 1000, 1);
}

static void test_retry_exact_gcra(void **state)
{
    retry_exact(&gcra_3, 900, 1000, 1);
}

/* A sliding log forgets each entry exactly one window after it was admitted. */
static void test_sliding_log_entries_leave_in_order(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "logorder");
    struct limiter_result r;
    int64_t t0 = mono_ms();
    for (int i = 0; i < 3; i++)
        assert_int_equal(decide1(key, &log_5s, 1, NULL), 1);
    sleep_ms(t0 + 500 - mono_ms());
    for (int i = 0; i < 2; i++)
        assert_int_equal(decide1(key, &log_5s, 1, NULL), 1);
    assert_int_equal(decide1(key, &log_5s, 1, &r), 0);
    assert_in_range(r.retry_ms, 1, 560);                 /* the first three leave */
    assert_in_range(r.reset_ms, 900, 1000);              /* the last two leave */
    sleep_ms(t0 + 1080 - mono_ms());
    for (int i = 0; i < 3; i++)
        assert_int_equal(decide1(key, &log_5s, 1, NULL), 1);
    assert_int_equal(decide1(key, &log_5s, 1, &r), 0);
    assert_in_range(r.retry_ms, 1, 560);
}

static void test_cost_above_limit(void **state)
{
    char key[128];
    struct limiter_result r;
    const struct limiter_params *ps[5] = { &fixed_5s, &sliding_5s, &log_5s, &bucket_3, &gcra_3 };
    int64_t want_retry[5] = { 1000, 1000, 1000, 3000, 3000 };
    for (int i = 0; i < 5; i++) {
        key_new(key, sizeof(key), "cost");
        assert_int_equal(decide1(key, ps[i], 6, &r), 0);
        assert_int_equal(r.retry_ms, want_retry[i]);
        assert_int_equal(decide1(key, ps[i], 3, &r), 1);    /* nothing was consumed */
        assert_int_equal(r.remaining, ps[i]->limit - 3);
    }
}

/* A denied request consumes nothing, from any limit. */
static void test_multi_all_or_nothing(void **state)
{
    static const struct limiter_params big[5] = {
        { LIMITER_FIXED_WINDOW, 10, 60000, 0 },
        { LIMITER_SLIDING_WINDOW, 10, 60000, 0 },
        { LIMITER_SLIDING_LOG, 10, 60000, 0 },
        { LIMITER_TOKEN_BUCKET, 10, 60000, 6000000 },
        { LIMITER_GCRA, 10, 60000, 6000000 },
    };
    static const struct limiter_params one = { LIMITER_FIXED_WINDOW, 1, 60000, 0 };
    for (int i = 0; i < 5; i++) {
        char ka[128], kb[128];
        key_new(ka, sizeof(ka), "multiA");
        key_new(kb, sizeof(kb), "multiB");
        struct store_limit l[2] = { { ka, strlen(ka), &big[i], 1 }, { kb, strlen(kb), &one, 1 } };
        struct store_result res;
        assert_int_equal(decide_on(st, l, 2, &res), STORE_OK);
        assert_int_equal(res.allowed, 1);
        assert_int_equal(res.r[0].remaining, 9);
        assert_int_equal(res.r[1].remaining, 0);
        /* B is spent: the request is denied, A reports but does not consume */
        assert_int_equal(decide_on(st, l, 2, &res), STORE_OK);
        assert_int_equal(res.allowed, 0);
        assert_int_equal(res.n, 2);
        assert_int_equal(res.r[0].allowed, 1);
        assert_int_equal(res.r[0].limit, 10);
        assert_int_equal(res.r[0].remaining, 9);
        assert_int_equal(res.r[0].retry_ms, 0);
        assert_int_equal(res.r[1].allowed, 0);
        assert_int_equal(res.r[1].limit, 1);
        assert_in_range(res.r[1].retry_ms, 1, 60000);
        /* A alone: its count moved by the first request only */
        struct limiter_result r;
        assert_int_equal(decide1(ka, &big[i], 1, &r), 1);
        assert_int_equal(r.remaining, 8);
    }
}

/* Concurrent calls are pipelined on one connection and stay exact. */
static void test_pipelined_exact(void **state)
{
    enum { N = 60 };
    static const struct limiter_params p = { LIMITER_SLIDING_LOG, 20, 60000, 0 };
    char key[128];
    key_new(key, sizeof(key), "pipe");
    struct store_limit l = { key, strlen(key), &p, 1 };
    struct got g[N];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < N; i++)
        assert_non_null(store_decide(st, &l, 1, got_cb, &g[i]));
    int64_t end = mono_ms() + 5000;
    int done = 0, allowed = 0;
    while (done < N && mono_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
        done = 0;
        for (int i = 0; i < N; i++)
            done += g[i].calls;
    }
    assert_int_equal(done, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(g[i].calls, 1);
        assert_int_equal(g[i].res.status, STORE_OK);
        allowed += g[i].res.allowed;
    }
    assert_int_equal(allowed, 20);
}

/* ---- keys and expiry ------------------------------------------------------- */

static void test_every_key_has_ttl(void **state)
{
    const struct limiter_params *ps[5] = { &fixed_5s, &sliding_5s, &log_5s, &bucket_3, &gcra_3 };
    for (int i = 0; i < 5; i++) {
        char key[128];
        key_new(key, sizeof(key), "ttl");
        assert_int_equal(decide1(key, ps[i], 1, NULL), 1);
    }
    int keys = 0;
    char cursor[32] = "0";
    for (int rounds = 0; rounds < 1000; rounds++) {
        redisReply *r = cmd("SCAN %s MATCH st:* COUNT 100", cursor);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t j = 0; j < ks->elements; j++) {
            redisReply *t = cmd("PTTL %b", ks->element[j]->str, ks->element[j]->len);
            if (t->integer <= 0 && t->integer != -2)  /* -2: expired meanwhile */
                fail_msg("key %s has PTTL %lld", ks->element[j]->str, t->integer);
            freeReplyObject(t);
            keys++;
        }
        freeReplyObject(r);
        if (strcmp(cursor, "0") == 0)
            break;
    }
    assert_true(keys >= 5);
}

static void test_fixed_window_expires_at_window_end(void **state)
{
    static const struct limiter_params p = { LIMITER_FIXED_WINDOW, 5, 2000, 0 };
    char key[128];
    key_new(key, sizeof(key), "fwttl");
    wait_phase(2000, 1200);
    struct limiter_result r;
    assert_int_equal(decide1(key, &p, 1, &r), 1);
    int64_t now = redis_now_ms();
    redisReply *t = cmd("PTTL %s", key);
    int64_t end = (now / 2000 + 1) * 2000;
    assert_in_range(t->integer, 1, end - now);
    assert_true(t->integer > end - now - 300);
    assert_true(t->integer < 1000);          /* not a whole window after the hit */
    assert_in_range(r.reset_ms, t->integer, end - now + 300);
    freeReplyObject(t);
}

/* A key left by another algorithm (a reload changed it) does not fail
 * requests: it reads as absent and is replaced. */
static void test_wrong_type_key(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "type");
    freeReplyObject(cmd("SET %s hello", key));
    assert_int_equal(decide1(key, &log_5s, 1, NULL), 1);
    redisReply *t = cmd("TYPE %s", key);
    assert_string_equal(t->str, "zset");
    freeReplyObject(t);
    t = cmd("PTTL %s", key);
    assert_true(t->integer > 0);
    freeReplyObject(t);
}

/* The script refuses what it does not understand (the batch protocol of
 * limit.lua: mode P (algo limit window_ms interval_us)*P R (m (ref cost [slot]
 * [ovr])*m)*R, ref = (key * P + param) * 16 + flags),
 * and takes the same call when it is well formed. */
static void test_script_rejects_bad_arguments(void **state)
{
    extern const char limit_lua[];
    static const char *bad[][13] = {
        { "d", "1", "0", "5", "1000", "0", "1", "1", "0", "1", NULL },   /* well formed */
        { "x", "1", "0", "5", "1000", "0", "1", "1", "0", "1", NULL },   /* unknown mode */
        { "d", "2", "0", "5", "1000", "0", "1", "1", "0", "1", NULL },   /* P = 2, one set */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "0", NULL },        /* missing cost */
        { "d", "1", "9", "5", "1000", "0", "1", "1", "0", "1", NULL },   /* unknown algo */
        { "d", "1", "0", "5", "0", "0", "1", "1", "0", "1", NULL },      /* window 0 */
        { "d", "1", "3", "5", "0", "0", "1", "1", "0", "1", NULL },      /* interval 0 */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "0", "0", NULL },   /* cost 0 */
        { "d", "1", "0", "5", "1e3x", "0", "1", "1", "0", "1", NULL },   /* not a number */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "16", "1", NULL },  /* key 2 of 1 */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "4", "1", NULL },   /* delay on a window */
        { "d", "1", "5", "5", "1000", "0", "1", "1", "0", "1", NULL },   /* concurrency, no slot */
        { "d", "1", "5", "5", "1000", "0", "1", "1", "4", "1", "7", NULL },  /* concurrency delay */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "8", "1", NULL },   /* override, no index */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "8", "1", "2", NULL },  /* override key 2 of 1 */
        { "d", "1", "0", "5", "1000", "0", "2", "1", "0", "1", NULL },   /* R = 2, one request */
        { "d", "1", "0", "5", "1000", "0", "1", "0", "0", "1", NULL },   /* a request of 0 limits */
        { "d", "1", "0", "5", "1000", "0", "1", "1", "0", "1", "7", NULL },  /* one too many */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *argv[20] = { "EVAL", limit_lua, "1", i == 0 ? "st:{test|good}" :
                                                                 "st:{test|bad}" };
        int argc = 4;
        for (int j = 0; bad[i][j] != NULL; j++)
            argv[argc++] = bad[i][j];
        redisReply *r = redisCommandArgv(rc, argc, argv, NULL);
        assert_non_null(r);
        if (i == 0 && r->type != REDIS_REPLY_ARRAY)
            fail_msg("the well formed call was refused: %s", r->type == REDIS_REPLY_ERROR ?
                     r->str : "not an array");
        if (i > 0 && r->type != REDIS_REPLY_ERROR)
            fail_msg("bad argument set %zu was accepted", i);
        freeReplyObject(r);
    }
    redisReply *r = cmd("EXISTS st:{test|bad}");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
}

/* ---- the connection -------------------------------------------------------- */

static void test_noscript_reloads(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "noscript");
    freeReplyObject(cmd("SCRIPT FLUSH"));
    struct limiter_result r;
    assert_int_equal(decide1(key, &fixed_5s, 1, &r), 1);
    /* twice in a row, with two calls in flight across the flush */
    freeReplyObject(cmd("SCRIPT FLUSH"));
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    struct got g1 = { 0 }, g2 = { 0 };
    assert_non_null(store_decide(st, &l, 1, got_cb, &g1));
    assert_non_null(store_decide(st, &l, 1, got_cb, &g2));
    loop_until(&g2.calls, 5000);
    loop_until(&g1.calls, 5000);
    assert_int_equal(g1.res.status, STORE_OK);
    assert_int_equal(g2.res.status, STORE_OK);
}

static void test_cancel(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "cancel");
    struct store_limit l = { key, strlen(key), &fixed_5m, 1 };
    struct got g = { 0 };
    struct store_call *c = store_decide(st, &l, 1, got_cb, &g);
    assert_non_null(c);
    store_cancel(c);
    loop_until(NULL, 200);
    assert_int_equal(g.calls, 0);
    /* the cancelled call was still sent: it consumed, and the store goes on */
    struct limiter_result r;
    assert_int_equal(decide1(key, &fixed_5m, 1, &r), 1);
    assert_int_equal(r.remaining, 3);
}

/* AUTH (with and without a user name) and SELECT go first on a connection;
 * a wrong password never marks the store connected. */
static void test_auth_and_db(void **state)
{
    freeReplyObject(cmd("CONFIG SET requirepass s3cret"));
    struct conf_redis cr = { 0 };
    cr.host = "127.0.0.1";
    cr.port = redis_port;
    cr.timeout_ms = 1000;
    cr.password = "wrong";
    struct store *bad = store_create(base, &cr);
    cr.password = "s3cret";
    cr.user = "default";
    cr.db = 3;
    struct store *good = store_create(base, &cr);
    loop_until_connected(good, 1, 3000);
    loop_until(NULL, 300);
    int bad_connected = store_connected(bad), good_connected = store_connected(good);
    char key[128];
    key_new(key, sizeof(key), "db3");
    struct store_limit l = { key, strlen(key), &fixed_5m, 1 };
    struct store_result res;
    int status = good_connected ? decide_on(good, &l, 1, &res) : -1;
    store_destroy(bad);
    store_destroy(good);
    freeReplyObject(cmd("CONFIG SET requirepass %s", ""));
    assert_false(bad_connected);
    assert_true(good_connected);
    assert_int_equal(status, STORE_OK);
    freeReplyObject(cmd("SELECT 3"));
    redisReply *r = cmd("EXISTS %s", key);
    int64_t in_db3 = r->integer;
    freeReplyObject(r);
    freeReplyObject(cmd("SELECT 0"));
    assert_int_equal(in_db3, 1);
}

/* A connected store of timeout_ms, then Redis paused for pause_ms. */
static struct store *store_paused(int64_t timeout_ms, int pause_ms)
{
    struct store *s = store_new(timeout_ms, redis_port);
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    freeReplyObject(cmd("CLIENT PAUSE %d", pause_ms));
    return s;
}

/* After the pause: the store connects and decides again; then it goes. */
static void store_works_again(struct store *s, const struct store_limit *l)
{
    loop_until_connected(s, 1, 3000);
    struct store_result res;
    assert_int_equal(decide_on(s, l, 1, &res), STORE_OK);
    store_destroy(s);
}

static void test_timeout(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "timeout");
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    struct store *s = store_paused(50, 500);
    struct got g = { 0 };
    int64_t t0 = mono_ms();
    assert_non_null(store_decide(s, &l, 1, got_cb, &g));
    loop_until(&g.calls, 2000);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.res.status, STORE_TIMEOUT);
    printf("timeout answered after %lld ms\n", (long long)(g.at_ms - t0));
    assert_in_range(g.at_ms - t0, 45, 200);
    /* the late reply is ignored, and the store works after the pause */
    loop_until(NULL, 700);
    assert_int_equal(g.calls, 1);
    store_works_again(s, &l);
}

/* One timer serves every call's timeout (store.c): a call cancelled early
 * does not take the others with it, and each later call times out at its
 * own due time, not at the first one's. */
static void test_timeouts_each_own(void **state)
{
    char key[128];
    key_new(key, sizeof(key), "timeouts");
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    struct store *s = store_paused(200, 700);
    struct got a = { 0 }, b = { 0 }, c = { 0 };
    struct store_call *ca = store_decide(s, &l, 1, got_cb, &a);
    assert_non_null(ca);
    loop_until(NULL, 30);
    store_cancel(ca);
    loop_until(NULL, 30);
    int64_t tb = mono_ms();
    assert_non_null(store_decide(s, &l, 1, got_cb, &b));
    loop_until(NULL, 60);
    int64_t tc = mono_ms();
    assert_non_null(store_decide(s, &l, 1, got_cb, &c));
    loop_until(&c.calls, 2000);
    printf("timeouts after %lld and %lld ms\n", (long long)(b.at_ms - tb),
           (long long)(c.at_ms - tc));
    assert_int_equal(a.calls, 0);
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.res.status, STORE_TIMEOUT);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.res.status, STORE_TIMEOUT);
    assert_in_range(b.at_ms - tb, 195, 400);
    assert_in_range(c.at_ms - tc, 195, 400);
    assert_true(c.at_ms - b.at_ms >= 40);
    /* the late replies are ignored, and the store works after the pause */
    loop_until(NULL, 800);
    assert_int_equal(a.calls, 0);
    assert_int_equal(b.calls, 1);
    assert_int_equal(c.calls, 1);
    store_works_again(s, &l);
}

/* A server that stops answering is dropped and reconnected, not queued
 * behind forever. */
static void test_stall_reconnects(void **state)
{
    struct store *s = store_new(50, redis_port);
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    char key[128];
    key_new(key, sizeof(key), "stall");
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    freeReplyObject(cmd("CLIENT PAUSE 800"));
    int64_t t0 = mono_ms();
    int saw_down = 0, timeouts = 0;
    struct got g[40];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 40 && mono_ms() - t0 < 600; i++) {
        if (!store_connected(s)) {
            saw_down = 1;
            break;
        }
        if (store_decide(s, &l, 1, got_cb, &g[i]) != NULL) {
            loop_until(&g[i].calls, 500);
            timeouts += g[i].res.status == STORE_TIMEOUT;
        }
        loop_until(NULL, 10);
    }
    assert_true(timeouts >= 1);
    assert_true(saw_down);
    printf("stall detected after %lld ms\n", (long long)(mono_ms() - t0));
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    struct store_result res;
    assert_int_equal(decide_on(s, &l, 1, &res), STORE_OK);
    store_destroy(s);
}

static void test_redis_down_and_back(void **state)
{
    struct store *s = store_new(200, redis_port);
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    char key[128];
    key_new(key, sizeof(key), "down");
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    redis_stop();
    /* in flight at the moment, or right after: NULL or an error, no crash */
    struct store_result res;
    int st1 = decide_on(s, &l, 1, &res);
    assert_true(st1 == -1 || st1 == STORE_ERROR);
    loop_until_connected(s, 0, 2000);
    assert_false(store_connected(s));
    /* NULL in the backoff; during a reconnect attempt the call waits for
     * it, and the refusal answers it with an error at once */
    for (int i = 0; i < 2; i++) {
        int64_t t1 = mono_ms();
        int st2 = decide_on(s, &l, 1, &res);
        assert_true(st2 == -1 || st2 == STORE_ERROR);
        assert_true(mono_ms() - t1 < 100);
        loop_until(NULL, 150);
    }
    int64_t t0 = mono_ms();
    redis_start();
    loop_until_connected(s, 1, 3000);
    int64_t took = mono_ms() - t0;
    printf("reconnected %lld ms after the restart began\n", (long long)took);
    assert_true(store_connected(s));
    assert_true(took <= 1500);
    assert_int_equal(decide_on(s, &l, 1, &res), STORE_OK);   /* script reloaded */
    assert_int_equal(res.allowed, 1);
    store_destroy(s);
    /* the shared store recovers too */
    loop_until_connected(st, 1, 6000);
    assert_true(store_connected(st));
}

static void test_not_connected(void **state)
{
    struct store *s = store_new(100, testlib_free_port());   /* nothing listens there */
    loop_until(NULL, 300);
    /* in the backoff after a refused attempt (during one, decisions wait) */
    for (int i = 0; i < 100 && store_retry_ms(s) < 20; i++)
        loop_until(NULL, 10);
    assert_true(store_retry_ms(s) >= 20);
    assert_false(store_connected(s));
    struct store_limit l = { "st:{x}", 6, &fixed_5s, 1 };
    struct got g = { 0 };
    assert_null(store_decide(s, &l, 1, got_cb, &g));
    loop_until(NULL, 50);
    assert_int_equal(g.calls, 0);
    store_destroy(s);
}

static void test_destroy_with_calls_pending(void **state)
{
    struct store *s = store_new(1000, redis_port);
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    struct store_limit l = { "st:{test|destroy}", 17, &fixed_5s, 1 };
    struct got g[3];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 3; i++)
        assert_non_null(store_decide(s, &l, 1, got_cb, &g[i]));
    store_cancel(NULL);
    store_destroy(s);
    loop_until(NULL, 100);
    for (int i = 0; i < 3; i++)
        assert_int_equal(g[i].calls, 0);
}

/* ---- Redis Cluster ----------------------------------------------------------
 *
 * Two cluster-enabled redis-servers started here, slots split in halves:
 * enough for routing by slot, cross-slot groups with refunds, and a slot
 * migrated by hand (ASK, then MOVED). The 3x3 cluster lives in the Python
 * suite (tests/integration/test_cluster.py). */

#define NCLUSTER 2
static pid_t cl_pid[NCLUSTER] = { -1, -1 };
static int cl_port[NCLUSTER];
static redisContext *cl_rc[NCLUSTER];
static char cl_dir[64];
static char cl_seed[32];
static char *cl_seeds[1] = { cl_seed };

/* A free port whose cluster bus port (+10000) is free too: the kernel's
 * ephemeral ports are often too high for that. */
static int cluster_free_port(void)
{
    for (int tries = 0; tries < 1000; tries++) {
        int port = 20000 + rand() % 25000, ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sin = { .sin_family = AF_INET };
            sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            sin.sin_port = htons((uint16_t)(port + 10000 * k));
            ok = fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
            if (fd >= 0)
                close(fd);
        }
        if (ok)
            return port;
    }
    abort();
}

static pid_t spawn_cluster_node(int port)
{
    char conf[128];
    snprintf(conf, sizeof(conf), "nodes-%d.conf", port);
    const char *cluster[] = { "--dir", cl_dir, "--cluster-enabled", "yes",
                              "--cluster-config-file", conf, "--cluster-node-timeout", "2000",
                              NULL };
    return testlib_redis_start(port, cluster);
}

static redisContext *connect_port(int port)
{
    struct timeval tv = { 1, 0 };
    for (int i = 0; i < 200; i++) {          /* up to ~4 s */
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (c != NULL && !c->err) {
            redisSetTimeout(c, tv);
            redisReply *r = redisCommand(c, "PING");
            int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
            if (ok)
                return c;
        }
        if (c != NULL)
            redisFree(c);
        sleep_ms(20);
    }
    return NULL;
}

static redisReply *ccmd(int node, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(cl_rc[node], fmt, ap);
    va_end(ap);
    assert_non_null(r);
    return r;
}

static void ccmd_ok(int node, const char *fmt, const char *a, const char *b)
{
    redisReply *r = ccmd(node, fmt, a, b);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("node %d: %s", node, r->str);
    freeReplyObject(r);
}

static int cluster_ok(int node)
{
    redisReply *r = ccmd(node, "CLUSTER INFO");
    int ok = r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") != NULL &&
             strstr(r->str, "cluster_known_nodes:2") != NULL;
    freeReplyObject(r);
    return ok;
}

static void cluster_myid(int node, char *out)
{
    redisReply *r = ccmd(node, "CLUSTER MYID");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, 64, "%s", r->str);
    freeReplyObject(r);
}

static int cluster_setup(void **state)
{
    snprintf(cl_dir, sizeof(cl_dir), "/tmp/sluice-test-store-XXXXXX");
    if (mkdtemp(cl_dir) == NULL) {
        fprintf(stderr, "test_store: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    srand((unsigned)getpid() ^ (unsigned)mono_ms());
    for (int i = 0; i < NCLUSTER; i++) {
        do
            cl_port[i] = cluster_free_port();
        while (i > 0 && cl_port[i] == cl_port[0]);
        cl_pid[i] = spawn_cluster_node(cl_port[i]);
    }
    for (int i = 0; i < NCLUSTER; i++)
        if ((cl_rc[i] = connect_port(cl_port[i])) == NULL) {
            fprintf(stderr, "test_store: cluster node on %d did not start\n", cl_port[i]);
            return -1;
        }
    freeReplyObject(ccmd(0, "CLUSTER ADDSLOTSRANGE 0 8191"));
    freeReplyObject(ccmd(1, "CLUSTER ADDSLOTSRANGE 8192 16383"));
    freeReplyObject(ccmd(0, "CLUSTER MEET 127.0.0.1 %d", cl_port[1]));
    int64_t end = mono_ms() + 15000;
    while (!(cluster_ok(0) && cluster_ok(1)) && mono_ms() < end)
        sleep_ms(50);
    if (!(cluster_ok(0) && cluster_ok(1))) {
        fprintf(stderr, "test_store: the 2-node cluster did not form\n");
        return -1;
    }
    snprintf(cl_seed, sizeof(cl_seed), "127.0.0.1:%d", cl_port[0]);
    base = event_base_new();
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = { 0, 2000 };
    event_add(tick, &tv);
    return 0;
}

static int cluster_teardown(void **state)
{
    if (base != NULL) {
        event_free(tick);
        event_base_free(base);
        base = NULL;
    }
    for (int i = 0; i < NCLUSTER; i++) {
        if (cl_rc[i] != NULL)
            redisFree(cl_rc[i]);
        cl_rc[i] = NULL;
        testlib_redis_stop(cl_pid[i]);
        cl_pid[i] = -1;
        char path[128];
        snprintf(path, sizeof(path), "%s/nodes-%d.conf", cl_dir, cl_port[i]);
        unlink(path);
    }
    rmdir(cl_dir);
    return 0;
}

static struct store *cluster_store(int64_t timeout_ms)
{
    struct conf_redis cr = { 0 };
    cr.timeout_ms = timeout_ms;
    cr.prefix = "st:";
    cr.cluster = cl_seeds;
    cr.ncluster = 1;
    struct store *s = store_create(base, &cr);
    loop_until_connected(s, 1, 5000);
    assert_true(store_connected(s));
    return s;
}

/* A key (of the route key shape) whose slot is on the given node: slots
 * 0..8191 are on node 0. */
static void key_on(char *out, size_t size, const char *what, int node)
{
    for (;;) {
        key_new(out, size, what);
        int slot = store_slot(out, strlen(out));
        if ((slot < 8192) == (node == 0))
            return;
    }
}

/* 1 or 0; -1 when the node answers MOVED (not its slot). ASKING first lets
 * an importing node answer for a slot it is taking over. */
static int64_t exists_on(int node, const char *key)
{
    freeReplyObject(ccmd(node, "ASKING"));
    redisReply *r = ccmd(node, "EXISTS %s", key);
    int64_t v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* The specification's test vector and Redis' own CLUSTER KEYSLOT. */
static void test_slot_vectors(void **state)
{
    assert_int_equal(store_slot("123456789", 9), 0x31C3);
    static const char *keys[] = {
        "foo", "bar", "123456789", "{user1000}.following", "{user1000}.followers",
        "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{}", "{", "}", "a{b",
        "sluice:{login|per-ip|\x01\x02}", "", "x{y}z{w}",
    };
    assert_int_equal(store_slot("{user1000}.following", 20),
                     store_slot("{user1000}.followers", 20));
    assert_int_equal(store_slot("foo{bar}{zap}", 13), store_slot("bar", 3));
    assert_int_equal(store_slot("foo{{bar}}zap", 13), store_slot("{bar", 4));
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        redisReply *r = redisCommand(cl_rc[0], "CLUSTER KEYSLOT %b", keys[i], strlen(keys[i]));
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_int_equal(store_slot(keys[i], strlen(keys[i])), r->integer);
        freeReplyObject(r);
    }
    for (int i = 0; i < 2000; i++) {         /* random bytes, tags included */
        char k[24];
        size_t len = (size_t)(rand() % 20);
        for (size_t j = 0; j < len; j++)
            k[j] = "ab{}|\x00\xff"[rand() % 7];
        redisReply *r = redisCommand(cl_rc[0], "CLUSTER KEYSLOT %b", k, len);
        assert_int_equal(store_slot(k, len), r->integer);
        freeReplyObject(r);
    }
}

/* Each key lands on the master that owns its slot. */
static void test_cluster_routes_by_slot(void **state)
{
    struct store *s = cluster_store(1000);
    for (int node = 0; node < NCLUSTER; node++) {
        for (int i = 0; i < 5; i++) {
            char key[128];
            key_on(key, sizeof(key), "route", node);
            struct store_limit l = { key, strlen(key), &fixed_5m, 1 };
            struct store_result res;
            assert_int_equal(decide_on(s, &l, 1, &res), STORE_OK);
            assert_int_equal(res.allowed, 1);
            assert_int_equal(res.r[0].remaining, 4);
            assert_int_equal(exists_on(node, key), 1);
            assert_int_equal(exists_on(!node, key), -1);  /* MOVED: not its slot */
        }
    }
    uint64_t ask, moved;
    store_redirects(&ask, &moved);
    assert_int_equal(ask + moved, 0);        /* the map was right */
    store_destroy(s);
}

/* PTTL of a key on a node: -2 absent, -1 no TTL (never allowed). */
static int64_t pttl_on(int node, const char *key)
{
    redisReply *r = ccmd(node, "PTTL %s", key);
    int64_t v = r->integer;
    freeReplyObject(r);
    return v;
}

/* Two limits in two slots: A (the algorithm under test, on node 0) and B
 * (one per minute, on node 1). The second request is denied by B; what A
 * consumed for it must be given back exactly, keeping A's TTL. */
static void refund_case(const struct limiter_params *pa, int64_t cost)
{
    static const struct limiter_params one = { LIMITER_FIXED_WINDOW, 1, 60000, 0 };
    struct store *s = cluster_store(1000);
    char ka[128], kb[128];
    key_on(ka, sizeof(ka), "refundA", 0);
    key_on(kb, sizeof(kb), "refundB", 1);
    struct store_limit l[2] = { { ka, strlen(ka), pa, cost }, { kb, strlen(kb), &one, 1 } };
    struct store_result res;
    assert_int_equal(decide_on(s, l, 2, &res), STORE_OK);
    assert_int_equal(res.allowed, 1);
    assert_int_equal(res.r[0].remaining, pa->limit - cost);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(decide_on(s, l, 2, &res), STORE_OK);
        assert_int_equal(res.allowed, 0);
        assert_int_equal(res.n, 2);
        assert_int_equal(res.r[1].allowed, 0);
        assert_in_range(res.r[1].retry_ms, 1, 60000);
        assert_int_equal(res.r[0].allowed, 1);
        /* reported as if not consumed, like limit.lua in one slot */
        assert_int_equal(res.r[0].remaining, pa->limit - cost);
    }
    loop_until(NULL, 100);                   /* the refunds are fire and forget */
    int64_t t = pttl_on(0, ka);
    if (t != -2 && t <= 0)
        fail_msg("key %s has PTTL %lld after a refund", ka, (long long)t);
    /* A alone: only the first request's cost is gone */
    struct store_limit la = { ka, strlen(ka), pa, cost };
    assert_int_equal(decide_on(s, &la, 1, &res), STORE_OK);
    assert_int_equal(res.allowed, 1);
    assert_int_equal(res.r[0].remaining, pa->limit - 2 * cost);
    if (pa->algo == LIMITER_SLIDING_LOG) {
        redisReply *r = ccmd(0, "ZCARD %s", ka);
        assert_int_equal(r->integer, 2 * cost);
        freeReplyObject(r);
    }
    store_destroy(s);
}

static const struct limiter_params big_fixed = { LIMITER_FIXED_WINDOW, 10, 60000, 0 };
static const struct limiter_params big_sliding = { LIMITER_SLIDING_WINDOW, 10, 60000, 0 };
static const struct limiter_params big_log = { LIMITER_SLIDING_LOG, 10, 60000, 0 };
static const struct limiter_params big_bucket = { LIMITER_TOKEN_BUCKET, 10, 600000, 60000000 };
static const struct limiter_params big_gcra = { LIMITER_GCRA, 10, 600000, 60000000 };

static void test_refund_fixed_window(void **state) { refund_case(&big_fixed, 1); refund_case(&big_fixed, 3); }
static void test_refund_sliding_window(void **state) { refund_case(&big_sliding, 1); refund_case(&big_sliding, 3); }
static void test_refund_sliding_log(void **state) { refund_case(&big_log, 1); refund_case(&big_log, 3); }
static void test_refund_token_bucket(void **state) { refund_case(&big_bucket, 1); refund_case(&big_bucket, 3); }
static void test_refund_gcra(void **state) { refund_case(&big_gcra, 1); refund_case(&big_gcra, 3); }

/* Limits in one slot stay one atomic call even in a cluster; a route in
 * three slots over two nodes admits exactly its tightest limit. */
static void test_cluster_cross_slot_exact(void **state)
{
    enum { N = 40 };
    static const struct limiter_params p5 = { LIMITER_SLIDING_LOG, 5, 60000, 0 };
    static const struct limiter_params p20 = { LIMITER_GCRA, 20, 600000, 30000000 };
    static const struct limiter_params p30 = { LIMITER_FIXED_WINDOW, 30, 60000, 0 };
    struct store *s = cluster_store(1000);
    char k1[128], k2[128], k3[128];
    key_on(k1, sizeof(k1), "x1", 0);
    key_on(k2, sizeof(k2), "x2", 1);
    key_on(k3, sizeof(k3), "x3", 0);
    struct store_limit l[3] = { { k2, strlen(k2), &p20, 1 }, { k1, strlen(k1), &p5, 1 },
                                { k3, strlen(k3), &p30, 1 } };
    struct got g[N];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < N; i++)
        assert_non_null(store_decide(s, l, 3, got_cb, &g[i]));
    int64_t end = mono_ms() + 5000;
    int done = 0, allowed = 0;
    while (done < N && mono_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
        done = 0;
        for (int i = 0; i < N; i++)
            done += g[i].calls;
    }
    assert_int_equal(done, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(g[i].res.status, STORE_OK);
        allowed += g[i].res.allowed;
    }
    assert_int_equal(allowed, 5);
    loop_until(NULL, 200);                   /* refunds land */
    redisReply *r = ccmd(0, "GET %s", k3);   /* fixed window: "F<window> <count>" */
    assert_non_null(r->str);
    assert_non_null(strstr(r->str, " 5"));   /* only the admitted */
    assert_string_equal(strstr(r->str, " 5"), " 5");
    freeReplyObject(r);
    r = ccmd(0, "ZCARD %s", k1);
    assert_int_equal(r->integer, 5);
    freeReplyObject(r);
    struct store_limit l2 = { k2, strlen(k2), &p20, 1 };
    struct store_result res;
    assert_int_equal(decide_on(s, &l2, 1, &res), STORE_OK);
    assert_int_equal(res.r[0].remaining, 20 - 6);   /* GCRA: 5 admitted + this one */
    store_destroy(s);
}

/* A slot moved by hand from node 0 to node 1: while it migrates, a key not
 * yet moved is served by node 0 and a new one reaches node 1 by ASK; once
 * moved, MOVED takes every key there, and the counts stay exact. */
static void test_cluster_ask_and_moved(void **state)
{
    struct store *s = cluster_store(1000);
    char kold[128], knew[128], id0[64], id1[64];
    key_on(kold, sizeof(kold), "mig", 0);
    int slot = store_slot(kold, strlen(kold));
    /* a second key of the same slot: same tag, so it must match the slot */
    for (;;) {
        key_on(knew, sizeof(knew), "mig", 0);
        if (store_slot(knew, strlen(knew)) == slot)
            break;
    }
    cluster_myid(0, id0);
    cluster_myid(1, id1);
    struct store_limit lo = { kold, strlen(kold), &fixed_5m, 1 };
    struct store_limit ln = { knew, strlen(knew), &fixed_5m, 1 };
    struct store_result res;
    assert_int_equal(decide_on(s, &lo, 1, &res), STORE_OK);
    assert_int_equal(res.r[0].remaining, 4);
    char slotstr[16];
    snprintf(slotstr, sizeof(slotstr), "%d", slot);
    ccmd_ok(1, "CLUSTER SETSLOT %s IMPORTING %s", slotstr, id0);
    ccmd_ok(0, "CLUSTER SETSLOT %s MIGRATING %s", slotstr, id1);
    uint64_t ask0, moved0, ask1, moved1;
    store_redirects(&ask0, &moved0);
    assert_int_equal(decide_on(s, &lo, 1, &res), STORE_OK);   /* still on node 0 */
    assert_int_equal(res.r[0].remaining, 3);
    assert_int_equal(decide_on(s, &ln, 1, &res), STORE_OK);   /* ASK: node 1 */
    assert_int_equal(res.r[0].remaining, 4);
    assert_int_equal(exists_on(1, knew), 1);
    store_redirects(&ask1, &moved1);
    assert_true(ask1 > ask0);
    /* move the old key and finish the migration */
    redisReply *r = ccmd(0, "MIGRATE 127.0.0.1 %d %s 0 2000", cl_port[1], kold);
    assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    ccmd_ok(1, "CLUSTER SETSLOT %s NODE %s", slotstr, id1);
    ccmd_ok(0, "CLUSTER SETSLOT %s NODE %s", slotstr, id1);
    assert_int_equal(decide_on(s, &lo, 1, &res), STORE_OK);   /* MOVED: node 1 */
    assert_int_equal(res.r[0].remaining, 2);
    assert_int_equal(decide_on(s, &ln, 1, &res), STORE_OK);
    assert_int_equal(res.r[0].remaining, 3);
    store_redirects(&ask0, &moved0);
    assert_true(moved0 > moved1);
    assert_int_equal(exists_on(0, kold), -1);
    /* and back, so later tests find the halves as they were */
    ccmd_ok(0, "CLUSTER SETSLOT %s IMPORTING %s", slotstr, id1);
    ccmd_ok(1, "CLUSTER SETSLOT %s MIGRATING %s", slotstr, id0);
    r = ccmd(1, "MIGRATE 127.0.0.1 %d %s 0 2000 KEYS %s %s", cl_port[0], "", kold, knew);
    assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    ccmd_ok(0, "CLUSTER SETSLOT %s NODE %s", slotstr, id0);
    ccmd_ok(1, "CLUSTER SETSLOT %s NODE %s", slotstr, id0);
    store_destroy(s);
}

/* A master killed: calls in flight or sent meanwhile get an error or a
 * timeout (never a hang or a crash), and the other master keeps working. */
static void test_cluster_node_down(void **state)
{
    struct store *s = cluster_store(200);
    char k0[128], k1[128];
    key_on(k0, sizeof(k0), "down", 0);
    key_on(k1, sizeof(k1), "down", 1);
    struct store_limit l0 = { k0, strlen(k0), &fixed_5m, 1 };
    struct store_limit l1 = { k1, strlen(k1), &fixed_5m, 1 };
    struct store_result res;
    assert_int_equal(decide_on(s, &l1, 1, &res), STORE_OK);
    kill(cl_pid[1], SIGSTOP);                /* hangs: worse than a close */
    int status = decide_on(s, &l1, 1, &res);
    assert_true(status == STORE_TIMEOUT || status == STORE_ERROR);
    assert_int_equal(decide_on(s, &l0, 1, &res), STORE_OK);
    kill(cl_pid[1], SIGCONT);
    int64_t end = mono_ms() + 3000;
    do {
        loop_until(NULL, 50);
        status = decide_on(s, &l1, 1, &res);
    } while (status != STORE_OK && mono_ms() < end);
    assert_int_equal(status, STORE_OK);
    store_destroy(s);
}

/* ---- setup ----------------------------------------------------------------- */

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    redis_port = testlib_free_port();
    redis_start();
    base = event_base_new();
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = { 0, 2000 };
    event_add(tick, &tv);
    st = store_new(1000, redis_port);
    loop_until_connected(st, 1, 3000);
    if (!store_connected(st)) {
        fprintf(stderr, "test_store: the store did not connect\n");
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    store_destroy(st);
    event_free(tick);
    event_base_free(base);
    redis_stop();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_script_rejects_bad_arguments),
        cmocka_unit_test(test_seed_fixed_window),
        cmocka_unit_test(test_seed_sliding_log),
        cmocka_unit_test(test_seed_token_bucket),
        cmocka_unit_test(test_seed_gcra),
        cmocka_unit_test(test_retry_exact_fixed_window),
        cmocka_unit_test(test_retry_exact_sliding_window),
        cmocka_unit_test(test_retry_exact_sliding_log),
        cmocka_unit_test(test_retry_exact_token_bucket),
        cmocka_unit_test(test_retry_exact_gcra),
        cmocka_unit_test(test_sliding_log_entries_leave_in_order),
        cmocka_unit_test(test_cost_above_limit),
        cmocka_unit_test(test_multi_all_or_nothing),
        cmocka_unit_test(test_pipelined_exact),
        cmocka_unit_test(test_wrong_type_key),
        cmocka_unit_test(test_fixed_window_expires_at_window_end),
        cmocka_unit_test(test_noscript_reloads),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_not_connected),
        cmocka_unit_test(test_destroy_with_calls_pending),
        cmocka_unit_test(test_auth_and_db),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_timeouts_each_own),
        cmocka_unit_test(test_stall_reconnects),
        cmocka_unit_test(test_redis_down_and_back),
        cmocka_unit_test(test_every_key_has_ttl),
    };
    const struct CMUnitTest cluster_tests[] = {
        cmocka_unit_test(test_slot_vectors),
        cmocka_unit_test(test_cluster_routes_by_slot),
        cmocka_unit_test(test_refund_fixed_window),
        cmocka_unit_test(test_refund_sliding_window),
        cmocka_unit_test(test_refund_sliding_log),
        cmocka_unit_test(test_refund_token_bucket),
        cmocka_unit_test(test_refund_gcra),
        cmocka_unit_test(test_cluster_cross_slot_exact),
        cmocka_unit_test(test_cluster_ask_and_moved),
        cmocka_unit_test(test_cluster_node_down),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    base = NULL;
    failed += cmocka_run_group_tests_name("cluster", cluster_tests, cluster_setup,
                                          cluster_teardown);
    return failed;
}
