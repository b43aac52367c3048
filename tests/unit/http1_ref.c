/* sluice - http1_ref.c: the reference for test_http1_differential and
 * fuzz_http1_differential: src/http/http1.c as it was while it sat on
 * http_parser 2.9 (main 89b3f16), its externs renamed http1ref_*. Kept as
 * it was, so the differential tests compare the project's own parser with
 * what sluice accepted before it; the only file linking -lhttp_parser.
 *
 * Below, the original file's own comment. */
/* sluice - http1.c: HTTP/1.x framing on top of http_parser 2.9.
 *
 * http_parser does the tokenising; this file adds what a proxy on the public
 * edge needs on top of it (Debian builds http_parser non-strict): one pass
 * over an accepted head for bare LF, lone CR, control bytes and obsolete
 * folding, and a pass over the headers for smuggling (CL/TE conflicts,
 * duplicates, odd codings, Host). Body decoding reports payload runs as
 * offsets so the caller moves bytes without copying. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <http_parser.h>

#include "http1_ref.h"

/* A larger client.max_header_bytes would be cut here silently. (Equal
 * today, hence the NOLINT.) */
static_assert(HTTP1_MAX_HEAD_BYTES <= HTTP_MAX_HEADER_SIZE, /* NOLINT(misc-redundant-expression) */
              "HTTP1_MAX_HEAD_BYTES above what http_parser takes");

struct http1ref {
    http_parser parser;
    const http_parser_settings *settings;
    enum http1_kind kind;
    int head_request;           /* response to HEAD: no body */
    /* During http1ref_head_parse only. */
    struct http1_head *head;
    const char *base;           /* data of the current execute call */
    int in_value;               /* last header callback was a value */
    int too_many;               /* more than HTTP1_MAX_HEADERS headers */
    /* During http1ref_body_feed only. */
    struct http1_piece *pieces;
    int npieces;
    uint32_t chunk_end;         /* bit i: pieces[i] ends a chunk's data */
    /* Between the calls of a head that arrives in pieces (http1ref_head_feed). */
    struct http1_head *open_head;   /* the head the last call left unfinished */
    size_t head_fed;            /* how many of its bytes http_parser has seen */
    /* Between calls. */
    int need_lf;                /* the head's final LF is still to be fed */
    int in_body;                /* a head was parsed, message not complete */
    int done;                   /* message complete: a new head comes next */
    /* Chunk framing checks http_parser (non-strict) leaves out. */
    int crlf_need;              /* bytes of the CRLF after chunk data to see */
    int prev_cr;                /* last framing byte was CR */
};

/* ---- small helpers ------------------------------------------------------ */

static int lower(int c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Does span s of buf read lit[0..n), in any case? */
static int span_eq(const char *buf, struct http1_span s, const char *lit, size_t n)
{
    if (s.len != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)buf[s.off + i]) != lower((unsigned char)lit[i]))
            return 0;
    return 1;
}

/* The same against a string literal, its length known at compile time. */
#define span_is(buf, s, lit) span_eq((buf), (s), "" lit, sizeof(lit) - 1)

/* RFC 9110 tchar. */
static int is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return 1;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* ---- http_parser callbacks ---------------------------------------------- */

static int on_url(http_parser *hp, const char *at, size_t len)
{
    struct http1ref *p = hp->data;
    struct http1_span *t = &p->head->target;
    uint32_t off = (uint32_t)(at - p->base);

    if (t->len == 0)
        t->off = off;
    else if (t->off + t->len != off)
        return 1;               /* cannot happen in one buffer */
    t->len += (uint32_t)len;
    return 0;
}

static int on_header_field(http_parser *hp, const char *at, size_t len)
{
    struct http1ref *p = hp->data;
    struct http1_head *h = p->head;
    uint32_t off = (uint32_t)(at - p->base);

    if (h == NULL)
        return 0;               /* a trailer: accepted and dropped */
    if (h->nheaders == 0 || p->in_value) {
        if (h->nheaders == HTTP1_MAX_HEADERS) {
            p->too_many = 1;
            return 1;
        }
        h->h[h->nheaders].name = (struct http1_span){ off, 0 };
        /* off UINT32_MAX: no value seen yet (a line without ':') */
        h->h[h->nheaders].value = (struct http1_span){ UINT32_MAX, 0 };
        h->nheaders++;
        p->in_value = 0;
    } else if (h->h[h->nheaders - 1].name.off + h->h[h->nheaders - 1].name.len != off) {
        return 1;               /* a name split by something else */
    }
    h->h[h->nheaders - 1].name.len += (uint32_t)len;
    return 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t len)
{
    struct http1ref *p = hp->data;
    struct http1_head *h = p->head;
    struct http1_span *v;

    if (h == NULL)
        return 0;
    if (h->nheaders == 0)
        return 1;
    v = &h->h[h->nheaders - 1].value;
    if (!p->in_value)
        v->off = (uint32_t)(at - p->base);
    v->len = (uint32_t)(at - p->base) + (uint32_t)len - v->off;
    p->in_value = 1;
    return 0;
}

/* Stop right after the head; say "no body" where the response has none, so
 * http_parser does not go looking for one (a 304 may carry Content-Length). */
static int on_headers_complete(http_parser *hp)
{
    struct http1ref *p = hp->data;

    if (p->head == NULL)
        return 0;
    http_parser_pause(hp, 1);
    if (p->kind == HTTP1_RESPONSE) {
        unsigned st = hp->status_code;
        if (p->head_request || (st >= 100 && st < 200) || st == 204 || st == 304)
            return 1;
    }
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct http1ref *p = hp->data;

    if (p->pieces == NULL || len == 0)
        return 0;
    assert(p->npieces < HTTP1_MAX_PIECES);
    p->pieces[p->npieces].off = (size_t)(at - p->base);
    p->pieces[p->npieces].len = len;
    if ((hp->flags & F_CHUNKED) && hp->content_length == 0)
        p->chunk_end |= 1u << p->npieces;
    p->npieces++;
    /* A full array stops the parser; a Content-Length body that just ended
     * is left alone, as http_parser would count its last byte unconsumed and
     * on_message_complete stops it right after anyway. */
    if (p->npieces == HTTP1_MAX_PIECES &&
        !(!(hp->flags & F_CHUNKED) && hp->content_length == 0))
        http_parser_pause(hp, 1);
    return 0;
}

/* Stop at the end of the message so a pipelined next one stays unread. */
static int on_message_complete(http_parser *hp)
{
    struct http1ref *p = hp->data;

    p->done = 1;
    p->in_body = 0;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings http1_settings = {
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- life cycle --------------------------------------------------------- */

struct http1ref *http1ref_create(enum http1_kind kind)
{
    struct http1ref *p = calloc(1, sizeof(*p));

    if (p == NULL)
        abort();

    p->kind = kind;
    p->settings = &http1_settings;
    http_parser_init(&p->parser, kind == HTTP1_REQUEST ? HTTP_REQUEST : HTTP_RESPONSE);
    p->parser.data = p;
    return p;
}

void http1ref_destroy(struct http1ref *p)
{
    free(p);
}

/* ---- head validation ---------------------------------------------------- */

/* One pass over the accepted head: every line ends in CRLF, no control byte
 * but HTAB (and that only in header lines), no line folding, and an ASCII
 * request line. http_parser, built non-strict, lets all of these through. */
static int scan_head(const struct http1ref *p, const char *d, size_t len)
{
    int line = -1;              /* -1: leading empty lines, 0: start line */
    int line_start = 1;

    for (size_t i = 0; i < len; i++) {
        /* Most bytes: printable ASCII inside a line, fine on every line. */
        while (!line_start && i < len && (unsigned char)d[i] >= 0x20 && (unsigned char)d[i] < 0x7f)
            i++;
        if (i == len)
            break;
        unsigned char c = (unsigned char)d[i];
        if (c == '\n') {
            if (i == 0 || d[i - 1] != '\r')
                return 400;
            line_start = 1;
            if (line >= 0)
                line++;
            continue;
        }
        if (c == '\r') {
            if (i + 1 >= len || d[i + 1] != '\n')
                return 400;
            continue;
        }
        if (line_start) {
            if (line < 0)
                line = 0;
            else if (c == ' ' || c == '\t')
                return 400;     /* obs-fold, or whitespace before a name */
            line_start = 0;
        }
        if (c == '\t' && line == 0 && p->kind == HTTP1_REQUEST)
            return 400;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 400;
        if (c >= 0x80 && line == 0 && p->kind == HTTP1_REQUEST)
            return 400;
    }
    return 0;
}

static struct http1_span trim(const char *d, struct http1_span s)
{
    while (s.len > 0 && (d[s.off] == ' ' || d[s.off] == '\t')) {
        s.off++;
        s.len--;
    }
    while (s.len > 0 && (d[s.off + s.len - 1] == ' ' || d[s.off + s.len - 1] == '\t'))
        s.len--;
    return s;
}

static int parse_length(const char *d, struct http1_span s, uint64_t *out)
{
    uint64_t v = 0;

    if (s.len == 0)
        return -1;
    for (uint32_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)d[s.off + i];
        if (c < '0' || c > '9')
            return -1;
        /* At most INT64_MAX: whatever writes the length again (h1write)
         * or compares it with a signed bound must see the same number. */
        if (v > (uint64_t)(INT64_MAX - (c - '0')) / 10)
            return -1;
        v = v * 10 + (c - '0');
    }
    *out = v;
    return 0;
}

/* Is the last coding of a Transfer-Encoding value "chunked"? */
static int te_ends_chunked(const char *d, struct http1_span v)
{
    uint32_t end = v.off + v.len, start = end;

    while (start > v.off && d[start - 1] != ',')
        start--;
    return span_is(d, trim(d, (struct http1_span){ start, end - start }), "chunked");
}

/* http_parser 2.9.4 takes a name that merely starts with one of the names
 * it interprets ("Transfer-Encodingf") for that name, while every other
 * reader sees an unknown field (found by fuzzing): refuse such names.
 * "Upgrade..." is not among them: http_parser reads "Upgradex" as an unknown
 * field, and every browser sends Upgrade-Insecure-Requests on navigation. */
static int special_prefix(const char *d, struct http1_span name)
{
#define SPECIAL(lit) { lit, sizeof(lit) - 1 }
    static const struct { const char *s; size_t n; } special[] = {
        SPECIAL("content-length"), SPECIAL("transfer-encoding"), SPECIAL("connection"),
        SPECIAL("proxy-connection"),
    };
#undef SPECIAL
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++) {
        size_t n = special[i].n;
        if (name.len > n && strncasecmp(d + name.off, special[i].s, n) == 0)
            return 1;
    }
    return 0;
}

struct framing {
    int ncl, nte, nhost, te_chunked;
    uint64_t cl;
};

/* Names are tokens; the framing headers are counted and checked. Values
 * were trimmed of trailing OWS (http_parser drops only the leading one). */
static int check_headers(const char *d, struct http1_head *h, struct framing *f)
{
    for (int i = 0; i < h->nheaders; i++) {
        struct http1_header *hd = &h->h[i];
        if (hd->name.len == 0 || hd->value.off == UINT32_MAX)
            return 400;
        for (uint32_t k = 0; k < hd->name.len; k++)
            if (!is_tchar((unsigned char)d[hd->name.off + k]))
                return 400;
        hd->value = trim(d, hd->value);
        if (special_prefix(d, hd->name))
            return 400;
        if (span_is(d, hd->name, "content-length")) {
            if (++f->ncl > 1 || parse_length(d, hd->value, &f->cl) < 0)
                return 400;
        } else if (span_is(d, hd->name, "transfer-encoding")) {
            f->nte++;
            f->te_chunked = te_ends_chunked(d, hd->value);
            if (f->nte == 1 && span_is(d, hd->value, "chunked"))
                f->te_chunked = 2;      /* exactly one token "chunked" */
        } else if (span_is(d, hd->name, "host")) {
            if (f->nhost++ == 0)
                h->host = i;
        } else if (span_is(d, hd->name, "expect")) {
            if (span_is(d, hd->value, "100-continue"))
                h->expect_continue = 1;
        }
    }
    if (f->ncl > 0 && f->nte > 0)
        return 400;
    return 0;
}

static int check_request(const http_parser *hp, struct http1_head *h,
                         const struct framing *f)
{
    if (hp->method == HTTP_CONNECT)
        return 400;
    if (f->nhost > 1 || (h->minor == 1 && f->nhost == 0))
        return 400;
    if (f->nte > 0 && (h->minor == 0 || f->nte > 1 || f->te_chunked != 2))
        return 400;
    /* What http_parser will do with the body must be what we report. */
    if (!!(hp->flags & F_CHUNKED) != (f->nte > 0))
        return 400;
    if (f->ncl == 0 && hp->content_length != UINT64_MAX)
        return 400;
    if (f->nte > 0) {
        h->body = HTTP1_BODY_CHUNKED;
    } else if (f->ncl > 0) {
        if (hp->content_length != f->cl)
            return 400;
        h->content_length = f->cl;
        h->body = f->cl > 0 ? HTTP1_BODY_LENGTH : HTTP1_BODY_NONE;
    }
    h->upgrade = hp->upgrade;
    return 0;
}

static int check_response(const struct http1ref *p, struct http1_head *h,
                          const struct framing *f)
{
    const http_parser *hp = &p->parser;
    int st = hp->status_code;
    int chunked = f->nte > 0 && f->te_chunked;

    if (st < 100)
        return 400;
    h->status = st;
    h->upgrade = st == 101;
    /* What http_parser will do with the body must be what we report. */
    if (chunked != !!(hp->flags & F_CHUNKED))
        return 400;
    if (f->ncl > 0 && hp->content_length != f->cl)
        return 400;
    if (f->ncl > 0)
        h->content_length = f->cl;
    if (p->head_request || (st >= 100 && st < 200) || st == 204 || st == 304)
        h->body = HTTP1_BODY_NONE;
    else if (f->nte > 0)
        h->body = chunked ? HTTP1_BODY_CHUNKED : HTTP1_BODY_EOF;
    else if (f->ncl > 0)
        h->body = f->cl > 0 ? HTTP1_BODY_LENGTH : HTTP1_BODY_NONE;
    else
        h->body = HTTP1_BODY_EOF;
    return 0;
}

/* Everything after http_parser accepted the head data[0..h->len). */
static int head_check(struct http1ref *p, const char *data, struct http1_head *h)
{
    const http_parser *hp = &p->parser;
    struct framing f = { 0 };
    int rc;

    if (hp->http_major != 1 || hp->http_minor > 1)
        return 400;
    h->minor = hp->http_minor;
    if ((rc = scan_head(p, data, h->len)) != 0)
        return rc;
    if ((rc = check_headers(data, h, &f)) != 0)
        return rc;
    if (p->kind == HTTP1_REQUEST)
        rc = check_request(hp, h, &f);
    else
        rc = check_response(p, h, &f);
    if (rc != 0)
        return rc;
    if (h->minor == 1)
        h->keep_alive = !(hp->flags & F_CONNECTION_CLOSE);
    else
        h->keep_alive = (hp->flags & F_CONNECTION_KEEP_ALIVE) &&
                        !(hp->flags & F_CONNECTION_CLOSE);
    if (h->body == HTTP1_BODY_EOF)
        h->keep_alive = 0;
    return 0;
}

static void head_reset(struct http1_head *h)
{
    h->len = 0;
    h->minor = 0;
    h->method = (struct http1_span){ 0, 0 };
    h->target = (struct http1_span){ 0, 0 };
    h->status = 0;
    h->keep_alive = 0;
    h->upgrade = 0;
    h->expect_continue = 0;
    h->body = HTTP1_BODY_NONE;
    h->content_length = 0;
    h->host = -1;
    h->nheaders = 0;
}

/* Which limit an unfinished head broke: the request line (no LF yet) or the
 * head as a whole. */
static int too_long(const struct http1ref *p, const char *data, size_t n)
{
    size_t i = 0;

    while (i < n && (data[i] == '\r' || data[i] == '\n'))
        i++;
    if (p->kind == HTTP1_REQUEST && memchr(data + i, '\n', n - i) == NULL)
        return 414;
    return 431;
}

/* A new head: the parser from its start, nothing found yet. */
static void head_begin(struct http1ref *p, int head_request, struct http1_head *h)
{
    http_parser *hp = &p->parser;

    http_parser_init(hp, p->kind == HTTP1_REQUEST ? HTTP_REQUEST : HTTP_RESPONSE);
    hp->data = p;
    p->head_request = head_request;
    p->in_value = 0;
    p->too_many = 0;
    p->pieces = NULL;
    p->need_lf = p->in_body = p->done = 0;
    p->head_fed = 0;
    head_reset(h);
}

/* Run http_parser over the bytes of data[0..len) it has not seen: all of
 * them for a new head, those after head_fed when resuming one. http_parser
 * keeps its state between calls and the spans are offsets from data, so
 * the buffer may have moved; each byte of a head is parsed once. */
static int head_run(struct http1ref *p, const char *data, size_t len, size_t max_bytes,
                    int head_request, struct http1_head *h, int resume)
{
    size_t n = len < max_bytes ? len : max_bytes, from, used;
    http_parser *hp = &p->parser;
    int rc;

    if (!resume || p->open_head != h || p->head_fed > n)
        head_begin(p, head_request, h);
    p->open_head = NULL;
    from = p->head_fed;
    p->head = h;
    p->base = data;
    used = n > from ? http_parser_execute(hp, p->settings, data + from, n - from) : 0;
    p->head = NULL;
    if (p->too_many)
        return 431;
    if (HTTP_PARSER_ERRNO(hp) == HPE_HEADER_OVERFLOW)
        return too_long(p, data, n);
    if (HTTP_PARSER_ERRNO(hp) == HPE_OK && used == n - from) {
        if (len > max_bytes)
            return too_long(p, data, n);
        p->open_head = h;
        p->head_fed = n;
        return 1;
    }
    if (HTTP_PARSER_ERRNO(hp) != HPE_PAUSED)
        return 400;
    used += from;
    /* Paused in on_headers_complete, on the head's final LF (non-strict
     * http_parser takes any byte there: the scan below wants CRLF). */
    if (used >= n || data[used] != '\n')
        return 400;
    h->len = used + 1;
    if (p->kind == HTTP1_REQUEST) {
        const char *m = http_method_str((enum http_method)hp->method);
        size_t off = 0, mlen = strlen(m);
        while (off < h->len && (data[off] == '\r' || data[off] == '\n'))
            off++;
        if (off + mlen > h->len || memcmp(data + off, m, mlen) != 0 || h->target.len == 0)
            return 400;
        h->method = (struct http1_span){ (uint32_t)off, (uint32_t)mlen };
    }
    if ((rc = head_check(p, data, h)) != 0)
        return rc;
    p->need_lf = 1;
    p->in_body = 1;
    p->crlf_need = 0;
    p->prev_cr = 0;
    return 0;
}

int http1ref_head_parse(struct http1ref *p, const char *data, size_t len,
                     size_t max_bytes, int head_request, struct http1_head *h)
{
    return head_run(p, data, len, max_bytes, head_request, h, 0);
}

int http1ref_head_feed(struct http1ref *p, const char *data, size_t len,
                    size_t max_bytes, int head_request, struct http1_head *h)
{
    return head_run(p, data, len, max_bytes, head_request, h, 1);
}

/* ---- body --------------------------------------------------------------- */

/* One byte of chunk framing (size line, extension, CRLF, trailer): chunk
 * data is followed by exactly CRLF, every CR by LF, every LF follows a CR, and
 * no control byte but HTAB. Non-strict http_parser checks none of these.
 * Bytes from 0x80 up are refused too: http_parser's hex table reads them as
 * the digit 0, so "\xff" would end a body where any other server sees a bad
 * chunk size (found by fuzzing; extensions and trailers are dropped, so
 * refusing obs-text there costs nothing). */
static int frame_byte(struct http1ref *p, unsigned char c)
{
    if (p->crlf_need > 0) {
        if (c != (p->crlf_need == 2 ? '\r' : '\n'))
            return -1;
        p->crlf_need--;
    }
    if (p->prev_cr != (c == '\n'))
        return -1;
    p->prev_cr = c == '\r';
    if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c >= 0x7f)
        return -1;
    return 0;
}

/* Check the framing bytes of data[0..used): those outside the pieces. */
static int frame_check(struct http1ref *p, const char *data, size_t used)
{
    size_t at = 0;

    for (int i = 0; i <= p->npieces; i++) {
        size_t end = i < p->npieces ? p->pieces[i].off : used;
        for (; at < end; at++)
            if (frame_byte(p, (unsigned char)data[at]) < 0)
                return -1;
        if (i < p->npieces) {
            at = end + p->pieces[i].len;
            if (p->chunk_end & (1u << i))
                p->crlf_need = 2;
        }
    }
    return 0;
}

/* Run the parser over data; -1 on a framing error. */
static long body_run(struct http1ref *p, const char *data, size_t len)
{
    http_parser *hp = &p->parser;
    size_t used;

    if (HTTP_PARSER_ERRNO(hp) == HPE_PAUSED)
        http_parser_pause(hp, 0);
    p->base = data;
    p->chunk_end = 0;
    used = http_parser_execute(hp, p->settings, data, len);
    if (HTTP_PARSER_ERRNO(hp) != HPE_OK && HTTP_PARSER_ERRNO(hp) != HPE_PAUSED)
        return -1;
    if (p->pieces != NULL && frame_check(p, data, used) < 0)
        return -1;
    return (long)used;
}

/* The head's final LF, left unconsumed by the pause, is fed on its own. */
static int body_start(struct http1ref *p)
{
    struct http1_piece *pieces = p->pieces;
    long used;

    if (!p->need_lf)
        return 0;
    p->need_lf = 0;
    p->pieces = NULL;           /* the head's LF is no body framing */
    used = body_run(p, "\n", 1);
    p->pieces = pieces;
    return used == 1 ? 0 : -1;
}

long http1ref_body_feed(struct http1ref *p, const char *data, size_t len,
                     struct http1_piece *pieces, int *npieces, int *done)
{
    long used = 0;

    *npieces = 0;
    *done = p->done;
    if (p->done)
        return 0;
    if (!p->in_body)
        return -1;              /* no head parsed */
    p->pieces = pieces;
    p->npieces = 0;
    if (body_start(p) < 0)
        goto fail;
    if (!p->done && len > 0) {
        used = body_run(p, data, len);
        if (used < 0)
            goto fail;
    }
    p->pieces = NULL;
    *npieces = p->npieces;
    *done = p->done;
    return used;

fail:
    p->pieces = NULL;
    p->in_body = 0;
    p->done = 0;                /* a broken message never completes */
    return -1;
}

int http1ref_body_eof(struct http1ref *p)
{
    if (p->done)
        return 0;
    if (!p->in_body)
        return 0;
    p->pieces = NULL;
    if (body_start(p) < 0 || p->done)
        return 0;               /* complete before EOF, or broken */
    if (p->parser.http_errno == HPE_PAUSED)
        http_parser_pause(&p->parser, 0);
    http_parser_execute(&p->parser, p->settings, NULL, 0);
    p->in_body = 0;
    return p->done;
}
