/* sluice - test_denycache.c: the per-worker deny cache. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "backend.h"
#include "denycache.h"
#include "limiter.h"

static void test_put_get_expire(void **state)
{
    struct denycache *dc = denycache_create(10);
    assert_int_equal(denycache_get(dc, "a", 1, 0, 1, NULL), 0);
    denycache_put(dc, "a", 1, 1000, 1, 7);
    int64_t lim = 0;
    assert_int_equal(denycache_get(dc, "a", 1, 400, 1, &lim), 600);
    assert_int_equal(lim, 7);           /* the limit that denied, for the headers */
    assert_int_equal(denycache_get(dc, "b", 1, 400, 1, NULL), 0);
    /* A prefix of a key is another key. */
    denycache_put(dc, "ab", 2, 5000, 1, 0);
    assert_int_equal(denycache_get(dc, "a", 1, 400, 1, NULL), 600);
    assert_int_equal(denycache_get(dc, "a", 1, 1000, 1, NULL), 0);     /* expired, dropped */
    assert_int_equal(denycache_size(dc), 1);
    denycache_destroy(dc);
}

static void test_later_deadline_wins(void **state)
{
    struct denycache *dc = denycache_create(10);
    denycache_put(dc, "k", 1, 1000, 1, 0);
    denycache_put(dc, "k", 1, 500, 1, 0);     /* never shortens */
    assert_int_equal(denycache_get(dc, "k", 1, 0, 1, NULL), 1000);
    denycache_put(dc, "k", 1, 2000, 1, 0);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 1, NULL), 2000);
    assert_int_equal(denycache_size(dc), 1);
    denycache_destroy(dc);
}

static void test_lru_bound(void **state)
{
    struct denycache *dc = denycache_create(100);
    char key[32];
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(key, sizeof(key), "key-%d", i);
        denycache_put(dc, key, (size_t)n, 10000, 1, 0);
        if (i == 50)    /* touch key-0 so it stays recent */
            assert_true(denycache_get(dc, "key-0", 5, 0, 1, NULL) > 0);
    }
    assert_int_equal(denycache_size(dc), 100);
    assert_int_equal(denycache_get(dc, "key-999", 7, 0, 1, NULL), 10000);
    assert_int_equal(denycache_get(dc, "key-1", 5, 0, 1, NULL), 0);    /* evicted */
    assert_int_equal(denycache_get(dc, "key-899", 7, 0, 1, NULL), 0);  /* evicted */
    assert_int_equal(denycache_get(dc, "key-900", 7, 0, 1, NULL), 10000);
    denycache_destroy(dc);
}

/* A denial at cost 6 says nothing about a request costing 4. */
static void test_cheaper_request_not_denied(void **state)
{
    struct denycache *dc = denycache_create(10);
    denycache_put(dc, "k", 1, 1000, 6, 0);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 4, NULL), 0);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 6, NULL), 1000);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 9, NULL), 1000);
    denycache_put(dc, "k", 1, 500, 2, 0);     /* a cheaper denial: now 2+ */
    assert_int_equal(denycache_get(dc, "k", 1, 0, 3, NULL), 500);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 1, NULL), 0);
    denycache_destroy(dc);
}

/* A denial is kept one tick of the coarse clock short of its retry, and not
 * at all when the retry is within a tick: a check whose clock lags a tick
 * never refuses a request past the limit's own retry. */
static void test_remember_short_of_the_retry(void **state)
{
    struct denycache *dc = denycache_create(10);
    struct limiter_params p = { .algo = LIMITER_TOKEN_BUCKET, .limit = 1, .window_ms = 1000 };
    struct store_limit sl[2] = {
        { .key = "long", .keylen = 4, .params = &p, .cost = 1 },
        { .key = "short", .keylen = 5, .params = &p, .cost = 1 },
    };
    int64_t tick = denycache_tick_ms();
    assert_true(tick >= 1 && tick <= 100);
    struct limiter_result r[2] = {
        { .allowed = 0, .limit = 1, .retry_ms = 1000, .reset_ms = 1000 },
        { .allowed = 0, .limit = 1, .retry_ms = tick, .reset_ms = tick },
    };
    denycache_remember(dc, sl, 2, r, 5000);
    assert_int_equal(denycache_size(dc), 1);
    assert_int_equal(denycache_get(dc, "short", 5, 5000, 1, NULL), 0);
    assert_int_equal(denycache_get(dc, "long", 4, 5000, 1, NULL), 1000 - tick);
    assert_int_equal(denycache_get(dc, "long", 4, 6000 - tick - 1, 1, NULL), 1);
    assert_int_equal(denycache_get(dc, "long", 4, 6000 - tick, 1, NULL), 0);
    denycache_destroy(dc);
}

static void test_disabled(void **state)
{
    struct denycache *dc = denycache_create(0);
    denycache_put(dc, "k", 1, 1000, 1, 0);
    assert_int_equal(denycache_get(dc, "k", 1, 0, 1, NULL), 0);
    denycache_destroy(dc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_expire),
        cmocka_unit_test(test_later_deadline_wins),
        cmocka_unit_test(test_lru_bound),
        cmocka_unit_test(test_cheaper_request_not_denied),
        cmocka_unit_test(test_remember_short_of_the_retry),
        cmocka_unit_test(test_disabled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
