/* sluice - kvtable.h: one hash table of keyed entries with LRU lists.
 *
 * Shared by the deny cache and the memory store. Entries are intrusive: the
 * caller's struct starts with a struct kvtable_entry, and the key is copied
 * right after the caller's struct in the same allocation. The table chains
 * entries by hash (doubling to keep load <= 1); LRU lists are the caller's
 * (list.h, through each entry's lru link): it decides how many there are
 * and what they mean. No locking: the caller owns the table, its lists and
 * every entry, and frees an entry (free()) after kvtable_remove() and
 * list_unlink(). */
#ifndef SLUICE_KVTABLE_H
#define SLUICE_KVTABLE_H

#include <stddef.h>
#include <stdint.h>
#include "list.h"

struct kvtable_entry {
    struct kvtable_entry *hnext;            /* hash chain */
    struct list_link lru;                   /* on the caller's list, newest first */
    uint64_t hash;
    size_t keylen;
    const char *key;                        /* inside the entry's allocation */
};

struct kvtable {
    struct kvtable_entry **buckets;
    size_t nbuckets;                        /* a power of two */
    size_t count;
};

/* A random SipHash key: keys carry client bytes, so chains must not be
 * aimable. One per table, or one shared by tables a hash picks between. */
struct kvtable_key {
    uint64_t k0, k1;
};

/* nbuckets: the first size, a power of two; the table grows past it. */
void kvtable_init(struct kvtable *t, size_t nbuckets);
/* Frees the buckets only: the caller has removed and freed every entry. */
void kvtable_fini(struct kvtable *t);

void kvtable_key_init(struct kvtable_key *key);
/* SipHash-2-4 of key under k. */
uint64_t kvtable_hash(const struct kvtable_key *k, const char *key, size_t len);

/* The entry with this hash and key, or NULL. */
struct kvtable_entry *kvtable_find(const struct kvtable *t, uint64_t hash,
                                   const char *key, size_t len);

/* A new entry of size bytes (the caller's struct, starting with a struct
 * kvtable_entry) plus a copy of key, inserted into the chains, on no list;
 * the rest of the caller's struct is uninitialised. Never NULL. */
void *kvtable_add(struct kvtable *t, size_t size, uint64_t hash, const char *key, size_t len);

/* Takes e out of the chains (not off its list, not freed). */
void kvtable_remove(struct kvtable *t, struct kvtable_entry *e);

/* The chain heads, for a sweep: bucket i of kvtable.nbuckets. */
static inline struct kvtable_entry **kvtable_bucket(struct kvtable *t, size_t i)
{
    return &t->buckets[i & (t->nbuckets - 1)];
}

/* The entry whose lru link is l (a list's first or last), or NULL. */
static inline struct kvtable_entry *kvtable_of(struct list_link *l)
{
    return LIST_ITEM(l, struct kvtable_entry, lru);
}

#endif
