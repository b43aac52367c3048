/* sluice - test_memstore.c: the in-process backend.
 *
 * Runs the shared table of cases (data/limiter_cases.txt, parsed by the code
 * in test_limiter.c) through memstore_decide(), then what only the store
 * has: its key bound and LRU eviction, keys that deny evicted last, the
 * reclaiming of expired keys, key bytes, a key named twice, bad input, and
 * 4 threads deciding on one key. */
#define LCASES_PARSER_ONLY
#include "test_limiter.c"

#include <pthread.h>

#include "memstore.h"

static const struct limiter_params hour_big = { LIMITER_FIXED_WINDOW, 1000000000, 3600000, 0 };

static int decide1(struct memstore *m, const char *key, const struct limiter_params *p,
                   int64_t now_us, struct store_result *res)
{
    struct store_limit l = { key, strlen(key), p, 1, 0 };
    assert_int_equal(memstore_decide(m, &l, 1, now_us, res), 0);
    assert_int_equal(res->status, STORE_OK);
    assert_int_equal(res->n, 1);
    return res->allowed;
}

/* ---- the table ------------------------------------------------------------------ */

static int run_case_mem(struct memstore *m, int idx, const struct lcase *c, int64_t base_us)
{
    char keys[STORE_MAX_LIMITS][64];
    struct store_limit l[STORE_MAX_LIMITS];
    int bad = 0;
    for (int i = 0; i < c->nlimits; i++) {
        snprintf(keys[i], sizeof(keys[i]), "case%d:%lld:%s", idx, (long long)base_us, c->key[i]);
        l[i] = (struct store_limit){ keys[i], strlen(keys[i]), &c->p[i], 1, c->flags[i] };
    }
    for (int k = 0; k < c->nsteps; k++) {
        const struct lcase_step *s = &c->step[k];
        struct store_result res;
        for (int i = 0; i < c->nlimits; i++) {
            l[i].cost = s->cost;
            l[i].slot = s->slot;
        }
        if (s->kind == LCASE_SETTLE) {      /* a cost_from settlement in every limit */
            for (int i = 0; i < c->nlimits; i++) {
                l[i].slot = limiter_mark(&c->p[i], base_us + s->admitted_us);
                memstore_refund(m, &l[i], base_us + s->at_us);
            }
            continue;
        }
        if (s->kind != LCASE_DECIDE) {      /* release / renew every concurrency limit */
            int held = 1;
            for (int i = 0; i < c->nlimits; i++) {
                if (c->p[i].algo != LIMITER_CONCURRENCY)
                    continue;
                if (s->kind == LCASE_RELEASE)
                    memstore_release(m, &l[i], base_us + s->at_us);
                else
                    held &= memstore_renew(m, &l[i], base_us + s->at_us);
            }
            if (s->kind == LCASE_RENEW && held != s->allowed) {
                print_error("%s:%d: %s: renew got %d, want %d\n", LCASES_FILE, s->line,
                            c->name, held, s->allowed);
                bad++;
            }
            continue;
        }
        assert_int_equal(memstore_decide(m, l, c->nlimits, base_us + s->at_us, &res), 0);
        assert_int_equal(res.status, STORE_OK);
        assert_int_equal(res.n, c->nlimits);
        bad += lcase_compare(c, s, base_us, res.allowed, res.r);
    }
    return bad;
}

static void test_table(void **state)
{
    struct lcase *cases;
    struct memstore *m = memstore_create(1000000);
    int n = lcases_load(&cases), bad = 0;
    assert_true(n >= 40);
    for (int i = 0; i < n; i++) {
        bad += run_case_mem(m, i, &cases[i], 0);
        bad += run_case_mem(m, i, &cases[i], lcase_base(&cases[i]));
    }
    lcases_free(cases, n);
    memstore_destroy(m);
    assert_int_equal(bad, 0);
}

/* ---- bound, LRU, reclaim ----------------------------------------------------------- */

/* 10000 keys into a store of 100: never more than 100 held, and a key in use
 * all along is never the one evicted (its count survives). */
static void test_bound_and_lru(void **state)
{
    static const struct limiter_params five = { LIMITER_FIXED_WINDOW, 5, 3600000, 0 };
    struct memstore *m = memstore_create(100);
    struct store_result res;
    int hot_allowed = 0;
    for (int i = 0; i < 10000; i++) {
        char key[32];
        snprintf(key, sizeof(key), "cold:%d", i);
        decide1(m, key, &hour_big, 1000, &res);
        if (i % 10 == 0)
            hot_allowed += decide1(m, "hot", &five, 1000 + i, &res);
        assert_true(memstore_count(m) <= 100);
    }
    assert_true(memstore_count(m) >= 90);
    assert_int_equal(hot_allowed, 5);       /* 1000 tries, the first 5 pass */
    assert_false(decide1(m, "hot", &five, 20000, &res));
    assert_int_equal(res.r[0].retry_ms, 3600000 - 20);
    memstore_destroy(m);

    m = memstore_create(3);                 /* raised to STORE_MAX_LIMITS */
    for (int i = 0; i < 100; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k%d", i);
        decide1(m, key, &hour_big, 1000, &res);
    }
    assert_int_equal(memstore_count(m), STORE_MAX_LIMITS);
    memstore_destroy(m);
}

/* Keys whose window has passed are reclaimed by the decisions that follow,
 * whichever keys those are about; an expired key read again is fresh. */
static void test_reclaim(void **state)
{
    static const struct limiter_params one_s = { LIMITER_FIXED_WINDOW, 1, 1000, 0 };
    struct memstore *m = memstore_create(1000000);
    struct store_result res;
    char key[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "old:%d", i);
        assert_true(decide1(m, key, &one_s, 0, &res));
    }
    assert_false(decide1(m, "old:7", &one_s, 999999, &res));
    assert_true(decide1(m, "old:7", &one_s, 1000000, &res));    /* window over */
    assert_int_equal(memstore_count(m), 1000);
    /* old:7 was written again at 1 s; by 10 s it has expired too */
    for (int i = 0; i < 1024 || i % 64 || memstore_count(m) > 1024; i++) {
        snprintf(key, sizeof(key), "new:%d", i % 1024);
        decide1(m, key, &one_s, 10000000, &res);
        if (i > 200000)
            fail_msg("expired keys not reclaimed: %zu held", memstore_count(m));
    }
    assert_int_equal(memstore_count(m), 1024);
    memstore_destroy(m);
}

/* ---- denying keys outlive a flood ------------------------------------------------- */

static void flood(struct memstore *m, const char *tag, int n, int64_t now_us)
{
    struct store_result res;
    for (int i = 0; i < n; i++) {
        char key[48];
        snprintf(key, sizeof(key), "flood:%s:%d", tag, i);
        assert_true(decide1(m, key, &hour_big, now_us, &res));
    }
}

/* A denied key, and a key whose quota is used up without a denial yet, stay
 * denied however many other keys come: in one stripe of 16 and in 64
 * stripes of 16. On a single LRU list both were evicted and allowed again. */
static void test_denying_keys_survive_flood(void **state)
{
    static const struct limiter_params two = { LIMITER_FIXED_WINDOW, 2, 3600000, 0 };
    static const struct limiter_params burst2 = { LIMITER_TOKEN_BUCKET, 2, 2000, 1000000 };
    static const size_t sizes[] = { 16, 1024 };
    for (int k = 0; k < 2; k++) {
        struct memstore *m = memstore_create(sizes[k]);
        struct store_result res;
        int64_t t = LCASE_EPOCH_US;
        assert_true(decide1(m, "denied", &two, t, &res));
        assert_true(decide1(m, "denied", &two, t, &res));
        assert_false(decide1(m, "denied", &two, t, &res));
        assert_true(decide1(m, "spent", &burst2, t, &res));
        assert_true(decide1(m, "spent", &burst2, t, &res));
        assert_int_equal(res.r[0].remaining, 0);
        flood(m, "a", 20000, t + 1000);
        assert_true(memstore_count(m) <= sizes[k]);
        assert_false(decide1(m, "denied", &two, t + 2000, &res));
        assert_int_equal(res.r[0].retry_ms, 3600000 - 2);
        assert_false(decide1(m, "spent", &burst2, t + 2000, &res));
        assert_int_equal(res.r[0].retry_ms, 998);
        memstore_destroy(m);
    }
}

/* A hold ends when the key would pass again: from then on it is an LRU key
 * like any other (here it goes, and its client starts afresh). */
static void test_hold_ends(void **state)
{
    static const struct limiter_params burst2 = { LIMITER_TOKEN_BUCKET, 2, 2000, 1000000 };
    struct memstore *m = memstore_create(16);
    struct store_result res;
    int64_t t = LCASE_EPOCH_US;
    assert_true(decide1(m, "spent", &burst2, t, &res));
    assert_true(decide1(m, "spent", &burst2, t, &res));
    flood(m, "a", 100, t + 1000);
    assert_false(decide1(m, "spent", &burst2, t + 2000, &res));
    /* at t + 1 s one token is back: no longer denying, so the flood may take it */
    flood(m, "b", 100, t + 1000000);
    assert_true(decide1(m, "spent", &burst2, t + 1000001, &res));
    assert_int_equal(res.r[0].remaining, 1);        /* a full bucket again */
    memstore_destroy(m);
}

/* Every key denying: the table stays bounded (the least recently used held
 * key goes), and a decision fetching STORE_MAX_LIMITS new keys into a full
 * stripe never evicts a key it has already fetched. */
static void test_all_denying_bounded(void **state)
{
    static const struct limiter_params zero = { LIMITER_FIXED_WINDOW, 0, 3600000, 0 };
    struct memstore *m = memstore_create(16);
    struct store_result res;
    char keys[STORE_MAX_LIMITS][16];
    struct store_limit l[STORE_MAX_LIMITS];
    for (int i = 0; i < 40; i++) {
        char key[16];
        snprintf(key, sizeof(key), "d%d", i);
        assert_false(decide1(m, key, &zero, 1000, &res));
        assert_true(memstore_count(m) <= 16);
    }
    assert_true(decide1(m, "open", &hour_big, 1000, &res));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < STORE_MAX_LIMITS; i++) {
            snprintf(keys[i], sizeof(keys[i]), "n%d:%d", round, i);
            l[i] = (struct store_limit){ keys[i], strlen(keys[i]), round == 1 ? &zero : &hour_big,
                                         1, 0 };
        }
        assert_int_equal(memstore_decide(m, l, STORE_MAX_LIMITS, 2000, &res), 0);
        assert_int_equal(res.allowed, round != 1);
        assert_int_equal(memstore_count(m), 16);
        /* all 16 are there: each allows once more (hour_big) or still denies */
        assert_int_equal(memstore_decide(m, l, STORE_MAX_LIMITS, 2000, &res), 0);
        for (int i = 0; i < STORE_MAX_LIMITS; i++)
            assert_int_equal(res.r[i].remaining, round == 1 ? 0 : hour_big.limit - 2);
    }
    memstore_destroy(m);
}

/* ---- keys, input ------------------------------------------------------------------ */

static void test_key_bytes(void **state)
{
    static const struct limiter_params one = { LIMITER_FIXED_WINDOW, 1, 1000, 0 };
    struct memstore *m = memstore_create(1000);
    struct store_result res;
    char big[10000];
    memset(big, 'x', sizeof(big));
    struct store_limit a = { "k\0a", 3, &one, 1, 0 }, b = { "k\0b", 3, &one, 1, 0 };
    struct store_limit c = { "k", 1, &one, 1, 0 }, d = { big, sizeof(big), &one, 1, 0 };
    struct store_limit e = { big, sizeof(big) - 1, &one, 1, 0 }, empty = { "", 0, &one, 1, 0 };
    const struct store_limit *all[] = { &a, &b, &c, &d, &e, &empty };
    for (int i = 0; i < 6; i++) {       /* six distinct keys: each allows once */
        assert_int_equal(memstore_decide(m, all[i], 1, 0, &res), 0);
        assert_true(res.allowed);
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(memstore_decide(m, all[i], 1, 0, &res), 0);
        assert_false(res.allowed);
    }
    assert_int_equal(memstore_count(m), 6);
    memstore_destroy(m);
}

/* Two limits naming one key read the same state and write it once, as the
 * Lua's second HSET overwrites the first with the same value. */
static void test_same_key_twice(void **state)
{
    static const struct limiter_params five = { LIMITER_FIXED_WINDOW, 5, 1000, 0 };
    struct memstore *m = memstore_create(1000);
    struct store_limit l[2] = { { "dup", 3, &five, 1, 0 }, { "dup", 3, &five, 1, 0 } };
    struct store_result res;
    for (int want = 4; want >= 0; want--) {
        assert_int_equal(memstore_decide(m, l, 2, 0, &res), 0);
        assert_true(res.allowed);
        assert_int_equal(res.r[0].remaining, want);
        assert_int_equal(res.r[1].remaining, want);
    }
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), 0);
    assert_false(res.allowed);
    memstore_destroy(m);
}

static void test_bad_input(void **state)
{
    static const struct limiter_params ok = { LIMITER_FIXED_WINDOW, 5, 1000, 0 };
    static const struct limiter_params no_window = { LIMITER_FIXED_WINDOW, 5, 0, 0 };
    static const struct limiter_params no_interval = { LIMITER_GCRA, 5, 1000, 0 };
    struct memstore *m = memstore_create(1000);
    struct store_limit l[STORE_MAX_LIMITS + 1];
    struct store_result res;
    for (int i = 0; i <= STORE_MAX_LIMITS; i++)
        l[i] = (struct store_limit){ "k", 1, &ok, 1, 0 };
    assert_int_equal(memstore_decide(m, l, 0, 0, &res), -1);
    assert_int_equal(res.status, STORE_ERROR);
    assert_int_equal(memstore_decide(m, l, STORE_MAX_LIMITS + 1, 0, &res), -1);
    assert_int_equal(memstore_decide(m, l, STORE_MAX_LIMITS, 0, &res), 0);
    assert_int_equal(res.status, STORE_OK);
    l[1].cost = 0;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), -1);
    l[1].cost = 1;
    l[1].params = &no_window;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), -1);
    l[1].params = &no_interval;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), -1);
    l[1].params = &ok;
    l[1].flags = 4;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), -1);
    l[1].flags = STORE_SHADOW | STORE_CHECK_ONLY;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), 0);     /* k: 1 unit used */
    l[1].flags = 0;
    l[1].key = NULL;
    assert_int_equal(memstore_decide(m, l, 2, 0, &res), -1);
    assert_int_equal(res.status, STORE_ERROR);
    /* the refused calls consumed nothing; the accepted one named "k" 16
     * times and wrote it once */
    l[1].key = "k";
    assert_int_equal(memstore_decide(m, l, 1, 0, &res), 0);
    assert_int_equal(res.r[0].remaining, 2);
    memstore_destroy(m);
}

/* ---- threads -------------------------------------------------------------------------- */

#define THREADS 4
#define PER_THREAD 10000
#define QUOTA 25000

struct hammer {
    struct memstore *m;
    const struct limiter_params *p;     /* on "one" */
    const struct limiter_params *p2;    /* NULL, or a second limit on "two" */
    int admitted;
};

static void *hammer_run(void *arg)
{
    struct hammer *h = arg;
    struct store_limit l[2] = { { "one", 3, h->p, 1, 0 }, { "two", 3, h->p2, 1, 0 } };
    for (int i = 0; i < PER_THREAD; i++) {
        struct store_result res;
        /* the clock wobbles back and forth by up to 1 ms across threads */
        if (memstore_decide(h->m, l, h->p2 ? 2 : 1, LCASE_EPOCH_US + i % 1000, &res) != 0)
            abort();
        h->admitted += res.allowed;
    }
    return NULL;
}

static int hammer(const struct limiter_params *p, const struct limiter_params *p2)
{
    struct memstore *m = memstore_create(1000);
    struct hammer h[THREADS];
    pthread_t t[THREADS];
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
        h[i] = (struct hammer){ m, p, p2, 0 };
        assert_int_equal(pthread_create(&t[i], NULL, hammer_run, &h[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        total += h[i].admitted;
    }
    if (p2) {       /* the allowing limit consumed exactly what was admitted */
        struct store_result res;
        decide1(m, "two", p2, LCASE_EPOCH_US + 1000, &res);
        assert_int_equal(res.r[0].remaining, p2->limit - total - 1);
    }
    memstore_destroy(m);
    return total;
}

static void test_threads_exact(void **state)
{
    static const struct limiter_params all[] = {
        { LIMITER_FIXED_WINDOW, QUOTA, 3600000, 0 },
        { LIMITER_SLIDING_WINDOW, QUOTA, 3600000, 0 },
        { LIMITER_SLIDING_LOG, QUOTA, 3600000, 0 },
        { LIMITER_TOKEN_BUCKET, QUOTA, 1000000, 1000000000 },  /* no refill in 1 ms */
        { LIMITER_GCRA, QUOTA, 1000000, 1000000000 },
    };
    static const struct limiter_params small = { LIMITER_SLIDING_LOG, 10000, 3600000, 0 };
    for (int a = 0; a < 5; a++)
        assert_int_equal(hammer(&all[a], NULL), QUOTA);
    /* all or nothing under contention: the smaller limit decides */
    assert_int_equal(hammer(&small, &all[0]), 10000);
}

/* ---- delay refunds and slots (the verbs the table's Lua runner has no fake
 * clock for: refund.lua reads Redis TIME) ---------------------------------------- */

/* gcra 10/s burst 1 delay 1 s: 4 at once wait 0, 100, 200, 300 ms; two held
 * ones give their reservation back, so the next waits 200 ms, not 400. A
 * bucket's refund is capped at full (the key goes). */
static void test_delay_refund(void **state)
{
    static const struct limiter_params gcra = { LIMITER_GCRA, 1, 100, 100000, 1000 };
    static const struct limiter_params bucket = { LIMITER_TOKEN_BUCKET, 2, 200, 100000, 1000 };
    struct memstore *m = memstore_create(1000);
    struct store_result res;
    struct store_limit l = { "g", 1, &gcra, 1, 0 };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(memstore_decide(m, &l, 1, 0, &res), 0);
        assert_true(res.allowed);
        assert_int_equal(res.r[0].retry_ms, i * 100);
    }
    memstore_refund(m, &l, 0);
    memstore_refund(m, &l, 0);
    assert_int_equal(memstore_decide(m, &l, 1, 0, &res), 0);
    assert_int_equal(res.r[0].retry_ms, 200);
    for (int i = 0; i < 10; i++)            /* never below now: the key goes */
        memstore_refund(m, &l, 0);
    assert_int_equal(memstore_decide(m, &l, 1, 0, &res), 0);
    assert_int_equal(res.r[0].retry_ms, 0);

    struct store_limit b = { "b", 1, &bucket, 1, 0 };
    for (int i = 0; i < 4; i++)             /* tokens 2 -> -2 */
        assert_int_equal(memstore_decide(m, &b, 1, 0, &res), 0);
    assert_int_equal(res.r[0].retry_ms, 200);
    memstore_refund(m, &b, 0);              /* -1 */
    assert_int_equal(memstore_decide(m, &b, 1, 0, &res), 0);
    assert_true(res.allowed);
    assert_int_equal(res.r[0].retry_ms, 200);
    memstore_destroy(m);
}

/* Slots of two requests on one key: a release frees one at once; a renewal
 * moves the lease; the lease frees the other. */
static void test_slots_release_renew(void **state)
{
    static const struct limiter_params conc = { LIMITER_CONCURRENCY, 2, 1000, 0 };
    struct memstore *m = memstore_create(1000);
    struct store_result res;
    struct store_limit l[3] = { { "c", 1, &conc, 1, 0, 11 }, { "c", 1, &conc, 1, 0, 12 },
                                { "c", 1, &conc, 1, 0, 13 } };
    assert_int_equal(memstore_decide(m, &l[0], 1, 0, &res), 0);
    assert_int_equal(memstore_decide(m, &l[1], 1, 0, &res), 0);
    assert_true(res.allowed);
    assert_int_equal(memstore_decide(m, &l[2], 1, 1000, &res), 0);
    assert_false(res.allowed);
    assert_int_equal(res.r[0].retry_ms, 1000);
    memstore_release(m, &l[0], 2000);
    memstore_release(m, &l[0], 2000);       /* twice: nothing more */
    assert_int_equal(memstore_decide(m, &l[2], 1, 3000, &res), 0);
    assert_true(res.allowed);
    assert_int_equal(res.r[0].remaining, 0);
    assert_true(memstore_renew(m, &l[1], 900000));          /* slot 12: until 1.9 s */
    assert_int_equal(memstore_decide(m, &l[0], 1, 1500000, &res), 0);
    assert_true(res.allowed);               /* 13 lapsed at 1.003 s, 12 renewed */
    assert_int_equal(memstore_decide(m, &l[2], 1, 1600000, &res), 0);
    assert_false(res.allowed);
    assert_int_equal(memstore_decide(m, &l[2], 1, 1900000, &res), 0);
    assert_true(res.allowed);               /* 12's renewed lease ended */
    memstore_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_bound_and_lru),
        cmocka_unit_test(test_reclaim),
        cmocka_unit_test(test_denying_keys_survive_flood),
        cmocka_unit_test(test_hold_ends),
        cmocka_unit_test(test_all_denying_bounded),
        cmocka_unit_test(test_key_bytes),
        cmocka_unit_test(test_same_key_twice),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_threads_exact),
        cmocka_unit_test(test_delay_refund),
        cmocka_unit_test(test_slots_release_renew),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
