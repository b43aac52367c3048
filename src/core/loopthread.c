/* sluice - loopthread.c: a thread running an event base of its own.
 *
 * Start and stop written once for the admin endpoint, the reset subscriber
 * and the access log's writer: a stop event activated from the stopping
 * thread runs the owner's on_stop on the loop, ends the loop, and the
 * stopping thread joins. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <event2/event.h>

#include "loopthread.h"
#include "mem.h"

struct loopthread {
    struct event_base *base;
    struct event *stop_ev;
    void (*on_stop)(void *arg);
    void *arg;
    pthread_t thread;
    int running;                /* started and not yet joined */
};

static void *loopthread_main(void *arg)
{
    struct loopthread *t = arg;
    event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY);    /* until stopped */
    return NULL;
}

static void loopthread_stop_cb(evutil_socket_t fd, short what, void *arg)
{
    struct loopthread *t = arg;
    if (t->on_stop)
        t->on_stop(t->arg);
    event_base_loopexit(t->base, NULL);
}

struct loopthread *loopthread_create(void (*on_stop)(void *arg), void *arg)
{
    struct loopthread *t = mem_calloc(1, sizeof(*t));
    t->on_stop = on_stop;
    t->arg = arg;
    t->base = event_base_new();
    if (t->base != NULL)
        t->stop_ev = event_new(t->base, -1, 0, loopthread_stop_cb, t);
    if (t->stop_ev == NULL) {
        loopthread_destroy(t);
        return NULL;
    }
    return t;
}

struct event_base *loopthread_base(const struct loopthread *t)
{
    return t->base;
}

int loopthread_start(struct loopthread *t)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&t->thread, NULL, loopthread_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    t->running = rc == 0;
    return rc;
}

void loopthread_stop(struct loopthread *t)
{
    if (t == NULL || !t->running)
        return;
    event_active(t->stop_ev, EV_TIMEOUT, 0);
    pthread_join(t->thread, NULL);
    t->running = 0;
}

void loopthread_destroy(struct loopthread *t)
{
    if (t == NULL)
        return;
    loopthread_stop(t);
    if (t->stop_ev)
        event_free(t->stop_ev);
    if (t->base)
        event_base_free(t->base);
    free(t);
}
