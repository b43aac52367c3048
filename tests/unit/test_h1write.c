/* sluice - test_h1write.c: unit tests for head rewriting (src/h1write.c).
 *
 * Each case parses a head with http1, rewrites it into an evbuffer through
 * an obuf, and compares the exact bytes: the request going upstream
 * (framing from the parse, Connection-named fields, X-Forwarded-*, proxy
 * fields by trust, underscores, Upgrade), the checks that make a 400 or a
 * 502, and the response coming back (status line after empty lines, 1xx,
 * 204, 304, HEAD, 101, chunked re-framing, the request id). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "h1write.h"
#include "http1.h"
#include "obuf.h"
#include "testlib.h"

#define L "\r\n"
#define MAX_HEAD 65536

struct parsed {
    struct http1 *p;
    struct http1_head h;
    const char *buf;
};

static void parse(struct parsed *ps, enum http1_kind kind, const char *raw, int head_request)
{
    ps->p = http1_create(kind);
    ps->buf = raw;
    int rc = http1_head_parse(ps->p, raw, strlen(raw), MAX_HEAD, head_request, &ps->h);
    if (rc != 0)
        fail_msg("head did not parse (%d): %s", rc, raw);
}

/* What a writer produced, NUL-terminated; the caller frees it. */
static char *take(struct evbuffer *eb)
{
    char *s = testlib_drain(eb);
    evbuffer_free(eb);
    return s;
}

static const struct h1write_req REQ = {
    .peer = "10.0.0.1", .peer_len = 8, .rid = "rid1", .rid_len = 4,
    .host = "up:80", .host_len = 5, .underscore = CONF_UNDERSCORE_DROP,
};

static char *request(const char *raw, const struct h1write_req *o)
{
    struct parsed ps;
    struct obuf ob;
    struct evbuffer *eb = evbuffer_new();
    parse(&ps, HTTP1_REQUEST, raw, 0);
    obuf_begin(&ob, eb, 16);
    h1write_request(&ob, ps.buf, &ps.h, o);
    obuf_end(&ob);
    http1_destroy(ps.p);
    return take(eb);
}

static void expect_request(const char *raw, const struct h1write_req *o, const char *want)
{
    char *got = request(raw, o);
    assert_string_equal(got, want);
    free(got);
}

static int request_check(const char *raw, enum conf_underscore us)
{
    struct parsed ps;
    parse(&ps, HTTP1_REQUEST, raw, 0);
    int rc = h1write_request_check(ps.buf, &ps.h, us);
    http1_destroy(ps.p);
    return rc;
}

#define TAIL "X-Forwarded-For: 10.0.0.1" L "X-Forwarded-Proto: http" L "X-Request-Id: rid1" L

/* ---- request ------------------------------------------------------------ */

static void test_request_framing_from_parse(void **state)
{
    expect_request("POST /a HTTP/1.1" L "Host: h" L "Content-Length: 007" L L, &REQ,
                   "POST /a HTTP/1.1" L "Host: h" L TAIL "Content-Length: 7" L L);
    expect_request("POST /a HTTP/1.1" L "Host: h" L "Content-Length: 0" L L, &REQ,
                   "POST /a HTTP/1.1" L "Host: h" L TAIL "Content-Length: 0" L L);
    expect_request("POST /a HTTP/1.1" L "Host: h" L "Transfer-Encoding:  Chunked " L L, &REQ,
                   "POST /a HTTP/1.1" L "Host: h" L TAIL "Transfer-Encoding: chunked" L L);
    expect_request("GET /a HTTP/1.1" L "Host: h" L L, &REQ,
                   "GET /a HTTP/1.1" L "Host: h" L TAIL L);
}

static void test_request_version_and_host(void **state)
{
    expect_request("GET /a?b HTTP/1.0" L "X-A: 1" L L, &REQ,
                   "GET /a?b HTTP/1.1" L "X-A: 1" L TAIL "Host: up:80" L L);
}

static void test_request_hop_by_hop_and_ours(void **state)
{
    expect_request("GET / HTTP/1.1" L "Host: h" L "Connection: keep-alive, X-Secret" L
                   "X-Secret: s" L "Keep-Alive: 5" L "TE: trailers" L "Proxy-Connection: x" L
                   "Upgrade: websocket" L "X-Forwarded-Proto: https" L "X-Request-Id: theirs" L
                   "X-Forwarded-For: 1.1.1.1" L "X-Keep: k" L "X-Forwarded-For: 2.2.2.2" L L,
                   &REQ,
                   "GET / HTTP/1.1" L "Host: h" L "X-Keep: k" L
                   "X-Forwarded-For: 1.1.1.1, 2.2.2.2, 10.0.0.1" L
                   "X-Forwarded-Proto: http" L "X-Request-Id: rid1" L L);
}

static void test_request_proxy_fields_by_trust(void **state)
{
    const char *raw = "GET / HTTP/1.1" L "Host: h" L "Forwarded: for=1.2.3.4" L
                      "X-Real-IP: 1.2.3.4" L "X-Forwarded-Host: e" L "X-Forwarded-Port: 1" L L;
    expect_request(raw, &REQ, "GET / HTTP/1.1" L "Host: h" L TAIL L);
    struct h1write_req t = REQ;
    t.trusted = 1;
    expect_request(raw, &t, "GET / HTTP/1.1" L "Host: h" L "Forwarded: for=1.2.3.4" L
                   "X-Real-IP: 1.2.3.4" L "X-Forwarded-Host: e" L "X-Forwarded-Port: 1" L
                   TAIL L);
}

static void test_request_underscores(void **state)
{
    const char *raw = "GET / HTTP/1.1" L "Host: h" L "X_Api_Key: a" L "X-Api-Key: b" L L;
    expect_request(raw, &REQ, "GET / HTTP/1.1" L "Host: h" L "X-Api-Key: b" L TAIL L);
    struct h1write_req p = REQ;
    p.underscore = CONF_UNDERSCORE_PASS;
    expect_request(raw, &p, "GET / HTTP/1.1" L "Host: h" L "X_Api_Key: a" L "X-Api-Key: b" L
                   TAIL L);
    assert_int_equal(request_check(raw, CONF_UNDERSCORE_DROP), 0);
    assert_int_equal(request_check(raw, CONF_UNDERSCORE_PASS), 0);
    assert_int_equal(request_check(raw, CONF_UNDERSCORE_REJECT), 400);
}

static void test_request_upgrade(void **state)
{
    const char *raw = "GET /ws HTTP/1.1" L "Host: h" L "Connection: Upgrade" L
                      "Upgrade: websocket" L L;
    struct h1write_req u = REQ;
    u.upgrade = 1;
    expect_request(raw, &u, "GET /ws HTTP/1.1" L "Host: h" L "Upgrade: websocket" L
                   "X-Forwarded-For: 10.0.0.1" L "X-Forwarded-Proto: http" L
                   "Connection: upgrade" L "X-Request-Id: rid1" L L);
    expect_request(raw, &REQ, "GET /ws HTTP/1.1" L "Host: h" L TAIL L);
}

static void test_request_check_connection(void **state)
{
    static const char *const bad[] = {
        "content-length", "Content-Length", "keep-alive, Content-Length",
        "transfer-encoding", "close,TRANSFER-ENCODING", "Host", "x, host, y",
    };
    char raw[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(raw, sizeof(raw), "POST / HTTP/1.1" L "Host: h" L "Connection: %s" L
                 "Content-Length: 3" L L, bad[i]);
        assert_int_equal(request_check(raw, CONF_UNDERSCORE_DROP), 400);
    }
    assert_int_equal(request_check("GET / HTTP/1.1" L "Host: h" L
                                   "Connection: keep-alive, content-lengthx, hostx" L L,
                                   CONF_UNDERSCORE_DROP), 0);
    /* in a second Connection field too */
    assert_int_equal(request_check("GET / HTTP/1.1" L "Host: h" L "Connection: close" L
                                   "Connection: host" L L, CONF_UNDERSCORE_DROP), 400);
}

/* Many tokens and fields: every field a token names is dropped, once. */
static void test_request_many_tokens(void **state)
{
    size_t cap = 60000;
    char *raw = malloc(cap);
    size_t n = (size_t)snprintf(raw, cap, "GET / HTTP/1.1" L "Host: h" L "Connection: ");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(raw + n, cap - n, "%sT%d", i ? ", " : "", i);
    n += (size_t)snprintf(raw + n, cap - n, L);
    for (int i = 0; i < 90; i++)        /* even ones named, odd ones kept */
        n += (size_t)snprintf(raw + n, cap - n, "%c%d: v" L, i % 2 ? 'k' : 't', i * 50);
    snprintf(raw + n, cap - n, L);
    clock_t t0 = clock();
    char *got = request(raw, &REQ);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    for (int i = 0; i < 90; i++) {
        char name[32];
        snprintf(name, sizeof(name), L "%c%d: v" L, i % 2 ? 'k' : 't', i * 50);
        assert_true((strstr(got, name) != NULL) == (i % 2));
    }
    assert_true(s < 0.5);
    free(got);
    free(raw);
}

/* ---- response ----------------------------------------------------------- */

static const struct h1write_resp RESP = { .rid = "rid1", .rid_len = 4,
                                          .limits = CONF_HEADERS_NONE };

static int response(const char *raw, int head_request, struct h1write_resp *o, char **out)
{
    struct parsed ps;
    struct obuf ob;
    struct evbuffer *eb = evbuffer_new();
    parse(&ps, HTTP1_RESPONSE, raw, head_request);
    int rc = h1write_response_check(ps.buf, &ps.h);
    if (rc == 0) {
        obuf_begin(&ob, eb, 16);
        h1write_response_begin(&ob, ps.buf, &ps.h, o);
        h1write_response_end(&ob, ps.buf, &ps.h, o);
        obuf_end(&ob);
    }
    http1_destroy(ps.p);
    *out = take(eb);
    return rc;
}

static void expect_response(const char *raw, int head_request, const struct h1write_resp *o,
                            const char *want)
{
    struct h1write_resp copy = *o;
    char *got;
    copy.head_request = head_request;
    assert_int_equal(response(raw, head_request, &copy, &got), 0);
    assert_string_equal(got, want);
    free(got);
}

static void expect_502(const char *raw)
{
    struct h1write_resp o = RESP;
    char *got;
    assert_int_equal(response(raw, 0, &o, &got), 502);
    assert_string_equal(got, "");
    free(got);
}

static void test_response_status_line(void **state)
{
    expect_response("HTTP/1.0 200 OK" L "Content-Length: 2" L L, 0, &RESP,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L "Content-Length: 2" L L);
    expect_response(L L "HTTP/1.1 404 Not There" L "Content-Length: 0" L L, 0, &RESP,
                    "HTTP/1.1 404 Not There" L "X-Request-Id: rid1" L "Content-Length: 0" L L);
    expect_response("HTTP/1.1 200" L "Content-Length: 1" L L, 0, &RESP,
                    "HTTP/1.1 200" L "X-Request-Id: rid1" L "Content-Length: 1" L L);
}

static void test_response_bad_heads(void **state)
{
    expect_502("HTTP/1.1 200 OK" L "Connection: content-length" L "Content-Length: 2" L L);
    expect_502("HTTP/1.1 200 OK" L "Connection: close, Transfer-Encoding" L
               "Transfer-Encoding: chunked" L L);
    /* http_parser takes these; the status line is not HTTP/1.x NNN */
    expect_502("HTTP/1.1  200 OK" L "Content-Length: 2" L L);
    expect_502("HTTP/1.1 0200 OK" L "Content-Length: 2" L L);
}

static void test_response_framing(void **state)
{
    /* from the parse, never copied */
    expect_response("HTTP/1.1 200 OK" L "Content-Length: 005" L "Connection: X-A" L
                    "X-A: 1" L "X-B: 2" L L, 0, &RESP,
                    "HTTP/1.1 200 OK" L "X-B: 2" L "X-Request-Id: rid1" L
                    "Content-Length: 5" L L);
    struct h1write_resp ch = RESP;
    ch.chunked = 1;
    expect_response("HTTP/1.1 200 OK" L "Transfer-Encoding: gzip, chunked" L L, 0, &ch,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L
                    "Transfer-Encoding: chunked" L L);
    struct h1write_resp cl = RESP;
    cl.close = 1;
    expect_response("HTTP/1.1 200 OK" L L, 0, &cl,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L "Connection: close" L L);
    struct h1write_resp ka = RESP;
    ka.keep_alive_10 = 1;
    expect_response("HTTP/1.1 200 OK" L "Content-Length: 0" L L, 0, &ka,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L "Content-Length: 0" L
                    "Connection: keep-alive" L L);
}

static void test_response_no_body_statuses(void **state)
{
    struct h1write_resp ch = RESP;
    ch.chunked = 1;         /* even when asked, no framing */
    expect_response("HTTP/1.1 204 No Content" L "Content-Length: 0" L L, 0, &ch,
                    "HTTP/1.1 204 No Content" L "X-Request-Id: rid1" L L);
    expect_response("HTTP/1.1 304 Not Modified" L "Content-Length: 10" L "ETag: \"x\"" L L, 0,
                    &RESP, "HTTP/1.1 304 Not Modified" L "ETag: \"x\"" L
                    "X-Request-Id: rid1" L L);
    expect_response("HTTP/1.1 200 OK" L "Content-Length: 1234" L L, 1, &RESP,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L "Content-Length: 1234" L L);
    expect_response("HTTP/1.1 200 OK" L "Transfer-Encoding: chunked" L L, 1, &RESP,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L L);
}

static void test_response_switch_and_ids(void **state)
{
    expect_response("HTTP/1.1 101 Switching Protocols" L "Upgrade: websocket" L
                    "Connection: Upgrade" L "Sec-WebSocket-Accept: a" L L, 0, &RESP,
                    "HTTP/1.1 101 Switching Protocols" L "Upgrade: websocket" L
                    "Sec-WebSocket-Accept: a" L "X-Request-Id: rid1" L
                    "Connection: upgrade" L L);
    expect_response("HTTP/1.1 200 OK" L "X-Request-Id: up" L "Content-Length: 0" L L, 0,
                    &RESP, "HTTP/1.1 200 OK" L "X-Request-Id: up" L "Content-Length: 0" L L);
    struct h1write_resp lim = RESP;
    lim.limits = CONF_HEADERS_FULL;
    expect_response("HTTP/1.1 200 OK" L "X-RateLimit-Limit: 1" L "RateLimit: x" L
                    "Content-Length: 0" L L, 0, &lim,
                    "HTTP/1.1 200 OK" L "X-Request-Id: rid1" L "Content-Length: 0" L L);
}

/* ---- upgrade ------------------------------------------------------------ */

static int upgrade_ok(const char *upgrade, char *const *protos, int n)
{
    char raw[256];
    struct parsed ps;
    snprintf(raw, sizeof(raw), "GET / HTTP/1.1" L "Host: h" L "Connection: upgrade" L
             "Upgrade: %s" L L, upgrade);
    parse(&ps, HTTP1_REQUEST, raw, 0);
    int ok = h1write_upgrade_ok(ps.buf, &ps.h, protos, n);
    http1_destroy(ps.p);
    return ok;
}

static void test_upgrade_protocols(void **state)
{
    char *list[] = { "websocket", "foo" };
    assert_true(upgrade_ok("websocket", NULL, 0));
    assert_true(upgrade_ok("WebSocket", NULL, 0));
    assert_false(upgrade_ok("h2c", NULL, 0));
    assert_false(upgrade_ok("websocket, h2c", NULL, 0));
    assert_false(upgrade_ok("foo", NULL, 0));
    assert_true(upgrade_ok("foo/2", list, 2));
    assert_true(upgrade_ok("foo, websocket", list, 2));
    assert_false(upgrade_ok("h2c", list, 2));
    assert_false(upgrade_ok("", list, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_framing_from_parse),
        cmocka_unit_test(test_request_version_and_host),
        cmocka_unit_test(test_request_hop_by_hop_and_ours),
        cmocka_unit_test(test_request_proxy_fields_by_trust),
        cmocka_unit_test(test_request_underscores),
        cmocka_unit_test(test_request_upgrade),
        cmocka_unit_test(test_request_check_connection),
        cmocka_unit_test(test_request_many_tokens),
        cmocka_unit_test(test_response_status_line),
        cmocka_unit_test(test_response_bad_heads),
        cmocka_unit_test(test_response_framing),
        cmocka_unit_test(test_response_no_body_statuses),
        cmocka_unit_test(test_response_switch_and_ids),
        cmocka_unit_test(test_upgrade_protocols),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
