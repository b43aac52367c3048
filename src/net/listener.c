/* sluice - listener.c: accept with a pause on EMFILE and friends.
 *
 * libevent calls the error callback when accept() fails with anything but
 * EAGAIN, EINTR or ECONNABORTED. Without one it only warns and leaves the
 * listener enabled: out of file descriptors, the socket stays readable and
 * the loop spins at 100% CPU writing a line per failed accept. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "clock.h"
#include "listener.h"
#include "log.h"
#include "mem.h"

struct listener {
    struct evconnlistener *ev;
    struct event *resume;       /* re-enables ev after a pause */
    listener_accept_fn cb;
    void *arg;
    char *who;
    char *addr;
};

/* One rate for every listener of the process: EMFILE hits them all at once. */
static struct log_every accept_failures;

static void accept_cb(struct evconnlistener *ev, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    struct listener *l = arg;
    l->cb(l->arg, fd, sa, salen);
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct listener *l = arg;
    evconnlistener_enable(l->ev);
}

static void error_cb(struct evconnlistener *ev, void *arg)
{
    struct listener *l = arg;
    int err = EVUTIL_SOCKET_ERROR();
    long n = log_every_second(&accept_failures);
    if (n)
        log_warn("%s: accept failed on '%s': %s; pausing accepts for %d ms "
                 "(%ld failure%s since the last such line)", l->who, l->addr,
                 evutil_socket_error_to_string(err), LISTENER_PAUSE_MS, n, n == 1 ? "" : "s");
    evconnlistener_disable(ev);
    struct timeval tv = clock_timeval(LISTENER_PAUSE_MS);
    evtimer_add(l->resume, &tv);
}

static int bound_socket(const struct sockaddr *sa, socklen_t len, int flags)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));   /* past TIME_WAIT */
    if (flags & LISTENER_REUSEPORT)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if ((flags & LISTENER_V6ONLY) && sa->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, sa, len) < 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Linux refuses a bind without SO_REUSEPORT next to any listening socket on
 * an overlapping address, whoever owns it (SO_REUSEADDR only lets it pass
 * connections in TIME_WAIT). */
int listener_check_free(const struct sockaddr *sa, socklen_t len)
{
    int fd = bound_socket(sa, len, LISTENER_V6ONLY);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

int listener_socket(const struct sockaddr *sa, socklen_t len, int backlog, int flags)
{
    int fd = bound_socket(sa, len, flags);
    if (fd >= 0 && listen(fd, backlog) < 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

struct listener *listener_create(struct event_base *base, int fd, const char *who,
                                 const char *addr, listener_accept_fn cb, void *arg)
{
    struct listener *l = mem_calloc(1, sizeof(*l));
    l->cb = cb;
    l->arg = arg;
    l->who = mem_strndup(who, strlen(who));
    l->addr = mem_strndup(addr, strlen(addr));
    l->resume = evtimer_new(base, resume_cb, l);
    /* Backlog 0: the caller's socket is already listening with the backlog it
     * chose (worker.c 4096, admin.c 128); -1 would make libevent listen()
     * again with 128, and a burst of connects beyond that waits for a SYN
     * retransmit (1 s). */
    l->ev = evconnlistener_new(base, accept_cb, l, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                               0, fd);
    if (l->resume == NULL || l->ev == NULL) {
        if (l->ev == NULL)
            close(fd);
        listener_destroy(l);
        return NULL;
    }
    evconnlistener_set_error_cb(l->ev, error_cb);
    return l;
}

void listener_destroy(struct listener *l)
{
    if (l == NULL)
        return;
    if (l->resume)
        event_free(l->resume);
    if (l->ev)
        evconnlistener_free(l->ev);
    free(l->who);
    free(l->addr);
    free(l);
}
