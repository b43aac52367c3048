/* sluice - test_esc.c: the one escaper, in its four modes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "esc.h"

static void check(const char *in, size_t n, enum esc_mode mode, const char *want)
{
    char out[ESC_MAX(64) + 1];
    char *end = esc_put(out, in, n, mode);
    *end = '\0';
    assert_string_equal(out, want);
    assert_int_equal(esc_len(in, n, mode), strlen(want));
}

static void test_modes(void **state)
{
    const char s[] = "a\"b\\c\nd\x01\x7f\xc3\xa9";
    size_t n = sizeof(s) - 1;
    check(s, n, ESC_JSON, "a\\\"b\\\\c\\u000ad\\u0001\\u007f\\u00c3\\u00a9");
    check(s, n, ESC_LABEL, "a\\\"b\\\\c\\nd\x01\x7f\xc3\xa9");
    check(s, n, ESC_QUOTED, "a\\\"b\\\\cd\xc3\xa9");
    check("", 0, ESC_JSON, "");
    check("\0x", 2, ESC_JSON, "\\u0000x");
    check("plain text", 10, ESC_QUOTED, "plain text");
    /* grpc-message: percent-encoded, '"' and '\\' kept */
    check(s, n, ESC_PERCENT, "a\"b\\c%0Ad%01%7F%C3%A9");
    check("50% off", 7, ESC_PERCENT, "50%25 off");
}

/* The worst case is ESC_MAX; esc_len agrees past its 64-byte chunks. */
static void test_bounds(void **state)
{
    char in[200], out[ESC_MAX(200)];
    memset(in, 0x01, sizeof in);
    assert_int_equal(esc_put(out, in, sizeof in, ESC_JSON) - out, ESC_MAX(sizeof in));
    assert_int_equal(esc_len(in, sizeof in, ESC_JSON), ESC_MAX(sizeof in));
    assert_int_equal(esc_len(in, sizeof in, ESC_QUOTED), 0);
    memset(in, '"', sizeof in);
    assert_int_equal(esc_len(in, sizeof in, ESC_LABEL), 2 * sizeof in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
