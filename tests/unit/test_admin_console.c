/* sluice - test_admin_console.c: the console's heavy-hitter summary as
 * /api/top renders it: exact below its 64 counters, a heavy key kept among
 * many distinct ones with a bounded error, a fixed size, key parts escaped
 * and bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "admin_console.h"
#include "testlib.h"

/* "p:{ROUTE|LIMIT|LEN:PART}" as route.c builds it, prefix "p:". */
static void deny(const char *route, const char *limit, const char *part, size_t plen)
{
    char key[1024];
    int n = snprintf(key, sizeof key, "p:{%s|%s|%zu:", route, limit, plen);
    memcpy(key + n, part, plen);
    key[n + plen] = '}';
    admin_console_denied(route, limit, 2, key, (size_t)n + plen + 1, 0);
}

/* /api/top as a NUL-terminated string (the caller frees it). */
static char *top(void)
{
    struct evbuffer *b = evbuffer_new();
    const char *type, *extra;
    assert_int_equal(admin_console_serve(NULL, "/api/top", 8, b, &type, &extra), 1);
    assert_string_equal(type, "application/json");
    char *s = testlib_drain(b);
    evbuffer_free(b);
    return s;
}

static void test_off_a_worker_nothing_is_kept(void **state)
{
    deny("r0", "l", "x", 1);
    char *s = top();
    assert_non_null(strstr(s, "\"workers\":0,\"tracked\":0,\"limits\":[]"));
    free(s);
}

static void test_exact_below_capacity(void **state)
{
    admin_console_worker(0);
    for (int i = 0; i < 3; i++)
        deny("r1", "per_ip", "bob", 3);
    for (int i = 0; i < 10; i++)
        deny("r1", "per_ip", "alice", 5);
    deny("r1", "other", "carol", 5);
    char *s = top();
    assert_non_null(strstr(s, "\"workers\":1,\"tracked\":3,"));
    /* the limit with the most denied key first, its keys by count */
    assert_non_null(strstr(s, "\"limits\":[{\"route\":\"r1\",\"limit\":\"per_ip\",\"keys\":["
                              "{\"key\":[\"alice\"],\"count\":10,\"error\":0,\"truncated\":false},"
                              "{\"key\":[\"bob\"],\"count\":3,\"error\":0,\"truncated\":false}]},"
                              "{\"route\":\"r1\",\"limit\":\"other\""));
    free(s);
    admin_console_shutdown();
}

static void test_heavy_key_kept_among_distinct_ones(void **state)
{
    admin_console_worker(0);
    char part[32];
    for (int i = 0; i < 20000; i++) {
        int n = snprintf(part, sizeof part, "noise-%d", i);
        deny("r2", "l", part, (size_t)n);
        if (i % 10 == 0)
            deny("r2", "l", "heavy", 5);
    }
    char *s = top();
    const char *t = strstr(s, "\"tracked\":");
    assert_non_null(t);
    assert_true(atoi(t + 10) <= 2 * ADMIN_CONSOLE_COUNTERS);
    const char *k = strstr(s, "\"keys\":[{\"key\":[\"heavy\"],\"count\":");
    assert_non_null(k);
    long count = strtol(k + strlen("\"keys\":[{\"key\":[\"heavy\"],\"count\":"), NULL, 10);
    const char *e = strstr(k, "\"error\":");
    long err = strtol(e + 8, NULL, 10);
    /* space-saving: never under the true count, over it by at most error */
    assert_true(count >= 2000);
    assert_true(count - err <= 2000);
    free(s);
    admin_console_shutdown();
}

static void test_parts_escaped_and_bounded(void **state)
{
    admin_console_worker(0);
    /* two parts: a"b and <x>\ */
    static const char two[] = "p:{r3|l|3:a\"b4:<x>\\}";
    admin_console_denied("r3", "l", 2, two, sizeof two - 1, 0);
    char longp[300];
    memset(longp, 'L', sizeof longp);
    deny("r3", "l", longp, 250);
    deny("r3", "l", "\x01\xe9", 2);
    char *s = top();
    assert_non_null(strstr(s, "{\"key\":[\"a\\\"b\",\"<x>\\\\\"],\"count\":1,"));
    assert_non_null(strstr(s, "{\"key\":[\"\\u0001\\u00e9\"],\"count\":1,"));
    /* 160 bytes kept: "250:" and 156 of the part */
    char want[256] = "{\"key\":[\"";
    memset(want + 9, 'L', 156);
    strcpy(want + 9 + 156, "\"],\"count\":1,\"error\":0,\"truncated\":true}");
    assert_non_null(strstr(s, want));
    free(s);
    admin_console_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_a_worker_nothing_is_kept),
        cmocka_unit_test(test_exact_below_capacity),
        cmocka_unit_test(test_heavy_key_kept_among_distinct_ones),
        cmocka_unit_test(test_parts_escaped_and_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
