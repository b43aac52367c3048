/* sluice - fuzz_jsonscan.c: libFuzzer target for the streaming JSON scanner.
 *
 * Input: a flags byte (bit 0: text/event-stream; bits 1-2: which path), a
 * split byte, then the body. The body is scanned whole and again in pieces
 * cut at points derived from the split byte: the results must agree (a
 * streaming scanner cannot depend on where reads end). For a JSON body
 * that a strict recursive-descent parser written here accepts (nesting at
 * most JSONSCAN_MAX_DEPTH), the result must be that parser's: the last
 * whole number 0..10^15-1 found at the path. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jsonscan.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const paths[] = { "usage.total_tokens", "a", "a.b.c", "x-y.z_1" };

/* ---- the reference: strict JSON, the path walked by recursion ---------- */

struct ref {
    const uint8_t *p;
    size_t n, i;
    const char *path;
    int found;
    int64_t value;
};

static void ws(struct ref *r)
{
    while (r->i < r->n && (r->p[r->i] == ' ' || r->p[r->i] == '\t' || r->p[r->i] == '\n' ||
                           r->p[r->i] == '\r'))
        r->i++;
}

/* A string; *raw and *len: its bytes between the quotes. */
static int str(struct ref *r, const uint8_t **raw, size_t *len)
{
    if (r->i >= r->n || r->p[r->i] != '"')
        return -1;
    size_t from = ++r->i;
    while (r->i < r->n && r->p[r->i] != '"') {
        if (r->p[r->i] < 0x20)
            return -1;
        if (r->p[r->i] == '\\') {
            if (++r->i >= r->n)
                return -1;
            uint8_t c = r->p[r->i];
            if (c == 'u') {
                for (int k = 0; k < 4; k++) {
                    uint8_t h = ++r->i < r->n ? r->p[r->i] : 0;
                    if (!((h >= '0' && h <= '9') || ((h | 0x20) >= 'a' && (h | 0x20) <= 'f')))
                        return -1;
                }
            } else if (!strchr("\"\\/bfnrt", c)) {
                return -1;
            }
        }
        r->i++;
    }
    if (r->i >= r->n)
        return -1;
    *raw = r->p + from;
    *len = r->i - from;
    r->i++;
    return 0;
}

/* A number; *whole: 1 with *v when it is a whole number below 10^15. */
static int number(struct ref *r, int *whole, int64_t *v)
{
    size_t from = r->i;
    int neg = 0, frac = 0;
    if (r->p[r->i] == '-') {
        neg = 1;
        r->i++;
    }
    if (r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9')
        return -1;
    if (r->p[r->i] == '0' && r->i + 1 < r->n && r->p[r->i + 1] >= '0' && r->p[r->i + 1] <= '9')
        return -1;
    while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9')
        r->i++;
    size_t digits_end = r->i;
    if (r->i < r->n && r->p[r->i] == '.') {
        frac = 1;
        if (++r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9')
            return -1;
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9')
            r->i++;
    }
    if (r->i < r->n && (r->p[r->i] == 'e' || r->p[r->i] == 'E')) {
        frac = 1;
        r->i++;
        if (r->i < r->n && (r->p[r->i] == '+' || r->p[r->i] == '-'))
            r->i++;
        if (r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9')
            return -1;
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9')
            r->i++;
    }
    *whole = !neg && !frac && digits_end - from <= 15;
    *v = 0;
    for (size_t k = from; *whole && k < digits_end; k++)
        *v = *v * 10 + (r->p[k] - '0');
    return 0;
}

/* The segment of path at index seg; NULL past the last. */
static const char *segment(const char *path, int seg, size_t *len)
{
    const char *s = path;
    for (int k = 0; k < seg; k++) {
        s = strchr(s, '.');
        if (s == NULL)
            return NULL;
        s++;
    }
    const char *e = strchr(s, '.');
    *len = e ? (size_t)(e - s) : strlen(s);
    return s;
}

/* A value at depth (containers open around it); seg: the path segments its
 * key chain matched (-1: off the path); last: it is the path's value. */
static int value(struct ref *r, int depth, int seg, int last)
{
    ws(r);
    if (r->i >= r->n || depth > JSONSCAN_MAX_DEPTH)
        return -1;
    uint8_t c = r->p[r->i];
    if (c == '{' || c == '[') {
        if (depth + 1 > JSONSCAN_MAX_DEPTH)
            return -1;
        r->i++;
        ws(r);
        uint8_t close = c == '{' ? '}' : ']';
        if (r->i < r->n && r->p[r->i] == close) {
            r->i++;
            return 0;
        }
        for (;;) {
            int kseg = -1, klast = 0;
            if (c == '{') {
                const uint8_t *k;
                size_t klen, slen;
                ws(r);
                if (str(r, &k, &klen) < 0)
                    return -1;
                const char *s = seg >= 0 && !last ? segment(r->path, seg, &slen) : NULL;
                if (s && slen == klen && !memchr(k, '\\', klen) && !memcmp(s, k, klen)) {
                    kseg = seg + 1;
                    klast = segment(r->path, seg + 1, &slen) == NULL;
                }
                ws(r);
                if (r->i >= r->n || r->p[r->i] != ':')
                    return -1;
                r->i++;
            }
            if (value(r, depth + 1, kseg, klast) < 0)
                return -1;
            ws(r);
            if (r->i >= r->n)
                return -1;
            if (r->p[r->i] == close) {
                r->i++;
                return 0;
            }
            if (r->p[r->i] != ',')
                return -1;
            r->i++;
        }
    }
    if (c == '"') {
        const uint8_t *s;
        size_t len;
        return str(r, &s, &len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int whole;
        int64_t v;
        if (number(r, &whole, &v) < 0)
            return -1;
        if (last && whole) {
            r->found = 1;
            r->value = v;
        }
        return 0;
    }
    static const char *const lits[] = { "true", "false", "null" };
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (r->n - r->i >= l && !memcmp(r->p + r->i, lits[k], l)) {
            r->i += l;
            return 0;
        }
    }
    return -1;
}

static int scan(const char *path, int sse, const uint8_t *p, size_t n, size_t step,
                int64_t *v)
{
    struct jsonscan j;
    jsonscan_init(&j, path, sse);
    for (size_t i = 0; i < n; i += step)
        jsonscan_feed(&j, (const char *)p + i, n - i < step ? n - i : step);
    return jsonscan_result(&j, v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int sse = data[0] & 1;
    const char *path = paths[(data[0] >> 1) & 3];
    size_t step = (size_t)data[1] % 17 + 1;
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    fuzz_check(jsonscan_path_valid(path) == 0);

    int64_t whole = -1, pieces = -1;
    int fw = scan(path, sse, body, n, n ? n : 1, &whole);
    int fp = scan(path, sse, body, n, step, &pieces);
    fuzz_check(fw == fp);
    fuzz_check(!fw || whole == pieces);
    fuzz_check(!fw || (whole >= 0 && whole < 1000000000000000LL));
    if (sse)
        return 0;

    struct ref r = { body, n, 0, path, 0, 0 };
    if (value(&r, 0, 0, 0) == 0) {
        ws(&r);
        if (r.i == n) {             /* a whole valid document */
            fuzz_check(fw == r.found);
            fuzz_check(!fw || whole == r.value);
        }
    }
    return 0;
}
