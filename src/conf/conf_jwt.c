/* sluice - conf_jwt.c: the jwt section (how tokens are verified) and the
 * checks across keys it brings: jwt:CLAIM key sources and require_jwt
 * need it. The JWKS file itself is read by confcheck_load (jwt.h), at the
 * place recorded here. Above conf_value.c. */
#include <stdio.h>

#include "conf.h"
#include "conf_int.h"

#define CONF_MAX_JWT_TEXT 1024          /* issuer, audience bytes */
#define CONF_MAX_LEEWAY_MS (3600LL * 1000)
#define CONF_MIN_SECRET 32              /* jwt.h: JWT_MIN_SECRET */

/* A string of 1..max visible bytes into *out. */
static int get_text(struct ctx *x, struct node *v, size_t max, char **out)
{
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return conf_fail(x, v, "must be 1 to %zu bytes", max);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return conf_fail(x, v, "has a control byte");
    free(*out);
    *out = xstrdup(s);
    return 0;
}

static int h_jwt_jwks_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_jwt *j = obj;
    conf_mark_node(x, v, &j->jwks_at);
    return get_text(x, v, 4096, &j->jwks_file);
}

/* secret: the HS256 key as bytes (${VAR} keeps it out of the file). */
static int h_jwt_secret(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_jwt *j = obj;
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (strlen(s) < CONF_MIN_SECRET || strlen(s) > 4096)
        return conf_fail(x, v, "secret must be %d to 4096 bytes (HS256 takes a key at least "
                         "as long as its hash)", CONF_MIN_SECRET);
    free(j->secret);
    j->secret = xstrdup(s);
    j->secret_len = strlen(s);
    return 0;
}

static int h_jwt_issuer(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_text(x, v, CONF_MAX_JWT_TEXT, &((struct conf_jwt *)obj)->issuer);
}

static int h_jwt_audience(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return get_text(x, v, CONF_MAX_JWT_TEXT, &((struct conf_jwt *)obj)->audience);
}

static int h_jwt_leeway(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    int64_t ms;
    if (conf_get_duration(x, v, &ms) < 0)
        return -1;
    if (ms > CONF_MAX_LEEWAY_MS)
        return conf_fail(x, v, "leeway is at most 1h");
    ((struct conf_jwt *)obj)->leeway_s = ms / 1000;
    return 0;
}

static int h_jwt_cookie(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_jwt *j = obj;
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!conf_is_token(s) || strlen(s) > 256)
        return conf_fail(x, v, "bad cookie name '%s' (a token of 1 to 256 bytes)",
                         conf_show(s, sb));
    free(j->cookie);
    j->cookie = xstrdup(s);
    return 0;
}

static const struct key_def jwt_keys[] = {
    { "jwks_file", h_jwt_jwks_file, 0 },
    { "secret", h_jwt_secret, 0 },
    { "issuer", h_jwt_issuer, 0 },
    { "audience", h_jwt_audience, 0 },
    { "leeway", h_jwt_leeway, 0 },
    { "cookie", h_jwt_cookie, 0 },
    { NULL, NULL, 0 },
};

int conf_h_jwt(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_jwt *j = &((struct conf *)obj)->jwt;
    j->on = 1;
    j->leeway_s = 30;
    if (conf_walk_map(x, v, jwt_keys, j) < 0)
        return -1;
    if ((j->jwks_file == NULL) == (j->secret == NULL))
        return conf_fail(x, k, "give one of jwks_file and secret");
    return 0;
}

/* The first jwt:CLAIM key source of r's limits (rn: the route's or
 * plan's node): its node, with *lim and *key its place; NULL. */
static struct node *first_jwt_key(const struct conf_route *r, struct node *rn, int *lim,
                                  int *key)
{
    struct node *limits = conf_map_get(rn, "limits");
    for (int j = 0; j < r->nlimits; j++)
        for (int n = 0; n < r->limits[j].nkeys; n++)
            if (r->limits[j].keys[n].kind == CONF_KEY_JWT) {
                *lim = j;
                *key = n;
                return conf_map_get(limits->kids[j], "key")->kids[n];
            }
    return NULL;
}

static int need_jwt_section(struct ctx *x, struct node *at)
{
    if (x->c->jwt.on)
        return 0;
    return conf_fail(x, at, "tokens are verified only with a jwt section (jwks_file or secret)");
}

/* What reads tokens needs the jwt section: require_jwt, jwt:CLAIM key
 * sources (a plan's limits' too), plan_key or plan_from jwt:CLAIM. A
 * route's requests' tokens are verified (uses_jwt) when it reads them
 * itself or applies plans and some plan's limits do. */
int conf_check_jwt(struct ctx *x, struct node *root)
{
    struct conf *c = x->c;
    struct node *plans = conf_map_get(root, "plans");
    int plans_jwt = 0, j, n, rc = 0;
    for (int i = 0; i < c->nplans && rc == 0; i++) {
        struct node *at = first_jwt_key(&c->plans[i].route,
                                        conf_map_get(plans, c->plans[i].name), &j, &n);
        if (at == NULL)
            continue;
        plans_jwt = 1;
        size_t old = conf_path_push(x, "plans.%s.limits[%d].key[%d]", c->plans[i].name, j, n);
        rc = need_jwt_section(x, at);
        conf_path_pop(x, old);
    }
    for (int i = 0; i < c->nroutes && rc == 0; i++) {
        struct conf_route *r = &c->routes[i];
        struct node *rn = x->routes->kids[i], *at = NULL;
        size_t old = x->pathlen;
        if (r->require_jwt) {
            old = conf_path_push(x, "routes[%d].require_jwt", i);
            at = conf_map_get(rn, "require_jwt");
        } else if ((at = first_jwt_key(r, rn, &j, &n)) != NULL) {
            old = conf_path_push(x, "routes[%d].limits[%d].key[%d]", i, j, n);
        } else if (r->plan_key && r->plan_key->kind == CONF_KEY_JWT) {
            old = conf_path_push(x, "routes[%d].plan_key", i);
            at = conf_map_get(rn, "plan_key");
        } else if (r->plan_from && r->plan_from->kind == CONF_KEY_JWT) {
            old = conf_path_push(x, "routes[%d].plan_from", i);
            at = conf_map_get(rn, "plan_from");
        }
        r->uses_jwt = at != NULL || ((r->plan_key || r->plan_from) && plans_jwt);
        rc = at != NULL ? need_jwt_section(x, at) : 0;
        conf_path_pop(x, old);
    }
    return rc;
}

void conf_jwt_free(struct conf_jwt *j)
{
    free(j->jwks_file);
    free(j->jwks_at.where);
    if (j->secret)
        memset(j->secret, 0, j->secret_len);
    free(j->secret);
    free(j->issuer);
    free(j->audience);
    free(j->cookie);
}
