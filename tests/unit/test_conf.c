/* sluice - test_conf.c: unit tests of the config loader (src/conf.c).
 *
 * Tables for durations, rates and Redis URLs; ${VAR} substitution; CIDR
 * matching; the reference conf/sluice.yaml and conf/standalone.yaml; the
 * operations keys (backend, admin, path_regex, count_status...); and every
 * bad file in data/conf/bad_*.yaml, whose first line "# expect: LINE:COL:
 * message" is the exact error the whole load (confcheck_load) must give (a trailing '*' matches any rest,
 * for resolver texts that differ between machines). Run from tests/unit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "confcheck.h"
#include "route.h"

#define DATA_DIR "data/conf"
#define REFERENCE "../../conf/sluice.yaml"
#define STANDALONE "../../conf/standalone.yaml"

/* Write text to a fresh temporary file; the caller unlinks and frees. */
static char *tmp_write(const char *text, size_t len)
{
    char *path = strdup("/tmp/sluice_test_conf_XXXXXX");
    int fd;
    assert_non_null(path);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

/* Load text; on error, *err is the message without the "FILE:" prefix. */
static struct conf *load_text(const char *text, char **err)
{
    char *path = tmp_write(text, strlen(text)), *e = NULL;
    struct conf *c = conf_load(path, &e);
    *err = NULL;
    if (e) {
        size_t pl = strlen(path);
        assert_memory_equal(e, path, pl);
        assert_int_equal(e[pl], ':');
        *err = strdup(e + pl + 1);
        free(e);
    }
    unlink(path);
    free(path);
    return c;
}

#define MINIMAL_HEAD "listen: 127.0.0.1:8080\n" \
    "upstreams: { api: { servers: [127.0.0.1:9000] } }\n"
#define MINIMAL_ROUTES "routes: [ { name: r, match: { path: / }, upstream: api } ]\n"

static void test_durations(void **state)
{
    static const struct { const char *s; int ok; int64_t ms; } t[] = {
        { "500ms", 1, 500 }, { "1ms", 1, 1 }, { "30s", 1, 30000 }, { "5m", 1, 300000 },
        { "1h", 1, 3600000 }, { "1d", 1, 86400000 }, { "1w", 1, 604800000 },
        { "007s", 1, 7000 }, { "90m", 1, 5400000 },
        { "9223372036854775807ms", 1, INT64_MAX },
        { "9223372036854775807s", 0, 0 },           /* overflows when scaled */
        { "99999999999999999999ms", 0, 0 },         /* overflows when read */
        { "", 0, 0 }, { "s", 0, 0 }, { "10", 0, 0 }, { "0s", 0, 0 }, { "0ms", 0, 0 },
        { "-5s", 0, 0 }, { "+5s", 0, 0 }, { " 5s", 0, 0 }, { "5s ", 0, 0 },
        { "5 s", 0, 0 }, { "5S", 0, 0 }, { "5sec", 0, 0 }, { "1.5s", 0, 0 },
        { "tenm", 0, 0 }, { "5y", 0, 0 }, { "1h30m", 0, 0 }, { "0x10s", 0, 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t ms = -1;
        int rc = conf_parse_duration_ms(t[i].s, &ms);
        if (rc != (t[i].ok ? 0 : -1) || (t[i].ok && ms != t[i].ms))
            fail_msg("duration '%s': rc %d ms %lld", t[i].s, rc, (long long)ms);
    }
}

static void test_rates(void **state)
{
    static const struct { const char *s; int ok; int64_t n, ms; } t[] = {
        { "10/s", 1, 10, 1000 }, { "100/m", 1, 100, 60000 }, { "5/h", 1, 5, 3600000 },
        { "1000/d", 1, 1000, 86400000 }, { "100/10s", 1, 100, 10000 },
        { "1/500ms", 1, 1, 500 }, { "3/1w", 1, 3, 604800000 }, { "7/w", 1, 7, 604800000 },
        { "2/ms", 1, 2, 1 },
        { "0/s", 0, 0, 0 }, { "/s", 0, 0, 0 }, { "10", 0, 0, 0 }, { "10/", 0, 0, 0 },
        { "10/x", 0, 0, 0 }, { "10/0s", 0, 0, 0 }, { "10/-1s", 0, 0, 0 }, { "-1/s", 0, 0, 0 },
        { "10 /s", 0, 0, 0 }, { "10/ s", 0, 0, 0 }, { "10/s/s", 0, 0, 0 }, { "1.5/s", 0, 0, 0 },
        { "99999999999999999999/s", 0, 0, 0 }, { "10/sec", 0, 0, 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t n = -1, ms = -1;
        int rc = conf_parse_rate(t[i].s, &n, &ms);
        if (rc != (t[i].ok ? 0 : -1) || (t[i].ok && (n != t[i].n || ms != t[i].ms)))
            fail_msg("rate '%s': rc %d n %lld ms %lld", t[i].s, rc, (long long)n, (long long)ms);
    }
}

static void test_env(void **state)
{
    char *err = NULL;
    struct conf *c;
    const struct sockaddr_in *sin;

    setenv("SLUICE_TEST_LISTEN", "127.0.0.2:8081", 1);
    setenv("SLUICE_TEST_REDIS_HOST", "redis://10.1.2.3", 1);
    setenv("SLUICE_TEST_EMPTY", "", 1);        /* :- takes the default when empty */
    setenv("SLUICE_TEST_PREFIX", "p", 1);
    setenv("SLUICE_TEST_LIMIT", "7", 1);
    unsetenv("SLUICE_TEST_UNSET_VAR");
    c = conf_load(DATA_DIR "/good_env.yaml", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->listen.text, "127.0.0.2:8081");
    sin = (const struct sockaddr_in *)&c->listen.ss;
    assert_int_equal(sin->sin_family, AF_INET);
    assert_int_equal(ntohs(sin->sin_port), 8081);
    assert_int_equal(c->workers, 3);
    assert_string_equal(c->redis.url, "redis://10.1.2.3:6380");
    assert_string_equal(c->redis.host, "10.1.2.3");
    assert_int_equal(c->redis.port, 6380);
    assert_string_equal(c->redis.prefix, "pxy");
    assert_string_equal(c->upstreams[0].servers[0].text, "[::1]:9000");
    assert_int_equal(c->upstreams[0].servers[0].ss.ss_family, AF_INET6);
    assert_string_equal(c->routes[0].path, "/a");
    assert_int_equal(c->routes[0].limits[0].params.limit, 7);
    conf_release(c);

    /* Defaults apply when the variables are unset. */
    unsetenv("SLUICE_TEST_LISTEN");
    unsetenv("SLUICE_TEST_LIMIT");
    c = conf_load(DATA_DIR "/good_env.yaml", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->listen.text, "127.0.0.1:1");
    assert_int_equal(c->routes[0].limits[0].params.limit, 5);
    conf_release(c);

    /* Without a default, an unset variable is an error naming it... */
    unsetenv("SLUICE_TEST_PREFIX");
    c = conf_load(DATA_DIR "/good_env.yaml", &err);
    assert_null(c);
    assert_string_equal(err, DATA_DIR "/good_env.yaml:6:11: redis.prefix: environment "
                        "variable 'SLUICE_TEST_PREFIX' is not set and has no default");
    free(err);
    /* ...but one set to the empty string is fine. */
    setenv("SLUICE_TEST_PREFIX", "", 1);
    c = conf_load(DATA_DIR "/good_env.yaml", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->redis.prefix, "xy");
    conf_release(c);

    /* A substituted value is not expanded again, and is then typed. */
    setenv("SLUICE_TEST_LIMIT", "${SLUICE_TEST_UNSET_VAR:-5}", 1);
    c = conf_load(DATA_DIR "/good_env.yaml", &err);
    assert_null(c);
    assert_string_equal(err, DATA_DIR "/good_env.yaml:14:52: routes[0].limits[0].limit: "
                        "expected an integer, got '${SLUICE_TEST_UNSET_VAR:-5}'");
    free(err);
    unsetenv("SLUICE_TEST_LIMIT");
    unsetenv("SLUICE_TEST_PREFIX");
    unsetenv("SLUICE_TEST_REDIS_HOST");
    unsetenv("SLUICE_TEST_EMPTY");
}

static struct sockaddr_storage sa(const char *ip)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        assert_int_equal(inet_pton(AF_INET6, ip, &s6->sin6_addr), 1);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        assert_int_equal(inet_pton(AF_INET, ip, &s4->sin_addr), 1);
    }
    return ss;
}

static void test_cidr(void **state)
{
    static const struct { const char *ip; int in; } t[] = {
        { "10.0.0.1", 1 }, { "10.255.255.255", 1 }, { "11.0.0.0", 0 }, { "9.255.255.255", 0 },
        { "::ffff:10.9.8.7", 1 },                   /* v4-mapped peer, v4 CIDR */
        { "::ffff:11.0.0.1", 0 },
        { "192.168.1.4", 1 }, { "192.168.1.5", 1 }, { "192.168.1.7", 1 }, { "192.168.1.8", 0 },
        { "192.168.1.3", 0 }, { "203.0.113.9", 1 }, { "203.0.113.10", 0 },
        { "::1", 1 }, { "::2", 0 }, { "fd12:3456::1", 1 }, { "fe80::1", 0 },
        { "2001:db8:abcd:12ff::1", 1 }, { "2001:db8:abcd:13ff::1", 1 }, { "2001:db8:abcd:1400::1", 0 }, { "2001:db8:abcd:11ff::1", 0 },
        { "172.16.0.1", 0 },
    };
    char *err;
    struct conf *c = load_text(MINIMAL_HEAD MINIMAL_ROUTES
        "trusted_proxies: [10.0.0.0/8, 192.168.1.6/30, 203.0.113.9, \"::1\", \"fd00::/8\","
        " \"2001:db8:abcd:1200::/55\"]\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->ntrusted, 6);
    assert_int_equal(c->trusted[1].bits, 30);
    assert_int_equal(c->trusted[1].addr[3], 4);        /* host bits masked off */
    assert_int_equal(c->trusted[2].bits, 32);
    assert_int_equal(c->trusted[3].bits, 128);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct sockaddr_storage ss = sa(t[i].ip);
        if (conf_cidr_match(c->trusted, c->ntrusted, (struct sockaddr *)&ss) != t[i].in)
            fail_msg("cidr match %s: expected %d", t[i].ip, t[i].in);
    }
    {
        struct sockaddr_storage ss = sa("10.0.0.1");
        assert_int_equal(conf_cidr_match(c->trusted, 0, (struct sockaddr *)&ss), 0);
        ss.ss_family = AF_UNIX;
        assert_int_equal(conf_cidr_match(c->trusted, c->ntrusted, (struct sockaddr *)&ss), 0);
        assert_int_equal(conf_cidr_match(c->trusted, c->ntrusted, NULL), 0);
    }
    conf_release(c);

    /* /0 matches everything of its family; a v4-mapped v6 CIDR matches v4. */
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "trusted_proxies: [0.0.0.0/0]\n", &err);
    assert_non_null(c);
    {
        struct sockaddr_storage a = sa("8.8.8.8"), b = sa("2001:db8::1");
        assert_int_equal(conf_cidr_match(c->trusted, 1, (struct sockaddr *)&a), 1);
        assert_int_equal(conf_cidr_match(c->trusted, 1, (struct sockaddr *)&b), 0);
    }
    conf_release(c);
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "trusted_proxies: [\"::ffff:10.0.0.0/104\"]\n", &err);
    assert_non_null(c);
    {
        struct sockaddr_storage a = sa("10.1.1.1"), b = sa("11.1.1.1");
        assert_int_equal(conf_cidr_match(c->trusted, 1, (struct sockaddr *)&a), 1);
        assert_int_equal(conf_cidr_match(c->trusted, 1, (struct sockaddr *)&b), 0);
    }
    conf_release(c);
}

static void test_reference(void **state)
{
    char *err = NULL;
    struct conf *c;
    const struct conf_route *r;
    unsetenv("SLUICE_LISTEN");
    unsetenv("SLUICE_REDIS_URL");
    unsetenv("SLUICE_UPSTREAM");
    c = conf_load(REFERENCE, &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->file, REFERENCE);
    assert_string_equal(c->listen.text, "127.0.0.1:8080");
    assert_int_equal(c->workers, 1);
    assert_int_equal(c->max_connections, 10000);
    assert_int_equal(c->shutdown_timeout_ms, 10000);
    assert_int_equal(c->client.max_header_bytes, 16384);
    assert_int_equal(c->client.header_timeout_ms, 10000);
    assert_string_equal(c->redis.host, "127.0.0.1");
    assert_int_equal(c->redis.port, 6379);
    assert_int_equal(c->redis.db, 0);
    assert_int_equal(c->redis.timeout_ms, 50);
    assert_string_equal(c->redis.prefix, "sluice:");
    assert_int_equal(c->redis.on_error, CONF_ON_ERROR_ALLOW);
    assert_int_equal(c->nupstreams, 1);
    assert_string_equal(c->upstreams[0].name, "api");
    assert_string_equal(c->upstreams[0].servers[0].text, "127.0.0.1:9000");
    assert_int_equal(c->upstreams[0].keepalive, 32);
    assert_int_equal(c->upstreams[0].h2, 0);
    assert_int_equal(c->upstreams[0].connect_timeout_ms, 2000);
    assert_int_equal(c->upstreams[0].timeout_ms, 30000);
    assert_int_equal(c->ntrusted, 1);
    assert_int_equal(c->nroutes, 4);
    assert_int_equal(c->backend, CONF_BACKEND_REDIS);
    assert_int_equal(c->memory_max_keys, 1000000);
    assert_int_equal(c->deny_cache_max_keys, 100000);
    assert_int_equal(c->has_admin, 0);
    assert_null(c->access_log);
    assert_int_equal(c->nallow, 0);

    r = &c->routes[0];
    assert_string_equal(r->name, "login");
    assert_string_equal(r->path, "/api/login");
    assert_int_equal(r->pathlen, 10);
    assert_int_equal(r->nmethods, 1);
    assert_string_equal(r->methods[0], "POST");
    assert_string_equal(r->host, "api.example.com");
    assert_ptr_equal(r->upstream, &c->upstreams[0]);
    assert_int_equal(r->nlimits, 2);
    assert_int_equal(r->limits[0].params.algo, LIMITER_SLIDING_LOG);
    assert_int_equal(r->limits[0].params.limit, 5);
    assert_int_equal(r->limits[0].params.window_ms, 60000);
    assert_int_equal(r->limits[0].params.interval_us, 0);
    assert_int_equal(r->limits[0].keys[0].kind, CONF_KEY_IP);
    assert_null(r->limits[0].keys[0].arg);
    assert_int_equal(r->limits[1].keys[0].kind, CONF_KEY_HEADER);
    assert_string_equal(r->limits[1].keys[0].arg, "X-Api-Key");
    assert_int_equal(r->limits[1].keys[0].arglen, 9);
    assert_null(r->regex);
    assert_int_equal(r->cost, 1);
    assert_int_equal(r->headers, CONF_HEADERS_FULL);
    assert_int_equal(r->upgrade, 0);
    assert_int_equal(r->limits[0].status, 429);
    assert_int_equal(r->limits[0].shadow, 0);
    assert_int_equal(r->limits[0].has_count_status, 0);
    assert_null(r->limits[0].message);
    assert_null(r->limits[0].cost_header);

    r = &c->routes[1];
    assert_string_equal(r->name, "users");
    assert_null(r->path);
    assert_non_null(r->regex);
    assert_string_equal(r->path_regex, "^/users/([^/]+)(/|$)");
    assert_int_equal(r->ncaptures, 2);
    assert_int_equal(r->limits[0].keys[0].kind, CONF_KEY_CAPTURE);
    assert_int_equal(r->limits[0].keys[0].capture, 1);

    r = &c->routes[2];
    assert_string_equal(r->name, "exports");
    assert_int_equal(r->nlimits, 2);
    assert_int_equal(r->limits[0].params.algo, LIMITER_CONCURRENCY);
    assert_int_equal(r->limits[0].params.limit, 3);
    assert_int_equal(r->limits[0].params.window_ms, 40000);     /* lease: timeout + 10 s */
    assert_int_equal(r->limits[1].params.algo, LIMITER_GCRA);
    assert_int_equal(r->limits[1].params.interval_us, 500000);
    assert_int_equal(r->limits[1].params.delay_ms, 2000);

    r = &c->routes[3];
    assert_string_equal(r->name, "default");
    assert_string_equal(r->path, "/");
    assert_null(r->methods);
    assert_null(r->host);
    assert_string_equal(r->limits[0].name, "per-ip");
    assert_int_equal(r->limits[0].params.algo, LIMITER_TOKEN_BUCKET);
    assert_int_equal(r->limits[0].params.limit, 5);             /* burst */
    assert_int_equal(r->limits[0].params.interval_us, 1000000); /* 1/s */
    assert_int_equal(r->limits[0].params.window_ms, 5000);      /* refill 5 */
    conf_release(c);
}

/* Each data/conf/bad_*.yaml starts with "# expect: LINE:COL: message". */
static int bad_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_bad_files(void **state)
{
    DIR *d = opendir(DATA_DIR);
    struct dirent *de;
    char *names[256];
    int n = 0, failed = 0;
    assert_non_null(d);
    setenv("SLUICE_TEST_SET", "1", 1);
    unsetenv("SLUICE_TEST_UNSET_VAR");
    while ((de = readdir(d)) != NULL && n < 256)
        if (!strncmp(de->d_name, "bad_", 4) && strstr(de->d_name, ".yaml"))
            names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], bad_name_cmp);
    assert_true(n >= 90);
    for (int i = 0; i < n; i++) {
        char path[512], line[1024], want[1600], *err = NULL;
        FILE *f;
        struct conf *c;
        size_t wl;
        int prefix;
        snprintf(path, sizeof path, DATA_DIR "/%s", names[i]);
        f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof line, f));
        fclose(f);
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "# expect: ", 10))
            fail_msg("%s: first line must be '# expect: LINE:COL: message'", path);
        snprintf(want, sizeof want, "%s:%s", path, line + 10);
        wl = strlen(want);
        prefix = wl > 0 && want[wl - 1] == '*';
        c = confcheck_load(path, &err);     /* the whole load, as sluice -t runs it */
        if (c) {
            print_error("%s: loaded, expected %s\n", path, want);
            conf_release(c);
            failed++;
        } else if (!err || (prefix ? strncmp(err, want, wl - 1) || !err[wl - 1]
                                   : strcmp(err, want) != 0)) {
            print_error("%s:\n  want: %s\n  got:  %s\n", path, want, err ? err : "(null)");
            failed++;
        }
        free(err);
        free(names[i]);
    }
    print_message("%d bad config files checked\n", n);
    assert_int_equal(failed, 0);
}

static void test_redis_urls(void **state)
{
    static const struct {
        const char *url; int ok; int is_unix; const char *host; int port, db;
        const char *user, *password;
    } t[] = {
        { "redis://127.0.0.1:6379/0", 1, 0, "127.0.0.1", 6379, 0, NULL, NULL },
        { "redis://cache.internal", 1, 0, "cache.internal", 6379, 0, NULL, NULL },
        { "redis://redis:6380", 1, 0, "redis", 6380, 0, NULL, NULL },
        { "redis://h:1/15", 1, 0, "h", 1, 15, NULL, NULL },
        { "redis://h/3", 1, 0, "h", 6379, 3, NULL, NULL },
        { "redis://h/", 1, 0, "h", 6379, 0, NULL, NULL },
        { "redis://[::1]:7000/2", 1, 0, "::1", 7000, 2, NULL, NULL },
        { "redis://[::1]", 1, 0, "::1", 6379, 0, NULL, NULL },
        { "redis://alice:s3cr%40t@h:1/0", 1, 0, "h", 1, 0, "alice", "s3cr@t" },
        { "redis://:pw@h", 1, 0, "h", 6379, 0, NULL, "pw" },
        { "redis://u:p@ss@h", 1, 0, "h", 6379, 0, "u", "p@ss" },
        { "unix:///run/redis.sock", 1, 1, "/run/redis.sock", 0, 0, NULL, NULL },
        { "unix:///run/redis.sock?db=4", 1, 1, "/run/redis.sock", 0, 4, NULL, NULL },
        { "rediss://h", 1, 0, "h", 6379, 0, NULL, NULL },
        { "rediss://u:p@h:6380/2", 1, 0, "h", 6380, 2, "u", "p" },
        { "redisss://h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "http://h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h:0", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h:65536", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h:", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h:x", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h/x", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h/99999", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://h?db=1", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://pw@h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://u:%zz@h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://u:%00@h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://u:%4@h", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://[::1", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://[zz]:1", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://[::1]x", 0, 0, NULL, 0, 0, NULL, NULL },
        { "redis://ho st", 0, 0, NULL, 0, 0, NULL, NULL },
        { "unix://relative.sock", 0, 0, NULL, 0, 0, NULL, NULL },
        { "unix:///", 0, 0, NULL, 0, 0, NULL, NULL },
        { "unix:///s?db=x", 0, 0, NULL, 0, 0, NULL, NULL },
        { "unix:///s?foo=1", 0, 0, NULL, 0, 0, NULL, NULL },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[1024], *err;
        struct conf *c;
        snprintf(text, sizeof text, MINIMAL_HEAD MINIMAL_ROUTES "redis: { url: \"%s\" }\n",
                 t[i].url);
        c = load_text(text, &err);
        if (!t[i].ok) {
            if (c)
                fail_msg("redis url '%s' accepted", t[i].url);
            if (!strstr(err, "redis.url: bad redis url: "))
                fail_msg("redis url '%s': %s", t[i].url, err);
            /* The URL may hold a password: never echoed. */
            if (strchr(t[i].url, '@'))
                assert_null(strstr(err, t[i].url));
            free(err);
            continue;
        }
        if (!c)
            fail_msg("redis url '%s': %s", t[i].url, err);
        assert_string_equal(c->redis.url, t[i].url);
        assert_int_equal(c->redis.is_unix, t[i].is_unix);
        assert_string_equal(c->redis.host, t[i].host);
        assert_int_equal(c->redis.port, t[i].port);
        assert_int_equal(c->redis.db, t[i].db);
        if (t[i].user)
            assert_string_equal(c->redis.user, t[i].user);
        else
            assert_null(c->redis.user);
        if (t[i].password)
            assert_string_equal(c->redis.password, t[i].password);
        else
            assert_null(c->redis.password);
        conf_release(c);
    }
}

static void test_match_normalised(void **state)
{
    char *err;
    struct conf *c = load_text(MINIMAL_HEAD "routes:\n"
        "  - { name: a, match: { path: //api//v1/, methods: [get, Post], host: API.Example.COM:8443 }, upstream: api }\n"
        "  - { name: b, match: { path: /x/, host: \"[::1]:80\" }, upstream: api }\n"
        "  - { name: c, match: { path: ///, host: Local_Host }, upstream: api }\n"
        "  - { name: d, match: { path: /a/.../b, host: \"[fe80::1]\" }, upstream: api }\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->routes[0].path, "/api/v1");
    assert_int_equal(c->routes[0].pathlen, 7);
    assert_int_equal(c->routes[0].nmethods, 2);
    assert_string_equal(c->routes[0].methods[0], "GET");
    assert_string_equal(c->routes[0].methods[1], "POST");
    assert_string_equal(c->routes[0].host, "api.example.com");
    assert_string_equal(c->routes[1].path, "/x");
    assert_string_equal(c->routes[1].host, "[::1]");
    assert_string_equal(c->routes[2].path, "/");
    assert_int_equal(c->routes[2].pathlen, 1);
    assert_string_equal(c->routes[2].host, "local_host");
    assert_string_equal(c->routes[3].path, "/a/.../b");      /* "..." is a name */
    assert_string_equal(c->routes[3].host, "[fe80::1]");
    assert_int_equal(c->routes[3].nlimits, 0);
    conf_release(c);
}

static void test_limit_params(void **state)
{
    static const struct {
        const char *lim; enum limiter_algo algo; int64_t limit, window_ms, interval_us;
    } t[] = {
        { "algorithm: gcra, rate: 100/10s, burst: 5", LIMITER_GCRA, 5, 500, 100000 },
        { "algorithm: token_bucket, rate: 3/s, burst: 3", LIMITER_TOKEN_BUCKET, 3, 999, 333333 },
        { "algorithm: gcra, rate: 10000000/s, burst: 1", LIMITER_GCRA, 1, 1, 1 },
        { "algorithm: token_bucket, rate: 1/d, burst: 2", LIMITER_TOKEN_BUCKET, 2, 172800000, 86400000000LL },
        { "algorithm: sliding_window, limit: 100, window: 1m", LIMITER_SLIDING_WINDOW, 100, 60000, 0 },
        { "algorithm: fixed_window, limit: 1, window: 500ms", LIMITER_FIXED_WINDOW, 1, 500, 0 },
        { "algorithm: sliding_log, limit: 1000000000, window: 3650d", LIMITER_SLIDING_LOG, 1000000000, 315360000000LL, 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[1024], *err;
        struct conf *c;
        const struct limiter_params *p;
        snprintf(text, sizeof text, MINIMAL_HEAD "routes:\n  - name: r\n    match: { path: / }\n"
                 "    upstream: api\n    limits: [ { name: l, %s, key: [ip, method, path,"
                 " \"query:q\", \"cookie:sid\"] } ]\n", t[i].lim);
        c = load_text(text, &err);
        if (!c)
            fail_msg("'%s': %s", t[i].lim, err);
        p = &c->routes[0].limits[0].params;
        if (p->algo != t[i].algo || p->limit != t[i].limit || p->window_ms != t[i].window_ms ||
            p->interval_us != t[i].interval_us)
            fail_msg("'%s': algo %d limit %lld window_ms %lld interval_us %lld", t[i].lim,
                     p->algo, (long long)p->limit, (long long)p->window_ms,
                     (long long)p->interval_us);
        assert_int_equal(c->routes[0].limits[0].nkeys, 5);
        assert_int_equal(c->routes[0].limits[0].keys[1].kind, CONF_KEY_METHOD);
        assert_int_equal(c->routes[0].limits[0].keys[2].kind, CONF_KEY_PATH);
        assert_int_equal(c->routes[0].limits[0].keys[3].kind, CONF_KEY_QUERY);
        assert_string_equal(c->routes[0].limits[0].keys[3].arg, "q");
        assert_int_equal(c->routes[0].limits[0].keys[4].kind, CONF_KEY_COOKIE);
        assert_string_equal(c->routes[0].limits[0].keys[4].arg, "sid");
        conf_release(c);
    }
}

/* ip/N and ip/N/M: one length for one family, or both; bad ones fail at
 * their place. */
static void test_ip_prefix_keys(void **state)
{
    static const struct { const char *src; int net, b4, b6; const char *err; } t[] = {
        { "ip", 0, 0, 0, NULL },
        { "ip/24", 1, 24, 128, NULL },
        { "ip/64", 1, 32, 64, NULL },
        { "ip/0", 1, 0, 128, NULL },
        { "ip/32", 1, 32, 128, NULL },
        { "ip/33", 1, 32, 33, NULL },
        { "ip/128", 1, 32, 128, NULL },
        { "ip/24/64", 1, 24, 64, NULL },
        { "ip/0/0", 1, 0, 0, NULL },
        { "ip/32/128", 1, 32, 128, NULL },
        { "ip/129", 0, 0, 0, "ip/N takes a prefix length 0..128" },
        { "ip/33/64", 0, 0, 0, "ip/N takes" },
        { "ip/24/129", 0, 0, 0, "ip/N takes" },
        { "ip/", 0, 0, 0, "ip/N takes" },
        { "ip/24/", 0, 0, 0, "ip/N takes" },
        { "ip//64", 0, 0, 0, "ip/N takes" },
        { "ip/-1", 0, 0, 0, "ip/N takes" },
        { "ip/+24", 0, 0, 0, "ip/N takes" },
        { "ip/0024", 0, 0, 0, "ip/N takes" },
        { "ip/24/64/8", 0, 0, 0, "ip/N takes" },
        { "ip/24 ", 0, 0, 0, "ip/N takes" },
        { "ip:24", 0, 0, 0, "use ip, ip/N" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[1024], *err, want[256];
        snprintf(text, sizeof text, MINIMAL_HEAD "routes:\n  - name: r\n    match: { path: / }\n"
                 "    upstream: api\n    limits: [ { name: l, algorithm: fixed_window, limit: 1,"
                 " window: 1m, key: [method, \"%s\"] } ]\n", t[i].src);
        struct conf *c = load_text(text, &err);
        if (t[i].err != NULL) {
            snprintf(want, sizeof want, "7:87: routes[0].limits[0].key[1]: bad key source '%s' (",
                     t[i].src);
            if (c != NULL || strncmp(err, want, strlen(want)) || !strstr(err, t[i].err))
                fail_msg("'%s': expected an error '%s...%s', got '%s'", t[i].src, want,
                         t[i].err, err ? err : "(loaded)");
            free(err);
            continue;
        }
        if (!c)
            fail_msg("'%s': %s", t[i].src, err);
        const struct conf_keysrc *ks = &c->routes[0].limits[0].keys[1];
        assert_int_equal(ks->kind, CONF_KEY_IP);
        if (ks->net != t[i].net || (ks->net && (ks->bits4 != t[i].b4 || ks->bits6 != t[i].b6)))
            fail_msg("'%s': net %d bits4 %d bits6 %d", t[i].src, ks->net, ks->bits4, ks->bits6);
        conf_release(c);
    }
}

static void test_other_keys(void **state)
{
    char *err;
    struct conf *c = load_text(MINIMAL_HEAD MINIMAL_ROUTES
        "workers: ${SLUICE_TEST_UNSET_VAR:-auto}\nmax_connections: 0\nshutdown_timeout: 250ms\n"
        "client: { max_header_bytes: 64k, max_body_bytes: 10m, header_timeout: 500ms,"
        " idle_timeout: 2m, body_timeout: 1h }\n"
        "redis: { on_error: local, prefix: \"\", timeout: 1s }\n", &err);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->workers, cpus < 1 ? 1 : cpus);
    assert_int_equal(c->max_connections, 0);
    assert_int_equal(c->shutdown_timeout_ms, 250);
    assert_int_equal(c->client.max_header_bytes, 65536);
    assert_int_equal(c->client.max_body_bytes, 10 << 20);
    assert_int_equal(c->client.header_timeout_ms, 500);
    assert_int_equal(c->client.idle_timeout_ms, 120000);
    assert_int_equal(c->client.body_timeout_ms, 3600000);
    assert_int_equal(c->redis.on_error, CONF_ON_ERROR_LOCAL);
    assert_string_equal(c->redis.prefix, "");
    assert_int_equal(c->redis.timeout_ms, 1000);
    assert_string_equal(c->redis.url, "redis://127.0.0.1:6379/0");   /* default kept */
    assert_int_equal(c->ntrusted, 0);
    conf_release(c);

    /* localhost and IPv6 listen addresses. */
    c = load_text("listen: localhost:80\nupstreams: { a: { servers: [\"[::1]:1\", 10.0.0.1:2] } }\n"
                  "routes: [ { name: r, match: { path: / }, upstream: a } ]\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->listen.text, "localhost:80");
    assert_int_equal(c->listen.ss.ss_family, AF_INET);
    assert_int_equal(c->listen.sslen, sizeof(struct sockaddr_in));
    assert_int_equal(c->upstreams[0].nservers, 2);
    assert_int_equal(c->upstreams[0].servers[0].sslen, sizeof(struct sockaddr_in6));
    conf_release(c);
}

/* The operations keys at top level, with values other than their defaults. */
static void test_ops_keys(void **state)
{
    char *err;
    const struct sockaddr_in6 *s6;
    struct sockaddr_storage in = sa("192.0.2.77"), out = sa("192.0.3.1");
    struct conf *c = load_text(MINIMAL_HEAD MINIMAL_ROUTES
        "backend: memory\nmemory: { max_keys: 100000000 }\ndeny_cache: { max_keys: 0 }\n"
        "admin: { listen: \"[::1]:9901\" }\naccess_log: /var/log/sluice/access.log\n"
        "allow: [192.0.2.0/24, \"2001:db8::/32\"]\n"
        "redis: { on_error: local }\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->backend, CONF_BACKEND_MEMORY);
    assert_int_equal(c->memory_max_keys, 100000000);
    assert_int_equal(c->deny_cache_max_keys, 0);
    assert_int_equal(c->has_admin, 1);
    assert_string_equal(c->admin_listen.text, "[::1]:9901");
    s6 = (const struct sockaddr_in6 *)&c->admin_listen.ss;
    assert_int_equal(s6->sin6_family, AF_INET6);
    assert_int_equal(ntohs(s6->sin6_port), 9901);
    assert_int_equal(c->admin_listen.sslen, sizeof(struct sockaddr_in6));
    assert_string_equal(c->access_log, "/var/log/sluice/access.log");
    assert_int_equal(c->nallow, 2);
    assert_int_equal(c->allow[0].bits, 24);
    assert_int_equal(c->allow[1].family, AF_INET6);
    assert_int_equal(conf_cidr_match(c->allow, c->nallow, (struct sockaddr *)&in), 1);
    assert_int_equal(conf_cidr_match(c->allow, c->nallow, (struct sockaddr *)&out), 0);
    assert_int_equal(c->ntrusted, 0);           /* allow is not trusted_proxies */
    /* With the memory backend an explicit on_error is accepted (and unused). */
    assert_int_equal(c->redis.on_error, CONF_ON_ERROR_LOCAL);
    conf_release(c);

    /* stdout, off, the other bounds, and the defaults when absent. */
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "access_log: stdout\nbackend: redis\n"
                  "memory: { max_keys: 1 }\ndeny_cache: { max_keys: 100000000 }\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->access_log, "stdout");
    assert_int_equal(c->backend, CONF_BACKEND_REDIS);
    assert_int_equal(c->memory_max_keys, 1);
    assert_int_equal(c->deny_cache_max_keys, 100000000);
    conf_release(c);
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "access_log: \"off\"\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_null(c->access_log);
    assert_int_equal(c->has_admin, 0);
    assert_int_equal(c->memory_max_keys, 1000000);
    assert_int_equal(c->deny_cache_max_keys, 100000);
    assert_int_equal(c->backend, CONF_BACKEND_REDIS);
    assert_int_equal(c->nallow, 0);
    assert_null(c->allow);
    conf_release(c);

    /* The admin port differs from listen's: fine on the same host. */
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "admin: { listen: localhost:8081 }\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->has_admin, 1);
    assert_int_equal(c->admin_listen.ss.ss_family, AF_INET);
    conf_release(c);
}

/* Match path against route r alone (route.c's matcher, as the proxy runs it). */
static int meets(const struct conf_route *r, const char *path, struct route_captures *caps)
{
    struct conf one = { .routes = (struct conf_route *)r, .nroutes = 1 };
    return route_match(&one, path, strlen(path), "GET", 3, NULL, 0, caps) == r;
}

/* path_regex, capture:N, allow, cost, headers and upgrade on routes. */
static void test_route_keys(void **state)
{
    char *err;
    struct route_captures m;
    const struct conf_route *r;
    struct sockaddr_storage peer = sa("10.1.2.3");
    struct conf *c = load_text(MINIMAL_HEAD "routes:\n"
        "  - name: users\n"
        "    match: { path_regex: \"^/users/([^/]+)/(posts|likes)/([0-9]{1,20})$\", methods: [GET] }\n"
        "    upstream: api\n"
        "    allow: [10.0.0.0/8]\n"
        "    cost: 1000000\n"
        "    headers: ietf\n"
        "    upgrade: true\n"
        "    limits:\n"
        "      - { name: per-user, algorithm: gcra, rate: 1/s, burst: 2, key: [\"capture:1\", method, \"capture:3\"] }\n"
        "  - { name: a, match: { path: /a }, upstream: api, headers: legacy, upgrade: false }\n"
        "  - { name: b, match: { path_regex: \"^/b\" }, upstream: api, headers: none, cost: \"${SLUICE_TEST_UNSET_VAR:-7}\" }\n"
        "  - { name: c, match: { path_regex: \"^/(a)(b)(c)(d)(e)(f)(g)(h)(i)$\" }, upstream: api,"
        " limits: [ { name: l, algorithm: fixed_window, limit: 1, window: 1s, key: [\"capture:9\"] } ] }\n"
        "  - { name: d, match: { path: /d }, upstream: api, upgrade: \"${SLUICE_TEST_UNSET_VAR:-true}\" }\n", &err);
    if (!c)
        fail_msg("%s", err);
    r = &c->routes[0];
    assert_null(r->path);
    assert_int_equal(r->pathlen, 0);
    assert_string_equal(r->path_regex, "^/users/([^/]+)/(posts|likes)/([0-9]{1,20})$");
    assert_int_equal(r->ncaptures, 3);
    assert_int_equal(r->nmethods, 1);
    assert_int_equal(r->nallow, 1);
    assert_int_equal(conf_cidr_match(r->allow, r->nallow, (struct sockaddr *)&peer), 1);
    assert_int_equal(r->cost, 1000000);
    assert_int_equal(r->headers, CONF_HEADERS_IETF);
    assert_int_equal(r->upgrade, 1);
    assert_int_equal(r->limits[0].nkeys, 3);
    assert_int_equal(r->limits[0].keys[0].kind, CONF_KEY_CAPTURE);
    assert_int_equal(r->limits[0].keys[0].capture, 1);
    assert_null(r->limits[0].keys[0].arg);
    assert_int_equal(r->limits[0].keys[1].kind, CONF_KEY_METHOD);
    assert_int_equal(r->limits[0].keys[2].capture, 3);
    /* The compiled regex is the one written, extended syntax, with groups. */
    assert_true(meets(r, "/users/42/likes/7", &m));
    assert_int_equal(m.n, 4);
    assert_int_equal(m.off[1], 7);
    assert_int_equal(m.len[1], 2);
    assert_int_equal(m.off[3], 16);
    assert_false(meets(r, "/users/42/likes/x", &m));
    assert_false(meets(r, "/users/42/posts/123456789012345678901", &m));

    r = &c->routes[1];
    assert_string_equal(r->path, "/a");
    assert_null(r->regex);
    assert_null(r->path_regex);
    assert_int_equal(r->ncaptures, 0);
    assert_int_equal(r->headers, CONF_HEADERS_LEGACY);
    assert_int_equal(r->upgrade, 0);
    assert_int_equal(r->cost, 1);
    assert_int_equal(r->nallow, 0);
    r = &c->routes[2];
    assert_int_equal(r->headers, CONF_HEADERS_NONE);
    assert_int_equal(r->cost, 7);
    assert_int_equal(r->ncaptures, 0);
    assert_true(meets(r, "/bcd", NULL));
    r = &c->routes[3];
    assert_int_equal(r->ncaptures, 9);
    assert_int_equal(r->limits[0].keys[0].capture, 9);
    assert_int_equal(c->routes[4].upgrade, 1);
    assert_int_equal(c->routes[4].headers, CONF_HEADERS_FULL);
    conf_release(c);
}

/* Patterns people write pass the guards; the weight bound is exact. */
static void test_regex_bounds(void **state)
{
    static const struct { const char *re; const char *why; } t[] = {   /* why NULL: ok */
        { "^/api/v[0-9]+/(users|teams)/([^/]+)", NULL },
        { "^/[a-z]{2,8}/[0-9]{1,20}$", NULL },
        { "^/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", NULL },
        { "^/[]{(*]x", NULL },                  /* ']' first in a bracket is literal */
        { "^/[[:alpha:]]{1,251}", NULL },       /* ^ 4, / 1, [..] 251 = 256 */
        { "^/[[:alpha:]]{1,252}", "expand beyond 256" },
        { "(^){64}", NULL },                    /* anchors and empty groups weigh 4 */
        { "(^){65}", "expand beyond 256" },
        { "a(){64}", "expand beyond 256" },
        { "a{256}", NULL },
        { "a{257}", "expand beyond 256" },
        { "(ab){1,128}", NULL },                /* 2 * 128 */
        { "(ab){1,129}", "expand beyond 256" },
        { "((a){1,16}){1,16}", NULL },          /* 16 * 16 */
        { "((a){1,16}){1,17}", "expand beyond 256" },
        { "a\\{1,5000}", NULL },              /* an escaped brace is a literal */
        { "a{0,256}", NULL },
        { "a{,256}", "write {0,N}, not {,N}" }, /* glibc read {0,n}, PCRE2 10.42 text */
        { "a{,257}", "write {0,N}, not {,N}" },
        { "a+?", NULL },                        /* lazy */
        { "a*+b", NULL },                       /* possessive */
        { "^/(?:ab){1,60}?$", NULL },
        { "a+?+", "a quantifier follows a quantifier" },
        { "a++{2}", "a quantifier follows a quantifier" },
        { "(a+){128}", NULL },                  /* '+' doubles: 2 * 128 */
        { "(a+){129}", "expand beyond 256" },
        { "a+{2}", "a quantifier follows a quantifier" },  /* POSIX: undefined */
        { "a{2}{2}", "a quantifier follows a quantifier" },
        { "^/a++++++++++++++++++++++++", "a quantifier follows a quantifier" },
        { "(a*)*(b?)+", NULL },                 /* on groups, not stacked */
        { "a|*b", "bad regex" },                /* nothing to repeat */
        { "a*{,}", "a quantifier follows a quantifier" },  /* glibc takes {,} too */
        { "a{x", NULL },                        /* Perl: a '{' that starts no bound is text */
        { "(a{1,200}(b{1,100}", "expand beyond 256" },  /* unclosed, weighed first */
        { "(a{1,2}(b{1,2}", "missing closing parenthesis" },
        { "a{99999999999999999999}", "bad regex" },
        { "^/[a", "bad regex" },
        { "a{2,1}", "bad regex" },
        { "\\", "bad regex" },
        { "(a)\\1", "backreferences are not supported" },
        { "(a)\\g1", "backreferences are not supported" },
        { "(?<n>a)\\k<n>", "backreferences are not supported" },
        { "(?P<n>a)(?P=n)", "backreferences are not supported" },
        { "\\<v1\\>", "not a word boundary (write \\b)" },
        { "\\bv1\\b", NULL },
        { "(?:a)(b)", NULL },
        { "(((((((((a)))))))))", NULL },        /* 9 nested groups */
        { "((((((((((a))))))))))", "more than 9 groups" },
        { "(((((((((((((((((((((((((((((((((a{1,32767})))))))))))))))))))))))))))))))))",
          "more than 9 groups" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[1024], *err = NULL;
        struct conf *c;
        snprintf(text, sizeof text, MINIMAL_HEAD "routes: [ { name: r, match: { path_regex: "
                 "'%s' }, upstream: api } ]\n", t[i].re);
        c = load_text(text, &err);
        if (!t[i].why && !c)
            fail_msg("regex '%s': %s", t[i].re, err);
        if (t[i].why && c)
            fail_msg("regex '%s' accepted", t[i].re);
        if (c)
            conf_release(c);
        else if (!strstr(err, "routes[0].match.path_regex: ") || !strstr(err, t[i].why))
            fail_msg("regex '%s': %s", t[i].re, err);
        free(err);
    }
}

/* shadow, cost_header, count_status, status and message on limits. */
static void test_limit_keys(void **state)
{
    char *err, msg[300];
    const struct conf_limit *l;
    struct conf *c;
    c = load_text(MINIMAL_HEAD "routes:\n  - name: login\n    match: { path: /login }\n"
        "    upstream: api\n    limits:\n"
        "      - { name: a, algorithm: sliding_log, limit: 5, window: 15m, key: [ip],"
        " shadow: true, count_status: [401, 403, 5xx], status: 503, message: \"slow down \\u00e9\" }\n"
        "      - { name: b, algorithm: token_bucket, rate: 1/s, burst: 1, key: [ip],"
        " cost_header: X-Cost, count_status: [1xx, 2xx, 3xx, 4xx, 599, 100], status: 400 }\n"
        "      - { name: c, algorithm: fixed_window, limit: 1, window: 1s, key: [ip],"
        " shadow: false, status: 599 }\n", &err);
    if (!c)
        fail_msg("%s", err);
    l = &c->routes[0].limits[0];
    assert_int_equal(l->shadow, 1);
    assert_int_equal(l->has_count_status, 1);
    for (int st = 0; st < CONF_MAX_STATUS; st++)
        if (l->count_status[st] != (st == 401 || st == 403 || (st >= 500 && st <= 599)))
            fail_msg("limit a: count_status[%d] = %d", st, l->count_status[st]);
    assert_int_equal(l->status, 503);
    assert_string_equal(l->message, "slow down \xc3\xa9");
    assert_null(l->cost_header);
    l = &c->routes[0].limits[1];
    assert_int_equal(l->shadow, 0);
    assert_string_equal(l->cost_header, "X-Cost");
    assert_int_equal(l->has_count_status, 1);
    for (int st = 0; st < CONF_MAX_STATUS; st++)
        if (l->count_status[st] != ((st >= 100 && st <= 499) || st == 599))
            fail_msg("limit b: count_status[%d] = %d", st, l->count_status[st]);
    assert_int_equal(l->status, 400);
    assert_null(l->message);
    l = &c->routes[0].limits[2];
    assert_int_equal(l->shadow, 0);
    assert_int_equal(l->has_count_status, 0);
    for (int st = 0; st < CONF_MAX_STATUS; st++)
        assert_int_equal(l->count_status[st], 0);
    assert_int_equal(l->status, 599);
    conf_release(c);

    /* A message of exactly 256 bytes is fine; an empty count_status is not. */
    memset(msg, 'm', 256);
    msg[256] = '\0';
    {
        char text[1024];
        snprintf(text, sizeof text, MINIMAL_HEAD "routes: [ { name: r, match: { path: / },"
                 " upstream: api, limits: [ { name: l, algorithm: gcra, rate: 1/s, burst: 1,"
                 " key: [ip], message: %s } ] } ]\n", msg);
        c = load_text(text, &err);
        if (!c)
            fail_msg("%s", err);
        assert_int_equal(strlen(c->routes[0].limits[0].message), 256);
        conf_release(c);
    }
    c = load_text(MINIMAL_HEAD "routes: [ { name: r, match: { path: / }, upstream: api,"
                  " limits: [ { name: l, algorithm: gcra, rate: 1/s, burst: 1, key: [ip],"
                  " count_status: [] } ] } ]\n", &err);
    assert_null(c);
    assert_non_null(strstr(err, "routes[0].limits[0].count_status: needs at least one status"));
    free(err);
    c = load_text(MINIMAL_HEAD "routes: [ { name: r, match: { path: / }, upstream: api,"
                  " limits: [ { name: l, algorithm: gcra, rate: 1/s, burst: 1, key: [ip],"
                  " message: \"a\\nb\" } ] } ]\n", &err);
    assert_null(c);
    assert_non_null(strstr(err, "routes[0].limits[0].message: message has a control byte"));
    free(err);
}

/* Names resolve at load time (getaddrinfo, first result); numbers and
 * localhost take the fast path; numeric shorthands are not names. */
static void test_hostnames(void **state)
{
    char host[256], text[1024], *err;
    struct addrinfo hints, *res;
    struct conf *c;
    static const char *const bad[] = {
        "127.1:80", "0x7f.0.0.1:80", "10.0.0.256:80", "-api:80", "api..x:80", ".api:80",
        "a b:80", "api_\xc3\xa9:80", "9000:80", "api.123:80", "api.:80.", "api-.:80:1", "[api]:80", "[localhost]:80", "api:", "api:http",
    };

    /* localhost is 127.0.0.1 whatever the resolver's order. */
    c = load_text("listen: localhost:8080\nupstreams: { a: { servers: [localhost:9000] } }\n"
                  "routes: [ { name: r, match: { path: / }, upstream: a } ]\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->upstreams[0].servers[0].ss.ss_family, AF_INET);
    assert_int_equal(((struct sockaddr_in *)&c->upstreams[0].servers[0].ss)->sin_addr.s_addr,
                     htonl(INADDR_LOOPBACK));
    assert_string_equal(c->upstreams[0].servers[0].text, "localhost:9000");
    conf_release(c);

    /* This machine's own name, compared with what getaddrinfo says of it
     * (as a docker-compose service name would be). */
    assert_int_equal(gethostname(host, sizeof host), 0);
    host[sizeof host - 1] = '\0';
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ==
            strlen(host) && getaddrinfo(host, "9000", &hints, &res) == 0) {
        snprintf(text, sizeof text, MINIMAL_HEAD "routes: [ { name: r, match: { path: / },"
                 " upstream: api } ]\nadmin: { listen: \"%s:9901\" }\n", host);
        c = load_text(text, &err);
        if (!c)
            fail_msg("%s", err);
        assert_int_equal(c->admin_listen.sslen, res->ai_addrlen);
        assert_int_equal(c->admin_listen.ss.ss_family, res->ai_family);
        if (res->ai_family == AF_INET)
            assert_memory_equal(&((struct sockaddr_in *)&c->admin_listen.ss)->sin_addr,
                                &((struct sockaddr_in *)res->ai_addr)->sin_addr, 4);
        assert_int_equal(ntohs(((struct sockaddr_in *)&c->admin_listen.ss)->sin_port), 9901);
        conf_release(c);
        freeaddrinfo(res);
    } else {
        print_message("hostname '%s' does not resolve here: that case skipped\n", host);
    }

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, MINIMAL_HEAD MINIMAL_ROUTES "admin: { listen: \"%s\" }\n",
                 bad[i]);
        c = load_text(text, &err);
        if (c)
            fail_msg("address '%s' accepted", bad[i]);
        if (!strstr(err, "admin.listen: bad address '"))
            fail_msg("address '%s': %s", bad[i], err);
        free(err);
    }
    /* A name at the length limit is looked up, not refused as too long. */
    memset(host, 'a', 253);
    for (int i = 63; i < 253; i += 64)
        host[i] = '.';
    host[253] = '\0';
    snprintf(text, sizeof text, MINIMAL_HEAD MINIMAL_ROUTES "admin: { listen: \"%s.invalid:1\" }\n",
             host + 8);
    c = load_text(text, &err);
    assert_null(c);
    assert_non_null(strstr(err, "admin.listen: cannot resolve '"));
    free(err);
}

/* conf/standalone.yaml: the memory backend example. */
static void test_standalone(void **state)
{
    char *err = NULL;
    struct conf *c = conf_load(STANDALONE, &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->backend, CONF_BACKEND_MEMORY);
    assert_int_equal(c->memory_max_keys, 1000000);
    assert_string_equal(c->listen.text, "127.0.0.1:8080");
    assert_string_equal(c->upstreams[0].servers[0].text, "127.0.0.1:9000");
    assert_int_equal(c->has_admin, 1);
    assert_string_equal(c->admin_listen.text, "127.0.0.1:9901");
    assert_string_equal(c->access_log, "stdout");
    assert_int_equal(c->nroutes, 2);
    assert_int_equal(c->routes[0].limits[0].params.algo, LIMITER_TOKEN_BUCKET);
    assert_int_equal(c->routes[1].limits[0].params.algo, LIMITER_FIXED_WINDOW);
    conf_release(c);
}

static void test_missing_file(void **state)
{
    char *err = NULL;
    assert_null(conf_load("data/conf/does-not-exist.yaml", &err));
    assert_string_equal(err, "data/conf/does-not-exist.yaml: cannot read: No such file or directory");
    free(err);
    assert_null(conf_load("data/conf", &err));                 /* a directory */
    assert_non_null(strstr(err, "data/conf: cannot read: "));
    free(err);
    assert_null(conf_load("data/conf/bad_empty.yaml", NULL));  /* err is optional */
}

/* Sizes at the read buffer's edges: 16 KiB (its first size), exactly 4 MiB
 * (the limit) and one byte more. */
static void test_file_sizes(void **state)
{
    static const size_t sizes[] = { 16384, 16385, 4u << 20, (4u << 20) + 1 };
    const char *head = MINIMAL_HEAD MINIMAL_ROUTES;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i], hl = strlen(head);
        char *text = malloc(n), *path, *err = NULL;
        struct conf *c;
        assert_non_null(text);
        memcpy(text, head, hl);
        text[hl] = '#';                         /* the rest is one comment */
        memset(text + hl + 1, 'x', n - hl - 2);
        text[n - 1] = '\n';
        path = tmp_write(text, n);
        c = conf_load(path, &err);
        if (n <= (4u << 20)) {
            if (!c)
                fail_msg("%zu bytes: %s", n, err);
            assert_int_equal(c->nroutes, 1);
            conf_release(c);
        } else {
            assert_null(c);
            assert_non_null(strstr(err, ": cannot read: larger than 4 MiB"));
            free(err);
        }
        unlink(path);
        free(path);
        free(text);
    }
}

static void test_refcount(void **state)
{
    char *err = NULL;
    struct conf *c = conf_load(REFERENCE, &err);
    assert_non_null(c);
    assert_int_equal(c->refs, 1);
    conf_retain(c);
    conf_retain(c);
    assert_int_equal(c->refs, 3);
    conf_release(c);
    conf_release(c);
    assert_int_equal(c->refs, 1);
    assert_string_equal(c->routes[3].name, "default");        /* still alive */
    conf_release(c);                                           /* freed: valgrind/ASan check */
    conf_release(NULL);
}

/* Every prefix of the reference file and bounded random mutations of it:
 * each load must either succeed or give one well-formed message. */
static void check_robust(const char *text, size_t len)
{
    char *path = tmp_write(text, len), *err = NULL;
    struct conf *c = conf_load(path, &err);
    if (c) {
        assert_null(err);
        conf_release(c);
    } else {
        size_t pl = strlen(path);
        assert_non_null(err);
        assert_memory_equal(err, path, pl);
        assert_int_equal(err[pl], ':');
        assert_null(strchr(err, '\n'));
        free(err);
    }
    unlink(path);
    free(path);
}

static void test_robust(void **state)
{
    FILE *f = fopen(REFERENCE, "rb");
    char buf[32768], mut[32768];
    size_t len;
    unsigned seed = 12345;
    static const char bytes[] = "{}[]:,-&*!|>'\"%@`#\n \t${}/0\xff\x80";
    assert_non_null(f);
    len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(len > 100 && len < sizeof buf);
    for (size_t n = 0; n <= len; n += 7)
        check_robust(buf, n);
    for (int i = 0; i < 1500; i++) {
        memcpy(mut, buf, len);
        for (int j = 0; j < 1 + i % 4; j++) {
            seed = seed * 1103515245u + 12345u;
            mut[(seed >> 8) % len] = bytes[(seed >> 20) % (sizeof bytes - 1)];
        }
        check_robust(mut, len);
    }
}

/* paths: defaults (sensitive, keep), each value, and a route the check lets
 * through: upper case in an escape or a bracket expression. */
/* upstreams.NAME.tls: absent is plain, {} is TLS with every default. */
static void test_tls_upstream_keys(void **state)
{
    char *err;
    struct conf *c = load_text("listen: 127.0.0.1:8080\n"
                               "upstreams:\n"
                               "  api: { servers: [127.0.0.1:9000] }\n"
                               "  dflt: { servers: [127.0.0.1:9443], tls: {} }\n"
                               "  full:\n"
                               "    servers: [127.0.0.1:9443]\n"
                               "    tls:\n"
                               "      ca_file: data/conf/tls_client.pem\n"
                               "      server_name: api.internal\n"
                               "      verify: false\n"
                               "      cert_file: data/conf/tls_client.pem\n"
                               "      key_file: data/conf/tls_client.key\n"
                               MINIMAL_ROUTES, &err);
    if (!c) fail_msg("%s", err);
    assert_null(c->upstreams[0].tls);
    assert_non_null(c->upstreams[1].tls);
    assert_int_equal(c->upstreams[1].tls->verify, 1);
    assert_null(c->upstreams[1].tls->ca_file);
    assert_null(c->upstreams[1].tls->server_name);
    assert_null(c->upstreams[1].tls->cert_file);
    const struct conf_tls_client *t = c->upstreams[2].tls;
    assert_int_equal(t->verify, 0);
    assert_string_equal(t->ca_file, "data/conf/tls_client.pem");
    assert_string_equal(t->server_name, "api.internal");
    assert_string_equal(t->cert_file, "data/conf/tls_client.pem");
    assert_string_equal(t->key_file, "data/conf/tls_client.key");
    conf_release(c);
    c = load_text("listen: 127.0.0.1:8080\n"
                  "upstreams: { api: { servers: [127.0.0.1:9443], tls: { server_name: 10.0.0.5 } } }\n"
                  MINIMAL_ROUTES, &err);
    assert_non_null(c);
    assert_string_equal(c->upstreams[0].tls->server_name, "10.0.0.5");
    conf_release(c);
}

static void test_paths_keys(void **state)
{
    char *err;
    struct conf *c = load_text(MINIMAL_HEAD MINIMAL_ROUTES, &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->paths.case_insensitive, 0);
    assert_int_equal(c->paths.strip_matrix, 0);
    conf_release(c);
    c = load_text(MINIMAL_HEAD MINIMAL_ROUTES "paths: { case: insensitive, matrix_params: strip }\n",
                  &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->paths.case_insensitive, 1);
    assert_int_equal(c->paths.strip_matrix, 1);
    conf_release(c);
    c = load_text(MINIMAL_HEAD "routes: [ { name: r, match: { path_regex: '^/[A-Z]+\\S[]A]x' },"
                  " upstream: api }, { name: s, match: { path: /API/a;b }, upstream: api } ]\n"
                  "paths: { case: insensitive, matrix_params: keep }\n", &err);
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->paths.case_insensitive, 1);
    assert_int_equal(c->paths.strip_matrix, 0);
    assert_string_equal(c->routes[1].path, "/API/a;b");
    conf_release(c);
    c = load_text(MINIMAL_HEAD "routes: [ { name: r, match: { path_regex: '^/a[' }, upstream: api } ]\n"
                  "paths: { case: insensitive }\n", &err);
    assert_null(c);                     /* regcomp refuses it; the check must not read past */
    free(err);
}

/* decision: its listen entries follow listen's, marked; a route without an
 * upstream is accepted then (and upstreams may be absent), its defaults. */
static void test_decision(void **state)
{
    char *err = NULL;
    struct conf *c = load_text("listen: [127.0.0.1:8080, 127.0.0.1:8082]\n"
                               "decision: { listen: 127.0.0.1:8081 }\n"
                               "routes: [ { name: r, match: { path: / } } ]\n", &err);
    assert_null(err);
    assert_non_null(c);
    assert_int_equal(c->nlistens, 3);
    assert_int_equal(c->listens[0].decision, 0);
    assert_int_equal(c->listens[1].decision, 0);
    assert_int_equal(c->listens[2].decision, 1);
    assert_string_equal(c->listens[2].addr.text, "127.0.0.1:8081");
    assert_string_equal(c->listen.text, "127.0.0.1:8080");
    assert_int_equal(c->decision.deny_status, 0);
    assert_string_equal(c->decision.path_prefix, "/decide");
    assert_null(c->routes[0].upstream);
    conf_release(c);

    c = load_text(MINIMAL_HEAD "decision:\n  listen: [ { address: 127.0.0.1:8081 } ]\n"
                  "  deny_status: 403\n  path_prefix: /auth/v1\n" MINIMAL_ROUTES, &err);
    assert_null(err);
    assert_int_equal(c->nlistens, 2);
    assert_int_equal(c->listens[1].decision, 1);
    assert_int_equal(c->decision.deny_status, 403);
    assert_string_equal(c->decision.path_prefix, "/auth/v1");
    assert_non_null(c->routes[0].upstream);
    conf_release(c);

    /* a decision service alone: no listen, no upstreams */
    c = load_text("decision: { listen: 127.0.0.1:8081 }\n"
                  "routes: [ { name: r, match: { path: / } } ]\n", &err);
    assert_null(err);
    assert_int_equal(c->nlistens, 1);
    assert_int_equal(c->listens[0].decision, 1);
    assert_string_equal(c->listen.text, "127.0.0.1:8081");
    conf_release(c);
}

/* One key per route (redis.pack_limits): which routes' limits become parts
 * of one key, and their tags (FNV-1a of the name, 32 bits). */
static void test_parts(void **state)
{
    static const struct {
        const char *redis, *limits;
        int parts;                      /* the route's limits are parts */
    } t[] = {
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: token_bucket, rate: 1/s, burst: 5, key: [ip] },"
              "  { name: c, algorithm: gcra, rate: 1/s, burst: 5, key: [ip] },"
              "  { name: d, algorithm: sliding_window, limit: 3, window: 1h, key: [ip] } ]", 1 },
        { "pack_limits: false",
              "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip] } ]", 0 },
        { "cluster: [\"127.0.0.1:7000\"]",
              "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip] } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [\"header:x\"] } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip],"
              "    on_missing_key: deny } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: concurrency, limit: 5, key: [ip] } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: sliding_log, limit: 5, window: 1m, key: [ip] } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip], shadow: true } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip], delay: 1s } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: gcra, rate: 1/s, burst: 5, key: [ip],"
              "    cost_header: X-Cost } ]", 0 },
        { "", "[ { name: a, algorithm: fixed_window, limit: 3, window: 1h, key: [ip] },"
              "  { name: b, algorithm: fixed_window, limit: 5, window: 1m, key: [ip],"
              "    count_status: [200] } ]", 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[2048], *err;
        snprintf(text, sizeof text, MINIMAL_HEAD "redis: { %s }\nroutes:\n  - name: r\n"
                 "    match: { path: / }\n    upstream: api\n    limits: %s\n",
                 t[i].redis, t[i].limits);
        struct conf *c = load_text(text, &err);
        if (!c)
            fail_msg("case %zu: %s", i, err);
        const struct conf_route *r = &c->routes[0];
        for (int j = 0; j < r->nlimits; j++) {
            uint32_t h = 2166136261u;
            for (const char *p = r->limits[j].name; *p; p++)
                h = (h ^ (unsigned char)*p) * 16777619u;
            if (r->limits[j].part != (t[i].parts ? h : 0))
                fail_msg("case %zu, limit %s: part %u", i, r->limits[j].name,
                         (unsigned)r->limits[j].part);
        }
        conf_release(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_rates),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_cidr),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_redis_urls),
        cmocka_unit_test(test_match_normalised),
        cmocka_unit_test(test_limit_params),
        cmocka_unit_test(test_ip_prefix_keys),
        cmocka_unit_test(test_other_keys),
        cmocka_unit_test(test_ops_keys),
        cmocka_unit_test(test_route_keys),
        cmocka_unit_test(test_regex_bounds),
        cmocka_unit_test(test_limit_keys),
        cmocka_unit_test(test_hostnames),
        cmocka_unit_test(test_standalone),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_file_sizes),
        cmocka_unit_test(test_refcount),
        cmocka_unit_test(test_robust),
        cmocka_unit_test(test_paths_keys),
        cmocka_unit_test(test_tls_upstream_keys),
        cmocka_unit_test(test_decision),
        cmocka_unit_test(test_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
