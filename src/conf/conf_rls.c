/* sluice - conf_rls.c: decision.ratelimit_config, Envoy's rate limit
 * service descriptors in envoyproxy/ratelimit's own format, so that its
 * users point sluice at the files they have:
 *
 *   domain: NAME
 *   descriptors:
 *     - key: K                     value: V | V* (optional; '*' a wildcard)
 *       rate_limit: {unit, requests_per_unit, unlimited, name, replaces: [{name}]}
 *       shadow_mode, detailed_metric, share_threshold, quota_mode (false only),
 *       value_to_metric, metadata (accepted, no effect)
 *       algorithm, burst, window   (sluice's own: any rate-limit algorithm)
 *       algorithm: concurrency, limit, lease   (slots held per call, rls.c)
 *       descriptors: [...]         (nested)
 *
 * It checks what the reference's loader checks (src/config/config_impl.go:
 * empty domain or key, duplicate domain or composite key, a bad unit, a unit
 * with unlimited, replaces naming nothing or itself, share_threshold without
 * a wildcard), each error at FILE:LINE:COL. conf_load.c reads the files
 * (one or a directory's *.yaml, *.yml) and gives each tree to
 * conf_rls_file(); the matching is rls_match.c's. */
#include "conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conf_int.h"

#define RLS_MAX_KIDS 100000     /* descriptors of one level */
#define RLS_DEFAULT_LEASE_MS 60000      /* a concurrency slot's, unless lease */

/* What a descriptor's keys gave, checked across keys after the walk. */
struct desc_src {
    struct conf_rls_node *n;
    struct node *key, *value, *rate_limit, *descriptors, *share, *algorithm, *burst, *window;
    struct node *limit, *lease;         /* concurrency */
    int shadow, detailed, share_threshold;
};

struct limit_src {
    struct node *unit, *rpu, *unlimited, *name, *replaces;
};

static int h_stash(struct node **slot, struct node *v)
{
    *slot = v;
    return 0;
}

#define STASH(fn, type, field) \
    static int fn(struct ctx *x, struct node *k, struct node *v, void *obj) \
    { return h_stash(&((type *)obj)->field, v); }

STASH(h_d_key, struct desc_src, key)
STASH(h_d_value, struct desc_src, value)
STASH(h_d_rate_limit, struct desc_src, rate_limit)
STASH(h_d_descriptors, struct desc_src, descriptors)
STASH(h_d_algorithm, struct desc_src, algorithm)
STASH(h_d_burst, struct desc_src, burst)
STASH(h_d_window, struct desc_src, window)
STASH(h_d_limit, struct desc_src, limit)
STASH(h_d_lease, struct desc_src, lease)
STASH(h_l_unit, struct limit_src, unit)
STASH(h_l_rpu, struct limit_src, rpu)
STASH(h_l_unlimited, struct limit_src, unlimited)
STASH(h_l_name, struct limit_src, name)
STASH(h_l_replaces, struct limit_src, replaces)

static int h_d_shadow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct desc_src *)obj)->shadow);
}

static int h_d_detailed(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct desc_src *)obj)->detailed);
}

static int h_d_share(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct desc_src *)obj)->share = v;
    return conf_get_bool(x, v, &((struct desc_src *)obj)->share_threshold);
}

/* quota_mode changes what OVER_LIMIT means (all quota descriptors over);
 * sluice does not have it, so only false is taken. */
static int h_d_quota(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int on = 0;
    if (conf_get_bool(x, v, &on) < 0)
        return -1;
    return on ? conf_fail(x, v, "quota_mode is not supported by sluice") : 0;
}

/* value_to_metric and metadata name the reference's stats and dynamic
 * metadata, which sluice does not send: taken, no effect. */
static int h_ignored(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return 0;
}

static int h_d_value_to_metric(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int on;
    return conf_get_bool(x, v, &on);
}

static const struct key_def desc_keys[] = {
    { "key", h_d_key, 1 },
    { "value", h_d_value, 0 },
    { "rate_limit", h_d_rate_limit, 0 },
    { "descriptors", h_d_descriptors, 0 },
    { "shadow_mode", h_d_shadow, 0 },
    { "quota_mode", h_d_quota, 0 },
    { "detailed_metric", h_d_detailed, 0 },
    { "value_to_metric", h_d_value_to_metric, 0 },
    { "share_threshold", h_d_share, 0 },
    { "metadata", h_ignored, 0 },
    { "algorithm", h_d_algorithm, 0 },
    { "burst", h_d_burst, 0 },
    { "window", h_d_window, 0 },
    { "limit", h_d_limit, 0 },
    { "lease", h_d_lease, 0 },
    { NULL, NULL, 0 },
};

static const struct key_def limit_keys[] = {
    { "unit", h_l_unit, 0 },
    { "requests_per_unit", h_l_rpu, 0 },
    { "unlimited", h_l_unlimited, 0 },
    { "name", h_l_name, 0 },
    { "replaces", h_l_replaces, 0 },
    { NULL, NULL, 0 },
};

static const struct { const char *name; int unit; int64_t seconds; } units[] = {
    { "SECOND", CONF_RLS_SECOND, 1 }, { "MINUTE", CONF_RLS_MINUTE, 60 },
    { "HOUR", CONF_RLS_HOUR, 3600 }, { "DAY", CONF_RLS_DAY, 86400 },
    { "WEEK", CONF_RLS_WEEK, 7 * 86400 }, { "MONTH", CONF_RLS_MONTH, 30 * 86400 },
    { "YEAR", CONF_RLS_YEAR, 365 * 86400 },
};

int64_t conf_rls_unit_seconds(int unit)
{
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (units[i].unit == unit)
            return units[i].seconds;
    return 0;
}

/* replaces: a list of {name: N}, none empty nor the limit's own name. */
static int limit_replaces(struct ctx *x, struct node *v, struct conf_rls_limit *l)
{
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    l->replaces = xcalloc((size_t)v->nkids, sizeof *l->replaces);
    for (int i = 0; i < v->nkids; i++) {
        struct node *e = v->kids[i], *name = NULL;
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = conf_expect(x, e, NODE_MAP);
        for (int j = 0; rc == 0 && j + 1 < e->nkids; j += 2) {
            if (strcmp(e->kids[j]->str, "name") != 0)
                rc = conf_fail(x, e->kids[j], "unknown key '%s' (a replaces entry has only name)",
                               e->kids[j]->str);
            else
                name = e->kids[j + 1];
        }
        const char *s = rc == 0 && name ? conf_scalar(x, name) : NULL;
        if (s != NULL && *s == '\0')
            s = NULL;
        if (rc == 0 && s == NULL && !x->err)
            conf_fail(x, name ? name : e, "should not have an empty replaces entry");
        if (s != NULL && l->name && strcmp(s, l->name) == 0)
            rc = conf_fail(x, name, "replaces should not contain name of same descriptor");
        conf_path_pop(x, old);
        if (rc < 0 || s == NULL)
            return -1;
        l->replaces[l->nreplaces++] = xstrdup(s);
    }
    return 0;
}

static int algo_named(const char *s, enum limiter_algo *out)
{
    static const enum limiter_algo algos[] = { LIMITER_FIXED_WINDOW, LIMITER_SLIDING_WINDOW,
                                               LIMITER_SLIDING_LOG, LIMITER_TOKEN_BUCKET,
                                               LIMITER_GCRA, LIMITER_CONCURRENCY };
    for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++)
        if (strcmp(s, limiter_algo_name(algos[i])) == 0) {
            *out = algos[i];
            return 0;
        }
    return -1;
}

/* concurrency: limit slots per key, each held at most lease (default 60s)
 * unless released first (docs/rls.md). */
static int concurrency_params(struct ctx *x, struct desc_src *d, struct limiter_params *p)
{
    struct node *extra = d->window ? d->window : d->burst;
    if (extra)
        return conf_fail(x, extra, "'%s' does not apply to concurrency (use limit and lease)",
                         extra == d->window ? "window" : "burst");
    if (!d->limit)
        return conf_fail(x, d->algorithm, "concurrency needs limit (the slots per key)");
    if (conf_get_int(x, d->limit, 1, CONF_MAX_COUNT, &p->limit) < 0)
        return -1;
    p->window_ms = RLS_DEFAULT_LEASE_MS;
    p->interval_us = 0;
    if (d->lease && conf_get_duration(x, d->lease, &p->window_ms) < 0)
        return -1;
    if (p->window_ms < 1 || p->window_ms > CONF_MAX_DURATION_MS)
        return conf_fail(x, d->lease, "lease must be 1ms to 3650d");
    return 0;
}

/* 1 when the descriptor says algorithm: concurrency (its rate_limit then
 * has no unit nor requests_per_unit). */
static int desc_concurrent(struct ctx *x, const struct desc_src *d)
{
    const char *s = d->algorithm ? conf_scalar(x, d->algorithm) : NULL;
    return s && strcmp(s, limiter_algo_name(LIMITER_CONCURRENCY)) == 0;
}

/* The limiter's parameters: requests_per_unit per unit (or per window) with
 * the algorithm, fixed_window by default, its windows counted from the epoch
 * as the reference counts them. */
static int limit_params(struct ctx *x, struct desc_src *d, struct conf_rls_limit *l)
{
    struct limiter_params *p = &l->params;
    char sb[SHOW_BUF];
    int64_t period_ms = conf_rls_unit_seconds(l->unit) * 1000;
    p->algo = LIMITER_FIXED_WINDOW;
    p->tz = NULL;
    p->cal = TZCAL_NONE;
    if (d->algorithm) {
        const char *s = conf_scalar(x, d->algorithm);
        if (s == NULL)
            return -1;
        if (algo_named(s, &p->algo) < 0)
            return conf_fail(x, d->algorithm, "unknown algorithm '%s' (use fixed_window, "
                             "sliding_window, sliding_log, token_bucket, gcra or concurrency)",
                             conf_show(s, sb));
    }
    if (p->algo == LIMITER_CONCURRENCY)
        return concurrency_params(x, d, p);
    if (d->limit || d->lease)
        return conf_fail(x, d->limit ? d->limit : d->lease, "'%s' applies to algorithm: "
                         "concurrency only", d->limit ? "limit" : "lease");
    int bucket = p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA;
    if (d->window && bucket)
        return conf_fail(x, d->window, "'window' does not apply to %s (use burst)",
                         limiter_algo_name(p->algo));
    if (d->burst && !bucket)
        return conf_fail(x, d->burst, "'burst' does not apply to %s (use window)",
                         limiter_algo_name(p->algo));
    if (d->window && conf_get_duration(x, d->window, &period_ms) < 0)
        return -1;
    if (period_ms < 1 || period_ms > CONF_MAX_DURATION_MS)
        return conf_fail(x, d->window, "window must be 1ms to 3650d");
    if (!bucket) {
        p->limit = l->requests_per_unit;
        p->window_ms = period_ms;
        return 0;
    }
    if (l->requests_per_unit < 1)
        return conf_fail(x, d->rate_limit, "%s needs requests_per_unit of at least 1",
                         limiter_algo_name(p->algo));
    p->limit = l->requests_per_unit;
    if (d->burst && conf_get_int(x, d->burst, 1, CONF_MAX_COUNT, &p->limit) < 0)
        return -1;
    p->interval_us = conf_rate_interval_us(l->requests_per_unit, period_ms);
    if (conf_bucket_window(p) < 0)
        return conf_fail(x, d->burst, "rate and burst give a refill time beyond 3650d");
    return 0;
}

static int desc_limit(struct ctx *x, struct desc_src *d)
{
    struct limit_src ls;
    char sb[SHOW_BUF];
    memset(&ls, 0, sizeof ls);
    size_t old = conf_path_push_key(x, "rate_limit");
    int rc = conf_walk_map(x, d->rate_limit, limit_keys, &ls);
    struct conf_rls_limit *l = d->n->limit = xcalloc(1, sizeof *l);
    l->shadow = d->shadow;
    l->detailed_metric = d->detailed;
    if (rc == 0 && ls.unlimited) {
        size_t o2 = conf_path_push_key(x, "unlimited");
        rc = conf_get_bool(x, ls.unlimited, &l->unlimited);
        conf_path_pop(x, o2);
    }
    if (rc == 0 && ls.rpu) {
        size_t o2 = conf_path_push_key(x, "requests_per_unit");
        rc = conf_get_int(x, ls.rpu, 0, CONF_MAX_COUNT, &l->requests_per_unit);
        conf_path_pop(x, o2);
    }
    if (rc == 0 && ls.name) {
        const char *s = conf_scalar(x, ls.name);
        if (s == NULL)
            rc = -1;
        else if (*s)
            l->name = xstrdup(s);
    }
    const char *u = "";
    if (rc == 0 && ls.unit && (u = conf_scalar(x, ls.unit)) == NULL)
        rc = -1;
    for (size_t i = 0; rc == 0 && i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(u, units[i].name) == 0)
            l->unit = units[i].unit;
    int conc = rc == 0 && desc_concurrent(x, d);
    if (rc == 0 && conc && (ls.unit || ls.rpu || l->unlimited))
        rc = conf_fail(x, ls.unit ? ls.unit : ls.rpu ? ls.rpu : ls.unlimited, "a concurrency "
                       "rate_limit has no unit, requests_per_unit nor unlimited (use limit "
                       "and lease beside it)");
    else if (rc == 0 && l->unlimited && l->unit)
        rc = conf_fail(x, ls.unit, "should not specify rate limit unit when unlimited");
    else if (rc == 0 && !l->unlimited && !l->unit && !conc)
        rc = conf_fail(x, ls.unit ? ls.unit : d->rate_limit, "invalid rate limit unit '%s' (use "
                       "second, minute, hour, day, week, month or year)", conf_show(u, sb));
    if (rc == 0 && ls.replaces) {
        size_t o2 = conf_path_push_key(x, "replaces");
        rc = limit_replaces(x, ls.replaces, l);
        conf_path_pop(x, o2);
    }
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    if (l->unlimited) {
        struct node *extra = d->algorithm ? d->algorithm : d->burst ? d->burst : d->window;
        if (extra)
            return conf_fail(x, extra, "an unlimited descriptor takes no algorithm, burst or window");
        return 0;
    }
    return limit_params(x, d, l);
}

static int level_load(struct ctx *x, struct node *seq, struct conf_rls_node *parent,
                      const char *path);

/* Kids of one level in key, value order (no value first), ties by file order. */
static int kid_cmp(const void *a, const void *b)
{
    const struct conf_rls_node *p = a, *q = b;
    int c = strcmp(p->key, q->key);
    if (c)
        return c;
    if (!p->value || !q->value)
        return !q->value - !p->value;
    return strcmp(p->value, q->value);
}

static int desc_load(struct ctx *x, struct node *m, struct conf_rls_node *n, const char *parent)
{
    struct desc_src d;
    char sb[SHOW_BUF];
    memset(&d, 0, sizeof d);
    d.n = n;
    if (conf_walk_map(x, m, desc_keys, &d) < 0)
        return -1;
    const char *key = conf_scalar(x, d.key);
    if (key == NULL)
        return -1;
    if (*key == '\0')
        return conf_fail(x, d.key, "descriptor has empty key");
    n->key = xstrdup(key);
    const char *value = d.value ? conf_scalar(x, d.value) : "";
    if (value == NULL)
        return -1;
    if (*value)
        n->value = xstrdup(value);
    if (n->value && strchr(n->value, '*')) {
        n->nparts = 1;
        for (const char *p = n->value; *p; p++)
            n->nparts += *p == '*';
        n->parts = xcalloc((size_t)n->nparts, sizeof *n->parts);
        const char *s = n->value;
        for (int i = 0; i < n->nparts; i++) {
            const char *e = strchr(s, '*');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            n->parts[i] = xstrndup(s, len);
            s += len + 1;
        }
    }
    if (d.share_threshold && !n->parts)
        return conf_fail(x, d.share, "share_threshold can only be used with wildcard values "
                         "(containing '*'), but found key '%s%s%s'", conf_show(key, sb),
                         n->value ? "_" : "", n->value ? n->value : "");
    n->share_threshold = d.share_threshold;
    char *path = NULL;
    if (asprintf(&path, "%s%s%s%s%s", parent, *parent ? "." : "", key, n->value ? "_" : "",
                 n->value ? n->value : "") < 0)
        abort();
    int rc = 0;
    if (!d.rate_limit && (d.algorithm || d.burst || d.window || d.limit || d.lease))
        rc = conf_fail(x, d.algorithm ? d.algorithm : d.burst ? d.burst : d.window ? d.window :
                       d.limit ? d.limit : d.lease,
                       "algorithm, burst, window, limit and lease need a rate_limit");
    if (rc == 0 && d.rate_limit && desc_limit(x, &d) < 0)
        rc = -1;
    if (n->limit) {
        n->limit->path = path;
        path = n->limit->path;
    }
    if (rc == 0 && d.descriptors) {
        size_t old = conf_path_push_key(x, "descriptors");
        rc = level_load(x, d.descriptors, n, path);
        conf_path_pop(x, old);
    }
    if (n->limit == NULL)
        free(path);
    return rc;
}

/* Wildcard kids (indexes into the sorted kids) in file order. */
static int order_cmp(const void *a, const void *b, void *kids)
{
    const struct conf_rls_node *k = kids;
    return k[*(const int *)a].order - k[*(const int *)b].order;
}

/* One level of descriptors into parent's kids, sorted for the lookup, a
 * composite key (key, or key and value) given twice refused. */
static int level_load(struct ctx *x, struct node *seq, struct conf_rls_node *parent,
                      const char *path)
{
    if (seq->kind == NODE_NULL)
        return 0;
    if (conf_expect(x, seq, NODE_SEQ) < 0)
        return -1;
    if (seq->nkids > RLS_MAX_KIDS)
        return conf_fail(x, seq, "at most %d descriptors per level", RLS_MAX_KIDS);
    int n = seq->nkids;
    struct conf_rls_node *kids = xcalloc((size_t)n, sizeof *kids);
    parent->kids = kids;
    for (int i = 0; i < n; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = conf_expect(x, seq->kids[i], NODE_MAP);
        if (rc == 0)
            rc = desc_load(x, seq->kids[i], &kids[i], path);
        conf_path_pop(x, old);
        parent->nkids = i + 1;
        if (rc < 0)
            return -1;
        kids[i].order = i;
    }
    /* duplicates: the same composite key twice, blamed where it comes again */
    struct conf_rls_node *sorted = xcalloc((size_t)n, sizeof *sorted);
    memcpy(sorted, kids, (size_t)n * sizeof *kids);
    qsort(sorted, (size_t)n, sizeof *sorted, kid_cmp);
    for (int i = 1; i < n; i++) {
        if (kid_cmp(&sorted[i - 1], &sorted[i]) != 0)
            continue;
        int later = sorted[i].order > sorted[i - 1].order ? sorted[i].order : sorted[i - 1].order;
        char sb[SHOW_BUF];
        free(sorted);
        size_t old = conf_path_push(x, "[%d]", later);
        conf_fail(x, seq->kids[later], "duplicate descriptor composite key '%s%s%s'",
                  conf_show(kids[later].key, sb), kids[later].value ? "_" : "",
                  kids[later].value ? kids[later].value : "");
        conf_path_pop(x, old);
        return -1;
    }
    /* kid_cmp keeps equal keys apart, so sorted is the order; the wildcard
     * kids are tried in file order */
    free(kids);
    parent->kids = sorted;
    int *wild = xcalloc((size_t)n, sizeof *wild);
    int nwild = 0;
    for (int i = 0; i < n; i++)
        if (sorted[i].parts)
            wild[nwild++] = i;
    qsort_r(wild, (size_t)nwild, sizeof *wild, order_cmp, sorted);
    parent->wild = wild;
    parent->nwild = nwild;
    return 0;
}

/* One file of decision.ratelimit_config: its domain and descriptors join
 * rls; a domain already loaded (from another file) is an error. */
int conf_rls_file(struct ctx *x, struct node *root, struct conf_rls *rls)
{
    if (root->kind != NODE_MAP)
        return conf_fail_bare(x, root, "top level: expected a mapping with domain and "
                              "descriptors, got %s", conf_kind_name(root->kind));
    struct node *dom = NULL, *descs = NULL;
    for (int i = 0; i + 1 < root->nkids; i += 2) {
        const char *k = root->kids[i]->str;
        if (!strcmp(k, "domain"))
            dom = root->kids[i + 1];
        else if (!strcmp(k, "descriptors"))
            descs = root->kids[i + 1];
        else
            return conf_fail_bare(x, root->kids[i], "unknown key '%s' in top level (use domain "
                                  "and descriptors)", k);
    }
    const char *name = dom ? conf_scalar(x, dom) : "";
    if (name == NULL)
        return -1;
    if (*name == '\0')
        return conf_fail_bare(x, dom ? dom : root, "config file cannot have empty domain");
    for (int i = 0; i < rls->ndomains; i++)
        if (!strcmp(rls->domains[i].name, name)) {
            char sb[SHOW_BUF];
            return conf_fail_bare(x, dom, "duplicate domain '%s' in config file",
                                  conf_show(name, sb));
        }
    rls->domains = realloc(rls->domains, (size_t)(rls->ndomains + 1) * sizeof *rls->domains);
    if (rls->domains == NULL)
        abort();
    struct conf_rls_domain *d = &rls->domains[rls->ndomains++];
    memset(d, 0, sizeof *d);
    d->name = xstrdup(name);
    if (descs == NULL)
        return 0;
    size_t old = conf_path_push(x, "descriptors");
    int rc = level_load(x, descs, &d->root, "");
    conf_path_pop(x, old);
    return rc;
}

static int domain_cmp(const void *a, const void *b)
{
    return strcmp(((const struct conf_rls_domain *)a)->name,
                  ((const struct conf_rls_domain *)b)->name);
}

/* Every file is in: the domains sorted for the lookup. */
void conf_rls_done(struct conf_rls *rls)
{
    if (rls->ndomains > 1)
        qsort(rls->domains, (size_t)rls->ndomains, sizeof *rls->domains, domain_cmp);
}

static void node_free(struct conf_rls_node *n)
{
    for (int i = 0; i < n->nkids; i++)
        node_free(&n->kids[i]);
    free(n->kids);
    free(n->wild);
    free(n->key);
    free(n->value);
    for (int i = 0; i < n->nparts; i++)
        free(n->parts[i]);
    free(n->parts);
    if (n->limit) {
        free(n->limit->name);
        free(n->limit->path);
        for (int i = 0; i < n->limit->nreplaces; i++)
            free(n->limit->replaces[i]);
        free(n->limit->replaces);
        free(n->limit);
    }
}

void conf_rls_free(struct conf_rls *rls)
{
    if (rls == NULL)
        return;
    for (int i = 0; i < rls->ndomains; i++) {
        free(rls->domains[i].name);
        node_free(&rls->domains[i].root);
    }
    free(rls->domains);
    free(rls);
}
