/* sluice - metrics.c: lock-free counters and their Prometheus rendering.
 *
 * Hot-path updates are single relaxed atomic adds. Only creating a route's
 * series (at config load) and rendering take the registry lock. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>

#include "esc.h"
#include "mem.h"
#include "metrics.h"

#define METRICS_NSTATUS 600

struct metrics_route {
    struct metrics_route *next;
    char *name;
    _Atomic uint64_t decisions[METRICS_NDECISIONS];
    _Atomic uint64_t status[METRICS_NSTATUS];
    _Atomic uint64_t regex_limit;
    _Atomic uint64_t cost;          /* cost_from: units charged */
    _Atomic uint64_t grpc[METRICS_NGRPC];   /* by grpc-status */
};

/* Upper bounds in microseconds; the last bucket is +Inf. */
static const int64_t hist_bounds_us[] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000,
};
#define METRICS_NBUCKETS (sizeof(hist_bounds_us) / sizeof(hist_bounds_us[0]) + 1)

struct metrics_histogram {
    _Atomic uint64_t buckets[METRICS_NBUCKETS];
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct metrics_route *routes;
static _Atomic uint64_t counters[METRICS_NCOUNTERS];
static _Atomic uint64_t redis_errors[METRICS_NREDIS_ERRORS];
static _Atomic uint64_t tls_handshakes;
static _Atomic uint64_t tls_failures[METRICS_NTLS_FAILURES];
static _Atomic uint64_t jwt_results[METRICS_NJWT];
static _Atomic int64_t gauges[METRICS_NGAUGES];
static struct metrics_histogram hists[METRICS_NHIST];
#define METRICS_MAX_WORKERS 256
static _Atomic uint64_t worker_requests[METRICS_MAX_WORKERS];
static _Atomic uint64_t decision_mode[METRICS_NDECISIONS];

void metrics_decision_mode(enum metrics_decision d)
{
    atomic_fetch_add_explicit(&decision_mode[d], 1, memory_order_relaxed);
}

void metrics_worker_request(int worker)
{
    if (worker >= 0 && worker < METRICS_MAX_WORKERS)
        atomic_fetch_add_explicit(&worker_requests[worker], 1, memory_order_relaxed);
}

static struct metrics_route *route_get(const char *name)
{
    struct metrics_route **pp = &routes;
    for (; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->name, name) == 0)
            return *pp;
    struct metrics_route *m = mem_calloc(1, sizeof(*m));
    m->name = mem_strndup(name, strlen(name));
    *pp = m;
    return m;
}

/* Responses given before a route is known (400, 404...) are counted under
 * route="" (a config's route names are never empty). */
static struct metrics_route *unrouted;

struct metrics_route *metrics_unrouted(void)
{
    return unrouted;
}

struct metrics_route *metrics_route(const char *name)
{
    pthread_mutex_lock(&registry_lock);
    if (unrouted == NULL)
        unrouted = route_get("");
    struct metrics_route *m = route_get(name);
    pthread_mutex_unlock(&registry_lock);
    return m;
}

void metrics_request(struct metrics_route *m, enum metrics_decision d)
{
    if (m)
        atomic_fetch_add_explicit(&m->decisions[d], 1, memory_order_relaxed);
}

void metrics_response(struct metrics_route *m, int status)
{
    if (m && status >= 0 && status < METRICS_NSTATUS)
        atomic_fetch_add_explicit(&m->status[status], 1, memory_order_relaxed);
}

void metrics_grpc(struct metrics_route *m, int code)
{
    if (m && code >= 0 && code < METRICS_NGRPC)
        atomic_fetch_add_explicit(&m->grpc[code], 1, memory_order_relaxed);
}

void metrics_regex_limit(struct metrics_route *m)
{
    if (m)
        atomic_fetch_add_explicit(&m->regex_limit, 1, memory_order_relaxed);
}

void metrics_cost(struct metrics_route *m, int64_t units)
{
    if (m && units > 0)
        atomic_fetch_add_explicit(&m->cost, (uint64_t)units, memory_order_relaxed);
}

void metrics_count(enum metrics_counter which)
{
    atomic_fetch_add_explicit(&counters[which], 1, memory_order_relaxed);
}

void metrics_add(enum metrics_counter which, uint64_t n)
{
    atomic_fetch_add_explicit(&counters[which], n, memory_order_relaxed);
}

uint64_t metrics_counter_get(enum metrics_counter which)
{
    return atomic_load_explicit(&counters[which], memory_order_relaxed);
}

void metrics_redis_error(enum metrics_redis_error why)
{
    atomic_fetch_add_explicit(&counters[METRICS_REDIS_ERRORS], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&redis_errors[why], 1, memory_order_relaxed);
}

void metrics_tls_handshake(void)
{
    atomic_fetch_add_explicit(&tls_handshakes, 1, memory_order_relaxed);
}

void metrics_tls_failure(enum metrics_tls_failure why)
{
    atomic_fetch_add_explicit(&tls_failures[why], 1, memory_order_relaxed);
}

void metrics_jwt(int result)
{
    if (result >= 0 && result < METRICS_NJWT)
        atomic_fetch_add_explicit(&jwt_results[result], 1, memory_order_relaxed);
}

void metrics_gauge_add(enum metrics_gauge which, int64_t delta)
{
    atomic_fetch_add_explicit(&gauges[which], delta, memory_order_relaxed);
}

int64_t metrics_gauge_get(enum metrics_gauge which)
{
    return atomic_load_explicit(&gauges[which], memory_order_relaxed);
}

void metrics_observe(enum metrics_hist which, int64_t usec)
{
    struct metrics_histogram *h = &hists[which];
    size_t b = 0;
    while (b < METRICS_NBUCKETS - 1 && usec > hist_bounds_us[b])
        b++;
    atomic_fetch_add_explicit(&h->buckets[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)(usec > 0 ? usec : 0), memory_order_relaxed);
}

/* Decisions per script call (store.c's batches): upper bounds, the last
 * bucket is +Inf. */
static const int batch_bounds[] = { 1, 2, 4, 8, 16, 32, 64 };
#define METRICS_NBATCH (sizeof(batch_bounds) / sizeof(batch_bounds[0]) + 1)
static _Atomic uint64_t batch_buckets[METRICS_NBATCH];
static _Atomic uint64_t batch_count, batch_sum;

void metrics_batch(int requests)
{
    size_t b = 0;
    while (b < METRICS_NBATCH - 1 && requests > batch_bounds[b])
        b++;
    atomic_fetch_add_explicit(&batch_buckets[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&batch_count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&batch_sum, (uint64_t)(requests > 0 ? requests : 0),
                              memory_order_relaxed);
}

static uint64_t load(_Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* Label values are route names from the config: escape per the format. */
static void add_label(struct evbuffer *out, const char *s)
{
    char buf[ESC_MAX(64)];
    for (size_t n = strlen(s), i = 0; i < n; i += 64) {
        size_t k = n - i < 64 ? n - i : 64;
        evbuffer_add(out, buf, (size_t)(esc_put(buf, s + i, k, ESC_LABEL) - buf));
    }
}

/* Routes whose path_regex gave up at least once. */
static void render_costs(struct evbuffer *out)
{
    evbuffer_add_printf(out, "# HELP sluice_cost_charged_total Units charged to cost_from "
                             "limits after their responses (the reported cost, or the "
                             "estimate when none was), by route.\n"
                             "# TYPE sluice_cost_charged_total counter\n");
    for (struct metrics_route *m = routes; m; m = m->next) {
        uint64_t v = load(&m->cost);
        if (v == 0)
            continue;
        evbuffer_add_printf(out, "sluice_cost_charged_total{route=\"");
        add_label(out, m->name);
        evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)v);
    }
}

static void render_regex_limits(struct evbuffer *out)
{
    evbuffer_add_printf(out, "# HELP sluice_regex_limit_total path_regex matches stopped at "
                             "their limit (answered 400 regex_limit), by route.\n"
                             "# TYPE sluice_regex_limit_total counter\n");
    for (struct metrics_route *m = routes; m; m = m->next) {
        uint64_t v = load(&m->regex_limit);
        if (v == 0)
            continue;
        evbuffer_add_printf(out, "sluice_regex_limit_total{route=\"");
        add_label(out, m->name);
        evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)v);
    }
}

static const char *const names[METRICS_NDECISIONS] = {
    "allowed", "limited", "shadow_limited", "error", "delayed",
};

const char *metrics_decision_name(enum metrics_decision d)
{
    return names[d];
}

void metrics_routes_each(void (*fn)(void *arg, const char *name, const uint64_t *decisions),
                         void *arg)
{
    uint64_t d[METRICS_NDECISIONS];
    pthread_mutex_lock(&registry_lock);
    for (struct metrics_route *m = routes; m; m = m->next) {
        if (m == unrouted)
            continue;
        for (int i = 0; i < METRICS_NDECISIONS; i++)
            d[i] = load(&m->decisions[i]);
        fn(arg, m->name, d);
    }
    pthread_mutex_unlock(&registry_lock);
}

int metrics_hist_read(enum metrics_hist which, uint64_t *counts, const int64_t **bounds_us)
{
    _Static_assert(METRICS_NBUCKETS <= METRICS_MAX_BUCKETS, "METRICS_MAX_BUCKETS too small");
    for (size_t b = 0; b < METRICS_NBUCKETS; b++)
        counts[b] = load(&hists[which].buckets[b]);
    *bounds_us = hist_bounds_us;
    return (int)METRICS_NBUCKETS;
}

/* The last load or reload: its result, when it ran, when the running config
 * was loaded (wall clock, us). */
static _Atomic int64_t config_ok = 1, config_attempt_us, config_loaded_us;

void metrics_config_load(int ok, int64_t wall_us)
{
    atomic_store(&config_ok, ok ? 1 : 0);
    atomic_store(&config_attempt_us, wall_us);
    if (ok)
        atomic_store(&config_loaded_us, wall_us);
}

static void render_config(struct evbuffer *out)
{
    evbuffer_add_printf(out,
        "# HELP sluice_config_last_reload_success 1 when the last config load or reload "
        "succeeded, 0 when it failed (the previous config still serves).\n"
        "# TYPE sluice_config_last_reload_success gauge\n"
        "sluice_config_last_reload_success %d\n"
        "# HELP sluice_config_last_reload_timestamp_seconds When the last config load or "
        "reload ran, whatever its result (Unix time).\n"
        "# TYPE sluice_config_last_reload_timestamp_seconds gauge\n"
        "sluice_config_last_reload_timestamp_seconds %.3f\n"
        "# HELP sluice_config_load_timestamp_seconds When the running config was loaded "
        "(Unix time).\n"
        "# TYPE sluice_config_load_timestamp_seconds gauge\n"
        "sluice_config_load_timestamp_seconds %.3f\n",
        (int)atomic_load(&config_ok), (double)atomic_load(&config_attempt_us) / 1e6,
        (double)atomic_load(&config_loaded_us) / 1e6);
}

static void render_routes(struct evbuffer *out)
{
    evbuffer_add_printf(out, "# HELP sluice_requests_total Requests by route and decision.\n"
                             "# TYPE sluice_requests_total counter\n");
    for (struct metrics_route *m = routes; m; m = m->next)
        for (int d = 0; d < METRICS_NDECISIONS; d++) {
            evbuffer_add_printf(out, "sluice_requests_total{route=\"");
            add_label(out, m->name);
            evbuffer_add_printf(out, "\",decision=\"%s\"} %llu\n", names[d],
                                (unsigned long long)load(&m->decisions[d]));
        }
    evbuffer_add_printf(out, "# HELP sluice_responses_total Responses by route and status.\n"
                             "# TYPE sluice_responses_total counter\n");
    for (struct metrics_route *m = routes; m; m = m->next)
        for (int s = 0; s < METRICS_NSTATUS; s++) {
            uint64_t v = load(&m->status[s]);
            if (v == 0)
                continue;
            evbuffer_add_printf(out, "sluice_responses_total{route=\"");
            add_label(out, m->name);
            evbuffer_add_printf(out, "\",code=\"%d\"} %llu\n", s, (unsigned long long)v);
        }
    evbuffer_add_printf(out, "# HELP sluice_grpc_responses_total gRPC calls answered, by "
                             "route and grpc-status.\n"
                             "# TYPE sluice_grpc_responses_total counter\n");
    for (struct metrics_route *m = routes; m; m = m->next)
        for (int s = 0; s < METRICS_NGRPC; s++) {
            uint64_t v = load(&m->grpc[s]);
            if (v == 0)
                continue;
            evbuffer_add_printf(out, "sluice_grpc_responses_total{route=\"");
            add_label(out, m->name);
            evbuffer_add_printf(out, "\",grpc_status=\"%d\"} %llu\n", s, (unsigned long long)v);
        }
    render_regex_limits(out);
    render_costs(out);
}

static void render_hist(struct evbuffer *out, const char *name, const char *help,
                        struct metrics_histogram *h)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t b = 0; b < METRICS_NBUCKETS; b++) {
        cum += load(&h->buckets[b]);
        if (b < METRICS_NBUCKETS - 1)
            evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name,
                                (double)hist_bounds_us[b] / 1e6, (unsigned long long)cum);
        else
            evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                                (unsigned long long)cum);
    }
    evbuffer_add_printf(out, "%s_sum %.6f\n%s_count %llu\n", name,
                        (double)load(&h->sum_us) / 1e6, name,
                        (unsigned long long)load(&h->count));
}

static void render_batch(struct evbuffer *out)
{
    static const char name[] = "sluice_redis_batch_size";
    evbuffer_add_printf(out, "# HELP %s Decisions carried by one Redis script call.\n"
                             "# TYPE %s histogram\n", name, name);
    uint64_t cum = 0;
    for (size_t b = 0; b < METRICS_NBATCH; b++) {
        cum += load(&batch_buckets[b]);
        if (b < METRICS_NBATCH - 1)
            evbuffer_add_printf(out, "%s_bucket{le=\"%d\"} %llu\n", name, batch_bounds[b],
                                (unsigned long long)cum);
        else
            evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                                (unsigned long long)cum);
    }
    evbuffer_add_printf(out, "%s_sum %llu\n%s_count %llu\n", name,
                        (unsigned long long)load(&batch_sum), name,
                        (unsigned long long)load(&batch_count));
}

static void render_counter(struct evbuffer *out, const char *name, const char *help,
                           enum metrics_counter which)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name,
                        name, (unsigned long long)load(&counters[which]));
}

/* A counter family of two series told apart by one label. */
static void render_counter2(struct evbuffer *out, const char *name, const char *help,
                            const char *label, const char *v1, enum metrics_counter c1,
                            const char *v2, enum metrics_counter c2)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s{%s=\"%s\"} %llu\n"
                             "%s{%s=\"%s\"} %llu\n", name, help, name,
                        name, label, v1, (unsigned long long)load(&counters[c1]),
                        name, label, v2, (unsigned long long)load(&counters[c2]));
}

/* The total as before (no label), then the same decisions by reason. */
static void render_redis_errors(struct evbuffer *out)
{
    static const char *const reasons[METRICS_NREDIS_ERRORS] = {
        "error", "timeout", "unavailable", "oom",
    };
    render_counter(out, "sluice_redis_errors_total",
                   "Decisions Redis did not answer in time or answered with an error "
                   "(no label: all; by reason: the same decisions).",
                   METRICS_REDIS_ERRORS);
    for (int i = 0; i < METRICS_NREDIS_ERRORS; i++)
        evbuffer_add_printf(out, "sluice_redis_errors_total{reason=\"%s\"} %llu\n", reasons[i],
                            (unsigned long long)load(&redis_errors[i]));
}

static void render_tls(struct evbuffer *out)
{
    static const char *const reasons[METRICS_NTLS_FAILURES] = {
        "timeout", "closed", "not_tls", "version", "cipher", "other",
    };
    evbuffer_add_printf(out,
        "# HELP sluice_tls_handshakes_total TLS handshakes with clients completed.\n"
        "# TYPE sluice_tls_handshakes_total counter\nsluice_tls_handshakes_total %llu\n"
        "# HELP sluice_tls_handshake_failures_total TLS handshakes with clients that failed, by reason.\n"
        "# TYPE sluice_tls_handshake_failures_total counter\n",
        (unsigned long long)load(&tls_handshakes));
    for (int i = 0; i < METRICS_NTLS_FAILURES; i++)
        evbuffer_add_printf(out, "sluice_tls_handshake_failures_total{reason=\"%s\"} %llu\n",
                            reasons[i], (unsigned long long)load(&tls_failures[i]));
}

/* The results seen so far only: most configs read no tokens. */
static void render_jwt(struct evbuffer *out)
{
    static const char *const results[METRICS_NJWT] = {
        "verified", "cached", "missing", "twice", "",
        "malformed", "bad_alg", "no_key", "bad_signature", "expired", "not_yet_valid",
        "bad_issuer", "bad_audience",
    };
    evbuffer_add_printf(out,
        "# HELP sluice_jwt_tokens_total Tokens of requests on routes that read them, by result.\n"
        "# TYPE sluice_jwt_tokens_total counter\n");
    for (int i = 0; i < METRICS_NJWT; i++) {
        uint64_t v = load(&jwt_results[i]);
        if (v)
            evbuffer_add_printf(out, "sluice_jwt_tokens_total{result=\"%s\"} %llu\n", results[i],
                                (unsigned long long)v);
    }
}

/* ---- TLS to upstreams: failures by upstream and reason, handshakes */

struct metrics_up_tls_failure {
    struct metrics_up_tls_failure *next;
    char *upstream;
    const char *reason;         /* a static string */
    uint64_t count;             /* under registry_lock */
};

static struct metrics_up_tls_failure *up_tls_failures;
static _Atomic uint64_t up_tls_handshakes[2];     /* [resumed] */

void metrics_upstream_tls_failure(const char *upstream, const char *reason)
{
    pthread_mutex_lock(&registry_lock);
    struct metrics_up_tls_failure **pp = &up_tls_failures;
    while (*pp && (strcmp((*pp)->upstream, upstream) || strcmp((*pp)->reason, reason)))
        pp = &(*pp)->next;
    if (*pp == NULL) {
        *pp = mem_calloc(1, sizeof(**pp));
        (*pp)->upstream = mem_strndup(upstream, strlen(upstream));
        (*pp)->reason = reason;
    }
    (*pp)->count++;
    pthread_mutex_unlock(&registry_lock);
}

void metrics_upstream_tls_handshake(int resumed)
{
    atomic_fetch_add_explicit(&up_tls_handshakes[resumed != 0], 1, memory_order_relaxed);
}

/* Called with registry_lock held. */
static void render_upstream_tls(struct evbuffer *out)
{
    evbuffer_add_printf(out, "# HELP sluice_upstream_tls_failures_total TLS handshakes with "
                             "upstream servers that failed, by upstream and reason.\n"
                             "# TYPE sluice_upstream_tls_failures_total counter\n");
    for (struct metrics_up_tls_failure *f = up_tls_failures; f; f = f->next) {
        evbuffer_add_printf(out, "sluice_upstream_tls_failures_total{upstream=\"");
        add_label(out, f->upstream);
        evbuffer_add_printf(out, "\",reason=\"%s\"} %llu\n", f->reason,
                            (unsigned long long)f->count);
    }
    evbuffer_add_printf(out,
        "# HELP sluice_upstream_tls_handshakes_total TLS handshakes with upstream servers "
        "that completed, by whether a session was resumed.\n"
        "# TYPE sluice_upstream_tls_handshakes_total counter\n"
        "sluice_upstream_tls_handshakes_total{resumed=\"false\"} %llu\n"
        "sluice_upstream_tls_handshakes_total{resumed=\"true\"} %llu\n",
        (unsigned long long)load(&up_tls_handshakes[0]),
        (unsigned long long)load(&up_tls_handshakes[1]));
}

void metrics_render(struct evbuffer *out)
{
    pthread_mutex_lock(&registry_lock);
    render_routes(out);
    render_upstream_tls(out);
    pthread_mutex_unlock(&registry_lock);
    evbuffer_add_printf(out, "# HELP sluice_worker_requests_total Requests read by each worker thread.\n"
                             "# TYPE sluice_worker_requests_total counter\n");
    for (int i = 0; i < METRICS_MAX_WORKERS; i++) {
        uint64_t v = load(&worker_requests[i]);
        if (v)
            evbuffer_add_printf(out, "sluice_worker_requests_total{worker=\"%d\"} %llu\n", i,
                                (unsigned long long)v);
    }
    evbuffer_add_printf(out, "# HELP sluice_decision_requests_total Requests a gateway asked "
                             "the decision listener about, by decision.\n"
                             "# TYPE sluice_decision_requests_total counter\n");
    for (int d = 0; d < METRICS_NDECISIONS; d++)
        evbuffer_add_printf(out, "sluice_decision_requests_total{decision=\"%s\"} %llu\n",
                            metrics_decision_name((enum metrics_decision)d),
                            (unsigned long long)load(&decision_mode[d]));
    render_counter(out, "sluice_redis_requests_total", "Decisions sent to Redis.",
                   METRICS_REDIS_REQUESTS);
    render_redis_errors(out);
    render_counter(out, "sluice_deny_cache_hits_total",
                   "Requests denied from the deny cache without a Redis call.",
                   METRICS_DENY_CACHE_HITS);
    render_counter(out, "sluice_key_fallbacks_total",
                   "Limit keys counted under the client address: a key source was absent.",
                   METRICS_KEY_FALLBACKS);
    render_counter2(out, "sluice_client_requests_total", "Requests read from clients, by protocol.",
                    "protocol", "HTTP/1", METRICS_REQUESTS_HTTP1, "HTTP/2", METRICS_REQUESTS_HTTP2);
    render_jwt(out);
    render_hist(out, "sluice_redis_duration_seconds", "Time from sending a decision to its answer.",
                &hists[METRICS_REDIS_SECONDS]);
    render_batch(out);
    render_hist(out, "sluice_upstream_duration_seconds",
                "Time from forwarding a request to the end of its response.",
                &hists[METRICS_UPSTREAM_SECONDS]);
    render_hist(out, "sluice_delay_seconds",
                "How long delayed requests (a limit's delay) were held before forwarding.",
                &hists[METRICS_DELAY_SECONDS]);
    evbuffer_add_printf(out,
        "# HELP sluice_connections Open connections by side.\n# TYPE sluice_connections gauge\n"
        "sluice_connections{side=\"client\"} %lld\nsluice_connections{side=\"upstream\"} %lld\n",
        (long long)metrics_gauge_get(METRICS_CONN_CLIENT),
        (long long)metrics_gauge_get(METRICS_CONN_UPSTREAM));
    evbuffer_add_printf(out,
        "# HELP sluice_redis_connected Workers whose Redis connection is up.\n"
        "# TYPE sluice_redis_connected gauge\nsluice_redis_connected %lld\n",
        (long long)metrics_gauge_get(METRICS_REDIS_CONNECTED));
    evbuffer_add_printf(out,
        "# HELP sluice_access_log_dropped_total Access-log lines dropped because the writer fell behind.\n"
        "# TYPE sluice_access_log_dropped_total counter\nsluice_access_log_dropped_total %llu\n",
        (unsigned long long)load(&counters[METRICS_ACCESS_LOG_DROPPED]));
    render_counter2(out, "sluice_redis_redirects_total", "Redis Cluster redirects followed, by kind.",
                    "kind", "ask", METRICS_REDIS_REDIRECTS_ASK, "moved", METRICS_REDIS_REDIRECTS_MOVED);
    evbuffer_add_printf(out,
        "# HELP sluice_config_reloads_total Config reloads by result.\n"
        "# TYPE sluice_config_reloads_total counter\n"
        "sluice_config_reloads_total{result=\"ok\"} %llu\n"
        "sluice_config_reloads_total{result=\"error\"} %llu\n",
        (unsigned long long)load(&counters[METRICS_RELOADS_OK]),
        (unsigned long long)load(&counters[METRICS_RELOADS_FAILED]));
    render_config(out);
    render_tls(out);
}

void metrics_shutdown(void)
{
    pthread_mutex_lock(&registry_lock);
    unrouted = NULL;
    while (routes) {
        struct metrics_route *m = routes;
        routes = m->next;
        free(m->name);
        free(m);
    }
    while (up_tls_failures) {
        struct metrics_up_tls_failure *f = up_tls_failures;
        up_tls_failures = f->next;
        free(f->upstream);
        free(f);
    }
    pthread_mutex_unlock(&registry_lock);
}
