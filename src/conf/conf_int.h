/* sluice - conf_int.h: private to the config loader; include it after
 * conf.h. Its files, each calling only those under it: conf_load.c on top,
 * then conf_net.c, conf_redis.c, conf_limits.c, conf_jwt.c, conf_rls.c (the
 * files of decision.ratelimit_config, which conf_load.c reads), then conf_tls.c, then
 * conf_value.c, then conf.c at the ground. The
 * node tree of phase 1, the walker's context and key tables of phase 2, and
 * the helpers the section files share. src/conf.h is the public interface. */
#ifndef SLUICE_CONF_INT_H
#define SLUICE_CONF_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct conf;
struct conf_addr;
struct conf_jwt;
struct conf_mark;
struct conf_redis;
struct conf_tls_client;

#define CONF_MAX_FILE_BYTES (4 << 20)
#define CONF_MAX_DEPTH      32
/* Ten years: far beyond any sane window, small enough that ms -> us and the
 * Lua script's doubles stay exact. */
#define CONF_MAX_DURATION_MS (3650LL * 86400 * 1000)
#define CONF_MAX_COUNT      1000000000LL    /* limit, burst */
#define CONF_MAX_NAME       64
#define CONF_MAX_PREFIX     256
#define CONF_MAX_HOSTNAME   253
#define CONF_MAX_REGEX      512     /* path_regex bytes */
#define CONF_MAX_REGEX_WEIGHT 256     /* see regex_weight() */
#define CONF_MAX_CAPTURES   9       /* capture:1..9 */
#define CONF_MAX_COST       1000000 /* route cost */
#define CONF_MAX_MESSAGE    256     /* limit message bytes */
#define CONF_MAX_MEMORY_KEYS 100000000LL   /* memory.max_keys, deny_cache.max_keys */
#define CONF_MAX_OVERRIDES  1000    /* overrides per limit (looked up in a list) */
#define CONF_MAX_PART       1024    /* bytes of one override key value */
#define CONF_MAX_PLAN_KEY   256     /* plans.assign keys (a longer key part is hashed) */
#define CONF_MAX_TOKEN      256     /* admin.token bytes */
#define CONF_MAX_ADMIN_HOSTS 64     /* admin.hosts names */
#define SHOW_BUF            80

enum node_kind { NODE_NULL, NODE_SCALAR, NODE_SEQ, NODE_MAP };

struct node {
    enum node_kind kind;
    int line, col;              /* 1-based */
    char *str;                  /* scalar (and null) text as written */
    int substituted;            /* ${VAR} already expanded in str */
    struct node **kids;         /* seq: items; map: key, value, key, value... */
    int nkids;
};

struct ctx {
    const char *file;
    const char *buf;            /* the file's bytes, for reader error offsets */
    size_t len;
    char *err;                  /* first error, malloc'd */
    char path[256];             /* key path of the node being checked */
    size_t pathlen;
    struct conf *c;
    struct node *routes;        /* the routes sequence, for phase 3 */
};

struct key_def {
    const char *name;
    int (*fn)(struct ctx *x, struct node *k, struct node *v, void *obj);
    int required;
};

/* ---- memory: allocation failure is not recoverable in a proxy */
static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static inline void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        abort();
    return p;
}

static inline char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static inline char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

/* ---- conf.c: errors, key path, node kinds, the walker. Phase 2 handlers
 * are (ctx, key node, value node, object). */
const char *conf_show(const char *s, char *out);
__attribute__((format(printf, 3, 4)))
int conf_fail(struct ctx *x, const struct node *n, const char *fmt, ...);
__attribute__((format(printf, 3, 4)))
int conf_fail_bare(struct ctx *x, const struct node *n, const char *fmt, ...);
__attribute__((format(printf, 4, 5)))
int conf_fail_mark(struct ctx *x, int line, int col, const char *fmt, ...);
const char *conf_where(const struct ctx *x);
__attribute__((format(printf, 2, 3)))
size_t conf_path_push(struct ctx *x, const char *fmt, ...);
size_t conf_path_push_key(struct ctx *x, const char *key);
void conf_path_pop(struct ctx *x, size_t old);
void conf_mark_node(const struct ctx *x, const struct node *n, struct conf_mark *m);
struct node *conf_map_key(const struct node *m, const char *key);
struct node *conf_map_get(const struct node *m, const char *key);
const char *conf_kind_name(enum node_kind k);
int conf_expect(struct ctx *x, const struct node *n, enum node_kind k);
int conf_walk_map(struct ctx *x, struct node *n, const struct key_def *defs, void *obj);

/* ---- conf_value.c: typed access to nodes, values */
const char *conf_scalar(struct ctx *x, struct node *n);
const char *conf_name_scalar(struct ctx *x, struct node *n);
int conf_parse_int(const char *s, int64_t *out);
int conf_get_int(struct ctx *x, struct node *n, int64_t min, int64_t max, int64_t *out);
int conf_get_duration(struct ctx *x, struct node *n, int64_t *out_ms);
int conf_get_size(struct ctx *x, struct node *n, uint64_t min, uint64_t max, uint64_t *out);
int conf_get_bool(struct ctx *x, struct node *n, int *out);
int conf_get_enum(struct ctx *x, struct node *n, const char *const *names, int count,
                  const char *choices, int *out);
const char *conf_parse_digits(const char *s, int64_t *out);
int conf_hostname_ok(const char *s);
int conf_split_addr(const char *s, char host[CONF_MAX_HOSTNAME + 1],
                    const char **port_text, int *family);
int conf_get_addr(struct ctx *x, struct node *n, struct conf_addr *a);
char *conf_pct_decode(const char *s, size_t n);
int conf_host_chars_ok(const char *s, size_t n);
int conf_is_token(const char *s);

/* ---- conf_tls.c: a TLS client block (upstreams.NAME.tls, redis.tls) */
extern const struct key_def conf_tls_client_keys[];
int conf_check_tls_file(struct ctx *x, struct node *tls, const char *key, const char *path);

/* ---- conf_net.c */
int conf_h_listen(struct ctx *x, struct node *k, struct node *v, void *obj);
void conf_listens_free(struct conf *c);
int conf_h_decision(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_decision_merge(struct ctx *x, struct node *root);
int conf_h_workers(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_max_connections(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_shutdown_timeout(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_client(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_upstreams(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_admin(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_access_log(struct ctx *x, struct node *k, struct node *v, void *obj);

/* ---- conf_redis.c */
const char *conf_parse_redis_url(const char *url, struct conf_redis *r);
void conf_redis_free_target(struct conf_redis *r);
void conf_redis_free_tls(struct conf_tls_client *t);
int conf_h_redis(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_backend(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_memory(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_deny_cache(struct ctx *x, struct node *k, struct node *v, void *obj);

/* ---- conf_rls.c: decision.ratelimit_config's files (conf_load.c reads them) */
struct conf_rls;
int conf_rls_file(struct ctx *x, struct node *root, struct conf_rls *rls);
void conf_rls_done(struct conf_rls *rls);
void conf_rls_free(struct conf_rls *rls);

/* ---- conf_limits.c */
int conf_h_trusted(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_allow(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_routes(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_paths(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_h_plans(struct ctx *x, struct node *k, struct node *v, void *obj);

/* ---- conf_jwt.c */
int conf_h_jwt(struct ctx *x, struct node *k, struct node *v, void *obj);
int conf_check_jwt(struct ctx *x, struct node *root);
void conf_jwt_free(struct conf_jwt *j);

#endif
