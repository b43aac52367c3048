/* sluice - rls_match.c: an RLS descriptor against the configured tree, and
 * its Redis key (rls_match.h). */
#include <stdio.h>
#include <string.h>

#include "digest.h"
#include "rls_match.h"

const struct conf_rls_domain *rls_domain(const struct conf_rls *rls, const char *name)
{
    int lo = 0, hi = rls ? rls->ndomains - 1 : -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(rls->domains[mid].name, name);
        if (c == 0)
            return &rls->domains[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* The kid of p with key and value (value NULL: the one with no value),
 * found in p's sorted kids. */
static const struct conf_rls_node *kid_find(const struct conf_rls_node *p, const char *key,
                                            const char *value)
{
    int lo = 0, hi = p->nkids - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const struct conf_rls_node *k = &p->kids[mid];
        int c = strcmp(k->key, key);
        if (c == 0)
            c = !k->value || !value ? !value - !k->value : strcmp(k->value, value);
        if (c == 0)
            return k;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int rls_wildcard(char *const *parts, int nparts, const char *value)
{
    size_t vlen = strlen(value), first = strlen(parts[0]), last = strlen(parts[nparts - 1]);
    if (nparts == 1)
        return strcmp(parts[0], value) == 0;
    if (first + last > vlen || strncmp(value, parts[0], first) != 0 ||
        strcmp(value + vlen - last, parts[nparts - 1]) != 0)
        return 0;
    /* the middle parts in order, between the prefix and the suffix */
    const char *p = value + first, *end = value + vlen - last;
    for (int i = 1; i < nparts - 1; i++) {
        size_t n = strlen(parts[i]);
        const char *hit = n ? memmem(p, (size_t)(end - p), parts[i], n) : p;
        if (hit == NULL)
            return 0;
        p = hit + n;
    }
    return 1;
}

const struct conf_rls_node *rls_match(const struct conf_rls_domain *d, const struct rls_entry *e,
                                      int n, const char **share)
{
    const struct conf_rls_node *level = &d->root, *found = NULL;
    for (int i = 0; i < n; i++)
        share[i] = NULL;
    for (int i = 0; i < n; i++) {
        const struct conf_rls_node *next = kid_find(level, e[i].key, e[i].value);
        for (int w = 0; next == NULL && w < level->nwild; w++) {
            const struct conf_rls_node *k = &level->kids[level->wild[w]];
            if (strcmp(k->key, e[i].key) == 0 && rls_wildcard(k->parts, k->nparts, e[i].value)) {
                next = k;
                if (k->share_threshold)
                    share[i] = k->value;
            }
        }
        if (next == NULL)
            next = kid_find(level, e[i].key, NULL);
        if (next == NULL)
            return NULL;
        if (i == n - 1 && next->limit)
            found = next;
        if (next->nkids == 0)
            break;
        level = next;
    }
    return found;
}

static int named(const char *s, const char *name, size_t n)
{
    return s && strlen(s) == n && memcmp(s, name, n) == 0;
}

/* Depth-first from p (at depth): the chain to the limit called name. */
static int find_under(const struct conf_rls_node *p, int depth, const char *name, size_t n,
                      const struct conf_rls_node **chain)
{
    for (int i = 0; i < p->nkids && depth < RLS_MAX_ENTRIES; i++) {
        const struct conf_rls_node *k = &p->kids[i];
        chain[depth] = k;
        if (k->limit && (named(k->limit->name, name, n) || named(k->limit->path, name, n)))
            return depth + 1;
        int d = find_under(k, depth + 1, name, n, chain);
        if (d > 0)
            return d;
    }
    return 0;
}

int rls_find(const struct conf_rls_domain *d, const char *name, size_t n,
             const struct conf_rls_node **chain)
{
    return find_under(&d->root, 0, name, n, chain);
}

/* LEN:BYTES into out at *at when it fits (returns 0), else -1. */
static int put_part(char *out, size_t *at, const char *s, size_t n)
{
    char num[24];
    int k = snprintf(num, sizeof num, "%zu:", n);
    if (*at + (size_t)k + n + 1 >= RLS_MAX_KEY)
        return -1;
    memcpy(out + *at, num, (size_t)k);
    memcpy(out + *at + k, s, n);
    *at += (size_t)k + n;
    return 0;
}

size_t rls_key(const char *prefix, const char *domain, const struct rls_entry *e, int n,
               const char *const *share, char *out)
{
    size_t at = 0, plen = strlen(prefix);
    if (plen > RLS_MAX_KEY / 4)
        plen = RLS_MAX_KEY / 4;         /* redis.prefix is bounded far below */
    memcpy(out, prefix, plen);
    at = plen;
    memcpy(out + at, "{rls|", 5);
    at += 5;
    size_t start = at;
    int fits = put_part(out, &at, domain, strlen(domain)) == 0;
    for (int i = 0; fits && i < n; i++) {
        const char *v = share && share[i] ? share[i] : e[i].value;
        fits = put_part(out, &at, e[i].key, strlen(e[i].key)) == 0 &&
               put_part(out, &at, v, strlen(v)) == 0;
    }
    if (!fits) {
        /* too long: the same parts, hashed (a '#' never starts LEN:) */
        struct digest *dg = digest_sha1();
        char hex[DIGEST_SHA1_HEX + 1], num[24];
        const char *parts[1 + 2 * RLS_MAX_ENTRIES];
        int np = 0;
        parts[np++] = domain;
        for (int i = 0; i < n && i < RLS_MAX_ENTRIES; i++) {
            parts[np++] = e[i].key;
            parts[np++] = share && share[i] ? share[i] : e[i].value;
        }
        for (int i = 0; i < np; i++) {
            int k = snprintf(num, sizeof num, "%zu:", strlen(parts[i]));
            digest_update(dg, num, (size_t)k);
            digest_update(dg, parts[i], strlen(parts[i]));
        }
        digest_final_hex(dg, hex);
        at = start;
        out[at++] = '#';
        memcpy(out + at, hex, DIGEST_SHA1_HEX);
        at += DIGEST_SHA1_HEX;
    }
    out[at++] = '}';
    out[at] = '\0';
    return at;
}
