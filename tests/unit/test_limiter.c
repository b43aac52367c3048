/* sluice - test_limiter.c: the pure C algorithms against the shared table.
 *
 * data/limiter_cases.txt is the one table of cases that limit.lua (in a real
 * redis-server, tests/integration/test_limiter_table.py) and memstore.c
 * (test_memstore.c, which includes this file's parser) must also pass. Each
 * case runs twice on a fake clock: from 0 and from a realistic epoch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "limiter.h"
#include "backend.h"

/* ---- the table's parser (shared with test_memstore.c) ---------------------- */

#define LCASES_FILE "data/limiter_cases.txt"
#define LCASE_STEPS_MAX 32
#define LCASE_DAY_MS 86400000LL
/* 20000 days after the epoch (2024-10-04): a base with real-sized numbers */
#define LCASE_EPOCH_US (20000LL * LCASE_DAY_MS * 1000)
/* 400 Gregorian years: dates, weekdays and a zone's DST rule repeat */
#define LCASE_400Y_US (146097LL * LCASE_DAY_MS * 1000)

/* A step decides, or (concurrency) releases or renews a slot in every
 * concurrency limit of the case. */
enum lcase_kind { LCASE_DECIDE, LCASE_RELEASE, LCASE_RENEW, LCASE_SETTLE };

struct lcase_step {
    int line;
    enum lcase_kind kind;
    int64_t slot;                           /* concurrency: the slot id, 0: none */
    int64_t at_us, cost;                    /* settle: cost signed (< 0: a charge) */
    int64_t admitted_us;                    /* settle: when the request was admitted */
    int allowed;
    struct limiter_result r[STORE_MAX_LIMITS];
};

struct lcase {
    int line;
    char name[80];
    int nlimits, nsteps;
    struct limiter_params p[STORE_MAX_LIMITS];
    unsigned flags[STORE_MAX_LIMITS];       /* STORE_SHADOW, STORE_CHECK_ONLY */
    char key[STORE_MAX_LIMITS][16];         /* limits with one name share a key */
    struct tzcal *tz[STORE_MAX_LIMITS];     /* cal=UNIT tz=ZONE: its zone */
    int calendar;                           /* times are real: bases of 400 years */
    int slot[STORE_MAX_LIMITS];             /* the first limit with this key */
    struct lcase_step step[LCASE_STEPS_MAX];
};

static int lcase_algo(const char *name, enum limiter_algo *algo)
{
    for (int a = LIMITER_FIXED_WINDOW; a <= LIMITER_CONCURRENCY; a++)
        if (strcmp(limiter_algo_name((enum limiter_algo)a), name) == 0) {
            *algo = (enum limiter_algo)a;
            return 0;
        }
    return -1;
}

static int lcase_limit(struct lcase *c, char *rest)
{
    struct limiter_params *p;
    char *tok = strtok(rest, " \t");
    if (tok == NULL || c->nlimits >= STORE_MAX_LIMITS)
        return -1;
    int n = c->nlimits++;
    p = &c->p[n];
    memset(p, 0, sizeof(*p));
    snprintf(c->key[n], sizeof(c->key[n]), "%d", n);
    if (lcase_algo(tok, &p->algo) != 0)
        return -1;
    while ((tok = strtok(NULL, " \t")) != NULL) {
        long long v;
        char key[16];
        int used = 0;
        if (strncmp(tok, "cal=", 4) == 0) {
            static const char *const units[] = { "day", "week", "month", "year" };
            for (int u = 0; u < 4; u++)
                if (strcmp(tok + 4, units[u]) == 0)
                    p->cal = (enum tzcal_unit)(TZCAL_DAY + u);
            if (p->cal == TZCAL_NONE)
                return -1;
            c->calendar = 1;
            continue;
        }
        if (strncmp(tok, "tz=", 3) == 0) {
            const char *why;
            tzcal_free(c->tz[n]);
            if ((c->tz[n] = tzcal_load(tok + 3, &why)) == NULL)
                return -1;
            continue;
        }
        if (strncmp(tok, "key=", 4) == 0) {
            size_t len = strlen(tok + 4);
            if (len == 0 || len >= sizeof(c->key[n]))
                return -1;
            memcpy(c->key[n], tok + 4, len + 1);
            continue;
        }
        if (sscanf(tok, "%15[a-z_]=%lld%n", key, &v, &used) != 2 || tok[used] != '\0')
            return -1;
        if (strcmp(key, "limit") == 0) p->limit = v;
        else if (strcmp(key, "window_ms") == 0) p->window_ms = v;
        else if (strcmp(key, "interval_us") == 0) p->interval_us = v;
        else if (strcmp(key, "delay_ms") == 0) p->delay_ms = v;
        else if (strcmp(key, "flags") == 0 && v >= 0 && v <= 3) c->flags[n] = (unsigned)v;
        else return -1;
    }
    if ((p->cal != TZCAL_NONE) != (c->tz[n] != NULL))
        return -1;                          /* cal= and tz= go together */
    p->tz = c->tz[n];
    c->slot[n] = n;
    for (int i = n - 1; i >= 0; i--)
        if (strcmp(c->key[i], c->key[n]) == 0)
            c->slot[n] = c->slot[i];
    /* runners shift time by whole days: windows must stay aligned */
    if (p->algo <= LIMITER_SLIDING_LOG && p->cal == TZCAL_NONE &&
        (p->window_ms < 1 || LCASE_DAY_MS % p->window_ms))
        return -1;
    return 0;
}

/* "release T slot S", "renew T slot S -> A" (concurrency limits only). */
static int lcase_slot_step(struct lcase *c, enum lcase_kind kind, const char *rest, int line)
{
    struct lcase_step *s;
    long long at, slot;
    int allowed = 0, used = 0;
    if (c->nlimits == 0 || c->nsteps >= LCASE_STEPS_MAX)
        return -1;
    s = &c->step[c->nsteps++];
    s->line = line;
    s->kind = kind;
    if (sscanf(rest, "%lld slot %lld%n", &at, &slot, &used) != 2 || slot < 1)
        return -1;
    rest += used;
    if (kind == LCASE_RENEW) {
        if (sscanf(rest, " -> %d%n", &allowed, &used) != 1)
            return -1;
        rest += used;
    }
    s->at_us = at;
    s->slot = slot;
    s->allowed = allowed;
    return rest[strspn(rest, " \t\r\n")] == '\0' ? 0 : -1;
}

/* "settle T admitted A cost D": every limit may then owe one more limit. */
static int lcase_settle_step(struct lcase *c, const char *rest, int line)
{
    struct lcase_step *s;
    long long at, admitted, cost;
    int used = 0;
    if (c->nlimits == 0 || c->nsteps >= LCASE_STEPS_MAX)
        return -1;
    s = &c->step[c->nsteps++];
    s->line = line;
    s->kind = LCASE_SETTLE;
    if (sscanf(rest, "%lld admitted %lld cost %lld%n", &at, &admitted, &cost, &used) != 3 ||
        cost == 0)
        return -1;
    s->at_us = at;
    s->admitted_us = admitted;
    s->cost = cost;
    for (int i = 0; i < c->nlimits; i++)
        c->p[i].settles = 1;
    rest += used;
    return rest[strspn(rest, " \t\r\n")] == '\0' ? 0 : -1;
}

/* "at T cost C [slot S] -> A | a rem reset retry | ..." */
static int lcase_step(struct lcase *c, const char *rest, int line)
{
    struct lcase_step *s;
    long long at, cost, slot = 0;
    int allowed, used = 0;
    if (c->nlimits == 0 || c->nsteps >= LCASE_STEPS_MAX)
        return -1;
    s = &c->step[c->nsteps++];
    s->line = line;
    if (sscanf(rest, "%lld cost %lld -> %d%n", &at, &cost, &allowed, &used) != 3 &&
        (sscanf(rest, "%lld cost %lld slot %lld -> %d%n", &at, &cost, &slot, &allowed,
                &used) != 4 || slot < 1))
        return -1;
    s->slot = slot;
    s->at_us = at;
    s->cost = cost;
    s->allowed = allowed;
    rest += used;
    for (int i = 0; i < c->nlimits; i++) {
        struct limiter_result *r = &s->r[i];
        long long rem, reset, retry;
        int a;
        if (sscanf(rest, " | %d %lld %lld %lld%n", &a, &rem, &reset, &retry, &used) != 4)
            return -1;
        *r = (struct limiter_result){ a, c->p[i].limit, rem, reset, retry };
        rest += used;
    }
    return rest[strspn(rest, " \t\r\n")] == '\0' ? 0 : -1;
}

/* Loads every case; any line it cannot read fails the test with its number. */
static int lcases_load(struct lcase **out)
{
    FILE *f = fopen(LCASES_FILE, "r");
    struct lcase *cases = NULL;
    int n = 0, line = 0;
    char buf[1024];
    assert_non_null(f);
    while (fgets(buf, sizeof(buf), f)) {
        char *p = buf + strspn(buf, " \t");
        int bad = 0;
        line++;
        p[strcspn(p, "\r\n")] = '\0';
        if (*p == '\0' || *p == '#')
            continue;
        if (strncmp(p, "case ", 5) == 0) {
            cases = realloc(cases, (size_t)(n + 1) * sizeof(*cases));
            assert_non_null(cases);
            memset(&cases[n], 0, sizeof(cases[n]));
            cases[n].line = line;
            bad = snprintf(cases[n].name, sizeof(cases[n].name), "%s", p + 5) >=
                  (int)sizeof(cases[n].name);
            n++;
        } else if (n > 0 && strncmp(p, "limit ", 6) == 0) {
            bad = lcase_limit(&cases[n - 1], p + 6) != 0;
        } else if (n > 0 && strncmp(p, "at ", 3) == 0) {
            bad = lcase_step(&cases[n - 1], p + 3, line) != 0;
        } else if (n > 0 && strncmp(p, "release ", 8) == 0) {
            bad = lcase_slot_step(&cases[n - 1], LCASE_RELEASE, p + 8, line) != 0;
        } else if (n > 0 && strncmp(p, "renew ", 6) == 0) {
            bad = lcase_slot_step(&cases[n - 1], LCASE_RENEW, p + 6, line) != 0;
        } else if (n > 0 && strncmp(p, "settle ", 7) == 0) {
            bad = lcase_settle_step(&cases[n - 1], p + 7, line) != 0;
        } else {
            bad = 1;
        }
        if (bad)
            fail_msg("%s:%d: cannot read: %s", LCASES_FILE, line, p);
    }
    fclose(f);
    for (int i = 0; i < n; i++)
        if (cases[i].nsteps == 0)
            fail_msg("%s:%d: case %s has no steps", LCASES_FILE, cases[i].line, cases[i].name);
    *out = cases;
    return n;
}

static void lcases_free(struct lcase *cases, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < cases[i].nlimits; j++)
            tzcal_free(cases[i].tz[j]);
    free(cases);
}

/* The bases a case runs from: 0 and a realistic epoch, or 0 and 400 years
 * (whose dates fall on the same weekdays) for a case of calendar windows. */
static int64_t lcase_base(const struct lcase *c)
{
    return c->calendar ? LCASE_400Y_US : LCASE_EPOCH_US;
}

/* Compares one decision with the table; returns the mismatches (printed). */
static int lcase_compare(const struct lcase *c, const struct lcase_step *s, int64_t base_us,
                         int allowed, const struct limiter_result *got)
{
    int bad = allowed != s->allowed;
    for (int i = 0; i < c->nlimits; i++) {
        const struct limiter_result *w = &s->r[i], *g = &got[i];
        if (g->allowed != w->allowed || g->limit != w->limit || g->remaining != w->remaining ||
            g->reset_ms != w->reset_ms || g->retry_ms != w->retry_ms) {
            print_error("%s:%d: %s (base %lld) limit %d: got %d %lld %lld %lld, want %d %lld %lld %lld\n",
                        LCASES_FILE, s->line, c->name, (long long)base_us, i + 1,
                        g->allowed, (long long)g->remaining, (long long)g->reset_ms,
                        (long long)g->retry_ms, w->allowed, (long long)w->remaining,
                        (long long)w->reset_ms, (long long)w->retry_ms);
            bad = 1;
        }
    }
    if (allowed != s->allowed)
        print_error("%s:%d: %s (base %lld): got verdict %d, want %d\n", LCASES_FILE,
                    s->line, c->name, (long long)base_us, allowed, s->allowed);
    return bad;
}

#ifndef LCASES_PARSER_ONLY

/* ---- the table through limiter_check/commit --------------------------------- */

struct lrun {
    struct limiter_state st[STORE_MAX_LIMITS];
};

static void lrun_init(struct lrun *run, int n)
{
    for (int i = 0; i < n; i++)         /* a ring of 1: growth is exercised */
        limiter_state_init(&run->st[i], malloc(sizeof(struct limiter_log_entry)), 1);
}

static void lrun_free(struct lrun *run, int n)
{
    for (int i = 0; i < n; i++)
        free(run->st[i].log);
}

static void lrun_room(struct limiter_state *s)
{
    if (s->log_len < s->log_cap)
        return;
    uint32_t cap = s->log_cap * 2;
    struct limiter_log_entry *old = s->log, *to = malloc(cap * sizeof(*to));
    assert_non_null(to);
    limiter_log_move(s, to, cap);
    free(old);
}

static int lrun_writes(const struct lcase *c, const struct limiter_result *r, int all, int i)
{
    return all && r[i].allowed && !(c->flags[i] & STORE_CHECK_ONLY);
}

/* One decision the way limit.lua makes it: check all; the request passes
 * when every limit that is not shadow allows; then the allowing limits that
 * are not check-only are consumed (a shared key once) and the other allowing
 * ones report their state as it was. */
static int lrun_decide(struct lrun *run, const struct lcase *c, int64_t cost, int64_t slot,
                       int64_t now_us, struct limiter_result *r)
{
    int all = 1;
    for (int i = 0; i < c->nlimits; i++)
        if (!limiter_check(&run->st[c->slot[i]], &c->p[i], cost, now_us, &r[i]) &&
            !(c->flags[i] & STORE_SHADOW))
            all = 0;
    for (int i = 0; i < c->nlimits; i++)
        if (r[i].allowed && !lrun_writes(c, r, all, i))
            limiter_unconsumed(&run->st[c->slot[i]], &c->p[i], now_us, &r[i]);
    for (int i = 0; i < c->nlimits; i++) {
        int later = 0;
        for (int j = i + 1; j < c->nlimits; j++)
            later |= c->slot[j] == c->slot[i] && lrun_writes(c, r, all, j);
        if (!lrun_writes(c, r, all, i) || later)
            continue;
        lrun_room(&run->st[c->slot[i]]);
        if (c->p[i].algo == LIMITER_CONCURRENCY)
            limiter_slot_take(&run->st[c->slot[i]], &c->p[i], slot, now_us);
        else
            limiter_commit(&run->st[c->slot[i]], &c->p[i], cost, now_us);
    }
    return all;
}

/* release / renew: slot in every concurrency limit; renew answers 1 when
 * every one holds it after. */
static int lrun_slot(struct lrun *run, const struct lcase *c, const struct lcase_step *s,
                     int64_t now_us)
{
    int all = 1;
    for (int i = 0; i < c->nlimits; i++) {
        if (c->p[i].algo != LIMITER_CONCURRENCY)
            continue;
        lrun_room(&run->st[c->slot[i]]);
        if (s->kind == LCASE_RELEASE)
            limiter_slot_give(&run->st[c->slot[i]], s->slot);
        else
            all &= limiter_slot_renew(&run->st[c->slot[i]], &c->p[i], s->slot, now_us);
    }
    return all;
}

static int run_case(const struct lcase *c, int64_t base_us)
{
    struct lrun run;
    int bad = 0;
    lrun_init(&run, c->nlimits);
    for (int k = 0; k < c->nsteps; k++) {
        const struct lcase_step *s = &c->step[k];
        struct limiter_result r[STORE_MAX_LIMITS];
        struct limiter_state before[STORE_MAX_LIMITS];
        memcpy(before, run.st, sizeof(before));
        if (s->kind == LCASE_SETTLE) {
            for (int i = 0; i < c->nlimits; i++)
                limiter_refund(&run.st[c->slot[i]], &c->p[i], s->cost,
                               limiter_mark(&c->p[i], base_us + s->admitted_us),
                               base_us + s->at_us);
            continue;
        }
        if (s->kind != LCASE_DECIDE) {
            int held = lrun_slot(&run, c, s, base_us + s->at_us);
            if (s->kind == LCASE_RENEW && held != s->allowed) {
                print_error("%s:%d: %s: renew got %d, want %d\n", LCASES_FILE, s->line,
                            c->name, held, s->allowed);
                bad++;
            }
            continue;
        }
        int allowed = lrun_decide(&run, c, s->cost, s->slot, base_us + s->at_us, r);
        bad += lcase_compare(c, s, base_us, allowed, r);
        for (int i = 0; i < c->nlimits; i++) {  /* the bounds hold every true answer */
            struct limiter_result cl = r[i];
            limiter_clamp(&cl, &c->p[i], 0);
            if (memcmp(&cl, &r[i], sizeof(cl)) != 0) {
                print_error("%s:%d: %s: limiter_clamp changed limit %d\n", LCASES_FILE,
                            s->line, c->name, i);
                bad++;
            }
        }
        if (!allowed)       /* a denied decision changes no state at all */
            bad += memcmp(before, run.st, (size_t)c->nlimits * sizeof(before[0])) != 0;
    }
    lrun_free(&run, c->nlimits);
    return bad;
}

static void test_table(void **state)
{
    struct lcase *cases;
    int n = lcases_load(&cases), bad = 0, per_algo[6] = { 0 };
    assert_true(n >= 40);
    for (int i = 0; i < n; i++) {
        bad += run_case(&cases[i], 0);
        bad += run_case(&cases[i], lcase_base(&cases[i]));
        for (int j = 0; j < cases[i].nlimits; j++)
            per_algo[cases[i].p[j].algo]++;
    }
    lcases_free(cases, n);
    for (int a = 0; a < 5; a++)
        assert_true(per_algo[a] >= 5);
    assert_int_equal(bad, 0);
}

/* ---- what the table cannot say --------------------------------------------- */

static const struct limiter_params fixed5 = { LIMITER_FIXED_WINDOW, 5, 1000, 0 };
static const struct limiter_params log5 = { LIMITER_SLIDING_LOG, 5, 1000, 0 };
static const struct limiter_params bucket3 = { LIMITER_TOKEN_BUCKET, 3, 3000, 1000000 };

static void test_check_changes_nothing(void **state)
{
    struct limiter_log_entry ring[8];
    struct limiter_state s, copy;
    struct limiter_result r;
    limiter_state_init(&s, ring, 8);
    limiter_commit(&s, &log5, 2, 1000);
    memcpy(&copy, &s, sizeof(s));
    for (int i = 0; i < 100; i++)
        assert_true(limiter_check(&s, &log5, 1, 1000 + i, &r));
    limiter_unconsumed(&s, &log5, 5000, &r);
    assert_memory_equal(&copy, &s, sizeof(s));
    assert_int_equal(r.remaining, 3);
}

/* A key written by another algorithm (a reload changed it) reads as absent. */
static void test_other_algorithm_reads_absent(void **state)
{
    struct limiter_state s;
    struct limiter_result r;
    limiter_state_init(&s, NULL, 0);
    for (int i = 0; i < 5; i++)
        limiter_commit(&s, &fixed5, 1, 0);
    assert_false(limiter_check(&s, &fixed5, 1, 0, &r));
    assert_true(limiter_check(&s, &bucket3, 1, 0, &r));
    assert_int_equal(r.remaining, 2);
    limiter_commit(&s, &bucket3, 1, 0);
    assert_true(limiter_check(&s, &fixed5, 1, 0, &r));
    assert_int_equal(r.remaining, 4);
}

/* Expiry is when Redis would drop the key, and from then on reads absent. */
static void test_expiry(void **state)
{
    struct limiter_state s;
    struct limiter_result r;
    limiter_state_init(&s, NULL, 0);
    assert_true(limiter_expired(&s, 0));
    limiter_commit(&s, &bucket3, 3, 0);                 /* refill takes 3 s */
    assert_false(limiter_expired(&s, 3000999));         /* ms 3000 == expiry */
    assert_true(limiter_expired(&s, 3001000));
    assert_true(limiter_check(&s, &bucket3, 3, 3001000, &r));
    limiter_commit(&s, &fixed5, 1, 1500000);            /* window 1 ends at 2000 */
    assert_int_equal(s.expire_ms, 2000);
}

static void test_valid(void **state)
{
    struct limiter_params p = fixed5;
    assert_int_equal(limiter_valid(&p, 1), 0);
    assert_int_equal(limiter_valid(&p, 0), -1);
    p.window_ms = 0;
    assert_int_equal(limiter_valid(&p, 1), -1);
    p = bucket3;
    p.interval_us = 0;
    assert_int_equal(limiter_valid(&p, 1), -1);
    p = bucket3;
    p.limit = -1;
    assert_int_equal(limiter_valid(&p, 1), -1);
    p.limit = (int64_t)1 << 40;         /* limit * interval beyond 2^53 */
    assert_int_equal(limiter_valid(&p, 1), -1);
    p = fixed5;
    p.algo = (enum limiter_algo)9;
    assert_int_equal(limiter_valid(&p, 1), -1);
}

/* A hostile cost (from cost_header) far beyond the limit: denied, no overflow. */
static void test_huge_cost(void **state)
{
    static const struct limiter_params all[] = {
        { LIMITER_FIXED_WINDOW, 5, 1000, 0 }, { LIMITER_SLIDING_WINDOW, 5, 1000, 0 },
        { LIMITER_SLIDING_LOG, 5, 1000, 0 }, { LIMITER_TOKEN_BUCKET, 5, 5000, 1000000 },
        { LIMITER_GCRA, 5, 5000, 1000000 },
    };
    int64_t cost = (int64_t)1 << 53;
    for (int i = 0; i < 5; i++) {
        struct limiter_state s;
        struct limiter_result r;
        limiter_state_init(&s, NULL, 0);
        assert_false(limiter_check(&s, &all[i], cost, 123456789, &r));
        assert_int_equal(r.remaining, 0);
        assert_true(r.retry_ms >= 1);
    }
}

/* Window limits whose limit x window_ms is beyond 2^53 (and, at the config's
 * bounds, 1e9 per 3650 days, beyond int64): valid, and counted exactly as
 * limit.lua counts them: L pass, the next is denied until the window moves,
 * and half a window later sliding_window's previous L weigh L/2. */
static void test_large_windows(void **state)
{
    static const int64_t lw[][2] = {
        { 5000000, 30LL * 86400000 }, { 300000, 365LL * 86400000 },
        { 1000000000, 3650LL * 86400000 },
    };
    static const enum limiter_algo algos[] = { LIMITER_FIXED_WINDOW, LIMITER_SLIDING_WINDOW,
                                               LIMITER_SLIDING_LOG };
    for (int i = 0; i < 3; i++)
        for (int a = 0; a < 3; a++) {
            int64_t L = lw[i][0], W = lw[i][1], t0 = 5 * W * 1000;   /* a window's start */
            struct limiter_params p = { algos[a], L, W, 0 };
            struct limiter_state s;
            struct limiter_result r;
            struct lrun run;
            assert_int_equal(limiter_valid(&p, 1), 0);
            limiter_state_init(&s, malloc(sizeof(struct limiter_log_entry)), 1);
            assert_true(limiter_check(&s, &p, L - 1, t0, &r));
            assert_int_equal(r.remaining, 1);
            lrun_room(&s);
            limiter_commit(&s, &p, L - 1, t0);
            assert_true(limiter_check(&s, &p, 1, t0 + 1000, &r));
            assert_int_equal(r.remaining, 0);
            lrun_room(&s);
            limiter_commit(&s, &p, 1, t0 + 1000);
            assert_false(limiter_check(&s, &p, 1, t0 + 2000, &r));
            assert_int_equal(r.remaining, 0);
            assert_int_equal(r.limit, L);
            assert_true(r.retry_ms >= 1 && r.retry_ms <= 2 * W);    /* sliding: next window + decay */
            if (algos[a] == LIMITER_SLIDING_WINDOW) {
                assert_true(limiter_check(&s, &p, 1, t0 + W * 1000 + W * 500, &r));
                assert_int_equal(r.remaining, L / 2 - 1);
            }
            run.st[0] = s;
            lrun_free(&run, 1);
        }
    /* token_bucket and gcra still need limit x interval_us within 2^53 */
    struct limiter_params b = { LIMITER_GCRA, 1000000000, 0, 10000000 };
    assert_int_equal(limiter_valid(&b, 1), -1);
}

/* The ring stays sorted through growth, wrap-around and a clock gone back. */
static void test_log_ring(void **state)
{
    struct limiter_params p = { LIMITER_SLIDING_LOG, 1000, 1000, 0 };
    struct limiter_state s;
    struct limiter_result r;
    struct lrun run;
    limiter_state_init(&s, malloc(sizeof(struct limiter_log_entry)), 1);
    for (int64_t t = 0; t < 5000; t += 7) {
        int64_t now_us = (t % 3 == 0 ? t - 10 : t) * 1000;   /* every 3rd goes back */
        lrun_room(&s);
        assert_true(limiter_check(&s, &p, 1, now_us, &r));
        limiter_commit(&s, &p, 1, now_us);
        for (uint32_t i = 1; i < s.log_len; i++)
            assert_true(s.log[(s.log_head + i - 1) % s.log_cap].ms <
                        s.log[(s.log_head + i) % s.log_cap].ms);
        assert_true(s.log_len <= 144);
    }
    run.st[0] = s;
    lrun_free(&run, 1);
}

/* A reply's numbers bounded by what the limit allows (a hostile Redis). */
static void test_clamp(void **state)
{
    const struct limiter_params sw = { LIMITER_SLIDING_WINDOW, 5, 1000, 0, 0 };
    const struct limiter_params gc = { LIMITER_GCRA, 4, 2000, 500000, 3000 };
    const struct limiter_params conc = { LIMITER_CONCURRENCY, 2, 500, 0, 0 };
    struct limiter_result r = { 0, 99, 77, INT64_MAX, INT64_MAX };
    limiter_clamp(&r, &sw, 0);
    assert_true(r.limit == 5 && r.remaining == 0 && r.reset_ms == 2000 && r.retry_ms == 2000);
    r = (struct limiter_result){ 1, 5, INT64_MAX, INT64_MIN, INT64_MAX };
    limiter_clamp(&r, &gc, 0);          /* refill 2000 ms, delay 3000 ms */
    assert_true(r.limit == 4 && r.remaining == 4 && r.reset_ms == 0 && r.retry_ms == 3000);
    r = (struct limiter_result){ 0, 5, -3, INT64_MAX, INT64_MAX };
    limiter_clamp(&r, &gc, 0);
    assert_true(r.remaining == 0 && r.reset_ms == 5000 && r.retry_ms == 5000);
    r = (struct limiter_result){ 0, INT64_MAX, 0, 0, INT64_MAX };
    limiter_clamp(&r, &gc, 1);          /* an override's interval is not known here */
    assert_true(r.limit == LIMITER_MAX_LIMIT && r.retry_ms == LIMITER_MAX_TIME_MS + 3000);
    r = (struct limiter_result){ 1, -7, 9, 9, 9 };
    limiter_clamp(&r, &gc, 1);
    assert_true(r.limit == 0 && r.remaining == 0 && r.retry_ms == 9);
    r = (struct limiter_result){ 0, 2, 0, 9, INT64_MAX };
    limiter_clamp(&r, &conc, 0);        /* a denial retries after 1 s, over a short lease */
    assert_true(r.reset_ms == 9 && r.retry_ms == 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_clamp),
        cmocka_unit_test(test_check_changes_nothing),
        cmocka_unit_test(test_other_algorithm_reads_absent),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_huge_cost),
        cmocka_unit_test(test_large_windows),
        cmocka_unit_test(test_log_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
