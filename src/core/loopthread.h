/* sluice - loopthread.h: a thread running an event base of its own.
 *
 * The admin endpoint, the reset subscriber and the access log's writer each
 * run one. The owner makes it, puts its events on loopthread_base(), starts
 * it, and later stops it from another thread; the thread blocks every
 * signal, so the process's handlers and SIGPIPE never run on it. Cross-thread
 * stop needs libevent's locking (evthread_use_pthreads) turned on before
 * loopthread_create. */
#ifndef SLUICE_LOOPTHREAD_H
#define SLUICE_LOOPTHREAD_H

struct event_base;
struct loopthread;

/* on_stop (may be NULL) runs on the thread when loopthread_stop asks it to
 * end, before the loop exits: the last work of the owner's events. NULL when
 * no event base could be made. */
struct loopthread *loopthread_create(void (*on_stop)(void *arg), void *arg);
struct event_base *loopthread_base(const struct loopthread *t);

/* 0, or pthread_create's error number. */
int loopthread_start(struct loopthread *t);

/* From any other thread: on_stop, the loop ends, the thread is joined. Does
 * nothing when it was never started or is stopped already. */
void loopthread_stop(struct loopthread *t);

/* Stops it if still running and frees the base; the owner frees the events
 * it put there first. NULL is ignored. */
void loopthread_destroy(struct loopthread *t);

#endif
