/* sluice - tests/unit/testlib.h: what the unit tests share. Those that run
 * a real redis-server (test_rconn.c, test_store.c, test_backend.c): a free
 * loopback port, the server started on it as a child that dies with the
 * test, and its end by PID; those that read what a writer produced: an
 * evbuffer as a string. Linked into every unit test binary. */
#ifndef SLUICE_TESTLIB_H
#define SLUICE_TESTLIB_H

#include <sys/types.h>

struct evbuffer;

/* All of b's bytes, removed from it, as a NUL-terminated string the caller
 * frees; b itself stays the caller's. A cmocka failure if they cannot be. */
char *testlib_drain(struct evbuffer *b);

/* A TCP port on 127.0.0.1 nothing listens on now; abort()s if none. */
int testlib_free_port(void);

/* Forks redis-server on 127.0.0.1:port, no persistence, output to
 * /dev/null, with the arguments in extra (NULL-terminated; extra NULL:
 * none) after those; returns its PID without waiting for it to answer (the
 * caller checks in its own way). abort()s when fork fails. */
pid_t testlib_redis_start(int port, const char *const *extra);

/* SIGKILL to pid and reaps it, waiting at most ~3 s; pid <= 0: nothing. */
void testlib_redis_stop(pid_t pid);

#endif
