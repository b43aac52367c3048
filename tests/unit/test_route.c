/* sluice - test_route.c: unit tests for route.c.
 *
 * Tables of path normalisation, route matching, client address and key
 * cases, plus a bounded random sweep over normalisation. Request heads are
 * built by a small line splitter below into exactly sized heap buffers, so
 * ASan reports any read outside the spans. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <cmocka.h>
#include <openssl/evp.h>

#include "jwt.h"
#include "route.h"

#define SHA1_HEX_BYTES 41       /* 40 hex digits and a NUL */

/* conf_cidr_match (addr_cidr_match) comes from the real src/addr.c, linked into this binary:
 * the trusted-proxy cases below test both modules together. */

/* ---- request heads built by hand ---- */

struct head {
    char *buf;                  /* exactly len bytes, no NUL */
    size_t len;
    struct http1_head h;
};

static struct http1_span span_of(const char *base, const char *p, size_t n)
{
    struct http1_span s = { (uint32_t)(p - base), (uint32_t)n };
    return s;
}

/* "METHOD TARGET HTTP/1.1\r\nName: value\r\n...\r\n"; values kept with their
 * OWS so route.c's trimming is exercised. */
static void head_build_n(struct head *f, const char *text, size_t len)
{
    memset(f, 0, sizeof *f);
    f->buf = malloc(len);
    assert_non_null(f->buf);
    memcpy(f->buf, text, len);
    f->len = len;
    f->h.host = -1;
    const char *b = f->buf, *end = b + len;
    const char *sp1 = memchr(b, ' ', len);
    assert_non_null(sp1);
    const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
    assert_non_null(sp2);
    f->h.method = span_of(b, b, (size_t)(sp1 - b));
    f->h.target = span_of(b, sp1 + 1, (size_t)(sp2 - sp1 - 1));
    const char *line = memchr(sp2, '\n', (size_t)(end - sp2));
    assert_non_null(line);
    line++;
    while (line < end && *line != '\r') {
        const char *eol = memchr(line, '\r', (size_t)(end - line));
        assert_non_null(eol);
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        assert_non_null(colon);
        struct http1_header *hd = &f->h.h[f->h.nheaders];
        hd->name = span_of(b, line, (size_t)(colon - line));
        hd->value = span_of(b, colon + 1, (size_t)(eol - colon - 1));
        if (colon - line == 4 && strncasecmp(line, "host", 4) == 0)
            f->h.host = f->h.nheaders;
        f->h.nheaders++;
        line = eol + 2;
    }
    f->h.len = len;
}

static void head_build(struct head *f, const char *text)
{
    head_build_n(f, text, strlen(text));
}

static void head_free(struct head *f)
{
    free(f->buf);
}

/* ---- SHA-1, as long key parts carry it ---- */

/* Lower-case hex of data's SHA-1 (OpenSSL's), NUL-terminated. */
static void sha1_hex(const void *data, size_t len, char out[SHA1_HEX_BYTES])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    assert_int_equal(EVP_Digest(data, len, d, &n, EVP_sha1(), NULL), 1);
    assert_int_equal(n, 20);
    for (unsigned int i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* ---- normalisation ---- */

struct norm_case {
    const char *in;
    size_t inlen;               /* 0: strlen(in) */
    const char *out;            /* NULL: -1 expected */
    size_t outlen;              /* 0: strlen(out) */
};

static const struct norm_case norm_cases[] = {
    { "/api/login", 0, "/api/login", 0 },
    { "/api/%6Cogin", 0, "/api/login", 0 },
    { "/api/%6cogin", 0, "/api/login", 0 },
    { "/api%2Flogin", 0, "/api/login", 0 },
    { "/api%2flogin", 0, "/api/login", 0 },
    { "/api/./login", 0, "/api/login", 0 },
    { "//api//login", 0, "/api/login", 0 },
    { "/api/x/../login", 0, "/api/login", 0 },
    { "/../x", 0, NULL, 0 },
    { "/..", 0, NULL, 0 },
    { "/a/..", 0, "/", 0 },
    { "/%00", 0, NULL, 0 },
    { "/a%00b", 0, NULL, 0 },
    { "/", 0, "/", 0 },
    { "//", 0, "/", 0 },
    { "/.", 0, "/", 0 },
    { "/./", 0, "/", 0 },
    { "", 0, NULL, 0 },
    { "http://example.com/api", 0, NULL, 0 },
    { "*", 0, NULL, 0 },
    { "example.com:443", 0, NULL, 0 },
    { "api/login", 0, NULL, 0 },
    { "?x=1", 0, NULL, 0 },
    { "/a/b?x=1", 0, "/a/b", 0 },
    { "/?x", 0, "/", 0 },
    { "/a?%00", 0, "/a", 0 },                   /* the query is not decoded */
    { "/a?x=%zz", 0, "/a", 0 },
    { "/a?x=../../..", 0, "/a", 0 },
    { "/a#frag", 0, NULL, 0 },
    { "/a?b#c", 0, NULL, 0 },
    { "/a%2", 0, NULL, 0 },
    { "/a%", 0, NULL, 0 },
    { "/a%zz", 0, NULL, 0 },
    { "/a%g0", 0, NULL, 0 },
    { "/a%0g", 0, NULL, 0 },
    { "/a%%41", 0, NULL, 0 },
    { "/%2e%2e/x", 0, NULL, 0 },
    { "/%2E%2E", 0, NULL, 0 },
    { "/%2F%2E%2E%2F", 0, NULL, 0 },
    { "/a/%2e%2e/b", 0, "/b", 0 },
    { "/a/.%2e/b", 0, "/b", 0 },
    { "/a/%2e%2E", 0, "/", 0 },
    { "/a/%2E/b", 0, "/a/b", 0 },
    { "/%252F", 0, "/%2F", 0 },                 /* decoded once, never twice */
    { "/a%252e%252e/b", 0, "/a%2e%2e/b", 0 },
    { "/a/%252e%252e/b", 0, "/a/%2e%2e/b", 0 },
    { "/a%2f%2fb", 0, "/a/b", 0 },
    { "/%41%42%43", 0, "/ABC", 0 },
    { "/a%20b", 0, "/a b", 0 },
    { "/a/", 0, "/a/", 0 },
    { "/a//", 0, "/a/", 0 },
    { "/a/.", 0, "/a/", 0 },
    { "/a/b/..", 0, "/a/", 0 },
    { "/a/b/../..", 0, "/", 0 },
    { "/a/b/../../..", 0, NULL, 0 },
    { "/a/../../b", 0, NULL, 0 },
    { "/a/b/./../c/", 0, "/a/c/", 0 },
    { "/...", 0, "/...", 0 },
    { "/a/..b", 0, "/a/..b", 0 },
    { "/a/b..", 0, "/a/b..", 0 },
    { "/.a", 0, "/.a", 0 },
    { "/a\x01", 0, NULL, 0 },
    { "/a\x7f", 0, NULL, 0 },
    { "/a\t", 0, NULL, 0 },
    { "/a\r\n", 0, NULL, 0 },
    { "/a?b\x01", 0, NULL, 0 },
    { "/a\0b", 4, NULL, 0 },                    /* raw NUL in the target */
    { "/%ff%FE", 0, "/\xff\xfe", 0 },
    { "/a%0a", 0, "/a\n", 0 },                  /* only a decoded NUL is refused */
    { "/\xc3\xa9t\xc3\xa9", 0, "/\xc3\xa9t\xc3\xa9", 0 },
};

static void test_normalize_table(void **state)
{
    size_t ncases = sizeof norm_cases / sizeof norm_cases[0];
    assert_true(ncases >= 40);
    for (size_t i = 0; i < ncases; i++) {
        const struct norm_case *t = &norm_cases[i];
        size_t len = t->inlen ? t->inlen : strlen(t->in);
        /* exact-size copies: ASan catches any byte read or written past
         * len (out: len + 1 for the NUL) */
        char *in = malloc(len ? len : 1), *out = malloc(len + 1);
        assert_non_null(in);
        assert_non_null(out);
        memcpy(in, t->in, len);
        long n = route_normalize(in, len, out);
        if (t->out == NULL) {
            if (n != -1)
                fail_msg("case %zu '%s': expected -1, got %ld", i, t->in, n);
        } else {
            size_t want = t->outlen ? t->outlen : strlen(t->out);
            if (n != (long)want || memcmp(out, t->out, want) != 0)
                fail_msg("case %zu '%s': expected '%s', got %ld '%.*s'", i, t->in,
                         t->out, n, n > 0 ? (int)n : 0, out);
        }
        free(in);
        free(out);
    }
}

/* A normalised path has no empty, "." or ".." segment, starts with '/',
 * and contains no NUL. */
static void check_normal_form(const char *p, long n)
{
    assert_true(n >= 1);
    assert_int_equal(p[0], '/');
    assert_null(memchr(p, '\0', (size_t)n));
    for (long i = 0; i < n; i++) {
        if (p[i] != '/')
            continue;
        long j = i + 1;
        while (j < n && p[j] != '/')
            j++;
        long seg = j - i - 1;
        if (j < n)
            assert_true(seg > 0);       /* no "//" */
        assert_false(seg == 1 && p[i + 1] == '.');
        assert_false(seg == 2 && p[i + 1] == '.' && p[i + 2] == '.');
    }
}

/* Bounded random sweep over an alphabet rich in '/', '.', '%' and hex: the
 * result is -1 or in normal form, and never longer than the input. */
static void test_normalize_random(void **state)
{
    static const char alpha[] = "/./%2e2E2f2F00aAzZ?#\x01\x7f";
    uint32_t x = 12345;
    long ok = 0, bad = 0;
    for (int iter = 0; iter < 200000; iter++) {
        char in[32], out[33];
        x = x * 1103515245u + 12345u;
        size_t len = 1 + (x >> 16) % sizeof in;
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            in[i] = alpha[(x >> 16) % (sizeof alpha - 1)];
        }
        if (iter % 2 == 0)
            in[0] = '/';
        long n = route_normalize(in, len, out);
        if (n < 0) {
            bad++;
            continue;
        }
        ok++;
        assert_true((size_t)n <= len);
        check_normal_form(out, n);
    }
    /* both outcomes must have been seen, or the sweep proved nothing */
    assert_true(ok > 1000);
    assert_true(bad > 1000);
}

/* ---- matching ---- */

static char *m_post[] = { "POST" };
static char *m_getput[] = { "GET", "PUT" };

static struct conf_route match_routes[] = {
    { .name = "login", .path = "/api/login", .pathlen = 10,
      .methods = m_post, .nmethods = 1, .host = "api.example.com" },
    { .name = "first", .path = "/api/users", .pathlen = 10 },
    { .name = "second", .path = "/api/users", .pathlen = 10 },  /* never reached */
    { .name = "rw", .path = "/rw", .pathlen = 3, .methods = m_getput, .nmethods = 2 },
    { .name = "v6", .path = "/v6", .pathlen = 3, .host = "::1" },
    { .name = "v6b", .path = "/v6b", .pathlen = 4, .host = "[::1]" },
    { .name = "api", .path = "/api", .pathlen = 4 },
    { .name = "default", .path = "/", .pathlen = 1 },
};

static struct conf match_conf = {
    .routes = match_routes, .nroutes = sizeof match_routes / sizeof match_routes[0],
};

struct match_case {
    const char *path, *method, *host;   /* host NULL: no Host header */
    const char *route;                  /* expected name, NULL: no route */
};

static const struct match_case match_cases[] = {
    { "/api/login", "POST", "api.example.com", "login" },
    { "/api/login", "POST", "API.Example.COM", "login" },
    { "/api/login", "POST", "api.example.com:8080", "login" },
    { "/api/login", "POST", " api.example.com:443 ", "login" },
    { "/api/login/", "POST", "api.example.com", "login" },
    { "/api/login/x", "POST", "api.example.com", "login" },
    { "/api/loginx", "POST", "api.example.com", "api" },
    { "/api/login", "GET", "api.example.com", "api" },
    { "/api/login", "post", "api.example.com", "api" },         /* case-sensitive */
    { "/api/login", "POSTX", "api.example.com", "api" },
    { "/api/login", "POS", "api.example.com", "api" },
    { "/api/login", "POST", "other.example.com", "api" },
    { "/api/login", "POST", "api.example.com.evil", "api" },
    { "/api/login", "POST", "xapi.example.com", "api" },
    { "/api/login", "POST", NULL, "api" },
    { "/api/users", "GET", NULL, "first" },
    { "/api/users/7", "DELETE", NULL, "first" },
    { "/api", "GET", NULL, "api" },
    { "/api/", "GET", NULL, "api" },
    { "/apix", "GET", NULL, "default" },
    { "/ap", "GET", NULL, "default" },
    { "/", "GET", NULL, "default" },
    { "/rw", "GET", NULL, "rw" },
    { "/rw", "PUT", NULL, "rw" },
    { "/rw/x", "PUT", NULL, "rw" },
    { "/rw", "POST", NULL, "default" },
    { "/v6", "GET", "[::1]:8080", "v6" },
    { "/v6", "GET", "[::1]", "v6" },
    { "/v6", "GET", "[::2]:8080", "default" },
    { "/v6", "GET", "localhost", "default" },
    { "/v6b", "GET", "[::1]:80", "v6b" },
    { "/v6b", "GET", "[::1", "default" },                       /* malformed */
    /* a trailing dot names the same host (issue 9: it skipped the route) */
    { "/api/login", "POST", "api.example.com.", "login" },
    { "/api/login", "POST", "API.EXAMPLE.COM.:8443", "login" },
    { "/api/login", "POST", "api.example.com..", "api" },
};

static void test_match_table(void **state)
{
    for (size_t i = 0; i < sizeof match_cases / sizeof match_cases[0]; i++) {
        const struct match_case *t = &match_cases[i];
        const struct conf_route *r = route_match(&match_conf, t->path, strlen(t->path),
                                                 t->method, strlen(t->method), t->host,
                                                 t->host ? strlen(t->host) : 0, NULL);
        const char *got = r ? r->name : "(none)";
        if (strcmp(got, t->route ? t->route : "(none)") != 0)
            fail_msg("case %zu %s %s host=%s: expected %s, got %s", i, t->method, t->path,
                     t->host ? t->host : "-", t->route, got);
    }
}

static void test_match_none_and_order(void **state)
{
    struct conf_route routes[] = {
        { .name = "a", .path = "/a", .pathlen = 2 },
        { .name = "ab", .path = "/a/b", .pathlen = 4 },     /* shadowed by "a" */
    };
    struct conf c = { .routes = routes, .nroutes = 2 };
    assert_null(route_match(&c, "/b", 2, "GET", 3, NULL, 0, NULL));
    assert_null(route_match(&c, "/", 1, "GET", 3, NULL, 0, NULL));
    assert_null(route_match(&c, "/ab", 3, "GET", 3, NULL, 0, NULL));
    assert_string_equal(route_match(&c, "/a/b", 4, "GET", 3, NULL, 0, NULL)->name, "a");
    struct conf empty = { 0 };
    assert_null(route_match(&empty, "/", 1, "GET", 3, NULL, 0, NULL));
}

/* The path handed to route_match is the normalised one: every trick meets
 * the login rule. */
static void test_match_after_normalize(void **state)
{
    static const char *tricks[] = {
        "/api/login", "/api/%6Cogin", "/api%2Flogin", "/api/./login", "//api//login",
        "/api/x/../login", "/api/%2e/login", "/x/%2e%2e/api/login?y=1",
    };
    for (size_t i = 0; i < sizeof tricks / sizeof tricks[0]; i++) {
        char out[64];
        long n = route_normalize(tricks[i], strlen(tricks[i]), out);
        assert_true(n > 0);
        const struct conf_route *r = route_match(&match_conf, out, (size_t)n, "POST", 4,
                                                 "api.example.com", 15, NULL);
        assert_non_null(r);
        assert_string_equal(r->name, "login");
    }
}

/* ---- the paths section, Host ---- */

struct paths_case {
    const char *in;
    int fold, strip;
    const char *out;                    /* NULL: -1 (a 400) */
};

static const struct paths_case paths_cases[] = {
    /* defaults: as route_normalize */
    { "/API/Login;jsessionid=x", 0, 0, "/API/Login;jsessionid=x" },
    /* case: insensitive folds ASCII after decoding, nothing else */
    { "/API/Login", 1, 0, "/api/login" },
    { "/%41PI/%4c", 1, 0, "/api/l" },
    { "/\xc3\x89T\xc3\x89", 1, 0, "/\xc3\x89t\xc3\x89" },
    { "/A;B=C", 1, 0, "/a;b=c" },
    { "/A?Q=1", 1, 0, "/a" },
    /* matrix_params: strip, from a ';' as sent to the next '/' as sent */
    { "/api/login;jsessionid=x", 0, 1, "/api/login" },
    { "/api;v=1/login", 0, 1, "/api/login" },
    { "/api/login;", 0, 1, "/api/login" },
    { "/;x", 0, 1, "/" },
    { "/;x/a", 0, 1, "/a" },
    { "/a;x%2Fy", 0, 1, "/a" },                 /* as Tomcat: the raw ';' runs to a raw '/' */
    { "/a;%zz/b", 0, 1, "/a/b" },               /* the parameter is not decoded */
    { "/a;x?y;z", 0, 1, "/a" },
    /* ... and from a ';' decoding made to the next '/' */
    { "/api/login%3Bx", 0, 1, "/api/login" },
    { "/api/login%3bx%2Fy", 0, 1, "/api/login/y" },
    { "/a%3B%zz", 0, 1, NULL },                 /* escapes still checked */
    /* before dot segments: "..;" climbs as in Tomcat */
    { "/api/x/..;/login", 0, 1, "/api/login" },
    { "/api/x/.;v=1/login", 0, 1, "/api/x/login" },
    { "/..;/x", 0, 1, NULL },
    { "/api/x/..;/login", 0, 0, "/api/x/..;/login" },
    /* both */
    { "/API/Login;JSESSIONID=X", 1, 1, "/api/login" },
    { "/U/Bob;v/X;w", 1, 1, "/u/bob/x" },
};

static void test_normalize_paths_table(void **state)
{
    for (size_t i = 0; i < sizeof paths_cases / sizeof paths_cases[0]; i++) {
        const struct paths_case *t = &paths_cases[i];
        struct conf c = { .paths = { .case_insensitive = t->fold, .strip_matrix = t->strip } };
        size_t len = strlen(t->in);
        char *in = malloc(len), *out = malloc(len + 1);     /* exact sizes for ASan */
        assert_non_null(in);
        assert_non_null(out);
        memcpy(in, t->in, len);
        long n = route_normalize_paths(&c, in, len, out);
        if (t->out == NULL) {
            if (n != -1)
                fail_msg("case %zu '%s': expected -1, got %ld", i, t->in, n);
        } else if (n != (long)strlen(t->out) || memcmp(out, t->out, (size_t)n) != 0) {
            fail_msg("case %zu '%s': expected '%s', got %ld '%.*s'", i, t->in, t->out, n,
                     n > 0 ? (int)n : 0, out);
        }
        free(in);
        free(out);
    }
}

/* The random sweep with both options: normal form, never longer than the
 * input, no ';' left with strip, no upper-case ASCII with fold. */
static void test_normalize_paths_random(void **state)
{
    static const char alpha[] = "/./;%3bB2e2E2fF00aAzZ?";
    struct conf c = { .paths = { .case_insensitive = 1, .strip_matrix = 1 } };
    uint32_t x = 777;
    long ok = 0, bad = 0;
    for (int iter = 0; iter < 200000; iter++) {
        char in[32], out[33];
        x = x * 1103515245u + 12345u;
        size_t len = 1 + (x >> 16) % sizeof in;
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            in[i] = alpha[(x >> 16) % (sizeof alpha - 1)];
        }
        in[0] = '/';
        long n = route_normalize_paths(&c, in, len, out);
        if (n < 0) {
            bad++;
            continue;
        }
        ok++;
        assert_true((size_t)n <= len);
        check_normal_form(out, n);
        assert_null(memchr(out, ';', (size_t)n));
        for (long i = 0; i < n; i++)
            assert_false(out[i] >= 'A' && out[i] <= 'Z');
    }
    assert_true(ok > 1000);
    assert_true(bad > 1000);
}

static void test_host_check(void **state)
{
    static const char *good[] = {
        "", " ", "localhost", "api.example.com", "API.Example.COM", "api.example.com.",
        "api.example.com:8080", "api.example.com.:8080", "example.com:", "127.0.0.1",
        "127.0.0.1:80", "[::1]", "[::1]:8080", "[2001:db8::a.b]", "my_host.internal",
        "xn--bcher-kva.example", "a~b", " api.example.com\t", "x:65535", "x:99999",
    };
    static const char *bad[] = {
        "evil@api.example.com", "x:y@api.example.com", "@", "api.example.com x", "a b",
        "api.example.com/x", "api.example.com\\x", "api..example.com", ".", "..", ".a",
        "api.example.com,other", "a;b", "a%2e", "a?b", "a#b", "a\"b", "<a>", "a\x01",
        "a\x7f", "\xc3\xa9.example", "api.example.com:80:80", "api.example.com:8o",
        "x:123456", ":80", "::1", "[::1", "[]", "[::1]x", "[::1]:x", "[::g]", "[v1.x]",
        "[::1%25eth0]",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (route_host_check(good[i], strlen(good[i])) != 0)
            fail_msg("'%s' should be a host", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (route_host_check(bad[i], strlen(bad[i])) != -1)
            fail_msg("'%s' should be refused", bad[i]);
    /* spans, not strings: a NUL inside is a bad byte and nothing past len is read */
    assert_int_equal(route_host_check("a\0b", 3), -1);
    assert_int_equal(route_host_check("a.b@evil", 3), 0);
}

/* case: insensitive matches route paths written in any case; a route host
 * written with a trailing dot meets one sent without. */
static void test_match_paths_and_host_dot(void **state)
{
    struct conf_route routes[] = {
        { .name = "login", .path = "/API/Login", .pathlen = 10 },
        { .name = "dot", .path = "/d", .pathlen = 2, .host = "api.example.com." },
    };
    struct conf c = { .routes = routes, .nroutes = 2 };
    assert_null(route_match(&c, "/api/login", 10, "GET", 3, NULL, 0, NULL));
    c.paths.case_insensitive = 1;
    assert_string_equal(route_match(&c, "/api/login/x", 12, "GET", 3, NULL, 0, NULL)->name,
                        "login");
    assert_null(route_match(&c, "/api/loginx", 11, "GET", 3, NULL, 0, NULL));
    assert_string_equal(route_match(&c, "/d", 2, "GET", 3, "API.example.com", 15, NULL)->name,
                        "dot");
    assert_string_equal(route_match(&c, "/d", 2, "GET", 3, "api.example.com.:80", 19,
                                    NULL)->name, "dot");
    assert_null(route_match(&c, "/d", 2, "GET", 3, "api.example.co", 14, NULL));
}

/* ---- client address ---- */

static struct addr_cidr xff_trusted[] = {
    { .family = AF_INET, .addr = { 10 }, .bits = 8 },
    { .family = AF_INET, .addr = { 192, 168 }, .bits = 16 },
    { .family = AF_INET6, .addr = { 0xfd }, .bits = 8 },
};

static struct conf xff_conf = { .trusted = xff_trusted, .ntrusted = 3 };

static struct sockaddr_storage peer_of(const char *text)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, text, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons(40000);
    } else {
        assert_int_equal(inet_pton(AF_INET6, text, &s6->sin6_addr), 1);
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(40000);
    }
    return ss;
}

struct xff_case {
    const char *peer;
    const char *headers;        /* header lines, each ending in \r\n */
    const char *want;
};

static const struct xff_case xff_cases[] = {
    /* untrusted peers: XFF ignored */
    { "203.0.113.5", "", "203.0.113.5" },
    { "203.0.113.5", "X-Forwarded-For: 1.2.3.4\r\n", "203.0.113.5" },
    { "2001:db8::5", "X-Forwarded-For: 1.2.3.4\r\n", "2001:db8::5" },
    { "::ffff:203.0.113.9", "X-Forwarded-For: 1.2.3.4\r\n", "203.0.113.9" },
    /* trusted peer */
    { "10.0.0.1", "", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4\r\n", "1.2.3.4" },
    { "10.0.0.1", "x-FORWARDED-for:1.2.3.4\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: \t1.2.3.4 \t\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, 10.0.0.2, 192.168.1.1\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 5.5.5.5, 1.2.3.4, 10.0.0.2\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 5.5.5.5,1.2.3.4,10.0.0.2\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 5.5.5.5, 1.2.3.4\r\nX-Forwarded-For: 10.0.0.3\r\n",
      "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 1.1.1.1\r\nX-Other: 9.9.9.9\r\n"
      "X-Forwarded-For: 2.2.2.2\r\n", "2.2.2.2" },
    { "10.0.0.1", "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 10.0.0.3, 192.168.0.9\r\n",
      "6.6.6.6" },
    /* every entry trusted: the left-most */
    { "10.0.0.1", "X-Forwarded-For: 10.0.0.5, 10.0.0.6\r\n", "10.0.0.5" },
    { "10.0.0.1", "X-Forwarded-For: 10.0.0.5\r\nX-Forwarded-For: 192.168.3.3\r\n",
      "10.0.0.5" },
    /* garbage stops the walk: last trusted hop seen, else the peer */
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, garbage, 10.0.0.7\r\n", "10.0.0.7" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, garbage\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: unknown\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4,,10.0.0.7\r\n", "10.0.0.7" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, \r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For:\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4.5\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4:99999x\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4:\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4:123456\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: [1.2.3.4]:80\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: [2001:db8::1\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: [2001:db8::1]x\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4 5.6.7.8\r\n", "10.0.0.1" },
    { "10.0.0.1", "X-Forwarded-For: 1234567890123456789012345678901234567890"
      "1234567890123456789012345678901234567890\r\n", "10.0.0.1" },
    /* ports stripped, addresses canonicalised */
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4:5678\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: [2001:db8::1]:443\r\n", "2001:db8::1" },
    { "10.0.0.1", "X-Forwarded-For: [2001:DB8:0:0::1]\r\n", "2001:db8::1" },
    { "10.0.0.1", "X-Forwarded-For: 2001:0db8::0001\r\n", "2001:db8::1" },
    { "10.0.0.1", "X-Forwarded-For: ::ffff:1.2.3.4\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, [::ffff:10.0.0.9]:1\r\n", "1.2.3.4" },
    { "10.0.0.1", "X-Forwarded-For: 1.2.3.4, 10.0.0.9:8080\r\n", "1.2.3.4" },
    /* v6 and v4-mapped peers */
    { "fd00::1", "X-Forwarded-For: 1.2.3.4\r\n", "1.2.3.4" },
    { "fd00::1", "X-Forwarded-For: 2001:db8::7, fd12::1\r\n", "2001:db8::7" },
    { "fd00::1", "", "fd00::1" },
    { "::ffff:10.0.0.1", "X-Forwarded-For: 1.2.3.4\r\n", "1.2.3.4" },
    { "::ffff:10.0.0.1", "", "10.0.0.1" },
};

static void test_client_ip_table(void **state)
{
    for (size_t i = 0; i < sizeof xff_cases / sizeof xff_cases[0]; i++) {
        const struct xff_case *t = &xff_cases[i];
        char text[1024];
        snprintf(text, sizeof text, "GET / HTTP/1.1\r\nHost: a\r\n%s\r\n", t->headers);
        struct head f;
        head_build(&f, text);
        struct sockaddr_storage peer = peer_of(t->peer);
        char out[ROUTE_IP_MAX];
        memset(out, 'Z', sizeof out);
        size_t n = route_client_ip(&xff_conf, (struct sockaddr *)&peer, f.buf, &f.h, out);
        if (n != strlen(t->want) || strcmp(out, t->want) != 0)
            fail_msg("case %zu peer %s [%s]: expected %s, got %zu '%s'", i, t->peer,
                     t->headers, t->want, n, out);
        head_free(&f);
    }
}

static void test_client_ip_edges(void **state)
{
    char out[ROUTE_IP_MAX];
    struct head f;
    head_build(&f, "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n");

    /* no trusted proxies at all: always the peer */
    struct conf none = { 0 };
    struct sockaddr_storage p = peer_of("10.0.0.1");
    assert_int_equal(route_client_ip(&none, (struct sockaddr *)&p, f.buf, &f.h, out), 8);
    assert_string_equal(out, "10.0.0.1");

    /* no head (e.g. before parsing): the peer */
    assert_int_equal(route_client_ip(&xff_conf, (struct sockaddr *)&p, NULL, NULL, out), 8);
    assert_string_equal(out, "10.0.0.1");

    /* a unix socket peer has no address */
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    assert_int_equal(route_client_ip(&xff_conf, (struct sockaddr *)&un, f.buf, &f.h, out), 0);
    assert_string_equal(out, "");

    /* the longest IPv6 text fits */
    struct sockaddr_storage l = peer_of("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe");
    assert_int_equal(route_client_ip(&xff_conf, (struct sockaddr *)&l, f.buf, &f.h, out), 39);
    head_free(&f);

    /* a NUL inside an entry must not let "1.2.3.4" through inet_pton */
    static const char nul[] = "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\0x\r\n\r\n";
    head_build_n(&f, nul, sizeof nul - 1);
    route_client_ip(&xff_conf, (struct sockaddr *)&p, f.buf, &f.h, out);
    assert_string_equal(out, "10.0.0.1");
    head_free(&f);
}

/* ---- keys ---- */

static struct conf key_conf = { .redis = { .prefix = "sluice:" } };
static struct conf_route key_route = { .name = "r", .path = "/", .pathlen = 1 };

/* Key for one request (head text) and the limit's sources; *n gets route_key's
 * return. The key is returned NUL-terminated in a static buffer. */
static const char *key_of(const char *text, size_t textlen, const struct conf_keysrc *ks,
                          int nks, long *n)
{
    static char key[ROUTE_MAX_KEY];
    struct conf_limit l = { .name = "l", .keys = (struct conf_keysrc *)ks, .nkeys = nks };
    struct head f;
    head_build_n(&f, text, textlen ? textlen : strlen(text));
    char path[256];
    long pl = route_normalize(f.buf + f.h.target.off, f.h.target.len, path);
    assert_true(pl > 0);
    char *out = malloc(ROUTE_MAX_KEY);      /* exact size for ASan */
    assert_non_null(out);
    struct route_req req = {
        .buf = f.buf, .h = &f.h, .ip = "192.0.2.1", .iplen = 9,
        .path = path, .pathlen = (size_t)pl,
    };
    *n = route_key(&key_conf, &key_route, &l, &req, out);
    memset(key, 0, sizeof key);
    if (*n > 0)
        memcpy(key, out, (size_t)*n);
    free(out);
    head_free(&f);
    return key;
}

#define KS(kind, arg) { kind, arg, sizeof(arg) - 1 }

struct key_case {
    const char *head;
    struct conf_keysrc ks[3];
    int nks;
    const char *want;           /* NULL: 0 expected (source absent); AMBIG */
};

/* want for a source given twice: route_key returns ROUTE_KEY_AMBIGUOUS. */
static const char key_ambiguous[] = "(ambiguous)";
#define AMBIG key_ambiguous

static const struct key_case key_cases[] = {
    { "GET /a HTTP/1.1\r\n\r\n", { { CONF_KEY_IP, NULL, 0 } }, 1, "sluice:{r|l|9:192.0.2.1}" },
    { "PATCH /a HTTP/1.1\r\n\r\n", { { CONF_KEY_METHOD, NULL, 0 } }, 1, "sluice:{r|l|5:PATCH}" },
    { "GET /a/./b/%63?x=1 HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1,
      "sluice:{r|l|6:/a/b/c}" },
    /* a path key without trailing '/' and whitespace, as a prefix route meets it */
    { "GET /a/b/ HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1, "sluice:{r|l|4:/a/b}" },
    { "GET /a/b%20 HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1,
      "sluice:{r|l|4:/a/b}" },
    { "GET /a/b/%20/%09%0A HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1,
      "sluice:{r|l|4:/a/b}" },
    { "GET /a%20b HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1,
      "sluice:{r|l|4:/a b}" },
    { "GET /%20 HTTP/1.1\r\n\r\n", { { CONF_KEY_PATH, NULL, 0 } }, 1, "sluice:{r|l|1:/}" },
    { "GET /a HTTP/1.1\r\n\r\n", { { CONF_KEY_IP, NULL, 0 }, { CONF_KEY_METHOD, NULL, 0 } },
      2, "sluice:{r|l|9:192.0.2.13:GET}" },
    { "GET /a HTTP/1.1\r\n\r\n", { { 0 } }, 0, "sluice:{r|l|}" },
    /* header */
    { "GET / HTTP/1.1\r\nX-Api-Key: abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1,
      "sluice:{r|l|3:abc}" },
    { "GET / HTTP/1.1\r\nx-api-KEY:abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1,
      "sluice:{r|l|3:abc}" },
    { "GET / HTTP/1.1\r\nX-Api-Key:  \t a b \t\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") },
      1, "sluice:{r|l|3:a b}" },
    { "GET / HTTP/1.1\r\nA: x\r\nB: 1\r\na: y \r\n\r\n", { KS(CONF_KEY_HEADER, "A") }, 1,
      AMBIG },
    { "GET / HTTP/1.1\r\nA:\r\n\r\n", { KS(CONF_KEY_HEADER, "A") }, 1, "sluice:{r|l|0:}" },
    { "GET / HTTP/1.1\r\nA: \r\nA: \r\n\r\n", { KS(CONF_KEY_HEADER, "A") }, 1, AMBIG },
    /* '-' and '_' are one for a key header (WSGI, Rack, CGI read them so) */
    { "GET / HTTP/1.1\r\nX_Api_Key: abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1,
      "sluice:{r|l|3:abc}" },
    { "GET / HTTP/1.1\r\nx-api_KEY: abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1,
      "sluice:{r|l|3:abc}" },
    { "GET / HTTP/1.1\r\nX-Api-Key: abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X_Api_Key") }, 1,
      "sluice:{r|l|3:abc}" },
    { "GET / HTTP/1.1\r\nX-Api-Key: r1\r\nX_Api_Key: abc\r\n\r\n",
      { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1, AMBIG },
    { "GET / HTTP/1.1\r\nX-Api-Key: k\r\nX-Api-Key: k\r\n\r\n",
      { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1, AMBIG },      /* even the same value */
    { "GET / HTTP/1.1\r\nX.Api.Key: abc\r\nXApiKey: abc\r\n\r\n",
      { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1, NULL },
    /* a doubled source is refused wherever it stands, even after an absent one */
    { "GET / HTTP/1.1\r\nB: 1\r\nB: 2\r\n\r\n",
      { KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_HEADER, "B") }, 2, AMBIG },
    { "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n",
      { KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_HEADER, "B") }, 2, "sluice:{r|l|1:11:2}" },
    { "GET / HTTP/1.1\r\nX-Api-Keys: abc\r\n\r\n", { KS(CONF_KEY_HEADER, "X-Api-Key") }, 1,
      NULL },
    { "GET / HTTP/1.1\r\n\r\n", { { CONF_KEY_IP, NULL, 0 }, KS(CONF_KEY_HEADER, "A") }, 2,
      NULL },
    { "GET / HTTP/1.1\r\nA: }{|\r\n\r\n", { KS(CONF_KEY_HEADER, "A") }, 1,
      "sluice:{r|l|3:}{|}" },
    /* query */
    { "GET /p?x=1&id=42&id=43 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, AMBIG },
    { "GET /p?id=42&i%64=42 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, AMBIG },
    { "GET /p?id&id= HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, AMBIG },
    { "GET /p?x=1&id=42&idx=43 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1,
      "sluice:{r|l|2:42}" },
    { "GET /p?i%64=4%32 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1,
      "sluice:{r|l|2:42}" },
    { "GET /p?q=a+b%20c HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "q") }, 1,
      "sluice:{r|l|5:a b c}" },
    { "GET /p?my+key=v HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "my key") }, 1,
      "sluice:{r|l|1:v}" },
    { "GET /p?&&id=7& HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1,
      "sluice:{r|l|1:7}" },
    { "GET /p?id HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, "sluice:{r|l|0:}" },
    { "GET /p?id= HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, "sluice:{r|l|0:}" },
    { "GET /p?id=a=b HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, "sluice:{r|l|3:a=b}" },
    { "GET /p?id=%zz%4 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1,
      "sluice:{r|l|5:%zz%4}" },
    { "GET /p?ID=1 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    { "GET /p?idx=1&xid=2 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    { "GET /p?i HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    { "GET /p HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    { "GET /p? HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    { "GET /id=1 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "id") }, 1, NULL },
    /* names as PHP reads them; ';' splits pairs as Rack 2 and old Go and Python do */
    { "GET /p?api.key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api+key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api%20key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api[key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?+%20api_key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api_key%00x=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?x=1;api_key=K;y=2 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?a[b.c=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "a_b_c") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api_key=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api.key") }, 1,
      "sluice:{r|l|1:K}" },
    { "GET /p?api_key=1&api.key=2 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      AMBIG },
    { "GET /p?api_key=1;api_key=2 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1,
      AMBIG },
    /* an array of another name, and names that stay other names */
    { "GET /p?api[key]=K&api_key[]=J&apikey=1&api__key=2 HTTP/1.1\r\n\r\n",
      { KS(CONF_KEY_QUERY, "api_key") }, 1, NULL },
    { "GET /p?api_key%2Ex=K HTTP/1.1\r\n\r\n", { KS(CONF_KEY_QUERY, "api_key") }, 1, NULL },
    /* cookie */
    { "GET / HTTP/1.1\r\nCookie: a=1; sid=xyz; sid=2\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") },
      1, AMBIG },
    { "GET / HTTP/1.1\r\nCookie: sid=xyz\r\nCookie: a=1; sid=xyz\r\n\r\n",
      { KS(CONF_KEY_COOKIE, "sid") }, 1, AMBIG },
    { "GET / HTTP/1.1\r\nCookie: sid=xyz; sidx=1; SID=2\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") },
      1, "sluice:{r|l|3:xyz}" },
    /* quoted and percent-encoded values key as their plain form; '+' stays */
    { "GET / HTTP/1.1\r\nCookie: sid=%78%79z\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|3:xyz}" },
    { "GET / HTTP/1.1\r\nCookie: sid=\"%78yz\"\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|3:xyz}" },
    { "GET / HTTP/1.1\r\nCookie: sid=a+b%2Bc%zz%4\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|10:a+b+c%zz%4}" },
    { "GET / HTTP/1.1\r\nCookie: sid=\"\"\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|0:}" },
    { "GET / HTTP/1.1\r\nCookie: sid=\"\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|1:\"}" },
    { "GET / HTTP/1.1\r\nCookie: sid=\"\"x\"\"\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|3:\"x\"}" },                        /* one pair only */
    { "GET / HTTP/1.1\r\nCookie: sid=%22x%22\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|3:\"x\"}" },                        /* quotes, then decoding */
    { "GET / HTTP/1.1\r\nCookie: a=1\r\ncookie: sid=q\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") },
      1, "sluice:{r|l|1:q}" },
    { "GET / HTTP/1.1\r\nCookie:sid=\"v\";a=1\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|1:v}" },
    { "GET / HTTP/1.1\r\nCookie: sid=\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|0:}" },
    { "GET / HTTP/1.1\r\nCookie: sid=a=b\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|3:a=b}" },
    { "GET / HTTP/1.1\r\nCookie: SID=1; sidx=2; xsid=3; sid\r\n\r\n",
      { KS(CONF_KEY_COOKIE, "sid") }, 1, NULL },
    { "GET / HTTP/1.1\r\nX-Cookie: sid=1\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1, NULL },
    { "GET / HTTP/1.1\r\nCookie: ;;; \r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1, NULL },
    { "GET /?sid=1 HTTP/1.1\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1, NULL },
    /* names decoded (PHP, Rack); ',' splits as ';' (RFC 2109, Rack 2) */
    { "GET / HTTP/1.1\r\nCookie: %73id=q\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|1:q}" },
    { "GET / HTTP/1.1\r\nCookie: x=1, sid=q\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|1:q}" },
    { "GET / HTTP/1.1\r\nCookie: sid=q,x=1\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      "sluice:{r|l|1:q}" },
    { "GET / HTTP/1.1\r\nCookie: s.id=q\r\n\r\n", { KS(CONF_KEY_COOKIE, "s_id") }, 1,
      "sluice:{r|l|1:q}" },
    { "GET / HTTP/1.1\r\nCookie: sid=1, %73id=2\r\n\r\n", { KS(CONF_KEY_COOKIE, "sid") }, 1,
      AMBIG },
};

static void test_key_table(void **state)
{
    for (size_t i = 0; i < sizeof key_cases / sizeof key_cases[0]; i++) {
        const struct key_case *t = &key_cases[i];
        long n;
        const char *k = key_of(t->head, 0, t->ks, t->nks, &n);
        if (t->want == NULL) {
            if (n != 0)
                fail_msg("case %zu: expected 0, got %ld '%s'", i, n, k);
        } else if (t->want == AMBIG) {
            if (n != ROUTE_KEY_AMBIGUOUS)
                fail_msg("case %zu: expected ambiguous, got %ld '%s'", i, n, k);
        } else if (n != (long)strlen(t->want) || strcmp(k, t->want) != 0) {
            fail_msg("case %zu: expected '%s', got %ld '%s'", i, t->want, n, k);
        }
    }
}

/* A decoded NUL in a query value is just a byte of the part. */
/* ip/N keys: every address of one network makes the same key. */
static void test_key_ip_prefix(void **state)
{
    static const struct { const char *ip; int b4, b6; const char *want; } t[] = {
        { "192.0.2.1", 24, 64, "sluice:{r|l|12:192.0.2.0/24}" },
        { "192.0.2.254", 24, 64, "sluice:{r|l|12:192.0.2.0/24}" },
        { "192.0.3.1", 24, 64, "sluice:{r|l|12:192.0.3.0/24}" },
        { "2001:db8:1:2::5", 24, 64, "sluice:{r|l|17:2001:db8:1:2::/64}" },
        { "2001:db8:1:2:ffff::9", 24, 64, "sluice:{r|l|17:2001:db8:1:2::/64}" },
        { "2001:db8:1:3::5", 24, 64, "sluice:{r|l|17:2001:db8:1:3::/64}" },
        { "2001:db8:1:2::5", 32, 128, "sluice:{r|l|15:2001:db8:1:2::5}" },
        { "192.0.2.1", 32, 128, "sluice:{r|l|9:192.0.2.1}" },
        { "192.0.2.1", 0, 0, "sluice:{r|l|9:0.0.0.0/0}" },
        { "2001:db8::1", 0, 0, "sluice:{r|l|4:::/0}" },
    };
    char out[ROUTE_MAX_KEY];
    struct head f;
    head_build(&f, "GET / HTTP/1.1\r\n\r\n");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct conf_keysrc ks = { .kind = CONF_KEY_IP, .net = 1, .bits4 = t[i].b4,
                                  .bits6 = t[i].b6 };
        struct conf_limit l = { .name = "l", .keys = &ks, .nkeys = 1 };
        struct route_req req = { .buf = f.buf, .h = &f.h, .ip = t[i].ip,
                                 .iplen = strlen(t[i].ip), .path = "/", .pathlen = 1 };
        long n = route_key(&key_conf, &key_route, &l, &req, out);
        if (n != (long)strlen(t[i].want) || strcmp(out, t[i].want) != 0)
            fail_msg("%s /%d /%d: expected '%s', got %ld '%s'", t[i].ip, t[i].b4, t[i].b6,
                     t[i].want, n, n > 0 ? out : "");
    }
    head_free(&f);
}

static void test_key_binary_query(void **state)
{
    struct conf_keysrc ks[] = { KS(CONF_KEY_QUERY, "id") };
    long n;
    const char *k = key_of("GET /p?id=a%00b HTTP/1.1\r\n\r\n", 0, ks, 1, &n);
    assert_int_equal(n, 18);
    assert_memory_equal(k, "sluice:{r|l|3:a\0b}", 18);
}

/* Client bytes cannot move the boundaries between parts. */
static void test_key_no_collision(void **state)
{
    struct conf_keysrc ks[] = { KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_HEADER, "B") };
    long n1, n2;
    char k1[ROUTE_MAX_KEY];
    strcpy(k1, key_of("GET / HTTP/1.1\r\nA: ab\r\nB: c\r\n\r\n", 0, ks, 2, &n1));
    const char *k2 = key_of("GET / HTTP/1.1\r\nA: a\r\nB: bc\r\n\r\n", 0, ks, 2, &n2);
    assert_true(n1 > 0 && n2 > 0);
    assert_string_equal(k1, "sluice:{r|l|2:ab1:c}");
    assert_string_equal(k2, "sluice:{r|l|1:a2:bc}");
    assert_string_not_equal(k1, k2);

    /* a value shaped like an encoding does not pose as two parts */
    const char *k3 = key_of("GET / HTTP/1.1\r\nA: 1:a1:b\r\nB: c\r\n\r\n", 0, ks, 2, &n1);
    assert_string_equal(k3, "sluice:{r|l|6:1:a1:b1:c}");
}

static void test_key_long_parts(void **state)
{
    struct conf_keysrc ks[] = { KS(CONF_KEY_HEADER, "A") };
    char text[2048], want[512];
    long n;

    /* 300 bytes: hashed (SHA-1 of 300 'x' from Python's hashlib) */
    snprintf(text, sizeof text, "GET / HTTP/1.1\r\nA: %0300d\r\n\r\n", 0);
    memset(strstr(text, "A: ") + 3, 'x', 300);
    assert_string_equal(key_of(text, 0, ks, 1, &n),
                        "sluice:{r|l|41:#02fd68253071f895718c8d41f7ff665abe1a6290}");
    assert_int_equal(n, 57);

    /* exactly ROUTE_MAX_PART bytes: kept as is */
    snprintf(text, sizeof text, "GET / HTTP/1.1\r\nA: %0256d\r\n\r\n", 0);
    const char *k = key_of(text, 0, ks, 1, &n);
    assert_int_equal(n, (long)strlen("sluice:{r|l|256:}") + 256);
    assert_memory_equal(k, "sluice:{r|l|256:0000", 20);

    /* one more: hashed */
    snprintf(text, sizeof text, "GET / HTTP/1.1\r\nA: %0257d\r\n\r\n", 0);
    k = key_of(text, 0, ks, 1, &n);
    assert_int_equal(n, 57);
    assert_memory_equal(k, "sluice:{r|l|41:#", 16);

    /* a long cookie value is hashed after unquoting and decoding */
    struct conf_keysrc cs[] = { KS(CONF_KEY_COOKIE, "s") };
    char plain[300];
    char hex[SHA1_HEX_BYTES];
    memset(plain, 'y', sizeof plain);
    sha1_hex(plain, sizeof plain, hex);
    snprintf(want, sizeof want, "sluice:{r|l|41:#%s}", hex);
    strcpy(text, "GET / HTTP/1.1\r\nCookie: s=\"");
    for (int i = 0; i < 300; i++)
        strcat(text, i % 2 ? "y" : "%79");
    strcat(text, "\"\r\n\r\n");
    assert_string_equal(key_of(text, 0, cs, 1, &n), want);

    /* a long query value is hashed after decoding */
    struct conf_keysrc qs[] = { KS(CONF_KEY_QUERY, "q") };
    char dec[300];
    memset(dec, ' ', sizeof dec);
    sha1_hex(dec, sizeof dec, hex);
    snprintf(want, sizeof want, "sluice:{r|l|41:#%s}", hex);
    strcpy(text, "GET /?q=");
    for (int i = 0; i < 300; i++)
        strcat(text, i % 2 ? "+" : "%20");
    strcat(text, " HTTP/1.1\r\n\r\n");
    assert_string_equal(key_of(text, 0, qs, 1, &n), want);

    /* a 41-byte value that looks like a digest is hashed, never taken as one */
    snprintf(text, sizeof text, "GET / HTTP/1.1\r\nA: #02fd68253071f895718c8d41f7ff665abe1a6290"
             "\r\n\r\n");
    k = key_of(text, 0, ks, 1, &n);
    sha1_hex("#02fd68253071f895718c8d41f7ff665abe1a6290", 41, hex);
    snprintf(want, sizeof want, "sluice:{r|l|41:#%s}", hex);
    assert_string_equal(k, want);
    /* and the digest is SHA-1 (Python's hashlib gave this one) */
    assert_string_equal(k, "sluice:{r|l|41:#205f943d2608a9c59ac2198696ef73bc15856af3}");
}

static void test_key_too_long(void **state)
{
    static char prefix[ROUTE_MAX_KEY + 8];
    struct conf_keysrc ks[] = { { CONF_KEY_IP, NULL, 0 } };
    const char *fixed = "{r|l|9:192.0.2.1}";
    long n;

    /* the longest key that fits: ROUTE_MAX_KEY - 1 bytes and a NUL */
    size_t plen = ROUTE_MAX_KEY - 1 - strlen(fixed);
    memset(prefix, 'p', plen);
    prefix[plen] = '\0';
    key_conf.redis.prefix = prefix;
    key_of("GET / HTTP/1.1\r\n\r\n", 0, ks, 1, &n);
    assert_int_equal(n, ROUTE_MAX_KEY - 1);

    prefix[plen] = 'p';
    prefix[plen + 1] = '\0';
    key_of("GET / HTTP/1.1\r\n\r\n", 0, ks, 1, &n);
    assert_int_equal(n, -1);

    /* three long parts, each hashed to 44 bytes: 5 + 3 * 44 + 1 around the
     * prefix; 3957 bytes of prefix fill the key exactly, 3958 do not fit */
    struct conf_keysrc many[] = { KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_HEADER, "A"),
                                  KS(CONF_KEY_HEADER, "A") };
    char text[1024];
    snprintf(text, sizeof text, "GET / HTTP/1.1\r\nA: %0400d\r\n\r\n", 7);
    memset(prefix, 'p', 3957);
    prefix[3957] = '\0';
    key_of(text, 0, many, 3, &n);
    assert_int_equal(n, ROUTE_MAX_KEY - 1);
    prefix[3957] = 'p';
    prefix[3958] = '\0';
    key_of(text, 0, many, 3, &n);
    assert_int_equal(n, -1);
    key_conf.redis.prefix = "sluice:";
}

/* capture:1 of a path whose group is the whole path after "/u/": a number
 * keys as its value, a control byte elsewhere is refused. */
static long capture_key(const char *path, char *out)
{
    struct conf_keysrc ks[] = { { CONF_KEY_CAPTURE, NULL, 0, 1 } };
    struct conf_limit l = { .name = "l", .keys = ks, .nkeys = 1 };
    struct http1_head h = { 0 };
    struct route_captures caps = { .n = 2, .set = 3, .off = { 0, 3 },
                                   .len = { strlen(path), strlen(path) - 3 } };
    struct route_req req = { .buf = "", .h = &h, .ip = "192.0.2.1", .iplen = 9,
                             .path = path, .pathlen = strlen(path), .caps = &caps };
    return route_key(&key_conf, &key_route, &l, &req, out);
}

static void test_key_capture_numbers(void **state)
{
    static const struct { const char *path, *want; } cases[] = {
        { "/u/7", "sluice:{r|l|1:7}" },
        { "/u/7\n", "sluice:{r|l|1:7}" },
        { "/u/ 7 ", "sluice:{r|l|1:7}" },
        { "/u/\xef\xbc\x97", "sluice:{r|l|1:7}" },            /* U+FF17 */
        { "/u/\xd9\xa7", "sluice:{r|l|1:7}" },                /* U+0667 */
        { "/u/007", "sluice:{r|l|1:7}" },
        { "/u/+7", "sluice:{r|l|1:7}" },
        { "/u/\xe3\x80\x80" "7\xc2\xa0", "sluice:{r|l|1:7}" },   /* U+3000, U+00A0 */
        { "/u/1_000", "sluice:{r|l|4:1000}" },
        { "/u/-7", "sluice:{r|l|2:-7}" },
        { "/u/-0", "sluice:{r|l|1:0}" },
        { "/u/000", "sluice:{r|l|1:0}" },
        { "/u/\xef\xbc\x91\xef\xbc\x90", "sluice:{r|l|2:10}" },
        /* not numbers: their bytes */
        { "/u/7a", "sluice:{r|l|2:7a}" },
        { "/u/1__0", "sluice:{r|l|4:1__0}" },
        { "/u/_1", "sluice:{r|l|2:_1}" },
        { "/u/1_", "sluice:{r|l|2:1_}" },
        { "/u/+", "sluice:{r|l|1:+}" },
        { "/u/7 7", "sluice:{r|l|3:7 7}" },
        { "/u/", "sluice:{r|l|0:}" },
        { "/u/\xef\xbc", "sluice:{r|l|2:\xef\xbc}" },
        { "/u/ali\xc3\xa7" "e", "sluice:{r|l|6:ali\xc3\xa7" "e}" },
    };
    char out[ROUTE_MAX_KEY];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long n = capture_key(cases[i].path, out);
        if (n != (long)strlen(cases[i].want) || strcmp(out, cases[i].want) != 0)
            fail_msg("case %zu: expected '%s', got %ld '%s'", i, cases[i].want, n,
                     n > 0 ? out : "");
    }
    static const char *const refused[] = { "/u/7\nx", "/u/a\tb", "/u/\x7f", "/u/x\n",
                                           "/u/\x1c" "7" };    /* int() refuses U+001C */
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        assert_int_equal(capture_key(refused[i], out), ROUTE_KEY_BAD);

    /* an override or the admin API names the key in any of these spellings */
    struct conf_keysrc ks[] = { { CONF_KEY_CAPTURE, NULL, 0, 1 }, { CONF_KEY_PATH, NULL, 0 } };
    struct conf_limit l = { .name = "l", .keys = ks, .nkeys = 2 };
    const char *parts[] = { "+007", "/a/b/ " };
    size_t lens[] = { 4, 6 };
    assert_int_equal(route_key_parts(&key_conf, &key_route, &l, parts, lens, 2, out), 22);
    assert_string_equal(out, "sluice:{r|l|1:74:/a/b}");
}

/* An absent source under on_missing_key: ip: the address, after "!ip|". */
static void test_key_fallback(void **state)
{
    struct conf_limit l = { .name = "l" };
    struct http1_head h = { 0 };
    struct route_req req = { .buf = "", .h = &h, .ip = "192.0.2.1", .iplen = 9 };
    char out[ROUTE_MAX_KEY];
    long n = route_key_fallback(&key_conf, &key_route, &l, &req, out);
    assert_string_equal(out, "sluice:{r|l|!ip|9:192.0.2.1}");
    assert_int_equal(n, (long)strlen(out));
}

/* Prefix first, then the hash tag around everything that varies. */
static void test_key_shape(void **state)
{
    struct conf c = { .redis = { .prefix = "app1:" } };
    struct conf_route r = { .name = "login" };
    struct conf_keysrc ks[] = { { CONF_KEY_IP, NULL, 0 } };
    struct conf_limit l = { .name = "per-ip", .keys = ks, .nkeys = 1 };
    struct http1_head h = { 0 };
    struct route_req req = { .buf = "", .h = &h, .ip = "2001:db8::1", .iplen = 11,
                             .path = "/", .pathlen = 1 };
    char out[ROUTE_MAX_KEY];
    long n = route_key(&c, &r, &l, &req, out);
    assert_string_equal(out, "app1:{login|per-ip|11:2001:db8::1}");
    assert_int_equal(n, (long)strlen(out));

    c.redis.prefix = NULL;              /* no prefix configured */
    n = route_key(&c, &r, &l, &req, out);
    assert_string_equal(out, "{login|per-ip|11:2001:db8::1}");

    req.ip = NULL;                      /* no client address: not counted */
    assert_int_equal(route_key(&c, &r, &l, &req, out), 0);
}

/* gRPC calls: what makes one (Content-Type), grpc-timeout in ms, the
 * service and method key parts of a /package.Service/Method path, and a
 * match.grpc route taking calls only. */
static void test_grpc(void **state)
{
    static const struct { const char *ct, *timeout; int call; int64_t ms; } cases[] = {
        { "application/grpc", "1S", 1, 1000 }, { "application/grpc+proto", "250m", 1, 250 },
        { "Application/GRPC;x=1", "2M", 1, 120000 }, { "application/grpc", "1500u", 1, 2 },
        { "application/grpc", "1n", 1, 1 }, { "application/grpc", "123456789S", 1, 0 },
        { "application/grpc", "5s", 1, 0 }, { "application/grpc", "S", 1, 0 },
        { "application/grpc", "1H", 1, 3600000 }, { "application/grpc-web", "1S", 0, 0 },
        { "application/json", "1S", 0, 0 }, { "application/grp", "1S", 0, 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char req[256];
        int n = snprintf(req, sizeof req, "POST /a.B/C HTTP/1.1\r\nHost: h\r\nContent-Type: %s\r\n"
                         "grpc-timeout: %s\r\nContent-Length: 0\r\n\r\n", cases[i].ct,
                         cases[i].timeout);
        struct http1 *p = http1_create(HTTP1_REQUEST);
        struct http1_head h;
        assert_int_equal(http1_head_parse(p, req, (size_t)n, 16384, 0, &h), 0);
        int64_t ms = -1;
        assert_int_equal(route_grpc_call(req, &h, &ms), cases[i].call);
        assert_int_equal(ms, cases[i].ms);
        http1_destroy(p);
    }

    struct conf_keysrc ks[] = { { CONF_KEY_GRPC_SERVICE, NULL, 0 },
                                { CONF_KEY_GRPC_METHOD, NULL, 0 } };
    struct conf_limit l = { .name = "m", .keys = ks, .nkeys = 2 };
    struct http1_head h = { 0 };
    struct route_req req = { .buf = "", .h = &h, .ip = "192.0.2.1", .iplen = 9,
                             .path = "/pkg.v1.Echo/Say", .pathlen = 16 };
    char out[ROUTE_MAX_KEY];
    long n = route_key(&key_conf, &key_route, &l, &req, out);
    assert_string_equal(out, "sluice:{r|m|11:pkg.v1.Echo3:Say}");
    assert_int_equal(n, (long)strlen(out));
    static const char *const not_calls[] = { "/", "/x", "/x/", "//y", "/x/y/z" };
    for (size_t i = 0; i < sizeof(not_calls) / sizeof(not_calls[0]); i++) {
        req.path = not_calls[i];
        req.pathlen = strlen(not_calls[i]);
        assert_int_equal(route_key(&key_conf, &key_route, &l, &req, out), 0);
    }

    struct conf_route routes[] = {
        { .name = "calls", .path = "/", .pathlen = 1, .grpc = 1 },
        { .name = "rest", .path = "/", .pathlen = 1 },
    };
    struct conf c = { .routes = routes, .nroutes = 2 };
    assert_string_equal(route_match_in(&c, ROUTE_GRPC, "/a.B/C", 6, "POST", 4, NULL, 0, NULL)->name,
                        "calls");
    assert_string_equal(route_match_in(&c, 0, "/a.B/C", 6, "POST", 4, NULL, 0, NULL)->name,
                        "rest");
    assert_string_equal(route_match(&c, "/a.B/C", 6, "POST", 4, NULL, 0, NULL)->name, "rest");
}

/* The same functions on a head parsed by the real http1.c, so the span
 * conventions of both modules are checked together. */
static void test_with_http1_parser(void **state)
{
    static const char req[] =
        "POST /api/%6Cogin?user=al+ice&x=1 HTTP/1.1\r\n"
        "Host: API.example.com:8443\r\n"
        "X-Forwarded-For: 198.51.100.7, 10.1.1.1\r\n"
        "Cookie: theme=dark; sid=s3cr3t\r\n"
        "X-Forwarded-For: 192.168.0.2 \r\n"
        "X-Api-Key:   k1  \r\n"
        "Content-Length: 0\r\n"
        "\r\n";
    size_t len = sizeof req - 1;
    char *buf = malloc(len);
    assert_non_null(buf);
    memcpy(buf, req, len);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head h;
    assert_int_equal(http1_head_parse(p, buf, len, 16384, 0, &h), 0);

    char path[64];
    long pl = route_normalize(buf + h.target.off, h.target.len, path);
    assert_int_equal(pl, 10);
    assert_memory_equal(path, "/api/login", 10);
    assert_true(h.host >= 0);
    const struct conf_route *r = route_match(&match_conf, path, (size_t)pl,
                                             buf + h.method.off, h.method.len,
                                             buf + h.h[h.host].value.off,
                                             h.h[h.host].value.len, NULL);
    assert_non_null(r);
    assert_string_equal(r->name, "login");

    struct sockaddr_storage peer = peer_of("10.0.0.1");
    char ip[ROUTE_IP_MAX];
    size_t iplen = route_client_ip(&xff_conf, (struct sockaddr *)&peer, buf, &h, ip);
    assert_string_equal(ip, "198.51.100.7");

    struct conf_keysrc ks[] = { { CONF_KEY_IP, NULL, 0 }, KS(CONF_KEY_QUERY, "user"),
                                KS(CONF_KEY_COOKIE, "sid"), KS(CONF_KEY_HEADER, "x-api-key"),
                                { CONF_KEY_METHOD, NULL, 0 }, { CONF_KEY_PATH, NULL, 0 } };
    struct conf_limit l = { .name = "per-ip", .keys = ks, .nkeys = 6 };
    struct route_req rq = { .buf = buf, .h = &h, .ip = ip, .iplen = iplen,
                            .path = path, .pathlen = (size_t)pl };
    char key[ROUTE_MAX_KEY];
    long n = route_key(&key_conf, r, &l, &rq, key);
    assert_string_equal(key, "sluice:{login|per-ip|12:198.51.100.76:al ice6:s3cr3t2:k14:POST"
                             "10:/api/login}");
    assert_int_equal(n, (long)strlen(key));
    http1_destroy(p);
    free(buf);
}

/* jwt:CLAIM parts: a verified token's string or integer claim, the
 * anonymous marker (no length prefix) without a token, absent when the
 * verified token lacks the claim; route_key_parts names the same key. */
static void test_key_jwt(void **state)
{
    static char claims[JWT_MAX_CLAIMS];
    size_t clen;
    int64_t exp;
    struct jwt_rules none = { 0 };
    const char *p = "{\"sub\":\"al\\u00e9\",\"org\":42,\"f\":1.5}";
    assert_int_equal(jwt_check_payload(&none, p, strlen(p), 0, claims, &clen, &exp), JWT_OK);
    static const struct { const char *claim; int verified; const char *want; } t[] = {
        { "sub", 1, "sluice:{r|l|3:GET4:al\xc3\xa9}" },
        { "org", 1, "sluice:{r|l|3:GET2:42}" },
        { "f", 1, NULL },
        { "missing", 1, NULL },
        { "sub", 0, "sluice:{r|l|3:GET" ROUTE_JWT_ANON "}" },
    };
    char out[ROUTE_MAX_KEY];
    struct head f;
    head_build(&f, "GET / HTTP/1.1\r\n\r\n");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct conf_keysrc ks[2] = { { .kind = CONF_KEY_METHOD },
                                     { .kind = CONF_KEY_JWT, .arg = (char *)t[i].claim,
                                       .arglen = strlen(t[i].claim) } };
        struct conf_limit l = { .name = "l", .keys = ks, .nkeys = 2 };
        struct route_req req = { .buf = f.buf, .h = &f.h, .ip = "192.0.2.1", .iplen = 9,
                                 .path = "/", .pathlen = 1,
                                 .claims = t[i].verified ? claims : NULL, .claims_len = clen };
        long n = route_key(&key_conf, &key_route, &l, &req, out);
        if (t[i].want == NULL ? n != 0 : n != (long)strlen(t[i].want) || strcmp(out, t[i].want))
            fail_msg("%s: expected '%s', got %ld '%s'", t[i].claim, t[i].want ? t[i].want : "",
                     n, n > 0 ? out : "");
    }
    struct conf_keysrc ks[2] = { { .kind = CONF_KEY_METHOD }, KS(CONF_KEY_JWT, "sub") };
    struct conf_limit l = { .name = "l", .keys = ks, .nkeys = 2 };
    const char *parts[] = { "GET", "al\xc3\xa9" };
    size_t lens[] = { 3, 4 };
    assert_int_equal(route_key_parts(&key_conf, &key_route, &l, parts, lens, 2, out), 24);
    assert_string_equal(out, "sluice:{r|l|3:GET4:al\xc3\xa9}");
    head_free(&f);
}

/* Where the token comes from: Bearer (any case), else the cookie; twice or
 * more than one word is no token. */
static void test_jwt_token(void **state)
{
    static const struct { const char *head; int want; const char *tok; } t[] = {
        { "GET / HTTP/1.1\r\nAuthorization: Bearer abc.def.ghi\r\n\r\n", 1, "abc.def.ghi" },
        { "GET / HTTP/1.1\r\nauthorization: bEARER   abc\r\n\r\n", 1, "abc" },
        { "GET / HTTP/1.1\r\nAuthorization: Basic YTpi\r\n\r\n", 0, NULL },
        { "GET / HTTP/1.1\r\nAuthorization: Bearer\r\n\r\n", 0, NULL },
        { "GET / HTTP/1.1\r\nAuthorization: Bearer a b\r\n\r\n", -1, NULL },
        { "GET / HTTP/1.1\r\nAuthorization: Basic YTpi\r\nAuthorization: Bearer a\r\n\r\n",
          -1, NULL },
        { "GET / HTTP/1.1\r\nCookie: a=1; session=\"tok\"\r\n\r\n", 1, "tok" },
        { "GET / HTTP/1.1\r\nCookie: session=x\r\nCookie: session=y\r\n\r\n", -1, NULL },
        { "GET / HTTP/1.1\r\nCookie: session=c\r\nAuthorization: Bearer h\r\n\r\n", 1, "h" },
        { "GET / HTTP/1.1\r\nCookie: session=\r\n\r\n", 0, NULL },
        { "GET / HTTP/1.1\r\n\r\n", 0, NULL },
    };
    struct conf c = { .jwt = { .on = 1, .cookie = "session" } };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct head f;
        const char *tok = NULL;
        size_t len = 0;
        head_build(&f, t[i].head);
        struct route_req req = { .buf = f.buf, .h = &f.h };
        int rc = route_jwt_token(&c, &req, &tok, &len);
        if (rc != t[i].want || (rc == 1 && (len != strlen(t[i].tok) || memcmp(tok, t[i].tok, len))))
            fail_msg("case %zu: got %d '%.*s'", i, rc, rc == 1 ? (int)len : 0, rc == 1 ? tok : "");
        head_free(&f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize_table),
        cmocka_unit_test(test_normalize_random),
        cmocka_unit_test(test_match_table),
        cmocka_unit_test(test_match_none_and_order),
        cmocka_unit_test(test_match_after_normalize),
        cmocka_unit_test(test_normalize_paths_table),
        cmocka_unit_test(test_normalize_paths_random),
        cmocka_unit_test(test_host_check),
        cmocka_unit_test(test_match_paths_and_host_dot),
        cmocka_unit_test(test_client_ip_table),
        cmocka_unit_test(test_client_ip_edges),
        cmocka_unit_test(test_key_table),
        cmocka_unit_test(test_key_ip_prefix),
        cmocka_unit_test(test_key_binary_query),
        cmocka_unit_test(test_key_no_collision),
        cmocka_unit_test(test_key_long_parts),
        cmocka_unit_test(test_key_too_long),
        cmocka_unit_test(test_key_shape),
        cmocka_unit_test(test_key_capture_numbers),
        cmocka_unit_test(test_grpc),
        cmocka_unit_test(test_key_fallback),
        cmocka_unit_test(test_key_jwt),
        cmocka_unit_test(test_jwt_token),
        cmocka_unit_test(test_with_http1_parser),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
