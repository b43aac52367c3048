/* sluice - fuzz_conf.c: libFuzzer target for the config loader.
 *
 * The input is written to a memfd and loaded through /proc/self/fd/N, the
 * way an operator's file is read (fopen, libyaml, ${VAR} expansion, every
 * handler and the cross-key phase). Invariants: a load either succeeds, and
 * the conf is whole (every route has a path or regex and an upstream, or is
 * a decision route; every limit has a name and key sources) and releases without a leak, or fails with a
 * message "FILE:LINE:COL: ..." (LINE, COL >= 1) or "FILE: cannot read". A
 * few environment variables are set once so ${VAR} paths run both ways. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "conf.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fuzz_fd = -1;
static char fuzz_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    /* Names the seeds (and tests/unit/data/conf/good_env.yaml) use. */
    setenv("SLUICE_FUZZ_LISTEN", "127.0.0.1:8080", 1);
    setenv("SLUICE_FUZZ_UPSTREAM", "127.0.0.1:9000", 1);
    setenv("SLUICE_FUZZ_REDIS_URL", "redis://127.0.0.1:6379/0", 1);
    setenv("SLUICE_FUZZ_EMPTY", "", 1);
    setenv("SLUICE_FUZZ_NEST", "${SLUICE_FUZZ_LISTEN}", 1);   /* never expanded twice */
    setenv("SLUICE_FUZZ_LIMIT", "5", 1);
    setenv("SLUICE_TEST_LISTEN", "127.0.0.1:8081", 1);
    setenv("SLUICE_TEST_REDIS_HOST", "redis://127.0.0.1", 1);
    setenv("SLUICE_TEST_EMPTY", "", 1);
    setenv("SLUICE_TEST_PREFIX", "app", 1);
    setenv("SLUICE_TEST_LIMIT", "7", 1);
    unsetenv("SLUICE_TEST_UNSET_VAR");
    unsetenv("SLUICE_LISTEN");
    unsetenv("SLUICE_REDIS_URL");
    unsetenv("SLUICE_UPSTREAM");
    fuzz_fd = memfd_create("sluice-fuzz-conf", 0);
    fuzz_check(fuzz_fd >= 0);
    snprintf(fuzz_path, sizeof fuzz_path, "/proc/self/fd/%d", fuzz_fd);
    return 0;
}

/* "FILE:LINE:COL: text" with positive numbers, or "FILE: cannot read". */
static int message_ok(const char *err)
{
    size_t fl = strlen(fuzz_path);
    const char *p = err + fl;
    long line, col;
    char *end;

    if (strncmp(err, fuzz_path, fl) != 0)
        return 0;
    if (strncmp(p, ": cannot read", 13) == 0)
        return 1;
    if (*p++ != ':')
        return 0;
    line = strtol(p, &end, 10);
    if (end == p || *end != ':' || line < 1)
        return 0;
    p = end + 1;
    col = strtol(p, &end, 10);
    if (end == p || *end != ':' || col < 1)
        return 0;
    return end[1] == ' ' && end[2] != '\0';
}

static void conf_whole(const struct conf *c)
{
    fuzz_check(c->nroutes >= 1 && c->routes != NULL);
    fuzz_check(c->workers >= 1);
    fuzz_check(c->redis.prefix != NULL);
    for (int i = 0; i < c->nroutes; i++) {
        const struct conf_route *r = &c->routes[i];
        /* no upstream: only a route of the decision service */
        fuzz_check(r->name != NULL && (r->upstream != NULL || c->decision.on));
        fuzz_check((r->path != NULL) != (r->regex != NULL));
        fuzz_check(r->path == NULL || (r->pathlen >= 1 && r->path[0] == '/'));
        fuzz_check(r->upstream == NULL || r->upstream->nservers >= 1);
        for (int j = 0; j < r->nlimits; j++) {
            const struct conf_limit *l = &r->limits[j];
            fuzz_check(l->name != NULL && l->nkeys >= 1);
            fuzz_check(l->params.limit >= 1);
            for (int k = 0; k < l->nkeys; k++) {
                const struct conf_keysrc *ks = &l->keys[k];
                int named = ks->kind == CONF_KEY_HEADER || ks->kind == CONF_KEY_QUERY ||
                            ks->kind == CONF_KEY_COOKIE;
                fuzz_check(!named || (ks->arg != NULL && ks->arglen > 0));
                fuzz_check(ks->kind != CONF_KEY_CAPTURE ||
                           (ks->capture >= 1 && ks->capture <= r->ncaptures));
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *err = NULL;

    fuzz_check(ftruncate(fuzz_fd, 0) == 0);
    fuzz_check(pwrite(fuzz_fd, data, size, 0) == (ssize_t)size);
    struct conf *c = conf_load(fuzz_path, &err);
    if (c == NULL) {
        fuzz_check(err != NULL);
        if (!message_ok(err))
            fprintf(stderr, "bad message: %s\n", err);
        fuzz_check(message_ok(err));
        free(err);
        return 0;
    }
    fuzz_check(err == NULL);
    conf_whole(c);
    conf_retain(c);
    conf_release(c);
    conf_release(c);
    return 0;
}
