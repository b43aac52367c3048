/* sluice - jwt.h: JSON Web Tokens (RFC 7519) verified, their claims read.
 *
 * A token in JWS compact form (RFC 7515) is checked against a key set (a
 * JWKS document, or one HS256 secret) with OpenSSL's EVP: RS256/384/512,
 * PS256, ES256/384, EdDSA (Ed25519), HS256; then iss, aud, exp and nbf
 * against rules and a clock given by the caller. Pure: no I/O, no clock of
 * its own, no global state; any thread may call it at once on one key set,
 * and it leaves nothing in the thread's OpenSSL error queue, which the
 * next OpenSSL user on the thread would otherwise read as its own.
 * The verified claims come out as a small flat buffer the caller owns. */
#ifndef SLUICE_JWT_H
#define SLUICE_JWT_H

#include <stddef.h>
#include <stdint.h>

#define JWT_MAX_TOKEN  8192             /* longer tokens are refused unread */
#define JWT_MAX_CLAIMS JWT_MAX_TOKEN    /* bytes of a claims buffer */
#define JWT_MAX_KEYS   64               /* keys of one JWKS */
#define JWT_MIN_SECRET 32               /* HS256 secret bytes (RFC 7518 3.2) */

enum jwt_status {
    JWT_OK = 0,
    JWT_MALFORMED,      /* not three base64url parts of strict JSON objects */
    JWT_BAD_ALG,        /* none, unknown, crit, or not the key's type */
    JWT_NO_KEY,         /* no key of the set has its kid (or fits its alg) */
    JWT_BAD_SIGNATURE,
    JWT_EXPIRED,        /* now >= exp + leeway */
    JWT_NOT_YET,        /* now + leeway < nbf */
    JWT_BAD_ISSUER,
    JWT_BAD_AUDIENCE,
};

/* A short name for logs and tests: "ok", "malformed", "bad_alg"... */
const char *jwt_status_name(int status);

/* A key set. Created once (a config load), then read by any thread. */
struct jwt_keys;

/* From a JWKS document ({"keys": [...]}, RFC 7517): RSA (n, e; 2048 bits
 * at least), EC (crv P-256 or P-384, x, y), OKP (crv Ed25519, x) and oct
 * (k, 32 bytes at least) keys; a key with "use" other than "sig" is left
 * out. NULL on any other content, with why (a NUL-terminated sentence) set. */
struct jwt_keys *jwt_keys_jwks(const char *json, size_t len, char *why, size_t whylen);
/* One HS256 secret (JWT_MIN_SECRET bytes at least, else NULL). */
struct jwt_keys *jwt_keys_secret(const void *secret, size_t len);
void jwt_keys_free(struct jwt_keys *k);
/* A number no other key set of this process has: caches of verified
 * tokens keep what one set verified apart from another's. */
uint64_t jwt_keys_id(const struct jwt_keys *k);

struct jwt_rules {
    const char *issuer;         /* iss must equal it; NULL: not checked */
    const char *audience;       /* aud (a string or an array) must hold it; NULL: not checked */
    int64_t leeway_s;           /* allowed clock difference for exp and nbf */
};

/* Verify token[0..len) at now_s (Unix seconds). On JWT_OK the payload's
 * claims are in claims[0..*claims_len) (claims holds JWT_MAX_CLAIMS bytes;
 * read them with jwt_claim) and *exp is its exp, or INT64_MAX without one.
 * Any other status: nothing of the token may be used. */
int jwt_verify(const struct jwt_keys *keys, const struct jwt_rules *rules,
               const char *token, size_t len, int64_t now_s,
               char *claims, size_t *claims_len, int64_t *exp);

/* The claim named name in a claims buffer: 1 with a string's decoded value
 * or an integer's text (as sent, e.g. "42") in *v, *vlen; 0 when absent or
 * of another type (a fraction, a boolean, null, an array, an object). */
int jwt_claim(const char *claims, size_t claims_len, const char *name, size_t namelen,
              const char **v, size_t *vlen);

/* For the fuzz target and the tests: the payload checks alone (JSON of one
 * object, exp, nbf, iss, aud) over decoded bytes; the same status. */
int jwt_check_payload(const struct jwt_rules *rules, const char *json, size_t len,
                      int64_t now_s, char *claims, size_t *claims_len, int64_t *exp);

#endif
