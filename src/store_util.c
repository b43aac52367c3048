/* sluice - store_util.c: the store modules' smallest helpers, at the bottom of
 * them (store_node.c and store_sub.c build on these and on nothing above). */
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
