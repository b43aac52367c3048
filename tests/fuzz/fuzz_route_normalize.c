/* sluice - fuzz_route_normalize.c: libFuzzer target for path normalisation.
 *
 * route_normalize() on the input as a request target, into an exactly sized
 * heap buffer (len + 1 bytes: the result is NUL-terminated). Checked against a reference written here from the spec (decode
 * every %XX, drop empty and "." segments, ".." pops one, climbing above the
 * root or %00 is refused), plus the shape invariants: result no longer than
 * the input, starts with '/', no "//", no "." or ".." segment, no NUL.
 * Idempotence holds only where decoding cannot create new syntax: a result
 * holding '%' (from %25), '?' (%3F), '#' (%23) or a control byte (%0A) means
 * something else when read as a target again, so a result is re-normalised
 * only when it holds none of those. route_normalize_paths is run with each
 * paths setting: case alone is route_normalize lower-cased; strip leaves no
 * ';'; each result keeps the shape and is no longer than the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "route.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int ref_hex(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The reference: a segment stack instead of in-place rewriting. */
static long ref_normalize(const uint8_t *t, size_t len, char *out)
{
    size_t pathlen = len, n = 0, w = 0, nseg = 0;
    char *dec = malloc(len + 1);
    size_t *seg = malloc((len + 1) * sizeof *seg);     /* start offsets in out */
    int trailing = 0;
    long rc = -1;

    fuzz_check(dec != NULL && seg != NULL);
    if (len == 0 || t[0] != '/')
        goto done;
    for (size_t i = 0; i < len; i++) {
        if (t[i] == '#' || t[i] < 0x20 || t[i] == 0x7f)
            goto done;
        if (t[i] == '?' && pathlen == len)
            pathlen = i;
    }
    for (size_t i = 0; i < pathlen; i++) {
        if (t[i] != '%') {
            dec[n++] = (char)t[i];
            continue;
        }
        if (i + 2 >= pathlen)
            goto done;
        int hi = ref_hex(t[i + 1]), lo = ref_hex(t[i + 2]);
        if (hi < 0 || lo < 0 || (hi | lo) == 0)
            goto done;
        dec[n++] = (char)(hi << 4 | lo);
        i += 2;
    }
    for (size_t i = 0; i < n;) {
        while (i < n && dec[i] == '/')
            i++;
        if (i == n) {
            trailing = 1;
            break;
        }
        size_t s = i;
        while (i < n && dec[i] != '/')
            i++;
        trailing = 0;
        if (i - s == 1 && dec[s] == '.') {
            trailing = i == n;
        } else if (i - s == 2 && dec[s] == '.' && dec[s + 1] == '.') {
            if (nseg == 0)
                goto done;
            w = seg[--nseg];
            trailing = i == n;
        } else {
            seg[nseg++] = w;
            out[w++] = '/';
            memcpy(out + w, dec + s, i - s);
            w += i - s;
        }
    }
    if (w == 0 || trailing)
        out[w++] = '/';
    rc = (long)w;
done:
    free(dec);
    free(seg);
    return rc;
}

static void shape_ok(const char *p, size_t n)
{
    fuzz_check(n >= 1 && p[0] == '/');
    fuzz_check(memchr(p, '\0', n) == NULL);
    for (size_t i = 0; i + 1 < n; i++)
        fuzz_check(!(p[i] == '/' && p[i + 1] == '/'));
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '/')
            continue;
        size_t s = i + 1, e = s;
        while (e < n && p[e] != '/')
            e++;
        fuzz_check(!(e - s == 1 && p[s] == '.'));
        fuzz_check(!(e - s == 2 && p[s] == '.' && p[s + 1] == '.'));
    }
}

static int reparsable(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '%' || c == '?' || c == '#' || c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

/* The paths section's variants of the same input. */
static void paths_ok(const char *in, size_t size, const char *plain, long pn)
{
    char *out = malloc(size + 1);
    fuzz_check(out != NULL);
    for (int mode = 1; mode < 4; mode++) {
        struct conf c = { .paths = { .case_insensitive = mode & 1, .strip_matrix = mode >> 1 } };
        long n = route_normalize_paths(&c, in, size, out);
        if (mode == 1) {
            fuzz_check(n == pn);
            for (long i = 0; i < n; i++) {
                char ch = plain[i] >= 'A' && plain[i] <= 'Z' ? (char)(plain[i] + 32) : plain[i];
                fuzz_check(out[i] == ch);
            }
        }
        if (n < 0)
            continue;
        fuzz_check((size_t)n <= size && out[n] == '\0');
        shape_ok(out, (size_t)n);
        if (mode & 2)
            fuzz_check(memchr(out, ';', (size_t)n) == NULL);
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *in = malloc(size ? size : 1);
    char *out = malloc(size + 1);               /* "out must hold len + 1 bytes" */
    char *ref = malloc(size + 1);
    fuzz_check(in != NULL && out != NULL && ref != NULL);
    if (size)
        memcpy(in, data, size);

    long n = route_normalize(in, size, out);
    long rn = ref_normalize(data, size, ref);
    if (n != rn)
        fprintf(stderr, "route_normalize %ld, reference %ld\n", n, rn);
    fuzz_check(n == rn);
    if (n >= 0) {
        fuzz_check((size_t)n <= size);
        fuzz_check(out[n] == '\0');            /* for regexec: route.h */
        fuzz_check(memcmp(out, ref, (size_t)n) == 0);
        shape_ok(out, (size_t)n);
        if (reparsable(out, (size_t)n)) {
            char *again = malloc((size_t)n);
            char *twice = malloc((size_t)n + 1);
            fuzz_check(again != NULL && twice != NULL);
            memcpy(again, out, (size_t)n);
            fuzz_check(route_normalize(again, (size_t)n, twice) == n);
            fuzz_check(memcmp(twice, out, (size_t)n) == 0);
            free(again);
            free(twice);
        }
    }
    paths_ok(in, size, out, n);
    free(in);
    free(out);
    free(ref);
    return 0;
}
