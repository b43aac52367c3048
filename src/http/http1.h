/* sluice - http1.h: HTTP/1.x message framing, parsed by sluice itself.
 *
 * A head (request or response line plus headers) is parsed from one
 * contiguous buffer, in one strict pass. When it arrives in pieces, http1_head_feed() parses only
 * the bytes added since the last call (picohttpparser's last_len), so a head
 * dripped a byte at a time costs what it costs whole. The result refers to the
 * buffer by offsets (struct http1_span), so it stays valid while the caller
 * keeps the bytes in place.
 *
 * After a head, the same struct http1 decodes the body: http1_body_feed()
 * takes any run of bytes and reports which of them are payload (pieces),
 * dropping chunk framing, so the caller can move payload bytes without
 * copying and frame them again itself. Every security check on framing
 * (smuggling, obsolete folding, bare LF, bad chunk sizes) lives here. */
#ifndef SLUICE_HTTP1_H
#define SLUICE_HTTP1_H

#include <stddef.h>
#include <stdint.h>

#define HTTP1_MAX_HEADERS 100
/* The largest head sluice takes (http_parser's HTTP_MAX_HEADER_SIZE, which
 * it used before): the upper bound of client.max_header_bytes (conf.h:
 * CONF_MAX_HEADER_BYTES, held equal in client.c). */
#define HTTP1_MAX_HEAD_BYTES (80 * 1024)
#define HTTP1_MAX_PIECES  32

struct http1_span { uint32_t off, len; };       /* into the head buffer */
struct http1_header { struct http1_span name, value; };

enum http1_kind { HTTP1_REQUEST, HTTP1_RESPONSE };

/* What the Connection fields name, read while parsing (h1write needs no
 * second pass over them unless HTTP1_CONN_OTHER). */
#define HTTP1_CONN_CL    1u     /* Content-Length */
#define HTTP1_CONN_TE    2u     /* Transfer-Encoding */
#define HTTP1_CONN_HOST  4u     /* (with HTTP1_CONN_OTHER) */
#define HTTP1_CONN_OTHER 8u     /* a field that is not hop-by-hop anyway */

enum http1_body {
    HTTP1_BODY_NONE,            /* no payload */
    HTTP1_BODY_LENGTH,          /* Content-Length bytes */
    HTTP1_BODY_CHUNKED,         /* chunked transfer coding */
    HTTP1_BODY_EOF,             /* response delimited by the connection's close */
};

struct http1_head {
    size_t len;                 /* bytes of the head, final empty line included */
    int minor;                  /* HTTP/1.minor: 0 or 1 */
    struct http1_span method;   /* request only */
    struct http1_span target;   /* request only: as sent */
    int status;                 /* response only */
    int keep_alive;             /* version default adjusted by Connection */
    int upgrade;                /* request: Upgrade + Connection: upgrade seen;
                                 * response: status 101 */
    int expect_continue;        /* request: Expect: 100-continue */
    enum http1_body body;
    uint64_t content_length;    /* when body == HTTP1_BODY_LENGTH */
    int host;                   /* index into h[] of Host, -1 when absent */
    unsigned conn_names;        /* HTTP1_CONN_* */
    int nheaders;
    struct http1_header h[HTTP1_MAX_HEADERS];
};

/* One payload run inside the bytes given to http1_body_feed(). */
struct http1_piece { size_t off, len; };

struct http1;   /* parser state, one per connection side; opaque */

struct http1 *http1_create(enum http1_kind kind);
void http1_destroy(struct http1 *p);

/* Parse a head from data[0..len). Returns 0 with *h filled when a whole head
 * is there, 1 when more bytes are needed, or an HTTP status for a bad head:
 * 400 (malformed, smuggling, bad version...), 414 (request line longer than
 * max_bytes), 431 (head longer than max_bytes), 501 (unknown transfer coding).
 * For a response, head_request says the request was HEAD (no body follows)
 * and a 1xx other than 101 is returned as a head with body NONE; the caller
 * then parses the next head. On success the parser is ready for the body. */
int http1_head_parse(struct http1 *p, const char *data, size_t len,
                     size_t max_bytes, int head_request, struct http1_head *h);

/* http1_head_parse() for a head that arrives in pieces, as a connection
 * reads it. When the last call on p returned 1 for the same h, data[0..len)
 * must begin with the bytes it was given (the buffer may have moved) and only
 * the bytes after them are parsed; otherwise a new head starts at data[0].
 * Same results, limits and checks as one http1_head_parse() over the whole. */
int http1_head_feed(struct http1 *p, const char *data, size_t len,
                    size_t max_bytes, int head_request, struct http1_head *h);
/* h as no head at all (what a parse begins with): every field but the
 * fields array, which only nheaders of are ever read. */
void http1_head_clear(struct http1_head *h);

/* Feed body bytes. Fills pieces[0..*npieces) with payload runs (offsets into
 * data) and returns how many bytes of data were consumed (<= len), which may
 * be fewer when the message ends or the pieces array is full: call again with
 * the rest. *done is set to 1 when the message is complete. Returns -1 on a
 * framing error (bad chunk size, overflow...). */
long http1_body_feed(struct http1 *p, const char *data, size_t len,
                     struct http1_piece *pieces, int *npieces, int *done);

/* Keep the value of the first trailer of this message's chunked body named
 * name (any case; up to HTTP1_TRAILER_NAME_MAX bytes), as sent: a value
 * longer than HTTP1_TRAILER_VALUE_MAX is not kept. Call after the head;
 * the next head forgets it. http1_trailer_value: 1 with the value (not
 * NUL-terminated, valid until the next call on p) once it was read. */
#define HTTP1_TRAILER_NAME_MAX  256
#define HTTP1_TRAILER_VALUE_MAX 32
void http1_trailer_watch(struct http1 *p, const char *name);
int http1_trailer_value(const struct http1 *p, const char **value, size_t *len);

/* The peer closed: 1 when that completes an EOF-delimited body, 0 otherwise. */
int http1_body_eof(struct http1 *p);

/* Case-insensitive name compare against a span of buf. */
int http1_name_is(const char *buf, const struct http1_header *hd, const char *name);

/* Index of the first header named name at or after from, or -1. */
int http1_find(const char *buf, const struct http1_head *h, const char *name, int from);

/* A span of 1..18 ASCII digits as a number into *out: 1, or 0 for anything
 * else (empty, a sign, spaces, too long). */
int http1_span_uint(const char *buf, struct http1_span v, int64_t *out);

#endif
