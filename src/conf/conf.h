/* sluice - conf.h: the parsed configuration.
 *
 * conf_load() turns a YAML file into a struct conf, validated in phases
 * (syntax, each key, then across keys). A struct conf is immutable once
 * loaded; workers share it read-only. It is reference counted so that a
 * reload can swap in a new one while requests started under the old one
 * finish: every holder calls conf_retain() and conf_release(); the last
 * release frees it. Only conf_load.c includes yaml.h.
 *
 * The loader (conf_load.c and the conf*.c under it) parses and checks
 * syntax and values only, and includes no module that uses a config. What
 * needs those modules (the listeners' TLS contexts, the upstreams'
 * certificate and key files, the overrides' Redis keys) is built and checked
 * by confcheck_load() (confcheck.h) above it, which every loader calls;
 * conf.c records the place (struct conf_mark) of each node those checks may
 * blame. */
#ifndef SLUICE_CONF_H
#define SLUICE_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "addr.h"
#include "limiter.h"

enum conf_on_error { CONF_ON_ERROR_ALLOW, CONF_ON_ERROR_DENY, CONF_ON_ERROR_LOCAL };
enum conf_backend { CONF_BACKEND_REDIS, CONF_BACKEND_MEMORY };
/* Which rate-limit fields a route's responses carry. */
enum conf_headers { CONF_HEADERS_FULL, CONF_HEADERS_IETF, CONF_HEADERS_LEGACY, CONF_HEADERS_NONE };
/* Request fields whose names hold '_' (read as '-' by CGI-style upstreams). */
enum conf_underscore { CONF_UNDERSCORE_DROP, CONF_UNDERSCORE_PASS, CONF_UNDERSCORE_REJECT };
/* A limit's answer to a request lacking one of its key sources: counted
 * under the client address (a key space of its own), 400, or not counted. */
enum conf_missing_key { CONF_MISSING_IP, CONF_MISSING_DENY, CONF_MISSING_PASS };

#define CONF_MAX_STATUS 600
#define CONF_MAX_LIMITS 16             /* per route (backend.h: STORE_MAX_LIMITS) */
/* client.max_header_bytes at most: the largest head http1.c parses
 * (http1.h: HTTP1_MAX_HEAD_BYTES, held equal in client.c) */
#define CONF_MAX_HEADER_BYTES (80 * 1024)

/* A host:port (or [v6]:port, or unix:///path for Redis) resolved at load time. */
struct conf_addr {
    struct sockaddr_storage ss;
    socklen_t sslen;
    char *text;                 /* as written, for logs: "127.0.0.1:9000" */
};

/* A node of the file a check after parsing (confcheck.c) may blame: its
 * key path as errors name it ("upstreams.api.tls.key_file") and its 1-based
 * line and column. where is NULL when the node is absent. */
struct conf_mark {
    char *where;
    int line, col;
};

/* A listener's TLS (listen: entries with tls:). at: the certificate
 * entry, for the errors of loading it. */
struct conf_cert {
    char *cert_file;            /* PEM: the certificate, then its chain */
    char *key_file;
    struct conf_mark at;
};

struct conf_tls {
    struct conf_cert *certs;    /* the first is the default (no SNI match) */
    int ncerts;
    int min_version;            /* 12 (default) or 13: TLS 1.2 or 1.3 */
    int no_h2;                  /* its listener's http2: false (no ALPN h2) */
};

struct tls_server;

/* One listening address; every worker binds each (SO_REUSEPORT). */
struct conf_listen {
    struct conf_addr addr;
    struct conf_tls *tls;       /* NULL: plain HTTP */
    int no_http2;               /* http2: false; HTTP/2 (ALPN h2, the cleartext
                                 * preface) is taken by default */
    struct tls_server *server;  /* built from tls by confcheck_load (tls_server.h),
                                 * released with the conf (conf_cleanup_add) */
    int decision;               /* a decision.listen entry: its connections are
                                 * in decision mode (docs/decision.md) */
};

/* Envoy's rate limit service configuration, in envoyproxy/ratelimit's own
 * format (domain, nested descriptors), loaded from decision.ratelimit_config
 * (conf_rls.c). A descriptor tree per domain; matching is rls_match.c's. */
enum conf_rls_on_error { CONF_RLS_ON_ERROR_REDIS, CONF_RLS_ON_ERROR_ALLOW,
                         CONF_RLS_ON_ERROR_DENY, CONF_RLS_ON_ERROR_UNAVAILABLE };
/* The RLS units (RateLimitResponse.RateLimit.Unit's numbers). */
enum conf_rls_unit { CONF_RLS_SECOND = 1, CONF_RLS_MINUTE = 2, CONF_RLS_HOUR = 3,
                     CONF_RLS_DAY = 4, CONF_RLS_MONTH = 5, CONF_RLS_YEAR = 6,
                     CONF_RLS_WEEK = 7 };

struct conf_rls_limit {
    int unlimited;
    int64_t requests_per_unit;
    int unit;                   /* enum conf_rls_unit; 0 when unlimited */
    char *name;                 /* rate_limit.name, or NULL */
    char **replaces;            /* names of the limits this one replaces */
    int nreplaces;
    int shadow;                 /* shadow_mode: counted, reported OK */
    int detailed_metric;
    char *path;                 /* "key_value.key2": its place in the domain,
                                 * the name shown when it has none */
    struct limiter_params params;   /* fixed_window per unit unless algorithm */
};

struct conf_rls_node {
    char *key;
    char *value;                /* NULL: any value (no value in the config) */
    char **parts;               /* value split at '*' (wildcard), else NULL */
    int nparts;
    int share_threshold;        /* wildcard: its values share one counter */
    struct conf_rls_limit *limit;   /* NULL: no rate_limit here */
    struct conf_rls_node *kids; /* sorted by key, then value (NULL first) */
    int nkids;
    int *wild;                  /* indexes of the wildcard kids, in file order */
    int nwild;
    int order;                  /* its place in its level in the file */
};

struct metrics_route;

/* The synthetic route RLS decisions count under, and the admin API names
 * a domain's limits by: "rls:DOMAIN" (a route name has no ':'). */
#define CONF_RLS_ROUTE_PREFIX "rls:"

struct conf_rls_domain {
    char *name;
    struct conf_rls_node root;  /* its kids are the domain's descriptors */
    struct metrics_route *metrics;  /* "rls:NAME", set by runtime_bind_metrics() */
};

struct conf_rls {
    struct conf_rls_domain *domains;    /* sorted by name */
    int ndomains;
};

/* decision: sluice as the rate limiter of another gateway. Its listen
 * entries follow the proxy's in conf->listens (marked decision), parsed
 * as listen is; a request there is described, decided and answered, never
 * forwarded. */
struct conf_decision {
    int on;                     /* the section is present */
    int deny_status;            /* rejections' status; 0 (unset): each limit's
                                 * own status, else 429 */
    char *path_prefix;          /* default "/decide": the described-by-headers
                                 * endpoint, and the prefix of Envoy ext_authz's
                                 * original requests (prefix + "/...") */
    size_t path_prefix_len;
    struct conf_listen *listens;    /* while loading; moved to conf->listens */
    int nlistens;
    /* Envoy's RLS v3 (docs/decision.md): the descriptors of
     * decision.ratelimit_config, and how a call is decided. */
    char *ratelimit_config;     /* a file or a directory of files; NULL: none */
    struct conf_rls *rls;       /* loaded from it (an empty set without it) */
    int rls_count_each;         /* rls_consume: every_descriptor (the reference's:
                                 * each descriptor consumes when it allows, even
                                 * when another is over); 0: all_or_nothing */
    enum conf_rls_on_error rls_on_error;    /* Redis down; default: redis.on_error */
};

enum conf_keysrc_kind {
    CONF_KEY_IP, CONF_KEY_HEADER, CONF_KEY_QUERY, CONF_KEY_COOKIE,
    CONF_KEY_METHOD, CONF_KEY_PATH, CONF_KEY_CAPTURE,
    CONF_KEY_GRPC_SERVICE, CONF_KEY_GRPC_METHOD,    /* of a /pkg.Service/Method path */
    CONF_KEY_JWT,               /* jwt:CLAIM: a verified token's claim (arg) */
};

struct conf_keysrc {
    enum conf_keysrc_kind kind;
    char *arg;                  /* header/query/cookie name; NULL otherwise */
    size_t arglen;
    int capture;                /* CONF_KEY_CAPTURE: group 1..9 of path_regex */
    int net;                    /* CONF_KEY_IP from ip/N: key the client's network */
    int bits4, bits6;           /* with net: its prefix lengths (32, 128: whole) */
};

/* overrides: one key's parameters instead of the limit's own. parts are
 * the key's values in the order of the limit's key sources, as the client
 * sends them; key is the Redis key they make (route_key_parts), filled in
 * by confcheck_load. */
struct conf_override {
    char **parts;
    size_t *partlen;
    int nparts;                 /* == the limit's nkeys */
    struct limiter_params params;
    char *key;
    size_t keylen;
};

enum conf_cost_src { CONF_COST_NONE, CONF_COST_HEADER, CONF_COST_TRAILER, CONF_COST_JSON,
                      CONF_COST_SSE };

struct conf_limit {
    char *name;
    struct limiter_params params;
    struct conf_keysrc *keys;
    int nkeys;
    int shadow;                 /* counted and reported, never rejects */
    char *cost_header;          /* header whose integer value is the cost; NULL */
    /* cost_from: the cost is what the response reports (a header, a chunked
     * trailer, a JSON body's or the last SSE event's dotted path); estimate
     * is taken at admission and the difference settled after the response. */
    enum conf_cost_src cost_from;
    char *cost_name;            /* the header or trailer name, or the path */
    int64_t estimate;           /* 1..CONF_MAX_COST, default 1 */
    char *estimate_json;        /* estimate: {json: PATH}: read from the request
                                 * body (buffered first); NULL: estimate alone */
    /* count_status: only responses with these statuses consume; the check
     * before forwarding still rejects a key already over its limit. */
    int has_count_status;
    uint8_t count_status[CONF_MAX_STATUS];  /* 1 = counts */
    int status;                 /* rejection status, default 429 */
    char *message;              /* rejection "message" in the JSON body; NULL */
    struct tzcal *tz;           /* calendar: true: its zone (params.tz); NULL */
    struct conf_override *overrides;    /* per-key parameters; NULL */
    int noverrides;
    enum conf_missing_key on_missing_key;   /* default ip */
    /* One key per route (redis.pack_limits, docs/algorithms.md): this
     * limit's tag among its route's parts of one Redis key, FNV-1a of its
     * name (never 0), set by conf_load; 0: a key of its own. */
    uint32_t part;
};

/* upstreams.NAME.tls: present (even {}), the servers speak TLS. */
/* TLS where sluice is the client: to an upstream's servers, and to Redis. */
struct conf_tls_client {
    char *ca_file;              /* NULL: the system trust store */
    char *server_name;          /* SNI and the name verified; NULL: each server's host */
    int verify;                 /* chain and name checked (default 1) */
    char *cert_file;            /* client certificate (mutual TLS), or NULL */
    char *key_file;             /* its key (upstreams: both or neither; Redis: NULL
                                 * when the key is in cert_file) */
    /* upstreams.NAME.tls: the tls key, and each file's value, for the
     * errors of checking the files (confcheck.c). */
    struct conf_mark at, ca_at, cert_at, key_at;
};

struct conf_upstream {
    char *name;
    struct conf_addr *servers;
    int nservers;
    int keepalive;              /* idle connections kept per worker */
    int64_t connect_timeout_ms;
    int64_t timeout_ms;         /* waiting for (each read of) the response */
    struct conf_tls_client *tls;  /* NULL: plain TCP */
    int h2;                     /* protocol: h2 (default http/1.1): ALPN h2
                                 * over tls, else h2c with prior knowledge */
};

struct metrics_route;
struct regex;

struct conf_route {
    char *name;
    struct metrics_route *metrics;  /* set by runtime_bind_metrics() */
    char *path;                 /* normalised prefix, no trailing '/' except "/" */
    size_t pathlen;
    char **methods;             /* upper case; NULL when any method matches */
    int nmethods;
    char *host;                 /* lower case, no port; NULL when any host */
    struct regex *regex;        /* compiled path_regex (regex.h), or NULL;
                                 * then path is NULL and the regex is matched
                                 * against the normalised path */
    char *path_regex;           /* as written */
    int ncaptures;              /* groups in path_regex */
    struct conf_upstream *upstream;     /* NULL: decision mode only (decision:) */
    struct conf_limit *limits;
    int nlimits;
    struct addr_cidr *allow;    /* clients that bypass this route's limits */
    int nallow;
    int64_t cost;               /* units a request consumes, default 1 */
    enum conf_headers headers;  /* default full */
    int upgrade;                /* tunnel Upgrade requests after a 101 */
    char **upgrade_protos;      /* protocols tunnelled; NULL: websocket only */
    int nupgrade_protos;
    int grpc;                   /* match.grpc: only gRPC requests
                                 * (Content-Type application/grpc*) */
    int grpc_limited;           /* grpc-status of a rejection: 8
                                 * (resource_exhausted, default) or 14 */
    char *policy;               /* the RateLimit-Policy value of its limits,
                                 * built once by conf_load (NULL otherwise) */
    size_t policy_len;
    /* plans (docs/plans.md): with plan_key or plan_from set, the client's
     * plan's limits are decided with the route's own. plan_key names the
     * client for assignments (run-time, then plans.assign); plan_from is a
     * request source of the plan's name (a verified claim); both NULL: no
     * plan applies. */
    struct conf_keysrc *plan_key;
    struct conf_keysrc *plan_from;
    int require_jwt;            /* no verified token: 401 */
    int uses_jwt;               /* its requests' tokens are verified: require_jwt,
                                 * a jwt:CLAIM key source, plan_key or plan_from,
                                 * or a plan's limit (set by conf_load) */
    int body_estimate;          /* a limit it may apply (its own or a plan's)
                                 * estimates from the request body: the body
                                 * is read before the decision (conf_load) */
};

/* plans.NAME: a set of limits. route is a route of its own in all but
 * matching (name "plan:NAME", which no route name can be: ':' is not in
 * names): its limits' keys are PREFIX{plan:NAME|LIMIT|parts}, apart per plan
 * and shared by every route applying the plan. */
struct conf_plan {
    char *name;
    struct conf_route route;
};

/* plans.assign: a client's plan_key value and the plan it is on. */
struct conf_plan_assign {
    char *key;
    size_t keylen;
    int plan;                   /* index into conf.plans */
};

struct jwt_keys;

/* jwt: how tokens are verified (docs/jwt.md). keys is built from
 * jwks_file or secret by confcheck_load (jwt.h) and released with the conf. */
struct conf_jwt {
    int on;                     /* the section is present */
    char *jwks_file;            /* or NULL */
    struct conf_mark jwks_at;   /* its value, for the errors of reading it */
    char *secret;               /* HS256, or NULL */
    size_t secret_len;
    char *issuer;               /* NULL: not checked */
    char *audience;             /* NULL: not checked */
    int64_t leeway_s;           /* default 30 */
    char *cookie;               /* a cookie that may carry the token; NULL */
    struct jwt_keys *keys;
};

struct conf_redis {
    char *url;
    int is_unix;
    char *host;                 /* tcp host, or the socket path when is_unix */
    int port;
    int db;
    char *user;                 /* NULL when absent */
    char *password;             /* NULL when absent */
    int64_t timeout_ms;
    char *prefix;
    enum conf_on_error on_error;
    /* Redis Cluster: seed nodes "host:port" (ncluster 0: not a cluster). */
    char **cluster;
    int ncluster;
    /* Redis Sentinel: the master's name and the sentinels "host:port"
     * (sentinel_master NULL: no sentinel). */
    char *sentinel_master;
    char **sentinel_nodes;
    int nsentinel_nodes;
    char *sentinel_password;    /* NULL when absent */
    /* Decisions read each limit's run-time override key (store.h): on when
     * admin.token is set, since only then can the admin API write one. */
    int overrides;
    /* redis.pack_limits (default on): a route's limits that can share one
     * key do (conf_limit.part). */
    int pack_limits;
    /* TLS to every node, sentinels too: a rediss:// url or a redis.tls
     * section. Strings NULL when absent: the system trust store, no client
     * certificate, the host connected to. */
    int tls;
    struct conf_tls_client tls_conf;
};

struct conf_client {
    size_t max_header_bytes;    /* head larger than this: 431 (default 16384) */
    uint64_t max_body_bytes;    /* 0 = unlimited; larger body: 413 */
    int64_t header_timeout_ms;  /* whole head must arrive in this (default 10s) */
    int64_t idle_timeout_ms;    /* keep-alive idle time (default 60s) */
    int64_t body_timeout_ms;    /* no body byte for this long: close (default 60s) */
    enum conf_underscore underscore_headers;    /* default drop (before forwarding) */
    size_t buffer_body_bytes;   /* bodies up to this are read whole before an
                                 * upstream connection is taken; 0 = stream all
                                 * (default 65536) */
    uint32_t http2_max_streams; /* HTTP/2 streams open, and in flight, per
                                 * connection (default 128) */
    uint32_t http2_max_requests; /* per HTTP/2 connection, then GOAWAY
                                 * (default 1000; 0 = no bound) */
};

/* How request paths are read for matching and for path/capture keys (the
 * request still goes upstream as sent). Defaults as nginx: both off. */
struct conf_paths {
    int case_insensitive;       /* case: insensitive; default sensitive */
    int strip_matrix;           /* matrix_params: strip; default keep */
};

struct conf {
    char *file;
    struct conf_addr listen;    /* the first of listens (for logs and checks) */
    struct conf_listen *listens;    /* listen's entries, then decision.listen's */
    int nlistens;               /* >= 1 */
    struct conf_decision decision;
    int workers;                /* >= 1; "auto" resolved at load time */
    int max_connections;        /* per process; 0 = unlimited (default 10000) */
    int64_t shutdown_timeout_ms; /* requests in flight may finish (default 10s) */
    struct conf_client client;
    struct conf_paths paths;
    struct conf_redis redis;
    struct conf_upstream *upstreams;
    int nupstreams;
    struct conf_route *routes;
    int nroutes;
    struct addr_cidr *trusted;
    int ntrusted;
    struct addr_cidr *allow;    /* top-level allow: bypass every limit */
    int nallow;
    enum conf_backend backend;  /* default redis */
    size_t memory_max_keys;     /* memory backend bound, default 1000000 */
    size_t deny_cache_max_keys; /* per worker, default 100000; 0 = off */
    int has_admin;
    struct conf_addr admin_listen;
    char *admin_token;          /* writes to the admin API need it; NULL: refused */
    char **admin_hosts;         /* Host names the admin endpoint answers besides
                                 * its address, localhost and IP literals */
    int nadmin_hosts;
    char *access_log;           /* NULL = off, "stdout", or a file path */
    struct conf_plan *plans;    /* plans:, NULL when absent */
    int nplans;
    int plan_default;           /* plans.default: index into plans */
    struct conf_plan_assign *plan_assign;   /* plans.assign, sorted by key */
    int nplan_assign;
    struct conf_jwt jwt;
    int refs;                   /* atomic; starts at 1 */
    struct conf_cleanup *cleanups;  /* conf_cleanup_add, newest first */
};

/* Load and validate FILE. On success returns a conf with one reference.
 * On failure returns NULL and sets *err to a malloc'd "FILE:LINE:COL: message"
 * (the caller frees it). */
struct conf *conf_load(const char *file, char **err);
/* With on (sluice -t), conf_load() also looks up the Redis host names
 * (redis.url, cluster seeds, sentinels) once with getaddrinfo: one that does
 * not resolve is an error naming its place. Off (the default, a running
 * proxy): the store resolves them at each connect without blocking, as a
 * Redis starting beside sluice may not have a name yet. */
void conf_check_names(int on);

void conf_retain(struct conf *c);
void conf_release(struct conf *c);

/* fn(arg) runs when c is freed (its last release), newest first: how what a
 * module above conf built for this config (confcheck.c: the listeners' TLS
 * contexts) goes with it, as nginx's pool cleanups do. Before c is shared
 * (one thread). */
void conf_cleanup_add(struct conf *c, void (*fn)(void *arg), void *arg);

/* Parsers shared with tests: return 0 and set *out, or -1. */
/* The RateLimit-Policy value of r's limits ("name";q=N;w=S, ... as
 * reply.c sends it), malloc'd, its length in *len. q[i] and w_ms[i] are
 * limit i's quota and window as applied (an override's), or both NULL for
 * the configured ones: conf_load keeps that text in r->policy. */
char *conf_route_policy(const struct conf_route *r, const int64_t *q, const int64_t *w_ms,
                        size_t *len);

/* An RLS unit's length in seconds as the reference counts it (a month is
 * 30 days, a year 365); 0 for a number that is no unit. */
int64_t conf_rls_unit_seconds(int unit);
/* The plan named name[0..n) in c, or NULL. */
const struct conf_plan *conf_plan_find(const struct conf *c, const char *name, size_t n);
/* plans.assign's plan for a plan_key value, or NULL. A binary search. */
const struct conf_plan *conf_plan_assigned(const struct conf *c, const char *key, size_t n);

int conf_parse_duration_ms(const char *s, int64_t *out_ms);
int conf_parse_rate(const char *s, int64_t *count, int64_t *period_ms);
/* A bucket's (token_bucket, gcra) time per token for a rate of count per
 * period_ms, at least 1 us. */
int64_t conf_rate_interval_us(int64_t count, int64_t period_ms);
/* p->window_ms: the time a bucket of p->limit tokens takes to refill at
 * p->interval_us (at least 1 ms); -1 when that is beyond 3650d. */
int conf_bucket_window(struct limiter_params *p);

/* 1 when addr (AF_INET/AF_INET6 sockaddr) is inside any of cidrs: kept
 * for its callers, the match is addr.c's (addr_cidr_match). */
static inline int conf_cidr_match(const struct addr_cidr *cidrs, int n,
                                  const struct sockaddr *addr)
{
    return addr_cidr_match(cidrs, n, addr);
}

#endif
