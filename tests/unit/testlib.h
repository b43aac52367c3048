/* sluice - tests/unit/testlib.h: what the unit tests that run a real
 * redis-server share (test_rconn.c, test_store.c, test_backend.c): a free
 * loopback port, the server started on it as a child that dies with the
 * test, and its end by PID. Linked into every unit test binary. */
#ifndef SLUICE_TESTLIB_H
#define SLUICE_TESTLIB_H

#include <sys/types.h>

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
