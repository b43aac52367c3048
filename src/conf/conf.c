/* sluice - conf.c: the ground of the config loader, under every other conf
 * file: the error reporting ("FILE:LINE:COL: key.path: message"), the key
 * path, the node kinds a handler expects and the phase 2 walker that every
 * section's key table runs on. It calls nothing above it: conf_value.c (the
 * value parsers) stands on it, conf_tls.c (the TLS client keys) on those, the
 * sections (conf_net.c, conf_redis.c, conf_limits.c) on those, and
 * conf_load.c (the load, the top-level table, phase 3, the refcount) on top.
 * conf.h is the public interface; what the conf files share is conf_int.h. */
#include "conf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_int.h"

/* ---- errors */

/* A value as it may appear in a message: bounded, no control bytes. */
const char *conf_show(const char *s, char *out)
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
int conf_fail(struct ctx *x, const struct node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, n->line, n->col, 1, fmt, ap);
    va_end(ap);
    return -1;
}

/* An error at node n whose message names the place itself. */
__attribute__((format(printf, 3, 4)))
int conf_fail_bare(struct ctx *x, const struct node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, n->line, n->col, 0, fmt, ap);
    va_end(ap);
    return -1;
}

__attribute__((format(printf, 4, 5)))
int conf_fail_mark(struct ctx *x, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(x, line, col, 0, fmt, ap);
    va_end(ap);
    return -1;
}

const char *conf_where(const struct ctx *x)
{
    return x->pathlen ? x->path : "top level";
}

/* ---- key path: "routes[1].limits[0].window" */

__attribute__((format(printf, 2, 3)))
size_t conf_path_push(struct ctx *x, const char *fmt, ...)
{
    size_t old = x->pathlen;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->path + old, sizeof x->path - old, fmt, ap);
    va_end(ap);
    x->pathlen = strlen(x->path);
    return old;
}

size_t conf_path_push_key(struct ctx *x, const char *key)
{
    return x->pathlen ? conf_path_push(x, ".%s", key) : conf_path_push(x, "%s", key);
}

void conf_path_pop(struct ctx *x, size_t old)
{
    x->pathlen = old;
    x->path[old] = '\0';
}

/* Remember node n at the current key path, for a check after parsing. */
void conf_mark_node(const struct ctx *x, const struct node *n, struct conf_mark *m)
{
    free(m->where);
    m->where = xstrdup(x->path);
    m->line = n->line;
    m->col = n->col;
}

/* ---- the kind of a node */

const char *conf_kind_name(enum node_kind k)
{
    switch (k) {
    case NODE_NULL: return "nothing";
    case NODE_SCALAR: return "a scalar";
    case NODE_SEQ: return "a sequence";
    case NODE_MAP: return "a mapping";
    }
    return "?";
}

int conf_expect(struct ctx *x, const struct node *n, enum node_kind k)
{
    if (n->kind != k)
        return conf_fail(x, n, "expected %s, got %s", conf_kind_name(k), conf_kind_name(n->kind));
    return 0;
}

/* ---- phase 2: the walker */

/* The key node of key in mapping m (for positions), or NULL. */
struct node *conf_map_key(const struct node *m, const char *key)
{
    if (!m || m->kind != NODE_MAP)
        return NULL;
    for (int i = 0; i + 1 < m->nkids; i += 2)
        if (!strcmp(m->kids[i]->str, key))
            return m->kids[i];
    return NULL;
}

struct node *conf_map_get(const struct node *m, const char *key)
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
int conf_walk_map(struct ctx *x, struct node *n, const struct key_def *defs, void *obj)
{
    char sb[SHOW_BUF];
    uint64_t seen = 0;          /* bit d: defs[d] met; tables stay under 64 keys */
    int i, d;
    if (conf_expect(x, n, NODE_MAP) < 0)
        return -1;
    for (i = 0; i + 1 < n->nkids; i += 2) {
        struct node *k = n->kids[i], *v = n->kids[i + 1];
        size_t old;
        int rc;
        for (d = 0; defs[d].name && strcmp(defs[d].name, k->str); d++)
            if (d >= 63)
                abort();
        if (!defs[d].name)
            return conf_fail_bare(x, k, "unknown key '%s' in %s", conf_show(k->str, sb),
                                  conf_where(x));
        if (seen & (1ULL << d))
            return conf_fail_bare(x, k, "duplicate key '%s' in %s", k->str, conf_where(x));
        seen |= 1ULL << d;
        old = conf_path_push_key(x, defs[d].name);
        rc = defs[d].fn(x, k, v, obj);
        conf_path_pop(x, old);
        if (rc < 0)
            return -1;
    }
    for (d = 0; defs[d].name; d++)
        if (defs[d].required && !(seen & (1ULL << d)))
            return conf_fail_bare(x, n, "missing required key '%s' in %s", defs[d].name,
                                  conf_where(x));
    return 0;
}
