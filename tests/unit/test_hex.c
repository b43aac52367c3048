/* sluice - test_hex.c: the hex digit helpers (hex.h), against snprintf. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "hex.h"

static void test_bytes(void **state)
{
    const unsigned char in[] = { 0x00, 0x0f, 0x10, 0x9a, 0xff };
    char out[11] = { 0 };
    assert_ptr_equal(hex_bytes(out, in, sizeof in), out + 10);
    assert_string_equal(out, "000f109aff");
    char b[3] = { 0 };
    hex_byte(b, 0xc3, 1);
    assert_string_equal(b, "C3");
    hex_byte(b, 0xc3, 0);
    assert_string_equal(b, "c3");
}

/* Backwards, no leading zeros, "0" for 0; every width up to 16 digits. */
static void test_u64_back(void **state)
{
    uint64_t vals[] = { 0, 1, 15, 16, 255, 4096, 0xdeadbeef, UINT64_MAX, 1ULL << 63 };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        char buf[17], want[17];
        char *p = hex_u64_back(buf + 16, vals[i]);
        buf[16] = '\0';
        snprintf(want, sizeof want, "%llx", (unsigned long long)vals[i]);
        assert_string_equal(p, want);
    }
}

/* The 8 nibbles, least significant first: the per-nibble loop's digits,
 * over the edges and a spread of values. */
static void test_u32_le8(void **state)
{
    uint32_t v = 0;
    for (int n = 0; n < 100000; n++) {
        uint32_t x = n < 4 ? (uint32_t[]){ 0, 0xffffffffu, 0x0a0a0a0au, 0x12345678u }[n] : v;
        char got[9] = { 0 }, want[9] = { 0 };
        hex_u32_le8(got, x);
        for (int k = 0; k < 8; k++)
            want[k] = "0123456789abcdef"[(x >> (4 * k)) & 15];
        assert_string_equal(got, want);
        v = v * 1664525u + 1013904223u;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_u64_back),
        cmocka_unit_test(test_u32_le8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
