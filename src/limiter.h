/* sluice - limiter.h: the rate-limit algorithms' parameters and outcome.
 *
 * The same five algorithms exist twice: as Lua in scripts/limit.lua (run in
 * Redis, the default backend) and, later, as pure C here for the in-process
 * backend. Both read struct limiter_params and produce struct limiter_result
 * with the same meaning, so headers and Retry-After do not depend on where a
 * decision was made. All times are Redis/monotonic milliseconds. */
#ifndef SLUICE_LIMITER_H
#define SLUICE_LIMITER_H

#include <stdint.h>

enum limiter_algo {
    LIMITER_FIXED_WINDOW,
    LIMITER_SLIDING_WINDOW,
    LIMITER_SLIDING_LOG,
    LIMITER_TOKEN_BUCKET,
    LIMITER_GCRA,
};

struct limiter_params {
    enum limiter_algo algo;
    /* fixed_window, sliding_window, sliding_log: requests per window.
     * token_bucket, gcra: the burst (requests that may pass back to back). */
    int64_t limit;
    /* window algorithms: the window. token_bucket, gcra: the time to refill
     * a whole burst (limit * interval_us / 1000), used for the policy header. */
    int64_t window_ms;
    /* token_bucket, gcra: one token every interval_us microseconds
     * (rate N/DURATION gives DURATION/N, at least 1). 0 for window algorithms. */
    int64_t interval_us;
};

struct limiter_result {
    int allowed;            /* 1: this limit lets the request pass */
    int64_t limit;          /* the quota shown in headers (limit or burst) */
    int64_t remaining;      /* quota left after this request (0 when denied) */
    int64_t reset_ms;       /* until the quota is fully restored */
    int64_t retry_ms;       /* when denied: until a request would pass */
};

const char *limiter_algo_name(enum limiter_algo algo);

#endif
