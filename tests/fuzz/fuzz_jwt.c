/* sluice - fuzz_jwt.c: libFuzzer target for JSON Web Token parsing (core/jwt.c).
 *
 * Byte 0 picks what the rest is:
 *   0  a token, verified against a fixed JWKS (RS256, ES256, EdDSA and an
 *      oct key; the seeds hold tokens it signed) at a fixed clock;
 *   1  header JSON, NUL, payload JSON: made into a token here (base64url,
 *      an empty signature), so mutations reach the JSON reader through the
 *      token's own path;
 *   2  a JWKS document, loaded and freed;
 *   3  payload JSON through the claims checks alone.
 * Invariants: a status is one of enum jwt_status; a verified token (or a
 * payload passing the checks) has claims inside the buffer whose sub, if
 * any, lies within them; an unsigned token (1) is never verified; nothing
 * leaks (ASan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jwt.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char jwks_text[] = "{\"keys\": [{\"kty\": \"RSA\", \"n\": \"osrE42shs882AN_i8miFuNGNFLDNpZX42Vg-Sm7hCF7YlzNAwciQM4xRnEIR2ZHX7v2VVeFHhq0tvmfKwwvqfgp_fK_SsN4FnwmAgTtGk1Ryc2epfSK1EUUySa6DzK3uc6-rtGps40hS9bewumruKsRtI0HFcN8rtLduC1UBiu5P2dFUjMqx7khzqgn1rlxcL_QWkAKpJVo-OcSJ2j_ZULhrAnq9XwtzPQuTs8DKnBTOkNT0Mz9wteyRCnwH3nL4nYMuAirdNRpQjyVoevWQTtMOVlorp5T0kg52p9szDhGwRHO6MITu4MFrzcxj1wmcXuK3rSmQ3k1LoKy55uZuMQ\", \"e\": \"AQAB\", \"kid\": \"r\"}, {\"kty\": \"EC\", \"crv\": \"P-256\", \"x\": \"3j-L490UVAvX7fxuFpKZ90lxgQvjkQpAa1gqID2q1zc\", \"y\": \"mitPb056Wt_u4y33RndS4TXlUUX0qjKL3_jLDb2Tugo\", \"kid\": \"e\"}, {\"kty\": \"OKP\", \"crv\": \"Ed25519\", \"x\": \"zQ2MMnrYaM5xw7vryzhisNGPQ1iyh0r1BadpsysKTEk\", \"kid\": \"d\"}, {\"kty\": \"oct\", \"k\": \"Lyf6OeUZyuMPxVTZiIZn4OEpN3BhI-07nRI7YXMU3sg\", \"kid\": \"h\"}]}";
static struct jwt_keys *keys;
static const struct jwt_rules rules = { "https://issuer.test", "api", 30 };
static char claims[JWT_MAX_CLAIMS];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char why[256];
    keys = jwt_keys_jwks(jwks_text, sizeof jwks_text - 1, why, sizeof why);
    if (keys == NULL) {
        fprintf(stderr, "fuzz_jwt: %s\n", why);
        abort();
    }
    return 0;
}

static void b64url(const uint8_t *s, size_t n, char *out, size_t *w)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        out[(*w)++] = a[v >> 18];
        out[(*w)++] = a[(v >> 12) & 63];
        if (i + 1 < n)
            out[(*w)++] = a[(v >> 6) & 63];
        if (i + 2 < n)
            out[(*w)++] = a[v & 63];
    }
}

static void check_claims(int st, size_t clen)
{
    const char *v;
    size_t vlen;
    fuzz_check(st >= JWT_OK && st <= JWT_BAD_AUDIENCE);
    if (st != JWT_OK)
        return;
    fuzz_check(clen <= JWT_MAX_CLAIMS);
    if (jwt_claim(claims, clen, "sub", 3, &v, &vlen))
        fuzz_check(v >= claims && v + vlen <= claims + clen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t clen = 0;
    int64_t exp;
    char why[256];
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] & 3) {
    case 0:
        check_claims(jwt_verify(keys, &rules, (const char *)p, n, 0, claims, &clen, &exp), clen);
        break;
    case 1: {
        const uint8_t *nul = memchr(p, 0, n);
        size_t hl = nul ? (size_t)(nul - p) : n, w = 0;
        char *tok = malloc(2 * n + 8);
        b64url(p, hl, tok, &w);
        tok[w++] = '.';
        if (nul)
            b64url(nul + 1, n - hl - 1, tok, &w);
        tok[w++] = '.';
        int st = jwt_verify(keys, &rules, tok, w, 0, claims, &clen, &exp);
        check_claims(st, clen);
        fuzz_check(st != JWT_OK);       /* no signature verifies */
        free(tok);
        break;
    }
    case 2:
        jwt_keys_free(jwt_keys_jwks((const char *)p, n, why, sizeof why));
        break;
    case 3:
        check_claims(jwt_check_payload(&rules, (const char *)p, n, 0, claims, &clen, &exp), clen);
        break;
    }
    return 0;
}
