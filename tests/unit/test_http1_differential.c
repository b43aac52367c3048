/* sluice - test_http1_differential.c: src/http/http1.c against the parser
 * sluice had before (http1_ref.c: http_parser 2.9 plus sluice's checks).
 *
 * Every seed of tests/fuzz/corpus/http1_request and http1_response (read as
 * the fuzz targets read them) and every case of test_http1.c's request table
 * go through both; they must agree (http1_diff.h says what that means) or
 * differ in a way known_diffs[] lists with its reason. Each listed
 * difference also has an example here, so the list cannot go stale. Kept
 * for the project's life: the only test linking -lhttp_parser. */
#include <dirent.h>

/* test_http1.c's request table, its own main renamed away. */
#define main test_http1_main
#include "test_http1.c"
#undef main

#include "http1_diff.h"

#define FUZZ_HDR_BYTES 5

static int known_hits[sizeof(known_diffs) / sizeof(known_diffs[0])];

/* Agreement, or a listed difference (counted). */
static void expect_agree(const char *name, enum http1_kind kind, const uint8_t *d, size_t n,
                         size_t max, int head_request)
{
    char why[256];
    size_t at;
    const char *diff = http1_diff(kind, d, n, max, head_request, why, sizeof(why), &at);
    if (diff == NULL)
        return;
    const struct known_diff *k = diff_known(kind, d + at, n - at);
    if (k == NULL)
        print_error("%s: %s\n", name, diff);
    assert_non_null(k);
    known_hits[k - known_diffs]++;
}

/* A seed as fuzz_http1.h reads it: flags, small max, three cut points. */
static int run_corpus(const char *dir, enum http1_kind kind)
{
    DIR *dh = opendir(dir);
    struct dirent *de;
    int count = 0;

    assert_non_null(dh);
    while ((de = readdir(dh)) != NULL) {
        char path[512];
        uint8_t buf[65536];
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        if (n < FUZZ_HDR_BYTES)
            continue;
        size_t max = (buf[0] & 1) ? 16 + (size_t)buf[1] * 4 : 16384;
        int hr = kind == HTTP1_RESPONSE && (buf[0] & 2);
        expect_agree(path, kind, buf + FUZZ_HDR_BYTES, n - FUZZ_HDR_BYTES, max, hr);
        /* and as a connection reads it: every head without its limit */
        expect_agree(path, kind, buf + FUZZ_HDR_BYTES, n - FUZZ_HDR_BYTES, 16384, hr);
        count++;
    }
    closedir(dh);
    return count;
}

static void test_corpora(void **state)
{
    (void)state;
    assert_true(run_corpus("../fuzz/corpus/http1_request", HTTP1_REQUEST) >= 40);
    assert_true(run_corpus("../fuzz/corpus/http1_response", HTTP1_RESPONSE) >= 20);
}

static void test_request_table_agrees(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(req_cases) / sizeof(req_cases[0]); i++) {
        const struct req_case *c = &req_cases[i];
        expect_agree(c->name, HTTP1_REQUEST, (const uint8_t *)c->raw, c->len,
                     c->max_bytes ? c->max_bytes : MAX_HEAD, 0);
    }
}

/* One example per listed difference: the parsers do differ on it, and the
 * entry named is the one that explains it. */
static void test_known_differences(void **state)
{
#define EX(kind, s, entry) { kind, s, sizeof(s) - 1, entry }
    static const struct { enum http1_kind kind; const char *s; size_t n; const char *entry; } ex[] = {
        EX(HTTP1_REQUEST, "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "request line spaces"),
        EX(HTTP1_REQUEST, "GET /  HTTP/1.1\r\nHost: a\r\n\r\n", "request line spaces"),
        EX(HTTP1_REQUEST, "GET / HXYZ/1.1\r\nHost: a\r\n\r\n", "version name"),
        EX(HTTP1_RESPONSE, "HTT@/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "version name"),
        EX(HTTP1_REQUEST, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "0\r\nX: a\r\n b\r\n\r\n", "trailer fields"),
        EX(HTTP1_RESPONSE, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "0\r\nX Y: a\r\n\r\n", "trailer fields"),
        EX(HTTP1_RESPONSE, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                           "0\r\nTransfer-Encoding: x\r\n\r\n", "trailer fields"),
    };
#undef EX
    char why[256];

    (void)state;
    for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++) {
        const uint8_t *d = (const uint8_t *)ex[i].s;
        size_t at;
        const char *diff = http1_diff(ex[i].kind, d, ex[i].n, MAX_HEAD, 0, why, sizeof(why), &at);
        if (diff == NULL)
            print_error("example %zu: no difference\n", i);
        assert_non_null(diff);
        const struct known_diff *k = diff_known(ex[i].kind, d + at, ex[i].n - at);
        assert_non_null(k);
        assert_string_equal(k->name, ex[i].entry);
    }
    /* and a plain head matches no entry, so no entry excuses everything */
    static const char plain[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_null(diff_known(HTTP1_REQUEST, (const uint8_t *)plain, sizeof(plain) - 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpora),
        cmocka_unit_test(test_request_table_agrees),
        cmocka_unit_test(test_known_differences),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (size_t i = 0; i < sizeof(known_diffs) / sizeof(known_diffs[0]); i++)
        printf("known difference '%s': %d input(s)\n", known_diffs[i].name, known_hits[i]);
    return rc;
}
