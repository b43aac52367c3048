/* sluice - fuzz_h1write.h: the harness shared by fuzz_h1write_request.c and
 * fuzz_h1write_response.c: sluice's own rewriting of what it forwards.
 *
 * Input layout: byte 0 option flags (each target reads its own bits), then
 * the message. A head http1 accepts is checked (h1write_*_check), then
 * rewritten into an evbuffer through an obuf, and the bytes written are
 * parsed again by a fresh http1 parser. Invariants (abort() on failure):
 * - writing never aborts, whatever the head (the check is not a guard the
 *   writer relies on for memory safety);
 * - what passed the check is rewritten into one head that http1 accepts
 *   whole (its length is all the bytes written);
 * - the rewritten head frames the message exactly as sluice read it: the same
 *   body kind and Content-Length (or, re-framed, chunked), so the next hop
 *   cannot see a different message boundary than sluice did;
 * - no Connection field survives but sluice's own, each field sluice sets
 *   appears once. */
#ifndef SLUICE_FUZZ_H1WRITE_H
#define SLUICE_FUZZ_H1WRITE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>
#include "h1write.h"
#include "http1.h"
#include "obuf.h"

#define FUZZ_MAX_HEAD 65536

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

static char *fuzz_dup(const uint8_t *d, size_t n)
{
    char *p = malloc(n ? n : 1);
    fuzz_check(p != NULL);
    if (n)
        memcpy(p, d, n);
    return p;
}

/* The evbuffer's bytes as one exactly sized heap copy; *n gets the length. */
static char *fuzz_take(struct evbuffer *eb, size_t *n)
{
    *n = evbuffer_get_length(eb);
    char *p = malloc(*n ? *n : 1);
    fuzz_check(p != NULL);
    fuzz_check(evbuffer_remove(eb, p, *n) == (int)*n);
    return p;
}

static int fuzz_count(const char *buf, const struct http1_head *h, const char *name)
{
    int n = 0;
    for (int i = http1_find(buf, h, name, 0); i >= 0; i = http1_find(buf, h, name, i + 1))
        n++;
    return n;
}

/* sluice adds up to 5 fields of its own: a head near http1's field limit
 * may come out over it, which the next hop's limits are for (not a framing
 * question), so such heads are only written, not parsed again. */
static int fuzz_too_many(const struct http1_head *h)
{
    return h->nheaders > HTTP1_MAX_HEADERS - 5;
}

/* Parse out[0..n) as one whole head of kind; returns the parser's result. */
static int fuzz_reparse(enum http1_kind kind, const char *out, size_t n, int head_request,
                        struct http1_head *h)
{
    struct http1 *q = http1_create(kind);
    int rc = http1_head_parse(q, out, n, FUZZ_MAX_HEAD * 2, head_request, h);
    http1_destroy(q);
    if (rc != 0)
        fprintf(stderr, "rewritten head (%zu bytes) got %d:\n%.*s\n", n, rc, (int)n, out);
    return rc;
}

#endif
