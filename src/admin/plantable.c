/* sluice - plantable.c: the run-time plan assignments (plantable.h).
 *
 * A chained hash table of at most PLANTABLE_MAX entries behind one rwlock:
 * every request of a route with plans reads it, the reset subscriber's
 * thread and the admin thread write it rarely. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mem.h"
#include "plantable.h"

#define PLANTABLE_BUCKETS 4096

struct plan_entry {
    struct plan_entry *next;
    size_t keylen;
    char plan[PLANTABLE_MAX_PLAN + 1];
    char key[];
};

static pthread_rwlock_t plan_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct plan_entry *plan_buckets[PLANTABLE_BUCKETS];
static size_t plan_count;

static size_t plan_hash(const char *key, size_t n)
{
    uint64_t h = 1469598103934665603ULL;           /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211ULL;
    return (size_t)(h % PLANTABLE_BUCKETS);
}

static struct plan_entry **plan_find(const char *key, size_t n)
{
    struct plan_entry **e = &plan_buckets[plan_hash(key, n)];
    while (*e != NULL && ((*e)->keylen != n || memcmp((*e)->key, key, n) != 0))
        e = &(*e)->next;
    return e;
}

int plantable_get(const char *key, size_t n, char *plan)
{
    int found = 0;
    pthread_rwlock_rdlock(&plan_lock);
    struct plan_entry *e = *plan_find(key, n);
    if (e != NULL) {
        memcpy(plan, e->plan, sizeof(e->plan));
        found = 1;
    }
    pthread_rwlock_unlock(&plan_lock);
    return found;
}

/* Under the write lock. */
static int plan_set_locked(const char *key, size_t n, const char *plan, size_t plen)
{
    if (n > PLANTABLE_MAX_KEY || plen == 0 || plen > PLANTABLE_MAX_PLAN)
        return -1;
    struct plan_entry **at = plan_find(key, n), *e = *at;
    if (e == NULL) {
        if (plan_count >= PLANTABLE_MAX)
            return -1;
        e = mem_calloc(1, sizeof(*e) + n);
        memcpy(e->key, key, n);
        e->keylen = n;
        *at = e;
        plan_count++;
    }
    memcpy(e->plan, plan, plen);
    e->plan[plen] = '\0';
    return 0;
}

static int plan_del_locked(const char *key, size_t n)
{
    struct plan_entry **at = plan_find(key, n), *e = *at;
    if (e == NULL)
        return 0;
    *at = e->next;
    free(e);
    plan_count--;
    return 1;
}

int plantable_set(const char *key, size_t n, const char *plan, size_t plen)
{
    pthread_rwlock_wrlock(&plan_lock);
    int rc = plan_set_locked(key, n, plan, plen);
    pthread_rwlock_unlock(&plan_lock);
    return rc;
}

int plantable_del(const char *key, size_t n)
{
    pthread_rwlock_wrlock(&plan_lock);
    int rc = plan_del_locked(key, n);
    pthread_rwlock_unlock(&plan_lock);
    return rc;
}

void plantable_message(const char *msg, size_t len)
{
    if (len >= 2 && msg[0] == 'D' && msg[1] == ' ') {
        plantable_del(msg + 2, len - 2);
        return;
    }
    const char *sp = len >= 2 && msg[0] == 'S' && msg[1] == ' '
                     ? memchr(msg + 2, ' ', len - 2) : NULL;
    if (sp == NULL || plantable_set(sp + 1, len - (size_t)(sp + 1 - msg), msg + 2,
                                    (size_t)(sp - msg - 2)) != 0)
        log_warn("plantable: message on the plans channel not applied (malformed, or "
                 "%d assignments already)", PLANTABLE_MAX);
}

void plantable_replace(int n, const char *const *s, const size_t *lens)
{
    int refused = 0;
    pthread_rwlock_wrlock(&plan_lock);
    for (size_t b = 0; b < PLANTABLE_BUCKETS; b++)
        while (plan_buckets[b] != NULL)
            plan_del_locked(plan_buckets[b]->key, plan_buckets[b]->keylen);
    for (int i = 0; i + 1 < n; i += 2)
        refused += plan_set_locked(s[i], lens[i], s[i + 1], lens[i + 1]) != 0;
    pthread_rwlock_unlock(&plan_lock);
    if (refused)
        log_warn("plantable: %d run-time plan assignment%s not applied (a key or plan name "
                 "too long, or more than %d)", refused, refused == 1 ? "" : "s", PLANTABLE_MAX);
}

size_t plantable_count(void)
{
    pthread_rwlock_rdlock(&plan_lock);
    size_t n = plan_count;
    pthread_rwlock_unlock(&plan_lock);
    return n;
}
