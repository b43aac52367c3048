/* sluice - conf_tls.c: the keys of a TLS client block, which
 * upstreams.NAME.tls (conf_net.c) and redis.tls (conf_redis.c) share
 * (conf_tls_client_keys), and the check that a file the store loads when it
 * starts is readable now (conf_check_tls_file). Above conf_value.c and
 * conf.c, under the sections. */
#include "conf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_int.h"

/* ---- TLS as a client: upstreams.NAME.tls and redis.tls */

/* A file path for OpenSSL: not empty, bounded, no control bytes. */
static int get_tls_path(struct ctx *x, struct node *v, char **out)
{
    char sb[SHOW_BUF];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!*s)
        return conf_fail(x, v, "empty path");
    if (strlen(s) > PATH_MAX)
        return conf_fail(x, v, "path is longer than %d bytes", PATH_MAX);
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return conf_fail(x, v, "path '%s' has a control byte", conf_show(s, sb));
    free(*out);
    *out = xstrdup(s);
    return 0;
}

static int h_tls_ca_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    conf_mark_node(x, v, &((struct conf_tls_client *)obj)->ca_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->ca_file);
}

static int h_tls_cert_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    conf_mark_node(x, v, &((struct conf_tls_client *)obj)->cert_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->cert_file);
}

static int h_tls_key_file(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    conf_mark_node(x, v, &((struct conf_tls_client *)obj)->key_at);
    return get_tls_path(x, v, &((struct conf_tls_client *)obj)->key_file);
}

static int h_tls_verify(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    return conf_get_bool(x, v, &((struct conf_tls_client *)obj)->verify);
}

/* A DNS name (SNI and verified), or an IP address (verified, no SNI). */
static int h_tls_server_name(struct ctx *x, struct node *k, struct node *v, void *obj)
{
    struct conf_tls_client *t = obj;
    char sb[SHOW_BUF];
    unsigned char probe[sizeof(struct in6_addr)];
    const char *s = conf_scalar(x, v);
    if (!s)
        return -1;
    if (!conf_hostname_ok(s) && inet_pton(AF_INET, s, probe) != 1 &&
        inet_pton(AF_INET6, s, probe) != 1)
        return conf_fail(x, v, "bad server name '%s' (use a host name or an IP address)",
                         conf_show(s, sb));
    free(t->server_name);
    t->server_name = xstrdup(s);
    return 0;
}

const struct key_def conf_tls_client_keys[] = {
    { "ca_file", h_tls_ca_file, 0 },
    { "server_name", h_tls_server_name, 0 },
    { "verify", h_tls_verify, 0 },
    { "cert_file", h_tls_cert_file, 0 },
    { "key_file", h_tls_key_file, 0 },
    { NULL, NULL, 0 },
};

/* A file the store's TLS context loads when it starts (redis.tls.KEY):
 * readable now, or this file's error. */
int conf_check_tls_file(struct ctx *x, struct node *tls, const char *key, const char *path)
{
    char sb[SHOW_BUF];
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        fclose(f);
        return 0;
    }
    size_t old = conf_path_push(x, ".%s", key);
    conf_fail(x, conf_map_get(tls, key), "cannot read '%s': %s", conf_show(path, sb),
              strerror(errno));
    conf_path_pop(x, old);
    return -1;
}
