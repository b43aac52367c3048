/* sluice - test_jwt.c: JSON Web Token verification (core/jwt.c) and the
 * per-worker cache of verified tokens (core/jwtcache.c).
 *
 * Known answers made at test time: tests/integration/jwtlib.py generates
 * keys and signs tokens with Python's cryptography module (RS256/384/512,
 * PS256, ES256/384, EdDSA, HS256), writing the JWKS, the secret and each
 * token with the status it must get. Run from tests/unit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <openssl/err.h>

#include "clock.h"
#include "jwt.h"
#include "jwtcache.h"

#define ISSUER "https://issuer.test"
#define AUDIENCE "api"

static char dir[] = "/tmp/sluice-jwt-XXXXXX";
static struct jwt_keys *jwks, *secret;
static const struct jwt_rules rules = { ISSUER, AUDIENCE, 30 };

static char *slurp(const char *name, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 20);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

static int setup(void **state)
{
    char cmd[512], why[256];
    size_t len;
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 ../integration/jwtlib.py vectors %s", dir);
    if (system(cmd) != 0)
        return -1;
    char *j = slurp("jwks.json", &len);
    jwks = jwt_keys_jwks(j, len, why, sizeof why);
    free(j);
    if (jwks == NULL) {
        fprintf(stderr, "jwks: %s\n", why);
        return -1;
    }
    char *s = slurp("secret", &len);
    secret = jwt_keys_secret(s, len);
    free(s);
    return secret ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[512];
    jwt_keys_free(jwks);
    jwt_keys_free(secret);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Every vector gets its status; a valid token's sub is the one signed. */
static void test_vectors(void **state)
{
    size_t len, n = 0;
    char *all = slurp("vectors.tsv", &len), *save = NULL;
    static char claims[JWT_MAX_CLAIMS];
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *want = line, *name = strchr(want, '\t');
        assert_non_null(name);
        *name++ = '\0';
        char *tok = strchr(name, '\t');
        assert_non_null(tok);
        *tok++ = '\0';
        size_t clen;
        int64_t exp;
        const struct jwt_keys *k = strncmp(name, "HS256", 5) == 0 ? secret : jwks;
        int st = jwt_verify(k, &rules, tok, strlen(tok), time(NULL), claims, &clen, &exp);
        if (strcmp(jwt_status_name(st), want) != 0)
            fail_msg("%s: got %s, want %s", name, jwt_status_name(st), want);
        if (ERR_peek_error() != 0)      /* a worker's TLS would read it as its own */
            fail_msg("%s: left an OpenSSL error queued", name);
        if (strncmp(name, "valid ", 6) == 0) {
            const char *v;
            size_t vlen;
            char sub[32];
            snprintf(sub, sizeof sub, "s-%s", name + 6);
            assert_true(jwt_claim(claims, clen, "sub", 3, &v, &vlen));
            assert_int_equal(vlen, strlen(sub));
            assert_memory_equal(v, sub, vlen);
            assert_true(exp > time(NULL));
        }
        if (strcmp(name, "integer sub") == 0) {
            const char *v;
            size_t vlen;
            assert_true(jwt_claim(claims, clen, "uid", 3, &v, &vlen));
            assert_int_equal(vlen, 2);
            assert_memory_equal(v, "42", 2);
        }
        n++;
    }
    assert_true(n >= 30);
    free(all);
}

static int payload(const char *json, char *claims, size_t *clen)
{
    int64_t exp;
    struct jwt_rules none = { NULL, NULL, 0 };
    return jwt_check_payload(&none, json, strlen(json), 1000, claims, clen, &exp);
}

/* The JSON reader is strict: what RFC 8259 refuses, and a name twice. */
static void test_json_strict(void **state)
{
    static char claims[JWT_MAX_CLAIMS];
    size_t clen;
    static const char *const bad[] = {
        "", "[]", "{", "{\"a\":1,}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}", "{'a':1}",
        "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\\ud800\"}",
        "{\"a\":\"\x01\"}", "{\"a\":\"\xc3\x28\"}", "{\"a\":\"\xed\xa0\x80\"}",
        "{\"a\":1}x", "{\"a\":1,\"a\":2}", "{\"a\":tru}", "{\"a\":[1,]}",
        "{\"a\":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}", "{\"a\" 1}", "{\"exp\":\"soon\"}",
        "{\"exp\":1e3}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (payload(bad[i], claims, &clen) != JWT_MALFORMED)
            fail_msg("accepted %s", bad[i]);
    assert_int_equal(payload(" {\"a\":{\"b\":[1,{\"a\":2}]},\"c\":null} ", claims, &clen), JWT_OK);
    assert_int_equal(payload("{}", claims, &clen), JWT_OK);
}

/* Claims: strings decoded, integers as sent, anything else not a claim. */
static void test_claims(void **state)
{
    static char claims[JWT_MAX_CLAIMS];
    size_t clen, vlen;
    const char *v;
    assert_int_equal(payload("{\"s\":\"a\\u00e9\\ud83d\\ude00\\n\",\"i\":-7,\"f\":1.5,"
                             "\"b\":true,\"o\":{\"x\":1},\"e\":\"\"}", claims, &clen), JWT_OK);
    assert_true(jwt_claim(claims, clen, "s", 1, &v, &vlen));
    assert_int_equal(vlen, 8);
    assert_memory_equal(v, "a\xc3\xa9\xf0\x9f\x98\x80\n", 8);
    assert_true(jwt_claim(claims, clen, "i", 1, &v, &vlen));
    assert_memory_equal(v, "-7", 2);
    assert_true(jwt_claim(claims, clen, "e", 1, &v, &vlen));
    assert_int_equal(vlen, 0);
    assert_false(jwt_claim(claims, clen, "f", 1, &v, &vlen));
    assert_false(jwt_claim(claims, clen, "b", 1, &v, &vlen));
    assert_false(jwt_claim(claims, clen, "o", 1, &v, &vlen));
    assert_false(jwt_claim(claims, clen, "x", 1, &v, &vlen));   /* not top level */
    assert_false(jwt_claim(claims, clen, "missing", 7, &v, &vlen));
}

/* exp and nbf against the clock and the leeway, at their edges. */
static void test_times(void **state)
{
    static char claims[JWT_MAX_CLAIMS];
    size_t clen;
    int64_t exp;
    struct jwt_rules r = { NULL, NULL, 10 };
    const char *p = "{\"exp\":1000,\"nbf\":900.5}";
    assert_int_equal(jwt_check_payload(&r, p, strlen(p), 1009, claims, &clen, &exp), JWT_OK);
    assert_int_equal(exp, 1000);
    assert_int_equal(jwt_check_payload(&r, p, strlen(p), 1010, claims, &clen, &exp), JWT_EXPIRED);
    assert_int_equal(jwt_check_payload(&r, p, strlen(p), 890, claims, &clen, &exp), JWT_OK);
    assert_int_equal(jwt_check_payload(&r, p, strlen(p), 889, claims, &clen, &exp), JWT_NOT_YET);
}

/* A JWKS the loader refuses, each with its reason. */
static void test_jwks_refused(void **state)
{
    static const char *const bad[][2] = {
        { "[]", "not a JSON object" },
        { "{\"keys\":{}}", "no \"keys\" array" },
        { "{\"keys\":[]}", "no signing key" },
        { "{\"keys\":[{\"kty\":\"RSA\",\"use\":\"enc\",\"n\":\"AQAB\",\"e\":\"AQAB\"}]}",
          "no signing key" },
        { "{\"keys\":[{\"kty\":\"RSA\",\"n\":\"AQAB\",\"e\":\"AQAB\"}]}", "shorter than 2048" },
        { "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-521\",\"x\":\"AA\",\"y\":\"AA\"}]}",
          "P-256 or P-384" },
        { "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\","
          "\"y\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}]}", "not on its curve" },
        { "{\"keys\":[{\"kty\":\"oct\",\"k\":\"c2hvcnQ\"}]}", "32 bytes" },
        { "{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"X25519\",\"x\":\"AA\"}]}", "Ed25519" },
        { "{\"keys\":[{\"kty\":\"oct\",\"alg\":\"RS256\",\"k\":"
          "\"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE\"}]}", "alg is not" },
        { "{\"keys\":[{\"kty\":\"oct\",\"kid\":\"a\",\"k\":"
          "\"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE\"},{\"kty\":\"oct\",\"kid\":\"a\",\"k\":"
          "\"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE\"}]}", "keys[1]: kid used twice" },
        { "{\"keys\":[{\"kty\":\"foo\"}]}", "keys[0]: kty is not" },
    };
    char why[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        struct jwt_keys *k = jwt_keys_jwks(bad[i][0], strlen(bad[i][0]), why, sizeof why);
        if (k != NULL || strstr(why, bad[i][1]) == NULL)
            fail_msg("%s: got '%s', want '%s'", bad[i][0], why, bad[i][1]);
        assert_int_equal(ERR_peek_error(), 0);
    }
    assert_null(jwt_keys_secret("short", 5));
}

/* First token of vectors.tsv named name. */
static char *vector(const char *name)
{
    size_t len;
    char *all = slurp("vectors.tsv", &len), *save = NULL, *out = NULL;
    for (char *line = strtok_r(all, "\n", &save); line && !out; line = strtok_r(NULL, "\n", &save)) {
        char *n = strchr(line, '\t');
        if (n && strncmp(n + 1, name, strlen(name)) == 0 && n[1 + strlen(name)] == '\t')
            out = strdup(n + 2 + strlen(name));
    }
    free(all);
    assert_non_null(out);
    return out;
}

/* A repeat is a cache hit (no signature check: measured below), an entry
 * ends at its token's exp, another key set never sees it, and a failure is
 * not kept. */
static void test_cache(void **state)
{
    struct jwtcache *jc = jwtcache_create(2);
    char *tok = vector("valid ES256"), *bad = vector("flipped ES256");
    const char *c1, *c2, *v;
    size_t l1, l2, vlen;
    int hit;
    int64_t now = time(NULL);
    assert_int_equal(jwtcache_verify(jc, jwks, &rules, tok, strlen(tok), now, &c1, &l1, &hit),
                     JWT_OK);
    assert_false(hit);
    assert_int_equal(jwtcache_size(jc), 1);
    assert_int_equal(jwtcache_verify(jc, jwks, &rules, tok, strlen(tok), now, &c2, &l2, &hit),
                     JWT_OK);
    assert_true(hit);
    assert_ptr_equal(c1, c2);           /* the entry's own claims */
    assert_true(jwt_claim(c2, l2, "sub", 3, &v, &vlen));
    assert_memory_equal(v, "s-ES256", 7);
    assert_int_equal(jwtcache_verify(jc, jwks, &rules, bad, strlen(bad), now, &c1, &l1, &hit),
                     JWT_BAD_SIGNATURE);
    assert_int_equal(jwtcache_size(jc), 1);
    /* another key set (a reload's) verifies again, and refuses: no key
     * of it has the token's kid */
    assert_int_equal(jwtcache_verify(jc, secret, &rules, tok, strlen(tok), now, &c1, &l1, &hit),
                     JWT_NO_KEY);
    /* past exp + leeway the entry goes */
    assert_int_equal(jwtcache_verify(jc, jwks, &rules, tok, strlen(tok), now + 3600 + 30, &c1,
                                     &l1, &hit), JWT_EXPIRED);
    assert_int_equal(jwtcache_size(jc), 0);
    /* bounded: the least recently used goes */
    char *t2 = vector("valid RS256"), *t3 = vector("valid EdDSA");
    jwtcache_verify(jc, jwks, &rules, tok, strlen(tok), now, &c1, &l1, &hit);
    jwtcache_verify(jc, jwks, &rules, t2, strlen(t2), now, &c1, &l1, &hit);
    jwtcache_verify(jc, jwks, &rules, t3, strlen(t3), now, &c1, &l1, &hit);
    assert_int_equal(jwtcache_size(jc), 2);
    free(t2);
    free(t3);
    free(tok);
    free(bad);
    jwtcache_destroy(jc);
}

/* What a repeat saves: a verify against a cache hit, per algorithm
 * (printed, not asserted: the machine is shared). */
static void test_measure(void **state)
{
    static const char *const names[] = { "valid RS256", "valid PS256", "valid ES256",
                                         "valid ES384", "valid EdDSA", "HS256 secret" };
    static char claims[JWT_MAX_CLAIMS];
    int64_t now = time(NULL), exp;
    enum { N = 300 };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *tok = vector(names[i]);
        const struct jwt_keys *k = i == 5 ? secret : jwks;
        struct jwtcache *jc = jwtcache_create(16);
        const char *c;
        size_t clen;
        int hit;
        int64_t t0 = clock_us();
        for (int n = 0; n < N; n++)
            assert_int_equal(jwt_verify(k, &rules, tok, strlen(tok), now, claims, &clen, &exp),
                             JWT_OK);
        int64_t t1 = clock_us();
        for (int n = 0; n < N; n++)
            assert_int_equal(jwtcache_verify(jc, k, &rules, tok, strlen(tok), now, &c, &clen,
                                             &hit), JWT_OK);
        int64_t t2 = clock_us();
        printf("jwt %-13s verify %7.2f us, cache hit %5.2f us\n", names[i],
               (double)(t1 - t0) / N, (double)(t2 - t1) / N);
        jwtcache_destroy(jc);
        free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_json_strict),
        cmocka_unit_test(test_claims),
        cmocka_unit_test(test_times),
        cmocka_unit_test(test_jwks_refused),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_measure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
