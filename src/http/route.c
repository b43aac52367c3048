/* sluice - route.c: path normalisation, route matching, client address and
 * rate-limit keys.
 *
 * Everything here reads hostile bytes (request target, Host, X-Forwarded-For,
 * headers, query, cookies) through spans into the head buffer and never
 * beyond them. Pure functions: no I/O, no allocation, no global state, so
 * every worker thread may call them at once; the exceptions are each
 * thread's PCRE2 match data (regex.c) and the OpenSSL digest context of a
 * key part that is hashed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "addr.h"
#include "digest.h"
#include "jwt.h"
#include "mem.h"
#include "regex.h"
#include "route.h"

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
    /* 1: letter, digit, '-', '_', '~'; 2: '.' */
    static const unsigned char cls[256] = {
        ['-'] = 1, ['_'] = 1, ['~'] = 1, ['.'] = 2,
        ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1,
        ['7'] = 1, ['8'] = 1, ['9'] = 1,
        ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1,
        ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1,
        ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1,
        ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
        ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1,
        ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
        ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1,
        ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
    };
    unsigned prev = 2;                  /* a name does not start with '.' */
    for (size_t i = 0; i < n; i++) {
        unsigned c = cls[(unsigned char)s[i]];
        if (c == 0 || (c & prev & 2))   /* not allowed, or ".." */
            return 0;
        prev = c;
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

const struct conf_route *route_match_in(const struct conf *c, int how,
                                        const char *path, size_t pathlen,
                                        const char *method, size_t methodlen,
                                        const char *host, size_t hostlen,
                                        struct route_captures *caps)
{
    if (caps)
        caps->over_limit = NULL;
    for (int i = 0; i < c->nroutes; i++) {
        const struct conf_route *r = &c->routes[i];
        if (((how & ROUTE_PROXIED) && r->upstream == NULL) || (r->grpc && !(how & ROUTE_GRPC)))
            continue;
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

const struct conf_route *route_match(const struct conf *c,
                                     const char *path, size_t pathlen,
                                     const char *method, size_t methodlen,
                                     const char *host, size_t hostlen,
                                     struct route_captures *caps)
{
    return route_match_in(c, 0, path, pathlen, method, methodlen, host, hostlen, caps);
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
    struct digest *sha;         /* HASH: SHA-1 */
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
        digest_update(k->sha, p, n);
    } else {
        route_put(k->out, p, n);
    }
}

/* One part, located in the request but not yet copied. */
enum route_part_kind { ROUTE_PART_SPAN, ROUTE_PART_QUERY, ROUTE_PART_COOKIE, ROUTE_PART_NUMBER,
                       ROUTE_PART_ANON };

struct route_part {
    enum route_part_kind kind;
    const char *p;              /* SPAN: the bytes; QUERY, COOKIE: the raw value;
                                 * NUMBER: a capture route_number_span took */
    size_t n;
    char net[ADDR_NET_MAX];     /* an ip/N source's network, p points here */
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

/* ---- numeric captures ---- */

/* The first code point of each run of ten decimal digits (Unicode 14's Nd,
 * every run 0..9 in order): Python's int() reads all of them, so "\uff17"
 * (a full-width 7) is 7 to a Flask or Django upstream. */
static const long route_digit_zero[] = {
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6,
    0xD66, 0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0,
    0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0,
    0xA9F0, 0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136,
    0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950,
    0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
    0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
};

/* The digit's value, or -1: a binary search for the last run starting at
 * or before cp (a capture may hold thousands of code points). */
static int route_digit(long cp)
{
    size_t lo = 0, hi = sizeof route_digit_zero / sizeof route_digit_zero[0];
    if (cp >= '0' && cp <= '9')
        return (int)(cp - '0');
    if (cp < route_digit_zero[1])
        return -1;
    while (hi - lo > 1) {               /* route_digit_zero[lo] <= cp */
        size_t mid = lo + (hi - lo) / 2;
        if (route_digit_zero[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return cp < route_digit_zero[lo] + 10 ? (int)(cp - route_digit_zero[lo]) : -1;
}

/* What Python's int() strips around a number: str.isspace() but for
 * U+001C..U+001F. */
static int route_space(long cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* The code point at s[*i] of well-formed UTF-8, *i moved past it; -1 (and
 * one byte) for anything else. */
static long route_utf8(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s + *i;
    size_t left = n - *i, len;
    long cp, min;
    if (u[0] < 0x80) {
        (*i)++;
        return u[0];
    }
    if (u[0] >= 0xc2 && u[0] <= 0xdf)
        len = 2, cp = u[0] & 0x1f, min = 0x80;
    else if (u[0] >= 0xe0 && u[0] <= 0xef)
        len = 3, cp = u[0] & 0x0f, min = 0x800;
    else if (u[0] >= 0xf0 && u[0] <= 0xf4)
        len = 4, cp = u[0] & 0x07, min = 0x10000;
    else
        len = 0, cp = -1, min = 0;
    if (len == 0 || len > left) {
        (*i)++;
        return -1;
    }
    for (size_t k = 1; k < len; k++) {
        if ((u[k] & 0xc0) != 0x80) {
            (*i)++;
            return -1;
        }
        cp = cp << 6 | (u[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        (*i)++;
        return -1;
    }
    *i += len;
    return cp;
}

/* A capture an int() reads as a number: whitespace around it, one '+' or
 * '-', decimal digits of any script with single '_' between them. 1 with
 * the span from the sign to the last digit, 0 when it is not one. */
static int route_number_span(const char *s, size_t n, size_t *off, size_t *len)
{
    enum { LEAD, SIGN, DIGIT, UNDERSCORE, TRAIL } st = LEAD;
    size_t i = 0, from = 0, to = 0;
    while (i < n) {
        size_t at = i;
        long cp = route_utf8(s, n, &i);
        if (route_space(cp) && (st == LEAD || st == DIGIT || st == TRAIL)) {
            st = st == LEAD ? LEAD : TRAIL;
        } else if ((cp == '+' || cp == '-') && st == LEAD) {
            st = SIGN;
            from = at;
        } else if (route_digit(cp) >= 0 && st != TRAIL) {
            if (st == LEAD)
                from = at;
            st = DIGIT;
            to = i;
        } else if (cp == '_' && st == DIGIT) {
            st = UNDERSCORE;
        } else {
            return 0;
        }
    }
    if (st != DIGIT && st != TRAIL)
        return 0;
    *off = from;
    *len = to - from;
    return 1;
}

/* A number's key: '-' when negative, its ASCII digits without leading zeros
 * ("+007", " \uff17\n" and "7" are all "7"; "-0" is "0"). */
static void route_number_emit(const char *s, size_t n, struct route_sink *k)
{
    char chunk[64];
    size_t used = 0, i = 0;
    int started = 0;
    for (size_t j = 0; j < n && !started;)
        started = route_digit(route_utf8(s, n, &j)) > 0;
    if (!started) {
        route_sink_put(k, "0", 1);
        return;
    }
    if (s[0] == '-')
        chunk[used++] = '-';
    started = 0;
    while (i < n) {
        int d = route_digit(route_utf8(s, n, &i));
        if (d < 0 || (d == 0 && !started))
            continue;                   /* the sign, '_', a leading zero */
        started = 1;
        chunk[used++] = (char)('0' + d);
        if (used == sizeof chunk) {
            route_sink_put(k, chunk, used);
            used = 0;
        }
    }
    route_sink_put(k, chunk, used);
}

/* A cookie value decodes %XX but keeps '+': Express and most cookie
 * libraries decode it so, and "a%2Bb" must key as "a+b". */
static void route_part_emit(const struct route_part *pt, struct route_sink *k)
{
    if (pt->kind == ROUTE_PART_SPAN) {
        route_sink_put(k, pt->p, pt->n);
        return;
    }
    if (pt->kind == ROUTE_PART_NUMBER) {
        route_number_emit(pt->p, pt->n, k);
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
    if (pt->kind == ROUTE_PART_ANON) {      /* no "<len>:": no claim can write it */
        route_put(o, ROUTE_JWT_ANON, sizeof ROUTE_JWT_ANON - 1);
        return;
    }
    route_part_emit(pt, &k);
    char num[32];
    if (k.len > ROUTE_MAX_PART || (k.len == 41 && k.first == '#')) {
        char hex[DIGEST_SHA1_HEX + 1];
        k.mode = ROUTE_SINK_HASH;
        k.sha = digest_sha1();
        route_part_emit(pt, &k);
        digest_final_hex(k.sha, hex);
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

/* How often a key source occurs: absent, once, or more (ambiguous); or
 * present in a form refused (a capture with a control byte). */
enum route_seen { ROUTE_ABSENT, ROUTE_ONCE, ROUTE_TWICE, ROUTE_BAD };

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
/* A ']' in the rest of a name, decoded, before a decoded NUL. */
static int route_name_closes(const char *s, size_t n, size_t i)
{
    while (i < n) {
        unsigned char ch = route_qnext(s, n, &i);
        if (ch == ']' || ch == '\0')
            return ch == ']';
    }
    return 0;
}

static unsigned char route_name_fold(unsigned char ch)
{
    return ch == ' ' || ch == '.' || ch == '[' ? '_' : ch;
}

/* The raw query parameter or cookie name s[0..n) names want, read as PHP
 * reads names (Rack, Go and Python decode them the same way and fold
 * nothing, so each of their names is PHP's too): %XX and '+' decoded, a
 * decoded NUL ends the name, leading spaces dropped, ' ' and '.' are '_';
 * a '[' with a ']' after it makes an array of the name before it (another
 * name), one without is '_' and so are ' ', '.' and '[' after it (PHP 8).
 * want is folded the same way, so "query:api.key" is PHP's api_key. */
static int route_name_is(const char *s, size_t n, const char *want, size_t wantlen)
{
    size_t i = 0, k = 0;
    int lead = 1, opened = 0;
    while (i < n) {
        unsigned char ch = route_qnext(s, n, &i);
        if (ch == '\0')
            break;
        if (lead && ch == ' ')
            continue;
        lead = 0;
        if (ch == '[' && !opened) {
            if (route_name_closes(s, n, i))
                return 0;
            opened = 1;
        }
        if (k == wantlen || route_name_fold(ch) != route_name_fold((unsigned char)want[k]))
            return 0;
        k++;
    }
    return k == wantlen;
}

/* The end of the pair that starts s[0..n): the first of seps, or n. */
static size_t route_pair_len(const char *s, size_t n, const char *seps)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != '\0' && strchr(seps, s[i]) != NULL)
            return i;
    return n;
}

/* The parameter named name (route_name_is) in the raw query of the
 * target, pairs split at '&' and at ';' (Rack 2, Go before 1.17, Python
 * before 3.9.2); its raw value (decoded later, while it is written) into
 * *v. Twice, under any spelling, is ambiguous: Flask reads the first, PHP
 * and Rails the last. */
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
        size_t plen = route_pair_len(q, qlen, "&;");
        const char *eq = memchr(q, '=', plen);
        size_t nlen = eq != NULL ? (size_t)(eq - q) : plen;
        if (plen > 0 && route_name_is(q, nlen, name, namelen)) {
            if (seen == ROUTE_ONCE)
                return ROUTE_TWICE;
            *v = eq != NULL ? eq + 1 : q + plen;
            *vlen = eq != NULL ? plen - nlen - 1 : 0;
            seen = ROUTE_ONCE;
        }
        if (plen == qlen)
            break;
        q += plen + 1;
        qlen -= plen + 1;
    }
    return seen;
}

/* The cookie named name in the Cookie field(s): "a=1; b=2", and split at
 * ',' too ("a=1, b=2": RFC 2109, Rack 2); its name read as route_name_is
 * reads it (PHP before 8.0 and Rack 2 decode cookie names, PHP folds them).
 * Its value with surrounding whitespace and one pair of DQUOTEs (RFC 6265's
 * quoted form) taken off; %XX is decoded as it is written. Twice, in one
 * field or across two, is ambiguous. */
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
            size_t plen = route_pair_len(s, n, ";,");
            const char *eq = memchr(s, '=', plen);
            if (eq != NULL) {
                const char *cn = s, *cv = eq + 1;
                size_t cnlen = (size_t)(eq - s), cvlen = plen - cnlen - 1;
                route_trim(&cn, &cnlen);
                route_trim(&cv, &cvlen);
                if (route_name_is(cn, cnlen, name, namelen)) {
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
            if (plen == n)
                break;
            s += plen + 1;
            n -= plen + 1;
        }
    }
    return seen;
}

/* A path key's length: without trailing '/' (a prefix route meets /a and
 * /a/ alike) and trailing ASCII whitespace (%20, %0A...), "/" staying. */
static size_t route_path_key_len(const char *p, size_t n)
{
    while (n > 1 && (p[n - 1] == '/' || (p[n - 1] <= ' ' && route_space(p[n - 1]))))
        n--;
    return n;
}

/* A capture: a number (route_number_span) keys as its value; anything
 * else as its bytes, and one holding a control byte is refused. */
static enum route_seen route_capture(const char *p, size_t n, struct route_part *pt)
{
    size_t off, len;
    if (route_number_span(p, n, &off, &len)) {
        pt->kind = ROUTE_PART_NUMBER;
        pt->p = p + off;
        pt->n = len;
        return ROUTE_ONCE;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            return ROUTE_BAD;
    pt->p = p;
    pt->n = n;
    return ROUTE_ONCE;
}

int route_grpc_call(const char *buf, const struct http1_head *h, int64_t *timeout_ms)
{
    *timeout_ms = 0;
    int i = http1_find(buf, h, "content-type", 0);
    if (i < 0)
        return 0;
    struct http1_span v = h->h[i].value;
    if (v.len < 16 || strncasecmp(buf + v.off, "application/grpc", 16) != 0 ||
        (v.len > 16 && buf[v.off + 16] != '+' && buf[v.off + 16] != ';'))
        return 0;
    /* TimeoutValue (1 to 8 digits) and TimeoutUnit (PROTOCOL-HTTP2.md) */
    i = http1_find(buf, h, "grpc-timeout", 0);
    if (i >= 0 && h->h[i].value.len >= 2 && h->h[i].value.len <= 9) {
        static const struct { char unit; int64_t per_ms_num, per_ms_den; } units[] = {
            { 'H', 3600000, 1 }, { 'M', 60000, 1 }, { 'S', 1000, 1 }, { 'm', 1, 1 },
            { 'u', 1, 1000 }, { 'n', 1, 1000000 },
        };
        struct http1_span d = { h->h[i].value.off, h->h[i].value.len - 1 };
        char unit = buf[d.off + d.len];
        int64_t n;
        for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++)
            if (units[u].unit == unit && http1_span_uint(buf, d, &n)) {
                int64_t den = units[u].per_ms_den;
                *timeout_ms = (n * units[u].per_ms_num + den - 1) / den;
                if (*timeout_ms == 0)
                    *timeout_ms = 1;
            }
    }
    return 1;
}

/* A gRPC call's path is /package.Service/Method: its service (method 0) or
 * its method, absent from a path of another shape. */
static enum route_seen route_grpc_part(const char *path, size_t len, int method,
                                       const char **p, size_t *n)
{
    const char *slash = len > 1 && path[0] == '/' ? memchr(path + 1, '/', len - 1) : NULL;
    if (slash == NULL || slash == path + 1 || slash == path + len - 1 ||
        memchr(slash + 1, '/', len - (size_t)(slash + 1 - path)) != NULL)
        return ROUTE_ABSENT;
    *p = method ? slash + 1 : path + 1;
    *n = method ? len - (size_t)(slash + 1 - path) : (size_t)(slash - path - 1);
    return ROUTE_ONCE;
}

/* Locate key source ks in the request. */
static enum route_seen route_locate(const struct conf_keysrc *ks, const struct route_req *req,
                                    struct route_part *pt)
{
    memset(pt, 0, sizeof *pt);
    pt->kind = ROUTE_PART_SPAN;
    switch (ks->kind) {
    case CONF_KEY_IP:
        if (req->ip == NULL)
            return ROUTE_ABSENT;
        pt->p = req->ip;
        pt->n = req->iplen;
        if (ks->net) {
            pt->p = pt->net;
            pt->n = addr_net(req->ip, ks->bits4, ks->bits6, pt->net);
        }
        return ROUTE_ONCE;
    case CONF_KEY_METHOD:
        pt->p = req->buf + req->h->method.off;
        pt->n = req->h->method.len;
        return ROUTE_ONCE;
    case CONF_KEY_PATH:
        pt->p = req->path;
        pt->n = route_path_key_len(req->path, req->pathlen);
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
        return route_capture(req->path + req->caps->off[ks->capture],
                             req->caps->len[ks->capture], pt);
    case CONF_KEY_GRPC_SERVICE:
    case CONF_KEY_GRPC_METHOD:
        if (req->path == NULL)
            return ROUTE_ABSENT;
        return route_grpc_part(req->path, req->pathlen, ks->kind == CONF_KEY_GRPC_METHOD,
                               &pt->p, &pt->n);
    case CONF_KEY_JWT:
        if (req->claims == NULL) {      /* no token, or one that failed */
            pt->kind = ROUTE_PART_ANON;
            return ROUTE_ONCE;
        }
        return route_jwt_claim(req, ks->arg, ks->arglen, &pt->p, &pt->n) ? ROUTE_ONCE
                                                                          : ROUTE_ABSENT;
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
        if (seen == ROUTE_BAD)
            return ROUTE_KEY_BAD;
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

/* "!ip|" cannot start the parts of route_key's keys (each starts with its
 * length), so no key value can reach the fallback's counter. */
long route_key_fallback(const struct conf *c, const struct conf_route *r,
                        const struct conf_limit *l, const struct route_req *req, char *out)
{
    struct route_out o = { .p = out };
    struct route_part pt = { .kind = ROUTE_PART_SPAN, .p = req->ip,
                             .n = req->ip != NULL ? req->iplen : 0 };
    route_key_open(&o, c, r, l);
    route_put(&o, "!ip|", 4);
    route_put_part(&o, &pt);
    return route_key_close(&o, out);
}

long route_part_key(const struct conf *c, const struct conf_route *r,
                    const struct conf_limit *l, const char *key, size_t keylen, char *out)
{
    size_t head = strlen(c->redis.prefix) + 1 + strlen(r->name) + 1, name = strlen(l->name);
    if (keylen < head + name + 1 || key[head + name] != '|' ||
        memcmp(key + head, l->name, name) != 0)
        return -1;
    memcpy(out, key, head);
    memcpy(out + head, key + head + name, keylen - head - name);
    out[keylen - name] = '\0';
    return (long)(keylen - name);
}

/* The key route_key() writes for a request whose key sources give exactly
 * parts[0..n) (decoded values: a query parameter or cookie as the upstream
 * reads it; a path or a numeric capture in any of the spellings route_key
 * folds): config overrides and the admin API name keys this way. */
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
        if (l->keys[i].kind == CONF_KEY_PATH)
            pt.n = route_path_key_len(pt.p, pt.n);
        else if (l->keys[i].kind == CONF_KEY_CAPTURE)
            route_capture(parts[i], lens[i], &pt);      /* refused: its bytes */
        route_put_part(&o, &pt);
    }
    return route_key_close(&o, out);
}

long route_key_value(const struct conf_keysrc *ks, const struct route_req *req, char *out)
{
    struct route_part pt;
    enum route_seen seen = route_locate(ks, req, &pt);
    if (seen == ROUTE_TWICE)
        return ROUTE_KEY_AMBIGUOUS;
    if (seen == ROUTE_BAD)
        return ROUTE_KEY_BAD;
    if (seen == ROUTE_ABSENT || pt.kind == ROUTE_PART_ANON)    /* no verified token */
        return -1;
    struct route_sink k = { .mode = ROUTE_SINK_MEASURE, .first = -1 };
    route_part_emit(&pt, &k);
    if (k.len > ROUTE_MAX_PART)
        return -1;
    struct route_out o = { .p = out };
    k.mode = ROUTE_SINK_WRITE;
    k.out = &o;
    route_part_emit(&pt, &k);
    out[o.len] = '\0';
    return (long)o.len;
}

int route_jwt_claim(const struct route_req *req, const char *name, size_t namelen,
                    const char **v, size_t *vlen)
{
    return req->claims != NULL && jwt_claim(req->claims, req->claims_len, name, namelen, v, vlen);
}

/* "Bearer" is a case-insensitive scheme (RFC 7235), then one or more
 * spaces and the token; anything after the token makes it none. */
int route_jwt_token(const struct conf *c, const struct route_req *req, const char **tok,
                    size_t *len)
{
    const char *v;
    size_t n;
    int found = 0, fields = 0;
    for (int i = 0; i < req->h->nheaders; i++) {
        if (!route_header_is(req->buf, req->h, i, "authorization", 13))
            continue;
        if (fields++ > 0)
            return -1;
        route_header_value(req->buf, req->h, i, &v, &n);
        found = n > 7 && route_caseeq(v, 6, "bearer", 6) && v[6] == ' ';
        if (!found)
            continue;
        for (v += 7, n -= 7; n > 0 && v[0] == ' '; v++, n--)
            ;
        *tok = v;
        *len = n;
        if (n == 0 || memchr(v, ' ', n) != NULL || memchr(v, '\t', n) != NULL)
            return -1;
    }
    if (found)
        return 1;
    if (c->jwt.cookie == NULL)
        return 0;
    enum route_seen seen = route_find_cookie(req, c->jwt.cookie, strlen(c->jwt.cookie), tok, len);
    return seen == ROUTE_TWICE ? -1 : seen == ROUTE_ONCE && *len > 0;
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
