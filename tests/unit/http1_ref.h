/* sluice - http1_ref.h: the http_parser-based reference parser (http1_ref.c),
 * the same interface as src/http/http1.h under the names http1ref_*. Only
 * the differential tests use it. */
#ifndef SLUICE_HTTP1_REF_H
#define SLUICE_HTTP1_REF_H

#include "http1.h"

struct http1ref;

struct http1ref *http1ref_create(enum http1_kind kind);
void http1ref_destroy(struct http1ref *p);
int http1ref_head_parse(struct http1ref *p, const char *data, size_t len,
                        size_t max_bytes, int head_request, struct http1_head *h);
int http1ref_head_feed(struct http1ref *p, const char *data, size_t len,
                       size_t max_bytes, int head_request, struct http1_head *h);
long http1ref_body_feed(struct http1ref *p, const char *data, size_t len,
                        struct http1_piece *pieces, int *npieces, int *done);
int http1ref_body_eof(struct http1ref *p);

#endif
