/* sluice - admin_api.h: the admin API's limit endpoints (/api/limits/...).
 *
 *   GET    /api/limits/ROUTE/LIMIT?key=V[&key=V2...]   a key's state (no consumption)
 *   PUT    /api/limits/ROUTE/LIMIT/override?key=...    a run-time override
 *   DELETE /api/limits/ROUTE/LIMIT/override?key=...    back to the config
 *   POST   /api/limits/ROUTE/LIMIT/reset?key=...       counters gone, deny caches too
 *   GET    /api/plans?key=V                            a client's plan and its usage
 *   PUT    /api/plans?key=V  {"plan": "NAME"}          a run-time plan, every proxy
 *   DELETE /api/plans?key=V                            back to plans.assign or default
 *
 * Served on the admin thread (admin.c hands every /api/limits request
 * here, with its body of at most ADMIN_API_MAX_BODY bytes). Writes need
 * "Authorization: Bearer admin.token" (401; 403 when no token is set).
 * Answers are JSON; bad input is a 400 {"error": ...} and changes nothing.
 * Redis is reached asynchronously on the admin thread's event base
 * (store_sync: one persistent connection, answers bounded by redis.timeout,
 * at least 1 s, and at most STORE_SYNC_MAX_CALLS requests waiting, beyond
 * which 503 at once): /healthz, /readyz and /metrics never wait on it. */
#ifndef SLUICE_ADMIN_API_H
#define SLUICE_ADMIN_API_H

#include <stddef.h>
#include "http1.h"

#define ADMIN_API_MAX_BODY 4096
#define ADMIN_API_PREFIX "/api/limits"
#define ADMIN_API_PLANS "/api/plans"

#define ADMIN_API_PENDING 0

struct conf;
struct event_base;
struct evbuffer;
struct memstore;
struct admin_api;
struct admin_api_pending;

/* The running config (retained here) and the process's memstore; called
 * by the main thread at start, on each reload, and with NULLs at exit. */
void admin_api_set(struct conf *conf, struct memstore *mem);

/* The admin thread's state (its Redis connections), on its event base. */
struct admin_api *admin_api_create(struct event_base *base);
void admin_api_destroy(struct admin_api *api);

/* The answer of a request that waited for Redis: status, JSON body, extra
 * header lines; out and hdr are valid during the call only. */
typedef void admin_api_done_cb(void *arg, int status, struct evbuffer *out,
                               struct evbuffer *hdr);

/* Answer the request whose head is h (in data) and body body[0..len),
 * path being its path (target up to '?'): its JSON body into out, extra
 * header lines into hdr, and the status returned. Or ADMIN_API_PENDING
 * with *pending set: done(arg, ...) answers it later from the loop (never
 * from inside this call); data may go when this returns. */
int admin_api_serve(struct admin_api *api, const char *data, const struct http1_head *h,
                    const char *path, size_t plen, const char *body, size_t len,
                    struct evbuffer *out, struct evbuffer *hdr, admin_api_done_cb *done,
                    void *arg, struct admin_api_pending **pending);
/* The pending request's client is gone: done will not be called. */
void admin_api_cancel(struct admin_api_pending *pd);

/* Before any admin request: 0 when it may be served; else 421 (a Host
 * header naming none of the endpoint's names: an IP literal, localhost,
 * admin.listen's host, admin.hosts) or, for a request that shows keys
 * (shows_keys) while admin.token is set, 401 without the token; the JSON
 * error in out, header lines in hdr. */
int admin_api_gate(const char *data, const struct http1_head *h, int shows_keys,
                   struct evbuffer *out, struct evbuffer *hdr);

/* The reason phrase of the statuses admin_api_serve and admin_api_gate return. */
const char *admin_api_reason(int status);

#endif
