/* sluice - limiter.c: the six algorithms (five rate limits, concurrency) as pure C.
 *
 * The same arithmetic as scripts/limit.lua, step for step: integer ms and us,
 * floor and ceil in the same places, token_bucket in doubles evaluated in the
 * Lua's order, so both give identical answers on tests/unit/data/
 * limiter_cases.txt. No I/O, no allocation, no clock: the caller passes now_us
 * and owns the state (memstore.c keeps one per key). */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "limiter.h"

const char *limiter_algo_name(enum limiter_algo algo)
{
    switch (algo) {
    case LIMITER_FIXED_WINDOW: return "fixed_window";
    case LIMITER_SLIDING_WINDOW: return "sliding_window";
    case LIMITER_SLIDING_LOG: return "sliding_log";
    case LIMITER_TOKEN_BUCKET: return "token_bucket";
    case LIMITER_GCRA: return "gcra";
    case LIMITER_CONCURRENCY: return "concurrency";
    }
    return "unknown";
}

/* Beyond 2^53 the Lua's doubles stop being exact integers. */
#define LIMITER_EXACT_MAX ((int64_t)1 << 53)

/* One limit's decision, as the Lua's table d: what to report when consumed
 * (ok) or denied here (not ok), and rem0/reset0 for an allowing limit of a
 * denied request. */
struct decision {
    int ok;
    int64_t rem, reset, retry;
    int64_t rem0, reset0;
};

static int64_t div_floor(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if (a % b != 0 && (a < 0) != (b < 0))
        q--;
    return q;
}

static int64_t div_ceil(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if (a % b != 0 && (a < 0) == (b < 0))
        q++;
    return q;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t atleast1(int64_t x) { return x < 1 ? 1 : x; }
static double atleast1d(double x) { return x < 1 ? 1 : x; }

static int64_t now_ms_of(int64_t now_us) { return div_floor(now_us, 1000); }

int limiter_expired(const struct limiter_state *s, int64_t now_us)
{
    /* Redis drops a key once its clock is past the expiry (now > when). */
    return !s->used || now_ms_of(now_us) > s->expire_ms;
}

/* A state reads as the Lua would read its key: absent when never written,
 * expired, or written by another algorithm (a key of the wrong type). */
static int live(const struct limiter_state *s, const struct limiter_params *p,
                int64_t now_us)
{
    return s->algo == p->algo && !limiter_expired(s, now_us);
}

int limiter_valid(const struct limiter_params *p, int64_t cost)
{
    int64_t unit;
    if (p->limit < 0 || cost < 1 || cost > LIMITER_EXACT_MAX)
        return -1;
    switch (p->algo) {
    case LIMITER_FIXED_WINDOW:
    case LIMITER_SLIDING_WINDOW:
    case LIMITER_SLIDING_LOG:
    case LIMITER_CONCURRENCY:       /* window_ms: the lease */
        unit = p->window_ms;
        break;
    case LIMITER_TOKEN_BUCKET:
    case LIMITER_GCRA:
        unit = p->interval_us;
        break;
    default:
        return -1;
    }
    /* token_bucket and gcra multiply limit by interval_us in integers (the
     * refill time, at most 3650 days at load); the window algorithms never
     * multiply limit by window_ms in integers (sliding_window does it in
     * doubles, as the Lua), so 1e9 per 3650 days is fine for them */
    if (unit < 1 || unit > LIMITER_EXACT_MAX || p->limit > LIMITER_EXACT_MAX ||
        (unit == p->interval_us && p->limit > LIMITER_EXACT_MAX / unit))
        return -1;
    if (p->delay_ms < 0 || p->delay_ms > LIMITER_EXACT_MAX / 1000 ||
        (p->delay_ms > 0 && p->algo != LIMITER_TOKEN_BUCKET && p->algo != LIMITER_GCRA))
        return -1;
    return 0;
}

void limiter_state_init(struct limiter_state *s, struct limiter_log_entry *log,
                        uint32_t log_cap)
{
    memset(s, 0, sizeof(*s));
    s->log = log;
    s->log_cap = log_cap;
}

/* ---- sliding_log's ring, sorted by ms from log_head ------------------------ */

static struct limiter_log_entry *log_at(const struct limiter_state *s, uint32_t i)
{
    return &s->log[(s->log_head + i) % s->log_cap];
}

void limiter_log_move(struct limiter_state *s, struct limiter_log_entry *to,
                      uint32_t cap)
{
    assert(cap >= s->log_len);
    for (uint32_t i = 0; i < s->log_len; i++)
        to[i] = *log_at(s, i);
    s->log = to;
    s->log_cap = cap;
    s->log_head = 0;
}

/* Index of the first entry newer than thr_ms, and the units before it. */
static uint32_t log_first_live(const struct limiter_state *s, int64_t thr_ms,
                               int64_t *stale_units)
{
    uint32_t i = 0;
    *stale_units = 0;
    while (i < s->log_len && log_at(s, i)->ms <= thr_ms)
        *stale_units += log_at(s, i++)->n;
    return i;
}

/* The ms of the k-th oldest live unit (1-based), as ZRANGEBYSCORE LIMIT k-1 1. */
static int64_t log_kth(const struct limiter_state *s, uint32_t first, int64_t k)
{
    for (uint32_t i = first; i < s->log_len; i++) {
        k -= log_at(s, i)->n;
        if (k <= 0)
            return log_at(s, i)->ms;
    }
    abort();    /* callers ask only for k <= the live count */
}

/* ZREMRANGEBYSCORE -inf thr_ms, then ZADD cost members scored now_ms. */
static void log_add(struct limiter_state *s, int64_t thr_ms, int64_t now_ms, int64_t cost)
{
    int64_t stale;
    uint32_t drop = log_first_live(s, thr_ms, &stale);
    s->log_head = s->log_len ? (s->log_head + drop) % s->log_cap : 0;
    s->log_len -= drop;
    s->u.log.total -= stale;
    s->u.log.total += cost;

    uint32_t i = s->log_len;        /* insertion point: usually the end */
    while (i > 0 && log_at(s, i - 1)->ms > now_ms)
        i--;
    if (i > 0 && log_at(s, i - 1)->ms == now_ms) {
        log_at(s, i - 1)->n += cost;
        return;
    }
    assert(s->log_len < s->log_cap);    /* the caller grows the ring first */
    for (uint32_t j = s->log_len; j > i; j--)   /* a clock that went back */
        *log_at(s, j) = *log_at(s, j - 1);
    *log_at(s, i) = (struct limiter_log_entry){ now_ms, cost };
    s->log_len++;
}

/* ---- the algorithms: each mirrors its decide_* in limit.lua ---------------- */

/* fixed_window's window holding now_ms: [*start, *end) and its index (a
 * calendar window is known by its start). */
static int64_t fixed_window(const struct limiter_params *p, int64_t now_ms, int64_t *start,
                            int64_t *end)
{
    if (p->cal != TZCAL_NONE) {
        int64_t b[4];
        tzcal_bounds(p->tz, p->cal, now_ms, b);
        *start = b[1], *end = b[2];
        return b[1];
    }
    int64_t win = div_floor(now_ms, p->window_ms);
    *start = win * p->window_ms, *end = *start + p->window_ms;
    return win;
}

static void decide_fixed(const struct limiter_state *s, int is_live,
                         const struct limiter_params *p, int64_t c, int64_t now_us,
                         struct decision *d)
{
    int64_t L = p->limit, now_ms = now_ms_of(now_us), start, end;
    int64_t win = fixed_window(p, now_ms, &start, &end);
    int64_t n = is_live && s->u.fixed.win == win ? s->u.fixed.n : 0;
    int64_t reset = end - now_ms;
    d->ok = n + c <= L;
    d->reset = d->reset0 = reset;
    d->rem0 = max64(0, L - n);
    if (d->ok) {
        d->rem = L - n - c;
        d->retry = 0;
    } else {
        d->rem = 0;
        d->retry = c > L ? end - start : reset;
    }
}

/* The sliding window's stored counts as seen in the current window cur. */
static void sliding_counts(const struct limiter_state *s, int is_live, int64_t cur,
                           int64_t *cc, int64_t *pc)
{
    *cc = *pc = 0;
    if (!is_live)
        return;
    if (s->u.sliding.win >= cur) {          /* this window, or a clock gone back */
        *cc = s->u.sliding.cur;
        *pc = s->u.sliding.prev;
    } else if (s->u.sliding.win == cur - 1) {
        *pc = s->u.sliding.cur;
    }
}

/* sliding_window computes in doubles in the Lua's order: limit x window
 * reaches 1e9 x 3650 days (3e20 ms, beyond int64), and beyond 2^53 the Lua's
 * doubles round, so the C rounds the same way. Below 2^53 every value is an
 * exact integer either way. */
struct sliding {
    int64_t now_ms, cur, elapsed, pc;
    double L, W, LW, decay;
};

static int64_t sliding_remaining(const struct sliding *w, int64_t count)
{
    double rem = floor((w->LW - w->decay - (double)count * w->W) / w->W);
    return rem < 0 ? 0 : (int64_t)rem;
}

static int64_t sliding_reset(const struct sliding *w, int64_t count)
{
    int64_t W = (int64_t)w->W;
    if (count > 0)
        return (w->cur + 2) * W - w->now_ms;
    if (w->pc > 0)
        return (w->cur + 1) * W - w->now_ms;
    return 0;
}

/* When denied with c <= L: within this window once enough of the previous
 * count decayed, else in the next one, where today's count decays. */
static int64_t sliding_retry(const struct sliding *w, int64_t cc, int64_t c)
{
    double L = w->L, W = w->W, pc = (double)w->pc, ccd = (double)cc, cd = (double)c;
    if (cd > L)
        return (int64_t)W;
    if (w->pc > 0 && ccd + cd <= L) {
        double at = ceil(W * (pc + ccd + cd - L) / pc);
        if (at < W)
            return atleast1((int64_t)at - w->elapsed);
    }
    double e = 0;
    if (cc > 0) {
        e = ceil(W * (ccd + cd - L) / ccd);
        if (e < 0)
            e = 0;
    }
    return atleast1((int64_t)((double)((w->cur + 1) * (int64_t)W) + e - (double)w->now_ms));
}

static void decide_sliding(const struct limiter_state *s, int is_live,
                           const struct limiter_params *p, int64_t c, int64_t now_us,
                           struct decision *d)
{
    struct sliding w = { .now_ms = now_ms_of(now_us), .L = (double)p->limit,
                         .W = (double)p->window_ms };
    int64_t cc;
    w.LW = w.L * w.W;
    w.cur = div_floor(w.now_ms, p->window_ms);
    sliding_counts(s, is_live, w.cur, &cc, &w.pc);
    w.elapsed = w.now_ms - w.cur * p->window_ms;
    w.decay = (double)w.pc * (w.W - (double)w.elapsed);  /* the previous count's weight, times W */
    d->ok = (double)c <= w.L && w.decay + (double)(cc + c) * w.W <= w.LW;
    d->rem0 = sliding_remaining(&w, cc);
    d->reset0 = sliding_reset(&w, cc);
    if (d->ok) {
        d->rem = sliding_remaining(&w, cc + c);
        d->reset = sliding_reset(&w, cc + c);
        d->retry = 0;
    } else {
        d->rem = 0;
        d->reset = sliding_reset(&w, cc);
        d->retry = sliding_retry(&w, cc, c);
    }
}

/* Entries exactly W old are out: the live range is (now_ms - W, +inf). */
static void decide_log(const struct limiter_state *s, int is_live,
                       const struct limiter_params *p, int64_t c, int64_t now_us,
                       struct decision *d)
{
    int64_t L = p->limit, W = p->window_ms, now_ms = now_ms_of(now_us);
    int64_t count = 0, stale = 0;
    uint32_t first = 0;
    if (is_live) {
        first = log_first_live(s, now_ms - W, &stale);
        count = s->u.log.total - stale;
    }
    int64_t reset0 = 0;
    if (count > 0)
        reset0 = max64(0, log_at(s, s->log_len - 1)->ms + W - now_ms);
    d->ok = count + c <= L;
    d->rem0 = max64(0, L - count);
    d->reset0 = reset0;
    if (d->ok) {
        d->rem = L - count - c;
        d->reset = W;
        d->retry = 0;
    } else {
        d->rem = 0;
        d->reset = reset0;
        /* count + c - L oldest units must leave before c more fit */
        d->retry = c > L ? W : atleast1(log_kth(s, first, count + c - L) + W - now_ms);
    }
}

struct bucket {
    double B, I, tokens;
};

static double bucket_refill_ms(const struct bucket *b, double tk)
{
    return ceil((b->B - tk) * b->I / 1000);
}

static void bucket_tokens(const struct limiter_state *s, int is_live,
                          const struct limiter_params *p, int64_t now_us, struct bucket *b)
{
    b->B = (double)p->limit;
    b->I = (double)p->interval_us;
    b->tokens = b->B;                       /* a missing bucket is a full one */
    if (is_live) {
        int64_t elapsed = max64(0, now_us - s->u.bucket.last_us);
        double t = s->u.bucket.tokens + (double)elapsed / b->I;
        b->tokens = t < b->B ? t : b->B;
    }
}

static void decide_bucket(const struct limiter_state *s, int is_live,
                          const struct limiter_params *p, int64_t c, int64_t now_us,
                          struct decision *d)
{
    struct bucket b;
    bucket_tokens(s, is_live, p, now_us, &b);
    double cd = (double)c;
    double after = b.tokens - cd;
    /* delay: tokens may go negative, down to -delay/interval; the wait is
     * what the missing tokens take to refill (us) */
    double dd = (double)(p->delay_ms * 1000);
    double need = (cd - b.tokens) * b.I;
    d->ok = cd <= b.B && (b.tokens >= cd || need <= dd);
    d->rem0 = max64(0, (int64_t)floor(b.tokens));
    d->reset0 = (int64_t)bucket_refill_ms(&b, b.tokens);
    if (d->ok) {
        d->rem = max64(0, (int64_t)floor(after));
        d->reset = (int64_t)bucket_refill_ms(&b, after);
        d->retry = b.tokens >= cd ? 0 : (int64_t)atleast1d(ceil(need / 1000));
    } else {
        d->rem = 0;
        d->reset = d->reset0;
        if (cd > b.B)
            d->retry = (int64_t)atleast1d(ceil(b.B * b.I / 1000));
        else
            d->retry = (int64_t)atleast1d(ceil((need - dd) / 1000));
    }
}

static void decide_gcra(const struct limiter_state *s, int is_live,
                        const struct limiter_params *p, int64_t c, int64_t now_us,
                        struct decision *d)
{
    int64_t B = p->limit, I = p->interval_us;
    int64_t tat = now_us;
    if (is_live)
        tat = max64(s->u.gcra.tat_us, now_us);
    d->rem0 = max64(0, div_floor(B * I - (tat - now_us), I));
    d->reset0 = div_ceil(tat - now_us, 1000);
    if (c > B) {                /* never fits; c * I might not fit in 64 bits */
        d->ok = 0;
        d->rem = 0;
        d->reset = d->reset0;
        d->retry = atleast1(div_ceil(B * I, 1000));
        return;
    }
    int64_t new_tat = tat + c * I;
    int64_t D = p->delay_ms * 1000;         /* delay: TAT may run this far ahead */
    int64_t wait = new_tat - B * I - now_us;
    d->ok = new_tat - now_us <= B * I + D;
    if (d->ok) {
        d->rem = max64(0, div_floor(B * I - (new_tat - now_us), I));
        d->reset = div_ceil(new_tat - now_us, 1000);
        d->retry = wait > 0 ? atleast1(div_ceil(wait, 1000)) : 0;
    } else {
        d->rem = 0;
        d->reset = d->reset0;
        d->retry = atleast1(div_ceil(wait - D, 1000));
    }
}

/* concurrency: the live slots (lease expiry after now_ms). */
static int64_t slots_live(const struct limiter_state *s, int is_live, int64_t now_ms)
{
    int64_t n = 0;
    for (uint32_t i = 0; is_live && i < s->log_len; i++)
        n += s->log[i].ms > now_ms;
    return n;
}

/* One slot per request, whatever its cost; a denial retries after 1 s. */
static void decide_concurrency(const struct limiter_state *s, int is_live,
                               const struct limiter_params *p, int64_t now_us,
                               struct decision *d)
{
    int64_t L = p->limit, count = slots_live(s, is_live, now_ms_of(now_us));
    d->ok = count + 1 <= L;
    d->rem0 = max64(0, L - count);
    d->reset0 = d->reset = 0;
    d->rem = d->ok ? L - count - 1 : 0;
    d->retry = d->ok ? 0 : 1000;
}

static void decide(const struct limiter_state *s, const struct limiter_params *p,
                   int64_t c, int64_t now_us, struct decision *d)
{
    int is_live = live(s, p, now_us);
    switch (p->algo) {
    case LIMITER_FIXED_WINDOW: decide_fixed(s, is_live, p, c, now_us, d); return;
    case LIMITER_SLIDING_WINDOW: decide_sliding(s, is_live, p, c, now_us, d); return;
    case LIMITER_SLIDING_LOG: decide_log(s, is_live, p, c, now_us, d); return;
    case LIMITER_TOKEN_BUCKET: decide_bucket(s, is_live, p, c, now_us, d); return;
    case LIMITER_GCRA: decide_gcra(s, is_live, p, c, now_us, d); return;
    case LIMITER_CONCURRENCY: decide_concurrency(s, is_live, p, now_us, d); return;
    }
    abort();
}

int limiter_check(const struct limiter_state *s, const struct limiter_params *p,
                  int64_t cost, int64_t now_us, struct limiter_result *r)
{
    struct decision d;
    assert(limiter_valid(p, cost) == 0);
    decide(s, p, cost, now_us, &d);
    r->allowed = d.ok;
    r->limit = p->limit;
    r->remaining = d.rem;
    r->reset_ms = max64(0, d.reset);
    r->retry_ms = d.retry;
    return d.ok;
}

void limiter_unconsumed(const struct limiter_state *s, const struct limiter_params *p,
                        int64_t now_us, struct limiter_result *r)
{
    struct decision d;
    decide(s, p, 1, now_us, &d);
    r->allowed = 1;
    r->limit = p->limit;
    r->remaining = d.rem0;
    r->reset_ms = max64(0, d.reset0);
    r->retry_ms = 0;
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The longest reset_ms or denial retry_ms a result of p may carry (see
 * limiter_clamp() in limiter.h). */
static int64_t max_time_ms(const struct limiter_params *p, int overridable)
{
    int64_t W = clamp64(p->window_ms, 0, LIMITER_MAX_TIME_MS), refill;
    int64_t D = clamp64(p->delay_ms, 0, LIMITER_MAX_TIME_MS);
    switch (p->algo) {
    case LIMITER_FIXED_WINDOW:
    case LIMITER_SLIDING_WINDOW:
    case LIMITER_SLIDING_LOG:
        return 2 * W;           /* sliding_window's count decays over the next
                                 * window; an entry from a clock gone back */
    case LIMITER_TOKEN_BUCKET:
    case LIMITER_GCRA:
        if (overridable || p->interval_us < 1 || p->limit < 0 ||
            p->limit > LIMITER_EXACT_MAX / p->interval_us)
            refill = LIMITER_MAX_TIME_MS;
        else
            refill = div_ceil(p->limit * p->interval_us, 1000);
        refill = clamp64(refill, 0, LIMITER_MAX_TIME_MS);
        return (p->settles ? 2 * refill : refill) + D;    /* a debt: one more burst */
    case LIMITER_CONCURRENCY:
        return max64(W, 1000);
    }
    return 0;
}

void limiter_clamp(struct limiter_result *r, const struct limiter_params *p, int overridable)
{
    int64_t t = max_time_ms(p, overridable);
    r->allowed = r->allowed != 0;
    r->limit = overridable ? clamp64(r->limit, 0, LIMITER_MAX_LIMIT) : p->limit;
    r->remaining = r->allowed ? clamp64(r->remaining, 0, max64(r->limit, 0)) : 0;
    r->reset_ms = clamp64(r->reset_ms, 0, t);
    r->retry_ms = clamp64(r->retry_ms, 0, r->allowed ? clamp64(p->delay_ms, 0, t) : t);
}

/* The writes of the Lua's d.write(), with the key's expiry. */
void limiter_commit(struct limiter_state *s, const struct limiter_params *p,
                    int64_t cost, int64_t now_us)
{
    int64_t now_ms = now_ms_of(now_us), W = p->window_ms;
    int is_live = live(s, p, now_us);

    assert(limiter_valid(p, cost) == 0);
    if (!is_live) {             /* DEL of a stale key: start from absent */
        s->log_head = s->log_len = 0;
        memset(&s->u, 0, sizeof(s->u));
    }
    s->used = 1;
    s->algo = p->algo;
    switch (p->algo) {
    case LIMITER_FIXED_WINDOW: {
        int64_t start, end, win = fixed_window(p, now_ms, &start, &end);
        s->u.fixed.n = (is_live && s->u.fixed.win == win ? s->u.fixed.n : 0) + cost;
        s->u.fixed.win = win;
        s->expire_ms = end;
        return;
    }
    case LIMITER_SLIDING_WINDOW: {
        int64_t cur = div_floor(now_ms, W), cc, pc;
        sliding_counts(s, is_live, cur, &cc, &pc);
        s->u.sliding.win = cur;
        s->u.sliding.cur = cc + cost;
        s->u.sliding.prev = pc;
        s->expire_ms = (cur + 2) * W;
        return;
    }
    case LIMITER_SLIDING_LOG:
        log_add(s, now_ms - W, now_ms, cost);
        s->expire_ms = now_ms + W;
        return;
    case LIMITER_TOKEN_BUCKET: {
        struct bucket b;
        bucket_tokens(s, is_live, p, now_us, &b);
        double after = b.tokens - (double)cost;
        s->u.bucket.tokens = after;
        s->u.bucket.last_us = now_us;
        s->expire_ms = now_ms + (int64_t)atleast1d(bucket_refill_ms(&b, after));
        return;
    }
    case LIMITER_GCRA: {
        int64_t tat = is_live ? max64(s->u.gcra.tat_us, now_us) : now_us;
        s->u.gcra.tat_us = tat + cost * p->interval_us;
        s->expire_ms = now_ms + atleast1(div_ceil(s->u.gcra.tat_us - now_us, 1000));
        return;
    }
    case LIMITER_CONCURRENCY:   /* limiter_slot_take(): a slot needs its id */
        break;
    }
    abort();
}

/* ---- concurrency slots (limit.lua's ZSET of slot ids scored by expiry) ---- */

/* ZREMRANGEBYSCORE -inf now_ms: keep the slots whose lease runs on. */
static void slots_prune(struct limiter_state *s, int64_t now_ms)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->log_len; i++)
        if (s->log[i].ms > now_ms)
            s->log[k++] = s->log[i];
    s->log_len = k;
}

static struct limiter_log_entry *slot_find(struct limiter_state *s, int64_t slot)
{
    for (uint32_t i = 0; i < s->log_len; i++)
        if (s->log[i].n == slot)
            return &s->log[i];
    return NULL;
}

void limiter_slot_take(struct limiter_state *s, const struct limiter_params *p,
                       int64_t slot, int64_t now_us)
{
    int64_t now_ms = now_ms_of(now_us);
    assert(p->algo == LIMITER_CONCURRENCY && limiter_valid(p, 1) == 0);
    if (!live(s, p, now_us)) {      /* DEL of a stale key */
        s->log_head = s->log_len = 0;
        memset(&s->u, 0, sizeof(s->u));
    }
    slots_prune(s, now_ms);
    struct limiter_log_entry *e = slot_find(s, slot);
    if (e == NULL) {
        assert(s->log_len < s->log_cap);    /* the caller grows the array first */
        e = &s->log[s->log_len++];
        e->n = slot;
    }
    e->ms = now_ms + p->window_ms;          /* ZADD now+lease, PEXPIRE lease */
    s->used = 1;
    s->algo = p->algo;
    s->log_head = 0;
    s->expire_ms = now_ms + p->window_ms;
}

int limiter_slot_renew(struct limiter_state *s, const struct limiter_params *p,
                       int64_t slot, int64_t now_us)
{
    int64_t now_ms = now_ms_of(now_us);
    int is_live = live(s, p, now_us);
    struct limiter_log_entry *e = is_live ? slot_find(s, slot) : NULL;
    if ((e == NULL || e->ms <= now_ms) && slots_live(s, is_live, now_ms) >= p->limit)
        return 0;
    limiter_slot_take(s, p, slot, now_us);
    return 1;
}

int limiter_slot_give(struct limiter_state *s, int64_t slot)
{
    if (!s->used || s->algo != LIMITER_CONCURRENCY)
        return 0;
    struct limiter_log_entry *e = slot_find(s, slot);
    if (e == NULL)
        return 0;
    *e = s->log[--s->log_len];
    if (s->log_len == 0)
        s->used = 0;                        /* an empty ZSET is no key */
    return 1;
}

int64_t limiter_mark(const struct limiter_params *p, int64_t now_us)
{
    int64_t now_ms = now_ms_of(now_us), start, end;
    if (p->algo == LIMITER_FIXED_WINDOW)
        return fixed_window(p, now_ms, &start, &end);
    if (p->algo == LIMITER_SLIDING_WINDOW && p->window_ms > 0)
        return div_floor(now_ms, p->window_ms);
    return 0;
}

/* A count after a settlement of cost (< 0: a charge of -cost): at least 0,
 * and a charge makes it at most twice the limit (or leaves it). */
static int64_t settled_count(int64_t n, int64_t cost, int64_t L)
{
    int64_t after = n - cost;
    if (cost < 0 && after > 2 * L)
        after = n > 2 * L ? n : 2 * L;
    return after < 0 ? 0 : after;
}

int limiter_refund(struct limiter_state *s, const struct limiter_params *p,
                   int64_t cost, int64_t mark, int64_t now_us)
{
    int64_t now_ms = now_ms_of(now_us);
    int is_live = live(s, p, now_us);
    if (cost == 0)
        return 0;
    if (p->algo == LIMITER_FIXED_WINDOW) {
        if (!is_live || s->u.fixed.win != mark)
            return 0;                       /* its window is over */
        s->u.fixed.n = settled_count(s->u.fixed.n, cost, p->limit);
        return 1;                           /* KEEPTTL */
    }
    if (p->algo == LIMITER_SLIDING_WINDOW) {
        if (!is_live)
            return 0;
        if (s->u.sliding.win == mark)
            s->u.sliding.cur = settled_count(s->u.sliding.cur, cost, p->limit);
        else if (s->u.sliding.win == mark + 1)
            s->u.sliding.prev = settled_count(s->u.sliding.prev, cost, p->limit);
        else
            return 0;
        s->expire_ms = (s->u.sliding.win + 2) * p->window_ms;
        return 1;
    }
    if (!is_live && cost > 0)
        return 0;                           /* absent: nothing to give back */
    if (p->algo == LIMITER_TOKEN_BUCKET) {
        struct bucket b;
        bucket_tokens(s, is_live, p, now_us, &b);
        double after = b.tokens + (double)cost;
        if (cost < 0 && after < -b.B)       /* a debt of one burst at most */
            after = b.tokens < -b.B ? b.tokens : -b.B;
        if (after >= b.B) {
            s->used = 0;
            return 1;
        }
        s->used = 1;
        s->algo = p->algo;
        s->u.bucket.tokens = after;
        s->u.bucket.last_us = now_us;
        s->expire_ms = now_ms + (int64_t)atleast1d(bucket_refill_ms(&b, after));
        return 1;
    }
    if (p->algo == LIMITER_GCRA) {
        int64_t tat, I = p->interval_us;
        if (cost > 0) {
            tat = s->u.gcra.tat_us - cost * I;
        } else {
            int64_t from = is_live ? max64(s->u.gcra.tat_us, now_us) : now_us;
            int64_t cap = now_us + 2 * p->limit * I;
            tat = -cost > (cap - from) / I ? (from > cap ? from : cap) : from - cost * I;
        }
        if (tat <= now_us) {
            s->used = 0;
            return 1;
        }
        s->used = 1;
        s->algo = p->algo;
        s->u.gcra.tat_us = tat;
        s->expire_ms = now_ms + atleast1(div_ceil(tat - now_us, 1000));
        return 1;
    }
    return 0;
}
