/* sluice - jwtcache.c: verified tokens per worker (jwtcache.h).
 *
 * A kvtable (kvtable.h) with one LRU list, newest first. An entry's key is
 * the key set's id and the token's SHA-256; its claims buffer follows it
 * in the same allocation. */
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>

#include "jwtcache.h"
#include "kvtable.h"
#include "mem.h"

#define JWTCACHE_BUCKETS_MIN 64
#define JWTCACHE_KEY (8 + 32)           /* key set id, SHA-256 */

struct jc_entry {
    struct kvtable_entry kv;            /* first: the table's part */
    int64_t exp;                        /* the token's exp; INT64_MAX: none */
    size_t claims_len;
    char *claims;                       /* its own allocation */
};

struct jwtcache {
    size_t max_tokens;
    struct kvtable table;
    struct kvtable_key key;
    struct list lru;
    char scratch[JWT_MAX_CLAIMS];       /* a miss's claims, before they are kept */
};

struct jwtcache *jwtcache_create(size_t max_tokens)
{
    struct jwtcache *jc = mem_calloc(1, sizeof(*jc));
    jc->max_tokens = max_tokens;
    kvtable_init(&jc->table, JWTCACHE_BUCKETS_MIN);
    kvtable_key_init(&jc->key);
    return jc;
}

static void jc_remove(struct jwtcache *jc, struct kvtable_entry *e)
{
    kvtable_remove(&jc->table, e);
    list_unlink(&jc->lru, &e->lru);
    free(((struct jc_entry *)e)->claims);
    free(e);
}

void jwtcache_destroy(struct jwtcache *jc)
{
    if (jc == NULL)
        return;
    while (jc->lru.last != NULL)
        jc_remove(jc, kvtable_of(jc->lru.last));
    kvtable_fini(&jc->table);
    free(jc);
}

size_t jwtcache_size(const struct jwtcache *jc)
{
    return jc->table.count;
}

int jwtcache_verify(struct jwtcache *jc, const struct jwt_keys *keys,
                    const struct jwt_rules *rules, const char *token, size_t len,
                    int64_t now_s, const char **claims, size_t *claims_len, int *hit)
{
    char k[JWTCACHE_KEY];
    uint64_t id = jwt_keys_id(keys);
    int64_t exp;
    *hit = 0;
    if (len == 0 || len > JWT_MAX_TOKEN)
        return JWT_MALFORMED;
    memcpy(k, &id, 8);
    if (EVP_Digest(token, len, (unsigned char *)k + 8, NULL, EVP_sha256(), NULL) != 1)
        abort();                        /* out of memory, as mem.c */
    uint64_t h = kvtable_hash(&jc->key, k, sizeof k);
    struct jc_entry *e = (struct jc_entry *)kvtable_find(&jc->table, h, k, sizeof k);
    if (e != NULL) {
        if (e->exp != INT64_MAX && now_s >= e->exp + rules->leeway_s) {
            jc_remove(jc, &e->kv);
            return JWT_EXPIRED;
        }
        list_unlink(&jc->lru, &e->kv.lru);
        list_push(&jc->lru, &e->kv.lru);
        *claims = e->claims;
        *claims_len = e->claims_len;
        *hit = 1;
        return JWT_OK;
    }
    int st = jwt_verify(keys, rules, token, len, now_s, jc->scratch, claims_len, &exp);
    if (st != JWT_OK)
        return st;
    *claims = jc->scratch;
    if (jc->max_tokens == 0)
        return JWT_OK;
    if (jc->table.count >= jc->max_tokens)
        jc_remove(jc, kvtable_of(jc->lru.last));
    e = kvtable_add(&jc->table, sizeof(*e), h, k, sizeof k);
    e->exp = exp;
    e->claims_len = *claims_len;
    e->claims = mem_alloc(*claims_len);
    memcpy(e->claims, jc->scratch, *claims_len);
    list_push(&jc->lru, &e->kv.lru);
    *claims = e->claims;
    return JWT_OK;
}
