/* sluice - limiter.h: the rate-limit algorithms' parameters and outcome.
 *
 * The same six algorithms (five rate limits and concurrency) exist twice: as
 * Lua in scripts/limit.lua (run in Redis, the default backend) and as pure C
 * here (limiter.c) for the in-process backend. Both read struct limiter_params and produce struct limiter_result
 * with the same meaning, so headers and Retry-After do not depend on where a
 * decision was made. All times are Redis/monotonic milliseconds. */
#ifndef SLUICE_LIMITER_H
#define SLUICE_LIMITER_H

#include <stdint.h>

#include "tzcal.h"

enum limiter_algo {
    LIMITER_FIXED_WINDOW,
    LIMITER_SLIDING_WINDOW,
    LIMITER_SLIDING_LOG,
    LIMITER_TOKEN_BUCKET,
    LIMITER_GCRA,
    LIMITER_CONCURRENCY,    /* requests in flight per key (slots with a lease) */
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
    /* token_bucket, gcra: a request that would pass within delay_ms is
     * admitted now with its future slot reserved, and held that long
     * (r->retry_ms of an allowing limit). 0: off. concurrency: window_ms is
     * the lease (how long a slot stays taken without news), limit the
     * slots; interval_us is unused. */
    int64_t delay_ms;
    /* fixed_window with calendar: true: the window is the day, week, month
     * or year of zone tz holding now (window_ms is its nominal length, for
     * checks and the policy header); TZCAL_NONE: windows since the epoch.
     * The zone belongs to the config. */
    enum tzcal_unit cal;
    const struct tzcal *tz;
    /* cost_from: a settlement after the response may leave a key owing up
     * to one more limit (burst), so its times may run twice as long. */
    int settles;
};

struct limiter_result {
    int allowed;            /* 1: this limit lets the request pass */
    int64_t limit;          /* the quota shown in headers (limit or burst) */
    int64_t remaining;      /* quota left after this request (0 when denied) */
    int64_t reset_ms;       /* until the quota is fully restored */
    int64_t retry_ms;       /* when denied: until a request would pass;
                             * when allowed with a delay: the wait (0: none) */
};

const char *limiter_algo_name(enum limiter_algo algo);

/* What a result may carry, whoever produced it (limit.lua's reply can come
 * from a hostile Redis): both backends pass each result through
 * limiter_clamp() where it is produced, so no consumer checks numbers.
 * limit: p->limit, or with overridable (a run-time override may have
 * replaced it) 0..LIMITER_MAX_LIMIT; remaining: 0..limit; reset_ms and a
 * denial's retry_ms: 0..two windows (sliding_window's count decays over
 * the next one; a sliding_log entry from a clock gone back), the burst's
 * refill time plus the delay (token_bucket, gcra; with overridable, whose
 * interval an override may change, LIMITER_MAX_TIME_MS plus the delay),
 * the lease or 1 s (concurrency); an admission's retry_ms (its delay
 * wait): 0..p->delay_ms. */
#define LIMITER_MAX_LIMIT   1000000000LL                /* conf's and the admin API's bound */
#define LIMITER_MAX_TIME_MS (3650LL * 86400 * 1000)     /* the longest window or refill */
void limiter_clamp(struct limiter_result *r, const struct limiter_params *p, int overridable);

/* ---- The pure C algorithms (the in-process backend, memstore.c) ----------
 *
 * The exact arithmetic of scripts/limit.lua, on a clock the caller supplies
 * (microseconds), with no I/O, no allocation and no clock reads. A decision
 * is limiter_check() on every limit, then limiter_commit() on each only when
 * all allowed, else limiter_unconsumed() for the ones that allowed. */

/* sliding_log: n units admitted at ms (the Lua keeps one ZSET member per
 * unit, all scored ms; units of one millisecond are counted together). */
struct limiter_log_entry {
    int64_t ms;
    int64_t n;
};

/* One key's state: what the Redis key holds, plus its expiry. A state that
 * is unused, expired, or written by another algorithm reads as absent, as a
 * missing or wrong-typed key does in the Lua. */
struct limiter_state {
    int used;
    enum limiter_algo algo;
    int64_t expire_ms;          /* the key's PEXPIRE(AT): absent after it */
    union {
        struct { int64_t win, n; } fixed;                   /* window index, count */
        struct { int64_t win, cur, prev; } sliding;         /* window index, counts */
        struct { int64_t total; } log;                      /* units in the ring */
        struct { double tokens; int64_t last_us; } bucket;  /* fractional tokens */
        struct { int64_t tat_us; } gcra;                    /* theoretical arrival */
    } u;
    /* concurrency keeps its slots in the same caller-owned array, unsorted
     * from index 0 (log_head stays 0): ms = the slot's lease expiry, n = its
     * slot id. */
    /* sliding_log only: a ring of log_cap entries owned by the caller, sorted
     * by ms from log_head, log_len in use. Before limiter_commit() of a
     * sliding_log the caller makes sure log_len < log_cap (at most limit
     * entries are ever live after a commit). */
    struct limiter_log_entry *log;
    uint32_t log_cap, log_head, log_len;
};

/* An absent state; log/cap may be NULL/0 for the other algorithms. */
void limiter_state_init(struct limiter_state *s, struct limiter_log_entry *log,
                        uint32_t log_cap);
/* Moves the log into to[0..cap) (cap >= log_len); the caller frees the old. */
void limiter_log_move(struct limiter_state *s, struct limiter_log_entry *to,
                      uint32_t cap);

/* Decide one limit for cost units at now_us without changing s. Fills r as
 * the Lua reports it when the request is consumed (allowed) or denied here;
 * returns r->allowed. */
int limiter_check(const struct limiter_state *s, const struct limiter_params *p,
                  int64_t cost, int64_t now_us, struct limiter_result *r);
/* What a limit that allowed reports when another one denied: its state as
 * it is, nothing consumed, retry 0. */
void limiter_unconsumed(const struct limiter_state *s, const struct limiter_params *p,
                        int64_t now_us, struct limiter_result *r);
/* Consume cost units at now_us (only after limiter_check() allowed). */
void limiter_commit(struct limiter_state *s, const struct limiter_params *p,
                    int64_t cost, int64_t now_us);
/* 1 when s reads as absent at now_us, so its memory may be reclaimed. */
int limiter_expired(const struct limiter_state *s, int64_t now_us);
/* 0 when p is what the Lua accepts (limit >= 0; window >= 1 ms for window
 * algorithms, interval >= 1 us for the others) and cost >= 1, else -1. */
int limiter_valid(const struct limiter_params *p, int64_t cost);

/* ---- concurrency slots and delay refunds ---------------------------------
 *
 * A concurrency limit's check counts its live slots (limiter_check, as for
 * the others; the slot being asked for is a new one). The slot is then taken
 * with limiter_slot_take() instead of limiter_commit(); the caller makes sure
 * log_len < log_cap first. A slot lives until its lease ends (expiry <= now
 * in ms) unless renewed or given back. */
void limiter_slot_take(struct limiter_state *s, const struct limiter_params *p,
                       int64_t slot, int64_t now_us);
/* Renew slot's lease; a slot that is gone is taken again when one is free
 * (as limit.lua with the same slot id). Returns 1 when slot is held after. */
int limiter_slot_renew(struct limiter_state *s, const struct limiter_params *p,
                       int64_t slot, int64_t now_us);
/* Give slot back; 1 when it was held. */
int limiter_slot_give(struct limiter_state *s, int64_t slot);
/* Give back cost units a limit consumed, as scripts/refund.lua does: a
 * token_bucket or gcra reservation (a held request whose client went away),
 * or a cost_from settlement (any of the four rate algorithms but
 * sliding_log). A negative cost charges -cost more instead, which may leave
 * the key owing up to one more limit (burst). mark is limiter_mark() of the
 * admission. Returns 1 when applied. */
int limiter_refund(struct limiter_state *s, const struct limiter_params *p,
                   int64_t cost, int64_t mark, int64_t now_us);
/* The window an admission at now_us consumed from (refund.lua's mark):
 * fixed_window's index (a calendar window's start), sliding_window's
 * index; 0 for the others. */
int64_t limiter_mark(const struct limiter_params *p, int64_t now_us);

#endif
