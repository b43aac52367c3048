/* sluice - tests/shim/slow_getaddrinfo.c: a slow resolver, by LD_PRELOAD.
 *
 * getaddrinfo() of a name (not a numeric address) sleeps SLOW_GETADDRINFO_MS
 * (default 2000) before the real lookup, as a resolver that times out would.
 * tests/integration/test_redis_conn.py builds it and runs sluice under it: a
 * loop that calls getaddrinfo stalls; one that uses evdns does not. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <time.h>

typedef int gai_fn(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    static gai_fn *real;
    unsigned char probe[16];
    if (real == NULL)
        real = (gai_fn *)dlsym(RTLD_NEXT, "getaddrinfo");
    if (node != NULL && inet_pton(AF_INET, node, probe) != 1 &&
        inet_pton(AF_INET6, node, probe) != 1) {
        const char *ms = getenv("SLOW_GETADDRINFO_MS");
        long v = ms ? strtol(ms, NULL, 10) : 2000;
        struct timespec ts = { v / 1000, (v % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    return real(node, service, hints, res);
}
