/* sluice - test_reply.c: the responses sluice writes itself (reply.c).
 *
 * Exact bytes of the 429 (every `headers` mode, several limits, custom
 * status and message, Retry-After), of the JSON errors and the 503
 * limiter_unavailable (statuses, names, keep-alive forms, X-Request-Id),
 * the merge of the rate-limit fields with an upstream's, and the rounding
 * of seconds. Every complete reply is also checked for a Content-Length
 * that is exactly its body's length. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "obuf.h"
#include "reply.h"
#include "testlib.h"

/* ---- helpers ---------------------------------------------------------------- */

/* A complete reply: its head ends once, its Content-Length is its body's
 * length, and nothing follows the body. */
static void check_framing(const char *s)
{
    const char *end = strstr(s, "\r\n\r\n");
    assert_non_null(end);
    const char *body = end + 4;
    const char *cl = strstr(s, "\r\nContent-Length: ");
    assert_non_null(cl);
    assert_true(cl < end);
    const char *again = strstr(cl + 1, "\r\nContent-Length: ");
    assert_true(again == NULL || again > end);
    long n = strtol(cl + 18, NULL, 10);
    assert_int_equal(n, (long)strlen(body));
    assert_true(body[0] == '{' && body[strlen(body) - 1] == '}');
}

/* Assert that the reply in b is exactly head + "Content-Length: N" + tail +
 * body, N being body's length. */
static void expect_reply(struct evbuffer *b, const char *head, const char *tail,
                         const char *body)
{
    char want[8192];
    int n = snprintf(want, sizeof(want), "%sContent-Length: %zu\r\n%s\r\n%s", head,
                     strlen(body), tail, body);
    assert_true(n > 0 && (size_t)n < sizeof(want));
    char *got = testlib_drain(b);
    assert_string_equal(got, want);
    check_framing(got);
    free(got);
}

/* A route with up to STORE_MAX_LIMITS limits and their results. */
struct fixture {
    struct conf_route route;
    struct conf_limit limits[STORE_MAX_LIMITS];
    struct reply_limits rl;
};

static void fx_init(struct fixture *f, const char *route, enum conf_headers mode)
{
    memset(f, 0, sizeof(*f));
    f->route.name = (char *)route;
    f->route.headers = mode;
    f->route.limits = f->limits;
    f->rl.route = &f->route;
}

/* Add a limit: fixed_window `limit` per window_ms, and its result. */
static struct limiter_result *fx_limit(struct fixture *f, const char *name, int64_t limit,
                                       int64_t window_ms, int allowed, int64_t remaining,
                                       int64_t reset_ms, int64_t retry_ms)
{
    int i = f->route.nlimits++;
    struct conf_limit *l = &f->limits[i];
    l->name = (char *)name;
    l->params = (struct limiter_params){ LIMITER_FIXED_WINDOW, limit, window_ms, 0 };
    f->rl.limit[i] = l;
    f->rl.n = f->route.nlimits;
    f->rl.r[i] = (struct limiter_result){ allowed, limit, remaining, reset_ms, retry_ms };
    return &f->rl.r[i];
}

/* The example in docs/algorithms.md (Responses): one limit, 10 per minute, denied for 14.2 s more. */
static void fx_readme(struct fixture *f, enum conf_headers mode)
{
    fx_init(f, "default", mode);
    fx_limit(f, "per-ip", 10, 60000, 0, 0, 60000, 14200);
    reply_pick(&f->rl, 0);
}

static const char readme_body[] =
    "{\"error\":\"rate_limited\",\"route\":\"default\",\"limit\":\"per-ip\",\"retry_after\":15}";

/* ---- reply_limited: the modes ------------------------------------------------- */

static void test_limited_full_readme(void **state)
{
    struct fixture f;
    fx_readme(&f, CONF_HEADERS_FULL);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "X-RateLimit-Limit: 10\r\n"
                 "X-RateLimit-Remaining: 0\r\n"
                 "X-RateLimit-Reset: 15\r\n"
                 "RateLimit-Policy: \"per-ip\";q=10;w=60\r\n"
                 "RateLimit: \"per-ip\";r=0;t=15\r\n"
                 "Content-Type: application/json\r\n",
                 "", readme_body);
    evbuffer_free(b);
}

static void test_limited_ietf(void **state)
{
    struct fixture f;
    fx_readme(&f, CONF_HEADERS_IETF);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "RateLimit-Policy: \"per-ip\";q=10;w=60\r\n"
                 "RateLimit: \"per-ip\";r=0;t=15\r\n"
                 "Content-Type: application/json\r\n",
                 "", readme_body);
    evbuffer_free(b);
}

static void test_limited_legacy(void **state)
{
    struct fixture f;
    fx_readme(&f, CONF_HEADERS_LEGACY);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "X-RateLimit-Limit: 10\r\n"
                 "X-RateLimit-Remaining: 0\r\n"
                 "X-RateLimit-Reset: 15\r\n"
                 "Content-Type: application/json\r\n",
                 "", readme_body);
    evbuffer_free(b);
}

/* headers: none still has Retry-After ("A rejection always has Retry-After"). */
static void test_limited_none(void **state)
{
    struct fixture f;
    fx_readme(&f, CONF_HEADERS_NONE);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "Content-Type: application/json\r\n",
                 "", readme_body);
    evbuffer_free(b);
}

/* ---- reply_limited: keep-alive forms and the request id ----------------------- */

static void test_limited_close_and_request_id(void **state)
{
    struct fixture f;
    fx_readme(&f, CONF_HEADERS_NONE);
    struct evbuffer *b = evbuffer_new();
    /* The id is rid_len bytes, not up to a NUL. */
    reply_limited(b, &f.rl, REPLY_CLOSE, "0123456789abcdefXYZ", 16);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "X-Request-Id: 0123456789abcdef\r\n"
                 "Content-Type: application/json\r\n",
                 "Connection: close\r\n", readme_body);
    reply_limited(b, &f.rl, REPLY_KEEP_SAID, "rid-1", 5);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 15\r\n"
                 "X-Request-Id: rid-1\r\n"
                 "Content-Type: application/json\r\n",
                 "Connection: keep-alive\r\n", readme_body);
    evbuffer_free(b);
}

/* ---- reply_limited: custom status and message, Retry-After -------------------- */

static void test_limited_custom_status_message(void **state)
{
    struct fixture f;
    fx_init(&f, "users", CONF_HEADERS_FULL);
    fx_limit(&f, "per-user", 100, 3600000, 0, 0, 3600000, 37001);
    f.limits[0].status = 503;
    f.limits[0].message = "slow down";
    reply_pick(&f.rl, 0);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 503 Service Unavailable\r\n"
                 "Retry-After: 38\r\n"
                 "X-RateLimit-Limit: 100\r\n"
                 "X-RateLimit-Remaining: 0\r\n"
                 "X-RateLimit-Reset: 38\r\n"
                 "RateLimit-Policy: \"per-user\";q=100;w=3600\r\n"
                 "RateLimit: \"per-user\";r=0;t=38\r\n"
                 "Content-Type: application/json\r\n",
                 "",
                 "{\"error\":\"rate_limited\",\"route\":\"users\",\"limit\":\"per-user\","
                 "\"retry_after\":38,\"message\":\"slow down\"}");
    /* A status without a reason phrase of its own. */
    f.limits[0].status = 418;
    f.limits[0].message = NULL;
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    char *got = testlib_drain(b);
    assert_memory_equal(got, "HTTP/1.1 418 Error\r\n", 20);
    check_framing(got);
    free(got);
    evbuffer_free(b);
}

/* Retry-After is whole seconds rounded up and at least 1, and the 429's
 * X-RateLimit-Reset and t= say the same. */
static void test_limited_retry_after_rounding(void **state)
{
    static const struct { int64_t retry_ms; const char *secs; } cases[] = {
        { 0, "1" }, { 1, "1" }, { 999, "1" }, { 1000, "1" }, { 1001, "2" },
        { 59999, "60" }, { 86400000, "86400" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fixture f;
        fx_init(&f, "r", CONF_HEADERS_FULL);
        fx_limit(&f, "l", 5, 1000, 0, 0, 1000, cases[i].retry_ms);
        reply_pick(&f.rl, 0);
        struct evbuffer *b = evbuffer_new();
        reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
        char *got = testlib_drain(b), want[512];
        snprintf(want, sizeof(want),
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: %s\r\n"
                 "X-RateLimit-Limit: 5\r\n"
                 "X-RateLimit-Remaining: 0\r\n"
                 "X-RateLimit-Reset: %s\r\n"
                 "RateLimit-Policy: \"l\";q=5;w=1\r\n"
                 "RateLimit: \"l\";r=0;t=%s\r\n"
                 "Content-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n"
                 "{\"error\":\"rate_limited\",\"route\":\"r\",\"limit\":\"l\",\"retry_after\":%s}",
                 cases[i].secs, cases[i].secs, cases[i].secs,
                 strlen("{\"error\":\"rate_limited\",\"route\":\"r\",\"limit\":\"l\",\"retry_after\":}")
                     + strlen(cases[i].secs),
                 cases[i].secs);
        assert_string_equal(got, want);
        check_framing(got);
        free(got);
        evbuffer_free(b);
    }
}

/* ---- reply_limited: several limits -------------------------------------------- */

/* The policy lists every limit of the route; RateLimit and X-RateLimit-*
 * show the denying one, which waits longest; a shadow limit that would wait
 * longer still is never the one shown. */
static void test_limited_several_limits(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_FULL);
    fx_limit(&f, "per-ip", 10, 60000, 1, 3, 20000, 0);
    fx_limit(&f, "per-user", 100, 3600000, 0, 0, 3600000, 4500);
    fx_limit(&f, "burst", 5, 1000, 0, 0, 1000, 900);
    fx_limit(&f, "shadow", 1, 86400000, 0, 0, 86400000, 86000000);
    f.limits[3].shadow = 1;
    reply_pick(&f.rl, 0);
    assert_int_equal(f.rl.shown, 1);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 5\r\n"
                 "X-RateLimit-Limit: 100\r\n"
                 "X-RateLimit-Remaining: 0\r\n"
                 "X-RateLimit-Reset: 5\r\n"
                 "RateLimit-Policy: \"per-ip\";q=10;w=60, \"per-user\";q=100;w=3600, "
                 "\"burst\";q=5;w=1, \"shadow\";q=1;w=86400\r\n"
                 "RateLimit: \"per-user\";r=0;t=5\r\n"
                 "Content-Type: application/json\r\n",
                 "",
                 "{\"error\":\"rate_limited\",\"route\":\"api\",\"limit\":\"per-user\","
                 "\"retry_after\":5}");
    evbuffer_free(b);
}

static void test_pick(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_FULL);
    fx_limit(&f, "a", 10, 60000, 1, 7, 1000, 0);
    fx_limit(&f, "b", 10, 60000, 1, 2, 1000, 0);
    fx_limit(&f, "c", 10, 60000, 1, 5, 1000, 0);
    fx_limit(&f, "d", 10, 60000, 1, 2, 1000, 0);
    reply_pick(&f.rl, 1);
    assert_int_equal(f.rl.shown, 1);        /* least remaining, first of equals */
    /* A shadow limit counts for "least remaining" when allowed. */
    f.limits[2].shadow = 1;
    f.rl.r[2].remaining = 0;
    reply_pick(&f.rl, 1);
    assert_int_equal(f.rl.shown, 2);
    /* Denied: the one denying limit, even if another waits longer and allowed. */
    f.limits[2].shadow = 0;
    f.rl.r[2] = (struct limiter_result){ 1, 10, 5, 1000, 0 };
    f.rl.r[3] = (struct limiter_result){ 0, 10, 0, 1000, 10 };
    f.rl.r[0].retry_ms = 99999;
    reply_pick(&f.rl, 0);
    assert_int_equal(f.rl.shown, 3);
    /* Two denying: the longer wait; a denying shadow never. */
    f.rl.r[0] = (struct limiter_result){ 0, 10, 0, 1000, 20 };
    f.rl.r[1] = (struct limiter_result){ 0, 10, 0, 1000, 5000 };
    f.limits[1].shadow = 1;
    reply_pick(&f.rl, 0);
    assert_int_equal(f.rl.shown, 0);
    f.limits[1].shadow = 0;
    reply_pick(&f.rl, 0);
    assert_int_equal(f.rl.shown, 1);
}

/* Names come from the config: '"' and '\' are escaped, control bytes are
 * dropped, other bytes (UTF-8) pass; the Content-Length counts the result. */
static void test_limited_escaping(void **state)
{
    struct fixture f;
    fx_init(&f, "r\"o\\ute", CONF_HEADERS_IETF);
    fx_limit(&f, "l\x01i\tm\x7fit\xc3\xa9", 1, 1000, 0, 0, 1000, 1000);
    f.limits[0].message = "say \"no\"\n";
    reply_pick(&f.rl, 0);
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Retry-After: 1\r\n"
                 "RateLimit-Policy: \"limit\xc3\xa9\";q=1;w=1\r\n"
                 "RateLimit: \"limit\xc3\xa9\";r=0;t=1\r\n"
                 "Content-Type: application/json\r\n",
                 "",
                 "{\"error\":\"rate_limited\",\"route\":\"r\\\"o\\\\ute\",\"limit\":\"limit\xc3\xa9\","
                 "\"retry_after\":1,\"message\":\"say \\\"no\\\"\"}");
    evbuffer_free(b);
}

/* A head far beyond the first guess of the buffer (16 long names, a long
 * id): written whole, framed exactly. */
static void test_limited_large(void **state)
{
    struct fixture f;
    static char names[STORE_MAX_LIMITS][200];
    fx_init(&f, "big", CONF_HEADERS_FULL);
    for (int i = 0; i < STORE_MAX_LIMITS; i++) {
        memset(names[i], 'a' + i, sizeof(names[i]) - 1);
        names[i][sizeof(names[i]) - 1] = '\0';
        fx_limit(&f, names[i], 1000000000000LL, 86400000LL * 365, i != 9, i + 1, 5, 123456789);
    }
    f.limits[9].message = names[0];
    reply_pick(&f.rl, 0);
    assert_int_equal(f.rl.shown, 9);
    char rid[129];
    memset(rid, 'z', 128);
    rid[128] = '\0';
    struct evbuffer *b = evbuffer_new();
    reply_limited(b, &f.rl, REPLY_CLOSE, rid, 128);
    char *got = testlib_drain(b);
    check_framing(got);
    assert_true(strlen(got) > 16 * 200);
    assert_non_null(strstr(got, "\r\nRetry-After: 123457\r\n"));
    assert_non_null(strstr(got, "\r\nConnection: close\r\n\r\n"));
    char want[300];
    snprintf(want, sizeof(want), "\r\nX-Request-Id: %s\r\n", rid);
    assert_non_null(strstr(got, want));
    snprintf(want, sizeof(want), "\r\nRateLimit: \"%s\";r=10;t=123457\r\n", names[9]);
    assert_non_null(strstr(got, want));
    snprintf(want, sizeof(want), ", \"%s\";q=1000000000000;w=31536000\r\n", names[15]);
    assert_non_null(strstr(got, want));
    free(got);
    evbuffer_free(b);
}

/* ---- reply_error, reply_error_named, reply_unavailable ------------------------ */

static void test_error_statuses(void **state)
{
    static const struct { int status; const char *line; const char *name; } cases[] = {
        { 400, "HTTP/1.1 400 Bad Request\r\n", "bad_request" },
        { 404, "HTTP/1.1 404 Not Found\r\n", "no_route" },
        { 408, "HTTP/1.1 408 Request Timeout\r\n", "request_timeout" },
        { 413, "HTTP/1.1 413 Content Too Large\r\n", "body_too_large" },
        { 414, "HTTP/1.1 414 URI Too Long\r\n", "uri_too_long" },
        { 431, "HTTP/1.1 431 Request Header Fields Too Large\r\n", "headers_too_large" },
        { 500, "HTTP/1.1 500 Internal Server Error\r\n", "error" },
        { 501, "HTTP/1.1 501 Not Implemented\r\n", "not_implemented" },
        { 502, "HTTP/1.1 502 Bad Gateway\r\n", "bad_gateway" },
        { 503, "HTTP/1.1 503 Service Unavailable\r\n", "limiter_unavailable" },
        { 504, "HTTP/1.1 504 Gateway Timeout\r\n", "gateway_timeout" },
        { 599, "HTTP/1.1 599 Error\r\n", "error" },
    };
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char head[256], body[128];
        snprintf(head, sizeof(head), "%sContent-Type: application/json\r\n", cases[i].line);
        snprintf(body, sizeof(body), "{\"error\":\"%s\"}", cases[i].name);
        reply_error(b, cases[i].status, REPLY_KEEP, NULL, 0);
        expect_reply(b, head, "", body);
        reply_error(b, cases[i].status, REPLY_CLOSE, NULL, 0);
        expect_reply(b, head, "Connection: close\r\n", body);
        reply_error(b, cases[i].status, REPLY_KEEP_SAID, NULL, 0);
        expect_reply(b, head, "Connection: keep-alive\r\n", body);
    }
    evbuffer_free(b);
}

static void test_error_exact_bytes(void **state)
{
    struct evbuffer *b = evbuffer_new();
    reply_error(b, 404, REPLY_KEEP, "abc", 3);
    char *got = testlib_drain(b);
    assert_string_equal(got, "HTTP/1.1 404 Not Found\r\n"
                             "X-Request-Id: abc\r\n"
                             "Content-Type: application/json\r\n"
                             "Content-Length: 20\r\n"
                             "\r\n"
                             "{\"error\":\"no_route\"}");
    free(got);
    reply_error(b, 408, REPLY_CLOSE, "req-9 and more", 5);
    got = testlib_drain(b);
    assert_string_equal(got, "HTTP/1.1 408 Request Timeout\r\n"
                             "X-Request-Id: req-9\r\n"
                             "Content-Type: application/json\r\n"
                             "Content-Length: 27\r\n"
                             "Connection: close\r\n"
                             "\r\n"
                             "{\"error\":\"request_timeout\"}");
    free(got);
    /* Two replies in one buffer (pipelining) stay two whole replies. */
    reply_error(b, 400, REPLY_KEEP, NULL, 0);
    reply_error(b, 414, REPLY_KEEP, NULL, 0);
    got = testlib_drain(b);
    assert_string_equal(got, "HTTP/1.1 400 Bad Request\r\n"
                             "Content-Type: application/json\r\n"
                             "Content-Length: 23\r\n\r\n"
                             "{\"error\":\"bad_request\"}"
                             "HTTP/1.1 414 URI Too Long\r\n"
                             "Content-Type: application/json\r\n"
                             "Content-Length: 24\r\n\r\n"
                             "{\"error\":\"uri_too_long\"}");
    free(got);
    evbuffer_free(b);
}

static void test_error_named(void **state)
{
    static const char *const names[] = { "ambiguous_key", "bad_host", "regex_limit" };
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char body[64];
        snprintf(body, sizeof(body), "{\"error\":\"%s\"}", names[i]);
        reply_error_named(b, 400, names[i], REPLY_KEEP, "id", 2);
        expect_reply(b, "HTTP/1.1 400 Bad Request\r\nX-Request-Id: id\r\n"
                        "Content-Type: application/json\r\n", "", body);
    }
    /* NULL: the status's own name. */
    reply_error_named(b, 431, NULL, REPLY_CLOSE, NULL, 0);
    expect_reply(b, "HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    "Content-Type: application/json\r\n",
                 "Connection: close\r\n", "{\"error\":\"headers_too_large\"}");
    evbuffer_free(b);
}

static void test_unavailable(void **state)
{
    static const struct { int64_t ms; const char *secs; } cases[] = {
        { -5, "1" }, { 0, "1" }, { 1, "1" }, { 1000, "1" }, { 1001, "2" }, { 2500, "3" },
        { 30000, "30" },
    };
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char head[256];
        snprintf(head, sizeof(head), "HTTP/1.1 503 Service Unavailable\r\n"
                                     "Retry-After: %s\r\n"
                                     "Content-Type: application/json\r\n", cases[i].secs);
        reply_unavailable(b, cases[i].ms, REPLY_KEEP, NULL, 0);
        expect_reply(b, head, "", "{\"error\":\"limiter_unavailable\"}");
    }
    reply_unavailable(b, 0, REPLY_KEEP_SAID, "r1", 2);
    expect_reply(b, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                    "X-Request-Id: r1\r\nContent-Type: application/json\r\n",
                 "Connection: keep-alive\r\n", "{\"error\":\"limiter_unavailable\"}");
    evbuffer_free(b);
}

/* ---- reply_limit_headers: proxied responses and the upstream's fields --------- */

static char *headers_of(const struct reply_limits *rl, int denied, const struct reply_upstream *up)
{
    struct evbuffer *b = evbuffer_new();
    struct obuf ob;
    obuf_begin(&ob, b, 0);
    reply_limit_headers(&ob, rl, denied, up);
    obuf_end(&ob);
    char *s = testlib_drain(b);
    evbuffer_free(b);
    return s;
}

/* Allowed: reset is the time until the quota is whole, not clamped to 1. */
static void test_headers_allowed(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_FULL);
    fx_limit(&f, "per-ip", 10, 60000, 1, 7, 42001, 0);
    fx_limit(&f, "per-day", 1000, 86400000, 1, 500, 0, 0);
    reply_pick(&f.rl, 1);
    char *s = headers_of(&f.rl, 0, NULL);
    assert_string_equal(s, "X-RateLimit-Limit: 10\r\n"
                           "X-RateLimit-Remaining: 7\r\n"
                           "X-RateLimit-Reset: 43\r\n"
                           "RateLimit-Policy: \"per-ip\";q=10;w=60, \"per-day\";q=1000;w=86400\r\n"
                           "RateLimit: \"per-ip\";r=7;t=43\r\n");
    free(s);
    f.rl.r[0].reset_ms = 0;
    f.route.headers = CONF_HEADERS_IETF;
    s = headers_of(&f.rl, 0, NULL);
    assert_string_equal(s, "RateLimit-Policy: \"per-ip\";q=10;w=60, \"per-day\";q=1000;w=86400\r\n"
                           "RateLimit: \"per-ip\";r=7;t=0\r\n");
    free(s);
    f.route.headers = CONF_HEADERS_NONE;
    s = headers_of(&f.rl, 0, NULL);
    assert_string_equal(s, "");
    free(s);
}

/* The upstream's X-RateLimit-* replace sluice's only when it has all three
 * and shows strictly less remaining. */
static void test_headers_merge_legacy(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_LEGACY);
    fx_limit(&f, "per-ip", 10, 60000, 1, 7, 30000, 0);
    reply_pick(&f.rl, 1);
    struct reply_upstream up = { 1, 50, 2, 900, NULL, 0, NULL, 0 };
    char *s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "X-RateLimit-Limit: 50\r\n"
                           "X-RateLimit-Remaining: 2\r\n"
                           "X-RateLimit-Reset: 900\r\n");
    free(s);
    up.remaining = 7;       /* equal: sluice's */
    s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "X-RateLimit-Limit: 10\r\n"
                           "X-RateLimit-Remaining: 7\r\n"
                           "X-RateLimit-Reset: 30\r\n");
    free(s);
    up.remaining = 1;
    up.has_legacy = 0;      /* not all three numeric: sluice's */
    s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "X-RateLimit-Limit: 10\r\n"
                           "X-RateLimit-Remaining: 7\r\n"
                           "X-RateLimit-Reset: 30\r\n");
    free(s);
    /* legacy mode writes no RateLimit-Policy/RateLimit, even when the
     * upstream sent some (those pass through elsewhere). */
    up.policy = "\"up\";q=5;w=1";
    up.policy_len = strlen(up.policy);
    up.ratelimit = "\"up\";r=0;t=1";
    up.ratelimit_len = strlen(up.ratelimit);
    s = headers_of(&f.rl, 0, &up);
    assert_null(strstr(s, "RateLimit-Policy"));
    assert_null(strstr(s, "RateLimit:"));
    free(s);
}

/* The upstream's RateLimit-Policy and RateLimit items follow sluice's in
 * one field each (values are lengths, not NUL-terminated). */
static void test_headers_merge_ietf(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_FULL);
    fx_limit(&f, "per-ip", 10, 60000, 1, 7, 30000, 0);
    reply_pick(&f.rl, 1);
    const char *pol = "\"up\";q=5;w=1XXXX", *rl = "\"up\";r=0;t=1YYYY";
    struct reply_upstream up = { 1, 50, 9, 900, pol, 12, rl, 12 };
    char *s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "X-RateLimit-Limit: 10\r\n"
                           "X-RateLimit-Remaining: 7\r\n"
                           "X-RateLimit-Reset: 30\r\n"
                           "RateLimit-Policy: \"per-ip\";q=10;w=60, \"up\";q=5;w=1\r\n"
                           "RateLimit: \"per-ip\";r=7;t=30, \"up\";r=0;t=1\r\n");
    free(s);
    /* Only one of the two from the upstream. */
    up.policy = NULL;
    f.route.headers = CONF_HEADERS_IETF;
    s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "RateLimit-Policy: \"per-ip\";q=10;w=60\r\n"
                           "RateLimit: \"per-ip\";r=7;t=30, \"up\";r=0;t=1\r\n");
    free(s);
    up.policy = pol;
    up.ratelimit = NULL;
    s = headers_of(&f.rl, 0, &up);
    assert_string_equal(s, "RateLimit-Policy: \"per-ip\";q=10;w=60, \"up\";q=5;w=1\r\n"
                           "RateLimit: \"per-ip\";r=7;t=30\r\n");
    free(s);
}

/* Token bucket and gcra: the policy's window is the time to refill the
 * burst, rounded up to whole seconds. */
static void test_headers_bucket_window(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_IETF);
    fx_limit(&f, "tb", 20, 0, 1, 19, 50, 0);
    f.limits[0].params = (struct limiter_params){ LIMITER_TOKEN_BUCKET, 20, 2500, 125000 };
    reply_pick(&f.rl, 1);
    char *s = headers_of(&f.rl, 0, NULL);
    assert_string_equal(s, "RateLimit-Policy: \"tb\";q=20;w=3\r\n"
                           "RateLimit: \"tb\";r=19;t=1\r\n");
    free(s);
}

static void test_seconds(void **state)
{
    assert_int_equal(reply_seconds(INT64_MIN), 0);
    assert_int_equal(reply_seconds(-1), 0);
    assert_int_equal(reply_seconds(0), 0);
    assert_int_equal(reply_seconds(1), 1);
    assert_int_equal(reply_seconds(999), 1);
    assert_int_equal(reply_seconds(1000), 1);
    assert_int_equal(reply_seconds(1001), 2);
    assert_int_equal(reply_seconds(59500), 60);
    assert_int_equal(reply_seconds(60000), 60);
    assert_int_equal(reply_seconds(INT64_MAX / 2), (INT64_MAX / 2 + 999) / 1000);
}

/* ---- decision mode: the allowed 200 and a rejection's status ----------------- */

static void test_decision_allowed_and_deny_status(void **state)
{
    struct fixture f;
    fx_init(&f, "api", CONF_HEADERS_FULL);
    fx_limit(&f, "per-user", 10, 60000, 1, 7, 42000, 0);
    reply_pick(&f.rl, 1);
    struct evbuffer *b = evbuffer_new();
    reply_allowed(b, &f.rl, REPLY_KEEP, "rid-2", 5);
    char *got = testlib_drain(b);
    assert_string_equal(got, "HTTP/1.1 200 OK\r\n"
                        "X-RateLimit-Limit: 10\r\n"
                        "X-RateLimit-Remaining: 7\r\n"
                        "X-RateLimit-Reset: 42\r\n"
                        "RateLimit-Policy: \"per-user\";q=10;w=60\r\n"
                        "RateLimit: \"per-user\";r=7;t=42\r\n"
                        "X-Request-Id: rid-2\r\n"
                        "Content-Length: 0\r\n\r\n");
    free(got);
    reply_allowed(b, NULL, REPLY_CLOSE, NULL, 0);   /* a route without limits */
    got = testlib_drain(b);
    assert_string_equal(got, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    free(got);

    fx_readme(&f, CONF_HEADERS_IETF);
    reply_limited_as(b, &f.rl, 403, REPLY_KEEP, NULL, 0);
    expect_reply(b,
                 "HTTP/1.1 403 Forbidden\r\n"
                 "Retry-After: 15\r\n"
                 "RateLimit-Policy: \"per-ip\";q=10;w=60\r\n"
                 "RateLimit: \"per-ip\";r=0;t=15\r\n"
                 "Content-Type: application/json\r\n",
                 "", readme_body);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limited_full_readme),
        cmocka_unit_test(test_limited_ietf),
        cmocka_unit_test(test_limited_legacy),
        cmocka_unit_test(test_limited_none),
        cmocka_unit_test(test_limited_close_and_request_id),
        cmocka_unit_test(test_limited_custom_status_message),
        cmocka_unit_test(test_limited_retry_after_rounding),
        cmocka_unit_test(test_limited_several_limits),
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_limited_escaping),
        cmocka_unit_test(test_limited_large),
        cmocka_unit_test(test_error_statuses),
        cmocka_unit_test(test_error_exact_bytes),
        cmocka_unit_test(test_error_named),
        cmocka_unit_test(test_unavailable),
        cmocka_unit_test(test_headers_allowed),
        cmocka_unit_test(test_headers_merge_legacy),
        cmocka_unit_test(test_headers_merge_ietf),
        cmocka_unit_test(test_headers_bucket_window),
        cmocka_unit_test(test_seconds),
        cmocka_unit_test(test_decision_allowed_and_deny_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
