/* sluice - h2msg.c: HTTP/2 header lists <-> HTTP/1.1 message text (h2msg.h).
 *
 * (a) collects a HEADERS block's fields within a bound and writes them as
 * an HTTP/1.1 head; (b) reads HTTP/1.1 messages with http1.c and hands
 * their heads out as nghttp2_nv lists, their payload de-chunked and their
 * trailers as a second list. The rules are RFC 9113 §8.2-8.3 (nghttpx's
 * src/http2.cc copy_headers_to_nva and build_http1_headers). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <event2/buffer.h>

#include "h2msg.h"
#include "mem.h"

/* Pseudo-fields a block may carry beside the HTTP1_MAX_HEADERS others. */
#define H2MSG_PSEUDO_MAX 5
#define H2MSG_FIELDS_MAX (HTTP1_MAX_HEADERS + H2MSG_PSEUDO_MAX)

/* ---- (a) ------------------------------------------------------------------ */

struct h2msg_field { uint32_t name, namelen, value, valuelen; };  /* into buf */

struct h2msg_fields {
    size_t max_bytes;           /* bound of the block, as HTTP/1.1 text */
    size_t bytes;               /* counted so far */
    int over;                   /* past a bound: 431 until cleared */
    int n;
    struct h2msg_field f[H2MSG_FIELDS_MAX];
    char *buf;                  /* names and values, each NUL-ended */
    size_t len, cap;
};

struct h2msg_fields *h2msg_fields_new(size_t max_bytes)
{
    struct h2msg_fields *f = mem_calloc(1, sizeof(*f));
    f->max_bytes = max_bytes;
    return f;
}

void h2msg_fields_free(struct h2msg_fields *f)
{
    if (f == NULL)
        return;
    free(f->buf);
    free(f);
}

void h2msg_fields_clear(struct h2msg_fields *f)
{
    f->bytes = 0;
    f->over = 0;
    f->n = 0;
    f->len = 0;
}

static uint32_t fields_put(struct h2msg_fields *f, const uint8_t *s, size_t n)
{
    if (f->len + n + 1 > f->cap) {
        size_t cap = f->cap ? f->cap : 512;
        while (cap < f->len + n + 1)
            cap *= 2;
        char *nb = mem_alloc(cap);
        if (f->len)
            memcpy(nb, f->buf, f->len);
        free(f->buf);
        f->buf = nb;
        f->cap = cap;
    }
    uint32_t at = (uint32_t)f->len;
    if (n)
        memcpy(f->buf + at, s, n);
    f->buf[at + n] = '\0';
    f->len += n + 1;
    return at;
}

int h2msg_fields_add(struct h2msg_fields *f, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen)
{
    if (f->over)
        return 431;
    size_t cost = namelen + valuelen + 4;
    if (f->n == H2MSG_FIELDS_MAX || cost > f->max_bytes || f->bytes + cost > f->max_bytes) {
        h2msg_fields_clear(f);
        f->over = 1;
        return 431;
    }
    f->bytes += cost;
    struct h2msg_field *e = &f->f[f->n++];
    e->name = fields_put(f, name, namelen);
    e->namelen = (uint32_t)namelen;
    e->value = fields_put(f, value, valuelen);
    e->valuelen = (uint32_t)valuelen;
    return 0;
}

static int field_is(const struct h2msg_fields *f, const struct h2msg_field *e, const char *name)
{
    size_t n = strlen(name);
    return e->namelen == n && memcmp(f->buf + e->name, name, n) == 0;
}

const char *h2msg_fields_get(const struct h2msg_fields *f, const char *name, size_t *len)
{
    for (int i = 0; i < f->n; i++)
        if (field_is(f, &f->f[i], name)) {
            if (len)
                *len = f->f[i].valuelen;
            return f->buf + f->f[i].value;
        }
    return NULL;
}

/* A connection-specific field: not carried between HTTP/1.1 and HTTP/2
 * (RFC 9113 8.2.2), either way. */
static int hop_by_hop(const char *name, size_t n)
{
    static const struct { const char *s; size_t n; } names[] = {
        {"connection", 10}, {"keep-alive", 10}, {"proxy-connection", 16},
        {"transfer-encoding", 17}, {"upgrade", 7}, {"http2-settings", 14}, {"te", 2},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (names[i].n == n && strncasecmp(names[i].s, name, n) == 0)
            return 1;
    return 0;
}

/* Fields HTTP/2 forbids or HTTP/1.1 gets from elsewhere (nghttpx
 * build_http1_headers): the connection-specific ones, pseudo-headers, Host
 * and Cookie (written from :authority and the crumbs); nghttp2 already
 * refuses most of them inbound. */
static int dropped(const struct h2msg_fields *f, const struct h2msg_field *e)
{
    const char *name = f->buf + e->name;
    if (e->namelen && name[0] == ':')
        return 1;
    return hop_by_hop(name, e->namelen) || field_is(f, e, "host") || field_is(f, e, "cookie");
}

/* Header text a field may carry into HTTP/1.1: nghttp2 has refused CR, LF
 * and NUL in values already; this holds for blocks from elsewhere too. */
static int clean(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
            return 0;
    return 1;
}

/* The fields, then the cookie crumbs joined into one field (§8.2.3). */
static void put_fields(const struct h2msg_fields *f, struct evbuffer *out)
{
    int cookies = 0;
    for (int i = 0; i < f->n; i++) {
        const struct h2msg_field *e = &f->f[i];
        if (field_is(f, e, "cookie"))
            cookies++;
        if (dropped(f, e))
            continue;
        evbuffer_add(out, f->buf + e->name, e->namelen);
        evbuffer_add(out, ": ", 2);
        evbuffer_add(out, f->buf + e->value, e->valuelen);
        evbuffer_add(out, "\r\n", 2);
    }
    for (int i = 0, k = 0; cookies && i < f->n; i++)
        if (field_is(f, &f->f[i], "cookie")) {
            k++;
            evbuffer_add_printf(out, "%s%s%s", k > 1 ? "; " : "Cookie: ", f->buf + f->f[i].value,
                                k == cookies ? "\r\n" : "");
        }
}

static int request_line(const struct h2msg_fields *f, struct evbuffer *out)
{
    size_t mlen, plen, alen = 0, hlen = 0;
    const char *method = h2msg_fields_get(f, ":method", &mlen);
    const char *path = h2msg_fields_get(f, ":path", &plen);
    const char *auth = h2msg_fields_get(f, ":authority", &alen);
    const char *host = h2msg_fields_get(f, "host", &hlen);
    if (method && mlen == 7 && memcmp(method, "CONNECT", 7) == 0)
        return 501;                 /* plain or extended: no tunnels over h2 */
    if (!method || !mlen || !path || !plen)
        return 400;
    /* Both and different: which one a route saw would depend on the hop
     * (nginx answers 400 too). */
    if (auth && host && (alen != hlen || strncasecmp(auth, host, alen) != 0))
        return 400;
    if (!auth || !alen)
        auth = host, alen = hlen;
    if (!auth || !alen || !clean(auth, alen) || !clean(path, plen) || !clean(method, mlen))
        return 400;
    evbuffer_add_printf(out, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, auth);
    return 0;
}

static int status_line(const struct h2msg_fields *f, struct evbuffer *out)
{
    size_t n;
    const char *st = h2msg_fields_get(f, ":status", &n);
    if (!st || n != 3 || st[0] < '1' || st[0] > '5' || st[1] < '0' || st[1] > '9' ||
        st[2] < '0' || st[2] > '9')
        return 400;
    evbuffer_add_printf(out, "HTTP/1.1 %s \r\n", st);   /* the reason phrase is optional */
    return 0;
}

int h2msg_head_text(const struct h2msg_fields *f, enum http1_kind kind, int body_follows,
                    const char *extra, struct evbuffer *out, int *chunked)
{
    *chunked = 0;
    if (f->over)
        return 431;
    struct evbuffer *tmp = evbuffer_new();
    int st = kind == HTTP1_REQUEST ? request_line(f, tmp) : status_line(f, tmp);
    for (int i = 0; st == 0 && i < f->n; i++)
        if (!clean(f->buf + f->f[i].value, f->f[i].valuelen))
            st = 400;
    if (st) {
        evbuffer_free(tmp);
        return st;
    }
    put_fields(f, tmp);
    if (body_follows && h2msg_fields_get(f, "content-length", NULL) == NULL) {
        evbuffer_add(tmp, "Transfer-Encoding: chunked\r\n", 28);
        *chunked = 1;
    }
    if (extra)
        evbuffer_add(tmp, extra, strlen(extra));
    evbuffer_add(tmp, "\r\n", 2);
    evbuffer_add_buffer(out, tmp);
    evbuffer_free(tmp);
    return 0;
}

void h2msg_chunk(struct evbuffer *out, const void *data, size_t len)
{
    if (len == 0)
        return;
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}

void h2msg_last_chunk(struct evbuffer *out, const struct h2msg_fields *trailers)
{
    evbuffer_add(out, "0\r\n", 3);
    if (trailers && !trailers->over)
        for (int i = 0; i < trailers->n; i++) {
            const struct h2msg_field *e = &trailers->f[i];
            if (dropped(trailers, e) || field_is(trailers, e, "content-length") ||
                !clean(trailers->buf + e->value, e->valuelen))
                continue;
            evbuffer_add_printf(out, "%s: %s\r\n", trailers->buf + e->name,
                                trailers->buf + e->value);
        }
    evbuffer_add(out, "\r\n", 2);
}

/* ---- (b) ------------------------------------------------------------------ */

enum reader_state { RD_HEAD, RD_BODY, RD_DONE };

struct h2msg_reader {
    enum http1_kind kind;
    size_t max_head;
    struct http1 *p;
    enum reader_state state;
    int head_request;
    const char *scheme;
    char *text;                 /* the last head (or the trailer section), lowercased names */
    size_t textcap;
    char status[4];
    size_t nnv;
    struct evbuffer *tail;      /* framing bytes since the last payload byte:
                                 * the last chunk and its trailers */
    /* Last, not zeroed (7 KiB, one reader per stream): written as far as a
     * head fills them. */
    struct http1_head head;
    nghttp2_nv nv[H2MSG_FIELDS_MAX];
};

struct h2msg_reader *h2msg_reader_new(enum http1_kind kind, size_t max_head)
{
    struct h2msg_reader *r = mem_alloc(sizeof(*r));
    memset(r, 0, offsetof(struct h2msg_reader, head));
    http1_head_clear(&r->head);
    r->kind = kind;
    r->max_head = max_head;
    r->p = http1_create(kind);
    r->scheme = "https";
    r->tail = evbuffer_new();
    return r;
}

void h2msg_reader_free(struct h2msg_reader *r)
{
    if (r == NULL)
        return;
    http1_destroy(r->p);
    evbuffer_free(r->tail);
    free(r->text);
    free(r);
}

void h2msg_reader_head_request(struct h2msg_reader *r, int head)
{
    r->head_request = head;
}

void h2msg_reader_scheme(struct h2msg_reader *r, const char *scheme)
{
    r->scheme = scheme;
}

static void text_hold(struct h2msg_reader *r, const char *s, size_t n)
{
    if (n + 1 > r->textcap) {
        free(r->text);
        r->textcap = n + 1 > 1024 ? n + 1 : 1024;
        r->text = mem_alloc(r->textcap);
    }
    memcpy(r->text, s, n);
    r->text[n] = '\0';
}

static void nv_add(struct h2msg_reader *r, const char *name, size_t nlen, const char *value,
                   size_t vlen)
{
    if (r->nnv == H2MSG_FIELDS_MAX)
        return;
    nghttp2_nv *v = &r->nv[r->nnv++];
    v->name = (uint8_t *)name;
    v->namelen = nlen;
    v->value = (uint8_t *)value;
    v->valuelen = vlen;
    v->flags = NGHTTP2_NV_FLAG_NONE;
}

/* The fields h's Connection fields name (token lists), marked in named[]:
 * one pass over the tokens, and one over the fields for each token but
 * "keep-alive" (a field dropped anyway). */
static void mark_named(const char *buf, const struct http1_head *h, unsigned char *named)
{
    for (int i = http1_find(buf, h, "connection", 0); i >= 0;
         i = http1_find(buf, h, "connection", i + 1)) {
        const char *s = buf + h->h[i].value.off, *end = s + h->h[i].value.len;
        while (s < end) {
            while (s < end && (*s == ' ' || *s == '\t' || *s == ','))
                s++;
            const char *w = s;
            while (s < end && *s != ',' && *s != ' ' && *s != '\t')
                s++;
            size_t n = (size_t)(s - w);
            if (n == 0 || (n == 10 && strncasecmp(w, "keep-alive", 10) == 0))
                continue;
            for (int j = 0; j < h->nheaders; j++)
                if (h->h[j].name.len == n && strncasecmp(buf + h->h[j].name.off, w, n) == 0)
                    named[j] = 1;
        }
    }
}

/* The head in r->text as an nv list. */
static void head_nv(struct h2msg_reader *r)
{
    const struct http1_head *h = &r->head;
    char *t = r->text;
    r->nnv = 0;
    if (r->kind == HTTP1_RESPONSE) {
        int st = h->status > 0 && h->status < 1000 ? h->status : 0;
        r->status[0] = (char)('0' + st / 100);
        r->status[1] = (char)('0' + st / 10 % 10);
        r->status[2] = (char)('0' + st % 10);
        nv_add(r, ":status", 7, r->status, 3);
    } else {
        nv_add(r, ":method", 7, t + h->method.off, h->method.len);
        nv_add(r, ":scheme", 7, r->scheme, strlen(r->scheme));
        if (h->host >= 0)
            nv_add(r, ":authority", 10, t + h->h[h->host].value.off, h->h[h->host].value.len);
        nv_add(r, ":path", 5, t + h->target.off, h->target.len);
    }
    unsigned char named[HTTP1_MAX_HEADERS] = {0};
    mark_named(t, h, named);
    for (int i = 0; i < h->nheaders; i++) {
        const struct http1_header *e = &h->h[i];
        char *name = t + e->name.off;
        /* "TE: trailers" is the one TE HTTP/2 requests carry (gRPC's) */
        int te_trailers = r->kind == HTTP1_REQUEST && e->name.len == 2 &&
                          strncasecmp(name, "te", 2) == 0 && e->value.len == 8 &&
                          strncasecmp(t + e->value.off, "trailers", 8) == 0;
        if (!te_trailers && (hop_by_hop(name, e->name.len) || i == h->host || named[i]))
            continue;
        for (uint32_t k = 0; k < e->name.len; k++)
            if (name[k] >= 'A' && name[k] <= 'Z')
                name[k] = (char)(name[k] + 32);
        nv_add(r, name, e->name.len, t + e->value.off, e->value.len);
    }
}

/* The trailer section in r->tail (after http1.c accepted it: "\r\n" ending
 * the last data chunk, maybe, then "0[;ext]\r\n", lines, "\r\n") as nv. */
static void trailers_nv(struct h2msg_reader *r)
{
    r->nnv = 0;
    size_t n = evbuffer_get_length(r->tail);
    if (n == 0)
        return;
    text_hold(r, (const char *)evbuffer_pullup(r->tail, -1), n);
    evbuffer_drain(r->tail, n);
    char *s = r->text, *end = s + n;
    if (end - s >= 2 && s[0] == '\r' && s[1] == '\n')
        s += 2;
    char *eol = memchr(s, '\n', (size_t)(end - s));     /* the size line */
    s = eol ? eol + 1 : end;
    while (s < end && *s != '\r') {
        eol = memchr(s, '\r', (size_t)(end - s));
        if (eol == NULL)
            break;
        char *colon = memchr(s, ':', (size_t)(eol - s));
        if (colon) {
            char *v = colon + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            size_t nlen = (size_t)(colon - s);
            for (size_t k = 0; k < nlen; k++)
                if (s[k] >= 'A' && s[k] <= 'Z')
                    s[k] = (char)(s[k] + 32);
            if (!hop_by_hop(s, nlen) && !(nlen == 14 && memcmp(s, "content-length", 14) == 0))
                nv_add(r, s, nlen, v, (size_t)(ve - v));
        }
        s = eol + 2;
    }
}

static enum h2msg_event read_head(struct h2msg_reader *r, struct evbuffer *in)
{
    size_t have = evbuffer_get_length(in);
    if (have == 0)
        return H2MSG_NEED;
    size_t look = have < r->max_head + 1 ? have : r->max_head + 1;
    const char *data = (const char *)evbuffer_pullup(in, (ssize_t)look);
    int st = http1_head_feed(r->p, data, look, r->max_head,
                             r->kind == HTTP1_RESPONSE && r->head_request, &r->head);
    if (st == 1)
        return look > r->max_head ? H2MSG_ERROR : H2MSG_NEED;
    if (st != 0)
        return H2MSG_ERROR;
    text_hold(r, data, r->head.len);
    evbuffer_drain(in, r->head.len);
    head_nv(r);
    if (h2msg_reader_interim(r))
        return H2MSG_HEAD;                  /* the final head comes next */
    if (r->kind == HTTP1_RESPONSE && r->head.status == 101)
        return H2MSG_ERROR;                 /* no protocol switch on a stream */
    r->state = r->head.body == HTTP1_BODY_NONE ? RD_DONE : RD_BODY;
    return H2MSG_HEAD;
}

static enum h2msg_event read_body(struct h2msg_reader *r, struct evbuffer *in,
                                  struct evbuffer *body, size_t max_body)
{
    size_t moved = 0;
    while (moved < max_body) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1 || v.iov_len == 0)
            break;
        size_t len = v.iov_len < max_body - moved ? v.iov_len : max_body - moved;
        struct http1_piece pieces[HTTP1_MAX_PIECES];
        int np = HTTP1_MAX_PIECES, done = 0;
        long used = http1_body_feed(r->p, v.iov_base, len, pieces, &np, &done);
        if (used < 0)
            return H2MSG_ERROR;
        size_t from = 0;
        for (int i = 0; i < np; i++) {
            evbuffer_add(body, (char *)v.iov_base + pieces[i].off, pieces[i].len);
            moved += pieces[i].len;
            from = pieces[i].off + pieces[i].len;
        }
        if (np)
            evbuffer_drain(r->tail, evbuffer_get_length(r->tail));
        if (r->head.body == HTTP1_BODY_CHUNKED && (size_t)used > from)
            evbuffer_add(r->tail, (char *)v.iov_base + from, (size_t)used - from);
        evbuffer_drain(in, (size_t)used);
        if (done) {
            r->state = RD_DONE;
            break;
        }
        if (used == 0)
            break;
    }
    return H2MSG_NEED;
}

enum h2msg_event h2msg_read(struct h2msg_reader *r, struct evbuffer *in, struct evbuffer *body,
                            size_t max_body)
{
    switch (r->state) {
    case RD_HEAD:
        return read_head(r, in);
    case RD_BODY: {
        size_t before = evbuffer_get_length(body);
        if (read_body(r, in, body, max_body) == H2MSG_ERROR)
            return H2MSG_ERROR;
        if (evbuffer_get_length(body) > before)
            return H2MSG_DATA;      /* the end, if here, is told on the next call */
        return r->state == RD_DONE ? h2msg_read(r, in, body, max_body) : H2MSG_NEED;
    }
    case RD_DONE:
        if (r->head.body == HTTP1_BODY_CHUNKED)
            trailers_nv(r);
        else
            r->nnv = 0;
        r->state = RD_HEAD;         /* the next message (a response after another) */
        r->head_request = 0;
        r->head.body = HTTP1_BODY_NONE;
        return H2MSG_END;
    }
    return H2MSG_ERROR;
}

int h2msg_reader_eof(struct h2msg_reader *r)
{
    if (r->state == RD_BODY && http1_body_eof(r->p)) {
        r->state = RD_DONE;
        return 1;
    }
    return r->state == RD_DONE;
}

const nghttp2_nv *h2msg_reader_nv(const struct h2msg_reader *r, size_t *n)
{
    *n = r->nnv;
    return r->nv;
}

int h2msg_reader_status(const struct h2msg_reader *r)
{
    return r->head.status;
}

int h2msg_reader_interim(const struct h2msg_reader *r)
{
    return r->kind == HTTP1_RESPONSE && r->head.status >= 100 && r->head.status < 200 &&
           r->head.status != 101;
}

int h2msg_reader_body(const struct h2msg_reader *r)
{
    return r->state == RD_BODY;
}

const struct http1_head *h2msg_reader_head(const struct h2msg_reader *r)
{
    return &r->head;
}

const char *h2msg_reader_text(const struct h2msg_reader *r)
{
    return r->text;
}
