/* sluice - route.c: path normalisation, route matching, client address and
 * rate-limit keys.
 *
 * Everything here reads hostile bytes (request target, Host, X-Forwarded-For,
 * headers, query, cookies) through spans into the head buffer and never
 * beyond them. Pure functions: no I/O, no allocation, no global state, so
 * every worker thread may call them at once; the one exception is each
 * thread's PCRE2 match data (regex.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "addr.h"
#include "mem.h"
#include "regex.h"
#include "route.h"
#include "sha1.h"

/* ---- small byte helpers ---- */

static int route_hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static unsigned char route_lower(unsigned char ch)
{
    return (ch >= 'A' && ch <= 'Z') ? (unsigned char)(ch + 32) : ch;
}

/* ASCII case-insensitive equality of two byte runs (locale-independent). */
static int route_caseeq(const char *a, size_t alen, const char *b, size_t blen)
{
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; i++)
        if (route_lower((unsigned char)a[i]) != route_lower((unsigned char)b[i]))
            return 0;
    return 1;
}

static int route_is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

static void route_trim(const char **p, size_t *n)
{
    while (*n > 0 && route_is_ows((*p)[0])) {
        (*p)++;
        (*n)--;
    }
    while (*n > 0 && route_is_ows((*p)[*n - 1]))
        (*n)--;
}

/* Header i's name equals name (case-insensitive). */
static int route_header_is(const char *buf, const struct http1_head *h, int i,
                           const char *name, size_t namelen)
{
    const struct http1_span *s = &h->h[i].name;
    return route_caseeq(buf + s->off, s->len, name, namelen);
}

/* Header i's name equals a key source's header name, ASCII case and '-'
 * versus '_' ignored: WSGI, Rack and CGI upstreams read "X_Api_Key" as
 * "X-Api-Key" (both become HTTP_X_API_KEY), so for keying they are one field. */
static int route_keyname_is(const char *buf, const struct http1_head *h, int i,
                            const char *name, size_t namelen)
{
    const struct http1_span *s = &h->h[i].name;
    if (s->len != namelen)
        return 0;
    for (size_t k = 0; k < namelen; k++) {
        unsigned char a = route_lower((unsigned char)buf[s->off + k]);
        unsigned char b = route_lower((unsigned char)name[k]);
        if (a == '_')
            a = '-';
        if (b == '_')
            b = '-';
        if (a != b)
            return 0;
    }
    return 1;
}

/* Header i's value without surrounding OWS. An offset of UINT32_MAX is
 * http1.c's mark for "no value seen"; such a head is refused there, but an
 * empty value here costs nothing and no pointer goes past the buffer. */
static void route_header_value(const char *buf, const struct http1_head *h, int i,
                               const char **v, size_t *vlen)
{
    if (h->h[i].value.off == UINT32_MAX) {
        *v = buf;
        *vlen = 0;
        return;
    }
    *v = buf + h->h[i].value.off;
    *vlen = h->h[i].value.len;
    route_trim(v, vlen);
}

/* ---- normalisation ---- */

/* Decode every %XX of the path into out (never longer than the input).
 * A '%' without two hex digits, or a decoded NUL, is a 400. With strip, a
 * matrix parameter goes too: from a ';' as sent up to the next '/' as sent,
 * before decoding, as Tomcat and Spring cut ";jsessionid=..." (so ";x%2Fy"
 * goes whole); and from a ';' that decoding made (%3B) up to the next '/'.
 * Tomcat would keep "%3B" in the name, but matching more never hands out a
 * fresh quota while matching less would. */
static long route_decode_path(const char *in, size_t len, int strip, char *out)
{
    size_t w = 0;
    int skipping = 0;                   /* inside a parameter decoding made */
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (strip && ch == ';') {
            const char *slash = memchr(in + i, '/', len - i);
            i = slash != NULL ? (size_t)(slash - in) - 1 : len - 1;
            skipping = 0;
            continue;
        }
        if (ch == '%') {
            if (i + 2 >= len)
                return -1;
            int hi = route_hexval((unsigned char)in[i + 1]);
            int lo = route_hexval((unsigned char)in[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            ch = (unsigned char)(hi << 4 | lo);
            i += 2;
            if (strip && ch == ';')
                skipping = 1;
        }
        if (skipping && ch != '/')
            continue;
        skipping = 0;
        out[w++] = (char)ch;
    }
    return (long)w;
}

/* Resolve "." and ".." segments and merge repeated '/' in place. p[0] is '/'.
 * The write index never passes the read index (each written '/' replaces at
 * least one skipped '/'), so one buffer suffices. A "." or ".." as the last
 * segment leaves a trailing '/', as RFC 3986 section 5.2.4 does. */
static long route_dot_segments(char *p, size_t n)
{
    size_t r = 0, w = 0;
    int trailing = 0;

    while (r < n) {
        while (r < n && p[r] == '/')
            r++;
        if (r == n) {
            trailing = 1;
            break;
        }
        size_t s = r;
        while (r < n && p[r] != '/')
            r++;
        size_t seglen = r - s;
        trailing = 0;
        if (seglen == 1 && p[s] == '.') {
            trailing = (r == n);
            continue;
        }
        if (seglen == 2 && p[s] == '.' && p[s + 1] == '.') {
            if (w == 0)
                return -1;              /* climbing above the root */
            while (p[w - 1] != '/')
                w--;
            w--;
            trailing = (r == n);
            continue;
        }
        p[w++] = '/';
        memmove(p + w, p + s, seglen);
        w += seglen;
    }
    if (w == 0 || trailing)
        p[w++] = '/';
    return (long)w;
}

/* The normalisation; strip: drop matrix parameters (before resolving dot
 * segments, so "/a/..;/b" climbs as it does in Tomcat); fold: lower-case
 * ASCII (after decoding, so "%41" and "a" are one). */
static long route_normalize_as(const char *target, size_t len, int strip, int fold, char *out)
{
    if (len == 0 || target[0] != '/')
        return -1;                      /* absolute-, authority-, asterisk-form */

    size_t pathlen = len;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)target[i];
        if (ch == '#' || ch < 0x20 || ch == 0x7f)
            return -1;
        if (ch == '?' && pathlen == len)
            pathlen = i;
    }
    long n = route_decode_path(target, pathlen, strip, out);
    if (n < 0)
        return -1;
    n = route_dot_segments(out, (size_t)n);
    if (n < 0)
        return -1;
    if (fold)
        for (long i = 0; i < n; i++)
            out[i] = (char)route_lower((unsigned char)out[i]);
    out[n] = '\0';     /* a C string too (route.h) */
    return n;
}

long route_normalize(const char *target, size_t len, char *out)
{
    return route_normalize_as(target, len, 0, 0, out);
}

long route_normalize_paths(const struct conf *c, const char *target, size_t len, char *out)
{
    return route_normalize_as(target, len, c->paths.strip_matrix, c->paths.case_insensitive,
                              out);
}

/* ---- matching ---- */

/* Host without port, IPv6 brackets and a trailing dot: "[::1]:8080" ->
 * "::1", "Example.com.:80" -> "Example.com" (a fully qualified name with its
 * root label is the same host). A value with several ':' and no brackets is
 * left whole (it cannot carry a port; route_host_check refuses it). */
static void route_host_bare(const char **h, size_t *n)
{
    route_trim(h, n);
    if (*n > 0 && (*h)[0] == '[') {
        const char *end = memchr(*h, ']', *n);
        if (end != NULL) {
            *n = (size_t)(end - *h) - 1;
            (*h)++;
        }
        return;
    }
    const char *colon = memchr(*h, ':', *n);
    if (colon != NULL) {
        size_t rest = *n - (size_t)(colon + 1 - *h);
        if (memchr(colon + 1, ':', rest) == NULL)
            *n = (size_t)(colon - *h);
    }
    if (*n > 1 && (*h)[*n - 1] == '.')
        (*n)--;
}

/* A registered name as DNS and the URI grammar's unreserved set allow it,
 * or an IPv4 address (which is one): letters, digits, '-', '.', '_', '~';
 * no empty label. */
static int route_host_name_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                 (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '~';
        if (ch == '.')
            ok = i > 0 && s[i - 1] != '.';
        if (!ok)
            return 0;
    }
    return 1;
}

int route_host_check(const char *host, size_t len)
{
    route_trim(&host, &len);
    if (len == 0)
        return 0;                       /* empty Host: allowed without an authority */
    size_t name;                        /* bytes before the port */
    if (host[0] == '[') {
        const char *end = memchr(host, ']', len);
        if (end == NULL || end == host + 1)
            return -1;
        for (const char *p = host + 1; p < end; p++)
            if (!(route_hexval((unsigned char)*p) >= 0 || *p == ':' || *p == '.'))
                return -1;
        name = (size_t)(end + 1 - host);
    } else {
        const char *colon = memchr(host, ':', len);
        name = colon != NULL ? (size_t)(colon - host) : len;
        if (name == 0 || !route_host_name_ok(host, name))
            return -1;
    }
    if (name == len)
        return 0;
    if (host[name] != ':' || len - name - 1 > 5)
        return -1;
    for (size_t i = name + 1; i < len; i++)
        if (host[i] < '0' || host[i] > '9')
            return -1;
    return 0;
}

/* Prefix on a segment boundary: "/api" meets "/api", "/api/", "/api/x",
 * never "/apix". The route "/" meets every normalised path. fold: the path
 * is lower-cased (paths.case: insensitive), the route's path compares so. */
static int route_path_meets(const struct conf_route *r, const char *path, size_t pathlen,
                            int fold)
{
    size_t rl = r->pathlen;
    if (rl == 0 || (rl == 1 && r->path[0] == '/'))
        return 1;
    if (pathlen < rl)
        return 0;
    if (fold ? !route_caseeq(path, rl, r->path, rl) : memcmp(path, r->path, rl) != 0)
        return 0;
    return pathlen == rl || path[rl] == '/' || r->path[rl - 1] == '/';
}

static int route_method_meets(const struct conf_route *r, const char *method, size_t methodlen)
{
    if (r->methods == NULL || r->nmethods == 0)
        return 1;
    for (int i = 0; i < r->nmethods; i++) {
        size_t ml = strlen(r->methods[i]);
        if (ml == methodlen && memcmp(r->methods[i], method, ml) == 0)
            return 1;
    }
    return 0;
}

static int route_host_meets(const struct conf_route *r, const char *host, size_t hostlen)
{
    if (r->host == NULL)
        return 1;
    if (host == NULL)
        return 0;
    const char *want = r->host;
    size_t wantlen = strlen(want);
    route_host_bare(&want, &wantlen);
    route_host_bare(&host, &hostlen);
    return route_caseeq(want, wantlen, host, hostlen);
}

/* 1: the regex matches the normalised path (caps, when not NULL, gets its
 * groups), 0: it does not, -1: it hit a limit before it could tell. */
static int route_regex_meets(const struct conf_route *r, const char *path, size_t pathlen,
                             struct route_captures *caps)
{
    size_t off[ROUTE_MAX_CAPTURES], len[ROUTE_MAX_CAPTURES];
    int max = r->ncaptures + 1 < ROUTE_MAX_CAPTURES ? r->ncaptures + 1 : ROUTE_MAX_CAPTURES;
    int rc = regex_match(r->regex, path, pathlen, off, len, max);
    if (rc <= 0 || caps == NULL)
        return rc;
    caps->n = 0;
    caps->set = 0;
    for (int i = 0; i < max; i++) {
        int set = off[i] != SIZE_MAX;
        caps->off[i] = set ? off[i] : 0;
        caps->len[i] = len[i];
        caps->set |= (unsigned)set << i;
        caps->n = i + 1;
    }
    return 1;
}

const struct conf_route *route_match(const struct conf *c,
                                     const char *path, size_t pathlen,
                                     const char *method, size_t methodlen,
                                     const char *host, size_t hostlen,
                                     struct route_captures *caps)
{
    if (caps)
        caps->over_limit = NULL;
    for (int i = 0; i < c->nroutes; i++) {
        const struct conf_route *r = &c->routes[i];
        if (r->regex != NULL) {
            if (!route_method_meets(r, method, methodlen) ||
                !route_host_meets(r, host, hostlen))
                continue;
            int m = route_regex_meets(r, path, pathlen, caps);
            if (m > 0)
                return r;
            if (m < 0) {        /* undecided: a later route would be a bypass */
                if (caps)
                    caps->over_limit = r;
                return NULL;
            }
            continue;
        }
        if (route_path_meets(r, path, pathlen, c->paths.case_insensitive) &&
            route_method_meets(r, method, methodlen) &&
            route_host_meets(r, host, hostlen))
            return r;
    }
    return NULL;
}

/* ---- client address ---- */

/* The fields are walked from the last; addr_xff_walk walks each from its
 * end (addr.c says how the client is picked). */
size_t route_client_ip(const struct conf *c, const struct sockaddr *peer,
                       const char *buf, const struct http1_head *h, char *out)
{
    struct sockaddr_storage client;
    if (addr_from_peer(peer, &client) < 0) {
        out[0] = '\0';                  /* unix socket or unknown: no address */
        return 0;
    }
    if (buf != NULL && h != NULL &&
        addr_cidr_match(c->trusted, c->ntrusted, (const struct sockaddr *)&client)) {
        for (int i = h->nheaders - 1; i >= 0; i--) {
            const char *v;
            size_t n;
            if (!route_header_is(buf, h, i, "x-forwarded-for", 15))
                continue;
            route_header_value(buf, h, i, &v, &n);
            if (!addr_xff_walk(c->trusted, c->ntrusted, v, n, &client))
                break;
        }
    }
    return addr_ntop(&client, out);
}

/* ---- keys ---- */

/* The key being written: bytes past ROUTE_MAX_KEY - 1 set full, and the key
 * is then refused whole, never truncated (a truncated key could merge two
 * clients). One byte stays for the NUL. */
struct route_out {
    char *p;
    size_t len;
    int full;
};

static void route_put(struct route_out *o, const void *s, size_t n)
{
    if (o->full || n > ROUTE_MAX_KEY - 1 - o->len) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void route_puts(struct route_out *o, const char *s)
{
    if (s != NULL)
        route_put(o, s, strlen(s));
}

/* Where a part's bytes go: measured, hashed, or written to the key. A part
 * is produced by walking the request twice (measure, then write or hash)
 * instead of copying it, so no part needs a buffer of its own. */
struct route_sink {
    int mode;                   /* ROUTE_SINK_* */
    size_t len;                 /* measured bytes */
    int first;                  /* first byte measured, -1 before any */
    struct sha1_ctx sha;
    struct route_out *out;
};

enum { ROUTE_SINK_MEASURE, ROUTE_SINK_HASH, ROUTE_SINK_WRITE };

static void route_sink_put(struct route_sink *k, const char *p, size_t n)
{
    if (n == 0)
        return;
    if (k->mode == ROUTE_SINK_MEASURE) {
        if (k->len == 0)
            k->first = (unsigned char)p[0];
        k->len += n;
    } else if (k->mode == ROUTE_SINK_HASH) {
        sha1_update(&k->sha, p, n);
    } else {
        route_put(k->out, p, n);
    }
}

/* One part, located in the request but not yet copied. */
enum route_part_kind { ROUTE_PART_SPAN, ROUTE_PART_QUERY, ROUTE_PART_COOKIE };

struct route_part {
    enum route_part_kind kind;
    const char *p;              /* SPAN: the bytes; QUERY, COOKIE: the raw value */
    size_t n;
};

/* Next byte of a percent-encoded run: a valid %XX is its octet, and a '%'
 * without two hex digits stays a literal '%' (lenient, like most servers:
 * the query and cookies are not ours to reject). */
static unsigned char route_pctnext(const char *s, size_t n, size_t *i)
{
    unsigned char ch = (unsigned char)s[*i];
    (*i)++;
    if (ch == '%' && *i + 1 < n) {
        int hi = route_hexval((unsigned char)s[*i]);
        int lo = route_hexval((unsigned char)s[*i + 1]);
        if (hi >= 0 && lo >= 0) {
            *i += 2;
            return (unsigned char)(hi << 4 | lo);
        }
    }
    return ch;
}

/* Next byte of a query component: '+' is a space, the rest as above. */
static unsigned char route_qnext(const char *s, size_t n, size_t *i)
{
    if (s[*i] == '+') {
        (*i)++;
        return ' ';
    }
    return route_pctnext(s, n, i);
}

/* A cookie value decodes %XX but keeps '+': Express and most cookie
 * libraries decode it so, and "a%2Bb" must key as "a+b". */
static void route_part_emit(const struct route_part *pt, struct route_sink *k)
{
    if (pt->kind == ROUTE_PART_SPAN) {
        route_sink_put(k, pt->p, pt->n);
        return;
    }
    char chunk[64];
    size_t used = 0, i = 0;
    while (i < pt->n) {
        chunk[used++] = (char)(pt->kind == ROUTE_PART_QUERY ? route_qnext(pt->p, pt->n, &i)
                                                            : route_pctnext(pt->p, pt->n, &i));
        if (used == sizeof chunk) {
            route_sink_put(k, chunk, used);
            used = 0;
        }
    }
    route_sink_put(k, chunk, used);
}

/* Append "<len>:<bytes>", or "41:#<sha1 hex>" for a part longer than
 * ROUTE_MAX_PART. A short part that itself looks like "#<40 chars>" is hashed
 * too, so "41:#..." always means a hash and no value can pose as another's
 * digest: the encoding stays one-to-one. */
static void route_put_part(struct route_out *o, const struct route_part *pt)
{
    struct route_sink k = { .mode = ROUTE_SINK_MEASURE, .first = -1 };
    route_part_emit(pt, &k);
    char num[32];
    if (k.len > ROUTE_MAX_PART || (k.len == 41 && k.first == '#')) {
        uint8_t d[SHA1_DIGEST_BYTES];
        char hex[SHA1_HEX_BYTES];
        k.mode = ROUTE_SINK_HASH;
        sha1_init(&k.sha);
        route_part_emit(pt, &k);
        sha1_final(&k.sha, d);
        sha1_tohex(d, hex);
        route_put(o, "41:#", 4);
        route_put(o, hex, 40);
        return;
    }
    /* "<len>:" without printf: this runs for every part of every key. */
    char *q = num + sizeof num;
    *--q = ':';
    size_t v = k.len;
    do {
        *--q = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    route_put(o, q, (size_t)(num + sizeof num - q));
    k.mode = ROUTE_SINK_WRITE;
    k.out = o;
    route_part_emit(pt, &k);
}

/* How often a key source occurs: absent, once, or more (ambiguous). */
enum route_seen { ROUTE_ABSENT, ROUTE_ONCE, ROUTE_TWICE };

/* The field of a header key source, under any spelling route_keyname_is
 * takes for it: its value into *v. Two such fields are ambiguous: sluice
 * would join them, an upstream take the first, the last or the list. */
static enum route_seen route_find_header(const struct route_req *req, const char *name,
                                         size_t namelen, const char **v, size_t *vlen)
{
    enum route_seen seen = ROUTE_ABSENT;
    for (int i = 0; i < req->h->nheaders; i++) {
        if (!route_keyname_is(req->buf, req->h, i, name, namelen))
            continue;
        if (seen == ROUTE_ONCE)
            return ROUTE_TWICE;
        route_header_value(req->buf, req->h, i, v, vlen);
        seen = ROUTE_ONCE;
    }
    return seen;
}
/* The query name equals want after decoding it. */
static int route_qname_is(const char *s, size_t n, const char *want, size_t wantlen)
{
    size_t i = 0, k = 0;
    while (i < n) {
        if (k == wantlen || route_qnext(s, n, &i) != (unsigned char)want[k])
            return 0;
        k++;
    }
    return k == wantlen;
}

/* The parameter named name in the raw query of the target; its raw value
 * (decoded later, while it is written) into *v. Twice is ambiguous: Flask
 * reads the first, PHP and Rails the last. */
static enum route_seen route_find_query(const struct route_req *req, const char *name,
                                        size_t namelen, const char **v, size_t *vlen)
{
    const char *t = req->buf + req->h->target.off;
    size_t tlen = req->h->target.len;
    const char *q = memchr(t, '?', tlen);
    enum route_seen seen = ROUTE_ABSENT;
    if (q == NULL)
        return seen;
    q++;
    size_t qlen = tlen - (size_t)(q - t);
    const char *hash = memchr(q, '#', qlen);
    if (hash != NULL)
        qlen = (size_t)(hash - q);

    for (;;) {
        const char *amp = memchr(q, '&', qlen);
        size_t plen = amp != NULL ? (size_t)(amp - q) : qlen;
        const char *eq = memchr(q, '=', plen);
        size_t nlen = eq != NULL ? (size_t)(eq - q) : plen;
        if (plen > 0 && route_qname_is(q, nlen, name, namelen)) {
            if (seen == ROUTE_ONCE)
                return ROUTE_TWICE;
            *v = eq != NULL ? eq + 1 : q + plen;
            *vlen = eq != NULL ? plen - nlen - 1 : 0;
            seen = ROUTE_ONCE;
        }
        if (amp == NULL)
            break;
        q = amp + 1;
        qlen -= plen + 1;
    }
    return seen;
}

/* The cookie named name (exact, case-sensitive) in the Cookie field(s):
 * "a=1; b=2". Its value with surrounding whitespace and one pair of
 * DQUOTEs (RFC 6265's quoted form) taken off; %XX is decoded as it is
 * written. Twice, in one field or across two, is ambiguous. */
static enum route_seen route_find_cookie(const struct route_req *req, const char *name,
                                         size_t namelen, const char **v, size_t *vlen)
{
    enum route_seen seen = ROUTE_ABSENT;
    for (int i = 0; i < req->h->nheaders; i++) {
        if (!route_header_is(req->buf, req->h, i, "cookie", 6))
            continue;
        const char *s;
        size_t n;
        route_header_value(req->buf, req->h, i, &s, &n);
        while (n > 0) {
            const char *semi = memchr(s, ';', n);
            size_t plen = semi != NULL ? (size_t)(semi - s) : n;
            const char *eq = memchr(s, '=', plen);
            if (eq != NULL) {
                const char *cn = s, *cv = eq + 1;
                size_t cnlen = (size_t)(eq - s), cvlen = plen - cnlen - 1;
                route_trim(&cn, &cnlen);
                route_trim(&cv, &cvlen);
                if (cnlen == namelen && memcmp(cn, name, namelen) == 0) {
                    if (seen == ROUTE_ONCE)
                        return ROUTE_TWICE;
                    if (cvlen >= 2 && cv[0] == '"' && cv[cvlen - 1] == '"') {
                        cv++;
                        cvlen -= 2;
                    }
                    *v = cv;
                    *vlen = cvlen;
                    seen = ROUTE_ONCE;
                }
            }
            if (semi == NULL)
                break;
            s = semi + 1;
            n -= plen + 1;
        }
    }
    return seen;
}

/* Locate key source ks in the request. */
static enum route_seen route_locate(const struct conf_keysrc *ks, const struct route_req *req,
                                    struct route_part *pt)
{
    memset(pt, 0, sizeof *pt);
    pt->kind = ROUTE_PART_SPAN;
    switch (ks->kind) {
    case CONF_KEY_IP:
        pt->p = req->ip;
        pt->n = req->iplen;
        return req->ip != NULL ? ROUTE_ONCE : ROUTE_ABSENT;
    case CONF_KEY_METHOD:
        pt->p = req->buf + req->h->method.off;
        pt->n = req->h->method.len;
        return ROUTE_ONCE;
    case CONF_KEY_PATH:
        pt->p = req->path;
        pt->n = req->pathlen;
        return req->path != NULL ? ROUTE_ONCE : ROUTE_ABSENT;
    case CONF_KEY_HEADER:
        return route_find_header(req, ks->arg, ks->arglen, &pt->p, &pt->n);
    case CONF_KEY_QUERY:
        pt->kind = ROUTE_PART_QUERY;
        return route_find_query(req, ks->arg, ks->arglen, &pt->p, &pt->n);
    case CONF_KEY_COOKIE:
        pt->kind = ROUTE_PART_COOKIE;
        return route_find_cookie(req, ks->arg, ks->arglen, &pt->p, &pt->n);
    case CONF_KEY_CAPTURE:
        /* An unset group (an optional one that did not take part) is
         * absent; a group that matched nothing is an empty part. */
        if (req->caps == NULL || ks->capture >= req->caps->n ||
            !(req->caps->set & (1u << ks->capture)))
            return ROUTE_ABSENT;
        pt->p = req->path + req->caps->off[ks->capture];
        pt->n = req->caps->len[ks->capture];
        return ROUTE_ONCE;
    }
    abort();                            /* conf.c only makes the kinds above */
}

/* Every key is PREFIX{route|limit|parts...}: route_key and route_key_parts
 * write its frame here, its parts in between. */
static void route_key_open(struct route_out *o, const struct conf *c,
                           const struct conf_route *r, const struct conf_limit *l)
{
    route_puts(o, c->redis.prefix);
    route_put(o, "{", 1);
    route_puts(o, r->name);
    route_put(o, "|", 1);
    route_puts(o, l->name);
    route_put(o, "|", 1);
}

static long route_key_close(struct route_out *o, char *out)
{
    route_put(o, "}", 1);
    if (o->full)
        return -1;
    out[o->len] = '\0';
    return (long)o->len;
}

/* Client bytes may hold '{' or '}': Redis Cluster then hashes a shorter
 * tag, but it is still the same for every key derived from this one, and the
 * length prefixes keep the key itself unambiguous. Every source is located
 * before any is written (and again while writing: locating costs less than
 * keeping parts for a count of sources conf.c does not bound), so a doubled
 * source is refused whatever its place among the limit's keys. */
long route_key(const struct conf *c, const struct conf_route *r,
               const struct conf_limit *l, const struct route_req *req,
               char *out)
{
    struct route_part pt;
    int absent = 0;
    for (int i = 0; i < l->nkeys; i++) {
        enum route_seen seen = route_locate(&l->keys[i], req, &pt);
        if (seen == ROUTE_TWICE)
            return ROUTE_KEY_AMBIGUOUS;
        absent |= seen == ROUTE_ABSENT;
    }
    if (absent)
        return 0;
    struct route_out o = { .p = out };
    route_key_open(&o, c, r, l);
    for (int i = 0; i < l->nkeys; i++) {
        route_locate(&l->keys[i], req, &pt);
        route_put_part(&o, &pt);
    }
    return route_key_close(&o, out);
}

/* The key route_key() writes for a request whose key sources give exactly
 * parts[0..n) (decoded values: a query parameter or cookie as the upstream
 * reads it): config overrides and the admin API name keys this way. */
long route_key_parts(const struct conf *c, const struct conf_route *r,
                     const struct conf_limit *l, const char *const *parts,
                     const size_t *lens, int n, char *out)
{
    if (n != l->nkeys)
        return -1;
    struct route_out o = { .p = out };
    struct route_part pt;
    route_key_open(&o, c, r, l);
    for (int i = 0; i < n; i++) {
        memset(&pt, 0, sizeof pt);
        pt.kind = ROUTE_PART_SPAN;
        pt.p = parts[i];
        pt.n = lens[i];
        route_put_part(&o, &pt);
    }
    return route_key_close(&o, out);
}

/* The config override of l whose key is key, or NULL. */
const struct conf_override *route_override(const struct conf_limit *l, const char *key,
                                           size_t len)
{
    for (int i = 0; i < l->noverrides; i++)
        if (l->overrides[i].keylen == len && memcmp(l->overrides[i].key, key, len) == 0)
            return &l->overrides[i];
    return NULL;
}

unsigned route_secret_parts(const struct conf_limit *l)
{
    static const char *const words[] = { "token", "secret", "key", "password", "passwd",
                                         "session", "auth" };
    unsigned mask = 0;
    for (int i = 0; i < l->nkeys && i < 32; i++) {
        const struct conf_keysrc *k = &l->keys[i];
        int secret = k->kind == CONF_KEY_COOKIE;
        if ((k->kind == CONF_KEY_HEADER || k->kind == CONF_KEY_QUERY) && k->arg != NULL)
            for (size_t w = 0; w < sizeof(words) / sizeof(words[0]) && !secret; w++)
                secret = strcasestr(k->arg, words[w]) != NULL;
        if (secret)
            mask |= 1u << i;
    }
    return mask;
}
