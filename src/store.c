/* sluice - store.c: rate-limit decisions in Redis over one async connection.
 *
 * The only file that includes hiredis. It owns the connection's life (connect,
 * handshake, backoff, stall detection), sends each decision as one EVALSHA of
 * scripts/limit.lua, and turns replies, errors and timeouts into exactly one
 * callback per call. See store.h for the contract and limit.lua for the
 * script's arguments and reply. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include "log.h"
#include "mem.h"
#include "metrics.h"
#include "store.h"

/* Generated from scripts/limit.lua by the Makefile (build/limit_lua.c). */
extern const char limit_lua[];
extern const char limit_lua_sha[];

#define STORE_BACKOFF_MIN_MS 100
#define STORE_BACKOFF_MAX_MS 5000
#define STORE_CONNECT_MIN_MS 1000     /* connect + handshake budget floor */

/* A call's life: it leaves the free list in store_decide(), is answered at
 * most once (reply, error or timeout; or cancelled, which also counts), and
 * returns to the free list only when it is answered AND hiredis no longer
 * holds it as privdata, so a late reply never touches a reused call. */
struct store_call {
    struct store *s;
    struct store_call *next;        /* free list */
    struct event *timer;            /* created once, reused */
    store_cb *cb;
    void *arg;
    int n;
    int64_t limit[STORE_MAX_LIMITS];
    int answered;                   /* callback done, timed out or cancelled */
    int in_hiredis;                 /* a reply callback is still due */
    int retried;                    /* NOSCRIPT reload already tried */
    char *cmd;                      /* the RESP-encoded EVALSHA, kept for a retry */
    size_t cmdlen, cmdcap;
};

struct store {
    struct event_base *base;
    struct conf_redis rc;           /* strings owned (copied) */
    char *name;                     /* "host:port" or the socket path, for logs */
    redisAsyncContext *ac;          /* NULL while disconnected */
    int ready;                      /* connected and handshake done */
    int handshake_failed;
    int dropping;                   /* inside store_drop(): ignore onDisconnect */
    int destroying;
    int down_logged;                /* "down" logged since the last "connected" */
    int in_user_cb;                 /* depth of user callbacks on the stack */
    int64_t backoff_ms;
    struct event *retry_ev;         /* reconnect after backoff */
    struct event *connect_ev;       /* connect + handshake deadline */
    struct event *kill_ev;          /* drop the connection outside hiredis */
    const char *kill_reason;
    int inflight;                   /* our commands awaiting replies */
    int64_t progress_ms;            /* last reply, or when inflight rose from 0 */
    int script_loads;               /* SCRIPT LOADs awaiting replies */
    struct store_call *free_calls;
    int ncalls, nfree;
};
/* ready also feeds the process-wide gauge behind /readyz. */
static void store_set_ready(struct store *s, int ready)
{
    if (s->ready != ready)
        metrics_gauge_add(METRICS_REDIS_CONNECTED, ready ? 1 : -1);
    s->ready = ready;
}


static void store_connect(struct store *s);
static void store_drop(struct store *s, const char *reason);

static int64_t store_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval store_tv(int64_t ms)
{
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    return tv;
}

static char *store_strdup(const char *p)
{
    return p ? mem_strndup(p, strlen(p)) : NULL;
}

/* ---- connection state ---------------------------------------------------- */

static void store_log_down(struct store *s, const char *reason, int64_t retry_ms)
{
    if (s->down_logged)
        return;
    s->down_logged = 1;
    log_warn("store: redis '%s' down: %s, retrying in %lld ms", s->name,
             reason ? reason : "unknown error", (long long)retry_ms);
}

/* The connection is gone (or never came): wait, then try again. */
static void store_schedule_retry(struct store *s, const char *reason)
{
    store_set_ready(s, 0);
    s->ac = NULL;
    s->inflight = 0;
    s->script_loads = 0;
    event_del(s->connect_ev);
    if (s->destroying)
        return;
    store_log_down(s, reason, s->backoff_ms);
    struct timeval tv = store_tv(s->backoff_ms);
    event_add(s->retry_ev, &tv);
    s->backoff_ms *= 2;
    if (s->backoff_ms > STORE_BACKOFF_MAX_MS)
        s->backoff_ms = STORE_BACKOFF_MAX_MS;
}

static void store_expect_reply(struct store *s)
{
    if (s->inflight++ == 0)
        s->progress_ms = store_now_ms();
}

static void store_got_reply(struct store *s)
{
    if (s->inflight > 0)
        s->inflight--;
    s->progress_ms = store_now_ms();
}

/* From inside a hiredis callback the context must not be freed: ask the
 * event loop to do it once the stack has unwound. */
static void store_kill_later(struct store *s, const char *reason)
{
    store_set_ready(s, 0);
    s->kill_reason = reason;
    event_active(s->kill_ev, EV_TIMEOUT, 0);
}

static void store_kill_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    if (s->ac != NULL)
        store_drop(s, s->kill_reason);
}

/* Free the context from outside hiredis' callbacks. Pending calls get NULL
 * replies (already timed out ones are merely released). */
static void store_drop(struct store *s, const char *reason)
{
    redisAsyncContext *ac = s->ac;
    store_set_ready(s, 0);
    if (ac != NULL) {
        s->dropping = 1;
        redisAsyncFree(ac);
        s->dropping = 0;
    }
    store_schedule_retry(s, reason);
}

static void store_handshake_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct store *s = ac->data;
    redisReply *reply = r;
    const char *step = privdata;
    if (s == NULL || s->destroying)
        return;
    store_got_reply(s);
    if (reply == NULL)
        return;                     /* disconnecting: onDisconnect handles it */
    if (s->handshake_failed)
        return;                     /* the rest of a failed handshake */
    if (reply->type == REDIS_REPLY_ERROR) {
        /* once per outage, not at every retry */
        if (!s->down_logged && strcmp(step, "AUTH") == 0)
            log_error("store: auth failed '%s': %s", s->name, reply->str);
        else if (!s->down_logged)
            log_error("store: %s failed '%s': %s", step, s->name, reply->str);
        s->handshake_failed = 1;
        store_kill_later(s, "handshake failed");
        return;
    }
    if (strcmp(step, "SCRIPT LOAD") != 0)
        return;
    if (reply->type != REDIS_REPLY_STRING || strcmp(reply->str, limit_lua_sha) != 0)
        log_warn("store: script sha mismatch '%s': redis says %s, built %s",
                 s->name, reply->type == REDIS_REPLY_STRING ? reply->str : "?",
                 limit_lua_sha);
    /* The last handshake reply: the connection is usable from now on. */
    event_del(s->connect_ev);
    store_set_ready(s, 1);
    s->backoff_ms = STORE_BACKOFF_MIN_MS;
    s->down_logged = 0;
    log_info("store: redis '%s' connected", s->name);
}

static int store_send_handshake(struct store *s, const char *step,
                                int argc, const char **argv)
{
    size_t len[4];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    if (redisAsyncCommandArgv(s->ac, store_handshake_cb, (void *)step,
                              argc, argv, len) != REDIS_OK)
        return -1;
    store_expect_reply(s);
    return 0;
}

/* The script reload after NOSCRIPT; its reply only needs checking. */
static void store_script_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct store *s = ac->data;
    redisReply *reply = r;
    if (s == NULL || s->destroying)
        return;
    store_got_reply(s);
    if (s->script_loads > 0)
        s->script_loads--;
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR)
        log_error("store: SCRIPT LOAD failed '%s': %s", s->name, reply->str);
}

static void store_connect_cb(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    struct store *s = ac->data;
    if (s == NULL || s->destroying)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this returns; ac->errstr is only
         * copied from the inner context after this callback */
        store_schedule_retry(s, ac->c.errstr[0] ? ac->c.errstr : "connect failed");
        return;
    }
    /* Pipelined: replies come back in this order, SCRIPT LOAD last. */
    char db[16];
    const char *auth[3] = { "AUTH", NULL, NULL };
    const char *select[2] = { "SELECT", db };
    const char *load[3] = { "SCRIPT", "LOAD", limit_lua };
    int rc = 0;
    if (s->rc.password != NULL) {
        int argc = 1;
        if (s->rc.user != NULL)
            auth[argc++] = s->rc.user;
        auth[argc++] = s->rc.password;
        rc |= store_send_handshake(s, "AUTH", argc, auth);
    }
    if (s->rc.db != 0) {
        snprintf(db, sizeof(db), "%d", s->rc.db);
        rc |= store_send_handshake(s, "SELECT", 2, select);
    }
    rc |= store_send_handshake(s, "SCRIPT LOAD", 3, load);
    if (rc != 0)
        store_kill_later(s, "cannot queue the handshake");
}

static void store_disconnect_cb(const redisAsyncContext *cac, int status)
{
    struct store *s = cac->data;
    if (s == NULL || s->dropping || s->destroying)
        return;
    /* hiredis frees the context after this returns */
    store_schedule_retry(s, cac->c.errstr[0] ? cac->c.errstr : "connection closed");
}

static void store_connect_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store *s = arg;
    store_drop(s, "connect timed out");
}

static void store_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    store_connect(arg);
}

static void store_connect(struct store *s)
{
    redisAsyncContext *ac;
    if (s->rc.is_unix)
        ac = redisAsyncConnectUnix(s->rc.host);
    else
        ac = redisAsyncConnect(s->rc.host, s->rc.port);
    if (ac == NULL) {
        store_schedule_retry(s, "out of memory");
        return;
    }
    if (ac->err) {
        char reason[128];
        snprintf(reason, sizeof(reason), "%s", ac->c.errstr);
        redisAsyncFree(ac);     /* not attached, no callbacks: ours to free */
        store_schedule_retry(s, reason);
        return;
    }
    ac->data = s;
    s->ac = ac;
    s->handshake_failed = 0;
    s->inflight = 0;
    s->script_loads = 0;
    redisLibeventAttach(ac, s->base);
    redisAsyncSetConnectCallback(ac, store_connect_cb);
    redisAsyncSetDisconnectCallback(ac, store_disconnect_cb);
    int64_t budget_ms = 2 * s->rc.timeout_ms;
    if (budget_ms < STORE_CONNECT_MIN_MS)
        budget_ms = STORE_CONNECT_MIN_MS;
    struct timeval tv = store_tv(budget_ms);
    event_add(s->connect_ev, &tv);
}

/* ---- calls ---------------------------------------------------------------- */

static struct store_call *store_call_get(struct store *s)
{
    struct store_call *c = s->free_calls;
    if (c != NULL) {
        s->free_calls = c->next;
        s->nfree--;
        return c;
    }
    c = mem_calloc(1, sizeof(*c));
    c->s = s;
    s->ncalls++;
    return c;
}

static void store_call_put(struct store_call *c)
{
    struct store *s = c->s;
    assert(c->answered && !c->in_hiredis);
    c->cb = NULL;
    c->arg = NULL;
    c->next = s->free_calls;
    s->free_calls = c;
    s->nfree++;
}

/* Deliver the one answer of a call. The call stays alive while hiredis
 * still holds it. */
static void store_call_answer(struct store_call *c, const struct store_result *res)
{
    struct store *s = c->s;
    assert(!c->answered);
    c->answered = 1;
    event_del(c->timer);
    s->in_user_cb++;
    c->cb(c->arg, res);
    s->in_user_cb--;
}

static void store_call_fail(struct store_call *c, enum store_status status)
{
    struct store_result res;
    res.status = status;
    res.allowed = 0;
    res.n = 0;
    store_call_answer(c, &res);
}

/* The reply of limit.lua: { allowed, (allowed_i remaining_i reset_i retry_i)*n }. */
static int store_parse(const struct store_call *c, const redisReply *reply,
                       struct store_result *res)
{
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 1 + 4 * (size_t)c->n)
        return -1;
    for (size_t i = 0; i < reply->elements; i++)
        if (reply->element[i]->type != REDIS_REPLY_INTEGER)
            return -1;
    res->status = STORE_OK;
    res->allowed = reply->element[0]->integer != 0;
    res->n = c->n;
    for (int i = 0; i < c->n; i++) {
        redisReply **e = reply->element + 1 + 4 * i;
        struct limiter_result *r = &res->r[i];
        r->allowed = e[0]->integer != 0;
        r->limit = c->limit[i];
        r->remaining = e[1]->integer;
        r->reset_ms = e[2]->integer;
        r->retry_ms = e[3]->integer;
    }
    return 0;
}

static int store_send(struct store_call *c);

/* NOSCRIPT: the server lost the script (restart, SCRIPT FLUSH). Load it and
 * send the same call again, once. Commands are answered in order, so one
 * SCRIPT LOAD already in the pipeline serves every retry queued after it. */
static int store_retry_noscript(struct store_call *c)
{
    struct store *s = c->s;
    if (c->retried || s->ac == NULL)
        return -1;
    c->retried = 1;
    if (s->script_loads == 0) {
        const char *argv[3] = { "SCRIPT", "LOAD", limit_lua };
        size_t len[3] = { 6, 4, strlen(limit_lua) };
        if (redisAsyncCommandArgv(s->ac, store_script_cb, NULL, 3, argv, len) != REDIS_OK)
            return -1;
        store_expect_reply(s);
        s->script_loads++;
    }
    return store_send(c);
}

static void store_reply_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct store_call *c = privdata;
    struct store *s = c->s;
    redisReply *reply = r;
    c->in_hiredis = 0;
    if (!s->destroying)
        store_got_reply(s);
    if (reply == NULL)
        store_set_ready(s, 0);           /* the connection is going away */
    if (c->answered || s->destroying) {
        c->answered = 1;
        store_call_put(c);
        return;
    }
    struct store_result res;
    if (reply == NULL) {
        store_call_fail(c, STORE_ERROR);
    } else if (reply->type == REDIS_REPLY_ERROR) {
        if (strncmp(reply->str, "NOSCRIPT", 8) == 0 && store_retry_noscript(c) == 0)
            return;             /* same call, same timer, answered later */
        log_debug("store: EVALSHA failed '%s': %s", s->name, reply->str);
        store_call_fail(c, STORE_ERROR);
    } else if (store_parse(c, reply, &res) != 0) {
        log_debug("store: unexpected reply from '%s'", s->name);
        store_call_fail(c, STORE_ERROR);
    } else {
        store_call_answer(c, &res);
    }
    if (!c->in_hiredis)
        store_call_put(c);
}

/* A timed-out call is answered now; its late reply will only release it.
 * When nothing at all came back for two timeouts, the server is paused or
 * gone: drop the connection rather than queue behind it forever. */
static void store_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_call *c = arg;
    struct store *s = c->s;
    if (c->answered)
        return;
    int stalled = s->ac != NULL && s->inflight > 0 &&
                  store_now_ms() - s->progress_ms > 2 * s->rc.timeout_ms;
    store_call_fail(c, STORE_TIMEOUT);
    if (!c->in_hiredis) {
        store_call_put(c);
    }
    if (stalled && s->ac != NULL)
        store_drop(s, "no reply within twice the timeout");
}

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

/* Encode EVALSHA sha n key1..keyN d n (algo limit window_ms interval_us
 * cost flags)*n straight into the call's buffer: RESP is what hiredis would build,
 * and keeping it lets a NOSCRIPT retry resend it after the caller's keys are
 * gone. The buffer grows to the largest call seen, then is reused. */
static void store_encode(struct store_call *c, const struct store_limit *limits, int n)
{
    int argc = 3 + n + 2 + 6 * n;
    /* 24 bytes of bulk framing per argument bounds every number's digits too */
    size_t need = 16 + (size_t)argc * (24 + 24) + 40;
    for (int i = 0; i < n; i++)
        need += limits[i].keylen;
    if (c->cmdcap < need) {
        free(c->cmd);
        c->cmd = mem_alloc(need);
        c->cmdcap = need;
    }
    char *p = c->cmd;
    char num[24];
    char *start = store_fmt_u64(num + sizeof(num), (uint64_t)argc);
    *p++ = '*';
    p = store_put(p, start, (size_t)(num + sizeof(num) - start));
    p = store_put(p, "\r\n", 2);
    p = store_put_bulk(p, "EVALSHA", 7);
    p = store_put_bulk(p, limit_lua_sha, strlen(limit_lua_sha));
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++)
        p = store_put_bulk(p, limits[i].key, limits[i].keylen);
    p = store_put_bulk(p, "d", 1);
    p = store_put_int(p, n);
    for (int i = 0; i < n; i++) {
        const struct limiter_params *lp = limits[i].params;
        p = store_put_int(p, (int64_t)lp->algo);
        p = store_put_int(p, lp->limit);
        p = store_put_int(p, lp->window_ms);
        p = store_put_int(p, lp->interval_us);
        p = store_put_int(p, limits[i].cost);
        p = store_put_int(p, (int64_t)limits[i].flags);
    }
    c->cmdlen = (size_t)(p - c->cmd);
    assert(c->cmdlen <= c->cmdcap);
}

static int store_send(struct store_call *c)
{
    struct store *s = c->s;
    if (redisAsyncFormattedCommand(s->ac, store_reply_cb, c, c->cmd, c->cmdlen) != REDIS_OK)
        return -1;
    c->in_hiredis = 1;
    store_expect_reply(s);
    return 0;
}

/* ---- interface -------------------------------------------------------------- */

struct store *store_create(struct event_base *base, const struct conf_redis *rc)
{
    struct store *s = mem_calloc(1, sizeof(*s));
    s->base = base;
    s->rc = *rc;
    s->rc.url = store_strdup(rc->url);
    s->rc.host = store_strdup(rc->host);
    s->rc.user = store_strdup(rc->user);
    s->rc.password = store_strdup(rc->password);
    s->rc.prefix = store_strdup(rc->prefix);
    if (s->rc.timeout_ms < 1)
        s->rc.timeout_ms = 1;
    char name[300];
    if (rc->is_unix)
        snprintf(name, sizeof(name), "%s", rc->host ? rc->host : "?");
    else
        snprintf(name, sizeof(name), "%s:%d", rc->host ? rc->host : "?", rc->port);
    s->name = store_strdup(name);
    s->backoff_ms = STORE_BACKOFF_MIN_MS;
    s->retry_ev = evtimer_new(base, store_retry_cb, s);
    s->connect_ev = evtimer_new(base, store_connect_timeout_cb, s);
    s->kill_ev = event_new(base, -1, 0, store_kill_cb, s);
    if (s->retry_ev == NULL || s->connect_ev == NULL || s->kill_ev == NULL) {
        log_error("store: cannot create timers for '%s'", s->name);
        abort();
    }
    store_connect(s);
    return s;
}

/* Must not be called from inside a store callback. */
void store_destroy(struct store *s)
{
    if (s == NULL)
        return;
    assert(s->in_user_cb == 0);
    s->destroying = 1;
    store_set_ready(s, 0);
    if (s->ac != NULL) {
        redisAsyncContext *ac = s->ac;
        s->ac = NULL;
        redisAsyncFree(ac);     /* pending replies: NULL, calls released */
    }
    event_free(s->retry_ev);
    event_free(s->connect_ev);
    event_free(s->kill_ev);
    assert(s->nfree == s->ncalls);
    while (s->free_calls != NULL) {
        struct store_call *c = s->free_calls;
        s->free_calls = c->next;
        if (c->timer != NULL)
            event_free(c->timer);
        free(c->cmd);
        free(c);
    }
    free(s->rc.url);
    free(s->rc.host);
    free(s->rc.user);
    free(s->rc.password);
    free(s->rc.prefix);
    free(s->name);
    free(s);
}

struct store_call *store_decide(struct store *s, const struct store_limit *limits,
                                int n, store_cb *cb, void *arg)
{
    assert(n >= 1 && n <= STORE_MAX_LIMITS && cb != NULL);
    if (!s->ready || s->ac == NULL || n < 1 || n > STORE_MAX_LIMITS)
        return NULL;
    struct store_call *c = store_call_get(s);
    if (c->timer == NULL) {
        c->timer = evtimer_new(s->base, store_timeout_cb, c);
        if (c->timer == NULL) {
            log_error("store: cannot create a call timer");
            abort();
        }
    }
    c->cb = cb;
    c->arg = arg;
    c->n = n;
    c->answered = 0;
    c->in_hiredis = 0;
    c->retried = 0;
    for (int i = 0; i < n; i++)
        c->limit[i] = limits[i].params->limit;
    store_encode(c, limits, n);
    if (store_send(c) != 0) {
        c->answered = 1;
        store_call_put(c);
        return NULL;
    }
    struct timeval tv = store_tv(s->rc.timeout_ms);
    event_add(c->timer, &tv);
    return c;
}

void store_cancel(struct store_call *c)
{
    if (c == NULL || c->answered)
        return;
    c->answered = 1;
    event_del(c->timer);
    if (!c->in_hiredis)
        store_call_put(c);
}

int store_connected(const struct store *s)
{
    return s->ready;
}
