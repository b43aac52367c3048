/* sluice - fuzz_h1write_request.c: libFuzzer target for the request head
 * sluice sends upstream (h1write_request_check, h1write_request).
 *
 * Byte 0: bit 0 the peer is trusted, bit 1 the request is tunnelled
 * (Upgrade kept; only when it has no body, as proxy.c does), bits 2-3 the
 * underscore mode. Invariants: fuzz_h1write.h; besides, the method and
 * target go up unchanged and the version is HTTP/1.1. */
#include "fuzz_h1write.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    char *buf = fuzz_dup(data + 1, size - 1);
    struct http1 *p = http1_create(HTTP1_REQUEST);
    struct http1_head *h = malloc(sizeof *h), *r = malloc(sizeof *r);
    fuzz_check(h != NULL && r != NULL);
    if (http1_head_parse(p, buf, size - 1, FUZZ_MAX_HEAD, 0, h) != 0)
        goto out;

    struct h1write_req o = {
        .peer = "192.0.2.1", .peer_len = 9, .rid = "0123456789abcdef", .rid_len = 16,
        .host = "127.0.0.1:9000", .host_len = 14,
        .trusted = flags & 1,
        .upgrade = (flags & 2) && h->upgrade && h->body == HTTP1_BODY_NONE,
        .underscore = (enum conf_underscore)((flags >> 2) % 3),
    };
    int rc = h1write_request_check(buf, h, o.underscore);
    fuzz_check(rc == 0 || rc == 400);

    struct evbuffer *eb = evbuffer_new();
    struct obuf ob;
    fuzz_check(eb != NULL);
    obuf_begin(&ob, eb, 16);
    h1write_request(&ob, buf, h, &o);
    obuf_end(&ob);
    size_t n;
    char *out = fuzz_take(eb, &n);
    evbuffer_free(eb);
    if (rc == 0 && !fuzz_too_many(h)) {
        fuzz_check(fuzz_reparse(HTTP1_REQUEST, out, n, 0, r) == 0);
        fuzz_check(r->len == n);
        fuzz_check(r->minor == 1);
        fuzz_check(r->method.len == h->method.len &&
                   memcmp(out + r->method.off, buf + h->method.off, h->method.len) == 0);
        fuzz_check(r->target.len == h->target.len &&
                   memcmp(out + r->target.off, buf + h->target.off, h->target.len) == 0);
        /* the same message boundary upstream as here */
        fuzz_check(r->body == h->body);
        fuzz_check(r->body != HTTP1_BODY_LENGTH || r->content_length == h->content_length);
        fuzz_check(r->host >= 0);
        fuzz_check(fuzz_count(out, r, "x-request-id") == 1);
        fuzz_check(fuzz_count(out, r, "x-forwarded-for") == 1);
        fuzz_check(fuzz_count(out, r, "x-forwarded-proto") == 1);
        fuzz_check(fuzz_count(out, r, "connection") == (o.upgrade ? 1 : 0));
        fuzz_check(fuzz_count(out, r, "transfer-encoding") + fuzz_count(out, r, "content-length") <= 1);
        if (!o.upgrade)
            fuzz_check(fuzz_count(out, r, "upgrade") == 0);
        if (!o.trusted)
            fuzz_check(fuzz_count(out, r, "forwarded") == 0 &&
                       fuzz_count(out, r, "x-real-ip") == 0);
    }
    free(out);
out:
    free(r);
    free(h);
    http1_destroy(p);
    free(buf);
    return 0;
}
