/* sluice - test_fwdauth.c: the request a gateway describes (fwdauth.c).
 *
 * Heads parsed by http1.c, then described: the prefix alone (fields), the
 * prefix with a path (Envoy), other paths, the RLS path; each describing
 * field's spans; what is refused and why. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fwdauth.h"
#include "http1.h"

struct described {
    enum fwdauth_kind kind;
    const char *error;
    char method[64], target[256], host[256];
};

/* Parse head (CRLFs written as \n here) and describe it under prefix. */
static struct described describe(const char *prefix, const char *head)
{
    static char buf[4096];
    struct described d;
    struct conf c;
    struct http1_head h;
    size_t n = 0;
    memset(&d, 0, sizeof d);
    memset(&c, 0, sizeof c);
    for (const char *p = head; *p; p++) {
        if (*p == '\n')
            buf[n++] = '\r';
        buf[n++] = *p;
    }
    c.decision.on = 1;
    c.decision.path_prefix = (char *)prefix;
    c.decision.path_prefix_len = strlen(prefix);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    assert_int_equal(http1_head_parse(p, buf, n, sizeof buf, 0, &h), 0);
    http1_destroy(p);
    d.kind = fwdauth_describe(&c, buf, &h, &d.error);
    snprintf(d.method, sizeof d.method, "%.*s", (int)h.method.len, buf + h.method.off);
    snprintf(d.target, sizeof d.target, "%.*s", (int)h.target.len, buf + h.target.off);
    if (h.host >= 0)
        snprintf(d.host, sizeof d.host, "%.*s", (int)h.h[h.host].value.len,
                 buf + h.h[h.host].value.off);
    return d;
}

static void test_described_by_fields(void **state)
{
    struct described d = describe("/decide", "GET /decide?x=1 HTTP/1.1\nHost: sluice\n"
                                  "X-Forwarded-Method: POST\nX-Forwarded-Uri: /api/a?b=c\n"
                                  "X-Forwarded-Host: app.test\nX-Forwarded-Proto: https\n\n");
    assert_int_equal(d.kind, FWDAUTH_DESCRIBED);
    assert_string_equal(d.method, "POST");
    assert_string_equal(d.target, "/api/a?b=c");
    assert_string_equal(d.host, "app.test");

    d = describe("/decide", "GET /decide HTTP/1.1\nHost: app.test\n"
                 "X-Original-URI: /w\nX-Original-Method: DELETE\n\n");
    assert_int_equal(d.kind, FWDAUTH_DESCRIBED);
    assert_string_equal(d.method, "DELETE");
    assert_string_equal(d.target, "/w");
    assert_string_equal(d.host, "app.test");

    /* no method field: the question's; an empty field is no field */
    d = describe("/decide", "PUT /decide HTTP/1.1\nHost: h\nX-Original-URI: /w\n"
                 "X-Forwarded-Uri:\n\n");
    assert_int_equal(d.kind, FWDAUTH_DESCRIBED);
    assert_string_equal(d.method, "PUT");
    assert_string_equal(d.target, "/w");
}

static void test_envoy_prefix_and_other_paths(void **state)
{
    struct described d = describe("/auth/v1", "HEAD /auth/v1/api/x?y=1 HTTP/1.1\nHost: app\n"
                                  "X-Forwarded-Uri: /other\nX-Forwarded-Host: evil\n\n");
    assert_int_equal(d.kind, FWDAUTH_DESCRIBED);
    assert_string_equal(d.method, "HEAD");
    assert_string_equal(d.target, "/api/x?y=1");
    assert_string_equal(d.host, "app");
    d = describe("/decide", "GET /decide/ HTTP/1.1\nHost: a\n\n");
    assert_string_equal(d.target, "/");
    assert_int_equal(describe("/decide", "GET /decider HTTP/1.1\nHost: a\n\n").kind,
                     FWDAUTH_NOT_FOUND);
    assert_int_equal(describe("/decide", "GET /decid HTTP/1.1\nHost: a\n\n").kind,
                     FWDAUTH_NOT_FOUND);
    assert_int_equal(describe("/decide", "GET / HTTP/1.1\nHost: a\n\n").kind,
                     FWDAUTH_NOT_FOUND);
    assert_int_equal(describe("/decide", "POST " FWDAUTH_RLS_PATH " HTTP/1.1\nHost: a\n\n").kind,
                     FWDAUTH_RLS);
}

static void test_refused(void **state)
{
    static const struct { const char *fields, *error; } t[] = {
        { "", "missing_uri" },
        { "X-Forwarded-Method: GET\n", "missing_uri" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Uri: /b\n", "ambiguous_description" },
        { "X-Forwarded-Uri: /a\nX-Original-URI: /b\n", "ambiguous_description" },
        { "X-Forwarded-Uri: /a\nX-Original-Method: GET\n", "ambiguous_description" },
        { "X-Original-URI: /a\nX-Forwarded-Method: GET\n", "ambiguous_description" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Method: GET\nX-Forwarded-Method: PUT\n",
          "ambiguous_description" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Host: a\nX-Forwarded-Host: b\n",
          "ambiguous_description" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Method: G T\n", "bad_method" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Method: GET,POST\n", "bad_method" },
        { "X-Forwarded-Uri: /a\nX-Forwarded-Method: "
          "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n", "bad_method" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char head[512];
        snprintf(head, sizeof head, "GET /decide HTTP/1.1\nHost: s\n%s\n", t[i].fields);
        struct described d = describe("/decide", head);
        if (d.kind != FWDAUTH_BAD || strcmp(d.error, t[i].error) != 0)
            fail_msg("case %zu: kind %d error %s", i, d.kind, d.error ? d.error : "-");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_described_by_fields),
        cmocka_unit_test(test_envoy_prefix_and_other_paths),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
