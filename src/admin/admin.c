/* sluice - admin.c: /metrics, /healthz, /readyz and the console, on the
 * admin thread.
 *
 * A small HTTP/1.1 server on the thread's own event base, reading heads with
 * the public side's framing code (http1.c), under the bounds in admin.h:
 *
 *   accept (at most ADMIN_MAX_CONNECTIONS) -> idle_timeout until a first byte
 *     -> head (ADMIN_MAX_HEAD_BYTES, header_timeout; no body, but
 *        ADMIN_API_MAX_BODY on /api/limits) -> answer
 *     -> written: keep-alive (idle_timeout again) or close
 *
 * Reading stops while an answer is being written, so a peer that pipelines
 * requests without reading its answers holds one answer at most. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "admin.h"
#include "admin_api.h"
#include "admin_console.h"
#include "clock.h"
#include "http1.h"
#include "listener.h"
#include "list.h"
#include "log.h"
#include "loopthread.h"
#include "mem.h"
#include "metrics.h"
#include "reply.h"

struct admin_conn {
    struct admin *a;
    struct bufferevent *bev;
    struct event *timer;        /* idle_timeout; header_timeout once in_head */
    struct http1 *parser;
    struct http1_head head;
    int in_head;                /* a head's first byte has come */
    int answering;              /* an answer is queued; reads wait for it */
    int keep_alive;             /* after that answer */
    struct admin_api_pending *pending;  /* an admin API request waiting for Redis */
    int api_head_only;          /* its method was HEAD */
    struct list_link link;      /* on the admin's conns */
};

struct admin {
    struct loopthread *loop;
    struct event_base *base;    /* the loop's */
    struct listener *listener;
    struct admin_console *console;  /* /api/top, /api/stats, the dashboard */
    struct admin_api *api;      /* /api/limits' Redis connections */
    struct list conns;          /* every open connection */
    int nconns;
    _Atomic int on_error;
    _Atomic int64_t header_timeout_ms;
    _Atomic int64_t idle_timeout_ms;
};

static struct log_every refused_log;

static void admin_conn_free(struct admin_conn *c)
{
    struct admin *a = c->a;
    list_unlink(&a->conns, &c->link);
    a->nconns--;
    if (c->pending)
        admin_api_cancel(c->pending);
    event_free(c->timer);
    bufferevent_free(c->bev);
    http1_destroy(c->parser);
    free(c);
}

static void admin_conn_timer(struct admin_conn *c, int64_t ms)
{
    struct timeval tv = clock_timeval(ms);
    evtimer_add(c->timer, &tv);
}

/* The answer is in the output buffer: stop reading until it is written. */
static void start_writing(struct admin_conn *c)
{
    c->answering = 1;
    evtimer_del(c->timer);      /* the write timeout (idle_timeout) runs now */
    bufferevent_disable(c->bev, EV_READ);
    bufferevent_enable(c->bev, EV_WRITE);
}

/* A head that cannot be served (400, 408, 413, 414, 431, 501): a JSON error
 * like the public side's, then close. */
static void answer_error(struct admin_conn *c, int status)
{
    c->keep_alive = 0;
    reply_error(bufferevent_get_output(c->bev), status, 0, NULL, 0);
    start_writing(c);
}

static void answer(struct admin_conn *c, int status, const char *reason, const char *type,
                   struct evbuffer *body, int head_only, const char *extra)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    const char *conn = !c->keep_alive ? "Connection: close\r\n"
                       : c->head.minor == 0 ? "Connection: keep-alive\r\n" : "";
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n",
                        status, reason, type, evbuffer_get_length(body), extra, conn);
    if (!head_only)
        evbuffer_add_buffer(out, body);
    start_writing(c);
}

static int span_is(const char *data, struct http1_span s, const char *text)
{
    return s.len == strlen(text) && memcmp(data + s.off, text, s.len) == 0;
}

/* The path of a request target: origin form up to '?', or the path of an
 * absolute form ("http://host/metrics"). */
static const char *target_path(const char *t, size_t len, size_t *plen)
{
    const char *end = t + len, *p = t;
    const char *scheme = len > 3 ? memchr(t, ':', len) : NULL;
    if (len && t[0] != '/' && scheme && end - scheme > 3 && memcmp(scheme, "://", 3) == 0) {
        p = memchr(scheme + 3, '/', (size_t)(end - scheme - 3));
        if (p == NULL)
            p = end;
    }
    const char *q = memchr(p, '?', (size_t)(end - p));
    *plen = (size_t)((q ? q : end) - p);
    return p;
}

static void serve(struct admin_conn *c, const char *data)
{
    struct admin *a = c->a;
    const struct http1_head *h = &c->head;
    int head_only = span_is(data, h->method, "HEAD");
    const char *ctype, *cextra;
    size_t plen;
    const char *path = target_path(data + h->target.off, h->target.len, &plen);
    struct evbuffer *body = evbuffer_new();
    if (body == NULL)
        abort();
    c->keep_alive = h->keep_alive;
#define PATH_IS(s) (plen == sizeof(s) - 1 && memcmp(path, s, plen) == 0)
    if (!head_only && !span_is(data, h->method, "GET")) {
        evbuffer_add_printf(body, "method not allowed\n");
        answer(c, 405, "Method Not Allowed", "text/plain", body, 0, "Allow: GET, HEAD\r\n");
    } else if (PATH_IS("/metrics")) {
        metrics_render(body);
        answer(c, 200, "OK", "text/plain; version=0.0.4", body, head_only, "");
    } else if (PATH_IS("/healthz")) {
        evbuffer_add(body, "ok\n", 3);
        answer(c, 200, "OK", "text/plain", body, head_only, "");
    } else if (PATH_IS("/readyz")) {
        int redis_up = metrics_gauge_get(METRICS_REDIS_CONNECTED) > 0;
        int serve_anyway = atomic_load(&a->on_error) != CONF_ON_ERROR_DENY;
        if (redis_up || serve_anyway) {
            evbuffer_add_printf(body, "ready%s\n", redis_up ? "" : " (redis down, on_error serves)");
            answer(c, 200, "OK", "text/plain", body, head_only, "");
        } else {
            evbuffer_add_printf(body, "not ready: redis down\n");
            answer(c, 503, "Service Unavailable", "text/plain", body, head_only, "");
        }
    } else if (admin_console_serve(a->console, path, plen, body, &ctype, &cextra)) {
        answer(c, 200, "OK", ctype, body, head_only, cextra);
    } else {
        evbuffer_add_printf(body, "not found\n");
        answer(c, 404, "Not Found", "text/plain", body, head_only, "");
    }
#undef PATH_IS
    evbuffer_free(body);
}

/* /api/limits..., /api/plans: the admin API (admin_api.c), JSON, with its body. */
static int is_api(const char *path, size_t plen)
{
    size_t n = sizeof(ADMIN_API_PREFIX) - 1, pn = sizeof(ADMIN_API_PLANS) - 1;
    return (plen >= n && memcmp(path, ADMIN_API_PREFIX, n) == 0 &&
            (plen == n || path[n] == '/')) ||
           (plen >= pn && memcmp(path, ADMIN_API_PLANS, pn) == 0 &&
            (plen == pn || path[pn] == '/'));
}

static void api_answer(struct admin_conn *c, int status, struct evbuffer *out,
                       struct evbuffer *hdr)
{
    evbuffer_add(hdr, "", 1);
    answer(c, status, admin_api_reason(status), "application/json", out, c->api_head_only,
           (const char *)evbuffer_pullup(hdr, -1));
}

/* Redis answered a request that waited (or did not in time). */
static void api_done(void *arg, int status, struct evbuffer *out, struct evbuffer *hdr)
{
    struct admin_conn *c = arg;
    c->pending = NULL;
    api_answer(c, status, out, hdr);
}

static void serve_api(struct admin_conn *c, const char *data, const char *body, size_t blen)
{
    size_t plen;
    const char *path = target_path(data + c->head.target.off, c->head.target.len, &plen);
    struct evbuffer *out = evbuffer_new(), *hdr = evbuffer_new();
    if (out == NULL || hdr == NULL)
        abort();
    c->keep_alive = c->head.keep_alive;
    c->api_head_only = span_is(data, c->head.method, "HEAD");
    int status = admin_api_serve(c->a->api, data, &c->head, path, plen, body, blen, out, hdr,
                                 api_done, c, &c->pending);
    if (status == ADMIN_API_PENDING) {  /* reads wait; redis.timeout bounds the wait */
        c->answering = 1;
        evtimer_del(c->timer);
        bufferevent_disable(c->bev, EV_READ);
    } else {
        api_answer(c, status, out, hdr);
    }
    evbuffer_free(out);
    evbuffer_free(hdr);
}

/* Every request: a Host the endpoint is known by, and the token (when
 * admin.token is set) for what shows keys (the admin API, /api/top,
 * /api/stats). 1 when refused (answered). */
static int gate(struct admin_conn *c, const char *data, const char *path, size_t plen)
{
#define PATH_IS(s) (plen == sizeof(s) - 1 && memcmp(path, s, plen) == 0)
    int keys = is_api(path, plen) || PATH_IS("/api/top") || PATH_IS("/api/stats");
#undef PATH_IS
    struct evbuffer *out = evbuffer_new(), *hdr = evbuffer_new();
    if (out == NULL || hdr == NULL)
        abort();
    int status = admin_api_gate(data, &c->head, keys, out, hdr);
    if (status != 0) {
        c->keep_alive = c->head.keep_alive;
        c->api_head_only = span_is(data, c->head.method, "HEAD");
        api_answer(c, status, out, hdr);
    }
    evbuffer_free(out);
    evbuffer_free(hdr);
    return status != 0;
}

/* The body an admin API request may carry: Content-Length up to
 * ADMIN_API_MAX_BODY; -1 for any other body (refused, not read). */
static long api_body_len(const struct http1_head *h, const char *data)
{
    size_t plen;
    const char *path = target_path(data + h->target.off, h->target.len, &plen);
    if (h->body == HTTP1_BODY_NONE || (h->body == HTTP1_BODY_LENGTH && h->content_length == 0))
        return 0;
    if (h->body != HTTP1_BODY_LENGTH || !is_api(path, plen) ||
        h->content_length > ADMIN_API_MAX_BODY)
        return -1;
    return (long)h->content_length;
}

/* Parse what has come of the next head; answer it once it is whole. */
static void parse(struct admin_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    if (len == 0 || c->answering)
        return;
    if (!c->in_head) {
        c->in_head = 1;
        admin_conn_timer(c, atomic_load(&c->a->header_timeout_ms));
    }
    size_t max = ADMIN_MAX_HEAD_BYTES + ADMIN_API_MAX_BODY + 1;
    size_t n = len > max ? max : len;
    const char *data = (const char *)evbuffer_pullup(in, (ssize_t)n);
    const struct http1_head *h = &c->head;
    int rc = http1_head_parse(c->parser, data, n > ADMIN_MAX_HEAD_BYTES + 1 ?
                              ADMIN_MAX_HEAD_BYTES + 1 : n, ADMIN_MAX_HEAD_BYTES, 0, &c->head);
    if (rc == 1)
        return;
    /* Only the admin API takes a (small) body; others are refused, not read. */
    long blen = rc == 0 ? api_body_len(h, data) : 0;
    if (blen < 0)
        rc = 413;
    if (rc != 0) {
        answer_error(c, rc);
        return;
    }
    if (n < h->len + (size_t)blen)
        return;                 /* the body is still coming (header_timeout runs) */
    size_t plen;
    const char *path = target_path(data + h->target.off, h->target.len, &plen);
    if (!gate(c, data, path, plen)) {
        if (is_api(path, plen))
            serve_api(c, data, data + h->len, (size_t)blen);
        else
            serve(c, data);
    }
    evbuffer_drain(in, h->len + (size_t)blen);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    parse(arg);
}

/* The answer is written: close, or wait for the next request (which may
 * already be in the input buffer). */
static void write_cb(struct bufferevent *bev, void *arg)
{
    struct admin_conn *c = arg;
    if (!c->answering)
        return;
    c->answering = 0;
    if (!c->keep_alive) {
        admin_conn_free(c);
        return;
    }
    c->in_head = 0;
    admin_conn_timer(c, atomic_load(&c->a->idle_timeout_ms));
    bufferevent_enable(bev, EV_READ);
    parse(c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    admin_conn_free(arg);   /* EOF, error, or a peer that stopped reading */
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct admin_conn *c = arg;
    if (c->in_head)
        answer_error(c, 408);   /* a head that did not come in time */
    else
        admin_conn_free(c);     /* idle */
}

static void accept_cb(void *arg, int fd, struct sockaddr *sa, int salen)
{
    struct admin *a = arg;
    if (a->nconns >= ADMIN_MAX_CONNECTIONS) {
        long n = log_every_second(&refused_log);
        if (n)
            log_warn("admin: %d connections open (the most); closed %ld new one%s "
                     "since the last such line",
                     a->nconns, n, n == 1 ? "" : "s");
        close(fd);
        return;
    }
    struct bufferevent *bev = bufferevent_socket_new(a->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL) {
        close(fd);
        return;
    }
    struct admin_conn *c = mem_calloc(1, sizeof(*c));
    c->a = a;
    c->bev = bev;
    c->parser = http1_create(HTTP1_REQUEST);
    c->timer = evtimer_new(a->base, timer_cb, c);
    if (c->timer == NULL)
        abort();
    list_push(&a->conns, &c->link);
    a->nconns++;

    int64_t idle_ms = atomic_load(&a->idle_timeout_ms);
    struct timeval wt = clock_timeval(idle_ms);
    bufferevent_set_timeouts(bev, NULL, &wt);
    bufferevent_setwatermark(bev, EV_READ, 0, ADMIN_MAX_HEAD_BYTES + ADMIN_API_MAX_BODY + 1);
    bufferevent_setcb(bev, read_cb, write_cb, event_cb, c);
    bufferevent_enable(bev, EV_READ);
    admin_conn_timer(c, idle_ms);
}

static void admin_free(struct admin *a)
{
    for (struct admin_conn *c = LIST_ITEM(a->conns.first, struct admin_conn, link), *next; c;
         c = next) {
        next = LIST_ITEM(c->link.next, struct admin_conn, link);
        admin_conn_free(c);
    }
    admin_api_destroy(a->api);
    listener_destroy(a->listener);
    admin_console_destroy(a->console);
    loopthread_destroy(a->loop);
    free(a);
}

struct admin *admin_start(const struct conf *conf)
{
    const struct conf_addr *addr = &conf->admin_listen;
    struct admin *a = mem_calloc(1, sizeof(*a));
    const char *step = "event base";
    int fd = -1;
    admin_reload(a, conf);
    a->loop = loopthread_create(NULL, NULL);
    if (a->loop == NULL)
        goto fail;
    a->base = loopthread_base(a->loop);
    step = "listen";
    fd = listener_socket((const struct sockaddr *)&addr->ss, addr->sslen, 128, 0);
    if (fd < 0)
        goto fail;
    a->listener = listener_create(a->base, fd, "admin", addr->text, accept_cb, a);
    fd = -1;                    /* the listener's now, or closed */
    if (a->listener == NULL)
        goto fail;
    a->console = admin_console_create(a->base, conf);
    a->api = admin_api_create(a->base);
    step = "thread";
    if ((errno = loopthread_start(a->loop)) != 0)
        goto fail;
    log_info("admin: serving /metrics /healthz /readyz /api/top /api/stats / on %s (at most %d connections, "
             "%d-byte heads)", addr->text, ADMIN_MAX_CONNECTIONS, ADMIN_MAX_HEAD_BYTES);
    return a;

fail:
    log_error("admin: %s failed on '%s': %s", step, addr->text, strerror(errno));
    if (fd >= 0)
        close(fd);
    admin_free(a);
    return NULL;
}

void admin_reload(struct admin *a, const struct conf *conf)
{
    if (a == NULL)
        return;
    atomic_store(&a->on_error, conf->backend == CONF_BACKEND_MEMORY ? (int)CONF_ON_ERROR_ALLOW
                                                                    : (int)conf->redis.on_error);
    atomic_store(&a->header_timeout_ms, conf->client.header_timeout_ms);
    atomic_store(&a->idle_timeout_ms, conf->client.idle_timeout_ms);
    admin_console_reload(a->console, conf);
}

void admin_stop(struct admin *a)
{
    if (a == NULL)
        return;
    loopthread_stop(a->loop);
    admin_free(a);
}
