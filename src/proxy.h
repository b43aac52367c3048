/* sluice - proxy.h: one client connection and the way of its requests.
 *
 * A client is created for each accepted socket and owned by its worker; it
 * frees itself when the connection ends. proxy_close_all() frees every
 * client of a worker when it stops. */
#ifndef SLUICE_PROXY_H
#define SLUICE_PROXY_H

#include <sys/socket.h>

struct worker;

void proxy_accept(struct worker *w, int fd, const struct sockaddr *peer, int peerlen);
void proxy_close_all(struct worker *w);

#endif
