/* sluice - store_util.c: the store modules' smallest helpers, at the bottom of
 * them (store_node.c and store_sub.c build on these and on nothing above). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "log.h"
#include "mem.h"
#include "store.h"
#include "store_int.h"

char *store_strdup(const char *p)
{
    return p ? mem_strndup(p, strlen(p)) : NULL;
}

struct event *store_timer(struct store *s, event_callback_fn fn, void *arg)
{
    struct event *ev = evtimer_new(s->base, fn, arg);
    if (ev == NULL) {
        log_error("store: cannot create a timer");
        abort();
    }
    return ev;
}

/* A sentinel's "+switch-master" message ("NAME OLDIP OLDPORT NEWIP NEWPORT")
 * for master `name`: 0 and the new address, or -1 (the subscribe
 * confirmation, another master, or a malformed message). */
int store_switch_master(const redisReply *reply, const char *name, char *ip, size_t ipsz,
                        int *port)
{
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(reply->element[0]->str, "message") != 0 ||
        reply->element[2]->type != REDIS_REPLY_STRING)
        return -1;
    char got[256], oldip[64], oldport[16], newip[64], newport[16], *end;
    /* Counted fields; the new port is all digits and in range. */
    if (sscanf(reply->element[2]->str, "%255s %63s %15s %63s %15s",
               got, oldip, oldport, newip, newport) != 5 || strcmp(got, name) != 0)
        return -1;
    long p = strtol(newport, &end, 10);
    if (*end != '\0' || p < 1 || p > 65535 || strlen(newip) >= ipsz)
        return -1;
    memcpy(ip, newip, strlen(newip) + 1);
    *port = (int)p;
    return 0;
}
