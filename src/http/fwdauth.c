/* sluice - fwdauth.c: the request a gateway describes (fwdauth.h).
 *
 * Every field read here is the gateway's or its client's: each is looked
 * up whole (a second copy is ambiguous, never "the first"), and a client
 * cannot pick the family sluice believes by adding the other one. */
#include <string.h>

#include "fwdauth.h"

#define FWDAUTH_ONE_MISSING  (-1)
#define FWDAUTH_ONE_TWICE    (-2)

/* The index of the one field called name with a non-empty value,
 * FWDAUTH_ONE_MISSING, or FWDAUTH_ONE_TWICE. An empty value counts as
 * absent (nginx sends none for an empty variable). */
static int one_field(const char *buf, const struct http1_head *h, const char *name)
{
    int found = FWDAUTH_ONE_MISSING;
    for (int i = http1_find(buf, h, name, 0); i >= 0; i = http1_find(buf, h, name, i + 1)) {
        if (h->h[i].value.off == UINT32_MAX || h->h[i].value.len == 0)
            continue;
        if (found >= 0)
            return FWDAUTH_ONE_TWICE;
        found = i;
    }
    return found;
}

/* A method is a token (RFC 9110 tchar), as the request line's. */
static int is_token(const char *s, size_t n)
{
    if (n == 0 || n > 32)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              (ch && strchr("!#$%&'*+-.^_`|~", ch))))
            return 0;
    }
    return 1;
}

/* One of two alternative fields: the index of the one present, -1 when
 * neither is, FWDAUTH_ONE_TWICE when both are or one is twice. */
static int either_field(const char *buf, const struct http1_head *h, const char *a,
                        const char *b)
{
    int i = one_field(buf, h, a), j = one_field(buf, h, b);
    if (i == FWDAUTH_ONE_TWICE || j == FWDAUTH_ONE_TWICE || (i >= 0 && j >= 0))
        return FWDAUTH_ONE_TWICE;
    return i >= 0 ? i : j;
}

enum fwdauth_kind fwdauth_describe(const struct conf *conf, const char *buf,
                                   struct http1_head *h, const char **error)
{
    const char *t = buf + h->target.off;
    size_t tlen = h->target.len;
    const char *q = memchr(t, '?', tlen);
    size_t plen = q ? (size_t)(q - t) : tlen;
    const char *prefix = conf->decision.path_prefix;
    size_t n = conf->decision.path_prefix_len;

    if (plen == sizeof(FWDAUTH_RLS_PATH) - 1 && memcmp(t, FWDAUTH_RLS_PATH, plen) == 0)
        return FWDAUTH_RLS;
    if (plen < n || memcmp(t, prefix, n) != 0 || (plen > n && t[n] != '/'))
        return FWDAUTH_NOT_FOUND;
    if (plen > n) {                     /* Envoy: P/rest is the request /rest */
        h->target.off += (uint32_t)n;
        h->target.len -= (uint32_t)n;
        return FWDAUTH_DESCRIBED;
    }

    int uri = either_field(buf, h, "x-forwarded-uri", "x-original-uri");
    int method = either_field(buf, h, "x-forwarded-method", "x-original-method");
    int host = one_field(buf, h, "x-forwarded-host");
    if (uri == FWDAUTH_ONE_TWICE || method == FWDAUTH_ONE_TWICE || host == FWDAUTH_ONE_TWICE) {
        *error = "ambiguous_description";
        return FWDAUTH_BAD;
    }
    if (uri < 0) {
        *error = "missing_uri";
        return FWDAUTH_BAD;
    }
    /* The method of the URI's family: X-Original-Method beside
     * X-Forwarded-Uri would be a client's, not the gateway's. */
    if (method >= 0 &&
        http1_name_is(buf, &h->h[uri], "x-forwarded-uri") !=
        http1_name_is(buf, &h->h[method], "x-forwarded-method")) {
        *error = "ambiguous_description";
        return FWDAUTH_BAD;
    }
    if (method >= 0) {
        if (!is_token(buf + h->h[method].value.off, h->h[method].value.len)) {
            *error = "bad_method";
            return FWDAUTH_BAD;
        }
        h->method = h->h[method].value;
    }
    h->target = h->h[uri].value;
    if (host >= 0)
        h->host = host;
    return FWDAUTH_DESCRIBED;
}
