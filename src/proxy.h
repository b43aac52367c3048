/* sluice - proxy.h: one client connection and the way of its requests.
 *
 * A client is created for each accepted socket and owned by its worker; it
 * frees itself when the connection ends. proxy_close_all() frees every
 * client of a worker at exit. */
#ifndef SLUICE_PROXY_H
#define SLUICE_PROXY_H

#include <sys/socket.h>

struct worker;

void proxy_accept(struct worker *w, int fd, const struct sockaddr *peer, int peerlen);
/* Shutting down: close idle connections now, the others after the response
 * in progress. The worker hears through worker_drained() when none is left. */
void proxy_drain(struct worker *w);
void proxy_close_all(struct worker *w);

#endif
