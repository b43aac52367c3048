/* sluice - test_fuzz_regressions.c: one case per bug the fuzz targets found.
 *
 * Each case is the (reduced) input libFuzzer reported, kept here so the bug
 * stays fixed. tests/fuzz/fuzz_*.c hold the invariants that found them; the
 * comment on each case says which one and what the fix has to do. Buffers
 * are exactly sized heap copies, so ASan sees any read past them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "conf.h"
#include "http1.h"
#include "route.h"

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n ? n : 1);
    assert_non_null(p);
    memcpy(p, s, n);
    return p;
}

/* Parse head (which must be accepted), then feed body whole. Returns
 * http1_body_feed's result; *done gets its flag. */
static long feed_body(enum http1_kind kind, const char *head, const char *body, size_t bodylen,
                      int *done)
{
    struct http1 *p = http1_create(kind);
    struct http1_head *h = malloc(sizeof *h);
    char *hb = dup_n(head, strlen(head));
    char *bb = dup_n(body, bodylen);
    struct http1_piece pieces[HTTP1_MAX_PIECES];
    int np = 0;

    assert_non_null(h);
    assert_int_equal(http1_head_parse(p, hb, strlen(head), 16384, 0, h), 0);
    assert_int_equal(h->body, HTTP1_BODY_CHUNKED);
    long used = http1_body_feed(p, bb, bodylen, pieces, &np, done);
    free(bb);
    free(hb);
    free(h);
    http1_destroy(p);
    return used;
}

#define CHUNKED_REQ "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
#define CHUNKED_RESP "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

/* fuzz_http1_request, "chunked payload is what a strict decoder reads":
 * http_parser 2.9's unhex[256] table has 128 entries, so bytes 0x80-0xff
 * read as the hex digit 0. "\xff" was a last chunk: the body ended there
 * and the bytes after it became the next request, where any other server
 * sees a bad chunk size (request smuggling). Fix: http1.c checks that a
 * chunk-size line is 1*HEXDIG before ';', ' ' or CR (frame_byte knows where
 * a size line starts: after the head and after each chunk's CRLF). */
static void test_chunk_size_high_byte_is_not_zero(void **state)
{
    static const char body[] = "\xff\r\n\r\nGET /x HTTP/1.1\r\n";
    int done = 0;
    long used = feed_body(HTTP1_REQUEST, CHUNKED_REQ, body, sizeof body - 1, &done);
    assert_int_equal(used, -1);
    assert_int_equal(done, 0);
}

/* The same byte after a digit: "1\x80" was read as 0x10. */
static void test_chunk_size_high_byte_after_digit(void **state)
{
    static const char body[] = "1\x80\r\n0123456789abcdef\r\n0\r\n\r\n";
    int done = 0;
    long used = feed_body(HTTP1_REQUEST, CHUNKED_REQ, body, sizeof body - 1, &done);
    assert_int_equal(used, -1);
    assert_int_equal(done, 0);
}

/* fuzz_http1_response: an upstream's chunk size is read the same way. */
static void test_response_chunk_size_high_byte(void **state)
{
    static const char body[] = "2\xc3\r\n" "0123456789abcdef0123456789abcdef\r\n0\r\n\r\n";
    int done = 0;
    long used = feed_body(HTTP1_RESPONSE, CHUNKED_RESP, body, sizeof body - 1, &done);
    assert_int_equal(used, -1);
}

/* fuzz_http1_request, "a bodiless head completes on its first feed":
 * http_parser 2.9.4 takes any name starting with "Transfer-Encoding"
 * ("Transfer-Encodingf") for Transfer-Encoding, and fails the request in
 * s_headers_done, after on_headers_complete paused it: http1_head_parse
 * accepted the head with body NONE, and http1_body_feed then returned -1 on
 * a request already routed and perhaps forwarded. Fix: refuse such a name
 * in check_headers (400 from http1_head_parse), or make its body complete. */
static void test_te_prefixed_name_is_decided_at_the_head(void **state)
{
    static const char req[] = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encodingf: chunked\r\n\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head *h = malloc(sizeof *h);
    char *buf = dup_n(req, sizeof req - 1);
    struct http1_piece pieces[HTTP1_MAX_PIECES];
    int np = 0, done = 0;

    assert_non_null(h);
    int rc = http1_head_parse(p, buf, sizeof req - 1, 16384, 0, h);
    if (rc == 0) {
        assert_int_equal(h->body, HTTP1_BODY_NONE);
        assert_int_equal(http1_body_feed(p, buf + h->len, 0, pieces, &np, &done), 0);
        assert_int_equal(done, 1);
    } else {
        assert_int_equal(rc, 400);
    }
    free(buf);
    free(h);
    http1_destroy(p);
}

/* fuzz_route_key under ASan: route_match() hands the normalised path to
 * regexec(), which reads up to a NUL whatever REG_STARTEND says (ASan's
 * interceptor does strlen; musl has no REG_STARTEND at all). proxy.c's
 * path_buf carries stale bytes after the path and no NUL, so a path_regex
 * route read past the path (and, under ASan, past the buffer). Proposed fix:
 * route_normalize writes a NUL after the result (route.h: "out must hold
 * len + 1 bytes"; path_buf already has max_header_bytes + 1). */
static void test_normalize_terminates_its_result(void **state)
{
    static const char t[] = "/users/42/x?user=bob";
    char *in = dup_n(t, sizeof t - 1);
    char *out = malloc(sizeof t);               /* len + 1 */

    assert_non_null(out);
    memset(out, 'x', sizeof t);
    long n = route_normalize(in, sizeof t - 1, out);
    assert_int_equal(n, 11);
    assert_memory_equal(out, "/users/42/x", 11);
    assert_int_equal(out[n], '\0');
    free(in);
    free(out);
}

/* fuzz_conf, a 15 s timeout (then an 1 GB RSS): glibc's regcomp copies the
 * operand's tree for each '+' ("a+" is "aa*"), so stacked quantifiers
 * ("a++++") double it each time: "^/a" and 20 '+' took 17 s and 24 did not
 * finish. regex_weight() resets on '*', '+' and '?', so it let them through,
 * and a SIGHUP reload with such a file would stall the process. Fix: refuse
 * a quantifier that follows a quantifier (POSIX leaves it undefined), or
 * weigh '+' as doubling its operand. 12 pluses: 4096 times the operand, and
 * still fast enough to fail quickly before the fix. */
static void test_stacked_quantifiers_are_refused(void **state)
{
    static const char yaml[] =
        "listen: 127.0.0.1:8080\n"
        "upstreams:\n"
        "  api: { servers: [127.0.0.1:9000] }\n"
        "routes:\n"
        "  - name: r\n"
        "    match: { path_regex: \"^/a++++++++++++\" }\n"
        "    upstream: api\n";
    char path[64], *err = NULL;
    int fd = memfd_create("regex", 0);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, sizeof yaml - 1), (ssize_t)(sizeof yaml - 1));
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    alarm(60);                  /* a hang fails the test instead of the run */
    struct conf *c = conf_load(path, &err);
    alarm(0);
    if (c != NULL)
        conf_release(c);
    assert_null(c);
    assert_non_null(err);
    assert_non_null(strstr(err, ":6:"));        /* names the regex's line */
    assert_non_null(strstr(err, "regex"));
    free(err);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_size_high_byte_is_not_zero),
        cmocka_unit_test(test_chunk_size_high_byte_after_digit),
        cmocka_unit_test(test_response_chunk_size_high_byte),
        cmocka_unit_test(test_te_prefixed_name_is_decided_at_the_head),
        cmocka_unit_test(test_normalize_terminates_its_result),
        cmocka_unit_test(test_stacked_quantifiers_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
