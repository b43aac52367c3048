/* sluice - rls_wire.h: Envoy's RLS v3 messages on the wire.
 *
 * The gRPC body of a ShouldRateLimit call (one length-prefixed message)
 * into struct rls_req, and a response into its framed bytes. The only
 * file that includes protobuf-c's generated code (build/proto, from
 * src/rls/proto). Pure: no I/O. */
#ifndef SLUICE_RLS_WIRE_H
#define SLUICE_RLS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "rls_match.h"     /* struct rls_entry */

#define RLS_MAX_MESSAGE     (64 * 1024)     /* a request message's bytes */
#define RLS_MAX_DESCRIPTORS 64              /* per call */

/* gRPC status codes sluice answers with. */
#define RLS_GRPC_OK                 0
#define RLS_GRPC_INVALID_ARGUMENT   3
#define RLS_GRPC_RESOURCE_EXHAUSTED 8
#define RLS_GRPC_INTERNAL           13
#define RLS_GRPC_UNAVAILABLE        14

struct rls_desc {
    const struct rls_entry *entries;
    int nentries;
    int has_limit;                      /* the call's own limit (an override) */
    uint32_t limit_rpu;
    int limit_unit;                     /* envoy.type.v3.RateLimitUnit */
    int has_hits;                       /* its own hits_addend (0 too) */
    uint64_t hits;
};

/* A decoded request; its strings live in msg until rls_wire_free. */
struct rls_req {
    const char *domain;
    struct rls_desc *descs;
    int ndescs;
    uint32_t hits_addend;
    struct rls_entry *entries_mem;
    void *msg;
};

/* body[0..len): the whole gRPC request body (1 flag byte 0, a 4-byte
 * big-endian length, the message). 0 and req filled, or a gRPC status
 * (RLS_GRPC_*) with *why a fixed string; req needs rls_wire_free either way. */
int rls_wire_decode(const uint8_t *body, size_t len, struct rls_req *req, const char **why);
void rls_wire_free(struct rls_req *req);

/* What a response says of one descriptor. */
struct rls_status {
    int over;                           /* OVER_LIMIT, else OK */
    int has_limit;                      /* current_limit and duration_until_reset */
    uint32_t rpu;
    int unit;                           /* RateLimitResponse.RateLimit.Unit */
    const char *name;                   /* "" when none */
    uint32_t remaining;
    int64_t reset_ms;
};

/* A header field for Envoy to add to the client's response, or to the
 * request it forwards upstream. */
struct rls_header {
    const char *name, *value;
    size_t name_len, value_len;
};

/* The framed response message (5-byte prefix and the message), malloc'd;
 * its length in *len. h: response_headers_to_add, rq: request_headers_to_add. */
uint8_t *rls_wire_encode(int over, const struct rls_status *st, int n,
                         const struct rls_header *h, int nh, const struct rls_header *rq,
                         int nrq, size_t *len);

#endif
