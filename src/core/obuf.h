/* sluice - obuf.h: writing a head straight into an evbuffer's own memory.
 *
 * A head is many small pieces (a name, ": ", a value...). Adding each with
 * evbuffer_add() costs a call, a length check and the buffer's callbacks
 * per piece; an obuf reserves space in the evbuffer once, copies the pieces
 * into it, and commits once at the end (reserving again only when a head
 * outgrows its first guess). The evbuffer stays owned by its io (io.h). */
#ifndef SLUICE_OBUF_H
#define SLUICE_OBUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>

struct obuf {
    struct evbuffer *buf;
    struct evbuffer_iovec v;
    char *p, *end;
    size_t hint;
};

static inline void obuf_reserve(struct obuf *o, size_t need)
{
    size_t n = need > o->hint ? need : o->hint;
    if (evbuffer_reserve_space(o->buf, (ev_ssize_t)n, &o->v, 1) < 1)
        abort();    /* only on allocation failure */
    o->p = o->v.iov_base;
    o->end = o->p + o->v.iov_len;
}

static inline void obuf_commit(struct obuf *o)
{
    o->v.iov_len = (size_t)(o->p - (char *)o->v.iov_base);
    evbuffer_commit_space(o->buf, &o->v, 1);
}

/* Start writing to buf, guessing the size of what comes. */
static inline void obuf_begin(struct obuf *o, struct evbuffer *buf, size_t hint)
{
    o->buf = buf;
    o->hint = hint < 256 ? 256 : hint;
    obuf_reserve(o, o->hint);
}

static inline void obuf_add(struct obuf *o, const void *data, size_t n)
{
    if ((size_t)(o->end - o->p) < n) {
        obuf_commit(o);
        obuf_reserve(o, n);
    }
    memcpy(o->p, data, n);
    o->p += n;
}

#define OBUF_LIT(o, s) obuf_add((o), (s), sizeof(s) - 1)

static inline void obuf_str(struct obuf *o, const char *s)
{
    obuf_add(o, s, strlen(s));
}

/* A decimal integer, no printf. */
static inline void obuf_int(struct obuf *o, int64_t v)
{
    char tmp[24];
    char *q = tmp + sizeof(tmp);
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    obuf_add(o, q, (size_t)(tmp + sizeof(tmp) - q));
}

/* Finish: what was written becomes part of the evbuffer. */
static inline void obuf_end(struct obuf *o)
{
    obuf_commit(o);
}

#endif
