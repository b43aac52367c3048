/* sluice - test_jsonscan.c: one number at a dotted path of a JSON or
 * event-stream body, fed whole and a byte at a time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "jsonscan.h"

/* want < 0: nothing found. The result must not depend on how it is cut. */
static void check(const char *path, int sse, const char *body, int64_t want)
{
    size_t n = strlen(body);
    const size_t steps[2] = { 1, n + 1 };   /* a byte at a time, then whole */
    for (int k = 0; k < 2; k++) {
        size_t step = steps[k];
        struct jsonscan j;
        int64_t v = -1;
        jsonscan_init(&j, path, sse);
        for (size_t i = 0; i < n; i += step)
            jsonscan_feed(&j, body + i, n - i < step ? n - i : step);
        int found = jsonscan_result(&j, &v);
        if (want < 0)
            assert_false(found);
        else {
            assert_true(found);
            assert_int_equal(v, want);
        }
    }
}

static void test_json(void **state)
{
    const char *path = "usage.total_tokens";
    check(path, 0, "{\"id\":\"x\",\"choices\":[{\"message\":{\"content\":\"a \\\"usage\\\"\"}}],"
                   "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":300}}",
          300);
    check(path, 0, "{ \"usage\" : { \"total_tokens\" : 42 } }\n", 42);
    check(path, 0, "{\"usage\":{\"total_tokens\":4.5}}", -1);
    check(path, 0, "{\"usage\":{\"total_tokens\":-4}}", -1);
    check(path, 0, "{\"usage\":{\"total_tokens\":\"300\"}}", -1);
    check(path, 0, "{\"total_tokens\":7,\"usage\":{\"x\":{\"total_tokens\":8}}}", -1);
    check(path, 0, "[{\"usage\":{\"total_tokens\":3}}]", -1);             /* not the root */
    check(path, 0, "{\"usage\":[{\"total_tokens\":3}]}", -1);             /* no indexes */
    check(path, 0, "{\"usage\":{\"total_tokens\":1},\"usage\":{\"total_tokens\":2}}", 2);
    check(path, 0, "{\"\\u0075sage\":{\"total_tokens\":3}}", -1);         /* escaped key */
    check(path, 0, "{\"usage\":{\"total_tokens\":1234567890123456}}", -1);   /* >= 10^15 */
    check(path, 0, "{\"usage\":{\"total_tokens\":999999999999999}}", 999999999999999LL);
    check(path, 0, "{\"usage\":{\"total_tokens\":5", 5);                   /* cut at the end */
    check("a", 0, "{\"a\":0}", 0);
}

static void test_sse(void **state)
{
    const char *path = "usage.total_tokens";
    check(path, 1, "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}],\"usage\":null}\n\n"
                   "data: {\"choices\":[],\"usage\":{\"total_tokens\":300}}\n\n"
                   "data: [DONE]\n\n", 300);
    check(path, 1, ": ping\r\nevent: x\r\ndata: {\"usage\":\r\ndata: {\"total_tokens\":5}}\r\n\r\n"
                   "data:{\"usage\":{\"total_tokens\":6}}\r\r", 6);
    check(path, 1, "data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{}}\n\n", 1);
    check(path, 1, "data: {\"usage\":{\"total_tokens\":2}}", 2);   /* no blank line at the end */
    check(path, 1, "datum: {\"usage\":{\"total_tokens\":2}}\n\n", -1);
    check(path, 1, "", -1);
}

static void test_paths(void **state)
{
    assert_int_equal(jsonscan_path_valid("usage.total_tokens"), 0);
    assert_int_equal(jsonscan_path_valid("a.b-c.d_e.f.g.h.i.j"), 0);
    assert_int_equal(jsonscan_path_valid("a.b.c.d.e.f.g.h.i"), -1);  /* 9 keys */
    assert_int_equal(jsonscan_path_valid(""), -1);
    assert_int_equal(jsonscan_path_valid("a..b"), -1);
    assert_int_equal(jsonscan_path_valid(".a"), -1);
    assert_int_equal(jsonscan_path_valid("a."), -1);
    assert_int_equal(jsonscan_path_valid("a[0]"), -1);
    assert_int_equal(jsonscan_path_valid("a b"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
