/* sluice - metrics.h: process-wide counters, gauges and histograms.
 *
 * A leaf: other modules push to it (the store its redirects and readiness,
 * the access log its drops), it calls none of them. Workers update with
 * relaxed atomic adds, so the totals are exact across threads without
 * locks; the admin thread renders them in the Prometheus text format.
 * Per-route series live in a registry keyed by route name that outlives
 * config reloads, so counters never go backwards. */
#ifndef SLUICE_METRICS_H
#define SLUICE_METRICS_H

#include <stdint.h>

struct evbuffer;

enum metrics_decision {
    METRICS_ALLOWED, METRICS_LIMITED, METRICS_SHADOW_LIMITED, METRICS_ERROR,
    METRICS_DELAYED,        /* admitted with a delay: held, then forwarded */
    METRICS_NDECISIONS
};
enum metrics_hist {
    METRICS_REDIS_SECONDS, METRICS_UPSTREAM_SECONDS,
    METRICS_DELAY_SECONDS,  /* how long delayed requests were held */
    METRICS_NHIST
};
enum metrics_counter {
    METRICS_REDIS_REQUESTS, METRICS_REDIS_ERRORS, METRICS_DENY_CACHE_HITS,
    METRICS_RELOADS_OK, METRICS_RELOADS_FAILED,
    METRICS_REDIS_REDIRECTS_ASK, METRICS_REDIS_REDIRECTS_MOVED,    /* cluster redirects followed */
    METRICS_ACCESS_LOG_DROPPED,     /* lines a writer was too far behind for */
    METRICS_KEY_FALLBACKS,          /* a key source absent: counted by client address */
    METRICS_REQUESTS_HTTP1,         /* request heads read, by protocol */
    METRICS_REQUESTS_HTTP2,
    METRICS_NCOUNTERS
};
/* Why a decision got no answer from Redis (sluice_redis_errors_total{reason}). */
enum metrics_redis_error {
    METRICS_REDIS_ERR_ERROR,        /* an error reply, or a reply sluice cannot read */
    METRICS_REDIS_ERR_TIMEOUT,      /* no answer within redis.timeout */
    METRICS_REDIS_ERR_UNAVAILABLE,  /* not connected: nothing was sent */
    METRICS_REDIS_ERR_OOM,          /* -OOM: Redis is at maxmemory with noeviction */
    METRICS_NREDIS_ERRORS
};
/* Why a TLS handshake with a client failed
 * (sluice_tls_handshake_failures_total{reason}). */
enum metrics_tls_failure {
    METRICS_TLS_TIMEOUT,            /* not done within client.header_timeout */
    METRICS_TLS_CLOSED,             /* the client closed or reset the connection */
    METRICS_TLS_NOT_TLS,            /* plaintext HTTP, or other bytes that are not TLS */
    METRICS_TLS_VERSION,            /* a protocol version below min_version */
    METRICS_TLS_CIPHER,             /* no cipher suite or group in common */
    METRICS_TLS_OTHER,
    METRICS_NTLS_FAILURES
};
/* What became of the token of a request on a route that reads tokens
 * (sluice_jwt_tokens_total{result}): its signature checked, a repeat the
 * worker's cache answered, none, given twice, or METRICS_JWT_FAILED plus
 * the jwt_status (jwt.h, 1..8) it failed with. */
enum metrics_jwt {
    METRICS_JWT_VERIFIED, METRICS_JWT_CACHED, METRICS_JWT_MISSING, METRICS_JWT_TWICE,
    METRICS_JWT_FAILED,
    METRICS_NJWT = METRICS_JWT_FAILED + 9
};
enum metrics_gauge {
    METRICS_CONN_CLIENT, METRICS_CONN_UPSTREAM, METRICS_REDIS_CONNECTED, METRICS_NGAUGES
};

struct metrics_route;

/* The series of the route called name, created on first sight (at config
 * load, by the main thread); it lives until metrics_shutdown(). */
struct metrics_route *metrics_route(const char *name);

/* The series of responses given before any route matched. */
struct metrics_route *metrics_unrouted(void);

void metrics_request(struct metrics_route *m, enum metrics_decision d);
void metrics_response(struct metrics_route *m, int status);
/* A gRPC call ended with grpc-status code (0..16):
 * sluice_grpc_responses_total{route,grpc_status}. */
#define METRICS_NGRPC 17
void metrics_grpc(struct metrics_route *m, int code);
/* A path_regex match of route m stopped at its limit (answered 400). */
void metrics_regex_limit(struct metrics_route *m);
/* cost_from: units charged to a route's limits after a response. */
void metrics_cost(struct metrics_route *m, int64_t units);
void metrics_count(enum metrics_counter which);
void metrics_add(enum metrics_counter which, uint64_t n);
uint64_t metrics_counter_get(enum metrics_counter which);
/* One decision Redis did not answer: counts METRICS_REDIS_ERRORS and why. */
void metrics_redis_error(enum metrics_redis_error why);
/* A decision listener's request was decided d (also counted on its route):
 * sluice_decision_requests_total{decision}. */
void metrics_decision_mode(enum metrics_decision d);
/* A request read by worker thread `worker` (shows that every worker serves). */
void metrics_worker_request(int worker);
void metrics_jwt(int result);
/* TLS handshakes with clients: one completed, or one failed and why. */
void metrics_tls_handshake(void);
void metrics_tls_failure(enum metrics_tls_failure why);
void metrics_gauge_add(enum metrics_gauge which, int64_t delta);
int64_t metrics_gauge_get(enum metrics_gauge which);
void metrics_observe(enum metrics_hist which, int64_t usec);
/* One script call carrying `requests` decisions (sluice_redis_batch_size). */
void metrics_batch(int requests);

/* The name of decision d in sluice_requests_total{decision} ("allowed"...). */
const char *metrics_decision_name(enum metrics_decision d);
/* Each route's name and its METRICS_NDECISIONS decision counts, in registry
 * order, the unrouted series left out; under the registry lock (fn must not
 * call metrics_route). */
void metrics_routes_each(void (*fn)(void *arg, const char *name, const uint64_t *decisions),
                         void *arg);
/* Histogram which: its cumulative-free bucket counts into counts (room for
 * METRICS_MAX_BUCKETS), the upper bounds (us; the last bucket is +Inf and
 * has none) into *bounds_us. Returns the number of buckets. */
#define METRICS_MAX_BUCKETS 16
int metrics_hist_read(enum metrics_hist which, uint64_t *counts, const int64_t **bounds_us);
/* A config was loaded at start or by a reload (ok), or a reload failed:
 * sluice_config_last_reload_success and the load timestamps. */
void metrics_config_load(int ok, int64_t wall_us);
/* A TLS handshake with a server of upstream `upstream` failed for reason
 * (tls_upstream_reason_name): sluice_upstream_tls_failures_total. Rare, so
 * it takes the registry lock. */
void metrics_upstream_tls_failure(const char *upstream, const char *reason);
/* A TLS handshake with an upstream server completed (resumed: a session
 * was resumed): sluice_upstream_tls_handshakes_total. */
void metrics_upstream_tls_handshake(int resumed);

/* Append the whole exposition to out. */
void metrics_render(struct evbuffer *out);

/* Free the registry at exit. */
void metrics_shutdown(void);

#endif
