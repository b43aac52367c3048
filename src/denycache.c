/* sluice - denycache.c: a bounded LRU map from key to "denied until".
 *
 * Open hashing with chains (the table doubles up to max_keys) and one
 * intrusive LRU list; an entry is one allocation holding its key. Inserts
 * happen only on denials, lookups on every request of a limited route. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "denycache.h"
#include "mem.h"

struct dc_entry {
    struct dc_entry *hnext;             /* hash chain */
    struct dc_entry *lprev, *lnext;     /* LRU: head is most recent */
    uint64_t hash;
    int64_t until_ms;
    int64_t cost;                       /* denied at this cost or more */
    size_t len;
    char key[];
};

struct denycache {
    size_t max_keys;
    size_t count;
    size_t nbuckets;                    /* power of two */
    struct dc_entry **buckets;
    struct dc_entry *lru_head, *lru_tail;
    uint64_t seed;
};

/* FNV-1a: keys are built by sluice, but their parts come from clients, so a
 * per-cache seed keeps chains from being aimed at. */
static uint64_t dc_hash(const struct denycache *dc, const char *key, size_t len)
{
    uint64_t h = dc->seed;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

struct denycache *denycache_create(size_t max_keys)
{
    struct denycache *dc = mem_calloc(1, sizeof(*dc));
    dc->max_keys = max_keys;
    dc->nbuckets = 64;
    dc->buckets = mem_calloc(dc->nbuckets, sizeof(*dc->buckets));
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    dc->seed = 0xcbf29ce484222325ULL ^ ((uint64_t)(uintptr_t)dc * 0x9e3779b97f4a7c15ULL) ^
               (uint64_t)ts.tv_nsec;
    return dc;
}

void denycache_destroy(struct denycache *dc)
{
    if (dc == NULL)
        return;
    for (struct dc_entry *e = dc->lru_head, *next; e; e = next) {
        next = e->lnext;
        free(e);
    }
    free(dc->buckets);
    free(dc);
}

size_t denycache_size(const struct denycache *dc)
{
    return dc->count;
}

static void lru_unlink(struct denycache *dc, struct dc_entry *e)
{
    if (e->lprev)
        e->lprev->lnext = e->lnext;
    else
        dc->lru_head = e->lnext;
    if (e->lnext)
        e->lnext->lprev = e->lprev;
    else
        dc->lru_tail = e->lprev;
    e->lprev = e->lnext = NULL;
}

static void lru_push(struct denycache *dc, struct dc_entry *e)
{
    e->lnext = dc->lru_head;
    e->lprev = NULL;
    if (dc->lru_head)
        dc->lru_head->lprev = e;
    dc->lru_head = e;
    if (dc->lru_tail == NULL)
        dc->lru_tail = e;
}

static struct dc_entry **dc_slot(struct denycache *dc, uint64_t h, const char *key, size_t len)
{
    struct dc_entry **pp = &dc->buckets[h & (dc->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->hnext)
        if ((*pp)->hash == h && (*pp)->len == len && memcmp((*pp)->key, key, len) == 0)
            break;
    return pp;
}

static void dc_remove(struct denycache *dc, struct dc_entry *e)
{
    struct dc_entry **pp = dc_slot(dc, e->hash, e->key, e->len);
    *pp = e->hnext;
    lru_unlink(dc, e);
    dc->count--;
    free(e);
}

static void dc_grow(struct denycache *dc)
{
    size_t n = dc->nbuckets * 2;
    struct dc_entry **b = mem_calloc(n, sizeof(*b));
    for (size_t i = 0; i < dc->nbuckets; i++)
        for (struct dc_entry *e = dc->buckets[i], *next; e; e = next) {
            next = e->hnext;
            e->hnext = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    free(dc->buckets);
    dc->buckets = b;
    dc->nbuckets = n;
}

void denycache_put(struct denycache *dc, const char *key, size_t len, int64_t until_ms,
                   int64_t cost)
{
    if (dc->max_keys == 0)
        return;
    uint64_t h = dc_hash(dc, key, len);
    struct dc_entry **pp = dc_slot(dc, h, key, len);
    if (*pp) {
        /* Keep one fact that stays true: the cheaper denial, or the later
         * deadline for the same cost. */
        struct dc_entry *e = *pp;
        if (cost < e->cost || e->until_ms <= 0) {
            e->cost = cost;
            e->until_ms = until_ms;
        } else if (cost == e->cost && until_ms > e->until_ms) {
            e->until_ms = until_ms;
        }
        lru_unlink(dc, e);
        lru_push(dc, e);
        return;
    }
    if (dc->count >= dc->max_keys)
        dc_remove(dc, dc->lru_tail);
    if (dc->count >= dc->nbuckets)
        dc_grow(dc);
    struct dc_entry *e = mem_alloc(sizeof(*e) + len);
    e->hash = h;
    e->until_ms = until_ms;
    e->cost = cost;
    e->len = len;
    memcpy(e->key, key, len);
    pp = &dc->buckets[h & (dc->nbuckets - 1)];
    e->hnext = *pp;
    *pp = e;
    e->lprev = e->lnext = NULL;
    lru_push(dc, e);
    dc->count++;
}

int64_t denycache_get(struct denycache *dc, const char *key, size_t len, int64_t now_ms,
                      int64_t cost)
{
    if (dc->count == 0)
        return 0;
    uint64_t h = dc_hash(dc, key, len);
    struct dc_entry *e = *dc_slot(dc, h, key, len);
    if (e == NULL)
        return 0;
    if (e->until_ms <= now_ms) {
        dc_remove(dc, e);
        return 0;
    }
    if (cost < e->cost)
        return 0;
    lru_unlink(dc, e);
    lru_push(dc, e);
    return e->until_ms - now_ms;
}
