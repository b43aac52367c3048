/* sluice - admin_api.c: read, override and reset one limit's key (admin_api.h).
 *
 *   path -> route, limit, op ─┬─ GET: check-only decision (limit.lua with
 *   ?key=V... -> the key      │       flag 2, or the memstore) + override
 *   (route_key_parts)         ├─ PUT/DELETE override: SET/DEL KEY:ovr
 *                             └─ POST reset: DEL KEY
 *   writes: token first; then PUBLISH PREFIX"reset" (every proxy's deny
 *   caches forget) and this process's epoch (resetbus.h)
 *
 * Everything is checked before anything is written, so a 400 changes
 * nothing. Precedence for a key: run-time override, config override, the
 * limit's own parameters. */
#include <assert.h>
#include <ctype.h>
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>

#include "admin_api.h"
#include "clock.h"
#include "conf.h"
#include "esc.h"
#include "mem.h"
#include "memstore.h"
#include "plantable.h"
#include "resetbus.h"
#include "rls_match.h"
#include "route.h"
#include "store.h"

#define API_MAX_TTL_MS (3650LL * 86400 * 1000)
#define API_MAX_COUNT  1000000000LL
#define API_MAX_PART   1024

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conf *api_conf;           /* retained */
static struct memstore *api_mem;

void admin_api_set(struct conf *conf, struct memstore *mem)
{
    if (conf)
        conf_retain(conf);
    pthread_mutex_lock(&api_lock);
    struct conf *old = api_conf;
    api_conf = conf;
    api_mem = mem;
    pthread_mutex_unlock(&api_lock);
    if (old)
        conf_release(old);
}

/* An Envoy RLS domain's limit ("rls:DOMAIN"/NAME), as the operations read
 * a route's limit: a route and a limit of its own, whose key has one part
 * per entry of the descriptor, from the top down to the limit. */
struct api_rls {
    const struct conf_rls_domain *d;
    const struct conf_rls_node *chain[RLS_MAX_ENTRIES];
    int depth;
    struct conf_route route;            /* route.name malloc'd */
    struct conf_limit limit;
};

/* One request's parsed target. */
struct api_req {
    const struct conf *conf;
    const struct conf_route *route;
    const struct conf_limit *limit;
    enum { OP_STATE, OP_OVERRIDE, OP_RESET } op;
    char **parts;                       /* decoded key values (malloc'd), */
    size_t *partlen;                    /* room for the limit's nkeys */
    int nparts, more;                   /* more: the query gave more than nkeys */
    char key[ROUTE_MAX_KEY];
    size_t keylen;
    const struct conf_override *cfg;    /* the key's config override, or NULL */
    struct memstore *mem;
    struct limiter_params p;            /* PUT: the override */
    int64_t ttl_ms;                     /* PUT: its ttl, 0 none */
    int reset;                          /* POST reset, not DELETE override */
    const struct conf_plan *plan;       /* /api/plans PUT: the plan assigned */
    struct api_rls *rls;                /* route and limit are its; malloc'd */
};

/* The admin thread's Redis: one store_sync (persistent connections) and the
 * config whose redis settings it follows (retained). */
struct admin_api {
    struct store_sync *ss;
    struct conf *bound;
};

/* A request waiting for Redis: it owns q (its conf retained). */
typedef int api_finish_fn(struct api_req *q, const struct store_sync_reply *rep,
                          struct evbuffer *out);
struct admin_api_pending {
    struct api_req q;
    api_finish_fn *finish;
    int ncmds;
    struct store_sync_call *call;
    admin_api_done_cb *done;
    void *arg;
};

/* What admin_api_serve was given to answer later with. */
struct api_ctx {
    struct admin_api *api;
    admin_api_done_cb *done;
    void *arg;
    struct admin_api_pending **pending;
};

/* ---- JSON out ---- */

static void put_str(struct evbuffer *out, const char *s, size_t n)
{
    char buf[ESC_MAX(256)];
    evbuffer_add(out, "\"", 1);
    while (n > 0) {
        size_t k = n > 256 ? 256 : n;
        char *end = esc_put(buf, s, k, ESC_JSON);
        evbuffer_add(out, buf, (size_t)(end - buf));
        s += k;
        n -= k;
    }
    evbuffer_add(out, "\"", 1);
}

__attribute__((format(printf, 3, 4)))
static int api_error(struct evbuffer *out, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    evbuffer_add_printf(out, "{\"error\": ");
    put_str(out, msg, strlen(msg));
    evbuffer_add_printf(out, "}\n");
    return status;
}

/* ---- the target: /api/limits/ROUTE/LIMIT[/override|/reset]?key=... ---- */

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* s[0..n) decoded as a query value (%XX, '+' a space) into a new string;
 * NULL for a bad escape. */
static char *decode(const char *s, size_t n, size_t *outlen)
{
    char *o = malloc(n + 1);
    size_t w = 0;
    if (o == NULL)
        abort();
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            int hi = i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                free(o);
                return NULL;
            }
            o[w++] = (char)(hi << 4 | lo);
            i += 2;
        } else if (s[i] == '+') {
            o[w++] = ' ';               /* as a query is read: %2B for a '+' */
        } else {
            o[w++] = s[i];
        }
    }
    o[w] = '\0';
    *outlen = w;
    return o;
}

/* A route, or "plan:NAME": a plan's limits (their keys are the plan's). */
static const struct conf_route *find_route(const struct conf *c, const char *s, size_t n)
{
    for (int i = 0; i < c->nroutes; i++)
        if (strlen(c->routes[i].name) == n && !memcmp(c->routes[i].name, s, n))
            return &c->routes[i];
    for (int i = 0; i < c->nplans; i++)
        if (strlen(c->plans[i].route.name) == n && !memcmp(c->plans[i].route.name, s, n))
            return &c->plans[i].route;
    return NULL;
}

static const struct conf_limit *find_limit(const struct conf_route *r, const char *s, size_t n)
{
    for (int i = 0; i < r->nlimits; i++)
        if (strlen(r->limits[i].name) == n && !memcmp(r->limits[i].name, s, n))
            return &r->limits[i];
    return NULL;
}

static void req_free(struct api_req *q)
{
    for (int i = 0; i < q->nparts; i++)
        free(q->parts[i]);
    free(q->parts);
    free(q->partlen);
    q->parts = NULL;
    q->partlen = NULL;
    q->nparts = 0;
    if (q->rls)
        free(q->rls->route.name);
    free(q->rls);
    q->rls = NULL;
}

/* "rls:DOMAIN" and a limit of it (its name or path) into q->route and
 * q->limit. 0, or 400. */
static int rls_target(struct api_req *q, const char *dom, size_t dlen, const char *name,
                      size_t nlen, struct evbuffer *out)
{
    char *dn = strndup(dom, dlen);
    if (dn == NULL)
        abort();
    const struct conf_rls_domain *d = rls_domain(q->conf->decision.rls, dn);
    free(dn);
    if (d == NULL)
        return api_error(out, 400, "unknown route '" CONF_RLS_ROUTE_PREFIX "%.*s' (no such RLS "
                         "domain)", (int)(dlen > 64 ? 64 : dlen), dom);
    struct api_rls *r = q->rls = mem_calloc(1, sizeof(*r));
    r->d = d;
    r->depth = rls_find(d, name, nlen, r->chain);
    if (asprintf(&r->route.name, CONF_RLS_ROUTE_PREFIX "%s", d->name) < 0)
        abort();
    if (r->depth == 0)
        return api_error(out, 400, "unknown limit '%.*s' in route '%s' (use its rate_limit.name "
                         "or its path)", (int)(nlen > 64 ? 64 : nlen), name, r->route.name);
    const struct conf_rls_limit *l = r->chain[r->depth - 1]->limit;
    if (l->unlimited)
        return api_error(out, 400, "limit '%.*s' of route '%s' is unlimited", (int)nlen, name,
                         r->route.name);
    r->limit.name = l->name ? l->name : l->path;
    r->limit.params = l->params;
    r->limit.nkeys = r->depth;
    r->route.limits = &r->limit;
    r->route.nlimits = 1;
    q->route = &r->route;
    q->limit = &r->limit;
    return 0;
}

/* An RLS limit's counter key, as a call's descriptor with these values
 * (one per entry) counts: the values must meet this limit. 0, or 400. */
static int rls_target_key(struct api_req *q, struct evbuffer *out)
{
    const struct api_rls *r = q->rls;
    struct rls_entry e[RLS_MAX_ENTRIES];
    const char *share[RLS_MAX_ENTRIES];
    _Static_assert(RLS_MAX_KEY <= ROUTE_MAX_KEY, "an RLS key fits a route's");
    for (int i = 0; i < r->depth; i++) {
        if (strlen(q->parts[i]) != q->partlen[i])
            return api_error(out, 400, "key %d has a NUL byte", i + 1);
        e[i] = (struct rls_entry){ r->chain[i]->key, q->parts[i] };
    }
    const struct conf_rls_node *met = rls_match(r->d, e, r->depth, share);
    if (met != r->chain[r->depth - 1])
        return api_error(out, 400, "a descriptor with these values meets %s%s%s, not limit "
                         "'%s' (give one value per entry: %s)", met ? "limit '" : "no limit",
                         met ? (met->limit->name ? met->limit->name : met->limit->path) : "",
                         met ? "'" : "", q->limit->name, r->chain[r->depth - 1]->limit->path);
    q->keylen = rls_key(q->conf->redis.prefix, r->d->name, e, r->depth, share, q->key);
    return 0;
}

/* Route, limit, operation and key of the request; 0, or a status with the
 * error in out. */
static int parse_target(struct api_req *q, const char *data, const struct http1_head *h,
                        const char *path, size_t plen, struct evbuffer *out)
{
    const char *p = path + strlen(ADMIN_API_PREFIX), *end = path + plen;
    const char *seg[4];
    size_t seglen[4];
    int nseg = 0;
    while (p < end && nseg < 4) {
        if (*p != '/')
            return api_error(out, 404, "not found");
        p++;
        const char *slash = memchr(p, '/', (size_t)(end - p));
        seg[nseg] = p;
        seglen[nseg] = (size_t)((slash ? slash : end) - p);
        nseg++;
        p = slash ? slash : end;
    }
    if (p < end || nseg < 2)
        return api_error(out, 404, "not found: use %s/ROUTE/LIMIT[/override|/reset]?key=...",
                         ADMIN_API_PREFIX);
    size_t rp = sizeof(CONF_RLS_ROUTE_PREFIX) - 1;
    int rc;
    if (seglen[0] > rp && !memcmp(seg[0], CONF_RLS_ROUTE_PREFIX, rp) &&
        (rc = rls_target(q, seg[0] + rp, seglen[0] - rp, seg[1], seglen[1], out)) != 0)
        return rc;
    if (q->route == NULL)
        q->route = find_route(q->conf, seg[0], seglen[0]);
    if (q->route == NULL)
        return api_error(out, 400, "unknown route '%.*s'", (int)(seglen[0] > 64 ? 64 : seglen[0]),
                         seg[0]);
    if (q->limit == NULL)
        q->limit = find_limit(q->route, seg[1], seglen[1]);
    if (q->limit == NULL)
        return api_error(out, 400, "unknown limit '%.*s' in route '%s'",
                         (int)(seglen[1] > 64 ? 64 : seglen[1]), seg[1], q->route->name);
    q->op = OP_STATE;
    if (nseg == 3 && seglen[2] == 8 && !memcmp(seg[2], "override", 8))
        q->op = OP_OVERRIDE;
    else if (nseg == 3 && seglen[2] == 5 && !memcmp(seg[2], "reset", 5))
        q->op = OP_RESET;
    else if (nseg != 2)
        return api_error(out, 404, "not found: use %s/ROUTE/LIMIT[/override|/reset]?key=...",
                         ADMIN_API_PREFIX);

    /* ?key=V&key=V2: the key's parts, in order (config does not bound
     * how many sources a key has) */
    q->parts = mem_calloc((size_t)q->limit->nkeys, sizeof(*q->parts));
    q->partlen = mem_calloc((size_t)q->limit->nkeys, sizeof(*q->partlen));
    const char *t = data + h->target.off, *tend = t + h->target.len;
    const char *qs = memchr(t, '?', h->target.len);
    for (const char *a = qs ? qs + 1 : tend; a < tend;) {
        const char *amp = memchr(a, '&', (size_t)(tend - a));
        const char *pe = amp ? amp : tend;
        const char *eq = memchr(a, '=', (size_t)(pe - a));
        if (eq && eq - a == 3 && !memcmp(a, "key", 3)) {
            if (q->nparts >= q->limit->nkeys) {
                q->more = 1;
                break;
            }
            size_t n;
            char *v = decode(eq + 1, (size_t)(pe - eq - 1), &n);
            if (v == NULL)
                return api_error(out, 400, "bad %%-escape in key %d", q->nparts + 1);
            if (n > API_MAX_PART) {
                free(v);
                return api_error(out, 400, "key %d is longer than %d bytes", q->nparts + 1,
                                 API_MAX_PART);
            }
            q->parts[q->nparts] = v;
            q->partlen[q->nparts++] = n;
        } else if (pe > a) {
            return api_error(out, 400, "unknown query parameter (use key=VALUE, once per key "
                             "source)");
        }
        a = amp ? amp + 1 : tend;
    }
    if (q->nparts != q->limit->nkeys || q->more)
        return api_error(out, 400, "limit '%s' of route '%s' has a key of %d part%s; got %d%s",
                         q->limit->name, q->route->name, q->limit->nkeys,
                         q->limit->nkeys == 1 ? "" : "s", q->nparts + q->more,
                         q->more ? " or more" : "");
    if (q->rls)
        return rls_target_key(q, out);
    long kl = route_key_parts(q->conf, q->route, q->limit, (const char *const *)q->parts,
                              q->partlen, q->nparts, q->key);
    if (kl <= 0)
        return api_error(out, 400, "key too long");
    q->keylen = (size_t)kl;
    q->cfg = route_override(q->limit, q->key, q->keylen);
    return 0;
}

/* ---- auth ---- */

/* Constant time in the token's bytes: every byte of the longer is read. */
static int token_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen > blen ? alen : blen;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < alen ? (unsigned char)a[i] : 0;
        unsigned char y = i < blen ? (unsigned char)b[i] : 0;
        diff |= (unsigned)(x ^ y);
    }
    return diff == 0;
}

static int check_token(const struct conf *c, const char *data, const struct http1_head *h,
                       struct evbuffer *out, struct evbuffer *hdr)
{
    if (c->admin_token == NULL)
        return api_error(out, 403, "writes are refused: no admin.token is configured");
    int i = http1_find(data, h, "authorization", 0);
    const char *v = i >= 0 ? data + h->h[i].value.off : NULL;
    size_t n = i >= 0 ? h->h[i].value.len : 0;
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n > 0 && (*v == ' ' || *v == '\t'))
        v++, n--;
    int ok = i >= 0 && http1_find(data, h, "authorization", i + 1) < 0 && n > 7 &&
             strncasecmp(v, "Bearer ", 7) == 0;
    if (ok) {
        v += 7, n -= 7;
        while (n > 0 && *v == ' ')
            v++, n--;
    }
    /* compared even when the form is wrong, so the time says nothing */
    int match = token_equal(v ? v : "", ok ? n : 0, c->admin_token, strlen(c->admin_token));
    if (ok && match)
        return 0;
    evbuffer_add_printf(hdr, "WWW-Authenticate: Bearer realm=\"sluice\"\r\n");
    return api_error(out, 401, i < 0 ? "missing Authorization: Bearer TOKEN"
                                     : "wrong token");
}

/* The Host header's name (port and brackets gone) is one the admin endpoint
 * is known by: an IP literal (what a rebinding page cannot send as its
 * own name), localhost, the admin.listen host, or one of admin.hosts. */
static int host_known(const struct conf *c, const char *v, size_t n)
{
    char name[256];
    unsigned char ip[16];
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n > 0 && (*v == ' ' || *v == '\t'))
        v++, n--;
    if (n > 0 && v[0] == '[') {                 /* [v6] or [v6]:port */
        const char *end = memchr(v, ']', n);
        if (end == NULL || (size_t)(end - v - 1) >= sizeof(name))
            return 0;
        memcpy(name, v + 1, (size_t)(end - v - 1));
        name[end - v - 1] = '\0';
        return inet_pton(AF_INET6, name, ip) == 1;
    }
    const char *colon = memchr(v, ':', n);
    if (colon != NULL)
        n = (size_t)(colon - v);
    if (n == 0 || n >= sizeof(name))
        return 0;
    memcpy(name, v, n);
    name[n] = '\0';
    if (name[n - 1] == '.')                     /* "localhost." */
        name[--n] = '\0';
    if (inet_pton(AF_INET, name, ip) == 1 || strcasecmp(name, "localhost") == 0)
        return 1;
    const char *lt = c->admin_listen.text;
    if (lt != NULL && strncasecmp(lt, name, n) == 0 && lt[n] == ':')
        return 1;
    for (int i = 0; i < c->nadmin_hosts; i++)
        if (strcasecmp(c->admin_hosts[i], name) == 0)
            return 1;
    return 0;
}

int admin_api_gate(const char *data, const struct http1_head *h, int shows_keys,
                   struct evbuffer *out, struct evbuffer *hdr)
{
    pthread_mutex_lock(&api_lock);
    struct conf *c = api_conf;
    if (c)
        conf_retain(c);
    pthread_mutex_unlock(&api_lock);
    if (c == NULL)
        return 0;
    int rc = 0, i = http1_find(data, h, "host", 0);
    if (i >= 0 && !host_known(c, data + h->h[i].value.off, h->h[i].value.len))
        rc = api_error(out, 421, "this admin endpoint does not answer that Host name (add it "
                       "to admin.hosts)");
    else if (shows_keys && c->admin_token != NULL)
        rc = check_token(c, data, h, out, hdr);
    conf_release(c);
    return rc;
}

/* ---- the PUT body: {"limit": N} | {"rate": "100/s", "burst": N}, "ttl" ---- */

struct api_body {
    int has_limit, has_burst;
    int64_t limit, burst;
    char rate[64], ttl[64];
    int has_rate, has_ttl;
};

static const char *skip_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

/* A JSON string without escapes beyond \" and \\ (names and small values
 * need no more) into out[cap]; returns past it, or NULL. */
static const char *json_str(const char *p, const char *e, char *out, size_t cap)
{
    size_t w = 0;
    if (p >= e || *p != '"')
        return NULL;
    for (p++; p < e && *p != '"'; p++) {
        char ch = *p;
        if ((unsigned char)ch < 0x20)
            return NULL;
        if (ch == '\\') {
            if (++p >= e || (*p != '"' && *p != '\\' && *p != '/'))
                return NULL;
            ch = *p;
        }
        if (w + 1 >= cap)
            return NULL;
        out[w++] = ch;
    }
    if (p >= e)
        return NULL;
    out[w] = '\0';
    return p + 1;
}

static const char *json_int(const char *p, const char *e, int64_t *v)
{
    int64_t n = 0;
    const char *s = p;
    while (p < e && isdigit((unsigned char)*p)) {
        if (n > API_MAX_COUNT)
            return NULL;
        n = n * 10 + (*p++ - '0');
    }
    if (p == s || (p < e && (*p == '.' || *p == 'e' || *p == 'E')))
        return NULL;
    *v = n;
    return p;
}

/* 0, or 400 with the error. */
static int parse_body(const char *b, size_t len, struct api_body *o, struct evbuffer *out)
{
    const char *p = b, *e = b + len;
    memset(o, 0, sizeof(*o));
    p = skip_ws(p, e);
    if (p >= e || *p != '{')
        return api_error(out, 400, "body: expected a JSON object such as {\"limit\": 100}");
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}')
        return api_error(out, 400, "body: give limit, or rate and/or burst");
    for (;;) {
        char name[32];
        p = json_str(skip_ws(p, e), e, name, sizeof(name));
        if (p == NULL)
            return api_error(out, 400, "body: expected a field name");
        p = skip_ws(p, e);
        if (p >= e || *p != ':')
            return api_error(out, 400, "body: expected ':' after \"%s\"", name);
        p = skip_ws(p + 1, e);
        if (!strcmp(name, "limit") || !strcmp(name, "burst")) {
            int64_t v;
            p = json_int(p, e, &v);
            if (p == NULL || v < 1 || v > API_MAX_COUNT)
                return api_error(out, 400, "body: %s must be an integer 1..%lld", name,
                                 (long long)API_MAX_COUNT);
            if (name[0] == 'l')
                o->has_limit = 1, o->limit = v;
            else
                o->has_burst = 1, o->burst = v;
        } else if (!strcmp(name, "rate") || !strcmp(name, "ttl")) {
            char *dst = name[0] == 'r' ? o->rate : o->ttl;
            p = json_str(p, e, dst, sizeof(o->rate));
            if (p == NULL)
                return api_error(out, 400, "body: %s must be a short string (\"%s\")", name,
                                 name[0] == 'r' ? "100/s" : "30d");
            if (name[0] == 'r')
                o->has_rate = 1;
            else
                o->has_ttl = 1;
        } else {
            return api_error(out, 400, "body: unknown field \"%s\" (use limit, rate, burst, "
                             "ttl)", name);
        }
        p = skip_ws(p, e);
        if (p < e && *p == ',') {
            p++;
            continue;
        }
        if (p < e && *p == '}' && skip_ws(p + 1, e) == e)
            return 0;
        return api_error(out, 400, "body: expected ',' or a final '}'");
    }
}

/* The override's parameters from the body, on top of the key's current
 * config (its config override, or the limit's own). 0, or 400. */
static int body_params(const struct api_req *q, const struct api_body *b,
                       struct limiter_params *p, int64_t *ttl_ms, struct evbuffer *out)
{
    *p = q->cfg ? q->cfg->params : q->limit->params;
    int bucket = p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA;
    const char *an = limiter_algo_name(p->algo);
    *ttl_ms = 0;
    if (b->has_ttl && (conf_parse_duration_ms(b->ttl, ttl_ms) < 0 || *ttl_ms < 1 ||
                       *ttl_ms > API_MAX_TTL_MS))
        return api_error(out, 400, "bad ttl \"%s\" (use e.g. 30s, 10m, 12h, 30d)", b->ttl);
    if (!bucket) {
        if (b->has_rate || b->has_burst)
            return api_error(out, 400, "%s takes limit, not %s", an,
                             b->has_rate ? "rate" : "burst");
        if (!b->has_limit)
            return api_error(out, 400, "%s needs limit", an);
        p->limit = b->limit;
        return 0;
    }
    if (b->has_limit)
        return api_error(out, 400, "%s takes rate and/or burst, not limit", an);
    if (!b->has_rate && !b->has_burst)
        return api_error(out, 400, "%s needs rate and/or burst", an);
    if (b->has_burst)
        p->limit = b->burst;
    if (b->has_rate) {
        int64_t n, period_ms;
        if (conf_parse_rate(b->rate, &n, &period_ms) < 0 || period_ms > API_MAX_TTL_MS)
            return api_error(out, 400, "bad rate \"%s\" (use e.g. 10/s, 100/m, 5/h, 1000/d, "
                             "100/10s)", b->rate);
        p->interval_us = conf_rate_interval_us(n, period_ms);
    }
    if (conf_bucket_window(p) < 0)
        return api_error(out, 400, "rate and burst give a refill time beyond 3650d");
    return 0;
}

/* ---- Redis ---- */

static void ovr_key(const struct api_req *q, char *out, size_t *len)
{
    memcpy(out, q->key, q->keylen);
    memcpy(out + q->keylen, STORE_OVERRIDE_SUFFIX, sizeof(STORE_OVERRIDE_SUFFIX));
    *len = q->keylen + sizeof(STORE_OVERRIDE_SUFFIX) - 1;
}

/* PUBLISH PREFIX"reset" KEY appended to a write's commands. */
static void publish_cmd(const struct api_req *q, char *chan, const char **argv, size_t *lens,
                        struct store_sync_cmd *cmd)
{
    snprintf(chan, 512, "%s" RESETBUS_CHANNEL, q->conf->redis.prefix);
    argv[0] = "PUBLISH", lens[0] = 7;
    argv[1] = chan, lens[1] = strlen(chan);
    argv[2] = q->key, lens[2] = q->keylen;
    *cmd = (struct store_sync_cmd){ 3, argv, lens };
}

static int redis_failed(const struct store_sync_reply *r, int n, const char *err,
                        struct evbuffer *out)
{
    if (err != NULL)
        return api_error(out, 503, "%s", err);
    for (int i = 0; i < n; i++)
        if (r[i].type == STORE_SYNC_ERROR)
            return api_error(out, 503, "redis: %.*s", (int)r[i].len, r[i].str);
    return 0;
}

static void api_redis_cb(void *arg, const struct store_sync_reply *rep, const char *err)
{
    struct admin_api_pending *pd = arg;
    struct evbuffer *out = evbuffer_new(), *hdr = evbuffer_new();
    if (out == NULL || hdr == NULL)
        abort();
    int status = redis_failed(rep, rep ? pd->ncmds : 0, err ? err : NULL, out);
    if (status == 0)
        status = pd->finish(&pd->q, rep, out);
    pd->done(pd->arg, status, out, hdr);
    evbuffer_free(out);
    evbuffer_free(hdr);
    req_free(&pd->q);
    conf_release((struct conf *)pd->q.conf);
    free(pd);
}

/* Starts q's commands on the admin thread's Redis connection; q (and its
 * conf) then belong to the pending request, answered by finish. Returns
 * ADMIN_API_PENDING, or 503 at once (too many waiting). */
static int api_redis(const struct api_ctx *x, struct api_req *q, int ncmds,
                     const struct store_sync_cmd *cmds, api_finish_fn *finish,
                     struct evbuffer *out)
{
    struct admin_api *api = x->api;
    const struct conf_redis *rc = &q->conf->redis;
    char err[256];
    if (api->bound != NULL && store_same_conf(&api->bound->redis, rc))
        rc = &api->bound->redis;
    struct admin_api_pending *pd = mem_calloc(1, sizeof(*pd));
    pd->call = store_sync_start(api->ss, rc, ncmds, cmds, api_redis_cb, pd, err, sizeof(err));
    if (pd->call == NULL) {
        free(pd);
        return api_error(out, 503, "%s", err);
    }
    if (rc == &q->conf->redis && q->conf != api->bound) {   /* follows new settings now */
        conf_retain((struct conf *)q->conf);
        if (api->bound)
            conf_release(api->bound);
        api->bound = (struct conf *)q->conf;
    }
    pd->q = *q;
    pd->finish = finish;
    pd->ncmds = ncmds;
    pd->done = x->done;
    pd->arg = x->arg;
    *x->pending = pd;
    memset(q, 0, sizeof(*q));   /* the pending request's now */
    return ADMIN_API_PENDING;
}

static void put_params(struct evbuffer *out, const struct limiter_params *p)
{
    if (p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA)
        evbuffer_add_printf(out, "{\"burst\": %lld, \"interval_us\": %lld}",
                            (long long)p->limit, (long long)p->interval_us);
    else if (p->algo == LIMITER_CONCURRENCY)     /* window_ms is the slots' lease */
        evbuffer_add_printf(out, "{\"limit\": %lld, \"lease_ms\": %lld}",
                            (long long)p->limit, (long long)p->window_ms);
    else
        evbuffer_add_printf(out, "{\"limit\": %lld, \"window_ms\": %lld}",
                            (long long)p->limit, (long long)p->window_ms);
}

/* "ALGO LIMIT INTERVAL_US" (STORE_OVERRIDE_SUFFIX's value) -> params. */
static int parse_ovr(const char *s, size_t n, const struct limiter_params *base,
                     struct limiter_params *p)
{
    char buf[128];
    const char *q = buf;
    long long v[3];                     /* ALGO, LIMIT, INTERVAL_US */
    if (n >= sizeof(buf))
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    for (int i = 0; i < 3; i++) {
        char *e;
        errno = 0;
        v[i] = strtoll(q, &e, 10);
        if (e == q || errno == ERANGE)
            return -1;
        q = e;
    }
    if (v[0] != (long long)base->algo)
        return -1;
    *p = *base;
    p->limit = v[1];
    if (base->algo == LIMITER_TOKEN_BUCKET || base->algo == LIMITER_GCRA)
        p->interval_us = v[2];
    return 0;
}

/* ---- the operations ---- */

static void put_head(struct evbuffer *out, const struct api_req *q)
{
    evbuffer_add_printf(out, "{\"route\": ");
    put_str(out, q->route->name, strlen(q->route->name));
    evbuffer_add_printf(out, ", \"limit\": ");
    put_str(out, q->limit->name, strlen(q->limit->name));
    evbuffer_add_printf(out, ", \"key\": [");
    for (int i = 0; i < q->nparts; i++) {
        if (i)
            evbuffer_add(out, ", ", 2);
        put_str(out, q->parts[i], q->partlen[i]);
    }
    evbuffer_add_printf(out, "], \"algorithm\": \"%s\"", limiter_algo_name(q->limit->params.algo));
}

/* The GET answer: the key's parameters, where they come from, its state. */
static int state_answer(const struct api_req *q, const struct limiter_params *eff,
                        const struct limiter_result *r, int runtime, int64_t ttl_ms,
                        struct evbuffer *out)
{
    const struct limiter_params *cp = q->cfg ? &q->cfg->params : &q->limit->params;
    put_head(out, q);
    evbuffer_add_printf(out, ", \"source\": \"%s\", \"params\": ",
                        runtime ? "runtime" : q->cfg ? "config" : "limit");
    put_params(out, eff);
    evbuffer_add_printf(out, ", \"config_params\": ");
    put_params(out, cp);
    if (runtime) {
        if (ttl_ms >= 0)
            evbuffer_add_printf(out, ", \"override_ttl_ms\": %lld", (long long)ttl_ms);
        else
            evbuffer_add_printf(out, ", \"override_ttl_ms\": null");
    }
    evbuffer_add_printf(out, ", \"allowed\": %s, \"remaining\": %lld, \"reset_ms\": %lld, "
                        "\"retry_ms\": %s",
                        r->allowed ? "true" : "false", (long long)r->remaining,
                        (long long)r->reset_ms, "");
    if (r->allowed)
        evbuffer_add_printf(out, "null}\n");
    else
        evbuffer_add_printf(out, "%lld}\n", (long long)r->retry_ms);
    return 200;
}

/* limit.lua's check-only answer for params cp: { time_s, time_us, v,
 * reset_ms [, limit] }, v the remaining or -retry_ms. 0, or -1. */
static int state_result(const struct store_sync_reply *rep, const struct limiter_params *cp,
                        int ro, struct limiter_result *r)
{
    if (rep->type != STORE_SYNC_ARRAY || rep->nints != 4 + (ro ? 1 : 0))
        return -1;
    int64_t got = rep->ints[2];
    r->allowed = got >= 0;
    r->remaining = got >= 0 ? got : 0;
    r->reset_ms = rep->ints[3];
    r->retry_ms = got >= 0 ? 0 : got < -INT64_MAX ? INT64_MAX : -got;
    r->limit = ro ? rep->ints[4] : cp->limit;
    limiter_clamp(r, cp, ro);
    return 0;
}

/* limit.lua's check, GET and PTTL of the override key came back. */
static int state_finish(struct api_req *q, const struct store_sync_reply *rep,
                        struct evbuffer *out)
{
    const struct limiter_params *cp = q->cfg ? &q->cfg->params : &q->limit->params;
    struct limiter_params eff = *cp;
    struct limiter_result r = { 0 };
    int ro = q->conf->redis.overrides, runtime = 0;
    int64_t ttl_ms = -1;
    if (state_result(rep, cp, ro, &r) < 0)
        return api_error(out, 503, "redis: unexpected reply from limit.lua");
    if (ro && rep[1].type == STORE_SYNC_STR &&
        parse_ovr(rep[1].str, rep[1].len, cp, &eff) == 0) {
        runtime = 1;
        ttl_ms = rep[2].type == STORE_SYNC_INT && rep[2].integer >= 0 ? rep[2].integer : -1;
    }
    if (ro)
        eff.limit = r.limit;
    return state_answer(q, &eff, &r, runtime, ttl_ms, out);
}

/* limit.lua's batch protocol, one request of one limit, check only:
 * EVAL script K KEY [KEY:ovr] d 1 algo L W I 1 1 ref cost=1 [slot] [ovr]
 * (see limit.lua); without admin.token decisions do not read overrides:
 * nor does this. The integers after "d 1": algo L W I 1 1 ref cost, then
 * the slot (concurrency) and the override key's index (admin.token). */
enum { STATE_NV = 8 + 1 + 1, STATE_ARGC = 5 + 2 + STATE_NV };
struct state_cmd {
    const char *argv[STATE_ARGC];
    size_t lens[STATE_ARGC];
    char num[STATE_NV][24];
    char ok[ROUTE_MAX_KEY + 8];         /* KEY:ovr; KEY is ok[0..oklen - 4) */
    size_t oklen;
    char pk[ROUTE_MAX_KEY];             /* a part's: its route's key */
};

/* The check of key under cp into *cmd, its strings (key too) in sc, which
 * must live as long as cmd. A limit l that is a part of r's key (one key
 * per route) is checked there, as decisions make it. */
static void state_cmd(const struct conf *conf, const struct conf_route *r,
                      const struct conf_limit *l, const struct limiter_params *cp,
                      const char *key, size_t keylen, struct state_cmd *sc,
                      struct store_sync_cmd *cmd)
{
    memcpy(sc->ok, key, keylen);
    memcpy(sc->ok + keylen, STORE_OVERRIDE_SUFFIX, sizeof(STORE_OVERRIDE_SUFFIX));
    sc->oklen = keylen + sizeof(STORE_OVERRIDE_SUFFIX) - 1;
    long pl = l->part ? route_part_key(conf, r, l, key, keylen, sc->pk) : -1;
    int64_t algo = (int64_t)cp->algo + (pl > 0 ? 16 * (int64_t)l->part : 0);
    int ro = conf->redis.overrides, nk = ro ? 2 : 1;
    int conc = cp->algo == LIMITER_CONCURRENCY;
    int64_t v[STATE_NV] = { algo, cp->limit, cp->window_ms, conc ? 0 : cp->interval_us, 1, 1,
                     STORE_CHECK_ONLY | (ro ? 8 : 0), 1 };
    int nv = 8;
    if (conc)
        v[nv++] = 9007199254740991LL;       /* a slot id no request has: 2^53 - 1 */
    if (ro)
        v[nv++] = 2;                        /* KEYS[2] is the override key */
    assert(nv <= STATE_NV && 5 + nk + nv <= STATE_ARGC);
    const char *a0[5] = { "EVAL", store_limit_script(), ro ? "2" : "1", pl > 0 ? sc->pk : sc->ok,
                          sc->ok };
    size_t l0[5] = { 4, strlen(a0[1]), 1, pl > 0 ? (size_t)pl : keylen, sc->oklen };
    memcpy(sc->argv, a0, sizeof(a0));
    memcpy(sc->lens, l0, sizeof(l0));
    sc->argv[3 + nk] = "d", sc->lens[3 + nk] = 1;
    sc->argv[4 + nk] = "1", sc->lens[4 + nk] = 1;
    for (int i = 0; i < nv; i++) {
        snprintf(sc->num[i], sizeof(sc->num[i]), "%lld", (long long)v[i]);
        sc->argv[5 + nk + i] = sc->num[i];
        sc->lens[5 + nk + i] = strlen(sc->num[i]);
    }
    *cmd = (struct store_sync_cmd){ 5 + nk + nv, sc->argv, sc->lens };
}

static int op_state(const struct api_ctx *x, struct api_req *q, struct evbuffer *out)
{
    const struct limiter_params *cp = q->cfg ? &q->cfg->params : &q->limit->params;
    if (q->conf->backend == CONF_BACKEND_MEMORY) {
        struct limiter_params eff = *cp;
        int runtime = 0;
        int64_t ttl_ms = -1;
        int64_t now = clock_wall_us(), exp_us = 0;
        struct store_limit sl = { q->key, q->keylen, cp, 1, STORE_CHECK_ONLY };
        struct store_result res;
        if (memstore_override_get(q->mem, q->key, q->keylen, now, &eff, &exp_us) &&
            eff.algo == cp->algo) {
            runtime = 1;
            ttl_ms = exp_us ? (exp_us - now) / 1000 : -1;
        } else {
            eff = *cp;
        }
        if (memstore_decide(q->mem, &sl, 1, now, &res) != 0)
            return api_error(out, 500, "the memory limiter refused the check");
        return state_answer(q, &eff, &res.r[0], runtime, ttl_ms, out);
    }
    struct state_cmd sc;
    struct store_sync_cmd cmds[3];
    state_cmd(q->conf, q->route, q->limit, cp, q->key, q->keylen, &sc, &cmds[0]);
    const char *ok = sc.ok;
    size_t oklen = sc.oklen;
    const char *get[2] = { "GET", ok }, *pttl[2] = { "PTTL", ok };
    size_t getl[2] = { 3, oklen }, pttll[2] = { 4, oklen };
    cmds[1] = (struct store_sync_cmd){ 2, get, getl };
    cmds[2] = (struct store_sync_cmd){ 2, pttl, pttll };
    return api_redis(x, q, 3, cmds, state_finish, out);
}

static int put_answer(struct api_req *q, struct evbuffer *out)
{
    resetbus_bump();
    put_head(out, q);
    evbuffer_add_printf(out, ", \"source\": \"runtime\", \"params\": ");
    put_params(out, &q->p);
    if (q->ttl_ms)
        evbuffer_add_printf(out, ", \"ttl_ms\": %lld}\n", (long long)q->ttl_ms);
    else
        evbuffer_add_printf(out, ", \"ttl_ms\": null}\n");
    return 200;
}

static int put_finish(struct api_req *q, const struct store_sync_reply *rep,
                      struct evbuffer *out)
{
    return put_answer(q, out);
}

static int op_put(const struct api_ctx *x, struct api_req *q, const char *body, size_t len,
                  struct evbuffer *out)
{
    struct api_body b;
    int rc = parse_body(body, len, &b, out);
    if (rc == 0)
        rc = body_params(q, &b, &q->p, &q->ttl_ms, out);
    if (rc != 0)
        return rc;
    if (q->conf->backend == CONF_BACKEND_MEMORY) {
        int64_t exp = q->ttl_ms ? clock_wall_us() + q->ttl_ms * 1000 : 0;
        if (memstore_override_set(q->mem, q->key, q->keylen, &q->p, exp) != 0)
            return api_error(out, 400, "at most %d run-time overrides", MEMSTORE_MAX_OVERRIDES);
        return put_answer(q, out);
    }
    char ok[ROUTE_MAX_KEY + 8], val[96], ttl[24], chan[512];
    size_t oklen;
    ovr_key(q, ok, &oklen);
    snprintf(val, sizeof(val), "%d %lld %lld", (int)q->p.algo, (long long)q->p.limit,
             (long long)(q->p.algo >= LIMITER_TOKEN_BUCKET ? q->p.interval_us : 0));
    snprintf(ttl, sizeof(ttl), "%lld", (long long)q->ttl_ms);
    const char *set[5] = { "SET", ok, val, "PX", ttl };
    size_t setl[5] = { 3, oklen, strlen(val), 2, strlen(ttl) };
    const char *pub[3];
    size_t publ[3];
    struct store_sync_cmd cmds[2] = { { q->ttl_ms ? 5 : 3, set, setl } };
    publish_cmd(q, chan, pub, publ, &cmds[1]);
    return api_redis(x, q, 2, cmds, put_finish, out);
}

static int delete_answer(struct api_req *q, int existed, struct evbuffer *out)
{
    resetbus_bump();
    put_head(out, q);
    evbuffer_add_printf(out, ", \"%s\": true, \"existed\": %s}\n",
                        q->reset ? "reset" : "deleted", existed ? "true" : "false");
    return 200;
}

static int delete_finish(struct api_req *q, const struct store_sync_reply *rep,
                         struct evbuffer *out)
{
    if (q->reset)       /* on_error: local kept counts too */
        memstore_reset(q->mem, q->key, q->keylen);
    return delete_answer(q, rep[0].type == STORE_SYNC_INT && rep[0].integer > 0, out);
}

/* DELETE .../override (del) or POST .../reset (q->reset): one key deleted. */
static int op_delete(const struct api_ctx *x, struct api_req *q, struct evbuffer *out)
{
    if (q->conf->backend == CONF_BACKEND_MEMORY)
        return delete_answer(q, q->reset ? memstore_reset(q->mem, q->key, q->keylen)
                                         : memstore_override_del(q->mem, q->key, q->keylen),
                             out);
    char ok[ROUTE_MAX_KEY + 8], chan[512], pk[ROUTE_MAX_KEY], head[16];
    size_t oklen;
    ovr_key(q, ok, &oklen);
    const char *del[2] = { "DEL", q->reset ? q->key : ok };
    size_t dell[2] = { 3, q->reset ? q->keylen : oklen };
    const char *pub[3];
    size_t publ[3];
    struct store_sync_cmd cmds[2] = { { 2, del, dell } };
    /* a part of its route's key (one key per route): that part goes */
    long pl = q->reset && q->limit->part ?
              route_part_key(q->conf, q->route, q->limit, q->key, q->keylen, pk) : -1;
    const char *ev[5] = { "EVAL", store_part_reset_script(), "1", pk, head };
    size_t evl[5] = { 4, strlen(ev[1]), 1, pl > 0 ? (size_t)pl : 0, 0 };
    if (pl > 0) {               /* its record's head: ';', the tag big-endian */
        uint32_t t = q->limit->part;
        head[0] = ';';
        for (int i = 0; i < 4; i++)
            head[1 + i] = (char)(t >> (24 - 8 * i));
        evl[4] = 5;
        cmds[0] = (struct store_sync_cmd){ 5, ev, evl };
    }
    publish_cmd(q, chan, pub, publ, &cmds[1]);
    return api_redis(x, q, 2, cmds, delete_finish, out);
}

/* ---- /api/plans?key=V: a client's plan, its usage, its run-time assignment ---- */

enum plan_source { PLAN_RUNTIME, PLAN_CONFIG, PLAN_DEFAULT };
static const char *const plan_source_name[] = { "runtime", "config", "default" };

/* The plan a client key is on, as decide.c finds it without a request:
 * this process's copy of the run-time assignments, plans.assign, default. */
static const struct conf_plan *plan_of(const struct conf *c, const char *k, size_t n,
                                       enum plan_source *src)
{
    char name[PLANTABLE_MAX_PLAN + 1];
    const struct conf_plan *p = NULL;
    if (plantable_get(k, n, name) && (p = conf_plan_find(c, name, strlen(name))) != NULL) {
        *src = PLAN_RUNTIME;
    } else if ((p = conf_plan_assigned(c, k, n)) != NULL) {
        *src = PLAN_CONFIG;
    } else {
        p = &c->plans[c->plan_default];
        *src = PLAN_DEFAULT;
    }
    return p;
}

/* ?key=V, once: into q->parts[0]. 0, or 400. */
static int plans_target(struct api_req *q, const char *data, const struct http1_head *h,
                        struct evbuffer *out)
{
    const char *t = data + h->target.off, *tend = t + h->target.len;
    const char *qs = memchr(t, '?', h->target.len);
    q->parts = mem_calloc(1, sizeof(*q->parts));
    q->partlen = mem_calloc(1, sizeof(*q->partlen));
    for (const char *a = qs ? qs + 1 : tend; a < tend;) {
        const char *amp = memchr(a, '&', (size_t)(tend - a));
        const char *pe = amp ? amp : tend;
        const char *eq = memchr(a, '=', (size_t)(pe - a));
        if (!(eq && eq - a == 3 && !memcmp(a, "key", 3)) || q->nparts > 0)
            return api_error(out, 400, "use ?key=VALUE once: the client's plan_key value");
        size_t n;
        char *v = decode(eq + 1, (size_t)(pe - eq - 1), &n);
        if (v == NULL || n == 0 || n > PLANTABLE_MAX_KEY) {
            free(v);
            return api_error(out, 400, "key: 1 to %d bytes, %%-escaped", PLANTABLE_MAX_KEY);
        }
        q->parts[0] = v;
        q->partlen[q->nparts++] = n;
        a = amp ? amp + 1 : tend;
    }
    if (q->nparts != 1)
        return api_error(out, 400, "use ?key=VALUE: the client's plan_key value");
    return 0;
}

/* The Redis key and parameters of plan limit l for the client: only a limit
 * keyed by one source is read (with the client's key as its value). */
static int plan_limit_key(const struct api_req *q, const struct conf_plan *p,
                          const struct conf_limit *l, char *key, size_t *keylen,
                          const struct limiter_params **cp)
{
    long n = l->nkeys == 1 ? route_key_parts(q->conf, &p->route, l,
                                             (const char *const *)q->parts, q->partlen, 1, key)
                           : -1;
    if (n <= 0)
        return -1;
    *keylen = (size_t)n;
    const struct conf_override *o = route_override(l, key, *keylen);
    *cp = o ? &o->params : &l->params;
    return 0;
}

static void plans_head(struct evbuffer *out, const struct api_req *q, const struct conf_plan *p,
                       enum plan_source src)
{
    evbuffer_add_printf(out, "{\"key\": ");
    put_str(out, q->parts[0], q->partlen[0]);
    evbuffer_add_printf(out, ", \"plan\": ");
    put_str(out, p->name, strlen(p->name));
    evbuffer_add_printf(out, ", \"source\": \"%s\"", plan_source_name[src]);
}

/* The GET answer; res[i] the state of limit i (NULL: not read). */
static int plans_answer(const struct api_req *q, const struct conf_plan *p,
                        enum plan_source src, const struct limiter_result *const *res,
                        struct evbuffer *out)
{
    plans_head(out, q, p, src);
    evbuffer_add_printf(out, ", \"limits\": [");
    for (int i = 0; i < p->route.nlimits; i++) {
        const struct conf_limit *l = &p->route.limits[i];
        const struct limiter_result *r = res[i];
        evbuffer_add_printf(out, "%s{\"limit\": ", i ? ", " : "");
        put_str(out, l->name, strlen(l->name));
        evbuffer_add_printf(out, ", \"algorithm\": \"%s\", \"params\": ",
                            limiter_algo_name(l->params.algo));
        put_params(out, &l->params);
        if (r == NULL) {
            evbuffer_add_printf(out, ", \"state\": null}");
            continue;
        }
        int64_t used = r->limit > r->remaining ? r->limit - r->remaining : 0;
        evbuffer_add_printf(out, ", \"state\": {\"limit\": %lld, \"used\": %lld, "
                            "\"remaining\": %lld, \"allowed\": %s, \"reset_ms\": %lld, "
                            "\"retry_ms\": ", (long long)r->limit, (long long)used,
                            (long long)r->remaining, r->allowed ? "true" : "false",
                            (long long)r->reset_ms);
        if (r->allowed)
            evbuffer_add_printf(out, "null}}");
        else
            evbuffer_add_printf(out, "%lld}}", (long long)r->retry_ms);
    }
    evbuffer_add_printf(out, "]}\n");
    return 200;
}

/* The checks of the plan's limits came back, in the order of its limits
 * that plan_limit_key reads. */
static int plans_state_finish(struct api_req *q, const struct store_sync_reply *rep,
                              struct evbuffer *out)
{
    enum plan_source src;
    const struct conf_plan *p = q->plan;
    struct limiter_result r[CONF_MAX_LIMITS];
    const struct limiter_result *res[CONF_MAX_LIMITS] = { 0 };
    char key[ROUTE_MAX_KEY];
    size_t kl;
    int k = 0;
    plan_of(q->conf, q->parts[0], q->partlen[0], &src);
    for (int i = 0; i < p->route.nlimits; i++) {
        const struct limiter_params *cp;
        if (plan_limit_key(q, p, &p->route.limits[i], key, &kl, &cp) < 0)
            continue;
        memset(&r[i], 0, sizeof(r[i]));
        if (state_result(&rep[k++], cp, q->conf->redis.overrides, &r[i]) < 0)
            return api_error(out, 503, "redis: unexpected reply from limit.lua");
        res[i] = &r[i];
    }
    /* the plan may have changed meanwhile: the one whose state was read */
    return plans_answer(q, p, q->plan == plan_of(q->conf, q->parts[0], q->partlen[0], &src)
                              ? src : PLAN_RUNTIME, res, out);
}

static int plans_state(const struct api_ctx *x, struct api_req *q, struct evbuffer *out)
{
    enum plan_source src;
    const struct conf_plan *p = plan_of(q->conf, q->parts[0], q->partlen[0], &src);
    struct limiter_result r[CONF_MAX_LIMITS];
    const struct limiter_result *res[CONF_MAX_LIMITS] = { 0 };
    struct store_sync_cmd cmds[CONF_MAX_LIMITS];
    struct state_cmd *sc = mem_calloc(CONF_MAX_LIMITS, sizeof(*sc));
    char key[ROUTE_MAX_KEY];
    size_t kl;
    int k = 0;
    for (int i = 0; i < p->route.nlimits; i++) {
        const struct limiter_params *cp;
        if (plan_limit_key(q, p, &p->route.limits[i], key, &kl, &cp) < 0)
            continue;
        if (q->conf->backend == CONF_BACKEND_MEMORY) {
            struct store_limit sl = { key, kl, cp, 1, STORE_CHECK_ONLY };
            struct store_result sr;
            if (memstore_decide(q->mem, &sl, 1, clock_wall_us(), &sr) == 0) {
                r[i] = sr.r[0];
                res[i] = &r[i];
            }
            continue;
        }
        state_cmd(q->conf, &p->route, &p->route.limits[i], cp, key, kl, &sc[k], &cmds[k]);
        k++;
    }
    int rc;
    q->plan = p;
    if (k == 0)
        rc = plans_answer(q, p, src, res, out);
    else
        rc = api_redis(x, q, k, cmds, plans_state_finish, out);
    free(sc);           /* store_sync_start copied the commands */
    return rc;
}

/* PUT: HSET and PUBLISH in one script (at most PLANTABLE_MAX keys, -1
 * beyond); DELETE: HDEL and PUBLISH. */
static const char plan_set_lua[] =
    "if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 and "
    "redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return -1 end "
    "redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) "
    "redis.call('PUBLISH', ARGV[1], 'S ' .. ARGV[3] .. ' ' .. ARGV[2]) return 1";
static const char plan_del_lua[] =
    "local n = redis.call('HDEL', KEYS[1], ARGV[2]) "
    "redis.call('PUBLISH', ARGV[1], 'D ' .. ARGV[2]) return n";

static int plans_write_answer(struct api_req *q, int existed, struct evbuffer *out)
{
    enum plan_source src;
    const struct conf_plan *p = plan_of(q->conf, q->parts[0], q->partlen[0], &src);
    plans_head(out, q, p, src);
    if (q->plan == NULL)
        evbuffer_add_printf(out, ", \"cleared\": true, \"existed\": %s",
                            existed ? "true" : "false");
    evbuffer_add_printf(out, "}\n");
    return 200;
}

static int plans_write_finish(struct api_req *q, const struct store_sync_reply *rep,
                              struct evbuffer *out)
{
    if (rep[0].type != STORE_SYNC_INT)
        return api_error(out, 503, "redis: unexpected reply to the plan's write");
    if (q->plan == NULL) {
        plantable_del(q->parts[0], q->partlen[0]);  /* here at once; its message follows */
        return plans_write_answer(q, rep[0].integer > 0, out);
    }
    if (rep[0].integer < 0)
        return api_error(out, 400, "at most %d run-time plan assignments", PLANTABLE_MAX);
    plantable_set(q->parts[0], q->partlen[0], q->plan->name, strlen(q->plan->name));
    return plans_write_answer(q, 1, out);
}

/* {"plan": "NAME"}: the plan, or 400. */
static int plans_body(struct api_req *q, const char *b, size_t len, struct evbuffer *out)
{
    const char *p = skip_ws(b, b + len), *e = b + len;
    char field[16], name[PLANTABLE_MAX_PLAN + 1];
    if (p >= e || *p != '{' ||
        (p = json_str(skip_ws(p + 1, e), e, field, sizeof(field))) == NULL ||
        strcmp(field, "plan") != 0 || (p = skip_ws(p, e)) >= e || *p != ':' ||
        (p = json_str(skip_ws(p + 1, e), e, name, sizeof(name))) == NULL ||
        (p = skip_ws(p, e)) >= e || *p != '}' || skip_ws(p + 1, e) != e)
        return api_error(out, 400, "body: expected {\"plan\": \"NAME\"}");
    q->plan = conf_plan_find(q->conf, name, strlen(name));
    if (q->plan == NULL)
        return api_error(out, 400, "unknown plan '%s'", name);
    return 0;
}

static int plans_write(const struct api_ctx *x, struct api_req *q, int put, const char *body,
                       size_t len, struct evbuffer *out)
{
    int rc = put ? plans_body(q, body, len, out) : 0;
    if (rc != 0)
        return rc;
    if (q->conf->backend == CONF_BACKEND_MEMORY) {
        if (!put)
            return plans_write_answer(q, plantable_del(q->parts[0], q->partlen[0]), out);
        if (plantable_set(q->parts[0], q->partlen[0], q->plan->name, strlen(q->plan->name)))
            return api_error(out, 400, "at most %d run-time plan assignments", PLANTABLE_MAX);
        return plans_write_answer(q, 1, out);
    }
    char name[512], max[16];
    snprintf(name, sizeof(name), "%s" PLANTABLE_KEY, q->conf->redis.prefix);
    snprintf(max, sizeof(max), "%d", PLANTABLE_MAX);
    const char *lua = put ? plan_set_lua : plan_del_lua;
    const char *argv[8] = { "EVAL", lua, "1", name, name, q->parts[0],
                            put ? q->plan->name : "", max };
    size_t lens[8] = { 4, strlen(lua), 1, strlen(name), strlen(name), q->partlen[0],
                       strlen(argv[6]), strlen(max) };
    struct store_sync_cmd cmd = { 8, argv, lens };
    return api_redis(x, q, 1, &cmd, plans_write_finish, out);
}

static int plans_serve(const struct api_ctx *x, struct api_req *q, const char *data,
                       const struct http1_head *h, const char *body, size_t len,
                       struct evbuffer *out, struct evbuffer *hdr)
{
    const char *m = data + h->method.off;
    size_t ml = h->method.len;
#define METHOD_IS(s) (ml == sizeof(s) - 1 && memcmp(m, s, ml) == 0)
    int get = METHOD_IS("GET") || METHOD_IS("HEAD"), put = METHOD_IS("PUT");
    int del = METHOD_IS("DELETE");
#undef METHOD_IS
    if (!get && !put && !del) {
        evbuffer_add_printf(hdr, "Allow: GET, PUT, DELETE\r\n");
        return api_error(out, 405, "use GET, PUT or DELETE");
    }
    int rc = check_token(q->conf, data, h, out, hdr);   /* a read shows keys too */
    if (rc == 0 && q->conf->nplans == 0)
        rc = api_error(out, 400, "no plans are configured");
    if (rc == 0)
        rc = plans_target(q, data, h, out);
    if (rc != 0)
        return rc;
    return get ? plans_state(x, q, out) : plans_write(x, q, put, body, len, out);
}

struct admin_api *admin_api_create(struct event_base *base)
{
    struct admin_api *api = mem_calloc(1, sizeof(*api));
    api->ss = store_sync_create(base);
    return api;
}

void admin_api_destroy(struct admin_api *api)
{
    if (api == NULL)
        return;
    store_sync_destroy(api->ss);
    if (api->bound)
        conf_release(api->bound);
    free(api);
}

void admin_api_cancel(struct admin_api_pending *pd)
{
    store_sync_cancel(pd->call);
    req_free(&pd->q);
    conf_release((struct conf *)pd->q.conf);
    free(pd);
}

int admin_api_serve(struct admin_api *api, const char *data, const struct http1_head *h,
                    const char *path, size_t plen, const char *body, size_t len,
                    struct evbuffer *out, struct evbuffer *hdr, admin_api_done_cb *done,
                    void *arg, struct admin_api_pending **pending)
{
    struct api_ctx x = { api, done, arg, pending };
    struct api_req q;
    memset(&q, 0, sizeof(q));
    pthread_mutex_lock(&api_lock);
    struct conf *c = api_conf;
    struct memstore *mem = api_mem;
    if (c)
        conf_retain(c);
    pthread_mutex_unlock(&api_lock);
    if (c == NULL)
        return api_error(out, 503, "no config loaded");
    q.conf = c;
    q.mem = mem;
    int rc;
    if (plen >= sizeof(ADMIN_API_PLANS) - 1 &&
        !memcmp(path, ADMIN_API_PLANS, sizeof(ADMIN_API_PLANS) - 1)) {
        rc = plen == sizeof(ADMIN_API_PLANS) - 1
             ? plans_serve(&x, &q, data, h, body, len, out, hdr)
             : api_error(out, 404, "not found: use %s?key=...", ADMIN_API_PLANS);
        goto done;
    }
    const char *m = data + h->method.off;
    size_t ml = h->method.len;
#define METHOD_IS(s) (ml == sizeof(s) - 1 && memcmp(m, s, ml) == 0)
    rc = parse_target(&q, data, h, path, plen, out);
    if (rc != 0)
        goto done;
    assert(q.route != NULL && q.limit != NULL);     /* parse_target's 0 says both were found */
    if (q.op == OP_STATE) {
        if (METHOD_IS("GET") || METHOD_IS("HEAD"))
            rc = op_state(&x, &q, out);
        else
            rc = api_error(out, 405, "use GET"), evbuffer_add_printf(hdr, "Allow: GET\r\n");
        goto done;
    }
    int put = METHOD_IS("PUT"), del = METHOD_IS("DELETE"), post = METHOD_IS("POST");
    if (q.op == OP_OVERRIDE ? !put && !del : !post) {
        evbuffer_add_printf(hdr, "Allow: %s\r\n", q.op == OP_OVERRIDE ? "PUT, DELETE" : "POST");
        rc = api_error(out, 405, "use %s", q.op == OP_OVERRIDE ? "PUT or DELETE" : "POST");
        goto done;
    }
    rc = check_token(c, data, h, out, hdr);
    if (rc != 0)
        goto done;
    q.reset = post;
    if (put)
        rc = op_put(&x, &q, body, len, out);
    else
        rc = op_delete(&x, &q, out);
done:
#undef METHOD_IS
    req_free(&q);
    if (rc != ADMIN_API_PENDING)    /* else the pending request's */
        conf_release(c);
    return rc;
}

const char *admin_api_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 421: return "Misdirected Request";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}
