/* sluice - conf_net.c: the config sections about sockets and peers: listen
 * (an address, or entries with TLS certificates), decision (its own listen,
 * deny_status, path_prefix), workers, max_connections,
 * shutdown_timeout, client, upstreams (with their tls block, whose keys are
 * conf_tls.c's conf_tls_client_keys), admin and access_log. */
#include "conf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf_int.h"

/* ---- listen: an address, or a list of { address, tls } entries */

#define CONF_MAX_LISTENS 16
#define CONF_MAX_CERTS   64

static int h_cert_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!*s || strlen(s) > PATH_MAX)
        return conf_fail(x, v, "expected a file path");
    ((struct conf_cert *)obj)->cert_file = xstrdup(s);
    return 0;
}

static int h_key_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!*s || strlen(s) > PATH_MAX)
        return conf_fail(x, v, "expected a file path");
    ((struct conf_cert *)obj)->key_file = xstrdup(s);
    return 0;
}

static const struct key_def cert_keys[] = {
    { "cert_file", h_cert_file, 1 },
    { "key_file", h_key_file, 1 },
    { NULL, NULL, 0 },
};

static int h_tls_certificates(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_tls *t = obj;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0 || v->nkids > CONF_MAX_CERTS)
        return conf_fail(x, v, "needs 1 to %d certificates", CONF_MAX_CERTS);
    t->certs = xcalloc((size_t)v->nkids, sizeof *t->certs);
    t->ncerts = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        conf_mark_node(x, v->kids[i], &t->certs[i].at);
        int rc = conf_walk_map(x, v->kids[i], cert_keys, &t->certs[i]);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_tls_min_version(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "1.2", "1.3" };
    int i = 0;
    if (conf_get_enum(x, v, names, 2, "\"1.2\" or \"1.3\"", &i) < 0)
        return -1;
    ((struct conf_tls *)obj)->min_version = i ? 13 : 12;
    return 0;
}

static const struct key_def tls_keys[] = {
    { "certificates", h_tls_certificates, 1 },
    { "min_version", h_tls_min_version, 0 },
    { NULL, NULL, 0 },
};

static int h_listen_address(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_addr(x, v, &((struct conf_listen *)obj)->addr);
}

static int h_listen_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_listen *l = obj;
    l->tls = xcalloc(1, sizeof *l->tls);
    l->tls->min_version = 12;
    return conf_walk_map(x, v, tls_keys, l->tls);
}

static int h_listen_http2(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int on = 1;
    if (conf_get_bool(x, v, &on) < 0)
        return -1;
    ((struct conf_listen *)obj)->no_http2 = !on;
    return 0;
}

static const struct key_def listen_keys[] = {
    { "address", h_listen_address, 1 },
    { "tls", h_listen_tls, 0 },
    { "http2", h_listen_http2, 0 },
    { NULL, NULL, 0 },
};

/* A listen value (an address, or a list of entries) into *out, *n:
 * listen's and decision.listen's. */
static int parse_listens(struct ctx *x, struct node *v, struct conf_listen **out, int *n)
{
    if (v->kind != NODE_SEQ) {
        *out = xcalloc(1, sizeof **out);
        *n = 1;
        return conf_get_addr(x, v, &(*out)[0].addr);
    }
    if (v->nkids < 1 || v->nkids > CONF_MAX_LISTENS)
        return conf_fail(x, v, "needs 1 to %d entries", CONF_MAX_LISTENS);
    struct conf_listen *ls = xcalloc((size_t)v->nkids, sizeof *ls);
    *out = ls;
    *n = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        struct conf_listen *l = &ls[i];
        int rc = v->kids[i]->kind == NODE_MAP ? conf_walk_map(x, v->kids[i], listen_keys, l)
                                              : conf_get_addr(x, v->kids[i], &l->addr);
        if (rc == 0 && l->tls)
            l->tls->no_h2 = l->no_http2;
        for (int j = 0; rc == 0 && j < i; j++)
            if (ls[j].addr.sslen == l->addr.sslen &&
                !memcmp(&ls[j].addr.ss, &l->addr.ss, l->addr.sslen))
                rc = conf_fail(x, v->kids[i], "address '%s' is listed twice", l->addr.text);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int conf_h_listen(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (parse_listens(x, v, &c->listens, &c->nlistens) < 0)
        return -1;
    c->listen = c->listens[0].addr;
    c->listen.text = xstrdup(c->listens[0].addr.text);
    return 0;
}

static void listens_free(struct conf_listen *ls, int n)
{
    for (int i = 0; i < n; i++) {
        struct conf_listen *l = &ls[i];
        free(l->addr.text);
        if (l->tls) {
            for (int j = 0; j < l->tls->ncerts; j++) {
                free(l->tls->certs[j].cert_file);
                free(l->tls->certs[j].key_file);
                free(l->tls->certs[j].at.where);
            }
            free(l->tls->certs);
            free(l->tls);
        }
    }
    free(ls);
}

void conf_listens_free(struct conf *c)
{
    listens_free(c->listens, c->nlistens);
    listens_free(c->decision.listens, c->decision.nlistens);
}

/* ---- decision: its own listen, the status of a rejection, the prefix */

static int h_decision_listen(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_decision *d = obj;
    /* HTTP/2 as on listen (Envoy's RLS is gRPC; an entry's http2: false
     * keeps it to HTTP/1.1) */
    return parse_listens(x, v, &d->listens, &d->nlistens);
}

/* nginx's auth_request passes on 401 and 403 only (any other status is
 * its 500), Traefik and Caddy any status: an error status, 400 to 599. */
static int h_decision_deny_status(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 400, 599, &n) < 0)
        return -1;
    ((struct conf_decision *)obj)->deny_status = (int)n;
    return 0;
}

/* An absolute path of plain segments, compared with the request target as
 * sent: no '%', '?', '#', empty or dot segment, trailing '/'. */
static int h_decision_path_prefix(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_decision *d = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    size_t n = strlen(s);
    int ok = n >= 2 && n <= CONF_MAX_PREFIX && s[0] == '/' && s[n - 1] != '/' &&
             !strstr(s, "//") && !strstr(s, "/./") && !strstr(s, "/../");
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
             (s[i] >= '0' && s[i] <= '9') || strchr("/-._~", s[i]) != NULL;
    if (ok && (!strcmp(s + n - 2, "/.") || (n >= 3 && !strcmp(s + n - 3, "/.."))))
        ok = 0;
    if (!ok)
        return conf_fail(x, v, "bad path_prefix '%s' (a path such as /decide: segments of "
                         "letters, digits, '-', '.', '_', '~', no trailing '/')",
                         conf_show(s, sb));
    free(d->path_prefix);
    d->path_prefix = xstrdup(s);
    d->path_prefix_len = n;
    return 0;
}

/* Envoy's RLS: the descriptors' file or directory (read in phase 3 by
 * conf_load.c), how a call consumes, and what it gets while Redis is down. */
static int h_decision_ratelimit_config(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_decision *d = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!*s)
        return conf_fail(x, v, "expected a file or directory path");
    d->ratelimit_config = xstrdup(s);
    return 0;
}

static int h_decision_rls_consume(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "all_or_nothing", "every_descriptor" };
    return conf_get_enum(x, v, names, 2, "all_or_nothing or every_descriptor",
                         &((struct conf_decision *)obj)->rls_count_each);
}

static int h_decision_rls_on_error(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "allow", "deny", "unavailable" };
    int i = 0;
    if (conf_get_enum(x, v, names, 3, "allow, deny or unavailable", &i) < 0)
        return -1;
    ((struct conf_decision *)obj)->rls_on_error = (enum conf_rls_on_error)(i + 1);
    return 0;
}

static const struct key_def decision_keys[] = {
    { "listen", h_decision_listen, 1 },
    { "deny_status", h_decision_deny_status, 0 },
    { "path_prefix", h_decision_path_prefix, 0 },
    { "ratelimit_config", h_decision_ratelimit_config, 0 },
    { "rls_consume", h_decision_rls_consume, 0 },
    { "rls_on_error", h_decision_rls_on_error, 0 },
    { NULL, NULL, 0 },
};

int conf_h_decision(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    c->decision.on = 1;
    c->decision.path_prefix = xstrdup("/decide");
    c->decision.path_prefix_len = 7;
    return conf_walk_map(x, v, decision_keys, &c->decision);
}

/* Phase 3: decision.listen's entries join listen's (marked decision), so
 * that every worker binds them as it binds the proxy's; an address on
 * both is an error at the decision entry. listen may be absent then (a
 * decision service without a proxy listener). */
int conf_decision_merge(struct ctx *x, struct node *root)
{
    struct conf *c = x->c;
    struct conf_decision *d = &c->decision;
    if (!d->on)
        return 0;
    struct node *lv = conf_map_get(conf_map_get(root, "decision"), "listen");
    for (int i = 0; i < d->nlistens; i++) {
        const struct conf_listen *l = &d->listens[i];
        for (int j = 0; j < c->nlistens; j++) {
            if (c->listens[j].addr.sslen != l->addr.sslen ||
                memcmp(&c->listens[j].addr.ss, &l->addr.ss, l->addr.sslen) != 0)
                continue;
            size_t old = lv->kind == NODE_SEQ ? conf_path_push(x, "decision.listen[%d]", i)
                                              : conf_path_push(x, "decision.listen");
            conf_fail(x, lv->kind == NODE_SEQ ? lv->kids[i] : lv, "address '%s' is also in "
                      "listen (the decision listener needs an address of its own)",
                      l->addr.text);
            conf_path_pop(x, old);
            return -1;
        }
    }
    c->listens = realloc(c->listens, (size_t)(c->nlistens + d->nlistens) * sizeof *c->listens);
    if (c->listens == NULL)
        abort();
    for (int i = 0; i < d->nlistens; i++) {
        c->listens[c->nlistens] = d->listens[i];
        c->listens[c->nlistens++].decision = 1;
    }
    if (c->listen.text == NULL) {       /* no listen: a decision service alone */
        c->listen = c->listens[0].addr;
        c->listen.text = xstrdup(c->listens[0].addr.text);
    }
    free(d->listens);
    d->listens = NULL;
    d->nlistens = 0;
    return 0;
}

int conf_h_workers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    const char *s = conf_scalar(x, v);
    int64_t n = 0;
    if (!s)
        return -1;
    if (!strcmp(s, "auto")) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        c->workers = cpus < 1 ? 1 : cpus > 1024 ? 1024 : (int)cpus;
        return 0;
    }
    if (conf_get_int(x, v, 1, 1024, &n) < 0)
        return -1;
    c->workers = (int)n;
    return 0;
}

int conf_h_max_connections(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 0, 10000000, &n) < 0)
        return -1;
    ((struct conf *)obj)->max_connections = (int)n;
    return 0;
}

static int h_max_header_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    uint64_t n;
    if (conf_get_size(x, v, 1024, CONF_MAX_HEADER_BYTES, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->max_header_bytes = (size_t)n;
    return 0;
}

static int h_max_body_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_size(x, v, 0, UINT64_MAX, &((struct conf_client *)obj)->max_body_bytes);
}

static int h_header_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_client *)obj)->header_timeout_ms);
}

static int h_idle_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_client *)obj)->idle_timeout_ms);
}

static int h_body_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_client *)obj)->body_timeout_ms);
}

static int h_buffer_body_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    uint64_t n = 0;
    if (conf_get_size(x, v, 0, 1048576, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->buffer_body_bytes = (size_t)n;
    return 0;
}

int conf_h_shutdown_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf *)obj)->shutdown_timeout_ms);
}

static int h_underscore_headers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "drop", "pass", "reject" };
    int i = 0;
    if (conf_get_enum(x, v, names, 3, "drop, pass or reject", &i) < 0)
        return -1;
    ((struct conf_client *)obj)->underscore_headers = (enum conf_underscore)i;
    return 0;
}

static int h_http2_max_streams(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n;
    if (conf_get_int(x, v, 1, 10000, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->http2_max_streams = (uint32_t)n;
    return 0;
}

static int h_http2_max_requests(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n;
    if (conf_get_int(x, v, 0, 1000000000, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->http2_max_requests = (uint32_t)n;
    return 0;
}

static const struct key_def client_keys[] = {
    { "http2_max_streams", h_http2_max_streams, 0 },
    { "http2_max_requests", h_http2_max_requests, 0 },
    { "max_header_bytes", h_max_header_bytes, 0 },
    { "max_body_bytes", h_max_body_bytes, 0 },
    { "header_timeout", h_header_timeout, 0 },
    { "idle_timeout", h_idle_timeout, 0 },
    { "body_timeout", h_body_timeout, 0 },
    { "underscore_headers", h_underscore_headers, 0 },
    { "buffer_body_bytes", h_buffer_body_bytes, 0 },
    { NULL, NULL, 0 },
};

int conf_h_client(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, client_keys, &((struct conf *)obj)->client);
}

/* ---- upstreams */

static int h_up_servers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_upstream *u = obj;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one server");
    u->servers = xcalloc((size_t)v->nkids, sizeof *u->servers);
    u->nservers = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = conf_get_addr(x, v->kids[i], &u->servers[i]);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_up_keepalive(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 0, 65536, &n) < 0)
        return -1;
    ((struct conf_upstream *)obj)->keepalive = (int)n;
    return 0;
}

static int h_up_connect_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_upstream *)obj)->connect_timeout_ms);
}

static int h_up_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_duration(x, v, &((struct conf_upstream *)obj)->timeout_ms);
}

static int h_up_protocol(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "http/1.1", "h2" };
    return conf_get_enum(x, v, names, 2, "http/1.1 or h2", &((struct conf_upstream *)obj)->h2);
}

/* tls: {} (or null) is TLS with every default. The files are read when
 * the file is loaded (confcheck.c, at the places marked here), so that a
 * bad one is this file's error (and sluice -t's), not a 502 later. */
static int h_up_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_upstream *u = obj;
    struct conf_tls_client *t = xcalloc(1, sizeof *t);
    u->tls = t;
    t->verify = 1;
    conf_mark_node(x, k, &t->at);
    if (v->kind != NODE_NULL && conf_walk_map(x, v, conf_tls_client_keys, t) < 0)
        return -1;
    if ((t->cert_file != NULL) != (t->key_file != NULL))
        return conf_fail(x, k, "cert_file and key_file go together (the client certificate "
                         "and its key)");
    return 0;
}

static const struct key_def upstream_keys[] = {
    { "servers", h_up_servers, 1 },
    { "keepalive", h_up_keepalive, 0 },
    { "connect_timeout", h_up_connect_timeout, 0 },
    { "timeout", h_up_timeout, 0 },
    { "tls", h_up_tls, 0 },
    { "protocol", h_up_protocol, 0 },
    { NULL, NULL, 0 },
};

/* upstreams: a mapping of name -> upstream, so no fixed key table here. */
int conf_h_upstreams(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (conf_expect(x, v, NODE_MAP) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one upstream");
    c->nupstreams = v->nkids / 2;
    c->upstreams = xcalloc((size_t)c->nupstreams, sizeof *c->upstreams);
    for (int i = 0; i < c->nupstreams; i++) {
        struct conf_upstream *u = &c->upstreams[i];
        struct node *name = v->kids[2 * i];
        const char *s = conf_name_scalar(x, name);
        size_t old;
        int rc;
        if (!s)
            return -1;
        for (int j = 0; j < i; j++)
            if (!strcmp(c->upstreams[j].name, s))
                return conf_fail(x, name, "duplicate upstream '%s'", s);
        u->name = xstrdup(s);
        u->keepalive = 32;
        u->connect_timeout_ms = 2000;
        u->timeout_ms = 30000;
        old = conf_path_push_key(x, s);
        rc = conf_walk_map(x, v->kids[2 * i + 1], upstream_keys, u);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- admin, access_log */

static int h_admin_listen(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (conf_get_addr(x, v, &c->admin_listen) < 0)
        return -1;
    c->has_admin = 1;
    return 0;
}

/* admin.token: a Bearer token for the admin API's writes (${VAR} is the
 * way to keep it out of the file). */
static int h_admin_token(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    size_t n = strlen(s);
    if (n == 0 || n > CONF_MAX_TOKEN)
        return conf_fail(x, v, "token must be 1 to %d bytes", CONF_MAX_TOKEN);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
            return conf_fail(x, v, "token has a space or a control byte");
    free(c->admin_token);
    c->admin_token = xstrdup(s);
    return 0;
}

/* admin.hosts: the names (Host header) the admin endpoint also answers, as
 * a browser sends them: a DNS-rebinding page's name is not among them. */
static int h_admin_hosts(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids > CONF_MAX_ADMIN_HOSTS)
        return conf_fail(x, v, "at most %d admin hosts", CONF_MAX_ADMIN_HOSTS);
    for (int i = 0; i < c->nadmin_hosts; i++)
        free(c->admin_hosts[i]);
    free(c->admin_hosts);
    c->admin_hosts = xcalloc((size_t)v->nkids + 1, sizeof(*c->admin_hosts));
    c->nadmin_hosts = 0;
    for (int i = 0; i < v->nkids; i++) {
        char sb[SHOW_BUF];
        const char *s = conf_scalar(x, v->kids[i]);
        if (!s)
            return -1;
        if (!conf_hostname_ok(s))
            return conf_fail(x, v->kids[i], "bad host name '%s' (a DNS name, without a port)",
                             conf_show(s, sb));
        c->admin_hosts[c->nadmin_hosts++] = xstrdup(s);
    }
    return 0;
}

static const struct key_def admin_keys[] = {
    { "listen", h_admin_listen, 1 },
    { "token", h_admin_token, 0 },
    { "hosts", h_admin_hosts, 0 },
    { NULL, NULL, 0 },
};

int conf_h_admin(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, admin_keys, obj);
}

/* off (NULL), stdout, or a file path; the file is opened by the access log
 * module, which reopens it on SIGUSR1. */
int conf_h_access_log(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!*s)
        return conf_fail(x, v, "empty value (use off, stdout or a file path)");
    if (strlen(s) > PATH_MAX)
        return conf_fail(x, v, "path is longer than %d bytes", PATH_MAX);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return conf_fail(x, v, "path '%s' has a control byte", conf_show(s, sb));
    free(c->access_log);
    c->access_log = strcmp(s, "off") ? xstrdup(s) : NULL;
    return 0;
}
