/* sluice - plantable.h: the clients' run-time plans, the same in every proxy.
 *
 * The admin API assigns a client (its plan_key value) a plan at run time:
 * HSET on the Redis hash PREFIX "plans" and, in the same script, PUBLISH on
 * the channel PREFIX "plans". Every process deciding in that Redis keeps a
 * copy of the hash here: its reset subscriber's thread (resetbus.c) reads
 * the hash whole (HGETALL) before each SUBSCRIBE and applies each message
 * after. Decisions read the copy, so a plan costs no Redis round trip. With
 * the memory backend the admin API writes here directly. Plans are kept by
 * name and looked up in the config that decides: an assignment to a plan a
 * reload removed is ignored. Thread-safe (a rwlock). */
#ifndef SLUICE_PLANTABLE_H
#define SLUICE_PLANTABLE_H

#include <stddef.h>

#define PLANTABLE_KEY "plans"       /* after redis.prefix: the hash and the channel */
#define PLANTABLE_MAX 32768         /* assignments (an HGETALL reply within rconn's bounds) */
#define PLANTABLE_MAX_KEY 256       /* bytes of a client key (ROUTE_MAX_PART) */
#define PLANTABLE_MAX_PLAN 64       /* bytes of a plan name (CONF_MAX_NAME) */

/* The plan assigned to key[0..n) into plan[PLANTABLE_MAX_PLAN + 1]: 1, or 0
 * (none). */
int plantable_get(const char *key, size_t n, char *plan);
/* 0, or -1 (table full, or a key or name too long). */
int plantable_set(const char *key, size_t n, const char *plan, size_t plen);
/* 1 when there was one. */
int plantable_del(const char *key, size_t n);
/* A message of the channel: "S PLAN KEY" (set) or "D KEY" (cleared). */
void plantable_message(const char *msg, size_t len);
/* The hash read whole: fields[0], values[0], fields[1]... (n strings)
 * replace every assignment. */
void plantable_replace(int n, const char *const *s, const size_t *lens);
size_t plantable_count(void);

#endif
