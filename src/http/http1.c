/* sluice - http1.c: HTTP/1.x heads and body framing, parsed by sluice itself.
 *
 * One strict pass over each byte, as nginx (ngx_http_parse.c), HAProxy (h1.c)
 * and h2o (picohttpparser) do: a state machine whose states loop over runs of
 * bytes of one class (a 256-entry table), kept between calls so a head that
 * arrives in pieces is scanned once. Method, target, version, field names
 * and values are checked against RFC 9110/9112 as the bytes go by; each
 * complete field line is classified once and the framing fields (smuggling:
 * CL+TE, duplicates, odd codings, Host) are decided when the head ends.
 * Body decoding reports payload runs as offsets so the caller moves bytes
 * without copying. tests/unit/test_http1_differential.c holds this file to
 * what the http_parser-based version accepted. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "http1.h"
#include "mem.h"

/* ---- byte classes --------------------------------------------------------- */

#define C_TCHAR  0x01u      /* RFC 9110 tchar: field names, methods */
#define C_VCHAR  0x02u      /* 0x21-0x7e: request-target */
#define C_FIELD  0x04u      /* field-value bytes: HTAB, SP, VCHAR, obs-text */
#define C_HEX    0x08u
#define C_AUTH   0x10u      /* an absolute-form authority byte ('@' apart) */
#define C_EXT    0x20u      /* chunk extensions, trailer values: HTAB, SP, VCHAR */
#define C_UPPER  0x40u      /* method bytes: A-Z and '-' */

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')
#define IS_ALPHA(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z'))
#define IS_TCHAR(c) (IS_DIGIT(c) || IS_ALPHA(c) || (c) == '!' || (c) == '#' || \
    (c) == '$' || (c) == '%' || (c) == '&' || (c) == '\'' || (c) == '*' || \
    (c) == '+' || (c) == '-' || (c) == '.' || (c) == '^' || (c) == '_' || \
    (c) == '`' || (c) == '|' || (c) == '~')
#define IS_VCHAR(c) ((c) >= 0x21 && (c) <= 0x7e)
/* http_parser's userinfo bytes and '[' ']': what sluice took before. */
#define IS_AUTH(c) (IS_DIGIT(c) || IS_ALPHA(c) || (c) == '-' || (c) == '_' || \
    (c) == '.' || (c) == '!' || (c) == '~' || (c) == '*' || (c) == '\'' || \
    (c) == '(' || (c) == ')' || (c) == '%' || (c) == ';' || (c) == ':' || \
    (c) == '&' || (c) == '=' || (c) == '+' || (c) == '$' || (c) == ',' || \
    (c) == '[' || (c) == ']')
#define CLASS(c) ( \
    (IS_TCHAR(c) ? C_TCHAR : 0) | (IS_VCHAR(c) ? C_VCHAR : 0) | \
    ((IS_VCHAR(c) || (c) == ' ' || (c) == '\t' || (c) >= 0x80) ? C_FIELD : 0) | \
    ((IS_DIGIT(c) || ((c) >= 'a' && (c) <= 'f') || ((c) >= 'A' && (c) <= 'F')) ? C_HEX : 0) | \
    (IS_AUTH(c) ? C_AUTH : 0) | \
    ((IS_VCHAR(c) || (c) == ' ' || (c) == '\t') ? C_EXT : 0) | \
    ((((c) >= 'A' && (c) <= 'Z') || (c) == '-') ? C_UPPER : 0))
#define R4(b)   CLASS(b), CLASS((b) + 1), CLASS((b) + 2), CLASS((b) + 3)
#define R16(b)  R4(b), R4((b) + 4), R4((b) + 8), R4((b) + 12)
#define R64(b)  R16(b), R16((b) + 16), R16((b) + 32), R16((b) + 48)

static const uint8_t cls[256] = { R64(0), R64(64), R64(128), R64(192) };

#define HAS(c, k) (cls[(unsigned char)(c)] & (k))

/* The end of the run of class k bytes in d[i..n): four at a time. */
static inline size_t run_of(const char *d, size_t i, size_t n, uint8_t k)
{
    while (n - i >= 4 && HAS(d[i], k) && HAS(d[i + 1], k) && HAS(d[i + 2], k) &&
           HAS(d[i + 3], k))
        i += 4;
    while (i < n && HAS(d[i], k))
        i++;
    return i;
}

/* ---- parser state --------------------------------------------------------- */

enum head_state {
    S_LEAD,                 /* empty lines before the start line */
    S_LEAD_LF,
    /* request line */
    S_METHOD,
    S_TARGET,               /* its first byte */
    S_SCHEME,
    S_SCHEME_SLASH1,
    S_SCHEME_SLASH2,
    S_AUTHORITY,
    S_PATH,
    S_REQ_VERSION,          /* "HTTP/1.x", then CR */
    S_REQ_LF,
    /* status line */
    S_RES_VERSION,          /* "HTTP/1.x " */
    S_STATUS,               /* SPs, the code, then SP or CR */
    S_REASON,
    S_RES_LF,
    /* field lines */
    S_LINE,                 /* a line starts: a name, or CR ending the head */
    S_NAME,
    S_VALUE_OWS,
    S_VALUE,
    S_LINE_LF,
    S_END_LF,
};

enum chunk_state {
    CH_SIZE0, CH_SIZE, CH_EXT, CH_SIZE_LF, CH_DATA, CH_DATA_CR, CH_DATA_LF,
    CH_TRAILER, CH_TRAILER_NAME, CH_TRAILER_VALUE, CH_TRAILER_LF, CH_END_LF,
};

/* Connection (and Proxy-Connection) tokens that change keep-alive, in
 * conn_as_http_parser's order. */
#define CONN_KEEP_ALIVE 1u
#define CONN_CLOSE      2u
#define CONN_UPGRADE    4u

/* The trailer a parser watches (http1_trailer_watch) and its value. */
struct http1_tw {
    char want[HTTP1_TRAILER_NAME_MAX];      /* lower case */
    char val[HTTP1_TRAILER_VALUE_MAX];
};

struct http1 {
    enum http1_kind kind;
    int head_request;           /* response to HEAD: no body */
    /* The head being scanned; offsets are from the data given. */
    enum head_state st;
    struct http1_head *open_head;   /* the head the last feed left unfinished */
    size_t at;                  /* bytes of it scanned */
    uint32_t mark;              /* start of the current token */
    uint32_t vend;              /* the current value's raw end (its CR) */
    int idx;                    /* bytes of a literal matched (version) */
    int seen_at;                /* an '@' in the authority */
    /* Framing fields seen, decided when the head ends. */
    int ncl, nte, nhost;
    int cl_bad;                 /* a Content-Length value that is no number */
    int te_last;                /* the last TE field's last coding: 1 chunked,
                                 * 2 exactly "chunked" */
    int te_odd;                 /* http_parser read the last TE field
                                 * otherwise (te_chunked_as_http_parser) */
    int has_upgrade;            /* an Upgrade field with a value */
    unsigned conn;              /* CONN_* */
    uint64_t cl;
    /* The body. */
    enum http1_body body;
    int in_body;                /* a head was parsed, message not complete */
    int done;                   /* message complete: a new head comes next */
    enum chunk_state cs;
    uint64_t left;              /* body bytes (or chunk bytes) still to come */
    uint32_t tlen;              /* a trailer name's bytes so far */
    uint32_t meta;              /* chunk-size, extension and trailer bytes
                                 * since the last data byte: at most
                                 * HTTP1_MAX_HEAD_BYTES, as http_parser
                                 * bounded trailers */
    unsigned tframing;          /* it may still name Content-Length (1) or
                                 * Transfer-Encoding (2) */
    /* http1_trailer_watch(): the trailer whose value is kept */
    struct http1_tw *tw;        /* allocated by the first watch: a client's
                                 * parser, idle on every connection, never
                                 * carries these 300 bytes */
    size_t twantlen;            /* 0: none watched */
    int tmatch;                 /* the trailer name read so far is twant's start */
    int tcapture;               /* the trailer value being read is twant's */
    int tgot;                   /* tval holds the (first) watched trailer's value */
    size_t tvlen;               /* > sizeof tval: too long to keep */
};

struct http1 *http1_create(enum http1_kind kind)
{
    struct http1 *p = mem_calloc(1, sizeof(*p));

    p->kind = kind;
    return p;
}

void http1_destroy(struct http1 *p)
{
    if (p)
        free(p->tw);
    free(p);
}

/* ---- small helpers -------------------------------------------------------- */

/* Does d[0..n) read the lower-case literal lit[0..n) in any case? OR-ing 0x20
 * folds A-Z onto a-z and maps no other byte that can reach here (no CR, no
 * control) onto a letter, a digit or '-'. */
static inline __attribute__((always_inline)) int lit_eq(const char *d, const char *lit, size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {        /* eight bytes at a time */
        uint64_t a, b;
        memcpy(&a, d + i, 8);
        memcpy(&b, lit + i, 8);
        if ((a | 0x2020202020202020ULL) != b)
            return 0;
    }
    for (; i < n; i++)
        if (((unsigned char)d[i] | 0x20) != (unsigned char)lit[i])
            return 0;
    return 1;
}

/* Eight bytes at a time for the long runs (values, targets): does the word
 * hold a byte below 0x20 (HTAB and CR included: the byte loop decides
 * those) or DEL? A VCHAR run also stops at SP and at bytes from 0x80. */
#define ONES 0x0101010101010101ULL
#define HIGH 0x8080808080808080ULL
#define LESS(x, b) (((x) - ONES * (b)) & ~(x) & HIGH)

static int word_not_field(uint64_t x)
{
    uint64_t del = x ^ (ONES * 0x7f);
    return (LESS(x, 0x20) | LESS(del, 1)) != 0;
}

static int word_not_vchar(uint64_t x)
{
    uint64_t del = x ^ (ONES * 0x7f);
    return (LESS(x, 0x21) | LESS(del, 1) | (x & HIGH)) != 0;
}

#define span_is(d, s, lit) ((s).len == sizeof(lit) - 1 && lit_eq((d) + (s).off, "" lit, sizeof(lit) - 1))

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* http_parser's methods (sluice took no others before), CONNECT included:
 * it is refused when the head ends, like any other framing error. */
static int method_known(const char *m, size_t n)
{
#define M(lit) { lit, sizeof(lit) - 1 }
    static const struct { const char *s; size_t n; } methods[] = {
        M("GET"), M("POST"), M("PUT"), M("DELETE"), M("HEAD"), M("OPTIONS"), M("PATCH"),
        M("TRACE"), M("CONNECT"), M("COPY"), M("LOCK"), M("MKCOL"), M("MOVE"),
        M("PROPFIND"), M("PROPPATCH"), M("SEARCH"), M("UNLOCK"), M("BIND"), M("REBIND"),
        M("UNBIND"), M("ACL"), M("REPORT"), M("MKACTIVITY"), M("CHECKOUT"), M("MERGE"),
        M("M-SEARCH"), M("NOTIFY"), M("SUBSCRIBE"), M("UNSUBSCRIBE"), M("PURGE"),
        M("MKCALENDAR"), M("LINK"), M("UNLINK"), M("SOURCE"),
    };
#undef M
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (methods[i].n == n && memcmp(methods[i].s, m, n) == 0)
            return 1;
    return 0;
}

/* A Content-Length value: 1*DIGIT, at most INT64_MAX (whatever writes the
 * length again, or compares it with a signed bound, sees the same number). */
static int parse_length(const char *d, struct http1_span s, uint64_t *out)
{
    uint64_t v = 0;

    if (s.len == 0)
        return -1;
    for (uint32_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)d[s.off + i];
        if (!IS_DIGIT(c))
            return -1;
        if (v > (uint64_t)(INT64_MAX - (c - '0')) / 10)
            return -1;
        v = v * 10 + (c - '0');
    }
    *out = v;
    return 0;
}

/* The CONN_* flags of a Connection or Proxy-Connection value d[off..end)
 * (leading OWS skipped, trailing kept), read as http_parser 2.9 read them,
 * so keep-alive and upgrade stay what they were: an element counts when it
 * is the token and nothing but SP follows; an element after a comma that
 * starts with neither a token byte nor SP ends the reading (its bytes are
 * compared folded with 0x20, so an HTAB there is no whitespace). */
static unsigned conn_as_http_parser(const char *d, uint32_t off, uint32_t end)
{
    enum { START, MATCH, MATCHED, TOKEN, GENERAL } st = START;
    static const char *const lits[] = { "keep-alive", "close", "upgrade" };
    unsigned flags = 0;
    int which = 0, idx = 0;

    for (uint32_t i = off; i < end && st != GENERAL; i++) {
        unsigned char ch = (unsigned char)d[i], c = ch | 0x20;
        switch (st) {
        case START:
            which = c == 'k' ? 0 : c == 'c' ? 1 : c == 'u' ? 2 : -1;
            if (which >= 0)
                st = MATCH, idx = 0;
            else if (i == off || HAS(c, C_TCHAR))
                st = TOKEN;
            else if (c != ' ')
                st = GENERAL;
            break;
        case MATCH:
            idx++;
            if (c != (unsigned char)lits[which][idx])
                st = TOKEN;
            else if (lits[which][idx + 1] == '\0')
                st = MATCHED;
            break;
        case MATCHED:
            if (ch == ',') {
                flags |= 1u << which;
                st = START;
            } else if (ch != ' ') {
                st = TOKEN;
            }
            break;
        case TOKEN:
            if (ch == ',')
                st = START;
            break;
        case GENERAL:
            break;
        }
    }
    if (st == MATCHED)
        flags |= 1u << which;
    return flags;
}

/* Connection: its flags, and which fields it names (h1write drops them):
 * every token, split at commas and whitespace, as h1write reads them.
 * end is the raw end of the value, trailing whitespace included. */
static void connection_value(struct http1 *p, struct http1_head *h, const char *d,
                             uint32_t off, uint32_t end)
{
    /* what nearly every head says, read at once */
    if (end - off == 10 && lit_eq(d + off, "keep-alive", 10)) {
        p->conn |= CONN_KEEP_ALIVE;
        return;
    }
    if (end - off == 5 && lit_eq(d + off, "close", 5)) {
        p->conn |= CONN_CLOSE;
        h->conn_names |= HTTP1_CONN_OTHER;      /* h1write drops a "close" field */
        return;
    }
    p->conn |= conn_as_http_parser(d, off, end);
    for (uint32_t i = off; i < end;) {
        if (d[i] == ',' || is_ows(d[i])) {
            i++;
            continue;
        }
        uint32_t t = i;
        while (i < end && d[i] != ',' && !is_ows(d[i]))
            i++;
        const char *w = d + t;
        unsigned name = HTTP1_CONN_OTHER;
        switch (i - t) {
        case 2:
            if (lit_eq(w, "te", 2))
                name = 0;
            break;
        case 4:
            if (lit_eq(w, "host", 4))
                name = HTTP1_CONN_HOST | HTTP1_CONN_OTHER;
            break;
        case 7:
            if (lit_eq(w, "upgrade", 7) || lit_eq(w, "trailer", 7))
                name = 0;
            break;
        case 10:
            if (lit_eq(w, "keep-alive", 10) || lit_eq(w, "connection", 10))
                name = 0;
            break;
        case 14:
            if (lit_eq(w, "content-length", 14))
                name = HTTP1_CONN_CL;
            break;
        case 16:
            if (lit_eq(w, "proxy-connection", 16))
                name = 0;
            break;
        case 17:
            if (lit_eq(w, "transfer-encoding", 17))
                name = HTTP1_CONN_TE;
            break;
        }
        h->conn_names |= name;
    }
}

/* Did http_parser 2.9, which sluice used before, read a Transfer-Encoding
 * value d[off..end) as ending in chunked? Its reading differs from the
 * RFC's on odd lists (",chunked", "chunked, chunked", "chunked<HTAB>"),
 * and sluice refused a value the two read differently; it still does, as
 * an upstream on http_parser may read the body that way. */
static int te_chunked_as_http_parser(const char *d, uint32_t off, uint32_t end)
{
    enum { TOKEN_START, MATCH, CHUNKED, TOKEN, GENERAL } st;
    int idx = 0;

    if (off == end)
        return 0;
    st = ((unsigned char)d[off] | 0x20) == 'c' ? MATCH : TOKEN;
    for (uint32_t i = off + 1; i < end && st != GENERAL; i++) {
        unsigned char ch = (unsigned char)d[i], c = ch | 0x20;
        switch (st) {
        case TOKEN_START:
            /* c is ch | 0x20: an HTAB reads as ')', no whitespace */
            if (c == 'c')
                st = MATCH, idx = 0;
            else if (HAS(c, C_TCHAR))
                st = TOKEN;
            else if (c != ' ')
                st = GENERAL;
            break;
        case MATCH:
            idx++;
            if (idx > 6 || c != (unsigned char)"chunked"[idx])
                st = TOKEN;
            else if (idx == 6)
                st = CHUNKED;
            break;
        case CHUNKED:
            if (ch != ' ')
                st = TOKEN;
            break;
        case TOKEN:
            if (ch == ',')
                st = TOKEN_START, idx = 0;
            break;
        case GENERAL:
            break;
        }
    }
    return st == CHUNKED;
}

/* Transfer-Encoding: is the last coding "chunked" (1), and the whole value
 * exactly that (2)? raw_end is the value's end before trailing OWS. */
static void te_value(struct http1 *p, const char *d, struct http1_span v, uint32_t raw_end)
{
    uint32_t end = v.off + v.len, start = end;

    while (start > v.off && d[start - 1] != ',')
        start--;
    while (start < end && is_ows(d[start]))
        start++;
    p->te_last = end - start == 7 && lit_eq(d + start, "chunked", 7);
    if (p->te_last && p->nte == 1 && start == v.off)
        p->te_last = 2;
    p->te_odd = !!p->te_last != te_chunked_as_http_parser(d, v.off, raw_end);
}

/* A field line is complete: name and (trimmed) value are in h->h[last].
 * Classify it once, by length first; the framing is decided at the end. */
static int field_line(struct http1 *p, struct http1_head *h, const char *d)
{
    int i = h->nheaders - 1;
    struct http1_span name = h->h[i].name, value = h->h[i].value;
    const char *n = d + name.off;

    switch (name.len) {
    case 4:
        if (lit_eq(n, "host", 4) && p->nhost++ == 0)
            h->host = i;
        return 0;
    case 6:
        if (lit_eq(n, "expect", 6) && span_is(d, value, "100-continue"))
            h->expect_continue = 1;
        return 0;
    case 7:
        if (lit_eq(n, "upgrade", 7) && value.len > 0)
            p->has_upgrade = 1;
        return 0;
    case 10:
        if (lit_eq(n, "connection", 10))
            connection_value(p, h, d, value.off, p->vend);
        return 0;
    case 14:
        if (lit_eq(n, "content-length", 14)) {
            if (++p->ncl == 1 && parse_length(d, value, &p->cl) < 0)
                p->cl_bad = 1;
            return 0;
        }
        break;
    case 16:
        if (lit_eq(n, "proxy-connection", 16)) {
            p->conn |= conn_as_http_parser(d, value.off, p->vend);
            return 0;
        }
        break;
    case 17:
        if (lit_eq(n, "transfer-encoding", 17)) {
            p->nte++;
            te_value(p, d, value, p->vend);
            return 0;
        }
        break;
    }
    /* A name that merely starts with a framing field's ("Transfer-Encodingx")
     * is refused: http_parser 2.9 took such names for the field they start
     * with, and an upstream built on it may still do. */
    if (name.len > 10) {
        unsigned f = (unsigned char)n[0] | 0x20;
        if ((f == 'c' && (lit_eq(n, "connection", 10) ||
                          (name.len > 14 && lit_eq(n, "content-length", 14)))) ||
            (f == 't' && name.len > 17 && lit_eq(n, "transfer-encoding", 17)) ||
            (f == 'p' && name.len > 16 && lit_eq(n, "proxy-connection", 16)))
            return 400;
    }
    return 0;
}

/* ---- the end of a head ---------------------------------------------------- */

static int head_request_end(struct http1 *p, struct http1_head *h, const char *d)
{
    if (span_is(d, h->method, "connect"))
        return 400;
    if (p->nhost > 1 || (h->minor == 1 && p->nhost == 0))
        return 400;
    if (p->nte > 0) {
        if (h->minor == 0 || p->nte > 1 || p->te_last != 2 || p->te_odd)
            return 400;
        h->body = HTTP1_BODY_CHUNKED;
    } else if (p->ncl > 0) {
        h->content_length = p->cl;
        h->body = p->cl > 0 ? HTTP1_BODY_LENGTH : HTTP1_BODY_NONE;
    }
    h->upgrade = p->has_upgrade && (p->conn & CONN_UPGRADE);
    return 0;
}

static int head_response_end(struct http1 *p, struct http1_head *h)
{
    int st = h->status;

    if (p->nte > 0 && p->te_odd)
        return 400;
    h->upgrade = st == 101;
    if (p->ncl > 0)
        h->content_length = p->cl;
    if (p->head_request || (st >= 100 && st < 200) || st == 204 || st == 304)
        h->body = HTTP1_BODY_NONE;
    else if (p->nte > 0)
        h->body = p->te_last ? HTTP1_BODY_CHUNKED : HTTP1_BODY_EOF;
    else if (p->ncl > 0)
        h->body = p->cl > 0 ? HTTP1_BODY_LENGTH : HTTP1_BODY_NONE;
    else
        h->body = HTTP1_BODY_EOF;
    return 0;
}

/* The head's final LF was read: decide the framing. */
static int head_end(struct http1 *p, struct http1_head *h, const char *d)
{
    int rc;

    if (p->ncl > 1 || p->cl_bad || (p->ncl > 0 && p->nte > 0))
        return 400;
    rc = p->kind == HTTP1_REQUEST ? head_request_end(p, h, d) : head_response_end(p, h);
    if (rc != 0)
        return rc;
    if (h->minor == 1)
        h->keep_alive = !(p->conn & CONN_CLOSE);
    else
        h->keep_alive = (p->conn & CONN_KEEP_ALIVE) && !(p->conn & CONN_CLOSE);
    if (h->body == HTTP1_BODY_EOF)
        h->keep_alive = 0;
    return 0;
}

/* ---- the head's bytes ----------------------------------------------------- */

/* Scan d[p->at..n). Returns 1 for more bytes, 0 when the head ended (h->len
 * set), or an HTTP status. Each state loops over its run of bytes; a state
 * left at the end of the data resumes at the next call. */
static int head_scan(struct http1 *p, struct http1_head *h, const char *d, size_t n)
{
    size_t i = p->at;
    unsigned char c;

#define NEXT_OR_SAVE() do { if (++i == n) goto more; } while (0)
    while (i < n) {
        c = (unsigned char)d[i];
        switch (p->st) {
        case S_LEAD:
            if (c == '\r') {
                p->st = S_LEAD_LF;
                i++;
                break;
            }
            p->mark = (uint32_t)i;
            p->idx = 0;
            p->st = p->kind == HTTP1_REQUEST ? S_METHOD : S_RES_VERSION;
            break;
        case S_LEAD_LF:
            if (c != '\n')
                return 400;
            p->st = S_LEAD;
            i++;
            break;

        case S_METHOD:
            while (HAS(c, C_UPPER)) {
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            if (c != ' ' || !method_known(d + p->mark, i - p->mark))
                return 400;
            h->method = (struct http1_span){ p->mark, (uint32_t)(i - p->mark) };
            p->st = S_TARGET;
            NEXT_OR_SAVE();
            c = (unsigned char)d[i];
            /* fall through */
        case S_TARGET:
            p->mark = (uint32_t)i;
            if (IS_ALPHA(c)) {
                p->st = S_SCHEME;
                i++;
                break;
            }
            if (c != '/' && c != '*')
                return 400;
            p->st = S_PATH;
            /* fall through */
        case S_PATH:
            for (uint64_t x; n - i >= 8; i += 8) {
                memcpy(&x, d + i, 8);
                if (word_not_vchar(x))
                    break;
            }
            if (i == n)
                goto more;
            c = (unsigned char)d[i];
            while (HAS(c, C_VCHAR)) {
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            if (c != ' ')
                return 400;
            goto target_end;
        case S_SCHEME:
            while (IS_ALPHA(c)) {
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            if (c != ':')
                return 400;
            p->st = S_SCHEME_SLASH1;
            i++;
            break;
        case S_SCHEME_SLASH1:
        case S_SCHEME_SLASH2:
            if (c != '/')
                return 400;
            p->st = p->st == S_SCHEME_SLASH1 ? S_SCHEME_SLASH2 : S_AUTHORITY;
            p->seen_at = 0;
            p->idx = 0;         /* authority bytes seen */
            i++;
            break;
        case S_AUTHORITY:
            while (HAS(c, C_AUTH) || c == '@') {
                if (c == '@' && p->seen_at++)
                    return 400;
                p->idx = 1;
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            if (c == '/' || c == '?') {
                p->st = S_PATH;
                i++;
                break;
            }
            if (c != ' ' || !p->idx)
                return 400;
        target_end:
            h->target = (struct http1_span){ p->mark, (uint32_t)(i - p->mark) };
            p->st = S_REQ_VERSION;
            p->idx = 0;
            i++;
            /* the whole "HTTP/1.x" CRLF at once when it is there */
            if (n - i >= 10 && memcmp(d + i, "HTTP/1.", 7) == 0 &&
                (d[i + 7] == '0' || d[i + 7] == '1') && d[i + 8] == '\r' && d[i + 9] == '\n') {
                h->minor = d[i + 7] - '0';
                p->st = S_LINE;
                i += 10;
            }
            break;
        case S_RES_VERSION:
            /* "HTTP/1.x NNN" then SP or CR at once when it is there */
            if (p->idx == 0 && n - i >= 13 && memcmp(d + i, "HTTP/1.", 7) == 0 &&
                (d[i + 7] == '0' || d[i + 7] == '1') && d[i + 8] == ' ' &&
                IS_DIGIT(d[i + 9]) && d[i + 9] != '0' && IS_DIGIT(d[i + 10]) &&
                IS_DIGIT(d[i + 11]) && (d[i + 12] == ' ' || d[i + 12] == '\r')) {
                h->minor = d[i + 7] - '0';
                h->status = (d[i + 9] - '0') * 100 + (d[i + 10] - '0') * 10 + (d[i + 11] - '0');
                p->st = d[i + 12] == ' ' ? S_REASON : S_RES_LF;
                i += 13;
                break;
            }
            /* fall through */
        case S_REQ_VERSION:
            /* "HTTP/1." then the minor digit, then CR (request) or SP */
            if (p->idx < 7) {
                if (c != (unsigned char)"HTTP/1."[p->idx])
                    return 400;
            } else if (p->idx == 7) {
                if (c != '0' && c != '1')
                    return 400;
                h->minor = c - '0';
            } else if (p->st == S_REQ_VERSION) {
                if (c != '\r')
                    return 400;
                p->st = S_REQ_LF;
            } else {
                if (c != ' ')
                    return 400;
                p->st = S_STATUS;
                p->idx = 0;
                i++;
                break;
            }
            p->idx++;
            i++;
            break;
        case S_STATUS:
            /* As http_parser read it, so h1write_response_check (502) still
             * sees the heads it saw: SPs, then up to 999 in digits. */
            if (c == ' ' && p->idx == 0) {
                i++;
                break;
            }
            if (IS_DIGIT(c)) {
                h->status = h->status * 10 + (c - '0');
                if (h->status > 999)
                    return 400;
                p->idx++;
                i++;
                break;
            }
            if (p->idx == 0 || h->status < 100 || (c != ' ' && c != '\r'))
                return 400;
            p->st = c == ' ' ? S_REASON : S_RES_LF;
            i++;
            break;
        case S_REASON:
            while (HAS(c, C_FIELD)) {
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            if (c != '\r')
                return 400;
            p->st = S_RES_LF;
            i++;
            break;
        case S_REQ_LF:
        case S_RES_LF:
        case S_LINE_LF:
            if (c != '\n')
                return 400;
            p->st = S_LINE;
            i++;
            break;

        /* A field line, each state falling into the next while bytes last. */
        case S_LINE:
            if (c == '\r') {
                p->st = S_END_LF;
                i++;
                break;
            }
            if (!HAS(c, C_TCHAR))
                return 400;     /* obs-fold, an empty name, a bad byte */
            if (h->nheaders == HTTP1_MAX_HEADERS)
                return 431;
            p->mark = (uint32_t)i;
            p->st = S_NAME;
            /* fall through */
        case S_NAME:
            if ((i = run_of(d, i, n, C_TCHAR)) == n)
                goto more;
            c = (unsigned char)d[i];
            if (c != ':')
                return 400;
            h->h[h->nheaders].name = (struct http1_span){ p->mark, (uint32_t)(i - p->mark) };
            h->nheaders++;
            p->st = S_VALUE_OWS;
            NEXT_OR_SAVE();
            c = (unsigned char)d[i];
            /* fall through */
        case S_VALUE_OWS:
            while (c == ' ' || c == '\t') {
                NEXT_OR_SAVE();
                c = (unsigned char)d[i];
            }
            p->mark = (uint32_t)i;
            p->st = S_VALUE;
            /* fall through */
        case S_VALUE:
            for (uint64_t x; n - i >= 8; i += 8) {
                memcpy(&x, d + i, 8);
                if (word_not_field(x))
                    break;
            }
            if ((i = run_of(d, i, n, C_FIELD)) == n)
                goto more;
            c = (unsigned char)d[i];
            if (c != '\r')
                return 400;
            {
                uint32_t end = (uint32_t)i;
                while (end > p->mark && is_ows(d[end - 1]))
                    end--;
                p->vend = (uint32_t)i;
                h->h[h->nheaders - 1].value = (struct http1_span){ p->mark, end - p->mark };
            }
            if (field_line(p, h, d) != 0)
                return 400;
            p->st = S_LINE_LF;
            NEXT_OR_SAVE();
            c = (unsigned char)d[i];
            if (c != '\n')
                return 400;
            p->st = S_LINE;
            i++;
            break;
        case S_END_LF:
            if (c != '\n')
                return 400;
            h->len = i + 1;
            p->at = i + 1;
            return head_end(p, h, d);
        }
    }
#undef NEXT_OR_SAVE
more:
    p->at = i;
    return 1;
}

static void head_begin(struct http1 *p, int head_request, struct http1_head *h)
{
    p->head_request = head_request;
    p->st = S_LEAD;
    p->at = 0;
    p->ncl = p->nte = p->nhost = p->cl_bad = 0;
    p->te_last = p->te_odd = p->has_upgrade = 0;
    p->conn = 0;
    p->cl = 0;
    p->in_body = p->done = 0;
    p->twantlen = 0;
    p->tgot = p->tcapture = 0;
    http1_head_clear(h);
}

void http1_head_clear(struct http1_head *h)
{
    h->len = 0;
    h->minor = 0;
    h->method = (struct http1_span){ 0, 0 };
    h->target = (struct http1_span){ 0, 0 };
    h->status = 0;
    h->keep_alive = 0;
    h->upgrade = 0;
    h->expect_continue = 0;
    h->body = HTTP1_BODY_NONE;
    h->content_length = 0;
    h->host = -1;
    h->conn_names = 0;
    h->nheaders = 0;
}

/* A head longer than max_bytes: still on the request line (414) or not. */
static int too_long(const struct http1 *p)
{
    if (p->kind == HTTP1_REQUEST && p->st < S_RES_VERSION)
        return 414;
    return 431;
}

static int head_run(struct http1 *p, const char *data, size_t len, size_t max_bytes,
                    int head_request, struct http1_head *h, int resume)
{
    size_t n = len < max_bytes ? len : max_bytes;
    int rc;

    if (!resume || p->open_head != h || p->at > n)
        head_begin(p, head_request, h);
    p->open_head = NULL;
    rc = head_scan(p, h, data, n);
    if (rc == 1) {
        if (len > max_bytes)
            return too_long(p);
        p->open_head = h;
        return 1;
    }
    if (rc != 0)
        return rc;
    p->in_body = 1;
    p->body = h->body;
    p->left = h->content_length;
    p->cs = CH_SIZE0;
    p->meta = 0;
    p->done = h->body == HTTP1_BODY_NONE;
    return 0;
}

int http1_head_parse(struct http1 *p, const char *data, size_t len,
                     size_t max_bytes, int head_request, struct http1_head *h)
{
    return head_run(p, data, len, max_bytes, head_request, h, 0);
}

int http1_head_feed(struct http1 *p, const char *data, size_t len,
                    size_t max_bytes, int head_request, struct http1_head *h)
{
    return head_run(p, data, len, max_bytes, head_request, h, 1);
}

/* ---- body ----------------------------------------------------------------- */

static int hexval(unsigned char c)
{
    return IS_DIGIT(c) ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* Chunked framing (RFC 9112 7.1): 1*HEXDIG, then ";" or SP and extension
 * bytes (HTAB, SP, VCHAR) or nothing, CRLF, the data, CRLF; after the last
 * chunk, trailer lines (a token, ':', HTAB/SP/VCHAR; no framing field) and
 * CRLF. Every CR is
 * followed by LF and every LF follows a CR. Returns the bytes used, -1 on a
 * framing error; stops after the message or a full pieces array. */
static long chunked_run(struct http1 *p, const char *d, size_t n,
                        struct http1_piece *pieces, int *np)
{
    size_t i = 0;

    while (i < n) {
        unsigned char c = (unsigned char)d[i];
        switch (p->cs) {
        case CH_SIZE0:
            if (!HAS(c, C_HEX))
                return -1;
            p->left = (uint64_t)hexval(c);
            p->cs = CH_SIZE;
            i++;
            break;
        case CH_SIZE:
            if (++p->meta > HTTP1_MAX_HEAD_BYTES)
                return -1;          /* leading zeros without end */
            if (HAS(c, C_HEX)) {
                /* http_parser's bound, which sluice had before: a size
                 * above 2^60 is refused before it is read further */
                if (p->left > (UINT64_MAX - 16) / 16)
                    return -1;
                p->left = p->left * 16 + (uint64_t)hexval(c);
            } else if (c == ';' || c == ' ') {
                p->cs = CH_EXT;
            } else if (c == '\r') {
                p->cs = CH_SIZE_LF;
            } else {
                return -1;
            }
            i++;
            break;
        case CH_EXT:
        case CH_TRAILER_VALUE: {
            /* the rest of a size line or of a trailer line, to its CR */
            size_t from = i;
            i = run_of(d, i, n, C_EXT);
            if (p->cs == CH_TRAILER_VALUE && p->tcapture) {
                for (size_t k = from; k < i && p->tvlen <= HTTP1_TRAILER_VALUE_MAX; k++)
                    if (p->tvlen < HTTP1_TRAILER_VALUE_MAX)
                        p->tw->val[p->tvlen++] = d[k];
                    else
                        p->tvlen++;         /* too long: not kept */
            }
            p->meta += (uint32_t)(i - from > HTTP1_MAX_HEAD_BYTES ? HTTP1_MAX_HEAD_BYTES + 1
                                                                  : i - from);
            if (p->meta > HTTP1_MAX_HEAD_BYTES)
                return -1;
            if (i == n)
                return (long)i;
            if (d[i] != '\r')
                return -1;
            if (p->cs == CH_TRAILER_VALUE && p->tcapture) {
                p->tcapture = 0;
                p->tgot = p->tvlen <= HTTP1_TRAILER_VALUE_MAX;
            }
            p->cs = p->cs == CH_EXT ? CH_SIZE_LF : CH_TRAILER_LF;
            i++;
            break;
        }
        case CH_SIZE_LF:
            if (c != '\n')
                return -1;
            p->cs = p->left == 0 ? CH_TRAILER : CH_DATA;
            i++;
            break;
        case CH_DATA: {
            size_t take = n - i < p->left ? n - i : (size_t)p->left;
            pieces[*np] = (struct http1_piece){ i, take };
            (*np)++;
            p->meta = 0;
            i += take;
            p->left -= take;
            if (p->left == 0)
                p->cs = CH_DATA_CR;
            if (*np == HTTP1_MAX_PIECES)
                return (long)i;
            break;
        }
        case CH_DATA_CR:
            if (c != '\r')
                return -1;
            p->cs = CH_DATA_LF;
            i++;
            break;
        case CH_DATA_LF:
            if (c != '\n')
                return -1;
            p->cs = CH_SIZE0;
            i++;
            break;
        case CH_TRAILER:
            if (c == '\r') {
                p->cs = CH_END_LF;
                i++;
                break;
            }
            p->cs = CH_TRAILER_NAME;
            p->tlen = 0;
            p->tframing = 3;
            p->tmatch = p->twantlen > 0 && !p->tgot;
            /* fall through */
        case CH_TRAILER_NAME:
            /* A token; one that is or starts with a framing field's name
             * is refused (RFC 9110 6.5.1; http_parser read them). */
            while (HAS(c, C_TCHAR)) {
                if (p->tlen < 14 && (c | 0x20) != (unsigned char)"content-length"[p->tlen])
                    p->tframing &= ~1u;
                if (p->tlen < 17 && (c | 0x20) != (unsigned char)"transfer-encoding"[p->tlen])
                    p->tframing &= ~2u;
                if (p->tmatch && (p->tlen >= p->twantlen ||
                                  (unsigned char)tolower(c) != (unsigned char)p->tw->want[p->tlen]))
                    p->tmatch = 0;
                p->tlen++;
                if (++p->meta > HTTP1_MAX_HEAD_BYTES)
                    return -1;
                if (++i == n)
                    return (long)i;
                c = (unsigned char)d[i];
            }
            if (c != ':' || p->tlen == 0 ||
                ((p->tframing & 1u) && p->tlen >= 14) || ((p->tframing & 2u) && p->tlen >= 17))
                return -1;
            p->cs = CH_TRAILER_VALUE;
            p->tcapture = p->tmatch && p->tlen == p->twantlen;
            p->tvlen = 0;
            i++;
            break;
        case CH_TRAILER_LF:
            if (c != '\n')
                return -1;
            p->cs = CH_TRAILER;
            i++;
            break;
        case CH_END_LF:
            if (c != '\n')
                return -1;
            p->done = 1;
            return (long)(i + 1);
        }
    }
    return (long)i;
}

void http1_trailer_watch(struct http1 *p, const char *name)
{
    size_t n = strlen(name);
    p->twantlen = 0;
    if (n == 0 || n > HTTP1_TRAILER_NAME_MAX)
        return;
    if (p->tw == NULL)
        p->tw = mem_calloc(1, sizeof(*p->tw));
    for (size_t i = 0; i < n; i++)
        p->tw->want[i] = (char)tolower((unsigned char)name[i]);
    p->twantlen = n;
}

int http1_trailer_value(const struct http1 *p, const char **value, size_t *len)
{
    if (!p->tgot)
        return 0;
    *value = p->tw->val;
    *len = p->tvlen;
    return 1;
}

long http1_body_feed(struct http1 *p, const char *data, size_t len,
                     struct http1_piece *pieces, int *npieces, int *done)
{
    long used = 0;

    *npieces = 0;
    *done = p->done;
    if (p->done)
        return 0;
    if (!p->in_body)
        return -1;              /* no head parsed */
    switch (p->body) {
    case HTTP1_BODY_LENGTH:
        used = (long)(len < p->left ? len : p->left);
        if (used > 0)
            pieces[(*npieces)++] = (struct http1_piece){ 0, (size_t)used };
        p->left -= (uint64_t)used;
        p->done = p->left == 0;
        break;
    case HTTP1_BODY_EOF:
        used = (long)len;
        if (used > 0)
            pieces[(*npieces)++] = (struct http1_piece){ 0, len };
        break;
    case HTTP1_BODY_CHUNKED:
        used = chunked_run(p, data, len, pieces, npieces);
        if (used < 0) {
            *npieces = 0;
            p->in_body = 0;     /* a broken message never completes */
            return -1;
        }
        break;
    case HTTP1_BODY_NONE:
        break;
    }
    if (p->done)
        p->in_body = 0;
    *done = p->done;
    return used;
}

int http1_body_eof(struct http1 *p)
{
    if (p->done || !p->in_body)
        return 0;
    p->in_body = 0;
    if (p->body != HTTP1_BODY_EOF)
        return 0;
    p->done = 1;
    return 1;
}

/* ---- header lookup -------------------------------------------------------- */

static int lower(int c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Does span s of buf read lit[0..n), in any case? */
static int span_eq(const char *buf, struct http1_span s, const char *lit, size_t n)
{
    if (s.len != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)buf[s.off + i]) != lower((unsigned char)lit[i]))
            return 0;
    return 1;
}

int http1_name_is(const char *buf, const struct http1_header *hd, const char *name)
{
    return span_eq(buf, hd->name, name, strlen(name));
}

int http1_find(const char *buf, const struct http1_head *h, const char *name, int from)
{
    size_t n = strlen(name);
    int first = lower((unsigned char)name[0]);

    for (int i = from < 0 ? 0 : from; i < h->nheaders; i++) {
        struct http1_span s = h->h[i].name;
        if (s.len == n && lower((unsigned char)buf[s.off]) == first && span_eq(buf, s, name, n))
            return i;
    }
    return -1;
}

int http1_span_uint(const char *buf, struct http1_span v, int64_t *out)
{
    if (v.len == 0 || v.len > 18)
        return 0;
    int64_t n = 0;
    for (uint32_t i = 0; i < v.len; i++) {
        char ch = buf[v.off + i];
        if (ch < '0' || ch > '9')
            return 0;
        n = n * 10 + (ch - '0');
    }
    *out = n;
    return 1;
}
