/* sluice - fwdauth.h: the request a gateway describes to the decision
 * listener (docs/decision.md).
 *
 * nginx's auth_request, Traefik's ForwardAuth, Caddy's forward_auth and
 * Envoy's ext_authz (HTTP) ask sluice whether the request they hold may go
 * on. fwdauth_describe() turns the head of their question into the view of
 * that request, in place, so that request.c's ordinary steps (normalise,
 * route, keys, decide, reply) see the described method, target and host:
 * the spans are pointed at the describing fields' values, nothing is
 * copied. Pure: no I/O, no allocation. */
#ifndef SLUICE_FWDAUTH_H
#define SLUICE_FWDAUTH_H

#include "conf.h"
#include "http1.h"

/* Envoy's RLS v3 (gRPC) call on the decision listener: its path. */
#define FWDAUTH_RLS_PATH "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

enum fwdauth_kind {
    FWDAUTH_DESCRIBED,      /* h now describes the gateway's request */
    FWDAUTH_RLS,            /* the path is FWDAUTH_RLS_PATH */
    FWDAUTH_NOT_FOUND,      /* not under decision.path_prefix: 404 */
    FWDAUTH_BAD,            /* 400, *error names why */
};

/* The head h (of buf) of a request on a decision listener, with
 * conf->decision.path_prefix P:
 *   - target P (a query ignored): described by fields. The target is
 *     X-Forwarded-Uri (Traefik, Caddy) or X-Original-URI (nginx), the
 *     method X-Forwarded-Method or X-Original-Method (of the same family;
 *     absent: the request's own), the host X-Forwarded-Host (absent: Host).
 *   - target P/rest: Envoy ext_authz's original request with P put before
 *     its path: the target is /rest, the method and Host its own (the
 *     X-Forwarded-* fields a client may have sent are not read).
 * A describing field given twice, both families of one at once, an empty
 * target or a method that is not a token: FWDAUTH_BAD with *error
 * ("ambiguous_description", "missing_uri", "bad_method"). The client
 * address is not read here: request.c takes it from X-Forwarded-For under
 * trusted_proxies, as for a proxied request. */
enum fwdauth_kind fwdauth_describe(const struct conf *conf, const char *buf,
                                   struct http1_head *h, const char **error);

#endif
