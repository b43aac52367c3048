/* sluice - admin_api.h: the admin API's limit endpoints (/api/limits/...).
 *
 *   GET    /api/limits/ROUTE/LIMIT?key=V[&key=V2...]   a key's state (no consumption)
 *   PUT    /api/limits/ROUTE/LIMIT/override?key=...    a run-time override
 *   DELETE /api/limits/ROUTE/LIMIT/override?key=...    back to the config
 *   POST   /api/limits/ROUTE/LIMIT/reset?key=...       counters gone, deny caches too
 *
 * Served on the admin thread (admin.c hands every /api/limits request
 * here, with its body of at most ADMIN_API_MAX_BODY bytes). Writes need
 * "Authorization: Bearer admin.token" (401; 403 when no token is set).
 * Answers are JSON; bad input is a 400 {"error": ...} and changes nothing.
 * Redis is reached with blocking commands on the admin thread (store_sync,
 * bounded by redis.timeout, at least 1 s). */
#ifndef SLUICE_ADMIN_API_H
#define SLUICE_ADMIN_API_H

#include <stddef.h>
#include "http1.h"

#define ADMIN_API_MAX_BODY 4096
#define ADMIN_API_PREFIX "/api/limits"

struct conf;
struct evbuffer;
struct memstore;

/* The running config (retained here) and the process's memstore; called
 * by the main thread at start, on each reload, and with NULLs at exit. */
void admin_api_set(struct conf *conf, struct memstore *mem);

/* Answer the request whose head is h (in data) and body body[0..len),
 * path being its path (target up to '?'): its JSON body into out, extra
 * header lines into hdr. Returns the status. */
int admin_api_serve(const char *data, const struct http1_head *h, const char *path,
                    size_t plen, const char *body, size_t len, struct evbuffer *out,
                    struct evbuffer *hdr);

/* The reason phrase of the statuses admin_api_serve returns. */
const char *admin_api_reason(int status);

#endif
