/* sluice - test_backend.c: the one decide/cancel/ready contract (backend.h).
 *
 * Each case runs on both kinds: a memory backend over a real memstore, and a
 * Redis backend on a redis-server the test starts on a free loopback port.
 * Both on a real libevent base: an answer comes exactly once, later, from
 * the loop (never from inside backend_decide), a cancelled call is never
 * answered (also when cancelled from another call's callback), a callback
 * may decide again, and destroying a backend with calls pending answers
 * none of them. Every wait is bounded; redis-server is killed by its PID. */
#include <errno.h>
#include <fcntl.h>
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
#include <netinet/in.h>
#include <sys/socket.h>
#include <cmocka.h>
#include <event2/event.h>

#include "backend.h"
#include "clock.h"
#include "memstore.h"
#include "store.h"
#include "testlib.h"

enum kind { KIND_MEMORY, KIND_REDIS };

static struct event_base *base;
static struct event *tick;          /* keeps EVLOOP_ONCE from blocking long */
static struct memstore *mem;
static pid_t redis_pid = -1;
static int redis_port;
static int key_seq;
static int in_decide;               /* set while backend_decide() runs */

static const struct limiter_params two_per_min = { LIMITER_FIXED_WINDOW, 2, 60000, 0 };

/* ---- the loop and the redis-server ------------------------------------------- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Run the loop until *flag reaches want (flag NULL: for max_ms). */
static void loop_until(const int *flag, int want, int64_t max_ms)
{
    int64_t end = clock_us() / 1000 + max_ms;
    while ((flag == NULL || *flag < want) && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
}

static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void redis_start(void)
{
    redis_pid = testlib_redis_start(redis_port, NULL);
    for (int i = 0; i < 200 && !port_open(redis_port); i++)     /* up to ~4 s */
        sleep_ms(20);
}

static void redis_stop(void)
{
    testlib_redis_stop(redis_pid);
    redis_pid = -1;
}

/* ---- backends, calls, answers -------------------------------------------------- */

static struct backend *backend_new_on(enum kind k, int port)
{
    if (k == KIND_MEMORY)
        return memstore_backend_create(base, mem);
    struct conf_redis cr = { 0 };
    cr.host = "127.0.0.1";
    cr.port = port;
    cr.timeout_ms = 2000;
    cr.prefix = "bt:";
    return store_backend_create(base, &cr);
}

/* A backend of kind k, ready to decide. */
static struct backend *backend_new(enum kind k)
{
    struct backend *b = backend_new_on(k, redis_port);
    assert_non_null(b);
    int64_t end = clock_us() / 1000 + 3000;
    while (!backend_ready(b) && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(backend_ready(b));
    return b;
}

struct got {
    int calls;
    struct store_result res;
    /* What the callback does next. */
    struct backend *b;
    struct got *peer;               /* cancel the peer's call, if not answered */
    struct backend_call *call;      /* this got's own call */
    int again;                      /* decide this many more times */
    const struct store_limit *limit;
};

static void got_cb(void *arg, const struct store_result *res);

static struct backend_call *decide(struct backend *b, const struct store_limit *l, int n,
                                   struct got *g)
{
    in_decide = 1;
    struct backend_call *c = backend_decide(b, l, n, got_cb, g);
    in_decide = 0;
    g->call = c;
    return c;
}

static void got_cb(void *arg, const struct store_result *res)
{
    struct got *g = arg;
    assert_false(in_decide);        /* never from inside backend_decide */
    g->calls++;
    g->res = *res;
    if (g->peer && g->peer->calls == 0 && g->peer->call) {
        backend_cancel(g->b, g->peer->call);
        g->peer->call = NULL;
    }
    if (g->again > 0) {
        g->again--;
        /* got_cb asserts that the new call is not answered inside it. */
        assert_non_null(decide(g->b, g->limit, 1, g));
    }
}

static void key_new(char *out, size_t size, const char *what)
{
    snprintf(out, size, "bt:{%s|%d|%d}", what, (int)getpid(), ++key_seq);
}

static enum kind kind_of(void **state)
{
    return (enum kind)(intptr_t)*state;
}

/* ---- the contract --------------------------------------------------------------- */

/* The answer comes once, from the loop, and is the decision. */
static void test_answer_later_once(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64];
    key_new(key, sizeof(key), "once");
    struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
    struct got g = { 0 };
    assert_non_null(decide(b, &l, 1, &g));
    assert_int_equal(g.calls, 0);
    loop_until(&g.calls, 1, 3000);
    loop_until(NULL, 0, 50);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.res.status, STORE_OK);
    assert_int_equal(g.res.n, 1);
    assert_true(g.res.allowed);
    assert_int_equal(g.res.r[0].limit, 2);
    assert_int_equal(g.res.r[0].remaining, 1);
    backend_destroy(b);
}

/* The limits need live only during backend_decide(): the key is overwritten
 * at once, and the third decision on it still denies. */
static void test_limits_copied(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64], copy[64];
    key_new(key, sizeof(key), "copied");
    memcpy(copy, key, sizeof(key));
    struct got g[3];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 3; i++) {
        struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
        assert_non_null(decide(b, &l, 1, &g[i]));
        memset(key, 'x', strlen(key));
        memset(&l, 0, sizeof(l));
        loop_until(&g[i].calls, 1, 3000);
        assert_int_equal(g[i].calls, 1);
        assert_int_equal(g[i].res.status, STORE_OK);
        memcpy(key, copy, sizeof(key));
    }
    assert_true(g[0].res.allowed);
    assert_true(g[1].res.allowed);
    assert_false(g[2].res.allowed);
    assert_int_equal(g[2].res.r[0].remaining, 0);
    assert_true(g[2].res.r[0].retry_ms > 0 && g[2].res.r[0].retry_ms <= 60000);
    backend_destroy(b);
}

static void test_cancel(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64];
    key_new(key, sizeof(key), "cancel");
    struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
    struct got a = { 0 }, c = { 0 };
    struct backend_call *ca = decide(b, &l, 1, &a);
    assert_non_null(ca);
    assert_non_null(decide(b, &l, 1, &c));
    backend_cancel(b, ca);
    backend_cancel(b, NULL);                /* nothing to cancel: a no-op */
    loop_until(&c.calls, 1, 3000);
    loop_until(NULL, 0, 50);
    assert_int_equal(a.calls, 0);
    assert_int_equal(c.calls, 1);
    backend_destroy(b);
}

/* Two calls answered in the same loop pass: whichever runs first cancels the
 * other, which then never runs. */
static void test_cancel_from_other_callback(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64];
    key_new(key, sizeof(key), "cross");
    struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
    struct got a = { 0 }, c = { 0 };
    a.b = c.b = b;
    a.peer = &c;
    c.peer = &a;
    assert_non_null(decide(b, &l, 1, &a));
    assert_non_null(decide(b, &l, 1, &c));
    loop_until(NULL, 0, 300);
    assert_int_equal(a.calls + c.calls, 1);
    backend_destroy(b);
}

/* A callback decides again (three more times): each new call is answered
 * later, never inside the decide made from the callback. */
static void test_decide_again_from_callback(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64];
    key_new(key, sizeof(key), "again");
    static const struct limiter_params ten = { LIMITER_FIXED_WINDOW, 10, 60000, 0 };
    struct store_limit l = { key, strlen(key), &ten, 1, 0 };
    struct got g = { 0 };
    g.b = b;
    g.again = 3;
    g.limit = &l;
    assert_non_null(decide(b, &l, 1, &g));
    loop_until(&g.calls, 4, 3000);
    loop_until(NULL, 0, 50);
    assert_int_equal(g.calls, 4);
    assert_int_equal(g.res.status, STORE_OK);
    assert_int_equal(g.res.r[0].remaining, 6);
    backend_destroy(b);
}

/* Destroyed with calls pending: none is answered (ASan sees any late use). */
static void test_destroy_with_calls_pending(void **state)
{
    struct backend *b = backend_new(kind_of(state));
    char key[64];
    key_new(key, sizeof(key), "destroy");
    struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
    struct got g[3];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 3; i++)
        assert_non_null(decide(b, &l, 1, &g[i]));
    backend_destroy(b);
    backend_destroy(NULL);
    loop_until(NULL, 0, 100);
    for (int i = 0; i < 3; i++)
        assert_int_equal(g[i].calls, 0);
}

/* Many calls pending at once, twice over (pooled calls come back): each is
 * answered exactly once. */
static void test_many_pending(void **state)
{
    enum { N = 500 };
    struct backend *b = backend_new(kind_of(state));
    static struct got g[N];
    static char keys[N][48];
    for (int round = 0; round < 2; round++) {
        memset(g, 0, sizeof(g));
        for (int i = 0; i < N; i++) {
            key_new(keys[i], sizeof(keys[i]), "many");
            struct store_limit l = { keys[i], strlen(keys[i]), &two_per_min, 1, 0 };
            assert_non_null(decide(b, &l, 1, &g[i]));
        }
        int64_t end = clock_us() / 1000 + 5000;
        int done = 0;
        while (done < N && clock_us() / 1000 < end) {
            event_base_loop(base, EVLOOP_ONCE);
            done = 0;
            for (int i = 0; i < N; i++)
                done += g[i].calls;
        }
        loop_until(NULL, 0, 30);
        for (int i = 0; i < N; i++) {
            assert_int_equal(g[i].calls, 1);
            assert_int_equal(g[i].res.status, STORE_OK);
            assert_true(g[i].res.allowed);
        }
    }
    backend_destroy(b);
}

static void test_ready(void **state)
{
    enum kind k = kind_of(state);
    struct backend *b = backend_new_on(k, redis_port);
    if (k == KIND_MEMORY) {
        assert_true(backend_ready(b));
        assert_null(backend_store(b));
        assert_int_equal(backend_retry_ms(b), 0);
    } else {
        /* Connecting in the background: not ready until the loop ran. */
        assert_false(backend_ready(b));
        assert_non_null(backend_store(b));
        backend_destroy(b);
        b = backend_new(k);
        assert_true(backend_ready(b));
        assert_int_equal(backend_retry_ms(b), 0);
    }
    backend_destroy(b);
}

/* A Redis backend that cannot reach its server is not ready and, while it
 * waits out the backoff after a refused attempt, cannot decide: NULL at
 * once, and no callback ever. (While an attempt is in flight a decision
 * waits for it instead.) */
static void test_redis_unreachable(void **state)
{
    struct backend *b = backend_new_on(KIND_REDIS, testlib_free_port());   /* nothing listens */
    loop_until(NULL, 0, 300);
    for (int i = 0; i < 100 && backend_retry_ms(b) < 20; i++)
        loop_until(NULL, 0, 10);
    assert_true(backend_retry_ms(b) >= 20);
    assert_false(backend_ready(b));
    char key[64];
    key_new(key, sizeof(key), "down");
    struct store_limit l = { key, strlen(key), &two_per_min, 1, 0 };
    struct got g = { 0 };
    assert_null(decide(b, &l, 1, &g));
    loop_until(NULL, 0, 50);
    assert_int_equal(g.calls, 0);
    backend_destroy(b);
}

/* The memory backend refuses what limit.lua would refuse, still from the
 * loop and still once. */
static void test_memory_bad_input(void **state)
{
    struct backend *b = backend_new(KIND_MEMORY);
    struct store_limit l[STORE_MAX_LIMITS + 1];
    for (int i = 0; i <= STORE_MAX_LIMITS; i++)
        l[i] = (struct store_limit){ "bt:bad", 6, &two_per_min, 1, 0 };
    struct got none = { 0 }, many = { 0 };
    assert_non_null(decide(b, l, 0, &none));
    assert_non_null(decide(b, l, STORE_MAX_LIMITS + 1, &many));
    assert_int_equal(none.calls + many.calls, 0);
    loop_until(&many.calls, 1, 1000);
    loop_until(NULL, 0, 30);
    assert_int_equal(none.calls, 1);
    assert_int_equal(many.calls, 1);
    assert_int_equal(none.res.status, STORE_ERROR);
    assert_int_equal(many.res.status, STORE_ERROR);
    backend_destroy(b);
}

/* ---- setup ------------------------------------------------------------------------ */

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    redis_port = testlib_free_port();
    redis_start();
    if (!port_open(redis_port)) {
        fprintf(stderr, "test_backend: redis-server did not start on port %d\n", redis_port);
        return -1;
    }
    base = event_base_new();
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = clock_timeval(2);
    event_add(tick, &tv);
    mem = memstore_create(100000);
    return 0;
}

static int teardown(void **state)
{
    memstore_destroy(mem);
    event_free(tick);
    event_base_free(base);
    redis_stop();
    return 0;
}

#define BOTH(t) \
    cmocka_unit_test_prestate(t, (void *)(intptr_t)KIND_MEMORY), \
    cmocka_unit_test_prestate(t, (void *)(intptr_t)KIND_REDIS)

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(test_answer_later_once),
        BOTH(test_limits_copied),
        BOTH(test_cancel),
        BOTH(test_cancel_from_other_callback),
        BOTH(test_decide_again_from_callback),
        BOTH(test_destroy_with_calls_pending),
        BOTH(test_many_pending),
        BOTH(test_ready),
        cmocka_unit_test(test_redis_unreachable),
        cmocka_unit_test(test_memory_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
