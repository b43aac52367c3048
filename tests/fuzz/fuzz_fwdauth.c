/* sluice - fuzz_fwdauth.c: libFuzzer target for the request a gateway
 * describes (fwdauth.c).
 *
 * Input: byte 0 picks decision.path_prefix ("/decide", "/a/b" or "/x");
 * the rest is a request head (LF becomes CRLF, so the fuzzer reaches valid
 * heads), parsed by http1_head_parse and described. Invariants:
 * - every span of the described head stays inside the head's bytes, and its
 *   host index is -1 or a field's;
 * - only FWDAUTH_DESCRIBED changes the head; FWDAUTH_BAD names one of the
 *   three errors;
 * - a described target is the original's tail after the prefix (Envoy) or
 *   a field's whole value; a described method is the request's or a token
 *   of 1 to 32 bytes;
 * - the described target then goes through route_normalize as request.c
 *   takes it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fwdauth.h"
#include "http1.h"
#include "route.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const prefixes[] = { "/decide", "/a/b", "/x" };

static int span_in(struct http1_span s, size_t len)
{
    return (size_t)s.off + s.len <= len;
}

static int is_field_value(const struct http1_head *h, struct http1_span s)
{
    for (int i = 0; i < h->nheaders; i++)
        if (h->h[i].value.off == s.off && h->h[i].value.len == s.len)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char buf[2 * 4096 + 4];
    static struct http1_head h, before;
    static char out[2 * 4096 + 4];
    struct conf c;
    size_t n = 0;
    if (size < 1 || size > 4096)
        return 0;
    memset(&c, 0, sizeof c);
    c.decision.on = 1;
    c.decision.path_prefix = (char *)prefixes[data[0] % 3];
    c.decision.path_prefix_len = strlen(c.decision.path_prefix);
    for (size_t i = 1; i < size; i++) {
        if (data[i] == '\n')
            buf[n++] = '\r';
        buf[n++] = (char)data[i];
    }
    struct http1 *p = http1_create(HTTP1_REQUEST);
    int rc = http1_head_parse(p, buf, n, sizeof buf, 0, &h);
    http1_destroy(p);
    if (rc != 0)
        return 0;
    before = h;
    const char *error = NULL;
    enum fwdauth_kind kind = fwdauth_describe(&c, buf, &h, &error);
    fuzz_check(span_in(h.method, h.len) && span_in(h.target, h.len));
    fuzz_check(h.host >= -1 && h.host < h.nheaders);
    if (kind != FWDAUTH_DESCRIBED) {
        fuzz_check(memcmp(&h, &before, sizeof h) == 0);
        if (kind == FWDAUTH_BAD)
            fuzz_check(error && (!strcmp(error, "missing_uri") ||
                                 !strcmp(error, "ambiguous_description") ||
                                 !strcmp(error, "bad_method")));
        return 0;
    }
    size_t plen = c.decision.path_prefix_len;
    int envoy = h.target.off == before.target.off + plen &&
                h.target.len + plen == before.target.len;
    fuzz_check(envoy || is_field_value(&before, h.target));
    fuzz_check(!envoy || (h.target.len >= 1 && buf[h.target.off] == '/'));
    if (h.method.off != before.method.off) {
        fuzz_check(h.method.len >= 1 && h.method.len <= 32);
        for (uint32_t i = 0; i < h.method.len; i++)
            fuzz_check((unsigned char)buf[h.method.off + i] > ' ' &&
                       (unsigned char)buf[h.method.off + i] < 0x7f);
    }
    long m = route_normalize(buf + h.target.off, h.target.len, out);
    fuzz_check(m < 0 || (size_t)m <= h.target.len);
    return 0;
}
