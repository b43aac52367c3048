/* sluice - test_metrics.c: the Prometheus exposition (metrics.c).
 *
 * The rendered text is checked three ways: exact lines for the series the
 * cases move (counters, labelled counters, gauges, histogram buckets, sum
 * and count, escaped route names); a small checker of the text format
 * (HELP and TYPE once per family and before its samples, a family's samples
 * together, no series twice, label values escaped as the format says,
 * histogram buckets cumulative in increasing `le` up to +Inf = _count); and
 * `promtool check metrics`, Prometheus' own parser and linter. The counters
 * are process-wide, so each case checks what it changed by difference or
 * on route names of its own. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "conf.h"
#include "metrics.h"
#include "testlib.h"

/* ---- rendering and reading the text ------------------------------------------------ */

static char *render(void)
{
    struct evbuffer *b = evbuffer_new();
    metrics_render(b);
    char *s = testlib_drain(b);
    evbuffer_free(b);
    return s;
}

/* Whether text holds exactly this line. */
static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return 1;
    return 0;
}

static void expect_line(const char *text, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (!has_line(text, line)) {
        fprintf(stderr, "missing line: %s\n--- exposition ---\n%s", line, text);
        fail();
    }
}

/* The value of the sample whose name{labels} is series; -1 when absent. */
static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

/* ---- a checker of the text format (version 0.0.4) -------------------------------- */

#define MAX_FAMILIES 64
#define MAX_SERIES 4096

struct family {
    char name[128];
    char type[16];
    int help, samples_done;
};

struct checker {
    struct family fam[MAX_FAMILIES];
    int nfam;
    char *series[MAX_SERIES];
    int nseries;
    int cur;                    /* family whose samples are being read, or -1 */
    /* histogram state of the current family */
    double last_le, last_bucket;
    int saw_inf;
    double inf_count;
};

static int valid_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static struct family *family_get(struct checker *k, const char *name, size_t n, int create)
{
    for (int i = 0; i < k->nfam; i++)
        if (strlen(k->fam[i].name) == n && memcmp(k->fam[i].name, name, n) == 0)
            return &k->fam[i];
    if (!create)
        return NULL;
    assert_true(k->nfam < MAX_FAMILIES && n < sizeof(k->fam[0].name));
    struct family *f = &k->fam[k->nfam++];
    memset(f, 0, sizeof(*f));
    memcpy(f->name, name, n);
    return f;
}

/* A sample's family: its name, less _bucket/_sum/_count for histograms. */
static struct family *family_of_sample(struct checker *k, const char *name, size_t n,
                                       const char **suffix)
{
    static const char *const sfx[] = { "_bucket", "_sum", "_count" };
    *suffix = "";
    for (size_t i = 0; i < 3; i++) {
        size_t sl = strlen(sfx[i]);
        if (n > sl && memcmp(name + n - sl, sfx[i], sl) == 0) {
            struct family *f = family_get(k, name, n - sl, 0);
            if (f && strcmp(f->type, "histogram") == 0) {
                *suffix = sfx[i];
                return f;
            }
        }
    }
    return family_get(k, name, n, 0);
}

/* Labels {a="x",b="y"}: names valid, values with only \\ \" \n escapes.
 * Returns the end of the label set; *le gets the value of label le. */
static const char *check_labels(const char *p, const char *eol, char *le, size_t lesize)
{
    le[0] = '\0';
    assert_true(*p == '{');
    p++;
    while (p < eol && *p != '}') {
        const char *name = p;
        while (p < eol && *p != '=')
            p++;
        assert_true(valid_name(name, (size_t)(p - name)));
        int is_le = p - name == 2 && memcmp(name, "le", 2) == 0;
        assert_true(p[1] == '"');
        p += 2;
        size_t vn = 0;
        while (p < eol && *p != '"') {
            char c = *p++;
            if (c == '\\') {
                assert_true(*p == '\\' || *p == '"' || *p == 'n');
                c = *p++;
            }
            if (is_le && vn + 1 < lesize)
                le[vn++] = c;
        }
        if (is_le)
            le[vn] = '\0';
        assert_true(*p == '"');
        p++;
        if (*p == ',')
            p++;
    }
    assert_true(*p == '}');
    return p + 1;
}

static void check_sample(struct checker *k, const char *line, const char *eol)
{
    const char *p = line;
    while (p < eol && *p != '{' && *p != ' ')
        p++;
    size_t n = (size_t)(p - line);
    assert_true(valid_name(line, n));
    const char *suffix;
    struct family *f = family_of_sample(k, line, n, &suffix);
    if (f == NULL || f->type[0] == '\0') {
        fprintf(stderr, "sample before its TYPE: %.*s\n", (int)(eol - line), line);
        fail();
    }
    int idx = (int)(f - k->fam);
    if (k->cur != idx) {
        /* A family's samples come together, once. */
        assert_false(f->samples_done);
        if (k->cur >= 0)
            k->fam[k->cur].samples_done = 1;
        k->cur = idx;
        k->last_le = -INFINITY;
        k->last_bucket = 0;
        k->saw_inf = 0;
    }
    char le[32] = "";
    if (*p == '{')
        p = check_labels(p, eol, le, sizeof(le));
    assert_true(*p == ' ');
    char *end;
    double v = strtod(p + 1, &end);
    assert_ptr_equal(end, eol);             /* one value, no timestamp */
    assert_false(isnan(v));

    /* No series twice. */
    size_t slen = (size_t)(p - line);
    for (int i = 0; i < k->nseries; i++)
        if (strlen(k->series[i]) == slen && memcmp(k->series[i], line, slen) == 0) {
            fprintf(stderr, "series twice: %.*s\n", (int)slen, line);
            fail();
        }
    assert_true(k->nseries < MAX_SERIES);
    k->series[k->nseries] = strndup(line, slen);
    k->nseries++;

    if (strcmp(f->type, "counter") == 0)
        assert_true(v >= 0);
    if (strcmp(suffix, "_bucket") == 0) {
        assert_true(le[0] != '\0');
        double bound = strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL);
        assert_true(bound > k->last_le);    /* increasing le */
        assert_true(v >= k->last_bucket);   /* cumulative */
        k->last_le = bound;
        k->last_bucket = v;
        if (isinf(bound)) {
            k->saw_inf = 1;
            k->inf_count = v;
        }
    } else if (strcmp(suffix, "_count") == 0) {
        assert_true(k->saw_inf);
        assert_true(v == k->inf_count);     /* +Inf bucket = count */
    } else if (strcmp(suffix, "_sum") == 0) {
        assert_true(k->saw_inf);
    }
}

static void check_format(const char *text)
{
    struct checker *k = calloc(1, sizeof(*k));
    assert_non_null(k);
    k->cur = -1;
    assert_true(text[0] != '\0');
    assert_true(text[strlen(text) - 1] == '\n');
    for (const char *line = text; *line; ) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
        assert_true(eol > line);                    /* no empty lines */
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            const char *name = line + 7, *sp = name;
            while (sp < eol && *sp != ' ')
                sp++;
            assert_true(valid_name(name, (size_t)(sp - name)));
            assert_true(sp < eol);
            struct family *f = family_get(k, name, (size_t)(sp - name), 1);
            assert_false(f->samples_done);
            assert_true(k->cur < 0 || &k->fam[k->cur] != f);   /* before its samples */
            if (line[2] == 'H') {
                assert_false(f->help);
                f->help = 1;
            } else {
                assert_true(f->type[0] == '\0');
                size_t tl = (size_t)(eol - sp - 1);
                assert_true(tl > 0 && tl < sizeof(f->type));
                memcpy(f->type, sp + 1, tl);
                assert_true(strcmp(f->type, "counter") == 0 || strcmp(f->type, "gauge") == 0 ||
                            strcmp(f->type, "histogram") == 0);
            }
        } else {
            assert_true(line[0] != '#');
            check_sample(k, line, eol);
        }
        line = eol + 1;
    }
    /* Every family has HELP and TYPE; counters are named _total. */
    for (int i = 0; i < k->nfam; i++) {
        assert_true(k->fam[i].help);
        assert_true(k->fam[i].type[0] != '\0');
        if (strcmp(k->fam[i].type, "counter") == 0) {
            size_t n = strlen(k->fam[i].name);
            assert_true(n > 6 && strcmp(k->fam[i].name + n - 6, "_total") == 0);
        }
    }
    for (int i = 0; i < k->nseries; i++)
        free(k->series[i]);
    free(k);
}

/* `promtool check metrics` on text: its exit status (0: valid, no lint).
 * Its complaints are shown unless quiet (the cases it must reject). */
static int promtool_run(const char *text, int quiet)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_metrics: promtool not found: apt-get install prometheus "
                        "(make deps does)\n");
        return -1;
    }
    FILE *f = popen(quiet ? "promtool check metrics >/dev/null 2>&1" : "promtool check metrics", "w");
    assert_non_null(f);
    fputs(text, f);
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int promtool(const char *text)
{
    return promtool_run(text, 0);
}

/* ---- routes ---------------------------------------------------------------------- */

static void bind_routes(struct conf *c, struct conf_route *r, const char *const *names, int n)
{
    memset(c, 0, sizeof(*c));
    memset(r, 0, sizeof(*r) * (size_t)n);
    for (int i = 0; i < n; i++)
        r[i].name = (char *)names[i];
    c->routes = r;
    c->nroutes = n;
    for (int i = 0; i < n; i++)     /* as runtime_bind_metrics does */
        r[i].metrics = metrics_route(r[i].name);
}

/* ---- the cases ------------------------------------------------------------------- */

/* Before anything counted: every fixed series at 0, and valid. */
static void test_initial(void **state)
{
    char *t = render();
    check_format(t);
    expect_line(t, "# TYPE sluice_requests_total counter");
    expect_line(t, "sluice_redis_requests_total 0");
    expect_line(t, "sluice_redis_errors_total 0");
    expect_line(t, "sluice_redis_errors_total{reason=\"error\"} 0");
    expect_line(t, "sluice_redis_errors_total{reason=\"timeout\"} 0");
    expect_line(t, "sluice_redis_errors_total{reason=\"unavailable\"} 0");
    expect_line(t, "sluice_redis_errors_total{reason=\"oom\"} 0");
    expect_line(t, "sluice_deny_cache_hits_total 0");
    expect_line(t, "# TYPE sluice_redis_duration_seconds histogram");
    expect_line(t, "sluice_redis_duration_seconds_bucket{le=\"+Inf\"} 0");
    expect_line(t, "sluice_redis_duration_seconds_sum 0.000000");
    expect_line(t, "sluice_redis_duration_seconds_count 0");
    expect_line(t, "# TYPE sluice_connections gauge");
    expect_line(t, "sluice_connections{side=\"client\"} 0");
    expect_line(t, "sluice_connections{side=\"upstream\"} 0");
    expect_line(t, "sluice_redis_connected 0");
    expect_line(t, "sluice_config_reloads_total{result=\"ok\"} 0");
    expect_line(t, "sluice_config_reloads_total{result=\"error\"} 0");
    expect_line(t, "sluice_access_log_dropped_total 0");
    expect_line(t, "sluice_redis_redirects_total{kind=\"ask\"} 0");
    expect_line(t, "sluice_redis_redirects_total{kind=\"moved\"} 0");
    assert_int_equal(promtool(t), 0);
    free(t);
}

/* Per-route decisions and statuses, and route="" for the unrouted. */
static void test_routes(void **state)
{
    static const char *const names[] = { "api", "login" };
    struct conf c;
    struct conf_route r[2];
    bind_routes(&c, r, names, 2);
    assert_non_null(r[0].metrics);
    assert_non_null(r[1].metrics);
    assert_ptr_not_equal(r[0].metrics, r[1].metrics);
    assert_non_null(metrics_unrouted());
    for (int i = 0; i < 3; i++)
        metrics_request(r[0].metrics, METRICS_ALLOWED);
    metrics_request(r[0].metrics, METRICS_LIMITED);
    metrics_request(r[1].metrics, METRICS_SHADOW_LIMITED);
    metrics_request(r[1].metrics, METRICS_ERROR);
    metrics_request(NULL, METRICS_ALLOWED);             /* ignored */
    metrics_response(r[0].metrics, 200);
    metrics_response(r[0].metrics, 200);
    metrics_response(r[0].metrics, 429);
    metrics_response(r[1].metrics, 0);
    metrics_response(r[1].metrics, 599);
    metrics_response(r[1].metrics, 600);                /* out of range: ignored */
    metrics_response(r[1].metrics, -1);
    metrics_response(NULL, 200);
    metrics_response(metrics_unrouted(), 404);
    metrics_regex_limit(r[1].metrics);
    metrics_regex_limit(NULL);

    char *t = render();
    check_format(t);
    expect_line(t, "sluice_requests_total{route=\"api\",decision=\"allowed\"} 3");
    expect_line(t, "sluice_requests_total{route=\"api\",decision=\"limited\"} 1");
    expect_line(t, "sluice_requests_total{route=\"api\",decision=\"shadow_limited\"} 0");
    expect_line(t, "sluice_requests_total{route=\"api\",decision=\"error\"} 0");
    expect_line(t, "sluice_requests_total{route=\"login\",decision=\"shadow_limited\"} 1");
    expect_line(t, "sluice_requests_total{route=\"login\",decision=\"error\"} 1");
    expect_line(t, "sluice_requests_total{route=\"\",decision=\"allowed\"} 0");
    expect_line(t, "sluice_responses_total{route=\"api\",code=\"200\"} 2");
    expect_line(t, "sluice_responses_total{route=\"api\",code=\"429\"} 1");
    expect_line(t, "sluice_responses_total{route=\"login\",code=\"0\"} 1");
    expect_line(t, "sluice_responses_total{route=\"login\",code=\"599\"} 1");
    expect_line(t, "sluice_responses_total{route=\"\",code=\"404\"} 1");
    /* Statuses never seen have no series. */
    assert_int_equal(value_of(t, "sluice_responses_total{route=\"api\",code=\"404\"}"), -1);
    expect_line(t, "sluice_regex_limit_total{route=\"login\"} 1");
    /* A route whose regex never gave up has no regex series. */
    assert_int_equal(value_of(t, "sluice_regex_limit_total{route=\"api\"}"), -1);
    assert_int_equal(promtool(t), 0);
    free(t);

    /* A reload binds the same names to the same series: counters go on. */
    struct conf c2;
    struct conf_route r2[2];
    static const char *const again[] = { "login", "api" };
    bind_routes(&c2, r2, again, 2);
    assert_ptr_equal(r2[0].metrics, r[1].metrics);
    assert_ptr_equal(r2[1].metrics, r[0].metrics);
    metrics_request(r2[1].metrics, METRICS_ALLOWED);
    t = render();
    expect_line(t, "sluice_requests_total{route=\"api\",decision=\"allowed\"} 4");
    free(t);
}

/* Route names are config strings: '"', '\' and newline are escaped in
 * label values; other bytes (UTF-8) pass. */
static void test_label_escaping(void **state)
{
    static const char *const names[] = { "we\"ird\\pa\nth", "caf\xc3\xa9 {x=1}\t\r" };
    struct conf c;
    struct conf_route r[2];
    bind_routes(&c, r, names, 2);
    metrics_request(r[0].metrics, METRICS_LIMITED);
    metrics_response(r[0].metrics, 503);
    metrics_regex_limit(r[0].metrics);
    metrics_request(r[1].metrics, METRICS_ALLOWED);
    char *t = render();
    check_format(t);
    expect_line(t, "sluice_requests_total{route=\"we\\\"ird\\\\pa\\nth\",decision=\"limited\"} 1");
    expect_line(t, "sluice_responses_total{route=\"we\\\"ird\\\\pa\\nth\",code=\"503\"} 1");
    expect_line(t, "sluice_regex_limit_total{route=\"we\\\"ird\\\\pa\\nth\"} 1");
    expect_line(t, "sluice_requests_total{route=\"caf\xc3\xa9 {x=1}\t\r\",decision=\"allowed\"} 1");
    assert_int_equal(promtool(t), 0);
    free(t);
}

static void test_counters_and_gauges(void **state)
{
    char *t0 = render();
    double req0 = value_of(t0, "sluice_redis_requests_total");
    double err0 = value_of(t0, "sluice_redis_errors_total");
    double hits0 = value_of(t0, "sluice_deny_cache_hits_total");
    double ok0 = value_of(t0, "sluice_config_reloads_total{result=\"ok\"}");
    double bad0 = value_of(t0, "sluice_config_reloads_total{result=\"error\"}");
    free(t0);
    for (int i = 0; i < 5; i++)
        metrics_count(METRICS_REDIS_REQUESTS);
    metrics_count(METRICS_DENY_CACHE_HITS);
    metrics_count(METRICS_RELOADS_OK);
    metrics_count(METRICS_RELOADS_OK);
    metrics_count(METRICS_RELOADS_FAILED);
    metrics_redis_error(METRICS_REDIS_ERR_TIMEOUT);
    metrics_redis_error(METRICS_REDIS_ERR_TIMEOUT);
    metrics_redis_error(METRICS_REDIS_ERR_OOM);
    metrics_redis_error(METRICS_REDIS_ERR_UNAVAILABLE);
    metrics_worker_request(0);
    metrics_worker_request(0);
    metrics_worker_request(3);
    metrics_worker_request(-1);         /* out of range: ignored */
    metrics_worker_request(100000);
    metrics_gauge_add(METRICS_CONN_CLIENT, 3);
    metrics_gauge_add(METRICS_CONN_CLIENT, -1);
    metrics_gauge_add(METRICS_CONN_UPSTREAM, 7);
    metrics_gauge_add(METRICS_REDIS_CONNECTED, 2);
    assert_int_equal(metrics_gauge_get(METRICS_CONN_CLIENT), 2);

    char *t = render();
    check_format(t);
    assert_true(value_of(t, "sluice_redis_requests_total") == req0 + 5);
    assert_true(value_of(t, "sluice_redis_errors_total") == err0 + 4);
    assert_true(value_of(t, "sluice_deny_cache_hits_total") == hits0 + 1);
    assert_true(value_of(t, "sluice_config_reloads_total{result=\"ok\"}") == ok0 + 2);
    assert_true(value_of(t, "sluice_config_reloads_total{result=\"error\"}") == bad0 + 1);
    expect_line(t, "sluice_redis_errors_total{reason=\"timeout\"} 2");
    expect_line(t, "sluice_redis_errors_total{reason=\"oom\"} 1");
    expect_line(t, "sluice_redis_errors_total{reason=\"unavailable\"} 1");
    expect_line(t, "sluice_redis_errors_total{reason=\"error\"} 0");
    expect_line(t, "# TYPE sluice_worker_requests_total counter");
    expect_line(t, "sluice_worker_requests_total{worker=\"0\"} 2");
    expect_line(t, "sluice_worker_requests_total{worker=\"3\"} 1");
    assert_int_equal(value_of(t, "sluice_worker_requests_total{worker=\"1\"}"), -1);
    expect_line(t, "sluice_connections{side=\"client\"} 2");
    expect_line(t, "sluice_connections{side=\"upstream\"} 7");
    expect_line(t, "sluice_redis_connected 2");
    assert_int_equal(promtool(t), 0);
    free(t);
    metrics_gauge_add(METRICS_CONN_CLIENT, -2);
    metrics_gauge_add(METRICS_CONN_UPSTREAM, -7);
    metrics_gauge_add(METRICS_REDIS_CONNECTED, -2);
}

/* Buckets by upper bound in seconds (a value on a bound falls in it),
 * cumulative, +Inf for the rest; _sum in seconds, negative as 0. */
static void test_histograms(void **state)
{
    static const int64_t us[] = { -5, 400, 500, 501, 1000, 2600, 10000000, 10000001, 20000000 };
    for (size_t i = 0; i < sizeof(us) / sizeof(us[0]); i++)
        metrics_observe(METRICS_REDIS_SECONDS, us[i]);
    metrics_observe(METRICS_UPSTREAM_SECONDS, 250000);
    char *t = render();
    check_format(t);
    static const char *const want[] = {
        "sluice_redis_duration_seconds_bucket{le=\"0.0005\"} 3",
        "sluice_redis_duration_seconds_bucket{le=\"0.001\"} 5",
        "sluice_redis_duration_seconds_bucket{le=\"0.0025\"} 5",
        "sluice_redis_duration_seconds_bucket{le=\"0.005\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.01\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.025\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.05\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.1\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.25\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"0.5\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"1\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"2.5\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"5\"} 6",
        "sluice_redis_duration_seconds_bucket{le=\"10\"} 7",
        "sluice_redis_duration_seconds_bucket{le=\"+Inf\"} 9",
        "sluice_redis_duration_seconds_sum 40.005002",
        "sluice_redis_duration_seconds_count 9",
        "sluice_upstream_duration_seconds_bucket{le=\"0.1\"} 0",
        "sluice_upstream_duration_seconds_bucket{le=\"0.25\"} 1",
        "sluice_upstream_duration_seconds_bucket{le=\"+Inf\"} 1",
        "sluice_upstream_duration_seconds_sum 0.250000",
        "sluice_upstream_duration_seconds_count 1",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        expect_line(t, "%s", want[i]);
    /* The buckets, in order, with nothing between them. */
    const char *b = strstr(t, "sluice_redis_duration_seconds_bucket{le=\"0.0005\"}");
    assert_non_null(b);
    for (size_t i = 0; i < 17; i++) {
        assert_memory_equal(b, want[i], strlen(want[i]));
        assert_true(b[strlen(want[i])] == '\n');
        b += strlen(want[i]) + 1;
    }
    assert_int_equal(promtool(t), 0);
    free(t);
}

/* Four threads adding at once: the totals are exact. */
#define THREAD_ADDS 100000

static void *adder(void *arg)
{
    struct metrics_route *m = arg;
    for (int i = 0; i < THREAD_ADDS; i++) {
        metrics_request(m, METRICS_ALLOWED);
        metrics_response(m, 200);
        metrics_observe(METRICS_UPSTREAM_SECONDS, 1);
    }
    return NULL;
}

static void test_threads_exact(void **state)
{
    static const char *const names[] = { "threads" };
    struct conf c;
    struct conf_route r[1];
    bind_routes(&c, r, names, 1);
    char *t0 = render();
    double n0 = value_of(t0, "sluice_upstream_duration_seconds_count");
    free(t0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, adder, r[0].metrics), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *t = render();
    expect_line(t, "sluice_requests_total{route=\"threads\",decision=\"allowed\"} %d",
                4 * THREAD_ADDS);
    expect_line(t, "sluice_responses_total{route=\"threads\",code=\"200\"} %d", 4 * THREAD_ADDS);
    assert_true(value_of(t, "sluice_upstream_duration_seconds_count") == n0 + 4 * THREAD_ADDS);
    check_format(t);
    free(t);
}

static int promtool_rejects(const char *text)
{
    int rc = promtool_run(text, 1);
    assert_int_not_equal(rc, -1);           /* promtool ran */
    return rc;
}

/* promtool is not vacuous here: it rejects a label value with a raw
 * newline (what add_label's escaping prevents) and a counter without
 * _total (what its linter checks). */
static void test_promtool_rejects(void **state)
{
    assert_int_not_equal(promtool_rejects("# HELP a_total x\n# TYPE a_total counter\n"
                                          "a_total{route=\"x\ny\"} 1\n"), 0);
    assert_int_not_equal(promtool_rejects("# HELP c x\n# TYPE c counter\nc 1\n"), 0);
    assert_int_equal(promtool("# HELP c_total x\n# TYPE c_total counter\nc_total 1\n"), 0);
}

/* After shutdown the registry is empty: no route series, nothing leaked. */
static void test_shutdown(void **state)
{
    metrics_shutdown();
    assert_null(metrics_unrouted());
    char *t = render();
    check_format(t);
    assert_null(strstr(t, "route="));
    expect_line(t, "# TYPE sluice_requests_total counter");
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_initial),
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_counters_and_gauges),
        cmocka_unit_test(test_histograms),
        cmocka_unit_test(test_threads_exact),
        cmocka_unit_test(test_promtool_rejects),
        cmocka_unit_test(test_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
