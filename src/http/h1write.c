/* sluice - h1write.c: rewriting heads between client and upstream.
 *
 * The request head goes up with hop-by-hop fields (RFC 9110 7.6.1) and those
 * sluice sets itself removed, and the framing written from the parse; the
 * response head comes back the same way. `Connection` may name end-to-end
 * fields to drop, but never the framing or Host: a message asking for that
 * is refused (request smuggling through `Connection: Content-Length`). */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "h1write.h"
#include "obuf.h"

/* Fields of a head that Connection names, found in one pass. */
#define CN_BUCKETS 256

struct conn_names {
    int any;                            /* named[] holds something */
    uint8_t named[HTTP1_MAX_HEADERS];   /* field i is named */
};

/* The first byte's test (with bit 5 set, equal for both cases of a letter)
 * spares most strncasecmp calls between names of the same length. */
static int span_eq(const char *buf, struct http1_span s, const char *lit, size_t n)
{
    return s.len == n && (n == 0 || (buf[s.off] | 0x20) == (lit[0] | 0x20)) &&
           strncasecmp(buf + s.off, lit, n) == 0;
}

/* Against a string literal, its length known at compile time. */
#define span_is(buf, s, lit) span_eq((buf), (s), "" lit, sizeof(lit) - 1)

/* The next token of a comma-separated field value (between *v and end):
 * sets *t to it and returns its length, 0 once the value is used up. */
static size_t list_token(const char **v, const char *end, const char **t)
{
    while (*v < end && (**v == ' ' || **v == '\t' || **v == ','))
        (*v)++;
    *t = *v;
    while (*v < end && **v != ',' && **v != ' ' && **v != '\t')
        (*v)++;
    return (size_t)(*v - *t);
}

static int token_eq(const char *t, size_t n, const char *lit, size_t litlen)
{
    return litlen == n && strncasecmp(t, lit, n) == 0;
}

#define token_is(t, n, lit) token_eq((t), (n), "" lit, sizeof(lit) - 1)

/* FNV-1a over the lower-cased bytes. */
static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t hsh = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 'A' && ch <= 'Z')
            ch += 32;
        hsh = (hsh ^ ch) * 16777619u;
    }
    return hsh;
}

struct names_index {
    int16_t bucket[CN_BUCKETS], next[HTTP1_MAX_HEADERS], canon[HTTP1_MAX_HEADERS];
    uint32_t hash[HTTP1_MAX_HEADERS];
};

/* Distinct field names hashed, so that each Connection token is looked up
 * once: thousands of tokens cost time linear in the head, not tokens x
 * fields. canon[i] is the first field with field i's name. */
static void names_index(const char *buf, const struct http1_head *h, struct names_index *ix)
{
    memset(ix->bucket, 0xff, sizeof(ix->bucket));   /* -1: empty */
    memset(ix->next, 0xff, sizeof(ix->next));
    for (int i = 0; i < h->nheaders; i++) {
        struct http1_span nm = h->h[i].name;
        ix->hash[i] = name_hash(buf + nm.off, nm.len);
        ix->canon[i] = (int16_t)i;
        int16_t *b = &ix->bucket[ix->hash[i] % CN_BUCKETS];
        for (int j = *b; j >= 0; j = ix->next[j])
            if (ix->hash[j] == ix->hash[i] && h->h[j].name.len == nm.len &&
                strncasecmp(buf + h->h[j].name.off, buf + nm.off, nm.len) == 0) {
                ix->canon[i] = (int16_t)j;
                break;
            }
        if (ix->canon[i] == i) {
            ix->next[i] = *b;
            *b = (int16_t)i;
        }
    }
}

static int is_hop_by_hop(const char *buf, struct http1_span name);

/* The fields that Connection names. The parse said whether a token names a
 * field that is not hop-by-hop (such fields are dropped whatever Connection
 * says; "close" is not one): most heads have none, and then nothing here
 * reads the head again. */
static void connection_names(const char *buf, const struct http1_head *h,
                             struct conn_names *cn)
{
    struct names_index ix;
    int16_t conn[HTTP1_MAX_HEADERS];
    int nconn = 0;

    cn->any = 0;
    if (!(h->conn_names & HTTP1_CONN_OTHER))
        return;
    for (int i = 0; i < h->nheaders; i++)
        if (span_is(buf, h->h[i].name, "connection"))
            conn[nconn++] = (int16_t)i;
    uint8_t named[HTTP1_MAX_HEADERS] = { 0 };
    names_index(buf, h, &ix);
    for (int k = 0; k < nconn; k++) {
        int i = conn[k];
        const char *v = buf + h->h[i].value.off, *end = v + h->h[i].value.len, *t;
        for (size_t n; (n = list_token(&v, end, &t)) > 0;) {
            if (is_hop_by_hop(buf, (struct http1_span){ (uint32_t)(t - buf), (uint32_t)n }))
                continue;
            uint32_t th = name_hash(t, n);
            for (int j = ix.bucket[th % CN_BUCKETS]; j >= 0; j = ix.next[j])
                if (ix.hash[j] == th && h->h[j].name.len == n &&
                    strncasecmp(buf + h->h[j].name.off, t, n) == 0) {
                    named[j] = 1;
                    break;
                }
        }
    }
    for (int i = 0; i < h->nheaders; i++)
        cn->named[i] = named[ix.canon[i]];
    cn->any = 1;
}

/* Hop-by-hop fields, and the framing that is written from the parse. */
static int is_hop_by_hop(const char *buf, struct http1_span name)
{
#define HOP(lit) { lit, sizeof(lit) - 1 }
    static const struct { const char *s; size_t n; } hop[] = {
        HOP("connection"), HOP("keep-alive"), HOP("proxy-connection"), HOP("te"),
        HOP("trailer"), HOP("transfer-encoding"), HOP("upgrade"), HOP("content-length"),
    };
#undef HOP
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (span_eq(buf, name, hop[i].s, hop[i].n))
            return 1;
    return 0;
}

/* Fields a client outside trusted_proxies may not set for the upstream. */
static int is_proxy_field(const char *buf, struct http1_span name)
{
    return span_is(buf, name, "forwarded") || span_is(buf, name, "x-real-ip") ||
           span_is(buf, name, "x-forwarded-host") || span_is(buf, name, "x-forwarded-port");
}

static int has_underscore(const char *buf, struct http1_span name)
{
    return memchr(buf + name.off, '_', name.len) != NULL;
}

/* The upstream's own rate-limit fields, merged by the caller. */
static int is_limit_field(const char *buf, struct http1_span name, enum conf_headers mode)
{
    int legacy = mode == CONF_HEADERS_FULL || mode == CONF_HEADERS_LEGACY;
    int ietf = mode == CONF_HEADERS_FULL || mode == CONF_HEADERS_IETF;
    return (legacy && (span_is(buf, name, "x-ratelimit-limit") ||
                       span_is(buf, name, "x-ratelimit-remaining") ||
                       span_is(buf, name, "x-ratelimit-reset"))) ||
           (ietf && (span_is(buf, name, "ratelimit") ||
                     span_is(buf, name, "ratelimit-policy")));
}

static void copy_field(struct obuf *out, const char *buf, const struct http1_header *hd)
{
    obuf_add(out, buf + hd->name.off, hd->name.len);
    obuf_add(out, ": ", 2);
    obuf_add(out, buf + hd->value.off, hd->value.len);
    obuf_add(out, "\r\n", 2);
}

static void add_field(struct obuf *out, const char *name, const char *v, size_t n)
{
    obuf_str(out, name);
    obuf_add(out, ": ", 2);
    obuf_add(out, v, n);
    obuf_add(out, "\r\n", 2);
}

static void add_length(struct obuf *out, uint64_t n)
{
    OBUF_LIT(out, "Content-Length: ");
    obuf_int(out, (int64_t)n);
    OBUF_LIT(out, "\r\n");
}

/* ---- request ------------------------------------------------------------ */

int h1write_request_check(const char *buf, const struct http1_head *h,
                          enum conf_underscore underscore)
{
    if (h->conn_names & (HTTP1_CONN_CL | HTTP1_CONN_TE | HTTP1_CONN_HOST))
        return 400;
    if (underscore == CONF_UNDERSCORE_REJECT)
        for (int i = 0; i < h->nheaders; i++)
            if (has_underscore(buf, h->h[i].name))
                return 400;
    return 0;
}

/* Should the client's field i go upstream as it is? */
static int request_keeps(const char *buf, const struct http1_head *h, int i,
                         const struct conn_names *cn, const struct h1write_req *o)
{
    struct http1_span name = h->h[i].name;
    if (o->upgrade && span_is(buf, name, "upgrade"))
        return 1;
    if (is_hop_by_hop(buf, name) || span_is(buf, name, "x-forwarded-for") ||
        span_is(buf, name, "x-forwarded-proto") || span_is(buf, name, "x-request-id"))
        return 0;
    if (!o->trusted && is_proxy_field(buf, name))
        return 0;
    if (o->underscore != CONF_UNDERSCORE_PASS && has_underscore(buf, name))
        return 0;
    /* Host stays whatever Connection says (such a request is a 400 anyway). */
    return !cn->any || !cn->named[i] || (int)i == h->host;
}

void h1write_request(struct obuf *out, const char *buf, const struct http1_head *h,
                     const struct h1write_req *o)
{
    struct conn_names cn;
    int nxff = 0;

    connection_names(buf, h, &cn);
    obuf_add(out, buf + h->method.off, h->method.len);
    obuf_add(out, " ", 1);
    obuf_add(out, buf + h->target.off, h->target.len);
    OBUF_LIT(out, " HTTP/1.1\r\n");
    for (int i = 0; i < h->nheaders; i++) {
        nxff += span_is(buf, h->h[i].name, "x-forwarded-for");
        if (request_keeps(buf, h, i, &cn, o))
            copy_field(out, buf, &h->h[i]);
    }
    /* Every X-Forwarded-For field joins one list, in order, ours last. */
    OBUF_LIT(out, "X-Forwarded-For: ");
    for (int i = 0; nxff && i < h->nheaders; i++)
        if (span_is(buf, h->h[i].name, "x-forwarded-for")) {
            obuf_add(out, buf + h->h[i].value.off, h->h[i].value.len);
            obuf_add(out, ", ", 2);
        }
    obuf_add(out, o->peer, o->peer_len);
    if (o->https)
        OBUF_LIT(out, "\r\nX-Forwarded-Proto: https\r\n");
    else
        OBUF_LIT(out, "\r\nX-Forwarded-Proto: http\r\n");
    if (o->upgrade)
        OBUF_LIT(out, "Connection: upgrade\r\n");
    add_field(out, "X-Request-Id", o->rid, o->rid_len);
    if (h->body == HTTP1_BODY_CHUNKED)
        OBUF_LIT(out, "Transfer-Encoding: chunked\r\n");
    else if (h->body == HTTP1_BODY_LENGTH)
        add_length(out, h->content_length);
    else if (http1_find(buf, h, "content-length", 0) >= 0)
        add_length(out, 0);         /* "Content-Length: 0" stays one */
    if (h->host < 0 && o->host)     /* HTTP/1.0 without Host: name the server */
        add_field(out, "Host", o->host, o->host_len);
    OBUF_LIT(out, "\r\n");
}

/* ---- response ----------------------------------------------------------- */

/* Where the status line starts (after empty lines, which a response may
 * follow, as RFC 9112 2.2 lets a server skip them before a request) and
 * where its CR is; -1 unless it reads "HTTP/1.x NNN" then SP or CR. */
static int status_line(const char *buf, const struct http1_head *h, size_t *start, size_t *eol)
{
    size_t i = 0, n = h->len;
    while (i + 1 < n && buf[i] == '\r' && buf[i + 1] == '\n')
        i += 2;
    const char *p = buf + i, *cr = memchr(p, '\r', n - i);
    if (cr == NULL || cr - p < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
        return -1;
    for (int k = 9; k < 12; k++)
        if (p[k] < '0' || p[k] > '9')
            return -1;
    if (cr - p > 12 && p[12] != ' ')
        return -1;
    *start = i;
    *eol = (size_t)(cr - buf);
    return 0;
}

int h1write_response_check(const char *buf, const struct http1_head *h)
{
    size_t start, eol;
    if (status_line(buf, h, &start, &eol) < 0)
        return 502;
    return (h->conn_names & (HTTP1_CONN_CL | HTTP1_CONN_TE)) ? 502 : 0;
}

/* Statuses that never carry a body, hence no framing (RFC 9110 8.6, 15.4.5). */
static int no_body_status(int st)
{
    return (st >= 100 && st < 200) || st == 204 || st == 304;
}

void h1write_response_begin(struct obuf *out, const char *buf, const struct http1_head *h,
                            struct h1write_resp *o)
{
    struct conn_names cn;
    size_t start = 0, eol = 0;

    connection_names(buf, h, &cn);
    OBUF_LIT(out, "HTTP/1.1 ");
    if (status_line(buf, h, &start, &eol) == 0)
        obuf_add(out, buf + start + 9, eol - start - 9);
    else                        /* unchecked: the parsed code only */
        obuf_int(out, h->status);
    OBUF_LIT(out, "\r\n");
    o->rid_seen = 0;
    for (int i = 0; i < h->nheaders; i++) {
        struct http1_span name = h->h[i].name;
        if (h->status == 101 && span_is(buf, name, "upgrade")) {
            copy_field(out, buf, &h->h[i]);
            continue;
        }
        if (is_hop_by_hop(buf, name) || (cn.any && cn.named[i]) ||
            is_limit_field(buf, name, o->limits))
            continue;
        o->rid_seen |= span_is(buf, name, "x-request-id");
        copy_field(out, buf, &h->h[i]);
    }
}

void h1write_response_end(struct obuf *out, const char *buf, const struct http1_head *h,
                          const struct h1write_resp *o)
{
    if (!o->rid_seen)
        add_field(out, "X-Request-Id", o->rid, o->rid_len);
    if (h->status == 101) {
        OBUF_LIT(out, "Connection: upgrade\r\n\r\n");
        return;
    }
    int had_length = h->body == HTTP1_BODY_LENGTH ||
                     http1_find(buf, h, "content-length", 0) >= 0;
    if (!no_body_status(h->status)) {       /* those have no framing at all */
        if (o->head_request) {
            if (had_length)     /* the length of what a GET would get */
                add_length(out, h->content_length);
        } else if (o->chunked) {
            OBUF_LIT(out, "Transfer-Encoding: chunked\r\n");
        } else if (h->body == HTTP1_BODY_LENGTH || had_length) {
            add_length(out, h->body == HTTP1_BODY_LENGTH ? h->content_length : 0);
        }
    }
    if (o->close)
        OBUF_LIT(out, "Connection: close\r\n");
    else if (o->keep_alive_10)
        OBUF_LIT(out, "Connection: keep-alive\r\n");
    OBUF_LIT(out, "\r\n");
}

/* ---- upgrade ------------------------------------------------------------ */

static int proto_allowed(const char *t, size_t n, char *const *protos, int nprotos)
{
    const char *slash = memchr(t, '/', n);
    if (slash)
        n = (size_t)(slash - t);
    if (protos == NULL)
        return token_is(t, n, "websocket");
    for (int i = 0; i < nprotos; i++)
        if (token_eq(t, n, protos[i], strlen(protos[i])))
            return 1;
    return 0;
}

int h1write_upgrade_ok(const char *buf, const struct http1_head *h,
                       char *const *protos, int nprotos)
{
    int seen = 0;
    for (int i = http1_find(buf, h, "upgrade", 0); i >= 0;
         i = http1_find(buf, h, "upgrade", i + 1)) {
        const char *v = buf + h->h[i].value.off, *end = v + h->h[i].value.len, *t;
        for (size_t n; (n = list_token(&v, end, &t)) > 0;) {
            if (!proto_allowed(t, n, protos, nprotos))
                return 0;
            seen = 1;
        }
    }
    return seen;
}
