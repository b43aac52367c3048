/* sluice - clock.h: the clocks and the one ms-to-timeval, for every module.
 *
 * clock_ms: monotonic, coarse (timers, deny-cache expiry); clock_us:
 * monotonic, precise (latencies); clock_wall_us: wall clock (log lines and
 * the in-process limiter, which agree with Redis TIME across restarts). */
#ifndef SLUICE_CLOCK_H
#define SLUICE_CLOCK_H

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline int64_t clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t clock_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t clock_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A duration in ms (>= 0) as libevent wants it. */
static inline struct timeval clock_timeval(int64_t ms)
{
    struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000) };
    return tv;
}

#endif
