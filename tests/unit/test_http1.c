/* sluice - test_http1.c: unit tests for HTTP/1.x framing (src/http1.c).
 *
 * A table of request heads with the exact status each must get (smuggling
 * variants included), every one also fed in growing prefixes as if it
 * arrived byte by byte; then body decoding (Content-Length, chunked with
 * extensions and trailers, bad chunk sizes, pipelining, a full pieces array)
 * and responses (HEAD, 1xx, 204, 304, EOF-delimited, 101). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "http1.h"

#define MAX_HEAD 8192

/* ---- the request table -------------------------------------------------- */

struct req_case {
    const char *name;
    const char *raw;
    size_t len;
    int want;                   /* 0 or the status */
    size_t max_bytes;           /* 0: MAX_HEAD */
    int body;                   /* for want 0: expected enum http1_body */
    uint64_t cl;                /* for HTTP1_BODY_LENGTH */
    int keep_alive;             /* for want 0: expected, -1: not checked */
};

#define OK(n, s, b, cl, ka) { n, s, sizeof(s) - 1, 0, 0, b, cl, ka }
#define BAD(n, s, st)       { n, s, sizeof(s) - 1, st, 0, 0, 0, -1 }
#define BADMAX(n, s, st, m) { n, s, sizeof(s) - 1, st, m, 0, 0, -1 }

#define L "\r\n"
#define G11 "GET / HTTP/1.1" L "Host: a" L
#define P11 "POST /x HTTP/1.1" L "Host: a" L

static const struct req_case req_cases[] = {
    /* good heads */
    OK("simple GET", G11 L, HTTP1_BODY_NONE, 0, 1),
    OK("query and fragment chars", "GET /a/b?x=1&y=%20 HTTP/1.1" L "Host: a" L L, HTTP1_BODY_NONE, 0, 1),
    OK("HTTP/1.0 no Host", "GET / HTTP/1.0" L L, HTTP1_BODY_NONE, 0, 0),
    OK("HTTP/1.0 keep-alive", "GET / HTTP/1.0" L "Connection: keep-alive" L L, HTTP1_BODY_NONE, 0, 1),
    OK("HTTP/1.1 Connection close", G11 "Connection: close" L L, HTTP1_BODY_NONE, 0, 0),
    OK("HTTP/1.1 Connection list", G11 "Connection: foo, close" L L, HTTP1_BODY_NONE, 0, 0),
    OK("POST CL 5", P11 "Content-Length: 5" L L, HTTP1_BODY_LENGTH, 5, 1),
    OK("POST CL 0", P11 "Content-Length: 0" L L, HTTP1_BODY_NONE, 0, 1),
    OK("CL leading zeros", P11 "Content-Length: 007" L L, HTTP1_BODY_LENGTH, 7, 1),
    OK("CL with OWS", P11 "Content-Length:   12  " L L, HTTP1_BODY_LENGTH, 12, 1),
    OK("CL 2^40", P11 "Content-Length: 1099511627776" L L, HTTP1_BODY_LENGTH, 1099511627776ULL, 1),
    OK("POST chunked", P11 "Transfer-Encoding: chunked" L L, HTTP1_BODY_CHUNKED, 0, 1),
    OK("TE chunked OWS trimmed", P11 "Transfer-Encoding:    chunked   " L L, HTTP1_BODY_CHUNKED, 0, 1),
    OK("TE Chunked case", P11 "transfer-encoding: CHUNKED" L L, HTTP1_BODY_CHUNKED, 0, 1),
    OK("empty header value", G11 "X-Empty:" L "X-Sp: " L L, HTTP1_BODY_NONE, 0, 1),
    OK("HTAB inside value", G11 "X-Tab: a\tb" L L, HTTP1_BODY_NONE, 0, 1),
    OK("obs-text in value", G11 "X-Utf8: caf\xc3\xa9" L L, HTTP1_BODY_NONE, 0, 1),
    OK("leading CRLF ignored", L G11 L, HTTP1_BODY_NONE, 0, 1),
    OK("Expect 100-continue", P11 "Expect: 100-Continue" L "Content-Length: 3" L L, HTTP1_BODY_LENGTH, 3, 1),
    OK("Upgrade websocket", G11 "Connection: Upgrade" L "Upgrade: websocket" L L, HTTP1_BODY_NONE, 0, 1),
    OK("OPTIONS asterisk", "OPTIONS * HTTP/1.1" L "Host: a" L L, HTTP1_BODY_NONE, 0, 1),
    OK("DELETE", "DELETE /r/1 HTTP/1.1" L "Host: a" L L, HTTP1_BODY_NONE, 0, 1),
    OK("PATCH", "PATCH /r/1 HTTP/1.1" L "Host: a" L "Content-Length: 2" L L, HTTP1_BODY_LENGTH, 2, 1),
    OK("absolute-form passes here", "GET http://a/x HTTP/1.1" L "Host: a" L L, HTTP1_BODY_NONE, 0, 1),
    OK("Host with port", "GET / HTTP/1.1" L "Host: a.example:8080" L L, HTTP1_BODY_NONE, 0, 1),
    OK("Host last", "GET / HTTP/1.1" L "A: 1" L "B: 2" L "Host: a" L L, HTTP1_BODY_NONE, 0, 1),
    OK("pipelined GETs", G11 L G11 L, HTTP1_BODY_NONE, 0, 1),
    OK("pipelined POST then GET", P11 "Content-Length: 2" L L "ab" G11 L, HTTP1_BODY_LENGTH, 2, 1),
    OK("tchar names", G11 "X-!#$%&'*+.^_`|~: v" L L, HTTP1_BODY_NONE, 0, 1),

    /* smuggling: CL.TE, TE.CL, TE.TE */
    BAD("CL.TE", P11 "Content-Length: 6" L "Transfer-Encoding: chunked" L L, 400),
    BAD("TE.CL", P11 "Transfer-Encoding: chunked" L "Content-Length: 6" L L, 400),
    BAD("CL.TE non-chunked", P11 "Content-Length: 6" L "Transfer-Encoding: gzip" L L, 400),
    BAD("TE xchunked", P11 "Transfer-Encoding: xchunked" L L, 400),
    BAD("TE chunkedx", P11 "Transfer-Encoding: chunkedx" L L, 400),
    BAD("TE chunked, identity", P11 "Transfer-Encoding: chunked, identity" L L, 400),
    BAD("TE gzip, chunked", P11 "Transfer-Encoding: gzip, chunked" L L, 400),
    BAD("TE identity", P11 "Transfer-Encoding: identity" L L, 400),
    BAD("TE empty", P11 "Transfer-Encoding:" L L, 400),
    BAD("TE duplicated", P11 "Transfer-Encoding: chunked" L "Transfer-Encoding: chunked" L L, 400),
    BAD("TE split over two", P11 "Transfer-Encoding: gzip" L "Transfer-Encoding: chunked" L L, 400),
    BAD("TE trailing HTAB", P11 "Transfer-Encoding: chunked\t" L L, 400),
    BAD("TE vertical tab", P11 "Transfer-Encoding:\x0b" "chunked" L L, 400),
    BAD("TE in HTTP/1.0", "POST / HTTP/1.0" L "Transfer-Encoding: chunked" L L, 400),
    BAD("TE name with space", P11 "Transfer-Encoding : chunked" L "Content-Length: 3" L L, 400),
    /* Content-Length */
    BAD("CL duplicate equal", P11 "Content-Length: 5" L "Content-Length: 5" L L, 400),
    BAD("CL duplicate differ", P11 "Content-Length: 5" L "Content-Length: 6" L L, 400),
    BAD("CL comma list", P11 "Content-Length: 5, 5" L L, 400),
    BAD("CL plus sign", P11 "Content-Length: +5" L L, 400),
    BAD("CL minus sign", P11 "Content-Length: -1" L L, 400),
    BAD("CL space inside", P11 "Content-Length: 1 2" L L, 400),
    BAD("CL non-digit", P11 "Content-Length: abc" L L, 400),
    BAD("CL hex", P11 "Content-Length: 0x10" L L, 400),
    BAD("CL empty", P11 "Content-Length:" L L, 400),
    BAD("CL overflow", P11 "Content-Length: 99999999999999999999999" L L, 400),
    BAD("CL uint64 max", P11 "Content-Length: 18446744073709551615" L L, 400),
    /* above INT64_MAX (found by fuzz_h1write_response: written again as a
     * negative number); leading zeros do not hide it */
    BAD("CL 2^63", P11 "Content-Length: 9223372036854775808" L L, 400),
    BAD("CL 1.56e19 zero-padded", P11 "Content-Length: 0000000015624860626818432800" L L, 400),
    OK("CL int64 max", P11 "Content-Length: 9223372036854775807" L L, HTTP1_BODY_LENGTH,
       9223372036854775807ULL, 1),
    /* line endings and bytes */
    BAD("bare LF request line", "GET / HTTP/1.1\nHost: a" L L, 400),
    BAD("bare LF header line", "GET / HTTP/1.1" L "Host: a\n" L, 400),
    BAD("bare LF end", G11 "\n", 400),
    BAD("bare LF everywhere", "GET / HTTP/1.1\nHost: a\n\n", 400),
    BAD("leading bare LF", "\n" G11 L, 400),
    BAD("CR alone in value", G11 "X: a\rb" L L, 400),
    BAD("CR then junk at end", G11 "\rX", 400),
    BAD("NUL in name", G11 "X\0Y: a" L L, 400),
    BAD("NUL in value", G11 "X: a\0b" L L, 400),
    BAD("SOH in value", G11 "X: a\x01" "b" L L, 400),
    BAD("DEL in value", G11 "X: a\x7f" L L, 400),
    BAD("ESC in name", G11 "X\x1b: a" L L, 400),
    BAD("space before colon", "GET / HTTP/1.1" L "Host : a" L L, 400),
    BAD("HTAB before colon", G11 "X\t: a" L L, 400),
    BAD("empty header name", G11 ": a" L L, 400),
    BAD("header without colon", G11 "Foo" L L, 400),
    BAD("obs-fold SP", G11 "X: a" L " b" L L, 400),
    BAD("obs-fold HTAB", G11 "X: a" L "\tb" L L, 400),
    BAD("first header indented", "GET / HTTP/1.1" L " Host: a" L L, 400),
    BAD("non-tchar in name", G11 "X(y): a" L L, 400),
    BAD("space before colon, other", G11 "X-Foo : a" L L, 400),
    BAD("CL name with space", P11 "Content-Length : 5" L L, 400),
    BAD("CL name with HTAB", P11 "Content-Length\t: 5" L L, 400),
    /* Host */
    BAD("missing Host 1.1", "GET / HTTP/1.1" L "X: a" L L, 400),
    BAD("two Hosts", G11 "Host: b" L L, 400),
    BAD("two Hosts same", G11 "Host: a" L L, 400),
    BAD("two Hosts 1.0", "GET / HTTP/1.0" L "Host: a" L "host: a" L L, 400),
    /* request line */
    BAD("unknown method", "FOO / HTTP/1.1" L "Host: a" L L, 400),
    BAD("lowercase method", "get / HTTP/1.1" L "Host: a" L L, 400),
    BAD("CONNECT", "CONNECT a:443 HTTP/1.1" L "Host: a:443" L L, 400),
    BAD("HTTP/2.0", "GET / HTTP/2.0" L "Host: a" L L, 400),
    BAD("HTTP/1.2", "GET / HTTP/1.2" L "Host: a" L L, 400),
    BAD("HTTP/0.9", "GET /" L L, 400),
    BAD("HTTP/3.1", "GET / HTTP/3.1" L "Host: a" L L, 400),
    BAD("version junk", "GET / HTTP/1.1x" L "Host: a" L L, 400),
    BAD("lowercase version", "GET / http/1.1" L "Host: a" L L, 400),
    BAD("HTAB in request line", "GET /\t HTTP/1.1" L "Host: a" L L, 400),
    BAD("HTAB in target", "GET /a\tb HTTP/1.1" L "Host: a" L L, 400),
    BAD("high byte in target", "GET /caf\xc3\xa9 HTTP/1.1" L "Host: a" L L, 400),
    BAD("space inside target", "GET /a b HTTP/1.1" L "Host: a" L L, 400),
    BAD("no target", "GET HTTP/1.1" L "Host: a" L L, 400),
    BAD("NUL in target", "GET /\0 HTTP/1.1" L "Host: a" L L, 400),
    BAD("binary garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
    /* sizes */
    BADMAX("request line too long", "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1" L "Host: a" L L, 414, 64),
    BADMAX("header too long", G11 "X-Long: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" L L, 431, 64),
    BADMAX("head just too long", G11 L, 431, sizeof(G11 L) - 2),
};

static void check_good_fields(const struct req_case *c, const struct http1_head *h)
{
    const char *end = NULL;

    for (size_t i = 0; i + 3 < c->len; i++)
        if (memcmp(c->raw + i, "\r\n\r\n", 4) == 0) {
            end = c->raw + i + 4;
            break;
        }
    assert_non_null(end);
    assert_int_equal(h->len, (size_t)(end - c->raw));
    assert_int_equal(h->body, c->body);
    if (c->body == HTTP1_BODY_LENGTH)
        assert_true(h->content_length == c->cl);
    if (c->keep_alive >= 0)
        assert_int_equal(h->keep_alive, c->keep_alive);
    assert_true(h->method.len > 0 && h->target.len > 0);
    assert_true(h->method.off + h->method.len < h->target.off);
    assert_true(h->target.off + h->target.len < h->len);
    for (int i = 0; i < h->nheaders; i++) {
        assert_true(h->h[i].name.len > 0);
        assert_true(h->h[i].name.off + h->h[i].name.len < h->len);
        assert_true(h->h[i].value.off + h->h[i].value.len < h->len);
    }
}

/* The case fed to http1_head_feed() a byte at a time, each call given a new
 * copy of all the bytes so far (the buffer moves, as an evbuffer's may): the
 * first answer other than "more" is the whole's, with the same fields. */
static void feed_bytewise(const struct req_case *c, size_t max)
{
    struct http1 *whole = http1_create(HTTP1_REQUEST), *fed = http1_create(HTTP1_REQUEST);
    struct http1_head *hw = malloc(sizeof(*hw)), *hf = malloc(sizeof(*hf));
    int want = http1_head_parse(whole, c->raw, c->len, max, 0, hw), rc = 1;

    for (size_t k = 1; k <= c->len && rc == 1; k++) {
        char *pre = malloc(k);
        memcpy(pre, c->raw, k);
        rc = http1_head_feed(fed, pre, k, max, 0, hf);
        free(pre);
    }
    if (rc != want)
        print_error("case '%s' fed bytewise: got %d, want %d\n", c->name, rc, want);
    assert_int_equal(rc, want);
    if (want == 0) {
        assert_int_equal(hf->len, hw->len);
        assert_int_equal(hf->nheaders, hw->nheaders);
        assert_memory_equal(hf->h, hw->h, sizeof(hw->h[0]) * (size_t)hw->nheaders);
        assert_memory_equal(&hf->method, &hw->method, sizeof(hw->method));
        assert_memory_equal(&hf->target, &hw->target, sizeof(hw->target));
        assert_int_equal(hf->body, hw->body);
        assert_int_equal(hf->keep_alive, hw->keep_alive);
        assert_int_equal(hf->host, hw->host);
    }
    free(hw);
    free(hf);
    http1_destroy(whole);
    http1_destroy(fed);
}

static void test_request_table(void **state)
{
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head *h = malloc(sizeof(*h));
    int good = 0, bad = 0;

    (void)state;
    for (size_t i = 0; i < sizeof(req_cases) / sizeof(req_cases[0]); i++) {
        const struct req_case *c = &req_cases[i];
        size_t max = c->max_bytes ? c->max_bytes : MAX_HEAD;
        /* a private copy, so ASan sees any read past the end */
        char *raw = malloc(c->len ? c->len : 1);
        int rc;

        memcpy(raw, c->raw, c->len);
        rc = http1_head_parse(p, raw, c->len, max, 0, h);
        if (rc != c->want)
            print_error("case '%s': got %d, want %d\n", c->name, rc, c->want);
        assert_int_equal(rc, c->want);
        if (c->want == 0) {
            check_good_fields(c, h);
            good++;
        } else {
            bad++;
        }
        /* Byte by byte: every shorter prefix needs more bytes (or already
         * fails the same way); a good head completes at exactly h->len. */
        size_t full = c->want == 0 ? h->len : c->len;
        for (size_t k = 0; k < full; k++) {
            char *pre = malloc(k ? k : 1);
            memcpy(pre, c->raw, k);
            rc = http1_head_parse(p, pre, k, max, 0, h);
            free(pre);
            if (rc != 1 && rc != c->want)
                print_error("case '%s' prefix %zu: got %d\n", c->name, k, rc);
            assert_true(rc == 1 || (c->want != 0 && rc == c->want));
        }
        feed_bytewise(c, max);
        free(raw);
    }
    assert_true(good >= 20);
    assert_true(bad >= 50);
    free(h);
    http1_destroy(p);
}

/* ---- request fields ----------------------------------------------------- */

static int span_eq(const char *buf, struct http1_span s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(buf + s.off, lit, s.len) == 0;
}

static void test_request_fields(void **state)
{
    static const char raw[] =
        "POST /api/login?x=1 HTTP/1.1\r\n"
        "Host: api.example.com  \r\n"
        "X-Api-Key:\t k1 \r\n"
        "Expect: 100-continue\r\n"
        "Content-Length: 11\r\n"
        "\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;

    (void)state;
    assert_int_equal(http1_head_parse(p, raw, sizeof(raw) - 1, MAX_HEAD, 0, &h), 0);
    assert_int_equal(h.len, sizeof(raw) - 1);
    assert_int_equal(h.minor, 1);
    assert_true(span_eq(raw, h.method, "POST"));
    assert_true(span_eq(raw, h.target, "/api/login?x=1"));
    assert_int_equal(h.nheaders, 4);
    assert_int_equal(h.host, 0);
    assert_true(span_eq(raw, h.h[0].value, "api.example.com"));
    assert_true(span_eq(raw, h.h[1].name, "X-Api-Key"));
    assert_true(span_eq(raw, h.h[1].value, "k1"));
    assert_int_equal(h.expect_continue, 1);
    assert_int_equal(h.upgrade, 0);
    assert_int_equal(h.body, HTTP1_BODY_LENGTH);
    assert_true(h.content_length == 11);
    assert_true(http1_name_is(raw, &h.h[1], "x-api-key"));
    assert_false(http1_name_is(raw, &h.h[1], "x-api-ke"));
    assert_int_equal(http1_find(raw, &h, "content-length", 0), 3);
    assert_int_equal(http1_find(raw, &h, "HOST", 0), 0);
    assert_int_equal(http1_find(raw, &h, "host", 1), -1);
    assert_int_equal(http1_find(raw, &h, "cookie", 0), -1);
    http1_destroy(p);
}

static void test_request_leading_crlf_and_upgrade(void **state)
{
    static const char raw[] = "\r\n\r\nGET /ws HTTP/1.1\r\nHost: a\r\n"
                              "Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;

    (void)state;
    assert_int_equal(http1_head_parse(p, raw, sizeof(raw) - 1, MAX_HEAD, 0, &h), 0);
    assert_int_equal(h.method.off, 4);
    assert_true(span_eq(raw, h.method, "GET"));
    assert_true(span_eq(raw, h.target, "/ws"));
    assert_int_equal(h.upgrade, 1);
    assert_int_equal(h.host, 0);
    /* an Upgrade header alone is no upgrade */
    static const char half[] = "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n";
    assert_int_equal(http1_head_parse(p, half, sizeof(half) - 1, MAX_HEAD, 0, &h), 0);
    assert_int_equal(h.upgrade, 0);
    http1_destroy(p);
}

/* Exactly HTTP1_MAX_HEADERS headers pass; one more is a 431. */
static void test_request_header_count(void **state)
{
    char *buf = malloc(8192);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    size_t n;

    (void)state;
    for (int extra = 0; extra <= 1; extra++) {
        n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nHost: a\r\n");
        for (int i = 1; i < HTTP1_MAX_HEADERS + extra; i++)
            n += (size_t)sprintf(buf + n, "X-H%d: v%d\r\n", i, i);
        n += (size_t)sprintf(buf + n, "\r\n");
        int rc = http1_head_parse(p, buf, n, 8192, 0, &h);
        assert_int_equal(rc, extra ? 431 : 0);
        if (!extra) {
            assert_int_equal(h.nheaders, HTTP1_MAX_HEADERS);
            assert_true(span_eq(buf, h.h[99].name, "X-H99"));
            assert_true(span_eq(buf, h.h[99].value, "v99"));
        }
    }
    free(buf);
    http1_destroy(p);
}

/* A head longer than max_bytes fails only once more than max_bytes are
 * there; a complete head within max_bytes passes whatever follows it. */
static void test_request_limits(void **state)
{
    static const char raw[] = "GET /0123456789 HTTP/1.1\r\nHost: a\r\n\r\nGET /next";
    size_t head = sizeof("GET /0123456789 HTTP/1.1\r\nHost: a\r\n\r\n") - 1;
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;

    (void)state;
    assert_int_equal(http1_head_parse(p, raw, sizeof(raw) - 1, head, 0, &h), 0);
    assert_int_equal(h.len, head);
    assert_int_equal(http1_head_parse(p, raw, head - 1, head - 1, 0, &h), 1);
    assert_int_equal(http1_head_parse(p, raw, head, head - 1, 0, &h), 431);
    assert_int_equal(http1_head_parse(p, raw, 20, 10, 0, &h), 414);
    assert_int_equal(http1_head_parse(p, raw, 10, 10, 0, &h), 1);
    assert_int_equal(http1_head_parse(p, raw, 0, 10, 0, &h), 1);
    http1_destroy(p);
}

/* ---- bodies ------------------------------------------------------------- */

/* Feed data in steps of at most step bytes (as separate buffers, the way an
 * evbuffer hands out segments), appending payload to out. Returns bytes
 * consumed until done, or -1. */
static long feed_all(struct http1 *p, const char *data, size_t len, size_t step,
                     char *out, size_t *outlen, int *done)
{
    struct http1_piece pieces[HTTP1_MAX_PIECES];
    size_t at = 0;
    int rounds = 0;

    *outlen = 0;
    *done = 0;
    while (!*done && rounds++ < 100000) {
        size_t n = len - at < step ? len - at : step;
        char *seg = malloc(n ? n : 1);
        int np = -1;
        long used;

        memcpy(seg, data + at, n);
        used = http1_body_feed(p, seg, n, pieces, &np, done);
        if (used < 0) {
            free(seg);
            return -1;
        }
        assert_true((size_t)used <= n);
        assert_true(np >= 0 && np <= HTTP1_MAX_PIECES);
        for (int i = 0; i < np; i++) {
            assert_true(pieces[i].off + pieces[i].len <= (size_t)used);
            memcpy(out + *outlen, seg + pieces[i].off, pieces[i].len);
            *outlen += pieces[i].len;
        }
        free(seg);
        at += (size_t)used;
        if (n == 0 || (used == 0 && !*done && np == 0 && at == len))
            break;              /* out of data */
    }
    return (long)at;
}

static void parse_head_ok(struct http1 *p, const char *raw, size_t len,
                          struct http1_head *h, int head_request)
{
    assert_int_equal(http1_head_parse(p, raw, len, MAX_HEAD, head_request, h), 0);
}

static void test_body_content_length_split(void **state)
{
    static const char msg[] = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"
                              "0123456789GET /next HTTP/1.1\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    char out[64];
    size_t outlen;
    int done;

    (void)state;
    for (size_t step = 1; step <= 16; step++) {
        parse_head_ok(p, msg, sizeof(msg) - 1, &h, 0);
        assert_int_equal(h.body, HTTP1_BODY_LENGTH);
        long used = feed_all(p, msg + h.len, sizeof(msg) - 1 - h.len, step, out, &outlen, &done);
        assert_int_equal(done, 1);
        assert_int_equal(used, 10);
        assert_int_equal(outlen, 10);
        assert_memory_equal(out, "0123456789", 10);
        /* once done, nothing more is taken */
        struct http1_piece pc[HTTP1_MAX_PIECES];
        int np;
        assert_int_equal(http1_body_feed(p, "GET", 3, pc, &np, &done), 0);
        assert_int_equal(done, 1);
        assert_int_equal(np, 0);
    }
    http1_destroy(p);
}

static void test_body_none_first_feed(void **state)
{
    static const char msg[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    struct http1_piece pc[HTTP1_MAX_PIECES];
    int np, done;

    (void)state;
    parse_head_ok(p, msg, sizeof(msg) - 1, &h, 0);
    assert_int_equal(h.len, 27);
    assert_int_equal(h.body, HTTP1_BODY_NONE);
    assert_int_equal(http1_body_feed(p, msg + h.len, sizeof(msg) - 1 - h.len, pc, &np, &done), 0);
    assert_int_equal(done, 1);
    assert_int_equal(np, 0);
    /* the pipelined second request, without a feed in between this time */
    parse_head_ok(p, msg + 27, sizeof(msg) - 1 - 27, &h, 0);
    assert_true(span_eq(msg + 27, h.target, "/2"));
    parse_head_ok(p, msg, sizeof(msg) - 1, &h, 0);
    /* a feed without any head parsed is an error */
    struct http1 *q = http1_create(HTTP1_REQUEST);
    assert_int_equal(http1_body_feed(q, "x", 1, pc, &np, &done), -1);
    http1_destroy(q);
    http1_destroy(p);
}

static const char chunked_msg[] =
    "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    "5;name=value\r\nhello\r\n"
    "6 ; a=b;c\r\n world\r\n"
    "A\r\n, chunked!\r\n"
    "0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n"
    "GET /next HTTP/1.1\r\nHost: a\r\n\r\n";

static void test_body_chunked_ext_trailers(void **state)
{
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    const char *next = strstr(chunked_msg, "GET /next");
    char out[256];
    size_t outlen;
    int done;

    (void)state;
    for (size_t step = 1; step <= sizeof(chunked_msg); step++) {
        parse_head_ok(p, chunked_msg, sizeof(chunked_msg) - 1, &h, 0);
        assert_int_equal(h.body, HTTP1_BODY_CHUNKED);
        long used = feed_all(p, chunked_msg + h.len, sizeof(chunked_msg) - 1 - h.len,
                             step, out, &outlen, &done);
        assert_int_equal(done, 1);
        assert_int_equal(used, next - (chunked_msg + h.len));
        assert_int_equal(outlen, 21);
        assert_memory_equal(out, "hello world, chunked!", 21);
        /* the next request is intact after the body */
        parse_head_ok(p, next, strlen(next), &h, 0);
        assert_true(span_eq(next, h.target, "/next"));
    }
    http1_destroy(p);
}

static long chunked_body_result(const char *body)
{
    static const char head[] = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    char out[256];
    size_t outlen;
    int done;
    long rc;

    parse_head_ok(p, head, sizeof(head) - 1, &h, 0);
    rc = feed_all(p, body, strlen(body), 4096, out, &outlen, &done);
    if (rc >= 0 && !done)
        rc = -2;                /* incomplete */
    http1_destroy(p);
    return rc;
}

static void test_body_chunked_bad(void **state)
{
    (void)state;
    assert_int_equal(chunked_body_result("ffffffffffffffffff\r\n"), -1);
    assert_int_equal(chunked_body_result("10000000000000000\r\n"), -1);
    assert_int_equal(chunked_body_result("zz\r\nab\r\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("-1\r\n"), -1);
    assert_int_equal(chunked_body_result("0x5\r\nhello\r\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("\r\n5\r\nhello\r\n0\r\n\r\n"), -1);
    /* framing non-strict http_parser would let through */
    assert_int_equal(chunked_body_result("5\r\nhelloXY0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("5\r\nhello\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("5\rXhello\r\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("5\nhello\r\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("5;a\x01\r\nhello\r\n0\r\n\r\n"), -1);
    assert_int_equal(chunked_body_result("5\r\nhello\r\n0\r\n\n"), -1);
    /* and good ones, to show the checks above are not blanket refusals */
    assert_int_equal(chunked_body_result("5\r\nhello\r\n0\r\n\r\n"), 15);
    assert_int_equal(chunked_body_result("5;x=\"q\"\r\nhello\r\n0\r\nT: 1\r\n\r\nrest"), 27);
    assert_int_equal(chunked_body_result("5\r\nhel"), -2);
}

/* Size lines, extensions and trailers are bounded: HTTP1_MAX_HEAD_BYTES of
 * them without a data byte between, as http_parser bounded trailers. Just
 * under the bound passes, so the check is the bound and not a refusal. */
static void test_body_chunked_meta_bounded(void **state)
{
    size_t big = HTTP1_MAX_HEAD_BYTES + 64, n;
    char *b = malloc(256 * 1024);

    (void)state;
    /* leading zeros without end */
    memset(b, '0', big);
    strcpy(b + big, "5\r\nhello\r\n0\r\n\r\n");
    assert_int_equal(chunked_body_result(b), -1);
    /* one chunk extension without end */
    n = (size_t)sprintf(b, "5;");
    memset(b + n, 'x', big);
    strcpy(b + n + big, "\r\nhello\r\n0\r\n\r\n");
    assert_int_equal(chunked_body_result(b), -1);
    /* trailer lines without end */
    n = (size_t)sprintf(b, "0\r\n");
    while (n < 2 * big)         /* CRLF and ':' are not counted: twice over */
        n += (size_t)sprintf(b + n, "T: vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n");
    strcpy(b + n, "\r\n");
    assert_int_equal(chunked_body_result(b), -1);
    /* under the bound: 60 KB of trailers and of extension are taken */
    n = (size_t)sprintf(b, "0\r\n");
    while (n < 60 * 1024)
        n += (size_t)sprintf(b + n, "T: vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\r\n");
    strcpy(b + n, "\r\n");
    assert_int_equal(chunked_body_result(b), (long)n + 2);
    n = (size_t)sprintf(b, "5;");
    memset(b + n, 'x', 60 * 1024);
    n += 60 * 1024;
    n += (size_t)sprintf(b + n, "\r\nhello\r\n5;");
    memset(b + n, 'x', 60 * 1024);      /* a data byte came between: counted anew */
    n += 60 * 1024;
    n += (size_t)sprintf(b + n, "\r\nhello\r\n0\r\n\r\n");
    assert_int_equal(chunked_body_result(b), (long)n);
    free(b);
}

/* More payload runs than the array holds: the feed stops early with a full
 * array, and the caller continues with the rest. */
static void test_body_pieces_full(void **state)
{
    static const char head[] = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    char *body = malloc(4096), *want = malloc(256), *out = malloc(256);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_piece pc[HTTP1_MAX_PIECES];
    struct http1_head h;
    size_t n = 0, wn = 0, on = 0, at = 0;
    int np, done = 0, full_seen = 0, calls = 0;

    (void)state;
    for (int i = 0; i < 3 * HTTP1_MAX_PIECES + 5; i++) {
        n += (size_t)sprintf(body + n, "1\r\n%c\r\n", 'A' + i % 26);
        want[wn++] = (char)('A' + i % 26);
    }
    n += (size_t)sprintf(body + n, "0\r\n\r\n");
    parse_head_ok(p, head, sizeof(head) - 1, &h, 0);
    while (!done && calls++ < 100) {
        long used = http1_body_feed(p, body + at, n - at, pc, &np, &done);
        assert_true(used > 0);
        if (np == HTTP1_MAX_PIECES) {
            full_seen++;
            assert_true((size_t)used < n - at);
        }
        for (int i = 0; i < np; i++)
            out[on++] = body[at + pc[i].off];
        at += (size_t)used;
    }
    assert_int_equal(done, 1);
    assert_int_equal(at, n);
    assert_int_equal(full_seen, 3);
    assert_int_equal(on, wn);
    assert_memory_equal(out, want, wn);
    free(body);
    free(want);
    free(out);
    http1_destroy(p);
}

/* ---- responses ---------------------------------------------------------- */

static void test_response_length_and_chunked(void **state)
{
    static const char r1[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1";
    static const char r2[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                             "3\r\nabc\r\n0\r\n\r\n";
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head h;
    char out[64];
    size_t outlen;
    int done;

    (void)state;
    parse_head_ok(p, r1, sizeof(r1) - 1, &h, 0);
    assert_int_equal(h.status, 200);
    assert_int_equal(h.body, HTTP1_BODY_LENGTH);
    assert_true(h.content_length == 3);
    assert_int_equal(h.keep_alive, 1);
    assert_int_equal(feed_all(p, r1 + h.len, sizeof(r1) - 1 - h.len, 2, out, &outlen, &done), 3);
    assert_int_equal(done, 1);
    assert_memory_equal(out, "abc", 3);

    parse_head_ok(p, r2, sizeof(r2) - 1, &h, 0);
    assert_int_equal(h.body, HTTP1_BODY_CHUNKED);
    assert_int_equal(feed_all(p, r2 + h.len, sizeof(r2) - 1 - h.len, 5, out, &outlen, &done),
                     (long)(sizeof(r2) - 1 - h.len));
    assert_int_equal(done, 1);
    assert_memory_equal(out, "abc", 3);
    http1_destroy(p);
}

static void test_response_eof(void **state)
{
    static const char r[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close";
    static const char r_te[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw";
    static const char r_cl[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab";
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head h;
    char out[64];
    size_t outlen;
    int done;

    (void)state;
    parse_head_ok(p, r, sizeof(r) - 1, &h, 0);
    assert_int_equal(h.body, HTTP1_BODY_EOF);
    assert_int_equal(h.keep_alive, 0);
    assert_int_equal(feed_all(p, r + h.len, sizeof(r) - 1 - h.len, 4, out, &outlen, &done),
                     (long)(sizeof(r) - 1 - h.len));
    assert_int_equal(done, 0);
    assert_int_equal(outlen, 11);
    assert_memory_equal(out, "until close", 11);
    assert_int_equal(http1_body_eof(p), 1);

    /* EOF right after the head, with no feed at all */
    parse_head_ok(p, r, sizeof(r) - 1, &h, 0);
    assert_int_equal(http1_body_eof(p), 1);

    /* chunked not last: delimited by close */
    parse_head_ok(p, r_te, sizeof(r_te) - 1, &h, 0);
    assert_int_equal(h.body, HTTP1_BODY_EOF);
    assert_int_equal(feed_all(p, r_te + h.len, 3, 3, out, &outlen, &done), 3);
    assert_int_equal(http1_body_eof(p), 1);

    /* a close in the middle of a Content-Length body completes nothing */
    parse_head_ok(p, r_cl, sizeof(r_cl) - 1, &h, 0);
    assert_int_equal(feed_all(p, r_cl + h.len, 2, 2, out, &outlen, &done), 2);
    assert_int_equal(done, 0);
    assert_int_equal(http1_body_eof(p), 0);
    http1_destroy(p);
}

static void expect_no_body(struct http1 *p, const char *r, int head_request, int status)
{
    struct http1_head h;
    struct http1_piece pc[HTTP1_MAX_PIECES];
    size_t len = strlen(r);
    int np, done;

    parse_head_ok(p, r, len, &h, head_request);
    assert_int_equal(h.status, status);
    assert_int_equal(h.body, HTTP1_BODY_NONE);
    assert_int_equal(http1_body_feed(p, r + h.len, len - h.len, pc, &np, &done), 0);
    assert_int_equal(done, 1);
    assert_int_equal(np, 0);
}

static void test_response_no_body(void **state)
{
    struct http1 *p = http1_create(HTTP1_RESPONSE);

    (void)state;
    expect_no_body(p, "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200", 0, 204);
    expect_no_body(p, "HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\nHTTP/1.1", 0, 304);
    expect_no_body(p, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nHTTP/1.1", 1, 200);
    expect_no_body(p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 1, 200);
    expect_no_body(p, "HTTP/1.1 200 OK\r\n\r\n", 1, 200);
    http1_destroy(p);
}

static void test_response_continue_then_200(void **state)
{
    static const char r[] = "HTTP/1.1 100 Continue\r\n\r\n"
                            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head h;
    char out[8];
    size_t outlen;
    int done;

    (void)state;
    parse_head_ok(p, r, sizeof(r) - 1, &h, 0);
    assert_int_equal(h.status, 100);
    assert_int_equal(h.body, HTTP1_BODY_NONE);
    assert_int_equal(h.upgrade, 0);
    assert_int_equal(h.len, 25);
    parse_head_ok(p, r + 25, sizeof(r) - 1 - 25, &h, 0);
    assert_int_equal(h.status, 200);
    assert_int_equal(feed_all(p, r + 25 + h.len, 2, 2, out, &outlen, &done), 2);
    assert_int_equal(done, 1);
    assert_memory_equal(out, "ok", 2);
    http1_destroy(p);
}

static void test_response_upgrade(void **state)
{
    static const char r[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                            "Connection: Upgrade\r\n\r\n\x81\x05hello";
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head h;
    struct http1_piece pc[HTTP1_MAX_PIECES];
    int np, done;

    (void)state;
    parse_head_ok(p, r, sizeof(r) - 1, &h, 0);
    assert_int_equal(h.status, 101);
    assert_int_equal(h.upgrade, 1);
    assert_int_equal(h.body, HTTP1_BODY_NONE);
    assert_int_equal(http1_body_feed(p, r + h.len, 7, pc, &np, &done), 0);
    assert_int_equal(done, 1);
    http1_destroy(p);
}

static void test_response_bad(void **state)
{
#define R(s) { s, sizeof(s) - 1 }
    static const struct { const char *s; size_t len; } bad[] = {
        R("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
        R("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
        R("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
        R("HTTP/1.1 200 OK\nContent-Length: 3\r\n\r\n"),
        R("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n"),
        R("HTTP/2.0 200 OK\r\n\r\n"),
        R("HTTP/1.1 20 OK\r\n\r\n"),
        R("HTTP/1.1 2000 OK\r\n\r\n"),
        R("HTTP/1.1 200 OK\r\nX\0: a\r\n\r\n"),
        R("garbage\r\n\r\n"),
        R("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n"),
    };
#undef R
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head h;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = http1_head_parse(p, bad[i].s, bad[i].len, MAX_HEAD, 0, &h);
        if (rc != 400)
            print_error("response case %zu: got %d\n", i, rc);
        assert_int_equal(rc, 400);
    }
    /* a 1.0 response keeps alive only when asked to */
    static const char r10[] = "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
    static const char r10ka[] = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
    parse_head_ok(p, r10, sizeof(r10) - 1, &h, 0);
    assert_int_equal(h.keep_alive, 0);
    assert_int_equal(h.minor, 0);
    parse_head_ok(p, r10ka, sizeof(r10ka) - 1, &h, 0);
    assert_int_equal(h.keep_alive, 1);
    http1_destroy(p);
}

/* Arbitrary bytes never crash the parser nor make it read outside the
 * buffer (run under ASan); a fixed seed keeps it repeatable. */
static void test_random_bytes(void **state)
{
    static const char alphabet[] = "GET /HTP1.0\r\n:;Hostcnked-Lgh \t\x00\x7f\xff" "0123456789abcdefxX,";
    struct http1 *req = http1_create(HTTP1_REQUEST), *res = http1_create(HTTP1_RESPONSE);
    struct http1_piece pc[HTTP1_MAX_PIECES];
    struct http1_head h;
    unsigned seed = 12345;
    int np, done;

    (void)state;
    for (int round = 0; round < 20000; round++) {
        char buf[160];
        size_t len = 0;
        int i;
        /* a plausible prefix, then noise */
        const char *pre = (round & 1) ? "POST / HTTP/1.1\r\nHost: a\r\n" : "HTTP/1.1 200 OK\r\n";
        memcpy(buf, pre, strlen(pre));
        len = strlen(pre);
        for (i = 0; i < 100; i++) {
            seed = seed * 1103515245u + 12345u;
            buf[len++] = alphabet[(seed >> 16) % (sizeof(alphabet) - 1)];
        }
        char *copy = malloc(len);
        memcpy(copy, buf, len);
        struct http1 *p = (round & 1) ? req : res;
        if (http1_head_parse(p, copy, len, 120, round & 2, &h) == 0) {
            assert_true(h.len <= len);
            long used = http1_body_feed(p, copy + h.len, len - h.len, pc, &np, &done);
            assert_true(used >= -1 && used <= (long)(len - h.len));
            http1_body_eof(p);
        }
        free(copy);
    }
    http1_destroy(req);
    http1_destroy(res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_table),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_request_leading_crlf_and_upgrade),
        cmocka_unit_test(test_request_header_count),
        cmocka_unit_test(test_request_limits),
        cmocka_unit_test(test_body_content_length_split),
        cmocka_unit_test(test_body_none_first_feed),
        cmocka_unit_test(test_body_chunked_ext_trailers),
        cmocka_unit_test(test_body_chunked_bad),
        cmocka_unit_test(test_body_chunked_meta_bounded),
        cmocka_unit_test(test_body_pieces_full),
        cmocka_unit_test(test_response_length_and_chunked),
        cmocka_unit_test(test_response_eof),
        cmocka_unit_test(test_response_no_body),
        cmocka_unit_test(test_response_continue_then_200),
        cmocka_unit_test(test_response_upgrade),
        cmocka_unit_test(test_response_bad),
        cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
