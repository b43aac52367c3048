/* sluice - kvtable.c: the hash chains and LRU lists of kvtable.h.
 *
 * SipHash-2-4 with a random key (getrandom, else a clock-based fallback), chained buckets that double at load 1; the
 * entries' LRU links are list.h's. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "kvtable.h"
#include "mem.h"

static uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIPROUND do { \
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32); \
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2; \
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0; \
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32); \
    } while (0)

uint64_t kvtable_hash(const struct kvtable_key *k, const char *key, size_t len)
{
    const unsigned char *p = (const unsigned char *)key;
    uint64_t v0 = 0x736f6d6570736575ULL ^ k->k0, v1 = 0x646f72616e646f6dULL ^ k->k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k->k0, v3 = 0x7465646279746573ULL ^ k->k1;
    uint64_t b = (uint64_t)len << 56;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; j--)
            w = (w << 8) | p[i + j];
        v3 ^= w;
        SIPROUND; SIPROUND;
        v0 ^= w;
    }
    for (int j = 0; i + j < len; j++)
        b |= (uint64_t)p[i + j] << (8 * j);
    v3 ^= b;
    SIPROUND; SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND; SIPROUND; SIPROUND; SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

void kvtable_key_init(struct kvtable_key *key)
{
    uint64_t k[2];
    if (getrandom(k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
        /* no entropy yet: a weaker key is still better than none */
        k[0] = (uint64_t)clock_us() ^ (uint64_t)(uintptr_t)key;
        k[1] = rotl(k[0], 17) ^ 0x9e3779b97f4a7c15ULL;
    }
    key->k0 = k[0];
    key->k1 = k[1];
}

void kvtable_init(struct kvtable *t, size_t nbuckets)
{
    memset(t, 0, sizeof(*t));
    t->nbuckets = nbuckets;
    t->buckets = mem_calloc(nbuckets, sizeof(*t->buckets));
}

void kvtable_fini(struct kvtable *t)
{
    free(t->buckets);
    t->buckets = NULL;
    t->nbuckets = 0;
}

struct kvtable_entry *kvtable_find(const struct kvtable *t, uint64_t hash,
                                   const char *key, size_t len)
{
    struct kvtable_entry *e = t->buckets[hash & (t->nbuckets - 1)];
    for (; e; e = e->hnext)
        if (e->hash == hash && e->keylen == len && memcmp(e->key, key, len) == 0)
            break;
    return e;
}

static void kvtable_grow(struct kvtable *t)
{
    size_t n = t->nbuckets * 2;
    struct kvtable_entry **b = mem_calloc(n, sizeof(*b));
    for (size_t i = 0; i < t->nbuckets; i++)
        for (struct kvtable_entry *e = t->buckets[i], *next; e; e = next) {
            next = e->hnext;
            e->hnext = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
}

void *kvtable_add(struct kvtable *t, size_t size, uint64_t hash, const char *key, size_t len)
{
    if (t->count >= t->nbuckets)
        kvtable_grow(t);
    char *mem = mem_alloc(size + len);
    struct kvtable_entry *e = (struct kvtable_entry *)(void *)mem;
    memcpy(mem + size, key, len);
    e->key = mem + size;
    e->keylen = len;
    e->hash = hash;
    e->lru.prev = e->lru.next = NULL;
    struct kvtable_entry **pp = kvtable_bucket(t, hash);
    e->hnext = *pp;
    *pp = e;
    t->count++;
    return mem;
}

void kvtable_remove(struct kvtable *t, struct kvtable_entry *e)
{
    struct kvtable_entry **pp = kvtable_bucket(t, e->hash);
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    t->count--;
}
