/* sluice - fuzz_h1write_response.c: libFuzzer target for the response head
 * sluice sends back (h1write_response_check, _begin, _end), over every head
 * an upstream's bytes hold: 1xx heads first, as read_response_head goes.
 *
 * Byte 0: bit 0 the request was HEAD, bit 1 the client speaks HTTP/1.0,
 * bit 2 the connection closes after, bits 3-4 which upstream rate-limit
 * fields are dropped (enum conf_headers). The body framing for the client is
 * chosen as proxy.c does: chunked for an HTTP/1.1 client when the upstream's
 * body is chunked or ends at its close. Invariants: fuzz_h1write.h; besides,
 * the status goes back unchanged, and a 1xx, 204 or 304 carries neither
 * Content-Length nor Transfer-Encoding. */
#include "fuzz_h1write.h"

#define FUZZ_MAX_HEADS 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int no_body_status(int st)
{
    return (st >= 100 && st < 200) || st == 204 || st == 304;
}

/* One head at buf[0..n): check, write, parse again. Returns its length, or 0
 * when no head was there (or it is the last one to look at). */
static size_t one_head(uint8_t flags, const char *buf, size_t n)
{
    int head_request = flags & 1, client10 = (flags >> 1) & 1;
    struct http1 *p = http1_create(HTTP1_RESPONSE);
    struct http1_head *h = malloc(sizeof *h), *r = malloc(sizeof *r);
    size_t used = 0;
    fuzz_check(h != NULL && r != NULL);
    if (http1_head_parse(p, buf, n, FUZZ_MAX_HEAD, head_request, h) != 0)
        goto out;
    int rc = h1write_response_check(buf, h);
    fuzz_check(rc == 0 || rc == 502);

    int eof_body = h->body == HTTP1_BODY_CHUNKED || h->body == HTTP1_BODY_EOF;
    struct h1write_resp o = {
        .rid = "0123456789abcdef", .rid_len = 16,
        .limits = (enum conf_headers)((flags >> 3) & 3),
        .head_request = head_request,
        .chunked = eof_body && !client10,
        .close = ((flags >> 2) & 1) || (eof_body && client10),
        .keep_alive_10 = client10,
    };
    struct evbuffer *eb = evbuffer_new();
    struct obuf ob;
    fuzz_check(eb != NULL);
    obuf_begin(&ob, eb, 16);
    h1write_response_begin(&ob, buf, h, &o);
    h1write_response_end(&ob, buf, h, &o);
    obuf_end(&ob);
    size_t outlen;
    char *out = fuzz_take(eb, &outlen);
    evbuffer_free(eb);
    if (rc == 0 && !fuzz_too_many(h)) {
        fuzz_check(fuzz_reparse(HTTP1_RESPONSE, out, outlen, head_request, r) == 0);
        fuzz_check(r->len == outlen);
        fuzz_check(r->minor == 1);
        fuzz_check(r->status == h->status);
        fuzz_check(memcmp(out, "HTTP/1.1 ", 9) == 0);
        int framing = fuzz_count(out, r, "content-length") + fuzz_count(out, r, "transfer-encoding");
        fuzz_check(framing <= 1);
        if (no_body_status(h->status))
            fuzz_check(framing == 0);
        else if (head_request)
            fuzz_check(fuzz_count(out, r, "transfer-encoding") == 0);
        else if (o.chunked)
            fuzz_check(r->body == HTTP1_BODY_CHUNKED);
        else if (eof_body)      /* an HTTP/1.0 client: the close ends it */
            fuzz_check(r->body == HTTP1_BODY_EOF && fuzz_count(out, r, "connection") == 1);
        else
            fuzz_check(r->body == h->body &&
                       (h->body != HTTP1_BODY_LENGTH || r->content_length == h->content_length));
        fuzz_check(fuzz_count(out, r, "x-request-id") >= 1);
        fuzz_check(fuzz_count(out, r, "connection") <= 1);
        if (h->status == 101)
            fuzz_check(r->upgrade);
    }
    free(out);
    if (h->status >= 100 && h->status < 200 && h->status != 101)
        used = h->len;
out:
    free(r);
    free(h);
    http1_destroy(p);
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *buf = fuzz_dup(data + 1, size - 1);
    size_t at = 0;
    for (int i = 0; i < FUZZ_MAX_HEADS; i++) {
        size_t used = one_head(data[0], buf + at, size - 1 - at);
        if (used == 0)
            break;
        at += used;
    }
    free(buf);
    return 0;
}
