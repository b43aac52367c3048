/* sluice - conf_redis.c: the config sections about the limiter's store:
 * backend, memory, deny_cache and redis (url, timeout, prefix, on_error,
 * tls, cluster, sentinel), with redis URL parsing and the optional name
 * lookup of Redis hosts (conf_check_names). */
#include "conf.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "conf_int.h"

/* ---- redis.url */

/* redis://[user:password@]host[:port][/db] or unix:///path.sock[?db=N].
 * Returns NULL or the reason; never echoes the URL (it may hold a password). */
const char *conf_parse_redis_url(const char *url, struct conf_redis *r)
{
    const char *p, *auth_end, *at, *hp, *he, *colon;
    int64_t db = 0;

    if (!strncmp(url, "unix://", 7)) {
        const char *path = url + 7, *q = strchr(path, '?');
        size_t plen = q ? (size_t)(q - path) : strlen(path);
        if (plen < 2 || path[0] != '/')
            return "unix socket path must be absolute";
        if (plen >= sizeof(((struct sockaddr_un *)0)->sun_path))
            return "unix socket path too long";
        if (q) {
            const char *e;
            if (strncmp(q, "?db=", 4) || !(e = conf_parse_digits(q + 4, &db)) || *e || db > 65535)
                return "db must be ?db=N with N in 0..65535";
        }
        r->is_unix = 1;
        r->host = xstrndup(path, plen);
        r->port = 0;
        r->db = (int)db;
        return NULL;
    }
    r->tls = !strncmp(url, "rediss://", 9);
    if (strncmp(url, "redis://", 8) && !r->tls)
        return "scheme must be redis://, rediss:// or unix://";
    p = url + 8 + r->tls;
    auth_end = p + strcspn(p, "/?#");
    if (*auth_end == '?' || *auth_end == '#')
        return "query and fragment are not supported on redis:// or rediss://";
    at = NULL;
    for (const char *q = p; q < auth_end; q++)
        if (*q == '@')
            at = q;
    hp = p;
    if (at) {
        colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return "credentials must be user:password@ (user may be empty)";
        if (colon > p && !(r->user = conf_pct_decode(p, (size_t)(colon - p))))
            return "bad percent-escape in user";
        if (!(r->password = conf_pct_decode(colon + 1, (size_t)(at - colon - 1))))
            return "bad percent-escape in password";
        hp = at + 1;
    }
    r->port = 6379;
    if (*hp == '[') {
        char v6[INET6_ADDRSTRLEN];
        unsigned char probe[sizeof(struct in6_addr)];
        he = memchr(hp, ']', (size_t)(auth_end - hp));
        if (!he || (size_t)(he - hp - 1) >= sizeof v6)
            return "bad [IPv6] host";
        memcpy(v6, hp + 1, (size_t)(he - hp - 1));
        v6[he - hp - 1] = '\0';
        if (inet_pton(AF_INET6, v6, probe) != 1)
            return "bad [IPv6] host";
        r->host = xstrdup(v6);
        colon = he + 1 < auth_end ? he + 1 : NULL;
        if (colon && *colon != ':')
            return "bad [IPv6] host";
    } else {
        colon = memchr(hp, ':', (size_t)(auth_end - hp));
        he = colon ? colon : auth_end;
        if (!conf_host_chars_ok(hp, (size_t)(he - hp)))
            return "bad host";
        r->host = xstrndup(hp, (size_t)(he - hp));
    }
    if (colon) {
        if (addr_port(colon + 1, (size_t)(auth_end - colon - 1), &r->port) < 0)
            return "port must be 1..65535";
    }
    if (*auth_end == '/' && auth_end[1]) {
        const char *e = conf_parse_digits(auth_end + 1, &db);
        if (!e || *e || db > 65535)
            return "db must be a number in 0..65535";
    }
    r->is_unix = 0;
    r->db = (int)db;
    return NULL;
}

void conf_redis_free_target(struct conf_redis *r)
{
    free(r->url);
    free(r->host);
    free(r->user);
    free(r->password);
    r->url = r->host = r->user = r->password = NULL;
}

/* The store resolves redis.url's host at every connect, off the loop
 * (evdns); looking it up once here makes a name that does not resolve a
 * config error naming its place, as upstream names are. */
static int check_names;         /* conf_check_names() */

void conf_check_names(int on)
{
    check_names = on;
}

static int redis_resolve_check(struct ctx *x, struct node *v, const char *host)
{
    char sb[SHOW_BUF];
    unsigned char probe[sizeof(struct in6_addr)];
    struct addrinfo hints, *res;
    if (!check_names || inet_pton(AF_INET, host, probe) == 1 ||
        inet_pton(AF_INET6, host, probe) == 1)
        return 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0)
        return conf_fail(x, v, "cannot resolve redis host '%s': %s", conf_show(host, sb),
                         gai_strerror(rc == -1 ? EAI_FAIL : rc));
    freeaddrinfo(res);
    return 0;
}

/* ---- redis: tls, url, timeout, prefix, on_error, cluster, sentinel */

/* redis.tls: TLS to every node, whatever the url's scheme. */
static int h_redis_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    struct conf_tls_client *t = &r->tls_conf;
    if (conf_walk_map(x, v, conf_tls_client_keys, t) < 0 ||
        conf_check_tls_file(x, v, "ca_file", t->ca_file) < 0 ||
        conf_check_tls_file(x, v, "cert_file", t->cert_file) < 0 ||
        conf_check_tls_file(x, v, "key_file", t->key_file) < 0)
        return -1;
    if (r->tls_conf.key_file != NULL && r->tls_conf.cert_file == NULL)
        return conf_fail(x, k, "key_file needs cert_file");
    r->tls = 1;
    return 0;
}

void conf_redis_free_tls(struct conf_tls_client *t)
{
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    free(t->server_name);
    t->ca_file = t->cert_file = t->key_file = t->server_name = NULL;
    free(t->at.where);
    free(t->ca_at.where);
    free(t->cert_at.where);
    free(t->key_at.where);
    t->at.where = t->ca_at.where = t->cert_at.where = t->key_at.where = NULL;
}

static int h_redis_url(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj, t = { 0 };
    const char *s = conf_scalar(x, v), *why;
    if (!s)
        return -1;
    why = conf_parse_redis_url(s, &t);
    if (why) {
        conf_redis_free_target(&t);
        return conf_fail(x, v, "bad redis url: %s (use redis://[user:password@]host[:port][/db] "
                         "or unix:///path.sock[?db=N])", why);
    }
    if (!t.is_unix && redis_resolve_check(x, v, t.host) < 0) {
        conf_redis_free_target(&t);
        return -1;
    }
    /* The parsed target moves into r whole (r's old strings are freed). */
    conf_redis_free_target(r);
    r->url = xstrdup(s);
    r->host = t.host;
    r->user = t.user;
    r->password = t.password;
    r->is_unix = t.is_unix, r->port = t.port, r->db = t.db;
    r->tls |= t.tls;
    return 0;
}

static int h_redis_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_redis *)obj)->timeout_ms);
}

static int h_redis_prefix(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    /* Braces would become the Redis Cluster hash tag of every key. */
    if (strpbrk(s, "{}"))
        return conf_fail(x, v, "prefix must not contain '{' or '}' (keys use them as the "
                         "Redis Cluster hash tag)");
    if (strlen(s) > CONF_MAX_PREFIX)
        return conf_fail(x, v, "prefix is longer than %d bytes", CONF_MAX_PREFIX);
    free(r->prefix);
    r->prefix = xstrdup(s);
    return 0;
}

static int h_redis_pack_limits(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct conf_redis *)obj)->pack_limits);
}

static int h_redis_on_error(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "allow", "deny", "local" };
    int i = 0;
    if (conf_get_enum(x, v, names, 3, "allow, deny or local", &i) < 0)
        return -1;
    ((struct conf_redis *)obj)->on_error = (enum conf_on_error)i;
    return 0;
}

/* A node the store connects to later (a cluster seed, a sentinel):
 * host:port or [v6]:port; names are looked up at connect time, so only their
 * shape is checked here. */
static int node_addr_ok(const char *s)
{
    char host[CONF_MAX_HOSTNAME + 1];
    unsigned char probe[sizeof(struct in6_addr)];
    const char *ps;
    int family;
    if (conf_split_addr(s, host, &ps, &family) < 0)
        return 0;
    if (family == AF_INET6)
        return inet_pton(AF_INET6, host, probe) == 1;
    return inet_pton(AF_INET, host, probe) == 1 || conf_hostname_ok(host);
}

static int node_resolve_check(struct ctx *x, struct node *v, const char *a)
{
    char host[CONF_MAX_HOSTNAME + 1];
    const char *ps;
    int family;
    if (conf_split_addr(a, host, &ps, &family) < 0)
        return 0;
    return redis_resolve_check(x, v, host);
}

/* A non-empty sequence of node addresses into *out (owned by the conf). */
static int get_nodes(struct ctx *x, struct node *v, char ***out, int *nout, const char *what)
{
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one %s", what);
    for (int i = 0; i < *nout; i++)
        free((*out)[i]);
    free(*out);
    *out = xcalloc((size_t)v->nkids, sizeof **out);
    *nout = 0;
    for (int i = 0; i < v->nkids; i++) {
        char sb[SHOW_BUF];
        const char *a = conf_scalar(x, v->kids[i]);
        if (!a)
            return -1;
        if (!node_addr_ok(a))
            return conf_fail(x, v->kids[i], "bad %s address '%s' (use HOST:PORT or [IPV6]:PORT)",
                             what, conf_show(a, sb));
        if (node_resolve_check(x, v->kids[i], a) < 0)
            return -1;
        (*out)[(*nout)++] = xstrdup(a);
    }
    return 0;
}

static int h_redis_cluster(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    if (r->sentinel_master)
        return conf_fail(x, k, "use either cluster or sentinel, not both");
    return get_nodes(x, v, &r->cluster, &r->ncluster, "cluster node");
}

static int h_sentinel_master(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (*s == '\0' || strlen(s) > 256 || strpbrk(s, " \t\r\n"))
        return conf_fail(x, v, "bad sentinel master name");
    free(r->sentinel_master);
    r->sentinel_master = xstrdup(s);
    return 0;
}

static int h_sentinel_nodes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    return get_nodes(x, v, &r->sentinel_nodes, &r->nsentinel_nodes, "sentinel");
}

static int h_sentinel_password(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    free(r->sentinel_password);
    r->sentinel_password = xstrdup(s);
    return 0;
}

static const struct key_def sentinel_keys[] = {
    { "master", h_sentinel_master, 1 },
    { "nodes", h_sentinel_nodes, 1 },
    { "password", h_sentinel_password, 0 },
    { NULL, NULL, 0 },
};

static int h_redis_sentinel(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    if (r->ncluster > 0)
        return conf_fail(x, k, "use either cluster or sentinel, not both");
    return conf_walk_map(x, v, sentinel_keys, r);
}

static const struct key_def redis_keys[] = {
    { "url", h_redis_url, 0 },
    { "timeout", h_redis_timeout, 0 },
    { "prefix", h_redis_prefix, 0 },
    { "on_error", h_redis_on_error, 0 },
    { "pack_limits", h_redis_pack_limits, 0 },
    { "cluster", h_redis_cluster, 0 },
    { "sentinel", h_redis_sentinel, 0 },
    { "tls", h_redis_tls, 0 },
    { NULL, NULL, 0 },
};

int conf_h_redis(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, redis_keys, &((struct conf *)obj)->redis);
}

/* ---- backend, memory, deny_cache */

int conf_h_backend(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "redis", "memory" };
    int i = 0;
    if (conf_get_enum(x, v, names, 2, "redis or memory", &i) < 0)
        return -1;
    ((struct conf *)obj)->backend = i == 0 ? CONF_BACKEND_REDIS : CONF_BACKEND_MEMORY;
    return 0;
}

static int h_memory_max_keys(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 1, CONF_MAX_MEMORY_KEYS, &n) < 0)
        return -1;
    ((struct conf *)obj)->memory_max_keys = (size_t)n;
    return 0;
}

static const struct key_def memory_keys[] = {
    { "max_keys", h_memory_max_keys, 0 },
    { NULL, NULL, 0 },
};

int conf_h_memory(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, memory_keys, obj);
}

static int h_deny_cache_max_keys(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 0, CONF_MAX_MEMORY_KEYS, &n) < 0)
        return -1;
    ((struct conf *)obj)->deny_cache_max_keys = (size_t)n;
    return 0;
}

static const struct key_def deny_cache_keys[] = {
    { "max_keys", h_deny_cache_max_keys, 0 },
    { NULL, NULL, 0 },
};

int conf_h_deny_cache(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, deny_cache_keys, obj);
}
