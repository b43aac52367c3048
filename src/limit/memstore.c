/* sluice - memstore.c: the in-process backend, a striped table of limiter states.
 *
 * Keys hash (kvtable.h: SipHash-2-4 with a random key, as they come from
 * clients) to one of up to 64 stripes, each a kvtable with its own mutex,
 * LRU lists and bound. A decision locks its stripes in ascending order (so
 * two never deadlock), runs limiter_check() on every limit and limiter_commit() on
 * the allowing ones only when the request passes, exactly as limit.lua does
 * in Redis, shadow and check-only limits (store.h) included.
 *
 * Each stripe keeps two LRU lists: keys whose state denies now ("held": a
 * denial's retry time, or a quota used up, is still ahead) and the others.
 * A full stripe evicts from the others first, so flooding a stripe with new
 * keys cannot evict a denied key and hand its client a fresh quota. */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvtable.h"
#include "limiter.h"
#include "mem.h"
#include "memstore.h"

#define MEMSTORE_STRIPES_MAX 64
#define MEMSTORE_BUCKETS_MIN 16
#define MEMSTORE_SWEEP 8            /* entries one decision examines per stripe */
#define MEMSTORE_SWEEP_FULL 64      /* ... when the stripe is nearly full */
#define MEMSTORE_LOG_MIN 4          /* first sliding_log ring, in entries */

struct mentry {
    struct kvtable_entry kv;                /* first; kv's list: open or held */
    int64_t held_until_us;                  /* denies until then: kept before others */
    uint64_t seen;                          /* stripe->decisions when last fetched */
    int held;                               /* on the held list */
    struct limiter_state st;                /* st.log is ours (mem_alloc) */
};

struct stripe {
    _Alignas(64) pthread_mutex_t lock;      /* one cache line per stripe head */
    struct kvtable table;
    size_t cap;
    struct list open;                       /* keys not denying now */
    struct list held;                       /* keys denying now: evicted last */
    uint64_t decisions;                     /* decisions that locked the stripe */
    size_t hand;                            /* the sweep's next bucket */
};

/* A run-time override (the admin API): a key's parameters until expire_us. */
struct moverride {
    struct kvtable_entry kv;                /* first */
    struct limiter_params params;
    int64_t expire_us;                      /* 0: until deleted */
};

struct memstore {
    unsigned nstripes;                      /* a power of two */
    struct kvtable_key key;                 /* one for all: the hash picks the stripe */
    struct stripe *stripes;
    pthread_mutex_t ovr_lock;               /* the overrides, apart from the stripes */
    struct kvtable ovr;
    struct list ovr_list;
    _Atomic size_t novr;                    /* read without the lock: none, no lookup */
};

/* ---- one stripe: a kvtable and two LRU lists, under its lock ------------- */

static struct list *lru_of(struct stripe *s, const struct mentry *e)
{
    return e->held ? &s->held : &s->open;
}

static void lru_unlink(struct stripe *s, struct mentry *e)
{
    list_unlink(lru_of(s, e), &e->kv.lru);
}

/* e becomes the newest of the list its hold puts it on at now_us. */
static void lru_push(struct stripe *s, struct mentry *e, int64_t now_us)
{
    e->held = e->held_until_us > now_us;
    list_push(lru_of(s, e), &e->kv.lru);
}

static void stripe_remove(struct stripe *s, struct mentry *e)
{
    kvtable_remove(&s->table, &e->kv);
    lru_unlink(s, e);
    free(e->st.log);
    free(e);
}

/* A held key whose hold has ended goes back to the open list. */
static void stripe_unhold(struct stripe *s, struct mentry *e, int64_t now_us)
{
    if (e->held && e->held_until_us <= now_us) {
        lru_unlink(s, e);
        lru_push(s, e, now_us);
    }
}

/* Reclaim expired keys and move keys whose hold has ended to the open
 * list: visit whole buckets from the sweep hand on until budget buckets and
 * entries were seen, so that over many decisions every key is looked at.
 * (Chains are short: the hash is keyed, load <= 1.) */
static void stripe_sweep(struct stripe *s, int64_t now_us, size_t budget)
{
    size_t seen = 0;
    while (seen < budget) {
        struct kvtable_entry **pp = kvtable_bucket(&s->table, s->hand);
        seen++;
        while (*pp) {
            struct mentry *e = (struct mentry *)*pp;
            seen++;
            /* stripe_remove() unlinks e through the one pointer that holds
             * it, which is *pp: the analyser cannot see that, and takes the
             * next e for the one just freed. */
            if (limiter_expired(&e->st, now_us)) {
                stripe_remove(s, e);    /* NOLINT(clang-analyzer-unix.Malloc): *pp is now the next one */
            } else {
                stripe_unhold(s, e, now_us);    /* NOLINT(clang-analyzer-unix.Malloc): as above */
                pp = &e->kv.hnext;
            }
        }
        s->hand = (s->hand + 1) & (s->table.nbuckets - 1);
    }
}

/* The key a full stripe gives up: the least recently used of those not
 * denying now, else (every key denies) the least recently used held one.
 * The caller has fetched fewer than STORE_MAX_LIMITS <= cap entries of this
 * stripe in this decision; each is the newest of its list when fetched and
 * carries seen == decisions, so the oldest of a list is one of them only
 * when the whole list is, and then the other list's oldest is not. */
static struct mentry *stripe_victim(struct stripe *s)
{
    struct mentry *e = (struct mentry *)kvtable_of(s->open.last);
    if (e == NULL || e->seen == s->decisions)
        e = (struct mentry *)kvtable_of(s->held.last);
    assert(e != NULL && e->seen != s->decisions);
    return e;
}

/* The entry of key, created absent when missing; it becomes the newest of
 * its list, marked as fetched by this decision. */
static struct mentry *stripe_get(struct stripe *s, const char *key, size_t len,
                                 uint64_t hash, int64_t now_us)
{
    struct mentry *e = (struct mentry *)kvtable_find(&s->table, hash, key, len);
    if (e == NULL) {
        if (s->table.count >= s->cap)
            stripe_remove(s, stripe_victim(s));
        e = kvtable_add(&s->table, sizeof(*e), hash, key, len);
        e->held_until_us = 0;
        e->held = 0;
        limiter_state_init(&e->st, NULL, 0);
    } else {
        lru_unlink(s, e);
    }
    e->seen = s->decisions;
    lru_push(s, e, now_us);
    return e;
}

/* e's state denies a request until until_us: keep it on the held list. */
static void entry_hold(struct stripe *s, struct mentry *e, int64_t until_us, int64_t now_us)
{
    if (until_us <= e->held_until_us)
        return;
    e->held_until_us = until_us;
    if (!e->held && until_us > now_us) {
        lru_unlink(s, e);
        lru_push(s, e, now_us);
    }
}

/* sliding_log: limiter_commit() needs one free ring entry. */
static void entry_log_room(struct mentry *e)
{
    if (e->st.log_len < e->st.log_cap)
        return;
    uint32_t cap = e->st.log_cap ? e->st.log_cap * 2 : MEMSTORE_LOG_MIN;
    struct limiter_log_entry *old = e->st.log;
    limiter_log_move(&e->st, mem_alloc(cap * sizeof(*old)), cap);
    free(old);
}

/* ---- the store --------------------------------------------------------------- */

struct memstore *memstore_create(size_t max_keys)
{
    struct memstore *m = mem_calloc(1, sizeof(*m));
    if (max_keys < STORE_MAX_LIMITS)
        max_keys = STORE_MAX_LIMITS;
    /* as many stripes as keep each able to hold a whole decision's keys */
    m->nstripes = MEMSTORE_STRIPES_MAX;
    while (m->nstripes > 1 && max_keys / m->nstripes < STORE_MAX_LIMITS)
        m->nstripes /= 2;
    kvtable_key_init(&m->key);
    m->stripes = mem_calloc(m->nstripes, sizeof(*m->stripes));
    for (unsigned i = 0; i < m->nstripes; i++) {
        struct stripe *s = &m->stripes[i];
        if (pthread_mutex_init(&s->lock, NULL) != 0)
            abort();
        s->cap = max_keys / m->nstripes;
        kvtable_init(&s->table, MEMSTORE_BUCKETS_MIN);
    }
    if (pthread_mutex_init(&m->ovr_lock, NULL) != 0)
        abort();
    kvtable_init(&m->ovr, MEMSTORE_BUCKETS_MIN);
    return m;
}

void memstore_destroy(struct memstore *m)
{
    if (m == NULL)
        return;
    for (unsigned i = 0; i < m->nstripes; i++) {
        struct stripe *s = &m->stripes[i];
        while (s->open.last)
            stripe_remove(s, (struct mentry *)kvtable_of(s->open.last));
        while (s->held.last)
            stripe_remove(s, (struct mentry *)kvtable_of(s->held.last));
        kvtable_fini(&s->table);
        pthread_mutex_destroy(&s->lock);
    }
    free(m->stripes);
    while (m->ovr_list.last) {
        struct kvtable_entry *e = kvtable_of(m->ovr_list.last);
        list_unlink(&m->ovr_list, &e->lru);
        free(e);
    }
    kvtable_fini(&m->ovr);
    pthread_mutex_destroy(&m->ovr_lock);
    free(m);
}

size_t memstore_count(struct memstore *m)
{
    size_t n = 0;
    for (unsigned i = 0; i < m->nstripes; i++) {
        pthread_mutex_lock(&m->stripes[i].lock);
        n += m->stripes[i].table.count;
        pthread_mutex_unlock(&m->stripes[i].lock);
    }
    return n;
}

static int memstore_valid(const struct store_limit *limits, int n)
{
    if (n < 1 || n > STORE_MAX_LIMITS)
        return -1;
    for (int i = 0; i < n; i++)
        if (limits[i].params == NULL || limits[i].key == NULL ||
            (limits[i].flags & ~(STORE_SHADOW | STORE_CHECK_ONLY)) != 0 ||
            limiter_valid(limits[i].params, limits[i].cost) != 0)
            return -1;
    return 0;
}

static unsigned stripe_of(const struct memstore *m, uint64_t hash)
{
    return (unsigned)(hash >> 40) & (m->nstripes - 1);
}

/* The distinct stripes of a decision, ascending: the locking order. */
static int memstore_stripes(const struct memstore *m, const uint64_t *hash, int n,
                            unsigned *order)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        unsigned s = stripe_of(m, hash[i]);
        int j = k;
        while (j > 0 && order[j - 1] > s)
            j--;
        if (j > 0 && order[j - 1] == s)
            continue;
        memmove(&order[j + 1], &order[j], (size_t)(k - j) * sizeof(*order));
        order[j] = s;
        k++;
    }
    return k;
}

/* Whether limit i writes its key: the request passes, it allows, and it is
 * not check-only. A key named by several writing limits is written once, by
 * the last: the Lua's last write wins, computed from the same state. */
static int memstore_writes(const struct store_limit *l, const struct store_result *res,
                           int all_ok, int i)
{
    return all_ok && res->r[i].allowed && !(l[i].flags & STORE_CHECK_ONLY);
}

/* now_us + ms, saturating. */
static int64_t memstore_after(int64_t now_us, int64_t ms)
{
    if (ms <= 0)
        return now_us;
    if (ms > (INT64_MAX - (now_us > 0 ? now_us : 0)) / 1000)
        return INT64_MAX;
    return now_us + ms * 1000;
}

/* A limit just used up its key's quota: when the next request (cost 1)
 * would be denied, the key holds until that one would pass. */
static void entry_hold_if_spent(struct stripe *s, struct mentry *e,
                                const struct limiter_params *p, int64_t now_us)
{
    struct limiter_result next;
    if (!limiter_check(&e->st, p, 1, now_us, &next))
        entry_hold(s, e, memstore_after(now_us, next.retry_ms), now_us);
}

/* Under the locks: phase 1 checks every limit, phase 2 consumes from the
 * allowing ones only when every limit that is not shadow allowed, and has
 * the others report their unconsumed state, as limit.lua's two phases. A
 * key that denies, or whose quota this request used up, is held. */
static int memstore_apply(struct memstore *m, const struct store_limit *limits, int n,
                          const uint64_t *hash, int64_t now_us, struct store_result *res)
{
    struct mentry *e[STORE_MAX_LIMITS];
    struct stripe *es[STORE_MAX_LIMITS];
    int all_ok = 1;
    for (int i = 0; i < n; i++) {
        es[i] = &m->stripes[stripe_of(m, hash[i])];
        e[i] = stripe_get(es[i], limits[i].key, limits[i].keylen, hash[i], now_us);
        if (limiter_check(&e[i]->st, limits[i].params, limits[i].cost, now_us, &res->r[i]))
            continue;
        entry_hold(es[i], e[i], memstore_after(now_us, res->r[i].retry_ms), now_us);
        if (!(limits[i].flags & STORE_SHADOW))
            all_ok = 0;
    }
    /* unconsumed views first: they read the state as phase 1 saw it */
    for (int i = 0; i < n; i++)
        if (res->r[i].allowed && !memstore_writes(limits, res, all_ok, i))
            limiter_unconsumed(&e[i]->st, limits[i].params, now_us, &res->r[i]);
    for (int i = 0; i < n; i++) {
        int later = 0;
        if (!memstore_writes(limits, res, all_ok, i))
            continue;
        for (int j = i + 1; j < n && !later; j++)
            later = e[j] == e[i] && memstore_writes(limits, res, all_ok, j);
        if (later)
            continue;
        if (limits[i].params->algo == LIMITER_SLIDING_LOG ||
            limits[i].params->algo == LIMITER_CONCURRENCY)
            entry_log_room(e[i]);
        if (limits[i].params->algo == LIMITER_CONCURRENCY)
            limiter_slot_take(&e[i]->st, limits[i].params, limits[i].slot, now_us);
        else
            limiter_commit(&e[i]->st, limits[i].params, limits[i].cost, now_us);
        if (res->r[i].remaining == 0)
            entry_hold_if_spent(es[i], e[i], limits[i].params, now_us);
    }
    return all_ok;
}

int memstore_decide(struct memstore *m, const struct store_limit *limits, int n,
                    int64_t now_us, struct store_result *res)
{
    uint64_t hash[STORE_MAX_LIMITS];
    unsigned order[STORE_MAX_LIMITS];

    res->n = 0;
    res->allowed = 0;
    if (memstore_valid(limits, n) != 0) {
        res->status = STORE_ERROR;
        return -1;
    }
    struct store_limit ol[STORE_MAX_LIMITS];
    struct limiter_params op[STORE_MAX_LIMITS];
    if (atomic_load(&m->novr) > 0) {        /* run-time overrides go first */
        for (int i = 0; i < n; i++) {
            ol[i] = limits[i];
            if (memstore_override_get(m, limits[i].key, limits[i].keylen, now_us, &op[i],
                                      NULL) && op[i].algo == limits[i].params->algo)
                ol[i].params = &op[i];
        }
        limits = ol;
    }
    for (int i = 0; i < n; i++)
        hash[i] = kvtable_hash(&m->key, limits[i].key, limits[i].keylen);
    int k = memstore_stripes(m, hash, n, order);
    for (int i = 0; i < k; i++) {
        struct stripe *s = &m->stripes[order[i]];
        pthread_mutex_lock(&s->lock);
        s->decisions++;
        /* before any entry of this decision is fetched: the sweep frees */
        stripe_sweep(s, now_us, s->table.count + n >= s->cap ? MEMSTORE_SWEEP_FULL : MEMSTORE_SWEEP);
    }
    res->allowed = memstore_apply(m, limits, n, hash, now_us, res);
    for (int i = k - 1; i >= 0; i--)
        pthread_mutex_unlock(&m->stripes[order[i]].lock);
    for (int i = 0; i < n; i++)         /* as the store bounds Redis's replies */
        limiter_clamp(&res->r[i], limits[i].params, 0);
    res->status = STORE_OK;
    res->n = n;
    res->time_us = now_us;
    return 0;
}

/* ---- run-time overrides and resets (the admin API) ------------------------ */

int memstore_override_set(struct memstore *m, const char *key, size_t len,
                          const struct limiter_params *p, int64_t expire_us)
{
    uint64_t h = kvtable_hash(&m->key, key, len);
    int rc = 0;
    pthread_mutex_lock(&m->ovr_lock);
    struct moverride *o = (struct moverride *)kvtable_find(&m->ovr, h, key, len);
    if (o == NULL && m->ovr.count >= MEMSTORE_MAX_OVERRIDES) {
        rc = -1;
    } else {
        if (o == NULL) {
            o = kvtable_add(&m->ovr, sizeof(*o), h, key, len);
            list_push(&m->ovr_list, &o->kv.lru);
        }
        o->params = *p;
        o->expire_us = expire_us;
        atomic_store(&m->novr, m->ovr.count);
    }
    pthread_mutex_unlock(&m->ovr_lock);
    return rc;
}

static void override_remove(struct memstore *m, struct moverride *o)
{
    kvtable_remove(&m->ovr, &o->kv);
    list_unlink(&m->ovr_list, &o->kv.lru);
    free(o);
    atomic_store(&m->novr, m->ovr.count);
}

int memstore_override_get(struct memstore *m, const char *key, size_t len, int64_t now_us,
                          struct limiter_params *p, int64_t *expire_us)
{
    uint64_t h = kvtable_hash(&m->key, key, len);
    int found = 0;
    pthread_mutex_lock(&m->ovr_lock);
    struct moverride *o = (struct moverride *)kvtable_find(&m->ovr, h, key, len);
    if (o != NULL && o->expire_us != 0 && o->expire_us <= now_us) {
        override_remove(m, o);
        o = NULL;
    }
    if (o != NULL) {
        *p = o->params;
        if (expire_us)
            *expire_us = o->expire_us;
        found = 1;
    }
    pthread_mutex_unlock(&m->ovr_lock);
    return found;
}

int memstore_override_del(struct memstore *m, const char *key, size_t len)
{
    uint64_t h = kvtable_hash(&m->key, key, len);
    pthread_mutex_lock(&m->ovr_lock);
    struct moverride *o = (struct moverride *)kvtable_find(&m->ovr, h, key, len);
    if (o != NULL)
        override_remove(m, o);
    pthread_mutex_unlock(&m->ovr_lock);
    return o != NULL;
}

int memstore_reset(struct memstore *m, const char *key, size_t len)
{
    uint64_t h = kvtable_hash(&m->key, key, len);
    struct stripe *s = &m->stripes[stripe_of(m, h)];
    pthread_mutex_lock(&s->lock);
    struct mentry *e = (struct mentry *)kvtable_find(&s->table, h, key, len);
    if (e != NULL)
        stripe_remove(s, e);
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

/* ---- concurrency slots and delay refunds ------------------------------------ */

enum memstore_verb { MEMSTORE_RELEASE, MEMSTORE_RENEW, MEMSTORE_REFUND };

/* One verb on one key, under its stripe's lock. A release or a refund of a
 * key that is gone creates nothing. */
static int memstore_verb(struct memstore *m, const struct store_limit *l, int64_t now_us,
                         enum memstore_verb verb)
{
    int rc = 0;
    if (l->params == NULL || limiter_valid(l->params, 1) != 0)
        return 0;
    uint64_t hash = kvtable_hash(&m->key, l->key, l->keylen);
    struct stripe *s = &m->stripes[stripe_of(m, hash)];
    pthread_mutex_lock(&s->lock);
    struct mentry *e = (struct mentry *)kvtable_find(&s->table, hash, l->key, l->keylen);
    if (verb == MEMSTORE_RENEW) {
        s->decisions++;
        e = stripe_get(s, l->key, l->keylen, hash, now_us);
        entry_log_room(e);
        rc = limiter_slot_renew(&e->st, l->params, l->slot, now_us);
    } else if (e != NULL && verb == MEMSTORE_RELEASE) {
        rc = limiter_slot_give(&e->st, l->slot);
    } else if (e != NULL || (verb == MEMSTORE_REFUND && l->cost < 0)) {
        if (e == NULL)          /* a charge on an absent (full) bucket or TAT */
            e = stripe_get(s, l->key, l->keylen, hash, now_us);
        rc = limiter_refund(&e->st, l->params, l->cost, l->slot, now_us);
        if (rc && l->cost < 0)
            entry_hold_if_spent(s, e, l->params, now_us);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void memstore_release(struct memstore *m, const struct store_limit *l, int64_t now_us)
{
    memstore_verb(m, l, now_us, MEMSTORE_RELEASE);
}

int memstore_renew(struct memstore *m, const struct store_limit *l, int64_t now_us)
{
    return memstore_verb(m, l, now_us, MEMSTORE_RENEW);
}

void memstore_refund(struct memstore *m, const struct store_limit *l, int64_t now_us)
{
    memstore_verb(m, l, now_us, MEMSTORE_REFUND);
}
