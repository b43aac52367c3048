/* sluice - addr.c: host:port, CIDR and X-Forwarded-For, for conf, route and
 * store.
 *
 * Grammars are strict: ports are digits only, CIDR prefixes digits only,
 * X-Forwarded-For entries addresses with an optional port; a NUL in the
 * bytes never reaches inet_pton. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "addr.h"

/* s[0..n) as a decimal of at most maxdigits digits: 0 and *v, or -1. */
static int addr_number(const char *s, size_t n, size_t maxdigits, long *v)
{
    long x = 0;
    if (n == 0 || n > maxdigits)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return 0;
}

int addr_port(const char *s, size_t n, int *port)
{
    long v;
    if (addr_number(s, n, 5, &v) < 0 || v < 1 || v > 65535)
        return -1;
    *port = (int)v;
    return 0;
}

int addr_split(const char *s, char *host, size_t hostsize, int *port)
{
    const char *hs = s, *he, *ps;
    int form;
    if (s[0] == '[') {
        hs = s + 1;
        he = strchr(hs, ']');
        if (!he || he[1] != ':')
            return -1;
        ps = he + 2;
        form = ADDR_V6_PORT;
    } else {
        he = strrchr(s, ':');
        if (!he)
            return -1;
        ps = he + 1;
        form = memchr(s, ':', (size_t)(he - s)) ? ADDR_LAST_COLON : ADDR_HOST_PORT;
    }
    if (he == hs || (size_t)(he - hs) >= hostsize || addr_port(ps, strlen(ps), port) < 0)
        return -1;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    return form;
}

/* ---- CIDR ---- */

/* Clear the bits of a[0..max/8) past the first bits. */
static void addr_mask(uint8_t *a, int max, int bits)
{
    for (int i = 0; i < max / 8; i++) {
        int keep = bits - i * 8;
        if (keep <= 0)
            a[i] = 0;
        else if (keep < 8)
            a[i] &= (uint8_t)(0xff00 >> keep);
    }
}

int addr_cidr_parse(const char *s, struct addr_cidr *out)
{
    char host[INET6_ADDRSTRLEN];
    const char *slash = strchr(s, '/');
    size_t hl = slash ? (size_t)(slash - s) : strlen(s);
    long bits;
    int max;
    memset(out, 0, sizeof *out);
    if (hl == 0 || hl >= sizeof host)
        return -1;
    memcpy(host, s, hl);
    host[hl] = '\0';
    if (inet_pton(AF_INET, host, out->addr) == 1)
        out->family = AF_INET, max = 32;
    else if (inet_pton(AF_INET6, host, out->addr) == 1)
        out->family = AF_INET6, max = 128;
    else
        return -1;
    bits = max;
    if (slash && (addr_number(slash + 1, strlen(slash + 1), 3, &bits) < 0 || bits > max))
        return -1;
    out->bits = (int)bits;
    addr_mask(out->addr, max, (int)bits);
    return 0;
}

static int addr_prefix_eq(const uint8_t *a, const uint8_t *b, int bits)
{
    int full = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)full))
        return 0;
    if (rest) {
        uint8_t mask = (uint8_t)(0xff00 >> rest);
        return (a[full] & mask) == (b[full] & mask);
    }
    return 1;
}

int addr_cidr_match(const struct addr_cidr *cidrs, int n, const struct sockaddr *addr)
{
    static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    uint8_t v4[4], v6[16];
    int has4 = 0;
    if (!addr)
        return 0;
    if (addr->sa_family == AF_INET) {
        struct sockaddr_in sin;
        memcpy(&sin, addr, sizeof sin);
        memcpy(v4, &sin.sin_addr, 4);
        memcpy(v6, mapped, 12);
        memcpy(v6 + 12, v4, 4);
        has4 = 1;
    } else if (addr->sa_family == AF_INET6) {
        struct sockaddr_in6 sin6;
        memcpy(&sin6, addr, sizeof sin6);
        memcpy(v6, &sin6.sin6_addr, 16);
        if (!memcmp(v6, mapped, 12)) {
            memcpy(v4, v6 + 12, 4);
            has4 = 1;
        }
    } else {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (cidrs[i].family == AF_INET && has4 && addr_prefix_eq(v4, cidrs[i].addr, cidrs[i].bits))
            return 1;
        if (cidrs[i].family == AF_INET6 && addr_prefix_eq(v6, cidrs[i].addr, cidrs[i].bits))
            return 1;
    }
    return 0;
}

/* ---- the client address ---- */

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) becomes AF_INET, so that it
 * is written, matched against CIDRs and counted like the IPv4 it is. */
static void addr_fold_mapped(struct sockaddr_storage *ss)
{
    if (ss->ss_family != AF_INET6)
        return;
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    if (!IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
        return;
    struct sockaddr_in s4;
    memset(&s4, 0, sizeof s4);
    s4.sin_family = AF_INET;
    s4.sin_port = s6->sin6_port;
    memcpy(&s4.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
    memset(ss, 0, sizeof *ss);
    memcpy(ss, &s4, sizeof s4);
}

int addr_from_peer(const struct sockaddr *peer, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (peer == NULL || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6))
        return -1;
    memcpy(ss, peer, peer->sa_family == AF_INET
           ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
    addr_fold_mapped(ss);
    return 0;
}

static int addr_pton(int family, const char *text, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        return inet_pton(AF_INET, text, &s4->sin_addr) == 1 ? 0 : -1;
    }
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    s6->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, text, &s6->sin6_addr) != 1)
        return -1;
    addr_fold_mapped(ss);
    return 0;
}

/* One X-Forwarded-For entry: "1.2.3.4", "1.2.3.4:5678", "2001:db8::1",
 * "[2001:db8::1]" or "[2001:db8::1]:443". 0 with *ss set, or -1. */
static int addr_parse_entry(const char *s, size_t n, struct sockaddr_storage *ss)
{
    char tmp[ADDR_IP_MAX];
    int port;
    if (n == 0 || n >= sizeof tmp || memchr(s, '\0', n) != NULL)
        return -1;                      /* a NUL would cut inet_pton's string */

    if (s[0] == '[') {
        const char *end = memchr(s, ']', n);
        if (end == NULL)
            return -1;
        size_t hlen = (size_t)(end - s) - 1;
        size_t rest = n - hlen - 2;
        if (rest > 0 && (end[1] != ':' || addr_port(end + 2, rest - 1, &port) < 0))
            return -1;
        memcpy(tmp, s + 1, hlen);
        tmp[hlen] = '\0';
        return addr_pton(AF_INET6, tmp, ss);
    }
    const char *colon = memchr(s, ':', n);
    if (colon != NULL && memchr(colon + 1, ':', n - (size_t)(colon + 1 - s)) == NULL) {
        size_t hlen = (size_t)(colon - s);
        if (addr_port(colon + 1, n - hlen - 1, &port) < 0)
            return -1;
        memcpy(tmp, s, hlen);
        tmp[hlen] = '\0';
        return addr_pton(AF_INET, tmp, ss);
    }
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    if (addr_pton(AF_INET, tmp, ss) == 0)
        return 0;
    return addr_pton(AF_INET6, tmp, ss);
}

static int addr_is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Every trusted entry becomes the candidate and the walk goes on; the first
 * untrusted entry is the client. An entry that is not an address stops the
 * walk and the candidate stands: the last trusted hop seen, the farthest
 * proxy we can still vouch for, or the peer when there was none. We do not
 * skip garbage, because what lies left of it was written by no one we
 * trust. When every entry is trusted the left-most one is the client. */
int addr_xff_walk(const struct addr_cidr *trusted, int ntrusted, const char *v, size_t n,
                  struct sockaddr_storage *client)
{
    size_t end = n;
    for (;;) {
        size_t start = end;
        while (start > 0 && v[start - 1] != ',')
            start--;
        const char *e = v + start;
        size_t elen = end - start;
        while (elen > 0 && addr_is_ows(e[0]))
            e++, elen--;
        while (elen > 0 && addr_is_ows(e[elen - 1]))
            elen--;
        struct sockaddr_storage ss;
        if (addr_parse_entry(e, elen, &ss) < 0)
            return 0;
        *client = ss;
        if (!addr_cidr_match(trusted, ntrusted, (const struct sockaddr *)&ss))
            return 0;
        if (start == 0)
            return 1;
        end = start - 1;                /* step over the ',' */
    }
}

size_t addr_ntop(const struct sockaddr_storage *ss, char *out)
{
    const void *a = ss->ss_family == AF_INET
        ? (const void *)&((const struct sockaddr_in *)ss)->sin_addr
        : (const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (inet_ntop(ss->ss_family, a, out, ADDR_IP_MAX) == NULL) {
        out[0] = '\0';
        return 0;
    }
    return strlen(out);
}

size_t addr_net(const char *ip, int bits4, int bits6, char *out)
{
    struct sockaddr_storage ss;
    uint8_t *a;
    int bits, max;
    if (addr_pton(AF_INET, ip, &ss) < 0 && addr_pton(AF_INET6, ip, &ss) < 0) {
        out[0] = '\0';
        return 0;
    }
    if (ss.ss_family == AF_INET) {      /* a mapped IPv6 was folded */
        a = (uint8_t *)&((struct sockaddr_in *)&ss)->sin_addr;
        bits = bits4, max = 32;
    } else {
        a = ((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
        bits = bits6, max = 128;
    }
    addr_mask(a, max, bits);
    size_t n = addr_ntop(&ss, out);
    if (n > 0 && bits < max) {
        out[n++] = '/';
        if (bits >= 100)
            out[n++] = (char)('0' + bits / 100);
        if (bits >= 10)
            out[n++] = (char)('0' + bits / 10 % 10);
        out[n++] = (char)('0' + bits % 10);
        out[n] = '\0';
    }
    return n;
}
