/* sluice - exchange.h: one upstream exchange of a client's request.
 *
 * Borrow a connection from the route's pool, send the head and the body
 * (a small body buffered whole first), relay interim 1xx heads, a 101 and
 * the tunnel after it, the response head (with the rate-limit fields) and
 * body, then give the connection back or close it. Everything works on the
 * client whose request it is, and never frees it (conn.h). */
#ifndef SLUICE_EXCHANGE_H
#define SLUICE_EXCHANGE_H

#include <stddef.h>

struct client;

/* The request is allowed: go upstream (or buffer its small body first). */
void exchange_start(struct client *c);
/* Bytes arrived from the client: move what the state allows. */
void exchange_buffer_body(struct client *c);
void exchange_pump_request(struct client *c);
void exchange_tunnel_pump(struct client *c);
/* Room in the client's output: move more of the response. */
void exchange_pump_response(struct client *c);
void exchange_maybe_finish(struct client *c);
/* A count_status consumption answered: the held response goes on. */
void exchange_resume(struct client *c);

#endif
