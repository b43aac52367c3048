/* sluice - test_rls.c: unit tests of Envoy's RLS descriptors: loading
 * decision.ratelimit_config in envoyproxy/ratelimit's format (conf_rls.c,
 * each bad file's exact FILE:LINE:COL error), matching as the reference
 * does (rls_match.c: exact, wildcard, value-less, nesting, depth), the
 * Redis keys, and decoding a request message (rls_wire.c). Run from
 * tests/unit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "rls_match.h"
#include "rls_wire.h"

static char *tmp_write(const char *text)
{
    char *path = strdup("/tmp/sluice_test_rls_XXXXXX");
    assert_non_null(path);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* The main config with decision.ratelimit_config at rls_path (and more
 * decision keys); returns the conf, or NULL and *err (malloc'd). */
static struct conf *load_with(const char *rls_path, const char *more, char **err)
{
    char *text = NULL;
    assert_true(asprintf(&text, "listen: 127.0.0.1:8080\n"
                         "upstreams: { api: { servers: [127.0.0.1:9000] } }\n"
                         "routes: [ { name: r, match: { path: / }, upstream: api } ]\n"
                         "decision:\n  listen: 127.0.0.1:8090\n  ratelimit_config: %s\n%s",
                         rls_path, more ? more : "") > 0);
    char *main_path = tmp_write(text);
    *err = NULL;
    struct conf *c = conf_load(main_path, err);
    unlink(main_path);
    free(main_path);
    free(text);
    return c;
}

/* Load one RLS file's text; NULL and *err without the "FILE:" prefix on error. */
static struct conf *load_rls(const char *yaml, char **err)
{
    char *path = tmp_write(yaml), *e = NULL;
    struct conf *c = load_with(path, NULL, &e);
    *err = NULL;
    if (e) {
        size_t pl = strlen(path);
        if (strncmp(e, path, pl) == 0 && e[pl] == ':')
            *err = strdup(e + pl + 1);
        else
            *err = strdup(e);
        free(e);
    }
    unlink(path);
    free(path);
    return c;
}

static const char BASIC[] =
    "domain: envoy\n"
    "descriptors:\n"
    "  - key: generic_key\n"
    "    value: slow\n"
    "    rate_limit: { unit: minute, requests_per_unit: 3 }\n"
    "  - key: generic_key\n"
    "    rate_limit: { unit: second, requests_per_unit: 100 }\n"
    "  - key: path\n"
    "    value: /api/*\n"
    "    rate_limit: { unit: Hour, requests_per_unit: 2 }\n"
    "  - key: path\n"
    "    value: /a*b*c\n"
    "    share_threshold: true\n"
    "    rate_limit: { unit: day, requests_per_unit: 7 }\n"
    "  - key: key1\n"
    "    value: value1\n"
    "    descriptors:\n"
    "      - key: subkey1\n"
    "        rate_limit: { name: nested, unit: week, requests_per_unit: 1,"
    " replaces: [ { name: other } ] }\n"
    "  - key: free\n"
    "    rate_limit: { unlimited: true }\n"
    "  - key: bucket\n"
    "    algorithm: token_bucket\n"
    "    burst: 20\n"
    "    rate_limit: { unit: minute, requests_per_unit: 60 }\n"
    "  - key: sliding\n"
    "    algorithm: sliding_window\n"
    "    window: 10s\n"
    "    shadow_mode: true\n"
    "    rate_limit: { unit: second, requests_per_unit: 5 }\n";

static const struct conf_rls_node *match(const struct conf *c, const char *domain,
                                         const char *const *kv, int n, const char **share)
{
    struct rls_entry e[8];
    const char *sh[8];
    for (int i = 0; i < n; i++)
        e[i] = (struct rls_entry){ kv[2 * i], kv[2 * i + 1] };
    const struct conf_rls_domain *d = rls_domain(c->decision.rls, domain);
    if (d == NULL)
        return NULL;
    return rls_match(d, e, n, share ? share : sh);
}

static void test_load_and_match(void **state)
{
    char *err = NULL;
    struct conf *c = load_rls(BASIC, &err);
    assert_null(err);
    assert_non_null(c);
    assert_int_equal(c->decision.rls->ndomains, 1);
    assert_null(rls_domain(c->decision.rls, "other"));

    /* exact value first, then the value-less one */
    const char *slow[] = { "generic_key", "slow" }, *fast[] = { "generic_key", "x" };
    const struct conf_rls_node *n = match(c, "envoy", slow, 1, NULL);
    assert_non_null(n);
    assert_int_equal(n->limit->requests_per_unit, 3);
    assert_int_equal(n->limit->unit, CONF_RLS_MINUTE);
    assert_int_equal(n->limit->params.algo, LIMITER_FIXED_WINDOW);
    assert_int_equal(n->limit->params.window_ms, 60000);
    assert_string_equal(n->limit->path, "generic_key_slow");
    n = match(c, "envoy", fast, 1, NULL);
    assert_int_equal(n->limit->requests_per_unit, 100);
    assert_string_equal(n->limit->path, "generic_key");

    /* wildcards: a prefix, and one with middle parts shared */
    const char *api[] = { "path", "/api/v1" }, *abc[] = { "path", "/a-x-b-y-c" },
               *nope[] = { "path", "/b" };
    const char *share[1];
    n = match(c, "envoy", api, 1, share);
    assert_int_equal(n->limit->unit, CONF_RLS_HOUR);
    assert_null(share[0]);
    n = match(c, "envoy", abc, 1, share);
    assert_int_equal(n->limit->unit, CONF_RLS_DAY);
    assert_string_equal(share[0], "/a*b*c");
    assert_null(match(c, "envoy", nope, 1, NULL));

    /* nested: only at the depth of the limit */
    const char *nested[] = { "key1", "value1", "subkey1", "any" };
    const char *deeper[] = { "key1", "value1", "subkey1", "any", "more", "x" };
    n = match(c, "envoy", nested, 2, NULL);
    assert_string_equal(n->limit->name, "nested");
    assert_int_equal(n->limit->unit, CONF_RLS_WEEK);
    assert_int_equal(n->limit->params.window_ms, 7LL * 86400 * 1000);
    assert_int_equal(n->limit->nreplaces, 1);
    assert_string_equal(n->limit->path, "key1_value1.subkey1");
    /* the admin API finds it by its path (no name): the chain from the top */
    const struct conf_rls_node *chain[RLS_MAX_ENTRIES];
    const struct conf_rls_domain *dom = rls_domain(c->decision.rls, "envoy");
    assert_int_equal(rls_find(dom, "key1_value1.subkey1", 19, chain), 2);
    assert_ptr_equal(chain[1], n);
    assert_string_equal(chain[0]->value, "value1");
    assert_int_equal(rls_find(dom, "key1_value1", 11, chain), 0);   /* no limit there */
    assert_null(match(c, "envoy", nested, 1, NULL));
    assert_null(match(c, "envoy", deeper, 3, NULL));

    /* unlimited, and sluice's algorithms */
    const char *fr[] = { "free", "1" }, *bu[] = { "bucket", "1" }, *sl[] = { "sliding", "1" };
    assert_true(match(c, "envoy", fr, 1, NULL)->limit->unlimited);
    n = match(c, "envoy", bu, 1, NULL);
    assert_int_equal(n->limit->params.algo, LIMITER_TOKEN_BUCKET);
    assert_int_equal(n->limit->params.limit, 20);
    assert_int_equal(n->limit->params.interval_us, 1000000);
    n = match(c, "envoy", sl, 1, NULL);
    assert_int_equal(n->limit->params.algo, LIMITER_SLIDING_WINDOW);
    assert_int_equal(n->limit->params.window_ms, 10000);
    assert_true(n->limit->shadow);
    conf_release(c);
}

/* A directory: every *.yaml and *.yml, hidden files and others left out;
 * settings. */
static void test_directory(void **state)
{
    char dir[] = "/tmp/sluice_test_rls_dir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    static const char *const names[] = { "a.yaml", "b.yml", ".hidden.yaml", "c.txt" };
    static const char *const texts[] = { "domain: one\n", "domain: two\n", "domain: [\n",
                                         "domain: [\n" };
    char path[256];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(texts[i], f);
        fclose(f);
    }
    char *err = NULL;
    struct conf *c = load_with(dir, "  rls_consume: every_descriptor\n  rls_on_error: unavailable\n",
                               &err);
    assert_null(err);
    assert_int_equal(c->decision.rls->ndomains, 2);
    assert_non_null(rls_domain(c->decision.rls, "one"));
    assert_non_null(rls_domain(c->decision.rls, "two"));
    assert_true(c->decision.rls_count_each);
    assert_int_equal(c->decision.rls_on_error, CONF_RLS_ON_ERROR_UNAVAILABLE);
    conf_release(c);
    /* the same domain in two files */
    snprintf(path, sizeof path, "%s/b.yml", dir);
    FILE *f = fopen(path, "w");
    fputs("domain: one\n", f);
    fclose(f);
    c = load_with(dir, NULL, &err);
    assert_null(c);
    char want[300];
    snprintf(want, sizeof want, "%s/b.yml:1:9: duplicate domain 'one' in config file", dir);
    assert_string_equal(err, want);
    free(err);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    /* a FIFO is not read (it would block) */
    char fifo[] = "/tmp/sluice_test_rls_fifo_XXXXXX";
    int fd = mkstemp(fifo);
    assert_true(fd >= 0);
    close(fd);
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    c = load_with(fifo, NULL, &err);
    assert_null(c);
    snprintf(want, sizeof want, "%s: cannot read: not a regular file", fifo);
    assert_string_equal(err, want);
    free(err);
    unlink(fifo);
    /* a path that is not there: blamed at the key of the main file */
    c = load_with("/nonexistent/rls", NULL, &err);
    assert_null(c);
    if (strstr(err, ":6:21: decision.ratelimit_config: cannot read "
                    "'/nonexistent/rls': No such file or directory") == NULL)
        fail_msg("got %s", err);
    free(err);
}

/* Each bad file and the exact error it gives (after "FILE:"). */
static void test_bad_files(void **state)
{
    static const struct { const char *yaml, *err; } t[] = {
        { "descriptors: []\n", "1:1: config file cannot have empty domain" },
        { "domain: d\nbogus: 1\n", "2:1: unknown key 'bogus' in top level (use domain and "
          "descriptors)" },
        { "domain: d\ndescriptors:\n  - value: x\n",
          "3:5: missing required key 'key' in descriptors[0]" },
        { "domain: d\ndescriptors:\n  - key: \"\"\n", "3:10: descriptors[0]: descriptor has empty key" },
        { "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: j\n  - key: k\n    value: v\n",
          "6:5: descriptors[2]: duplicate descriptor composite key 'k_v'" },
        { "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, "
          "requests_per_unit: 1 }\n",
          "4:25: descriptors[0].rate_limit: invalid rate limit unit 'fortnight' (use second, "
          "minute, hour, day, week, month or year)" },
        { "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, unlimited: true }\n",
          "4:25: descriptors[0].rate_limit: should not specify rate limit unit when unlimited" },
        { "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: a, unit: second, "
          "requests_per_unit: 1, replaces: [ { name: a } ] }\n",
          "4:84: descriptors[0].rate_limit.replaces[0]: replaces should not contain name of same "
          "descriptor" },
        { "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, "
          "requests_per_unit: 1, replaces: [ { name: \"\" } ] }\n",
          "4:75: descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry" },
        { "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
          "5:22: descriptors[0]: share_threshold can only be used with wildcard values "
          "(containing '*'), but found key 'k_v'" },
        { "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n",
          "4:17: descriptors[0].quota_mode: quota_mode is not supported by sluice" },
        { "domain: d\ndescriptors:\n  - key: k\n    algorithm: leaky\n"
          "    rate_limit: { unit: second, requests_per_unit: 1 }\n",
          "4:16: descriptors[0]: unknown algorithm 'leaky' (use fixed_window, sliding_window, "
          "sliding_log, token_bucket, gcra or concurrency)" },
        { "domain: d\ndescriptors:\n  - key: k\n    burst: 3\n",
          "4:12: descriptors[0]: algorithm, burst, window, limit and lease need a rate_limit" },
        { "domain: d\ndescriptors:\n  - key: k\n    limit: 3\n"
          "    rate_limit: { unit: second, requests_per_unit: 1 }\n",
          "4:12: descriptors[0]: 'limit' applies to algorithm: concurrency only" },
        { "domain: d\ndescriptors:\n  - key: k\n    algorithm: concurrency\n"
          "    rate_limit: { name: n }\n",
          "4:16: descriptors[0]: concurrency needs limit (the slots per key)" },
        { "domain: d\ndescriptors:\n  - key: k\n    algorithm: concurrency\n    limit: 2\n"
          "    rate_limit: { unit: second }\n",
          "6:25: descriptors[0].rate_limit: a concurrency rate_limit has no unit, "
          "requests_per_unit nor unlimited (use limit and lease beside it)" },
        { "domain: d\ndescriptors:\n  - key: k\n    algorithm: concurrency\n    limit: 2\n"
          "    window: 1s\n    rate_limit: { name: n }\n",
          "6:13: descriptors[0]: 'window' does not apply to concurrency (use limit and lease)" },
        { "domain: d\ndescriptors:\n  - key: k\n    burst: 3\n"
          "    rate_limit: { unit: second, requests_per_unit: 1 }\n",
          "4:12: descriptors[0]: 'burst' does not apply to fixed_window (use window)" },
        { "domain: d\ndescriptors:\n  - key: k\n"
          "    rate_limit: { unit: second, requests_per_unit: 2000000000 }\n",
          "4:52: descriptors[0].rate_limit.requests_per_unit: 2000000000 is out of range "
          "(0..1000000000)" },
        { "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n"
          "        rate_limit: { unit: minute }\n        nope: 1\n",
          "7:9: unknown key 'nope' in descriptors[0].descriptors[0]" },
        { "domain: [d\n", "2:1: syntax error: did not find expected ',' or ']' (while parsing a "
          "flow sequence at 1:9)" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char *err = NULL;
        struct conf *c = load_rls(t[i].yaml, &err);
        if (c != NULL || err == NULL || strcmp(err, t[i].err) != 0)
            fail_msg("case %zu:\n got: %s\nwant: %s", i, err ? err : "(loaded)", t[i].err);
        free(err);
    }
}

static void test_wildcard(void **state)
{
    static char *p1[] = { "foo", "" }, *p2[] = { "", "bar" }, *p3[] = { "a", "b", "c" },
                *p4[] = { "ab", "ba" }, *p5[] = { "", "" };
    assert_true(rls_wildcard(p1, 2, "foo"));
    assert_true(rls_wildcard(p1, 2, "foobar"));
    assert_false(rls_wildcard(p1, 2, "fo"));
    assert_true(rls_wildcard(p2, 2, "xbar"));
    assert_false(rls_wildcard(p2, 2, "barx"));
    assert_true(rls_wildcard(p3, 3, "abc"));
    assert_true(rls_wildcard(p3, 3, "a--b--c"));
    assert_false(rls_wildcard(p3, 3, "acb"));
    assert_false(rls_wildcard(p4, 2, "aba"));     /* prefix and suffix may not overlap */
    assert_true(rls_wildcard(p4, 2, "abba"));
    assert_true(rls_wildcard(p5, 2, ""));
}

static void test_keys(void **state)
{
    char out[RLS_MAX_KEY];
    struct rls_entry e[2] = { { "k", "v1" }, { "path", "/x" } };
    const char *share[2] = { NULL, "/*" };
    size_t n = rls_key("p:", "dom", e, 2, NULL, out);
    assert_string_equal(out, "p:{rls|3:dom1:k2:v14:path2:/x}");
    assert_int_equal(n, strlen(out));
    rls_key("p:", "dom", e, 2, share, out);
    assert_string_equal(out, "p:{rls|3:dom1:k2:v14:path2:/*}");
    /* too long: hashed, and a different long value gives another key */
    char big[2000], key2[RLS_MAX_KEY];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    struct rls_entry l[1] = { { "k", big } };
    n = rls_key("p:", "dom", l, 1, NULL, out);
    assert_int_equal(n, strlen("p:{rls|#}") + 40);
    big[5] = 'y';
    rls_key("p:", "dom", l, 1, NULL, key2);
    assert_string_not_equal(out, key2);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
        v >>= 7;
        n++;
    } while (v);
    return n;
}

static size_t put_str(uint8_t *p, int field, const char *s)
{
    size_t n = put_varint(p, (uint64_t)field << 3 | 2);
    n += put_varint(p + n, strlen(s));
    memcpy(p + n, s, strlen(s));
    return n + strlen(s);
}

/* A framed RateLimitRequest{domain, one descriptor {(k, v)}, hits 0 or one
 * more field} into buf; returns its length. */
static size_t framed(uint8_t *buf, const char *domain, const char *k, const char *v,
                     const uint8_t *extra, size_t extra_len)
{
    uint8_t ent[128], desc[160], msg[512];
    size_t ne = put_str(ent, 1, k);
    ne += put_str(ent + ne, 2, v);
    size_t nd = put_varint(desc, 1 << 3 | 2);
    nd += put_varint(desc + nd, ne);
    memcpy(desc + nd, ent, ne);
    nd += ne;
    size_t nm = put_str(msg, 1, domain);
    nm += put_varint(msg + nm, 2 << 3 | 2);
    nm += put_varint(msg + nm, nd);
    memcpy(msg + nm, desc, nd);
    nm += nd;
    memcpy(msg + nm, extra, extra_len);
    nm += extra_len;
    buf[0] = 0;
    buf[1] = (uint8_t)(nm >> 24);
    buf[2] = (uint8_t)(nm >> 16);
    buf[3] = (uint8_t)(nm >> 8);
    buf[4] = (uint8_t)nm;
    memcpy(buf + 5, msg, nm);
    return nm + 5;
}

static void test_decode(void **state)
{
    uint8_t buf[600];
    struct rls_req req;
    const char *why = NULL;
    /* hits_addend 7 and an unknown field 9 (skipped) */
    static const uint8_t extra[] = { 3 << 3, 7, 9 << 3, 1 };
    size_t n = framed(buf, "envoy", "remote_address", "10.0.0.1", extra, sizeof extra);
    assert_int_equal(rls_wire_decode(buf, n, &req, &why), 0);
    assert_string_equal(req.domain, "envoy");
    assert_int_equal(req.ndescs, 1);
    assert_int_equal(req.hits_addend, 7);
    assert_int_equal(req.descs[0].nentries, 1);
    assert_string_equal(req.descs[0].entries[0].key, "remote_address");
    assert_string_equal(req.descs[0].entries[0].value, "10.0.0.1");
    assert_false(req.descs[0].has_limit);
    assert_false(req.descs[0].has_hits);
    rls_wire_free(&req);
    /* the length prefix must be the body's */
    assert_int_equal(rls_wire_decode(buf, n - 1, &req, &why), RLS_GRPC_INVALID_ARGUMENT);
    rls_wire_free(&req);
    /* every truncation before the descriptor's end fails cleanly */
    for (size_t cut = 5; cut < n - sizeof extra; cut++) {
        uint8_t t[600];
        memcpy(t, buf, cut);
        t[1] = t[2] = t[3] = 0;
        t[4] = (uint8_t)(cut - 5);
        int rc = rls_wire_decode(t, cut, &req, &why);
        assert_int_not_equal(rc, 0);
        rls_wire_free(&req);
    }
    /* compressed, and too large */
    buf[0] = 1;
    assert_int_equal(rls_wire_decode(buf, n, &req, &why), 12);
    rls_wire_free(&req);
    static const uint8_t huge[5] = { 0, 0, 2, 0, 0 };
    assert_int_equal(rls_wire_decode(huge, 5, &req, &why), RLS_GRPC_RESOURCE_EXHAUSTED);
    rls_wire_free(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_and_match),
        cmocka_unit_test(test_directory),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_wildcard),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
