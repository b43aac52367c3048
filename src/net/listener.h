/* sluice - listener.h: a listening socket whose accept loop backs off.
 *
 * Wraps libevent's evconnlistener for the public listeners (one per worker)
 * and the admin endpoint. When accept() fails for a reason that retrying at
 * once cannot cure (EMFILE, ENFILE, ENOBUFS, ENOMEM), the listener stops
 * accepting for LISTENER_PAUSE_MS and then tries again, instead of spinning
 * on a socket that stays readable. Connections wait in the kernel's backlog
 * meanwhile. The failure is logged at most once a second for the whole
 * process, with the count since the last line. */
#ifndef SLUICE_LISTENER_H
#define SLUICE_LISTENER_H

#include <sys/socket.h>

#define LISTENER_PAUSE_MS 100

struct event_base;
struct listener;

/* Listening sockets of the public listeners: one per worker and address,
 * with SO_REUSEPORT so the kernel spreads connections between the workers.
 * SO_REUSEPORT alone would also let another process (another sluice of the
 * same user) join the group and take a share of the connections, so a
 * process first checks each address with listener_check_free().
 *
 * 0 when nothing listens on sa: a bind there without SO_REUSEPORT succeeds
 * (and is undone at once). -1 with errno otherwise: EADDRINUSE while any
 * socket of any process listens on sa, or on a wildcard address of its port
 * (or sa is a wildcard and something listens on one of its addresses). */
int listener_check_free(const struct sockaddr *sa, socklen_t len);
/* listener_socket's flags: the public listeners take both, the admin
 * endpoint neither. */
#define LISTENER_REUSEPORT 1    /* SO_REUSEPORT: one socket per worker on one address */
#define LISTENER_V6ONLY    2    /* an IPv6 address takes no IPv4 connections */

/* The one maker of listening sockets: non-blocking, close-on-exec, bound to
 * sa with SO_REUSEADDR and flags, listening with backlog; -1 with errno. */
int listener_socket(const struct sockaddr *sa, socklen_t len, int backlog, int flags);

/* Called on the base's thread for each accepted connection; it owns fd. */
typedef void (*listener_accept_fn)(void *arg, int fd, struct sockaddr *peer, int peerlen);

/* Accept on fd (bound and listening; owned from here, closed by
 * listener_destroy(), also when this fails). who ("worker 0", "admin") and
 * addr name it in log lines and are copied. NULL on failure. */
struct listener *listener_create(struct event_base *base, int fd, const char *who,
                                 const char *addr, listener_accept_fn cb, void *arg);
/* Close the socket; a pending resume is cancelled. Not from inside cb. */
void listener_destroy(struct listener *l);

#endif
