/* sluice - rls_match.h: which configured limit an RLS descriptor meets,
 * and the Redis key it counts under.
 *
 * Matching is envoyproxy/ratelimit's (src/config/config_impl.go GetLimit):
 * the entries walk the domain's tree one level each; at a level the entry
 * meets the descriptor with its key and value, else the first wildcard
 * value ('*': any run of bytes) that matches, in file order, else the one
 * with its key and no value. The walk stops where nothing matches or a
 * descriptor has no children; the limit is the one found at the last
 * entry, none otherwise. Pure: no I/O, no allocation. */
#ifndef SLUICE_RLS_MATCH_H
#define SLUICE_RLS_MATCH_H

#include <stddef.h>
#include "conf.h"

#define RLS_MAX_ENTRIES 32      /* per descriptor */

/* One entry of a descriptor (rls_wire.c decodes them from a call). */
struct rls_entry {
    const char *key, *value;            /* NUL-terminated */
};

/* The domain called name, or NULL. */
const struct conf_rls_domain *rls_domain(const struct conf_rls *rls, const char *name);

/* The descriptor of d that entries e[0..n) meet, with a rate_limit, or
 * NULL. share[i] is set for each entry met by a share_threshold wildcard:
 * its pattern, which the key then holds instead of the value (every value
 * it matches shares one counter); NULL otherwise. */
const struct conf_rls_node *rls_match(const struct conf_rls_domain *d, const struct rls_entry *e,
                                      int n, const char **share);

/* The limit of d called name[0..n) (its rate_limit.name, or its path:
 * "key_value.key2"), the first in the tree's order: the nodes from the
 * top down to it in chain[0..depth), depth returned; 0 when none has it.
 * For the admin API, which names a limit and the values of its entries. */
int rls_find(const struct conf_rls_domain *d, const char *name, size_t n,
             const struct conf_rls_node **chain);

/* 1 when value matches the wildcard parts (value split at '*'). */
int rls_wildcard(char *const *parts, int nparts, const char *value);

#define RLS_MAX_KEY 1024

/* The Redis key of a descriptor: prefix "{rls|" then the domain and each
 * entry's key and value (share[i] instead of the value when set), each as
 * LEN:BYTES, then "}"; entries longer than fit are replaced by "#" and
 * their SHA-1. out holds RLS_MAX_KEY bytes; returns the length. */
size_t rls_key(const char *prefix, const char *domain, const struct rls_entry *e, int n,
               const char *const *share, char *out);

#endif
