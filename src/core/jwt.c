/* sluice - jwt.c: JSON Web Tokens verified with OpenSSL 3's EVP (jwt.h).
 *
 * Everything a token's bytes go through is here: strict base64url, a small
 * strict JSON reader (RFC 8259: UTF-8 checked, duplicate names refused,
 * depth bounded), the signature check and the claims' rules. A JSON
 * object is read into a flat list of members, each
 *   [type:1][name length:4][value length:4][name][value]
 * with a string's value decoded and any other value as its JSON text. The
 * same reader takes the JWKS document a config load gives. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

#include "jwt.h"
#include "mem.h"

#define JSON_MAX_DEPTH 16
#define JWT_MAX_HEADER 1024             /* decoded header bytes */
#define JWT_MAX_SIG    1024             /* decoded signature bytes (RSA 8192) */
#define JWT_MAX_KID    256
#define JWT_MIN_RSA_BITS 2048
#define JWT_ERR ((size_t)-1)

/* ---- base64url (RFC 4648 5), unpadded, canonical ---- */

static int b64val(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '-')
        return 62;
    if (ch == '_')
        return 63;
    return -1;
}

/* s[0..n) into out[cap]: its length, or -1 (a byte outside the alphabet,
 * padding, a length of 4k+1, bits set past the last byte, too long). */
static long b64url_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    size_t len = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
    uint32_t acc = 0;
    size_t w = 0;
    if (n % 4 == 1 || len > cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[w++] = (unsigned char)(acc >> 16);
            out[w++] = (unsigned char)(acc >> 8);
            out[w++] = (unsigned char)acc;
            acc = 0;
        }
    }
    if (n % 4 == 2) {
        if (acc & 0xf)
            return -1;
        out[w++] = (unsigned char)(acc >> 4);
    } else if (n % 4 == 3) {
        if (acc & 0x3)
            return -1;
        out[w++] = (unsigned char)(acc >> 10);
        out[w++] = (unsigned char)(acc >> 2);
    }
    return (long)w;
}

/* ---- strict JSON ---- */

enum { J_STR = 1, J_INT, J_NUM, J_TRUE, J_FALSE, J_NULL, J_ARR, J_OBJ };

/* Where decoded bytes go; p NULL: only checked. */
struct jout {
    char *p;
    size_t cap, len;
};

static int jput(struct jout *o, const void *s, size_t n)
{
    if (o->p == NULL)
        return 0;
    if (n > o->cap - o->len)
        return -1;
    memcpy(o->p + o->len, s, n);
    o->len += n;
    return 0;
}

static size_t json_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* The length of the well-formed UTF-8 sequence at u[0..left), or 0. */
static size_t utf8_len(const unsigned char *u, size_t left)
{
    size_t len;
    uint32_t cp, min;
    if (u[0] < 0x80)
        return 1;
    if (u[0] >= 0xc2 && u[0] <= 0xdf)
        len = 2, cp = u[0] & 0x1f, min = 0x80;
    else if (u[0] >= 0xe0 && u[0] <= 0xef)
        len = 3, cp = u[0] & 0x0f, min = 0x800;
    else if (u[0] >= 0xf0 && u[0] <= 0xf4)
        len = 4, cp = u[0] & 0x07, min = 0x10000;
    else
        return 0;
    if (len > left)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((u[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (u[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

static long hex4(const char *s, size_t n, size_t i)
{
    long v = 0;
    if (n - i < 4)
        return -1;
    for (size_t k = i; k < i + 4; k++) {
        char ch = s[k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

static int put_utf8(struct jout *o, uint32_t cp)
{
    unsigned char b[4];
    size_t n;
    if (cp < 0x80)
        b[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800)
        b[0] = (unsigned char)(0xc0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 0x3f)), n = 2;
    else if (cp < 0x10000)
        b[0] = (unsigned char)(0xe0 | cp >> 12), b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
        b[2] = (unsigned char)(0x80 | (cp & 0x3f)), n = 3;
    else
        b[0] = (unsigned char)(0xf0 | cp >> 18), b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), b[3] = (unsigned char)(0x80 | (cp & 0x3f)),
        n = 4;
    return jput(o, b, n);
}

/* The string starting at s[i] == '"', decoded into o: the index past its
 * closing quote, or JWT_ERR (a control byte, a bad escape, a lone
 * surrogate, bad UTF-8, no end, no room). */
static size_t json_string(const char *s, size_t n, size_t i, struct jout *o)
{
    if (i >= n || s[i] != '"')
        return JWT_ERR;
    i++;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"')
            return i + 1;
        if (ch < 0x20)
            return JWT_ERR;
        if (ch != '\\') {
            size_t l = utf8_len((const unsigned char *)s + i, n - i);
            if (l == 0 || jput(o, s + i, l) < 0)
                return JWT_ERR;
            i += l;
            continue;
        }
        if (++i >= n)
            return JWT_ERR;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *e = s[i] != '\0' ? strchr(from, s[i]) : NULL;
        if (e != NULL) {
            if (jput(o, to + (e - from), 1) < 0)
                return JWT_ERR;
            i++;
            continue;
        }
        if (s[i] != 'u')
            return JWT_ERR;
        long cp = hex4(s, n, i + 1);
        i += 5;
        if (cp >= 0xdc00 && cp <= 0xdfff)
            return JWT_ERR;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            long lo = i + 1 < n && s[i] == '\\' && s[i + 1] == 'u' ? hex4(s, n, i + 2) : -1;
            if (lo < 0xdc00 || lo > 0xdfff)
                return JWT_ERR;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            i += 6;
        }
        if (cp < 0 || put_utf8(o, (uint32_t)cp) < 0)
            return JWT_ERR;
    }
    return JWT_ERR;
}

/* The number at s[i]: past it, or JWT_ERR; *type J_INT without a fraction
 * or an exponent, J_NUM with one. */
static size_t json_number(const char *s, size_t n, size_t i, int *type)
{
    size_t d;
    *type = J_INT;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return JWT_ERR;
    if (i < n && s[i] == '.') {
        *type = J_NUM;
        for (d = ++i; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            ;
        if (i == d)
            return JWT_ERR;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *type = J_NUM;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        for (d = i; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            ;
        if (i == d)
            return JWT_ERR;
    }
    return i;
}

static size_t json_value(const char *s, size_t n, size_t i, int depth, int *type);

/* An array or an object at s[i], checked: past its end, or JWT_ERR. Its
 * strings are only checked (no output); an object's names may repeat
 * here: only the top level's members are kept, and checked for that. */
static size_t json_container(const char *s, size_t n, size_t i, int depth)
{
    char close = s[i] == '[' ? ']' : '}';
    int t;
    if (depth > JSON_MAX_DEPTH)
        return JWT_ERR;
    i = json_ws(s, n, i + 1);
    if (i < n && s[i] == close)
        return i + 1;
    for (;;) {
        if (close == '}') {
            struct jout none = { 0 };
            i = json_string(s, n, i, &none);
            if (i == JWT_ERR)
                return JWT_ERR;
            i = json_ws(s, n, i);
            if (i >= n || s[i] != ':')
                return JWT_ERR;
            i = json_ws(s, n, i + 1);
        }
        i = json_value(s, n, i, depth + 1, &t);
        if (i == JWT_ERR)
            return JWT_ERR;
        i = json_ws(s, n, i);
        if (i < n && s[i] == ',') {
            i = json_ws(s, n, i + 1);
            continue;
        }
        return i < n && s[i] == close ? i + 1 : JWT_ERR;
    }
}

static size_t json_literal(const char *s, size_t n, size_t i, const char *word)
{
    size_t l = strlen(word);
    return n - i >= l && memcmp(s + i, word, l) == 0 ? i + l : JWT_ERR;
}

static size_t json_value(const char *s, size_t n, size_t i, int depth, int *type)
{
    if (i >= n)
        return JWT_ERR;
    switch (s[i]) {
    case '"': {
        struct jout none = { 0 };
        *type = J_STR;
        return json_string(s, n, i, &none);
    }
    case '[':
        *type = J_ARR;
        return json_container(s, n, i, depth);
    case '{':
        *type = J_OBJ;
        return json_container(s, n, i, depth);
    case 't':
        *type = J_TRUE;
        return json_literal(s, n, i, "true");
    case 'f':
        *type = J_FALSE;
        return json_literal(s, n, i, "false");
    case 'n':
        *type = J_NULL;
        return json_literal(s, n, i, "null");
    default:
        return json_number(s, n, i, type);
    }
}

/* One member of a flat list. */
struct jmember {
    int type;
    const char *name, *value;
    uint32_t namelen, valuelen;
};

#define JMEMBER_HEAD 9

static void jmember_at(const char *p, struct jmember *m)
{
    m->type = (unsigned char)p[0];
    memcpy(&m->namelen, p + 1, 4);
    memcpy(&m->valuelen, p + 5, 4);
    m->name = p + JMEMBER_HEAD;
    m->value = m->name + m->namelen;
}

/* The member named name of the flat list buf[0..len), or 0. */
static int jfind(const char *buf, size_t len, const char *name, size_t namelen,
                 struct jmember *m)
{
    for (size_t off = 0; off + JMEMBER_HEAD <= len;) {
        jmember_at(buf + off, m);
        if (m->namelen == namelen && memcmp(m->name, name, namelen) == 0)
            return 1;
        off += JMEMBER_HEAD + m->namelen + m->valuelen;
    }
    return 0;
}

/* s[0..n), one JSON object with white space around it, into the flat list
 * o: 0, or -1 (not JSON, not an object, a name twice, no room). */
static int json_object(const char *s, size_t n, struct jout *o)
{
    size_t i = json_ws(s, n, 0);
    if (i >= n || s[i] != '{')
        return -1;
    i = json_ws(s, n, i + 1);
    if (i < n && s[i] == '}')
        return json_ws(s, n, i + 1) == n ? 0 : -1;
    for (;;) {
        size_t at = o->len;
        char head[JMEMBER_HEAD] = { 0 };
        struct jmember dup;
        int type;
        if (jput(o, head, sizeof head) < 0)
            return -1;
        i = json_string(s, n, i, o);
        if (i == JWT_ERR)
            return -1;
        uint32_t namelen = (uint32_t)(o->len - at - JMEMBER_HEAD);
        if (jfind(o->p, at, o->p + at + JMEMBER_HEAD, namelen, &dup))
            return -1;
        i = json_ws(s, n, i);
        if (i >= n || s[i] != ':')
            return -1;
        i = json_ws(s, n, i + 1);
        size_t vstart = i, vat = o->len;
        if (i < n && s[i] == '"') {
            type = J_STR;
            i = json_string(s, n, i, o);
        } else {
            i = json_value(s, n, i, 2, &type);
            if (i != JWT_ERR && jput(o, s + vstart, i - vstart) < 0)
                return -1;
        }
        if (i == JWT_ERR)
            return -1;
        uint32_t valuelen = (uint32_t)(o->len - vat);
        o->p[at] = (char)type;
        memcpy(o->p + at + 1, &namelen, 4);
        memcpy(o->p + at + 5, &valuelen, 4);
        i = json_ws(s, n, i);
        if (i < n && s[i] == ',') {
            i = json_ws(s, n, i + 1);
            continue;
        }
        if (i >= n || s[i] != '}')
            return -1;
        return json_ws(s, n, i + 1) == n ? 0 : -1;
    }
}

/* The next element of the (checked) array text a[0..n) from *pos (0 at
 * first): 1 with its span and type, 0 at the end. */
static int json_next(const char *a, size_t n, size_t *pos, const char **v, size_t *vlen,
                     int *type)
{
    size_t i = json_ws(a, n, *pos == 0 ? 1 : *pos);
    if (i < n && a[i] == ',')
        i = json_ws(a, n, i + 1);
    if (i >= n || a[i] == ']')
        return 0;
    size_t end = json_value(a, n, i, 2, type);
    if (end == JWT_ERR)
        return 0;
    *v = a + i;
    *vlen = end - i;
    *pos = end;
    return 1;
}

/* ---- keys ---- */

enum jwt_kty { KTY_RSA = 1, KTY_EC, KTY_OKP, KTY_OCT };

struct jwt_alg {
    const char *name;
    enum jwt_kty kty;
    const EVP_MD *(*md)(void);          /* NULL: EdDSA hashes itself */
    int pss;
    size_t coord;                       /* EC: bytes of r, s, x, y */
};

static const struct jwt_alg jwt_algs[] = {
    { "RS256", KTY_RSA, EVP_sha256, 0, 0 },
    { "RS384", KTY_RSA, EVP_sha384, 0, 0 },
    { "RS512", KTY_RSA, EVP_sha512, 0, 0 },
    { "PS256", KTY_RSA, EVP_sha256, 1, 0 },
    { "ES256", KTY_EC, EVP_sha256, 0, 32 },
    { "ES384", KTY_EC, EVP_sha384, 0, 48 },
    { "EdDSA", KTY_OKP, NULL, 0, 0 },
    { "HS256", KTY_OCT, EVP_sha256, 0, 0 },
};

static const struct jwt_alg *alg_named(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof jwt_algs / sizeof jwt_algs[0]; i++)
        if (strlen(jwt_algs[i].name) == n && memcmp(jwt_algs[i].name, s, n) == 0)
            return &jwt_algs[i];
    return NULL;
}

struct jwt_key {
    enum jwt_kty kty;
    size_t coord;                       /* EC: 32 (P-256) or 48 (P-384) */
    const struct jwt_alg *alg;          /* the JWK's "alg"; NULL: any that fits */
    char *kid;                          /* NULL without one */
    size_t kidlen;
    EVP_PKEY *pkey;                     /* RSA, EC, OKP */
    unsigned char *secret;              /* oct */
    size_t secretlen;
};

struct jwt_keys {
    uint64_t id;
    int n;
    struct jwt_key k[JWT_MAX_KEYS];
};

static _Atomic uint64_t jwt_keys_next = 1;

static struct jwt_keys *keys_new(void)
{
    struct jwt_keys *ks = mem_calloc(1, sizeof *ks);
    ks->id = atomic_fetch_add(&jwt_keys_next, 1);
    return ks;
}

void jwt_keys_free(struct jwt_keys *ks)
{
    if (ks == NULL)
        return;
    for (int i = 0; i < ks->n; i++) {
        EVP_PKEY_free(ks->k[i].pkey);
        if (ks->k[i].secret)
            OPENSSL_cleanse(ks->k[i].secret, ks->k[i].secretlen);
        free(ks->k[i].secret);
        free(ks->k[i].kid);
    }
    free(ks);
}

uint64_t jwt_keys_id(const struct jwt_keys *ks)
{
    return ks->id;
}

struct jwt_keys *jwt_keys_secret(const void *secret, size_t len)
{
    if (len < JWT_MIN_SECRET)
        return NULL;
    struct jwt_keys *ks = keys_new();
    ks->n = 1;
    ks->k[0].kty = KTY_OCT;
    ks->k[0].secret = mem_alloc(len);
    memcpy(ks->k[0].secret, secret, len);
    ks->k[0].secretlen = len;
    return ks;
}

/* A JWK member holding base64url bytes, decoded into a new buffer of
 * *len bytes; NULL when absent, not a string or not base64url. */
static unsigned char *jwk_bytes(const char *m, size_t mlen, const char *name, size_t *len)
{
    struct jmember v;
    if (!jfind(m, mlen, name, strlen(name), &v) || v.type != J_STR)
        return NULL;
    unsigned char *out = mem_alloc(v.valuelen + 1);
    long n = b64url_decode(v.value, v.valuelen, out, v.valuelen);
    if (n <= 0) {
        free(out);
        return NULL;
    }
    *len = (size_t)n;
    return out;
}

static int jwk_streq(const struct jmember *v, const char *s)
{
    return v->type == J_STR && v->valuelen == strlen(s) && memcmp(v->value, s, v->valuelen) == 0;
}

static EVP_PKEY *pkey_fromdata(const char *type, OSSL_PARAM_BLD *bld)
{
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    if (params == NULL || ctx == NULL || EVP_PKEY_fromdata_init(ctx) != 1 ||
        EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
        pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    return pkey;
}

static const char *jwk_rsa(const char *m, size_t mlen, struct jwt_key *k)
{
    size_t nlen = 0, elen = 0;
    unsigned char *n = jwk_bytes(m, mlen, "n", &nlen), *e = jwk_bytes(m, mlen, "e", &elen);
    BIGNUM *bn = n ? BN_bin2bn(n, (int)nlen, NULL) : NULL, *be = e ? BN_bin2bn(e, (int)elen, NULL) : NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    const char *why = NULL;
    if (bn == NULL || be == NULL)
        why = "RSA key without base64url n and e";
    else if (bld == NULL || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) ||
             !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) ||
             (k->pkey = pkey_fromdata("RSA", bld)) == NULL)
        why = "RSA key OpenSSL does not take";
    else if (EVP_PKEY_get_bits(k->pkey) < JWT_MIN_RSA_BITS)
        why = "RSA key shorter than 2048 bits";
    k->kty = KTY_RSA;
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    free(n);
    free(e);
    return why;
}

static const char *jwk_ec(const char *m, size_t mlen, struct jwt_key *k)
{
    struct jmember crv;
    size_t xlen = 0, ylen = 0;
    const char *group;
    if (!jfind(m, mlen, "crv", 3, &crv))
        return "EC key without crv";
    if (jwk_streq(&crv, "P-256"))
        group = "prime256v1", k->coord = 32;
    else if (jwk_streq(&crv, "P-384"))
        group = "secp384r1", k->coord = 48;
    else
        return "EC key on a curve other than P-256 or P-384";
    k->kty = KTY_EC;
    unsigned char *x = jwk_bytes(m, mlen, "x", &xlen), *y = jwk_bytes(m, mlen, "y", &ylen);
    unsigned char pub[1 + 2 * 48];
    const char *why = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    if (x == NULL || y == NULL || xlen != k->coord || ylen != k->coord) {
        why = "EC key without x and y of its curve's size";
    } else {
        pub[0] = 0x04;                  /* uncompressed point */
        memcpy(pub + 1, x, xlen);
        memcpy(pub + 1 + xlen, y, ylen);
        if (bld == NULL ||
            !OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, group, 0) ||
            !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub,
                                              1 + 2 * k->coord) ||
            (k->pkey = pkey_fromdata("EC", bld)) == NULL) {
            why = "EC key whose point is not on its curve";
        } else {
            EVP_PKEY_CTX *c = EVP_PKEY_CTX_new_from_pkey(NULL, k->pkey, NULL);
            if (c == NULL || EVP_PKEY_public_check(c) != 1)
                why = "EC key whose point is not on its curve";
            EVP_PKEY_CTX_free(c);
        }
    }
    OSSL_PARAM_BLD_free(bld);
    free(x);
    free(y);
    return why;
}

static const char *jwk_okp(const char *m, size_t mlen, struct jwt_key *k)
{
    struct jmember crv;
    size_t xlen = 0;
    if (!jfind(m, mlen, "crv", 3, &crv) || !jwk_streq(&crv, "Ed25519"))
        return "OKP key on a curve other than Ed25519";
    k->kty = KTY_OKP;
    unsigned char *x = jwk_bytes(m, mlen, "x", &xlen);
    if (x != NULL && xlen == 32)
        k->pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, x, xlen);
    free(x);
    return k->pkey ? NULL : "Ed25519 key without a 32-byte x";
}

static const char *jwk_oct(const char *m, size_t mlen, struct jwt_key *k)
{
    k->kty = KTY_OCT;
    k->secret = jwk_bytes(m, mlen, "k", &k->secretlen);
    if (k->secret == NULL || k->secretlen < JWT_MIN_SECRET)
        return "oct key without a k of 32 bytes or more";
    return NULL;
}

/* jwk_load's answer for a key left out. */
static const char jwk_skip[] = "not a signing key";

/* One JWK (m: its flat member list) into *k: NULL, jwk_skip when it is
 * left out (use is not sig), or why not. */
static const char *jwk_load(const char *m, size_t mlen, struct jwt_key *k)
{
    struct jmember kty, v;
    if (jfind(m, mlen, "use", 3, &v) && !jwk_streq(&v, "sig"))
        return jwk_skip;
    if (jfind(m, mlen, "kid", 3, &v)) {
        if (v.type != J_STR || v.valuelen == 0 || v.valuelen > JWT_MAX_KID)
            return "kid is not a string of 1 to 256 bytes";
        k->kid = mem_strndup(v.value, v.valuelen);
        k->kidlen = v.valuelen;
    }
    if (!jfind(m, mlen, "kty", 3, &kty) || kty.type != J_STR)
        return "a key without kty";
    const char *why = jwk_streq(&kty, "RSA") ? jwk_rsa(m, mlen, k)
                    : jwk_streq(&kty, "EC")  ? jwk_ec(m, mlen, k)
                    : jwk_streq(&kty, "OKP") ? jwk_okp(m, mlen, k)
                    : jwk_streq(&kty, "oct") ? jwk_oct(m, mlen, k)
                    : "kty is not RSA, EC, OKP or oct";
    if (why == NULL && jfind(m, mlen, "alg", 3, &v)) {
        k->alg = v.type == J_STR ? alg_named(v.value, v.valuelen) : NULL;
        if (k->alg == NULL || k->alg->kty != k->kty || (k->coord && k->alg->coord != k->coord))
            why = "alg is not one sluice verifies with this key";
    }
    return why;
}

struct jwt_keys *jwt_keys_jwks(const char *json, size_t len, char *why, size_t whylen)
{
    struct jwt_keys *ks = keys_new();
    struct jout top = { mem_alloc(len + 64), len + 64, 0 };
    struct jmember keys;
    const char *err = NULL, *el;
    size_t pos = 0, ellen;
    int type, i = -1;               /* the key blamed; -1: the document */
    char *kbuf = NULL;
    if (json_object(json, len, &top) < 0) {
        err = "not a JSON object";
        goto fail;
    }
    if (!jfind(top.p, top.len, "keys", 4, &keys) || keys.type != J_ARR) {
        err = "no \"keys\" array";
        goto fail;
    }
    kbuf = mem_alloc(keys.valuelen + 64);
    for (i = 0; json_next(keys.value, keys.valuelen, &pos, &el, &ellen, &type); i++) {
        struct jout m = { kbuf, keys.valuelen + 64, 0 };
        struct jwt_key *k = &ks->k[ks->n];
        if (ks->n == JWT_MAX_KEYS) {
            err = "more than 64 keys";
            goto fail;
        }
        if (type != J_OBJ || json_object(el, ellen, &m) < 0) {
            err = "not a JSON object (or a member twice)";
            goto fail;
        }
        ks->n++;                        /* what k holds is freed with ks */
        err = jwk_load(m.p, m.len, k);
        if (err == jwk_skip) {
            ks->n--;
            free(k->kid);
            memset(k, 0, sizeof *k);
            err = NULL;
            continue;
        }
        if (err)
            goto fail;
        for (int j = 0; j < ks->n - 1 && k->kid; j++)
            if (ks->k[j].kid && ks->k[j].kidlen == k->kidlen &&
                memcmp(ks->k[j].kid, k->kid, k->kidlen) == 0) {
                err = "kid used twice";
                goto fail;
            }
    }
    if (ks->n == 0) {
        err = "no signing key";
        i = -1;
        goto fail;
    }
    free(top.p);
    free(kbuf);
    return ks;
fail:
    if (i < 0)
        snprintf(why, whylen, "JWKS: %s", err);
    else
        snprintf(why, whylen, "JWKS: keys[%d]: %s", i, err);
    free(top.p);
    free(kbuf);
    jwt_keys_free(ks);
    ERR_clear_error();      /* what OpenSSL said is in why */
    return NULL;
}

/* ---- signatures ---- */

static int key_fits(const struct jwt_key *k, const struct jwt_alg *a)
{
    return k->kty == a->kty && (k->coord == 0 || k->coord == a->coord) &&
           (k->alg == NULL || k->alg == a);
}

/* JOSE's r||s (RFC 7518 3.4) as the DER ECDSA-Sig-Value OpenSSL checks;
 * its length, or 0. */
static size_t ec_der(const unsigned char *sig, size_t coord, unsigned char *der, size_t cap)
{
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, (int)coord, NULL), *s = BN_bin2bn(sig + coord, (int)coord, NULL);
    size_t len = 0;
    if (es != NULL && r != NULL && s != NULL && ECDSA_SIG_set0(es, r, s) == 1) {
        r = s = NULL;                   /* es owns them */
        int n = i2d_ECDSA_SIG(es, NULL);
        unsigned char *p = der;
        if (n > 0 && (size_t)n <= cap && i2d_ECDSA_SIG(es, &p) == n)
            len = (size_t)n;
    }
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(es);
    return len;
}

static int sig_ok(const struct jwt_key *k, const struct jwt_alg *a, const char *msg,
                  size_t msglen, const unsigned char *sig, size_t siglen)
{
    if (a->kty == KTY_OCT) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        size_t maclen = 0;
        if (EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, k->secret, k->secretlen,
                      (const unsigned char *)msg, msglen, mac, sizeof mac, &maclen) == NULL) {
            ERR_clear_error();
            return 0;
        }
        return maclen == siglen && CRYPTO_memcmp(mac, sig, siglen) == 0;
    }
    unsigned char der[2 * 48 + 16];
    if (a->kty == KTY_EC) {
        if (siglen != 2 * a->coord || (siglen = ec_der(sig, a->coord, der, sizeof der)) == 0) {
            ERR_clear_error();
            return 0;
        }
        sig = der;
    }
    EVP_MD_CTX *mc = EVP_MD_CTX_new();
    EVP_PKEY_CTX *pc = NULL;
    const EVP_MD *md = a->md ? a->md() : NULL;     /* NULL: EdDSA */
    int ok = mc != NULL && EVP_DigestVerifyInit(mc, &pc, md, NULL, k->pkey) == 1;
    if (ok && a->pss)
        ok = EVP_PKEY_CTX_set_rsa_padding(pc, RSA_PKCS1_PSS_PADDING) == 1 &&
             EVP_PKEY_CTX_set_rsa_pss_saltlen(pc, RSA_PSS_SALTLEN_DIGEST) == 1 &&
             EVP_PKEY_CTX_set_rsa_mgf1_md(pc, md) == 1;
    ok = ok && EVP_DigestVerify(mc, sig, siglen, (const unsigned char *)msg, msglen) == 1;
    EVP_MD_CTX_free(mc);
    if (!ok)                /* a refused signature leaves no error queued (jwt.h) */
        ERR_clear_error();
    return ok;
}

/* ---- claims ---- */

/* A NumericDate (integer, or with a fraction dropped) as seconds, clamped
 * to +-10^15; -1 for an exponent (not a date sluice reads). */
static int numeric_date(const struct jmember *m, int64_t *out)
{
    int64_t v = 0;
    size_t i = 0;
    int neg = m->valuelen > 0 && m->value[0] == '-';
    if (m->type != J_INT && m->type != J_NUM)
        return -1;
    for (i = (size_t)neg; i < m->valuelen && m->value[i] >= '0' && m->value[i] <= '9'; i++)
        if (v < 1000000000000000LL)
            v = v * 10 + (m->value[i] - '0');
    for (; i < m->valuelen; i++)
        if (m->value[i] == 'e' || m->value[i] == 'E')
            return -1;
    *out = neg ? -v : v;
    return 0;
}

static int audience_has(const struct jmember *aud, const char *want)
{
    size_t wl = strlen(want), pos = 0, vlen;
    const char *v;
    int type;
    if (aud->type == J_STR)
        return aud->valuelen == wl && memcmp(aud->value, want, wl) == 0;
    if (aud->type != J_ARR)
        return 0;
    while (json_next(aud->value, aud->valuelen, &pos, &v, &vlen, &type)) {
        char buf[512];
        struct jout o = { buf, sizeof buf, 0 };
        if (type == J_STR && json_string(v, vlen, 0, &o) != JWT_ERR && o.len == wl &&
            memcmp(buf, want, wl) == 0)
            return 1;
    }
    return 0;
}

int jwt_check_payload(const struct jwt_rules *rules, const char *json, size_t len,
                      int64_t now_s, char *claims, size_t *claims_len, int64_t *exp)
{
    struct jout o = { claims, JWT_MAX_CLAIMS, 0 };
    struct jmember m;
    int64_t t;
    if (json_object(json, len, &o) < 0)
        return JWT_MALFORMED;
    *claims_len = o.len;
    *exp = INT64_MAX;
    if (jfind(claims, o.len, "exp", 3, &m)) {
        if (numeric_date(&m, &t) < 0)
            return JWT_MALFORMED;
        if (now_s >= t + rules->leeway_s)
            return JWT_EXPIRED;
        *exp = t;
    }
    if (jfind(claims, o.len, "nbf", 3, &m)) {
        if (numeric_date(&m, &t) < 0)
            return JWT_MALFORMED;
        if (now_s + rules->leeway_s < t)
            return JWT_NOT_YET;
    }
    if (rules->issuer && (!jfind(claims, o.len, "iss", 3, &m) || !jwk_streq(&m, rules->issuer)))
        return JWT_BAD_ISSUER;
    if (rules->audience &&
        (!jfind(claims, o.len, "aud", 3, &m) || !audience_has(&m, rules->audience)))
        return JWT_BAD_AUDIENCE;
    return JWT_OK;
}

int jwt_verify(const struct jwt_keys *keys, const struct jwt_rules *rules,
               const char *token, size_t len, int64_t now_s,
               char *claims, size_t *claims_len, int64_t *exp)
{
    unsigned char hdr[JWT_MAX_HEADER], sig[JWT_MAX_SIG], payload[JWT_MAX_TOKEN];
    char hm[2 * JWT_MAX_HEADER];
    struct jout ho = { hm, sizeof hm, 0 };
    struct jmember alg, kid;
    if (len == 0 || len > JWT_MAX_TOKEN)
        return JWT_MALFORMED;
    const char *d1 = memchr(token, '.', len);
    const char *d2 = d1 ? memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token)) : NULL;
    if (d2 == NULL || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - token)) != NULL)
        return JWT_MALFORMED;
    long hlen = b64url_decode(token, (size_t)(d1 - token), hdr, sizeof hdr);
    long plen = b64url_decode(d1 + 1, (size_t)(d2 - d1 - 1), payload, sizeof payload);
    long slen = b64url_decode(d2 + 1, len - (size_t)(d2 + 1 - token), sig, sizeof sig);
    if (hlen < 0 || plen < 0 || slen < 0 || json_object((const char *)hdr, (size_t)hlen, &ho) < 0)
        return JWT_MALFORMED;
    if (!jfind(hm, ho.len, "alg", 3, &alg) || alg.type != J_STR)
        return JWT_MALFORMED;
    int has_kid = jfind(hm, ho.len, "kid", 3, &kid);
    if (has_kid && kid.type != J_STR)
        return JWT_MALFORMED;
    const struct jwt_alg *a = alg_named(alg.value, alg.valuelen);
    if (a == NULL || jfind(hm, ho.len, "crit", 4, &alg))
        return JWT_BAD_ALG;             /* none, unknown, or extensions we do not know */
    int named = 0, tried = 0;
    size_t msglen = (size_t)(d2 - token);
    for (int i = 0; i < keys->n; i++) {
        const struct jwt_key *k = &keys->k[i];
        if (has_kid && (k->kid == NULL || k->kidlen != kid.valuelen ||
                        memcmp(k->kid, kid.value, kid.valuelen) != 0))
            continue;
        named = 1;
        if (!key_fits(k, a))
            continue;
        tried = 1;
        if (sig_ok(k, a, token, msglen, sig, (size_t)slen))
            return jwt_check_payload(rules, (const char *)payload, (size_t)plen, now_s,
                                     claims, claims_len, exp);
    }
    return tried ? JWT_BAD_SIGNATURE : named ? JWT_BAD_ALG : has_kid ? JWT_NO_KEY : JWT_BAD_ALG;
}

int jwt_claim(const char *claims, size_t claims_len, const char *name, size_t namelen,
              const char **v, size_t *vlen)
{
    struct jmember m;
    if (!jfind(claims, claims_len, name, namelen, &m) || (m.type != J_STR && m.type != J_INT))
        return 0;
    *v = m.value;
    *vlen = m.valuelen;
    return 1;
}

const char *jwt_status_name(int status)
{
    static const char *const names[] = { "ok", "malformed", "bad_alg", "no_key",
                                         "bad_signature", "expired", "not_yet_valid",
                                         "bad_issuer", "bad_audience" };
    return status >= 0 && status < (int)(sizeof names / sizeof names[0]) ? names[status]
                                                                         : "unknown";
}
