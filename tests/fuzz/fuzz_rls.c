/* sluice - fuzz_rls.c: libFuzzer target for Envoy's RLS v3 request
 * decoding and descriptor matching.
 *
 * Input: a gRPC request body as the decision listener reads it (the flag
 * byte, the 4-byte length, a RateLimitRequest). It goes through
 * rls_wire_decode; a message that decodes has each descriptor matched
 * against a fixed descriptor tree (exact values, value-less keys, prefix,
 * middle and share_threshold wildcards, nesting) and keyed, and a response
 * with a status per descriptor is encoded. Invariants:
 * - decoding either fails with a gRPC status and a reason, or gives a
 *   non-empty domain and 1..RLS_MAX_DESCRIPTORS descriptors of
 *   1..RLS_MAX_ENTRIES entries with non-empty keys;
 * - a match has a rate_limit, and an entry's share pattern is a wildcard
 *   value of the tree that matches the entry's value;
 * - a key starts with the prefix and "{rls|", ends with "}", is shorter than
 *   RLS_MAX_KEY, and is the same for the same entries;
 * - the encoded response is framed: byte 0 is 0 and the length is the
 *   rest. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "rls_match.h"
#include "rls_wire.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct conf *conf;

static const char RLS_YAML[] =
    "domain: envoy\n"
    "descriptors:\n"
    "  - key: generic_key\n    value: slow\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n"
    "  - key: generic_key\n    rate_limit: { unit: second, requests_per_unit: 100 }\n"
    "  - key: path\n    value: /api/*\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n"
    "  - key: path\n    value: /a*b*c\n    share_threshold: true\n"
    "    rate_limit: { unit: day, requests_per_unit: 7 }\n"
    "  - key: path\n    value: \"*x\"\n    descriptors:\n"
    "      - key: m\n        rate_limit: { unit: second, requests_per_unit: 1 }\n"
    "  - key: key1\n    value: value1\n    descriptors:\n"
    "      - key: subkey1\n        rate_limit: { name: n, unit: week, requests_per_unit: 1 }\n"
    "  - key: free\n    rate_limit: { unlimited: true }\n";

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/sluice_fuzz_rls_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        abort();
    close(fd);
    return path;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char *rls = write_tmp(RLS_YAML), *main_text = NULL, *err = NULL;
    if (asprintf(&main_text, "listen: 127.0.0.1:8080\n"
                 "upstreams: { api: { servers: [127.0.0.1:9000] } }\n"
                 "routes: [ { name: r, match: { path: / }, upstream: api } ]\n"
                 "decision: { listen: 127.0.0.1:8090, ratelimit_config: %s }\n", rls) < 0)
        abort();
    char *main_path = write_tmp(main_text);
    conf = conf_load(main_path, &err);
    if (conf == NULL) {
        fprintf(stderr, "fuzz_rls: %s\n", err);
        abort();
    }
    unlink(main_path);
    unlink(rls);
    free(main_path);
    free(rls);
    free(main_text);
    return 0;
}

/* share is one of the tree's wildcard values that matches value. */
static int share_ok(const struct conf_rls_node *level, const char *key, const char *value,
                    const char *share)
{
    for (int i = 0; i < level->nkids; i++) {
        const struct conf_rls_node *k = &level->kids[i];
        if (k->value == share && k->parts && strcmp(k->key, key) == 0 &&
            rls_wildcard(k->parts, k->nparts, value))
            return 1;
        if (share_ok(k, key, value, share))
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rls_req req;
    const char *why = NULL;
    int rc = rls_wire_decode(data, size, &req, &why);
    if (rc != 0) {
        fuzz_check(why != NULL && *why);
        rls_wire_free(&req);
        return 0;
    }
    fuzz_check(req.domain && *req.domain);
    fuzz_check(req.ndescs >= 1 && req.ndescs <= RLS_MAX_DESCRIPTORS);
    const struct conf_rls_domain *d = rls_domain(conf->decision.rls, req.domain);
    fuzz_check(d == NULL || strcmp(d->name, req.domain) == 0);
    struct rls_status st[RLS_MAX_DESCRIPTORS];
    memset(st, 0, sizeof st);
    for (int i = 0; i < req.ndescs; i++) {
        const struct rls_desc *ds = &req.descs[i];
        fuzz_check(ds->nentries >= 1 && ds->nentries <= RLS_MAX_ENTRIES);
        for (int j = 0; j < ds->nentries; j++)
            fuzz_check(ds->entries[j].key[0] != '\0' && ds->entries[j].value != NULL);
        const char *share[RLS_MAX_ENTRIES];
        const struct conf_rls_node *n = d ? rls_match(d, ds->entries, ds->nentries, share) : NULL;
        if (n) {
            fuzz_check(n->limit != NULL);
            for (int j = 0; j < ds->nentries; j++)
                fuzz_check(share[j] == NULL ||
                           share_ok(&d->root, ds->entries[j].key, ds->entries[j].value, share[j]));
            st[i].has_limit = !n->limit->unlimited;
            st[i].rpu = (uint32_t)n->limit->requests_per_unit;
            st[i].unit = n->limit->unit;
            st[i].name = n->limit->name;
        }
        char k1[RLS_MAX_KEY], k2[RLS_MAX_KEY];
        size_t n1 = rls_key("sluice:", req.domain, ds->entries, ds->nentries,
                            n ? share : NULL, k1);
        size_t n2 = rls_key("sluice:", req.domain, ds->entries, ds->nentries,
                            n ? share : NULL, k2);
        fuzz_check(n1 < RLS_MAX_KEY && k1[n1] == '\0' && strlen(k1) == n1);
        fuzz_check(strncmp(k1, "sluice:{rls|", 12) == 0 && k1[n1 - 1] == '}');
        fuzz_check(n1 == n2 && memcmp(k1, k2, n1) == 0);
        st[i].over = (k1[n1 / 2] & 1) != 0;
        st[i].remaining = (uint32_t)n1;
        st[i].reset_ms = (int64_t)n1 * 1000;
    }
    size_t len = 0;
    uint8_t *out = rls_wire_encode(0, st, req.ndescs, NULL, 0, NULL, 0, &len);
    fuzz_check(len >= 5 && out[0] == 0);
    fuzz_check(((size_t)out[1] << 24 | (size_t)out[2] << 16 | (size_t)out[3] << 8 | out[4]) ==
               len - 5);
    free(out);
    rls_wire_free(&req);
    return 0;
}
