/* sluice - resetbus.h: "forget what you denied", to every worker of every proxy.
 *
 * The admin API's reset and override writes change what a key's next
 * decision gives, so no worker may keep denying it from its deny cache.
 * One process-wide epoch counts such events; each worker's deny cache
 * empties itself when it sees the epoch move (denycache_sync). Writes made
 * here bump it directly (the memory backend: that is all); with Redis they
 * PUBLISH on PREFIX "reset", and every process's subscriber (a thread of
 * its own, started by resetbus_start) bumps its epoch on each message and
 * on each (re)subscription, since messages sent while it was down are lost. */
#ifndef SLUICE_RESETBUS_H
#define SLUICE_RESETBUS_H

#include <stdint.h>
#include "conf.h"

#define RESETBUS_CHANNEL "reset"    /* after redis.prefix */

struct resetbus;

/* The epoch now; thread-safe and cheap (an atomic load). */
uint64_t resetbus_epoch(void);
/* Something was reset in this process: every deny cache forgets. */
void resetbus_bump(void);

/* With backend redis and admin.token set (redis.overrides): a thread
 * subscribed to PREFIX "reset" on conf's Redis, and with plans: to PREFIX
 * "plans" too (plantable.h: the run-time plans, read whole first). NULL (nothing to run)
 * otherwise: the memory backend, or a proxy without the admin API's writes. */
struct resetbus *resetbus_start(const struct conf *conf);
/* A reload: started again when the Redis settings or prefix changed. */
struct resetbus *resetbus_reload(struct resetbus *rb, const struct conf *conf);
void resetbus_stop(struct resetbus *rb);

#endif
