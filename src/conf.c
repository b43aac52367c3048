/* sluice - conf.c: YAML file -> struct conf, the only user of libyaml.
 *
 * Three phases, each stopping at the first error: (1) syntax: libyaml events
 * become a small tree of nodes that keep their file position; (2) each key:
 * every mapping is walked with a table of {key, handler}, handlers check type
 * and bounds and fill struct conf; (3) across keys: upstream references and
 * duplicate names. Every error reads "FILE:LINE:COL: message" and names the
 * key path, so an operator can fix a bad file without guessing. What the
 * modules that use a config must build or check (TLS files and contexts,
 * override keys) is confcheck.c's, after this: the nodes it may blame are
 * recorded here (struct conf_mark). */
#include "conf.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

#include "http1.h"
#include "regex.h"

#define CONF_MAX_FILE_BYTES (4 << 20)
#define CONF_MAX_DEPTH      32
/* Ten years: far beyond any sane window, small enough that ms -> us and the
 * Lua script's doubles stay exact. */
#define CONF_MAX_DURATION_MS (3650LL * 86400 * 1000)
#define CONF_MAX_COUNT      1000000000LL    /* limit, burst */
#define CONF_MAX_NAME       64
#define CONF_MAX_PREFIX     256
#define CONF_MAX_HOSTNAME   253
#define CONF_MAX_REGEX      512     /* path_regex bytes */
#define CONF_MAX_REGEX_WEIGHT 256     /* see regex_weight() */
#define CONF_MAX_CAPTURES   9       /* capture:1..9 */
#define CONF_MAX_COST       1000000 /* route cost */
#define CONF_MAX_MESSAGE    256     /* limit message bytes */
#define CONF_MAX_MEMORY_KEYS 100000000LL   /* memory.max_keys, deny_cache.max_keys */
#define CONF_MAX_OVERRIDES  1000    /* overrides per limit (looked up in a list) */
#define CONF_MAX_PART       1024    /* bytes of one override key value */
#define CONF_MAX_TOKEN      256     /* admin.token bytes */
#define SHOW_BUF            80

enum node_kind { NODE_NULL, NODE_SCALAR, NODE_SEQ, NODE_MAP };

struct node {
    enum node_kind kind;
    int line, col;              /* 1-based */
    char *str;                  /* scalar (and null) text as written */
    int substituted;            /* ${VAR} already expanded in str */
    struct node **kids;         /* seq: items; map: key, value, key, value... */
    int nkids;
};

struct ctx {
    const char *file;
    const char *buf;            /* the file's bytes, for reader error offsets */
    size_t len;
    char *err;                  /* first error, malloc'd */
    char path[256];             /* key path of the node being checked */
    size_t pathlen;
    struct conf *c;
    struct node *routes;        /* the routes sequence, for phase 3 */
};

struct key_def {
    const char *name;
    int (*fn)(struct ctx *x, struct node *k, struct node *v, void *obj);
    int required;
};

/* ---- memory: allocation failure is not recoverable in a proxy */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        abort();
    return p;
}

static char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

/* ---- errors */

/* A value as it may appear in a message: bounded, no control bytes. */
static const char *show(const char *s, char *out)
{
    size_t i, max = SHOW_BUF - 4;
    for (i = 0; i < max && s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[i] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (s[i])
        memcpy(out + i, "...", 3), i += 3;
    out[i] = '\0';
    return out;
}

static int vfail_at(struct ctx *x, int line, int col, int with_path,
                    const char *fmt, va_list ap)
{
    char *msg;
    int rc;
    if (x->err)
        return -1;
    if (vasprintf(&msg, fmt, ap) < 0)
        abort();
    if (with_path && x->pathlen)
        rc = asprintf(&x->err, "%s:%d:%d: %s: %s", x->file, line, col, x->path, msg);
    else
        rc = asprintf(&x->err, "%s:%d:%d: %s", x->file, line, col, msg);
    if (rc < 0)
        abort();
    free(msg);
    return -1;
}

/* An error at node n, prefixed with the current key path. */
__attribute__((format(printf, 3, 4)))
static int fail(struct ctx *x, const struct node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, n->line, n->col, 1, fmt, ap);
    va_end(ap);
    return -1;
}

/* An error at node n whose message names the place itself. */
__attribute__((format(printf, 3, 4)))
static int fail_bare(struct ctx *x, const struct node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, n->line, n->col, 0, fmt, ap);
    va_end(ap);
    return -1;
}

__attribute__((format(printf, 4, 5)))
static int fail_mark(struct ctx *x, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, line, col, 0, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *where(const struct ctx *x)
{
    return x->pathlen ? x->path : "top level";
}

/* ---- key path: "routes[1].limits[0].window" */

__attribute__((format(printf, 2, 3)))
static size_t path_push(struct ctx *x, const char *fmt, ...)
{
    size_t old = x->pathlen;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->path + old, sizeof x->path - old, fmt, ap);
    va_end(ap);
    x->pathlen = strlen(x->path);
    return old;
}

static size_t path_push_key(struct ctx *x, const char *key)
{
    return x->pathlen ? path_push(x, ".%s", key) : path_push(x, "%s", key);
}

static void path_pop(struct ctx *x, size_t old)
{
    x->pathlen = old;
    x->path[old] = '\0';
}

/* Remember node n at the current key path, for a check after parsing. */
static void mark(const struct ctx *x, const struct node *n, struct conf_mark *m)
{
    free(m->where);
    m->where = xstrdup(x->path);
    m->line = n->line;
    m->col = n->col;
}

/* ---- phase 1: syntax, events -> node tree */

static void node_free(struct node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->nkids; i++)
        node_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    free(n);
}

static struct node *node_new(enum node_kind kind, const yaml_mark_t *m)
{
    struct node *n = xcalloc(1, sizeof *n);
    n->kind = kind;
    n->line = (int)m->line + 1;
    n->col = (int)m->column + 1;
    return n;
}

static void node_add(struct node *n, struct node *kid, int *cap)
{
    if (n->nkids == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        n->kids = realloc(n->kids, (size_t)*cap * sizeof *n->kids);
        if (!n->kids)
            abort();
    }
    n->kids[n->nkids++] = kid;
}

/* Reader errors (bad UTF-8) carry a byte offset, not a mark. */
static void offset_to_mark(const struct ctx *x, size_t off, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < x->len; i++) {
        if (x->buf[i] == '\n')
            (*line)++, *col = 1;
        else
            (*col)++;
    }
}

static int syntax_error(struct ctx *x, const yaml_parser_t *p)
{
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    const char *problem = p->problem ? p->problem : "cannot parse";
    if (p->error == YAML_MEMORY_ERROR)
        abort();
    if (p->error == YAML_READER_ERROR)
        offset_to_mark(x, p->problem_offset, &line, &col);
    if (p->context && p->context_mark.line == p->problem_mark.line &&
        p->context_mark.column == p->problem_mark.column)
        return fail_mark(x, line, col, "syntax error: %s (%s)", problem, p->context);
    if (p->context)
        return fail_mark(x, line, col, "syntax error: %s (%s at %d:%d)", problem,
                         p->context, (int)p->context_mark.line + 1,
                         (int)p->context_mark.column + 1);
    return fail_mark(x, line, col, "syntax error: %s", problem);
}

static int next_event(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev)
{
    if (!yaml_parser_parse(p, ev))
        return syntax_error(x, p);
    return 0;
}

static int is_null_text(const char *s)
{
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

static struct node *tree_from(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev, int depth);

static struct node *tree_scalar(struct ctx *x, yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    struct node *n;
    if (memchr(v, '\0', len)) {
        fail_mark(x, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1,
                  "a value contains a NUL byte");
        return NULL;
    }
    n = node_new(NODE_SCALAR, &ev->start_mark);
    n->str = xstrndup(v, len);
    if (ev->data.scalar.plain_implicit && is_null_text(n->str))
        n->kind = NODE_NULL;
    return n;
}

/* Children of a sequence or mapping until its end event. */
static int tree_children(struct ctx *x, yaml_parser_t *p, struct node *n,
                         yaml_event_type_t end, int depth)
{
    int cap = 0;
    for (;;) {
        yaml_event_t ev;
        struct node *kid;
        if (next_event(x, p, &ev) < 0)
            return -1;
        if (ev.type == end) {
            yaml_event_delete(&ev);
            return 0;
        }
        kid = tree_from(x, p, &ev, depth + 1);
        yaml_event_delete(&ev);
        if (!kid)
            return -1;
        node_add(n, kid, &cap);
        if (n->kind == NODE_MAP && n->nkids % 2 == 1 && kid->kind != NODE_SCALAR)
            return fail_bare(x, kid, "syntax error: a mapping key must be a plain value");
    }
}

/* The node that starts with event ev (the caller deletes ev). */
static struct node *tree_from(struct ctx *x, yaml_parser_t *p, yaml_event_t *ev, int depth)
{
    struct node *n;
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    if (depth > CONF_MAX_DEPTH) {
        fail_mark(x, line, col, "syntax error: nested deeper than %d levels", CONF_MAX_DEPTH);
        return NULL;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        return tree_scalar(x, ev);
    case YAML_SEQUENCE_START_EVENT:
        n = node_new(NODE_SEQ, &ev->start_mark);
        if (tree_children(x, p, n, YAML_SEQUENCE_END_EVENT, depth) < 0)
            goto fail;
        return n;
    case YAML_MAPPING_START_EVENT:
        n = node_new(NODE_MAP, &ev->start_mark);
        if (tree_children(x, p, n, YAML_MAPPING_END_EVENT, depth) < 0)
            goto fail;
        return n;
    case YAML_ALIAS_EVENT:
        /* Aliases would make the tree a graph (and a "billion laughs"
         * file a bomb); a config this small does not need them. */
        fail_mark(x, line, col, "syntax error: aliases (*name) are not supported");
        return NULL;
    default:
        fail_mark(x, line, col, "syntax error: unexpected YAML event");
        return NULL;
    }
fail:
    node_free(n);
    return NULL;
}

/* The one document of the file, or NULL with x->err set. */
static struct node *tree_load(struct ctx *x)
{
    yaml_parser_t p;
    yaml_event_t ev;
    struct node *root = NULL;
    int have_ev = 0;

    if (!yaml_parser_initialize(&p))
        abort();
    yaml_parser_set_input_string(&p, (const unsigned char *)x->buf, x->len);
    if (next_event(x, &p, &ev) < 0)             /* stream start */
        goto fail;
    yaml_event_delete(&ev);
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    if (ev.type == YAML_STREAM_END_EVENT) {
        fail_mark(x, 1, 1, "empty file: expected a mapping with listen, upstreams and routes");
        goto fail;
    }
    yaml_event_delete(&ev);                     /* document start */
    have_ev = 0;
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    root = tree_from(x, &p, &ev, 0);
    if (!root)
        goto fail;
    yaml_event_delete(&ev);
    have_ev = 0;
    if (next_event(x, &p, &ev) < 0)             /* document end */
        goto fail;
    yaml_event_delete(&ev);
    if (next_event(x, &p, &ev) < 0)
        goto fail;
    have_ev = 1;
    if (ev.type != YAML_STREAM_END_EVENT) {
        fail_mark(x, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                  "syntax error: only one YAML document is allowed");
        goto fail;
    }
    yaml_event_delete(&ev);
    yaml_parser_delete(&p);
    return root;
fail:
    if (have_ev)
        yaml_event_delete(&ev);
    yaml_parser_delete(&p);
    node_free(root);
    return NULL;
}

/* ---- typed access to nodes */

static const char *kind_name(enum node_kind k)
{
    switch (k) {
    case NODE_NULL: return "nothing";
    case NODE_SCALAR: return "a scalar";
    case NODE_SEQ: return "a sequence";
    case NODE_MAP: return "a mapping";
    }
    return "?";
}

static int expect(struct ctx *x, const struct node *n, enum node_kind k)
{
    if (n->kind != k)
        return fail(x, n, "expected %s, got %s", kind_name(k), kind_name(n->kind));
    return 0;
}

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
            return fail(x, n, "environment variable '%s' is not set and has no default", var);
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
    return fail(x, n, "bad variable reference in '%s' (use ${NAME} or ${NAME:-default})",
                show(n->str, sb));
}

/* The scalar's text after substitution, or NULL with the error set. */
static const char *scalar(struct ctx *x, struct node *n)
{
    if (expect(x, n, NODE_SCALAR) < 0)
        return NULL;
    if (!n->substituted && subst(x, n) < 0)
        return NULL;
    return n->str;
}

/* A name used in headers, JSON bodies and Redis keys: keep it plain. */
static const char *name_scalar(struct ctx *x, struct node *n)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    size_t i;
    if (!s)
        return NULL;
    for (i = 0; s[i]; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i]))
            break;
    if (!*s || s[i] || i > CONF_MAX_NAME) {
        fail(x, n, "bad name '%s' (use 1 to %d letters, digits, '-', '_' or '.')",
             show(s, sb), CONF_MAX_NAME);
        return NULL;
    }
    return s;
}

/* Strict decimal: optional '-', digits, nothing else. */
static int parse_int(const char *s, int64_t *out)
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

static int get_int(struct ctx *x, struct node *n, int64_t min, int64_t max, int64_t *out)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    int rc;
    if (!s)
        return -1;
    rc = parse_int(s, out);
    if (rc == -1)
        return fail(x, n, "expected an integer, got '%s'", show(s, sb));
    if (rc == -2 || *out < min || *out > max)
        return fail(x, n, "%s is out of range (%lld..%lld)", show(s, sb),
                    (long long)min, (long long)max);
    return 0;
}

static int get_duration(struct ctx *x, struct node *n, int64_t *out_ms)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    if (!s)
        return -1;
    if (conf_parse_duration_ms(s, out_ms) < 0)
        return fail(x, n, "bad duration '%s' (use e.g. 500ms, 30s, 5m, 1h, 1d, 1w)",
                    show(s, sb));
    if (*out_ms > CONF_MAX_DURATION_MS)
        return fail(x, n, "duration '%s' is out of range (at most 3650d)", show(s, sb));
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

static int get_size(struct ctx *x, struct node *n, uint64_t min, uint64_t max, uint64_t *out)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    if (!s)
        return -1;
    if (parse_size(s, out) < 0)
        return fail(x, n, "bad size '%s' (use e.g. 16384, 64k, 10m, 1g)", show(s, sb));
    if (*out < min || *out > max)
        return fail(x, n, "size '%s' is out of range (%llu..%llu bytes)", show(s, sb),
                    (unsigned long long)min, (unsigned long long)max);
    return 0;
}

/* YAML 1.2 core booleans only: "yes", "on" and "True" are typos here. */
static int get_bool(struct ctx *x, struct node *n, int *out)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    if (!s)
        return -1;
    if (!strcmp(s, "true") || !strcmp(s, "false")) {
        *out = s[0] == 't';
        return 0;
    }
    return fail(x, n, "expected true or false, got '%s'", show(s, sb));
}

/* One of names[0..n), by index; the message lists them. */
static int get_enum(struct ctx *x, struct node *n, const char *const *names, int count,
                    const char *choices, int *out)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    if (!s)
        return -1;
    for (int i = 0; i < count; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    }
    return fail(x, n, "bad value '%s' (use %s)", show(s, sb), choices);
}

/* The key node of key in mapping m (for positions), or NULL. */
static struct node *map_key(const struct node *m, const char *key)
{
    if (!m || m->kind != NODE_MAP)
        return NULL;
    for (int i = 0; i + 1 < m->nkids; i += 2)
        if (!strcmp(m->kids[i]->str, key))
            return m->kids[i];
    return NULL;
}

static struct node *map_get(const struct node *m, const char *key)
{
    if (!m || m->kind != NODE_MAP)
        return NULL;
    for (int i = 0; i + 1 < m->nkids; i += 2)
        if (!strcmp(m->kids[i]->str, key))
            return m->kids[i + 1];
    return NULL;
}

/* Walk mapping n with a table: unknown, duplicate and missing keys are
 * errors here, so handlers see each of their keys exactly once. */
static int walk_map(struct ctx *x, struct node *n, const struct key_def *defs, void *obj)
{
    char sb[SHOW_BUF];
    uint64_t seen = 0;          /* bit d: defs[d] met; tables stay under 64 keys */
    int i, d;
    if (expect(x, n, NODE_MAP) < 0)
        return -1;
    for (i = 0; i + 1 < n->nkids; i += 2) {
        struct node *k = n->kids[i], *v = n->kids[i + 1];
        size_t old;
        int rc;
        for (d = 0; defs[d].name && strcmp(defs[d].name, k->str); d++)
            if (d >= 63)
                abort();
        if (!defs[d].name)
            return fail_bare(x, k, "unknown key '%s' in %s", show(k->str, sb), where(x));
        if (seen & (1ULL << d))
            return fail_bare(x, k, "duplicate key '%s' in %s", k->str, where(x));
        seen |= 1ULL << d;
        old = path_push_key(x, defs[d].name);
        rc = defs[d].fn(x, k, v, obj);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    for (d = 0; defs[d].name; d++)
        if (defs[d].required && !(seen & (1ULL << d)))
            return fail_bare(x, n, "missing required key '%s' in %s", defs[d].name, where(x));
    return 0;
}

/* ---- values: durations, rates, addresses, CIDRs, URLs */

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
static const char *parse_digits(const char *s, int64_t *out)
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
    const char *u = parse_digits(s, &n);
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
    const char *p = parse_digits(s, &n);
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
static int hostname_ok(const char *s)
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
static int conf_split_addr(const char *s, char host[CONF_MAX_HOSTNAME + 1],
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
        if (!hostname_ok(host))
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

static int get_addr(struct ctx *x, struct node *n, struct conf_addr *a)
{
    char sb[SHOW_BUF], host[CONF_MAX_HOSTNAME + 1];
    const char *s = scalar(x, n);
    int rc;
    if (!s)
        return -1;
    rc = parse_addr(s, &a->ss, &a->sslen, host);
    if (rc == -1)
        return fail(x, n, "bad address '%s' (use IP:PORT, [IPV6]:PORT or HOST:PORT)",
                    show(s, sb));
    if (rc != 0)
        return fail(x, n, "cannot resolve '%s': %s", show(host, sb), gai_strerror(rc));
    free(a->text);
    a->text = xstrdup(s);
    return 0;
}

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Percent-decoded copy of s[0..n), NULL on a bad escape or %00. */
static char *pct_decode(const char *s, size_t n)
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

static int host_chars_ok(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-._", s[i]))
            return 0;
    return 1;
}

/* redis://[user:password@]host[:port][/db] or unix:///path.sock[?db=N].
 * Returns NULL or the reason; never echoes the URL (it may hold a password). */
static const char *parse_redis_url(const char *url, struct conf_redis *r)
{
    const char *p, *auth_end, *at, *hp, *he, *colon;
    int64_t db = 0;

    if (!strncmp(url, "unix://", 7)) {
        const char *path = url + 7, *q = strchr(path, '?');
        size_t plen = q ? (size_t)(q - path) : strlen(path);
        if (plen < 2 || path[0] != '/')
            return "unix socket path must be absolute";
        if (plen >= sizeof(((struct sockaddr_un *)0)->sun_path))
            return "unix socket path too long";
        if (q) {
            const char *e;
            if (strncmp(q, "?db=", 4) || !(e = parse_digits(q + 4, &db)) || *e || db > 65535)
                return "db must be ?db=N with N in 0..65535";
        }
        r->is_unix = 1;
        r->host = xstrndup(path, plen);
        r->port = 0;
        r->db = (int)db;
        return NULL;
    }
    r->tls = !strncmp(url, "rediss://", 9);
    if (strncmp(url, "redis://", 8) && !r->tls)
        return "scheme must be redis://, rediss:// or unix://";
    p = url + 8 + r->tls;
    auth_end = p + strcspn(p, "/?#");
    if (*auth_end == '?' || *auth_end == '#')
        return "query and fragment are not supported on redis:// or rediss://";
    at = NULL;
    for (const char *q = p; q < auth_end; q++)
        if (*q == '@')
            at = q;
    hp = p;
    if (at) {
        colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return "credentials must be user:password@ (user may be empty)";
        if (colon > p && !(r->user = pct_decode(p, (size_t)(colon - p))))
            return "bad percent-escape in user";
        if (!(r->password = pct_decode(colon + 1, (size_t)(at - colon - 1))))
            return "bad percent-escape in password";
        hp = at + 1;
    }
    r->port = 6379;
    if (*hp == '[') {
        char v6[INET6_ADDRSTRLEN];
        unsigned char probe[sizeof(struct in6_addr)];
        he = memchr(hp, ']', (size_t)(auth_end - hp));
        if (!he || (size_t)(he - hp - 1) >= sizeof v6)
            return "bad [IPv6] host";
        memcpy(v6, hp + 1, (size_t)(he - hp - 1));
        v6[he - hp - 1] = '\0';
        if (inet_pton(AF_INET6, v6, probe) != 1)
            return "bad [IPv6] host";
        r->host = xstrdup(v6);
        colon = he + 1 < auth_end ? he + 1 : NULL;
        if (colon && *colon != ':')
            return "bad [IPv6] host";
    } else {
        colon = memchr(hp, ':', (size_t)(auth_end - hp));
        he = colon ? colon : auth_end;
        if (!host_chars_ok(hp, (size_t)(he - hp)))
            return "bad host";
        r->host = xstrndup(hp, (size_t)(he - hp));
    }
    if (colon) {
        if (addr_port(colon + 1, (size_t)(auth_end - colon - 1), &r->port) < 0)
            return "port must be 1..65535";
    }
    if (*auth_end == '/' && auth_end[1]) {
        const char *e = parse_digits(auth_end + 1, &db);
        if (!e || *e || db > 65535)
            return "db must be a number in 0..65535";
    }
    r->is_unix = 0;
    r->db = (int)db;
    return NULL;
}

static void redis_free_target(struct conf_redis *r)
{
    free(r->url);
    free(r->host);
    free(r->user);
    free(r->password);
    r->url = r->host = r->user = r->password = NULL;
}

/* ---- phase 2: each key. Handlers: (ctx, key node, value node, object). */

static int tchar(int ch)
{
    return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int is_token(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!tchar((unsigned char)*s))
            return 0;
    return 1;
}

/* ---- listen: an address, or a list of { address, tls } entries */

#define CONF_MAX_LISTENS 16
#define CONF_MAX_CERTS   64

static int h_cert_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!*s || strlen(s) > PATH_MAX)
        return fail(x, v, "expected a file path");
    ((struct conf_cert *)obj)->cert_file = xstrdup(s);
    return 0;
}

static int h_key_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!*s || strlen(s) > PATH_MAX)
        return fail(x, v, "expected a file path");
    ((struct conf_cert *)obj)->key_file = xstrdup(s);
    return 0;
}

static const struct key_def cert_keys[] = {
    { "cert_file", h_cert_file, 1 },
    { "key_file", h_key_file, 1 },
    { NULL, NULL, 0 },
};

static int h_tls_certificates(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_tls *t = obj;
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0 || v->nkids > CONF_MAX_CERTS)
        return fail(x, v, "needs 1 to %d certificates", CONF_MAX_CERTS);
    t->certs = xcalloc((size_t)v->nkids, sizeof *t->certs);
    t->ncerts = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        mark(x, v->kids[i], &t->certs[i].at);
        int rc = walk_map(x, v->kids[i], cert_keys, &t->certs[i]);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_tls_min_version(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "1.2", "1.3" };
    int i = 0;
    if (get_enum(x, v, names, 2, "\"1.2\" or \"1.3\"", &i) < 0)
        return -1;
    ((struct conf_tls *)obj)->min_version = i ? 13 : 12;
    return 0;
}

static const struct key_def tls_keys[] = {
    { "certificates", h_tls_certificates, 1 },
    { "min_version", h_tls_min_version, 0 },
    { NULL, NULL, 0 },
};

static int h_listen_address(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_addr(x, v, &((struct conf_listen *)obj)->addr);
}

static int h_listen_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_listen *l = obj;
    l->tls = xcalloc(1, sizeof *l->tls);
    l->tls->min_version = 12;
    return walk_map(x, v, tls_keys, l->tls);
}

static const struct key_def listen_keys[] = {
    { "address", h_listen_address, 1 },
    { "tls", h_listen_tls, 0 },
    { NULL, NULL, 0 },
};

static int h_listen(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (v->kind != NODE_SEQ) {
        c->listens = xcalloc(1, sizeof *c->listens);
        c->nlistens = 1;
        if (get_addr(x, v, &c->listens[0].addr) < 0)
            return -1;
    } else {
        if (v->nkids == 0 || v->nkids > CONF_MAX_LISTENS)
            return fail(x, v, "needs 1 to %d entries", CONF_MAX_LISTENS);
        c->listens = xcalloc((size_t)v->nkids, sizeof *c->listens);
        c->nlistens = v->nkids;
        for (int i = 0; i < v->nkids; i++) {
            size_t old = path_push(x, "[%d]", i);
            struct conf_listen *l = &c->listens[i];
            int rc = v->kids[i]->kind == NODE_MAP ? walk_map(x, v->kids[i], listen_keys, l)
                                                  : get_addr(x, v->kids[i], &l->addr);
            for (int j = 0; rc == 0 && j < i; j++)
                if (c->listens[j].addr.sslen == l->addr.sslen &&
                    !memcmp(&c->listens[j].addr.ss, &l->addr.ss, l->addr.sslen))
                    rc = fail(x, v->kids[i], "address '%s' is listed twice", l->addr.text);
            path_pop(x, old);
            if (rc < 0)
                return -1;
        }
    }
    c->listen = c->listens[0].addr;
    c->listen.text = xstrdup(c->listens[0].addr.text);
    return 0;
}

static void listens_free(struct conf *c)
{
    for (int i = 0; i < c->nlistens; i++) {
        struct conf_listen *l = &c->listens[i];
        free(l->addr.text);
        if (l->tls) {
            for (int j = 0; j < l->tls->ncerts; j++) {
                free(l->tls->certs[j].cert_file);
                free(l->tls->certs[j].key_file);
                free(l->tls->certs[j].at.where);
            }
            free(l->tls->certs);
            free(l->tls);
        }
    }
    free(c->listens);
}

static int h_workers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    const char *s = scalar(x, v);
    int64_t n = 0;
    if (!s)
        return -1;
    if (!strcmp(s, "auto")) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        c->workers = cpus < 1 ? 1 : cpus > 1024 ? 1024 : (int)cpus;
        return 0;
    }
    if (get_int(x, v, 1, 1024, &n) < 0)
        return -1;
    c->workers = (int)n;
    return 0;
}

static int h_max_connections(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (get_int(x, v, 0, 10000000, &n) < 0)
        return -1;
    ((struct conf *)obj)->max_connections = (int)n;
    return 0;
}

static int h_max_header_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    uint64_t n;
    if (get_size(x, v, 1024, HTTP1_MAX_HEAD_BYTES, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->max_header_bytes = (size_t)n;
    return 0;
}

static int h_max_body_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_size(x, v, 0, UINT64_MAX, &((struct conf_client *)obj)->max_body_bytes);
}

static int h_header_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_client *)obj)->header_timeout_ms);
}

static int h_idle_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_client *)obj)->idle_timeout_ms);
}

static int h_body_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_client *)obj)->body_timeout_ms);
}

static int h_buffer_body_bytes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    uint64_t n = 0;
    if (get_size(x, v, 0, 1048576, &n) < 0)
        return -1;
    ((struct conf_client *)obj)->buffer_body_bytes = (size_t)n;
    return 0;
}

static int h_shutdown_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf *)obj)->shutdown_timeout_ms);
}

static int h_underscore_headers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "drop", "pass", "reject" };
    int i = 0;
    if (get_enum(x, v, names, 3, "drop, pass or reject", &i) < 0)
        return -1;
    ((struct conf_client *)obj)->underscore_headers = (enum conf_underscore)i;
    return 0;
}

static const struct key_def client_keys[] = {
    { "max_header_bytes", h_max_header_bytes, 0 },
    { "max_body_bytes", h_max_body_bytes, 0 },
    { "header_timeout", h_header_timeout, 0 },
    { "idle_timeout", h_idle_timeout, 0 },
    { "body_timeout", h_body_timeout, 0 },
    { "underscore_headers", h_underscore_headers, 0 },
    { "buffer_body_bytes", h_buffer_body_bytes, 0 },
    { NULL, NULL, 0 },
};

static int h_client(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, client_keys, &((struct conf *)obj)->client);
}

/* The store resolves redis.url's host at every connect, off the loop
 * (evdns); looking it up once here makes a name that does not resolve a
 * config error naming its place, as upstream names are. */
static int check_names;         /* conf_check_names() */

void conf_check_names(int on)
{
    check_names = on;
}

static int redis_resolve_check(struct ctx *x, struct node *v, const char *host)
{
    char sb[SHOW_BUF];
    unsigned char probe[sizeof(struct in6_addr)];
    struct addrinfo hints, *res;
    if (!check_names || inet_pton(AF_INET, host, probe) == 1 ||
        inet_pton(AF_INET6, host, probe) == 1)
        return 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0)
        return fail(x, v, "cannot resolve redis host '%s': %s", show(host, sb),
                    gai_strerror(rc == -1 ? EAI_FAIL : rc));
    freeaddrinfo(res);
    return 0;
}

/* ---- TLS as a client: upstreams.NAME.tls and redis.tls */

/* A file path for OpenSSL: not empty, bounded, no control bytes. */
static int get_tls_path(struct ctx *x, struct node *v, char **out)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!*s)
        return fail(x, v, "empty path");
    if (strlen(s) > PATH_MAX)
        return fail(x, v, "path is longer than %d bytes", PATH_MAX);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return fail(x, v, "path '%s' has a control byte", show(s, sb));
    free(*out);
    *out = xstrdup(s);
    return 0;
}

static int h_tls_ca_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    mark(x, v, &((struct conf_tls_client *)obj)->ca_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->ca_file);
}

static int h_tls_cert_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    mark(x, v, &((struct conf_tls_client *)obj)->cert_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->cert_file);
}

static int h_tls_key_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    mark(x, v, &((struct conf_tls_client *)obj)->key_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->key_file);
}

static int h_tls_verify(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_bool(x, v, &((struct conf_tls_client *)obj)->verify);
}

/* A DNS name (SNI and verified), or an IP address (verified, no SNI). */
static int h_tls_server_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_tls_client *t = obj;
    char sb[SHOW_BUF];
    unsigned char probe[sizeof(struct in6_addr)];
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!hostname_ok(s) && inet_pton(AF_INET, s, probe) != 1 &&
        inet_pton(AF_INET6, s, probe) != 1)
        return fail(x, v, "bad server name '%s' (use a host name or an IP address)",
                    show(s, sb));
    free(t->server_name);
    t->server_name = xstrdup(s);
    return 0;
}

static const struct key_def tls_client_keys[] = {
    { "ca_file", h_tls_ca_file, 0 },
    { "server_name", h_tls_server_name, 0 },
    { "verify", h_tls_verify, 0 },
    { "cert_file", h_tls_cert_file, 0 },
    { "key_file", h_tls_key_file, 0 },
    { NULL, NULL, 0 },
};

/* A file the store's TLS context loads when it starts (redis.tls.KEY):
 * readable now, or this file's error. */
static int check_tls_file(struct ctx *x, struct node *tls, const char *key, const char *path)
{
    char sb[SHOW_BUF];
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        fclose(f);
        return 0;
    }
    size_t old = path_push(x, ".%s", key);
    fail(x, map_get(tls, key), "cannot read '%s': %s", show(path, sb), strerror(errno));
    path_pop(x, old);
    return -1;
}

/* redis.tls: TLS to every node, whatever the url's scheme. */
static int h_redis_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    struct conf_tls_client *t = &r->tls_conf;
    if (walk_map(x, v, tls_client_keys, t) < 0 ||
        check_tls_file(x, v, "ca_file", t->ca_file) < 0 ||
        check_tls_file(x, v, "cert_file", t->cert_file) < 0 ||
        check_tls_file(x, v, "key_file", t->key_file) < 0)
        return -1;
    if (r->tls_conf.key_file != NULL && r->tls_conf.cert_file == NULL)
        return fail(x, k, "key_file needs cert_file");
    r->tls = 1;
    return 0;
}

static void redis_free_tls(struct conf_tls_client *t)
{
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    free(t->server_name);
    t->ca_file = t->cert_file = t->key_file = t->server_name = NULL;
    free(t->at.where);
    free(t->ca_at.where);
    free(t->cert_at.where);
    free(t->key_at.where);
    t->at.where = t->ca_at.where = t->cert_at.where = t->key_at.where = NULL;
}

static int h_redis_url(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj, t = { 0 };
    const char *s = scalar(x, v), *why;
    if (!s)
        return -1;
    why = parse_redis_url(s, &t);
    if (why) {
        redis_free_target(&t);
        return fail(x, v, "bad redis url: %s (use redis://[user:password@]host[:port][/db] "
                    "or unix:///path.sock[?db=N])", why);
    }
    if (!t.is_unix && redis_resolve_check(x, v, t.host) < 0) {
        redis_free_target(&t);
        return -1;
    }
    /* The parsed target moves into r whole (r's old strings are freed). */
    redis_free_target(r);
    r->url = xstrdup(s);
    r->host = t.host;
    r->user = t.user;
    r->password = t.password;
    r->is_unix = t.is_unix, r->port = t.port, r->db = t.db;
    r->tls |= t.tls;
    return 0;
}

static int h_redis_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_redis *)obj)->timeout_ms);
}

static int h_redis_prefix(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    /* Braces would become the Redis Cluster hash tag of every key. */
    if (strpbrk(s, "{}"))
        return fail(x, v, "prefix must not contain '{' or '}' (keys use them as the "
                    "Redis Cluster hash tag)");
    if (strlen(s) > CONF_MAX_PREFIX)
        return fail(x, v, "prefix is longer than %d bytes", CONF_MAX_PREFIX);
    free(r->prefix);
    r->prefix = xstrdup(s);
    return 0;
}

static int h_redis_on_error(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "allow", "deny", "local" };
    int i = 0;
    if (get_enum(x, v, names, 3, "allow, deny or local", &i) < 0)
        return -1;
    ((struct conf_redis *)obj)->on_error = (enum conf_on_error)i;
    return 0;
}

/* A node the store connects to later (a cluster seed, a sentinel):
 * host:port or [v6]:port; names are looked up at connect time, so only their
 * shape is checked here. */
static int node_addr_ok(const char *s)
{
    char host[CONF_MAX_HOSTNAME + 1];
    unsigned char probe[sizeof(struct in6_addr)];
    const char *ps;
    int family;
    if (conf_split_addr(s, host, &ps, &family) < 0)
        return 0;
    if (family == AF_INET6)
        return inet_pton(AF_INET6, host, probe) == 1;
    return inet_pton(AF_INET, host, probe) == 1 || hostname_ok(host);
}

static int node_resolve_check(struct ctx *x, struct node *v, const char *a)
{
    char host[CONF_MAX_HOSTNAME + 1];
    const char *ps;
    int family;
    if (conf_split_addr(a, host, &ps, &family) < 0)
        return 0;
    return redis_resolve_check(x, v, host);
}

/* A non-empty sequence of node addresses into *out (owned by the conf). */
static int get_nodes(struct ctx *x, struct node *v, char ***out, int *nout, const char *what)
{
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one %s", what);
    for (int i = 0; i < *nout; i++)
        free((*out)[i]);
    free(*out);
    *out = xcalloc((size_t)v->nkids, sizeof **out);
    *nout = 0;
    for (int i = 0; i < v->nkids; i++) {
        char sb[SHOW_BUF];
        const char *a = scalar(x, v->kids[i]);
        if (!a)
            return -1;
        if (!node_addr_ok(a))
            return fail(x, v->kids[i], "bad %s address '%s' (use HOST:PORT or [IPV6]:PORT)",
                        what, show(a, sb));
        if (node_resolve_check(x, v->kids[i], a) < 0)
            return -1;
        (*out)[(*nout)++] = xstrdup(a);
    }
    return 0;
}

static int h_redis_cluster(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    if (r->sentinel_master)
        return fail(x, k, "use either cluster or sentinel, not both");
    return get_nodes(x, v, &r->cluster, &r->ncluster, "cluster node");
}

static int h_sentinel_master(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (*s == '\0' || strlen(s) > 256 || strpbrk(s, " \t\r\n"))
        return fail(x, v, "bad sentinel master name");
    free(r->sentinel_master);
    r->sentinel_master = xstrdup(s);
    return 0;
}

static int h_sentinel_nodes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    return get_nodes(x, v, &r->sentinel_nodes, &r->nsentinel_nodes, "sentinel");
}

static int h_sentinel_password(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    free(r->sentinel_password);
    r->sentinel_password = xstrdup(s);
    return 0;
}

static const struct key_def sentinel_keys[] = {
    { "master", h_sentinel_master, 1 },
    { "nodes", h_sentinel_nodes, 1 },
    { "password", h_sentinel_password, 0 },
    { NULL, NULL, 0 },
};

static int h_redis_sentinel(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_redis *r = obj;
    if (r->ncluster > 0)
        return fail(x, k, "use either cluster or sentinel, not both");
    return walk_map(x, v, sentinel_keys, r);
}

static const struct key_def redis_keys[] = {
    { "url", h_redis_url, 0 },
    { "timeout", h_redis_timeout, 0 },
    { "prefix", h_redis_prefix, 0 },
    { "on_error", h_redis_on_error, 0 },
    { "cluster", h_redis_cluster, 0 },
    { "sentinel", h_redis_sentinel, 0 },
    { "tls", h_redis_tls, 0 },
    { NULL, NULL, 0 },
};

static int h_redis(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, redis_keys, &((struct conf *)obj)->redis);
}

static int h_up_servers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_upstream *u = obj;
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one server");
    u->servers = xcalloc((size_t)v->nkids, sizeof *u->servers);
    u->nservers = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        int rc = get_addr(x, v->kids[i], &u->servers[i]);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_up_keepalive(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (get_int(x, v, 0, 65536, &n) < 0)
        return -1;
    ((struct conf_upstream *)obj)->keepalive = (int)n;
    return 0;
}

static int h_up_connect_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_upstream *)obj)->connect_timeout_ms);
}

static int h_up_timeout(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_duration(x, v, &((struct conf_upstream *)obj)->timeout_ms);
}

/* tls: {} (or null) is TLS with every default. The files are read when
 * the file is loaded (confcheck.c, at the places marked here), so that a
 * bad one is this file's error (and sluice -t's), not a 502 later. */
static int h_up_tls(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_upstream *u = obj;
    struct conf_tls_client *t = xcalloc(1, sizeof *t);
    u->tls = t;
    t->verify = 1;
    mark(x, k, &t->at);
    if (v->kind != NODE_NULL && walk_map(x, v, tls_client_keys, t) < 0)
        return -1;
    if ((t->cert_file != NULL) != (t->key_file != NULL))
        return fail(x, k, "cert_file and key_file go together (the client certificate "
                    "and its key)");
    return 0;
}

static const struct key_def upstream_keys[] = {
    { "servers", h_up_servers, 1 },
    { "keepalive", h_up_keepalive, 0 },
    { "connect_timeout", h_up_connect_timeout, 0 },
    { "timeout", h_up_timeout, 0 },
    { "tls", h_up_tls, 0 },
    { NULL, NULL, 0 },
};

/* upstreams: a mapping of name -> upstream, so no fixed key table here. */
static int h_upstreams(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (expect(x, v, NODE_MAP) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one upstream");
    c->nupstreams = v->nkids / 2;
    c->upstreams = xcalloc((size_t)c->nupstreams, sizeof *c->upstreams);
    for (int i = 0; i < c->nupstreams; i++) {
        struct conf_upstream *u = &c->upstreams[i];
        struct node *name = v->kids[2 * i];
        const char *s = name_scalar(x, name);
        size_t old;
        int rc;
        if (!s)
            return -1;
        for (int j = 0; j < i; j++)
            if (!strcmp(c->upstreams[j].name, s))
                return fail(x, name, "duplicate upstream '%s'", s);
        u->name = xstrdup(s);
        u->keepalive = 32;
        u->connect_timeout_ms = 2000;
        u->timeout_ms = 30000;
        old = path_push_key(x, s);
        rc = walk_map(x, v->kids[2 * i + 1], upstream_keys, u);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* A sequence of CIDRs (trusted_proxies, allow) into a fresh array. */
static int get_cidrs(struct ctx *x, struct node *v, struct addr_cidr **out, int *n)
{
    char sb[SHOW_BUF];
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    *out = xcalloc((size_t)v->nkids, sizeof **out);
    *n = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        const char *s = scalar(x, v->kids[i]);
        int rc = s ? addr_cidr_parse(s, &(*out)[i]) : -1;
        if (s && rc < 0)
            fail(x, v->kids[i], "bad CIDR '%s' (use e.g. 10.0.0.0/8, 192.0.2.7, fd00::/8)",
                 show(s, sb));
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_trusted(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    return get_cidrs(x, v, &c->trusted, &c->ntrusted);
}

static int h_allow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    return get_cidrs(x, v, &c->allow, &c->nallow);
}

static int h_backend(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "redis", "memory" };
    int i = 0;
    if (get_enum(x, v, names, 2, "redis or memory", &i) < 0)
        return -1;
    ((struct conf *)obj)->backend = i == 0 ? CONF_BACKEND_REDIS : CONF_BACKEND_MEMORY;
    return 0;
}

static int h_memory_max_keys(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (get_int(x, v, 1, CONF_MAX_MEMORY_KEYS, &n) < 0)
        return -1;
    ((struct conf *)obj)->memory_max_keys = (size_t)n;
    return 0;
}

static const struct key_def memory_keys[] = {
    { "max_keys", h_memory_max_keys, 0 },
    { NULL, NULL, 0 },
};

static int h_memory(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, memory_keys, obj);
}

static int h_deny_cache_max_keys(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (get_int(x, v, 0, CONF_MAX_MEMORY_KEYS, &n) < 0)
        return -1;
    ((struct conf *)obj)->deny_cache_max_keys = (size_t)n;
    return 0;
}

static const struct key_def deny_cache_keys[] = {
    { "max_keys", h_deny_cache_max_keys, 0 },
    { NULL, NULL, 0 },
};

static int h_deny_cache(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, deny_cache_keys, obj);
}

static int h_admin_listen(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (get_addr(x, v, &c->admin_listen) < 0)
        return -1;
    c->has_admin = 1;
    return 0;
}

/* admin.token: a Bearer token for the admin API's writes (${VAR} is the
 * way to keep it out of the file). */
static int h_admin_token(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    size_t n = strlen(s);
    if (n == 0 || n > CONF_MAX_TOKEN)
        return fail(x, v, "token must be 1 to %d bytes", CONF_MAX_TOKEN);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
            return fail(x, v, "token has a space or a control byte");
    free(c->admin_token);
    c->admin_token = xstrdup(s);
    return 0;
}

static const struct key_def admin_keys[] = {
    { "listen", h_admin_listen, 1 },
    { "token", h_admin_token, 0 },
    { NULL, NULL, 0 },
};

static int h_admin(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, admin_keys, obj);
}

/* off (NULL), stdout, or a file path; the file is opened by the access log
 * module, which reopens it on SIGUSR1. */
static int h_access_log(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    char sb[SHOW_BUF];
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!*s)
        return fail(x, v, "empty value (use off, stdout or a file path)");
    if (strlen(s) > PATH_MAX)
        return fail(x, v, "path is longer than %d bytes", PATH_MAX);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return fail(x, v, "path '%s' has a control byte", show(s, sb));
    free(c->access_log);
    c->access_log = strcmp(s, "off") ? xstrdup(s) : NULL;
    return 0;
}

/* Route match path: starts with '/', '//' merged, no trailing '/'. */
static int h_match_path(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    const char *s = scalar(x, v);
    char *out, *o;
    if (!s)
        return -1;
    if (s[0] != '/')
        return fail(x, v, "path '%s' must start with '/'", show(s, sb));
    /* Requests are matched decoded, so an escape here could never match. */
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || strchr("?#%", *p))
            return fail(x, v, "path '%s' has a space, control byte, '?', '#' or '%%' "
                        "(write it decoded)", show(s, sb));
    out = o = xmalloc(strlen(s) + 1);
    for (const char *p = s; *p; p++)
        if (!(*p == '/' && o > out && o[-1] == '/'))
            *o++ = *p;
    if (o - out > 1 && o[-1] == '/')
        o--;
    *o = '\0';
    for (const char *p = out; (p = strchr(p, '/')) != NULL; p++) {
        size_t seg = strcspn(p + 1, "/");
        if ((seg == 1 && p[1] == '.') || (seg == 2 && p[1] == '.' && p[2] == '.')) {
            free(out);
            return fail(x, v, "path '%s' has a '.' or '..' segment", show(s, sb));
        }
    }
    free(r->path);
    r->path = out;
    r->pathlen = (size_t)(o - out);
    return 0;
}

static int h_match_methods(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one method (leave methods out to match any)");
    r->methods = xcalloc((size_t)v->nkids, sizeof *r->methods);
    r->nmethods = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        const char *s = scalar(x, v->kids[i]);
        int ok = s && is_token(s) && strlen(s) <= 32;
        if (s && !ok)
            fail(x, v->kids[i], "bad method '%s'", show(s, sb));
        path_pop(x, old);
        if (!ok)
            return -1;
        r->methods[i] = xstrdup(s);
        for (char *p = r->methods[i]; *p; p++)
            *p = (char)toupper((unsigned char)*p);
    }
    return 0;
}

/* Host: name or [v6], lower-cased, an optional :port dropped. */
static int h_match_host(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    const char *s = scalar(x, v), *end, *port = NULL;
    int portnum;
    if (!s)
        return -1;
    if (s[0] == '[') {
        end = strchr(s, ']');
        if (!end || end == s + 1 || strspn(s + 1, "0123456789abcdefABCDEF:.") != (size_t)(end - s - 1))
            goto bad;
        end++;
    } else {
        end = s + strcspn(s, ":");
        if (!host_chars_ok(s, (size_t)(end - s)))
            goto bad;
    }
    if (*end == ':')
        port = end + 1;
    else if (*end)
        goto bad;
    if (port && addr_port(port, strlen(port), &portnum) < 0)
        goto bad;
    free(r->host);
    r->host = xstrndup(s, (size_t)(end - s));
    for (char *p = r->host; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
bad:
    return fail(x, v, "bad host '%s' (use e.g. api.example.com or [::1], optionally with :port)",
                show(s, sb));
}

/* How large a pattern may expand, roughly: a compiler copies the atom of a
 * bound {m,n} max(m,n) times (glibc's regcomp also '+' once more, "aa*"; PCRE2
 * groups under a bound), so a{1,32767}, nested bounds or stacked quantifiers
 * ("a++++", each doubling in regcomp) took seconds and gigabytes there, and
 * make large compiled code and JIT code here. Each atom weighs 1, but an
 * anchor or an empty group 4 (empty matches were regcomp's slow part:
 * "(^){245}" took 0.6 s), a group the sum of its contents, a bound
 * multiplies the atom before it; saturates at limit+1. REGEX_TOO_DEEP when
 * groups nest deeper than CONF_MAX_CAPTURES (most groups capture, so such a
 * pattern is refused anyway); REGEX_STACKED when a quantifier follows a
 * quantifier (a**, a+{2}: POSIX leaves them undefined, PCRE2 refuses or
 * reads them differently) other than the one '?' (lazy) or '+' (possessive)
 * that may follow a quantifier; REGEX_OPEN_BOUND for {,n}, which glibc read
 * as {0,n} and PCRE2 before 10.43 as the text "{,n}". */
#define REGEX_TOO_DEEP  (-1)
#define REGEX_STACKED   (-2)
#define REGEX_OPEN_BOUND (-3)
#define REGEX_EMPTY_WEIGHT 4

/* The end of the bound {m}, {m,}, {m,n} or glibc's {,n} at p, with its
 * largest count in *count; NULL when p is a literal '{'. */
static const char *regex_bound(const char *p, int64_t *count)
{
    const char *q = p + 1;
    int64_t m = 0, n = 0;
    if (isdigit((unsigned char)*q) && !(q = parse_digits(q, &m)))
        return NULL;                    /* overflow: PCRE2 refuses it */
    if (*q == ',' && isdigit((unsigned char)q[1]) && !(q = parse_digits(q + 1, &n)))
        return NULL;
    else if (*q == ',')
        q++;
    if (*q != '}' || q == p + 1)
        return NULL;
    *count = m > n ? m : n;
    return q;
}

/* The closing ']' of the bracket expression at p, or the last byte. */
static const char *regex_bracket_end(const char *p)
{
    const char *q = p + 1 + (p[1] == '^');
    if (*q == ']')
        q++;
    while (*q && *q != ']') {
        if (*q == '[' && (q[1] == ':' || q[1] == '.' || q[1] == '=')) {
            const char *e = strchr(q + 2, q[1]);
            q = e && e[1] == ']' ? e + 2 : q + 1;
        } else {
            q++;
        }
    }
    return *q ? q : q - 1;
}

static int64_t regex_weight(const char *re, int64_t limit)
{
    int64_t sum[CONF_MAX_CAPTURES + 1], last[CONF_MAX_CAPTURES + 1], count;
    int d = 0, quantified = 0;
    sum[0] = last[0] = 0;
    for (const char *p = re; *p; p++) {
        int64_t atom = 1, extra;
        if ((*p == '*' || *p == '+' || *p == '?' || (*p == '{' && regex_bound(p, &count))) &&
            last[d] > 0) {
            if (quantified == 1 && (*p == '?' || *p == '+')) {
                quantified = 2;         /* lazy a*?, possessive a*+: no copies */
                continue;
            }
            if (quantified)
                return REGEX_STACKED;
            if (*p == '{' && p[1] == ',')
                return REGEX_OPEN_BOUND;
            quantified = 1;
            extra = *p == '+' ? 1 : *p == '{' ? (count > 1 ? count - 1 : 0) : 0;
            if (extra > limit)
                return limit + 1;
            sum[d] += last[d] * extra;
            last[d] *= extra + 1;
            if (sum[d] > limit)
                return limit + 1;
            if (*p == '{')
                p = regex_bound(p, &count);
            continue;
        }
        quantified = 0;
        switch (*p) {
        case '\\':
            if (p[1])
                p++;
            break;
        case '[':
            p = regex_bracket_end(p);
            break;
        case '(':
            if (d == CONF_MAX_CAPTURES)
                return REGEX_TOO_DEEP;
            sum[++d] = 0;
            last[d] = 0;
            continue;
        case ')':
            if (d == 0)
                break;                  /* PCRE2 reports it */
            atom = sum[d] ? sum[d] : REGEX_EMPTY_WEIGHT;
            d--;
            break;
        case '^': case '$':
            atom = REGEX_EMPTY_WEIGHT;
            break;
        case '|':
            last[d] = 0;
            continue;
        default:
            break;
        }
        last[d] = atom;
        sum[d] += atom;
        if (sum[d] > limit)
            return limit + 1;
    }
    for (; d > 0; d--)                  /* unclosed groups: weighed, then refused */
        sum[d - 1] += sum[d];
    return sum[0] > limit ? limit + 1 : sum[0];
}

/* path_regex: a PCRE2 pattern against the normalised path (route.c compiles
 * and matches it). Bounded so that a config (or a fuzzer) cannot make
 * compiling slow or the compiled code large: length, expansion weight, no
 * backreferences; each match is bounded by route.c's limits. */
static int h_match_path_regex(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF], why[160];
    const char *s = scalar(x, v);
    struct regex *re;
    int64_t weight;
    int ncaptures = 0;
    if (!s)
        return -1;
    if (!*s)
        return fail(x, v, "empty regex");
    if (strlen(s) > CONF_MAX_REGEX)
        return fail(x, v, "regex is longer than %d bytes", CONF_MAX_REGEX);
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return fail(x, v, "regex '%s' has a control byte", show(s, sb));
        if (*p == '\\' && isdigit((unsigned char)p[1]))
            return fail(x, v, "bad regex '%s': backreferences are not supported", show(s, sb));
        if (*p == '\\' && (p[1] == '<' || p[1] == '>'))
            return fail(x, v, "bad regex '%s': \\%c is a '%c' here, not a word boundary "
                        "(write \\b)", show(s, sb), p[1], p[1]);
        if (*p == '\\' && p[1])
            p++;
    }
    weight = regex_weight(s, CONF_MAX_REGEX_WEIGHT);
    if (weight == REGEX_TOO_DEEP)
        return fail(x, v, "regex '%s' has more than %d groups", show(s, sb),
                    CONF_MAX_CAPTURES);
    if (weight == REGEX_STACKED)
        return fail(x, v, "bad regex '%s': a quantifier follows a quantifier (as in a++ "
                    "or a*{2}; write one)", show(s, sb));
    if (weight == REGEX_OPEN_BOUND)
        return fail(x, v, "bad regex '%s': write {0,N}, not {,N} (PCRE2 versions read it "
                    "differently)", show(s, sb));
    if (weight > CONF_MAX_REGEX_WEIGHT)
        return fail(x, v, "bad regex '%s': repetition bounds expand beyond %d atoms",
                    show(s, sb), CONF_MAX_REGEX_WEIGHT);
    re = regex_compile(s, &ncaptures, why, sizeof why);
    if (re == NULL)
        return fail(x, v, "bad regex '%s': %s", show(s, sb), why);
    if (ncaptures > CONF_MAX_CAPTURES) {
        regex_free(re);
        return fail(x, v, "regex '%s' has %d groups, at most %d", show(s, sb), ncaptures,
                    CONF_MAX_CAPTURES);
    }
    r->regex = re;
    r->ncaptures = ncaptures;
    r->path_regex = xstrdup(s);
    return 0;
}

static const struct key_def match_keys[] = {
    { "path", h_match_path, 0 },
    { "path_regex", h_match_path_regex, 0 },
    { "methods", h_match_methods, 0 },
    { "host", h_match_host, 0 },
    { NULL, NULL, 0 },
};

static int h_route_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    const char *s = name_scalar(x, v);
    if (!s)
        return -1;
    r->name = xstrdup(s);
    return 0;
}

/* Exactly one of path and path_regex. */
static int h_route_match(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    if (walk_map(x, v, match_keys, obj) < 0)
        return -1;
    if (r->path && r->regex)
        return fail_bare(x, map_key(v, "path_regex"), "'path' and 'path_regex' both set in "
                         "%s (use one)", where(x));
    if (!r->path && !r->regex)
        return fail_bare(x, v, "missing required key 'path' in %s", where(x));
    return 0;
}

/* Resolved in phase 3: the upstreams may come later in the file. */
static int h_route_upstream(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return name_scalar(x, v) ? 0 : -1;
}

/* A limit's raw parameters: their meaning depends on the algorithm. */
struct limit_src {
    struct conf_limit *l;
    struct node *algorithm, *limit, *window, *rate, *burst;   /* values */
    struct node *overrides, *overrides_k;
    struct node *limit_k, *window_k, *rate_k, *burst_k;       /* their keys */
    struct node *lease, *lease_k, *delay, *delay_k;           /* concurrency; delay */
};

static int h_limit_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    const char *s = name_scalar(x, v);
    if (!s)
        return -1;
    ls->l->name = xstrdup(s);
    return 0;
}

static int h_limit_algorithm(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct limit_src *)obj)->algorithm = v;
    return scalar(x, v) ? 0 : -1;
}

static int h_limit_limit(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->limit = v, ls->limit_k = k;
    return scalar(x, v) ? 0 : -1;
}

static int h_limit_window(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->window = v, ls->window_k = k;
    return scalar(x, v) ? 0 : -1;
}

static int h_limit_rate(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->rate = v, ls->rate_k = k;
    return scalar(x, v) ? 0 : -1;
}

static int h_limit_burst(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->burst = v, ls->burst_k = k;
    return scalar(x, v) ? 0 : -1;
}

static const struct { const char *word; enum conf_keysrc_kind kind; int has_arg; } keysrcs[] = {
    { "ip", CONF_KEY_IP, 0 }, { "method", CONF_KEY_METHOD, 0 }, { "path", CONF_KEY_PATH, 0 },
    { "header", CONF_KEY_HEADER, 1 }, { "query", CONF_KEY_QUERY, 1 },
    { "cookie", CONF_KEY_COOKIE, 1 }, { NULL, 0, 0 },
};

/* 0, or -1 for an unknown source, -2 for a bad capture number. capture:N
 * is checked against the route's path_regex in phase 3 (match may come
 * after limits in the file). */
static int parse_keysrc(const char *s, struct conf_keysrc *out)
{
    const char *colon = strchr(s, ':');
    size_t wl = colon ? (size_t)(colon - s) : strlen(s);
    if (wl == 7 && !strncmp(s, "capture", 7)) {
        if (!colon || colon[1] < '1' || colon[1] > '0' + CONF_MAX_CAPTURES || colon[2])
            return -2;
        out->kind = CONF_KEY_CAPTURE;
        out->capture = colon[1] - '0';
        return 0;
    }
    for (int i = 0; keysrcs[i].word; i++) {
        if (strlen(keysrcs[i].word) != wl || strncmp(s, keysrcs[i].word, wl))
            continue;
        if (!keysrcs[i].has_arg != !colon)
            return -1;
        if (colon && (!is_token(colon + 1) || strlen(colon + 1) > 256))
            return -1;
        out->kind = keysrcs[i].kind;
        out->arg = colon ? xstrdup(colon + 1) : NULL;
        out->arglen = colon ? strlen(colon + 1) : 0;
        return 0;
    }
    return -1;
}

static int h_limit_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    char sb[SHOW_BUF];
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one key source (e.g. [ip])");
    l->keys = xcalloc((size_t)v->nkids, sizeof *l->keys);
    l->nkeys = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        const char *s = scalar(x, v->kids[i]);
        int rc = s ? parse_keysrc(s, &l->keys[i]) : -1;
        if (s && rc == -2)
            fail(x, v->kids[i], "bad key source '%s' (capture:N takes a group number "
                 "1..%d)", show(s, sb), CONF_MAX_CAPTURES);
        else if (s && rc < 0)
            fail(x, v->kids[i], "bad key source '%s' (use ip, method, path, header:NAME, "
                 "query:NAME or cookie:NAME)", show(s, sb));
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_limit_shadow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_bool(x, v, &((struct limit_src *)obj)->l->shadow);
}

static int h_limit_cost_header(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    char sb[SHOW_BUF];
    const char *s = scalar(x, v);
    if (!s)
        return -1;
    if (!is_token(s) || strlen(s) > 256)
        return fail(x, v, "bad header name '%s'", show(s, sb));
    l->cost_header = xstrdup(s);
    return 0;
}

/* One count_status item: a status 100..599, or a class 1xx..5xx. */
static int count_status_item(struct ctx *x, struct node *n, struct conf_limit *l)
{
    char sb[SHOW_BUF];
    const char *s = scalar(x, n);
    int64_t st;
    if (!s)
        return -1;
    if (s[0] >= '1' && s[0] <= '5' && !strcmp(s + 1, "xx")) {
        int base = (s[0] - '0') * 100;
        memset(l->count_status + base, 1, 100);
        return 0;
    }
    if (parse_int(s, &st) != 0 || st < 100 || st > 599)
        return fail(x, n, "bad status '%s' (use 100..599, or 1xx, 2xx, 3xx, 4xx, 5xx)",
                    show(s, sb));
    l->count_status[st] = 1;
    return 0;
}

static int h_limit_count_status(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one status (leave count_status out to count all)");
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        int rc = count_status_item(x, v->kids[i], l);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    l->has_count_status = 1;
    return 0;
}

static int h_limit_status(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t n = 0;
    if (get_int(x, v, 400, 599, &n) < 0)
        return -1;
    ((struct limit_src *)obj)->l->status = (int)n;
    return 0;
}

/* Goes into the JSON body of a rejection: bounded, no control bytes. */
static int h_limit_message(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_limit *l = ((struct limit_src *)obj)->l;
    const char *s = scalar(x, v);
    size_t n;
    if (!s)
        return -1;
    n = strlen(s);
    if (n > CONF_MAX_MESSAGE)
        return fail(x, v, "message is %zu bytes, at most %d", n, CONF_MAX_MESSAGE);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return fail(x, v, "message has a control byte");
    l->message = xstrdup(s);
    return 0;
}

static int h_limit_overrides(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->overrides = v, ls->overrides_k = k;
    return expect(x, v, NODE_SEQ);
}

static int h_limit_lease(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->lease = v, ls->lease_k = k;
    return scalar(x, v) ? 0 : -1;
}

static int h_limit_delay(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct limit_src *ls = obj;
    ls->delay = v, ls->delay_k = k;
    return scalar(x, v) ? 0 : -1;
}

static const struct key_def limit_keys[] = {
    { "name", h_limit_name, 1 },
    { "algorithm", h_limit_algorithm, 1 },
    { "limit", h_limit_limit, 0 },
    { "window", h_limit_window, 0 },
    { "rate", h_limit_rate, 0 },
    { "burst", h_limit_burst, 0 },
    { "key", h_limit_key, 1 },
    { "shadow", h_limit_shadow, 0 },
    { "cost_header", h_limit_cost_header, 0 },
    { "count_status", h_limit_count_status, 0 },
    { "status", h_limit_status, 0 },
    { "message", h_limit_message, 0 },
    { "overrides", h_limit_overrides, 0 },
    { "lease", h_limit_lease, 0 },
    { "delay", h_limit_delay, 0 },
    { NULL, NULL, 0 },
};

static int algo_from_name(const char *s, enum limiter_algo *out)
{
    for (int a = LIMITER_FIXED_WINDOW; a <= LIMITER_CONCURRENCY; a++) {
        if (!strcmp(s, limiter_algo_name((enum limiter_algo)a))) {
            *out = (enum limiter_algo)a;
            return 0;
        }
    }
    return -1;
}

/* Window algorithms: limit per window. */
static int limit_window_params(struct ctx *x, struct node *m, struct limit_src *ls,
                               const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    size_t old;
    int rc;
    if (ls->rate_k || ls->burst_k)
        return fail_bare(x, ls->rate_k ? ls->rate_k : ls->burst_k,
                         "'%s' does not apply to %s in %s (use limit and window)",
                         ls->rate_k ? "rate" : "burst", an, where(x));
    if (!ls->limit || !ls->window)
        return fail_bare(x, m, "missing required key '%s' in %s (%s needs limit and window)",
                         ls->limit ? "window" : "limit", where(x), an);
    old = path_push_key(x, "limit");
    rc = get_int(x, ls->limit, 1, CONF_MAX_COUNT, &lp->limit);
    path_pop(x, old);
    if (rc < 0)
        return -1;
    old = path_push_key(x, "window");
    rc = get_duration(x, ls->window, &lp->window_ms);
    path_pop(x, old);
    lp->interval_us = 0;
    return rc;
}

/* token_bucket, gcra: one token per interval_us, burst back to back. */
static int limit_bucket_params(struct ctx *x, struct node *m, struct limit_src *ls,
                               const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    char sb[SHOW_BUF];
    int64_t n = 0, period_ms = 0, burst = 0;
    size_t old;
    int rc;
    if (ls->limit_k || ls->window_k)
        return fail_bare(x, ls->limit_k ? ls->limit_k : ls->window_k,
                         "'%s' does not apply to %s in %s (use rate and burst)",
                         ls->limit_k ? "limit" : "window", an, where(x));
    if (!ls->rate || !ls->burst)
        return fail_bare(x, m, "missing required key '%s' in %s (%s needs rate and burst)",
                         ls->rate ? "burst" : "rate", where(x), an);
    old = path_push_key(x, "rate");
    if (conf_parse_rate(ls->rate->str, &n, &period_ms) < 0)
        rc = fail(x, ls->rate, "bad rate '%s' (use e.g. 10/s, 100/m, 5/h, 1000/d, 100/10s)",
                  show(ls->rate->str, sb));
    else if (period_ms > CONF_MAX_DURATION_MS)
        rc = fail(x, ls->rate, "rate '%s' is out of range (period at most 3650d)",
                  show(ls->rate->str, sb));
    else
        rc = 0;
    path_pop(x, old);
    if (rc < 0)
        return -1;
    old = path_push_key(x, "burst");
    rc = get_int(x, ls->burst, 1, CONF_MAX_COUNT, &burst);
    path_pop(x, old);
    if (rc < 0)
        return -1;
    lp->limit = burst;
    lp->interval_us = conf_rate_interval_us(n, period_ms);
    if (conf_bucket_window(lp) < 0)
        return fail(x, m, "rate and burst give a refill time beyond 3650d");
    return 0;
}

/* ---- overrides: [{ key: [VALUE, ...], limit: N | rate: R, burst: N }] */

/* One override's own keys, checked against the limit's algorithm. */
struct override_src {
    struct conf_limit *l;
    struct conf_override *o;
    struct node *key, *limit, *rate, *burst;
};

static int h_override_key(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct override_src *os = obj;
    char sb[SHOW_BUF];
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    os->key = v;
    if (v->nkids == 0)
        return fail(x, v, "needs one value per key source of the limit");
    os->o->parts = xcalloc((size_t)v->nkids, sizeof *os->o->parts);
    os->o->partlen = xcalloc((size_t)v->nkids, sizeof *os->o->partlen);
    os->o->nparts = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        const char *s = scalar(x, v->kids[i]);
        int rc = s ? 0 : -1;
        if (s && strlen(s) > CONF_MAX_PART)
            rc = fail(x, v->kids[i], "key value '%s' is longer than %d bytes", show(s, sb),
                      CONF_MAX_PART);
        path_pop(x, old);
        if (rc < 0)
            return -1;
        os->o->parts[i] = xstrdup(s);
        os->o->partlen[i] = strlen(s);
    }
    return 0;
}

static int h_override_limit(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->limit = v;
    return scalar(x, v) ? 0 : -1;
}

static int h_override_rate(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->rate = v;
    return scalar(x, v) ? 0 : -1;
}

static int h_override_burst(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    ((struct override_src *)obj)->burst = v;
    return scalar(x, v) ? 0 : -1;
}

static const struct key_def override_keys[] = {
    { "key", h_override_key, 1 },
    { "limit", h_override_limit, 0 },
    { "rate", h_override_rate, 0 },
    { "burst", h_override_burst, 0 },
    { NULL, NULL, 0 },
};

/* The limit's parameters with what the override changes. Window
 * algorithms take limit; token_bucket and gcra take rate and/or burst. */
static int override_params(struct ctx *x, struct node *m, struct override_src *os)
{
    struct limiter_params *p = &os->o->params;
    const char *an = limiter_algo_name(p->algo);
    char sb[SHOW_BUF];
    int bucket = p->algo == LIMITER_TOKEN_BUCKET || p->algo == LIMITER_GCRA;
    size_t old;
    int rc = 0;
    if (bucket && os->limit)
        return fail_bare(x, os->limit, "'limit' does not apply to %s in %s (use rate and/or "
                         "burst)", an, where(x));
    if (!bucket && (os->rate || os->burst))
        return fail_bare(x, os->rate ? os->rate : os->burst, "'%s' does not apply to %s in %s "
                         "(use limit)", os->rate ? "rate" : "burst", an, where(x));
    if (!bucket) {
        if (!os->limit)
            return fail_bare(x, m, "missing required key 'limit' in %s", where(x));
        old = path_push_key(x, "limit");
        rc = get_int(x, os->limit, 1, CONF_MAX_COUNT, &p->limit);
        path_pop(x, old);
        return rc;
    }
    if (!os->rate && !os->burst)
        return fail_bare(x, m, "missing required key 'rate' or 'burst' in %s", where(x));
    if (os->burst) {
        old = path_push_key(x, "burst");
        rc = get_int(x, os->burst, 1, CONF_MAX_COUNT, &p->limit);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    if (os->rate) {
        int64_t n = 0, period_ms = 0;
        old = path_push_key(x, "rate");
        if (conf_parse_rate(os->rate->str, &n, &period_ms) < 0 ||
            period_ms > CONF_MAX_DURATION_MS)
            rc = fail(x, os->rate, "bad rate '%s' (use e.g. 10/s, 100/m, 5/h, 1000/d, 100/10s)",
                      show(os->rate->str, sb));
        path_pop(x, old);
        if (rc < 0)
            return -1;
        p->interval_us = conf_rate_interval_us(n, period_ms);
    }
    if (conf_bucket_window(p) < 0)
        return fail(x, m, "rate and burst give a refill time beyond 3650d");
    return 0;
}

static int overrides_load(struct ctx *x, struct node *v, struct conf_limit *l)
{
    if (v->nkids > CONF_MAX_OVERRIDES)
        return fail(x, v, "at most %d overrides per limit, got %d", CONF_MAX_OVERRIDES,
                    v->nkids);
    l->overrides = xcalloc((size_t)v->nkids, sizeof *l->overrides);
    l->noverrides = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        struct override_src os = { .l = l, .o = &l->overrides[i] };
        size_t old = path_push(x, "[%d]", i);
        int rc = walk_map(x, v->kids[i], override_keys, &os);
        os.o->params = l->params;
        if (rc == 0 && os.o->nparts != l->nkeys) {
            size_t o2 = path_push_key(x, "key");
            rc = fail(x, os.key, "has %d value%s, the limit's key has %d part%s", os.o->nparts,
                      os.o->nparts == 1 ? "" : "s", l->nkeys, l->nkeys == 1 ? "" : "s");
            path_pop(x, o2);
        }
        if (rc == 0)
            rc = override_params(x, v->kids[i], &os);
        for (int j = 0; rc == 0 && j < i; j++)
            if (l->overrides[j].nparts == os.o->nparts) {
                int same = 1;
                for (int p = 0; same && p < os.o->nparts; p++)
                    same = !strcmp(l->overrides[j].parts[p], os.o->parts[p]);
                if (same)
                    rc = fail(x, v->kids[i], "the same key as overrides[%d]", j);
            }
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* lease (concurrency) and delay (token_bucket, gcra) apply to their own
 * algorithms only, and neither to a limit that does not consume when it
 * decides (count_status) or never rejects (shadow: delay). */
static int limit_shaping_keys(struct ctx *x, struct limit_src *ls, const char *an)
{
    enum limiter_algo a = ls->l->params.algo;
    if (ls->lease_k && a != LIMITER_CONCURRENCY)
        return fail_bare(x, ls->lease_k, "'lease' does not apply to %s in %s (only to "
                         "concurrency)", an, where(x));
    if (ls->delay_k && a != LIMITER_TOKEN_BUCKET && a != LIMITER_GCRA)
        return fail_bare(x, ls->delay_k, "'delay' does not apply to %s in %s (only to "
                         "token_bucket and gcra)", an, where(x));
    if (ls->delay_k && ls->l->shadow)
        return fail_bare(x, ls->delay_k, "'delay' does not apply to a shadow limit in %s",
                         where(x));
    if ((ls->delay_k || a == LIMITER_CONCURRENCY) && ls->l->has_count_status)
        return fail_bare(x, ls->delay_k ? ls->delay_k : ls->algorithm,
                         "%s does not combine with count_status in %s",
                         ls->delay_k ? "'delay'" : "concurrency", where(x));
    if (ls->delay) {
        size_t old = path_push_key(x, "delay");
        int rc = get_duration(x, ls->delay, &ls->l->params.delay_ms);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* concurrency: limit slots per key, each held at most lease without news
 * (0 here: the route's upstream timeout + 10 s, set in phase 3). */
static int limit_concurrency_params(struct ctx *x, struct node *m, struct limit_src *ls,
                                    const char *an)
{
    struct limiter_params *lp = &ls->l->params;
    struct node *extra = ls->window_k ? ls->window_k : ls->rate_k ? ls->rate_k : ls->burst_k;
    size_t old;
    int rc;
    if (extra)
        return fail_bare(x, extra, "'%s' does not apply to %s in %s (use limit and lease)",
                         extra->str, an, where(x));
    if (!ls->limit)
        return fail_bare(x, m, "missing required key 'limit' in %s (%s needs limit)",
                         where(x), an);
    old = path_push_key(x, "limit");
    rc = get_int(x, ls->limit, 1, CONF_MAX_COUNT, &lp->limit);
    path_pop(x, old);
    if (rc < 0)
        return -1;
    lp->window_ms = lp->interval_us = 0;
    if (ls->lease) {
        old = path_push_key(x, "lease");
        rc = get_duration(x, ls->lease, &lp->window_ms);
        path_pop(x, old);
    }
    return rc;
}

static int limit_load(struct ctx *x, struct node *m, struct conf_limit *l)
{
    struct limit_src ls = { .l = l };
    char sb[SHOW_BUF];
    const char *an;
    size_t old;
    l->status = 429;
    if (walk_map(x, m, limit_keys, &ls) < 0)
        return -1;
    an = ls.algorithm->str;
    if (algo_from_name(an, &l->params.algo) < 0) {
        old = path_push_key(x, "algorithm");
        fail(x, ls.algorithm, "unknown algorithm '%s' (use fixed_window, sliding_window, "
             "sliding_log, token_bucket, gcra or concurrency)", show(an, sb));
        path_pop(x, old);
        return -1;
    }
    if (limit_shaping_keys(x, &ls, an) < 0)
        return -1;
    int rc;
    if (l->params.algo == LIMITER_CONCURRENCY)
        rc = limit_concurrency_params(x, m, &ls, an);
    else if (l->params.algo == LIMITER_TOKEN_BUCKET || l->params.algo == LIMITER_GCRA)
        rc = limit_bucket_params(x, m, &ls, an);
    else
        rc = limit_window_params(x, m, &ls, an);
    if (rc < 0 || ls.overrides == NULL)
        return rc;
    old = path_push_key(x, "overrides");
    rc = overrides_load(x, ls.overrides, l);
    path_pop(x, old);
    return rc;
}

static int h_route_limits(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids > CONF_MAX_LIMITS)
        return fail(x, v, "at most %d limits per route, got %d", CONF_MAX_LIMITS, v->nkids);
    r->limits = xcalloc((size_t)v->nkids, sizeof *r->limits);
    r->nlimits = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        int rc = limit_load(x, v->kids[i], &r->limits[i]);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_route_allow(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    return get_cidrs(x, v, &r->allow, &r->nallow);
}

static int h_route_cost(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_int(x, v, 1, CONF_MAX_COST, &((struct conf_route *)obj)->cost);
}

static int h_route_headers(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "full", "ietf", "legacy", "none" };
    int i = 0;
    if (get_enum(x, v, names, 4, "full, ietf, legacy or none", &i) < 0)
        return -1;
    ((struct conf_route *)obj)->headers = (enum conf_headers)i;
    return 0;
}

/* upgrade: true (WebSocket only), false, or the list of protocols
 * tunnelled ([websocket, foo]); h2c is never one of them. */
static int h_route_upgrade(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_route *r = obj;
    char sb[SHOW_BUF];
    if (v->kind != NODE_SEQ)
        return get_bool(x, v, &r->upgrade);
    if (v->nkids == 0)
        return fail(x, v, "needs at least one protocol (or use true or false)");
    r->upgrade_protos = xcalloc((size_t)v->nkids, sizeof *r->upgrade_protos);
    r->nupgrade_protos = v->nkids;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        const char *s = scalar(x, v->kids[i]);
        int ok = s && is_token(s) && strlen(s) <= 64 && strchr(s, '/') == NULL &&
                 strcasecmp(s, "h2c") != 0;
        if (s && !ok)
            fail(x, v->kids[i], "bad upgrade protocol '%s' (a token without '/'; "
                 "h2c is never tunnelled)", show(s, sb));
        path_pop(x, old);
        if (!ok)
            return -1;
        r->upgrade_protos[i] = xstrdup(s);
    }
    r->upgrade = 1;
    return 0;
}

static const struct key_def route_keys[] = {
    { "name", h_route_name, 1 },
    { "match", h_route_match, 1 },
    { "upstream", h_route_upstream, 1 },
    { "limits", h_route_limits, 0 },
    { "allow", h_route_allow, 0 },
    { "cost", h_route_cost, 0 },
    { "headers", h_route_headers, 0 },
    { "upgrade", h_route_upgrade, 0 },
    { NULL, NULL, 0 },
};

static int h_routes(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf *c = obj;
    if (expect(x, v, NODE_SEQ) < 0)
        return -1;
    if (v->nkids == 0)
        return fail(x, v, "needs at least one route");
    c->routes = xcalloc((size_t)v->nkids, sizeof *c->routes);
    c->nroutes = v->nkids;
    x->routes = v;
    for (int i = 0; i < v->nkids; i++) {
        size_t old = path_push(x, "[%d]", i);
        int rc;
        c->routes[i].cost = 1;
        c->routes[i].headers = CONF_HEADERS_FULL;
        rc = walk_map(x, v->kids[i], route_keys, &c->routes[i]);
        path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int h_paths_case(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "sensitive", "insensitive" };
    int i = 0;
    if (get_enum(x, v, names, 2, "sensitive or insensitive", &i) < 0)
        return -1;
    ((struct conf_paths *)obj)->case_insensitive = i;
    return 0;
}

static int h_paths_matrix(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    static const char *const names[] = { "keep", "strip" };
    int i = 0;
    if (get_enum(x, v, names, 2, "keep or strip", &i) < 0)
        return -1;
    ((struct conf_paths *)obj)->strip_matrix = i;
    return 0;
}

static const struct key_def paths_keys[] = {
    { "case", h_paths_case, 0 },
    { "matrix_params", h_paths_matrix, 0 },
    { NULL, NULL, 0 },
};

static int h_paths(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return walk_map(x, v, paths_keys, &((struct conf *)obj)->paths);
}

/* route->metrics is not ours: runtime_bind_metrics() points it into its registry. */
static const struct key_def top_keys[] = {
    { "listen", h_listen, 1 },
    { "workers", h_workers, 0 },
    { "max_connections", h_max_connections, 0 },
    { "shutdown_timeout", h_shutdown_timeout, 0 },
    { "client", h_client, 0 },
    { "redis", h_redis, 0 },
    { "upstreams", h_upstreams, 1 },
    { "trusted_proxies", h_trusted, 0 },
    { "routes", h_routes, 1 },
    { "allow", h_allow, 0 },
    { "backend", h_backend, 0 },
    { "memory", h_memory, 0 },
    { "deny_cache", h_deny_cache, 0 },
    { "admin", h_admin, 0 },
    { "access_log", h_access_log, 0 },
    { "paths", h_paths, 0 },
    { NULL, NULL, 0 },
};

/* ---- phase 3: across keys */

static int check_route(struct ctx *x, int i)
{
    struct conf *c = x->c;
    struct conf_route *r = &c->routes[i];
    struct node *rn = x->routes->kids[i], *name = map_get(rn, "name");
    struct node *up = map_get(rn, "upstream"), *limits = map_get(rn, "limits");
    char sb[SHOW_BUF];
    size_t old = path_push(x, "routes[%d]", i), o2;
    int rc = 0;

    for (int j = 0; j < i && rc == 0; j++) {
        if (!strcmp(c->routes[j].name, r->name)) {
            struct node *first = map_get(x->routes->kids[j], "name");
            o2 = path_push(x, ".name");
            rc = fail(x, name, "duplicate route name '%s' (first at %d:%d)", r->name,
                      first->line, first->col);
            path_pop(x, o2);
        }
    }
    for (int j = 0; j < c->nupstreams && rc == 0 && !r->upstream; j++)
        if (!strcmp(c->upstreams[j].name, up->str))
            r->upstream = &c->upstreams[j];
    if (rc == 0 && !r->upstream) {
        o2 = path_push(x, ".upstream");
        rc = fail(x, up, "unknown upstream '%s'", show(up->str, sb));
        path_pop(x, o2);
    }
    /* concurrency without a lease: the upstream's timeout + 10 s */
    for (int a = 0; a < r->nlimits && rc == 0; a++)
        if (r->limits[a].params.algo == LIMITER_CONCURRENCY && r->limits[a].params.window_ms == 0)
            r->limits[a].params.window_ms = r->upstream->timeout_ms + 10000;
    for (int a = 0; a < r->nlimits && rc == 0; a++) {
        for (int b = 0; b < a && rc == 0; b++) {
            if (!strcmp(r->limits[a].name, r->limits[b].name)) {
                struct node *n = map_get(limits->kids[a], "name");
                struct node *first = map_get(limits->kids[b], "name");
                o2 = path_push(x, ".limits[%d].name", a);
                rc = fail(x, n, "duplicate limit name '%s' in this route (first at %d:%d)",
                          r->limits[a].name, first->line, first->col);
                path_pop(x, o2);
            }
        }
    }
    path_pop(x, old);
    return rc;
}

/* capture:N needs the route's path_regex to have at least N groups. */
static int check_captures(struct ctx *x, int i)
{
    const struct conf_route *r = &x->c->routes[i];
    struct node *limits = map_get(x->routes->kids[i], "limits");
    int rc = 0;
    for (int j = 0; j < r->nlimits && rc == 0; j++) {
        struct node *keys = map_get(limits->kids[j], "key");
        for (int k = 0; k < r->limits[j].nkeys && rc == 0; k++) {
            const struct conf_keysrc *ks = &r->limits[j].keys[k];
            size_t old;
            if (ks->kind != CONF_KEY_CAPTURE || ks->capture <= r->ncaptures)
                continue;
            old = path_push(x, "routes[%d].limits[%d].key[%d]", i, j, k);
            if (!r->regex)
                rc = fail(x, keys->kids[k], "capture:%d but the route has no path_regex",
                          ks->capture);
            else
                rc = fail(x, keys->kids[k], "capture:%d but path_regex has %d group%s",
                          ks->capture, r->ncaptures, r->ncaptures == 1 ? "" : "s");
            path_pop(x, old);
        }
    }
    return rc;
}

/* paths: a route that no request could meet after it. With matrix_params:
 * strip no path holds ';'; with case: insensitive every path is lower case,
 * so a path_regex letter in upper case would never match (one in an escape
 * such as \S or in a bracket expression such as [A-Za-z] may). */
static int check_paths(struct ctx *x, int i)
{
    const struct conf_route *r = &x->c->routes[i];
    struct node *match = map_get(x->routes->kids[i], "match");
    char sb[SHOW_BUF];
    size_t old;
    int rc = 0;
    if (x->c->paths.strip_matrix && r->path && strchr(r->path, ';')) {
        old = path_push(x, "routes[%d].match.path", i);
        rc = fail(x, map_get(match, "path"), "path '%s' has a ';', which "
                  "paths.matrix_params: strip takes out of every request path",
                  show(r->path, sb));
        path_pop(x, old);
        return rc;
    }
    if (!x->c->paths.case_insensitive || !r->path_regex)
        return 0;
    for (const char *p = r->path_regex; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            continue;
        }
        if (*p == '[') {
            const char *q = p + 1 + (p[1] == '^');
            q = strchr(*q == ']' ? q + 1 : q, ']');     /* "[]a]" holds a ']' */
            if (q == NULL)
                break;
            p = q;
            continue;
        }
        if (*p >= 'A' && *p <= 'Z') {
            old = path_push(x, "routes[%d].match.path_regex", i);
            rc = fail(x, map_get(match, "path_regex"), "path_regex '%s' has the upper-case "
                      "'%c', but paths.case: insensitive matches lower-cased paths",
                      show(r->path_regex, sb), *p);
            path_pop(x, old);
            return rc;
        }
    }
    return 0;
}

/* The admin endpoint must not share the public listener's address. */
static int check_admin(struct ctx *x, struct node *root)
{
    const struct conf *c = x->c;
    struct node *admin = map_get(root, "admin");
    size_t old;
    int same = 0;
    for (int i = 0; c->has_admin && i < c->nlistens; i++)
        same |= c->admin_listen.sslen == c->listens[i].addr.sslen &&
                !memcmp(&c->admin_listen.ss, &c->listens[i].addr.ss, c->admin_listen.sslen);
    if (!same)
        return 0;
    old = path_push(x, "admin.listen");
    fail(x, map_get(admin, "listen"), "same address as listen (the admin endpoint must "
         "not be on the public listener)");
    path_pop(x, old);
    return -1;
}

static int conf_from_tree(struct ctx *x, struct node *root)
{
    if (root->kind != NODE_MAP)
        return fail_bare(x, root, "top level: expected a mapping, got %s", kind_name(root->kind));
    if (walk_map(x, root, top_keys, x->c) < 0)
        return -1;
    for (int i = 0; i < x->c->nroutes; i++)
        if (check_route(x, i) < 0 || check_captures(x, i) < 0 || check_paths(x, i) < 0)
            return -1;
    if (check_admin(x, root) < 0)
        return -1;
    x->c->redis.overrides = x->c->admin_token != NULL;
    return 0;
}

/* ---- load, retain, release */

static struct conf *conf_new(const char *file)
{
    struct conf *c = xcalloc(1, sizeof *c);
    c->file = xstrdup(file);
    c->workers = 1;
    c->max_connections = 10000;
    c->shutdown_timeout_ms = 10000;
    c->client.max_header_bytes = 16384;
    c->client.max_body_bytes = 0;
    c->client.header_timeout_ms = 10000;
    c->client.idle_timeout_ms = 60000;
    c->client.body_timeout_ms = 60000;
    c->client.buffer_body_bytes = 65536;
    if (parse_redis_url("redis://127.0.0.1:6379/0", &c->redis) != NULL)
        abort();
    c->redis.url = xstrdup("redis://127.0.0.1:6379/0");
    c->redis.timeout_ms = 50;
    c->redis.prefix = xstrdup("sluice:");
    c->redis.on_error = CONF_ON_ERROR_ALLOW;
    c->redis.tls_conf.verify = 1;
    c->backend = CONF_BACKEND_REDIS;
    c->memory_max_keys = 1000000;
    c->deny_cache_max_keys = 100000;
    c->refs = 1;
    return c;
}

struct conf_cleanup {
    void (*fn)(void *arg);
    void *arg;
    struct conf_cleanup *next;
};

void conf_cleanup_add(struct conf *c, void (*fn)(void *arg), void *arg)
{
    struct conf_cleanup *cl = xmalloc(sizeof *cl);
    cl->fn = fn;
    cl->arg = arg;
    cl->next = c->cleanups;
    c->cleanups = cl;
}

static void conf_free(struct conf *c)
{
    while (c->cleanups) {
        struct conf_cleanup *cl = c->cleanups;
        c->cleanups = cl->next;
        cl->fn(cl->arg);
        free(cl);
    }
    free(c->file);
    free(c->listen.text);
    listens_free(c);
    redis_free_target(&c->redis);
    free(c->redis.prefix);
    for (int i = 0; i < c->redis.ncluster; i++)
        free(c->redis.cluster[i]);
    free(c->redis.cluster);
    for (int i = 0; i < c->redis.nsentinel_nodes; i++)
        free(c->redis.sentinel_nodes[i]);
    free(c->redis.sentinel_nodes);
    free(c->redis.sentinel_master);
    free(c->redis.sentinel_password);
    redis_free_tls(&c->redis.tls_conf);
    for (int i = 0; i < c->nupstreams; i++) {
        struct conf_upstream *u = &c->upstreams[i];
        for (int j = 0; j < u->nservers; j++)
            free(u->servers[j].text);
        free(u->servers);
        free(u->name);
        if (u->tls) {
            redis_free_tls(u->tls);     /* the same fields */
            free(u->tls);
        }
    }
    free(c->upstreams);
    for (int i = 0; i < c->nroutes; i++) {
        struct conf_route *r = &c->routes[i];
        for (int j = 0; j < r->nmethods; j++)
            free(r->methods[j]);
        free(r->methods);
        for (int j = 0; j < r->nupgrade_protos; j++)
            free(r->upgrade_protos[j]);
        free(r->upgrade_protos);
        for (int j = 0; j < r->nlimits; j++) {
            for (int k = 0; k < r->limits[j].nkeys; k++)
                free(r->limits[j].keys[k].arg);
            free(r->limits[j].keys);
            free(r->limits[j].name);
            free(r->limits[j].cost_header);
            free(r->limits[j].message);
            for (int k = 0; k < r->limits[j].noverrides; k++) {
                struct conf_override *o = &r->limits[j].overrides[k];
                for (int p = 0; p < o->nparts; p++)
                    free(o->parts[p]);
                free(o->parts);
                free(o->partlen);
                free(o->key);
            }
            free(r->limits[j].overrides);
        }
        free(r->limits);
        free(r->name);
        free(r->path);
        free(r->host);
        regex_free(r->regex);
        free(r->path_regex);
        free(r->allow);
    }
    free(c->routes);
    free(c->trusted);
    free(c->allow);
    free(c->admin_listen.text);
    free(c->admin_token);
    free(c->access_log);
    free(c);
}

/* The whole file, bounded in size; NULL with x->err set. */
static char *read_file(struct ctx *x, size_t *len)
{
    FILE *f = fopen(x->file, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    const char *why;
    if (!f) {
        why = strerror(errno);
        goto fail;
    }
    do {
        if (n == cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > CONF_MAX_FILE_BYTES + 1)
                cap = CONF_MAX_FILE_BYTES + 1;
            buf = realloc(buf, cap);
            if (!buf)
                abort();
        }
        n += fread(buf + n, 1, cap - n, f);
    } while (n == cap && n <= CONF_MAX_FILE_BYTES && !ferror(f));
    if (ferror(f)) {
        why = strerror(errno);
        goto fail;
    }
    if (n > CONF_MAX_FILE_BYTES) {
        why = "larger than 4 MiB";
        goto fail;
    }
    fclose(f);
    *len = n;
    return buf;
fail:
    if (f)
        fclose(f);
    free(buf);
    if (asprintf(&x->err, "%s: cannot read: %s", x->file, why) < 0)
        abort();
    return NULL;
}

struct conf *conf_load(const char *file, char **err)
{
    struct ctx x;
    struct node *root = NULL;
    char *buf;

    memset(&x, 0, sizeof x);
    x.file = file;
    if (err)
        *err = NULL;
    buf = read_file(&x, &x.len);
    if (buf) {
        x.buf = buf;
        x.c = conf_new(file);
        root = tree_load(&x);
        if (root)
            conf_from_tree(&x, root);
        node_free(root);
        free(buf);
    }
    if (x.err) {
        if (x.c)
            conf_free(x.c);
        if (err)
            *err = x.err;
        else
            free(x.err);
        return NULL;
    }
    return x.c;
}

void conf_retain(struct conf *c)
{
    __atomic_fetch_add(&c->refs, 1, __ATOMIC_RELAXED);
}

void conf_release(struct conf *c)
{
    if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        conf_free(c);
}
