/* sluice - sha1.c: SHA-1 as specified in FIPS 180-4, section 6.1.
 *
 * Written for clarity over speed: it hashes key parts of at most a few
 * kilobytes, once per request at most. Big-endian word loads are done byte
 * by byte so the code has no alignment or endianness assumptions. */
#include <string.h>
#include "sha1.h"

static uint32_t sha1_rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

/* Process one 64-byte block into s->h. */
static void sha1_block(struct sha1_ctx *s, const uint8_t *p)
{
    uint32_t w[80];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 80; t++)
        w[t] = sha1_rol(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);

    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4];
    for (int t = 0; t < 80; t++) {
        uint32_t f, k;
        if (t < 20) {
            f = (b & c) | (~b & d);
            k = 0x5a827999;
        } else if (t < 40) {
            f = b ^ c ^ d;
            k = 0x6ed9eba1;
        } else if (t < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8f1bbcdc;
        } else {
            f = b ^ c ^ d;
            k = 0xca62c1d6;
        }
        uint32_t tmp = sha1_rol(a, 5) + f + e + k + w[t];
        e = d;
        d = c;
        c = sha1_rol(b, 30);
        b = a;
        a = tmp;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
}

void sha1_init(struct sha1_ctx *s)
{
    static const uint32_t iv[5] = {
        0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0,
    };
    memcpy(s->h, iv, sizeof iv);
    s->total_bytes = 0;
    s->used = 0;
}

void sha1_update(struct sha1_ctx *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->total_bytes += len;
    while (len > 0) {
        size_t n = sizeof s->block - s->used;
        if (n > len)
            n = len;
        memcpy(s->block + s->used, p, n);
        s->used += n;
        p += n;
        len -= n;
        if (s->used == sizeof s->block) {
            sha1_block(s, s->block);
            s->used = 0;
        }
    }
}

/* Padding: a 1 bit, zeros up to 56 mod 64, then the bit length big-endian. */
void sha1_final(struct sha1_ctx *s, uint8_t out[SHA1_DIGEST_BYTES])
{
    uint64_t bits = s->total_bytes * 8;
    uint8_t pad[72] = { 0x80 };
    size_t padlen = (s->used < 56 ? 56 : 120) - s->used;
    uint8_t lenbytes[8];
    for (int i = 0; i < 8; i++)
        lenbytes[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha1_update(s, pad, padlen);
    sha1_update(s, lenbytes, sizeof lenbytes);
    for (int i = 0; i < 5; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void sha1_digest(const void *data, size_t len, uint8_t out[SHA1_DIGEST_BYTES])
{
    struct sha1_ctx s;
    sha1_init(&s);
    sha1_update(&s, data, len);
    sha1_final(&s, out);
}

void sha1_tohex(const uint8_t digest[SHA1_DIGEST_BYTES], char out[SHA1_HEX_BYTES])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < SHA1_DIGEST_BYTES; i++) {
        out[2 * i] = hex[digest[i] >> 4];
        out[2 * i + 1] = hex[digest[i] & 15];
    }
    out[40] = '\0';
}

void sha1_hex(const void *data, size_t len, char out[SHA1_HEX_BYTES])
{
    uint8_t d[SHA1_DIGEST_BYTES];
    sha1_digest(data, len, d);
    sha1_tohex(d, out);
}
