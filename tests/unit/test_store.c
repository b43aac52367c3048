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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <cmocka.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "store.h"

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

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET };
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sin);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) != 0)
        abort();
    close(fd);
    return ntohs(sin.sin_port);
}

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
    char port[16];
    snprintf(port, sizeof(port), "%d", redis_port);
    redis_pid = fork();
    if (redis_pid < 0)
        abort();
    if (redis_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);    /* never outlive a crashed test */
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
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
    if (redis_pid <= 0)
        return;
    kill(redis_pid, SIGKILL);
    for (int i = 0; i < 300; i++) {          /* up to ~3 s */
        if (waitpid(redis_pid, NULL, WNOHANG) == redis_pid)
            break;
        sleep_ms(10);
    }
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

/* The script refuses what it does not understand. */
static void test_script_rejects_bad_arguments(void **state)
{
    extern const char limit_lua[];
    static const char *bad[][9] = {
        { "x", "1", "0", "5", "1000", "0", "1", "0", NULL },   /* unknown mode */
        { "d", "2", "0", "5", "1000", "0", "1", "0", NULL },   /* n != #KEYS */
        { "d", "1", "0", "5", "1000", "0", "1", NULL },        /* missing flags */
        { "d", "1", "9", "5", "1000", "0", "1", "0", NULL },   /* unknown algo */
        { "d", "1", "0", "5", "0", "0", "1", "0", NULL },      /* window 0 */
        { "d", "1", "3", "5", "0", "0", "1", "0", NULL },      /* interval 0 */
        { "d", "1", "0", "5", "1000", "0", "0", "0", NULL },   /* cost 0 */
        { "d", "1", "0", "5", "1e3x", "0", "1", "0", NULL },   /* not a number */
        { "d", "1", "0", "5", "1000", "0", "1", "4", NULL },   /* unknown flag */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *argv[12] = { "EVAL", limit_lua, "1", "st:{test|bad}" };
        int argc = 4;
        for (int j = 0; bad[i][j] != NULL; j++)
            argv[argc++] = bad[i][j];
        redisReply *r = redisCommandArgv(rc, argc, argv, NULL);
        assert_non_null(r);
        if (r->type != REDIS_REPLY_ERROR)
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

static void test_timeout(void **state)
{
    struct store *s = store_new(50, redis_port);
    loop_until_connected(s, 1, 3000);
    assert_true(store_connected(s));
    char key[128];
    key_new(key, sizeof(key), "timeout");
    struct store_limit l = { key, strlen(key), &fixed_5s, 1 };
    freeReplyObject(cmd("CLIENT PAUSE 500"));
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
    loop_until_connected(s, 1, 3000);
    struct store_result res;
    assert_int_equal(decide_on(s, &l, 1, &res), STORE_OK);
    store_destroy(s);
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
    assert_int_equal(decide_on(s, &l, 1, &res), -1);
    loop_until(NULL, 150);
    assert_int_equal(decide_on(s, &l, 1, &res), -1);
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
    struct store *s = store_new(100, free_port());   /* nothing listens there */
    loop_until(NULL, 300);
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

/* ---- setup ----------------------------------------------------------------- */

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    redis_port = free_port();
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
        cmocka_unit_test(test_stall_reconnects),
        cmocka_unit_test(test_redis_down_and_back),
        cmocka_unit_test(test_every_key_has_ttl),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
