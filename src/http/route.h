/* sluice - route.h: which rule a request meets, and the keys it is counted by.
 *
 * Matching uses the normalised path (percent-decoding, dot segments, merged
 * slashes) so that URL tricks reach the same rule; the request still goes
 * upstream as sent. Key building turns a limit's key sources into one Redis
 * key whose bytes no client input can confuse: every part is length-prefixed
 * and parts longer than ROUTE_MAX_PART are replaced by their SHA-1. A key is
 * "PREFIX{ROUTE|LIMIT|PARTS}": the braces are a Redis Cluster hash tag, so one
 * limit's keys for one client always share a slot. Pure functions: no I/O,
 * no allocation. */
#ifndef SLUICE_ROUTE_H
#define SLUICE_ROUTE_H

#include <stddef.h>
#include <sys/socket.h>
#include "addr.h"
#include "conf.h"
#include "http1.h"

#define ROUTE_MAX_PART 256
#define ROUTE_MAX_KEY  4096
#define ROUTE_IP_MAX   ADDR_IP_MAX

/* Normalise the path of a request target (the bytes before '?'); out must
 * hold len + 1 bytes (the result is NUL-terminated). Returns the normalised length, or -1 for a target that gets
 * a 400: not origin-form, bad or NUL percent-escape, climbing above root. */
long route_normalize(const char *target, size_t len, char *out);

/* route_normalize as the config's paths section asks: with matrix_params:
 * strip, ";..." parameters leave each segment (those sent as ';' before
 * decoding, those sent as %3B after it) before dot segments are resolved;
 * with case: insensitive, the result is lower-cased (ASCII). This is the
 * path matching and the path/capture keys see. */
long route_normalize_paths(const struct conf *c, const char *target, size_t len, char *out);

/* 0 when a Host value (OWS around it ignored) is a host a client may name:
 * empty, a name of letters, digits, '-', '.', '_', '~' without an empty
 * label, or a bracketed IPv6 literal, each with an optional :port of up to 5
 * digits; -1 otherwise (userinfo, spaces, '/', ',', '%'...: a 400). */
int route_host_check(const char *host, size_t len);

/* Groups a path_regex route captured from the normalised path. */
#define ROUTE_MAX_CAPTURES 10
struct route_captures {
    int n;                              /* groups reported, group 0 included */
    unsigned set;                       /* bit i: group i took part */
    size_t off[ROUTE_MAX_CAPTURES];     /* into the normalised path */
    size_t len[ROUTE_MAX_CAPTURES];
    const struct conf_route *over_limit; /* see route_match */
};

/* First route (file order) matching path, method and Host value (which may
 * carry a port; compared case-insensitively without it and without a
 * trailing dot). The path comes from route_normalize_paths, and with
 * paths.case: insensitive compares case-insensitively with route paths. NULL: no route.
 * For a path_regex route, caps (when not NULL) gets its groups. A path_regex
 * that hits its match limit (steps, depth or memory) stops the search: NULL,
 * with caps->over_limit set to that route (a 400, not a later route, which
 * the client could otherwise pick with a costly path). Safe from any thread
 * at once: each thread matches with match data of its own. */
const struct conf_route *route_match(const struct conf *c,
                                     const char *path, size_t pathlen,
                                     const char *method, size_t methodlen,
                                     const char *host, size_t hostlen,
                                     struct route_captures *caps);
/* route_match over the routes a request may meet, how says which: with
 * ROUTE_PROXIED, routes without an upstream (decision mode's alone,
 * docs/decision.md) are passed over (without it, a decision listener's
 * request, every route); routes with match.grpc take a request only with
 * ROUTE_GRPC (a gRPC call: route_grpc_call). route_match is
 * route_match_in(c, 0, ...). */
#define ROUTE_PROXIED 1
#define ROUTE_GRPC    2
const struct conf_route *route_match_in(const struct conf *c, int how,
                                        const char *path, size_t pathlen,
                                        const char *method, size_t methodlen,
                                        const char *host, size_t hostlen,
                                        struct route_captures *caps);

/* 1 when the request is a gRPC call (Content-Type application/grpc, or
 * application/grpc+FORMAT or ;params). *timeout_ms gets its grpc-timeout
 * in milliseconds, rounded up; 0 when absent or malformed. */
int route_grpc_call(const char *buf, const struct http1_head *h, int64_t *timeout_ms);

/* The client address as text into out[ROUTE_IP_MAX]: the peer, or when the
 * peer is in trusted_proxies, the right-most untrusted X-Forwarded-For entry.
 * IPv4-mapped IPv6 is written as IPv4. Returns the length. */
size_t route_client_ip(const struct conf *c, const struct sockaddr *peer,
                       const char *buf, const struct http1_head *h, char *out);

/* Everything key building reads about one request. */
struct route_req {
    const char *buf;            /* the head bytes */
    const struct http1_head *h;
    const char *ip;             /* from route_client_ip */
    size_t iplen;
    const char *path;           /* normalised */
    size_t pathlen;
    const struct route_captures *caps;  /* NULL when the route has no regex */
    const char *claims;         /* a verified token's claims (jwt.h), or NULL:
                                 * none, or one that failed verification */
    size_t claims_len;
    const char *body;           /* the request body when it was buffered whole
                                 * before the decision (estimate: {json}); NULL */
    size_t body_len;
};

/* Write the Redis key of limit l of route r for this request into
 * out[ROUTE_MAX_KEY]. Returns its length, 0 when a key source is absent from
 * the request (l->on_missing_key says what then), -1 when it would not fit,
 * ROUTE_KEY_AMBIGUOUS when a source is given twice (two fields of the header,
 * under any '-'/'_' spelling; the query parameter twice; the cookie twice),
 * which upstreams resolve differently, or ROUTE_KEY_BAD for a capture holding
 * a control byte: the request gets a 400. A header source matches its name
 * with ASCII case and '-' versus '_' ignored; query and cookie names are
 * matched as PHP reads them (%XX, '+', '.', ' ', '['; route.c), query pairs
 * split at '&' and ';', cookies at ';' and ','; a cookie value is taken
 * without DQUOTEs and with %XX decoded; a path key without trailing '/' and
 * whitespace; a capture that is a number (whitespace around, a sign, digits
 * of any script) as its ASCII value without leading zeros. */
#define ROUTE_KEY_AMBIGUOUS (-2)
#define ROUTE_KEY_BAD       (-3)
long route_key(const struct conf *c, const struct conf_route *r,
               const struct conf_limit *l, const struct route_req *req,
               char *out);

/* What a jwt:CLAIM key part is for a request without a verified token
 * (none, or one that failed): written without the "<len>:" every other
 * part starts with, so no claim value can be it. */
#define ROUTE_JWT_ANON "!anon"

/* The token a request carries (c->jwt): an Authorization: Bearer field,
 * else the cookie c->jwt.cookie. 1 with it in *tok, *len (into the head);
 * 0 when there is none; -1 when it is given twice (two Authorization
 * fields, the cookie twice) or the field holds more than one token: the
 * request has no valid token. */
int route_jwt_token(const struct conf *c, const struct route_req *req, const char **tok,
                    size_t *len);

/* The claim name[0..namelen) of the request's verified token: 1 with a
 * string claim's decoded value or an integer claim's digits in *v, *vlen;
 * 0 without a verified token, or without that claim as a string or an
 * integer. What a jwt:CLAIM key part reads, and what any other use of a
 * claim (a plan) should read. */
int route_jwt_claim(const struct route_req *req, const char *name, size_t namelen,
                    const char **v, size_t *vlen);

/* The key limit l counts a request under when one of its key sources is
 * absent and on_missing_key is ip: the client address, in a key space no
 * route_key() key can reach. Returns its length, or -1. */
long route_key_fallback(const struct conf *c, const struct conf_route *r,
                        const struct conf_limit *l, const struct route_req *req, char *out);

/* The key of limit l of route r for the key values parts[0..n), one per
 * key source, as the client sends them: the key route_key() makes for such
 * a request. Returns its length, or -1 (n is not l->nkeys, or too long). */
/* One key per route (conf_limit.part): the key l's route's limits share,
 * made from key (route_key's, route_key_fallback's or route_key_parts'
 * for l): the same without l's name, PREFIX{route||parts...}, which no
 * limit's key can be (a limit's name is never empty). Its length, or -1. */
long route_part_key(const struct conf *c, const struct conf_route *r,
                    const struct conf_limit *l, const char *key, size_t keylen, char *out);

long route_key_parts(const struct conf *c, const struct conf_route *r,
                     const struct conf_limit *l, const char *const *parts,
                     const size_t *lens, int n, char *out);

/* The value key source ks takes in the request, as a key part holds it
 * (a query parameter or cookie decoded), into out[ROUTE_MAX_KEY],
 * NUL-terminated: its length; -1 when absent (a jwt:CLAIM source without a
 * verified token too) or longer than ROUTE_MAX_PART;
 * ROUTE_KEY_AMBIGUOUS or ROUTE_KEY_BAD as route_key() says. What plans read
 * a client's key and plan name with. */
long route_key_value(const struct conf_keysrc *ks, const struct route_req *req, char *out);

/* Bit i set: key source i of l carries a credential, shown hashed by the
 * console: the Authorization and Proxy-Authorization headers, every
 * cookie, and a header or query parameter whose name contains token,
 * secret, key, password, passwd, session or auth (any case). */
unsigned route_secret_parts(const struct conf_limit *l);

/* The config override of l for the key (route_key's bytes), or NULL. A
 * list walk: a limit has at most a thousand. */
const struct conf_override *route_override(const struct conf_limit *l, const char *key,
                                           size_t len);

#endif
