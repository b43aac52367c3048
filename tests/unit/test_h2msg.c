/* sluice - test_h2msg.c: HTTP/2 header lists <-> HTTP/1.1 text (h2msg.c).
 *
 * (a) exact request and response heads from header lists (:authority and
 * Host, cookie crumbs, TE and connection-specific fields, chunked when a
 * body follows without a length, CONNECT, the list's byte bound) and the
 * chunked coding with trailers; (b) nv lists, payload and trailers read
 * from HTTP/1.1 responses and requests, whole and a byte at a time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "h2msg.h"
#include "testlib.h"

/* ---- (a) ---------------------------------------------------------------- */

/* A block from "name", "value" pairs ending with NULL. */
static struct h2msg_fields *block(size_t max, ...)
{
    struct h2msg_fields *f = h2msg_fields_new(max);
    va_list ap;
    va_start(ap, max);
    for (const char *n; (n = va_arg(ap, const char *)) != NULL;) {
        const char *v = va_arg(ap, const char *);
        assert_int_equal(h2msg_fields_add(f, (const uint8_t *)n, strlen(n), (const uint8_t *)v,
                                          strlen(v)), 0);
    }
    va_end(ap);
    return f;
}

static char *head_of(struct h2msg_fields *f, enum http1_kind kind, int body, int *st, int *chunked)
{
    struct evbuffer *out = evbuffer_new();
    *st = h2msg_head_text(f, kind, body, NULL, out, chunked);
    char *s = testlib_drain(out);
    evbuffer_free(out);
    return s;
}

static void test_request_head(void **state)
{
    struct h2msg_fields *f = block(8192, ":method", "GET", ":scheme", "https", ":authority",
                                   "api.example:8443", ":path", "/v1/x?y=1", "cookie", "a=1",
                                   "accept", "*/*", "cookie", "b=2", "te", "trailers",
                                   "x-id", "7", NULL);
    int st, chunked;
    char *s = head_of(f, HTTP1_REQUEST, 0, &st, &chunked);
    assert_int_equal(st, 0);
    assert_int_equal(chunked, 0);
    assert_string_equal(s, "GET /v1/x?y=1 HTTP/1.1\r\nHost: api.example:8443\r\n"
                           "accept: */*\r\nx-id: 7\r\nCookie: a=1; b=2\r\n\r\n");
    free(s);
    h2msg_fields_free(f);
}

static void test_request_body(void **state)
{
    int st, chunked;
    /* no length and a body to come: chunked */
    struct h2msg_fields *f = block(8192, ":method", "POST", ":scheme", "http", ":path", "/p",
                                   "host", "h", NULL);
    char *s = head_of(f, HTTP1_REQUEST, 1, &st, &chunked);
    assert_int_equal(st, 0);
    assert_int_equal(chunked, 1);
    assert_string_equal(s, "POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    free(s);
    h2msg_fields_free(f);
    /* a length: kept, not chunked */
    f = block(8192, ":method", "PUT", ":authority", "h", ":path", "/p", "content-length", "5",
              NULL);
    s = head_of(f, HTTP1_REQUEST, 1, &st, &chunked);
    assert_int_equal(chunked, 0);
    assert_string_equal(s, "PUT /p HTTP/1.1\r\nHost: h\r\ncontent-length: 5\r\n\r\n");
    free(s);
    h2msg_fields_free(f);

    struct evbuffer *out = evbuffer_new();
    h2msg_chunk(out, "hello", 5);
    h2msg_chunk(out, "", 0);
    f = block(8192, "grpc-status", "0", "content-length", "9", NULL);
    h2msg_last_chunk(out, f);
    s = testlib_drain(out);
    assert_string_equal(s, "5\r\nhello\r\n0\r\ngrpc-status: 0\r\n\r\n");
    free(s);
    h2msg_fields_free(f);
    evbuffer_free(out);
}

static void test_request_refused(void **state)
{
    int st, chunked;
    /* :authority and a different Host: 400 (the same, any case: fine) */
    struct h2msg_fields *f = block(8192, ":method", "GET", ":authority", "a.example", ":path",
                                   "/", "host", "b.example", NULL);
    free(head_of(f, HTTP1_REQUEST, 0, &st, &chunked));
    assert_int_equal(st, 400);
    h2msg_fields_free(f);
    f = block(8192, ":method", "GET", ":authority", "a.example", ":path", "/", "host",
              "A.example", NULL);
    char *s = head_of(f, HTTP1_REQUEST, 0, &st, &chunked);
    assert_int_equal(st, 0);
    assert_string_equal(s, "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n");
    free(s);
    h2msg_fields_free(f);
    /* neither: 400; CONNECT, plain or extended: 501 */
    f = block(8192, ":method", "GET", ":path", "/", NULL);
    free(head_of(f, HTTP1_REQUEST, 0, &st, &chunked));
    assert_int_equal(st, 400);
    h2msg_fields_free(f);
    f = block(8192, ":method", "CONNECT", ":authority", "a:443", NULL);
    free(head_of(f, HTTP1_REQUEST, 1, &st, &chunked));
    assert_int_equal(st, 501);
    h2msg_fields_free(f);
    f = block(8192, ":method", "CONNECT", ":protocol", "websocket", ":authority", "a",
              ":path", "/chat", NULL);
    free(head_of(f, HTTP1_REQUEST, 1, &st, &chunked));
    assert_int_equal(st, 501);
    h2msg_fields_free(f);
}

static void test_fields_bound(void **state)
{
    /* name + value + 4 each: 100 bytes take "a: <94>" once, not twice */
    struct h2msg_fields *f = h2msg_fields_new(100);
    char v[200];
    memset(v, 'x', sizeof(v));
    assert_int_equal(h2msg_fields_add(f, (const uint8_t *)"a", 1, (const uint8_t *)v, 95), 0);
    assert_int_equal(h2msg_fields_add(f, (const uint8_t *)"b", 1, (const uint8_t *)v, 1), 431);
    assert_int_equal(h2msg_fields_add(f, (const uint8_t *)"c", 1, (const uint8_t *)v, 0), 431);
    int st, chunked;
    free(head_of(f, HTTP1_REQUEST, 0, &st, &chunked));
    assert_int_equal(st, 431);
    h2msg_fields_clear(f);
    assert_int_equal(h2msg_fields_add(f, (const uint8_t *)"b", 1, (const uint8_t *)v, 1), 0);
    h2msg_fields_free(f);
    /* and at most HTTP1_MAX_HEADERS fields plus the pseudo ones */
    f = h2msg_fields_new(1 << 20);
    int i, rc = 0;
    for (i = 0; i < 1000 && rc == 0; i++)
        rc = h2msg_fields_add(f, (const uint8_t *)"n", 1, (const uint8_t *)"v", 1);
    assert_int_equal(rc, 431);
    assert_true(i > HTTP1_MAX_HEADERS && i < HTTP1_MAX_HEADERS + 10);
    h2msg_fields_free(f);
}

static void test_response_head(void **state)
{
    int st, chunked;
    struct h2msg_fields *f = block(8192, ":status", "200", "content-type", "text/plain",
                                   "set-cookie", "a=1", "set-cookie", "b=2", NULL);
    char *s = head_of(f, HTTP1_RESPONSE, 1, &st, &chunked);
    assert_int_equal(st, 0);
    assert_int_equal(chunked, 1);
    assert_string_equal(s, "HTTP/1.1 200 \r\ncontent-type: text/plain\r\nset-cookie: a=1\r\n"
                           "set-cookie: b=2\r\nTransfer-Encoding: chunked\r\n\r\n");
    free(s);
    h2msg_fields_free(f);
    f = block(8192, ":status", "20x", NULL);
    free(head_of(f, HTTP1_RESPONSE, 0, &st, &chunked));
    assert_int_equal(st, 400);
    h2msg_fields_free(f);
}

/* ---- (b) ---------------------------------------------------------------- */

/* The nv list as "name=value;" text. */
static void nv_text(struct h2msg_reader *r, char *out, size_t cap)
{
    size_t n, at = 0;
    const nghttp2_nv *nv = h2msg_reader_nv(r, &n);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(out + at, cap - at, "%.*s=%.*s;", (int)nv[i].namelen,
                               (const char *)nv[i].name, (int)nv[i].valuelen,
                               (const char *)nv[i].value);
}

/* Read msg into events: heads and trailers as text, the payload joined,
 * given `step` bytes at a time. */
static void read_all(enum http1_kind kind, const char *msg, size_t step, char *heads, size_t hcap,
                     char *payload, size_t pcap)
{
    struct h2msg_reader *r = h2msg_reader_new(kind, 8192);
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    size_t len = strlen(msg), given = 0;
    heads[0] = '\0';
    int ended = 0;
    for (int rounds = 0; rounds < 100000 && !ended; rounds++) {
        enum h2msg_event ev = h2msg_read(r, in, body, 7);
        char t[2048];
        switch (ev) {
        case H2MSG_ERROR:
            fail_msg("error at %zu", given);
            break;
        case H2MSG_NEED:
            assert_true(given < len);
            size_t n = len - given < step ? len - given : step;
            evbuffer_add(in, msg + given, n);
            given += n;
            break;
        case H2MSG_HEAD:
            nv_text(r, t, sizeof(t));
            snprintf(heads + strlen(heads), hcap - strlen(heads), "[%s body=%d]", t,
                     h2msg_reader_body(r));
            break;
        case H2MSG_DATA:
            break;
        case H2MSG_END:
            nv_text(r, t, sizeof(t));
            snprintf(heads + strlen(heads), hcap - strlen(heads), "[end %s]", t);
            ended = 1;
            break;
        }
    }
    assert_true(ended);
    assert_int_equal(evbuffer_get_length(in), 0);
    size_t n = evbuffer_get_length(body);
    assert_true(n < pcap);
    evbuffer_remove(body, payload, n);
    payload[n] = '\0';
    evbuffer_free(in);
    evbuffer_free(body);
    h2msg_reader_free(r);
}

static void test_read_response(void **state)
{
    static const char msg[] =
        "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close, X-Hop\r\n"
        "X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nX-Kept: 2\r\n\r\n"
        "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nGrpc-Status: 0\r\nX-T: a b \r\n\r\n";
    static const size_t steps[] = {1, 3, 17, sizeof(msg)};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        char heads[4096], payload[256];
        read_all(HTTP1_RESPONSE, msg, steps[i], heads, sizeof(heads), payload, sizeof(payload));
        assert_string_equal(heads, "[:status=103;link=</a.css>; body=0]"
                                   "[:status=200;content-type=text/plain;x-kept=2; body=1]"
                                   "[end grpc-status=0;x-t=a b;]");
        assert_string_equal(payload, "hello world");
    }
    /* a length, and none: no trailers; 204: no body */
    char heads[4096], payload[256];
    read_all(HTTP1_RESPONSE, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", 2, heads,
             sizeof(heads), payload, sizeof(payload));
    assert_string_equal(heads, "[:status=200;content-length=3; body=1][end ]");
    assert_string_equal(payload, "abc");
    read_all(HTTP1_RESPONSE, "HTTP/1.1 204 No Content\r\n\r\n", 100, heads, sizeof(heads),
             payload, sizeof(payload));
    assert_string_equal(heads, "[:status=204; body=0][end ]");
}

static void test_read_request(void **state)
{
    char heads[4096], payload[256];
    read_all(HTTP1_REQUEST,
             "POST /rpc?x=1 HTTP/1.1\r\nHost: up.example\r\nTE: trailers\r\nConnection: TE\r\n"
             "Upgrade: h2c\r\nContent-Length: 4\r\n\r\nabcd",
             5, heads, sizeof(heads), payload, sizeof(payload));
    assert_string_equal(heads, "[:method=POST;:scheme=https;:authority=up.example;:path=/rpc?x=1;"
                               "te=trailers;content-length=4; body=1][end ]");
    assert_string_equal(payload, "abcd");
}

static void test_read_errors(void **state)
{
    struct h2msg_reader *r = h2msg_reader_new(HTTP1_RESPONSE, 8192);
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_HEAD);
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_ERROR);
    h2msg_reader_free(r);
    /* a head past the bound */
    r = h2msg_reader_new(HTTP1_RESPONSE, 64);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "HTTP/1.1 200 OK\r\nX: %0100d\r\n\r\n", 0);
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_ERROR);
    h2msg_reader_free(r);
    /* a body up to the close */
    r = h2msg_reader_new(HTTP1_RESPONSE, 8192);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_add_printf(in, "HTTP/1.0 200 OK\r\n\r\nab");
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_HEAD);
    assert_int_equal(h2msg_reader_body(r), 1);
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_DATA);
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_NEED);
    assert_int_equal(h2msg_reader_eof(r), 1);
    assert_int_equal(h2msg_read(r, in, body, 100), H2MSG_END);
    h2msg_reader_free(r);
    evbuffer_free(in);
    evbuffer_free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_head),
        cmocka_unit_test(test_request_body),
        cmocka_unit_test(test_request_refused),
        cmocka_unit_test(test_fields_bound),
        cmocka_unit_test(test_response_head),
        cmocka_unit_test(test_read_response),
        cmocka_unit_test(test_read_request),
        cmocka_unit_test(test_read_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
