/* sluice - h2msg.h: HTTP/2 header lists <-> HTTP/1.1 message text.
 *
 * Both directions, for requests and responses alike, so the client side
 * (an h2 stream becomes an HTTP/1.1 request the proxy reads; the HTTP/1.1
 * response it writes becomes HEADERS, DATA and trailers) and an h2
 * upstream (the other way round) share one set of rules (RFC 9113 §8.2,
 * nghttpx's http2.cc): pseudo-header fields to and from the start line,
 * :authority and Host, cookie crumbs, connection-specific fields and
 * Transfer-Encoding dropped, a body without a length chunked. Pure: no
 * session, no sockets; the HTTP/1.1 side is parsed by http1.c. */
#ifndef SLUICE_H2MSG_H
#define SLUICE_H2MSG_H

#include <stddef.h>
#include <stdint.h>
#include <nghttp2/nghttp2.h>
#include "http1.h"

struct evbuffer;

/* ---- (a) an HTTP/2 header list -> HTTP/1.1 text -------------------------- */

/* The fields of one HEADERS block as nghttp2 decoded them (lowercase
 * names, pseudo-fields first, already checked against RFC 9113 §8.2), held
 * up to max_bytes (name + value + 4 per field, as the HTTP/1.1 text would
 * take) and HTTP1_MAX_HEADERS fields. */
struct h2msg_fields;

struct h2msg_fields *h2msg_fields_new(size_t max_bytes);
void h2msg_fields_free(struct h2msg_fields *f);
/* Forget the fields (the next block of the same stream: trailers). */
void h2msg_fields_clear(struct h2msg_fields *f);
/* 0, or 431 once the block is past its bounds (the fields are then
 * dropped; further adds keep failing until a clear). */
int h2msg_fields_add(struct h2msg_fields *f, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen);
/* The value of pseudo-field or field name (NULL: absent; the first one). */
const char *h2msg_fields_get(const struct h2msg_fields *f, const char *name, size_t *len);

/* The HTTP/1.1 head for f, appended to out: a request line
 * "METHOD :path HTTP/1.1" (Host from :authority, else the Host field),
 * or a status line from :status (kind HTTP1_RESPONSE). Cookie crumbs
 * joined with "; ", TE and connection-specific fields dropped,
 * Content-Length kept; with none and body_follows, "Transfer-Encoding:
 * chunked" is added and *chunked set (the body then goes through
 * h2msg_chunk / h2msg_last_chunk). extra (NULL: none) is appended to the
 * fields as is ("Name: value\r\n" lines). Returns 0, or the status to
 * answer instead: 400 (no method, path or status; :authority and a
 * different Host; a bad :status), 501 (CONNECT). */
int h2msg_head_text(const struct h2msg_fields *f, enum http1_kind kind, int body_follows,
                    const char *extra, struct evbuffer *out, int *chunked);
/* A chunk of len bytes (none when len is 0), and the last chunk with f's
 * fields (NULL: none) as trailers, in HTTP/1.1 chunked coding. */
void h2msg_chunk(struct evbuffer *out, const void *data, size_t len);
void h2msg_last_chunk(struct evbuffer *out, const struct h2msg_fields *trailers);

/* ---- (b) HTTP/1.1 text -> an HTTP/2 header list, body and trailers ------ */

/* Reads one HTTP/1.1 message after another (several heads for a response
 * with 1xx before its final one) from bytes as they come. */
struct h2msg_reader;

/* kind: what is read. max_head: the longest head taken (http1.c's bound). */
struct h2msg_reader *h2msg_reader_new(enum http1_kind kind, size_t max_head);
void h2msg_reader_free(struct h2msg_reader *r);
/* The next response answers a HEAD request (no body follows its head). */
void h2msg_reader_head_request(struct h2msg_reader *r, int head);
/* For a request: the :scheme its header list says ("https", "http"). */
void h2msg_reader_scheme(struct h2msg_reader *r, const char *scheme);

enum h2msg_event {
    H2MSG_ERROR = -1,   /* bad head or framing: the message cannot go on */
    H2MSG_NEED,         /* more bytes needed */
    H2MSG_HEAD,         /* a head: h2msg_reader_nv(); 1xx (non-final) ones
                         * are followed by another head */
    H2MSG_DATA,         /* payload moved to body */
    H2MSG_END,          /* the message is complete: its trailers are
                         * h2msg_reader_nv() (none: 0 fields) */
};

/* Take what the bytes in `in` allow (the bytes used are drained): one
 * event; payload goes to body, at most max_body bytes per call. */
enum h2msg_event h2msg_read(struct h2msg_reader *r, struct evbuffer *in,
                            struct evbuffer *body, size_t max_body);
/* The peer closed: 1 when that ends the message (a response body delimited
 * by the close), 0 when the message was cut short. */
int h2msg_reader_eof(struct h2msg_reader *r);

/* After H2MSG_HEAD: the fields as HTTP/2 wants them (pseudo-fields first,
 * lowercase names; hop-by-hop fields, those Connection names,
 * Transfer-Encoding and, for a request, Host dropped); after H2MSG_END,
 * the trailers. Valid until the next h2msg_read. */
const nghttp2_nv *h2msg_reader_nv(const struct h2msg_reader *r, size_t *n);
/* About the last head: its status (response), 1 for a 1xx other than 101,
 * and whether a body follows (0: END_STREAM on its HEADERS). */
int h2msg_reader_status(const struct h2msg_reader *r);
int h2msg_reader_interim(const struct h2msg_reader *r);
int h2msg_reader_body(const struct h2msg_reader *r);
/* The last head as http1.c parsed it (offsets into h2msg_reader_text()). */
const struct http1_head *h2msg_reader_head(const struct h2msg_reader *r);
const char *h2msg_reader_text(const struct h2msg_reader *r);

#endif
