/* sluice - conf_load.c: YAML file -> struct conf, the only user of libyaml.
 *
 * Three phases, each stopping at the first error: (1) syntax: libyaml events
 * become a small tree of nodes that keep their file position; (2) each key:
 * every mapping is walked with a table of {key, handler}, handlers check type
 * and bounds and fill struct conf; (3) across keys: upstream references and
 * duplicate names. Every error reads "FILE:LINE:COL: message" and names the
 * key path, so an operator can fix a bad file without guessing. What the
 * modules that use a config must build or check (TLS files and contexts,
 * override keys) is confcheck.c's, after this: the nodes it may blame are
 * recorded here (struct conf_mark).
 *
 * This file is the top of the loader: the load, phase 1 (the node tree), the
 * top-level key table, phase 3 and the refcount and cleanup. Below it, each
 * calling only what is under it: the sections' handlers, conf_net.c's
 * (listen, client, upstreams, admin, access_log), conf_redis.c's (backend,
 * memory, deny_cache, redis) and conf_limits.c's (routes, limits, overrides,
 * allow lists, paths); conf_tls.c (the TLS client keys that upstreams and
 * redis share); conf_value.c (the value parsers); conf.c (the error
 * reporting, the key path, the walker). What they share is in conf_int.h. */
#include "conf.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "conf_int.h"
#include "regex.h"
#include "tzcal.h"

/* ---- phase 1: syntax, events -> node tree */

static void node_free(struct node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->nkids; i++)
        node_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    free(n);
}

static struct node *node_new(enum node_kind kind, const yaml_mark_t *m)
{
    struct node *n = xcalloc(1, sizeof *n);
    n->kind = kind;
    n->line = (int)m->line + 1;
    n->col = (int)m->column + 1;
    return n;
}

static void node_add(struct node *n, struct node *kid, int *cap)
{
    if (n->nkids == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        n->kids = realloc(n->kids, (size_t)*cap * sizeof *n->kids);
        if (!n->kids)
            abort();
    }
    n->kids[n->nkids++] = kid;
}

/* Reader errors (bad UTF-8) carry a byte offset, not a mark. */
static void offset_to_mark(const struct ctx *x, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < x->len; i++) {
        if (x->buf[i] == '\n')
            (*line)++, *col = 1;
        else
            (*col)++;
    }
}

static int syntax_error(struct ctx *x, const yaml_parser_t *p)
{
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    const char *problem = p->problem ? p->problem : "cannot parse";
    if (p->error == YAML_MEMORY_ERROR)
        abort();
    if (p->error == YAML_READER_ERROR)
        offset_to_mark(x, p->problem_offset, &line, &col);
    if (p->context && p->context_mark.line == p->problem_mark.line &&
        p->context_mark.column == p->problem_mark.column)
        return conf_fail_mark(x, line, col, "syntax error: %s (%s)", problem, p->context);
    if (p->context)
        return conf_fail_mark(x, line, col, "syntax error: %s (%s at %d:%d)", problem,
                         p->context, (int)p->context_mark.line + 1,
                         (int)p->context_mark.column + 1);
    return conf_fail_mark(x, line, col, "syntax error: %s", problem);
}

static int next_event(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev)
{
    if (!yaml_parser_parse(p, ev))
        return syntax_error(x, p);
    return 0;
}

static int is_null_text(const char *s)
{
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

static struct node *tree_from(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev, int depth);

static struct node *tree_scalar(struct ctx *x, yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    struct node *n;
    if (memchr(v, '\0', len)) {
        conf_fail_mark(x, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1,
                  "a value contains a NUL byte");
        return NULL;
    }
    n = node_new(NODE_SCALAR, &ev->start_mark);
    n->str = xstrndup(v, len);
    if (ev->data.scalar.plain_implicit && is_null_text(n->str))
        n->kind = NODE_NULL;
    return n;
}

/* Children of a sequence or mapping until its end event. */
static int tree_children(struct ctx *x, yaml_parser_t *p, struct node *n,
                         yaml_event_type_t end, int depth)
{
    int cap = 0;
    for (;;) {
        yaml_event_t ev;
        struct node *kid;
        if (next_event(x, p, &ev) < 0)
            return -1;
        if (ev.type == end) {
            yaml_event_delete(&ev);
            return 0;
        }
        kid = tree_from(x, p, &ev, depth + 1);
        yaml_event_delete(&ev);
        if (!kid)
            return -1;
        node_add(n, kid, &cap);
        if (n->kind == NODE_MAP && n->nkids % 2 == 1 && kid->kind != NODE_SCALAR)
            return conf_fail_bare(x, kid, "syntax error: a mapping key must be a plain value");
    }
}

/* The node that starts with event ev (the caller deletes ev). */
static struct node *tree_from(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev, int depth)
{
    struct node *n;
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    if (depth > CONF_MAX_DEPTH) {
        conf_fail_mark(x, line, col, "syntax error: nested deeper than %d levels", CONF_MAX_DEPTH);
        return NULL;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        return tree_scalar(x, ev);
    case YAML_SEQUENCE_START_EVENT:
        n = node_new(NODE_SEQ, &ev->start_mark);
        if (tree_children(x, p, n, YAML_SEQUENCE_END_EVENT, depth) < 0)
            goto fail;
        return n;
    case YAML_MAPPING_START_EVENT:
        n = node_new(NODE_MAP, &ev->start_mark);
        if (tree_children(x, p, n, YAML_MAPPING_END_EVENT, depth) < 0)
            goto fail;
        return n;
    case YAML_ALIAS_EVENT:
        /* Aliases would make the tree a graph (and a "billion laughs"
         * file a bomb); a config this small does not need them. */
        conf_fail_mark(x, line, col, "syntax error: aliases (*name) are not supported");
        return NULL;
    default:
        conf_fail_mark(x, line, col, "syntax error: unexpected YAML event");
        return NULL;
    }
fail:
    node_free(n);
    return NULL;
}

/* The one document of the file, or NULL with x->err set. */
static struct node *tree_load(struct ctx *x)
{
    yaml_parser_t p;
    yaml_event_t ev;
    struct node *root = NULL;
    int have_ev = 0;

    if (!yaml_parser_initialize(&p))
        abort();
    yaml_parser_set_input_string(&p, (const unsigned char *)x->buf, x->len);
    if (next_event(x, &p, &ev) < 0)             /* stream start */
        goto fail;
    yaml_event_delete(&ev);
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    if (ev.type == YAML_STREAM_END_EVENT) {
        conf_fail_mark(x, 1, 1, "empty file: expected a mapping with listen, upstreams and routes");
        goto fail;
    }
    yaml_event_delete(&ev);                     /* document start */
    have_ev = 0;
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    root = tree_from(x, &p, &ev, 0);
    if (!root)
        goto fail;
    yaml_event_delete(&ev);
    have_ev = 0;
    if (next_event(x, &p, &ev) < 0)             /* document end */
        goto fail;
    yaml_event_delete(&ev);
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    if (ev.type != YAML_STREAM_END_EVENT) {
        conf_fail_mark(x, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                  "syntax error: only one YAML document is allowed");
        goto fail;
    }
    yaml_event_delete(&ev);
    yaml_parser_delete(&p);
    return root;
fail:
    if (have_ev)
        yaml_event_delete(&ev);
    yaml_parser_delete(&p);
    node_free(root);
    return NULL;
}
/* route->metrics is not ours: runtime_bind_metrics() points it into its registry. */
static const struct key_def top_keys[] = {
    { "listen", conf_h_listen, 0 },          /* required unless decision: */
    { "workers", conf_h_workers, 0 },
    { "max_connections", conf_h_max_connections, 0 },
    { "shutdown_timeout", conf_h_shutdown_timeout, 0 },
    { "client", conf_h_client, 0 },
    { "redis", conf_h_redis, 0 },
    { "upstreams", conf_h_upstreams, 0 },     /* required unless decision: */
    { "trusted_proxies", conf_h_trusted, 0 },
    { "routes", conf_h_routes, 1 },
    { "allow", conf_h_allow, 0 },
    { "backend", conf_h_backend, 0 },
    { "memory", conf_h_memory, 0 },
    { "deny_cache", conf_h_deny_cache, 0 },
    { "admin", conf_h_admin, 0 },
    { "access_log", conf_h_access_log, 0 },
    { "paths", conf_h_paths, 0 },
    { "decision", conf_h_decision, 0 },
    { "plans", conf_h_plans, 0 },
    { "jwt", conf_h_jwt, 0 },
    { NULL, NULL, 0 },
};

/* ---- phase 3: across keys */

/* A route applying plans: there are plans, and its limits with any plan's
 * fit in one decision. */
static int check_route_plans(struct ctx *x, const struct conf_route *r, struct node *rn)
{
    const struct conf *c = x->c;
    struct node *at = conf_map_get(rn, r->plan_key ? "plan_key" : "plan_from");
    size_t old = conf_path_push(x, r->plan_key ? ".plan_key" : ".plan_from");
    int rc = 0;
    if (c->nplans == 0)
        rc = conf_fail(x, at, "the route applies plans but there is no plans: section");
    for (int i = 0; i < c->nplans && rc == 0; i++) {
        const struct conf_route *p = &c->plans[i].route;
        if (r->nlimits + p->nlimits > CONF_MAX_LIMITS)
            rc = conf_fail(x, at, "the route's %d limits and plan '%s''s %d are more than %d",
                           r->nlimits, c->plans[i].name, p->nlimits, CONF_MAX_LIMITS);
        /* one name per limit in the rate-limit fields and the 429 body */
        for (int a = 0; a < r->nlimits && rc == 0; a++)
            for (int b = 0; b < p->nlimits && rc == 0; b++)
                if (!strcmp(r->limits[a].name, p->limits[b].name))
                    rc = conf_fail(x, at, "limit name '%s' is both the route's and plan '%s''s "
                                   "(responses name the limit that denies)",
                                   p->limits[b].name, c->plans[i].name);
    }
    conf_path_pop(x, old);
    return rc;
}

static int check_route(struct ctx *x, int i)
{
    struct conf *c = x->c;
    struct conf_route *r = &c->routes[i];
    struct node *rn = x->routes->kids[i], *name = conf_map_get(rn, "name");
    struct node *up = conf_map_get(rn, "upstream"), *limits = conf_map_get(rn, "limits");
    char sb[SHOW_BUF];
    size_t old = conf_path_push(x, "routes[%d]", i), o2;
    int rc = 0;

    for (int j = 0; j < i && rc == 0; j++) {
        if (!strcmp(c->routes[j].name, r->name)) {
            struct node *first = conf_map_get(x->routes->kids[j], "name");
            o2 = conf_path_push(x, ".name");
            rc = conf_fail(x, name, "duplicate route name '%s' (first at %d:%d)", r->name,
                           first->line, first->col);
            conf_path_pop(x, o2);
        }
    }
    /* A route without an upstream is the decision listener's alone
     * (route_match passes it over for proxied requests). */
    if (rc == 0 && up == NULL && !c->decision.on)
        rc = conf_fail_bare(x, rn, "missing required key 'upstream' in %s (a route without "
                            "one needs a decision section)", conf_where(x));
    for (int j = 0; j < c->nupstreams && rc == 0 && up && !r->upstream; j++)
        if (!strcmp(c->upstreams[j].name, up->str))
            r->upstream = &c->upstreams[j];
    if (rc == 0 && up && !r->upstream) {
        o2 = conf_path_push(x, ".upstream");
        rc = conf_fail(x, up, "unknown upstream '%s'", conf_show(up->str, sb));
        conf_path_pop(x, o2);
    }
    /* concurrency without a lease: the upstream's timeout + 10 s (without
     * an upstream, the default timeout's), in its overrides too (their
     * parameters were copied from the limit's before) */
    for (int a = 0; a < r->nlimits && rc == 0; a++) {
        struct conf_limit *l = &r->limits[a];
        if (l->params.algo != LIMITER_CONCURRENCY || l->params.window_ms != 0)
            continue;
        l->params.window_ms = (r->upstream ? r->upstream->timeout_ms : 30000) + 10000;
        for (int k = 0; k < l->noverrides; k++)
            l->overrides[k].params.window_ms = l->params.window_ms;
    }
    for (int a = 0; a < r->nlimits && rc == 0; a++) {
        for (int b = 0; b < a && rc == 0; b++) {
            if (!strcmp(r->limits[a].name, r->limits[b].name)) {
                struct node *n = conf_map_get(limits->kids[a], "name");
                struct node *first = conf_map_get(limits->kids[b], "name");
                o2 = conf_path_push(x, ".limits[%d].name", a);
                rc = conf_fail(x, n, "duplicate limit name '%s' in this route (first at %d:%d)",
                               r->limits[a].name, first->line, first->col);
                conf_path_pop(x, o2);
            }
        }
    }
    if (rc == 0)                /* written on every response: built once */
        r->policy = conf_route_policy(r, NULL, NULL, &r->policy_len);
    if (rc == 0 && (r->plan_key || r->plan_from))
        rc = check_route_plans(x, r, rn);
    conf_path_pop(x, old);
    return rc;
}

/* capture:N needs the route's path_regex to have at least N groups. */
static int check_captures(struct ctx *x, int i)
{
    const struct conf_route *r = &x->c->routes[i];
    struct node *limits = conf_map_get(x->routes->kids[i], "limits");
    int rc = 0;
    for (int j = 0; j < r->nlimits && rc == 0; j++) {
        struct node *keys = conf_map_get(limits->kids[j], "key");
        for (int k = 0; k < r->limits[j].nkeys && rc == 0; k++) {
            const struct conf_keysrc *ks = &r->limits[j].keys[k];
            size_t old;
            if (ks->kind != CONF_KEY_CAPTURE || ks->capture <= r->ncaptures)
                continue;
            old = conf_path_push(x, "routes[%d].limits[%d].key[%d]", i, j, k);
            if (!r->regex)
                rc = conf_fail(x, keys->kids[k], "capture:%d but the route has no path_regex",
                               ks->capture);
            else
                rc = conf_fail(x, keys->kids[k], "capture:%d but path_regex has %d group%s",
                               ks->capture, r->ncaptures, r->ncaptures == 1 ? "" : "s");
            conf_path_pop(x, old);
        }
    }
    return rc;
}

/* paths: a route that no request could meet after it. With matrix_params:
 * strip no path holds ';'; with case: insensitive every path is lower case,
 * so a path_regex letter in upper case would never match (one in an escape
 * such as \S or in a bracket expression such as [A-Za-z] may). */
static int check_paths(struct ctx *x, int i)
{
    const struct conf_route *r = &x->c->routes[i];
    struct node *match = conf_map_get(x->routes->kids[i], "match");
    char sb[SHOW_BUF];
    size_t old;
    int rc = 0;
    if (x->c->paths.strip_matrix && r->path && strchr(r->path, ';')) {
        old = conf_path_push(x, "routes[%d].match.path", i);
        rc = conf_fail(x, conf_map_get(match, "path"), "path '%s' has a ';', which "
                       "paths.matrix_params: strip takes out of every request path",
                       conf_show(r->path, sb));
        conf_path_pop(x, old);
        return rc;
    }
    if (!x->c->paths.case_insensitive || !r->path_regex)
        return 0;
    for (const char *p = r->path_regex; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            continue;
        }
        if (*p == '[') {
            const char *q = p + 1 + (p[1] == '^');
            q = strchr(*q == ']' ? q + 1 : q, ']');     /* "[]a]" holds a ']' */
            if (q == NULL)
                break;
            p = q;
            continue;
        }
        if (*p >= 'A' && *p <= 'Z') {
            old = conf_path_push(x, "routes[%d].match.path_regex", i);
            rc = conf_fail(x, conf_map_get(match, "path_regex"),
                           "path_regex '%s' has the upper-case "
                           "'%c', but paths.case: insensitive matches lower-cased paths",
                           conf_show(r->path_regex, sb), *p);
            conf_path_pop(x, old);
            return rc;
        }
    }
    return 0;
}

/* The admin endpoint must not share the public listener's address. */
static int check_admin(struct ctx *x, struct node *root)
{
    const struct conf *c = x->c;
    struct node *admin = conf_map_get(root, "admin");
    size_t old;
    int same = 0;
    for (int i = 0; c->has_admin && i < c->nlistens; i++)
        same |= c->admin_listen.sslen == c->listens[i].addr.sslen &&
                !memcmp(&c->admin_listen.ss, &c->listens[i].addr.ss, c->admin_listen.sslen);
    if (!same)
        return 0;
    old = conf_path_push(x, "admin.listen");
    conf_fail(x, conf_map_get(admin, "listen"), "same address as listen (the admin endpoint must "
              "not be on the public listener)");
    conf_path_pop(x, old);
    return -1;
}

static char *read_file(struct ctx *x, size_t *len);

static int rls_name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int rls_yaml_name(const struct dirent *e)
{
    size_t n = strlen(e->d_name);
    return e->d_name[0] != '.' && ((n > 5 && !strcmp(e->d_name + n - 5, ".yaml")) ||
                                   (n > 4 && !strcmp(e->d_name + n - 4, ".yml")));
}

/* One file of decision.ratelimit_config, with errors at its own places. */
static int rls_load_file(struct ctx *x, const char *path, struct conf_rls *rls)
{
    struct ctx sub;
    memset(&sub, 0, sizeof sub);
    sub.file = path;
    sub.c = x->c;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {     /* a FIFO would block */
        if (asprintf(&x->err, "%s: cannot read: not a regular file", path) < 0)
            abort();
        return -1;
    }
    char *buf = read_file(&sub, &sub.len);
    struct node *root = NULL;
    if (buf) {
        sub.buf = buf;
        root = tree_load(&sub);
        if (root)
            conf_rls_file(&sub, root, rls);
    }
    node_free(root);
    free(buf);
    x->err = sub.err;
    return sub.err ? -1 : 0;
}


/* Does one of r's limits estimate from the request body? */
static int route_estimates(const struct conf_route *r)
{
    for (int i = 0; i < r->nlimits; i++)
        if (r->limits[i].estimate_json)
            return 1;
    return 0;
}

/* body_estimate: a route reads the body before its decision when one of
 * its limits, or of the plans it may apply, estimates from it. */
static void mark_body_estimates(struct conf *c)
{
    int plans = 0;
    for (int i = 0; i < c->nplans; i++)
        plans |= route_estimates(&c->plans[i].route);
    for (int i = 0; i < c->nroutes; i++) {
        struct conf_route *r = &c->routes[i];
        r->body_estimate = route_estimates(r) || ((r->plan_key || r->plan_from) && plans);
    }
}

/* One key per route: a limit that limit.lua can decide as a part (fixed
 * and sliding windows, token bucket, gcra), that consumes when it allows
 * and nothing else (no shadow, count_status or delay) and whose cost is
 * the route's (no cost_header, no cost_from). */
static int limit_packable(const struct conf_limit *l)
{
    enum limiter_algo a = l->params.algo;
    return (a == LIMITER_FIXED_WINDOW || a == LIMITER_SLIDING_WINDOW ||
            a == LIMITER_TOKEN_BUCKET || a == LIMITER_GCRA) &&
           !l->shadow && !l->has_count_status && l->params.delay_ms == 0 &&
           l->cost_header == NULL && l->cost_from == CONF_COST_NONE;
}

/* Whether two limits key the same clients: the same sources, in order,
 * and the same answer to a missing one. */
static int same_key_spec(const struct conf_limit *a, const struct conf_limit *b)
{
    if (a->nkeys != b->nkeys || a->on_missing_key != b->on_missing_key)
        return 0;
    for (int i = 0; i < a->nkeys; i++) {
        const struct conf_keysrc *p = &a->keys[i], *q = &b->keys[i];
        if (p->kind != q->kind || p->arglen != q->arglen || p->capture != q->capture ||
            p->net != q->net || p->bits4 != q->bits4 || p->bits6 != q->bits6 ||
            (p->arglen && memcmp(p->arg, q->arg, p->arglen) != 0))
            return 0;
    }
    return 1;
}

static uint32_t part_tag(const char *name)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h ? h : 1;
}

/* redis.pack_limits: a route whose every limit is packable, on one key
 * specification, two limits or more, and no plan (a plan's limits join a
 * request's), keeps its limits as parts of one key per client, so that a
 * request writes Redis once (limit.lua's "One key per route"). Not on a
 * Redis Cluster: a route's limits there each have their own slot, which
 * the keys, and the admin API, already name. Tags that collide (FNV-1a of
 * two names of one route): the route keeps a key per limit. */
static void mark_parts(struct conf *c)
{
    if (!c->redis.pack_limits || c->redis.ncluster > 0)
        return;
    for (int i = 0; i < c->nroutes; i++) {
        struct conf_route *r = &c->routes[i];
        int ok = r->nlimits >= 2 && r->plan_key == NULL && r->plan_from == NULL;
        for (int j = 0; ok && j < r->nlimits; j++) {
            ok = limit_packable(&r->limits[j]) && same_key_spec(&r->limits[0], &r->limits[j]);
            for (int q = 0; ok && q < j; q++)
                ok = part_tag(r->limits[q].name) != part_tag(r->limits[j].name);
        }
        for (int j = 0; ok && j < r->nlimits; j++)
            r->limits[j].part = part_tag(r->limits[j].name);
    }
}

/* Phase 3: the RLS descriptors, from a file or every *.yaml and *.yml of a
 * directory in name order (hidden files left out); read again at each
 * reload with the rest. */
static int load_rls(struct ctx *x, struct node *root)
{
    struct conf_decision *d = &x->c->decision;
    d->rls = xcalloc(1, sizeof *d->rls);
    if (d->ratelimit_config == NULL)
        return 0;
    struct node *at = conf_map_get(conf_map_get(root, "decision"), "ratelimit_config");
    struct stat st;
    if (stat(d->ratelimit_config, &st) < 0) {
        size_t old = conf_path_push(x, "decision.ratelimit_config");
        conf_fail(x, at, "cannot read '%s': %s", d->ratelimit_config, strerror(errno));
        conf_path_pop(x, old);
        return -1;
    }
    int rc = 0;
    if (!S_ISDIR(st.st_mode))
        rc = rls_load_file(x, d->ratelimit_config, d->rls);
    else {
        struct dirent **names = NULL;
        int n = scandir(d->ratelimit_config, &names, rls_yaml_name, rls_name_cmp);
        if (n < 0) {
            size_t old = conf_path_push(x, "decision.ratelimit_config");
            conf_fail(x, at, "cannot read '%s': %s", d->ratelimit_config, strerror(errno));
            conf_path_pop(x, old);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            char *path = NULL;
            if (rc == 0 && asprintf(&path, "%s/%s", d->ratelimit_config, names[i]->d_name) < 0)
                abort();
            if (rc == 0)
                rc = rls_load_file(x, path, d->rls);
            free(path);
            free(names[i]);
        }
        free(names);
    }
    conf_rls_done(d->rls);
    return rc;
}

static int conf_from_tree(struct ctx *x, struct node *root)
{
    if (root->kind != NODE_MAP)
        return conf_fail_bare(x, root, "top level: expected a mapping, got %s",
                              conf_kind_name(root->kind));
    if (conf_walk_map(x, root, top_keys, x->c) < 0)
        return -1;
    if (x->c->nlistens == 0 && !x->c->decision.on)
        return conf_fail_bare(x, root, "missing required key 'listen' in top level");
    if (x->c->nupstreams == 0 && !x->c->decision.on)
        return conf_fail_bare(x, root, "missing required key 'upstreams' in top level (or a "
                              "decision section, whose routes need none)");
    for (int i = 0; i < x->c->nroutes; i++)
        if (check_route(x, i) < 0 || check_captures(x, i) < 0 || check_paths(x, i) < 0)
            return -1;
    if (conf_decision_merge(x, root) < 0 || load_rls(x, root) < 0 || check_admin(x, root) < 0 ||
        conf_check_jwt(x, root) < 0)
        return -1;
    mark_body_estimates(x->c);
    mark_parts(x->c);
    x->c->redis.overrides = x->c->admin_token != NULL;
    return 0;
}

/* ---- load, retain, release */

static struct conf *conf_new(const char *file)
{
    struct conf *c = xcalloc(1, sizeof *c);
    c->file = xstrdup(file);
    c->workers = 1;
    c->max_connections = 10000;
    c->shutdown_timeout_ms = 10000;
    c->client.max_header_bytes = 16384;
    c->client.max_body_bytes = 0;
    c->client.header_timeout_ms = 10000;
    c->client.idle_timeout_ms = 60000;
    c->client.body_timeout_ms = 60000;
    c->client.buffer_body_bytes = 65536;
    c->client.http2_max_streams = 128;
    c->client.http2_max_requests = 1000;
    if (conf_parse_redis_url("redis://127.0.0.1:6379/0", &c->redis) != NULL)
        abort();
    c->redis.url = xstrdup("redis://127.0.0.1:6379/0");
    c->redis.timeout_ms = 50;
    c->redis.prefix = xstrdup("sluice:");
    c->redis.on_error = CONF_ON_ERROR_ALLOW;
    c->redis.pack_limits = 1;
    c->redis.tls_conf.verify = 1;
    c->backend = CONF_BACKEND_REDIS;
    c->memory_max_keys = 1000000;
    c->deny_cache_max_keys = 100000;
    c->refs = 1;
    return c;
}

struct conf_cleanup {
    void (*fn)(void *arg);
    void *arg;
    struct conf_cleanup *next;
};

void conf_cleanup_add(struct conf *c, void (*fn)(void *arg), void *arg)
{
    struct conf_cleanup *cl = xmalloc(sizeof *cl);
    cl->fn = fn;
    cl->arg = arg;
    cl->next = c->cleanups;
    c->cleanups = cl;
}

/* What a route (or a plan's route) owns. */
static void route_free(struct conf_route *r)
{
    for (int j = 0; j < r->nmethods; j++)
        free(r->methods[j]);
    free(r->methods);
    for (int j = 0; j < r->nupgrade_protos; j++)
        free(r->upgrade_protos[j]);
    free(r->upgrade_protos);
    for (int j = 0; j < r->nlimits; j++) {
        for (int k = 0; k < r->limits[j].nkeys; k++)
            free(r->limits[j].keys[k].arg);
        free(r->limits[j].keys);
        free(r->limits[j].name);
        free(r->limits[j].cost_header);
        free(r->limits[j].cost_name);
        free(r->limits[j].estimate_json);
        tzcal_free(r->limits[j].tz);
        free(r->limits[j].message);
        for (int k = 0; k < r->limits[j].noverrides; k++) {
            struct conf_override *o = &r->limits[j].overrides[k];
            for (int p = 0; p < o->nparts; p++)
                free(o->parts[p]);
            free(o->parts);
            free(o->partlen);
            free(o->key);
        }
        free(r->limits[j].overrides);
    }
    free(r->limits);
    free(r->policy);
    free(r->name);
    free(r->path);
    free(r->host);
    regex_free(r->regex);
    free(r->path_regex);
    free(r->allow);
    if (r->plan_key)
        free(r->plan_key->arg);
    free(r->plan_key);
    if (r->plan_from)
        free(r->plan_from->arg);
    free(r->plan_from);
}

static void conf_free(struct conf *c)
{
    while (c->cleanups) {
        struct conf_cleanup *cl = c->cleanups;
        c->cleanups = cl->next;
        cl->fn(cl->arg);
        free(cl);
    }
    free(c->file);
    free(c->listen.text);
    conf_listens_free(c);
    conf_rls_free(c->decision.rls);
    free(c->decision.path_prefix);
    free(c->decision.ratelimit_config);
    conf_redis_free_target(&c->redis);
    free(c->redis.prefix);
    for (int i = 0; i < c->redis.ncluster; i++)
        free(c->redis.cluster[i]);
    free(c->redis.cluster);
    for (int i = 0; i < c->redis.nsentinel_nodes; i++)
        free(c->redis.sentinel_nodes[i]);
    free(c->redis.sentinel_nodes);
    free(c->redis.sentinel_master);
    free(c->redis.sentinel_password);
    conf_redis_free_tls(&c->redis.tls_conf);
    for (int i = 0; i < c->nupstreams; i++) {
        struct conf_upstream *u = &c->upstreams[i];
        for (int j = 0; j < u->nservers; j++)
            free(u->servers[j].text);
        free(u->servers);
        free(u->name);
        if (u->tls) {
            conf_redis_free_tls(u->tls);     /* the same fields */
            free(u->tls);
        }
    }
    free(c->upstreams);
    for (int i = 0; i < c->nroutes; i++)
        route_free(&c->routes[i]);
    free(c->routes);
    for (int i = 0; i < c->nplans; i++) {
        route_free(&c->plans[i].route);
        free(c->plans[i].name);
    }
    free(c->plans);
    for (int i = 0; i < c->nplan_assign; i++)
        free(c->plan_assign[i].key);
    free(c->plan_assign);
    free(c->trusted);
    free(c->allow);
    free(c->admin_listen.text);
    free(c->admin_token);
    for (int i = 0; i < c->nadmin_hosts; i++)
        free(c->admin_hosts[i]);
    free(c->admin_hosts);
    free(c->access_log);
    conf_jwt_free(&c->jwt);
    free(c);
}

/* The whole file, bounded in size; NULL with x->err set. */
static char *read_file(struct ctx *x, size_t *len)
{
    FILE *f = fopen(x->file, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    const char *why;
    if (!f) {
        why = strerror(errno);
        goto fail;
    }
    do {
        if (n == cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > CONF_MAX_FILE_BYTES + 1)
                cap = CONF_MAX_FILE_BYTES + 1;
            buf = realloc(buf, cap);
            if (!buf)
                abort();
        }
        n += fread(buf + n, 1, cap - n, f);
    } while (n == cap && n <= CONF_MAX_FILE_BYTES && !ferror(f));
    if (ferror(f)) {
        why = strerror(errno);
        goto fail;
    }
    if (n > CONF_MAX_FILE_BYTES) {
        why = "larger than 4 MiB";
        goto fail;
    }
    fclose(f);
    *len = n;
    return buf;
fail:
    if (f)
        fclose(f);
    free(buf);
    if (asprintf(&x->err, "%s: cannot read: %s", x->file, why) < 0)
        abort();
    return NULL;
}

struct conf *conf_load(const char *file, char **err)
{
    struct ctx x;
    struct node *root = NULL;
    char *buf;

    memset(&x, 0, sizeof x);
    x.file = file;
    if (err)
        *err = NULL;
    buf = read_file(&x, &x.len);
    if (buf) {
        x.buf = buf;
        x.c = conf_new(file);
        root = tree_load(&x);
        if (root)
            conf_from_tree(&x, root);
        node_free(root);
        free(buf);
    }
    if (x.err) {
        if (x.c)
            conf_free(x.c);
        if (err)
            *err = x.err;
        else
            free(x.err);
        return NULL;
    }
    return x.c;
}

void conf_retain(struct conf *c)
{
    __atomic_fetch_add(&c->refs, 1, __ATOMIC_RELAXED);
}

void conf_release(struct conf *c)
{
    if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        conf_free(c);
}
