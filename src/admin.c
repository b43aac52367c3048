/* sluice - admin.c: /metrics, /healthz and /readyz over libevent's evhttp.
 *
 * Not on the request path, so the convenience of evhttp is worth more here
 * than control over every allocation. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "admin.h"
#include "log.h"
#include "mem.h"
#include "metrics.h"

struct admin {
    pthread_t thread;
    struct event_base *base;
    struct evhttp *http;
    struct event *stop_ev;
    _Atomic int on_error;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason,
                       const char *type, struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    evhttp_send_reply(req, code, reason, body);
}

static void handle(struct evhttp_request *req, void *arg)
{
    struct admin *a = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    struct evbuffer *body = evbuffer_new();
    if (path && strcmp(path, "/metrics") == 0) {
        metrics_render(body);
        reply_text(req, 200, "OK", "text/plain; version=0.0.4", body);
    } else if (path && strcmp(path, "/healthz") == 0) {
        evbuffer_add(body, "ok\n", 3);
        reply_text(req, 200, "OK", "text/plain", body);
    } else if (path && strcmp(path, "/readyz") == 0) {
        int redis_up = metrics_gauge_get(METRICS_REDIS_CONNECTED) > 0;
        int serve_anyway = atomic_load(&a->on_error) != CONF_ON_ERROR_DENY;
        if (redis_up || serve_anyway) {
            evbuffer_add_printf(body, "ready%s\n", redis_up ? "" : " (redis down, on_error serves)");
            reply_text(req, 200, "OK", "text/plain", body);
        } else {
            evbuffer_add_printf(body, "not ready: redis down\n");
            reply_text(req, 503, "Service Unavailable", "text/plain", body);
        }
    } else {
        evbuffer_add_printf(body, "not found\n");
        reply_text(req, 404, "Not Found", "text/plain", body);
    }
    evbuffer_free(body);
}

static void *admin_main(void *arg)
{
    struct admin *a = arg;
    event_base_dispatch(a->base);
    return NULL;
}

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopexit(((struct admin *)arg)->base, NULL);
}

static void admin_free(struct admin *a)
{
    if (a->http)
        evhttp_free(a->http);
    if (a->stop_ev)
        event_free(a->stop_ev);
    if (a->base)
        event_base_free(a->base);
    free(a);
}

struct admin *admin_start(const struct conf_addr *addr, enum conf_on_error on_error)
{
    struct admin *a = mem_calloc(1, sizeof(*a));
    atomic_store(&a->on_error, (int)on_error);
    a->base = event_base_new();
    a->http = evhttp_new(a->base);
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_gencb(a->http, handle, a);

    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, (const struct sockaddr *)&addr->ss, addr->sslen) < 0 ||
        listen(fd, 128) < 0 || evhttp_accept_socket(a->http, fd) < 0) {
        log_error("admin: cannot listen on '%s': %s", addr->text, strerror(errno));
        if (fd >= 0)
            close(fd);
        admin_free(a);
        return NULL;
    }
    a->stop_ev = event_new(a->base, -1, 0, stop_cb, a);
    if (pthread_create(&a->thread, NULL, admin_main, a) != 0) {
        log_error("admin: cannot start its thread");
        admin_free(a);
        return NULL;
    }
    log_info("admin: serving /metrics /healthz /readyz on %s", addr->text);
    return a;
}

void admin_set_on_error(struct admin *a, enum conf_on_error on_error)
{
    if (a)
        atomic_store(&a->on_error, (int)on_error);
}

void admin_stop(struct admin *a)
{
    if (a == NULL)
        return;
    event_active(a->stop_ev, EV_TIMEOUT, 0);
    pthread_join(a->thread, NULL);
    admin_free(a);
}
