/* sluice - MIT licence.
 * admin_console.c: /api/top, /api/stats and the dashboard (GET /).
 *
 *   worker thread: denial -> its own space-saving summary (64 counters per
 *                  60 s epoch, two epochs, under a lock only the admin shares)
 *   admin thread:  every second, metrics counters -> a ring of 60 x 5 s
 *                  buckets per route; on a request, the summaries merged
 *                  and the ring rendered as JSON
 *
 * Memory is fixed: a summary never grows with the keys it sees (a new key
 * takes over the smallest counter, space-saving), the ring has a fixed
 * number of routes and buckets. Keys are client bytes: kept bounded
 * (ADMIN_CONSOLE_KEY_MAX), written with esc.c's JSON escaping, and shown by
 * the page with textContent only. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "admin_console.h"
#include "clock.h"
#include "conf.h"
#include "digest.h"
#include "esc.h"
#include "kvtable.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"

#define CONSOLE_MAX_WORKERS 1024        /* conf.c's bound on workers */
#define CONSOLE_TOP_KEYS    10          /* keys per limit in /api/top and /api/stats */
#define CONSOLE_TOP_LIMITS  64          /* limits shown in /api/top */
#define CONSOLE_LATENCY_BUCKETS 12      /* p50/p99 over the last 12 x 5 s */

/* The page, its script and style: build/web_assets.c, from src/web/. */
extern const unsigned char web_dashboard_html[], web_dashboard_js[], web_dashboard_css[];
extern const unsigned long web_dashboard_html_len, web_dashboard_js_len, web_dashboard_css_len;

/* ---- the heavy-hitter summaries (one per worker) ---- */

struct hh_entry {
    uint64_t hash;                      /* of the whole Redis key: its identity */
    uint64_t count;                     /* denials counted (an overestimate by at most err) */
    uint64_t err;                       /* the count of the key it took over */
    uint16_t klen;
    uint8_t rlen, llen, cut;            /* cut: the key was longer than kept */
    unsigned secret;                    /* bit i: part i shown hashed */
    char route[ADMIN_CONSOLE_NAME_MAX];
    char limit[ADMIN_CONSOLE_NAME_MAX];
    char key[ADMIN_CONSOLE_KEY_MAX];    /* the key's parts, "LEN:BYTES..." */
};

struct hh_epoch {
    int64_t id;                         /* clock_ms() / ADMIN_CONSOLE_EPOCH_MS */
    int n;
    struct hh_entry e[ADMIN_CONSOLE_COUNTERS];
};

struct hh_worker {
    pthread_mutex_t lock;               /* the worker's; the admin thread's while merging */
    struct hh_epoch ep[2];              /* ep[id & 1] */
};

static struct hh_worker *_Atomic hh_workers[CONSOLE_MAX_WORKERS];
static _Thread_local struct hh_worker *hh_self;

/* A key's identity is its keyed hash (kvtable.h's SipHash): keys are client
 * bytes, and an unkeyed hash would let one pose as another. One key for
 * every worker, so their summaries merge. */
static struct kvtable_key hh_key;
static pthread_once_t hh_key_once = PTHREAD_ONCE_INIT;

static void hh_key_make(void)
{
    kvtable_key_init(&hh_key);
}

void admin_console_worker(int id)
{
    if (id < 0 || id >= CONSOLE_MAX_WORKERS)
        return;
    pthread_once(&hh_key_once, hh_key_make);
    struct hh_worker *w = atomic_load(&hh_workers[id]);
    if (w == NULL) {
        w = mem_calloc(1, sizeof(*w));
        pthread_mutex_init(&w->lock, NULL);
        w->ep[0].id = w->ep[1].id = -2;
        atomic_store(&hh_workers[id], w);
    }
    hh_self = w;
}

void admin_console_shutdown(void)
{
    hh_self = NULL;                     /* the calling thread's, if a worker's */
    for (int i = 0; i < CONSOLE_MAX_WORKERS; i++) {
        struct hh_worker *w = atomic_exchange(&hh_workers[i], NULL);
        if (w) {
            pthread_mutex_destroy(&w->lock);
            free(w);
        }
    }
}


static void entry_fill(struct hh_entry *e, uint64_t hash, const char *route, const char *limit,
                       const char *parts, size_t plen, unsigned secret)
{
    size_t rl = strlen(route), ll = strlen(limit);
    e->hash = hash;
    e->rlen = (uint8_t)(rl < ADMIN_CONSOLE_NAME_MAX ? rl : ADMIN_CONSOLE_NAME_MAX);
    e->llen = (uint8_t)(ll < ADMIN_CONSOLE_NAME_MAX ? ll : ADMIN_CONSOLE_NAME_MAX);
    memcpy(e->route, route, e->rlen);
    memcpy(e->limit, limit, e->llen);
    e->cut = plen > ADMIN_CONSOLE_KEY_MAX;
    e->klen = (uint16_t)(e->cut ? ADMIN_CONSOLE_KEY_MAX : plen);
    memcpy(e->key, parts, e->klen);
    e->secret = secret;
}

/* Space-saving: a known key counts one more; a new one takes a free counter,
 * or the smallest, inheriting its count as its error. */
static void epoch_count(struct hh_epoch *ep, uint64_t hash, const char *route,
                        const char *limit, const char *parts, size_t plen, unsigned secret)
{
    int min = 0;
    for (int i = 0; i < ep->n; i++) {
        if (ep->e[i].hash == hash) {
            ep->e[i].count++;
            return;
        }
        if (ep->e[i].count < ep->e[min].count)
            min = i;
    }
    struct hh_entry *e;
    uint64_t base = 0;
    if (ep->n < ADMIN_CONSOLE_COUNTERS) {
        e = &ep->e[ep->n++];
    } else {
        e = &ep->e[min];
        base = e->count;
    }
    entry_fill(e, hash, route, limit, parts, plen, secret);
    e->count = base + 1;
    e->err = base;
}

void admin_console_denied(const char *route, const char *limit, size_t prefix_len,
                          const char *key, size_t len, unsigned secret)
{
    struct hh_worker *w = hh_self;
    if (w == NULL)
        return;
    /* PREFIX{ROUTE|LIMIT|PARTS}: keep PARTS, the client's values. */
    size_t off = prefix_len + strlen(route) + strlen(limit) + 3, end = len;
    if (end > 0 && key[end - 1] == '}')
        end--;
    if (off > end)
        off = 0;
    uint64_t hash = kvtable_hash(&hh_key, key, len);
    int64_t id = clock_ms() / ADMIN_CONSOLE_EPOCH_MS;
    pthread_mutex_lock(&w->lock);
    struct hh_epoch *ep = &w->ep[id & 1];
    if (ep->id != id) {
        ep->id = id;
        ep->n = 0;
    }
    epoch_count(ep, hash, route, limit, key + off, end - off, secret);
    pthread_mutex_unlock(&w->lock);
}

/* ---- merging them ---- */

struct hh_merged {
    struct hh_entry *e;
    size_t n;
    int workers;                        /* summaries merged */
};

static int by_identity(const void *a, const void *b)
{
    const struct hh_entry *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return 0;
}

static int by_count(const void *a, const void *b)
{
    const struct hh_entry *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Every worker's current and previous epoch, the same key summed: counts
 * (and errors) add up, since each worker saw its own requests. */
static void hh_merge(struct hh_merged *m)
{
    int64_t id = clock_ms() / ADMIN_CONSOLE_EPOCH_MS;
    size_t cap = 0;
    memset(m, 0, sizeof(*m));
    for (int i = 0; i < CONSOLE_MAX_WORKERS; i++)
        if (atomic_load(&hh_workers[i]) != NULL)
            cap += 2 * ADMIN_CONSOLE_COUNTERS;
    if (cap == 0)
        return;
    m->e = mem_alloc(cap * sizeof(*m->e));
    for (int i = 0; i < CONSOLE_MAX_WORKERS; i++) {
        struct hh_worker *w = atomic_load(&hh_workers[i]);
        if (w == NULL || m->n + 2 * ADMIN_CONSOLE_COUNTERS > cap)
            continue;       /* none, or one that started since cap was counted */
        m->workers++;
        pthread_mutex_lock(&w->lock);
        for (int k = 0; k < 2; k++) {
            const struct hh_epoch *ep = &w->ep[k];
            if (ep->id != id && ep->id != id - 1)
                continue;
            memcpy(m->e + m->n, ep->e, (size_t)ep->n * sizeof(*m->e));
            m->n += (size_t)ep->n;
        }
        pthread_mutex_unlock(&w->lock);
    }
    qsort(m->e, m->n, sizeof(*m->e), by_identity);
    size_t out = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (out > 0 && m->e[out - 1].hash == m->e[i].hash) {
            m->e[out - 1].count += m->e[i].count;
            m->e[out - 1].err += m->e[i].err;
            continue;
        }
        if (out != i)
            m->e[out] = m->e[i];
        out++;
    }
    m->n = out;
    qsort(m->e, m->n, sizeof(*m->e), by_count);
}

/* ---- JSON ---- */

static void json_str(struct evbuffer *out, const char *s, size_t n)
{
    char buf[ESC_MAX(64)];
    evbuffer_add(out, "\"", 1);
    for (size_t i = 0; i < n; i += 64) {
        size_t k = n - i < 64 ? n - i : 64;
        evbuffer_add(out, buf, (size_t)(esc_put(buf, s + i, k, ESC_JSON) - buf));
    }
    evbuffer_add(out, "\"", 1);
}

/* The kept parts "LEN:BYTES..." as a JSON array of strings; a part cut
 * short by the bound ends the array. */
static void json_key_parts(struct evbuffer *out, const struct hh_entry *e)
{
    size_t p = 0, n = e->klen;
    int first = 1, part = 0;
    evbuffer_add(out, "[", 1);
    while (p < n) {
        size_t len = 0, q = p;
        while (q < n && q - p < 6 && e->key[q] >= '0' && e->key[q] <= '9')
            len = len * 10 + (size_t)(e->key[q++] - '0');
        if (q == p || q >= n || e->key[q] != ':') {     /* not parts: as it is */
            len = n - p;
            q = p - 1;
        }
        q++;
        if (len > n - q)
            len = n - q;
        if (!first)
            evbuffer_add(out, ",", 1);
        first = 0;
        if (part < 32 && (e->secret >> part & 1)) {     /* a credential: its hash */
            char hex[DIGEST_SHA1_HEX + 1];
            digest_sha1_hex(e->key + q, len, hex);
            evbuffer_add_printf(out, "\"sha1:%.12s\"", hex);
        } else {
            json_str(out, e->key + q, len);
        }
        part++;
        p = q + len;
    }
    evbuffer_add(out, "]", 1);
}

static void json_entry(struct evbuffer *out, const struct hh_entry *e, int with_names)
{
    evbuffer_add(out, "{", 1);
    if (with_names) {
        evbuffer_add_printf(out, "\"route\":");
        json_str(out, e->route, e->rlen);
        evbuffer_add_printf(out, ",\"limit\":");
        json_str(out, e->limit, e->llen);
        evbuffer_add(out, ",", 1);
    }
    evbuffer_add_printf(out, "\"key\":");
    json_key_parts(out, e);
    evbuffer_add_printf(out, ",\"count\":%llu,\"error\":%llu,\"truncated\":%s}",
                        (unsigned long long)e->count, (unsigned long long)e->err,
                        e->cut ? "true" : "false");
}

static int same_limit(const struct hh_entry *a, const struct hh_entry *b)
{
    return a->rlen == b->rlen && a->llen == b->llen && memcmp(a->route, b->route, a->rlen) == 0 &&
           memcmp(a->limit, b->limit, a->llen) == 0;
}

/* Per route and limit, the limit whose top key was denied most first. */
static void render_top(struct evbuffer *out)
{
    struct hh_merged m;
    hh_merge(&m);
    evbuffer_add_printf(out, "{\"epoch_s\":%d,\"window_s\":%d,\"counters_per_worker\":%d,"
                        "\"workers\":%d,\"tracked\":%zu,\"limits\":[",
                        ADMIN_CONSOLE_EPOCH_MS / 1000, 2 * ADMIN_CONSOLE_EPOCH_MS / 1000,
                        ADMIN_CONSOLE_COUNTERS, m.workers, m.n);
    size_t leads[CONSOLE_TOP_LIMITS];
    int nleads = 0;
    for (size_t i = 0; i < m.n && nleads < CONSOLE_TOP_LIMITS; i++) {
        int seen = 0;
        for (int g = 0; g < nleads && !seen; g++)
            seen = same_limit(&m.e[leads[g]], &m.e[i]);
        if (seen)
            continue;
        leads[nleads] = i;
        const struct hh_entry *lead = &m.e[i];
        evbuffer_add_printf(out, "%s{\"route\":", nleads++ ? "," : "");
        json_str(out, lead->route, lead->rlen);
        evbuffer_add_printf(out, ",\"limit\":");
        json_str(out, lead->limit, lead->llen);
        evbuffer_add_printf(out, ",\"keys\":[");
        int k = 0;
        for (size_t j = i; j < m.n && k < CONSOLE_TOP_KEYS; j++) {
            if (!same_limit(lead, &m.e[j]))
                continue;
            if (k++)
                evbuffer_add(out, ",", 1);
            json_entry(out, &m.e[j], 0);
        }
        evbuffer_add_printf(out, "]}");
    }
    evbuffer_add_printf(out, "]}\n");
    free(m.e);
}

/* ---- the config's loads ---- */

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int ok;
    int64_t at_us, loaded_us, took_us;  /* wall clock; conf_load's time */
    char err[512];
} load_state = { .ok = 1 };

void admin_console_config_loaded(int ok, const char *err, int64_t took_us)
{
    int64_t now = clock_wall_us();
    metrics_config_load(ok, now);
    pthread_mutex_lock(&load_lock);
    load_state.ok = ok;
    load_state.at_us = now;
    load_state.took_us = took_us;
    if (ok)
        load_state.loaded_us = now;
    snprintf(load_state.err, sizeof(load_state.err), "%s", ok || err == NULL ? "" : err);
    pthread_mutex_unlock(&load_lock);
}

/* ---- the ring of per-route counts ---- */

struct ring_route {
    char *name;
    uint64_t base[METRICS_NDECISIONS];      /* cumulative at the current bucket's start */
    uint64_t now[METRICS_NDECISIONS];       /* cumulative at the last sample */
    uint64_t b[ADMIN_CONSOLE_BUCKETS][METRICS_NDECISIONS];
};

enum { RING_DENY_HITS, RING_REDIS_ERRORS, RING_NCOUNTERS };

struct admin_console {
    struct event *tick;
    int64_t start_ms, first_id, cur_id;     /* bucket ids: clock_ms() / BUCKET_MS */
    int nroutes, routes_left_out;
    struct ring_route route[ADMIN_CONSOLE_ROUTES];
    uint64_t cbase[RING_NCOUNTERS], cb[ADMIN_CONSOLE_BUCKETS][RING_NCOUNTERS];
    uint64_t hsnap[ADMIN_CONSOLE_BUCKETS][METRICS_MAX_BUCKETS];    /* at each bucket's start */
    _Atomic int workers, backend;
};

static uint64_t counter_now(int which)
{
    return metrics_counter_get(which == RING_DENY_HITS ? METRICS_DENY_CACHE_HITS
                                                      : METRICS_REDIS_ERRORS);
}

static void sample_route(void *arg, const char *name, const uint64_t *d)
{
    struct admin_console *ac = arg;
    struct ring_route *r = NULL;
    for (int i = 0; i < ac->nroutes && r == NULL; i++)
        if (strcmp(ac->route[i].name, name) == 0)
            r = &ac->route[i];
    if (r == NULL) {
        if (ac->nroutes == ADMIN_CONSOLE_ROUTES) {
            ac->routes_left_out = 1;
            return;
        }
        r = &ac->route[ac->nroutes++];      /* zeroed: its counts since it was made */
        r->name = mem_strndup(name, strlen(name));
    }
    memcpy(r->now, d, sizeof(r->now));
}

/* Close the buckets that ended since the last sample (a late timer leaves
 * zeros in the ones it skipped), then take the new cumulative counts. */
static void sample(struct admin_console *ac)
{
    metrics_routes_each(sample_route, ac);
    int64_t id = clock_ms() / ADMIN_CONSOLE_BUCKET_MS;
    if (id == ac->cur_id)
        return;
    for (int64_t k = ac->cur_id; k < id && k < ac->cur_id + ADMIN_CONSOLE_BUCKETS; k++) {
        int slot = (int)(k % ADMIN_CONSOLE_BUCKETS), first = k == ac->cur_id;
        for (int i = 0; i < ac->nroutes; i++)
            for (int d = 0; d < METRICS_NDECISIONS; d++)
                ac->route[i].b[slot][d] = first ? ac->route[i].now[d] - ac->route[i].base[d] : 0;
        for (int c = 0; c < RING_NCOUNTERS; c++)
            ac->cb[slot][c] = first ? counter_now(c) - ac->cbase[c] : 0;
    }
    for (int i = 0; i < ac->nroutes; i++)
        memcpy(ac->route[i].base, ac->route[i].now, sizeof(ac->route[i].base));
    for (int c = 0; c < RING_NCOUNTERS; c++)
        ac->cbase[c] = counter_now(c);
    const int64_t *bounds;
    metrics_hist_read(METRICS_REDIS_SECONDS, ac->hsnap[id % ADMIN_CONSOLE_BUCKETS], &bounds);
    ac->cur_id = id;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    sample(arg);
}

struct admin_console *admin_console_create(struct event_base *base, const struct conf *conf)
{
    struct admin_console *ac = mem_calloc(1, sizeof(*ac));
    ac->start_ms = clock_ms();
    ac->cur_id = ac->first_id = ac->start_ms / ADMIN_CONSOLE_BUCKET_MS;
    const int64_t *bounds;
    metrics_hist_read(METRICS_REDIS_SECONDS, ac->hsnap[ac->cur_id % ADMIN_CONSOLE_BUCKETS],
                      &bounds);
    admin_console_reload(ac, conf);
    ac->tick = event_new(base, -1, EV_PERSIST, tick_cb, ac);
    if (ac->tick == NULL)
        abort();
    struct timeval tv = clock_timeval(1000);
    evtimer_add(ac->tick, &tv);
    return ac;
}

void admin_console_destroy(struct admin_console *ac)
{
    if (ac == NULL)
        return;
    event_free(ac->tick);
    for (int i = 0; i < ac->nroutes; i++)
        free(ac->route[i].name);
    free(ac);
}

void admin_console_reload(struct admin_console *ac, const struct conf *conf)
{
    if (ac == NULL)
        return;
    atomic_store(&ac->workers, conf->workers);
    atomic_store(&ac->backend, (int)conf->backend);
}

/* ---- /api/stats ---- */

/* Bucket id k's slot, or -1 before the console started. */
static int slot_of(const struct admin_console *ac, int64_t k)
{
    return k < ac->first_id ? -1 : (int)(k % ADMIN_CONSOLE_BUCKETS);
}

/* Decision d of route r over the ring, oldest first; the current bucket
 * is live (counts so far). d < 0: none (a decision this build lacks). */
static void render_series(struct evbuffer *out, const struct admin_console *ac,
                          const struct ring_route *r, int d, uint64_t *sum)
{
    *sum = 0;
    evbuffer_add(out, "[", 1);
    for (int64_t k = ac->cur_id - ADMIN_CONSOLE_BUCKETS + 1; k <= ac->cur_id; k++) {
        int slot = slot_of(ac, k);
        uint64_t v = 0;
        if (d >= 0 && k == ac->cur_id)
            v = r->now[d] - r->base[d];
        else if (d >= 0 && slot >= 0)
            v = r->b[slot][d];
        *sum += v;
        evbuffer_add_printf(out, "%s%llu", k == ac->cur_id - ADMIN_CONSOLE_BUCKETS + 1 ? "" : ",",
                            (unsigned long long)v);
    }
    evbuffer_add(out, "]", 1);
}

static void render_routes(struct evbuffer *out, const struct admin_console *ac)
{
    evbuffer_add_printf(out, "\"routes\":[");
    for (int i = 0; i < ac->nroutes; i++) {
        const struct ring_route *r = &ac->route[i];
        uint64_t sums[METRICS_NDECISIONS + 1], total = 0;
        int have_delayed = 0;
        evbuffer_add_printf(out, "%s{\"route\":", i ? "," : "");
        json_str(out, r->name, strlen(r->name));
        evbuffer_add_printf(out, ",\"series\":{");
        for (int d = 0; d < METRICS_NDECISIONS; d++) {
            const char *name = metrics_decision_name(d);
            have_delayed |= strcmp(name, "delayed") == 0;
            evbuffer_add_printf(out, "%s\"%s\":", d ? "," : "", name);
            render_series(out, ac, r, d, &sums[d]);
        }
        if (!have_delayed) {                /* always there for the page */
            evbuffer_add_printf(out, ",\"delayed\":");
            render_series(out, ac, r, -1, &sums[METRICS_NDECISIONS]);
        }
        evbuffer_add_printf(out, "},\"window\":{");
        for (int d = 0; d < METRICS_NDECISIONS; d++)
            evbuffer_add_printf(out, "%s\"%s\":%llu", d ? "," : "", metrics_decision_name(d),
                                (unsigned long long)sums[d]);
        if (!have_delayed)
            evbuffer_add_printf(out, ",\"delayed\":0");
        evbuffer_add_printf(out, "},\"total\":{");
        for (int d = 0; d < METRICS_NDECISIONS; d++) {
            evbuffer_add_printf(out, "%s\"%s\":%llu", d ? "," : "", metrics_decision_name(d),
                                (unsigned long long)r->now[d]);
            total += r->now[d];
        }
        evbuffer_add_printf(out, "%s,\"requests\":%llu}}", have_delayed ? "" : ",\"delayed\":0",
                            (unsigned long long)total);
    }
    evbuffer_add_printf(out, "],\"routes_left_out\":%s,", ac->routes_left_out ? "true" : "false");
}

/* Quantile q of a histogram's bucket counts, as histogram_quantile()
 * does: linear within the bucket; in +Inf, the last finite bound. ms. */
static double quantile_ms(const uint64_t *c, int nb, const int64_t *bounds, uint64_t total, double q)
{
    double rank = q * (double)total, cum = 0;
    for (int b = 0; b < nb; b++) {
        if (cum + (double)c[b] >= rank && c[b] > 0) {
            if (b == nb - 1)
                return (double)bounds[nb - 2] / 1000.0;
            double lo = b ? (double)bounds[b - 1] : 0, hi = (double)bounds[b];
            return (lo + (hi - lo) * (rank - cum) / (double)c[b]) / 1000.0;
        }
        cum += (double)c[b];
    }
    return 0;
}

static void render_redis(struct evbuffer *out, const struct admin_console *ac)
{
    uint64_t now[METRICS_MAX_BUCKETS], d[METRICS_MAX_BUCKETS], total = 0;
    const int64_t *bounds;
    int nb = metrics_hist_read(METRICS_REDIS_SECONDS, now, &bounds);
    int64_t from = ac->cur_id - CONSOLE_LATENCY_BUCKETS + 1;
    if (from < ac->first_id)
        from = ac->first_id;
    const uint64_t *snap = ac->hsnap[from % ADMIN_CONSOLE_BUCKETS];
    for (int b = 0; b < nb; b++)
        total += d[b] = now[b] - snap[b];
    int workers = atomic_load(&ac->workers);
    int64_t up = metrics_gauge_get(METRICS_REDIS_CONNECTED);
    int memory = atomic_load(&ac->backend) == CONF_BACKEND_MEMORY;
    const char *state = memory ? "memory backend" : up <= 0 ? "down" : up < workers ? "partial" : "up";
    evbuffer_add_printf(out, "\"redis\":{\"backend\":\"%s\",\"state\":\"%s\",\"connected\":%lld,"
                        "\"requests_total\":%llu,\"errors_total\":%llu,"
                        "\"latency_ms\":{\"window_s\":%lld,\"samples\":%llu,",
                        memory ? "memory" : "redis", state, (long long)up,
                        (unsigned long long)metrics_counter_get(METRICS_REDIS_REQUESTS),
                        (unsigned long long)metrics_counter_get(METRICS_REDIS_ERRORS),
                        (long long)((ac->cur_id - from + 1) * ADMIN_CONSOLE_BUCKET_MS / 1000),
                        (unsigned long long)total);
    if (total == 0)
        evbuffer_add_printf(out, "\"p50\":null,\"p99\":null}},");
    else
        evbuffer_add_printf(out, "\"p50\":%.3f,\"p99\":%.3f}},",
                            quantile_ms(d, nb, bounds, total, 0.5),
                            quantile_ms(d, nb, bounds, total, 0.99));
}

static void render_counters(struct evbuffer *out, const struct admin_console *ac)
{
    uint64_t sum = 0;
    evbuffer_add_printf(out, "\"deny_cache\":{\"hits_total\":%llu,\"series\":[",
                        (unsigned long long)counter_now(RING_DENY_HITS));
    for (int64_t k = ac->cur_id - ADMIN_CONSOLE_BUCKETS + 1; k <= ac->cur_id; k++) {
        int slot = slot_of(ac, k);
        uint64_t v = k == ac->cur_id ? counter_now(RING_DENY_HITS) - ac->cbase[RING_DENY_HITS]
                     : slot >= 0 ? ac->cb[slot][RING_DENY_HITS] : 0;
        sum += v;
        evbuffer_add_printf(out, "%s%llu", k == ac->cur_id - ADMIN_CONSOLE_BUCKETS + 1 ? "" : ",",
                            (unsigned long long)v);
    }
    evbuffer_add_printf(out, "],\"hits_window\":%llu},", (unsigned long long)sum);
    evbuffer_add_printf(out, "\"workers\":%d,\"connections\":{\"client\":%lld,\"upstream\":%lld},",
                        atomic_load(&ac->workers),
                        (long long)metrics_gauge_get(METRICS_CONN_CLIENT),
                        (long long)metrics_gauge_get(METRICS_CONN_UPSTREAM));
}

static void render_config(struct evbuffer *out)
{
    pthread_mutex_lock(&load_lock);
    evbuffer_add_printf(out, "\"config\":{\"loaded_at\":%.3f,\"load_ms\":%.3f,"
                        "\"last_reload\":{\"ok\":%s,\"at\":%.3f,\"error\":",
                        (double)load_state.loaded_us / 1e6, (double)load_state.took_us / 1e3,
                        load_state.ok ? "true" : "false", (double)load_state.at_us / 1e6);
    if (load_state.ok)
        evbuffer_add_printf(out, "null");
    else
        json_str(out, load_state.err, strlen(load_state.err));
    pthread_mutex_unlock(&load_lock);
    evbuffer_add_printf(out, "},\"reloads\":{\"ok\":%llu,\"failed\":%llu}}",
                        (unsigned long long)metrics_counter_get(METRICS_RELOADS_OK),
                        (unsigned long long)metrics_counter_get(METRICS_RELOADS_FAILED));
}

static void render_stats(struct admin_console *ac, struct evbuffer *out)
{
    sample(ac);                             /* the counts up to now */
    evbuffer_add_printf(out, "{\"now\":%.3f,\"uptime_s\":%lld,\"bucket_s\":%d,\"buckets\":%d,",
                        (double)clock_wall_us() / 1e6,
                        (long long)((clock_ms() - ac->start_ms) / 1000),
                        ADMIN_CONSOLE_BUCKET_MS / 1000, ADMIN_CONSOLE_BUCKETS);
    render_routes(out, ac);
    render_redis(out, ac);
    render_counters(out, ac);
    render_config(out);
    /* The top limited keys, over every route and limit. */
    struct hh_merged m;
    hh_merge(&m);
    evbuffer_add_printf(out, ",\"top_window_s\":%d,\"top\":[", 2 * ADMIN_CONSOLE_EPOCH_MS / 1000);
    for (size_t i = 0; i < m.n && i < CONSOLE_TOP_KEYS; i++) {
        if (i)
            evbuffer_add(out, ",", 1);
        json_entry(out, &m.e[i], 1);
    }
    free(m.e);
    evbuffer_add_printf(out, "]}\n");
}

/* ---- routing ---- */

#define CONSOLE_JSON_HEADERS "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
/* Everything the page loads is its own (same origin, from the binary): no
 * inline script, no external asset, no framing. */
#define CONSOLE_PAGE_HEADERS CONSOLE_JSON_HEADERS \
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; " \
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; " \
    "frame-ancestors 'none'\r\nReferrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n"

int admin_console_serve(struct admin_console *ac, const char *path, size_t plen,
                        struct evbuffer *body, const char **type, const char **extra)
{
#define PATH_IS(s) (plen == sizeof(s) - 1 && memcmp(path, s, plen) == 0)
    if (PATH_IS("/api/top")) {
        render_top(body);
        *type = "application/json";
        *extra = CONSOLE_JSON_HEADERS;
    } else if (PATH_IS("/api/stats")) {
        render_stats(ac, body);
        *type = "application/json";
        *extra = CONSOLE_JSON_HEADERS;
    } else if (PATH_IS("/") || PATH_IS("/index.html")) {
        evbuffer_add(body, web_dashboard_html, web_dashboard_html_len);
        *type = "text/html; charset=utf-8";
        *extra = CONSOLE_PAGE_HEADERS;
    } else if (PATH_IS("/dashboard.js")) {
        evbuffer_add(body, web_dashboard_js, web_dashboard_js_len);
        *type = "text/javascript; charset=utf-8";
        *extra = CONSOLE_PAGE_HEADERS;
    } else if (PATH_IS("/dashboard.css")) {
        evbuffer_add(body, web_dashboard_css, web_dashboard_css_len);
        *type = "text/css; charset=utf-8";
        *extra = CONSOLE_PAGE_HEADERS;
    } else {
        return 0;
    }
    return 1;
#undef PATH_IS
}
