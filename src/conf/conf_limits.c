/* sluice - conf_limits.c: the config sections about requests: routes (match
 * by path, path_regex, methods and host; upstream, cost, headers, upgrade),
 * their limits (algorithm, rate or window, keys, on_missing_key, shadow,
 * count_status, overrides, lease, delay), allow lists (trusted_proxies,
 * allow, a route's allow) and paths. What routes share across keys is
 * checked in conf_load.c. */
#include "conf.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "conf_int.h"
#include "jsonscan.h"
#include "esc.h"
#include "regex.h"

/* ---- the RateLimit-Policy value */

char *conf_route_policy(const struct conf_route *r, const int64_t *q, const int64_t *w_ms,
                        size_t *len)
{
    size_t cap = 1, n = 0;

    for (int i = 0; i < r->nlimits; i++)
        cap += ESC_MAX(strlen(r->limits[i].name)) + 96;
    char *out = xcalloc(1, cap);
    for (int i = 0; i < r->nlimits; i++) {
        const struct conf_limit *l = &r->limits[i];
        int64_t quota = q ? q[i] : l->params.limit, w = w_ms ? w_ms[i] : l->params.window_ms;
        if (i)
            n += (size_t)snprintf(out + n, cap - n, ", ");
        out[n++] = '"';
        n = (size_t)(esc_put(out + n, l->name, strlen(l->name), ESC_QUOTED) - out);
        out[n++] = '"';
        n += (size_t)snprintf(out + n, cap - n, ";q=%lld", (long long)quota);
        if (l->params.algo == LIMITER_CONCURRENCY)     /* draft-10's quota unit */
            n += (size_t)snprintf(out + n, cap - n, ";qu=\"concurrent-requests\"");
        else                    /* whole seconds, rounded up (reply_seconds) */
            n += (size_t)snprintf(out + n, cap - n, ";w=%lld",
                                  (long long)(w > 0 ? (w + 999) / 1000 : 0));
    }
    *len = n;
    return out;
}

/* ---- allow lists: trusted_proxies, allow */

/* A sequence of CIDRs (trusted_proxies, allow) into a fresh array. */
static int get_cidrs(struct ctx *x, struct node *v, struct addr_cidr **out, int *n)
{
    char sb[SHOW_BUF];
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    *out = xcalloc((size_t)v->nkids, sizeof **out);
    *n = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        const char *s = conf_scalar(x, v->kids[i]);
        int rc = s ? addr_cidr_parse(s, &(*out)[i]) : -1;
        if (s && rc < 0)
            conf_fail(x, v->kids[i], "bad CIDR '%s' (use e.g. 10.0.0.0/8, 192.0.2.7, fd00::/8)",
                      conf_show(s, sb));
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int conf_h_trusted(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    return get_cidrs(x, v, &c->trusted, &c->ntrusted);
}

int conf_h_allow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    return get_cidrs(x, v, &c->allow, &c->nallow);
}

/* ---- routes: match */

/* Route match path: starts with '/', '//' merged, no trailing '/'. */
static int h_match_path(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    char *out, *o;
    if (!s)
        return -1;
    if (s[0] != '/')
        return conf_fail(x, v, "path '%s' must start with '/'", conf_show(s, sb));
    /* Requests are matched decoded, so an escape here could never match. */
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || strchr("?#%", *p))
            return conf_fail(x, v, "path '%s' has a space, control byte, '?', '#' or '%%' "
                             "(write it decoded)", conf_show(s, sb));
    out = o = xmalloc(strlen(s) + 1);
    for (const char *p = s; *p; p++)
        if (!(*p == '/' && o > out && o[-1] == '/'))
            *o++ = *p;
    if (o - out > 1 && o[-1] == '/')
        o--;
    *o = '\0';
    for (const char *p = out; (p = strchr(p, '/')) != NULL; p++) {
        size_t seg = strcspn(p + 1, "/");
        if ((seg == 1 && p[1] == '.') || (seg == 2 && p[1] == '.' && p[2] == '.')) {
            free(out);
            return conf_fail(x, v, "path '%s' has a '.' or '..' segment", conf_show(s, sb));
        }
    }
    free(r->path);
    r->path = out;
    r->pathlen = (size_t)(o - out);
    return 0;
}

static int h_match_methods(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one method (leave methods out to match any)");
    r->methods = xcalloc((size_t)v->nkids, sizeof *r->methods);
    r->nmethods = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        const char *s = conf_scalar(x, v->kids[i]);
        int ok = s && conf_is_token(s) && strlen(s) <= 32;
        if (s && !ok)
            conf_fail(x, v->kids[i], "bad method '%s'", conf_show(s, sb));
        conf_path_pop(x, old);
        if (!ok)
            return -1;
        r->methods[i] = xstrdup(s);
        for (char *p = r->methods[i]; *p; p++)
            *p = (char)toupper((unsigned char)*p);
    }
    return 0;
}

/* Host: name or [v6], lower-cased, an optional :port dropped. */
static int h_match_host(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v), *end, *port = NULL;
    int portnum;
    if (!s)
        return -1;
    if (s[0] == '[') {
        end = strchr(s, ']');
        if (!end || end == s + 1 || strspn(s + 1, "0123456789abcdefABCDEF:.") != (size_t)(end - s - 1))
            goto bad;
        end++;
    } else {
        end = s + strcspn(s, ":");
        if (!conf_host_chars_ok(s, (size_t)(end - s)))
            goto bad;
    }
    if (*end == ':')
        port = end + 1;
    else if (*end)
        goto bad;
    if (port && addr_port(port, strlen(port), &portnum) < 0)
        goto bad;
    free(r->host);
    r->host = xstrndup(s, (size_t)(end - s));
    for (char *p = r->host; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
bad:
    return conf_fail(x, v,
                     "bad host '%s' (use e.g. api.example.com or [::1], optionally with :port)",
                     conf_show(s, sb));
}

/* How large a pattern may expand, roughly: a compiler copies the atom of a
 * bound {m,n} max(m,n) times (glibc's regcomp also '+' once more, "aa*"; PCRE2
 * groups under a bound), so a{1,32767}, nested bounds or stacked quantifiers
 * ("a++++", each doubling in regcomp) took seconds and gigabytes there, and
 * make large compiled code and JIT code here. Each atom weighs 1, but an
 * anchor or an empty group 4 (empty matches were regcomp's slow part:
 * "(^){245}" took 0.6 s), a group the sum of its contents, a bound
 * multiplies the atom before it; saturates at limit+1. REGEX_TOO_DEEP when
 * groups nest deeper than CONF_MAX_CAPTURES (most groups capture, so such a
 * pattern is refused anyway); REGEX_STACKED when a quantifier follows a
 * quantifier (a**, a+{2}: POSIX leaves them undefined, PCRE2 refuses or
 * reads them differently) other than the one '?' (lazy) or '+' (possessive)
 * that may follow a quantifier; REGEX_OPEN_BOUND for {,n}, which glibc read
 * as {0,n} and PCRE2 before 10.43 as the text "{,n}". */
#define REGEX_TOO_DEEP  (-1)
#define REGEX_STACKED   (-2)
#define REGEX_OPEN_BOUND (-3)
#define REGEX_EMPTY_WEIGHT 4

/* The end of the bound {m}, {m,}, {m,n} or glibc's {,n} at p, with its
 * largest count in *count; NULL when p is a literal '{'. */
static const char *regex_bound(const char *p, int64_t *count)
{
    const char *q = p + 1;
    int64_t m = 0, n = 0;
    if (isdigit((unsigned char)*q) && !(q = conf_parse_digits(q, &m)))
        return NULL;                    /* overflow: PCRE2 refuses it */
    if (*q == ',' && isdigit((unsigned char)q[1]) && !(q = conf_parse_digits(q + 1, &n)))
        return NULL;
    else if (*q == ',')
        q++;
    if (*q != '}' || q == p + 1)
        return NULL;
    *count = m > n ? m : n;
    return q;
}

/* The closing ']' of the bracket expression at p, or the last byte. */
static const char *regex_bracket_end(const char *p)
{
    const char *q = p + 1 + (p[1] == '^');
    if (*q == ']')
        q++;
    while (*q && *q != ']') {
        if (*q == '[' && (q[1] == ':' || q[1] == '.' || q[1] == '=')) {
            const char *e = strchr(q + 2, q[1]);
            q = e && e[1] == ']' ? e + 2 : q + 1;
        } else {
            q++;
        }
    }
    return *q ? q : q - 1;
}

static int64_t regex_weight(const char *re, int64_t limit)
{
    int64_t sum[CONF_MAX_CAPTURES + 1], last[CONF_MAX_CAPTURES + 1], count;
    int d = 0, quantified = 0;
    sum[0] = last[0] = 0;
    for (const char *p = re; *p; p++) {
        int64_t atom = 1, extra;
        const char *bound = NULL;
        if (*p == '{')
            bound = regex_bound(p, &count);
        if ((*p == '*' || *p == '+' || *p == '?' || bound) && last[d] > 0) {
            if (quantified == 1 && (*p == '?' || *p == '+')) {
                quantified = 2;         /* lazy a*?, possessive a*+: no copies */
                continue;
            }
            if (quantified)
                return REGEX_STACKED;
            if (*p == '{' && p[1] == ',')
                return REGEX_OPEN_BOUND;
            quantified = 1;
            extra = *p == '+' ? 1 : *p == '{' ? (count > 1 ? count - 1 : 0) : 0;
            if (extra > limit)
                return limit + 1;
            sum[d] += last[d] * extra;
            last[d] *= extra + 1;
            if (sum[d] > limit)
                return limit + 1;
            if (bound)
                p = bound;
            continue;
        }
        quantified = 0;
        switch (*p) {
        case '\\':
            if (p[1])
                p++;
            break;
        case '[':
            p = regex_bracket_end(p);
            break;
        case '(':
            if (d == CONF_MAX_CAPTURES)
                return REGEX_TOO_DEEP;
            sum[++d] = 0;
            last[d] = 0;
            continue;
        case ')':
            if (d == 0)
                break;                  /* PCRE2 reports it */
            atom = sum[d] ? sum[d] : REGEX_EMPTY_WEIGHT;
            d--;
            break;
        case '^': case '$':
            atom = REGEX_EMPTY_WEIGHT;
            break;
        case '|':
            last[d] = 0;
            continue;
        default:
            break;
        }
        last[d] = atom;
        sum[d] += atom;
        if (sum[d] > limit)
            return limit + 1;
    }
    for (; d > 0; d--)                  /* unclosed groups: weighed, then refused */
        sum[d - 1] += sum[d];
    return sum[0] > limit ? limit + 1 : sum[0];
}

/* path_regex: a PCRE2 pattern against the normalised path (route.c compiles
 * and matches it). Bounded so that a config (or a fuzzer) cannot make
 * compiling slow or the compiled code large: length, expansion weight, no
 * backreferences; each match is bounded by route.c's limits. */
static int h_match_path_regex(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF], why[160];
    const char *s = conf_scalar(x, v);
    struct regex *re;
    int64_t weight;
    int ncaptures = 0;
    if (!s)
        return -1;
    if (!*s)
        return conf_fail(x, v, "empty regex");
    if (strlen(s) > CONF_MAX_REGEX)
        return conf_fail(x, v, "regex is longer than %d bytes", CONF_MAX_REGEX);
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return conf_fail(x, v, "regex '%s' has a control byte", conf_show(s, sb));
        if (*p == '\\' && isdigit((unsigned char)p[1]))
            return conf_fail(x, v, "bad regex '%s': backreferences are not supported",
                             conf_show(s, sb));
        if (*p == '\\' && (p[1] == '<' || p[1] == '>'))
            return conf_fail(x, v, "bad regex '%s': \\%c is a '%c' here, not a word boundary "
                             "(write \\b)", conf_show(s, sb), p[1], p[1]);
        if (*p == '\\' && p[1])
            p++;
    }
    weight = regex_weight(s, CONF_MAX_REGEX_WEIGHT);
    if (weight == REGEX_TOO_DEEP)
        return conf_fail(x, v, "regex '%s' has more than %d groups", conf_show(s, sb),
                         CONF_MAX_CAPTURES);
    if (weight == REGEX_STACKED)
        return conf_fail(x, v, "bad regex '%s': a quantifier follows a quantifier (as in a++ "
                         "or a*{2}; write one)", conf_show(s, sb));
    if (weight == REGEX_OPEN_BOUND)
        return conf_fail(x, v, "bad regex '%s': write {0,N}, not {,N} (PCRE2 versions read it "
                         "differently)", conf_show(s, sb));
    if (weight > CONF_MAX_REGEX_WEIGHT)
        return conf_fail(x, v, "bad regex '%s': repetition bounds expand beyond %d atoms",
                         conf_show(s, sb), CONF_MAX_REGEX_WEIGHT);
    re = regex_compile(s, &ncaptures, why, sizeof why);
    if (re == NULL)
        return conf_fail(x, v, "bad regex '%s': %s", conf_show(s, sb), why);
    if (ncaptures > CONF_MAX_CAPTURES) {
        regex_free(re);
        return conf_fail(x, v, "regex '%s' has %d groups, at most %d", conf_show(s, sb), ncaptures,
                         CONF_MAX_CAPTURES);
    }
    r->regex = re;
    r->ncaptures = ncaptures;
    r->path_regex = xstrdup(s);
    return 0;
}

static int h_match_grpc(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct conf_route *)obj)->grpc);
}

static const struct key_def match_keys[] = {
    { "path", h_match_path, 0 },
    { "path_regex", h_match_path_regex, 0 },
    { "methods", h_match_methods, 0 },
    { "host", h_match_host, 0 },
    { "grpc", h_match_grpc, 0 },
    { NULL, NULL, 0 },
};

static int h_route_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    const char *s = conf_name_scalar(x, v);
    if (!s)
        return -1;
    r->name = xstrdup(s);
    return 0;
}

/* Exactly one of path and path_regex. */
static int h_route_match(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    if (conf_walk_map(x, v, match_keys, obj) < 0)
        return -1;
    if (r->path && r->regex)
        return conf_fail_bare(x, conf_map_key(v, "path_regex"),
                              "'path' and 'path_regex' both set in "
                              "%s (use one)", conf_where(x));
    if (!r->path && !r->regex)
        return conf_fail_bare(x, v, "missing required key 'path' in %s", conf_where(x));
    return 0;
}

/* Resolved in phase 3: the upstreams may come later in the file. */
static int h_route_upstream(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_name_scalar(x, v) ? 0 : -1;
}

/* A limit's raw parameters: their meaning depends on the algorithm. */
struct limit_src {
    struct conf_limit *l;
    struct node *algorithm, *limit, *window, *rate, *burst;   /* values */
    struct node *overrides, *overrides_k;
    struct node *limit_k, *window_k, *rate_k, *burst_k;       /* their keys */
    struct node *lease, *lease_k, *delay, *delay_k;           /* concurrency; delay */
    struct node *calendar, *calendar_k, *timezone, *timezone_k;
    struct node *cost_from_k, *estimate_k;
};

static int h_limit_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    const char *s = conf_name_scalar(x, v);
    if (!s)
        return -1;
    ls->l->name = xstrdup(s);
    return 0;
}

static int h_limit_algorithm(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct limit_src *)obj)->algorithm = v;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_limit(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->limit = v, ls->limit_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_window(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->window = v, ls->window_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_rate(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->rate = v, ls->rate_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_burst(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->burst = v, ls->burst_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static const struct { const char *word; enum conf_keysrc_kind kind; int has_arg; } keysrcs[] = {
    { "ip", CONF_KEY_IP, 0 }, { "method", CONF_KEY_METHOD, 0 }, { "path", CONF_KEY_PATH, 0 },
    { "header", CONF_KEY_HEADER, 1 }, { "query", CONF_KEY_QUERY, 1 },
    { "cookie", CONF_KEY_COOKIE, 1 }, { "grpc_service", CONF_KEY_GRPC_SERVICE, 0 },
    { "grpc_method", CONF_KEY_GRPC_METHOD, 0 }, { NULL, 0, 0 },
};

/* s[0..n) as a prefix length 0..max (one to three digits), or -1. */
static int parse_prefix_bits(const char *s, size_t n, int max)
{
    int v = 0;
    if (n == 0 || n > 3)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= max ? v : -1;
}

/* "N" or "N/M" after "ip/": the prefix lengths, or -1. ip/N with N <= 32
 * is an IPv4 length (IPv6 clients keyed whole), with N > 32 an IPv6 one
 * (IPv4 clients keyed whole); ip/N/M gives both. */
static int parse_ip_prefix(const char *s, struct conf_keysrc *out)
{
    const char *slash = strchr(s, '/');
    if (slash == NULL) {
        int n = parse_prefix_bits(s, strlen(s), 128);
        out->bits4 = n <= 32 ? n : 32;
        out->bits6 = n <= 32 ? 128 : n;
        return n;
    }
    out->bits4 = parse_prefix_bits(s, (size_t)(slash - s), 32);
    out->bits6 = parse_prefix_bits(slash + 1, strlen(slash + 1), 128);
    return out->bits4 < 0 || out->bits6 < 0 ? -1 : 0;
}

/* 0, or -1 for an unknown source, -2 for a bad capture number, -3 for a
 * bad ip prefix. capture:N is checked against the route's path_regex in
 * phase 3 (match may come after limits in the file). */
static int parse_keysrc(const char *s, struct conf_keysrc *out)
{
    const char *colon = strchr(s, ':');
    size_t wl = colon ? (size_t)(colon - s) : strlen(s);
    if (!strncmp(s, "ip/", 3)) {
        out->kind = CONF_KEY_IP;
        out->net = 1;
        return parse_ip_prefix(s + 3, out) < 0 ? -3 : 0;
    }
    if (!strncmp(s, "jwt:", 4)) {       /* any claim name: "https://x/org" too */
        size_t n = strlen(s + 4);
        if (n == 0 || n > 256)
            return -1;
        for (size_t i = 4; s[i]; i++)
            if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
                return -1;
        out->kind = CONF_KEY_JWT;
        out->arg = xstrdup(s + 4);
        out->arglen = n;
        return 0;
    }
    if (wl == 7 && !strncmp(s, "capture", 7)) {
        if (!colon || colon[1] < '1' || colon[1] > '0' + CONF_MAX_CAPTURES || colon[2])
            return -2;
        out->kind = CONF_KEY_CAPTURE;
        out->capture = colon[1] - '0';
        return 0;
    }
    for (int i = 0; keysrcs[i].word; i++) {
        if (strlen(keysrcs[i].word) != wl || strncmp(s, keysrcs[i].word, wl))
            continue;
        if (!keysrcs[i].has_arg != !colon)
            return -1;
        if (colon && (!conf_is_token(colon + 1) || strlen(colon + 1) > 256))
            return -1;
        out->kind = keysrcs[i].kind;
        out->arg = colon ? xstrdup(colon + 1) : NULL;
        out->arglen = colon ? strlen(colon + 1) : 0;
        return 0;
    }
    return -1;
}

static int h_limit_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    char sb[SHOW_BUF];
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one key source (e.g. [ip])");
    l->keys = xcalloc((size_t)v->nkids, sizeof *l->keys);
    l->nkeys = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        const char *s = conf_scalar(x, v->kids[i]);
        int rc = s ? parse_keysrc(s, &l->keys[i]) : -1;
        if (s && rc == -2)
            conf_fail(x, v->kids[i], "bad key source '%s' (capture:N takes a group number "
                      "1..%d)", conf_show(s, sb), CONF_MAX_CAPTURES);
        else if (s && rc == -3)
            conf_fail(x, v->kids[i], "bad key source '%s' (ip/N takes a prefix length 0..128, "
                      "ip/N/M an IPv4 length 0..32 and an IPv6 length 0..128)",
                      conf_show(s, sb));
        else if (s && rc < 0)
            conf_fail(x, v->kids[i], "bad key source '%s' (use ip, ip/N, method, path, "
                      "header:NAME, query:NAME, cookie:NAME or jwt:CLAIM)", conf_show(s, sb));
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_limit_shadow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct limit_src *)obj)->l->shadow);
}

static int h_limit_cost_header(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!conf_is_token(s) || strlen(s) > 256)
        return conf_fail(x, v, "bad header name '%s'", conf_show(s, sb));
    l->cost_header = xstrdup(s);
    return 0;
}

/* cost_from: { header: NAME } | { trailer: NAME } | { json: PATH } | { sse: PATH } */
static int h_limit_cost_from(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const kinds[] = { "header", "trailer", "json", "sse" };
    struct limit_src *ls = obj;
    struct conf_limit *l = ls->l;
    char sb[SHOW_BUF];
    ls->cost_from_k = k;
    if (conf_expect(x, v, NODE_MAP) < 0)
        return -1;
    if (v->nkids != 2)
        return conf_fail(x, v, "needs exactly one of header, trailer, json or sse");
    struct node *kk = v->kids[0], *kv = v->kids[1];
    int kind = -1;
    for (int i = 0; i < 4; i++)
        if (kk->kind == NODE_SCALAR && !strcmp(kk->str, kinds[i]))
            kind = i;
    if (kind < 0)
        return conf_fail(x, kk, "unknown cost source '%s' (use header, trailer, json or sse)",
                         conf_show(kk->str ? kk->str : "", sb));
    size_t old = conf_path_push_key(x, kinds[kind]);
    const char *s = conf_scalar(x, kv);
    int rc = s ? 0 : -1;
    if (s && kind < 2 && (!conf_is_token(s) || strlen(s) > 256))
        rc = conf_fail(x, kv, "bad header name '%s'", conf_show(s, sb));
    else if (s && kind >= 2 && jsonscan_path_valid(s) < 0)
        rc = conf_fail(x, kv, "bad JSON path '%s' (up to %d keys of letters, digits, '_' "
                       "and '-', joined by '.', e.g. usage.total_tokens)", conf_show(s, sb),
                       JSONSCAN_MAX_SEGS);
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    l->cost_from = (enum conf_cost_src)(CONF_COST_HEADER + kind);
    l->cost_name = xstrdup(s);
    l->params.settles = 1;
    return 0;
}

static int h_estimate_json(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (jsonscan_path_valid(s) < 0)
        return conf_fail(x, v, "bad JSON path '%s' (up to %d keys of letters, digits, '_' "
                         "and '-', joined by '.', e.g. max_tokens)", conf_show(s, sb),
                         JSONSCAN_MAX_SEGS);
    l->estimate_json = xstrdup(s);
    return 0;
}

static int h_estimate_default(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_int(x, v, 1, CONF_MAX_COST, &((struct conf_limit *)obj)->estimate);
}

static const struct key_def estimate_keys[] = {
    { "json", h_estimate_json, 1 },
    { "default", h_estimate_default, 0 },
    { NULL, NULL, 0 },
};

/* estimate: N | { json: PATH, default: N } */
static int h_limit_estimate(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->estimate_k = k;
    if (v->kind == NODE_MAP)
        return conf_walk_map(x, v, estimate_keys, ls->l);
    return conf_get_int(x, v, 1, CONF_MAX_COST, &ls->l->estimate);
}

/* One count_status item: a status 100..599, or a class 1xx..5xx. */
static int count_status_item(struct ctx *x, struct node *n, struct conf_limit *l)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    int64_t st;
    if (!s)
        return -1;
    if (s[0] >= '1' && s[0] <= '5' && !strcmp(s + 1, "xx")) {
        int base = (s[0] - '0') * 100;
        memset(l->count_status + base, 1, 100);
        return 0;
    }
    if (conf_parse_int(s, &st) != 0 || st < 100 || st > 599)
        return conf_fail(x, n, "bad status '%s' (use 100..599, or 1xx, 2xx, 3xx, 4xx, 5xx)",
                         conf_show(s, sb));
    l->count_status[st] = 1;
    return 0;
}

static int h_limit_count_status(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one status (leave count_status out to count all)");
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = count_status_item(x, v->kids[i], l);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    l->has_count_status = 1;
    return 0;
}

static int h_limit_status(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (conf_get_int(x, v, 400, 599, &n) < 0)
        return -1;
    ((struct limit_src *)obj)->l->status = (int)n;
    return 0;
}

/* Goes into the JSON body of a rejection: bounded, no control bytes. */
static int h_limit_message(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    const char *s = conf_scalar(x, v);
    size_t n;
    if (!s)
        return -1;
    n = strlen(s);
    if (n > CONF_MAX_MESSAGE)
        return conf_fail(x, v, "message is %zu bytes, at most %d", n, CONF_MAX_MESSAGE);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return conf_fail(x, v, "message has a control byte");
    l->message = xstrdup(s);
    return 0;
}

static int h_limit_overrides(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->overrides = v, ls->overrides_k = k;
    return conf_expect(x, v, NODE_SEQ);
}

static int h_limit_lease(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->lease = v, ls->lease_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_delay(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->delay = v, ls->delay_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_calendar(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    int on;
    if (conf_get_bool(x, v, &on) < 0)
        return -1;
    ls->calendar = on ? v : NULL, ls->calendar_k = k;
    return 0;
}

static int h_limit_timezone(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->timezone = v, ls->timezone_k = k;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_limit_on_missing_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "ip", "deny", "pass" };
    int i = 0;
    if (conf_get_enum(x, v, names, 3, "ip, deny or pass", &i) < 0)
        return -1;
    ((struct limit_src *)obj)->l->on_missing_key = (enum conf_missing_key)i;
    return 0;
}

static const struct key_def limit_keys[] = {
    { "name", h_limit_name, 1 },
    { "algorithm", h_limit_algorithm, 1 },
    { "limit", h_limit_limit, 0 },
    { "window", h_limit_window, 0 },
    { "rate", h_limit_rate, 0 },
    { "burst", h_limit_burst, 0 },
    { "key", h_limit_key, 1 },
    { "shadow", h_limit_shadow, 0 },
    { "cost_header", h_limit_cost_header, 0 },
    { "count_status", h_limit_count_status, 0 },
    { "cost_from", h_limit_cost_from, 0 },
    { "estimate", h_limit_estimate, 0 },
    { "status", h_limit_status, 0 },
    { "message", h_limit_message, 0 },
    { "overrides", h_limit_overrides, 0 },
    { "lease", h_limit_lease, 0 },
    { "delay", h_limit_delay, 0 },
    { "calendar", h_limit_calendar, 0 },
    { "timezone", h_limit_timezone, 0 },
    { "on_missing_key", h_limit_on_missing_key, 0 },
    { NULL, NULL, 0 },
};

static int algo_from_name(const char *s, enum limiter_algo *out)
{
    for (int a = LIMITER_FIXED_WINDOW; a <= LIMITER_CONCURRENCY; a++) {
        if (!strcmp(s, limiter_algo_name((enum limiter_algo)a))) {
            *out = (enum limiter_algo)a;
            return 0;
        }
    }
    return -1;
}

/* calendar: true: a window of 1d, 1w, 1mo or 1y in timezone (UTC by
 * default), for fixed_window only. */
static int limit_calendar_params(struct ctx *x, struct limit_src *ls)
{
    static const struct { const char *w; enum tzcal_unit u; int64_t ms; } units[] = {
        { "1d", TZCAL_DAY, 86400000LL }, { "1w", TZCAL_WEEK, 7 * 86400000LL },
        { "1mo", TZCAL_MONTH, 30 * 86400000LL }, { "1y", TZCAL_YEAR, 365 * 86400000LL },
    };
    struct limiter_params *lp = &ls->l->params;
    char sb[SHOW_BUF];
    const char *why;
    if (!ls->calendar)
        return ls->timezone_k ? conf_fail_bare(x, ls->timezone_k, "'timezone' needs calendar: "
                                               "true in %s", conf_where(x)) : 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(ls->window->str, units[i].w))
            continue;
        const char *zone = ls->timezone ? ls->timezone->str : "UTC";
        ls->l->tz = tzcal_load(zone, &why);
        if (ls->l->tz == NULL) {
            size_t old = conf_path_push_key(x, "timezone");
            conf_fail(x, ls->timezone, "%s '%s' (use an IANA name such as Europe/Berlin)", why,
                      conf_show(zone, sb));
            conf_path_pop(x, old);
            return -1;
        }
        lp->cal = units[i].u;
        lp->tz = ls->l->tz;
        lp->window_ms = units[i].ms;
        return 0;
    }
    size_t old = conf_path_push_key(x, "window");
    conf_fail(x, ls->window, "bad calendar window '%s' (use 1d, 1w, 1mo or 1y)",
              conf_show(ls->window->str, sb));
    conf_path_pop(x, old);
    return -1;
}

/* Window algorithms: limit per window. */
static int limit_window_params(struct ctx *x, struct node *m, struct limit_src *ls,
                               const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    size_t old;
    int rc;
    if (ls->rate_k || ls->burst_k)
        return conf_fail_bare(x, ls->rate_k ? ls->rate_k : ls->burst_k,
                              "'%s' does not apply to %s in %s (use limit and window)",
                              ls->rate_k ? "rate" : "burst", an, conf_where(x));
    if (!ls->limit || !ls->window)
        return conf_fail_bare(x, m, "missing required key '%s' in %s (%s needs limit and window)",
                              ls->limit ? "window" : "limit", conf_where(x), an);
    old = conf_path_push_key(x, "limit");
    rc = conf_get_int(x, ls->limit, 1, CONF_MAX_COUNT, &lp->limit);
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    lp->interval_us = 0;
    if (ls->calendar || ls->timezone_k)
        return limit_calendar_params(x, ls);
    old = conf_path_push_key(x, "window");
    rc = conf_get_duration(x, ls->window, &lp->window_ms);
    conf_path_pop(x, old);
    return rc;
}

/* token_bucket, gcra: one token per interval_us, burst back to back. */
static int limit_bucket_params(struct ctx *x, struct node *m, struct limit_src *ls,
                               const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    char sb[SHOW_BUF];
    int64_t n = 0, period_ms = 0, burst = 0;
    size_t old;
    int rc;
    if (ls->limit_k || ls->window_k)
        return conf_fail_bare(x, ls->limit_k ? ls->limit_k : ls->window_k,
                              "'%s' does not apply to %s in %s (use rate and burst)",
                              ls->limit_k ? "limit" : "window", an, conf_where(x));
    if (!ls->rate || !ls->burst)
        return conf_fail_bare(x, m, "missing required key '%s' in %s (%s needs rate and burst)",
                              ls->rate ? "burst" : "rate", conf_where(x), an);
    old = conf_path_push_key(x, "rate");
    if (conf_parse_rate(ls->rate->str, &n, &period_ms) < 0)
        rc = conf_fail(x, ls->rate, "bad rate '%s' (use e.g. 10/s, 100/m, 5/h, 1000/d, 100/10s)",
                       conf_show(ls->rate->str, sb));
    else if (period_ms > CONF_MAX_DURATION_MS)
        rc = conf_fail(x, ls->rate, "rate '%s' is out of range (period at most 3650d)",
                       conf_show(ls->rate->str, sb));
    else
        rc = 0;
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    old = conf_path_push_key(x, "burst");
    rc = conf_get_int(x, ls->burst, 1, CONF_MAX_COUNT, &burst);
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    lp->limit = burst;
    lp->interval_us = conf_rate_interval_us(n, period_ms);
    if (conf_bucket_window(lp) < 0)
        return conf_fail(x, m, "rate and burst give a refill time beyond 3650d");
    return 0;
}

/* ---- overrides: [{ key: [VALUE, ...], limit: N | rate: R, burst: N }] */

/* One override's own keys, checked against the limit's algorithm. */
struct override_src {
    struct conf_limit *l;
    struct conf_override *o;
    struct node *key, *limit, *rate, *burst;
};

static int h_override_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct override_src *os = obj;
    char sb[SHOW_BUF];
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    os->key = v;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs one value per key source of the limit");
    os->o->parts = xcalloc((size_t)v->nkids, sizeof *os->o->parts);
    os->o->partlen = xcalloc((size_t)v->nkids, sizeof *os->o->partlen);
    os->o->nparts = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        const char *s = conf_scalar(x, v->kids[i]);
        int rc = s ? 0 : -1;
        if (s && strlen(s) > CONF_MAX_PART)
            rc = conf_fail(x, v->kids[i], "key value '%s' is longer than %d bytes",
                           conf_show(s, sb), CONF_MAX_PART);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
        os->o->parts[i] = xstrdup(s);
        os->o->partlen[i] = strlen(s);
    }
    return 0;
}

static int h_override_limit(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->limit = v;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_override_rate(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->rate = v;
    return conf_scalar(x, v) ? 0 : -1;
}

static int h_override_burst(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->burst = v;
    return conf_scalar(x, v) ? 0 : -1;
}

static const struct key_def override_keys[] = {
    { "key", h_override_key, 1 },
    { "limit", h_override_limit, 0 },
    { "rate", h_override_rate, 0 },
    { "burst", h_override_burst, 0 },
    { NULL, NULL, 0 },
};

/* The limit's parameters with what the override changes. Window
 * algorithms take limit; token_bucket and gcra take rate and/or burst. */
static int override_params(struct ctx *x, struct node *m, struct override_src *os)
{
    struct limiter_params *p = &os->o->params;
    const char *an = limiter_algo_name(p->algo);
    char sb[SHOW_BUF];
    int bucket = p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA;
    size_t old;
    int rc = 0;
    if (bucket && os->limit)
        return conf_fail_bare(x, os->limit, "'limit' does not apply to %s in %s (use rate and/or "
                              "burst)", an, conf_where(x));
    if (!bucket && (os->rate || os->burst))
        return conf_fail_bare(x, os->rate ? os->rate : os->burst, "'%s' does not apply to %s in %s "
                              "(use limit)", os->rate ? "rate" : "burst", an, conf_where(x));
    if (!bucket) {
        if (!os->limit)
            return conf_fail_bare(x, m, "missing required key 'limit' in %s", conf_where(x));
        old = conf_path_push_key(x, "limit");
        rc = conf_get_int(x, os->limit, 1, CONF_MAX_COUNT, &p->limit);
        conf_path_pop(x, old);
        return rc;
    }
    if (!os->rate && !os->burst)
        return conf_fail_bare(x, m, "missing required key 'rate' or 'burst' in %s", conf_where(x));
    if (os->burst) {
        old = conf_path_push_key(x, "burst");
        rc = conf_get_int(x, os->burst, 1, CONF_MAX_COUNT, &p->limit);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    if (os->rate) {
        int64_t n = 0, period_ms = 0;
        old = conf_path_push_key(x, "rate");
        if (conf_parse_rate(os->rate->str, &n, &period_ms) < 0 ||
            period_ms > CONF_MAX_DURATION_MS)
            rc = conf_fail(x, os->rate,
                           "bad rate '%s' (use e.g. 10/s, 100/m, 5/h, 1000/d, 100/10s)",
                           conf_show(os->rate->str, sb));
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
        p->interval_us = conf_rate_interval_us(n, period_ms);
    }
    if (conf_bucket_window(p) < 0)
        return conf_fail(x, m, "rate and burst give a refill time beyond 3650d");
    return 0;
}

static int overrides_load(struct ctx *x, struct node *v, struct conf_limit *l)
{
    if (v->nkids > CONF_MAX_OVERRIDES)
        return conf_fail(x, v, "at most %d overrides per limit, got %d", CONF_MAX_OVERRIDES,
                         v->nkids);
    l->overrides = xcalloc((size_t)v->nkids, sizeof *l->overrides);
    l->noverrides = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        struct override_src os = { .l = l, .o = &l->overrides[i] };
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = conf_walk_map(x, v->kids[i], override_keys, &os);
        os.o->params = l->params;
        if (rc == 0 && os.o->nparts != l->nkeys) {
            size_t o2 = conf_path_push_key(x, "key");
            rc = conf_fail(x, os.key, "has %d value%s, the limit's key has %d part%s", os.o->nparts,
                           os.o->nparts == 1 ? "" : "s", l->nkeys, l->nkeys == 1 ? "" : "s");
            conf_path_pop(x, o2);
        }
        if (rc == 0)
            rc = override_params(x, v->kids[i], &os);
        for (int j = 0; rc == 0 && j < i; j++)
            if (l->overrides[j].nparts == os.o->nparts) {
                int same = 1;
                for (int p = 0; same && p < os.o->nparts; p++)
                    same = !strcmp(l->overrides[j].parts[p], os.o->parts[p]);
                if (same)
                    rc = conf_fail(x, v->kids[i], "the same key as overrides[%d]", j);
            }
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* lease (concurrency) and delay (token_bucket, gcra) apply to their own
 * algorithms only, and neither to a limit that does not consume when it
 * decides (count_status) or never rejects (shadow: delay). */
static int limit_shaping_keys(struct ctx *x, struct limit_src *ls, const char *an)
{
    enum limiter_algo a = ls->l->params.algo;
    if (ls->lease_k && a != LIMITER_CONCURRENCY)
        return conf_fail_bare(x, ls->lease_k, "'lease' does not apply to %s in %s (only to "
                              "concurrency)", an, conf_where(x));
    if (ls->delay_k && a != LIMITER_TOKEN_BUCKET && a != LIMITER_GCRA)
        return conf_fail_bare(x, ls->delay_k, "'delay' does not apply to %s in %s (only to "
                              "token_bucket and gcra)", an, conf_where(x));
    if ((ls->calendar || ls->timezone_k) && a != LIMITER_FIXED_WINDOW)
        return conf_fail_bare(x, ls->calendar ? ls->calendar_k : ls->timezone_k,
                              "'%s' does not apply to %s in %s (only fixed_window windows "
                              "follow the calendar)", ls->calendar ? "calendar" : "timezone",
                              an, conf_where(x));
    if (ls->delay_k && ls->l->shadow)
        return conf_fail_bare(x, ls->delay_k, "'delay' does not apply to a shadow limit in %s",
                              conf_where(x));
    if ((ls->delay_k || a == LIMITER_CONCURRENCY) && ls->l->has_count_status)
        return conf_fail_bare(x, ls->delay_k ? ls->delay_k : ls->algorithm,
                              "%s does not combine with count_status in %s",
                              ls->delay_k ? "'delay'" : "concurrency", conf_where(x));
    if (ls->estimate_k && !ls->cost_from_k)
        return conf_fail_bare(x, ls->estimate_k, "'estimate' needs cost_from in %s",
                              conf_where(x));
    if (ls->cost_from_k) {
        const char *other = ls->l->has_count_status ? "count_status" :
                            ls->l->cost_header ? "cost_header" : ls->delay_k ? "delay" : NULL;
        if (a != LIMITER_FIXED_WINDOW && a != LIMITER_SLIDING_WINDOW &&
            a != LIMITER_TOKEN_BUCKET && a != LIMITER_GCRA)
            return conf_fail_bare(x, ls->cost_from_k, "'cost_from' does not apply to %s in %s "
                                  "(only to fixed_window, sliding_window, token_bucket and "
                                  "gcra)", an, conf_where(x));
        if (other)
            return conf_fail_bare(x, ls->cost_from_k, "'cost_from' does not combine with %s "
                                  "in %s", other, conf_where(x));
        if (ls->l->estimate == 0)
            ls->l->estimate = 1;
    }
    if (ls->delay) {
        size_t old = conf_path_push_key(x, "delay");
        int rc = conf_get_duration(x, ls->delay, &ls->l->params.delay_ms);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* concurrency: limit slots per key, each held at most lease without news
 * (0 here: the route's upstream timeout + 10 s, set in phase 3). */
static int limit_concurrency_params(struct ctx *x, struct node *m, struct limit_src *ls,
                                    const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    struct node *extra = ls->window_k ? ls->window_k : ls->rate_k ? ls->rate_k : ls->burst_k;
    size_t old;
    int rc;
    if (extra)
        return conf_fail_bare(x, extra, "'%s' does not apply to %s in %s (use limit and lease)",
                              extra->str, an, conf_where(x));
    if (!ls->limit)
        return conf_fail_bare(x, m, "missing required key 'limit' in %s (%s needs limit)",
                              conf_where(x), an);
    old = conf_path_push_key(x, "limit");
    rc = conf_get_int(x, ls->limit, 1, CONF_MAX_COUNT, &lp->limit);
    conf_path_pop(x, old);
    if (rc < 0)
        return -1;
    lp->window_ms = lp->interval_us = 0;
    if (ls->lease) {
        old = conf_path_push_key(x, "lease");
        rc = conf_get_duration(x, ls->lease, &lp->window_ms);
        conf_path_pop(x, old);
    }
    return rc;
}

static int limit_load(struct ctx *x, struct node *m, struct conf_limit *l)
{
    struct limit_src ls = { .l = l };
    char sb[SHOW_BUF];
    const char *an;
    size_t old;
    l->status = 429;
    if (conf_walk_map(x, m, limit_keys, &ls) < 0)
        return -1;
    an = ls.algorithm->str;
    if (algo_from_name(an, &l->params.algo) < 0) {
        old = conf_path_push_key(x, "algorithm");
        conf_fail(x, ls.algorithm, "unknown algorithm '%s' (use fixed_window, sliding_window, "
                  "sliding_log, token_bucket, gcra or concurrency)", conf_show(an, sb));
        conf_path_pop(x, old);
        return -1;
    }
    if (limit_shaping_keys(x, &ls, an) < 0)
        return -1;
    int rc;
    if (l->params.algo == LIMITER_CONCURRENCY)
        rc = limit_concurrency_params(x, m, &ls, an);
    else if (l->params.algo == LIMITER_TOKEN_BUCKET || l->params.algo == LIMITER_GCRA)
        rc = limit_bucket_params(x, m, &ls, an);
    else
        rc = limit_window_params(x, m, &ls, an);
    if (rc < 0 || ls.overrides == NULL)
        return rc;
    old = conf_path_push_key(x, "overrides");
    rc = overrides_load(x, ls.overrides, l);
    conf_path_pop(x, old);
    return rc;
}

static int h_route_limits(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids > CONF_MAX_LIMITS)
        return conf_fail(x, v, "at most %d limits per route, got %d", CONF_MAX_LIMITS, v->nkids);
    r->limits = xcalloc((size_t)v->nkids, sizeof *r->limits);
    r->nlimits = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = limit_load(x, v->kids[i], &r->limits[i]);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    /* one response, one place its cost is read from */
    const struct conf_limit *first = NULL;
    for (int i = 0; i < r->nlimits; i++) {
        const struct conf_limit *l = &r->limits[i];
        if (!l->cost_from)
            continue;
        if (first == NULL)
            first = l;
        else if (l->cost_from != first->cost_from || strcasecmp(l->cost_name, first->cost_name))
            return conf_fail(x, v->kids[i], "the cost_from of limit '%s' differs from limit "
                             "'%s''s: a route's limits read the cost from one place",
                             l->name, first->name);
    }
    return 0;
}

static int h_route_allow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    return get_cidrs(x, v, &r->allow, &r->nallow);
}

static int h_route_cost(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_int(x, v, 1, CONF_MAX_COST, &((struct conf_route *)obj)->cost);
}

static int h_route_headers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "full", "ietf", "legacy", "none" };
    int i = 0;
    if (conf_get_enum(x, v, names, 4, "full, ietf, legacy or none", &i) < 0)
        return -1;
    ((struct conf_route *)obj)->headers = (enum conf_headers)i;
    return 0;
}

/* upgrade: true (WebSocket only), false, or the list of protocols
 * tunnelled ([websocket, foo]); h2c is never one of them. */
static int h_route_upgrade(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    if (v->kind != NODE_SEQ)
        return conf_get_bool(x, v, &r->upgrade);
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one protocol (or use true or false)");
    r->upgrade_protos = xcalloc((size_t)v->nkids, sizeof *r->upgrade_protos);
    r->nupgrade_protos = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        const char *s = conf_scalar(x, v->kids[i]);
        int ok = s && conf_is_token(s) && strlen(s) <= 64 && strchr(s, '/') == NULL &&
                 strcasecmp(s, "h2c") != 0;
        if (s && !ok)
            conf_fail(x, v->kids[i], "bad upgrade protocol '%s' (a token without '/'; "
                      "h2c is never tunnelled)", conf_show(s, sb));
        conf_path_pop(x, old);
        if (!ok)
            return -1;
        r->upgrade_protos[i] = xstrdup(s);
    }
    r->upgrade = 1;
    return 0;
}

/* The gRPC status of a rejection (RESOURCE_EXHAUSTED by default, as
 * grpc/status.h maps 429; UNAVAILABLE tells clients they may retry). */
static int h_route_grpc_limited(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "resource_exhausted", "unavailable" };
    int i = 0;
    if (conf_get_enum(x, v, names, 2, "resource_exhausted or unavailable", &i) < 0)
        return -1;
    ((struct conf_route *)obj)->grpc_limited = i == 0 ? 8 : 14;
    return 0;
}

/* plan_key, plan_from: one key source. What does not tell clients apart
 * (method, path, a capture) is refused; plan_from, a plan's name, not the
 * client address either. Kinds added later (jwt:CLAIM) pass as they are. */
static int route_plan_src(struct ctx *x, struct node *v, int is_from, struct conf_keysrc **out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    struct conf_keysrc *ks = xcalloc(1, sizeof *ks);
    *out = ks;
    int rc = parse_keysrc(s, ks);
    if (rc == 0 && (ks->kind == CONF_KEY_METHOD || ks->kind == CONF_KEY_PATH ||
                    ks->kind == CONF_KEY_CAPTURE || (ks->kind == CONF_KEY_IP && ks->net) ||
                    (is_from && ks->kind == CONF_KEY_IP)))
        rc = -1;
    if (rc < 0)
        return conf_fail(x, v, "bad %s '%s' (use %sheader:NAME, query:NAME, cookie:NAME or "
                         "jwt:CLAIM)",
                         is_from ? "plan source" : "plan key", conf_show(s, sb),
                         is_from ? "" : "ip, ");
    return 0;
}

static int h_route_plan_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return route_plan_src(x, v, 0, &((struct conf_route *)obj)->plan_key);
}

static int h_route_plan_from(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return route_plan_src(x, v, 1, &((struct conf_route *)obj)->plan_from);
}

static int h_route_require_jwt(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct conf_route *)obj)->require_jwt);
}

static const struct key_def route_keys[] = {
    { "name", h_route_name, 1 },
    { "match", h_route_match, 1 },
    { "upstream", h_route_upstream, 0 },   /* required unless decision: (phase 3) */
    { "limits", h_route_limits, 0 },
    { "allow", h_route_allow, 0 },
    { "cost", h_route_cost, 0 },
    { "headers", h_route_headers, 0 },
    { "upgrade", h_route_upgrade, 0 },
    { "grpc_limited", h_route_grpc_limited, 0 },
    { "require_jwt", h_route_require_jwt, 0 },
    { "plan_key", h_route_plan_key, 0 },
    { "plan_from", h_route_plan_from, 0 },
    { NULL, NULL, 0 },
};

int conf_h_routes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (conf_expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return conf_fail(x, v, "needs at least one route");
    c->routes = xcalloc((size_t)v->nkids, sizeof *c->routes);
    c->nroutes = v->nkids;
    x->routes = v;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = conf_path_push(x, "[%d]", i);
        int rc;
        c->routes[i].cost = 1;
        c->routes[i].headers = CONF_HEADERS_FULL;
        c->routes[i].grpc_limited = 8;
        rc = conf_walk_map(x, v->kids[i], route_keys, &c->routes[i]);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- plans: default, assign, and every other key a plan { limits } */

const struct conf_plan *conf_plan_find(const struct conf *c, const char *name, size_t n)
{
    for (int i = 0; i < c->nplans; i++)
        if (strlen(c->plans[i].name) == n && !memcmp(c->plans[i].name, name, n))
            return &c->plans[i];
    return NULL;
}

static int assign_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int d = memcmp(a, b, alen < blen ? alen : blen);
    return d ? d : alen < blen ? -1 : alen > blen;
}

static int assign_sort_cmp(const void *a, const void *b)
{
    const struct conf_plan_assign *x = a, *y = b;
    return assign_cmp(x->key, x->keylen, y->key, y->keylen);
}

const struct conf_plan *conf_plan_assigned(const struct conf *c, const char *key, size_t n)
{
    int lo = 0, hi = c->nplan_assign;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const struct conf_plan_assign *a = &c->plan_assign[mid];
        int d = assign_cmp(key, n, a->key, a->keylen);
        if (d == 0)
            return &c->plans[a->plan];
        if (d < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* A plan name where one is expected (default, an assignment). */
static int plan_ref(struct ctx *x, struct node *v, int *out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    const struct conf_plan *p = conf_plan_find(x->c, s, strlen(s));
    if (p == NULL)
        return conf_fail(x, v, "unknown plan '%s'", conf_show(s, sb));
    *out = (int)(p - x->c->plans);
    return 0;
}

static int h_plan_limits(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    if (h_route_limits(x, k, v, obj) < 0)
        return -1;
    if (r->nlimits == 0)
        return conf_fail(x, v, "a plan needs at least one limit");
    for (int i = 0; i < r->nlimits; i++) {
        struct conf_limit *l = &r->limits[i];
        struct node *ln = v->kids[i];
        size_t old = conf_path_push(x, "[%d]", i);
        int rc = 0;
        for (int j = 0; j < i && rc == 0; j++)
            if (!strcmp(l->name, r->limits[j].name))
                rc = conf_fail(x, conf_map_get(ln, "name"), "duplicate limit name '%s' in this "
                               "plan", conf_show(l->name, sb));
        for (int j = 0; j < l->nkeys && rc == 0; j++)
            if (l->keys[j].kind == CONF_KEY_CAPTURE)
                rc = conf_fail(x, conf_map_get(ln, "key")->kids[j], "capture:%d in a plan "
                               "(a plan's limits serve many routes)", l->keys[j].capture);
        if (rc == 0 && l->params.algo == LIMITER_CONCURRENCY && l->params.window_ms == 0)
            rc = conf_fail_bare(x, ln, "missing required key 'lease' in %s (a plan's "
                                "concurrency limit has no upstream to take it from)",
                                conf_where(x));
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    r->policy = conf_route_policy(r, NULL, NULL, &r->policy_len);
    return 0;
}

static const struct key_def plan_keys[] = {
    { "limits", h_plan_limits, 1 },
    { NULL, NULL, 0 },
};

static int plans_assign(struct ctx *x, struct node *v)
{
    struct conf *c = x->c;
    char sb[SHOW_BUF];
    if (conf_expect(x, v, NODE_MAP) < 0)
        return -1;
    c->plan_assign = xcalloc((size_t)v->nkids / 2, sizeof *c->plan_assign);
    for (int i = 0; i + 1 < v->nkids; i += 2) {
        struct conf_plan_assign *a = &c->plan_assign[c->nplan_assign];
        size_t old = conf_path_push(x, ".%s", conf_show(v->kids[i]->str, sb));
        size_t n = strlen(v->kids[i]->str);
        int rc = n == 0 || n > CONF_MAX_PLAN_KEY
                 ? conf_fail(x, v->kids[i], "a client key of 1 to %d bytes", CONF_MAX_PLAN_KEY)
                 : plan_ref(x, v->kids[i + 1], &a->plan);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
        a->key = xstrndup(v->kids[i]->str, n);
        a->keylen = n;
        c->nplan_assign++;
    }
    qsort(c->plan_assign, (size_t)c->nplan_assign, sizeof *c->plan_assign, assign_sort_cmp);
    return 0;
}

int conf_h_plans(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    char sb[SHOW_BUF];
    struct node *def = NULL, *assign = NULL;
    if (conf_expect(x, v, NODE_MAP) < 0)
        return -1;
    c->plans = xcalloc((size_t)v->nkids / 2, sizeof *c->plans);
    for (int i = 0; i + 1 < v->nkids; i += 2) {
        struct node *key = v->kids[i], *val = v->kids[i + 1];
        int is_def = !strcmp(key->str, "default");
        if (is_def || !strcmp(key->str, "assign")) {
            if (is_def ? def != NULL : assign != NULL)
                return conf_fail_bare(x, key, "duplicate key '%s' in plans", key->str);
            *(is_def ? &def : &assign) = val;
            continue;
        }
        size_t old = conf_path_push_key(x, key->str);
        const char *name = conf_name_scalar(x, key);
        int rc = name ? 0 : -1;
        if (rc == 0 && val->kind == NODE_NULL)
            rc = conf_fail(x, key, "plan '%s' has no limits", name);
        for (int j = 0; j < i && rc == 0; j += 2)
            if (!strcmp(v->kids[j]->str, key->str))
                rc = conf_fail(x, key, "duplicate plan '%s'", name);
        if (rc == 0) {
            struct conf_plan *p = &c->plans[c->nplans++];
            p->name = xstrdup(name);
            size_t rl = strlen(name) + 6;
            p->route.name = xcalloc(1, rl);
            snprintf(p->route.name, rl, "plan:%s", name);
            p->route.cost = 1;
            rc = conf_walk_map(x, val, plan_keys, &p->route);
        }
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    if (c->nplans == 0)
        return conf_fail(x, v, "plans: defines no plan (give each plan a name and its limits)");
    if (def == NULL)
        return conf_fail(x, v, "missing required key 'default' in plans (the plan of a client "
                         "no other source names)");
    size_t old = conf_path_push_key(x, "default");
    int rc = plan_ref(x, def, &c->plan_default);
    conf_path_pop(x, old);
    if (rc == 0 && assign != NULL) {
        old = conf_path_push_key(x, "assign");
        rc = plans_assign(x, assign);
        conf_path_pop(x, old);
    }
    for (int i = 1; i < c->nplan_assign && rc == 0; i++)
        if (assign_sort_cmp(&c->plan_assign[i - 1], &c->plan_assign[i]) == 0)
            rc = conf_fail(x, assign, "plans.assign: client key '%s' given twice",
                           conf_show(c->plan_assign[i].key, sb));
    return rc;
}

static int h_paths_case(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "sensitive", "insensitive" };
    int i = 0;
    if (conf_get_enum(x, v, names, 2, "sensitive or insensitive", &i) < 0)
        return -1;
    ((struct conf_paths *)obj)->case_insensitive = i;
    return 0;
}

static int h_paths_matrix(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "keep", "strip" };
    int i = 0;
    if (conf_get_enum(x, v, names, 2, "keep or strip", &i) < 0)
        return -1;
    ((struct conf_paths *)obj)->strip_matrix = i;
    return 0;
}

static const struct key_def paths_keys[] = {
    { "case", h_paths_case, 0 },
    { "matrix_params", h_paths_matrix, 0 },
    { NULL, NULL, 0 },
};

int conf_h_paths(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_walk_map(x, v, paths_keys, &((struct conf *)obj)->paths);
}
