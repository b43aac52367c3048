/* sluice - conf_value.c: the config loader's value parsers, shared by every
 * section: typed access to a node (scalar, ${VAR} expansion, integers,
 * durations, sizes, booleans, enums) and the values behind them (duration
 * and rate text, host:port addresses, percent-decoding, HTTP tokens). Each
 * fails with the node's FILE:LINE:COL (conf_fail() in conf.c, the only file under this one). */
#include "conf.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_int.h"

/* ---- typed access to nodes */

struct strbuf { char *s; size_t len, cap; };

static void sb_add(struct strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s)
            abort();
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* Expand ${VAR} and ${VAR:-default} (default also when VAR is empty). */
static int subst(struct ctx *x, struct node *n)
{
    struct strbuf b = { 0 };
    const char *p = n->str, *q;
    char sb[SHOW_BUF];
    sb_add(&b, "", 0);
    while ((q = strstr(p, "${")) != NULL) {
        const char *name = q + 2, *e = name, *def = NULL, *end, *val;
        char var[128];
        sb_add(&b, p, (size_t)(q - p));
        while (isalnum((unsigned char)*e) || *e == '_')
            e++;
        if (e == name || isdigit((unsigned char)*name) || (size_t)(e - name) >= sizeof var)
            goto bad;
        if (*e == '}') {
            end = e;
        } else if (e[0] == ':' && e[1] == '-') {
            def = e + 2;
            end = strchr(def, '}');
            if (!end)
                goto bad;
        } else {
            goto bad;
        }
        memcpy(var, name, (size_t)(e - name));
        var[e - name] = '\0';
        val = getenv(var);
        if (val && (*val || !def)) {
            sb_add(&b, val, strlen(val));
        } else if (def) {
            sb_add(&b, def, (size_t)(end - def));
        } else {
            free(b.s);
            return conf_fail(x, n, "environment variable '%s' is not set and has no default", var);
        }
        p = end + 1;
    }
    sb_add(&b, p, strlen(p));
    free(n->str);
    n->str = b.s;
    n->substituted = 1;
    return 0;
bad:
    free(b.s);
    return conf_fail(x, n, "bad variable reference in '%s' (use ${NAME} or ${NAME:-default})",
                     conf_show(n->str, sb));
}

/* The scalar's text after substitution, or NULL with the error set. */
const char *conf_scalar(struct ctx *x, struct node *n)
{
    if (conf_expect(x, n, NODE_SCALAR) < 0)
        return NULL;
    if (!n->substituted && subst(x, n) < 0)
        return NULL;
    return n->str;
}

/* A name used in headers, JSON bodies and Redis keys: keep it plain. */
const char *conf_name_scalar(struct ctx *x, struct node *n)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    size_t i;
    if (!s)
        return NULL;
    for (i = 0; s[i]; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i]))
            break;
    if (!*s || s[i] || i > CONF_MAX_NAME) {
        conf_fail(x, n, "bad name '%s' (use 1 to %d letters, digits, '-', '_' or '.')",
                  conf_show(s, sb), CONF_MAX_NAME);
        return NULL;
    }
    return s;
}

/* Strict decimal: optional '-', digits, nothing else. */
int conf_parse_int(const char *s, int64_t *out)
{
    char *end;
    long long v;
    if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (*end)
        return -1;
    if (errno == ERANGE)
        return -2;
    *out = v;
    return 0;
}

int conf_get_int(struct ctx *x, struct node *n, int64_t min, int64_t max, int64_t *out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    int rc;
    if (!s)
        return -1;
    rc = conf_parse_int(s, out);
    if (rc == -1)
        return conf_fail(x, n, "expected an integer, got '%s'", conf_show(s, sb));
    if (rc == -2 || *out < min || *out > max)
        return conf_fail(x, n, "%s is out of range (%lld..%lld)", conf_show(s, sb),
                         (long long)min, (long long)max);
    return 0;
}

int conf_get_duration(struct ctx *x, struct node *n, int64_t *out_ms)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    if (!s)
        return -1;
    if (conf_parse_duration_ms(s, out_ms) < 0)
        return conf_fail(x, n, "bad duration '%s' (use e.g. 500ms, 30s, 5m, 1h, 1d, 1w)",
                         conf_show(s, sb));
    if (*out_ms > CONF_MAX_DURATION_MS)
        return conf_fail(x, n, "duration '%s' is out of range (at most 3650d)", conf_show(s, sb));
    return 0;
}

/* Bytes: plain integer or with a k, m or g suffix (powers of 1024). */
static int parse_size(const char *s, uint64_t *out)
{
    uint64_t v = 0, mul = 1;
    const char *p = s;
    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    switch (*p) {
    case '\0': break;
    case 'k': case 'K': mul = 1ULL << 10; p++; break;
    case 'm': case 'M': mul = 1ULL << 20; p++; break;
    case 'g': case 'G': mul = 1ULL << 30; p++; break;
    default: return -1;
    }
    if (*p || (v && mul > UINT64_MAX / v))
        return -1;
    *out = v * mul;
    return 0;
}

int conf_get_size(struct ctx *x, struct node *n, uint64_t min, uint64_t max, uint64_t *out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    if (!s)
        return -1;
    if (parse_size(s, out) < 0)
        return conf_fail(x, n, "bad size '%s' (use e.g. 16384, 64k, 10m, 1g)", conf_show(s, sb));
    if (*out < min || *out > max)
        return conf_fail(x, n, "size '%s' is out of range (%llu..%llu bytes)", conf_show(s, sb),
                         (unsigned long long)min, (unsigned long long)max);
    return 0;
}

/* YAML 1.2 core booleans only: "yes", "on" and "True" are typos here. */
int conf_get_bool(struct ctx *x, struct node *n, int *out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    if (!s)
        return -1;
    if (!strcmp(s, "true") || !strcmp(s, "false")) {
        *out = s[0] == 't';
        return 0;
    }
    return conf_fail(x, n, "expected true or false, got '%s'", conf_show(s, sb));
}

/* One of names[0..n), by index; the message lists them. */
int conf_get_enum(struct ctx *x, struct node *n, const char *const *names, int count,
                    const char *choices, int *out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, n);
    if (!s)
        return -1;
    for (int i = 0; i < count; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    }
    return conf_fail(x, n, "bad value '%s' (use %s)", conf_show(s, sb), choices);
}

/* ---- values: durations, rates, addresses */

static const struct { const char *unit; int64_t ms; } duration_units[] = {
    { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 },
    { "d", 86400000 }, { "w", 604800000 }, { NULL, 0 },
};

static int64_t unit_ms(const char *u)
{
    for (int i = 0; duration_units[i].unit; i++)
        if (!strcmp(u, duration_units[i].unit))
            return duration_units[i].ms;
    return 0;
}

/* Leading digits into *out; returns the first byte after them, NULL on
 * no digits or int64 overflow. */
const char *conf_parse_digits(const char *s, int64_t *out)
{
    int64_t v = 0;
    if (!isdigit((unsigned char)*s))
        return NULL;
    for (; isdigit((unsigned char)*s); s++) {
        int d = *s - '0';
        if (v > (INT64_MAX - d) / 10)
            return NULL;
        v = v * 10 + d;
    }
    *out = v;
    return s;
}

int conf_parse_duration_ms(const char *s, int64_t *out_ms)
{
    int64_t n, mul, ms;
    const char *u = conf_parse_digits(s, &n);
    if (!u || n <= 0)
        return -1;
    mul = unit_ms(u);
    if (!mul || __builtin_mul_overflow(n, mul, &ms))
        return -1;
    *out_ms = ms;
    return 0;
}

int64_t conf_rate_interval_us(int64_t count, int64_t period_ms)
{
    int64_t us = period_ms * 1000 / count;
    return us < 1 ? 1 : us;
}

int conf_bucket_window(struct limiter_params *p)
{
    int64_t win_us;
    if (__builtin_mul_overflow(p->limit, p->interval_us, &win_us) ||
        win_us / 1000 > CONF_MAX_DURATION_MS)
        return -1;
    p->window_ms = win_us / 1000 > 0 ? win_us / 1000 : 1;
    return 0;
}

int conf_parse_rate(const char *s, int64_t *count, int64_t *period_ms)
{
    int64_t n, ms;
    const char *p = conf_parse_digits(s, &n);
    if (!p || n < 1 || *p != '/')
        return -1;
    p++;
    ms = unit_ms(p);            /* "10/s": a bare unit means one of it */
    if (!ms && conf_parse_duration_ms(p, &ms) < 0)
        return -1;
    *count = n;
    *period_ms = ms;
    return 0;
}

/* A name getaddrinfo may look up: dot-separated labels of letters, digits,
 * '-' and '_' (docker-compose service names), none empty or starting with
 * '-', the last not all digits (RFC 3696), one trailing dot allowed. So
 * "10.0.0.256", "127.1" or "0x7f.1" are typos, not names: inet_aton would
 * even take the last two as numbers. */
int conf_hostname_ok(const char *s)
{
    struct in_addr probe;
    size_t label = 0, n = strlen(s);
    int digits = 1;
    if (n > 1 && s[n - 1] == '.')
        n--;
    if (n == 0 || n > CONF_MAX_HOSTNAME || inet_aton(s, &probe))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '.') {
            if (label == 0)
                return 0;
            label = 0;
            digits = 1;
        } else if ((isalnum((unsigned char)ch) || ch == '_' || (ch == '-' && label > 0)) &&
                   label < 63) {
            label++;
            digits &= isdigit((unsigned char)ch) != 0;
        } else {
            return 0;
        }
    }
    return label > 0 && !digits;
}

/* addr_split as the config takes it: a v6 address needs its brackets;
 * *port_text points at the port in s (for getaddrinfo), *family is AF_INET6
 * for the bracketed form. -1 on bad syntax or port. */
int conf_split_addr(const char *s, char host[CONF_MAX_HOSTNAME + 1],
                           const char **port_text, int *family)
{
    int port, form = addr_split(s, host, CONF_MAX_HOSTNAME + 1, &port);
    if (form < 0 || form == ADDR_LAST_COLON)
        return -1;
    *family = form == ADDR_V6_PORT ? AF_INET6 : AF_INET;
    *port_text = strrchr(s, ':') + 1;
    return 0;
}

/* host:port with a numeric host, [v6]:port, localhost:port or NAME:port.
 * Returns 0, -1 on bad syntax, or a getaddrinfo error when a name does not
 * resolve; host receives the host part (for that message). Names resolve
 * now, once: the first address wins, as docker-compose service names need. */
static int parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *sslen,
                      char host[CONF_MAX_HOSTNAME + 1])
{
    const char *ps;
    struct addrinfo hints, *res;
    unsigned char probe[sizeof(struct in6_addr)];
    int family, rc;

    if (conf_split_addr(s, host, &ps, &family) < 0)
        return -1;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (family == AF_INET && !strcmp(host, "localhost")) {
        memcpy(host, "127.0.0.1", sizeof("127.0.0.1"));  /* not ::1 first, whatever the resolver says */
    } else if (family == AF_INET && inet_pton(AF_INET, host, probe) != 1) {
        if (!conf_hostname_ok(host))
            return -1;
        hints.ai_family = AF_UNSPEC;
        hints.ai_flags = AI_NUMERICSERV;
    }
    rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0)
        return hints.ai_flags & AI_NUMERICHOST ? -1 : (rc == -1 ? EAI_FAIL : rc);
    if (res->ai_addrlen > sizeof *ss) {
        freeaddrinfo(res);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int conf_get_addr(struct ctx *x, struct node *n, struct conf_addr *a)
{
    char sb[SHOW_BUF], host[CONF_MAX_HOSTNAME + 1];
    const char *s = conf_scalar(x, n);
    int rc;
    if (!s)
        return -1;
    rc = parse_addr(s, &a->ss, &a->sslen, host);
    if (rc == -1)
        return conf_fail(x, n, "bad address '%s' (use IP:PORT, [IPV6]:PORT or HOST:PORT)",
                         conf_show(s, sb));
    if (rc != 0)
        return conf_fail(x, n, "cannot resolve '%s': %s", conf_show(host, sb), gai_strerror(rc));
    free(a->text);
    a->text = xstrdup(s);
    return 0;
}

/* ---- percent-decoding, host bytes, HTTP tokens */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Percent-decoded copy of s[0..n), NULL on a bad escape or %00. */
char *conf_pct_decode(const char *s, size_t n)
{
    char *out = xmalloc(n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            if (i + 2 >= n) {
                free(out);
                return NULL;
            }
            int a = hexval((unsigned char)s[i + 1]), b = hexval((unsigned char)s[i + 2]);
            if (a < 0 || b < 0 || (a == 0 && b == 0)) {
                free(out);
                return NULL;
            }
            *o++ = (char)(a * 16 + b);
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return out;
}

int conf_host_chars_ok(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-._", s[i]))
            return 0;
    return 1;
}

static int tchar(int ch)
{
    return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

int conf_is_token(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!tchar((unsigned char)*s))
            return 0;
    return 1;
}
