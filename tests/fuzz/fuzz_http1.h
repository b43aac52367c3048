/* sluice - fuzz_http1.h: the harness shared by fuzz_http1_request.c and
 * fuzz_http1_response.c.
 *
 * Input layout: byte 0 flags (bit 0: a small max_bytes so 414/431 run;
 * bit 1: the response answers a HEAD), byte 1 the small max_bytes, bytes 2-4
 * three body split points, then the message. Every buffer handed to http1 is
 * an exactly sized heap copy, so ASan sees any read past the length given.
 * Invariants checked (abort() on failure, which libFuzzer reports as a crash):
 * - a head parse depends only on the head's bytes: every shorter prefix says
 *   "need more" (1), and the head alone parses to the same result;
 * - a head fed in pieces (http1_head_feed) gets the whole parse's result;
 * - every span lies inside the head, counts are in range;
 * - body pieces lie inside the bytes given, in order, inside what was
 *   consumed; consumed <= len; no stall (no progress while not done);
 * - the payload, the bytes consumed and the outcome are the same whether the
 *   body arrives whole or split at the three points;
 * - Content-Length payloads are exactly that long, EOF bodies are the bytes
 *   as sent, and a chunked payload is what a strict reference decoder reads
 *   from the same bytes. */
#ifndef SLUICE_FUZZ_HTTP1_H
#define SLUICE_FUZZ_HTTP1_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "http1.h"

#define FUZZ_HDR_BYTES   5
#define FUZZ_MAX_HEADS   4      /* 1xx heads followed before the final one */
#define FUZZ_MAX_CALLS   100000 /* bound on body_feed calls per pass */

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

enum fuzz_outcome { FUZZ_DONE, FUZZ_ERROR, FUZZ_MORE };

/* What one pass over the body produced. */
struct fuzz_body {
    enum fuzz_outcome outcome;
    size_t consumed;
    char *payload;              /* malloc'd, payload_len bytes */
    size_t payload_len;
    int eof_done;               /* http1_body_eof() at the end of the input */
};

static char *fuzz_dup(const uint8_t *d, size_t n)
{
    char *p = malloc(n ? n : 1);
    fuzz_check(p != NULL);
    if (n)
        memcpy(p, d, n);
    return p;
}

static void fuzz_span_ok(struct http1_span s, size_t len)
{
    fuzz_check((size_t)s.off + s.len <= len);
}

static void fuzz_head_ok(const struct http1_head *h, enum http1_kind kind, size_t n)
{
    fuzz_check(h->len > 0 && h->len <= n);
    fuzz_check(h->minor == 0 || h->minor == 1);
    fuzz_check(h->nheaders >= 0 && h->nheaders <= HTTP1_MAX_HEADERS);
    fuzz_check(h->host >= -1 && h->host < h->nheaders);
    for (int i = 0; i < h->nheaders; i++) {
        fuzz_check(h->h[i].name.len > 0);
        fuzz_span_ok(h->h[i].name, h->len);
        fuzz_span_ok(h->h[i].value, h->len);
    }
    if (kind == HTTP1_REQUEST) {
        fuzz_check(h->method.len > 0 && h->target.len > 0);
        fuzz_span_ok(h->method, h->len);
        fuzz_span_ok(h->target, h->len);
    } else {
        fuzz_check(h->status >= 100 && h->status <= 999);
    }
    fuzz_check(h->body == HTTP1_BODY_NONE || h->body == HTTP1_BODY_LENGTH ||
               h->body == HTTP1_BODY_CHUNKED ||
               (h->body == HTTP1_BODY_EOF && kind == HTTP1_RESPONSE));
    if (h->body == HTTP1_BODY_LENGTH)
        fuzz_check(h->content_length > 0);
    if (h->body == HTTP1_BODY_EOF)
        fuzz_check(!h->keep_alive);
}

static int fuzz_head_same(const struct http1_head *a, const struct http1_head *b)
{
    if (a->len != b->len || a->minor != b->minor || a->status != b->status ||
        a->keep_alive != b->keep_alive || a->upgrade != b->upgrade ||
        a->expect_continue != b->expect_continue || a->body != b->body ||
        a->content_length != b->content_length || a->host != b->host ||
        a->nheaders != b->nheaders ||
        memcmp(&a->method, &b->method, sizeof a->method) != 0 ||
        memcmp(&a->target, &b->target, sizeof a->target) != 0)
        return 0;
    return memcmp(a->h, b->h, (size_t)a->nheaders * sizeof a->h[0]) == 0;
}

/* The same bytes fed to http1_head_feed() in eight growing pieces, each call
 * given a new copy of everything so far (a connection's buffer may move):
 * the first answer other than "need more" is the whole parse's, with the
 * same fields. */
static void fuzz_head_fed(enum http1_kind kind, const uint8_t *d, size_t n,
                          size_t max_bytes, int head_request, int want,
                          const struct http1_head *hw)
{
    struct http1 *f = http1_create(kind);
    struct http1_head *hf = malloc(sizeof *hf);
    size_t step = n / 8 + 1;
    int rc = 1;

    fuzz_check(hf != NULL);
    for (size_t k = step < n ? step : n; rc == 1; k = k + step < n ? k + step : n) {
        char *pre = fuzz_dup(d, k);
        rc = http1_head_feed(f, pre, k, max_bytes, head_request, hf);
        free(pre);
        if (k == n)
            break;
    }
    if (rc != want)
        fprintf(stderr, "fed in pieces of %zu: %d, whole: %d\n", step, rc, want);
    fuzz_check(rc == want);
    if (want == 0)
        fuzz_check(fuzz_head_same(hw, hf));
    free(hf);
    http1_destroy(f);
}

/* Parse one head from d[0..n) and check it depends on its own bytes only.
 * Returns http1_head_parse's result; p is left ready for the body. */
static int fuzz_head(struct http1 *p, enum http1_kind kind, const uint8_t *d, size_t n,
                     size_t max_bytes, int head_request, struct http1_head *h)
{
    struct http1 *q = http1_create(kind);
    struct http1_head *h2 = malloc(sizeof *h2);
    char *buf = fuzz_dup(d, n);
    int rc = http1_head_parse(p, buf, n, max_bytes, head_request, h);

    fuzz_check(h2 != NULL);
    fuzz_check(rc == 0 || rc == 1 || rc == 400 || rc == 414 || rc == 431 || rc == 501);
    if (rc == 414)
        fuzz_check(kind == HTTP1_REQUEST);
    if (rc == 0) {
        fuzz_head_ok(h, kind, n);
        /* The head alone: same result, same fields. */
        char *head = fuzz_dup(d, h->len);
        fuzz_check(http1_head_parse(q, head, h->len, max_bytes, head_request, h2) == 0);
        fuzz_check(fuzz_head_same(h, h2));
        /* Every shorter prefix (a few of them: cost) needs more bytes. A
         * proxy re-parses on each read, so anything else would make the
         * answer depend on how TCP cut the stream. */
        size_t step = h->len / 8 + 1;
        for (size_t k = 0; k < h->len; k += step) {
            char *pre = fuzz_dup(d, k);
            int prc = http1_head_parse(q, pre, k, max_bytes, head_request, h2);
            if (prc != 1)
                fprintf(stderr, "prefix %zu of head %zu: %d\n", k, h->len, prc);
            fuzz_check(prc == 1);
            free(pre);
        }
        free(head);
    }
    fuzz_head_fed(kind, d, n, max_bytes, head_request, rc, h);
    free(buf);
    free(h2);
    http1_destroy(q);
    return rc;
}

static void fuzz_append(struct fuzz_body *b, const char *p, size_t n)
{
    b->payload = realloc(b->payload, b->payload_len + n + 1);
    fuzz_check(b->payload != NULL);
    memcpy(b->payload + b->payload_len, p, n);
    b->payload_len += n;
}

/* Feed one segment until it is used up, the message ends or breaks. */
static void fuzz_feed(struct http1 *p, const uint8_t *d, size_t n, struct fuzz_body *b)
{
    char *buf = fuzz_dup(d, n);
    size_t at = 0;

    for (int calls = 0; b->outcome == FUZZ_MORE; calls++) {
        struct http1_piece pieces[HTTP1_MAX_PIECES];
        int np = -1, done = -1;
        fuzz_check(calls < FUZZ_MAX_CALLS);
        long used = http1_body_feed(p, buf + at, n - at, pieces, &np, &done);
        if (used < 0) {
            b->outcome = FUZZ_ERROR;
            break;
        }
        fuzz_check((size_t)used <= n - at);
        fuzz_check(np >= 0 && np <= HTTP1_MAX_PIECES);
        fuzz_check(done == 0 || done == 1);
        size_t last_end = 0;
        for (int i = 0; i < np; i++) {
            fuzz_check(pieces[i].len > 0);
            fuzz_check(pieces[i].off >= last_end);
            fuzz_check(pieces[i].off + pieces[i].len <= (size_t)used);
            last_end = pieces[i].off + pieces[i].len;
            fuzz_append(b, buf + at + pieces[i].off, pieces[i].len);
        }
        at += (size_t)used;
        b->consumed += (size_t)used;
        if (done) {
            b->outcome = FUZZ_DONE;
            break;
        }
        if (at == n)
            break;
        /* Not done, bytes left: the call must have made progress. */
        fuzz_check(used > 0 || np > 0);
    }
    free(buf);
}

/* The body in segments cut at cuts[0..ncuts) (ascending offsets into d). */
static void fuzz_body_pass(struct http1 *p, const uint8_t *d, size_t n,
                           const size_t *cuts, int ncuts, struct fuzz_body *b)
{
    size_t from = 0;

    memset(b, 0, sizeof *b);
    b->outcome = FUZZ_MORE;
    for (int i = 0; i <= ncuts && b->outcome == FUZZ_MORE; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        fuzz_feed(p, d + from, to - from, b);
        from = to;
    }
    /* An empty feed after everything: the head's LF may complete a
     * bodiless message even when no body byte came. */
    if (b->outcome == FUZZ_MORE)
        fuzz_feed(p, d + n, 0, b);
    if (b->outcome == FUZZ_MORE)
        b->eof_done = http1_body_eof(p);
}

/* A strict chunked decoder, written from RFC 9112 section 7.1 and kept
 * independent of http1.c: hex size, optional ";ext" (or http_parser's
 * " ext") of non-control bytes, CRLF, data, CRLF; after the 0 chunk trailer
 * lines, then CRLF. Returns the bytes of the whole body, or 0 when d[0..n)
 * holds no complete valid body; the payload goes to out. */
static size_t fuzz_ref_chunked(const uint8_t *d, size_t n, struct fuzz_body *out)
{
    size_t i = 0;

    for (;;) {
        uint64_t size = 0;
        size_t digits = 0;
        for (; i < n; i++, digits++) {
            int v = (d[i] >= '0' && d[i] <= '9') ? d[i] - '0'
                  : (d[i] >= 'a' && d[i] <= 'f') ? d[i] - 'a' + 10
                  : (d[i] >= 'A' && d[i] <= 'F') ? d[i] - 'A' + 10 : -1;
            if (v < 0)
                break;
            if (size > (UINT64_MAX >> 4))
                return 0;
            size = size * 16 + (uint64_t)v;
        }
        if (digits == 0 || i >= n)
            return 0;
        if (d[i] == ';' || d[i] == ' ')
            while (i < n && d[i] != '\r' && (d[i] >= 0x20 || d[i] == '\t') && d[i] != 0x7f)
                i++;
        if (i + 1 >= n || d[i] != '\r' || d[i + 1] != '\n')
            return 0;
        i += 2;
        if (size == 0)
            break;
        if (size > n - i)
            return 0;
        fuzz_append(out, (const char *)d + i, (size_t)size);
        i += (size_t)size;
        if (i + 1 >= n || d[i] != '\r' || d[i + 1] != '\n')
            return 0;
        i += 2;
    }
    /* Trailer lines: bytes other than controls, each ended by CRLF. */
    for (;;) {
        size_t start = i;
        while (i < n && d[i] != '\r' && (d[i] >= 0x20 || d[i] == '\t') && d[i] != 0x7f)
            i++;
        if (i + 1 >= n || d[i] != '\r' || d[i + 1] != '\n')
            return 0;
        i += 2;
        if (i - start == 2)
            return i;
    }
}

/* Parse the body d[0..n) of head h twice, whole and split, and compare. */
static void fuzz_body_check(enum http1_kind kind, const uint8_t *msg, size_t msglen,
                            size_t max_bytes, int head_request, const struct http1_head *h,
                            const uint8_t *cutb)
{
    const uint8_t *d = msg + h->len;
    size_t n = msglen - h->len;
    struct http1 *whole = http1_create(kind), *split = http1_create(kind);
    struct http1_head *h2 = malloc(sizeof *h2);
    struct fuzz_body a, b;
    size_t cuts[3];

    fuzz_check(h2 != NULL);
    /* Fresh parsers at the same point: the same head again. */
    fuzz_check(http1_head_parse(whole, (const char *)msg, h->len, max_bytes, head_request, h2) == 0);
    fuzz_check(http1_head_parse(split, (const char *)msg, h->len, max_bytes, head_request, h2) == 0);
    for (int i = 0; i < 3; i++)
        cuts[i] = n ? cutb[i] * (n + 1) / 256 : 0;
    for (int i = 0; i < 3; i++)          /* sort three */
        for (int j = i + 1; j < 3; j++)
            if (cuts[j] < cuts[i]) {
                size_t t = cuts[i]; cuts[i] = cuts[j]; cuts[j] = t;
            }
    fuzz_body_pass(whole, d, n, NULL, 0, &a);
    fuzz_body_pass(split, d, n, cuts, 3, &b);

    if (a.outcome != b.outcome || a.eof_done != b.eof_done ||
        (a.outcome != FUZZ_ERROR && (a.consumed != b.consumed || a.payload_len != b.payload_len)))
        fprintf(stderr, "whole: outcome %d consumed %zu payload %zu eof %d; "
                "split %zu/%zu/%zu: outcome %d consumed %zu payload %zu eof %d\n",
                a.outcome, a.consumed, a.payload_len, a.eof_done, cuts[0], cuts[1], cuts[2],
                b.outcome, b.consumed, b.payload_len, b.eof_done);
    fuzz_check(a.outcome == b.outcome);
    fuzz_check(a.eof_done == b.eof_done);
    if (a.outcome == FUZZ_ERROR) {
        /* Both broke; what either delivered before is a prefix of the other. */
        size_t m = a.payload_len < b.payload_len ? a.payload_len : b.payload_len;
        fuzz_check(m == 0 || memcmp(a.payload, b.payload, m) == 0);
    } else {
        fuzz_check(a.consumed == b.consumed);
        fuzz_check(a.payload_len == b.payload_len);
        fuzz_check(a.payload_len == 0 || memcmp(a.payload, b.payload, a.payload_len) == 0);
    }
    if (a.outcome == FUZZ_MORE)
        fuzz_check(a.consumed == n);

    switch (h->body) {
    case HTTP1_BODY_NONE:
        fuzz_check(a.outcome == FUZZ_DONE && a.consumed == 0 && a.payload_len == 0);
        break;
    case HTTP1_BODY_LENGTH:
        fuzz_check(a.outcome != FUZZ_ERROR);
        fuzz_check(!a.eof_done);
        if (a.outcome == FUZZ_DONE)
            fuzz_check(a.consumed == h->content_length);
        else
            fuzz_check(n < h->content_length);
        fuzz_check(a.payload_len == a.consumed);
        fuzz_check(a.payload_len == 0 || memcmp(a.payload, d, a.payload_len) == 0);
        break;
    case HTTP1_BODY_EOF:
        fuzz_check(a.outcome == FUZZ_MORE && a.eof_done);
        fuzz_check(a.payload_len == n);
        fuzz_check(n == 0 || memcmp(a.payload, d, n) == 0);
        break;
    case HTTP1_BODY_CHUNKED: {
        fuzz_check(!a.eof_done);
        if (a.outcome == FUZZ_DONE) {
            struct fuzz_body ref;
            memset(&ref, 0, sizeof ref);
            size_t end = fuzz_ref_chunked(d, a.consumed, &ref);
            if (end != a.consumed)
                fprintf(stderr, "chunked: http1 took %zu bytes, reference %zu\n",
                        a.consumed, end);
            fuzz_check(end == a.consumed);
            fuzz_check(ref.payload_len == a.payload_len);
            fuzz_check(a.payload_len == 0 || memcmp(ref.payload, a.payload, a.payload_len) == 0);
            free(ref.payload);
        }
        break;
    }
    }
    free(a.payload);
    free(b.payload);
    free(h2);
    http1_destroy(whole);
    http1_destroy(split);
}

/* The whole harness for one kind. */
static void fuzz_http1_one(enum http1_kind kind, const uint8_t *data, size_t size)
{
    if (size < FUZZ_HDR_BYTES)
        return;
    uint8_t flags = data[0];
    size_t max_bytes = (flags & 1) ? 16 + (size_t)data[1] * 4 : 16384;
    int head_request = kind == HTTP1_RESPONSE && (flags & 2);
    const uint8_t *cutb = data + 2;
    const uint8_t *msg = data + FUZZ_HDR_BYTES;
    size_t n = size - FUZZ_HDR_BYTES;
    struct http1 *p = http1_create(kind);
    struct http1_head *h = malloc(sizeof *h);

    fuzz_check(h != NULL);
    /* A response may bring 1xx heads first; each is followed by the next. */
    for (int i = 0; i < FUZZ_MAX_HEADS; i++) {
        int rc = fuzz_head(p, kind, msg, n, max_bytes, head_request, h);
        if (rc != 0)
            break;
        if (kind == HTTP1_RESPONSE && h->status >= 100 && h->status < 200 &&
            h->status != 101) {
            fuzz_check(h->body == HTTP1_BODY_NONE);
            msg += h->len;
            n -= h->len;
            continue;
        }
        fuzz_body_check(kind, msg, n, max_bytes, head_request, h, cutb);
        break;
    }
    free(h);
    http1_destroy(p);
}

#endif
