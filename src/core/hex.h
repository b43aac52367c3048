/* sluice - hex.h: hex digits, the one way sluice writes them.
 *
 * Digests (digest.c), escapes (esc.c), chunk sizes (exchange.c) and request
 * ids (request.c) all turn nibbles into digits; these are the helpers they
 * share. Header only: the request id is on the hot path. */
#ifndef SLUICE_HEX_H
#define SLUICE_HEX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The digit of nibble n (0..15), lowercase or uppercase. */
static inline char hex_digit(unsigned n, int upper)
{
    return (upper ? "0123456789ABCDEF" : "0123456789abcdef")[n & 15];
}

/* Byte c as two digits, high nibble first; returns the end written. */
static inline char *hex_byte(char *out, unsigned char c, int upper)
{
    out[0] = hex_digit(c >> 4, upper);
    out[1] = hex_digit(c, upper);
    return out + 2;
}

/* in[0..n) as 2n lowercase digits (no NUL); returns the end written. */
static inline char *hex_bytes(char *out, const unsigned char *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out = hex_byte(out, in[i], 0);
    return out;
}

/* v in lowercase hex, no leading zeros ("0" for 0), written backwards so
 * that it ends just before end; returns where it starts. At most 16
 * digits. */
static inline char *hex_u64_back(char *end, uint64_t v)
{
    do {
        *--end = hex_digit((unsigned)v, 0);
        v >>= 4;
    } while (v);
    return end;
}

/* The 8 nibbles of v, least significant first, as 8 lowercase digits: each
 * nibble spread to a byte of its own, then all turned at once (random ids,
 * where the order does not matter and the speed does). */
static inline void hex_u32_le8(char *out, uint32_t v)
{
    uint64_t x = v;
    x = (x | (x << 16)) & 0x0000ffff0000ffffULL;
    x = (x | (x << 8)) & 0x00ff00ff00ff00ffULL;
    x = (x | (x << 4)) & 0x0f0f0f0f0f0f0f0fULL;
    uint64_t letters = ((x + 0x0606060606060606ULL) >> 4) & 0x0101010101010101ULL;
    x += 0x3030303030303030ULL + letters * ('a' - '0' - 10);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(out, &x, 8);
#else
    for (int k = 0; k < 8; k++, x >>= 8)
        out[k] = (char)(x & 0xff);
#endif
}

#endif
