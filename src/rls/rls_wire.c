/* sluice - rls_wire.c: Envoy's RLS v3 messages on the wire (rls_wire.h),
 * through protobuf-c's code generated from src/rls/proto: unknown fields
 * are skipped, a message that does not parse is refused (gRPC status 3)
 * and nothing of it is kept. */
#include <stdlib.h>
#include <string.h>

#include "envoy/service/ratelimit/v3/rls.pb-c.h"
#include "mem.h"
#include "rls_wire.h"

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest pb_req;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor pb_desc;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse pb_resp;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus pb_status;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit pb_limit;
typedef Envoy__Config__Core__V3__HeaderValue pb_header;

int rls_wire_decode(const uint8_t *body, size_t len, struct rls_req *req, const char **why)
{
    memset(req, 0, sizeof *req);
    if (len < 5) {
        *why = "a gRPC message needs its 5-byte prefix";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    if (body[0] != 0) {
        *why = "compressed messages are not accepted (no grpc-encoding is supported)";
        return body[0] == 1 ? 12 /* UNIMPLEMENTED */ : RLS_GRPC_INVALID_ARGUMENT;
    }
    size_t n = (size_t)body[1] << 24 | (size_t)body[2] << 16 | (size_t)body[3] << 8 | body[4];
    if (n > RLS_MAX_MESSAGE) {
        *why = "the request message is larger than 64 KiB";
        return RLS_GRPC_RESOURCE_EXHAUSTED;
    }
    if (n != len - 5) {
        *why = "the body is not one length-prefixed message";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    pb_req *m = envoy__service__ratelimit__v3__rate_limit_request__unpack(NULL, n, body + 5);
    if (m == NULL) {
        *why = "the RateLimitRequest does not parse";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    req->msg = m;
    if (m->domain == NULL || m->domain[0] == '\0') {
        *why = "rate limit domain must not be empty";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    if (m->n_descriptors == 0) {
        *why = "rate limit descriptor list must not be empty";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    if (m->n_descriptors > RLS_MAX_DESCRIPTORS) {
        *why = "more than 64 descriptors in one call";
        return RLS_GRPC_INVALID_ARGUMENT;
    }
    size_t nentries = 0;
    for (size_t i = 0; i < m->n_descriptors; i++) {
        if (m->descriptors[i]->n_entries == 0) {
            *why = "a descriptor has no entries";
            return RLS_GRPC_INVALID_ARGUMENT;
        }
        if (m->descriptors[i]->n_entries > RLS_MAX_ENTRIES) {
            *why = "more than 32 entries in a descriptor";
            return RLS_GRPC_INVALID_ARGUMENT;
        }
        nentries += m->descriptors[i]->n_entries;
    }
    req->domain = m->domain;
    req->hits_addend = m->hits_addend;
    req->ndescs = (int)m->n_descriptors;
    req->descs = mem_calloc(m->n_descriptors, sizeof *req->descs);
    req->entries_mem = mem_calloc(nentries, sizeof *req->entries_mem);
    struct rls_entry *e = req->entries_mem;
    for (size_t i = 0; i < m->n_descriptors; i++) {
        const pb_desc *d = m->descriptors[i];
        struct rls_desc *rd = &req->descs[i];
        rd->entries = e;
        rd->nentries = (int)d->n_entries;
        for (size_t j = 0; j < d->n_entries; j++, e++) {
            e->key = d->entries[j]->key ? d->entries[j]->key : "";
            e->value = d->entries[j]->value ? d->entries[j]->value : "";
            if (e->key[0] == '\0') {
                *why = "a descriptor entry has an empty key";
                return RLS_GRPC_INVALID_ARGUMENT;
            }
        }
        if (d->limit) {
            rd->has_limit = 1;
            rd->limit_rpu = d->limit->requests_per_unit;
            rd->limit_unit = (int)d->limit->unit;
        }
        if (d->hits_addend) {
            rd->has_hits = 1;
            rd->hits = d->hits_addend->value;
        }
    }
    return RLS_GRPC_OK;
}

void rls_wire_free(struct rls_req *req)
{
    if (req->msg)
        envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(req->msg, NULL);
    free(req->descs);
    free(req->entries_mem);
    memset(req, 0, sizeof *req);
}

uint8_t *rls_wire_encode(int over, const struct rls_status *st, int n,
                         const struct rls_header *h, int nh, const struct rls_header *rq,
                         int nrq, size_t *len)
{
    int nall = nh + nrq;                /* response_headers_to_add, then request_ */
    pb_resp resp = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
    pb_status *sts = mem_calloc((size_t)n, sizeof *sts);
    pb_status **stp = mem_calloc((size_t)n, sizeof *stp);
    pb_limit *lims = mem_calloc((size_t)n, sizeof *lims);
    Google__Protobuf__Duration *durs = mem_calloc((size_t)n, sizeof *durs);
    pb_header *hs = mem_calloc((size_t)nall, sizeof *hs);
    pb_header **hsp = mem_calloc((size_t)nall, sizeof *hsp);
    char **strs = mem_calloc((size_t)nall * 2, sizeof *strs);
    resp.overall_code = over ? ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT
                             : ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK;
    for (int i = 0; i < n; i++) {
        pb_status s = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__DESCRIPTOR_STATUS__INIT;
        s.code = st[i].over ? ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT
                            : ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK;
        s.limit_remaining = st[i].remaining;
        if (st[i].has_limit) {
            pb_limit l = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__INIT;
            l.requests_per_unit = st[i].rpu;
            l.unit = (Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit__Unit)st[i].unit;
            l.name = (char *)(st[i].name ? st[i].name : "");
            lims[i] = l;
            s.current_limit = &lims[i];
            Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
            int64_t ms = st[i].reset_ms > 0 ? st[i].reset_ms : 0;
            d.seconds = ms / 1000;
            d.nanos = (int32_t)(ms % 1000) * 1000000;
            durs[i] = d;
            s.duration_until_reset = &durs[i];
        }
        sts[i] = s;
        stp[i] = &sts[i];
    }
    for (int i = 0; i < nall; i++) {
        pb_header hv = ENVOY__CONFIG__CORE__V3__HEADER_VALUE__INIT;
        const struct rls_header *f = i < nh ? &h[i] : &rq[i - nh];
        strs[2 * i] = mem_strndup(f->name, f->name_len);
        strs[2 * i + 1] = mem_strndup(f->value, f->value_len);
        hv.key = strs[2 * i];
        hv.value = strs[2 * i + 1];
        hs[i] = hv;
        hsp[i] = &hs[i];
    }
    resp.n_statuses = (size_t)n;
    resp.statuses = stp;
    resp.n_response_headers_to_add = (size_t)nh;
    resp.response_headers_to_add = hsp;
    resp.n_request_headers_to_add = (size_t)nrq;
    resp.request_headers_to_add = hsp + nh;
    size_t m = envoy__service__ratelimit__v3__rate_limit_response__get_packed_size(&resp);
    uint8_t *out = mem_alloc(m + 5);
    out[0] = 0;
    out[1] = (uint8_t)(m >> 24);
    out[2] = (uint8_t)(m >> 16);
    out[3] = (uint8_t)(m >> 8);
    out[4] = (uint8_t)m;
    envoy__service__ratelimit__v3__rate_limit_response__pack(&resp, out + 5);
    *len = m + 5;
    for (int i = 0; i < nall * 2; i++)
        free(strs[i]);
    free(strs);
    free(hsp);
    free(hs);
    free(durs);
    free(lims);
    free(stp);
    free(sts);
    return out;
}
