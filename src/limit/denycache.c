/* sluice - denycache.c: a bounded LRU map from key to "denied until".
 *
 * A kvtable (kvtable.h) with one LRU list, newest first; an entry is one
 * allocation holding its key. Inserts happen only on denials, lookups on
 * every request of a limited route. */
#include <stdlib.h>
#include <time.h>

#include "backend.h"
#include "denycache.h"
#include "kvtable.h"
#include "mem.h"

#define DENYCACHE_BUCKETS_MIN 64

struct dc_entry {
    struct kvtable_entry kv;            /* first: the table's part */
    int64_t until_ms;
    int64_t cost;                       /* denied at this cost or more */
    int64_t limit;                      /* the limit that denied (headers) */
};

struct denycache {
    size_t max_keys;
    struct kvtable table;
    struct kvtable_key key;
    struct list lru;
    uint64_t epoch;                     /* resetbus epoch last seen */
};

struct denycache *denycache_create(size_t max_keys)
{
    struct denycache *dc = mem_calloc(1, sizeof(*dc));
    dc->max_keys = max_keys;
    kvtable_init(&dc->table, DENYCACHE_BUCKETS_MIN);
    kvtable_key_init(&dc->key);
    return dc;
}

void denycache_destroy(struct denycache *dc)
{
    if (dc == NULL)
        return;
    for (struct kvtable_entry *e = kvtable_of(dc->lru.first), *next; e; e = next) {
        next = kvtable_of(e->lru.next);
        free(e);
    }
    kvtable_fini(&dc->table);
    free(dc);
}

size_t denycache_size(const struct denycache *dc)
{
    return dc->table.count;
}

static void dc_touch(struct denycache *dc, struct dc_entry *e)
{
    list_unlink(&dc->lru, &e->kv.lru);
    list_push(&dc->lru, &e->kv.lru);
}

static void dc_remove(struct denycache *dc, struct kvtable_entry *e)
{
    kvtable_remove(&dc->table, e);
    list_unlink(&dc->lru, &e->lru);
    free(e);
}

void denycache_put(struct denycache *dc, const char *key, size_t len, int64_t until_ms,
                   int64_t cost, int64_t limit)
{
    if (dc->max_keys == 0)
        return;
    uint64_t h = kvtable_hash(&dc->key, key, len);
    struct dc_entry *e = (struct dc_entry *)kvtable_find(&dc->table, h, key, len);
    if (e) {
        /* Keep one fact that stays true: the cheaper denial, or the later
         * deadline for the same cost. */
        if (cost < e->cost || e->until_ms <= 0) {
            e->cost = cost;
            e->until_ms = until_ms;
        } else if (cost == e->cost && until_ms > e->until_ms) {
            e->until_ms = until_ms;
        }
        e->limit = limit;           /* the newest denial's */
        dc_touch(dc, e);
        return;
    }
    if (dc->table.count >= dc->max_keys)
        dc_remove(dc, kvtable_of(dc->lru.last));
    e = kvtable_add(&dc->table, sizeof(*e), h, key, len);
    e->until_ms = until_ms;
    e->cost = cost;
    e->limit = limit;
    list_push(&dc->lru, &e->kv.lru);
}

int64_t denycache_get(struct denycache *dc, const char *key, size_t len, int64_t now_ms,
                      int64_t cost, int64_t *limit)
{
    if (dc->table.count == 0)
        return 0;
    uint64_t h = kvtable_hash(&dc->key, key, len);
    struct dc_entry *e = (struct dc_entry *)kvtable_find(&dc->table, h, key, len);
    if (e == NULL)
        return 0;
    if (e->until_ms <= now_ms) {
        dc_remove(dc, &e->kv);
        return 0;
    }
    if (cost < e->cost)
        return 0;
    dc_touch(dc, e);
    if (limit != NULL)
        *limit = e->limit;
    return e->until_ms - now_ms;
}

void denycache_sync(struct denycache *dc, uint64_t epoch)
{
    if (dc == NULL || dc->epoch == epoch)
        return;
    dc->epoch = epoch;
    while (dc->lru.last != NULL)
        dc_remove(dc, kvtable_of(dc->lru.last));
}

int denycache_check(struct denycache *dc, const struct store_limit *sl, int n, int64_t now_ms,
                    struct limiter_result *r)
{
    int64_t denied = 0;
    for (int i = 0; i < n; i++) {
        int64_t lim = 0;
        int64_t left = denycache_get(dc, sl[i].key, sl[i].keylen, now_ms, sl[i].cost, &lim);
        r[i].limit = left && lim > 0 ? lim : sl[i].params->limit;
        r[i].allowed = left == 0;
        r[i].remaining = left ? 0 : r[i].limit;
        r[i].reset_ms = r[i].retry_ms = left;
        denied |= left;
    }
    return denied != 0;
}

/* The cache is read with clock_ms (CLOCK_MONOTONIC_COARSE), which ticks
 * once a jiffy (1-10 ms): a check may see a time up to one tick old. */
int64_t denycache_tick_ms(void)
{
    struct timespec res;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0)
        return 10;
    int64_t ms = (int64_t)res.tv_sec * 1000 + (res.tv_nsec + 999999) / 1000000;
    return ms > 0 ? ms : 1;
}

void denycache_remember(struct denycache *dc, const struct store_limit *sl, int n,
                        const struct limiter_result *r, int64_t now_ms)
{
    /* Kept one tick short of the limit's own retry, and not kept when the
     * retry is within a tick: a check whose clock lags by a tick must not
     * refuse a request the limit itself would take by then. */
    int64_t tick = -1;
    for (int i = 0; i < n; i++)
        if (!r[i].allowed && r[i].retry_ms > 0 && !(sl[i].flags & STORE_SHADOW) &&
            sl[i].params->algo != LIMITER_CONCURRENCY) {
            if (tick < 0)
                tick = denycache_tick_ms();
            if (r[i].retry_ms > tick)
                denycache_put(dc, sl[i].key, sl[i].keylen, now_ms + r[i].retry_ms - tick,
                              sl[i].cost, r[i].limit);
        }
}
