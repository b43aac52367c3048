/* sluice - test_runtime.c: unit tests of runtime refcounting (src/runtime.c).
 *
 * One event base, no threads: a runtime keeps its config while referenced;
 * the last release of a retired runtime frees it from the loop (not inside
 * the release); consecutive runtimes share a backend only when the backend
 * settings agree; a retired store stops counting in sluice_redis_connected;
 * runtime_destroy_all frees what the loop did not. The config's hold count
 * (conf->refs) shows when a runtime is gone. Run from tests/unit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <event2/event.h>

#include "conf.h"
#include "memstore.h"
#include "runtime.h"
#include "store.h"

/* A config on a Redis nobody listens on (port 1): stores never connect. */
static struct conf *load(const char *backend_and_redis)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "listen: 127.0.0.1:8080\n%s"
             "upstreams:\n  api:\n    servers: [127.0.0.1:9000]\n"
             "routes:\n  - name: r\n    match: { path: / }\n    upstream: api\n",
             backend_and_redis);
    char path[] = "/tmp/sluice_test_runtime_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char *err = NULL;
    struct conf *c = conf_load(path, &err);
    unlink(path);
    if (c == NULL)
        fail_msg("conf: %s", err);
    return c;
}

#define REDIS_A "redis:\n  url: redis://127.0.0.1:1/0\n  timeout: 100ms\n"
#define REDIS_B "redis:\n  url: redis://127.0.0.1:1/0\n  timeout: 200ms\n"
#define REDIS_S "redis:\n  sentinel:\n    master: m\n    nodes: [127.0.0.1:1]\n  timeout: 100ms\n"
#define MEMORY  "backend: memory\n"

static void loop_once(struct event_base *base)
{
    event_base_loop(base, EVLOOP_NONBLOCK);
}

static void test_last_release_frees_from_the_loop(void **state)
{
    struct event_base *base = event_base_new();
    struct memstore *m = memstore_create(100);
    struct conf *c1 = load(REDIS_A), *c2 = load(REDIS_B);
    struct runtime *a = runtime_create(base, c1, m, NULL);
    assert_int_equal(c1->refs, 2);
    struct runtime *req = runtime_retain(a);     /* a request in flight */
    struct runtime *b = runtime_create(base, c2, m, a);
    assert_ptr_equal(a->newer, b);
    assert_ptr_equal(b->older, a);
    runtime_retire(a, b);
    runtime_release(a);                         /* the worker's reference */
    loop_once(base);
    assert_int_equal(c1->refs, 2);              /* the request still holds it */
    runtime_release(req);
    assert_int_equal(c1->refs, 2);              /* not inside the release */
    loop_once(base);
    assert_int_equal(c1->refs, 1);              /* freed by the loop */
    assert_null(b->older);
    runtime_destroy_all(b);
    assert_int_equal(c2->refs, 1);
    conf_release(c1);
    conf_release(c2);
    memstore_destroy(m);
    event_base_free(base);
}

static void test_current_runtime_lives_without_requests(void **state)
{
    struct event_base *base = event_base_new();
    struct memstore *m = memstore_create(100);
    struct conf *c = load(MEMORY);
    struct runtime *a = runtime_create(base, c, m, NULL);
    runtime_release(runtime_retain(a));         /* a request came and went */
    loop_once(base);
    assert_int_equal(c->refs, 2);               /* not retired: kept */
    assert_int_equal(a->refs, 1);
    assert_null(runtime_store(a));
    runtime_destroy_all(a);
    assert_int_equal(c->refs, 1);
    conf_release(c);
    memstore_destroy(m);
    event_base_free(base);
}

static void test_backend_shared_only_when_settings_agree(void **state)
{
    struct event_base *base = event_base_new();
    struct memstore *m = memstore_create(100);
    struct conf *ca = load(REDIS_A), *ca2 = load(REDIS_A), *cb = load(REDIS_B);
    struct conf *cs = load(REDIS_S), *cm = load(MEMORY), *cm2 = load(MEMORY);
    struct runtime *r1 = runtime_create(base, ca, m, NULL);
    struct runtime *r2 = runtime_create(base, ca2, m, r1);      /* same redis */
    assert_ptr_equal(runtime_backend(r1), runtime_backend(r2));
    struct runtime *r3 = runtime_create(base, cb, m, r2);       /* timeout changed */
    assert_ptr_not_equal(runtime_backend(r3), runtime_backend(r2));
    struct runtime *r4 = runtime_create(base, cs, m, r3);       /* sentinel: section */
    assert_ptr_not_equal(runtime_backend(r4), runtime_backend(r3));
    assert_non_null(runtime_store(r4));
    struct runtime *r5 = runtime_create(base, cm, m, r4);       /* memory */
    assert_null(runtime_store(r5));
    struct runtime *r6 = runtime_create(base, cm2, m, r5);
    assert_ptr_equal(runtime_backend(r5), runtime_backend(r6));
    /* r1 goes first, r2 still uses the backend they share */
    runtime_retire(r1, r2);
    runtime_release(r1);
    loop_once(base);
    assert_int_equal(ca->refs, 1);
    assert_non_null(runtime_store(r2));
    runtime_destroy_all(r6);                    /* every older one too */
    struct conf *all[] = { ca, ca2, cb, cs, cm, cm2 };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        assert_int_equal(all[i]->refs, 1);
        conf_release(all[i]);
    }
    memstore_destroy(m);
    event_base_free(base);
}

static void test_same_conf_compares_the_whole_section(void **state)
{
    struct conf *a = load(REDIS_A), *a2 = load(REDIS_A), *b = load(REDIS_B);
    struct conf *s = load(REDIS_S);
    struct conf *c = load("redis:\n  cluster: [127.0.0.1:1]\n  timeout: 100ms\n");
    struct conf *c2 = load("redis:\n  cluster: [127.0.0.1:2]\n  timeout: 100ms\n");
    struct conf *d = load("redis:\n  url: redis://127.0.0.1:1/0\n  timeout: 100ms\n"
                          "  on_error: deny\n  prefix: \"x:\"\n");
    assert_true(store_same_conf(&a->redis, &a2->redis));
    assert_false(store_same_conf(&a->redis, &b->redis));
    assert_false(store_same_conf(&a->redis, &s->redis));
    assert_false(store_same_conf(&a->redis, &c->redis));
    assert_false(store_same_conf(&c->redis, &c2->redis));
    assert_true(store_same_conf(&a->redis, &d->redis));   /* on_error, prefix: not the store's */
    struct conf *all[] = { a, a2, b, s, c, c2, d };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        conf_release(all[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_release_frees_from_the_loop),
        cmocka_unit_test(test_current_runtime_lives_without_requests),
        cmocka_unit_test(test_backend_shared_only_when_settings_agree),
        cmocka_unit_test(test_same_conf_compares_the_whole_section),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
