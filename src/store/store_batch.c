/* sluice - store_batch.c: the EVALSHA encoders and the per-iteration batches.
 *
 * RESP straight into a command buffer (refund.lua's call for one request;
 * limit.lua's batch of many), forming the batches of one loop iteration per
 * node (and slot), sending them at the iteration's end, and splitting each
 * batch's reply back to its requests (through s->ops: store.c's req_take).
 * It calls nothing in store.c. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "rconn.h"
#include "store.h"
#include "store_int.h"

/* ---- the EVALSHA encoder ------------------------------------------------------ */

/* Decimal digits of v (>= 0) written backwards from end; returns the start. */
static char *store_fmt_u64(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

static char *store_put(char *p, const char *src, size_t len)
{
    memcpy(p, src, len);
    return p + len;
}

/* One RESP bulk string: "$LEN\r\nDATA\r\n". */
static char *store_put_bulk(char *p, const char *data, size_t len)
{
    char num[24];
    char *start = store_fmt_u64(num + sizeof(num), len);
    *p++ = '$';
    p = store_put(p, start, (size_t)(num + sizeof(num) - start));
    p = store_put(p, "\r\n", 2);
    p = store_put(p, data, len);
    return store_put(p, "\r\n", 2);
}

static char *store_put_int(char *p, int64_t v)
{
    char num[24];
    char *end = num + sizeof(num);
    char *start = store_fmt_u64(end, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
    if (v < 0)
        *--start = '-';
    return store_put_bulk(p, start, (size_t)(end - start));
}

/* A command buffer of at least need bytes (its old contents dropped). */
static void store_cmd_room(char **buf, size_t *cap, size_t need)
{
    if (*cap >= need)
        return;
    free(*buf);
    *buf = mem_alloc(need);
    *cap = need;
}

static char *store_put_header(char *p, int argc)
{
    char num[24];
    char *start = store_fmt_u64(num + sizeof(num), (uint64_t)argc);
    *p++ = '*';
    p = store_put(p, start, (size_t)(num + sizeof(num) - start));
    return store_put(p, "\r\n", 2);
}

/* refund.lua's call: EVALSHA sha n key_1..key_n args[0..nargs) n
 * (algo limit window_ms interval_us cost last_i)*n for the call's limits
 * li[0..n), straight into q->cmd: RESP as redisFormatCommandArgv would build
 * it, and keeping it lets a retry resend it after the caller's keys are
 * gone. args is the TIME of the decision, last the marks. The buffer grows
 * to the largest request seen, then is reused. (limit.lua's batches:
 * store_batch_encode.) */
void store_batch_encode_evalsha(struct store_req *q, const struct store_call *c,
                                const char *sha, const int *li, int n,
                                const int64_t *args, int nargs, const int64_t *last)
{
    int argc = 3 + n + nargs + 1 + 6 * n;
    /* 24 bytes of bulk framing per argument bound every number's digits too */
    size_t need = 16 + (size_t)argc * (24 + 24) + 80;
    for (int i = 0; i < n; i++)
        need += c->klen[li[i]];
    store_cmd_room(&q->cmd, &q->cmdcap, need);
    char *p = store_put_header(q->cmd, argc);
    p = store_put_bulk(p, "EVALSHA", 7);
    p = store_put_bulk(p, sha, strlen(sha));
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++)
        p = store_put_bulk(p, c->keys + c->koff[li[i]], c->klen[li[i]]);
    for (int i = 0; i < nargs; i++)
        p = store_put_int(p, args[i]);
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++) {
        const struct limiter_params *lp = &c->params[li[i]];
        /* delay: the window's place carries it (flag 4); concurrency: the
         * interval's carries the slot id */
        int64_t window = lp->delay_ms > 0 ? lp->delay_ms : lp->window_ms;
        int64_t interval = lp->algo == LIMITER_CONCURRENCY ? c->slot[li[i]] : lp->interval_us;
        p = store_put_int(p, (int64_t)lp->algo);
        p = store_put_int(p, lp->limit);
        p = store_put_int(p, window);
        p = store_put_int(p, interval);
        p = store_put_int(p, c->cost[li[i]]);
        p = store_put_int(p, last[i]);
    }
    q->cmdlen = (size_t)(p - q->cmd);
    assert(q->cmdlen <= q->cmdcap);
}

/* ---- batches: one EVALSHA per node (and slot) per loop iteration ------------ */

static struct store_batch *store_batch_new(struct store *s, struct store_node *n, int slot,
                                           int asked)
{
    struct store_batch *b = s->free_batches;
    if (b != NULL) {
        s->free_batches = b->next;
    } else {
        b = mem_calloc(1, sizeof(*b));
        b->s = s;
        b->all_next = s->all_batches;
        s->all_batches = b;
    }
    b->node = n;
    b->slot = slot;
    b->asked = asked;
    b->n = 0;
    b->key_bytes = 0;
    b->next = NULL;
    if (s->open_tail != NULL)
        s->open_tail->next = b;
    else
        s->open = b;
    s->open_tail = b;
    return b;
}

static void store_batch_free(struct store_batch *b)
{
    struct store *s = b->s;
    b->n = 0;
    b->next = s->free_batches;
    s->free_batches = b;
}

/* Append q (a call's limits of one slot) to the open batch of its node and
 * slot; a full batch is closed and another opened. ASK'd requests go alone
 * (ASKING holds for one command). Sent by store_batch_flush_cb. */
void store_batch_add(struct store_node *n, struct store_req *q)
{
    struct store *s = q->s;
    const struct store_call *c = q->call;
    struct store_batch **open = q->asked ? NULL :
                                s->mode == STORE_CLUSTER ? &s->slot_open[q->slot] : &s->single_open;
    size_t bytes = 0;
    for (int i = 0; i < q->n; i++)
        bytes += c->klen[q->idx[i]] + (s->rc.overrides ? c->olen[q->idx[i]] : 0);
    struct store_batch *b = open != NULL ? *open : NULL;
    if (b != NULL && (b->node != n || b->n == STORE_BATCH_MAX ||
                      b->key_bytes + bytes > STORE_BATCH_KEY_BYTES))
        b = NULL;
    if (b == NULL) {
        b = store_batch_new(s, n, q->slot, q->asked);
        if (open != NULL)
            *open = b;
    }
    b->req[b->n] = q;
    b->marks[b->n] = c->nreq > 1;
    b->n++;
    b->key_bytes += bytes;
    q->in_hiredis = 1;          /* held by the batch, then by the connection */
    q->node = n;
    event_active(s->flush_ev, EV_TIMEOUT, 0);
}

/* FNV-1a, for the encoder's two small tables. */
static uint32_t store_hash(const void *p, size_t len, uint32_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

/* The index of key k among the batch's distinct keys (added when new). */
static int enc_key(struct store_batch_enc *e, const char *k, size_t len, int16_t *slots)
{
    uint32_t i = store_hash(k, len, 2166136261u) & (STORE_BATCH_HASH - 1);
    for (;; i = (i + 1) & (STORE_BATCH_HASH - 1)) {
        int x = e->khash[i];
        if (x == 0) {
            e->kp[e->nk] = k;
            e->kl[e->nk] = len;
            slots[e->nk] = (int16_t)i;
            e->khash[i] = (int16_t)++e->nk;
            return e->nk - 1;
        }
        if (e->kl[x - 1] == len && memcmp(e->kp[x - 1], k, len) == 0)
            return x - 1;
    }
}

/* A limit's parameter set as limit.lua takes it: a delay (flag 4) goes in
 * the window's place; a concurrency limit's interval is not sent (its slot
 * id travels per request: the set stays shared). A calendar window sends
 * interval 1 and, in f[4..8), the starts of the periods around the
 * proxy's clock now_ms, from which limit.lua takes the one holding Redis
 * TIME. A part of a route's key (one key per route) sends its tag with its
 * algorithm, 16 * part + algo. */
static void enc_values(const struct limiter_params *lp, uint32_t part, int64_t now_ms,
                       int64_t *f)
{
    f[0] = (int64_t)part * 16 + (int64_t)lp->algo;
    f[1] = lp->limit;
    f[2] = lp->delay_ms > 0 ? lp->delay_ms : lp->window_ms;
    f[3] = lp->algo == LIMITER_CONCURRENCY ? 0 : lp->interval_us;
    if (lp->cal != TZCAL_NONE) {
        f[3] = 1;
        tzcal_bounds(lp->tz, lp->cal, now_ms, f + 4);
    }
}

static int enc_calendar(const int64_t *f)
{
    return f[0] % 16 == LIMITER_FIXED_WINDOW && f[3] == 1;
}

/* The index of lp among the batch's distinct parameter sets. */
static int enc_param(struct store_batch_enc *e, const struct limiter_params *lp, uint32_t part,
                     int64_t now_ms, int16_t *slots)
{
    int64_t f[8] = { 0 };
    enc_values(lp, part, now_ms, f);
    uint32_t i = store_hash(f, sizeof(f), 2166136261u) & (STORE_BATCH_HASH - 1);
    for (;; i = (i + 1) & (STORE_BATCH_HASH - 1)) {
        int x = e->phash[i];
        if (x == 0) {
            memcpy(e->pv[e->np], f, sizeof(f));
            slots[e->np] = (int16_t)i;
            e->phash[i] = (int16_t)++e->np;
            return e->np - 1;
        }
        if (memcmp(e->pv[x - 1], f, sizeof(f)) == 0)
            return x - 1;
    }
}

/* The flags limit.lua takes for limit li of c: shadow and check only,
 * 4 delay, 8 override (an override key index follows). */
static int64_t enc_flags(const struct store *s, const struct store_call *c, int li)
{
    return (int64_t)c->flags[li] | (c->params[li].delay_ms > 0 ? 4 : 0) |
           (s->rc.overrides ? 8 : 0);
}

/* A request without marks whose limits all cost 1 (the common case) drops
 * the costs: one limit goes as one argument, 32 + ref, instead of m, ref
 * and cost (returns 1); m limits (2..16) as 15 + m and the refs (returns
 * m). 0: the long form. */
static int store_req_short(const struct store_batch *b, int i)
{
    const struct store_req *q = b->req[i];
    if (b->marks[i] || q->n < 1 || q->n > 16)
        return 0;
    for (int j = 0; j < q->n; j++)
        if (q->call->cost[q->idx[j]] != 1)
            return 0;
    return q->n;
}

/* A request of m (2..16) parts of one key (one key per route), each of
 * cost 1 and the same flags, whose parameter sets came in a row: limit.lua
 * takes its refs as a run, -(16 + m) and the first (entries ne0...). */
static int store_req_run(const struct store_batch_enc *e, const struct store_call *c,
                         const struct store_req *q, int ne0)
{
    for (int j = 0; j < q->n; j++) {
        int li = q->idx[j];
        if (c->part[li] == 0 || e->ki[ne0 + j] != e->ki[ne0] ||
            e->pi[ne0 + j] != e->pi[ne0] + j || c->flags[li] != c->flags[q->idx[0]] ||
            c->params[li].delay_ms > 0)
            return 0;
    }
    return 1;
}

/* limit.lua's batch call into s->bcmd, returning its length:
 *   EVALSHA sha K key_1..key_K d P (algo limit window_ms interval_us)*P
 *           R (m (ref cost [slot] [ovr])*|m| | 32+ref [slot] [ovr]
 *              | 15+m (ref [slot] [ovr])*m | -(16+m) ref)*R
 *           (b0 b1 b2 b3)*C
 * with ref = (key * P + param) * 16 + flags (0-based indexes), slot the
 * concurrency slot id, ovr the 1-based index of the override key (flag 8,
 * redis.overrides), m < 0 for a request whose reply must carry refund
 * marks; 32+ref: a request of one limit of cost 1, 15+m: of m (2..16)
 * limits of cost 1, without marks (store_req_short); -(16+m): of m parts
 * of one key whose refs run from the one sent (store_req_run); a part's
 * parameter set sends 16 * tag + algo; and
 * per calendar parameter set (interval 1), in order, its period starts. See
 * limit.lua. */
static size_t store_batch_encode(struct store_batch *b)
{
    struct store *s = b->s;
    struct store_batch_enc *e = s->enc;
    int16_t *kslots = e->kslot, *pslots = e->pslot;
    int ne = 0, extra = 0;
    int64_t now_ms = clock_wall_us() / 1000;
    unsigned char run[STORE_BATCH_MAX] = { 0 };
    e->nk = e->np = 0;
    for (int i = 0; i < b->n; i++) {
        const struct store_req *q = b->req[i];
        const struct store_call *c = q->call;
        int sf = store_req_short(b, i), ne0 = ne;
        if (sf == 1)
            extra -= 2;             /* no m, no cost */
        else if (sf > 1)
            extra -= sf;            /* no costs */
        for (int j = 0; j < q->n; j++, ne++) {
            int li = q->idx[j];
            e->ki[ne] = enc_key(e, c->keys + c->koff[li], c->klen[li], kslots);
            e->pi[ne] = enc_param(e, &c->params[li], c->part[li], now_ms, pslots);
            e->oi[ne] = -1;
            if (s->rc.overrides) {
                e->oi[ne] = enc_key(e, c->keys + c->ooff[li], c->olen[li], kslots);
                extra++;
            }
            if (c->params[li].algo == LIMITER_CONCURRENCY)
                extra++;
        }
        run[i] = sf > 1 && !s->rc.overrides && store_req_run(e, c, q, ne0);
        if (run[i])
            extra -= q->n - 1;      /* -(16 + m) and the first ref */
    }
    for (int k = 0; k < e->np; k++)
        extra += enc_calendar(e->pv[k]) ? 4 : 0;       /* a calendar window's periods */
    size_t key_bytes = 0;
    for (int k = 0; k < e->nk; k++)
        key_bytes += e->kl[k];
    int argc = 3 + e->nk + 2 + 4 * e->np + 1 + b->n + 2 * ne + extra;
    /* 24 bytes of bulk framing per argument bound every number's digits too */
    size_t need = 16 + (size_t)argc * (24 + 24) + key_bytes + 80;
    store_cmd_room(&s->bcmd, &s->bcmdcap, need);
    char *p = store_put_header(s->bcmd, argc);
    p = store_put_bulk(p, "EVALSHA", 7);
    p = store_put_bulk(p, limit_lua_sha, strlen(limit_lua_sha));
    p = store_put_int(p, e->nk);
    for (int k = 0; k < e->nk; k++)
        p = store_put_bulk(p, e->kp[k], e->kl[k]);
    p = store_put_bulk(p, "d", 1);
    p = store_put_int(p, e->np);
    for (int k = 0; k < e->np; k++)
        for (int f = 0; f < 4; f++)
            p = store_put_int(p, e->pv[k][f]);
    p = store_put_int(p, b->n);
    ne = 0;
    for (int i = 0; i < b->n; i++) {
        const struct store_req *q = b->req[i];
        const struct store_call *c = q->call;
        int sf = store_req_short(b, i), short_form = sf == 1;
        if (run[i]) {
            p = store_put_int(p, -16 - q->n);
            p = store_put_int(p, ((int64_t)e->ki[ne] * e->np + e->pi[ne]) * 16 +
                                 enc_flags(s, c, q->idx[0]));
            ne += q->n;
            continue;
        }
        if (sf > 1)
            p = store_put_int(p, 15 + q->n);
        else if (!short_form)
            p = store_put_int(p, b->marks[i] ? -q->n : q->n);
        for (int j = 0; j < q->n; j++, ne++) {
            int li = q->idx[j];
            int64_t ref = ((int64_t)e->ki[ne] * e->np + e->pi[ne]) * 16 + enc_flags(s, c, li);
            if (short_form) {
                p = store_put_int(p, 32 + ref);
            } else {
                p = store_put_int(p, ref);
                if (sf == 0)
                    p = store_put_int(p, c->cost[li]);
            }
            if (c->params[li].algo == LIMITER_CONCURRENCY)
                p = store_put_int(p, c->slot[li]);
            if (e->oi[ne] >= 0)
                p = store_put_int(p, e->oi[ne] + 1);
        }
    }
    for (int k = 0; k < e->np; k++)
        for (int f = 4; f < 8 && enc_calendar(e->pv[k]); f++)
            p = store_put_int(p, e->pv[k][f]);
    for (int k = 0; k < e->nk; k++)
        e->khash[kslots[k]] = 0;
    for (int k = 0; k < e->np; k++)
        e->phash[pslots[k]] = 0;
    size_t len = (size_t)(p - s->bcmd);
    assert(len <= s->bcmdcap);
    return len;
}

/* How many integers limit.lua answers for limit li of c: v, reset_ms
 * [, mark] [, wait_ms (delay)] [, limit (overrides)]. */
static size_t store_reply_width(const struct store *s, const struct store_call *c, int li,
                                int marks)
{
    return 2 + (marks ? 1 : 0) + (c->params[li].delay_ms > 0 ? 1 : 0) +
           (s->rc.overrides ? 1 : 0);
}

static size_t store_req_width(const struct store_req *q, int marks)
{
    size_t w = 0;
    for (int i = 0; i < q->n; i++)
        w += store_reply_width(q->s, q->call, q->idx[i], marks);
    return w;
}

/* The batch's reply width: { time_s, time_us, then per request and limit:
 * v, reset_ms [, mark] [, wait_ms] [, limit] }, all integers. */
static size_t store_batch_width(const struct store_batch *b)
{
    size_t want = 2;
    for (int i = 0; i < b->n; i++)
        want += store_req_width(b->req[i], b->marks[i]);
    return want;
}

/* Its integers (b->ints, rconn_send_ints) when the reply has that shape. */
static const long long *store_batch_readable(const struct store_batch *b,
                                             const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ARRAY || reply->element != NULL ||
        reply->elements != store_batch_width(b))
        return NULL;
    return b->ints;
}

/* Request q's fields of a readable batch reply, from `at`: v = remaining
 * when the limit allows, -retry_ms when it denies; an admitted delayed
 * request's retry_ms is its wait. The limit an override applied is kept in
 * c->params too: a refund caps at it. */
void store_batch_parse(struct store_req *q, const long long *v, size_t at, int marks)
{
    struct store_call *c = q->call;
    q->allowed = 1;
    for (int i = 0; i < q->n; i++) {
        const long long *e = v + at;
        int li = q->idx[i];
        struct limiter_result *r = &c->res.r[li];
        long long rv = e[0];
        size_t x = 2;
        at += store_reply_width(q->s, c, li, marks);
        r->allowed = rv >= 0;
        r->remaining = rv >= 0 ? rv : 0;
        r->reset_ms = e[1];
        r->retry_ms = rv >= 0 ? 0 : rv < -INT64_MAX ? INT64_MAX : -rv;     /* clamped below */
        if (!r->allowed && !(c->flags[li] & STORE_SHADOW))
            q->allowed = 0;
        if (marks)
            q->mark[i] = e[x++];
        if (c->params[li].delay_ms > 0 && rv >= 0)
            r->retry_ms = e[x];
        if (c->params[li].delay_ms > 0)
            x++;
        r->limit = q->s->rc.overrides ? e[x] : c->params[li].limit;
        /* the reply's numbers are Redis's word: bounded here, once */
        limiter_clamp(r, &c->params[li], q->s->rc.overrides);
        c->params[li].limit = r->limit;
    }
    q->time_s = v[0];
    q->time_us = v[1];
    c->res.time_us = v[0] * 1000000 + v[1];
}

static void store_batch_cb(struct rconn *ac, redisReply *reply, void *privdata)
{
    struct store_batch *b = privdata;
    struct store *s = b->s;
    struct store_node *n = rconn_data(ac);
    if (s->destroying)
        return;                 /* store_destroy() frees every batch */
    store_node_got_reply(n);
    if (reply == NULL)
        store_node_set_ready(n, 0);   /* the connection is going away */
    const long long *v = reply != NULL && reply->type != REDIS_REPLY_ERROR ?
                         store_batch_readable(b, reply) : NULL;
    size_t at = 2;
    for (int i = 0; i < b->n; i++) {
        struct store_req *q = b->req[i];
        size_t mine = at;
        /* q's call may be reused by a callback once q is released */
        at += store_req_width(q, b->marks[i]);
        q->in_hiredis = 0;
        s->ops->req_take(q, n, reply, v, mine, b->marks[i]);
    }
    store_batch_free(b);
}

/* A batch that could not be sent: each of its requests waits or fails
 * (store.c's req_unsent). */
static void store_batch_unsent(struct store_batch *b)
{
    struct store *s = b->s;
    for (int i = 0; i < b->n; i++) {
        struct store_req *q = b->req[i];
        q->in_hiredis = 0;
        s->ops->req_unsent(q);
    }
    store_batch_free(b);
}

static void store_batch_send(struct store_batch *b)
{
    struct store_node *n = b->node;
    if (!n->ready || n->ac == NULL)
        goto fail;
    size_t len = store_batch_encode(b);
    if (b->asked) {
        if (store_node_asking(n) != 0)
            goto fail;
    }
    /* the reply's integers are parsed straight into b->ints */
    size_t width = store_batch_width(b);
    if (b->intcap < width) {
        free(b->ints);
        b->intcap = width > 64 ? width : 64;
        b->ints = mem_alloc(b->intcap * sizeof(*b->ints));
    }
    if (rconn_send_ints(n->ac, b->s->bcmd, len, b->ints, width, store_batch_cb, b) != 0)
        goto fail;
    store_node_expect_reply(n);
    metrics_batch(b->n);
    return;
fail:
    log_debug("store: batch of %d not sent to '%s': not connected", b->n, n->name);
    store_batch_unsent(b);
}

/* Every batch opened since the last flush goes out, in order. Callbacks of
 * unsent ones may open new batches: those wait for the next flush. */
void store_batch_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    struct store_batch *b = s->open;
    s->open = s->open_tail = NULL;
    s->single_open = NULL;
    for (struct store_batch *x = b; x != NULL; x = x->next)
        if (s->slot_open != NULL && x->slot >= 0 && s->slot_open[x->slot] == x)
            s->slot_open[x->slot] = NULL;
    while (b != NULL) {
        struct store_batch *next = b->next;
        store_batch_send(b);
        b = next;
    }
}
