/* sluice - admin.h: the operator's HTTP endpoint, on its own thread.
 *
 * Serves /metrics (Prometheus text), /healthz (the process is alive) and
 * /readyz (a config is loaded, and Redis is connected or on_error lets
 * requests be served without it) on admin.listen, never on the public
 * listener, and the console (admin_console.h: /api/top, /api/stats and the
 * dashboard at /). It reads only metrics, the console's summaries and the
 * current config's on_error, client timeouts, workers and backend.
 *
 * /api/limits/... goes to the admin API (admin_api.h).
 *
 * Bounded like the public listener: a head of at most ADMIN_MAX_HEAD_BYTES
 * (431/414), no request body (413) but up to ADMIN_API_MAX_BODY bytes of
 * Content-Length on /api/limits, client.header_timeout for a head (408),
 * client.idle_timeout between requests and for a peer that stops reading,
 * and at most ADMIN_MAX_CONNECTIONS open connections (more are closed at
 * once). One request is answered at a time per connection. */
#ifndef SLUICE_ADMIN_H
#define SLUICE_ADMIN_H

#include "conf.h"

#define ADMIN_MAX_HEAD_BYTES  8192
#define ADMIN_MAX_CONNECTIONS 64

struct admin;

/* Bind conf->admin_listen and start serving; NULL (logged) when the address
 * cannot be bound. */
struct admin *admin_start(const struct conf *conf);
/* The running config changed (reload): on_error and the timeouts of new
 * requests follow it; admin.listen does not. Thread-safe. */
void admin_reload(struct admin *a, const struct conf *conf);
void admin_stop(struct admin *a);

#endif
