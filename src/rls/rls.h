/* sluice - rls.h: one call of Envoy's RateLimitService/ShouldRateLimit.
 *
 * The gRPC request body is decoded (rls_wire.c), each descriptor matched
 * against decision.ratelimit_config (rls_match.c), and every descriptor
 * with a limit decided in ONE backend call, batched with the proxy's
 * decisions (backend.h): all or nothing by default (a call over the limit
 * consumes nothing), or each on its own (decision.rls_consume:
 * every_descriptor, the reference's way). The answer is a framed
 * RateLimitResponse, or a gRPC error status for the trailers.
 *
 * Ownership: the caller owns the call (rls_call_new/rls_call_free) and
 * the conf and backends it lends, which must outlive a pending call.
 * done runs once from the event loop for a call rls_start left pending,
 * never after rls_cancel, never from inside rls_start. */
#ifndef SLUICE_RLS_H
#define SLUICE_RLS_H

#include <stddef.h>
#include <stdint.h>

struct backend;
struct conf;
struct denycache;
struct rls_call;

struct rls_env {
    struct backend *backend;    /* the runtime's (Redis or memory) */
    struct backend *local;      /* redis.on_error: local; may be NULL */
    struct denycache *deny;     /* the worker's (the proxy's too); may be NULL */
};

typedef void rls_done(void *arg);

struct rls_call *rls_call_new(void);
void rls_call_free(struct rls_call *call);      /* cancels a pending call */

/* Decide the call whose gRPC body is body[0..len). Returns 1 when the
 * answer is ready (rls_answer), 0 when done(arg) comes later. */
int rls_start(struct rls_call *call, const struct rls_env *env, const struct conf *conf,
              const uint8_t *body, size_t len, rls_done *done, void *arg);
void rls_cancel(struct rls_call *call);
/* Answer the call with gRPC status grpc and why (static) without deciding. */
void rls_refuse(struct rls_call *call, int grpc, const char *why);

/* The answer: the gRPC status (0: OK, with the framed message in
 * msg and len; else message says why, for grpc-message). Valid until the
 * call is freed or started again. */
int rls_answer(const struct rls_call *call, const uint8_t **msg, size_t *len,
               const char **message);

#endif
