/* sluice - test_route_regex.c: unit tests for route.c's path_regex matching.
 *
 * The reading of a pattern (unanchored unless it says so, '.' any byte, '$'
 * only at the end, groups as capture:N sees them), the match limits (a
 * pattern that backtracks without end stops the route search with
 * over_limit set, in bounded CPU, on paths up to the largest head), and
 * matching from several threads at once. Paths are exactly sized heap
 * buffers without a NUL, so ASan reports any read past the path. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <cmocka.h>

#include "regex.h"
#include "route.h"

#define MAX_PATH 80000                  /* http_parser's head limit */
#define CPU_BOUND_MS 50.0               /* per match; JIT takes ~1 ms, ASan more */

static struct regex *compile(const char *pattern, int *groups)
{
    char why[160];
    struct regex *re = regex_compile(pattern, groups, why, sizeof why);
    if (re == NULL)
        fail_msg("'%s': %s", pattern, why);
    return re;
}

/* A copy of n bytes of s with no NUL after it. */
static char *exact(const char *s, size_t n)
{
    char *p = malloc(n ? n : 1);
    assert_non_null(p);
    memcpy(p, s, n);
    return p;
}

/* prefix, then unit repeated to make the path total bytes long (at most),
 * then tail; no NUL. */
static char *build(const char *prefix, const char *unit, const char *tail, size_t total,
                   size_t *len)
{
    size_t pl = strlen(prefix), ul = strlen(unit), tl = strlen(tail);
    size_t n = (total - pl - tl) / ul, k = 0;
    char *p = malloc(pl + n * ul + tl);
    assert_non_null(p);
    memcpy(p, prefix, pl);
    k = pl;
    for (size_t i = 0; i < n; i++, k += ul)
        memcpy(p + k, unit, ul);
    memcpy(p + k, tail, tl);
    *len = k + tl;
    return p;
}

static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- what a pattern means ---- */

struct sem_case {
    const char *pattern;
    const char *path;
    size_t pathlen;             /* 0: strlen(path) */
    int meets;
    const char *cap1;           /* group 1 as a string; NULL: unset (or no group) */
};

static const struct sem_case sem_cases[] = {
    /* Unanchored unless it says ^ / $ (docs/configuration.md: "not anchored unless it says ^"). */
    { "/login", "/a/login/b", 0, 1, NULL },
    { "^/login", "/a/login", 0, 0, NULL },
    { "/login$", "/a/login", 0, 1, NULL },
    { "/login$", "/a/login/", 0, 0, NULL },
    /* Leftmost match, greedy group: capture:1 as the POSIX matcher gave it. */
    { "/re/(.*)/login", "/a/re/x/y/login", 0, 1, "x/y" },
    { "/re/(.*)/login", "/re/p/re/q/login", 0, 1, "p/re/q" },
    { "/re/(.*)/login", "/re/x/logi", 0, 0, NULL },
    { "^/users/([^/]+)(/|$)", "/users/42", 0, 1, "42" },
    { "^/users/([^/]+)(/|$)", "/users/42/posts", 0, 1, "42" },
    { "^/users/([^/]+)(/|$)", "/users/", 0, 0, NULL },
    { "^/a(x)?b", "/ab", 0, 1, NULL },              /* group 1 took no part */
    { "^/a(x?)b", "/ab", 0, 1, "" },                /* took part, empty */
    { "^/(v1|v2)/(.*)$", "/v2/z", 0, 1, "v2" },
    /* '.' is any byte, a decoded %0A too; '$' is the end, not before a '\n'. */
    { "^/a.b$", "/a\nb", 0, 1, NULL },
    { "^/admin$", "/admin\n", 0, 0, NULL },
    { "^/admin$", "/admin", 0, 1, NULL },
    /* Bytes, not UTF-8: no validity check, one byte per '.'. */
    { "^/(..)$", "/\xff\xfe", 0, 1, "\xff\xfe" },
    { "^/caf..$", "/caf\xc3\xa9", 0, 1, NULL },
    /* Case-sensitive, like path: matching. */
    { "^/API", "/api", 0, 0, NULL },
    /* The length bounds the path: the bytes after it are not part of it. */
    { "^/abc$", "/abcdef", 4, 1, NULL },
    { "def", "/abcdef", 4, 0, NULL },
    /* Perl additions: lazy, possessive, non-capturing. */
    { "^/f/(.+?)/", "/f/a/b/", 0, 1, "a" },
    { "^/f/(?:x|y)/([0-9]++)$", "/f/y/123", 0, 1, "123" },
};

static void test_regex_semantics(void **state)
{
    for (size_t i = 0; i < sizeof sem_cases / sizeof sem_cases[0]; i++) {
        const struct sem_case *t = &sem_cases[i];
        int groups = 0;
        struct conf_route r = { .name = "r" };
        r.regex = compile(t->pattern, &groups);
        r.ncaptures = groups;
        struct conf c = { .routes = &r, .nroutes = 1 };
        size_t n = t->pathlen ? t->pathlen : strlen(t->path);
        char *path = exact(t->path, n);
        struct route_captures caps;
        memset(&caps, 0xa5, sizeof caps);
        const struct conf_route *got = route_match(&c, path, n, "GET", 3, NULL, 0, &caps);
        if ((got != NULL) != t->meets)
            fail_msg("case %zu '%s' on '%s': meets %d", i, t->pattern, t->path, got != NULL);
        assert_null(caps.over_limit);
        if (got && groups > 0) {
            assert_int_equal(caps.n, groups + 1);
            assert_true(caps.set & 1u);
            int set = (caps.set >> 1) & 1u;
            if (set != (t->cap1 != NULL))
                fail_msg("case %zu '%s' on '%s': group 1 set %d", i, t->pattern, t->path, set);
            if (set) {
                assert_true(caps.off[1] + caps.len[1] <= n);
                if (caps.len[1] != strlen(t->cap1) ||
                    memcmp(path + caps.off[1], t->cap1, caps.len[1]) != 0)
                    fail_msg("case %zu '%s' on '%s': group 1 '%.*s', expected '%s'", i,
                             t->pattern, t->path, (int)caps.len[1], path + caps.off[1],
                             t->cap1);
            }
        }
        free(path);
        regex_free(r.regex);
    }
}

/* Compile errors come back as PCRE2's text; the loader adds FILE:LINE:COL. */
static void test_regex_compile_errors(void **state)
{
    static const struct { const char *pattern, *why; } t[] = {
        { "^/users/([^/]+", "missing closing parenthesis" },
        { "a|*b", "quantifier does not follow a repeatable item" },
        { "(a)\\g1", "backreferences are not supported" },
        { "(?<n>a)\\k<n>", "backreferences are not supported" },
        { "(*UTF)^/a", "UTF is disabled" },     /* bytes only, whatever it says */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char why[160] = "";
        int groups = -1;
        struct regex *re = regex_compile(t[i].pattern, &groups, why, sizeof why);
        if (re != NULL)
            fail_msg("'%s' compiled", t[i].pattern);
        if (!strstr(why, t[i].why))
            fail_msg("'%s': '%s', expected '%s'", t[i].pattern, why, t[i].why);
    }
    int groups = -1;
    struct regex *re = compile("^/(a)(?:b)(?<c>c)", &groups);
    assert_int_equal(groups, 2);        /* (?:...) does not count, named groups do */
    regex_free(re);
    regex_free(NULL);
}

/* Debian's libpcre2 has JIT on the architectures sluice is built for; the
 * budgets assume it (the interpreter gets a tenth). (*NO_JIT) in a pattern
 * takes the interpreter's way, as a platform without JIT would. */
static void test_regex_jit(void **state)
{
    int groups;
    struct regex *re;
#if defined(__x86_64__) || defined(__aarch64__)
    re = compile("^/users/([^/]+)", &groups);
    assert_int_equal(regex_jit(re), 1);
    regex_free(re);
#endif
    re = compile("(*NO_JIT)^/users/([^/]+)", &groups);
    assert_int_equal(regex_jit(re), 0);
    regex_free(re);
}

/* ---- limits ---- */

static const struct limit_case {
    const char *pattern;
    const char *prefix, *unit, *tail;   /* the hostile path */
} limit_cases[] = {
    /* Quadratic: every "/re/" starts a try that scans to the end. */
    { "/re/(.*)/login", "", "/re", "/n" },
    /* Exponential: 120 nested choices between .* and a. */
    { "^/x/(.*|a){1,120}(b|c)", "/x/", "a", "" },
    { "(.*|a){1,120}(b|c)", "/", "a", "" },
    { "^/(a|aa)*$", "/", "a", "b" },
    { "^(/|a|b|ab)*x$", "", "/ab", "y" },
    { "/(.*)/(.*)/login", "", "/x", "n" },
};

/* Each hostile pattern, with JIT and in the interpreter, on paths up to the
 * largest head. */
static void test_regex_limits(void **state)
{
    static const size_t sizes[] = { 100, 1000, 15000, MAX_PATH };
    for (size_t i = 0; i < 2 * sizeof limit_cases / sizeof limit_cases[0]; i++) {
        const struct limit_case *t = &limit_cases[i / 2];
        char pattern[128];
        int groups = 0;
        struct conf_route routes[2] = {
            { .name = "re" },
            { .name = "all", .path = "/", .pathlen = 1 },
        };
        snprintf(pattern, sizeof pattern, "%s%s", i % 2 ? "(*NO_JIT)" : "", t->pattern);
        routes[0].regex = compile(pattern, &groups);
        routes[0].ncaptures = groups;
        struct conf c = { .routes = routes, .nroutes = 2 };
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t n;
            char *path = build(t->prefix, t->unit, t->tail, sizes[s], &n);
            struct route_captures caps;
            double t0 = thread_cpu_ms();
            const struct conf_route *r = route_match(&c, path, n, "GET", 3, NULL, 0, &caps);
            double ms = thread_cpu_ms() - t0;
            /* Either decided (no such route: the catch-all), or given up on:
             * then no later route, and over_limit names the one. */
            if (r == NULL)
                assert_ptr_equal(caps.over_limit, &routes[0]);
            else
                assert_ptr_equal(r, &routes[1]);
            if (ms > CPU_BOUND_MS)
                fail_msg("'%s' on %zu bytes: %.1f ms", pattern, n, ms);
            /* Without caps the same answer: no route. */
            if (r == NULL)
                assert_null(route_match(&c, path, n, "GET", 3, NULL, 0, NULL));
            free(path);
        }
        regex_free(routes[0].regex);
    }
}

/* The long hostile paths of the issue give up (rather than decide at a
 * cost), and the same patterns still meet the paths they are for. */
static void test_regex_limit_outcomes(void **state)
{
    int groups;
    struct conf_route r = { .name = "re" };
    struct conf c = { .routes = &r, .nroutes = 1 };
    struct route_captures caps;
    size_t n;
    char *path;

    r.regex = compile("/re/(.*)/login", &groups);
    r.ncaptures = groups;
    path = build("", "/re", "/n", 15000, &n);
    assert_null(route_match(&c, path, n, "GET", 3, NULL, 0, &caps));
    assert_ptr_equal(caps.over_limit, &r);
    free(path);
    path = build("/re/", "u", "/login", MAX_PATH, &n);     /* long, harmless */
    assert_ptr_equal(route_match(&c, path, n, "GET", 3, NULL, 0, &caps), &r);
    assert_null(caps.over_limit);                           /* reset by each call */
    assert_int_equal(caps.off[1], 4);
    assert_int_equal(caps.len[1], n - 10);
    free(path);
    regex_free(r.regex);

    /* 121 * 121 steps on any path it meets: within the 100,000 steps up to
     * ~100 bytes, within 10,000,000 / length up to ~680 bytes, not beyond. */
    r.regex = compile("^/x/(.*|a){1,120}(b|c)", &groups);
    r.ncaptures = groups;
    path = build("/x/", "a", "c", 300, &n);
    assert_ptr_equal(route_match(&c, path, n, "GET", 3, NULL, 0, &caps), &r);
    free(path);
    path = build("/x/", "a", "c", 2000, &n);
    assert_null(route_match(&c, path, n, "GET", 3, NULL, 0, &caps));
    assert_ptr_equal(caps.over_limit, &r);
    free(path);
    regex_free(r.regex);
}

/* Route order still holds around a regex route: a method or host that does
 * not meet skips the regex without running it. */
static void test_regex_skipped_by_method(void **state)
{
    int groups;
    char *get = "GET";
    struct conf_route routes[2] = {
        { .name = "re", .methods = &get, .nmethods = 1 },
        { .name = "all", .path = "/", .pathlen = 1 },
    };
    routes[0].regex = compile("^/x/(.*|a){1,120}(b|c)", &groups);
    struct conf c = { .routes = routes, .nroutes = 2 };
    size_t n;
    char *path = build("/x/", "a", "", MAX_PATH, &n);
    struct route_captures caps;
    assert_ptr_equal(route_match(&c, path, n, "POST", 4, NULL, 0, &caps), &routes[1]);
    assert_null(caps.over_limit);
    assert_null(route_match(&c, path, n, "GET", 3, NULL, 0, &caps));
    assert_ptr_equal(caps.over_limit, &routes[0]);
    free(path);
    regex_free(routes[0].regex);
}

/* ---- threads ---- */

#define THREADS 4
#define ROUNDS 3000

struct worker_arg {
    const struct conf *c;
    int id;
    int bad;
};

/* Each thread matches its own user ids and checks every capture; shared
 * match data would hand one thread another's offsets. */
static void *match_loop(void *p)
{
    struct worker_arg *a = p;
    for (int i = 0; i < ROUNDS; i++) {
        char path[64], want[32];
        int wn = snprintf(want, sizeof want, "t%d-%d", a->id, i);
        int n = snprintf(path, sizeof path, "/users/%s/posts/%d", want, i % 7);
        struct route_captures caps;
        const struct conf_route *r = route_match(a->c, path, (size_t)n, "GET", 3, NULL, 0,
                                                 &caps);
        if (r == NULL || !(caps.set & 2u) || caps.len[1] != (size_t)wn ||
            memcmp(path + caps.off[1], want, (size_t)wn) != 0)
            a->bad++;
    }
    return NULL;
}

static void test_regex_threads(void **state)
{
    int groups;
    struct conf_route r = { .name = "users" };
    r.regex = compile("^/users/([^/]+)/(posts|likes)/([0-9]+)$", &groups);
    r.ncaptures = groups;
    struct conf c = { .routes = &r, .nroutes = 1 };
    pthread_t th[THREADS];
    struct worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (struct worker_arg){ &c, i, 0 };
        assert_int_equal(pthread_create(&th[i], NULL, match_loop, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].bad, 0);
    }
    regex_free(r.regex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_semantics),
        cmocka_unit_test(test_regex_compile_errors),
        cmocka_unit_test(test_regex_jit),
        cmocka_unit_test(test_regex_limits),
        cmocka_unit_test(test_regex_limit_outcomes),
        cmocka_unit_test(test_regex_skipped_by_method),
        cmocka_unit_test(test_regex_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
