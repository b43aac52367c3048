/* sluice - confcheck.c: a parsed config made ready to run (confcheck.h).
 *
 * The step between conf.c (the file's syntax and values) and the modules
 * that use a config: the checks and objects that need those modules, each
 * error reported at the place conf.c marked for it. On any error the conf
 * is released, and what was built for it goes with it (conf_cleanup_add). */
#include "confcheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "jwt.h"
#include "mem.h"
#include "route.h"
#include "tls_server.h"
#include "tls_upstream.h"

/* *err = "FILE:LINE:COL: WHERE: why", at mark m. */
static void blame(const struct conf *c, const struct conf_mark *m, const char *why, char **err)
{
    if (asprintf(err, "%s:%d:%d: %s: %s", c->file, m->line, m->col, m->where, why) < 0)
        abort();
}

/* Each upstream's TLS files can be used; else the error at the file's key
 * (or at the tls key, when OpenSSL's failure names no file). */
static int check_upstream_tls(const struct conf *c, char **err)
{
    for (int i = 0; i < c->nupstreams; i++) {
        const struct conf_tls_client *t = c->upstreams[i].tls;
        const struct conf_mark *at;
        const char *key = NULL;
        char buf[512];
        if (t == NULL || tls_upstream_check(t, buf, sizeof buf, &key) == NULL)
            continue;
        at = key == NULL                     ? &t->at
             : strcmp(key, "ca_file") == 0   ? &t->ca_at
             : strcmp(key, "cert_file") == 0 ? &t->cert_at
             : strcmp(key, "key_file") == 0  ? &t->key_at : &t->at;
        blame(c, at->where ? at : &t->at, buf, err);
        return -1;
    }
    return 0;
}

static void server_release(void *ts)
{
    tls_server_release(ts);
}

/* Each TLS listener's contexts, its certificates loaded and each key
 * checked against its certificate; released with c. */
static int build_listen_tls(struct conf *c, char **err)
{
    for (int i = 0; i < c->nlistens; i++) {
        struct conf_listen *l = &c->listens[i];
        int bad = 0;
        char *why = NULL;
        if (l->tls == NULL)
            continue;
        l->server = tls_server_create(l->tls, &bad, &why);
        if (l->server == NULL) {
            blame(c, &l->tls->certs[bad].at, why, err);
            free(why);
            return -1;
        }
        conf_cleanup_add(c, server_release, l->server);
    }
    return 0;
}

static void keys_release(void *keys)
{
    jwt_keys_free(keys);
}

/* The JWKS file, whole (bounded), into a new buffer; NULL with why set. */
static char *read_jwks(const char *path, size_t *len, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    size_t max = 1 << 20;
    char *buf = f ? mem_alloc(max + 1) : NULL;
    *len = f ? fread(buf, 1, max + 1, f) : 0;
    if (f == NULL || ferror(f) || *len > max) {
        snprintf(why, whylen, "cannot read '%s': %s", path,
                 f == NULL || ferror(f) ? strerror(errno) : "larger than 1 MiB");
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    return buf;
}

/* jwt: the key set from the JWKS file or the secret; released with c. A
 * file that cannot be read or used is an error at its jwks_file value. */
static int build_jwt_keys(struct conf *c, char **err)
{
    char why[512];
    size_t len;
    if (!c->jwt.on)
        return 0;
    if (c->jwt.secret) {
        c->jwt.keys = jwt_keys_secret(c->jwt.secret, c->jwt.secret_len);
    } else {
        char *json = read_jwks(c->jwt.jwks_file, &len, why, sizeof why);
        c->jwt.keys = json ? jwt_keys_jwks(json, len, why, sizeof why) : NULL;
        free(json);
        if (c->jwt.keys == NULL) {
            blame(c, &c->jwt.jwks_at, why, err);
            return -1;
        }
    }
    if (c->jwt.keys == NULL)
        abort();                        /* conf_jwt.c took only a long enough secret */
    conf_cleanup_add(c, keys_release, c->jwt.keys);
    return 0;
}

/* The Redis key of each override: the one route_key makes for a request
 * with those values (none when it would not fit: never matched). */
static void make_route_override_keys(struct conf *c, struct conf_route *r)
{
    char key[ROUTE_MAX_KEY];
    for (int j = 0; j < r->nlimits; j++) {
        struct conf_limit *l = &r->limits[j];
        for (int k = 0; k < l->noverrides; k++) {
            struct conf_override *o = &l->overrides[k];
            long n = route_key_parts(c, r, l, (const char *const *)o->parts, o->partlen,
                                     o->nparts, key);
            o->key = n > 0 ? mem_strndup(key, (size_t)n) : NULL;
            o->keylen = n > 0 ? (size_t)n : 0;
        }
    }
}

/* Every route's, and every plan's (keys of the plan's own). */
static void make_override_keys(struct conf *c)
{
    for (int i = 0; i < c->nroutes; i++)
        make_route_override_keys(c, &c->routes[i]);
    for (int i = 0; i < c->nplans; i++)
        make_route_override_keys(c, &c->plans[i].route);
}

struct conf *confcheck_load(const char *file, char **err)
{
    char *e = NULL;
    struct conf *c = conf_load(file, &e);
    if (c == NULL)
        goto fail;
    if (check_upstream_tls(c, &e) < 0 || build_listen_tls(c, &e) < 0 ||
        build_jwt_keys(c, &e) < 0)
        goto fail;
    make_override_keys(c);
    if (err)
        *err = NULL;
    return c;
fail:
    conf_release(c);
    if (err)
        *err = e;
    else
        free(e);
    return NULL;
}
