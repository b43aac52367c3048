/* sluice - test_store_util.c: the store's small shared parts (store_util.c).
 *
 * store_switch_master reads a sentinel's "+switch-master" message, bytes a
 * sentinel (or whoever answers on its address) chose: the new port must be
 * all digits and in 1..65535, never a number sscanf's %d took a prefix of
 * or wrapped into range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "store.h"
#include "store_int.h"

/* A pub/sub message on channel "+switch-master" whose payload is text. */
static int parse(const char *text, char *ip, size_t ipsz, int *port)
{
    redisReply kind = { .type = REDIS_REPLY_STRING, .str = (char *)"message", .len = 7 };
    redisReply chan = { .type = REDIS_REPLY_STRING, .str = (char *)"+switch-master",
                        .len = 14 };
    redisReply body = { .type = REDIS_REPLY_STRING, .str = (char *)text, .len = strlen(text) };
    redisReply *el[3] = { &kind, &chan, &body };
    redisReply msg = { .type = REDIS_REPLY_ARRAY, .elements = 3, .element = el };
    return store_switch_master(&msg, "mymaster", ip, ipsz, port);
}

static void test_switch_master_new_address(void **state)
{
    char ip[64];
    int port = 0;
    assert_int_equal(parse("mymaster 10.0.0.1 6379 10.0.0.2 6380", ip, sizeof ip, &port), 0);
    assert_string_equal(ip, "10.0.0.2");
    assert_int_equal(port, 6380);
    assert_int_equal(parse("othermaster 10.0.0.1 6379 10.0.0.2 6380", ip, sizeof ip, &port), -1);
    assert_int_equal(parse("mymaster 10.0.0.1 6379 10.0.0.2", ip, sizeof ip, &port), -1);
    char small[4];
    assert_int_equal(parse("mymaster 10.0.0.1 6379 10.0.0.2 6380", small, sizeof small, &port),
                     -1);
}

static void test_switch_master_port_is_a_whole_number_in_range(void **state)
{
    static const char *const bad[] = {
        "mymaster 10.0.0.1 6379 10.0.0.2 6380x",         /* %d took "6380" */
        "mymaster 10.0.0.1 6379 10.0.0.2 4294973676",    /* 2^32 + 6380: %d wrapped it */
        "mymaster 10.0.0.1 6379 10.0.0.2 99999999999999999999",
        "mymaster 10.0.0.1 6379 10.0.0.2 0",
        "mymaster 10.0.0.1 6379 10.0.0.2 65536",
        "mymaster 10.0.0.1 6379 10.0.0.2 -6380",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char ip[64];
        int port = 0;
        if (parse(bad[i], ip, sizeof ip, &port) != -1)
            fail_msg("accepted '%s' as port %d", bad[i], port);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_master_new_address),
        cmocka_unit_test(test_switch_master_port_is_a_whole_number_in_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
