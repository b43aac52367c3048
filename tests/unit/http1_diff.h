/* sluice - http1_diff.h: one input through src/http/http1.c and through the
 * http_parser-based reference (http1_ref.c, what sluice ran before), and
 * whether they agree. Shared by test_http1_differential.c (the corpora and
 * test_http1.c's table) and tests/fuzz/fuzz_http1_differential.c.
 *
 * Agreeing means: both accept a head, with the same fields (spans equal;
 * an empty value compares by length only, http_parser put its offset on the
 * next line), and its body gives the same payload, bytes used and outcome;
 * or neither accepts it. A refusal's status and moment may differ (sluice
 * refuses at the bad byte where http_parser often waited for the end of the
 * head; 400 against 431 when a bad head is also too long). Any other
 * difference must be one of known_diffs[] below, each saying why. */
#ifndef SLUICE_HTTP1_DIFF_H
#define SLUICE_HTTP1_DIFF_H

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http1.h"
#include "http1_ref.h"

#define DIFF_MAX_HEADS 4        /* 1xx heads followed before the final one */
#define DIFF_MAX_CALLS 100000   /* bound on body_feed calls */

enum diff_outcome { DIFF_DONE, DIFF_ERROR, DIFF_MORE };

struct diff_body {
    enum diff_outcome outcome;
    size_t used;
    size_t payload_len;
    uint64_t payload_hash;      /* FNV-1a of the payload */
    int eof_done;
};

/* One parser's side: either implementation behind the same four calls. */
struct diff_side {
    int ref;
    struct http1 *p;
    struct http1ref *r;
};

static int diff_head(struct diff_side *s, const char *d, size_t n, size_t max, int hr,
                     struct http1_head *h)
{
    return s->ref ? http1ref_head_parse(s->r, d, n, max, hr, h)
                  : http1_head_parse(s->p, d, n, max, hr, h);
}

static long diff_feed(struct diff_side *s, const char *d, size_t n, struct http1_piece *pc,
                      int *np, int *done)
{
    return s->ref ? http1ref_body_feed(s->r, d, n, pc, np, done)
                  : http1_body_feed(s->p, d, n, pc, np, done);
}

static int diff_eof(struct diff_side *s)
{
    return s->ref ? http1ref_body_eof(s->r) : http1_body_eof(s->p);
}

/* The body d[0..n) fed whole (again while the pieces array fills). */
static void diff_body_run(struct diff_side *s, const char *d, size_t n, struct diff_body *b)
{
    uint64_t hsh = 1469598103934665603ULL;
    size_t at = 0;

    memset(b, 0, sizeof(*b));
    b->outcome = DIFF_MORE;
    for (int calls = 0; calls < DIFF_MAX_CALLS; calls++) {
        struct http1_piece pc[HTTP1_MAX_PIECES];
        int np = 0, done = 0;
        long used = diff_feed(s, d + at, n - at, pc, &np, &done);
        if (used < 0) {
            b->outcome = DIFF_ERROR;
            break;
        }
        for (int i = 0; i < np; i++) {
            for (size_t k = 0; k < pc[i].len; k++)
                hsh = (hsh ^ (unsigned char)d[at + pc[i].off + k]) * 1099511628211ULL;
            b->payload_len += pc[i].len;
        }
        at += (size_t)used;
        if (done) {
            b->outcome = DIFF_DONE;
            break;
        }
        if (at == n || (used == 0 && np == 0))
            break;
    }
    b->used = at;
    b->payload_hash = hsh;
    if (b->outcome == DIFF_MORE)
        b->eof_done = diff_eof(s);
}

static int diff_span_same(struct http1_span a, struct http1_span b)
{
    return a.off == b.off && a.len == b.len;
}

/* The fields both parsers fill; NULL when they match, else the first that
 * does not. */
static const char *diff_head_fields(const struct http1_head *a, const struct http1_head *b)
{
    if (a->len != b->len)
        return "len";
    if (a->minor != b->minor)
        return "minor";
    if (!diff_span_same(a->method, b->method) || !diff_span_same(a->target, b->target))
        return "request line spans";
    if (a->status != b->status)
        return "status";
    if (a->keep_alive != b->keep_alive)
        return "keep_alive";
    if (a->upgrade != b->upgrade)
        return "upgrade";
    if (a->expect_continue != b->expect_continue)
        return "expect_continue";
    if (a->body != b->body)
        return "body";
    if (a->content_length != b->content_length)
        return "content_length";
    if (a->host != b->host)
        return "host";
    if (a->nheaders != b->nheaders)
        return "nheaders";
    for (int i = 0; i < a->nheaders; i++) {
        if (!diff_span_same(a->h[i].name, b->h[i].name))
            return "a field name";
        if (a->h[i].value.len != b->h[i].value.len ||
            (a->h[i].value.len > 0 && a->h[i].value.off != b->h[i].value.off))
            return "a field value";
    }
    return NULL;
}

/* ---- the deliberate differences ------------------------------------------- */

/* The first line after leading CRLFs: [*start, *end) without its CR. */
static int diff_first_line(const uint8_t *d, size_t n, size_t *start, size_t *end)
{
    size_t i = 0;
    while (i + 1 < n && d[i] == '\r' && d[i + 1] == '\n')
        i += 2;
    *start = i;
    while (i < n && d[i] != '\r' && d[i] != '\n')
        i++;
    *end = i;
    return i < n;
}

/* A request line whose parts are not split by exactly one SP each. */
static int known_request_line_spaces(enum http1_kind kind, const uint8_t *d, size_t n)
{
    size_t s, e, sp = 0;
    if (kind != HTTP1_REQUEST)
        return 0;
    diff_first_line(d, n, &s, &e);
    for (size_t i = s; i < e; i++) {
        if (d[i] != ' ')
            continue;
        if (i == s || i + 1 == e || d[i + 1] == ' ')
            return 1;
        sp++;
    }
    return sp > 2;
}

/* A start line whose protocol name is not "HTTP/": the five bytes after
 * the request line's second SP, or at the status line's start, whatever
 * they are (CR and LF included: http_parser did not look at them). */
static int known_version_name(enum http1_kind kind, const uint8_t *d, size_t n)
{
    size_t s = 0;
    while (s + 1 < n && d[s] == '\r' && d[s + 1] == '\n')
        s += 2;
    if (kind == HTTP1_REQUEST) {
        int sp = 0;
        while (s < n && sp < 2)
            sp += d[s++] == ' ';
    }
    size_t k = n - s < 5 ? n - s : 5;
    return k > 0 && memcmp(d + s, "HTTP/", k) != 0;
}

static int diff_tchar(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Where a chunked body's trailer section starts: the bytes after the head
 * walked leniently (hex size, to LF, data, CRLF) up to the last chunk's
 * LF; 0 when there is none. */
static size_t diff_trailers(const uint8_t *d, size_t n)
{
    size_t i = 0;
    while (i + 1 < n && d[i] == '\r' && d[i + 1] == '\n')
        i += 2;
    for (; i + 3 < n; i++)
        if (memcmp(d + i, "\r\n\r\n", 4) == 0)
            break;
    for (i += 4; i < n;) {
        uint64_t size = 0;
        int digits = 0;
        for (; i < n && isxdigit(d[i]) && digits < 15; i++, digits++)
            size = size * 16 + (uint64_t)(isdigit(d[i]) ? d[i] - '0' : (d[i] | 0x20) - 'a' + 10);
        while (i < n && d[i] != '\n')
            i++;
        if (i++ >= n || digits == 0)
            return 0;
        if (size == 0)
            return i;
        if (size > n - i)
            return 0;
        i += (size_t)size + 2;
    }
    return 0;
}

/* A trailer line that is no field line of a head (obs-fold, a byte other
 * than a tchar in the name) or that names a framing field. */
static int known_trailer_fields(enum http1_kind kind, const uint8_t *d, size_t n)
{
    size_t i = diff_trailers(d, n);
    (void)kind;
    while (i > 0 && i < n && d[i] != '\r') {
        size_t k = i;
        if (d[k] == ' ' || d[k] == '\t')
            return 1;
        while (k < n && d[k] != ':' && d[k] != '\r' && d[k] != '\n') {
            if (!diff_tchar(d[k]))
                return 1;
            k++;
        }
        if ((k - i >= 14 && strncasecmp((const char *)d + i, "content-length", 14) == 0) ||
            (k - i >= 17 && strncasecmp((const char *)d + i, "transfer-encoding", 17) == 0))
            return 1;
        while (k < n && d[k] != '\n')
            k++;
        i = k + 1;
    }
    return 0;
}

/* Where sluice now refuses what it accepted before, and why. Each entry is
 * a predicate on the whole input; a difference matching none fails. */
static const struct known_diff {
    const char *name;
    const char *why;
    int (*match)(enum http1_kind kind, const uint8_t *d, size_t n);
} known_diffs[] = {
    { "request line spaces",
      "RFC 9112 3: method SP request-target SP HTTP-version, one SP each; "
      "http_parser skipped runs of SP, which lets two readers split a line "
      "differently", known_request_line_spaces },
    { "version name",
      "RFC 9112 2.3: HTTP-name is \"HTTP\", case-sensitive; http_parser, "
      "built non-strict, checked only its first letter", known_version_name },
    { "trailer fields",
      "RFC 9112 7.1.2: a trailer line is a field line, and RFC 9110 6.5.1 "
      "allows no framing field there; http_parser took obs-fold, SP in "
      "names and Content-Length or Transfer-Encoding in trailers",
      known_trailer_fields },
};

static const struct known_diff *diff_known(enum http1_kind kind, const uint8_t *d, size_t n)
{
    for (size_t i = 0; i < sizeof(known_diffs) / sizeof(known_diffs[0]); i++)
        if (known_diffs[i].match(kind, d, n))
            return &known_diffs[i];
    return NULL;
}

/* ---- one input ------------------------------------------------------------ */

/* Parse d[0..n) with both; NULL when they agree, else what differs (into
 * why[0..len)) and, in *head_at, where the message that differs starts
 * (a response's 1xx heads are followed by the next head). */
static const char *http1_diff(enum http1_kind kind, const uint8_t *d, size_t n,
                              size_t max, int head_request, char *why, size_t why_len,
                              size_t *head_at)
{
    struct diff_side a = { 0, http1_create(kind), NULL }, b = { 1, NULL, http1ref_create(kind) };
    struct http1_head *ha = malloc(sizeof(*ha)), *hb = malloc(sizeof(*hb));
    char *buf = malloc(n ? n : 1);
    const char *res = NULL;
    size_t at = 0;

    if (ha == NULL || hb == NULL || buf == NULL)
        abort();
    if (n)
        memcpy(buf, d, n);
    for (int k = 0; k < DIFF_MAX_HEADS && res == NULL; k++) {
        int ra = diff_head(&a, buf + at, n - at, max, head_request, ha);
        int rb = diff_head(&b, buf + at, n - at, max, head_request, hb);
        if (ra != 0 || rb != 0) {
            /* neither accepts: agreed, whatever the status or moment */
            if (ra == 0 || rb == 0) {
                snprintf(why, why_len, "head at %zu: sluice %d, http_parser %d", at, ra, rb);
                res = why;
            }
            break;
        }
        const char *f = diff_head_fields(ha, hb);
        if (f != NULL) {
            snprintf(why, why_len, "head at %zu: %s differs", at, f);
            res = why;
            break;
        }
        if (kind == HTTP1_RESPONSE && ha->status >= 100 && ha->status < 200 &&
            ha->status != 101) {
            at += ha->len;
            continue;
        }
        struct diff_body ba, bb;
        diff_body_run(&a, buf + at + ha->len, n - at - ha->len, &ba);
        diff_body_run(&b, buf + at + hb->len, n - at - hb->len, &bb);
        if (ba.outcome != bb.outcome || ba.eof_done != bb.eof_done ||
            (ba.outcome != DIFF_ERROR &&
             (ba.used != bb.used || ba.payload_len != bb.payload_len ||
              ba.payload_hash != bb.payload_hash))) {
            snprintf(why, why_len, "body after head at %zu: sluice outcome %d used %zu "
                     "payload %zu eof %d, http_parser outcome %d used %zu payload %zu eof %d",
                     at, ba.outcome, ba.used, ba.payload_len, ba.eof_done,
                     bb.outcome, bb.used, bb.payload_len, bb.eof_done);
            res = why;
        }
        break;
    }
    *head_at = at;
    free(buf);
    free(ha);
    free(hb);
    http1_destroy(a.p);
    http1ref_destroy(b.r);
    return res;
}

#endif
