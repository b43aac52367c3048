/* sluice - test_decide.c: the decision (decide.c) against backends that are
 * not Redis.
 *
 * The deciding backend is a real memory backend (backend.c over a real
 * memstore, answering from the event loop as backend.h promises); the
 * on_error cases use a Redis backend aimed at a port where nothing listens,
 * which never connects, so every decision meets on_error at once. Configs
 * come from YAML through conf_load(), as sluice reads them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <event2/event.h>

#include "backend.h"
#include "conf.h"
#include "decide.h"
#include "denycache.h"
#include "memstore.h"
#include "metrics.h"
#include "route.h"
#include "runtime.h"
#include "store.h"

static const char CONF_HEAD[] =
    "listen: 127.0.0.1:18080\n"
    "workers: 1\n"
    "redis:\n"
    "  url: redis://127.0.0.1:1/0\n"
    "  timeout: 1s\n"
    "  prefix: \"t:\"\n"
    "  on_error: %s\n"
    "upstreams:\n"
    "  api:\n"
    "    servers: [127.0.0.1:18081]\n"
    "routes:\n"
    "  - name: one\n"
    "    match: { path: /one }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - { name: one, algorithm: fixed_window, limit: 1, window: 1h, key: [path] }\n"
    "  - name: shadow\n"
    "    match: { path: /shadow }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - { name: sh, algorithm: fixed_window, limit: 1, window: 1h, key: [path], shadow: true }\n"
    "  - name: login\n"
    "    match: { path: /login }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - { name: fails, algorithm: fixed_window, limit: 1, window: 1h, key: [path],\n"
    "          count_status: [401] }\n";

struct fixture {
    struct event_base *base;
    struct memstore *mem;
    struct backend *backend, *local;
    struct denycache *deny;
    struct conf *conf;
    struct decide_env env;
    struct decision dec;
    char ip[ROUTE_IP_MAX];  /* the client address, as request.c sets it */
    size_t ip_len;
    int calls;              /* callbacks seen */
    int verdict;
};

static struct conf *load(const char *on_error)
{
    char path[] = "/tmp/test_decide_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, CONF_HEAD, on_error);
    fclose(f);
    char *err = NULL;
    struct conf *c = conf_load(path, &err);
    unlink(path);
    if (c == NULL)
        fail_msg("conf_load: %s", err);
    runtime_bind_metrics(c);
    return c;
}

static struct fixture *setup(const char *on_error, int redis)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx->base = event_base_new();
    fx->mem = memstore_create(1000);
    fx->conf = load(on_error);
    fx->backend = redis ? store_backend_create(fx->base, &fx->conf->redis)
                        : memstore_backend_create(fx->base, fx->mem);
    fx->local = memstore_backend_create(fx->base, fx->mem);
    fx->deny = denycache_create(100);
    fx->env = (struct decide_env){ fx->backend, fx->local, fx->deny };
    return fx;
}

static void teardown(struct fixture *fx)
{
    decide_cancel(&fx->dec);
    decide_free(&fx->dec);
    backend_destroy(fx->backend);
    backend_destroy(fx->local);
    denycache_destroy(fx->deny);
    memstore_destroy(fx->mem);
    conf_release(fx->conf);
    event_base_free(fx->base);
    free(fx);
}

static void done_cb(void *arg, int verdict)
{
    struct fixture *fx = arg;
    fx->calls++;
    fx->verdict = verdict;
}

static const struct conf_route *route_named(const struct conf *c, const char *name)
{
    for (int i = 0; i < c->nroutes; i++)
        if (strcmp(c->routes[i].name, name) == 0)
            return &c->routes[i];
    fail_msg("no route %s", name);
    return NULL;
}

/* Decide one request for path on route; a pending decision is run to its
 * callback. The path is given in a buffer that is scribbled over once
 * decide_start() returns, as a worker's scratch would be by other requests:
 * the decision must not need it any more. */
static int decide_path(struct fixture *fx, const char *route, const char *path)
{
    static const struct http1_head empty_head = { .host = -1 };
    decide_reset(&fx->dec);
    memcpy(fx->ip, "192.0.2.1", 10);
    fx->ip_len = 9;
    size_t n = strlen(path);
    char *scratch = malloc(n + 1);
    assert_non_null(scratch);
    memcpy(scratch, path, n + 1);
    struct route_req req = { "", &empty_head, fx->ip, fx->ip_len, scratch, n, NULL };
    fx->calls = 0;
    int v = decide_start(&fx->dec, &fx->env, fx->conf, route_named(fx->conf, route), &req,
                         done_cb, fx);
    memset(scratch, 'X', n);
    free(scratch);
    if (v != DECIDE_PENDING) {
        assert_int_equal(fx->calls, 0);
        return v;
    }
    for (int i = 0; i < 10 && fx->calls == 0; i++)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->calls, 1);
    return fx->verdict;
}

static void test_allowed_then_denied_fills_deny_cache(void **state)
{
    struct fixture *fx = setup("allow", 0);
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_FORWARD);
    assert_true(fx->dec.have_limits);
    assert_int_equal(fx->dec.decision, METRICS_ALLOWED);
    assert_int_equal(fx->dec.rl.r[0].remaining, 0);
    /* denied by the backend, from the loop: the key goes to the deny cache
     * from the request's own copy (the path buffer was scribbled over) */
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_LIMITED);
    assert_int_equal(fx->dec.decision, METRICS_LIMITED);
    assert_int_equal(fx->dec.nkeys, 1);
    assert_true(denycache_get(fx->deny, fx->dec.keybuf + fx->dec.key[0].off, fx->dec.key[0].len,
                              0, 1, NULL) > 0);
    assert_int_equal(denycache_size(fx->deny), 1);
    /* the next one stops at the deny cache, at once */
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_LIMITED);
    assert_false(fx->dec.rl.r[0].allowed);
    assert_true(fx->dec.rl.r[0].retry_ms > 0);
    teardown(fx);
}

static void test_shadow_denial_forwards(void **state)
{
    struct fixture *fx = setup("allow", 0);
    assert_int_equal(decide_path(fx, "shadow", "/shadow"), DECIDE_FORWARD);
    assert_int_equal(fx->dec.decision, METRICS_ALLOWED);
    assert_int_equal(decide_path(fx, "shadow", "/shadow"), DECIDE_FORWARD);
    assert_int_equal(fx->dec.decision, METRICS_SHADOW_LIMITED);
    assert_false(fx->dec.rl.r[0].allowed);
    assert_int_equal(denycache_size(fx->deny), 0);      /* shadow keys are not cached */
    teardown(fx);
}

static void test_count_status_consumes_only_listed_statuses(void **state)
{
    struct fixture *fx = setup("allow", 0);
    /* check-only: a 200 consumes nothing */
    assert_int_equal(decide_path(fx, "login", "/login"), DECIDE_FORWARD);
    assert_int_equal(decide_count_status(&fx->dec, 200, done_cb, fx), 0);
    assert_int_equal(decide_path(fx, "login", "/login"), DECIDE_FORWARD);
    /* a 401 consumes, and the response waits for the answer */
    fx->calls = 0;
    assert_int_equal(decide_count_status(&fx->dec, 401, done_cb, fx), 1);
    assert_int_equal(fx->calls, 0);
    for (int i = 0; i < 10 && fx->calls == 0; i++)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->calls, 1);
    /* consumed once: nothing left to consume for this request */
    assert_int_equal(decide_count_status(&fx->dec, 401, done_cb, fx), 0);
    assert_int_equal(decide_path(fx, "login", "/login"), DECIDE_LIMITED);
    teardown(fx);
}

static void test_on_error_deny(void **state)
{
    struct fixture *fx = setup("deny", 1);
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_UNAVAILABLE);
    assert_false(fx->dec.have_limits);
    assert_int_equal(fx->dec.decision, METRICS_ERROR);
    teardown(fx);
}

static void test_on_error_allow(void **state)
{
    struct fixture *fx = setup("allow", 1);
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_FORWARD);
    assert_false(fx->dec.have_limits);
    assert_int_equal(fx->dec.decision, METRICS_ERROR);
    teardown(fx);
}

static void test_on_error_local(void **state)
{
    struct fixture *fx = setup("local", 1);
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_FORWARD);
    assert_true(fx->dec.have_limits);
    assert_int_equal(fx->dec.decision, METRICS_ALLOWED);
    assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_LIMITED);
    assert_int_equal(denycache_size(fx->deny), 0);      /* a local denial is not cached */
    teardown(fx);
}

/* A limit the memory limiter cannot compute (here a window of 0, which the
 * config never gives): its error is a 503 counted as an error, never a
 * request passed without a limit, under backend: memory and under
 * on_error: local (even with on_error's fallback being allow). */
static void test_memory_error_is_503(void **state)
{
    for (int redis = 0; redis < 2; redis++) {
        struct fixture *fx = setup(redis ? "local" : "allow", redis);
        struct conf_route *r = (struct conf_route *)route_named(fx->conf, "one");
        r->limits[0].params.window_ms = 0;
        assert_int_equal(decide_path(fx, "one", "/one"), DECIDE_UNAVAILABLE);
        assert_false(fx->dec.have_limits);
        assert_int_equal(fx->dec.decision, METRICS_ERROR);
        teardown(fx);
    }
}

static void test_cancelled_call_never_calls_back(void **state)
{
    static const struct http1_head empty_head = { .host = -1 };
    struct fixture *fx = setup("allow", 0);
    decide_reset(&fx->dec);
    memcpy(fx->ip, "192.0.2.1", 10);
    fx->ip_len = 9;
    struct route_req req = { "", &empty_head, fx->ip, fx->ip_len, "/one", 4, NULL };
    fx->calls = 0;
    assert_int_equal(decide_start(&fx->dec, &fx->env, fx->conf, route_named(fx->conf, "one"),
                                  &req, done_cb, fx), DECIDE_PENDING);
    decide_cancel(&fx->dec);
    assert_null(fx->dec.call);
    for (int i = 0; i < 5; i++)
        event_base_loop(fx->base, EVLOOP_NONBLOCK);
    assert_int_equal(fx->calls, 0);
    teardown(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed_then_denied_fills_deny_cache),
        cmocka_unit_test(test_shadow_denial_forwards),
        cmocka_unit_test(test_count_status_consumes_only_listed_statuses),
        cmocka_unit_test(test_on_error_deny),
        cmocka_unit_test(test_on_error_allow),
        cmocka_unit_test(test_on_error_local),
        cmocka_unit_test(test_memory_error_is_503),
        cmocka_unit_test(test_cancelled_call_never_calls_back),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    metrics_shutdown();
    return rc;
}
