/* sluice - admin.h: the operator's HTTP endpoint, on its own thread.
 *
 * Serves /metrics (Prometheus text), /healthz (the process is alive) and
 * /readyz (a config is loaded, and Redis is connected or on_error lets
 * requests be served without it) on admin.listen, never on the public
 * listener. It reads only metrics and the current config's on_error. */
#ifndef SLUICE_ADMIN_H
#define SLUICE_ADMIN_H

#include "conf.h"

struct admin;

/* Bind and start serving; NULL (logged) when the address cannot be bound. */
struct admin *admin_start(const struct conf_addr *addr, enum conf_on_error on_error);
/* The running config changed (reload). */
void admin_set_on_error(struct admin *a, enum conf_on_error on_error);
void admin_stop(struct admin *a);

#endif
