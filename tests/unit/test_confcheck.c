/* sluice - test_confcheck.c: unit tests of the load above conf (src/confcheck.c).
 *
 * conf_load() only parses: a file whose certificate does not exist loads,
 * with nothing built. confcheck_load() runs the checks and builds above it:
 * the same file is an error at the certificate entry's place; a good one
 * gets its TLS listener's contexts and every override's Redis key (the key
 * route_key_parts makes), and releasing the conf frees what was built (ASan
 * sees a leak otherwise, under make test SANITIZE=1). Run from tests/unit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "confcheck.h"
#include "route.h"

#define TEXT \
    "listen:\n" \
    "  - 127.0.0.1:8080\n" \
    "  - address: 127.0.0.1:8443\n" \
    "    tls:\n" \
    "      certificates:\n" \
    "        - { cert_file: %s, key_file: data/conf/tls_client.key }\n" \
    "backend: memory\n" \
    "upstreams:\n  api: { servers: [127.0.0.1:9000] }\n" \
    "routes:\n" \
    "  - name: r\n" \
    "    match: { path: / }\n" \
    "    upstream: api\n" \
    "    limits:\n" \
    "      - name: l\n" \
    "        algorithm: fixed_window\n" \
    "        limit: 1\n" \
    "        window: 1m\n" \
    "        key: [\"header:X-K\"]\n" \
    "        overrides: [ { key: [vip], limit: 5 }, { key: [gold], limit: 7 } ]\n"

static char *write_conf(const char *cert)
{
    char text[2048];
    char *path = strdup("/tmp/sluice_test_confcheck_XXXXXX");
    assert_non_null(path);
    snprintf(text, sizeof text, TEXT, cert);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_conf_load_only_parses(void **state)
{
    char *path = write_conf("/nonexistent/sluice.pem"), *err = NULL, want[512];
    struct conf *c = conf_load(path, &err);
    assert_non_null(c);
    assert_null(err);
    assert_null(c->listens[1].server);
    assert_null(c->routes[0].limits[0].overrides[0].key);
    conf_release(c);

    assert_null(confcheck_load(path, &err));
    snprintf(want, sizeof want, "%s:6:11: listen[1].tls.certificates[0]: cannot read "
             "cert_file '/nonexistent/sluice.pem': No such file or directory", path);
    assert_non_null(err);
    assert_string_equal(err, want);
    free(err);
    assert_null(confcheck_load(path, NULL));    /* err is optional */
    unlink(path);
    free(path);
}

static void test_confcheck_builds(void **state)
{
    char *path = write_conf("data/conf/tls_client.pem"), *err = NULL;
    struct conf *c = confcheck_load(path, &err);
    if (c == NULL)
        fail_msg("confcheck_load: %s", err);
    assert_null(c->listens[0].server);
    assert_non_null(c->listens[1].server);
    const struct conf_route *r = &c->routes[0];
    const struct conf_limit *l = &r->limits[0];
    for (int i = 0; i < l->noverrides; i++) {
        const struct conf_override *o = &l->overrides[i];
        char key[ROUTE_MAX_KEY];
        long n = route_key_parts(c, r, l, (const char *const *)o->parts, o->partlen,
                                 o->nparts, key);
        assert_true(n > 0);
        assert_int_equal(o->keylen, (size_t)n);
        assert_memory_equal(o->key, key, (size_t)n);
        assert_ptr_equal(route_override(l, key, (size_t)n), o);
    }
    conf_retain(c);
    conf_release(c);
    conf_release(c);            /* the contexts go with the conf */
    unlink(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conf_load_only_parses),
        cmocka_unit_test(test_confcheck_builds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
