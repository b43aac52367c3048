/* sluice - fuzz_route_key.c: libFuzzer target for client address and key
 * building.
 *
 * Input: byte 0 picks the method, byte 1 the peer address (trusted or not,
 * IPv4, IPv6 or mapped) and HTTP/1.0 or 1.1 with a Host; then a line that is
 * the request target and lines that are headers (LF becomes CRLF, so the
 * fuzzer reaches valid heads). The head goes through http1_head_parse, the
 * path through route_normalize and route_match (a path_regex route gives
 * captures), the address through route_client_ip, and every limit of a
 * hand-built route (each key source alone, all six together, captures,
 * repeated sources) through route_key. Invariants:
 * - a key is "sluice:{ROUTE|LIMIT|PARTS}", shorter than ROUTE_MAX_KEY, NUL
 *   ended, and its PARTS parse back as exactly nkeys "<len>:<bytes>" parts
 *   with len <= ROUTE_MAX_PART, where "41:#..." is always 40 hex digits;
 * - ip, method, path (without trailing '/' and whitespace) and header parts
 *   are the values computed here (or their SHA-1 when long or shaped like a
 *   digest), so the encoding is one-to-one: equal keys mean equal parts mean
 *   equal values;
 * - a header source is ambiguous exactly when two fields carry its name
 *   ('-' and '_' alike), and then so is every limit that keys on it;
 * - the all-sources key is the single-source parts in order, ambiguous when
 *   one of them is, else absent (0) exactly when one of them is. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "http1.h"
#include "regex.h"
#include "route.h"
#include "sha1.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

#define KS(k, a) { .kind = k, .arg = a, .arglen = sizeof(a) - 1 }
#define KC(n) { .kind = CONF_KEY_CAPTURE, .capture = n }

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct conf_keysrc k_ip[] = { { .kind = CONF_KEY_IP } };
static struct conf_keysrc k_hdr[] = { KS(CONF_KEY_HEADER, "X-Api-Key") };
static struct conf_keysrc k_query[] = { KS(CONF_KEY_QUERY, "user") };
static struct conf_keysrc k_cookie[] = { KS(CONF_KEY_COOKIE, "sid") };
static struct conf_keysrc k_method[] = { { .kind = CONF_KEY_METHOD } };
static struct conf_keysrc k_path[] = { { .kind = CONF_KEY_PATH } };
static struct conf_keysrc k_all[] = {
    { .kind = CONF_KEY_IP }, KS(CONF_KEY_HEADER, "X-Api-Key"), KS(CONF_KEY_QUERY, "user"),
    KS(CONF_KEY_COOKIE, "sid"), { .kind = CONF_KEY_METHOD }, { .kind = CONF_KEY_PATH },
};
static struct conf_keysrc k_caps[] = { KC(1), KC(2), KS(CONF_KEY_HEADER, "a") };
static struct conf_keysrc k_rep[] = {
    KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_HEADER, "A"), KS(CONF_KEY_QUERY, "q"),
    KS(CONF_KEY_QUERY, "q"), KS(CONF_KEY_COOKIE, "c"),
};

enum { L_IP, L_HDR, L_QUERY, L_COOKIE, L_METHOD, L_PATH, L_ALL, L_CAPS, L_REP, NLIMITS };

static struct conf_limit limits[NLIMITS] = {
    { .name = "ip", .keys = k_ip, .nkeys = 1 },
    { .name = "hdr", .keys = k_hdr, .nkeys = 1 },
    { .name = "query", .keys = k_query, .nkeys = 1 },
    { .name = "cookie", .keys = k_cookie, .nkeys = 1 },
    { .name = "method", .keys = k_method, .nkeys = 1 },
    { .name = "path", .keys = k_path, .nkeys = 1 },
    { .name = "all", .keys = k_all, .nkeys = 6 },
    { .name = "caps", .keys = k_caps, .nkeys = 3 },
    { .name = "rep", .keys = k_rep, .nkeys = 5 },
};

static struct conf_route routes[2] = {
    { .name = "users", .ncaptures = 2, .limits = limits, .nlimits = NLIMITS },
    { .name = "default", .path = "/", .pathlen = 1, .limits = limits, .nlimits = NLIMITS },
};
static struct addr_cidr trusted[3];
static struct conf c = {
    .redis = { .prefix = "sluice:" }, .routes = routes, .nroutes = 2,
    .trusted = trusted, .ntrusted = 3,
};

static void cidr(struct addr_cidr *out, int family, const char *text, int bits)
{
    out->family = family;
    out->bits = bits;
    fuzz_check(inet_pton(family, text, out->addr) == 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char why[160];
    int groups = 0;
    routes[0].regex = regex_compile("^/users/([^/]+)(/.*)?$", &groups, why, sizeof why);
    fuzz_check(routes[0].regex != NULL && groups == 2);
    cidr(&trusted[0], AF_INET, "10.0.0.0", 8);
    cidr(&trusted[1], AF_INET6, "2001:db8::", 32);
    cidr(&trusted[2], AF_INET, "127.0.0.1", 32);
    return 0;
}

static void peer_from(uint8_t b, struct sockaddr_storage *ss)
{
    static const char *v4[] = { "10.1.2.3", "192.0.2.7" };
    static const char *v6[] = { "2001:db8::5", "2001:db9::5", "::ffff:10.9.9.9", "::ffff:198.51.100.1" };
    memset(ss, 0, sizeof *ss);
    if ((b & 4) == 0) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(40000);
        fuzz_check(inet_pton(AF_INET, v4[b & 1], &s4->sin_addr) == 1);
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(40000);
        fuzz_check(inet_pton(AF_INET6, v6[b & 3], &s6->sin6_addr) == 1);
    }
}

/* The head text: METHOD SP target SP version CRLF [Host] headers CRLF. */
static char *head_build(const uint8_t *data, size_t size, size_t *outlen)
{
    static const char *methods[] = { "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS" };
    const char *m = methods[data[0] % 7];
    int v11 = data[1] & 8;
    const uint8_t *t = data + 2, *end = data + size;
    const uint8_t *nl = memchr(t, '\n', (size_t)(end - t));
    const uint8_t *hs = nl ? nl + 1 : end;
    size_t cap = 64 + (size_t)(end - t) * 2 + 32, n = 0;
    char *b = malloc(cap);

    fuzz_check(b != NULL);
    n += (size_t)snprintf(b, cap, "%s ", m);
    memcpy(b + n, t, (size_t)((nl ? nl : end) - t));
    n += (size_t)((nl ? nl : end) - t);
    n += (size_t)snprintf(b + n, cap - n, " HTTP/1.%d\r\n%s", v11 ? 1 : 0,
                          v11 ? "Host: example.com\r\n" : "");
    for (const uint8_t *p = hs; p < end; p++) {
        if (*p == '\n')
            b[n++] = '\r';
        b[n++] = (char)*p;
    }
    if (hs < end && end[-1] != '\n') {
        b[n++] = '\r';
        b[n++] = '\n';
    }
    b[n++] = '\r';
    b[n++] = '\n';
    fuzz_check(n <= cap);
    *outlen = n;
    return b;
}

/* One decoded key: its parts as spans into the key. */
struct parsed {
    int n;
    size_t off[8], len[8];
};

static void key_parse(const char *k, long n, const struct conf_route *r,
                      const struct conf_limit *l, struct parsed *ps)
{
    char head[128];
    int hl = snprintf(head, sizeof head, "sluice:{%s|%s|", r->name, l->name);
    size_t i = (size_t)hl, end = (size_t)n - 1;

    fuzz_check(n > hl && n < ROUTE_MAX_KEY);
    fuzz_check(k[n] == '\0');
    fuzz_check(memcmp(k, head, (size_t)hl) == 0);
    fuzz_check(k[end] == '}');
    ps->n = 0;
    while (i < end) {
        size_t len = 0, digits = 0;
        while (i < end && k[i] >= '0' && k[i] <= '9') {
            fuzz_check(digits < 4 && !(digits == 1 && len == 0));  /* no leading 0 */
            len = len * 10 + (size_t)(k[i++] - '0');
            digits++;
        }
        fuzz_check(digits > 0 && i < end && k[i] == ':');
        i++;
        fuzz_check(len <= ROUTE_MAX_PART && len <= end - i);
        if (len == 41 && k[i] == '#')
            for (size_t j = 1; j < 41; j++)
                fuzz_check((k[i + j] >= '0' && k[i + j] <= '9') ||
                           (k[i + j] >= 'a' && k[i + j] <= 'f'));
        fuzz_check(ps->n < 8);
        ps->off[ps->n] = i;
        ps->len[ps->n] = len;
        ps->n++;
        i += len;
    }
    fuzz_check(i == end);
    fuzz_check(ps->n == l->nkeys);
}

/* Part p of key k is the encoding of value v. */
static void part_is(const char *k, const struct parsed *ps, int p, const char *v, size_t vlen)
{
    if (vlen > ROUTE_MAX_PART || (vlen == 41 && v[0] == '#')) {
        char hex[SHA1_HEX_BYTES];
        sha1_hex(v, vlen, hex);
        fuzz_check(ps->len[p] == 41 && k[ps->off[p]] == '#');
        fuzz_check(memcmp(k + ps->off[p] + 1, hex, 40) == 0);
    } else {
        fuzz_check(ps->len[p] == vlen);
        fuzz_check(vlen == 0 || memcmp(k + ps->off[p], v, vlen) == 0);
    }
}

/* A header name as key building compares it: lower case, '_' as '-'. */
static int name_fold_eq(const char *a, size_t alen, const char *b)
{
    if (alen != strlen(b))
        return 0;
    for (size_t i = 0; i < alen; i++) {
        char x = a[i] >= 'A' && a[i] <= 'Z' ? (char)(a[i] + 32) : a[i];
        if (x == '_')
            x = '-';
        if (x != b[i])
            return 0;
    }
    return 1;
}

/* How many fields key building should see for the header source name
 * (lower case, '-' spelling), and the trimmed value of the first. */
static int header_fields(const char *buf, const struct http1_head *h, const char *name,
                         const char **v, size_t *vlen)
{
    int n = 0;
    for (int i = 0; i < h->nheaders; i++) {
        if (!name_fold_eq(buf + h->h[i].name.off, h->h[i].name.len, name) || n++ > 0)
            continue;
        const char *s = buf + h->h[i].value.off;
        size_t sl = h->h[i].value.len;
        while (sl > 0 && (s[0] == ' ' || s[0] == '\t'))
            s++, sl--;
        while (sl > 0 && (s[sl - 1] == ' ' || s[sl - 1] == '\t'))
            sl--;
        *v = s;
        *vlen = sl;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    size_t blen;
    char *buf = head_build(data, size, &blen);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head *h = malloc(sizeof *h);
    char *path = NULL, *keys[NLIMITS] = { 0 };
    long kn[NLIMITS];
    struct parsed ps[NLIMITS];

    fuzz_check(h != NULL);
    if (http1_head_parse(p, buf, blen, 16384, 0, h) != 0)
        goto out;

    /* len + 1 bytes: route_normalize ends the path with a NUL (route.h). */
    path = malloc(h->target.len + 1);
    fuzz_check(path != NULL);
    long pl = route_normalize(buf + h->target.off, h->target.len, path);
    fuzz_check(pl < 0 || path[pl] == '\0');

    struct route_captures caps;
    memset(&caps, 0, sizeof caps);
    const struct conf_route *r = &routes[1];
    if (pl >= 0) {
        const char *host = h->host >= 0 ? buf + h->h[h->host].value.off : NULL;
        size_t hostlen = h->host >= 0 ? h->h[h->host].value.len : 0;
        r = route_match(&c, path, (size_t)pl, buf + h->method.off, h->method.len,
                        host, hostlen, &caps);
        fuzz_check(r != NULL);          /* the "/" route meets every path; users'
                                         * regex is far below any step limit */
        for (int i = 0; i < caps.n; i++)
            if (caps.set & (1u << i))
                fuzz_check(caps.off[i] + caps.len[i] <= (size_t)pl);
    }

    struct sockaddr_storage peer;
    char ip[ROUTE_IP_MAX];
    peer_from(data[1], &peer);
    size_t iplen = route_client_ip(&c, (struct sockaddr *)&peer, buf, h, ip);
    fuzz_check(iplen > 0 && iplen < ROUTE_IP_MAX && strlen(ip) == iplen);
    fuzz_check(strchr(ip, ':') != NULL || inet_pton(AF_INET, ip, &(struct in_addr){ 0 }) == 1);

    struct route_req req = {
        .buf = buf, .h = h, .ip = ip, .iplen = iplen,
        .path = pl >= 0 ? path : NULL, .pathlen = pl >= 0 ? (size_t)pl : 0,
        .caps = r == &routes[0] ? &caps : NULL,
    };
    for (int i = 0; i < NLIMITS; i++) {
        keys[i] = malloc(ROUTE_MAX_KEY);
        fuzz_check(keys[i] != NULL);
        kn[i] = route_key(&c, r, &limits[i], &req, keys[i]);
        /* short names: a key always fits; only a capture is refused */
        fuzz_check(kn[i] >= 0 || kn[i] == ROUTE_KEY_AMBIGUOUS ||
                   (kn[i] == ROUTE_KEY_BAD && i == L_CAPS));
        if (kn[i] > 0)
            key_parse(keys[i], kn[i], r, &limits[i], &ps[i]);
    }

    /* Sources that are always there, and their values. */
    fuzz_check(kn[L_IP] > 0 && kn[L_METHOD] > 0);
    part_is(keys[L_IP], &ps[L_IP], 0, ip, iplen);
    part_is(keys[L_METHOD], &ps[L_METHOD], 0, buf + h->method.off, h->method.len);
    fuzz_check((kn[L_PATH] > 0) == (pl >= 0));
    if (pl >= 0) {
        size_t kl = (size_t)pl;         /* without trailing '/' and ASCII whitespace */
        while (kl > 1 && (path[kl - 1] == '/' || path[kl - 1] == ' ' ||
                          (path[kl - 1] >= 0x09 && path[kl - 1] <= 0x0d)))
            kl--;
        part_is(keys[L_PATH], &ps[L_PATH], 0, path, kl);
    }
    const char *hv = NULL;
    size_t hvlen = 0;
    int nh = header_fields(buf, h, "x-api-key", &hv, &hvlen);
    fuzz_check(nh == 0 ? kn[L_HDR] == 0 : nh == 1 ? kn[L_HDR] > 0
                                                  : kn[L_HDR] == ROUTE_KEY_AMBIGUOUS);
    if (kn[L_HDR] > 0)
        part_is(keys[L_HDR], &ps[L_HDR], 0, hv, hvlen);
    if (header_fields(buf, h, "a", &hv, &hvlen) > 1)
        fuzz_check((kn[L_CAPS] == ROUTE_KEY_AMBIGUOUS || kn[L_CAPS] == ROUTE_KEY_BAD) &&
                   kn[L_REP] == ROUTE_KEY_AMBIGUOUS);
    fuzz_check(kn[L_CAPS] <= 0 || r == &routes[0]);

    /* All six: ambiguous when one is, else present exactly when each is,
     * made of the same parts. */
    int present = 1, ambiguous = 0;
    for (int i = L_IP; i <= L_PATH; i++) {
        present &= kn[i] > 0;
        ambiguous |= kn[i] == ROUTE_KEY_AMBIGUOUS;
    }
    fuzz_check((kn[L_ALL] == ROUTE_KEY_AMBIGUOUS) == ambiguous);
    fuzz_check(ambiguous || (kn[L_ALL] > 0) == present);
    if (present)
        for (int i = L_IP; i <= L_PATH; i++) {
            fuzz_check(ps[L_ALL].len[i] == ps[i].len[0]);
            fuzz_check(memcmp(keys[L_ALL] + ps[L_ALL].off[i], keys[i] + ps[i].off[0],
                              ps[i].len[0]) == 0);
        }
    /* Repeated sources give repeated parts. */
    if (kn[L_REP] > 0) {
        fuzz_check(ps[L_REP].len[0] == ps[L_REP].len[1]);
        fuzz_check(memcmp(keys[L_REP] + ps[L_REP].off[0], keys[L_REP] + ps[L_REP].off[1],
                          ps[L_REP].len[0]) == 0);
        fuzz_check(ps[L_REP].len[2] == ps[L_REP].len[3]);
    }

out:
    for (int i = 0; i < NLIMITS; i++)
        free(keys[i]);
    free(path);
    free(h);
    free(buf);
    http1_destroy(p);
    return 0;
}
