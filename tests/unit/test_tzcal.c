/* sluice - test_tzcal.c: calendar periods in IANA zones, DST included.
 *
 * Expected values come from Python's zoneinfo (the first instant of each
 * local date), an implementation independent of tzcal.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tzcal.h"

struct bounds_case {
    const char *zone;
    enum tzcal_unit unit;
    int64_t t_ms;
    int64_t want[4];
    const char *what;
};

static const struct bounds_case cases[] = {
    { "Europe/Berlin", TZCAL_MONTH, 1773997200000LL, { 1769900400000LL, 1772319600000LL,
      1774994400000LL, 1777586400000LL }, "2026-03-20 10:00 CET: April begins in CEST" },
    { "Europe/Berlin", TZCAL_MONTH, 1793487599000LL, { 1788213600000LL, 1790805600000LL,
      1793487600000LL, 1796079600000LL }, "2026-10-31 23:59:59 CET, a second to November" },
    { "Europe/Berlin", TZCAL_DAY, 1774778400000LL, { 1774652400000LL, 1774738800000LL,
      1774821600000LL, 1774908000000LL }, "2026-03-29, a day of 23 hours" },
    { "America/New_York", TZCAL_WEEK, 1773027000000LL, { 1771822800000LL, 1772427600000LL,
      1773028800000LL, 1773633600000LL }, "Sunday 2026-03-08 23:30 EDT, weeks from Monday" },
    { "Asia/Kolkata", TZCAL_YEAR, 1798741799000LL, { 1735669800000LL, 1767205800000LL,
      1798741800000LL, 1830277800000LL }, "2026-12-31 23:59:59 IST (+05:30)" },
    { "Australia/Sydney", TZCAL_MONTH, 1775313000000LL, { 1772283600000LL, 1774962000000LL,
      1777557600000LL, 1780236000000LL }, "2026-04-05 01:30, southern DST ends that day" },
    { "America/Santiago", TZCAL_DAY, 1788706800000LL, { 1788580800000LL, 1788667200000LL,
      1788750000000LL, 1788836400000LL }, "2026-09-06: DST skips its midnight" },
    { "Europe/Berlin", TZCAL_MONTH, 3793258800000LL, { 3789586800000LL, 3792006000000LL,
      3794680800000LL, 3797272800000LL }, "2090-03-15: past the transitions, the TZ rule" },
    { "UTC", TZCAL_WEEK, 0, { -864000000LL, -259200000LL, 345600000LL, 950400000LL },
      "1970-01-01, a Thursday" },
    { "Pacific/Chatham", TZCAL_YEAR, 1780226100000LL, { 1735640100000LL, 1767176100000LL,
      1798712100000LL, 1830248100000LL }, "+12:45 and +13:45" },
};

static void test_bounds(void **state)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bounds_case *c = &cases[i];
        const char *why = NULL;
        struct tzcal *z = tzcal_load(c->zone, &why);
        int64_t b[4];
        if (z == NULL)
            fail_msg("%s: %s", c->zone, why);
        tzcal_bounds(z, c->unit, c->t_ms, b);
        for (int j = 0; j < 4; j++)
            if (b[j] != c->want[j])
                fail_msg("%s %s: b[%d] = %lld, want %lld", c->zone, c->what, j,
                         (long long)b[j], (long long)c->want[j]);
        /* every instant of the current period gives the same periods */
        tzcal_bounds(z, c->unit, c->want[1], b);
        assert_true(b[1] == c->want[1] && b[2] == c->want[2]);
        tzcal_bounds(z, c->unit, c->want[2] - 1, b);
        assert_true(b[1] == c->want[1] && b[2] == c->want[2]);
        tzcal_free(z);
    }
}

static void test_offsets(void **state)
{
    const char *why;
    struct tzcal *z = tzcal_load("Europe/Berlin", &why);
    assert_non_null(z);
    assert_int_equal(tzcal_utoff(z, 1773997200), 3600);        /* 2026-03-20, CET */
    assert_int_equal(tzcal_utoff(z, 1774746000), 7200);        /* 2026-03-29 01:00Z, CEST */
    assert_int_equal(tzcal_utoff(z, 1774745999), 3600);
    assert_int_equal(tzcal_utoff(z, 3793258800), 3600);        /* 2090-03-15: no DST yet */
    assert_int_equal(tzcal_utoff(z, 3793258800 + 30 * 86400), 7200);   /* 2090-04-14 */
    tzcal_free(z);
}

static void test_bad_names(void **state)
{
    static const char *const bad[] = {
        "Nowhere/City", "", "../etc/passwd", "/etc/localtime", "Europe/../../etc/passwd",
        "Europe/Berlin ", "Europe\\Berlin", "Europe", "zone.tab",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = NULL;
        struct tzcal *z = tzcal_load(bad[i], &why);
        if (z != NULL)
            fail_msg("'%s' loaded", bad[i]);
        assert_non_null(why);
    }
    tzcal_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_bad_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
